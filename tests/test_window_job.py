"""The main job's window mode (``ringml demo --window``) end to end on a small database:
real local Spark, a real SQLite MLflow store, every refresh checked against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
]


def test_window_job_streams_expires_tracks_and_checks(spark, tmp_path):
    from ringml.pipelines.window_job import WindowJobConfig, run_window_job

    from mlflow import MlflowClient

    lines: list[str] = []
    config = WindowJobConfig(
        window_days=4, days=15, days_per_batch=3, postcodes=40, sales_per_postcode=10,
        late_sales=2, workdir=str(tmp_path / "job"), model_name="window-test", progress=False,
    )  # fmt: skip
    report = run_window_job(config, out=lines.append)
    text = "\n".join(lines)
    assert report.ok, text
    assert report.refreshes == report.micro_batches >= 5
    assert len(report.dead_letters) == 2, text
    assert all("behind the watermark" in r for r in report.dead_letters["reason"])
    assert 0 < report.window_rows < report.history_rows
    assert "open the UI: mlflow ui --backend-store-uri sqlite:///" in text

    client = MlflowClient(tracking_uri=report.tracking_uri)
    marks = [m.value for m in client.get_metric_history(report.run_id, "watermark_day")]
    assert len(marks) == report.refreshes and np.all(np.diff(marks) > 0)
    coef = client.get_metric_history(report.run_id, "coef/livingarea")
    assert len(coef) == report.refreshes
    assert coef[-1].value == pytest.approx(report.last["livingarea"], rel=1e-12)
    paths = {a.path for a in client.list_artifacts(report.run_id, "history")}
    assert paths == {"history/history.png", "history/refreshes.csv"}
    assert open(report.plot, "rb").read(4) == b"\x89PNG"
