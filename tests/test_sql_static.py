"""Static tables of SQL views: ``create_view(..., static=[...])`` keeps no view that only
updates of those tables would need, gives the same results (DuckDB after every batch, every
strategy), and rejects changes of a static table with every table and view unchanged."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from sql_oracle import assert_same_rows, duckdb_rows

from ringml.errors import BatchError, InputTypeError
from ringml.maintainer import STRATEGIES
from ringml.sql import Database, SqlNameError

DDL = """
CREATE TABLE region (r_key INTEGER, r_name VARCHAR);
CREATE TABLE nation (n_key INTEGER, n_region INTEGER, n_name VARCHAR);
CREATE TABLE customer (c_key INTEGER, c_nation INTEGER);
CREATE TABLE orders (o_key INTEGER, o_cust INTEGER, o_price DOUBLE);
"""
SQL = """
SELECT n_name, SUM(o_price) AS revenue, COUNT(*) AS n, MAX(o_price) AS top
FROM orders JOIN customer ON o_cust = c_key JOIN nation ON c_nation = n_key
     JOIN region ON n_region = r_key
WHERE r_name <> 'AFRICA'
GROUP BY n_name
"""
DIMENSIONS = {
    "region": pd.DataFrame({"r_key": [0, 1, 2], "r_name": ["ASIA", "AFRICA", "EUROPE"]}),
    "nation": pd.DataFrame(
        {"n_key": np.arange(6), "n_region": [0, 1, 2, 0, 1, 2], "n_name": list("ABCDEF")}
    ),
}


def _database(strategy: str, static) -> tuple[Database, object]:
    db = Database(DDL)
    for table, frame in DIMENSIONS.items():
        db.insert(table, frame)
    return db, db.create_view("v", SQL, strategy=strategy, static=static)


def _tables(db: Database) -> dict[str, pd.DataFrame]:
    return {t: db.table(t) for t in ("region", "nation", "customer", "orders")}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_static_dimensions_follow_duckdb_under_inserts_and_deletes(strategy):
    rng = np.random.default_rng(7)
    db, view = _database(strategy, ["region", "nation"])
    dyn, dyn_view = _database(strategy, [])
    columns_o = ["o_key", "o_cust", "o_price"]
    customers: list[tuple] = []
    orders: list[tuple] = []
    for step in range(40):
        batch_c = [(int(k), int(rng.integers(0, 6))) for k in rng.integers(-50, 50, 3)]
        batch_c = [c for c in dict(batch_c).items() if c not in customers]
        batch_o = [
            (int(rng.integers(0, 10**6)), int(rng.integers(-50, 50)), float(rng.normal(100, 30)))
            for _ in range(int(rng.integers(1, 8)))
        ]
        gone_o = (
            [orders[i] for i in sorted(set(rng.integers(0, len(orders), 3)))]
            if (orders and step % 3)
            else []
        )
        for target in (db, dyn):
            if batch_c:
                target.insert("customer", pd.DataFrame(batch_c, columns=["c_key", "c_nation"]))
            target.insert("orders", pd.DataFrame(batch_o, columns=columns_o))
            if gone_o:
                target.delete("orders", pd.DataFrame(gone_o, columns=columns_o))
        customers += batch_c
        orders = [o for o in orders + batch_o if o not in gone_o]
        expected = duckdb_rows(SQL, _tables(db))
        assert_same_rows(view.to_pandas(), expected, f"{strategy} static, step {step}")
        assert_same_rows(dyn_view.to_pandas(), expected, f"{strategy} dynamic, step {step}")
    if strategy in ("fivm", "higher_order"):  # fewer stored entries: no region/nation deltas
        assert view.maintainer.stored_entries() < dyn_view.maintainer.stored_entries()
    assert view.description()["static"] == ["nation", "region"]
    assert "static" not in dyn_view.description()
    restored = pickle.loads(pickle.dumps(db))
    assert_same_rows(restored.view("v").to_pandas(), expected, "after a pickle")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_change_of_a_static_table_is_rejected_and_changes_nothing(strategy):
    db, view = _database(strategy, ["nation"])
    db.insert("customer", pd.DataFrame({"c_key": [1, 2], "c_nation": [0, 2]}))
    db.insert("orders", pd.DataFrame({"o_key": [1, 2], "o_cust": [1, 2], "o_price": [5.0, 7.0]}))
    before, nations = view.to_pandas(), db.table("nation")
    with pytest.raises(BatchError, match=r"'nation' is static for view 'v'"):
        db.apply(
            [
                db_batch("orders", {"o_key": [3], "o_cust": [1], "o_price": [1.0]}),
                db_batch("nation", {"n_key": [9], "n_region": [0], "n_name": ["Z"]}),
            ]
        )
    pd.testing.assert_frame_equal(view.to_pandas(), before)
    pd.testing.assert_frame_equal(db.table("nation"), nations)
    assert len(db.table("orders")) == 2
    db.drop_view("v")
    db.insert("nation", pd.DataFrame({"n_key": [9], "n_region": [0], "n_name": ["Z"]}))


def db_batch(table: str, columns: dict):
    from ringml import UpdateBatch

    return UpdateBatch.inserts(table, pd.DataFrame(columns))


def test_bad_static_arguments_are_refused_and_change_nothing():
    db = Database(DDL)
    with pytest.raises(InputTypeError, match="list of table names"):
        db.create_view("v", SQL, static="nation")
    with pytest.raises(SqlNameError, match="nowhere"):
        db.create_view("v", SQL, static=["nowhere"])
    with pytest.raises(SqlNameError, match="not read by view 'v'"):
        db.create_view("v", "SELECT COUNT(*) AS n FROM orders", static=["nation"])
    assert db.views == {}


def test_static_rows_that_cannot_join_are_not_loaded():
    """AFRICA's nations join no selected region: the view loads 2 regions and 4 nations."""
    db, view = _database("fivm", ["region", "nation"])
    assert view.maintainer.tuples_applied == 2 + 4
    _, whole = _database("fivm", [])
    assert whole.maintainer.tuples_applied == 2 + 6  # not static: every nation kept


def _frames(rng, relations, size, domain):
    return {
        r: pd.DataFrame(rng.integers(0, domain, (size, len(cols))), columns=list(cols))
        for r, cols in relations.items()
    }


def _participating(frames, relations):
    """Per relation, the mask of rows that occur in the full natural join (pandas)."""
    tagged = {r: f.assign(**{f"#{r}": np.arange(len(f))}) for r, f in frames.items()}
    names = list(relations)
    joined = tagged[names[0]]
    for r in names[1:]:
        shared = [c for c in relations[r] if c in joined.columns]
        joined = (
            joined.merge(tagged[r], on=shared) if shared else joined.merge(tagged[r], how="cross")
        )
    return {r: np.isin(np.arange(len(frames[r])), joined[f"#{r}"]) for r in names}


@pytest.mark.parametrize("shape", ["path", "star", "triangle"])
@pytest.mark.parametrize("seed", range(20))
def test_semijoin_reduction_keeps_every_joining_row(shape, seed):
    """reduce_static drops only rows outside the full join; for acyclic joins it drops all
    of them (Yannakakis' full reducer), for the triangle at least every dangling one that
    pairwise semijoins find."""
    from ringml.batch import UpdateBatch
    from ringml.query import Query
    from ringml.sql.semijoin import reduce_static

    relations = {
        "path": {"R": "ab", "S": "bc", "T": "cd"},
        "star": {"R": "ab", "S": "ac", "T": "ad"},
        "triangle": {"R": "ab", "S": "bc", "T": "ca"},
    }[shape]
    relations = {r: tuple(c) for r, c in relations.items()}
    rng = np.random.default_rng(seed)
    frames = _frames(rng, relations, int(rng.integers(0, 12)), int(rng.integers(2, 7)))
    batches = [UpdateBatch(r, f, np.ones(len(f), dtype=np.int64)) for r, f in frames.items()]
    reduced = {b.relation: b.rows for b in reduce_static(Query(relations), batches, relations)}
    wanted = _participating(frames, relations)
    for r, frame in frames.items():
        kept = reduced.get(r, frame.iloc[:0])
        rows = set(map(tuple, kept.to_numpy().tolist()))
        must = set(map(tuple, frame[wanted[r]].to_numpy().tolist()))
        assert must <= rows  # nothing that joins is lost
        if shape != "triangle":
            assert rows == must  # acyclic: exactly the rows that join
