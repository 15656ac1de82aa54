"""A seeded generator for a Favorita-like star (notes §11.2).

Schema (names follow the Kaggle files; the F-IVM reference queries call
``stype``/``htype``/``dcoilwtico`` ``store_type``/``holiday_type``/``oilprize``, see
:data:`FAVORITA_PAPER_NAMES`)::

    Sales(date, store, item, unit_sales, onpromotion)              fact
    Stores(store, city, state, stype, cluster)
    Items(item, family, itemclass, perishable)
    Transactions(date, store, transactions)
    Holidays(date, htype, locale, locale_id, transferred)
    Oil(date, dcoilwtico)

15 non-join variables as in the paper: 3 continuous (unit_sales, transactions,
dcoilwtico) and 12 categorical (onpromotion, city, state, stype, cluster, family,
itemclass, perishable, htype, locale, locale_id, transferred).  Join variables
date, store, item with the paper's order ``date – store – item``, i.e.
``date{ store{ item{ Sales, Items }, Transactions, Stores }, Oil, Holidays }``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._base import Dataset

__all__ = [
    "FAVORITA_CATEGORICAL",
    "FAVORITA_CONTINUOUS",
    "FAVORITA_PAPER_NAMES",
    "FAVORITA_SCHEMA",
    "FAVORITA_VARIABLE_ORDER",
    "favorita_star",
]

FAVORITA_SCHEMA: dict[str, list[str]] = {
    "Sales": ["date", "store", "item", "unit_sales", "onpromotion"],
    "Stores": ["store", "city", "state", "stype", "cluster"],
    "Items": ["item", "family", "itemclass", "perishable"],
    "Transactions": ["date", "store", "transactions"],
    "Holidays": ["date", "htype", "locale", "locale_id", "transferred"],
    "Oil": ["date", "dcoilwtico"],
}
FAVORITA_JOIN_VARIABLES = ["date", "store", "item"]
FAVORITA_CONTINUOUS = ["unit_sales", "transactions", "dcoilwtico"]
FAVORITA_CATEGORICAL = [
    c
    for cols in FAVORITA_SCHEMA.values()
    for c in cols
    if c not in FAVORITA_JOIN_VARIABLES and c not in FAVORITA_CONTINUOUS
]
FAVORITA_VARIABLE_ORDER = "date – store – item"
#: Our column name -> the name in the F-IVM reference queries, where they differ.
FAVORITA_PAPER_NAMES = {"stype": "store_type", "htype": "holiday_type", "dcoilwtico": "oilprize"}


def favorita_star(
    dates: int = 60,
    stores: int = 20,
    items: int = 300,
    seed: int = 0,
    sales_rows: int = 20_000,
) -> Dataset:
    """Generate a Favorita-like star in which every Sales row joins.

    Keys are dense int64 (``date`` in ``0..dates-1`` etc.).  Stores/Items have one row
    per key; Transactions one per ``(date, store)`` (the full grid); Holidays and Oil one
    per date (``htype == 0`` means an ordinary day), so the natural join has exactly
    ``sales_rows`` rows.  Sales holds distinct ``(date, store, item)`` triples sorted in
    the variable order.  Categorical values are small int64 codes (FDs
    ``city -> state``, ``itemclass -> family``), continuous ones float64.
    """
    D, S, I = int(dates), int(stores), int(items)
    if min(D, S, I) < 1:
        raise ValueError("dates, stores and items must be >= 1")
    grid = D * S * I
    if not 0 <= sales_rows <= grid:
        raise ValueError(f"sales_rows must be in [0, {grid}] (dates*stores*items)")
    rng = np.random.default_rng(seed)
    rel: dict[str, pd.DataFrame] = {}

    n_city = max(1, min(S, 22))
    city_state = rng.integers(0, max(1, (n_city * 2) // 3), n_city)
    city = rng.integers(0, n_city, S)
    rel["Stores"] = pd.DataFrame(
        {
            "store": np.arange(S, dtype=np.int64),
            "city": city.astype(np.int64),
            "state": city_state[city].astype(np.int64),
            "stype": rng.choice(5, S, p=[0.15, 0.25, 0.35, 0.15, 0.10]).astype(np.int64),
            "cluster": rng.integers(0, 17, S).astype(np.int64),
        }
    )

    n_class = max(1, min(I, 300))
    class_family = rng.integers(0, 33, n_class)
    family_perishable = rng.random(33) < 0.3
    itemclass = rng.integers(0, n_class, I)
    family = class_family[itemclass]
    rel["Items"] = pd.DataFrame(
        {
            "item": np.arange(I, dtype=np.int64),
            "family": family.astype(np.int64),
            "itemclass": itemclass.astype(np.int64),
            "perishable": family_perishable[family].astype(np.int64),
        }
    )

    d_idx = np.arange(D, dtype=np.int64)
    weekday = d_idx % 7
    store_size = rng.lognormal(np.log(1500.0), 0.4, S)
    t_date = np.repeat(d_idx, S)
    t_store = np.tile(np.arange(S, dtype=np.int64), D)
    weekend = 1.0 + 0.25 * (weekday[t_date] >= 5)
    rel["Transactions"] = pd.DataFrame(
        {
            "date": t_date,
            "store": t_store,
            "transactions": rng.poisson(store_size[t_store] * weekend).astype(np.float64),
        }
    )

    is_holiday = rng.random(D) < 0.08
    htype = np.where(is_holiday, rng.integers(1, 6, D), 0)
    locale = np.where(is_holiday, rng.choice(3, D, p=[0.5, 0.2, 0.3]) + 1, 0)
    rel["Holidays"] = pd.DataFrame(
        {
            "date": d_idx,
            "htype": htype.astype(np.int64),
            "locale": locale.astype(np.int64),
            "locale_id": np.where(is_holiday, rng.integers(1, 25, D), 0).astype(np.int64),
            "transferred": (is_holiday & (rng.random(D) < 0.05)).astype(np.int64),
        }
    )

    oil = 50.0 + np.cumsum(rng.normal(0.0, 1.0, D))
    rel["Oil"] = pd.DataFrame({"date": d_idx, "dcoilwtico": np.round(np.clip(oil, 10.0, None), 2)})

    code = np.sort(rng.choice(grid, size=sales_rows, replace=False)).astype(np.int64)
    item = code % I
    ds = code // I
    date, store = ds // S, ds % S
    promo = (rng.random(sales_rows) < 0.1).astype(np.int64)
    popularity = rng.lognormal(np.log(4.0), 1.0, I)
    mean_sales = popularity[item] * (1.0 + 0.8 * promo) * (store_size[store] / 1500.0)
    unit_sales = rng.gamma(2.0, mean_sales / 2.0)
    unit_sales = np.where(
        rel["Items"]["perishable"].to_numpy()[item] == 1, unit_sales, np.rint(unit_sales)
    )
    rel["Sales"] = pd.DataFrame(
        {
            "date": date,
            "store": store,
            "item": item,
            "unit_sales": np.round(unit_sales, 3),
            "onpromotion": promo,
        }
    )

    rel = {r: rel[r][cols] for r, cols in FAVORITA_SCHEMA.items()}
    return Dataset(
        name="favorita_star",
        relations=rel,
        join_variables=list(FAVORITA_JOIN_VARIABLES),
        continuous=list(FAVORITA_CONTINUOUS),
        categorical=list(FAVORITA_CATEGORICAL),
        label="unit_sales",
        description=(
            f"Synthetic Favorita star (seed {seed}): {D} dates, {S} stores, {I} items, "
            f"{sales_rows} Sales rows, all joining (join size = |Sales|). 3 continuous "
            "(unit_sales, transactions, dcoilwtico) + 12 categorical non-join variables. "
            f"Variable order {FAVORITA_VARIABLE_ORDER}. In the q-hierarchical experiments "
            "Stores is non-updatable."
        ),
        variable_order=FAVORITA_VARIABLE_ORDER,
        extra={"non_updatable": ["Stores"], "paper_names": dict(FAVORITA_PAPER_NAMES)},
    )
