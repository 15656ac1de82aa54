"""Sliding windows (issue 13): windowed covariance against recomputing the window, and a
windowed SUM against Spark's own windowed aggregation.

**1. Windowed covariance over a join** (in one process, interleaved).  ``housing_star(P)``:
the five dimension relations are loaded once; House rows are sales with an event time
``t`` (minutes) spread over ``--minutes``, arriving in micro-batches of ``--batch-minutes``
minutes of arrivals, each up to ``--lateness`` minutes after it happened (out of order).
Query: count, Σx and Σxxᵀ over the join of the dataset's continuous variables (14 for
Housing: 120 aggregates), over the sales of the last ``W`` minutes (``RANGE W``, 1-minute
partitions; the watermark is the latest event time minus the lateness).  Programs, fed the
same micro-batches batch by batch (the one going first alternates), the timed part starting
once the first window is full:

* ``ringml``: :class:`ringml.windows.WindowedStream` over a :class:`ringml.Maintainer`
  (F-IVM): every batch inserts the new sales and deletes the minutes that left the window,
  one atomic apply; the root payload is read after every batch;
* ``recompute``: the same window kept as per-minute pandas frames (same watermark and
  expiry rule); after every batch the window's sales are joined (``merge``) with the
  dimension relations joined once beforehand (they never change: the baseline's best
  case), and the moments are one matrix product ``Zᵀ Z`` over the windowed join.

Both are checked against each other every ``--check-every`` batches and at the end (count
exactly, moments to 1e-9 relative).  A repeat stops at ``--budget`` seconds of the slower
program's time (both are measured on the same prefix).  Reported: sales/s of each,
ringml's speed-up (recompute time / ringml time) min / median / max over the repeats.

**2. Windowed SUM: ringml vs Spark's windowed aggregation** (local Spark).  A stream
``S(t timestamp, key bigint, value double)`` of ``--sum-rows`` rows per minute over
``--sum-minutes`` minutes and ``--keys`` keys, written as one CSV file per minute (rows up
to ``--lateness`` minutes out of order).  ``SUM(value) GROUP BY key`` over the last ``W``
minutes, sliding by one minute:

* ``spark``: ``withWatermark("t", lateness)``, ``groupBy(window("t", "W minutes",
  "1 minute"), "key").agg(sum("value"))``, output mode ``update``, the ``noop`` sink
  (Spark's best case: it writes nothing; every row updates ``W`` sliding windows);
* ``ringml+spark``: :class:`~ringml.pipelines.spark_windows.StreamingWindows` over the same
  files (``foreachBatch``, exactly once: the state is checkpointed with every batch id)
  into a WindowedStream of a SUM-by-key Maintainer (``RealRing``);
* ``ringml``: the same WindowedStream fed the same minutes in this process (no Spark).

Both Spark programs read the files with ``maxFilesPerTrigger=1`` and
``trigger(availableNow=True)`` (one micro-batch per minute), ``--repeats`` times each,
alternating, after a warm-up run on a tiny stream.  Checks: ringml's final window equals a
pandas sum over the rows inside it; Spark's last complete window (collected in a separate
untimed run) equals a pandas sum over its minutes.

Writes ``windows.md`` and ``windows.csv`` to ``--out`` (default ``benchmarks/results``) with
the command, commit, load average and the spread over repeats.

    .venv/bin/python benchmarks/windows.py
    .venv/bin/python benchmarks/windows.py --quick --out /tmp/r
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pandas as pd

# the benchmarks' git probe (a script beside this one, run with benchmarks/ on sys.path)
from engine import _git

import ringml as rm
from ringml.datasets import housing_star
from ringml.windows import StreamTable, WindowedStream

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
START = pd.Timestamp("2026-01-01")


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


# ====================================================================== 1. covariance
@dataclass
class Sales:
    dims: dict[str, pd.DataFrame]
    schemas: dict[str, list[str]]
    batches: list[pd.DataFrame]  # House rows with "t", per micro-batch of arrivals
    features: list[str]


def make_sales(postcodes: int, per_postcode: int, minutes: int, batch: int, lateness: float,
               seed: int) -> Sales:  # fmt: skip
    """The Housing star with House as sales over ``minutes`` minutes, in micro-batches."""
    data = housing_star(postcodes, rows_per_postcode={"House": per_postcode}, seed=seed)
    rng = np.random.default_rng(seed)
    house = data.relations["House"].sample(frac=1.0, random_state=seed).reset_index(drop=True)
    t = np.round(rng.uniform(0.0, minutes, len(house)), 3)
    arrival = t + rng.uniform(0.0, lateness, len(house))
    house.insert(0, "t", t)
    order = np.argsort(arrival, kind="stable")
    house, arrival = house.iloc[order].reset_index(drop=True), arrival[order]
    group = (arrival // batch).astype(np.int64)
    batches = [part for _, part in house.groupby(group, sort=True)]
    dims = {name: frame for name, frame in data.relations.items() if name != "House"}
    schemas = {"House": [c for c in house.columns if c != "t"]}
    schemas.update({name: list(frame.columns) for name, frame in dims.items()})
    return Sales(dims, schemas, batches, list(data.continuous))


class RingmlWindow:
    """F-IVM under a WindowedStream: the covariance payload of the windowed join."""

    def __init__(self, sales: Sales, window: int, lateness: float) -> None:
        self.maintainer = rm.Maintainer(rm.covariance_query(sales.schemas, sales.features))
        for name, frame in sales.dims.items():
            self.maintainer.load(name, frame)
        spec = StreamTable("t", partition=1, window=f"RANGE {window}")
        self.stream = WindowedStream(self.maintainer, {"House": spec}, lateness=lateness)

    def step(self, rows: pd.DataFrame):
        self.stream.apply([rm.UpdateBatch.inserts("House", rows)])
        return self.maintainer.result()

    def moments(self, payload):
        return self.maintainer.ring.moments(payload)


class RecomputeWindow:
    """The window as per-minute frames; every batch joins it with the (pre-joined,
    static) dimensions and takes ``Zᵀ Z``."""

    def __init__(self, sales: Sales, window: int, lateness: float) -> None:
        dims = list(sales.dims.values())
        joined = dims[0]
        for frame in dims[1:]:
            joined = joined.merge(frame, on="postcode")
        self.dims = joined
        self.features = sales.features
        self.window, self.lateness = window, lateness
        self.minutes: deque[tuple[int, pd.DataFrame]] = deque()
        self.pending: dict[int, list[pd.DataFrame]] = {}
        self.watermark = -np.inf

    def step(self, rows: pd.DataFrame):
        part = np.floor(rows["t"].to_numpy()).astype(np.int64)
        for k in np.unique(part):
            self.pending.setdefault(int(k), []).append(rows[part == k])
        self.watermark = max(self.watermark, float(rows["t"].max()) - self.lateness)
        # partition k stays while k + 1 + window > watermark
        keep = {k: v for k, v in self.pending.items() if k + 1 + self.window > self.watermark}
        self.pending = keep
        window = pd.concat([f for parts in keep.values() for f in parts], ignore_index=True)
        flat = window.drop(columns="t").merge(self.dims, on="postcode")
        z = flat[self.features].to_numpy(dtype=np.float64)
        count = float(len(z))
        return count, z.sum(axis=0), z.T @ z

    @staticmethod
    def moments(payload):
        return payload


def _same_moments(a, b) -> bool:
    ca, sa, qa = a
    cb, sb, qb = b
    scale_s, scale_q = np.abs(sb).max() or 1.0, np.abs(qb).max() or 1.0
    return (
        int(round(ca)) == int(round(cb))
        and np.allclose(sa, sb, rtol=1e-9, atol=1e-9 * scale_s)
        and np.allclose(qa, qb, rtol=1e-9, atol=1e-9 * scale_q)
    )


@dataclass
class CovRun:
    window: int
    repeat: int
    batches: int = 0
    sales: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    checks: int = 0
    ok: bool = True
    window_sales: int = 0


def run_covariance(sales: Sales, window: int, args, repeat: int) -> CovRun:
    programs = {
        "ringml": RingmlWindow(sales, window, args.lateness),
        "recompute": RecomputeWindow(sales, window, args.lateness),
    }
    run = CovRun(window, repeat, seconds={name: 0.0 for name in programs})
    warm = int(np.ceil((window + args.lateness) / args.batch_minutes)) + 1
    results = {}
    for i, rows in enumerate(sales.batches):
        names = list(programs) if (i + repeat) % 2 == 0 else list(reversed(programs))
        for name in names:
            t0 = time.perf_counter()
            results[name] = programs[name].step(rows)
            if i >= warm:
                run.seconds[name] += time.perf_counter() - t0
        if i >= warm:
            run.batches += 1
            run.sales += len(rows)
        last = i == len(sales.batches) - 1 or max(run.seconds.values()) > args.budget
        if i % args.check_every == 0 or last:
            moments = {n: programs[n].moments(r) for n, r in results.items()}
            run.ok &= _same_moments(moments["ringml"], moments["recompute"])
            run.checks += 1
        if last:
            run.window_sales = len(programs["ringml"].stream.window_rows("House"))
            break
    return run


# ====================================================================== 2. SUM vs Spark
def make_sum_stream(folder: str, minutes: int, rows: int, keys: int, lateness: float,
                    seed: int) -> pd.DataFrame:  # fmt: skip
    """One CSV file per minute of arrivals; returns every row (with its file number)."""
    rng = np.random.default_rng(seed)
    n = minutes * rows
    t = np.sort(rng.uniform(0.0, minutes, n))
    arrival = t + rng.uniform(0.0, lateness, n)
    order = np.argsort(arrival, kind="stable")
    frame = pd.DataFrame(
        {
            "t": (START + pd.to_timedelta(t[order], unit="min")).floor("ms"),
            "key": rng.integers(0, keys, n),
            "value": np.round(rng.exponential(10.0, n), 2),
            "file": (arrival[order] // 1).astype(np.int64),
        }
    )
    os.makedirs(folder, exist_ok=True)
    for number, part in frame.groupby("file", sort=True):
        out = part.drop(columns="file").assign(
            op="insert", t=part["t"].dt.strftime("%Y-%m-%d %H:%M:%S.%f").str[:-3]
        )[["op", "t", "key", "value"]]
        path = os.path.join(folder, f"part-{number:06d}.csv")
        out.to_csv(path + ".tmp", index=False)
        os.utime(path + ".tmp", (1e9 + number, 1e9 + number))
        os.replace(path + ".tmp", path)
    return frame


def sum_stream(window: int, lateness: float) -> WindowedStream:
    from ringml.rings.scalar import RealRing

    query = rm.Query({"S": ["key", "value"]}, RealRing(["value"]), free=["key"])
    spec = StreamTable("t", partition="1 MINUTE", window=f"RANGE {window} MINUTES")
    return WindowedStream(rm.Maintainer(query), {"S": spec}, lateness=f"{lateness} MINUTES")


def ringml_sum_in_process(frame: pd.DataFrame, window: int, lateness: float):
    stream = sum_stream(window, lateness)
    t0 = time.perf_counter()
    for _, part in frame.groupby("file", sort=True):
        stream.apply([rm.UpdateBatch.inserts("S", part[["t", "key", "value"]])])
    return time.perf_counter() - t0, stream


def _window_sums(frame: pd.DataFrame, lo: pd.Timestamp, hi: pd.Timestamp) -> dict:
    inside = frame[(frame["t"] >= lo) & (frame["t"] < hi)]
    return inside.groupby("key")["value"].sum().to_dict()


def _close(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(abs(a[k] - b[k]) <= 1e-9 * max(1.0, abs(b[k])) for k in b)


def check_ringml_sum(stream: WindowedStream, frame: pd.DataFrame, window: int) -> bool:
    """ringml's window = the partitions k with end_k + W > watermark (pandas from scratch)."""
    wm = stream.watermark
    minute = frame["t"].dt.floor("min")
    inside = frame[minute + pd.Timedelta(minutes=1 + window) > wm]
    expected = inside.groupby("key")["value"].sum().to_dict()
    got = {k[0]: v for k, v in stream.targets[0].result().items() if v != 0.0 or k[0] in expected}
    return _close(got, expected)


def spark_native(spark, folder: str, checkpoint: str, window: int, lateness: float,
                 collect_end: pd.Timestamp | None = None):  # fmt: skip
    """Spark's sliding-window SUM over the files; with ``collect_end``, an untimed check run
    returning the last update of every key's window ending there."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.schema("op string, t timestamp, key bigint, value double")
        .option("header", "true")
        .option("maxFilesPerTrigger", "1")
        .csv(folder)
        .withWatermark("t", f"{int(lateness * 60)} seconds")
        .groupBy(F.window("t", f"{window} minutes", "1 minute"), "key")
        .agg(F.sum("value").alias("total"))
    )
    writer = df.writeStream.outputMode("update").option("checkpointLocation", checkpoint)
    got: dict = {}
    if collect_end is None:
        writer = writer.format("noop")
    else:

        def keep(batch, _):
            rows = batch.filter(F.col("window.end") == F.lit(collect_end)).select("key", "total")
            got.update({r["key"]: r["total"] for r in rows.collect()})

        writer = writer.foreachBatch(keep)
    t0 = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    return time.perf_counter() - t0, got, len(query.recentProgress)


def ringml_through_spark(spark, folder: str, checkpoint: str, state: str, window: int,
                         lateness: float):  # fmt: skip
    from ringml.pipelines.spark_stream import ChangeFeed
    from ringml.pipelines.spark_windows import StreamingWindows

    stream = sum_stream(window, lateness)
    sw = StreamingWindows(stream, state)
    feed = ChangeFeed(
        folder, {"t": "timestamp", "key": "bigint", "value": "double"}, relation="S",
        max_files_per_trigger=1,
    )  # fmt: skip
    t0 = time.perf_counter()
    sw.start(spark, feed, checkpoint, trigger={"availableNow": True}).awaitTermination()
    seconds = time.perf_counter() - t0
    if sw.errors:
        raise sw.errors[0]
    return seconds, sw


# ====================================================================== main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postcodes", type=int, default=1000)
    parser.add_argument("--sales-per-postcode", type=int, default=50)
    parser.add_argument("--minutes", type=int, default=2880, help="event-time span (minutes)")
    parser.add_argument("--batch-minutes", type=int, default=10)
    parser.add_argument("--windows", type=int, nargs="+", default=[60, 240, 960])
    parser.add_argument("--lateness", type=float, default=2.0, help="minutes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per repeat")
    parser.add_argument("--check-every", type=int, default=25)
    parser.add_argument("--sum-minutes", type=int, default=60)
    parser.add_argument("--sum-rows", type=int, default=3000, help="rows per minute")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--sum-window", type=int, default=30, help="minutes")
    parser.add_argument("--spark-repeats", type=int, default=2)
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--tag", default="windows")
    args = parser.parse_args(argv)
    if args.quick:
        args.postcodes, args.sales_per_postcode, args.minutes = 200, 30, 600
        args.windows, args.repeats, args.budget = [30, 120], 1, 5.0
        args.sum_minutes, args.sum_rows, args.spark_repeats = 12, 500, 1
    command = "python benchmarks/windows.py " + " ".join(map(shlex.quote, argv or sys.argv[1:]))
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command.strip(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--", "ringml", "rings", "pipelines")),
        "load_start": _load(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
    }
    print(f"load average {meta['load_start']}", flush=True)

    sales = make_sales(args.postcodes, args.sales_per_postcode, args.minutes,
                       args.batch_minutes, args.lateness, args.seed)  # fmt: skip
    n_sales = sum(len(b) for b in sales.batches)
    cov_runs: list[CovRun] = []
    for window in args.windows:
        for repeat in range(args.repeats):
            run = run_covariance(sales, window, args, repeat)
            cov_runs.append(run)
            rates = {n: run.sales / s for n, s in run.seconds.items()}
            print(
                f"covariance W={window} min, repeat {repeat}: {run.batches} batches, "
                f"{run.sales:,} sales, window {run.window_sales:,} sales; ringml "
                f"{rates['ringml']:,.0f} sales/s, recompute {rates['recompute']:,.0f} sales/s, "
                f"speed-up {run.seconds['recompute'] / run.seconds['ringml']:.1f}x, "
                f"ok={run.ok} (load {_load()})",
                flush=True,
            )

    spark_rows: list[dict] = []
    sum_meta: dict = {}
    if not args.skip_spark:
        spark_rows, sum_meta = _run_sum(args)
    meta["load_end"] = _load()
    _write(args, meta, sales, n_sales, cov_runs, spark_rows, sum_meta)
    ok = all(r.ok for r in cov_runs) and sum_meta.get("ok", True)
    return 0 if ok else 1


def _run_sum(args) -> tuple[list[dict], dict]:
    from ringml.pipelines.spark_session import local_session

    work = tempfile.mkdtemp(prefix="ringml-windows-bench-")
    try:
        folder = os.path.join(work, "feed")
        frame = make_sum_stream(folder, args.sum_minutes, args.sum_rows, args.keys,
                                args.lateness, args.seed)  # fmt: skip
        tiny = os.path.join(work, "tiny")
        make_sum_stream(tiny, 3, 50, 10, args.lateness, args.seed + 1)
        spark = local_session("local[2]", "ringml-windows-bench", shuffle_partitions=2)
        W = args.sum_window
        spark_native(spark, tiny, os.path.join(work, "ck-warm-1"), W, args.lateness)
        ringml_through_spark(spark, tiny, os.path.join(work, "ck-warm-2"),
                             os.path.join(work, "st-warm"), W, args.lateness)  # fmt: skip
        rows = []
        for repeat in range(args.spark_repeats):
            order = ["spark", "ringml+spark"] if repeat % 2 == 0 else ["ringml+spark", "spark"]
            for name in order:
                ck = os.path.join(work, f"ck-{name}-{repeat}")
                load = _load()
                if name == "spark":
                    seconds, _, batches = spark_native(spark, folder, ck, W, args.lateness)
                    ok = None
                else:
                    seconds, sw = ringml_through_spark(
                        spark, folder, ck, os.path.join(work, f"st-{repeat}"), W, args.lateness
                    )
                    batches = len(sw.reports)
                    ok = check_ringml_sum(sw.stream, frame, W)
                rows.append({"program": name, "repeat": repeat, "seconds": seconds,
                             "micro_batches": batches, "ok": ok, "load": load})  # fmt: skip
                print(f"SUM {name} repeat {repeat}: {seconds:.1f} s, {batches} batches", flush=True)
            seconds, stream = ringml_sum_in_process(frame, W, args.lateness)
            rows.append({"program": "ringml", "repeat": repeat, "seconds": seconds,
                         "micro_batches": frame["file"].nunique(),
                         "ok": check_ringml_sum(stream, frame, W), "load": _load()})  # fmt: skip
            print(f"SUM ringml in-process repeat {repeat}: {seconds:.2f} s", flush=True)
        # Spark's answer, untimed: the last window that ended before the final watermark
        newest = frame["t"].max() - pd.Timedelta(minutes=args.lateness)
        end = newest.floor("min")
        _, got, _ = spark_native(spark, folder, os.path.join(work, "ck-check"), W,
                                 args.lateness, collect_end=end)  # fmt: skip
        expected = _window_sums(frame, end - pd.Timedelta(minutes=W), end)
        spark_ok = _close(got, expected)
        spark.stop()
        meta = {
            "rows": len(frame),
            "files": int(frame["file"].nunique()),
            "spark_ok": spark_ok,
            "check_window_end": str(end),
            "ok": spark_ok and all(r["ok"] in (None, True) for r in rows),
        }
        return rows, meta
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def _write(args, meta, sales, n_sales, cov_runs, spark_rows, sum_meta) -> None:
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, args.tag)
    with open(stem + ".csv", "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["section", "program", "window_min", "repeat", "batches", "rows",
                      "seconds", "rows_per_s", "ok"])  # fmt: skip
        for run in cov_runs:
            for name, seconds in run.seconds.items():
                out.writerow(["covariance", name, run.window, run.repeat, run.batches,
                              run.sales, f"{seconds:.6f}", f"{run.sales / seconds:.1f}",
                              run.ok])  # fmt: skip
        for row in spark_rows:
            out.writerow(["sum", row["program"], args.sum_window, row["repeat"],
                          row["micro_batches"], sum_meta["rows"], f"{row['seconds']:.6f}",
                          f"{sum_meta['rows'] / row['seconds']:.1f}", row["ok"]])  # fmt: skip
    lines = [
        "# Sliding windows: windowed covariance vs recomputation, windowed SUM vs Spark",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- engine: commit {meta['commit']}"
        + (" (working tree modified)" if meta["dirty"] else ""),
        f"- python {meta['python']}; machine: {meta['machine']}",
        f"- load average (1/5/15 min) at start: {meta['load_start']}; at end: {meta['load_end']}",
        "",
        "## 1. Windowed covariance over the Housing join vs recomputing the window",
        "",
        f"`housing_star(postcodes={args.postcodes})`, House = {n_sales:,} sales over "
        f"{args.minutes} minutes in micro-batches of {args.batch_minutes} minutes of arrivals "
        f"(up to {args.lateness:g} min out of order), 5 static relations; count, Σx, Σxxᵀ of "
        f"{len(sales.features)} variables over the join of the sales of the last W minutes. "
        f"Timed once the first window is full; a repeat stops at {args.budget:g} s of the "
        f"slower program; {args.repeats} repeat(s), interleaved batch by batch.",
        "",
        "| W (min) | sales in window | timed batches | ringml sales/s | recompute sales/s | "
        "speed-up min / median / max | checks | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for window in args.windows:
        runs = [r for r in cov_runs if r.window == window]
        speed = [r.seconds["recompute"] / r.seconds["ringml"] for r in runs]
        ours = statistics.median(r.sales / r.seconds["ringml"] for r in runs)
        theirs = statistics.median(r.sales / r.seconds["recompute"] for r in runs)
        lines.append(
            f"| {window} | {runs[-1].window_sales:,} | {runs[-1].batches} | {ours:,.0f} | "
            f"{theirs:,.0f} | {_spread(speed)}x | {sum(r.checks for r in runs)} | "
            f"{'yes' if all(r.ok for r in runs) else 'NO'} |"
        )
    lines += [
        "",
        "sales/s: the median over repeats of timed sales / the program's time (ringml: apply "
        "with expiry + read the root payload; recompute: keep the minutes, join the window "
        "with the pre-joined dimensions, Zᵀ Z); speed-up: recompute time / ringml time on the "
        "same batches; ok: equal moments at every check (count exactly, 1e-9 relative).",
    ]
    if spark_rows:
        lines += [
            "",
            "## 2. Windowed SUM: ringml vs Spark's windowed aggregation",
            "",
            f"S(t, key, value): {sum_meta['rows']:,} rows over {args.sum_minutes} minutes "
            f"({args.sum_rows:,} per minute, {args.keys:,} keys, up to {args.lateness:g} min "
            f"out of order), one CSV file per minute ({sum_meta['files']} files, one "
            f"micro-batch each); SUM(value) GROUP BY key over the last {args.sum_window} "
            "minutes, sliding by one minute; local[2], 2 shuffle partitions.",
            "",
            "| program | repeats | seconds min / median / max | rows/s (median) | ok |",
            "|---|---|---|---|---|",
        ]
        for name in ("spark", "ringml+spark", "ringml"):
            mine = [r for r in spark_rows if r["program"] == name]
            seconds = [r["seconds"] for r in mine]
            ok = sum_meta["spark_ok"] if name == "spark" else all(r["ok"] for r in mine)
            lines.append(
                f"| {name} | {len(mine)} | {_spread(seconds)} | "
                f"{sum_meta['rows'] / statistics.median(seconds):,.0f} | "
                f"{'yes' if ok else 'NO'} |"
            )
        lines += [
            "",
            "spark: `withWatermark` + `groupBy(window(t, W, 1 minute), key).sum(value)`, update "
            "mode, noop sink; ringml+spark: StreamingWindows (foreachBatch, state checkpointed "
            "with every batch id) into a windowed SUM maintainer; ringml: the same windowed "
            "stream in process, no Spark. ok: ringml's final window equals pandas over the "
            f"rows inside it; Spark's window ending {sum_meta['check_window_end']} "
            "(collected in an untimed run) equals pandas over its minutes.",
        ]
    with open(stem + ".md", "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print(f"wrote {stem}.md and {stem}.csv")


if __name__ == "__main__":
    sys.exit(main())
