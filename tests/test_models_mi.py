"""Mutual information and Chow–Liu trees from count tables (notes §9.3, W14)."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ringml.models.estimators import JoinChowLiu
from ringml.models.mutual_information import (
    EqualWidthBinner,
    chow_liu_tree,
    entropy,
    equal_width_bins,
    mutual_information,
    mutual_information_matrix,
)
from scipy.stats import entropy as scipy_entropy
from sklearn.metrics import mutual_info_score

import ringml as rm
from ringml.datasets import build_stream, final_state, natural_join

W14_R = pd.DataFrame({"A": [1, 1, 2, 3, 3], "B": [1, 2, 1, 2, 3]})
W14_S = pd.DataFrame({"B": [1, 1, 2, 2, 3, 2], "C": [1, 2, 1, 2, 1, 1], "D": [1, 1, 2, 2, 1, 1]})
W14_MI = [
    [1.494919, 0.585828, 0.027491, 0.140683],
    [0.585828, 1.322179, 0.081135, 0.444772],
    [0.027491, 0.081135, 0.945660, 0.032765],
    [0.140683, 0.444772, 0.032765, 0.945660],
]


def w14_tables():
    query = rm.covariance_query({"R": ["A", "B"], "S": ["B", "C", "D"]}, list("ABCD"), list("ABCD"))
    m = rm.Maintainer(query)
    m.insert("R", W14_R)
    m.insert("S", W14_S)
    return query.ring.count_tables(m.result())


def test_w14_counts_matrix_and_tree():
    tables = w14_tables()
    assert tables[()] == 11
    assert sorted(tables[("A",)].values()) == [2, 4, 5]
    mi = mutual_information_matrix(tables)
    assert list(mi.columns) == list("ABCD")
    np.testing.assert_allclose(mi.to_numpy(), W14_MI, atol=5e-7)
    tree = chow_liu_tree(mi)
    edges = {frozenset(e): w for *e, w in tree.edges(data="weight")}
    assert set(edges) == {frozenset("AB"), frozenset("BD"), frozenset("BC")}
    assert edges[frozenset("AB")] == pytest.approx(0.585828, abs=5e-7)
    assert tree.size(weight="weight") == pytest.approx(1.111735, abs=5e-7)
    assert tree.nodes["A"]["entropy"] == pytest.approx(1.494919, abs=5e-7)


def test_w14_fig6_all_categorical_total_weight():
    data = {
        "R": pd.DataFrame({"A": [1, 1, 2, 3], "B": [1, 2, 3, 4]}),
        "S": pd.DataFrame({"A": [1, 1, 1, 2], "C": [1, 1, 2, 2], "E": [1, 2, 3, 4]}),
        "T": pd.DataFrame({"C": [1, 2, 2, 3], "D": [1, 2, 3, 4]}),
    }
    model = JoinChowLiu({r: list(df.columns) for r, df in data.items()}, list("ABCDE"))
    model.fit(data)
    assert model.n_samples_seen_ == 10
    np.testing.assert_allclose(
        model.entropy_[list("ABCDE")],
        [0.721928, 1.521928, 0.970951, 1.570951, 1.921928],
        atol=5e-7,
    )
    assert model.tree_.size(weight="weight") == pytest.approx(3.385758, abs=1e-6)
    assert model.tree_.number_of_edges() == 4


def test_pair_tables_in_either_order_and_zero_cells_skipped():
    tables = {
        (): 4.0,
        ("X",): {"a": 2.0, "b": 2.0, "c": 0.0},
        ("Y",): {0: 2.0, 1: 2.0},
        ("Y", "X"): {(0, "a"): 2.0, (1, "b"): 2.0, (1, "c"): 0.0},
    }
    mi = mutual_information_matrix(tables, ["X", "Y"])
    assert mi.loc["X", "Y"] == pytest.approx(1.0)  # X determines Y: 1 bit
    assert mi.loc["X", "X"] == pytest.approx(1.0)
    assert entropy({"a": 3, "b": 1}) == pytest.approx(scipy_entropy([3, 1], base=2))
    assert mutual_information({}, {}, {}, 0.0) == 0.0
    with pytest.raises(ValueError, match="joint count table"):
        mutual_information_matrix({(): 1.0, ("X",): {1: 1.0}, ("Y",): {1: 1.0}})


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6))
def test_chow_liu_is_networkx_maximum_spanning_tree(seed, q):
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.integers(0, 3, (40, q)), columns=[f"v{j}" for j in range(q)])
    frame["v1"] = (frame["v0"] + rng.integers(0, 2, 40)) % 3  # some dependence
    mi = pd.DataFrame(
        [[mutual_info_score(frame[a], frame[b]) / math.log(2) for b in frame] for a in frame],
        index=frame.columns,
        columns=frame.columns,
    )
    tree = chow_liu_tree(mi)
    graph = nx.Graph()
    for i, a in enumerate(mi.columns):
        for b in mi.columns[i + 1 :]:
            graph.add_edge(a, b, weight=mi.loc[a, b])
    expected = nx.maximum_spanning_tree(graph)
    assert nx.is_tree(tree) and set(tree.nodes) == set(mi.columns)
    assert tree.size(weight="weight") == pytest.approx(expected.size(weight="weight"))


@pytest.mark.parametrize("seed", range(12))
def test_chow_liu_ties_go_to_the_earlier_variables_whatever_the_row_order(seed):
    """v1 copies v0, so MI(v0, v2) = MI(v1, v2): the tree followed the last bits of the
    two, which depend on the history of the count tables (the same rows, after other rows
    came and went, gave another tree).  Ties now go to the pair of the earlier variables, as
    networkx's Kruskal does on exactly tied weights listed in that order."""
    from ringml.models import ChowLiuEstimator

    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({f"v{j}": rng.integers(0, 3, 40) for j in range(4)})
    frame["v1"] = frame["v0"]
    names = list(frame.columns)
    exact = [[mutual_info_score(frame[a], frame[b]) / math.log(2) for b in names] for a in names]
    graph = nx.Graph()
    for i, a in enumerate(names):
        for b, weight in zip(names[i + 1 :], exact[i][i + 1 :], strict=True):
            graph.add_edge(a, b, weight=round(weight, 9))  # equal MIs exactly equal
    expected = {frozenset(e) for e in nx.maximum_spanning_tree(graph).edges()}
    other = pd.DataFrame({v: rng.integers(0, 7, 10) for v in names})  # come and go
    for model in (
        ChowLiuEstimator().fit(frame),
        ChowLiuEstimator().fit(frame.iloc[rng.permutation(40)]),
        ChowLiuEstimator().fit(other).partial_fit(frame).delete(other),
    ):
        assert {frozenset(e) for e in model.tree_.edges()} == expected


def test_bins_of_a_range_wider_than_the_largest_float():
    """hi − lo = 2e308 overflowed: (x − lo)/(hi − lo) was inf/inf = NaN, cast to bin −2**63
    (and 0.0 went to bin 0).  Bins now agree with the bin edges, found by exact rational
    arithmetic."""
    from fractions import Fraction

    lo, hi, n_bins = -1e308, 1.5e308, 5
    x = np.array([-1e308, -6e307, -1e300, 0.0, 2e307, 4.9e307, 9e307, 1.4e308, 1.5e308])
    width = (Fraction(hi) - Fraction(lo)) / n_bins
    exact = [min(n_bins - 1, math.floor((Fraction(v) - Fraction(lo)) / width)) for v in x]
    assert equal_width_bins(x, lo, hi, n_bins).tolist() == exact
    binner = EqualWidthBinner(n_bins=n_bins).fit(x[:, None])
    assert binner.transform(x[:, None]).ravel().tolist() == exact
    edges = [float(Fraction(lo) + k * width) for k in range(n_bins + 1)]
    np.testing.assert_allclose(binner.bin_edges(), edges, rtol=1e-15)


def join_of(stream, schemas) -> pd.DataFrame:
    """The materialized join of the database a stream prefix leaves (empty relations for
    relations it has not touched yet)."""
    db = final_state(stream)
    return natural_join({r: db.get(r, pd.DataFrame(columns=c)) for r, c in schemas.items()})


def _oracle_mi(join: pd.DataFrame, names: list[str]) -> np.ndarray:
    out = np.empty((len(names), len(names)))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            out[i, j] = mutual_info_score(join[a], join[b]) / math.log(2)
    return out


def _star(seed: int = 0):
    rng = np.random.default_rng(seed)
    stores = pd.DataFrame(
        {
            "store": np.arange(10),
            "region": rng.choice(["n", "s", "e"], 10),
            "size": rng.uniform(100, 900, 10),
        }
    )
    items = pd.DataFrame({"item": np.arange(15), "family": rng.choice(["a", "b", "c", "d"], 15)})
    n = 200
    store = rng.integers(0, 10, n)
    sales = pd.DataFrame(
        {
            "store": store,
            "item": rng.integers(0, 15, n),
            "promo": (store % 3 + rng.integers(0, 2, n)) % 3,  # depends on the store
            "units": rng.gamma(2.0, 3.0, n).round(2),
        }
    )
    relations = {"Sales": sales, "Stores": stores, "Items": items}
    return relations, {r: list(df.columns) for r, df in relations.items()}


def test_join_mi_matches_sklearn_after_every_batch_with_deletes():
    relations, schemas = _star()
    names = ["region", "family", "promo", "store"]  # a join variable is fine unbinned
    model = JoinChowLiu(schemas, names)
    stream = build_stream(relations, batch_size=25, delete_fraction=0.25, seed=2)
    assert any(b.n_deletes for b in stream)
    for i, batch in enumerate(stream):
        model.partial_fit(batch)
        join = join_of(stream[: i + 1], schemas)
        assert model.n_samples_seen_ == len(join)
        if len(join) == 0:
            continue
        np.testing.assert_allclose(model.mutual_info_.to_numpy(), _oracle_mi(join, names),
                                   atol=1e-10)  # fmt: skip
        for v in names:
            counts = join[v].value_counts().to_numpy()
            assert model.entropy_[v] == pytest.approx(scipy_entropy(counts, base=2), abs=1e-10)


def test_join_mi_with_binned_continuous_and_deletes_in_their_bins():
    relations, schemas = _star(1)
    names = ["region", "promo", "units", "size"]
    model = JoinChowLiu(schemas, names, continuous=["units", "size"], n_bins=10,
                        ranges={"size": (100.0, 900.0)})  # fmt: skip
    stream = build_stream(relations, batch_size=30, delete_fraction=0.3, seed=4)
    for i, batch in enumerate(stream):
        model.partial_fit(batch)  # deletes of binned rows are found: same bins as inserts
        join = join_of(stream[: i + 1], schemas)
        if len(join) == 0:
            continue
        for v in ("units", "size"):
            join[v] = model.bin(v, join[v])
        np.testing.assert_allclose(model.mutual_info_.to_numpy(), _oracle_mi(join, names),
                                   atol=1e-10)  # fmt: skip
    assert model.binners_["size"] == (100.0, 900.0)
    lo, hi = model.binners_["units"]  # fixed by the first Sales batch, never refitted
    first = next(b for b in stream if b.relation == "Sales").rows["units"]
    assert (lo, hi) == (first.min(), first.max())
    assert set(np.unique(model.bin("units", [lo - 5, hi + 5]))) == {0, 9}


def test_join_chow_liu_bad_input_leaves_state_unchanged():
    relations, schemas = _star()
    model = JoinChowLiu(schemas, ["region", "family", "units"], continuous=["units"])
    model.fit({"Stores": relations["Stores"], "Items": relations["Items"]})
    model.partial_fit({"Sales": relations["Sales"].iloc[:50]})
    before = (model.mutual_info_.copy(), model.n_samples_seen_, dict(model.binners_))
    bad = relations["Sales"].iloc[50:60].copy()
    bad.loc[bad.index[0], "units"] = np.nan
    with pytest.raises(ValueError, match="finite"):
        model.partial_fit({"Sales": bad})
    with pytest.raises(ValueError):  # deleting rows never inserted
        model.delete({"Sales": relations["Sales"].iloc[100:110]})
    with pytest.raises(ValueError):
        model.partial_fit({"Nope": relations["Sales"].iloc[:3]})
    pd.testing.assert_frame_equal(model.mutual_info_, before[0])
    assert (model.n_samples_seen_, model.binners_) == before[1:]
    with pytest.raises(ValueError, match="non-join"):
        JoinChowLiu(schemas, ["store"], continuous=["store"]).fit()
    with pytest.raises(ValueError, match="not columns"):
        JoinChowLiu(schemas, ["nope"]).fit()


def test_join_chow_liu_warns_when_a_batch_of_one_value_fixes_the_bins():
    schemas = {"S": ["k", "price", "band"], "T": ["k", "t"]}
    first = pd.DataFrame({"k": [0], "price": [38.0], "band": [0]})
    model = JoinChowLiu(schemas, continuous=["price"], n_bins=10)
    with pytest.warns(UserWarning, match=r"ranges=\{'price'"):
        model.fit({"T": pd.DataFrame({"k": [0], "t": [1.0]}), "S": first})
    model.partial_fit({"S": pd.DataFrame({"k": [0, 0], "price": [10.0, 90.0], "band": [0, 1]})})
    np.testing.assert_array_equal(model.bin("price", [0.0, 38.0, 50.0, 100.0]), [0, 0, 9, 9])
    assert model.mutual_info_.loc["price", "band"] > 0.5  # band follows price's two bins


# -------------------------------------------------------------------------- binning
def test_equal_width_bins_formula():
    x = np.array([0.0, 0.5, 0.999, 1.0, 9.99, 10.0, -3.0, 14.0])
    np.testing.assert_array_equal(equal_width_bins(x, 0.0, 10.0, 100), [0, 5, 9, 10, 99, 99, 0, 99])
    # a range of one value: clipped like any other (values above it used to land in bin 0)
    np.testing.assert_array_equal(equal_width_bins(x, 2.0, 2.0, 100), [0, 0, 0, 0, 99, 99, 0, 99])
    binner = EqualWidthBinner(n_bins=4).fit([[0.0, 5.0], [8.0, 5.0]])
    np.testing.assert_array_equal(binner.transform([[1.0, 5.0], [2.0, 7.0], [8.0, 1.0]]),
                                  [[0, 0], [1, 3], [3, 0]])  # fmt: skip
    np.testing.assert_allclose(binner.bin_edges(0), [0, 2, 4, 6, 8])
    fixed = EqualWidthBinner(n_bins=2, ranges=[(0.0, 1.0)]).fit([[100.0]])
    assert fixed.transform([[0.7]])[0, 0] == 1
    with pytest.raises(ValueError):
        EqualWidthBinner().fit([[np.nan]])
    with pytest.raises(ValueError, match="n_bins"):
        EqualWidthBinner(n_bins=0).fit([[1.0]])


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30),
    st.lists(st.floats(-2e6, 2e6), min_size=1, max_size=30),
    st.integers(1, 120),
)
def test_bins_are_fixed_in_range_and_monotone(train, later, n_bins):
    binner = EqualWidthBinner(n_bins=n_bins).fit(np.asarray(train)[:, None])
    values = np.sort(np.asarray(later))
    bins = binner.transform(values[:, None])[:, 0]
    assert bins.min() >= 0 and bins.max() <= n_bins - 1
    assert np.all(np.diff(bins) >= 0)
    # the same value always lands in the same bin, whatever batch it comes in
    np.testing.assert_array_equal(binner.transform(values[::-1, None])[::-1, 0], bins)
