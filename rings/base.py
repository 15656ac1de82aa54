"""The ring trait: a scalar face for readability and tests, a batched face for the engine.

A ring ``(D, +, *, 0, 1)`` (F-IVM Definition 1) is described by a :class:`Ring` object.
Elements of the *scalar face* are small Python values (ints, floats, tuples, dataclasses).
The *batched face* holds ``n`` payloads at once in arrays (a ring-specific batch object) and
applies each operation to whole batches; the engine only ever calls the batched face on hot
paths.  Rings know nothing of views, keys or joins: the engine aligns batches and hands them
over.

Conventions shared by every ring:

* a batch has a length (:meth:`Ring.batch_len`); binary batched operations take aligned
  batches of equal length and work element by element;
* :meth:`Ring.batch_sum_by` is the scatter-add of marginalization: element ``i`` is added into
  group ``groups[i]``; the result has ``n_groups`` elements (empty groups are zero);
* :meth:`Ring.batch_scatter_add` accumulates into a stored batch in place where it can
  (``slots`` are unique) and returns the stored batch;
* the *lifting function* of a variable ``X`` (``g_X`` in F-IVM) is :meth:`Ring.lift` /
  :meth:`Ring.batch_lift`; variables the ring does not lift (not in
  :attr:`Ring.lifted_variables`) are lifted to the ring's one, which the engine skips;
* the zero test is exact: a payload is zero only when every component is zero (a covariance
  payload with count 0 and non-zero sums is *not* zero).  :meth:`Ring.batch_is_negligible`
  is the engine's test for dropping stored keys whose payload cancelled up to rounding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from functools import reduce
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

E = TypeVar("E")  # scalar element
B = TypeVar("B")  # batch of elements


class RingError(ValueError):
    """Raised on invalid ring input: bad lift values, mismatched payloads or rings."""


def check_code_maps(ring: Ring, maps: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``maps`` of :meth:`Ring.recode` as 1-d int64 arrays; :class:`RingError` for a
    variable the ring does not key or a map that is not 1-d integers."""
    out = {}
    for variable, mapping in maps.items():
        if variable not in ring.keyed_variables:
            raise RingError(
                f"recode: {variable!r} is not a keyed variable of {ring!r} "
                f"(keyed: {sorted(ring.keyed_variables)})"
            )
        array = np.asarray(mapping)
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise RingError(f"recode: the map of {variable!r} must be a 1-d integer array")
        out[variable] = array.astype(np.int64, copy=False)
    return out


def recode_column(variable: str, codes: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    """``mapping[codes]`` (vectorized); :class:`RingError` naming the variable and the first
    code that ``mapping`` does not cover (out of range or mapped to -1)."""
    codes = np.asarray(codes, dtype=np.int64)
    inside = (codes >= 0) & (codes < len(mapping))
    new = np.full(len(codes), -1, dtype=np.int64)
    new[inside] = mapping[codes[inside]]
    bad = np.flatnonzero(new < 0)
    if bad.size:
        raise RingError(f"recode: code {int(codes[bad[0]])} of {variable!r} has no new code")
    return new


class Ring(ABC, Generic[E, B]):
    """A ring with a scalar face (elements ``E``) and a batched face (batches ``B``)."""

    name: ClassVar[str] = "ring"
    #: True when ``a * b == b * a`` for all elements.
    commutative: ClassVar[bool] = True

    # ------------------------------------------------------------------ scalar face
    @abstractmethod
    def zero(self) -> E:
        """The additive identity."""

    @abstractmethod
    def one(self) -> E:
        """The multiplicative identity."""

    @abstractmethod
    def add(self, a: E, b: E) -> E:
        """``a + b``."""

    @abstractmethod
    def mul(self, a: E, b: E) -> E:
        """``a * b``."""

    @abstractmethod
    def neg(self, a: E) -> E:
        """The additive inverse ``-a``."""

    @abstractmethod
    def is_zero(self, a: E) -> bool:
        """Exact zero test over every component."""

    @abstractmethod
    def equal(self, a: E, b: E, rtol: float = 0.0, atol: float = 0.0) -> bool:
        """Component-wise equality; floating components within ``atol + rtol * |b|``."""

    @property
    def lifted_variables(self) -> frozenset[str]:
        """Variables with a non-trivial lifting function; all others lift to :meth:`one`."""
        return frozenset()

    @property
    def keyed_variables(self) -> frozenset[str]:
        """Lifted variables whose lifting function takes dictionary *codes*, not numbers
        (categories, listed variables): the engine encodes their values and lifts the codes."""
        return frozenset()

    def used_codes(self, payload: E | B) -> dict[str, np.ndarray]:
        """The dictionary codes a payload (or batch) holds, per keyed variable: sorted,
        unique, without sentinels (rings without keyed variables: ``{}``)."""
        if self.keyed_variables:
            raise NotImplementedError(f"{type(self).__name__} does not implement used_codes")
        return {}

    def recode(self, payload: E | B, maps: Mapping[str, np.ndarray]) -> E | B:
        """The payload (or batch) with every code ``c`` of a keyed variable ``v`` in ``maps``
        replaced by ``maps[v][c]`` (int arrays; -1 marks no new code).  Codes into another
        code space, e.g. a shard's dictionary into the driver's; identity without maps."""
        check_code_maps(self, maps)
        if not maps:
            return payload
        raise NotImplementedError(f"{type(self).__name__} does not implement recode")

    def lift(self, variable: str, value: Any) -> E:
        """The lifting function ``g_variable(value)``."""
        if variable not in self.lifted_variables:
            return self.one()
        return self.batch_to_list(self.batch_lift(variable, np.asarray([value])))[0]

    def check_lift(self, variable: str, values: np.ndarray) -> None:
        """Raise :class:`RingError` if some value cannot be lifted (no payload is built).

        The engine validates whole batches with it before any view changes; rings override
        it with a cheaper check than lifting.
        """
        self.batch_lift(variable, values)

    def sub(self, a: E, b: E) -> E:
        """``a - b``."""
        return self.add(a, self.neg(b))

    def scale(self, a: E, k: int) -> E:
        """``k * a`` for an integer multiplicity ``k`` (repeated addition)."""
        return self.batch_to_list(self.batch_scale(self.batch_from([a]), np.asarray([k])))[0]

    @abstractmethod
    def to_bytes(self, a: E) -> bytes:
        """Serialize one element (checkpoints, moving payloads between processes)."""

    @abstractmethod
    def from_bytes(self, data: bytes) -> E:
        """Inverse of :meth:`to_bytes`."""

    # ----------------------------------------------------------------- batched face
    @abstractmethod
    def batch_zeros(self, n: int) -> B:
        """A batch of ``n`` zeros."""

    @abstractmethod
    def batch_ones(self, n: int) -> B:
        """A batch of ``n`` ones."""

    @abstractmethod
    def batch_from(self, elements: Sequence[E]) -> B:
        """Pack scalar elements into a batch."""

    @abstractmethod
    def batch_to_list(self, batch: B) -> list[E]:
        """Unpack a batch into scalar elements."""

    @abstractmethod
    def batch_len(self, batch: B) -> int:
        """Number of elements in the batch."""

    @abstractmethod
    def batch_take(self, batch: B, index: np.ndarray) -> B:
        """Gather elements ``batch[index]`` (``index`` an int array)."""

    @abstractmethod
    def batch_concat(self, batches: Sequence[B]) -> B:
        """Concatenate batches."""

    @abstractmethod
    def batch_add(self, a: B, b: B) -> B:
        """Element-wise ``a + b``."""

    @abstractmethod
    def batch_neg(self, a: B) -> B:
        """Element-wise ``-a``."""

    @abstractmethod
    def batch_mul(self, a: B, b: B) -> B:
        """Element-wise ``a * b`` of aligned batches."""

    @abstractmethod
    def batch_scale(self, a: B, k: np.ndarray) -> B:
        """Element-wise ``k[i] * a[i]`` for integer multiplicities ``k``."""

    @abstractmethod
    def batch_sum_by(self, a: B, groups: np.ndarray, n_groups: int) -> B:
        """Scatter-add: element ``i`` goes into group ``groups[i]`` (0 <= g < n_groups)."""

    @abstractmethod
    def batch_is_zero(self, a: B) -> np.ndarray:
        """Exact element-wise zero test (bool array)."""

    @abstractmethod
    def batch_lift(self, variable: str, values: np.ndarray) -> B:
        """Lift a column of values of a lifted variable; raises :class:`RingError` on bad values."""

    @abstractmethod
    def batch_to_bytes(self, batch: B) -> bytes:
        """Serialize a batch."""

    @abstractmethod
    def batch_from_bytes(self, data: bytes) -> B:
        """Inverse of :meth:`batch_to_bytes`."""

    # ------------------------------------------------- batched face with defaults
    def batch_sub(self, a: B, b: B) -> B:
        """Element-wise ``a - b``."""
        return self.batch_add(a, self.batch_neg(b))

    def batch_sum(self, a: B) -> E:
        """Sum of all elements of a batch, as a scalar element."""
        n = self.batch_len(a)
        return self.batch_to_list(self.batch_sum_by(a, np.zeros(n, dtype=np.int64), 1))[0]

    def batch_mul_sum(
        self, factors: Sequence[B], groups: np.ndarray | None = None, n_groups: int = 1
    ) -> B:
        """``sum_by(f_1 * f_2 * ... * f_k, groups)``: the fused product-then-marginalize.

        ``groups=None`` sums everything into one element.  Rings override this when the
        contraction is cheaper than materializing every product (the covariance ring does).
        """
        product = reduce(self.batch_mul, factors)
        if groups is None:
            groups = np.zeros(self.batch_len(product), dtype=np.int64)
            n_groups = 1
        return self.batch_sum_by(product, groups, n_groups)

    def batch_lift_factors(self, variables: Sequence[str], columns: Sequence[np.ndarray]) -> list:
        """The lifts of several variables of the same rows, as factors whose product is their
        lift (numbers for continuous variables, codes for :attr:`keyed_variables`).  By
        default one factor per variable; rings that build the product at once (without
        multiplying full batches) return it as one factor."""
        return [self.batch_lift(v, c) for v, c in zip(variables, columns, strict=True)]

    def batch_lift_sum_by(
        self,
        variables: Sequence[str],
        columns: Sequence[np.ndarray],
        groups: np.ndarray | None,
        n_groups: int = 1,
        weights: np.ndarray | None = None,
    ) -> B:
        """``⊕`` by group of ``weights[i] ⊗ lift(row i)``: a leaf's lift and marginalization
        in one call (``groups=None``: everything into one element; ``weights=None``: all 1).
        Rings override it to skip the lifted rows (the covariance ring does)."""
        factors = self.batch_lift_factors(variables, columns)
        return self.batch_scaled_mul_sum(factors, weights, groups, n_groups)

    def batch_scaled_mul_sum(
        self,
        factors: Sequence[B],
        scale: np.ndarray | None,
        groups: np.ndarray | None = None,
        n_groups: int = 1,
    ) -> B:
        """:meth:`batch_mul_sum` of the products times integer multiplicities ``scale``
        (None: all 1).  By default the first factor is scaled; ℤ multiplies exactly instead,
        so that a scaled product beyond int64 is no overflow while its group's sum fits."""
        if scale is not None:
            factors = [self.batch_scale(factors[0], scale), *factors[1:]]
        if groups is None:
            return self.batch_mul_sum(factors)
        return self.batch_mul_sum(factors, groups, n_groups)

    #: Every finite real number (int64 or float64) lifts: the engine skips
    #: :meth:`check_lift` for feature columns, which it has checked to hold such numbers.
    lifts_finite_numbers: bool = False

    #: Payloads count their derivations exactly (int64, as :meth:`batch_derivations` reads
    #: them): the engine takes a delta's derivation counts from its payloads instead of
    #: multiplying and summing them alongside.
    counts_derivations: bool = False

    def batch_derivations(self, a: B) -> np.ndarray | None:
        """The exact number of derivations behind every payload, for rings that
        :attr:`counts_derivations`; None for the others."""
        return None

    def batch_multiplicities(self, a: B) -> np.ndarray | None:
        """Integers ``k`` with ``a[i] == k[i] · 1`` when every element of ``a`` is a multiple
        of one (e.g. the payloads of a stored base relation, which lift nothing), else None;
        the engine then folds them into the weights of :meth:`batch_lift_sum_by`."""
        return None

    def lift_state(self) -> Any:
        """State that lifting may fix for good (e.g. covariance shifts), for
        :meth:`restore_lift_state` to reopen when an apply is rejected; None when none."""
        return None

    def restore_lift_state(self, state: Any) -> None:
        """Undo what lifting fixed since :meth:`lift_state` returned ``state``."""

    #: A store below the root may sum this ring's payloads without compensation (exact
    #: rings; covariance rings, whose lifted values are shifted near zero and whose keys
    #: are reset when their count reaches 0).  False: every store compensates (ℝ's SUM
    #: of arbitrary values, where one huge value inserted and deleted absorbs the rest).
    plain_inner_sums: bool = True

    def batch_accumulator(self, n: int, compensated: bool = True) -> B:
        """A zero batch meant to be accumulated into; floating rings add compensation unless
        ``compensated=False`` (stores whose per-key sums stay small skip its cost)."""
        return self.batch_zeros(n)

    def batch_rows(self, target: B, slots: np.ndarray) -> B:
        """The rows of an accumulator at ``slots`` as stored (compensation included), for
        :meth:`batch_put_rows` to put back exactly."""
        return self.batch_take(target, slots)

    def batch_put_rows(self, target: B, slots: np.ndarray, rows: B) -> B:
        """Overwrite ``target[slots]`` with rows saved by :meth:`batch_rows`."""
        return self.batch_scatter_add(self.batch_clear(target, slots), slots, rows)

    def batch_scatter_add(self, target: B, slots: np.ndarray, values: B) -> B:
        """``target[slots] += values`` for unique ``slots``; in place where possible."""
        n = self.batch_len(target)
        scattered = self.batch_sum_by(values, slots, n)
        return self.batch_add(target, scattered)

    def batch_scatter_add_saving(self, target: B, slots: np.ndarray, values: B) -> tuple[B, B]:
        """:meth:`batch_scatter_add`, also returning ``target[slots]`` as it was before (what
        an exact undo restores); rings that gather those rows anyway return them."""
        before = self.batch_take(target, slots)
        return self.batch_scatter_add(target, slots, values), before

    def batch_clear(self, target: B, slots: np.ndarray) -> B:
        """Set ``target[slots]`` to exactly zero (reclaimed slots); in place where possible."""
        current = self.batch_take(target, slots)
        return self.batch_scatter_add(target, slots, self.batch_neg(current))

    def batch_resize(self, batch: B, n: int) -> B:
        """Grow with zeros (or truncate) to length ``n``."""
        size = self.batch_len(batch)
        if n <= size:
            return self.batch_take(batch, np.arange(n))
        return self.batch_concat([batch, self.batch_accumulator(n - size)])

    def batch_without_residue(self, a: B) -> B:
        """``a`` without the entries its exact counts prove zero when no multiplicity is
        negative (checked deletes): rounding residue that a read should not show.  ``a``
        itself when there is none (the default: rings without such entries)."""
        return a

    def batch_is_negligible(self, a: B) -> np.ndarray:
        """Element-wise: zero up to floating rounding (exact rings: :meth:`batch_is_zero`)."""
        return self.batch_is_zero(a)

    def check_same_ring(self, other: Ring) -> None:
        """Raise :class:`RingError` if ``other`` is not an equal ring."""
        if other is not self and other != self:
            raise RingError(f"payloads of different rings: {self!r} and {other!r}")
