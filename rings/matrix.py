"""The (non-commutative) ring of n×n real matrices and factorized low-rank updates.

:class:`MatrixRing` is ``(ℝ^{n×n}, +, ·, 0, I)`` (F-IVM Example 1, Sect. 8.4): ``mul`` is the
matrix product, so ``commutative`` is False and the engine must keep the left-to-right order of
products.  Scalar elements are ``(n, n)`` float64 arrays; batches ``(k, n, n)`` arrays with
batched ``np.matmul``.  No variable is lifted (every lift is the identity matrix).

:class:`LowRank` holds ``U Vᵀ`` (``U`` p×r, ``V`` q×r) without ever forming it: multiplying
by a dense matrix on either side stays factorized (:func:`left_mul`, :func:`right_mul`), which
is how a rank-1 change ``δA_i = u vᵀ`` travels up a matrix chain in O(p²) per view instead of
O(p³) (Sect. 8.4, LINVIEW).  Only :meth:`LowRank.to_dense` / :meth:`LowRank.add_to`
materialize it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from ringml.rings.base import Ring, RingError

__all__ = ["LowRank", "MatrixRing", "RankOneUpdate", "left_mul", "rank_one", "right_mul"]

#: Absolute threshold of :meth:`MatrixRing.batch_is_negligible` (max-abs entry).
NEGLIGIBLE = 1e-12


class MatrixRing(Ring):
    """n×n real matrices: 0 = zeros, 1 = identity, ``mul`` = matmul (non-commutative)."""

    name = "matrix"
    commutative = False

    def __init__(self, n: int) -> None:
        if int(n) != n or n < 1:
            raise RingError(f"matrix size must be a positive integer, got {n!r}")
        self.n = int(n)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.n == self.n  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(("matrix", self.n))

    def __repr__(self) -> str:
        return f"MatrixRing({self.n})"

    # ------------------------------------------------------------------ scalar face
    def _m(self, a: Any) -> np.ndarray:
        if isinstance(a, LowRank):
            raise RingError(f"{self!r}: got a LowRank; call to_dense() to use it as an element")
        arr = np.asarray(a)
        if arr.shape != (self.n, self.n) or arr.dtype.kind not in "biuf":
            raise RingError(f"{self!r}: expected a real {self.n}x{self.n} matrix, got {a!r}")
        return arr.astype(np.float64, copy=False)

    def zero(self) -> np.ndarray:
        return np.zeros((self.n, self.n))

    def one(self) -> np.ndarray:
        return np.eye(self.n)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._m(a) + self._m(b)

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._m(a) - self._m(b)

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._m(a) @ self._m(b)

    def neg(self, a: np.ndarray) -> np.ndarray:
        return -self._m(a)

    def scale(self, a: np.ndarray, k: int) -> np.ndarray:
        return float(k) * self._m(a)

    def is_zero(self, a: np.ndarray) -> bool:
        return not self._m(a).any()

    def equal(self, a: np.ndarray, b: np.ndarray, rtol: float = 0.0, atol: float = 0.0) -> bool:
        a, b = self._m(a), self._m(b)
        return bool(np.all(np.abs(a - b) <= atol + rtol * np.abs(b)))

    def lift(self, variable: str, value: Any) -> np.ndarray:
        return self.one()

    def to_bytes(self, a: np.ndarray) -> bytes:
        return self._m(a).astype("<f8").tobytes()

    def from_bytes(self, data: bytes) -> np.ndarray:
        if len(data) != 8 * self.n * self.n:
            raise RingError(f"{self!r}: expected {8 * self.n * self.n} bytes, got {len(data)}")
        return np.frombuffer(data, dtype="<f8").astype(np.float64).reshape(self.n, self.n)

    # ------------------------------------------------------------------ batched face
    def _b(self, a: Any) -> np.ndarray:
        if (
            not isinstance(a, np.ndarray)
            or a.ndim != 3
            or a.shape[1:] != (self.n, self.n)
            or a.dtype != np.float64
        ):
            shape = getattr(a, "shape", None)
            raise RingError(
                f"{self!r}: expected a (k, {self.n}, {self.n}) float64 batch, got {shape}"
            )
        return a

    def _pair(self, a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
        a, b = self._b(a), self._b(b)
        if len(a) != len(b):
            raise RingError(f"{self!r}: batches of lengths {len(a)} and {len(b)}")
        return a, b

    def batch_zeros(self, n: int) -> np.ndarray:
        return np.zeros((n, self.n, self.n))

    def batch_ones(self, n: int) -> np.ndarray:
        return np.broadcast_to(np.eye(self.n), (n, self.n, self.n)).copy()

    def batch_from(self, elements: Sequence[np.ndarray]) -> np.ndarray:
        if not len(elements):
            return self.batch_zeros(0)
        return np.stack([self._m(e) for e in elements]).astype(np.float64)

    def batch_to_list(self, batch: np.ndarray) -> list[np.ndarray]:
        return [m.copy() for m in self._b(batch)]

    def batch_len(self, batch: np.ndarray) -> int:
        return len(self._b(batch))

    def batch_take(self, batch: np.ndarray, index: np.ndarray) -> np.ndarray:
        return self._b(batch)[np.asarray(index, dtype=np.int64)]

    def batch_concat(self, batches: Sequence[np.ndarray]) -> np.ndarray:
        if not batches:
            return self.batch_zeros(0)
        return np.concatenate([self._b(b) for b in batches])

    def batch_add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        return a + b

    def batch_sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        return a - b

    def batch_neg(self, a: np.ndarray) -> np.ndarray:
        return -self._b(a)

    def batch_mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._pair(a, b)
        return np.matmul(a, b)

    def batch_scale(self, a: np.ndarray, k: np.ndarray) -> np.ndarray:
        a = self._b(a)
        k = np.asarray(k)
        if k.shape != (len(a),):
            raise RingError(f"scale factors of shape {k.shape} for a batch of {len(a)}")
        return a * k.astype(np.float64)[:, None, None]

    def batch_sum_by(self, a: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
        a = self._b(a)
        groups = np.asarray(groups, dtype=np.int64)
        if groups.shape != (len(a),):
            raise RingError(f"groups has shape {groups.shape}, expected ({len(a)},)")
        out = np.zeros((n_groups, self.n, self.n))
        if not len(a):
            return out
        if groups.min() < 0 or groups.max() >= n_groups:
            raise RingError(f"group ids must lie in [0, {n_groups})")
        order = np.argsort(groups, kind="stable")
        sg = groups[order]
        starts = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]])
        out[sg[starts]] = np.add.reduceat(a[order], starts, axis=0)
        return out

    def batch_is_zero(self, a: np.ndarray) -> np.ndarray:
        a = self._b(a)
        return ~a.any(axis=(1, 2))

    def batch_is_negligible(self, a: np.ndarray) -> np.ndarray:
        a = self._b(a)
        return (np.abs(a) <= NEGLIGIBLE).all(axis=(1, 2))

    def batch_lift(self, variable: str, values: np.ndarray) -> np.ndarray:
        return self.batch_ones(np.asarray(values).size)

    def batch_scatter_add(self, target: np.ndarray, slots: np.ndarray, values: np.ndarray):
        target, values = self._b(target), self._b(values)
        target[np.asarray(slots, dtype=np.int64)] += values
        return target

    def batch_clear(self, target: np.ndarray, slots: np.ndarray) -> np.ndarray:
        self._b(target)[np.asarray(slots, dtype=np.int64)] = 0.0
        return target

    def batch_resize(self, batch: np.ndarray, n: int) -> np.ndarray:
        batch = self._b(batch)
        out = self.batch_zeros(n)
        m = min(n, len(batch))
        out[:m] = batch[:m]
        return out

    def batch_to_bytes(self, batch: np.ndarray) -> bytes:
        b = self._b(batch)
        return struct.pack("<Q", len(b)) + b.astype("<f8").tobytes()

    def batch_from_bytes(self, data: bytes) -> np.ndarray:
        if len(data) < 8:
            raise RingError(f"{self!r}: truncated batch bytes")
        (k,) = struct.unpack_from("<Q", data)
        if len(data) != 8 + 8 * k * self.n * self.n:
            raise RingError(f"{self!r}: batch bytes of the wrong size")
        flat = np.frombuffer(data, dtype="<f8", offset=8).astype(np.float64)
        return flat.reshape(k, self.n, self.n)


# =============================================================== factorized low-rank deltas
class LowRank:
    """The p×q matrix ``U Vᵀ`` kept as its factors ``U`` (p×r) and ``V`` (q×r).

    ``M @ lr`` and ``lr @ M`` (or :func:`left_mul` / :func:`right_mul`) stay factorized at
    O(p·q·r) cost; ``lr1 @ lr2`` and ``lr1 + lr2`` too (ranks add up under ``+``).  Nothing
    here forms the dense product except :meth:`to_dense` and :meth:`add_to`.
    """

    __slots__ = ("U", "V")
    __array_ufunc__ = None  # make numpy defer ``ndarray @ LowRank`` to __rmatmul__

    def __init__(self, U: Any, V: Any) -> None:
        U = np.asarray(U, dtype=np.float64)
        V = np.asarray(V, dtype=np.float64)
        if U.ndim == 1:
            U = U[:, None]
        if V.ndim == 1:
            V = V[:, None]
        if U.ndim != 2 or V.ndim != 2 or U.shape[1] != V.shape[1]:
            raise RingError(f"LowRank needs U (p×r) and V (q×r), got {U.shape} and {V.shape}")
        self.U = U
        self.V = V

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, rank={self.rank})"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.U.shape[0], self.V.shape[0])

    @property
    def rank(self) -> int:
        """The number of factor columns r (an upper bound of the matrix rank)."""
        return self.U.shape[1]

    @property
    def T(self) -> LowRank:
        return LowRank(self.V, self.U)

    def to_dense(self) -> np.ndarray:
        """Materialize ``U Vᵀ`` (p×q)."""
        return self.U @ self.V.T

    def add_to(self, M: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``M + U Vᵀ`` -- apply the delta to a stored dense view (in place with ``out=M``)."""
        M = np.asarray(M, dtype=np.float64)
        if M.shape != self.shape:
            raise RingError(f"cannot add a {self.shape} LowRank to a {M.shape} matrix")
        if out is None:
            out = M.copy()
        elif out is not M:
            out[...] = M
        out += self.U @ self.V.T
        return out

    def __neg__(self) -> LowRank:
        return LowRank(-self.U, self.V)

    def __mul__(self, k: float) -> LowRank:
        if not np.isscalar(k):
            return NotImplemented
        return LowRank(float(k) * self.U, self.V)

    __rmul__ = __mul__

    def __add__(self, other: LowRank) -> LowRank:
        if not isinstance(other, LowRank):
            return NotImplemented
        if other.shape != self.shape:
            raise RingError(f"cannot add LowRank {self.shape} and {other.shape}")
        return LowRank(np.hstack([self.U, other.U]), np.hstack([self.V, other.V]))

    def __sub__(self, other: LowRank) -> LowRank:
        if not isinstance(other, LowRank):
            return NotImplemented
        return self + (-other)

    def __matmul__(self, other: Any) -> LowRank:
        if isinstance(other, LowRank):
            if self.shape[1] != other.shape[0]:
                raise RingError(f"shapes {self.shape} and {other.shape} do not chain")
            return LowRank(self.U @ (self.V.T @ other.U), other.V)
        return right_mul(self, other)

    def __rmatmul__(self, other: Any) -> LowRank:
        return left_mul(other, self)


class RankOneUpdate(LowRank):
    """``u vᵀ`` (LINVIEW's rank-1 change: a perturbed row/column, a vector added to rows...)."""

    __slots__ = ()

    def __init__(self, u: Any, v: Any) -> None:
        u = np.asarray(u, dtype=np.float64)
        v = np.asarray(v, dtype=np.float64)
        if u.ndim != 1 or v.ndim != 1:
            raise RingError(f"RankOneUpdate needs vectors u and v, got {u.shape} and {v.shape}")
        super().__init__(u[:, None], v[:, None])

    @property
    def u(self) -> np.ndarray:
        return self.U[:, 0]

    @property
    def v(self) -> np.ndarray:
        return self.V[:, 0]


def rank_one(u: Any, v: Any) -> RankOneUpdate:
    """``u vᵀ`` as a :class:`RankOneUpdate`."""
    return RankOneUpdate(u, v)


def left_mul(M: Any, low_rank: LowRank) -> LowRank:
    """``M (U Vᵀ)`` kept factorized as ``(M U) Vᵀ``."""
    if not isinstance(low_rank, LowRank):
        raise RingError(f"left_mul expects a LowRank, got {type(low_rank).__name__}")
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2 or M.shape[1] != low_rank.shape[0]:
        raise RingError(f"cannot multiply a {M.shape} matrix by a {low_rank.shape} LowRank")
    return LowRank(M @ low_rank.U, low_rank.V)


def right_mul(low_rank: LowRank, M: Any) -> LowRank:
    """``(U Vᵀ) M`` kept factorized as ``U (Mᵀ V)ᵀ``."""
    if not isinstance(low_rank, LowRank):
        raise RingError(f"right_mul expects a LowRank, got {type(low_rank).__name__}")
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2 or M.shape[0] != low_rank.shape[1]:
        raise RingError(f"cannot multiply a {low_rank.shape} LowRank by a {M.shape} matrix")
    return LowRank(low_rank.U, M.T @ low_rank.V)
