"""ringml's main job: a change stream through Spark into fresh models, tracked in MLflow.

``ringml demo`` (and ``bash scripts/demo.sh``) runs :func:`run_main_job`:

1. generate a Housing-like star (:func:`ringml.datasets.housing_star`, six relations on
   ``postcode``) and a stream of inserts and deletes of earlier inserts
   (:func:`ringml.datasets.build_stream`), written as CSV change-feed files tagged with the
   relation name, plus a few malformed rows (an unknown relation, a mistyped value, a
   delete of a row that was never inserted);
2. read them with Spark Structured Streaming (local mode, one file per micro-batch) into a
   :class:`~ringml.pipelines.spark_stream.StreamingMaintainer`: every micro-batch is applied
   exactly once to the F-IVM view tree of one generalized covariance payload over the join
   (never materialized) and committed with its batch id; malformed rows go to a dead-letter
   folder;
3. after every micro-batch, refit from that one payload a linear model of ``price``
   (:class:`~ringml.models.JoinRegressor`, warm-started gradient descent, categorical
   features one-hot inside the solver) and the Chow–Liu tree of the categorical variables
   (their pairwise count tables are part of the same payload), and log the refresh to
   MLflow (:class:`~ringml.pipelines.mlflow_tracking.RefreshLogger`, a SQLite store in the
   work folder; the model is registered and the ``champion`` alias moves when the holdout
   RMSE improves);
4. report throughput, the coefficients and the tree checked against a recomputation on the
   materialized final join (scikit-learn and networkx), the dead letters, and where the
   MLflow runs are with the command that opens the MLflow UI on them.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd
from ringml.models import JoinRegressor
from ringml.models.mutual_information import chow_liu_tree, mutual_information_matrix

from ringml.datasets import build_stream, final_state, housing_star

from .mlflow_tracking import PromotionRule, RefreshLogger
from .spark_session import local_session, spark_unavailable
from .spark_stream import ChangeFeed, StreamingMaintainer, spark_types_of, write_stream_files

__all__ = [
    "CATEGORICAL", "CONTINUOUS", "LABEL", "JobConfig", "JobReport", "JobSetupError",
    "run_main_job",
]  # fmt: skip

LABEL = "price"
CONTINUOUS = [
    "livingarea", "kitchensize", "garden", "openinghoursshop", "sizeinstitution",
    "averagesalary", "crimesperyear", "unemployment", "nbbuslines", "distancecitycentre",
]  # fmt: skip
# property type is one-hot in house/flat/unknown: two of them, or they are collinear with
# the intercept
CATEGORICAL = [
    "nbbedrooms", "nbbathrooms", "house", "flat", "parking", "pricerangeshop",
    "typeeducation", "pricerangerest",
]  # fmt: skip


@dataclass(frozen=True)
class JobConfig:
    """The main job's knobs (``ringml demo --help`` documents them)."""

    postcodes: int = 1000
    delete_fraction: float = 0.3
    batch_size: int = 1000
    micro_batches: int = 24
    seed: int = 0
    ridge: float = 1e-3
    workdir: str = "ringml-demo"
    tracking_uri: str | None = None
    master: str = "local[2]"
    experiment: str = "ringml-demo"
    model_name: str = "ringml-housing-price"
    min_improvement: float = 0.01
    malformed_rows: bool = True
    progress: bool = True


@dataclass
class JobReport:
    """What the job did and measured (``run_main_job``'s return value)."""

    tuples: int = 0
    micro_batches: int = 0
    seconds: float = 0.0
    pipeline_seconds: float = 0.0
    refresh_seconds: float = 0.0
    join_rows: int = 0
    coef_max_rel_error: float = math.nan
    prediction_max_rel_error: float = math.nan
    mi_max_abs_error: float = math.nan
    tree_equal: bool = False
    dead_letters: pd.DataFrame = field(default_factory=pd.DataFrame)
    refreshes: int = 0
    promotions: int = 0
    champion: str | None = None
    run_id: str = ""
    tracking_uri: str = ""

    @property
    def ok(self) -> bool:
        """The model and the tree agree with the recomputation on the final join."""
        return (
            self.coef_max_rel_error < 1e-6
            and self.prediction_max_rel_error < 1e-6
            and self.mi_max_abs_error < 1e-9
            and self.tree_equal
        )


class JobSetupError(RuntimeError):
    """The job cannot start here (no Spark, a work folder it would overwrite); it wrote
    nothing."""


#: the file that marks a work folder as the demo's: only there it deletes its sub-folders
MARKER = ".ringml-demo"
_PER_RUN = ("feeds", "checkpoint", "state", "dead-letters")


def _fresh_workdir(workdir: Path) -> dict[str, Path]:
    """Sub-folders of one run; the stream's state is new each run, the MLflow store stays.

    Raises :class:`JobSetupError` when ``workdir`` holds one of the per-run sub-folders
    but not the :data:`MARKER` of an earlier run: they are someone else's.
    """
    paths = {name: workdir / name for name in (*_PER_RUN, "mlflow")}
    if not (workdir / MARKER).is_file():
        for name in _PER_RUN:
            if paths[name].exists():
                raise JobSetupError(
                    f"{paths[name]} exists, and the demo did not make it (no {MARKER} file "
                    f"in {workdir}); each run deletes its {', '.join(_PER_RUN)} there, so "
                    "move that folder away or choose another --workdir"
                )
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).write_text(
        f"ringml demo's work folder: each run deletes {', '.join(_PER_RUN)} here\n",
        encoding="utf-8",
    )
    for name in _PER_RUN:
        shutil.rmtree(paths[name], ignore_errors=True)
    paths["mlflow"].mkdir(exist_ok=True)
    return paths


def _malformed_rows(columns: list[str], data) -> pd.DataFrame:
    """Three rows the pipeline must route to its dead letters."""
    house = data.relations["House"].iloc[[0]].to_dict("records")[0]
    unknown = {"relation": "Hose", "op": "insert", **house}
    mistyped = {"relation": "House", "op": "insert", **house, "price": "n/a"}
    absent = {"relation": "House", "op": "delete", **house, "price": -1.0}
    return pd.DataFrame([unknown, mistyped, absent]).reindex(columns=columns)


def _write_feed(paths: dict[str, Path], stream, data, config: JobConfig) -> tuple[ChangeFeed, int]:
    """The stream as CSV files, one per micro-batch; returns the feed and its row count."""
    types = spark_types_of(data.relations)
    per_file = max(1, math.ceil(len(stream) / max(1, config.micro_batches)))
    files = write_stream_files(paths["feeds"], stream, per_file=per_file, columns=types)
    rows = sum(len(b.rows) for b in stream)
    if config.malformed_rows and len(files) > 1:
        middle = files[len(files) // 2]
        frame = pd.read_csv(middle, dtype=str, keep_default_na=False)
        bad = _malformed_rows(list(frame.columns), data).astype(object)
        mtime = os.path.getmtime(middle)
        merged = pd.concat([frame, bad.where(bad.notna(), "")], ignore_index=True)
        merged.to_csv(middle, index=False)
        os.utime(middle, (mtime, mtime))
        rows += len(bad)
    feed = ChangeFeed(str(paths["feeds"]), types, relation=None, max_files_per_trigger=1)
    return feed, rows


def _categorical_tree(model: JoinRegressor) -> tuple[pd.DataFrame, nx.Graph]:
    """MI matrix (bits) and Chow–Liu tree of the categorical variables, from the payload."""
    tables = model.query_.ring.count_tables(model.maintainer_.result())
    mi = mutual_information_matrix(tables, CATEGORICAL)
    return mi, chow_liu_tree(mi)


def _design(flat: pd.DataFrame, columns) -> np.ndarray:
    """The solver's design matrix on the flat join: continuous columns and one-hot
    ``(variable, category)`` columns."""
    out = [
        (flat[c[0]] == c[1]).to_numpy(dtype=float) if isinstance(c, tuple) else flat[c].to_numpy()
        for c in columns
    ]
    return np.column_stack(out).astype(float)


def _join_on_postcode(first: pd.DataFrame, others) -> pd.DataFrame:
    """``first`` joined with each of ``others`` on ``postcode``, in order (pandas)."""
    flat = first
    for frame in others:
        flat = flat.merge(frame, on="postcode")
    return flat


def _check_tree(model: JoinRegressor, flat: pd.DataFrame) -> tuple[float, bool, nx.Graph]:
    """The model's Chow–Liu tree (from its payload) against scikit-learn's
    mutual_info_score and networkx on the materialized join ``flat``: the largest MI
    difference (bits), whether the trees agree, and the model's tree."""
    from sklearn.metrics import mutual_info_score

    mi_ours, tree = _categorical_tree(model)
    names = CATEGORICAL
    mi = np.array(
        [[mutual_info_score(flat[a], flat[b]) / math.log(2) for b in names] for a in names]
    )
    error = float(np.max(np.abs(mi - mi_ours.loc[names, names].to_numpy())))
    graph = nx.Graph()
    for i, a in enumerate(names):
        for j in range(i + 1, len(names)):
            graph.add_edge(a, names[j], weight=mi[i, j])
    reference = nx.maximum_spanning_tree(graph)
    same = {frozenset(e) for e in tree.edges()} == {frozenset(e) for e in reference.edges()}
    return error, same, tree


def _coef_names(model: JoinRegressor) -> list[str]:
    """The model's column names; one-hot ``(variable, category)`` ones as ``variable=category``."""
    return [c if isinstance(c, str) else f"{c[0]}={c[1]}" for c in model.columns_]


def _require_spark() -> None:
    """Quiet MLflow, bind Spark to the loopback address; raise when Spark cannot start."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no loopback-address warning
    reason = spark_unavailable()
    if reason is not None:
        raise JobSetupError(f"the main job needs Spark: {reason} (scripts/demo.sh installs it)")


def _drain(streaming, spark, feed, checkpoint: Path, query_name: str) -> float:
    """Run ``streaming`` over every file of ``feed`` now there (``availableNow``) and wait
    for it; returns the seconds it took, raises the first error of its batch callback."""
    stream_start = time.perf_counter()
    query = streaming.start(
        spark, feed, checkpoint, trigger={"availableNow": True}, query_name=query_name
    )
    query.awaitTermination()
    seconds = time.perf_counter() - stream_start
    if streaming.errors:
        raise streaming.errors[0]
    return seconds


def _recompute(model: JoinRegressor, stream, ridge: float) -> dict[str, Any]:
    """Refit with scikit-learn and networkx on the materialized final join: the largest
    relative differences of coefficients and of predictions (relative to the label's
    spread), the largest MI difference, whether the trees agree, the join's row count."""
    from sklearn.linear_model import LinearRegression, Ridge

    frames = list(final_state(stream).values())
    flat = _join_on_postcode(frames[0], frames[1:])
    X, y = _design(flat, model.columns_), flat[LABEL].to_numpy(dtype=float)
    sk = (Ridge(alpha=ridge * len(flat)) if ridge else LinearRegression()).fit(X, y)
    ours = np.append(model.coef_, model.intercept_)
    theirs = np.append(sk.coef_, sk.intercept_)
    coef_error = float(np.max(np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-12)))
    spread = max(float(np.std(y)), 1e-12)
    prediction_error = float(np.max(np.abs(model.predict(flat) - sk.predict(X)))) / spread
    mi_error, same, _ = _check_tree(model, flat)
    return {
        "coef_max_rel_error": coef_error,
        "prediction_max_rel_error": prediction_error,
        "mi_max_abs_error": mi_error,
        "tree_equal": same,
        "rows": len(flat),
    }


class _Progress:
    """A rich progress bar over the feed's rows (a no-op when disabled)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("[bold]streaming[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("rows · {task.fields[status]}"),
                TimeElapsedColumn(),
            )
            self._task = self._bar.add_task("stream", total=total, status="starting Spark")

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, rows: int, status: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=rows, status=status)

    def log(self, text: str, out: Callable[[str], Any]) -> None:
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            out(text)


def run_main_job(config: JobConfig = JobConfig(), out: Callable[[str], Any] = print) -> JobReport:
    """Run the main job (module docstring) and print its report through ``out``."""
    _require_spark()
    started = time.perf_counter()
    workdir = Path(config.workdir).resolve()
    data = housing_star(postcodes=config.postcodes, seed=config.seed)
    schemas = data.schemas
    stream = build_stream(
        data.relations,
        batch_size=config.batch_size,
        delete_fraction=config.delete_fraction,
        seed=config.seed,
    )
    holdout = housing_star(postcodes=max(10, config.postcodes // 5), seed=config.seed + 1000)
    holdout = holdout.join()[[*CONTINUOUS, *CATEGORICAL, LABEL]]
    holdout = holdout.sample(min(5000, len(holdout)), random_state=config.seed)

    model = JoinRegressor(  # the holdout may hold categories the stream has not brought yet
        schemas,
        LABEL,
        CONTINUOUS + CATEGORICAL,
        CATEGORICAL,
        ridge=config.ridge,
        handle_unknown="ignore",
    ).fit()
    paths = _fresh_workdir(workdir)  # the config held: now the disk
    feed, feed_rows = _write_feed(paths, stream, data, config)
    # under `mlflow run`, MLFLOW_TRACKING_URI and MLFLOW_RUN_ID say where to log
    tracking_uri = config.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    logger = RefreshLogger(
        config.model_name,
        experiment=config.experiment,
        tracking_uri=tracking_uri,
        store_dir=None if tracking_uri else paths["mlflow"],
        run_name=f"housing-{config.postcodes}pc-stream",
        holdout=holdout.reset_index(drop=True),
        promotion=PromotionRule(min_relative_improvement=config.min_improvement),
        extra_params={
            "postcodes": config.postcodes,
            "delete_fraction": config.delete_fraction,
            "batch_size": config.batch_size,
            "micro_batches": config.micro_batches,
            "spark_master": config.master,
        },
    )
    deletes = sum(int((np.asarray(b.multiplicity) < 0).sum()) for b in stream)
    out(
        f"Housing-like star: 6 relations, {config.postcodes:,} postcodes; change feed of "
        f"{feed_rows:,} rows ({deletes:,} deletes) in {paths['feeds']}"
    )
    report = JobReport(tracking_uri=logger.tracking_uri)
    spark = local_session(config.master, app_name="ringml-demo")
    with logger, _Progress(feed_rows, config.progress) as progress:
        tree_holder: dict[str, Any] = {}

        def refresh(batch) -> None:
            t0 = time.perf_counter()
            model.partial_fit([])  # no rows: refit from the maintained payload
            mi, tree = _categorical_tree(model)
            tree_holder["mi"], tree_holder["tree"] = mi, tree
            refit = time.perf_counter() - t0
            report.refresh_seconds += refit
            record = logger.log_refresh(
                model,
                rows_applied=batch.applied,
                seconds=batch.seconds + refit,
                step=batch.batch_id,  # the batch number the report and dead letters show
                extra_metrics={
                    "inserts": batch.inserts,
                    "deletes": batch.deletes,
                    "bad_rows": len(batch.bad_rows),
                    "chow_liu_total_mi": sum(w for *_, w in tree.edges(data="weight")),
                },
            )
            report.pipeline_seconds += batch.seconds
            rmse = record.metrics.get("holdout_rmse", math.nan)
            progress.advance(batch.rows, f"batch {batch.batch_id}, holdout RMSE {rmse:,.0f}")
            if batch.bad_rows:
                progress.log(
                    f"  batch {batch.batch_id}: {len(batch.bad_rows)} malformed row(s) "
                    "-> dead letters",
                    out,
                )
            if record.promoted:
                progress.log(
                    f"  batch {batch.batch_id}: holdout RMSE {rmse:,.0f} -> "
                    f"{config.model_name} v{record.version} is the champion",
                    out,
                )

        streaming = StreamingMaintainer(
            model.maintainer_,
            paths["state"],
            on_error="dead_letter",
            dead_letter_path=paths["dead-letters"],
            on_batch=refresh,
        )
        report.seconds = _drain(streaming, spark, feed, paths["checkpoint"], "ringml")
        if "tree" in tree_holder:
            logger.log_chow_liu(  # the MI matrix: mutual_info.csv beside the tree
                tree_holder["mi"], title="Chow-Liu tree of the categorical variables"
            )
        report.run_id = logger.run_id
    report.micro_batches = len(streaming.reports)
    report.tuples = sum(r.applied for r in streaming.reports)
    report.refreshes = len(logger.records)
    report.promotions = sum(r.promoted for r in logger.records)
    champion = logger.champion()
    report.champion = champion[0] if champion else None
    report.dead_letters = streaming.dead_letters()
    check = _recompute(model, stream, config.ridge)
    rows = check.pop("rows")
    for name, value in check.items():
        setattr(report, name, value)
    report.join_rows = model.n_samples_seen_
    _print_report(report, model, tree_holder.get("tree"), rows, workdir, out)
    out(f"total time {time.perf_counter() - started:.1f} s")
    return report


def _print_report(
    report: JobReport, model: JoinRegressor, tree, flat_rows: int, workdir: Path, out
) -> None:
    out(
        f"\nstreamed {report.tuples:,} changes in {report.micro_batches} micro-batches in "
        f"{report.seconds:.1f} s: {report.tuples / report.seconds:,.0f} changes/s end to end "
        f"(Spark, engine, checkpoints, refits, MLflow); the engine and its exactly-once "
        f"commits took {report.pipeline_seconds:.2f} s "
        f"({report.tuples / max(report.pipeline_seconds, 1e-9):,.0f} changes/s), "
        f"the {report.refreshes} refits and refresh logs {report.refresh_seconds:.2f} s"
    )
    out(
        f"the join has {report.join_rows:,} rows (never materialized); "
        f"model of {LABEL!r} on {len(model.columns_)} columns:"
    )
    coef = pd.Series(model.coef_, index=_coef_names(model))
    top = coef.reindex(coef.abs().sort_values(ascending=False).index[:6])
    for name, value in top.items():
        out(f"  {name:<22} {value:>14,.3f}")
    out(f"  {'(intercept)':<22} {model.intercept_:>14,.3f}")
    verdict = "equal" if report.coef_max_rel_error < 1e-6 else "DIFFERENT"
    fits = "equal" if report.prediction_max_rel_error < 1e-6 else "DIFFERENT"
    out(
        f"check against scikit-learn on the materialized final join ({flat_rows:,} rows): "
        f"coefficients {verdict} (max relative difference {report.coef_max_rel_error:.1e}), "
        f"predictions {fits} (max difference {report.prediction_max_rel_error:.1e} label SDs)"
    )
    _print_tree_check(report, tree, "Chow-Liu tree of the categorical variables", out)
    dead = report.dead_letters
    out(f"dead letters: {len(dead)} row(s) in {workdir / 'dead-letters'}")
    for row in dead.itertuples():
        out(f"  batch {row.batch_id}: {row.reason}")
    champion = f"v{report.champion}" if report.champion else "none"
    out(
        f"MLflow: run {report.run_id} ({report.refreshes} refreshes, {report.promotions} "
        f"promotion(s), champion {champion}) in {report.tracking_uri}"
    )
    if report.tracking_uri.startswith("sqlite:"):
        out(f"open the UI: mlflow ui --backend-store-uri {report.tracking_uri}")
    else:
        out(f"open the UI: {report.tracking_uri}")


def _print_tree_check(report, tree, heading: str, out) -> None:
    """The Chow–Liu tree's edges under ``heading`` and its check (nothing without a tree)."""
    if tree is not None:
        edges = ", ".join(f"{u}–{v}" for u, v in tree.edges())
        same = "the same tree" if report.tree_equal else "a DIFFERENT tree"
        out(
            f"{heading}: {edges}\n"
            f"check against scikit-learn's mutual_info_score and networkx: {same} "
            f"(max MI difference {report.mi_max_abs_error:.1e} bits)"
        )
