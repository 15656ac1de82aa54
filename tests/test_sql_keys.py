"""Tables with a PRIMARY KEY (deletes checked by key and every value, one row per key),
batch typing from numpy/pandas/Arrow columns, and reads of ORDER BY ... LIMIT views that
cut to the top groups before decoding: every view checked against DuckDB."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sql_oracle import assert_same_order, assert_same_rows, duckdb_rows

from ringml import BatchError, UpdateBatch
from ringml.sql import Database, SqlError
from ringml.sql import output as output_module
from ringml.sql.catalog import parse_ddl

SCHEMA = """
CREATE TABLE Orders (id INTEGER PRIMARY KEY, customer VARCHAR, placed DATE, total DOUBLE);
CREATE TABLE Lines (id INTEGER, line INTEGER, price DOUBLE, tag VARCHAR,
                    PRIMARY KEY (id, line));
CREATE TABLE Notes (body VARCHAR, at DATE, CONSTRAINT pk PRIMARY KEY (body));
CREATE TABLE Bag (k INTEGER, v DOUBLE);
"""
VIEW = """
SELECT o.customer, COUNT(*) AS n, SUM(l.price) AS revenue
FROM Orders o JOIN Lines l ON o.id = l.id GROUP BY o.customer
"""


def orders(ids, customers, days, totals) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": ids,
            "customer": customers,
            "placed": pd.to_datetime("2020-01-01") + pd.to_timedelta(days, unit="D"),
            "total": np.asarray(totals, dtype=float),
        }
    )


def lines(ids, numbers, prices, tags) -> pd.DataFrame:
    return pd.DataFrame(
        {"id": ids, "line": numbers, "price": np.asarray(prices, float), "tag": tags}
    )


def database() -> Database:
    db = Database(SCHEMA)
    db.insert("Orders", orders([1, 2, 3], ["ann", "bo", "ann"], [0, 1, 2], [1.0, 2.0, 3.0]))
    db.insert("Lines", lines([1, 1, 2, 3], [1, 2, 1, 1], [2.0, 3.0, 5.0, 1.5], list("abca")))
    return db


def tables(db: Database) -> dict[str, pd.DataFrame]:
    return {name: db.table(name) for name in ("Orders", "Lines")}


def snapshot(db: Database) -> dict:
    return {name: db.table(name).to_dict("list") for name in db.tables} | {
        name: view.to_pandas().to_dict("list") for name, view in db.views.items()
    }


def test_ddl_declares_primary_keys():
    by_name = {s.name: s for s in parse_ddl(SCHEMA)}
    assert by_name["Orders"].key == ("id",)
    assert by_name["Lines"].key == ("id", "line")
    assert by_name["Notes"].key == ("body",)
    assert by_name["Bag"].key == ()
    assert parse_ddl("CREATE TABLE t (A INT, b INT, PRIMARY KEY (a))")[0].key == ("A",)
    for bad, error in [
        ("CREATE TABLE t (a INT PRIMARY KEY, b INT, PRIMARY KEY (b))", "more than one"),
        ("CREATE TABLE t (a INT, PRIMARY KEY (c))", "names 'c'"),
        ("CREATE TABLE t (a INT, PRIMARY KEY (a, a))", "repeats"),
    ]:
        with pytest.raises(SqlError, match=error):
            parse_ddl(bad)
    description = Database(SCHEMA).description()
    assert description["table Lines"][-1] == ["PRIMARY KEY", ["id", "line"]]
    assert description["table Bag"] == [["k", "int"], ["v", "float"]]


def test_keyed_deletes_must_match_the_stored_row_and_keys_hold_one_row():
    db = database()
    view = db.create_view("revenue", VIEW)
    before = snapshot(db)
    rejected = [
        # same key, another value: not the stored row
        (UpdateBatch.deletes("Lines", lines([1], [1], [2.5], ["a"])), "price = 2.0"),
        (UpdateBatch.deletes("Lines", lines([1], [1], [2.0], ["b"])), "tag = 'a'"),
        (UpdateBatch.deletes("Orders", orders([2], ["bo"], [5], [2.0])), "placed"),
        (UpdateBatch.deletes("Lines", lines([9], [1], [2.0], ["a"])), "no row has"),
        (UpdateBatch.inserts("Lines", lines([1], [1], [2.0], ["a"])), "a present row"),
        (UpdateBatch.inserts("Lines", lines([1], [2], [7.0], ["z"])), "a present row"),
        (UpdateBatch.inserts("Lines", lines([8, 8], [1, 1], [1.0, 2.0], ["x", "y"])), "another"),
        (UpdateBatch.inserts("Lines", lines([8, 8], [1, 1], [1.0, 1.0], ["x", "x"])), "another"),
        (UpdateBatch("Lines", lines([8], [1], [1.0], ["x"]), np.array([2])), "another"),
        (UpdateBatch("Lines", lines([1], [1], [2.0], ["a"]), np.array([-2])), "not present"),
    ]
    for batch, message in rejected:
        with pytest.raises(BatchError, match=message):
            db.apply([batch])
        assert snapshot(db) == before
    # several tables at once: the second table's bad delete undoes the first's change
    with pytest.raises(BatchError, match="not present"):
        db.apply(
            [
                UpdateBatch.inserts("Orders", orders([4], ["cy"], [3], [4.0])),
                UpdateBatch.deletes("Lines", lines([3], [1], [1.5], ["b"])),
            ]
        )
    assert snapshot(db) == before
    # an exact delete, an update of a row in place, a key deleted and re-inserted, a row
    # inserted and deleted in one batch: all accepted
    db.delete("Lines", lines([1], [2], [3.0], ["b"]))
    db.update("Lines", lines([2], [1], [5.0], ["c"]), lines([2], [1], [6.5], ["d"]))
    db.apply(
        [
            UpdateBatch.deletes("Orders", orders([3], ["ann"], [2], [3.0])),
            UpdateBatch.inserts("Orders", orders([3], ["cy"], [2], [3.0])),
            UpdateBatch.inserts("Lines", lines([5], [1], [1.0], ["e"])),
            UpdateBatch.deletes("Lines", lines([5], [1], [1.0], ["e"])),
        ]
    )
    db.insert("Lines", lines([1], [2], [4.0], ["f"]))  # a deleted key comes back
    assert db.table("Lines").sort_values(["id", "line"]).values.tolist() == [
        [1, 1, 2.0, "a"], [1, 2, 4.0, "f"], [2, 1, 6.5, "d"], [3, 1, 1.5, "a"]
    ]  # fmt: skip
    assert_same_rows(view.to_pandas(), duckdb_rows(VIEW, tables(db)), "after the changes")
    late = db.create_view("late", VIEW)  # a view created over the stored rows
    assert_same_rows(late.to_pandas(), view.to_pandas(), "a view created after the data")
    copy = pickle.loads(pickle.dumps(db))
    copy.delete("Lines", lines([1], [2], [4.0], ["f"]))
    with pytest.raises(BatchError, match="a present row"):
        copy.insert("Lines", lines([3], [1], [0.5], ["z"]))
    assert_same_rows(copy.view("revenue").to_pandas(), duckdb_rows(VIEW, tables(copy)), "copy")


def test_rejected_batches_release_the_keys_they_reserved():
    """Checking a batch reserves an index entry (multiplicity 0) for each new key: whatever
    rejects the batch afterwards (its own deletes, another table's, a view that cannot
    evaluate it, a static table) releases them, so the index holds exactly the stored rows;
    entries a prepared change leaves behind (never committed) are read as no row."""
    db = Database(SCHEMA)
    db.insert("Orders", orders([1, 2, 3], ["ann", "bo", "ann"], [0, 1, 2], [1.0, 2.0, 3.0]))
    db.insert("Bag", {"k": [1, 1], "v": [0.5, 0.5]})
    db.insert("Notes", {"body": ["x"], "at": ["2020-01-01"]})
    # id * 2e18 overflows BIGINT from id 5 on; k * 4e18 from k 3 on
    db.create_view("o", "SELECT COUNT(*) AS n FROM Orders WHERE id * 2000000000000000000 > 0")
    db.create_view("b", "SELECT COUNT(*) AS n FROM Bag WHERE k * 4000000000000000000 > 0")
    db.create_view("s", "SELECT COUNT(*) AS n FROM Notes", static=["Notes"])
    before = snapshot(db)

    def entries() -> dict[str, int]:
        return {name: len(store.index) for name, store in db._tables.items()}

    stored = {"Orders": 3, "Lines": 0, "Notes": 1, "Bag": 1}
    assert entries() == stored
    rejected = [
        ([UpdateBatch.inserts("Orders", orders([4, 5], ["c", "d"], [3, 4], [1, 2]))], "BIGINT"),
        ([UpdateBatch.inserts("Bag", {"k": [2, 7], "v": [1.0, 1.0]})], "BIGINT"),
        ([UpdateBatch.inserts("Notes", {"body": ["y"], "at": ["2020-01-02"]})], "static"),
        (
            [
                UpdateBatch.inserts("Orders", orders([4], ["cy"], [3], [1.0])),
                UpdateBatch.inserts("Bag", {"k": [2], "v": [9.0]}),
                UpdateBatch.deletes("Lines", lines([1], [1], [1.0], ["a"])),
            ],
            "not present",
        ),
        (
            [
                UpdateBatch.inserts("Orders", orders([6, 7], ["cy", "di"], [3, 4], [1.0, 2.0])),
                UpdateBatch.deletes("Orders", orders([1], ["ann"], [0], [9.0])),
            ],
            "total = 1.0",
        ),
    ]
    for batches, message in rejected:
        with pytest.raises(BatchError, match=message):
            db.apply(batches)
        assert snapshot(db) == before
        assert entries() == stored
    db.insert("Orders", orders([4], ["cy"], [3], [1.0]))  # the released keys come in
    db.insert("Bag", {"k": [2], "v": [1.0]})
    assert entries() == {**stored, "Orders": 4, "Bag": 2}
    assert db.view("o").to_pandas()["n"].tolist() == [4]
    assert db.view("b").to_pandas()["n"].tolist() == [3]

    # a change prepared and never committed (a model that refused its rows): no row
    store = Database(SCHEMA)._tables["Lines"]
    frame = lines([1, 2], [1, 1], [2.0, 3.0], ["a", "b"])
    ones = np.ones(2, dtype=np.int64)
    store.commit(store.prepare(store.schema.conform_columns(frame.iloc[:1]), ones[:1]))
    gone = store.schema.conform_columns(frame.iloc[1:])
    store.prepare(gone, ones[:1])  # key (2, 1) reserved, no row
    assert store.frame().values.tolist() == [[1, 1, 2.0, "a"]] and len(store) == 1
    assert store.distinct()[1].tolist() == [1] and len(store.index) == 2
    with pytest.raises(BatchError, match="no row has its primary key"):
        store.prepare(gone, -ones[:1])
    store.commit(store.prepare(gone, ones[:1]))  # the reserved key takes its row
    assert sorted(store.frame().values.tolist()) == [[1, 1, 2.0, "a"], [2, 1, 3.0, "b"]]
    store.commit(store.prepare(gone, -ones[:1]))
    assert store.frame().values.tolist() == [[1, 1, 2.0, "a"]] and len(store.index) == 1


def test_text_date_float_and_composite_keys():
    db = Database(
        "CREATE TABLE N (body VARCHAR PRIMARY KEY, at DATE);"
        "CREATE TABLE F (x DOUBLE, d DATE, n INTEGER, PRIMARY KEY (x, d));"
        "CREATE TABLE B (flag BOOLEAN PRIMARY KEY, n INTEGER)"
    )
    db.insert("N", {"body": ["hi", "yo"], "at": ["2020-01-01", "2020-01-02"]})
    with pytest.raises(BatchError, match="a present row"):
        db.insert("N", {"body": ["hi"], "at": ["2021-01-01"]})
    with pytest.raises(BatchError, match="at = "):
        db.delete("N", {"body": ["hi"], "at": ["2021-01-01"]})
    db.delete("N", {"body": ["hi"], "at": ["2020-01-01"]})
    db.insert("F", {"x": [0.0, 0.5], "d": ["2020-01-01"] * 2, "n": [1, 2]})
    with pytest.raises(BatchError, match="a present row"):  # -0.0 is the key 0.0
        db.insert("F", {"x": [-0.0], "d": ["2020-01-01"], "n": [3]})
    db.delete("F", {"x": [-0.0], "d": ["2020-01-01"], "n": [1]})
    db.insert("F", {"x": [0.0], "d": ["2020-01-02"], "n": [4]})
    with pytest.raises(BatchError, match="another row"):
        db.insert("B", {"flag": [True, True], "n": [1, 1]})
    db.insert("B", {"flag": [True, False], "n": [1, 2]})
    with pytest.raises(BatchError, match="a present row"):
        db.insert("B", {"flag": [True], "n": [1]})
    view = db.create_view("v", "SELECT d, SUM(x) AS s, COUNT(*) AS c FROM F GROUP BY d")
    frames = {"F": db.table("F")}
    assert db.table("N")["body"].tolist() == ["yo"]
    assert len(db.table("F")) == 2 and len(db.table("B")) == 2
    assert_same_rows(view.to_pandas(), duckdb_rows(view.sql, frames), "float/date keys")


def test_batches_typed_from_numpy_pandas_and_arrow_columns():
    db = Database("CREATE TABLE T (k BIGINT PRIMARY KEY, s VARCHAR, d DATE, x DOUBLE, b BOOLEAN)")
    db.insert(
        "T",
        pa.table({"k": pa.array([1, 2], pa.int32()), "s": ["a", "b"],
                  "d": pa.array([18262, 18263], pa.date32()), "x": [1, 2], "b": [True, False]}),
    )  # fmt: skip
    db.insert(
        "T",
        pd.DataFrame({"s": pd.array(["c"], dtype="string"), "k": pd.array([3], dtype="Int64"),
                      "d": ["2020-01-03"], "x": np.array([3], np.uint8), "b": [True]}),
    )  # fmt: skip
    db.insert("T", {"k": np.array([4], np.uint64), "s": np.array(["d"]), "d": [pd.Timestamp(0)],
                    "x": [np.float32(0.5)], "b": np.array([False])})  # fmt: skip
    frame = db.table("T").sort_values("k")
    assert frame["k"].tolist() == [1, 2, 3, 4] and frame["k"].dtype == np.int64
    assert frame["s"].tolist() == ["a", "b", "c", "d"] and frame["s"].dtype == object
    assert frame["d"].dtype == "datetime64[ns]" and frame["x"].dtype == np.float64
    before = db.table("T").to_dict("list")
    for rows, message in [
        ({"k": [5], "s": [None], "d": ["2020-01-01"], "x": [1.0], "b": [True]}, "NULL"),
        ({"k": [5], "s": [pd.NA], "d": ["2020-01-01"], "x": [1.0], "b": [True]}, "NULL"),
        ({"k": [5], "s": [7], "d": ["2020-01-01"], "x": [1.0], "b": [True]}, "not a string"),
        ({"k": [None], "s": ["e"], "d": ["2020-01-01"], "x": [1.0], "b": [True]}, "NULL"),
        (
            {
                "k": pd.array([None], "Int64"),
                "s": ["e"],
                "d": ["2020-01-01"],
                "x": [1.0],
                "b": [True],
            },
            "NULL",
        ),
        ({"k": [1.5], "s": ["e"], "d": ["2020-01-01"], "x": [1.0], "b": [True]}, "integer"),
        ({"k": [5], "s": ["e"], "d": ["2020-01-01"], "x": ["1.0"], "b": [True]}, "number"),
        ({"k": [5], "s": ["e"], "d": ["2020-01-01"], "x": [np.nan], "b": [True]}, "NULL"),
        ({"k": [5], "s": ["e"], "d": [None], "x": [1.0], "b": [True]}, "NULL"),
        # columns already of their kind's numpy dtype (one whole-column test each)
        ({"k": [5], "s": ["e"], "d": ["2020-01-01"], "x": [np.inf], "b": [True]}, "finite"),
        ({"k": [5], "s": ["e"], "d": pd.to_datetime([None]), "x": [1.0], "b": [True]}, "NULL"),
        (
            {
                "k": [5, 6],
                "s": np.array(["e", 7], object),
                "d": pd.to_datetime(["2020"] * 2),
                "x": [1.0, 2.0],
                "b": [True, True],
            },
            "not a string",
        ),
        (
            {
                "k": [5],
                "s": ["e"],
                "d": pd.to_datetime(["2020-01-01"]).tz_localize("UTC"),
                "x": [1.0],
                "b": [True],
            },
            "time zone",
        ),
        ({"k": [5], "s": ["e"], "d": ["2020-01-01"], "x": [1.0], "b": [1]}, "boolean"),
        ({"k": [5], "s": ["e"], "d": ["2020-01-01"], "x": [1.0]}, "lack"),
    ]:
        with pytest.raises(BatchError, match=message):
            db.insert("T", rows)
        assert db.table("T").to_dict("list") == before


TOP = """
SELECT a, SUM(x) AS s, COUNT(*) AS n, MIN_D
FROM (SELECT a, x, d AS MIN_D FROM R) q GROUP BY a, MIN_D
"""


@pytest.mark.parametrize(
    ("order", "keys"),
    [
        ("ORDER BY s DESC LIMIT 5", ["s"]),
        ("ORDER BY s DESC, a LIMIT 3 OFFSET 2", ["s", "a"]),
        ("ORDER BY n, s LIMIT 4", ["n", "s"]),
        ("ORDER BY MIN_D DESC LIMIT 6", ["MIN_D"]),
        ("ORDER BY a LIMIT 1", ["a"]),
        ("ORDER BY n DESC LIMIT 7", ["n"]),
    ],
)
@pytest.mark.parametrize("having", ["", "HAVING COUNT(*) > 1"])
def test_order_by_limit_reads_cut_to_the_top_groups(order, keys, having, monkeypatch):
    """The cut (many groups, ties on every ORDER BY key) gives the rows sorting everything
    gives, and DuckDB's rows up to the order of ties."""
    rng = np.random.default_rng(len(order) + len(having))
    n = 3000
    frame = pd.DataFrame(
        {
            "a": rng.integers(0, 400, n),
            "x": rng.integers(-3, 4, n).astype(float),
            "d": pd.to_datetime("2020-01-01") + pd.to_timedelta(rng.integers(0, 3, n), "D"),
        }
    )
    db = Database("CREATE TABLE R (a INTEGER, x DOUBLE, d DATE)")
    db.insert("R", frame)
    sql = TOP.replace("GROUP BY a, MIN_D", f"GROUP BY a, MIN_D {having} {order}")
    view = db.create_view("top", sql)
    calls = []
    real = output_module._top_candidates
    monkeypatch.setattr(output_module, "_top_candidates", lambda *a: calls.append(1) or real(*a))
    cut = view.to_pandas()
    assert calls, "the read did not cut"
    monkeypatch.setattr(output_module, "_top_candidates", lambda *a: None)
    full = view.to_pandas()
    pd.testing.assert_frame_equal(cut, full)
    theirs = duckdb_rows(sql, {"R": frame})
    assert_same_order(cut, theirs, [list(cut.columns).index(k) for k in keys], sql)
    # the rows themselves, ties broken alike: DuckDB ordered by every output column after
    tie_break = ", ".join(f"{c} ASC NULLS LAST" for c in cut.columns)
    ordered = sql.replace(" LIMIT", f", {tie_break} LIMIT")
    assert_same_rows(cut, duckdb_rows(ordered, {"R": frame}), ordered)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_keyed_streams_against_duckdb(data):
    """Random batches over a keyed table (inserts of new and re-used keys, exact deletes,
    updates, deletes that differ in one value, duplicate keys): accepted batches keep every
    view equal to DuckDB; rejected ones change nothing."""
    db = Database(
        "CREATE TABLE L (id INTEGER, line INTEGER, grp VARCHAR, v DOUBLE, PRIMARY KEY (id, line))"
    )
    views = {
        "g": db.create_view("g", "SELECT grp, COUNT(*) AS n, SUM(v) AS s FROM L GROUP BY grp"),
        "top": db.create_view(
            "top", "SELECT id, SUM(v) AS s FROM L GROUP BY id ORDER BY s DESC, id LIMIT 3"
        ),
    }
    present: dict[tuple[int, int], tuple[str, float]] = {}
    value = st.sampled_from([0.5, 1.0, 2.0, -1.5])
    group = st.sampled_from(["a", "b", "c"])
    key = st.tuples(st.integers(0, 6), st.integers(0, 2))
    for _ in range(data.draw(st.integers(1, 8))):
        rows, signs = [], []
        for _ in range(data.draw(st.integers(1, 6))):
            kind = data.draw(st.sampled_from(["insert", "delete", "update", "bad_delete"]))
            if kind != "insert" and present:
                k = data.draw(st.sampled_from(sorted(present)))
                g, v = present[k]
                if kind == "bad_delete":
                    v += 0.25
                rows.append((*k, g, v))
                signs.append(-1)
                if kind == "update":
                    rows.append((*k, data.draw(group), data.draw(value)))
                    signs.append(1)
            else:
                rows.append((*data.draw(key), data.draw(group), data.draw(value)))
                signs.append(1)
        frame = pd.DataFrame(rows, columns=["id", "line", "grp", "v"])
        expected, ok = dict(present), True
        by_key: dict = {}
        for (i, j, g, v), sign in zip(rows, signs, strict=True):
            units = by_key.setdefault((i, j), {})
            units[(g, v)] = units.get((g, v), 0) + sign
        for k, units in by_key.items():  # the semantics: per key, rows and the stored one
            stored = expected.get(k)
            final = {r: net + (r == stored) for r, net in units.items()}
            total = sum(final.values()) + (stored is not None and stored not in units)
            if min(final.values()) < 0 or total > 1:
                ok = False
            survivor = [r for r, f in final.items() if f == 1]
            if survivor:
                expected[k] = survivor[0]
            elif stored is not None and stored in units:
                del expected[k]
        event("rejected" if not ok else "accepted")
        before = snapshot(db)
        if not ok:
            with pytest.raises(BatchError):
                db.apply([UpdateBatch("L", frame, np.array(signs))])
            assert snapshot(db) == before
            assert len(db._tables["L"].index) == len(present)  # reserved keys released
            continue
        db.apply([UpdateBatch("L", frame, np.array(signs))])
        present = expected
        assert len(db._tables["L"].index) == len(present)
        table = db.table("L")
        assert sorted(map(tuple, table.values.tolist())) == sorted(
            (*k, *v) for k, v in present.items()
        )
        for name, view in views.items():
            theirs = duckdb_rows(view.sql, {"L": table})
            assert_same_rows(view.to_pandas(), theirs, name)
