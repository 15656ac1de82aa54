"""The ``ringml`` command line: explain prints a plan; bad option values are usage errors
(exit 2, one line naming the option), not tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ringml.cli import main


def test_explain_prints_the_plan(capsys):
    assert main(["explain", "housing", "--updatable", "House, Shop"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("strategy: fivm; ring: CovarianceRing")
    assert "variable order: postcode{" in out


def test_explain_into_a_closed_pipe_stops_quietly():
    """``ringml explain housing | head -1``: a reader that left is no error to report."""
    command = [sys.executable, "-m", "ringml", "explain", "housing"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # before the child writes: its writes find no reader
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 1 and err == ""


@pytest.mark.parametrize(
    "argv, message",
    [
        (["explain", "housing", "--updatable", "Nope"], "updatable relations ['Nope']"),
        (["explain", "housing", "--updatable", " , "], "--updatable names no relation"),
        (["explain", "housing", "--order", "postcode{"], "variable order"),
        (["demo", "--window", "0"], "argument --window: '0': must be at least 1"),
        (["demo", "--postcodes", "-3"], "argument --postcodes"),
        (["demo", "--window", "3", "--lateness", "-1"], "argument --lateness"),
        (["demo", "--window", "3", "--lateness", "nan"], "argument --lateness"),
        (["demo", "--batch-size", "x"], "'x' is not an integer"),
    ],
)
def test_bad_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--deletes", "0.7"], "argument --deletes: '0.7': must be a number in [0, 0.5]"),
        (["--deletes", "-0.1"], "argument --deletes"),
        (["--deletes", "nan"], "argument --deletes"),
        (["--batch-size", "1"], "--batch-size 1: deletes need a batch size of at least 2"),
        (["--ridge", "-1"], "argument --ridge: '-1': must be a finite number >= 0"),
        (["--ridge", "nan"], "argument --ridge"),
        (["--window", "7", "--ridge", "-1"], "argument --ridge"),
        (["--master", "bogus"], "argument --master: 'bogus' is not a Spark master URL"),
        (["--tracking-uri", "bogus://x"], "argument --tracking-uri: 'bogus://x': MLflow has no"),
        (["--workdir", "afile"], "argument --workdir: 'afile' is not a folder"),
        (["--workdir", "afile/sub"], "afile is not a folder"),
    ],
)
def test_bad_demo_arguments_are_usage_errors_before_anything_runs(
    argv, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--no-progress", "--postcodes", "20", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]  # no work folder was made


def _no_spark_check(monkeypatch, reason=None):
    """Make the demo's Spark check answer ``reason`` (None: Spark can start)."""
    pytest.importorskip("pyspark")
    pytest.importorskip("mlflow")
    monkeypatch.setattr("ringml.pipelines.main_job.spark_unavailable", lambda: reason)


@pytest.mark.parametrize("mode", [[], ["--window", "3", "--days", "6"]])
def test_demo_without_java_is_a_one_line_error(mode, tmp_path, monkeypatch, capsys):
    _no_spark_check(monkeypatch, "no Java runtime found")
    workdir = tmp_path / "wd"
    assert main(["demo", "--no-progress", "--workdir", str(workdir), *mode]) == 1
    err = capsys.readouterr().err
    assert err == (
        "ringml demo: error: the main job needs Spark: no Java runtime found "
        "(scripts/demo.sh installs it)\n"
    )
    assert not workdir.exists()


@pytest.mark.parametrize("mode", [[], ["--window", "3", "--days", "6"]])
def test_demo_leaves_folders_it_did_not_make(mode, tmp_path, monkeypatch, capsys):
    _no_spark_check(monkeypatch)
    workdir = tmp_path / "wd"
    (workdir / "state").mkdir(parents=True)
    (workdir / "state" / "notes.txt").write_text("precious")
    argv = ["demo", "--no-progress", "--postcodes", "20", "--workdir", str(workdir), *mode]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith(f"ringml demo: error: {workdir / 'state'} exists") and err.count("\n") == 1
    )
    assert (workdir / "state" / "notes.txt").read_text() == "precious"
    assert sorted(p.name for p in workdir.iterdir()) == ["state"]  # nothing written
