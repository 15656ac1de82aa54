"""Issue 9, item 4: bad input gets a clear ringml error and changes nothing.

One test (or parametrized test) per bullet of the item.  Every rejection asserts the error
class, that the message names the relation, column and value (where the input has them),
and that ``result()``, ``enumerate()`` and every stored view are exactly as before, under
every strategy; accepted data is checked against an independent oracle (Python equality,
pandas, scikit-learn).
"""

from __future__ import annotations

import datetime
import decimal
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from ringml.models import JoinChowLiu, JoinRegressor, SufficientStatsRegressor
from ringml.rings.base import RingError
from ringml.rings.covariance import CovarianceRing
from ringml.rings.scalar import IntegerRing
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder
from test_engine_errors import STRATEGIES, check_error, snapshot

import ringml as rm
from ringml.batch import UpdateBatch
from ringml.errors import (
    BatchError,
    InputTypeError,
    RingmlError,
    SchemaError,
    UnknownCategoryError,
    VariableOrderError,
)

RELS = {"R": ["k", "x"], "S": ["k", "y"]}
FREE = [(), ("k",)]


def data() -> dict[str, pd.DataFrame]:
    return {
        "R": pd.DataFrame({"k": [1, 1, 2, 3], "x": [1.0, 2.5, -3.0, 4.0]}),
        "S": pd.DataFrame({"k": [1, 2, 2, 4], "y": [10.0, 20.0, 30.0, 40.0]}),
    }


def query(ring: str, free=()) -> rm.Query:
    """COUNT, Σ, Σxxᵀ of x, y over R ⋈ S (``covariance``), the same with a categorical
    variable ``k`` kept (``categorical``, free=() only), or SUM(x·y) over ℤ (``integer``)."""
    if ring == "covariance":
        return rm.covariance_query(RELS, ["x", "y"], free=free)
    if ring == "categorical":
        return rm.covariance_query(RELS, ["k", "x", "y"], categorical=["k"])
    return rm.Query(RELS, IntegerRing(["x", "y"]), free=list(free))


def loaded(strategy: str, ring: str = "covariance", free=(), **options) -> rm.Maintainer:
    m = rm.Maintainer(query(ring, free), strategy=strategy, **options)
    for name, frame in data().items():
        if ring == "integer":
            frame = frame.assign(**{frame.columns[1]: [1, 2, 3, 4]})
        m.insert(name, frame)
    return m


def state(m: rm.Maintainer) -> dict:
    """The result, the enumeration of a grouped result and every stored view."""
    out = snapshot(m)
    if m.query.free:
        out["enumerate"] = sorted(m.enumerate(), key=repr)
    return out


def rejected(m: rm.Maintainer, call, error_class=BatchError, relation="R", column=None, value=None):
    """``call`` raises ``error_class`` naming relation/column/value and changes nothing."""
    before = state(m)
    with pytest.raises(error_class) as caught:
        call()
    assert isinstance(caught.value, RingmlError)
    if isinstance(caught.value, BatchError):
        check_error(caught.value, relation, column, value)
    else:
        for text in (relation, column, value):
            assert text is None or text in str(caught.value)
    assert state(m) == before
    return caught.value


def moments(m: rm.Maintainer, payload) -> tuple:
    """Count, Σ and Σxxᵀ in original units, categories ordered by value (comparable across
    maintainers whatever their shifts and category codes)."""
    ring = m.ring
    if isinstance(ring, CovarianceRing):
        return ring.moments(payload)
    codes = list(ring.count_tables(payload)[("k",)])
    by_value = sorted(codes, key=lambda code: m.decode("k", [code])[0])
    return ring.to_dense(payload, {"k": by_value})


def assert_same(m: rm.Maintainer, reference: rm.Maintainer) -> None:
    """The same result: exact over ℤ, to rounding for the covariance rings."""
    if isinstance(m.ring, IntegerRing):
        assert m.result() == reference.result()
        return
    a, b = m.result(), reference.result()
    if not m.query.free:
        a, b = {(): a}, {(): b}
    assert a.keys() == b.keys()
    for key in a:
        for x, y in zip(moments(m, a[key]), moments(reference, b[key]), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-9)


def still_works(m: rm.Maintainer, ring: str = "covariance", free=()) -> None:
    """A good batch after the rejection gives what it gives on a fresh maintainer."""
    good = pd.DataFrame({"k": [2], "x": [7.0 if ring != "integer" else 7]})
    m.insert("R", good)
    reference = loaded("recompute", ring, free)
    reference.insert("R", good)
    assert_same(m, reference)


# ------------------------------------------------------------------ 1. feature values
FEATURE_VALUES = [
    ("numeric string", pd.DataFrame({"k": [1, 2], "x": [1.0, "1.5"]}, dtype=object), "'1.5'"),
    ("boolean in objects", pd.DataFrame({"k": [1, 2], "x": [1.0, True]}, dtype=object), "True"),
    ("boolean column", pd.DataFrame({"k": [1, 2], "x": [True, False]}), "True"),
    ("complex", pd.DataFrame({"k": [1, 2], "x": [1 + 2j, 2.0]}), "(1+2j)"),
    (
        "Timestamp",
        pd.DataFrame({"k": [1, 2], "x": [1.0, pd.Timestamp("2024-01-02")]}, dtype=object),
        "Timestamp('2024-01-02",
    ),
    (
        "datetime64 column",
        pd.DataFrame({"k": [1, 2], "x": pd.to_datetime(["2024-01-02", "2024-01-03"])}),
        "Timestamp('2024-01-02",
    ),
    ("Timedelta", pd.DataFrame({"k": [1, 2], "x": pd.to_timedelta(["1s", "2s"])}), "Timedelta("),
    (  # numpy registers its durations as integers: this one was read as the number 5
        "numpy timedelta64 in objects",
        pd.DataFrame({"k": [1, 2], "x": [np.timedelta64(5, "s"), 2.0]}, dtype=object),
        "timedelta(seconds=5)",
    ),
    (
        "pandas NA (nullable Int64)",
        pd.DataFrame({"k": [1, 2], "x": pd.array([1, None], dtype="Int64")}),
        "<NA>",
    ),
    ("pandas NA (objects)", pd.DataFrame({"k": [1, 2], "x": [1.0, pd.NA]}, dtype=object), "<NA>"),
    ("None", pd.DataFrame({"k": [1, 2], "x": [1.0, None]}, dtype=object), "None"),
]


# (ring, free variables); the categorical query keeps k bound (it is a feature)
RING_FREE = [
    ("covariance", ()),
    ("covariance", ("k",)),
    ("integer", ()),
    ("integer", ("k",)),
    ("categorical", ()),
]


@pytest.mark.parametrize(("ring", "free"), RING_FREE)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    ("name", "rows", "value"), FEATURE_VALUES, ids=[case[0] for case in FEATURE_VALUES]
)
def test_feature_values_that_are_not_real_numbers_are_rejected(
    name, rows, value, strategy, ring, free
):
    """Booleans are rejected too, not read as 0/1: a bool feature is asked for by casting
    the column to int (an accidental flag column must not become a silent regressor)."""
    m = loaded(strategy, ring, free)
    error = rejected(m, lambda: m.insert("R", rows), BatchError, "R", "x", value)
    assert "feature value" in str(error) and error.column == "x"
    still_works(m, ring, free)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strings_and_timestamps_are_valid_keys_and_nullable_numbers_valid_features(strategy):
    """The same values are fine as join keys; an Int64 column without NA is a feature."""
    q = rm.covariance_query({"R": ["when", "x"], "S": ["when", "y"]}, ["x", "y"])
    m = rm.Maintainer(q, strategy=strategy)
    days = pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-02"])
    r = pd.DataFrame({"when": days, "x": pd.array([1, 2, 3], dtype="Int64")})
    s = pd.DataFrame({"when": [days[1], pd.Timestamp("2024-01-05")], "y": [0.5, 2.0]})
    m.insert("R", r)
    m.insert("S", s)
    flat = r.astype({"x": float}).merge(s, on="when")
    stats = q.ring.statistics(m.result())
    assert stats.count == len(flat) == 2
    np.testing.assert_allclose(stats.mean, flat[["x", "y"]].mean().to_numpy())


# ------------------------------------------------------------------ 2. overflow
@pytest.mark.parametrize("ring", ["covariance", "categorical"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_float_overflow_in_products_is_rejected(strategy, ring):
    """1e200 and -1e200 are finite, but x² (after the shift by their mean 0) is not."""
    m = rm.Maintainer(query(ring), strategy=strategy)
    m.insert("S", data()["S"])
    rows = pd.DataFrame({"k": [1, 2], "x": [1e200, -1e200]})
    error = rejected(m, lambda: m.insert("R", rows), BatchError, "R", "x", "1e+200")
    assert "overflow" in str(error) and error.value == 1e200
    m.insert("R", data()["R"])  # the shift the rejected batch may have fixed does no harm
    assert_same(m, loaded("recompute", ring))


@pytest.mark.parametrize("ring", ["covariance", "categorical"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_counts_beyond_int64_are_rejected(strategy, ring):
    """k=2 has two S tuples: a multiplicity of 2**62 gives the count 2**63 (IntegerRing
    rejects this already; the covariance rings wrapped around or lost exactness)."""
    m = loaded(strategy, ring)
    batch = UpdateBatch("R", pd.DataFrame({"k": [2], "x": [1.0]}), np.array([2**62]))
    error = rejected(m, lambda: m.apply(batch), BatchError, "R", "multiplicity", str(2**62))
    assert "overflow" in str(error)
    still_works(m, ring)


def test_covariance_ring_guards_every_count_product_and_sum():
    """The batched operations the engine uses refuse counts that leave int64 and deltas that
    overflowed float64, and ``batch_scatter_add`` refuses them before changing its target."""
    ring = CovarianceRing(["a", "b"], shift=False)
    big = ring.batch_scale(ring.batch_ones(2), np.array([2**32, 3]))
    near = ring.batch_scale(ring.batch_ones(2), np.array([2**62, 2**62]))
    lifted = ring.batch_lift("a", np.array([1.0, 2.0]))
    weights = np.array([2**62, 2**62])
    for call in (
        lambda: ring.batch_mul(big, big),  # 2**64
        lambda: ring.batch_scale(big, np.array([2**31, 1])),  # 2**63
        lambda: ring.batch_mul_sum([big, ring.batch_lift("b", np.ones(2)), big]),  # fused
        lambda: ring.batch_sum_by(near, np.zeros(2, dtype=np.int64), 1),  # 2**63
        lambda: ring.batch_add(near, near),
        lambda: ring.batch_lift_block_sum_by(["a"], [np.ones(2)], None, 1, weights),
    ):
        with pytest.raises(RingError, match="int64 overflow"):
            call()
    assert ring.batch_mul(big, lifted).count.tolist() == [2**32, 3]  # within range: exact
    target = ring.batch_accumulator(2, block=(0,))
    target = ring.batch_scatter_add(target, np.arange(2), lifted)
    target = ring.batch_scatter_add(target, np.arange(2), near)  # counts 2**62 + 1 fit
    kept = (target.count.copy(), target.sums.copy(), target.products.copy())
    huge = ring.batch_lift("a", np.array([1e200, 3.0]))  # its square is inf
    for values, message in ((huge, "float64 overflow"), (near, "int64 overflow")):
        with pytest.raises(RingError, match=message):
            ring.batch_scatter_add(target, np.arange(2), values)
        np.testing.assert_array_equal(target.count, kept[0])
        np.testing.assert_array_equal(target.sums, kept[1])
        np.testing.assert_array_equal(target.products, kept[2])


# ------------------------------------------------------------------ 3. uint64 keys
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_uint64_key_beyond_int64_joins_only_equal_numbers(strategy):
    """2**64-1 as uint64 must not join the int64 key -1 (it wrapped around to it), nor the
    string of its digits; it joins the same number held as a Python int."""
    big = 2**64 - 1
    r_keys = np.array([big, 5], dtype=np.uint64)
    s_keys = [-1, 5, big, str(big)]
    q = rm.Query({"R": ["k", "a"], "S": ["k", "b"]}, IntegerRing(), free=["a", "b"])
    m = rm.Maintainer(q, strategy=strategy)
    m.insert("R", pd.DataFrame({"k": r_keys, "a": [1, 2]}))
    m.insert("S", pd.DataFrame({"k": s_keys, "b": [10, 20, 30, 40]}, dtype=object))
    oracle = {}
    for ka, a in zip(r_keys.tolist(), [1, 2], strict=True):
        for kb, b in zip(s_keys, [10, 20, 30, 40], strict=True):
            if ka == kb:  # Python's equality: 2**64-1 != -1 and != its string
                oracle[(a, b)] = oracle.get((a, b), 0) + 1
    assert m.result() == oracle == {(1, 30): 1, (2, 20): 1}
    assert sorted(m.enumerate()) == sorted(oracle.items())
    # the delete check tells the two apart too
    rejected(
        m,
        lambda: m.delete("S", pd.DataFrame({"k": [big - 1], "b": [30]}, dtype=object)),
        BatchError,
        "S",
        "k",
        str(big - 1),
    )
    m.delete("R", pd.DataFrame({"k": np.array([big], dtype=np.uint64), "a": [1]}))
    assert m.result() == {(2, 20): 1}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_uint64_tuples_are_told_apart_exactly_by_the_delete_check(strategy):
    """2**60 + 1 and 2**60 are the same float64 (uint64 tuples were fingerprinted through
    it), and 2**64 - 1 is not -1: deleting the one that is not present is rejected."""
    q = rm.Query({"R": ["k", "a"], "S": ["a", "b"]}, IntegerRing(), free=["k"])
    m = rm.Maintainer(q, strategy=strategy)
    m.insert("S", pd.DataFrame({"a": [1, 2], "b": [1, 1]}))
    present = [2**60 + 1, 2**64 - 1]
    m.insert("R", pd.DataFrame({"k": np.array(present, dtype=np.uint64), "a": [1, 2]}))
    assert m.result() == {(2**60 + 1,): 1, (2**64 - 1,): 1}
    for absent, a in (
        (np.array([2**60], dtype=np.uint64), 1),
        (np.array([2**60 + 2], dtype=np.uint64), 1),
        (np.array([-1]), 2),
        (np.array([2**64 - 2], dtype=np.uint64), 2),
    ):
        rows = pd.DataFrame({"k": absent, "a": [a]})
        error = rejected(m, lambda rows=rows: m.delete("R", rows), BatchError, "R")
        assert "not present" in str(error) and str(absent[0]) in str(error)
    # the same numbers are present, whatever the column's type
    m.delete("R", pd.DataFrame({"k": np.array([2**60 + 1]), "a": [1]}))
    m.delete("R", pd.DataFrame({"k": [2**64 - 1], "a": [2]}, dtype=object))
    assert m.result() == {}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    "present, absent",
    [
        # np.abs(-2**63) overflowed, so it was keyed by its float bits: this integer
        (np.array([-(2**63)]), np.array([-4332462841530417152])),
        (np.array([-4332462841530417152]), np.array([-(2**63)])),
        # integers beyond 2**53 were keyed raw: 1.0's bit pattern
        (np.array([4607182418800017408]), np.array([1.0])),
        (np.array([1.0]), np.array([4607182418800017408])),
        (np.array([0.5]), np.array([4602678819172646912])),
        (np.array([2**53 + 1]), np.array([2.0**53])),
    ],
)
def test_fingerprint_collisions_of_the_old_keys_are_told_apart(strategy, present, absent):
    """Deleting a value that only shared the old tuple key of the present one is rejected,
    naming the relation, with every view unchanged; the present one deletes."""
    q = rm.Query({"R": ["k", "a"], "S": ["a", "b"]}, IntegerRing(), free=["k"])
    m = rm.Maintainer(q, strategy=strategy)
    m.insert("S", pd.DataFrame({"a": [1], "b": [1]}))
    m.insert("R", pd.DataFrame({"k": present, "a": [1]}))
    error = rejected(m, lambda: m.delete("R", pd.DataFrame({"k": absent, "a": [1]})), relation="R")
    assert "not present" in str(error)
    m.delete("R", pd.DataFrame({"k": present, "a": [1]}))
    assert m.result() == {}


EQUAL_KEYS = [  # one number in different column types (object: as Python ints and floats)
    [np.array([1]), np.array([1.0]), np.array([1], object), np.array([1], np.uint64)],
    [np.array([True]), np.array([1.0], object), np.array([1.0], np.float32), np.array([1])],
    [np.array([-(2**63)]), np.array([-(2.0**63)]), np.array([-(2**63)], object)],
    [np.array([2**60]), np.array([2.0**60]), np.array([2**60], np.uint64)],
    [np.array([2**64 - 1], np.uint64), np.array([2**64 - 1], object)],
    [np.array([2**63], np.uint64), np.array([2.0**63]), np.array([2**63], object)],
    [np.array([2**70], object), np.array([2.0**70]), np.array([2.0**70], object)],
    [np.array([10**20], object), np.array([1e20])],
    [np.array([0]), np.array([-0.0]), np.array([-0.0], object)],
]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_equal_numbers_of_any_column_type_are_one_tuple(strategy):
    """A tuple inserted with its key in one column type deletes with it in another (Python's
    ``==``: ``2.0**70 == 2**70``, which no uint64 holds), and joins it."""
    q = rm.Query({"R": ["k", "a"], "S": ["k", "b"]}, IntegerRing(), free=["k"])
    m = rm.Maintainer(q, strategy=strategy)
    for group in EQUAL_KEYS:
        for put, take in zip(group, group[1:] + group[:1], strict=True):
            m.insert("R", pd.DataFrame({"k": put, "a": [1]}))
            m.insert("S", pd.DataFrame({"k": take, "b": [1]}))
            assert list(m.result().values()) == [1], (put, take)
            m.delete("R", pd.DataFrame({"k": take, "a": [1]}))
            m.delete("S", pd.DataFrame({"k": put, "b": [1]}))
            assert m.result() == {}


# (left key, right key, whether Python finds them equal): values of other types than int,
# float and str, in object columns, join exactly when they are equal
_UTC_NOON = pd.Timestamp("2020-01-01 12:00", tz="UTC")
TYPED_KEYS = [
    (decimal.Decimal("1"), "1", False),
    (decimal.Decimal("1"), 1, True),
    (decimal.Decimal("1.5"), 1.5, True),
    (decimal.Decimal("0.1"), 0.1, False),  # 0.1 is not the float nearest to it
    (decimal.Decimal("0.10"), decimal.Decimal("0.1"), True),
    (decimal.Decimal("2") ** 70, 2**70, True),
    (datetime.date(2020, 1, 1), "2020-01-01", False),
    (datetime.date(2020, 1, 1), datetime.date(2020, 1, 1), True),
    (datetime.date(2020, 1, 1), datetime.datetime(2020, 1, 1), False),
    (datetime.datetime(2020, 1, 1, 12), pd.Timestamp("2020-01-01 12:00"), True),
    (datetime.datetime(2020, 1, 1, 12), "2020-01-01 12:00:00", False),
    (_UTC_NOON, _UTC_NOON.tz_convert("Europe/Oslo"), True),
    (_UTC_NOON, pd.Timestamp("2020-01-01 12:00"), False),  # aware vs naive
    (datetime.timedelta(seconds=1), pd.Timedelta(1, "s"), True),
    (datetime.timedelta(0), 0, False),
    (np.timedelta64(1, "s"), pd.Timedelta(1, "s"), True),  # it was keyed as the integer 1
    (np.timedelta64(1, "s"), datetime.timedelta(microseconds=1_000_001), False),
    (b"a", "a", False),
    (b"a", b"a", True),
    (np.True_, 1, True),
    (np.True_, "True", False),
]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_keys_of_any_type_join_exactly_when_python_finds_them_equal(strategy):
    """Keys used to be matched by their text (Decimal("1") joined "1", a date its ISO
    string, b"a" the text "a"); now a key meets only the keys Python finds equal, and the
    delete check tells them apart the same way."""
    q = rm.Query({"R": ["k", "a"], "S": ["k", "b"]}, IntegerRing())
    for left, right, equal in TYPED_KEYS:
        assert (left == right) == equal, (left, right)  # the oracle is Python's ==
        m = rm.Maintainer(q, strategy=strategy)
        m.insert("R", pd.DataFrame({"k": pd.Series([left], dtype=object), "a": [1]}))
        m.insert("S", pd.DataFrame({"k": pd.Series([right], dtype=object), "b": [1]}))
        assert m.result() == int(equal), (left, right)
        if equal:
            m.delete("R", pd.DataFrame({"k": pd.Series([right], dtype=object), "a": [1]}))
            assert m.result() == 0
        else:
            error = rejected(
                m,
                lambda m=m, right=right: m.delete(
                    "R", pd.DataFrame({"k": pd.Series([right], dtype=object), "a": [1]})
                ),
            )
            assert "not present" in str(error)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    "value", [(1, 2), [2, 3], {"a": 1}, {1}, object()], ids=lambda v: type(v).__name__
)
def test_values_of_other_types_are_rejected_as_keys(strategy, value):
    """A tuple, list, dict, set or other object as a key is a BatchError naming the
    relation, column and the value's type (lists used to raise a bare TypeError, tuples
    were keyed by their text)."""
    m = loaded(strategy, "integer", ("k",))
    rows = pd.DataFrame({"k": pd.Series([1, value], dtype=object), "x": [1, 2]})
    error = rejected(m, lambda: m.insert("R", rows), BatchError, "R", "k")
    assert type(value).__name__ in str(error) and "cannot be a key" in str(error)


def test_a_dictionary_pickled_under_the_old_keying_is_keyed_again():
    """A dictionary from before the keys of decimals, dates and bytes changed finds its
    values again after unpickling (its index is rebuilt from the values it holds)."""
    from ringml.encoding import Dictionary

    values = np.array(
        ["1", decimal.Decimal("1.25"), datetime.date(2020, 1, 1), b"a", 7, 2.5], dtype=object
    )
    d = Dictionary("k")
    codes = d.encode(values)
    old = d.__getstate__() if hasattr(d, "__getstate__") else dict(d.__dict__)
    old = dict(old)
    del old["_keying"]  # pickled before the keying had a version ...
    old["_indices"] = {}  # ... with keys that no longer match
    restored = Dictionary.__new__(Dictionary)
    restored.__setstate__(old)
    np.testing.assert_array_equal(restored.lookup(values), codes)
    assert restored.lookup(np.array(["2020-01-01"], dtype=object))[0] == -1
    np.testing.assert_array_equal(restored.encode(values[::-1]), codes[::-1])
    assert len(restored) == len(values)


# ------------------------------------------------------------------ 4. schemas
def test_schema_mistakes_are_rejected_when_the_query_is_made():
    with pytest.raises(SchemaError, match=r"relation 'R'.*string 'AB'"):
        rm.Query({"R": "AB"})
    with pytest.raises(SchemaError, match="not the string 'AB'"):
        rm.Query({"R": ["A", "B"]}, free="AB")
    with pytest.raises(SchemaError, match="relation 'R' has no columns"):
        rm.Query({"R": [], "S": ["A"]})
    with pytest.raises(SchemaError, match=r"lifts variables \['Z'\]"):
        rm.covariance_query({"R": ["A", "B"], "S": ["A", "C"]}, features=["B", "Z"])
    with pytest.raises(SchemaError, match=r"lifts variables \['Z'\]"):
        rm.Query({"R": ["A", "B"]}, IntegerRing(["Z"]))
    q = rm.Query({"R": ["A", "B"], "S": ["A", "C"], "RS": ["A"]})
    with pytest.raises(SchemaError, match="not the string 'RS'"):
        rm.Maintainer(q, updatable="RS")
    assert rm.Maintainer(q, updatable=["RS"]).updatable == {"RS"}


@pytest.mark.parametrize("free", FREE)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_duplicate_column_names_in_a_batch_are_rejected(strategy, free):
    m = loaded(strategy, "covariance", free)
    rows = pd.DataFrame([[1, 2.0, 3.0]], columns=["k", "x", "x"])
    rejected(m, lambda: m.insert("R", rows), BatchError, "R", "x")
    still_works(m, "covariance", free)


# ------------------------------------------------------------------ 5. variable orders
@pytest.mark.parametrize(
    ("text", "junk"),
    [("k{ x{R};; y{S} }", ";"), ("k{ x{R}, # y{S} }", "#"), ("k{ unit-price{R}, y{S} }", "-")],
)
def test_junk_in_variable_order_text_is_rejected_with_its_position(text, junk):
    q = rm.Query({"R": ["k", "x"], "S": ["k", "y"]})
    at = text.index(junk)
    for parse in (
        lambda: rm.VariableOrder.parse(text, q),
        lambda: rm.Maintainer(q, order=text),
    ):
        with pytest.raises(VariableOrderError) as caught:
            parse()
        assert f"unexpected {junk!r} at position {at}" in str(caught.value)
    clean = text.replace(";;", ",").replace("# ", "").replace("unit-price", "x")
    assert str(rm.Maintainer(q, order=clean).order) == "k{x, y}"


@pytest.mark.parametrize(
    ("text", "at", "junk"),
    [
        ("k{x y}", 4, "y"),  # was read as k{x, y}
        ("k{ x{R} y{S} }", 8, "y"),
        ("k x{R}, y{S}", 2, "x"),
        ("k{x} y", 5, "y"),
        ("{k{x, y}}", 0, "{"),
        ("k{{x, y}}", 2, "{"),
        ("k{x, y}}", 7, "}"),
    ],
)
def test_names_without_commas_or_stray_brackets_are_rejected_with_their_position(text, at, junk):
    q = rm.Query({"R": ["k", "x"], "S": ["k", "y"]})
    assert text[at] == junk
    for parse in (
        lambda: rm.VariableOrder.parse(text, q),
        lambda: rm.Maintainer(q, order=text),
    ):
        with pytest.raises(VariableOrderError) as caught:
            parse()
        assert f"unexpected {junk!r} at position {at}" in str(caught.value)
    # commas, also extra ones, are what separates names
    for clean in ("k{x, y}", "k{ x{R}, y{S} }", "k{,x,,y,}", "k{x,y},"):
        assert str(rm.VariableOrder.parse(clean, q)) == "k{x, y}"


# ------------------------------------------------------------------ 6. wrong types
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_wrong_argument_types_raise_a_type_error_saying_what_is_expected(strategy):
    m = loaded(strategy)
    frame = pd.DataFrame({"k": [1], "x": [1.0]})
    cases = [
        (lambda: m.apply([frame]), "UpdateBatch", "item 0 is a DataFrame"),
        (lambda: m.apply({"R": frame}), "UpdateBatch", "got dict"),
        (lambda: m.apply(frame), "UpdateBatch", "got DataFrame"),
        (lambda: m.apply_factorized("R", [{"k": 1}, {"x": [1.0]}]), "'R'", "scalar 1"),
        (lambda: m.apply_factorized("R", {"k": [1], "x": [1.0]}), "'R'", "list of DataFrames"),
        (lambda: m.insert("R", "k,x\n1,2.0"), "'R'", "not the string"),
        (lambda: m.insert("R", {"k": 1, "x": 2.0}), "'R'", "column 'k' holds the scalar 1"),
        (lambda: m.delete("R", 5), "'R'", "DataFrame"),
    ]
    for call, *texts in cases:
        before = state(m)
        with pytest.raises(InputTypeError) as caught:
            call()
        assert isinstance(caught.value, TypeError) and isinstance(caught.value, RingmlError)
        for text in texts:
            assert text in str(caught.value)
        assert state(m) == before
    with pytest.raises(InputTypeError, match="order must be a VariableOrder.*got int 123"):
        rm.Maintainer(query("covariance"), order=123, strategy=strategy)
    # the forms that are meant: a dict of column lists as rows and as factors
    m.insert("R", {"k": [2], "x": [7.0]})
    m.apply_factorized("R", [{"k": [3]}, pd.DataFrame({"x": [1.0, 2.0]})])
    reference = loaded("recompute")
    reference.insert("R", pd.DataFrame({"k": [2, 3, 3], "x": [7.0, 1.0, 2.0]}))
    assert_same(m, reference)


# ------------------------------------------------------------------ 7. loading phase
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_rejected_first_insert_does_not_end_the_loading_phase(strategy):
    m = rm.Maintainer(query("covariance"), updatable=["R"], strategy=strategy)
    m.load("S", data()["S"].iloc[:2])
    bad = pd.DataFrame({"k": [1], "x": ["oops"]})
    rejected(m, lambda: m.insert("R", bad), BatchError, "R", "x", "'oops'")
    rejected(m, lambda: m.apply_factorized("R", [{"k": [1]}, {"x": ["oops"]}]), column="x")
    m.load("S", data()["S"].iloc[2:])  # still loading: static S takes its other rows
    m.insert("R", data()["R"])
    assert_same(m, loaded("recompute"))
    with pytest.raises(SchemaError, match="streaming has started"):
        m.load("S", data()["S"])


# ------------------------------------------------------------------ 8. flat regressor deletes
def test_regressor_rejects_retracting_rows_never_added():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 2))
    y = X @ [2.0, -1.0] + 0.5 + rng.normal(0, 0.1, 40)
    model = SufficientStatsRegressor(solver="cholesky").fit(X[:30], y[:30])
    before = (model.coef_.copy(), model.intercept_, model.n_samples_seen_)
    payload = model.ring_.to_bytes(model.payload_)
    never = [
        lambda: model.delete(X[30:], y[30:]),  # as many rows as there are: count would be 0
        lambda: model.delete(X[:3], y[:3] + 1.0),  # same x, another y
        lambda: model.partial_fit(X[30:32], y[30:32], sample_weight=[-1, -1]),
        lambda: model.partial_fit(X[:2], y[:2], sample_weight=[-2, -1]),  # row 0 is there once
    ]
    for call in never:
        with pytest.raises(BatchError, match="never added") as caught:
            call()
        assert isinstance(caught.value, ValueError)
        np.testing.assert_array_equal(model.coef_, before[0])
        assert (model.intercept_, model.n_samples_seen_) == before[1:]
        assert model.ring_.to_bytes(model.payload_) == payload
    model.delete(X[:10], y[:10])  # rows that were added: an exact retraction
    model.partial_fit(X[10:12], y[10:12], sample_weight=[-1, -1])
    sk = LinearRegression().fit(X[12:30], y[12:30])
    np.testing.assert_allclose(model.coef_, sk.coef_, rtol=1e-9)
    assert model.intercept_ == pytest.approx(sk.intercept_, rel=1e-9)
    assert model.n_samples_seen_ == 18


# ------------------------------------------------------------------ 9. Arrow batches, arrays
class ArrowFrame:
    """A polars-like frame: nothing but ``to_arrow()``."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def to_arrow(self) -> pa.Table:
        return self.table


class ArrowStream:
    """Any frame exposing the Arrow PyCapsule stream protocol."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __arrow_c_stream__(self, requested_schema=None):
        return self.table.__arrow_c_stream__(requested_schema)


class Interchange:
    """Any frame exposing the ``__dataframe__`` interchange protocol (and nothing else)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __dataframe__(self, nan_as_null: bool = False, allow_copy: bool = True):
        return self.table.__dataframe__(nan_as_null, allow_copy)


@pytest.mark.parametrize(
    "wrap",
    [lambda t: t, ArrowFrame, ArrowStream, Interchange],
    ids=["table", "to_arrow", "capsule", "interchange"],
)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_arrow_tables_and_arrow_frames_are_batches(strategy, wrap):
    m = rm.Maintainer(query("covariance"), strategy=strategy)
    for name, frame in data().items():
        m.insert(name, wrap(pa.Table.from_pandas(frame, preserve_index=False)))
    m.delete("R", wrap(pa.table({"k": [1], "x": [2.5]})))
    reference = rm.Maintainer(query("covariance"), strategy=strategy)
    for name, frame in data().items():
        reference.insert(name, frame)
    reference.delete("R", pd.DataFrame({"k": [1], "x": [2.5]}))
    assert m.result() == reference.result()
    bad = wrap(pa.table({"k": [1], "x": ["2.5"]}))
    rejected(m, lambda: m.insert("R", bad), BatchError, "R", "x", "'2.5'")


def test_real_polars_frames_are_batches():
    pl = pytest.importorskip("polars")
    m = rm.Maintainer(query("covariance"))
    reference = rm.Maintainer(query("covariance"))
    for name, frame in data().items():
        m.insert(name, pl.from_pandas(frame))
        reference.insert(name, frame)
    assert m.result() == reference.result()


def join_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    r = pd.DataFrame({"k": rng.integers(0, 10, 200), "x": rng.normal(size=200)})
    r["c"] = rng.choice(list("abc"), 200)
    s = pd.DataFrame({"k": np.arange(10), "z": rng.normal(size=10)})
    r["y"] = 3.0 * r["x"] + (r["c"] == "b") * 2.0 + rng.normal(0, 0.1, 200)
    return r, s


def test_join_regressor_predicts_on_arrays_like_scikit_learn():
    r, s = join_data()
    schemas = {"R": ["k", "x", "c", "y"], "S": ["k", "z"]}
    model = JoinRegressor(schemas, "y", ["x", "z"], solver="cholesky").fit({"R": r, "S": s})
    flat = r.merge(s, on="k")
    sk = LinearRegression().fit(flat[["x", "z"]].to_numpy(), flat["y"])
    X = flat[["x", "z"]].to_numpy()
    np.testing.assert_allclose(model.predict(X), sk.predict(X), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(model.predict(X.tolist()), model.predict(flat))
    np.testing.assert_allclose(model.predict(pa.Table.from_pandas(flat)), model.predict(flat))
    with pytest.raises(ValueError, match="X has 3 features, but JoinRegressor is expecting 2"):
        model.predict(flat[["x", "z", "y"]].to_numpy())
    with pytest.raises(ValueError, match="2D array"):
        model.predict(X[:, 0])


# feature values the engine rejects are rejected by the models too (the same check)
MODEL_FEATURE_VALUES = [
    ("numeric string", ["1.5", 2.0], "'1.5'"),
    ("boolean", [1.0, True], "True"),
    ("None", [1.0, None], "None"),
    ("pandas NA", [pd.NA, 1.0], "<NA>"),
    ("date", [1.0, pd.Timestamp("2024-01-02")], "Timestamp('2024-01-02"),
    ("complex", [1.0, 2j], "2j"),
]


@pytest.mark.parametrize(
    ("name", "values", "value"), MODEL_FEATURE_VALUES, ids=[c[0] for c in MODEL_FEATURE_VALUES]
)
def test_join_regressor_predict_rejects_what_the_engine_rejects(name, values, value):
    r, s = join_data()
    schemas = {"R": ["k", "x", "c", "y"], "S": ["k", "z"]}
    model = JoinRegressor(schemas, "y", ["x", "c", "z"], ["c"], solver="cholesky")
    model.fit({"R": r, "S": s})
    rows = pd.DataFrame({"x": values, "c": ["a", "b"], "z": [0.5, 1.0]}, dtype=object)
    with pytest.raises(BatchError) as caught:
        model.predict(rows)
    assert (caught.value.column, caught.value.relation) == ("x", None)
    assert "column 'x'" in str(caught.value) and value in str(caught.value)
    with pytest.raises(BatchError):  # a mapping of columns goes the same way
        model.predict({"x": values, "c": ["a", "b"], "z": [0.5, 1.0]})
    # the same rows with real numbers are fine, as a frame or as rows of mixed values
    good = pd.DataFrame({"x": [1.5, 2.0], "c": ["a", "b"], "z": [0.5, 1.0]})
    expected = model.predict(good)
    for same in (good.astype(object), good.to_numpy().tolist(), good.astype({"x": "Float64"})):
        np.testing.assert_allclose(model.predict(same), expected)


@pytest.mark.parametrize(
    ("name", "values", "value"), MODEL_FEATURE_VALUES, ids=[c[0] for c in MODEL_FEATURE_VALUES]
)
@pytest.mark.parametrize("first", [True, False])
def test_join_chow_liu_continuous_columns_reject_what_the_engine_rejects(
    name, values, value, first
):
    """Continuous variables are binned before the engine sees them: the binning checks the
    values the same way (before: numeric strings coerced, booleans read as 0/1)."""
    model = JoinChowLiu(RELS, ["x", "y"], continuous=["x"], n_bins=4)
    model.fit({"S": data()["S"]} if first else data())
    before = (model.mutual_info_.copy(), model.n_samples_seen_, dict(model.binners_))
    rows = pd.DataFrame({"k": [1, 2], "x": values}, dtype=object)
    with pytest.raises(BatchError) as caught:
        model.partial_fit({"R": rows})
    check_error(caught.value, "R", "x", value)
    pd.testing.assert_frame_equal(model.mutual_info_, before[0])
    assert (model.n_samples_seen_, model.binners_) == before[1:]
    model.partial_fit({"R": rows.assign(x=[1.5, 2.0])})  # real numbers are fine
    assert model.n_samples_seen_ == before[1] + 3  # k=1 joins one S row, k=2 two


# ------------------------------------------------------------------ 10. unseen categories
@pytest.mark.parametrize("handle_unknown", ["error", "ignore"])
def test_unseen_category_at_predict_time_follows_handle_unknown(handle_unknown):
    r, s = join_data(1)
    schemas = {"R": ["k", "x", "c", "y"], "S": ["k", "z"]}
    model = JoinRegressor(
        schemas, "y", ["x", "c", "z"], ["c"], solver="cholesky", handle_unknown=handle_unknown
    ).fit({"R": r, "S": s})
    flat = r.merge(s, on="k")
    new = flat.iloc[:4].copy()
    new["c"] = ["a", "zzz", "c", "b"]
    # scikit-learn's convention as the oracle: one-hot (first category dropped) + OLS
    sk = make_pipeline(one_hot(handle_unknown), LinearRegression())
    sk.fit(flat[["x", "c", "z"]], flat["y"])
    np.testing.assert_allclose(model.predict(flat), sk.predict(flat[["x", "c", "z"]]), rtol=1e-9)
    if handle_unknown == "ignore":
        np.testing.assert_allclose(model.predict(new), sk.predict(new[["x", "c", "z"]]), rtol=1e-9)
        return
    coef = model.coef_.copy()
    with pytest.raises(UnknownCategoryError) as caught:
        model.predict(new)
    assert isinstance(caught.value, ValueError)
    assert (caught.value.column, caught.value.value) == ("c", "zzz")
    assert "'c'" in str(caught.value) and "'zzz'" in str(caught.value)
    with pytest.raises(ValueError, match="'zzz'"):
        sk.predict(new[["x", "c", "z"]])  # scikit-learn rejects it too
    np.testing.assert_array_equal(model.coef_, coef)
    with pytest.raises(ValueError, match="handle_unknown"):
        JoinRegressor(schemas, "y", handle_unknown="skip").fit({"R": r, "S": s})


def one_hot(handle_unknown: str) -> ColumnTransformer:
    """Column ``c`` one-hot encoded with its first category dropped; the others as they are."""
    return ColumnTransformer(
        [("c", OneHotEncoder(drop="first", handle_unknown=handle_unknown), ["c"])],
        remainder="passthrough",
    )


@pytest.mark.parametrize(
    "multiplicity",
    [[2**63], np.array([2**64 - 1], dtype=np.uint64), [2**70], [1e19], [-(2**63)]],
)
def test_multiplicities_beyond_int64_are_refused(multiplicity):
    """They wrapped around: 2**63 became -2**63 (a delete), uint64 2**64 - 1 became -1."""
    m = rm.Maintainer(rm.Query({"R": ["A"]}, IntegerRing()), allow_absent_deletes=True)
    with pytest.raises(BatchError, match=r"multiplicity .* \(row 0\) is beyond int64"):
        m.apply(rm.UpdateBatch("R", pd.DataFrame({"A": [1]}), multiplicity))
    assert m.result() == 0


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "higher_order", "recompute"])
@pytest.mark.parametrize("multiplicity", [2, np.int64(-1), [[1, 1]], np.ones((2, 1), int)])
def test_multiplicities_not_one_per_row_are_refused_naming_their_shape(strategy, multiplicity):
    """A scalar multiplicity (UpdateBatch(R, rows, 2)) raised a bare IndexError reading its
    length; a (1, 2) array was reported as '1 multiplicities for 2 rows'."""
    m = rm.Maintainer(rm.Query({"R": ["A"]}, IntegerRing()), strategy=strategy)
    m.insert("R", pd.DataFrame({"A": [1]}))
    shape = np.shape(multiplicity)
    with pytest.raises(BatchError, match=rf"multiplicities of shape {re.escape(str(shape))}"):
        m.apply(rm.UpdateBatch("R", pd.DataFrame({"A": [1, 2]}), multiplicity))
    assert m.result() == 1 and m.tuples_applied == 1


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "higher_order", "recompute"])
@pytest.mark.parametrize("empty", [[], {}, pd.DataFrame()])
def test_no_rows_given_without_columns_are_an_empty_batch(strategy, empty):
    """An empty list of records (a stream's quiet micro-batch), {} or a bare DataFrame()
    has no columns: it was refused as 'missing' every column, the loading of a static
    relation included, where rows with the columns but none of them were a no-op."""
    query = rm.natural_join_query({"R": ["a", "b"], "S": ["b", "c"]}, free=["a"])
    m = rm.Maintainer(query, strategy=strategy, updatable=["R"])
    m.load("S", empty)
    m.load("S", {"b": [1, 1], "c": [5, 6]})
    m.insert("R", {"a": ["x", "y"], "b": [1, 1]})
    assert not m.insert("R", empty) and not m.delete("R", empty)
    m.apply([rm.UpdateBatch("R", empty, [])])
    assert m.result() == {("x",): 2, ("y",): 2} and m.tuples_applied == 4


def test_rows_a_filter_drops_are_still_checked():
    """A relation's filter dropped rows before validation: a delete of a tuple never
    inserted, a None key and a tuple key passed silently when the filter rejected them."""
    m = rm.Maintainer(rm.Query({"R": ["A", "x"]}, IntegerRing(), filters={"R": "x > 0"}))
    m.insert("R", pd.DataFrame({"A": [1, 2], "x": [-5.0, 3.0]}))  # (1, -5.0): kept, filtered
    assert m.result() == 1
    m.delete("R", pd.DataFrame({"A": [1], "x": [-5.0]}))  # present: accepted
    for rows, message in [
        ({"A": [1], "x": [-5.0]}, "not present"),  # deleted above
        ({"A": [None], "x": [-1.0]}, "cannot be a key"),
        ({"A": [(1, 2)], "x": [-1.0]}, "cannot be a key"),
    ]:
        frame = pd.DataFrame(rows)
        apply = m.delete if message == "not present" else m.insert
        with pytest.raises(BatchError, match=message):
            apply("R", frame)
    assert m.result() == 1


def test_text_orders_over_relations_named_like_variables():
    """A relation named like a variable made a text order drop that variable and its whole
    subtree ('A{B{C}}' over relations A and B: 'variables A, B, C are missing')."""
    q = rm.Query({"A": ["A", "B"], "B": ["B", "C"]}, IntegerRing(), free=["A"])
    for order in ("A{B{C}}", "A{B{C, B}, A}"):  # the second also names the atoms as leaves
        m = rm.Maintainer(q, order=order)
        assert str(m.order) == "A{B{C}}"
        m.insert("A", {"A": [1, 1], "B": [2, 3]})
        m.insert("B", {"B": [2, 2], "C": [0, 1]})
        assert m.result() == {(1,): 2}
    unary = rm.Query({"R": ["K", "x"], "K": ["K"]}, IntegerRing())
    assert str(rm.Maintainer(unary, order="K{x}").order) == "K{x}"
    with pytest.raises(VariableOrderError):  # an atom with a subtree is no atom: R is unknown
        rm.Maintainer(rm.Query({"R": ["A", "B"]}, IntegerRing()), order="R{A{B}}")


@pytest.mark.parametrize(
    "relations, match",
    [({"R": [0, 1]}, "column names are strings, got 0"),
     ({"R": ["a", None]}, "column names are strings, got None"),
     ({1: ["a"]}, "relation names are strings, got 1")],
)  # fmt: skip
def test_names_that_are_not_strings_are_refused(relations, match):
    """Int column names were accepted, then explain(), fingerprint() and every checkpoint
    failed with a TypeError; None collided with the order's root sentinel."""
    with pytest.raises(SchemaError, match=match):
        rm.Query(relations, IntegerRing())


@pytest.mark.parametrize("order", [{"A": 5}, {"A": {"B": 1.5}}, {"A": {7: {}}}])
def test_malformed_nested_orders_are_named(order):
    """{'A': 5} raised AttributeError: 'int' object has no attribute 'items'."""
    q = rm.Query({"R": ["A", "B"]}, IntegerRing())
    with pytest.raises(VariableOrderError, match="order"):
        rm.Maintainer(q, order=order)


def test_arrow_uint64_with_nulls_beyond_int64_is_read_exactly():
    """A uint64 Arrow column with a null was mapped to Int64: a value >= 2**63 raised
    pyarrow's ArrowInvalid from Maintainer.insert and Database.insert, not a BatchError."""
    from ringml.rings.scalar import RealRing

    from ringml.sql import Database

    table = pa.table({"k": pa.array([2**63 + 1, None], pa.uint64()), "v": [1.0, 2.0]})
    db = Database("CREATE TABLE T (k BIGINT NULL, v DOUBLE)")
    with pytest.raises(BatchError, match=r"'k' \(BIGINT\): value 9223372036854775809 .*BIGINT"):
        db.insert("T", table)
    assert len(db.table("T")) == 0
    m = rm.Maintainer(rm.Query({"T": ["k", "v"]}, RealRing(["v"]), free=["k"]))
    with pytest.raises(BatchError, match="'k': missing value <NA>"):
        m.insert("T", table)
    m.insert("T", table.slice(0, 1))  # without the null: the exact big key
    assert m.result() == {(2**63 + 1,): 1.0}


def test_a_non_finite_object_feature_is_named_as_given():
    """A Decimal('NaN') feature's error named np.float64(nan), the float it became."""
    from ringml.rings.scalar import RealRing

    m = rm.Maintainer(rm.Query({"R": ["k", "x"]}, RealRing(["x"]), free=[]))
    nan = decimal.Decimal("NaN")
    rows = pd.DataFrame({"k": [1, 2], "x": np.array([decimal.Decimal("0.1"), nan], object)})
    with pytest.raises(BatchError, match=r"feature value Decimal\('NaN'\) is not a finite"):
        m.insert("R", rows)
    assert m.result() == 0.0
