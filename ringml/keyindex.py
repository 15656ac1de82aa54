"""A vectorized open-addressing hash map from rows of int64 key columns to dense slot ids.

Views and dictionaries keep their keys here: every operation takes whole arrays of keys and
runs a handful of numpy passes (one per probe round), never a Python loop per key.  Slots are
dense integers that index the payload arrays of a view; removed slots are reused.

Single-column keys that are non-negative integers below ``_DENSITY`` times their number
(dictionary codes, most surrogate keys) use a direct-address array instead of the hash
table: one gather per lookup, in at most 64 bytes per key (the table's cells take 32-64).
An index leaves direct addressing when a key breaks that rule, and comes back to it when
its table is rebuilt and its keys are dense again (e.g. keys drawn from a wide range fill
it in).
"""

from __future__ import annotations

import numpy as np

_EMPTY = -1
_TOMBSTONE = -2
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_SHIFT_A = np.uint64(31)
_SHIFT_B = np.uint64(29)
_WINDOW = 8
# direct addressing while every key is in [0, max(_DENSITY * keys, _DIRECT_FREE)): 8 bytes
# per possible key, at most 64 per key held; the hash table's cells take 32-64 (4-8 cells
# of 8 bytes per key)
_DENSITY = 8
_DIRECT_FREE = 1 << 16


def hash_rows(keys: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """64-bit mixing hash of each row of an (n, w) int64 array (or of w int64 columns)."""
    columns = list(keys) if isinstance(keys, list) else [keys[:, j] for j in range(keys.shape[1])]
    n = columns[0].shape[0] if columns else keys.shape[0]
    h = np.zeros(n, dtype=np.uint64)
    shifted = np.empty(n, dtype=np.uint64)
    # in-place ufuncs with out=: the same arithmetic as h ^= c; h *= G; h ^= h >> 31, without
    # a temporary array per operation
    for column in columns:
        np.bitwise_xor(h, column.view(np.uint64), out=h)
        np.multiply(h, _GOLDEN, out=h)
        np.right_shift(h, _SHIFT_A, out=shifted)
        np.bitwise_xor(h, shifted, out=h)
    np.multiply(h, _MIX, out=h)
    np.right_shift(h, _SHIFT_B, out=shifted)
    np.bitwise_xor(h, shifted, out=h)
    return h


class KeyIndex:
    """Hash map from key rows (int64, fixed width) to slots ``0..capacity``.

    ``hashed=True`` (width 1 only): the keys are already uniform 64-bit hashes (e.g. tuple
    fingerprints), so each key is its own hash: no :func:`hash_rows` pass, no direct
    addressing (such keys are never dense).
    """

    hashed = False  # indexes pickled before the flag existed hash their keys
    direct_addressing = True  # width-1 unhashed keys may be addressed directly when dense

    def __init__(self, width: int, capacity: int = 16, hashed: bool = False) -> None:
        if hashed and width != 1:
            raise ValueError("hashed keys have width 1")
        self.width = width
        self.hashed = hashed
        capacity = max(int(capacity), 4)
        self.keys = np.zeros((capacity, width), dtype=np.int64)
        self.hashes = np.zeros(capacity, dtype=np.uint64)
        self.live = np.zeros(capacity, dtype=bool)
        self._free: list[np.ndarray] = []
        self._next_slot = 0
        self._size = 0
        self._tombstones = 0
        self._table = np.full(self._table_size_for(capacity), _EMPTY, dtype=np.int64)
        # direct addressing for width-1 keys in [0, len(self._direct)); None once abandoned
        self._direct: np.ndarray | None = (
            np.full(64, _EMPTY, dtype=np.int64) if width == 1 and not hashed else None
        )

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return self._size

    @property
    def capacity(self) -> int:
        """Number of slots the payload arrays must hold."""
        return self.keys.shape[0]

    def live_slots(self) -> np.ndarray:
        """Slots in use, in increasing order."""
        return np.flatnonzero(self.live)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of every key row, or -1 where the key is absent."""
        keys = self._check(keys)
        if keys.shape[0] == 0 or self._size == 0:
            return np.full(keys.shape[0], -1, dtype=np.int64)
        if self._direct is not None:
            column = keys[:, 0]
            # one comparison: a negative key read as unsigned is beyond every size
            inside = column.view(np.uint64) < self._direct.size
            if inside.all():
                return self._direct[column]
            found = np.full(column.size, -1, dtype=np.int64)
            found[inside] = self._direct[column[inside]]
            return found
        found, _ = self._probe(keys, self._hash(keys))
        return found

    # ------------------------------------------------------------------ updates
    def get_or_insert(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of *unique* key rows, inserting the absent ones; also the mask of new keys."""
        keys = self._check(keys)
        n = keys.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
        self._reserve(n)
        if self._addresses_directly(keys[:, 0]):
            return self._get_or_insert_direct(keys)
        if self._table_full(n):
            self._rehash(self._size + n)
        h = self._hash(keys)
        found, stop = self._probe(keys, h)
        new = found < 0
        if new.any():
            fresh = np.flatnonzero(new)
            slots = self._allocate(fresh.size)
            self.keys[slots] = keys[fresh]
            self.hashes[slots] = h[fresh]
            self.live[slots] = True
            # an absent key's probe stopped at the first empty cell of its sequence
            self._place(slots, h[fresh], stop[fresh])
            found[fresh] = slots
            self._size += fresh.size
        return found, new

    def remove(self, slots: np.ndarray) -> None:
        """Remove the keys stored at ``slots`` (unique, live)."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        if self._direct is not None:
            self._direct[self.keys[slots, 0]] = _EMPTY
        else:
            self._table[self._positions_of(slots)] = _TOMBSTONE
            self._tombstones += slots.size
        self.live[slots] = False
        self._free.append(slots.copy())
        self._size -= slots.size

    def clear(self) -> None:
        """Remove every key."""
        self.__init__(self.width, self.capacity, self.hashed)

    # ------------------------------------------------------------------ internals
    def _hash(self, keys: np.ndarray) -> np.ndarray:
        return keys[:, 0].view(np.uint64) if self.hashed else hash_rows(keys)

    def _addresses_directly(self, column: np.ndarray) -> bool:
        """Whether these keys go through the direct-address array: while the keys stay
        dense it grows to hold them, else the index moves to the hash table; an index on
        the hash table moves back when its table is due to be rebuilt and all its keys,
        these included, are dense."""
        if self._direct is None and not (
            self.direct_addressing and self.width == 1 and not self.hashed
        ):
            return False
        low, high = int(column.min()), int(column.max())
        if self._direct is None:
            if not self._table_full(column.size):
                return False
            if self._size:
                stored = self.keys[self.live_slots(), 0]
                low, high = min(low, int(stored.min())), max(high, int(stored.max()))
        bound = max(_DENSITY * (self._size + column.size), _DIRECT_FREE)
        if not (low >= 0 and high < bound):
            if self._direct is not None:
                self._leave_direct()
                self._rehash(self._size + column.size)
            return False
        if self._direct is None:
            self._enter_direct(high)
        elif high >= self._direct.size:
            # doubling, but never past the density bound: at most 64 bytes per key held
            grown = np.full(min(max(high + 1, 2 * self._direct.size), bound), _EMPTY, np.int64)
            grown[: self._direct.size] = self._direct
            self._direct = grown
        return True

    def _enter_direct(self, high: int) -> None:
        """Move the keys from the hash table to a direct-address array of ``high + 1``."""
        slots = self.live_slots()
        self._direct = np.full(max(high + 1, 64), _EMPTY, dtype=np.int64)
        self._direct[self.keys[slots, 0]] = slots
        self._table = np.full(16, _EMPTY, dtype=np.int64)
        self._tombstones = 0

    def _leave_direct(self) -> None:
        """Stop direct addressing: the keys placed so far get the hashes the table needs."""
        self._direct = None
        slots = self.live_slots()
        if slots.size:
            self.hashes[slots] = self._hash(self.keys[slots])

    def _get_or_insert_direct(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        column = keys[:, 0]
        found = self._direct[column]
        new = found < 0
        if new.any():
            fresh = np.flatnonzero(new)
            slots = self._allocate(fresh.size)
            self.keys[slots] = keys[fresh]
            self.live[slots] = True
            self._direct[column[fresh]] = slots
            found[fresh] = slots
            self._size += fresh.size
        return found, new

    @staticmethod
    def _table_size_for(capacity: int) -> int:
        size = 16
        while size < 4 * capacity:
            size *= 2
        return size

    def _check(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        if keys.ndim == 1 and self.width == 1:
            keys = keys[:, None]
        if keys.ndim != 2 or keys.shape[1] != self.width:
            raise ValueError(f"expected key rows of width {self.width}, got shape {keys.shape}")
        return keys

    def _probe(self, keys: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Find each key; returns (slot or -1, table position where the probe stopped).

        Most keys are settled by their home cell; the others probe a window of ``_WINDOW``
        consecutive cells per round, comparing the full keys stored there; a batch finishes
        in one round at the table's load factor.
        """
        table = self._table
        mask = table.size - 1
        n = keys.shape[0]
        found = np.full(n, -1, dtype=np.int64)
        stop = np.zeros(n, dtype=np.int64)
        pos = (h & np.uint64(mask)).astype(np.int64)
        # most keys sit in their home cell: settle those with one gather
        home = table[pos]
        occupied = home >= 0
        settled = home == _EMPTY
        if occupied.any():
            occ = np.flatnonzero(occupied)
            same = self._same_keys(home[occ], keys, occ)
            found[occ[same]] = home[occ[same]]
            settled[occ[same]] = True
        stop[settled] = pos[settled]
        active = np.flatnonzero(~settled)
        pos = pos[active]
        offsets = np.arange(_WINDOW, dtype=np.int64)
        width = self.width
        while active.size:  # the others: windows of cells, keys compared in place
            cells = (pos[:, None] + offsets) & mask
            slot = table[cells]
            inside = np.maximum(slot, 0)
            done = slot >= 0
            for j in range(width):
                done &= self.keys[inside, j] == keys[active, j][:, None]
            done |= slot == _EMPTY
            first = done.argmax(axis=1)
            rows = np.arange(active.size)
            finished = done[rows, first]
            ended = active[finished]
            found[ended] = slot[rows, first][finished]  # the key's slot, or -1 (empty)
            stop[ended] = cells[rows, first][finished]
            active = active[~finished]
            pos = (pos[~finished] + _WINDOW) & mask
        return found, stop

    def _same_keys(self, slots: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether the key stored at each slot equals ``keys[rows]`` (column by column: 1-d
        gathers, several times faster than comparing gathered rows)."""
        same = self.keys[slots, 0] == keys[rows, 0]
        for j in range(1, self.width):
            same &= self.keys[slots, j] == keys[rows, j]
        return same

    def _place(self, slots: np.ndarray, h: np.ndarray, start: np.ndarray | None = None) -> None:
        """Write new slots into empty table cells (linear probing, collisions resolved).

        ``start``: where each slot's probe sequence may begin instead of its home cell (no
        empty cell lies between the two), e.g. where :meth:`_probe` stopped.
        """
        table = self._table
        mask = table.size - 1
        pos = (h & np.uint64(mask)).astype(np.int64) if start is None else start.copy()
        pending = np.arange(slots.size)
        while pending.size:
            cell = table[pos]
            free = cell == _EMPTY
            if free.any():
                idx = np.flatnonzero(free)
                table[pos[idx]] = slots[pending[idx]]
                won = np.zeros(pending.size, dtype=bool)
                won[idx] = table[pos[idx]] == slots[pending[idx]]
            else:
                won = np.zeros(pending.size, dtype=bool)
            keep = ~won
            pending = pending[keep]
            pos = (pos[keep] + 1) & mask

    def _positions_of(self, slots: np.ndarray) -> np.ndarray:
        table = self._table
        mask = table.size - 1
        pos = (self.hashes[slots] & np.uint64(mask)).astype(np.int64)
        result = np.zeros(slots.size, dtype=np.int64)
        active = np.arange(slots.size)
        while active.size:
            hit = table[pos] == slots[active]
            result[active[hit]] = pos[hit]
            keep = ~hit
            active = active[keep]
            pos = (pos[keep] + 1) & mask
        return result

    def _allocate(self, count: int) -> np.ndarray:
        parts = []
        while count and self._free:
            chunk = self._free.pop()
            take, rest = chunk[:count], chunk[count:]
            if rest.size:
                self._free.append(rest)
            parts.append(take)
            count -= take.size
        if count:
            parts.append(np.arange(self._next_slot, self._next_slot + count, dtype=np.int64))
            self._next_slot += count
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _reserve(self, incoming: int) -> None:
        needed_slots = self._next_slot + incoming
        if needed_slots > self.capacity:
            # x4: payload arrays sized by the capacity are copied a third as often as with
            # x2, and their unused tail is never touched (zero pages cost no memory)
            new_capacity = max(needed_slots, 4 * self.capacity)
            keys = np.zeros((new_capacity, self.width), dtype=np.int64)
            keys[: self.capacity] = self.keys
            live = np.zeros(new_capacity, dtype=bool)
            live[: self.capacity] = self.live
            hashes = np.zeros(new_capacity, dtype=np.uint64)
            hashes[: self.capacity] = self.hashes
            self.keys, self.live, self.hashes = keys, live, hashes

    def _table_full(self, incoming: int) -> bool:
        """Whether the table must be rebuilt before ``incoming`` more keys: when the keys
        would fill over a quarter of its cells (it grows), or keys and tombstones half of
        them (it is cleaned).  A rebuilt table is at most a quarter full, so a rebuild
        follows a quarter of the table's cells in new keys or removals: amortized O(1)."""
        live = self._size + incoming
        size = self._table.size
        return 4 * live > size or 2 * (live + self._tombstones) > size

    def _rehash(self, expected: int) -> None:
        self._table = np.full(self._table_size_for(expected), _EMPTY, dtype=np.int64)
        self._tombstones = 0
        slots = self.live_slots()
        if slots.size:
            self._place(slots, self.hashes[slots])
