"""The Spark layer's pure-Python parts, without starting Spark: the feed files
:func:`write_change_file` writes (what Spark's readers, set up as :data:`CSV_OPTIONS` says,
read back exactly), the read schema of a :class:`ChangeFeed`, the checks of a Spark
checkpoint location, the Arrow timestamps of a micro-batch, and what a streaming target
shows after a commit failed.  The ``spark`` tests of ``test_spark*.py`` read such files
with Spark."""

from __future__ import annotations

import datetime
import json
import os
import warnings

import numpy as np
import pandas as pd
import pytest
from ringml.rings.scalar import IntegerRing

import ringml as rm

pa = pytest.importorskip("pyarrow")
from ringml.pipelines.spark_checkpoint import CheckpointError  # noqa: E402
from ringml.pipelines.spark_stream import (  # noqa: E402
    CSV_OPTIONS,
    NULL_TOKEN,
    ChangeFeed,
    StreamingMaintainer,
    _SparkCheckpointFolder,
    naive_timestamps,
    spark_types_of,
    write_change_file,
    write_stream_files,
)

from ringml.datasets.streams import StreamBatch  # noqa: E402


def _layout(ops, keys, relation="R", **extra) -> pa.Table:
    """A micro-batch in the pipeline's internal layout (feed 0, column ``k``)."""
    n = len(ops)
    return pa.table(
        {
            "__ringml_feed": pa.array([0] * n, pa.int32()),
            "__ringml_relation": [relation] * n,
            "__ringml_op": ops,
            "__ringml_mult": pa.array([None] * n, pa.int64()),
            "__ringml_corrupt": pa.array([None] * n, pa.string()),
            "__f0__k": pa.array(keys, pa.int64()),
            **extra,
        }
    )


def _count_query() -> rm.Query:
    return rm.Query({"R": ["k"]}, IntegerRing(), free=["k"])


# ------------------------------------------------------------------ writing feed files
def test_csv_quotes_text_and_tells_null_from_the_empty_string(tmp_path):
    frame = pd.DataFrame(
        {
            "op": "insert",
            "k": ['say "hi"', "two\nlines", "", "a,b", None],
            "n": [1, 2, 3, 4, 5],
            "x": [0.1234567890123, 1 / 3, np.nan, 1e300, -0.0],
        }
    )
    path = write_change_file(tmp_path / "p.csv", frame)
    text = open(path, encoding="utf-8").read()
    assert text == (
        "op,k,n,x\n"
        '"insert","say ""hi""",1,0.1234567890123\n'
        '"insert","two\nlines",2,0.3333333333333333\n'
        '"insert","",3,\n'  # the empty string quoted, NULL (NaN) unquoted-empty
        '"insert","a,b",4,1e+300\n'
        '"insert",,5,-0.0\n'
    )
    # what Spark is told: RFC 4180 quotes, quoted newlines, "" is '' and nothing is NULL,
    # the header checked against the schema
    assert CSV_OPTIONS["escape"] == '"' and CSV_OPTIONS["multiLine"] == "true"
    assert CSV_OPTIONS["emptyValue"] == "" and CSV_OPTIONS["nullValue"] == NULL_TOKEN != ""
    assert CSV_OPTIONS["enforceSchema"] == "false" and CSV_OPTIONS["header"] == "true"
    # the one text CSV feeds read as NULL cannot be written
    with pytest.raises(ValueError, match=r"column 'k', row 1: .* read as NULL"):
        write_change_file(tmp_path / "q.csv", pd.DataFrame({"k": ["a", NULL_TOKEN]}))
    assert not os.path.exists(tmp_path / "q.csv")


def test_json_floats_are_exact_and_dates_iso(tmp_path):
    frame = pd.DataFrame(
        {
            "relation": "T",
            "k": pd.array([1, None, 3], dtype="Int64"),
            "x": [0.1234567890123, 1 / 3, np.nan],
            "d": [datetime.date(2024, 5, 17), None, datetime.date(2024, 1, 2)],
            "ts": pd.to_datetime(["2024-01-01 10:30:00.25", None, "2024-01-02"], format="ISO8601"),
            "day": pd.to_datetime(["2024-03-01", "2024-03-02", None]),
            "s": ["", None, 'q"\n'],
        }
    )
    path = write_change_file(tmp_path / "p.json", frame, format="json")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert rows[0] == {
        "relation": "T", "k": 1, "x": 0.1234567890123, "d": "2024-05-17",
        "ts": "2024-01-01T10:30:00.250000", "day": "2024-03-01", "s": "",
    }  # fmt: skip
    assert rows[1]["x"] == 1 / 3 and rows[1]["k"] is None and rows[1]["d"] is None
    assert rows[1]["ts"] is None and rows[1]["s"] is None and rows[1]["day"] == "2024-03-02"
    assert rows[2]["x"] is None and rows[2]["ts"] == "2024-01-02T00:00:00"
    assert rows[2]["s"] == 'q"\n'


def test_tagged_files_keep_big_integers_exact(tmp_path):
    a = pd.DataFrame({"k": [1, 2], "big": [2**62 + 1, 2**62 + 3]})
    b = pd.DataFrame({"k": [1, 2], "w": [5, 6]})
    stream = [
        StreamBatch("A", a, np.ones(2, np.int64), np.arange(2)),
        StreamBatch("B", b, np.ones(2, np.int64), np.arange(2)),
    ]
    types = spark_types_of({"A": a, "B": b})
    (path,) = write_stream_files(tmp_path / "feed", stream, tagged=True, per_file=2, columns=types)
    lines = open(path).read().splitlines()
    assert lines == [
        "relation,op,k,big,w",
        '"A","insert",1,4611686018427387905,',
        '"A","insert",2,4611686018427387907,',
        '"B","insert",1,,5',
        '"B","insert",2,,6',
    ]
    (path,) = write_stream_files(
        tmp_path / "json", stream, tagged=True, per_file=2, columns=types, format="json"
    )
    rows = [json.loads(line) for line in open(path)]
    assert [r["big"] for r in rows] == [2**62 + 1, 2**62 + 3, None, None]


# ------------------------------------------------------------------ reading feeds
def test_the_read_schema_keeps_the_given_column_order():
    mult_last = ChangeFeed(
        "f", "k bigint, v bigint, mult int", relation="R", op_column=None, mult_column="mult"
    )
    assert mult_last.ddl() == "`k` bigint, `v` bigint, `mult` bigint, `_corrupt_record` string"
    assert list(mult_last.data_columns()) == ["k", "v"]
    # op / relation columns the schema does not name come first (write_stream_files' layout)
    tagged = ChangeFeed("f", {"k": "bigint", "s": "string"}, relation=None)
    assert tagged.ddl() == (
        "`relation` string, `op` string, `k` bigint, `s` string, `_corrupt_record` string"
    )
    named = ChangeFeed("f", "k bigint, relation string, op string, s string", relation=None)
    assert named.ddl() == (
        "`k` bigint, `relation` string, `op` string, `s` string, `_corrupt_record` string"
    )


def test_zoned_timestamps_become_naive_in_the_session_time_zone():
    instants = pa.array([0, 3_600_000_000], pa.timestamp("us", tz="UTC"))
    table = pa.table({"t": instants, "n": pa.array([0, 1], pa.timestamp("us")), "i": [1, 2]})
    utc = naive_timestamps(table)
    assert utc.schema.field("t").type == pa.timestamp("us")
    assert utc.column("t").to_pylist() == [
        datetime.datetime(1970, 1, 1, 0),
        datetime.datetime(1970, 1, 1, 1),
    ]
    paris = naive_timestamps(table, "Europe/Paris").column("t").to_pylist()
    assert paris == [datetime.datetime(1970, 1, 1, 1), datetime.datetime(1970, 1, 1, 2)]
    assert naive_timestamps(table, "UTC").column("n").equals(table.column("n"))
    with pytest.raises(ValueError, match=r"column 't'.*'Mars/Olympus'"):
        naive_timestamps(table, "Mars/Olympus")


def test_a_zoned_timestamp_reaches_a_sql_timestamp_column(tmp_path):
    sql = pytest.importorskip("ringml.sql")
    from ringml.pipelines.spark_views import StreamingViews

    db = sql.Database("CREATE TABLE E (k BIGINT, ts TIMESTAMP)")
    db.create_view("late", "SELECT k FROM E WHERE ts > TIMESTAMP '2024-01-01 12:00:00'")
    sv = StreamingViews(db, tmp_path / "s", on_error="dead_letter", dead_letter_path=tmp_path / "d")
    stamps = pd.to_datetime(["2024-01-01 10:30:00", "2024-01-01 23:59:59"]).tz_localize("UTC")
    ts = pa.array(stamps, pa.timestamp("us", tz="UTC"))
    report = sv.process_batch(_layout(["insert"] * 2, [1, 2], "E", __f0__ts=ts), 0)
    assert report.applied == 2 and report.bad_rows == []
    assert db.table("E").ts.tolist() == list(stamps.tz_localize(None))
    assert sv.view("late").k.tolist() == [2]
    sv.time_zone = "America/New_York"  # 10:30 UTC is 05:30 there
    ts = pa.array(stamps[:1], pa.timestamp("us", tz="UTC"))
    sv.process_batch(_layout(["insert"], [3], "E", __f0__ts=ts), 1)
    assert db.table("E").ts.iloc[-1] == pd.Timestamp("2024-01-01 05:30:00")


# ------------------------------------------------------------------ Spark checkpoints
def _spark_checkpoint(folder, query_id="q-1", committed=()):
    """The files of a Spark checkpoint location that the pipeline reads."""
    os.makedirs(os.path.join(folder, "commits"), exist_ok=True)
    with open(os.path.join(folder, "metadata"), "w") as handle:
        handle.write(json.dumps({"id": query_id}) + "\n")
    for batch_id in committed:
        open(os.path.join(folder, "commits", str(batch_id)), "w").close()
    return str(folder)


def test_checkpoint_locations_as_paths_and_file_uris(tmp_path):
    ck = _spark_checkpoint(tmp_path / "ck", "q-1", committed=[0, 1])
    for location in (ck, f"file://{ck}", f"file:{ck}"):
        folder = _SparkCheckpointFolder(location)
        assert folder.readable and folder.query_id() == "q-1"
        assert folder.committed() == [0, 1]
    assert _SparkCheckpointFolder(str(tmp_path / "new")).query_id() is None
    # another scheme without a Spark session to read it: not readable, never "new"
    remote = _SparkCheckpointFolder("s3a://bucket/ck")
    assert not remote.readable and remote.unreadable


def test_a_fresh_state_refuses_a_checkpoint_with_committed_batches(tmp_path):
    def started(state, location) -> StreamingMaintainer:
        sm = StreamingMaintainer(rm.Maintainer(_count_query()), tmp_path / state)
        sm._spark_checkpoint = location
        sm._spark_folder = _SparkCheckpointFolder(location)
        sm._check_spark_checkpoint()
        return sm

    old = _spark_checkpoint(tmp_path / "old", "q-1", committed=[0, 1, 2])
    with pytest.raises(CheckpointError, match=r"state-b is fresh .* committed batches up to 2"):
        started("state-b", old)
    with pytest.raises(CheckpointError, match=str(tmp_path / "old")):
        started("state-b", f"file://{old}")
    # a checkpoint whose query only ran empty batches, or a new one, is fine
    started("state-b", _spark_checkpoint(tmp_path / "empty", "q-2"))
    started("state-b", str(tmp_path / "new"))
    # a state that ran with the checkpoint (the query id is recorded) restarts, by URI too
    sm = StreamingMaintainer(rm.Maintainer(_count_query()), tmp_path / "state-c")
    sm._spark_folder = _SparkCheckpointFolder(old)
    sm.process_batch(_layout(["insert"], [1]), 3)
    assert sm.meta["spark_query_id"] == "q-1"
    started("state-c", f"file://{old}")
    # an empty first micro-batch records the query in a fresh state (it then restarts)
    sm = StreamingMaintainer(rm.Maintainer(_count_query()), tmp_path / "state-d")
    sm._spark_folder = _SparkCheckpointFolder(old)
    assert sm.process_batch(_layout([], []), 0) is None
    assert started("state-d", old).meta["spark_query_id"] == "q-1"
    # a location this process cannot read skips the checks, saying so (not "new")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started("state-c", "s3a://bucket/ck")
    assert any("cannot be read" in str(w.message) for w in caught)


# ------------------------------------------------------------------ failed commits
def test_after_a_failed_commit_result_shows_the_committed_state(tmp_path, monkeypatch):
    sm = StreamingMaintainer(rm.Maintainer(_count_query()), tmp_path / "state")
    sm.process_batch(_layout(["insert"], [1]), 0)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(sm.checkpoint, "commit", fail)
    with pytest.raises(OSError, match="disk full"):
        sm.process_batch(_layout(["insert", "insert"], [2, 3]), 1)
    monkeypatch.undo()
    assert sm.last_batch_id == 0
    assert sm.result() == {(1,): 1}  # as of batch 0, not the uncommitted batch 1
    assert sm.maintainer.result() == {(1,): 1}  # the target itself went back too
    report = sm.process_batch(_layout(["insert", "insert"], [2, 3]), 1)  # the retry
    assert report.applied == 2 and sm.result() == {(1,): 1, (2,): 1, (3,): 1}


def test_a_dead_letter_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "dead").write_text("not a folder")
    with pytest.raises(ValueError, match=r"dead_letter_path '.*dead' is a file"):
        StreamingMaintainer(
            rm.Maintainer(_count_query()),
            tmp_path / "state",
            on_error="dead_letter",
            dead_letter_path=tmp_path / "dead",
        )
    # one that becomes a file later: the failed write names it and the batch
    sm = StreamingMaintainer(
        rm.Maintainer(_count_query()),
        tmp_path / "state2",
        on_error="dead_letter",
        dead_letter_path=tmp_path / "later" / "dead",
    )
    (tmp_path / "later").write_text("")
    with pytest.raises(OSError, match=r"batch 0: cannot write .*dead_letter_path '.*later"):
        sm.process_batch(_layout(["insert", "upsert"], [1, 2]), 0)
    assert sm.last_batch_id == -1 and sm.result() == {}
