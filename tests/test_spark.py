"""Spark pipelines: streaming ingestion exactly once, and the sharded (distributed) maintainer.

Streams are small Housing-like stars with deletes, written as change-feed files and read
with ``trigger(availableNow=True)`` (one file per micro-batch), so every run is
deterministic.  Results are compared with the local engine on the same stream: counts
exactly, covariance moments in original units to 1e-9 (shards and the local engine may pick
different per-variable shifts, so raw shifted payloads differ by rounding).
"""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ringml.rings.scalar import IntegerRing

import ringml as rm
from ringml.datasets import build_stream, housing_star

pytest.importorskip("pyspark", reason="the [spark] extra is not installed")

from ringml.pipelines.spark_checkpoint import CheckpointError  # noqa: E402
from ringml.pipelines.spark_distributed import DistributedMaintainer  # noqa: E402
from ringml.pipelines.spark_stream import (  # noqa: E402
    ChangeFeed,
    FeedError,
    StreamingMaintainer,
    spark_types_of,
    write_change_file,
    write_stream_files,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def housing():
    return housing_star(postcodes=30, seed=3)


def _reference(schemas, stream, query=None):
    m = rm.Maintainer(query or rm.covariance_query(schemas))
    for b in stream:
        m.apply([rm.UpdateBatch(b.relation, b.rows, b.multiplicity)])
    return m


def _assert_same_covariance(expected: rm.Maintainer, ring, payload) -> None:
    count_e, sums_e, products_e = expected.ring.moments(expected.result())
    count_a, sums_a, products_a = ring.moments(payload)
    assert count_a == count_e
    np.testing.assert_allclose(sums_a, sums_e, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(products_a, products_e, rtol=1e-9, atol=1e-6)


# ------------------------------------------------------------------ streaming
def test_stream_equals_local_engine_with_deletes(spark, housing, tmp_path):
    stream = build_stream(housing.relations, 40, 0.25, seed=1)
    assert sum(b.n_deletes for b in stream) > 0
    types = spark_types_of(housing.relations)
    write_stream_files(tmp_path / "feed", stream, tagged=True, per_file=6, columns=types)
    feed = ChangeFeed(str(tmp_path / "feed"), types, relation=None, max_files_per_trigger=1)
    seen = []
    sm = StreamingMaintainer(
        rm.Maintainer(rm.covariance_query(housing.schemas)),
        tmp_path / "state",
        on_batch=lambda report: seen.append(report.batch_id),
        callback_every=2,
    )
    query = sm.start(spark, feed, str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    n_files = -(-len(stream) // 6)
    assert [r.batch_id for r in sm.reports] == list(range(n_files))
    assert sum(r.applied for r in sm.reports) == sum(len(b) for b in stream)
    assert seen == [r.batch_id for r in sm.reports][1::2]
    _assert_same_covariance(
        _reference(housing.schemas, stream), sm.maintainer.ring, sm.maintainer.result()
    )
    # an empty micro-batch is harmless: nothing applied, nothing written, id not consumed
    before = sm.last_batch_id
    empty = pa.table({"__ringml_feed": pa.array([], pa.int32())})
    assert sm.process_batch(empty, before + 1) is None
    assert sm.last_batch_id == before


def test_restart_from_checkpoint_applies_every_batch_once(spark, housing, tmp_path):
    stream = build_stream(housing.relations, 30, 0.3, seed=2)
    types = spark_types_of(housing.relations)
    feeds = [
        ChangeFeed(
            str(tmp_path / "feed" / r),
            {c: types[c] for c in housing.schemas[r]},
            relation=r,
            format="json",
            op_column=None,
            mult_column="mult",
            max_files_per_trigger=1,
        )
        for r in housing.relations
    ]
    rounds = -(-len(stream) // len(housing.relations))  # one batch per relation per round

    def write(first: int, last: int) -> None:
        part = stream[first * 6 : last * 6]
        write_stream_files(
            tmp_path / "feed", part, tagged=False, format="json", start=first, per_file=6,
            op_column=None, mult_column="mult",
        )  # fmt: skip

    def pipeline(on_batch=None, state="state") -> StreamingMaintainer:  # a fresh driver
        return StreamingMaintainer(
            rm.Maintainer(rm.covariance_query(housing.schemas)),
            tmp_path / state,
            on_batch=on_batch,
            snapshot_every=2,  # exercise the log replay on restart too
        )

    ck = str(tmp_path / "ck")
    first, crash_at = rounds // 3, 2 * rounds // 3
    write(0, first)
    sm1 = pipeline()
    sm1.start(spark, feeds, ck, trigger={"availableNow": True}).awaitTermination()
    assert sm1.last_batch_id == first - 1

    # a new driver; the batch `crash_at` is applied and committed here, then the driver
    # "dies" before Spark commits it (the callback raises), so Spark replays it on restart
    write(first, rounds)

    def crash(report):
        if report.batch_id == crash_at:
            raise RuntimeError("simulated driver crash")

    sm2 = pipeline(on_batch=crash)
    assert sm2.last_batch_id == first - 1
    query = sm2.start(spark, feeds, ck, trigger={"availableNow": True})
    with pytest.raises(Exception, match="simulated driver crash"):
        query.awaitTermination()
    assert sm2.last_batch_id == crash_at

    sm3 = pipeline()
    assert sm3.last_batch_id == crash_at  # restored from snapshot + log
    uri = f"file://{ck}"  # the same checkpoint as a URI: recognized as the state's
    sm3.start(spark, feeds, uri, trigger={"availableNow": True}).awaitTermination()
    assert sm3.replays_skipped == [crash_at]
    assert sm3.last_batch_id == rounds - 1
    applied = sum(r.applied for sm in (sm1, sm2, sm3) for r in sm.reports)
    assert applied == sum(len(b) for b in stream)
    expected = _reference(housing.schemas, stream)
    _assert_same_covariance(expected, sm3.maintainer.ring, sm3.maintainer.result())

    # a replayed batch id handed over directly is skipped, the state does not move
    before = sm3.maintainer.result()
    assert sm3.process_batch(pa.table({"x": [1]}), crash_at) is None
    assert sm3.maintainer.ring.equal(sm3.maintainer.result(), before)
    # the state refuses a Spark checkpoint it does not belong to
    with pytest.raises(CheckpointError, match="Spark checkpoint"):
        pipeline().start(spark, feeds, str(tmp_path / "other-ck"))
    # a fresh state would silently miss the batches this checkpoint has committed
    with pytest.raises(CheckpointError, match=rf"fresh-state is fresh.*{ck}.* up to {rounds - 1}"):
        pipeline(state="fresh-state").start(spark, feeds, ck)


def test_malformed_rows_reject_or_dead_letter(spark, housing, tmp_path):
    stream = build_stream(housing.relations, 40, 0.0, seed=4)[:6]
    types = spark_types_of(housing.relations)
    columns = ["relation", "op", *types]
    write_stream_files(tmp_path / "first", stream, tagged=True, per_file=6, columns=types)
    rows = pd.read_csv(tmp_path / "first" / "part-000000.csv")  # good rows for batch 1
    good = pd.concat([rows.iloc[:5], rows.iloc[-5:]])
    shop = rows[rows.relation == "Shop"].iloc[0].to_dict()
    bad = [
        {**shop, "relation": "Shops"},  # unknown relation
        {**shop, "openinghoursshop": "late"},  # mistyped value
        {**shop, "op": "upsert"},  # unknown op
    ]

    def run(name: str, **kwargs) -> StreamingMaintainer:
        folder = tmp_path / name
        write_stream_files(folder, stream, tagged=True, per_file=6, columns=types)
        frame = pd.concat([good.iloc[:5], pd.DataFrame(bad), good.iloc[5:]])[columns]
        path = write_change_file(folder / "part-000001.csv", frame, mtime=2e9)
        with open(path, "a") as handle:
            handle.write("House,insert,1,2.5\n")  # wrong number of fields
        feed = ChangeFeed(str(folder), types, relation=None, max_files_per_trigger=1)
        sm = StreamingMaintainer(
            rm.Maintainer(rm.covariance_query(housing.schemas)),
            tmp_path / f"{name}-state",
            **kwargs,
        )
        query = sm.start(spark, feed, str(tmp_path / f"{name}-ck"), trigger={"availableNow": True})
        try:
            query.awaitTermination()
        except Exception:  # noqa: BLE001 - the reject mode stops the query
            pass
        return sm

    sm = run("reject")
    assert sm.last_batch_id == 0  # batch 1 was rejected as a whole, the state is batch 0's
    error = next(e for e in sm.errors if isinstance(e, FeedError))
    assert error.batch_id == 1 and str(error).startswith("batch 1: ")
    assert len(error.bad_rows) == 4 and {b.batch_id for b in error.bad_rows} == {1}
    reasons = {b.reason.split(" ")[0] for b in error.bad_rows}
    assert reasons == {"unknown", "unparseable"}
    rows_seen = [str(b.row) for b in error.bad_rows]
    assert "House,insert,1,2.5" in rows_seen
    assert any("Shops" in r for r in rows_seen) and any("upsert" in r for r in rows_seen)
    expected = _reference(housing.schemas, stream)
    _assert_same_covariance(expected, sm.maintainer.ring, sm.maintainer.result())

    sm = run("dead", on_error="dead_letter", dead_letter_path=tmp_path / "dead")
    assert sm.last_batch_id == 1
    dead = sm.dead_letters()
    assert len(dead) == 4 and set(dead.batch_id) == {1}
    assert dead.row.str.contains("late").any() and dead.row.str.contains("Shops").any()
    expected.apply(
        [
            rm.UpdateBatch.inserts(r, g[list(housing.schemas[r])].reset_index(drop=True))
            for r, g in good.groupby("relation")
        ]
    )
    _assert_same_covariance(expected, sm.maintainer.ring, sm.maintainer.result())


# ------------------------------------------------------------------ distributed
@pytest.mark.parametrize("kind", ["covariance", "groupby_count"])
def test_distributed_equals_local_engine(spark, housing, tmp_path, kind):
    def query():
        if kind == "covariance":
            return rm.covariance_query(housing.schemas)  # root postcode: every relation sharded
        # root pricerangeshop: Shop sharded, the five other relations broadcast
        return rm.Query(housing.schemas, IntegerRing(), free=["pricerangeshop"])

    initial = {r: f.iloc[: len(f) // 2] for r, f in housing.relations.items()}
    rest = {r: f.iloc[len(f) // 2 :].reset_index(drop=True) for r, f in housing.relations.items()}
    stream = build_stream(rest, 60, 0.3, seed=5)
    dm = DistributedMaintainer(spark, query(), shards=4, state_dir=tmp_path / "dist")
    assert ("broadcast" in dm.explain()) == (kind == "groupby_count")
    if kind == "covariance":  # shard keys, found without Spark, match Spark's partitioner
        from pyspark.sql import functions as F

        keys = spark.createDataFrame([(k,) for k in dm._shard_keys()], "k int")
        spread = keys.select(F.pmod(F.hash("k"), F.lit(4)).alias("p")).collect()
        assert [row.p for row in spread] == [0, 1, 2, 3]
    if kind == "covariance":  # bulk path from parquet files, read by the map tasks
        sources = {}
        for r, f in initial.items():
            folder = tmp_path / "parquet" / r  # a folder of two files, row groups of 7 rows
            folder.mkdir(parents=True)
            for i, half in enumerate((f.iloc[: len(f) // 2], f.iloc[len(f) // 2 :])):
                table = pa.Table.from_pandas(half, preserve_index=False)
                pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=7)
            sources[r] = str(folder) if r != "House" else folder / "part-0.parquet"
        dm.load(sources)
        dm.load({"House": str(tmp_path / "parquet" / "House" / "part-1.parquet")})
    else:  # bulk path from Spark DataFrames
        dm.load({r: spark.createDataFrame(f) for r, f in initial.items()})
    local = rm.Maintainer(query())
    for r, f in initial.items():
        local.insert(r, f)
    chunks = [stream[i : i + 12] for i in range(0, len(stream), 12)]
    for batch_id, chunk in enumerate(chunks):
        batches = [rm.UpdateBatch(b.relation, b.rows, b.multiplicity) for b in chunk]
        assert dm.apply(batches, batch_id=batch_id)
        local.apply(batches)
    assert not dm.apply(batches, batch_id=len(chunks) - 1)  # a replayed id is skipped

    def check(result):
        if kind == "covariance":
            _assert_same_covariance(local, dm.ring, result)
        else:
            assert result == local.result()

    check(dm.result())
    # a batch that is fine on most shards but deletes an absent tuple on one: no shard
    # changes (the staged versions are discarded), and the batch id is not consumed
    fine = rm.UpdateBatch.inserts("House", housing.relations["House"].iloc[::7])
    absent = rm.UpdateBatch.deletes("House", housing.relations["House"].iloc[:1].assign(price=-1))
    with pytest.raises(rm.BatchError, match="rejected by"):
        dm.apply([fine, absent], batch_id=len(chunks))
    statuses = sorted(r["status"] for r in dm.last_job)  # broadcast House: all shards fail
    assert statuses == (["error", "ok", "ok", "ok"] if kind == "covariance" else ["error"] * 4)
    check(dm.result())
    assert dm.apply([fine], batch_id=len(chunks))
    local.apply([fine])
    check(dm.result())
    # a new driver on the same state directory resumes from the manifest
    resumed = DistributedMaintainer(spark, query(), shards=4, state_dir=tmp_path / "dist")
    assert resumed.last_batch_id == len(chunks)
    check(resumed.result())
    # ... but not with another shard count or query: the manifest names what differs
    with pytest.raises(CheckpointError, match=r"differing: shards\)"):
        DistributedMaintainer(spark, query(), shards=2, state_dir=tmp_path / "dist")
    other = rm.Query(housing.schemas, IntegerRing(), free=["postcode"])
    with pytest.raises(CheckpointError, match=r"differing: [^)]*free"):
        DistributedMaintainer(spark, other, shards=4, state_dir=tmp_path / "dist")


def test_stream_into_distributed_maintainer_restarts_exactly_once(spark, housing, tmp_path):
    """A change feed into a 4-shard DistributedMaintainer (after a bulk load): a bad row is
    dead-lettered (rejected by one shard), the driver "dies" after a committed batch, and
    new drivers on the same checkpoints end equal to the local engine, every batch once."""
    initial = {r: f.iloc[: len(f) // 2] for r, f in housing.relations.items()}
    rest = {r: f.iloc[len(f) // 2 :].reset_index(drop=True) for r, f in housing.relations.items()}
    stream = build_stream(rest, 40, 0.3, seed=6)
    files = [stream[i : i + 4] for i in range(0, len(stream), 4)]  # micro-batches 0..4
    assert len(files) == 5
    absent = rest["Shop"].iloc[[0]].assign(postcode=10_000).reset_index(drop=True)
    poisoned = [*files[1], type(stream[0])("Shop", absent, np.array([-1]), np.array([0]))]
    types = spark_types_of(housing.relations)
    feed = ChangeFeed(str(tmp_path / "feed"), types, relation=None, max_files_per_trigger=1)

    def write(number: int, batches) -> None:
        write_stream_files(
            tmp_path / "feed", batches, tagged=True, start=number, per_file=len(batches),
            columns=types,
        )  # fmt: skip

    def pipeline(dm=None, on_batch=None) -> StreamingMaintainer:
        dm = dm or DistributedMaintainer(
            spark, rm.covariance_query(housing.schemas), shards=4, state_dir=tmp_path / "dist"
        )
        return StreamingMaintainer(
            dm,
            None,
            on_error="dead_letter",
            dead_letter_path=tmp_path / "dead",
            on_batch=on_batch,
        )

    ck = str(tmp_path / "ck")
    write(0, files[0])
    write(1, poisoned)
    dm = DistributedMaintainer(
        spark, rm.covariance_query(housing.schemas), shards=4, state_dir=tmp_path / "dist"
    )
    dm.load({r: spark.createDataFrame(f) for r, f in initial.items()})
    sm1 = pipeline(dm)
    sm1.start(spark, feed, ck, trigger={"availableNow": True}).awaitTermination()
    assert sm1.last_batch_id == 1 and dm.last_batch_id == 1
    dead = sm1.dead_letters()
    assert len(dead) == 1 and dead.reason.str.contains("not present").all()

    for number in (2, 3, 4):
        write(number, files[number])

    def crash(report):
        if report.batch_id == 3:
            raise RuntimeError("simulated driver crash")

    sm2 = pipeline(on_batch=crash)  # a new driver: the distributed state resumes
    assert sm2.last_batch_id == 1 and sm2.meta.get("spark_query_id")
    with pytest.raises(Exception, match="simulated driver crash"):
        sm2.start(spark, feed, ck, trigger={"availableNow": True}).awaitTermination()
    assert sm2.last_batch_id == 3

    sm3 = pipeline()
    assert sm3.last_batch_id == 3  # committed with the shards' state, so Spark's replay...
    sm3.start(spark, feed, ck, trigger={"availableNow": True}).awaitTermination()
    assert sm3.replays_skipped == [3]  # ...is skipped
    assert sm3.last_batch_id == 4 and sm3.maintainer.last_batch_id == 4
    applied = sum(r.applied for sm in (sm1, sm2, sm3) for r in sm.reports)
    assert applied == sum(len(b) for b in stream)
    local = rm.Maintainer(rm.covariance_query(housing.schemas))
    for r, f in initial.items():
        local.insert(r, f)
    for b in stream:
        local.apply([rm.UpdateBatch(b.relation, b.rows, b.multiplicity)])
    assert len(sm3.maintainer.shard_roots()) == 4
    _assert_same_covariance(local, sm3.maintainer.ring, sm3.result())
    # an empty micro-batch changes nothing and does not consume its id
    assert sm3.process_batch(pa.table({"__ringml_feed": pa.array([], pa.int32())}), 5) is None
    assert sm3.last_batch_id == 4


def test_engine_rejections_are_dead_lettered_row_by_row(housing, tmp_path):
    """Rows only the engine can reject (a NaN feature, a delete of an absent tuple) are
    isolated one by one in dead-letter mode; no Spark needed (``process_batch``)."""
    shop = housing.relations["Shop"].iloc[:4].reset_index(drop=True)
    rows = pd.concat([shop, shop.iloc[[0]].assign(openinghoursshop=np.nan)], ignore_index=True)
    ops = ["insert"] * 4 + ["insert"]
    absent = shop.iloc[[1]].assign(postcode=10_000)
    rows = pd.concat([rows, absent], ignore_index=True)
    ops.append("delete")
    table = pa.table(
        {
            "__ringml_feed": pa.array([0] * len(rows), pa.int32()),
            "__ringml_relation": ["Shop"] * len(rows),
            "__ringml_op": ops,
            "__ringml_mult": pa.array([None] * len(rows), pa.int64()),
            "__ringml_corrupt": pa.array([None] * len(rows), pa.string()),
            **{f"__f0__{c}": rows[c].to_numpy() for c in shop.columns},
        }
    )
    schema = {"Shop": list(shop.columns)}
    query = rm.covariance_query(schema)
    sm = StreamingMaintainer(
        rm.Maintainer(query),
        tmp_path / "s",
        on_error="dead_letter",
        dead_letter_path=tmp_path / "d",
    )
    report = sm.process_batch(table, 0)
    assert report.applied == 4 and len(report.bad_rows) == 2
    assert {b.column for b in report.bad_rows} == {"openinghoursshop", None}
    assert sm.dead_letters().reason.str.contains("not present").any()
    expected = rm.Maintainer(rm.covariance_query(schema))
    expected.insert("Shop", shop)
    _assert_same_covariance(expected, sm.maintainer.ring, sm.maintainer.result())
    # reject mode: the same batch is refused as a whole and names batch, column and value
    strict = StreamingMaintainer(rm.Maintainer(rm.covariance_query(schema)), tmp_path / "r")
    with pytest.raises(FeedError, match=r"batch 7: relation 'Shop'.*openinghoursshop"):
        strict.process_batch(table, 7)
    assert strict.last_batch_id == -1 and strict.maintainer.result().count == 0


# ------------------------------------------------- distributed, rings holding dictionary codes
SHOP_SCHEMAS = {
    "Sales": ["store", "item", "units", "channel"],
    "Stores": ["store", "size", "region"],
    "Items": ["item", "price", "color"],
}
SHOP_CATEGORICAL = ["channel", "region", "color"]
SHOP_FEATURES = ["size", "price", *SHOP_CATEGORICAL]


@pytest.fixture(scope="module")
def shops():
    """A star on ``store`` (Sales, Stores sharded; Items broadcast) with string categories,
    which every shard's dictionary meets in its own order."""
    rng = np.random.default_rng(11)
    stores = pd.DataFrame(
        {
            "store": np.arange(40),
            "size": rng.integers(50, 400, 40).astype(float),
            "region": rng.choice(["north", "south", "east", "west", "centre"], 40),
        }
    )
    items = pd.DataFrame(
        {
            "item": np.arange(12),
            "price": np.round(rng.uniform(1.0, 20.0, 12), 2),
            "color": rng.choice(["red", "green", "blue", "black"], 12),
        }
    )
    n = 400
    sales = pd.DataFrame(
        {
            "store": rng.integers(0, 40, n),
            "item": rng.integers(0, 12, n),
            "units": rng.integers(1, 9, n).astype(float),
            "channel": rng.choice(["web", "shop", "phone", "mail"], n, p=[0.45, 0.3, 0.22, 0.03]),
        }
    )
    relations = {"Sales": sales, "Stores": stores, "Items": items}
    initial = {r: f.iloc[: len(f) // 2].reset_index(drop=True) for r, f in relations.items()}
    rest = {r: f.iloc[len(f) // 2 :].reset_index(drop=True) for r, f in relations.items()}
    stream = build_stream(rest, 40, 0.3, seed=12)
    assert sum(b.n_deletes for b in stream) > 0
    chunks = [stream[i : i + 6] for i in range(0, len(stream), 6)]
    batches = [[rm.UpdateBatch(b.relation, b.rows, b.multiplicity) for b in c] for c in chunks]
    return initial, batches


def _clashing_codes(dm: DistributedMaintainer) -> set[str]:
    """Keyed variables for which two shards gave one code to different values."""
    clashes = set()
    meaning: dict[tuple[str, int], object] = {}
    for data in dm._roots.values():
        for variable, (codes, values) in pickle.loads(data)["codes"].items():
            for code, value in zip(codes.tolist(), values.tolist(), strict=True):
                if meaning.setdefault((variable, code), value) != value:
                    clashes.add(variable)
    return clashes


def _category_counts(ring, payload, decode) -> dict[str, dict]:
    out = {}
    for v in ring.categorical:
        counts = ring.entry(payload, v)
        values = decode(v, np.array(list(counts), dtype=np.int64)).tolist()
        out[v] = dict(zip(values, counts.values(), strict=True))
    return out


def _assert_same_decoded_covariance(ring_a, a, decode_a, ring_b, b, decode_b) -> None:
    """Equal one-hot covariance moments (to_dense in original units), columns labelled by
    the decoded categories: codes of the two sides may differ, values may not."""
    assert _category_counts(ring_a, a, decode_a) == _category_counts(ring_b, b, decode_b)
    layouts = []
    for ring, payload, decode in ((ring_a, a, decode_a), (ring_b, b, decode_b)):
        known = {}
        for v in ring.categorical:
            codes = ring.used_codes(payload)[v]
            known[v] = dict(zip(decode(v, codes).tolist(), codes.tolist(), strict=True))
        layouts.append(known)
    labels = {v: sorted(set(layouts[0][v]) | set(layouts[1][v])) for v in ring_a.categorical}
    dense = []
    for (ring, payload, _), known in zip(
        ((ring_a, a, decode_a), (ring_b, b, decode_b)), layouts, strict=True
    ):
        # a label one side lacks gets a code no payload uses (a zero column)
        cats = {v: [known[v].get(x, -1 - i) for i, x in enumerate(labels[v])] for v in labels}
        dense.append(ring.to_dense(payload, cats))
    (count_a, sums_a, prods_a), (count_b, sums_b, prods_b) = dense
    assert count_a == count_b
    np.testing.assert_allclose(sums_a, sums_b, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(prods_a, prods_b, rtol=1e-9, atol=1e-6)


def test_distributed_categorical_covariance_equals_local_engine(
    spark, shops, tmp_path, monkeypatch
):
    """Generalized covariance over string categories on 4 shards whose dictionaries number
    the categories differently: shard roots are recoded into the driver's code space before
    they are summed, so decoded results, models and restarts equal the local engine's."""
    from ringml.models import JoinRegressor
    from ringml.models.mutual_information import mutual_information_matrix
    from ringml.pipelines.spark_checkpoint import atomic_write

    initial, chunks = shops

    def regressor() -> JoinRegressor:
        return JoinRegressor(
            SHOP_SCHEMAS, "units", SHOP_FEATURES, SHOP_CATEGORICAL, solver="cholesky"
        ).fit()

    local_model, dist_model = regressor(), regressor()
    local = rm.Maintainer(local_model.query_)
    state = tmp_path / "dist"
    dm = DistributedMaintainer(spark, dist_model.query_, shards=4, state_dir=state)
    ring = dm.ring

    def check(dm: DistributedMaintainer) -> None:
        _assert_same_decoded_covariance(
            local.ring, local.result(), local.decode, dm.ring, dm.result(), dm.decode
        )

    dm.load(initial)
    for relation, frame in initial.items():
        local.insert(relation, frame)
    # the case this guards: shards disagree on what a code means (Items is broadcast, so
    # only the sharded relations' categories clash)
    assert _clashing_codes(dm) == {"channel", "region"}
    check(dm)
    # the old driver, which summed the shards' roots without recoding them, was wrong
    with monkeypatch.context() as patch:
        patch.setattr(dm, "_code_maps", lambda codes: {})
        naive = dm.result()
    with pytest.raises(AssertionError):
        _assert_same_decoded_covariance(
            local.ring, local.result(), local.decode, ring, naive, dm.decode
        )
    for batch_id, chunk in enumerate(chunks):
        assert dm.apply(chunk, batch_id=batch_id)
        local.apply(chunk)
    check(dm)
    codes = {v: np.arange(len(dm._dictionaries[v])) for v in SHOP_CATEGORICAL}
    streamed = [b.rows.region for c in chunks for b in c if b.relation == "Stores"]
    regions = set(initial["Stores"].region).union(*streamed)
    assert sorted(dm.decode("region", codes["region"])) == sorted(regions)
    with pytest.raises(KeyError, match="'units' has no codes"):
        dm.decode("units", [0])

    # models read categories through the distributed maintainer's decode
    local_model.maintainer_ = local
    local_model.partial_fit([])
    dist_model.maintainer_ = dm
    dist_model.partial_fit([])
    assert dist_model.columns_ == local_model.columns_
    assert ("channel", "web") in dist_model.columns_
    np.testing.assert_allclose(dist_model.coef_, local_model.coef_, rtol=1e-7, atol=1e-9)
    assert dist_model.intercept_ == pytest.approx(local_model.intercept_, rel=1e-9)
    rows = initial["Sales"].merge(initial["Stores"]).merge(initial["Items"]).head(20)
    np.testing.assert_allclose(dist_model.predict(rows), local_model.predict(rows), rtol=1e-9)
    mi_local = mutual_information_matrix(local.ring.count_tables(local.result()), SHOP_CATEGORICAL)
    mi_dist = mutual_information_matrix(ring.count_tables(dm.result()), SHOP_CATEGORICAL)
    np.testing.assert_allclose(mi_dist.to_numpy(), mi_local.to_numpy(), atol=1e-12)

    # a new driver resumes the driver's code space from the manifest: same codes, same result
    resumed = DistributedMaintainer(spark, regressor().query_, shards=4, state_dir=state)
    for v, c in codes.items():
        assert resumed.decode(v, c).tolist() == dm.decode(v, c).tolist()
    assert ring.equal(resumed.result(), dm.result(), rtol=1e-12, atol=1e-9)
    check(resumed)

    # a manifest written before roots carried their codes (format 2) is migrated from the
    # shards' snapshots; an unknown format is refused
    path = state / "manifest.pkl"
    manifest = pickle.loads(path.read_bytes())
    assert manifest["format"] == 3
    bare = {shard: pickle.loads(data)["root"] for shard, data in manifest["roots"].items()}
    old = dict(manifest, format=2, roots=bare)
    del old["codes"]
    atomic_write(str(path), pickle.dumps(old))
    migrated = DistributedMaintainer(spark, regressor().query_, shards=4, state_dir=state)
    check(migrated)
    atomic_write(str(path), pickle.dumps(dict(manifest, format=1)))
    with pytest.raises(CheckpointError, match="manifest format 1 is not supported"):
        DistributedMaintainer(spark, regressor().query_, shards=4, state_dir=state)


def _decoded_groups(result, decode) -> dict:
    return {
        group: {tuple((v, decode(v, [c])[0]) for v, c in key): m for key, m in relation.items()}
        for group, relation in result.items()
    }


def test_distributed_listing_ring_equals_local_engine(spark, shops, tmp_path, monkeypatch):
    """A grouped RelationalRing result (groups: stores; payloads list channel and region
    codes) on 4 shards equals the local engine's, decoded, after a bulk load and a stream
    with deletes; a batch whose commit fails leaves the driver's code space as it was."""
    from ringml.rings.relational import RelationalRing

    initial, chunks = shops

    def query() -> rm.Query:
        return rm.Query(SHOP_SCHEMAS, RelationalRing(listed=["channel", "region"]), free=["store"])

    local = rm.Maintainer(query())
    dm = DistributedMaintainer(spark, query(), shards=4, state_dir=tmp_path / "dist")

    def check(dm: DistributedMaintainer) -> None:
        expected = _decoded_groups(local.result(), local.decode)
        assert _decoded_groups(dm.result(), dm.decode) == expected
        assert sum(len(r) for r in expected.values()) > 20

    dm.load(initial)
    for relation, frame in initial.items():
        local.insert(relation, frame)
    assert "channel" in _clashing_codes(dm)
    check(dm)
    first, *others = chunks
    sizes = {v: len(d) for v, d in dm._dictionaries.items()}

    def fail(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as patch:  # the shards succeed, the driver's commit fails
        patch.setattr(dm, "_commit", fail)
        with pytest.raises(OSError, match="disk full"):
            dm.apply(first, batch_id=0)
    assert {v: len(d) for v, d in dm._dictionaries.items()} == sizes
    check(dm)
    for batch_id, chunk in enumerate(chunks):
        assert dm.apply(chunk, batch_id=batch_id)
        local.apply(chunk)
    check(dm)
    check(DistributedMaintainer(spark, query(), shards=4, state_dir=tmp_path / "dist"))
