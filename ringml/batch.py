"""Update batches and their validation at the edge.

An :class:`UpdateBatch` is a set of signed tuples for one relation.  Before any view changes,
:class:`BatchPreparer` checks the whole batch — relation, columns, key values, feature values
(finite real numbers, never coerced from strings, booleans or dates), deletes of absent
tuples — and turns it into int64 codes (join and group-by variables) and float arrays (lifted
features).  A rejected batch raises :class:`BatchError` naming the relation, column and value;
only dictionaries may have grown.
"""

from __future__ import annotations

import datetime
import decimal
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .encoding import (
    _BIG,
    _FLOAT,
    _INT,
    _INT64_MAX,
    Dictionary,
    EncodingError,
    _big_int_bits,
    _float_keys,
    _value_keys,
    fits_int64,
)
from .errors import BatchError, InputTypeError
from .keyindex import hash_rows
from .query import Query


@dataclass
class UpdateBatch:
    """Tuples ``rows`` of ``relation`` with signed multiplicities (+1 insert, -1 delete).

    ``rows``: a DataFrame, a mapping of column names to sequences, a list of records, a
    ``pyarrow.Table`` or any frame exposing ``to_arrow()``, the Arrow PyCapsule stream or
    the ``__dataframe__`` interchange protocol (polars, ...); see :func:`as_frame`.
    """

    relation: str
    rows: pd.DataFrame
    multiplicity: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.rows = as_frame(self.rows, self.relation)

    @classmethod
    def inserts(cls, relation: str, rows) -> UpdateBatch:
        return cls(relation, rows, None)

    @classmethod
    def deletes(cls, relation: str, rows) -> UpdateBatch:
        frame = as_frame(rows, relation)
        return cls(relation, frame, -np.ones(len(frame), dtype=np.int64))

    def signs(self) -> np.ndarray:
        if self.multiplicity is None:
            return np.ones(len(self.rows), dtype=np.int64)
        mult = np.asarray(self.multiplicity)
        kind = mult.dtype.kind
        if kind == "O" and all(
            isinstance(m, numbers.Integral) and not isinstance(m, bool | np.bool_)
            for m in mult.ravel().tolist()
        ):  # Python ints beyond uint64
            beyond = np.asarray([abs(int(m)) >= 2**63 for m in mult.ravel().tolist()])
        elif kind == "f" and np.all(np.isfinite(mult)) and np.all(mult == np.round(mult)):
            beyond = np.abs(mult) >= 2.0**63
        elif kind == "u":
            beyond = mult >= np.uint64(2**63)
        elif kind == "i":
            beyond = mult == np.iinfo(np.int64).min  # its negation (a delete) wraps
        else:
            raise BatchError(
                f"relation {self.relation!r}: multiplicities must be integers, got {mult.dtype}",
                self.relation,
                "multiplicity",
                None,
            )
        if beyond.any():
            at = int(np.flatnonzero(beyond.ravel())[0])
            value = mult.ravel()[at]
            value = value.item() if isinstance(value, np.generic) else value
            raise BatchError(
                f"relation {self.relation!r}: multiplicity {value!r} (row {at}) is beyond int64",
                self.relation,
                "multiplicity",
                value,
            )
        return mult.astype(np.int64)


_ROWS_EXPECTED = (
    "a DataFrame, a mapping of column names to sequences, a list of records or an Arrow "
    "table (pyarrow, polars, ...)"
)


#: integers beyond this magnitude are not all floats: a float column would round them
EXACT_IN_FLOAT = 2**53


def _rounds_in_float(value) -> bool:
    """An integer that a float column would round."""
    return isinstance(value, numbers.Integral) and abs(int(value)) > EXACT_IN_FLOAT


def exact_column(values):
    """A list column mixing ints with anything else (floats, None, NaN, ``pd.NA``) as
    objects when pandas would make floats of it that round its ints; the values as they
    are otherwise."""
    if isinstance(values, list | tuple) and any(map(_rounds_in_float, values)):
        if not all(isinstance(v, numbers.Integral) for v in values):
            array = np.empty(len(values), dtype=object)
            array[:] = values
            return array
    return values


def as_frame(rows: object, relation: str = "?") -> pd.DataFrame:
    """``rows`` as a DataFrame; raises :class:`InputTypeError` saying what is expected.

    Arrow tables and frames of other libraries go through pyarrow: anything with
    ``to_arrow()`` (polars), the Arrow PyCapsule stream (``__arrow_c_stream__``) or the
    ``__dataframe__`` interchange protocol.
    """
    if isinstance(rows, pd.DataFrame):
        return rows
    if isinstance(rows, str | bytes):
        raise InputTypeError(
            f"relation {relation!r}: rows must be {_ROWS_EXPECTED}, not the string {rows!r}"
        )
    arrow = _arrow_table(rows)
    if arrow is not None:
        return _arrow_frame(arrow)
    if isinstance(rows, Mapping):
        for column, values in rows.items():
            if isinstance(values, str | bytes) or (
                np.ndim(values) == 0 and not isinstance(values, Mapping)
            ):
                raise InputTypeError(
                    f"relation {relation!r}: rows given as a mapping need a sequence per "
                    f"column, but column {column!r} holds the scalar {values!r} (wrap single "
                    f"rows in lists)"
                )
        rows = {column: exact_column(values) for column, values in rows.items()}
    try:
        return pd.DataFrame(rows)
    except (TypeError, ValueError) as error:
        raise InputTypeError(
            f"relation {relation!r}: rows must be {_ROWS_EXPECTED}; got "
            f"{type(rows).__name__} {rows!r:.80} ({error})"
        ) from None


def _arrow_frame(arrow) -> pd.DataFrame:
    """An Arrow table as a DataFrame; an integer column with nulls becomes a nullable
    ``Int64`` one (``UInt64`` for uint64, whose values may not fit int64; ``to_pandas``
    makes floats of it, rounding ints beyond 2**53)."""
    import pyarrow as pa

    frame = arrow.to_pandas()
    for name, column in zip(arrow.column_names, arrow.columns, strict=True):
        if pa.types.is_integer(column.type) and column.null_count:
            nullable = pd.UInt64Dtype() if column.type == pa.uint64() else pd.Int64Dtype()
            frame[name] = column.to_pandas(types_mapper={column.type: nullable}.get)
    return frame


def _arrow_table(rows: object):
    """A ``pyarrow.Table`` for Arrow-like frames (None for anything else)."""
    to_arrow = getattr(rows, "to_arrow", None)
    if callable(to_arrow):
        rows = to_arrow()
    if not hasattr(rows, "__arrow_c_stream__") and not hasattr(rows, "__dataframe__"):
        return None
    import pyarrow as pa  # a dependency, imported only when Arrow data arrives
    import pyarrow.interchange

    if isinstance(rows, pa.Table):
        return rows
    if hasattr(rows, "__arrow_c_stream__"):
        return pa.table(rows)
    return pyarrow.interchange.from_dataframe(rows)


def _column_arrays(frame: pd.DataFrame, columns: Sequence[str]) -> list[np.ndarray]:
    """The values of ``columns`` as numpy arrays, as ``frame[c].to_numpy()`` gives them.

    A new batch's frame has no cached columns, and ``frame[c]`` builds a Series per column
    (most of the cost of reading a batch); numpy-backed columns are read by position from
    the frame's blocks instead, other columns (extension dtypes) through ``to_numpy``,
    as objects when they hold ``pd.NA`` (which ``to_numpy`` would turn into NaN).
    """
    read = getattr(frame, "_get_column_array", None)  # pandas 2.x
    names = frame.columns.tolist()
    position = {name: at for at, name in enumerate(names)}
    if read is None or len(position) != len(names):
        return [_extension_array(frame[c]) for c in columns]
    arrays = []
    for c in columns:
        data = read(position[c])
        if type(data) is not np.ndarray:
            # a naive datetime/timedelta block holds a numpy array: read it without building
            # a Series (~30 us per column of a fresh frame)
            numpy_backed = isinstance(data.dtype, np.dtype)
            data = np.asarray(data) if numpy_backed else _extension_array(frame[c])
        arrays.append(data)
    return arrays


def _extension_array(column: pd.Series) -> np.ndarray:
    if isinstance(column.dtype, pd.api.extensions.ExtensionDtype) and column.hasnans:
        return column.to_numpy(dtype=object)
    return column.to_numpy()


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

    def largest_factor(self) -> tuple[str, object]:
        """The column (or ``"multiplicity"``) holding the value of largest magnitude, and
        that value: what to name when a product of payloads overflows."""
        candidates = [("multiplicity", self.multiplicity), *self.values.items()]
        best, value, size = "multiplicity", None, -1.0
        for column, data in candidates:
            if data.size:
                at = int(np.argmax(np.abs(data)))
                if abs(float(data[at])) > size:
                    best, value, size = column, data[at].item(), abs(float(data[at]))
        return best, value


# splitmix64's finalizer and a salt per kind of value (see _value_fingerprint_keys)
_MIX_A, _MIX_B = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_SALTS = (np.arange(1, 11, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)


def _mix64(z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """splitmix64's finalizer (a bijection of 64-bit words) of uint64 ``z``, into ``out``
    (a new array, or ``z`` itself)."""
    scratch = z >> np.uint64(30)
    out = np.bitwise_xor(z, scratch, out=out)
    for factor, shift in ((_MIX_A, np.uint64(27)), (_MIX_B, np.uint64(31))):
        np.multiply(out, factor, out=out)
        np.right_shift(out, shift, out=scratch)
        np.bitwise_xor(out, scratch, out=out)
    return out


def _value_fingerprint_keys(kinds: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """One int64 key per value from its ``(kind, bits)`` (:func:`_value_keys`): an integer
    of int64's range is itself (``1``, ``1.0``, uint64 ``1`` and object ``1`` alike), every
    other value its bits mixed, then xor-ed with its kind's salt (so a value meets an integer,
    or a value of another kind, only by a 64-bit hash accident)."""
    other = kinds != _INT
    if not other.any():
        return bits
    mixed = _mix64(bits.view(np.uint64))
    np.bitwise_xor(mixed, _SALTS[kinds], out=mixed)
    return np.where(other, mixed.view(np.int64), bits)


def _float_fingerprint_keys(floats: np.ndarray) -> np.ndarray:
    """:func:`_value_fingerprint_keys` of float64 values as :func:`_float_keys` keys them,
    in fewer passes; ``floats`` (1-d, a private copy) is overwritten."""
    if not np.abs(floats).max(initial=0.0) < 2.0**63:  # beyond int64, NaN or inf: rare
        return _value_fingerprint_keys(*_float_keys(floats))
    as_int = floats.astype(np.int64)
    integral = as_int == floats
    if integral.all():
        return as_int
    bits = floats.view(np.uint64)
    mixed = _mix64(bits, out=bits)
    np.bitwise_xor(mixed, _SALTS[_FLOAT], out=mixed)
    np.copyto(mixed, as_int.view(np.uint64), where=integral)
    return mixed.view(np.int64)


def _column_fingerprint_keys(data: np.ndarray) -> np.ndarray:
    """:func:`_value_fingerprint_keys` of a column that is not float (integers without the
    (n, 2) keys)."""
    if data.dtype.kind in "iub":
        ints = data.astype(np.int64, copy=False)
        if fits_int64(data):
            return ints
        big = data > _INT64_MAX
        bits = np.array(ints)
        bits[big] = _big_int_bits(data[big])
        return _value_fingerprint_keys(np.where(big, _BIG, _INT), bits)
    keys = _value_keys(data)[0]
    return _value_fingerprint_keys(keys[:, 0], keys[:, 1])


_FLUSH_AT = 16384  # recorded tuple changes before they may be merged into the main run


class TupleCounts:
    """Multiplicities of the stored tuples of one relation (to reject deletes of absent ones).

    Tuples are keyed by their 64-bit fingerprint, held as sorted runs (16 bytes per distinct
    tuple, no hash table): a main run of fingerprints with their non-zero counts, and the
    changes recorded since as a few smaller sorted runs of (fingerprint, summed change).
    Inserts cannot make a tuple absent, so changes are only recorded; a batch with deletes
    sorts the changes recorded since the last one into a run and looks up just its deleted
    tuples (binary searches in every run).  A new run is merged with the previous one while
    that is at most twice its size (the runs' sizes fall geometrically: a change is merged
    O(log) times and a lookup searches O(log) runs), and the runs are merged into the main
    one once they hold ``_FLUSH_AT`` entries and a quarter of the main run's (amortized
    linear).
    """

    def __init__(self, width: int) -> None:
        self.ids = np.zeros(0, dtype=np.int64)  # sorted, distinct
        self.counts = np.zeros(0, dtype=np.int64)  # non-zero
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # sorted, distinct, shrinking

    def __setstate__(self, state: dict) -> None:
        index = state.pop("index", None)
        if index is not None:  # pickled with a hash index of fingerprints: sorted runs now
            slots = index.live_slots()
            ids, counts = index.keys[slots, 0], state["counts"][slots]
            order = np.argsort(ids)
            state["ids"], state["counts"] = ids[order], counts[order]
        merged = state.pop("_merged", None)  # pickled with one run of recorded changes
        state.setdefault("_runs", [] if merged is None else [merged])
        self.__dict__.update(state)

    @staticmethod
    def fingerprints(columns: Sequence[np.ndarray]) -> np.ndarray:
        """A 64-bit hash of every row of these columns, of its values: equal values have
        equal keys whatever the column's type (``1 == 1.0``), distinct ones distinct keys
        (:func:`_value_fingerprint_keys`)."""
        n = columns[0].shape[0] if len(columns) else 0
        floats = [j for j, data in enumerate(columns) if data.dtype.kind == "f"]
        keys = [None if j in floats else _column_fingerprint_keys(d) for j, d in enumerate(columns)]
        if floats:  # float columns as rows of one (private) array: one pass for all
            stacked = np.empty((len(floats), n))
            for row, j in enumerate(floats):
                stacked[row] = columns[j]
            float_keys = _float_fingerprint_keys(stacked.reshape(-1)).reshape(len(floats), n)
            for row, j in enumerate(floats):
                keys[j] = float_keys[row]
        return hash_rows(keys).view(np.int64)

    def current(self, unique: np.ndarray) -> np.ndarray:
        """Stored multiplicity of each fingerprint (0 when absent; ``unique``: sorted, distinct)."""
        self._settle()
        if sum(run[0].size for run in self._runs) >= max(_FLUSH_AT, self.ids.size // 4):
            self._flush()
        found = _counts_of(self.ids, self.counts, unique)
        for run in self._runs:
            found += _counts_of(*run, unique)
        return found

    def _settle(self) -> None:
        """The changes recorded since the last lookup as one more sorted run, merged with
        the previous runs while they are at most twice its size."""
        if not self._pending:
            return
        pending = self._pending
        one = pending[0][0]  # one batch with deletes: already a sorted run (see check)
        sorted_run = len(pending) == 1 and (one.size < 2 or bool((one[1:] > one[:-1]).all()))
        self._runs.append(pending[0] if sorted_run else _sum_runs(pending))
        self._pending = []
        runs = self._runs
        while len(runs) > 1 and runs[-2][0].size <= 2 * runs[-1][0].size:
            last = runs.pop()
            runs[-1] = _sum_runs([runs[-1], last])  # two sorted runs: a linear merge

    def _flush(self) -> None:
        """Merge the recorded changes into the main run; drop the tuples whose count is 0."""
        self._settle()
        if self._runs:
            ids, counts = _sum_runs([(self.ids, self.counts), *self._runs])
            self._runs = []
            live = counts != 0
            self.ids, self.counts = ids[live], counts[live]

    def check(
        self,
        fingerprints: np.ndarray,
        signs: np.ndarray,
        earlier: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """The changes to record: (fingerprint, sign) per row of a batch of inserts; for a
        batch with deletes its distinct fingerprints, sorted, with their non-zero net changes
        (a sorted run for the record).  Also the index of a violating row, or -1.

        Only tuples whose net change in the batch (its inserts included) is negative can
        become negative, so only those are looked up: the net change plus the stored count
        must stay >= 0.  ``earlier`` = (fingerprints, changes) of batches that precede this
        one in the same atomic apply and are not recorded yet: a tuple they insert may be
        deleted here.
        """
        if not (signs < 0).any():
            return fingerprints, signs, -1
        unique, net = _net_changes(fingerprints, signs)
        falling = np.flatnonzero(net < 0)
        if falling.size:
            current = self.current(unique[falling])
            if earlier is not None and earlier[0].size:
                _add_matching(current, unique[falling], earlier[0], earlier[1])
            bad = np.flatnonzero(current + net[falling] < 0)
            if bad.size:  # the smallest violating fingerprint, at its first row
                return fingerprints, signs, int(np.argmax(fingerprints == unique[falling[bad[0]]]))
        moved = net != 0
        return unique[moved], net[moved], -1

    def apply(self, ids: np.ndarray, net: np.ndarray) -> None:
        """Record the changes (ids need not be unique)."""
        self._pending.append((ids, net))


def _net_changes(ids: np.ndarray, signs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ids, sorted, with the exact sum of their signs (one sort; a batch whose
    ids are distinct, the usual case, needs no summing)."""
    order = np.argsort(ids)
    return _sum_equal_neighbours(ids[order], signs[order].astype(np.int64, copy=False))


def _counts_of(ids: np.ndarray, counts: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The count of every wanted id in a sorted run (0 where absent)."""
    if not ids.size:
        return np.zeros(wanted.size, dtype=np.int64)
    pos = np.minimum(np.searchsorted(ids, wanted), ids.size - 1)
    return np.where(ids[pos] == wanted, counts[pos], 0)


def _sum_runs(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, changes) pairs as one sorted run of distinct ids with summed changes."""
    ids = np.concatenate([p[0] for p in parts])
    net = np.concatenate([p[1] for p in parts]).astype(np.int64, copy=False)
    order = np.argsort(ids, kind="stable")
    return _sum_equal_neighbours(ids[order], net[order])


def _sum_equal_neighbours(ids: np.ndarray, net: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ids with their changes as distinct ids with summed changes."""
    if ids.size > 1:
        distinct = ids[1:] != ids[:-1]
        if not distinct.all():
            starts = np.flatnonzero(np.concatenate(([True], distinct)))
            ids, net = ids[starts], np.add.reduceat(net, starts)
    return ids, net


def _add_matching(
    target: np.ndarray, unique: np.ndarray, ids: np.ndarray, changes: np.ndarray
) -> None:
    """``target[i] += changes`` of every ``ids`` equal to ``unique[i]`` (``unique`` sorted)."""
    pos = np.minimum(np.searchsorted(unique, ids), unique.size - 1)
    hit = unique[pos] == ids
    if hit.any():
        np.add.at(target, pos[hit], changes[hit])


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
        if frame.shape == (0, 0):  # no rows at all ([] or {}): nothing names the columns
            frame = pd.DataFrame({c: np.zeros(0, dtype=np.int64) for c in columns})
        names = frame.columns.tolist()
        # the usual case, the relation's columns in order: no duplicate, missing or extra
        # column, and no hash table of the names (pandas builds one per new frame)
        same = names == list(columns)
        if not same and frame.columns.has_duplicates:
            twice = frame.columns[frame.columns.duplicated()][0]
            raise BatchError(
                f"relation {relation!r}: the batch has column {twice!r} more than once",
                relation,
                twice,
            )
        missing = extra = []
        if not same:
            have, want = set(names), set(columns)
            missing = [c for c in columns if c not in have]
            extra = [c for c in names if c not in want]
        if missing or extra:
            raise BatchError(
                f"relation {relation!r} has columns {list(columns)}; batch is missing "
                f"{missing} and has extra {extra}",
                relation,
                (missing or extra)[0],
            )
        signs = batch.signs()
        if signs.shape != (len(frame),):
            given = (
                f"{signs.shape[0]} multiplicities"
                if signs.ndim == 1
                else f"multiplicities of shape {signs.shape}"
            )
            raise BatchError(
                f"relation {relation!r}: {given} for {len(frame)} rows (give one per row, as "
                "a flat sequence)",
                relation,
                "multiplicity",
            )
        condition = self.query.filters.get(relation)
        mask = None
        if condition is not None:  # a predicate: BatchError on values it cannot compare
            if list(frame.columns) != list(columns):
                frame = frame[list(columns)]
            mask = condition.mask(frame, relation)
        # every row is checked and counted, those the filter drops too (bad keys, deletes
        # of absent tuples); only the passing ones reach the views
        prepared = PreparedRows(relation, len(frame), multiplicity=signs)
        arrays = _column_arrays(frame, columns)
        self._convert(relation, dict(zip(columns, arrays, strict=True)), prepared)
        if self.counts is not None and len(frame):
            counts = self.counts[relation]
            unique, net, violating = counts.check(TupleCounts.fingerprints(arrays), signs, earlier)
            if violating >= 0:
                row = frame.iloc[[violating]].to_dict("records")[0]  # keeps each dtype
                raise BatchError(
                    f"relation {relation!r}: deleting tuple {row} that is not present "
                    f"(pass allow_absent_deletes=True for plain ring semantics)",
                    relation,
                    None,
                    row,
                )
            prepared.tuple_ids, prepared.tuple_delta = unique, net
        if mask is not None and not mask.all():
            prepared.size = int(np.count_nonzero(mask))
            prepared.multiplicity = signs[mask]
            prepared.codes = {c: v[mask] for c, v in prepared.codes.items()}
            prepared.values = {c: v[mask] for c, v in prepared.values.items()}
        return prepared

    def prepare_factor(self, relation: str, frame: pd.DataFrame) -> PreparedRows:
        """Validate and encode one factor of a factorized update: rows over some columns."""
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
                prepared.values[column] = feature_numbers(data, column, relation)
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


def feature_numbers(data, column: str, relation: str | None = None) -> np.ndarray:
    """A lifted feature column (array or Series) as int64 (exact) or finite float64 values.

    Only real numbers are features: strings (also numeric ones like ``"1.5"``),
    booleans, complex numbers, dates and durations, ``None``/``pd.NA``/NaN and
    infinities raise :class:`BatchError` naming the column (and relation) and the value,
    never coerced (a boolean as a 0/1 feature is asked for by casting the column to int).
    The engine's check of batches, also used by the models on rows they are given.
    """
    if isinstance(data, pd.Series):
        data = _extension_array(data)
    data = given = np.asarray(data)
    if data.dtype.kind == "O":
        data = _object_numbers(relation, column, data)
    elif data.dtype.kind not in "iuf" and data.size:
        _reject_feature(relation, column, data, 0)
    if data.dtype.kind == "i":  # exact: float64 would round integers beyond 2**53
        return data.astype(np.int64, copy=False)
    data = data.astype(np.float64, copy=False)
    finite = np.isfinite(data)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        value = given[bad[0]]  # as given (Decimal('NaN'), not the float it became)
        raise BatchError(
            f"{_where(relation, column)}: feature value {value!r} is not a finite number "
            f"(row {int(bad[0])})",
            relation,
            column,
            value,
        )
    return data


def _where(relation: str | None, column: str) -> str:
    return f"column {column!r}" if relation is None else f"relation {relation!r}, column {column!r}"


def _is_real(kind: type) -> bool:
    """Values of this type are real numbers (booleans and numpy durations, which numpy
    registers as integers, are not)."""
    return (issubclass(kind, numbers.Real) or issubclass(kind, decimal.Decimal)) and not (
        issubclass(kind, bool | np.bool_ | np.timedelta64)
    )


def _object_numbers(relation: str | None, column: str, data: np.ndarray) -> np.ndarray:
    """The numbers of an object column: int64 when all are integers that fit, else float64;
    the first value of another type raises :class:`BatchError`."""
    kinds = set(map(type, data))
    if not all(_is_real(kind) for kind in kinds):
        at = next(i for i, x in enumerate(data) if not _is_real(type(x)))
        _reject_feature(relation, column, data, at)
    if all(issubclass(kind, numbers.Integral) for kind in kinds):
        try:
            return np.asarray(data.tolist(), dtype=np.int64)
        except OverflowError:  # beyond int64: as floats, like any other big number
            pass
    return data.astype(np.float64)


def _reject_feature(relation: str | None, column: str, data: np.ndarray, at: int) -> None:
    """Raise the :class:`BatchError` for a feature value that is not a real number."""
    value = data[at]
    if data.dtype.kind in "mM":
        value = pd.Series(data[at : at + 1]).iloc[0]  # a Timestamp / Timedelta (or NaT)
    elif isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT:
        why = "is missing"
    elif isinstance(value, bool | np.bool_):
        why = "is a boolean, not a number (cast the column to int for a 0/1 feature)"
    elif isinstance(value, str | bytes):
        why = "is a string, not a number (convert the column with pd.to_numeric first)"
    elif isinstance(value, numbers.Complex):
        why = "is a complex number; features are real numbers"
    elif isinstance(value, datetime.date | datetime.timedelta | np.datetime64 | np.timedelta64):
        why = "is a date or a duration, not a number (convert it to a number explicitly)"
    else:
        why = "is not a number"
    raise BatchError(
        f"{_where(relation, column)}: feature value {value!r} {why} (row {at})",
        relation,
        column,
        value,
    )


def batches_from(relation: str, inserts=None, deletes=None) -> Sequence[UpdateBatch]:
    """Convenience: the insert and delete batches of one relation."""
    out = []
    if inserts is not None:
        out.append(UpdateBatch.inserts(relation, inserts))
    if deletes is not None:
        out.append(UpdateBatch.deletes(relation, deletes))
    return out
