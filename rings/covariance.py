"""The continuous covariance ring of degree m (F-IVM Definitions 6 and 7).

An element is a triple ``(c, s, Q)``: a count, the per-variable sums and the Gram matrix
``Σ x xᵀ`` over the ``m`` continuous variables of the ring.  Addition is component-wise and

    (c_a, s_a, Q_a) * (c_b, s_b, Q_b)
        = (c_a c_b,  c_b s_a + c_a s_b,  c_b Q_a + c_a Q_b + s_a s_bᵀ + s_b s_aᵀ).

Layout (notes §9.1.3, Remark 4): a payload only stores the *block* of variables it has seen
(global variable indices, in storage order).  Variables outside the block are zero entries.
Multiplying payloads over disjoint blocks (what a view tree does, since every variable is
lifted once) assembles ``[[c_b Q_a, s_a s_bᵀ], [s_b s_aᵀ, c_a Q_b]]`` over the concatenated
block.  The batched face stores ``Q`` as its packed upper triangle (row-major, diagonal
included).

Numerics (ecosystem notes §6): every variable ``j`` gets a fixed *shift* ``h_j`` (the mean
of its first lifted batch, rounded as :func:`choose_shift` says) and payloads hold the
moments of ``x' = x − h``.  The shift is an affine change of variables: covariances and
regression slopes are unchanged, and :meth:`CovarianceRing.moments` /
:meth:`CovarianceRing.statistics` give results in original units.  Counts are exact
integers; accumulators (:meth:`CovarianceRing.batch_accumulator`) add compensated (TwoSum)
low-order parts to the floating components.
"""

from __future__ import annotations

import decimal
import itertools
import json
import math
import numbers
import operator
import os
import struct
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from .base import Ring, RingError
from .scalar import checked_add, checked_mul, checked_sum_by

__all__ = [
    "CovarianceBatch",
    "CovariancePayload",
    "CovarianceRing",
    "CovarianceStatistics",
]

Block = tuple[int, ...]

#: Above this many rows summed into one payload, Σxxᵀ is one matrix product.
_MATMUL_ROWS = 64


def choose_shift(x: np.ndarray) -> float:
    """The shift a variable's first lifted batch fixes: the batch mean rounded to a multiple
    of the largest power of two not above its standard deviation, so ``|h − mean| <= sd/2``
    (the shifted values stay small) and integer data stay integers.  A float32 rounding of
    the mean would be off by up to 2**15 at 1e12 and ruin the variance of such a feature."""
    with np.errstate(over="ignore", invalid="ignore"):
        h = float(np.mean(x))
        sd = float(np.std(x)) if len(x) > 1 else 0.0
    if not math.isfinite(h):  # the sum overflowed: any value of the batch is near enough
        return float(np.partition(x, len(x) // 2)[len(x) // 2])
    if sd > 0.0 and math.isfinite(sd):
        step = math.ldexp(1.0, math.frexp(sd)[1] - 1)  # the largest 2**k <= sd
        h = float(np.round(h / step) * step)
    return h


# ---------------------------------------------------------------------------- index maps


def _plen(k: int) -> int:
    """Length of the packed upper triangle (diagonal included) of a k x k matrix."""
    return k * (k + 1) // 2


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@lru_cache(maxsize=256)
def _triu(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the packed upper triangle, row-major."""
    i, j = np.triu_indices(k)
    return _frozen(i.astype(np.intp)), _frozen(j.astype(np.intp))


@lru_cache(maxsize=256)
def _packed_table(k: int) -> np.ndarray:
    """``T[i, j]`` = position of entry ``(min(i,j), max(i,j))`` in the packed triangle."""
    i, j = _triu(k)
    table = np.empty((k, k), dtype=np.intp)
    table[i, j] = np.arange(_plen(k))
    table[j, i] = table[i, j]
    return _frozen(table)


@lru_cache(maxsize=4096)
def _union(a: Block, b: Block) -> Block:
    """``a``'s variables in order, then ``b``'s variables that ``a`` lacks."""
    seen = set(a)
    return a + tuple(v for v in b if v not in seen)


@lru_cache(maxsize=4096)
def _embed(src: Block, dst: Block) -> tuple[np.ndarray, np.ndarray]:
    """Where ``src``'s sums and packed products go in ``dst`` (``src`` ⊆ ``dst``)."""
    where = {v: p for p, v in enumerate(dst)}
    pos = np.asarray([where[v] for v in src], dtype=np.intp)
    i, j = _triu(len(src))
    pmap = _packed_table(len(dst))[pos[i], pos[j]] if len(src) else np.zeros(0, np.intp)
    return _frozen(pos), _frozen(np.asarray(pmap, dtype=np.intp))


class _DisjointPlan:
    """Precomputed assembly of ``Q_{a∪b}`` (packed) from ``Q_a``, ``s_a s_bᵀ`` and ``Q_b``."""

    __slots__ = ("ka", "kb", "pa", "pb", "pu", "rows", "gather", "use_rows")

    def __init__(self, ka: int, kb: int) -> None:
        k = ka + kb
        self.ka, self.kb = ka, kb
        self.pa, self.pb, self.pu = _plen(ka), _plen(kb), _plen(k)
        # Row r < ka of the union triangle is [c_b Q_a[r, r:], s_a[r] s_b]; the rows of b
        # follow as the contiguous tail c_a Q_b.
        rows = []
        gather = np.empty(self.pu, dtype=np.intp)
        at = 0
        for r in range(ka):
            u0 = r * k - r * (r - 1) // 2
            a0 = r * ka - r * (r - 1) // 2
            length = ka - r
            rows.append((r, u0, a0, length))
            gather[at : at + length] = np.arange(a0, a0 + length)
            at += length
            gather[at : at + kb] = self.pa + r * kb + np.arange(kb)
            at += kb
        gather[at:] = self.pa + ka * kb + np.arange(self.pb)
        self.rows = tuple(rows)
        self.gather = _frozen(gather)
        # Row-wise writes cost two ufunc calls per row of a; one gather of the whole
        # triangle wins when a is much wider than b (measured, numpy 2.x).
        self.use_rows = ka <= 2 * kb + 4


@lru_cache(maxsize=1024)
def _disjoint_plan(ka: int, kb: int) -> _DisjointPlan:
    return _DisjointPlan(ka, kb)


class _FusedPlan:
    """Index maps of :meth:`CovarianceRing._fused_sum` for factors over disjoint blocks of
    sizes ``ks``, concatenated in order into the union block."""

    __slots__ = ("ks", "offsets", "column_factor", "diag", "cross")

    def __init__(self, ks: tuple[int, ...]) -> None:
        self.ks = ks
        self.offsets = tuple(int(o) for o in np.cumsum((0,) + ks))
        k = self.offsets[-1]
        table = _packed_table(k)
        self.column_factor = _frozen(np.repeat(np.arange(len(ks)), ks).astype(np.intp))
        diag = []
        for x, kx in enumerate(ks):
            i, j = _triu(kx)
            diag.append(table[self.offsets[x] + i, self.offsets[x] + j])
        self.diag = _frozen(np.concatenate(diag).astype(np.intp)) if diag else None
        # cross[y]: packed positions of the rows of all earlier factors x columns of y
        cross: dict[int, np.ndarray] = {}
        for y, ky in enumerate(ks):
            off = self.offsets[y]
            if ky and off:
                cols = np.arange(off, off + ky)
                cross[y] = _frozen(table[np.arange(off)[:, None], cols[None, :]].ravel())
        self.cross = cross


@lru_cache(maxsize=1024)
def _fused_plan(ks: tuple[int, ...]) -> _FusedPlan:
    return _FusedPlan(ks)


#: ``np.add.reduceat`` sums a segment along a contiguous axis as its first element plus the
#: pairwise sum of the others, which is a plain left-to-right sum below this many.
_PAIRWISE_BLOCK = 8


def _transposed(a: np.ndarray) -> np.ndarray:
    """``np.ascontiguousarray(a.T)`` of a C-contiguous ``(w, n)`` array.  When ``n`` is a
    multiple of 128 (batches of 1024 or 4096 rows) its rows lie a multiple of 1 KiB apart,
    a column maps onto a few cache sets and the plain copy runs 4-8x slower: then 8 rows
    at a time (2x the plain cost at other ``n``, which is why it is not the rule)."""
    if a.shape[1] % 128:
        return np.ascontiguousarray(a.T)
    out = np.empty(a.shape[::-1], dtype=a.dtype)
    for start in range(0, a.shape[0], 8):
        out[:, start : start + 8] = a[start : start + 8].T
    return out


def _run_lengths(starts: np.ndarray, n: int) -> np.ndarray:
    """Lengths of the runs starting at ``starts`` (increasing, ``starts[0] == 0``) of ``n``
    items: ``np.diff(starts, append=n)`` without its wrapper's cost (a broadcast and a
    concatenation per call)."""
    lengths = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
    lengths[-1] = n - starts[-1]
    return lengths


def _segment_sums_rows(a: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``np.add.reduceat(a, starts, axis=1).T`` of a C-contiguous ``(w, n)`` array, bit for
    bit, when most segments are one column: the columns become rows (one copy), every
    segment's first row is gathered and the others are added to it in rounds (``first +
    ((second + third) + ...)``, reduceat's order); reduceat itself pays a call per segment
    and row of ``a``.  Segments longer than ``_PAIRWISE_BLOCK`` go through reduceat."""
    n = a.shape[1]
    rows = _transposed(a)
    lengths = _run_lengths(starts, n)
    multi = (lengths > 1).nonzero()[0]
    if multi.size:
        more = lengths[multi]
        long_ = more > _PAIRWISE_BLOCK
        if long_.any():
            segments = multi[long_]
            ends = np.cumsum(lengths[segments])
            columns = np.repeat(starts[segments] - ends + lengths[segments], lengths[segments])
            columns += np.arange(columns.size)
            summed = np.add.reduceat(np.take(a, columns, axis=1), ends - lengths[segments], axis=1)
            rows[starts[segments]] = summed.T
            multi, more = multi[~long_], more[~long_]
        if multi.size:
            first = starts[multi]
            rest = rows.take(first + 1, axis=0)
            for j in range(2, int(more.max())):
                deeper = (more > j).nonzero()[0]
                rest[deeper] += rows.take(first[deeper] + j, axis=0)
            rows[first] += rest
    return rows.take(starts, axis=0)


def _rows_at(a: np.ndarray, at: np.ndarray | slice) -> np.ndarray:
    """``a[at]`` (rows): a view for a slice, else gathered by ``take`` (several times faster
    than fancy indexing)."""
    return a[at] if isinstance(at, slice) else a.take(at, axis=0)


def _lift_rows(
    x: np.ndarray, weights: np.ndarray | None, products: np.ndarray | None = None
) -> np.ndarray:
    """The packed products ``x_i x_j`` (``i <= j``, as lift_block orders them) of shifted
    rows ``x`` (variables × rows), into ``products`` when given; with ``weights``, ``x`` and
    the products times each row's multiplicity (``x`` in place), as batch_scale."""
    k, n = x.shape
    if products is None:
        products = np.empty((_plen(k), n))
    at = 0
    for r in range(k):  # row r of the packed triangle: x_r * x_r..
        np.multiply(x[r], x[r:], out=products[at : at + k - r])
        at += k - r
    if weights is not None:
        w = weights.astype(np.float64)
        x *= w
        products *= w
    return products


def _sum_counts(weights: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Integer weights summed per group, exactly."""
    count = np.zeros(n_groups, dtype=np.int64)
    np.add.at(count, groups, weights)
    return count


def _group_sums_rows(a: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """:func:`_segment_sums_rows` of the columns of a ``(w, n)`` array stably sorted by
    ``groups``, bit for bit, without the sort: every group's first column (in column order)
    plus the sum of its others, added in rounds (``first + ((second + third) + ...)``).
    Every group has 1 to ``_PAIRWISE_BLOCK`` columns (longer ones need reduceat's order)."""
    n = a.shape[1]
    columns = np.arange(n)
    marks = np.full(n_groups, -1, dtype=np.int64)
    marks[groups[::-1]] = columns[::-1]  # every group's first column: the last write wins
    rows = _transposed(a)
    out = rows.take(marks, axis=0)
    taken = np.zeros(n, dtype=bool)
    taken[marks] = True
    rest = (~taken).nonzero()[0]
    held = position = None  # the groups with more columns, and their running sums
    while rest.size:
        marks.fill(-1)
        marks[groups[rest[::-1]]] = rest[::-1]  # every group's next column
        now = (marks >= 0).nonzero()[0]
        picked = marks[now]
        if held is None:
            held, sums = now, rows.take(picked, axis=0)
            position = np.full(n_groups, -1, dtype=np.int64)
            position[held] = np.arange(held.size)
        else:
            sums[position[now]] += rows.take(picked, axis=0)
        taken[picked] = True
        rest = rest[~taken[rest]]
    if held is not None:
        out[held] += sums
    return out


# ---------------------------------------------------------------------- overflow guards
_COUNT_SAFE = 2.0**62  # a float bound below this proves that an int64 count result fits


def _magnitude(counts: np.ndarray) -> float:
    """``max |count|`` as a float (0 for no counts)."""
    if not counts.size:
        return 0.0
    top = int(np.abs(counts).max())
    return float(top) if top >= 0 else 2.0**63  # |-2**63| wraps around to itself


def _mul_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * b`` of int64 counts; :class:`RingError` where a product leaves int64."""
    if _magnitude(a) * _magnitude(b) < _COUNT_SAFE:
        return a * b
    return checked_mul(a, b, "the counts of a covariance product")


def _add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` of int64 counts; :class:`RingError` where a sum leaves int64."""
    if _magnitude(a) + _magnitude(b) < _COUNT_SAFE:
        return a + b
    return checked_add(a, b, "the counts of a covariance sum")


def _check_count_sums(counts: np.ndarray, groups: np.ndarray | None, n_groups: int) -> None:
    """:class:`RingError` when the sum of int64 counts of a group leaves int64."""
    if counts.size * _magnitude(counts) >= _COUNT_SAFE:
        if groups is None:
            groups, n_groups = np.zeros(counts.size, dtype=np.int64), 1
        checked_sum_by(counts, groups, n_groups)


#: A variance below this fraction of the shifted second moment has lost half its digits.
_KEPT_VARIANCE = 1e-8
#: ... when the shift is this many times farther from the data than the data from 0.
_FAR_SHIFT = 1e3

#: While every lifted |x| and every shift |h| stay below this, no float64 can overflow: an
#: entry sums at most ~2**103 terms (rows times int64 weights) of size <= (2e130)**2, below
#: 1e292 (intermediate products of payloads likewise), so store additions check their
#: deltas only beyond it.
_SAFE_VALUE = 1e130


def _check_finite(b: CovarianceBatch) -> None:
    """:class:`RingError` when sums or products overflowed float64 (to ±inf or NaN)."""
    for name, part in (("sums", b.sums), ("products", b.products)):
        if not np.isfinite(part).all():
            raise RingError(
                f"float64 overflow in the covariance {name}: a product of feature values "
                f"and counts exceeds {np.finfo(np.float64).max:.3g} (or became NaN)"
            )


@lru_cache(maxsize=4096)
def _is_disjoint(a: Block, b: Block) -> bool:
    return set(a).isdisjoint(b)


# ------------------------------------------------------------------------- elements


def _as_count(value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError:
        if isinstance(value, float | np.floating) and float(value).is_integer():
            return int(value)
        raise RingError(f"covariance counts must be integers, got {value!r}") from None


def _as_block(block: Any) -> Block:
    out = tuple(operator.index(v) for v in block)
    if len(set(out)) != len(out) or any(v < 0 for v in out):
        raise RingError(f"a block lists distinct non-negative variable indices, got {out}")
    return out


@dataclass(frozen=True, eq=False)
class CovariancePayload:
    """One element ``(count, sums, products)`` of the covariance ring (scalar face).

    ``block`` lists the global variable indices the arrays cover, in storage order;
    ``products`` is the full symmetric ``(k, k)`` matrix.  Variables outside the block are
    zero entries, so payloads over different blocks compare equal when they agree on the
    union (``==`` is exact; use :meth:`CovarianceRing.equal` for tolerances).
    """

    block: Block
    count: int
    sums: np.ndarray
    products: np.ndarray
    ring_id: int | None = field(default=None, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        block = _as_block(self.block)
        k = len(block)
        sums = np.array(self.sums, dtype=np.float64).reshape(-1)
        products = np.array(self.products, dtype=np.float64)
        if sums.shape != (k,) or products.shape != (k, k):
            raise RingError(
                f"payload over {k} variables needs sums ({k},) and products ({k},{k}), "
                f"got {sums.shape} and {products.shape}"
            )
        if not np.array_equal(products, products.T, equal_nan=True):
            raise RingError("covariance payload products must be a symmetric matrix")
        object.__setattr__(self, "block", block)
        object.__setattr__(self, "count", _as_count(self.count))
        object.__setattr__(self, "sums", _frozen(sums))
        object.__setattr__(self, "products", _frozen(products))

    def _canonical(self) -> tuple[Block, np.ndarray, np.ndarray]:
        """Sorted block without all-zero variables (for hashing)."""
        keep = [
            p for p in range(len(self.block)) if self.sums[p] != 0 or np.any(self.products[p] != 0)
        ]
        keep.sort(key=lambda p: self.block[p])
        idx = np.asarray(keep, dtype=np.intp)
        return (
            tuple(self.block[p] for p in keep),
            self.sums[idx] + 0.0,
            self.products[np.ix_(idx, idx)] + 0.0,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CovariancePayload):
            return NotImplemented
        return _payload_equal(self, other, 0.0, 0.0)

    def __hash__(self) -> int:
        block, sums, products = self._canonical()
        return hash((self.count, block, sums.tobytes(), products.tobytes()))


@dataclass(eq=False)
class CovarianceBatch:
    """``n`` covariance payloads over one block (batched face).

    ``count`` is ``(n,)`` int64, ``sums`` ``(n, k)`` float64 and ``products``
    ``(n, k(k+1)/2)`` float64, the packed upper triangle in row-major order (diagonal
    included).  Accumulators also carry ``sums_lo``/``products_lo``, the compensation
    terms of TwoSum accumulation; the value of an entry is ``hi + lo``.

    ``floats``: plain accumulators (a store's payloads), the rows taken from them and
    grouped lifts keep sums and products side by side in one ``(n, k + k(k+1)/2)`` float64
    array, of which ``sums`` and ``products`` are views: a gather or a scatter of payloads
    moves one contiguous row of floats, and an addition runs over whole rows.
    """

    block: Block
    count: np.ndarray
    sums: np.ndarray
    products: np.ndarray
    sums_lo: np.ndarray | None = None
    products_lo: np.ndarray | None = None
    ring_id: int | None = field(default=None, repr=False)
    floats: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.block = tuple(self.block)
        n, k = len(self.count), len(self.block)
        if self.sums.shape != (n, k) or self.products.shape != (n, _plen(k)):
            raise RingError(
                f"covariance batch of {n} payloads over {k} variables needs sums ({n},{k}) "
                f"and products ({n},{_plen(k)}), got {self.sums.shape}, {self.products.shape}"
            )
        if (self.sums_lo is None) != (self.products_lo is None):
            raise RingError("sums_lo and products_lo are given together or not at all")

    def __len__(self) -> int:
        return len(self.count)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self.floats is not None:  # the views would be pickled as copies
            del state["sums"], state["products"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if state.get("floats") is not None:
            self.sums, self.products = _split(self.floats, len(self.block))

    @property
    def has_lo(self) -> bool:
        """True for compensated accumulators."""
        return self.sums_lo is not None


@dataclass(frozen=True)
class CovarianceStatistics:
    """Count, mean and covariance in original units (see :meth:`CovarianceRing.statistics`)."""

    variables: tuple[str, ...]
    count: int
    mean: np.ndarray
    covariance: np.ndarray

    @property
    def variance(self) -> np.ndarray:
        """The diagonal of :attr:`covariance`."""
        return np.diag(self.covariance).copy()


def _split(floats: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Sums and products: views of a ``(n, k + plen)`` array of both."""
    return floats[:, :k], floats[:, k:]


def _pad_full(p: CovariancePayload, union: Block) -> tuple[np.ndarray, np.ndarray]:
    if p.block == union:
        return p.sums, p.products
    k = len(union)
    pos, _ = _embed(p.block, union)
    sums = np.zeros(k)
    products = np.zeros((k, k))
    sums[pos] = p.sums
    products[np.ix_(pos, pos)] = p.products
    return sums, products


def _payload_equal(a: CovariancePayload, b: CovariancePayload, rtol: float, atol: float) -> bool:
    if a.count != b.count:
        return False
    union = tuple(sorted(set(a.block) | set(b.block)))
    sa, qa = _pad_full(a, union)
    sb, qb = _pad_full(b, union)
    close = lambda x, y: bool(np.all(np.abs(x - y) <= atol + rtol * np.abs(y)))  # noqa: E731
    return close(sa, sb) and close(qa, qb)


# -------------------------------------------------------------------- serialization

_PAYLOAD_MAGIC = b"RCVP"
_BATCH_MAGIC = b"RCVB"
_FORMAT_VERSION = 1


def _pack(magic: bytes, header: dict, arrays: Sequence[np.ndarray]) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    parts = [magic, struct.pack("<I", len(head)), head]
    for a in arrays:
        dtype = "<i8" if a.dtype.kind in "iu" else "<f8"
        parts.append(np.ascontiguousarray(a, dtype=dtype).tobytes())
    return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes, magic: bytes) -> None:
        data = bytes(data)
        if data[:4] != magic or len(data) < 8:
            raise RingError("not a serialized covariance payload (bad magic)")
        (size,) = struct.unpack("<I", data[4:8])
        try:
            self.header = json.loads(data[8 : 8 + size].decode())
        except ValueError as exc:
            raise RingError(f"corrupt covariance payload header: {exc}") from None
        if self.header.get("version") != _FORMAT_VERSION:
            raise RingError(f"unsupported covariance format version {self.header.get('version')}")
        self.data, self.at = data, 8 + size

    def array(self, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        count = math.prod(shape)
        end = self.at + 8 * count
        if end > len(self.data):
            raise RingError("truncated covariance payload data")
        a = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at = end
        return a.astype(dtype[1:], copy=True).reshape(shape)

    def done(self) -> None:
        if self.at != len(self.data):
            raise RingError("trailing bytes after covariance payload data")


# ---------------------------------------------------------------------------- the ring

_RINGS: weakref.WeakValueDictionary[int, CovarianceRing] = weakref.WeakValueDictionary()
#: the rings constructed in this process (not unpickled), by id
_BUILT: weakref.WeakValueDictionary[int, CovarianceRing] = weakref.WeakValueDictionary()


def share_shifts(built: weakref.WeakValueDictionary, ring: Any) -> None:
    """An unpickled (or deep-copied) ring whose original was constructed in this process
    (``built``: those rings by id) is one ring with it: they share one shifts array, so a
    payload of either reads right through the other (``query.ring.statistics(
    restored.result())``).  The copy's fixed shifts fill the original's open ones (no
    stored payload uses an open shift); a conflict keeps the copy's own shifts.  Copies
    unpickled where no original lives (Spark executors: each shard its own shifts) stay
    apart."""
    live = built.get(ring._id)
    if live is None or live is ring:
        return
    mine, theirs = ring._shifts, live._shifts
    if mine.shape != theirs.shape:
        return
    both = ~np.isnan(mine) & ~np.isnan(theirs)
    if np.array_equal(mine[both], theirs[both]):
        fixed = np.isnan(theirs) & ~np.isnan(mine)
        theirs[fixed] = mine[fixed]
        ring._shifts = theirs


class CovarianceRing(Ring[CovariancePayload, CovarianceBatch]):
    """The continuous covariance ring of degree ``m = len(variables)`` (Definition 7).

    Variable ``variables[j]`` has global index ``j``.  ``shift`` enables the per-variable
    shift fixed at a variable's first lift (``ring.shifts``, NaN until fixed; zeros when
    ``shift=False``); ``compensated`` makes :meth:`batch_accumulator` return TwoSum
    accumulators; ``zero_atol`` is the tolerance of :meth:`batch_is_negligible`.  Rings are
    equal when their configuration is; payloads made by one instance are refused by another
    unless the two are equal and hold the same shifts.
    """

    name = "covariance"
    commutative = True

    def __init__(
        self,
        variables: Sequence[str],
        shift: bool = True,
        compensated: bool = True,
        zero_atol: float = 1e-9,
    ) -> None:
        if isinstance(variables, str):
            raise RingError("variables must be a sequence of names, not a single string")
        names = tuple(str(v) for v in variables)
        if len(set(names)) != len(names):
            dup = next(v for v in names if names.count(v) > 1)
            raise RingError(f"variable {dup!r} is listed twice")
        self.variables = names
        self.shift = bool(shift)
        self.compensated = bool(compensated)
        self.zero_atol = float(zero_atol)
        self._index = {v: j for j, v in enumerate(names)}
        self._shifts = np.full(len(names), np.nan if self.shift else 0.0)
        # set for good once a lifted value or shift beyond _SAFE_VALUE (or a payload from
        # bytes or elements) was seen: store additions then check for float64 overflow
        self._guard_floats = False
        # the sum of max |count| of every delta added to a store: bounds every stored count,
        # so additions check the stored counts only once it reaches _COUNT_SAFE
        self._count_bound = 0.0
        # random ids: payloads keep their ring's id through pickling, and ids of rings made
        # in different processes should not collide
        self._id = int.from_bytes(os.urandom(8), "little") >> 2
        _RINGS[self._id] = _BUILT[self._id] = self

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_guard_floats", True)  # pickled before the guards: check always
        state.setdefault("_count_bound", math.inf)
        self.__dict__.update(state)
        _RINGS.setdefault(self._id, self)
        share_shifts(_BUILT, self)

    def _watch(self, top: float) -> None:
        """Turn the overflow check of store additions on for good once ``top`` (a bound
        of the lifted ``|x − h|``; NaN counts as large) passes ``_SAFE_VALUE``."""
        if not top <= _SAFE_VALUE:
            self._guard_floats = True

    # ------------------------------------------------------------ configuration
    @property
    def m(self) -> int:
        """The degree: number of continuous variables."""
        return len(self.variables)

    @property
    def lifted_variables(self) -> frozenset[str]:
        return frozenset(self.variables)

    @property
    def shifts(self) -> np.ndarray:
        """Per-variable shifts ``h`` (global order; NaN until fixed).  Payloads hold x − h."""
        return self._shifts.copy()

    def set_shifts(self, shifts: Mapping[str, float]) -> None:
        """Fix shifts explicitly (e.g. restoring a checkpoint) before any lift of them.

        Setting a variable to its current shift is a no-op; changing a fixed shift raises.
        """
        for name, value in shifts.items():
            j = self.index_of(name)
            value = float(value)
            if not math.isfinite(value):
                raise RingError(f"shift of {name!r} must be finite, got {value!r}")
            current = self._shifts[j]
            if current == value:
                continue
            if not self.shift:
                raise RingError(f"ring built with shift=False cannot shift {name!r}")
            if not math.isnan(current):
                raise RingError(f"shift of {name!r} is already fixed at {current!r}")
            self._shifts[j] = value
            self._watch(abs(value))

    #: check_lift accepts every finite int64 / float64 column
    lifts_finite_numbers = True

    #: the count of a payload is its number of derivations: lifts count 1, products
    #: multiply counts and sums add them, all exact (checked) int64
    counts_derivations = True

    def batch_derivations(self, a: CovarianceBatch) -> np.ndarray:
        return a.count

    def batch_multiplicities(self, a: CovarianceBatch) -> np.ndarray | None:
        """The counts of a batch over no variable (``k · (1, 0, 0)``)."""
        return a.count if not a.block else None

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

    def index_of(self, variable: str) -> int:
        """Global index of a variable; :class:`RingError` if the ring does not know it."""
        try:
            return self._index[variable]
        except (KeyError, TypeError):
            raise RingError(
                f"unknown continuous variable {variable!r} (ring variables: "
                f"{', '.join(self.variables) or 'none'})"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly configuration and shifts (unfixed shifts are ``None``)."""
        return {
            "ring": self.name,
            "variables": list(self.variables),
            "shift": self.shift,
            "compensated": self.compensated,
            "zero_atol": self.zero_atol,
            "shifts": [None if math.isnan(h) else float(h) for h in self._shifts],
        }

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> CovarianceRing:
        """Inverse of :meth:`to_dict`."""
        ring = cls(
            config["variables"],
            shift=config.get("shift", True),
            compensated=config.get("compensated", True),
            zero_atol=config.get("zero_atol", 1e-9),
        )
        shifts = config.get("shifts") or []
        ring.set_shifts(
            {v: h for v, h in zip(ring.variables, shifts, strict=True) if h is not None}
        )
        return ring

    def _config(self) -> tuple:
        return (self.variables, self.shift, self.compensated, self.zero_atol)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CovarianceRing):
            return NotImplemented
        return self._config() == other._config()

    def __hash__(self) -> int:
        return hash(("CovarianceRing",) + self._config())

    def __repr__(self) -> str:
        return (
            f"CovarianceRing(variables={list(self.variables)!r}, shift={self.shift}, "
            f"compensated={self.compensated}, zero_atol={self.zero_atol})"
        )

    def _same_shifts(self, other: CovarianceRing) -> bool:
        return bool(np.array_equal(self._shifts, other._shifts, equal_nan=True))

    def check_same_ring(self, other: Ring) -> None:
        super().check_same_ring(other)
        if other is not self and not self._same_shifts(other):  # type: ignore[arg-type]
            raise RingError(
                f"covariance rings differ in their shifts: {self._shifts} vs {other._shifts}"  # type: ignore[attr-defined]
            )

    def _foreign(self, rid: int) -> None:
        other = _RINGS.get(rid)
        if other is None:
            raise RingError("payload belongs to a CovarianceRing instance that no longer exists")
        if other != self:
            raise RingError(f"payloads of different covariance rings: {self!r} and {other!r}")
        if not self._same_shifts(other):
            raise RingError(
                "payloads of two CovarianceRing instances with different shifts "
                f"({self._shifts} vs {other._shifts}); use one ring instance"
            )

    def _own(self, *items: CovariancePayload | CovarianceBatch) -> None:
        for item in items:
            rid = item.ring_id
            if rid is not None and rid != self._id:
                self._foreign(rid)

    def _check_block(self, block: Block) -> None:
        if block and max(block) >= self.m:
            raise RingError(f"block {block} has variable indices beyond degree {self.m}")

    # --------------------------------------------------------------- scalar face
    def _payload(self, block: Block, count: int, sums, products) -> CovariancePayload:
        return CovariancePayload(block, count, sums, products, ring_id=self._id)

    def zero(self) -> CovariancePayload:
        return self._payload((), 0, np.zeros(0), np.zeros((0, 0)))

    def one(self) -> CovariancePayload:
        return self._payload((), 1, np.zeros(0), np.zeros((0, 0)))

    def add(self, a: CovariancePayload, b: CovariancePayload) -> CovariancePayload:
        self._own(a, b)
        union = _union(a.block, b.block)
        sa, qa = _pad_full(a, union)
        sb, qb = _pad_full(b, union)
        return self._payload(union, a.count + b.count, sa + sb, qa + qb)

    def mul(self, a: CovariancePayload, b: CovariancePayload) -> CovariancePayload:
        self._own(a, b)
        ca, cb = float(a.count), float(b.count)
        if _is_disjoint(a.block, b.block):
            cross = np.outer(a.sums, b.sums)
            products = np.block([[cb * a.products, cross], [cross.T, ca * b.products]])
            sums = np.concatenate([cb * a.sums, ca * b.sums])
            return self._payload(a.block + b.block, a.count * b.count, sums, products)
        union = _union(a.block, b.block)
        sa, qa = _pad_full(a, union)
        sb, qb = _pad_full(b, union)
        products = cb * qa + ca * qb + np.outer(sa, sb) + np.outer(sb, sa)
        return self._payload(union, a.count * b.count, cb * sa + ca * sb, products)

    def neg(self, a: CovariancePayload) -> CovariancePayload:
        self._own(a)
        return self._payload(a.block, -a.count, -a.sums, -a.products)

    def is_zero(self, a: CovariancePayload) -> bool:
        return a.count == 0 and not np.any(a.sums) and not np.any(a.products)

    def equal(
        self, a: CovariancePayload, b: CovariancePayload, rtol: float = 0.0, atol: float = 0.0
    ) -> bool:
        """Equality independent of block order; missing variables count as zero entries."""
        return _payload_equal(a, b, rtol, atol)

    def reshift(
        self, payload: CovariancePayload, shifts: Mapping[str, float] | Sequence[float]
    ) -> CovariancePayload:
        """Re-express a payload made with other shifts ``a`` around this ring's shifts ``h``.

        ``payload`` holds the moments of ``x − a`` (``shifts``: one per ring variable in
        global order, or a mapping name -> shift; NaN or missing count as 0, as in
        serialized payloads); it may belong to another instance of an equal ring, e.g. a
        shard's.  With ``d = a − h`` the result, owned by this ring, is
        ``(c, s + c d, Q + s dᵀ + d sᵀ + c d dᵀ)``.  A shift still open here is first fixed
        to the payload's (so ``d = 0`` for it), as :meth:`from_bytes` does.
        """
        rid = payload.ring_id
        other = _RINGS.get(rid) if rid is not None and rid != self._id else None
        if other is not None and other != self:
            raise RingError(f"payloads of different covariance rings: {self!r} and {other!r}")
        self._check_block(payload.block)
        if isinstance(shifts, Mapping):
            source = np.full(self.m, np.nan)
            for name, value in shifts.items():
                source[self.index_of(name)] = float(value)
        else:
            source = np.asarray(shifts, dtype=np.float64).reshape(-1)
            if source.shape != (self.m,):
                raise RingError(f"reshift needs {self.m} shifts, got {source.shape[0]}")
        block = list(payload.block)
        a = source[block]
        for v, h in zip(block, a, strict=True):
            if math.isnan(self._shifts[v]) and math.isfinite(h):
                self._shifts[v] = h
        d = np.nan_to_num(a, nan=0.0) - np.nan_to_num(self._shifts[block], nan=0.0)
        c = float(payload.count)
        sums = payload.sums + c * d
        cross = np.outer(payload.sums, d)
        products = payload.products + (cross + cross.T) + c * np.outer(d, d)  # symmetric
        return self._payload(payload.block, payload.count, sums, products)

    def to_bytes(self, a: CovariancePayload) -> bytes:
        self._own(a)
        i, j = _triu(len(a.block))
        header = {
            "version": _FORMAT_VERSION,
            "variables": [self.variables[v] for v in a.block],
            "count": str(a.count),
        }
        return _pack(
            _PAYLOAD_MAGIC, header, [self._shifts[list(a.block)], a.sums, a.products[i, j]]
        )

    def from_bytes(self, data: bytes) -> CovariancePayload:
        reader = _Reader(data, _PAYLOAD_MAGIC)
        block = self._block_of(reader.header)
        k = len(block)
        self._adopt_shifts(block, reader.array("<f8", (k,)))
        sums = reader.array("<f8", (k,))
        packed = reader.array("<f8", (_plen(k),))
        reader.done()
        i, j = _triu(k)
        products = np.zeros((k, k))
        products[i, j] = packed
        products[j, i] = packed
        return self._payload(block, int(reader.header["count"]), sums, products)

    def _block_of(self, header: Mapping[str, Any]) -> Block:
        names = header.get("variables")
        if not isinstance(names, list):
            raise RingError("corrupt covariance payload header: no variable list")
        return tuple(self.index_of(v) for v in names)

    def _adopt_shifts(self, block: Block, stored: np.ndarray) -> None:
        """Check (or fix, when still open) the shifts a serialized payload was made with."""
        for v, h in zip(block, stored, strict=True):
            mine = self._shifts[v]
            if math.isnan(mine) and not math.isnan(h):
                self._shifts[v] = h
                continue
            effective = 0.0 if math.isnan(h) else h
            if not math.isnan(mine) and mine != effective:
                raise RingError(
                    f"payload was made with shift {effective!r} for {self.variables[v]!r} "
                    f"but this ring uses {mine!r}"
                )

    # ---------------------------------------------------------- batched helpers
    def _batch(self, block, count, sums, products, sums_lo=None, products_lo=None):
        return CovarianceBatch(block, count, sums, products, sums_lo, products_lo, self._id)

    def _zeros(self, n: int, block: Block = (), lo: bool = False) -> CovarianceBatch:
        k = len(block)
        zs = lambda: np.zeros((n, k))  # noqa: E731
        zp = lambda: np.zeros((n, _plen(k)))  # noqa: E731
        return self._batch(
            block,
            np.zeros(n, dtype=np.int64),
            zs(),
            zp(),
            zs() if lo else None,
            zp() if lo else None,
        )

    def _packed(self, block: Block, count: np.ndarray, floats: np.ndarray) -> CovarianceBatch:
        """A batch whose sums and products are views of ``floats`` (see
        :class:`CovarianceBatch`)."""
        sums, products = _split(floats, len(block))
        return CovarianceBatch(block, count, sums, products, ring_id=self._id, floats=floats)

    def _packed_copy(self, block: Block, count, sums, products) -> CovarianceBatch:
        """The arrays copied into one packed batch."""
        k = len(block)
        floats = np.empty((len(count), k + _plen(k)))
        floats[:, :k], floats[:, k:] = sums, products
        return self._packed(block, np.array(count, dtype=np.int64), floats)

    @staticmethod
    def _fold(b: CovarianceBatch) -> CovarianceBatch:
        """A plain batch with the compensation folded in (``hi + lo``)."""
        if b.sums_lo is None:
            return b
        return CovarianceBatch(
            b.block, b.count, b.sums + b.sums_lo, b.products + b.products_lo, ring_id=b.ring_id
        )

    @staticmethod
    def _check_len(a: CovarianceBatch, b: CovarianceBatch, what: str) -> None:
        if len(a.count) != len(b.count):
            raise RingError(
                f"{what} of covariance batches of different lengths {len(a.count)} "
                f"and {len(b.count)}"
            )

    @staticmethod
    def _pad(b: CovarianceBatch, union: Block, lo: bool = False):
        """``b``'s arrays over ``union`` (fresh zeros where ``b`` lacks variables)."""
        arrays = [b.sums, b.products]
        if lo:
            arrays += [b.sums_lo, b.products_lo]
        n, k = len(b.count), len(union)
        if b.block == union:
            if lo and b.sums_lo is None:
                arrays[2:] = [np.zeros((n, k)), np.zeros((n, _plen(k)))]
            return arrays
        pos, pmap = _embed(b.block, union)
        out = []
        for a, (width, index) in zip(arrays, itertools.cycle([(k, pos), (_plen(k), pmap)])):
            padded = np.zeros((n, width))
            if a is not None:
                padded[:, index] = a
            out.append(padded)
        return out

    # --------------------------------------------------------------- batched face
    def batch_zeros(self, n: int) -> CovarianceBatch:
        return self._zeros(n)

    def batch_ones(self, n: int) -> CovarianceBatch:
        ones = self._zeros(n)
        ones.count[:] = 1
        return ones

    def batch_accumulator(
        self, n: int, compensated: bool = True, block: Sequence[int] = ()
    ) -> CovarianceBatch:
        """A zero batch to accumulate into, with TwoSum compensation when the ring is
        ``compensated`` and ``compensated`` is not False.

        ``block`` optionally preallocates the variables so scatter-adds stay in place.
        """
        block = _as_block(block)
        self._check_block(block)
        if self.compensated and compensated:
            return self._zeros(n, block, lo=True)
        k = len(block)
        return self._packed(block, np.zeros(n, dtype=np.int64), np.zeros((n, k + _plen(k))))

    def batch_from(self, elements: Sequence[CovariancePayload]) -> CovarianceBatch:
        elements = list(elements)
        self._own(*elements)
        union: Block = ()
        for e in elements:
            union = _union(union, e.block)
        self._check_block(union)
        # payloads not made by this ring's lifts and additions: no bound is known
        self._guard_floats, self._count_bound = True, math.inf
        out = self._zeros(len(elements), union)
        for r, e in enumerate(elements):
            pos, pmap = _embed(e.block, union)
            i, j = _triu(len(e.block))
            out.count[r] = e.count
            out.sums[r, pos] = e.sums
            out.products[r, pmap] = e.products[i, j]
        return out

    def batch_to_list(self, batch: CovarianceBatch) -> list[CovariancePayload]:
        self._own(batch)
        b = self._fold(batch)
        n, k = len(b.count), len(b.block)
        i, j = _triu(k)
        full = np.empty((n, k, k))
        full[:, i, j] = b.products
        full[:, j, i] = b.products
        return [self._payload(b.block, int(b.count[r]), b.sums[r], full[r]) for r in range(n)]

    def batch_len(self, batch: CovarianceBatch) -> int:
        return len(batch.count)

    def batch_take(self, batch: CovarianceBatch, index: np.ndarray) -> CovarianceBatch:
        """Gather ``batch[index]``; from an accumulator the result holds ``hi + lo``."""
        self._own(batch)
        index = np.asarray(index)
        index = index.nonzero()[0] if index.dtype == bool else index.astype(np.intp, copy=False)
        # take gathers rows of a 2-d array several times faster than fancy indexing (the
        # methods: np.take's wrapper costs about as much as a small gather)
        if batch.floats is not None:
            return self._packed(
                batch.block, batch.count.take(index), batch.floats.take(index, axis=0)
            )
        count = batch.count.take(index)
        sums = batch.sums.take(index, axis=0)
        products = batch.products.take(index, axis=0)
        if batch.sums_lo is not None:
            sums += batch.sums_lo.take(index, axis=0)
            products += batch.products_lo.take(index, axis=0)
        return self._batch(batch.block, count, sums, products)

    def batch_concat(self, batches: Sequence[CovarianceBatch]) -> CovarianceBatch:
        batches = list(batches)
        if not batches:
            return self._zeros(0)
        self._own(*batches)
        union: Block = ()
        for b in batches:
            union = _union(union, b.block)
        lo = any(b.sums_lo is not None for b in batches)
        padded = [self._pad(b, union, lo) for b in batches]
        parts = [np.concatenate(col, axis=0) for col in zip(*padded, strict=True)]
        return self._batch(union, np.concatenate([b.count for b in batches]), *parts)

    def batch_add(self, a: CovarianceBatch, b: CovarianceBatch) -> CovarianceBatch:
        self._own(a, b)
        self._check_len(a, b, "sum")
        a, b = self._fold(a), self._fold(b)
        count = _add_counts(a.count, b.count)
        if a.block == b.block:
            return self._batch(a.block, count, a.sums + b.sums, a.products + b.products)
        union = _union(a.block, b.block)
        sums, products = self._pad(a, union)
        if a.block == union:
            sums, products = sums.copy(), products.copy()
        pos, pmap = _embed(b.block, union)
        sums[:, pos] += b.sums
        products[:, pmap] += b.products
        return self._batch(union, count, sums, products)

    def batch_neg(self, a: CovarianceBatch) -> CovarianceBatch:
        self._own(a)
        lo = (None, None) if a.sums_lo is None else (-a.sums_lo, -a.products_lo)
        return self._batch(a.block, -a.count, -a.sums, -a.products, *lo)

    def batch_mul(self, a: CovarianceBatch, b: CovarianceBatch) -> CovarianceBatch:
        self._own(a, b)
        self._check_len(a, b, "product")
        a, b = self._fold(a), self._fold(b)
        ca, cb = a.count, b.count
        count = _mul_counts(ca, cb)
        if not b.block:
            w = cb.astype(np.float64)[:, None]
            return self._batch(a.block, count, a.sums * w, a.products * w)
        if not a.block:
            w = ca.astype(np.float64)[:, None]
            return self._batch(b.block, count, b.sums * w, b.products * w)
        if _is_disjoint(a.block, b.block):
            return self._mul_disjoint(a, b, count)
        return self._mul_overlap(a, b, count)

    def _mul_disjoint(
        self, a: CovarianceBatch, b: CovarianceBatch, count: np.ndarray
    ) -> CovarianceBatch:
        """``Q = [[c_b Q_a, s_a s_bᵀ], [s_b s_aᵀ, c_a Q_b]]`` written straight into the packed
        union triangle: a few ufunc calls per batch, no loop over payloads."""
        plan = _disjoint_plan(len(a.block), len(b.block))
        n, ka, kb = len(count), plan.ka, plan.kb
        wa = b.count.astype(np.float64)[:, None]  # weight of a's entries: c_b
        wb = a.count.astype(np.float64)[:, None]
        sa, sb = a.sums, b.sums
        sums = np.empty((n, ka + kb))
        np.multiply(sa, wa, out=sums[:, :ka])
        np.multiply(sb, wb, out=sums[:, ka:])
        if plan.use_rows:
            products = np.empty((n, plan.pu))
            qa = a.products
            for r, u0, a0, length in plan.rows:
                np.multiply(qa[:, a0 : a0 + length], wa, out=products[:, u0 : u0 + length])
                np.multiply(sa[:, r : r + 1], sb, out=products[:, u0 + length : u0 + length + kb])
            np.multiply(b.products, wb, out=products[:, plan.pu - plan.pb :])
        else:
            parts = np.empty((n, plan.pu))
            pa, cross_end = plan.pa, plan.pa + ka * kb
            np.multiply(a.products, wa, out=parts[:, :pa])
            cross = parts[:, pa:cross_end].reshape(n, ka, kb)
            np.multiply(sa[:, :, None], sb[:, None, :], out=cross)
            np.multiply(b.products, wb, out=parts[:, cross_end:])
            products = np.take(parts, plan.gather, axis=1)
        return self._batch(a.block + b.block, count, sums, products)

    def _mul_overlap(
        self, a: CovarianceBatch, b: CovarianceBatch, count: np.ndarray
    ) -> CovarianceBatch:
        """Definition 6 on both operands padded to the union block."""
        union = _union(a.block, b.block)
        sa, qa = self._pad(a, union)
        sb, qb = self._pad(b, union)
        wa = b.count.astype(np.float64)[:, None]
        wb = a.count.astype(np.float64)[:, None]
        i, j = _triu(len(union))
        products = wa * qa + wb * qb + sa[:, i] * sb[:, j] + sb[:, i] * sa[:, j]
        return self._batch(union, count, wa * sa + wb * sb, products)

    def batch_scale(self, a: CovarianceBatch, k: np.ndarray) -> CovarianceBatch:
        self._own(a)
        k = np.asarray(k)
        if k.shape != (len(a.count),):
            raise RingError(f"scale needs {len(a.count)} multiplicities, got shape {k.shape}")
        if k.dtype.kind not in "iub":
            if k.dtype.kind != "f" or not np.all(np.mod(k, 1) == 0):
                raise RingError(f"multiplicities must be integers, got dtype {k.dtype}")
        k = k.astype(np.int64)
        a = self._fold(a)
        w = k.astype(np.float64)[:, None]
        return self._batch(a.block, _mul_counts(a.count, k), a.sums * w, a.products * w)

    def batch_sum_by(
        self, a: CovarianceBatch, groups: np.ndarray, n_groups: int
    ) -> CovarianceBatch:
        """Scatter-add by group: stable sort (skipped when sorted) + ``np.add.reduceat``.

        When every group is one element already in order, the result shares ``a``'s arrays
        (batches are not changed in place, except accumulators by :meth:`batch_scatter_add`).
        """
        self._own(a)
        a = self._fold(a)
        n = len(a.count)
        groups = np.asarray(groups)
        if groups.shape != (n,):
            raise RingError(f"sum_by needs {n} group ids, got shape {groups.shape}")
        out = self._zeros(n_groups, a.block)
        if n == 0:
            return out
        if groups.dtype.kind not in "iu":
            raise RingError(f"group ids must be integers, got dtype {groups.dtype}")
        if groups.min() < 0 or groups.max() >= n_groups:
            raise RingError(f"group ids must lie in [0, {n_groups})")
        _check_count_sums(a.count, groups, n_groups)
        if n_groups == 1:
            out.count[0] = a.count.sum()
            out.sums[0] = a.sums.sum(axis=0)
            out.products[0] = a.products.sum(axis=0)
            return out
        if np.all(groups[1:] >= groups[:-1]):
            count, sums, products = a.count, a.sums, a.products
        else:
            order = np.argsort(groups, kind="stable")
            groups = groups[order]
            count, sums, products = a.count[order], a.sums[order], a.products[order]
        starts = np.flatnonzero(np.concatenate([[True], groups[1:] != groups[:-1]]))
        if starts.size == n == n_groups:  # groups 0..n-1 in order: nothing to add up
            return self._batch(a.block, count, sums, products)
        keys = groups[starts]
        out.count[keys] = np.add.reduceat(count, starts)
        if sums.shape[1]:
            out.sums[keys] = np.add.reduceat(sums, starts, axis=0)
        if products.shape[1]:
            out.products[keys] = np.add.reduceat(products, starts, axis=0)
        return out

    def batch_mul_sum(
        self,
        factors: Sequence[CovarianceBatch],
        groups: np.ndarray | None = None,
        n_groups: int = 1,
    ) -> CovarianceBatch:
        """Fused product-then-sum.  Summing everything over pairwise disjoint blocks never
        materializes a product: with ``w_X = ∏_{Z≠X} c_Z`` and ``w_XY = ∏_{Z≠X,Y} c_Z``,
        ``s_X = w_Xᵀ S_X``, ``Q_XX = w_Xᵀ Q_X`` and ``Q_XY = (S_X w_XY)ᵀ S_Y``."""
        factors = [self._fold(f) for f in factors]
        if not factors:
            raise RingError("batch_mul_sum needs at least one factor")
        self._own(*factors)
        for f in factors[1:]:
            self._check_len(factors[0], f, "product")
        if groups is not None and len(groups) != len(factors[0].count):
            raise RingError(f"{len(groups)} group ids for {len(factors[0].count)} products")
        one_group = groups is None or (
            n_groups == 1 and (len(groups) == 0 or not np.any(np.asarray(groups)))
        )
        blocks = [f.block for f in factors]
        union: Block = tuple(v for blk in blocks for v in blk)
        if not one_group or len(set(union)) != len(union):
            return super().batch_mul_sum(
                factors, None if one_group else groups, 1 if one_group else n_groups
            )
        return self._fused_sum(factors, union)

    def _fused_sum(self, factors: list[CovarianceBatch], union: Block) -> CovarianceBatch:
        """The contraction of :meth:`batch_mul_sum` over disjoint blocks, a few calls per
        factor: exclusive prefix/suffix products of the counts give every ``w_X``; the cross
        blocks ``Q_XY`` of all ``X < Y`` come from one matrix product per ``Y`` whose left
        side weighs each earlier factor's sums by ``w_XY`` (kept exact as a running product
        of counts, so the float rounding is the same as with one weight per pair)."""
        plan = _fused_plan(tuple(len(f.block) for f in factors))
        t, n = len(factors), len(factors[0].count)
        out = self._zeros(1, union)
        if n == 0:
            return out
        counts = np.empty((t, n), dtype=np.int64)  # (np.stack costs more than the copy)
        for x, f in enumerate(factors):
            counts[x] = f.count
        largest = np.abs(counts).max(axis=1)  # per factor; negative only if -2**63 wrapped
        if largest.min() >= 0 and n * np.prod(largest, dtype=np.float64) < _COUNT_SAFE:
            total = counts[0].copy()
            for c in counts[1:]:
                total *= c
        else:  # rare: exact checks of every product and of the sum
            total = counts[0]
            for c in counts[1:]:
                total = _mul_counts(total, c)
            _check_count_sums(total, None, 1)
        out.count[0] = total.sum()
        c = counts.astype(np.float64)
        # pre[x] = prod_{z<x} c_z and suf[x] = prod_{z>x} c_z: exact for integer counts
        pre = np.ones((t, n))
        suf = np.ones((t, n))
        for x in range(1, t):
            np.multiply(pre[x - 1], c[x - 1], out=pre[x])
            np.multiply(suf[t - x], c[t - x], out=suf[t - x - 1])
        w = pre * suf
        diag = []
        for x, f in enumerate(factors):
            if not plan.ks[x]:
                continue
            lo, hi = plan.offsets[x], plan.offsets[x + 1]
            if f.floats is not None:  # sums and products in one product
                both = w[x] @ f.floats
                out.sums[0, lo:hi] = both[: hi - lo]
                diag.append(both[hi - lo :])
            else:
                np.matmul(w[x], f.sums, out=out.sums[0, lo:hi])
                diag.append(w[x] @ f.products)
        products = out.products[0]
        if diag:
            products[plan.diag] = np.concatenate(diag) if len(diag) > 1 else diag[0]
        if plan.cross:
            # the sums transposed, (variables, n): every product below runs along n
            sums_t = np.empty((plan.offsets[-1], n))
            for x, f in enumerate(factors):
                sums_t[plan.offsets[x] : plan.offsets[x + 1]] = f.sums.T
            # e[x] = prod_{z<y, z!=x} c_z for the earlier factors x < y of the current y
            e = np.ones((t, n))
            for y in range(1, t):
                off = plan.offsets[y]
                if plan.ks[y] and off:
                    weights = (e[:y] * suf[y])[plan.column_factor[:off]]
                    np.multiply(weights, sums_t[:off], out=weights)
                    block = weights @ sums_t[off : plan.offsets[y + 1]].T
                    products[plan.cross[y]] = block.ravel()
                e[:y] *= c[y]
                e[y] = pre[y]
        return out

    def batch_scatter_add(
        self, target: CovarianceBatch, slots: np.ndarray, values: CovarianceBatch
    ) -> CovarianceBatch:
        """``target[slots] += values`` in place (``slots`` unique); TwoSum into ``hi``/``lo``
        when ``target`` is a compensated accumulator.  A target lacking some of the values'
        variables is widened first (a new batch is returned)."""
        return self._scatter_add(target, slots, values, False)[0]

    def batch_scatter_add_saving(
        self, target: CovarianceBatch, slots: np.ndarray, values: CovarianceBatch
    ) -> tuple[CovarianceBatch, CovarianceBatch]:
        """A plain target's rows are copied from the gather the addition makes anyway."""
        if target.sums_lo is not None:
            return super().batch_scatter_add_saving(target, slots, values)
        return self._scatter_add(target, slots, values, True)

    def _scatter_add(
        self, target: CovarianceBatch, slots: np.ndarray, values: CovarianceBatch, save: bool
    ) -> tuple[CovarianceBatch, CovarianceBatch | None]:
        """:meth:`batch_scatter_add`; with ``save`` (a plain target) also the rows at
        ``slots`` before the addition."""
        self._own(target, values)
        values = self._fold(values)
        slots = np.asarray(slots, dtype=np.intp)
        if slots.shape != (len(values.count),):
            raise RingError(
                f"scatter_add needs one slot per value: {slots.shape} vs {len(values.count)}"
            )
        if self._guard_floats:  # before any change: a rejected delta leaves the target as it was
            _check_finite(values)
        union = _union(target.block, values.block)
        if union != target.block:
            lo = target.sums_lo is not None
            if target.floats is not None:
                target = self._packed_copy(union, target.count, *self._pad(target, union))
            else:
                target = self._batch(union, target.count.copy(), *self._pad(target, union, lo))
        sums, products = self._pad(values, union)
        m = slots.size
        if m and slots[-1] - slots[0] == m - 1 and (m < 3 or (np.diff(slots) == 1).all()):
            slots = slice(int(slots[0]), int(slots[0]) + m)  # consecutive: work on views
        if target.floats is not None:
            return self._scatter_add_packed(target, slots, values, sums, products, save)
        counts = _rows_at(target.count, slots)
        saved = [counts.copy()] if save else None
        self._count_bound += _magnitude(values.count)
        if self._count_bound < _COUNT_SAFE:
            counts += values.count
        else:
            counts = _add_counts(counts, values.count)
        target.count[slots] = counts
        if target.sums_lo is None:
            for array, add in ((target.sums, sums), (target.products, products)):
                rows = _rows_at(array, slots)
                if save:
                    saved.append(rows.copy())
                rows += add
                array[slots] = rows  # ``array[slots] += add``, the gather done by take
            return target, None if saved is None else self._batch(target.block, *saved)
        for hi, lo, add in (
            (target.sums, target.sums_lo, sums),
            (target.products, target.products_lo, products),
        ):
            a = _rows_at(hi, slots)
            s = a + add
            bb = s - a
            err = s - bb  # err = (a - (s - bb)) + (add - bb), TwoSum's rounding error
            np.subtract(a, err, out=err)
            np.subtract(add, bb, out=bb)
            err += bb
            hi[slots] = s
            err += _rows_at(lo, slots)
            lo[slots] = err
        return target, None

    def _scatter_add_packed(
        self,
        target: CovarianceBatch,
        slots: np.ndarray | slice,
        values: CovarianceBatch,
        sums: np.ndarray,
        products: np.ndarray,
        save: bool,
    ) -> tuple[CovarianceBatch, CovarianceBatch | None]:
        """:meth:`_scatter_add` into a packed target (``sums`` and ``products``: the values'
        over its block): one gather of its rows of floats, whole rows added when the values
        are packed over the same block, one scatter back."""
        counts = _rows_at(target.count, slots)
        rows = _rows_at(target.floats, slots)
        if save and isinstance(slots, slice):  # views of the target: copies are saved
            counts, rows = counts.copy(), rows.copy()
        self._count_bound += _magnitude(values.count)
        if self._count_bound < _COUNT_SAFE:
            added = counts + values.count
        else:
            added = _add_counts(counts, values.count)  # raises before any change on overflow
        # saving: the gathered rows are the saved ones and the sums go to a new array;
        # otherwise they are added in place (a slice's rows are views: added in the target)
        saved = self._packed(target.block, counts, rows) if save else None
        if values.floats is not None and values.block == target.block:
            rows = np.add(rows, values.floats, out=None if save else rows)
        else:
            k = len(target.block)
            if save:
                rows = rows.copy()
            rows[:, :k] += sums
            rows[:, k:] += products
        target.count[slots] = added
        if save or not isinstance(slots, slice):
            target.floats[slots] = rows
        return target, saved

    def batch_clear(self, target: CovarianceBatch, slots: np.ndarray) -> CovarianceBatch:
        self._own(target)
        slots = np.asarray(slots, dtype=np.intp)
        target.count[slots] = 0
        if target.floats is not None:
            target.floats[slots] = 0.0
            return target
        target.sums[slots] = 0.0
        target.products[slots] = 0.0
        if target.sums_lo is not None:
            target.sums_lo[slots] = 0.0
            target.products_lo[slots] = 0.0
        return target

    def batch_resize(self, batch: CovarianceBatch, n: int) -> CovarianceBatch:
        """Grow with zeros or truncate; compensation arrays are kept."""
        self._own(batch)
        size = len(batch.count)
        if batch.floats is not None:
            count = np.zeros(n, dtype=np.int64)
            floats = np.zeros((n, batch.floats.shape[1]))  # zeros: lazily zeroed pages
            count[: min(n, size)], floats[: min(n, size)] = batch.count[:n], batch.floats[:n]
            return self._packed(batch.block, count, floats)
        arrays = [batch.count, batch.sums, batch.products, batch.sums_lo, batch.products_lo]
        if n <= size:
            out = [None if a is None else a[:n].copy() for a in arrays]
        else:
            # np.zeros takes pages the OS zeroes lazily: only the copied part is written now
            out = []
            for a in arrays:
                grown = None
                if a is not None:
                    grown = np.zeros((n,) + a.shape[1:], a.dtype)
                    grown[:size] = a
                out.append(grown)
        return self._batch(batch.block, *out)

    def batch_is_zero(self, a: CovarianceBatch) -> np.ndarray:
        a = self._fold(a)
        return (a.count == 0) & ~np.any(a.sums, axis=1) & ~np.any(a.products, axis=1)

    def batch_is_negligible(self, a: CovarianceBatch) -> np.ndarray:
        """Count 0 and every floating entry within ``zero_atol`` of 0."""
        a = self._fold(a)
        tol = self.zero_atol
        return (
            (a.count == 0)
            & np.all(np.abs(a.sums) <= tol, axis=1)
            & np.all(np.abs(a.products) <= tol, axis=1)
        )

    # -------------------------------------------------------------------- lifting
    def check_lift(self, variable: str, values: np.ndarray) -> None:
        """Unknown variables, non-numbers, NaN and infinities raise :class:`RingError`."""
        self.index_of(variable)
        values = np.asarray(values)
        if values.ndim == 1:
            kind = values.dtype.kind
            if kind in "biu" or (kind == "f" and np.isfinite(values).all()):
                return  # integers are always finite numbers
        self._column(variable, values)

    def _column(self, variable: str, values: Any) -> np.ndarray:
        """Validate a column of a continuous variable as finite float64 values."""
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise RingError(
                f"values of continuous variable {variable!r} must be 1-d, got shape {arr.shape}"
            )
        kind = arr.dtype.kind
        if kind in "biuf":
            with np.errstate(over="ignore"):
                x = arr.astype(np.float64)
        elif kind == "O":
            x = np.empty(len(arr))
            for p, v in enumerate(arr):
                ok = isinstance(v, numbers.Real | decimal.Decimal) and not isinstance(v, str)
                try:
                    x[p] = float(v) if ok else np.nan
                except (OverflowError, ValueError):
                    ok = False
                if not ok:
                    raise RingError(
                        f"cannot lift {v!r} into continuous variable {variable!r} "
                        f"(position {p}: not a number)"
                    )
        else:
            first = arr[0].item() if len(arr) else None
            raise RingError(
                f"cannot lift {first!r} into continuous variable {variable!r} "
                f"(values of dtype {arr.dtype} are not numbers)"
            )
        bad = ~np.isfinite(x)
        if bad.any():
            p = int(np.argmax(bad))
            v = arr[p].item() if hasattr(arr[p], "item") else arr[p]
            raise RingError(
                f"cannot lift {v!r} into continuous variable {variable!r} "
                f"(position {p}: NaN and infinities are not allowed)"
            )
        return x

    def _shifted(self, j: int, x: np.ndarray) -> np.ndarray:
        """``x − h_j``, fixing ``h_j`` from this batch when it is still open."""
        h = self._shifts[j]
        if math.isnan(h):
            if not len(x):
                return x.copy()
            h = choose_shift(x)
            self._shifts[j] = h
            self._watch(abs(h))
        return x - h

    def batch_lift(self, variable: str, values: np.ndarray) -> CovarianceBatch:
        """``g_X(x) = (1, x', x'²)`` with ``x' = x − h_X``; block ``(index of X,)``."""
        j = self.index_of(variable)
        x = self._shifted(j, self._column(variable, values))
        n = len(x)
        if n:
            self._watch(float(np.abs(x).max()))
        return self._batch((j,), np.ones(n, np.int64), x[:, None], (x * x)[:, None])

    def batch_lift_block(self, variables: Sequence[str], columns: np.ndarray) -> CovarianceBatch:
        """Lift several variables of one relation at once: count 1, sums = the shifted row,
        products = its packed outer product.  Equals the product of the single lifts."""
        variables = list(variables)
        block = tuple(self.index_of(v) for v in variables)
        if len(set(block)) != len(block):
            raise RingError(f"variables lifted twice in one block: {variables}")
        columns = np.asarray(columns)
        k = len(block)
        if columns.ndim != 2 or columns.shape[1] != k:
            raise RingError(
                f"lift_block of {k} variables needs an (n, {k}) array, got {columns.shape}"
            )
        n = columns.shape[0]
        x = columns.astype(np.float64) if columns.dtype.kind in "biuf" else None
        if x is None or not np.isfinite(x).all():
            x = np.empty((n, k))
            for p, v in enumerate(variables):  # validate every column, naming the bad value
                x[:, p] = self._column(v, columns[:, p])
        if n and np.isnan(self._shifts[list(block)]).any():
            for p, j in enumerate(block):  # fix the shifts still open from this batch
                if math.isnan(self._shifts[j]):
                    self._shifted(j, x[:, p])
        x = x - self._shifts[list(block)]
        if x.size:
            self._watch(float(np.abs(x).max()))
        i, jj = _triu(k)
        xt = np.ascontiguousarray(x.T)  # gathering rows is far cheaper than columns
        products = _transposed(xt[i] * xt[jj])
        return self._batch(block, np.ones(n, np.int64), x, products)

    def batch_lift_factors(
        self, variables: Sequence[str], columns: Sequence[np.ndarray]
    ) -> list[CovarianceBatch]:
        """One block lift for several variables (the product of their lifts)."""
        if len(variables) > 1:
            return [self.batch_lift_block(variables, np.column_stack(columns))]
        return [self.batch_lift(v, c) for v, c in zip(variables, columns, strict=True)]

    def batch_lift_sum_by(self, variables, columns, groups, n_groups=1, weights=None):
        return self.batch_lift_block_sum_by(variables, columns, groups, n_groups, weights)

    def batch_lift_block_sum_by(
        self,
        variables: Sequence[str],
        columns: Sequence[np.ndarray],
        groups: np.ndarray | None,
        n_groups: int = 1,
        weights: np.ndarray | None = None,
    ) -> CovarianceBatch:
        """``sum_by(scale(lift_block(variables, columns), weights), groups)`` in one pass.

        ``columns`` holds one 1-d array per variable; ``weights`` are integer multiplicities
        (None: all 1); ``groups=None`` sums every row into one payload.  The same float
        operations in the same order as the three calls, so the same result, but the rows
        are worked on variable by variable (contiguous) and no lifted row is kept.
        """
        variables = list(variables)
        block = tuple(self.index_of(v) for v in variables)
        if len(set(block)) != len(block):
            raise RingError(f"variables lifted twice in one block: {variables}")
        k = len(block)
        if len(columns) != k:
            raise RingError(f"lift of {k} variables needs {k} columns, got {len(columns)}")
        n = len(columns[0]) if k else 0
        if groups is None:
            groups, n_groups = np.zeros(n, dtype=np.intp), 1
        groups = np.asarray(groups)
        if groups.shape != (n,) or any(np.shape(c) != (n,) for c in columns):
            raise RingError(f"lift_block_sum_by needs {n} values and group ids per variable")
        if n == 0:
            return self._zeros(n_groups, block)
        # (the result is allocated when needed: most grouped lifts return their sums)
        if groups.dtype.kind not in "iu" or groups.min() < 0 or groups.max() >= n_groups:
            raise RingError(f"group ids must be integers in [0, {n_groups})")
        lifted = np.empty((k + _plen(k), n))  # the shifted values, then their products
        x = lifted[:k]  # x[p]: the values of variables[p]
        for p, column in enumerate(columns):
            column = np.asarray(column)
            x[p] = column if column.dtype.kind in "biuf" else np.nan
        top = float(np.abs(x).max())  # NaN for NaN or a non-number
        if not top <= _SAFE_VALUE:  # NaN, ±inf, a non-number (named below) or a large value
            for p, v in enumerate(variables):  # validate every column, naming the bad value
                x[p] = self._column(v, columns[p])
        shifts = self._shifts[list(block)]
        if np.isnan(shifts).any():
            for p, j in enumerate(block):  # fix the shifts still open from this batch
                if math.isnan(self._shifts[j]):
                    self._shifted(j, x[p])
            shifts = self._shifts[list(block)]
        self._watch(top)  # and every shift was watched when it was fixed
        x -= shifts[:, None]
        if weights is not None:
            weights = np.asarray(weights)
            if weights.shape != (n,) or weights.dtype.kind not in "iub":
                raise RingError(f"lift_block_sum_by needs {n} integer weights")
            weights = weights.astype(np.int64, copy=False)
            _check_count_sums(weights, groups, n_groups)
        if n_groups == 1 and n > _MATMUL_ROWS:  # one group: Σxxᵀ as one matrix product
            return self._lift_sum_one(block, x, weights, self._zeros(1, block))
        unsorted = n > 1 and not (groups[1:] >= groups[:-1]).all()
        if unsorted and 2 * n_groups > n:  # most groups one row (shuffled rows)
            lengths = np.bincount(groups, minlength=n_groups)
            if lengths.min() > 0 and lengths.max() <= _PAIRWISE_BLOCK:  # no sort needed
                _lift_rows(x, weights, lifted[k:])
                count = lengths if weights is None else _sum_counts(weights, groups, n_groups)
                return self._packed(
                    block,
                    count.astype(np.int64, copy=False),
                    _group_sums_rows(lifted, groups, n_groups),  # sums and products at once
                )
        if unsorted:
            order = np.argsort(groups, kind="stable")
            groups, x = groups[order], x[:, order]
            weights = None if weights is None else weights[order]
        products = _lift_rows(x, weights, None if unsorted else lifted[k:])
        starts = np.flatnonzero(np.concatenate(([True], groups[1:] != groups[:-1])))
        keys = groups[starts]
        if weights is None:
            count = _run_lengths(starts, n)
        else:
            count = np.add.reduceat(weights, starts)
        if starts.size < n < 2 * starts.size:  # mostly one row per group (shuffled rows)
            sums = _segment_sums_rows(x, starts)
            products = _segment_sums_rows(products, starts)
            if keys.size == n_groups:  # every group has rows: the sums are the batch
                return self._batch(block, count, sums, products)
            out = self._zeros(n_groups, block)
            out.count[keys], out.sums[keys], out.products[keys] = count, sums, products
            return out
        out = self._zeros(n_groups, block)
        out.count[keys] = count
        if starts.size < n:
            x = np.add.reduceat(x, starts, axis=1)
            products = np.add.reduceat(products, starts, axis=1)
        out.sums[keys] = x.T
        out.products[keys] = products.T
        return out

    def _lift_sum_one(
        self, block: Block, x: np.ndarray, weights: np.ndarray | None, out: CovarianceBatch
    ) -> CovarianceBatch:
        """``Σ_i w_i · lift(x_i)`` of many shifted rows ``x`` (variables × rows) into one
        payload, with BLAS: ``Σxxᵀ = (x w) xᵀ`` instead of a packed product per row.  Rows of
        one weight ``w`` (all inserts, all deletes) take ``w · x xᵀ``: BLAS computes ``x xᵀ``
        (syrk) and ``(x w) xᵀ`` (gemm) with different roundings, so a delete of inserted rows
        would not cancel them exactly."""
        i, j = _triu(len(block))
        if weights is None or (weights == weights[0]).all():
            w = 1 if weights is None else int(weights[0])
            out.count[0] = w * x.shape[1]
            out.sums[0] = x.sum(axis=1) * w
            out.products[0] = (x @ x.T)[i, j] * w
            return out
        out.count[0] = int(weights.sum())
        weighted = x * weights.astype(np.float64)
        out.sums[0] = weighted.sum(axis=1)
        out.products[0] = (weighted @ x.T)[i, j]
        return out

    # -------------------------------------------------------------- serialization
    def batch_to_bytes(self, batch: CovarianceBatch) -> bytes:
        self._own(batch)
        header = {
            "version": _FORMAT_VERSION,
            "variables": [self.variables[v] for v in batch.block],
            "n": len(batch.count),
            "compensated": batch.sums_lo is not None,
        }
        arrays = [self._shifts[list(batch.block)], batch.count, batch.sums, batch.products]
        if batch.sums_lo is not None:
            arrays += [batch.sums_lo, batch.products_lo]
        return _pack(_BATCH_MAGIC, header, arrays)

    def batch_from_bytes(self, data: bytes) -> CovarianceBatch:
        reader = _Reader(data, _BATCH_MAGIC)
        block = self._block_of(reader.header)
        n, k = int(reader.header["n"]), len(block)
        self._adopt_shifts(block, reader.array("<f8", (k,)))
        arrays = [
            reader.array("<i8", (n,)),
            reader.array("<f8", (n, k)),
            reader.array("<f8", (n, _plen(k))),
        ]
        if reader.header.get("compensated"):
            arrays += [reader.array("<f8", (n, k)), reader.array("<f8", (n, _plen(k)))]
        reader.done()
        # payloads not made by this ring's lifts and additions: no bound is known
        self._guard_floats, self._count_bound = True, math.inf
        return self._batch(block, *arrays)

    # ---------------------------------------------------------------- statistics
    def _as_payload(self, payload: CovariancePayload | CovarianceBatch) -> CovariancePayload:
        if isinstance(payload, CovarianceBatch):
            if len(payload.count) != 1:
                raise RingError(f"expected one payload, got a batch of {len(payload.count)}")
            return self.batch_to_list(payload)[0]
        self._own(payload)
        self._check_block(payload.block)
        return payload

    def _block_shifts(self, block: Block) -> np.ndarray:
        return np.nan_to_num(self._shifts[list(block)], nan=0.0)

    def _warn_far_shifts(self, p: CovariancePayload) -> None:
        """Warn when a variable's shift is so far from its data that its variance lost half
        its digits or more (e.g. an outlier in the batch that fixed the shift): ``Q'/c`` is
        then ``(s'/c)²`` up to rounding."""
        if p.count <= 0 or not p.block:
            return
        second = np.diagonal(p.products) / p.count
        mean = p.sums / p.count
        variance = np.maximum(second - mean * mean, 0.0)
        with np.errstate(all="ignore"):
            kept = variance / second
        # far: the shift is far from the data, measured by the data's own magnitude (a
        # constant 0 has none, and loses nothing)
        scale = np.abs(self._block_shifts(p.block) + mean) + np.sqrt(variance)
        far = (scale > 0) & (np.abs(mean) > _FAR_SHIFT * scale)
        far = np.flatnonzero(far & (second > 0) & (kept < _KEPT_VARIANCE))
        if far.size:
            j = int(far[0])
            name, shift = self.variables[p.block[j]], float(self._shifts[p.block[j]])
            digits = max(0, int(16 + math.log10(max(kept[j], 1e-300))))
            warnings.warn(
                f"CovarianceRing: the shift of {name!r} ({shift!r}, fixed by its first lifted "
                f"batch) is far from its mean ({shift + float(mean[j])!r}): its variance keeps "
                f"about {digits} of 16 digits; fix the shifts up front (ring.set_shifts) or "
                "start afresh with a new ring",
                RuntimeWarning,
                stacklevel=3,
            )

    def moments(
        self, payload: CovariancePayload | CovarianceBatch
    ) -> tuple[int, np.ndarray, np.ndarray]:
        """``(count, Σx, Σxxᵀ)`` in original units, ``(m,)`` and ``(m, m)`` in global variable
        order; variables outside the payload's block are 0."""
        p = self._as_payload(payload)
        pos = list(p.block)
        h = self._block_shifts(p.block)
        c = float(p.count)
        sums = np.zeros(self.m)
        products = np.zeros((self.m, self.m))
        sums[pos] = p.sums + c * h
        products[np.ix_(pos, pos)] = (
            p.products + np.outer(p.sums, h) + np.outer(h, p.sums) + c * np.outer(h, h)
        )
        return p.count, sums, products

    def statistics(
        self, payload: CovariancePayload | CovarianceBatch, ddof: int = 0
    ) -> CovarianceStatistics:
        """Count, mean and covariance (population for ``ddof=0``) in original units.

        Computed from the shifted moments as ``Q'/c − (s'/c)(s'/c)ᵀ`` (no unshifting, so no
        cancellation); negative rounding residue on the diagonal is clamped to 0.  Variables
        outside the block have mean and covariance 0; count 0 gives NaN.
        """
        p = self._as_payload(payload)
        self._warn_far_shifts(p)
        pos = list(p.block)
        mean = np.zeros(self.m)
        cov = np.zeros((self.m, self.m))
        c = p.count
        if c == 0 or c - ddof == 0:
            mean[:] = np.nan
            cov[:] = np.nan
            return CovarianceStatistics(self.variables, c, mean, cov)
        centred = p.sums / c
        block_cov = p.products / c - np.outer(centred, centred)
        if ddof:
            block_cov *= c / (c - ddof)
        diag = np.arange(len(pos))
        block_cov[diag, diag] = np.maximum(block_cov[diag, diag], 0.0)
        mean[pos] = self._block_shifts(p.block) + centred
        cov[np.ix_(pos, pos)] = block_cov
        return CovarianceStatistics(self.variables, c, mean, cov)

    def sigma(
        self,
        payload: CovariancePayload | CovarianceBatch,
        variables: Sequence[str] | None = None,
    ) -> np.ndarray:
        """``Σ = [[c, s'ᵀ], [s', Q']]``, ``(1+k) x (1+k)``, over the SHIFTED variables.

        ``variables`` picks and orders the rows (default: all ring variables in global
        order; ones outside the payload's block are zero rows).  This is the matrix a
        covariance-based regression solves on (notes §9.1.1).  Slopes fitted on it are the
        slopes in original units; with label ``y`` and features ``x_j``, the intercept in
        original units is ``θ_0 + h_y − Σ_j θ_j h_j`` where ``h = ring.shifts``.
        """
        p = self._as_payload(payload)
        self._warn_far_shifts(p)
        names = self.variables if variables is None else list(variables)
        wanted = [self.index_of(v) for v in names]
        where = {v: q for q, v in enumerate(p.block)}
        rows = np.asarray([1 + q for q, v in enumerate(wanted) if v in where], dtype=np.intp)
        src = np.asarray([where[v] for v in wanted if v in where], dtype=np.intp)
        out = np.zeros((1 + len(wanted), 1 + len(wanted)))
        out[0, 0] = p.count
        out[0, rows] = p.sums[src]
        out[rows, 0] = p.sums[src]
        out[np.ix_(rows, rows)] = p.products[np.ix_(src, src)]
        return out
