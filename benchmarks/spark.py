"""Spark benchmark: the sharded maintainer vs Spark SQL over the materialized join.

Workload: the bulk initial computation of the Housing covariance payload (count, 26 sums,
351 pairwise products = 378 aggregates over the natural join of six relations on postcode)
for ``housing_star(postcodes=P)``: the join has 200 * P rows (10 million for the default
P = 50,000) while the relations hold 21 * P rows.

Contenders, each in a fresh process per core count (``local[1]``, ``local[2]``, ...; the
Spark master is fixed per JVM), on the same parquet files:

* ``distributed``: :class:`ringml.pipelines.spark_distributed.DistributedMaintainer` with
  ``--shards`` shards: the relations are routed by ``hash(postcode)``, every shard runs the
  local F-IVM engine in ``applyInArrow`` and writes its state, the driver sums the roots;
* ``spark-sql``: Spark joins the six relations and computes the 378 aggregates
  (``count(*)``, ``sum(x_i)``, ``sum(x_i * x_j)``) over the 200 * P joined rows, with
  default settings, and ``spark-sql-tuned`` with ``spark.sql.codegen.maxFields=1000`` (by
  default whole-stage code generation gives up on plans wider than 100 fields, which a
  378-aggregate buffer is);
* ``local engine``: one ``ringml.Maintainer`` in this process, no Spark (for reference).

A warm-up on a tiny database runs first in every Spark process, so JVM, Python-worker and
code-generation start-up are not timed.  Every result is checked against the local
engine's (count exactly, moments to 1e-6 relative).  Prints a table; nothing is a test.

    .venv/bin/python benchmarks/spark.py                 # P = 50,000, local[1] and local[2]
    .venv/bin/python benchmarks/spark.py --postcodes 5000 --cores 1,2 --shards 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import ringml as rm
from ringml.datasets import housing_star

HERE = os.path.dirname(os.path.abspath(__file__))


def _write_parquet(dataset, folder: str) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {}
    for relation, frame in dataset.relations.items():
        path = os.path.join(folder, f"{relation}.parquet")
        # row groups of 16k rows: with maxPartitionBytes=1m, Spark splits every scan into
        # balanced partitions (one 4 MB file would otherwise be one or two uneven splits)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        pq.write_table(table, path, row_group_size=16_384)
        paths[relation] = path
    return paths


def _moments_close(expected, actual, rtol: float = 1e-6) -> bool:
    count_e, sums_e, products_e = expected
    count_a, sums_a, products_a = actual
    scale_s = np.abs(sums_e).max() or 1.0
    scale_p = np.abs(products_e).max() or 1.0
    return (
        int(count_a) == int(count_e)
        and np.allclose(sums_a, sums_e, rtol=rtol, atol=rtol * 1e-3 * scale_s)
        and np.allclose(products_a, products_e, rtol=rtol, atol=rtol * 1e-3 * scale_p)
    )


# ---------------------------------------------------------------------- worker process
def _spark_sql_moments(spark, paths: dict[str, str], variables: list[str]):
    """count, Σx, Σxxᵀ over the join, computed by Spark SQL (378 aggregates)."""
    from pyspark.sql import functions as F

    frames = [spark.read.parquet(p) for p in paths.values()]
    joined = frames[0]
    for frame in frames[1:]:
        joined = joined.join(frame, on="postcode")
    cols = {v: F.col(v).cast("double") for v in variables}
    aggregates = [F.count(F.lit(1)).alias("c")]
    aggregates += [F.sum(cols[v]).alias(f"s{i}") for i, v in enumerate(variables)]
    pairs = [(i, j) for i in range(len(variables)) for j in range(i, len(variables))]
    aggregates += [
        F.sum(cols[variables[i]] * cols[variables[j]]).alias(f"p{i}_{j}") for i, j in pairs
    ]
    row = joined.agg(*aggregates).collect()[0]
    k = len(variables)
    sums = np.array([row[f"s{i}"] for i in range(k)], dtype=np.float64)
    products = np.zeros((k, k))
    for i, j in pairs:
        products[i, j] = products[j, i] = row[f"p{i}_{j}"]
    return int(row["c"]), sums, products, len(aggregates)


def _worker(args) -> None:
    from ringml.pipelines.spark_distributed import DistributedMaintainer
    from ringml.pipelines.spark_session import local_session

    spark = local_session(
        f"local[{args.master_cores}]",
        "ringml-bench",
        shuffle_partitions=max(args.shards, args.master_cores),
        driver_memory=args.driver_memory,
        conf={"spark.sql.files.maxPartitionBytes": "1m"},
    )
    with open(os.path.join(args.data, "paths.json")) as handle:
        meta = json.load(handle)
    schemas = meta["schemas"]
    expected = (
        meta["count"],
        np.asarray(meta["sums"]),
        np.asarray(meta["products"]),
    )
    out: dict[str, dict] = {}

    def distributed(paths, state_dir):
        query = rm.covariance_query(schemas)
        dm = DistributedMaintainer(spark, query, shards=args.shards, state_dir=state_dir)
        started = time.perf_counter()
        dm.load({r: spark.read.parquet(p) for r, p in paths.items()})
        seconds = time.perf_counter() - started
        moments = query.ring.moments(dm.result())
        shard_seconds = [row["seconds"] for row in dm.last_job]
        return seconds, moments, shard_seconds, dict(dm.last_timings)

    default_fields = spark.conf.get("spark.sql.codegen.maxFields")
    sql_variants = {"spark-sql": default_fields, "spark-sql-tuned": "1000"}

    # warm-up on the tiny database: JVM, Python workers, code generation
    tiny = meta["tiny"]
    warm_dir = tempfile.mkdtemp(prefix="ringml-warm-")
    distributed(tiny, warm_dir)
    shutil.rmtree(warm_dir, ignore_errors=True)
    for fields in sql_variants.values():
        spark.conf.set("spark.sql.codegen.maxFields", fields)
        _spark_sql_moments(spark, tiny, meta["variables"])

    for _ in range(args.repeat):
        state_dir = tempfile.mkdtemp(prefix="ringml-bench-")
        try:
            seconds, moments, shard_seconds, phases = distributed(meta["paths"], state_dir)
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
        best = out.get("distributed")
        if best is None or seconds < best["seconds"]:
            out["distributed"] = {
                "seconds": seconds,
                "correct": _moments_close(expected, moments),
                "shard_seconds_max": max(shard_seconds),
                "shard_seconds_sum": sum(shard_seconds),
                "phases": phases,
            }
        for name, fields in sql_variants.items():
            spark.conf.set("spark.sql.codegen.maxFields", fields)
            started = time.perf_counter()
            count, sums, products, n_aggregates = _spark_sql_moments(
                spark, meta["paths"], meta["variables"]
            )
            seconds = time.perf_counter() - started
            best = out.get(name)
            if best is None or seconds < best["seconds"]:
                out[name] = {
                    "seconds": seconds,
                    "correct": _moments_close(expected, (count, sums, products)),
                    "aggregates": n_aggregates,
                }
    spark.stop()
    print("RESULT " + json.dumps(out))


# ---------------------------------------------------------------------- driver
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postcodes", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--cores", default="1,2", help="Spark local[n] core counts to run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per contender (best kept)")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--master-cores", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return

    dataset = housing_star(postcodes=args.postcodes, seed=args.seed)
    sizes = dataset.sizes()
    input_rows = sum(sizes.values())
    join_rows = args.postcodes * int(np.prod(list(dataset.extra["rows_per_postcode"].values())))
    query = rm.covariance_query(dataset.schemas)
    print(
        f"Housing star: P={args.postcodes:,} postcodes, {input_rows:,} input rows, "
        f"join {join_rows:,} rows; {len(query.ring.variables)} features "
        f"(378 aggregates for 26); shards={args.shards}; machine: {os.cpu_count()} CPUs"
    )

    m = rm.Maintainer(query)
    started = time.perf_counter()
    m.apply([rm.UpdateBatch.inserts(r, f) for r, f in dataset.relations.items()])
    local_seconds = time.perf_counter() - started
    count, sums, products = query.ring.moments(m.result())
    assert count == join_rows, (count, join_rows)
    del m

    data = tempfile.mkdtemp(prefix="ringml-spark-bench-")
    try:
        tiny = housing_star(postcodes=50, seed=args.seed + 1)
        os.makedirs(os.path.join(data, "tiny"))
        meta = {
            "schemas": dataset.schemas,
            "variables": list(query.ring.variables),
            "paths": _write_parquet(dataset, data),
            "tiny": _write_parquet(tiny, os.path.join(data, "tiny")),
            "count": int(count),
            "sums": sums.tolist(),
            "products": products.tolist(),
        }
        with open(os.path.join(data, "paths.json"), "w") as handle:
            json.dump(meta, handle)
        results: dict[int, dict] = {}
        for cores in [int(c) for c in args.cores.split(",") if c.strip()]:
            command = [
                sys.executable, os.path.abspath(__file__), "--worker",
                "--master-cores", str(cores), "--data", data, "--shards", str(args.shards),
                "--repeat", str(args.repeat), "--driver-memory", args.driver_memory,
            ]  # fmt: skip
            started = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, check=False)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
                raise SystemExit(f"local[{cores}] run failed (exit {proc.returncode})")
            results[cores] = json.loads(line[len("RESULT ") :])
            print(f"  local[{cores}] done in {time.perf_counter() - started:.0f} s (with start-up)")
    finally:
        shutil.rmtree(data, ignore_errors=True)

    header = (
        f"| {'contender':<24} | {'cores':>5} | {'seconds':>8} | {'input rows/s':>12} | "
        f"{'join rows/s':>12} | {'faster than SQL (def/tuned)':>27} | {'vs 1 core':>9} | ok |"
    )
    print()
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")

    def row(name, cores, seconds, ok, versus_sql, versus_one):
        print(
            f"| {name:<24} | {cores:>5} | {seconds:>8.2f} | {input_rows / seconds:>12,.0f} | "
            f"{join_rows / seconds:>12,.0f} | {versus_sql:>27} | {versus_one:>9} | "
            f"{'yes' if ok else 'NO'} |"
        )

    row("local engine, no Spark", 1, local_seconds, True, "", "")
    one = results.get(min(results)) if results else None
    for cores, result in sorted(results.items()):
        dist, sql = result["distributed"], result["spark-sql"]
        tuned = result["spark-sql-tuned"]

        def scale(name, mine):
            return f"{one[name]['seconds'] / mine['seconds']:.2f}x" if one else ""

        row(
            f"distributed ({args.shards} shards)",
            cores,
            dist["seconds"],
            dist["correct"],
            f"{sql['seconds'] / dist['seconds']:.1f}x / {tuned['seconds'] / dist['seconds']:.1f}x",
            scale("distributed", dist),
        )
        row(
            "Spark SQL (defaults)",
            cores,
            sql["seconds"],
            sql["correct"],
            "",
            scale("spark-sql", sql),
        )
        row(
            "Spark SQL (maxFields)",
            cores,
            tuned["seconds"],
            tuned["correct"],
            "",
            scale("spark-sql-tuned", tuned),
        )
    print()
    for cores, result in sorted(results.items()):
        dist = result["distributed"]
        print(
            f"local[{cores}]: distributed shard time max {dist['shard_seconds_max']:.2f} s, "
            f"sum {dist['shard_seconds_sum']:.2f} s (load state, apply, snapshot, root); "
            f"driver: shifts job {dist['phases'].get('prepare', 0):.2f} s, "
            f"shard job {dist['phases'].get('job', 0):.2f} s"
        )


if __name__ == "__main__":
    main()
