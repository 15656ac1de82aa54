"""Materialized views: keys in a :class:`KeyIndex`, payloads in one ring batch by slot.

A :class:`ViewStore` supports the operations F-IVM's storage contract asks for, on whole
arrays: lookup of full keys, enumeration of the entries matching a partial key (a secondary
index, built lazily and reused until the key set changes), accumulation of a delta, and
removal of keys whose payload became zero.
"""

from __future__ import annotations

import threading

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


#: codes are grouped without a sort while below this bound (a mark of 8 bytes per code)
_MARKED_CODES = 1 << 24
_marks = threading.local()  # per thread: -1 per code, grown on demand (see group_codes)


def group_codes(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``group_rows`` of one column of codes (non-negative, below ``_MARKED_CODES``) without
    a sort: the groups in order of first appearance, found through an array of one mark per
    code (shared by the thread's views, left all -1).  None for other keys."""
    n = codes.size
    if not n:
        return None
    low, high = int(codes.min()), int(codes.max())
    if low < 0 or high >= _MARKED_CODES:
        return None
    marks = getattr(_marks, "array", None)
    if marks is None or high >= marks.size:
        grown = 1024 if marks is None else min(2 * marks.size, _MARKED_CODES)
        marks = _marks.array = np.full(max(high + 1, grown), -1, dtype=np.int64)
    rows = np.arange(n)
    marks[codes[::-1]] = rows[::-1]  # a row of every code (its first: the last write wins)
    first = marks[codes]
    marks[codes] = -1
    lead = first == rows
    rank = np.cumsum(lead) - 1
    return codes[lead][:, None], rank[first]


class ViewStore:
    """A keyed relation over a ring (a materialized view or a stored base relation)."""

    #: When a list, each addition appends the payloads it is about to change.
    previous: list | None = None

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

    def __getstate__(self) -> dict:
        # the secondary indexes travel too: rebuilt, they would list a probe's matches in
        # another order, and a restored store would sum floats in another order
        state = dict(self.__dict__)
        state["_secondary"] = {}
        state["_partial_indexes"] = self._secondary
        return state

    def __setstate__(self, state: dict) -> None:
        if "support" in state:  # pickled with its own array of derivation counts
            state["_support"] = state.pop("support")
            state["_derived"] = False
        # pickles of older versions held older secondary indexes (or none): rebuilt on use
        state["_secondary"] = state.pop("_partial_indexes", {})
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
        if self.previous is not None:
            self.previous.append(self.ring.batch_take(self.payload, slots))
        # compensated sums subtract back exactly; plain ones keep the rows they overwrite
        # (x + d - d need not be x in float64: a huge d absorbs x)
        saving = self.journal is not None and not self.compensated
        try:
            if saving:
                self.payload, rows = self.ring.batch_scatter_add_saving(
                    self.payload, slots, payload
                )
            else:
                self.payload = self.ring.batch_scatter_add(self.payload, slots, payload)
        except RingError:  # the ring refused the delta (e.g. an overflow): drop the new keys
            if new.any():
                self.index.remove(slots[new])
            raise
        if self.journal is not None:
            before = None
            if saving:
                before = (rows, None if self._derived else self._support[slots].copy())
            self.journal.append((self, (codes, payload, support, new, before)))
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
        if self._secondary and new.any():
            added = slots[new & ~zero]
            for partial in self._secondary.values():
                partial.added(added)

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


#: A secondary index is rebuilt from scratch once the entries of removed (or reused) slots
#: pass a quarter of its entries, but never for fewer than this many.
REBUILD_MIN = 1024

#: A secondary index settles the slots added since its last probe into a level once they
#: come in more than this many additions (or outnumber its entries).
PENDING_MAX = 64

#: Levels of a secondary index: a level is merged into the one before it while that one
#: holds at most this many times its entries (so there are O(log_GROWTH n) levels).
GROWTH = 4


class _Level:
    """Slots sorted by the id of their sub-key (``groups`` ascending, ``slots`` alongside)."""

    __slots__ = ("number", "groups", "slots")

    def __init__(self, number: int, groups: np.ndarray, slots: np.ndarray) -> None:
        self.number, self.groups, self.slots = number, groups, slots


class PartialIndex:
    """A store's slots by part of their key, maintained incrementally.

    Sub-keys get ids in one :class:`KeyIndex`; the slots sit in *levels* (the logarithmic
    method): slots added since the last probe form a new level, sorted by sub-key id, and a
    level is merged with the one before it while that one is not more than ``GROWTH`` times
    larger.  A probe looks its sub-keys up once and searches every level, so a join pays
    time in proportion to its probes, the change and log n, never to the stored view.  An
    entry is valid while its slot is live and its level is the last that took the slot
    (``owner``): removed and reused slots leave invalid entries behind, and once those are
    a quarter of all entries everything is rebuilt.
    """

    def __init__(self, index: KeyIndex, positions: tuple[int, ...]) -> None:
        self.index = index
        self.positions = list(positions)
        self._build()

    def _build(self) -> None:
        slots = self.index.live_slots()
        self.sub_index = KeyIndex(len(self.positions), max(slots.size, 4))
        self.owner = np.full(self.index.capacity, -1, dtype=np.int64)
        self.levels: list[_Level] = []
        self.pending: list[np.ndarray] = []
        self._pending_slots = 0
        self.entries = 0
        self._numbers = 0
        if slots.size:
            self.levels.append(self._level(self._group_ids(slots), slots))

    def _group_ids(self, slots: np.ndarray) -> np.ndarray:
        """Sub-key ids of ``slots``' keys (new sub-keys get ids)."""
        sub = self.index.keys[slots][:, self.positions]
        ids = self.sub_index.lookup(sub)
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            unique, inverse = group_rows(sub[missing])
            fresh, _ = self.sub_index.get_or_insert(unique)
            ids[missing] = fresh[inverse]
        return ids

    def _level(self, groups: np.ndarray, slots: np.ndarray) -> _Level:
        order = np.argsort(groups, kind="stable")
        level = _Level(self._numbers, groups[order], slots[order])
        self._numbers += 1
        self.owner[slots] = level.number
        self.entries += slots.size
        return level

    def _valid(self, level: _Level) -> np.ndarray:
        """Mask of the level's entries whose slots are live and still its own."""
        return self.index.live[level.slots] & (self.owner[level.slots] == level.number)

    def added(self, slots: np.ndarray) -> None:
        """Slots that got (new) keys; settled into a level once they are many (an index
        nobody probes for a while must not keep every slot added meanwhile)."""
        if slots.size:
            self.pending.append(slots)
            self._pending_slots += slots.size
            if len(self.pending) > PENDING_MAX or self._pending_slots > max(
                self.entries, REBUILD_MIN
            ):
                self._settle()

    def _settle(self) -> None:
        """Take the pending slots; rebuild once stale entries are a quarter of them."""
        if self.pending:
            self._take_pending()
        if 4 * (self.entries - len(self.index)) > max(self.entries, REBUILD_MIN):
            self._build()

    def _take_pending(self) -> None:
        """The slots added since the last probe become a level; merge the tail levels."""
        fresh = np.unique(np.concatenate(self.pending))
        self.pending, self._pending_slots = [], 0
        if self.index.capacity > self.owner.size:
            grown = np.full(self.index.capacity, -1, dtype=np.int64)
            grown[: self.owner.size] = self.owner
            self.owner = grown
        fresh = fresh[self.index.live[fresh]]
        if not fresh.size:
            return
        self.levels.append(self._level(self._group_ids(fresh), fresh))
        while len(self.levels) > 1 and (
            self.levels[-2].slots.size <= GROWTH * self.levels[-1].slots.size
        ):
            newer, older = self.levels.pop(), self.levels.pop()
            self.entries -= older.slots.size + newer.slots.size
            keep_old, keep_new = self._valid(older), self._valid(newer)
            groups = np.concatenate([older.groups[keep_old], newer.groups[keep_new]])
            slots = np.concatenate([older.slots[keep_old], newer.slots[keep_new]])
            self.levels.append(self._level(groups, slots))

    def matches(self, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (probe row, slot) with the slot's sub-key equal to the probe row."""
        self._settle()
        stale = self.entries - len(self.index)  # entries of removed or reused slots
        groups = self.sub_index.lookup(probe)
        rows = np.flatnonzero(groups >= 0)
        groups = groups[rows]
        found_rows, found_slots = [], []
        for level in self.levels:
            start = np.searchsorted(level.groups, groups, "left")
            counts = np.searchsorted(level.groups, groups, "right") - start
            total = int(counts.sum())
            if not total:
                continue
            level_rows = np.repeat(rows, counts)
            offset = np.repeat(start - (np.cumsum(counts) - counts), counts)
            slots = level.slots[np.arange(total) + offset]
            if stale:
                keep = self.index.live[slots] & (self.owner[slots] == level.number)
                level_rows, slots = level_rows[keep], slots[keep]
            found_rows.append(level_rows)
            found_slots.append(slots)
        if not found_rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if len(found_rows) == 1:
            return found_rows[0], found_slots[0]
        return np.concatenate(found_rows), np.concatenate(found_slots)
