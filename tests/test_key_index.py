"""The key index leaves direct addressing without losing a key.

Single-column indexes start with direct addressing (one gather per lookup) and move to the
hash table when a key is negative, far above the others, or beyond the direct range.  The
keys placed before the move must be found afterwards; a bug there made known values get a
second code, so a join missed its partner and a delete drove a count to -1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ringml.rings.scalar import IntegerRing

from ringml.encoding import Dictionary
from ringml.keyindex import KeyIndex
from ringml.maintainer import STRATEGIES, Maintainer
from ringml.query import Query

KEYS = st.one_of(
    st.integers(0, 40),  # dense: direct addressing
    st.integers(-5, -1),  # negative: leaves it
    st.integers(60_000, 70_000),  # beyond 65,536
    st.integers(-(2**63), 2**63 - 1),  # anything
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(KEYS, min_size=1, max_size=12), min_size=1, max_size=8), st.data())
def test_single_column_index_matches_a_dict(batches, data):
    index = KeyIndex(1)
    reference: dict[int, int] = {}
    for batch in batches:
        keys = np.unique(np.asarray(batch, dtype=np.int64))
        slots, new = index.get_or_insert(keys)
        for key, slot, fresh in zip(keys.tolist(), slots.tolist(), new.tolist(), strict=True):
            assert fresh == (key not in reference), key
            assert reference.setdefault(key, slot) == slot, key
        if reference and data.draw(st.booleans()):
            drop = data.draw(st.lists(st.sampled_from(sorted(reference)), unique=True))
            index.remove(np.asarray([reference.pop(k) for k in drop], dtype=np.int64))
        probe = np.asarray(sorted(set(reference) | set(batch)), dtype=np.int64)
        expected = [reference.get(k, -1) for k in probe.tolist()]
        np.testing.assert_array_equal(index.lookup(probe), expected)
        assert len(index) == len(reference)


def test_index_returns_to_direct_addressing_when_its_keys_become_dense():
    """A key far out moves the index to its hash table; once that key is gone and the
    table is rebuilt (it grows), the dense keys are addressed directly again, and every
    key keeps its slot through both moves."""
    index = KeyIndex(1)
    reference: dict[int, int] = {}

    def insert(keys) -> None:
        keys = np.asarray(keys, dtype=np.int64)
        slots, new = index.get_or_insert(keys)
        assert new.all()
        reference.update(zip(keys.tolist(), slots.tolist(), strict=True))

    def agrees() -> None:
        probe = np.arange(-3, 3000, dtype=np.int64)
        want = [reference.get(k, -1) for k in probe.tolist()]
        assert index.lookup(probe).tolist() == want
        assert index.lookup(np.array([2**50])).tolist() == [reference.get(2**50, -1)]

    insert(np.arange(0, 100))
    assert index._direct is not None
    insert([2**50])
    assert index._direct is None
    agrees()
    index.remove(np.array([reference.pop(2**50)]))
    insert(np.arange(100, 2000))  # the table grows: the keys are dense again
    assert index._direct is not None
    agrees()
    index.remove(np.array([reference.pop(k) for k in range(0, 2000, 3)]))
    insert(np.arange(2000, 3000))
    agrees()


def test_removals_at_a_steady_size_rebuild_the_table_rarely():
    """Removing and inserting keys at a steady size leaves tombstones; the table is
    cleaned after about as many tombstones as keys, not whenever a few push it past its
    load factor (which rebuilt it for nearly every batch once the keys filled a quarter)."""
    index = KeyIndex(2)
    rebuilds = 0
    rehash = index._rehash

    def counted(expected: int) -> None:
        nonlocal rebuilds
        rebuilds += 1
        rehash(expected)

    index._rehash = counted
    rng = np.random.default_rng(0)
    keys = rng.permutation(10**6)[:60_000].astype(np.int64)
    slots, _ = index.get_or_insert(np.stack([keys[:1000], keys[:1000]], axis=1))
    live = list(slots)
    grew = rebuilds
    for start in range(1000, keys.size, 100):
        batch = keys[start : start + 100]
        index.remove(np.asarray(live[:100]))
        new, _ = index.get_or_insert(np.stack([batch, -batch], axis=1))
        live = live[100:] + list(new)
        assert len(index) == 1000
    # 59,000 removals at 1000 keys: about one cleaning per 1000 tombstones
    assert rebuilds - grew <= 70, rebuilds - grew
    found = index.lookup(np.stack([keys[-1000:], -keys[-1000:]], axis=1))
    assert found.tolist() == [int(s) for s in live]


def test_dictionary_keeps_its_codes_when_a_negative_key_arrives():
    d = Dictionary("B")
    first = d.encode(np.array([5, 1, 3]))
    d.encode(np.array([-1]))
    d.encode(np.array([2**40]))
    np.testing.assert_array_equal(d.encode(np.array([5, 1, 3])), first)
    assert len(d) == 5


@pytest.mark.parametrize("tree", ["tau", "nu"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("odd_key", [-1, 2**40, 70_000])
def test_the_issue_example_counts_1_then_0(strategy, tree, odd_key):
    query = Query({"R": ["A", "B"], "S": ["B", "C"]}, IntegerRing())
    m = Maintainer(query, strategy=strategy, tree=tree)
    m.insert("R", pd.DataFrame({"A": [1], "B": [5]}))
    m.insert("S", pd.DataFrame({"B": [odd_key], "C": [1]}))
    m.insert("S", pd.DataFrame({"B": [5], "C": [2]}))
    assert m.result() == 1
    m.delete("R", pd.DataFrame({"A": [1], "B": [5]}))
    assert m.result() == 0


@pytest.mark.parametrize("tree", ["tau", "nu"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_groups_are_listed_once_after_the_index_moves(strategy, tree):
    query = Query({"R": ["A", "B"], "S": ["B", "C"]}, IntegerRing(), free=["B"])
    m = Maintainer(query, strategy=strategy, tree=tree)
    m.insert("R", pd.DataFrame({"A": [1, 2], "B": [5, 6]}))
    m.insert("S", pd.DataFrame({"B": [5, 6], "C": [2, 2]}))
    m.insert("S", pd.DataFrame({"B": [-3, 70_000], "C": [1, 1]}))
    m.insert("R", pd.DataFrame({"A": [3, 4, 5], "B": [5, -3, 70_000]}))
    groups = [key for key, _ in m.enumerate()]
    assert len(groups) == len(set(groups))
    assert dict(m.enumerate()) == {(5,): 2, (6,): 1, (-3,): 1, (70_000,): 1}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 4), st.integers(-3, 3)), max_size=30),
            st.lists(st.integers(0, 40), max_size=10),
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.integers(0, 4), min_size=1, max_size=8),
)
def test_partial_key_matches_follow_additions_and_removals(steps, probes):
    """A store's secondary index (entries by the first key column) is kept across additions
    and removals (slots reused for other keys included) and always matches a dict, whether
    it is rebuilt at every probe or only after many changes, and whether its levels are
    merged at once, by the default rule or never."""

    from ringml import store as stores

    for rebuild_min, growth in ((1, 4), (10**9, 4), (10**9, 0), (10**9, 10**9)):
        stores.REBUILD_MIN, stores.GROWTH = rebuild_min, growth
        try:
            _check_partial_matches(steps, probes)
        finally:
            stores.REBUILD_MIN, stores.GROWTH = 1024, 4


def _check_partial_matches(steps, probes):
    from ringml.rings.scalar import IntegerRing

    from ringml.store import ViewStore

    store = ViewStore(("a", "b"), IntegerRing())
    present: dict[tuple[int, int], int] = {}
    for inserts, deletes in steps:
        keys = sorted(set(inserts))
        if keys:
            codes = np.asarray(keys, dtype=np.int64)
            store.add(codes, np.ones(len(keys), dtype=np.int64), np.ones(len(keys), np.int64))
            for k in keys:
                present[k] = present.get(k, 0) + 1
        gone = sorted({list(present)[i % len(present)] for i in deletes}) if present else []
        if gone:
            counts = np.asarray([present[k] for k in gone], dtype=np.int64)
            store.add(np.asarray(gone, dtype=np.int64), -counts, -counts)
            for k in gone:
                del present[k]
        probe = np.asarray(probes, dtype=np.int64)[:, None]
        rows, slots = store.matches((0,), probe)
        got = sorted(
            (int(r), tuple(int(x) for x in store.index.keys[s]))
            for r, s in zip(rows, slots, strict=True)
        )
        want = sorted((r, k) for r, a in enumerate(probes) for k in present if k[0] == a)
        assert got == want  # (sorted lists: a pair found twice would show)


def test_dictionary_values_and_numbers_grow_in_place():
    d = Dictionary("x")
    for chunk in ([5, 1], [7, 5, 2**60 + 1], [3]):
        d.encode(np.asarray(chunk, dtype=np.int64))
        np.testing.assert_array_equal(d.numeric(np.arange(len(d))), d.values.astype(np.int64))
    assert d.numeric(np.array([d.lookup(np.array([2**60 + 1]))[0]]))[0] == 2**60 + 1  # exact
    d.encode(np.array([0.5]))  # a non-integer: the numbers become floats, values unchanged
    assert d.numeric(np.arange(len(d))).dtype == np.float64
    assert len(d) == 6 and {1, 3, 5, 7, 2**60 + 1, 0.5} == set(d.values.tolist())
    np.testing.assert_array_equal(d.decode(d.encode(np.array([3, 7]))), [3, 7])


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(-20, 20), min_size=1, max_size=40)),
        min_size=1,
        max_size=15,
    ),
)
def test_colliding_hashes_probe_past_full_windows(width, steps):
    """With a hash of a few values (many keys share home cells and 64-bit hashes, runs
    longer than a probe window), inserts, removals (tombstones) and lookups still agree
    with a dict."""
    index = KeyIndex(width)
    index.hashed = False
    index.direct_addressing = False
    index._direct = None
    index._hash = lambda keys: (keys[:, 0] % 3).astype(np.uint64)  # 3 hashes in all
    present: dict[tuple, int] = {}
    for remove, values in steps:
        keys = np.asarray(sorted({_colliding_key(v, width) for v in values}), np.int64)
        if remove:
            gone = [k for k in map(tuple, keys.tolist()) if k in present]
            if gone:
                index.remove(np.asarray([present.pop(k) for k in gone], dtype=np.int64))
        else:
            slots, new = index.get_or_insert(keys)
            for key, slot, fresh in zip(map(tuple, keys.tolist()), slots, new, strict=True):
                assert fresh == (key not in present)
                assert present.setdefault(key, int(slot)) == slot
        probe = np.asarray([_colliding_key(v, width) for v in range(-22, 23)], np.int64)
        got = index.lookup(probe)
        want = [present.get(k, -1) for k in map(tuple, probe.tolist())]
        assert got.tolist() == want
        assert len(index) == len(present)


def _colliding_key(v: int, width: int) -> tuple[int, ...]:
    """Keys that share their first column (so their hashes) in groups of ~10."""
    return (v,) if width == 1 else (v % 4, *([v] * (width - 1)))


def test_a_secondary_index_nobody_probes_stays_bounded():
    """R's store was probed once by S; then only R changed: every apply appended its new
    slots to the index's pending list, drained only by the next probe (2,000 arrays for
    2,000 batches, memory growing with every row ever inserted)."""
    query = Query({"R": ["a", "b"], "S": ["b", "c"]}, IntegerRing(), free=["a"])
    m = Maintainer(query)
    m.insert("S", {"b": list(range(10)), "c": [0] * 10})
    m.insert("R", {"a": [0], "b": [0]})
    m.insert("S", {"b": [0], "c": [1]})  # probes R's store: its secondary index is built
    (partial,) = [p for s in m._stores.values() for p in s._secondary.values()]
    live = 200
    for i in range(1, 3000):  # one new row per apply, the one `live` applies older deleted
        m.insert("R", {"a": [i], "b": [i % 10]})
        if i > live:
            m.delete("R", {"a": [i - live], "b": [(i - live) % 10]})
        assert len(partial.pending) <= 64 + 1
        assert partial.entries <= 4 * max(len(partial.index), 1024)
    m.insert("S", {"b": [3], "c": [2]})  # the next probe finds every live R row of b = 3
    kept = [0] + list(range(3000 - live, 3000))
    want = {(a,): 2 if a % 10 in (0, 3) else 1 for a in kept}  # S: b = 0 and 3 twice
    assert m.result() == want
