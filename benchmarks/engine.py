"""Engine benchmark: F-IVM against first-order IVM and recomputation on identical streams.

Run (from the repository root)::

    .venv/bin/python benchmarks/engine.py                      # default workloads, ~4 min
    .venv/bin/python benchmarks/engine.py --quick              # smaller data, 5 s budget
    .venv/bin/python benchmarks/engine.py --workload housing-5000 --deletes 0.2
    .venv/bin/python benchmarks/engine.py --workload housing-5000 --profile
    .venv/bin/python benchmarks/engine.py --workload star-shuffled   # issue 11, in-process

The ``star-shuffled-P`` workloads (P = 1000, 5000, 50000; ``star-shuffled`` = all three) run
a different method, in one process, interleaved against hand-written baselines: see
``benchmarks/star_shuffled.py``; they write ``engine-shuffled.md`` / ``.csv``.

Method of the other workloads (see benchmarks/README.md):

* A workload's update stream is built once (:func:`ringml.datasets.build_stream`: round-robin,
  batches of 1000) and pickled; every strategy replays the same batches in a fresh
  :class:`ringml.Maintainer` in its **own subprocess** (so memory peaks are separate).
* Engine snapshot: the engine sources are copied once per run and imported from the copy by
  every process, so concurrent edits of ``ringml/`` cannot change the code mid-run.
* Time: ``time.perf_counter`` around every ``Maintainer.apply`` (validation, encoding and
  maintenance; building the stream is not timed, loading static relations is timed apart).
  Throughput = tuples / summed apply time.  Latency percentiles are per batch.
* Budget: a strategy stops after the batch during which its apply time passed
  ``--budget-seconds``; its row then covers that prefix, and fivm's throughput on the same
  prefix (from fivm's cumulative times) is the basis of the speed-up.
* Warm-up: before the timed run the subprocess replays the first ``--warmup-rounds`` (1)
  round-robin rounds in a throwaway Maintainer of the same strategy, so first-call costs
  and the growth of a fresh process's heap (page faults) are not charged to the stream.
* Repeats: a strategy is run up to ``--repeats`` times while its summed time stays within the
  budget; the table shows the median run (the slower middle one for an even count).
* Memory: the subprocess resets its peak RSS (``/proc/self/clear_refs``) after loading the
  stream, then reports the peak RSS (``VmHWM``) of the run and its growth over the RSS just
  before the Maintainer was built (so the input stream is excluded from the growth).
* Correctness: every strategy's root payload equals fivm's on the same prefix
  (``ring.moments``, rtol 1e-9); fivm's final payload equals numpy moments of the
  materialized join of the final database (``--no-oracle`` skips).  Any mismatch makes the
  run exit with status 1.
"""

from __future__ import annotations

import argparse
import csv
import gc
import hashlib
import json
import os
import pickle
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

STRATEGIES = ("fivm", "first_order", "recompute")
WORKLOADS = (
    "housing-1000",
    "housing-5000",
    "retailer-all",
    "retailer-inventory",
    "retailer-inventory-scaling",
)
REPO = Path(__file__).resolve().parents[1]
RTOL = 1e-9

# Targets of the issue.
TARGET_THROUGHPUT = 700_000.0  # fivm tuples/s on housing-5000
TARGET_VS_FIRST_ORDER = 10.0
TARGET_VS_RECOMPUTE = 100.0
TARGET_SCALING_RATIO = 1.5  # "does not grow": 10x database costs < 1.5x time per batch

# Retailer sizes: (locations, dates, items, inventory_rows); 10x scales every relation.
RETAILER_SIZE = (100, 60, 500, 100_000)
RETAILER_SIZE_QUICK = (50, 30, 200, 20_000)


# ============================================================================ workloads
@dataclass
class Case:
    """One stream to replay: a workload, or one scale of the scaling workload."""

    workload: str
    label: str  # "" or "1x" / "10x"
    description: str
    schema: dict[str, list[str]]
    updatable: list[str] | None
    static: dict[str, pd.DataFrame]
    stream: list  # StreamBatch
    strategies: tuple[str, ...] = STRATEGIES
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.workload} ({self.label})" if self.label else self.workload

    @property
    def tuples(self) -> int:
        return int(sum(len(b) for b in self.stream))

    def warmup(self, rounds: int) -> int:
        """Batches in the first ``rounds`` round-robin rounds (one per streamed relation)."""
        return min(len(self.stream), rounds * len({b.relation for b in self.stream}))


def _housing(postcodes: int, args) -> list[Case]:
    from ringml.datasets import build_stream, housing_star

    data = housing_star(postcodes=postcodes, seed=args.seed)
    stream = build_stream(
        data.relations, batch_size=args.batch_size, delete_fraction=args.deletes, seed=args.seed
    )
    return [
        Case(
            workload=f"housing-{postcodes}",
            label="",
            description=(
                f"housing_star(postcodes={postcodes}); covariance over the 26 non-join "
                "variables (continuous ring); all 6 relations updatable and streamed round-robin"
            ),
            schema=data.schemas,
            updatable=None,
            static={},
            stream=stream,
            sizes=data.sizes(),
        )
    ]


def _retailer_data(size: tuple[int, int, int, int], scale: int, seed: int):
    from ringml.datasets import retailer_snowflake

    locations, dates, items, rows = size
    return retailer_snowflake(
        locations=locations * scale,
        dates=dates,
        items=items * scale,
        inventory_rows=rows * scale,
        seed=seed,
    )


def _size_text(size: tuple[int, int, int, int], scale: int = 1) -> str:
    locations, dates, items, rows = size
    return (
        f"retailer_snowflake(locations={locations * scale}, dates={dates}, "
        f"items={items * scale}, inventory_rows={rows * scale:,})"
    )


def _retailer_all(args) -> list[Case]:
    from ringml.datasets import build_stream

    size = RETAILER_SIZE_QUICK if args.quick else RETAILER_SIZE
    data = _retailer_data(size, 1, args.seed)
    stream = build_stream(
        data.relations, batch_size=args.batch_size, delete_fraction=args.deletes, seed=args.seed
    )
    return [
        Case(
            workload="retailer-all",
            label="",
            description=(
                f"{_size_text(size)}; covariance over the 39 non-join variables (continuous "
                "ring); all 5 relations updatable and streamed round-robin"
            ),
            schema=data.schemas,
            updatable=None,
            static={},
            stream=stream,
            sizes=data.sizes(),
        )
    ]


def _retailer_inventory_case(args, size, scale: int, workload: str, label: str, strategies):
    from ringml.datasets import build_stream

    data = _retailer_data(size, scale, args.seed)
    static = {r: f for r, f in data.relations.items() if r != "Inventory"}
    stream = build_stream(
        {"Inventory": data.relations["Inventory"]},
        batch_size=args.batch_size,
        delete_fraction=args.deletes,
        seed=args.seed,
    )
    return Case(
        workload=workload,
        label=label,
        description=(
            f"{_size_text(size, scale)}; covariance over the 39 non-join variables; only "
            "Inventory updatable: Location, Census, Item, Weather are loaded first "
            "(Maintainer.load), then the stream holds Inventory batches only"
        ),
        schema=data.schemas,
        updatable=["Inventory"],
        static=static,
        stream=stream,
        strategies=strategies,
        sizes=data.sizes(),
    )


def _retailer_inventory(args) -> list[Case]:
    size = RETAILER_SIZE_QUICK if args.quick else RETAILER_SIZE
    return [_retailer_inventory_case(args, size, 1, "retailer-inventory", "", STRATEGIES)]


def _retailer_scaling(args) -> list[Case]:
    size = RETAILER_SIZE_QUICK if args.quick else RETAILER_SIZE
    return [
        _retailer_inventory_case(args, size, scale, "retailer-inventory-scaling", label, ("fivm",))
        for scale, label in ((1, "1x"), (10, "10x"))
    ]


def build_cases(name: str, args) -> list[Case]:
    if name == "housing-1000":
        return _housing(1000, args)
    if name == "housing-5000":
        return _housing(5000, args)
    if name == "retailer-all":
        return _retailer_all(args)
    if name == "retailer-inventory":
        return _retailer_inventory(args)
    if name == "retailer-inventory-scaling":
        return _retailer_scaling(args)
    raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS}")


# ============================================================================ engine snapshot
#: Repository folder -> place in the snapshot (pyproject's package-dir mapping).
ENGINE_DIRS = {
    "ringml": "ringml",
    "rings": "ringml/rings",
    "models": "ringml/models",
    "pipelines": "ringml/pipelines",
}


def snapshot_engine(dest: Path) -> str:
    """Copy the engine sources to ``dest`` (first on every process's path); their hash.

    Other people edit ``ringml/`` while benchmarks run: every subprocess of one run imports
    this frozen copy, so all strategies and workloads of a run measure the same code.
    """
    for src, rel in ENGINE_DIRS.items():
        if (REPO / src).is_dir():
            shutil.copytree(
                REPO / src,
                dest / rel,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                dirs_exist_ok=True,
            )
    digest = hashlib.sha256()
    for f in sorted((dest / "ringml").rglob("*.py")):
        digest.update(str(f.relative_to(dest)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:12]


def _engine_env() -> dict[str, str]:
    env = dict(os.environ, MPLBACKEND="Agg")
    snapshot = os.environ.get("RINGML_BENCH_SNAPSHOT")
    if snapshot:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [snapshot, env.get("PYTHONPATH")]))
    return env


# ============================================================================ the worker
def _proc_status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def worker(spec_path: str, strategy: str, budget: float, max_batches: int, result: str) -> None:
    """Replay one pickled case with one strategy; write ``result``.json and ``result``.npz."""
    import resource

    import ringml
    from ringml.applications import covariance_query
    from ringml.batch import UpdateBatch
    from ringml.maintainer import Maintainer

    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    stream = spec["stream"]
    if max_batches > 0:
        stream = stream[:max_batches]
    batches = [UpdateBatch(b.relation, b.rows, b.multiplicity) for b in stream]
    sizes = [len(b.rows) for b in stream]
    profile_path = spec.get("profile")
    warmup = int(spec.get("warmup", 0))
    del spec["stream"]

    if warmup > 0:  # a throwaway Maintainer replays the first batches (see the module doc)
        scratch = Maintainer(
            covariance_query(spec["schema"]), updatable=spec["updatable"], strategy=strategy
        )
        for relation, frame in spec["static"].items():
            scratch.load(relation, frame)
        for b in stream[:warmup]:
            scratch.apply(UpdateBatch(b.relation, b.rows, b.multiplicity))
        del scratch
    gc.collect()
    rss_reset = _reset_peak_rss()
    rss_before = _proc_status_kib("VmRSS")
    query = covariance_query(spec["schema"])
    maintainer = Maintainer(query, updatable=spec["updatable"], strategy=strategy)
    start = time.perf_counter()
    for relation, frame in spec["static"].items():
        maintainer.load(relation, frame)
    load_seconds = time.perf_counter() - start

    profiler = None
    if profile_path:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    seconds: list[float] = []
    elapsed = 0.0
    for batch in batches:
        t0 = time.perf_counter()
        maintainer.apply(batch)
        dt = time.perf_counter() - t0
        seconds.append(dt)
        elapsed += dt
        if budget > 0 and elapsed > budget:
            break
    if profiler is not None:
        profiler.disable()
        import io
        import pstats

        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(25)
        listing = text.getvalue()
        snapshot = os.environ.get("RINGML_BENCH_SNAPSHOT")
        if snapshot:  # paths relative to the engine snapshot read like repository paths
            listing = listing.replace(str(Path(snapshot)) + os.sep, "")
        Path(profile_path).write_text(listing)

    peak = _proc_status_kib("VmHWM") if rss_reset else None
    if peak is None:  # ru_maxrss is the lifetime peak (KiB on Linux)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    count, sums, products = query.ring.moments(maintainer.result())
    stored = int(maintainer.stored_entries())
    base_entries = None
    if strategy == "first_order" and stored == 0:  # older engines did not count its stores
        base_entries = int(sum(len(s) for s in getattr(maintainer, "_base", {}).values()))
    np.savez(result + ".npz", count=np.int64(count), sums=sums, products=products)
    out = {
        "strategy": strategy,
        "batches_total": len(batches),
        "batches_done": len(seconds),
        "tuples": sizes[: len(seconds)],
        "seconds": seconds,
        "stopped": len(seconds) < len(batches),
        "load_seconds": load_seconds,
        "rss_before_kib": rss_before,
        "rss_peak_kib": peak,
        "rss_method": "VmHWM after clear_refs" if rss_reset else "ru_maxrss (lifetime)",
        "stored_entries": stored,
        "first_order_base_entries": base_entries,
        "ringml_path": str(Path(ringml.__file__).resolve().parent),
    }
    Path(result + ".json").write_text(json.dumps(out))


# ============================================================================ orchestration
@dataclass
class Run:
    strategy: str
    tuples: np.ndarray  # per batch
    seconds: np.ndarray  # per batch
    batches_total: int
    stopped: bool
    load_seconds: float
    rss_before_kib: int | None
    rss_peak_kib: int | None
    rss_method: str
    stored_entries: int
    first_order_base_entries: int | None
    moments: tuple
    error: str | None = None
    repeats: int = 1
    all_throughputs: list[float] = field(default_factory=list)

    @property
    def done(self) -> int:
        return len(self.seconds)

    @property
    def total_tuples(self) -> int:
        return int(self.tuples.sum())

    @property
    def total_seconds(self) -> float:
        return float(self.seconds.sum())

    @property
    def throughput(self) -> float:
        s = self.total_seconds
        return self.total_tuples / s if s > 0 else float("nan")

    def prefix_throughput(self, batches: int) -> float:
        s = float(self.seconds[:batches].sum())
        return float(self.tuples[:batches].sum()) / s if s > 0 else float("nan")

    def latency_ms(self, q: float) -> float:
        return float(np.percentile(self.seconds, q) * 1e3) if self.done else float("nan")


def run_worker(spec: Path, strategy: str, budget: float, max_batches: int, timeout: float) -> Run:
    with tempfile.NamedTemporaryFile(dir=spec.parent, prefix=strategy, delete=False) as f:
        result = f.name
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        str(spec),
        strategy,
        repr(budget),
        str(max_batches),
        result,
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=_engine_env()
        )
    except subprocess.TimeoutExpired:
        return _failed(strategy, f"killed after the hard timeout of {timeout:.0f} s")
    if proc.returncode != 0:
        return _failed(strategy, (proc.stderr or proc.stdout).strip().splitlines()[-1:] or "?")
    data = json.loads(Path(result + ".json").read_text())
    snapshot = os.environ.get("RINGML_BENCH_SNAPSHOT")
    if snapshot and not data["ringml_path"].startswith(str(Path(snapshot).resolve())):
        return _failed(strategy, f"imported ringml from {data['ringml_path']}, not the snapshot")
    with np.load(result + ".npz") as z:
        moments = (int(z["count"]), z["sums"].copy(), z["products"].copy())
    return Run(
        strategy=strategy,
        tuples=np.asarray(data["tuples"], dtype=np.int64),
        seconds=np.asarray(data["seconds"], dtype=np.float64),
        batches_total=data["batches_total"],
        stopped=data["stopped"],
        load_seconds=data["load_seconds"],
        rss_before_kib=data["rss_before_kib"],
        rss_peak_kib=data["rss_peak_kib"],
        rss_method=data["rss_method"],
        stored_entries=data["stored_entries"],
        first_order_base_entries=data["first_order_base_entries"],
        moments=moments,
    )


def _failed(strategy: str, message) -> Run:
    if isinstance(message, list):
        message = message[0] if message else "?"
    empty = np.zeros(0)
    return Run(
        strategy=strategy,
        tuples=empty.astype(np.int64),
        seconds=empty,
        batches_total=0,
        stopped=True,
        load_seconds=0.0,
        rss_before_kib=None,
        rss_peak_kib=None,
        rss_method="",
        stored_entries=0,
        first_order_base_entries=None,
        moments=(0, empty, empty),
        error=str(message),
    )


def run_strategy(spec: Path, strategy: str, args, log) -> Run:
    """Up to ``args.repeats`` runs while their summed time stays in the budget; the median."""
    runs: list[Run] = []
    spent = 0.0
    timeout = 3 * args.budget_seconds + 600
    while len(runs) < args.repeats:
        run = run_worker(spec, strategy, args.budget_seconds, 0, timeout)
        runs.append(run)
        if run.error:
            log(f"    {strategy}: ERROR {run.error}")
            return run
        spent += run.total_seconds + run.load_seconds
        log(
            f"    {strategy:<12} run {len(runs)}: {run.total_tuples:>9,} tuples in "
            f"{run.total_seconds:8.3f} s = {run.throughput:>12,.0f} tuples/s"
            + (f"  (stopped at {run.done}/{run.batches_total} batches)" if run.stopped else "")
        )
        if run.stopped or spent + run.total_seconds > args.budget_seconds:
            break
    ordered = sorted(runs, key=lambda r: r.total_seconds)
    chosen = ordered[len(ordered) // 2]
    chosen.repeats = len(runs)
    chosen.all_throughputs = [r.throughput for r in runs]
    return chosen


def compare_moments(a: tuple, b: tuple, seen: list[float] | None = None) -> tuple[bool, float]:
    """(equal within RTOL, max relative difference) of two (count, sums, products).

    ``seen``: the largest ``|Σx|`` and ``|Σxxᵀ|`` of ``b`` at the earlier checks of the same
    stream (updated here).  Entries that cancel to ~0 are compared to that scale: when deletes
    empty the join, a program summing without compensation is left with rounding residue of
    the values that cancelled (1e-15..1e-9 here) where the exact result, and the engine's, is 0.
    """
    if a[0] != b[0]:
        return False, float("inf")
    ok = True
    worst = 0.0
    for i, (x, y) in enumerate(((a[1], b[1]), (a[2], b[2]))):
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        if x.shape != y.shape:
            return False, float("inf")
        if x.size == 0:
            continue
        scale = float(np.abs(y).max())
        if seen is not None:
            scale = seen[i] = max(seen[i], scale)
        atol = 1e-12 * scale  # entries that cancel to ~0 are compared to the scale
        ok &= bool(np.allclose(x, y, rtol=RTOL, atol=atol))
        denom = np.maximum(np.abs(y), atol if atol > 0 else 1.0)
        worst = max(worst, float(np.max(np.abs(x - y) / denom)))
    return ok, worst


def oracle_moments(case: Case, variables: Sequence[str]) -> tuple | None:
    """numpy (count, Σx, Σxxᵀ) over the materialized join of the final database."""
    from ringml.datasets import final_state, natural_join

    final = dict(case.static)
    final.update(final_state(case.stream))
    relations = {r: final[r] for r in case.schema if r in final}
    if len(relations) < len(case.schema):
        return None
    join = natural_join(relations)
    x = join[list(variables)].to_numpy(dtype=np.float64)
    return len(join), x.sum(axis=0), x.T @ x


@dataclass
class CaseResult:
    case: Case
    runs: dict[str, Run]
    checks: list[tuple[str, bool, float]]  # (description, ok, max rel diff)


def run_case(case: Case, args, tmp: Path, log) -> CaseResult:
    spec = tmp / f"{case.name.replace(' ', '_').replace('(', '').replace(')', '')}.pkl"
    payload = {
        "schema": case.schema,
        "updatable": case.updatable,
        "static": case.static,
        "stream": case.stream,
        "profile": None,
        "warmup": case.warmup(args.warmup_rounds),
    }
    with open(spec, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    log(
        f"  {case.name}: {len(case.stream)} batches, {case.tuples:,} tuples; "
        f"sizes {case.sizes}; load avg {os.getloadavg()[0]:.2f}"
    )
    strategies = [s for s in case.strategies if s in args.strategies]
    if strategies and strategies[0] != "fivm" and "fivm" in case.strategies:
        strategies.insert(0, "fivm")  # the reference for the checks and speed-ups
    runs = {s: run_strategy(spec, s, args, log) for s in strategies}
    checks: list[tuple[str, bool, float]] = []
    fivm = runs.get("fivm")
    if fivm is not None and not fivm.error:
        for s, run in runs.items():
            if s == "fivm" or run.error or run.done == 0:
                continue
            if run.done == fivm.done:
                reference = fivm.moments
            else:  # fivm's payload after the same prefix, from an untimed replay
                reference = run_worker(spec, "fivm", 0.0, run.done, 3600).moments
            ok, diff = compare_moments(run.moments, reference)
            prefix = f"first {run.done}/{run.batches_total} batches"
            checks.append((f"{s} == fivm ({prefix})", ok, diff))
        if args.oracle and not fivm.stopped:
            from ringml.applications import covariance_query

            variables = covariance_query(case.schema).ring.variables
            expected = oracle_moments(case, variables)
            if expected is not None:
                ok, diff = compare_moments(fivm.moments, expected)
                checks.append((f"fivm == numpy on the final join ({expected[0]:,} rows)", ok, diff))
    for text, ok, diff in checks:
        log(f"    check {text}: {'ok' if ok else 'MISMATCH'} (max rel diff {diff:.1e})")
    return CaseResult(case, runs, checks)


# ============================================================================ reporting
def _fmt_int(x) -> str:
    return f"{x:,.0f}" if x == x else "-"


def _fmt_ms(x: float) -> str:
    return "-" if x != x else (f"{x:.2f}" if x < 100 else f"{x:,.0f}")


def _mib(kib) -> str:
    return "-" if kib is None else f"{kib / 1024:,.0f}"


def table_rows(results: Sequence[CaseResult], budget: float) -> list[dict]:
    rows = []
    for res in results:
        fivm = res.runs.get("fivm")
        for s, run in res.runs.items():
            row = {
                "workload": res.case.name,
                "strategy": s,
                "stream_tuples": res.case.tuples,
                "tuples": run.total_tuples,
                "stream_pct": 100.0 * run.total_tuples / res.case.tuples if res.case.tuples else 0,
                "seconds": run.total_seconds,
                "throughput": run.throughput,
                "p50_ms": run.latency_ms(50),
                "p95_ms": run.latency_ms(95),
                "p99_ms": run.latency_ms(99),
                "mean_batch_ms": 1e3 * run.total_seconds / run.done if run.done else float("nan"),
                "load_seconds": run.load_seconds,
                "peak_rss_mib": None if run.rss_peak_kib is None else run.rss_peak_kib / 1024,
                "rss_growth_mib": None
                if run.rss_peak_kib is None or run.rss_before_kib is None
                else (run.rss_peak_kib - run.rss_before_kib) / 1024,
                "stored_entries": run.stored_entries,
                "first_order_base_entries": run.first_order_base_entries,
                "runs": run.repeats,
                "stopped": run.stopped,
                "fivm_prefix_throughput": None,
                "fivm_speedup": None,
                "note": "",
            }
            notes = []
            if run.error:
                notes.append(f"error: {run.error}")
            elif run.stopped:
                notes.append(
                    f"stopped after {row['stream_pct']:.0f}% of the stream "
                    f"({run.done}/{run.batches_total} batches, budget {budget:g} s)"
                )
            if s != "fivm" and fivm is not None and not fivm.error and run.done and not run.error:
                k = min(run.done, fivm.done)
                fp = fivm.prefix_throughput(k)
                row["fivm_prefix_throughput"] = fp
                row["fivm_speedup"] = fp / run.throughput
                if run.stopped:
                    notes.append(f"fivm on this prefix: {fp:,.0f} tuples/s")
            if len(run.all_throughputs) > 1:
                notes.append(
                    "runs: " + " / ".join(f"{t:,.0f}" for t in run.all_throughputs) + " tuples/s"
                )
            if run.first_order_base_entries is not None:
                notes.append(
                    f"stored_entries() reports 0; its base stores hold "
                    f"{run.first_order_base_entries:,} keys"
                )
            if run.load_seconds > 0.001:
                notes.append(f"static load {run.load_seconds:.2f} s (not in the time)")
            row["note"] = "; ".join(notes)
            rows.append(row)
    return rows


COLUMNS = [
    ("workload", "workload"),
    ("strategy", "strategy"),
    ("tuples", "tuples"),
    ("stream", "stream %"),
    ("seconds", "seconds"),
    ("throughput", "tuples/s"),
    ("p50", "p50 ms"),
    ("p95", "p95 ms"),
    ("p99", "p99 ms"),
    ("peak", "peak RSS MiB"),
    ("growth", "Δ RSS MiB"),
    ("stored", "stored entries"),
    ("speedup", "fivm speed-up"),
    ("note", "note"),
]


def display_cells(row: dict) -> dict[str, str]:
    stored = f"{row['stored_entries']:,}"
    if row["first_order_base_entries"] is not None:
        stored = f"{row['first_order_base_entries']:,}*"
    return {
        "workload": row["workload"],
        "strategy": row["strategy"] + (f" ×{row['runs']}" if row["runs"] > 1 else ""),
        "tuples": f"{row['tuples']:,}",
        "stream": f"{row['stream_pct']:.0f}%",
        "seconds": f"{row['seconds']:.3f}",
        "throughput": _fmt_int(row["throughput"]),
        "p50": _fmt_ms(row["p50_ms"]),
        "p95": _fmt_ms(row["p95_ms"]),
        "p99": _fmt_ms(row["p99_ms"]),
        "peak": "-" if row["peak_rss_mib"] is None else f"{row['peak_rss_mib']:,.0f}",
        "growth": "-" if row["rss_growth_mib"] is None else f"{row['rss_growth_mib']:,.1f}",
        "stored": stored,
        "speedup": "" if row["fivm_speedup"] is None else f"{row['fivm_speedup']:,.1f}x",
        "note": row["note"],
    }


def targets(results: Sequence[CaseResult]) -> list[tuple[str, str, bool]]:
    """(target, measured, passed) for the issue's targets among the workloads run."""
    out = []
    by_name = {r.case.name: r for r in results}
    housing = by_name.get("housing-5000")
    if housing is not None and "fivm" in housing.runs and not housing.runs["fivm"].error:
        fivm = housing.runs["fivm"]
        complete = "" if not fivm.stopped else " (on a prefix)"
        out.append(
            (
                f"housing-5000: fivm ≥ {TARGET_THROUGHPUT:,.0f} tuples/s",
                f"{fivm.throughput:,.0f} tuples/s{complete}",
                fivm.throughput >= TARGET_THROUGHPUT,
            )
        )
        for s, need in (("first_order", TARGET_VS_FIRST_ORDER), ("recompute", TARGET_VS_RECOMPUTE)):
            run = housing.runs.get(s)
            if run is None or run.error or not run.done:
                continue
            k = min(run.done, fivm.done)
            speedup = fivm.prefix_throughput(k) / run.throughput
            prefix = "" if not run.stopped else f" (on the {run.done}-batch prefix {s} processed)"
            out.append(
                (
                    f"housing-5000: fivm ≥ {need:g}x faster than {s}",
                    f"{speedup:,.1f}x{prefix}",
                    speedup >= need,
                )
            )
    one = by_name.get("retailer-inventory-scaling (1x)")
    ten = by_name.get("retailer-inventory-scaling (10x)")
    if one and ten and "fivm" in one.runs and "fivm" in ten.runs:
        a, b = one.runs["fivm"], ten.runs["fivm"]
        if not (a.error or b.error) and a.done and b.done:
            ma, mb = a.total_seconds / a.done, b.total_seconds / b.done
            out.append(
                (
                    "retailer-inventory: fivm time per Inventory batch does not grow with a 10x "
                    f"database (10x/1x ≤ {TARGET_SCALING_RATIO:g})",
                    f"mean {1e3 * ma:.2f} ms (1x) vs {1e3 * mb:.2f} ms (10x) = {mb / ma:.2f}x; "
                    f"p50 {a.latency_ms(50):.2f} vs {b.latency_ms(50):.2f} ms",
                    mb / ma <= TARGET_SCALING_RATIO,
                )
            )
    return out


def curve_points(run: Run, stream_tuples: int) -> list[dict]:
    """Cumulative and windowed throughput at every 10% of the stream (within the prefix)."""
    if not run.done:
        return []
    cum_t = np.cumsum(run.tuples)
    cum_s = np.cumsum(run.seconds)
    points = []
    previous = -1
    for pct in range(10, 101, 10):
        i = int(np.searchsorted(cum_t, pct / 100 * stream_tuples - 1e-9))
        if i >= run.done:
            break
        lo_t = cum_t[previous] if previous >= 0 else 0
        lo_s = cum_s[previous] if previous >= 0 else 0.0
        window = (cum_t[i] - lo_t) / (cum_s[i] - lo_s) if cum_s[i] > lo_s else float("nan")
        points.append(
            {
                "fraction_pct": pct,
                "batches": i + 1,
                "cumulative_tuples": int(cum_t[i]),
                "cumulative_seconds": float(cum_s[i]),
                "cumulative_throughput": float(cum_t[i] / cum_s[i]),
                "window_throughput": float(window),
            }
        )
        previous = i
    return points


def plot(results: Sequence[CaseResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[CaseResult]] = {}
    for res in results:
        groups.setdefault(res.case.workload, []).append(res)
    n = len(groups)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    colors = {"fivm": "tab:blue", "first_order": "tab:orange", "recompute": "tab:red"}
    for ax, (workload, members) in zip(axes.flat, groups.items(), strict=False):
        for res in members:
            for s, run in res.runs.items():
                if not run.done:
                    continue
                cum_t = np.cumsum(run.tuples)
                x = 100.0 * cum_t / res.case.tuples
                y = cum_t / np.cumsum(run.seconds)
                label = s + (f" {res.case.label}" if res.case.label else "")
                style = "--" if res.case.label == "10x" else "-"
                ax.plot(x, y, style, color=colors.get(s), label=label, lw=1.6)
                if run.stopped:
                    ax.plot(x[-1], y[-1], "x", color=colors.get(s), ms=8)
                    ax.annotate(
                        f"stopped {x[-1]:.0f}%",
                        (x[-1], y[-1]),
                        textcoords="offset points",
                        xytext=(4, 4),
                        fontsize=7,
                    )
        if any(res.case.label for res in members):  # one strategy at two scales: linear
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")
        ax.set_xlim(0, 100)
        ax.set_title(workload, fontsize=10)
        ax.set_xlabel("% of the stream processed")
        ax.set_ylabel("cumulative throughput (tuples/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _git(*cmd: str) -> str:
    try:
        return subprocess.run(
            ["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _load_text(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def environment(args, load_before) -> dict[str, str]:
    import numpy

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python benchmarks/engine.py", *map(shlex.quote, args.argv)]),
        "engine": f"commit {args.commit}"
        + (" + uncommitted changes in ringml/ or rings/" if args.dirty else "")
        + f"; every process imported one snapshot of the sources (sha256 {args.engine_hash})",
        "python": platform.python_version(),
        "numpy / pandas": f"{numpy.__version__} / {pd.__version__}",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "load average (1/5/15 min) at start": _load_text(load_before),
        "batch size": str(args.batch_size),
        "deletes": f"{args.deletes:.0%} of the stream",
        "budget per strategy": f"{args.budget_seconds:g} s of apply time",
        "repeats": f"up to {args.repeats} (within the budget); median run shown",
        "warm-up": f"{args.warmup_rounds} round(s) of the stream in a throwaway Maintainer",
    }


def markdown(results, rows, goals, env, load_after, failures) -> str:
    lines = ["# Engine benchmark: fivm vs first_order vs recompute", ""]
    for k, v in env.items():
        lines.append(f"- {k}: {v}")
    lines.append("- load average (1/5/15 min) at end: " + _load_text(load_after))
    lines += ["", "## Results", ""]
    header = [h for _, h in COLUMNS]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        cells = display_cells(row)
        lines.append("| " + " | ".join(cells[k].replace("|", "/") for k, _ in COLUMNS) + " |")
    lines += [
        "",
        "tuples/s = tuples / summed `apply` time of the prefix processed; p50/p95/p99 = per-batch "
        "latency; peak RSS = the strategy's subprocess (interpreter, libraries and input stream "
        "included); Δ RSS = peak minus the RSS before the Maintainer was built; fivm speed-up = "
        "fivm's throughput on the same prefix / the strategy's; ×N = median of N runs; "
        "* = first_order's base-store keys where its `stored_entries()` reports 0 (older engines).",
        "",
        "## Targets",
        "",
        "| target | measured | result |",
        "|---|---|---|",
    ]
    for text, measured, ok in goals:
        lines.append(f"| {text} | {measured} | {'PASS' if ok else 'FAIL'} |")
    lines += ["", "## Correctness", ""]
    for res in results:
        for text, ok, diff in res.checks:
            lines.append(
                f"- {res.case.name}: {text}: {'ok' if ok else '**MISMATCH**'} "
                f"(max relative difference {diff:.1e})"
            )
    if failures:
        lines.append(f"\n**{len(failures)} correctness check(s) FAILED.**")
    lines += ["", "## Workloads", ""]
    for res in results:
        lines.append(
            f"- **{res.case.name}**: {res.case.description}; {len(res.case.stream)} batches, "
            f"{res.case.tuples:,} tuples; relation sizes {res.case.sizes}"
        )
    return "\n".join(lines) + "\n"


def print_table(rows, goals, log) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        header = [h for k, h in COLUMNS if k != "note"]
        log(" | ".join(header))
        for row in rows:
            cells = display_cells(row)
            log(" | ".join(cells[k] for k, _ in COLUMNS if k != "note") + "  " + cells["note"])
        for text, measured, ok in goals:
            log(f"{'PASS' if ok else 'FAIL'}  {text}: {measured}")
        return
    console = Console(width=250)
    table = Table(title="engine benchmark", show_lines=False)
    for key, head in COLUMNS:
        left = key in ("workload", "strategy", "note")
        table.add_column(
            head,
            justify="left" if left else "right",
            overflow="fold",
            max_width=60 if key == "note" else None,
        )
    for row in rows:
        cells = display_cells(row)
        table.add_row(*(cells[k] for k, _ in COLUMNS))
    console.print(table)
    goal_table = Table(title="targets")
    for head in ("target", "measured", "result"):
        goal_table.add_column(head, overflow="fold")
    for text, measured, ok in goals:
        goal_table.add_row(text, measured, "[green]PASS[/]" if ok else "[red]FAIL[/]")
    if goals:
        console.print(goal_table)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        spec, strategy, budget, max_batches, result = argv[1:6]
        worker(spec, strategy, float(budget), int(max_batches), result)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from star_shuffled import ALIAS as SHUFFLED_ALIAS
    from star_shuffled import DEFAULT_DELETES as SHUFFLED_DELETES
    from star_shuffled import WORKLOADS as SHUFFLED_WORKLOADS

    parser.add_argument(
        "--workload",
        nargs="+",
        choices=WORKLOADS + SHUFFLED_WORKLOADS + (SHUFFLED_ALIAS,),
        default=list(WORKLOADS),
        help="default: the five subprocess workloads; star-shuffled-P (or star-shuffled for "
        "P = 1000, 5000, 50000) run in-process against hand-written baselines (issue 11)",
    )
    parser.add_argument(
        "--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES), metavar="S"
    )
    parser.add_argument("--quick", action="store_true", help="small Retailer data, 5 s budget")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--budget-seconds", type=float, default=None, help="default 60 (5 quick)")
    parser.add_argument(
        "--deletes",
        type=float,
        nargs="+",
        default=None,
        help="fraction of deletes, <= 0.5 (default 0); star-shuffled workloads run every "
        "value given (default: 0 and 0.3)",
    )
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="default 3 (1 quick); star-shuffled: 5 for fivm vs numpy, 3 for the other pairs "
        "(2 / 1 quick)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=1,
        help="round-robin rounds replayed in a throwaway Maintainer before the timed run "
        "(default 1; 0 = cold process)",
    )
    parser.add_argument("--no-oracle", dest="oracle", action="store_false")
    shuffled = parser.add_argument_group("star-shuffled workloads (benchmarks/star_shuffled.py)")
    shuffled.add_argument(
        "--sections",
        nargs="+",
        choices=("fivm", "first_order", "categorical", "batch1", "memory"),
        default=["fivm", "first_order", "categorical", "batch1", "memory"],
        help="which comparisons to run (default all)",
    )
    shuffled.add_argument(
        "--slow-budget-seconds",
        type=float,
        default=None,
        help="per repeat, summed time of both programs for first_order/pandas and the "
        "categorical pair (default 6; 3 quick); --budget-seconds bounds fivm/numpy",
    )
    shuffled.add_argument(
        "--check-every",
        type=int,
        default=20,
        help="compare fivm with the numpy baseline every K batches of the first repeat",
    )
    shuffled.add_argument(
        "--batch1-tuples",
        type=int,
        default=None,
        help="prefix replayed at batch size 1 (default 20000; 5000 quick; 0 = skip)",
    )
    shuffled.add_argument(
        "--profile-workloads",
        nargs="+",
        default=None,
        metavar="W",
        help="with --profile: only these star-shuffled workloads (default all run)",
    )
    shuffled.add_argument(
        "--all-variants",
        action="store_true",
        help="batch size 1 for every --deletes value (default: the first only)",
    )
    shuffled.add_argument(
        "--allow-absent-deletes",
        action="store_true",
        help="engine maintainers without the absent-delete check (plain ring semantics)",
    )
    parser.add_argument("--tag", default=None, help="result file stem (default: engine[-...])")
    parser.add_argument(
        "--profile",
        nargs="*",
        choices=STRATEGIES,
        default=None,
        metavar="STRATEGY",
        help="also cProfile these strategies (default fivm) on each workload, in separate runs",
    )
    args = parser.parse_args(argv)
    args.argv = argv
    shuffled_names = [w for w in args.workload if w in SHUFFLED_WORKLOADS + (SHUFFLED_ALIAS,)]
    args.workload = [w for w in args.workload if w in WORKLOADS]
    given_deletes = args.deletes
    if args.workload and given_deletes is not None and len(given_deletes) > 1:
        parser.error("the subprocess workloads take one --deletes value")
    args.deletes = given_deletes[0] if given_deletes else 0.0
    args.shuffled_deletes = list(given_deletes) if given_deletes else list(SHUFFLED_DELETES)
    if args.budget_seconds is None:
        args.budget_seconds = 5.0 if args.quick else 60.0
    if args.slow_budget_seconds is None:
        args.slow_budget_seconds = 3.0 if args.quick else 6.0
    if args.batch1_tuples is None:
        args.batch1_tuples = 5000 if args.quick else 20000
    # star-shuffled: the cheap fivm/numpy pair gets more repeats than the slow pairs
    args.shuffled_repeats = args.repeats or (2 if args.quick else 5)
    args.slow_repeats = args.repeats or (1 if args.quick else 3)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    tag = args.tag or "engine" + ("-quick" if args.quick else "") + (
        f"-deletes{round(100 * args.deletes)}" if args.deletes else ""
    )
    args.out.mkdir(parents=True, exist_ok=True)

    def log(text: str) -> None:
        print(text, flush=True)

    load_before = os.getloadavg()
    log(f"load average at start: {_load_text(load_before)}")
    args.commit = _git("rev-parse", "--short", "HEAD") or "?"
    args.dirty = bool(_git("status", "--porcelain", "--", *ENGINE_DIRS))
    results: list[CaseResult] = []
    status = 0
    with tempfile.TemporaryDirectory(prefix="ringml-bench-") as tmpdir:
        tmp = Path(tmpdir)
        args.engine_hash = snapshot_engine(tmp / "engine")
        os.environ["RINGML_BENCH_SNAPSHOT"] = str(tmp / "engine")
        sys.path.insert(0, str(tmp / "engine"))  # before the first ringml import
        import ringml

        log(
            f"engine: commit {args.commit}{' + uncommitted changes' if args.dirty else ''}, "
            f"snapshot {args.engine_hash} ({Path(ringml.__file__).parent})"
        )
        if shuffled_names:
            status = run_shuffled(args, shuffled_names, given_deletes, log)
        if not args.workload:
            return status
        for name in args.workload:
            start = time.perf_counter()
            cases = build_cases(name, args)
            log(f"{name}: stream built in {time.perf_counter() - start:.1f} s")
            for case in cases:
                results.append(run_case(case, args, tmp, log))
                for strategy in (args.profile or ["fivm"]) if args.profile is not None else []:
                    if strategy in case.strategies:
                        path = args.out / f"profile-{strategy}-{case.name.replace(' ', '')}.txt"
                        profile_case(case, strategy, args, tmp, path, log)
    load_after = os.getloadavg()

    rows = table_rows(results, args.budget_seconds)
    goals = targets(results)
    if args.deletes or args.batch_size != 1000 or args.quick:
        caveat = " [the issue states its targets for the default insert-only run]"
        goals = [(text + caveat, measured, ok) for text, measured, ok in goals]
    failures = [(r.case.name, t) for r in results for t, ok, _ in r.checks if not ok]
    failures += [
        (r.case.name, f"{s} failed: {run.error}")
        for r in results
        for s, run in r.runs.items()
        if run.error
    ]
    env = environment(args, load_before)
    print_table(rows, goals, log)
    md = markdown(results, rows, goals, env, load_after, failures)
    (args.out / f"{tag}.md").write_text(md)
    with open(args.out / f"{tag}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["workload"])
        writer.writeheader()
        writer.writerows(rows)
    with open(args.out / f"{tag}-curves.csv", "w", newline="") as f:
        writer = None
        for res in results:
            for s, run in res.runs.items():
                for point in curve_points(run, res.case.tuples):
                    point = {"workload": res.case.name, "strategy": s, **point}
                    if writer is None:
                        writer = csv.DictWriter(f, fieldnames=list(point))
                        writer.writeheader()
                    writer.writerow(point)
    png = args.out / f"{tag}-throughput.png"
    plot(results, png, f"throughput vs fraction of the stream ({env['date']}, {env['machine']})")
    log(f"load average at end: {_load_text(load_after)}")
    log(f"wrote {args.out / (tag + '.md')}, {tag}.csv, {tag}-curves.csv, {png.name}")
    if failures:
        log("\n" + "!" * 72)
        for name, text in failures:
            log(f"CORRECTNESS/RUN FAILURE in {name}: {text}")
        log("!" * 72)
        return 1
    return status


def run_shuffled(args, names: list[str], given_deletes, log) -> int:
    """The star-shuffled workloads (in this process; see benchmarks/star_shuffled.py)."""
    import star_shuffled

    shuffled_args = argparse.Namespace(**vars(args))
    shuffled_args.workload = names
    tag = args.tag if args.tag and not args.workload else None
    tag = tag or "engine-shuffled" + ("-quick" if args.quick else "")

    def env_fn(load_before) -> dict[str, str]:
        import numpy

        return {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["python benchmarks/engine.py", *map(shlex.quote, args.argv)]),
            "engine": f"commit {args.commit}"
            + (" + uncommitted changes in ringml/ or rings/" if args.dirty else "")
            + f"; imported from one snapshot of the sources (sha256 {args.engine_hash})",
            "python": platform.python_version(),
            "numpy / pandas": f"{numpy.__version__} / {pd.__version__}",
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
            "load average (1/5/15 min) at start": _load_text(load_before),
            "batch size": str(args.batch_size),
            "deletes": ", ".join(f"{d:.0%}" for d in shuffled_args.shuffled_deletes)
            + " of the stream",
            "repeats": f"{args.shuffled_repeats} (fivm vs numpy), {args.slow_repeats} (the "
            "other pairs, batch size 1)",
            "budgets": f"{args.budget_seconds:g} s (fivm vs numpy), {args.slow_budget_seconds:g} s "
            "(first_order vs pandas, categorical) of summed apply time per repeat",
            "engine options": "allow_absent_deletes=True"
            if args.allow_absent_deletes
            else "defaults (deletes of absent tuples are checked)",
            "warm-up": f"{args.warmup_rounds} round(s) of the stream in throwaway programs",
        }

    return star_shuffled.run(shuffled_args, compare_moments, log, env_fn, args.out, tag)


def profile_case(case: Case, strategy: str, args, tmp: Path, path: Path, log) -> None:
    """cProfile one strategy over the stream (a separate replay, within the budget)."""
    spec = tmp / "profile.pkl"
    payload = {
        "schema": case.schema,
        "updatable": case.updatable,
        "static": case.static,
        "stream": case.stream,
        "profile": str(path),
        "warmup": case.warmup(args.warmup_rounds),
    }
    with open(spec, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    run = run_worker(spec, strategy, args.budget_seconds, 0, 3 * args.budget_seconds + 600)
    log(
        f"  cProfile of {strategy} on {case.name}: {run.done}/{run.batches_total} batches, "
        f"{run.total_seconds:.2f} s under the profiler: {path}"
    )
    if path.exists():
        log("\n".join(path.read_text().splitlines()[:45]))


if __name__ == "__main__":
    sys.exit(main())
