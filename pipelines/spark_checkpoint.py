"""Durable, atomic snapshots of a :class:`ringml.Maintainer` for the Spark pipelines.

No pyspark here: these helpers are used by the driver (streaming) and inside executors
(distributed shards), and are testable without a JVM.

* :func:`snapshot_maintainer` / :func:`restore_maintainer` turn a maintainer into bytes and
  back.  A plain ``pickle`` of a maintainer is not enough today: the engine keys its view
  stores by ``id(node)``, which unpickled nodes do not keep, so the snapshot re-keys the
  stores by the node's position in the view tree (pre-order) and restores the identity map.
* :func:`atomic_write` writes a file so that readers see the old or the new content, never
  a mix (temporary file in the same folder, fsync, ``os.replace``, fsync of the folder).
* :class:`StateCheckpoint` keeps ``(maintainer, last applied batch id)`` in one file, written
  atomically, plus an optional write-ahead log of the batches applied since the last
  snapshot (``snapshot_every > 1``), replayed on load.

Cost: a snapshot serializes every materialized view (numpy arrays; pickle protocol 5), so
it is linear in the maintained state, not in the batch.  With ``snapshot_every=N`` a batch
costs a log record linear in the batch, and every N-th batch a full snapshot.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ringml import Maintainer, UpdateBatch

__all__ = [
    "CheckpointError",
    "StateCheckpoint",
    "atomic_write",
    "restore_maintainer",
    "snapshot_maintainer",
]

_FORMAT = 1
_STATE_FILE = "state.pkl"
_LOG_DIR = "log"
_LOG_NAME = re.compile(r"^(\d{12})\.pkl$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, or that does not belong to this pipeline."""


def snapshot_maintainer(maintainer: Maintainer) -> bytes:
    """Serialize a maintainer (views, dictionaries, tuple counts, ring shifts) to bytes."""
    if "__setstate__" in type(maintainer).__dict__:  # the engine pickles itself correctly
        return pickle.dumps(("pickle", _FORMAT, maintainer), protocol=5)
    stores = getattr(maintainer, "_stores", None)
    state = dict(maintainer.__dict__)
    if stores is not None:
        position = {id(node): i for i, node in enumerate(maintainer.tree.nodes())}
        missing = [key for key in stores if key not in position]
        if missing:
            raise CheckpointError("a view store belongs to no node of the view tree")
        state["_stores"] = {position[key]: store for key, store in stores.items()}
    return pickle.dumps(("state", _FORMAT, type(maintainer), state), protocol=5)


def restore_maintainer(data: bytes) -> Maintainer:
    """Inverse of :func:`snapshot_maintainer`."""
    loaded = pickle.loads(data)
    if not isinstance(loaded, tuple) or loaded[0] not in ("pickle", "state"):
        raise CheckpointError("not a maintainer snapshot")
    if loaded[1] != _FORMAT:
        raise CheckpointError(f"snapshot format {loaded[1]} is not supported (want {_FORMAT})")
    if loaded[0] == "pickle":
        return loaded[2]
    cls, state = loaded[2], loaded[3]
    maintainer = cls.__new__(cls)
    maintainer.__dict__.update(state)
    if "_stores" in state:
        nodes = maintainer.tree.nodes()
        maintainer._stores = {id(nodes[i]): store for i, store in state["_stores"].items()}
    return maintainer


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

    maintainer: Maintainer | None
    batch_id: int  # last applied batch id (-1: none)
    meta: dict[str, Any] = field(default_factory=dict)
    replayed: list[int] = field(default_factory=list)  # logged batch ids re-applied on load


class StateCheckpoint:
    """``(maintainer, last applied batch id, meta)`` in ``directory``, written atomically.

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

    def load(self) -> LoadedState:
        """The latest committed state (maintainer None and batch id -1 when there is none)."""
        maintainer, batch_id, meta = None, -1, {}
        if os.path.exists(self.state_path):
            with open(self.state_path, "rb") as handle:
                try:
                    record = pickle.load(handle)
                except Exception as error:  # noqa: BLE001 - any unpickling failure
                    raise CheckpointError(f"{self.state_path}: unreadable ({error})") from error
            if not isinstance(record, dict) or record.get("format") != _FORMAT:
                raise CheckpointError(f"{self.state_path}: not a ringml state checkpoint")
            maintainer = restore_maintainer(record["maintainer"])
            batch_id, meta = int(record["batch_id"]), dict(record.get("meta") or {})
        replayed = []
        for log_id in self._log_ids():
            if log_id <= batch_id:
                continue
            with open(self._log_path(log_id), "rb") as handle:
                record = pickle.load(handle)
            if maintainer is None:
                raise CheckpointError(
                    f"{self.directory}: batch {log_id} is logged but there is no snapshot"
                )
            maintainer.apply(_batches_from_log(record["batches"]))
            batch_id, meta = log_id, dict(record.get("meta") or meta)
            replayed.append(log_id)
        self._since_snapshot = len(replayed)
        return LoadedState(maintainer, batch_id, meta, replayed)

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
            "maintainer": snapshot_maintainer(maintainer),
        }
        atomic_write(self.state_path, pickle.dumps(record, protocol=5))
        self._since_snapshot = 0
        for log_id in self._log_ids():
            if log_id <= batch_id:
                with contextlib.suppress(OSError):
                    os.unlink(self._log_path(log_id))

    def _log_path(self, batch_id: int) -> str:
        return os.path.join(self.directory, _LOG_DIR, f"{int(batch_id):012d}.pkl")

    def _log_ids(self) -> list[int]:
        folder = os.path.join(self.directory, _LOG_DIR)
        if not os.path.isdir(folder):
            return []
        ids = [int(m.group(1)) for name in os.listdir(folder) if (m := _LOG_NAME.match(name))]
        return sorted(ids)


def _batches_from_log(items) -> list[UpdateBatch]:
    return [
        UpdateBatch(relation, pd.DataFrame(rows), None if mult is None else np.asarray(mult))
        for relation, rows, mult in items
    ]
