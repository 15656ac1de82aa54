"""Grouped sums of shuffled rows (most groups one row) bit for bit as numpy sums them: the
covariance ring's grouped lift (``np.add.reduceat``), the categorical ring's row scatter
(``np.bincount``)."""

from __future__ import annotations

import numpy as np
import pytest
from ringml.rings.categorical import _scatter_rows
from ringml.rings.covariance import CovarianceRing, _segment_sums_rows, _transposed


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values over 16 orders of magnitude with signed zeros: any change of the order of the
    additions shows in the bits."""
    a = rng.normal(size=shape) * 10.0 ** rng.integers(-8, 8, size=shape)
    a[rng.random(shape) < 0.15] = -0.0
    a[rng.random(shape) < 0.1] = 0.0
    return a


@pytest.mark.parametrize("seed", range(40))
def test_segment_sums_equal_reduceat_bitwise(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    # from all-distinct groups to runs longer than reduceat's sequential block (8)
    groups = np.sort(rng.integers(0, max(1, n // int(rng.integers(1, 25))), n))
    starts = np.flatnonzero(np.concatenate(([True], groups[1:] != groups[:-1])))
    a = _values(rng, (int(rng.integers(1, 12)), n))
    expected = np.add.reduceat(a, starts, axis=1).T
    got = _segment_sums_rows(a, starts)
    assert got.shape == expected.shape
    assert np.array_equal(got.view(np.int64), expected.view(np.int64))


@pytest.mark.parametrize("n", [0, 1, 128, 1000, 1024])
@pytest.mark.parametrize("w", [0, 1, 7, 8, 9, 20, 65])
def test_transposed_copies_rows_to_columns(w, n):
    """Batches of a multiple of 128 rows are transposed 8 rows at a time (a plain copy
    thrashes the cache there): the same C-contiguous array as the plain copy, partial
    last block included."""
    a = np.arange(w * n, dtype=np.float64).reshape(w, n)
    got = _transposed(a)
    assert got.flags.c_contiguous and got.shape == (n, w)
    assert np.array_equal(got, a.T)


@pytest.mark.parametrize("n", [400, 1024])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("distinct", [0.95, 0.6, 0.2])
def test_grouped_lift_equals_lift_then_sum(distinct, weighted, n):
    """The grouped lift (per-row rounds when most groups have one row, without sorting the
    rows when they are not sorted by group; reduceat otherwise) gives the bits of lift_block
    + scale + sum_by's reduceat of the same rows."""
    rng = np.random.default_rng(7)
    ring = CovarianceRing(list("ABCDE"), shift=False)
    columns = [_values(rng, (n,)) for _ in range(5)]
    groups = rng.integers(0, max(1, int(n * distinct)), n)
    _, groups = np.unique(groups, return_inverse=True)
    n_groups = int(groups.max()) + 1
    weights = rng.choice([-2, -1, 1, 3], n) if weighted else None
    got = ring.batch_lift_block_sum_by(list("ABCDE"), columns, groups, n_groups, weights)
    x = np.column_stack(columns)
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    i, j = np.triu_indices(5)
    products = (x[order][:, i] * x[order][:, j]).T
    if weighted:
        w = weights[order].astype(np.float64)
        x, products = x * weights[:, None].astype(np.float64), products * w
    counts = np.bincount(groups, weights=weights, minlength=n_groups).astype(np.int64)
    assert np.array_equal(got.count, counts)
    for part, lifted in ((got.sums, x[order].T), (got.products, products)):
        expected = np.add.reduceat(np.ascontiguousarray(lifted), starts, axis=1).T
        assert np.array_equal(part.view(np.int64), expected.view(np.int64))


@pytest.mark.parametrize("seed", range(30))
def test_categorical_scatter_rows_equal_bincount_bitwise(seed):
    """The categorical ring's row scatter (rows added in rounds when most groups get one
    row) gives the bits of bincount's in-order sums from 0.0, -0.0 turned 0.0 included."""
    rng = np.random.default_rng(seed)
    n_groups = int(rng.integers(1, 400))
    n = int(rng.integers(1, 2 * n_groups + 2))
    groups = rng.integers(0, n_groups, n)
    if seed % 2:  # every group has rows
        groups = rng.permutation(np.concatenate([np.arange(n_groups), groups]))
    x = _values(rng, (groups.size, int(rng.integers(1, 12))))
    d = x.shape[1]
    flat = (groups[:, None] * d + np.arange(d)).ravel()
    expected = np.bincount(flat, weights=x.ravel(), minlength=n_groups * d).reshape(-1, d)
    got = _scatter_rows(x, groups, n_groups)
    assert got.shape == expected.shape
    assert np.array_equal(got.view(np.int64), expected.view(np.int64))
