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

``predict`` computes ``intercept + Σ β_j x_j`` in the same order as
``ringml.models.regression.predict_frame`` (continuous columns in order, then each
categorical variable's one-hot contribution; a reference or unseen category adds 0), so the
served model reproduces the estimator's predictions to rounding.
"""

from __future__ import annotations

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
        x = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError(f"feature column {name!r} has missing or non-numeric values")
        out += float(beta) * x
    for entry in spec["categorical"]:
        table = {_key(value): float(beta) for value, beta in entry["coefficients"]}
        if table:
            values = frame[entry["variable"]].map(lambda v, t=table: t.get(_key(v), 0.0))
            out += values.to_numpy(dtype=np.float64)
    return out


def _key(value: Any) -> Any:
    """Category values as plain Python scalars (numpy ints and floats hash like Python's)."""
    return value.item() if isinstance(value, np.generic) else value


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
