"""SQL views beyond SPJA (issue 12, item 1): time per refresh -- one atomic batch of deletes
and inserts, then reading the view -- for ringml views of each strategy and for DuckDB
re-evaluation (INSERT/DELETE, then the query) on the same stream, one process, interleaved
per refresh; each view is read once, untimed, after it is created on the loaded tables.
The last results are compared with DuckDB (``gmr_sql``) and must match.

Workloads: the finance queries of DBToaster's Fig. 7 over a random order book (``--book``
bids and asks, 10 brokers, prices 900..1100 with a quarter 2000 higher, refreshes of 5
deletes and 5 inserts); TPC-H Q17, Q18, Q22 at ``--sf`` (tpchgen-cli data via
``ringml.datasets.tpch_tables``; refreshes insert 100 lineitems, or 20 orders for Q22); a
MIN/MAX/COUNT view grouped over 1000 groups of ``--rows`` rows (500 deletes + 500 inserts).

Run:  .venv/bin/python benchmarks/sql_beyond_spja.py [--sf 0.1] [--book 2000] [--rows 200000]
Writes benchmarks/results/sql_beyond_spja.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sql_oracle import assert_same_rows  # noqa: E402

from ringml import UpdateBatch  # noqa: E402
from ringml.maintainer import STRATEGIES  # noqa: E402
from ringml.sql import Database  # noqa: E402
from ringml.sql.dbtoaster_queries import FINANCE, FINANCE_SCHEMA, TPCH, gmr_sql  # noqa: E402

REFRESHES = 30


def book(rng, n: int, start: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "t": np.arange(start, start + n).astype(float),
            "id": np.arange(start, start + n),
            "broker_id": rng.integers(0, 10, n),
            "price": rng.integers(900, 1100, n) * 1.0 + rng.choice([0, 0, 0, 2000], n),
            "volume": rng.integers(1, 100, n).astype(float),
        }
    )


def finance_stream(size: int):
    rng = np.random.default_rng(0)
    tables = {"bids": book(rng, size, 0), "asks": book(rng, size, size)}
    current, steps, nxt = {t: f.copy() for t, f in tables.items()}, [], 10 * size
    for i in range(REFRESHES):
        table = "bids" if i % 2 == 0 else "asks"
        new = book(rng, 5, nxt)
        nxt += 5
        gone = current[table].sample(5, random_state=i)
        current[table] = pd.concat([current[table].drop(index=gone.index), new], ignore_index=True)
        steps.append([(table, "-", gone.reset_index(drop=True)), (table, "+", new)])
    return tables, steps, "id"


def tpch_stream(sf: float, name: str):
    from test_sql_dbtoaster import PARTSUPP, TPCH_DDL

    from ringml.datasets import tpch_tables

    catalog = Database(TPCH_DDL + PARTSUPP).catalog
    needed = {"q17": ["lineitem", "part"], "q18": ["customer", "orders", "lineitem"]}.get(
        name, ["customer", "orders"]
    )
    tables = {
        t: f[list(catalog.table(t).columns)] for t, f in tpch_tables(sf, tables=needed).items()
    }
    table = "orders" if name == "q22" else "lineitem"
    key = "o_orderkey" if name == "q22" else "l_orderkey"
    steps = []
    for i in range(REFRESHES):
        new = tables[table].sample(20 if name == "q22" else 100, random_state=i).copy()
        new[key] += 10**8 * (i + 1)
        steps.append([(table, "+", new)])
    return tables, steps, key


def minmax_stream(rows: int):
    rng = np.random.default_rng(0)

    def frame(n, start):
        return pd.DataFrame(
            {
                "g": rng.integers(0, 1000, n),
                "x": rng.random(n).round(4),
                "id": np.arange(start, start + n),
            }
        )

    tables = {"r": frame(rows, 0)}
    current, steps = tables["r"].copy(), []
    for i in range(REFRESHES):
        gone = current.sample(500, random_state=i)
        new = frame(500, rows + 500 * i)
        current = pd.concat([current.drop(index=gone.index), new], ignore_index=True)
        steps.append([("r", "-", gone.reset_index(drop=True)), ("r", "+", new)])
    return tables, steps, "id"


MINMAX_DDL = "CREATE TABLE r (g INTEGER, x DOUBLE, id BIGINT)"
MINMAX_SQL = "SELECT g, MIN(x) AS lo, MAX(x) AS hi, COUNT(*) AS n FROM r GROUP BY g"


def run(name: str, ddl: str, sql: str, stream, strategies) -> dict:
    tables, steps, key = stream
    systems = {}
    for strategy in strategies:
        db = Database(ddl)
        for table, frame in tables.items():
            db.insert(table, frame)
        view = db.create_view("v", sql, strategy=strategy)
        view.to_pandas()  # a view is read once created (its kept result is built): untimed
        systems[strategy] = (db, view)
    con = duckdb.connect()
    for table, frame in tables.items():
        con.register("frame", frame)
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM frame")
        con.unregister("frame")
    gmr = gmr_sql(sql)
    times = {s: 0.0 for s in [*strategies, "duckdb"]}
    last = {}
    for step in steps:
        for strategy, (db, view) in systems.items():
            start = time.perf_counter()
            db.apply(
                [
                    UpdateBatch.deletes(t, f) if sign == "-" else UpdateBatch.inserts(t, f)
                    for t, sign, f in step
                ]
            )
            last[strategy] = view.to_pandas()
            times[strategy] += time.perf_counter() - start
        start = time.perf_counter()
        for table, sign, frame in step:
            con.register("batch", frame)
            if sign == "-":
                con.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM batch)")
            else:
                con.execute(f"INSERT INTO {table} SELECT * FROM batch")
            con.unregister("batch")
        last["duckdb"] = con.sql(gmr).df()
        times["duckdb"] += time.perf_counter() - start
    for strategy in strategies:
        assert_same_rows(last[strategy], last["duckdb"], f"{name} {strategy}", rtol=1e-6)
    return {s: 1e3 * t / len(steps) for s, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--book", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--skip-recompute", action="store_true")
    args = parser.parse_args()
    strategies = [s for s in STRATEGIES if not (args.skip_recompute and s == "recompute")]
    results = {}
    for name in ("bsv", "bsp", "axf", "psp", "vwap", "mst"):
        stream = finance_stream(args.book)
        results[name] = run(name, FINANCE_SCHEMA, FINANCE[name], stream, strategies)
        print(name, results[name], flush=True)
    from test_sql_dbtoaster import PARTSUPP, TPCH_DDL

    for name in ("q17", "q18", "q22"):
        results[name] = run(
            name, TPCH_DDL + PARTSUPP, TPCH[name], tpch_stream(args.sf, name), strategies
        )
        print(name, results[name], flush=True)
    stream = minmax_stream(args.rows)
    results["min/max"] = run("min/max", MINMAX_DDL, MINMAX_SQL, stream, strategies)
    print("min/max", results["min/max"], flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    systems = [*strategies, "duckdb"]
    lines = [
        "# SQL views beyond SPJA: ms per refresh (apply + read)",
        "",
        f"`{' '.join(['python', *sys.argv])}` at commit {commit}, load {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores; {REFRESHES} refreshes per query, results checked against "
        "DuckDB. Finance: order book of "
        f"{args.book} bids and asks, 5 deletes + 5 inserts per refresh; TPC-H at SF {args.sf}, "
        "100 lineitems (Q22: 20 orders) per refresh; MIN/MAX: "
        f"{args.rows} rows, 1000 groups, 500 deletes + 500 inserts.",
        "",
        "| query | " + " | ".join(systems) + " | DuckDB / fivm |",
        "|---|" + "---:|" * (len(systems) + 1),
    ]
    for name, row in results.items():
        cells = " | ".join(f"{row[s]:.1f}" for s in systems)
        lines.append(f"| {name} | {cells} | {row['duckdb'] / row['fivm']:.1f}x |")
    out = ROOT / "benchmarks" / "results" / "sql_beyond_spja.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
