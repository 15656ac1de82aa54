"""SQL views fed one row at a time: ``ringml.MicroBatcher`` over a ``ringml.sql.Database``
against one ``Database.apply`` per row and one per batch of 1000 rows (issue 10's
publish-subscribe mode, issue 11's batch size 1).

Run (from the repository root)::

    .venv/bin/python benchmarks/sql_single_rows.py                  # TPC-H Q1, SF 0.1
    .venv/bin/python benchmarks/sql_single_rows.py --query q3 --blocks 15 --repeats 1

The default query, Q1 (lineitem grouped by return flag and line status), changes with almost
every lineitem row, so the row-at-a-time program publishes a diff for nearly every row; the
join queries (Q3, Q5, Q10, Q12) change rarely in the stream's first blocks.

Data and stream: ``benchmarks/sql_tpch.py``'s (TPC-H from ``tpchgen-cli``, cached; the static
tables loaded before the view is created; the streamed tables' rows shuffled, in batches of
1000 with 20% deletes of present rows, round-robin over customer, orders and lineitem).  The
first ``--blocks`` batches of that stream are the blocks here.

Programs, each a ``Database`` with the one view (``create_view(q, sql, strategy="fivm",
static=[...])``) and a subscriber (publish-subscribe: every apply that changes the view
computes and publishes its diff; the subscriber keeps it, and the diffs are tallied after the
clock stops), fed the same blocks:

* ``batch``: one ``db.apply([UpdateBatch(table, rows, signs)])`` per block (the reference);
* ``coalesced``: every row of the block through ``MicroBatcher(db, max_rows=1000)``
  (``insert``/``delete`` of a plain tuple), then ``flush()`` at the end of the block: one
  apply (and one diff) per block;
* ``row``: one ``db.apply`` per row (one-row batches built before the clock starts): a
  diff per row, what a pub-sub user gets without coalescing.

Interleaved per block (the order rotates), timed with ``time.perf_counter`` around each
program's work on the block; throughput = rows / summed time, per repeat; the table gives
the median repeat and the spread.  Before the timed blocks, ``--warmup`` blocks run on
throwaway databases of each program.  The engine is a snapshot of the committed ``HEAD``
(``--worktree``: the working tree's), as in ``sql_tpch.py``.

Correctness (untimed): after every block the three views are read (``to_pandas``) and
compared with each other as multisets of rows (floats within 1e-9 relative), and after the
last block with DuckDB running the query over the rows present then; the diffs each program
published add up, per row of the result, to the change DuckDB gives from the empty tables to
the last block.  A mismatch exits with status 1.

Results: ``benchmarks/results/sql_single_rows.md`` (``--tag`` for another stem).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from engine import _git
from sql_tpch import STATIC, STREAMED, build, same_rows, tpch_frames, use_engine_snapshot

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = ("batch", "coalesced", "row")
#: the TPC-H queries over the streamed and static tables, with their ORDER BY columns
ORDER = {"q1": [0, 1], "q3": [1, 2], "q5": [1], "q6": [], "q10": [2], "q12": [0]}
TARGET = 1 / 3  # issue 11: batch-size-1 throughput at least 1/3 of batch size 1000


class Program:
    """A database with the one view, a subscriber keeping its diffs, and how the program
    feeds it a block."""

    def __init__(self, kind: str, query: str, static: dict[str, pd.DataFrame]) -> None:
        from ringml import MicroBatcher
        from ringml.datasets.tpch import TPCH_QUERIES, tpch_ddl
        from ringml.sql import Database, compile_view

        self.kind = kind
        self.db = Database(tpch_ddl())
        for table, frame in static.items():
            self.db.insert(table, frame)
        sql = TPCH_QUERIES[query]
        reads = compile_view(sql, self.db.catalog).tables
        self.view = self.db.create_view(query, sql, static=[t for t in static if t in reads])
        self.received: list[pd.DataFrame] = []  # the diffs, tallied after the clock stops
        self.published: Counter = Counter()
        self.diffs = 0
        self.view.subscribe(self.received.append)
        self.batcher = MicroBatcher(self.db, max_rows=1000)

    def tally(self) -> None:
        """Add the diffs received since the last tally to :attr:`published` (untimed)."""
        for diff in self.received:
            self.diffs += 1
            for *row, multiplicity in diff.itertuples(index=False, name=None):
                self.published[tuple(_key(v) for v in row)] += int(multiplicity)
        self.received.clear()

    def prepare(self, table: str, rows: pd.DataFrame, signs: np.ndarray):
        """What the clock must not see: the block's rows as tuples or one-row batches."""
        from ringml import UpdateBatch

        if self.kind == "batch":
            return UpdateBatch(table, rows, signs)
        if self.kind == "coalesced":
            return table, list(rows.itertuples(index=False, name=None)), signs.tolist()
        return [
            UpdateBatch(table, rows.iloc[i : i + 1].reset_index(drop=True), signs[i : i + 1])
            for i in range(len(rows))
        ]

    def feed(self, prepared) -> None:
        if self.kind == "batch":
            self.db.apply([prepared])
        elif self.kind == "coalesced":
            table, rows, signs = prepared
            insert, delete = self.batcher.insert, self.batcher.delete
            for row, sign in zip(rows, signs, strict=True):
                (insert if sign > 0 else delete)(table, row)
            flush = self.batcher.flush()
            if flush.rejected:
                raise RuntimeError(f"coalesced: rejected updates {flush.rejected[:3]}")
        else:
            for batch in prepared:
                self.db.apply([batch])


def duckdb_result(stream, query: str) -> pd.DataFrame:
    """DuckDB running the query over the rows present after the whole (truncated) stream."""
    import duckdb

    from ringml.datasets.tpch import TPCH_QUERIES

    con = duckdb.connect()
    for name, frame in stream.present(len(stream)).items():
        con.register(name, frame)
    return con.execute(TPCH_QUERIES[query]).df()


def _key(v):
    """A result value as a Counter key (floats to 10 significant digits)."""
    if isinstance(v, float | np.floating):
        return float(f"{float(v):.10g}") + 0.0
    if isinstance(v, np.generic):
        return v.item()
    return v


def _rows_counter(frame: pd.DataFrame) -> Counter:
    out: Counter = Counter()
    for row in frame.itertuples(index=False, name=None):
        out[tuple(_key(v) for v in row)] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--cache", type=Path, default=None, help="tpchgen-cli output folder")
    parser.add_argument("--query", choices=sorted(ORDER), default="q1")
    parser.add_argument("--blocks", type=int, default=30, help="timed blocks of the stream")
    parser.add_argument("--warmup", type=int, default=3, help="blocks on throwaway databases")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worktree", action="store_true", help="the working tree's engine")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--tag", default="sql_single_rows")
    args = parser.parse_args(argv)
    if args.cache is None:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        args.cache = base / "ringml" / f"tpch-sf{args.sf:g}"
    args.batch_size, args.deletes = 1000, 0.2
    args.max_batches = args.warmup + args.blocks

    def log(text: str) -> None:
        print(text, flush=True)

    load_start = os.getloadavg()
    started = datetime.now(UTC)
    commit = _git("rev-parse", "--short", "HEAD") or "?"
    with tempfile.TemporaryDirectory(prefix="ringml-single-rows-") as tmpdir:
        engine_hash = use_engine_snapshot(Path(tmpdir) / "engine", committed=not args.worktree)
        frames = tpch_frames(args.sf, args.cache, log)
        stream = build(frames, args)
        del frames
        blocks = list(range(args.warmup, len(stream)))
        n_rows = int(sum(len(stream.row_ids[i]) for i in blocks))
        n_del = int(sum(int((stream.signs[i] < 0).sum()) for i in blocks))
        log(
            f"TPC-H SF {args.sf:g} {args.query}: {len(blocks)} timed blocks, {n_rows:,} rows "
            f"({n_del:,} deletes); engine snapshot {engine_hash}"
        )
        for kind in PROGRAMS:  # warm-up on throwaway databases
            program = Program(kind, args.query, stream.static)
            for i in range(args.warmup):
                program.feed(program.prepare(stream.relations[i], stream.rows(i), stream.signs[i]))
        seconds = {k: np.zeros(args.repeats) for k in PROGRAMS}
        expected = duckdb_result(stream, args.query)
        failures: list[str] = []
        loads = []
        for repeat in range(args.repeats):
            loads.append(os.getloadavg()[0])
            programs = {k: Program(k, args.query, stream.static) for k in PROGRAMS}
            for i in range(args.warmup):  # the same state as the timed stream expects
                for p in programs.values():
                    p.feed(p.prepare(stream.relations[i], stream.rows(i), stream.signs[i]))
            start_rows = {k: _rows_counter(p.view.to_pandas()) for k, p in programs.items()}
            for p in programs.values():
                p.received.clear()
            for n, i in enumerate(blocks):
                rows, table, signs = stream.rows(i), stream.relations[i], stream.signs[i]
                k = (n + repeat) % len(PROGRAMS)
                for kind in PROGRAMS[k:] + PROGRAMS[:k]:
                    program = programs[kind]
                    prepared = program.prepare(table, rows, signs)
                    t = time.perf_counter()
                    program.feed(prepared)
                    seconds[kind][repeat] += time.perf_counter() - t
                for p in programs.values():
                    p.tally()
                results = {kind: p.view.to_pandas() for kind, p in programs.items()}
                for kind in PROGRAMS[1:]:
                    why = same_rows(results[kind], results["batch"], ORDER[args.query])
                    if why:
                        failures.append(f"repeat {repeat + 1}, block {n + 1}: {kind}: {why}")
            for kind, p in programs.items():
                why = same_rows(p.view.to_pandas(), expected, ORDER[args.query])
                if why:
                    failures.append(f"repeat {repeat + 1}: {kind} vs DuckDB: {why}")
                change = _rows_counter(expected)
                change.subtract(start_rows[kind])
                change = Counter({r: c for r, c in change.items() if c})
                published = Counter({r: c for r, c in p.published.items() if c})
                if published != change:
                    failures.append(f"repeat {repeat + 1}: {kind}: published diffs differ")
            log(
                f"repeat {repeat + 1}: "
                + ", ".join(f"{k} {n_rows / seconds[k][repeat]:,.0f} rows/s" for k in PROGRAMS)
                + f" ({programs['row'].diffs:,} diffs per row, {programs['coalesced'].diffs} "
                f"per block); load {loads[-1]:.2f}"
            )
    load_end = os.getloadavg()
    throughput = {k: n_rows / seconds[k] for k in PROGRAMS}
    ratio = {k: throughput[k] / throughput["batch"] for k in PROGRAMS}
    order = np.argsort(throughput["batch"])
    median = int(order[(args.repeats - 1) // 2])
    lines = [
        "# SQL views fed one row at a time: MicroBatcher vs one apply per row vs per batch",
        "",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- command: {' '.join(['python benchmarks/sql_single_rows.py', *(argv or sys.argv[1:])])}",
        f"- engine: commit {commit}; snapshot of {'the working tree' if args.worktree else 'HEAD'} "
        f"(sha256 {engine_hash})",
        f"- python / numpy / pandas: {platform.python_version()} / {np.__version__} / "
        f"{pd.__version__}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        f"- load average (1 min) at start / end: {load_start[0]:.2f} / {load_end[0]:.2f}; "
        f"at each repeat's start {', '.join(f'{x:.2f}' for x in loads)}",
        f"- data: TPC-H SF {args.sf:g}, query {args.query.upper()}; stream of "
        f"`benchmarks/sql_tpch.py` (seed {args.seed}), blocks {args.warmup + 1}-"
        f"{len(stream)}: {n_rows:,} rows, {n_del:,} deletes, tables {list(STREAMED)} "
        f"(static {list(STATIC)}, loaded first)",
        f"- repeats: {args.repeats}, programs interleaved per block (order rotated)",
        "",
        "| program | rows | rows/s (median; min–max) | throughput / batch's (median; min–max) "
        "| target ≥ 1/3 |",
        "|---|---|---|---|---|",
    ]
    for kind in PROGRAMS:
        t, r = throughput[kind], ratio[kind]
        verdict = "" if kind == "batch" else ("PASS" if np.median(r) >= TARGET else "FAIL")
        if kind == "row":
            verdict = f"(reference) {verdict}"
        lines.append(
            f"| {kind} | {n_rows:,} | {t[median]:,.0f} ({t.min():,.0f}–{t.max():,.0f}) | "
            f"{np.median(r):.3f} ({r.min():.3f}–{r.max():.3f}) | {verdict} |"
        )
    lines += [
        "",
        "batch: one `Database.apply` per block of ≤ 1000 rows; coalesced: each row through "
        "`MicroBatcher(db, max_rows=1000).insert/delete`, `flush()` at the end of the block "
        "(one apply, one published diff per block); row: one `Database.apply` per row (a "
        "published diff per row that changed the view). Every database has a subscriber (it "
        "keeps the diff; the diffs are tallied untimed).",
        "",
        "## Correctness",
        "",
        f"{len(failures)} failure(s): the three views equal after each of the {len(blocks)} "
        "blocks of every repeat, each equal to DuckDB after the last block, and each program's "
        "published diffs add up to DuckDB's change of the result over the timed blocks.",
        *[f"- {f}" for f in failures],
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
