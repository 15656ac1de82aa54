"""The n×n matrix ring (non-commutative) and factorized rank-1 / low-rank deltas (W17)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ring_laws import check_axioms, check_batched_agrees
from ringml.rings.base import RingError
from ringml.rings.matrix import (
    LowRank,
    MatrixRing,
    RankOneUpdate,
    left_mul,
    rank_one,
    right_mul,
)

SETTINGS = settings(max_examples=60, deadline=None)


def int_matrices(n, lo=-5, hi=5):
    """Small-integer matrices: float64 arithmetic on them is exact."""
    return st.lists(st.integers(lo, hi), min_size=n * n, max_size=n * n).map(
        lambda xs: np.asarray(xs, dtype=np.float64).reshape(n, n)
    )


@SETTINGS
@given(st.integers(1, 3).flatmap(lambda n: st.tuples(*[int_matrices(n)] * 3)))
def test_matrix_axioms(abc):
    a, b, c = abc
    check_axioms(MatrixRing(len(a)), a, b, c)


def test_matrix_ring_is_not_commutative():
    ring = MatrixRing(2)
    assert ring.commutative is False
    a, b = np.array([[0.0, 1.0], [0.0, 0.0]]), np.array([[0.0, 0.0], [1.0, 0.0]])
    assert not ring.equal(ring.mul(a, b), ring.mul(b, a))


@SETTINGS
@given(st.lists(int_matrices(3), max_size=6), st.data())
def test_matrix_batched_agrees(xs, data):
    ys = data.draw(st.lists(int_matrices(3), min_size=len(xs), max_size=len(xs)))
    check_batched_agrees(MatrixRing(3), xs, ys)


def test_batched_mul_keeps_order():
    ring = MatrixRing(2)
    a = ring.batch_from([np.array([[1, 2], [3, 4]]), np.eye(2)])
    b = ring.batch_from([np.array([[0, 1], [1, 0]]), np.array([[5, 6], [7, 8]])])
    got = ring.batch_mul(a, b)
    assert np.array_equal(got[0], [[2, 1], [4, 3]]) and np.array_equal(got[1], [[5, 6], [7, 8]])
    fused = ring.batch_mul_sum([a, b, a])
    assert np.array_equal(fused[0], got[0] @ a[0] + got[1] @ a[1])


def test_matrix_basics_and_errors():
    ring = MatrixRing(2)
    assert ring.lifted_variables == frozenset()
    assert np.array_equal(ring.lift("X1", 3), np.eye(2))
    assert np.array_equal(ring.batch_lift("X1", np.array([1, 2, 3])), np.stack([np.eye(2)] * 3))
    assert ring.is_zero(ring.zero()) and not ring.is_zero(ring.one())
    assert ring.equal(ring.one(), ring.one() + 1e-13, atol=1e-12)
    assert ring.batch_is_negligible(np.stack([np.full((2, 2), 1e-13), np.eye(2)])).tolist() == [
        True,
        False,
    ]
    with pytest.raises(RingError):
        ring.add(np.eye(3), np.eye(2))
    with pytest.raises(RingError):
        ring.mul(np.eye(2), np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(RingError):
        ring.add(np.eye(2), rank_one([1, 0], [0, 1]))  # a LowRank is not an element
    with pytest.raises(RingError):
        ring.batch_add(np.zeros((1, 2, 2)), np.zeros((1, 3, 3)))
    with pytest.raises(RingError):
        MatrixRing(2).check_same_ring(MatrixRing(3))
    MatrixRing(2).check_same_ring(MatrixRing(2))
    with pytest.raises(RingError):
        MatrixRing(0)
    with pytest.raises(RingError):
        ring.from_bytes(b"\x00" * 8)


# ------------------------------------------------------------------ W17
A1 = np.array([[1.0, 2.0], [0.0, 1.0]])
A2 = np.array([[2.0, 0.0], [1.0, 1.0]])
A3 = np.array([[1.0, 1.0], [0.0, 2.0]])
A4 = np.array([[0.0, 1.0], [1.0, 0.0]])


def test_w17_views():
    ring = MatrixRing(2)
    v_x2 = ring.mul(A1, A2)
    v_x4 = ring.mul(A3, A4)
    assert np.array_equal(v_x2, [[4, 2], [1, 1]])
    assert np.array_equal(v_x4, [[1, 1], [2, 0]])
    assert np.array_equal(ring.mul(v_x2, v_x4), [[8, 4], [3, 1]])


def test_w17_rank_one_propagation(monkeypatch):
    ring = MatrixRing(2)
    u, v = np.array([1.0, -1.0]), np.array([2.0, 1.0])
    v_x4 = ring.mul(A3, A4)
    A = ring.mul(ring.mul(A1, A2), v_x4)
    delta_a2 = RankOneUpdate(u, v)

    # forbid materializing any U Vᵀ while propagating
    def no_dense(self):
        raise AssertionError("a dense delta was formed during propagation")

    monkeypatch.setattr(LowRank, "to_dense", no_dense)
    monkeypatch.setattr(LowRank, "add_to", no_dense)
    d_v_x2 = left_mul(A1, delta_a2)  # δV^{@X2} = (A1 u) vᵀ
    d_a = right_mul(d_v_x2, v_x4)  # δV^{@X3} = (A1 u)(vᵀ V^{@X4})
    monkeypatch.undo()

    for d in (d_v_x2, d_a):
        assert isinstance(d, LowRank) and d.rank == 1
        assert d.U.shape == (2, 1) and d.V.shape == (2, 1)  # vectors only, no 2×2 delta
    assert np.array_equal(d_v_x2.U[:, 0], [-1, -1])  # A1 u
    assert np.array_equal(d_a.V[:, 0], [4, 2])  # vᵀ V^{@X4}
    assert np.array_equal(d_v_x2.to_dense(), [[-2, -1], [-2, -1]])
    assert np.array_equal(d_a.to_dense(), [[-4, -2], [-4, -2]])
    new_a = d_a.add_to(A)
    assert np.array_equal(new_a, [[4, 2], [-1, -1]])
    recomputed = A1 @ (A2 + np.outer(u, v)) @ A3 @ A4
    assert np.array_equal(new_a, recomputed)
    # the operator forms give the same factors
    via_ops = (A1 @ delta_a2) @ v_x4
    assert isinstance(via_ops, LowRank)
    assert np.array_equal(via_ops.U, d_a.U) and np.array_equal(via_ops.V, d_a.V)


@SETTINGS
@given(
    st.integers(2, 4).flatmap(
        lambda p: st.tuples(
            st.lists(int_matrices(p, -2, 2), min_size=2, max_size=5),
            st.lists(st.integers(-3, 3), min_size=p, max_size=p),
            st.lists(st.integers(-3, 3), min_size=p, max_size=p),
        )
    ),
    st.data(),
)
def test_chain_rank_one_update_matches_recomputation(args, data):
    mats, u, v = args
    i = data.draw(st.integers(0, len(mats) - 1))
    delta = rank_one(u, v)
    left = np.linalg.multi_dot([np.eye(len(u))] + mats[:i] + [np.eye(len(u))])
    right = np.linalg.multi_dot([np.eye(len(u))] + mats[i + 1 :] + [np.eye(len(u))])
    propagated = right_mul(left_mul(left, delta), right)
    assert propagated.rank == 1
    new_mats = list(mats)
    new_mats[i] = mats[i] + np.outer(u, v)
    before = np.linalg.multi_dot([np.eye(len(u))] + mats + [np.eye(len(u))])
    after = np.linalg.multi_dot([np.eye(len(u))] + new_mats + [np.eye(len(u))])
    assert np.array_equal(propagated.add_to(before), after)


def test_low_rank_algebra():
    rng = np.random.default_rng(1)
    U, V = rng.integers(-3, 4, (4, 2)).astype(float), rng.integers(-3, 4, (3, 2)).astype(float)
    lr = LowRank(U, V)
    dense = U @ V.T
    assert lr.shape == (4, 3) and lr.rank == 2
    M = rng.integers(-3, 4, (5, 4)).astype(float)
    N = rng.integers(-3, 4, (3, 2)).astype(float)
    assert np.array_equal((M @ lr).to_dense(), M @ dense)
    assert np.array_equal((lr @ N).to_dense(), dense @ N)
    assert np.array_equal(lr.T.to_dense(), dense.T)
    assert np.array_equal((lr + lr).to_dense(), 2 * dense) and (lr + lr).rank == 4
    assert np.array_equal((lr - lr).to_dense(), np.zeros((4, 3)))
    assert np.array_equal((-lr).to_dense(), -dense) and np.array_equal(
        (3 * lr).to_dense(), 3 * dense
    )
    other = LowRank(rng.integers(-3, 4, (3, 1)).astype(float), np.ones((2, 1)))
    chained = lr @ other
    assert chained.rank == 1 and np.array_equal(chained.to_dense(), dense @ other.to_dense())
    target = np.zeros((4, 3))
    lr.add_to(target, out=target)
    assert np.array_equal(target, dense)
    r1 = RankOneUpdate([1, 2], [3, 4, 5])
    assert np.array_equal(r1.u, [1, 2]) and np.array_equal(r1.v, [3, 4, 5])
    with pytest.raises(RingError):
        left_mul(np.eye(3), lr)
    with pytest.raises(RingError):
        right_mul(lr, np.eye(4))
    with pytest.raises(RingError):
        LowRank(np.ones((2, 2)), np.ones((2, 3)))
    with pytest.raises(RingError):
        lr + LowRank(np.ones((2, 1)), np.ones((2, 1)))
    with pytest.raises(RingError):
        left_mul(np.eye(2), np.eye(2))
