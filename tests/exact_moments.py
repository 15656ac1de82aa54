"""An exact oracle for moments of float columns: every float is ``z / 2**k`` for integers
``z`` and a common ``k``, so counts, means, covariances and per-category sums are computed
exactly with Python integers and ``fractions.Fraction``."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

RTOL = 1e-9
MEANS = [1e9, 1e12]


def exact_ints(values: np.ndarray) -> tuple[list[int], int]:
    """Integers ``z`` and ``k`` with ``values == z / 2**k`` exactly."""
    mantissa, exponent = np.frexp(np.asarray(values, dtype=np.float64))
    digits = (mantissa * 2.0**53).astype(np.int64)  # exact: 53-bit mantissas
    scale = exponent.astype(np.int64) - 53
    k = int(-scale.min())
    shifts = (scale + k).tolist()
    return [int(d) << int(e) for d, e in zip(digits.tolist(), shifts, strict=True)], k


class Exact:
    """Exact count, means, covariances and per-category sums of float columns."""

    def __init__(self, continuous: dict[str, np.ndarray], categorical: dict[str, np.ndarray]):
        self.count = len(next(iter(continuous.values())))
        self.ints = {v: exact_ints(x) for v, x in continuous.items()}
        self.codes = {v: np.asarray(c) for v, c in categorical.items()}

    def _sum(self, v: str, mask: np.ndarray | None = None) -> Fraction:
        z, k = self.ints[v]
        if mask is not None:
            z = [a for a, keep in zip(z, mask.tolist(), strict=True) if keep]
        return Fraction(sum(z), 2**k)

    def mean(self, v: str) -> Fraction:
        return self._sum(v) / self.count

    def cov(self, a: str, b: str) -> Fraction:
        (za, ka), (zb, kb) = self.ints[a], self.ints[b]
        cross = Fraction(sum(x * y for x, y in zip(za, zb, strict=True)), 2 ** (ka + kb))
        return cross / self.count - self.mean(a) * self.mean(b)

    def category_sum(self, v: str, var: str, category) -> Fraction:
        """``SUM(v) WHERE var = category``."""
        return self._sum(v, self.codes[var] == category)

    def cov_onehot(self, v: str, var: str, category) -> Fraction:
        """Covariance of ``v`` with the indicator of ``var = category``."""
        share = Fraction(int((self.codes[var] == category).sum()), self.count)
        return self.category_sum(v, var, category) / self.count - self.mean(v) * share


def assert_close(got: float, want: Fraction, what: str, rtol: float = RTOL) -> None:
    assert abs(Fraction(got) - want) <= rtol * abs(want), f"{what}: {got!r} vs {float(want)!r}"


def relative_error(got: float, want: Fraction) -> float:
    return float(abs(Fraction(got) - want) / abs(want))
