"""MLflow pyfunc model (models-from-code) for a linear model kept fresh by ringml.

This file is what :class:`ringml.pipelines.mlflow_tracking.RefreshLogger` hands to
``mlflow.pyfunc.log_model(python_model=<this file's path>, artifacts={"coefficients": ...})``:
MLflow copies the *source* into the logged model and executes it when the model is loaded
(https://mlflow.org/docs/latest/ml/model/models-from-code/), so nothing is pickled and the
loading process needs only ``mlflow``, ``numpy`` and ``pandas`` -- not ringml.  Keep it
self-contained: no ringml imports.

The coefficients live in a JSON artifact (``coefficients.json``, format
``ringml.linear_model`` version 1)::

    {"format": "ringml.linear_model", "version": 1,
     "label": "price", "features": ["livingarea", "nbbedrooms", ...],
     "intercept": 123.4,
     "continuous": [["livingarea", 2.5], ...],
     "categorical": [{"variable": "nbbedrooms", "reference": 1,
                      "coefficients": [[2, 10.0], [3, 25.0]]}, ...], ...}

Categories are JSON numbers, strings and booleans as they are; dates, timestamps and
durations are tagged, ``{"date": "2020-01-31"}``, ``{"timestamp": "2020-01-31T08:00:00"}``,
``{"timedelta": "P1DT0H0M0S"}``, and a served row's value meets the category it equals
(a ``datetime.date`` its date, a datetime, ``Timestamp`` or ``datetime64`` its timestamp,
or at midnight also its date: MLflow serves a column of dates as timestamps).

``predict`` computes ``intercept + Σ β_j x_j`` in the same order as
``ringml.models.regression.predict_frame`` (continuous columns in order, then each
categorical variable's one-hot contribution; a reference or unseen category adds 0), so the
served model reproduces the estimator's predictions to rounding.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

import mlflow

FORMAT = "ringml.linear_model"
FORMAT_VERSION = 1


def predict_from_spec(spec: dict[str, Any], frame: pd.DataFrame) -> np.ndarray:
    """``intercept + Σ β_j x_j`` for the rows of ``frame`` (extra columns are ignored)."""
    if spec.get("format") != FORMAT or int(spec.get("version", 0)) > FORMAT_VERSION:
        raise ValueError(
            f"not a {FORMAT} v{FORMAT_VERSION} spec: {spec.get('format')!r} "
            f"v{spec.get('version')!r}"
        )
    missing = [v for v in spec["features"] if v not in frame.columns]
    if missing:
        raise ValueError(f"missing feature columns {missing}")
    out = np.full(len(frame), float(spec["intercept"]), dtype=np.float64)
    for name, beta in spec["continuous"]:
        column = frame[name]
        numbers = column.dtype.kind in "iuf" or (
            column.dtype.kind == "O"
            and pd.api.types.infer_dtype(column, skipna=False)
            in ("integer", "floating", "mixed-integer-float", "decimal", "empty")
        )  # not text, not booleans: the estimator takes neither
        x = column.to_numpy(dtype=np.float64) if numbers else np.array([np.nan])
        if not np.all(np.isfinite(x)):
            raise ValueError(f"feature column {name!r} has missing or non-numeric values")
        out += float(beta) * x
    for entry in spec["categorical"]:
        table = {_key(value): float(beta) for value, beta in entry["coefficients"]}
        if table:
            values = frame[entry["variable"]].map(lambda v, t=table: _coefficient(t, v))
            out += values.to_numpy(dtype=np.float64)
    return out


def _key(value: Any) -> Any:
    """A category value as a key: JSON's tagged values and the rows' dates, timestamps and
    durations as ``(tag, ISO text)``, numpy scalars as Python's (which hash alike)."""
    if isinstance(value, dict) and len(value) == 1:
        ((tag, text),) = value.items()
        return tag, text
    tagged = category_json(value)
    return tuple(next(iter(tagged.items()))) if isinstance(tagged, dict) else tagged


def _coefficient(table: dict, value: Any) -> float:
    """The coefficient of ``value``'s category (0.0 for none); a timestamp at midnight
    also meets a date category (MLflow turns a served column of dates into timestamps)."""
    key = _key(value)
    if key in table:
        return table[key]
    if isinstance(key, tuple) and key[0] == "timestamp":
        stamp = pd.Timestamp(key[1])
        if stamp.tz is None and stamp == stamp.normalize():
            return table.get(("date", stamp.date().isoformat()), 0.0)
    return 0.0


def category_json(value: Any) -> Any:
    """A category value as JSON takes it (see the module docstring); ``TypeError`` for a
    value of another kind."""
    if isinstance(value, np.generic) and not isinstance(value, np.datetime64 | np.timedelta64):
        value = value.item()
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, datetime.datetime | np.datetime64):
        return {"timestamp": pd.Timestamp(value).isoformat()}
    if isinstance(value, datetime.date):
        return {"date": value.isoformat()}
    if isinstance(value, datetime.timedelta | np.timedelta64):
        return {"timedelta": pd.Timedelta(value).isoformat()}
    raise TypeError(f"a category {value!r} of type {type(value).__name__} has no JSON form")


def category_value(entry: Any) -> Any:
    """The value a category's JSON form stands for (:func:`category_json` inverted)."""
    if isinstance(entry, dict) and len(entry) == 1:
        ((tag, text),) = entry.items()
        if tag == "date":
            return datetime.date.fromisoformat(text)
        if tag == "timestamp":
            return pd.Timestamp(text)
        if tag == "timedelta":
            return pd.Timedelta(text)
    return entry


class RingmlLinearModel(PythonModel):
    """Linear model whose coefficients are read from the ``coefficients`` JSON artifact."""

    def load_context(self, context) -> None:
        with open(context.artifacts["coefficients"], encoding="utf-8") as f:
            self.spec = json.load(f)

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None):
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        return predict_from_spec(self.spec, frame)


# MLflow executes a copy of this file under a module name of its own when it logs or loads
# the model; importing it as part of ringml must not set MLflow's process-wide model.
if __name__ != "ringml.pipelines.mlflow_pyfunc":
    mlflow.models.set_model(RingmlLinearModel())
