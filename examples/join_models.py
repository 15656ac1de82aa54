"""Fresh models over a changing join, through scikit-learn style estimators.

Run: ``python examples/join_models.py``.  A linear model of ``units`` and a Chow-Liu tree
are kept fresh over Sales ⋈ Stores ⋈ Items while batches of inserts and deletes arrive; the
join is never materialized.  At the end both are checked against scikit-learn and networkx
on the materialized join.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pandas as pd
from ringml.models import JoinChowLiu, JoinRegressor
from sklearn.linear_model import Ridge
from sklearn.metrics import mutual_info_score

RIDGE = 0.01  # per join row: scikit-learn's Ridge(alpha=RIDGE * rows)


def make_data(rng: np.random.Generator) -> dict[str, pd.DataFrame]:
    stores = pd.DataFrame(
        {
            "store": range(40),
            "size": rng.uniform(100, 900, 40).round(1),
            "region": rng.choice(["north", "south", "east"], 40),
        }
    )
    items = pd.DataFrame(
        {
            "item": range(120),
            "price": rng.lognormal(1.0, 0.5, 120).round(2),
            "family": rng.choice(["food", "drink", "home"], 120),
        }
    )
    sales = pd.DataFrame(
        {
            "store": rng.integers(0, 40, 6000),
            "item": rng.integers(0, 120, 6000),
            "promo": rng.integers(0, 2, 6000),
        }
    )
    size = stores.set_index("store")["size"].reindex(sales["store"]).to_numpy()
    sales["units"] = (2.0 + 0.004 * size + 3.0 * sales["promo"] + rng.normal(0, 1, 6000)).round(2)
    return {"Sales": sales, "Stores": stores, "Items": items}


def main() -> None:
    data = make_data(np.random.default_rng(11))
    schemas = {name: list(frame.columns) for name, frame in data.items()}
    features = ["size", "price", "promo", "region", "family"]
    model = JoinRegressor(schemas, "units", features, categorical=["region", "family"], ridge=RIDGE)
    tree = JoinChowLiu(schemas, ["region", "family", "promo", "units"], continuous=["units"],
                       n_bins=8, ranges={"units": (0.0, 20.0)})  # fmt: skip

    # the dimension tables first, then the sales in batches of 1000; every third batch
    # also takes back half of the batch before it (returns)
    dims = {"Stores": data["Stores"], "Items": data["Items"]}
    model.partial_fit(dims)
    tree.partial_fit(dims)
    sales, kept = data["Sales"], []
    for start in range(0, len(sales), 1000):
        batch = sales.iloc[start : start + 1000]
        model.partial_fit({"Sales": batch})
        tree.partial_fit({"Sales": batch})
        kept.append(batch)
        if start // 1000 % 3 == 2:
            returned = kept[-2].iloc[::2]
            model.delete({"Sales": returned})
            tree.delete({"Sales": returned})
            kept[-2] = kept[-2].drop(returned.index)
        print(
            f"after {start + len(batch):>5} sales: {model.n_samples_seen_:>5} join rows, "
            f"R² on the join {model.score(_join(kept, data)):.3f}, "
            f"{model.n_iter_:>3} GD iterations (warm start)"
        )

    flat = _join(kept, data)
    print("\ncoefficients:")
    for column, value in zip(model.columns_, model.coef_, strict=True):
        name = column if isinstance(column, str) else f"{column[0]}={column[1]}"
        print(f"  {name:<14} {value:>9.4f}")
    X = pd.get_dummies(flat[features], columns=["region", "family"], drop_first=True)
    sk = Ridge(alpha=RIDGE * len(flat)).fit(X.astype(float), flat["units"])
    gap = np.max(np.abs(model.predict(flat) - sk.predict(X.astype(float)))) / flat["units"].std()
    print(f"predictions vs scikit-learn's Ridge on the materialized join: max gap {gap:.1e} SDs")
    assert gap < 1e-6

    names = list(tree.variables_)
    binned = flat.assign(units=tree.bin("units", flat["units"]))
    graph = nx.Graph()
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            graph.add_edge(a, b, weight=mutual_info_score(binned[a], binned[b]) / math.log(2))
    expected = {frozenset(e) for e in nx.maximum_spanning_tree(graph).edges()}
    print("Chow-Liu tree:", sorted(tuple(sorted(e)) for e in tree.tree_.edges()))
    assert {frozenset(e) for e in tree.tree_.edges()} == expected
    print("the same tree as networkx on scikit-learn's mutual information of the join")


def _join(sales_batches: list[pd.DataFrame], data: dict[str, pd.DataFrame]) -> pd.DataFrame:
    sales = pd.concat(sales_batches, ignore_index=True)
    return sales.merge(data["Stores"], on="store").merge(data["Items"], on="item")


if __name__ == "__main__":
    main()
