"""The checkpoint guard of :class:`StreamingMaintainer` (no Spark: micro-batches are handed to
``process_batch`` in the pipeline's internal layout): a state folder saved for another query
is refused, naming what differs; the same query resumes, and after a restart the README
idiom ``query.ring.statistics(sm.result())`` works with the user's fresh query object."""

from __future__ import annotations

import gc
import io
import json
import pickle
import re
import weakref

import numpy as np
import pandas as pd
import pytest
from ringml.rings.categorical import GeneralizedCovarianceRing
from ringml.rings.scalar import IntegerRing

import ringml as rm
from ringml.errors import InputTypeError, SubscriberError
from ringml.predicates import col, opaque

pa = pytest.importorskip("pyarrow")

from ringml.pipelines.spark_checkpoint import (  # noqa: E402
    CheckpointError,
    StateCheckpoint,
    restore_maintainer,
    snapshot_maintainer,
)
from ringml.pipelines.spark_stream import StreamingMaintainer  # noqa: E402

SCHEMAS = {"R": ["a", "x", "k"], "S": ["a", "y"]}
FILTERS = {"R": "x >= 0 AND k <> 'drop'"}


def make_query(**changes) -> rm.Query:
    args = {"features": ["x", "y"], "filters": FILTERS} | changes
    return rm.covariance_query(SCHEMAS, **args)


def layout(relation: str, rows: pd.DataFrame, mult) -> pa.Table:
    """One feed's micro-batch in the pipeline's internal layout (signed multiplicities)."""
    n = len(rows)
    return pa.table(
        {
            "__ringml_feed": pa.array([0] * n, pa.int32()),
            "__ringml_relation": [relation] * n,
            "__ringml_op": pa.array([None] * n, pa.string()),
            "__ringml_mult": pa.array(np.broadcast_to(mult, n), pa.int64()),
            "__ringml_corrupt": pa.array([None] * n, pa.string()),
            **{f"__f0__{c}": rows[c].to_numpy() for c in rows.columns},
        }
    )


def stream(seed: int) -> list[tuple[str, pd.DataFrame, int]]:
    """Micro-batches: R and S inserts (some R rows fail the filter), then R deletes."""
    rng = np.random.default_rng(seed)
    r = pd.DataFrame(
        {
            "a": rng.integers(0, 4, 24),
            "x": rng.choice([-1.0, 0.5, 2.0, 7.25], 24),
            "k": rng.choice(["keep", "drop"], 24),
        }
    )
    s = pd.DataFrame({"a": rng.integers(0, 4, 12), "y": rng.normal(100.0, 5.0, 12)})
    return [
        ("R", r.iloc[:8], 1),
        ("R", r.iloc[8:16], 1),
        ("R", r.iloc[3:6], -1),  # deletes of present rows, some filtered out
        ("S", s.iloc[:6], 1),  # S's shift is fixed only now: after the first restart
        ("R", r.iloc[16:], 1),
        ("S", s.iloc[6:], 1),
        ("R", r.iloc[10:13], -1),
    ]


def reference(batches) -> rm.Maintainer:
    m = rm.Maintainer(make_query())
    for relation, rows, mult in batches:
        m.apply([rm.UpdateBatch(relation, rows.reset_index(drop=True), np.full(len(rows), mult))])
    return m


def assert_same_statistics(query: rm.Query, payload, expected: rm.Maintainer) -> None:
    got = query.ring.statistics(payload)
    want = expected.ring.statistics(expected.result())
    assert got.count == want.count
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-12)
    np.testing.assert_allclose(got.covariance, want.covariance, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("snapshot_every", [1, 2])
def test_restart_resumes_and_the_readme_idiom_works(tmp_path, snapshot_every):
    batches = stream(1)

    def restart() -> tuple[rm.Query, StreamingMaintainer]:
        query = make_query()  # the user's fresh query object, as after a process restart
        sm = StreamingMaintainer(rm.Maintainer(query), tmp_path, snapshot_every=snapshot_every)
        return query, sm

    query, sm = restart()
    for batch_id, batch in enumerate(batches[:3]):
        sm.process_batch(layout(*batch), batch_id)
    first_ring = weakref.ref(sm.maintainer.ring)
    del sm, query
    gc.collect()
    assert first_ring() is None  # no ring of the first "process" is left to lean on

    query, sm = restart()
    assert sm.last_batch_id == 2
    assert sm.maintainer.query is query and sm.maintainer.ring is query.ring
    assert not np.isnan(query.ring.shifts[0])  # x's shift came back with the state
    assert_same_statistics(query, sm.result(), reference(batches[:3]))  # no S rows yet
    for batch_id, batch in enumerate(batches[3:5], start=3):
        sm.process_batch(layout(*batch), batch_id)
    assert_same_statistics(query, sm.result(), reference(batches[:5]))
    assert query.ring.statistics(sm.result()).count > 0
    assert sm.process_batch(layout(*batches[4]), 4) is None  # a replay is skipped

    query, sm = restart()
    assert sm.last_batch_id == 4
    for batch_id, batch in enumerate(batches[5:], start=5):
        sm.process_batch(layout(*batch), batch_id)
    assert_same_statistics(query, sm.result(), reference(batches))
    assert query.ring.statistics(sm.result()).count > 0


@pytest.mark.parametrize("snapshot_every", [1, 2])
def test_a_restart_moves_the_state_into_the_callers_maintainer(tmp_path, snapshot_every):
    batches = stream(5)
    sm = StreamingMaintainer(rm.Maintainer(make_query()), tmp_path, snapshot_every=snapshot_every)
    for batch_id, batch in enumerate(batches[:3]):
        sm.process_batch(layout(*batch), batch_id)
    query = make_query()
    mine, seen = rm.Maintainer(query), []
    mine.keep_previous = True
    unsubscribe = mine.subscribe(seen.append)
    sm = StreamingMaintainer(mine, tmp_path, snapshot_every=snapshot_every)
    assert sm.maintainer is mine and mine.query is query and mine.ring is query.ring
    assert mine.keep_previous and seen == []  # logged batches are replayed, not re-delivered
    assert_same_statistics(query, mine.result(), reference(batches[:3]))
    sm.process_batch(layout(*batches[3]), 3)
    assert len(seen) == 1 and seen[0].previous is not None
    assert_same_statistics(query, mine.result(), reference(batches[:4]))
    unsubscribe()
    sm.process_batch(layout(*batches[4]), 4)
    assert len(seen) == 1


def test_a_batch_discarded_after_a_subscriber_error_keeps_the_subscribers(tmp_path):
    every = stream(6)
    batches = [every[3], *every[:2], every[4]]  # S first: each later batch changes the result
    mine, seen = rm.Maintainer(make_query()), []

    def subscriber(delta) -> None:
        seen.append(delta)
        if len(seen) == 1:
            raise RuntimeError("transient failure")

    mine.subscribe(subscriber)
    sm = StreamingMaintainer(mine, tmp_path)
    sm.process_batch(layout(*batches[0]), 0)
    with pytest.raises(SubscriberError):
        sm.process_batch(layout(*batches[1]), 1)
    assert sm.maintainer is mine and sm.last_batch_id == 0  # back to the committed state
    assert_same_statistics(mine.query, mine.result(), reference(batches[:1]))
    for batch_id, batch in enumerate(batches[1:], start=1):  # Spark replays batch 1
        sm.process_batch(layout(*batch), batch_id)
    assert len(seen) == 4 and sm.maintainer is mine
    assert_same_statistics(mine.query, mine.result(), reference(batches))


def test_adopt_state_refuses_another_querys_maintainer():
    mine = reference(stream(7))
    before = pickle.dumps(mine)
    for name, (other, component) in other_maintainers().items():
        with pytest.raises(rm.SchemaError, match=rf"another query \(differing: .*{component}"):
            mine.adopt_state(other)
        assert pickle.dumps(mine) == before, name
    with pytest.raises(InputTypeError, match="takes a Maintainer, got dict"):
        mine.adopt_state({})


def other_maintainers() -> dict[str, tuple[rm.Maintainer, str]]:
    """Maintainers that must not resume the base state, and the component named."""
    cov = rm.covariance_query
    return {
        "other features": (rm.Maintainer(make_query(features=["x"])), "ring"),
        "categorical": (rm.Maintainer(make_query(categorical=["k"], features=["x", "y", "k"])),
                        "ring"),
        "other ring": (rm.Maintainer(rm.Query(SCHEMAS, IntegerRing(), filters=FILTERS)), "ring"),
        "generalized ring": (
            rm.Maintainer(rm.Query(SCHEMAS, GeneralizedCovarianceRing(["x", "y"], []),
                                   filters=FILTERS)),
            "ring",
        ),
        "other relations": (
            rm.Maintainer(cov({**SCHEMAS, "T": ["a", "z"]}, ["x", "y"], filters=FILTERS)),
            "relations",
        ),
        "other columns": (
            rm.Maintainer(cov({"R": ["a", "x", "k"], "S": ["a", "y", "w"]}, ["x", "y"],
                              filters=FILTERS)),
            "relations",
        ),
        "other order": (rm.Maintainer(make_query(), order="a{y, x{k}}"), "order"),
        "other filter": (rm.Maintainer(make_query(filters={"R": col("x") > 0})), "filters"),
        "no filter": (rm.Maintainer(make_query(filters={})), "filters"),
        "other strategy": (rm.Maintainer(make_query(), strategy="first_order"), "strategy"),
        "other tree": (rm.Maintainer(make_query(), tree="nu"), "tree"),
        "other free": (
            rm.Maintainer(rm.covariance_query(SCHEMAS, ["x", "y"], free=["a"], filters=FILTERS)),
            "free",
        ),
        "static relation": (rm.Maintainer(make_query(), updatable=["R"]), "updatable"),
    }  # fmt: skip


def test_a_state_saved_for_another_query_is_refused(tmp_path):
    batches = stream(2)
    sm = StreamingMaintainer(rm.Maintainer(make_query()), tmp_path)
    for batch_id, batch in enumerate(batches[:4]):
        sm.process_batch(layout(*batch), batch_id)
    saved = (tmp_path / "state.pkl").read_bytes()
    base = rm.Maintainer(make_query()).description()
    for name, (maintainer, component) in other_maintainers().items():
        assert maintainer.description()[component] != base[component], name
        ring_state = pickle.dumps(vars(maintainer.ring))
        with pytest.raises(CheckpointError) as info:
            StreamingMaintainer(maintainer, tmp_path)
        message = str(info.value)
        assert str(tmp_path) in message and "saved for another query" in message, name
        differing = re.search(r"differing: ([^)]*)\)", message).group(1).split(", ")
        assert component in differing, (name, message)
        assert f"  {component}: saved " in message, name
        # the refused maintainer's ring was not touched, and neither was the state folder
        assert pickle.dumps(vars(maintainer.ring)) == ring_state, name
        assert (tmp_path / "state.pkl").read_bytes() == saved, name
    query = make_query()
    resumed = StreamingMaintainer(rm.Maintainer(query), tmp_path)
    assert resumed.last_batch_id == 3
    assert_same_statistics(query, resumed.result(), reference(batches[:4]))


def test_refusal_names_every_differing_component(tmp_path):
    StreamingMaintainer(rm.Maintainer(make_query()), tmp_path)
    other = rm.Maintainer(
        rm.covariance_query({"R": ["a", "x"], "S": ["a", "y"]}, ["x"]), strategy="recompute"
    )
    with pytest.raises(CheckpointError, match=r"differing: .*relations.*ring.*strategy") as info:
        StreamingMaintainer(other, tmp_path)
    saved_filters = json.dumps(make_query().description()["filters"], sort_keys=True)
    assert f"filters: saved {saved_filters}" in str(info.value)  # shown, not only a hash


def test_snapshots_round_trip_and_refuse_without_spark():
    batches = stream(3)
    m = reference(batches)
    data = snapshot_maintainer(m)
    alone = restore_maintainer(data)  # self-contained: its own query and ring
    assert alone.fingerprint() == m.fingerprint() and alone.query is not m.query
    assert_same_statistics(alone.query, alone.result(), m)
    query = make_query()
    adopted = restore_maintainer(data, like=rm.Maintainer(query))
    assert adopted.query is query and adopted.ring is query.ring
    np.testing.assert_array_equal(query.ring.shifts, m.ring.shifts)
    assert_same_statistics(query, adopted.result(), m)
    with pytest.raises(CheckpointError, match="differing: ring"):
        restore_maintainer(data, like=rm.Maintainer(make_query(features=["y"])))
    with pytest.raises(CheckpointError, match="not a maintainer snapshot"):
        restore_maintainer(pickle.dumps(("something", 1)))


def test_a_snapshot_without_a_description_is_refused():
    data = snapshot_maintainer(reference(stream(3)))
    handle = io.BytesIO(data)
    header = pickle.load(handle)  # the header pickle, then the maintainer's
    del header[2]["description"]
    forged = pickle.dumps(header, protocol=5) + handle.read()
    with pytest.raises(CheckpointError, match="records no query description"):
        restore_maintainer(forged, like=rm.Maintainer(make_query()))
    assert restore_maintainer(forged).result().count > 0  # without a guard it still loads


def test_a_truncated_snapshot_is_refused_and_leaves_like_as_it_was():
    data = snapshot_maintainer(reference(stream(3)))
    like = reference(stream(4))  # other values: other shifts
    ring_state, want = pickle.dumps(vars(like.ring)), like.ring.statistics(like.result())
    for cut in (3, len(data) // 2):
        with pytest.raises(CheckpointError, match=r"^the snapshot: unreadable \(.*truncated"):
            restore_maintainer(data[:-cut], like=like)
        assert pickle.dumps(vars(like.ring)) == ring_state, cut  # not the snapshot's shifts
    np.testing.assert_array_equal(like.ring.statistics(like.result()).mean, want.mean)


def test_a_bad_log_record_is_refused_naming_it_and_leaves_like_as_it_was(tmp_path):
    batches = stream(3)
    sm = StreamingMaintainer(reference(batches[:1]), tmp_path, snapshot_every=10)
    for batch_id, batch in enumerate(batches[1:3], start=1):
        sm.process_batch(layout(*batch), batch_id)
    log = tmp_path / "log" / f"{2:012d}.pkl"
    good = log.read_bytes()
    record = pickle.loads(good)
    unknown = {**record, "batches": [("Z", pd.DataFrame({"a": [1]}), None)]}
    cases = {
        "unreadable \\(.*truncated": good[: len(good) // 2],
        "not a ringml state checkpoint": pickle.dumps(["not", "a", "record"]),
        "its batches cannot be re-applied \\(unknown relation 'Z'": pickle.dumps(unknown),
    }
    like = reference(stream(4))
    ring_state = pickle.dumps(vars(like.ring))
    for problem, content in cases.items():
        log.write_bytes(content)
        with pytest.raises(CheckpointError, match=f"^{re.escape(str(log))}: {problem}"):
            StateCheckpoint(tmp_path, 10).load(like=like)
        assert pickle.dumps(vars(like.ring)) == ring_state, problem
    log.write_bytes(good)
    query = make_query()
    loaded = StateCheckpoint(tmp_path, 10).load(like=rm.Maintainer(query))
    assert loaded.batch_id == 2 and loaded.replayed == [1, 2]
    assert_same_statistics(query, loaded.maintainer.result(), reference(batches[:3]))


def test_opaque_filters_cannot_be_checkpointed(tmp_path):
    query = rm.Query(SCHEMAS, filters={"R": opaque(lambda frame: frame.x.to_numpy() > 0)})
    with pytest.raises(rm.SchemaError, match=r"relations \['R'\] are opaque"):
        StreamingMaintainer(rm.Maintainer(query), tmp_path)
    assert not (tmp_path / "state.pkl").exists()
