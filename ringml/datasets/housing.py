"""The Housing dataset: the real (normalised, scale 1) files and a seeded star generator.

Housing is a star schema of six relations joined on ``postcode``
(notes §11.2; data README).  The papers split its 26 non-join variables into
14 continuous and 12 categorical without naming them; we pick the 12 variables
whose domain in the scale-1 data has at most 12 distinct values (counted on the
files):

========================  ==========  =============================================
variable                  distinct    role
========================  ==========  =============================================
house, flat, unknown      2 each      property-type indicators
sainsburys, tesco, ms     2 each      supermarket indicators
pricerangeshop            3
pricerangerest            3
nbbedrooms, nbbathrooms   10 each
parking                   11
typeeducation             12
========================  ==========  =============================================

The next smallest domains are 17 (openinghours*), 20 (nbbuslines,
nbtrainstations) and >= 51 values, which stay continuous.  Every variable is
numeric, so an all-continuous covariance over the 26 variables also works.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from ._base import Dataset

__all__ = [
    "HOUSING_CATEGORICAL",
    "HOUSING_CONTINUOUS",
    "HOUSING_DEFAULT_ROWS_PER_POSTCODE",
    "HOUSING_SCHEMA",
    "housing_star",
    "load_housing",
]

#: Relation -> columns (schema order), as in the data README and the reference queries.
HOUSING_SCHEMA: dict[str, list[str]] = {
    "House": [
        "postcode", "livingarea", "price", "nbbedrooms", "nbbathrooms", "kitchensize",
        "house", "flat", "unknown", "garden", "parking",
    ],
    "Shop": ["postcode", "openinghoursshop", "pricerangeshop", "sainsburys", "tesco", "ms"],
    "Institution": ["postcode", "typeeducation", "sizeinstitution"],
    "Restaurant": ["postcode", "openinghoursrest", "pricerangerest"],
    "Demographics": ["postcode", "averagesalary", "crimesperyear", "unemployment", "nbhospitals"],
    "Transport": ["postcode", "nbbuslines", "nbtrainstations", "distancecitycentre"],
}  # fmt: skip

#: The 12 small-domain (<= 12 distinct values) variables, in schema order.
HOUSING_CATEGORICAL: list[str] = [
    "nbbedrooms", "nbbathrooms", "house", "flat", "unknown", "parking",
    "pricerangeshop", "sainsburys", "tesco", "ms", "typeeducation", "pricerangerest",
]  # fmt: skip

#: The other 14 non-join variables, in schema order.
HOUSING_CONTINUOUS: list[str] = [
    c for cols in HOUSING_SCHEMA.values() for c in cols[1:] if c not in HOUSING_CATEGORICAL
]

#: Rows per postcode per relation of :func:`housing_star` (join = 200 rows per postcode).
HOUSING_DEFAULT_ROWS_PER_POSTCODE: dict[str, int] = {
    "House": 10, "Shop": 5, "Institution": 2, "Restaurant": 2, "Demographics": 1, "Transport": 1,
}  # fmt: skip

_DIRNAME = "housing-1-normalised"
_VARIABLE_ORDER = "postcode – { one root-to-leaf path per relation's non-join variables }"


def _candidate_dirs(path: str | os.PathLike[str] | None) -> list[Path]:
    """Where to look for the Housing files, in order."""
    if path is not None:
        p = Path(path)
        return [p, p / _DIRNAME]
    out: list[Path] = []
    env = os.environ.get("RINGML_DATA")
    if env:
        out += [Path(env) / _DIRNAME, Path(env)]
    repo_root = Path(__file__).resolve().parents[2]
    for anc in [repo_root, *repo_root.parents]:
        out.append(anc / "shared" / "data" / _DIRNAME)
    return out


def _locate(path: str | os.PathLike[str] | None) -> Path:
    tried = _candidate_dirs(path)
    for d in tried:
        if all((d / f"{rel}.tbl").is_file() for rel in HOUSING_SCHEMA):
            return d
    files = ", ".join(f"{r}.tbl" for r in HOUSING_SCHEMA)
    raise FileNotFoundError(
        f"Housing data ({files}) not found; looked in: "
        + ", ".join(str(d) for d in tried)
        + ". Pass path=... or set RINGML_DATA to the data folder."
    )


def load_housing(
    path: str | os.PathLike[str] | None = None, *, integer_keys: bool = False
) -> Dataset:
    """Load the real Housing data (scale 1, normalised): 6 relations x 25,000 rows.

    Args:
        path: the ``housing-1-normalised`` folder or its parent.  Default: the env var
            ``RINGML_DATA`` (folder or parent), else ``shared/data/housing-1-normalised``
            next to the repository root (or any ancestor of it).
        integer_keys: replace the (float, normalised) postcodes with dense int64 codes
            ``0..24999``, consistently across relations.

    Raises:
        FileNotFoundError: naming every folder that was looked at.
    """
    folder = _locate(path)
    relations: dict[str, pd.DataFrame] = {}
    for rel, cols in HOUSING_SCHEMA.items():
        df = pd.read_csv(
            folder / f"{rel}.tbl",
            sep="|",
            header=None,
            names=[*cols, "_trailing"],
            usecols=cols,
            dtype=dict.fromkeys(cols, np.float64),
            float_precision="round_trip",
        )
        relations[rel] = df[cols]
    if integer_keys:
        keys = np.unique(np.concatenate([df["postcode"].to_numpy() for df in relations.values()]))
        for df in relations.values():
            df["postcode"] = np.searchsorted(keys, df["postcode"].to_numpy()).astype(np.int64)
    return Dataset(
        name="housing",
        relations=relations,
        join_variables=["postcode"],
        continuous=list(HOUSING_CONTINUOUS),
        categorical=list(HOUSING_CATEGORICAL),
        label="price",
        description=(
            f"Housing (synthetic house-price market), scale 1, from {folder}: star schema of six "
            "relations on postcode, one row per postcode each (join = 25,000 rows), values "
            "normalised to [0, 1]. 26 non-join variables: 14 continuous + 12 categorical "
            "(categorical = domain of at most 12 values). Label: price."
        ),
        variable_order=_VARIABLE_ORDER,
        extra={"path": str(folder)},
    )


def housing_star(
    postcodes: int = 1000,
    rows_per_postcode: Mapping[str, int] | None = None,
    seed: int = 0,
) -> Dataset:
    """Generate a Housing-like star database (same relations and columns as the real data).

    Each relation holds ``rows_per_postcode[R]`` rows for every postcode ``0..postcodes-1``
    (defaults :data:`HOUSING_DEFAULT_ROWS_PER_POSTCODE`, merged with the argument), so the
    join has ``postcodes * prod(rows_per_postcode)`` rows (200 per postcode by default).
    Values are in natural units (m², £, counts); categorical columns are small int64
    domains, continuous ones float64.  ``price`` depends on living area, bedrooms, the
    postcode's salary level and distance to the centre, so regression has signal.
    """
    if postcodes < 0:
        raise ValueError("postcodes must be >= 0")
    k = dict(HOUSING_DEFAULT_ROWS_PER_POSTCODE)
    if rows_per_postcode is not None:
        unknown = set(rows_per_postcode) - set(k)
        if unknown:
            raise KeyError(f"unknown relations {sorted(unknown)}; expected {sorted(k)}")
        k.update({r: int(n) for r, n in rows_per_postcode.items()})
    if any(n < 0 for n in k.values()):
        raise ValueError("rows_per_postcode must be >= 0")
    rng = np.random.default_rng(seed)
    P = postcodes

    # Postcode-level latent factors shared by several relations.
    wealth = rng.normal(0.0, 1.0, P)  # affluence of the area
    centre_km = rng.gamma(2.0, 4.0, P)  # distance to the city centre
    urban = np.exp(-centre_km / 8.0)  # 1 in the centre, -> 0 far out

    def keyed(rel: str) -> tuple[np.ndarray, np.ndarray]:
        idx = np.repeat(np.arange(P, dtype=np.int64), k[rel])
        return idx, idx  # postcode column and the index into postcode-level arrays

    relations: dict[str, pd.DataFrame] = {}

    pc, i = keyed("House")
    n = len(pc)
    ptype = rng.choice(3, n, p=[0.55, 0.35, 0.10])  # house / flat / unknown
    living = np.clip(rng.lognormal(np.log(85.0) + 0.25 * (ptype == 0), 0.35, n), 20.0, 500.0)
    bedrooms = np.clip(np.rint(living / 28.0 + rng.normal(0, 0.7, n)), 1, 10).astype(np.int64)
    bathrooms = np.clip(np.rint(bedrooms / 2.0 + rng.normal(0, 0.5, n)), 1, 10).astype(np.int64)
    kitchen = np.round(np.clip(4.0 + 0.09 * living + rng.normal(0, 2.0, n), 3.0, 60.0), 1)
    garden = np.where(ptype == 1, 0.0, np.round(rng.gamma(2.0, 60.0 * (1.2 - urban[i]), n), 1))
    parking = np.minimum(rng.poisson(0.5 + 1.5 * (ptype == 0), n), 10).astype(np.int64)
    price = (
        2500.0 * living * np.exp(0.25 * wealth[i] - centre_km[i] / 40.0)
        + 15000.0 * bedrooms
        + 40.0 * garden
        + rng.normal(0.0, 20000.0, n)
    )
    relations["House"] = pd.DataFrame(
        {
            "postcode": pc,
            "livingarea": np.round(living, 1),
            "price": np.round(np.maximum(price, 20000.0), -2),
            "nbbedrooms": bedrooms,
            "nbbathrooms": bathrooms,
            "kitchensize": kitchen,
            "house": (ptype == 0).astype(np.int64),
            "flat": (ptype == 1).astype(np.int64),
            "unknown": (ptype == 2).astype(np.int64),
            "garden": garden,
            "parking": parking,
        }
    )

    pc, i = keyed("Shop")
    n = len(pc)
    brand = rng.choice(3, n, p=[0.4, 0.4, 0.2])  # sainsburys / tesco / ms
    relations["Shop"] = pd.DataFrame(
        {
            "postcode": pc,
            "openinghoursshop": rng.integers(8, 25, n).astype(np.float64),
            "pricerangeshop": np.clip(
                np.rint(1 + 0.6 * wealth[i] + rng.normal(0, 0.6, n)), 0, 2
            ).astype(np.int64),
            "sainsburys": (brand == 0).astype(np.int64),
            "tesco": (brand == 1).astype(np.int64),
            "ms": (brand == 2).astype(np.int64),
        }
    )

    pc, i = keyed("Institution")
    n = len(pc)
    relations["Institution"] = pd.DataFrame(
        {
            "postcode": pc,
            "typeeducation": rng.integers(0, 12, n),
            "sizeinstitution": np.rint(rng.lognormal(np.log(400.0), 0.6, n)),
        }
    )

    pc, i = keyed("Restaurant")
    n = len(pc)
    relations["Restaurant"] = pd.DataFrame(
        {
            "postcode": pc,
            "openinghoursrest": rng.integers(6, 23, n).astype(np.float64),
            "pricerangerest": np.clip(
                np.rint(1 + 0.6 * wealth[i] + rng.normal(0, 0.6, n)), 0, 2
            ).astype(np.int64),
        }
    )

    pc, i = keyed("Demographics")
    n = len(pc)
    relations["Demographics"] = pd.DataFrame(
        {
            "postcode": pc,
            "averagesalary": np.round(
                np.exp(np.log(32000.0) + 0.3 * wealth[i] + rng.normal(0, 0.05, n)), 0
            ),
            "crimesperyear": rng.poisson(40.0 * (0.3 + urban[i]) * np.exp(-0.2 * wealth[i])).astype(
                np.float64
            ),
            "unemployment": np.round(
                np.clip(6.0 - 1.5 * wealth[i] + rng.normal(0, 1.0, n), 0.0, 30.0), 1
            ),
            "nbhospitals": rng.poisson(0.5 + 3.0 * urban[i]).astype(np.float64),
        }
    )

    pc, i = keyed("Transport")
    n = len(pc)
    relations["Transport"] = pd.DataFrame(
        {
            "postcode": pc,
            "nbbuslines": np.minimum(rng.poisson(1.0 + 12.0 * urban[i]), 19).astype(np.float64),
            "nbtrainstations": np.minimum(rng.poisson(0.3 + 4.0 * urban[i]), 19).astype(np.float64),
            "distancecitycentre": np.round(
                centre_km[i] + rng.normal(0, 0.3, n).clip(-1, 1), 1
            ).clip(0.0, None),
        }
    )

    return Dataset(
        name="housing_star",
        relations=relations,
        join_variables=["postcode"],
        continuous=list(HOUSING_CONTINUOUS),
        categorical=list(HOUSING_CATEGORICAL),
        label="price",
        description=(
            f"Synthetic Housing star (seed {seed}): {P} postcodes, rows per postcode {k}; join "
            f"size {P * int(np.prod(list(k.values())))} rows. Same schema and 14/12 split as "
            "load_housing(); values in natural units."
        ),
        variable_order=_VARIABLE_ORDER,
        extra={"rows_per_postcode": k},
    )
