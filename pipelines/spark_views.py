"""SQL views fed by Spark change feeds, exactly once: table change feeds in, view diffs out.

:class:`StreamingViews` is a :class:`~ringml.pipelines.spark_stream.StreamingMaintainer`
whose target is a :class:`ringml.sql.Database`: the feeds' relations are the database's
tables (read with :func:`spark_types_of_tables`), and everything else is the streaming
maintainer's — parsing, replay detection, dead letters, :class:`StateCheckpoint`:

1. a micro-batch becomes ONE atomic ``db.apply([...])`` over all its tables; bad rows
   (unparseable or mistyped fields, an unknown table, a delete of an absent row) are
   rejected or dead-lettered as for relations;
2. the database (catalog, rows, views and their maintainers) is checkpointed with the batch
   id; a restart refuses a state saved for other tables or view definitions (naming the
   ``table ...`` / ``view ...`` entries of :meth:`ringml.sql.Database.description` that
   differ) and moves the committed state into the caller's database object, whose views
   (and their subscribers) then read it;
3. each view's diff of the batch (its output rows that left, ``multiplicity`` < 0, and
   came, > 0: what ``View.subscribe`` callbacks receive) goes out exactly once per batch id.

**Diffs out, and the exactly-once contract.**

* ``diff_path``: a parquet file per (view, batch id) with a non-empty diff,
  ``<diff_path>/<view>/batch_id=<id>/diff.parquet`` (Hive layout: ``spark.read.parquet(
  "<diff_path>/<view>")`` has a ``batch_id`` column), written atomically BEFORE the batch
  is committed.  A batch replayed after a crash between the two rewrites the same file, so
  a reader sees every batch's diff once (:meth:`StreamingViews.diffs` reads them back).
* ``on_diff(batch_id, view_name, diff)`` (a pandas frame) and ``diff_sink(batch_id,
  view_name, sdf)`` (the same diff as a Spark DataFrame) run AFTER the commit, views in
  creation order; the diffs of the last committed batch are checkpointed with it, and a
  delivery that did not complete (the driver died, or a callback raised: the query stops,
  nothing is lost) is redone with the same batch id when the stream restarts (``start``)
  or before the next batch.  So every diff is delivered at least once, twice only after
  such a failure: a sink must be idempotent per batch id (e.g. ``sdf.write.mode(
  "overwrite").parquet(f"out/{view}/batch_id={batch_id}")``, a MERGE keyed by batch id,
  or Delta's ``txnAppId``/``txnVersion``); a plain ``mode("append")`` may duplicate the
  batch that was being delivered when the driver died.
* ``on_batch(report)`` gets ``report.diffs`` too (after the commit, no redelivery).

Plain ``View.subscribe`` callbacks keep working and run inside ``db.apply`` (before the
commit: a crash there makes the batch run again, so they are at-least-once).  Create the
views before building the :class:`StreamingViews`.

Example::

    db = ringml.sql.Database("CREATE TABLE Orders (o_id INT, cust VARCHAR, amount DOUBLE); "
                             "CREATE TABLE Customers (cust VARCHAR, city VARCHAR)")
    db.create_view("by_city", "SELECT city, COUNT(*) AS n, SUM(amount) AS total "
                   "FROM Orders JOIN Customers USING (cust) GROUP BY city")
    feed = ChangeFeed("feeds/shop", spark_types_of_tables(db), relation=None)
    sv = StreamingViews(db, "state/shop", diff_path="diffs/shop",
                        on_diff=lambda batch_id, view, diff: print(batch_id, view, diff))
    sv.start(spark, feed, "checkpoints/shop", trigger={"availableNow": True}).awaitTermination()
    db.view("by_city").to_pandas()
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ringml import BatchError, UpdateBatch
from ringml.errors import InputTypeError, SchemaError

from .spark_checkpoint import atomic_write
from .spark_stream import BadRow, BatchReport, ChangeFeed, StreamingMaintainer

__all__ = ["DiffCallback", "StreamingViews", "spark_types_of_tables"]

#: ``(batch_id, view name, diff)``: the diff is a pandas frame (``on_diff``) or a Spark
#: DataFrame (``diff_sink``)
DiffCallback = Callable[[int, str, Any], object]

_SPARK_TYPES = {
    "int": "bigint", "float": "double", "str": "string", "bool": "boolean",
    "DATE": "date", "TIMESTAMP": "timestamp_ntz",
}  # fmt: skip
_PENDING = "view_diffs"  # meta key: (batch id, {view: diff}) of the last committed batch
_DELIVERED = "diffs-delivered.json"
_DIFF_FILE = "diff.parquet"


def spark_types_of_tables(database: Any, tables: Sequence[str] | None = None) -> dict[str, str]:
    """Spark SQL types of the columns of a :class:`ringml.sql.Database`'s (or catalog's)
    tables, for a :class:`ChangeFeed` schema: the union over ``tables`` (default: all) for a
    tagged feed, or one table's columns.  A column name two tables type differently is
    refused (feed those tables separately).

    A ``DATE`` column is a Spark ``date``; a ``TIMESTAMP`` one (or a table's date column of
    unknown declaration) a ``timestamp_ntz``: the wall-clock time as written, whatever the
    session time zone.  (A feed may read it as a Spark ``timestamp`` instead, an instant:
    it reaches the database as the naive time in the session time zone, see
    :attr:`~ringml.pipelines.spark_stream.StreamingMaintainer.time_zone`.)"""
    catalog = getattr(database, "catalog", database)
    names = list(catalog) if tables is None else [catalog.table(t).name for t in tables]
    out: dict[str, str] = {}
    owner: dict[str, str] = {}
    for name in names:
        schema = catalog.table(name)
        for column, kind in zip(schema.columns, schema.types, strict=True):
            if kind == "date":
                kind = schema.sql_type(column)
            spark_type = _SPARK_TYPES[kind]
            if out.setdefault(column, spark_type) != spark_type:
                raise SchemaError(
                    f"column {column!r} is {out[column]} in table {owner[column]!r} but "
                    f"{spark_type} in {name!r}: give each table its own feed"
                )
            owner.setdefault(column, name)
    return out


class StreamingViews(StreamingMaintainer):
    """Feeds Spark change streams of tables into a :class:`ringml.sql.Database` exactly once
    and sends every view's diff per micro-batch out (see the module docs).

    ``database`` is the initial state (tables, possibly loaded, and views); when
    ``state_dir`` holds a checkpoint, its state is moved into ``database`` (it must have the
    same tables and view definitions, else :class:`CheckpointError` names what differs).
    ``on_diff`` / ``diff_sink`` / ``diff_path``: where the diffs go.  ``on_error``,
    ``dead_letter_path``, ``on_batch``, ``callback_every`` and ``snapshot_every`` are
    :class:`StreamingMaintainer`'s.
    """

    _database_target = True

    def __init__(
        self,
        database: Any,
        state_dir: str | os.PathLike[str],
        on_error: str = "reject",
        dead_letter_path: str | os.PathLike[str] | None = None,
        on_diff: DiffCallback | None = None,
        diff_path: str | os.PathLike[str] | None = None,
        diff_sink: DiffCallback | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        callback_every: int = 1,
        snapshot_every: int = 1,
    ) -> None:
        for name, value in (("on_diff", on_diff), ("diff_sink", diff_sink)):
            if value is not None and not callable(value):
                raise InputTypeError(f"{name} takes a callable, got {type(value).__name__}")
        self.on_diff = on_diff
        self.diff_sink = diff_sink
        self.diff_path = None if diff_path is None else os.fspath(diff_path)
        self._spark = None
        self._subscriptions: dict[str, Any] = {}
        self._collected: dict[str, pd.DataFrame] | None = None  # while a batch is applied
        self._batch_diffs: dict[str, pd.DataFrame] = {}
        self._pending: tuple[int, dict[str, pd.DataFrame]] | None = None
        self._delivered = -1
        super().__init__(
            database, state_dir, on_error, dead_letter_path, on_batch, callback_every,
            snapshot_every,
        )  # fmt: skip

    @property
    def database(self) -> Any:
        """The database (the caller's object, holding the committed state)."""
        return self.maintainer

    # ------------------------------------------------------------------ reading
    def result(self) -> dict[str, pd.DataFrame]:
        """Every view's rows as of the last committed batch (safe while streaming)."""
        with self.lock:
            self._committed()
            return {name: view.to_pandas() for name, view in self.maintainer.views.items()}

    def view(self, name: str) -> pd.DataFrame:
        """One view's rows as of the last committed batch (safe while streaming)."""
        with self.lock:
            self._committed()
            return self.maintainer.view(name).to_pandas()

    def diffs(self, view: str) -> pd.DataFrame:
        """The diffs written to ``diff_path`` for ``view``, in batch order, with a
        ``batch_id`` column (every batch once; ``batch_id_`` if the view has a
        ``batch_id``)."""
        if self.diff_path is None:
            raise ValueError("no diff_path was given")
        folder = os.path.join(self.diff_path, _folder(self.maintainer.view(view).name))
        parts = []
        if os.path.isdir(folder):
            found = [
                (int(entry.split("=", 1)[1]), entry)
                for entry in os.listdir(folder)
                if entry.startswith("batch_id=") and entry.split("=", 1)[1].isdigit()
            ]
            for batch_id, entry in sorted(found):
                path = os.path.join(folder, entry, _DIFF_FILE)
                if os.path.exists(path):
                    frame = pq.read_table(path, partitioning=None).to_pandas()
                    parts.append(frame.assign(**{_batch_column(frame.columns): batch_id}))
        if not parts:
            columns = list(self.maintainer.view(view).columns)
            return pd.DataFrame(columns=[*columns, "multiplicity", _batch_column(columns)])
        return pd.concat(parts, ignore_index=True)

    # ------------------------------------------------------------------ Spark
    def start(
        self,
        spark,
        feeds: ChangeFeed | Sequence[ChangeFeed],
        checkpoint_location: str | os.PathLike[str],
        trigger: Mapping[str, Any] | None = None,
        query_name: str | None = None,
    ):
        """:meth:`StreamingMaintainer.start`, after redelivering the diffs of a committed
        batch whose delivery did not complete."""
        self._spark = spark
        with self.lock:
            if self._dirty:
                self._reload()
            self._redeliver()
        return super().start(spark, feeds, checkpoint_location, trigger, query_name)

    # ------------------------------------------------------------------ hooks
    def _relations(self) -> Mapping[str, Sequence[str]]:
        return {name: list(s.columns) for name, s in self.maintainer.tables.items()}

    def _nullable(self) -> Mapping[str, Sequence[str]]:
        """A table's columns declared ``NULL`` take NULLs (an empty CSV field, JSON null)."""
        return {name: s.nullable for name, s in self.maintainer.tables.items() if s.nullable}

    def _reload(self) -> None:
        super()._reload()
        self._pending = self.meta.get(_PENDING)
        self._delivered = self._read_delivered()

    def _process_batch(self, table, batch_id: int) -> BatchReport | None:
        if self._dirty:
            self._reload()
        self._redeliver()
        return super()._process_batch(table, batch_id)

    def _apply(
        self, batches: list[UpdateBatch], batch_id: int, parse_bad: Sequence[BadRow] = ()
    ) -> tuple[list[UpdateBatch], list[BadRow]]:
        """One atomic ``db.apply`` (the base class isolates rows the database rejects),
        collecting every view's diff."""
        batches = [self._typed(b) for b in batches]
        self._subscribe_views()
        self._collected = {}
        try:
            return super()._apply(batches, batch_id, parse_bad)
        except BaseException:
            self._collected = None
            raise

    def _before_commit(self, batch_id: int, batches: Sequence[UpdateBatch]) -> None:
        collected, self._collected = self._collected or {}, None
        diffs = {name: collected[name] for name in self.maintainer.views if name in collected}
        if self.diff_path is not None:
            for name, diff in diffs.items():
                self._write_diff(name, batch_id, diff)
        if self._delivers:
            self.meta[_PENDING] = self._pending = (batch_id, diffs)
        else:
            self.meta.pop(_PENDING, None)
        self._batch_diffs = diffs

    def _after_commit(self, report: BatchReport) -> None:
        report.diffs = self._batch_diffs
        if self._delivers:
            self._deliver(report.batch_id, report.diffs)

    # ------------------------------------------------------------------ internals
    @property
    def _delivers(self) -> bool:
        return self.on_diff is not None or self.diff_sink is not None

    def _typed(self, batch: UpdateBatch) -> UpdateBatch:
        """The batch's rows typed as its table's (so that a rejected row is found by value);
        rows that do not conform stay as they are: the database names the bad value."""
        schema = self.maintainer.tables.get(batch.relation)
        if schema is None:
            return batch
        try:
            rows = schema.conform(batch.rows)
        except BatchError:
            return batch
        return UpdateBatch(batch.relation, rows, batch.signs())

    def _subscribe_views(self) -> None:
        for name, view in self.maintainer.views.items():
            held = self._subscriptions.get(name)
            if held is None or held.view is not view:
                self._subscriptions[name] = view.subscribe(functools.partial(self._collect, name))

    def _collect(self, name: str, diff: pd.DataFrame) -> None:
        if self._collected is not None:
            self._collected[name] = diff

    def _write_diff(self, view: str, batch_id: int, diff: pd.DataFrame) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pandas(diff, preserve_index=False), sink)
        path = os.path.join(self.diff_path, _folder(view), f"batch_id={batch_id}", _DIFF_FILE)
        atomic_write(path, sink.getvalue().to_pybytes())

    def _deliver(self, batch_id: int, diffs: Mapping[str, pd.DataFrame]) -> None:
        """Hand every diff to the callbacks, then record that ``batch_id`` was delivered."""
        if not diffs:
            return  # nothing to (re)deliver: no record needed
        for name, diff in diffs.items():
            if self.on_diff is not None:
                self.on_diff(batch_id, name, diff)
            if self.diff_sink is not None:
                if self._spark is None:
                    raise RuntimeError(
                        "diff_sink needs the Spark session: run the stream with start()"
                    )
                table = pa.Table.from_pandas(diff, preserve_index=False)
                self.diff_sink(batch_id, name, self._spark.createDataFrame(table))
        path = os.path.join(self.checkpoint.directory, _DELIVERED)
        atomic_write(path, json.dumps({"batch_id": int(batch_id)}).encode())
        self._delivered = int(batch_id)

    def _redeliver(self) -> None:
        if self._pending is not None and self._delivers:
            batch_id, diffs = self._pending
            if batch_id > self._delivered:
                self._deliver(batch_id, diffs)

    def _read_delivered(self) -> int:
        path = os.path.join(self.checkpoint.directory, _DELIVERED)
        try:
            with open(path) as handle:
                return int(json.load(handle)["batch_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1


def _batch_column(columns) -> str:
    """``batch_id``, or with underscores appended when the view has such a column."""
    name = "batch_id"
    while name in columns:
        name += "_"
    return name


def _folder(view: str) -> str:
    """A view's folder name: percent-quoted, never hidden from readers (``.``, ``_``)."""
    name = quote(view, safe="")
    if name[:1] in (".", "_"):
        name = f"%{ord(name[0]):02X}" + name[1:]
    assert unquote(name) == view
    return name
