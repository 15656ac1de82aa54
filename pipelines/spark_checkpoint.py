"""Durable, atomic snapshots of a :class:`ringml.Maintainer` for the Spark pipelines.

No pyspark here: these helpers are used by the driver (streaming) and inside executors
(distributed shards), and are testable without a JVM.

* :func:`snapshot_maintainer` / :func:`restore_maintainer` turn a maintainer into bytes and
  back.  A snapshot records the maintainer's :meth:`~ringml.Maintainer.description` (query,
  ring configuration, order, strategy, ...); restoring it *like* a given maintainer first
  checks that description (:class:`CheckpointError` naming every part that differs) and
  then binds the state to that maintainer's query and ring object (the ring takes the
  stored state, e.g. its covariance shifts), so the caller's ``query.ring`` reads results.
* :func:`atomic_write` writes a file so that readers see the old or the new content, never
  a mix (temporary file in the same folder, fsync, ``os.replace``, fsync of the folder).
* :func:`snapshot_state` / :func:`restore_state` do the same for a maintainer or a SQL
  :class:`ringml.sql.Database` (catalog, tables, views and their maintainers; restoring it
  like a given database checks :meth:`~ringml.sql.Database.description`: the same tables
  and view definitions).
* :class:`StateCheckpoint` keeps ``(maintainer or database, last applied batch id)`` in one
  file, written atomically, plus an optional write-ahead log of the batches applied since
  the last snapshot (``snapshot_every > 1``), replayed on load; ``load(like=...)`` refuses
  the state of another query or database.

Cost: a snapshot serializes every materialized view (numpy arrays; pickle protocol 5), so
it is linear in the maintained state, not in the batch.  With ``snapshot_every=N`` a batch
costs a log record linear in the batch, and every N-th batch a full snapshot.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
import pandas as pd

from ringml import Maintainer, UpdateBatch

__all__ = [
    "CheckpointError",
    "StateCheckpoint",
    "atomic_write",
    "check_same_description",
    "restore_database",
    "restore_maintainer",
    "restore_state",
    "snapshot_database",
    "snapshot_maintainer",
    "snapshot_state",
]

_FORMAT = 2
_STATE_FILE = "state.pkl"
_LOG_DIR = "log"
_LOG_NAME = re.compile(r"^(\d{12})\.pkl$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, or that does not belong to this pipeline."""


def snapshot_maintainer(maintainer: Maintainer) -> bytes:
    """Serialize a maintainer (views, dictionaries, tuple counts, ring state) to bytes.

    The query, the ring's state and the rest are stored apart (the rest refers to the query
    and ring by name), with the maintainer's :meth:`~ringml.Maintainer.description`, so that
    :func:`restore_maintainer` can check it and rebind the state to the caller's query.
    Raises :class:`~ringml.SchemaError` for a query with opaque (callable) filters.
    """
    maintainer.query.require_checkpointable()
    query, ring = maintainer.query, maintainer.ring
    header = {
        "description": maintainer.description(),
        "ring": (type(ring), pickle.dumps(vars(ring), protocol=5)),
        "query": _dumps(query, {id(ring): "ring"}),
    }
    buffer = io.BytesIO()  # the header, then the maintainer: two pickles, one stream
    pickle.dump(("maintainer", _FORMAT, header), buffer, protocol=5)
    _Pickler(buffer, {id(ring): "ring", id(query): "query"}).dump(maintainer)
    return buffer.getvalue()


def restore_maintainer(
    data: bytes, like: Maintainer | None = None, where: str = "the snapshot"
) -> Maintainer:
    """Inverse of :func:`snapshot_maintainer`.

    With ``like`` (a maintainer built for the same query, order, strategy, ...: see
    :func:`check_same_description`, which raises :class:`CheckpointError` naming what
    differs), the restored maintainer adopts ``like.query`` and its ring object, which takes
    the stored ring's state (e.g. covariance shifts): ``like.query.ring`` then reads the
    restored results, and ``like`` itself should no longer be used (or takes the state:
    :meth:`~ringml.Maintainer.adopt_state`).  A snapshot that cannot be read raises
    :class:`CheckpointError` and leaves ``like`` as it was.
    """
    stream = io.BytesIO(data)
    try:
        loaded = pickle.load(stream)
    except Exception as error:  # noqa: BLE001 - any unpickling failure
        raise CheckpointError(f"{where}: unreadable ({error})") from error
    if not isinstance(loaded, tuple) or len(loaded) != 3 or loaded[0] != "maintainer":
        raise CheckpointError(f"{where}: not a maintainer snapshot")
    if loaded[1] != _FORMAT:
        raise CheckpointError(
            f"{where}: snapshot format {loaded[1]} is not supported (want {_FORMAT}); it was "
            "written by another ringml version: start from a fresh state folder"
        )
    header = loaded[2]
    if like is not None:
        check_same_description(header.get("description"), like.description(), where)
    try:  # everything is read before like's ring changes: a failed restore leaves it as it was
        ring_class, ring_blob = header["ring"]
        ring_state = pickle.loads(ring_blob)
        if like is None:
            ring = ring_class.__new__(ring_class)
            _set_state(ring, ring_state)
            query = _Unpickler(io.BytesIO(header["query"]), {"ring": ring}).load()
        else:
            query, ring = like.query, like.ring
        restored = _Unpickler(stream, {"ring": ring, "query": query}).load()
    except CheckpointError:
        raise
    except Exception as error:  # noqa: BLE001 - any unpickling failure
        raise CheckpointError(f"{where}: unreadable ({error})") from error
    if like is not None:
        _set_state(ring, ring_state)
    return restored


def snapshot_database(database: Any) -> bytes:
    """Serialize a :class:`ringml.sql.Database` (catalog, rows, views and their maintainers;
    not their subscribers) with its :meth:`~ringml.sql.Database.description`."""
    buffer = io.BytesIO()
    pickle.dump(("database", _FORMAT, {"description": database.description()}), buffer, protocol=5)
    pickle.dump(database, buffer, protocol=5)
    return buffer.getvalue()


def restore_database(data: bytes, like: Any = None, where: str = "the snapshot") -> Any:
    """Inverse of :func:`snapshot_database`: a new database.  With ``like``, a snapshot of
    other tables or view definitions raises :class:`CheckpointError` naming what differs
    (``like.adopt_state(restored)`` then moves the state into ``like``)."""
    stream = io.BytesIO(data)
    header = _header(stream, "database", where)
    if like is not None:
        check_same_description(header.get("description"), like.description(), where)
    try:
        return pickle.load(stream)
    except Exception as error:  # noqa: BLE001 - any unpickling failure
        raise CheckpointError(f"{where}: unreadable ({error})") from error


def snapshot_state(target: Any) -> bytes:
    """:func:`snapshot_maintainer` for a maintainer, :func:`snapshot_database` otherwise."""
    if isinstance(target, Maintainer):
        return snapshot_maintainer(target)
    return snapshot_database(target)


def restore_state(data: bytes, like: Any = None, where: str = "the snapshot") -> Any:
    """Inverse of :func:`snapshot_state` (the snapshot says which kind it holds)."""
    kind = _header(io.BytesIO(data), None, where)[0] if data else None
    if kind == "database":
        return restore_database(data, like, where)
    return restore_maintainer(data, like, where)


def _header(stream: io.BytesIO, kind: str | None, where: str) -> Any:
    """The snapshot's header (``kind`` given: checked, its payload; else ``(kind, ...)``)."""
    try:
        loaded = pickle.load(stream)
    except Exception as error:  # noqa: BLE001 - any unpickling failure
        raise CheckpointError(f"{where}: unreadable ({error})") from error
    if not isinstance(loaded, tuple) or len(loaded) != 3:
        raise CheckpointError(f"{where}: not a ringml snapshot")
    if kind is None:
        return loaded
    if loaded[0] != kind:
        raise CheckpointError(f"{where}: holds a {loaded[0]}, not a {kind}")
    if loaded[1] != _FORMAT:
        raise CheckpointError(
            f"{where}: snapshot format {loaded[1]} is not supported (want {_FORMAT}); it was "
            "written by another ringml version: start from a fresh state folder"
        )
    return loaded[2]


def check_same_description(
    saved: Mapping[str, Any] | None, current: Mapping[str, Any], where: str
) -> None:
    """Raise :class:`CheckpointError` unless ``saved`` (a stored
    :meth:`~ringml.Maintainer.description`) equals ``current``, naming every part that
    differs (relations, atoms, ring, free variables, filters, order, ...)."""
    if saved is None:
        raise CheckpointError(
            f"{where} records no query description (written by an older ringml); start from "
            "a fresh state folder"
        )
    keys = sorted(set(saved) | set(current))
    differing = [key for key in keys if saved.get(key) != current.get(key)]
    if differing:
        lines = "\n".join(
            f"  {key}: saved {_show(saved.get(key))}; this one {_show(current.get(key))}"
            for key in differing
        )
        raise CheckpointError(
            f"{where} was saved for another query, maintainer or database (differing: "
            f"{', '.join(differing)}):\n{lines}\nuse a fresh state folder, or the query it "
            "was saved for"
        )


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class _Pickler(pickle.Pickler):
    """Pickles the objects in ``refs`` (by id) as their names."""

    def __init__(self, file: BinaryIO, refs: Mapping[int, str]) -> None:
        super().__init__(file, protocol=5)
        self.refs = refs

    def persistent_id(self, obj: Any) -> str | None:
        return self.refs.get(id(obj))


class _Unpickler(pickle.Unpickler):
    """Resolves the names :class:`_Pickler` wrote to the objects in ``refs``."""

    def __init__(self, file: BinaryIO, refs: Mapping[str, Any]) -> None:
        super().__init__(file)
        self.refs = refs

    def persistent_load(self, pid: Any) -> Any:
        if pid not in self.refs:
            raise CheckpointError(f"snapshot refers to an unknown object {pid!r}")
        return self.refs[pid]


def _dumps(obj: Any, refs: Mapping[int, str]) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, refs).dump(obj)
    return buffer.getvalue()


def _set_state(obj: Any, state: dict[str, Any]) -> None:
    """What unpickling does to a new object, done to ``obj`` (e.g. the caller's ring)."""
    if hasattr(type(obj), "__setstate__"):
        obj.__setstate__(state)
    else:
        obj.__dict__.update(state)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically and durably (POSIX local file systems)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # a leading dot: Spark and pyarrow readers skip the file while it is being written
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class LoadedState:
    """What :meth:`StateCheckpoint.load` found."""

    maintainer: Maintainer | Any | None  # a Maintainer, or a ringml.sql.Database
    batch_id: int  # last applied batch id (-1: none)
    meta: dict[str, Any] = field(default_factory=dict)
    replayed: list[int] = field(default_factory=list)  # logged batch ids re-applied on load


class StateCheckpoint:
    """``(maintainer, last applied batch id, meta)`` in ``directory``, written atomically.
    The maintainer may also be a :class:`ringml.sql.Database` (its batches are of tables).

    With ``snapshot_every=1`` every :meth:`commit` writes a full snapshot.  With ``N > 1`` a
    commit writes the snapshot only every N-th time and otherwise a log record of the
    batch's update batches; :meth:`load` restores the snapshot and re-applies the logged
    batches after it, in batch-id order, so a crash loses nothing that was committed.
    """

    def __init__(self, directory: str | os.PathLike[str], snapshot_every: int = 1) -> None:
        if snapshot_every < 1:
            raise ValueError("snapshot_every must be >= 1")
        self.directory = os.fspath(directory)
        self.snapshot_every = int(snapshot_every)
        self._since_snapshot = 0

    @property
    def state_path(self) -> str:
        return os.path.join(self.directory, _STATE_FILE)

    def exists(self) -> bool:
        return os.path.exists(self.state_path) or bool(self._log_ids())

    def load(self, like: Maintainer | None = None) -> LoadedState:
        """The latest committed state (maintainer None and batch id -1 when there is none).

        With ``like``, a state saved for another query, order, strategy, ... raises
        :class:`CheckpointError` naming what differs, and the restored maintainer adopts
        ``like``'s query and ring (see :func:`restore_maintainer`).  A file that cannot be
        read or re-applied raises :class:`CheckpointError` naming it; ``like`` stays as it was.
        """
        # every file is read and checked before the restore changes like's ring
        record = (
            _read_record(self.state_path, "maintainer") if os.path.exists(self.state_path) else None
        )
        batch_id = -1 if record is None else int(record["batch_id"])
        logged = [
            (log_id, _read_record(self._log_path(log_id), "batches"))
            for log_id in self._log_ids()
            if log_id > batch_id
        ]
        if record is None:
            if logged:
                raise CheckpointError(
                    f"{self.directory}: batch {logged[0][0]} is logged but there is no snapshot"
                )
            self._since_snapshot = 0
            return LoadedState(None, -1, {}, [])
        before = dict(vars(like.ring)) if isinstance(like, Maintainer) else None
        maintainer = self._restore(record["maintainer"], like, f"the state in {self.directory}")
        meta = dict(record.get("meta") or {})
        for log_id, entry in logged:
            try:
                maintainer.apply(_batches_from_log(entry["batches"]))
            except Exception as error:  # noqa: BLE001 - the restore failed: like stays as it was
                if before is not None:
                    vars(like.ring).clear()
                    vars(like.ring).update(before)
                raise CheckpointError(
                    f"{self._log_path(log_id)}: its batches cannot be re-applied ({error})"
                ) from error
            batch_id, meta = log_id, dict(entry.get("meta") or meta)
        self._since_snapshot = len(logged)
        return LoadedState(maintainer, batch_id, meta, [log_id for log_id, _ in logged])

    def commit(
        self,
        maintainer: Maintainer,
        batch_id: int,
        batches: Sequence[UpdateBatch] = (),
        meta: dict[str, Any] | None = None,
        force_snapshot: bool = False,
    ) -> None:
        """Record that ``batches`` (already applied to ``maintainer``) are batch ``batch_id``."""
        self._since_snapshot += 1
        if force_snapshot or self._since_snapshot >= self.snapshot_every:
            self.save_snapshot(maintainer, batch_id, meta)
            return
        record = {"format": _FORMAT, "batch_id": int(batch_id), "meta": dict(meta or {})}
        record["batches"] = [
            (b.relation, b.rows, None if b.multiplicity is None else np.asarray(b.multiplicity))
            for b in batches
        ]
        atomic_write(self._log_path(batch_id), pickle.dumps(record, protocol=5))

    def save_snapshot(
        self, maintainer: Maintainer, batch_id: int, meta: dict[str, Any] | None = None
    ) -> None:
        """Write a full snapshot and drop the log records it covers."""
        record = {
            "format": _FORMAT,
            "batch_id": int(batch_id),
            "meta": dict(meta or {}),
            "maintainer": self._snapshot(maintainer),
        }
        atomic_write(self.state_path, pickle.dumps(record, protocol=5))
        self._since_snapshot = 0
        for log_id in self._log_ids():
            if log_id <= batch_id:
                with contextlib.suppress(OSError):
                    os.unlink(self._log_path(log_id))

    def _snapshot(self, target: Any) -> bytes:
        """The snapshot bytes of ``target`` (a subclass may store other kinds of state)."""
        return snapshot_state(target)

    def _restore(self, data: bytes, like: Any, where: str) -> Any:
        """Inverse of :meth:`_snapshot`."""
        return restore_state(data, like, where)

    def _log_path(self, batch_id: int) -> str:
        return os.path.join(self.directory, _LOG_DIR, f"{int(batch_id):012d}.pkl")

    def _log_ids(self) -> list[int]:
        folder = os.path.join(self.directory, _LOG_DIR)
        if not os.path.isdir(folder):
            return []
        ids = [int(m.group(1)) for name in os.listdir(folder) if (m := _LOG_NAME.match(name))]
        return sorted(ids)


def _read_record(path: str, content: str) -> dict[str, Any]:
    """The record pickled in ``path`` (a state file or a log record holding ``content``);
    :class:`CheckpointError` naming the file when it cannot be read or is not one."""
    with open(path, "rb") as handle:
        try:
            record = pickle.load(handle)
        except Exception as error:  # noqa: BLE001 - any unpickling failure
            raise CheckpointError(f"{path}: unreadable ({error})") from error
    if not isinstance(record, dict) or not {"format", "batch_id", content} <= record.keys():
        raise CheckpointError(f"{path}: not a ringml state checkpoint")
    if record["format"] != _FORMAT:
        raise CheckpointError(
            f"{path}: state format {record['format']} is not supported (want {_FORMAT}); "
            "start from a fresh state folder"
        )
    return record


def _batches_from_log(items) -> list[UpdateBatch]:
    return [
        UpdateBatch(relation, pd.DataFrame(rows), None if mult is None else np.asarray(mult))
        for relation, rows, mult in items
    ]
