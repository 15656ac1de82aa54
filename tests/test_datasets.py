"""Tests for ringml.datasets: the Housing loader, the generators and the stream builder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringml.datasets import (
    FAVORITA_SCHEMA,
    HOUSING_CATEGORICAL,
    HOUSING_CONTINUOUS,
    HOUSING_SCHEMA,
    RETAILER_SCHEMA,
    Dataset,
    build_stream,
    favorita_star,
    final_state,
    graph_edges,
    housing_star,
    load_housing,
    natural_join,
    path_query_relations,
    retailer_snowflake,
    stream_to_frame,
)


def assert_same_multiset(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    cols = list(a.columns)
    sa = a.sort_values(cols, kind="stable").reset_index(drop=True)
    sb = b.sort_values(cols, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(sa, sb, check_dtype=False)


def assert_same_dataset(a: Dataset, b: Dataset) -> None:
    assert a.relations.keys() == b.relations.keys()
    for r in a.relations:
        pd.testing.assert_frame_equal(a.relations[r], b.relations[r])


# --------------------------------------------------------------------------- Housing (real)


@pytest.fixture(scope="module")
def housing() -> Dataset:
    try:
        return load_housing()
    except FileNotFoundError as e:  # pragma: no cover - data lives outside the repo
        pytest.skip(str(e))


def test_housing_shapes_and_schema(housing: Dataset) -> None:
    assert list(housing.relations) == list(HOUSING_SCHEMA)
    for rel, df in housing.relations.items():
        assert df.shape == (25_000, len(HOUSING_SCHEMA[rel])), rel
        assert list(df.columns) == HOUSING_SCHEMA[rel]
        assert df.notna().all().all()
        assert df["postcode"].is_unique
    assert housing.join_variables == ["postcode"]
    assert len(housing.variables) == 26
    assert len(housing.continuous) == 14 and len(housing.categorical) == 12
    assert set(housing.continuous) | set(housing.categorical) == set(housing.variables)
    assert housing.label == "price" and "price" in housing.continuous


def test_housing_join_on_postcode(housing: Dataset) -> None:
    rels = list(housing.relations.values())
    joined = rels[0]
    for df in rels[1:]:
        joined = joined.merge(df, on="postcode")
    assert len(joined) == 25_000
    assert joined.shape[1] == 27
    assert len(housing.join()) == 25_000


def test_housing_categorical_split_is_by_domain_size(housing: Dataset) -> None:
    nunique = {c: df[c].nunique() for df in housing.relations.values() for c in df.columns[1:]}
    assert all(nunique[c] <= 12 for c in HOUSING_CATEGORICAL)
    assert all(nunique[c] > 12 for c in HOUSING_CONTINUOUS)
    values = housing.relations["House"][["house", "flat", "unknown"]].to_numpy()
    assert set(np.unique(values)) == {0.0, 1.0}


def test_housing_integer_keys(housing: Dataset) -> None:
    d = load_housing(integer_keys=True)
    for rel, df in d.relations.items():
        assert df["postcode"].dtype == np.int64
        assert set(df["postcode"]) == set(range(25_000))
        # same row order, same rank of the original float key
        orig = housing.relations[rel]["postcode"].to_numpy()
        assert (np.argsort(orig, kind="stable") == np.argsort(df["postcode"], kind="stable")).all()


def test_housing_paths(housing: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_housing(tmp_path)
    folder = Path(str(housing.extra["path"]))
    assert len(load_housing(folder.parent).relations["House"]) == 25_000  # parent works too
    monkeypatch.setenv("RINGML_DATA", str(folder.parent))
    assert len(load_housing().relations["Shop"]) == 25_000


def test_import_is_light() -> None:
    code = (
        "import sys, ringml.datasets; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'mlflow')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- generators


def test_housing_star_shapes_and_join_size() -> None:
    P = 300
    d = housing_star(P, seed=1)
    k = {"House": 10, "Shop": 5, "Institution": 2, "Restaurant": 2, "Demographics": 1}
    k["Transport"] = 1
    assert {r: list(df.columns) for r, df in d.relations.items()} == HOUSING_SCHEMA
    join_size = np.ones(P, dtype=np.int64)
    for rel, df in d.relations.items():
        assert len(df) == k[rel] * P
        counts = df["postcode"].value_counts().reindex(range(P), fill_value=0).to_numpy()
        assert (counts == k[rel]).all()
        join_size *= counts
    assert join_size.sum() == 200 * P
    assert len(d.variables) == 26 and d.label == "price"
    for c in d.categorical:
        col = next(df[c] for df in d.relations.values() if c in df.columns)
        assert col.dtype == np.int64 and col.nunique() <= 12
    house = d.relations["House"]
    assert ((house["house"] + house["flat"] + house["unknown"]) == 1).all()
    assert np.corrcoef(house["price"], house["livingarea"])[0, 1] > 0.5


def test_housing_star_small_join_and_overrides() -> None:
    d = housing_star(4, seed=2)
    assert len(natural_join(d.relations)) == 800
    d2 = housing_star(7, rows_per_postcode={"House": 3, "Shop": 0}, seed=2)
    assert len(d2.relations["House"]) == 21 and len(d2.relations["Shop"]) == 0
    assert len(d2.join()) == 0
    with pytest.raises(KeyError):
        housing_star(3, rows_per_postcode={"Nope": 1})


def test_generators_are_deterministic() -> None:
    assert_same_dataset(housing_star(50, seed=3), housing_star(50, seed=3))
    assert (
        not housing_star(50, seed=3)
        .relations["House"]
        .equals(housing_star(50, seed=4).relations["House"])
    )
    kw = dict(locations=10, dates=5, items=20, inventory_rows=500)
    assert_same_dataset(retailer_snowflake(**kw, seed=5), retailer_snowflake(**kw, seed=5))
    assert (
        not retailer_snowflake(**kw, seed=5)
        .relations["Inventory"]
        .equals(retailer_snowflake(**kw, seed=6).relations["Inventory"])
    )
    assert_same_dataset(favorita_star(seed=7), favorita_star(seed=7))
    pd.testing.assert_frame_equal(graph_edges(50, 300, seed=8), graph_edges(50, 300, seed=8))


def test_retailer_snowflake() -> None:
    d = retailer_snowflake(locations=20, dates=15, items=40, inventory_rows=3_000, seed=0)
    assert {r: list(df.columns) for r, df in d.relations.items()} == RETAILER_SCHEMA
    assert len(d.continuous) == 33 and len(d.categorical) == 6
    assert set(d.categorical) == {
        "subcategory", "category", "categoryCluster", "rain", "snow", "thunder",
    }  # fmt: skip
    assert d.join_variables == ["locn", "dateid", "ksn", "zip"]
    assert "locn" in d.variable_order and "zip" in d.variable_order
    R = d.relations
    inv = R["Inventory"]
    assert len(inv) == 3_000
    assert not inv.duplicated(["locn", "dateid", "ksn"]).any()
    assert inv.equals(inv.sort_values(["locn", "dateid", "ksn"]))
    # every Inventory row has exactly one partner in each dimension
    assert R["Location"]["locn"].is_unique and R["Item"]["ksn"].is_unique
    assert R["Census"]["zip"].is_unique and not R["Weather"].duplicated(["locn", "dateid"]).any()
    assert inv["locn"].isin(R["Location"]["locn"]).all()
    assert inv["ksn"].isin(R["Item"]["ksn"]).all()
    assert R["Location"]["zip"].isin(R["Census"]["zip"]).all()
    w = pd.MultiIndex.from_frame(R["Weather"][["locn", "dateid"]])
    assert pd.MultiIndex.from_frame(inv[["locn", "dateid"]]).isin(w).all()
    assert len(d.join()) == 3_000
    # default zips: bijection locn <-> zip
    assert R["Location"]["zip"].is_unique
    item = R["Item"]
    assert (item.groupby("subcategory")["category"].nunique() == 1).all()
    with pytest.raises(ValueError):
        retailer_snowflake(locations=2, dates=2, items=2, inventory_rows=9)


def test_favorita_star() -> None:
    d = favorita_star(dates=20, stores=5, items=30, sales_rows=1_500, seed=0)
    assert {r: list(df.columns) for r, df in d.relations.items()} == FAVORITA_SCHEMA
    assert d.continuous == ["unit_sales", "transactions", "dcoilwtico"]
    assert len(d.categorical) == 12
    assert d.join_variables == ["date", "store", "item"]
    sales = d.relations["Sales"]
    assert not sales.duplicated(["date", "store", "item"]).any()
    assert len(d.join()) == len(sales) == 1_500
    stores = d.relations["Stores"]
    assert (stores.groupby("city")["state"].nunique() == 1).all()


def test_graph_edges_and_paths() -> None:
    e = graph_edges(200, 3_000, seed=0)
    assert list(e.columns) == ["src", "dst"] and len(e) == 3_000
    assert not e.duplicated().any() and (e["src"] != e["dst"]).all()
    assert e.to_numpy().min() >= 0 and e.to_numpy().max() < 200
    skewed = graph_edges(200, 3_000, seed=0, skew=1.2)
    assert not skewed.duplicated().any()
    assert skewed["src"].value_counts().max() > 2 * e["src"].value_counts().max()
    multi = graph_edges(5, 100, seed=0, unique=False)
    assert len(multi) == 100 and multi.duplicated().any()
    with pytest.raises(ValueError):
        graph_edges(3, 7)  # only 6 distinct non-loop edges
    rels = path_query_relations(e, 3)
    assert list(rels) == ["R1", "R2", "R3"]
    assert [list(df.columns) for df in rels.values()] == [["A1", "A2"], ["A2", "A3"], ["A3", "A4"]]
    # 2-path count = sum over nodes of indegree * outdegree
    indeg = e["dst"].value_counts()
    outdeg = e["src"].value_counts()
    expected = int((indeg * outdeg.reindex(indeg.index, fill_value=0)).sum())
    assert len(natural_join(path_query_relations(e, 2))) == expected


# --------------------------------------------------------------------------- streams


def _small_db() -> dict[str, pd.DataFrame]:
    d = housing_star(60, seed=11)  # House 600, Shop 300, ..., Transport 60 rows
    return d.relations


def _check_stream(rels: dict[str, pd.DataFrame], stream, batch_size: int) -> None:
    """Insert-once, delete-after-insert, delete-at-most-once; returns nothing."""
    inserted_at: dict[str, dict[int, int]] = {r: {} for r in rels}
    deleted: dict[str, set[int]] = {r: set() for r in rels}
    for t, b in enumerate(stream):
        assert 0 < len(b) <= batch_size
        assert b.multiplicity.dtype == np.int64 and set(np.unique(b.multiplicity)) <= {-1, 1}
        assert list(b.rows.columns) == list(rels[b.relation].columns)
        src = rels[b.relation].iloc[b.row_ids].reset_index(drop=True)
        pd.testing.assert_frame_equal(b.rows, src)
        for rid, m in zip(b.row_ids.tolist(), b.multiplicity.tolist(), strict=True):
            if m > 0:
                assert rid not in inserted_at[b.relation]
                inserted_at[b.relation][rid] = t
            else:
                assert inserted_at[b.relation].get(rid, t) < t, "delete before its insert"
                assert rid not in deleted[b.relation]
                deleted[b.relation].add(rid)
    for r, df in rels.items():
        assert sorted(inserted_at[r]) == list(range(len(df))), "every tuple inserted once"
    # final state = inserted minus deleted, as multisets
    fs = final_state(stream)
    for r, df in rels.items():
        alive = sorted(set(range(len(df))) - deleted[r])
        assert_same_multiset(fs[r], df.iloc[alive].reset_index(drop=True))


def test_stream_inserts_round_robin() -> None:
    rels = _small_db()
    s = build_stream(rels, batch_size=100)
    _check_stream(rels, s, 100)
    assert all(b.n_deletes == 0 for b in s)
    # round 1 visits every relation in order, then only the still-unfinished ones
    # (House 600, Shop 300, Institution 120, Restaurant 120, Demographics 60, Transport 60)
    h, sh, i, r = "House", "Shop", "Institution", "Restaurant"
    expected = [*rels, h, sh, i, r, h, sh, h, h, h]
    assert [b.relation for b in s] == expected
    assert sum(len(b) for b in s) == sum(len(df) for df in rels.values())


@pytest.mark.parametrize("f", [0.1, 0.25, 0.5])
def test_stream_delete_fraction(f: float) -> None:
    rels = _small_db()
    s = build_stream(rels, batch_size=64, delete_fraction=f, seed=3)
    _check_stream(rels, s, 64)
    ins = sum(b.n_inserts for b in s)
    dels = sum(b.n_deletes for b in s)
    assert ins == sum(len(df) for df in rels.values())
    assert dels == round(f / (1 - f) * ins)  # exact, up to one rounding
    assert abs(dels / (ins + dels) - f) < 1e-3
    assert all(b.n_deletes == 0 for b in s[: len(rels)])  # first batches have nothing to delete
    if f == 0.5:
        assert all(len(df) == 0 for df in final_state(s).values())


def test_stream_order_seed_and_frame() -> None:
    rels = _small_db()
    s = build_stream(rels, batch_size=128, delete_fraction=0.2, order=["Shop", "House"], seed=1)
    assert {b.relation for b in s} == {"Shop", "House"} and s[0].relation == "Shop"
    s2 = build_stream(rels, batch_size=128, delete_fraction=0.2, order=["Shop", "House"], seed=1)
    assert all((a.row_ids == b.row_ids).all() for a, b in zip(s, s2, strict=True))
    frame = stream_to_frame(s)
    assert list(frame.columns[:2]) == ["relation", "mult"]
    assert len(frame) == sum(len(b) for b in s)
    assert frame["mult"].sum() == sum(len(df) for df in final_state(s).values())
    assert set(frame.columns[2:]) == set(rels["Shop"].columns) | set(rels["House"].columns)
    with pytest.raises(ValueError):
        build_stream(rels, delete_fraction=0.6)
    with pytest.raises(KeyError):
        build_stream(rels, order=["Nope"])


def test_final_state_multiset_semantics() -> None:
    r = pd.DataFrame({"a": [1, 1, 2, 3], "b": [0.5, 0.5, np.nan, 1.0]})
    s = build_stream({"R": r}, batch_size=2, delete_fraction=0.2, seed=0)
    fs = final_state(s)["R"]
    deleted = [rid for b in s for rid, m in zip(b.row_ids, b.multiplicity, strict=True) if m < 0]
    assert len(deleted) == 1
    expected = r.drop(index=deleted).reset_index(drop=True)
    assert_same_multiset(fs, expected)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=4),
    batch_size=st.integers(2, 17),
    f=st.sampled_from([0.0, 0.05, 0.3, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_stream_property(sizes: list[int], batch_size: int, f: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rels = {
        f"R{i}": pd.DataFrame({"k": rng.integers(0, 5, n), "v": rng.integers(0, 3, n)})
        for i, n in enumerate(sizes)
    }
    s = build_stream(rels, batch_size=batch_size, delete_fraction=f, seed=seed)
    _check_stream({r: df for r, df in rels.items() if len(df)}, s, batch_size)
    n = sum(sizes)
    assert sum(b.n_deletes for b in s) == min(n, round(f / (1 - f) * n))
