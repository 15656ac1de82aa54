"""TPC-H Q1, Q3, Q5, Q6, Q10, Q12 and Q14 (standard text, the usual substitution parameters) as
SQL views over tpchgen-cli data at scale factor 0.01, kept fresh through batches of random
deletes, re-inserts and updates of lineitems, orders, customers and parts, and checked against
DuckDB running the same SQL on the current tables after every batch."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sql_oracle import assert_same_order, assert_same_rows, duckdb_results

from ringml import UpdateBatch
from ringml.datasets.tpch import TPCH_QUERIES, tpch_ddl
from ringml.sql import Database

SCHEMA = tpch_ddl(primary_keys=False)

QUERIES = TPCH_QUERIES
#: per query the output columns its ORDER BY sorts on (compared in sequence)
ORDER = {"q1": [0, 1], "q3": [1, 2], "q5": [1], "q10": [2], "q12": [0]}
TABLES = ("nation", "region", "part", "supplier", "customer", "orders", "lineitem")


@pytest.fixture(scope="session")
def tpch(tmp_path_factory) -> dict[str, pd.DataFrame]:
    """TPC-H at SF 0.01 from tpchgen-cli, as typed frames (DECIMAL as float64)."""
    from ringml.datasets import tpch_tables

    folder = tmp_path_factory.mktemp("tpch")
    try:
        return tpch_tables(sf=0.01, cache=folder, tables=TABLES)
    except FileNotFoundError:
        pytest.skip("tpchgen-cli (the TPC-H generator of the dev extra) is not installed")


def batches(rng: np.random.Generator, tables: dict[str, pd.DataFrame]):
    """A stream of (label, [(sign, table, rows)]) drawn against the current tables; rows
    deleted earlier come back later."""

    def sample(table, k):
        frame = tables[table]
        return frame.iloc[rng.choice(len(frame), size=min(k, len(frame)), replace=False)]

    lineitems = sample("lineitem", 400)
    yield "delete 400 lineitems", [("-", "lineitem", lineitems)]
    orders = sample("orders", 60)
    their_lines = tables["lineitem"][tables["lineitem"]["l_orderkey"].isin(orders["o_orderkey"])]
    yield (
        "delete 60 orders and their lineitems",
        [
            ("-", "orders", orders),
            ("-", "lineitem", their_lines),
        ],
    )
    yield (
        "re-insert them all",
        [
            ("+", "lineitem", pd.concat([lineitems, their_lines])),
            ("+", "orders", orders),
        ],
    )
    old = sample("lineitem", 300)
    new = old.copy()
    new["l_discount"] = rng.choice([0.0, 0.05, 0.06, 0.07, 0.1], size=len(new))
    new["l_shipdate"] = new["l_shipdate"] + pd.to_timedelta(rng.integers(-60, 60, len(new)), "D")
    new["l_returnflag"] = rng.choice(["R", "A", "N"], size=len(new))
    yield "update 300 lineitems", [("-", "lineitem", old), ("+", "lineitem", new)]
    customers, parts = sample("customer", 80), sample("part", 100)
    moved = customers.copy()
    moved["c_mktsegment"] = "BUILDING"
    promo = parts.copy()
    promo["p_type"] = "PROMO " + promo["p_type"].astype(str)
    yield (
        "update customers and parts",
        [
            ("-", "customer", customers),
            ("+", "customer", moved),
            ("-", "part", parts),
            ("+", "part", promo),
        ],
    )


def apply_to_frames(tables, step) -> None:
    for sign, table, rows in step:
        if sign == "-":
            tables[table] = tables[table].drop(index=rows.index)
        else:
            start = tables[table].index.max() + 1
            rows = rows.set_axis(pd.RangeIndex(start, start + len(rows)))
            tables[table] = pd.concat([tables[table], rows])


def check(databases, tables, what):
    expected = duckdb_results(QUERIES, {t: f.reset_index(drop=True) for t, f in tables.items()})
    for name in QUERIES:
        for strategy, db in databases.items():
            ours = db.view(name).to_pandas()
            assert_same_rows(ours, expected[name], f"{what}: {name} ({strategy})", rtol=1e-9)
            if name in ORDER:
                assert_same_order(ours, expected[name], ORDER[name], f"{what}: {name}")
    return expected


def run(tpch, strategies, seed=0):
    tables = {t: f.copy() for t, f in tpch.items()}
    databases = {}
    for strategy in strategies:
        db = Database(SCHEMA)
        for table in ("nation", "region", "part", "supplier"):  # views see these loaded...
            db.insert(table, tables[table])
        for name, sql in QUERIES.items():
            db.create_view(name, sql, strategy=strategy)
        for table in ("customer", "orders", "lineitem"):  # ...and these streamed in
            db.insert(table, tables[table])
        databases[strategy] = db
    first = check(databases, tables, "after the load")
    assert len(first["q3"]) == 10 and len(first["q10"]) == 20 and len(first["q5"]) > 0
    rng = np.random.default_rng(seed)
    for label, step in batches(rng, tables):
        engine = [
            UpdateBatch.inserts(t, r) if sign == "+" else UpdateBatch.deletes(t, r)
            for sign, t, r in step
        ]
        for db in databases.values():
            db.apply(engine)
        apply_to_frames(tables, step)
        check(databases, tables, label)


def test_tpch_views_every_strategy(tpch):
    run(tpch, ["fivm", "first_order", "recompute"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tpch_views_more_streams(tpch, seed):
    run(tpch, ["fivm", "first_order", "recompute"], seed=seed)
