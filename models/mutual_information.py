"""Mutual information from count tables and Chow–Liu trees (F-IVM §9.3).

The counts ``C_∅ = SUM(1)``, ``C_X = SUM(1) GROUP BY X`` and ``C_XY = SUM(1) GROUP BY X, Y``
are exactly the all-categorical generalized covariance ring (``c``, ``s_X = Q_XX``,
``Q_XY``), so they are maintained incrementally; the MI matrix is recomputed from them
after each batch (MI is not linear in the counts).  Conventions of the reference
(bigzhe/FIVM ``chow-liu-tree``):

* ``I(X,Y) = Σ_{x,y: C_XY>0} (C_XY/C_∅) · log₂(C_∅·C_XY / (C_X(x)·C_Y(y)))`` — log base 2;
* the diagonal holds the entropy ``H(X) = Σ_x (C_X/C_∅) · log₂(C_∅/C_X)``;
* cells with a zero count are skipped (a cell counts as zero when ``|n| <= 1e-9·C_∅``,
  the rounding a float count can carry after deletes);
* the Chow–Liu tree is a maximum-weight spanning tree of the complete graph weighted by
  MI (Kruskal).  Ties are broken by the order of the variables, whatever the rounding:
  MIs within ``TIE_RTOL · max(1, largest entropy)`` bits of each other count as equal
  (equal MIs computed from tables whose cells were summed in another order differ in the
  last bits, and a tree that followed those bits depended on the order rows arrived in),
  and among equal MIs the pair ``(X_i, X_j)`` with the smaller ``(i, j)`` is taken first.

Continuous variables are discretized first into equal-width bins fixed once
(:class:`EqualWidthBinner`), so a delete lands in the bin of its insert.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

__all__ = [
    "EqualWidthBinner",
    "chow_liu_tree",
    "entropy",
    "equal_width_bins",
    "mutual_information",
    "mutual_information_matrix",
]

#: a count within this fraction of C_∅ is a zero cell (rounding residue of deletes)
ZERO_RTOL = 1e-9
#: MIs within this fraction of max(1, the largest entropy) bits are ties for the tree
TIE_RTOL = 1e-9


def _values(table: Mapping) -> np.ndarray:
    return np.fromiter((float(v) for v in table.values()), dtype=np.float64, count=len(table))


def entropy(counts: Mapping[Hashable, float], total: float | None = None) -> float:
    """``H(X)`` in bits from ``{x: C_X(x)}`` (``total`` defaults to the sum of counts)."""
    n = _values(counts)
    c = float(n.sum()) if total is None else float(total)
    if c <= 0:
        return 0.0
    n = n[n > ZERO_RTOL * c]
    if not len(n):
        return 0.0
    return max(0.0, float(np.sum(n / c * np.log2(c / n))))


def mutual_information(
    joint: Mapping[tuple, float],
    counts_x: Mapping[Hashable, float],
    counts_y: Mapping[Hashable, float],
    total: float,
) -> float:
    """``I(X,Y)`` in bits from ``{(x, y): C_XY}``, ``{x: C_X}``, ``{y: C_Y}`` and ``C_∅``."""
    c = float(total)
    if c <= 0 or not joint:
        return 0.0
    n = _values(joint)
    keep = n > ZERO_RTOL * c
    if not keep.any():
        return 0.0
    keys = [k for k, ok in zip(joint, keep, strict=True) if ok]
    n = n[keep]
    nx_ = np.fromiter((float(counts_x[k[0]]) for k in keys), dtype=np.float64, count=len(keys))
    ny_ = np.fromiter((float(counts_y[k[1]]) for k in keys), dtype=np.float64, count=len(keys))
    value = float(np.sum(n / c * np.log2(c * n / (nx_ * ny_))))
    return max(0.0, value)  # ≥ 0 in exact arithmetic; clamp rounding residue


def mutual_information_matrix(
    count_tables: Mapping[tuple, Any], variables: Sequence[str] | None = None
) -> pd.DataFrame:
    """The pairwise MI matrix (bits; entropy on the diagonal) from count tables.

    ``count_tables`` is the shape of :meth:`GeneralizedCovarianceRing.count_tables`:
    ``{(): C_∅, (X,): {x: n}, (X, Y): {(x, y): n}}``, a pair under either order.
    ``variables`` picks and orders the rows (default: the singleton tables, in order).
    """
    if () not in count_tables:
        raise ValueError("count tables need the total C_∅ under the key ()")
    total = float(count_tables[()])
    if variables is None:
        variables = [k[0] for k in count_tables if len(k) == 1]
    names = list(variables)
    for v in names:
        if (v,) not in count_tables:
            raise ValueError(f"no count table for variable {v!r}")
    q = len(names)
    mi = np.zeros((q, q))
    for i, x in enumerate(names):
        mi[i, i] = entropy(count_tables[(x,)], total)
        for j in range(i + 1, q):
            y = names[j]
            if (x, y) in count_tables:
                joint = count_tables[(x, y)]
            elif (y, x) in count_tables:
                joint = {(b, a): n for (a, b), n in count_tables[(y, x)].items()}
            else:
                raise ValueError(f"no joint count table for ({x!r}, {y!r})")
            value = mutual_information(joint, count_tables[(x,)], count_tables[(y,)], total)
            mi[i, j] = mi[j, i] = value
    return pd.DataFrame(mi, index=names, columns=names)


def chow_liu_tree(mi: pd.DataFrame | np.ndarray, names: Sequence[str] | None = None) -> nx.Graph:
    """The Chow–Liu tree: a maximum spanning tree of the MI matrix (diagonal ignored).

    Returns an ``nx.Graph`` with one node per variable (attribute ``entropy`` from the
    diagonal) and ``weight`` = MI on each of its ``q − 1`` edges.  Ties (MIs within
    ``TIE_RTOL · max(1, largest diagonal entry)``) go to the pair of the earlier
    variables, so equal data give the same tree however its MIs were rounded.
    """
    if isinstance(mi, pd.DataFrame):
        names = [str(c) if not isinstance(c, str) else c for c in mi.columns]
        matrix = mi.to_numpy(dtype=np.float64)
    else:
        matrix = np.asarray(mi, dtype=np.float64)
        names = list(range(len(matrix))) if names is None else list(names)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or len(names) != len(matrix):
        raise ValueError(f"the MI matrix must be square with one name per row: {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError("the MI matrix has NaN or infinite entries")
    tree = nx.Graph()
    for i, v in enumerate(names):
        tree.add_node(v, entropy=float(matrix[i, i]))
    parts = nx.utils.UnionFind(names)
    for i, j in _kruskal_order(matrix):
        if parts[names[i]] != parts[names[j]]:
            parts.union(names[i], names[j])
            tree.add_edge(names[i], names[j], weight=float(matrix[i, j]))
    return tree


def _kruskal_order(matrix: np.ndarray) -> list[tuple[int, int]]:
    """Every pair ``(i, j)``, ``i < j``, by decreasing MI; ties (see :data:`TIE_RTOL`) by
    ``(i, j)``."""
    q = len(matrix)
    pairs = [(i, j) for i in range(q) for j in range(i + 1, q)]
    if not pairs:
        return []
    weights = np.asarray([matrix[i, j] for i, j in pairs])
    tol = TIE_RTOL * max(1.0, float(np.max(np.abs(np.diag(matrix)))))
    out: list[tuple[int, int]] = []
    group: list[tuple[int, int]] = []
    top = math.inf
    for k in np.argsort(-weights, kind="stable"):
        if group and weights[k] < top - tol:  # below the group's largest: a new group
            out.extend(sorted(group))
            group = []
        if not group:
            top = float(weights[k])
        group.append(pairs[k])
    out.extend(sorted(group))
    return out


# --------------------------------------------------------------------------- binning
def equal_width_bins(x: np.ndarray, lo: float, hi: float, n_bins: int) -> np.ndarray:
    """``min(B−1, floor((x−lo)/(hi−lo)·B))`` with ``x`` clipped to ``[lo, hi]``; int64.

    ``hi == lo`` (a range fixed from one value) maps ``x <= lo`` to bin 0 and ``x > hi`` to
    the last bin, as clipping would.  A range wider than the largest float (``hi − lo``
    overflows) is measured in halves.
    """
    x = np.asarray(x, dtype=np.float64)
    lo, hi = float(lo), float(hi)  # Python floats: an overflowing span is inf, silently
    if not hi > lo:
        return np.where(x > hi, n_bins - 1, 0).astype(np.int64)
    x = np.clip(x, lo, hi)
    if math.isfinite(hi - lo):
        z = (x - lo) / (hi - lo) * n_bins
    else:  # (x − lo) and (hi − lo) overflowed to inf: inf/inf was NaN, cast to bin −2**63
        z = (x * 0.5 - lo * 0.5) / (hi * 0.5 - lo * 0.5) * n_bins
    return np.minimum(n_bins - 1, np.floor(z)).astype(np.int64)


class EqualWidthBinner(TransformerMixin, BaseEstimator):
    """Equal-width discretization with bins fixed by :meth:`fit` (notes §9.3).

    ``fit`` records each column's ``min_`` and ``max_`` (or takes them from ``ranges``, one
    ``(lo, hi)`` per column, without looking at the data); ``transform`` maps ``x`` to
    ``min(B−1, floor((x−min)/(max−min)·B))`` with ``B = n_bins``.  Values outside the
    fitted range are **clipped** to the first or last bin (a column that was constant maps
    its value and below to bin 0, above to the last bin), so the number of bins never
    changes and the same value always lands in the same bin: fit once (on the first
    batch, or with explicit ``ranges``) and the bin of a deleted tuple is the bin of its
    insert.  NaN and infinities are rejected.
    """

    def __init__(self, n_bins: int = 100, ranges: Sequence[tuple[float, float]] | None = None):
        self.n_bins = n_bins
        self.ranges = ranges

    def fit(self, X, y=None):
        X = validate_data(self, X, dtype=np.float64, reset=True)
        if not isinstance(self.n_bins, int | np.integer) or self.n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer, got {self.n_bins!r}")
        if self.ranges is not None:
            ranges = np.asarray(self.ranges, dtype=np.float64)
            if ranges.shape != (X.shape[1], 2) or not np.all(np.isfinite(ranges)):
                raise ValueError(f"ranges needs one finite (lo, hi) per column ({X.shape[1]})")
            if np.any(ranges[:, 1] < ranges[:, 0]):
                raise ValueError("every range needs lo <= hi")
            self.min_, self.max_ = ranges[:, 0].copy(), ranges[:, 1].copy()
        else:
            self.min_, self.max_ = X.min(axis=0), X.max(axis=0)
        self.n_bins_ = int(self.n_bins)
        return self

    def transform(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        out = np.empty(X.shape, dtype=np.int64)
        for j in range(X.shape[1]):
            out[:, j] = equal_width_bins(X[:, j], self.min_[j], self.max_[j], self.n_bins_)
        return out

    def bin_edges(self, column: int = 0) -> np.ndarray:
        """The ``n_bins + 1`` edges of a column's bins."""
        check_is_fitted(self)
        lo, hi = float(self.min_[column]), float(self.max_[column])
        if math.isfinite(hi - lo):
            return np.linspace(lo, hi, self.n_bins_ + 1)
        half = np.linspace(lo * 0.5, hi * 0.5, self.n_bins_ + 1)  # hi − lo overflows
        return np.concatenate([[lo], half[1:-1] * 2.0, [hi]])

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.transformer_tags.preserves_dtype = []  # outputs int64 bin indices
        return tags
