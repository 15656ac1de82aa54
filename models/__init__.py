"""ringml.models: models kept fresh from ring payloads (F-IVM §9.1-9.3).

* :mod:`.regression` -- linear regression from a covariance payload for any label and any
  feature subset (BGD with Barzilai–Borwein steps and Armijo backtracking, or Cholesky).
* :mod:`.mutual_information` -- MI matrices from count tables, Chow–Liu trees, equal-width
  binning fixed once.
* :mod:`.estimators` -- scikit-learn estimators: flat (:class:`SufficientStatsRegressor`,
  :class:`ChowLiuEstimator`) and over joins of changing relations (:class:`JoinRegressor`,
  :class:`JoinChowLiu`).
"""

from .estimators import ChowLiuEstimator, JoinChowLiu, JoinRegressor, SufficientStatsRegressor
from .mutual_information import (
    EqualWidthBinner,
    chow_liu_tree,
    entropy,
    equal_width_bins,
    mutual_information,
    mutual_information_matrix,
)
from .regression import (
    CovarianceRegression,
    Design,
    RegressionResult,
    design_from_payload,
    fit_from_sigma,
)

__all__ = [
    "ChowLiuEstimator",
    "CovarianceRegression",
    "Design",
    "EqualWidthBinner",
    "JoinChowLiu",
    "JoinRegressor",
    "RegressionResult",
    "SufficientStatsRegressor",
    "chow_liu_tree",
    "design_from_payload",
    "entropy",
    "equal_width_bins",
    "fit_from_sigma",
    "mutual_information",
    "mutual_information_matrix",
]
