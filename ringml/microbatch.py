"""Coalescing of small updates: many one-tuple updates maintained at the cost of one batch.

F-IVM's cost per :meth:`Maintainer.apply` has a fixed part (validation, encoding, one trigger
per relation, a few hundred numpy calls) that a batch of 1000 tuples shares and a batch of
one tuple pays alone, so single-tuple applies run at a small fraction of the per-tuple
throughput of large batches; a :class:`ringml.sql.Database` adds its own fixed part (type
conformance, the tables' key checks, every view's trigger).  A :class:`MicroBatcher`
buffers updates (single rows as plain tuples or mappings, or whole :class:`UpdateBatch` es)
for a maintainer or a SQL database and applies them as one atomic ``apply`` -- one batch
per relation (table) -- when ``max_rows`` rows are pending, when the oldest pending update
is ``max_delay`` seconds old (checked on every update and by :meth:`poll`; no thread runs in
the background), on :meth:`flush`, or when a ``with`` block ends.  A batcher takes updates,
:meth:`poll` and :meth:`flush` from any thread (one lock: an update waits while a flush
applies); its target is no more thread-safe than any maintainer, so do not apply to it
directly while the batcher may flush.

Semantics.  Every update is applied exactly once or rejected, and :class:`Flush` says which
(by the ids given to :meth:`insert`, :meth:`delete` and :meth:`add`).  A flush applies its
updates as *one* batch per relation (one per relation and set of column dtypes when added
batches' dtypes differ, all in one atomic ``apply``: stacking never changes a value's type),
so, as within any batch, only the net change of each tuple over that batch is checked: a
tuple deleted and then inserted again within one flush is valid in either order, while
applied one update at a time the delete would be rejected.  The result after a flush is
the result after the same rows applied one by one (up to the rounding of floating payloads,
which are summed in another order).  When the coalesced apply is rejected, no view changed
and the flush falls back to applying its updates one at a time, in arrival order: the
valid ones are applied, each rejected one is reported with its
:class:`~ringml.errors.BatchError` (not raised).  Subscribers of the maintainer (of a
database's views) see one delta (diff) per ``apply``: one per flush, or one per update in
the fallback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .batch import UpdateBatch, exact_column
from .delta import ResultDelta
from .errors import BatchError, InputTypeError, SubscriberError

__all__ = ["Flush", "MicroBatcher"]

#: Python types whose columns are converted directly (what pandas makes of them).
_DIRECT = {int: np.int64, float: np.float64}


def _column(values: tuple) -> np.ndarray | pd.Series:
    """One column of buffered rows as ``DataFrame.from_records`` types it (converted
    directly for one plain type: Python ints that fit int64, floats, str, tz-naive
    Timestamps), except that integers a float column would round stay objects."""
    kinds = set(map(type, values))
    if len(kinds) == 1:
        kind = kinds.pop()
        dtype = _DIRECT.get(kind)
        if dtype is not None:
            try:
                return np.fromiter(values, dtype, len(values))
            except OverflowError:  # an int beyond int64
                pass
        elif kind is str:
            array = np.empty(len(values), dtype=object)
            array[:] = values
            return array
        elif kind is pd.Timestamp:
            index = pd.DatetimeIndex(values)
            if index.tz is None:
                return index.to_numpy()
    return pd.Series(exact_column(values))


@dataclass
class Flush:
    """What one flush did: the result's changes (one delta per ``apply`` it made; empty when
    nothing was pending), the ids of the applied updates and the rejected ones with their
    errors, in arrival order."""

    deltas: list[ResultDelta | None] = field(default_factory=list)
    applied: list[Hashable] = field(default_factory=list)
    rejected: list[tuple[Hashable, BatchError]] = field(default_factory=list)
    rows: int = 0

    @property
    def coalesced(self) -> bool:
        """True when every update went through one ``apply`` (not the fallback, which may
        also apply just one update and reject the others)."""
        return len(self.deltas) == 1 and not self.rejected


class _Pending:
    """The buffered updates of one relation: single rows (values, sign, id and arrival
    number each) and whole batches (arrival number, id, frame, signs)."""

    __slots__ = ("rows", "signs", "ids", "arrivals", "batches")

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.signs: list[int] = []
        self.ids: list[Hashable] = []
        self.arrivals: list[int] = []
        self.batches: list[tuple[int, Hashable, pd.DataFrame, np.ndarray]] = []


class MicroBatcher:
    """Buffers updates of ``target`` -- a :class:`~ringml.maintainer.Maintainer` or a
    :class:`ringml.sql.Database` -- and applies them in coalesced batches (see the module
    docstring for when, and for the semantics).  A row names its relation (table) and gives
    its values in the relation's column order, or as a mapping of every column; a
    database's table names match case-insensitively, as in its SQL.

    ``max_rows``: flush once this many rows are pending (default 1000); ``max_delay``:
    flush once the oldest pending update is this many seconds old (None: never by age);
    ``clock``: the time source for ``max_delay`` (``time.monotonic``).  The methods that
    take an update return the :class:`Flush` when that update made the batcher flush, else
    None (a database's ``apply`` returns no delta: :attr:`Flush.deltas` holds None per
    apply, and its views' subscribers get the diffs).  ``id``: a name of the update for
    :class:`Flush` (default: its arrival number).
    """

    def __init__(
        self,
        target,
        max_rows: int = 1000,
        max_delay: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if int(max_rows) < 1:
            raise ValueError(f"max_rows must be a positive integer, got {max_rows!r}")
        if max_delay is not None and not max_delay >= 0:
            raise ValueError(f"max_delay must be None or >= 0 seconds, got {max_delay!r}")
        self.target = target
        self.max_rows = int(max_rows)
        self.max_delay = max_delay
        self.clock = clock
        self._read_relations()
        self._pending: dict[str, _Pending] = {}  # in order of first appearance
        self._rows = 0
        self._since: float | None = None
        self._arrivals = 0
        self._lock = threading.Lock()  # updates, poll and flush from any thread

    def __getstate__(self) -> dict:
        state = dict(vars(self))
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        """Number of rows buffered and not applied yet."""
        return self._rows

    def insert(self, relation: str, row: Sequence | Mapping, id: Hashable = None) -> Flush | None:
        """Buffer the insert of one tuple: values in the relation's column order, or a
        mapping of every column to its value."""
        with self._lock:
            return self._push_row(relation, row, 1, id)

    def delete(self, relation: str, row: Sequence | Mapping, id: Hashable = None) -> Flush | None:
        """Buffer the delete of one tuple (as :meth:`insert` takes it)."""
        with self._lock:
            return self._push_row(relation, row, -1, id)

    def add(self, batch: UpdateBatch, id: Hashable = None) -> Flush | None:
        """Buffer a whole batch (its rows are checked when it is applied)."""
        if not isinstance(batch, UpdateBatch):
            raise InputTypeError(f"add takes an UpdateBatch, got {type(batch).__name__}")
        relation = self._check_relation(batch.relation)
        signs = batch.signs()
        with self._lock:
            arrival = self._arrive()
            pending = self._pending.setdefault(relation, _Pending())
            pending.batches.append((arrival, arrival if id is None else id, batch.rows, signs))
            self._rows += len(signs)
            return self._after_push()

    def poll(self) -> Flush | None:
        """Flush when the oldest pending update is ``max_delay`` old (for idle streams)."""
        with self._lock:
            return self._flush() if self._due() else None

    def flush(self) -> Flush:
        """Apply every pending update now (see the module docstring); the buffer is empty
        afterwards, whatever was rejected.  An error that is not a rejection is raised, the
        updates not applied left pending; a :class:`~ringml.errors.SubscriberError` (a
        subscriber raised, the updates were applied) carries the :class:`Flush` as
        ``error.flush``."""
        with self._lock:
            return self._flush()

    def _flush(self) -> Flush:
        pending, self._pending = self._pending, {}
        since, report = self._since, Flush(rows=self._rows)
        self._rows, self._since = 0, None
        if not pending:
            return report
        try:
            batches = [b for relation, p in pending.items() for b in self._batches(relation, p)]
            report.deltas.append(self.target.apply(batches))
        except BatchError:
            pass  # nothing changed: find the rejected updates one at a time
        except SubscriberError as error:  # applied; a subscriber failed
            report.applied = self._ids(pending)
            error.flush = report
            raise
        except BaseException:  # not a rejection (a bug, an interrupt): nothing is dropped
            self._pending, self._rows, self._since = pending, report.rows, since
            raise
        else:
            report.applied = self._ids(pending)
            return report
        updates = self._arrived(pending)
        for k, (_, id, relation, values, signs) in enumerate(updates):
            try:
                report.deltas.append(self.target.apply(self._single(relation, values, signs)))
                report.applied.append(id)
            except BatchError as error:
                report.rejected.append((id, error))
            except SubscriberError as error:  # applied; the later updates stay pending
                report.applied.append(id)
                self._requeue(updates[k + 1 :], since)
                error.flush = report
                raise
            except BaseException:  # not a rejection: this update and the later ones stay
                self._requeue(updates[k:], since)
                raise
        return report

    def __enter__(self) -> MicroBatcher:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.flush()

    # ------------------------------------------------------------------ internals
    def _arrive(self) -> int:
        arrival = self._arrivals
        self._arrivals += 1
        if self._since is None:
            self._since = self.clock()
        return arrival

    def _push_row(self, relation: str, row, sign: int, id: Hashable) -> Flush | None:
        if type(row) is not tuple or self._width.get(relation) != len(row):
            relation = self._check_relation(relation)
            row = self._row(relation, row)
        arrival = self._arrivals
        self._arrivals += 1
        if self._since is None:
            self._since = self.clock()
        pending = self._pending.get(relation)
        if pending is None:
            pending = self._pending[relation] = _Pending()
        pending.rows.append(row)
        pending.signs.append(sign)
        pending.ids.append(arrival if id is None else id)
        pending.arrivals.append(arrival)
        self._rows += 1
        if self._rows >= self.max_rows or (self.max_delay is not None and self._due()):
            return self._flush()
        return None

    def _after_push(self) -> Flush | None:
        if self._rows >= self.max_rows or self._due():
            return self._flush()
        return None

    def _due(self) -> bool:
        return (
            self.max_delay is not None
            and self._since is not None
            and self.clock() - self._since >= self.max_delay
        )

    def _read_relations(self) -> None:
        """The target's relations with their columns, and which take updates: a maintainer's
        query relations (its updatable ones), a database's tables (all: a table a view
        holds static is rejected when applied, like any bad update)."""
        target = self.target
        if hasattr(target, "query") and hasattr(target, "updatable"):  # a Maintainer
            self._database = False
            self._columns = {r: tuple(c) for r, c in target.query.relations.items()}
            updatable = target.updatable
        elif isinstance(getattr(target, "tables", None), Mapping):  # a ringml.sql.Database
            self._database = True
            self._columns = {t: tuple(s.columns) for t, s in target.tables.items()}
            updatable = self._columns
        else:
            raise InputTypeError(
                "MicroBatcher feeds a ringml.Maintainer or a ringml.sql.Database, got "
                f"{type(target).__name__}"
            )
        # relations that take updates -> their number of columns (the fast path of a row)
        self._width = {r: len(c) for r, c in self._columns.items() if r in updatable}

    def _check_relation(self, relation: str) -> str:
        """The relation's name as the target spells it; :class:`BatchError` for one that is
        unknown or static.  A database is read again for a name it did not have (tables
        may have been created since), and its names match case-insensitively."""
        if relation not in self._columns and self._database:
            self._read_relations()
            spelled = {r.lower(): r for r in self._columns}
            relation = spelled.get(str(relation).lower(), relation)
        if relation not in self._columns:
            raise BatchError(
                f"unknown relation {relation!r}; the target has {sorted(self._columns)}",
                relation,
            )
        if relation not in self._width:
            raise BatchError(
                f"relation {relation!r} is static; declare it updatable to change it", relation
            )
        return relation

    def _row(self, relation: str, row: Sequence | Mapping) -> tuple:
        """A row as a tuple in column order; :class:`BatchError` for another shape."""
        columns = self._columns[relation]
        if isinstance(row, Mapping):
            if set(row) != set(columns):
                raise BatchError(
                    f"relation {relation!r} has columns {list(columns)}; the row has {list(row)}",
                    relation,
                )
            return tuple(row[c] for c in columns)
        if isinstance(row, str | bytes) or not isinstance(row, Sequence):
            raise InputTypeError(
                f"relation {relation!r}: a row is a sequence of values in column order "
                f"{list(columns)} or a mapping of columns to values, got {type(row).__name__}"
            )
        if len(row) != len(columns):
            raise BatchError(
                f"relation {relation!r} has {len(columns)} columns {list(columns)}; the row "
                f"has {len(row)} values",
                relation,
            )
        return tuple(row)

    def _frame(self, relation: str, rows: list[tuple]) -> pd.DataFrame:
        """The rows as a frame, each column as :func:`_column` types it."""
        columns = self._columns[relation]
        arrays = [_column(values) for values in zip(*rows, strict=True)]
        return pd.DataFrame(dict(zip(columns, arrays, strict=True)), copy=False)

    def _batches(self, relation: str, pending: _Pending) -> list[UpdateBatch]:
        """A relation's pending rows as one batch per set of column dtypes: only frames
        whose columns have the same dtypes are stacked, since ``pd.concat`` of others may
        change a value's type (True to 1.0, an int beyond 2**53 to a float) or fail on
        values that each frame alone holds.  :class:`BatchError` when a pending batch's
        columns are not the relation's (each update is then applied alone)."""
        columns = self._columns[relation]
        groups: dict[tuple, tuple[list[pd.DataFrame], list[np.ndarray]]] = {}
        if pending.rows:
            frame = self._frame(relation, pending.rows)
            groups[tuple(frame.dtypes)] = [frame], [np.asarray(pending.signs, dtype=np.int64)]
        for _, id, frame, batch_signs in pending.batches:
            if len(frame.columns) != len(columns) or set(frame.columns) != set(columns):
                # pd.concat would fill a missing column with NaN
                raise BatchError(
                    f"relation {relation!r}: update {id!r} has columns {list(frame.columns)}, "
                    f"the relation {list(columns)}",
                    relation,
                )
            frames, signs = groups.setdefault(tuple(frame[c].dtype for c in columns), ([], []))
            frames.append(frame)
            signs.append(batch_signs)
        return [
            UpdateBatch(
                relation,
                frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True),
                np.concatenate(signs),
            )
            for frames, signs in groups.values()
        ]

    def _arrived(self, pending: dict[str, _Pending]) -> list[tuple]:
        """Every pending update (see :meth:`_updates`) in arrival order."""
        return sorted(u for r, p in pending.items() for u in self._updates(r, p))

    def _ids(self, pending: dict[str, _Pending]) -> list[Hashable]:
        """The pending updates' ids in arrival order."""
        if len(pending) == 1:
            (only,) = pending.values()
            if not only.batches:  # rows only: they arrived in their order
                return list(only.ids)
        return [id for _, id, *_ in self._arrived(pending)]

    def _updates(self, relation: str, pending: _Pending):
        """``(arrival, id, relation, values, signs)`` of every pending update: ``values`` a
        row tuple (``signs`` its sign) or a batch's frame (``signs`` its array)."""
        for arrival, id, row, sign in zip(
            pending.arrivals, pending.ids, pending.rows, pending.signs, strict=True
        ):
            yield arrival, id, relation, row, sign
        for arrival, id, frame, signs in pending.batches:
            yield arrival, id, relation, frame, signs

    def _single(self, relation: str, values, signs) -> UpdateBatch:
        """One pending update (see :meth:`_updates`) as its own batch."""
        if isinstance(values, tuple):
            values, signs = self._frame(relation, [values]), np.asarray([signs], np.int64)
        return UpdateBatch(relation, values, signs)

    def _requeue(self, updates: list, since: float | None) -> None:
        """Put updates (see :meth:`_updates`, in arrival order) back in the buffer."""
        for arrival, id, relation, values, signs in updates:
            pending = self._pending.setdefault(relation, _Pending())
            if isinstance(values, tuple):
                pending.rows.append(values)
                pending.signs.append(signs)
                pending.ids.append(id)
                pending.arrivals.append(arrival)
            else:
                pending.batches.append((arrival, id, values, signs))
            self._rows += 1 if isinstance(values, tuple) else len(signs)
        if updates and self._since is None:
            self._since = since
