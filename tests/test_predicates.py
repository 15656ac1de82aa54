"""Filters as data (``ringml.predicates``): evaluation against DuckDB (SQL NULL semantics) and
pandas, SQL parsing and printing, pickling, validation, and filtered queries maintained by
every strategy against a pandas oracle on streams with deletes."""

from __future__ import annotations

import copy
import pickle

import duckdb
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ringml as rm
from ringml.predicates import Predicate, col, lit, opaque, where

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORDS = ["", "a", "ab", "ba", "abc", "b_a", "B", "%"]


def _frame(rng: np.random.Generator, n: int, nulls: bool) -> pd.DataFrame:
    i = rng.integers(-3, 4, n)
    f = rng.choice([-1.5, 0.0, 0.25, 2.0, 3.5], n)
    s = rng.choice(np.array(WORDS, dtype=object), n)
    b = rng.random(n) < 0.5
    frame = pd.DataFrame({"i": i, "f": f, "s": s, "b": b})
    if nulls:
        frame["f"] = frame["f"].mask(rng.random(n) < 0.25)
        frame["s"] = frame["s"].mask(rng.random(n) < 0.25, None)
    return frame


def _duckdb_mask(frame: pd.DataFrame, condition: str) -> np.ndarray:
    """The rows DuckDB keeps for ``WHERE condition`` (an independent SQL engine)."""
    data = frame.assign(row_id=np.arange(len(frame)))  # noqa: F841 - read by DuckDB
    kept = duckdb.sql(f"SELECT row_id FROM data WHERE {condition}").fetchnumpy()["row_id"]
    mask = np.zeros(len(frame), dtype=bool)
    mask[np.asarray(kept, dtype=np.int64)] = True
    return mask


# ------------------------------------------------------------------ random predicates
numbers = st.sampled_from([-2, 0, 1, 3, -1.5, 0.25, 2.0])
numeric = st.recursive(
    st.one_of(st.sampled_from([col("i"), col("f")]), numbers.map(lit)),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from("+-*"), inner).map(
            lambda t: {"+": t[0] + t[2], "-": t[0] - t[2], "*": t[0] * t[2]}[t[1]]
        ),
        # division by a non-zero literal (x / 0 is NULL here, inf in DuckDB)
        st.tuples(inner, st.sampled_from([2, -4, 0.5])).map(lambda t: t[0] / t[1]),
    ),
    max_leaves=4,
)
ops = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])


def _compare(left, op: str, right) -> Predicate:
    return {
        "==": left == right, "!=": left != right, "<": left < right,
        "<=": left <= right, ">": left > right, ">=": left >= right,
    }[op]  # fmt: skip


atoms = st.one_of(
    st.tuples(numeric, ops, numeric).map(lambda t: _compare(*t)),
    st.tuples(ops, st.sampled_from(WORDS)).map(lambda t: _compare(col("s"), t[0], t[1])),
    st.sampled_from([True, False]).map(lambda v: col("b") == v),
    st.tuples(numeric, numbers, numbers).map(lambda t: t[0].between(t[1], t[2])),
    st.lists(st.sampled_from([-1, 0, 2, 0.25, None]), min_size=1, max_size=3).map(col("i").isin),
    st.lists(st.sampled_from([*WORDS, None]), min_size=1, max_size=3).map(col("s").isin),
    st.sampled_from([col("f"), col("s"), col("i") * col("f")]).map(lambda e: e.is_null()),
    st.sampled_from(["a%", "%a", "%b%", "_b%", "a_c", "%", "ab", "B%", "%\\%%"]).flatmap(
        lambda p: st.sampled_from([col("s").like(p), col("s").ilike(p)])
    ),
)
predicates = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda t: t[0] & t[1]),
        st.tuples(inner, inner).map(lambda t: t[0] | t[1]),
        inner.map(lambda p: ~p),
    ),
    max_leaves=5,
)


@SETTINGS
@given(predicates, st.integers(0, 2**32 - 1), st.booleans())
def test_random_predicates_agree_with_duckdb_and_round_trip(predicate, seed, nulls):
    frame = _frame(np.random.default_rng(seed), 40, nulls)
    got = predicate.mask(frame, "R")
    np.testing.assert_array_equal(got, _duckdb_mask(frame, predicate.sql()))
    # the canonical SQL parses back to an equal predicate; pickling keeps it equal
    assert where(predicate.sql()) == predicate
    assert hash(where(predicate.sql())) == hash(predicate)
    again = pickle.loads(pickle.dumps(predicate))
    assert again == predicate and repr(again) == repr(predicate)
    np.testing.assert_array_equal(again.mask(frame, "R"), got)


# ------------------------------------------------------------------ pandas oracle
PANDAS_CASES = [
    (col("i") > 1, lambda d: d.i > 1),
    ((col("i") == 1) | col("s").isin(["ab", "ba"]), lambda d: (d.i == 1) | d.s.isin(["ab", "ba"])),
    (col("f").between(0, 2), lambda d: d.f.between(0, 2)),
    ((col("i") + col("f") * 2) >= 1.5, lambda d: (d.i + d.f * 2) >= 1.5),
    (col("f") / 2 - col("i") < 0, lambda d: d.f / 2 - d.i < 0),
    (col("s").like("a%"), lambda d: d.s.str.startswith("a")),
    (col("s").like("%a"), lambda d: d.s.str.endswith("a")),
    (col("s").like("%b%"), lambda d: d.s.str.contains("b", regex=False)),
    (col("s").like("_b%"), lambda d: d.s.str.match(r"^.b")),
    (col("s").ilike("b%"), lambda d: d.s.str.lower().str.startswith("b")),
    (~(col("b") == True) & (col("i") != 0), lambda d: ~d.b & (d.i != 0)),  # noqa: E712
    (where("i BETWEEN -1 AND 1 AND NOT s IN ('a', 'abc')"),
     lambda d: d.i.between(-1, 1) & ~d.s.isin(["a", "abc"])),
    (where("-i * 2 > f OR s = 'b_a'"), lambda d: (-d.i * 2 > d.f) | (d.s == "b_a")),
]  # fmt: skip


@pytest.mark.parametrize(("predicate", "oracle"), PANDAS_CASES, ids=lambda p: repr(p)[:40])
def test_predicates_agree_with_pandas(predicate, oracle):
    frame = _frame(np.random.default_rng(7), 300, nulls=False)
    expected = oracle(frame).to_numpy(dtype=bool)
    assert 0 < expected.sum() < len(frame)  # the case selects something, not everything
    np.testing.assert_array_equal(predicate.mask(frame, "R"), expected)
    # the same from a mapping of numpy columns
    columns = {c: frame[c].to_numpy() for c in frame.columns}
    np.testing.assert_array_equal(predicate.mask(columns, "R"), expected)


def test_nulls_follow_sql_three_valued_logic():
    frame = pd.DataFrame(
        {"x": [1.0, np.nan, 3.0, np.nan], "s": pd.array(["a", None, "b", pd.NA], dtype=object)}
    )
    assert (col("x") > 2).mask(frame).tolist() == [False, False, True, False]
    assert (~(col("x") > 2)).mask(frame).tolist() == [True, False, False, False]
    assert col("x").is_null().mask(frame).tolist() == [False, True, False, True]
    assert col("s").not_null().mask(frame).tolist() == [True, False, True, False]
    # NULL in the list: a miss is unknown, so NOT IN keeps nothing
    assert (~col("s").isin(["b", None])).mask(frame).tolist() == [False] * 4
    assert ((col("x") > 2) | col("s").isin(["a"])).mask(frame).tolist() == [
        True, False, True, False,
    ]  # fmt: skip
    # x / 0 is NULL, neither true nor false
    zero = pd.DataFrame({"a": [1, 0, 2], "b": [0, 1, 1]})
    assert (col("a") / col("b") >= 0).mask(zero).tolist() == [False, True, True]
    assert (~(col("a") / col("b") >= 0)).mask(zero).tolist() == [False, False, False]
    assert where("NULL = NULL").mask(zero).tolist() == [False] * 3


def test_nullable_and_string_dtypes():
    frame = pd.DataFrame(
        {
            "n": pd.array([1, None, 3], dtype="Int64"),
            "t": pd.array(["ab", None, "cb"], dtype="string"),
        }
    )
    assert (col("n") >= 1).mask(frame).tolist() == [True, False, True]
    assert col("t").like("%b").mask(frame).tolist() == [True, False, True]
    assert (col("n") + 1 == 4).mask(frame).tolist() == [False, False, True]


# ------------------------------------------------------------------ SQL text
def test_sql_text_parses_to_the_python_form():
    parsed = where("price > 1e5 AND kind IN ('a','b')")
    assert parsed == (col("price") > 100000.0) & col("kind").isin(["a", "b"])
    assert parsed.columns() == {"price", "kind"}
    assert where("x IS NOT NULL") == ~col("x").is_null()
    assert where("\"my col\" <> 'it''s'") == (col("my col") != "it's")
    assert where("name NOT LIKE 'a%'") == ~col("name").like("a%")
    assert where("(a + b) / 2 <= -c") == ((col("a") + col("b")) / 2 <= -col("c"))
    assert where("flag") == (col("flag") == True)  # noqa: E712
    assert where("x > 1") != where("x > 1.0")  # literal types are part of the structure
    assert repr(where("a = 'x'")) == "(\"a\" = 'x')"


@pytest.mark.parametrize(
    "text", ["a % 2 = 0", "a IN (SELECT 1)", "upper(s) = 'A'", "a > b + c(1)", "a LIKE b", "a ="]
)
def test_unsupported_or_broken_sql_is_a_schema_error(text):
    with pytest.raises(rm.SchemaError, match="filter"):
        where(text)


def test_predicates_have_no_truth_value_and_values_are_checked():
    with pytest.raises(TypeError, match="no truth value"):
        bool(col("a") > 1)
    with pytest.raises(TypeError, match="no truth value"):
        (col("a") > 1) and (col("b") > 1)  # noqa: B015
    with pytest.raises(rm.SchemaError, match="not finite"):
        lit(float("nan"))
    with pytest.raises(rm.SchemaError, match="not a number, bool, string or None"):
        _ = col("a") == [1, 2]


# ------------------------------------------------------------------ errors
def test_evaluation_errors_name_relation_column_and_value():
    frame = pd.DataFrame(
        {"k": np.array(["a", 7, "b"], dtype=object), "x": [1.0, 2.0, 3.0], "w": ["u", "v", "w"]}
    )
    cases = [
        (col("x") > "1", "x", 1.0),  # a number column against a string
        (col("k") < "b", "k", 7),  # ordering a string and a number in an object column
        (col("k") + 1 > 0, "k", "a"),  # arithmetic on a string
        (col("x").like("1%"), "x", 1.0),  # LIKE on numbers
        (col("k").like("a%"), "k", 7),  # LIKE meets a number in an object column
    ]
    for predicate, column, value in cases:
        with pytest.raises(rm.BatchError) as info:
            predicate.mask(frame, "R")
        error = info.value
        assert (error.relation, error.column, error.value) == ("R", column, value), predicate
        assert "'R'" in str(error) and repr(column) in str(error) and repr(value) in str(error)


def test_query_validates_filters():
    relations = {"R": ["a", "x"], "S": ["a", "y"]}
    with pytest.raises(rm.SchemaError, match=r"relation 'R' reads column 'y'.*\['a', 'x'\]"):
        rm.Query(relations, filters={"R": col("y") > 0})
    with pytest.raises(rm.SchemaError, match="relation 'S' reads column 'z'"):
        rm.covariance_query(relations, filters={"S": "z > 0"})
    with pytest.raises(rm.SchemaError, match="unknown relation 'T'"):
        rm.Query(relations, filters={"T": "a > 0"})
    with pytest.raises(rm.SchemaError, match=r"Python callable.*opaque\(fn\)"):
        rm.Query(relations, filters={"R": lambda f: f.x > 0})
    with pytest.raises(rm.SchemaError, match="int 3"):
        rm.Query(relations, filters={"R": 3})
    query = rm.Query(relations, filters={"R": "x > 0", "S": col("y") < 2})
    assert query.filters == {"R": col("x") > 0, "S": col("y") < 2}
    assert query.checkpointable


def test_a_rejected_filter_batch_changes_no_view():
    query = rm.Query({"R": ["a", "x"], "S": ["a", "y"]}, filters={"R": "x > 0"})
    m = rm.Maintainer(query)
    m.insert("S", pd.DataFrame({"a": [1], "y": [1]}))
    m.insert("R", pd.DataFrame({"a": [1, 1], "x": [1, -1]}))
    before = (m.result(), m.stored_entries())
    bad = pd.DataFrame({"a": [1, 1], "x": np.array([2, "oops"], dtype=object)})
    with pytest.raises(rm.BatchError, match="'oops'") as info:
        m.apply([rm.UpdateBatch.inserts("S", pd.DataFrame({"a": [1], "y": [2]})),
                 rm.UpdateBatch.inserts("R", bad)])  # fmt: skip
    assert (info.value.relation, info.value.column) == ("R", "x")
    assert (m.result(), m.stored_entries()) == before and before[0] == 1
    m.insert("R", pd.DataFrame({"a": [1], "x": [5]}))
    assert m.result() == 2


# ------------------------------------------------------------------ maintained queries
SCHEMAS = {"R": ["a", "x", "k"], "S": ["a", "b", "y"], "T": ["b", "z"]}
FILTERS = {
    "R": (col("x") > -1) & ~col("k").isin(["q"]),
    "S": "y * 2 - b <= 5 OR b IS NULL",
    "T": col("z").between(-2, 2),
}


def _stream(seed: int, rounds: int):
    """Batches of inserts and deletes (30%) of present tuples, some failing the filters."""
    rng = np.random.default_rng(seed)
    present = {r: [] for r in SCHEMAS}
    batches = []
    for _ in range(rounds):
        relation = str(rng.choice(list(SCHEMAS)))
        rows = present[relation]
        if rows and rng.random() < 0.3:
            picks = sorted(set(rng.integers(0, len(rows), 3).tolist()), reverse=True)
            gone = [rows.pop(p) for p in picks]
            batches.append(rm.UpdateBatch.deletes(relation, pd.DataFrame(gone)))
            continue
        new = []
        for _ in range(int(rng.integers(1, 6))):
            row = {"a": int(rng.integers(0, 3)), "b": int(rng.integers(0, 3))}
            row |= {"x": float(rng.choice([-2.0, 0.5, 1.5])), "k": str(rng.choice(["p", "q"]))}
            row |= {"y": float(rng.choice([-1.0, 2.0, 4.0])), "z": float(rng.choice([-3.0, 1.0]))}
            new.append({c: row[c] for c in SCHEMAS[relation]})
        rows.extend(new)
        batches.append(rm.UpdateBatch.inserts(relation, pd.DataFrame(new)))
    return batches, present


def _oracle(present) -> tuple[int, np.ndarray, np.ndarray]:
    """Count, Σx and Σxxᵀ of (x, y, z) over the join of the filtered relations (pandas)."""
    r = pd.DataFrame(present["R"], columns=SCHEMAS["R"])
    s = pd.DataFrame(present["S"], columns=SCHEMAS["S"])
    t = pd.DataFrame(present["T"], columns=SCHEMAS["T"])
    r = r[(r.x > -1) & ~r.k.isin(["q"])]
    s = s[(s.y * 2 - s.b <= 5) | s.b.isna()]
    t = t[t.z.between(-2, 2)]
    join = r.merge(s, on="a").merge(t, on="b")
    data = join[["x", "y", "z"]].to_numpy(dtype=float)
    return len(join), data.sum(axis=0), data.T @ data


@pytest.mark.parametrize(
    ("strategy", "tree"), [(s, "tau") for s in rm.STRATEGIES] + [("fivm", "nu")]
)
def test_filtered_query_through_every_strategy(strategy, tree):
    query = rm.covariance_query(SCHEMAS, features=["x", "y", "z"], filters=FILTERS)
    m = rm.Maintainer(query, strategy=strategy, tree=tree)
    batches, present = _stream(11, 60)
    assert sum((b.signs() < 0).sum() for b in batches) > 20
    for batch in batches:
        m.apply([batch])
    count, sums, products = _oracle(present)
    assert count > 0
    stats = query.ring.statistics(m.result())
    assert stats.count == count
    np.testing.assert_allclose(stats.mean, sums / count, rtol=1e-9, atol=1e-12)
    centred = products / count - np.outer(sums / count, sums / count)
    np.testing.assert_allclose(stats.covariance, centred, rtol=1e-9, atol=1e-9)


def test_filtered_maintainer_pickles_and_continues_equal():
    query = rm.covariance_query(SCHEMAS, features=["x", "y", "z"], filters=FILTERS)
    batches, present = _stream(5, 80)
    m = rm.Maintainer(query)
    for batch in batches[:40]:
        m.apply([batch])
    copy_ = pickle.loads(pickle.dumps(m))
    assert copy_.query.filters == query.filters
    assert copy_.fingerprint() == m.fingerprint()
    for batch in batches[40:]:
        m.apply([batch])
        copy_.apply([batch])
    a, b = m.ring.statistics(m.result()), copy_.ring.statistics(copy_.result())
    assert a.count == b.count == _oracle(present)[0]
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.covariance, b.covariance)


def test_opaque_callables_opt_out_of_pickling():
    fn = lambda frame: frame.x.to_numpy() > 0  # noqa: E731
    query = rm.Query({"R": ["a", "x"]}, filters={"R": opaque(fn)})
    assert not query.checkpointable
    m = rm.Maintainer(query)
    m.insert("R", pd.DataFrame({"a": [1, 2, 3], "x": [1, -1, 2]}))
    assert m.result() == 2
    with pytest.raises(rm.SchemaError, match=r"relations \['R'\] are opaque.*predicates"):
        pickle.dumps(m)
    with pytest.raises(rm.SchemaError, match="cannot be pickled"):
        pickle.dumps(query)
    assert copy.deepcopy(query).filters["R"] == opaque(fn)  # copies share the callable
    mixed = rm.Query({"R": ["a", "x"]}, filters={"R": ~(opaque(fn) & (col("a") > 1))})
    assert not mixed.checkpointable
    with pytest.raises(rm.SchemaError, match=r"relations \['R'\] are opaque"):
        pickle.dumps(rm.Maintainer(mixed))
    bad = rm.Query({"R": ["a", "x"]}, filters={"R": opaque(lambda frame: [True])})
    with pytest.raises(rm.BatchError, match="not one bool per row"):
        rm.Maintainer(bad).insert("R", pd.DataFrame({"a": [1, 2], "x": [1, 2]}))


def test_fingerprints_follow_the_query_not_its_state():
    def make(**changes):
        args = {"features": ["x", "y", "z"], "filters": FILTERS} | changes
        return rm.covariance_query(SCHEMAS, **args)

    base = make()
    m = rm.Maintainer(base)
    before = m.fingerprint()
    for batch in _stream(3, 10)[0]:
        m.apply([batch])  # fixes covariance shifts: state, not part of the fingerprint
    assert m.fingerprint() == before == rm.Maintainer(make()).fingerprint()
    assert base.fingerprint() == make().fingerprint()
    others = [
        make(features=["x", "y"]),
        make(filters={**FILTERS, "T": "z > 0"}),
        make(categorical=["z"]),
        rm.covariance_query({**SCHEMAS, "T": ["b", "w"]}, features=["x", "y", "w"]),
    ]
    assert len({q.fingerprint() for q in [base, *others]}) == 5
    assert rm.Maintainer(base, strategy="recompute").fingerprint() != before
    assert str(m.order) != "b{a{x{k}, y}, z}"
    assert rm.Maintainer(base, order="b{a{x{k}, y}, z}").fingerprint() != before


@pytest.mark.parametrize("condition", ["A <> 'a'", "A LIKE 'a%'", "A IN ('a', 'b')"])
def test_an_empty_batch_of_a_filtered_relation_is_a_no_op(condition):
    """An empty column is float64: a text condition found a number in it and refused the
    empty batch naming a value None that no row held; without the filter it was a no-op."""
    m = rm.Maintainer(rm.Query({"R": ["A", "B"]}, free=["A"], filters={"R": condition}))
    m.insert("R", {"A": ["a", "b"], "B": [1, 2]})
    before = dict(m.result())
    for change in (m.insert, m.delete):
        assert len(change("R", {"A": [], "B": []})) == 0
    assert dict(m.result()) == before
    assert where(condition).mask({"A": [], "B": []}).tolist() == []
