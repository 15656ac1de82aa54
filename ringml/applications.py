"""Ready-made queries: the covariance matrix (continuous or mixed) over a natural join."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .query import Query, RowFilter
from .rings.categorical import GeneralizedCovarianceRing
from .rings.covariance import CovarianceRing


def non_join_variables(relations: Mapping[str, Sequence[str]]) -> list[str]:
    """Variables that occur in exactly one relation, in schema order."""
    counts: dict[str, int] = {}
    for columns in relations.values():
        for c in columns:
            counts[c] = counts.get(c, 0) + 1
    return [c for columns in relations.values() for c in columns if counts[c] == 1]


def covariance_query(
    relations: Mapping[str, Sequence[str]],
    features: Iterable[str] | None = None,
    categorical: Iterable[str] = (),
    free: Iterable[str] = (),
    filters: Mapping[str, RowFilter] | None = None,
) -> Query:
    """Count, Σx and Σxxᵀ over the natural join of ``relations``, without materializing it.

    ``features`` default to every non-join variable that is not free (group-by variables
    are never lifted).  With ``categorical`` variables the payload is the generalized
    covariance ring (category-keyed entries, no one-hot blow-up); otherwise the continuous
    covariance ring of degree ``len(features)``.
    """
    free = tuple(free)
    if features is None:
        features = [v for v in non_join_variables(relations) if v not in free]
    features = list(features)
    categorical = [v for v in categorical]
    unknown = set(categorical) - set(features)
    if unknown:
        raise ValueError(f"categorical variables {sorted(unknown)} are not among the features")
    if categorical:
        continuous = [v for v in features if v not in set(categorical)]
        ring = GeneralizedCovarianceRing(continuous, categorical)
    else:
        ring = CovarianceRing(features)
    return Query(relations, ring, free, None, dict(filters or {}))
