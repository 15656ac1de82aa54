"""Segment sums of the covariance ring's grouped lift: bit for bit ``np.add.reduceat``."""

from __future__ import annotations

import numpy as np
import pytest
from ringml.rings.covariance import CovarianceRing, _segment_sums_rows


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


@pytest.mark.parametrize("distinct", [0.95, 0.6, 0.2])
def test_grouped_lift_equals_lift_then_sum(distinct):
    """The grouped lift (per-row rounds when most groups have one row, reduceat otherwise)
    gives the bits of lift_block + sum_by's reduceat of the same rows."""
    rng = np.random.default_rng(7)
    ring = CovarianceRing(list("ABCDE"), shift=False)
    n = 400
    columns = [_values(rng, (n,)) for _ in range(5)]
    groups = rng.integers(0, max(1, int(n * distinct)), n)
    _, groups = np.unique(groups, return_inverse=True)
    n_groups = int(groups.max()) + 1
    got = ring.batch_lift_block_sum_by(list("ABCDE"), columns, groups, n_groups)
    x = np.column_stack(columns)
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    i, j = np.triu_indices(5)
    products = (x[order][:, i] * x[order][:, j]).T
    assert np.array_equal(got.count, np.bincount(groups, minlength=n_groups))
    for part, lifted in ((got.sums, x[order].T), (got.products, products)):
        expected = np.add.reduceat(np.ascontiguousarray(lifted), starts, axis=1).T
        assert np.array_equal(part.view(np.int64), expected.view(np.int64))
