"""Linear regression from a covariance payload (F-IVM §9.1.1-9.1.3).

One maintained covariance matrix ``Σ = [[c, sᵀ], [s, Q]]`` over a set of variables fits a
linear model for **any** label and **any** subset of the other variables as features: the
model only reads the rows and columns it needs (notes §9.1.1).

Objective (the reference solver's, §9.1.3, per count ``c``)::

    J(θ) = ½ ( mean squared residual + λ ‖β‖² )        θ = (intercept, β)

The intercept is never penalized.  Its minimizer solves
``(Σ_ff / c + λ·diag(0, 1, …, 1)) θ_f = Σ_{f,label} / c``.  scikit-learn's ``Ridge(alpha)``
minimizes ``‖y − Xβ − b‖² + α‖β‖²``, the same problem with ``alpha = λ · c``.

Two solvers, same answer:

* ``"bgd"``: batch gradient descent on Σ with the Barzilai–Borwein step and Armijo
  backtracking of the reference solver.  Differences from the reference, all for accuracy
  or speed, none changing the minimizer:

  - the intercept is eliminated exactly by centring (Σ's covariance block), and the
    features are scaled by the diagonal of the penalized system ``var_j + λ`` (Jacobi
    preconditioning: unit diagonal, so the conditioning does not depend on the features'
    units); results come back in original units;
  - the Armijo test compares against the largest loss of the last ``armijo_memory``
    iterations (Raydan's globalized BB; ``armijo_memory=1`` is the reference's monotone
    test, which on a quadratic clips nearly every BB step to the Cauchy step and turns BB
    into steepest descent); loss differences are computed from the quadratic's exact
    expansion, so they do not drown in the rounding of the loss itself;
  - stopping: the reference stops on ``|ΔJ| < 1e-8`` and a gradient reduced 1e5 times,
    which stops W12 about 1e-3 away from the minimizer.  Here the run stops when the
    gradient bounds the relative error of the (standardized) coefficients by ``tol``
    (``‖g‖ / λ_min ≤ tol·‖γ‖``; the floor is the attainable ``κ·ε``), when the step
    underflows, or after ``max_iter`` iterations.  A warm start that already satisfies
    the bound costs 0 iterations; otherwise, BGD converging linearly, a start at relative
    distance δ from the minimizer costs about ``ln(δ/tol) / ln(1/tol)`` of a start from
    zero — warm starts save in proportion to how little the *solution* moved (on the
    Housing stream of ``benchmarks/models.py`` a batch moves it by 0.05-10%, so they save
    about 2-3x over the stream, not the article's 30x).  ``stopping="reference"``
    restores the reference's rules (on the loss scaled by the label's variance) for
    comparisons with the article.

* ``"cholesky"``: the closed form, ``scipy.linalg.cho_factor`` on the same standardized
  system (rank-deficient systems fall back to the minimum-norm least-squares solution in
  standardized coordinates, flagged ``rank_deficient``).

Shifts.  Covariance payloads (both rings) hold moments of ``x' = x − h`` (``ring.shifts``;
one-hot columns are unshifted); with an intercept the slopes are shift-invariant and the
intercept in original units is ``θ₀' + h_y − Σ_j β_j h_j`` (the ring's docstring).  Without
an intercept the raw second moments are rebuilt from the shifted ones first.

Categorical features (generalized covariance ring, notes §9.2).  The payload keeps
``COUNT GROUP BY X``, ``SUM(Z) GROUP BY X`` and ``COUNT GROUP BY X, Y`` for the categories
that occur; the one-hot block of a categorical feature exists only inside the solver, one
column per category **present** in the payload.  With ``drop="first"`` (default) the first
category of each variable (in sorted order of the decoded values, as scikit-learn's
``OneHotEncoder(drop="first")``) is the reference category: its column is dropped, so the
design stays full-rank next to the intercept.  ``drop=None`` keeps every category; that is
identifiable with a ridge ``λ > 0`` or without an intercept (otherwise the system is
rank-deficient and the minimum-norm solution is returned).  At prediction time a category
the model has no column for (the reference category, or one never seen) contributes 0.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import scipy.linalg
from ringml.rings.categorical import GCPayload, GeneralizedCovarianceRing
from ringml.rings.covariance import CovarianceBatch, CovariancePayload, CovarianceRing

from ringml.batch import feature_numbers

__all__ = [
    "CovarianceRegression",
    "Design",
    "RegressionResult",
    "design_from_payload",
    "fit_from_sigma",
]

SOLVERS = ("bgd", "cholesky")
_EPS = np.finfo(np.float64).eps
#: a feature whose variance is below this fraction of its second moment is constant
_CONSTANT_RTOL = 1e-12

ColumnLabel = Hashable  # a continuous variable's name, or (variable, category) for one-hot


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class RegressionResult:
    """A fitted linear model and the solver's report.

    ``coef[j]`` belongs to ``columns[j]``: a variable name, or ``(variable, category)`` for
    a one-hot column of a categorical feature.  ``intercept`` is in original units (0.0
    without an intercept).  ``loss`` is ``J = ½(MSE + λ‖β‖²)`` over the payload's rows;
    ``grad_norm`` is ``‖∇J‖`` over the coefficients in original units; ``condition_number``
    is that of the standardized system matrix the solvers work on (``inf`` when singular).
    ``iterations`` counts gradient steps (``0`` for Cholesky and for warm starts that were
    already converged), ``backtracks`` Armijo halvings.
    """

    label: str
    columns: tuple
    coef: np.ndarray
    intercept: float
    fit_intercept: bool
    ridge: float
    solver: str
    count: float
    iterations: int = 0
    backtracks: int = 0
    loss: float = float("nan")
    grad_norm: float = float("nan")
    condition_number: float = float("nan")
    converged: bool = True
    stop_reason: str = "closed form"
    rank_deficient: bool = False
    step: float | None = field(default=None, repr=False)

    @property
    def coefficients(self) -> dict:
        """``{column label: coefficient}``."""
        return dict(zip(self.columns, self.coef.tolist(), strict=True))

    @property
    def theta(self) -> np.ndarray:
        """Reference layout ``(intercept, β…, −1)`` (label last, fixed to −1; §9.1.1)."""
        return np.concatenate([[self.intercept], self.coef, [-1.0]])


# --------------------------------------------------------------------------- designs
@dataclass(frozen=True)
class Design:
    """Σ over ``[1, columns…, label]`` plus what is needed to return to original units.

    ``categories[v]`` lists ``(category, column label or None)`` for every category of a
    categorical feature present in the payload; ``None`` marks the dropped reference.
    """

    sigma: np.ndarray
    columns: tuple
    label: str
    shifts: np.ndarray  # per column of sigma[1:, 1:] (features then label)
    categories: dict = field(default_factory=dict)

    @property
    def count(self) -> float:
        return float(self.sigma[0, 0])


def _norm(x: np.ndarray) -> float:
    """Euclidean norm of a vector (``np.linalg.norm``'s dispatch dominates at this size)."""
    return math.sqrt(float(x @ x))


def _unset_to_zero(shifts: np.ndarray) -> np.ndarray:
    """NaN (a shift not set yet) as 0; ``np.nan_to_num`` does the same 5x slower."""
    return np.where(np.isnan(shifts), 0.0, shifts)


def _resolve(names: Sequence[Hashable] | None, k: int, which: Any, what: str) -> int:
    if names is None:
        if isinstance(which, numbers.Integral) and not isinstance(which, bool):
            if 0 <= int(which) < k:
                return int(which)
        raise ValueError(f"{what} {which!r} is not a variable position in 0..{k - 1}")
    try:
        return list(names).index(which)
    except ValueError:
        raise ValueError(
            f"{what} {which!r} is not among the maintained variables {list(names)}"
        ) from None


def design_from_payload(
    ring: CovarianceRing | GeneralizedCovarianceRing,
    payload: CovariancePayload | CovarianceBatch | GCPayload,
    label: str,
    features: Sequence[str] | None = None,
    *,
    drop: str | None = "first",
    decode: Callable[[str, np.ndarray], Sequence] | None = None,
) -> Design:
    """Σ restricted to ``features`` (default: every other ring variable) and ``label``.

    ``decode(variable, codes)`` maps category codes of a generalized-ring payload back to
    values (e.g. :meth:`ringml.Maintainer.decode`); without it the codes are the values.
    """
    variables = list(ring.variables)
    if label not in variables:
        raise ValueError(f"label {label!r} is not among the maintained variables {variables}")
    feats = [v for v in variables if v != label] if features is None else list(features)
    for v in feats:
        if v not in variables:
            raise ValueError(f"feature {v!r} is not among the maintained variables {variables}")
    if label in feats:
        raise ValueError(f"the label {label!r} cannot also be a feature")
    if len(set(feats)) != len(feats):
        raise ValueError(f"features listed twice: {feats}")
    if drop not in ("first", None):
        raise ValueError(f"drop must be 'first' or None, got {drop!r}")
    if isinstance(ring, CovarianceRing):
        sigma = ring.sigma(payload, feats + [label])
        h = _unset_to_zero(ring.shifts[[ring.index_of(v) for v in feats + [label]]])
        return Design(sigma, tuple(feats), label, h)
    if isinstance(ring, GeneralizedCovarianceRing):
        return _generalized_design(ring, payload, label, feats, drop, decode)
    raise TypeError(f"regression needs a covariance ring, got {type(ring).__name__}")


def _generalized_design(ring, payload, label, feats, drop, decode) -> Design:
    if ring.is_categorical(label):
        raise ValueError(f"label {label!r} is categorical; regression needs a continuous label")
    cats: dict[str, list] = {}  # variable -> codes present, in sorted order of their values
    values: dict[str, dict] = {}
    stored = _stored_codes(ring, payload)
    for v in ring.categorical:
        # a category is present while its count is (a positive integer); other entries
        # keyed by an absent category are rounding residue of deletes and are ignored
        counts = ring.entry(payload, v)
        codes = [x for x, n in counts.items() if n > 0.5]
        decoded = list(decode(v, np.asarray(codes, dtype=np.int64))) if decode and codes else codes
        values[v] = dict(zip(codes, decoded, strict=True))
        cats[v] = [c for _, c in sorted(zip(decoded, codes, strict=True), key=_sort_key)]
    # the present categories first, then codes of absent ones that entries still carry
    dense = {v: cats[v] + sorted(stored[v] - set(cats[v])) for v in ring.categorical}
    # the stored (shifted) moments, so the solver centres them without cancellation
    count, s, Q = ring.to_dense(payload, dense, shifted=True)
    # dense column of every continuous variable / (categorical variable, code), in the
    # layout to_dense used (absent categories' columns included, so later ones line up)
    position: dict = {v: j for j, v in enumerate(ring.continuous)}
    at = len(ring.continuous)
    for v in ring.categorical:
        for c in dense[v]:
            position[(v, c)] = at
            at += 1
    pick: list[int] = []
    columns: list = []
    categories: dict = {}
    for v in feats:
        if not ring.is_categorical(v):
            pick.append(position[v])
            columns.append(v)
            continue
        categories[v] = []
        for t, c in enumerate(cats[v]):
            value = values[v][c]
            if drop == "first" and t == 0:
                categories[v].append((value, None))
                continue
            pick.append(position[(v, c)])
            columns.append((v, value))
            categories[v].append((value, (v, value)))
    pick.append(position[label])
    idx = np.asarray(pick, dtype=np.intp)
    sigma = np.empty((1 + len(idx), 1 + len(idx)))
    sigma[0, 0] = count
    sigma[0, 1:] = sigma[1:, 0] = s[idx]
    sigma[1:, 1:] = Q[np.ix_(idx, idx)]
    shifts = ring.dense_shifts(len(s))[idx]
    return Design(sigma, tuple(columns), label, shifts, categories)


def _stored_codes(ring: GeneralizedCovarianceRing, payload: GCPayload) -> dict[str, set]:
    """Every category code of every categorical variable that some entry is keyed by."""
    out: dict[str, set] = {v: set() for v in ring.categorical}
    p = len(ring.continuous)
    for i, rel in payload.sums.items():
        if i >= p and isinstance(rel, dict):
            out[ring.variables[i]].update(rel)
    for (i, j), rel in payload.products.items():
        if j < p or not isinstance(rel, dict):
            continue
        if i < p or i == j:
            out[ring.variables[j]].update(rel)
        else:
            for a, b in rel:
                out[ring.variables[i]].add(a)
                out[ring.variables[j]].add(b)
    return out


def _sort_key(item: tuple) -> tuple:
    value = item[0]
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


# ----------------------------------------------------------------- normal equations
def _normal_equations(
    sigma: np.ndarray, f: list[int], y: int, fit_intercept: bool, shifts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, float, np.ndarray]:
    """``(A, b, yy, mean_x, mean_y, scale)`` with ``A β = b`` the unpenalized equations.

    With an intercept: the covariance block of the shifted moments (centred, so the
    intercept is eliminated).  Without: raw second moments in original units.  ``scale``
    is each feature's second moment, to tell constant columns apart.
    """
    c = float(sigma[0, 0])
    m = sigma[0, 1:] / c  # means of the shifted variables
    Q = sigma[1:, 1:] / c
    if fit_intercept:
        M = Q - np.outer(m, m)
        scale = np.diag(Q)
    else:
        h = shifts
        M = Q + np.outer(m, h) + np.outer(h, m) + np.outer(h, h)
        scale = np.diag(M)
    means = m + shifts
    A = M[np.ix_(f, f)]
    A = (A + A.T) / 2.0
    return A, M[f, y], float(M[y, y]), means[f], float(means[y]), scale[f]


# -------------------------------------------------------------------------- solvers
@dataclass
class _Solution:
    gamma: np.ndarray
    iterations: int = 0
    backtracks: int = 0
    converged: bool = True
    reason: str = "closed form"
    step: float | None = None


def _eig_bounds(A: np.ndarray) -> tuple[float, float, float, bool]:
    """``(λ_min used for error bounds, λ_max, condition number, rank deficient)``."""
    if A.shape[0] == 0:
        return 1.0, 1.0, 1.0, False
    w = np.linalg.eigvalsh(A)  # (scipy's wrapper costs twice as much on small matrices)
    lmax = float(max(w[-1], 0.0))
    cutoff = max(A.shape[0], 1) * 16 * _EPS * lmax
    deficient = bool(w[0] <= cutoff)
    if lmax == 0.0:
        return 1.0, 0.0, math.inf, True
    above = w[w > cutoff]
    lmin = float(above[0]) if len(above) else lmax
    cond = math.inf if deficient else lmax / float(w[0])
    return lmin, lmax, cond, deficient


def _cholesky(A: np.ndarray, b: np.ndarray, deficient: bool) -> _Solution:
    if A.shape[0] == 0:
        return _Solution(np.zeros(0))
    if not deficient:
        try:
            factor = scipy.linalg.cho_factor(A, check_finite=False)
            return _Solution(scipy.linalg.cho_solve(factor, b, check_finite=False))
        except np.linalg.LinAlgError:
            pass
    gamma = scipy.linalg.lstsq(A, b, check_finite=False)[0]
    return _Solution(gamma, reason="least squares (rank deficient)")


def _bgd(
    A: np.ndarray,
    b: np.ndarray,
    gamma0: np.ndarray,
    step0: float | None,
    lmin: float,
    lmax: float,
    tol: float,
    max_iter: int,
    armijo_memory: int,
    stopping: str = "tight",
    yscale: float = 1.0,
) -> _Solution:
    """Minimize ``½γᵀAγ − bᵀγ`` by BB gradient descent with (nonmonotone) Armijo steps.

    ``stopping="reference"`` applies the reference solver's rules instead of the error
    bound, on the loss divided by ``yscale`` (the label's variance: the scale of the
    normalized data the reference was run on).
    """
    k = A.shape[0]
    gamma = np.array(gamma0, dtype=np.float64)
    if k == 0:
        return _Solution(gamma, reason="no features")
    # stop when ‖g‖/λ_min ≤ tol‖γ‖, but never ask for less than rounding allows (~κ·ε)
    thresh = max(tol * lmin, 64.0 * k * _EPS * lmax)
    g = A @ gamma - b
    bnorm = _norm(b)
    floor = bnorm / lmax if lmax else 0.0  # ‖γ‖ of the minimizer is at least ‖b‖/λ_max
    if bnorm == 0.0 and not np.any(gamma):
        return _Solution(gamma, reason="zero right-hand side", step=step0)
    step = float(step0) if step0 and step0 > 0 and math.isfinite(step0) else 0.1
    loss = 0.5 * float(gamma @ (g - b))  # ½γᵀAγ − bᵀγ
    history = [loss]
    backtracks = 0
    reference = stopping == "reference"
    sigma_y = math.sqrt(yscale) if yscale > 0 else 1.0
    first = float(np.linalg.norm(g)) / sigma_y  # ‖u_first‖ of the reference's rule
    for it in range(max_iter + 1):
        if it and it % 64 == 0:  # refresh the recurrence against rounding drift
            g = A @ gamma - b
            fresh = 0.5 * float(gamma @ (g - b))
            # move the remembered losses along, so Armijo keeps comparing exact differences
            history = [h + (fresh - loss) for h in history[-armijo_memory:]]
            loss = fresh
        gg = float(g @ g)
        gnorm = math.sqrt(gg)
        if reference:
            if gnorm / sigma_y / (first + 1e-3) < 1e-5:
                return _Solution(gamma, it, backtracks, True, "reference: gradient", step)
        elif gnorm <= thresh * max(_norm(gamma), floor):
            g = A @ gamma - b  # confirm on the exact gradient
            gnorm = _norm(g)
            if gnorm <= thresh * max(_norm(gamma), floor):
                return _Solution(gamma, it, backtracks, True, "gradient", step)
            gg = gnorm * gnorm
        if it == max_iter:
            break
        Ag = A @ g
        gAg = float(g @ Ag)
        if gAg <= 0.0:  # g lies in the null space of a singular A: nothing left to gain
            return _Solution(gamma, it, backtracks, True, "null space", step)
        slack = max(history[-armijo_memory:]) - loss  # >= 0; 0 for the monotone test
        bb_step, halvings = step, 0
        # J(γ − t g) = J(γ) − t gg + ½ t² gAg  ≤  ref − (t/2) gg   (Armijo, c = ½)
        while step * (0.5 * step * gAg - 0.5 * gg) > slack and halvings < 500:
            step *= 0.5
            halvings += 1
        backtracks += halvings
        if step * gnorm <= 1e-20 or step * gnorm <= _EPS * _norm(gamma) * 1e-3:
            return _Solution(gamma, it, backtracks, False, "step underflow", bb_step)
        gamma = gamma - step * g
        change = step * gg - 0.5 * step * step * gAg
        loss = loss - change
        history.append(loss)
        g = g - step * Ag
        if reference and abs(change) / (sigma_y * sigma_y) < 1e-8:
            return _Solution(gamma, it + 1, backtracks, True, "reference: loss change", step)
        # Barzilai–Borwein with Δγ = −t g, Δg = −t A g (reference's BB1/BB2 blend)
        AgAg = float(Ag @ Ag)
        if AgAg > 0.0:
            ts = gg / gAg  # DSS / DGS
            tm = gAg / AgAg  # DGS / GSS
            step = tm if tm / ts > 0.5 else ts - 0.5 * tm
    return _Solution(gamma, max_iter, backtracks, False, "max_iter", step)


# --------------------------------------------------------------------- the core fit
def fit_from_sigma(
    sigma: np.ndarray,
    label: Hashable,
    features: Sequence[Hashable] | None = None,
    ridge: float = 0.0,
    *,
    variables: Sequence[Hashable] | None = None,
    fit_intercept: bool = True,
    shifts: Sequence[float] | np.ndarray | None = None,
    solver: str = "bgd",
    theta0: Mapping[Hashable, float] | Sequence[float] | None = None,
    step0: float | None = None,
    tol: float = 1e-10,
    max_iter: int = 10_000,
    armijo_memory: int = 10,
    stopping: str = "tight",
) -> RegressionResult:
    """Fit ``label ≈ intercept + Σ_j β_j · feature_j`` from ``Σ = [[c, sᵀ], [s, Q]]``.

    ``sigma`` is ``(1+k) x (1+k)`` over ``variables`` (``k`` names; default: positions
    ``0..k-1``, so ``label``/``features`` may be positions).  ``features`` default to every
    other variable.  ``ridge`` is the per-count ``λ`` of the reference (never on the
    intercept).  ``shifts`` are the per-variable shifts the moments were taken around
    (``ring.shifts``; default 0): results are in original units.  ``theta0`` warm-starts
    BGD with coefficients in original units (a mapping by column label, or one value per
    feature); ``step0`` warm-starts its step size.  ``stopping="reference"`` swaps the
    error-bound stopping rule for the reference solver's (``|ΔJ| < 1e-8`` and a gradient
    reduced 1e5 times, on the loss scaled by the label's variance): far fewer iterations,
    coefficients only about 1e-4 from the minimizer.  Raises ``ValueError`` for a label or
    feature that is not a variable, a negative ridge, a non-finite Σ or a zero count.
    """
    sigma = np.asarray(sigma, dtype=np.float64)
    if sigma.ndim != 2 or sigma.shape[0] != sigma.shape[1] or sigma.shape[0] < 2:
        raise ValueError(f"sigma must be a (1+k) x (1+k) matrix with k >= 1, got {sigma.shape}")
    k = sigma.shape[0] - 1
    if variables is not None and len(variables) != k:
        raise ValueError(f"{len(variables)} variable names for a sigma over {k} variables")
    if not np.all(np.isfinite(sigma)):
        raise ValueError("sigma contains NaN or infinite entries")
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
    ridge = float(ridge)
    if not (ridge >= 0.0 and math.isfinite(ridge)):
        raise ValueError(f"ridge must be a finite number >= 0, got {ridge!r}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    if stopping not in ("tight", "reference"):
        raise ValueError(f"stopping must be 'tight' or 'reference', got {stopping!r}")
    if int(max_iter) < 0 or int(armijo_memory) < 1:
        raise ValueError("max_iter must be >= 0 and armijo_memory >= 1")
    y = _resolve(variables, k, label, "label")
    if features is None:
        f = [j for j in range(k) if j != y]
    else:
        f = [_resolve(variables, k, v, "feature") for v in features]
        if y in f:
            raise ValueError(f"the label {label!r} cannot also be a feature")
        if len(set(f)) != len(f):
            raise ValueError(f"features listed twice: {list(features)}")
    names = list(range(k)) if variables is None else list(variables)
    columns = tuple(names[j] for j in f)
    h = np.zeros(k) if shifts is None else _unset_to_zero(np.asarray(shifts, float))
    if h.shape != (k,):
        raise ValueError(f"shifts must have one value per variable ({k}), got {h.shape}")
    c = float(sigma[0, 0])
    if not c > 0:
        raise ValueError(f"cannot fit a regression on {c:g} rows (the payload's count)")

    A0, b0, yy, mean_x, mean_y, scale = _normal_equations(sigma, f, y, fit_intercept, h)
    var = np.diag(A0).copy()
    live = var > _CONSTANT_RTOL * np.maximum(scale, 0.0)
    live &= var > 0.0
    # Jacobi scaling by the diagonal of the penalized system, so that diag(A) = 1: the
    # variance alone would leave λ/var_j on the diagonal, which for a feature in small units
    # (var ≪ λ) makes the system as ill-conditioned as the units are disparate
    d = np.sqrt(np.where(live, var + ridge, 1.0))
    L = np.flatnonzero(live)
    A = (A0[np.ix_(L, L)] + ridge * np.eye(len(L))) / np.outer(d[L], d[L])
    b = b0[L] / d[L]
    lmin, lmax, cond, deficient = _eig_bounds(A)

    A_raw = A0[np.ix_(L, L)] + ridge * np.eye(len(L)) if deficient and len(L) else None
    if solver == "cholesky" and deficient:
        # no unique minimizer: the minimum-norm one in original units, as scikit-learn's
        # LinearRegression (lstsq on centred data) returns
        raw = (
            np.zeros(0)
            if A_raw is None
            else scipy.linalg.lstsq(A_raw, b0[L], check_finite=False)[0]
        )
        sol = _Solution(raw * d[L], reason="least squares (rank deficient)")
    elif solver == "cholesky":
        sol = _cholesky(A, b, deficient)
    else:
        beta0 = np.zeros(len(f))
        if isinstance(theta0, Mapping):
            beta0 = np.asarray([float(theta0.get(col, 0.0)) for col in columns])
        elif theta0 is not None:
            beta0 = np.asarray(theta0, dtype=np.float64).reshape(-1)
            if beta0.shape != (len(f),):
                raise ValueError(f"theta0 needs {len(f)} coefficients, got {beta0.shape}")
        beta0 = np.where(np.isfinite(beta0), beta0, 0.0)
        sol = _bgd(
            A, b, beta0[L] * d[L], step0, lmin, lmax, tol, int(max_iter), armijo_memory,
            stopping, yy,
        )  # fmt: skip
        if A_raw is not None:
            # every minimizer fits alike; BGD reaches the one nearest its start in scaled
            # units: project it onto A's range, the minimum-norm minimizer in original
            # units (the closed form's), whatever the start or the order of the batches
            raw = sol.gamma / d[L]
            sol.gamma = scipy.linalg.lstsq(A_raw, A_raw @ raw, check_finite=False)[0] * d[L]
    beta = np.zeros(len(f))
    beta[L] = sol.gamma / d[L]
    grad = (A0 @ beta - b0) + ridge * beta
    loss = 0.5 * (yy - 2.0 * float(beta @ b0) + float(beta @ A0 @ beta) + ridge * (beta @ beta))
    if fit_intercept:
        intercept = mean_y - float(beta @ mean_x)
    else:
        intercept = 0.0
    return RegressionResult(
        label=str(names[y]) if isinstance(names[y], str) else names[y],
        columns=columns,
        coef=beta,
        intercept=float(intercept),
        fit_intercept=bool(fit_intercept),
        ridge=ridge,
        solver=solver,
        count=c,
        iterations=sol.iterations,
        backtracks=sol.backtracks,
        loss=float(loss),
        grad_norm=float(np.linalg.norm(grad)),
        condition_number=float(cond),
        converged=sol.converged,
        stop_reason=sol.reason,
        rank_deficient=deficient,
        step=sol.step,
    )


# ------------------------------------------------------------ the warm-started model
class CovarianceRegression:
    """A linear model kept fresh from a maintained covariance payload, warm-started.

    ``label`` and ``features`` name ring variables (``features=None``: every other
    variable of the ring).  Each :meth:`refresh` solves on the current payload starting
    from the previous coefficients (``warm_start=True``) and the previous BB step;
    ``warm_start=False`` restarts from zero every time (the reference's SCRATCH).
    ``history`` keeps every :class:`RegressionResult` (none with ``keep_history=False``,
    for long streams); ``total_iterations`` sums their iterations either way.
    ``stopping="tight"`` (default) stops BGD when the gradient bounds the coefficients'
    relative error by ``tol``; ``"reference"`` uses the reference solver's looser rules.
    ``fit_intercept=False`` fits no intercept.  See the module docstring for ``ridge``,
    ``drop``, ``tol``, ``max_iter``, ``armijo_memory`` and the solvers.
    """

    def __init__(
        self,
        label: str,
        features: Sequence[str] | None = None,
        *,
        ridge: float = 0.0,
        fit_intercept: bool = True,
        solver: str = "bgd",
        tol: float = 1e-10,
        max_iter: int = 10_000,
        warm_start: bool = True,
        drop: str | None = "first",
        armijo_memory: int = 10,
        stopping: str = "tight",
        keep_history: bool = True,
    ) -> None:
        self.label = label
        self.features = None if features is None else list(features)
        self.ridge = ridge
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.drop = drop
        self.armijo_memory = armijo_memory
        self.stopping = stopping
        self.keep_history = keep_history
        self.result: RegressionResult | None = None
        self.design: Design | None = None
        self.history: list[RegressionResult] = []
        self.total_iterations = 0
        self._solved_with: dict[str, Any] | None = None

    _SOLVER_PARAMS = (
        "ridge", "fit_intercept", "solver", "tol", "max_iter", "armijo_memory", "stopping",
    )  # fmt: skip

    def _solver_params(self) -> dict[str, Any]:
        """The attributes that shape a fit of a given design."""
        return {name: getattr(self, name) for name in self._SOLVER_PARAMS}

    def reset(self) -> None:
        """Forget the coefficients, the step and the history."""
        self.result = None
        self.design = None
        self._solved_with = None
        self.history = []
        self.total_iterations = 0

    def refresh(
        self,
        ring: CovarianceRing | GeneralizedCovarianceRing,
        payload: Any,
        decode: Callable[[str, np.ndarray], Sequence] | None = None,
    ) -> RegressionResult:
        """Refit on ``payload`` (a root payload of ``ring``); returns the new result."""
        design = design_from_payload(
            ring, payload, self.label, self.features, drop=self.drop, decode=decode
        )
        return self.refresh_design(design)

    def refresh_design(self, design: Design) -> RegressionResult:
        """Refit on a prepared :class:`Design`."""
        warm = self.warm_start and self.result is not None
        if warm and self._unchanged(design):
            # the same Σ (a batch that joined nothing): the converged fit stands, 0 iterations
            result = replace(self.result, iterations=0, backtracks=0)
            self.result = result
            if self.keep_history:
                self.history.append(result)
            return result
        result = fit_from_sigma(
            design.sigma,
            len(design.columns),  # the label is Σ's last variable; every other is a feature
            None,
            self.ridge,
            fit_intercept=self.fit_intercept,
            shifts=design.shifts,
            solver=self.solver,
            theta0=self._theta0(design.columns) if warm else None,
            step0=self.result.step if warm else None,
            tol=self.tol,
            max_iter=self.max_iter,
            armijo_memory=self.armijo_memory,
            stopping=self.stopping,
        )
        # fit_from_sigma saw positions; give the result its real labels
        result = _relabel(result, design.columns, design.label)
        self.result, self.design = result, design
        self._solved_with = self._solver_params()
        self.total_iterations += result.iterations
        if self.keep_history:
            self.history.append(result)
        return result

    def _unchanged(self, design: Design) -> bool:
        """Whether ``design`` is the last converged fit's, exactly, and the parameters
        that shape a fit (ridge, solver, tol, ...) are the ones it was solved with."""
        last = self.design
        return (
            last is not None
            and self.result.converged
            and getattr(self, "_solved_with", None) == self._solver_params()
            and design.columns == last.columns
            and np.array_equal(design.sigma, last.sigma)
            and np.array_equal(design.shifts, last.shifts)
        )

    def _theta0(self, columns: Sequence) -> np.ndarray:
        old = self.result.coefficients if self.result is not None else {}
        return np.asarray([old.get(col, 0.0) for col in columns], dtype=np.float64)

    # -------------------------------------------------------------- read-outs
    @property
    def coef_(self) -> dict:
        self._check()
        return self.result.coefficients

    @property
    def intercept_(self) -> float:
        self._check()
        return self.result.intercept

    def _check(self) -> None:
        if self.result is None:
            raise RuntimeError("the model has not been refreshed yet")

    def predict(self, X: pd.DataFrame | Mapping[str, Sequence]) -> np.ndarray:
        """Predictions for rows with one column per feature variable."""
        self._check()
        return predict_frame(self.result, self.design, X)


def _relabel(result: RegressionResult, columns: tuple, label: str) -> RegressionResult:
    return replace(result, columns=tuple(columns), label=label)


def predict_frame(
    result: RegressionResult, design: Design | None, X: pd.DataFrame | Mapping[str, Sequence]
) -> np.ndarray:
    """``intercept + Σ β_j x_j`` for a frame of feature columns.

    One-hot columns ``(variable, category)`` are 1 where the row's value equals the
    category; unknown and reference categories contribute 0.  Raises ``ValueError`` for a
    missing feature column and :class:`~ringml.errors.BatchError` for a continuous value
    the engine would not take as a feature (numeric strings, booleans, None, NaN, ...).
    """
    frame = X if isinstance(X, pd.DataFrame) else pd.DataFrame(X)
    out = np.full(len(frame), result.intercept, dtype=np.float64)
    categorical: dict[str, list[tuple]] = {}
    for col, beta in zip(result.columns, result.coef, strict=True):
        if isinstance(col, tuple):
            categorical.setdefault(col[0], []).append((col[1], beta))
            continue
        if col not in frame.columns:
            raise ValueError(f"missing feature column {col!r}")
        out += beta * feature_numbers(frame[col], col).astype(np.float64, copy=False)
    names = list(design.categories) if design is not None else list(categorical)
    for var in names:
        if var not in frame.columns:
            raise ValueError(f"missing feature column {var!r}")
        table = dict(categorical.get(var, []))
        if table:
            values = frame[var].map(lambda v, t=table: t.get(v, 0.0))
            out += values.to_numpy(dtype=np.float64)
    return out
