"""A subscriber that raises: the batch stays applied (exactly once), every other subscriber
still gets the change, and the caller gets a SubscriberError saying so -- for a Maintainer, a
SQL Database, a MicroBatcher over either, a WindowedStream and a join model."""

from __future__ import annotations

import pandas as pd
import pytest
from ringml.models import JoinRegressor
from ringml.rings import IntegerRing

import ringml as rm
from ringml.errors import SubscriberError
from ringml.microbatch import MicroBatcher
from ringml.sql import Database
from ringml.windows import StreamTable, WindowedStream


def _count_by_a() -> rm.Maintainer:
    m = rm.Maintainer(rm.Query({"R": ["A", "B"], "S": ["B"]}, IntegerRing(), free=["A"]))
    m.insert("S", pd.DataFrame({"B": [1]}))
    return m


def _failing_once():
    calls = []

    def callback(change):
        calls.append(change)
        if len(calls) == 1:
            raise RuntimeError("subscriber failed")

    return callback, calls


def test_maintainer_keeps_the_batch_and_tells_every_subscriber():
    m = _count_by_a()
    failing, _ = _failing_once()
    seen = []
    m.subscribe(failing)
    m.subscribe(lambda delta: seen.append(dict(delta.items())))
    with pytest.raises(SubscriberError, match="stays applied") as caught:
        m.insert("R", pd.DataFrame({"A": [1], "B": [1]}))
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert [cb for cb, _ in caught.value.errors] == [failing]
    assert m.result() == {(1,): 1} and seen == [{(1,): 1}]
    m.insert("R", pd.DataFrame({"A": [2], "B": [1]}))  # the failing one is fine now
    assert m.result() == {(1,): 1, (2,): 1}


@pytest.mark.parametrize("coalesced", [True, False])
def test_microbatcher_does_not_apply_twice(coalesced):
    """The batcher took a raising subscriber for a failed apply and kept the rows pending:
    the next flush applied them again."""
    m = _count_by_a()
    failing, _ = _failing_once()
    m.subscribe(failing)
    batcher = MicroBatcher(m, max_rows=100)
    if not coalesced:  # an absent delete sends the flush to the one-at-a-time fallback
        batcher.delete("R", (9, 9), id="absent")
    batcher.insert("R", (1, 1), id="first")
    batcher.insert("R", (2, 1), id="second")
    with pytest.raises(SubscriberError) as caught:
        batcher.flush()
    flush = caught.value.flush
    if coalesced:
        assert flush.applied == ["first", "second"] and batcher.pending == 0
    else:  # "first" applied (its subscriber raised), "second" still pending
        assert flush.applied == ["first"] and [i for i, _ in flush.rejected] == ["absent"]
        assert batcher.pending == 1
    batcher.flush()
    assert m.result() == {(1,): 1, (2,): 1}


def test_database_commits_the_tables_and_every_diff_goes_out():
    db = Database("CREATE TABLE R (a BIGINT, x DOUBLE);")
    first = db.create_view("first", "SELECT a, SUM(x) AS s FROM R GROUP BY a")
    second = db.create_view("second", "SELECT COUNT(*) AS n FROM R")
    failing, _ = _failing_once()
    first.subscribe(failing)
    diffs = []
    second.subscribe(diffs.append)
    with pytest.raises(SubscriberError):
        db.insert("R", {"a": [1], "x": [2.0]})
    assert db.query("SELECT COUNT(*) AS n FROM R")["n"].tolist() == [1]
    assert first.to_pandas().to_dict("records") == [{"a": 1, "s": 2.0}]
    assert [list(zip(d["n"], d["multiplicity"], strict=True)) for d in diffs] == [[(0, -1), (1, 1)]]
    db.delete("R", {"a": [1], "x": [2.0]})  # present: the insert was committed once
    assert second.to_pandas()["n"].tolist() == [0]


def test_windowed_stream_moves_on_when_a_targets_subscriber_raises():
    """The stream undid the other targets (and kept its watermark) while the failing
    target kept the rows: the targets disagreed."""
    a, b = (rm.Maintainer(rm.Query({"S": ["t", "v"]}, IntegerRing())) for _ in range(2))
    failing, _ = _failing_once()
    a.subscribe(failing)
    stream = WindowedStream([a, b], {"S": StreamTable("t", partition=10, window="RANGE 20")})
    with pytest.raises(SubscriberError):
        stream.insert("S", pd.DataFrame({"t": [1, 2], "v": [1, 1]}))
    assert a.result() == b.result() == 2
    assert stream.watermark == 2
    stream.insert("S", pd.DataFrame({"t": [50], "v": [1]}))  # partitions 0 expire from both
    assert a.result() == b.result() == 1


def test_join_model_refits_when_its_maintainers_subscriber_raises():
    schemas = {"S": ["k", "x", "y"], "T": ["k", "z"]}
    model = JoinRegressor(schemas, "y").fit({"T": pd.DataFrame({"k": [0], "z": [1.0]})})
    failing, _ = _failing_once()
    model.maintainer_.subscribe(failing)
    rows = pd.DataFrame({"k": [0, 0, 0], "x": [1.0, 2.0, 3.0], "y": [2.0, 4.1, 5.9]})
    with pytest.raises(SubscriberError):
        model.partial_fit({"S": rows})
    assert model.n_samples_seen_ == 3  # refitted on the applied batch, not rolled back
    model.partial_fit({"S": rows.iloc[:1]})
    assert model.n_samples_seen_ == 4
