"""Spark benchmark: the sharded maintainer vs Spark SQL over the materialized join.

Workload: the bulk initial computation of the Housing covariance payload (count, 26 sums,
351 pairwise products = 378 aggregates over the natural join of six relations on postcode)
for ``housing_star(postcodes=P)``: the join has 200 * P rows (10 million for the default
P = 50,000) while the relations hold 21 * P rows.

Contenders, each in a fresh process per core count (``local[1]``, ``local[2]``, ...; the
Spark master is fixed per JVM), on the same parquet files:

* ``distributed``: :class:`ringml.pipelines.spark_distributed.DistributedMaintainer` with
  ``--shards`` shards, ``load({relation: spark.read.parquet(path)})``: the relations are
  routed by ``hash(postcode)`` in ``mapInArrow``, every shard runs the local F-IVM engine in
  ``applyInArrow`` and writes its state, the driver sums the roots;
* ``distributed-files``: the same with ``load({relation: path})``: the map tasks read the
  parquet row groups themselves with pyarrow (one thread each) instead of receiving
  Spark's scan converted row by row to Arrow;
* ``spark-sql``: Spark joins the six relations and computes the 378 aggregates
  (``count(*)``, ``sum(x_i)``, ``sum(x_i * x_j)``) over the 200 * P joined rows, with
  default settings, and ``spark-sql-tuned`` with ``spark.sql.codegen.maxFields=1000`` (by
  default whole-stage code generation gives up on plans wider than 100 fields, which a
  378-aggregate buffer is);
* ``local engine``: one ``ringml.Maintainer`` in this process, no Spark (for reference).

A warm-up on a tiny database runs first in every Spark process, so JVM, Python-worker and
code-generation start-up are not timed.  The distributed maintainer runs ``--repeat-distributed``
times (default 5) and Spark SQL ``--repeat`` times (default 1) per process, interleaved; the
table shows the best and the median of each, and the targets compare the *median*
distributed run with the *best* Spark SQL run (a run of a few seconds on a shared machine is
more exposed to other people's load than one of a minute).  Every result is checked against
the local engine's (count exactly, moments to 1e-6 relative).  The engine sources are
copied once per run and every process imports that copy (others edit ``ringml/`` while
benchmarks run).  The load average is recorded at the start and end of every process.
Writes ``spark.md`` and ``spark.csv`` to ``--out`` (default ``benchmarks/results``).

    .venv/bin/python benchmarks/spark.py                 # P = 50,000, local[1] and local[2]
    .venv/bin/python benchmarks/spark.py --postcodes 5000 --cores 1,2 --shards 4 --out /tmp/r
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import itertools
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

import numpy as np

# the benchmarks' git probe (a script beside this one, run with benchmarks/ on sys.path)
from engine import _git

import ringml as rm
from ringml.datasets import housing_star

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# source folder -> where it lives in the installed package
ENGINE_DIRS = {
    "ringml": "ringml",
    "rings": "ringml/rings",
    "models": "ringml/models",
    "pipelines": "ringml/pipelines",
}
TARGET_RATIO = 10.0


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


def _snapshot_engine(dest: str) -> str:
    """Copy the engine sources to ``dest`` (first on every process's path); their hash."""
    for src, rel in ENGINE_DIRS.items():
        if os.path.isdir(os.path.join(REPO, src)):
            shutil.copytree(
                os.path.join(REPO, src),
                os.path.join(dest, rel),
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                dirs_exist_ok=True,
            )
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(os.path.join(dest, "ringml"))):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                digest.update(os.path.relpath(path, dest).encode() + b"\0" + handle.read())
    return digest.hexdigest()[:12]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _load_text(load) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


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
    import ringml.pipelines.spark_distributed as distributed_module
    from ringml.pipelines.spark_distributed import DistributedMaintainer
    from ringml.pipelines.spark_session import local_session

    load_start = _load()
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
    expected = (meta["count"], np.asarray(meta["sums"]), np.asarray(meta["products"]))
    runs: dict[str, list[dict]] = {
        "distributed": [],
        "distributed-files": [],
        "spark-sql": [],
        "spark-sql-tuned": [],
    }

    def distributed(paths, state_dir, files: bool = False):
        query = rm.covariance_query(schemas)
        dm = DistributedMaintainer(spark, query, shards=args.shards, state_dir=state_dir)
        started = time.perf_counter()
        if files:  # the map tasks read the parquet files themselves (pyarrow)
            dm.load(dict(paths))
        else:
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
    warm_dir = tempfile.mkdtemp(prefix="ringml-warm-")
    distributed(tiny, warm_dir, files=True)
    shutil.rmtree(warm_dir, ignore_errors=True)
    for fields in sql_variants.values():
        spark.conf.set("spark.sql.codegen.maxFields", fields)
        _spark_sql_moments(spark, tiny, meta["variables"])

    for i in range(max(args.repeat_distributed, args.repeat)):
        for name, files in (("distributed", False), ("distributed-files", True)):
            if i >= args.repeat_distributed:
                break
            state_dir = tempfile.mkdtemp(prefix="ringml-bench-")
            try:
                seconds, moments, shard_seconds, phases = distributed(
                    meta["paths"], state_dir, files
                )
            finally:
                shutil.rmtree(state_dir, ignore_errors=True)
            runs[name].append(
                {
                    "seconds": seconds,
                    "correct": _moments_close(expected, moments),
                    "shard_seconds_max": max(shard_seconds),
                    "shard_seconds_sum": sum(shard_seconds),
                    "phases": phases,
                    "load": _load(),
                }
            )
        if i < args.repeat:
            for name, fields in sql_variants.items():
                spark.conf.set("spark.sql.codegen.maxFields", fields)
                started = time.perf_counter()
                count, sums, products, n_aggregates = _spark_sql_moments(
                    spark, meta["paths"], meta["variables"]
                )
                seconds = time.perf_counter() - started
                runs[name].append(
                    {
                        "seconds": seconds,
                        "correct": _moments_close(expected, (count, sums, products)),
                        "aggregates": n_aggregates,
                        "load": _load(),
                    }
                )
    spark.stop()
    out = {
        "runs": runs,
        "load_start": load_start,
        "load_end": _load(),
        "engine_file": distributed_module.__file__,
        "default_max_fields": default_fields,
    }
    print("RESULT " + json.dumps(out))


# ---------------------------------------------------------------------- driver
def _summary(runs: list[dict]) -> dict:
    times = [r["seconds"] for r in runs]
    return {
        "best": min(times),
        "median": statistics.median(times),
        "n": len(times),
        "times": times,
        "correct": all(r["correct"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postcodes", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--cores", default="1,2", help="Spark local[n] core counts to run")
    parser.add_argument("--repeat", type=int, default=1, help="Spark SQL runs per variant")
    parser.add_argument(
        "--repeat-distributed", type=int, default=5, help="distributed runs per process"
    )
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    parser.add_argument("--tag", default="spark", help="result file stem")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--master-cores", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    argv = sys.argv[1:]
    load_before = _load()
    started_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    dataset = housing_star(postcodes=args.postcodes, seed=args.seed)
    sizes = dataset.sizes()
    input_rows = sum(sizes.values())
    join_rows = args.postcodes * int(np.prod(list(dataset.extra["rows_per_postcode"].values())))
    query = rm.covariance_query(dataset.schemas)
    print(
        f"Housing star: P={args.postcodes:,} postcodes, {input_rows:,} input rows, "
        f"join {join_rows:,} rows; {len(query.ring.variables)} features "
        f"(378 aggregates for 26); shards={args.shards}; machine: {os.cpu_count()} CPUs; "
        f"load {_load_text(load_before)}",
        flush=True,
    )

    m = rm.Maintainer(query)
    started = time.perf_counter()
    m.apply([rm.UpdateBatch.inserts(r, f) for r, f in dataset.relations.items()])
    local_seconds = time.perf_counter() - started
    count, sums, products = query.ring.moments(m.result())
    assert count == join_rows, (count, join_rows)
    del m

    data = tempfile.mkdtemp(prefix="ringml-spark-bench-")
    snapshot = os.path.join(data, "engine")
    engine_hash = _snapshot_engine(snapshot)
    script = os.path.join(data, "spark_benchmark.py")  # workers run this copy, too
    shutil.copyfile(os.path.abspath(__file__), script)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [snapshot, env.get("PYTHONPATH")]))
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--", *ENGINE_DIRS))
    results: dict[int, dict] = {}
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
        for cores in [int(c) for c in args.cores.split(",") if c.strip()]:
            command = [
                sys.executable, script, "--worker",
                "--master-cores", str(cores), "--data", data, "--shards", str(args.shards),
                "--repeat", str(args.repeat),
                "--repeat-distributed", str(args.repeat_distributed),
                "--driver-memory", args.driver_memory,
            ]  # fmt: skip
            started = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
                raise SystemExit(f"local[{cores}] run failed (exit {proc.returncode})")
            results[cores] = json.loads(line[len("RESULT ") :])
            if not results[cores]["engine_file"].startswith(snapshot):
                raise SystemExit(f"the worker imported {results[cores]['engine_file']}")
            print(
                f"  local[{cores}] done in {time.perf_counter() - started:.0f} s (with start-up); "
                f"load {_load_text(results[cores]['load_start'])} -> "
                f"{_load_text(results[cores]['load_end'])}",
                flush=True,
            )
    finally:
        shutil.rmtree(data, ignore_errors=True)
    load_after = _load()

    summaries = {
        cores: {name: _summary(runs) for name, runs in result["runs"].items()}
        for cores, result in results.items()
    }
    one = summaries.get(min(summaries)) if summaries else None
    rows = [
        {
            "contender": "local engine, no Spark",
            "cores": 1,
            "best": local_seconds,
            "median": local_seconds,
            "n": 1,
            "times": [local_seconds],
            "correct": True,
            "key": "local",
        }
    ]
    labels = {
        "distributed": f"distributed, Spark DataFrames ({args.shards} shards)",
        "distributed-files": f"distributed, parquet paths ({args.shards} shards)",
        "spark-sql": "Spark SQL (defaults)",
        "spark-sql-tuned": "Spark SQL (maxFields=1000)",
    }
    for cores, summary in sorted(summaries.items()):
        for key, label in labels.items():
            rows.append({"contender": label, "cores": cores, "key": key, **summary[key]})
    for row in rows:
        row["input_rows_per_s"] = input_rows / row["median"]
        row["join_rows_per_s"] = join_rows / row["median"]
        if row["key"].startswith("distributed"):
            sql = summaries[row["cores"]]
            row["vs_sql"] = sql["spark-sql"]["best"] / row["median"]
            row["vs_sql_tuned"] = sql["spark-sql-tuned"]["best"] / row["median"]
            row["vs_sql_best"] = sql["spark-sql"]["best"] / row["best"]
        if one is not None and row["key"] in labels:
            row["vs_one_core"] = one[row["key"]]["median"] / row["median"]

    goals = []
    for key, what in (("distributed", "Spark DataFrames"), ("distributed-files", "parquet paths")):
        for cores, summary in sorted(summaries.items()):
            dist, sql = summary[key], summary["spark-sql"]
            ratio = sql["best"] / dist["median"]
            goals.append(
                (
                    f"local[{cores}]: distributed ({what}) ≥ {TARGET_RATIO:g}x faster than "
                    "Spark SQL (defaults)",
                    f"{ratio:.1f}x (Spark SQL best {sql['best']:.1f} s / distributed median "
                    f"{dist['median']:.2f} s; best/best {sql['best'] / dist['best']:.1f}x)",
                    ratio >= TARGET_RATIO,
                )
            )
        if len(summaries) >= 2:
            low, high = min(summaries), max(summaries)
            a, b = summaries[low][key], summaries[high][key]
            goals.append(
                (
                    f"distributed ({what}): faster on local[{high}] than on local[{low}]",
                    f"{a['median'] / b['median']:.2f}x (medians {a['median']:.2f} s -> "
                    f"{b['median']:.2f} s; best {a['best']:.2f} s -> {b['best']:.2f} s)",
                    b["median"] < a["median"],
                )
            )
    phases = []
    for (cores, result), key in itertools.product(
        sorted(results.items()), ("distributed", "distributed-files")
    ):
        best = min(result["runs"][key], key=lambda r: r["seconds"])
        timings = best["phases"]
        phases.append(
            f"local[{cores}], best {labels[key]} run: shard time max "
            f"{best['shard_seconds_max']:.2f} s, sum {best['shard_seconds_sum']:.2f} s "
            f"(load state, apply, snapshot, root); driver: validation "
            f"{timings.get('prepare', 0):.3f} s, shard job {timings.get('job', 0):.2f} s, "
            f"commit {timings.get('commit', 0):.3f} s"
        )
    env_lines = {
        "date": started_at,
        "command": " ".join(["python benchmarks/spark.py", *map(shlex.quote, argv)]),
        "engine": f"commit {commit}"
        + (" + uncommitted changes in ringml/, rings/, models/ or pipelines/" if dirty else "")
        + f"; every process imported one snapshot of the sources (sha256 {engine_hash})",
        "python": platform.python_version(),
        "pyspark": _pyspark_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "workload": f"housing_star(postcodes={args.postcodes:,}): {input_rows:,} input rows "
        f"in 6 parquet files, join {join_rows:,} rows, 26 features, 378 aggregates",
        "shards": str(args.shards),
        "Spark session": "local[n], spark.sql.shuffle.partitions = max(shards, n), "
        "spark.sql.files.maxPartitionBytes = 1m, driver memory "
        f"{args.driver_memory}; everything else Spark's defaults (spark.sql.codegen.maxFields "
        f"= {next(iter(results.values()))['default_max_fields'] if results else '?'})",
        "runs": f"distributed {args.repeat_distributed} per process, Spark SQL {args.repeat} "
        "per variant, interleaved, after a warm-up on a tiny database",
        "load average (1/5/15 min) at start": _load_text(load_before),
    }
    for cores, result in sorted(results.items()):
        env_lines[f"load average in the local[{cores}] process (start -> end)"] = (
            f"{_load_text(result['load_start'])} -> {_load_text(result['load_end'])}"
        )
    env_lines["load average (1/5/15 min) at end"] = _load_text(load_after)

    table = _table(rows)
    print()
    print("\n".join(table))
    print()
    for text, measured, ok in goals:
        print(f"{'PASS' if ok else 'FAIL'}  {text}: {measured}")
    for line in phases:
        print(line)
    if not args.no_write:
        os.makedirs(args.out, exist_ok=True)
        md = os.path.join(args.out, f"{args.tag}.md")
        with open(md, "w") as handle:
            handle.write(_markdown(env_lines, table, goals, phases))
        with open(os.path.join(args.out, f"{args.tag}.csv"), "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(
                ["contender", "cores", "runs", "best_s", "median_s", "times_s", "correct",
                 "vs_spark_sql", "vs_spark_sql_tuned", "vs_one_core"]
            )  # fmt: skip
            for row in rows:
                writer.writerow(
                    [row["contender"], row["cores"], row["n"], f"{row['best']:.4f}",
                     f"{row['median']:.4f}", " ".join(f"{t:.4f}" for t in row["times"]),
                     row["correct"], _opt(row.get("vs_sql")), _opt(row.get("vs_sql_tuned")),
                     _opt(row.get("vs_one_core"))]
                )  # fmt: skip
        print(f"\nwrote {md} and {args.tag}.csv")
    if not all(row["correct"] for row in rows):
        raise SystemExit("a contender computed a wrong result")


def _opt(value) -> str:
    return "" if value is None else f"{value:.3f}"


def _pyspark_version() -> str:
    try:
        import pyspark

        return pyspark.__version__
    except ImportError:
        return "?"


def _table(rows) -> list[str]:
    head = (
        "| contender | cores | runs | best s | median s | join rows/s (median) | "
        "faster than Spark SQL (defaults / maxFields), median | vs 1 core (median) | ok |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        versus = f"{row['vs_sql']:.1f}x / {row['vs_sql_tuned']:.1f}x" if "vs_sql" in row else ""
        one = f"{row['vs_one_core']:.2f}x" if "vs_one_core" in row else ""
        lines.append(
            f"| {row['contender']} | {row['cores']} | {row['n']} | {row['best']:.2f} | "
            f"{row['median']:.2f} | {row['join_rows_per_s']:,.0f} | {versus} | {one} | "
            f"{'yes' if row['correct'] else 'NO'} |"
        )
    return lines


def _markdown(env_lines, table, goals, phases) -> str:
    lines = ["# Spark benchmark: distributed bulk load vs Spark SQL over the join", ""]
    lines += [f"- {key}: {value}" for key, value in env_lines.items()]
    lines += ["", "## Results", "", *table, ""]
    lines += [
        "best / median over the runs of one process; join rows/s = join rows / median "
        "seconds; faster than Spark SQL = Spark SQL's best / the distributed median; "
        "vs 1 core = the same contender's median on the fewest cores / this one; ok = the "
        "result equals the local engine's (count exactly, moments to 1e-6).",
        "",
        "## Targets",
        "",
        "| target | measured | result |",
        "|---|---|---|",
    ]
    lines += [f"| {t} | {m} | {'PASS' if ok else 'FAIL'} |" for t, m, ok in goals]
    lines += ["", "## Where the distributed time goes", ""]
    lines += [f"- {line}" for line in phases]
    lines += [
        "",
        "Outside the shard job: `spark.read.parquet` (one schema job per file, DataFrame "
        "contender only), building and planning the job, summing the shard roots.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
