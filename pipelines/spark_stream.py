"""Spark Structured Streaming change feeds into a :class:`ringml.Maintainer`, exactly once.

A *change feed* is a stream of rows of one relation (``ChangeFeed(relation="House", ...)``)
or of several relations tagged by a ``relation`` column (``ChangeFeed(relation=None, ...)``),
each row carrying either an ``op`` (``insert``/``delete``; an update is a delete of the old
row and an insert of the new one: ``update_preimage``/``update_postimage`` or
``before``/``after``; Debezium's ``c``/``r``/``d``) or a signed integer multiplicity
(``mult_column="mult"``).  Files are read with an explicit schema (CSV with a header, or
JSON lines), and so are Kafka topics of JSON values and Delta change data feeds (see
:class:`ChangeFeed`); Spark's file source orders new files by modification time, so writers should
publish complete files (write, then rename) with increasing mtimes — :func:`write_change_file`
does both.

:class:`StreamingMaintainer` starts one streaming query over the union of its feeds and
applies every micro-batch with ``foreachBatch``:

1. a batch id at or below the last applied one is a replay (Spark re-runs the last batch
   after a failure between our commit and its own) and is skipped; an empty batch changes
   nothing and writes nothing;
2. the micro-batch becomes an Arrow table (``DataFrame.toArrow``), then per-relation pandas
   frames with signed multiplicities; malformed rows — unparseable (wrong number of
   fields, a value of the wrong type, caught by Spark's ``_corrupt_record``), unknown
   relation, unknown op, missing values, fields of another relation — and rows the engine
   rejects (NaN features, deletes of absent tuples, ...) are found;
3. with ``on_error="reject"`` a bad row raises :class:`FeedError` (batch id, relation,
   reason, the row) and nothing changes, so the query stops and a restart retries the
   batch; with ``on_error="dead_letter"`` bad rows go to parquet files under
   ``dead_letter_path`` (one file per batch, rewritten identically on a replay) and the
   rest is applied;
4. the maintainer applies the whole micro-batch atomically (one ``apply`` over all
   relations), then :class:`StateCheckpoint` stores the state together with the batch id
   (one atomic file replace), and only then does the handler return and Spark commit the
   batch.  The optional ``on_batch`` callback runs after the commit (every
   ``callback_every`` applied batches); an exception there stops the query but loses
   nothing (the batch is already committed here and skipped when Spark replays it).

**Distributed target.**  ``maintainer`` may be a
:class:`~ringml.pipelines.spark_distributed.DistributedMaintainer`: the same parsing and
dead-letter logic runs on the driver, and each micro-batch becomes one
``DistributedMaintainer.apply(batches, batch_id=...)``, which applies it atomically on all
shards and replaces the manifest (shard versions, last batch id, the Spark query id) in one
step — that is the commit; there is no separate state file.  The state then lives in the
distributed maintainer's ``state_dir`` (pass that folder, or None, as ``state_dir``); a
restart builds a new ``DistributedMaintainer`` on it, which resumes from the manifest.
Dead letters are written before the committing apply (a replay rewrites the same file);
``snapshot_every`` does not apply (every batch writes new shard versions).

**SQL views.**  A :class:`ringml.sql.Database` target (its tables are the relations, every
view's diff of a batch goes out exactly once) is
:class:`~ringml.pipelines.spark_views.StreamingViews`, a subclass sharing all of the above.

Cost of exactly-once: a commit pickles the whole maintainer (every materialized view) and
replaces one file: linear in the maintained state, e.g. about 0.1 s and 125 MB for the
Housing star with 50,000 postcodes (1.05 M tuples).  ``snapshot_every=N`` writes a log
record of the batch instead (linear in the batch) and a snapshot every N-th batch; a
restart restores the snapshot and re-applies the logged batches.

The state directory also records the Spark query id (from the checkpoint's ``metadata``
file) and refuses to run against another checkpoint; a fresh state (no batch applied, no
query recorded) refuses a checkpoint that already committed batches, whose rows it would
never see.  The checkpoint location is a path or a ``file:`` URI, read directly, or
another Hadoop URI (``s3a://``, ``hdfs://``), read through the session's Hadoop file
system; where it cannot be read (no such file system in the session, Spark Connect) these
checks are skipped with a ``RuntimeWarning``.  A failed commit (e.g. of the dead letters)
takes the target back to the last committed batch.  ``foreachBatch`` runs on a Spark
thread: read results with :meth:`StreamingMaintainer.result` (or under its ``lock``), or
after the query stops.  Paths are local/POSIX: with a local maintainer the state lives
where the driver runs (the driver holds the maintainer); with a distributed one (see above)
the views live in the shards and the driver holds only their roots and the manifest.

Example::

    spark = local_session()                                  # ringml.pipelines.spark_session
    feed = ChangeFeed("feeds/housing", spark_types_of(dataset.relations), relation=None)
    sm = StreamingMaintainer(ringml.Maintainer(query), "state/housing",
                             on_error="dead_letter", dead_letter_path="dead/housing",
                             on_batch=lambda report: print(report.batch_id, report.applied))
    sm.start(spark, feed, "checkpoints/housing", trigger={"availableNow": True}).awaitTermination()
    payload = sm.result()
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ringml import BatchError, Maintainer, UpdateBatch
from ringml.errors import InputTypeError

from .spark_checkpoint import CheckpointError, LoadedState, StateCheckpoint, atomic_write
from .spark_distributed import DistributedMaintainer

__all__ = [
    "FORMATS",
    "OPS",
    "CSV_OPTIONS",
    "BadRow",
    "BatchReport",
    "ChangeFeed",
    "FeedError",
    "StreamingMaintainer",
    "change_feed_schema",
    "feed_layout",
    "naive_timestamps",
    "parse_kafka_values",
    "read_change_feed",
    "spark_types_of",
    "write_change_file",
    "write_stream_files",
]

#: Op codes (case-insensitive) and the multiplicity they stand for.
OPS: dict[str, int] = {
    "insert": 1, "i": 1, "+": 1, "c": 1, "create": 1, "r": 1, "read": 1,
    "update_postimage": 1, "after": 1, "u+": 1,
    "delete": -1, "d": -1, "-": -1,
    "update_preimage": -1, "before": -1, "u-": -1,
}  # fmt: skip

#: Feed formats: files (csv, json lines), Kafka topics of JSON values, Delta change feeds.
FORMATS = ("csv", "json", "kafka", "delta")
#: What a Spark session needs for the non-file formats.
_SOURCE_HINTS = {
    "kafka": "start Spark with the Kafka source, e.g. spark.jars.packages="
    "org.apache.spark:spark-sql-kafka-0-10_2.13:<your Spark version>",
    "delta": "pip install delta-spark and build the session with "
    "delta.configure_spark_with_delta_pip",
}
CORRUPT = "_corrupt_record"
#: Spark's ``nullValue`` for CSV feeds.  Spark compares every field, unquoted, with it; an
#: unquoted empty field reads as ``nullValue`` itself and a quoted one (``""``) as
#: ``emptyValue``, so a ``nullValue`` that no field holds tells NULL (nothing between the
#: commas) from the empty string (``""``).  :func:`write_change_file` refuses to write it.
NULL_TOKEN = "\u0000"
#: How CSV feeds are read (RFC 4180, as :func:`write_change_file` writes them; a feed's
#: ``options`` may override them): a header, checked against the schema by position (a file
#: whose header names other columns, or the same ones in another order, stops the query
#: with a :class:`FeedError` naming the file, never a silent shift of the columns); quotes
#: inside quoted fields doubled; quoted fields may span lines (``multiLine``: Spark then
#: reads each file with one task instead of splitting it every 128 MB, which costs nothing
#: for change files of a few hundred MB or less: publish larger changes as several files);
#: an unquoted empty field is NULL, ``""`` the empty string.
CSV_OPTIONS: dict[str, str] = {
    "header": "true",
    "enforceSchema": "false",
    "escape": '"',
    "multiLine": "true",
    "nullValue": NULL_TOKEN,
    "emptyValue": "",
}
_FEED = "__ringml_feed"
_REL = "__ringml_relation"
_OP = "__ringml_op"
_MULT = "__ringml_mult"
_BAD = "__ringml_corrupt"


class FeedError(BatchError):
    """Malformed change-feed rows of one micro-batch; the batch was not applied."""

    def __init__(self, batch_id: int, bad_rows: Sequence[BadRow]) -> None:
        first = bad_rows[0]
        more = f" (and {len(bad_rows) - 1} more bad rows)" if len(bad_rows) > 1 else ""
        message = (
            f"batch {batch_id}: relation {first.relation!r}: {first.reason}; row {first.row}"
            f"{more}; the batch was not applied"
        )
        super().__init__(message, first.relation, first.column, first.row)
        self.batch_id = batch_id
        self.bad_rows = list(bad_rows)


@dataclass
class BadRow:
    """A change-feed row that was not applied: where it came from and why."""

    batch_id: int
    relation: str | None
    reason: str
    row: dict[str, Any] | str  # the parsed fields, or the raw record when unparseable
    column: str | None = None

    def as_record(self) -> dict[str, Any]:
        row = self.row if isinstance(self.row, str) else json.dumps(self.row, default=_json)
        return {
            "batch_id": int(self.batch_id),
            "relation": self.relation,
            "column": self.column,
            "reason": self.reason,
            "row": row,
        }


@dataclass
class BatchReport:
    """What one applied micro-batch did (handed to the ``on_batch`` callback)."""

    batch_id: int
    rows: int  # rows in the micro-batch
    applied: int  # rows applied
    inserts: int
    deletes: int
    bad_rows: list[BadRow]
    seconds: float  # conversion + apply + checkpoint
    maintainer: Maintainer | DistributedMaintainer = field(repr=False)  # or a sql.Database
    #: per SQL view changed by the batch, its diff (a ``StreamingViews`` target only)
    diffs: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ChangeFeed:
    """A change feed read with an explicit schema.

    ``schema`` names the data columns and their Spark SQL types, e.g.
    ``"postcode bigint, price double"`` or a mapping ``{"postcode": "bigint", ...}`` (see
    :func:`spark_types_of`); the op / multiplicity column (and, for a tagged feed, the
    relation column) are added when missing.  ``relation=None`` makes a tagged feed whose
    ``relation_column`` says which relation a row belongs to; its schema is the union of the
    relations' columns, and fields of other relations must be empty.

    ``format``: ``"csv"`` (with a header) or ``"json"`` (JSON lines) files under ``path``;
    ``"kafka"``: ``path`` names the topic(s) to subscribe to, every record's value is one
    change as a JSON object (malformed values become corrupt records), and ``options``
    carry ``kafka.bootstrap.servers`` and any other source option (needs Spark's
    ``spark-sql-kafka-0-10`` package); ``"delta"``: ``path`` is a Delta table read as its
    change data feed (``readChangeFeed``; use ``op_column="_change_type"``: its insert,
    delete and update pre/post images are ops; needs ``delta-spark``).
    """

    path: str
    schema: str | Mapping[str, str]
    relation: str | None = None
    format: str = "csv"
    op_column: str | None = "op"
    mult_column: str | None = None
    relation_column: str = "relation"
    max_files_per_trigger: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
        if (self.op_column is None) == (self.mult_column is None):
            raise ValueError("give exactly one of op_column and mult_column")

    def data_columns(self) -> dict[str, str]:
        """The data columns (name -> Spark SQL type), without op/mult/relation."""
        columns = _parse_schema(self.schema)
        for special in (self.op_column, self.mult_column, CORRUPT):
            columns.pop(special, None)
        if self.relation is None:
            columns.pop(self.relation_column, None)
        return columns

    def ddl(self) -> str:
        """The full read schema as a DDL string (with ``_corrupt_record``).

        The schema's columns keep the order they were given in: a CSV file's columns are
        read by position, so that order is the files' column order (every file's header is
        checked against it, see :func:`read_change_feed`).  The relation column (a tagged
        feed) and the op / multiplicity column come first when the schema does not name
        them (the layout :func:`write_stream_files` writes)."""
        given = _parse_schema(self.schema)
        given.pop(CORRUPT, None)
        fixed: dict[str, str] = {}
        if self.relation is None:
            fixed[self.relation_column] = "string"
        if self.op_column is not None:
            fixed[self.op_column] = "string"
        else:
            fixed[self.mult_column] = "bigint"
        columns = {name: kind for name, kind in fixed.items() if name not in given}
        for name, kind in given.items():
            columns[name] = fixed.get(name, kind)
        columns[CORRUPT] = "string"
        return ", ".join(f"`{name}` {kind}" for name, kind in columns.items())


def _parse_schema(schema: str | Mapping[str, str]) -> dict[str, str]:
    if isinstance(schema, Mapping):
        return {str(k): str(v) for k, v in schema.items()}
    columns: dict[str, str] = {}
    depth, start, parts = 0, 0, []
    for i, ch in enumerate(schema):  # split on commas outside <...> and (...)
        depth += ch in "<(" and 1 or (-1 if ch in ">)" else 0)
        if ch == "," and depth == 0:
            parts.append(schema[start:i])
            start = i + 1
    parts.append(schema[start:])
    for part in parts:
        part = part.strip()
        if not part:
            continue
        if part.startswith("`"):
            end = part.index("`", 1)
            name, kind = part[1:end], part[end + 1 :].strip()
        else:
            name, _, kind = part.partition(" ")
        columns[name.strip().rstrip(":")] = kind.strip() or "string"
    return columns


def spark_types_of(frames: Mapping[str, pd.DataFrame] | pd.DataFrame) -> dict[str, str]:
    """Spark SQL types of the columns of pandas frames (union over relations): int ->
    ``bigint``, float -> ``double``, bool -> ``boolean``, anything else ``string``."""
    if isinstance(frames, pd.DataFrame):
        frames = {"": frames}
    out: dict[str, str] = {}
    for frame in frames.values():
        for column, dtype in frame.dtypes.items():
            kind = {"i": "bigint", "u": "bigint", "f": "double", "b": "boolean"}.get(
                np.dtype(dtype).kind if not isinstance(dtype, pd.CategoricalDtype) else "O",
                "string",
            )
            previous = out.get(str(column))
            if previous is not None and previous != kind:
                kind = "double" if {previous, kind} == {"bigint", "double"} else "string"
            out[str(column)] = kind
    return out


def change_feed_schema(
    columns: Mapping[str, str],
    op_column: str | None = "op",
    mult_column: str | None = None,
    relation_column: str | None = None,
) -> str:
    """A DDL schema for a change feed: relation (tagged feeds), op or mult, then ``columns``."""
    parts = []
    if relation_column:
        parts.append(f"`{relation_column}` string")
    parts.append(f"`{op_column}` string" if op_column else f"`{mult_column}` bigint")
    parts += [f"`{name}` {kind}" for name, kind in columns.items()]
    return ", ".join(parts)


def read_change_feed(spark, feed: ChangeFeed, index: int = 0):
    """The streaming DataFrame of a feed, in the pipeline's internal layout: the feed's data
    columns renamed ``__f<index>__<column>``, plus feed index, relation, op, mult and the
    corrupt record."""

    if feed.format == "kafka":
        reader = spark.readStream.format("kafka").option("subscribe", feed.path)
        reader = _with_options(reader, feed.options)
        return feed_layout(parse_kafka_values(_load(reader, feed, None), feed), feed, index)
    if feed.format == "delta":
        reader = spark.readStream.format("delta").option("readChangeFeed", "true")
        reader = _with_options(reader, feed.options)
        return feed_layout(_load(reader, feed, feed.path), feed, index)
    reader = spark.readStream.schema(feed.ddl()).option("columnNameOfCorruptRecord", CORRUPT)
    reader = reader.option("mode", "PERMISSIVE")
    if feed.format == "csv":
        reader = _with_options(reader, CSV_OPTIONS)
    if feed.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(int(feed.max_files_per_trigger)))
    reader = _with_options(reader.format(feed.format), feed.options)
    return feed_layout(reader.load(feed.path), feed, index)


def _with_options(reader, options: Mapping[str, str]):
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def _load(reader, feed: ChangeFeed, path: str | None):
    """``reader.load``, with the package to add when Spark lacks the feed's source."""
    try:
        return reader.load() if path is None else reader.load(path)
    except Exception as error:
        text = str(error)
        if "DATA_SOURCE_NOT_FOUND" in text or "Failed to find data source" in text:
            raise ValueError(
                f"feed {feed.path!r}: this Spark session has no {feed.format!r} source; "
                f"{_SOURCE_HINTS[feed.format]}"
            ) from error
        raise


def parse_kafka_values(df, feed: ChangeFeed):
    """Kafka records (a binary or string ``value`` column, one JSON object per change) as
    feed rows: the feed's columns, and the raw value in the corrupt-record column when it
    does not parse or a field has the wrong type."""
    from pyspark.sql import functions as F

    parsed = F.from_json(
        F.col("value").cast("string"),
        feed.ddl(),
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )
    return df.select(parsed.alias("__ringml_record")).select("__ringml_record.*")


def feed_layout(df, feed: ChangeFeed, index: int = 0):
    """A DataFrame of a feed's rows (its data columns, op or mult, relation for a tagged
    feed, ``_corrupt_record`` when the source has one) in the pipeline's internal layout
    (see :func:`read_change_feed`); works on static DataFrames too."""
    from pyspark.sql import functions as F

    relation = (
        F.lit(feed.relation) if feed.relation is not None else F.col(f"`{feed.relation_column}`")
    )
    op = F.col(f"`{feed.op_column}`") if feed.op_column else F.lit(None).cast("string")
    mult = F.col(f"`{feed.mult_column}`") if feed.mult_column else F.lit(None).cast("bigint")
    data = [F.col(f"`{c}`").alias(_prefixed(index, c)) for c in feed.data_columns()]
    return df.select(
        F.lit(index).cast("int").alias(_FEED),
        relation.cast("string").alias(_REL),
        op.cast("string").alias(_OP),
        mult.cast("bigint").alias(_MULT),
        (F.col(CORRUPT) if CORRUPT in df.columns else F.lit(None)).cast("string").alias(_BAD),
        *data,
    )


_HEADER_MISMATCH = re.compile(
    r"((?:CSV header does not conform to the schema|Number of column in CSV header).*?)"
    r"CSV file: (\S+)",
    re.DOTALL,
)
_EXPECTED_COLUMN = re.compile(r"Expected: (.*?) but found:")


def _under(path: str, folder: str) -> bool:
    """Whether the file ``path`` (a URI as Spark names it) lies under the feed ``folder``."""
    local = _local_path(path) or path
    root = _local_path(folder) or folder
    return os.path.abspath(local).startswith(os.path.abspath(root).rstrip(os.sep) + os.sep)


def _prefixed(index: int, column: str) -> str:
    return f"__f{index}__{column}"


class StreamingMaintainer:
    """Feeds Spark change streams into a maintainer exactly once (see the module docs).

    ``maintainer`` is the initial state (e.g. with static relations loaded); when
    ``state_dir`` already holds a checkpoint, that state replaces it: it must have been
    saved for the same query, ring, variable order, strategy, ... (else
    :class:`CheckpointError` names what differs) and moves into ``maintainer``, which keeps
    its identity, subscribers, query and ring object (:meth:`~ringml.Maintainer.adopt_state`),
    so ``query.ring.statistics(sm.result())`` works after a restart.
    ``on_error`` is ``"reject"`` (raise :class:`FeedError`, apply nothing) or
    ``"dead_letter"`` (write bad rows to ``dead_letter_path``, apply the rest).
    ``on_batch(report)`` runs after every ``callback_every`` applied batches, once the
    batch is committed and :attr:`lock` released (so it may wait on threads that read
    :meth:`result`).  Subscribers of ``maintainer`` run inside the apply, before the commit.
    ``snapshot_every`` trades the per-batch snapshot for a per-batch log record (see
    :class:`StateCheckpoint`).  ``maintainer`` may be a
    :class:`~ringml.pipelines.spark_distributed.DistributedMaintainer` (see the module docs:
    its manifest is the checkpoint; ``state_dir`` is None or its ``state_dir``).  A
    :class:`ringml.sql.Database` is fed by :class:`~ringml.pipelines.spark_views.StreamingViews`.
    """

    _database_target = False  # StreamingViews feeds a ringml.sql.Database
    _checkpoint_class = StateCheckpoint  # how the state is saved with its batch id

    def __init__(
        self,
        maintainer: Maintainer | DistributedMaintainer,
        state_dir: str | os.PathLike[str] | None,
        on_error: str = "reject",
        dead_letter_path: str | os.PathLike[str] | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        callback_every: int = 1,
        snapshot_every: int = 1,
    ) -> None:
        if on_error not in ("reject", "dead_letter"):
            raise ValueError("on_error must be 'reject' or 'dead_letter'")
        if on_error == "dead_letter" and dead_letter_path is None:
            raise ValueError("on_error='dead_letter' needs dead_letter_path")
        if callback_every < 1:
            raise ValueError("callback_every must be >= 1")
        if dead_letter_path is not None and os.path.exists(dead_letter_path):
            if not os.path.isdir(dead_letter_path):
                raise ValueError(
                    f"dead_letter_path {os.fspath(dead_letter_path)!r} is a file; it must be a "
                    "folder (one parquet file per batch goes there), new or existing"
                )
        if _is_database(maintainer) != self._database_target:
            raise InputTypeError(
                "a ringml.sql.Database is fed by ringml.pipelines.spark_views.StreamingViews"
                if self._database_target is False
                else f"StreamingViews feeds a ringml.sql.Database, got {type(maintainer).__name__}"
            )
        self.on_error = on_error
        self.dead_letter_path = None if dead_letter_path is None else os.fspath(dead_letter_path)
        self.on_batch = on_batch
        self.callback_every = int(callback_every)
        self.distributed = isinstance(maintainer, DistributedMaintainer)
        if self.distributed:
            self.checkpoint = _DistributedCheckpoint(maintainer, state_dir)
        elif state_dir is None:
            raise ValueError("state_dir is required (the maintainer's checkpoint folder)")
        else:
            self.checkpoint = self._checkpoint_class(state_dir, snapshot_every)
        self.maintainer = maintainer
        self.last_batch_id = -1
        self.meta: dict[str, Any] = {}
        self.batches_applied = 0  # applied by this object (not counting replays)
        self.replays_skipped: list[int] = []
        self.errors: list[BaseException] = []
        self.reports: list[BatchReport] = []
        self._feeds: list[ChangeFeed] = []
        self._spark_checkpoint: str | None = None
        self._spark_folder: _SparkCheckpointFolder | None = None
        #: the Spark session time zone: a Spark ``timestamp`` (an instant, which Arrow
        #: holds in UTC) reaches the target as the naive wall-clock time of this zone, the
        #: time a CSV/JSON text without an offset was read as (set from the session of each
        #: micro-batch; None: the zone Arrow gives, UTC)
        self.time_zone: str | None = None
        self._dirty = False
        #: held while a batch is applied and committed; take it to read a consistent state
        #: while the query runs (``result()`` does)
        self.lock = threading.RLock()
        self._reload()

    # ------------------------------------------------------------------ state
    def _reload(self) -> None:
        """Bring the in-memory maintainer back to the committed state on disk (the initial
        state is committed as batch -1 when the directory is new)."""
        if not self.checkpoint.exists():
            self.checkpoint.save_snapshot(self.maintainer, -1, {})
            return
        loaded = self.checkpoint.load(like=self.maintainer)  # refuses another query's state
        if loaded.maintainer is not None:
            self.maintainer = self._adopt(loaded.maintainer)
        self.last_batch_id = loaded.batch_id
        self.meta = loaded.meta
        self._dirty = False

    def _adopt(self, restored):
        """The caller's target, holding a restored state (its identity and subscribers stay:
        a restart or a discarded batch must not cut them off)."""
        if restored is not self.maintainer:
            self.maintainer.adopt_state(restored)
        return self.maintainer

    def _relations(self) -> Mapping[str, Sequence[str]]:
        """The target's relations (a feed row's ``relation``) and their columns."""
        return self.maintainer.query.relations

    def _nullable(self) -> Mapping[str, Sequence[str]]:
        """Per relation, the columns that may hold NULL (a NULL elsewhere is a bad row)."""
        return {}

    def _before_commit(self, batch_id: int, batches: Sequence[UpdateBatch]) -> None:
        """Runs after a batch is applied in memory and before its commit (an exception
        leaves the batch uncommitted: the state is reloaded)."""

    def _after_commit(self, report: BatchReport) -> None:
        """Runs after a batch is committed, before ``on_batch``."""

    def _spark_query_id(self) -> str | None:
        if self._spark_folder is None:
            return None
        return self._spark_folder.query_id()

    def _check_spark_checkpoint(self) -> None:
        folder = self._spark_folder
        assert folder is not None
        if not folder.readable:
            warnings.warn(
                f"the Spark checkpoint {self._spark_checkpoint} cannot be read from here "
                f"({folder.unreadable}): the check that it belongs to the state in "
                f"{self.checkpoint.directory} is skipped",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        stored = self.meta.get("spark_query_id")
        current = folder.query_id()
        if stored is not None and current is not None and stored != current:
            raise CheckpointError(
                f"state in {self.checkpoint.directory} belongs to Spark query {stored}, but "
                f"the checkpoint {self._spark_checkpoint} is query {current}"
            )
        if self.last_batch_id >= 0 and current is None:
            raise CheckpointError(
                f"state in {self.checkpoint.directory} has applied batches up to "
                f"{self.last_batch_id}, but the Spark checkpoint {self._spark_checkpoint} is "
                "new: its batch ids would restart at 0 and be skipped; use the matching "
                "checkpoint or a fresh state_dir"
            )
        if self.last_batch_id < 0 and stored is None and current is not None:
            committed = folder.committed()
            if committed:
                raise CheckpointError(
                    f"state in {self.checkpoint.directory} is fresh (no batch applied), but "
                    f"the Spark checkpoint {self._spark_checkpoint} has committed batches "
                    f"up to {max(committed)} (query {current}), which Spark would not read "
                    "again: this state would miss their rows; use a fresh checkpoint "
                    "location with a fresh state_dir, or the state_dir that checkpoint ran with"
                )

    # ------------------------------------------------------------------ Spark
    def start(
        self,
        spark,
        feeds: ChangeFeed | Sequence[ChangeFeed],
        checkpoint_location: str | os.PathLike[str],
        trigger: Mapping[str, Any] | None = None,
        query_name: str | None = None,
    ):
        """Start the streaming query (union of ``feeds``) and return it.

        ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g. ``{"availableNow":
        True}`` or ``{"processingTime": "5 seconds"}``; default: Spark's).
        """
        feeds = [feeds] if isinstance(feeds, ChangeFeed) else list(feeds)
        if not feeds:
            raise ValueError("no feeds")
        self._check_feeds(feeds)
        if self._dirty:
            self._reload()
        self._feeds = feeds
        self._spark_checkpoint = os.fspath(checkpoint_location)
        self._spark_folder = _SparkCheckpointFolder(self._spark_checkpoint, spark)
        with contextlib.suppress(Exception):
            self.time_zone = spark.conf.get("spark.sql.session.timeZone")
        self._check_spark_checkpoint()
        frames = [
            self._feed_frame(read_change_feed(spark, feed, i), feed, i)
            for i, feed in enumerate(feeds)
        ]
        stream = frames[0]
        for frame in frames[1:]:
            stream = stream.unionByName(frame, allowMissingColumns=True)
        writer = stream.writeStream.foreachBatch(self._foreach_batch).option(
            "checkpointLocation", self._spark_checkpoint
        )
        if trigger:
            writer = writer.trigger(**dict(trigger))
        if query_name:
            writer = writer.queryName(query_name)
        return writer.start()

    def _feed_frame(self, frame, feed: ChangeFeed, index: int):
        """The streaming DataFrame of feed ``index`` before the union (a subclass may add
        e.g. an event-time watermark)."""
        return frame

    def _check_feeds(self, feeds: Sequence[ChangeFeed]) -> None:
        relations = self._relations()
        for feed in feeds:
            columns = feed.data_columns()
            targets = [feed.relation] if feed.relation is not None else list(relations)
            for relation in targets:
                if relation not in relations:
                    raise ValueError(f"feed {feed.path!r}: unknown relation {relation!r}")
                missing = [c for c in relations[relation] if c not in columns]
                if missing:
                    raise ValueError(
                        f"feed {feed.path!r}: relation {relation!r} needs columns {missing}"
                    )

    def _foreach_batch(self, df, batch_id: int) -> None:
        if int(batch_id) <= self.last_batch_id and not self._dirty:
            self.replays_skipped.append(int(batch_id))
            return
        with contextlib.suppress(Exception):  # how Spark shows its timestamps (instants)
            self.time_zone = df.sparkSession.conf.get("spark.sql.session.timeZone")
        try:
            table = df.toArrow() if hasattr(df, "toArrow") else pa.Table.from_pandas(df.toPandas())
        except Exception as error:
            failure = self._read_failure(error, int(batch_id))
            if failure is None:
                raise
            self.errors.append(failure)
            raise failure from None
        self.process_batch(table, int(batch_id))

    def _read_failure(self, error: BaseException, batch_id: int) -> FeedError | None:
        """A :class:`FeedError` for a CSV file whose header does not match its feed's schema
        (Spark's reader refuses the file; its rows cannot be told apart, so the batch stops
        in either ``on_error`` mode), else None."""
        text = str(error)
        match = _HEADER_MISMATCH.search(text)
        if match is None:
            return None
        detail = " ".join(line.strip() for line in match.group(1).strip().splitlines())
        path = match.group(2)
        feed = next((f for f in self._feeds if f.format == "csv" and _under(path, f.path)), None)
        expected = _EXPECTED_COLUMN.search(detail)
        reason = (
            f"CSV file {path}: its header does not match the feed's schema, whose columns "
            f"are read by position ({detail}); write the file's columns in the schema's "
            "order (or give the schema in the file's order), then move the file back"
        )
        bad = BadRow(
            batch_id,
            None if feed is None else feed.relation,
            reason,
            path,
            None if expected is None else expected.group(1),
        )
        return FeedError(batch_id, [bad])

    # ------------------------------------------------------------------ batches
    def result(self):
        """The maintained result as of the last committed batch (safe while streaming)."""
        with self.lock:
            self._committed()
            return self.maintainer.result()

    def _committed(self) -> None:
        """Bring the target back to the last committed batch when a failed commit left it
        ahead (call under ``lock``)."""
        if self._dirty:
            self._reload()

    def _discard_uncommitted(self) -> None:
        """A batch was applied in memory but not committed: go back to the committed state
        now (the caller's objects show it), or at the next read or batch if that fails."""
        self._dirty = True
        with contextlib.suppress(Exception):
            self._reload()

    def process_batch(self, table: pa.Table | pd.DataFrame, batch_id: int) -> BatchReport | None:
        """Apply one micro-batch in the internal layout (see :func:`read_change_feed`).

        Returns None for a replayed or empty batch.  This is what ``foreachBatch`` calls;
        it is public so that replays and failures can be exercised without Spark.
        """
        with self.lock:
            report = self._process_batch(table, batch_id)
        # after the lock: a callback may wait on threads that read the committed state
        if report is not None and self.on_batch is not None:
            if self.batches_applied % self.callback_every == 0:
                self.on_batch(report)
        return report

    def _process_batch(self, table, batch_id: int) -> BatchReport | None:
        if self._dirty:
            self._reload()
        if batch_id <= self.last_batch_id:
            self.replays_skipped.append(batch_id)
            return None
        if isinstance(table, pd.DataFrame):
            table = pa.Table.from_pandas(table, preserve_index=False)
        if table.num_rows == 0:
            self._bind_spark_query()
            return None
        table = naive_timestamps(table, self.time_zone)
        started = time.perf_counter()
        if self.meta.get("spark_query_id") is None:
            query_id = self._spark_query_id()
            if query_id is not None:
                self.meta["spark_query_id"] = query_id
        batches, bad = self._split(table, batch_id)
        if bad and self.on_error == "reject":
            error = FeedError(batch_id, bad)
            self.errors.append(error)
            raise error
        # atomic: raises, or applied (a distributed target also commits here)
        try:
            batches, engine_bad = self._apply(batches, batch_id, bad)
        except FeedError:
            raise  # nothing was applied
        except BaseException as error:  # e.g. a subscriber raised after the apply
            self.errors.append(error)
            self._discard_uncommitted()
            raise
        bad += engine_bad
        try:
            if bad and not self.distributed:  # distributed: written before its commit
                self._write_dead_letters(batch_id, bad)
            self._before_commit(batch_id, batches)
            self.checkpoint.commit(self.maintainer, batch_id, batches, self.meta)
        except BaseException as error:
            self.errors.append(error)
            self._discard_uncommitted()  # applied in memory, not committed
            raise
        self.last_batch_id = batch_id
        self.batches_applied += 1
        signs = np.concatenate([b.signs() for b in batches]) if batches else np.zeros(0)
        report = BatchReport(
            batch_id=batch_id,
            rows=table.num_rows,
            applied=int(signs.size),
            inserts=int((signs > 0).sum()),
            deletes=int((signs < 0).sum()),
            bad_rows=bad,
            seconds=time.perf_counter() - started,
            maintainer=self.maintainer,
        )
        self.reports.append(report)
        self._after_commit(report)
        return report

    def _bind_spark_query(self) -> None:
        """Record the Spark query in a state that has none yet (an empty first micro-batch,
        which Spark commits while the state stays at batch -1), so that a restart tells
        this state from a fresh one (see :meth:`_check_spark_checkpoint`)."""
        if self.distributed or self.last_batch_id >= 0 or self.meta.get("spark_query_id"):
            return
        query_id = self._spark_query_id()
        if query_id is None:
            return
        meta = {**self.meta, "spark_query_id": query_id}
        self.checkpoint.save_snapshot(self.maintainer, self.last_batch_id, meta)
        self.meta = meta

    def _apply(
        self, batches: list[UpdateBatch], batch_id: int, parse_bad: Sequence[BadRow] = ()
    ) -> tuple[list[UpdateBatch], list[BadRow]]:
        """Apply atomically; in dead-letter mode, drop the rows the engine rejects and retry.

        A distributed target commits in ``apply`` (with the batch id and ``meta``), so the
        dead letters known so far are written before every attempt."""
        bad: list[BadRow] = []
        while True:
            try:
                if self.distributed:
                    if parse_bad or bad:
                        self._write_dead_letters(batch_id, [*parse_bad, *bad])
                    if batches:
                        self.maintainer.meta.update(self.meta)
                        self.maintainer.apply(batches, batch_id=batch_id)
                elif batches:
                    self.maintainer.apply(batches)
                return batches, bad
            except BatchError as error:
                culprit = _isolate(batches, error)
                if self.on_error == "reject" or culprit is None:
                    row = (
                        None
                        if culprit is None
                        else _row_dict(batches[culprit[0]], int(culprit[1][0]))
                    )
                    report = BadRow(batch_id, error.relation, str(error), row or {}, error.column)
                    wrapped = FeedError(batch_id, [report])
                    self.errors.append(wrapped)
                    raise wrapped from error
                index, rows = culprit
                batch = batches[index]
                for position in rows:
                    bad.append(
                        BadRow(
                            batch_id,
                            batch.relation,
                            str(error),
                            _row_dict(batch, position),
                            error.column,
                        )
                    )
                keep = np.ones(len(batch.rows), dtype=bool)
                keep[rows] = False
                mult = batch.signs()[keep]
                rest = UpdateBatch(batch.relation, batch.rows[keep].reset_index(drop=True), mult)
                batches = (
                    batches[:index] + ([rest] if len(rest.rows) else []) + batches[index + 1 :]
                )

    def _split(self, table: pa.Table, batch_id: int) -> tuple[list[UpdateBatch], list[BadRow]]:
        """Per-relation update batches of the good rows, and the bad rows."""
        relations = self._relations()
        n = table.num_rows
        feed_ids = table.column(_FEED).to_numpy(zero_copy_only=False).astype(np.int64)
        rel = np.asarray(table.column(_REL).to_pylist(), dtype=object)
        corrupt = table.column(_BAD)
        corrupt_null = pc.is_null(corrupt).to_numpy(zero_copy_only=False)
        ops = pd.Series(table.column(_OP).to_pylist(), dtype=object)
        signs = ops.str.strip().str.lower().map(OPS).to_numpy(dtype=np.float64, na_value=np.nan)
        mult_col = table.column(_MULT)
        mult_null = pc.is_null(mult_col).to_numpy(zero_copy_only=False)
        mult_values = pc.fill_null(mult_col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        reason = np.full(n, None, dtype=object)
        column_of = np.full(n, None, dtype=object)
        mult = np.zeros(n, dtype=np.int64)

        def flag(mask: np.ndarray, text, column=None) -> None:
            fresh = mask & (reason == None)  # noqa: E711 - elementwise
            for i in np.flatnonzero(fresh):
                reason[i] = text(i) if callable(text) else text
                column_of[i] = column

        flag(~corrupt_null, "unparseable record (wrong number of fields or a mistyped value)")
        known = np.array([isinstance(r, str) and r in relations for r in rel], dtype=bool)
        flag(~known, lambda i: f"unknown relation {rel[i]!r}")
        for f in np.unique(feed_ids):
            in_feed = feed_ids == f
            feed = self._feeds[int(f)] if int(f) < len(self._feeds) else None
            use_ops = feed is None or feed.op_column is not None
            if use_ops:
                # without feed metadata (direct calls), a signed mult may stand in for an op
                sign = signs.copy()
                if feed is None:
                    fill = np.isnan(sign) & ~mult_null & (mult_values != 0)
                    sign[fill] = mult_values[fill]
                bad = in_feed & np.isnan(sign)
                flag(
                    bad,
                    lambda i: f"unknown op {ops.iloc[i]!r} (expected one of {sorted(OPS)})",
                    feed.op_column if feed else "op",
                )
                ok = in_feed & ~np.isnan(sign)
                mult[ok] = sign[ok].astype(np.int64)
            else:
                bad = in_feed & (mult_null | (mult_values == 0))
                flag(bad, "the multiplicity must be a non-zero integer", feed.mult_column)
                ok = in_feed & ~bad
                mult[ok] = mult_values[ok]
        # missing values and fields of other relations, per feed and relation
        names = table.column_names
        nullable = self._nullable()
        out: list[UpdateBatch] = []
        for f in np.unique(feed_ids):
            prefix = f"__f{int(f)}__"
            feed_columns = [c[len(prefix) :] for c in names if c.startswith(prefix)]
            for relation, cols in relations.items():
                rows = np.flatnonzero((feed_ids == f) & (rel == relation) & (reason == None))  # noqa: E711
                if rows.size == 0:
                    continue
                sub = table.take(pa.array(rows))
                ok = np.ones(rows.size, dtype=bool)
                for column in feed_columns:
                    nulls = pc.is_null(sub.column(prefix + column)).to_numpy(zero_copy_only=False)
                    wanted = column in cols
                    if wanted and column in nullable.get(relation, ()):
                        continue
                    offending = (nulls if wanted else ~nulls) & ok
                    text = (
                        f"missing value for column {column!r}"
                        if wanted
                        else f"column {column!r} is not in relation {relation!r}"
                    )
                    flag(np.isin(np.arange(n), rows[offending]), text, column)
                    ok &= ~offending
                keep = rows[ok]
                if keep.size == 0:
                    continue
                frame = (
                    table.take(pa.array(keep))
                    .select([prefix + c for c in cols])
                    .rename_columns(list(cols))
                    .to_pandas()
                )
                out.append(UpdateBatch(relation, frame, mult[keep]))
        bad = [
            BadRow(
                batch_id,
                rel[i] if isinstance(rel[i], str) else None,
                reason[i],
                corrupt[i].as_py() if not corrupt_null[i] else _raw_row(table, i),
                column_of[i],
            )
            for i in np.flatnonzero(reason != None)  # noqa: E711
        ]
        return out, bad

    def _write_dead_letters(self, batch_id: int, bad: Sequence[BadRow]) -> None:
        assert self.dead_letter_path is not None
        records = [b.as_record() for b in bad]
        schema = pa.schema(
            [
                ("batch_id", pa.int64()),
                ("relation", pa.string()),
                ("column", pa.string()),
                ("reason", pa.string()),
                ("row", pa.string()),
            ]
        )
        table = pa.Table.from_pylist(records, schema=schema)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        path = os.path.join(self.dead_letter_path, f"dead-{batch_id:012d}.parquet")
        try:
            atomic_write(path, sink.getvalue().to_pybytes())
        except OSError as error:
            raise OSError(
                error.errno,
                f"batch {batch_id}: cannot write its dead letters under dead_letter_path "
                f"{self.dead_letter_path!r} ({error.strerror or error}); the batch was not "
                "committed",
            ) from error

    def dead_letters(self) -> pd.DataFrame:
        """All dead-lettered rows so far (batch_id, relation, column, reason, row)."""
        columns = ["batch_id", "relation", "column", "reason", "row"]
        if self.dead_letter_path is None or not os.path.isdir(self.dead_letter_path):
            return pd.DataFrame(columns=columns)
        files = sorted(
            f
            for f in os.listdir(self.dead_letter_path)
            if f.startswith("dead-") and f.endswith(".parquet")
        )
        if not files:
            return pd.DataFrame(columns=columns)
        return pd.concat(
            [pq.read_table(os.path.join(self.dead_letter_path, f)).to_pandas() for f in files],
            ignore_index=True,
        )


def _is_database(target: object) -> bool:
    """Whether ``target`` is a ``ringml.sql.Database`` (without importing ringml.sql,
    whose sqlglot is an optional extra: no module, no database)."""
    views = sys.modules.get("ringml.sql.views")
    return views is not None and isinstance(target, views.Database)


class _DistributedCheckpoint:
    """:class:`StateCheckpoint`'s interface over a :class:`DistributedMaintainer`, whose
    manifest already stores the last applied batch id and ``meta`` together with the shards'
    state (``apply(batches, batch_id=...)`` is the commit): loading reads them back,
    committing has nothing left to do."""

    def __init__(self, maintainer: DistributedMaintainer, state_dir) -> None:
        own = os.path.abspath(maintainer.state_dir)
        if state_dir is not None and os.path.abspath(os.fspath(state_dir)) != own:
            raise ValueError(
                f"a DistributedMaintainer keeps its state in its own state_dir {own!r}; "
                f"pass that folder (or None) as state_dir, not {os.fspath(state_dir)!r}"
            )
        self.maintainer = maintainer
        self.directory = own

    def exists(self) -> bool:
        return True  # the distributed maintainer resumed from its manifest, or starts empty

    def load(self, like=None) -> LoadedState:
        """The distributed maintainer's committed state (it checked its manifest itself)."""
        dm = self.maintainer
        return LoadedState(dm, dm.last_batch_id, dict(dm.meta))

    def commit(self, maintainer, batch_id, batches=(), meta=None, force_snapshot=False) -> None:
        """Nothing to do: the distributed apply committed the batch with its id."""

    def save_snapshot(self, maintainer, batch_id, meta=None) -> None:
        """Nothing to do (see :meth:`commit`)."""


def _local_path(location: str) -> str | None:
    """The local path of a location: a plain path, or a ``file:`` URI as Hadoop reads it
    (``file:///tmp/ck``, ``file:/tmp/ck``); None for another scheme (``s3a://``, ...)."""
    parsed = urlparse(location)
    if not parsed.scheme:
        return location
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return parsed.path  # Hadoop does not percent-decode a path given as text
    return None


class _SparkCheckpointFolder:
    """What a stream needs to know of a Spark checkpoint location: its query id (the
    ``metadata`` file; None while the location is new) and the batch ids Spark committed
    (``commits/``).  A plain path or a ``file:`` URI is read directly; another scheme
    through Spark's Hadoop file system (the session's JVM); when neither can read it,
    ``readable`` is False and ``unreadable`` says why (the checks are then skipped, never
    taken as a new checkpoint)."""

    def __init__(self, location: str, spark: Any = None) -> None:
        self.location = location
        self.local = _local_path(location)
        self._fs = None
        self.unreadable: str | None = None
        if self.local is None:
            try:
                jvm = spark._jvm
                path = jvm.org.apache.hadoop.fs.Path(location)
                self._fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
                self._jvm = jvm
            except Exception as error:  # noqa: BLE001 - Spark Connect, no file system, ...
                java = getattr(error, "java_exception", None)  # Hadoop's own reason
                text = str(java) if java is not None else f"{type(error).__name__}: {error}"
                self.unreadable = text.splitlines()[0][:300]
        self._query_id: str | None = None

    @property
    def readable(self) -> bool:
        return self.unreadable is None

    def query_id(self) -> str | None:
        if self._query_id is None and self.readable:
            line = self._first_line("metadata")
            with contextlib.suppress(ValueError, AttributeError):
                self._query_id = json.loads(line).get("id") if line else None
        return self._query_id

    def committed(self) -> list[int]:
        names: list[str] = []
        if self.local is not None:
            folder = os.path.join(self.local, "commits")
            names = os.listdir(folder) if os.path.isdir(folder) else []
        elif self.readable:
            path = self._jvm.org.apache.hadoop.fs.Path(self.location.rstrip("/") + "/commits")
            if self._fs.exists(path):
                names = [status.getPath().getName() for status in self._fs.listStatus(path)]
        return sorted(int(name) for name in names if name.isdigit())

    def _first_line(self, name: str) -> str | None:
        if self.local is not None:
            try:
                with open(os.path.join(self.local, name)) as handle:
                    return handle.readline()
            except OSError:
                return None
        jvm = self._jvm
        path = jvm.org.apache.hadoop.fs.Path(self.location.rstrip("/") + "/" + name)
        if not self._fs.exists(path):
            return None
        reader = jvm.java.io.BufferedReader(
            jvm.java.io.InputStreamReader(self._fs.open(path), "UTF-8")
        )
        try:
            return reader.readLine()
        finally:
            reader.close()


def naive_timestamps(table: pa.Table, time_zone: str | None = None) -> pa.Table:
    """``table`` with its zoned timestamp columns (Spark ``timestamp`` values, instants that
    Arrow holds in UTC) as naive wall-clock times in ``time_zone`` (default: each column's
    own zone), which is what a SQL ``TIMESTAMP`` / a datetime64 column holds; ``date`` and
    ``timestamp_ntz`` columns are naive already."""
    for i, column_field in enumerate(table.schema):
        kind = column_field.type
        if not pa.types.is_timestamp(kind) or kind.tz is None:
            continue
        column = table.column(i)
        try:
            if time_zone and time_zone != kind.tz:
                column = column.cast(pa.timestamp(kind.unit, tz=time_zone))
            column = pc.local_timestamp(column)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise ValueError(
                f"column {column_field.name!r}: cannot show Spark timestamps in the time zone "
                f"{time_zone or kind.tz!r} ({error})"
            ) from error
        table = table.set_column(i, column_field.name, column)
    return table


def _raw_row(table: pa.Table, i: int) -> dict[str, Any]:
    """The non-null fields of row ``i`` under their feed names (relation and op included)."""
    row = table.slice(i, 1).to_pylist()[0]
    out: dict[str, Any] = {}
    if row.get(_REL) is not None:
        out["relation"] = row[_REL]
    if row.get(_OP) is not None:
        out["op"] = row[_OP]
    if row.get(_MULT) is not None:
        out["mult"] = row[_MULT]
    for name, value in row.items():
        if name.startswith("__f") and value is not None:
            out[name.split("__", 2)[2]] = value
    return out


def _row_dict(batch: UpdateBatch, position: int) -> dict[str, Any]:
    row = {k: _json(v) for k, v in batch.rows.iloc[position].to_dict().items()}
    row["mult"] = int(batch.signs()[position])
    return row


def _json(value):
    """A row value as JSON can hold it (dates as ISO text; also ``json.dumps``' default)."""
    if type(value) is datetime.date:
        return value.isoformat()
    if isinstance(value, np.datetime64 | datetime.date):
        return pd.Timestamp(value).isoformat() if not pd.isna(value) else None
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if not isinstance(value, str | int | float | bool | list | dict | type(None)):
        return str(value)
    return value


def _isolate(batches: Sequence[UpdateBatch], error: BatchError) -> tuple[int, np.ndarray] | None:
    """The batch and rows an engine error is about, when they can be told."""
    for index, batch in enumerate(batches):
        if batch.relation != error.relation or len(batch.rows) == 0:
            continue
        frame = batch.rows
        if isinstance(error.value, dict):  # a tuple (e.g. a delete of an absent one)
            mask = np.ones(len(frame), dtype=bool)
            for column, value in error.value.items():
                if column not in frame.columns:
                    mask[:] = False
                    break
                mask &= _equal(frame[column].to_numpy(), value)
            signs = batch.signs()
            hits = np.flatnonzero(mask & (signs < 0)) if (signs < 0).any() else np.flatnonzero(mask)
            if hits.size:
                return index, hits[:1]  # one delete too many: drop one and retry
        elif error.column is not None and error.column in frame.columns:
            hits = np.flatnonzero(_equal(frame[error.column].to_numpy(), error.value))
            if hits.size:
                return index, hits
    return None


def _equal(values: np.ndarray, value) -> np.ndarray:
    """``values == value`` where NaN equals NaN and None equals None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return np.asarray(pd.isna(pd.Series(values)))
    with contextlib.suppress(TypeError, ValueError):
        result = np.asarray(values == value, dtype=bool)
        if result.shape == values.shape:
            return result
    return np.array([v == value for v in values], dtype=bool)


# ---------------------------------------------------------------------- writing feeds
def write_change_file(
    path: str | os.PathLike[str],
    frame: pd.DataFrame,
    format: str = "csv",
    mtime: float | None = None,
) -> str:
    """Publish ``frame`` as one complete feed file (temp file, then rename) with
    modification time ``mtime`` (Spark's file source picks new files in mtime order).

    What :class:`ChangeFeed` reads back exactly: CSV (RFC 4180, see :data:`CSV_OPTIONS`)
    with every text value quoted (quotes doubled, newlines kept), NULL (None, NaN, NaT,
    ``pd.NA``) as an empty unquoted field and the empty string as ``""``; JSON lines with
    NULL as ``null``.  Floats are written as ``repr`` writes them (they read back to the
    same double), dates as ``YYYY-MM-DD`` and timestamps as ISO text without a zone
    offset (a zoned one keeps its offset); integer columns padded with NaN (e.g. by
    ``pd.concat``) are written as integers.
    """
    path = os.fspath(path)
    if format not in ("csv", "json"):
        raise ValueError(f"format must be 'csv' or 'json', got {format!r}")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, "." + os.path.basename(path) + ".tmp")
    frame = frame.copy()
    for column in frame.columns:  # ints turned float by NaN padding: write 5, not 5.0
        data = frame[column]
        if data.dtype.kind == "f" and data.hasnans:
            values = data.dropna()
            if len(values) and np.all(np.isfinite(values)) and np.all(values == np.round(values)):
                if np.all(np.abs(values) < 2**53):
                    frame[column] = data.astype("Int64")
    names = [str(c) for c in frame.columns]
    values = [_plain_values(frame.iloc[:, i], names[i], path) for i in range(len(names))]
    with open(tmp, "w", encoding="utf-8", newline="") as handle:
        if format == "csv":
            handle.write(",".join(_csv_name(name) for name in names) + "\n")
            for row in zip(*values, strict=True):
                handle.write(",".join(_csv_field(v) for v in row) + "\n")
        else:
            for row in zip(*values, strict=True):
                record = dict(zip(names, row, strict=True))
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    os.replace(tmp, path)
    return path


def _plain_values(data: pd.Series, name: str, path: str) -> list[Any]:
    """A column's values as plain Python objects for a feed file: None for NULL, int,
    float, bool, str (dates and timestamps as ISO text)."""
    null = data.isna().to_numpy(dtype=bool)
    if data.dtype.kind == "M" or isinstance(data.dtype, pd.DatetimeTZDtype):
        stamps = pd.DatetimeIndex(data)
        days = stamps.tz is None and bool((stamps[~null] == stamps[~null].normalize()).all())
        texts = stamps.strftime("%Y-%m-%d") if days else None
        out: list[Any] = []
        for i, stamp in enumerate(stamps):
            if null[i]:
                out.append(None)
            elif days:
                out.append(texts[i])
            else:
                out.append(stamp.isoformat())
        return out
    if data.dtype.kind in "iub" and not null.any():
        return data.to_numpy().tolist()  # Python ints / bools, exact
    out = []
    for i, value in enumerate(data.astype(object).tolist()):
        if null[i]:
            out.append(None)
            continue
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, pd.Timestamp):
            value = value.isoformat()
        elif isinstance(value, datetime.datetime | datetime.date):
            value = value.isoformat()
        elif not isinstance(value, str | int | float | bool):
            value = str(value)
        if value == NULL_TOKEN:
            raise ValueError(
                f"{path}: column {name!r}, row {i}: the value {value!r} is what CSV feeds "
                "read as NULL (see CSV_OPTIONS); it cannot be written"
            )
        out.append(value)
    return out


def _csv_name(name: str) -> str:
    """A header field: quoted only when it must be."""
    plain = name and name == name.strip() and not any(c in name for c in ',"\r\n')
    return name if plain else _csv_field(name)


def _csv_field(value: Any) -> str:
    """One CSV field: NULL empty, text always quoted (RFC 4180: quotes doubled)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return '"' + value.replace('"', '""') + '"'
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_stream_files(
    folder: str | os.PathLike[str],
    stream: Iterable,
    tagged: bool = True,
    format: str = "csv",
    start: int = 0,
    per_file: int = 1,
    op_column: str | None = "op",
    mult_column: str | None = None,
    relation_column: str = "relation",
    base_mtime: float | None = None,
    columns: Sequence[str] | Mapping[str, str] | None = None,
) -> list[str]:
    """Write ``StreamBatch`` es (``ringml.datasets.build_stream``) as change-feed files.

    ``tagged=True``: one feed in ``folder`` with a relation column; else one sub-folder per
    relation.  ``per_file`` stream batches go into each file; files are numbered from
    ``start`` and get increasing modification times (1 s apart from ``base_mtime``).
    CSV fields are matched to the read schema by position, so every file of a tagged feed
    has the same ``columns`` (default: the union over ``stream``, first seen first; pass
    the feed's schema when writing a stream in several calls).
    """
    folder = os.fspath(folder)
    batches = list(stream)
    if columns is None:
        union: dict[str, None] = {}
        for b in batches:
            union.update(dict.fromkeys(b.rows.columns))
        columns = list(union)
    columns = list(columns)
    base = time.time() - 10_000 if base_mtime is None else base_mtime
    written = []
    for k in range(0, len(batches), per_file):
        group = batches[k : k + per_file]
        number = start + k // per_file
        frames: dict[str | None, list[pd.DataFrame]] = {}
        for b in group:
            part = b.rows.copy()
            for column in part.columns:  # exact when pd.concat pads them with NULLs
                kind = part[column].dtype.kind
                if kind in "iu":
                    part[column] = part[column].astype("Int64" if kind == "i" else "UInt64")
            if op_column:
                part.insert(
                    0, op_column, np.where(np.asarray(b.multiplicity) > 0, "insert", "delete")
                )
            else:
                part.insert(0, mult_column, np.asarray(b.multiplicity, dtype=np.int64))
            if tagged:
                part.insert(0, relation_column, b.relation)
            frames.setdefault(None if tagged else b.relation, []).append(part)
        for relation, parts in frames.items():
            target = folder if relation is None else os.path.join(folder, relation)
            path = os.path.join(target, f"part-{number:06d}.{format}")
            frame = pd.concat(parts, ignore_index=True)
            if relation is None:
                head = [c for c in (relation_column, op_column or mult_column) if c]
                frame = frame.reindex(columns=head + [c for c in columns if c not in head])
            written.append(write_change_file(path, frame, format, mtime=base + number))
    return written
