"""Numerics of the generalized covariance ring (issue 9, item 3): shifted and compensated.

A continuous feature with mean 1e9 or 1e12 and sd 1, with 45% of its inserts deleted again:
variances, covariances and the continuous x categorical entries come out within 1e-9
relative of an exact (``fractions.Fraction``) computation, through the batched face and
through a Maintainer; the same computation without shifts is far off; and JoinRegressor
with categorical features matches scikit-learn (before the shifts every continuous slope
came back 0 with ``converged=True``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from exact_moments import MEANS, RTOL, Exact, assert_close, relative_error
from ringml.models import JoinRegressor
from ringml.models.regression import CovarianceRegression
from ringml.rings.categorical import GeneralizedCovarianceRing as G
from sklearn.linear_model import LinearRegression

from ringml import Maintainer, UpdateBatch, covariance_query
from ringml.query import Query


# ---------------------------------------------------------------------- batched face
def features(rng: np.random.Generator, mean: float, n: int):
    """``x`` (mean ``mean``, sd 1, shifted by category ``u``) and ``y`` correlated with it."""
    u = rng.integers(0, 5, n)
    z = rng.normal(0.0, 1.0, n)
    x = mean + (z + 0.25 * u)
    y = mean + (rng.normal(0.0, 1.0, n) - 0.5 * z)
    return x, y, u


def stream_into(ring: G, x, y, u, deleted, batch: int = 10_000):
    """Insert every row, delete ``deleted`` again, through lift/sum_by/scatter_add."""
    acc = ring.batch_accumulator(1)
    slot = np.zeros(1, dtype=np.int64)
    for sign, rows in ((1, np.arange(len(x))), (-1, deleted)):
        for start in range(0, len(rows), batch):
            at = rows[start : start + batch]
            lifted = ring.batch_lift_many(["x", "y", "u"], [x[at], y[at], u[at]])
            if sign < 0:
                lifted = ring.batch_neg(lifted)
            summed = ring.batch_sum_by(lifted, np.zeros(len(at), dtype=np.int64), 1)
            acc = ring.batch_scatter_add(acc, slot, summed)
    return ring.batch_to_list(ring.batch_take(acc, slot))[0]


@pytest.mark.parametrize("mean", MEANS)
def test_batched_face_is_exact_to_1e9_under_deletes(mean):
    rng = np.random.default_rng(int(mean) % 997)
    n = 400_000
    x, y, u = features(rng, mean, n)
    deleted = rng.permutation(n)[: int(0.45 * n)]
    keep = np.ones(n, dtype=bool)
    keep[deleted] = False
    exact = Exact({"x": x[keep], "y": y[keep]}, {"u": u[keep]})
    categories = {"u": list(range(5))}

    ring = G(["x", "y"], ["u"])
    payload = stream_into(ring, x, y, u, deleted)
    assert not np.isnan(ring.shifts[:2]).any() and ring.shifts[2] == 0.0
    stats = ring.statistics(payload, categories)
    assert stats.count == exact.count
    assert stats.variables == ("x", "y", ("u", 0), ("u", 1), ("u", 2), ("u", 3), ("u", 4))
    for p, v in enumerate("xy"):
        assert_close(stats.mean[p], exact.mean(v), f"mean {v}", rtol=1e-15)
        assert_close(stats.covariance[p, p], exact.cov(v, v), f"variance {v}")
    assert_close(stats.covariance[0, 1], exact.cov("x", "y"), "covariance x y")
    assert stats.covariance[0, 1] == stats.covariance[1, 0]
    # continuous x categorical entries: SUM(x) GROUP BY u in original units, and centred
    counts = ring.entry(payload, "u")
    for v in "xy":
        sums = ring.entry(payload, v, "u")
        for cat in range(5):
            n_cat = int((exact.codes["u"] == cat).sum())
            assert counts[cat] == n_cat
            assert_close(sums[cat], exact.category_sum(v, "u", cat), f"SUM({v}) u={cat}", 1e-15)
            want = exact.cov_onehot(v, "u", cat)
            assert_close(stats.covariance["xy".index(v), 2 + cat], want, f"cov {v}, u={cat}")
            # the category's mean minus the overall mean
            deviation = stats.covariance["xy".index(v), 2 + cat] * exact.count / n_cat
            assert_close(deviation, want * exact.count / n_cat, f"mean of {v} at u={cat}")

    # the unshifted, uncompensated ring (the textbook float formulas) is far off
    plain = G(["x", "y"], ["u"], shift=False, compensated=False)
    naive = plain.statistics(stream_into(plain, x, y, u, deleted), categories)
    assert relative_error(naive.covariance[0, 0], exact.cov("x", "x")) > 1e-3
    errors = [
        relative_error(naive.covariance[0, 2 + c], exact.cov_onehot("x", "u", c)) for c in range(5)
    ]
    assert max(errors) > 1e3 * RTOL


def test_compensated_accumulator_keeps_what_the_plain_one_loses():
    """Many small deltas into one stored payload: TwoSum keeps the dense sums exact."""
    for compensated, exact_result in ((True, True), (False, False)):
        ring = G(["x"], ["u"], shift=False, compensated=compensated)
        acc = ring.batch_accumulator(1)
        slot = np.zeros(1, dtype=np.int64)
        big = ring.batch_lift_many(["x", "u"], [np.array([2.0**53]), np.array([1])])
        acc = ring.batch_scatter_add(acc, slot, big)
        one = ring.batch_lift_many(["x", "u"], [np.array([1.0]), np.array([1])])
        for _ in range(64):
            acc = ring.batch_scatter_add(acc, slot, one)
        total = ring.batch_take(acc, slot)
        assert total.count[0] == 65
        assert (total.sums[0, 0] == 2.0**53 + 64) == exact_result
        if compensated:
            assert acc.sums_lo[0, 0] != 0.0  # the low-order part carried the ones
            assert ring.batch_is_zero(ring.batch_sub(total, ring.batch_take(acc, slot)))[0]


# ------------------------------------------------------------------------ Maintainer
def join_data(rng: np.random.Generator, mean: float, n_facts: int, n_dims: int = 200):
    dims = pd.DataFrame(
        {
            "k": np.arange(n_dims),
            "v": rng.choice(["p", "q", "r"], n_dims),
            "y": rng.normal(mean, 1.0, n_dims),
        }
    )
    u = rng.integers(0, 4, n_facts)
    facts = pd.DataFrame(
        {
            "k": rng.integers(0, n_dims, n_facts),
            "u": u,
            "x": mean + (rng.normal(0.0, 1.0, n_facts) + 0.5 * u),
        }
    )
    return facts, dims


def maintain(query: Query, facts: pd.DataFrame, dims: pd.DataFrame, deleted: np.ndarray):
    m = Maintainer(query)
    m.apply(UpdateBatch.inserts("D", dims))
    for start in range(0, len(facts), 5_000):
        m.apply(UpdateBatch.inserts("F", facts.iloc[start : start + 5_000]))
    gone = facts.iloc[deleted]
    for start in range(0, len(gone), 5_000):
        m.apply(UpdateBatch.deletes("F", gone.iloc[start : start + 5_000]))
    return m


@pytest.mark.parametrize("mean", MEANS)
def test_maintainer_over_a_join_is_exact_to_1e9_under_deletes(mean):
    rng = np.random.default_rng(7 + int(mean) % 991)
    facts, dims = join_data(rng, mean, 100_000)
    deleted = rng.permutation(len(facts))[: int(0.45 * len(facts))]
    schemas = {"F": ["k", "u", "x"], "D": ["k", "v", "y"]}
    query = covariance_query(schemas, ["x", "y", "u", "v"], ["u", "v"])
    m = maintain(query, facts, dims, deleted)
    ring, payload = query.ring, m.result()

    flat = facts.drop(index=facts.index[deleted]).merge(dims, on="k")
    exact = Exact(
        {"x": flat["x"].to_numpy(), "y": flat["y"].to_numpy()},
        {"u": flat["u"].to_numpy(), "v": flat["v"].to_numpy()},
    )
    codes = {v: sorted(ring.entry(payload, v)) for v in ("u", "v")}
    stats = ring.statistics(payload, codes)
    assert stats.count == exact.count == len(flat)
    for p, v in enumerate("xy"):
        assert_close(stats.mean[p], exact.mean(v), f"mean {v}", rtol=1e-15)
        assert_close(stats.covariance[p, p], exact.cov(v, v), f"variance {v}")
    assert_close(stats.covariance[0, 1], exact.cov("x", "y"), "covariance x y")
    column = {label: t for t, label in enumerate(stats.variables)}
    for var in ("u", "v"):
        values = m.decode(var, codes[var])
        for v in "xy":
            sums = ring.entry(payload, v, var)
            for code, value in zip(codes[var], values, strict=True):
                want = exact.category_sum(v, var, value)
                assert_close(sums[code], want, f"SUM({v}) {var}={value}", 1e-15)
                got = stats.covariance[column[v], column[(var, code)]]
                assert_close(got, exact.cov_onehot(v, var, value), f"cov {v}, {var}={value}")

    # the same stream through an unshifted, uncompensated ring
    plain = Query(query.relations, G(["x", "y"], ["u", "v"], shift=False, compensated=False))
    naive = plain.ring.statistics(maintain(plain, facts, dims, deleted).result(), codes)
    assert relative_error(naive.covariance[0, 0], exact.cov("x", "x")) > 1e-3


@pytest.mark.parametrize("free, tree", [((), "tau"), (("g",), "tau"), (("g",), "nu")])
def test_a_category_deleted_whole_leaves_no_residue_in_the_read_payload(free, tree):
    """Its SUM(X) GROUP BY entries keep the rounding residue of the deletes in the stores;
    exact counts prove them zero, so reads drop them and the statistics of the categories
    count_tables lists work (they raised: category 0 of 'c' is not in the given categories)."""
    rng = np.random.default_rng(11)
    n = 400
    rows = pd.DataFrame(
        {
            "g": rng.integers(0, 2, n),
            "c": rng.integers(0, 3, n),
            "x": rng.normal(1e3, 7.3, n),
            "y": rng.normal(-5.0, 3.1, n),
        }
    )
    query = covariance_query({"R": ["g", "c", "x", "y"]}, ["x", "y", "c"], ["c"], free=free)
    m = Maintainer(query, tree=tree)
    for start in range(0, n, 7):
        m.apply(UpdateBatch.inserts("R", rows.iloc[start : start + 7]))
    gone = rows[rows.c == 0]
    for start in range(0, len(gone), 5):
        m.apply(UpdateBatch.deletes("R", gone.iloc[start : start + 5]))
    kept = rows[rows.c != 0]
    payloads = m.result() if free else {(): m.result()}
    ring = query.ring
    assert set(payloads) == ({(g,) for g in kept.g.unique()} if free else {()})
    for group, payload in payloads.items():
        part = kept[kept.g == group[0]] if free else kept
        tables = ring.count_tables(payload)
        codes = {"c": sorted(tables[("c",)])}
        assert codes["c"] == sorted(part.c.unique())
        stats = ring.statistics(payload, codes)
        assert stats.count == len(part) and 0 not in ring.used_codes(payload)["c"]
        np.testing.assert_allclose(stats.mean[:2], part[["x", "y"]].mean(), rtol=1e-12)
        for code in codes["c"]:
            inside = part.c == code
            np.testing.assert_allclose(
                ring.entry(payload, "x", "c")[code], part.x[inside].sum(), rtol=1e-12
            )
    if not free:
        view = m.view(m.plan.views[m.plan.root].name)
        assert 0 not in ring.used_codes(next(iter(view.values())))["c"]


def test_unchecked_deletes_keep_the_entries_of_a_zero_count_category():
    """With allow_absent_deletes a zero count proves nothing: delete another row than the
    one inserted and the category's SUM(X) is real data (-1), not residue."""
    query = covariance_query({"R": ["c", "x"]}, ["x", "c"], ["c"])
    m = Maintainer(query, allow_absent_deletes=True)
    m.apply(UpdateBatch.inserts("R", pd.DataFrame({"c": [0, 1], "x": [1.0, 5.0]})))
    m.apply(UpdateBatch.deletes("R", pd.DataFrame({"c": [0], "x": [2.0]})))
    payload = m.result()
    assert query.ring.count_tables(payload)[("c",)] == {1: 1.0}
    assert query.ring.entry(payload, "x", "c") == {0: -1.0, 1: 5.0}


# ------------------------------------------------------------------------ regression
def regression_data(rng: np.random.Generator, n_facts: int = 6_000, n_stores: int = 60):
    stores = pd.DataFrame(
        {
            "store": np.arange(n_stores),
            "region": rng.choice(["north", "south", "east"], n_stores),
            "size": rng.normal(1e9, 1.0, n_stores),  # mean 1e9, sd 1
        }
    )
    facts = pd.DataFrame(
        {
            "store": rng.integers(0, n_stores, n_facts),
            "promo": rng.integers(0, 3, n_facts),
            "temp": rng.normal(20.0, 5.0, n_facts),
        }
    )
    joined = facts.merge(stores, on="store", how="left")
    effect = joined["region"].map({"north": 0.0, "south": 1.5, "east": -2.0}).to_numpy()
    facts["sales"] = (
        3.0 * (joined["size"].to_numpy() - 1e9)
        + 0.2 * joined["temp"].to_numpy()
        + effect
        + 0.5 * joined["promo"].to_numpy()
        + rng.normal(0.0, 0.1, n_facts)
    )
    return facts, stores


def design(flat: pd.DataFrame, columns) -> np.ndarray:
    """The solver's columns on the materialized join (one-hot for ``(variable, value)``)."""
    out = [
        (flat[c[0]] == c[1]).to_numpy(dtype=float) if isinstance(c, tuple) else flat[c].to_numpy()
        for c in columns
    ]
    return np.column_stack(out).astype(float)


@pytest.mark.parametrize("solver", ["bgd", "cholesky"])
def test_join_regressor_with_categorical_features_matches_sklearn(solver):
    rng = np.random.default_rng(12)
    facts, stores = regression_data(rng)
    schemas = {"F": list(facts.columns), "S": list(stores.columns)}
    features = ["size", "temp", "region", "promo"]
    categorical = ["region", "promo"]
    model = JoinRegressor(schemas, "sales", features, categorical=categorical, solver=solver)
    model.fit({"S": stores, "F": facts})
    gone = facts.sample(frac=0.45, random_state=3)
    model.delete({"F": gone})
    flat = facts.drop(index=gone.index).merge(stores, on="store")
    assert model.n_samples_seen_ == len(flat)

    assert model.result_.converged
    slopes = dict(zip(model.columns_, model.coef_, strict=True))
    assert slopes["size"] != 0.0 and slopes["temp"] != 0.0
    assert set(model.columns_) == {
        "size",
        "temp",
        ("region", "north"),
        ("region", "south"),
        ("promo", 1),
        ("promo", 2),
    }  # fmt: skip  ("east" and promo 0 are the dropped first categories)
    X = design(flat, model.columns_)
    y = flat["sales"].to_numpy()
    sk = LinearRegression().fit(X, y)
    np.testing.assert_allclose(model.coef_, sk.coef_, rtol=1e-6, atol=1e-9)
    assert abs(slopes["size"] - 3.0) < 0.05  # and the fit recovers the true slope
    # scikit-learn's own predictions on features of 1e9 are good to ~1e-5 only; on the same
    # design with size - 1e9 (an exact subtraction) it is precise, and the slopes are the same
    centred = X.copy()
    centred[:, list(model.columns_).index("size")] -= 1e9
    sk_centred = LinearRegression().fit(centred, y)
    np.testing.assert_allclose(model.coef_, sk_centred.coef_, rtol=1e-9, atol=1e-12)
    spread = float(np.std(y))
    np.testing.assert_allclose(
        model.predict(flat), sk_centred.predict(centred), rtol=0, atol=1e-6 * spread
    )


def test_without_shifts_the_continuous_slope_is_lost():
    """What JoinRegressor returned before the shifts: a slope of 0 that claims convergence."""
    rng = np.random.default_rng(12)
    facts, stores = regression_data(rng)
    schemas = {"F": list(facts.columns), "S": list(stores.columns)}
    variables = ["size", "temp", "sales"]
    slopes = {}
    for shift in (False, True):
        ring = G(variables, ["region", "promo"], shift=shift, compensated=shift)
        m = Maintainer(Query(schemas, ring))
        m.apply(UpdateBatch.inserts("S", stores))
        m.apply(UpdateBatch.inserts("F", facts))
        model = CovarianceRegression("sales", ["size", "temp", "region", "promo"])
        result = model.refresh(ring, m.result(), decode=m.decode)
        assert result.converged
        slopes[shift] = result.coefficients["size"]
    assert slopes[False] == 0.0
    assert abs(slopes[True] - 3.0) < 0.05


# ---------------------------------------------------------------------- Spark shards
@pytest.mark.spark
def test_distributed_shards_with_their_own_shifts_sum_exactly(spark, tmp_path):
    """Every shard fixes its own shifts; the driver re-centres the shard roots on its ring's
    (``reshift``) before summing, and the result is as precise as one local maintainer."""
    import pickle

    from ringml.pipelines.spark_distributed import DistributedMaintainer

    rng = np.random.default_rng(21)
    facts, dims = join_data(rng, 1e9, 6_000, n_dims=60)
    facts["x"] += 0.5 * facts["k"]
    schemas = {"F": ["k", "u", "x"], "D": ["k", "v", "y"]}
    query = covariance_query(schemas, ["x", "y", "u", "v"], ["u", "v"])
    dm = DistributedMaintainer(spark, query, shards=3, state_dir=tmp_path / "dist")
    # keys 0 and 1 reach at most two shards first: the third fixes its shift later, on
    # values with another mean and spread
    first = facts["k"] < 2
    dm.apply([UpdateBatch.inserts("D", dims), UpdateBatch.inserts("F", facts[first])])
    dm.apply(UpdateBatch.inserts("F", facts[~first]))
    gone = facts.sample(frac=0.45, random_state=4)
    dm.apply(UpdateBatch.deletes("F", gone))
    fresh = [G(["x", "y"], ["u", "v"]) for _ in dm._roots]
    for ring, blob in zip(fresh, dm._roots.values(), strict=True):
        ring.from_bytes(pickle.loads(blob)["root"])  # adopts the shard's shifts
    assert len({ring.shifts[0] for ring in fresh}) > 1

    ring, payload = dm.ring, dm.result()
    flat = facts.drop(index=gone.index).merge(dims, on="k")
    exact = Exact(
        {"x": flat["x"].to_numpy(), "y": flat["y"].to_numpy()},
        {"u": flat["u"].to_numpy(), "v": flat["v"].to_numpy()},
    )
    # (the continuous block only; the driver recodes shard categories into its own codes)
    stats = ring.statistics(payload, {v: sorted(ring.entry(payload, v)) for v in ("u", "v")})
    assert stats.count == exact.count
    for p, v in enumerate("xy"):
        assert_close(stats.mean[p], exact.mean(v), f"mean {v}", rtol=1e-15)
        assert_close(stats.covariance[p, p], exact.cov(v, v), f"variance {v}")
    assert_close(stats.covariance[0, 1], exact.cov("x", "y"), "covariance x y")
