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

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .streams import StreamBatch, build_stream

__all__ = ["TPCH_KEYS", "TPCH_TABLES", "tpch_stream", "tpch_tables"]

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
