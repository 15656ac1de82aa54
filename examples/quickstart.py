"""Keep a covariance matrix fresh over a three-relation join under inserts and deletes.

Run: ``python examples/quickstart.py``.  The join is never materialized: each batch travels
up F-IVM's view tree once.  The result is checked against numpy on the flat join.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

import ringml as rm


def main() -> None:
    rng = np.random.default_rng(7)
    stores = pd.DataFrame({"store": range(50), "size": rng.uniform(100, 900, 50)})
    items = pd.DataFrame({"item": range(200), "price": rng.lognormal(1.0, 0.5, 200)})
    sales = pd.DataFrame(
        {
            "store": rng.integers(0, 50, 5000),
            "item": rng.integers(0, 200, 5000),
            "units": rng.poisson(4.0, 5000).astype(float),
        }
    )
    relations = {
        "Sales": ["store", "item", "units"],
        "Stores": ["store", "size"],
        "Items": ["item", "price"],
    }
    query = rm.covariance_query(relations)  # features: the non-join variables
    m = rm.Maintainer(query)
    m.insert("Stores", stores)
    m.insert("Items", items)
    for start in range(0, len(sales), 1000):  # stream sales in batches
        m.insert("Sales", sales.iloc[start : start + 1000])
    m.delete("Sales", sales.iloc[:1500])  # retract the first 1500 sales
    m.update("Items", items.iloc[:1], items.iloc[:1].assign(price=99.0))  # reprice one item

    print(m.explain())
    stats = query.ring.statistics(m.result())
    features = list(query.ring.variables)
    print(f"\njoin rows: {stats.count}")
    print(pd.DataFrame(stats.covariance, index=features, columns=features).round(3))

    items.loc[0, "price"] = 99.0
    flat = sales.iloc[1500:].merge(stores, on="store").merge(items, on="item")[features]
    assert stats.count == len(flat)
    assert np.allclose(stats.covariance, np.cov(flat.to_numpy().T, bias=True), rtol=1e-9)
    print("\nchecked against numpy on the materialized join: equal to 1e-9")


if __name__ == "__main__":
    main()
