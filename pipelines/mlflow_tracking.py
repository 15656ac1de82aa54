"""MLflow 3 tracking for models kept fresh by ringml: metrics per refresh, alias promotion.

One MLflow run per maintained model (ecosystem notes §3 and §7).  :class:`RefreshLogger`

* logs **params once** per run: the query's shape (relations, join variables, ring, view
  strategy, variable order), the label, features, categorical features, ridge, solver and
  the promotion rule (plus ``extra_params``), and the maintainer's ``explain()`` as
  ``query/explain.txt``;
* logs **metrics on every refresh** with ``step = refresh number`` (1, 2, …) in one
  ``log_batch`` call: ``rows_applied``, ``inserts``, ``deletes``, ``rows_applied_total``,
  ``seconds`` and ``deltas_per_second`` (when timed), ``join_rows``, ``gd_iterations``,
  ``gd_iterations_total``, ``gd_backtracks``, ``loss``, ``train_rmse``, ``grad_norm``,
  ``condition_number`` (when finite), ``rank_deficient``, ``converged``, ``holdout_rmse`` and
  ``holdout_r2`` (with a holdout frame) and ``promoted`` (0/1);
* logs and registers a **model only when the promotion rule fires** (logging a model costs
  0.1–1.5 s; metrics cost milliseconds): a pyfunc model from code
  (:mod:`ringml.pipelines.mlflow_pyfunc`, which reads the coefficients from a JSON
  artifact -- nothing is pickled), with a signature, an input example and explicit
  ``pip_requirements``; the version is registered under ``model_name`` with tags
  ``ringml.<metric>`` holding the refresh's metrics, and the ``champion`` alias moves to it
  (registry aliases, not the deprecated stages);
* keeps every refresh's **coefficients** (:attr:`RefreshRecord.coefficients`; logged as
  ``coef/…`` metrics too with ``log_coefficients=True``) and logs their history with the
  holdout error as a table and a plot (:meth:`RefreshLogger.log_history`:
  ``history/refreshes.csv``, ``history/history.png``), e.g. a model over a sliding window
  against event time;
* logs the **Chow–Liu tree** (:meth:`RefreshLogger.log_chow_liu`) as artifacts: an edge
  list (``edges.csv``), the tree with entropies (``tree.json``), the MI matrix when known
  (``mutual_info.csv``) and a picture (``tree.png``, drawn on matplotlib's Agg canvas
  without touching pyplot's global backend).

Tracking store (first match wins): ``tracking_uri=`` (a server ``http://…``, or any MLflow
URI) → ``store_dir=`` → the ``MLFLOW_TRACKING_URI`` environment variable (set by
``mlflow run``) → ``./ringml-mlflow``.  A store directory means the SQLite file
``sqlite:///<dir>/mlflow.db`` with artifacts under ``<dir>/mlartifacts`` (MLflow 3's file
store is deprecated); for any ``sqlite:///…/mlflow.db`` URI, experiments this module creates
put their artifacts in the ``mlartifacts`` folder next to the database, never in
``./mlruns``.  The logger sets MLflow's global tracking URI (``mlflow.set_tracking_uri``) so
that ``mlflow.pyfunc.load_model("models:/<name>@champion")`` reads the same store.

Promotion (:class:`PromotionRule`, default): promote when there is no ``champion`` yet,
or when ``holdout_rmse`` improved on the champion's by more than
``min_relative_improvement`` (1 %).  The champion's score is the ``ringml.holdout_rmse``
tag written on its version when it was promoted, so keep the holdout fixed during a run
(scores on different holdouts are not comparable).

Typical use::

    from ringml.models import JoinRegressor
    from ringml.pipelines.mlflow_tracking import RefreshLogger

    model = JoinRegressor(
        schemas, "price", features, categorical=["nbbedrooms"], handle_unknown="ignore"
    )
    with RefreshLogger("housing-price", store_dir="ringml-mlflow", holdout=holdout) as log:
        for batch in stream:
            record = log.partial_fit(model, batch)   # apply + refit + log (+ promote)
        log.log_chow_liu(chow_liu_estimator)

``import ringml`` and ``import ringml.models`` never import mlflow; only ``ringml.pipelines``
modules do.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature, infer_signature
from mlflow.types.schema import AnyType, ColSpec, Schema
from ringml.models.mutual_information import chow_liu_tree
from ringml.models.regression import CovarianceRegression, RegressionResult

import mlflow
from mlflow import MlflowClient

from .mlflow_pyfunc import (
    FORMAT,
    FORMAT_VERSION,
    category_json,
    category_value,
    predict_from_spec,
)

__all__ = [
    "CHAMPION",
    "DEFAULT_STORE_DIR",
    "PromotionRule",
    "RefreshLogger",
    "RefreshRecord",
    "draw_chow_liu_tree",
    "draw_refresh_history",
    "linear_model_spec",
    "refresh_history",
    "resolve_tracking",
    "sqlite_tracking_uri",
]

#: registry alias of the promoted model version
CHAMPION = "champion"
#: store directory used when neither a URI, a directory nor MLFLOW_TRACKING_URI is given
DEFAULT_STORE_DIR = "ringml-mlflow"
#: the models-from-code file logged with every model
PYFUNC_CODE = Path(__file__).with_name("mlflow_pyfunc.py")
_TAG = "ringml."
_MAX_PARAM = 6000  # MLflow's limit on a param value
_DB_FILE = "mlflow.db"
_ARTIFACTS = "mlartifacts"


# ------------------------------------------------------------------ tracking store
def sqlite_tracking_uri(store_dir: str | os.PathLike[str]) -> str:
    """``sqlite:///<absolute dir>/mlflow.db``."""
    return f"sqlite:///{Path(store_dir).resolve().as_posix()}/{_DB_FILE}"


def resolve_tracking(
    tracking_uri: str | None = None, store_dir: str | os.PathLike[str] | None = None
) -> tuple[str, str | None]:
    """``(tracking URI, artifact location for new experiments or None)``.

    Order: ``tracking_uri`` → ``store_dir`` → ``$MLFLOW_TRACKING_URI`` → ``./ringml-mlflow``.
    For a ``sqlite:///…`` URI the artifact location is ``mlartifacts`` next to the database;
    for a server it is left to the server.
    """
    if tracking_uri is None and store_dir is None:
        tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or None
        if tracking_uri is None:
            store_dir = DEFAULT_STORE_DIR
    if tracking_uri is None:
        folder = Path(store_dir).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        return sqlite_tracking_uri(folder), (folder / _ARTIFACTS).as_uri()
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///") :])
        folder = db.resolve().parent
        folder.mkdir(parents=True, exist_ok=True)
        return tracking_uri, (folder / _ARTIFACTS).as_uri()
    return tracking_uri, None


# ------------------------------------------------------------------ promotion rule
@dataclass(frozen=True)
class PromotionRule:
    """When a refresh's model becomes the ``champion``.

    Promote when the model was fitted on at least ``min_join_rows`` join rows and either
    there is no champion yet, or ``metric`` beats the champion's value by more than
    ``min_relative_improvement`` (relative to the champion's value; lower is better unless
    ``higher_is_better``).  A refresh without ``metric`` (e.g. no holdout) is promoted only
    when there is no champion; a champion without a recorded value is never replaced by
    the rule (force it with ``log_refresh(..., promote=True)``).
    """

    metric: str = "holdout_rmse"
    min_relative_improvement: float = 0.01
    higher_is_better: bool = False
    min_join_rows: int = 1

    def __post_init__(self) -> None:
        if not (
            self.min_relative_improvement >= 0 and math.isfinite(self.min_relative_improvement)
        ):
            raise ValueError("min_relative_improvement must be a finite number >= 0")

    def decide(
        self,
        metrics: Mapping[str, float],
        champion: tuple[str, float | None] | None,
    ) -> tuple[bool, str]:
        """``(promote?, reason)`` for a refresh's ``metrics`` against ``champion``
        (``(version, its value of metric or None)``, or None without a champion)."""
        rows = metrics.get("join_rows", 0.0)
        if rows < self.min_join_rows:
            return False, f"join_rows {rows:g} < {self.min_join_rows}"
        if champion is None:
            return True, "no champion yet"
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            return False, f"no {self.metric} this refresh"
        version, best = champion
        if best is None or not math.isfinite(best):
            return False, f"champion v{version} has no recorded {self.metric}"
        margin = self.min_relative_improvement * abs(best)
        better = value > best + margin if self.higher_is_better else value < best - margin
        verdict = "improved" if better else "not improved enough"
        return better, (
            f"{self.metric} {value:.6g} vs champion v{version} {best:.6g}: {verdict} "
            f"(margin {self.min_relative_improvement:.2%})"
        )


@dataclass(frozen=True)
class RefreshRecord:
    """What one :meth:`RefreshLogger.log_refresh` logged."""

    step: int
    metrics: dict[str, float]
    promoted: bool = False
    reason: str = ""
    version: str | None = None  # registered model version, when promoted
    model_uri: str | None = None  # ``models:/m-<id>`` of the logged model, when promoted
    #: the refresh's coefficients by column name (``variable`` or ``variable=category``)
    #: and ``(intercept)``; empty without a fitted model
    coefficients: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------ model snapshots
@dataclass
class _Snapshot:
    """A linear model's read-outs, whatever object keeps it fresh."""

    label: str
    features: list[str]
    categorical: list[str]
    result: RegressionResult | None
    join_rows: float
    maintainer: Any = None
    references: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    iterations_total: int | None = None


def _snapshot(model: Any, maintainer: Any = None) -> _Snapshot:
    if isinstance(model, CovarianceRegression):
        design = model.design
        categorical = list(design.categories) if design is not None else []
        result = model.result
        if model.features is not None:
            features = list(model.features)
        elif result is not None:
            features = [c for c in result.columns if not isinstance(c, tuple)] + categorical
        else:
            features = []
        refs = _references(design)
        params = {
            "model.class": "CovarianceRegression",
            "ridge": model.ridge,
            "solver": model.solver,
            "fit_intercept": model.fit_intercept,
            "tol": model.tol,
            "max_iter": model.max_iter,
            "warm_start": model.warm_start,
            "drop": model.drop,
        }
        return _Snapshot(
            label=model.label,
            features=features,
            categorical=categorical,
            result=result,
            join_rows=float(result.count) if result is not None else 0.0,
            maintainer=maintainer,
            references=refs,
            params=params,
            iterations_total=model.total_iterations,
        )
    if hasattr(model, "maintainer_") and hasattr(model, "features_"):  # JoinRegressor
        cat = set(getattr(model, "categorical", ()) or ())
        params = {
            "model.class": type(model).__name__,
            "ridge": model.ridge,
            "solver": model.solver,
            "fit_intercept": model.fit_intercept,
            "tol": model.tol,
            "max_iter": model.max_iter,
            "warm_start": model.warm_start,
            "drop": model.drop,
        }
        return _Snapshot(
            label=model.label,
            features=list(model.features_),
            categorical=[v for v in model.features_ if v in cat],
            result=model.result_,
            join_rows=float(model.n_samples_seen_),
            maintainer=maintainer if maintainer is not None else model.maintainer_,
            references=_references(getattr(model, "_design", None)),
            params=params,
            iterations_total=getattr(model, "n_iter_total_", None),
        )
    raise TypeError(
        "RefreshLogger logs a JoinRegressor or a CovarianceRegression (with maintainer=...), "
        f"got {type(model).__name__}"
    )


def _references(design: Any) -> dict:
    """Per categorical variable its reference category (the one without a column)."""
    if design is None:
        return {}
    return {
        var: next((value for value, col in cats if col is None), None)
        for var, cats in design.categories.items()
    }


def linear_model_spec(model: Any) -> dict[str, Any]:
    """The JSON coefficients artifact of a fitted linear model (see :mod:`.mlflow_pyfunc`)."""
    snap = model if isinstance(model, _Snapshot) else _snapshot(model)
    result = snap.result
    if result is None:
        raise ValueError("the model has not been fitted on any join row yet")
    continuous, categorical = [], {v: [] for v in snap.categorical}
    for col, beta in zip(result.columns, result.coef.tolist(), strict=True):
        if isinstance(col, tuple):
            categorical.setdefault(col[0], []).append([_category(col[0], col[1]), float(beta)])
        else:
            continuous.append([str(col), float(beta)])
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "label": str(snap.label),
        "features": [str(v) for v in snap.features],
        "intercept": float(result.intercept),
        "continuous": continuous,
        "categorical": [
            {
                "variable": var,
                "reference": _category(var, snap.references.get(var)),
                "coefficients": pairs,
            }
            for var, pairs in categorical.items()
        ],
        "fit_intercept": bool(result.fit_intercept),
        "ridge": float(result.ridge),
        "join_rows": float(result.count),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def _category(variable: str, value: Any) -> Any:
    try:
        return category_json(value)
    except TypeError as error:
        raise ValueError(
            f"categorical variable {variable!r}: {error}; the served model cannot hold it"
        ) from None


# ------------------------------------------------------------------ batches
def _batch_counts(batch: Any) -> tuple[int, int]:
    """``(inserts, deletes)`` of a batch in any form ``JoinRegressor.partial_fit`` takes."""
    if batch is None:
        return 0, 0
    if isinstance(batch, pd.DataFrame):
        return len(batch), 0
    if isinstance(batch, Mapping):
        return sum(len(rows) for rows in batch.values()), 0
    if hasattr(batch, "rows"):
        mult = getattr(batch, "multiplicity", None)
        if mult is None:
            return len(batch.rows), 0
        mult = np.asarray(mult)
        return int((mult > 0).sum()), int((mult < 0).sum())
    if isinstance(batch, Iterable) and not isinstance(batch, str | bytes):
        ins = dels = 0
        for item in batch:
            i, d = _batch_counts(item)
            ins, dels = ins + i, dels + d
        return ins, dels
    raise TypeError(f"cannot count the rows of a {type(batch).__name__}")


# ------------------------------------------------------------------ Chow–Liu picture
def draw_chow_liu_tree(tree: nx.Graph, path: str | os.PathLike[str], title: str = "") -> None:
    """Draw ``tree`` (edge ``weight`` = MI in bits, node ``entropy``) to a PNG at ``path``.

    Uses matplotlib's object-oriented API on an Agg canvas: no pyplot, no global backend.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = tree.number_of_nodes()
    fig = Figure(figsize=(max(6.0, 1.1 * n), max(4.5, 0.8 * n)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    if n == 0:
        ax.text(0.5, 0.5, "(empty tree)", ha="center", va="center")
    else:
        if n > 2:
            pos = nx.kamada_kawai_layout(tree)
        else:
            pos = nx.spring_layout(tree, seed=0)
        weights = [float(d.get("weight", 0.0)) for _, _, d in tree.edges(data=True)]
        top = max(weights, default=0.0) or 1.0
        for (u, v), w in zip(tree.edges(), weights, strict=True):
            (x0, y0), (x1, y1) = pos[u], pos[v]
            ax.plot([x0, x1], [y0, y1], color="tab:blue", lw=1.0 + 5.0 * w / top, zorder=1)
            ax.text(
                (x0 + x1) / 2, (y0 + y1) / 2, f"{w:.3f}", fontsize=8, color="tab:blue",
                ha="center", va="center", zorder=3,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
            )  # fmt: skip
        for v, data in tree.nodes(data=True):
            x, y = pos[v]
            h = data.get("entropy")
            label = f"{v}\nH={h:.2f}" if h is not None else str(v)
            ax.text(
                x, y, label, fontsize=9, ha="center", va="center", zorder=4,
                bbox={"boxstyle": "round,pad=0.3", "fc": "#fff4d6", "ec": "tab:orange"},
            )  # fmt: skip
        ax.margins(0.15)
    ax.set_title(title or "Chow-Liu tree (edge labels: mutual information, bits)")
    fig.tight_layout()
    fig.savefig(path, format="png")


# ------------------------------------------------------------------ refresh history
def _column_name(column: Any) -> str:
    """A solver column as people read it: ``variable`` or ``variable=category``."""
    if isinstance(column, tuple):
        return f"{column[0]}={_plain(column[1])}"
    return str(column)


def _coefficients(result: RegressionResult | None) -> dict[str, float]:
    if result is None:
        return {}
    out = {_column_name(c): float(b) for c, b in zip(result.columns, result.coef, strict=True)}
    out["(intercept)"] = float(result.intercept)
    return out


def _coefficient_metric(name: str) -> str:
    """The MLflow metric key of a coefficient (only characters MLflow accepts)."""
    if name == "(intercept)":
        return "coef/intercept"
    parts = name.split("=", 1)
    return "coef/" + "/".join(re.sub(r"[^\w.\- ]", "_", p) for p in parts)


def refresh_history(records: Sequence[RefreshRecord]) -> pd.DataFrame:
    """One row per refresh: ``step``, its metrics, and its coefficients (``coef:<name>``)."""
    rows = []
    for r in records:
        row: dict[str, Any] = {"step": r.step, **r.metrics}
        row.update({f"coef:{k}": v for k, v in r.coefficients.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def draw_refresh_history(
    records: Sequence[RefreshRecord],
    path: str | os.PathLike[str],
    *,
    x: str | None = None,
    columns: Sequence[str] | None = None,
    scales: Mapping[str, float] | None = None,
    errors: Sequence[str] = ("holdout_rmse", "train_rmse"),
    max_columns: int = 8,
    title: str = "",
    xlabel: str = "",
) -> None:
    """Plot coefficients (top) and error metrics (bottom) over the refreshes to a PNG.

    ``x`` names a metric to put on the horizontal axis (e.g. a window's end in event time;
    refreshes without it are left out), else the refresh step.  ``columns`` picks the
    coefficients (names as in :attr:`RefreshRecord.coefficients`), else the
    ``max_columns`` largest in magnitude at the last refresh; each is multiplied by
    ``scales[name]`` when given (e.g. the feature's standard deviation, so that every line
    is in label units).  ``errors`` are the metrics of the bottom panel that some refresh
    has.  ``xlabel`` defaults to ``x``.  Drawn on matplotlib's Agg canvas (no pyplot, no
    global backend).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    table = refresh_history(records)
    if x is not None:
        if x not in table.columns:
            raise ValueError(f"no refresh has the metric {x!r} to plot against")
        table = table[table[x].notna()]
    xs = table[x] if x is not None else table["step"] if len(table) else pd.Series(dtype=float)
    scales = dict(scales or {})
    fitted = table.dropna(subset=["coef:(intercept)"]) if "coef:(intercept)" in table else None
    if columns is None:
        columns = []
        if fitted is not None and len(fitted):
            last = fitted.iloc[-1]
            size = {
                c[5:]: abs(float(last[c]) * scales.get(c[5:], 1.0))
                for c in fitted.columns
                if c.startswith("coef:") and c != "coef:(intercept)" and pd.notna(last[c])
            }
            columns = sorted(size, key=lambda c: -size[c])[: int(max_columns)]
    fig = Figure(figsize=(9.0, 7.0), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    for name in columns:
        key = f"coef:{name}"
        if key not in table.columns:
            raise ValueError(f"no refresh has a coefficient {name!r}")
        scale = scales.get(name, 1.0)
        label = name if scale == 1.0 else f"{name} (× {scale:.3g})"
        top.plot(xs, table[key] * scale, marker=".", lw=1.2, label=label)
    top.axhline(0.0, color="grey", lw=0.6)
    top.set_ylabel("coefficient" + (" × scale" if scales else ""))
    if columns:
        top.legend(fontsize=8, loc="best", ncols=2)
    top.set_title(title or "coefficients and error over the refreshes")
    shown = [e for e in errors if e in table.columns and table[e].notna().any()]
    for name in shown:
        bottom.plot(xs, table[name], marker=".", lw=1.2, label=name)
    if shown:
        bottom.legend(fontsize=8, loc="best")
    bottom.set_ylabel("error")
    bottom.set_xlabel(xlabel or x or "refresh")
    fig.tight_layout()
    fig.savefig(path, format="png")


# ------------------------------------------------------------------ the logger
class RefreshLogger:
    """Log every refresh of a maintained linear model to one MLflow run; promote champions.

    Parameters
    ----------
    model_name : registered model name (the registry entry the ``champion`` alias lives in).
    experiment : experiment name (created with the store's artifact location if missing).
    tracking_uri, store_dir : where to track (see the module docstring for the order).
    run_name, run_id : name of a new run, or the id of an existing run to log into
        (default: ``$MLFLOW_RUN_ID`` when set, as under ``mlflow run``; else a new run).
    holdout : DataFrame with the feature columns and the label, scored on every refresh.
    promotion : a :class:`PromotionRule`, or None to never promote by rule.
    input_example : rows of feature columns for the model's signature and input example
        (default: ``holdout``; else one synthetic row).
    example_rows : how many evenly spaced rows of ``input_example`` (or ``holdout``) a
        logged model gets as its input example.
    extra_params : logged with the model's params (e.g. the stream's batch size).
    tags : run tags.
    pip_requirements : the logged model's requirements (default: pinned ``mlflow``,
        ``numpy`` and ``pandas`` -- all the pyfunc code needs).
    log_coefficients : also log every coefficient as a metric per refresh
        (``coef/<variable>``, ``coef/<variable>/<category>``, ``coef/intercept``); every
        :class:`RefreshRecord` keeps them either way, for :meth:`log_history`.
    """

    def __init__(
        self,
        model_name: str = "ringml-linear-model",
        *,
        experiment: str = "ringml",
        tracking_uri: str | None = None,
        store_dir: str | os.PathLike[str] | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        holdout: pd.DataFrame | None = None,
        promotion: PromotionRule | None = PromotionRule(),
        input_example: pd.DataFrame | None = None,
        extra_params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        pip_requirements: list[str] | None = None,
        example_rows: int = 5,
        log_coefficients: bool = False,
    ) -> None:
        self.model_name = model_name
        self.experiment = experiment
        self.tracking_uri, self._artifact_location = resolve_tracking(tracking_uri, store_dir)
        self.run_name = run_name
        self.holdout = holdout
        self.promotion = promotion
        self.input_example = input_example
        self.extra_params = dict(extra_params or {})
        self.tags = dict(tags or {})
        self.pip_requirements = pip_requirements or [
            f"mlflow=={mlflow.__version__}",
            f"numpy=={np.__version__}",
            f"pandas=={pd.__version__}",
        ]
        self.example_rows = int(example_rows)
        self.log_coefficients = bool(log_coefficients)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.step = 0
        self.rows_applied_total = 0
        self.records: list[RefreshRecord] = []
        self._run_id = run_id or os.environ.get("MLFLOW_RUN_ID") or None
        self._owns_run = False
        self._params_logged = False
        self._params: dict[str, str] = {}
        self._existing_params: dict[str, str] = {}
        self.experiment_id: str | None = None
        self._started = False

    # ------------------------------------------------------------- run lifecycle
    @property
    def run_id(self) -> str:
        self.start()
        return self._run_id

    def start(self) -> RefreshLogger:
        """Point MLflow at the store, find or create the experiment and the run."""
        if self._started:
            return self
        mlflow.set_tracking_uri(self.tracking_uri)
        if self._run_id is not None:
            run = self.client.get_run(self._run_id)
            self.experiment_id = run.info.experiment_id
            # continue the refresh numbering of a run that was logged into before
            if "promoted" in run.data.metrics:
                history = self.client.get_metric_history(self._run_id, "promoted")
                self.step = max((m.step for m in history), default=0)
            if "rows_applied_total" in run.data.metrics:
                self.rows_applied_total = int(run.data.metrics["rows_applied_total"])
            self._existing_params = dict(run.data.params)
            if self.tags:
                self.client.log_batch(
                    self._run_id, tags=[RunTag(k, str(v)) for k, v in self.tags.items()]
                )
        else:
            self.experiment_id = self._experiment_id()
            tags = {f"{_TAG}model_name": self.model_name, **self.tags}
            run = self.client.create_run(self.experiment_id, tags=tags, run_name=self.run_name)
            self._run_id = run.info.run_id
            self._owns_run = True
        self._started = True
        return self

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(
                self.experiment, artifact_location=self._artifact_location
            )
        except MlflowException:  # created meanwhile by another process
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def close(self, status: str = "FINISHED") -> None:
        """End the run (only a run this logger created)."""
        if self._started and self._owns_run:
            self.client.set_terminated(self._run_id, status)
            self._owns_run = False

    def __enter__(self) -> RefreshLogger:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(RunStatus.to_string(RunStatus.FAILED if exc_type else RunStatus.FINISHED))

    # ------------------------------------------------------------- params
    def log_params(self, model: Any, maintainer: Any = None) -> None:
        """Log the run's params (once; later calls do nothing)."""
        if self._params_logged:
            return
        self.start()
        snap = model if isinstance(model, _Snapshot) else _snapshot(model, maintainer)
        params: dict[str, Any] = {
            "label": snap.label,
            "features": ",".join(map(str, snap.features)),
            "categorical": ",".join(map(str, snap.categorical)),
            "n_features": len(snap.features),
            **snap.params,
        }
        m = snap.maintainer
        explain = None
        if m is not None:
            query = m.query
            counts: dict[str, int] = {}
            for cols in query.relations.values():
                for c in cols:
                    counts[c] = counts.get(c, 0) + 1
            params.update(
                {
                    "query.relations": ";".join(
                        f"{name}({','.join(cols)})" for name, cols in query.relations.items()
                    ),
                    "query.n_relations": len(query.relations),
                    "query.join_variables": ",".join(v for v, k in counts.items() if k > 1),
                    "query.ring": type(query.ring).__name__,
                    "query.n_variables": len(query.ring.variables),
                    "query.free": ",".join(query.free),
                    "strategy": m.strategy,
                    "updatable": ",".join(sorted(m.updatable)),
                    "variable_order": str(m.order),
                }
            )
            try:
                explain = m.explain()
            except Exception:  # a plan that cannot be printed is no reason to fail a run
                explain = None
        if self.promotion is not None:
            params.update(
                {
                    "promotion.metric": self.promotion.metric,
                    "promotion.min_relative_improvement": self.promotion.min_relative_improvement,
                    "promotion.higher_is_better": self.promotion.higher_is_better,
                }
            )
        params.update(self.extra_params)
        self._params = {str(k): _param_value(v) for k, v in params.items()}
        # params are immutable: in a run logged into before, log only the new ones
        changed = [k for k, v in self._params.items() if self._existing_params.get(k, v) != v]
        if changed:
            warnings.warn(
                f"run {self._run_id} already has different values for params {changed}; "
                "keeping them",
                stacklevel=3,
            )
        batch = [Param(k, v) for k, v in self._params.items() if k not in self._existing_params]
        if batch:
            self.client.log_batch(self._run_id, params=batch)
        if explain:
            self.client.log_text(self._run_id, explain, "query/explain.txt")
        self._params_logged = True

    # ------------------------------------------------------------- refreshes
    def partial_fit(self, model: Any, batch: Any, **kwargs: Any) -> RefreshRecord:
        """``model.partial_fit(batch)`` timed, then :meth:`log_refresh` (same kwargs)."""
        t0 = time.perf_counter()
        model.partial_fit(batch)
        seconds = time.perf_counter() - t0
        return self.log_refresh(model, batch=batch, seconds=seconds, **kwargs)

    def log_refresh(
        self,
        model: Any,
        *,
        batch: Any = None,
        rows_applied: int | None = None,
        seconds: float | None = None,
        maintainer: Any = None,
        holdout: pd.DataFrame | None = None,
        step: int | None = None,
        promote: bool | None = None,
        extra_metrics: Mapping[str, float] | None = None,
    ) -> RefreshRecord:
        """Log one refresh of ``model`` (after its batch was applied and it was refitted).

        ``model`` is a :class:`~ringml.models.JoinRegressor` or a
        :class:`~ringml.models.CovarianceRegression` (pass its ``maintainer`` for the query
        params).  ``batch`` (or ``rows_applied``) gives the rows applied since the last
        refresh, ``seconds`` the time the maintenance and refit took.  ``holdout`` overrides
        the logger's holdout for this refresh.  ``step`` defaults to the next refresh number.
        ``promote``: None applies the promotion rule, True forces a promotion (if the model
        is fitted), False skips it.
        """
        self.start()
        snap = _snapshot(model, maintainer)
        # the served model's spec first: a model it cannot hold fails before anything is logged
        spec = linear_model_spec(snap) if snap.result is not None else None
        self.log_params(snap)
        self.step = int(step) if step is not None else self.step + 1
        if batch is not None:
            inserts, deletes = _batch_counts(batch)
            rows = inserts + deletes if rows_applied is None else int(rows_applied)
        else:
            inserts = deletes = None
            rows = None if rows_applied is None else int(rows_applied)
        metrics: dict[str, float] = {}
        if rows is not None:
            self.rows_applied_total += rows
            metrics["rows_applied"] = rows
            metrics["rows_applied_total"] = self.rows_applied_total
            if inserts is not None:
                metrics["inserts"], metrics["deletes"] = inserts, deletes
        if seconds is not None:
            metrics["seconds"] = float(seconds)
            if rows is not None and seconds > 0:
                metrics["deltas_per_second"] = rows / seconds
        metrics["join_rows"] = snap.join_rows
        result = snap.result
        if result is not None:
            metrics.update(_result_metrics(result))
            if snap.iterations_total is not None:
                metrics["gd_iterations_total"] = float(snap.iterations_total)
            frame = self.holdout if holdout is None else holdout
            if frame is not None and len(frame):
                metrics.update(_holdout_metrics(spec, frame))
        if extra_metrics:
            metrics.update({k: float(v) for k, v in extra_metrics.items()})
        metrics = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}

        promoted, reason = False, "promotion skipped"
        if result is None:
            reason = "no fitted model (empty join)"
        elif promote is True:
            promoted, reason = True, "forced"
        elif promote is None and self.promotion is not None:
            rule = self.promotion
            if snap.join_rows < rule.min_join_rows:  # decided without asking the registry
                promoted, reason = rule.decide(metrics, None)
            else:
                promoted, reason = rule.decide(metrics, self.champion())
        elif promote is None:
            reason = "no promotion rule"
        metrics["promoted"] = 1.0 if promoted else 0.0
        coefficients = _coefficients(result)
        logged = dict(metrics)
        if self.log_coefficients:
            logged.update({_coefficient_metric(k): v for k, v in coefficients.items()})
        timestamp = int(time.time() * 1000)
        self.client.log_batch(
            self._run_id,
            metrics=[Metric(k, v, timestamp, self.step) for k, v in logged.items()],
        )
        version = uri = None
        if promoted:
            version, uri = self._promote(spec, metrics, self._example(holdout))
        record = RefreshRecord(self.step, metrics, promoted, reason, version, uri, coefficients)
        self.records.append(record)
        return record

    # ------------------------------------------------------------- registry
    def champion(self) -> tuple[str, float | None] | None:
        """``(version, its recorded value of the promotion metric)`` of the ``champion``
        alias of ``model_name``, or None."""
        try:
            mv = self.client.get_model_version_by_alias(self.model_name, CHAMPION)
        except MlflowException as e:
            # no registered model, or no such alias (MLflow 3 answers those two codes);
            # anything else (a store that cannot be reached, ...) must not look like "no
            # champion yet" and move the alias
            if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise
        metric = self.promotion.metric if self.promotion is not None else "holdout_rmse"
        raw = (mv.tags or {}).get(f"{_TAG}{metric}")
        try:
            value = float(raw) if raw is not None else None
        except ValueError:
            value = None
        return str(mv.version), value

    def load_champion(self):
        """The champion as an MLflow pyfunc model (``models:/<name>@champion``)."""
        self.start()
        return mlflow.pyfunc.load_model(f"models:/{self.model_name}@{CHAMPION}")

    def _promote(
        self, spec: dict[str, Any], metrics: Mapping[str, float], example: pd.DataFrame | None
    ) -> tuple[str, str]:
        if example is None:
            example = _synthetic_example(spec)
        example = example[spec["features"]].reset_index(drop=True)
        with tempfile.TemporaryDirectory(prefix="ringml-mlflow-") as tmp:
            path = Path(tmp, "coefficients.json")
            path.write_text(json.dumps(spec), encoding="utf-8")
            with warnings.catch_warnings():
                # integer (categorical) columns are meant to be integers
                warnings.filterwarnings("ignore", message=".*integer column", category=UserWarning)
                signature = _served_signature(
                    infer_signature(example, predict_from_spec(spec, example)), spec
                )
            # The LoggedModel is created first in this run's experiment (left to itself,
            # log_model would take the fluent experiment -- "Default", artifacts in ./mlruns);
            # Model.log is what mlflow.pyfunc.log_model calls, and it takes the run id, so the
            # model joins this run without making it the process-wide active run.
            logged = self.client.create_logged_model(
                self.experiment_id,
                name=self.model_name,
                source_run_id=self._run_id,
                params=dict(self._params),
                tags={f"{_TAG}step": str(self.step)},
            )
            info = mlflow.models.Model.log(
                model_id=logged.model_id,
                artifact_path=None,
                name=self.model_name,
                flavor=mlflow.pyfunc,
                run_id=self._run_id,
                step=self.step,
                python_model=str(PYFUNC_CODE),
                artifacts={"coefficients": str(path)},
                signature=signature,
                input_example=example,
                pip_requirements=list(self.pip_requirements),
                metadata={"ringml": {"label": spec["label"], "features": spec["features"]}},
            )
        tags = {f"{_TAG}{k}": repr(float(v)) for k, v in metrics.items()}
        tags.update({f"{_TAG}step": str(self.step), f"{_TAG}run_id": self._run_id})
        mv = mlflow.register_model(info.model_uri, self.model_name, tags=tags)
        self.client.set_registered_model_alias(self.model_name, CHAMPION, mv.version)
        self.client.set_tag(self._run_id, f"{_TAG}champion_version", str(mv.version))
        return str(mv.version), info.model_uri

    def _example(self, holdout: pd.DataFrame | None) -> pd.DataFrame | None:
        """Rows for the signature and input example, from the explicit example, else the
        holdout (None: a synthetic row is made from the coefficients)."""
        frame = self.input_example
        if frame is None:
            frame = self.holdout if holdout is None else holdout
        if frame is None or not len(frame):
            return None
        # evenly spaced rows: neighbouring rows of a join often repeat the same features
        picks = np.unique(np.linspace(0, len(frame) - 1, self.example_rows).astype(np.intp))
        return frame.iloc[picks]

    # ------------------------------------------------------------- Chow–Liu
    def log_chow_liu(
        self,
        source: Any,
        *,
        step: int | None = None,
        artifact_path: str = "chow_liu",
        title: str = "",
    ) -> list[str]:
        """Log a Chow–Liu tree: ``edges.csv``, ``tree.json``, ``mutual_info.csv`` (when the
        MI matrix is known) and ``tree.png`` under ``artifact_path`` (``…/step-NNNN`` when
        ``step`` is given), and the metric ``chow_liu_total_mi`` (bits).

        ``source``: an ``nx.Graph`` (edge ``weight`` = MI), an MI DataFrame, or a fitted
        :class:`~ringml.models.JoinChowLiu` / :class:`~ringml.models.ChowLiuEstimator`.
        Returns the artifact paths logged.
        """
        self.start()
        mi = None
        if isinstance(source, nx.Graph):
            tree = source
        elif isinstance(source, pd.DataFrame):
            mi, tree = source, chow_liu_tree(source)
        elif hasattr(source, "tree_"):
            tree, mi = source.tree_, getattr(source, "mutual_info_", None)
        else:
            raise TypeError(f"no Chow-Liu tree in a {type(source).__name__}")
        edges = sorted(
            ((str(u), str(v), float(d.get("weight", 0.0))) for u, v, d in tree.edges(data=True)),
            key=lambda e: (-e[2], e[0], e[1]),
        )
        where = artifact_path if step is None else f"{artifact_path}/step-{int(step):04d}"
        with tempfile.TemporaryDirectory(prefix="ringml-chowliu-") as tmp:
            pd.DataFrame(edges, columns=["source", "target", "mutual_info_bits"]).to_csv(
                Path(tmp, "edges.csv"), index=False
            )
            nodes = [
                {"name": str(v), "entropy_bits": _plain(d.get("entropy"))}
                for v, d in tree.nodes(data=True)
            ]
            doc = {
                "nodes": nodes,
                "edges": [{"source": u, "target": v, "mutual_info_bits": w} for u, v, w in edges],
                "total_mutual_info_bits": float(sum(w for *_, w in edges)),
            }
            Path(tmp, "tree.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")
            if mi is not None:
                mi.to_csv(Path(tmp, "mutual_info.csv"))
            draw_chow_liu_tree(tree, Path(tmp, "tree.png"), title)
            names = sorted(os.listdir(tmp))
            self.client.log_artifacts(self._run_id, tmp, where)
        metric_step = self.step if step is None else int(step)
        self.client.log_metric(
            self._run_id, "chow_liu_total_mi", doc["total_mutual_info_bits"], step=metric_step
        )
        return [f"{where}/{name}" for name in names]

    # ------------------------------------------------------------- history
    def log_history(
        self,
        *,
        artifact_path: str = "history",
        x: str | None = None,
        columns: Sequence[str] | None = None,
        standardize: bool = True,
        errors: Sequence[str] = ("holdout_rmse", "train_rmse"),
        title: str = "",
        xlabel: str = "",
    ) -> list[str]:
        """Log this run's refreshes so far as ``refreshes.csv`` (one row per refresh: its
        metrics and coefficients) and ``history.png`` (:func:`draw_refresh_history`) under
        ``artifact_path``; returns the artifact paths.

        ``standardize``: a continuous feature's coefficient is drawn times the feature's
        standard deviation in the holdout (its effect in label units; one-hot columns are
        already in label units), so that lines of features in different units compare.
        ``x``, ``columns``, ``errors``, ``title``, ``xlabel``: see
        :func:`draw_refresh_history`.
        """
        self.start()
        scales: dict[str, float] = {}
        if standardize and self.holdout is not None and len(self.holdout):
            for name in {k for r in self.records for k in r.coefficients}:
                if name in self.holdout.columns:
                    values = pd.to_numeric(self.holdout[name], errors="coerce")
                    sd = float(values.std(ddof=0))
                    if math.isfinite(sd) and sd > 0:
                        scales[name] = sd
        with tempfile.TemporaryDirectory(prefix="ringml-history-") as tmp:
            refresh_history(self.records).to_csv(Path(tmp, "refreshes.csv"), index=False)
            draw_refresh_history(
                self.records,
                Path(tmp, "history.png"),
                x=x,
                columns=columns,
                scales=scales,
                errors=errors,
                title=title,
                xlabel=xlabel,
            )
            names = sorted(os.listdir(tmp))
            self.client.log_artifacts(self._run_id, tmp, artifact_path)
        return [f"{artifact_path}/{name}" for name in names]


def _served_signature(inferred: ModelSignature, spec: Mapping[str, Any]) -> ModelSignature:
    """``inferred`` with every feature typed ``any``: MLflow would refuse floats in a
    column the example held as integers (``long``), int64 in one typed ``double``, a
    category column of floats (``1.0`` for the category ``1``), NULLs in an integer
    category column or a pandas ``category`` dtype; the served model takes what the
    estimator takes and names a value it refuses."""
    columns = [ColSpec(AnyType(), c.name, required=c.required) for c in inferred.inputs.inputs]
    return ModelSignature(Schema(columns), inferred.outputs)


def _synthetic_example(spec: Mapping[str, Any]) -> pd.DataFrame:
    """One row: 0.0 for continuous features, the first known category for categorical."""
    row: dict[str, Any] = {name: 0.0 for name, _ in spec["continuous"]}
    for entry in spec["categorical"]:
        known = [category_value(v) for v, _ in entry["coefficients"]]
        ref = category_value(entry.get("reference"))
        row[entry["variable"]] = ref if ref is not None else (known[0] if known else 0)
    for v in spec["features"]:
        row.setdefault(v, 0.0)
    return pd.DataFrame([row])[spec["features"]]


def _result_metrics(result: RegressionResult) -> dict[str, float]:
    beta = np.asarray(result.coef, dtype=np.float64)
    mse = 2.0 * result.loss - result.ridge * float(beta @ beta)
    return {
        "gd_iterations": result.iterations,
        "gd_backtracks": result.backtracks,
        "loss": result.loss,
        "train_rmse": math.sqrt(max(mse, 0.0)) if math.isfinite(mse) else float("nan"),
        "grad_norm": result.grad_norm,
        "condition_number": result.condition_number,
        "rank_deficient": float(result.rank_deficient),
        "converged": float(result.converged),
    }


def _holdout_metrics(spec: Mapping[str, Any], frame: pd.DataFrame) -> dict[str, float]:
    """The served model's errors on ``frame`` (a category it has no column for adds 0, as
    when it is served, whatever the estimator's ``handle_unknown``)."""
    label = spec["label"]
    if label not in frame.columns:
        raise ValueError(f"the holdout lacks the label column {label!r}")
    y = pd.to_numeric(frame[label], errors="coerce").to_numpy(dtype=np.float64)
    pred = predict_from_spec(dict(spec), frame)
    resid = y - pred
    sse = float(resid @ resid)
    out = {"holdout_rmse": math.sqrt(sse / len(y))}
    centred = y - y.mean()
    sst = float(centred @ centred)
    if sst > 0:
        out["holdout_r2"] = 1.0 - sse / sst
    return out


def _param_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        value = ",".join(map(str, value))
    text = str(value)
    return text if len(text) <= _MAX_PARAM else text[: _MAX_PARAM - 3] + "..."
