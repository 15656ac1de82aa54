"""The distributed driver's code space, without Spark: shards are local maintainers whose
dictionaries number categories in their own order; their roots (as the executors ship them)
are committed with the driver's ``_accept``, and the result, decoded, must equal one local
maintainer over all the rows, through restarts and a failed commit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from ringml.rings.relational import RelationalRing

import ringml as rm
from ringml.encoding import Dictionary

pytest.importorskip("pyarrow")

from ringml.pipelines.spark_distributed import (  # noqa: E402
    DistributedMaintainer,
    _root_bytes,
)

SCHEMAS = {"R": ["k", "x", "c"], "S": ["k", "d"]}
POOL = [f"cat-{i:02d}" for i in range(14)]


def covariance() -> rm.Query:
    return rm.covariance_query(SCHEMAS, ["x", "c", "d"], ["c", "d"])


def listing() -> rm.Query:
    return rm.Query(SCHEMAS, RelationalRing(listed=["c", "d"]), free=["k"])


def batches(seed: int) -> list[tuple[int, rm.UpdateBatch]]:
    """(shard, batch) pairs over 3 shards; batch i draws categories from POOL[: 4 + 2i],
    so every commit brings new values, in another order on every shard."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(5):
        for shard in range(3):
            keys = shard + 3 * rng.integers(0, 4, 6)  # k % 3 is the shard
            pool = POOL[: 4 + 2 * i]
            r = pd.DataFrame(
                {"k": keys, "x": rng.integers(-5, 9, 6).astype(float), "c": rng.choice(pool, 6)}
            )
            s = pd.DataFrame({"k": keys[:3], "d": rng.choice(pool[::-1], 3)})
            out += [
                (shard, rm.UpdateBatch.inserts("R", r)),
                (shard, rm.UpdateBatch.inserts("S", s)),
            ]
    return out


def decoded(query: rm.Query, result, decode) -> dict:
    """Every entry of a result with codes replaced by their values."""
    ring = query.ring
    if query.free:
        return {
            group: {tuple((v, decode(v, [c])[0]) for v, c in key): m for key, m in rel.items()}
            for group, rel in result.items()
        }
    out = {}
    for i, vi in enumerate(ring.variables):
        for vj in [None, *ring.variables[i:]]:
            entry = ring.entry(result, vi, vj)
            if isinstance(entry, dict) and entry:
                keys = list(entry)
                if isinstance(keys[0], tuple):
                    first = decode(vi, [k[0] for k in keys])
                    second = decode(vj, [k[1] for k in keys])
                    entry = dict(zip(zip(first, second, strict=True), entry.values(), strict=True))
                else:
                    var = vi if vj is None or ring.is_categorical(vi) else vj
                    entry = dict(zip(decode(var, keys), entry.values(), strict=True))
            out[(vi, vj)] = entry
    return out


@pytest.mark.parametrize("make_query", [covariance, listing])
def test_driver_code_space_survives_restarts_and_failed_commits(make_query, tmp_path):
    state = tmp_path / "state"
    dm = DistributedMaintainer(None, make_query(), shards=3, state_dir=state)
    shards = [rm.Maintainer(make_query()) for _ in range(3)]  # one ring each, as executors
    local = rm.Maintainer(make_query())
    seq = 0
    work = batches(seed=3)
    for start in range(0, len(work), 6):  # one commit per round of the 3 shards
        touched = set()
        for shard, batch in work[start : start + 6]:
            shards[shard].apply([batch])
            local.apply([batch])
            touched.add(shard)
        seq += 1
        dm._accept(seq, {s: _root_bytes(shards[s], bool(dm.query.free)) for s in touched}, seq)
        assert decoded(dm.query, dm.result(), dm.decode) == decoded(
            local.query, local.result(), local.decode
        )
    expected = decoded(local.query, local.result(), local.decode)
    # shards gave one code to different values: without the recode the sum is wrong
    assert any(
        not np.array_equal(a.decode(v, np.arange(4)), b.decode(v, np.arange(4)))
        for a, b in [(shards[0], shards[1]), (shards[1], shards[2])]
        for v in ("c", "d")
    )
    codes = {v: np.arange(len(dm._dictionaries[v])) for v in ("c", "d")}
    values = {v: dm.decode(v, c).tolist() for v, c in codes.items()}
    assert sorted(values["c"]) == sorted(set(values["c"]))  # each value once
    # the code space grew in chunks a single encode would number otherwise: a restart must
    # replay them to give every value its code back
    replayed = {v: Dictionary(v).encode(np.asarray(values[v], dtype=object)) for v in codes}
    assert any(replayed[v].tolist() != codes[v].tolist() for v in codes)
    resumed = DistributedMaintainer(None, make_query(), shards=3, state_dir=state)
    assert {v: resumed.decode(v, c).tolist() for v, c in codes.items()} == values
    assert decoded(resumed.query, resumed.result(), resumed.decode) == expected

    # a commit that fails after the shards succeeded leaves the code space as committed
    extra = pd.DataFrame({"k": [1], "x": [2.0], "c": ["brand-new"]})
    shards[1].apply([rm.UpdateBatch.inserts("R", extra)])

    def fail(*args, **kwargs):
        raise OSError("disk full")

    resumed._commit = fail
    with pytest.raises(OSError, match="disk full"):
        resumed._accept(seq + 1, {1: _root_bytes(shards[1], bool(dm.query.free))}, seq + 1)
    assert {v: resumed.decode(v, c).tolist() for v, c in codes.items()} == values
    assert {v: len(d) for v, d in resumed._dictionaries.items()} == {
        v: len(c) for v, c in codes.items()
    }
    assert decoded(resumed.query, resumed.result(), resumed.decode) == expected
    del resumed._commit
    resumed._accept(seq + 1, {1: _root_bytes(shards[1], bool(dm.query.free))}, seq + 1)
    local.insert("R", extra)
    assert resumed.decode("c", [len(codes["c"])]).tolist() == ["brand-new"]
    assert decoded(resumed.query, resumed.result(), resumed.decode) == decoded(
        local.query, local.result(), local.decode
    )
    with pytest.raises(KeyError, match="'x' has no codes"):
        resumed.decode("x", [0])


def test_routing_sends_keys_the_engine_joins_to_one_shard():
    """The key of a relation routed as Arrow hands it over: an int64 column, a decimal128
    (Python Decimals), an object column of Python ints, floats and bools, or mixed with text.
    Decimals and object numbers were hashed by their text, so int 3 and Decimal("3")
    met on different shards and the distributed join lost their tuples."""
    import decimal

    import pyarrow as pa
    from ringml.pipelines.spark_distributed import _shard_of_values, _split_batch

    keys = [0, 1, 2, 3, -7, 2**53, 2**62 + 1, 10**6]
    as_int = np.array(keys, dtype=np.int64)
    as_float = as_int.astype(np.float64)
    as_decimal = pa.array([decimal.Decimal(k) for k in keys]).to_numpy(zero_copy_only=False)
    as_objects = np.array(keys, dtype=object)
    mixed = np.array(keys + ["a", 2**70], dtype=object)
    for shards in (2, 3, 7):
        want = _shard_of_values(as_int, shards)
        for other in (as_float, as_decimal, as_objects, mixed[: len(keys)]):
            assert _shard_of_values(other, shards).tolist() == want.tolist(), (shards, other)
        assert _shard_of_values(mixed, shards)[: len(keys)].tolist() == want.tolist()
        assert (
            _shard_of_values(np.array([True, 1.5, decimal.Decimal("1.5")], object), shards)[
                1:
            ].tolist()
            == [_shard_of_values(np.array([1.5]), shards)[0]] * 2
        )
        assert _shard_of_values(np.array([-0.0, 0.0]), shards).tolist() == [want[0]] * 2
    # a batch split by a decimal128 key column: each shard holds the int-routed keys
    batch = pa.RecordBatch.from_pydict({"k": pa.array([decimal.Decimal(k) for k in keys])})
    for shard, part in _split_batch(batch, "k", 3):
        got = [int(v) for v in part.column("k").to_pylist()]
        assert all(_shard_of_values(np.array([v]), 3)[0] == shard for v in got)


def test_equal_instants_and_durations_of_any_unit_share_a_shard():
    """Keys the engine joins as one (an instant or a duration, whatever its unit or
    container) must reach one shard: nanosecond datetime64 columns (pandas' default) were
    hashed as plain ints and Spark's microsecond ones as datetime objects, so a join of a
    pandas frame with a Spark or parquet one silently lost its matches."""
    from ringml.pipelines.spark_distributed import _shard_of_values, _split_batch

    rng = np.random.default_rng(5)
    micros = rng.integers(0, 2**52, 40) * 1000  # whole microseconds, as nanoseconds
    ns = micros.astype("datetime64[ns]")
    forms = {
        "ns": ns,
        "us": ns.astype("datetime64[us]"),
        "Timestamp": np.array(list(pd.DatetimeIndex(ns)), dtype=object),
        "datetime": np.array(pd.DatetimeIndex(ns).to_pydatetime(), dtype=object),
    }
    spans = micros.astype("timedelta64[ns]")
    durations = {
        "ns": spans,
        "us": spans.astype("timedelta64[us]"),
        "Timedelta": np.array(list(pd.TimedeltaIndex(spans)), dtype=object),
        "timedelta": np.array(pd.TimedeltaIndex(spans).to_pytimedelta(), dtype=object),
    }
    for group in (forms, durations):
        dictionary = Dictionary("t")  # the engine's own verdict: every form is one key
        assert len({tuple(dictionary.encode(v)) for v in group.values()}) == 1
        for shards in (3, 7):
            routed = {name: _shard_of_values(v, shards).tolist() for name, v in group.items()}
            assert len({tuple(r) for r in routed.values()}) == 1, routed
    import pyarrow as pa

    want = dict(zip(micros.tolist(), _shard_of_values(ns, 5).tolist(), strict=True))
    for unit in ("ns", "us"):  # Arrow batches, as the packers split them
        batch = pa.RecordBatch.from_pydict({"k": pa.array(ns, pa.timestamp(unit))})
        for shard, part in _split_batch(batch, "k", 5):
            got = part.column("k").cast(pa.timestamp("ns")).to_numpy().view(np.int64)
            assert {want[int(v)] for v in got} == {shard}, unit


def test_sub_microsecond_instants_and_numpy_scalars_in_object_columns_share_a_shard():
    """Nanosecond instants and durations (negative ones too) held as pandas or numpy
    scalars in an object column reach the shard of their datetime64/timedelta64 column
    (they were hashed by their text, which keeps the nanoseconds the column's route cuts;
    a numpy timedelta64 in an object column raised TypeError)."""
    from ringml.pipelines.spark_distributed import _shard_of_values

    rng = np.random.default_rng(6)
    ns = rng.integers(-(2**61), 2**61, 40)
    ns[:4] = [-1, 1, -999, 1001]  # either side of the epoch / of zero, under a microsecond
    instants, spans = ns.astype("datetime64[ns]"), ns.astype("timedelta64[ns]")
    groups = (
        {
            "column": instants,
            "Timestamp": np.array(list(pd.DatetimeIndex(instants)), dtype=object),
            "datetime64": np.array(list(instants), dtype=object),
        },
        {
            "column": spans,
            "Timedelta": np.array(list(pd.TimedeltaIndex(spans)), dtype=object),
            "timedelta64": np.array(list(spans), dtype=object),
        },
    )
    for group in groups:
        dictionary = Dictionary("t")  # the engine's own verdict: every form is one key
        assert len({tuple(dictionary.encode(v)) for v in group.values()}) == 1
        for shards in (3, 7, 1000003):
            routed = {name: _shard_of_values(v, shards).tolist() for name, v in group.items()}
            assert len({tuple(r) for r in routed.values()}) == 1, routed
