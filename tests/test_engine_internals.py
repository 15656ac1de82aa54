"""Engine building blocks kept fast without changing what they compute.

Grouping, row hashing and tuple fingerprints are compared with straightforward reference
versions (fingerprints are stored in pickled maintainers, so they must never change), and a
delta that joins with nothing must leave every view as it was.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ringml.applications import covariance_query
from ringml.batch import TupleCounts, _exact_big
from ringml.encoding import _INT, _big_int_bits, _value_keys
from ringml.keyindex import hash_rows
from ringml.maintainer import Maintainer
from ringml.store import group_rows

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX = np.uint64(0xBF58476D1CE4E5B9)


def reference_hash(columns: list[np.ndarray]) -> np.ndarray:
    h = np.zeros(columns[0].shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in columns:
            h ^= column.view(np.uint64)
            h *= GOLDEN
            h ^= h >> np.uint64(31)
        h *= MIX
        h ^= h >> np.uint64(29)
    return h


def reference_fingerprints(columns: list[np.ndarray]) -> np.ndarray:
    hashed = []
    for data in columns:
        if data.dtype.kind == "u":  # as Python ints: exact beyond 2**53, by digits beyond int64
            hashed.append(np.array([reference_int_key(int(x)) for x in data], dtype=np.int64))
        elif data.dtype.kind in "iufb":
            bits = (data.astype(np.float64) + 0.0).view(np.int64)
            if data.dtype.kind == "i":
                bits = _exact_big(bits, data)
            hashed.append(bits)
        else:
            keys = _value_keys(data)[0]
            ints = keys[:, 0] == _INT
            as_float = (keys[ints, 1].astype(np.float64) + 0.0).view(np.int64)
            keys[ints, 1] = _exact_big(as_float, keys[ints, 1])
            hashed.append(keys[:, 1])
    return reference_hash(hashed).view(np.int64)


def reference_int_key(x: int) -> int:
    if abs(x) <= 2**53:
        return int(np.float64(x).view(np.int64))
    return x if x < 2**63 else int(_big_int_bits([x])[0])


@pytest.mark.parametrize("big", [False, True])
def test_fingerprints_and_row_hashes_are_unchanged(big):
    rng = np.random.default_rng(1)
    n = 300
    ints = rng.integers(-(10**6), 10**6, n)
    unsigned = rng.integers(0, 2**63, n, dtype=np.uint64)
    if big:  # beyond 2**53 integers hash exactly, not by their rounded float
        ints[:5] = [2**53 + 1, -(2**63), 2**62 + 3, -(2**53) - 1, 2**53]
        unsigned[:4] = [2**64 - 1, 2**63, 2**60 + 1, 2**60]
    else:  # uint64 values below 2**53 hash as they always did: by their float
        unsigned >>= np.uint64(11)
    columns = [
        ints,
        rng.normal(size=n),
        np.where(rng.random(n) < 0.5, -0.0, 0.0),
        rng.integers(0, 2, n).astype(bool),
        unsigned,
        np.array(["a", 1, 2.0, 2**70, -0.0], dtype=object)[rng.integers(0, 5, n)],
        rng.integers(0, 5, n).astype(np.int32),
    ]
    np.testing.assert_array_equal(
        TupleCounts.fingerprints(columns), reference_fingerprints(columns)
    )
    keys = np.stack([ints, rng.integers(0, 9, n)], axis=1)
    np.testing.assert_array_equal(hash_rows(keys), reference_hash([keys[:, 0], keys[:, 1]]))
    # 1 == 1.0 and -0.0 == 0.0 as tuples
    a = TupleCounts.fingerprints([np.array([1, 2]), np.array([0.0, 3.0])])
    b = TupleCounts.fingerprints([np.array([1.0, 2.0]), np.array([-0.0, 3.0])])
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("ordered", [True, False])
def test_group_rows_matches_np_unique(width, ordered):
    rng = np.random.default_rng(width)
    for n in (0, 1, 2, 50):
        columns = rng.integers(0, 6, (n, width))
        if ordered:  # rows in lexicographic order: grouped without a sort
            columns = columns[np.lexsort(columns.T[::-1])]
        unique, groups = group_rows(columns)
        if n == 0:
            assert unique.shape[0] == 0 and groups.size == 0
            continue
        expected, inverse = np.unique(columns, axis=0, return_inverse=True)
        np.testing.assert_array_equal(unique, expected)
        np.testing.assert_array_equal(groups, inverse.ravel())
        np.testing.assert_array_equal(unique[groups], columns)


def star() -> dict[str, list[str]]:
    return {"F": ["k", "x", "y"], "D1": ["k", "u"], "D2": ["k", "v", "w"]}


def test_a_delta_joining_nothing_changes_no_view_above_its_own():
    query = covariance_query(star())
    m = Maintainer(query)
    rng = np.random.default_rng(0)
    m.insert("D1", pd.DataFrame({"k": [1, 2], "u": [0.5, 1.5]}))
    m.insert("D2", pd.DataFrame({"k": [2, 3], "v": [1.0, 2.0], "w": [3.0, 4.0]}))
    before = {n.name: m.view(n.name) for n in m.tree.materialized()}
    assert before[m.tree.root.name] == {}  # nothing joins yet
    facts = pd.DataFrame({"k": [1, 1, 3], "x": rng.normal(size=3), "y": rng.normal(size=3)})
    m.insert("F", facts)  # key 1 lacks D2, key 3 lacks D1: the join stays empty
    after = {n.name: m.view(n.name) for n in m.tree.materialized()}
    f_view = next(n.name for n in m.tree.materialized() if "F" in n.atoms and n.parent)
    assert set(after[f_view]) == {(1,), (3,)}  # the leaf's own view did change
    assert after[m.tree.root.name] == {}
    for name, content in before.items():
        if name != f_view:
            assert after[name].keys() == content.keys()
    # the key joins once D2 catches up: the result equals numpy moments of the join
    m.insert("D2", pd.DataFrame({"k": [1], "v": [5.0], "w": [-1.0]}))
    m.insert("D1", pd.DataFrame({"k": [3], "u": [2.5]}))
    d1 = pd.DataFrame({"k": [1, 2, 3], "u": [0.5, 1.5, 2.5]})
    d2 = pd.DataFrame({"k": [2, 3, 1], "v": [1.0, 2.0, 5.0], "w": [3.0, 4.0, -1.0]})
    joined = facts.merge(d1, on="k").merge(d2, on="k")
    x = joined[list(query.ring.variables)].to_numpy()
    count, sums, products = query.ring.moments(m.result())
    assert count == len(joined) == 3
    np.testing.assert_allclose(sums, x.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(products, x.T @ x, rtol=1e-12)


@pytest.mark.parametrize("hashed", [False, True])
def test_key_index_matches_a_dict_through_inserts_and_removals(hashed):
    """Absent keys are placed from where their probe stopped; hashed indexes use the key as
    its own hash.  Either way every lookup agrees with a plain dict."""
    from ringml.keyindex import KeyIndex

    rng = np.random.default_rng(7)
    width = 1 if hashed else 2
    index = KeyIndex(width, hashed=hashed)
    reference: dict[tuple, int] = {}
    pool = rng.integers(-(2**63), 2**63 - 1, size=(3000, width), dtype=np.int64)
    if not hashed:
        pool[:, 1] = rng.integers(0, 3, 3000)  # many keys sharing a column
    for _ in range(40):
        batch = np.unique(pool[rng.integers(0, pool.shape[0], 200)], axis=0)
        slots, new = index.get_or_insert(batch)
        for key, slot, fresh in zip(map(tuple, batch), slots, new, strict=True):
            assert fresh == (key not in reference)
            assert reference.setdefault(key, int(slot)) == slot
        if reference and rng.random() < 0.7:
            keys = list(reference)
            drop = [keys[i] for i in rng.choice(len(keys), len(keys) // 3, replace=False)]
            index.remove(np.array([reference.pop(k) for k in drop], dtype=np.int64))
        found = index.lookup(pool)
        expected = [reference.get(tuple(k), -1) for k in pool]
        np.testing.assert_array_equal(found, expected)
    assert len(index) == len(reference)
    index.clear()
    assert index.hashed == hashed and len(index) == 0
    with pytest.raises(ValueError):
        KeyIndex(2, hashed=True)


@pytest.mark.parametrize("flush_at", [1, 5, 10**9])
def test_tuple_counts_match_a_counter(monkeypatch, flush_at):
    """Deletes are checked against the index, the recorded (merged, not yet folded) changes,
    the batch's own inserts and the earlier batches of the same apply, whenever the recorded
    changes are folded into the index."""
    from collections import Counter

    from ringml import batch as batch_module

    monkeypatch.setattr(batch_module, "_FLUSH_AT", flush_at)
    rng = np.random.default_rng(3)
    counts = TupleCounts(1)
    present: Counter = Counter()
    universe = TupleCounts.fingerprints([np.arange(40)])
    for step in range(300):
        ids = universe[rng.integers(0, 40, rng.integers(1, 12))]
        signs = rng.choice([-2, -1, 1, 1, 2], ids.size).astype(np.int64)
        earlier = None
        if step % 7 == 0:  # an earlier, unrecorded batch of the same apply
            earlier = (universe[rng.integers(0, 40, 3)], np.ones(3, dtype=np.int64))
        record, delta, violating = counts.check(ids, signs, earlier)
        pending = Counter(present)
        if earlier is not None:
            pending.update(dict(Counter(earlier[0].tolist())))
        for fp, sign in zip(ids.tolist(), signs.tolist(), strict=True):
            pending[fp] += sign
        bad = {fp for fp in ids.tolist() if pending[fp] < 0}
        if violating >= 0:
            assert ids[violating] in bad and ids[violating] == min(bad)
            continue
        assert not bad
        counts.apply(record, delta)
        if step % 5 == 0:  # a rejected apply takes its recorded batch back
            counts.apply(record, -delta)
            continue
        for fp, sign in zip(ids.tolist(), signs.tolist(), strict=True):
            present[fp] += sign
        if step % 11 == 0:
            got = counts.current(np.unique(universe))
            assert got.tolist() == [present[fp] for fp in np.unique(universe).tolist()]
    assert len(counts.index) <= 40


def test_tuple_counts_pickled_before_the_merge_still_work():
    """Counts pickled before ``_merged`` existed carry only their list of changes."""
    import pickle

    counts = TupleCounts(1)
    fps = TupleCounts.fingerprints([np.arange(5)])
    counts.apply(fps, np.ones(5, dtype=np.int64))
    del counts._merged
    restored = pickle.loads(pickle.dumps(counts))
    assert restored.current(np.sort(fps)).tolist() == [1] * 5
    assert restored.check(fps[:1], np.array([-2]))[2] == 0


@pytest.mark.parametrize("pending_min", [0, 4096])
def test_categorical_views_with_deferred_tables_match_the_plain_merge(pending_min, monkeypatch):
    """Stored categorical views keep their sparse tables deferred (main + pending runs):
    with deletes, a checkpoint pickled mid-stream, and either settling constantly or
    rarely, the result is bit for bit the one of the plain re-sorting merge."""
    import pickle

    import ringml.rings.categorical as module

    from ringml.batch import UpdateBatch
    from ringml.datasets import build_stream, housing_star

    monkeypatch.setattr(module, "_PENDING_MIN", pending_min)
    data = housing_star(postcodes=40, seed=3)
    stream = build_stream(data.relations, batch_size=60, delete_fraction=0.3, seed=3)
    cat = ["nbbedrooms", "house", "pricerangeshop", "typeeducation"]
    cont = ["livingarea", "price", "openinghoursshop", "unemployment"]
    query = covariance_query(data.schemas, cont + cat, cat)
    batches = [UpdateBatch(b.relation, b.rows, b.multiplicity) for b in stream]
    half = len(batches) // 2

    deferred = Maintainer(query)
    for b in batches[:half]:
        deferred.apply(b)
    deferred = pickle.loads(pickle.dumps(deferred))
    for b in batches[half:]:
        deferred.apply(b)
    with monkeypatch.context() as patch:
        patch.setattr(module.GeneralizedCovarianceRing, "_merge_into", lambda self, *a: False)
        plain = Maintainer(query)
        for b in batches:
            plain.apply(b)
        want = plain.result()
    got = deferred.result()
    assert got == want
    assert any(getattr(s.payload, "_deferred", None) is not None for s in deferred._stores.values())
