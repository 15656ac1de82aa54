"""Event-time windows through Spark Structured Streaming, exactly once (issue 13, item 4).

A windowed :class:`~ringml.models.JoinRegressor` (House sales over the last three days of
their sale time, joined with the other Housing relations) is fed by
:class:`~ringml.pipelines.spark_windows.StreamingWindows`.  After every micro-batch the
refitted model must equal scikit-learn's Ridge on the windowed join materialized by pandas,
with the window decided here from the rows applied (watermark = the latest sale time seen
minus the lateness; day partitions; a day stays until the watermark passes its end by three
days).  Without Spark, micro-batches in the pipeline's internal layout exercise late events
(dead-lettered or rejected), restarts (snapshot and log replay), replays and refused
checkpoints; the ``spark`` test reads the sales from files with ``availableNow``, crashes
after a commit, restarts, and checks Spark's own watermark against ours.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from ringml.models import JoinRegressor
from sklearn.linear_model import Ridge

from ringml.datasets import housing_star
from ringml.windows import StreamTable

pytest.importorskip("pyspark", reason="the [spark] extra is not installed")

from ringml.pipelines.spark_checkpoint import CheckpointError  # noqa: E402
from ringml.pipelines.spark_stream import (  # noqa: E402
    ChangeFeed,
    FeedError,
    spark_types_of,
    write_change_file,
)
from ringml.pipelines.spark_windows import StreamingWindows  # noqa: E402

FEATURES = ["livingarea", "garden", "averagesalary", "nbbedrooms"]
RIDGE = 1e-3
DAY = pd.Timedelta("1D")
WINDOW = "RANGE 3 DAYS"
LATENESS = "12 HOURS"
START = pd.Timestamp("2026-05-01")


@pytest.fixture(scope="module")
def sales():
    """The dimension relations and a day-ordered stream of House sales (out of order within
    12 hours), cut into micro-batches of about half a day; two late sales are appended."""
    ds = housing_star(postcodes=8, rows_per_postcode={"House": 15}, seed=11)
    rng = np.random.default_rng(11)
    house = ds.relations["House"].sample(frac=1.0, random_state=11).reset_index(drop=True)
    clock = np.sort(rng.uniform(0.0, 10.0, len(house)))  # days since START
    jitter = rng.uniform(0.0, 0.5, len(house))  # arrive up to 12 hours after the sale
    house.insert(0, "sold", START + pd.to_timedelta(np.round((clock - jitter) * 24 * 60), "min"))
    batches = [part for _, part in house.groupby(np.floor(clock * 2), sort=True)]
    dims = {name: frame for name, frame in ds.relations.items() if name != "House"}
    return ds.schemas, dims, batches


def _model(schemas, late="dead_letter", window=WINDOW) -> JoinRegressor:
    windows = {"House": StreamTable("sold", partition="1 DAY", window=window)}
    return JoinRegressor(
        schemas, "price", FEATURES, ["nbbedrooms"], ridge=RIDGE, solver="cholesky",
        windows=windows, lateness=LATENESS, late=late,
    )  # fmt: skip


def _layout(rows: pd.DataFrame) -> pa.Table:
    """House rows as one micro-batch of a House feed in the pipeline's internal layout."""
    n = len(rows)
    data = {
        "__ringml_feed": pa.array([0] * n, pa.int32()),
        "__ringml_relation": ["House"] * n,
        "__ringml_op": ["insert"] * n,
        "__ringml_mult": pa.array([None] * n, pa.int64()),
        "__ringml_corrupt": pa.array([None] * n, pa.string()),
    }
    for column in rows.columns:
        values = rows[column]
        if column == "sold":
            data["__f0__sold"] = pa.array(values.dt.tz_localize("UTC"), pa.timestamp("us", "UTC"))
        else:
            data[f"__f0__{column}"] = pa.array(values.to_numpy())
    return pa.table(data)


class Oracle:
    """The rows inside the window, decided from the rows applied."""

    def __init__(self) -> None:
        self.rows: list[pd.DataFrame] = []
        self.watermark = None

    def late(self, rows: pd.DataFrame) -> np.ndarray:
        if self.watermark is None:
            return np.zeros(len(rows), dtype=bool)
        return (rows["sold"] < self.watermark).to_numpy()

    def apply(self, rows: pd.DataFrame) -> None:
        keep = rows[~self.late(rows)]
        self.rows.append(keep)
        newest = keep["sold"].max() - pd.Timedelta(LATENESS)
        self.watermark = newest if self.watermark is None else max(self.watermark, newest)

    def inside(self) -> pd.DataFrame:
        rows = pd.concat(self.rows, ignore_index=True)
        day_end = rows["sold"].dt.floor("D") + DAY
        return rows[day_end + 3 * DAY > self.watermark]


def _assert_model_equals_sklearn(model: JoinRegressor, oracle: Oracle, dims) -> None:
    flat = oracle.inside().drop(columns="sold")
    for frame in dims.values():
        flat = flat.merge(frame, on="postcode")
    assert model.n_samples_seen_ == len(flat)
    X = np.column_stack(
        [
            (flat[c[0]] == c[1]).to_numpy(float) if isinstance(c, tuple) else flat[c].to_numpy()
            for c in model.columns_
        ]
    ).astype(float)
    y = flat["price"].to_numpy(float)
    sk = Ridge(alpha=RIDGE * len(flat)).fit(X, y)
    sd = X.std(axis=0)
    assert np.linalg.norm((model.coef_ - sk.coef_) * sd) <= 1e-7 * np.linalg.norm(sk.coef_ * sd)
    assert np.max(np.abs(model.predict(flat) - sk.predict(X))) <= 1e-7 * y.std()


def _pipeline(schemas, dims, state, late="dead_letter", window=WINDOW, **kwargs):
    model = _model(schemas, late, window).fit(dims)  # a fresh driver: dimensions loaded
    on_error = late
    dead = {"dead_letter_path": state.parent / "dead"} if late == "dead_letter" else {}
    sw = StreamingWindows(model.stream_, state, on_error=on_error, **dead, **kwargs)
    return model, sw


def test_micro_batches_late_events_restart_and_replay(sales, tmp_path):
    schemas, dims, batches = sales
    state = tmp_path / "state"
    model, sw = _pipeline(schemas, dims, state, snapshot_every=3)
    oracle = Oracle()
    late_rows = 0
    half = len(batches) // 2
    for batch_id, rows in enumerate(batches[:half]):
        if batch_id == 4:  # a sale reported a day late arrives with this batch
            rows = pd.concat([rows, rows.iloc[[0]].assign(sold=oracle.watermark - DAY)])
            late_rows += 1
        report = sw.process_batch(_layout(rows), batch_id)
        model.partial_fit([])  # refit from the committed state
        oracle.apply(rows)
        assert sw.watermark == oracle.watermark == model.watermark_
        assert report.applied == len(rows) - (batch_id == 4)
        _assert_model_equals_sklearn(model, oracle, dims)
    dead = sw.dead_letters()
    assert len(dead) == late_rows and dead["relation"].tolist() == ["House"]
    assert "behind the watermark" in dead["reason"].iloc[0] and dead["column"].iloc[0] == "sold"

    # a new driver resumes from the snapshot and the logged batches after it
    model2, sw2 = _pipeline(schemas, dims, state, snapshot_every=3)
    assert sw2.last_batch_id == half - 1 and sw2.watermark == oracle.watermark
    assert sw2.stream is model2.stream_
    model2.partial_fit([])
    np.testing.assert_array_equal(model2.coef_, model.coef_)
    assert sw2.process_batch(_layout(batches[half - 1]), half - 1) is None  # a replay
    assert sw2.replays_skipped == [half - 1]
    for batch_id in range(half, len(batches)):
        sw2.process_batch(_layout(batches[batch_id]), batch_id)
        model2.partial_fit([])
        oracle.apply(batches[batch_id])
        assert model2.watermark_ == oracle.watermark
        _assert_model_equals_sklearn(model2, oracle, dims)
    assert len(oracle.inside()) < sum(len(b) for b in batches) // 2  # the window slid

    # the state refuses another window, and the late policy must match on_error
    with pytest.raises(CheckpointError, match="windows.tables"):
        _pipeline(schemas, dims, state, window="RANGE 2 DAYS")
    with pytest.raises(ValueError, match="late rows are 'reject'"):
        StreamingWindows(
            _model(schemas, "reject").fit(dims).stream_, tmp_path / "other",
            on_error="dead_letter", dead_letter_path=tmp_path / "dead2",
        )  # fmt: skip


def test_late_events_are_rejected_and_change_nothing(sales, tmp_path):
    schemas, dims, batches = sales
    model, sw = _pipeline(schemas, dims, tmp_path / "state", late="reject")
    for batch_id, rows in enumerate(batches[:3]):
        sw.process_batch(_layout(rows), batch_id)
    before = (sw.watermark, model.partial_fit([]).coef_.copy())
    late = batches[3].iloc[[0]].assign(sold=sw.watermark - DAY)
    with pytest.raises(FeedError, match="behind the watermark"):
        sw.process_batch(_layout(pd.concat([batches[3], late])), 3)
    assert sw.last_batch_id == 2 and sw.watermark == before[0]
    np.testing.assert_array_equal(model.partial_fit([]).coef_, before[1])


@pytest.mark.spark
def test_spark_files_crash_restart_and_watermark(spark, sales, tmp_path):
    schemas, dims, batches = sales
    types = {"sold": "timestamp", **spark_types_of(batches[0].drop(columns="sold"))}
    folder = tmp_path / "feed"

    def write(first: int, last: int) -> None:
        for i in range(first, last):
            frame = batches[i].assign(sold=batches[i]["sold"].dt.strftime("%Y-%m-%d %H:%M:%S"))
            frame.insert(0, "op", "insert")
            write_change_file(folder / f"part-{i:04d}.csv", frame, mtime=1_000_000 + i)

    feed = ChangeFeed(str(folder), types, relation="House", max_files_per_trigger=1)
    ck, state = str(tmp_path / "ck"), tmp_path / "state"
    half, crash_at = len(batches) // 3, 2 * len(batches) // 3
    write(0, half)
    model, sw = _pipeline(schemas, dims, state, snapshot_every=2)
    query = sw.start(spark, feed, ck, trigger={"availableNow": True})
    query.awaitTermination()
    progress = list(query.recentProgress)
    write(half, len(batches))

    def crash(report):
        if report.batch_id == crash_at:
            raise RuntimeError("simulated driver crash")

    model, sw = _pipeline(schemas, dims, state, snapshot_every=2, on_batch=crash)
    query = sw.start(spark, feed, ck, trigger={"availableNow": True})
    with pytest.raises(Exception, match="simulated driver crash"):
        query.awaitTermination()
    progress += list(query.recentProgress)
    watermarks = {}

    def refit(report):
        model.partial_fit([])
        watermarks[report.batch_id] = report.maintainer.watermark

    model, sw = _pipeline(schemas, dims, state, snapshot_every=2, on_batch=refit)
    query = sw.start(spark, feed, ck, trigger={"availableNow": True})
    query.awaitTermination()
    progress += list(query.recentProgress)
    assert sw.replays_skipped == [crash_at]
    assert sw.last_batch_id == len(batches) - 1
    oracle = Oracle()
    for rows in batches:
        oracle.apply(rows)
    assert sw.watermark == oracle.watermark
    _assert_model_equals_sklearn(model, oracle, dims)
    # Spark's watermark at batch b is ours after batch b - 1 (same rule, same rows), except
    # right after the replayed batch: skipped unread, it showed Spark no event times
    ours = {}
    replay = Oracle()
    for batch_id, rows in enumerate(batches):
        replay.apply(rows)
        ours[batch_id] = replay.watermark
    spark_marks = {
        p["batchId"]: pd.Timestamp(p["eventTime"]["watermark"]).tz_convert(None)
        for p in progress
        if p["numInputRows"]
        and p["batchId"] not in (0, crash_at + 1)
        and "watermark" in p.get("eventTime", {})
    }
    assert len(spark_marks) >= len(batches) // 2
    for batch_id, mark in spark_marks.items():
        assert mark == ours[batch_id - 1], batch_id
    assert all(watermarks[b] == ours[b] for b in watermarks)


def _sql_pipeline(state, dead):
    from ringml.sql import StreamDatabase

    sdb = StreamDatabase("CREATE TABLE D (src TEXT, region TEXT)", lateness=5, late="dead_letter")
    sdb.create_stream_table("CREATE TABLE S (ts INT, src TEXT, loss DOUBLE)", "ts", 10)
    sdb.create_view(
        "recent",
        "SELECT region, SUM(loss) AS total, COUNT(*) AS n FROM S JOIN D USING (src) "
        "GROUP BY region",
        window="RANGE 30",
    )
    sdb.insert("D", pd.DataFrame({"src": list("abcd"), "region": ["n", "n", "s", "w"]}))
    return sdb, StreamingWindows(
        sdb.stream, state, on_error="dead_letter", dead_letter_path=dead, snapshot_every=2
    )


def _sql_layout(rows: pd.DataFrame) -> pa.Table:
    return _nullable_layout(rows["ts"].tolist(), rows["src"].tolist(), rows["loss"].tolist())


def test_sql_windowed_views_through_the_stream_restart_exactly_once(tmp_path):
    rng = np.random.default_rng(4)
    state, dead = tmp_path / "state", tmp_path / "dead"
    sdb, sw = _sql_pipeline(state, dead)
    regions = {"a": "n", "b": "n", "c": "s", "d": "w"}
    applied, watermark, late_rows = [], -np.inf, 0
    for batch_id in range(14):
        ts = batch_id * 6 + rng.integers(-5, 1, 7)  # out of order within the lateness
        rows = pd.DataFrame(
            {"ts": ts, "src": rng.choice(list("abcd"), 7), "loss": np.round(rng.random(7), 3)}
        )
        if batch_id == 6:  # a straggler behind the watermark
            rows.loc[len(rows)] = [int(watermark) - 3, "a", 9.0]
            late_rows += 1
        if batch_id == 7:  # a new driver: the committed state moves into its database
            sdb, sw = _sql_pipeline(state, dead)
            assert sw.last_batch_id == 6 and sw.watermark == watermark
        sw.process_batch(_sql_layout(rows), batch_id)
        keep = rows[rows["ts"] >= watermark]
        applied.append(keep)
        watermark = max(watermark, float(keep["ts"].max()) - 5)
        every = pd.concat(applied, ignore_index=True)
        inside = every[(every["ts"] // 10 + 1) * 10 + 30 > watermark]
        expected = (
            inside.assign(region=inside["src"].map(regions))
            .groupby("region")["loss"]
            .agg(total="sum", n="count")
            .reset_index()
        )
        got = sdb.view("recent").to_pandas().sort_values("region").reset_index(drop=True)
        assert got["region"].tolist() == expected["region"].tolist()
        np.testing.assert_allclose(got["total"], expected["total"], rtol=1e-12)
        assert got["n"].tolist() == expected["n"].tolist()
    assert len(sw.dead_letters()) == late_rows


def _readme_sql_stream(kind: str):
    """README's SQL window example with a ``TIMESTAMP`` (minutes) or ``DATE`` (days) event
    time: the worst loss, and the count, per region over the window."""
    from ringml.sql import StreamDatabase

    unit = "MINUTE" if kind == "TIMESTAMP" else "DAY"
    lateness = "30s" if kind == "TIMESTAMP" else "1 DAY"
    sdb = StreamDatabase("CREATE TABLE D (src TEXT, region TEXT)", lateness=lateness,
                         late="dead_letter")  # fmt: skip
    sdb.create_stream_table(f"CREATE TABLE S (ts {kind}, src TEXT, loss DOUBLE)", "ts", f"1 {unit}")
    sdb.create_view(
        "worst",
        "SELECT region, MAX(loss) AS m, COUNT(*) AS n FROM S JOIN D USING (src) GROUP BY region",
        window=f"RANGE 10 {unit}S",
    )
    sdb.insert("D", pd.DataFrame({"src": ["a", "b"], "region": ["n", "s"]}))
    return sdb


# (event time as written, src, loss) per micro-batch; the last row of batch 1 is late
_MINUTES = [
    [("2024-01-01 10:00:05", "a", 0.5), ("2024-01-01T10:07:00", "b", 0.25)],
    [("2024-01-01 10:20:00", "a", 0.125), ("2024-01-01 10:21:00", "b", 0.75),
     ("2024-01-01 10:05:00", "a", 9.0)],
]  # fmt: skip
_DAYS = [
    [("2024-01-01", "a", 0.5), ("2024-01-02", "b", 0.25)],
    [("2024-01-15", "a", 0.125), ("2024-01-16", "b", 0.75), ("2023-12-31", "a", 9.0)],
]
# after batch 1: the watermark, and the view (the rows of batch 0 left the window)
_EXPECTED = {
    "TIMESTAMP": (pd.Timestamp("2024-01-01 10:20:30"), {"n": (0.125, 1), "s": (0.75, 1)}),
    "DATE": (pd.Timestamp("2024-01-15"), {"n": (0.125, 1), "s": (0.75, 1)}),
}


def _check_readme_stream(kind, sdb, sw) -> None:
    watermark, view = _EXPECTED[kind]
    assert sw.last_batch_id == 1 and sw.watermark == watermark
    got = sdb.view("worst").to_pandas().sort_values("region")
    assert {r.region: (r.m, r.n) for r in got.itertuples()} == view
    dead = sw.dead_letters()
    assert len(dead) == 1 and dead.batch_id.tolist() == [1]
    assert "behind the watermark" in dead.reason[0] and '"loss": 9.0' in dead.row[0]


@pytest.mark.parametrize("kind", ["TIMESTAMP", "DATE"])
def test_sql_date_and_timestamp_event_times_through_the_stream(tmp_path, kind):
    """Micro-batches as Spark hands them over: a DATE event time as Arrow dates, a
    TIMESTAMP one as zoned instants (a Spark ``timestamp``)."""
    sdb = _readme_sql_stream(kind)
    sw = StreamingWindows(sdb.stream, tmp_path / "s", on_error="dead_letter",
                          dead_letter_path=tmp_path / "d")  # fmt: skip
    for batch_id, rows in enumerate(_MINUTES if kind == "TIMESTAMP" else _DAYS):
        times = pd.to_datetime([r[0] for r in rows], format="ISO8601")
        if kind == "DATE":
            ts = pa.array([t.date() for t in times], pa.date32())
        else:
            ts = pa.array(times.tz_localize("UTC"), pa.timestamp("us", "UTC"))
        n = len(rows)
        table = pa.table(
            {
                "__ringml_feed": pa.array([0] * n, pa.int32()),
                "__ringml_relation": ["S"] * n,
                "__ringml_op": ["insert"] * n,
                "__ringml_mult": pa.array([None] * n, pa.int64()),
                "__ringml_corrupt": pa.array([None] * n, pa.string()),
                "__f0__ts": ts,
                "__f0__src": [r[1] for r in rows],
                "__f0__loss": [r[2] for r in rows],
            }
        )
        sw.process_batch(table, batch_id)
    _check_readme_stream(kind, sdb, sw)


@pytest.mark.spark
def test_readme_sql_window_example_streams_timestamps_and_dates(spark, tmp_path):
    """README's StreamDatabase example through Spark, its feed typed by
    ``spark_types_of_tables`` (TIMESTAMP: ``timestamp_ntz``, DATE: ``date``): Spark
    watermarks the event time (a copy cast to ``timestamp``) and the late row is a dead
    letter."""
    from ringml.pipelines.spark_views import spark_types_of_tables

    for kind, batches in (("TIMESTAMP", _MINUTES), ("DATE", _DAYS)):
        folder = tmp_path / kind
        sdb = _readme_sql_stream(kind)
        types = spark_types_of_tables(sdb.database, ["S"])
        assert types["ts"] == ("timestamp_ntz" if kind == "TIMESTAMP" else "date")
        for i, rows in enumerate(batches):
            frame = pd.DataFrame(rows, columns=["ts", "src", "loss"])
            frame.insert(0, "op", "insert")
            write_change_file(folder / "feed" / f"p{i}.csv", frame, mtime=1e9 + i)
        sw = StreamingWindows(sdb.stream, folder / "state", on_error="dead_letter",
                              dead_letter_path=folder / "dead")  # fmt: skip
        feed = ChangeFeed(str(folder / "feed"), types, relation="S", max_files_per_trigger=1)
        query = sw.start(spark, feed, str(folder / "ck"), trigger={"availableNow": True})
        query.awaitTermination()
        _check_readme_stream(kind, sdb, sw)
        # Spark's watermark at batch 1 is ours after batch 0 (see the test above)
        marks = [p["eventTime"].get("watermark") for p in query.recentProgress]
        after_first = {"TIMESTAMP": "2024-01-01 10:06:30", "DATE": "2024-01-01"}[kind]
        assert pd.Timestamp(marks[-1]).tz_convert(None) == pd.Timestamp(after_first), marks


def _nullable_layout(ts, src, loss) -> pa.Table:
    """Rows of S (event time ts, src, loss; None: NULL) as one micro-batch of its feed."""
    n = len(ts)
    return pa.table(
        {
            "__ringml_feed": pa.array([0] * n, pa.int32()),
            "__ringml_relation": ["S"] * n,
            "__ringml_op": ["insert"] * n,
            "__ringml_mult": pa.array([None] * n, pa.int64()),
            "__ringml_corrupt": pa.array([None] * n, pa.string()),
            "__f0__ts": pa.array(ts, pa.int64()),
            "__f0__src": pa.array(src, pa.string()),
            "__f0__loss": pa.array(loss, pa.float64()),
        }
    )


def test_sql_nullable_columns_take_nulls_through_the_stream(tmp_path):
    """A column the stream table declares ``NULL`` takes NULLs from the feed (COUNT(loss)
    skips them, COUNT(*) counts them); a NULL event time or a NULL in a NOT NULL column is
    still a dead letter naming its column."""
    from ringml.sql import StreamDatabase

    sdb = StreamDatabase(lateness=5, late="dead_letter")
    sdb.create_stream_table("CREATE TABLE S (ts INT, src TEXT, loss DOUBLE NULL)", "ts", 10)
    sdb.create_view(
        "v", "SELECT src, COUNT(*) AS n, COUNT(loss) AS k, SUM(loss) AS s FROM S GROUP BY src",
        window="RANGE 30",
    )  # fmt: skip
    sw = StreamingWindows(sdb.stream, tmp_path / "s", on_error="dead_letter",
                          dead_letter_path=tmp_path / "d")  # fmt: skip
    table = _nullable_layout([1, 2, None, 3], ["a", "a", "a", None], [None, 2.0, 3.0, 4.0])
    sw.process_batch(table, 0)
    got = sdb.view("v").to_pandas()
    assert got.to_dict("records") == [{"src": "a", "n": 2, "k": 1, "s": 2.0}]
    reasons = sorted(sw.dead_letters().reason)
    assert reasons == ["missing value for column 'src'", "missing value for column 'ts'"]


def test_a_null_reaches_only_targets_that_take_it(tmp_path):
    """With a Maintainer reading the same column beside the database, a NULL there is a
    dead letter (the Maintainer cannot hold it), and both targets stay equal."""
    from ringml.rings.scalar import RealRing

    from ringml import Maintainer, Query
    from ringml.sql import Database
    from ringml.windows import MinMaxView, StreamTable, WindowedStream

    db = Database("CREATE TABLE S (ts BIGINT, src TEXT, loss DOUBLE NULL)")
    db.create_view("v", "SELECT src, COUNT(loss) AS k FROM S GROUP BY src")
    spec = {"S": StreamTable("ts", partition=10, window="RANGE 30")}
    minmax = MinMaxView("S", values=["loss"], by=["src"])
    both = WindowedStream([db, minmax], spec, lateness=5, late="dead_letter")
    sw = StreamingWindows(both, tmp_path / "a", on_error="dead_letter",
                          dead_letter_path=tmp_path / "da")  # fmt: skip
    assert sw._nullable() == {"S": ["loss"]}
    sw.process_batch(_nullable_layout([1, 2], ["a", "a"], [None, 2.0]), 0)
    assert db.view("v").to_pandas().to_dict("records") == [{"src": "a", "k": 1}]
    assert minmax.result()[["count", "max_loss"]].to_dict("records") == [
        {"count": 2, "max_loss": 2.0}
    ]
    m = Maintainer(Query({"S": ["ts", "src", "loss"]}, RealRing(["loss"]), free=["src"]))
    db2 = Database("CREATE TABLE S (ts BIGINT, src TEXT, loss DOUBLE NULL)")
    db2.create_view("v", "SELECT src, COUNT(loss) AS k FROM S GROUP BY src")
    mixed = WindowedStream([db2, m], spec, lateness=5, late="dead_letter")
    sw2 = StreamingWindows(mixed, tmp_path / "b", on_error="dead_letter",
                           dead_letter_path=tmp_path / "db")  # fmt: skip
    assert sw2._nullable() == {}
    sw2.process_batch(_nullable_layout([1, 2], ["a", "a"], [None, 2.0]), 0)
    assert m.result() == {("a",): 2.0}
    assert db2.view("v").to_pandas().to_dict("records") == [{"src": "a", "k": 1}]
    assert sw2.dead_letters().reason.tolist() == ["missing value for column 'loss'"]


def _loss_stream(seen: list):
    from ringml.rings.scalar import RealRing

    from ringml import Maintainer, Query
    from ringml.windows import StreamTable, WindowedStream

    view = Maintainer(Query({"S": ["ts", "src", "loss"]}, RealRing(["loss"]), free=["src"]))
    view.subscribe(lambda delta: seen.append(dict(delta.items())))
    table = StreamTable("ts", partition=10, window="RANGE 30")
    return view, WindowedStream(view, {"S": table}, lateness=5, late="dead_letter")


def test_a_restart_keeps_the_callers_maintainer_targets_and_their_subscribers(tmp_path):
    """A restart replaced a windowed stream's Maintainer targets by restored copies: the
    caller's object went stale and its subscribers heard nothing more."""
    state, dead = tmp_path / "state", tmp_path / "dead"
    rows = [([1, 2], ["a", "b"], [1.0, 2.0]), ([12, 13], ["a", "a"], [4.0, 8.0]),
            ([47], ["b"], [16.0])]  # fmt: skip
    first: list = []
    view, stream = _loss_stream(first)
    sw = StreamingWindows(stream, state, on_error="dead_letter", dead_letter_path=dead,
                          snapshot_every=2)  # fmt: skip
    for batch_id, (ts, src, loss) in enumerate(rows[:2]):
        sw.process_batch(_nullable_layout(ts, src, loss), batch_id)
    assert view.result() == {("a",): 13.0, ("b",): 2.0} and len(first) == 2

    second: list = []
    view2, stream2 = _loss_stream(second)  # a new driver: the state moves into view2
    sw2 = StreamingWindows(stream2, state, on_error="dead_letter", dead_letter_path=dead,
                           snapshot_every=2)  # fmt: skip
    assert sw2.last_batch_id == 1 and stream2.targets == [view2]
    assert view2.result() == {("a",): 13.0, ("b",): 2.0} and second == []  # not re-delivered
    sw2.process_batch(_nullable_layout(*rows[2]), 2)  # partition 0 expires
    assert view2.result() == {("a",): 12.0, ("b",): 16.0}
    assert second == [{("a",): -1.0, ("b",): 14.0}]


def test_an_unreadable_windows_snapshot_leaves_the_callers_targets_as_they_were(tmp_path):
    from ringml.pipelines.spark_checkpoint import CheckpointError
    from ringml.pipelines.spark_windows import restore_windows, snapshot_windows

    view, stream = _loss_stream([])
    stream.insert("S", pd.DataFrame({"ts": [1], "src": ["a"], "loss": [1.0]}))
    data = snapshot_windows(stream)
    other, like = _loss_stream([])
    with pytest.raises(CheckpointError, match="unreadable"):
        restore_windows(data[:-5], like)
    assert other.result() == {} and like.targets == [other]
    restored = restore_windows(data, like)
    assert restored.targets == [other] and other.result() == {("a",): 1.0}


def test_result_of_a_sql_stream_and_on_batch_outside_the_lock(tmp_path):
    """result() of a StreamDatabase's stream raised AttributeError ('Database' has no
    result); on_batch ran while process_batch held the lock, so a callback waiting on a
    thread that reads result() deadlocked."""
    import concurrent.futures

    from ringml.sql import StreamDatabase

    sdb = StreamDatabase(lateness=5, late="dead_letter")
    sdb.create_stream_table("CREATE TABLE S (ts INT, src TEXT, loss DOUBLE NULL)", "ts", 10)
    sdb.create_view("v", "SELECT src, COUNT(*) AS n FROM S GROUP BY src", window="RANGE 30")
    pool = concurrent.futures.ThreadPoolExecutor(1)
    seen: list = []

    def on_batch(report):  # e.g. pushes the fresh view to a cache served by another thread
        seen.append(pool.submit(lambda: sw.result()["v"]).result(timeout=10))

    sw = StreamingWindows(sdb.stream, tmp_path / "s", on_error="dead_letter",
                          dead_letter_path=tmp_path / "d", on_batch=on_batch)  # fmt: skip
    sw.process_batch(_nullable_layout([1, 2], ["a", "a"], [1.0, None]), 0)
    pool.shutdown()
    assert [frame.to_dict("records") for frame in seen] == [[{"src": "a", "n": 2}]]
