"""The ring library: payload rings with a scalar face and a batched numpy face.

Every ring implements :class:`~ringml.rings.base.Ring`; the engine only calls the batched
face.  Rings import nothing but numpy and know nothing of views, Spark or MLflow.
"""

from .base import Ring, RingError
from .categorical import GeneralizedCovarianceRing
from .covariance import CovarianceRing
from .matrix import LowRank, MatrixRing, RankOneUpdate, rank_one
from .relational import FactorizedRing, RelationalRing
from .scalar import AverageRing, IntegerRing, ProductRing, RealRing, average_ring

__all__ = [
    "AverageRing",
    "CovarianceRing",
    "FactorizedRing",
    "GeneralizedCovarianceRing",
    "IntegerRing",
    "LowRank",
    "MatrixRing",
    "ProductRing",
    "RankOneUpdate",
    "RealRing",
    "RelationalRing",
    "Ring",
    "RingError",
    "average_ring",
    "rank_one",
]
