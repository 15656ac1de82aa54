"""The main job (``ringml demo``) end to end on a small database: real local Spark, a real
SQLite MLflow store, checked against scikit-learn and networkx on the final join."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_main_job_streams_refits_tracks_and_checks(spark, tmp_path):
    from ringml.pipelines.main_job import JobConfig, run_main_job

    from mlflow import MlflowClient

    lines: list[str] = []
    config = JobConfig(
        postcodes=60,
        batch_size=300,
        micro_batches=4,
        workdir=str(tmp_path / "job"),
        model_name="job-test-model",
        progress=False,
    )
    report = run_main_job(config, out=lines.append)
    text = "\n".join(lines)

    assert report.ok, text
    assert report.micro_batches == 4 and report.refreshes == 4
    assert report.tuples > 0 and report.join_rows > 0
    # the three injected rows, each for its own reason, and nothing else
    reasons = sorted(report.dead_letters["reason"])
    assert len(reasons) == 3, reasons
    assert any("unknown relation 'Hose'" in r for r in reasons)
    assert any("unparseable" in r for r in reasons)
    assert any("not present" in r for r in reasons)
    assert "mlflow ui --backend-store-uri sqlite:///" in text

    client = MlflowClient(tracking_uri=report.tracking_uri)
    history = client.get_metric_history(report.run_id, "rows_applied")
    # step = Spark's batch id, the number the report and the dead letters give a batch
    assert sorted(m.step for m in history) == [0, 1, 2, 3]
    assert sum(m.value for m in history) == report.tuples
    counts = {
        name: {m.step: m.value for m in client.get_metric_history(report.run_id, name)}
        for name in ("rows_applied", "inserts", "deletes", "bad_rows")
    }
    for step, rows in counts["rows_applied"].items():
        assert counts["inserts"][step] + counts["deletes"][step] == rows
    assert sum(counts["deletes"].values()) > 0
    (bad_step,) = [step for step, bad in counts["bad_rows"].items() if bad]
    assert set(report.dead_letters["batch_id"]) == {bad_step}
    assert f"  batch {bad_step}: 3 malformed row(s) -> dead letters" in lines
    champion = client.get_model_version_by_alias("job-test-model", "champion")
    assert str(champion.version) == report.champion
    artifacts = [a.path for a in client.list_artifacts(report.run_id, "chow_liu")]
    assert {"chow_liu/edges.csv", "chow_liu/mutual_info.csv"} <= set(artifacts)

    # a second run in the same folder starts a fresh stream and a new MLflow run
    again = run_main_job(config, out=lambda _: None)
    assert again.run_id != report.run_id and again.tuples == report.tuples
