"""TPC-H tables from ``tpchgen-cli`` and update streams over them with deletes.

:func:`tpch_tables` generates the tables at a scale factor once into a cache folder
(parquet) and reads them as typed frames: DECIMAL as float64, DATE as datetime64[ns],
integers as int64, strings as Python ``str``.  :func:`tpch_stream` shuffles the streamed
tables and turns them into round-robin batches of inserts and deletes in one of two ways:

* ``delete_fraction=f``: :func:`~ringml.datasets.streams.build_stream`'s deletes of
  uniformly chosen earlier-inserted rows of the same table (``f`` of all streamed tuples);
* ``live_orders=N`` (DBToaster's stream, VLDB 2012 §7): inserts only, except that after
  every ``orders`` batch random earlier orders are deleted until at most ``N`` are live
  (the deletes join that batch), so the orders table stays at about ``N`` tuples.

TPC-H rows are distinct and a deleted row never returns, so every delete is of a present row.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .streams import StreamBatch, build_stream

__all__ = [
    "TPCH_DDL",
    "TPCH_KEYS",
    "TPCH_QUERIES",
    "TPCH_TABLES",
    "tpch_ddl",
    "tpch_stream",
    "tpch_tables",
]

TPCH_TABLES = (
    "nation", "region", "supplier", "part", "partsupp", "customer", "orders", "lineitem",
)  # fmt: skip
#: the primary key of every table (how a deleted row is found)
TPCH_KEYS = {
    "nation": ["n_nationkey"],
    "region": ["r_regionkey"],
    "supplier": ["s_suppkey"],
    "part": ["p_partkey"],
    "partsupp": ["ps_partkey", "ps_suppkey"],
    "customer": ["c_custkey"],
    "orders": ["o_orderkey"],
    "lineitem": ["l_orderkey", "l_linenumber"],
}


#: The TPC-H schema (the specification's columns and types) with every table's primary key.
TPCH_DDL = """
CREATE TABLE nation (n_nationkey INTEGER, n_name CHAR(25), n_regionkey INTEGER,
                     n_comment VARCHAR(152), PRIMARY KEY (n_nationkey));
CREATE TABLE region (r_regionkey INTEGER, r_name CHAR(25), r_comment VARCHAR(152),
                     PRIMARY KEY (r_regionkey));
CREATE TABLE part (p_partkey INTEGER, p_name VARCHAR(55), p_mfgr CHAR(25), p_brand CHAR(10),
                   p_type VARCHAR(25), p_size INTEGER, p_container CHAR(10),
                   p_retailprice DECIMAL(15,2), p_comment VARCHAR(23), PRIMARY KEY (p_partkey));
CREATE TABLE supplier (s_suppkey INTEGER, s_name CHAR(25), s_address VARCHAR(40),
                       s_nationkey INTEGER, s_phone CHAR(15), s_acctbal DECIMAL(15,2),
                       s_comment VARCHAR(101), PRIMARY KEY (s_suppkey));
CREATE TABLE partsupp (ps_partkey INTEGER, ps_suppkey INTEGER, ps_availqty INTEGER,
                       ps_supplycost DECIMAL(15,2), ps_comment VARCHAR(199),
                       PRIMARY KEY (ps_partkey, ps_suppkey));
CREATE TABLE customer (c_custkey INTEGER, c_name VARCHAR(25), c_address VARCHAR(40),
                       c_nationkey INTEGER, c_phone CHAR(15), c_acctbal DECIMAL(15,2),
                       c_mktsegment CHAR(10), c_comment VARCHAR(117), PRIMARY KEY (c_custkey));
CREATE TABLE orders (o_orderkey INTEGER, o_custkey INTEGER, o_orderstatus CHAR(1),
                     o_totalprice DECIMAL(15,2), o_orderdate DATE, o_orderpriority CHAR(15),
                     o_clerk CHAR(15), o_shippriority INTEGER, o_comment VARCHAR(79),
                     PRIMARY KEY (o_orderkey));
CREATE TABLE lineitem (l_orderkey INTEGER, l_partkey INTEGER, l_suppkey INTEGER,
                       l_linenumber INTEGER, l_quantity DECIMAL(15,2),
                       l_extendedprice DECIMAL(15,2), l_discount DECIMAL(15,2),
                       l_tax DECIMAL(15,2), l_returnflag CHAR(1), l_linestatus CHAR(1),
                       l_shipdate DATE, l_commitdate DATE, l_receiptdate DATE,
                       l_shipinstruct CHAR(25), l_shipmode CHAR(10), l_comment VARCHAR(44),
                       PRIMARY KEY (l_orderkey, l_linenumber));
"""


def tpch_ddl(primary_keys: bool = True) -> str:
    """:data:`TPCH_DDL`, or the same tables without their PRIMARY KEY constraints."""
    return TPCH_DDL if primary_keys else re.sub(r",\s*PRIMARY KEY \([^)]*\)", "", TPCH_DDL)


#: TPC-H Q1, Q3, Q5, Q6, Q10, Q12 and Q14: the specification's text with its validation
#: substitution parameters (e.g. Q3: SEGMENT = BUILDING, DATE = 1995-03-15; Q5: REGION = ASIA,
#: DATE = 1994-01-01).
TPCH_QUERIES = {
    "q1": """
        select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty,
               sum(l_extendedprice) as sum_base_price,
               sum(l_extendedprice * (1 - l_discount)) as sum_disc_price,
               sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge,
               avg(l_quantity) as avg_qty, avg(l_extendedprice) as avg_price,
               avg(l_discount) as avg_disc, count(*) as count_order
        from lineitem
        where l_shipdate <= date '1998-12-01' - interval '90' day
        group by l_returnflag, l_linestatus
        order by l_returnflag, l_linestatus""",
    "q3": """
        select l_orderkey, sum(l_extendedprice * (1 - l_discount)) as revenue, o_orderdate,
               o_shippriority
        from customer, orders, lineitem
        where c_mktsegment = 'BUILDING' and c_custkey = o_custkey and l_orderkey = o_orderkey
          and o_orderdate < date '1995-03-15' and l_shipdate > date '1995-03-15'
        group by l_orderkey, o_orderdate, o_shippriority
        order by revenue desc, o_orderdate
        limit 10""",
    "q5": """
        select n_name, sum(l_extendedprice * (1 - l_discount)) as revenue
        from customer, orders, lineitem, supplier, nation, region
        where c_custkey = o_custkey and l_orderkey = o_orderkey and l_suppkey = s_suppkey
          and c_nationkey = s_nationkey and s_nationkey = n_nationkey
          and n_regionkey = r_regionkey and r_name = 'ASIA'
          and o_orderdate >= date '1994-01-01'
          and o_orderdate < date '1994-01-01' + interval '1' year
        group by n_name
        order by revenue desc""",
    "q6": """
        select sum(l_extendedprice * l_discount) as revenue
        from lineitem
        where l_shipdate >= date '1994-01-01'
          and l_shipdate < date '1994-01-01' + interval '1' year
          and l_discount between .06 - 0.01 and .06 + 0.01 and l_quantity < 24""",
    "q10": """
        select c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) as revenue,
               c_acctbal, n_name, c_address, c_phone, c_comment
        from customer, orders, lineitem, nation
        where c_custkey = o_custkey and l_orderkey = o_orderkey
          and o_orderdate >= date '1993-10-01'
          and o_orderdate < date '1993-10-01' + interval '3' month
          and l_returnflag = 'R' and c_nationkey = n_nationkey
        group by c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
        order by revenue desc
        limit 20""",
    "q12": """
        select l_shipmode,
               sum(case when o_orderpriority = '1-URGENT' or o_orderpriority = '2-HIGH'
                        then 1 else 0 end) as high_line_count,
               sum(case when o_orderpriority <> '1-URGENT' and o_orderpriority <> '2-HIGH'
                        then 1 else 0 end) as low_line_count
        from orders, lineitem
        where o_orderkey = l_orderkey and l_shipmode in ('MAIL', 'SHIP')
          and l_commitdate < l_receiptdate and l_shipdate < l_commitdate
          and l_receiptdate >= date '1994-01-01'
          and l_receiptdate < date '1994-01-01' + interval '1' year
        group by l_shipmode
        order by l_shipmode""",
    "q14": """
        select 100.00 * sum(case when p_type like 'PROMO%'
                                 then l_extendedprice * (1 - l_discount) else 0 end)
               / sum(l_extendedprice * (1 - l_discount)) as promo_revenue
        from lineitem, part
        where l_partkey = p_partkey and l_shipdate >= date '1995-09-01'
          and l_shipdate < date '1995-09-01' + interval '1' month""",
}


def tpch_tables(
    sf: float = 0.1, cache: str | Path | None = None, tables: Sequence[str] = TPCH_TABLES, log=None
) -> dict[str, pd.DataFrame]:
    """The TPC-H ``tables`` at scale factor ``sf`` as typed frames, generated with
    ``tpchgen-cli parquet`` into ``cache`` (default ``~/.cache/ringml/tpch-sf<sf>``) the
    first time; ``log``: a function told the generator's command line."""
    import pyarrow.parquet as pq

    cache = Path(cache) if cache else Path.home() / ".cache" / "ringml" / f"tpch-sf{sf:g}"
    unknown = set(tables) - set(TPCH_TABLES)
    if unknown:
        raise ValueError(f"unknown TPC-H tables {sorted(unknown)}; they are {TPCH_TABLES}")
    if not all((cache / f"{t}.parquet").exists() for t in tables):
        generator = shutil.which("tpchgen-cli") or str(Path(sys.executable).parent / "tpchgen-cli")
        if not Path(generator).exists():
            raise FileNotFoundError("tpchgen-cli is not installed (pip install tpchgen-cli)")
        cache.mkdir(parents=True, exist_ok=True)
        command = [generator, "parquet", "-s", f"{sf:g}", f"--output-dir={cache}"]
        if log is not None:
            log("generating: " + " ".join(command))
        subprocess.run(command, check=True, capture_output=True)
    frames = {}
    for table in tables:
        frame = pq.read_table(cache / f"{table}.parquet").to_pandas(date_as_object=False)
        for column in frame.columns:
            values = frame[column]
            if values.dtype.kind == "M":
                frame[column] = values.astype("datetime64[ns]")
            elif values.dtype == object and len(values) and not isinstance(values.iloc[0], str):
                frame[column] = values.astype(np.float64)  # decimal.Decimal
            elif values.dtype.kind == "i":
                frame[column] = values.astype(np.int64)
            elif values.dtype != object:
                frame[column] = values.astype(object)
        frames[table] = frame
    return frames


def tpch_stream(
    tables: dict[str, pd.DataFrame],
    streamed: Sequence[str],
    batch_size: int = 1000,
    delete_fraction: float = 0.0,
    seed: int = 0,
    live_orders: int | None = None,
) -> tuple[dict[str, pd.DataFrame], list[StreamBatch]]:
    """The ``streamed`` tables shuffled (one generator seeded ``seed``, tables in the given
    order) and the batches over them, round-robin in that order (``row_ids``: positions in
    the shuffled frames, which are returned too).  ``live_orders``: DBToaster's stream
    (inserts, and deletes of random earlier orders keeping at most that many live); it
    needs ``delete_fraction=0`` and ``orders`` among the streamed tables."""
    rng = np.random.default_rng(seed)
    shuffled = {
        t: tables[t].iloc[rng.permutation(len(tables[t]))].reset_index(drop=True) for t in streamed
    }
    if live_orders is not None and (delete_fraction or "orders" not in shuffled):
        raise ValueError("live_orders needs delete_fraction=0 and 'orders' streamed")
    batches = build_stream(
        shuffled,
        batch_size=batch_size,
        delete_fraction=delete_fraction,
        seed=seed,
        order=list(streamed),
    )
    if live_orders is None:
        return shuffled, batches
    orders = shuffled["orders"]
    live = np.empty(len(orders), dtype=np.int64)  # ids of live orders inserted earlier: [:m]
    m = 0
    out = []
    for batch in batches:
        if batch.relation != "orders":
            out.append(batch)
            continue
        excess = m + len(batch) - live_orders
        gone = np.empty(0, dtype=np.int64)
        if excess > 0:
            k = min(excess, m)
            picked = rng.choice(m, size=k, replace=False)
            gone = live[picked]
            keep = np.ones(m, dtype=bool)
            keep[picked] = False
            live[: m - k] = live[:m][keep]
            m -= k
        ids = np.concatenate([batch.row_ids, gone])
        out.append(
            StreamBatch(
                "orders",
                orders.iloc[ids].reset_index(drop=True),
                np.concatenate([batch.multiplicity, -np.ones(len(gone), dtype=np.int64)]),
                ids,
            )
        )
        live[m : m + len(batch)] = batch.row_ids
        m += len(batch)
    return shuffled, out
