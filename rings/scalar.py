"""Scalar rings: ℤ (COUNT, multiplicities), ℝ (SUM) and products of rings (several aggregates).

* :class:`IntegerRing` -- ℤ.  Scalar elements are Python ``int`` (exact, unbounded).  Batches are
  ``int64`` numpy arrays, so batched values must lie in ``[-2**63, 2**63 - 1]``; every batched
  operation that can leave that range (add, neg, mul, scale, sum_by, scatter_add, lift) checks
  for overflow and raises :class:`RingError` instead of wrapping around.  The checks are cheap:
  a sign test for additions and a float-magnitude pre-test (exact re-check only when some
  magnitude reaches ``2**62``) for products and group sums.
* :class:`RealRing` -- ℝ.  Scalar elements are Python ``float``; batches are ``float64`` arrays.
* :class:`ProductRing` -- ``D_1 × ... × D_k`` with componentwise operations; an element is a
  tuple of component elements and a batch a tuple of component batches.
  :class:`AverageRing` / :func:`average_ring` is ``(SUM(X), COUNT)`` with :meth:`AverageRing.value`.

Lifting (``g_X``): a ring built with ``lifted=[...]`` lifts those variables to their value
(``x ↦ x``), or with ``lifted={"X": f}`` to ``f(x)``; every other variable lifts to ``1``.
"""

from __future__ import annotations

import math
import numbers
import struct
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from functools import reduce
from typing import Any

import numpy as np
from ringml.rings.base import Ring, RingError

__all__ = [
    "AverageRing",
    "IntegerRing",
    "ProductRing",
    "RealRing",
    "average_ring",
    "checked_add",
    "checked_mul",
    "checked_mul_sum",
    "checked_neg",
    "checked_sum_by",
    "int64_wrapped",
]

INT64_MIN = int(np.iinfo(np.int64).min)
INT64_MAX = int(np.iinfo(np.int64).max)
_SAFE_MAGNITUDE = 2.0**62  # below this a float estimate proves an int64 result fits

#: The absolute threshold of :meth:`RealRing.batch_is_negligible`.
NEGLIGIBLE = 1e-12


# --------------------------------------------------------------------- int64 checked arithmetic
def _overflow(what: str) -> RingError:
    return RingError(f"int64 overflow in {what}: batched integers must lie in [-2**63, 2**63-1]")


def int64_wrapped(op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Where the int64 ``a op b`` (``op`` one of ``+ - *``; ``out``: the results as numpy
    computed them, wrapping around) left int64, exactly: sign tests for sums and
    differences; for products a float bound, and where it reaches ``2**62`` the test
    ``out // b == a``."""
    if op == "+":
        return ((a ^ out) & (b ^ out)) < 0
    if op == "-":
        return ((a ^ b) & (a ^ out)) < 0
    suspicious = np.abs(a.astype(np.float64) * b.astype(np.float64)) >= _SAFE_MAGNITUDE
    if not suspicious.any():
        return suspicious
    with np.errstate(all="ignore"):
        nonzero = b != 0
        wrong = nonzero & (np.floor_divide(out, np.where(nonzero, b, 1)) != a)
    wrong |= ((a == INT64_MIN) & (b == -1)) | ((b == INT64_MIN) & (a == -1))
    return suspicious & wrong


def checked_add(a: np.ndarray, b: np.ndarray, what: str = "addition") -> np.ndarray:
    """``a + b`` on int64 arrays; :class:`RingError` on overflow (sign test, no wrap-around)."""
    with np.errstate(over="ignore"):
        s = np.add(a, b, dtype=np.int64)
    if s.size and int64_wrapped("+", a, b, s).any():
        raise _overflow(what)
    return s


def checked_neg(a: np.ndarray, what: str = "negation") -> np.ndarray:
    """``-a`` on an int64 array; :class:`RingError` for ``-2**63``."""
    if a.size and a.min() == INT64_MIN:
        raise _overflow(what)
    return np.negative(a)


def checked_mul(a: np.ndarray, b: np.ndarray, what: str = "multiplication") -> np.ndarray:
    """``a * b`` on int64 arrays; :class:`RingError` on overflow.

    A float product bounds the magnitude; only if it reaches ``2**62`` is the exact test
    ``(a*b) // b == a`` (on the wrapped product) run.
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    with np.errstate(over="ignore"):
        p = np.multiply(a, b)
    if p.size and int64_wrapped("*", a, b, p).any():
        raise _overflow(what)
    return p


def checked_sum_by(a: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Scatter-add of an int64 array into ``n_groups`` groups, exact, overflow-checked."""
    groups = _check_groups(groups, len(a), n_groups)
    out = np.zeros(n_groups, dtype=np.int64)
    if not len(a):
        return out
    bound = np.bincount(groups, weights=np.abs(a.astype(np.float64)), minlength=n_groups)
    with np.errstate(over="ignore"):
        np.add.at(out, groups, a)
    if bound.max() >= _SAFE_MAGNITUDE:
        # rare: recompute the suspicious groups with Python integers and range-check them
        suspicious = np.flatnonzero(bound >= _SAFE_MAGNITUDE)
        sel = np.isin(groups, suspicious)
        exact = np.zeros(n_groups, dtype=object)
        np.add.at(exact, groups[sel], a[sel].astype(object))
        for g in suspicious.tolist():
            if not INT64_MIN <= exact[g] <= INT64_MAX:
                raise _overflow("sum")
    return out


def checked_mul_sum(factors: Sequence[np.ndarray], groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group the sum of the products of int64 ``factors``, exact: a product beyond
    int64 is no overflow while its group's sum is back in range (``2**62 * 2 - 2**62``);
    :class:`RingError` for a sum that leaves int64.

    A float product bounds every product's magnitude; the groups of the rare ones reaching
    ``2**62`` are summed again with Python integers."""
    if len(factors) == 1:
        return checked_sum_by(factors[0], groups, n_groups)
    groups = _check_groups(groups, len(factors[0]), n_groups)
    with np.errstate(over="ignore"):
        product = reduce(np.multiply, factors)  # wraps only where a product leaves int64
        estimate = reduce(np.multiply, [np.abs(f.astype(np.float64)) for f in factors])
    large = estimate >= _SAFE_MAGNITUDE
    if not large.any():
        return checked_sum_by(product, groups, n_groups)
    suspicious = np.zeros(n_groups, dtype=bool)
    suspicious[groups[large]] = True
    rows = suspicious[groups]
    out = checked_sum_by(np.where(rows, 0, product), groups, n_groups)
    exact = np.zeros(n_groups, dtype=object)
    np.add.at(exact, groups[rows], reduce(np.multiply, [f[rows].astype(object) for f in factors]))
    sums = exact[suspicious]
    if any(not INT64_MIN <= s <= INT64_MAX for s in sums):
        raise _overflow("sum")
    out[suspicious] = sums.astype(np.int64)
    return out


def _check_groups(groups: np.ndarray, n: int, n_groups: int) -> np.ndarray:
    groups = np.asarray(groups, dtype=np.int64)
    if groups.shape != (n,):
        raise RingError(f"groups has shape {groups.shape}, expected ({n},)")
    if n and (groups.min() < 0 or groups.max() >= n_groups):
        raise RingError(f"group ids must lie in [0, {n_groups})")
    return groups


# ------------------------------------------------------------------------- value validation
def _bad_value(ring: str, variable: str, value: Any, why: str) -> RingError:
    return RingError(f"{ring}: cannot lift variable {variable!r} value {value!r}: {why}")


def _is_int_like(x: Any) -> bool:
    if isinstance(x, (str, bytes)):
        return False
    if isinstance(x, numbers.Integral):
        return INT64_MIN <= int(x) <= INT64_MAX
    if isinstance(x, numbers.Real):
        f = float(x)
        return math.isfinite(f) and f == math.floor(f) and -(2.0**63) <= f < 2.0**63
    return False


def _is_real_like(x: Any) -> bool:
    if isinstance(x, (str, bytes)) or not isinstance(x, numbers.Real):
        return False
    return math.isfinite(float(x))


_int_like_vec = np.frompyfunc(_is_int_like, 1, 1)
_real_like_vec = np.frompyfunc(_is_real_like, 1, 1)


def as_int64_column(values: Any, variable: str, ring: str) -> np.ndarray:
    """Validate a column of integral values and return it as int64.

    Accepts integer, bool and integral float dtypes; object arrays holding Python numbers
    (validated element by element -- they are Python objects already).  Strings, NaN, ±inf,
    non-integral floats and out-of-range values raise :class:`RingError` naming the variable
    and the first bad value.
    """
    v = np.asarray(values)
    if v.ndim != 1:
        v = v.reshape(-1)
    kind = v.dtype.kind
    if kind in "b":
        return v.astype(np.int64)
    if kind == "i":
        return v.astype(np.int64, copy=False)
    if kind == "u":
        bad = v > np.uint64(INT64_MAX)
    elif kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(v) | (v != np.trunc(v)) | (np.abs(v) >= 2.0**63)
    elif kind == "O":
        bad = ~_int_like_vec(v).astype(bool) if v.size else np.zeros(0, dtype=bool)
    else:
        if not v.size:
            return np.zeros(0, dtype=np.int64)
        raise _bad_value(ring, variable, v[0].item() if v.size else v, f"dtype {v.dtype}")
    if bad.any():
        first = v[np.flatnonzero(bad)[0]]
        first = first.item() if isinstance(first, np.generic) else first
        raise _bad_value(ring, variable, first, "not an integer in the int64 range")
    return v.astype(np.int64)


def as_float64_column(values: Any, variable: str, ring: str) -> np.ndarray:
    """Validate a column of finite real values and return it as float64 (see above)."""
    v = np.asarray(values)
    if v.ndim != 1:
        v = v.reshape(-1)
    kind = v.dtype.kind
    if kind in "biu":
        return v.astype(np.float64)
    if kind == "f":
        bad = ~np.isfinite(v)
    elif kind == "O":
        bad = ~_real_like_vec(v).astype(bool) if v.size else np.zeros(0, dtype=bool)
    else:
        if not v.size:
            return np.zeros(0, dtype=np.float64)
        raise _bad_value(ring, variable, v[0].item(), f"dtype {v.dtype}")
    if bad.any():
        first = v[np.flatnonzero(bad)[0]]
        first = first.item() if isinstance(first, np.generic) else first
        raise _bad_value(ring, variable, first, "not a finite real number")
    return v.astype(np.float64)


def _int_value(ring: str, variable: str, value: Any, source: Any = None) -> int:
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real):
        raise _bad_value(ring, variable, source if source is not None else value, "not a number")
    if isinstance(value, numbers.Integral):
        return int(value)
    f = float(value)
    if not math.isfinite(f) or f != math.floor(f):
        raise _bad_value(ring, variable, source if source is not None else value, "not integral")
    return int(value)


def _real_value(ring: str, variable: str, value: Any, source: Any = None) -> float:
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real):
        raise _bad_value(ring, variable, source if source is not None else value, "not a number")
    f = float(value)
    if not math.isfinite(f):
        raise _bad_value(ring, variable, source if source is not None else value, "not finite")
    return f


def _normalize_lifted(lifted: Mapping[str, Callable] | Sequence[str]) -> dict[str, Callable | None]:
    if isinstance(lifted, str):
        return {lifted: None}
    if isinstance(lifted, Mapping):
        out: dict[str, Callable | None] = {}
        for k, f in lifted.items():
            if f is not None and not callable(f):
                raise RingError(f"lift of {k!r} must be callable or None, got {f!r}")
            out[str(k)] = f
        return out
    return {str(k): None for k in lifted}


# ------------------------------------------------------------------------------ numeric base
class _NumericRing(Ring):
    """Shared code of ℤ and ℝ: 1-D arrays, lifts ``x ↦ f(x)`` for the listed variables."""

    dtype: np.dtype

    def __init__(self, lifted: Mapping[str, Callable] | Sequence[str] = ()) -> None:
        self._lifts = _normalize_lifted(lifted)

    # identity of rings (check_same_ring)
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._lifts == self._lifts  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self._lifts.items(), key=lambda kv: kv[0]))))

    def __repr__(self) -> str:
        if not self._lifts:
            return f"{type(self).__name__}()"
        if all(f is None for f in self._lifts.values()):
            return f"{type(self).__name__}({sorted(self._lifts)!r})"
        return f"{type(self).__name__}({self._lifts!r})"

    @property
    def lifted_variables(self) -> frozenset[str]:
        return frozenset(self._lifts)

    # ---- batched face shared
    def _arr(self, a: Any) -> np.ndarray:
        if not isinstance(a, np.ndarray) or a.dtype != self.dtype or a.ndim != 1:
            raise RingError(f"{self!r}: expected a 1-D {self.dtype} batch, got {type(a).__name__}")
        return a

    def _pair(self, a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
        a, b = self._arr(a), self._arr(b)
        if a.shape != b.shape:
            raise RingError(f"{self!r}: batches of lengths {len(a)} and {len(b)}")
        return a, b

    def batch_zeros(self, n: int) -> np.ndarray:
        return np.zeros(n, dtype=self.dtype)

    def batch_ones(self, n: int) -> np.ndarray:
        return np.ones(n, dtype=self.dtype)

    def batch_len(self, batch: np.ndarray) -> int:
        return len(self._arr(batch))

    def batch_take(self, batch: np.ndarray, index: np.ndarray) -> np.ndarray:
        return self._arr(batch)[np.asarray(index, dtype=np.int64)]

    def batch_concat(self, batches: Sequence[np.ndarray]) -> np.ndarray:
        if not batches:
            return self.batch_zeros(0)
        return np.concatenate([self._arr(b) for b in batches])

    def batch_is_zero(self, a: np.ndarray) -> np.ndarray:
        return self._arr(a) == 0

    def batch_clear(self, target: np.ndarray, slots: np.ndarray) -> np.ndarray:
        self._arr(target)[np.asarray(slots, dtype=np.int64)] = 0
        return target

    def batch_resize(self, batch: np.ndarray, n: int) -> np.ndarray:
        batch = self._arr(batch)
        out = np.zeros(n, dtype=self.dtype)
        m = min(n, len(batch))
        out[:m] = batch[:m]
        return out

    def batch_to_bytes(self, batch: np.ndarray) -> bytes:
        return self._arr(batch).astype(self.dtype.newbyteorder("<"), copy=False).tobytes()

    def batch_from_bytes(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=self.dtype.newbyteorder("<")).astype(self.dtype)

    def lift(self, variable: str, value: Any) -> Any:
        if variable not in self._lifts:
            return self.one()
        f = self._lifts[variable]
        return self._scalar_value(variable, value if f is None else f(value), value)

    def batch_lift(self, variable: str, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        n = values.size
        if variable not in self._lifts:
            return self.batch_ones(n)
        f = self._lifts[variable]
        if f is None:
            return self._column(variable, values)
        out = np.asarray(f(values))
        if out.shape != (n,):
            out = out.reshape(-1) if out.size == n else None
        if out is None:
            raise RingError(
                f"{self!r}: the lift of {variable!r} must map a column of {n} values to {n} values"
            )
        return self._column(variable, out)

    @abstractmethod
    def _scalar_value(self, variable: str, value: Any, source: Any) -> Any:
        """One lifted value of ``variable``, validated for this ring."""

    @abstractmethod
    def _column(self, variable: str, values: np.ndarray) -> np.ndarray:
        """A column of lifted values of ``variable``, validated for this ring."""


# ------------------------------------------------------------------------------------ ℤ
class IntegerRing(_NumericRing):
    """ℤ: multiplicities and COUNT.

    Scalar elements are Python ints (exact, unbounded).  Batches are int64 arrays: values in
    ``[-2**63, 2**63-1]``; overflow raises :class:`RingError`.  ``lifted`` names the variables
    lifted to their (integral) value, or maps them to a function whose result must be integral
    (the function receives a scalar on the scalar face and a numpy column on the batched face).
    Lifting a string, NaN, ±inf or a non-integral number raises :class:`RingError`.
    """

    name = "integer"
    dtype = np.dtype(np.int64)

    # scalar face
    def zero(self) -> int:
        return 0

    def one(self) -> int:
        return 1

    def add(self, a: int, b: int) -> int:
        return a + b

    def mul(self, a: int, b: int) -> int:
        return a * b

    def neg(self, a: int) -> int:
        return -a

    def sub(self, a: int, b: int) -> int:
        return a - b

    def scale(self, a: int, k: int) -> int:
        return int(k) * a

    def is_zero(self, a: int) -> bool:
        return a == 0

    def equal(self, a: int, b: int, rtol: float = 0.0, atol: float = 0.0) -> bool:
        if a == b:
            return True
        return bool(abs(a - b) <= atol + rtol * abs(b))

    def to_bytes(self, a: int) -> bytes:
        a = int(a)
        return a.to_bytes((a.bit_length() + 8) // 8, "little", signed=True)

    def from_bytes(self, data: bytes) -> int:
        return int.from_bytes(data, "little", signed=True)

    def _scalar_value(self, variable: str, value: Any, source: Any) -> int:
        return _int_value(repr(self), variable, value, source)

    def _column(self, variable: str, values: np.ndarray) -> np.ndarray:
        return as_int64_column(values, variable, repr(self))

    # batched face
    def batch_from(self, elements: Sequence[int]) -> np.ndarray:
        try:
            return as_int64_column(np.asarray(list(elements)), "", repr(self))
        except RingError as e:
            raise RingError(f"{self!r}: payloads do not fit an int64 batch ({e})") from None

    def batch_to_list(self, batch: np.ndarray) -> list[int]:
        return self._arr(batch).tolist()

    def batch_add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return checked_add(*self._pair(a, b))

    def batch_sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        with np.errstate(over="ignore"):
            s = np.subtract(a, b)
        if s.size and int64_wrapped("-", a, b, s).any():
            raise _overflow("subtraction")
        return s

    def batch_neg(self, a: np.ndarray) -> np.ndarray:
        return checked_neg(self._arr(a))

    def batch_mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return checked_mul(*self._pair(a, b))

    def batch_scale(self, a: np.ndarray, k: np.ndarray) -> np.ndarray:
        a = self._arr(a)
        k = np.asarray(k, dtype=np.int64)
        if k.shape != a.shape:
            raise RingError(f"scale factors of shape {k.shape} for a batch of {len(a)}")
        return checked_mul(a, k, "scaling")

    def batch_sum_by(self, a: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
        return checked_sum_by(self._arr(a), groups, n_groups)

    def batch_mul_sum(self, factors, groups=None, n_groups: int = 1) -> np.ndarray:
        """Exact (:func:`checked_mul_sum`): only a sum that leaves int64 overflows."""
        arrays = [self._arr(f) for f in factors]
        if any(a.shape != arrays[0].shape for a in arrays):
            raise RingError(f"{self!r}: factor batches of different lengths")
        if groups is None:
            groups, n_groups = np.zeros(len(arrays[0]), dtype=np.int64), 1
        return checked_mul_sum(arrays, groups, n_groups)

    def batch_scaled_mul_sum(self, factors, scale, groups=None, n_groups: int = 1):
        """The multiplicities are one more factor of the exact :meth:`batch_mul_sum`."""
        if scale is not None:
            factors = [*factors, np.asarray(scale, dtype=np.int64)]
        return self.batch_mul_sum(factors, groups, n_groups)

    def batch_sum(self, a: np.ndarray) -> int:
        a = self._arr(a)
        if not len(a) or np.abs(a.astype(np.float64)).sum() < _SAFE_MAGNITUDE:
            return int(a.sum())
        return sum(a.tolist())  # exact Python ints: the scalar face is unbounded

    def batch_multiplicities(self, a: np.ndarray) -> np.ndarray | None:
        """Integers are multiples of one: the batch itself."""
        return self._arr(a)

    def batch_scatter_add(self, target: np.ndarray, slots: np.ndarray, values: np.ndarray):
        target, values = self._arr(target), self._arr(values)
        slots = np.asarray(slots, dtype=np.int64)
        target[slots] = checked_add(target[slots], values)
        return target


# ------------------------------------------------------------------------------------ ℝ
class RealRing(_NumericRing):
    """ℝ: SUM aggregates.  Scalar elements are floats; batches float64 arrays.

    ``lifted`` as for :class:`IntegerRing`; lifted values must be finite real numbers (strings,
    NaN and ±inf raise :class:`RingError`).  :meth:`equal` compares within
    ``atol + rtol * |b|``; :meth:`batch_is_negligible` is ``|x| <= 1e-12`` (absolute, the
    engine's threshold for dropping keys whose payload cancelled up to rounding).

    Stores accumulate into a compensated accumulator (:meth:`batch_accumulator`): an
    ``(n, 2)`` array of sums and their TwoSum rounding errors, read folded (``sum + error``)
    by :meth:`batch_take`, so that inserting and deleting a huge value gives back the small
    ones it absorbed in other batches.  Within one batch the changes of a group are summed in
    plain float64 first: a huge value and small ones that arrive in the same batch and group
    keep only the rounded sum (1e300 + 0.3 is 1e300), and deleting the huge value later leaves
    0, not the small ones.  An addition whose sum leaves the finite range raises
    :class:`RingError` and changes nothing.
    """

    name = "real"
    dtype = np.dtype(np.float64)
    plain_inner_sums = False

    def zero(self) -> float:
        return 0.0

    def one(self) -> float:
        return 1.0

    def add(self, a: float, b: float) -> float:
        return a + b

    def mul(self, a: float, b: float) -> float:
        return a * b

    def neg(self, a: float) -> float:
        return -a

    def sub(self, a: float, b: float) -> float:
        return a - b

    def scale(self, a: float, k: int) -> float:
        return float(k) * a

    def is_zero(self, a: float) -> bool:
        return a == 0

    def equal(self, a: float, b: float, rtol: float = 0.0, atol: float = 0.0) -> bool:
        if a == b:
            return True
        return bool(abs(a - b) <= atol + rtol * abs(b))

    def to_bytes(self, a: float) -> bytes:
        return struct.pack("<d", a)

    def from_bytes(self, data: bytes) -> float:
        return struct.unpack("<d", data)[0]

    def _scalar_value(self, variable: str, value: Any, source: Any) -> float:
        return _real_value(repr(self), variable, value, source)

    def _column(self, variable: str, values: np.ndarray) -> np.ndarray:
        return as_float64_column(values, variable, repr(self))

    def batch_from(self, elements: Sequence[float]) -> np.ndarray:
        v = np.asarray(list(elements))
        if v.size and v.dtype.kind not in "biuf":
            raise RingError(f"{self!r}: payloads must be real numbers, got dtype {v.dtype}")
        return v.astype(np.float64).reshape(-1)

    def batch_add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        return a + b

    def batch_sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        return a - b

    def batch_neg(self, a: np.ndarray) -> np.ndarray:
        return -self._arr(a)

    def batch_mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        return a * b

    def batch_scale(self, a: np.ndarray, k: np.ndarray) -> np.ndarray:
        a = self._arr(a)
        k = np.asarray(k)
        if k.shape != a.shape:
            raise RingError(f"scale factors of shape {k.shape} for a batch of {len(a)}")
        return a * k.astype(np.float64)

    def batch_sum_by(self, a: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
        a = self._arr(a)
        groups = _check_groups(groups, len(a), n_groups)
        return np.bincount(groups, weights=a, minlength=n_groups).astype(np.float64)

    def batch_sum(self, a: np.ndarray) -> float:
        return float(self._arr(a).sum())

    def batch_mul_sum(self, factors, groups=None, n_groups: int = 1) -> np.ndarray:
        arrays = [self._arr(f) for f in factors]
        product = arrays[0].copy()
        for f in arrays[1:]:
            if f.shape != product.shape:
                raise RingError(f"{self!r}: factor batches of different lengths")
            product *= f
        if groups is None:
            return np.asarray([product.sum()], dtype=np.float64)
        return self.batch_sum_by(product, groups, n_groups)

    # ---- accumulators: a plain batch, or (n, 2) rows of a sum and its rounding error
    def batch_accumulator(self, n: int, compensated: bool = True) -> np.ndarray:
        return np.zeros((n, 2) if compensated else n, dtype=np.float64)

    @staticmethod
    def _is_compensated(a: Any) -> bool:
        return isinstance(a, np.ndarray) and a.ndim == 2

    def _stored(self, a: Any) -> np.ndarray:
        """A batch, or an accumulator's sums with their errors folded in."""
        if self._is_compensated(a):
            if a.dtype != self.dtype or a.shape[1] != 2:
                raise RingError(f"{self!r}: expected an (n, 2) float64 accumulator")
            return a[:, 0] + a[:, 1]
        return self._arr(a)

    def batch_len(self, batch: np.ndarray) -> int:
        return len(batch) if self._is_compensated(batch) else len(self._arr(batch))

    def batch_take(self, batch: np.ndarray, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        if self._is_compensated(batch):
            return self._stored(batch[index])
        return self._arr(batch)[index]

    def batch_to_list(self, batch: np.ndarray) -> list[float]:
        return self._stored(batch).tolist()

    def batch_to_bytes(self, batch: np.ndarray) -> bytes:
        return super().batch_to_bytes(self._stored(batch))

    def batch_is_zero(self, a: np.ndarray) -> np.ndarray:
        return self._stored(a) == 0

    def batch_is_negligible(self, a: np.ndarray) -> np.ndarray:
        return np.abs(self._stored(a)) <= NEGLIGIBLE

    def batch_clear(self, target: np.ndarray, slots: np.ndarray) -> np.ndarray:
        if not self._is_compensated(target):
            return super().batch_clear(target, slots)
        target[np.asarray(slots, dtype=np.int64)] = 0.0
        return target

    def batch_resize(self, batch: np.ndarray, n: int) -> np.ndarray:
        if not self._is_compensated(batch):
            return super().batch_resize(batch, n)
        out = np.zeros((n, 2), dtype=np.float64)
        m = min(n, len(batch))
        out[:m] = batch[:m]
        return out

    def batch_rows(self, target: np.ndarray, slots: np.ndarray) -> np.ndarray:
        return target[np.asarray(slots, dtype=np.int64)].copy()

    def batch_put_rows(self, target: np.ndarray, slots: np.ndarray, rows: np.ndarray):
        target[np.asarray(slots, dtype=np.int64)] = rows
        return target

    def batch_scatter_add(self, target: np.ndarray, slots: np.ndarray, values: np.ndarray):
        """``target[slots] += values`` (TwoSum into a compensated accumulator); a sum leaving
        the finite range raises :class:`RingError` before anything is written."""
        values = self._arr(values)
        slots = np.asarray(slots, dtype=np.int64)
        if not self._is_compensated(target):
            with np.errstate(over="ignore", invalid="ignore"):
                rows = self._arr(target)[slots] + values
            _check_finite_sums(self, rows)
            target[slots] = rows
            return target
        if target.dtype != self.dtype or target.shape[1] != 2:
            raise RingError(f"{self!r}: expected an (n, 2) float64 accumulator")
        rows = target[slots]
        hi = rows[:, 0]
        with np.errstate(over="ignore", invalid="ignore"):
            s = hi + values
        _check_finite_sums(self, s)
        bb = s - hi
        err = (hi - (s - bb)) + (values - bb)  # TwoSum: s + err == hi + values exactly
        rows[:, 0] = s
        rows[:, 1] += err
        target[slots] = rows
        return target


def _check_finite_sums(ring: Ring, sums: np.ndarray) -> None:
    if not np.isfinite(sums).all():
        raise RingError(
            f"{ring!r}: float64 overflow: a sum leaves the finite range "
            f"(first non-finite sum {float(sums[~np.isfinite(sums)][0])!r})"
        )


# --------------------------------------------------------------------------------- product
class ProductRing(Ring):
    """The product ring ``D_1 × ... × D_k``: several aggregates in one payload.

    An element is a tuple ``(e_1, ..., e_k)`` of component elements, a batch a tuple of
    component batches (all of the same length); every operation is componentwise, ``0`` and
    ``1`` are the tuples of the components' zeros and ones.  The lifted variables are the union
    of the components'; the lift of ``X`` is the tuple of component lifts, where a component
    that does not lift ``X`` contributes its one -- e.g. ``X`` in ``(SUM(X), COUNT)`` lifts to
    ``(x, 1)``.  ``names`` label the components for :meth:`read` (default ``c0, c1, ...``).
    """

    name = "product"

    def __init__(self, *rings: Ring, names: Sequence[str] | None = None) -> None:
        if not rings:
            raise RingError("ProductRing needs at least one component ring")
        for r in rings:
            if not isinstance(r, Ring):
                raise RingError(f"ProductRing components must be rings, got {r!r}")
        self.rings: tuple[Ring, ...] = tuple(rings)
        if names is None:
            names = [f"c{i}" for i in range(len(rings))]
        names = tuple(str(n) for n in names)
        if len(names) != len(rings) or len(set(names)) != len(names):
            raise RingError(f"need {len(rings)} distinct component names, got {names!r}")
        self.names: tuple[str, ...] = names
        self._index = {n: i for i, n in enumerate(names)}
        self.commutative = all(r.commutative for r in rings)  # type: ignore[misc]

    @classmethod
    def named(cls, **rings: Ring) -> ProductRing:
        """``ProductRing.named(total=RealRing(['x']), n=IntegerRing())``."""
        return cls(*rings.values(), names=list(rings))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ProductRing)
            and other.rings == self.rings
            and other.names == self.names
        )

    def __hash__(self) -> int:
        return hash(("product", self.rings, self.names))

    def __repr__(self) -> str:
        inner = ", ".join(repr(r) for r in self.rings)
        return f"{type(self).__name__}({inner}, names={list(self.names)!r})"

    @property
    def arity(self) -> int:
        return len(self.rings)

    # ---- helpers
    def _el(self, a: Any) -> tuple:
        if not isinstance(a, (tuple, list)) or len(a) != len(self.rings):
            raise RingError(f"{self!r}: expected a {len(self.rings)}-tuple payload, got {a!r}")
        return tuple(a)

    def _b(self, a: Any) -> tuple:
        if not isinstance(a, tuple) or len(a) != len(self.rings):
            raise RingError(f"{self!r}: expected a {len(self.rings)}-tuple of batches")
        return a

    def index_of(self, component: int | str) -> int:
        if isinstance(component, str):
            if component not in self._index:
                raise RingError(f"{self!r} has no component {component!r}")
            return self._index[component]
        if not -len(self.rings) <= component < len(self.rings):
            raise RingError(f"{self!r} has no component {component}")
        return component % len(self.rings)

    def component(self, payload: tuple, which: int | str) -> Any:
        """One aggregate of a payload, by index or name."""
        return self._el(payload)[self.index_of(which)]

    def read(self, payload: tuple) -> dict[str, Any]:
        """All aggregates of a payload as ``{name: component element}``."""
        return dict(zip(self.names, self._el(payload), strict=True))

    def batch_component(self, batch: tuple, which: int | str) -> Any:
        return self._b(batch)[self.index_of(which)]

    def batch_read(self, batch: tuple) -> dict[str, Any]:
        """All aggregates of a batch as ``{name: component batch}`` (arrays for ℤ/ℝ)."""
        return dict(zip(self.names, self._b(batch), strict=True))

    # ---- scalar face
    def zero(self) -> tuple:
        return tuple(r.zero() for r in self.rings)

    def one(self) -> tuple:
        return tuple(r.one() for r in self.rings)

    def add(self, a: tuple, b: tuple) -> tuple:
        a, b = self._el(a), self._el(b)
        return tuple(r.add(x, y) for r, x, y in zip(self.rings, a, b, strict=True))

    def mul(self, a: tuple, b: tuple) -> tuple:
        a, b = self._el(a), self._el(b)
        return tuple(r.mul(x, y) for r, x, y in zip(self.rings, a, b, strict=True))

    def neg(self, a: tuple) -> tuple:
        return tuple(r.neg(x) for r, x in zip(self.rings, self._el(a), strict=True))

    def sub(self, a: tuple, b: tuple) -> tuple:
        a, b = self._el(a), self._el(b)
        return tuple(r.sub(x, y) for r, x, y in zip(self.rings, a, b, strict=True))

    def scale(self, a: tuple, k: int) -> tuple:
        return tuple(r.scale(x, k) for r, x in zip(self.rings, self._el(a), strict=True))

    def is_zero(self, a: tuple) -> bool:
        return all(r.is_zero(x) for r, x in zip(self.rings, self._el(a), strict=True))

    def equal(self, a: tuple, b: tuple, rtol: float = 0.0, atol: float = 0.0) -> bool:
        a, b = self._el(a), self._el(b)
        return all(
            r.equal(x, y, rtol=rtol, atol=atol) for r, x, y in zip(self.rings, a, b, strict=True)
        )

    @property
    def lifted_variables(self) -> frozenset[str]:
        return frozenset().union(*(r.lifted_variables for r in self.rings))

    @property
    def keyed_variables(self) -> frozenset[str]:
        return frozenset().union(*(r.keyed_variables for r in self.rings))

    def lift(self, variable: str, value: Any) -> tuple:
        return tuple(
            r.lift(variable, value) if variable in r.lifted_variables else r.one()
            for r in self.rings
        )

    @staticmethod
    def _pack(parts: Sequence[bytes]) -> bytes:
        return b"".join(struct.pack("<Q", len(p)) + p for p in parts)

    def _unpack(self, data: bytes) -> list[bytes]:
        parts, pos = [], 0
        for _ in self.rings:
            if pos + 8 > len(data):
                raise RingError(f"{self!r}: truncated payload bytes")
            (size,) = struct.unpack_from("<Q", data, pos)
            pos += 8
            parts.append(data[pos : pos + size])
            pos += size
        if pos != len(data):
            raise RingError(f"{self!r}: trailing bytes in payload")
        return parts

    def to_bytes(self, a: tuple) -> bytes:
        return self._pack([r.to_bytes(x) for r, x in zip(self.rings, self._el(a), strict=True)])

    def from_bytes(self, data: bytes) -> tuple:
        return tuple(r.from_bytes(p) for r, p in zip(self.rings, self._unpack(data), strict=True))

    # ---- batched face
    def batch_zeros(self, n: int) -> tuple:
        return tuple(r.batch_zeros(n) for r in self.rings)

    def batch_ones(self, n: int) -> tuple:
        return tuple(r.batch_ones(n) for r in self.rings)

    def batch_from(self, elements: Sequence[tuple]) -> tuple:
        els = [self._el(e) for e in elements]
        return tuple(r.batch_from([e[i] for e in els]) for i, r in enumerate(self.rings))

    def batch_to_list(self, batch: tuple) -> list[tuple]:
        cols = [r.batch_to_list(b) for r, b in zip(self.rings, self._b(batch), strict=True)]
        return list(zip(*cols, strict=True)) if cols[0] else []

    def batch_len(self, batch: tuple) -> int:
        return self.rings[0].batch_len(self._b(batch)[0])

    def _map(self, method: str, *batches: tuple, **kw: Any) -> tuple:
        unpacked = [self._b(b) for b in batches]
        return tuple(
            getattr(r, method)(*(b[i] for b in unpacked), **kw) for i, r in enumerate(self.rings)
        )

    def batch_take(self, batch: tuple, index: np.ndarray) -> tuple:
        return self._map("batch_take", batch, index=index)

    def batch_concat(self, batches: Sequence[tuple]) -> tuple:
        bs = [self._b(b) for b in batches]
        return tuple(r.batch_concat([b[i] for b in bs]) for i, r in enumerate(self.rings))

    def batch_add(self, a: tuple, b: tuple) -> tuple:
        return self._map("batch_add", a, b)

    def batch_sub(self, a: tuple, b: tuple) -> tuple:
        return self._map("batch_sub", a, b)

    def batch_neg(self, a: tuple) -> tuple:
        return self._map("batch_neg", a)

    def batch_mul(self, a: tuple, b: tuple) -> tuple:
        return self._map("batch_mul", a, b)

    def batch_scale(self, a: tuple, k: np.ndarray) -> tuple:
        return self._map("batch_scale", a, k=k)

    def batch_sum_by(self, a: tuple, groups: np.ndarray, n_groups: int) -> tuple:
        return self._map("batch_sum_by", a, groups=groups, n_groups=n_groups)

    def batch_sum(self, a: tuple) -> tuple:
        return tuple(r.batch_sum(b) for r, b in zip(self.rings, self._b(a), strict=True))

    def batch_mul_sum(self, factors, groups=None, n_groups: int = 1) -> tuple:
        fs = [self._b(f) for f in factors]
        return tuple(
            r.batch_mul_sum([f[i] for f in fs], groups, n_groups) for i, r in enumerate(self.rings)
        )

    def batch_scaled_mul_sum(self, factors, scale, groups=None, n_groups: int = 1) -> tuple:
        fs = [self._b(f) for f in factors]
        return tuple(
            r.batch_scaled_mul_sum([f[i] for f in fs], scale, groups, n_groups)
            for i, r in enumerate(self.rings)
        )

    def batch_is_zero(self, a: tuple) -> np.ndarray:
        flags = [r.batch_is_zero(b) for r, b in zip(self.rings, self._b(a), strict=True)]
        return np.logical_and.reduce(flags)

    def batch_is_negligible(self, a: tuple) -> np.ndarray:
        flags = [r.batch_is_negligible(b) for r, b in zip(self.rings, self._b(a), strict=True)]
        return np.logical_and.reduce(flags)

    def batch_lift(self, variable: str, values: np.ndarray) -> tuple:
        n = np.asarray(values).size
        return tuple(
            r.batch_lift(variable, values) if variable in r.lifted_variables else r.batch_ones(n)
            for r in self.rings
        )

    @property
    def plain_inner_sums(self) -> bool:  # type: ignore[override]
        return all(r.plain_inner_sums for r in self.rings)

    def batch_accumulator(self, n: int, compensated: bool = True) -> tuple:
        return tuple(r.batch_accumulator(n, compensated) for r in self.rings)

    def batch_rows(self, target: tuple, slots: np.ndarray) -> tuple:
        return self._map("batch_rows", target, slots=slots)

    def batch_put_rows(self, target: tuple, slots: np.ndarray, rows: tuple) -> tuple:
        return tuple(
            r.batch_put_rows(t, slots, b)
            for r, t, b in zip(self.rings, self._b(target), self._b(rows), strict=True)
        )

    def lift_state(self) -> tuple:
        return tuple(r.lift_state() for r in self.rings)

    def restore_lift_state(self, state: tuple) -> None:
        for r, s in zip(self.rings, state, strict=True):
            r.restore_lift_state(s)

    def batch_scatter_add(self, target: tuple, slots: np.ndarray, values: tuple) -> tuple:
        """Componentwise, all or nothing: when a component refuses (e.g. an int64
        overflow), the components already added get their rows back."""
        t, v = self._b(target), self._b(values)
        out: list = []
        saved: list = []
        try:
            for i, r in enumerate(self.rings):
                if i < len(self.rings) - 1:
                    saved.append(r.batch_rows(t[i], slots))
                out.append(r.batch_scatter_add(t[i], slots, v[i]))
        except RingError:
            for r, part, rows in zip(self.rings, out, saved, strict=False):
                r.batch_put_rows(part, slots, rows)
            raise
        return tuple(out)

    def batch_clear(self, target: tuple, slots: np.ndarray) -> tuple:
        return self._map("batch_clear", target, slots=slots)

    def batch_resize(self, batch: tuple, n: int) -> tuple:
        return self._map("batch_resize", batch, n=n)

    def batch_to_bytes(self, batch: tuple) -> bytes:
        parts = [r.batch_to_bytes(b) for r, b in zip(self.rings, self._b(batch), strict=True)]
        return self._pack(parts)

    def batch_from_bytes(self, data: bytes) -> tuple:
        parts = self._unpack(data)
        return tuple(r.batch_from_bytes(p) for r, p in zip(self.rings, parts, strict=True))


class AverageRing(ProductRing):
    """``(SUM(X), COUNT)`` = ``ProductRing(RealRing([X]), IntegerRing())``; AVG = sum / count.

    The lift of ``X`` is ``(x, 1)``; other variables lift to ``(1.0, 1)``.
    """

    def __init__(self, variable: str) -> None:
        super().__init__(RealRing([variable]), IntegerRing(), names=("sum", "count"))
        self.variable = variable

    def __repr__(self) -> str:
        return f"AverageRing({self.variable!r})"

    def value(self, payload: tuple) -> float:
        """``sum / count``; NaN when the count is 0."""
        s, c = self._el(payload)
        return s / c if c else math.nan

    def batch_value(self, batch: tuple) -> np.ndarray:
        """Element-wise ``sum / count`` (NaN where the count is 0)."""
        s, c = self._b(batch)
        out = np.full(len(s), np.nan)
        np.divide(s, c, out=out, where=c != 0)
        return out


def average_ring(variable: str) -> AverageRing:
    """The ``(SUM(variable), COUNT)`` ring; see :class:`AverageRing`."""
    return AverageRing(variable)
