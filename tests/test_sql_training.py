"""Training data in SQL: JoinRegressor, JoinChowLiu and the covariance query take their join as
a SELECT of feature columns FROM a join WHERE ...; the models equal scikit-learn fitted on the
join DuckDB materializes from the same SQL, through inserts and deletes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from ringml.models import JoinChowLiu, JoinRegressor
from sklearn.linear_model import LinearRegression
from sklearn.metrics import mutual_info_score
from sql_oracle import duckdb_rows

import ringml
from ringml import BatchError, UpdateBatch
from ringml.datasets import housing_star
from ringml.sql import Catalog, SqlNameError, SqlTypeError, SqlUnsupportedError
from ringml.sql.training import training_join

TRAINING = """
SELECT price, livingarea, nbbedrooms, kitchensize, openinghoursshop AS shophours,
       averagesalary
FROM House JOIN Shop USING (postcode) JOIN Demographics d ON d.postcode = House.postcode
WHERE House.price > 150000 AND (Shop.tesco = 1 OR Shop.ms = 1)
"""
FEATURES = ["livingarea", "nbbedrooms", "kitchensize", "shophours", "averagesalary"]


@pytest.fixture(scope="module")
def housing():
    data = housing_star(postcodes=40, seed=3)
    tables = {t: data.relations[t] for t in ("House", "Shop", "Demographics")}
    catalog = Catalog(
        {
            name: {c: ("DOUBLE" if f[c].dtype.kind == "f" else "INTEGER") for c in f.columns}
            for name, f in tables.items()
        }
    )
    return tables, catalog


def sklearn_fit(tables) -> LinearRegression:
    join = duckdb_rows(TRAINING, tables)
    return LinearRegression().fit(join[FEATURES], join["price"]), len(join)


def test_join_regressor_from_sql_equals_sklearn_through_inserts_and_deletes(housing):
    tables, catalog = housing
    model = JoinRegressor(TRAINING, "price", solver="cholesky", catalog=catalog)
    half = {t: f.iloc[: len(f) // 2] for t, f in tables.items()}
    model.fit(half)
    model.partial_fit({t: f.iloc[len(f) // 2 :] for t, f in tables.items()})
    assert model.features_ == tuple(FEATURES)
    oracle, n = sklearn_fit(tables)
    assert model.n_samples_seen_ == n > 100
    np.testing.assert_allclose(model.coef_, oracle.coef_, rtol=1e-6)
    np.testing.assert_allclose(model.intercept_, oracle.intercept_, rtol=1e-6)

    gone = tables["House"].iloc[::3]
    model.delete({"House": gone})
    remaining = {**tables, "House": tables["House"].drop(index=gone.index)}
    oracle, n = sklearn_fit(remaining)
    assert model.n_samples_seen_ == n
    np.testing.assert_allclose(model.coef_, oracle.coef_, rtol=1e-6)
    join = duckdb_rows(TRAINING, remaining)
    np.testing.assert_allclose(model.predict(join), oracle.predict(join[FEATURES]), rtol=1e-6)


def test_sql_model_rejects_rows_it_never_saw_and_stays_unchanged(housing):
    tables, catalog = housing
    model = JoinRegressor(TRAINING, "price", FEATURES[:2], catalog=catalog).fit(tables)
    coef, seen = model.coef_.copy(), model.n_samples_seen_
    cheap = tables["House"].iloc[:1].assign(price=1.0)  # fails the WHERE, never inserted
    with pytest.raises(BatchError, match="not present"):
        model.delete({"House": cheap})
    with pytest.raises(BatchError, match="is not a number"):
        model.partial_fit({"House": tables["House"].iloc[:1].assign(price="high")})
    with pytest.raises(BatchError, match="unknown table"):
        model.partial_fit({"Transport": tables["House"].iloc[:1]})
    assert model.n_samples_seen_ == seen
    np.testing.assert_array_equal(model.coef_, coef)
    model.partial_fit({"House": cheap})  # accepted (filtered out), then deletable
    model.delete({"House": cheap})
    assert model.n_samples_seen_ == seen


def test_join_chow_liu_from_sql_equals_mutual_information_of_the_materialized_join(housing):
    tables, catalog = housing
    sql = (
        "SELECT nbbedrooms, nbbathrooms, house, pricerangeshop AS shoprange, tesco "
        "FROM House JOIN Shop ON House.postcode = Shop.postcode WHERE House.livingarea > 60"
    )
    model = JoinChowLiu(sql, catalog=catalog).fit(tables)
    join = duckdb_rows(sql, tables)
    names = list(join.columns)
    assert list(model.variables_) == names
    oracle = [[mutual_info_score(join[a], join[b]) / math.log(2) for b in names] for a in names]
    np.testing.assert_allclose(model.mutual_info_.to_numpy(), oracle, atol=1e-9)
    assert model.n_samples_seen_ == len(join)


def test_covariance_query_from_sql(housing):
    tables, catalog = housing
    join = training_join(TRAINING, catalog)
    assert join.features == ("price", *FEATURES) and join.joined == ()
    query = join.covariance_query()
    maintainer = ringml.Maintainer(query, strategy="first_order")
    feed = join.feed()
    feed.apply(maintainer, [UpdateBatch.inserts(t, f) for t, f in tables.items()])
    stats = query.ring.statistics(maintainer.result())
    rows = duckdb_rows(TRAINING, tables)
    assert stats.count == len(rows)
    np.testing.assert_allclose(stats.mean, rows.mean().to_numpy(), rtol=1e-9)
    np.testing.assert_allclose(stats.covariance, rows.cov(ddof=0).to_numpy(), rtol=1e-7)


def test_training_queries_outside_the_class_are_refused(housing):
    _, catalog = housing
    with pytest.raises(SqlUnsupportedError, match="GROUP BY"):
        training_join("SELECT postcode, SUM(price) FROM House GROUP BY postcode", catalog)
    with pytest.raises(SqlUnsupportedError, match="reads several tables"):
        training_join("SELECT price * tesco AS p FROM House JOIN Shop USING (postcode)", catalog)
    join = training_join(
        "SELECT price, CASE WHEN tesco = 1 THEN 'yes' ELSE 'no' END AS t "
        "FROM House JOIN Shop USING (postcode)",
        catalog,
    )
    with pytest.raises(SqlTypeError, match="not a number"):
        join.covariance_query()
    assert set(join.covariance_query(categorical=["t"]).ring.categorical_variables) == {"t"}
    with pytest.raises(SqlNameError):
        join.covariance_query(["price", "nope"])
    with pytest.raises(ValueError, match="catalog"):
        JoinRegressor(TRAINING, "price").fit({"House": pd.DataFrame()})


def test_sql_model_drops_the_base_rows_of_a_batch_its_engine_rejects(housing):
    """Rows that pass the SQL checks but overflow the covariance products: the model and
    its base tables stay as they were (no key of the batch is kept reserved), and the rows
    with sane values go in afterwards."""
    tables, catalog = housing
    model = JoinRegressor(TRAINING, "price", FEATURES[:2], catalog=catalog).fit(tables)
    store = model.feed_.tables["House"]
    coef, seen, keys = model.coef_.copy(), model.n_samples_seen_, len(store.index)
    fresh = tables["House"][tables["House"].price > 150000].iloc[:3].assign(price=2e5 + 1)
    with pytest.raises(BatchError, match="overflow"), np.errstate(over="ignore"):
        model.partial_fit({"House": fresh.assign(livingarea=1e200)})
    assert len(store.index) == keys
    assert model.n_samples_seen_ == seen
    np.testing.assert_array_equal(model.coef_, coef)
    model.partial_fit({"House": fresh})
    assert len(store.index) == keys + 3
    assert model.n_samples_seen_ > seen


@pytest.mark.parametrize(
    "sql, clause",
    [
        ("SELECT y, x FROM A JOIN B USING (k) WHERE A.x < B.z", "several tables"),
        ("SELECT y, x FROM A JOIN B USING (k) WHERE A.x > 3 OR B.z < 1", "several tables"),
        ("SELECT y, x FROM A WHERE A.k IN (SELECT k FROM B WHERE z > 1)", "subquery"),
        ("SELECT y, x FROM A WHERE A.x > (SELECT AVG(z) FROM B)", "subquery"),
        ("SELECT y, x FROM A JOIN (SELECT k, COUNT(*) AS c FROM B GROUP BY k) t USING (k)",
         "derived table"),
    ],
)  # fmt: skip
def test_training_queries_refuse_what_the_covariance_join_cannot_filter(sql, clause):
    """Conditions over several tables, subqueries and aggregate derived tables were dropped
    silently: the model fitted other rows than the query selects (all 6, or none)."""
    catalog = Catalog(
        "CREATE TABLE A (k INTEGER, x DOUBLE, y DOUBLE); CREATE TABLE B (k INTEGER, z DOUBLE)"
    )
    with pytest.raises(SqlUnsupportedError, match=clause):
        JoinRegressor(sql, "y", solver="cholesky", catalog=catalog).fit(
            {"A": pd.DataFrame({"k": [1, 2], "x": [0.0, 1.0], "y": [1.0, 2.0]}),
             "B": pd.DataFrame({"k": [1, 2], "z": [0.5, 2.5]})}
        )  # fmt: skip
    with pytest.raises(SqlUnsupportedError, match=clause):
        training_join(sql, catalog)
