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
    gd = fit_from_sigma(Z.T @ Z, 3, [0, 1, 2])
    np.testing.assert_allclose(X @ gd.coef + gd.intercept, y, atol=1e-7)
    # BGD too returns the minimum-norm minimizer, from any start (a warm start used to
    # leave it at the minimizer nearest that start)
    close(gd.coef, r.coef, rtol=1e-7)
    warm = fit_from_sigma(Z.T @ Z, 3, [0, 1, 2], theta0=np.array([5.0, -1.0, 2.0]))
    close(warm.coef, r.coef, rtol=1e-7)


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


def test_unchanged_payload_skips_the_solver_only_after_convergence():
    X, y = _correlated()
    ring = CovarianceRing([f"x{j}" for j in range(X.shape[1])] + ["y"])
    payload = ring.batch_sum(ring.batch_lift_block(ring.variables, np.column_stack([X, y])))
    model = CovarianceRegression("y", max_iter=2)
    first = model.refresh(ring, payload)
    assert not first.converged
    model.max_iter = 10_000
    second = model.refresh(ring, payload)  # same Σ, but the last fit had not converged
    assert second.iterations > 0 and second.converged
    third = model.refresh(ring, payload)  # same Σ, converged: the fit stands
    assert third.iterations == 0 and third.converged
    np.testing.assert_array_equal(third.coef, second.coef)
    assert third.intercept == second.intercept
    assert model.total_iterations == first.iterations + second.iterations


@pytest.mark.parametrize("solver", ["bgd", "cholesky"])
def test_changed_parameters_refit_an_unchanged_payload(solver):
    """Setting ridge, fit_intercept or solver between refreshes of the same Σ refits: the
    converged result of the old parameters was handed back (ridge 0 after ridge=5)."""
    X, y = _correlated(n=200, k=3)
    ring = CovarianceRing(["x0", "x1", "x2", "y"])
    payload = ring.batch_sum(ring.batch_lift_block(ring.variables, np.column_stack([X, y])))
    model = CovarianceRegression("y", solver=solver)
    model.refresh(ring, payload)
    model.ridge = 5.0
    ridged = model.refresh(ring, payload)
    sk = Ridge(alpha=5.0 * len(y)).fit(X, y)
    assert ridged.ridge == 5.0
    close(ridged.coef, sk.coef_, rtol=1e-7)
    model.fit_intercept, model.ridge = False, 0.0
    through_origin = model.refresh(ring, payload)
    sk = LinearRegression(fit_intercept=False).fit(X, y)
    assert through_origin.intercept == 0.0
    close(through_origin.coef, sk.coef_, rtol=1e-7)
    model.solver = "cholesky" if solver == "bgd" else "bgd"
    assert model.refresh(ring, payload).solver == model.solver


def _correlated(seed: int = 7, n: int = 3000, k: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k)) @ rng.normal(size=(k, k))
    return X, X @ rng.normal(size=k) + 3.0 * rng.normal(size=n)


def _sigma_of(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    Z = np.column_stack([np.ones(len(y)), X, y])
    return Z.T @ Z


@pytest.mark.parametrize("ridge", [0.0, 0.1])
def test_stopping_rule_does_not_scale_with_count_or_label_units(ridge):
    """Repeating every row or changing the label's units leaves the BGD run unchanged: the
    rule bounds the relative error of standardized coefficients, so a larger count or a
    larger loss asks for no extra iterations.  (Powers of two keep the arithmetic exact.)"""
    X, y = _correlated()
    k = X.shape[1]
    base = fit_from_sigma(_sigma_of(X, y), k, list(range(k)), ridge)
    assert base.stop_reason == "gradient" and base.iterations > 20
    more = fit_from_sigma(4.0 * _sigma_of(X, y), k, list(range(k)), ridge)
    assert more.iterations == base.iterations
    np.testing.assert_array_equal(more.coef, base.coef)
    pounds = fit_from_sigma(_sigma_of(X, 1024.0 * y), k, list(range(k)), ridge)
    assert pounds.iterations == base.iterations
    np.testing.assert_array_equal(pounds.coef, 1024.0 * base.coef)
    if ridge == 0.0:  # (a ridge penalizes coefficients in the features' units)
        Xs = X.copy()
        Xs[:, 2] *= 2.0**-6
        grams = fit_from_sigma(_sigma_of(Xs, y), k, list(range(k)), ridge)
        assert grams.iterations == base.iterations
        want = base.coef.copy()
        want[2] *= 64.0
        np.testing.assert_array_equal(grams.coef, want)


@pytest.mark.parametrize("ridge", [0.0, 0.1])
def test_jacobi_scaling_makes_feature_units_irrelevant(ridge):
    """Features spanning ten orders of magnitude: the system the solvers see has a unit
    diagonal (variance + λ), so its condition number is that of the correlations; BGD
    matches Cholesky and scikit-learn.  Scaling by the variance alone left λ/var on the
    diagonal (κ ≈ 5e6 here with λ = 0.1)."""
    X, y = _correlated()
    n, k = X.shape
    units = np.array([1e-4, 3e-2, 1.0, 7.0, 1e3, 1e5, 3e6, 0.5])
    Xs = X * units
    gd = fit_from_sigma(_sigma_of(Xs, y), k, list(range(k)), ridge)
    exact = fit_from_sigma(_sigma_of(Xs, y), k, list(range(k)), ridge, solver="cholesky")
    assert gd.stop_reason == "gradient" and gd.condition_number < 300
    # compare coefficients per unit-scaled feature, so the tiny ones count too
    np.testing.assert_allclose(gd.coef * units, exact.coef * units, rtol=1e-8)
    sk = Ridge(alpha=ridge * n, solver="svd").fit(Xs, y)
    np.testing.assert_allclose(gd.coef * units, sk.coef_ * units, rtol=1e-6)
    assert gd.intercept == pytest.approx(sk.intercept_, rel=1e-6)
    if ridge == 0.0:  # OLS does not depend on the units at all
        plain = fit_from_sigma(_sigma_of(X, y), k, list(range(k)))
        np.testing.assert_allclose(gd.coef * units, plain.coef, rtol=1e-7)
        assert gd.condition_number == pytest.approx(plain.condition_number, rel=1e-6)


def test_warm_start_cost_grows_with_how_far_the_minimizer_moved():
    """BGD converges linearly, so a warm start at relative distance δ from the new minimizer
    costs about ln(δ/tol)/ln(1/tol) of a cold solve: little after a tiny update, nearly a
    cold solve when the update moves the solution by a percent (as the batches of the
    benchmark's Housing stream do, benchmarks/models.py).  Both reach the closed form either
    way.  Summed over 8 updates, because single BB runs vary by ±30%."""
    X, y = _correlated()
    k = X.shape[1]
    sigma = _sigma_of(X, y)
    old = fit_from_sigma(sigma, k, list(range(k)))
    rows = np.column_stack([np.ones(8), X[:8], y[:8] + 50.0])  # rows off the fitted plane
    costs = []
    for w in (1e-9, 1e-5, 1e-1):  # moves the minimizer by δ ≈ 1e-10, 1e-6, 1e-2
        warm_total = cold_total = 0
        for z in rows:
            new = sigma + w * np.outer(z, z)
            exact = fit_from_sigma(new, k, list(range(k)), solver="cholesky")
            cold = fit_from_sigma(new, k, list(range(k)))
            warm = fit_from_sigma(new, k, list(range(k)), theta0=old.coef, step0=old.step)
            for r in (cold, warm):
                assert r.stop_reason == "gradient"
                close(r.coef, exact.coef, rtol=1e-8)
            warm_total += warm.iterations
            cold_total += cold.iterations
        costs.append((warm_total, cold_total))
    (w0, c0), (w1, _), (w2, c2) = costs
    assert 0 < w0 <= 0.15 * c0  # the model: ≈ 0.0
    assert w0 < w1 < w2  # the model: ≈ 0.4 of a cold solve, then ≈ 0.8
    assert w2 >= 0.5 * c2


def test_housing_stream_warm_and_scratch_reach_the_closed_form_every_refresh():
    """The benchmark's comparison in small: warm and scratch run the same solver and rule
    and both land within 1e-6 of Cholesky after every batch; a batch that leaves Σ unchanged
    (its tuples join nothing yet) costs the warm model no iteration."""
    ds = housing_star(postcodes=30, seed=2)
    stream = build_stream(ds.relations, batch_size=50, seed=3)
    query = rm.covariance_query(ds.schemas)
    m = rm.Maintainer(query)
    warm = CovarianceRegression("price", ridge=0.1)
    scratch = CovarianceRegression("price", ridge=0.1, warm_start=False)
    exact = CovarianceRegression("price", ridge=0.1, solver="cholesky")
    previous, unchanged = None, 0
    for batch in stream:
        m.apply(rm.UpdateBatch(batch.relation, batch.rows, batch.multiplicity))
        payload = m.result()
        if payload.count <= 0:
            continue
        w, s = warm.refresh(query.ring, payload), scratch.refresh(query.ring, payload)
        want = exact.refresh(query.ring, payload).coef
        for r in (w, s):
            assert r.converged
            assert np.max(np.abs(r.coef - want)) <= 1e-6 * np.max(np.abs(want))
        same = previous is not None and np.array_equal(previous, exact.design.sigma)
        previous = exact.design.sigma
        unchanged += same
        assert (w.iterations == 0) == same and s.iterations > 0
    assert unchanged >= 3
    assert warm.total_iterations < scratch.total_iterations


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
