"""Regression from covariance payloads (notes §9.1, W12): both solvers, shifts, categorical
one-hot blocks inside the solver, and agreement with scikit-learn on materialized joins
after every batch of streams with deletes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from ringml.models.regression import (
    CovarianceRegression,
    design_from_payload,
    fit_from_sigma,
)
from ringml.rings.categorical import GeneralizedCovarianceRing
from ringml.rings.covariance import CovarianceRing
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.preprocessing import OneHotEncoder

import ringml as rm
from ringml.datasets import build_stream, final_state, housing_star, natural_join

# ----------------------------------------------------------------------- W12 data
W10_S = [12, 18, 16, 19, 26]
W10_Q = [
    [16, 24, 20, 24, 34],
    [24, 38, 30, 36, 51],
    [20, 30, 28, 34, 46],
    [24, 36, 34, 43, 56],
    [34, 51, 46, 56, 78],
]
VARS = list("ABCDE")
RELS = {"R": ["A", "B"], "S": ["A", "C", "E"], "T": ["C", "D"]}
JOIN = np.array(
    [
        (1, 1, 1, 1, 1), (1, 1, 1, 1, 2), (1, 1, 2, 2, 3), (1, 1, 2, 3, 3),
        (1, 2, 1, 1, 1), (1, 2, 1, 1, 2), (1, 2, 2, 2, 3), (1, 2, 2, 3, 3),
        (2, 3, 2, 2, 4), (2, 3, 2, 3, 4),
    ],
    dtype=float,
)  # fmt: skip
W12_RIDGE = np.array([-108, 222, 111, 320, 192]) / 475  # (bias, A, B, C, D); 64/95 = 320/475


def w12_sigma() -> np.ndarray:
    sigma = np.zeros((6, 6))
    sigma[0, 0] = 10
    sigma[0, 1:] = sigma[1:, 0] = W10_S
    sigma[1:, 1:] = W10_Q
    return sigma


def fig6() -> dict[str, pd.DataFrame]:
    return {
        "R": pd.DataFrame({"A": [1, 1, 2, 3], "B": [1, 2, 3, 4]}),
        "S": pd.DataFrame({"A": [1, 1, 1, 2], "C": [1, 1, 2, 2], "E": [1, 2, 3, 4]}),
        "T": pd.DataFrame({"C": [1, 2, 2, 3], "D": [1, 2, 3, 4]}),
    }


def close(got, want, rtol=1e-8) -> None:
    """Relative to the largest coefficient (near-zero coefficients compare absolutely)."""
    got, want = np.asarray(got, float), np.asarray(want, float)
    scale = max(float(np.max(np.abs(want))), 1e-300)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


# ------------------------------------------------------------------------------ W12
@pytest.mark.parametrize("solver", ["cholesky", "bgd"])
def test_w12_ols(solver):
    r = fit_from_sigma(w12_sigma(), "E", list("ABCD"), 0.0, variables=VARS, solver=solver)
    close(np.r_[r.intercept, r.coef], [-1, 1, 0, 1.5, 0], rtol=1e-9)
    close(r.theta, [-1, 1, 0, 1.5, 0, -1], rtol=1e-9)
    assert r.converged and r.columns == tuple("ABCD") and r.label == "E"
    assert r.loss == pytest.approx(0.05, rel=1e-9)  # ½ · MSE = ½ · 1/10
    assert r.grad_norm < 1e-9 and 1 < r.condition_number < 1e3
    assert (r.iterations > 0) == (solver == "bgd")


@pytest.mark.parametrize("memory", [1, 10])
def test_w12_ridge_closed_form_and_bgd(memory):
    sigma = w12_sigma()
    closed = fit_from_sigma(sigma, "E", list("ABCD"), 0.1, variables=VARS, solver="cholesky")
    close(np.r_[closed.intercept, closed.coef], W12_RIDGE, rtol=1e-12)
    gd = fit_from_sigma(sigma, "E", list("ABCD"), 0.1, variables=VARS, armijo_memory=memory)
    close(gd.coef, closed.coef, rtol=1e-8)
    assert gd.intercept == pytest.approx(closed.intercept, rel=1e-8)
    assert gd.stop_reason == "gradient" and 0 < gd.iterations < 200
    assert gd.loss == pytest.approx(closed.loss, rel=1e-12)
    # the per-count λ is scikit-learn's Ridge(alpha = λ · n)
    sk = Ridge(alpha=0.1 * len(JOIN)).fit(JOIN[:, :4], JOIN[:, 4])
    close(closed.coef, sk.coef_, rtol=1e-10)
    assert closed.intercept == pytest.approx(sk.intercept_, rel=1e-10)


def test_w12_through_the_engine_with_shifts():
    """The engine's payload holds shifted moments; the intercept comes back in original
    units."""
    query = rm.covariance_query(RELS, features=VARS)
    m = rm.Maintainer(query)
    for name, rows in fig6().items():
        m.insert(name, rows)
    ring = query.ring
    assert np.any(ring.shifts != 0)
    model = CovarianceRegression("E", list("ABCD"), ridge=0.1)
    r = model.refresh(ring, m.result())
    close(np.r_[r.intercept, r.coef], W12_RIDGE, rtol=1e-8)
    ols = CovarianceRegression("E", list("ABCD"), solver="cholesky").refresh(ring, m.result())
    close(np.r_[ols.intercept, ols.coef], [-1, 1, 0, 1.5, 0], rtol=1e-9)


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("label,features", [("A", ["C", "E"]), ("D", None), ("B", ["E"])])
def test_any_label_and_subset(label, features, fit_intercept):
    cols = {v: j for j, v in enumerate(VARS)}
    feats = [v for v in VARS if v != label] if features is None else features
    sk = LinearRegression(fit_intercept=fit_intercept).fit(
        JOIN[:, [cols[v] for v in feats]], JOIN[:, cols[label]]
    )
    for solver in ("cholesky", "bgd"):
        r = fit_from_sigma(
            w12_sigma(), label, features, variables=VARS, fit_intercept=fit_intercept,
            solver=solver,
        )  # fmt: skip
        assert r.columns == tuple(feats)
        close(r.coef, sk.coef_, rtol=1e-8)
        assert r.intercept == pytest.approx(sk.intercept_, rel=1e-8, abs=1e-8)


def test_positions_instead_of_names():
    by_name = fit_from_sigma(w12_sigma(), "E", list("ABCD"), 0.1, variables=VARS)
    by_pos = fit_from_sigma(w12_sigma(), 4, [0, 1, 2, 3], 0.1)
    close(by_pos.coef, by_name.coef, rtol=1e-12)


# ------------------------------------------------------------------- numerics
@pytest.mark.parametrize("fit_intercept,offset", [(True, 1e6), (False, 1e2)])
def test_large_offsets_shift_undone(fit_intercept, offset):
    """Features around 1e6 with unit spread: the ring's shift keeps Σ well conditioned and
    the intercept is returned in original units.  (Without an intercept the problem itself
    is ill-conditioned at such offsets — κ(X) ≈ offset — so that case uses a small one.)"""
    rng = np.random.default_rng(0)
    X = rng.normal(0, 1, (500, 3)) + np.array([1.0, -0.3, 42e-6]) * offset
    y = X @ [2.0, -1.0, 0.5] + 7.0 + rng.normal(0, 0.1, 500)
    ring = CovarianceRing(["a", "b", "c", "y"])
    payload = ring.batch_sum(ring.batch_lift_block(ring.variables, np.column_stack([X, y])))
    sk = LinearRegression(fit_intercept=fit_intercept).fit(X, y)
    for solver in ("cholesky", "bgd"):
        model = CovarianceRegression("y", fit_intercept=fit_intercept, solver=solver)
        r = model.refresh(ring, payload)
        close(r.coef, sk.coef_, rtol=1e-6)
        assert r.intercept == pytest.approx(sk.intercept_, rel=1e-6, abs=1e-6)
        np.testing.assert_allclose(model.predict(pd.DataFrame(X, columns=list("abc"))),
                                   sk.predict(X), rtol=1e-9)  # fmt: skip


def test_constant_feature_gets_zero_like_sklearn():
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.normal(size=50), np.full(50, 3.25), rng.normal(size=50)])
    y = X[:, 0] - 2 * X[:, 2] + 1
    sigma = np.ones((5, 5))
    Z = np.column_stack([np.ones(50), X, y])
    sigma = Z.T @ Z
    sk = LinearRegression().fit(X, y)
    for solver in ("cholesky", "bgd"):
        r = fit_from_sigma(sigma, 3, [0, 1, 2], solver=solver)
        assert r.coef[1] == 0.0
        close(r.coef, sk.coef_, rtol=1e-9)
        assert r.intercept == pytest.approx(sk.intercept_, rel=1e-9)


def test_rank_deficient_cholesky_is_sklearn_min_norm():
    rng = np.random.default_rng(2)
    a = rng.normal(size=40)
    X = np.column_stack([a, 2 * a, rng.normal(size=40)])  # x1 = 2·x0
    y = 3 * a + X[:, 2]
    Z = np.column_stack([np.ones(40), X, y])
    r = fit_from_sigma(Z.T @ Z, 3, [0, 1, 2], solver="cholesky")
    assert r.rank_deficient and r.condition_number == np.inf
    close(r.coef, LinearRegression().fit(X, y).coef_, rtol=1e-8)
    gd = fit_from_sigma(Z.T @ Z, 3, [0, 1, 2])  # some minimizer: same fitted values
    np.testing.assert_allclose(X @ gd.coef + gd.intercept, y, atol=1e-7)


def test_warm_start_needs_fewer_iterations():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2000, 6)) @ rng.normal(size=(6, 6))
    y = X @ rng.normal(size=6) + rng.normal(size=2000)
    ring = CovarianceRing([f"x{j}" for j in range(6)] + ["y"])
    lift = lambda rows: ring.batch_sum(  # noqa: E731
        ring.batch_lift_block(ring.variables, np.column_stack([X[rows], y[rows]]))
    )
    warm = CovarianceRegression("y")
    cold = CovarianceRegression("y", warm_start=False)
    payload = lift(slice(0, 1000))
    for model in (warm, cold):
        model.refresh(ring, payload)
    # unchanged payload: the warm model is already converged
    assert warm.refresh(ring, payload).iterations == 0
    assert cold.refresh(ring, payload).iterations > 0
    for start in range(1000, 2000, 100):
        payload = ring.add(payload, lift(slice(start, start + 100)))
        w, c = warm.refresh(ring, payload), cold.refresh(ring, payload)
        close(w.coef, c.coef, rtol=1e-8)
    assert warm.total_iterations < cold.total_iterations
    assert len(warm.history) == 12


# ------------------------------------------------------------------------- errors
def test_bad_arguments():
    sigma = w12_sigma()
    with pytest.raises(ValueError, match="not among the maintained variables"):
        fit_from_sigma(sigma, "Z", ["A"], variables=VARS)
    with pytest.raises(ValueError, match="feature 'Q'"):
        fit_from_sigma(sigma, "E", ["Q"], variables=VARS)
    with pytest.raises(ValueError, match="cannot also be a feature"):
        fit_from_sigma(sigma, "E", ["A", "E"], variables=VARS)
    with pytest.raises(ValueError, match="ridge"):
        fit_from_sigma(sigma, "E", ["A"], -1.0, variables=VARS)
    with pytest.raises(ValueError, match="solver"):
        fit_from_sigma(sigma, "E", ["A"], variables=VARS, solver="newton")
    empty = sigma.copy()
    empty[0, 0] = 0
    with pytest.raises(ValueError, match="0 rows"):
        fit_from_sigma(empty, "E", ["A"], variables=VARS)
    bad = sigma.copy()
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fit_from_sigma(bad, "E", ["A"], variables=VARS)
    ring = CovarianceRing(VARS)
    payload = ring.batch_sum(ring.batch_lift_block(VARS, JOIN))
    with pytest.raises(ValueError, match="not among the maintained variables"):
        design_from_payload(ring, payload, "price")
    gring = GeneralizedCovarianceRing(["A", "B"], ["C"])
    with pytest.raises(ValueError, match="categorical"):
        design_from_payload(gring, gring.one(), "C")


# ------------------------------------------------- streams with deletes vs sklearn
HOUSING_FEATURES = [
    "livingarea", "kitchensize", "garden", "nbbedrooms", "parking", "openinghoursshop",
    "sizeinstitution", "averagesalary",
]  # fmt: skip


def join_of(stream, schemas) -> pd.DataFrame:
    """The materialized join of the database a stream prefix leaves (empty relations for
    relations it has not touched yet)."""
    db = final_state(stream)
    return natural_join({r: db.get(r, pd.DataFrame(columns=c)) for r, c in schemas.items()})


def _sk_check(join: pd.DataFrame, label: str, feats: list[str], result, ridge: float) -> bool:
    """Compare with scikit-learn; returns whether coefficients were compared (full rank)."""
    X, y = join[feats].to_numpy(float), join[label].to_numpy(float)
    sk = (Ridge(alpha=ridge * len(join)) if ridge else LinearRegression()).fit(X, y)
    pred = X @ result.coef + result.intercept
    np.testing.assert_allclose(pred, sk.predict(X), rtol=1e-7, atol=1e-7 * np.abs(y).max())
    if ridge == 0 and np.linalg.matrix_rank(np.column_stack([np.ones(len(X)), X])) <= len(feats):
        return False
    close(result.coef, sk.coef_, rtol=1e-6)
    assert result.intercept == pytest.approx(sk.intercept_, rel=1e-6, abs=1e-6 * abs(y).max())
    return True


def test_housing_stream_with_deletes_matches_sklearn_after_every_batch():
    ds = housing_star(postcodes=8, seed=4)
    stream = build_stream(ds.relations, batch_size=12, delete_fraction=0.2, seed=5)
    assert any(b.n_deletes for b in stream)
    schemas = ds.schemas
    query = rm.covariance_query(schemas)  # all 26 non-join variables
    m = rm.Maintainer(query)
    models = {
        ("price", 0.0): CovarianceRegression("price", HOUSING_FEATURES),
        ("price", 0.05): CovarianceRegression("price", HOUSING_FEATURES, ridge=0.05),
        ("livingarea", 0.0): CovarianceRegression(
            "livingarea", ["price", "kitchensize", "nbbathrooms"], solver="cholesky"
        ),
    }
    compared = 0
    for i, batch in enumerate(stream):
        m.apply(rm.UpdateBatch(batch.relation, batch.rows, batch.multiplicity))
        payload = m.result()
        if payload.count < 30:
            continue
        join = join_of(stream[: i + 1], schemas)
        assert len(join) == payload.count
        for (label, ridge), model in models.items():
            result = model.refresh(query.ring, payload)
            compared += _sk_check(join, label, list(result.columns), result, ridge)
    assert compared >= 20
    assert models[("price", 0.0)].total_iterations > 0


def _categorical_star(seed: int = 0):
    rng = np.random.default_rng(seed)
    stores = pd.DataFrame(
        {
            "store": np.arange(12),
            "size": rng.uniform(100, 900, 12).round(1),
            "region": rng.choice(["north", "south", "east"], 12),
        }
    )
    items = pd.DataFrame(
        {
            "item": np.arange(30),
            "price": rng.lognormal(1.0, 0.4, 30).round(2),
            "family": rng.choice(["food", "drink", "home", "toys"], 30),
        }
    )
    n = 400
    sales = pd.DataFrame(
        {
            "store": rng.integers(0, 12, n),
            "item": rng.integers(0, 30, n),
            "promo": rng.integers(0, 3, n),
            "units": rng.poisson(4.0, n).astype(float),
        }
    )
    relations = {"Sales": sales, "Stores": stores, "Items": items}
    return relations, {r: list(df.columns) for r, df in relations.items()}


@pytest.mark.parametrize("ridge,drop", [(0.0, "first"), (0.02, "first"), (0.02, None)])
def test_categorical_join_stream_matches_sklearn_one_hot(ridge, drop):
    relations, schemas = _categorical_star()
    features = ["size", "price", "region", "family", "promo"]
    categorical = ["region", "family", "promo"]
    stream = build_stream(relations, batch_size=40, delete_fraction=0.2, seed=1)
    query = rm.covariance_query(schemas, features + ["units"], categorical)
    m = rm.Maintainer(query)
    model = CovarianceRegression("units", features, ridge=ridge, drop=drop)
    compared = 0
    for i, batch in enumerate(stream):
        m.apply(rm.UpdateBatch(batch.relation, batch.rows, batch.multiplicity))
        payload = m.result()
        if payload.count < 60:
            continue
        result = model.refresh(query.ring, payload, decode=m.decode)
        join = join_of(stream[: i + 1], schemas)
        enc = OneHotEncoder(drop=drop, sparse_output=False).fit(join[categorical])
        X = np.hstack([join[["size", "price"]].to_numpy(float), enc.transform(join[categorical])])
        y = join["units"].to_numpy(float)
        names = ["size", "price"] + [
            (v, c)
            for v, cats in zip(categorical, enc.categories_, strict=True)
            for c in (cats[1:] if drop else cats)
        ]
        assert list(result.columns) == names  # categories present, sorted, first dropped
        sk = (Ridge(alpha=ridge * len(join)) if ridge else LinearRegression()).fit(X, y)
        np.testing.assert_allclose(model.predict(join), sk.predict(X), rtol=1e-7, atol=1e-7)
        if ridge == 0 and np.linalg.matrix_rank(np.column_stack([np.ones(len(X)), X])) <= len(
            names
        ):
            continue
        close(result.coef, sk.coef_, rtol=1e-6)
        assert result.intercept == pytest.approx(sk.intercept_, rel=1e-6, abs=1e-6)
        compared += 1
    assert compared >= 5


def test_w12_reference_stopping_rules_stop_early():
    """The reference's rules stop W12 close to, not at, the minimizer (notes §13 W12)."""
    r = fit_from_sigma(w12_sigma(), "E", list("ABCD"), 0.1, variables=VARS, stopping="reference")
    assert r.stop_reason.startswith("reference")
    np.testing.assert_allclose(np.r_[r.intercept, r.coef], W12_RIDGE, atol=5e-3)
    tight = fit_from_sigma(w12_sigma(), "E", list("ABCD"), 0.1, variables=VARS)
    assert r.iterations < tight.iterations
    with pytest.raises(ValueError, match="stopping"):
        fit_from_sigma(w12_sigma(), "E", ["A"], variables=VARS, stopping="loose")
