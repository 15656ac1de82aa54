"""MLflow 3 tracking of refreshes (ringml.pipelines.mlflow_tracking) on a real SQLite store.

One module-scoped stream (a small Housing-like star, inserts and deletes, a JoinRegressor
refitted after every batch and a JoinChowLiu beside it) is logged into a SQLite store in a
temporary folder; the tests read it back through MlflowClient.  The working directory is a
temporary folder too, so nothing MLflow writes can land in the repository (the last test
checks that it stays empty).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow", reason="the [mlflow] extra is not installed")

from ringml.models import CovarianceRegression, JoinChowLiu, JoinRegressor  # noqa: E402
from ringml.pipelines.mlflow_tracking import (  # noqa: E402
    CHAMPION,
    PromotionRule,
    RefreshLogger,
    resolve_tracking,
    sqlite_tracking_uri,
)

import ringml as rm  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from ringml.datasets import build_stream, housing_star  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:The ``noload`` loader strategy is deprecated"  # SQLAlchemy, inside MLflow's store
)

FEATURES = ["livingarea", "kitchensize", "garden", "averagesalary", "nbbedrooms"]
CHOW_LIU = ["nbbedrooms", "pricerangeshop", "typeeducation", "garden"]
MODEL = "test-housing-price"


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    store, cwd = root / "store", root / "cwd"
    cwd.mkdir()
    uri = sqlite_tracking_uri(store)
    previous = mlflow.get_tracking_uri()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        mp.chdir(cwd)
        mlflow.set_tracking_uri(uri)
        ds = housing_star(postcodes=6, seed=0)
        holdout = housing_star(postcodes=4, seed=1).join()
        model = JoinRegressor(  # the holdout has categories the early refreshes lack
            ds.schemas,
            "price",
            FEATURES,
            categorical=["nbbedrooms"],
            ridge=0.01,
            handle_unknown="ignore",
        )
        chow = JoinChowLiu(
            ds.schemas, CHOW_LIU, continuous=["garden"], n_bins=8, ranges={"garden": (0.0, 400.0)}
        )
        stream = build_stream(ds.relations, batch_size=15, delete_fraction=0.2, seed=1)
        logger = RefreshLogger(
            MODEL,
            experiment="stream",
            store_dir=store,
            holdout=holdout,
            extra_params={"batch_size": 15, "delete_fraction": 0.2},
        )
        with logger:
            records = []
            for batch in stream:
                records.append(logger.partial_fit(model, batch))
                chow.partial_fit(batch)
            chow_paths = logger.log_chow_liu(chow)
        yield SimpleNamespace(
            uri=uri,
            store=store,
            cwd=cwd,
            client=MlflowClient(uri),
            logger=logger,
            run_id=logger.run_id,
            records=records,
            stream=stream,
            model=model,
            chow=chow,
            chow_paths=chow_paths,
            holdout=holdout,
            schemas=ds.schemas,
        )
    mlflow.set_tracking_uri(previous)


def _history(client, run_id, key):
    return sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)


def test_params_once_and_metrics_on_every_refresh(tracked):
    client, run_id = tracked.client, tracked.run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "stream"
    params = run.data.params
    assert params["label"] == "price"
    assert params["features"] == ",".join(FEATURES)
    assert params["categorical"] == "nbbedrooms"
    assert params["ridge"] == "0.01"
    assert params["strategy"] == "fivm"
    assert params["query.join_variables"] == "postcode"
    assert params["query.n_relations"] == "6"
    assert params["query.ring"] == "GeneralizedCovarianceRing"
    assert params["batch_size"] == "15"
    assert params["promotion.metric"] == "holdout_rmse"
    assert "postcode" in params["variable_order"]

    n = len(tracked.stream)
    steps = list(range(1, n + 1))
    rows = _history(client, run_id, "rows_applied")
    assert [m.step for m in rows] == steps
    assert [m.value for m in rows] == [len(b.rows) for b in tracked.stream]
    assert [m.value for m in _history(client, run_id, "deletes")] == [
        b.n_deletes for b in tracked.stream
    ]
    assert _history(client, run_id, "rows_applied_total")[-1].value == sum(
        len(b.rows) for b in tracked.stream
    )
    assert [m.step for m in _history(client, run_id, "promoted")] == steps
    assert all(m.value > 0 for m in _history(client, run_id, "deltas_per_second"))
    join_rows = _history(client, run_id, "join_rows")
    assert [m.step for m in join_rows] == steps
    assert join_rows[-1].value == tracked.model.n_samples_seen_
    # the model-quality metrics exist exactly on the refreshes with a non-empty join
    fitted = [m.step for m in join_rows if m.value > 0]
    assert fitted and fitted[-1] == n
    for key in ("gd_iterations", "loss", "train_rmse", "holdout_rmse", "condition_number"):
        assert [m.step for m in _history(client, run_id, key)] == fitted, key
    last = {k: v for k, v in tracked.records[-1].metrics.items()}
    assert last["gd_iterations"] == tracked.model.n_iter_
    assert last["condition_number"] == pytest.approx(tracked.model.result_.condition_number)
    y = tracked.holdout["price"].to_numpy()
    rmse = float(np.sqrt(np.mean((y - tracked.model.predict(tracked.holdout)) ** 2)))
    assert last["holdout_rmse"] == pytest.approx(rmse, rel=1e-12)
    assert client.list_artifacts(run_id, "query")[0].path == "query/explain.txt"


def test_models_are_logged_and_registered_only_on_promotion(tracked):
    client, run_id = tracked.client, tracked.run_id
    promoted = [r for r in tracked.records if r.promoted]
    assert promoted, "the first fitted refresh has no champion to beat: it must promote"
    assert promoted[0].reason == "no champion yet"
    assert [m.value for m in _history(client, run_id, "promoted")] == [
        float(r.promoted) for r in tracked.records
    ]
    assert any(not r.promoted and r.metrics.get("holdout_rmse") for r in tracked.records)
    # one logged model and one registered version per promotion, none otherwise
    eid = client.get_run(run_id).info.experiment_id
    logged = mlflow.search_logged_models(experiment_ids=[eid], output_format="list")
    assert sorted(m.model_id for m in logged) == sorted(
        r.model_uri.removeprefix("models:/") for r in promoted
    )
    versions = client.search_model_versions(f"name='{MODEL}'")
    mine = [v for v in versions if v.tags.get("ringml.run_id") == run_id]
    assert sorted(int(v.version) for v in mine) == sorted(int(r.version) for r in promoted)
    # the rule's ladder: every promotion after the first beat the champion before it by 1 %
    scores = [r.metrics["holdout_rmse"] for r in promoted]
    assert all(b < 0.99 * a for a, b in zip(scores, scores[1:], strict=False))
    first = client.get_model_version(MODEL, promoted[0].version)
    assert float(first.tags["ringml.holdout_rmse"]) == promoted[0].metrics["holdout_rmse"]
    assert first.tags["ringml.step"] == str(promoted[0].step)
    # the logged model: a pyfunc from code with a JSON artifact, signature and example
    info = mlflow.models.get_model_info(promoted[-1].model_uri)
    assert info.signature is not None
    inputs = {c.name: str(c.type) for c in info.signature.inputs.inputs}
    # every feature 'any': the served model checks values as the estimator does (a long
    # category column refused 3.0 and NULLs, which the estimator takes)
    assert inputs == dict.fromkeys(FEATURES, "Any")
    assert info.saved_input_example_info is not None
    flavor = info.flavors["python_function"]
    assert flavor["loader_module"] == "mlflow.pyfunc.loaders.code_model"
    local = Path(mlflow.artifacts.download_artifacts(promoted[-1].model_uri))
    assert not list(local.rglob("*.pkl")), "the model must not be pickled"
    code = (local / Path(flavor["model_code_path"]).name).read_text()
    assert "import ringml" not in code and "from ringml" not in code
    requirements = (local / "requirements.txt").read_text().split()
    assert requirements == [
        f"mlflow=={mlflow.__version__}",
        f"numpy=={np.__version__}",
        f"pandas=={pd.__version__}",
    ]
    spec = json.loads((local / "artifacts" / "coefficients.json").read_text())
    assert spec["label"] == "price" and spec["features"] == FEATURES
    # the refresh's metrics are attached to the LoggedModel too
    model_metrics = mlflow.get_logged_model(promoted[-1].model_uri.removeprefix("models:/")).metrics
    assert {m.key for m in model_metrics} >= {"holdout_rmse", "gd_iterations", "promoted"}


def test_champion_alias_moves_when_the_rule_fires(tracked):
    client, model, holdout = tracked.client, tracked.model, tracked.holdout
    before = client.get_model_version_by_alias(MODEL, CHAMPION)
    best = float(before.tags["ringml.holdout_rmse"])
    pred = model.predict(holdout)
    with RefreshLogger(MODEL, experiment="promotions", store_dir=tracked.store) as logger:
        # a holdout the current model fits worse than the champion did: no model is logged
        worse = holdout.assign(price=pred + 10.0 * best)
        record = logger.log_refresh(model, holdout=worse)
        assert record.step == 1 and not record.promoted and record.version is None
        assert "not improved enough" in record.reason
        assert client.get_model_version_by_alias(MODEL, CHAMPION).version == before.version
        # a holdout it fits better by far: the rule promotes it and the alias moves
        better = holdout.assign(price=pred + 1.0)
        record = logger.log_refresh(model, holdout=better)
    assert record.step == 2 and record.promoted, record.reason
    assert "improved" in record.reason
    assert record.metrics["holdout_rmse"] == pytest.approx(1.0)
    after = client.get_model_version_by_alias(MODEL, CHAMPION)
    assert str(after.version) == record.version and int(after.version) > int(before.version)
    assert float(after.tags["ringml.holdout_rmse"]) == pytest.approx(1.0)
    assert logger.champion() == (str(after.version), pytest.approx(1.0))
    # the champion, loaded as a pyfunc model, predicts what the estimator predicts
    champion = mlflow.pyfunc.load_model(f"models:/{MODEL}@{CHAMPION}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        served = champion.predict(holdout[FEATURES])
        served_wide = champion.predict(holdout)  # extra columns are ignored
    np.testing.assert_allclose(served, pred, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(served_wide, pred, rtol=1e-12, atol=1e-9)
    # forcing works without a better score
    with RefreshLogger(MODEL, experiment="promotions", store_dir=tracked.store) as logger:
        forced = logger.log_refresh(model, holdout=worse, promote=True)
    assert forced.promoted and forced.reason == "forced"
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION).version) == forced.version


def test_chow_liu_tree_artifacts(tracked):
    client, run_id = tracked.client, tracked.run_id
    names = {Path(a.path).name for a in client.list_artifacts(run_id, "chow_liu")}
    assert names == {"edges.csv", "tree.json", "tree.png", "mutual_info.csv"}
    assert sorted(tracked.chow_paths) == sorted(f"chow_liu/{n}" for n in names)
    local = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="chow_liu"))
    edges = pd.read_csv(local / "edges.csv")
    assert list(edges.columns) == ["source", "target", "mutual_info_bits"]
    expected = {frozenset((u, v)): d["weight"] for u, v, d in tracked.chow.tree_.edges(data=True)}
    got = {frozenset((r.source, r.target)): r.mutual_info_bits for r in edges.itertuples()}
    assert got.keys() == expected.keys() and len(got) == len(CHOW_LIU) - 1
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12)
    doc = json.loads((local / "tree.json").read_text())
    assert {n["name"] for n in doc["nodes"]} == set(CHOW_LIU)
    assert doc["total_mutual_info_bits"] == pytest.approx(sum(expected.values()))
    assert (local / "tree.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mi = pd.read_csv(local / "mutual_info.csv", index_col=0)
    np.testing.assert_allclose(mi.to_numpy(), tracked.chow.mutual_info_.to_numpy(), rtol=1e-12)
    total = _history(client, run_id, "chow_liu_total_mi")
    assert [m.step for m in total] == [len(tracked.stream)]


def test_maintainer_and_covariance_regression_resume_a_run(tracked):
    """The other way to keep a model fresh: a Maintainer plus a CovarianceRegression.  No
    holdout: the first fitted refresh is promoted (no champion yet), later ones cannot be
    compared; the model's signature comes from a synthetic row.  A second logger attached
    to the same run continues its refresh numbering."""
    variables = ["livingarea", "garden", "nbbedrooms", "price"]
    query = rm.covariance_query(tracked.schemas, variables, ["nbbedrooms"])
    maintainer = rm.Maintainer(query)
    regression = CovarianceRegression("price", variables[:3], ridge=0.01)
    stream = build_stream(housing_star(postcodes=3, seed=4).relations, batch_size=10, seed=4)
    probe = housing_star(postcodes=2, seed=9).join()
    name = MODEL + "-cov"
    where = dict(experiment="maintainer", store_dir=tracked.store)
    expected = None

    def refresh(logger, batch):
        maintainer.apply(rm.UpdateBatch(batch.relation, batch.rows, batch.multiplicity))
        if maintainer.result().count > 0:
            regression.refresh(query.ring, maintainer.result(), decode=maintainer.decode)
            return logger.log_refresh(regression, maintainer=maintainer, batch=batch)
        return None

    with RefreshLogger(name, **where) as logger:
        for batch in stream[:-2]:
            record = refresh(logger, batch)
            if record is not None and record.promoted:
                expected = regression.predict(probe)
        run_id = logger.run_id
    # the join is empty until every relation has had a batch: two fitted refreshes
    assert [(r.step, r.promoted) for r in logger.records] == [(1, True), (2, False)]
    assert logger.records[1].reason == "no holdout_rmse this refresh"
    with RefreshLogger(name, run_id=run_id, promotion=None, **where) as again:
        for batch in stream[-2:]:
            refresh(again, batch)
    assert again.step == 4 and again.records[-1].reason == "no promotion rule"
    client = tracked.client
    assert [m.step for m in _history(client, run_id, "gd_iterations")] == [1, 2, 3, 4]
    assert client.get_run(run_id).info.status == "FINISHED"
    params = client.get_run(run_id).data.params
    assert params["model.class"] == "CovarianceRegression"
    assert params["query.ring"] == "GeneralizedCovarianceRing" and params["strategy"] == "fivm"
    assert len(client.search_model_versions(f"name='{name}'")) == 1
    champion = mlflow.pyfunc.load_model(f"models:/{name}@{CHAMPION}")
    info = mlflow.models.get_model_info(f"models:/{name}@{CHAMPION}")
    assert [c.name for c in info.signature.inputs.inputs] == variables[:3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        served = champion.predict(probe)
    np.testing.assert_allclose(served, expected, rtol=1e-12, atol=1e-9)


def test_served_model_takes_what_the_estimator_takes(tracked):
    """A continuous feature whose holdout held integers is served as double (the signature
    said long and refused 2.5); date categories are logged (json.dumps failed after
    ``promoted`` was logged) and met by the served model, also as the timestamps MLflow turns
    them into; the reference category is in coefficients.json (it was null); a category
    with no JSON form fails before anything is logged."""
    rng = np.random.default_rng(0)
    days = [dt.date(2020, 1, 1), dt.date(2021, 1, 1), dt.date(2022, 1, 1)]
    S = pd.DataFrame({"k": rng.integers(0, 3, 30), "rooms": rng.integers(1, 6, 30),
                      "y": rng.normal(size=30), "d": days * 10})  # fmt: skip
    T = pd.DataFrame({"k": [0, 1, 2], "z": [0.1, 0.5, -0.3]})
    schemas = {"S": ["k", "rooms", "y", "d"], "T": ["k", "z"]}
    model = JoinRegressor(schemas, "y", categorical=["d"]).fit({"S": S, "T": T})
    holdout = S.merge(T, on="k")
    name = MODEL + "-served"
    # a holdout row of a date the model never saw: scored as served (its column adds 0),
    # though the estimator (handle_unknown="error") refuses to predict it
    unseen_row = holdout.iloc[:1].assign(d=dt.date(1999, 1, 1))
    scored = pd.concat([holdout, unseen_row], ignore_index=True)
    with RefreshLogger(name, experiment="served", store_dir=tracked.store, holdout=scored) as log:
        record = log.log_refresh(model)
        champion = log.load_champion()
    assert record.promoted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = scored["y"] - np.asarray(champion.predict(scored[list(model.features_)]))
    assert record.metrics["holdout_rmse"] == pytest.approx(float(np.sqrt(np.mean(errors**2))))
    uri = f"models:/{name}@{CHAMPION}"
    inputs = {c.name: str(c.type) for c in mlflow.models.get_model_info(uri).signature.inputs}
    assert inputs == {"rooms": "Any", "z": "Any", "d": "Any"}
    probe = holdout.assign(rooms=holdout["rooms"] + 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        served = champion.predict(probe[list(model.features_)])
        stamped = champion.predict(
            probe.assign(d=pd.to_datetime(probe["d"]))[list(model.features_)]
        )
    np.testing.assert_allclose(served, model.predict(probe), rtol=1e-12)
    np.testing.assert_allclose(stamped, model.predict(probe), rtol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unseen = champion.predict(probe.assign(d=dt.date(1999, 1, 1))[list(model.features_)])
    assert np.abs(np.asarray(unseen) - served).max() > 1e-3  # the dates' coefficients count
    (entry,) = champion.unwrap_python_model().spec["categorical"]  # coefficients.json
    assert entry["reference"] == {"date": "2020-01-01"}
    assert [c for c, _ in entry["coefficients"]] == [{"date": "2021-01-01"}, {"date": "2022-01-01"}]
    raw = JoinRegressor(schemas, "y", categorical=["d"]).fit(
        {"S": S.assign(d=[b"a", b"b", b"c"] * 10), "T": T}
    )
    with RefreshLogger(name + "-bytes", experiment="served", store_dir=tracked.store) as log:
        with pytest.raises(ValueError, match="categorical variable 'd'.*no JSON form"):
            log.log_refresh(raw)
        assert tracked.client.get_run(log.run_id).data.metrics == {}


def test_served_categories_take_what_the_estimator_takes(tracked):
    """An integer category column sent as floats, with a NULL, or a text category column of
    pandas' category dtype: MLflow's typed schema ('h': long, 'g': string) refused them,
    while the estimator reads 1.0 as the category 1 and an unknown value (NULL here) as no
    category (handle_unknown='ignore')."""
    rng = np.random.default_rng(1)
    R = pd.DataFrame({"k": rng.integers(0, 4, 40), "a": rng.normal(size=40),
                      "y": rng.normal(size=40), "g": rng.choice(["u", "v", "w"], 40),
                      "h": rng.integers(1, 4, 40)})  # fmt: skip
    S = pd.DataFrame({"k": np.arange(4), "b": rng.integers(0, 5, 4)})
    schemas = {"R": ["k", "a", "y", "g", "h"], "S": ["k", "b"]}
    model = JoinRegressor(schemas, "y", categorical=["g", "h"], handle_unknown="ignore")
    model.fit({"R": R, "S": S})
    rows = R.merge(S, on="k")[list(model.features_)]
    name = MODEL + "-categories"
    with RefreshLogger(name, experiment="categories", store_dir=tracked.store) as log:
        assert log.log_refresh(model).promoted
        champion = log.load_champion()
    floats = rows.assign(h=rows["h"].astype(float))
    probes = {
        "int category as floats": floats,
        "NULL in an int category": floats.assign(h=floats["h"].where(rows.index != 2)),
        "pandas category dtype": rows.assign(g=rows["g"].astype("category")),
    }
    for what, probe in probes.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            served = np.asarray(champion.predict(probe))
        np.testing.assert_allclose(served, model.predict(probe), rtol=1e-12, err_msg=what)
    assert abs(served[0] - model.predict(rows)[0]) < 1e-12  # the probes' values counted


def test_promotion_rule():
    rule = PromotionRule(min_relative_improvement=0.1)
    ok = {"join_rows": 10.0, "holdout_rmse": 8.0}
    assert rule.decide(ok, None) == (True, "no champion yet")
    assert rule.decide({**ok, "join_rows": 0.0}, None)[0] is False
    assert rule.decide(ok, ("3", 10.0))[0] is True  # 8 < 10 - 1
    assert rule.decide({**ok, "holdout_rmse": 9.5}, ("3", 10.0))[0] is False
    assert rule.decide({"join_rows": 10.0}, ("3", 10.0))[0] is False  # no holdout
    assert rule.decide(ok, ("3", None))[0] is False  # champion without a score
    r2 = PromotionRule("holdout_r2", 0.0, higher_is_better=True)
    assert r2.decide({"join_rows": 1.0, "holdout_r2": 0.9}, ("1", 0.8))[0] is True
    assert r2.decide({"join_rows": 1.0, "holdout_r2": 0.7}, ("1", 0.8))[0] is False
    with pytest.raises(ValueError):
        PromotionRule(min_relative_improvement=-1.0)


def test_tracking_store_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri, artifacts = resolve_tracking(store_dir=tmp_path / "s")
    assert uri == f"sqlite:///{(tmp_path / 's').resolve().as_posix()}/mlflow.db"
    assert artifacts == (tmp_path / "s" / "mlartifacts").resolve().as_uri()
    assert resolve_tracking("http://localhost:5000", tmp_path) == ("http://localhost:5000", None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/e/mlflow.db")
    assert resolve_tracking()[1] == (tmp_path / "e" / "mlartifacts").resolve().as_uri()
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    assert resolve_tracking()[0] == sqlite_tracking_uri(tmp_path / "ringml-mlflow")


def test_core_packages_do_not_import_mlflow():
    code = (
        "import sys, ringml, ringml.models, ringml.datasets; "
        "bad = [m for m in ('mlflow', 'pyspark') if m in sys.modules]; "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr or done.stdout


def test_nothing_is_written_outside_the_store(tracked):
    assert not any(tracked.cwd.iterdir()), sorted(p.name for p in tracked.cwd.iterdir())
    assert (tracked.store / "mlflow.db").is_file()
    assert {p.name for p in tracked.store.iterdir()} == {"mlflow.db", "mlartifacts"}
