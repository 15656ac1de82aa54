"""ℤ, ℝ and product rings: axioms, batched/scalar agreement, lifts, overflow, W1."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ring_laws import check_axioms, check_batched_agrees
from ringml.rings.base import RingError
from ringml.rings.scalar import (
    AverageRing,
    IntegerRing,
    ProductRing,
    RealRing,
    average_ring,
)

SETTINGS = settings(max_examples=80, deadline=None)

big_ints = st.integers(-(2**100), 2**100)  # the scalar face is unbounded
small_ints = st.integers(-(2**20), 2**20)  # batches: far from the int64 limits
exact_floats = st.integers(-1000, 1000).map(float)  # exact sums and products in float64
floats = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


# ------------------------------------------------------------------ ℤ
@SETTINGS
@given(big_ints, big_ints, big_ints)
def test_integer_axioms(a, b, c):
    check_axioms(IntegerRing(), a, b, c)


@SETTINGS
@given(st.lists(small_ints, max_size=8), st.data())
def test_integer_batched_agrees(xs, data):
    ys = data.draw(st.lists(small_ints, min_size=len(xs), max_size=len(xs)))
    check_batched_agrees(IntegerRing(["x"]), xs, ys)


def test_integer_basics():
    z = IntegerRing()
    assert z.zero() == 0 and z.one() == 1 and z.scale(7, -3) == -21
    assert z.from_bytes(z.to_bytes(-(2**90))) == -(2**90)
    assert z.batch_sum(np.array([2**62, 2**62, 2**62])) == 3 * 2**62  # exact beyond int64
    assert z.batch_to_list(z.batch_lift("y", np.array([5, 6]))) == [1, 1]
    assert z.lift("y", "anything") == 1  # not lifted: the one
    b = z.batch_from([1, 2, 3])
    assert b.dtype == np.int64
    assert z.batch_resize(b, 5).tolist() == [1, 2, 3, 0, 0]
    assert z.batch_resize(b, 2).tolist() == [1, 2]


def test_integer_overflow_detection():
    z = IntegerRing()
    top = np.array([2**62], dtype=np.int64)
    with pytest.raises(RingError, match="overflow"):
        z.batch_mul(top, np.array([2]))
    assert z.batch_mul(-top, np.array([2])).tolist() == [-(2**63)]  # exactly representable
    with pytest.raises(RingError, match="overflow"):
        z.batch_scale(top, np.array([-3]))
    with pytest.raises(RingError, match="overflow"):
        z.batch_add(top, top)
    with pytest.raises(RingError, match="overflow"):
        z.batch_neg(np.array([-(2**63)], dtype=np.int64))
    with pytest.raises(RingError, match="overflow"):
        z.batch_mul(np.array([-(2**63)]), np.array([-1]))
    with pytest.raises(RingError, match="overflow"):
        z.batch_sum_by(np.array([2**62, 2**62], dtype=np.int64), np.array([0, 0]), 1)
    # partial sums leave int64 but the group total fits: exact, no error
    parts = np.array([2**62, 2**62, -(2**62)], dtype=np.int64)
    assert z.batch_sum_by(parts, np.array([0, 0, 0]), 1).tolist() == [2**62]
    with pytest.raises(RingError):
        z.batch_from([2**63])
    acc = z.batch_zeros(2)
    z.batch_scatter_add(acc, np.array([1]), top)
    with pytest.raises(RingError, match="overflow"):
        z.batch_scatter_add(acc, np.array([1]), top)


def test_integer_lift_validation():
    z = IntegerRing(["x"])
    assert z.lift("x", 4) == 4 and z.lift("x", 4.0) == 4 and z.lift("x", np.int32(-2)) == -2
    assert z.lift("x", Fraction(6, 2)) == 3
    assert z.lift("x", 2**80) == 2**80  # scalar face: unbounded
    for bad in ["4", "abc", math.nan, math.inf, 2.5, None, b"1", 1 + 2j]:
        with pytest.raises(RingError, match="'x'") as info:
            z.lift("x", bad)
        assert repr(bad) in str(info.value) or str(bad) in str(info.value)
    assert z.batch_lift("x", np.array([1, -2, 3])).tolist() == [1, -2, 3]
    assert z.batch_lift("x", np.array([1.0, 2.0])).tolist() == [1, 2]
    assert z.batch_lift("x", np.array([1, 2.0], dtype=object)).tolist() == [1, 2]
    for bad in (
        np.array(["1", "2"]),
        np.array([1.0, np.nan]),
        np.array([1.5]),
        np.array([np.inf]),
        np.array([1, "a"], dtype=object),
        np.array([2.0**70]),
        np.array([2**64 - 1], dtype=np.uint64),
    ):
        with pytest.raises(RingError, match="'x'"):
            z.batch_lift("x", bad)
    with pytest.raises(RingError, match=r"nan"):
        z.batch_lift("x", np.array([3.0, np.nan]))


def test_integer_lift_functions():
    z = IntegerRing({"x": lambda v: v * 2, "y": None})
    assert z.lifted_variables == {"x", "y"}
    assert z.lift("x", 3) == 6 and z.lift("y", 3) == 3
    assert z.batch_lift("x", np.array([1, 2])).tolist() == [2, 4]
    half = IntegerRing({"x": lambda v: v / 2})
    with pytest.raises(RingError, match="'x'"):
        half.lift("x", 3)
    with pytest.raises(RingError, match="'x'"):
        half.batch_lift("x", np.array([2, 3]))
    with pytest.raises(RingError):
        IntegerRing({"x": 5})


def test_check_same_ring():
    IntegerRing(["x"]).check_same_ring(IntegerRing(["x"]))
    with pytest.raises(RingError):
        IntegerRing().check_same_ring(RealRing())
    with pytest.raises(RingError):
        IntegerRing(["x"]).check_same_ring(IntegerRing(["y"]))
    with pytest.raises(RingError):
        RealRing().batch_add(np.zeros(2), np.zeros(2, dtype=np.int64))  # an ℤ batch
    with pytest.raises(RingError):
        IntegerRing().batch_add(np.zeros(2, dtype=np.int64), np.zeros(3, dtype=np.int64))


# ------------------------------------------------------------------ ℝ
@SETTINGS
@given(exact_floats, exact_floats, exact_floats)
def test_real_axioms_exact(a, b, c):
    check_axioms(RealRing(), a, b, c)


@SETTINGS
@given(floats, floats, floats)
def test_real_axioms_rounded(a, b, c):
    check_axioms(RealRing(), a, b, c, rtol=1e-9, atol=1e-6)


@SETTINGS
@given(st.lists(exact_floats, max_size=8), st.data())
def test_real_batched_agrees(xs, data):
    ys = data.draw(st.lists(exact_floats, min_size=len(xs), max_size=len(xs)))
    check_batched_agrees(RealRing(["x"]), xs, ys)


def test_real_lift_equal_negligible():
    r = RealRing(["x"])
    assert r.lift("x", 2) == 2.0 and r.lift("x", np.float32(0.5)) == 0.5 and r.lift("z", 9) == 1.0
    for bad in ["2.0", math.nan, -math.inf, None]:
        with pytest.raises(RingError, match="'x'"):
            r.lift("x", bad)
    for bad in (np.array([1.0, np.nan]), np.array([np.inf]), np.array(["a"]),
                np.array([1.0, "2"], dtype=object)):  # fmt: skip
        with pytest.raises(RingError, match="'x'"):
            r.batch_lift("x", bad)
    assert r.batch_lift("x", np.array([1, 2])).tolist() == [1.0, 2.0]
    assert r.equal(1.0, 1.0 + 1e-12, rtol=1e-9) and not r.equal(1.0, 1.0 + 1e-12)
    assert r.equal(0.0, 1e-9, atol=1e-8)
    flags = r.batch_is_negligible(np.array([0.0, 1e-13, -1e-12, 1e-11]))
    assert flags.tolist() == [True, True, True, False]
    assert r.batch_is_zero(np.array([0.0, 1e-13])).tolist() == [True, False]


# ------------------------------------------------------------------ products
pair_ring = ProductRing(RealRing(["x"]), IntegerRing())
pairs = st.tuples(exact_floats, big_ints)
small_pairs = st.tuples(exact_floats, small_ints)


def test_real_accumulators_are_compensated_and_refuse_non_finite_sums():
    """TwoSum rows (sum, error): a huge value added and taken back gives back the small
    ones; a sum leaving the finite range raises before anything is written."""
    r = RealRing()
    acc = r.batch_accumulator(3)
    slots = np.array([0, 2])
    for values in ([13.0, 1.0], [0.05, 1e-17], [1e20, 1e16], [-1e20, -1e16]):
        acc = r.batch_scatter_add(acc, slots, np.array(values))
    assert r.batch_take(acc, slots).tolist() == [13.0 + 0.05, 1.0 + 1e-17]
    assert r.batch_len(acc) == 3 and r.batch_is_zero(acc).tolist() == [False, True, False]
    before = acc.copy()
    with pytest.raises(RingError, match="overflow"):
        r.batch_scatter_add(acc, slots, np.array([1.0, 1.8e308]))
    assert np.array_equal(acc, before)
    grown = r.batch_resize(acc, 5)
    assert r.batch_to_list(grown) == [13.0 + 0.05, 0.0, 1.0 + 1e-17, 0.0, 0.0]
    plain = r.batch_accumulator(2, compensated=False)
    plain = r.batch_scatter_add(plain, np.array([0, 1]), np.array([1e308, 1.0]))
    with pytest.raises(RingError, match="overflow"):
        r.batch_scatter_add(plain, np.array([0, 1]), np.array([1e308, 1.0]))
    assert plain.tolist() == [1e308, 1.0]


def test_a_product_refused_by_one_component_puts_back_the_others_rows_exactly():
    ring = ProductRing(RealRing(), IntegerRing())
    acc = ring.batch_accumulator(2)
    acc = ring.batch_scatter_add(acc, np.array([0, 1]), (np.array([1e16, 3.0]), np.array([1, 1])))
    acc = ring.batch_scatter_add(acc, np.array([0]), (np.array([0.75]), np.array([1])))
    before = tuple(a.copy() for a in acc)
    with pytest.raises(RingError, match="overflow"):
        ring.batch_scatter_add(
            acc, np.array([0, 1]), (np.array([0.3, 0.1]), np.array([1, 2**63 - 1]))
        )
    assert all(np.array_equal(a, b) for a, b in zip(acc, before, strict=True))


@SETTINGS
@given(pairs, pairs, pairs)
def test_product_axioms(a, b, c):
    check_axioms(pair_ring, a, b, c)


@SETTINGS
@given(st.lists(small_pairs, max_size=8), st.data())
def test_product_batched_agrees(xs, data):
    ys = data.draw(st.lists(small_pairs, min_size=len(xs), max_size=len(xs)))
    check_batched_agrees(pair_ring, xs, ys)


def test_product_lift_is_componentwise():
    ring = ProductRing(RealRing(["x"]), IntegerRing(), RealRing(["y"]))
    assert ring.lifted_variables == {"x", "y"}
    assert ring.lift("x", 3) == (3.0, 1, 1.0)  # SUM(X) lifts x, COUNT and SUM(Y) give one
    assert ring.lift("y", 4) == (1.0, 1, 4.0)
    assert ring.lift("z", 5) == ring.one()
    lifted = ring.batch_lift("x", np.array([2.0, 5.0]))
    assert ring.batch_to_list(lifted) == [(2.0, 1, 1.0), (5.0, 1, 1.0)]
    with pytest.raises(RingError, match="'x'"):
        ring.lift("x", "oops")


def test_average_ring_along_a_join():
    """AVG(X) over R(A, X) ⋈ S(A): payload (SUM(X), COUNT), lift of X is (x, 1)."""
    ring = average_ring("x")
    assert isinstance(ring, AverageRing) and ring.lift("x", 3) == (3.0, 1)
    r_rows = [(1, 10.0), (1, 20.0), (2, 30.0)]
    s_rows = [1, 1, 2, 3]
    total = ring.zero()
    for a, x in r_rows:
        for a2 in s_rows:
            if a == a2:
                total = ring.add(total, ring.mul(ring.one(), ring.lift("x", x)))
    assert total == (90.0, 5)
    assert ring.value(total) == 18.0
    assert ring.read(total) == {"sum": 90.0, "count": 5}
    assert math.isnan(ring.value(ring.zero()))
    batch = ring.batch_from([(90.0, 5), (0.0, 0), (3.0, 2)])
    values = ring.batch_value(batch)
    assert values[0] == 18.0 and math.isnan(values[1]) and values[2] == 1.5
    assert ring.batch_read(batch)["count"].tolist() == [5, 0, 2]


def test_named_products_and_errors():
    ring = ProductRing.named(sx=RealRing(["x"]), sy=RealRing(["y"]), n=IntegerRing())
    p = ring.mul(ring.lift("x", 2.0), ring.lift("y", 3.0))
    assert ring.read(p) == {"sx": 2.0, "sy": 3.0, "n": 1}
    assert ring.component(p, "sy") == 3.0 and ring.component(p, 2) == 1
    assert ring.from_bytes(ring.to_bytes(p)) == p
    with pytest.raises(RingError):
        ring.component(p, "nope")
    with pytest.raises(RingError):
        ring.add(p, (1.0, 2.0))  # a payload of another arity
    with pytest.raises(RingError):
        ring.add(p, 3)
    with pytest.raises(RingError):
        ring.check_same_ring(ProductRing(RealRing(["x"]), RealRing(["y"]), IntegerRing()))
    with pytest.raises(RingError):
        pair_ring.check_same_ring(ProductRing(RealRing(["y"]), IntegerRing()))
    pair_ring.check_same_ring(ProductRing(RealRing(["x"]), IntegerRing()))
    with pytest.raises(RingError):
        ProductRing()
    with pytest.raises(RingError):
        ProductRing(IntegerRing(), names=["a", "b"])
    with pytest.raises(RingError, match="overflow"):
        pair_ring.batch_mul(
            pair_ring.batch_from([(1.0, 2**40)]), pair_ring.batch_from([(1.0, 2**40)])
        )


def test_product_commutativity_flag():
    from ringml.rings.matrix import MatrixRing

    assert pair_ring.commutative
    assert not ProductRing(IntegerRing(), MatrixRing(2)).commutative


# ------------------------------------------------------------------ W1 (Ex. 3 numeric)
def union(ring, r, s):
    out = dict(r)
    for k, p in s.items():
        out[k] = ring.add(out.get(k, ring.zero()), p)
    return {k: p for k, p in out.items() if not ring.is_zero(p)}


def join(ring, r, sch_r, t, sch_t):
    schema = sch_r + tuple(v for v in sch_t if v not in sch_r)
    out = {}
    for k1, p1 in r.items():
        for k2, p2 in t.items():
            d1, d2 = dict(zip(sch_r, k1, strict=True)), dict(zip(sch_t, k2, strict=True))
            if all(d1[v] == d2[v] for v in d1.keys() & d2.keys()):
                d = {**d1, **d2}
                key = tuple(d[v] for v in schema)
                out[key] = ring.add(out.get(key, ring.zero()), ring.mul(p1, p2))
    return {k: p for k, p in out.items() if not ring.is_zero(p)}, schema


def marginalize(ring, r, schema, var):
    j = schema.index(var)
    out = {}
    for k, p in r.items():
        kk = k[:j] + k[j + 1 :]
        out[kk] = ring.add(out.get(kk, ring.zero()), ring.mul(p, ring.lift(var, k[j])))
    return {k: p for k, p in out.items() if not ring.is_zero(p)}


def test_w1_operators():
    z = IntegerRing(["A"])  # g_A(a) = a
    R = {(1, 1): 2, (2, 1): 3}
    S = {(2, 1): 5, (3, 2): 7}
    T = {(1, 1): 11, (2, 2): 13}
    assert union(z, R, S) == {(1, 1): 2, (2, 1): 8, (3, 2): 7}
    st_join, schema = join(z, S, ("A", "B"), T, ("B", "C"))
    assert schema == ("A", "B", "C") and st_join == {(2, 1, 1): 55, (3, 2, 2): 91}
    assert marginalize(z, S, ("A", "B"), "A") == {(1,): 10, (2,): 21}
    S_neg = {(2, 1): -3, (3, 2): 7}
    assert (2, 1) not in union(z, R, S_neg)


def test_w1_batched():
    """The same operators on the batched face of ℤ (payload columns aligned by key)."""
    z = IntegerRing(["A"])
    s_keys = np.array([[2, 1], [3, 2]])
    s_pay = z.batch_from([5, 7])
    lifted = z.batch_mul(s_pay, z.batch_lift("A", s_keys[:, 0]))
    b_vals, groups = np.unique(s_keys[:, 1], return_inverse=True)
    summed = z.batch_sum_by(lifted, groups, len(b_vals))
    assert dict(zip(b_vals.tolist(), z.batch_to_list(summed), strict=True)) == {1: 10, 2: 21}
    r_pay = z.batch_from([3, 0])  # R aligned on S's keys: R(2,1)=3, R(3,2) absent
    assert z.batch_add(r_pay, s_pay).tolist() == [8, 7]
