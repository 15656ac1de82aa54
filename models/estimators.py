"""scikit-learn estimators over ring payloads: flat data and joins of changing relations.

Conventions (scikit-learn ≥ 1.6; ecosystem notes §4): parameters are only stored by
``__init__``; ``fit`` discards everything learnt before; ``partial_fit`` accumulates and
returns ``self``; fitted attributes end in ``_``; input is checked with
``validate_data(reset=<first call>)``; tags come from ``__sklearn_tags__``.  Every public
method that changes the model is **atomic**: bad input (wrong number of features, NaN, a
delete of rows never added, a label that is not a maintained variable, …) raises a
``ValueError`` with a clear message and leaves the fitted state exactly as it was.

Flat estimators (pass ``parametrize_with_checks``; see ``tests/test_models_estimators.py``):

* :class:`SufficientStatsRegressor` keeps one covariance payload ``(c, Σx, Σxxᵀ)`` over
  ``[features…, y]`` (:class:`~ringml.rings.covariance.CovarianceRing`, batched face,
  compensated accumulation), so ``delete`` is an exact retraction and negative
  ``sample_weight`` is a signed multiplicity.  Weights must be integers (payload counts
  are exact integers; a weight ``w`` is the row repeated ``w`` times).
* :class:`ChowLiuEstimator` keeps the all-categorical generalized covariance ring's
  count tables and derives ``mutual_info_``, ``entropy_`` and the Chow–Liu ``tree_``.

Relational estimators (same conventions; ``fit``/``partial_fit`` take update batches, not
an ``X`` matrix, so they are not run through the scikit-learn checks):

* :class:`JoinRegressor` keeps a linear model over the natural join of ``relations``
  fresh through a :class:`ringml.Maintainer` (the join is never materialized), refitting
  warm-started after every batch.
* :class:`JoinChowLiu` keeps MI and the Chow–Liu tree over the join.

Both take ``windows=`` (stream tables seen through a sliding window, see
:mod:`ringml.windows`): rows that leave a window are exact deletes on the maintained
payload, so the model is over the last N time units of the join after every batch.
"""

from __future__ import annotations

import math
import numbers
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from functools import reduce
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd
from ringml.rings.categorical import GeneralizedCovarianceRing
from ringml.rings.covariance import CovarianceRing
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.metrics import r2_score
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

import ringml
from ringml.batch import TupleCounts, UpdateBatch, as_frame, feature_numbers
from ringml.encoding import factorize
from ringml.errors import BatchError, SubscriberError, UnknownCategoryError

from .mutual_information import (
    EqualWidthBinner,
    chow_liu_tree,
    equal_width_bins,
    mutual_information_matrix,
)
from .regression import (
    SOLVERS,
    CovarianceRegression,
    RegressionResult,
    fit_from_sigma,
    predict_frame,
)

__all__ = [
    "ChowLiuEstimator",
    "JoinChowLiu",
    "JoinRegressor",
    "SufficientStatsRegressor",
]


class _Atomic:
    """Run a state change all-or-nothing: on any exception restore ``__dict__``.

    Fitted state is only ever *replaced* (never mutated in place), so a shallow copy of
    ``__dict__`` is a complete snapshot -- except a join model's maintainer, which applies
    batches in place and is undone by :meth:`_JoinModel._apply` itself.
    """

    def _atomic(self, change, *args, **kwargs):
        saved = dict(self.__dict__)
        try:
            return change(*args, **kwargs)
        except SubscriberError:  # the change was made (a subscriber of it raised)
            raise
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise


def _integer_weights(sample_weight, X, sign: int = 1) -> np.ndarray | None:
    """Signed integer multiplicities from ``sample_weight`` (None: all ones)."""
    if sample_weight is None:
        return None if sign == 1 else np.full(X.shape[0], sign, dtype=np.int64)
    sw = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=False)
    if not np.all(np.isfinite(sw)):
        raise ValueError("sample_weight contains NaN or infinity")
    if not np.all(sw == np.round(sw)) or np.any(np.abs(sw) > 2**53):
        raise ValueError(
            "sample_weight must hold integer multiplicities (a weight w counts the row w "
            "times; negative weights retract rows): the payload's counts are exact integers"
        )
    return sign * sw.astype(np.int64)


def _check_choice(name: str, value: Any, choices: Sequence) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def _check_ridge(ridge: Any) -> float:
    if not isinstance(ridge, numbers.Real) or not (ridge >= 0 and math.isfinite(ridge)):
        raise ValueError(f"ridge must be a finite number >= 0, got {ridge!r}")
    return float(ridge)


def _check_solver(tol: Any, max_iter: Any, fit_intercept: Any, warm_start: Any) -> None:
    if not isinstance(tol, numbers.Real) or not (tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol must be a finite number > 0, got {tol!r}")
    if not isinstance(max_iter, numbers.Integral) or isinstance(max_iter, bool) or max_iter < 0:
        raise ValueError(f"max_iter must be an integer >= 0, got {max_iter!r}")
    for name, value in (("fit_intercept", fit_intercept), ("warm_start", warm_start)):
        if not isinstance(value, bool | np.bool_):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def _names(value: Any, what: str) -> list:
    """A parameter that lists column names: a string is one name, not its characters."""
    if value is None:
        return []
    if isinstance(value, str):
        raise ValueError(f"{what} must be a list of column names, got the string {value!r}")
    return list(value)


def _same(a: Any, b: Any) -> bool:
    """Whether two parameter values are the same (equal, or the same object)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # frames and arrays compare element-wise
        return False


# ============================================================ flat: regression
class SufficientStatsRegressor(_Atomic, RegressorMixin, BaseEstimator):
    """Linear regression kept as sufficient statistics: exact updates and retractions.

    The model stores one covariance-ring payload ``(count, Σz, Σzzᵀ)`` over
    ``z = [x, y]`` (``payload_``, ring ``ring_``) and refits from it after every call:
    ``partial_fit`` adds rows, ``delete`` (or a negative ``sample_weight``) retracts rows
    exactly, and the result never depends on the order or grouping of the calls.  Rows are
    counted by a 64-bit fingerprint each (one per distinct row), so retracting a row that
    was never added is refused instead of leaving moments no data set has.

    Parameters
    ----------
    ridge : float, default=0.0
        Per-row ridge penalty ``λ`` on the slopes (never on the intercept): minimizes
        ``½(mean squared error + λ‖β‖²)``.  scikit-learn's ``Ridge(alpha=λ·n)`` fits the
        same model on ``n`` rows (``n`` = the sum of the weights).
    fit_intercept : bool, default=True
    solver : {"bgd", "cholesky"}, default="bgd"
        ``"bgd"``: gradient descent on Σ (Barzilai–Borwein step, Armijo backtracking),
        warm-started from the previous coefficients; ``"cholesky"``: closed form.
    tol : float, default=1e-10
        BGD stops once the gradient bounds the relative coefficient error by ``tol``.
    max_iter : int, default=10000
    warm_start : bool, default=True
        ``partial_fit``/``delete`` resume BGD from the current coefficients (``fit``
        always starts from zero: it discards the previous model).

    Attributes
    ----------
    coef_, intercept_ : the model, in original units.
    n_features_in_, feature_names_in_ : as in scikit-learn.
    n_samples_seen_ : int, the net number of rows (sum of multiplicities).
    payload_, ring_ : the covariance payload and its ring (shifted moments; see
        :class:`~ringml.rings.covariance.CovarianceRing`).
    n_iter_ : BGD iterations of the last refit; ``n_iter_total_`` since the last ``fit``.
    result_ : the last :class:`~ringml.models.regression.RegressionResult` (loss,
        gradient norm, condition number, stop reason).
    """

    def __init__(
        self,
        ridge: float = 0.0,
        fit_intercept: bool = True,
        solver: str = "bgd",
        tol: float = 1e-10,
        max_iter: int = 10_000,
        warm_start: bool = True,
    ) -> None:
        self.ridge = ridge
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.warm_start = warm_start

    # ------------------------------------------------------------ public API
    def fit(self, X, y, sample_weight=None):
        """Fit on ``(X, y)`` only, discarding previous data."""
        return self._atomic(self._fit, X, y, sample_weight)

    def partial_fit(self, X, y, sample_weight=None):
        """Add rows (negative ``sample_weight`` retracts them); returns ``self``."""
        return self._atomic(self._update, X, y, sample_weight, 1, not hasattr(self, "ring_"))

    def delete(self, X, y, sample_weight=None):
        """Retract rows added before (exactly); returns ``self``.

        Raises :class:`~ringml.errors.BatchError` (a ``ValueError``; state unchanged) for a
        row never added, or retracted more often than it was added.
        """
        check_is_fitted(self)
        return self._atomic(self._update, X, y, sample_weight, -1, False)

    def predict(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        return X @ self.coef_.astype(X.dtype, copy=False) + self.intercept_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.input_tags.sparse = False
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = False
        return tags

    # ------------------------------------------------------------ internals
    def _fit(self, X, y, sample_weight):
        for name in [n for n in vars(self) if n.endswith("_") and not n.startswith("__")]:
            delattr(self, name)
        return self._update(X, y, sample_weight, 1, True)

    def _check_params(self) -> None:
        _check_ridge(self.ridge)
        _check_choice("solver", self.solver, SOLVERS)
        if not (isinstance(self.tol, numbers.Real) and self.tol > 0):
            raise ValueError(f"tol must be > 0, got {self.tol!r}")
        if not (isinstance(self.max_iter, numbers.Integral) and self.max_iter >= 0):
            raise ValueError(f"max_iter must be an integer >= 0, got {self.max_iter!r}")

    def _update(self, X, y, sample_weight, sign: int, first: bool):
        self._check_params()
        X, y = validate_data(
            self, X, y, reset=first, dtype=np.float64, y_numeric=True, ensure_min_samples=1
        )
        weights = _integer_weights(sample_weight, X, sign)
        p = X.shape[1]
        if first:
            names = [f"x{j}" for j in range(p)] + ["y"]
            ring = CovarianceRing(names)
            acc = ring.batch_accumulator(1, block=tuple(range(p + 1)))
        else:
            ring = self.ring_
            acc = ring.batch_resize(self._acc, 1)  # a copy: the stored one stays intact
        rows = TupleCounts(p + 1) if first else self._rows
        changes = self._check_rows(rows, X, y, weights)
        added = int(weights.sum()) if weights is not None else X.shape[0]
        count = int(acc.count[0]) + added
        lifted = ring.batch_lift_block(ring.variables, np.column_stack([X, y]))
        if weights is not None:
            lifted = ring.batch_scale(lifted, weights)
        total = ring.batch_sum_by(lifted, np.zeros(len(X), dtype=np.int64), 1)
        acc = ring.batch_scatter_add(acc, np.zeros(1, dtype=np.intp), total)
        self.ring_ = ring
        self._acc = acc
        self.payload_ = ring.batch_to_list(acc)[0]
        self.n_samples_seen_ = count
        self._refit(first)
        rows.apply(*changes)  # last: everything before may still fail and change nothing
        self._rows = rows
        return self

    @staticmethod
    def _check_rows(
        rows: TupleCounts, X: np.ndarray, y: np.ndarray, weights: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The (fingerprints, multiplicities) to record; :class:`BatchError` (a
        ``ValueError``) if a row would be retracted more often than it was added."""
        signs = np.ones(X.shape[0], dtype=np.int64) if weights is None else weights
        ids, net, bad = rows.check(TupleCounts.fingerprints([*X.T, y]), signs)
        if bad >= 0:
            raise BatchError(
                f"cannot retract row {bad} (x={X[bad].tolist()}, y={float(y[bad])}): it was "
                f"never added, or is retracted more often than it was added",
                None,
                None,
                X[bad].tolist() + [float(y[bad])],
            )
        return ids, net

    def _refit(self, first: bool) -> None:
        p = self.n_features_in_
        if self.n_samples_seen_ == 0:
            self.coef_, self.intercept_ = np.zeros(p), 0.0
            self.n_iter_, self.result_ = 0, None
            self.n_iter_total_ = 0 if first else self.n_iter_total_
            return
        warm = self.warm_start and not first and getattr(self, "result_", None) is not None
        result = fit_from_sigma(
            self.ring_.sigma(self.payload_),
            p,
            list(range(p)),
            self.ridge,
            fit_intercept=self.fit_intercept,
            shifts=self.ring_.shifts,
            solver=self.solver,
            theta0=self.coef_ if warm else None,
            step0=self.result_.step if warm else None,
            tol=self.tol,
            max_iter=self.max_iter,
        )
        self.result_ = result
        self.coef_ = result.coef.copy()
        self.intercept_ = float(result.intercept)
        self.n_iter_ = result.iterations
        self.n_iter_total_ = (0 if first else self.n_iter_total_) + result.iterations


# ============================================================ flat: Chow–Liu
class ChowLiuEstimator(_Atomic, BaseEstimator):
    """Pairwise mutual information and the Chow–Liu tree of categorical columns.

    Keeps the all-categorical generalized covariance ring's payload (``payload_``): the
    count, ``COUNT GROUP BY X`` and ``COUNT GROUP BY X, Y`` for every column and pair, so
    ``partial_fit`` adds rows and ``delete`` retracts them exactly (counts are exact).
    Columns listed in ``continuous`` are discretized by an :class:`EqualWidthBinner` with
    ``n_bins`` bins, fixed on the data of the first call after ``fit`` (values outside
    that range are clipped into the end bins).  Values of the other columns are categories
    as they are (any hashable: numbers, strings); NaN is rejected.

    Attributes
    ----------
    mutual_info_ : DataFrame, MI in bits, entropy on the diagonal.
    entropy_ : Series, ``H(X)`` in bits.
    tree_ : ``nx.Graph``, the maximum spanning tree of ``mutual_info_`` (edge ``weight``).
    n_samples_seen_ : int; n_features_in_, feature_names_in_ ; payload_, ring_ ;
    categories_ : list of dicts, category value -> code, per column;
    binner_ : the fitted EqualWidthBinner (None without continuous columns).
    """

    def __init__(self, continuous: Sequence = (), n_bins: int = 100) -> None:
        self.continuous = continuous
        self.n_bins = n_bins

    def fit(self, X, y=None, sample_weight=None):
        """Fit on ``X`` only (``y`` is ignored), discarding previous data."""
        return self._atomic(self._fit, X, sample_weight)

    def partial_fit(self, X, y=None, sample_weight=None):
        """Add rows (negative ``sample_weight`` retracts them); returns ``self``."""
        return self._atomic(self._update, X, sample_weight, 1, not hasattr(self, "ring_"))

    def delete(self, X, y=None, sample_weight=None):
        """Retract rows added before; ``ValueError`` (state unchanged) for a row never
        added, or retracted more often than it was added (rows are counted by a 64-bit
        fingerprint each, as in :class:`SufficientStatsRegressor`)."""
        check_is_fitted(self)
        return self._atomic(self._update, X, sample_weight, -1, False)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.input_tags.sparse = False
        tags.input_tags.categorical = True
        tags.input_tags.string = True
        tags.target_tags.required = False
        return tags

    # ------------------------------------------------------------ internals
    def _fit(self, X, sample_weight):
        for name in [n for n in vars(self) if n.endswith("_") and not n.startswith("__")]:
            delattr(self, name)
        return self._update(X, sample_weight, 1, True)

    def _continuous_positions(self, names: list[str]) -> list[int]:
        out = []
        for c in _names(self.continuous, "continuous"):
            if isinstance(c, numbers.Integral) and not isinstance(c, bool):
                if not 0 <= int(c) < len(names):
                    raise ValueError(f"continuous column {c} out of range 0..{len(names) - 1}")
                out.append(int(c))
            elif c in names:
                out.append(names.index(c))
            else:
                raise ValueError(f"continuous column {c!r} is not a column ({names})")
        return sorted(set(out))

    def _update(self, X, sample_weight, sign: int, first: bool):
        if not isinstance(self.n_bins, numbers.Integral) or self.n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer, got {self.n_bins!r}")
        _reject_missing(X)
        # a frame's own columns: validation would turn int and float columns into float64
        # together, merging integer categories beyond 2**53
        own = [X.iloc[:, j].to_numpy() for j in range(X.shape[1])] if _is_frame(X) else None
        X = validate_data(self, X, reset=first, dtype=None, ensure_min_samples=1)
        weights = _integer_weights(sample_weight, X, sign)
        n, q = X.shape
        if first:
            names = (
                [str(c) for c in self.feature_names_in_]
                if hasattr(self, "feature_names_in_")
                else [f"x{j}" for j in range(q)]
            )
            ring = GeneralizedCovarianceRing((), names)
            payload = ring.zero()
            categories: list[dict] = [{} for _ in range(q)]
            cont = self._continuous_positions(names)
            binner = None
            if cont:
                binner = EqualWidthBinner(n_bins=int(self.n_bins)).fit(_as_float(X[:, cont]))
        else:
            ring, payload, binner = self.ring_, self.payload_, self.binner_
            categories = [dict(c) for c in self.categories_]  # copies: commit at the end
            cont = self._cont_
        columns = own if own is not None else [X[:, j] for j in range(q)]
        if binner is not None:
            binned = binner.transform(_as_float(X[:, cont]))
            for t, j in enumerate(cont):
                columns[j] = binned[:, t]
        codes = []
        for j, col in enumerate(columns):
            local, uniques = factorize(np.asarray(col, dtype=object), use_na_sentinel=False)
            table = categories[j]
            glob = np.asarray([table.setdefault(u, len(table)) for u in uniques], np.int64)
            codes.append(glob[local])
        rows = TupleCounts(q) if first else getattr(self, "_rows", None)
        changes = None
        if rows is not None:  # (None: a model pickled before rows were counted)
            keys = list(codes)
            values = _as_float(X[:, cont])
            for t, j in enumerate(cont):  # a continuous value itself, not just its bin
                keys[j] = values[:, t]
            changes = self._check_rows(rows, keys, weights, n)
        lifts = [ring.batch_lift(v, c) for v, c in zip(ring.variables, codes, strict=True)]
        batch = reduce(ring.batch_mul, lifts)
        if weights is not None:
            batch = ring.batch_scale(batch, weights)
        payload = ring.add(payload, ring.batch_sum(batch))
        tables = ring.count_tables(payload)
        _check_counts(tables)
        self.ring_, self.payload_, self.binner_ = ring, payload, binner
        self.categories_, self._cont_ = categories, cont
        self.n_samples_seen_ = int(round(tables[()]))
        self.mutual_info_ = mutual_information_matrix(tables, list(ring.variables))
        self.entropy_ = pd.Series(np.diag(self.mutual_info_.to_numpy()), index=ring.variables)
        self.tree_ = chow_liu_tree(self.mutual_info_)
        if changes is not None:
            rows.apply(*changes)  # last: everything before may still fail and change nothing
            self._rows = rows
        return self

    @staticmethod
    def _check_rows(
        rows: TupleCounts, keys: list[np.ndarray], weights: np.ndarray | None, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The (fingerprints, multiplicities) to record; ``ValueError`` if a row would be
        retracted more often than it was added (the count tables alone miss a row whose
        every pair of values was added in other rows)."""
        signs = np.ones(n, dtype=np.int64) if weights is None else weights
        ids, net, bad = rows.check(TupleCounts.fingerprints(keys), signs)
        if bad >= 0:
            raise ValueError(
                f"cannot retract row {bad}: it was never added, or is retracted more often "
                "than it was added"
            )
        return ids, net


def _is_frame(X: Any) -> bool:
    return isinstance(X, pd.DataFrame) and X.ndim == 2


def _reject_missing(X: Any) -> None:
    """ValueError for a missing value (None, NaN, pd.NA, NaT): none is a category (None
    became one, pd.NA crashed the validation)."""
    if _is_frame(X):
        missing = X.isna().to_numpy()
    elif isinstance(X, np.ndarray | list | tuple):
        try:
            missing = np.asarray(pd.isna(np.asarray(X, dtype=object)), dtype=bool)
        except (TypeError, ValueError):  # ragged input: validation says what is wrong
            return
    else:
        return
    if missing.ndim == 2 and missing.any():
        row, column = (int(i[0]) for i in np.nonzero(missing))
        raise ValueError(
            f"Input X contains NaN or another missing value (row {row}, column {column})"
        )


def _as_float(X: np.ndarray) -> np.ndarray:
    try:
        return np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("continuous columns must hold numbers") from None


def _check_counts(tables: Mapping[tuple, Any]) -> None:
    """Counts can never be negative: a negative one means rows were deleted that were
    never added."""
    total = float(tables[()])
    if total < -0.5:
        raise ValueError(f"cannot retract rows that were never added (row count {total:g})")
    for key, table in tables.items():
        if key and any(v < -0.5 for v in table.values()):
            raise ValueError(f"cannot retract rows that were never added (negative count in {key})")


# ============================================================ relational
def _update_batches(batches: Any, sign: int = 1) -> list[UpdateBatch]:
    """Normalize batches: a mapping relation -> rows (inserts, or deletes for ``sign=-1``),
    an :class:`UpdateBatch`, a stream batch (``relation``, ``rows``, ``multiplicity``), or
    a list of those."""
    if batches is None:
        return []
    if isinstance(batches, Mapping):
        out = []
        for relation, rows in batches.items():
            out.append(
                UpdateBatch.inserts(relation, rows)
                if sign == 1
                else UpdateBatch.deletes(relation, rows)
            )
        return out
    if isinstance(batches, UpdateBatch):
        if sign == 1:
            return [batches]
        return [UpdateBatch(batches.relation, batches.rows, -batches.signs())]
    if hasattr(batches, "relation") and hasattr(batches, "rows"):
        mult = getattr(batches, "multiplicity", None)
        return _update_batches(UpdateBatch(batches.relation, batches.rows, mult), sign)
    if isinstance(batches, Iterable) and not isinstance(batches, str | bytes | pd.DataFrame):
        return [b for item in batches for b in _update_batches(item, sign)]
    raise ValueError(
        "batches must be a mapping relation -> DataFrame, an UpdateBatch, a stream batch "
        f"or a list of those; got {type(batches).__name__}"
    )


def _sql_join(relations: Any, catalog: Any):
    """The training query when ``relations`` is SQL text (None otherwise)."""
    if not isinstance(relations, str):
        return None
    if catalog is None:
        raise ValueError(
            "relations given as SQL need catalog= (CREATE TABLE text, a ringml.sql.Catalog or "
            "a mapping table -> {column: SQL type})"
        )
    from ringml.sql.training import training_join  # imports sqlglot only here

    return training_join(relations, catalog)


def _schemas(relations: Any) -> dict[str, list[str]]:
    if not isinstance(relations, Mapping) or not relations:
        raise ValueError("relations must be a non-empty mapping relation -> column names")
    out = {}
    for name, cols in relations.items():
        if isinstance(cols, pd.DataFrame):
            cols = list(cols.columns)
        if isinstance(cols, str) or not isinstance(cols, Iterable):
            raise ValueError(f"relation {name!r}: columns must be a list of names")
        out[str(name)] = [str(c) for c in cols]
    return out


class _JoinModel(_Atomic, BaseEstimator, ABC):
    """Shared plumbing: a Maintainer built on the first call, atomic batch application;
    with ``windows``, the maintainer sees the stream tables through a
    :class:`ringml.windows.WindowedStream` (``stream_``)."""

    windows: Mapping[str, Any] | None = None
    lateness: Any = 0.0
    late: str = "reject"
    #: the parameters that shape the maintained query: changing one needs a new :meth:`fit`
    _structure: tuple[str, ...] = ()

    @abstractmethod
    def _build(self) -> None:
        """Create the Maintainer and the model state from the parameters."""

    def _check_params(self) -> dict[str, Any]:
        """The parameters that only the refit reads, checked before a batch is applied."""
        return {}

    def _start(self) -> None:
        """:meth:`_build`, then the windowed stream over the maintainer (if any)."""
        self._build()
        self._built_with = {name: getattr(self, name) for name in self._structure}
        self.stream_ = None
        if self.windows is None:
            return
        from ringml.windows import StreamTable, WindowedStream

        if getattr(self, "feed_", None) is not None:
            raise ValueError(
                "windows need relations given as a mapping relation -> columns, not as SQL"
            )
        if not isinstance(self.windows, Mapping) or not self.windows:
            raise ValueError(
                "windows must map stream tables to ringml.windows.StreamTable specs, got "
                f"{self.windows!r}"
            )
        relations = self.maintainer_.query.relations
        for name, spec in self.windows.items():
            if name not in relations:
                raise ValueError(
                    f"windows: {name!r} is not one of the relations {sorted(relations)}"
                )
            if not isinstance(spec, StreamTable):
                raise ValueError(f"windows[{name!r}] must be a StreamTable, got {spec!r}")
        self.stream_ = WindowedStream(
            self.maintainer_, dict(self.windows), lateness=self.lateness, late=self.late
        )

    @property
    def watermark_(self) -> Any:
        """The windowed stream's watermark (a number or a Timestamp)."""
        check_is_fitted(self)
        if getattr(self, "stream_", None) is None:
            raise AttributeError("the model has no windows, hence no watermark")
        return self.stream_.watermark

    def advance_watermark(self, time):
        """Move the watermark to ``time`` without new rows (rows that leave the windows are
        deleted) and refresh the model; returns ``self``."""
        check_is_fitted(self)
        if getattr(self, "stream_", None) is None:
            raise ValueError("the model has no windows: pass windows= to window a stream table")
        return self._atomic(self._advance, time)

    def _advance(self, time):
        self.maintainer_ = self.stream_.targets[0]
        self.stream_.advance_watermark(time)
        self._refresh()
        return self

    def fit(self, batches=None):
        """Start over: a fresh maintainer, then apply ``batches`` (may be None)."""
        return self._atomic(self._fit, batches)

    def partial_fit(self, batches):
        """Apply ``batches`` (inserts and/or deletes, atomically) and refresh the model."""
        return self._atomic(self._partial, batches, 1)

    def delete(self, batches):
        """Delete rows: a mapping relation -> DataFrame of rows to remove (or batches,
        whose multiplicities are negated)."""
        check_is_fitted(self)
        return self._atomic(self._partial, batches, -1)

    def _fit(self, batches):
        for name in [n for n in vars(self) if n.endswith("_") and not n.startswith("__")]:
            delattr(self, name)
        self._start()
        self._apply(_update_batches(batches))
        return self

    def _partial(self, batches, sign: int):
        if not hasattr(self, "maintainer_"):
            self._start()
        built = getattr(self, "_built_with", {})  # (absent from models pickled before it)
        changed = [n for n, v in built.items() if not _same(getattr(self, n), v)]
        if changed:
            raise ValueError(
                f"{', '.join(changed)} changed since the model was fitted (set_params); they "
                "shape the maintained join: call fit to start over with them"
            )
        self._check_params()
        self._apply(_update_batches(batches, sign))
        return self

    def _apply(self, updates: list[UpdateBatch]) -> None:
        feed = getattr(self, "feed_", None)
        changes = None
        if feed is not None:  # a SQL join: base-table rows -> the rows of its FROM items
            updates, changes = feed.prepare(updates)
        failed = None
        try:
            updates = self._prepare(updates)
            stream = getattr(self, "stream_", None)
            if stream is not None:  # follow the stream (a restore replaces its targets)
                self.maintainer_ = stream.targets[0]
            if updates:
                # the Maintainer (and the windowed stream) is atomic itself; a rejected batch
                # changes no view
                try:
                    (self.maintainer_ if stream is None else stream).apply(updates)
                except SubscriberError as error:  # applied: refit, then raise it
                    failed = error
        except BaseException:
            if changes:  # the prepared base-table rows are dropped with the batch
                feed.abandon(changes)
            raise
        try:
            self._refresh()
        except BaseException:
            # the maintainer took the batch in place: take it out again (the inverse is
            # valid: what was inserted is present).  A windowed stream's expired partitions
            # cannot be brought back (its parameters are checked before the apply instead)
            if stream is None:
                if updates:
                    inverse = [UpdateBatch(u.relation, u.rows, -u.signs()) for u in updates]
                    self.maintainer_.apply(inverse)
                if changes:
                    feed.abandon(changes)
            raise
        if changes:
            feed.commit(changes)
        if failed is not None:
            raise failed

    def _prepare(self, updates: list[UpdateBatch]) -> list[UpdateBatch]:
        return updates

    @abstractmethod
    def _refresh(self) -> None:
        """Refit the model from the maintained payload."""


class JoinRegressor(_JoinModel):
    """Linear regression over the natural join of changing relations (F-IVM §9.1).

    ``relations`` maps relation names to column lists (or DataFrames, whose columns are
    used), or is a SQL query over the tables of ``catalog`` (``SELECT price, livingarea
    FROM House JOIN Shop USING (postcode) WHERE ...``: its selected columns are the
    variables, batches hold rows of the tables; see :mod:`ringml.sql.training`).  The
    covariance payload of the join over the maintained variables (``features`` plus
    ``label``; default every non-join variable, or every selected column) is kept by a
    :class:`ringml.Maintainer`, and after every batch the model is refitted from it,
    warm-started (``warm_start=True``).  ``categorical`` variables use the generalized
    covariance ring; their one-hot columns ``(variable, category)`` are built inside the
    solver for the categories present (``drop="first"`` drops the first category per
    variable; see :mod:`ringml.models.regression`).  ``ridge`` is the per-row ``λ``
    (scikit-learn ``Ridge(alpha=λ·n)`` on the ``n`` join rows).  ``fit_intercept``,
    ``solver``, ``tol`` (BGD stops once the gradient bounds the coefficients' relative
    error by it) and ``max_iter`` (BGD's iteration cap per refit) are as for
    :class:`SufficientStatsRegressor`.  ``order`` is the maintainer's variable order
    (:class:`ringml.Maintainer`; default automatic).

    ``partial_fit(batches)``: a mapping relation -> DataFrame of inserts, an
    :class:`~ringml.UpdateBatch` (signed multiplicities), a stream batch, or a list of
    those, applied atomically.  ``delete(mapping)`` removes rows.  ``predict(X)`` takes
    rows of the joined schema (at least the feature columns) or, as in scikit-learn, an
    array whose columns are ``features_`` in order.  ``handle_unknown`` follows
    scikit-learn's ``OneHotEncoder``: ``"error"`` (default) rejects a category the model
    has not seen, ``"ignore"`` predicts with its one-hot columns at 0.

    **Sliding windows.**  ``windows`` maps stream tables (relations whose rows only arrive)
    to :class:`ringml.windows.StreamTable` specs, e.g. ``{"House": StreamTable("day",
    partition=1, window="RANGE 14")}``: the model is then over the join of the rows inside
    each window (the last 14 days as of the watermark) with the other relations.  Batches
    carry the event-time column (the relation's columns may omit it); the watermark is the
    largest event time seen minus ``lateness``; rows that leave a window are deleted from
    the maintained payload in the same atomic apply as the batch (exact: no refit from the
    window's rows), so the refit after every batch equals a fit on the windowed join.  Rows
    behind the watermark are rejected (``late="reject"``: :class:`ringml.windows.LateEventError`,
    nothing changes) or kept in ``stream_.dead_letters(table)`` (``late="dead_letter"``).
    :meth:`advance_watermark` moves time on without rows.  ``stream_`` is the
    :class:`ringml.windows.WindowedStream` (None without windows), ``watermark_`` its
    watermark.  Windows need ``relations`` as a mapping (not SQL).

    Attributes: ``coef_`` (ndarray over ``columns_``), ``intercept_``, ``columns_``,
    ``n_samples_seen_`` (join rows), ``n_iter_``, ``n_iter_total_``, ``result_``,
    ``maintainer_``, ``query_``, ``variables_`` (maintained), ``features_``.
    With an empty join the model is all zeros (``result_`` None).
    """

    def __init__(
        self,
        relations,
        label: str,
        features: Sequence[str] | None = None,
        categorical: Sequence[str] = (),
        ridge: float = 0.0,
        fit_intercept: bool = True,
        solver: str = "bgd",
        tol: float = 1e-10,
        max_iter: int = 10_000,
        warm_start: bool = True,
        drop: str | None = "first",
        order=None,
        handle_unknown: str = "error",
        catalog=None,
        windows: Mapping[str, Any] | None = None,
        lateness: Any = 0.0,
        late: str = "reject",
    ) -> None:
        self.relations = relations
        self.label = label
        self.features = features
        self.categorical = categorical
        self.ridge = ridge
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.drop = drop
        self.order = order
        self.handle_unknown = handle_unknown
        self.catalog = catalog
        self.windows = windows
        self.lateness = lateness
        self.late = late

    _structure = (
        "relations", "label", "features", "categorical", "order", "catalog", "windows",
        "lateness", "late",
    )  # fmt: skip

    def _check_params(self) -> dict[str, Any]:
        """The refit's parameters, checked: they may change between batches (set_params)."""
        _check_choice("solver", self.solver, SOLVERS)
        _check_choice("drop", self.drop, ("first", None))
        _check_choice("handle_unknown", self.handle_unknown, ("error", "ignore"))
        _check_solver(self.tol, self.max_iter, self.fit_intercept, self.warm_start)
        return {
            "ridge": _check_ridge(self.ridge),
            "fit_intercept": bool(self.fit_intercept),
            "solver": self.solver,
            "tol": float(self.tol),
            "max_iter": int(self.max_iter),
            "warm_start": bool(self.warm_start),
            "drop": self.drop,
        }

    def _build(self) -> None:
        sql = _sql_join(self.relations, self.catalog)
        schemas = _schemas(self.relations) if sql is None else None
        params = self._check_params()
        if sql is None:
            columns = {c for cols in schemas.values() for c in cols}
            default = ringml.non_join_variables(schemas)
        else:
            columns, default = set(sql.features), list(sql.features)
        maintained = (
            default
            if self.features is None
            else list(dict.fromkeys([*_names(self.features, "features"), self.label]))
        )
        if self.label not in maintained or self.label not in columns:
            known = [v for v in maintained if v != self.label and v in columns]
            raise ValueError(
                f"label {self.label!r} is not among the maintained variables "
                f"{known + ([] if self.features is None else ['<label>'])}"
                + ("" if self.label in columns else ": it is not a column of any relation")
            )
        missing = [v for v in maintained if v not in columns]
        if missing:
            raise ValueError(f"variables {missing} are not columns of any relation")
        categorical = _names(self.categorical, "categorical")
        if self.label in categorical:
            raise ValueError(f"label {self.label!r} must be continuous, not categorical")
        unknown = [v for v in categorical if v not in maintained]
        if unknown:
            raise ValueError(f"categorical variables {unknown} are not maintained variables")
        if sql is None:
            query = ringml.covariance_query(schemas, maintained, categorical)
        else:
            query = sql.covariance_query(maintained, categorical)
        self.maintainer_ = ringml.Maintainer(query, order=self.order)
        self.feed_ = None if sql is None else sql.feed()
        self.query_ = query
        self.variables_ = tuple(maintained)
        self.features_ = tuple(v for v in maintained if v != self.label)
        self._model = CovarianceRegression(
            self.label, list(self.features_), **params, keep_history=False
        )
        self.n_iter_total_ = 0

    def _refresh(self) -> None:
        m = self.maintainer_
        payload = m.result()
        count = float(payload.count)
        self.n_samples_seen_ = int(round(count))
        if count <= 0:
            cols = self.columns_ if hasattr(self, "columns_") else ()
            self.coef_, self.intercept_, self.columns_ = np.zeros(len(cols)), 0.0, cols
            self.result_, self.n_iter_ = None, 0
            self._design = None
            return
        model = _copy_model(self._model)  # refit on a copy: the stored one stays intact
        for name, value in self._check_params().items():
            if getattr(model, name) != value:  # set_params since the last refit
                setattr(model, name, value)
                model.design = None  # a refit, even on the same Σ
        result = model.refresh(self.query_.ring, payload, decode=m.decode)
        self._model = model
        self._design = model.design
        self.result_: RegressionResult | None = result
        self.coef_ = result.coef.copy()
        self.intercept_ = float(result.intercept)
        self.columns_ = result.columns
        self.n_iter_ = result.iterations
        self.n_iter_total_ = self.n_iter_total_ + result.iterations

    def predict(self, X) -> np.ndarray:
        """Predictions for rows of the joined schema (a DataFrame, column mapping or Arrow
        table with the feature columns), or for an array of ``features_`` columns."""
        check_is_fitted(self)
        frame = self._feature_frame(X)
        missing = [v for v in self.features_ if v not in frame.columns]
        if missing:
            raise ValueError(
                f"X lacks feature columns {missing}; JoinRegressor is expecting "
                f"{len(self.features_)} features: {list(self.features_)}"
            )
        if self.result_ is None:
            return np.full(len(frame), self.intercept_)
        if self.handle_unknown == "error":
            self._check_categories(frame)
        return predict_frame(self.result_, self._design, frame)

    def _feature_frame(self, X) -> pd.DataFrame:
        """``X`` as a frame; an array's columns are ``features_`` in order (scikit-learn)."""
        if isinstance(X, str | bytes):
            raise ValueError(f"JoinRegressor.predict needs rows, not the string {X!r}")
        arrow = ("to_arrow", "__arrow_c_stream__", "__dataframe__")
        if isinstance(X, pd.DataFrame | Mapping) or any(hasattr(X, a) for a in arrow):
            return as_frame(X, "X")
        array = np.asarray(X)
        if array.dtype.kind in "US" and not isinstance(X, np.ndarray):
            array = np.asarray(X, dtype=object)  # rows of mixed values: each keeps its type
        if array.ndim != 2:
            raise ValueError(
                f"Expected a 2D array of {len(self.features_)} feature columns "
                f"{list(self.features_)}, got an array of shape {array.shape}"
            )
        if array.shape[1] != len(self.features_):
            raise ValueError(
                f"X has {array.shape[1]} features, but JoinRegressor is expecting "
                f"{len(self.features_)} features as input: {list(self.features_)}"
            )
        return pd.DataFrame(array, columns=list(self.features_))

    def _check_categories(self, frame: pd.DataFrame) -> None:
        """:class:`~ringml.errors.UnknownCategoryError` for a category the model lacks."""
        for variable, categories in (self._design.categories or {}).items():
            known = [category for category, _ in categories]
            unseen = ~frame[variable].isin(known).to_numpy()
            if unseen.any():
                at = int(np.argmax(unseen))
                value = frame[variable].iloc[at]
                raise UnknownCategoryError(
                    f"column {variable!r}: category {value!r} (row {at}) was not seen in "
                    f"fitting (known: {known[:10]}); pass handle_unknown='ignore' to "
                    f"predict with its one-hot columns at 0",
                    variable,
                    value,
                )

    def score(self, X, y=None, sample_weight=None) -> float:
        """R² on rows of the joined schema (``y`` defaults to ``X[label]``), weighted by
        ``sample_weight`` as scikit-learn's ``RegressorMixin.score``."""
        if y is None:
            check_is_fitted(self)
            frame = self._feature_frame(X)
            if self.label not in frame.columns:
                raise ValueError(
                    f"X has no label column {self.label!r}: pass y, or rows of the joined "
                    "schema that hold the label"
                )
            y = frame[self.label]
        target = np.asarray(y, dtype=np.float64)
        return float(r2_score(target, self.predict(X), sample_weight=sample_weight))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.estimator_type = "regressor"
        tags.input_tags.allow_nan = False
        tags.input_tags.categorical = True
        return tags


def _copy_model(model: CovarianceRegression) -> CovarianceRegression:
    clone_ = CovarianceRegression.__new__(CovarianceRegression)
    clone_.__dict__.update(model.__dict__)
    clone_.history = list(model.history)
    return clone_


class JoinChowLiu(_JoinModel):
    """Mutual information and the Chow–Liu tree over the natural join (F-IVM §9.3).

    ``variables`` (default: every non-join variable) are treated as categorical; those in
    ``continuous`` are first discretized into ``n_bins`` equal-width bins.  A binned
    variable's range is taken from ``ranges[v] = (lo, hi)`` when given, else fixed from the
    first batch that carries it (values outside are clipped into the end bins), so a
    delete always lands in the bin of its insert.  Only non-join variables can be binned.
    ``relations`` may be a SQL query over ``catalog``'s tables, as for :class:`JoinRegressor`
    (its selected columns are the variables).  ``order`` is the maintainer's variable order
    (:class:`ringml.Maintainer`; default automatic).

    ``windows``, ``lateness``, ``late``: a sliding window over stream tables, as for
    :class:`JoinRegressor` (a binned variable's bins are fixed before rows enter a window,
    so an expired row leaves the bin it entered).

    Attributes: ``mutual_info_`` (DataFrame, bits, entropy on the diagonal),
    ``entropy_``, ``tree_`` (nx.Graph), ``n_samples_seen_`` (join rows), ``binners_``
    (variable -> (lo, hi)), ``maintainer_``, ``query_``.
    """

    def __init__(
        self,
        relations,
        variables: Sequence[str] | None = None,
        continuous: Sequence[str] = (),
        n_bins: int = 100,
        ranges: Mapping[str, tuple[float, float]] | None = None,
        order=None,
        catalog=None,
        windows: Mapping[str, Any] | None = None,
        lateness: Any = 0.0,
        late: str = "reject",
    ) -> None:
        self.relations = relations
        self.variables = variables
        self.continuous = continuous
        self.n_bins = n_bins
        self.ranges = ranges
        self.order = order
        self.catalog = catalog
        self.windows = windows
        self.lateness = lateness
        self.late = late

    _structure = (
        "relations", "variables", "continuous", "n_bins", "ranges", "order", "catalog",
        "windows", "lateness", "late",
    )  # fmt: skip

    def _build(self) -> None:
        sql = _sql_join(self.relations, self.catalog)
        schemas = _schemas(self.relations) if sql is None else None
        if not isinstance(self.n_bins, numbers.Integral) or self.n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer, got {self.n_bins!r}")
        if sql is None:
            non_join = ringml.non_join_variables(schemas)
            columns = {c for cols in schemas.values() for c in cols}
        else:
            non_join = [v for v in sql.features if v not in sql.joined]
            columns = set(sql.features)
        variables = non_join if self.variables is None else _names(self.variables, "variables")
        missing = [v for v in variables if v not in columns]
        if missing:
            raise ValueError(f"variables {missing} are not columns of any relation")
        continuous = _names(self.continuous, "continuous")
        bad = [v for v in continuous if v not in variables or v not in non_join]
        if bad:
            raise ValueError(f"continuous variables {bad} must be non-join variables listed")
        ranges = dict(self.ranges or {})
        for v, r in ranges.items():
            if v not in self.continuous:
                raise ValueError(f"a range is given for {v!r}, which is not continuous")
            lo, hi = (float(x) for x in r)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise ValueError(f"range of {v!r} must be finite with lo <= hi, got {r!r}")
        if sql is None:
            query = ringml.covariance_query(schemas, variables, variables)
        else:
            query = sql.covariance_query(variables, variables)
        self.maintainer_ = ringml.Maintainer(query, order=self.order)
        self.feed_ = None if sql is None else sql.feed()
        self.query_ = query
        self.variables_ = tuple(variables)
        self.binners_ = {v: tuple(map(float, r)) for v, r in ranges.items()}

    def _prepare(self, updates: list[UpdateBatch]) -> list[UpdateBatch]:
        if not self.continuous:
            return updates
        binners = dict(self.binners_)  # fixed here, committed with the rest by _atomic
        out = []
        for batch in updates:
            rows = batch.rows
            todo = [v for v in self.continuous if v in rows.columns]
            if not todo:
                out.append(batch)
                continue
            rows = rows.copy()
            for v in todo:
                x = feature_numbers(rows[v], v, batch.relation).astype(np.float64, copy=False)
                if v not in binners and len(x):
                    binners[v] = (float(x.min()), float(x.max()))
                    if binners[v][0] == binners[v][1]:
                        warnings.warn(
                            f"the bins of {v!r} are fixed from a batch where it takes one "
                            f"value ({binners[v][0]!r}): later values go to the first or the "
                            f"last bin; pass ranges={{{v!r}: (lo, hi)}} to fix them",
                            UserWarning,
                            stacklevel=6,
                        )
                lo, hi = binners.get(v, (0.0, 0.0))
                rows[v] = equal_width_bins(x, lo, hi, int(self.n_bins))
            out.append(UpdateBatch(batch.relation, rows, batch.multiplicity))
        self.binners_ = binners
        return out

    def _refresh(self) -> None:
        ring = self.query_.ring
        tables = ring.count_tables(self.maintainer_.result())
        self.n_samples_seen_ = int(round(tables[()]))
        self.mutual_info_ = mutual_information_matrix(tables, list(self.variables_))
        self.entropy_ = pd.Series(
            np.diag(self.mutual_info_.to_numpy()), index=list(self.variables_)
        )
        self.tree_: nx.Graph = chow_liu_tree(self.mutual_info_)

    def bin(self, variable: str, values) -> np.ndarray:
        """The bins ``values`` of a continuous variable fall into (after fitting its range)."""
        check_is_fitted(self)
        if variable not in self.binners_:
            raise ValueError(f"{variable!r} has no fitted bins")
        lo, hi = self.binners_[variable]
        return equal_width_bins(np.asarray(values, dtype=np.float64), lo, hi, int(self.n_bins))
