"""The generalized covariance ring over the relational data ring (F-IVM Definitions 8-9).

A payload is a covariance triple ``(c, s, Q)`` whose entries are *relations* (elements of the
relational data ring F[R], Definition 8) instead of numbers:

* ``c`` is keyed by ``()``: the COUNT;
* ``s_j`` is ``SUM(X_j)`` (keyed by ``()``) for a continuous ``X_j`` and ``COUNT GROUP BY X_j``
  (keyed by the category) for a categorical ``X_j``;
* ``Q_ij`` (``i <= j``) is ``SUM(X_i X_j)`` for two continuous variables, ``SUM(X_i) GROUP BY
  X_j`` for a continuous ``X_i`` and a categorical ``X_j`` (keyed by the category of ``X_j``),
  and ``COUNT GROUP BY X_i, X_j`` for two categorical ones (keyed by the pair ``(x_i, x_j)``;
  ``Q_jj`` of a categorical ``X_j`` is keyed by ``x_j`` alone).

Sum is ``⊎`` and product is ``⊗`` (natural join, payloads multiplied) entry by entry, in the
covariance-structure formulas of Definition 6::

    a * b = (c_a c_b,  c_b s_a + c_a s_b,  c_b Q_a + c_a Q_b + s_a s_b^T + s_b s_a^T)

Every entry's *schema* (the set of categorical variables it is grouped by) is fixed by its
position: ``()`` for ``c`` and continuous entries, ``{j}`` for ``s_j``/``Q_jj`` of a
categorical ``j`` and for ``Q_ij`` with ``i`` continuous, ``{i, j}`` for two categorical
variables.  Sums and products preserve these schemas (``s_a[j] ⊗ s_b[j]`` of the same
categorical ``j`` is the join on ``X_j``: keys must be equal), so the structure is exactly the
covariance ring over F[R] and satisfies the ring axioms (Theorem 3).  Relations keyed by
``()`` are stored as plain floats (Remark 4).  Only categories that occur are stored: memory
and time are proportional to the categories present, never to a one-hot domain.

Global variable order: the ``continuous`` variables in the order given, then the
``categorical`` ones in the order given.  Global indices (``0 .. m-1``) refer to that order.

Scalar face: :class:`GCPayload` with ``count``, ``sums`` and ``products`` (upper triangle
``i <= j``; missing entries are zero relations).  Categories may be any hashable value at the
scalar face; the batched face (and serialization) takes integer codes (the engine
dictionary-encodes category values).

Batched face: :class:`GCBatch` holds a dense part (``count (n,)``, continuous ``sums (n, p)``
and the packed upper triangle of the continuous products ``(n, p(p+1)/2)``) and one sparse
COO table for every relation over categorical variables, with columns
``(row, entry, key1, key2, value)``, kept coalesced: sorted by ``(row, entry, key1, key2)``,
unique, and without zero values.  Entry ids (``q`` categorical, ``p`` continuous variables,
categorical positions ``j, k`` counted from 0 within the categorical list)::

    S(j)    = j                       s_j                  key1 = x_j
    D(j)    = q + j                   Q_jj                 key1 = x_j
    X(i, j) = 2q + i*q + j            Q_ij, i continuous   key1 = x_j
    P(j, k) = 2q + pq + t(j, k)       Q_jk, j < k          key1 = x_j, key2 = x_k

(``t`` the row-major index in the strict upper triangle; ``key2`` is 0 where unused).

Accumulators (the payloads of stored views) keep that table in a deferred form while they
are added into (:class:`GCBatch`, :class:`_Deferred`): one packed integer key per entry, a
main sorted run updated in place and a small sorted pending run for new keys, merged into
the main run only when it passes a quarter of it, so adding a delta costs in proportion to
the delta (amortized), not to the stored table.  A take from such a table stays packed (the
taken rows' ranges, re-keyed; decoded only when read as columns).  Accumulators also hold
only the continuous-product columns that ever received a value (``GCBatch.pcols``).

Products of many rows (:meth:`~GeneralizedCovarianceRing.batch_mul_sum`, every view step of
F-IVM) over factors with disjoint variables are fused: instead of multiplying factor by
factor and sorting the growing sparse table after each step, every term is followed from
the step that bears it through the same floating-point operations, and each block of terms
is summed once, in the order the stepwise product would sum it: the result is the same bit
for bit, for a fraction of the work when a batch touches many rows (shuffled streams).

Numerics (as :class:`~ringml.rings.covariance.CovarianceRing`): every continuous variable
``i`` gets a fixed *shift* ``h_i``, chosen at its first lift (that batch's mean, rounded to
a multiple of the largest power of two not above the batch's standard deviation, so that
integer-valued data stay integers), and payloads hold the moments of ``x' = x − h``: ``s_i``,
``Q_ii'`` and the ``SUM(X_i) GROUP BY X_j`` entries ``Q_ij`` are shifted sums; counts and
categorical entries are unchanged.  :meth:`GeneralizedCovarianceRing.statistics` centres the
shifted moments directly; :meth:`~GeneralizedCovarianceRing.entry` and
:meth:`~GeneralizedCovarianceRing.to_dense` return original units.  Accumulators
(:meth:`~GeneralizedCovarianceRing.batch_accumulator`) add the dense continuous part with
TwoSum compensation (``sums_lo``/``prods_lo``); counts are integer-valued floats, exact.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import struct
import weakref
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ringml.rings.base import Ring, RingError, check_code_maps, recode_column
from ringml.rings.covariance import (
    CovarianceStatistics,
    _run_lengths,
    choose_shift,
    share_shifts,
)

__all__ = ["GCPayload", "GCBatch", "GeneralizedCovarianceRing"]

NEGLIGIBLE = 1e-9
_MAGIC = b"RGCB"
_VERSION = 2  # 2 added the shifts and the compensation arrays; 1 is still read
_MISSING = object()

Relation = float | dict  # scalar-face entry: a float (schema ()) or a dict key -> value


#: the rings constructed in this process, by id (see
#: :func:`~ringml.rings.covariance.share_shifts`)
_BUILT: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


# ---------------------------------------------------------------------------- elements


@dataclass(frozen=True)
class GCPayload:
    """A scalar element ``(c, s, Q)``; treat as immutable.

    ``sums[i]`` is a float for a continuous variable ``i`` and a ``dict category -> value`` for
    a categorical one.  ``products[(i, j)]`` (``i <= j``) is a float when both are continuous,
    a ``dict x_j -> value`` when ``i`` is continuous and ``j`` categorical, a ``dict x_i ->
    value`` when ``i == j`` is categorical, and a ``dict (x_i, x_j) -> value`` when ``i < j``
    are categorical.  Missing entries, keys and zero values all mean zero.
    """

    count: float = 0.0
    sums: dict[int, Relation] = field(default_factory=dict)
    products: dict[tuple[int, int], Relation] = field(default_factory=dict)


class GCBatch:
    """A batch of ``n`` payloads: dense continuous part plus a coalesced sparse COO table.

    ``rows``, ``entry``, ``key1``, ``key2`` and ``value`` always read as one coalesced table
    (sorted by ``(row, entry, key1, key2)``, unique, no zeros).  An accumulator that
    :meth:`GeneralizedCovarianceRing.batch_scatter_add` adds into holds its table in a
    deferred form instead (:class:`_Deferred`: packed keys, a main run that may hold zeros
    and a small pending run), so that an addition costs in proportion to the delta; reading
    or assigning any of those five attributes first turns the table back into the plain
    form (and the next addition packs it again).

    Accumulators (:meth:`GeneralizedCovarianceRing.batch_accumulator`) also carry
    ``sums_lo``/``prods_lo``, the TwoSum compensation of ``sums``/``prods`` (the value is
    ``hi + lo``); other batches have None there.

    Accumulators (and the batches taken from them) also hold their continuous products in
    a compact form: only the packed columns in ``pcols`` are stored (a view over a few
    continuous variables keeps a few of the ``p(p+1)/2`` columns), every other column is
    zero.  Reading or assigning ``prods``/``prods_lo`` first turns them into the full
    arrays (for good).
    """

    def __init__(
        self,
        count: np.ndarray,  # (n,) float64
        sums: np.ndarray,  # (n, p) float64, continuous sums
        prods: np.ndarray,  # (n, p(p+1)/2) float64, packed upper triangle of cont x cont
        rows: np.ndarray,  # (nnz,) int64
        entry: np.ndarray,  # (nnz,) int64
        key1: np.ndarray,  # (nnz,) int64
        key2: np.ndarray,  # (nnz,) int64
        value: np.ndarray,  # (nnz,) float64
        #: (continuous, categorical) of the ring that made the batch
        config: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
        sums_lo: np.ndarray | None = None,
        prods_lo: np.ndarray | None = None,
    ) -> None:
        self.count = count
        self.sums = sums
        self._prods, self._prods_lo = prods, prods_lo
        #: packed positions of the columns ``_prods`` holds (compact form), or None (full)
        self.pcols: np.ndarray | None = None
        self.sums_lo = sums_lo
        self._rows, self._entry, self._key1, self._key2 = rows, entry, key1, key2
        self._value = value
        self.config = config
        #: the sparse table in deferred form; while set, the five arrays above are unused
        self._deferred: _Deferred | None = None

    def __len__(self) -> int:
        return len(self.count)

    def __repr__(self) -> str:
        return f"GCBatch(n={len(self)}, nnz={self.nnz}, config={self.config!r})"

    def __setstate__(self, state: dict) -> None:
        # batches pickled before the deferred form stored the table under the public names
        for name in ("rows", "entry", "key1", "key2", "value"):
            if name in state:
                state["_" + name] = state.pop(name)
        state.setdefault("_deferred", None)
        state.setdefault("sums_lo", None)  # batches pickled before compensation
        for name in ("prods", "prods_lo"):  # pickled before the compact form
            if name in state:
                state["_" + name] = state.pop(name)
        state.setdefault("_prods_lo", None)
        state.setdefault("pcols", None)
        self.__dict__.update(state)

    def _full(self) -> None:
        """Turn compact continuous products into the full arrays."""
        if self.pcols is None:
            return
        width = self._width
        for name in ("_prods", "_prods_lo"):
            part = getattr(self, name)
            if part is not None:
                full = np.zeros((len(part), width))
                full[:, self.pcols] = part
                setattr(self, name, full)
        self.pcols = None

    @property
    def prods(self) -> np.ndarray:
        self._full()
        return self._prods

    @prods.setter
    def prods(self, array: np.ndarray) -> None:
        self._full()
        self._prods = array

    @property
    def prods_lo(self) -> np.ndarray | None:
        self._full()
        return self._prods_lo

    @prods_lo.setter
    def prods_lo(self, array: np.ndarray | None) -> None:
        self._full()
        self._prods_lo = array

    def _compact(self, cols: np.ndarray, hi: np.ndarray, lo: np.ndarray | None, width: int):
        """Hold the products as the columns ``cols`` (``hi``, ``lo``) of ``width``."""
        self._prods, self._prods_lo, self.pcols, self._width = hi, lo, cols, width
        return self

    def _plain(self) -> None:
        """Turn a deferred table back into the five plain arrays."""
        d = self._deferred
        if d is None:
            return
        d.settle()
        self._rows, self._entry, self._key1, self._key2 = d.decode(d.mkey)
        self._value = d.mval
        self._deferred = None

    def _get(name: str):  # noqa: N805 - property factory used in the class body
        private = "_" + name

        def get(self: GCBatch) -> np.ndarray:
            if self._deferred is not None:
                self._plain()
            return getattr(self, private)

        def put(self: GCBatch, array: np.ndarray) -> None:
            if self._deferred is not None:
                self._plain()
            setattr(self, private, array)

        return property(get, put)

    rows = _get("rows")
    entry = _get("entry")
    key1 = _get("key1")
    key2 = _get("key2")
    value = _get("value")
    del _get

    @property
    def nnz(self) -> int:
        """Number of stored (non-zero) categorical relation entries in the batch."""
        d = self._deferred
        if d is not None:  # counted without turning the table back into plain arrays
            return int(np.count_nonzero(d.mval)) + int(np.count_nonzero(d.pval))
        return len(self._value)


class _Deferred:
    """The deferred form of an accumulator's sparse table (see :class:`GCBatch`).

    Every entry is one packed key ``((row * E + entry) * K1 + key1) * K2 + key2`` (``E``
    entry ids, ``K1``/``K2`` powers of two above every key), which orders like the table,
    and a value.  The main run ``mkey``/``mval`` is sorted and unique but may hold zeros
    (cancelled entries, cleared rows); the pending run ``pkey``/``pval`` is sorted, unique,
    disjoint from the main run, and may hold zeros too.  ``zeros`` counts the zero values of
    both runs.  Additions touch the main run in place and insert into the pending run only;
    :meth:`settle` merges the pending run into the main one and drops the zeros.
    """

    def __init__(self, n_entries: int, k1: int, k2: int, mkey: np.ndarray, mval: np.ndarray):
        self.e, self.k1, self.k2 = n_entries, k1, k2
        self.span = n_entries * k1 * k2  # keys of row r lie in [r * span, (r + 1) * span)
        self.mkey, self.mval = mkey, mval
        self.pkey, self.pval = _EMPTY_I, _EMPTY_F
        self.zeros = 0
        #: the row of every main-run entry, when known (tables made by a take)
        self.rows: np.ndarray | None = None

    def pack(self, rows, entry, key1, key2) -> np.ndarray:
        return ((rows * self.e + entry) * self.k1 + key1) * self.k2 + key2

    def decode(self, key: np.ndarray) -> list[np.ndarray]:
        if key is self.mkey and getattr(self, "rows", None) is not None:
            rows = self.rows  # known row of every main entry (a taken table)
            return [rows, *self.decode_local(key - rows * self.span)]
        re, rest = np.divmod(key, self.k1 * self.k2)
        key1, key2 = np.divmod(rest, self.k2)
        rows, entry = np.divmod(re, self.e)
        return [rows, entry, key1, key2]

    def decode_local(self, local: np.ndarray) -> list[np.ndarray]:
        """(entry, key1, key2) of keys within one row (``0 <= local < span``)."""
        k1, k2 = self.k1, self.k2
        if k1 & (k1 - 1) or k2 & (k2 - 1):  # not powers of two (never made so here)
            rest, key2 = np.divmod(local, k2)
            entry, key1 = np.divmod(rest, k1)
            return [entry, key1, key2]
        b2, b1 = k2.bit_length() - 1, k1.bit_length() - 1
        return [local >> (b1 + b2), (local >> b2) & (k1 - 1), local & (k2 - 1)]

    def row_starts(self, n: int) -> np.ndarray:
        """Where each of rows ``0 .. n`` starts in the main run (cached until the main
        run is replaced; values changed in place keep it valid)."""
        ptr = getattr(self, "_ptr", None)
        if ptr is None or getattr(self, "_ptr_of", None) is not self.mkey or len(ptr) != n + 1:
            ptr = np.searchsorted(self.mkey, np.arange(n + 1, dtype=np.int64) * self.span)
            self._ptr, self._ptr_of = ptr, self.mkey
        return ptr

    def settle(self) -> None:
        if len(self.pkey):
            self.mkey, self.mval = _merge_runs(
                [self.mkey, self.mval], [self.pkey, self.pval], self.mkey, self.pkey
            )
            self.rows = None
            self.pkey, self.pval = _EMPTY_I, _EMPTY_F
        if self.zeros:
            keep = self.mval != 0
            self.mkey, self.mval = self.mkey[keep], self.mval[keep]
            self.zeros = 0
            self.rows = None


def _merge_runs(
    old: list[np.ndarray], new: list[np.ndarray], old_key: np.ndarray, new_key: np.ndarray
) -> list[np.ndarray]:
    """Columns of two sorted runs with disjoint keys merged into one sorted run."""
    if 16 * len(new_key) > len(old_key) > 4096:
        # runs of similar sizes: numpy's stable sort (timsort) merges the two runs of the
        # concatenation in one linear pass, faster than binary searches for every new key
        order = np.argsort(np.concatenate([old_key, new_key]), kind="stable")
        return [np.concatenate([a, b])[order] for a, b in zip(old, new, strict=True)]
    at = np.searchsorted(old_key, new_key) + np.arange(len(new_key), dtype=np.int64)
    is_new = np.zeros(len(old_key) + len(new_key), dtype=bool)
    is_new[at] = True
    out = []
    for a, b in zip(old, new, strict=True):
        merged = np.empty(len(is_new), dtype=a.dtype)
        merged[at] = b
        merged[~is_new] = a
        out.append(merged)
    return out


_I64 = np.dtype(np.int64)
_F64 = np.dtype(np.float64)
_EMPTY_I = np.zeros(0, dtype=np.int64)
_EMPTY_F = np.zeros(0, dtype=np.float64)
#: a deferred table settles its pending run (or drops its zeros) past this size at least
_PENDING_MIN = 4096


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges ``[starts[i], starts[i] + lengths[i])``: (owner index, position) of each item."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum()) if len(lengths) else 0
    if total == 0:
        return _EMPTY_I, _EMPTY_I
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    first = np.cumsum(lengths) - lengths
    pos = np.arange(total, dtype=np.int64)
    pos += np.repeat(np.asarray(starts, np.int64) - first, lengths)
    return owner, pos


def _distinct(slots: np.ndarray, n: int) -> bool:
    """Whether ``slots`` (in ``[0, n)``) are pairwise distinct."""
    if len(slots) < 2:
        return True
    if n <= 64 * len(slots):
        seen = np.zeros(n, dtype=bool)
        seen[slots] = True
        return int(np.count_nonzero(seen)) == len(slots)
    return len(np.unique(slots)) == len(slots)


def _stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` of non-negative int64 keys; keys below 2**32 are
    sorted by numpy's radix sort in 16-bit digits (least significant first), several
    times faster than its merge sort on int64."""
    top = int(key.max()) if len(key) else 0
    if top < 1 << 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    if top < 1 << 32:
        order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
        high = (key >> 16).astype(np.uint16)[order]
        return order[np.argsort(high, kind="stable")]
    return np.argsort(key, kind="stable")


def _positions_in(held: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``cols`` is (or would go) in the sorted ``held``, and whether it is there."""
    at = np.searchsorted(held, cols)
    found = at < len(held)
    found[found] = held[at[found]] == cols[found]
    return at, found


def _pow2(k: int) -> bool:
    return k > 0 and not k & (k - 1)


class _Table:
    """A sparse table, row-major: rows, keys ``(entry * k1 + key1) * k2 + key2`` within a
    row (``k1``, ``k2`` powers of two; ``span`` = entries * k1 * k2 bounds them), values."""

    __slots__ = ("rows", "local", "value", "k1", "k2", "b2", "shift", "span")

    def __init__(self, rows, local, value, k1: int, k2: int, n_entries: int) -> None:
        self.rows, self.local, self.value, self.k1, self.k2 = rows, local, value, k1, k2
        self.b2 = k2.bit_length() - 1
        self.shift = self.b2 + k1.bit_length() - 1  # local >> shift is the entry id
        self.span = n_entries * k1 * k2


def _sum_runs(key: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum of the nonzero values per run of equal keys (``key`` grouped: equal keys are
    adjacent), by ``np.add.reduceat`` as :meth:`GeneralizedCovarianceRing._coalesce` sums
    them; zero sums dropped."""
    if not value.all():
        live = value != 0
        key, value = key[live], value[live]
    if len(key) > 1:
        new = np.empty(len(key), dtype=bool)
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        if not new.all():
            starts = np.flatnonzero(new)
            key, value = key[starts], np.add.reduceat(value, starts)
            if not value.all():
                live = value != 0
                key, value = key[live], value[live]
    return key, value


#: :func:`_scatter_rows` adds rows in rounds while no group has more rows than this.
_SCATTER_ROUNDS = 8


def _scatter_rows(x: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """``out[g] = sum of x[i] with groups[i] == g`` for a 1-d or 2-d float array, summed in
    row order from 0.0 (``np.bincount``'s order; bit for bit the same when most groups get
    one row and their rows are added in rounds, one row per group and round)."""
    if n_groups == 1 and len(groups):  # one group: a running sum down the rows
        return _column_sums(x)[None]
    if x.ndim == 1:
        return np.bincount(groups, weights=x, minlength=n_groups).astype(np.float64, copy=False)
    d = x.shape[1]
    out = np.zeros((n_groups, d), dtype=np.float64)
    n = len(groups)
    if d == 0 or n == 0:
        return out
    if 2 * n_groups > n > 1:  # mostly one row per group (shuffled rows): rows, not cells
        order = np.argsort(groups, kind="stable")
        ordered = groups[order]
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        lengths = _run_lengths(starts, n)
        longest = int(lengths.max())
        if longest <= _SCATTER_ROUNDS:
            # each group's rows in row order, from 0.0 (so -0.0 turns 0.0): bincount's sums
            sums = np.take(x, order[starts], axis=0)
            sums += 0.0
            more = np.flatnonzero(lengths > 1)
            for r in range(1, longest):
                more = more[lengths[more] > r]
                sums[more] += np.take(x, order[starts[more] + r], axis=0)
            keys = ordered[starts]
            if keys.size == n_groups:  # every group has rows: keys are 0..n_groups-1
                return sums
            out[keys] = sums
            return out
    flat = (groups[:, None] * d + np.arange(d, dtype=np.int64)).ravel()
    out.ravel()[:] = np.bincount(flat, weights=x.ravel(), minlength=n_groups * d)
    return out


def _column_sums(x: np.ndarray) -> np.ndarray:
    """Sums of the columns of a 1-d or 2-d float array (rows >= 1), added in row order
    from 0.0 as ``np.bincount`` adds them: numpy reduces a C-ordered array along its
    first axis row by row (pairwise summation is only along the contiguous axis), and a
    running sum (``np.cumsum``) adds strictly in order; zeros made +0.0 as ``0.0 + ...``
    makes them."""
    if x.ndim == 2 and x.shape[1] > 1:  # along the slow axis numpy adds row by row
        return np.add.reduce(np.ascontiguousarray(x), axis=0) + 0.0
    return np.cumsum(x, axis=0)[-1] + 0.0


def _two_sum(hi: np.ndarray, lo: np.ndarray, at: slice | np.ndarray, add: np.ndarray) -> None:
    """``hi[at] + lo[at] += add`` with TwoSum: ``hi`` takes the rounded sum, ``lo`` its error.
    ``at``: a slice (views) or unique row indices (``np.take`` gathers faster than ``[]``)."""
    rows = isinstance(at, slice)
    a = hi[at] if rows else np.take(hi, at, axis=0)
    total = a + add
    b = total - a
    err = total - b  # err = (a - (total - b)) + (add - b), TwoSum's rounding error
    np.subtract(a, err, out=err)
    np.subtract(add, b, out=b)
    err += b
    hi[at] = total
    if rows:
        lo[at] += err
    else:
        err += np.take(lo, at, axis=0)
        lo[at] = err


def _is_real_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool | np.bool_)


# ---------------------------------------------------------------------- relational core
# A generic relation (scalar face): dict mapping a key -- a tuple of (variable, value) pairs
# sorted by variable -- to a float.  Relations over different schemas live in one dict, so
# ⊎ and ⊗ work across schemas (F-IVM footnote 4 / implementation note of Definition 8).


def _rel_add(r1: dict, r2: dict) -> dict:
    out = dict(r1)
    for k, v in r2.items():
        out[k] = out.get(k, 0.0) + v
    return out


def _rel_join(r1: dict, r2: dict) -> dict:
    """Natural join: keys agreeing on their shared variables merge, payloads multiply."""
    out: dict = {}
    if not r1 or not r2:
        return out
    for k1, v1 in r1.items():
        d1 = dict(k1)
        for k2, v2 in r2.items():
            ok = True
            for var, x in k2:
                y = d1.get(var, _MISSING)
                if y is not _MISSING and y != x:
                    ok = False
                    break
            if not ok:
                continue
            merged = dict(d1)
            merged.update(k2)
            key = tuple(sorted(merged.items(), key=lambda item: item[0]))
            out[key] = out.get(key, 0.0) + v1 * v2
    return out


class GeneralizedCovarianceRing(Ring[GCPayload, GCBatch]):
    """The generalized covariance ring (F-IVM Definition 9) over continuous + categorical vars.

    ``GeneralizedCovarianceRing(continuous=["A", "B"], categorical=["C"])``: global order
    A, B, C (continuous first, each list in the order given).  Every variable is lifted:
    a continuous ``x`` to ``(1, s_j={()->x'}, Q_jj={()->x'^2})`` with ``x' = x − h_j``, a
    categorical ``x`` to ``(1, s_j={x->1}, Q_jj={x->1})``.  ``shift`` enables the shifts
    (``ring.shifts``, NaN until fixed; zeros when ``shift=False``), ``compensated`` makes
    :meth:`batch_accumulator` return TwoSum accumulators.  Rings are equal when their
    configurations are; :meth:`check_same_ring` also compares the shifts.
    """

    name = "generalized_covariance"
    commutative = True

    def __init__(
        self,
        continuous: Sequence[str] = (),
        categorical: Sequence[str] = (),
        shift: bool = True,
        compensated: bool = True,
    ):
        if isinstance(continuous, str) or isinstance(categorical, str):
            raise RingError("continuous and categorical must be sequences of variable names")
        cont = tuple(continuous)
        cat = tuple(categorical)
        for v in cont + cat:
            if not isinstance(v, str) or not v:
                raise RingError(f"variable names must be non-empty strings, got {v!r}")
        seen: set[str] = set()
        for v in cont + cat:
            if v in seen:
                raise RingError(f"variable {v!r} given twice")
            seen.add(v)
        self.continuous: tuple[str, ...] = cont
        self.categorical: tuple[str, ...] = cat
        self.variables: tuple[str, ...] = cont + cat
        self._config = (cont, cat)
        self.shift = bool(shift)
        self.compensated = bool(compensated)
        # one shift per variable; categorical variables are never shifted (0)
        self._shifts = np.zeros(len(cont) + len(cat))
        self._shifts[: len(cont)] = np.nan if self.shift else 0.0
        # a random id, kept through pickling: copies in one process share the shifts
        self._id = int.from_bytes(os.urandom(8), "little") >> 2
        _BUILT[self._id] = self
        self._index = {v: i for i, v in enumerate(self.variables)}
        p, q = len(cont), len(cat)
        self._p, self._q = p, q
        self._iu, self._ju = np.triu_indices(p)
        self._packed = len(self._iu)
        # packed position of (i, j), i <= j continuous
        self._pack_pos = np.full((p, p), -1, dtype=np.int64)
        self._pack_pos[self._iu, self._ju] = np.arange(self._packed)
        self._pack_pos[self._ju, self._iu] = np.arange(self._packed)
        # sparse entry ids
        self._off_d = q
        self._off_x = 2 * q
        self._off_p = 2 * q + p * q
        ju, ku = np.triu_indices(q, k=1)
        self._pair_id = np.full((q, q), -1, dtype=np.int64)
        self._pair_id[ju, ku] = self._off_p + np.arange(len(ju))
        self._pair_id[ku, ju] = self._off_p + np.arange(len(ju))
        self.n_entries = self._off_p + len(ju)
        # entry id -> (kind, global i, global j)
        # kinds: 0 s_j, 1 Q_jj, 2 Q_ij cont x cat, 3 cat x cat
        kind = np.empty(self.n_entries, dtype=np.int64)
        gi = np.empty(self.n_entries, dtype=np.int64)
        gj = np.empty(self.n_entries, dtype=np.int64)
        kind[:q], gi[:q], gj[:q] = 0, p + np.arange(q), p + np.arange(q)
        kind[q : 2 * q], gi[q : 2 * q], gj[q : 2 * q] = 1, p + np.arange(q), p + np.arange(q)
        ci, cj = np.divmod(np.arange(p * q), q) if q else (_EMPTY_I, _EMPTY_I)
        kind[self._off_x : self._off_p] = 2
        gi[self._off_x : self._off_p] = ci
        gj[self._off_x : self._off_p] = p + cj
        kind[self._off_p :] = 3
        gi[self._off_p :] = p + ju
        gj[self._off_p :] = p + ku
        self._kind, self._gi, self._gj = kind, gi, gj
        self._kind_l, self._gi_l, self._gj_l = kind.tolist(), gi.tolist(), gj.tolist()

    # ------------------------------------------------------------------ config
    @property
    def categorical_variables(self) -> frozenset[str]:
        """Variables whose batched lift takes dictionary codes (the engine encodes them)."""
        return frozenset(self.categorical)

    @property
    def keyed_variables(self) -> frozenset[str]:
        return self.categorical_variables

    @property
    def lifted_variables(self) -> frozenset[str]:
        return frozenset(self.variables)

    @property
    def degree(self) -> int:
        """Number of variables ``m``."""
        return len(self.variables)

    def index(self, variable: str | int) -> int:
        """Global index of a variable (names or indices accepted)."""
        if isinstance(variable, numbers.Integral) and not isinstance(variable, bool):
            if 0 <= int(variable) < self.degree:
                return int(variable)
            raise RingError(f"variable index {variable} out of range for {self!r}")
        try:
            return self._index[variable]
        except (KeyError, TypeError):
            raise RingError(f"unknown variable {variable!r} for {self!r}") from None

    def is_categorical(self, variable: str | int) -> bool:
        return self.index(variable) >= self._p

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_shifts" not in state:  # pickled before shifts: its payloads are unshifted
            state.update(shift=False, compensated=False, _shifts=np.zeros(len(state["_index"])))
        if "_id" not in state:  # pickled before ids: a ring of its own
            state["_id"] = int.from_bytes(os.urandom(8), "little") >> 2
        self.__dict__.update(state)
        share_shifts(_BUILT, self)

    def _settings(self) -> tuple:
        return (self.continuous, self.categorical, self.shift, self.compensated)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GeneralizedCovarianceRing):
            return False
        return self._settings() == other._settings()

    def __hash__(self) -> int:
        return hash((self.name,) + self._settings())

    def __repr__(self) -> str:
        options = "".join(
            f", {name}=False" for name in ("shift", "compensated") if not getattr(self, name)
        )
        return (
            f"GeneralizedCovarianceRing(continuous={list(self.continuous)!r}, "
            f"categorical={list(self.categorical)!r}{options})"
        )

    # ------------------------------------------------------------------ shifts
    @property
    def shifts(self) -> np.ndarray:
        """Per-variable shifts ``h`` in global order (NaN until fixed; 0 for categorical
        variables).  Payloads hold the moments of ``x − h``."""
        return self._shifts.copy()

    def set_shifts(self, shifts: Mapping[str, float]) -> None:
        """Fix shifts explicitly (e.g. restoring a checkpoint) before any lift of them.

        Setting a variable to its current shift is a no-op; changing a fixed shift (or a
        categorical variable's 0) raises :class:`RingError`.
        """
        for name, value in shifts.items():
            j = self.index(name)
            value = float(value)
            if not math.isfinite(value):
                raise RingError(f"shift of {name!r} must be finite, got {value!r}")
            current = self._shifts[j]
            if current == value:
                continue
            if j >= self._p or not self.shift:
                raise RingError(f"{name!r} cannot be shifted (categorical, or shift=False)")
            if not math.isnan(current):
                raise RingError(f"shift of {name!r} is already fixed at {current!r}")
            self._shifts[j] = value

    def lift_state(self) -> np.ndarray:
        """The shifts (fixed by first lifts)."""
        return self.shifts

    def restore_lift_state(self, state: np.ndarray) -> None:
        self.reopen_shifts(state)

    def reopen_shifts(self, earlier: np.ndarray) -> None:
        """Open again the shifts that were open in ``earlier`` (a :attr:`shifts` copy): a
        batch rejected mid-way must not leave the shift its values chose (no stored payload
        uses a variable whose shift was open, so none changes)."""
        self._shifts[np.isnan(earlier)] = np.nan

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly configuration and shifts (unfixed shifts are ``None``)."""
        return {
            "ring": self.name,
            "continuous": list(self.continuous),
            "categorical": list(self.categorical),
            "shift": self.shift,
            "compensated": self.compensated,
            "shifts": [None if math.isnan(h) else float(h) for h in self._shifts],
        }

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> GeneralizedCovarianceRing:
        """Inverse of :meth:`to_dict`."""
        ring = cls(
            config["continuous"],
            config["categorical"],
            shift=config.get("shift", True),
            compensated=config.get("compensated", True),
        )
        shifts = config.get("shifts") or [None] * ring.degree
        ring.set_shifts(
            {v: h for v, h in zip(ring.variables, shifts, strict=True) if h is not None}
        )
        return ring

    def check_same_ring(self, other: Ring) -> None:
        super().check_same_ring(other)
        if other is not self and not np.array_equal(
            self._shifts,
            other._shifts,
            equal_nan=True,  # type: ignore[attr-defined]
        ):
            raise RingError(
                f"generalized covariance rings differ in their shifts: {self._shifts} vs "
                f"{other._shifts}"  # type: ignore[attr-defined]
            )

    def _h(self) -> np.ndarray:
        """The continuous variables' shifts, 0 where still open."""
        h = self._shifts[: self._p]
        return np.where(np.isnan(h), 0.0, h)

    def _shifted(self, i: int, x: np.ndarray) -> np.ndarray:
        """``x − h_i`` for continuous variable ``i``, fixing ``h_i`` from ``x`` if open
        (:func:`~ringml.rings.covariance.choose_shift`)."""
        h = self._shifts[i]
        if math.isnan(h):
            if not len(x):
                return x
            h = choose_shift(x)
            self._shifts[i] = h
        return x - h if h else x

    def reshift(
        self, payload: GCPayload, shifts: Mapping[str, float] | Sequence[float]
    ) -> GCPayload:
        """Re-express a payload made with other shifts ``a`` around this ring's shifts ``h``.

        ``shifts``: one per ring variable in global order (as :attr:`shifts`), or a mapping
        name -> shift.  With ``d = a − h`` the continuous parts become ``s + c d``,
        ``Q + s dᵀ + d sᵀ + c d dᵀ`` and ``Q_ij[x] + d_i s_j[x]`` (``j`` categorical).  A
        shift still open here is first fixed to the payload's (``d = 0``); a variable whose
        shift is NaN or missing in ``shifts`` was never lifted into the payload (``d = 0``).
        """
        if isinstance(shifts, Mapping):
            source = np.full(self.degree, np.nan)
            for name, value in shifts.items():
                source[self.index(name)] = float(value)
        else:
            source = np.asarray(shifts, dtype=np.float64).reshape(-1)
            if source.shape != (self.degree,):
                raise RingError(f"reshift needs {self.degree} shifts, got {source.shape[0]}")
        a = source[: self._p]
        for i, value in enumerate(a):
            if math.isnan(self._shifts[i]) and math.isfinite(value):
                self._shifts[i] = value
        d = np.where(np.isnan(a), 0.0, a - self._h())
        return self._moved(payload, d)

    def _moved(self, a: GCPayload, d: np.ndarray) -> GCPayload:
        """The payload of the rows with every continuous ``x_i`` replaced by ``x_i + d_i``."""
        self._check_indices(a)
        p = self._p
        if not p or not d.any():
            return a
        c = float(a.count)
        s = np.zeros(p)
        for i, rel in a.sums.items():
            if i < p:
                s[i] = rel
        sums = dict(a.sums)
        products = dict(a.products)
        for i in range(p):
            sums[i] = s[i] + c * d[i]
            for j in range(i, p):
                cross = s[i] * d[j] + d[i] * s[j]
                products[(i, j)] = float(a.products.get((i, j), 0.0)) + cross + c * d[i] * d[j]
            for j in range(p, self.degree):
                counts = a.sums.get(j) or {}
                old = dict(a.products.get((i, j)) or {})
                for x, n in counts.items():
                    old[x] = old.get(x, 0.0) + d[i] * n
                products[(i, j)] = old
        return self._normalize(GCPayload(a.count, sums, products))

    # ------------------------------------------------------- scalar construction
    def element(
        self,
        count: float = 0.0,
        sums: Mapping[Any, Any] | None = None,
        products: Mapping[tuple[Any, Any], Any] | None = None,
    ) -> GCPayload:
        """Build a validated, normalized payload; variables by name or global index.  Entries
        are stored as given: continuous ones are moments of ``x − h`` (:attr:`shifts`).

        ``products`` keys may name a pair in either order; for two categorical variables
        given in reverse global order the pair keys ``(x, y)`` are swapped accordingly.
        """
        if not _is_real_number(count):
            raise RingError(f"count must be a real number, got {count!r}")
        out_s: dict[int, Relation] = {}
        for var, rel in (sums or {}).items():
            i = self.index(var)
            out_s[i] = self._norm_entry(rel, (i,) if i >= self._p else (), f"s[{var!r}]")
        out_q: dict[tuple[int, int], Relation] = {}
        for pair, rel in (products or {}).items():
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise RingError(f"product entries are keyed by variable pairs, got {pair!r}")
            i, j = self.index(pair[0]), self.index(pair[1])
            swap = i > j
            if swap:
                i, j = j, i
            schema = tuple(sorted({x for x in (i, j) if x >= self._p}))
            if swap and len(schema) == 2 and isinstance(rel, Mapping):
                rel = {self._pair_key(k, pair)[::-1]: v for k, v in rel.items()}
            out_q[(i, j)] = self._norm_entry(rel, schema, f"Q[{pair!r}]")
        return self._normalize(GCPayload(float(count), out_s, out_q))

    def _pair_key(self, k: Any, where: Any) -> tuple:
        if not isinstance(k, tuple) or len(k) != 2:
            raise RingError(f"{where!r}: categorical pair entries are keyed by pairs, got {k!r}")
        return k

    def _norm_entry(self, rel: Any, schema: tuple[int, ...], where: str) -> Relation:
        if not schema:
            if isinstance(rel, Mapping):
                if set(rel) - {()}:
                    raise RingError(f"{where}: a relation over () has only the key (), got {rel!r}")
                rel = rel.get((), 0.0)
            if not _is_real_number(rel):
                raise RingError(f"{where}: expected a number, got {rel!r}")
            return float(rel)
        if not isinstance(rel, Mapping):
            raise RingError(f"{where}: expected a dict keyed by categories, got {rel!r}")
        out = {}
        for k, v in rel.items():
            if len(schema) == 2:
                self._pair_key(k, where)
            if not _is_real_number(v):
                raise RingError(f"{where}: value for key {k!r} must be a number, got {v!r}")
            out[k] = float(v)
        return out

    @staticmethod
    def _normalize(a: GCPayload) -> GCPayload:
        def norm(rel: Relation) -> Relation | None:
            if isinstance(rel, dict):
                d = {k: v for k, v in rel.items() if v != 0}
                return d or None
            return rel if rel != 0 else None

        sums: dict[int, Relation] = {}
        for i, rel in sorted(a.sums.items()):
            if (r := norm(rel)) is not None:
                sums[i] = r
        prods: dict[tuple[int, int], Relation] = {}
        for ij, rel in sorted(a.products.items()):
            if (r := norm(rel)) is not None:
                prods[ij] = r
        return GCPayload(float(a.count), sums, prods)

    # ------------------------------------------------ scalar face <-> relations
    def _entry_schema(self, i: int, j: int | None = None) -> tuple[int, ...]:
        if j is None:
            return (i,) if i >= self._p else ()
        return tuple(sorted({x for x in (i, j) if x >= self._p}))

    def _to_rel(self, rel: Relation | None, schema: tuple[int, ...]) -> dict:
        if rel is None:
            return {}
        if not schema:
            if isinstance(rel, dict):
                raise RingError(f"continuous entry holds a relation keyed by categories: {rel!r}")
            return {(): float(rel)} if rel != 0 else {}
        if not isinstance(rel, dict):
            raise RingError(f"categorical entry over {schema} must be a dict, got {rel!r}")
        if len(schema) == 1:
            return {((schema[0], k),): v for k, v in rel.items() if v != 0}
        return {((schema[0], k[0]), (schema[1], k[1])): v for k, v in rel.items() if v != 0}

    @staticmethod
    def _from_rel(rel: dict, schema: tuple[int, ...]) -> Relation | None:
        rel = {k: v for k, v in rel.items() if v != 0}
        if not rel:
            return None
        for k in rel:
            if tuple(var for var, _ in k) != schema:  # pragma: no cover - invariant
                raise RingError(f"internal: key {k!r} does not match schema {schema}")
        if not schema:
            return rel[()]
        if len(schema) == 1:
            return {k[0][1]: v for k, v in rel.items()}
        return {(k[0][1], k[1][1]): v for k, v in rel.items()}

    def _check_indices(self, a: GCPayload) -> None:
        m = self.degree
        for i in a.sums:
            if not (isinstance(i, numbers.Integral) and 0 <= i < m):
                raise RingError(f"sum index {i!r} out of range for {self!r}")
        for ij in a.products:
            if not (
                isinstance(ij, tuple)
                and len(ij) == 2
                and all(isinstance(x, numbers.Integral) for x in ij)
                and 0 <= ij[0] <= ij[1] < m
            ):
                raise RingError(f"product index {ij!r} must be (i, j) with 0 <= i <= j < {m}")

    # ----------------------------------------------------------------- scalar face
    def zero(self) -> GCPayload:
        return GCPayload(0.0, {}, {})

    def one(self) -> GCPayload:
        return GCPayload(1.0, {}, {})

    def add(self, a: GCPayload, b: GCPayload) -> GCPayload:
        sums: dict[int, Relation] = {}
        for i in set(a.sums) | set(b.sums):
            sch = self._entry_schema(i)
            r = _rel_add(self._to_rel(a.sums.get(i), sch), self._to_rel(b.sums.get(i), sch))
            if (e := self._from_rel(r, sch)) is not None:
                sums[i] = e
        prods: dict[tuple[int, int], Relation] = {}
        for ij in set(a.products) | set(b.products):
            sch = self._entry_schema(*ij)
            r = _rel_add(
                self._to_rel(a.products.get(ij), sch), self._to_rel(b.products.get(ij), sch)
            )
            if (e := self._from_rel(r, sch)) is not None:
                prods[ij] = e
        return self._normalize(GCPayload(float(a.count) + float(b.count), sums, prods))

    def neg(self, a: GCPayload) -> GCPayload:
        return self.scale(a, -1)

    def scale(self, a: GCPayload, k: int) -> GCPayload:
        k = float(k)

        def sc(rel: Relation) -> Relation:
            if isinstance(rel, dict):
                return {key: k * v for key, v in rel.items()}
            return k * rel

        return self._normalize(
            GCPayload(
                k * float(a.count),
                {i: sc(r) for i, r in a.sums.items()},
                {ij: sc(r) for ij, r in a.products.items()},
            )
        )

    def mul(self, a: GCPayload, b: GCPayload) -> GCPayload:
        """Definition 9, every ⊗ a natural join of relations (the reference semantics)."""
        self._check_indices(a)
        self._check_indices(b)
        ca = {(): float(a.count)} if a.count != 0 else {}
        cb = {(): float(b.count)} if b.count != 0 else {}
        sa = {i: self._to_rel(r, self._entry_schema(i)) for i, r in a.sums.items()}
        sb = {i: self._to_rel(r, self._entry_schema(i)) for i, r in b.sums.items()}
        sums: dict[int, Relation] = {}
        for i in set(sa) | set(sb):
            r = _rel_add(_rel_join(cb, sa.get(i, {})), _rel_join(ca, sb.get(i, {})))
            if (e := self._from_rel(r, self._entry_schema(i))) is not None:
                sums[i] = e
        acc: dict[tuple[int, int], dict] = {}

        def put(ij: tuple[int, int], r: dict) -> None:
            if r:
                acc[ij] = _rel_add(acc.get(ij, {}), r)

        for ij, r in a.products.items():
            put(ij, _rel_join(cb, self._to_rel(r, self._entry_schema(*ij))))
        for ij, r in b.products.items():
            put(ij, _rel_join(ca, self._to_rel(r, self._entry_schema(*ij))))
        # (s_a s_b^T + s_b s_a^T)_ij = s_a[i] ⊗ s_b[j] ⊎ s_b[i] ⊗ s_a[j], stored for i <= j
        for i, ri in sa.items():
            for j, rj in sb.items():
                put((min(i, j), max(i, j)), _rel_join(ri, rj))
                if i == j:
                    put((i, i), _rel_join(rj, ri))
        prods: dict[tuple[int, int], Relation] = {}
        for ij, r in acc.items():
            if (e := self._from_rel(r, self._entry_schema(*ij))) is not None:
                prods[ij] = e
        return self._normalize(GCPayload(float(a.count) * float(b.count), sums, prods))

    def is_zero(self, a: GCPayload) -> bool:
        def zero(rel: Relation) -> bool:
            if isinstance(rel, dict):
                return all(v == 0 for v in rel.values())
            return rel == 0

        return (
            a.count == 0
            and all(zero(r) for r in a.sums.values())
            and all(zero(r) for r in a.products.values())
        )

    def equal(self, a: GCPayload, b: GCPayload, rtol: float = 0.0, atol: float = 0.0) -> bool:
        def close(x: float, y: float) -> bool:
            return abs(x - y) <= atol + rtol * abs(y)

        def rel_eq(r1: Relation | None, r2: Relation | None) -> bool:
            d1 = r1 if isinstance(r1, dict) else {(): r1 if r1 is not None else 0.0}
            d2 = r2 if isinstance(r2, dict) else {(): r2 if r2 is not None else 0.0}
            if isinstance(r1, dict) != isinstance(r2, dict) and r1 is not None and r2 is not None:
                return False
            return all(close(d1.get(k, 0.0), d2.get(k, 0.0)) for k in set(d1) | set(d2))

        if not close(float(a.count), float(b.count)):
            return False
        if not all(rel_eq(a.sums.get(i), b.sums.get(i)) for i in set(a.sums) | set(b.sums)):
            return False
        return all(
            rel_eq(a.products.get(ij), b.products.get(ij))
            for ij in set(a.products) | set(b.products)
        )

    def lift(self, variable: str, value: Any) -> GCPayload:
        """``g_X(value)``; categorical values may be any hashable (codes in the batched face)."""
        if variable not in self._index:
            return self.one()
        i = self._index[variable]
        if i < self._p:
            x = self._check_continuous_scalar(variable, value)
            x = float(self._shifted(i, np.array([x]))[0])
            return self._normalize(GCPayload(1.0, {i: x}, {(i, i): x * x}))
        self._check_category(variable, value)
        if isinstance(value, np.integer):
            value = int(value)
        return GCPayload(1.0, {i: {value: 1.0}}, {(i, i): {value: 1.0}})

    @staticmethod
    def _check_continuous_scalar(variable: str, value: Any) -> float:
        if not _is_real_number(value) or not math.isfinite(float(value)):
            raise RingError(
                f"continuous variable {variable!r} needs a finite number, got {value!r}"
            )
        return float(value)

    @staticmethod
    def _check_category(variable: str, value: Any) -> None:
        bad = value is None or (isinstance(value, float) and math.isnan(value))
        if not bad:
            try:
                hash(value)
            except TypeError:
                bad = True
        if bad:
            raise RingError(
                f"categorical variable {variable!r} needs a hashable, non-null category, "
                f"got {value!r}"
            )

    # ------------------------------------------------------------- read-outs
    def entry(self, a: GCPayload, var_i: str | int, var_j: str | int | None = None) -> Relation:
        """The relation ``s_i`` (``var_j`` None) or ``Q_ij``: a float or a dict, in original
        units (the shifts undone).

        For two categorical variables the pair keys follow the argument order.
        """
        i = self.index(var_i)
        if min(i, i if var_j is None else self.index(var_j)) < self._p:
            a = self._moved(a, self._h())
        if var_j is None:
            rel = a.sums.get(i)
            if rel is None:
                return {} if i >= self._p else 0.0
            return dict(rel) if isinstance(rel, dict) else rel
        j = self.index(var_j)
        lo, hi = min(i, j), max(i, j)
        rel = a.products.get((lo, hi))
        schema = self._entry_schema(lo, hi)
        if rel is None:
            return {} if schema else 0.0
        if isinstance(rel, dict):
            if len(schema) == 2 and i > j:
                return {(k[1], k[0]): v for k, v in rel.items()}
            return dict(rel)
        return rel

    def count_tables(self, a: GCPayload) -> dict[tuple[str, ...], Any]:
        """Count tables keyed by variable-name tuples (categorical variables, global order).

        ``()`` -> C_∅ (the count, a float); ``(X,)`` -> ``{x: COUNT}`` (``s_X``); ``(X, Y)``
        -> ``{(x, y): COUNT}`` (``Q_XY``) for every pair ``X`` before ``Y`` in global order.
        """
        out: dict[tuple[str, ...], Any] = {(): float(a.count)}
        cat = range(self._p, self.degree)
        for j in cat:
            out[(self.variables[j],)] = dict(a.sums.get(j) or {})
        for j in cat:
            for k in cat:
                if j < k:
                    out[(self.variables[j], self.variables[k])] = dict(a.products.get((j, k)) or {})
        return out

    def to_dense(
        self,
        a: GCPayload,
        categories: Mapping[str, Sequence[Hashable]],
        shifted: bool = False,
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """``(count, sums, products)`` of the one-hot-expanded form, in original units
        (``shifted=True``: as stored, the moments of ``x − h``; :meth:`dense_shifts` gives
        ``h`` per column).

        Columns: the continuous variables in order, then for every categorical variable one
        column per category of ``categories[var]`` in that order.  A stored category missing
        from ``categories`` raises :class:`RingError`.
        """
        cols: list[dict[Hashable, int]] = []
        start = self._p
        for v in self.categorical:
            if v not in categories:
                raise RingError(f"to_dense needs the category list of {v!r}")
            cats = list(categories[v])
            pos = {c: start + t for t, c in enumerate(cats)}
            if len(pos) != len(cats):
                raise RingError(f"duplicate categories for {v!r}")
            cols.append(pos)
            start += len(cats)
        width = start

        def col(var: int, x: Hashable) -> int:
            pos = cols[var - self._p]
            if x not in pos:
                raise RingError(
                    f"category {x!r} of {self.variables[var]!r} is not in the given categories"
                )
            return pos[x]

        s = np.zeros(width)
        Q = np.zeros((width, width))
        for i, rel in a.sums.items():
            if i < self._p:
                s[i] = rel
            else:
                for x, v in rel.items():
                    s[col(i, x)] = v
        for (i, j), rel in a.products.items():
            if j < self._p:
                Q[i, j] = Q[j, i] = rel
            elif i < self._p:
                for x, v in rel.items():
                    c = col(j, x)
                    Q[i, c] = Q[c, i] = v
            elif i == j:
                for x, v in rel.items():
                    c = col(i, x)
                    Q[c, c] = v
            else:
                for (x, y), v in rel.items():
                    ci, cj = col(i, x), col(j, y)
                    Q[ci, cj] = Q[cj, ci] = v
        c = float(a.count)
        if not shifted and self._p:  # x = x' + h: s + c h, Q + s hᵀ + h sᵀ + c h hᵀ
            h = self.dense_shifts(width)
            cross = np.outer(s, h)
            Q += cross + cross.T + c * np.outer(h, h)
            s += c * h
        return c, s, Q

    def dense_shifts(self, width: int) -> np.ndarray:
        """The shift of every column of a :meth:`to_dense` layout ``width`` wide: ``h`` of
        the continuous variables (0 while open), 0 for the one-hot columns."""
        h = np.zeros(width)
        h[: self._p] = self._h()
        return h

    def statistics(
        self, a: GCPayload, categories: Mapping[str, Sequence[Hashable]], ddof: int = 0
    ) -> CovarianceStatistics:
        """Count, mean and covariance (population for ``ddof=0``) of the one-hot-expanded
        columns of :meth:`to_dense`, in original units.

        ``variables`` of the result labels the columns: the continuous variables' names, then
        ``(variable, category)``.  Centred from the shifted moments as ``Q'/c − (s'/c)(s'/c)ᵀ``
        (no cancellation against the shifts); negative rounding residue on the diagonal is
        clamped to 0; count 0 gives NaN.
        """
        count, s, Q = self.to_dense(a, categories, shifted=True)
        labels = self.continuous + tuple((v, x) for v in self.categorical for x in categories[v])
        c = int(round(count))
        if c == 0 or c - ddof == 0:
            nan = np.full(len(s), np.nan)
            return CovarianceStatistics(labels, c, nan, np.outer(nan, nan))
        centred = s / c
        cov = Q / c - np.outer(centred, centred)
        if ddof:
            cov *= c / (c - ddof)
        diag = np.arange(len(s))
        cov[diag, diag] = np.maximum(cov[diag, diag], 0.0)
        return CovarianceStatistics(labels, c, self.dense_shifts(len(s)) + centred, cov)

    # ----------------------------------------------------------------- batched face
    def _make(
        self,
        count: np.ndarray,
        sums: np.ndarray,
        prods: np.ndarray,
        rows: np.ndarray = _EMPTY_I,
        entry: np.ndarray = _EMPTY_I,
        key1: np.ndarray = _EMPTY_I,
        key2: np.ndarray = _EMPTY_I,
        value: np.ndarray = _EMPTY_F,
        coalesce: bool = True,
    ) -> GCBatch:
        if coalesce:
            rows, entry, key1, key2, value = self._coalesce(rows, entry, key1, key2, value)
        return GCBatch(count, sums, prods, rows, entry, key1, key2, value, self._config)

    def _coalesce(self, rows, entry, key1, key2, value):
        """Sort by (row, entry, key1, key2), sum duplicates, drop zeros."""
        if len(value) == 0:
            return _EMPTY_I, _EMPTY_I, _EMPTY_I, _EMPTY_I, _EMPTY_F
        re = rows * self.n_entries + entry
        merged = self._merge_keys(re, key1, key2)
        if merged is not None:  # one stable sort of one integer key (same order as lexsort)
            order = np.argsort(merged, kind="stable")
            merged = merged[order]
            rows, entry, key1, key2, value = (
                rows[order],
                entry[order],
                key1[order],
                key2[order],
                value[order],
            )
            new = np.empty(len(merged), dtype=bool)
            new[0] = True
            np.not_equal(merged[1:], merged[:-1], out=new[1:])
            if not new.all():
                starts = np.flatnonzero(new)
                value = np.add.reduceat(value, starts)
                rows, entry, key1, key2 = rows[starts], entry[starts], key1[starts], key2[starts]
            keep = value != 0
            if not keep.all():
                rows, entry, key1, key2 = rows[keep], entry[keep], key1[keep], key2[keep]
                value = value[keep]
            return rows, entry, key1, key2, value
        order = np.lexsort((key2, key1, re))
        re, key1, key2, value = re[order], key1[order], key2[order], value[order]
        new = np.empty(len(re), dtype=bool)
        new[0] = True
        np.not_equal(re[1:], re[:-1], out=new[1:])
        new[1:] |= key1[1:] != key1[:-1]
        new[1:] |= key2[1:] != key2[:-1]
        starts = np.flatnonzero(new)
        if len(starts) != len(value):
            value = np.add.reduceat(value, starts)
            re, key1, key2 = re[starts], key1[starts], key2[starts]
        keep = value != 0
        if not keep.all():
            re, key1, key2, value = re[keep], key1[keep], key2[keep], value[keep]
        rows, entry = np.divmod(re, self.n_entries)
        return rows, entry, key1, key2, value

    @staticmethod
    def _merge_keys(re: np.ndarray, key1: np.ndarray, key2: np.ndarray) -> np.ndarray | None:
        """``(re * K1 + key1) * K2 + key2``: one int64 that orders like ``(re, key1, key2)``,
        or None when some part is negative or the product of the ranges passes 2**63."""
        k1 = int(key1.max()) + 1
        k2 = int(key2.max()) + 1
        if min(int(re.min()), int(key1.min()), int(key2.min())) < 0:
            return None
        if (int(re.max()) + 1) * k1 * k2 >= 2**63:
            return None
        return (re * k1 + key1) * k2 + key2

    def _check_batch(self, a: GCBatch) -> None:
        if not isinstance(a, GCBatch):
            raise RingError(f"expected a GCBatch, got {type(a).__name__}")
        if a.config is not self._config and a.config != self._config:
            raise RingError(f"batch of {a.config} does not belong to {self!r}")

    def _check_aligned(self, a: GCBatch, b: GCBatch) -> None:
        self._check_batch(a)
        self._check_batch(b)
        if len(a) != len(b):
            raise RingError(f"batches of different lengths: {len(a)} and {len(b)}")

    def batch_zeros(self, n: int) -> GCBatch:
        return self._make(
            np.zeros(n), np.zeros((n, self._p)), np.zeros((n, self._packed)), coalesce=False
        )

    def batch_ones(self, n: int) -> GCBatch:
        b = self.batch_zeros(n)
        b.count[:] = 1.0
        return b

    def batch_accumulator(self, n: int, compensated: bool = True) -> GCBatch:
        """A zero batch to accumulate into, with TwoSum compensation of the dense continuous
        part when the ring is ``compensated`` and ``compensated`` is not False."""
        b = self._make(np.zeros(n), np.zeros((n, self._p)), np.zeros((n, 0)), coalesce=False)
        lo = None
        if self.compensated and compensated:
            b.sums_lo, lo = np.zeros_like(b.sums), np.zeros((n, 0))
        return b._compact(_EMPTY_I, b._prods, lo, self._packed)  # no product column yet

    def _fold(self, a: GCBatch) -> GCBatch:
        """A plain batch with the compensation folded in (``hi + lo``) and full products;
        ``a`` itself when it is one (operations other than take/scatter-add/clear/resize
        read accumulators so)."""
        if a.sums_lo is None and a.pcols is None:
            return a
        out = self.batch_take(a, np.arange(len(a)))
        out._full()
        return out

    def _folded(self, a: GCBatch) -> GCBatch:
        """``a`` with its compensation folded in (compact products stay compact)."""
        return a if a.sums_lo is None else self.batch_take(a, np.arange(len(a)))

    @staticmethod
    def _product_columns(a: GCBatch, cols: np.ndarray) -> np.ndarray:
        """``a.prods[:, cols]`` (a copy), compact or not: zeros for the columns a compact
        ``a`` does not hold (a product of two variables whose sums it holds can still have
        never received a nonzero value)."""
        if a.pcols is None:
            return a._prods[:, cols]
        at, found = _positions_in(a.pcols, cols)
        if found.all():
            return a._prods[:, at]
        out = np.zeros((len(a), len(cols)))
        out[:, found] = a._prods[:, at[found]]
        return out

    @staticmethod
    def _held_products(a: GCBatch) -> tuple[np.ndarray, np.ndarray]:
        """(packed positions, values) of the product columns ``a`` may hold nonzero: the
        compact form's columns, or a full batch's columns with a nonzero (or NaN) value."""
        if a.pcols is not None:
            return a.pcols, a._prods
        live = np.flatnonzero(a._prods.any(axis=0)) if len(a) else _EMPTY_I
        if len(live) == a._prods.shape[1]:
            return live, a._prods
        return live, a._prods[:, live]

    @staticmethod
    def _full_products(a: GCBatch) -> tuple[np.ndarray, np.ndarray | None]:
        """``a``'s (prods, prods_lo) as full arrays, without changing ``a``'s form."""
        if a.pcols is None:
            return a._prods, a._prods_lo
        out = []
        for part in (a._prods, a._prods_lo):
            full = None
            if part is not None:
                full = np.zeros((len(part), a._width))
                full[:, a.pcols] = part
            out.append(full)
        return out[0], out[1]

    @staticmethod
    def _widen(target: GCBatch, cols: np.ndarray) -> np.ndarray:
        """Make a compact ``target`` hold the product columns ``cols`` too (zero where new);
        where ``cols`` are among its columns."""
        held = target.pcols
        at, found = _positions_in(held, cols)
        if found.all():
            return at
        union = np.union1d(held, cols)
        old = np.searchsorted(union, held)
        for name in ("_prods", "_prods_lo"):
            part = getattr(target, name)
            if part is not None:
                wide = np.zeros((len(part), len(union)))
                wide[:, old] = part
                setattr(target, name, wide)
        target.pcols = union
        return np.searchsorted(union, cols)

    def batch_from(self, elements: Sequence[GCPayload]) -> GCBatch:
        n = len(elements)
        count = np.zeros(n)
        sums = np.zeros((n, self._p))
        prods = np.zeros((n, self._packed))
        rows: list[int] = []
        ent: list[int] = []
        k1: list[int] = []
        k2: list[int] = []
        val: list[float] = []
        p = self._p

        def code(x: Any, where: str) -> int:
            if isinstance(x, numbers.Integral) and not isinstance(x, bool | np.bool_):
                return int(x)
            raise RingError(f"{where}: the batched face needs integer category codes, got {x!r}")

        for r, a in enumerate(elements):
            if not isinstance(a, GCPayload):
                raise RingError(f"expected a GCPayload, got {type(a).__name__}")
            self._check_indices(a)
            count[r] = a.count
            for i, rel in a.sums.items():
                if i < p:
                    sums[r, i] = self._norm_entry(rel, (), f"s[{i}]")
                    continue
                e = i - p
                for x, v in self._norm_entry(rel, (i,), f"s[{i}]").items():
                    rows.append(r), ent.append(e), k1.append(code(x, f"s[{i}]"))
                    k2.append(0), val.append(v)
            for (i, j), rel in a.products.items():
                if j < p:
                    prods[r, self._pack_pos[i, j]] = self._norm_entry(rel, (), f"Q[{i},{j}]")
                    continue
                where = f"Q[{i},{j}]"
                if i < p:
                    e = self._off_x + i * self._q + (j - p)
                    items = self._norm_entry(rel, (j,), where).items()
                    pairs = [(code(x, where), 0, v) for x, v in items]
                elif i == j:
                    e = self._off_d + (i - p)
                    items = self._norm_entry(rel, (i,), where).items()
                    pairs = [(code(x, where), 0, v) for x, v in items]
                else:
                    e = int(self._pair_id[i - p, j - p])
                    items = self._norm_entry(rel, (i, j), where).items()
                    pairs = [(code(x, where), code(y, where), v) for (x, y), v in items]
                for x, y, v in pairs:
                    rows.append(r), ent.append(e), k1.append(x), k2.append(y), val.append(v)
        return self._make(
            count,
            sums,
            prods,
            np.asarray(rows, dtype=np.int64),
            np.asarray(ent, dtype=np.int64),
            np.asarray(k1, dtype=np.int64),
            np.asarray(k2, dtype=np.int64),
            np.asarray(val, dtype=np.float64),
        )

    def _row_ptr(self, a: GCBatch) -> np.ndarray:
        return np.searchsorted(a.rows, np.arange(len(a) + 1, dtype=np.int64))

    def batch_to_list(self, batch: GCBatch) -> list[GCPayload]:
        self._check_batch(batch)
        batch = self._fold(batch)
        n = len(batch)
        counts = batch.count.tolist()
        sums_l = batch.sums.tolist()
        prods_l = batch.prods.tolist()
        iu, ju = self._iu.tolist(), self._ju.tolist()
        ptr = self._row_ptr(batch).tolist()
        ent, k1, k2, val = (x.tolist() for x in (batch.entry, batch.key1, batch.key2, batch.value))
        kind, gi, gj = self._kind_l, self._gi_l, self._gj_l
        out = []
        for r in range(n):
            sums: dict[int, Relation] = {i: v for i, v in enumerate(sums_l[r]) if v != 0}
            prods: dict[tuple[int, int], Relation] = {
                (iu[t], ju[t]): v for t, v in enumerate(prods_l[r]) if v != 0
            }
            for t in range(ptr[r], ptr[r + 1]):
                e = ent[t]
                kd = kind[e]
                if kd == 0:
                    sums.setdefault(gi[e], {})[k1[t]] = val[t]
                elif kd == 3:
                    prods.setdefault((gi[e], gj[e]), {})[(k1[t], k2[t])] = val[t]
                else:
                    prods.setdefault((gi[e], gj[e]), {})[k1[t]] = val[t]
            out.append(
                GCPayload(counts[r], dict(sorted(sums.items())), dict(sorted(prods.items())))
            )
        return out

    def batch_len(self, batch: GCBatch) -> int:
        return len(batch.count)

    def batch_take(self, batch: GCBatch, index: np.ndarray) -> GCBatch:
        self._check_batch(batch)
        n = len(batch)
        try:
            idx = np.arange(n, dtype=np.int64)[np.asarray(index)]
        except IndexError as exc:
            raise RingError(f"batch_take: bad index for a batch of {n}: {exc}") from None
        idx = np.atleast_1d(idx).astype(np.int64, copy=False)
        d = batch._deferred
        if d is not None:
            return self._take_deferred(batch, d, idx)
        rows = batch._rows
        lo = np.searchsorted(rows, idx)
        owner, pos = _ranges(lo, np.searchsorted(rows, idx + 1) - lo)
        out = self._make(
            batch.count[idx],
            *self._take_dense(batch, idx),
            owner,
            batch._entry[pos],
            batch._key1[pos],
            batch._key2[pos],
            batch._value[pos],
            coalesce=False,
        )
        if batch.pcols is not None:
            out._compact(batch.pcols, out._prods, None, batch._width)
        return out

    def _take_deferred(self, batch: GCBatch, d: _Deferred, idx: np.ndarray) -> GCBatch:
        """:meth:`batch_take` from a deferred table: the taken rows' ranges of both runs
        (the main run's from its cached row starts), re-keyed to the new rows.  The result
        keeps the deferred form (its main and pending runs, zeros and all), so a taken
        table is neither merged, filtered nor decoded until someone reads it."""
        m = len(idx)
        ptr = d.row_starts(len(batch))
        out = self._make(batch.count[idx], *self._take_dense(batch, idx), coalesce=False)
        if batch.pcols is not None:
            out._compact(batch.pcols, out._prods, None, batch._width)
        parts = []
        for run_key, run_value, lo, hi in (
            (d.mkey, d.mval, ptr[idx], ptr[idx + 1]),
            (d.pkey, d.pval, None, None),
        ):
            if lo is None:
                if not len(run_key):
                    parts.append((_EMPTY_I, _EMPTY_I, _EMPTY_F))
                    continue
                lo = np.searchsorted(run_key, idx * d.span)
                hi = np.searchsorted(run_key, (idx + 1) * d.span)
            owner, pos = _ranges(lo, hi - lo)
            parts.append((owner, pos, run_value[pos]))
        zeros = 0
        if d.zeros:
            zeros = sum(int(np.count_nonzero(v == 0)) for _, _, v in parts)
        if m * d.span >= 2**63:  # keys of m rows do not fit in 63 bits: plain columns
            columns = []
            for (owner, pos, value), run_key in zip(parts, (d.mkey, d.pkey), strict=True):
                keep = value != 0
                owner, pos, value = owner[keep], pos[keep], value[keep]
                columns.append((owner, run_key[pos] - idx[owner] * d.span, value))
            owner, local, value = (np.concatenate(c) for c in zip(*columns, strict=True))
            order = np.lexsort((local, owner))
            owner, local, value = owner[order], local[order], value[order]
            entry, key1, key2 = d.decode_local(local)
            out.rows, out.entry, out.key1, out.key2, out.value = owner, entry, key1, key2, value
            return out
        # key - moved[owner] re-keys an entry of row idx[owner] to row owner
        moved = (idx - np.arange(m, dtype=np.int64)) * d.span
        (mo, mp, mv), (po, pp, pv) = parts
        taken = _Deferred(d.e, d.k1, d.k2, d.mkey[mp] - moved[mo], mv)
        taken.rows = mo
        if len(po):
            taken.pkey, taken.pval = d.pkey[pp] - moved[po], pv
        taken.zeros = zeros
        out._deferred = taken
        return out

    @staticmethod
    def _take_dense(batch: GCBatch, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``sums[idx]`` and the held products' rows ``idx`` (compact if ``batch`` is),
        compensation added (``np.take`` gathers rows faster than indexing)."""
        sums, prods = np.take(batch.sums, idx, axis=0), np.take(batch._prods, idx, axis=0)
        if batch.sums_lo is not None:
            sums += np.take(batch.sums_lo, idx, axis=0)
            prods += np.take(batch._prods_lo, idx, axis=0)
        return sums, prods

    def batch_concat(self, batches: Sequence[GCBatch]) -> GCBatch:
        batches = list(batches)
        if not batches:
            return self.batch_zeros(0)
        for b in batches:
            self._check_batch(b)
        batches = [self._fold(b) for b in batches]
        offsets = np.cumsum([0] + [len(b) for b in batches[:-1]])
        return self._make(
            np.concatenate([b.count for b in batches]),
            np.concatenate([b.sums for b in batches]),
            np.concatenate([b.prods for b in batches]),
            np.concatenate([b.rows + o for b, o in zip(batches, offsets, strict=True)]),
            np.concatenate([b.entry for b in batches]),
            np.concatenate([b.key1 for b in batches]),
            np.concatenate([b.key2 for b in batches]),
            np.concatenate([b.value for b in batches]),
            coalesce=False,
        )

    def batch_add(self, a: GCBatch, b: GCBatch) -> GCBatch:
        self._check_aligned(a, b)
        a, b = self._fold(a), self._fold(b)
        return self._make(
            a.count + b.count,
            a.sums + b.sums,
            a.prods + b.prods,
            np.concatenate([a.rows, b.rows]),
            np.concatenate([a.entry, b.entry]),
            np.concatenate([a.key1, b.key1]),
            np.concatenate([a.key2, b.key2]),
            np.concatenate([a.value, b.value]),
        )

    def batch_neg(self, a: GCBatch) -> GCBatch:
        self._check_batch(a)
        a = self._fold(a)
        return GCBatch(
            -a.count, -a.sums, -a.prods, a.rows, a.entry, a.key1, a.key2, -a.value, self._config
        )

    def batch_scale(self, a: GCBatch, k: np.ndarray) -> GCBatch:
        self._check_batch(a)
        k = np.asarray(k)
        if k.shape != (len(a),):
            raise RingError(f"batch_scale: need {len(a)} multiplicities, got shape {k.shape}")
        a = self._fold(a)
        kf = k.astype(np.float64)
        value = a.value * kf[a.rows]
        keep = value != 0
        return GCBatch(
            a.count * kf,
            a.sums * kf[:, None],
            a.prods * kf[:, None],
            a.rows[keep],
            a.entry[keep],
            a.key1[keep],
            a.key2[keep],
            value[keep],
            self._config,
        )

    def batch_mul(self, a: GCBatch, b: GCBatch) -> GCBatch:
        self._check_aligned(a, b)
        a, b = self._fold(a), self._fold(b)
        p, q = self._p, self._q
        ca, cb = a.count, b.count
        count = ca * cb
        sums = cb[:, None] * a.sums + ca[:, None] * b.sums
        iu, ju = self._iu, self._ju
        prods = (
            cb[:, None] * a.prods
            + ca[:, None] * b.prods
            + a.sums[:, iu] * b.sums[:, ju]
            + b.sums[:, iu] * a.sums[:, ju]
        )
        parts: list[tuple[np.ndarray, ...]] = []
        # c_b ⊗ (entries of a) and c_a ⊗ (entries of b)
        for x, c in ((a, cb), (b, ca)):
            if x.nnz:
                v = x.value * c[x.rows]
                parts.append((x.rows, x.entry, x.key1, x.key2, v))
        if q and (a.nnz or b.nnz):
            sa = a.entry < q  # s_j entries (entry id == categorical position)
            sb = b.entry < q
            A = (a.rows[sa], a.entry[sa], a.key1[sa], a.value[sa])
            B = (b.rows[sb], b.entry[sb], b.key1[sb], b.value[sb])
            # continuous s_i (dense) ⊗ categorical s_j: Q_ij keyed by x_j
            if p:
                for (rows, var, key, val), other in ((A, b.sums), (B, a.sums)):
                    if len(val):
                        m = other[rows] * val[:, None]
                        t, i = np.nonzero(m)
                        parts.append(
                            (
                                rows[t],
                                self._off_x + i * q + var[t],
                                key[t],
                                np.zeros_like(t),
                                m[t, i],
                            )
                        )
            if len(A[0]) and len(B[0]):
                parts.extend(self._cat_cross(A, B, len(a)))
        if parts:
            cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
            return self._make(count, sums, prods, *cols)
        return self._make(count, sums, prods, coalesce=False)

    def _cat_cross(self, A, B, n: int) -> list[tuple[np.ndarray, ...]]:
        """``s_a s_b^T + s_b s_a^T`` restricted to categorical entries, per row.

        A pair (A entry over u, B entry over v) with ``u != v`` is the term of ``Q_{min,max}``
        keyed by the two categories (Cartesian product of the row's lists, built with
        repeat/offset arithmetic); ``u == v`` is the join on that variable: only equal
        categories meet, contributing ``2 * va * vb`` to ``Q_uu``.
        """
        q = self._q
        ar, av, ak, aval = A
        br, bv, bk, bval = B
        out = []
        # both sides are sorted by (row, var, key)
        a_rv = ar * q + av
        b_rv = br * q + bv
        b_ptr = np.searchsorted(br, np.arange(n + 1, dtype=np.int64))
        lo = np.searchsorted(b_rv, a_rv, side="left")
        hi = np.searchsorted(b_rv, a_rv, side="right")
        row_lo, row_hi = b_ptr[ar], b_ptr[ar + 1]
        for starts, lengths in ((row_lo, lo - row_lo), (hi, row_hi - hi)):
            owner, pos = _ranges(starts, lengths)
            if not len(owner):
                continue
            u, v = av[owner], bv[pos]
            xu, xv = ak[owner], bk[pos]
            first = u < v
            ent = self._pair_id[u, v]
            k1 = np.where(first, xu, xv)
            k2 = np.where(first, xv, xu)
            out.append((ar[owner], ent, k1, k2, aval[owner] * bval[pos]))
        # same variable: natural join on it
        if (hi > lo).any():
            rv = np.concatenate([a_rv, b_rv])
            key = np.concatenate([ak, bk])
            side = np.concatenate([np.zeros(len(a_rv), np.int8), np.ones(len(b_rv), np.int8)])
            order = np.lexsort((side, key, rv))
            rv_s, key_s, side_s = rv[order], key[order], side[order]
            hit = (rv_s[1:] == rv_s[:-1]) & (key_s[1:] == key_s[:-1]) & (side_s[:-1] == 0)
            t = np.flatnonzero(hit)
            if len(t):
                ia = order[t]
                ib = order[t + 1] - len(a_rv)
                out.append(
                    (
                        ar[ia],
                        self._off_d + av[ia],
                        ak[ia],
                        np.zeros_like(ia),
                        2.0 * aval[ia] * bval[ib],
                    )
                )
        return out

    def batch_sum_by(self, a: GCBatch, groups: np.ndarray, n_groups: int) -> GCBatch:
        self._check_batch(a)
        groups = np.asarray(groups)
        if groups.shape != (len(a),):
            raise RingError(f"batch_sum_by: need {len(a)} group ids, got shape {groups.shape}")
        groups = groups.astype(np.int64, copy=False)
        if len(groups) and (groups.min() < 0 or groups.max() >= n_groups):
            raise RingError(f"batch_sum_by: group ids must lie in [0, {n_groups})")
        a = self._fold(a)
        return self._make(
            _scatter_rows(a.count, groups, n_groups),
            _scatter_rows(a.sums, groups, n_groups),
            _scatter_rows(a.prods, groups, n_groups),
            groups[a.rows],
            a.entry,
            a.key1,
            a.key2,
            a.value,
        )

    def batch_mul_sum(
        self, factors: Sequence[GCBatch], groups: np.ndarray | None = None, n_groups: int = 1
    ) -> GCBatch:
        """``sum_by(f_1 * ... * f_k, groups)``.  When the factors hold disjoint variables (as
        the siblings of an F-IVM view always do) the product is not built factor by factor
        with a sort of the growing table after every step: :meth:`_fused_mul_sum` computes
        every entry of every row with the same floating-point operations in the same order
        as the stepwise products, then sorts and sums the entries once, so the result is
        the same bit for bit."""
        factors = list(factors)
        if len(factors) > 1:
            out = self._fused_mul_sum(factors, groups, n_groups)
            if out is not None:
                return out
        return super().batch_mul_sum(factors, groups, n_groups)

    def _factor_table(self, f: GCBatch) -> _Table | None:
        """A factor's sparse table, row-major, as keys ``(entry * K1 + key1) * K2 + key2``
        in powers of two ``K1``/``K2``: a taken deferred table as it is (no decoding), a
        plain one packed; None when empty, ValueError when a code is negative."""
        d = f._deferred
        if d is not None and _pow2(d.k1) and _pow2(d.k2):
            # zero entries may stay: every term they make is zero, and zeros are dropped
            key, value = d.mkey, d.mval
            rows = d.rows if d.rows is not None else key // d.span
            if len(d.pkey):  # pending entries merged into their rows
                key, value, rows = _merge_runs(
                    [key, value, rows], [d.pkey, d.pval, d.pkey // d.span], key, d.pkey
                )
            if not len(key):
                return None
            return _Table(rows, key - rows * d.span, value, d.k1, d.k2, d.e)
        if not f.nnz:
            return None
        key1, key2 = f.key1, f.key2
        if min(int(key1.min()), int(key2.min())) < 0:
            raise ValueError("negative category code")
        k = 1 << max(max(int(key1.max()), int(key2.max())).bit_length(), 1)
        return _Table(f.rows, (f.entry * k + key1) * k + key2, f.value, k, k, self.n_entries)

    def _owned_variables(self, f: GCBatch, table: _Table | None) -> tuple[np.ndarray, np.ndarray]:
        """(continuous, categorical) boolean masks of the variables a plain batch touches:
        a nonzero dense sum or product, or a sparse entry over it."""
        p, q = self._p, self._q
        cont = f.sums.any(axis=0) if len(f) else np.zeros(p, dtype=bool)
        if self._packed and len(f):
            cols, held = self._held_products(f)
            touched = cols[held.any(axis=0)] if len(cols) else _EMPTY_I
            cont[self._iu[touched]] = True
            cont[self._ju[touched]] = True
        cat = np.zeros(q, dtype=bool)
        if table is not None:
            entries = table.local >> table.shift
            present = np.flatnonzero(np.bincount(entries, minlength=self.n_entries))
            gi, gj = self._gi[present], self._gj[present]
            cat[gj - p] = True
            is_cat = gi >= p
            cat[gi[is_cat] - p] = True
            cont[gi[~is_cat]] = True
        return cont, cat

    def _fused_mul_sum(
        self, factors: list[GCBatch], groups: np.ndarray | None, n_groups: int
    ) -> GCBatch | None:
        """:meth:`batch_mul_sum` of factors over pairwise disjoint variables, or None (the
        caller multiplies step by step) when they share one, when the result is not finite
        or when codes do not pack into one 63-bit key.

        ``reduce(batch_mul, factors)`` multiplies the running product ``A`` by ``f_w``: ``A``'s
        terms are scaled by ``c_w``, ``f_w``'s by ``A``'s count, and the cross terms ``s_A
        s_w^T + s_w s_A^T`` are born.  With disjoint variables every dense coordinate and
        every sparse key of a row gets exactly one nonzero term (the others are products
        with zeros), so each term is followed from its birth through the same sequence of
        multiplications, block by block: the continuous products per factor and per pair of
        factors, each factor's sparse entries, ``SUM(X_i) GROUP BY X_j`` born at a step,
        the category pairs born at a step.  A block keeps its terms in key order (rows
        ascending within a key), as the stepwise product's final stable sort would put them,
        and is summed on its own with the same ``reduceat`` (zeros dropped first: a term
        that became zero stays zero when multiplied by finite counts); the dense part is
        summed with :meth:`batch_sum_by`'s bincount.  A non-finite term would make its
        sum non-finite, and only then can the stepwise product's products with zeros
        differ: such results are left to it.  Category pairs whose terms are all integers
        below 2**53 are summed as one small matrix product (exact, so in any order)."""
        for f in factors:
            self._check_batch(f)
        n = len(factors[0])
        if any(len(f) != n for f in factors):
            return None
        if groups is not None:
            groups = np.asarray(groups)
            if groups.shape != (n,):
                return None
            groups = groups.astype(np.int64, copy=False)
            if n and (groups.min() < 0 or groups.max() >= n_groups):
                return None
        else:
            n_groups = 1
        fs = [self._folded(f) for f in factors]  # compact products stay compact
        p, q = self._p, self._q
        try:
            raw_tables = [self._factor_table(f) for f in fs]
        except ValueError:
            return None
        cont_owner = np.zeros(p, dtype=bool)
        cat_owner = np.zeros(q, dtype=bool)
        owned: list[np.ndarray] = []
        own_pos: list[np.ndarray] = []
        width = 1
        for f, tb in zip(fs, raw_tables, strict=True):
            cont, cat = self._owned_variables(f, tb)
            if (cont_owner & cont).any() or (cat_owner & cat).any():
                return None
            cont_owner |= cont
            cat_owner |= cat
            owned.append(np.flatnonzero(cont))
            own_pos.append(np.flatnonzero(cont[self._iu] & cont[self._ju]))
            if tb is not None:
                width = max(width, tb.k1, tb.k2)
        # result keys: group * span + (entry * width + key1) * width + key2
        span = self.n_entries * width * width
        if n_groups * span >= 2**63 or any(
            tb is not None and n_groups * tb.span >= 2**63 for tb in raw_tables
        ):
            return None
        ww = width * width
        unit = [bool((f.count == 1).all()) for f in fs]  # multiplying by them changes nothing
        before: list[np.ndarray | None] = [None]  # before[w]: A's count when f_w comes
        running = fs[0].count
        for f in fs[1:]:
            before.append(running)
            running = running * f.count
        before_one = [False] + [bool((c == 1).all()) for c in before[1:]]

        # terms by block, with the step that bore them: [step, positions, (n, m) values],
        # [step, rows, key, values, table] (key-grouped; table: the packing of key, None
        # for result keys), [step, s rows, s keys, columns, (m, ns)]
        dense: list[list] = []
        tables: list[list] = []
        cross: list[list] = []
        reduced: list[tuple[np.ndarray, np.ndarray]] = []  # (result keys, sums) done
        sums: list[np.ndarray] = []  # per factor, its running continuous sums
        a_rows, a_key, a_val = _EMPTY_I, _EMPTY_I, _EMPTY_F  # A's s_j entries, running
        count = fs[0].count
        for w, f in enumerate(fs):
            mine = owned[w]
            raw = f.sums[:, mine]
            tb = raw_tables[w]
            s_rows, s_key, s_val = _EMPTY_I, _EMPTY_I, _EMPTY_F
            if tb is not None:
                # f_w's own entries: scaled in row order by A's count and every later count
                # (their whole life, known now), then sorted by key and summed
                value = tb.value
                scale = [before[w]] if w and not before_one[w] else []
                scale += [g.count for u, g in enumerate(fs[w + 1 :], w + 1) if not unit[u]]
                for i, c in enumerate(scale):
                    if i == 0:
                        value = value * c[tb.rows]
                    else:
                        np.multiply(value, c[tb.rows], out=value)
                key = tb.local
                if groups is not None:
                    key = key + groups[tb.rows] * tb.span
                order = _stable_argsort(key)
                key = key[order]
                reduced.append(self._table_sums(key, value[order], tb, span, width))
                local = key % tb.span if groups is not None else key
                is_s = local < q * tb.k1 * tb.k2
                if is_s.any():  # f_w's s_j entries in key order (raw), keyed as results
                    at = order[is_s]
                    s_rows, s_val = tb.rows[at], tb.value[at]
                    local = local[is_s]
                    s_key = ((local >> tb.shift) * width + ((local >> tb.b2) & (tb.k1 - 1))) * width
                    if groups is not None:
                        s_key += groups[s_rows] * span
            if w == 0:
                sums.append(raw)
                if len(own_pos[0]):
                    dense.append([0, own_pos[0], self._product_columns(f, own_pos[0])])
                a_rows, a_key, a_val = s_rows, s_key, s_val
                continue
            ca, cb = count, f.count
            if len(mine):
                for t in range(w):  # continuous s_t s_w^T
                    if len(owned[t]):
                        at = self._pack_pos[owned[t][:, None], mine[None, :]].ravel()
                        cross_sums = sums[t][:, :, None] * raw[:, None, :]
                        dense.append([w, at, cross_sums.reshape(n, -1)])
                if len(a_rows):  # SUM(X_i) GROUP BY X_j: A's s_j times f_w's sums
                    m = np.take(np.ascontiguousarray(raw.T), a_rows, axis=1)
                    cross.append([w, a_rows, a_key, mine, np.multiply(m, a_val, out=m)])
            if len(s_rows):
                earlier = np.concatenate(owned[:w])
                if len(earlier):  # f_w's s_j times A's running sums
                    cols = np.ascontiguousarray(np.concatenate(sums, axis=1).T)
                    m = np.take(cols, s_rows, axis=1)
                    cross.append([w, s_rows, s_key, earlier, np.multiply(m, s_val, out=m)])
                if len(a_rows):  # category pairs of a row: A's s_j times f_w's s_k
                    summed = None
                    if groups is None:
                        later = [g.count for g in fs[w + 1 :]]
                        summed = self._pairs_exact(
                            a_key, a_rows, a_val, s_rows, s_key, s_val, later, n, width
                        )
                    if summed is not None:
                        reduced.append(summed)
                    else:
                        pairs = self._pair_block(a_rows, a_key, a_val, tb, n, width, span, groups)
                        if pairs is not None:
                            tables.append([w, *pairs])
            # the running state moves to A * f_w (x * 1.0 is x: all-one counts skipped)
            ca_one = bool((ca == 1).all())
            if not unit[w]:
                sums = [cb[:, None] * s for s in sums]
                a_val = a_val * cb[a_rows]
            sums.append(raw if ca_one else ca[:, None] * raw)
            if not ca_one:
                s_val = s_val * ca[s_rows]
            a_rows, a_key, a_val = (
                np.concatenate(c) for c in ((a_rows, s_rows), (a_key, s_key), (a_val, s_val))
            )
            if not a_val.all():  # s_j entries that became zero leave the product
                live = a_val != 0
                a_rows, a_key, a_val = a_rows[live], a_key[live], a_val[live]
            if len(own_pos[w]):
                own = self._product_columns(f, own_pos[w])
                if not ca_one:
                    np.multiply(own, ca[:, None], out=own)
                dense.append([w, own_pos[w], own])
            count = ca * cb

        # every term scaled by the counts of the factors after its birth, in order
        k = len(fs)
        for block in dense:
            v = block[2]
            for w in range(block[0] + 1, k):
                if not unit[w]:
                    np.multiply(v, fs[w].count[:, None], out=v)
        for block in tables:
            rows, v = block[1], block[3]
            for w in range(block[0] + 1, k):
                if not unit[w]:
                    np.multiply(v, fs[w].count[rows], out=v)
        for block in cross:
            rows, v = block[1], block[4]
            for w in range(block[0] + 1, k):
                if not unit[w]:
                    np.multiply(v, fs[w].count[rows], out=v)

        # dense part summed per group as batch_sum_by does (per column, rows in order)
        g_rows = groups if groups is not None else np.zeros(n, dtype=np.int64)
        out_count = _scatter_rows(count, g_rows, n_groups)
        out_sums = np.zeros((n_groups, p))
        out_prods = np.zeros((n_groups, self._packed))
        for out, blocks in (
            (out_sums, [(mine, s) for mine, s in zip(owned, sums, strict=True) if len(mine)]),
            (out_prods, [(at, v) for _, at, v in dense]),
        ):
            if not blocks:
                continue
            at = np.concatenate([at for at, _ in blocks])  # every block side by side
            out[:, at] = _scatter_rows(np.hstack([v for _, v in blocks]), g_rows, n_groups)
        if not (
            math.isfinite(out_count.sum())
            and math.isfinite(out_sums.sum())
            and math.isfinite(out_prods.sum())
        ):
            return None

        # sparse part: every block summed per key, then the blocks' keys merged
        keys: list[np.ndarray] = [key for key, _ in reduced]
        values: list[np.ndarray] = [v for _, v in reduced]
        for _, _, key, v in tables:
            key, v = _sum_runs(key, v)
            keys.append(key)
            values.append(v)
        for _, _, s_key, cols, m in cross:
            key, v = self._sum_cross(s_key, cols, m, span, width)
            keys.append(key)
            values.append(v)
        key = np.concatenate(keys) if keys else _EMPTY_I
        if not len(key):
            return self._make(out_count, out_sums, out_prods, coalesce=False)
        value = np.concatenate(values)
        if not math.isfinite(value.sum()):
            return None
        order = np.argsort(key, kind="stable")
        key, value = key[order], value[order]
        g, rest = np.divmod(key, span)
        entry, rest = np.divmod(rest, ww)
        key1, key2 = np.divmod(rest, width)
        return self._make(
            out_count, out_sums, out_prods, g, entry, key1, key2, value, coalesce=False
        )

    @staticmethod
    def _table_sums(key, value, tb: _Table, span: int, width: int):
        """A factor's own entries summed per key (``key`` sorted, in ``tb``'s packing plus
        the group): (result keys, sums)."""
        key, value = _sum_runs(key, value)
        g, local = np.divmod(key, tb.span)
        key = g * span + (
            ((local >> tb.shift) * width + ((local >> tb.b2) & (tb.k1 - 1))) * width
            + (local & (tb.k2 - 1))
        )
        return key, value

    def _sum_cross(self, s_key, cols, m, span: int, width: int):
        """Sums of ``SUM(X_i) GROUP BY X_j`` terms ``m[c, s]`` (continuous ``cols[c]``, s_j
        entry ``s`` with packed key ``s_key[s]``, equal keys adjacent, rows ascending) per
        (column, s_j key): packed keys and nonzero sums, zero terms dropped first."""
        ns = len(s_key)
        n_cols = len(cols)
        run = np.empty(ns, dtype=bool)
        run[0] = True
        np.not_equal(s_key[1:], s_key[:-1], out=run[1:])
        starts = np.flatnonzero(run)  # runs of one s_j key, the same in every column
        n_runs = len(starts)
        flat = m.ravel()
        bounds = (np.arange(n_cols, dtype=np.int64)[:, None] * ns + starts).ravel()
        live = flat != 0
        if not live.all():  # where each run starts among the nonzero terms
            counts = np.add.reduceat(live, bounds, dtype=np.int64)
            flat = flat[live]
            index = np.flatnonzero(counts)
            bounds = (np.cumsum(counts) - counts)[index]
        else:
            index = np.arange(len(bounds), dtype=np.int64)
        if not len(flat):
            return _EMPTY_I, _EMPTY_F
        sums = np.add.reduceat(flat, bounds)
        nz = sums != 0
        if not nz.all():
            sums, index = sums[nz], index[nz]
        c, r = np.divmod(index, n_runs)
        first = s_key[starts[r]]
        g, rest = np.divmod(first, span)
        j, rest = np.divmod(rest, width * width)
        code = rest // width
        key = g * span + ((self._off_x + cols[c] * self._q + j) * width + code) * width
        return key, sums

    def _pairs_exact(self, a_key, a_rows, a_val, s_rows, s_key, s_val, later, n, width):
        """Category pairs ``s_A[j] ⊗ s_w[k]`` of the same row, times the counts of the
        factors after ``f_w`` (``later``), summed over all rows as one product of two small
        dense matrices (rows x A's s_j keys, rows x f_w's s_k keys); (packed keys, sums), or
        None unless every term and partial sum is an integer below 2**53, where any order
        of the additions gives the same exact sums as the stepwise product's."""
        scale = np.ones(n)
        for c in later:
            scale = scale * c
        top = float(np.abs(scale).max()) if n else 0.0
        a_top, s_top = float(np.abs(a_val).max()), float(np.abs(s_val).max())
        if top * a_top * s_top * n >= 2.0**53:
            return None
        for x in [a_val, s_val, scale]:
            if not np.array_equal(np.rint(x), x):
                return None
        ids = []
        for key in (a_key, s_key):
            run = np.empty(len(key), dtype=bool)
            run[0] = True
            np.not_equal(key[1:], key[:-1], out=run[1:])
            ids.append((np.cumsum(run) - 1, key[run]))
        (a_id, a_first), (s_id, s_first) = ids
        left = np.zeros((n, len(a_first)))
        left[a_rows, a_id] = a_val
        right = np.zeros((n, len(s_first)))
        right[s_rows, s_id] = s_val * scale[s_rows]
        total = left.T @ right
        ia, isw = np.nonzero(total)
        if not len(ia):
            return _EMPTY_I, _EMPTY_F
        ww = width * width
        ju, xu = np.divmod(a_first[ia], ww)
        jw, xw = np.divmod(s_first[isw], ww)
        xu //= width
        xw //= width
        first = ju < jw
        key = (self._pair_id[ju, jw] * width + np.where(first, xu, xw)) * width
        key += np.where(first, xw, xu)
        return key, total[ia, isw]

    def _pair_block(self, a_rows, a_key, a_val, tb: _Table, n, width, span, groups):
        """Category pairs ``s_A[j] ⊗ s_w[k]`` of the same row, ``A``'s s_j entries key-grouped
        (rows ascending within a key), ``f_w``'s from its row-major table ``tb``: a table
        [rows, result key, value] sorted by key (the pairs of one key come in row order),
        or None."""
        is_s = tb.local < self._q * tb.k1 * tb.k2
        w_rows, local, w_val = tb.rows[is_s], tb.local[is_s], tb.value[is_s]
        ptr = np.searchsorted(w_rows, np.arange(n + 1, dtype=np.int64))
        owner, at = _ranges(ptr[a_rows], ptr[a_rows + 1] - ptr[a_rows])
        if not len(owner):
            return None
        ju, xu = np.divmod(a_key[owner] % span, width * width)
        xu //= width
        jw = local[at] >> tb.shift
        xw = (local[at] >> tb.b2) & (tb.k1 - 1)
        first = ju < jw
        key = (self._pair_id[ju, jw] * width + np.where(first, xu, xw)) * width
        key += np.where(first, xw, xu)
        rows = a_rows[owner]
        if groups is not None:
            key += groups[rows] * span
        order = _stable_argsort(key)
        return [rows[order], key[order], (a_val[owner] * w_val[at])[order]]

    def batch_scatter_add(self, target: GCBatch, slots: np.ndarray, values: GCBatch) -> GCBatch:
        """``target[slots] += values`` in place: dense rows added, sparse tables merged.

        The sparse delta goes into ``target``'s deferred table (:class:`_Deferred`): the
        cost follows the delta, not the stored table, up to the occasional settling of the
        pending run into the main one.  A compensated ``target`` adds the dense continuous
        part by TwoSum into ``hi``/``lo``."""
        self._check_batch(target)
        self._check_batch(values)
        values = self._folded(values)
        slots = np.asarray(slots, dtype=np.int64)
        if slots.shape != (len(values),):
            raise RingError(f"batch_scatter_add: need {len(values)} slots, got {slots.shape}")
        n = len(target)
        if len(slots) and (slots.min() < 0 or slots.max() >= n):
            raise RingError(f"batch_scatter_add: slots must lie in [0, {n})")
        self._check_overflow(values)  # before any change: the target stays as it was
        if not _distinct(slots, n):
            # repeated slots: fall back to scatter-add by sum_by
            values = self.batch_sum_by(values, slots, n)
            slots = np.arange(n, dtype=np.int64)
        target.count[slots] += values.count
        if target.pcols is None:
            prods, target_prods, target_lo = values.prods, target._prods, target._prods_lo
            pos = None
        else:  # compact: only the columns values may hold (the others add zeros)
            cols, prods = self._held_products(values)
            pos = self._widen(target, cols)
            target_prods, target_lo = target._prods, target._prods_lo
            if len(pos) == target_prods.shape[1]:
                pos = None  # every held column, in order
        if target.sums_lo is None:
            target.sums[slots] += values.sums
            if pos is None:
                target_prods[slots] += prods
            elif len(pos):
                rows = target_prods[slots]
                rows[:, pos] += prods
                target_prods[slots] = rows
        elif len(slots) and self._p:
            m = len(slots)
            at = slots
            if slots[-1] - slots[0] == m - 1 and (m < 3 or (np.diff(slots) == 1).all()):
                at = slice(int(slots[0]), int(slots[0]) + m)  # consecutive: work on views
            _two_sum(target.sums, target.sums_lo, at, values.sums)
            if pos is not None:  # zeros in the columns values do not hold
                wide = np.zeros((m, target_prods.shape[1]))
                wide[:, pos] = prods
                prods = wide
            if target_prods.shape[1]:
                _two_sum(target_prods, target_lo, at, prods)
        if values.nnz and self._merge_into(target, slots, values):
            return target
        if values.nnz:  # keys too wide for one packed integer: merge by a full re-sort
            cols = self._coalesce(
                np.concatenate([target.rows, slots[values.rows]]),
                np.concatenate([target.entry, values.entry]),
                np.concatenate([target.key1, values.key1]),
                np.concatenate([target.key2, values.key2]),
                np.concatenate([target.value, values.value]),
            )
            target.rows, target.entry, target.key1, target.key2, target.value = cols
        return target

    @staticmethod
    def _check_overflow(values: GCBatch) -> None:
        """:class:`RingError` for a delta whose floats overflowed (±inf, NaN) or whose
        counts left the range where they are exact integers (int64, or 2**53 as floats)."""
        count = values.count
        limit = 2**53 if count.dtype.kind == "f" else np.iinfo(np.int64).max
        if count.size and not (np.abs(count) <= limit).all():
            raise RingError(
                f"count overflow in the generalized covariance ring: a count beyond {limit} "
                f"(a product of multiplicities) is no longer exact"
            )
        for name, part in (("sums", values.sums), ("products", values._prods)):
            if not np.isfinite(part).all():
                raise RingError(
                    f"float64 overflow in the generalized covariance {name}: a product of "
                    f"feature values and counts exceeds {np.finfo(np.float64).max:.3g}"
                )
        if values.nnz and not np.isfinite(values.value).all():
            raise RingError(
                "float64 overflow in the generalized covariance ring's categorical entries"
            )

    def _deferred(self, target: GCBatch, values: GCBatch) -> _Deferred | None:
        """``target``'s deferred table, made (or packed again with wider keys) so that it
        can take ``values``' keys; None when the packed keys would not fit in 63 bits."""
        d = target._deferred
        lo = min(int(values.key1.min()), int(values.key2.min()))
        hi1, hi2 = int(values.key1.max()), int(values.key2.max())
        if d is not None and lo >= 0 and hi1 < d.k1 and hi2 < d.k2:
            return d
        target._plain()
        main = (target._rows, target._entry, target._key1, target._key2)
        if len(target._value):
            lo = min(lo, int(main[2].min()), int(main[3].min()))
            hi1, hi2 = max(hi1, int(main[2].max())), max(hi2, int(main[3].max()))
        # powers of two with a bit of headroom: new categories rarely force a new packing
        k1 = 1 << max(hi1.bit_length() + 1, 4)
        k2 = 1 << max(hi2.bit_length() + 1, 4)
        if lo < 0 or max(len(target), 1) * self.n_entries * k1 * k2 >= 2**63:
            return None
        d = _Deferred(self.n_entries, k1, k2, _EMPTY_I, target._value)
        d.mkey = d.pack(*main)
        target._deferred = d
        target._rows = target._entry = target._key1 = target._key2 = target._value = _EMPTY_I
        return d

    def _merge_into(self, target: GCBatch, slots: np.ndarray, values: GCBatch) -> bool:
        """Add ``values``' sparse entries (rows mapped through unique ``slots``) into the
        deferred table of ``target``: the delta is packed, sorted and summed per key; keys of
        the main run are found by binary search and added to in place (cancelled entries
        stay as zeros); the others are added into, or inserted in, the small pending run.
        The pending run is merged into the main one when it passes a quarter of it, and
        zeros are dropped when they pass a quarter, so the copying of the stored table is
        amortized over deltas of proportional total size.  False (nothing done) when the
        keys would not fit in 63 bits."""
        d = self._deferred(target, values)
        if d is None:
            return False
        rows = values.rows
        key = d.pack(slots[rows], values.entry, values.key1, values.key2)
        value = values.value
        # a plain table is coalesced (rows ascending): with unique slots, its entries in the
        # order of their slots are the rows' runs, each sorted, taken in that order
        if len(slots) > 1 and not (slots[1:] > slots[:-1]).all():
            by_slot = np.argsort(slots)
            starts = np.searchsorted(rows, np.arange(len(slots) + 1, dtype=np.int64))
            _, order = _ranges(starts[by_slot], (starts[1:] - starts[:-1])[by_slot])
            key, value = key[order], value[order]
        if len(key) > 1 and not (key[1:] > key[:-1]).all():  # not coalesced: sort and add up
            order = np.argsort(key, kind="stable")
            key, value = key[order], value[order]
            new = np.empty(len(key), dtype=bool)
            new[0] = True
            np.not_equal(key[1:], key[:-1], out=new[1:])
            if not new.all():  # repeated entries in the delta: add them up first
                starts = np.flatnonzero(new)
                key, value = key[starts], np.add.reduceat(value, starts)
        for run_key, run_value in ((d.mkey, d.mval), (d.pkey, d.pval)):
            if not len(key) or not len(run_key):
                continue
            pos = np.searchsorted(run_key, key)
            np.minimum(pos, len(run_key) - 1, out=pos)
            hit = run_key[pos] == key
            if hit.any():
                at = pos[hit]
                before = run_value[at]
                after = before + value[hit]
                run_value[at] = after
                d.zeros += int(np.count_nonzero(after == 0)) - int(np.count_nonzero(before == 0))
                miss = ~hit
                key, value = key[miss], value[miss]
        fresh = value != 0
        if fresh.any():
            key, value = key[fresh], value[fresh]
            d.pkey, d.pval = _merge_runs([d.pkey, d.pval], [key, value], d.pkey, key)
        limit = max(_PENDING_MIN, len(d.mkey) >> 2)
        if len(d.pkey) > limit or d.zeros > limit:
            d.settle()
        return True

    def batch_clear(self, target: GCBatch, slots: np.ndarray) -> GCBatch:
        self._check_batch(target)
        slots = np.asarray(slots, dtype=np.int64)
        target.count[slots] = 0.0
        target.sums[slots] = 0.0
        target._prods[slots] = 0.0
        if target.sums_lo is not None:
            target.sums_lo[slots] = 0.0
            target._prods_lo[slots] = 0.0
        d = target._deferred
        if d is not None:  # zero the rows' entries in place
            for run_key, run_value in ((d.mkey, d.mval), (d.pkey, d.pval)):
                lo = np.searchsorted(run_key, slots * d.span)
                _, pos = _ranges(lo, np.searchsorted(run_key, (slots + 1) * d.span) - lo)
                if len(pos):
                    d.zeros += int(np.count_nonzero(run_value[pos]))
                    run_value[pos] = 0.0
            if d.zeros > max(_PENDING_MIN, len(d.mkey) >> 2):
                d.settle()
        elif target.nnz and len(slots):
            mask = np.zeros(len(target), dtype=bool)
            mask[slots] = True
            keep = ~mask[target.rows]
            target.rows, target.entry = target.rows[keep], target.entry[keep]
            target.key1, target.key2 = target.key1[keep], target.key2[keep]
            target.value = target.value[keep]
        return target

    def batch_resize(self, batch: GCBatch, n: int) -> GCBatch:
        """Grow with zero rows (or truncate) to length ``n``; the result shares nothing with
        ``batch``, stays an accumulator if ``batch`` is one and, growing, keeps a deferred
        table deferred."""
        self._check_batch(batch)
        size = len(batch)
        if n <= size:
            out = self.batch_take(batch, np.arange(n))
            if batch.sums_lo is not None:  # hi + lo taken: the compensation starts afresh
                out.sums_lo, out._prods_lo = np.zeros_like(out.sums), np.zeros_like(out._prods)
            return out
        dense: list[np.ndarray | None] = []
        for a in (batch.count, batch.sums, batch._prods, batch.sums_lo, batch._prods_lo):
            grown = None
            if a is not None:
                grown = np.zeros((n,) + a.shape[1:], dtype=a.dtype)
                grown[:size] = a
            dense.append(grown)
        d = batch._deferred
        if d is not None and n * d.span < 2**63:
            out = self._make(*dense[:3], coalesce=False)
            copy = _Deferred(d.e, d.k1, d.k2, d.mkey.copy(), d.mval.copy())
            copy.pkey, copy.pval, copy.zeros = d.pkey.copy(), d.pval.copy(), d.zeros
            out._deferred = copy
        else:
            sparse = (batch.rows, batch.entry, batch.key1, batch.key2, batch.value)
            out = self._make(*dense[:3], *(a.copy() for a in sparse), coalesce=False)
        out.sums_lo, out._prods_lo = dense[3], dense[4]
        if batch.pcols is not None:
            out.pcols, out._width = batch.pcols, batch._width
        return out

    def batch_is_zero(self, a: GCBatch) -> np.ndarray:
        self._check_batch(a)
        a = self._fold(a)
        n = len(a)
        zero = (a.count == 0) & ~a.sums.any(axis=1) & ~a.prods.any(axis=1)
        if a.nnz:
            nz = a.value != 0
            zero &= np.bincount(a.rows[nz], minlength=n) == 0
        return zero

    def batch_is_negligible(self, a: GCBatch) -> np.ndarray:
        """``count == 0`` and every other component within ``1e-9`` of zero."""
        self._check_batch(a)
        a = self._fold(a)
        n = len(a)
        ok = (a.count == 0) & (np.abs(a.sums) <= NEGLIGIBLE).all(axis=1)
        ok &= (np.abs(a.prods) <= NEGLIGIBLE).all(axis=1)
        if a.nnz:
            big = np.abs(a.value) > NEGLIGIBLE
            ok &= np.bincount(a.rows[big], minlength=n) == 0
        return ok

    def batch_lift(self, variable: str, values: np.ndarray) -> GCBatch:
        """Lift a column: floats for continuous variables, integer codes for categorical ones."""
        values = np.asarray(values)
        if values.ndim != 1:
            values = values.reshape(-1)
        n = len(values)
        if variable not in self._index:
            return self.batch_ones(n)
        i = self._index[variable]
        if i < self._p:
            x = self._shifted(i, self._continuous_column(variable, values))
            b = self.batch_ones(n)
            b.sums[:, i] = x
            b.prods[:, self._pack_pos[i, i]] = x * x
            return b
        codes = self._code_column(variable, values)
        j = i - self._p
        b = self.batch_ones(n)
        rows = np.repeat(np.arange(n, dtype=np.int64), 2)
        entry = np.tile(np.array([j, self._off_d + j], dtype=np.int64), n)
        b.rows, b.entry = rows, entry
        b.key1 = np.repeat(codes, 2)
        b.key2 = np.zeros(2 * n, dtype=np.int64)
        b.value = np.ones(2 * n)
        return b

    def batch_lift_factors(self, variables: Sequence[str], columns: Sequence[np.ndarray]) -> list:
        """The product of several lifts built at once (:meth:`batch_lift_many`)."""
        if len(variables) > 1:
            return [self.batch_lift_many(variables, columns)]
        return [self.batch_lift(v, c) for v, c in zip(variables, columns, strict=True)]

    def batch_lift_many(self, variables: Sequence[str], columns: Sequence[np.ndarray]) -> GCBatch:
        """The product of the lifts of several distinct variables of the same rows, built
        directly: continuous ``x_i`` fill ``s_i`` and ``Q_ii'``, categorical codes ``x_j`` give
        ``s_j``, ``Q_jj`` (value 1), ``Q_ij`` (value ``x_i``, keyed ``x_j``) and ``Q_jk``
        (value 1, keyed ``(x_j, x_k)``); no product of full batches is formed.  Columns are
        floats for continuous variables and integer codes for categorical ones, as for
        :meth:`batch_lift`; variables the ring does not know lift to one."""
        variables = list(variables)
        if len(columns) != len(variables):
            raise RingError(f"{len(variables)} variables need as many columns, got {len(columns)}")
        known = [(v, np.asarray(c).reshape(-1)) for v, c in zip(variables, columns, strict=True)]
        if not known:
            raise RingError("batch_lift_many needs at least one variable")
        n = len(known[0][1])
        if any(len(c) != n for _, c in known):
            raise RingError("batch_lift_many needs columns of equal length")
        known = [(v, c) for v, c in known if v in self._index]
        index = [self._index[v] for v, _ in known]
        if len(set(index)) != len(index):
            raise RingError(f"variables lifted twice in one block: {variables}")
        p, q = self._p, self._q
        cont: list[tuple[int, np.ndarray]] = []
        cat: list[tuple[int, np.ndarray]] = []
        for (v, c), i in zip(known, index, strict=True):
            if i < p:
                cont.append((i, self._continuous_column(v, c)))  # shifted once all are valid
            else:
                cat.append((i - p, self._code_column(v, c)))
        cont = sorted(((i, self._shifted(i, x)) for i, x in cont), key=lambda item: item[0])
        cat.sort(key=lambda item: item[0])
        b = self.batch_ones(n)
        for i, x in cont:
            b.sums[:, i] = x
            for i2, x2 in cont:
                if i2 >= i:
                    b.prods[:, self._pack_pos[i, i2]] = x * x2
        if not cat or n == 0:
            return b
        # one sparse entry per (row, entry id): columns in increasing entry id, rows outer
        entries: list[tuple[int, np.ndarray, np.ndarray | None, np.ndarray | None]] = []
        for j, code in cat:
            entries.append((j, code, None, None))  # s_j
            entries.append((self._off_d + j, code, None, None))  # Q_jj
            for i, x in cont:
                entries.append((self._off_x + i * q + j, code, None, x))  # Q_ij
        for a, (j, cj) in enumerate(cat):
            for k, ck in cat[a + 1 :]:
                entries.append((int(self._pair_id[j, k]), cj, ck, None))  # Q_jk, j < k
        entries.sort(key=lambda e: e[0])
        width = len(entries)
        entry = np.empty((n, width), dtype=np.int64)
        key1 = np.empty((n, width), dtype=np.int64)
        key2 = np.zeros((n, width), dtype=np.int64)
        value = np.ones((n, width))
        for t, (e, k1, k2, x) in enumerate(entries):
            entry[:, t] = e
            key1[:, t] = k1
            if k2 is not None:
                key2[:, t] = k2
            if x is not None:
                value[:, t] = x
        rows = np.repeat(np.arange(n, dtype=np.int64), width)
        entry, key1, key2, value = entry.ravel(), key1.ravel(), key2.ravel(), value.ravel()
        keep = value != 0  # coalesced tables hold no zeros (x_i = 0 in Q_ij)
        if not keep.all():
            rows, entry, key1, key2, value = (
                rows[keep],
                entry[keep],
                key1[keep],
                key2[keep],
                value[keep],
            )
        b.rows, b.entry, b.key1, b.key2, b.value = rows, entry, key1, key2, value
        return b

    def check_lift(self, variable: str, values: np.ndarray) -> None:
        """Validate a column as :meth:`batch_lift` would, without building payloads or
        fixing a shift (a rejected batch leaves the shifts open)."""
        if variable not in self._index:
            return
        values = np.asarray(values).reshape(-1)
        if self._index[variable] < self._p:
            self._continuous_column(variable, values)
        else:
            self._code_column(variable, values)

    @staticmethod
    def _continuous_column(variable: str, values: np.ndarray) -> np.ndarray:
        if values.size == 0:
            return np.zeros(0, dtype=np.float64)
        if values.dtype.kind in "iuf":
            x = values.astype(np.float64)
        elif values.dtype.kind == "O":
            bad = [v for v in values.tolist() if not _is_real_number(v)]
            if bad:
                raise RingError(
                    f"continuous variable {variable!r} needs finite numbers, got {bad[0]!r}"
                )
            x = values.astype(np.float64)
        else:
            first = values.ravel()[0] if values.size else values.dtype
            raise RingError(
                f"continuous variable {variable!r} needs finite numbers, got {first!r} "
                f"(dtype {values.dtype})"
            )
        finite = np.isfinite(x)
        if not finite.all():
            bad = values[np.flatnonzero(~finite)[0]]
            raise RingError(f"continuous variable {variable!r} needs finite numbers, got {bad!r}")
        return x

    @staticmethod
    def _code_column(variable: str, values: np.ndarray) -> np.ndarray:
        if values.size == 0:
            return np.zeros(0, dtype=np.int64)
        kind = values.dtype.kind
        if kind == "i":
            return values.astype(np.int64, copy=False)
        if kind == "u":
            if values.size and values.max() > np.iinfo(np.int64).max:
                raise RingError(f"categorical variable {variable!r}: code {values.max()} too large")
            return values.astype(np.int64)
        if kind == "O":
            lst = values.tolist()
            bad = [v for v in lst if not isinstance(v, numbers.Integral) or isinstance(v, bool)]
            if not bad:
                return np.asarray(lst, dtype=np.int64)
            first = bad[0]
        else:
            first = values.ravel()[0] if values.size else values.dtype
        raise RingError(
            f"categorical variable {variable!r} needs integer category codes in the batched "
            f"face, got {first!r} (dtype {values.dtype}); dictionary-encode the values first"
        )

    # ---------------------------------------------------------------- serialization
    def batch_to_bytes(self, batch: GCBatch) -> bytes:
        """Serialize a batch with the ring's shifts (and an accumulator's compensation)."""
        self._check_batch(batch)
        compensated = batch.sums_lo is not None
        header = json.dumps(
            {
                "ring": self.name,
                "version": _VERSION,
                "continuous": list(self.continuous),
                "categorical": list(self.categorical),
                "n": len(batch),
                "nnz": batch.nnz,
                "shifts": [None if math.isnan(h) else float(h) for h in self._shifts],
                "compensated": compensated,
            }
        ).encode()
        arrays = [
            batch.count.astype("<f8"),
            batch.sums.astype("<f8"),
            self._full_products(batch)[0].astype("<f8"),
            batch.rows.astype("<i8"),
            batch.entry.astype("<i8"),
            batch.key1.astype("<i8"),
            batch.key2.astype("<i8"),
            batch.value.astype("<f8"),
        ]
        if compensated:
            arrays += [batch.sums_lo.astype("<f8"), self._full_products(batch)[1].astype("<f8")]
        return b"".join(
            [_MAGIC, struct.pack("<I", len(header)), header]
            + [np.ascontiguousarray(x).tobytes() for x in arrays]
        )

    def batch_from_bytes(self, data: bytes) -> GCBatch:
        """Inverse of :meth:`batch_to_bytes`; open shifts are fixed to the data's, differing
        fixed ones raise.  Version 1 data (before shifts) hold unshifted moments."""
        data = bytes(data)
        if data[:4] != _MAGIC or len(data) < 8:
            raise RingError("not a serialized generalized covariance batch")
        (hlen,) = struct.unpack("<I", data[4:8])
        try:
            header = json.loads(data[8 : 8 + hlen].decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RingError(f"corrupt batch header: {exc}") from None
        if (
            header.get("ring") != self.name
            or header.get("version") not in (1, _VERSION)
            or tuple(header.get("continuous", ())) != self.continuous
            or tuple(header.get("categorical", ())) != self.categorical
        ):
            raise RingError(f"serialized batch is not for {self!r}: {header}")
        n, nnz = int(header["n"]), int(header["nnz"])
        p, pk = self._p, self._packed
        shapes = [
            ("<f8", (n,)),
            ("<f8", (n, p)),
            ("<f8", (n, pk)),
            ("<i8", (nnz,)),
            ("<i8", (nnz,)),
            ("<i8", (nnz,)),
            ("<i8", (nnz,)),
            ("<f8", (nnz,)),
        ]
        if header.get("compensated"):
            shapes += [("<f8", (n, p)), ("<f8", (n, pk))]
        pos = 8 + hlen
        arrays = []
        for dt, shape in shapes:
            size = 8 * int(np.prod(shape))
            if pos + size > len(data):
                raise RingError("truncated serialized batch")
            arr = np.frombuffer(data, dtype=dt, count=size // 8, offset=pos).reshape(shape)
            arrays.append(arr.astype(np.float64 if dt == "<f8" else np.int64))
            pos += size
        if pos != len(data):
            raise RingError("trailing bytes after serialized batch")
        count, sums, prods, rows, entry, key1, key2, value = arrays[:8]
        if nnz and (
            rows.min() < 0 or rows.max() >= n or entry.min() < 0 or entry.max() >= self.n_entries
        ):
            raise RingError("corrupt serialized batch: row or entry out of range")
        stored = header.get("shifts", [0.0] * p + [None] * self._q)  # version 1: unshifted
        if not isinstance(stored, list) or len(stored) != self.degree:
            raise RingError(f"corrupt batch header: shifts {stored!r}")
        self._adopt_shifts([np.nan if h is None else float(h) for h in stored])
        out = self._make(count, sums, prods, rows, entry, key1, key2, value)
        if header.get("compensated"):
            out.sums_lo, out.prods_lo = arrays[8], arrays[9]
        return out

    def _adopt_shifts(self, stored: Sequence[float]) -> None:
        """Check (or fix, when still open) the shifts serialized data were made with; NaN:
        the data never lifted that variable."""
        for i in range(self._p):
            h, mine = stored[i], self._shifts[i]
            if math.isnan(h) or h == mine:
                continue
            if not math.isnan(mine):
                raise RingError(
                    f"data were made with shift {h!r} for {self.variables[i]!r} but this ring "
                    f"uses {mine!r}"
                )
            self._shifts[i] = h

    def to_bytes(self, a: GCPayload) -> bytes:
        """Serialize one element (integer category codes only)."""
        return self.batch_to_bytes(self.batch_from([a]))

    def from_bytes(self, data: bytes) -> GCPayload:
        batch = self.batch_from_bytes(data)
        if len(batch) != 1:
            raise RingError(f"expected one serialized element, got {len(batch)}")
        return self.batch_to_list(batch)[0]

    # ---------------------------------------------------------------- codes
    def _key_variables(self, entry: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global index of the categorical variable behind ``key1`` and ``key2`` of each
        sparse entry (-1 where ``key2`` is unused)."""
        pair = self._kind == 3
        return np.where(pair, self._gi, self._gj)[entry], np.where(pair, self._gj, -1)[entry]

    def _coded_batch(self, payload: GCPayload | GCBatch) -> tuple[GCBatch, bool]:
        """A plain batch of ``payload`` and whether it was a scalar element."""
        if isinstance(payload, GCPayload):
            return self.batch_from([payload]), True
        self._check_batch(payload)
        return self._fold(payload), False

    def batch_without_residue(self, a: GCBatch) -> GCBatch:
        """``a`` without the entries keyed by a category whose count in their row is 0:
        with no negative multiplicity such a category has no rows, so what its
        ``SUM(X_i) GROUP BY X_j`` entries still hold is the rounding residue of its deletes
        (its count tables are exact).  ``a`` itself when no entry is dropped."""
        self._check_batch(a)
        batch = self._fold(a)
        entry = batch.entry
        if not entry.size:
            return a
        rows, key1, key2 = batch.rows, batch.key1, batch.key2
        var1, var2 = self._key_variables(entry)
        second = np.flatnonzero(var2 >= 0)  # Q_jk: key2 = x_k
        keys = _pair_keys(
            np.concatenate([rows, rows[second]]) * self.degree
            + np.concatenate([var1, var2[second]]),
            np.concatenate([key1, key2[second]]),
        )
        first, paired = keys[: entry.size], keys[entry.size :]
        present = first[entry < self._q]  # the count tables s_j: key1 = x_j
        keep = np.isin(first, present)
        keep[second] &= np.isin(paired, present)
        if keep.all():
            return a
        kept = (rows[keep], entry[keep], key1[keep], key2[keep], batch.value[keep])
        dense = (batch.count.copy(), batch.sums.copy(), batch.prods.copy())
        return self._make(*dense, *kept, coalesce=False)

    def used_codes(self, payload: GCPayload | GCBatch) -> dict[str, np.ndarray]:
        """The category codes of every categorical variable that the payload's entries hold
        (sorted, unique)."""
        batch, _ = self._coded_batch(payload)
        var1, var2 = self._key_variables(batch.entry)
        return {
            self.variables[i]: np.union1d(batch.key1[var1 == i], batch.key2[var2 == i])
            for i in range(self._p, self.degree)
        }

    def recode(
        self, payload: GCPayload | GCBatch, maps: Mapping[str, np.ndarray]
    ) -> GCPayload | GCBatch:
        """Category codes of the variables in ``maps`` replaced by ``maps[v][code]`` in every
        entry keyed by them (``s_j``, ``Q_jj``, ``Q_ij``, both keys of ``Q_jk``), vectorized;
        a code the map does not cover raises :class:`RingError`.  A new batch (re-sorted)."""
        maps = check_code_maps(self, maps)
        if not maps:
            return payload
        batch, scalar = self._coded_batch(payload)
        key1, key2 = batch.key1.copy(), batch.key2.copy()
        var1, var2 = self._key_variables(batch.entry)
        for name, mapping in maps.items():
            i = self._index[name]
            for key, var in ((key1, var1), (key2, var2)):
                at = np.flatnonzero(var == i)
                if at.size:
                    key[at] = recode_column(name, key[at], mapping)
        out = self._make(
            batch.count.copy(),
            batch.sums.copy(),
            batch.prods.copy(),
            batch.rows,
            batch.entry,
            key1,
            key2,
            batch.value,
        )
        return self.batch_to_list(out)[0] if scalar else out


def _pair_keys(groups: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """One value per ``(group, code)`` pair, equal where the pairs are: a packed int64 where
    it fits (fast to compare), else the pair's bytes."""
    packed = GeneralizedCovarianceRing._merge_keys(groups, codes, np.zeros_like(codes))
    if packed is not None:
        return packed
    table = np.ascontiguousarray(np.stack([groups, codes], axis=1), dtype=np.int64)
    return table.view(np.dtype((np.void, 16))).ravel()
