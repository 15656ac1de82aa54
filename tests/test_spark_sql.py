"""Streaming into SQL views (``ringml.pipelines.spark_views.StreamingViews``): table change
feeds in, view diffs out, exactly once.

The oracle is DuckDB running each view's SQL on the tables: after the stream every view
equals DuckDB on the final tables, and every micro-batch's diff equals the multiset
difference of DuckDB's results on the tables before and after that batch.  The tests
without the ``spark`` mark hand micro-batches to ``process_batch`` in the pipeline's internal
layout; the two Spark tests read CSV change-feed files with Structured Streaming.
"""

from __future__ import annotations

import datetime
import pickle
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from sql_oracle import assert_same_rows, diff_counter, duckdb_results, multiset_difference

import ringml as rm

pa = pytest.importorskip("pyarrow")
pytest.importorskip("sqlglot")
from ringml.pipelines.spark_checkpoint import CheckpointError  # noqa: E402
from ringml.pipelines.spark_stream import (  # noqa: E402
    ChangeFeed,
    FeedError,
    StreamingMaintainer,
    write_change_file,
)
from ringml.pipelines.spark_views import StreamingViews, spark_types_of_tables  # noqa: E402

import ringml.sql as sql  # noqa: E402

DDL = """
    CREATE TABLE Orders (o_id INTEGER, cust VARCHAR, amount DOUBLE, day DATE);
    CREATE TABLE Customers (cust VARCHAR, city VARCHAR);
"""
VIEWS = {
    "by_city": """SELECT C.city, COUNT(*) AS n, SUM(O.amount) AS total
                  FROM Orders O JOIN Customers C ON O.cust = C.cust GROUP BY C.city""",
    "big": "SELECT cust, amount FROM Orders WHERE amount > 10 AND day >= DATE '2024-01-02'",
}
COLUMNS = {"Orders": ["o_id", "cust", "amount", "day"], "Customers": ["cust", "city"]}
FEED_COLUMNS = ["o_id", "cust", "amount", "day", "city"]  # a tagged feed: the union


def _o(i, cust, amount, day):
    return {"o_id": i, "cust": cust, "amount": amount, "day": f"2024-01-0{day}"}


def _c(cust, city):
    return {"cust": cust, "city": city}


# micro-batches of (table, op, row): inserts, deletes, an update (pre/post image), a
# duplicate row (tables are bags), a delete of a joined customer
STREAM = [
    [("Customers", "insert", _c("c1", "Oslo")), ("Customers", "insert", _c("c2", "Rome")),
     ("Customers", "insert", _c("c3", "Oslo")), ("Orders", "insert", _o(1, "c1", 5.0, 1)),
     ("Orders", "insert", _o(2, "c1", 12.5, 2)), ("Orders", "insert", _o(3, "c2", 20.0, 3)),
     ("Orders", "insert", _o(4, "c3", 7.0, 3))],
    [("Orders", "insert", _o(5, "c2", 11.0, 4)), ("Orders", "insert", _o(6, "c3", 30.0, 4)),
     ("Orders", "delete", _o(1, "c1", 5.0, 1))],
    [("Customers", "update_preimage", _c("c3", "Oslo")),
     ("Customers", "update_postimage", _c("c3", "Paris")),
     ("Orders", "insert", _o(7, "c1", 12.5, 5))],
    [("Orders", "delete", _o(3, "c2", 20.0, 3)), ("Customers", "insert", _c("c4", "Rome")),
     ("Orders", "insert", _o(8, "c4", 15.0, 6)), ("Orders", "insert", _o(7, "c1", 12.5, 5))],
    [("Customers", "delete", _c("c2", "Rome")), ("Orders", "delete", _o(7, "c1", 12.5, 5))],
]  # fmt: skip


def make_db(views: dict[str, str] = VIEWS) -> sql.Database:
    db = sql.Database(DDL)
    for name, text in views.items():
        db.create_view(name, text)
    return db


def table_states(stream=STREAM) -> list[dict[str, pd.DataFrame]]:
    """The tables (typed frames) before the first batch and after each one."""
    bags = {t: Counter() for t in COLUMNS}
    states = [_frames(bags)]
    for batch in stream:
        for table, op, row in batch:
            key = tuple(row[c] for c in COLUMNS[table])
            bags[table][key] += 1 if op in ("insert", "update_postimage") else -1
            assert bags[table][key] >= 0
        states.append(_frames(bags))
    return states


def _frames(bags) -> dict[str, pd.DataFrame]:
    out = {}
    for table, bag in bags.items():
        rows = [key for key, count in bag.items() for _ in range(count)]
        frame = pd.DataFrame(rows, columns=COLUMNS[table])
        if table == "Orders":
            frame = frame.astype({"o_id": np.int64, "amount": np.float64})
            frame["day"] = pd.to_datetime(frame["day"])
        out[table] = frame
    return out


def expected_diffs(states) -> list[dict[str, Counter]]:
    """Per batch and view: DuckDB's result after minus before, as a multiset."""
    results = [duckdb_results(VIEWS, state) for state in states]
    return [
        {v: multiset_difference(before[v], after[v]) for v in VIEWS}
        for before, after in zip(results, results[1:], strict=False)
    ]


def assert_views_equal_duckdb(db: sql.Database, tables: dict[str, pd.DataFrame]) -> None:
    expected = duckdb_results(VIEWS, tables)
    for name in VIEWS:
        assert_same_rows(db.view(name).to_pandas(), expected[name], name)
    for table in COLUMNS:
        assert_same_rows(db.table(table), tables[table], table)


def layout(batch) -> pa.Table:
    """A micro-batch of one tagged feed (op column) in the pipeline's internal layout."""
    n = len(batch)
    types = {"o_id": pa.int64(), "cust": pa.string(), "amount": pa.float64(),
             "day": pa.date32(), "city": pa.string()}  # fmt: skip
    data = {
        "__ringml_feed": pa.array([0] * n, pa.int32()),
        "__ringml_relation": [table for table, _, _ in batch],
        "__ringml_op": [op for _, op, _ in batch],
        "__ringml_mult": pa.array([None] * n, pa.int64()),
        "__ringml_corrupt": pa.array([None] * n, pa.string()),
    }
    for column, kind in types.items():
        values = [row.get(column) for _, _, row in batch]
        if kind == pa.date32():
            values = [None if v is None else datetime.date.fromisoformat(v) for v in values]
        data[f"__f0__{column}"] = pa.array(values, kind)
    return pa.table(data)


def collector(log: list, fail_at: int | None = None):
    """An ``on_diff`` appending ``(batch_id, view, diff)``; raises once after the first
    view of batch ``fail_at`` (a driver dying mid-delivery)."""
    failed = []

    def on_diff(batch_id: int, view: str, diff: pd.DataFrame) -> None:
        log.append((batch_id, view, diff))
        if batch_id == fail_at and not failed:
            failed.append(view)
            raise RuntimeError("simulated driver crash")

    return on_diff


def assert_diffs_match(per_batch: dict[int, dict[str, pd.DataFrame]], expected) -> None:
    for batch_id, wanted in enumerate(expected):
        got = per_batch.get(batch_id, {})
        for view in VIEWS:
            ours = diff_counter(got[view]) if view in got else Counter()
            assert ours == wanted[view], (batch_id, view, ours, wanted[view])


def file_diffs(sv: StreamingViews) -> dict[int, dict[str, pd.DataFrame]]:
    out: dict[int, dict[str, pd.DataFrame]] = {}
    for view in VIEWS:
        frame = sv.diffs(view)
        for batch_id, part in frame.groupby("batch_id"):
            out.setdefault(int(batch_id), {})[view] = part.drop(columns="batch_id")
    return out


# ------------------------------------------------------------------ without Spark
def test_database_pickles_describes_itself_and_adopts_a_state():
    db = make_db()
    db.insert("Customers", {"cust": ["c1"], "city": ["Oslo"]})
    seen = []
    db.view("by_city").subscribe(lambda diff: seen.append(diff))  # a lambda: not picklable
    copy = pickle.loads(pickle.dumps(db))  # subscribers are dropped, the state is kept
    assert copy.description() == db.description()
    assert set(copy.description()) == {"table Customers", "table Orders", "view big",
                                       "view by_city"}  # fmt: skip
    copy.insert("Orders", {"o_id": [1], "cust": ["c1"], "amount": [3.0], "day": ["2024-01-03"]})
    assert not seen and len(copy.view("by_city").to_pandas()) == 1
    db.adopt_state(copy)  # the copy's rows, this database's views and subscribers
    assert db.view("by_city").to_pandas().n.tolist() == [1]
    db.insert("Orders", {"o_id": [2], "cust": ["c1"], "amount": [4.0], "day": ["2024-01-03"]})
    assert len(seen) == 1 and seen[0].multiplicity.tolist() == [-1, 1]
    # formatting does not change a description; a definition does
    spaced = make_db({**VIEWS, "big": "select cust,amount from Orders\n where amount>10 "
                      "and day >= date '2024-01-02'"})  # fmt: skip
    assert spaced.description() == make_db().description()
    other = make_db({**VIEWS, "big": "SELECT cust, amount FROM Orders WHERE amount > 11"})
    with pytest.raises(rm.errors.RingmlError, match=r"differing: view big\)"):
        db.adopt_state(other)
    with pytest.raises(rm.errors.InputTypeError, match="StreamingViews"):
        StreamingMaintainer(db, "unused")
    # feed schemas from the catalog; a column typed differently by two tables is refused
    assert spark_types_of_tables(db, ["customers"]) == {"cust": "string", "city": "string"}
    clash = sql.Database("CREATE TABLE A (k INTEGER); CREATE TABLE B (k VARCHAR)")
    assert spark_types_of_tables(clash, ["B"]) == {"k": "string"}
    with pytest.raises(rm.SchemaError, match="column 'k' is bigint in table 'A' but string"):
        spark_types_of_tables(clash)


def test_process_batches_diffs_equal_duckdb_batch_by_batch(tmp_path):
    db = make_db()
    log: list = []
    sv = StreamingViews(db, tmp_path / "state", on_diff=collector(log), diff_path=tmp_path / "d")
    reports = [sv.process_batch(layout(batch), i) for i, batch in enumerate(STREAM)]
    states = table_states()
    expected = expected_diffs(states)
    assert_views_equal_duckdb(db, states[-1])
    delivered = {(b, v): d for b, v, d in log}
    assert len(delivered) == len(log)  # each (batch, view) once
    per_batch: dict[int, dict] = {}
    for (b, v), d in delivered.items():
        per_batch.setdefault(b, {})[v] = d
    assert_diffs_match(per_batch, expected)
    assert_diffs_match(file_diffs(sv), expected)
    assert all(set(r.diffs) == set(per_batch.get(r.batch_id, {})) for r in reports)
    assert sv.result()["big"].shape == db.view("big").to_pandas().shape
    # a replayed batch id changes nothing and delivers nothing
    assert sv.process_batch(layout(STREAM[0]), 2) is None and len(log) == len(delivered)
    assert_views_equal_duckdb(db, states[-1])


def test_bad_rows_are_dead_lettered_or_reject_the_batch(tmp_path):
    good = [("Orders", "insert", _o(9, "c1", 40.0, 7)), ("Customers", "insert", _c("c5", "Bergen"))]
    bad = [
        ("Customer", "insert", _c("c6", "Rome")),  # unknown table
        ("Orders", "delete", _o(99, "c1", 1.0, 1)),  # delete of an absent row
        ("Orders", "insert", {**_o(10, "c1", 1.0, 1), "city": "Oslo"}),  # another table's field
    ]
    batch = [good[0], bad[0], bad[1], good[1], bad[2]]
    states = table_states([STREAM[0], good])

    strict = StreamingViews(make_db(), tmp_path / "s1", diff_path=tmp_path / "d1")
    strict.process_batch(layout(STREAM[0]), 0)
    with pytest.raises(FeedError, match="batch 1: ") as error:
        strict.process_batch(layout(batch), 1)
    assert len(error.value.bad_rows) == 2  # the engine's check comes after parsing
    assert strict.last_batch_id == 0 and set(file_diffs(strict)) == {0}
    assert_views_equal_duckdb(strict.database, states[1])  # nothing changed

    log: list = []
    sv = StreamingViews(
        make_db(), tmp_path / "s2", on_error="dead_letter", dead_letter_path=tmp_path / "dead",
        on_diff=collector(log), diff_path=tmp_path / "d2",
    )  # fmt: skip
    sv.process_batch(layout(STREAM[0]), 0)
    report = sv.process_batch(layout(batch), 1)
    assert report.applied == 2 and len(report.bad_rows) == 3
    dead = sv.dead_letters()
    assert sorted(dead.reason.str.split(" ").str[0]) == ["column", "table", "unknown"]
    assert dead.reason.str.contains("not present").any()
    assert_views_equal_duckdb(sv.database, states[2])
    assert_diffs_match(file_diffs(sv), expected_diffs(states))
    # a date the table's type refuses (a string column in the feed): that row alone
    mistyped = layout([good[0], ("Orders", "insert", _o(11, "c1", 50.0, 8))])
    day = pa.array(["2024-01-07", "2024-13-45"], pa.string())
    mistyped = mistyped.set_column(mistyped.column_names.index("__f0__day"), "__f0__day", day)
    report = sv.process_batch(mistyped, 2)
    assert report.applied == 1 and report.bad_rows[0].column == "day"
    assert "not a date" in report.bad_rows[0].reason


def test_restart_resumes_refuses_other_views_and_redelivers_diffs(tmp_path):
    """A new Database and StreamingViews on the same state folder resume (snapshot + log),
    skip replays, redeliver the diffs of a committed batch whose delivery failed, and refuse
    another catalog or view definition."""
    state, diffs = tmp_path / "state", tmp_path / "diffs"
    log: list = []

    def pipeline(db=None, fail_at=None) -> StreamingViews:
        return StreamingViews(
            db or make_db(), state, on_diff=collector(log, fail_at), diff_path=diffs,
            snapshot_every=2,
        )  # fmt: skip

    first = pipeline()
    for i in (0, 1, 2):
        first.process_batch(layout(STREAM[i]), i)
    second = pipeline(fail_at=3)
    assert second.last_batch_id == 2
    states = table_states()
    assert_views_equal_duckdb(second.database, states[3])
    with pytest.raises(RuntimeError, match="simulated driver crash"):
        second.process_batch(layout(STREAM[3]), 3)  # committed, then delivery failed
    assert second.last_batch_id == 3
    delivered_before = len(log)
    third = pipeline()
    assert third.process_batch(layout(STREAM[3]), 3) is None  # a replay: skipped...
    redelivered = log[delivered_before:]
    assert {(b, v) for b, v, _ in redelivered} == {(3, "by_city"), (3, "big")}  # ...redelivered
    third.process_batch(layout(STREAM[4]), 4)
    assert_views_equal_duckdb(third.database, states[-1])
    expected = expected_diffs(states)
    last = {}
    for b, v, d in log:  # an idempotent sink keeps the last delivery per (batch, view)
        last.setdefault(b, {})[v] = d
    assert_diffs_match(last, expected)
    assert_diffs_match(file_diffs(third), expected)
    # another view definition, or another table, is refused, naming the difference
    changed = {**VIEWS, "big": "SELECT cust, amount FROM Orders WHERE amount > 11"}
    with pytest.raises(CheckpointError, match=r"differing: view big\)"):
        pipeline(make_db(changed))
    wider = sql.Database(DDL.replace("city VARCHAR", "city VARCHAR, zip INTEGER"))
    for name, text in VIEWS.items():
        wider.create_view(name, text)
    with pytest.raises(CheckpointError, match=r"differing: table Customers\)"):
        pipeline(wider)


# ------------------------------------------------------------------ Spark
def write_feed(folder, batches, start: int = 0) -> None:
    """One CSV change-feed file per micro-batch (relation, op, the union of the columns)."""
    for k, batch in enumerate(batches, start):
        frame = pd.DataFrame(
            [{"relation": t, "op": op, **row} for t, op, row in batch],
            columns=["relation", "op", *FEED_COLUMNS],
        )
        write_change_file(folder / f"part-{k:04d}.csv", frame, mtime=1e9 + k)


def feed_of(db, folder) -> ChangeFeed:
    types = spark_types_of_tables(db)
    assert list(types) == FEED_COLUMNS and types["day"] == "date"
    return ChangeFeed(str(folder), types, relation=None, max_files_per_trigger=1)


@pytest.mark.spark
def test_stream_csv_feeds_into_views_with_diffs_out(spark, tmp_path):
    write_feed(tmp_path / "feed", STREAM)
    db = make_db()
    log: list = []
    out = tmp_path / "sink"

    def sink(batch_id: int, view: str, sdf) -> None:  # idempotent per batch id
        sdf.write.mode("overwrite").parquet(str(out / view / f"batch_id={batch_id}"))

    sv = StreamingViews(db, tmp_path / "state", on_diff=collector(log), diff_sink=sink)
    query = sv.start(spark, feed_of(db, tmp_path / "feed"), str(tmp_path / "ck"),
                     trigger={"availableNow": True})  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None
    assert [r.batch_id for r in sv.reports] == list(range(len(STREAM)))
    states = table_states()
    assert_views_equal_duckdb(db, states[-1])
    expected = expected_diffs(states)
    per_batch: dict[int, dict] = {}
    for b, v, d in log:
        assert v not in per_batch.get(b, {})
        per_batch.setdefault(b, {})[v] = d
    assert_diffs_match(per_batch, expected)
    # the Spark DataFrames the sink wrote hold the same diffs
    for view in VIEWS:
        frame = spark.read.parquet(str(out / view)).toPandas()
        for b, wanted in enumerate(expected):
            part = frame[frame.batch_id == b].drop(columns="batch_id")
            assert diff_counter(part) == wanted[view], (b, view)


@pytest.mark.spark
def test_crash_and_restart_mid_stream_ends_in_the_uninterrupted_state(spark, tmp_path):
    feed_dir, ck, state, diffs = (tmp_path / p for p in ("feed", "ck", "state", "diffs"))
    log: list = []

    def pipeline(fail_at=None, views=VIEWS) -> StreamingViews:  # a fresh driver each time
        db = make_db(views)
        return StreamingViews(
            db, state, on_diff=collector(log, fail_at), diff_path=diffs, snapshot_every=2
        )

    def run(sv: StreamingViews) -> None:
        feed = feed_of(sv.database, feed_dir)
        sv.start(spark, feed, str(ck), trigger={"availableNow": True}).awaitTermination()

    write_feed(feed_dir, STREAM[:2])
    sv1 = pipeline()
    run(sv1)  # the query stops after batches 0 and 1
    assert sv1.last_batch_id == 1
    write_feed(feed_dir, STREAM[2:], start=2)
    sv2 = pipeline(fail_at=3)  # batch 3 is committed, then the driver "dies" delivering it
    with pytest.raises(Exception, match="simulated driver crash"):
        run(sv2)
    assert sv2.last_batch_id == 3
    with pytest.raises(CheckpointError, match=r"differing: view big\)"):
        pipeline(views={**VIEWS, "big": "SELECT cust FROM Orders"})
    sv3 = pipeline()
    assert sv3.last_batch_id == 3
    run(sv3)
    assert sv3.replays_skipped == [3] and sv3.last_batch_id == 4
    states = table_states()
    assert_views_equal_duckdb(sv3.database, states[-1])
    expected = expected_diffs(states)
    assert_diffs_match(file_diffs(sv3), expected)  # every batch's diff file once
    for view in VIEWS:
        written = sv3.diffs(view).groupby("batch_id").size()
        assert written.index.is_unique
    last = {}
    for b, v, d in log:
        last.setdefault(b, {})[v] = d
    assert_diffs_match(last, expected)
    assert [(b, v) for b, v, _ in log].count((3, "big")) == 1  # redelivered once, at start


def test_feed_types_keep_date_and_timestamp_apart():
    db = sql.Database(
        "CREATE TABLE E (id BIGINT, ts TIMESTAMP, d DATE, dt DATETIME NULL, n DATE NULL)"
    )
    schema = db.catalog.table("E")
    assert [schema.sql_type(c) for c in schema.columns] == [
        "BIGINT", "TIMESTAMP", "DATE", "TIMESTAMP", "DATE",
    ]  # fmt: skip
    assert schema.declared("dt") == "dt TIMESTAMP NULL" and schema.dates == ("d", "n")
    assert spark_types_of_tables(db) == {
        "id": "bigint", "ts": "timestamp_ntz", "d": "date", "dt": "timestamp_ntz", "n": "date",
    }  # fmt: skip
    mapping = sql.Catalog({"M": {"a": "DATE NULL", "b": "timestamp", "c": "date"}})
    assert spark_types_of_tables(mapping) == {"a": "date", "b": "timestamp_ntz", "c": "date"}
    # a windowed view's hidden table keeps the declarations of its stream table
    sdb = sql.StreamDatabase(lateness="1 MINUTE")
    sdb.create_stream_table("CREATE TABLE S (ts TIMESTAMP, day DATE, v DOUBLE)", "ts", "1 MINUTE")
    sdb.create_view("w", "SELECT day, SUM(v) AS t FROM S GROUP BY day", window="RANGE 5 MINUTES")
    for name in sdb.database.catalog:
        assert spark_types_of_tables(sdb.database, [name])["ts"] == "timestamp_ntz", name
        assert spark_types_of_tables(sdb.database, [name])["day"] == "date", name


@pytest.mark.spark
def test_csv_and_json_feeds_read_back_exactly_what_was_written(spark, tmp_path):
    """Text with quotes, newlines, commas, the empty string and NULL; a multiplicity column
    last; TIMESTAMP and DATE columns (as ``spark_types_of_tables`` types them, and as a
    Spark ``timestamp``); JSON floats and dates: one query over five feeds.  Then a CSV
    file whose header does not match its feed's schema stops the next query, naming it."""
    db = sql.Database(
        """CREATE TABLE K (k TEXT NULL, n BIGINT);
           CREATE TABLE M (k BIGINT, v BIGINT);
           CREATE TABLE E (id BIGINT, ts TIMESTAMP, d DATE);
           CREATE TABLE Z (id BIGINT, ts TIMESTAMP);
           CREATE TABLE T (k BIGINT, x DOUBLE, d DATE, ts TIMESTAMP)"""
    )
    db.create_view("after_noon", "SELECT id FROM E WHERE ts > TIMESTAMP '2024-01-01 12:00:00'")
    keys = ['say "hi"', "two\nlines", "", "a,b", None, ' pad "\n"" ']
    write_change_file(
        tmp_path / "K" / "p.csv", pd.DataFrame({"op": "insert", "k": keys, "n": range(6)})
    )
    write_change_file(
        tmp_path / "M" / "p.csv", pd.DataFrame({"k": [10, 20, 30], "v": [7, 8, 9], "mult": 1})
    )
    times = ["2024-01-01 10:30:00", "2024-01-01T23:59:59.5"]
    days = [datetime.date(2024, 5, 17), datetime.date(2024, 2, 29)]
    e = pd.DataFrame({"op": "insert", "id": [1, 2], "ts": times, "d": days})
    write_change_file(tmp_path / "E" / "p.csv", e)
    write_change_file(tmp_path / "Z" / "p.csv", e[["op", "id", "ts"]])
    x = [0.1234567890123, 1 / 3, 2.0**-1074]
    t = pd.DataFrame(
        {"op": "insert", "k": [1, 2, 3], "x": x, "d": days + [datetime.date(1999, 12, 31)],
         "ts": pd.to_datetime(times + ["2024-03-01"], format="ISO8601")}
    )  # fmt: skip
    write_change_file(tmp_path / "T" / "p.json", t, format="json")
    feeds = [
        ChangeFeed(str(tmp_path / "K"), spark_types_of_tables(db, ["K"]), relation="K"),
        ChangeFeed(str(tmp_path / "M"), "k bigint, v bigint, mult bigint", relation="M",
                   op_column=None, mult_column="mult"),
        ChangeFeed(str(tmp_path / "E"), spark_types_of_tables(db, ["E"]), relation="E"),
        ChangeFeed(str(tmp_path / "Z"), {"id": "bigint", "ts": "timestamp"}, relation="Z"),
        ChangeFeed(str(tmp_path / "T"), spark_types_of_tables(db, ["T"]), relation="T",
                   format="json"),
    ]  # fmt: skip

    def pipeline() -> StreamingViews:
        return StreamingViews(db, tmp_path / "state", on_error="dead_letter",
                              dead_letter_path=tmp_path / "dead")  # fmt: skip

    sv = pipeline()
    sv.start(spark, feeds, str(tmp_path / "ck"), trigger={"availableNow": True}).awaitTermination()
    assert sv.dead_letters().empty, sv.dead_letters().to_dict("records")
    k = db.table("K").sort_values("n")
    assert k.k.tolist()[:4] == keys[:4] and k.k.tolist()[5] == keys[5]
    assert k.k.isna().tolist() == [False] * 4 + [True, False]  # NULL is not ''
    assert sorted(map(tuple, db.table("M").to_numpy().tolist())) == [(10, 7), (20, 8), (30, 9)]
    stamps = list(pd.to_datetime(times, format="ISO8601"))
    got = db.table("E").sort_values("id")
    assert got.ts.tolist() == stamps and got.d.tolist() == list(pd.to_datetime(days))
    assert sv.view("after_noon").id.tolist() == [2]
    assert db.table("Z").sort_values("id").ts.tolist() == stamps  # UTC session: same clock
    got = db.table("T").sort_values("k")
    assert got.x.tolist() == x  # exactly
    assert got.d.tolist() == list(pd.to_datetime(t.d)) and got.ts.tolist() == t.ts.tolist()
    last = sv.last_batch_id

    # the same columns in another order: refused by name, never read shifted
    write_change_file(
        tmp_path / "M" / "q.csv", pd.DataFrame({"mult": [1], "k": [40], "v": [5]}), mtime=2e9
    )
    sv = pipeline()
    query = sv.start(spark, feeds, str(tmp_path / "ck"), trigger={"availableNow": True})
    with pytest.raises(Exception, match=r"q\.csv: its header does not match"):
        query.awaitTermination()
    error = sv.errors[-1]
    assert isinstance(error, FeedError) and error.batch_id == last + 1
    assert error.bad_rows[0].relation == "M" and error.bad_rows[0].column == "k"
    assert "Header: mult, k, v" in str(error) and "Schema: k, v, mult" in str(error)
    assert sv.last_batch_id == last and len(db.table("M")) == 3
