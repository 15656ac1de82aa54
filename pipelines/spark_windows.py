"""Spark event-time windows: change feeds into a :class:`ringml.windows.WindowedStream`, once.

:class:`StreamingWindows` is a :class:`~ringml.pipelines.spark_stream.StreamingMaintainer`
whose target is a :class:`~ringml.windows.WindowedStream` (stream tables seen through
``RANGE`` windows, feeding a :class:`ringml.Maintainer`, a :class:`ringml.sql.Database`, a
:class:`~ringml.windows.MinMaxView`, ... -- e.g. the ``stream_`` of a windowed
:class:`~ringml.models.JoinRegressor`, or the ``stream`` of a
:class:`ringml.sql.StreamDatabase`, whose windowed SQL views it then keeps).  Parsing, dead
letters, replay detection and the checkpoint are the streaming maintainer's; what windows add:

* **event time and the watermark.**  A stream table's rows carry its event-time column in
  the feed (a relation's columns may omit it).  The watermark is Spark's: the largest
  event time seen in the batches before minus the stream's ``lateness`` (for a feed whose
  event-time column is a Spark ``timestamp``, ``timestamp_ntz`` or ``date`` -- a SQL
  ``TIMESTAMP`` or ``DATE`` of a :class:`ringml.sql.StreamDatabase`, see
  :func:`~ringml.pipelines.spark_views.spark_types_of_tables` -- and a lateness given as a
  duration, the feed is read with ``DataFrame.withWatermark(column, lateness)``, so Spark's
  progress reports show the same watermark, ``query.lastProgress["eventTime"]["watermark"]``;
  Spark watermarks ``timestamp`` columns only, so the others through a copy cast to one).
  It is computed from the applied rows and kept in the state, so a restart resumes it
  exactly (Spark's own figure lags by one batch after a replayed batch, which is skipped
  without being read);
* **late events** (behind the watermark when their micro-batch starts): with
  ``on_error="reject"`` the batch raises :class:`~ringml.pipelines.spark_stream.FeedError`
  and nothing changes (the stream must have ``late="reject"``); with
  ``on_error="dead_letter"`` (and ``late="dead_letter"``) they go to the dead-letter parquet
  files with the other bad rows (reason: behind the watermark) and the rest is applied;
* **expiry**: after a micro-batch's rows, the rows whose partitions the new watermark
  pushed out of a window are deleted in the same atomic apply; so after every micro-batch
  each target holds exactly the rows inside its windows;
* **exactly once**: the whole windowed state -- every target, the buffered partitions, the
  watermark, the dead letters -- is committed with the batch id (one atomic file replace,
  or a log record with ``snapshot_every > 1``, replayed through the stream on restart).  A
  restart moves the committed state into the caller's ``WindowedStream`` object and into
  each of its maintainer and database targets, which keep their identity, ring and
  subscribers (``adopt_state``).  A ``DistributedMaintainer`` target is refused (its
  manifest commits per apply, not per micro-batch of the window), and so are pattern views
  (their predicates are Python callables, which a checkpoint cannot store).

Example::

    model = JoinRegressor(schemas, "price", features, windows={"House": StreamTable(
        "sold", partition="1 DAY", window="RANGE 14 DAYS")}, lateness="1 DAY",
        late="dead_letter").fit(dimension_batches)
    sw = StreamingWindows(model.stream_, "state/sales", on_error="dead_letter",
                          dead_letter_path="dead/sales",
                          on_batch=lambda report: model.partial_fit([]))  # refit
    feed = ChangeFeed("feeds/sales", {"sold": "timestamp", **house_types}, relation="House")
    sw.start(spark, feed, "checkpoints/sales", trigger={"availableNow": True})
"""

from __future__ import annotations

import io
import math
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ringml import Maintainer, UpdateBatch
from ringml.errors import InputTypeError
from ringml.windows import WindowedStream, _as_times

from .spark_checkpoint import (
    CheckpointError,
    StateCheckpoint,
    check_same_description,
    restore_database,
    restore_maintainer,
    snapshot_database,
    snapshot_maintainer,
)
from .spark_distributed import DistributedMaintainer
from .spark_stream import BadRow, BatchReport, ChangeFeed, StreamingMaintainer, _prefixed

__all__ = [
    "StreamingWindows",
    "WindowsCheckpoint",
    "restore_windows",
    "snapshot_windows",
    "spark_interval",
    "windows_description",
]

_KIND = "windows"
_EVENT_TIME = "__ringml_event_time"  # a non-timestamp event time, cast for the watermark
_FORMAT = 1


# ---------------------------------------------------------------------- the state
def _is_database(target: Any) -> bool:
    return hasattr(target, "adopt_state") and hasattr(target, "catalog")


def windows_description(stream: WindowedStream) -> dict[str, Any]:
    """What a windowed stream maintains, canonically (not its state): every stream table's
    event-time column, partition width, window, origin and source, the lateness, the late
    policy, and every target's own description; checkpoints compare it before resuming."""
    tables = {
        name: {
            "time_column": spec.time_column,
            "partition": str(spec.partition),
            "window": str(spec.window),
            "origin": str(spec.origin),
            "source": spec.source,
        }
        for name, spec in sorted(stream.tables.items())
    }
    targets = []
    for target in stream.targets:
        describe = getattr(target, "description", None)
        targets.append(describe() if callable(describe) else type(target).__name__)
    return {
        "windows.tables": tables,
        "windows.lateness": str(stream.lateness),
        "windows.late": stream.late,
        "windows.targets": targets,
    }


def snapshot_windows(stream: WindowedStream) -> bytes:
    """Serialize a windowed stream: its targets (maintainers and databases as their own
    snapshots, others pickled) and the rest of its state, with its description."""
    targets = []
    for target in stream.targets:
        if isinstance(target, Maintainer):
            targets.append(("maintainer", snapshot_maintainer(target)))
        elif _is_database(target):
            targets.append(("database", snapshot_database(target)))
        else:
            targets.append(("object", pickle.dumps(target, protocol=5)))
    rest = {k: v for k, v in vars(stream).items() if k != "targets"}
    buffer = io.BytesIO()
    header = {"description": windows_description(stream)}
    pickle.dump((_KIND, _FORMAT, header), buffer, protocol=5)
    pickle.dump((targets, rest), buffer, protocol=5)
    return buffer.getvalue()


def restore_windows(
    data: bytes, like: WindowedStream | None = None, where: str = "the snapshot"
) -> WindowedStream:
    """Inverse of :func:`snapshot_windows`: a new :class:`WindowedStream`.  With ``like``, a
    snapshot of other windows or targets raises :class:`CheckpointError` naming what
    differs, and the restored state of each maintainer or database target moves into
    ``like``'s (which keeps its identity, query, ring and subscribers); a snapshot that
    cannot be read leaves ``like``'s targets as they were."""
    stream = io.BytesIO(data)
    try:
        loaded = pickle.load(stream)
    except Exception as error:  # noqa: BLE001 - any unpickling failure
        raise CheckpointError(f"{where}: unreadable ({error})") from error
    if not isinstance(loaded, tuple) or len(loaded) != 3 or loaded[0] != _KIND:
        raise CheckpointError(f"{where}: not a windowed-stream snapshot")
    if loaded[1] != _FORMAT:
        raise CheckpointError(
            f"{where}: snapshot format {loaded[1]} is not supported (want {_FORMAT}); start "
            "from a fresh state folder"
        )
    if like is not None:
        check_same_description(loaded[2].get("description"), windows_description(like), where)
    try:
        targets, rest = pickle.load(stream)
    except Exception as error:  # noqa: BLE001 - any unpickling failure
        raise CheckpointError(f"{where}: unreadable ({error})") from error
    mine = list(like.targets) if like is not None else [None] * len(targets)
    rings = [(t.ring, dict(vars(t.ring))) for t in mine if isinstance(t, Maintainer)]
    restored, moves = [], []
    try:  # every target is read before any of like's targets changes
        for (kind, blob), own in zip(targets, mine, strict=True):
            if kind == "maintainer":
                state = restore_maintainer(blob, own, where)
            elif kind == "database":
                state = restore_database(blob, own, where)
            else:
                state, own = _unpickled(blob, where), None
            if own is not None:
                moves.append((own, state))
            restored.append(state if own is None else own)
    except BaseException:  # a maintainer's restore may have set its ring's shifts
        for ring, before in rings:
            vars(ring).clear()
            vars(ring).update(before)
        raise
    for own, state in moves:  # the caller's targets keep their identity and subscribers
        own.adopt_state(state)
    out = WindowedStream.__new__(WindowedStream)
    vars(out).update(rest)
    out.targets = restored
    return out


def _unpickled(blob: bytes, where: str) -> Any:
    try:
        return pickle.loads(blob)
    except Exception as error:  # noqa: BLE001 - any unpickling failure
        raise CheckpointError(f"{where}: unreadable ({error})") from error


class WindowsCheckpoint(StateCheckpoint):
    """:class:`~ringml.pipelines.spark_checkpoint.StateCheckpoint` of a windowed stream
    (:func:`snapshot_windows`; logged batches are replayed through the stream)."""

    def _snapshot(self, target: Any) -> bytes:
        return snapshot_windows(target)

    def _restore(self, data: bytes, like: Any, where: str) -> Any:
        return restore_windows(data, like, where)


def spark_interval(duration: pd.Timedelta) -> str:
    """A duration as a Spark interval string for ``withWatermark`` (``"90 seconds"``)."""
    micros = int(round(duration.total_seconds() * 1e6))
    if micros % 1_000_000 == 0:
        return f"{micros // 1_000_000} seconds"
    if micros % 1000 == 0:
        return f"{micros // 1000} milliseconds"
    return f"{micros} microseconds"


# ---------------------------------------------------------------------- the stream
class StreamingWindows(StreamingMaintainer):
    """Feeds Spark change feeds into a :class:`~ringml.windows.WindowedStream` exactly once,
    with event time, Spark's watermark and expiry (see the module docs).

    ``stream`` is the initial state (e.g. dimension tables loaded into its targets); when
    ``state_dir`` holds a checkpoint of the same windows and targets, that state is moved
    into ``stream``.  ``on_error`` must match the stream's ``late`` policy (``"reject"`` or
    ``"dead_letter"``).  The other arguments are :class:`StreamingMaintainer`'s;
    ``report.maintainer`` in ``on_batch`` is the stream (``report.maintainer.watermark``).
    """

    _checkpoint_class = WindowsCheckpoint

    def __init__(
        self,
        stream: WindowedStream,
        state_dir: str | os.PathLike[str],
        on_error: str = "reject",
        dead_letter_path: str | os.PathLike[str] | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        callback_every: int = 1,
        snapshot_every: int = 1,
    ) -> None:
        if not isinstance(stream, WindowedStream):
            raise InputTypeError(
                f"StreamingWindows feeds a ringml.windows.WindowedStream, got "
                f"{type(stream).__name__}"
            )
        if on_error != stream.late:
            raise ValueError(
                f"on_error={on_error!r} but the stream's late rows are {stream.late!r}: late "
                "events are bad rows of the feed, so both must be 'reject' or both "
                "'dead_letter'"
            )
        if stream.patterns:
            raise InputTypeError(
                "pattern views test Python callables, which a checkpoint cannot store: "
                "stream them with a WindowedStream of their own, outside StreamingWindows"
            )
        for target in stream.targets:
            if isinstance(target, DistributedMaintainer):
                raise InputTypeError(
                    "a DistributedMaintainer commits its manifest on every apply, not once "
                    "per micro-batch of the window: stream it with StreamingMaintainer, or "
                    "window a local Maintainer"
                )
        super().__init__(
            stream, state_dir, on_error, dead_letter_path, on_batch, callback_every,
            snapshot_every,
        )  # fmt: skip

    @property
    def stream(self) -> WindowedStream:
        """The windowed stream (the caller's object, holding the committed state)."""
        return self.maintainer

    @property
    def watermark(self) -> Any:
        """The watermark as of the last committed batch (safe while streaming)."""
        with self.lock:
            self._committed()
            return self.maintainer.watermark

    def result(self) -> Any:
        """The first target's result as of the last committed batch: a maintainer's root
        payload, a database's views as ``{name: rows}`` (safe while streaming)."""
        with self.lock:
            self._committed()
            target = self.maintainer.targets[0]
            if _is_database(target):
                return {name: view.to_pandas() for name, view in target.views.items()}
            return target.result()

    # ------------------------------------------------------------------ hooks
    def _relations(self) -> Mapping[str, Sequence[str]]:
        """The feeds' relations: each stream source with its event-time column and the
        columns its targets read, and the targets' other relations."""
        from ringml.windows import _relations as target_relations

        stream = self.maintainer
        read = [target_relations(t) for t in stream.targets]
        out: dict[str, list[str]] = {}
        for name, spec in stream.tables.items():
            columns = out.setdefault(spec.source or name, [spec.time_column])
            for relations in read:
                for column in relations.get(name) or ():
                    if column not in columns:
                        columns.append(column)
        for relations in read:
            for name, columns in relations.items():
                if name not in stream.tables and name not in out:
                    out[name] = list(columns or ())
        return out

    def _nullable(self) -> Mapping[str, Sequence[str]]:
        """The feed columns that may hold NULL (an empty CSV field, JSON null): those every
        target reading them takes NULLs in -- a column a database declares ``NULL``, a
        :class:`~ringml.windows.MinMaxView`'s value column -- and never an event time."""
        from ringml.windows import MinMaxView
        from ringml.windows import _relations as target_relations

        stream = self.maintainer
        times = {(spec.source or name, spec.time_column) for name, spec in stream.tables.items()}
        takes_null: dict[tuple[str, str], bool] = {}
        for target in stream.targets:
            catalog = getattr(target, "catalog", None)
            for name, columns in target_relations(target).items():
                spec = stream.tables.get(name)
                relation = (spec.source or name) if spec is not None else name
                if catalog is not None:
                    takes = set(catalog.table(name).nullable)
                elif isinstance(target, MinMaxView):
                    takes = set(target.values) - set(target.by)
                else:
                    takes = set()
                for column in columns or ():
                    key = (relation, column)
                    ok = column in takes and key not in times
                    takes_null[key] = takes_null.get(key, True) and ok
        out: dict[str, list[str]] = {}
        for (relation, column), ok in takes_null.items():
            if ok:
                out.setdefault(relation, []).append(column)
        return out

    def _adopt(self, restored):
        if restored is not self.maintainer:
            vars(self.maintainer).update(vars(restored))
        return self.maintainer

    def _feed_frame(self, frame, feed: ChangeFeed, index: int):
        """Spark's watermark on the feed's event-time column (a lateness given as a
        duration).  Spark watermarks only ``timestamp`` columns: a ``timestamp_ntz`` or
        ``date`` event time is watermarked through a copy cast to ``timestamp`` (in the
        session time zone; the column the stream reads is left as it is)."""
        from pyspark.sql import functions as F

        stream = self.maintainer
        if not isinstance(stream.lateness, pd.Timedelta):
            return frame
        types = {name: kind.strip().lower() for name, kind in feed.data_columns().items()}
        columns = {
            spec.time_column
            for name, spec in stream.tables.items()
            if feed.relation is None or feed.relation == (spec.source or name)
        }
        delay = spark_interval(stream.lateness)
        for column in sorted(columns):
            kind = types.get(column, "")
            if kind in ("timestamp", "timestamp_ltz"):
                return frame.withWatermark(_prefixed(index, column), delay)
            if kind in ("timestamp_ntz", "date"):
                event = F.col(f"`{_prefixed(index, column)}`").cast("timestamp")
                frame = frame.withColumn(_EVENT_TIME, event)
                return frame.withWatermark(_EVENT_TIME, delay)
        return frame

    def _apply(
        self, batches: list[UpdateBatch], batch_id: int, parse_bad: Sequence[BadRow] = ()
    ) -> tuple[list[UpdateBatch], list[BadRow]]:
        """The base class's apply; the rows the stream dead-lettered as late (behind the
        watermark as it was before the batch) become bad rows of the batch and leave the
        applied batches (reported, and logged for a replay)."""
        stream = self.maintainer
        watermark = stream.watermark
        batches, bad = super()._apply(batches, batch_id, parse_bad)
        if stream.late != "dead_letter":
            return batches, bad
        columns = {spec.source or name: spec.time_column for name, spec in stream.tables.items()}
        kept = []
        for batch in batches:
            column = columns.get(batch.relation)
            late = None if column is None else _behind(batch, column, watermark)
            if late is None or not late.any():
                kept.append(batch)
                continue
            for record in batch.rows[late].to_dict("records"):
                bad.append(
                    BadRow(
                        batch_id,
                        batch.relation,
                        f"event time {_show(record[column])} is behind the watermark "
                        f"{_show(watermark)} (a late event)",
                        {k: v for k, v in record.items() if not _missing(v)},
                        column,
                    )
                )
            if (~late).any():
                rows = batch.rows[~late].reset_index(drop=True)
                kept.append(UpdateBatch(batch.relation, rows, batch.signs()[~late]))
        return kept, bad


def _behind(batch: UpdateBatch, column: str, watermark: Any) -> np.ndarray:
    """Which event times (``column`` of the batch's rows) are behind ``watermark`` (the
    windowed stream's rule, ``t < w``); the watermark is ``-inf`` (nothing is behind it)
    before the first event, whatever the event times' type (numbers, timestamps, dates,
    durations)."""
    values = batch.rows[column]
    if isinstance(watermark, pd.Timedelta):  # durations as event times
        return (pd.to_timedelta(values) < watermark).to_numpy()
    if not isinstance(watermark, pd.Timestamp):
        if float(watermark) == -math.inf:
            return np.zeros(len(values), dtype=bool)
        return pd.to_numeric(values).to_numpy(np.float64) < float(watermark)
    if values.dtype == object:
        found = _as_times(batch.relation, column, values)  # as the stream reads them
        times = pd.to_datetime(values) if found is None else found[0]
    else:
        times = pd.to_datetime(values)
    if getattr(times.dt, "tz", None) is not None:
        times = times.dt.tz_convert("UTC").dt.tz_localize(None)
    return (times < watermark).to_numpy()


def _show(value: Any) -> str:
    """An event time as people read it (a timestamp in UTC without its zone)."""
    if isinstance(value, pd.Timestamp) and value.tzinfo is not None:
        value = value.tz_convert("UTC").tz_localize(None)
    return str(value)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
