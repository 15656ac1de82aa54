"""Tests of the continuous covariance ring (rings/covariance.py)."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest
from exact_moments import MEANS, Exact, assert_close, relative_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ring_laws import check_axioms, check_batched_agrees
from ringml.rings.base import RingError
from ringml.rings.covariance import (
    CovarianceBatch,
    CovariancePayload,
    CovarianceRing,
    choose_shift,
)

VARS = list("ABCDE")
M = len(VARS)
RING = CovarianceRing(VARS, shift=False)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def payload_over(draw, block: tuple[int, ...]) -> CovariancePayload:
    """Integer-valued entries keep every product and sum exact, so tolerances are 0."""
    k = len(block)
    small = st.integers(-4, 4)
    sums = draw(st.lists(small, min_size=k, max_size=k))
    upper = draw(st.lists(small, min_size=k * (k + 1) // 2, max_size=k * (k + 1) // 2))
    products = np.zeros((k, k))
    i, j = np.triu_indices(k)
    products[i, j] = upper
    products[j, i] = upper
    return CovariancePayload(block, draw(st.integers(-3, 3)), np.asarray(sums, float), products)


@st.composite
def payloads(draw, within: tuple[int, ...] = tuple(range(M))) -> CovariancePayload:
    order = draw(st.permutations(within))
    k = draw(st.integers(0, len(order)))
    return payload_over(draw, tuple(order[:k]))


@st.composite
def disjoint_payloads(draw, parts: int = 3) -> list[CovariancePayload]:
    order = draw(st.permutations(range(M)))
    cuts = sorted(draw(st.lists(st.integers(0, M), min_size=parts - 1, max_size=parts - 1)))
    bounds = [0, *cuts, M]
    return [payload_over(draw, tuple(order[bounds[p] : bounds[p + 1]])) for p in range(parts)]


# ------------------------------------------------------------------------ ring laws


@SETTINGS
@given(payloads(), payloads(), payloads())
def test_axioms_random_blocks(a, b, c):
    check_axioms(RING, a, b, c)


@SETTINGS
@given(disjoint_payloads())
def test_axioms_disjoint_blocks(abc):
    check_axioms(RING, *abc)


@SETTINGS
@given(st.integers(0, 6).flatmap(lambda n: st.tuples(*[payloads()] * (2 * n))))
def test_batched_agrees_random_blocks(items):
    n = len(items) // 2
    check_batched_agrees(RING, list(items[:n]), list(items[n:]))


@st.composite
def aligned_disjoint_lists(draw) -> tuple[list, list]:
    """Two lists of payloads: every x over one block, every y over a disjoint one."""
    order = draw(st.permutations(range(M)))
    cut = draw(st.integers(0, M))
    n = draw(st.integers(0, 6))
    xs = [payload_over(draw, tuple(order[:cut])) for _ in range(n)]
    ys = [payload_over(draw, tuple(order[cut:])) for _ in range(n)]
    return xs, ys


@SETTINGS
@given(aligned_disjoint_lists())
def test_batched_agrees_disjoint_blocks(xs_ys):
    # batch_mul takes the disjoint fast path here
    check_batched_agrees(RING, *xs_ys)


@SETTINGS
@given(payloads(), payloads())
def test_equal_ignores_block_order_and_zero_padding(a, b):
    perm = np.random.default_rng(len(a.block)).permutation(len(a.block))
    permuted = CovariancePayload(
        tuple(a.block[p] for p in perm), a.count, a.sums[perm], a.products[np.ix_(perm, perm)]
    )
    assert RING.equal(a, permuted) and a == permuted and hash(a) == hash(permuted)
    padded = RING.add(a, RING.zero())
    widened = RING.add(a, RING.sub(b, b))  # zero entries over b's variables
    assert RING.equal(a, widened) and a == padded == widened
    assert hash(a) == hash(widened)


@pytest.mark.parametrize("ka,kb", [(9, 1), (12, 3), (4, 11), (1, 1), (6, 0), (0, 5)])
def test_disjoint_product_both_assembly_strategies(ka, kb):
    """Wide-times-narrow blocks use a gather, the others row-wise writes; both agree."""
    rng = np.random.default_rng(ka * 31 + kb)
    names = [f"v{i}" for i in range(ka + kb)]
    ring = CovarianceRing(names)
    perm = rng.permutation(ka + kb)
    a = ring.batch_lift_block([names[p] for p in perm[:ka]], rng.normal(3, 2, (7, ka)))
    b = ring.batch_lift_block([names[p] for p in perm[ka:]], rng.normal(-1, 5, (7, kb)))
    a = ring.batch_scale(a, rng.integers(-3, 4, 7))
    b = ring.batch_scale(b, rng.integers(-3, 4, 7))
    got = ring.batch_to_list(ring.batch_mul(a, b))
    for g, x, y in zip(got, ring.batch_to_list(a), ring.batch_to_list(b), strict=True):
        assert ring.equal(g, ring.mul(x, y))


# ----------------------------------------------------------------- Example 18 (W10)

R_ROWS = np.array([(1, 1), (1, 2), (2, 3), (3, 4)])  # R(A, B)
S_ROWS = np.array([(1, 1, 1), (1, 1, 2), (1, 2, 3), (2, 2, 4)])  # S(A, C, E)
T_ROWS = np.array([(1, 1), (2, 2), (2, 3), (3, 4)])  # T(C, D)

W10_Q = [
    [16, 24, 20, 24, 34],
    [24, 38, 30, 36, 51],
    [20, 30, 28, 34, 46],
    [24, 36, 34, 43, 56],
    [34, 51, 46, 56, 78],
]
W10_Q_AFTER = [
    [30, 45, 40, 44, 70],
    [45, 70, 60, 66, 105],
    [40, 60, 60, 66, 100],
    [44, 66, 66, 75, 110],
    [70, 105, 100, 110, 170],
]


def lookup(keys: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``wanted`` in the sorted ``keys`` and which of them are present."""
    pos = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    return pos, keys[pos] == wanted


def view_tree(ring: CovarianceRing, t_rows: np.ndarray, t_mult: np.ndarray, fused: bool):
    """Fig. 3 view tree A{ B{R}, C{ D{T}, E{S} } } built from ring operations only."""
    # V@D_T[C] = sum_D T[C,D] * g_D(d)
    lifted_d = ring.batch_scale(ring.batch_lift("D", t_rows[:, 1]), t_mult)
    c_keys, c_of = np.unique(t_rows[:, 0], return_inverse=True)
    v_t = ring.batch_sum_by(lifted_d, c_of, len(c_keys))
    # V@E_S[A,C] = sum_E S[A,C,E] * g_E(e)
    ac_keys, ac_of = np.unique(S_ROWS[:, :2], axis=0, return_inverse=True)
    v_s = ring.batch_sum_by(ring.batch_lift("E", S_ROWS[:, 2]), ac_of.ravel(), len(ac_keys))
    # V@C_ST[A] = sum_C V@D_T[C] * V@E_S[A,C] * g_C(c)
    at_t, present = lookup(c_keys, ac_keys[:, 1])
    rows = np.flatnonzero(present)
    a_keys, a_of = np.unique(ac_keys[rows, 0], return_inverse=True)
    factors = [
        ring.batch_take(v_t, at_t[rows]),
        ring.batch_take(v_s, rows),
        ring.batch_lift("C", ac_keys[rows, 1]),
    ]
    v_st = ring.batch_mul_sum(factors, a_of, len(a_keys))
    # V@B_R[A] = sum_B R[A,B] * g_B(b)
    r_keys, r_of = np.unique(R_ROWS[:, 0], return_inverse=True)
    v_r = ring.batch_sum_by(ring.batch_lift("B", R_ROWS[:, 1]), r_of, len(r_keys))
    # root = sum_A V@B_R[A] * V@C_ST[A] * g_A(a)
    common = np.intersect1d(r_keys, a_keys)
    factors = [
        ring.batch_take(v_r, lookup(r_keys, common)[0]),
        ring.batch_take(v_st, lookup(a_keys, common)[0]),
        ring.batch_lift("A", common),
    ]
    if fused:
        root = ring.batch_mul_sum(factors)  # groups=None: the contraction, no products
    else:
        root = ring.batch_sum(reduce(ring.batch_mul, factors))
        return ring, v_t, c_keys, v_st, a_keys, root
    return ring, v_t, c_keys, v_st, a_keys, ring.batch_to_list(root)[0]


def flat_join(t_rows, t_mult):
    """(count, Σx, Σxxᵀ) over the flat join tuples (A,B,C,D,E) with T's multiplicities."""
    tuples, weights = [], []
    for a, b in R_ROWS:
        for a2, c, e in S_ROWS:
            for (c2, d), w in zip(t_rows, t_mult, strict=True):
                if a == a2 and c == c2:
                    tuples.append((a, b, c, d, e))
                    weights.append(w)
    x = np.asarray(tuples, dtype=float)
    w = np.asarray(weights, dtype=float)
    return int(w.sum()), w @ x, (x * w[:, None]).T @ x


def assert_moments(ring, payload, count, sums, products, rtol=0.0):
    got_c, got_s, got_q = ring.moments(payload)
    assert got_c == count
    np.testing.assert_allclose(got_s, sums, rtol=rtol, atol=0)
    np.testing.assert_allclose(got_q, products, rtol=rtol, atol=0)


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("fused", [True, False])
def test_example_18_view_tree(shift, fused):
    ones = np.ones(len(T_ROWS), dtype=np.int64)
    ring = CovarianceRing(VARS, shift=shift)
    rtol = 1e-12 if shift else 0.0
    _, v_t, c_keys, v_st, a_keys, root = view_tree(ring, T_ROWS, ones, fused)
    count, sums, products = flat_join(T_ROWS, ones)
    assert count == 10
    np.testing.assert_array_equal(sums, [12, 18, 16, 19, 26])
    np.testing.assert_array_equal(products, W10_Q)
    assert_moments(ring, root, 10, [12, 18, 16, 19, 26], W10_Q, rtol)
    assert_moments(ring, root, count, sums, products, rtol)
    # intermediate payloads of W10
    d = VARS.index("D")
    t_list = ring.batch_to_list(v_t)
    for key, (c, s_d, q_dd) in {1: (1, 1, 1), 2: (2, 5, 13), 3: (1, 4, 16)}.items():
        got_c, got_s, got_q = ring.moments(t_list[list(c_keys).index(key)])
        assert got_c == c
        np.testing.assert_allclose([got_s[d], got_q[d, d]], [s_d, q_dd], rtol=rtol)
    expected_q = np.zeros((M, M))
    expected_q[2:, 2:] = [[8, 10, 16], [10, 13, 20], [16, 20, 32]]
    v_st2 = ring.batch_to_list(v_st)[list(a_keys).index(2)]
    assert_moments(ring, v_st2, 2, [0, 0, 4, 5, 8], expected_q, rtol)
    if not shift:  # exact integer arithmetic: the payload itself equals the listed one
        expected = CovariancePayload(tuple(range(M)), 10, [12, 18, 16, 19, 26], W10_Q)
        assert ring.equal(root, expected)


@pytest.mark.parametrize("shift", [False, True])
def test_example_18_after_delta_t(shift):
    """Ex. 7's δT = {(1,1) → −1·1^C, (2,2) → 3·1^C} propagated up the tree."""
    ring = CovarianceRing(VARS, shift=shift)
    rtol = 1e-12 if shift else 0.0
    root = view_tree(ring, T_ROWS, np.ones(4, np.int64), True)[-1]
    delta_rows, delta_mult = np.array([(1, 1), (2, 2)]), np.array([-1, 3])
    delta_root = view_tree(ring, delta_rows, delta_mult, True)[-1]  # root is linear in T
    new_root = ring.add(root, delta_root)
    after = [20, 30, 30, 33, 50]
    assert_moments(ring, new_root, 15, after, W10_Q_AFTER, rtol)
    # recomputation over T' = {(2,2)→4, (2,3)→1, (3,4)→1}
    t_new, mult_new = np.array([(2, 2), (2, 3), (3, 4)]), np.array([4, 1, 1])
    count, sums, products = flat_join(t_new, mult_new)
    assert (count, list(sums)) == (15, after)
    np.testing.assert_array_equal(products, W10_Q_AFTER)
    recomputed = view_tree(ring, t_new, mult_new, True)[-1]
    assert ring.equal(recomputed, new_root, rtol=rtol, atol=1e-9 if shift else 0.0)


# ------------------------------------------------------------------------ numerics


@pytest.mark.parametrize("mean", MEANS)
def test_shift_and_compensation_keep_moments_exact_under_deletes(mean):
    """Features with mean 1e9 or 1e12 and sd 1, 45% of the inserts deleted again: means,
    variances and the covariance within 1e-9 relative of exact fractions; the textbook
    unshifted payload is off by far more."""
    rng = np.random.default_rng(20240607)
    n, batch = 400_000, 10_000
    z = rng.normal(0.0, 1.0, n)
    x = mean + z
    y = mean + (rng.normal(0.0, 1.0, n) - 0.5 * z)
    deleted = rng.permutation(n)[: int(0.45 * n)]
    ring = CovarianceRing(["x", "y"])
    acc = ring.batch_accumulator(1)
    slot = np.zeros(1, dtype=np.intp)
    plain_c, plain_s, plain_q = 0, 0.0, 0.0  # the unshifted float64 textbook payload of x
    for sign, rows in ((1, np.arange(n)), (-1, deleted)):
        for start in range(0, len(rows), batch):
            at = rows[start : start + batch]
            lifted = ring.batch_lift_block(["x", "y"], np.column_stack([x[at], y[at]]))
            if sign < 0:
                lifted = ring.batch_neg(lifted)
            summed = ring.batch_sum_by(lifted, np.zeros(len(at), np.intp), 1)
            acc = ring.batch_scatter_add(acc, slot, summed)
            plain_c += sign * len(at)
            plain_s += sign * x[at].sum()
            plain_q += sign * (x[at] * x[at]).sum()
    assert ring.shifts[0] == choose_shift(x[:batch])
    keep = np.ones(n, dtype=bool)
    keep[deleted] = False
    exact = Exact({"x": x[keep], "y": y[keep]}, {})
    stats = ring.statistics(ring.batch_take(acc, slot))
    assert stats.count == exact.count
    for p, v in enumerate("xy"):
        assert_close(stats.mean[p], exact.mean(v), f"mean {v}", rtol=1e-15)
        assert_close(stats.covariance[p, p], exact.cov(v, v), f"variance {v}")
    assert_close(stats.covariance[0, 1], exact.cov("x", "y"), "covariance x y")
    plain_var = plain_q / plain_c - (plain_s / plain_c) ** 2
    assert relative_error(plain_var, exact.cov("x", "x")) > 1e-3  # the numerics matter


def test_the_shift_is_the_rounded_mean_and_keeps_integers_exact():
    x = np.array([1e12 + 0.3, 1e12 - 0.9, 1e12 + 2.2])
    h = choose_shift(x)
    assert abs(h - x.mean()) <= x.std() / 2 and h == float(int(h))
    ints = np.array([10**12 + 3, 10**12 - 7, 10**12 + 11], dtype=np.float64)
    assert choose_shift(ints) % 1 == 0  # integer data stay integers once shifted
    assert choose_shift(np.array([5.5])) == 5.5  # one value: exactly it
    assert choose_shift(np.array([1e308, 1e308])) == 1e308


def test_compensated_accumulator_keeps_small_increments():
    ring = CovarianceRing(["x"], shift=False)
    plain = CovarianceRing(["x"], shift=False, compensated=False)
    results = []
    for r in (ring, plain):
        acc = r.batch_accumulator(2)
        slots = np.array([1])
        for value in [1e16] + [1.0] * 10 + [-1e16]:
            acc = r.batch_scatter_add(acc, slots, r.batch_lift("x", np.array([value])))
        results.append(r.moments(r.batch_take(acc, slots))[1][0])
    assert results[0] == 10.0
    assert results[1] != 10.0


def test_moments_statistics_sigma_in_original_units():
    rng = np.random.default_rng(1)
    x = rng.normal([5e6, -3.0, 200.0], [2.0, 1.0, 10.0], (500, 3))
    ring = CovarianceRing(["u", "v", "w", "unused"])
    assert np.isnan(ring.shifts).all()
    lifted = ring.batch_lift_block(["w", "u", "v"], x[:, [2, 0, 1]])
    payload = ring.batch_sum(lifted)
    assert ring.shifts[0] == choose_shift(x[:, 0])
    assert np.isnan(ring.shifts[3])
    count, sums, products = ring.moments(payload)
    assert count == 500
    np.testing.assert_allclose(sums[:3], x.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(products[:3, :3], x.T @ x, rtol=1e-12)
    assert sums[3] == 0 and not products[3].any() and not products[:, 3].any()
    stats = ring.statistics(payload)
    np.testing.assert_allclose(stats.mean[:3], x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.covariance[:3, :3], np.cov(x.T, bias=True), rtol=1e-9)
    np.testing.assert_allclose(
        ring.statistics(payload, ddof=1).covariance[:3, :3], np.cov(x.T), rtol=1e-9
    )
    sigma = ring.sigma(payload, ["v", "u"])
    shifted = x[:, [1, 0]] - ring.shifts[[1, 0]]
    design = np.column_stack([np.ones(500), shifted])
    np.testing.assert_allclose(sigma, design.T @ design, rtol=1e-9, atol=1e-6)
    assert ring.sigma(payload).shape == (5, 5)
    empty = ring.statistics(ring.zero())
    assert empty.count == 0 and np.isnan(empty.mean).all()


# ------------------------------------------------------------------ batched extras


def test_lift_block_equals_product_of_lifts():
    rng = np.random.default_rng(2)
    cols = rng.normal(100.0, 7.0, (50, 4))
    names = ["p", "q", "r", "s"]
    block_ring, single_ring = CovarianceRing(names), CovarianceRing(names)
    order = ["r", "p", "s", "q"]
    picked = cols[:, [names.index(v) for v in order]]
    block = block_ring.batch_lift_block(order, picked)
    lifts = [single_ring.batch_lift(v, picked[:, p]) for p, v in enumerate(order)]
    product = reduce(single_ring.batch_mul, lifts)
    assert block.block == product.block == (2, 0, 3, 1)
    np.testing.assert_array_equal(block.count, product.count)
    np.testing.assert_array_equal(block.sums, product.sums)
    np.testing.assert_array_equal(block.products, product.products)
    np.testing.assert_array_equal(block_ring.shifts, single_ring.shifts)


@pytest.mark.parametrize("n_factors", [2, 3, 4, 5, 6])
def test_fused_mul_sum_equals_materialized(n_factors):
    rng = np.random.default_rng(n_factors)
    sizes = [10, 5, 2, 2, 4, 3][:n_factors]
    names = [f"x{i}" for i in range(sum(sizes))]
    ring = CovarianceRing(names)
    perm = list(rng.permutation(len(names)))
    factors, at = [], 0
    for k in sizes:
        lifted = ring.batch_lift_block(
            [names[p] for p in perm[at : at + k]], rng.normal(50, 3, (300, k))
        )
        factors.append(ring.batch_scale(lifted, rng.integers(-2, 4, 300)))
        at += k
    factors.append(ring.batch_ones(300))  # an empty block joins in as a count
    fused = ring.batch_mul_sum(factors)
    materialized = ring.batch_sum(reduce(ring.batch_mul, factors))
    assert fused.block == materialized.block
    assert ring.equal(ring.batch_to_list(fused)[0], materialized, rtol=1e-10, atol=1e-6)
    # integer-valued entries: exactly equal
    ints = [
        CovarianceBatch(f.block, f.count, np.round(f.sums), np.round(f.products)) for f in factors
    ]
    exact = ring.batch_to_list(ring.batch_mul_sum(ints))[0]
    assert ring.equal(exact, ring.batch_sum(reduce(ring.batch_mul, ints)))
    # grouped sums go through the materialized path
    groups = rng.integers(0, 7, 300)
    grouped = ring.batch_to_list(ring.batch_mul_sum(ints, groups, 7))
    by_hand = ring.batch_to_list(ring.batch_sum_by(reduce(ring.batch_mul, ints), groups, 7))
    for g, h in zip(grouped, by_hand, strict=True):
        assert ring.equal(g, h)


@pytest.mark.parametrize("seed", range(6))
def test_fused_mul_sum_with_zero_negative_counts_and_empty_blocks(seed):
    """Exact for integer entries whatever the counts (0 and < 0 included), the empty block
    anywhere in the factor list, and no rows at all."""
    rng = np.random.default_rng(seed)
    sizes = [int(k) for k in rng.integers(0, 4, rng.integers(1, 7))]
    names = [f"x{i}" for i in range(sum(sizes) + 1)]
    ring = CovarianceRing(names, shift=False)
    perm = list(rng.permutation(len(names)))
    for n in (0, 1, 37):
        factors, at = [], 0
        for k in sizes:
            block = tuple(int(v) for v in perm[at : at + k])
            at += k
            count = rng.integers(-2, 3, n)
            sums = rng.integers(-5, 6, (n, k)).astype(float)
            products = rng.integers(-5, 6, (n, k * (k + 1) // 2)).astype(float)
            factors.append(CovarianceBatch(block, count, sums, products, ring_id=ring._id))
        fused = ring.batch_to_list(ring.batch_mul_sum(factors))[0]
        expected = ring.batch_sum(reduce(ring.batch_mul, factors))
        assert fused.block == tuple(v for f in factors for v in f.block)
        assert fused.count == expected.count
        assert ring.equal(fused, expected)


@pytest.mark.parametrize("sorted_groups", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_lift_block_sum_by_equals_lift_scale_sum(sorted_groups, weighted):
    rng = np.random.default_rng(7)
    names = ["p", "q", "r", "s"]
    order = ["s", "p", "r"]
    n = 200
    columns = [rng.normal(100.0, 7.0, n), rng.integers(0, 9, n), rng.normal(-3.0, 1.0, n)]
    groups = rng.integers(0, 30, n)
    if sorted_groups:
        groups = np.sort(groups)
    weights = rng.integers(-2, 4, n) if weighted else None
    fused_ring, plain_ring = CovarianceRing(names), CovarianceRing(names)
    fused = fused_ring.batch_lift_block_sum_by(order, columns, groups, 31, weights)
    lifted = plain_ring.batch_lift_block(order, np.column_stack(columns))
    if weighted:
        lifted = plain_ring.batch_scale(lifted, weights)
    plain = plain_ring.batch_sum_by(lifted, groups, 31)
    assert fused.block == plain.block == (3, 0, 2)
    np.testing.assert_array_equal(fused_ring.shifts, plain_ring.shifts)
    np.testing.assert_array_equal(fused.count, plain.count)
    np.testing.assert_array_equal(fused.sums, plain.sums)  # same operations, same order
    np.testing.assert_array_equal(fused.products, plain.products)
    # one group per row in order, and everything in one group
    ring = CovarianceRing(names, shift=False)
    x = [np.arange(5.0), np.arange(5.0) ** 2]
    each = ring.batch_lift_block_sum_by(["p", "q"], x, np.arange(5), 5)
    np.testing.assert_array_equal(each.sums, np.column_stack(x))
    np.testing.assert_array_equal(each.count, np.ones(5))
    total = ring.batch_to_list(ring.batch_lift_block_sum_by(["p", "q"], x, None))[0]
    assert total.count == 5 and list(total.sums) == [10.0, 30.0]
    assert total.products[0, 1] == float(np.sum(x[0] * x[1]))
    empty = ring.batch_lift_block_sum_by(["p"], [np.zeros(0)], np.zeros(0, np.int64), 2)
    assert ring.batch_is_zero(empty).all() and ring.batch_len(empty) == 2


def test_lift_block_sum_by_names_bad_values():
    ring = CovarianceRing(["a", "b"])
    groups = np.zeros(2, dtype=np.int64)
    with pytest.raises(RingError, match=r"cannot lift nan into continuous variable 'b'"):
        ring.batch_lift_block_sum_by(["a", "b"], [np.ones(2), np.array([1.0, np.nan])], groups)
    with pytest.raises(RingError, match=r"cannot lift 'x'"):
        ring.batch_lift_block_sum_by(["a"], [np.array(["x", "y"], dtype=object)], groups)
    with pytest.raises(RingError, match="lifted twice"):
        ring.batch_lift_block_sum_by(["a", "a"], [np.ones(2), np.ones(2)], groups)
    with pytest.raises(RingError, match="group ids"):
        ring.batch_lift_block_sum_by(["a"], [np.ones(2)], np.array([0, 3]), 2)
    assert np.isnan(ring.shifts).all()  # nothing was fixed by the rejected lifts


def test_scatter_add_consecutive_and_scattered_slots_agree():
    ring = CovarianceRing(["x", "y"], shift=False)
    rng = np.random.default_rng(3)
    values = ring.batch_lift_block(["x", "y"], rng.normal(0, 1e8, (6, 2)))
    by_view = ring.batch_scatter_add(
        ring.batch_accumulator(10, block=(0, 1)), np.arange(2, 8), values
    )
    order = rng.permutation(6)
    by_index = ring.batch_scatter_add(
        ring.batch_accumulator(10, block=(0, 1)),
        np.arange(2, 8)[order],
        ring.batch_take(values, order),
    )
    for a, b in [(by_view.sums, by_index.sums), (by_view.products_lo, by_index.products_lo)]:
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(by_view.count, by_index.count)


def test_sum_by_unsorted_groups_and_empty_groups():
    ring = CovarianceRing(["x"], shift=False)
    lifted = ring.batch_lift("x", np.array([1.0, 2.0, 3.0, 4.0]))
    out = ring.batch_to_list(ring.batch_sum_by(lifted, np.array([3, 0, 3, 0]), 5))
    assert [p.count for p in out] == [2, 0, 0, 2, 0]
    assert out[0].sums[0] == 6 and out[3].sums[0] == 4 and out[3].products[0, 0] == 10
    assert ring.is_zero(out[1]) and ring.is_zero(out[4])
    with pytest.raises(RingError, match="group ids"):
        ring.batch_sum_by(lifted, np.array([0, 1, 2, 5]), 5)


def test_accumulator_resize_clear_and_widening():
    ring = CovarianceRing(["x", "y"])
    acc = ring.batch_accumulator(2)
    assert acc.has_lo and acc.block == ()
    values = ring.batch_lift_block(["y", "x"], np.array([[1.0, 2.0], [3.0, 5.0]]))
    acc = ring.batch_scatter_add(acc, np.array([1, 0]), values)  # widened to (y, x)
    assert acc.block == (1, 0) and acc.has_lo
    grown = ring.batch_resize(acc, 5)
    assert ring.batch_len(grown) == 5 and grown.has_lo
    assert list(ring.batch_is_zero(grown)) == [False, False, True, True, True]
    same = ring.batch_scatter_add(grown, np.array([4]), ring.batch_lift("x", np.array([7.0])))
    assert same is grown  # in place: x is already in the block
    taken = ring.batch_take(grown, np.array([0, 1]))
    assert not taken.has_lo
    assert ring.equal(ring.batch_to_list(taken)[0], ring.batch_to_list(values)[1])
    ring.batch_clear(grown, np.array([0, 1, 4]))
    assert ring.batch_is_zero(grown).all()
    shrunk = ring.batch_resize(grown, 1)
    assert ring.batch_len(shrunk) == 1 and shrunk.has_lo
    assert not CovarianceRing(["x"], compensated=False).batch_accumulator(3).has_lo


def test_packed_accumulator_agrees_with_separate_arrays():
    """A plain accumulator keeps sums and products side by side in one array of floats; every
    operation on it, a pickle round trip included, gives what the same operations give on
    a batch of separate arrays, bit for bit."""
    import pickle

    ring = CovarianceRing(["x", "y", "z"], compensated=False)
    rng = np.random.default_rng(7)
    packed = ring.batch_accumulator(4)
    assert packed.floats is not None and not packed.has_lo
    separate = ring.batch_zeros(4)
    assert separate.floats is None

    def both(step):
        nonlocal packed, separate
        packed, separate = step(packed), step(separate)
        assert packed.block == separate.block
        for a, b in [(packed.count, separate.count), (packed.sums, separate.sums)]:
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(packed.products, separate.products)
        assert packed.count.dtype == np.int64

    lifted = ring.batch_lift_block(["y", "x"], rng.normal(0, 1e3, (3, 2)))
    both(lambda b: ring.batch_scatter_add(b, np.array([2, 0, 3]), lifted))  # widened
    assert packed.floats is not None and packed.sums.base is not None
    big = ring.batch_scale(ring.batch_lift("z", rng.normal(0, 1, 2)), np.array([2**40, -3]))
    both(lambda b: ring.batch_scatter_add(b, np.array([1, 2]), big))  # widened again
    both(lambda b: ring.batch_scatter_add(b, np.array([1, 2]), big))  # in place, 2**41 counts
    assert int(packed.count[1]) == 2**41
    both(lambda b: ring.batch_resize(b, 9))
    both(lambda b: ring.batch_scatter_add(b, np.arange(5, 8), lifted))  # consecutive slots
    both(lambda b: ring.batch_take(b, np.array([7, 1, 2, 2])))
    assert packed.floats is not None  # rows taken from a packed batch stay packed
    both(lambda b: ring.batch_clear(b, np.array([0])))
    both(lambda b: pickle.loads(pickle.dumps(b)))
    both(lambda b: ring.batch_scatter_add(b, np.array([1, 3, 0]), lifted))  # after unpickling
    assert np.shares_memory(packed.sums, packed.floats)
    saved_packed = ring.batch_scatter_add_saving(packed, np.array([0, 2]), big)[1]
    saved_separate = ring.batch_scatter_add_saving(separate, np.array([0, 2]), big)[1]
    np.testing.assert_array_equal(saved_packed.count, saved_separate.count)
    np.testing.assert_array_equal(saved_packed.sums, saved_separate.sums)
    both(lambda b: b)
    for slots in (np.array([3, 1]), np.array([1, 2])):  # the saved rows are the rows before
        before = ring.batch_take(packed, slots)
        saved = ring.batch_scatter_add_saving(packed, slots, big)[1]
        saved_separate = ring.batch_scatter_add_saving(separate, slots, big)[1]
        for got in (saved, saved_separate):
            np.testing.assert_array_equal(got.count, before.count)
            np.testing.assert_array_equal(got.sums, before.sums)
            np.testing.assert_array_equal(got.products, before.products)
        both(lambda b: b)


# ------------------------------------------------------------------------ zero tests


def test_count_zero_with_nonzero_sums_is_not_zero():
    ring = CovarianceRing(["x"], shift=False)
    # delete (k, x=1) and insert (k, x=2) in one batch: count nets to 0, sums do not
    delete = ring.batch_neg(ring.batch_lift("x", np.array([1.0])))
    insert = ring.batch_lift("x", np.array([2.0]))
    net = ring.batch_add(delete, insert)
    assert int(net.count[0]) == 0 and net.sums[0, 0] == 1.0
    assert not ring.batch_is_zero(net)[0]
    assert not ring.batch_is_negligible(net)[0]
    payload = CovariancePayload((0,), 0, [1.0], [[3.0]])
    assert not ring.is_zero(payload)
    assert ring.is_zero(ring.sub(payload, payload))
    tiny = CovarianceBatch(
        (0,), np.zeros(2, np.int64), np.array([[1e-12], [0.0]]), np.array([[0.0], [0.0]])
    )
    assert list(ring.batch_is_zero(tiny)) == [False, True]
    assert list(ring.batch_is_negligible(tiny)) == [True, True]
    counted = CovarianceBatch((0,), np.ones(1, np.int64), np.zeros((1, 1)), np.zeros((1, 1)))
    assert not ring.batch_is_negligible(counted)[0]


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "values,shown",
    [
        (np.array([1.0, np.nan]), "nan"),
        (np.array([np.inf]), "inf"),
        (np.array(["abc", "2"]), "'abc'"),
        (np.array([1.5, "abc"], dtype=object), "'abc'"),
        (np.array([1.5, None], dtype=object), "None"),
        (np.array([1 + 2j]), "(1+2j)"),
    ],
)
def test_bad_lift_values(values, shown):
    ring = CovarianceRing(["price"])
    with pytest.raises(RingError, match=r"cannot lift .* into continuous variable 'price'") as e:
        ring.batch_lift("price", values)
    assert shown in str(e.value)
    with pytest.raises(RingError, match="'price'"):
        ring.batch_lift_block(["price"], values[:, None])
    assert np.isnan(ring.shifts[0])  # a rejected batch does not fix the shift
    two = CovarianceRing(["ok", "price"])
    good = np.ones(len(values), dtype=object)
    with pytest.raises(RingError, match="'price'"):
        two.batch_lift_block(["ok", "price"], np.column_stack([good, values.astype(object)]))
    assert np.isnan(two.shifts).all()


def test_scalar_lift_and_accepted_inputs():
    ring = CovarianceRing(["price"], shift=False)
    with pytest.raises(RingError, match="cannot lift 'abc' into continuous variable 'price'"):
        ring.lift("price", "abc")
    assert ring.equal(ring.lift("price", 3), CovariancePayload((0,), 1, [3.0], [[9.0]]))
    from decimal import Decimal
    from fractions import Fraction

    got = ring.batch_lift("price", np.array([Decimal("1.5"), Fraction(1, 2), 2], dtype=object))
    np.testing.assert_array_equal(got.sums[:, 0], [1.5, 0.5, 2.0])


def test_structural_errors():
    ring = CovarianceRing(["x", "y"])
    with pytest.raises(RingError, match="unknown continuous variable 'z'"):
        ring.batch_lift("z", np.array([1.0]))
    with pytest.raises(RingError, match="unknown continuous variable 'z'"):
        ring.batch_lift_block(["x", "z"], np.ones((2, 2)))
    with pytest.raises(RingError, match=r"\(n, 2\)"):
        ring.batch_lift_block(["x", "y"], np.ones((2, 3)))
    with pytest.raises(RingError, match="twice"):
        ring.batch_lift_block(["x", "x"], np.ones((2, 2)))
    with pytest.raises(RingError, match="listed twice"):
        CovarianceRing(["x", "x"])
    a = ring.batch_lift("x", np.ones(3))
    b = ring.batch_lift("y", np.ones(4))
    with pytest.raises(RingError, match="different lengths 3 and 4"):
        ring.batch_mul(a, b)
    with pytest.raises(RingError, match="different lengths 3 and 4"):
        ring.batch_add(a, b)
    with pytest.raises(RingError, match="different lengths"):
        ring.batch_mul_sum([a, b])
    with pytest.raises(RingError, match="symmetric"):
        CovariancePayload((0, 1), 1, [1.0, 2.0], [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(RingError, match="integers"):
        CovariancePayload((0,), 1.5, [1.0], [[1.0]])


def test_payloads_of_different_ring_instances():
    first, second = CovarianceRing(["x", "y"]), CovarianceRing(["x", "y"])
    assert first == second and hash(first) == hash(second)
    a = first.batch_lift("x", np.array([10.0, 12.0]))
    b = second.batch_lift("y", np.array([100.0, 101.0]))
    first.set_shifts({"y": 0.0})
    with pytest.raises(RingError, match="different shifts"):
        first.batch_mul(a, b)
    with pytest.raises(RingError, match="shifts"):
        first.check_same_ring(second)
    other = CovarianceRing(["x", "y", "z"])
    with pytest.raises(RingError, match="different covariance rings"):
        other.batch_add(other.batch_lift("z", np.ones(2)), a)
    with pytest.raises(RingError):
        first.check_same_ring(other)
    # equal rings with equal shifts are interchangeable
    third = CovarianceRing(["x", "y"], shift=False)
    fourth = CovarianceRing(["x", "y"], shift=False)
    third.batch_mul(third.batch_lift("x", np.ones(2)), fourth.batch_lift("y", np.ones(2)))
    third.check_same_ring(fourth)


def test_serialization_roundtrip_and_shift_checks():
    ring = CovarianceRing(["x", "y", "z"])
    rng = np.random.default_rng(3)
    batch = ring.batch_lift_block(["z", "x"], rng.normal(1e6, 1, (6, 2)))
    acc = ring.batch_scatter_add(ring.batch_accumulator(6), np.arange(6), batch)
    fresh = CovarianceRing(["x", "y", "z"])
    back = fresh.batch_from_bytes(ring.batch_to_bytes(batch))
    np.testing.assert_array_equal(fresh.shifts, ring.shifts)  # adopted from the data
    for got, want in zip(fresh.batch_to_list(back), ring.batch_to_list(batch), strict=True):
        assert fresh.equal(got, want)
        assert fresh.equal(fresh.from_bytes(ring.to_bytes(want)), want)
    acc_back = fresh.batch_from_bytes(ring.batch_to_bytes(acc))
    assert acc_back.has_lo
    np.testing.assert_array_equal(acc_back.products_lo, acc.products_lo)
    restored = CovarianceRing.from_dict(ring.to_dict())
    assert restored == ring and np.array_equal(restored.shifts, ring.shifts, equal_nan=True)
    other = CovarianceRing(["x", "y", "z"])
    other.batch_lift("x", np.array([5.0]))
    with pytest.raises(RingError, match="shift"):
        other.batch_from_bytes(ring.batch_to_bytes(batch))
    with pytest.raises(RingError, match="magic"):
        ring.batch_from_bytes(b"nonsense")
    with pytest.raises(RingError, match="truncated"):
        ring.batch_from_bytes(ring.batch_to_bytes(batch)[:-8])
    with pytest.raises(RingError, match="unknown continuous variable 'z'"):
        CovarianceRing(["x", "y"]).batch_from_bytes(ring.batch_to_bytes(batch))


def test_pickled_ring_keeps_its_payloads():
    import pickle

    ring = CovarianceRing(["x", "y"])
    batch = ring.batch_lift("x", np.array([3.0, 4.0]))
    ring2, batch2 = pickle.loads(pickle.dumps((ring, batch)))
    assert ring2 == ring and np.array_equal(ring2.shifts, ring.shifts, equal_nan=True)
    product = ring2.batch_mul(batch2, ring2.batch_lift("y", np.array([1.0, 2.0])))
    assert product.block == (0, 1)
    mask = ring2.batch_take(product, np.array([False, True]))
    assert ring2.batch_len(mask) == 1 and mask.sums[0, 0] == batch.sums[1, 0]


def test_reshift_combines_payloads_made_with_different_shifts():
    """Shards pick their own shifts; re-centring one ring's payload on another's shifts
    (count, Σx, Σxxᵀ) lets them be added, and equals the payload lifted there directly."""
    rng = np.random.default_rng(4)
    x = rng.normal([3e5, -40.0, 7.0], [3.0, 1.0, 0.5], (400, 3))
    names = ["u", "v", "w"]
    first, second = CovarianceRing(names), CovarianceRing(names)
    second.set_shifts({"u": 3e5 + 17.0, "v": -41.5})  # "w" is fixed by its first lift
    a = first.batch_sum(first.batch_lift_block(names, x[:150]))
    b = second.batch_sum(second.batch_lift_block(["w", "u", "v"], x[150:][:, [2, 0, 1]]))
    assert not np.array_equal(first.shifts, second.shifts)
    moved = first.reshift(b, second.shifts)
    assert moved.block == (2, 0, 1) and first.moments(moved)[0] == 250
    count, sums, products = first.moments(first.add(a, moved))
    assert count == 400
    np.testing.assert_allclose(sums, x.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(products, x.T @ x, rtol=1e-12)
    direct = first.batch_sum(first.batch_lift_block(names, x))
    back = second.reshift(direct, dict(zip(names, first.shifts, strict=True)))
    np.testing.assert_allclose(second.moments(back)[2], x.T @ x, rtol=1e-12)
    # an open shift is adopted (nothing to move), and the source shifts must fit the ring
    fresh = CovarianceRing(names)
    part = second.batch_sum(second.batch_lift("u", x[150:, 0]))
    same = fresh.reshift(part, second.shifts)
    assert fresh.shifts[0] == second.shifts[0] and np.isnan(fresh.shifts[1])
    assert fresh.equal(same, part)
    with pytest.raises(RingError, match="3 shifts"):
        first.reshift(moved, [0.0])
    with pytest.raises(RingError, match="different covariance rings"):
        CovarianceRing(["u", "v", "w", "z"]).reshift(moved, first.shifts)


@pytest.mark.parametrize("mean", MEANS)
def test_views_below_the_root_keep_the_precision_without_compensation(mean):
    """Only the root sums with compensation: a view below it, here one key receiving every
    R tuple (100k inserts, 45% deleted again, mean 1e9 or 1e12, sd 1), sums shifted values
    in plain float64 and still gives variances and covariances within 1e-9 of exact."""
    import pandas as pd

    import ringml as rm

    rng = np.random.default_rng(5)
    n = 100_000
    z = rng.normal(0.0, 1.0, n)
    x, y = mean + z, mean + rng.normal(0.0, 1.0, n) - 0.5 * z
    query = rm.Query({"R": ["k", "x", "y"], "S": ["k", "w"]}, CovarianceRing(["x", "y", "w"]))
    m = rm.Maintainer(query)
    m.insert("S", pd.DataFrame({"k": [1], "w": [2.0]}))
    frame = pd.DataFrame({"k": np.ones(n, dtype=np.int64), "x": x, "y": y})
    for start in range(0, n, 10_000):
        m.insert("R", frame.iloc[start : start + 10_000])
    deleted = rng.permutation(n)[: int(0.45 * n)]
    for start in range(0, deleted.size, 10_000):
        m.delete("R", frame.iloc[deleted[start : start + 10_000]])
    assert not m._stores[m.plan.id_of("V@x_R")].compensated  # a plain view below the root
    keep = np.ones(n, dtype=bool)
    keep[deleted] = False
    exact = Exact({"x": x[keep], "y": y[keep]}, {})
    stats = query.ring.statistics(m.result())
    for a, b in (("x", "x"), ("x", "y"), ("y", "y")):
        got = stats.covariance["xy".index(a), "xy".index(b)]
        assert_close(got, exact.cov(a, b), f"cov {a} {b}")


def test_a_shift_fixed_by_an_outlier_warns_that_the_variance_lost_its_digits():
    """The first lifted batch fixes the shift for good: an outlier there (inserted, then
    deleted) leaves later data near 5 with a variance of rounding noise -- said, not silent."""
    import warnings

    ring = CovarianceRing(["x"])
    acc = ring.batch_accumulator(1)
    slot = np.array([0])
    acc = ring.batch_scatter_add(acc, slot, ring.batch_lift("x", np.array([1e9])))
    acc = ring.batch_scatter_add(acc, slot, ring.batch_neg(ring.batch_lift("x", np.array([1e9]))))
    x = np.random.default_rng(0).normal(5.0, 1.0, 500)
    lifted = ring.batch_lift("x", x)
    acc = ring.batch_scatter_add(acc, slot, ring.batch_sum_by(lifted, np.zeros(500, int), 1))
    with pytest.warns(RuntimeWarning, match=r"shift of 'x' \(1000000000.0.*keeps about 0 of 16"):
        ring.statistics(ring.batch_take(acc, slot))
    fresh = CovarianceRing(["x"])
    payload = fresh.batch_sum_by(fresh.batch_lift("x", x), np.zeros(500, int), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.statistics(payload).covariance[0, 0] == pytest.approx(np.var(x), rel=1e-12)
        fresh.sigma(payload)


def test_a_delete_of_inserted_rows_cancels_them_exactly_in_one_group():
    """One group of many rows is summed with BLAS: inserts took ``x xᵀ`` (syrk), deletes
    ``(x w) xᵀ`` (gemm), which round differently -- inserting and deleting the same
    1,000 rows of mixed magnitudes 200 times left Σx² at -378,866 instead of 14."""
    import ringml as rm

    rng = np.random.default_rng(1)
    query = rm.covariance_query({"R": ["x", "y"]})
    m = rm.Maintainer(query)
    small = {"x": [1.0, 2.0, 3.0], "y": [3.0, -1.0, 0.5]}
    m.insert("R", small)
    for _ in range(20):
        rows = {"x": 10.0 ** rng.uniform(-3, 9, 1000), "y": 10.0 ** rng.uniform(-3, 9, 1000)}
        m.insert("R", rows)
        m.delete("R", rows)
        m.apply([rm.UpdateBatch("R", rows, [2] * 1000), rm.UpdateBatch("R", rows, [-2] * 1000)])
    count, sums, q = query.ring.moments(m.result())
    x = np.column_stack([small["x"], small["y"]])
    assert count == 3
    np.testing.assert_array_equal(sums, x.sum(axis=0))
    np.testing.assert_array_equal(q, x.T @ x)


@pytest.mark.parametrize("categorical", [(), ("colour",)])
def test_covariance_query_grouped_by_a_non_join_variable_leaves_it_out_of_the_features(
    categorical,
):
    """``covariance_query(relations, free=["city"])`` lifted every non-join variable by
    default, the free ``city`` too, and the query was refused ("free variables are never
    lifted"); the default features are the non-join variables that are not free."""
    import pandas as pd

    import ringml as rm

    relations = {"Sales": ["store", "units", "colour"], "Stores": ["store", "city", "size"]}
    query = rm.covariance_query(relations, categorical=categorical, free=["city"])
    m = rm.Maintainer(query)
    sales = pd.DataFrame(
        {"store": [1, 1, 2, 3], "units": [3.0, 1.0, 7.0, 2.0], "colour": [0, 1, 1, 0]}
    )
    stores = pd.DataFrame({"store": [1, 2, 3], "city": ["Oslo", "Rome", "Oslo"]})
    stores["size"] = [120.0, 300.0, 80.0]
    m.insert("Sales", sales)
    m.insert("Stores", stores)
    joined = sales.merge(stores, on="store")
    features = ["units", "size"] if categorical else ["units", "colour", "size"]
    assert set(m.result()) == {("Oslo",), ("Rome",)}
    for (city,), payload in m.result().items():
        rows = joined[joined["city"] == city]
        if categorical:
            assert payload.count == len(rows)
            continue
        count, sums, _ = query.ring.moments(payload)
        assert count == len(rows)
        np.testing.assert_allclose(sums, rows[features].sum().to_numpy())
