"""Relational payloads: the relational data ring F[ℤ] and the factorized ring of Example 21.

Scalar face (both rings)
    An element is a ``dict`` from *keys* to non-zero ``int`` multiplicities.  A key is a tuple
    of ``(variable, value)`` pairs sorted by variable name, so every tuple carries its own
    schema (F-IVM footnote 4): ``{}`` is 0, ``{(): 1}`` is 1, and relations over different
    schemas can be added (union across schemas) and multiplied (join on the shared variables).
    Use :func:`make_relation` to build elements from a schema and rows.  Values on the scalar
    face may be any hashable (ints, strings, ...); :meth:`to_bytes` supports JSON scalars.

Batched face (both rings)
    A batch of ``n`` relations is a coalesced COO table -- ``row`` (which relation, int64),
    key columns (int64 *codes*) and ``mult`` (int64, never 0) -- sorted by ``(row, keys)`` and
    without duplicate keys.  Values at the batched face must be integer codes (the engine
    dictionary-encodes other values); the code ``-2**63`` is reserved.
    Multiplicities are int64 and every operation checks for overflow (:class:`RingError`).
"""

from __future__ import annotations

import io
import json
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ringml.rings.base import Ring, RingError, check_code_maps, recode_column
from ringml.rings.scalar import (
    INT64_MIN,
    as_int64_column,
    checked_mul,
    checked_neg,
    checked_sum_by,
)

__all__ = [
    "ABSENT",
    "CONFLICT",
    "CONFLICT_CODE",
    "FactorizedBatch",
    "FactorizedRing",
    "RelationBatch",
    "RelationalRing",
    "make_relation",
]

#: Code marking "this variable is not in the tuple's schema" in a :class:`RelationBatch`.
ABSENT = INT64_MIN

Key = tuple[tuple[str, Any], ...]
Relation = dict[Key, int]


# =================================================================== scalar-face helpers
def _canon_key(key: Any) -> Key:
    if not isinstance(key, tuple):
        raise RingError(f"a relation key must be a tuple of (variable, value) pairs, got {key!r}")
    for pair in key:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise RingError(f"a relation key must hold (variable, value) pairs, got {key!r}")
    out = tuple(sorted(key, key=lambda p: p[0]))
    for p, q in zip(out, out[1:], strict=False):
        if p[0] == q[0]:
            raise RingError(f"variable {p[0]!r} occurs twice in the key {key!r}")
    return out


def _canon(rel: Any) -> Relation:
    """Validate a relation, sort its keys, add up duplicate keys and drop zeros."""
    if not isinstance(rel, Mapping):
        raise RingError(f"a relational payload must be a dict of key -> int, got {rel!r}")
    out: Relation = {}
    for key, m in rel.items():
        if isinstance(m, bool) or not isinstance(m, numbers.Integral):
            raise RingError(f"multiplicity {m!r} of key {key!r} is not an integer")
        k = _canon_key(key)
        out[k] = out.get(k, 0) + int(m)
    return {k: m for k, m in out.items() if m != 0}


def _union(a: Relation, b: Relation) -> Relation:
    out = dict(a)
    for k, m in b.items():
        s = out.get(k, 0) + m
        if s:
            out[k] = s
        else:
            out.pop(k, None)
    return out


def _join_keys(k1: Key, k2: Key) -> Key | None:
    """The union of two consistent tuples, or None when they disagree on a shared variable."""
    if not k1:
        return k2
    if not k2:
        return k1
    d = dict(k1)
    for var, val in k2:
        if var in d:
            if d[var] != val:
                return None
        else:
            d[var] = val
    return tuple(sorted(d.items(), key=lambda p: p[0]))


def _rel_equal(a: Relation, b: Relation, rtol: float, atol: float) -> bool:
    if a == b:
        return True
    for k in a.keys() | b.keys():
        x, y = a.get(k, 0), b.get(k, 0)
        if abs(x - y) > atol + rtol * abs(y):
            return False
    return True


class _Conflict:
    """The value of a factorized key whose derivations disagree on the key's variable."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CONFLICT"

    def __reduce__(self) -> str:
        return "CONFLICT"


#: Value of a :class:`FactorizedRing` key ``(X=CONFLICT)`` (see FactorizedRing); code -2**63.
CONFLICT = _Conflict()
CONFLICT_CODE = INT64_MIN


def _json_value(v: Any) -> Any:
    if v is CONFLICT:
        return {"conflict": None}
    if v is None or isinstance(v, (bool, int, float, str)):
        return int(v) if isinstance(v, np.integer) else v
    if isinstance(v, np.integer):
        return int(v)
    raise RingError(
        f"to_bytes supports JSON scalar values (int, float, str, bool, None), got {v!r}"
    )


def _rel_to_bytes(rel: Relation) -> bytes:
    items = [[[[var, _json_value(val)] for var, val in key], int(m)] for key, m in rel.items()]
    return json.dumps(items, separators=(",", ":")).encode()


def _rel_from_bytes(data: bytes) -> Relation:
    try:
        items = json.loads(data.decode())
        return {
            tuple((var, CONFLICT if isinstance(val, dict) else val) for var, val in key): m
            for key, m in items
        }
    except (ValueError, TypeError) as e:
        raise RingError(f"invalid relational payload bytes: {e}") from None


def make_relation(schema: Sequence[str], rows: Mapping[tuple, int] | Iterable[tuple]) -> Relation:
    """A relation over ``schema``: ``rows`` maps value tuples to multiplicities, or is an
    iterable of value tuples (multiplicity 1 each, duplicates add up).

    >>> make_relation(["A", "B"], {(1, 2): 3})
    {(('A', 1), ('B', 2)): 3}
    """
    schema = tuple(schema)
    items = rows.items() if isinstance(rows, Mapping) else ((r, 1) for r in rows)
    out: dict[Key, int] = {}
    for values, m in items:
        values = tuple(values) if isinstance(values, (tuple, list)) else (values,)
        if len(values) != len(schema):
            raise RingError(f"row {values!r} does not fit the schema {schema!r}")
        key = tuple(zip(schema, values, strict=True))
        out[key] = out.get(key, 0) + m
    return _canon(out)


# =================================================================== batched-face core
def _dense_ids(cols: Sequence[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lexicographic group ids of the rows of ``cols``: (ids, order, change flags in order)."""
    if not cols:
        change = np.zeros(m, dtype=bool)
        change[:1] = True
        return np.zeros(m, np.int64), np.arange(m), change
    order = np.lexsort(tuple(reversed(cols)))  # first column is the primary key
    change = np.empty(m, dtype=bool)
    if m:
        change[0] = True
        change[1:] = False
        for c in cols:
            cs = c[order]
            change[1:] |= cs[1:] != cs[:-1]
    ids_sorted = np.cumsum(change) - 1
    ids = np.empty(m, dtype=np.int64)
    ids[order] = ids_sorted
    return ids, order, change


def _coalesce(row: np.ndarray, keys: np.ndarray, mult: np.ndarray):
    """Sort by (row, keys), add up equal keys (exactly), drop zero multiplicities."""
    m = len(row)
    if not m:
        return row, keys, mult
    cols = [row] + [keys[:, j] for j in range(keys.shape[1])]
    ids, order, change = _dense_ids(cols, m)
    starts = np.flatnonzero(change)
    sums = checked_sum_by(mult, ids, len(starts))
    keep = sums != 0
    first = order[starts][keep]
    return row[first], keys[first], sums[keep]


def _equi_join(ka: Sequence[np.ndarray], kb: Sequence[np.ndarray], ma: int, mb: int):
    """All index pairs (i, j) with ka[.][i] == kb[.][j] (sort-merge with repeat/offsets)."""
    both = [np.concatenate([x, y]) for x, y in zip(ka, kb, strict=True)]
    ids, _, _ = _dense_ids(both, ma + mb)
    ida, idb = ids[:ma], ids[ma:]
    order_b = np.argsort(idb, kind="stable")
    sb = idb[order_b]
    lo = np.searchsorted(sb, ida, "left")
    cnt = np.searchsorted(sb, ida, "right") - lo
    total = int(cnt.sum())
    ia = np.repeat(np.arange(ma), cnt)
    offs = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    ib = order_b[np.repeat(lo, cnt) + offs]
    return ia, ib


def _row_slices(row: np.ndarray, n: int, index: np.ndarray):
    """Entry positions of rows ``index`` (in order) and their new row numbers."""
    counts = np.bincount(row, minlength=n)
    starts = np.cumsum(counts) - counts
    c = counts[index]
    total = int(c.sum())
    new_row = np.repeat(np.arange(len(index), dtype=np.int64), c)
    pos = np.repeat(starts[index], c) + (np.arange(total) - np.repeat(np.cumsum(c) - c, c))
    return pos, new_row


def _check_groups(groups: Any, n: int, n_groups: int) -> np.ndarray:
    groups = np.asarray(groups, dtype=np.int64)
    if groups.shape != (n,):
        raise RingError(f"groups has shape {groups.shape}, expected ({n},)")
    if n and (groups.min() < 0 or groups.max() >= n_groups):
        raise RingError(f"group ids must lie in [0, {n_groups})")
    return groups


def _check_index(index: Any, n: int) -> np.ndarray:
    index = np.asarray(index, dtype=np.int64).reshape(-1)
    if index.size and (index.min() < -n or index.max() >= n):
        raise RingError(f"index out of range for a batch of {n}")
    return np.where(index < 0, index + n, index)


def _save(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _load(data: bytes, names: Sequence[str]) -> list[np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return [z[name] for name in names]
    except Exception as e:  # noqa: BLE001 - any decoding failure is bad input
        raise RingError(f"invalid batch bytes: {e}") from None


class _RowTable:
    """``n`` payloads as one COO table whose entries carry their payload's ``row``."""

    n: int
    row: np.ndarray

    def __len__(self) -> int:
        return self.n

    @property
    def nnz(self) -> int:
        return len(self.row)


@dataclass(frozen=True, eq=False)
class RelationBatch(_RowTable):
    """``n`` relations as one coalesced COO table (see the module docstring).

    ``codes[:, j]`` holds the values of ``variables[j]`` (sorted names); :data:`ABSENT` marks a
    tuple whose schema lacks that variable.  A batch stored by a view has a fixed schema (no
    ABSENT); sums across schemas produce mixed tables, which every operation supports.
    """

    n: int
    variables: tuple[str, ...]
    row: np.ndarray
    codes: np.ndarray
    mult: np.ndarray

    @property
    def schema(self) -> tuple[str, ...] | None:
        """The common schema of every tuple, or None when the batch mixes schemas."""
        if self.codes.size and (self.codes == ABSENT).any():
            return None
        return self.variables

    def select(self, pos, n: int | None = None, row=None) -> RelationBatch:
        """The entries at ``pos`` (indices or a mask), optionally as ``n`` rows numbered
        ``row``; variables no remaining tuple has are dropped."""
        return _relation_batch(
            self.n if n is None else n,
            self.variables,
            self.row[pos] if row is None else row,
            self.codes[pos],
            self.mult[pos],
        )

    def with_mult(self, mult: np.ndarray) -> RelationBatch:
        return RelationBatch(self.n, self.variables, self.row, self.codes, mult)


@dataclass(frozen=True, eq=False)
class FactorizedBatch(_RowTable):
    """``n`` factorized payloads as a COO table: ``var`` is the index of the key's variable in
    the ring's order (``len(order)`` for the empty key, whose ``code`` is 0)."""

    n: int
    row: np.ndarray
    var: np.ndarray
    code: np.ndarray
    mult: np.ndarray

    def select(self, pos, n: int | None = None, row=None) -> FactorizedBatch:
        """The entries at ``pos`` (indices or a mask), optionally as ``n`` rows numbered
        ``row``."""
        return FactorizedBatch(
            self.n if n is None else n,
            self.row[pos] if row is None else row,
            self.var[pos],
            self.code[pos],
            self.mult[pos],
        )

    def with_mult(self, mult: np.ndarray) -> FactorizedBatch:
        return FactorizedBatch(self.n, self.row, self.var, self.code, mult)


def _relation_batch(n: int, variables: Sequence[str], row, codes, mult) -> RelationBatch:
    """A :class:`RelationBatch`, dropping variables absent from every remaining tuple."""
    variables = tuple(variables)
    if codes.shape[1]:
        used = (codes != ABSENT).any(axis=0) if len(row) else np.zeros(len(variables), bool)
        if not used.all():
            variables = tuple(v for v, u in zip(variables, used, strict=True) if u)
            codes = codes[:, used]
    return RelationBatch(n, variables, _i64(row), codes.astype(np.int64, copy=False), _i64(mult))


class _RowTableFace:
    """The batched operations that rings whose batches are row-numbered COO tables (key
    columns and an exact multiplicity per entry) share; ``batch_type`` is that table."""

    batch_type: type

    def _b(self, a: Any):
        if not isinstance(a, self.batch_type):
            raise RingError(
                f"{self!r}: expected a {self.batch_type.__name__}, got {type(a).__name__}"
            )
        return a

    def _pair(self, a: Any, b: Any):
        a, b = self._b(a), self._b(b)
        if a.n != b.n:
            raise RingError(f"{self!r}: batches of lengths {a.n} and {b.n}")
        return a, b

    def batch_len(self, batch) -> int:
        return self._b(batch).n

    def batch_take(self, batch, index: np.ndarray):
        b = self._b(batch)
        index = _check_index(index, b.n)
        pos, new_row = _row_slices(b.row, b.n, index)
        return b.select(pos, len(index), new_row)

    def batch_neg(self, a):
        a = self._b(a)
        return a.with_mult(checked_neg(a.mult))

    def batch_scale(self, a, k: np.ndarray):
        a = self._b(a)
        k = _i64(k)
        if k.shape != (a.n,):
            raise RingError(f"scale factors of shape {k.shape} for a batch of {a.n}")
        mult = checked_mul(a.mult, k[a.row], "scaling")
        return a.with_mult(mult).select(mult != 0)

    def batch_is_zero(self, a) -> np.ndarray:
        a = self._b(a)
        return np.bincount(a.row, minlength=a.n) == 0

    def batch_clear(self, target, slots: np.ndarray):
        t = self._b(target)
        return t.select(~np.isin(t.row, _check_index(slots, t.n)))

    def batch_resize(self, batch, n: int):
        b = self._b(batch)
        return b.select(b.row < n, n)


def _i64(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


# =================================================================== the relational ring
class RelationalRing(_RowTableFace, Ring):
    """F[ℤ] (Definition 8): relations over ℤ, ``+`` = ⊎, ``*`` = ⊗ (natural join).

    ``listed`` variables lift to singleton relations ``x ↦ {(X=x) ↦ 1}`` (listing / group-by
    payloads, Sect. 8.3); every other variable lifts to ``1 = {() ↦ 1}``.  Tuples carry their
    own schemas, so the ring axioms hold exactly: this is the ℤ-algebra of the monoid of
    partial tuples under "union if consistent, else 0".
    """

    name = "relational"
    batch_type = RelationBatch

    def __init__(self, listed: Iterable[str] = ()) -> None:
        if isinstance(listed, str):
            listed = [listed]
        self._listed = frozenset(str(x) for x in listed)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._listed == self._listed  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(("relational", self._listed))

    def __repr__(self) -> str:
        return f"RelationalRing(listed={sorted(self._listed)!r})"

    relation = staticmethod(make_relation)

    # ---------------------------------------------------------------- scalar face
    def zero(self) -> Relation:
        return {}

    def one(self) -> Relation:
        return {(): 1}

    def add(self, a: Relation, b: Relation) -> Relation:
        return _union(_canon(a), _canon(b))

    def mul(self, a: Relation, b: Relation) -> Relation:
        a, b = _canon(a), _canon(b)
        out: Relation = {}
        for k1, m1 in a.items():
            for k2, m2 in b.items():
                k = _join_keys(k1, k2)
                if k is not None:
                    out[k] = out.get(k, 0) + m1 * m2
        return {k: m for k, m in out.items() if m}

    def neg(self, a: Relation) -> Relation:
        return {k: -m for k, m in _canon(a).items()}

    def scale(self, a: Relation, k: int) -> Relation:
        k = int(k)
        return {key: k * m for key, m in _canon(a).items()} if k else {}

    def is_zero(self, a: Relation) -> bool:
        return not _canon(a)

    def equal(self, a: Relation, b: Relation, rtol: float = 0.0, atol: float = 0.0) -> bool:
        return _rel_equal(_canon(a), _canon(b), rtol, atol)

    @property
    def lifted_variables(self) -> frozenset[str]:
        return self._listed

    @property
    def keyed_variables(self) -> frozenset[str]:
        """Listed values are keys: the engine lifts their codes."""
        return self._listed

    def lift(self, variable: str, value: Any) -> Relation:
        if variable not in self._listed:
            return self.one()
        try:
            hash(value)
        except TypeError:
            raise RingError(f"cannot lift {variable!r} value {value!r}: unhashable") from None
        return {((variable, value),): 1}

    def to_bytes(self, a: Relation) -> bytes:
        return _rel_to_bytes(_canon(a))

    def from_bytes(self, data: bytes) -> Relation:
        return _canon(_rel_from_bytes(data))

    @staticmethod
    def schema_of(a: Relation) -> frozenset[str] | None:
        """The schema shared by all tuples of ``a`` (None if mixed, ∅ for 0 and 1)."""
        schemas = {frozenset(v for v, _ in k) for k in a}
        if len(schemas) > 1:
            return None
        return next(iter(schemas), frozenset())

    @staticmethod
    def total(a: Relation) -> int:
        """The sum of all multiplicities (e.g. the COUNT of a listing payload)."""
        return sum(a.values())

    # ---------------------------------------------------------------- batched face
    _make = staticmethod(_relation_batch)

    @staticmethod
    def _align(b: RelationBatch, variables: tuple[str, ...]) -> np.ndarray:
        if b.variables == variables:
            return b.codes
        out = np.full((b.nnz, len(variables)), ABSENT, dtype=np.int64)
        pos = {v: j for j, v in enumerate(variables)}
        for j, v in enumerate(b.variables):
            out[:, pos[v]] = b.codes[:, j]
        return out

    def batch_zeros(self, n: int) -> RelationBatch:
        return RelationBatch(n, (), _i64([]), np.zeros((0, 0), np.int64), _i64([]))

    def batch_ones(self, n: int) -> RelationBatch:
        return RelationBatch(
            n, (), np.arange(n, dtype=np.int64), np.zeros((n, 0), np.int64), np.ones(n, np.int64)
        )

    def batch_from(self, elements: Sequence[Relation]) -> RelationBatch:
        rels = [_canon(e) for e in elements]
        variables = tuple(sorted({v for r in rels for k in r for v, _ in k}))
        pos = {v: j for j, v in enumerate(variables)}
        rows, codes, mults = [], [], []
        for i, r in enumerate(rels):  # packing the scalar face: one Python step per tuple
            for key, m in r.items():
                line = [ABSENT] * len(variables)
                for var, val in key:
                    if isinstance(val, bool) or not isinstance(val, numbers.Integral):
                        raise RingError(
                            f"{self!r}: batched values must be integer codes; "
                            f"variable {var!r} has value {val!r}"
                        )
                    if not ABSENT < int(val) < 2**63:
                        raise RingError(
                            f"{self!r}: code {val!r} of {var!r} outside the int64 range"
                        )
                    line[pos[var]] = int(val)
                rows.append(i)
                codes.append(line)
                mults.append(m)
        mult = as_int64_column(np.asarray(mults, dtype=object), "<multiplicity>", repr(self))
        code_arr = np.asarray(codes, dtype=np.int64).reshape(len(rows), len(variables))
        row, code_arr, mult = _coalesce(_i64(rows), code_arr, mult)
        return self._make(len(rels), variables, row, code_arr, mult)

    def batch_to_list(self, batch: RelationBatch) -> list[Relation]:
        b = self._b(batch)
        out: list[Relation] = [{} for _ in range(b.n)]
        for r, line, m in zip(b.row.tolist(), b.codes.tolist(), b.mult.tolist(), strict=True):
            key = tuple((v, c) for v, c in zip(b.variables, line, strict=True) if c != ABSENT)
            out[r][key] = m
        return out

    def batch_concat(self, batches: Sequence[RelationBatch]) -> RelationBatch:
        bs = [self._b(b) for b in batches]
        if not bs:
            return self.batch_zeros(0)
        variables = tuple(sorted({v for b in bs for v in b.variables}))
        offsets = np.cumsum([0] + [b.n for b in bs])
        row = np.concatenate([b.row + off for b, off in zip(bs, offsets, strict=False)])
        codes = np.concatenate([self._align(b, variables) for b in bs])
        mult = np.concatenate([b.mult for b in bs])
        return self._make(int(offsets[-1]), variables, row, codes, mult)

    def _sum_tables(self, n: int, parts: Sequence[tuple[RelationBatch, np.ndarray]]):
        """Coalesce the union of several tables (each with its row numbers) into n rows."""
        variables = tuple(sorted({v for b, _ in parts for v in b.variables}))
        row = np.concatenate([r for _, r in parts])
        codes = np.concatenate([self._align(b, variables) for b, _ in parts])
        mult = np.concatenate([b.mult for b, _ in parts])
        row, codes, mult = _coalesce(row, codes, mult)
        return self._make(n, variables, row, codes, mult)

    def batch_add(self, a: RelationBatch, b: RelationBatch) -> RelationBatch:
        a, b = self._pair(a, b)
        if not b.nnz:
            return a
        if not a.nnz:
            return b
        return self._sum_tables(a.n, [(a, a.row), (b, b.row)])

    def batch_sum_by(self, a: RelationBatch, groups: np.ndarray, n_groups: int) -> RelationBatch:
        a = self._b(a)
        groups = _check_groups(groups, a.n, n_groups)
        row, codes, mult = _coalesce(groups[a.row], a.codes, a.mult)
        return self._make(n_groups, a.variables, row, codes, mult)

    @staticmethod
    def _patterns(b: RelationBatch) -> list[tuple[np.ndarray, np.ndarray]]:
        """Group entries by schema: [(entry indices, presence mask over b.variables)]."""
        m, k = b.codes.shape
        if not k or not (b.codes == ABSENT).any():
            return [(np.arange(m), np.ones(k, dtype=bool))]
        present = b.codes != ABSENT
        ids, order, change = _dense_ids([present[:, j] for j in range(k)], m)
        groups = np.split(order, np.flatnonzero(change)[1:])
        return [(g, present[g[0]]) for g in groups]

    def batch_mul(self, a: RelationBatch, b: RelationBatch) -> RelationBatch:
        a, b = self._pair(a, b)
        if not a.nnz or not b.nnz:
            return self.batch_zeros(a.n)
        if not b.variables and (b.mult == 1).all():  # b holds ones / units: cheap paths
            if b.nnz == b.n:
                return a
        if not a.variables and (a.mult == 1).all() and a.nnz == a.n:
            return b
        variables = tuple(sorted(set(a.variables) | set(b.variables)))
        apos = {v: j for j, v in enumerate(a.variables)}
        bpos = {v: j for j, v in enumerate(b.variables)}
        rows, codes, mults = [], [], []
        # one sort-merge join per pair of schemas (a view's batch has exactly one schema)
        for ea, mask_a in self._patterns(a):
            va = {v for v, p in zip(a.variables, mask_a, strict=True) if p}
            for eb, mask_b in self._patterns(b):
                vb = {v for v, p in zip(b.variables, mask_b, strict=True) if p}
                shared = sorted(va & vb)
                ka = [a.row[ea]] + [a.codes[ea, apos[v]] for v in shared]
                kb = [b.row[eb]] + [b.codes[eb, bpos[v]] for v in shared]
                ia, ib = _equi_join(ka, kb, len(ea), len(eb))
                ia, ib = ea[ia], eb[ib]
                out = np.full((len(ia), len(variables)), ABSENT, dtype=np.int64)
                for j, v in enumerate(variables):
                    if v in va:
                        out[:, j] = a.codes[ia, apos[v]]
                    elif v in vb:
                        out[:, j] = b.codes[ib, bpos[v]]
                rows.append(a.row[ia])
                codes.append(out)
                mults.append(checked_mul(a.mult[ia], b.mult[ib]))
        row, code_arr, mult = _coalesce(
            np.concatenate(rows), np.concatenate(codes), np.concatenate(mults)
        )
        return self._make(a.n, variables, row, code_arr, mult)

    def batch_lift(self, variable: str, values: np.ndarray) -> RelationBatch:
        values = np.asarray(values)
        n = values.size
        if variable not in self._listed:
            return self.batch_ones(n)
        codes = as_int64_column(values, variable, repr(self) + " (batched values are codes)")
        if n and codes.min() == ABSENT:
            raise RingError(f"{self!r}: code -2**63 of {variable!r} is reserved")
        return RelationBatch(
            n, (variable,), np.arange(n, dtype=np.int64), codes.reshape(n, 1), np.ones(n, np.int64)
        )

    def batch_scatter_add(self, target: RelationBatch, slots: np.ndarray, values: RelationBatch):
        t, v = self._b(target), self._b(values)
        slots = _check_index(slots, t.n)
        if len(slots) != v.n:
            raise RingError(f"{len(slots)} slots for a batch of {v.n}")
        if not v.nnz:
            return t
        return self._sum_tables(t.n, [(t, t.row), (v, slots[v.row])])

    def batch_to_bytes(self, batch: RelationBatch) -> bytes:
        b = self._b(batch)
        return _save(
            n=_i64(b.n),
            variables=np.asarray(b.variables, dtype=str).reshape(-1),
            row=b.row,
            codes=b.codes,
            mult=b.mult,
        )

    def batch_from_bytes(self, data: bytes) -> RelationBatch:
        n, variables, row, codes, mult = _load(data, ["n", "variables", "row", "codes", "mult"])
        variables = tuple(str(v) for v in variables.tolist())
        codes = _i64(codes)
        if codes.ndim != 2 or codes.shape != (len(row), len(variables)):
            raise RingError("invalid batch bytes: code table of the wrong shape")
        return RelationBatch(int(n), variables, _i64(row), codes, _i64(mult))

    # ---------------------------------------------------------------- codes
    def _coded_batch(self, payload: Relation | RelationBatch) -> tuple[RelationBatch, bool]:
        if isinstance(payload, Mapping):
            return self.batch_from([payload]), True
        return self._b(payload), False

    def used_codes(self, payload: Relation | RelationBatch) -> dict[str, np.ndarray]:
        """The codes of every listed variable that the payload's tuples hold (sorted, unique)."""
        b, _ = self._coded_batch(payload)
        out = {v: np.zeros(0, np.int64) for v in sorted(self._listed)}
        for j, v in enumerate(b.variables):
            if v in self._listed:
                column = b.codes[:, j]
                out[v] = np.unique(column[column != ABSENT])
        return out

    def recode(
        self, payload: Relation | RelationBatch, maps: Mapping[str, np.ndarray]
    ) -> Relation | RelationBatch:
        """Codes of the listed variables in ``maps`` replaced by ``maps[v][code]``
        (vectorized, :data:`ABSENT` kept); a code the map does not cover raises
        :class:`RingError`.  A new, coalesced batch (or element)."""
        maps = check_code_maps(self, maps)
        if not maps:
            return payload
        b, scalar = self._coded_batch(payload)
        codes = b.codes.copy()
        for j, v in enumerate(b.variables):
            if v in maps:
                present = np.flatnonzero(codes[:, j] != ABSENT)
                codes[present, j] = recode_column(v, codes[present, j], maps[v])
        row, codes, mult = _coalesce(b.row, codes, b.mult)
        out = self._make(b.n, b.variables, row, codes, mult)
        return self.batch_to_list(out)[0] if scalar else out


# =================================================================== the factorized ring
class FactorizedRing(_RowTableFace, Ring):
    """Factorized payloads of Example 21: relations over at most one variable.

    ``order`` lists the listed (free) variables top-down along the variable order, i.e. by
    *lift index* (any linearization where ancestors precede descendants).  An element is a
    relation (scalar face as in :class:`RelationalRing`) whose keys are either ``()`` or a
    single pair ``((X, x),)`` with ``X`` in ``order``.  ``+`` is ⊎.  ``*`` is the bilinear
    extension of this product of keys::

        () · k = k · () = k
        (X=x) · (Y=y)  = (X=x)          if index(X) < index(Y)    (the lower index wins)
        (X=x) · (X=x)  = (X=x)
        (X=x) · (X=x') = (X=CONFLICT)   if x != x'  (CONFLICT · anything over X = CONFLICT)

    So the product of a payload over {X} with one over ∅ or over a lower variable (higher
    index) is X's relation scaled by the other's total multiplicity -- the projection of the
    listing payload onto the view's own variable, with multiplicities summed (article
    semantics; NOT the reference code's 0/1 existence factor).  This is the only kind of
    product formed along a view tree, where every variable is lifted exactly once.

    Ring axioms: the key product is the *ordinal sum* (along the lift order) of the flat
    semilattices ``Dom(X) ∪ {CONFLICT}``, with ``()`` adjoined as identity: a commutative
    monoid (the product of several keys is decided by the lowest-index variable among them and
    the agreement of their values there).  Its ℤ-algebra is a commutative ring, so **all ring
    axioms hold exactly**.  The :data:`CONFLICT` value is what makes this work: a join
    semantics (``x != x'`` gives 0) is *not* associative here, because a zero produced among
    discarded higher-index keys would have to annihilate the kept one -- e.g.
    ``(A=0)·((B=0)·(B=1))`` vs ``((A=0)·(B=0))·(B=1)``.  ``(X=CONFLICT)`` keys only arise from
    multiplying two payloads over the same variable, which no view tree does; they keep the
    total multiplicative: ``total(a * b) == total(a) * total(b)`` for all a, b.

    Relation to F[ℤ]: :meth:`project` maps a listing payload to its factorized payload.  It is
    additive, and multiplicative on operands over *disjoint* variables -- exactly the products
    formed along a view tree, where every variable is lifted once -- so the factorized views
    equal the projections of the listing views (W13).  On operands sharing variables it is not
    (a join can drop tuples that the projection cannot see).

    Lift: ``X`` in ``order`` lifts to ``{(X=x) ↦ 1}``; other variables lift to ``{() ↦ 1}``.
    """

    name = "factorized"
    batch_type = FactorizedBatch

    def __init__(self, order: Sequence[str]) -> None:
        if isinstance(order, str):
            order = [order]
        self.order: tuple[str, ...] = tuple(str(x) for x in order)
        if len(set(self.order)) != len(self.order):
            raise RingError(f"duplicate variables in the order {self.order!r}")
        self._index = {v: i for i, v in enumerate(self.order)}
        self._none = len(self.order)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.order == self.order  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(("factorized", self.order))

    def __repr__(self) -> str:
        return f"FactorizedRing(order={list(self.order)!r})"

    # ---------------------------------------------------------------- scalar face
    def _canon(self, a: Any) -> Relation:
        rel = _canon(a)
        for key in rel:
            if len(key) > 1 or (key and key[0][0] not in self._index):
                raise RingError(
                    f"{self!r}: a factorized key is () or one pair over {list(self.order)}, "
                    f"got {key!r}"
                )
        return rel

    def _key_mul(self, k1: Key, k2: Key) -> Key | None:
        if not k1:
            return k2
        if not k2:
            return k1
        (x, xv), (y, yv) = k1[0], k2[0]
        if x == y:
            return k1 if xv == yv else ((x, CONFLICT),)
        return k1 if self._index[x] < self._index[y] else k2

    def zero(self) -> Relation:
        return {}

    def one(self) -> Relation:
        return {(): 1}

    def add(self, a: Relation, b: Relation) -> Relation:
        return _union(self._canon(a), self._canon(b))

    def mul(self, a: Relation, b: Relation) -> Relation:
        a, b = self._canon(a), self._canon(b)
        out: Relation = {}
        for k1, m1 in a.items():
            for k2, m2 in b.items():
                k = self._key_mul(k1, k2)
                if k is not None:
                    out[k] = out.get(k, 0) + m1 * m2
        return {k: m for k, m in out.items() if m}

    def neg(self, a: Relation) -> Relation:
        return {k: -m for k, m in self._canon(a).items()}

    def scale(self, a: Relation, k: int) -> Relation:
        k = int(k)
        return {key: k * m for key, m in self._canon(a).items()} if k else {}

    def is_zero(self, a: Relation) -> bool:
        return not self._canon(a)

    def equal(self, a: Relation, b: Relation, rtol: float = 0.0, atol: float = 0.0) -> bool:
        return _rel_equal(self._canon(a), self._canon(b), rtol, atol)

    @property
    def lifted_variables(self) -> frozenset[str]:
        return frozenset(self.order)

    @property
    def keyed_variables(self) -> frozenset[str]:
        """Listed values are keys: the engine lifts their codes."""
        return frozenset(self.order)

    def lift(self, variable: str, value: Any) -> Relation:
        if variable not in self._index:
            return self.one()
        try:
            hash(value)
        except TypeError:
            raise RingError(f"cannot lift {variable!r} value {value!r}: unhashable") from None
        return {((variable, value),): 1}

    def to_bytes(self, a: Relation) -> bytes:
        return _rel_to_bytes(self._canon(a))

    def from_bytes(self, data: bytes) -> Relation:
        return self._canon(_rel_from_bytes(data))

    @staticmethod
    def total(a: Relation) -> int:
        """The sum of all multiplicities (the number of derivations the payload stands for)."""
        return sum(a.values())

    def project(self, listing: Relation) -> Relation:
        """The factorized payload of a listing (F[ℤ]) payload: project every tuple onto its
        lowest-index variable of ``order`` (``()`` if it has none), summing multiplicities."""
        out: Relation = {}
        for key, m in _canon(listing).items():
            best: tuple[str, Any] | None = None
            for var, val in key:
                if var in self._index and (best is None or self._index[var] < self._index[best[0]]):
                    best = (var, val)
            k: Key = (best,) if best is not None else ()
            out[k] = out.get(k, 0) + m
        return {k: m for k, m in out.items() if m}

    # ---------------------------------------------------------------- batched face
    @staticmethod
    def _make(n: int, row, var, code, mult, coalesce: bool = True) -> FactorizedBatch:
        row, var, code, mult = _i64(row), _i64(var), _i64(code), _i64(mult)
        if coalesce and len(row):
            keys = np.stack([var, code], axis=1)
            row, keys, mult = _coalesce(row, keys, mult)
            var, code = keys[:, 0].copy(), keys[:, 1].copy()
        return FactorizedBatch(n, row, var, code, mult)

    def batch_zeros(self, n: int) -> FactorizedBatch:
        e = _i64([])
        return FactorizedBatch(n, e, e, e, e)

    def batch_ones(self, n: int) -> FactorizedBatch:
        return FactorizedBatch(
            n,
            np.arange(n, dtype=np.int64),
            np.full(n, self._none, np.int64),
            np.zeros(n, np.int64),
            np.ones(n, np.int64),
        )

    def batch_from(self, elements: Sequence[Relation]) -> FactorizedBatch:
        rows, var, code, mult = [], [], [], []
        rels = [self._canon(e) for e in elements]
        for i, r in enumerate(rels):  # packing the scalar face: one Python step per tuple
            for key, m in r.items():
                if key:
                    ((x, val),) = key
                    if val is CONFLICT:
                        val = CONFLICT_CODE
                    elif isinstance(val, bool) or not isinstance(val, numbers.Integral):
                        raise RingError(
                            f"{self!r}: batched values must be integer codes; "
                            f"variable {x!r} has value {val!r}"
                        )
                    elif not CONFLICT_CODE < int(val) < 2**63:
                        raise RingError(f"{self!r}: code {val!r} of {x!r} outside int64")
                    var.append(self._index[x])
                    code.append(int(val))
                else:
                    var.append(self._none)
                    code.append(0)
                rows.append(i)
                mult.append(m)
        mult_arr = as_int64_column(np.asarray(mult, dtype=object), "<multiplicity>", repr(self))
        return self._make(len(rels), rows, var, code, mult_arr)

    def batch_to_list(self, batch: FactorizedBatch) -> list[Relation]:
        b = self._b(batch)
        out: list[Relation] = [{} for _ in range(b.n)]
        it = zip(b.row.tolist(), b.var.tolist(), b.code.tolist(), b.mult.tolist(), strict=True)
        for r, v, c, m in it:
            if v == self._none:
                key: Key = ()
            else:
                key = ((self.order[v], CONFLICT if c == CONFLICT_CODE else c),)
            out[r][key] = m
        return out

    def batch_concat(self, batches: Sequence[FactorizedBatch]) -> FactorizedBatch:
        bs = [self._b(b) for b in batches]
        if not bs:
            return self.batch_zeros(0)
        offsets = np.cumsum([0] + [b.n for b in bs])
        return FactorizedBatch(
            int(offsets[-1]),
            np.concatenate([b.row + off for b, off in zip(bs, offsets, strict=False)]),
            np.concatenate([b.var for b in bs]),
            np.concatenate([b.code for b in bs]),
            np.concatenate([b.mult for b in bs]),
        )

    def batch_add(self, a: FactorizedBatch, b: FactorizedBatch) -> FactorizedBatch:
        a, b = self._pair(a, b)
        if not b.nnz:
            return a
        if not a.nnz:
            return b
        cat = self.batch_concat([a, b])
        return self._make(a.n, np.concatenate([a.row, b.row]), cat.var, cat.code, cat.mult)

    def batch_sum_by(self, a: FactorizedBatch, groups: np.ndarray, n_groups: int):
        a = self._b(a)
        groups = _check_groups(groups, a.n, n_groups)
        return self._make(n_groups, groups[a.row], a.var, a.code, a.mult)

    def _level_totals(self, b: FactorizedBatch) -> tuple[np.ndarray, np.ndarray]:
        """``T[r, i]``: total multiplicity of row ``r``'s keys at index ``i`` (``()`` is index
        ``len(order)``) and ``S[r, i] = sum_{j > i} T[r, j]``; both (n, len(order) + 1)."""
        width = self._none + 1
        flat = checked_sum_by(b.mult, b.row * width + b.var, b.n * width).reshape(b.n, width)
        bound = np.abs(flat.astype(np.float64)).sum(axis=1)
        if bound.size and bound.max() >= 2.0**62:  # conservative: suffix sums stay in int64
            raise RingError(f"{self!r}: int64 overflow risk in total multiplicities")
        inclusive = np.cumsum(flat[:, ::-1], axis=1)[:, ::-1]
        return flat, inclusive - flat

    def batch_mul(self, a: FactorizedBatch, b: FactorizedBatch) -> FactorizedBatch:
        a, b = self._pair(a, b)
        if not a.nnz or not b.nnz:
            return self.batch_zeros(a.n)
        k = self._none
        ta, sa = self._level_totals(a)
        tb, sb = self._level_totals(b)
        # (1) a's keys over X times b's keys over ∅ or higher-index variables: scaled by totals
        ka = a.var < k
        m1 = checked_mul(a.mult[ka], sb[a.row[ka], a.var[ka]])
        # (2) symmetric
        kb = b.var < k
        m2 = checked_mul(b.mult[kb], sa[b.row[kb], b.var[kb]])
        # (3) equal keys (same variable and value, or both ()): pointwise product
        #     (CONFLICT·CONFLICT pairs are left to (4))
        ia, ib = _equi_join([a.row, a.var, a.code], [b.row, b.var, b.code], a.nnz, b.nnz)
        keep = (a.var[ia] == k) | (a.code[ia] != CONFLICT_CODE)
        ia, ib = ia[keep], ib[keep]
        m3 = checked_mul(a.mult[ia], b.mult[ib])
        # (4) same variable X: every pair of X-keys goes to (X=CONFLICT) except the agreeing
        #     ones of (3): T_a[r, X] * T_b[r, X] - sum of the agreeing products
        both = checked_mul(ta[:, :k], tb[:, :k])
        r4, v4 = np.nonzero(both)
        agree = a.var[ia] < k
        rows = [a.row[ka], b.row[kb], a.row[ia], r4, a.row[ia][agree]]
        vars_ = [a.var[ka], b.var[kb], a.var[ia], v4, a.var[ia][agree]]
        codes = [a.code[ka], b.code[kb], a.code[ia]]
        codes += [np.full(len(r4) + int(agree.sum()), CONFLICT_CODE, np.int64)]
        mults = [m1, m2, m3, both[r4, v4], checked_neg(m3[agree])]
        return self._make(
            a.n,
            np.concatenate(rows),
            np.concatenate(vars_),
            np.concatenate(codes),
            np.concatenate(mults),
        )

    def batch_lift(self, variable: str, values: np.ndarray) -> FactorizedBatch:
        values = np.asarray(values)
        n = values.size
        if variable not in self._index:
            return self.batch_ones(n)
        codes = as_int64_column(values, variable, repr(self) + " (batched values are codes)")
        if n and codes.min() == CONFLICT_CODE:
            raise RingError(f"{self!r}: code -2**63 of {variable!r} is reserved")
        return FactorizedBatch(
            n,
            np.arange(n, dtype=np.int64),
            np.full(n, self._index[variable], np.int64),
            codes,
            np.ones(n, np.int64),
        )

    def batch_total(self, a: FactorizedBatch) -> np.ndarray:
        """Per-payload total multiplicity (int64 array of length n)."""
        a = self._b(a)
        return checked_sum_by(a.mult, a.row, a.n)

    def batch_scatter_add(
        self, target: FactorizedBatch, slots: np.ndarray, values: FactorizedBatch
    ) -> FactorizedBatch:
        t, v = self._b(target), self._b(values)
        slots = _check_index(slots, t.n)
        if len(slots) != v.n:
            raise RingError(f"{len(slots)} slots for a batch of {v.n}")
        if not v.nnz:
            return t
        return self._make(
            t.n,
            np.concatenate([t.row, slots[v.row]]),
            np.concatenate([t.var, v.var]),
            np.concatenate([t.code, v.code]),
            np.concatenate([t.mult, v.mult]),
        )

    def batch_to_bytes(self, batch: FactorizedBatch) -> bytes:
        b = self._b(batch)
        return _save(n=_i64(b.n), row=b.row, var=b.var, code=b.code, mult=b.mult)

    def batch_from_bytes(self, data: bytes) -> FactorizedBatch:
        n, row, var, code, mult = _load(data, ["n", "row", "var", "code", "mult"])
        return FactorizedBatch(int(n), _i64(row), _i64(var), _i64(code), _i64(mult))

    # ---------------------------------------------------------------- codes
    def _coded_batch(self, payload: Relation | FactorizedBatch) -> tuple[FactorizedBatch, bool]:
        if isinstance(payload, Mapping):
            return self.batch_from([payload]), True
        return self._b(payload), False

    def used_codes(self, payload: Relation | FactorizedBatch) -> dict[str, np.ndarray]:
        """The codes of every variable of ``order`` that the payload's keys hold (sorted,
        unique, without :data:`CONFLICT_CODE`)."""
        b, _ = self._coded_batch(payload)
        real = b.code != CONFLICT_CODE
        return {v: np.unique(b.code[real & (b.var == i)]) for i, v in enumerate(self.order)}

    def recode(
        self, payload: Relation | FactorizedBatch, maps: Mapping[str, np.ndarray]
    ) -> Relation | FactorizedBatch:
        """Codes of the variables in ``maps`` replaced by ``maps[v][code]`` (vectorized,
        :data:`CONFLICT` kept); a code the map does not cover raises :class:`RingError`.
        A new, coalesced batch (or element)."""
        maps = check_code_maps(self, maps)
        if not maps:
            return payload
        b, scalar = self._coded_batch(payload)
        code = b.code.copy()
        for v, mapping in maps.items():
            at = np.flatnonzero((b.var == self._index[v]) & (code != CONFLICT_CODE))
            code[at] = recode_column(v, code[at], mapping)
        out = self._make(b.n, b.row, b.var, code, b.mult)
        return self.batch_to_list(out)[0] if scalar else out
