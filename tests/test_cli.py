"""The ``ringml`` command line: explain prints a plan; bad option values are usage errors
(exit 2, one line naming the option), not tracebacks."""

from __future__ import annotations

import pytest

from ringml.cli import main


def test_explain_prints_the_plan(capsys):
    assert main(["explain", "housing", "--updatable", "House, Shop"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("strategy: fivm; ring: CovarianceRing")
    assert "variable order: postcode{" in out


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
