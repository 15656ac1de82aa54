"""The absent-delete check alone: ``TupleCounts`` replayed from the calls of a real stream.

The check and record of the tuple counts (``ringml.batch.TupleCounts``) are a few hundred
microseconds of a batch, less than the spread of the end-to-end benchmarks, so they are
timed here apart: the shuffled star (``star_shuffled.build_case``) is applied once through
``Maintainer(strategy="fivm")`` while every ``check`` / ``apply`` call on its tuple counts
is recorded (arguments copied); the calls are then replayed into fresh ``TupleCounts``
objects, ``--repeats`` times, timing only them.  Reported: microseconds per batch, min and
median over the repeats.  To compare two engines, run this script from a checkout of each::

    .venv/bin/python benchmarks/tuple_counts.py                      # P = 5000 and 50,000
    .venv/bin/python benchmarks/tuple_counts.py --postcodes 5000 --deletes 0.3 --repeats 9
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from star_shuffled import EngineProgram, build_case  # noqa: E402

from ringml import batch as batch_module  # noqa: E402


def record_calls(postcodes: int, deletes: float, batch_size: int, seed: int) -> list[tuple]:
    """(counts object id, "check" or "apply", arguments) of every call, in order."""
    case = build_case(postcodes, deletes, batch_size, seed)
    program = EngineProgram(case.schema, "fivm")
    items = program.prepare(case.stream)
    calls: list[tuple] = []
    check, apply = batch_module.TupleCounts.check, batch_module.TupleCounts.apply

    def recording_check(self, fingerprints, signs, earlier=None):
        calls.append((id(self), "check", (fingerprints.copy(), signs.copy(), earlier)))
        return check(self, fingerprints, signs, earlier)

    def recording_apply(self, ids, net):
        calls.append((id(self), "apply", (ids.copy(), net.copy())))
        return apply(self, ids, net)

    batch_module.TupleCounts.check = recording_check
    batch_module.TupleCounts.apply = recording_apply
    try:
        for item in items:
            program.apply(item)
    finally:
        batch_module.TupleCounts.check, batch_module.TupleCounts.apply = check, apply
    return calls


def replay(calls: Sequence[tuple]) -> float:
    """Seconds spent in the recorded calls, replayed into fresh ``TupleCounts``."""
    objects: dict[int, batch_module.TupleCounts] = {}
    spent = 0.0
    for owner, kind, arguments in calls:
        counts = objects.get(owner)
        if counts is None:
            counts = objects[owner] = batch_module.TupleCounts(1)
        start = time.perf_counter()
        result = getattr(counts, kind)(*arguments)
        spent += time.perf_counter() - start
        if kind == "check" and result[2] >= 0:
            raise AssertionError("the replay rejected a delete the recorded stream accepted")
    return spent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postcodes", type=int, nargs="+", default=[5000, 50000])
    parser.add_argument("--deletes", type=float, default=0.3)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    for postcodes in args.postcodes:
        calls = record_calls(postcodes, args.deletes, args.batch_size, args.seed)
        batches = sum(1 for call in calls if call[1] == "check")
        times = np.array([replay(calls) for _ in range(args.repeats)]) / batches * 1e6
        print(
            f"P={postcodes}, deletes {args.deletes:.0%}: {batches} batches; check + record "
            f"{times.min():.1f} us per batch (min), {np.median(times):.1f} (median) "
            f"over {args.repeats} replays"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
