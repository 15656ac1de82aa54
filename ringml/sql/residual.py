"""The result of a SQL view with a residual filter, maintained per batch.

A view whose WHERE needs more than the engine's joins (an inequality, an OR across tables, a
subquery) keeps the engine's groups finer -- by the columns the condition reads -- and
filters them on read.  Filtering all of them at every read costs as much as the view is
large; :class:`ResidualResult` instead keeps the filtered groups summed per output group and,
after a batch, filters again only the engine groups the batch *affected*: those whose
payload changed (the engine's :class:`~ringml.delta.ResultDelta`) and those whose
subquery values changed (found through a secondary index on the correlated columns).  Each
affected group's old contribution (its payload before the batch, filtered with the
subqueries' values before it) is taken out and its new one put in -- DBToaster's way with a
nested aggregate's delta: re-evaluate it per changed key.

When a batch changes a subquery that is uncorrelated, correlated by an inequality, read by
membership or nested, every group may be affected: the result is rebuilt on the next read.

MIN/MAX and COUNT/SUM/AVG(DISTINCT) are kept per output group too: after a batch, only the
output groups it touched are read again (their engine groups, through the secondary index
on the group-by keys) and their extremes and distinct values recomputed -- exact under
deletes, never a pass over the whole view.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..keyindex import KeyIndex
from ..rings.base import RingError
from ..rings.scalar import checked_add, checked_sum_by
from ..store import group_rows
from .expressions import DTYPES, Col, EvaluationError, truth
from .logical import COUNT, HIDDEN_AGGREGATES, SubqueryPlan, ViewPlan, valued


class ResidualResult:
    """Per output group (the visible keys), the sums of the components of the engine
    groups that pass the residual filter."""

    def __init__(self, plan: ViewPlan, free: tuple[str, ...]) -> None:
        self.free = free
        self.visible = [v for v, _ in plan.keys if v not in plan.hidden]
        self.columns = [free.index(v) for v in self.visible]
        self.index = KeyIndex(max(len(self.visible), 1))
        self.sums = {
            c.name: np.zeros(self.index.capacity, dtype=np.int64 if c.integer else np.float64)
            for c in plan.components
        }
        # MIN/MAX/DISTINCT per output group, set for the groups a batch touched
        self.values = {
            a.slot: np.zeros(self.index.capacity, dtype=DTYPES[a.type])
            for a in plan.aggregates
            if a.function in HIDDEN_AGGREGATES
        }
        # ... and, over a nullable argument, whether the group holds a non-NULL value
        for a in plan.aggregates:
            if a.function in HIDDEN_AGGREGATES and a.argument_null is not None:
                self.values[valued(a.slot)] = np.zeros(self.index.capacity, dtype=bool)

    def _keys(self, codes: np.ndarray) -> np.ndarray:
        return codes if codes.shape[1] else np.zeros((codes.shape[0], 1), dtype=np.int64)

    def add(self, codes: np.ndarray, components: Mapping[str, np.ndarray]) -> None:
        """Add component changes of engine groups (``codes`` in free order);
        :class:`EvaluationError` (the result half changed: to be rebuilt) for an output
        group's integer sum beyond int64."""
        if not len(codes):
            return
        unique, inverse = group_rows(codes[:, self.columns])
        slots, _ = self.index.get_or_insert(self._keys(unique))
        for name, values in components.items():
            try:
                summed = _sum_by(values, inverse, len(unique))
                held = self.sums[name]
                if held.size < self.index.capacity or held.dtype != np.result_type(held, summed):
                    grown = np.zeros(self.index.capacity, dtype=np.result_type(held, summed))
                    grown[: held.size] = held
                    held = self.sums[name] = grown
                if held.dtype.kind == "i":
                    held[slots] = checked_add(held[slots], summed)
                else:
                    held[slots] += summed
            except RingError as error:
                raise EvaluationError(f"an integer aggregate overflows BIGINT ({error})") from None
        dead = slots[self.sums[COUNT][slots] <= 0]
        if dead.size:
            for held in self.sums.values():
                held[dead] = 0
            self.index.remove(dead)

    def set_values(self, slot: str, codes: np.ndarray, values: np.ndarray) -> None:
        """The value of a MIN/MAX/DISTINCT aggregate for output groups (visible
        ``codes``); groups that do not exist are skipped."""
        slots = self.index.lookup(self._keys(codes))
        found = slots >= 0
        held = self.values[slot]
        dtype = held.dtype if held.dtype == values.dtype else np.result_type(held, values)
        if held.size < self.index.capacity or dtype != held.dtype:
            grown = np.zeros(self.index.capacity, dtype=dtype)
            grown[: held.size] = held
            held = self.values[slot] = grown
        held[slots[found]] = values[found]

    def exist(self, codes: np.ndarray) -> np.ndarray:
        """Which output groups (visible ``codes``) exist."""
        return self.index.lookup(self._keys(codes)) >= 0

    def get_values(self, slot: str, codes: np.ndarray) -> np.ndarray:
        """A MIN/MAX/DISTINCT aggregate's value for existing output groups (visible
        ``codes``; anything for the others)."""
        slots = self.index.lookup(self._keys(codes))
        held = self.values[slot]
        return held[np.clip(slots, 0, max(held.size - 1, 0))] if held.size else held[:0]

    def read(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The output groups' visible codes, component sums and MIN/MAX/DISTINCT values."""
        slots = self.index.live_slots()
        codes = self.index.keys[slots][:, : len(self.visible)]
        out = {name: held[slots] for name, held in self.sums.items()}
        out.update({name: held[slots] for name, held in self.values.items()})
        return codes, out


def _sum_by(values: np.ndarray, inverse: np.ndarray, m: int) -> np.ndarray:
    if values.dtype.kind in "iub":
        return checked_sum_by(values.astype(np.int64, copy=False), inverse, m)
    return np.bincount(inverse, weights=values, minlength=m).astype(np.float64, copy=False)


def keyed_subquery(sub: SubqueryPlan) -> bool:
    """Whether a subquery is a plain view keyed by its equality correlations (its value
    for given keys is read from its groups there, before or after a batch)."""
    return (
        sub.mode == "value"
        and sub.inequality is None
        and sub.equalities > 0
        # each correlation a key of the subquery's groups (not a constant: IN (SELECT 'x' ...))
        and len(sub.plan.keys) >= sub.equalities
        and not sub.plan.collapsed
        and not sub.plan.subqueries
        and not sub.plan.derived
    )


def incremental_subquery(sub: SubqueryPlan, ref_args: tuple) -> bool:
    """Whether a change of this subquery affects only the outer groups with the changed
    correlation values (keyed, correlated with outer columns)."""
    return keyed_subquery(sub) and all(isinstance(a, Col) and not a.source for a in ref_args)


def affected_groups(
    maintainer, delta, changed: list[tuple[list[str], list]]
) -> tuple[np.ndarray, np.ndarray]:
    """Codes of the engine groups a batch affected -- ``delta``'s, and those whose
    correlation variables take the changed subquery keys (``changed``: per subquery the
    outer variables and the decoded changed keys) -- and the row of each of ``delta``'s
    groups among them."""
    width = len(maintainer.query.free)
    parts = [delta.codes] if delta is not None and len(delta) else []
    ours = len(parts[0]) if parts else 0
    for variables, values in changed:
        if len(values[0]):
            parts.append(maintainer.groups_matching(variables, values))
    if not parts:
        return np.zeros((0, width), dtype=np.int64), np.zeros(0, dtype=np.int64)
    if len(parts) == 1 and ours:
        return parts[0], np.arange(ours)
    codes = np.concatenate(parts)
    if not width:
        return codes[:1], np.zeros(ours, dtype=np.int64)
    unique, inverse = group_rows(codes)
    return unique, inverse[:ours]


def passing(plan: ViewPlan, env, n: int, count: np.ndarray) -> np.ndarray:
    """Which groups exist and pass the residual filter (if any)."""
    if not n:
        return np.zeros(0, dtype=bool)
    if plan.residual is None:
        return count > 0
    return truth(plan.residual, env, n) & (count > 0)
