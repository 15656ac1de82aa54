"""The view tree sharded across Spark executors by the root variable of the variable order.

Design (``ARCHITECTURE.md``, "Backends"):

* **Sharding.**  Let ``X`` be the root variable of the maintainer's variable order.  Every
  tuple of the join has one ``X``-value, so routing every relation that binds ``X`` (at the
  same column in all its atoms) by a hash of its ``X``-value and *broadcasting* the
  relations that lack ``X`` to all ``S`` shards makes each join tuple meet in exactly one
  shard: the query result is the ring sum of the shards' results.  The hash is a
  deterministic 64-bit hash of the value (numbers as float64, so ``1`` and ``1.0`` — one
  key to the engine — land on the same shard), computed the same way in every process.
* **Shards.**  A shard is an ordinary local :class:`ringml.Maintainer` over the shard's
  tuples (same query, same variable order).  One batch is one Spark job that stays
  columnar: ``mapInArrow`` routes each relation's rows (Spark input, read by at most as
  many map tasks as there are cores; pandas input is routed on the driver) and packs them
  into one Arrow IPC blob per input partition and shard; the blobs of all relations are
  shuffled to their shard (each shard has its own partition: the shard column holds, per
  shard, an int that Spark's hash partitioner sends there, found on the driver with
  Spark's Murmur3 hash, no job) and a ``mapInArrow`` over the shuffled partitions (no sort
  or grouping by Spark) hands them to the shard, which loads its state, applies the batch
  atomically with the local engine, writes its new state and returns its root payload
  (``ring.to_bytes``; grouped queries: ``(group, bytes)`` pairs) with the codes it uses.
* **State between batches.**  Each shard's maintainer is stored as versioned snapshots
  ``<state_dir>/shard-<s>/v<seq>.pkl`` written by the executors; Python workers also cache
  the last version they produced, so a shard that comes back to the same worker skips the
  read.  The driver holds only the shards' root payloads and a manifest (``seq``, the
  committed version of every shard, their roots, the ring's shifts, the driver's
  dictionaries, the last applied ``batch_id`` and a small ``meta`` dict) that it replaces
  atomically after all shards succeeded: that replace is the commit.  A failing shard
  (bad data, a crashed task) makes the driver discard the staged versions: batches are
  atomic across shards, and a retried task recomputes from the committed version
  (idempotent).  The :class:`BatchError` the driver raises names the relation, column and
  value of the first failing shard's error, so a caller can drop the offending rows and
  retry (``spark_stream``'s dead letters do).
* **Shifts.**  Covariance rings (continuous and generalized) fix a per-variable shift at
  the first lift.  Every shard fixes its own (from the first values it lifts), so no
  driver-side pass over the data is needed; a shard's root payload carries its shifts, and
  the driver re-centres every shard root on the driver ring's shifts (the ring's
  ``reshift``, exact algebra on count, Σx, Σxxᵀ and the ``SUM(x) GROUP BY`` category
  entries) before summing.  The driver ring adopts, for each variable still
  open, the shift of the lowest shard that lifted it, and records it in the manifest.
* **Codes.**  Rings may hold dictionary codes of values in their payloads
  (``ring.keyed_variables``: categories of the generalized covariance ring, listed
  variables of the relational and factorized rings).  Every shard's maintainer assigns its
  own codes (in order of first appearance on that shard), so the same code means different
  values on different shards.  A shard therefore ships, with its root, the values of every
  code its payloads use (``ring.used_codes``, decoded by the shard's maintainer); the driver
  keeps one :class:`~ringml.encoding.Dictionary` per keyed variable (append-only, stored in
  the manifest, so codes stay stable across batches and restarts), encodes the shipped
  values into it at commit, and translates each shard root into its codes
  (``ring.recode``, vectorized) before summing.  :meth:`DistributedMaintainer.decode` reads
  the result's codes, as :meth:`ringml.Maintainer.decode` does locally.
* **Bulk load** (:meth:`DistributedMaintainer.load`) takes Spark or pandas DataFrames and
  goes through the same path (static relations are ``load``-ed, others inserted).

Limits of this first cut: the state directory must be a file system every executor and
the driver can read and write (local disk in ``local[*]`` mode; a shared POSIX mount on a
cluster); a shard rewrites its full snapshot on every batch it takes part in (cost linear
in the shard's state — broadcast relations take part in every batch of every shard, and
each shard holds their views in full); a shard's part of a batch is held in one Python
worker's memory at once; skewed root values make skewed shards; exactly-once over a stream
needs ``batch_id`` (a replayed id is skipped).

Example::

    dm = DistributedMaintainer(spark, ringml.covariance_query(schemas), shards=8,
                               state_dir="state/housing")
    dm.load({name: spark.read.parquet(path) for name, path in files.items()})   # bulk
    dm.apply([ringml.UpdateBatch("House", rows, signs)], batch_id=17)           # stream
    payload = dm.result()      # ring sum of the 8 shard roots; dm.explain() shows the plan
"""

from __future__ import annotations

import contextlib
import decimal
import math
import numbers
import os
import pickle
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ringml import BatchError, Maintainer, SchemaError, UpdateBatch
from ringml.encoding import Dictionary

from .spark_checkpoint import (
    CheckpointError,
    atomic_write,
    check_same_description,
    restore_maintainer,
    snapshot_maintainer,
)

__all__ = ["DistributedMaintainer", "ShardPlan", "plan_shards"]

_SHARD = "__ringml_shard"
_REL = "__ringml_relation"
_MULT = "__ringml_mult"
_BLOB = "__ringml_rows"
_PACKED_SCHEMA = f"{_SHARD} int, {_REL} string, {_BLOB} binary"
_MANIFEST = "manifest.pkl"
# 2: the manifest records the maintainer description, not explain() text; 3: shard roots
# carry the values of the codes they use and the manifest the driver's dictionaries (a
# format-2 state is migrated on resume, see DistributedMaintainer._migrate_roots)
_FORMAT = 3
_VERSION = re.compile(r"^v(\d{12})\.pkl$")
_RESULT_SCHEMA = (
    "shard int, status string, message string, payload binary, rows long, seconds double, "
    "detail binary"
)

# per Python worker: (state_dir, shard) -> (version, maintainer) of the last version it made
_SHARD_CACHE: dict[tuple[str, int], tuple[int, Maintainer]] = {}
_CACHE_LIMIT = 16


@dataclass(frozen=True)
class ShardPlan:
    """How relations reach shards: by the column that binds the root variable, or to all."""

    root_variable: str
    sharded: dict[str, str]  # relation -> column holding the root variable
    broadcast: tuple[str, ...]

    def describe(self, shards: int) -> str:
        lines = [f"sharded by {self.root_variable!r} into {shards} shards (hash partitioning)"]
        lines += [f"  {r}: by column {c!r}" for r, c in self.sharded.items()]
        lines += [f"  {r}: broadcast to every shard" for r in self.broadcast]
        return "\n".join(lines)


def plan_shards(maintainer: Maintainer) -> ShardPlan:
    """The sharding plan of a maintainer's query under its variable order."""
    roots = maintainer.order.roots
    if len(roots) != 1:
        raise SchemaError(
            f"the variable order has {len(roots)} roots {roots}; sharding needs one root "
            "(a connected query)"
        )
    root = roots[0]
    query = maintainer.query
    sharded: dict[str, str] = {}
    broadcast: list[str] = []
    for relation, columns in query.relations.items():
        holders = set()
        for atom in query.atoms_of(relation):
            where = [c for c, v in zip(columns, atom.variables, strict=True) if v == root]
            holders.add(where[0] if where else None)
        if len(holders) == 1 and None not in holders:
            sharded[relation] = holders.pop()
        else:
            broadcast.append(relation)
    if not sharded:
        raise SchemaError(
            f"no relation binds the root variable {root!r} in all of its atoms at one column; "
            "nothing can be sharded"
        )
    return ShardPlan(root, sharded, tuple(broadcast))


@dataclass
class _Layout:
    """One relation of a batch: its columns, and whether it is bulk-loaded (static)."""

    relation: str
    columns: tuple[str, ...]
    load: bool  # bulk-load into a static relation (Maintainer.load)


def _shard_of_values(values: np.ndarray, shards: int) -> np.ndarray:
    """The shard (0..shards-1) of each root-variable value: a deterministic 64-bit hash of
    the value modulo shards, the same in every process.  Values the engine joins as one key
    meet: a number of any type (an int, float or bool column, or a Python int, float or
    ``Decimal`` in an object column, as Arrow hands over decimals) is hashed as the nearest
    float64, so 1, 1.0 and ``Decimal("1")`` agree (distinct keys that round alike only share
    a shard); other values are hashed as objects, datetimes and durations of any unit as
    the microsecond ``datetime``/``timedelta`` objects Spark hands over (numpy reads
    nanosecond ones as plain ints, which took them to another shard)."""
    if values.dtype.kind in "mM":
        values = values.astype("M8[us]" if values.dtype.kind == "M" else "m8[us]")
    if values.dtype.kind in "iufb":
        return _shard_of_hashes(pd.util.hash_array(values.astype(np.float64) + 0.0), shards)
    objects = np.fromiter(map(_microsecond_time, values.astype(object)), object, len(values))
    numbers = np.fromiter(map(_as_float, objects), dtype=np.float64, count=len(objects))
    numeric = ~np.isnan(numbers) | np.fromiter(map(_is_nan_number, objects), bool, len(objects))
    hashed = np.empty(len(objects), dtype=np.uint64)
    hashed[numeric] = pd.util.hash_array(numbers[numeric] + 0.0)  # -0.0 and 0.0 alike
    if not numeric.all():
        hashed[~numeric] = pd.util.hash_array(objects[~numeric])
    return _shard_of_hashes(hashed, shards)


def _shard_of_hashes(hashed: np.ndarray, shards: int) -> np.ndarray:
    return (hashed % np.uint64(shards)).astype(np.int64)


def _microsecond_time(value):
    """A datetime or duration object of any kind (numpy scalar, pandas, datetime) as the
    ``datetime``/``timedelta`` of its microsecond (truncated, as numpy casts a column), so
    that an instant meets itself whatever holds it; any other value as it is."""
    if isinstance(value, pd.Timestamp) and value.tz is None:
        value = value.to_datetime64()
    elif isinstance(value, pd.Timedelta):
        value = value.to_timedelta64()
    elif isinstance(value, pd.Timestamp):  # zoned: its nanoseconds cut (down, as numpy)
        return value.to_pydatetime(warn=False)
    if isinstance(value, np.datetime64 | np.timedelta64):
        unit = "M8[us]" if isinstance(value, np.datetime64) else "m8[us]"
        return value.astype(unit).item()
    return value


def _as_float(value) -> float:
    """A number's nearest float64 (infinite beyond the range); NaN for anything else."""
    if isinstance(value, bool | np.bool_ | numbers.Real | decimal.Decimal):
        try:
            return float(value)
        except OverflowError:  # an int beyond 1.8e308
            return math.copysign(math.inf, value)
    return math.nan


def _is_nan_number(value) -> bool:
    return isinstance(value, numbers.Real | decimal.Decimal) and value != value


def _spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an int column (Murmur3 x86_32 ``hashInt``, seed 42), signed."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4  # length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def _partition_keys(shards: int) -> list[int]:
    """For each partition ``s`` of ``repartition(shards, col)`` on an int column, the
    smallest non-negative int that Spark's hash partitioner (``pmod(hash(col), shards)``)
    sends there."""
    first: dict[int, int] = {}
    key = 0
    while len(first) < shards:
        first.setdefault(_spark_hash_int(key) % shards, key)
        key += 1
    return [first[s] for s in range(shards)]


class _Packer:
    """Runs in ``mapInArrow`` over one relation: routes its rows to shards and emits, per
    shard, one Arrow IPC blob (rows stay columnar through the shuffle)."""

    def __init__(self, relation: str, key_column: str | None, shard_keys: list[int]) -> None:
        self.relation = relation
        self.key_column = key_column  # None: broadcast to every shard
        self.shard_keys = shard_keys

    def __call__(self, batches):
        parts: dict[int, list[pa.RecordBatch]] = {}
        for batch in batches:
            if batch.num_rows:
                for shard, part in _split_batch(batch, self.key_column, len(self.shard_keys)):
                    parts.setdefault(shard, []).append(part)
        for shard, pieces in parts.items():
            yield _blob_batch(self.shard_keys[shard], self.relation, pieces)


@dataclass
class _ParquetFiles:
    """Parquet files of one relation, given to :meth:`DistributedMaintainer.load` by path:
    the map tasks read them with pyarrow, row group by row group (no JVM conversion)."""

    path: str
    pieces: list[tuple[str, int, int]]  # (file, row group, rows)
    columns: list[str]

    @classmethod
    def scan(cls, path: str | os.PathLike[str]) -> _ParquetFiles:
        import pyarrow.parquet as pq

        path = os.path.abspath(os.fspath(path))
        if os.path.isdir(path):
            files = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
                files += [
                    os.path.join(root, n)
                    for n in sorted(names)
                    if n.endswith(".parquet") and not n.startswith(("_", "."))
                ]
        elif os.path.exists(path):
            files = [path]
        else:
            raise FileNotFoundError(f"no parquet file or folder {path!r}")
        pieces: list[tuple[str, int, int]] = []
        columns: list[str] | None = None
        for file in files:
            meta = pq.ParquetFile(file).metadata
            names = meta.schema.to_arrow_schema().names
            columns = names if columns is None else [c for c in columns if c in names]
            pieces += [(file, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        return cls(path, pieces, columns or [])


def _balanced(pieces, count: int) -> list[list]:
    """``(item, rows)`` pieces in at most ``count`` buckets of about equal rows (largest
    piece first, each to the lightest bucket); a bucket lists its items in input order."""
    count = max(1, min(count, len(pieces)))
    buckets: list[list[tuple[int, Any]]] = [[] for _ in range(count)]
    rows = [0] * count
    for position, (item, n) in sorted(enumerate(pieces), key=lambda p: -p[1][1]):
        lightest = rows.index(min(rows))
        buckets[lightest].append((position, item))
        rows[lightest] += n
    return [[item for _, item in sorted(b, key=lambda x: x[0])] for b in buckets if b]


class _FilePacker:
    """Runs in ``mapInArrow`` over bucket ids (``spark.range``): reads each bucket's parquet
    row groups — of any relation given by path — with pyarrow (one thread: the task's
    core), routes the rows and packs one Arrow IPC blob per (relation, shard), like
    :class:`_Packer`.  One task per core reads all relations, so small files cost no
    extra Python tasks."""

    def __init__(self, specs, shard_keys: list[int], buckets) -> None:
        self.specs = specs  # relation -> (key column or None, columns, mult column or None)
        self.shard_keys = shard_keys
        self.buckets = buckets  # bucket id -> [(relation, file, row group)]

    def __call__(self, batches):
        import pyarrow.parquet as pq

        parts: dict[tuple[str, int], list[pa.RecordBatch]] = {}
        files: dict[str, Any] = {}
        for batch in batches:
            for bucket in batch.column("id").to_pylist():
                for relation, file, group in self.buckets[bucket]:
                    key_column, columns, mult_column = self.specs[relation]
                    wanted = list(columns) + ([mult_column] if mult_column else [])
                    reader = files.get(file) or files.setdefault(file, pq.ParquetFile(file))
                    table = reader.read_row_group(group, columns=wanted, use_threads=False)
                    if mult_column:
                        mult = pc.cast(table.column(mult_column), pa.int64())
                        table = table.select(list(columns)).append_column(_MULT, mult)
                    else:
                        ones = pa.array(np.ones(table.num_rows, np.int64))
                        table = table.append_column(_MULT, ones)
                    for piece in table.to_batches():
                        if not piece.num_rows:
                            continue
                        for shard, part in _split_batch(piece, key_column, len(self.shard_keys)):
                            parts.setdefault((relation, shard), []).append(part)
        for (relation, shard), pieces in parts.items():
            yield _blob_batch(self.shard_keys[shard], relation, pieces)


def _split_batch(batch: pa.RecordBatch, key_column: str | None, shards: int):
    if key_column is None:
        return [(s, batch) for s in range(shards)]
    key = batch.column(key_column).to_numpy(zero_copy_only=False)
    shard = _shard_of_values(key, shards)
    out = []
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(shards + 1))
    for s in range(shards):
        if bounds[s + 1] > bounds[s]:
            out.append((s, batch.take(pa.array(order[bounds[s] : bounds[s + 1]]))))
    return out


def _blob_batch(shard_key: int, relation: str, pieces) -> pa.RecordBatch:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pieces[0].schema) as writer:
        for piece in pieces:
            writer.write_batch(piece)
    return pa.RecordBatch.from_pydict(
        {
            _SHARD: pa.array([shard_key], pa.int32()),
            _REL: pa.array([relation], pa.string()),
            _BLOB: pa.array([sink.getvalue().to_pybytes()], pa.binary()),
        }
    )


@dataclass
class _ShardTask:
    """What every shard needs for one batch (pickled into the Spark job)."""

    query: Any
    updatable: frozenset[str] | None
    order: Any
    strategy: str
    options: dict[str, Any]
    state_dir: str
    seq: int
    versions: dict[int, int]
    shard_of: dict[int, int]  # shard column value -> shard id
    layouts: list[_Layout]
    free: bool
    cache: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __call__(self, key, table: pa.Table) -> pa.Table:
        shard = self.shard_of[int(key[0].as_py())]
        started = time.perf_counter()
        rows = 0
        try:
            maintainer = self._state(shard)
            received: dict[str, list[pa.Table]] = {}
            rows = 0
            for relation, blob in zip(
                table.column(_REL).to_pylist(), table.column(_BLOB).to_pylist(), strict=True
            ):
                part = pa.ipc.open_stream(blob).read_all()
                received.setdefault(relation, []).append(part)
                rows += part.num_rows
            loads, batches = [], []
            for layout in self.layouts:
                if layout.relation not in received:
                    continue
                part = pa.concat_tables(received[layout.relation])
                frame = part.select(list(layout.columns)).to_pandas()
                mult = part.column(_MULT).to_numpy(zero_copy_only=False).astype(np.int64)
                if layout.load:
                    loads.append(UpdateBatch(layout.relation, frame, mult))
                else:
                    batches.append(UpdateBatch(layout.relation, frame, mult))
            for batch in loads:
                if (batch.signs() != 1).any():
                    raise BatchError(
                        f"relation {batch.relation!r}: a bulk load only inserts", batch.relation
                    )
                maintainer.load(batch.relation, batch.rows)
            if batches:
                maintainer.apply(batches)
            payload = _root_bytes(maintainer, self.free)
            path = _version_path(self.state_dir, shard, self.seq)
            atomic_write(path, snapshot_maintainer(maintainer))
            if self.cache:
                _remember((self.state_dir, shard), self.seq, maintainer)
            status, message = "ok", ""
            detail = b""
        except Exception as error:  # noqa: BLE001 - reported to the driver, batch aborted
            _SHARD_CACHE.pop((self.state_dir, shard), None)
            payload, status = b"", "error"
            message = f"shard {shard}: {type(error).__name__}: {error}"
            detail = _error_detail(error)
        return pa.table(
            {
                "shard": pa.array([shard], pa.int32()),
                "status": pa.array([status]),
                "message": pa.array([message]),
                "payload": pa.array([payload], pa.binary()),
                "rows": pa.array([rows], pa.int64()),
                "seconds": pa.array([time.perf_counter() - started], pa.float64()),
                "detail": pa.array([detail], pa.binary()),
            }
        )

    def _state(self, shard: int) -> Maintainer:
        version = self.versions.get(shard, -1)
        cached = _SHARD_CACHE.get((self.state_dir, shard))
        if cached is not None and cached[0] == version:
            return cached[1]
        if version < 0:
            return Maintainer(self.query, self.updatable, self.order, self.strategy, **self.options)
        with open(_version_path(self.state_dir, shard, version), "rb") as handle:
            return restore_maintainer(handle.read())


def _error_detail(error: Exception) -> bytes:
    """The relation, column and value a :class:`BatchError` names, pickled for the driver
    (which re-raises with them, so callers can tell the offending rows)."""
    if not isinstance(error, BatchError):
        return b""
    fields = (error.relation, error.column, error.value)
    try:
        return pickle.dumps(fields, protocol=5)
    except Exception:  # noqa: BLE001 - an unpicklable value: keep relation and column
        return pickle.dumps((error.relation, error.column, None), protocol=5)


def _shard_partition(task: _ShardTask):
    """``mapInArrow`` over the shuffled blobs: a partition holds one shard's blobs (the
    shard keys are chosen so), no sort or grouping by Spark; any other key found in the
    partition is still handled as its own shard."""

    def run(batches):
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        keys = table.column(_SHARD)
        for value in pc.unique(keys).to_pylist():
            part = table.filter(pc.equal(keys, value))
            yield from task((pa.scalar(value, pa.int32()),), part).to_batches()

    return run


def _remember(key: tuple[str, int], version: int, maintainer: Maintainer) -> None:
    """Cache the version a worker just made (a few shards per worker, oldest out first)."""
    _SHARD_CACHE.pop(key, None)
    _SHARD_CACHE[key] = (version, maintainer)
    while len(_SHARD_CACHE) > _CACHE_LIMIT:
        _SHARD_CACHE.pop(next(iter(_SHARD_CACHE)))


def _rebuilt_dictionary(variable: str, values: np.ndarray, bounds: Sequence[int]) -> Dictionary:
    """The driver dictionary whose values (in code order) grew in chunks ending at
    ``bounds``, with the same codes (one encode per chunk, as when it was built)."""
    dictionary = Dictionary(variable)
    values = np.asarray(values, dtype=object)
    start = 0
    for end in bounds:
        codes = dictionary.encode(values[start:end])
        if not np.array_equal(codes, np.arange(start, end)):
            raise CheckpointError(f"the stored dictionary of {variable!r} does not rebuild")
        start = end
    return dictionary


def _version_path(state_dir: str, shard: int, version: int) -> str:
    return os.path.join(state_dir, f"shard-{shard:04d}", f"v{version:012d}.pkl")


def _root_bytes(maintainer: Maintainer, free: bool) -> bytes:
    """A shard's root for the driver, pickled: ``root`` (the payload's bytes; grouped
    queries: ``(group values, bytes)`` pairs) and ``codes``: per keyed variable of the ring,
    the codes the payloads use and their values in the shard's dictionary."""
    ring = maintainer.ring
    if free:
        groups = list(maintainer.enumerate())
        root: Any = [(key, ring.to_bytes(p)) for key, p in groups]
        payloads = [p for _, p in groups]
    else:
        payloads = [maintainer.result()]
        root = ring.to_bytes(payloads[0])
    codes = {}
    if ring.keyed_variables and payloads:
        used = ring.used_codes(ring.batch_from(payloads))
        codes = {v: (c, maintainer.decode(v, c)) for v, c in used.items() if len(c)}
    return pickle.dumps({"root": root, "codes": codes}, protocol=5)


class DistributedMaintainer:
    """A maintainer whose views are sharded over Spark executors (see the module docs).

    ``spark`` is the SparkSession that runs the shards' jobs; ``query``, ``updatable``,
    ``order`` and ``strategy`` are as for :class:`ringml.Maintainer`, and ``**options``
    (e.g. ``allow_absent_deletes=True``) go to every shard's Maintainer.  ``shards`` is the
    number of shards; ``state_dir`` holds the shards' states and the driver's manifest (a
    temporary folder when omitted; pass one to survive a restart: an existing manifest is
    resumed).  ``cache=True`` lets each Python worker keep the last state it wrote for a
    shard in memory, so a shard that comes back to it skips reading its snapshot.
    """

    def __init__(
        self,
        spark,
        query,
        shards: int = 4,
        state_dir: str | os.PathLike[str] | None = None,
        updatable=None,
        order=None,
        strategy: str = "fivm",
        cache: bool = True,
        **options: Any,
    ) -> None:
        if shards < 1:
            raise ValueError("shards must be >= 1")
        self.spark = spark
        self.query = query
        self.ring = query.ring
        self.shards = int(shards)
        self.strategy = strategy
        self.cache = cache
        self.options = dict(options)
        self._template = Maintainer(query, updatable, order, strategy, **options)
        self.order = self._template.order
        self.updatable = self._template.updatable
        self.plan = plan_shards(self._template)
        self._owns_dir = state_dir is None
        self.state_dir = os.path.abspath(
            os.fspath(state_dir) if state_dir is not None else tempfile.mkdtemp(prefix="ringml-")
        )
        self.seq = 0
        self.last_batch_id = -1
        self.versions: dict[int, int] = {}
        self._roots: dict[int, bytes] = {}
        self._shifts: dict[str, float] = {}
        # the driver's code space: one dictionary per keyed variable of the ring
        self._dictionaries = {v: Dictionary(v) for v in sorted(self.ring.keyed_variables)}
        # per keyed variable, the dictionary's size after each commit that grew it: a
        # Dictionary numbers the new values of one encode call in its own order, so a
        # restart re-encodes the values in the same chunks to get the same codes
        self._code_bounds: dict[str, list[int]] = {v: [] for v in self._dictionaries}
        #: small user data stored in the manifest with every commit (e.g. a stream's query id)
        self.meta: dict[str, Any] = {}
        self._keys: list[int] | None = None
        self.last_job: list[dict[str, Any]] = []  # per shard: status, rows, seconds
        self.last_timings: dict[str, float] = {}  # driver side: prepare, job, commit
        self._resume()

    # ------------------------------------------------------------------ manifest
    def _description(self) -> dict[str, Any]:
        return {**self._template.description(), "shards": self.shards}

    def _resume(self) -> None:
        path = os.path.join(self.state_dir, _MANIFEST)
        if not os.path.exists(path):
            return
        with open(path, "rb") as handle:
            manifest = pickle.load(handle)
        if manifest.get("format") not in (2, _FORMAT):
            raise CheckpointError(
                f"{path}: manifest format {manifest.get('format')} is not supported (want "
                f"{_FORMAT}); start from a fresh state folder"
            )
        where = f"the state in {self.state_dir}"
        check_same_description(manifest.get("description"), self._description(), where)
        self.seq = manifest["seq"]
        self.last_batch_id = manifest["batch_id"]
        self.versions = dict(manifest["versions"])
        self._roots = dict(manifest["roots"])
        self._shifts = dict(manifest["shifts"])
        self.meta = dict(manifest.get("meta") or {})
        if self._shifts and hasattr(self.ring, "set_shifts"):
            self.ring.set_shifts(self._shifts)
        if manifest["format"] == 2:
            self._roots = self._migrate_roots(self._roots)
            self._adopt_codes(self._roots.values())
            return
        stored = manifest.get("codes") or {}
        if set(stored) != set(self._dictionaries):
            raise CheckpointError(
                f"{path}: the manifest has dictionaries of {sorted(stored)}, the ring keys "
                f"{sorted(self._dictionaries)}"
            )
        for variable, (values, bounds) in stored.items():
            self._dictionaries[variable] = _rebuilt_dictionary(variable, values, bounds)
            self._code_bounds[variable] = list(bounds)

    def _migrate_roots(self, roots: Mapping[int, bytes]) -> dict[int, bytes]:
        """Format-2 roots (bare payload bytes holding shard-local codes) in format 3.
        Without keyed variables only the wrapping changes; with them the values behind a
        shard's codes are read from its committed snapshot (which holds its dictionaries):
        the driver restores each shard once and rebuilds its root."""
        if not self._dictionaries:
            free = bool(self.query.free)
            return {
                shard: pickle.dumps(
                    {"root": pickle.loads(data) if free else data, "codes": {}}, protocol=5
                )
                for shard, data in roots.items()
            }
        migrated = {}
        for shard in sorted(roots):
            path = _version_path(self.state_dir, shard, self.versions[shard])
            try:
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError as error:
                raise CheckpointError(
                    f"{path}: cannot migrate the format-2 state of shard {shard} ({error}); "
                    "start from a fresh state folder"
                ) from error
            maintainer = restore_maintainer(data, where=path)
            migrated[shard] = _root_bytes(maintainer, bool(self.query.free))
        return migrated

    def _commit(self, seq: int, versions, roots, batch_id: int) -> None:
        manifest = {
            "format": _FORMAT,
            "description": self._description(),
            "seq": seq,
            "batch_id": batch_id,
            "versions": versions,
            "roots": roots,
            "shifts": self._shifts,
            "codes": {
                v: (d.values, list(self._code_bounds[v])) for v, d in self._dictionaries.items()
            },
            "meta": dict(self.meta),
        }
        atomic_write(os.path.join(self.state_dir, _MANIFEST), pickle.dumps(manifest, protocol=5))

    # ------------------------------------------------------------------ updates
    def load(self, relations: Mapping[str, Any], batch_id: int | None = None) -> bool:
        """Bulk-load relations (inserts only) through the shards.

        Values are Spark or pandas DataFrames, or paths of parquet files (a file or a folder
        of ``*.parquet``): those are read by the map tasks themselves with pyarrow, row group
        by row group, which skips Spark's row-by-row conversion of a scan to Arrow (the
        costliest step of a bulk load from a DataFrame).  Static relations are loaded
        (``Maintainer.load``) and updatable ones inserted.
        """
        frames = {r: (f, None) for r, f in relations.items()}
        return self._run(frames, batch_id, bulk=True)

    def apply(self, batches: Sequence[UpdateBatch] | UpdateBatch, batch_id: int | None = None):
        """Apply update batches (pandas, on the driver) atomically across all shards.

        With ``batch_id``, an id at or below the last applied one is skipped (returns False).
        """
        if isinstance(batches, UpdateBatch):
            batches = [batches]
        frames: dict[str, list] = {}
        for batch in batches:
            if batch.relation not in self.query.relations:
                raise BatchError(
                    f"unknown relation {batch.relation!r}; the query has "
                    f"{sorted(self.query.relations)}",
                    batch.relation,
                )
            rows = batch.rows.copy()
            rows[_MULT] = batch.signs()
            frames.setdefault(batch.relation, []).append(rows)
        merged = {r: (pd.concat(parts, ignore_index=True), _MULT) for r, parts in frames.items()}
        return self._run(merged, batch_id, bulk=False)

    def apply_frames(
        self,
        frames: Mapping[str, Any],
        mult_column: str | None = None,
        batch_id: int | None = None,
    ) -> bool:
        """Apply changes given as Spark or pandas DataFrames per relation; ``mult_column``
        holds signed multiplicities (default: all inserts)."""
        return self._run({r: (f, mult_column) for r, f in frames.items()}, batch_id, bulk=False)

    def _run(self, frames: Mapping[str, tuple[Any, str | None]], batch_id, bulk: bool) -> bool:
        if batch_id is not None and int(batch_id) <= self.last_batch_id:
            return False
        for relation in frames:
            if relation not in self.query.relations:
                raise BatchError(f"unknown relation {relation!r}", relation)
            if not bulk and relation not in self.updatable:
                raise BatchError(
                    f"relation {relation!r} is static; declare it updatable to change it",
                    relation,
                )
        started = time.perf_counter()
        sources = {}
        for relation, (frame, mult_column) in frames.items():
            checked = self._checked(relation, frame, mult_column)
            if checked is not None:
                sources[relation] = (
                    checked,
                    None if isinstance(checked, pd.DataFrame) else checked,
                )
        self.last_timings = {"prepare": time.perf_counter() - started}
        parts, layouts, files = [], [], {}
        for relation, (_, mult_column) in frames.items():
            if relation not in sources:
                continue
            static = bulk and relation not in self.updatable
            layouts.append(_Layout(relation, tuple(self.query.relations[relation]), static))
            if isinstance(sources[relation][0], _ParquetFiles):
                files[relation] = sources[relation][0]
            else:
                parts.append(self._packed(relation, sources[relation][0], mult_column))
        if files:
            parts.append(self._packed_files(files, {r: frames[r][1] for r in files}))
        if not parts:
            return False
        union = parts[0]
        for part in parts[1:]:
            union = union.unionByName(part)
        seq = self.seq + 1
        task = _ShardTask(
            query=self.query,
            updatable=self.updatable,
            order=self.order,
            strategy=self.strategy,
            options=self.options,
            state_dir=self.state_dir,
            seq=seq,
            versions=dict(self.versions),
            shard_of={k: s for s, k in enumerate(self._shard_keys())},
            layouts=layouts,
            free=bool(self.query.free),
            cache=self.cache,
        )
        started = time.perf_counter()
        try:
            shuffled = union.repartition(self.shards, _SHARD)
            rows = shuffled.mapInArrow(_shard_partition(task), _RESULT_SCHEMA).collect()
        except Exception:
            self._discard(seq)
            raise
        self.last_job = [row.asDict() for row in rows]
        self.last_timings["job"] = time.perf_counter() - started
        failed = sorted((row for row in rows if row["status"] != "ok"), key=lambda r: r["shard"])
        if failed:
            self._discard(seq)
            messages = "; ".join(row["message"] for row in failed)
            first = next(iter(frames), None)
            detail = next((bytes(r["detail"]) for r in failed if r["detail"]), b"")
            relation, column, value = pickle.loads(detail) if detail else (None, None, None)
            raise BatchError(
                f"the batch was rejected by {len(failed)} shard(s), no shard changed: {messages}",
                relation if relation is not None else (first if len(frames) == 1 else None),
                column,
                value,
            )
        started = time.perf_counter()
        self._accept(seq, {row["shard"]: bytes(row["payload"]) for row in rows}, batch_id)
        self.last_timings["commit"] = time.perf_counter() - started
        return True

    def _accept(self, seq: int, fresh: Mapping[int, bytes], batch_id: int | None) -> None:
        """Commit version ``seq`` of the shards whose new roots are ``fresh`` (all of them
        succeeded): their codes and shifts are adopted and the manifest replaced; if that
        fails, the driver's code space stays the committed one."""
        versions = {**self.versions, **dict.fromkeys(fresh, seq)}
        roots = {**self._roots, **fresh}
        sizes = {v: len(d) for v, d in self._dictionaries.items()}
        try:
            self._adopt_codes(fresh[shard] for shard in sorted(fresh))
            self._adopt_shifts(roots)
            self._commit(seq, versions, roots, self.last_batch_id if batch_id is None else batch_id)
        except Exception:
            self._forget_codes(sizes)
            raise
        old = dict(self.versions)
        self.seq, self.versions, self._roots = seq, versions, roots
        if batch_id is not None:
            self.last_batch_id = int(batch_id)
        for shard, version in old.items():
            if versions.get(shard) != version:
                with contextlib.suppress(OSError):
                    os.unlink(_version_path(self.state_dir, shard, version))

    def _discard(self, seq: int) -> None:
        """Remove the versions a failed batch staged (committed versions are untouched)."""
        for shard in range(self.shards):
            with contextlib.suppress(OSError):
                os.unlink(_version_path(self.state_dir, shard, seq))

    # ------------------------------------------------------------------ routing
    def _checked(self, relation: str, frame, mult_column: str | None):
        """The frame (pandas or Spark; a path becomes its parquet files), or None when it is
        empty pandas frame or files without rows."""
        columns = list(self.query.relations[relation])
        if isinstance(frame, (str, os.PathLike)):
            try:
                frame = _ParquetFiles.scan(frame)
            except (OSError, pa.ArrowException) as error:
                raise BatchError(f"relation {relation!r}: {error}", relation) from error
        present = list(frame.columns)
        missing = [c for c in columns + ([mult_column] if mult_column else []) if c not in present]
        if missing:
            raise BatchError(
                f"relation {relation!r} has columns {columns}; the frame lacks {missing}",
                relation,
                missing[0],
            )
        if isinstance(frame, pd.DataFrame) and len(frame) == 0:
            return None
        if isinstance(frame, _ParquetFiles) and not any(n for _, _, n in frame.pieces):
            return None
        return frame

    def _packed(self, relation: str, frame, mult_column: str | None):
        """The relation's rows as one Arrow IPC blob per (input partition, shard): a
        DataFrame ``(shard key, relation, blob)`` (pandas input is packed on the driver,
        Spark input by ``mapInArrow`` on the executors)."""
        columns = list(self.query.relations[relation])
        key = self.plan.sharded.get(relation)
        keys = self._shard_keys()
        if isinstance(frame, pd.DataFrame):
            data = frame[columns].copy()
            data[_MULT] = (
                np.ones(len(frame), np.int64)
                if mult_column is None
                else frame[mult_column].to_numpy().astype(np.int64)
            )
            batch = pa.RecordBatch.from_pandas(data, preserve_index=False)
            rows = [
                _blob_batch(keys[shard], relation, [part]).to_pylist()[0]
                for shard, part in _split_batch(batch, key, self.shards)
            ]
            return self.spark.createDataFrame(
                [(r[_SHARD], r[_REL], r[_BLOB]) for r in rows], _PACKED_SCHEMA
            )
        cores = max(1, int(self.spark.sparkContext.defaultParallelism))
        from pyspark.sql import functions as F

        mult = F.col(f"`{mult_column}`").cast("bigint") if mult_column else F.lit(1).cast("bigint")
        selected = frame.select(*[F.col(f"`{c}`") for c in columns], mult.alias(_MULT))
        # no relation is read by more map tasks than there are cores: every task hands its
        # rows to a Python worker once, and that fixed cost dominates small partitions
        return selected.coalesce(cores).mapInArrow(_Packer(relation, key, keys), _PACKED_SCHEMA)

    def _packed_files(self, files: Mapping[str, _ParquetFiles], mults: Mapping[str, Any]):
        """The rows of the relations given as parquet files, packed like :meth:`_packed` by
        one ``mapInArrow`` over ``spark.range(buckets)``: the row groups of all of them in
        one bucket per core, balanced by rows."""
        keys = self._shard_keys()
        specs = {
            r: (self.plan.sharded.get(r), list(self.query.relations[r]), mults.get(r))
            for r in files
        }
        pieces = [((r, f, g), n) for r, src in files.items() for f, g, n in src.pieces]
        cores = max(1, int(self.spark.sparkContext.defaultParallelism))
        buckets = _balanced(pieces, cores)
        ids = self.spark.range(0, len(buckets), 1, numPartitions=len(buckets))
        return ids.mapInArrow(_FilePacker(specs, keys, buckets), _PACKED_SCHEMA)

    def _shard_keys(self) -> list[int]:
        """The value of the shard column for each shard: an int that Spark's hash
        partitioner sends to partition ``s`` of ``shards`` (so no two shards share a task);
        computed here with Spark's hash, no job."""
        if self._keys is None:
            self._keys = _partition_keys(self.shards)
        return self._keys

    # ------------------------------------------------------------------ results
    def shard_roots(self) -> dict[int, Any]:
        """Each shard's root payload (grouped queries: ``{group: payload}`` per shard), as
        payloads of the driver's ring (covariance payloads re-centred on its shifts, codes
        in the driver's code space: :meth:`decode`)."""
        return {shard: self._decode(data) for shard, data in sorted(self._roots.items())}

    def _decode(self, data: bytes):
        """A shard's root (bytes) as payloads of the driver ring: the shard's codes are
        translated into the driver's (``ring.recode``), and since shards fix their own
        covariance shifts, the payload is read with a scratch ring that adopts the shard's
        shifts and then re-centred on the driver ring's (``reshift``)."""
        shipped = pickle.loads(data)
        ring = self.ring
        reshift = getattr(ring, "reshift", None)
        reader = ring
        if reshift is not None:
            config = ring.to_dict()
            reader = type(ring).from_dict({**config, "shifts": [None] * len(ring.variables)})
        maps = self._code_maps(shipped["codes"])
        groups = shipped["root"] if self.query.free else [((), shipped["root"])]
        payloads = [reader.from_bytes(blob) for _, blob in groups]
        if maps:  # one recode for all the shard's payloads
            payloads = reader.batch_to_list(reader.recode(reader.batch_from(payloads), maps))
        if reshift is not None:
            payloads = [reshift(payload, reader.shifts) for payload in payloads]
        if self.query.free:
            return {key: payload for (key, _), payload in zip(groups, payloads, strict=True)}
        return payloads[0]

    def _code_maps(self, codes: Mapping[str, tuple[np.ndarray, np.ndarray]]):
        """Per keyed variable, the array ``shard code -> driver code`` of a shard's root
        (-1 for codes the root does not use)."""
        maps = {}
        for variable, (old, values) in codes.items():
            new = self._dictionaries[variable].lookup(np.asarray(values, dtype=object))
            if (new < 0).any():
                value = values[int(np.flatnonzero(new < 0)[0])]
                raise CheckpointError(
                    f"{variable!r}: value {value!r} of a shard root is not in the driver's "
                    "dictionary (a root from another state?)"
                )
            mapping = np.full(int(old.max()) + 1, -1, dtype=np.int64)
            mapping[old] = new
            maps[variable] = mapping
        return maps

    def _adopt_codes(self, roots) -> None:
        """Give driver codes to the values behind the codes of shard roots (bytes), one
        encode per variable; known values keep theirs."""
        if not self._dictionaries:
            return
        shipped = [pickle.loads(data)["codes"] for data in roots]
        for variable, dictionary in self._dictionaries.items():
            parts = [np.asarray(c[variable][1], dtype=object) for c in shipped if variable in c]
            if not parts:
                continue
            dictionary.encode(np.concatenate(parts))
            bounds = self._code_bounds[variable]
            if len(dictionary) > (bounds[-1] if bounds else 0):
                bounds.append(len(dictionary))

    def _forget_codes(self, sizes: Mapping[str, int]) -> None:
        """Drop the driver codes given after ``sizes`` (a batch that did not commit)."""
        for variable, size in sizes.items():
            old = self._dictionaries[variable]
            if len(old) != size:
                bounds = [b for b in self._code_bounds[variable] if b <= size]
                self._dictionaries[variable] = _rebuilt_dictionary(variable, old.values, bounds)
                self._code_bounds[variable] = bounds

    def decode(self, variable: str, codes) -> np.ndarray:
        """The values behind codes of a keyed variable (categories, listed variables) in the
        payloads of :meth:`result` and :meth:`shard_roots`, as
        :meth:`ringml.Maintainer.decode` does for a local result."""
        if variable not in self._dictionaries:
            raise KeyError(
                f"variable {variable!r} has no codes in the results; the ring {self.ring!r} "
                f"keys {sorted(self._dictionaries)}"
            )
        return self._dictionaries[variable].decode(np.asarray(codes, dtype=np.int64))

    def _adopt_shifts(self, roots: Mapping[int, bytes]) -> None:
        """Fix the driver ring's still-open shifts from the shard roots (lowest shard
        first), so that the manifest records the shifts results are expressed in."""
        shifts = getattr(self.ring, "shifts", None)
        if shifts is None or not hasattr(self.ring, "reshift") or not np.isnan(shifts).any():
            return
        for shard in sorted(roots):
            self._decode(roots[shard])
        self._shifts = {
            v: float(h)
            for v, h in zip(self.ring.variables, self.ring.shifts, strict=True)
            if not np.isnan(h)
        }

    def result(self):
        """The query result: the ring sum of the shards' roots (``{group: payload}`` for
        grouped queries, groups summed across shards)."""
        ring = self.ring
        if not self.query.free:
            total = ring.zero()
            for payload in self.shard_roots().values():
                total = ring.add(total, payload)
            return total
        merged: dict[tuple, Any] = {}
        for groups in self.shard_roots().values():
            for key, payload in groups.items():
                merged[key] = ring.add(merged[key], payload) if key in merged else payload
        return merged

    def explain(self) -> str:
        """The local engine's view tree plus the sharding plan."""
        return f"{self._template.explain()}\n{self.plan.describe(self.shards)}"

    def close(self) -> None:
        """Remove a temporary state_dir (workers' caches age out on their own)."""
        if self._owns_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
