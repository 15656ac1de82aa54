"""Tests of the generalized covariance ring (F-IVM Definitions 8-9, notes §9.2, W11)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ring_laws import check_axioms, check_batched_agrees
from ringml.rings.base import RingError
from ringml.rings.categorical import GCBatch, GCPayload, GeneralizedCovarianceRing

G = GeneralizedCovarianceRing

RINGS = [
    G(["x", "y"], ["u", "v", "w"]),
    G([], ["u", "v"]),
    G(["x", "y", "z"], []),
    G(["x"], ["u"]),
]

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def lift_value(ring: G, var: str, x: int):
    return x if ring.is_categorical(var) else float(x)


@st.composite
def payloads(draw, ring: G):
    """Sums of integer multiples of products of lifts (integer-valued floats: exact)."""
    if not ring.variables:
        return ring.scale(ring.one(), draw(st.integers(-3, 3)))
    lifts = st.tuples(st.sampled_from(ring.variables), st.integers(-2, 3))
    terms = draw(st.lists(st.tuples(st.integers(-2, 2), st.lists(lifts, max_size=3)), max_size=3))
    acc = ring.zero()
    for k, factors in terms:
        term = ring.one()
        for var, x in factors:
            term = ring.mul(term, ring.lift(var, lift_value(ring, var, x)))
        acc = ring.add(acc, ring.scale(term, k))
    return acc


@st.composite
def ring_and_elements(draw, count: int | None = None):
    ring = draw(st.sampled_from(RINGS))
    n = count if count is not None else draw(st.integers(0, 6))
    xs = [draw(payloads(ring)) for _ in range(n)]
    if count is not None:
        return ring, xs
    ys = [draw(payloads(ring)) for _ in range(n)]
    return ring, xs, ys


# ------------------------------------------------------------------- ring laws
@SETTINGS
@given(ring_and_elements(count=3))
def test_ring_axioms(data):
    ring, (a, b, c) = data
    check_axioms(ring, a, b, c)


@SETTINGS
@given(ring_and_elements())
def test_batched_agrees_with_scalar(data):
    ring, xs, ys = data
    check_batched_agrees(ring, xs, ys)


@SETTINGS
@given(ring_and_elements(count=4))
def test_batch_take_concat_sum_by_negligible(data):
    ring, xs = data
    b = ring.batch_from(xs)
    idx = np.array([3, 3, 0, -1, 1])
    got = ring.batch_to_list(ring.batch_take(b, idx))
    for g, i in zip(got, idx, strict=True):
        assert ring.equal(g, xs[i])
    assert ring.batch_len(ring.batch_concat([])) == 0
    resized = ring.batch_resize(b, 6)
    assert ring.batch_len(resized) == 6 and all(
        ring.batch_is_zero(ring.batch_take(resized, [4, 5]))
    )
    total = ring.batch_sum(b)
    expected = ring.zero()
    for x in xs:
        expected = ring.add(expected, x)
    assert ring.equal(total, expected)
    diff = ring.batch_sub(b, b)
    assert all(ring.batch_is_zero(diff)) and all(ring.batch_is_negligible(diff))
    assert list(ring.batch_is_negligible(b)) == [ring.is_zero(x) for x in xs]


def test_zero_test_is_exact():
    ring = G(["x"], ["u"])
    # delete (x=1, u=3), insert (x=2, u=3): count 0, sums non-zero -> not zero
    delta = ring.sub(
        ring.mul(ring.lift("x", 2.0), ring.lift("u", 3)),
        ring.mul(ring.lift("x", 1.0), ring.lift("u", 3)),
    )
    assert delta.count == 0 and not ring.is_zero(delta)
    b = ring.batch_from([delta, ring.zero()])
    assert list(ring.batch_is_zero(b)) == [False, True]
    assert list(ring.batch_is_negligible(b)) == [False, True]
    tiny = ring.element(0, products={("x", "u"): {3: 1e-12}})
    assert not ring.is_zero(tiny)
    tb = ring.batch_from([tiny])
    assert list(ring.batch_is_zero(tb)) == [False]
    assert list(ring.batch_is_negligible(tb)) == [True]


# ------------------------------------------------------------- semantics
def test_lifts_and_same_variable_join():
    ring = G(["x"], ["u", "v"], shift=False)  # payloads hold x itself
    lx = ring.lift("x", 3.0)
    assert lx == GCPayload(1.0, {0: 3.0}, {(0, 0): 9.0})
    lu = ring.lift("u", 7)
    assert lu == GCPayload(1.0, {1: {7: 1.0}}, {(1, 1): {7: 1.0}})  # Q_uu = s_u
    assert ring.equal(ring.lift("nope", 1), ring.one())
    # s_a[u] ⊗ s_b[u] joins on u: equal categories meet, different ones do not
    sq = ring.mul(lu, lu)
    assert ring.entry(sq, "u") == {7: 2.0} and ring.entry(sq, "u", "u") == {7: 4.0}
    other = ring.mul(lu, ring.lift("u", 8))
    assert ring.entry(other, "u") == {7: 1.0, 8: 1.0}
    assert ring.entry(other, "u", "u") == {7: 1.0, 8: 1.0}
    # cross-variable keys pair up; the pair keys follow global order (u before v)
    uv = ring.mul(ring.mul(ring.lift("v", 2), lu), lx)
    assert ring.entry(uv, "u", "v") == {(7, 2): 1.0}
    assert ring.entry(uv, "v", "u") == {(2, 7): 1.0}
    assert ring.entry(uv, "x", "v") == {2: 3.0}  # SUM(x) GROUP BY v
    assert ring.entry(uv, "x", "x") == 9.0
    # any hashable category at the scalar face
    s = ring.mul(ring.lift("u", "red"), ring.lift("v", ("a", 1)))
    assert ring.entry(s, "u", "v") == {("red", ("a", 1)): 1.0}
    assert ring.count_tables(s)[("u", "v")] == {("red", ("a", 1)): 1.0}


def test_element_builder_and_equality_by_config():
    ring = G(["x"], ["u", "v"])
    e = ring.element(2, {"u": {1: 2}, "x": 3}, {("v", "u"): {(5, 1): 1}, ("u", "x"): {1: 4}})
    assert e.products[(1, 2)] == {(1, 5): 1.0}
    assert e.products[(0, 1)] == {1: 4.0}
    assert G(["x"], ["u", "v"]) == ring and hash(G(["x"], ["u", "v"])) == hash(ring)
    assert G(["x"], ["v", "u"]) != ring
    assert ring.lifted_variables == {"x", "u", "v"}
    assert ring.variables == ("x", "u", "v")


# ------------------------------------------------------------------ W11 / Ex. 19
def _group(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    return uniq, inv.reshape(-1)


def test_example_19_view_tree_by_hand():
    ring = G(["A", "B", "D", "E"], ["C"], shift=False)  # the example's payloads, unshifted
    R = {"A": np.array([1, 1, 2, 3]), "B": np.array([1.0, 2, 3, 4])}
    S = {"A": np.array([1, 1, 1, 2]), "C": np.array([1, 1, 2, 2]), "E": np.array([1.0, 2, 3, 4])}
    T = {"C": np.array([1, 2, 2, 3]), "D": np.array([1.0, 2, 3, 4])}

    # leaves: V^{@B}_R[A], V^{@E}_S[A,C], V^{@D}_T[C]
    r_keys, r_inv = _group(R["A"])
    v_r = ring.batch_sum_by(ring.batch_lift("B", R["B"]), r_inv, len(r_keys))
    s_keys, s_inv = _group(np.stack([S["A"], S["C"]], axis=1))
    v_s = ring.batch_sum_by(ring.batch_lift("E", S["E"]), s_inv, len(s_keys))
    t_keys, t_inv = _group(T["C"])
    v_t = ring.batch_sum_by(ring.batch_lift("D", T["D"]), t_inv, len(t_keys))
    assert ring.equal(ring.batch_to_list(v_t)[1], ring.element(2, {"D": 5}, {("D", "D"): 13}))

    # V^{@C}_{ST}[A] = ⊕_C V_T[C] * V_S[A,C] * g_C(C)
    c_vals = s_keys[:, 1]
    t_pos = np.searchsorted(t_keys, c_vals)
    assert (t_keys[t_pos] == c_vals).all()
    prod = ring.batch_mul(
        ring.batch_mul(ring.batch_take(v_t, t_pos), v_s), ring.batch_lift("C", c_vals)
    )
    st_keys, st_inv = _group(s_keys[:, 0])
    v_st = ring.batch_sum_by(prod, st_inv, len(st_keys))
    expected_st2 = ring.element(
        2,
        {"C": {2: 2}, "D": 5, "E": 8},
        {
            ("C", "C"): {2: 2},
            ("C", "D"): {2: 5},
            ("C", "E"): {2: 8},
            ("D", "D"): 13,
            ("D", "E"): 20,
            ("E", "E"): 32,
        },
    )
    got_st2 = ring.batch_to_list(v_st)[list(st_keys).index(2)]
    assert ring.equal(got_st2, expected_st2), got_st2

    # root: ⊕_A V_R[A] * V_ST[A] * g_A(A), A in both children
    common = np.intersect1d(r_keys, st_keys)
    root_b = ring.batch_mul_sum(
        [
            ring.batch_take(v_r, np.searchsorted(r_keys, common)),
            ring.batch_take(v_st, np.searchsorted(st_keys, common)),
            ring.batch_lift("A", common.astype(float)),
        ]
    )
    root = ring.batch_to_list(root_b)[0]

    w10_vars = ["A", "B", "C", "D", "E"]
    w10_s = [12, 18, 16, 19, 26]
    w10_q = [
        [16, 24, 20, 24, 34],
        [24, 38, 30, 36, 51],
        [20, 30, 28, 34, 46],
        [24, 36, 34, 43, 56],
        [34, 51, 46, 56, 78],
    ]
    cont = [i for i, v in enumerate(w10_vars) if v != "C"]
    sums: dict = {w10_vars[i]: w10_s[i] for i in cont}
    sums["C"] = {1: 4, 2: 6}
    products: dict = {(w10_vars[i], w10_vars[j]): w10_q[i][j] for i in cont for j in cont if i <= j}
    products.update(
        {
            ("C", "C"): {1: 4, 2: 6},
            ("A", "C"): {1: 4, 2: 8},
            ("B", "C"): {1: 6, 2: 12},
            ("C", "D"): {1: 4, 2: 15},
            ("C", "E"): {1: 6, 2: 20},
        }
    )
    expected_root = ring.element(10, sums, products)
    assert ring.equal(root, expected_root), root
    assert ring.count_tables(root) == {(): 10.0, ("C",): {1: 4.0, 2: 6.0}}
    # one-hot read-out reproduces the W10 Gram matrix after merging C's columns
    count, s, Q = ring.to_dense(root, {"C": [1, 2]})
    assert count == 10
    weights = np.array([1, 2])  # c_1 = 1, c_2 = 2: collapse one-hot back to the value of C
    s_c = s[4:] @ weights
    assert s_c == 16 and Q[4:, 4:].diagonal() @ (weights**2) == 28


# ------------------------------------------------------------ one-hot oracle
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_hot_oracle_on_mixed_join(seed):
    rng = np.random.default_rng(seed)
    ring = G(["x1", "x2", "x3"], ["c1", "c2"])
    dom_c1, dom_c2 = [3, 10, 42], [0, 5, 7, 1000]
    R = pd.DataFrame(
        {
            "a": rng.integers(0, 4, 12),
            "x1": rng.integers(-3, 4, 12).astype(float),
            "c1": rng.choice(dom_c1, 12),
        }
    )
    S = pd.DataFrame(
        {
            "a": rng.integers(0, 4, 15),
            "b": rng.integers(0, 4, 15),
            "x2": rng.integers(-3, 4, 15).astype(float),
            "c2": rng.choice(dom_c2, 15),
        }
    )
    T = pd.DataFrame({"b": rng.integers(0, 4, 10), "x3": rng.integers(-3, 4, 10).astype(float)})

    # factorized: V_R[a], V_T[b] (dense over the key domain 0..3; absent keys are zero)
    v_r = ring.batch_sum_by(
        ring.batch_mul(
            ring.batch_lift("x1", R.x1.to_numpy()), ring.batch_lift("c1", R.c1.to_numpy())
        ),
        R.a.to_numpy(),
        4,
    )
    v_t = ring.batch_sum_by(ring.batch_lift("x3", T.x3.to_numpy()), T.b.to_numpy(), 4)
    root_b = ring.batch_mul_sum(
        [
            ring.batch_take(v_r, S.a.to_numpy()),
            ring.batch_take(v_t, S.b.to_numpy()),
            ring.batch_lift("x2", S.x2.to_numpy()),
            ring.batch_lift("c2", S.c2.to_numpy()),
        ]
    )
    root = ring.batch_to_list(root_b)[0]

    flat = R.merge(S, on="a").merge(T, on="b")
    M = np.column_stack(
        [flat[["x1", "x2", "x3"]].to_numpy()]
        + [(flat.c1.to_numpy()[:, None] == np.array(dom_c1)).astype(float)]
        + [(flat.c2.to_numpy()[:, None] == np.array(dom_c2)).astype(float)]
    )
    count, s, Q = ring.to_dense(root, {"c1": dom_c1, "c2": dom_c2})
    assert count == len(flat)
    np.testing.assert_array_equal(s, M.sum(axis=0))
    np.testing.assert_array_equal(Q, M.T @ M)

    tables = ring.count_tables(root)
    assert tables[()] == len(flat)
    assert tables[("c1",)] == {k: float(v) for k, v in flat.c1.value_counts().items()}
    pair_counts = flat.groupby(["c1", "c2"]).size()
    assert tables[("c1", "c2")] == {(a, b): float(v) for (a, b), v in pair_counts.items()}

    # the flat computation (lift every column of the join, multiply, sum) agrees
    if len(flat):
        flat_b = ring.batch_mul_sum(
            [ring.batch_lift(v, flat[v].to_numpy()) for v in ring.variables]
        )
        assert ring.equal(ring.batch_to_list(flat_b)[0], root)


def test_w14_count_tables():
    ring = G([], ["A", "B", "C", "D"])
    R = pd.DataFrame({"A": [1, 1, 2, 3, 3], "B": [1, 2, 1, 2, 3]})
    S = pd.DataFrame({"B": [1, 1, 2, 2, 3, 2], "C": [1, 2, 1, 2, 1, 1], "D": [1, 1, 2, 2, 1, 1]})
    flat = R.merge(S, on="B")
    root = ring.batch_sum(
        ring.batch_mul_sum([ring.batch_lift(v, flat[v].to_numpy()) for v in "ABCD"])
    )
    t = ring.count_tables(root)
    assert t[()] == 11
    assert t[("A",)] == {1: 5, 2: 2, 3: 4}
    assert t[("B",)] == {1: 4, 2: 6, 3: 1}
    assert t[("C",)] == {1: 7, 2: 4}
    assert t[("D",)] == {1: 7, 2: 4}
    assert sum(t[("A", "B")].values()) == 11


# --------------------------------------------------------------------- scale
def test_scale_many_categories_sparse():
    ring = G(["x"], ["c"], shift=False)  # x' = x: the sums per category stay positive
    n, k = 100_000, 10_000
    rng = np.random.default_rng(0)
    codes = rng.permutation(np.arange(n) % k).astype(np.int64) * 7 + 3  # sparse code space
    xs = rng.integers(1, 6, n).astype(float)  # positive: no SUM(x) GROUP BY c cancels
    t0 = time.perf_counter()
    prod = ring.batch_mul(ring.batch_lift("c", codes), ring.batch_lift("x", xs))
    total = ring.batch_sum_by(prod, np.zeros(n, dtype=np.int64), 1)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, elapsed
    # per row: s_c, Q_cc, Q_xc -> 3 entries; after summing: 3 per present category
    assert prod.nnz <= 3 * n
    assert total.nnz == 3 * k
    assert total.value.nbytes + total.key1.nbytes < 1_000_000
    root = ring.batch_to_list(total)[0]
    assert root.count == n
    assert ring.entry(root, "c") == {int(c): 10.0 for c in np.unique(codes)}
    by_code = pd.Series(xs).groupby(codes).sum()
    expected = {int(c): float(v) for c, v in by_code.items() if v != 0}
    assert ring.entry(root, "x", "c") == expected
    assert ring.entry(root, "x") == xs.sum()


def test_scatter_add_and_clear_in_place():
    ring = G(["x"], ["u", "v"])
    acc = ring.batch_accumulator(5)
    vals = ring.batch_mul(
        ring.batch_lift("u", np.array([1, 2, 1])), ring.batch_lift("v", np.array([4, 4, 5]))
    )
    out = ring.batch_scatter_add(acc, np.array([4, 0, 2]), vals)
    assert out is acc
    out = ring.batch_scatter_add(acc, np.array([0, 0, 1]), vals)  # repeated slots also work
    got = ring.batch_to_list(out)
    assert ring.equal(
        got[0],
        ring.add(
            ring.mul(ring.lift("u", 2), ring.lift("v", 4)),
            ring.add(
                ring.mul(ring.lift("u", 1), ring.lift("v", 4)),
                ring.mul(ring.lift("u", 2), ring.lift("v", 4)),
            ),
        ),
    )
    assert ring.equal(got[1], ring.mul(ring.lift("u", 1), ring.lift("v", 5)))
    ring.batch_clear(acc, np.array([0, 4]))
    assert list(ring.batch_is_zero(acc)) == [True, False, False, True, True]


# ---------------------------------------------------------------- bad input
def test_bad_lift_values():
    ring = G(["x"], ["c"])
    for bad in ([1.0, np.nan], [np.inf], ["abc"], np.array([1.0, None], dtype=object)):
        with pytest.raises(RingError, match="'x'"):
            ring.batch_lift("x", np.asarray(bad))
    with pytest.raises(RingError, match="nan"):
        ring.batch_lift("x", np.array([1.0, np.nan]))
    with pytest.raises(RingError, match="abc"):
        ring.batch_lift("x", np.array(["abc"]))
    for bad in ([1.5, 2.0], ["red"], np.array([1, "a"], dtype=object)):
        with pytest.raises(RingError, match="'c'.*integer category codes"):
            ring.batch_lift("c", np.asarray(bad))
    with pytest.raises(RingError, match="'x'"):
        ring.lift("x", "3")
    with pytest.raises(RingError, match="'x'"):
        ring.lift("x", float("nan"))
    with pytest.raises(RingError, match="'c'"):
        ring.lift("c", None)
    with pytest.raises(RingError, match="'c'"):
        ring.lift("c", [1, 2])
    b = ring.batch_lift("c", np.array([1, 2], dtype=np.uint8))
    assert ring.batch_to_list(b)[1] == ring.lift("c", 2)


def test_bad_configuration_and_batches():
    with pytest.raises(RingError, match="twice"):
        G(["x"], ["x"])
    with pytest.raises(RingError):
        G("xy", [])
    with pytest.raises(RingError):
        G([1], [])
    ring = G(["x"], ["c"])
    with pytest.raises(RingError, match="lengths"):
        ring.batch_add(ring.batch_ones(2), ring.batch_ones(3))
    with pytest.raises(RingError):
        ring.batch_mul(ring.batch_ones(2), G(["x", "y"], ["c"]).batch_ones(2))
    with pytest.raises(RingError, match="does not belong"):
        ring.batch_add(ring.batch_ones(2), G(["x"], ["d"]).batch_ones(2))
    assert ring.batch_len(ring.batch_lift("c", np.array([]))) == 0
    assert ring.batch_len(ring.batch_lift("x", np.array([], dtype=object))) == 0
    with pytest.raises(RingError, match="integer category codes"):
        ring.batch_from([ring.lift("c", "red")])
    with pytest.raises(RingError, match="group"):
        ring.batch_sum_by(ring.batch_ones(2), np.array([0, 2]), 2)
    with pytest.raises(RingError, match="not in the given categories"):
        ring.to_dense(ring.lift("c", 4), {"c": [1, 2]})
    with pytest.raises(RingError, match="unknown variable"):
        ring.element(1, {"nope": 1.0})
    with pytest.raises(RingError):
        ring.element(1, {"x": {1: 2.0}})  # continuous entry keyed by a category
    data = ring.batch_to_bytes(ring.batch_lift("c", np.array([1, 2])))
    with pytest.raises(RingError, match="not for"):
        G(["x"], ["d"]).batch_from_bytes(data)
    with pytest.raises(RingError):
        ring.batch_from_bytes(b"garbage")
    with pytest.raises(RingError, match="truncated"):
        ring.batch_from_bytes(data[:-3])
    with pytest.raises(RingError):
        ring.from_bytes(data)  # two elements


def test_serialization_round_trip_and_no_pickle():
    ring = G(["x", "y"], ["u", "v"])
    b = ring.batch_mul(
        ring.batch_lift("u", np.array([5, 6, 7])),
        ring.batch_add(
            ring.batch_lift("v", np.array([1, 2, 3])),
            ring.batch_lift("x", np.array([0.5, 1.5, 2.5])),
        ),
    )
    data = ring.batch_to_bytes(b)
    assert b"pickle" not in data and data[:4] == b"RGCB"
    back = ring.batch_from_bytes(data)
    assert isinstance(back, GCBatch)
    for x, y in zip(ring.batch_to_list(back), ring.batch_to_list(b), strict=True):
        assert ring.equal(x, y)


# ------------------------------------------------------------------ batched fast paths
def _arrays(b: GCBatch) -> list[np.ndarray]:
    return [b.count, b.sums, b.prods, b.rows, b.entry, b.key1, b.key2, b.value]


@pytest.mark.parametrize("seed", range(4))
def test_lift_many_is_the_product_of_the_lifts(seed):
    """Bit for bit, including zeros in continuous columns (no zero entries are stored)."""
    from functools import reduce

    rng = np.random.default_rng(seed)
    ring = G(["x", "y", "z"], ["u", "v", "w"])
    for n in (0, 1, 25):
        chosen = list(rng.permutation(["x", "y", "z", "u", "v", "w", "other"]))[: 2 + seed]
        columns = [
            rng.integers(0, 5, n)
            if v in ("u", "v", "w")
            else np.where(rng.random(n) < 0.3, 0.0, rng.normal(size=n))
            for v in chosen
        ]
        many = ring.batch_lift_many(chosen, columns)
        lifts = [ring.batch_lift(v, c) for v, c in zip(chosen, columns, strict=True)]
        product = reduce(ring.batch_mul, lifts)
        for got, want in zip(_arrays(many), _arrays(product), strict=True):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(RingError, match="lifted twice"):
        ring.batch_lift_many(["u", "u"], [np.zeros(2, np.int64), np.zeros(2, np.int64)])
    with pytest.raises(RingError, match="integer category codes"):
        ring.batch_lift_many(["x", "u"], [np.zeros(2), np.array(["a", "b"], dtype=object)])


@pytest.mark.parametrize("seed", range(4))
def test_scatter_add_merge_equals_a_full_coalesce(seed, monkeypatch):
    """The binary-search merge into a stored table gives exactly what re-sorting the whole
    table gives: unique and repeated slots, and deltas that cancel stored entries."""
    import copy

    rng = np.random.default_rng(seed)
    ring = G(["a", "b"], ["x", "y", "z"])

    def batch(n):
        cols = [
            rng.normal(size=n).round(1),
            rng.integers(-2, 3, n).astype(float),
            rng.integers(0, 5, n),
            rng.integers(0, 3, n),
            rng.integers(0, 4, n),
        ]
        lifted = ring.batch_lift_many(["a", "b", "x", "y", "z"], cols)
        return ring.batch_scale(lifted, rng.integers(-1, 2, n))

    for trial in range(40):
        cap = int(rng.integers(1, 15))
        target = ring.batch_sum_by(batch(30), rng.integers(0, cap, 30), cap)
        m = int(rng.integers(1, cap + 1))
        slots = rng.choice(cap, m, replace=False) if trial % 3 else rng.integers(0, cap, m)
        values = batch(m) if trial % 4 else ring.batch_neg(ring.batch_take(target, slots))
        merged = ring.batch_scatter_add(copy.deepcopy(target), slots, values)
        with monkeypatch.context() as patch:
            patch.setattr(G, "_merge_into", lambda self, *args: False)
            patch.setattr(G, "_merge_keys", staticmethod(lambda *args: None))
            resorted = ring.batch_scatter_add(copy.deepcopy(target), slots, values)
        for got, want in zip(_arrays(merged), _arrays(resorted), strict=True):
            np.testing.assert_array_equal(got, want)


def test_coalesce_with_codes_too_wide_for_one_key():
    ring = G([], ["u", "v"])
    big = 2**40
    a = ring.batch_lift_many(["u", "v"], [np.array([big, 1, big]), np.array([big, 2, big])])
    total = ring.batch_to_list(ring.batch_sum_by(a, np.zeros(3, dtype=np.int64), 1))[0]
    assert ring.entry(total, "u", "v") == {(big, big): 2.0, (1, 2): 1.0}
    assert ring.entry(total, "u") == {big: 2.0, 1: 1.0}
    store = ring.batch_sum_by(a, np.array([0, 1, 0]), 2)
    store = ring.batch_scatter_add(store, np.array([1]), ring.batch_take(a, [0]))
    second = ring.batch_to_list(store)[1]
    assert ring.entry(second, "u", "v") == {(big, big): 1.0, (1, 2): 1.0}


# ------------------------------------------------------- deferred accumulator tables
def _plain_reference(monkeypatch_context):
    """Patch the ring so that scatter-adds take the plain full re-sort path."""
    monkeypatch_context.setattr(G, "_merge_into", lambda self, *args: False)


def _random_delta(ring: G, rng, n: int):
    cols = [
        rng.normal(size=n).round(1),
        rng.integers(-2, 3, n).astype(float),
        rng.integers(0, 6, n),
        rng.integers(0, 3, n),
        rng.integers(0, 4, n),
    ]
    lifted = ring.batch_lift_many(["a", "b", "x", "y", "z"], cols)
    return ring.batch_scale(lifted, rng.integers(-1, 2, n))


def _dict_of(ring: G, b: GCBatch) -> dict:
    """(row, entry, key1, key2) -> value of a batch's sparse table, read by batch_take."""
    t = ring.batch_take(b, np.arange(len(b)))
    return {
        (r, e, k1, k2): v
        for r, e, k1, k2, v in zip(*(x.tolist() for x in _arrays(t)[3:]), strict=True)
    }


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pending_min", [0, 3, 4096])
def test_deferred_table_equals_the_plain_merge(seed, pending_min, monkeypatch):
    """A long mix of scatter-adds (unique and repeated slots, deltas cancelling stored
    entries), clears, resizes and takes on a deferred accumulator gives, bit for bit, what
    the plain re-sorting merge gives, and what a dict oracle of the sparse entries gives;
    with small pending limits the pending run is settled (and zeros dropped) often."""
    import copy

    import ringml.rings.categorical as module

    monkeypatch.setattr(module, "_PENDING_MIN", pending_min)
    rng = np.random.default_rng(seed)
    ring = G(["a", "b"], ["x", "y", "z"])
    cap = 6
    fast, slow = ring.batch_accumulator(cap), ring.batch_accumulator(cap)
    oracle: dict = {}
    for step in range(60):
        op = rng.integers(0, 10)
        if op == 0:
            slots = rng.choice(cap, int(rng.integers(1, 3)), replace=False)
            fast = ring.batch_clear(fast, slots)
            slow = ring.batch_clear(slow, slots)
            oracle = {k: v for k, v in oracle.items() if k[0] not in set(slots.tolist())}
        elif op == 1:
            cap += int(rng.integers(1, 4))
            fast, slow = ring.batch_resize(fast, cap), ring.batch_resize(slow, cap)
        else:
            m = int(rng.integers(1, cap + 1))
            if step % 3:
                slots = rng.choice(cap, m, replace=False)
            else:
                slots = rng.integers(0, cap, m)
            if op == 2:  # cancel what is stored at those (unique) slots
                slots = np.unique(slots)
                values = ring.batch_neg(ring.batch_take(slow, slots))
            else:
                values = _random_delta(ring, rng, len(slots))
            for (r, e, k1, k2), v in _dict_of(ring, values).items():
                key = (int(slots[r]), e, k1, k2)
                oracle[key] = oracle.get(key, 0.0) + v
            fast = ring.batch_scatter_add(fast, slots, copy.deepcopy(values))
            with monkeypatch.context() as patch:
                _plain_reference(patch)
                slow = ring.batch_scatter_add(slow, slots, values)
        oracle = {k: v for k, v in oracle.items() if v != 0}
        idx = rng.integers(0, cap, int(rng.integers(0, 2 * cap)))
        for got, want in zip(
            _arrays(ring.batch_take(fast, idx)), _arrays(ring.batch_take(slow, idx)), strict=True
        ):
            np.testing.assert_array_equal(got, want)
        if step % 7 == 0:  # the dict oracle (values are sums of one-decimal terms: close)
            got = _dict_of(ring, fast)
            assert got.keys() == oracle.keys()
            for k, v in oracle.items():
                assert got[k] == pytest.approx(v, abs=1e-9)
        if step % 11 == 0:  # reading the plain arrays settles; adding again re-packs
            copy_ = copy.deepcopy(fast)
            for got, want in zip(_arrays(copy_), _arrays(slow), strict=True):
                np.testing.assert_array_equal(got, want)
    assert fast._deferred is not None or pending_min == 0 or cap == 0
    for got, want in zip(_arrays(fast), _arrays(slow), strict=True):
        np.testing.assert_array_equal(got, want)
    assert list(ring.batch_is_zero(fast)) == list(ring.batch_is_zero(slow))


@pytest.mark.parametrize("seed", range(4))
def test_deferred_add_of_an_uncoalesced_delta_equals_the_plain_merge(seed, monkeypatch):
    """A delta built by hand whose sparse entries are out of order and repeated (not the
    coalesced form the ring's own operations make), added at unordered slots to a deferred
    accumulator holding some of its keys, gives bit for bit what the plain re-sorting
    merge gives; so does the same delta coalesced (its rows' runs reordered by slot)."""
    rng = np.random.default_rng(seed)
    ring = G(["a", "b"], ["x", "y", "z"])
    cap = 12
    fast, slow = ring.batch_accumulator(cap), ring.batch_accumulator(cap)
    first = _random_delta(ring, rng, cap)
    fast = ring.batch_scatter_add(fast, np.arange(cap), first)
    with monkeypatch.context() as patch:
        _plain_reference(patch)
        slow = ring.batch_scatter_add(slow, np.arange(cap), first)
    delta = _random_delta(ring, rng, 7)
    cols = [delta.rows, delta.entry, delta.key1, delta.key2, delta.value]
    twice = rng.random(len(delta.value)) < 0.3  # repeated entries, each half of the value
    cols = [np.concatenate([c, c[twice]]) for c in cols]
    cols[4] = np.where(np.arange(len(cols[4])) < len(delta.value), cols[4], 0.0)
    cols[4][: len(delta.value)][twice] /= 2
    cols[4][len(delta.value) :] = cols[4][: len(delta.value)][twice]
    order = rng.permutation(len(cols[0]))
    raw = GCBatch(delta.count, delta.sums, delta.prods, *(c[order] for c in cols), delta.config)
    slots = rng.permutation(cap)[:7]
    for values in (raw, delta):
        fast = ring.batch_scatter_add(fast, slots, values)
        with monkeypatch.context() as patch:
            _plain_reference(patch)
            slow = ring.batch_scatter_add(slow, slots, values)
        assert fast._deferred is not None
        every = np.arange(cap)
        for got, want in zip(
            _arrays(ring.batch_take(fast, every)),
            _arrays(ring.batch_take(slow, every)),
            strict=True,
        ):
            np.testing.assert_array_equal(got, want)


def test_deferred_add_does_not_copy_the_stored_table():
    """A small delta of new keys goes into the pending run; a delta of stored keys adds in
    place: the main run's arrays are not copied."""
    ring = G(["a"], ["x", "y"])
    n = 200
    acc = ring.batch_accumulator(n)
    big = ring.batch_lift_many(
        ["a", "x", "y"], [np.arange(n, dtype=float) + 1, np.arange(n) % 7, np.arange(n) % 5]
    )
    acc = ring.batch_scatter_add(acc, np.arange(n), big)
    d = acc._deferred
    assert d is not None
    mkey, mval = d.mkey, d.mval
    small = ring.batch_lift_many(["a", "x", "y"], [np.array([2.0]), [3], [4]])
    ring.batch_scatter_add(acc, np.array([5]), small)  # new keys: pending
    ring.batch_scatter_add(acc, np.array([0]), ring.batch_take(big, [0]))  # stored keys
    ring.batch_clear(acc, np.array([7]))
    assert d.mkey is mkey and d.mval is mval and len(d.pkey) > 0 and d.zeros > 0
    got = ring.batch_to_list(ring.batch_take(acc, [0, 5, 7]))
    assert ring.equal(got[0], ring.scale(ring.batch_to_list(ring.batch_take(big, [0]))[0], 2))
    five = ring.add(ring.batch_to_list(ring.batch_take(big, [5]))[0], ring.batch_to_list(small)[0])
    assert ring.equal(got[1], five)
    assert ring.is_zero(got[2])
    assert acc.nnz == sum(len(ring.batch_take(acc, [r]).value) for r in range(n))
    assert acc._deferred is not None and len(acc.rows) == acc.nnz
    assert acc._deferred is None  # reading the plain arrays turned the table back


def test_deferred_table_pickles_and_keeps_working():
    import pickle

    ring = G(["a"], ["x", "y"])
    acc = ring.batch_accumulator(4)
    lifted = ring.batch_lift_many(["a", "x", "y"], [np.array([1.0, 2.0]), [1, 2], [3, 1]])
    acc = ring.batch_scatter_add(acc, np.array([0, 3]), lifted)
    acc = ring.batch_scatter_add(acc, np.array([1]), ring.batch_take(lifted, [1]))
    ring.batch_clear(acc, np.array([0]))
    assert acc._deferred is not None and len(acc._deferred.pkey)
    restored = pickle.loads(pickle.dumps(acc))
    for b in (acc, restored):
        b = ring.batch_scatter_add(b, np.array([2]), ring.batch_take(lifted, [0]))
    assert ring.batch_to_list(acc) == ring.batch_to_list(restored)
    expected = [ring.zero(), *ring.batch_to_list(ring.batch_take(lifted, [1, 0, 1]))]
    for got, want in zip(ring.batch_to_list(restored), expected, strict=True):
        assert ring.equal(got, want)


def test_batches_pickled_before_the_deferred_form_still_load():
    """Pickles of the earlier dataclass stored the table under the public attribute names."""
    ring = G(["a"], ["x"])
    b = ring.batch_lift_many(["a", "x"], [np.array([1.5, 2.0]), [3, 4]])
    old_state = {
        "count": b.count,
        "sums": b.sums,
        "prods": b.prods,
        "rows": b.rows,
        "entry": b.entry,
        "key1": b.key1,
        "key2": b.key2,
        "value": b.value,
        "config": b.config,
    }
    restored = GCBatch.__new__(GCBatch)
    restored.__setstate__({k: np.copy(v) if k != "config" else v for k, v in old_state.items()})
    assert ring.batch_to_list(restored) == ring.batch_to_list(b)
    acc = ring.batch_scatter_add(restored, np.array([0, 1]), b)
    assert ring.batch_to_list(acc) == ring.batch_to_list(ring.batch_scale(b, np.array([2, 2])))


def test_deferred_keys_repack_when_codes_grow_and_fall_back_when_too_wide():
    ring = G([], ["u", "v"])
    acc = ring.batch_accumulator(3)
    small = ring.batch_lift_many(["u", "v"], [np.array([1, 2]), np.array([3, 1])])
    acc = ring.batch_scatter_add(acc, np.array([0, 1]), small)
    k1 = acc._deferred.k1
    wider = ring.batch_lift_many(["u", "v"], [np.array([500]), np.array([2])])
    acc = ring.batch_scatter_add(acc, np.array([0]), wider)
    assert acc._deferred.k1 > k1
    huge = ring.batch_lift_many(["u", "v"], [np.array([2**40]), np.array([2**40])])
    acc = ring.batch_scatter_add(acc, np.array([2]), huge)
    assert acc._deferred is None  # packed keys would not fit: the plain merge
    got = ring.batch_to_list(acc)
    assert ring.entry(got[0], "u", "v") == {(1, 3): 1.0, (500, 2): 1.0}
    assert ring.entry(got[1], "u", "v") == {(2, 1): 1.0}
    assert ring.entry(got[2], "u", "v") == {(2**40, 2**40): 1.0}


# ------------------------------------------------------------------------ shifts
def _one_hot_moments(x: np.ndarray, u: np.ndarray, cats: list[int]):
    """Raw (count, sums, products) of the columns [x..., one-hot(u)] by numpy."""
    M = np.column_stack([x, (u[:, None] == np.array(cats)).astype(float)])
    return len(M), M.sum(axis=0), M.T @ M


def test_shift_is_fixed_at_the_first_lift_and_the_readers_undo_it():
    ring = G(["x", "y"], ["u"])
    np.testing.assert_array_equal(ring.shifts, [np.nan, np.nan, 0.0])
    x = np.array([10.0, 12.0, 14.5, 11.25])
    y = np.array([-3.0, 0.5, 2.0, 7.0])
    u = np.array([1, 2, 1, 5])
    ring.check_lift("x", x)  # validation alone fixes nothing
    assert np.isnan(ring.shifts[0])
    with pytest.raises(RingError, match="'x'"):
        ring.check_lift("x", np.array([1.0, np.inf]))
    payload = ring.batch_sum(ring.batch_lift_many(["x", "y", "u"], [x, y, u]))
    # the batch mean rounded to a multiple of the largest power of two <= its sd
    for j, col in enumerate((x, y)):
        step = 2.0 ** np.floor(np.log2(np.std(col)))
        assert ring.shifts[j] == np.round(col.mean() / step) * step
    h = ring.shifts[:2]
    assert (
        payload.sums[0] == (x - h[0]).sum()
        and payload.products[(0, 1)] == ((x - h[0]) * (y - h[1])).sum()
    )
    # readers in original units (dyadic data: exact)
    assert ring.entry(payload, "x") == x.sum()
    assert ring.entry(payload, "y", "x") == (x * y).sum()
    assert ring.entry(payload, "x", "u") == {1: 24.5, 2: 12.0, 5: 11.25}
    assert ring.entry(payload, "u") == {1: 2.0, 2: 1.0, 5: 1.0}
    cats = [1, 2, 5]
    count, s, Q = ring.to_dense(payload, {"u": cats})
    want = _one_hot_moments(np.column_stack([x, y]), u, cats)
    assert count == want[0]
    np.testing.assert_array_equal(s, want[1])
    np.testing.assert_array_equal(Q, want[2])
    _, s_shifted, Q_shifted = ring.to_dense(payload, {"u": cats}, shifted=True)
    shifted = _one_hot_moments(np.column_stack([x - h[0], y - h[1]]), u, cats)
    np.testing.assert_array_equal(s_shifted, shifted[1])
    np.testing.assert_array_equal(Q_shifted, shifted[2])
    np.testing.assert_array_equal(ring.dense_shifts(5), [h[0], h[1], 0, 0, 0])
    stats = ring.statistics(payload, {"u": cats}, ddof=1)
    M = np.column_stack([x, y, (u[:, None] == np.array(cats)).astype(float)])
    np.testing.assert_allclose(stats.mean, M.mean(axis=0), rtol=1e-15)
    np.testing.assert_allclose(stats.covariance, np.cov(M.T), rtol=1e-13, atol=1e-15)
    assert stats.variables == ("x", "y", ("u", 1), ("u", 2), ("u", 5)) and stats.count == 4
    assert np.isnan(ring.statistics(ring.zero(), {"u": cats}).mean).all()
    # later lifts keep the shift; integer-valued data stay integers
    ints = G(["n"], [])
    ints.batch_lift("n", np.array([3.0, 8.0, 4.0]))
    assert ints.shifts[0] == 4.0
    assert ints.lift("n", 7.0) == GCPayload(1.0, {0: 3.0}, {(0, 0): 9.0})


def test_set_shifts_and_rings_without_shifts():
    ring = G(["x", "y"], ["u"])
    ring.set_shifts({"x": 5.0, "u": 0.0})
    ring.set_shifts({"x": 5.0})  # the same value: nothing to do
    with pytest.raises(RingError, match="already fixed"):
        ring.set_shifts({"x": 6.0})
    with pytest.raises(RingError, match="'u' cannot be shifted"):
        ring.set_shifts({"u": 1.0})
    with pytest.raises(RingError, match="finite"):
        ring.set_shifts({"y": float("nan")})
    with pytest.raises(RingError, match="unknown variable"):
        ring.set_shifts({"z": 1.0})
    assert ring.batch_to_list(ring.batch_lift("x", np.array([7.0])))[0].sums == {0: 2.0}
    plain = G(["x"], ["u"], shift=False)
    np.testing.assert_array_equal(plain.shifts, [0.0, 0.0])
    assert plain.lift("x", 7.0).sums == {0: 7.0}
    with pytest.raises(RingError, match="cannot be shifted"):
        plain.set_shifts({"x": 1.0})
    assert plain != G(["x"], ["u"]) and plain == G(["x"], ["u"], shift=False)
    assert "shift=False" in repr(plain) and "shift" not in repr(G(["x"], ["u"]))


def test_rejected_batch_leaves_the_shift_open():
    from ringml import BatchError, Maintainer, UpdateBatch, covariance_query

    query = covariance_query({"R": ["k", "c", "x"], "S": ["k", "y"]}, ["c", "x", "y"], ["c"])
    m = Maintainer(query)
    with pytest.raises(BatchError, match="'x'"):
        m.apply(UpdateBatch.inserts("R", {"k": [1, 2], "c": [0, 1], "x": [1e9, np.nan]}))
    assert np.isnan(query.ring.shifts[:2]).all()
    m.apply(UpdateBatch.inserts("R", {"k": [1, 2], "c": [0, 1], "x": [1e9, 1e9 + 2]}))
    m.apply(UpdateBatch.inserts("S", {"k": [1, 2], "y": [3.0, 5.0]}))
    np.testing.assert_array_equal(query.ring.shifts, [1e9 + 1, 4.0, 0.0])
    root = m.result()
    assert query.ring.entry(root, "x") == 2e9 + 2 and query.ring.entry(root, "x", "y") == (
        1e9 * 3 + (1e9 + 2) * 5
    )


def test_config_pickle_and_serialization_keep_the_shifts():
    import json
    import pickle
    import struct

    ring = G(["x", "y", "z"], ["u"])
    rng = np.random.default_rng(5)
    x, y = rng.normal(1e6, 1.0, 6), rng.normal(-40.0, 2.0, 6)
    lifted = ring.batch_lift_many(["x", "y", "u"], [x, y, np.arange(6) % 2])
    acc = ring.batch_scatter_add(ring.batch_accumulator(6), np.arange(6), lifted)
    assert np.isnan(ring.shifts[2])  # z was never lifted
    restored = G.from_dict(json.loads(json.dumps(ring.to_dict())))
    assert restored == ring and np.array_equal(restored.shifts, ring.shifts, equal_nan=True)
    ring2, acc2 = pickle.loads(pickle.dumps((ring, acc)))
    assert np.array_equal(ring2.shifts, ring.shifts, equal_nan=True)
    assert ring2.batch_to_list(acc2) == ring.batch_to_list(acc) and acc2.sums_lo is not None
    fresh = G(["x", "y", "z"], ["u"])
    back = fresh.batch_from_bytes(ring.batch_to_bytes(acc))
    assert np.array_equal(fresh.shifts, ring.shifts, equal_nan=True)  # adopted from the data
    np.testing.assert_array_equal(back.prods_lo, acc.prods_lo)
    assert fresh.batch_to_list(back) == ring.batch_to_list(acc)
    assert (
        fresh.from_bytes(ring.to_bytes(ring.batch_to_list(lifted)[2]))
        == ring.batch_to_list(lifted)[2]
    )
    other = G(["x", "y", "z"], ["u"])
    other.batch_lift("x", np.array([5.0]))
    with pytest.raises(RingError, match="shift"):
        other.batch_from_bytes(ring.batch_to_bytes(lifted))
    # version 1 data (before shifts) hold unshifted moments: read with shifts 0
    plain = G(["x", "y", "z"], ["u"], shift=False)
    data = plain.batch_to_bytes(plain.batch_lift_many(["x", "u"], [x, np.arange(6) % 2]))
    (size,) = struct.unpack("<I", data[4:8])
    header = json.loads(data[8 : 8 + size])
    header = {k: v for k, v in header.items() if k not in ("shifts", "compensated")}
    head = json.dumps({**header, "version": 1}).encode()
    old = b"RGCB" + struct.pack("<I", len(head)) + head + data[8 + size :]
    reader = G(["x", "y", "z"], ["u"])
    got = reader.batch_from_bytes(old)
    np.testing.assert_array_equal(reader.shifts[:2], [0.0, 0.0])
    assert reader.batch_to_list(got) == plain.batch_to_list(plain.batch_from_bytes(data))
    # a ring pickled before shifts existed: its payloads are unshifted
    state = {k: v for k, v in plain.__dict__.items() if k not in ("shift", "compensated")}
    state.pop("_shifts")
    before = G.__new__(G)
    before.__setstate__(state)
    assert before == G(["x", "y", "z"], ["u"], shift=False, compensated=False)
    np.testing.assert_array_equal(before.shifts, np.zeros(4))


def test_reshift_combines_payloads_made_with_different_shifts():
    """Shards fix their own shifts; re-centring one ring's payload on another's lets them
    be added, and equals what lifting everything in one ring gives."""
    names, cats = ["x", "y"], ["u"]
    rng = np.random.default_rng(9)
    x = np.round(rng.normal(3e5, 3.0, 400), 3)
    y = np.round(rng.normal(-40.0, 1.0, 400), 3)
    u = rng.integers(0, 3, 400)
    order = np.argsort(x)  # the halves differ in mean, so do the shifts the rings pick
    x, y, u = x[order], y[order], u[order]
    first, second = G(names, cats), G(names, cats)
    a = first.batch_sum(first.batch_lift_many(["x", "y", "u"], [x[:150], y[:150], u[:150]]))
    b = second.batch_sum(second.batch_lift_many(["y", "x", "u"], [y[150:], x[150:], u[150:]]))
    assert not np.array_equal(first.shifts, second.shifts)
    with pytest.raises(RingError, match="shifts"):
        first.check_same_ring(second)
    moved = first.reshift(b, second.shifts)
    total = first.add(a, moved)
    count, s, Q = first.to_dense(total, {"u": [0, 1, 2]})
    want = _one_hot_moments(np.column_stack([x, y]), u, [0, 1, 2])
    assert count == 400
    np.testing.assert_allclose(s, want[1], rtol=1e-13)
    np.testing.assert_allclose(Q, want[2], rtol=1e-13)
    direct = first.batch_sum(first.batch_lift_many(["x", "y", "u"], [x, y, u]))
    assert first.equal(total, direct, rtol=1e-9, atol=1e-6)
    back = second.reshift(direct, dict(zip(names, first.shifts, strict=False)))
    np.testing.assert_allclose(second.to_dense(back, {"u": [0, 1, 2]})[2], want[2], rtol=1e-13)
    # an open shift adopts the payload's (nothing moves); a never-lifted variable stays zero
    third = G(names, cats)
    only_x = third.batch_sum(third.batch_lift("x", x[150:160]))
    assert third.shifts[0] != first.shifts[0] and np.isnan(third.shifts[1])
    fresh = G(names, cats)
    assert fresh.reshift(only_x, third.shifts) == only_x
    assert fresh.shifts[0] == third.shifts[0] and np.isnan(fresh.shifts[1])
    moved_x = first.reshift(only_x, third.shifts)
    assert first.entry(moved_x, "x") == pytest.approx(x[150:160].sum(), rel=1e-15)
    assert 1 not in moved_x.sums and (1, 1) not in moved_x.products  # y was never lifted
    fresh.check_same_ring(fresh)
    twin = G.from_dict(first.to_dict())
    twin.check_same_ring(first)
    with pytest.raises(RingError, match="3 shifts"):
        first.reshift(moved, [0.0])


def test_accumulators_keep_their_compensation_through_resize_take_and_clear():
    ring = G(["x"], ["u"], shift=False)
    acc = ring.batch_accumulator(2)
    assert acc.sums_lo is not None and acc.prods_lo is not None
    big = ring.batch_lift_many(["x", "u"], [np.array([2.0**53, 1.0]), np.array([1, 2])])
    acc = ring.batch_scatter_add(acc, np.array([0, 1]), big)
    ones = ring.batch_lift_many(["x", "u"], [np.array([1.0]), np.array([1])])
    for _ in range(3):
        acc = ring.batch_scatter_add(acc, np.array([0]), ones)
    want = 2.0**53 + 3
    assert ring.batch_take(acc, [0]).sums[0, 0] == want
    grown = ring.batch_resize(acc, 5)
    assert grown.sums_lo is not None and grown.sums_lo is not acc.sums_lo
    assert ring.batch_take(grown, [0]).sums[0, 0] == want
    assert list(ring.batch_is_zero(grown)) == [False, False, True, True, True]
    cut = ring.batch_resize(grown, 1)
    assert cut.sums[0, 0] == want and cut.sums_lo[0, 0] == 0.0
    assert ring.batch_to_list(cut)[0].sums[0] == want
    ring.batch_clear(grown, np.array([0]))
    assert grown.sums_lo[0, 0] == 0.0 and ring.batch_is_zero(grown)[0]
    assert G(["x"], ["u"], compensated=False).batch_accumulator(2).sums_lo is None


# ------------------------------------------------------------------- recode (codes moved
# into another code space, e.g. a shard's dictionary into the distributed driver's)
CODED_RINGS = [G(["x", "y"], ["u", "v", "w"]), G([], ["u", "v"]), G(["x"], ["u"])]


@st.composite
def coded_payloads(draw, ring: G):
    """Sums of integer multiples of products of lifts; category codes 0..4."""
    lifts = st.tuples(st.sampled_from(ring.variables), st.integers(0, 4))
    terms = draw(st.lists(st.tuples(st.integers(-2, 2), st.lists(lifts, max_size=3)), max_size=3))
    acc = ring.zero()
    for k, factors in terms:
        term = ring.one()
        for var, x in factors:
            term = ring.mul(term, ring.lift(var, x if ring.is_categorical(var) else float(x)))
        acc = ring.add(acc, ring.scale(term, k))
    return acc


@st.composite
def code_spaces(draw, ring: G):
    """Old values of codes 0..4 per categorical variable, an injective map into 0..20 and
    the values of the new codes (new_values[map[c]] == old_values[c])."""
    maps, old, new = {}, {}, {}
    for v in ring.categorical:
        target = draw(st.lists(st.integers(0, 20), min_size=5, max_size=5, unique=True))
        maps[v] = np.asarray(target)
        old[v] = [f"{v}-{c}" for c in range(5)]
        new[v] = [None] * 21
        for c, t in enumerate(target):
            new[v][t] = old[v][c]
    return maps, old, new


def decoded(ring: G, a: GCPayload, values) -> tuple:
    """A payload with every category code replaced by its value (plain dict traversal)."""

    def value(i: int, code: int):
        return values[ring.variables[i]][code]

    def rel(i: int, j: int | None, entry):
        if not isinstance(entry, dict):
            return entry
        if j is None or i == j:
            return {value(i, k): x for k, x in entry.items()}
        if not ring.is_categorical(i):
            return {value(j, k): x for k, x in entry.items()}
        return {(value(i, k[0]), value(j, k[1])): x for k, x in entry.items()}

    sums = {i: rel(i, None, e) for i, e in a.sums.items()}
    products = {ij: rel(*ij, e) for ij, e in a.products.items()}
    return a.count, sums, products


@SETTINGS
@given(st.data())
def test_recode_then_decode_equals_decode(data):
    ring = data.draw(st.sampled_from(CODED_RINGS))
    xs = [data.draw(coded_payloads(ring)) for _ in range(data.draw(st.integers(1, 4)))]
    maps, old, new = data.draw(code_spaces(ring))
    for a in xs:  # scalar face
        moved = ring.recode(a, maps)
        assert decoded(ring, moved, new) == decoded(ring, a, old)
        used = ring.used_codes(moved)
        for v in ring.categorical:  # the codes used are exactly the mapped ones
            assert set(used[v].tolist()) == {int(maps[v][c]) for c in ring.used_codes(a)[v]}
    batch = ring.recode(ring.batch_from(xs), maps)  # batched face, one call for all rows
    assert isinstance(batch, GCBatch)
    got = [decoded(ring, a, new) for a in ring.batch_to_list(batch)]
    assert got == [decoded(ring, a, old) for a in xs]
    # the identity map (and no map) changes nothing
    identity = {v: np.arange(5) for v in ring.categorical}
    for a in xs:
        assert ring.equal(ring.recode(a, identity), a) and ring.recode(a, {}) is a
    same = ring.batch_to_list(ring.recode(ring.batch_from(xs), identity))
    assert all(ring.equal(p, a) for p, a in zip(same, xs, strict=True))


def test_used_codes_and_recode_of_an_accumulator():
    ring = G(["x"], ["u", "v"])
    acc = ring.batch_accumulator(3)
    for slots, xs, us, vs in [([0, 2], [1.0, 2.0], [3, 0], [1, 1]), ([0], [5.0], [4], [0])]:
        lifted = ring.batch_lift_many(["x", "u", "v"], [np.array(xs), np.array(us), np.array(vs)])
        acc = ring.batch_scatter_add(acc, np.array(slots), lifted)
    used = ring.used_codes(acc)
    assert used["u"].tolist() == [0, 3, 4] and used["v"].tolist() == [0, 1]
    maps = {"u": np.array([7, -1, -1, 2, 0]), "v": np.array([1, 0])}
    moved = ring.recode(acc, maps)
    want = [ring.recode(a, maps) for a in ring.batch_to_list(acc)]
    assert all(ring.equal(p, q) for p, q in zip(ring.batch_to_list(moved), want, strict=True))
    assert ring.entry(want[0], "x", "u") == pytest.approx({2: 1.0, 0: 5.0})
    assert ring.entry(want[0], "u", "v") == {(2, 0): 1.0, (0, 1): 1.0}
    # a code the map does not cover, or a variable the ring does not key: RingError
    with pytest.raises(RingError, match=r"code 3 of 'u' has no new code"):
        ring.recode(acc, {"u": np.array([7, 8, 9])})
    with pytest.raises(RingError, match=r"code 0 of 'u' has no new code"):
        ring.recode(acc, {"u": np.array([-1, 8, 9, 1, 2])})
    with pytest.raises(RingError, match=r"'x' is not a keyed variable"):
        ring.recode(acc, {"x": np.arange(3)})
    with pytest.raises(RingError, match="1-d integer array"):
        ring.recode(acc, {"u": np.array([0.5, 1.0])})
    assert ring.batch_to_list(acc) == ring.batch_to_list(ring.batch_take(acc, [0, 1, 2]))


@pytest.mark.parametrize("code", [7, 2**62])  # a packed key, and one too wide to pack
def test_batch_without_residue_drops_entries_of_uncounted_categories(code):
    ring = G(["x"], ["c", "d"], shift=False)
    counted = {1: 2.0}, {code: 2.0}
    residue = GCPayload(
        2.0,
        {0: 3.0, 1: counted[0], 2: counted[1]},
        {
            (0, 0): 5.0,
            (0, 1): {0: 1e-13, 1: 3.0},  # c = 0 has no count: residue
            (0, 2): {code: 3.0, 5: -1e-14},
            (1, 1): counted[0],
            (2, 2): counted[1],
            (1, 2): {(1, code): 2.0, (0, code): 1e-15},
        },
    )
    clean = GCPayload(
        2.0,
        residue.sums,
        {
            **residue.products,
            (0, 1): {1: 3.0},
            (0, 2): {code: 3.0},
            (1, 2): {(1, code): 2.0},
        },
    )
    out = ring.batch_without_residue(ring.batch_from([clean, residue]))
    assert ring.batch_to_list(out) == [clean, clean]
    assert ring.batch_without_residue(out) is out  # nothing to drop: the batch itself
