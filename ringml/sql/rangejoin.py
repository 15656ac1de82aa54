"""Two FROM items joined by an inequality (and any equalities), kept as two views.

``SELECT ... FROM bids x, bids y WHERE x.broker_id = y.broker_id AND x.t > y.t`` would make
the engine group the joined pairs by ``(broker, x.t, y.t)`` -- as many groups as pairs.
Instead, each side is maintained on its own (by the view's strategy), grouped by the join
variables and its compared column (side A also by the group-by keys), with the sums of its
factors of every aggregate component; a read sorts side B per join key by its compared
value, takes prefix sums of its factors, and finds for every group of side A the range of
B it joins with by binary search: ``Σ_pairs fA·fB = Σ_a fA(a) · Σ_{b joined} fB(b)``.  A read
costs ``O(|A| + |B| log |B|)`` in the sides' groups, never the pairs.

:func:`range_join` says whether a plan has this shape: two atoms, the residual one
comparison ``<``, ``<=``, ``>``, ``>=`` of an expression of one side's columns with one of
the other's, the group-by keys on one side (or join variables), no MIN/MAX/DISTINCT and no
subqueries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..encoding import factorize, factorize_rows
from ..maintainer import Maintainer
from ..query import Atom, Query
from ..rings.base import RingError
from ..rings.scalar import INT64_MAX, INT64_MIN, IntegerRing, ProductRing, RealRing, checked_mul_sum
from ..store import group_rows
from .expressions import Cmp, Col, EvaluationError, Expr
from .logical import COUNT, HIDDEN_AGGREGATES, AtomPlan, ViewPlan

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True)
class RangeJoinPlan:
    """Side ``a`` (holding the group-by keys) and side ``b``; ``left``/``right`` the
    compared expressions of a and b (``left op right``); per side the factor tuples its
    components sum (``()``: the count); per view component the pair of side components."""

    a: AtomPlan
    b: AtomPlan
    op: str
    left: Expr
    right: Expr
    joins: tuple[str, ...]
    visible: tuple[str, ...]
    factors_a: tuple[tuple[str, ...], ...]
    factors_b: tuple[tuple[str, ...], ...]
    pairs: tuple[tuple[str, int, int], ...]  # (component, index in a, index in b)
    integer_a: tuple[bool, ...]
    integer_b: tuple[bool, ...]


def range_sums(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``values[lo[i]:hi[i]].sum()`` for every ``i``, by prefix sums.  Integers exactly:
    int64 prefix sums wrap, but their differences are exact where the sums fit; where a
    float bound of the magnitudes reaches 2**62 the sums are taken again with Python ints,
    :class:`EvaluationError` for one beyond int64."""
    prefix = np.concatenate([np.zeros(1, dtype=values.dtype), np.cumsum(values)])
    sums = prefix[hi] - prefix[lo]
    if values.dtype.kind == "f":
        return sums
    magnitudes = np.concatenate([np.zeros(1), np.cumsum(np.abs(values.astype(np.float64)))])
    wide = np.flatnonzero(magnitudes[hi] - magnitudes[lo] >= 2.0**62)
    if wide.size:
        exact = np.concatenate([np.zeros(1, dtype=object), np.cumsum(values.astype(object))])
        exact = (exact[hi[wide]] - exact[lo[wide]]).tolist()
        beyond = [s for s in exact if not INT64_MIN <= s <= INT64_MAX]
        if beyond:
            raise EvaluationError("a SUM overflows BIGINT", beyond[0])
        sums[wide] = exact
    return sums


def range_join(plan: ViewPlan) -> RangeJoinPlan | None:
    """The two-sided plan of ``plan``, or None when it has another shape."""
    residual = plan.residual
    if (
        len(plan.atoms) != 2
        or not isinstance(residual, Cmp)
        or residual.op not in _FLIP
        or plan.subqueries
        or plan.derived
        or any(a.function in HIDDEN_AGGREGATES for a in plan.aggregates)
        or residual.nullable
    ):
        return None
    first, second = plan.atoms
    own = {a.alias: set(a.variables) for a in plan.atoms}
    joins = own[first.alias] & own[second.alias]
    only = {alias: variables - joins for alias, variables in own.items()}

    def side(expr: Expr) -> str | None:
        names = {n.name for n in expr.walk() if isinstance(n, Col)}
        found = [alias for alias in only if names and names <= only[alias]]
        return found[0] if len(found) == 1 else None

    sides = side(residual.left), side(residual.right)
    if None in sides or sides[0] == sides[1]:
        return None
    visible = tuple(v for v, _ in plan.keys if v not in plan.hidden)
    holders = [alias for alias in only if set(visible) <= own[alias]]
    if not holders:
        return None
    a_alias = sides[0] if sides[0] in holders else sides[1]
    if a_alias not in holders:
        return None
    a, b = (first, second) if first.alias == a_alias else (second, first)
    left, right, op = residual.left, residual.right, residual.op
    if sides[0] != a_alias:
        left, right, op = right, left, _FLIP[op]
    compared = {n.name for e in (left, right) for n in e.walk() if isinstance(n, Col)}
    if set(visible) & (compared - joins):  # a compared column also grouped by: read finer
        return None
    factors = {a.alias: {(): 0}, b.alias: {(): 0}}
    integer = {a.alias: [True], b.alias: [True]}
    pairs = []
    for component in plan.components:
        parts = []
        for atom in (a, b):
            mine = tuple(v for v in component.lifted if v in own[atom.alias])
            table = factors[atom.alias]
            if mine not in table:
                table[mine] = len(table)
                integer[atom.alias].append(component.integer)
            else:
                integer[atom.alias][table[mine]] &= component.integer
            parts.append(table[mine])
        pairs.append((component.name, parts[0], parts[1]))
    return RangeJoinPlan(
        a,
        b,
        op,
        left,
        right,
        tuple(sorted(joins)),
        visible,
        tuple(factors[a.alias]),
        tuple(factors[b.alias]),
        tuple(pairs),
        tuple(integer[a.alias]),
        tuple(integer[b.alias]),
    )


def side_query(atom: AtomPlan, free: list[str], factors, integer) -> Query:
    """One side: its atom grouped by ``free``, one ring component per factor tuple."""
    rings = [
        IntegerRing() if not f else (IntegerRing if i else RealRing)(list(f))
        for f, i in zip(factors, integer, strict=True)
    ]
    ring = (
        rings[0]
        if len(rings) == 1
        else ProductRing(*rings, names=[f"s{i}" for i in range(len(rings))])
    )
    return Query(
        {atom.alias: atom.columns},
        ring,
        tuple(dict.fromkeys(free)),
        [Atom(atom.alias, atom.variables, atom.alias)],
    )


class RangeJoin:
    """The two side views of a :class:`RangeJoinPlan` and the read that joins them."""

    def __init__(self, plan: RangeJoinPlan, view_plan: ViewPlan, strategy: str) -> None:
        self.plan = plan
        self.kinds = dict(view_plan.keys)
        names = lambda e: [n.name for n in e.walk() if isinstance(n, Col)]  # noqa: E731
        free_a = [*plan.joins, *plan.visible, *names(plan.left)]
        free_b = [*plan.joins, *names(plan.right)]
        self.a = Maintainer(
            side_query(plan.a, free_a, plan.factors_a, plan.integer_a),
            strategy=strategy,
            trust_deletes=True,
        )
        self.b = Maintainer(
            side_query(plan.b, free_b, plan.factors_b, plan.integer_b),
            strategy=strategy,
            trust_deletes=True,
        )

    def maintainers(self) -> dict[str, Maintainer]:
        """Per atom alias the maintainer of its side."""
        return {self.plan.a.alias: self.a, self.plan.b.alias: self.b}

    def _side(self, maintainer: Maintainer, expr: Expr):
        from .views import decoded  # the views module imports this one

        groups = maintainer.groups()
        codes, free = groups.codes, list(maintainer.query.free)
        payload = groups.payload
        parts = [np.asarray(p) for p in (payload if isinstance(payload, tuple) else (payload,))]
        env = {
            v: decoded(maintainer, v, codes[:, free.index(v)], self.kinds[v])
            for v in free
            if v in self.kinds
        }
        values, _ = expr.evaluate(env, len(codes))
        joins = [maintainer.decode(v, codes[:, free.index(v)]) for v in self.plan.joins]
        return codes, free, parts, np.asarray(values), joins

    def read(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The view's groups (visible codes in side A's dictionaries) and components."""
        plan = self.plan
        codes_a, free_a, parts_a, u, joins_a = self._side(self.a, plan.left)
        _, _, parts_b, w, joins_b = self._side(self.b, plan.right)
        m, n = len(u), len(w)
        if plan.joins:
            both = [
                np.concatenate([x, y]).astype(object) for x, y in zip(joins_b, joins_a, strict=True)
            ]
            group = factorize_rows(both)
        else:
            group = np.zeros(n + m, dtype=np.int64)
        ranks = factorize(np.concatenate([w, u]), sort=True)[0].astype(np.int64)
        width = int(ranks.max()) + 2 if len(ranks) else 1
        key = group * width + ranks
        order = np.argsort(key[:n], kind="stable")
        sorted_keys = key[:n][order]
        probe, start = key[n:], group[n:] * width
        low = np.searchsorted(sorted_keys, start, "left")
        high = np.searchsorted(sorted_keys, start + width, "left")
        op = _FLIP[plan.op]  # u op w  <=>  w flipped-op u: the B values that join
        cut = np.searchsorted(sorted_keys, probe, "right" if op in (">", "<=") else "left")
        lo, hi = (cut, high) if op in (">", ">=") else (low, cut)
        ranged = [range_sums(part[order], lo, hi) for part in parts_b]
        visible = [free_a.index(v) for v in plan.visible]
        unique, inverse = group_rows(codes_a[:, visible])
        out = {}
        for name, i, j in plan.pairs:
            a, b = parts_a[i], ranged[j]
            if a.dtype.kind == "f" or b.dtype.kind == "f":
                summed = np.bincount(inverse, weights=a * b, minlength=len(unique))
                out[name] = summed.astype(np.float64, copy=False)
                continue
            try:
                out[name] = checked_mul_sum([a, b], inverse, len(unique))
            except RingError as error:
                raise EvaluationError(f"an integer aggregate overflows BIGINT ({error})") from None
        alive = out[COUNT] > 0
        return unique[alive], {name: values[alive] for name, values in out.items()}
