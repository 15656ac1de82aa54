"""MicroBatcher: coalesced single-tuple updates against one apply per update and a pandas
flat join, rejected updates, flush triggers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringml import BatchError, Maintainer, UpdateBatch
from ringml.applications import covariance_query
from ringml.errors import InputTypeError
from ringml.microbatch import Flush, MicroBatcher

SCHEMA = {"R": ["a", "x"], "S": ["a", "y", "z"]}


def maintainer(**kw) -> Maintainer:
    return Maintainer(covariance_query(SCHEMA), **kw)


def oracle(tables: dict[str, list[tuple]]) -> tuple[int, np.ndarray, np.ndarray]:
    """Count, Σ and Σxxᵀ over the flat join of the current tuples (variables x, y, z)."""
    r = pd.DataFrame(tables["R"], columns=SCHEMA["R"])
    s = pd.DataFrame(tables["S"], columns=SCHEMA["S"])
    joined = r.merge(s, on="a")
    x = joined[["x", "y", "z"]].to_numpy(dtype=float)
    return len(joined), x.sum(axis=0), x.T @ x


def moments(m: Maintainer):
    return m.query.ring.moments(m.result())


def assert_same(m: Maintainer, expected) -> None:
    count, sums, products = moments(m)
    assert count == expected[0]
    np.testing.assert_allclose(sums, expected[1], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(products, expected[2], rtol=1e-12, atol=1e-9)


# a random stream of single-tuple updates: inserts of fresh tuples, deletes of present ones
updates = st.lists(
    st.tuples(
        st.sampled_from(["R", "S"]),
        st.booleans(),  # delete a present tuple (when there is one)
        st.integers(0, 4),  # join key
        st.integers(-50, 50),  # values (integers: every sum is exact)
        st.integers(-50, 50),
        st.integers(0, 10**6),  # which present tuple a delete picks
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(updates, st.integers(1, 40))
def test_coalesced_stream_equals_oracle_after_every_flush(stream, max_rows):
    batched = MicroBatcher(maintainer(), max_rows=max_rows)
    one_by_one = maintainer()
    tables: dict[str, list[tuple]] = {"R": [], "S": []}
    for relation, delete, a, u, v, pick in stream:
        present = tables[relation]
        if delete and present:
            row = present.pop(pick % len(present))
            flush = batched.delete(relation, row)
            one_by_one.delete(relation, pd.DataFrame([row], columns=SCHEMA[relation]))
        else:
            row = (a, float(u)) if relation == "R" else (a, float(u), v)
            present.append(row)
            flush = batched.insert(relation, row)
            one_by_one.insert(relation, pd.DataFrame([row], columns=SCHEMA[relation]))
        if flush is not None:  # every pending update went through one apply
            assert flush.coalesced and not flush.rejected and flush.rows == max_rows
            assert batched.pending == 0
            assert_same(batched.target, oracle(tables))
        else:
            assert batched.pending > 0
    final = batched.flush()
    assert not final.rejected and batched.pending == 0
    expected = oracle(tables)
    assert_same(batched.target, expected)
    assert_same(one_by_one, expected)


def test_rejected_update_is_reported_and_the_others_applied():
    m = maintainer()
    seen = []
    m.subscribe(seen.append)
    batcher = MicroBatcher(m, max_rows=100)
    batcher.insert("R", (1, 2.0), id="r1")
    batcher.insert("S", (1, 3.0, 4), id="s1")
    batcher.delete("R", (7, 1.0), id="absent")  # never inserted
    batcher.add(UpdateBatch.inserts("S", pd.DataFrame({"a": [1], "y": [5.0], "z": [6]})), "b")
    batcher.insert("R", {"a": 1, "x": 10.0}, id="r2")
    flush = batcher.flush()
    assert not flush.coalesced and len(flush.deltas) == 4
    assert flush.applied == ["r1", "s1", "b", "r2"]  # arrival order
    assert [i for i, _ in flush.rejected] == ["absent"]
    error = flush.rejected[0][1]
    assert isinstance(error, BatchError) and error.relation == "R"
    # a subscriber sees the delta of each apply that changed the result (r1 alone joins none)
    assert len(seen) == 3
    assert_same(m, oracle({"R": [(1, 2.0), (1, 10.0)], "S": [(1, 3.0, 4), (1, 5.0, 6)]}))
    assert batcher.pending == 0


def test_a_flush_checks_net_changes_like_one_batch():
    """Deleted and inserted again within one flush: valid in either order (one batch)."""
    batcher = MicroBatcher(maintainer(), max_rows=100)
    batcher.insert("S", (1, 1.0, 1))
    batcher.delete("R", (1, 2.0), id="early delete")
    batcher.insert("R", (1, 2.0))
    flush = batcher.flush()
    assert flush.coalesced and not flush.rejected
    assert_same(batcher.target, oracle({"R": [], "S": [(1, 1.0, 1)]}))
    # applied one at a time, the delete of the absent tuple is rejected
    m = maintainer()
    with pytest.raises(BatchError):
        m.delete("R", pd.DataFrame([(1, 2.0)], columns=["a", "x"]))


def test_max_delay_flushes_on_update_and_poll():
    now = [0.0]
    batcher = MicroBatcher(maintainer(), max_rows=1000, max_delay=5.0, clock=lambda: now[0])
    assert batcher.insert("R", (1, 1.0)) is None
    now[0] = 4.9
    assert batcher.insert("S", (1, 1.0, 1)) is None and batcher.poll() is None
    now[0] = 5.0
    flush = batcher.poll()
    assert isinstance(flush, Flush) and flush.rows == 2 and flush.applied == [0, 1]
    assert batcher.poll() is None  # nothing pending: no age
    batcher.insert("R", (2, 1.0))
    now[0] = 11.0
    flush = batcher.insert("R", (3, 1.0))  # the oldest pending update is 6 s old
    assert flush is not None and flush.rows == 2 and batcher.pending == 0


def test_context_manager_flushes_and_bad_rows_raise_at_once():
    m = maintainer(updatable=["R"])
    with MicroBatcher(m) as batcher:
        batcher.insert("R", (1, 1.0))
        with pytest.raises(BatchError, match="static"):
            batcher.insert("S", (1, 1.0, 1))
        with pytest.raises(BatchError, match="unknown relation"):
            batcher.insert("T", (1,))
        with pytest.raises(BatchError, match="has 2 columns"):
            batcher.insert("R", (1, 1.0, 3))
        with pytest.raises(BatchError, match="columns"):
            batcher.insert("R", {"a": 1})
        with pytest.raises(InputTypeError):
            batcher.insert("R", "1,1.0")
        with pytest.raises(InputTypeError):
            batcher.add(pd.DataFrame({"a": [1], "x": [1.0]}))
        assert batcher.pending == 1
    assert batcher.pending == 0
    assert m.tuples_applied == 1


def test_frames_keep_the_dtypes_of_from_records():
    batcher = MicroBatcher(maintainer())
    day = pd.Timestamp("2020-01-02")
    for rows in (
        [(1, 2.0), (2, 3.5)],
        [(1, 2), (2, 3.5)],
        [(2**64, 1.0)],
        [("a", 1.0)],
        [("a", "b"), ("", "é")],
        [("a", 1.0), (None, 2.0)],
        [(day, 1.0), (day.as_unit("s"), 2.0)],  # Timestamps of any unit: datetime64[ns]
        [(day, 1.0), (pd.NaT, 2.0)],
        [(day.tz_localize("UTC"), 1.0)],  # tz-aware: from_records' datetime64[ns, UTC]
        [(day, 1.0), (day.to_pydatetime(), 2.0)],
        [(True, 1.0), (False, 2.0)],
        [(np.int64(3), np.float32(1.5))],
    ):
        got = batcher._frame("R", rows)
        expected = pd.DataFrame.from_records(rows, columns=["a", "x"])
        assert got.dtypes.tolist() == expected.dtypes.tolist()
        pd.testing.assert_frame_equal(got, expected)


def test_integers_a_float_column_would_round_keep_their_value():
    """A column mixing ints and floats became float64 (``from_records``), rounding ints
    beyond 2**53: the flush then deleted another tuple than the one asked for.  Such a
    column stays objects, in a row frame and when rows and added batches are stacked."""
    from ringml.rings.scalar import IntegerRing

    from ringml import Query

    big = 2**62 + 1  # an int64 that no float64 holds
    query = Query({"R": ["k", "v"]}, IntegerRing(), free=["k"])

    def loaded() -> Maintainer:
        m = Maintainer(query)
        m.insert("R", pd.DataFrame({"k": [2**62, big], "v": [1, 1]}))
        return m

    one_by_one = loaded()
    one_by_one.delete("R", pd.DataFrame({"k": [big], "v": [1]}))
    one_by_one.insert("R", pd.DataFrame({"k": [0.5], "v": [1]}))
    assert one_by_one.result() == {(2**62,): 1, (0.5,): 1}
    for add_batch in (False, True):
        m = loaded()
        batcher = MicroBatcher(m, max_rows=100)
        batcher.delete("R", (big, 1))
        if add_batch:  # a float column stacked under the rows' int column
            batcher.add(UpdateBatch.inserts("R", pd.DataFrame({"k": [0.5], "v": [1]})))
        else:
            batcher.insert("R", (0.5, 1))
        flush = batcher.flush()
        assert flush.coalesced and not flush.rejected
        assert m.result() == one_by_one.result()
    frame = MicroBatcher(loaded())._frame("R", [(big, 1), (0.5, 2)])
    assert frame["k"].dtype == object and frame["k"].tolist() == [big, 0.5]


def test_an_error_that_is_not_a_rejection_leaves_the_updates_pending(monkeypatch):
    """A flush whose apply fails with anything but a rejection (a bug, an interrupt) raises
    it and keeps every update pending, where it used to drop them all."""
    m = maintainer()
    batcher = MicroBatcher(m, max_rows=100)
    batcher.insert("S", (1, 2.0, 3.0), id="s")
    batcher.insert("R", (1, 4.0), id="r")
    apply = m.apply

    def failing(batches):
        raise RuntimeError("boom")

    monkeypatch.setattr(m, "apply", failing)
    with pytest.raises(RuntimeError, match="boom"):
        batcher.flush()
    monkeypatch.setattr(m, "apply", apply)
    flush = batcher.flush()
    assert flush.applied == ["s", "r"] and not flush.rejected
    assert_same(m, oracle({"R": [(1, 4.0)], "S": [(1, 2.0, 3.0)]}))


def test_an_error_in_the_fallback_keeps_that_update_and_the_later_ones(monkeypatch):
    """In the one-at-a-time fallback (the coalesced batch was rejected), an error that is not
    a rejection is raised with the failing update and every later one still pending; the
    earlier ones stay applied or rejected.  The buffer used to be empty by then."""
    m = maintainer()
    batcher = MicroBatcher(m, max_rows=100)
    batcher.insert("S", (1, 2.0, 3.0), id="s")
    batcher.delete("R", (7, 1.0), id="absent")  # rejects the coalesced batch
    batcher.insert("R", (1, 4.0), id="fails")
    batcher.insert("R", (1, 5.0), id="later")
    apply = m.apply

    def failing(batches):
        batches = [batches] if isinstance(batches, UpdateBatch) else batches
        if [list(b.rows["x"]) for b in batches if b.relation == "R"] == [[4.0]]:  # alone
            raise RuntimeError("boom")
        return apply(batches)

    monkeypatch.setattr(m, "apply", failing)
    with pytest.raises(RuntimeError, match="boom"):
        batcher.flush()
    assert batcher.pending == 2
    assert_same(m, oracle({"R": [], "S": [(1, 2.0, 3.0)]}))
    monkeypatch.setattr(m, "apply", apply)
    flush = batcher.flush()
    assert flush.applied == ["fails", "later"] and not flush.rejected
    assert_same(m, oracle({"R": [(1, 4.0), (1, 5.0)], "S": [(1, 2.0, 3.0)]}))


@pytest.mark.parametrize("columns", [{"a": [2]}, {"a": [2], "x": [1.0], "w": [0.0]}])
def test_a_batch_with_other_columns_is_rejected_alone(columns):
    """A buffered batch lacking a column (or with an extra one) is rejected by itself; it
    used to make every flush raise a KeyError, the valid rows never applied."""
    m = maintainer()
    batcher = MicroBatcher(m, max_rows=100)
    batcher.insert("R", (1, 2.0), id="row")
    batcher.add(UpdateBatch("R", pd.DataFrame(columns)), id="batch")
    batcher.insert("S", (1, 1.0, 1.0), id="s")
    flush = batcher.flush()
    assert flush.applied == ["row", "s"]
    assert [id for id, _ in flush.rejected] == ["batch"]
    assert "missing" in str(flush.rejected[0][1]) and batcher.pending == 0
    assert_same(m, oracle({"R": [(1, 2.0)], "S": [(1, 1.0, 1.0)]}))


def test_invalid_settings():
    with pytest.raises(ValueError):
        MicroBatcher(maintainer(), max_rows=0)
    with pytest.raises(ValueError):
        MicroBatcher(maintainer(), max_delay=-1)


# ------------------------------------------------------------------ a SQL database
TABLES = """CREATE TABLE Follower (userId INTEGER, followerId INTEGER);
CREATE TABLE Tweet (userId INTEGER, tweetId INTEGER, day DATE, likes DOUBLE);"""
VIEWS = {
    "timeline": "SELECT F.followerId, COUNT(*) AS tweets, SUM(T.likes) AS likes FROM Follower F "
    "JOIN Tweet T ON F.userId = T.userId WHERE T.day >= DATE '2015-01-02' GROUP BY F.followerId",
    "reach": "SELECT T.tweetId, F.followerId FROM Tweet T, Follower F WHERE T.userId = F.userId",
}
COLUMNS = {"Follower": ["userId", "followerId"], "Tweet": ["userId", "tweetId", "day", "likes"]}


def database():
    import ringml.sql as sql

    db = sql.Database(TABLES)
    for name, text in VIEWS.items():
        db.create_view(name, text)
    return db


def duckdb_views(tables: dict[str, list[tuple]]) -> dict[str, pd.DataFrame]:
    from sql_oracle import duckdb_results

    frames = {t: pd.DataFrame(rows, columns=COLUMNS[t]) for t, rows in tables.items()}
    frames["Tweet"]["day"] = pd.to_datetime(frames["Tweet"]["day"]).astype("datetime64[ns]")
    frames["Tweet"]["likes"] = frames["Tweet"]["likes"].astype(float)
    frames["Follower"] = frames["Follower"].astype(np.int64)
    frames["Tweet"][["userId", "tweetId"]] = frames["Tweet"][["userId", "tweetId"]].astype(np.int64)
    return duckdb_results(VIEWS, frames)


# single-row updates of a database: inserts, deletes of present rows, deletes of absent ones
sql_updates = st.lists(
    st.tuples(
        st.sampled_from(["Follower", "Tweet", "tweet"]),  # table names are case-insensitive
        st.sampled_from(["insert", "insert", "delete", "absent"]),
        st.integers(0, 3),  # userId
        st.integers(0, 5),  # followerId / tweetId
        st.sampled_from(["2015-01-01", "2015-01-02", "2015-03-04"]),
        st.integers(-3, 3),  # likes
        st.integers(0, 10**6),  # which present row a delete picks
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sql_updates, st.integers(1, 25))
def test_database_fed_row_by_row_equals_duckdb_after_every_flush(stream, max_rows):
    """Coalesced single-row updates of SQL tables: after every flush each view reads what
    DuckDB computes from the rows applied so far, the diffs its subscribers got add up to
    the change of DuckDB's result, and a rejected delete of an absent row is reported by id
    while the flush's other updates are applied."""
    from sql_oracle import assert_same_rows, diff_counter, multiset_difference

    db = database()
    diffs: dict[str, list] = {name: [] for name in VIEWS}
    for name in VIEWS:
        db.view(name).subscribe(diffs[name].append)
    batcher = MicroBatcher(db, max_rows=max_rows)
    tables: dict[str, list[tuple]] = {"Follower": [], "Tweet": []}
    before = duckdb_views(tables)
    absent: set = set()
    for i, (spelled, what, user, other, day, likes, pick) in enumerate(stream):
        table = "Tweet" if spelled.lower() == "tweet" else "Follower"
        row = (user, other) if table == "Follower" else (user, other, day, float(likes))
        present = tables[table]
        if what == "delete" and present:
            flush = batcher.delete(spelled, present.pop(pick % len(present)), id=i)
        elif what == "absent":
            row = (user, 100 + other) if table == "Follower" else (user, 100 + other, day, 9.0)
            absent.add(i)
            flush = batcher.delete(spelled, row, id=i)
        else:
            present.append(row)
            flush = batcher.insert(spelled, dict(zip(COLUMNS[table], row, strict=True)), id=i)
        if flush is None:
            continue
        assert batcher.pending == 0 and flush.rows == max_rows
        assert {id for id, _ in flush.rejected} == absent
        assert all(isinstance(e, BatchError) for _, e in flush.rejected)
        assert flush.coalesced == (not absent)
        absent.clear()
        after = duckdb_views(tables)
        for name in VIEWS:
            assert_same_rows(db.view(name).to_pandas(), after[name], f"{name} after update {i}")
            got = diff_counter(None)
            for d in diffs[name]:
                got.update(diff_counter(d))
            got = type(got)({k: v for k, v in got.items() if v})
            assert got == multiset_difference(before[name], after[name]), name
            diffs[name].clear()
        before = after
    batcher.flush()
    after = duckdb_views(tables)
    for name in VIEWS:
        assert_same_rows(db.view(name).to_pandas(), after[name], f"{name} at the end")


def test_database_tables_resolved_when_used():
    """A table created after the batcher is known to it; a table a view holds static is
    rejected at flush like any bad update; unknown tables and wrong shapes raise at once."""
    import ringml.sql as sql

    db = sql.Database("CREATE TABLE Region (r INTEGER, name VARCHAR)")
    batcher = MicroBatcher(db, max_rows=100)
    batcher.insert("REGION", (1, "EU"), id="r1")
    db.create_table("CREATE TABLE Nation (n INTEGER, r INTEGER)")
    batcher.insert("nation", {"n": 7, "r": 1}, id="n7")
    with pytest.raises(BatchError, match="unknown relation 'Planet'"):
        batcher.insert("Planet", (1,))
    with pytest.raises(BatchError, match="has 2 columns"):
        batcher.insert("Nation", (1, 2, 3))
    flush = batcher.flush()
    assert flush.coalesced and flush.applied == ["r1", "n7"] and flush.deltas == [None]
    view = db.create_view(
        "names",
        "SELECT name, COUNT(*) AS n FROM Nation JOIN Region USING (r) GROUP BY name",
        static=["Region"],
    )
    batcher.insert("Nation", (8, 1), id="n8")
    batcher.insert("Region", (2, "US"), id="static")
    flush = batcher.flush()
    assert flush.applied == ["n8"] and [id for id, _ in flush.rejected] == ["static"]
    assert "static" in str(flush.rejected[0][1])
    assert view.to_pandas().to_dict("list") == {"name": ["EU"], "n": [2]}
    assert len(db.table("Region")) == 1


def test_microbatcher_refuses_other_targets():
    with pytest.raises(InputTypeError, match="Maintainer or a ringml.sql.Database"):
        MicroBatcher(pd.DataFrame())


def test_a_fallback_that_applies_one_update_is_not_coalesced():
    batcher = MicroBatcher(maintainer(), max_rows=100)
    batcher.insert("R", (1, 2.0), id="ok")
    batcher.delete("R", (5, 1.0), id="absent")
    flush = batcher.flush()
    assert flush.applied == ["ok"] and [i for i, _ in flush.rejected] == ["absent"]
    assert len(flush.deltas) == 1 and not flush.coalesced


def test_batches_of_other_dtypes_are_not_stacked_into_a_changed_or_failing_column():
    """pd.concat of buffered batches changed values' types or failed where each batch alone
    did not: an Arrow int64 key 2**53+1 beside a float key made every flush raise
    ArrowInvalid (the buffer jammed), a year-3000 datetime64[s] key beside a datetime64[ns]
    one raised OutOfBoundsDatetime on every flush, and a bool feature stacked under floats
    was applied as 1.0 though alone it is rejected."""
    import pyarrow as pa
    from ringml.rings.scalar import RealRing

    from ringml import Query

    query = Query({"R": ["k", "x"]}, RealRing(["x"]), free=["k"])
    big = pd.array([2**53 + 1], dtype=pd.ArrowDtype(pa.int64()))
    cases = [
        ({"k": big, "x": [1.0]}, {"k": [1.5], "x": [2.0]}, None),
        ({"k": np.array(["3000-01-01"], "datetime64[s]"), "x": [1.0]},
         {"k": np.array(["2000-01-01"], "datetime64[ns]"), "x": [2.0]}, "outside the range"),
        ({"k": [1], "x": np.array([True])}, {"k": [2], "x": [2.5]}, "is a boolean"),
    ]  # fmt: skip
    for first, second, rejected in cases:
        m = Maintainer(query)
        batcher = MicroBatcher(m, max_rows=100)
        batcher.add(UpdateBatch.inserts("R", pd.DataFrame(first)), id="first")
        batcher.add(UpdateBatch.inserts("R", pd.DataFrame(second)), id="second")
        flush = batcher.flush()
        assert batcher.pending == 0
        one_by_one = Maintainer(query)
        if rejected is None:
            assert flush.coalesced and flush.applied == ["first", "second"]
            one_by_one.insert("R", pd.DataFrame(first))
        else:
            assert flush.applied == ["second"] and [i for i, _ in flush.rejected] == ["first"]
            error = flush.rejected[0][1]
            assert isinstance(error, BatchError) and rejected in str(error)
            with pytest.raises(BatchError, match=rejected):
                one_by_one.insert("R", pd.DataFrame(first))
        one_by_one.insert("R", pd.DataFrame(second))
        assert m.result() == one_by_one.result()


def test_updates_from_several_threads_with_a_polling_thread_are_each_applied_once():
    """insert() on one thread and flush()/poll() on another lost rows (appended to a buffer
    a flush had already taken) or raised TypeError in the age check after buffering the
    row (a retry applied it twice); the batcher now holds one lock."""
    import pickle
    import threading

    from ringml import Query

    m = Maintainer(Query({"R": ["a", "x"]}))
    batcher = MicroBatcher(m, max_rows=97, max_delay=0.0)
    stop = threading.Event()
    flushes: list = []

    def poller():
        while not stop.is_set():
            flushes.append(batcher.poll())

    def inserter(k):
        for i in range(1500):
            flushes.append(batcher.insert("R", (k, i), id=(k, i)))

    threads = [threading.Thread(target=inserter, args=(k,)) for k in range(4)]
    polling = threading.Thread(target=poller)
    polling.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    polling.join()
    flushes.append(batcher.flush())
    applied = [i for f in flushes if f is not None for i in f.applied]
    assert len(applied) == len(set(applied)) == 6000 and m.result() == 6000
    copy = pickle.loads(pickle.dumps(batcher))  # the lock is not state
    assert copy.insert("R", (9, 9)).applied and copy.target.result() == 6001
    assert m.result() == 6000


def test_a_flush_waits_for_an_update_in_progress_on_another_thread():
    """Deterministic interleaving through ``clock``: the inserting thread is inside the age
    check when the main thread flushes (before the lock, the flush took the buffer and the
    check raised TypeError on the row it had already buffered)."""
    import threading

    from ringml import Query

    inside, t = threading.Event(), [0.0]

    def clock():
        if threading.current_thread().name == "inserter" and t[0] > 0:
            inside.set()
            threading.Event().wait(0.3)  # a flush on the main thread would run now
        return t[0]

    m = Maintainer(Query({"R": ["a", "x"]}))
    batcher = MicroBatcher(m, max_rows=1000, max_delay=10.0, clock=clock)
    batcher.insert("R", (0, 1), id="a")
    t[0] = 1.0
    outcome: dict = {}

    def inserter():
        try:
            outcome["flush"] = batcher.insert("R", (1, 2), id="b")
        except Exception as error:  # noqa: BLE001 - the test reports it
            outcome["error"] = error

    thread = threading.Thread(target=inserter, name="inserter")
    thread.start()
    inside.wait(5)
    flushed = batcher.flush()
    thread.join()
    assert "error" not in outcome and outcome["flush"] is None
    assert flushed.applied == ["a", "b"] and m.result() == 2 and batcher.pending == 0
