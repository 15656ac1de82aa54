"""Coefficients and holdout error over the refreshes in MLflow (RefreshLogger.log_history).

A JoinRegressor over a small Housing-like star is refreshed batch by batch and logged into a
real SQLite store in a temporary folder, with ``log_coefficients=True``; the coefficient
metrics read back from the store must be the model's coefficients after each refresh, and
the history artifacts (a CSV table and a PNG plot) must hold the same numbers.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow", reason="the [mlflow] extra is not installed")

from ringml.models import JoinRegressor  # noqa: E402
from ringml.pipelines.mlflow_tracking import (  # noqa: E402
    RefreshLogger,
    draw_refresh_history,
    sqlite_tracking_uri,
)

from mlflow import MlflowClient  # noqa: E402
from ringml.datasets import build_stream, housing_star  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")

FEATURES = ["livingarea", "garden", "averagesalary", "nbbedrooms"]


def test_coefficients_are_logged_per_refresh_and_plotted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    previous = mlflow.get_tracking_uri()
    ds = housing_star(postcodes=5, seed=3)
    holdout = housing_star(postcodes=3, seed=4).join()
    model = JoinRegressor(
        ds.schemas, "price", FEATURES, categorical=["nbbedrooms"], ridge=0.01,
        handle_unknown="ignore",
    )  # fmt: skip
    stream = build_stream(ds.relations, batch_size=12, delete_fraction=0.25, seed=2)
    expected = []
    try:
        with RefreshLogger(
            "history-test", store_dir=tmp_path / "store", holdout=holdout, log_coefficients=True
        ) as logger:
            for batch in stream:
                clock = {"clock": 10 * len(expected)}
                record = logger.partial_fit(model, batch, extra_metrics=clock)
                fitted = model.result_ is not None
                names = [c if isinstance(c, str) else f"{c[0]}={c[1]}" for c in model.columns_]
                want = dict(zip(names, model.coef_.tolist(), strict=True)) if fitted else {}
                if fitted:
                    want["(intercept)"] = model.intercept_
                assert record.coefficients == want
                expected.append(want)
            paths = logger.log_history(x="clock", title="test")
            run_id = logger.run_id
    finally:
        mlflow.set_tracking_uri(previous)
    client = MlflowClient(sqlite_tracking_uri(tmp_path / "store"))
    steps = {i + 1: want for i, want in enumerate(expected)}
    last = expected[-1]
    assert last, "the stream must end with a fitted model"
    for name in last:
        key = "coef/intercept" if name == "(intercept)" else "coef/" + name.replace("=", "/")
        history = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        assert history == {s: w[name] for s, w in steps.items() if name in w}, key
    assert sorted(paths) == ["history/history.png", "history/refreshes.csv"]
    local = mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path="history", tracking_uri=sqlite_tracking_uri(tmp_path / "store")
    )
    table = pd.read_csv(f"{local}/refreshes.csv")
    assert table["step"].tolist() == list(steps)
    assert table["clock"].tolist() == [10 * i for i in range(len(steps))]
    for name, value in last.items():
        assert table[f"coef:{name}"].iloc[-1] == pytest.approx(value, rel=1e-15)
    holdout_rmse = {m.step: m.value for m in client.get_metric_history(run_id, "holdout_rmse")}
    got = table.set_index("step")["holdout_rmse"].dropna().to_dict()
    assert got == pytest.approx(holdout_rmse, rel=1e-15)
    png = open(f"{local}/history.png", "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_draw_refresh_history_rejects_unknown_names(tmp_path):
    from ringml.pipelines.mlflow_tracking import RefreshRecord

    records = [
        RefreshRecord(1, {"holdout_rmse": 2.0}, coefficients={"a": 1.0, "(intercept)": 0.5}),
        RefreshRecord(2, {"holdout_rmse": 1.5}, coefficients={"a": 1.2, "(intercept)": 0.4}),
    ]
    with pytest.raises(ValueError, match="metric 'when'"):
        draw_refresh_history(records, tmp_path / "h.png", x="when")
    with pytest.raises(ValueError, match="coefficient 'b'"):
        draw_refresh_history(records, tmp_path / "h.png", columns=["b"])
    buffer = io.BytesIO()
    draw_refresh_history(records, buffer, scales={"a": 2.0})
    assert buffer.getvalue()[:4] == b"\x89PNG"
    assert np.isfinite(records[-1].coefficients["a"])
