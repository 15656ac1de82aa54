"""Sliding-window aggregates: incremental maintenance under expiry against recomputing the
window after every batch (ViewDF's Fig. 5.6-5.8 shape: time per refresh against the window
size).

One stream S(ts, g, x) of ``--batch`` rows per partition (events out of order within one
partition), ``--groups`` groups, windows of W partitions.  After every batch each system
holds, per group, COUNT(*), SUM(x), MIN(x) and MAX(x) over the rows inside the window:

* ``ringml``: a WindowedStream feeding a Maintainer (SUM and COUNT, F-IVM) and a MinMaxView
  (exact MIN/MAX under the expiry deletes);
* ``pandas``: the window's rows kept as partitions, concatenated and grouped every batch;
* ``duckdb``: the same SQL re-evaluated by DuckDB over the window's rows every batch.

Every system's final result is checked against pandas.  Writes ``results/window_aggregates
.md`` and ``.csv``.  Run: ``python benchmarks/window_aggregates.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

# the benchmarks' git probe (a script beside this one, run with benchmarks/ on sys.path)
from engine import _git

RESULTS = Path(__file__).resolve().parent / "results"


def stream(batches: int, batch: int, groups: int, seed: int = 0) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    return [
        pd.DataFrame(
            {
                "ts": i + rng.uniform(-0.5, 0.5, batch),
                "g": rng.integers(0, groups, batch),
                "x": rng.normal(size=batch).round(3),
            }
        )
        for i in range(batches)
    ]


def window_of(frames: list[pd.DataFrame], watermark: float, width: int) -> pd.DataFrame:
    """The rows whose partition end plus the range is beyond the watermark."""
    rows = pd.concat(frames, ignore_index=True)
    return rows[np.floor(rows["ts"]) + 1 + width > watermark]


def run_ringml(data, width):
    from ringml.rings.scalar import IntegerRing, ProductRing, RealRing

    from ringml import Maintainer, Query
    from ringml.windows import MinMaxView, StreamTable, WindowedStream

    ring = ProductRing(RealRing(["x"]), IntegerRing(), names=("sum", "count"))
    sums = Maintainer(Query({"S": ["g", "x"]}, ring, free=["g"]))
    extremes = MinMaxView("S", values=["x"], by=["g"])
    windowed = WindowedStream(
        [sums, extremes], {"S": StreamTable("ts", 1.0, f"RANGE {width}")}, lateness=0.5
    )
    started = time.perf_counter()
    for frame in data:
        windowed.insert("S", frame)
    elapsed = time.perf_counter() - started
    result = extremes.result().set_index("g").sort_index()
    result["sum"] = pd.Series({k[0]: v[0] for k, v in sums.result().items()})
    return elapsed, result[["count", "sum", "min_x", "max_x"]]


def run_pandas(data, width):
    frames, watermark = [], -np.inf
    started = time.perf_counter()
    for frame in data:
        watermark = max(watermark, frame["ts"].max() - 0.5)
        frames.append(frame)
        frames = frames[-(width + 3) :]  # older batches are out of every window
        rows = window_of(frames, watermark, width)
        result = rows.groupby("g")["x"].agg(["count", "sum", "min", "max"])
    elapsed = time.perf_counter() - started
    return elapsed, result.set_axis(["count", "sum", "min_x", "max_x"], axis=1)


def run_duckdb(data, width):
    import duckdb

    con = duckdb.connect()
    frames, watermark = [], -np.inf
    sql = (
        "SELECT g, COUNT(*) AS count, SUM(x) AS sum, MIN(x) AS min_x, MAX(x) AS max_x "
        "FROM w GROUP BY g"
    )
    started = time.perf_counter()
    for frame in data:
        watermark = max(watermark, frame["ts"].max() - 0.5)
        frames.append(frame)
        frames = frames[-(width + 3) :]
        w = window_of(frames, watermark, width)  # noqa: F841 (read by DuckDB by name)
        result = con.sql(sql).df()
    elapsed = time.perf_counter() - started
    return elapsed, result.set_index("g").sort_index()


SYSTEMS = {"ringml": run_ringml, "pandas": run_pandas, "duckdb": run_duckdb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--windows", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="200 batches, windows 10 and 50")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.batches, args.windows = 200, [10, 50]
    rows = []
    for width in args.windows:
        data = stream(args.batches, args.batch, args.groups, seed=width)
        results = {}
        for name, run in SYSTEMS.items():
            elapsed, results[name] = run(data, width)
            rows.append(
                {
                    "window_partitions": width,
                    "system": name,
                    "seconds": elapsed,
                    "rows_per_s": args.batches * args.batch / elapsed,
                    "ms_per_batch": 1000 * elapsed / args.batches,
                }
            )
            print(f"W={width:4d} {name:7s} {rows[-1]['ms_per_batch']:7.2f} ms/batch", flush=True)
        want = results["pandas"]
        for name in ("ringml", "duckdb"):
            got = results[name].reindex(want.index)
            np.testing.assert_array_equal(
                got["count"].to_numpy(float), want["count"].to_numpy(float)
            )
            for column in ("min_x", "max_x"):
                np.testing.assert_array_equal(
                    got[column].to_numpy(float), want[column].to_numpy(float)
                )
            np.testing.assert_allclose(
                got["sum"].to_numpy(float), want["sum"].to_numpy(float), atol=1e-9
            )
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "window_aggregates.csv", index=False)
    commit = _git("rev-parse", "--short", "HEAD")
    wide = table.pivot(index="window_partitions", columns="system", values="ms_per_batch")
    wide["pandas / ringml"] = wide["pandas"] / wide["ringml"]
    wide["duckdb / ringml"] = wide["duckdb"] / wide["ringml"]
    text = [
        "# Sliding-window COUNT/SUM/MIN/MAX: incremental vs recomputing the window",
        "",
        f"`python benchmarks/window_aggregates.py{' --quick' if args.quick else ''}` at commit "
        f"{commit}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}; {args.batches} batches of {args.batch} rows, "
        f"{args.groups} groups, events out of order within one partition.",
        "",
        "Milliseconds per batch (lower is better); every system's final result equals pandas'.",
        "",
        _markdown(wide.round(2)),
        "",
    ]
    (args.out / "window_aggregates.md").write_text("\n".join(text))
    print("\n".join(text))


def _markdown(frame: pd.DataFrame) -> str:
    header = [frame.index.name or "", *map(str, frame.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in frame.iterrows():
        lines.append("| " + " | ".join([str(index), *(f"{v:g}" for v in row)]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
