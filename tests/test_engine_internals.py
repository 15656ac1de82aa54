"""Engine building blocks kept fast without changing what they compute.

Grouping, row hashing and tuple fingerprints are compared with straightforward reference
versions (fingerprints are stored in pickled maintainers: they are pinned to a per-value
reference and to literal values, so changing them is a decision), and a delta that joins
with nothing must leave every view as it was.
"""

from __future__ import annotations

import struct

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringml.applications import covariance_query
from ringml.batch import TupleCounts, _value_fingerprint_keys
from ringml.encoding import Dictionary, _value_keys
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


M64 = 2**64 - 1
KIND_SALT = {"float": 2, "other": 3, "time": 4, "big": 5}  # _FLOAT.._BIG + 1


def splitmix64(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def signed(z: int) -> int:
    return z - 2**64 if z >= 2**63 else z


def mixed(kind: str, bits: int) -> int:
    """A value that is not an int64 integer: its 64 bits mixed, xor its kind's salt."""
    return signed(splitmix64(bits & M64) ^ ((KIND_SALT[kind] * 0x9E3779B97F4A7C15) & M64))


def reference_key(x) -> int:
    """The fingerprint key of one value, from Python ints and struct-packed floats: an
    integer of int64's range is itself, other numbers and strings are mixed by kind."""
    if isinstance(x, (bool, np.bool_, int, np.integer)):
        x = int(x)
        if -(2**63) <= x < 2**63:
            return x
        digits = pd.util.hash_array(np.array([str(x)], dtype=object), categorize=False)
        return mixed("big", int(digits[0]))
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if x.is_integer():  # 1.0 is 1, 2.0**70 is 2**70
            return reference_key(int(x))
        return mixed("float", struct.unpack("<Q", struct.pack("<d", x))[0])
    if isinstance(x, np.datetime64):
        return mixed("time", int(x.astype("datetime64[ns]").astype(np.int64)))
    return mixed("other", int(pd.util.hash_array(np.array([x], dtype=object))[0]))


def reference_fingerprints(columns: list[np.ndarray]) -> np.ndarray:
    keys = [np.array([reference_key(x) for x in data], dtype=np.int64) for data in columns]
    return reference_hash(keys).view(np.int64)


@pytest.mark.parametrize("big", [False, True])
def test_fingerprints_and_row_hashes_are_pinned(big):
    """Tuple fingerprints (kept in pickled state) follow the per-value reference; they
    changed once, from float64 bits below 2**53 and the raw integer above it (so -2**63 met
    -4332462841530417152 and 4607182418800017408 met 1.0), to the integer itself."""
    rng = np.random.default_rng(1)
    n = 300
    ints = rng.integers(-(10**6), 10**6, n)
    unsigned = rng.integers(0, 2**63, n, dtype=np.uint64)
    floats = rng.normal(size=n)
    if big:  # the ends of int64 and beyond, exactly
        ints[:6] = [2**53 + 1, -(2**63), 2**63 - 1, 2**62 + 3, -(2**53) - 1, 4607182418800017408]
        unsigned[:4] = [2**64 - 1, 2**63, 2**60 + 1, 2**60]
        floats[:6] = [2.0**63, -(2.0**63), 1e20, 2.0**60, -1e300, 4.5e15 + 0.5]
    else:
        unsigned >>= np.uint64(11)
    columns = [
        ints,
        floats,
        np.where(rng.random(n) < 0.5, -0.0, 0.0),
        rng.integers(-3, 3, n) * 0.5,  # integral and not, in one column
        rng.integers(0, 2, n).astype(bool),
        unsigned,
        np.array(["a", 1, 2.0, 2**70, -0.0, 0.25, "1"], dtype=object)[rng.integers(0, 7, n)],
        rng.integers(0, 5, n).astype(np.int32),
        rng.normal(size=n).astype(np.float32),
        np.datetime64("2024-01-01") + rng.integers(0, 10**6, n).astype("timedelta64[s]"),
    ]
    np.testing.assert_array_equal(
        TupleCounts.fingerprints(columns), reference_fingerprints(columns)
    )
    keys = np.stack([ints, rng.integers(0, 9, n)], axis=1)
    np.testing.assert_array_equal(hash_rows(keys), reference_hash([keys[:, 0], keys[:, 1]]))
    # literal values: the reference cannot drift with the code
    row = [np.array([1]), np.array([0.5]), np.array(["a"], dtype=object), np.array([2**70], object)]
    assert [reference_key(c[0]) for c in row] == [
        1,
        4048187675451468639,
        -1820216722689261083,
        8296973553720671731,
    ]
    assert TupleCounts.fingerprints(row).tolist() == [3432014789900710539]
    # the mixer is splitmix64's (its first two outputs from seed 0)
    assert splitmix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    assert splitmix64(2 * 0x9E3779B97F4A7C15 & M64) == 0x6E789E6AA1B965F4


def test_fingerprints_tell_apart_what_the_old_keys_confused():
    """-2**63 and -4332462841530417152 (np.abs overflowed to float bits), 4607182418800017408
    and 1.0 (raw integer vs float bits): distinct values, distinct fingerprints; equal values
    of any column type, equal fingerprints."""
    fp = TupleCounts.fingerprints
    assert fp([np.array([-(2**63)])]) != fp([np.array([-4332462841530417152])])
    assert fp([np.array([4607182418800017408])]) != fp([np.array([1.0])])
    assert fp([np.array([2**53 + 1])]) != fp([np.array([2.0**53])])
    equal = [
        [np.array([1]), np.array([1.0]), np.array([1], object), np.array([1], np.uint64)]
        + [np.array([True]), np.array([1.0], np.float32), np.array([1.0], object)],
        [np.array([-(2**63)]), np.array([-(2.0**63)]), np.array([-(2**63)], object)],
        [np.array([2**60]), np.array([2.0**60]), np.array([2**60], np.uint64)],
        [np.array([2**63], np.uint64), np.array([2.0**63]), np.array([2**63], object)],
        [np.array([2**70], object), np.array([2.0**70]), np.array([2.0**70], object)],
        [np.array([10**20], object), np.array([1e20])],
        [np.array([0]), np.array([-0.0]), np.array([-0.0], object)],
        [np.array([0.5]), np.array([0.5], object), np.array([0.5], np.float32)],
    ]
    for group in equal:
        assert len({int(fp([column])[0]) for column in group}) == 1, group
    assert len({int(fp([group[0]])[0]) for group in equal}) == len(equal)


# Values apt to collide under a careless key: int64's ends, float bit patterns as integers,
# integers beyond 2**53 and int64, their floats, numeric strings
SPECIAL = [
    0, 1, -1, 2, True, False, 0.0, -0.0, 1.0, 0.5, -1.5, 2.0**53, 2**53, 2**53 + 1,
    2.0**60, 2**60, 2**60 + 1, -(2**63), -(2.0**63), -4332462841530417152, 2**63 - 1,
    2**63, 2.0**63, 2**64 - 1, 2.0**64, 2**70, 2.0**70, 10**20, 1e20, -(10**20), -1e20,
    4607182418800017408, 4602678819172646912, "1", "1.0", "a",
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(SPECIAL),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)
HOLDS = {  # the values a column of each type holds exactly
    "int64": lambda x: isinstance(x, int) and -(2**63) <= x < 2**63,
    "uint64": lambda x: isinstance(x, int) and 0 <= x < 2**64,
    "float64": lambda x: isinstance(x, float),
    "object": lambda x: True,
}


def typed_column(values: list, dtype: str) -> np.ndarray:
    if dtype != "object":
        return np.array(values, dtype=dtype)
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fingerprints_are_equal_iff_the_rows_are_equal_as_values(data):
    """Two batches of random rows, each column of a random type (int64, uint64, float64 or
    object) that holds its values: two rows have one fingerprint iff their values are equal
    (Python's ``==``: ``1 == 1.0 == True``, ``2.0**70 == 2**70``, ``"1" != 1``), and the
    dictionary codes of a column agree (so the delete check and the join agree)."""
    width = data.draw(st.integers(1, 3))
    palettes = [data.draw(st.lists(VALUES, min_size=1, max_size=4)) for _ in range(width)]
    rows, fingerprints, columns = [], [], [[] for _ in range(width)]
    for _ in range(2):
        n = data.draw(st.integers(1, 6))
        batch = []
        for j, palette in enumerate(palettes):
            dtype = data.draw(st.sampled_from([t for t in HOLDS if any(map(HOLDS[t], palette))]))
            held = [x for x in palette if HOLDS[dtype](x)]
            values = data.draw(st.lists(st.sampled_from(held), min_size=n, max_size=n))
            batch.append(typed_column(values, dtype))
            columns[j].append(batch[-1])
        rows += list(zip(*[column.tolist() for column in batch], strict=True))
        fingerprints += TupleCounts.fingerprints(batch).tolist()
        np.testing.assert_array_equal(fingerprints[-n:], reference_fingerprints(batch))
        for column in batch:  # the numeric shortcuts key like the general path
            keys = _value_keys(column)[0]
            np.testing.assert_array_equal(
                TupleCounts.fingerprints([column]),
                hash_rows([_value_fingerprint_keys(keys[:, 0], keys[:, 1])]).view(np.int64),
            )
    for i, a in enumerate(rows):
        for k, b in enumerate(rows):
            same = all(x == y for x, y in zip(a, b, strict=True))
            assert (fingerprints[i] == fingerprints[k]) == same, (a, b)
    for j in range(width):
        dictionary = Dictionary("x")
        codes = np.concatenate([dictionary.encode(part) for part in columns[j]])
        values = [x for part in columns[j] for x in part.tolist()]
        for i, a in enumerate(values):
            for k, b in enumerate(values):
                assert (codes[i] == codes[k]) == (a == b), (a, b)


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
    assert counts.ids.size <= 40 and (counts.counts != 0).all()


def test_tuple_counts_pickled_with_a_hash_index_still_work():
    """Counts pickled when they kept a hash index of fingerprints (and no ``_merged``) are
    read into sorted runs."""
    import pickle

    from ringml.keyindex import KeyIndex

    fps = TupleCounts.fingerprints([np.arange(5)])
    counts = TupleCounts(1)
    old = {"index": KeyIndex(1, hashed=True), "_pending": [(fps[3:], np.ones(2, np.int64))]}
    slots, _ = old["index"].get_or_insert(fps[:3])
    old["counts"] = np.zeros(old["index"].capacity, dtype=np.int64)
    old["counts"][slots] = [1, 2, 1]
    counts.__dict__.clear()
    counts.__dict__.update(old)
    restored = pickle.loads(pickle.dumps(counts))
    assert restored.current(np.sort(fps)).tolist() == [
        {0: 1, 1: 2, 2: 1}.get(list(fps).index(f), 1) for f in np.sort(fps)
    ]
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


@pytest.mark.parametrize("categorical", [[], ["city"]])
@pytest.mark.parametrize("clone", ["pickle", "deepcopy"])
def test_a_copy_of_a_maintainer_shares_its_rings_shifts(clone, categorical):
    """A maintainer copied (pickle round trip, deepcopy) before some variables were lifted:
    the copy fixes their shifts, and ``query.ring.statistics(copy.result())`` (the README's
    pattern, with the original query) read its payload with the original ring's open
    shifts: silently wrong means.  Copies in one process now share the shifts."""
    import copy
    import pickle

    relations = {"Sales": ["store", "item", "units"], "Stores": ["store", "size", "city"],
                 "Items": ["item", "price"]}  # fmt: skip
    query = covariance_query(relations, ["units", "size", "price", *categorical], categorical)
    m = Maintainer(query)
    stores = pd.DataFrame({"store": [1, 2], "size": [120.0, 300.0], "city": ["a", "b"]})
    m.insert("Stores", stores)
    c = pickle.loads(pickle.dumps(m)) if clone == "pickle" else copy.deepcopy(m)
    items = pd.DataFrame({"item": [10, 11], "price": [2.5, 4.0]})
    sales = pd.DataFrame({"store": [1, 1, 2], "item": [10, 11, 10], "units": [3.0, 1.0, 7.0]})
    c.insert("Items", items)
    c.insert("Sales", sales)
    join = sales.merge(stores, on="store").merge(items, on="item")
    expected = join[["units", "size", "price"]].mean().to_numpy()
    args = ({"city": [0, 1]},) if categorical else ()
    np.testing.assert_allclose(query.ring.statistics(c.result(), *args).mean[:3], expected)
    np.testing.assert_allclose(c.ring.statistics(c.result(), *args).mean[:3], expected)
    m.insert("Items", items)  # the original goes on with the shifts the copy fixed
    m.insert("Sales", sales)
    np.testing.assert_allclose(query.ring.statistics(m.result(), *args).mean[:3], expected)


def test_to_frame_keeps_free_variables_named_payload_or_support():
    """They were overwritten by the aggregate and the count."""
    from ringml.rings import RealRing

    from ringml.query import Query

    query = Query({"R": ["support", "payload", "x"]}, RealRing(["x"]), free=["support", "payload"])
    m = Maintainer(query)
    rows = pd.DataFrame({"support": ["s1", "s2"], "payload": ["p1", "p2"], "x": [10.0, 20.0]})
    delta = m.insert("R", rows)
    for frame in (delta.to_frame(), m.groups().to_frame()):
        assert list(frame.columns) == ["support", "payload", "payload_", "support_"]
        assert frame[["support", "payload"]].values.tolist() == [["s1", "p1"], ["s2", "p2"]]
        assert frame["payload_"].tolist() == [10.0, 20.0] and frame["support_"].tolist() == [1, 1]


def test_decode_refuses_codes_it_has_no_value_for():
    """-1 (codes_of's 'never seen') decoded to the last value, a code past the end raised
    a bare IndexError."""
    from ringml.rings import IntegerRing

    from ringml.query import Query

    m = Maintainer(Query({"R": ["A"]}, IntegerRing(), free=["A"]))
    m.insert("R", pd.DataFrame({"A": ["alice", "bob"]}))
    assert m.decode("A", m.codes_of("A", ["bob", "alice"])).tolist() == ["bob", "alice"]
    for codes in ([-1], m.codes_of("A", ["carol"]), [7]):
        with pytest.raises(KeyError, match="variable 'A' has no value of code"):
            m.decode("A", codes)


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "higher_order", "recompute"])
@pytest.mark.parametrize("codes", [[0.9], [1.5], [True], ["1"], [None], [np.inf]])
def test_codes_that_are_not_integers_are_refused(strategy, codes):
    """groups(at=...), decode and decode_numbers cast codes with np.asarray(dtype=int64):
    0.9 read as code 0, 1.5 and True as code 1 and the text "1" as code 1, so another
    group's payload and value came back silently; None raised a bare TypeError."""
    from ringml.rings import IntegerRing

    from ringml.errors import InputTypeError
    from ringml.query import Query

    m = Maintainer(Query({"R": ["A", "B"]}, IntegerRing(), free=["A"]), strategy=strategy)
    m.insert("R", pd.DataFrame({"A": [10, 20, 20], "B": [1, 1, 2]}))
    for read in (
        lambda: m.groups(at=np.asarray(codes, dtype=object).reshape(-1, 1)),
        lambda: m.groups(at=codes),
        lambda: m.decode("A", codes),
        lambda: m.decode_numbers("A", codes),
    ):
        with pytest.raises(InputTypeError, match="integer codes"):
            read()
    whole = m.codes_of("A", [20, 10]).astype(float)  # integral floats are codes
    assert m.decode("A", whole).tolist() == [20, 10]
    assert m.groups(at=whole).support.tolist() == [2, 1]


def test_codes_of_and_groups_matching_take_mixed_lists_as_they_are():
    """A list mixing types went through np.asarray: ["a", 1] became the texts "a", "1" (the
    code of the group "1", not of 1) and [2**53 + 1, 0.5] floats (2**53: no code)."""
    from ringml.rings import IntegerRing

    from ringml.query import Query

    values = ["a", 1, "1", 2**53 + 1, 0.5]
    m = Maintainer(Query({"R": ["A", "B"]}, IntegerRing(), free=["A"]))
    m.insert("R", pd.DataFrame({"A": pd.Series(values, dtype=object), "B": range(5)}))
    for wanted in (["a", 1], [2**53 + 1, 0.5], (1, "1")):
        codes = m.codes_of("A", wanted)
        assert [type(v) for v in m.decode("A", codes)] == [type(v) for v in wanted]
        assert m.decode("A", codes).tolist() == list(wanted)
        groups = m.groups_matching(["A"], [wanted])[:, 0]
        assert sorted(m.decode("A", groups).tolist(), key=repr) == sorted(wanted, key=repr)


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "higher_order", "recompute"])
def test_derivation_counts_beyond_2_53_are_exact(strategy):
    """Per-group support counts were summed with float weights: 2**60 + 1 + 2 counted
    2**60, so deleting the rows left a group of count -3 (or dropped a live one)."""
    from ringml.rings import IntegerRing

    from ringml.batch import UpdateBatch
    from ringml.query import Query

    m = Maintainer(
        Query({"R": ["A", "B"], "S": ["B"]}, IntegerRing(), free=["A"]), strategy=strategy
    )
    m.insert("S", pd.DataFrame({"B": [1]}))
    rows = pd.DataFrame({"A": [1, 1], "B": [1, 1]})
    m.apply(UpdateBatch("R", rows, [2**60 + 1, 2]))
    assert m.groups().support.tolist() == [2**60 + 3] and m.result() == {(1,): 2**60 + 3}
    m.apply(UpdateBatch("R", rows, [-(2**60 + 1), -2]))
    assert m.result() == {} and len(m.groups()) == 0
