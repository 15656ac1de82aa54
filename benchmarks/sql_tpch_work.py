"""What the strategies do on the SQL benchmark's stream: counts of the engine's store operations.

``benchmarks/sql_tpch.py`` times fivm against first_order on TPC-H Q3 and Q5; this script
counts, on the same stream (same data, seed, batch size and deletes), the work behind those
times, to see how much less of it F-IVM's views leave to do:

* key probes: rows looked up by full key (``ViewStore.lookup``: a primary-key or view-key
  probe) and by partial key (``ViewStore.matches``), and the pairs the partial probes found;
* gathers: rows of stored payloads taken (``ViewStore.take``);
* writes: rows added to stores (``ViewStore.add``: views, and first_order's base relations);
* view steps: ``operators.step`` calls and the delta rows they start from.

Counting wraps those methods in the process (a few percent of overhead, so no times are
reported here). Run (from the repository root)::

    .venv/bin/python benchmarks/sql_tpch_work.py               # SF 0.1
    .venv/bin/python benchmarks/sql_tpch_work.py --sf 1 --tag sql_tpch-work-sf1

Writes ``benchmarks/results/<tag>.md`` (default tag ``sql_tpch-work``).
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import sql_tpch
from engine import _git

REPO = Path(__file__).resolve().parents[1]
STRATEGIES = ("fivm", "first_order")
#: (counter, what it counts), in table order
COUNTERS = (
    ("probe rows", "rows probed by key (full and partial keys)"),
    ("lookup rows", "rows probed by full key (`ViewStore.lookup`)"),
    ("matches probe rows", "rows probed by partial key (`ViewStore.matches`)"),
    ("matches pairs", "pairs found by those partial probes"),
    ("take rows", "stored payload rows gathered (`ViewStore.take`)"),
    ("add rows", "rows written to stores (`ViewStore.add`)"),
    ("steps", "view steps (`operators.step`)"),
    ("step delta rows", "delta rows entering those steps"),
)


def instrument(counts: Counter) -> None:
    """Count the store operations and view steps of every maintainer of this process."""
    from ringml import operators, store

    def wrap(cls, name, measure):
        original = getattr(cls, name)

        def counted(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            counts.update(measure(args, result))
            return result

        setattr(cls, name, counted)

    wrap(store.ViewStore, "lookup", lambda a, r: {"lookup rows": len(a[0])})
    wrap(
        store.ViewStore,
        "matches",
        lambda a, r: {"matches probe rows": len(a[1]), "matches pairs": len(r[0])},
    )
    wrap(store.ViewStore, "take", lambda a, r: {"take rows": len(a[0])})
    wrap(store.ViewStore, "add", lambda a, r: {"add rows": len(a[0])})
    step = operators.step

    def counted_step(ctx, view, siblings, delta):
        counts.update({"steps": 1, "step delta rows": operators.size(ctx, delta)})
        return step(ctx, view, siblings, delta)

    operators.step = counted_step


def count(query: str, strategy: str, stream: sql_tpch.Stream, counts: Counter) -> Counter:
    """The counters of one strategy over the whole stream (view creation not counted)."""
    system = sql_tpch.RingmlSystem(query, strategy, stream.static)
    counts.clear()
    for i in range(len(stream)):
        system.apply(stream.relations[i], stream.rows(i), stream.signs[i])
    out = Counter(counts)
    out["probe rows"] = out["lookup rows"] + out["matches probe rows"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--queries", nargs="+", choices=sql_tpch.QUERY_NAMES,
                        default=list(sql_tpch.QUERY_NAMES))  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--deletes", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--tag", default="sql_tpch-work")
    args = parser.parse_args()
    args.max_batches = 0
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    frames = sql_tpch.tpch_frames(args.sf, base / "ringml" / f"tpch-sf{args.sf:g}", print)
    stream = sql_tpch.build(frames, args)
    tuples = int(stream.sizes().sum())
    counts: Counter = Counter()
    instrument(counts)
    lines = [
        "# What fivm and first_order do on the SQL benchmark's stream",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- command: python benchmarks/sql_tpch_work.py --sf {args.sf:g} --tag {args.tag}",
        f"- engine: commit {_git('rev-parse', '--short', 'HEAD')}",
        f"- stream: TPC-H SF {args.sf:g}, {len(stream):,} batches of {args.batch_size} "
        f"({tuples:,} tuples, {args.deletes:.0%} deletes, seed {args.seed}): "
        "`benchmarks/sql_tpch.py`'s",
        "",
        "Counts of the engine's store operations over the whole stream (the SQL layer's own "
        "primary-key table store, shared by both strategies, is not counted).",
    ]
    for query in args.queries:
        result = {s: count(query, s, stream, counts) for s in STRATEGIES}
        print(query, {s: dict(c) for s, c in result.items()}, flush=True)
        lines += ["", f"## {query.upper()}", ""]
        lines += ["| counter | fivm | first_order | first_order / fivm |", "|---|---|---|---|"]
        for name, what in COUNTERS:
            a, b = result["fivm"][name], result["first_order"][name]
            ratio = f"{b / a:.2f}" if a else "–"
            lines.append(f"| {what} | {a:,} | {b:,} | {ratio} |")
    path = args.out / f"{args.tag}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
