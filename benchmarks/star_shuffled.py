"""The shuffled Housing star (issue 11): the engine against hand-written baselines, in-process.

Run through ``benchmarks/engine.py`` (it snapshots the engine first)::

    .venv/bin/python benchmarks/engine.py --workload star-shuffled   # P = 1000, 5000, 50000
    .venv/bin/python benchmarks/engine.py --workload star-shuffled-5000 --deletes 0.3
    .venv/bin/python benchmarks/engine.py --workload star-shuffled-5000 --profile fivm

Workload ``star-shuffled-P``: ``housing_star(postcodes=P)`` (6 relations on ``postcode``, 21·P
tuples, join 200·P rows), every relation's rows permuted (seeded), then
``build_stream(batch_size, delete_fraction, seed)``: round-robin over the relations, batches
of ``--batch-size`` (1000) tuples; with deletes, each batch also deletes earlier-inserted
tuples.  A batch of 1000 shuffled House rows touches ~630 (P=1000), ~900 (P=5000) or ~990
(P=50,000) postcodes, instead of 100 when rows arrive grouped by postcode.  Query:
``covariance_query`` over all 26 non-join variables (count, Σx, Σxxᵀ: 378 aggregates).

Sections, each run **in one process, interleaved batch by batch** (batch ``i`` goes to both
programs of a pair back to back, the one going first alternating with ``i`` and the repeat),
so both programs see the same machine load, caches and allocator state:

1. ``fivm`` (``Maintainer(strategy="fivm")``) against :class:`star_baseline.StarCovariance`
   (hand-specialized numpy F-IVM for this query): time ratio engine / baseline per repeat,
   min / median / max over repeats; the engine is checked against the baseline every
   ``--check-every`` batches (untimed) and at the end of every repeat.
2. ``first_order`` against :class:`star_pandas_first_order.StarPandasFirstOrder` (plain
   pandas merges + one matrix product): the same, on the prefix a repeat finishes within
   ``--slow-budget-seconds``; both are checked against the numpy baseline on that prefix.
3. Categorical: ``Maintainer`` over ``covariance_query(schema, categorical=8 variables)``
   (``GeneralizedCovarianceRing``) on the shuffled stream against the same on the stream of
   the relations in stored order (rows grouped by postcode; same batch sizes and relation per
   batch); ratio shuffled / stored.  Checked against a one-hot-expanded numpy oracle
   (``StarCovariance`` over one-hot columns) on the prefix, and shuffled == stored when the
   two streams end in the same database (no deletes, whole stream).  Reference pair: the
   same two streams, one-hot expanded before timing, into ``StarCovariance`` over the
   one-hot columns -- what the stored order saves a program written for this one query.
4. Batch size 1: the first ``--batch1-tuples`` tuples of the stream, applied one tuple per
   ``apply`` against the same tuples in their batches of 1000 (interleaved per 1000-batch
   block), for fivm and for the numpy baseline; per-tuple throughput ratio.  Also
   ``fivm-coalesced``: the same tuples one at a time through ``ringml.MicroBatcher``
   (``max_rows`` = the batch size, flushed at the end of each of the stream's batches).
5. Memory, untimed, one program at a time: ``tracemalloc`` around building the program and
   replaying the whole stream (numpy reports its buffers to tracemalloc): *retained* =
   traced memory still allocated at the end (the state), *peak* = the largest traced memory
   during the replay (state plus transients); and the bytes of arrays reachable from the
   program (*arrays*: ``ndarray.nbytes`` of every owning array in its object graph, i.e. the
   stores, indexes and dictionaries; ``StarCovariance``: its state array, allocated).
"""

from __future__ import annotations

import gc
import os
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from star_baseline import StarCovariance, star_variables
from star_pandas_first_order import StarPandasFirstOrder

POSTCODES = (1000, 5000, 50000)
WORKLOADS = tuple(f"star-shuffled-{p}" for p in POSTCODES)
ALIAS = "star-shuffled"
DEFAULT_DELETES = (0.0, 0.3)
#: pipelines/main_job.py's categorical features (8 of HOUSING_CATEGORICAL).
CATEGORICAL = [
    "nbbedrooms", "nbbathrooms", "house", "flat", "parking", "pricerangeshop",
    "typeeducation", "pricerangerest",
]  # fmt: skip
KEY = "postcode"
#: Above this, the categorical section checks against the continuous baseline (folded).
ONEHOT_MAX_POSTCODES = 5000
#: cProfile: replay the stream until this much apply time was profiled.
PROFILE_SECONDS = 3.0

# Targets of issue 11 (for the table; the engine work that meets them is done elsewhere).
TARGET_FIVM_RATIO = 1.3  # fivm time / numpy baseline time at P = 5000 and 50,000
STRETCH_FIVM_RATIO = 1.0
TARGET_FIRST_ORDER_RATIO = 1.5  # first_order time / pandas first-order time
TARGET_CATEGORICAL_RATIO = 2.0  # shuffled time / stored-order time
TARGET_BATCH1_FRACTION = 1 / 3  # batch-1 per-tuple throughput / batch-1000
TARGET_MEMORY_RATIO = 1.3  # fivm peak state / baseline at P = 50,000


def load1() -> float:
    return os.getloadavg()[0]


# ============================================================================ the streams
@dataclass
class StarCase:
    postcodes: int
    deletes: float
    schema: dict[str, list[str]]
    relations: dict[str, pd.DataFrame]  # shuffled
    stream: list  # StreamBatch, shuffled relations
    stored_relations: dict[str, pd.DataFrame]
    _stored_stream: list | None = None
    batch_size: int = 1000
    seed: int = 0

    @property
    def name(self) -> str:
        return f"star-shuffled-{self.postcodes}"

    @property
    def tuples(self) -> int:
        return int(sum(len(b) for b in self.stream))

    def stored_stream(self) -> list:
        """The same stream over the relations in stored order (grouped by postcode)."""
        if self._stored_stream is None:
            from ringml.datasets import build_stream

            self._stored_stream = build_stream(
                self.stored_relations,
                batch_size=self.batch_size,
                delete_fraction=self.deletes,
                seed=self.seed,
            )
        return self._stored_stream


def shuffle_relations(relations: dict[str, pd.DataFrame], seed: int) -> dict[str, pd.DataFrame]:
    """Every relation's rows in a seeded random order (fresh RangeIndex)."""
    rng = np.random.default_rng([seed, 11])
    return {r: f.iloc[rng.permutation(len(f))].reset_index(drop=True) for r, f in relations.items()}


def build_case(postcodes: int, deletes: float, batch_size: int, seed: int) -> StarCase:
    from ringml.datasets import build_stream, housing_star

    data = housing_star(postcodes=postcodes, seed=seed)
    shuffled = shuffle_relations(data.relations, seed)
    stream = build_stream(shuffled, batch_size=batch_size, delete_fraction=deletes, seed=seed)
    return StarCase(
        postcodes, deletes, data.schemas, shuffled, stream, data.relations,
        batch_size=batch_size, seed=seed,
    )  # fmt: skip


def touched_postcodes(stream: Sequence, relation: str = "House") -> float:
    """Mean number of distinct postcodes in the full-size batches of ``relation``."""
    sizes = [b.rows[KEY].nunique() for b in stream if b.relation == relation]
    return float(np.mean(sizes)) if sizes else float("nan")


# ============================================================================ the programs
class Program:
    """A contender: ``apply(batch)`` of a StreamBatch, ``moments()`` in ring variable order."""

    name = "?"

    def prepare(self, stream: Sequence) -> list:
        """Per-batch inputs, built before the timed replay."""
        return list(stream)

    def apply(self, item) -> None:
        raise NotImplementedError

    def moments(self) -> tuple:
        raise NotImplementedError


class EngineProgram(Program):
    def __init__(self, schema, strategy: str, allow_absent_deletes: bool = False, **query):
        from ringml import Maintainer
        from ringml.applications import covariance_query

        self.name = strategy
        self.query = covariance_query(schema, **query)
        self.maintainer = Maintainer(
            self.query, strategy=strategy, allow_absent_deletes=allow_absent_deletes
        )

    def prepare(self, stream):
        from ringml.batch import UpdateBatch

        return [UpdateBatch(b.relation, b.rows, b.multiplicity) for b in stream]

    def apply(self, item) -> None:
        self.maintainer.apply(item)

    def moments(self):
        return self.query.ring.moments(self.maintainer.result())

    def dense(self):
        """GC ring: ``{column name: index}``, count, Σ, Q of the one-hot layout (original units)."""
        ring, payload = self.query.ring, self.maintainer.result()
        codes = {v: np.asarray(c, dtype=np.int64) for v, c in ring.used_codes(payload).items()}
        count, s, q = ring.to_dense(payload, {v: list(c) for v, c in codes.items()})
        names = list(ring.continuous)
        for v in ring.categorical:
            values = self.maintainer.decode(v, codes[v]) if len(codes[v]) else []
            names += [f"{v}={x}" for x in values]
        return names, count, s, q


class CoalescedProgram(Program):
    """An engine program fed one tuple at a time through ``ringml.MicroBatcher``
    (``max_rows`` = the batch size), flushed at the end of each of the stream's batches."""

    def __init__(self, engine: EngineProgram, max_rows: int):
        from ringml import MicroBatcher

        self.name = f"{engine.name} coalesced"
        self.engine = engine
        self.batcher = MicroBatcher(engine.maintainer, max_rows=max_rows)

    def prepare(self, stream):
        """(insert or delete, relation, row tuple) per tuple; None (flush) after the last."""
        items = []
        for b in stream:
            rows = b.rows.itertuples(index=False, name=None)
            for row, sign in zip(rows, b.multiplicity, strict=True):
                op = self.batcher.insert if sign > 0 else self.batcher.delete
                items.append((op, b.relation, row))
        return items + [None]

    def apply(self, item) -> None:
        if item is None:
            self.batcher.flush()
        else:
            item[0](item[1], item[2])

    def moments(self):
        self.batcher.flush()
        return self.engine.moments()


class NumpyProgram(Program):
    """The hand-specialized numpy F-IVM (``StarCovariance``); with ``expand`` (a batch's rows
    one-hot expanded, done in :meth:`prepare`, untimed) over the one-hot schema: the
    categorical section's reference program."""

    def __init__(self, schema, key: str = KEY, expand: Callable | None = None):
        self.baseline = StarCovariance(schema, key)
        self.expand = expand
        self.name = "numpy" if expand is None else "numpy one-hot"

    def prepare(self, stream):
        expand = self.expand
        return [
            (b.relation, b.rows if expand is None else expand(b), b.multiplicity) for b in stream
        ]

    def apply(self, item) -> None:
        self.baseline.apply(*item)

    def moments(self):
        return self.baseline.moments()


class PandasProgram(Program):
    name = "pandas"

    def __init__(self, schema, key: str = KEY):
        self.baseline = StarPandasFirstOrder(schema, key)

    def apply(self, b) -> None:
        self.baseline.apply(b.relation, b.rows, b.multiplicity)

    def moments(self):
        return self.baseline.moments()


# ============================================================================ interleaving
@dataclass
class PairRun:
    """One repeat of two programs over the same batches, interleaved batch by batch."""

    names: tuple[str, str]
    seconds: tuple[np.ndarray, np.ndarray]  # per batch
    tuples: np.ndarray  # per batch
    load: float
    stopped: bool
    programs: tuple = ()
    checks: list = field(default_factory=list)  # (text, ok, diff)

    @property
    def done(self) -> int:
        return len(self.tuples)

    def total(self, i: int) -> float:
        return float(self.seconds[i].sum())

    def throughput(self, i: int) -> float:
        return float(self.tuples.sum()) / self.total(i)

    @property
    def ratio(self) -> float:
        return self.total(0) / self.total(1)


def interleave(
    factories: tuple[Callable[[], Program], Callable[[], Program]],
    streams: tuple[Sequence, Sequence],
    repeat: int,
    budget: float,
    check: Callable[[Program, Program, int], tuple[str, bool, float] | None] | None = None,
    check_every: int = 0,
) -> PairRun:
    """Replay ``streams[j]`` into a fresh ``factories[j]()``, batch ``i`` of both back to back
    (program ``(i + repeat) % 2`` first); stop after the batch where the summed time of both
    passed ``budget`` (0: no budget)."""
    gc.collect()
    load = load1()
    programs = (factories[0](), factories[1]())
    inputs = (programs[0].prepare(streams[0]), programs[1].prepare(streams[1]))
    n = len(inputs[0])
    seconds = (np.zeros(n), np.zeros(n))
    tuples = np.array([len(b) for b in streams[0]], dtype=np.int64)
    checks = []
    spent = 0.0
    done = n
    clock = time.perf_counter
    for i in range(n):
        for j in (0, 1) if (i + repeat) % 2 == 0 else (1, 0):
            t0 = clock()
            programs[j].apply(inputs[j][i])
            seconds[j][i] = clock() - t0
        spent += seconds[0][i] + seconds[1][i]
        if check is not None and check_every and (i + 1) % check_every == 0 and i + 1 < n:
            result = check(programs[0], programs[1], i + 1)
            if result is not None:
                checks.append(result)
        if budget > 0 and spent > budget:
            done = i + 1
            break
    run = PairRun(
        (programs[0].name, programs[1].name),
        (seconds[0][:done], seconds[1][:done]),
        tuples[:done],
        load,
        done < n,
        programs,
        checks,
    )
    if check is not None:
        result = check(programs[0], programs[1], done)
        if result is not None:
            run.checks.append(result)
    return run


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    v = np.asarray(values, dtype=float)
    return float(v.min()), float(np.median(v)), float(v.max())


def fmt_spread(values: Sequence[float], digits: int = 2) -> str:
    lo, med, hi = spread(values)
    return f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


# ============================================================================ the sections
class Harness:
    def __init__(self, args, compare, log):
        self.args = args
        self.compare = compare  # engine.compare_moments
        self.log = log
        self.rows: list[dict] = []
        self.checks: list[tuple[str, bool, float]] = []
        self.workload_lines: list[str] = []
        self.profiles: list[tuple[str, str]] = []

    # ---------------------------------------------------------------- helpers
    def _engine(self, schema, strategy, **query):
        allow = bool(getattr(self.args, "allow_absent_deletes", False))
        return lambda: EngineProgram(schema, strategy, allow_absent_deletes=allow, **query)

    def _moments_check(self, label: str):
        seen = [0.0, 0.0]  # the baseline's largest |Σx|, |Σxxᵀ| so far (see compare_moments)

        def check(a: Program, b: Program, batches: int):
            ok, diff = self.compare(a.moments(), b.moments(), seen)
            return (f"{label}: {a.name} == {b.name} after {batches} batches", ok, diff)

        return check

    def _record_checks(self, checks) -> None:
        for text, ok, diff in checks:
            self.checks.append((text, ok, diff))
            if not ok:
                self.log(f"    MISMATCH {text} (max relative difference {diff:.1e})")

    def _numpy_after(self, case: StarCase, stream, batches: int) -> tuple:
        baseline = StarCovariance(case.schema, KEY)
        for b in stream[:batches]:
            baseline.apply(b.relation, b.rows, b.multiplicity)
        return baseline.moments()

    def _pair_rows(self, section, case, runs: list[PairRun], extra=None) -> dict:
        a, b = runs[0].names
        ratios = [r.ratio for r in runs]
        done = min(r.done for r in runs)
        row = {
            "section": section,
            "workload": case.name,
            "postcodes": case.postcodes,
            "deletes": case.deletes,
            "batch_size": case.batch_size,
            "program": a,
            "baseline": b,
            "batches": done,
            "batches_total": len(case.stream),
            "tuples": int(runs[0].tuples[:done].sum()),
            "stream_tuples": case.tuples,
            "repeats": len(runs),
            "program_tuples_per_s": float(np.median([r.throughput(0) for r in runs])),
            "baseline_tuples_per_s": float(np.median([r.throughput(1) for r in runs])),
            "ratio_min": spread(ratios)[0],
            "ratio_median": spread(ratios)[1],
            "ratio_max": spread(ratios)[2],
            "ratios": " ".join(f"{x:.3f}" for x in ratios),
            "load_min": min(r.load for r in runs),
            "load_max": max(r.load for r in runs),
        }
        row.update(extra or {})
        self.rows.append(row)
        return row

    def _log_pair(self, label, row) -> None:
        self.log(
            f"    {label}: {row['program']} {row['program_tuples_per_s']:,.0f} t/s, "
            f"{row['baseline']} {row['baseline_tuples_per_s']:,.0f} t/s; ratio "
            f"{row['ratio_median']:.2f} ({row['ratio_min']:.2f}–{row['ratio_max']:.2f}) over "
            f"{row['repeats']} repeats, {row['batches']}/{row['batches_total']} batches; "
            f"load {row['load_min']:.2f}–{row['load_max']:.2f}"
        )

    def _warm(self, factories, streams) -> None:
        """Replay the first round-robin round in throwaway programs (first-call costs)."""
        rounds = max(0, int(self.args.warmup_rounds))
        k = rounds * len({b.relation for b in streams[0]})
        if k:
            interleave(factories, (streams[0][:k], streams[1][:k]), 0, 0.0)

    # ---------------------------------------------------------------- 1. fivm vs numpy
    def fivm_vs_numpy(self, case: StarCase) -> None:
        factories = (self._engine(case.schema, "fivm"), lambda: NumpyProgram(case.schema))
        streams = (case.stream, case.stream)
        self._warm(factories, streams)
        runs = []
        for rep in range(self.args.shuffled_repeats):
            run = interleave(
                factories, streams, rep, self.args.budget_seconds,
                self._moments_check(f"{case.name}, deletes {case.deletes:.0%}"),
                self.args.check_every if rep == 0 else 0,
            )  # fmt: skip
            self._record_checks(run.checks)
            run.programs = ()
            runs.append(run)
        row = self._pair_rows("fivm_vs_numpy", case, runs)
        self._log_pair("fivm vs numpy baseline", row)

    # ---------------------------------------------------------------- 2. first_order vs pandas
    def first_order_vs_pandas(self, case: StarCase) -> None:
        factories = (
            self._engine(case.schema, "first_order"),
            lambda: PandasProgram(case.schema),
        )
        streams = (case.stream, case.stream)
        self._warm(factories, streams)
        runs = []
        label = f"{case.name}, deletes {case.deletes:.0%}"
        for rep in range(self.args.slow_repeats):
            run = interleave(factories, streams, rep, self.args.slow_budget_seconds,
                             self._moments_check(label))  # fmt: skip
            if rep == 0:  # both against the numpy baseline on the same prefix
                reference = self._numpy_after(case, case.stream, run.done)
                for prog in run.programs:
                    ok, diff = self.compare(prog.moments(), reference)
                    run.checks.append(
                        (f"{label}: {prog.name} == numpy after {run.done} batches", ok, diff)
                    )
            self._record_checks(run.checks)
            run.programs = ()
            runs.append(run)
        row = self._pair_rows("first_order_vs_pandas", case, runs)
        self._log_pair("first_order vs pandas", row)

    # ---------------------------------------------------------------- 3. categorical
    def categorical(self, case: StarCase) -> None:
        stored = case.stored_stream()
        assert [(b.relation, len(b)) for b in stored] == [(b.relation, len(b)) for b in case.stream]
        factory = self._engine(case.schema, "fivm", categorical=CATEGORICAL)
        factories = (factory, factory)
        streams = (case.stream, stored)
        self._warm(factories, streams)
        runs = []
        label = f"{case.name}, deletes {case.deletes:.0%}, categorical"
        for rep in range(self.args.slow_repeats):
            run = interleave(factories, streams, rep, self.args.slow_budget_seconds)
            run.names = ("fivm shuffled", "fivm stored")
            if rep == 0:
                for prog, stream, which in zip(
                    run.programs, streams, ("shuffled", "stored"), strict=True
                ):
                    if case.postcodes <= ONEHOT_MAX_POSTCODES:
                        ok, diff = self._check_dense(prog, case, stream, run.done)
                        what = "one-hot numpy"
                    else:  # the one-hot oracle's state would be ~10x the continuous one's
                        ok, diff = self._check_projection(prog, case, stream, run.done)
                        what = "numpy (one-hot columns folded back to values)"
                    run.checks.append(
                        (f"{label}: {which} order == {what} after {run.done} batches", ok, diff)
                    )
                if not run.stopped and case.deletes == 0:
                    ok, diff = self._compare_dense(run.programs[0].dense(), run.programs[1].dense())
                    run.checks.append(
                        (f"{label}: shuffled == stored order (whole stream)", ok, diff)
                    )
            self._record_checks(run.checks)
            run.programs = ()
            runs.append(run)
        row = self._pair_rows("categorical_shuffled_vs_stored", case, runs)
        self._log_pair("categorical ring, shuffled vs stored order", row)
        done = min(r.done for r in runs)
        self._categorical_reference(case, (case.stream[:done], stored[:done]))

    def _categorical_reference(self, case: StarCase, streams) -> None:
        """The same two streams (the prefix fivm was timed on) into the hand-written numpy
        program over the one-hot columns: how much the shuffled order costs a program
        written for this one query."""
        schema, expand = self._onehot(case)
        factory = lambda: NumpyProgram(schema, expand=expand)  # noqa: E731
        factories = (factory, factory)
        self._warm(factories, streams)
        same_database = len(streams[0]) == len(case.stream) and case.deletes == 0
        runs = []
        for rep in range(self.args.slow_repeats):
            run = interleave(factories, streams, rep, 0.0)
            run.names = ("numpy one-hot shuffled", "numpy one-hot stored")
            if rep == 0 and same_database:
                ok, diff = self.compare(run.programs[0].moments(), run.programs[1].moments())
                run.checks.append(
                    (f"{case.name}, categorical reference: numpy one-hot shuffled == stored "
                     f"order (whole stream)", ok, diff)
                )  # fmt: skip
            self._record_checks(run.checks)
            run.programs = ()
            runs.append(run)
        row = self._pair_rows("categorical_reference", case, runs)
        self._log_pair("numpy one-hot reference, shuffled vs stored order", row)

    def _onehot(self, case: StarCase):
        """One-hot-expanded schema and a batch expander (categories from the whole data)."""
        cats = {}
        for v in CATEGORICAL:
            for f in case.stored_relations.values():
                if v in f.columns:
                    cats[v] = np.unique(f[v].to_numpy())
        schema = {}
        for r, cols in case.schema.items():
            out = []
            for c in cols:
                out += [f"{c}={x}" for x in cats[c]] if c in cats else [c]
            schema[r] = out

        def expand(b):
            parts = {}
            for c in b.rows.columns:
                col = b.rows[c].to_numpy()
                if c in cats:
                    for x in cats[c]:
                        parts[f"{c}={x}"] = (col == x).astype(np.float64)
                else:
                    parts[c] = col
            return pd.DataFrame(parts)

        return schema, expand

    def _check_dense(self, prog: EngineProgram, case: StarCase, stream, batches: int):
        schema, expand = self._onehot(case)
        oracle = StarCovariance(schema, KEY)
        for b in stream[:batches]:
            oracle.apply(b.relation, expand(b), b.multiplicity)
        count, s, q = oracle.moments()
        return self._compare_dense(prog.dense(), (oracle.variables, count, s, q))

    def _check_projection(self, prog: EngineProgram, case: StarCase, stream, batches: int):
        """The GC payload's dense moments mapped back to the 26 variables (a one-hot block
        times its category values gives the variable) against the continuous baseline."""
        names, count, s, q = prog.dense()
        variables = star_variables(case.schema, KEY)
        at = {v: i for i, v in enumerate(variables)}
        fold = np.zeros((len(variables), len(names)))
        for j, name in enumerate(names):
            if name in at:
                fold[at[name], j] = 1.0
            else:
                v, x = name.split("=", 1)
                fold[at[v], j] = float(x)
        got = (int(round(count)), fold @ s, fold @ q @ fold.T)
        return self.compare(got, self._numpy_after(case, stream, batches))

    def _compare_dense(self, got, expected) -> tuple[bool, float]:
        """GC dense moments against another layout, matched by column name; columns one
        side lacks (categories absent there) must be ~0 on the other."""
        names_a, ca, sa, qa = got
        names_b, cb, sb, qb = expected
        names = sorted(set(names_a) | set(names_b))

        def embed(names_x, s, q):
            at = {n: i for i, n in enumerate(names_x)}
            idx = np.array([at.get(n, -1) for n in names])
            s2 = np.where(idx >= 0, s[np.maximum(idx, 0)], 0.0)
            q2 = np.where(
                (idx[:, None] >= 0) & (idx[None, :] >= 0),
                q[np.ix_(np.maximum(idx, 0), np.maximum(idx, 0))],
                0.0,
            )
            return s2, q2

        sa2, qa2 = embed(names_a, sa, qa)
        sb2, qb2 = embed(names_b, sb, qb)
        return self.compare((int(round(ca)), sa2, qa2), (int(round(cb)), sb2, qb2))

    # ---------------------------------------------------------------- 4. batch size 1
    def batch_one(self, case: StarCase) -> None:
        limit = self.args.batch1_tuples
        blocks, total = [], 0
        for b in case.stream:
            if total >= limit:
                break
            blocks.append(b)
            total += len(b)
        singles = [_split_rows(b) for b in blocks]
        label = f"{case.name}, deletes {case.deletes:.0%}, batch size 1"
        fivm = self._engine(case.schema, "fivm")
        for name, factory, one_factory in (
            ("fivm", fivm, fivm),
            ("numpy", lambda: NumpyProgram(case.schema), lambda: NumpyProgram(case.schema)),
            ("fivm-coalesced", fivm, lambda: CoalescedProgram(fivm(), case.batch_size)),
        ):
            # warm-up: the first block both ways
            self._batch_one_run(factory, blocks[:1], singles[:1], 0, one_factory)
            runs = []
            for rep in range(self.args.slow_repeats):
                run = self._batch_one_run(factory, blocks, singles, rep, one_factory)
                ok, diff = self.compare(run.programs[0].moments(), run.programs[1].moments())
                if rep == 0:
                    self._record_checks([(f"{label}: {name} batch 1 == batch 1000", ok, diff)])
                run.programs = ()
                runs.append(run)
            fractions = [1.0 / r.ratio for r in runs]  # per-tuple throughput b1 / b1000
            row = self._pair_rows(
                "batch1_vs_batch1000", case, runs,
                {
                    "program": f"{name} batch 1",
                    "baseline": f"{name} batch {case.batch_size}",
                    "throughput_fraction_median": float(np.median(fractions)),
                    "throughput_fraction_min": min(fractions),
                    "throughput_fraction_max": max(fractions),
                },
            )  # fmt: skip
            self.log(
                f"    batch 1 vs {case.batch_size} ({name}, {row['tuples']:,} tuples): "
                f"{row['program_tuples_per_s']:,.0f} vs {row['baseline_tuples_per_s']:,.0f} t/s, "
                f"batch-1 throughput = {fmt_spread(fractions, 3)} of batch {case.batch_size}"
            )

    def _batch_one_run(self, factory, blocks, singles, repeat, one_factory) -> PairRun:
        gc.collect()
        load = load1()
        one, many = one_factory(), factory()
        ins_one = [one.prepare(s) for s in singles]
        ins_many = many.prepare(blocks)
        n = len(blocks)
        t1, tn = np.zeros(n), np.zeros(n)
        clock = time.perf_counter
        for i in range(n):
            order = (0, 1) if (i + repeat) % 2 == 0 else (1, 0)
            for j in order:
                if j == 0:
                    t0 = clock()
                    for item in ins_one[i]:
                        one.apply(item)
                    t1[i] = clock() - t0
                else:
                    t0 = clock()
                    many.apply(ins_many[i])
                    tn[i] = clock() - t0
        tuples = np.array([len(b) for b in blocks], dtype=np.int64)
        return PairRun(("batch 1", "batch n"), (t1, tn), tuples, load, False, (one, many))

    # ---------------------------------------------------------------- 5. memory
    def memory(self, case: StarCase) -> None:
        out = {}
        for name, factory in (
            ("fivm", self._engine(case.schema, "fivm")),
            ("numpy", lambda: NumpyProgram(case.schema)),
        ):
            out[name] = measure_memory(factory, case.stream)
            out[name].update(self._rss(case, name))
        f, b = out["fivm"], out["numpy"]
        row = {
            "section": "memory",
            "workload": case.name,
            "postcodes": case.postcodes,
            "deletes": case.deletes,
            "batch_size": case.batch_size,
            "program": "fivm",
            "baseline": "numpy",
            "batches": len(case.stream),
            "batches_total": len(case.stream),
            "tuples": case.tuples,
            "stream_tuples": case.tuples,
            "load_min": min(f["load"], b["load"]),
            "load_max": max(f["load"], b["load"]),
        }
        for k in ("rss_peak", "rss_end", "retained", "peak", "arrays"):
            row[f"program_{k}_mib"] = f[k] / 2**20
            row[f"baseline_{k}_mib"] = b[k] / 2**20
            row[f"{k}_ratio"] = f[k] / b[k] if b[k] else float("nan")
        row["baseline_minimal_mib"] = b["minimal"] / 2**20
        row["baseline_scratch_mib"] = b["scratch"] / 2**20
        row["retained_vs_minimal_ratio"] = f["retained"] / b["minimal"]
        self.rows.append(row)
        self.log(
            f"    memory (RSS growth): fivm peak {row['program_rss_peak_mib']:.1f} MiB, end "
            f"{row['program_rss_end_mib']:.1f} MiB; numpy peak {row['baseline_rss_peak_mib']:.1f} "
            f"MiB, end {row['baseline_rss_end_mib']:.1f} MiB; ratios {row['rss_peak_ratio']:.2f} / "
            f"{row['rss_end_ratio']:.2f}"
        )
        self.log(
            f"    memory (tracemalloc): fivm retained {row['program_retained_mib']:.1f} MiB / peak "
            f"{row['program_peak_mib']:.1f} MiB / arrays {row['program_arrays_mib']:.1f} MiB; "
            f"numpy {row['baseline_retained_mib']:.1f} / {row['baseline_peak_mib']:.1f} / "
            f"{row['baseline_arrays_mib']:.1f} MiB; ratios {row['retained_ratio']:.2f} / "
            f"{row['peak_ratio']:.2f} / {row['arrays_ratio']:.2f}"
        )

    def _rss(self, case: StarCase, program: str) -> dict:
        """Peak and final RSS growth of replaying the stream in a fresh subprocess."""
        import json
        import subprocess

        env = dict(os.environ)
        snapshot = os.environ.get("RINGML_BENCH_SNAPSHOT")
        if snapshot:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [snapshot, env.get("PYTHONPATH")]))
        cmd = [
            sys.executable, os.path.abspath(__file__), "--rss-worker", str(case.postcodes),
            repr(case.deletes), str(case.batch_size), str(case.seed), program,
            "1" if getattr(self.args, "allow_absent_deletes", False) else "0",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            self.log(f"    RSS worker failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
            return {"rss_peak": float("nan"), "rss_end": float("nan")}
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        if snapshot and not data["ringml"].startswith(os.path.realpath(snapshot)):
            raise RuntimeError(
                f"RSS worker imported ringml from {data['ringml']}, not the snapshot"
            )
        return data

    # ---------------------------------------------------------------- profile
    def profile(self, case: StarCase, strategy: str, path) -> None:
        import cProfile
        import io
        import pstats

        # replays of the whole stream (fresh maintainers) until PROFILE_SECONDS of apply
        # time under the profiler, so that short streams give a stable listing; the
        # budget cuts a long stream short
        budget = self.args.budget_seconds
        profiler = cProfile.Profile()
        spent = 0.0
        replays = 0
        while replays == 0 or spent < PROFILE_SECONDS:
            prog = EngineProgram(case.schema, strategy)
            items = prog.prepare(case.stream)
            profiler.enable()
            for item in items:
                t0 = time.perf_counter()
                prog.apply(item)
                spent += time.perf_counter() - t0
                if budget > 0 and spent > budget:
                    break
            profiler.disable()
            replays += 1
            if budget > 0 and spent > budget:
                break
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(25)
        listing = text.getvalue()
        snapshot = os.environ.get("RINGML_BENCH_SNAPSHOT")
        if snapshot:
            listing = listing.replace(str(snapshot) + os.sep, "")
        dirty = " + uncommitted changes" if getattr(self.args, "dirty", False) else ""
        header = (
            f"cProfile of {strategy} on {case.name} (deletes {case.deletes:.0%}, batch size "
            f"{case.batch_size}): {replays} replay(s) of the stream, {spent:.2f} s of apply "
            f"under the profiler, load {load1():.2f}; engine commit "
            f"{getattr(self.args, 'commit', '?')}{dirty}"
            f", snapshot sha256 {getattr(self.args, 'engine_hash', '?')}\n"
        )
        path.write_text(header + listing)
        self.profiles.append((f"{strategy} on {case.name}, deletes {case.deletes:.0%}", str(path)))
        self.log(header + "\n".join(listing.splitlines()[:30]))


def _split_rows(b) -> list:
    """A StreamBatch as one-tuple batches, in order."""
    from ringml.datasets import StreamBatch

    rows = b.rows
    return [
        StreamBatch(b.relation, rows.iloc[i : i + 1].reset_index(drop=True),
                    b.multiplicity[i : i + 1], b.row_ids[i : i + 1])
        for i in range(len(rows))
    ]  # fmt: skip


def _owned_nbytes(root) -> int:
    """Bytes of the numpy arrays that own their data, reachable from ``root``."""
    import types

    seen: set[int] = set()
    stack = [root]
    total = 0
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
            types.MethodType, types.CodeType)  # fmt: skip
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            if obj.base is None:
                total += obj.nbytes
            else:
                stack.append(obj.base)
            continue
        stack.extend(gc.get_referents(obj))
    return total


def measure_memory(factory: Callable[[], Program], stream: Sequence) -> dict:
    """tracemalloc around building ``factory()`` and replaying ``stream``: retained, peak."""
    gc.collect()
    load = load1()
    items = None
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        prog = factory()
        items = prog.prepare(stream)
        prepared, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for item in items:
            prog.apply(item)
        del item
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the prepared inputs (UpdateBatch wrappers) are not state
    retained = current - prepared
    if isinstance(prog, NumpyProgram):  # its state; the per-batch scratch buffers apart
        arrays = prog.baseline.state_nbytes()["allocated"]
        minimal = prog.baseline.state_nbytes()["minimal"]
        scratch = sum(b.nbytes for b in prog.baseline._buffers.values())
    else:
        arrays = _owned_nbytes(prog.maintainer)
        minimal = scratch = 0
    del items
    return {
        "retained": retained,
        "peak": peak - prepared,
        "arrays": arrays,
        "minimal": minimal,
        "scratch": scratch,
        "load": load,
        "base": base,
    }


# ============================================================================ reporting
def markdown(harness: Harness, env: dict[str, str], load_after) -> str:
    rows = harness.rows
    memory_rows = [r for r in rows if r["section"] == "memory"]
    lines = ["# Engine benchmark: the shuffled Housing star against hand-written baselines", ""]
    for k, v in env.items():
        lines.append(f"- {k}: {v}")
    lines.append(
        "- load average (1/5/15 min) at end: " + " / ".join(f"{x:.2f}" for x in load_after)
    )
    lines.append("")
    lines.append(
        "Every pair below ran in one process, interleaved batch by batch (see "
        "`benchmarks/README.md`); ratio = summed apply time of the first program / the "
        "second's over the same batches, median (min–max) over the repeats; load = 1-minute "
        "load average at the start of the repeats (min–max)."
    )

    def table(section, title, head, cells, note=""):
        sel = [r for r in rows if r["section"] == section]
        if not sel:
            return
        lines.extend(["", f"## {title}", ""])
        if note:
            lines.extend([note, ""])
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join("---" for _ in head) + "|")
        for r in sel:
            lines.append("| " + " | ".join(cells(r)) + " |")

    def ratio(r, digits=2):
        lo, med, hi = r["ratio_min"], r["ratio_median"], r["ratio_max"]
        return f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"

    def prefix(r):
        pct = 100.0 * r["tuples"] / r["stream_tuples"] if r["stream_tuples"] else 0
        return f"{r['tuples']:,} ({pct:.0f}%)"

    def target(ok, text):
        return f"{'PASS' if ok else 'FAIL'} {text}".strip()

    table(
        "fivm_vs_numpy",
        "1. fivm vs the hand-specialized numpy F-IVM (`star_baseline.py`)",
        ["P", "deletes", "tuples", "fivm tuples/s", "numpy tuples/s", "time ratio fivm/numpy",
         "repeats", "load", "target ≤ 1.3 (stretch ≤ 1.0)"],
        lambda r: [
            f"{r['postcodes']:,}", f"{r['deletes']:.0%}", prefix(r),
            f"{r['program_tuples_per_s']:,.0f}", f"{r['baseline_tuples_per_s']:,.0f}", ratio(r),
            str(r["repeats"]), f"{r['load_min']:.2f}–{r['load_max']:.2f}",
            (target(r["ratio_median"] <= TARGET_FIVM_RATIO,
                    "(stretch " + ("met" if r["ratio_median"] <= STRETCH_FIVM_RATIO
                                   else "not met") + ")")
             if r["postcodes"] >= 5000 else "(stated for P ≥ 5000)"),
        ],
    )  # fmt: skip
    table(
        "first_order_vs_pandas",
        "2. first_order vs plain pandas first-order IVM (`star_pandas_first_order.py`)",
        ["P", "deletes", "tuples (prefix)", "first_order tuples/s", "pandas tuples/s",
         "time ratio first_order/pandas", "repeats", "load", "target ≤ 1.5"],
        lambda r: [
            f"{r['postcodes']:,}", f"{r['deletes']:.0%}", prefix(r),
            f"{r['program_tuples_per_s']:,.0f}", f"{r['baseline_tuples_per_s']:,.0f}", ratio(r),
            str(r["repeats"]), f"{r['load_min']:.2f}–{r['load_max']:.2f}",
            target(r["ratio_median"] <= TARGET_FIRST_ORDER_RATIO, ""),
        ],
        "A repeat stops after the batch during which the pair's summed time passed "
        "`--slow-budget-seconds`; both programs are timed on the same prefix.",
    )  # fmt: skip
    reference = {
        (r["postcodes"], r["deletes"]): r for r in rows if r["section"] == "categorical_reference"
    }

    def reference_cells(r):
        ref = reference.get((r["postcodes"], r["deletes"]))
        if ref is None:
            return ["", ""]
        return [
            f"{ref['program_tuples_per_s']:,.0f} / {ref['baseline_tuples_per_s']:,.0f}",
            ratio(ref),
        ]

    table(
        "categorical_shuffled_vs_stored",
        "3. Categorical ring (8 categorical + 18 continuous): shuffled vs stored order",
        ["P", "deletes", "tuples (prefix)", "shuffled tuples/s", "stored-order tuples/s",
         "time ratio shuffled/stored", "repeats", "load", "target ≤ 2",
         "numpy one-hot tuples/s shuffled / stored", "numpy one-hot time ratio shuffled/stored"],
        lambda r: [
            f"{r['postcodes']:,}", f"{r['deletes']:.0%}", prefix(r),
            f"{r['program_tuples_per_s']:,.0f}", f"{r['baseline_tuples_per_s']:,.0f}", ratio(r),
            str(r["repeats"]), f"{r['load_min']:.2f}–{r['load_max']:.2f}",
            target(r["ratio_median"] <= TARGET_CATEGORICAL_RATIO, ""),
            *reference_cells(r),
        ],
        "`covariance_query(schema, categorical=[nbbedrooms, nbbathrooms, house, flat, parking, "
        "pricerangeshop, typeeducation, pricerangerest])` (pipelines/main_job.py's 8), fivm, on "
        "the shuffled stream and on the stream of the relations in stored order (rows grouped "
        "by postcode, same batch sizes, same relation per batch), interleaved batch by batch. "
        "Reference: the same two streams, one-hot expanded (untimed), into the hand-specialized "
        "numpy program (`star_baseline.py`) over the one-hot columns, interleaved the same way "
        "in separate repeats, on the prefix fivm was timed on. The stored order is a "
        "cheaper stream, not the same work in another order: its batches touch 2.5x (P = "
        "1000) to 3.5x (P = 50,000) fewer distinct postcodes, so each batch has fewer "
        "groups to multiply with the siblings and adds into consecutive state rows.",
    )  # fmt: skip
    table(
        "batch1_vs_batch1000",
        "4. Batch size 1 vs 1000 on the same tuples",
        ["P", "deletes", "program", "tuples", "batch-1 tuples/s", "batch-1000 tuples/s",
         "batch-1 throughput / batch-1000", "repeats", "load", "target ≥ 1/3 (fivm)"],
        lambda r: [
            f"{r['postcodes']:,}", f"{r['deletes']:.0%}", r["program"].split()[0],
            f"{r['tuples']:,}",
            f"{r['program_tuples_per_s']:,.0f}", f"{r['baseline_tuples_per_s']:,.0f}",
            f"{r['throughput_fraction_median']:.3f} ({r['throughput_fraction_min']:.3f}–"
            f"{r['throughput_fraction_max']:.3f})",
            str(r["repeats"]), f"{r['load_min']:.2f}–{r['load_max']:.2f}",
            target(r["throughput_fraction_median"] >= TARGET_BATCH1_FRACTION, "")
            if r["program"].startswith("fivm") else "(reference)",
        ],
        "The stream's first batches (at least `--batch1-tuples` tuples), applied one tuple per "
        "`apply` and, interleaved per 1000-batch block, in their batches of 1000; "
        "fivm-coalesced: one tuple per `MicroBatcher.insert`/`delete` (`max_rows` = 1000, "
        "flushed at the end of each block), i.e. one `apply` per block.",
    )  # fmt: skip
    table(
        "memory",
        "5. Memory (untimed replays of the whole stream, one program at a time)",
        ["P", "deletes", "RSS peak MiB fivm / numpy", "ratio", "RSS end MiB fivm / numpy",
         "traced retained MiB fivm / numpy", "traced peak MiB fivm / numpy",
         "arrays MiB fivm / numpy", "ratios retained / peak / arrays", "load",
         "target ≤ 1.3 (P = 50,000, RSS peak)"],
        lambda r: [
            f"{r['postcodes']:,}", f"{r['deletes']:.0%}",
            f"{r['program_rss_peak_mib']:.1f} / {r['baseline_rss_peak_mib']:.1f}",
            f"{r['rss_peak_ratio']:.2f}",
            f"{r['program_rss_end_mib']:.1f} / {r['baseline_rss_end_mib']:.1f}",
            f"{r['program_retained_mib']:.1f} / {r['baseline_retained_mib']:.1f}",
            f"{r['program_peak_mib']:.1f} / {r['baseline_peak_mib']:.1f}",
            f"{r['program_arrays_mib']:.1f} / {r['baseline_arrays_mib']:.1f}",
            f"{r['retained_ratio']:.2f} / {r['peak_ratio']:.2f} / {r['arrays_ratio']:.2f}",
            f"{r['load_min']:.2f}",
            target(r["rss_peak_ratio"] <= TARGET_MEMORY_RATIO, "")
            if r["postcodes"] >= 50000 else "",
        ],
        "RSS = resident memory of a fresh subprocess that builds the stream, then (peak reset "
        "with `clear_refs`) builds the program and replays the stream: peak = `VmHWM` − RSS "
        "before, end = `VmRSS` − RSS before (freed memory the allocator keeps counts). "
        "Pages that were allocated but never written (e.g. zero-filled capacity) cost no RSS "
        "but count in tracemalloc. "
        "Traced retained = tracemalloc's traced memory still allocated after an in-process "
        "replay (the state), traced peak = its maximum during the replay (state plus "
        "per-batch transients), both net of the prepared inputs; arrays = bytes of the numpy "
        "arrays reachable from the Maintainer / the baseline's state arrays as allocated "
        "(grown in place in 1.5x steps; its reused per-batch scratch buffers, "
        + ", ".join(sorted({f"{r['baseline_scratch_mib']:.1f} MiB" for r in memory_rows}))
        + ", are in the traced figures only). The baseline's minimal layout (124 float64 per "
        "postcode + the root) is "
        + ", ".join(f"{r['baseline_minimal_mib']:.1f} MiB at P={r['postcodes']:,}"
                    for r in rows if r["section"] == "memory" and r["deletes"] == min(
                        x["deletes"] for x in rows if x["section"] == "memory"))
        + "; fivm retained / that minimal layout: "
        + ", ".join(f"{r['retained_vs_minimal_ratio']:.2f} (P={r['postcodes']:,}, deletes "
                    f"{r['deletes']:.0%})" for r in rows if r["section"] == "memory")
        + ".",
    )  # fmt: skip
    lines += ["", "## Correctness", ""]
    bad = [c for c in harness.checks if not c[1]]
    lines.append(
        f"{len(harness.checks)} checks (count exact, Σx and Σxxᵀ within 1e-9 relative), "
        f"{len(bad)} failed."
    )
    lines.append("")
    # the final check of every comparison (a repeat's own checks repeat the same text)
    final: dict[str, tuple[bool, float]] = {}
    for text, ok, diff in harness.checks:
        if text in final:
            ok, diff = ok and final[text][0], max(diff, final[text][1])
        final[text] = (ok, diff)
    periodic = {}
    for text, (ok, diff) in final.items():
        stem = text.split(" after ")[0]
        periodic.setdefault(stem, []).append((text, ok, diff))
    for items in periodic.values():
        text, ok, diff = items[-1]
        all_ok = all(i[1] for i in items)
        worst = max(i[2] for i in items)
        more = (
            f"; {len(items) - 1} other check(s) of this comparison, worst {worst:.1e}"
            if len(items) > 1
            else ""
        )
        lines.append(
            f"- {text}: {'ok' if all_ok else '**MISMATCH**'} "
            f"(max relative difference {diff:.1e}{more})"
        )
    worst = max((c[2] for c in harness.checks), default=0.0)
    lines.append(
        f"- largest relative difference over all {len(harness.checks)} checks: {worst:.1e}"
    )
    lines += ["", "## Workloads", ""]
    lines += harness.workload_lines
    if harness.profiles:
        lines += ["", "## Profiles", ""]
        for what, path in harness.profiles:
            lines.append(f"- {what}: `{os.path.basename(path)}`")
    return "\n".join(lines) + "\n"


def run(args, compare, log, env_fn, out_dir, tag) -> int:
    """Run the shuffled-star workloads named in ``args.workload``; write ``tag``.md/.csv."""
    import csv
    from pathlib import Path

    names = []
    for w in args.workload:
        for n in WORKLOADS if w == ALIAS else [w]:
            if n in WORKLOADS and n not in names:
                names.append(n)
    deletes = args.shuffled_deletes
    harness = Harness(args, compare, log)
    load_before = os.getloadavg()
    sections = set(args.sections)
    for name in names:
        postcodes = int(name.rsplit("-", 1)[1])
        for d in deletes:
            start = time.perf_counter()
            case = build_case(postcodes, d, args.batch_size, args.seed)
            log(
                f"{case.name}, deletes {d:.0%}: {len(case.stream)} batches, {case.tuples:,} "
                f"tuples, built in {time.perf_counter() - start:.1f} s; load {load1():.2f}"
            )
            if "fivm" in sections:
                harness.fivm_vs_numpy(case)
            if "first_order" in sections:
                harness.first_order_vs_pandas(case)
            if "categorical" in sections:
                harness.categorical(case)
            first_variant = d == deletes[0]  # batch size 1: one variant unless asked
            if (
                "batch1" in sections
                and args.batch1_tuples > 0
                and (first_variant or args.all_variants)
            ):
                harness.batch_one(case)
            if "memory" in sections:
                harness.memory(case)
            wanted = getattr(args, "profile_workloads", None)
            if args.profile is not None and (not wanted or case.name in wanted):
                for strategy in args.profile or ["fivm"]:
                    path = (
                        Path(out_dir) / f"profile-{strategy}-{case.name}"
                        f"{'-deletes' + str(round(100 * d)) if d else ''}.txt"
                    )
                    harness.profile(case, strategy, path)
            sizes = {r: len(f) for r, f in case.relations.items()}
            harness.workload_lines.append(
                f"- **{case.name}**, deletes {case.deletes:.0%}: {len(case.stream)} batches, "
                f"{case.tuples:,} tuples; relation sizes {sizes}; a House batch of the shuffled "
                f"stream touches {touched_postcodes(case.stream):.0f} postcodes on average "
                f"({touched_postcodes(case.stored_stream()):.0f} in stored order)"
            )
            del case
            gc.collect()
    load_after = os.getloadavg()
    env = env_fn(load_before)
    md = markdown(harness, env, load_after)
    out = Path(out_dir)
    (out / f"{tag}.md").write_text(md)
    fields: list[str] = []
    for r in harness.rows:
        for k in r:
            if k not in fields:
                fields.append(k)
    with open(out / f"{tag}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields or ["section"])
        writer.writeheader()
        writer.writerows(harness.rows)
    log(f"load average at end: {' / '.join(f'{x:.2f}' for x in load_after)}")
    log(f"wrote {out / (tag + '.md')} and {tag}.csv")
    failed = [c for c in harness.checks if not c[1]]
    if failed:
        log(f"{len(failed)} correctness check(s) FAILED")
        return 1
    return 0


# ============================================================================ RSS worker
def _status_kib(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def rss_worker(argv: Sequence[str]) -> None:
    """``P deletes batch_size seed program allow``: replay the case's stream into a fresh
    program; print JSON with the peak (VmHWM after clear_refs) and final RSS growth over the
    RSS before the program was built (the stream and its inputs excluded), in bytes."""
    import json

    import ringml

    postcodes, deletes, batch_size, seed, program, allow = argv
    case = build_case(int(postcodes), float(deletes), int(batch_size), int(seed))
    if program == "numpy":
        prog: Program = NumpyProgram(case.schema)
        items = prog.prepare(case.stream)
        prog = None
    else:
        items = EngineProgram(case.schema, program).prepare(case.stream)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    if program == "numpy":
        prog = NumpyProgram(case.schema)
    else:
        prog = EngineProgram(case.schema, program, allow_absent_deletes=allow == "1")
    for item in items:
        prog.apply(item)
    gc.collect()
    peak, end = _status_kib("VmHWM"), _status_kib("VmRSS")
    print(json.dumps({
        "rss_peak": 1024 * (peak - before),
        "rss_end": 1024 * (end - before),
        "ringml": os.path.realpath(os.path.dirname(ringml.__file__)),
    }))  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rss-worker"]:
        rss_worker(sys.argv[2:])
    else:
        sys.exit("run benchmarks/engine.py --workload star-shuffled (this module is its harness)")
