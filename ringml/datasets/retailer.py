"""A seeded generator for a Retailer-like snowflake (notes §11.2).

Schema (names after the F-IVM reference queries)::

    Inventory(locn, dateid, ksn, inventoryunits)                       fact
    Location(locn, zip, rgn_cd, clim_zn_nbr, tot_area_sq_ft, sell_area_sq_ft, avghhi,
             supertargetdistance, supertargetdrivetime, targetdistance, targetdrivetime,
             walmartdistance, walmartdrivetime, walmartsupercenterdistance,
             walmartsupercenterdrivetime)
    Census(zip, population, white, asian, pacific, blackafrican, medianage,
           occupiedhouseunits, houseunits, families, households, husbwife, males, females,
           householdschildren, hispanic)
    Item(ksn, subcategory, category, categoryCluster, prize)
    Weather(locn, dateid, rain, snow, maxtemp, mintemp, meanwind, thunder)

39 non-join variables: 33 continuous and 6 categorical (subcategory, category,
categoryCluster, rain, snow, thunder), as in the paper.  Join variables
locn, dateid, ksn, zip with the paper's variable order
``locn – { dateid – { ksn }, zip }``, i.e.
``locn{ dateid{ ksn{ Inventory, Item }, Weather }, zip{ Location, Census } }``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._base import Dataset

__all__ = [
    "RETAILER_CATEGORICAL",
    "RETAILER_CONTINUOUS",
    "RETAILER_SCHEMA",
    "RETAILER_VARIABLE_ORDER",
    "retailer_snowflake",
]

RETAILER_SCHEMA: dict[str, list[str]] = {
    "Inventory": ["locn", "dateid", "ksn", "inventoryunits"],
    "Location": [
        "locn", "zip", "rgn_cd", "clim_zn_nbr", "tot_area_sq_ft", "sell_area_sq_ft", "avghhi",
        "supertargetdistance", "supertargetdrivetime", "targetdistance", "targetdrivetime",
        "walmartdistance", "walmartdrivetime", "walmartsupercenterdistance",
        "walmartsupercenterdrivetime",
    ],
    "Census": [
        "zip", "population", "white", "asian", "pacific", "blackafrican", "medianage",
        "occupiedhouseunits", "houseunits", "families", "households", "husbwife", "males",
        "females", "householdschildren", "hispanic",
    ],
    "Item": ["ksn", "subcategory", "category", "categoryCluster", "prize"],
    "Weather": ["locn", "dateid", "rain", "snow", "maxtemp", "mintemp", "meanwind", "thunder"],
}  # fmt: skip

RETAILER_JOIN_VARIABLES = ["locn", "dateid", "ksn", "zip"]
RETAILER_CATEGORICAL = ["subcategory", "category", "categoryCluster", "rain", "snow", "thunder"]
RETAILER_CONTINUOUS = [
    c
    for cols in RETAILER_SCHEMA.values()
    for c in cols
    if c not in RETAILER_JOIN_VARIABLES and c not in RETAILER_CATEGORICAL
]
RETAILER_VARIABLE_ORDER = "locn – { dateid – { ksn }, zip }"


def retailer_snowflake(
    locations: int = 50,
    dates: int = 30,
    items: int = 200,
    seed: int = 0,
    inventory_rows: int = 20_000,
    zips: int | None = None,
) -> Dataset:
    """Generate a Retailer-like snowflake in which every Inventory row joins.

    Dimension keys are dense: ``locn`` in ``0..locations-1``, ``dateid`` in
    ``0..dates-1``, ``ksn`` in ``0..items-1``, ``zip`` in ``0..zips-1``.  Location has one
    row per ``locn``, Census one per ``zip``, Item one per ``ksn``, Weather one per
    ``(locn, dateid)`` (the full grid).  Inventory holds ``inventory_rows`` distinct
    ``(locn, dateid, ksn)`` triples drawn uniformly from the grid, sorted in the
    variable order, so the natural join has exactly ``inventory_rows`` rows.

    ``zips`` defaults to ``locations`` with a bijective ``locn <-> zip`` assignment
    (so both FDs ``locn -> zip`` and ``zip -> locn`` hold, cf. notes §11.3); with
    ``zips < locations`` zips are shared, with ``zips > locations`` some Census rows dangle.
    Join keys are int64, categorical values small int64 codes, continuous ones float64.
    """
    L, D, I = int(locations), int(dates), int(items)
    Z = L if zips is None else int(zips)
    if min(L, D, I, Z) < 1:
        raise ValueError("locations, dates, items and zips must be >= 1")
    grid = L * D * I
    if not 0 <= inventory_rows <= grid:
        raise ValueError(f"inventory_rows must be in [0, {grid}] (locations*dates*items)")
    rng = np.random.default_rng(seed)
    rel: dict[str, pd.DataFrame] = {}

    # Census: one row per zip.
    pop = np.rint(rng.lognormal(np.log(25000.0), 0.6, Z))
    shares = rng.dirichlet([6.0, 1.0, 0.2, 1.5, 1.3], Z)  # white, asian, pacific, black, other
    households = np.rint(pop / rng.uniform(2.2, 3.0, Z))
    houseunits = np.rint(households * rng.uniform(1.02, 1.15, Z))
    families = np.rint(households * rng.uniform(0.55, 0.75, Z))
    males = np.rint(pop * rng.uniform(0.47, 0.52, Z))
    rel["Census"] = pd.DataFrame(
        {
            "zip": np.arange(Z, dtype=np.int64),
            "population": pop,
            "white": np.rint(pop * shares[:, 0]),
            "asian": np.rint(pop * shares[:, 1]),
            "pacific": np.rint(pop * shares[:, 2]),
            "blackafrican": np.rint(pop * shares[:, 3]),
            "medianage": np.round(rng.normal(38.0, 5.0, Z).clip(20.0, 70.0), 1),
            "occupiedhouseunits": households,
            "houseunits": houseunits,
            "families": families,
            "households": households,
            "husbwife": np.rint(families * rng.uniform(0.6, 0.85, Z)),
            "males": males,
            "females": pop - males,
            "householdschildren": np.rint(households * rng.uniform(0.25, 0.45, Z)),
            "hispanic": np.rint(pop * rng.beta(1.2, 6.0, Z)),
        }
    )

    # Location: one row per locn, with a zip.
    zip_of = rng.permutation(Z)[:L] if Z >= L else rng.integers(0, Z, L)
    tot_area = np.rint(rng.lognormal(np.log(120000.0), 0.35, L))

    def dist_time(scale: float) -> tuple[np.ndarray, np.ndarray]:
        dist = np.round(rng.gamma(2.0, scale, L), 2)
        return dist, np.round(dist * rng.uniform(1.1, 1.8, L) + rng.uniform(1.0, 4.0, L), 2)

    st_d, st_t = dist_time(4.0)
    t_d, t_t = dist_time(3.0)
    w_d, w_t = dist_time(3.5)
    ws_d, ws_t = dist_time(6.0)
    rel["Location"] = pd.DataFrame(
        {
            "locn": np.arange(L, dtype=np.int64),
            "zip": zip_of.astype(np.int64),
            "rgn_cd": rng.integers(1, 9, L).astype(np.float64),
            "clim_zn_nbr": rng.integers(1, 10, L).astype(np.float64),
            "tot_area_sq_ft": tot_area,
            "sell_area_sq_ft": np.rint(tot_area * rng.uniform(0.65, 0.85, L)),
            "avghhi": np.rint(rng.lognormal(np.log(60000.0), 0.3, L)),
            "supertargetdistance": st_d,
            "supertargetdrivetime": st_t,
            "targetdistance": t_d,
            "targetdrivetime": t_t,
            "walmartdistance": w_d,
            "walmartdrivetime": w_t,
            "walmartsupercenterdistance": ws_d,
            "walmartsupercenterdrivetime": ws_t,
        }
    )

    # Item: a cluster > category > subcategory hierarchy (FDs subcategory -> category -> cluster).
    n_sub = max(1, min(I, 60))
    sub_to_cat = np.sort(rng.integers(0, max(1, n_sub // 3), n_sub))
    cat_to_cluster = rng.integers(0, 8, int(sub_to_cat.max()) + 1)
    sub = rng.integers(0, n_sub, I)
    rel["Item"] = pd.DataFrame(
        {
            "ksn": np.arange(I, dtype=np.int64),
            "subcategory": sub.astype(np.int64),
            "category": sub_to_cat[sub].astype(np.int64),
            "categoryCluster": cat_to_cluster[sub_to_cat[sub]].astype(np.int64),
            "prize": np.round(rng.lognormal(np.log(8.0), 0.8, I), 2),
        }
    )

    # Weather: one row per (locn, dateid), seasonal temperatures plus a per-location offset.
    w_locn = np.repeat(np.arange(L, dtype=np.int64), D)
    w_date = np.tile(np.arange(D, dtype=np.int64), L)
    n = L * D
    season = 12.0 * np.sin(2 * np.pi * (w_date / 365.0 - 0.25))
    maxtemp = np.round(18.0 + season + rng.normal(0, 6.0, L)[w_locn] + rng.normal(0, 3.0, n), 1)
    rain = (rng.random(n) < 0.3).astype(np.int64)
    rel["Weather"] = pd.DataFrame(
        {
            "locn": w_locn,
            "dateid": w_date,
            "rain": rain,
            "snow": ((maxtemp < 3.0) & (rng.random(n) < 0.5)).astype(np.int64),
            "maxtemp": maxtemp,
            "mintemp": np.round(maxtemp - rng.gamma(4.0, 2.0, n), 1),
            "meanwind": np.round(rng.gamma(3.0, 3.0, n), 1),
            "thunder": (rain.astype(bool) & (rng.random(n) < 0.2)).astype(np.int64),
        }
    )

    # Inventory: distinct triples, sorted by (locn, dateid, ksn) since code = (l*D + d)*I + i.
    code = np.sort(rng.choice(grid, size=inventory_rows, replace=False)).astype(np.int64)
    ksn = code % I
    ld = code // I
    locn, dateid = ld // D, ld % D
    lam = 3.0 + 20.0 / rel["Item"]["prize"].to_numpy()[ksn].clip(0.5, None)
    rel["Inventory"] = pd.DataFrame(
        {
            "locn": locn,
            "dateid": dateid,
            "ksn": ksn,
            "inventoryunits": rng.poisson(np.minimum(lam, 60.0)).astype(np.float64),
        }
    )

    rel = {r: rel[r][cols] for r, cols in RETAILER_SCHEMA.items()}
    return Dataset(
        name="retailer_snowflake",
        relations=rel,
        join_variables=list(RETAILER_JOIN_VARIABLES),
        continuous=list(RETAILER_CONTINUOUS),
        categorical=list(RETAILER_CATEGORICAL),
        label="inventoryunits",
        description=(
            f"Synthetic Retailer snowflake (seed {seed}): {L} locations, {D} dates, {I} items, "
            f"{Z} zips, {inventory_rows} Inventory rows, all joining (join size = |Inventory|). "
            "33 continuous + 6 categorical non-join variables. Variable order "
            f"{RETAILER_VARIABLE_ORDER}. In the q-hierarchical experiments Item is non-updatable."
        ),
        variable_order=RETAILER_VARIABLE_ORDER,
        extra={"non_updatable": ["Item"]},
    )
