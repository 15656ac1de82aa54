"""The stored base tables of a SQL database: a multiset of typed rows per table.

Each distinct row is stored once with its multiplicity: its values in one numpy array per
column, at the row's slot of a :class:`~ringml.keyindex.KeyIndex`.  The index is keyed by

* the table's ``PRIMARY KEY`` when its DDL declares one.  A key value holds at most one
  row: a batch that would leave two rows with one key (an insert of a present key, the
  same key inserted twice) is refused.  A delete finds the stored row by its key and must
  equal it in every column, compared value by value (numbers by value, text as strings),
  so a delete of a row that differs from the stored one in any column is refused.  Key
  columns enter the index as int64 images: integers, dates and booleans exactly, floats by
  value, text as the 64-bit hash of its strings (the hash the engine keys text by); the
  column-by-column comparison makes a delete exact even so, and two distinct text keys
  sharing a hash (probability about n²/2⁶⁵) would be refused as one key, never merged.
* otherwise the row's 64-bit fingerprint over all its columns (:meth:`TableStore.
  fingerprints`): equal rows have equal fingerprints; two distinct rows sharing one
  (probability about n²/2⁶⁵) would be taken for each other.

A nullable column (declared ``NULL``) is stored as its values (the kind's fill in NULL
rows) and a bool mask of its NULL rows; a row's identity includes which of its columns are
NULL (NULL equals NULL here, as ``DISTINCT`` and ``GROUP BY`` take it): the fingerprint
hashes the masks too, and a keyed comparison compares them, so a delete must name a
stored row's NULLs exactly.  A table without nullable columns does no work for them.

A batch is checked first (:meth:`TableStore.prepare`) and applied later
(:meth:`TableStore.commit`), or dropped (:meth:`TableStore.abandon`), so a database can
check every table of an atomic batch before anything changes.  Preparing finds or reserves
the index entry of every key of the batch in one pass (a reserved entry holds a row of
multiplicity 0, which no read sees: the table's rows are unchanged until the commit, which
then needs no second lookup); a commit or an abandon releases the entries left empty.  All
work is on whole arrays: a keyed batch whose keys are distinct costs a sort of its key
hashes, one index pass, a comparison of the rows whose key is present with the stored
ones, and one write per column of its new rows.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pandas as pd

from ..batch import TupleCounts, UpdateBatch
from ..encoding import factorize
from ..errors import BatchError, InputTypeError
from ..keyindex import KeyIndex, hash_rows
from .catalog import TableSchema, conform_nullable, nulls_column, typed_frame

#: typed columns: a plain array per column, ``(values, null)`` for a nullable one
Columns = dict[str, np.ndarray | tuple[np.ndarray, np.ndarray]]


@dataclass
class TableChange:
    """A checked batch of one table (``columns``: its typed rows, ``signs``: their
    multiplicities) and what committing it does: per changed stored row, its slot, the
    batch row holding its values, the change of its multiplicity and whether the slot
    takes the row's values (a new row, or a keyed row replaced by another row of its key);
    ``placed``: the index entries reserved for keys not stored (empty ones are released)."""

    table: str
    columns: Columns
    signs: np.ndarray
    slots: np.ndarray
    rows: np.ndarray
    net: np.ndarray
    write: np.ndarray
    placed: np.ndarray

    def __len__(self) -> int:
        return len(self.signs)

    @property
    def frame(self) -> pd.DataFrame:
        """The typed rows as a DataFrame (NULLs as :func:`~.catalog.nulls_column` shows
        them)."""
        columns = {
            c: nulls_column(*v, _kind_of(v[0])) if isinstance(v, tuple) else v
            for c, v in self.columns.items()
        }
        return pd.DataFrame(columns, index=pd.RangeIndex(len(self)))


class TableStore:
    """The current rows of one table, with multiplicities (keyed by the table's primary
    key if it declares one, else by row fingerprints)."""

    # stores pickled before nullable columns existed have none
    nulls: Mapping[str, np.ndarray] = MappingProxyType({})

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        key = schema.key
        self.index = KeyIndex(len(key)) if key else KeyIndex(1, hashed=True)
        self.counts = np.zeros(16, dtype=np.int64)
        self.values = {
            c: _empty(kind, 16) for c, kind in zip(schema.columns, schema.types, strict=True)
        }
        # per nullable column, its NULL rows (a row's values hold the kind's fill there)
        self.nulls = {c: np.zeros(16, dtype=bool) for c in schema.nullable}
        self.size = 0  # rows, counted with multiplicity

    # ------------------------------------------------------------------ checking
    def prepare(self, columns: Columns | pd.DataFrame, signs: np.ndarray) -> TableChange:
        """Check a typed batch (``columns``: per column of the table its typed values, as
        :meth:`TableSchema.conform_columns` gives them; ``signs``: +1 insert, -1 delete, or
        any multiplicity); :class:`BatchError` naming a deleted row that is not present or,
        with a primary key, a row whose key would be held twice.  Changes no row: the
        change is applied by :meth:`commit` or dropped by :meth:`abandon`."""
        if isinstance(columns, pd.DataFrame):
            columns = {c: self._typed(c, columns[c]) for c in self.schema.columns}
        signs = np.asarray(signs, dtype=np.int64)
        if self.schema.key:
            return self._prepare_keyed(columns, signs)
        return self._prepare_fingerprinted(columns, signs)

    def _typed(self, column: str, values: pd.Series):
        """A column of a typed frame as :meth:`prepare` takes it."""
        if column in self.schema.nullable:
            kind = self.schema.type_of(column)
            sql = self.schema.sql_type(column)
            return conform_nullable(self.schema.name, column, kind, values, sql)
        return values.to_numpy()

    def _prepare_fingerprinted(self, columns: Columns, signs: np.ndarray) -> TableChange:
        fingerprints = self.fingerprints(columns)
        unique, first, inverse = np.unique(fingerprints, return_index=True, return_inverse=True)
        net = _sum_by(inverse.ravel(), signs, unique.size)
        slots, placed = self._slots_of(unique[:, None])
        current = self.counts[slots]
        bad = np.flatnonzero(current + net < 0)
        if bad.size:
            self.index.remove(placed)
            copies = inverse.ravel() == bad[0]
            row = int(np.flatnonzero(copies & (signs < 0))[0])
            deleted = int(-signs[copies & (signs < 0)].sum())
            present = int(current[bad[0]]) + int(signs[copies & (signs > 0)].sum())
            self._absent(columns, row, "", (deleted, present))
        moved = np.flatnonzero(net != 0)
        return TableChange(
            self.schema.name,
            columns,
            signs,
            slots[moved],
            first[moved],
            net[moved],
            current[moved] == 0,
            placed,
        )

    def _prepare_keyed(self, columns: Columns, signs: np.ndarray) -> TableChange:
        """Per key of the batch: its stored row (if any), the batch's distinct rows of that
        key (*units*) and their net changes; every unit's final count (its net change, plus
        the stored count when it equals the stored row) must be >= 0, and the key's rows
        after the batch at most one."""
        images = self.key_images(columns)
        grouped = _key_groups(images)
        if grouped is None:  # every key once (the usual batch): a unit per row
            return self._prepare_distinct_keys(columns, signs, images)
        # a key twice (e.g. an update): group rows by key, then by all their values
        first, inverse = grouped
        unit_row, unit_inverse = _row_groups(columns, self.schema)
        unit_group = inverse[unit_row]
        unit_net = _sum_by(unit_inverse, signs, unit_row.size)
        m = first.size
        slots, placed = self._slots_of(images[first])
        stored = self.counts[slots]
        present = stored > 0
        equal = np.zeros(unit_row.size, dtype=bool)
        probe = np.flatnonzero(present[unit_group])
        if probe.size:
            equal[probe] = self._equal(slots[unit_group[probe]], columns, unit_row[probe])
        final = unit_net + np.where(equal, stored[unit_group], 0)
        bad = np.flatnonzero(final < 0)
        if bad.size:
            self.index.remove(placed)
            unit = int(bad[0])
            key = unit_group[unit]
            slot = int(slots[key]) if present[key] else -1
            self._absent(columns, int(unit_row[unit]), self._differs(slot, columns, unit_row[unit]))
        covered = np.zeros(m, dtype=bool)
        covered[unit_group[equal]] = True
        total = _sum_by(unit_group, final, m) + np.where(covered, 0, stored)
        twice = np.flatnonzero(total > 1)
        if twice.size:
            self.index.remove(placed)
            self._duplicate(columns, images, first, int(twice[0]), bool(present[twice[0]]))
        alive = np.flatnonzero(final > 0)
        survivor = np.full(m, -1, dtype=np.int64)
        survivor[unit_group[alive]] = alive
        has = survivor >= 0
        rewrite = present & has & ~equal[np.maximum(survivor, 0)]
        change = total - stored
        moved = np.flatnonzero((change != 0) | rewrite)
        rows = np.where(has[moved], unit_row[np.maximum(survivor[moved], 0)], 0)
        return TableChange(
            self.schema.name,
            columns,
            signs,
            slots[moved],
            rows,
            change[moved],
            rewrite[moved] | ~present[moved],
            placed,
        )

    def _prepare_distinct_keys(
        self, columns: Columns, signs: np.ndarray, images: np.ndarray
    ) -> TableChange:
        """:meth:`_prepare_keyed` of a batch whose keys are distinct: one unit per row."""
        slots, placed = self._slots_of(images)
        stored = self.counts[slots]
        present = stored > 0
        equal = np.zeros(slots.size, dtype=bool)
        probe = np.flatnonzero(present)
        if probe.size:
            equal[probe] = self._equal(slots[probe], columns, probe)
        final = signs + np.where(equal, stored, 0)  # the batch row's count after the batch
        bad = np.flatnonzero(final < 0)
        if bad.size:
            self.index.remove(placed)
            row = int(bad[0])
            slot = int(slots[row]) if present[row] else -1
            self._absent(columns, row, self._differs(slot, columns, row))
        # the key's rows after the batch: the batch row's, and the stored one if it differs
        total = final + np.where(equal, 0, stored)
        twice = np.flatnonzero(total > 1)
        if twice.size:
            self.index.remove(placed)
            row = int(twice[0])
            self._duplicate(columns, images, np.arange(slots.size), row, bool(present[row]))
        # with at most one row per key, a stored row that differs from the batch's is
        # never replaced here (that is two rows of the key): new keys' rows are written
        moved = np.flatnonzero(total != stored)
        return TableChange(
            self.schema.name,
            columns,
            signs,
            slots[moved],
            moved,
            (total - stored)[moved],
            ~present[moved],
            placed,
        )

    def _slots_of(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slot of every (distinct) index key, reserving one of multiplicity 0 for each
        absent key; also the reserved slots."""
        slots, new = self.index.get_or_insert(keys)
        top = int(slots.max()) + 1 if slots.size else 0
        if top > self.counts.size:
            self._grow(max(top, 2 * self.counts.size))
        return slots, slots[new]

    def key_images(self, columns: Columns) -> np.ndarray:
        """The primary key of every row as an ``(n, width)`` int64 array (the index's
        keys): integers, dates and booleans as they are, floats by value (``-0.0`` as
        ``0.0``), text as the 64-bit hash of its strings."""
        parts = []
        for column in self.schema.key:
            values = columns[column]
            kind = self.schema.type_of(column)
            if kind == "str":
                parts.append(pd.util.hash_array(values, categorize=False).view(np.int64))
            elif kind == "float":
                parts.append((values + 0.0).view(np.int64))
            elif kind == "date":
                parts.append(values.view(np.int64))
            else:
                parts.append(values.astype(np.int64, copy=False))
        return np.stack(parts, axis=1) if len(parts) > 1 else parts[0][:, None]

    def fingerprints(self, columns: Columns | pd.DataFrame) -> np.ndarray:
        """A 64-bit key of every typed row (equal rows, equal keys).  A text column holds
        only ``str`` values (``conform``: no NULLs -- a nullable one holds ``""`` in its NULL
        rows --, nothing else), so it enters as the 64-bit hash of its strings
        (``pd.util.hash_array``, the hash the engine keys text by), without the engine's
        per-value scan for numbers held in object columns; each nullable column's NULL mask
        is one more key.  The keys are this store's own: only :meth:`prepare` and
        :meth:`commit` compare them."""
        if isinstance(columns, pd.DataFrame):
            columns = {c: self._typed(c, columns[c]) for c in self.schema.columns}
        arrays = [_values(columns[c]) for c in self.schema.columns]
        if not len(arrays[0]):
            return np.zeros(0, np.int64)
        keys = [
            pd.util.hash_array(values, categorize=False).view(np.int64) if kind == "str" else values
            for values, kind in zip(arrays, self.schema.types, strict=True)
        ]
        for c in self.schema.nullable:  # which columns are NULL: part of the row's identity
            keys.append(_null_of(columns[c]).astype(np.int64))
        return TupleCounts.fingerprints(keys)

    def _equal(self, slots: np.ndarray, columns: Columns, rows: np.ndarray) -> np.ndarray:
        """Whether each stored row at ``slots`` equals the batch row at ``rows`` (rows of
        the stored rows' keys: the key columns the index compares exactly are skipped)."""
        same = np.ones(slots.size, dtype=bool)
        rows = _span(rows)
        for column in _unkeyed_columns(self.schema):
            batch = columns[column]
            if column in self.nulls:  # NULL equals NULL (the fills are equal too)
                same &= self.nulls[column][slots] == _null_of(batch)[rows]
                batch = _values(batch)
            same &= np.asarray(self.values[column][slots] == batch[rows], dtype=bool)
        return same

    def _differs(self, slot: int, columns: Columns, row: int) -> str:
        """Why a batch row is not the stored row of its key (error messages only)."""
        if slot < 0:  # absent (or only reserved by a batch)
            return " (no row has its primary key)"
        mine = _row(columns, row)
        for column, stored in self._row_at(slot).items():
            if not (stored is None and mine[column] is None or stored == mine[column]):
                return f" (the row with its primary key has {column} = {stored!r})"
        return ""

    def _row_at(self, slot: int) -> dict:
        """The stored row at ``slot`` (NULL as None), for messages."""
        columns = {c: (v, self.nulls[c]) if c in self.nulls else v for c, v in self.values.items()}
        return _row(columns, slot)

    def _absent(
        self, columns: Columns, row: int, why: str, times: tuple[int, int] = (1, 0)
    ) -> None:
        """``why``: why the row is not present; ``times``: how many copies the batch
        deletes and how many are present (fewer)."""
        values = _row(columns, row)
        deleted, present = times
        what = f"that is not present{why}"
        if present:
            copies = "1 copy is" if present == 1 else f"{present} copies are"
            what = f"{deleted} times (only {copies} present)"
        raise BatchError(
            f"table {self.schema.name!r}: deleting row {values} {what}",
            self.schema.name,
            None,
            values,
        )

    def _duplicate(
        self, columns: Columns, images: np.ndarray, first: np.ndarray, group: int, stored: bool
    ) -> None:
        rows = np.flatnonzero((images == images[first[group]]).all(axis=1))
        values = _row(columns, int(rows[-1]))
        key = ", ".join(self.schema.key)
        where = "a present row" if stored else "another row of the batch"
        raise BatchError(
            f"table {self.schema.name!r}: row {values} has the primary key ({key}) of "
            f"{where}; a key holds one row (delete the old row in the same batch to replace it)",
            self.schema.name,
            self.schema.key[0],
            values,
        )

    # ------------------------------------------------------------------ changing
    def commit(self, change: TableChange) -> None:
        """Apply a prepared change (nothing else may have changed the table since)."""
        slots, write = change.slots, change.write
        if write.any():
            at, rows = slots[write], _span(change.rows[write])
            for column, target in self.values.items():
                batch = change.columns[column]
                if isinstance(batch, tuple):
                    self.nulls[column][at] = batch[1][rows]
                    batch = batch[0]
                target[at] = batch[rows]
        self.counts[slots] += change.net
        self.size += int(change.net.sum())
        # rows deleted, and entries reserved for keys whose rows came and went in the batch
        gone = slots[self.counts[slots] == 0]
        placed = change.placed[self.counts[change.placed] == 0]
        if placed.size:
            gone = np.concatenate([gone, placed])
        if gone.size:
            self.index.remove(gone)
            for target in self.values.values():
                if target.dtype == object:
                    target[gone] = None  # release the strings

    def abandon(self, change: TableChange) -> None:
        """Drop a prepared change that will not be committed (releases its reserved index
        entries; the rows were never changed)."""
        self.index.remove(change.placed)

    def _grow(self, capacity: int) -> None:
        """Room for slots below ``capacity`` (doubling: the copies are amortized O(1) per
        row; the index's own capacity grows faster, but its unused slots need no room)."""
        counts = np.zeros(capacity, dtype=np.int64)
        counts[: self.counts.size] = self.counts
        self.counts = counts
        for column, old in self.nulls.items():
            grown = np.zeros(capacity, dtype=bool)
            grown[: old.size] = old
            self.nulls[column] = grown
        for column, kind in zip(self.schema.columns, self.schema.types, strict=True):
            old = self.values[column]
            if old.dtype == object and old.flags.owndata and old.flags.c_contiguous:
                # text: the buffer of pointers is reallocated in place, and no string's
                # reference count is touched (a copy would visit every string twice, ~10x
                # slower); no view of a store's column ever leaves the store
                size = old.size
                old.resize(capacity, refcheck=False)
                old[size:] = None
                continue
            grown = _empty(kind, capacity)
            grown[: old.size] = old
            self.values[column] = grown

    # ------------------------------------------------------------------ reading
    def distinct(self) -> tuple[Columns, np.ndarray]:
        """The distinct rows (typed columns, a nullable one as ``(values, null)``) and
        their multiplicities."""
        slots = self.index.live_slots()
        slots = slots[self.counts[slots] > 0]  # not the entries a batch reserved
        columns = {c: v[slots] for c, v in self.values.items()}
        for c, null in self.nulls.items():
            columns[c] = (columns[c], null[slots])
        return columns, self.counts[slots].copy()

    def frame(self) -> pd.DataFrame:
        """The table's rows, each repeated by its multiplicity (NULLs as DuckDB's
        ``.df()`` shows them: NaN, NaT, None, or ``pd.NA`` in an ``Int64``/``boolean``
        column)."""
        columns, counts = self.distinct()
        if not (counts == 1).all():
            repeat = np.repeat(np.arange(counts.size), counts)
            columns = {
                c: tuple(p[repeat] for p in v) if isinstance(v, tuple) else v[repeat]
                for c, v in columns.items()
            }
        if self.nulls:
            return typed_frame(self.schema, columns)
        return pd.DataFrame(columns, index=pd.RangeIndex(int(counts.sum())))

    def __len__(self) -> int:
        return self.size


def check_batches(
    stores: Mapping[str, TableStore], batches: Sequence[UpdateBatch]
) -> dict[str, TableChange]:
    """Type-check batches of any tables (names matched like SQL identifiers) and the
    deletes of every table, several batches of one table taken together; no row changes
    (commit the changes, or :func:`abandon_changes`)."""
    parts: dict[str, list[Columns]] = {}
    signs: dict[str, list[np.ndarray]] = {}
    for batch in batches:
        if not isinstance(batch, UpdateBatch):
            raise InputTypeError(f"expected UpdateBatch objects, got {type(batch).__name__}")
        store = stores.get(batch.relation) or next(
            (s for name, s in stores.items() if name.lower() == batch.relation.lower()), None
        )
        if store is None:
            raise BatchError(
                f"unknown table {batch.relation!r}; the tables are {sorted(stores)}",
                batch.relation,
            )
        schema = store.schema
        columns = schema.conform_columns(batch.rows)
        n = len(_values(columns[schema.columns[0]]))
        sign = batch.signs()
        if sign.shape != (n,):
            raise BatchError(
                f"table {schema.name!r}: {sign.shape[0]} multiplicities for {n} rows",
                schema.name,
                "multiplicity",
            )
        parts.setdefault(schema.name, []).append(columns)
        signs.setdefault(schema.name, []).append(sign)
    changes: dict[str, TableChange] = {}
    try:
        for table, pieces in parts.items():
            columns = pieces[0] if len(pieces) == 1 else _concatenate(pieces)
            if len(_values(columns[stores[table].schema.columns[0]])):
                changes[table] = stores[table].prepare(columns, np.concatenate(signs[table]))
    except BaseException:
        abandon_changes(stores, changes)
        raise
    return changes


def abandon_changes(stores: Mapping[str, TableStore], changes: Mapping[str, TableChange]) -> None:
    """Drop prepared changes that will not be committed (see :meth:`TableStore.abandon`)."""
    for table, change in changes.items():
        stores[table].abandon(change)


def _concatenate(pieces: list[Columns]) -> Columns:
    """Typed columns of several batches of one table, stacked."""
    out = {}
    for c, first in pieces[0].items():
        if isinstance(first, tuple):
            out[c] = tuple(np.concatenate([p[c][i] for p in pieces]) for i in range(2))
        else:
            out[c] = np.concatenate([p[c] for p in pieces])
    return out


def _span(positions: np.ndarray) -> np.ndarray | slice:
    """``positions`` as a slice when they are consecutive and ascending (e.g. a batch's
    inserts before its deletes): a view of each column instead of a gather."""
    n = positions.size
    if n and positions[-1] - positions[0] == n - 1 and (np.diff(positions) == 1).all():
        return slice(int(positions[0]), int(positions[-1]) + 1)
    return positions


@functools.lru_cache(maxsize=256)
def _unkeyed_columns(schema: TableSchema) -> tuple[str, ...]:
    """The columns a row's key does not settle: all but the key columns the index holds
    exactly (text keys are held as hashes, so text key columns are compared too)."""
    exact = {c for c in schema.key if schema.type_of(c) != "str"}
    return tuple(c for c in schema.columns if c not in exact)


def _key_groups(images: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """None when every row's key is distinct (the usual batch: one sort of 64-bit
    values); else each distinct key's first row and every row's key number (exact)."""
    n, width = images.shape
    flat = images[:, 0] if width == 1 else hash_rows(images).view(np.int64)
    ordered = np.sort(flat)
    if n < 2 or (ordered[1:] != ordered[:-1]).all():
        return None
    if width == 1:
        _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(images, axis=0, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def _row_groups(columns: Columns, schema: TableSchema) -> tuple[np.ndarray, np.ndarray]:
    """Exact groups of equal rows: each group's first row and every row's group number
    (per column the codes of :func:`factorize`, which compares values as Python does, then
    the distinct rows of codes)."""
    codes = []
    for column, kind in zip(schema.columns, schema.types, strict=True):
        values = columns[column]
        if isinstance(values, tuple):  # which rows are NULL, then the (filled) values
            codes.append(values[1].astype(np.int64))
            values = values[0]
        codes.append(factorize(values + 0.0 if kind == "float" else values)[0])
    _, first, inverse = np.unique(
        np.stack(codes, axis=1), axis=0, return_index=True, return_inverse=True
    )
    return first, inverse.ravel()


def _sum_by(groups: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Exact int64 sums of ``values`` per group number."""
    out = np.zeros(size, dtype=np.int64)
    np.add.at(out, groups, values)
    return out


def _python(value):
    return value.item() if isinstance(value, np.generic) else value


def _values(column) -> np.ndarray:
    """A typed column's values (a nullable column's, its NULL rows holding the fill)."""
    return column[0] if isinstance(column, tuple) else column


def _null_of(column) -> np.ndarray:
    """A typed column's NULL rows (none for a plain array)."""
    return column[1] if isinstance(column, tuple) else np.zeros(len(column), dtype=bool)


def _kind_of(values: np.ndarray) -> str:
    """The kind of a typed column's values."""
    return {"i": "int", "f": "float", "M": "date", "b": "bool"}.get(values.dtype.kind, "str")


def _row(columns: Columns, row: int) -> dict:
    if isinstance(columns, pd.DataFrame):
        columns = {c: columns[c].to_numpy() for c in columns.columns}
    out = {}
    for column, values in columns.items():
        if isinstance(values, tuple):
            if values[1][row]:
                out[column] = None
                continue
            values = values[0]
        value = values[row]
        out[column] = pd.Timestamp(value) if isinstance(value, np.datetime64) else _python(value)
    return out


def _empty(kind: str, n: int) -> np.ndarray:
    dtype = {
        "int": np.int64,
        "float": np.float64,
        "str": object,
        "date": "datetime64[ns]",
        "bool": bool,
    }[kind]
    return np.zeros(n, dtype=dtype) if kind != "str" else np.full(n, None, dtype=object)
