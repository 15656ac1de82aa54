"""Materialized views: keys in a :class:`KeyIndex`, payloads in one ring batch by slot.

A :class:`ViewStore` supports the operations F-IVM's storage contract asks for, on whole
arrays: lookup of full keys, enumeration of the entries matching a partial key (a secondary
index, built lazily and reused until the key set changes), accumulation of a delta, and
removal of keys whose payload became zero.
"""

from __future__ import annotations

import numpy as np

from .keyindex import KeyIndex
from .rings.base import Ring, RingError


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of a 1-d array; no sort when it is sorted."""
    if values.size > 1 and (values[1:] >= values[:-1]).all():
        change = values[1:] != values[:-1]
        inverse = np.zeros(values.size, dtype=np.intp)
        np.cumsum(change, out=inverse[1:])
        return values[np.concatenate(([True], change))], inverse
    unique, inverse = np.unique(values, return_inverse=True)
    return unique, inverse.ravel()


def group_rows(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows of an (n, w) int64 array and the group id of every row."""
    n, w = columns.shape
    if w == 0:
        return np.zeros((1 if n else 0, 0), dtype=np.int64), np.zeros(n, dtype=np.int64)
    if w == 1:
        unique, inverse = _unique_inverse(columns[:, 0])
        return unique[:, None], inverse
    if n and columns.min() >= 0:  # dense codes: pack each row into one int64 and sort that
        bits = [max(int(c).bit_length(), 1) for c in columns.max(axis=0)]
        if sum(bits) <= 63:
            # the first column in the highest bits: groups come out in lexicographic order
            shifts = (sum(bits) - np.cumsum(bits)).astype(np.int64)
            packed = (columns << shifts).sum(axis=1)
            unique_packed, inverse = _unique_inverse(packed)
            masks = (np.int64(1) << np.asarray(bits, dtype=np.int64)) - 1
            unique = (unique_packed[:, None] >> shifts) & masks
            return unique, inverse
    unique, inverse = np.unique(columns, axis=0, return_inverse=True)
    return unique, inverse.ravel()


class ViewStore:
    """A keyed relation over a ring (a materialized view or a stored base relation)."""

    def __init__(
        self,
        keys: tuple[str, ...],
        ring: Ring,
        journal: list | None = None,
        compensated: bool = True,
    ) -> None:
        """``journal``: where every addition is recorded so that it can be undone;
        ``compensated``: floating payloads are summed with compensation (the ring decides
        whether it has any)."""
        self.keys = keys
        self.journal = journal
        self.ring = ring
        self.compensated = compensated
        self.index = KeyIndex(max(len(keys), 1))
        self.payload = ring.batch_accumulator(self.index.capacity, compensated)
        # exact number of derivations per slot (F-IVM Remark 1): a key exists while it is > 0;
        # the payloads' own counts where the ring keeps them (Ring.counts_derivations)
        self._derived = ring.counts_derivations
        self._support = None if self._derived else np.zeros(self.index.capacity, np.int64)
        self._secondary: dict[tuple[int, ...], PartialIndex] = {}

    def __setstate__(self, state: dict) -> None:
        if "support" in state:  # pickled with its own array of derivation counts
            state["_support"] = state.pop("support")
            state["_derived"] = False
        self.__dict__.update(state)

    @property
    def support(self) -> np.ndarray:
        """The exact number of derivations of every slot (int64, 0 where no key lives)."""
        if self._derived:
            return self.ring.batch_derivations(self.payload)
        return self._support

    def __len__(self) -> int:
        return len(self.index)

    def _codes(self, codes: np.ndarray) -> np.ndarray:
        if not self.keys:  # the empty key: one row of a constant 0
            return np.zeros((codes.shape[0], 1), dtype=np.int64)
        return codes

    def lookup(self, codes: np.ndarray) -> np.ndarray:
        """Slots of full keys (n, len(keys)); -1 where absent."""
        return self.index.lookup(self._codes(codes))

    def take(self, slots: np.ndarray):
        """Payloads at ``slots``."""
        return self.ring.batch_take(self.payload, slots)

    def entries(self) -> tuple[np.ndarray, object]:
        """All (key codes, payloads) currently stored."""
        slots = self.index.live_slots()
        codes = self.index.keys[slots][:, : len(self.keys)]
        return codes, self.take(slots)

    def add(self, codes: np.ndarray, payload, support: np.ndarray | None = None) -> None:
        """Accumulate payloads at *unique* keys and drop the keys that vanished.

        With ``support`` (the exact derivation counts of the delta) a key vanishes when its
        count reaches 0, and its payload is reset to exactly zero, whatever rounding residue
        it held; without it, when its payload is zero up to rounding.
        """
        if codes.shape[0] == 0:
            return
        slots, new = self.index.get_or_insert(self._codes(codes))
        self._fit_capacity()
        if self.journal is not None:
            # compensated sums subtract back exactly; plain ones keep the rows they overwrite
            # (x + d - d need not be x in float64: a huge d absorbs x)
            before = None
            if not self.compensated:
                counts = None if self._derived else self._support[slots].copy()
                before = (self.ring.batch_take(self.payload, slots), counts)
            self.journal.append((self, (codes, payload, support, new, before)))
        try:
            self.payload = self.ring.batch_scatter_add(self.payload, slots, payload)
        except RingError:  # the ring refused the delta (e.g. an overflow): drop the new keys
            if self.journal is not None:
                self.journal.pop()
            if new.any():
                self.index.remove(slots[new])
            raise
        if support is not None:
            if not self._derived:  # (derived counts were added with the payloads)
                self._support[slots] += support
            zero = self.support[slots] == 0
        else:
            zero = self.ring.batch_is_negligible(self.ring.batch_take(self.payload, slots))
        if zero.any():
            dead = slots[zero]
            self.payload = self.ring.batch_clear(self.payload, dead)
            if not self._derived:
                self._support[dead] = 0
            self.index.remove(dead)
        if self._secondary and (new.any() or zero.any()):
            added, removed = slots[new & ~zero], int(zero.sum())
            for partial in self._secondary.values():
                partial.added(added)
                partial.removed(removed)

    def _fit_capacity(self) -> None:
        """Grow the payloads and counts to the index's capacity."""
        if self.index.capacity > self.ring.batch_len(self.payload):
            self.payload = self.ring.batch_resize(self.payload, self.index.capacity)
            if not self._derived:
                grown = np.zeros(self.index.capacity, dtype=np.int64)
                grown[: self._support.size] = self._support
                self._support = grown

    def undo(self, record: tuple) -> None:
        """Take back an addition recorded in the journal: subtract it from compensated sums
        (exact), restore the rows it overwrote in plain ones."""
        codes, payload, support, new, before = record
        journal, self.journal = self.journal, None
        try:
            if before is None:
                negated = None if support is None else -support
                self.add(codes, self.ring.batch_neg(payload), negated)
            else:
                self._restore(self._codes(codes), new, *before)
        finally:
            self.journal = journal

    def _restore(self, keys: np.ndarray, new: np.ndarray, payload, support: np.ndarray) -> None:
        """Keys the addition created go again; the others get back their payloads and
        counts (re-inserted if the addition removed them)."""
        slots = self.index.lookup(keys)
        created = slots[new & (slots >= 0)]
        if created.size:
            self.payload = self.ring.batch_clear(self.payload, created)
            if not self._derived:
                self._support[created] = 0
            self.index.remove(created)
        kept = np.flatnonzero(~new)
        if kept.size:
            slots, _ = self.index.get_or_insert(keys[kept])
            self._fit_capacity()
            self.payload = self.ring.batch_clear(self.payload, slots)
            self.payload = self.ring.batch_scatter_add(
                self.payload, slots, self.ring.batch_take(payload, kept)
            )
            if not self._derived:
                self._support[slots] = support[kept]
        self._secondary.clear()

    def matches(
        self, positions: tuple[int, ...], probe: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (probe row, slot) with ``key[positions] == probe[row]`` (a secondary index,
        kept up to date across additions: see :class:`PartialIndex`)."""
        partial = self._secondary.get(positions)
        if partial is None:
            partial = self._secondary[positions] = PartialIndex(self.index, positions)
        return partial.matches(probe)


#: A secondary index is rebuilt once its pending and removed slots pass a quarter of its
#: runs, but never for fewer than this many.
REBUILD_MIN = 1024


def _runs(sub: np.ndarray, slots: np.ndarray) -> tuple[KeyIndex, np.ndarray, np.ndarray]:
    """Slots grouped by their sub-keys: an index of the distinct sub-keys, the slots in
    group order and each group's offsets (a CSR layout)."""
    unique, groups = group_rows(sub)
    sub_index = KeyIndex(sub.shape[1], max(unique.shape[0], 4))
    sub_ids, _ = sub_index.get_or_insert(unique)
    row_group = sub_ids[groups]
    order = np.argsort(row_group, kind="stable")
    offsets = np.zeros(sub_index.capacity + 1, dtype=np.int64)
    np.cumsum(np.bincount(row_group, minlength=sub_index.capacity), out=offsets[1:])
    return sub_index, slots[order], offsets


def _expand(runs, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (probe row, slot) of the slots of every probe row's group."""
    sub_index, ordered_slots, offsets = runs
    group = sub_index.lookup(probe)
    rows = np.flatnonzero(group >= 0)
    group = group[rows]
    start = offsets[group]
    counts = offsets[group + 1] - start
    probe_rows = np.repeat(rows, counts)
    run_start = np.repeat(start - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    return probe_rows, ordered_slots[np.arange(probe_rows.size) + run_start]


class PartialIndex:
    """A store's slots by part of their key, maintained incrementally.

    Runs of slots per sub-key are built once from the live slots; slots added later are
    kept as *pending* and matched directly.  A run's slot may have been removed since
    (dropped: not live) or reused for another key (dropped: a reused slot is pending, and
    pending slots are matched from the pending side only).  Once pending or removed slots
    make up a quarter of the runs, the runs are rebuilt, so a join pays amortized time in
    proportion to its probes and the change, not to the stored view.
    """

    def __init__(self, index: KeyIndex, positions: tuple[int, ...]) -> None:
        self.index = index
        self.positions = list(positions)
        self._build()

    def _build(self) -> None:
        slots = self.index.live_slots()
        self.runs = _runs(self.index.keys[slots][:, self.positions], slots)
        self.built = slots.size
        self.pending: list[np.ndarray] = []
        self.is_pending = np.zeros(self.index.capacity, dtype=bool)
        self.stale = 0

    def added(self, slots: np.ndarray) -> None:
        """Slots that got (new) keys."""
        if slots.size:
            if self.index.capacity > self.is_pending.size:
                grown = np.zeros(self.index.capacity, dtype=bool)
                grown[: self.is_pending.size] = self.is_pending
                self.is_pending = grown
            self.is_pending[slots] = True
            self.pending.append(slots)

    def removed(self, count: int) -> None:
        self.stale += count

    def matches(self, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pending = sum(p.size for p in self.pending)
        if 4 * (pending + self.stale) > max(self.built, REBUILD_MIN):
            self._build()
            pending = 0
        rows, slots = _expand(self.runs, probe)
        if pending or self.stale:  # drop removed slots, and reused ones (they are pending)
            keep = self.index.live[slots] & ~self.is_pending[slots]
            rows, slots = rows[keep], slots[keep]
        if pending:
            fresh = np.unique(np.concatenate(self.pending))
            fresh = fresh[self.index.live[fresh] & self.is_pending[fresh]]
            if fresh.size:
                more_rows, more_slots = _expand(
                    _runs(self.index.keys[fresh][:, self.positions], fresh), probe
                )
                rows = np.concatenate([rows, more_rows])
                slots = np.concatenate([slots, more_slots])
        return rows, slots
