"""Update batches and their validation at the edge.

An :class:`UpdateBatch` is a set of signed tuples for one relation.  Before any view changes,
:class:`BatchPreparer` checks the whole batch — relation, columns, key values, feature values
(numbers, finite), deletes of absent tuples — and turns it into int64 codes (join and group-by
variables) and float arrays (lifted features).  A rejected batch raises :class:`BatchError`
naming the relation, column and value; only dictionaries may have grown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .encoding import _INT, Dictionary, EncodingError, _value_keys
from .errors import BatchError
from .keyindex import KeyIndex, hash_rows
from .query import Query


@dataclass
class UpdateBatch:
    """Tuples ``rows`` of ``relation`` with signed multiplicities (+1 insert, -1 delete)."""

    relation: str
    rows: pd.DataFrame
    multiplicity: np.ndarray | None = None

    @classmethod
    def inserts(cls, relation: str, rows) -> UpdateBatch:
        return cls(relation, _frame(rows), None)

    @classmethod
    def deletes(cls, relation: str, rows) -> UpdateBatch:
        frame = _frame(rows)
        return cls(relation, frame, -np.ones(len(frame), dtype=np.int64))

    def signs(self) -> np.ndarray:
        if self.multiplicity is None:
            return np.ones(len(self.rows), dtype=np.int64)
        mult = np.asarray(self.multiplicity)
        if mult.dtype.kind not in "iu":
            if (
                mult.dtype.kind == "f"
                and np.all(np.isfinite(mult))
                and np.all(mult == np.round(mult))
            ):
                mult = mult.astype(np.int64)
            else:
                raise BatchError(
                    f"relation {self.relation!r}: multiplicities must be integers, got "
                    f"{mult.dtype}",
                    self.relation,
                    "multiplicity",
                    None,
                )
        return mult.astype(np.int64)


def _frame(rows) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        return rows
    return pd.DataFrame(rows)


def _column_arrays(frame: pd.DataFrame, columns: Sequence[str]) -> list[np.ndarray]:
    """The values of ``columns`` as numpy arrays, as ``frame[c].to_numpy()`` gives them.

    A new batch's frame has no cached columns, and ``frame[c]`` builds a Series per column
    (most of the cost of reading a batch); numpy-backed columns are read by position from
    the frame's blocks instead, other columns (extension dtypes) through ``to_numpy``.
    """
    read = getattr(frame, "_get_column_array", None)  # pandas 2.x
    names = frame.columns.tolist()
    position = {name: at for at, name in enumerate(names)}
    if read is None or len(position) != len(names):
        return [frame[c].to_numpy() for c in columns]
    arrays = []
    for c in columns:
        data = read(position[c])
        arrays.append(data if type(data) is np.ndarray else frame[c].to_numpy())
    return arrays


@dataclass
class PreparedRows:
    """A validated batch: codes per encoded column, floats per lifted column, multiplicities."""

    relation: str
    size: int
    codes: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    multiplicity: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tuple_ids: np.ndarray | None = None
    tuple_delta: np.ndarray | None = None


def _exact_big(bits: np.ndarray, ints: np.ndarray) -> np.ndarray:
    """Float64 bits of integers, but the integer itself beyond 2**53, where float64 rounds
    (no float equals such an integer, so tuples differing there must not collide)."""
    big = np.abs(ints) > 2**53
    return np.where(big, ints, bits) if big.any() else bits


class TupleCounts:
    """Multiplicities of the stored tuples of one relation (to reject deletes of absent ones).

    Inserts cannot make a tuple absent, so insert-only batches are only recorded; the hash
    index is brought up to date in bulk when a batch with deletes needs it.
    """

    def __init__(self, width: int) -> None:
        self.index = KeyIndex(1)
        self.counts = np.zeros(16, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    @staticmethod
    def fingerprints(columns: Sequence[np.ndarray]) -> np.ndarray:
        """A 64-bit hash of every row of these columns; numbers hash by value (``1 == 1.0``)."""
        n = columns[0].shape[0] if len(columns) else 0
        numeric = [j for j, data in enumerate(columns) if data.dtype.kind in "iufb"]
        # numeric columns as float64 rows of one array: one conversion each, one -0.0 fix
        floats = np.empty((len(numeric), n))
        for row, j in enumerate(numeric):
            floats[row] = columns[j]
        floats += 0.0
        bits = floats.view(np.int64)
        hashed = []
        ints = [row for row, j in enumerate(numeric) if columns[j].dtype.kind == "i"]
        # only integers of magnitude >= 2**53 may round in float64: check those exactly
        if ints and n and np.abs(floats[ints]).max() >= 2.0**53:
            for row in ints:
                bits[row] = _exact_big(bits[row], columns[numeric[row]])
        at = dict(zip(numeric, bits, strict=True))
        for j, data in enumerate(columns):
            if j in at:
                hashed.append(at[j])
            else:
                keys = _value_keys(data)[0]
                ints = keys[:, 0] == _INT  # numbers in object columns hash like numeric ones
                as_float = (keys[ints, 1].astype(np.float64) + 0.0).view(np.int64)
                keys[ints, 1] = _exact_big(as_float, keys[ints, 1])
                hashed.append(keys[:, 1])
        return hash_rows(hashed).view(np.int64)

    def current(self, unique: np.ndarray) -> np.ndarray:
        """Stored multiplicity of each fingerprint (0 when absent)."""
        self._flush()
        slots = self.index.lookup(unique)
        return np.where(slots >= 0, self.counts[np.maximum(slots, 0)], 0)

    def check(
        self,
        fingerprints: np.ndarray,
        signs: np.ndarray,
        earlier: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Net change per distinct tuple; also the index of a violating row, or -1.

        ``earlier`` = (fingerprints, net changes) of batches that precede this one in the
        same atomic apply and are not recorded yet: a tuple they insert may be deleted here.
        """
        if (signs >= 0).all():
            return fingerprints, signs, -1
        unique, first, inverse = np.unique(fingerprints, return_index=True, return_inverse=True)
        net = np.bincount(inverse.ravel(), weights=signs, minlength=unique.size).astype(np.int64)
        current = self.current(unique)
        if earlier is not None and earlier[0].size:
            pos = np.minimum(np.searchsorted(unique, earlier[0]), unique.size - 1)
            hit = unique[pos] == earlier[0]
            np.add.at(current, pos[hit], earlier[1][hit])
        bad = np.flatnonzero(current + net < 0)
        return unique, net, int(first[bad[0]]) if bad.size else -1

    def apply(self, ids: np.ndarray, net: np.ndarray) -> None:
        """Record the changes (ids need not be unique)."""
        self._pending.append((ids, net))

    def _flush(self) -> None:
        if not self._pending:
            return
        ids = np.concatenate([p[0] for p in self._pending])
        net = np.concatenate([p[1] for p in self._pending])
        self._pending.clear()
        unique, inverse = np.unique(ids, return_inverse=True)
        total = np.bincount(inverse.ravel(), weights=net, minlength=unique.size).astype(np.int64)
        slots, _ = self.index.get_or_insert(unique)
        if self.index.capacity > self.counts.size:
            grown = np.zeros(self.index.capacity, dtype=np.int64)
            grown[: self.counts.size] = self.counts
            self.counts = grown
        self.counts[slots] += total
        gone = slots[self.counts[slots] == 0]
        if gone.size:
            self.index.remove(gone)


class BatchPreparer:
    """Validates and encodes batches for a query."""

    def __init__(
        self,
        query: Query,
        dictionaries: Mapping[tuple[str, str], Dictionary],
        encoded: Mapping[str, set[str]],
        numeric: Mapping[str, set[str]],
        check_deletes: bool,
    ) -> None:
        """``dictionaries[(relation, column)]``; per relation, the columns to encode to codes
        and the columns to keep as float values (lifted continuous features)."""
        self.query = query
        self.dictionaries = dictionaries
        self.encoded = encoded
        self.numeric = numeric
        self.counts = (
            {r: TupleCounts(len(cols)) for r, cols in query.relations.items()}
            if check_deletes
            else None
        )

    def prepare(
        self, batch: UpdateBatch, earlier: tuple[np.ndarray, np.ndarray] | None = None
    ) -> PreparedRows:
        """Validate ``batch`` and encode it; raises :class:`BatchError`, changing no view.

        ``earlier``: the (tuple ids, net changes) of the batches before this one in the same
        atomic apply, which deletes are checked against too.
        """
        relation = batch.relation
        if relation not in self.query.relations:
            raise BatchError(
                f"unknown relation {relation!r}; the query has {sorted(self.query.relations)}",
                relation,
            )
        columns = self.query.relations[relation]
        frame = batch.rows
        missing = [c for c in columns if c not in frame.columns]
        extra = [c for c in frame.columns if c not in columns]
        if missing or extra:
            raise BatchError(
                f"relation {relation!r} has columns {list(columns)}; batch is missing "
                f"{missing} and has extra {extra}",
                relation,
                (missing or extra)[0],
            )
        signs = batch.signs()
        if signs.shape != (len(frame),):
            raise BatchError(
                f"relation {relation!r}: {signs.shape[0]} multiplicities for {len(frame)} rows",
                relation,
                "multiplicity",
            )
        if relation in self.query.filters:
            if list(frame.columns) != list(columns):
                frame = frame[list(columns)]
            mask = np.asarray(self.query.filters[relation](frame), dtype=bool)
            frame, signs = frame[mask], signs[mask]
        prepared = PreparedRows(relation, len(frame), multiplicity=signs)
        arrays = _column_arrays(frame, columns)
        self._convert(relation, dict(zip(columns, arrays, strict=True)), prepared)
        if self.counts is not None and len(frame):
            counts = self.counts[relation]
            unique, net, violating = counts.check(TupleCounts.fingerprints(arrays), signs, earlier)
            if violating >= 0:
                row = frame.iloc[violating].to_dict()
                raise BatchError(
                    f"relation {relation!r}: deleting tuple {row} that is not present "
                    f"(pass allow_absent_deletes=True for plain ring semantics)",
                    relation,
                    None,
                    row,
                )
            prepared.tuple_ids, prepared.tuple_delta = unique, net
        return prepared

    def prepare_factor(self, relation: str, frame: pd.DataFrame) -> PreparedRows:
        """Validate and encode one factor of a factorized update: rows over some columns."""
        if relation in self.query.filters:
            raise BatchError(
                f"relation {relation!r} has a filter; give its update as rows, not as factors",
                relation,
            )
        prepared = PreparedRows(relation, len(frame), multiplicity=np.ones(len(frame), np.int64))
        columns = list(frame.columns)
        arrays = _column_arrays(frame, columns)
        self._convert(relation, dict(zip(columns, arrays, strict=True)), prepared)
        return prepared

    def _convert(
        self, relation: str, arrays: Mapping[str, np.ndarray], prepared: PreparedRows
    ) -> None:
        """Codes for the encoded columns, floats for the lifted ones, checks for the others."""
        for column, data in arrays.items():
            if column in self.numeric[relation]:
                prepared.values[column] = self._numbers(relation, column, data)
            if column in self.encoded[relation]:
                prepared.codes[column] = self._encode(relation, column, data)
            elif column not in self.numeric[relation]:
                self._check_values(relation, column, data)

    def commit(self, prepared: PreparedRows) -> None:
        """Record the batch's tuples as applied."""
        if self.counts is not None and prepared.tuple_ids is not None:
            self.counts[prepared.relation].apply(prepared.tuple_ids, prepared.tuple_delta)

    def uncommit(self, prepared: PreparedRows) -> None:
        """Take back :meth:`commit` (the batch was rejected after all)."""
        if self.counts is not None and prepared.tuple_ids is not None:
            self.counts[prepared.relation].apply(prepared.tuple_ids, -prepared.tuple_delta)

    def _numbers(self, relation: str, column: str, data: np.ndarray) -> np.ndarray:
        if data.dtype.kind not in "iufb":
            converted = pd.to_numeric(pd.Series(data), errors="coerce")
            numeric = converted.to_numpy(dtype=np.float64, na_value=np.nan)
            bad = np.flatnonzero(np.isnan(numeric) & ~pd.isna(pd.Series(data)).to_numpy())
            if bad.size:
                value = data[bad[0]]
                raise BatchError(
                    f"relation {relation!r}, column {column!r}: value {value!r} is not a number",
                    relation,
                    column,
                    value,
                )
            data = converted.to_numpy(dtype=np.int64) if converted.dtype.kind == "i" else numeric
        if data.dtype.kind == "i":  # exact: float64 would round integers beyond 2**53
            return data.astype(np.int64, copy=False)
        data = data.astype(np.float64, copy=False)
        finite = np.isfinite(data)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            value = data[bad[0]]
            raise BatchError(
                f"relation {relation!r}, column {column!r}: feature value {value!r} is not a "
                f"finite number (row {int(bad[0])})",
                relation,
                column,
                value,
            )
        return data

    def _check_values(self, relation: str, column: str, data: np.ndarray) -> None:
        """A column the strategy neither encodes nor lifts still binds a variable: reject the
        values no strategy could key (NaN, None, NaT, ±inf), so all strategies accept the
        same batches."""
        try:
            if data.dtype.kind == "f":
                bad = np.flatnonzero(~np.isfinite(data))
                if bad.size:
                    i = int(bad[0])
                    raise EncodingError(f"value {data[i]!r} cannot be a key", i, data[i])
            elif data.dtype.kind not in "iub":
                _value_keys(data)
        except EncodingError as error:
            raise BatchError(
                f"relation {relation!r}, column {column!r}: {error} (row {error.position})",
                relation,
                column,
                error.value,
            ) from None

    def _encode(self, relation: str, column: str, data: np.ndarray) -> np.ndarray:
        try:
            return self.dictionaries[(relation, column)].encode(data)
        except EncodingError as error:
            raise BatchError(
                f"relation {relation!r}, column {column!r}: {error} (row {error.position})",
                relation,
                column,
                error.value,
            ) from None


def batches_from(relation: str, inserts=None, deletes=None) -> Sequence[UpdateBatch]:
    """Convenience: the insert and delete batches of one relation."""
    out = []
    if inserts is not None:
        out.append(UpdateBatch.inserts(relation, inserts))
    if deletes is not None:
        out.append(UpdateBatch.deletes(relation, deletes))
    return out
