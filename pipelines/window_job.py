"""ringml's main job, window mode: a model over the last N days of a join, kept fresh by Spark.

``ringml demo --window 14`` runs :func:`run_window_job`:

1. generate a Housing-like star (:func:`ringml.datasets.housing_star`) whose House rows are
   **sales with a sale time** spread over ``days`` days (:func:`housing_sales`), in a
   drifting market: the price per m² rises by 60 % over the period and gardens go from a
   discount to a premium; the other five relations (shops, schools, ...) are loaded once;
2. write the sales as CSV change-feed files, one per micro-batch of ``days_per_batch`` days
   of arrivals, each sale arriving up to ``lateness_days`` after it happened (out of
   order), plus a few sales reported days late;
3. read them with Spark Structured Streaming (local mode, ``withWatermark`` on the sale
   time) into a windowed :class:`~ringml.models.JoinRegressor` through
   :class:`~ringml.pipelines.spark_windows.StreamingWindows`: every micro-batch appends the
   new sales, moves the watermark (latest sale time seen minus the lateness) and deletes
   the days that left the ``RANGE N DAYS`` window from the maintained covariance payload
   of the join, in one atomic apply committed with its batch id (exactly once); the late
   sales go to the dead letters;
4. after every micro-batch refit the price model from that payload (warm-started gradient
   descent, categorical features one-hot inside the solver), check it against
   scikit-learn's Ridge on the windowed join materialized by pandas, score it on held-out
   sales of the window's days beside a model of the whole history, and log the refresh to
   MLflow with its coefficients; at the end log the coefficients and holdout errors over
   event time as a plot (``history/history.png``) and the Chow–Liu tree of the categorical
   variables over the window (checked against scikit-learn and networkx);
5. report throughput, the coefficients at the first and the last window against the whole
   history's, the checks, the dead letters and where the MLflow run and the plot are.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from ringml.models import JoinRegressor

from ringml.datasets import housing_star
from ringml.windows import StreamTable

from .main_job import (
    CATEGORICAL,
    CONTINUOUS,
    LABEL,
    _check_tree,
    _coef_names,
    _design,
    _drain,
    _fresh_workdir,
    _join_on_postcode,
    _print_tree_check,
    _Progress,
    _require_spark,
)
from .mlflow_tracking import RefreshLogger
from .spark_session import local_session
from .spark_stream import ChangeFeed, spark_types_of, write_change_file
from .spark_windows import StreamingWindows

__all__ = ["START", "WindowJobConfig", "WindowJobReport", "housing_sales", "run_window_job"]

#: the first day of the generated sales
START = pd.Timestamp("2026-01-01")
#: coefficients drawn in the plot (one-hot columns are drawn as they are, in label units)
PLOTTED = ["livingarea", "garden", "distancecitycentre", "averagesalary", "kitchensize"]


@dataclass(frozen=True)
class WindowJobConfig:
    """The window mode's knobs (``ringml demo --help`` documents them)."""

    window_days: int = 14
    days: int = 60
    days_per_batch: int = 3
    lateness_days: float = 1.0
    postcodes: int = 500
    sales_per_postcode: int = 20
    late_sales: int = 3
    seed: int = 0
    ridge: float = 1e-3
    workdir: str = "ringml-demo-window"
    tracking_uri: str | None = None
    master: str = "local[2]"
    experiment: str = "ringml-demo-window"
    model_name: str = "ringml-window-price"
    progress: bool = True


@dataclass
class WindowJobReport:
    """What the window job did and measured (``run_window_job``'s return value)."""

    sales: int = 0
    micro_batches: int = 0
    seconds: float = 0.0
    pipeline_seconds: float = 0.0
    refresh_seconds: float = 0.0
    check_seconds: float = 0.0
    window_rows: int = 0
    history_rows: int = 0
    watermark: Any = None
    refreshes: int = 0
    #: over every refresh: the largest difference to scikit-learn's Ridge on the windowed
    #: join, of the coefficients times the features' SDs (relative to their norm) and of
    #: the fitted values (in label SDs)
    coef_max_rel_error: float = math.nan
    prediction_max_rel_error: float = math.nan
    mi_max_abs_error: float = math.nan
    tree_equal: bool = False
    holdout_rmse_window: list[float] = field(default_factory=list)
    holdout_rmse_history: list[float] = field(default_factory=list)
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    history: dict[str, float] = field(default_factory=dict)
    dead_letters: pd.DataFrame = field(default_factory=pd.DataFrame)
    run_id: str = ""
    tracking_uri: str = ""
    plot: str = ""

    @property
    def ok(self) -> bool:
        """The windowed model and tree agreed with the recomputations on the windowed join."""
        return (
            self.refreshes > 0
            and self.coef_max_rel_error < 1e-6
            and self.prediction_max_rel_error < 1e-6
            and self.mi_max_abs_error < 1e-9
            and self.tree_equal
        )


# ------------------------------------------------------------------ data
def housing_sales(
    postcodes: int = 500, sales_per_postcode: int = 20, days: int = 60, seed: int = 0
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """The five static relations of :func:`~ringml.datasets.housing_star` and its House
    relation as sales over ``days`` days from :data:`START`, sorted by a ``sold`` timestamp
    (first column), in a drifting market: prices scale by ``1 + 0.6 t`` and a garden adds
    ``600 (t - 0.5)`` per m² (``t`` from 0 to 1 over the period)."""
    data = housing_star(
        postcodes=postcodes, rows_per_postcode={"House": sales_per_postcode}, seed=seed
    )
    rng = np.random.default_rng(seed + 7)
    house = data.relations["House"].copy()
    moment = rng.uniform(0.0, days, len(house))  # days since START
    t = moment / days
    price = house[LABEL].to_numpy() * (1.0 + 0.6 * t) + house["garden"].to_numpy() * 600.0 * (
        t - 0.5
    )
    house[LABEL] = np.round(np.maximum(price, 20000.0), -2)
    house.insert(0, "sold", START + pd.to_timedelta(np.round(moment * 24 * 60), unit="min"))
    house = house.sort_values("sold", kind="stable").reset_index(drop=True)
    return {name: frame for name, frame in data.relations.items() if name != "House"}, house


def _arrivals(sales: pd.DataFrame, config: WindowJobConfig, rng) -> pd.Series:
    """When each sale reaches the feed: up to the lateness after it happened; a few sales
    five days late (behind the watermark by then: dead letters)."""
    delay = rng.uniform(0.0, config.lateness_days, len(sales))
    # from the middle of the stream: a late sale among the last ones may still be newer than
    # the watermark when it arrives (nothing later came before it)
    middle = np.arange(len(sales) // 3, 2 * len(sales) // 3)
    late = rng.choice(middle, min(config.late_sales, len(middle)), replace=False)
    delay[late] = config.lateness_days + 4.0
    return sales["sold"] + pd.to_timedelta(delay * 86400.0, unit="s")


def _write_feed(folder: Path, sales: pd.DataFrame, arrival: pd.Series, config, types):
    """One CSV file per ``days_per_batch`` days of arrivals; returns the frame of each."""
    batch = ((arrival - START) / pd.Timedelta(days=config.days_per_batch)).astype(int)
    frames = []
    for number, (_, part) in enumerate(sales.groupby(batch.to_numpy(), sort=True)):
        frame = part.assign(sold=part["sold"].dt.strftime("%Y-%m-%d %H:%M:%S"))
        frame.insert(0, "op", "insert")
        write_change_file(
            folder / f"part-{number:06d}.csv", frame[["op", *types]], mtime=1e9 + number
        )
        frames.append(part)
    return frames


def _compare(model: JoinRegressor, flat: pd.DataFrame, ridge: float) -> tuple[float, float]:
    """The windowed model against scikit-learn's Ridge on the windowed join: coefficients
    times the features' SDs (relative to their norm) and fitted values (in label SDs)."""
    from sklearn.linear_model import Ridge

    X, y = _design(flat, model.columns_), flat[LABEL].to_numpy(dtype=float)
    sk = Ridge(alpha=ridge * len(flat)).fit(X, y)
    sd = X.std(axis=0)
    coef = float(np.linalg.norm((model.coef_ - sk.coef_) * sd) / np.linalg.norm(sk.coef_ * sd))
    spread = max(float(np.std(y)), 1e-12)
    prediction = float(np.max(np.abs(model.predict(flat) - sk.predict(X)))) / spread
    return coef, prediction


def _named(model: JoinRegressor) -> dict[str, float]:
    return dict(zip(_coef_names(model), model.coef_.tolist(), strict=True))


# ------------------------------------------------------------------ the job
def run_window_job(
    config: WindowJobConfig = WindowJobConfig(), out: Callable[[str], Any] = print
) -> WindowJobReport:
    """Run the window mode of the main job (module docstring); print its report via ``out``."""
    _require_spark()
    if config.window_days < 1 or config.days < 1 or config.days_per_batch < 1:
        raise ValueError("window_days, days and days_per_batch must be >= 1")
    started = time.perf_counter()
    workdir = Path(config.workdir).resolve()
    rng = np.random.default_rng(config.seed)
    dims, all_sales = housing_sales(
        config.postcodes, config.sales_per_postcode, config.days, config.seed
    )
    held = rng.random(len(all_sales)) < 0.1  # held-out sales: scored, never streamed
    sales, holdout_sales = all_sales[~held].reset_index(drop=True), all_sales[held]
    holdout = _join_on_postcode(holdout_sales, dims.values())
    holdout_sold = holdout["sold"]
    holdout = holdout[[*CONTINUOUS, *CATEGORICAL, LABEL]]
    arrival = _arrivals(sales, config, rng)
    types = {"sold": "timestamp", **spark_types_of(sales.drop(columns="sold"))}
    schemas = {"House": [c for c in sales.columns if c != "sold"]}
    schemas.update({name: list(frame.columns) for name, frame in dims.items()})
    window = f"RANGE {config.window_days} DAYS"
    lateness = pd.Timedelta(days=config.lateness_days)

    def regressor(**windowing) -> JoinRegressor:
        return JoinRegressor(  # held-out sales may bring categories a window has not seen
            schemas, LABEL, CONTINUOUS + CATEGORICAL, CATEGORICAL, ridge=config.ridge,
            handle_unknown="ignore", **windowing,
        ).fit(dims)  # fmt: skip

    model = regressor(
        windows={"House": StreamTable("sold", partition="1 DAY", window=window)},
        lateness=lateness,
        late="dead_letter",
    )
    history = regressor()  # the same model over every sale so far, for comparison
    paths = _fresh_workdir(workdir)  # the config held: now the disk
    frames = _write_feed(paths["feeds"], sales, arrival, config, types)
    tracking_uri = config.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    logger = RefreshLogger(
        config.model_name,
        experiment=config.experiment,
        tracking_uri=tracking_uri,
        store_dir=None if tracking_uri else paths["mlflow"],
        run_name=f"housing-sales-{config.window_days}d-window",
        holdout=holdout,
        promotion=None,  # RMSEs on the windows' moving holdouts do not rank models
        log_coefficients=True,
        extra_params={
            "window": window,
            "lateness": str(lateness),
            "days": config.days,
            "days_per_batch": config.days_per_batch,
            "postcodes": config.postcodes,
            "spark_master": config.master,
        },
    )
    out(
        f"Housing-like star: {len(all_sales):,} sales over {config.days} days "
        f"({len(sales):,} streamed, {len(holdout_sales):,} held out), 5 static relations on "
        f"{config.postcodes:,} postcodes; the price per m² rises 60% over the period, gardens "
        f"go from a discount to a premium.\nChange feed: {len(frames)} files of "
        f"{config.days_per_batch} days of arrivals in {paths['feeds']}, sales up to "
        f"{config.lateness_days:g} day(s) out of order, {config.late_sales} reported 5 days "
        f"late; model over {window} of the join (watermark = latest sale time - "
        f"{config.lateness_days:g} day)"
    )
    report = WindowJobReport(tracking_uri=logger.tracking_uri)
    errors: list[tuple[float, float]] = []
    spark = local_session(config.master, app_name="ringml-demo-window")
    with logger, _Progress(len(sales), config.progress) as progress:

        def refresh(batch) -> None:
            t0 = time.perf_counter()
            model.partial_fit([])  # refit from the committed windowed payload
            rows = frames[batch.batch_id]  # one file per micro-batch, in order
            history.partial_fit({"House": rows.drop(columns="sold")})
            refit = time.perf_counter() - t0
            report.refresh_seconds += refit
            report.pipeline_seconds += batch.seconds
            watermark = batch.maintainer.watermark
            t0 = time.perf_counter()
            inside = batch.maintainer.window_rows("House")
            flat = _join_on_postcode(inside.drop(columns="sold"), dims.values())
            if len(flat):
                errors.append(_compare(model, flat, config.ridge))
            report.check_seconds += time.perf_counter() - t0
            if not report.first and model.result_ is not None:
                report.first = _named(model)
            lo = watermark - pd.Timedelta(days=config.window_days)
            recent = holdout[((holdout_sold >= lo) & (holdout_sold < watermark)).to_numpy()]
            extra = {
                "watermark_day": (watermark - START) / pd.Timedelta(days=1),
                "window_sales": len(inside),
                "late_sales": len(batch.bad_rows),
            }
            if len(recent) and model.result_ is not None:
                y = recent[LABEL].to_numpy(dtype=float)
                rmse = float(np.sqrt(np.mean((y - history.predict(recent)) ** 2)))
                extra["holdout_rmse_all_history"] = rmse
                report.holdout_rmse_history.append(rmse)
            record = logger.log_refresh(
                model,
                rows_applied=batch.applied,
                seconds=batch.seconds + refit,
                holdout=recent,  # empty: no holdout metrics this refresh
                extra_metrics=extra,
            )
            if "holdout_rmse" in record.metrics and len(recent):
                report.holdout_rmse_window.append(record.metrics["holdout_rmse"])
            day = extra["watermark_day"]
            progress.advance(batch.rows, f"watermark day {day:.1f}, {len(inside):,} sales")
            if batch.bad_rows:
                late = len(batch.bad_rows)
                progress.log(f"  batch {batch.batch_id}: {late} late sale(s) -> dead letters", out)

        streaming = StreamingWindows(
            model.stream_,
            paths["state"],
            on_error="dead_letter",
            dead_letter_path=paths["dead-letters"],
            on_batch=refresh,
        )
        feed = ChangeFeed(str(paths["feeds"]), types, relation="House", max_files_per_trigger=1)
        report.seconds = _drain(streaming, spark, feed, paths["checkpoint"], "ringml-window")
        stream = streaming.stream
        flat = _join_on_postcode(stream.window_rows("House").drop(columns="sold"), dims.values())
        report.mi_max_abs_error, report.tree_equal, tree = _check_tree(model, flat)
        logger.log_chow_liu(tree, title=f"Chow-Liu tree over the last {config.window_days} days")
        with_holdout = ("holdout_rmse", "holdout_rmse_all_history")
        plot = logger.log_history(
            x="watermark_day", xlabel=f"watermark (days since {START.date()})",
            columns=PLOTTED, errors=with_holdout,
            title=f"price model over the last {config.window_days} days of sales "
            "(coefficient × feature SD, £)",
        )  # fmt: skip
        report.run_id = logger.run_id
        report.plot = str(Path(_artifact_dir(logger)) / plot[0])
    report.micro_batches = len(streaming.reports)
    report.sales = sum(r.applied for r in streaming.reports)
    report.refreshes = len(logger.records)
    report.window_rows = model.n_samples_seen_
    report.history_rows = history.n_samples_seen_
    report.watermark = streaming.watermark
    report.last = _named(model)
    report.history = _named(history)
    report.coef_max_rel_error = max((e[0] for e in errors), default=math.nan)
    report.prediction_max_rel_error = max((e[1] for e in errors), default=math.nan)
    report.dead_letters = streaming.dead_letters()
    _print_report(report, config, tree, len(flat), out)
    out(f"total time {time.perf_counter() - started:.1f} s")
    return report


def _artifact_dir(logger: RefreshLogger) -> str:
    """The local folder of the run's artifacts (a file: URI for a SQLite store)."""
    uri = logger.client.get_run(logger.run_id).info.artifact_uri
    return uri.removeprefix("file://") if uri.startswith("file://") else uri


def _print_report(
    report: WindowJobReport, config: WindowJobConfig, tree, flat_rows: int, out
) -> None:
    out(
        f"\nstreamed {report.sales:,} sales in {report.micro_batches} micro-batches in "
        f"{report.seconds:.1f} s: {report.sales / report.seconds:,.0f} sales/s end to end "
        f"(Spark, window expiry, engine, checkpoints, refits, checks, MLflow); the engine and "
        f"its exactly-once commits took {report.pipeline_seconds:.2f} s, the "
        f"{report.refreshes} refits {report.refresh_seconds:.2f} s (the model over the whole "
        f"history included), the checks against scikit-learn {report.check_seconds:.2f} s"
    )
    out(
        f"watermark {report.watermark}; the window holds {report.window_rows:,} join rows, the "
        f"whole history {report.history_rows:,} (neither is materialized)"
    )
    names = [n for n in PLOTTED if n in report.last]
    out(
        f"model of {LABEL!r}: first window -> last window (whole history), per unit of the feature:"
    )
    for name in names:
        out(
            f"  {name:<20} {report.first.get(name, math.nan):>12,.2f} -> "
            f"{report.last[name]:>12,.2f}   ({report.history.get(name, math.nan):>12,.2f})"
        )
    verdict = "equal" if report.coef_max_rel_error < 1e-6 else "DIFFERENT"
    fits = "equal" if report.prediction_max_rel_error < 1e-6 else "DIFFERENT"
    out(
        f"check against scikit-learn's Ridge on the windowed join after each of the "
        f"{report.refreshes} refreshes: coefficients {verdict} (max difference "
        f"{report.coef_max_rel_error:.1e} of their norm, in label units), predictions {fits} "
        f"(max {report.prediction_max_rel_error:.1e} label SDs)"
    )
    if report.holdout_rmse_window and report.holdout_rmse_history:
        half = len(report.holdout_rmse_window) // 2
        window = float(np.mean(report.holdout_rmse_window[half:]))
        whole = float(np.mean(report.holdout_rmse_history[half:]))
        out(
            f"held-out sales of the window's days, second half of the stream: RMSE "
            f"{window:,.0f} over the window vs {whole:,.0f} over the whole history"
        )
    heading = f"Chow-Liu tree over the last window ({flat_rows:,} join rows)"
    _print_tree_check(report, tree, heading, out)
    dead = report.dead_letters
    folder = Path(config.workdir).resolve() / "dead-letters"
    out(f"dead letters: {len(dead)} late sale(s) in {folder}")
    for row in dead.itertuples():
        out(f"  batch {row.batch_id}: {row.reason}")
    out(
        f"MLflow: run {report.run_id} ({report.refreshes} refreshes, coefficients as coef/... "
        f"metrics) in {report.tracking_uri}\nplot of the coefficients and holdout errors over "
        f"event time: {report.plot}"
    )
    if report.tracking_uri.startswith("sqlite:"):
        out(f"open the UI: mlflow ui --backend-store-uri {report.tracking_uri}")
