"""SQL views over changing tables, maintained by the F-IVM engine.

A :class:`Database` holds a catalog, the current rows of its tables and its views.  Each view
compiles to one :class:`ringml.Query` whose relations are the view's FROM items (one per
alias) and is kept by a :class:`ringml.Maintainer` of the chosen strategy.  A batch of a
table is type-checked and delete-checked once, then every view reading the table gets, per
alias over it, the rows passing the alias's filter projected on the columns it needs
(computed columns evaluated on whole columns) in ONE atomic ``apply`` (so a self-join sees
the change in all its atoms).  Views are read as DataFrames or Arrow tables (warehouse mode)
or publish their diffs to subscribers after every batch (publish-subscribe mode).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pandas as pd

from ..batch import UpdateBatch
from ..delta import notify
from ..encoding import factorize, factorize_rows
from ..errors import BatchError, InputTypeError, RingmlError
from ..keyindex import KeyIndex
from ..maintainer import STRATEGIES, Maintainer
from ..rings.scalar import INT64_MAX, INT64_MIN
from ..store import group_rows
from .catalog import Catalog, TableSchema, conform_column, parse_ddl
from .compiler import compile_view
from .errors import SqlNameError
from .expressions import (
    DTYPES,
    FILL,
    EvaluationError,
    Expr,
    SubqueryRef,
    as_numbers,
    key_values,
    truth,
)
from .logical import COUNT, HIDDEN_AGGREGATES, AtomPlan, SubqueryPlan, ViewPlan, valued
from .output import (
    Aggregated,
    columns_frame,
    exact_frame,
    key_column,
    mean,
    row_changes,
    view_columns,
)
from .rangejoin import RangeJoin, range_join, range_sums
from .residual import (
    ResidualResult,
    affected_groups,
    incremental_subquery,
    keyed_subquery,
    passing,
)
from .semijoin import reduce_static
from .tables import TableChange, TableStore, abandon_changes, check_batches

Subscriber = Callable[[pd.DataFrame], object]


def engine_groups(maintainer: Maintainer, plan: ViewPlan) -> tuple[dict, dict]:
    """The maintained groups: decoded values per free variable and one array per ring
    component (a vectorized read of the result)."""
    groups = maintainer.groups()
    keys = groups.columns()
    parts = _parts(groups.payload)
    return {var: keys[var] for var, _ in plan.keys}, {
        c.name: p for c, p in zip(plan.components, parts, strict=True)
    }


class GroupKeys(Mapping):
    """The key values of a set of groups, decoded per variable on first use (a read of an
    ORDER BY ... LIMIT view decodes only the groups it keeps: :meth:`take`)."""

    def __init__(self, maintainer: Maintainer, free: Sequence[str], codes: np.ndarray) -> None:
        self._maintainer, self._free, self._codes = maintainer, tuple(free), codes
        self._decoded: dict[str, np.ndarray] = {}

    def __getitem__(self, variable: str) -> np.ndarray:
        if variable not in self._decoded:
            column = self._free.index(variable)
            self._decoded[variable] = self._maintainer.decode(variable, self._codes[:, column])
        return self._decoded[variable]

    def __iter__(self):
        return iter(self._free)

    def __len__(self) -> int:
        return len(self._free)

    def take(self, rows: np.ndarray) -> GroupKeys:
        """The keys of the groups at ``rows``."""
        return GroupKeys(self._maintainer, self._free, self._codes[rows])


class _KeyEnv(dict):
    """What a residual condition reads: key columns decoded on first use and the
    subqueries' lookups."""

    def __init__(self, plan: ViewPlan, maintainer: Maintainer, codes, lookups) -> None:
        super().__init__(lookups)
        self._kinds, self._maintainer, self._codes = dict(plan.keys), maintainer, codes
        self._free = list(maintainer.query.free)

    def __missing__(self, name: str) -> np.ndarray:
        column = self._codes[:, self._free.index(name)]
        value = self[name] = decoded(self._maintainer, name, column, self._kinds[name])
        return value


def decoded(maintainer: Maintainer, variable: str, codes: np.ndarray, kind: str) -> np.ndarray:
    """The values of a key variable behind ``codes`` as an array of its kind (numbers
    from the dictionary's numeric cache, no per-value conversion)."""
    if kind in ("int", "float"):
        return maintainer.decode_numbers(variable, codes).astype(DTYPES[kind], copy=False)
    return key_column(maintainer.decode(variable, codes), kind)


class _KeyedLookup:
    """A keyed subquery's values at the probed keys, read from its view's groups (minus
    its last change with ``before``); no pass over its whole result."""

    def __init__(self, sub: SubqueryPlan, view: View, before: bool) -> None:
        self._sub, self._view, self._before = sub, view, before

    def __call__(self, values, null, n):
        view, sub = self._view, self._sub
        maintainer = view.maintainer
        free = list(maintainer.query.free)
        codes = np.column_stack(
            [maintainer.codes_of(v, values[j]) for j, v in enumerate(free)]
            or [np.zeros(n, dtype=np.int64)]
        ).reshape(n, len(free))
        found = (codes >= 0).all(axis=1)
        if null is not None:  # a NULL key equals no key
            found &= ~null
        codes = np.where(found[:, None], codes, 0)
        components = view._components(maintainer.groups(at=codes).payload)
        delta = view._delta
        if self._before and delta is not None and len(delta):
            index = KeyIndex(len(free))
            index.get_or_insert(delta.codes)
            at = index.lookup(codes)
            hit = (at >= 0) & found
            for name, moved in view._components(delta.payload).items():
                components[name] = components[name] - np.where(hit, moved[np.maximum(at, 0)], 0)
        present = found & (components[COUNT] > 0)
        # ``__v`` (the output after the keys) reads aggregates only: no key is decoded
        value, null = Aggregated(sub.plan, {}, components, n)[f"#o{sub.equalities}"]
        null = np.zeros(n, dtype=bool) if null is None else null
        return _gather(np.asarray(value), null, np.where(present, np.arange(n), -1), sub.default)


class _Lookup:
    """A subquery's lookup, built from its view's rows (or given rows) on first call."""

    def __init__(self, sub: SubqueryPlan, rows) -> None:
        self._sub, self._rows, self._lookup = sub, rows, None

    def __call__(self, values, null, n):
        if self._lookup is None:
            rows = self._rows if isinstance(self._rows, pd.DataFrame) else self._rows._frame()
            self._lookup = subquery_lookup(self._sub, rows)
        return self._lookup(values, null, n)


def subquery_lookup(sub: SubqueryPlan, rows: pd.DataFrame) -> Callable:
    """``lookup(outer values, null, n) -> (values, null)``: the subquery's value for each
    outer row, from the rows of its maintained view (an outer row with a NULL correlation
    value matches none)."""
    if sub.mode == "in":
        return _membership(rows.iloc[:, 0])
    k = sub.equalities
    value = rows["__v"].to_numpy()
    null = rows["__v"].isna().to_numpy()
    if sub.inequality is not None:
        return lambda values, absent, n: _range_sums(sub, rows, value, values, absent, n)
    if k == 0:
        found = len(rows) and rows["__n"].iloc[0] > 0
        positions = np.zeros(1, dtype=np.int64) if found else np.full(1, -1, dtype=np.int64)
        return lambda values, absent, n: _gather(value, null, np.repeat(positions, n), sub.default)
    if k == 1:  # an Index of objects hashes them as Python does
        index = pd.Index(rows["__k0"].to_numpy())

        def lookup(values, absent, n):
            return _gather(value, null, _absent(index.get_indexer(pd.Index(values[0])), absent),
                           sub.default)  # fmt: skip

        return lookup
    keys = [rows[f"__k{j}"].to_numpy(dtype=object) for j in range(k)]

    def lookup(values, absent, n):
        # the subquery's keys and the probes coded together (a MultiIndex would factorize
        # its strings as C strings: "a" and "a\x00" met)
        both = [
            np.concatenate([key, np.asarray(v, dtype=object)])
            for key, v in zip(keys, values[:k], strict=True)
        ]
        codes = factorize_rows(both)
        m = len(keys[0])
        positions = _absent(pd.Index(codes[:m]).get_indexer(codes[m:]), absent)
        return _gather(value, null, positions, sub.default)

    return lookup


def _absent(positions: np.ndarray, absent: np.ndarray | None) -> np.ndarray:
    """Probe positions with the rows whose correlation value is NULL matching nothing."""
    if absent is not None:
        positions[absent] = -1
    return positions


def _membership(members: pd.Series) -> Callable:
    """``x IN (members)`` for each outer ``x``, three-valued: TRUE if found, else NULL when
    ``x`` or a member is NULL (a NULL ``x`` IN no member: FALSE)."""
    present = members.dropna().to_numpy()
    some_null = bool(members.isna().any())

    def member(values, absent, n):
        hit = pd.Index(values[0]).isin(present)
        unknown = ~hit if some_null else np.zeros(n, dtype=bool)
        if absent is not None and len(members):
            hit, unknown = hit & ~absent, unknown | absent
        return hit, (unknown if unknown.any() else None)

    return member


def _gather(value: np.ndarray, null: np.ndarray, positions: np.ndarray, default):
    """``value[positions]``, ``default`` where a position is -1 (no match); a NULL row
    holds a harmless value (not NaN or None)."""
    found = positions >= 0
    fill = 0 if default is None else default
    if value.dtype.kind in "iufb":
        dtype = np.result_type(value.dtype, np.asarray(fill).dtype)
        out = np.full(positions.size, fill, dtype=dtype)
    elif value.dtype.kind == "M":
        fill = np.datetime64(0, "ns")
        out = np.full(positions.size, fill, dtype=value.dtype)
    else:
        out = np.full(positions.size, fill, dtype=object)
    out[found] = value[positions[found]]
    missing = ~found if default is None else np.zeros(positions.size, dtype=bool)
    missing[found] = null[positions[found]]
    out[missing] = fill
    return out, (missing if missing.any() else None)


def _range_sums(
    sub: SubqueryPlan, rows: pd.DataFrame, value: np.ndarray, values, absent, n: int
) -> tuple[np.ndarray, None]:
    """Per outer row, the sum of ``__v`` over the subquery's rows with its equality keys
    and ``__r op x`` (``x``: the outer value of the inequality; ``absent``: the rows with a
    NULL correlation value, which sum no row): one sort of the rows by (keys, ``__r``),
    prefix sums, and binary searches (no loop over rows)."""
    k, m = sub.equalities, len(rows)
    if k:
        both = [
            np.concatenate([rows[f"__k{j}"].to_numpy(dtype=object), np.asarray(values[j], object)])
            for j in range(k)
        ]
        group = factorize_rows(both)
    else:
        group = np.zeros(m + n, dtype=np.int64)
    ranks = factorize(np.concatenate([rows["__r"].to_numpy(), values[k]]), sort=True)[0]
    width = int(ranks.max()) + 2 if len(ranks) else 1
    key = group.astype(np.int64) * width + ranks
    order = np.argsort(key[:m], kind="stable")
    sorted_keys = key[:m][order]
    probe, start = key[m:], group[m:].astype(np.int64) * width
    low = np.searchsorted(sorted_keys, start, "left")
    high = np.searchsorted(sorted_keys, start + width, "left")
    op = sub.inequality
    cut = np.searchsorted(sorted_keys, probe, "right" if op in (">", "<=") else "left")
    lo, hi = (cut, high) if op in (">", ">=") else (low, cut)
    sums = range_sums(value[order], lo, hi)
    if absent is not None:
        sums[absent] = 0
    return sums, None


def _hidden_aggregate(function: str, values: np.ndarray, inverse: np.ndarray, m: int):
    """MIN/MAX or COUNT/SUM/AVG(DISTINCT) of ``values`` per group (``inverse``: group ids
    0..m-1, every group present); :class:`EvaluationError` for an integer SUM beyond
    int64 or a float sum beyond the finite range."""
    if function in ("min", "max"):
        series = pd.Series(values).groupby(inverse, sort=True)
        return (series.min() if function == "min" else series.max()).to_numpy()
    groups, distinct = _distinct_pairs(values, inverse)
    counts = np.bincount(groups, minlength=m).astype(np.int64)
    if function == "count_distinct":
        return counts
    sums = _group_sums(distinct, groups, m)
    if function == "avg_distinct":
        return mean(sums, counts)
    if sums.dtype == object:
        wide = [s for s in sums.tolist() if not INT64_MIN <= s <= INT64_MAX]
        raise EvaluationError("overflows BIGINT", wide[0])
    return sums


def _distinct_pairs(values: np.ndarray, inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (group, value) pairs: their groups and values (hashed, not sorted)."""
    codes, uniques = factorize(values)
    k = max(len(uniques), 1)
    pairs = pd.unique(inverse.astype(np.int64) * k + codes)
    return pairs // k, uniques[pairs % k]


def _group_sums(values: np.ndarray, groups: np.ndarray, m: int) -> np.ndarray:
    """Per group (0..m-1, each present) the sum of its ``values``: integers exactly
    (:func:`_int_sums`), floats as exactly as cheaply possible (:func:`_float_sums`)."""
    magnitudes = np.bincount(groups, weights=np.abs(values.astype(np.float64)), minlength=m)
    if values.dtype.kind == "f":
        return _float_sums(values, groups, magnitudes)
    return _int_sums(values, groups, magnitudes)


def _int_sums(values: np.ndarray, groups: np.ndarray, magnitudes: np.ndarray) -> np.ndarray:
    """int64 sums; the groups whose magnitudes reach 2**62 summed again in Python, as
    Python ints (objects) if one of them leaves int64."""
    sums = np.zeros(len(magnitudes), dtype=np.int64)
    with np.errstate(over="ignore"):
        np.add.at(sums, groups, values)
    wide = np.flatnonzero(magnitudes >= 2.0**62)
    if not wide.size:
        return sums
    exact = [sum(members) for members in _members(values, groups, wide)]
    if all(INT64_MIN <= s <= INT64_MAX for s in exact):
        sums[wide] = exact
        return sums
    out = sums.astype(object)
    out[wide] = exact
    return out


#: a float sum whose magnitudes add up to this many times its own is summed exactly
_CANCELLATION = 2.0**16


def _float_sums(values: np.ndarray, groups: np.ndarray, magnitudes: np.ndarray) -> np.ndarray:
    """Compensated sums (pandas' Kahan sums: DuckDB's are plain), exactly rounded
    (``math.fsum``) where they cancel much; :class:`EvaluationError` for one leaving the
    finite range."""
    sums = pd.Series(values).groupby(groups, sort=True).sum().to_numpy()
    if not np.isfinite(sums).all():
        raise EvaluationError("leaves the finite range of DOUBLE", sums[~np.isfinite(sums)][0])
    cancel = np.isfinite(magnitudes) & (magnitudes > _CANCELLATION * np.abs(sums))
    exact = np.flatnonzero(cancel)
    sums[exact] = [math.fsum(members) for members in _members(values, groups, exact)]
    return sums


def _members(values: np.ndarray, groups: np.ndarray, chosen: np.ndarray) -> list[list]:
    """The values of each group of ``chosen`` (ascending), as Python objects."""
    rows = np.flatnonzero(np.isin(groups, chosen))
    rows = rows[np.argsort(groups[rows], kind="stable")]
    bounds = [*np.searchsorted(groups[rows], chosen).tolist(), len(rows)]
    return [values[rows[a:b]].tolist() for a, b in pairwise(bounds)]


def _parts(payload) -> list[np.ndarray]:
    """The component arrays of a payload batch (one ring, or a product of rings)."""
    return [np.asarray(p) for p in (payload if isinstance(payload, tuple) else (payload,))]


@dataclass
class Subscription:
    """A subscriber's handle: :meth:`cancel` stops the diffs."""

    view: View
    callback: Subscriber

    def cancel(self) -> None:
        if self in self.view._subscribers:
            self.view._subscribers.remove(self)


class View:
    """A maintained SQL view.  Read it with :meth:`to_pandas` / :meth:`to_arrow`, or
    :meth:`subscribe` to its diffs."""

    static: frozenset[str] = frozenset()  # views pickled before static tables existed

    def __init__(
        self, name: str, plan: ViewPlan, strategy: str, static: frozenset[str] = frozenset()
    ) -> None:
        self.name = name
        self.plan = plan
        self.strategy = strategy
        self.static = frozenset(static)  # base tables that never change while the view lives
        self.query = plan.query()
        # two items joined by an inequality: two side views joined on read (rangejoin)
        shape = range_join(plan) if plan.residual is not None else None
        self.range = RangeJoin(shape, plan, strategy) if shape is not None else None
        # the database checks deletes against its tables once, for every view
        self.maintainer = (
            self.range.a
            if self.range is not None
            else Maintainer(
                self.query,
                strategy=strategy,
                trust_deletes=True,
                updatable=[a.alias for a in plan.atoms if a.table not in self.static],
            )
        )
        # diffs retract the rows as they were read, not now minus the change (rounding)
        self.maintainer.keep_previous = True
        self._subscribers: list[Subscription] = []
        self._by_table: dict[str, list[AtomPlan]] = {}
        for atom in plan.atoms:
            self._by_table.setdefault(atom.table, []).append(atom)
        # each subquery of WHERE is a view of its own, read by the residual filter
        self.subviews = [
            View(f"{name}#s{i}", sub.plan, strategy, self.static)
            for i, sub in enumerate(plan.subqueries)
        ]
        # each aggregate derived table is a view whose row changes feed an atom of this one
        self.derived = [
            (table, View(f"{name}{table}", p, strategy, self.static)) for table, p in plan.derived
        ]
        self._delta = None  # the engine's change of the result in the last apply
        # a residual filter without MIN/MAX/DISTINCT: its filtered result is kept per batch
        self._hidden_aggregates = [a for a in plan.aggregates if a.function in HIDDEN_AGGREGATES]
        self._refs = (  # per subquery of the residual: its correlated outer arguments
            {n.index: n.args for n in plan.residual.walk() if isinstance(n, SubqueryRef)}
            if plan.residual is not None
            else {}
        )
        self._result: ResidualResult | None = None  # None: rebuilt on the next read

    def __getstate__(self) -> dict:
        """Everything but the subscribers (callbacks of this process; the maintainer drops
        its own too): a view pickles, and so does its database."""
        state = self.__dict__.copy()
        state["_subscribers"] = []
        return state

    @property
    def sql(self) -> str:
        return self.plan.sql

    def description(self) -> dict:
        """What the view maintains, canonically: its SQL as sqlglot renders it (formatting
        does not matter), the strategy and the engine's :meth:`Maintainer.description`."""
        from .parse import DIALECT, parse_select

        out = {
            "sql": parse_select(self.plan.sql).sql(dialect=DIALECT),
            "strategy": self.strategy,
            "engine": self.maintainer.description(),
        }
        if self.static:
            out["static"] = sorted(self.static)
        return out

    @property
    def columns(self) -> tuple[str, ...]:
        return self.plan.columns

    def to_pandas(self) -> pd.DataFrame:
        """The view's current rows (ORDER BY/LIMIT applied); an integer column holding
        NULLs is pandas "Int64"."""
        return exact_frame(self._frame(), self.plan)

    def _frame(self) -> pd.DataFrame:
        """The current rows as read inside (an integer column with NULLs: Python ints and
        None, as lookups and a query over the view read them)."""
        return columns_frame(self._current())

    def _current(self) -> dict[str, np.ndarray]:
        """:meth:`to_pandas`'s rows as columns (what a diff of whole results compares);
        :class:`RingmlError` for a value beyond its type (an inequality join sums on read,
        and a result not kept is filtered on read)."""
        try:
            return self._read()
        except EvaluationError as error:
            raise RingmlError(f"view {self.name!r}: {error}") from None

    def _read(self) -> dict[str, np.ndarray]:
        lookups = self._lookups()
        if self.range is not None:
            codes, components = self.range.read()
            keys = GroupKeys(self.range.a, self.range.plan.visible, codes)
            return view_columns(self.plan, keys, components, lookups)
        if self.plan.collapsed:  # the filtered, collapsed result kept per batch
            if self._result is None:
                self._result = self._rebuild()
            codes, components = self._result.read()
            keys = GroupKeys(self.maintainer, self._result.visible, codes)
            return view_columns(self.plan, keys, components, lookups)
        groups = self.maintainer.groups()
        keys = GroupKeys(self.maintainer, groups.free, groups.codes)
        return view_columns(self.plan, keys, self._components(groups.payload), lookups)

    def _lookups(self, before: Collection[int] = ()) -> dict:
        """Per subquery slot ``#sI`` its lookup: a keyed subquery's values read from its
        groups at the probed keys (as they were before the last batch for those in
        ``before``), any other's from its view's rows, built on first use."""
        return {
            f"#s{i}": _KeyedLookup(sub, view, i in before)
            if keyed_subquery(sub)
            else _Lookup(sub, view)
            for i, (sub, view) in enumerate(zip(self.plan.subqueries, self.subviews, strict=True))
        }

    def _components(self, payload) -> dict[str, np.ndarray]:
        parts = _parts(payload)
        return {c.name: p for c, p in zip(self.plan.components, parts, strict=True)}

    def _rebuild(self) -> ResidualResult:
        """The filtered result from all engine groups."""
        groups = self.maintainer.groups()
        codes, components = groups.codes, self._components(groups.payload)
        env = _KeyEnv(self.plan, self.maintainer, codes, self._lookups())
        keep = passing(self.plan, env, len(codes), components[COUNT])
        result = ResidualResult(self.plan, tuple(self.maintainer.query.free))
        result.add(codes[keep], {name: values[keep] for name, values in components.items()})
        self._set_hidden(result, codes[keep])
        return result

    def _set_hidden(self, result: ResidualResult, codes: np.ndarray) -> None:
        """MIN/MAX/DISTINCT of the output groups of ``codes`` (engine groups that pass the
        filter, every one of those output groups' passing groups among them)."""
        if not self._hidden_aggregates:
            return
        unique, inverse = group_rows(codes[:, result.columns])
        kinds, free = dict(self.plan.keys), result.free
        for a in self._hidden_aggregates:
            column = codes[:, free.index(a.argument)]
            values = decoded(self.maintainer, a.argument, column, kinds[a.argument])
            groups, m = inverse, len(unique)
            if a.argument_null is not None:  # the groups of its non-NULL values only
                null = codes[:, free.index(a.argument_null)]
                present = ~decoded(self.maintainer, a.argument_null, null, "bool")
                has = np.zeros(m, dtype=bool)
                has[inverse[present]] = True
                number = np.cumsum(has) - 1  # each group with a value: its rank among them
                values, groups, m = values[present], number[inverse[present]], int(has.sum())
            try:
                aggregated = (
                    _hidden_aggregate(a.function, values, groups, m)
                    if m
                    else np.zeros(0, dtype=DTYPES[a.type])
                )
            except EvaluationError as error:
                what = f"{a.text} {error} (a group's sum is {error.value!r})"
                raise EvaluationError(what, error.value) from None
            if a.argument_null is not None:
                full = np.zeros(len(unique), dtype=aggregated.dtype)
                full[has] = aggregated
                aggregated = full
                result.set_values(valued(a.slot), unique, has)
            result.set_values(a.slot, unique, aggregated)

    @property
    def _checks_sums(self) -> bool:
        """Whether the kept result of a collapsed view holds sums that may leave their range
        (an integer SUM of its groups, SUM/AVG(DISTINCT)): a batch builds it if need be, so
        that such a sum rejects the batch rather than fails a read."""
        plan = self.plan
        if not plan.collapsed or self.range is not None:  # no kept result
            return False
        return any(c.integer and c.lifted for c in plan.components) or any(
            a.function in ("sum_distinct", "avg_distinct") for a in self._hidden_aggregates
        )

    def _touched(self, result, codes, old: np.ndarray, new: np.ndarray, existed) -> None:
        """MIN/MAX/DISTINCT of the output groups the affected engine groups ``codes``
        belong to (``old``/``new``: whether each passed before/after the batch;
        ``existed``: per output group of ``codes``, in ``group_rows`` order, whether it
        existed before).  A MIN/MAX moves to a value that came in, unless a value equal to
        it left: only then (or for DISTINCT) are the group's engine groups read again."""
        if not self._hidden_aggregates or not len(codes):
            return
        visible, inverse = group_rows(codes[:, result.columns])
        alive = result.exist(visible)
        # DISTINCT, and aggregates over a nullable argument: the groups are read again
        again = alive & any(
            a.function not in ("min", "max") or a.argument_null is not None
            for a in self._hidden_aggregates
        )
        came, left = new & ~old, old & ~new
        kinds, free = dict(self.plan.keys), result.free
        updates = []
        for a in self._hidden_aggregates:
            if a.function not in ("min", "max") or again.all():
                continue
            values = decoded(
                self.maintainer, a.argument, codes[:, free.index(a.argument)], kinds[a.argument]
            )
            current = result.get_values(a.slot, visible)
            hit = left & existed[inverse] & (values == current[inverse])
            again[np.unique(inverse[hit])] = True
            if came.any():
                groups = pd.Series(values[came]).groupby(inverse[came], sort=True)
                best = groups.min() if a.function == "min" else groups.max()
                ids, best = best.index.to_numpy(), best.to_numpy()
                # compared only where the group had a value and is not read again (a NULL
                # MAX of a nullable argument holds a placeholder of another type)
                before = existed[ids] & ~again[ids]
                better = np.zeros(ids.size, dtype=bool)
                was, now_ = current[ids][before], best[before]
                better[before] = (now_ < was) if a.function == "min" else (now_ > was)
                take = ~before | better
                updates.append((a.slot, ids[take], best[take]))
        for slot, ids, values in updates:
            keep = ~again[ids]
            result.set_values(slot, visible[ids[keep]], values[keep])
        if again.any():
            self._reread(result, visible[again])

    def _reread(self, result: ResidualResult, visible: np.ndarray) -> None:
        """Recompute MIN/MAX/DISTINCT of output groups from all their engine groups."""
        maintainer = self.maintainer
        if result.visible:
            values = [maintainer.decode(v, visible[:, j]) for j, v in enumerate(result.visible)]
            codes = maintainer.groups_matching(result.visible, values)
        else:
            codes = maintainer.groups().codes
        now = self._components(maintainer.groups(at=codes).payload)
        env = _KeyEnv(self.plan, maintainer, codes, self._lookups())
        self._set_hidden(result, codes[passing(self.plan, env, len(codes), now[COUNT])])

    def _refresh(self, changed_subqueries: list[int], before: Collection[int]):
        """Filter again the engine groups the last batch affected (see
        :mod:`ringml.sql.residual`): out with their old contributions, in with the new."""
        changed = []
        for i in changed_subqueries:
            delta = self.subviews[i]._delta
            if i not in self._refs or delta is None or not len(delta):
                continue
            sub = self.plan.subqueries[i]
            columns = delta.columns()
            keys = [v for v, _ in sub.plan.keys][: sub.equalities]
            changed.append(([a.name for a in self._refs[i]], [columns[v] for v in keys]))
        codes, at = affected_groups(self.maintainer, self._delta, changed)
        if not len(codes):
            return
        now = self._components(self.maintainer.groups(at=codes).payload)
        then = {name: values.copy() for name, values in now.items()}
        if len(at):
            for name, moved in self._components(self._delta.payload).items():
                then[name][at] -= moved
        n, plan, maintainer = len(codes), self.plan, self.maintainer
        new = passing(plan, _KeyEnv(plan, maintainer, codes, self._lookups()), n, now[COUNT])
        old_env = _KeyEnv(plan, maintainer, codes, self._lookups(before))
        old = passing(plan, old_env, n, then[COUNT])
        existed = self._result.exist(group_rows(codes[:, self._result.columns])[0])
        self._result.add(
            codes,
            {name: np.where(new, now[name], 0) - np.where(old, then[name], 0) for name in now},
        )
        self._touched(self._result, codes, old, new, existed)

    def _invalidate(self) -> None:
        """Drop the kept filtered results (after an undone batch): rebuilt on read."""
        self._result = None
        for view in self.subviews + [view for _, view in self.derived]:
            view._invalidate()

    def to_arrow(self):
        """The view's current rows as a ``pyarrow.Table`` (NULLs as nulls)."""
        import pyarrow as pa

        return pa.Table.from_pandas(self.to_pandas(), preserve_index=False)

    def subscribe(self, callback: Subscriber) -> Subscription:
        """Call ``callback(diff)`` after every batch that changes the view: ``diff`` holds
        the output rows that left (``multiplicity`` < 0) or came (> 0).  Callbacks run once
        the batch is applied everywhere; an exception in one propagates from the apply
        (the batch stays applied).  ``.cancel()`` on the returned handle unsubscribes."""
        if not callable(callback):
            raise InputTypeError(f"subscribe takes a callable, got {type(callback).__name__}")
        subscription = Subscription(self, callback)
        self._subscribers.append(subscription)
        return subscription

    @property
    def windowed(self) -> bool:
        """Whether the diff of a batch is the difference of the whole results before and
        after it: LIMIT/OFFSET cut the result (a change of one group moves others in),
        engine groups collapse into output rows (MIN/MAX/DISTINCT, residual filters), or the
        rows are joined from two side views on read (an inequality join)."""
        plan = self.plan
        return (
            plan.limit is not None
            or plan.offset > 0
            or plan.collapsed
            or bool(plan.subqueries)
            or self.range is not None
        )

    def _rows_before(self) -> dict[str, np.ndarray] | None:
        """What the diff of the next apply compares with: the whole result of a
        :attr:`windowed` view, else None (its diff comes from the engine's change)."""
        return self._current() if self.windowed else None

    def _changes(self, before: dict[str, np.ndarray] | None) -> pd.DataFrame | None:
        """The rows that left and came with the last apply (``before``: what
        :meth:`_rows_before` gave before it); None when no group changed."""
        if before is not None:
            return exact_frame(row_changes(before, self._current()), self.plan)
        if self._delta is None or not len(self._delta):
            return None
        return exact_frame(self.diff(self._delta), self.plan)

    def diff(self, delta) -> pd.DataFrame:
        """The output rows that left and came with an apply, from the engine's change of the
        result (``delta``: the changed groups and their payload changes): the changed
        groups' rows now and before (now minus the change), their multiset difference."""
        if delta is None or not len(delta):
            return row_changes(self._empty, self._empty)
        current = self.maintainer.groups(at=delta.codes)  # zero where a group is gone
        now = _parts(current.payload)
        if delta.previous is not None:
            then = _parts(delta.previous)
        else:  # a delta of a maintainer that did not keep them (e.g. unpickled, older)
            then = [part - moved for part, moved in zip(now, _parts(delta.payload), strict=True)]
        keys = delta.columns()
        rows = []
        for parts in (then, now):
            exists = parts[0] > 0  # the row count: a group exists while it has rows
            groups = {v: np.asarray(values)[exists] for v, values in keys.items()}
            components = {
                c.name: p[exists] for c, p in zip(self.plan.components, parts, strict=True)
            }
            rows.append(view_columns(self.plan, groups, components))
        return row_changes(*rows)

    @property
    def _empty(self) -> pd.DataFrame:
        return self.to_pandas().iloc[:0]

    def explain(self) -> str:
        """The logical plan and the engine's view tree (each subquery's after)."""
        if self.range is not None:
            sides = self.range.maintainers()
            out = self.plan.describe() + "\ninequality join of two side views, read by prefix sums"
            for alias, maintainer in sides.items():
                out += f"\n-- side {alias}:\n" + maintainer.explain()
            return out
        out = self.plan.describe() + "\n" + self.maintainer.explain()
        for _, view in self.derived:
            out += f"\n-- derived table view {view.name}:\n" + view.maintainer.explain()
        for view in self.subviews:
            out += f"\n-- subquery view {view.name}:\n" + view.maintainer.explain()
        return out

    def __repr__(self) -> str:
        return f"View({self.name!r}, strategy={self.strategy!r}, columns={list(self.columns)})"

    # ---------------------------------------------------------------- feeding
    def batches(self, changes: Mapping[str, tuple[Mapping[str, np.ndarray], np.ndarray]]) -> list:
        """Per alias over a changed table, its rows of the change (engine batches)."""
        return item_batches(self._by_table, changes, f"view {self.name!r}")

    def _apply(
        self,
        changes: Mapping[str, tuple[Mapping[str, np.ndarray], np.ndarray]],
        loading: bool = False,
    ) -> list:
        """Feed typed table changes to the views of the subqueries and to this one's
        engine; the ``(maintainer, batches)`` applied (all undone if one fails).
        ``loading``: the rows the view starts from, static tables' included (a view that
        fails to load is dropped, not undone)."""
        applied: list = []
        self._delta = None
        changed = [i for i, v in enumerate(self.subviews) if set(v.plan.tables) & set(changes)]
        before: set[int] = set()
        if self._result is not None and changed:
            if all(
                i not in self._refs or incremental_subquery(self.plan.subqueries[i], self._refs[i])
                for i in changed
            ):
                before = {i for i in changed if i in self._refs}
            else:  # every group may be affected: rebuilt on the next read
                self._result = None
        try:
            for view in self.subviews:
                applied.extend(view._apply(changes, loading))
            derived = {}
            for table, view in self.derived:
                if not set(view.plan.tables) & set(changes):
                    continue
                rows_before = view._rows_before()  # not ``before``: the subqueries' set
                applied.extend(view._apply(changes, loading))
                diff = view._changes(rows_before)
                if diff is not None and len(diff):
                    rows = table_columns(table, view.plan, diff)
                    derived[table] = (rows, diff[diff.columns[-1]].to_numpy(np.int64))
            batches = self.batches({**changes, **derived})
            if batches and self.range is not None:
                for alias, maintainer in self.range.maintainers().items():
                    mine = [b for b in batches if b.relation == alias]
                    if mine:
                        maintainer.apply(mine)
                        applied.append((maintainer, mine))
            elif batches and loading and self.static:
                static = [a.alias for a in self.plan.atoms if a.table in self.static]
                batches = reduce_static(self.query, batches, static)
                self._delta = self.maintainer.load_batches(batches)
            elif batches:
                self._delta = self.maintainer.apply(batches)
                applied.append((self.maintainer, batches))
            if self._result is not None:
                self._refresh(changed, before)
            elif self._checks_sums:  # a sum out of range rejects the batch, not a read
                self._result = self._rebuild()
        except EvaluationError as error:  # e.g. a sum beyond BIGINT: the batch is rejected
            _undo(applied)
            self._invalidate()
            raise BatchError(f"view {self.name!r}: {error}", None, None, error.value) from None
        except BaseException:
            _undo(applied)
            self._invalidate()
            raise
        return applied


def _undo(applied: list) -> None:
    """Take back applied engine batches (their inverses, in reverse order)."""
    for maintainer, batches in reversed(applied):
        maintainer.apply([UpdateBatch(b.relation, b.rows, -b.signs()) for b in reversed(batches)])


def item_batches(
    atoms: Mapping[str, Sequence[AtomPlan]],
    changes: Mapping[str, tuple[Mapping[str, np.ndarray], np.ndarray]],
    owner: str,
) -> list[UpdateBatch]:
    """The engine batches of typed table changes (per table its typed columns and their
    multiplicities): per FROM item over a changed table (``atoms``: table -> its items),
    the rows it sees."""
    out = []
    for table, (columns, signs) in changes.items():
        for atom in atoms.get(table, ()):
            rows, mult = alias_rows(atom, columns, signs, owner)
            if len(rows):
                out.append(UpdateBatch(atom.alias, rows, mult))
    return out


def alias_rows(
    atom: AtomPlan, columns: Mapping[str, np.ndarray] | pd.DataFrame, signs: np.ndarray, owner: str
) -> tuple[pd.DataFrame, np.ndarray]:
    """The rows of a typed table batch (its columns, or a frame) that ``atom`` sees:
    filtered, projected on the atom's columns (computed ones evaluated), with their
    multiplicities."""
    if isinstance(columns, pd.DataFrame):
        env = {c: columns[c].to_numpy() for c in columns.columns}
    else:
        env = dict(columns)
    n = len(signs)
    try:
        if atom.filter is not None and n:
            keep = truth(atom.filter, env, n)
            if not keep.all():
                env = _Filtered(env, keep)
                signs = signs[keep]
                n = int(keep.sum())
        columns = {}
        for name, expression, numeric in zip(
            atom.columns, atom.expressions, atom.numeric, strict=True
        ):
            if numeric:
                columns[name] = as_numbers(expression, env, n)
            else:
                columns[name] = key_values(expression, env, n)
            _check_finite(expression, columns[name])
    except EvaluationError as error:
        raise BatchError(
            f"table {atom.table!r} (alias {atom.alias!r} of {owner}): {error}",
            atom.table,
            None,
            error.value,
        ) from None
    # copy=False: the engine only reads the batch (a copy and consolidation cost ~90 us)
    return pd.DataFrame(columns, index=pd.RangeIndex(n), copy=False), signs


def _check_finite(expression: Expr, values: np.ndarray) -> None:
    """NaN and ±inf (e.g. of a division by zero) can be neither keys nor summed."""
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        value = float(values[~np.isfinite(values)][0])
        raise EvaluationError(
            f"{expression.sql()} is {value!r} for a row (a division by zero?): NaN and ±inf "
            "can be compared in WHERE, but not grouped, joined on or aggregated",
            value,
        )


class _Filtered(dict):
    """The rows of the columns in ``columns`` that ``keep`` selects, each column gathered
    when an expression first reads it (an atom reads few of a table's columns)."""

    def __init__(self, columns: Mapping[str, np.ndarray], keep: np.ndarray) -> None:
        super().__init__()
        self._columns, self._keep = columns, keep

    def __missing__(self, name: str) -> np.ndarray | tuple:
        column = self._columns[name]
        if isinstance(column, tuple):  # a view's column with NULLs: (values, null)
            value = self[name] = tuple(part[self._keep] for part in column)
        else:
            value = self[name] = column[self._keep]
        return value


class Database:
    """Tables (a :class:`Catalog` and their rows) and SQL views maintained over them.

    ``db = Database(catalog)``; ``db.create_view(name, sql, strategy="fivm")``;
    ``db.insert(table, rows)``, ``db.delete(table, rows)``, ``db.update(table, old, new)``
    or ``db.apply([UpdateBatch...])`` for an atomic batch over several tables;
    ``db.view(name).to_pandas()``; ``db.query(sql)`` evaluates a SELECT once over the
    current tables (views can be read there as tables).  Bad input raises a ringml error and
    changes no table and no view.
    """

    def __init__(self, catalog: Catalog | Mapping | str | None = None) -> None:
        if not isinstance(catalog, Catalog):
            catalog = Catalog(catalog)
        self.catalog = catalog.copy()
        self._tables = {name: TableStore(catalog.table(name)) for name in catalog}
        self._views: dict[str, View] = {}

    # ---------------------------------------------------------------- schema
    def create_table(self, ddl: str) -> None:
        """Add the tables of ``CREATE TABLE`` statements (all or none)."""
        schemas = parse_ddl(ddl)
        staged = self.catalog.copy()
        for schema in schemas:
            if schema.name in self._views:
                raise SqlNameError(f"a view named {schema.name!r} exists", construct=schema.name)
            staged.add(schema)
        self.catalog = staged
        for schema in schemas:
            self._tables[schema.name] = TableStore(schema)

    def table(self, name: str) -> pd.DataFrame:
        """A table's current rows."""
        return self._tables[self.catalog.table(name).name].frame()

    @property
    def tables(self) -> dict[str, TableSchema]:
        return {name: self.catalog.table(name) for name in self.catalog}

    def description(self) -> dict:
        """The catalog and the view definitions, canonically (not the rows): one entry per
        table (``"table T"``: its columns and types) and per view (``"view v"``: see
        :meth:`View.description`).  Checkpoints compare it before resuming, naming the
        entries that differ.  A database pickles (subscribers are dropped)."""
        out: dict = {}
        for name, schema in sorted(self.tables.items()):
            pairs = zip(schema.columns, schema.types, strict=True)
            out[f"table {name}"] = [list(pair) for pair in pairs]
            if schema.nullable:
                out[f"table {name}"].append(["NULL", list(schema.nullable)])
            if schema.key:
                out[f"table {name}"].append(["PRIMARY KEY", list(schema.key)])
        for name, view in sorted(self._views.items()):
            out[f"view {name}"] = view.description()
        return out

    def adopt_state(self, other: Database) -> None:
        """Take over the rows and view states of ``other`` (e.g. restored from a checkpoint),
        which must have this database's :meth:`description`; this database keeps its
        :class:`View` objects and their subscribers, which read the adopted state
        (``other`` should not be used afterwards)."""
        if not isinstance(other, Database):
            raise InputTypeError(f"adopt_state takes a Database, got {type(other).__name__}")
        mine, theirs = self.description(), other.description()
        differing = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if differing:
            raise RingmlError(
                f"cannot adopt the state of another database (differing: {', '.join(differing)})"
            )
        self.catalog = other.catalog.copy()
        self._tables = other._tables
        for name, view in self._views.items():
            subscribers = view._subscribers
            view.__dict__.update(other._views[name].__dict__)
            view._subscribers = subscribers

    # ---------------------------------------------------------------- views
    def create_view(
        self, name: str, sql: str, strategy: str = "fivm", static: Iterable[str] = ()
    ) -> View:
        """Compile ``sql`` and maintain it from now on; the view starts from the tables'
        current rows.  A rejected view leaves the database unchanged.

        ``static`` names tables the view reads that will not change while it exists
        (dimension tables loaded up front): the strategy then keeps no view that only their
        updates would need (F-IVM's static relations), and a change of one of them is
        rejected until the view is dropped."""
        if not isinstance(name, str) or not name:
            raise InputTypeError(f"a view name is a non-empty string, got {name!r}")
        if name.lower() in (n.lower() for n in self._views) or name in self.catalog:
            raise SqlNameError(f"a table or view named {name!r} exists already", construct=name)
        if strategy not in STRATEGIES:
            raise InputTypeError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")
        try:
            plan = compile_view(sql, self.catalog)
        except SqlNameError as error:
            if error.construct not in self._views:
                raise
            raise SqlNameError(
                f"{error.construct!r} is a view: a view reads tables only (define this one "
                f"over the tables {error.construct!r} reads; db.query can read views)",
                error.position,
                error.construct,
            ) from None
        view = View(name, plan, strategy, self._static_tables(static, plan, name))
        load = {}
        for table in plan.tables:
            store = self._tables[table]
            if len(store):
                load[table] = store.distinct()
        view._apply(load, loading=True)
        self._views[name] = view
        return view

    def _static_tables(self, static: Iterable[str], plan: ViewPlan, view: str) -> frozenset:
        if isinstance(static, str | bytes) or not isinstance(static, Iterable):
            raise InputTypeError(
                f"static takes a list of table names, got {static!r} (write [{static!r}] for "
                "one table)"
            )
        names = set()
        for table in static:
            if not isinstance(table, str):
                raise InputTypeError(f"static: a table name is a string, got {table!r}")
            name = self.catalog.table(table).name
            if name not in plan.tables:
                raise SqlNameError(
                    f"static table {table!r} is not read by view {view!r} (it reads "
                    f"{list(plan.tables)})",
                    construct=table,
                )
            names.add(name)
        return frozenset(names)

    def view(self, name: str) -> View:
        """The view called ``name``."""
        if name in self._views:
            return self._views[name]
        found = [v for n, v in self._views.items() if n.lower() == name.lower()]
        if len(found) == 1:
            return found[0]
        raise SqlNameError(
            f"unknown view {name!r}; the views are {sorted(self._views)}", construct=name
        )

    @property
    def views(self) -> dict[str, View]:
        return dict(self._views)

    def drop_view(self, name: str) -> None:
        """Stop maintaining a view."""
        del self._views[self.view(name).name]

    # ---------------------------------------------------------------- changes
    def insert(self, table: str, rows) -> None:
        """Insert rows (a DataFrame, column mapping, records or Arrow table)."""
        self.apply([UpdateBatch.inserts(table, _frame(rows, table))])

    def delete(self, table: str, rows) -> None:
        """Delete rows (each must be present)."""
        self.apply([UpdateBatch.deletes(table, _frame(rows, table))])

    def update(self, table: str, old_rows, new_rows) -> None:
        """Replace ``old_rows`` by ``new_rows`` atomically."""
        self.apply(
            [
                UpdateBatch.deletes(table, _frame(old_rows, table)),
                UpdateBatch.inserts(table, _frame(new_rows, table)),
            ]
        )

    def apply(self, batches: Iterable[UpdateBatch] | UpdateBatch) -> None:
        """Apply batches of any tables atomically: all or nothing.  Then every subscriber of
        a changed view gets its diff."""
        if isinstance(batches, UpdateBatch):
            batches = [batches]
        if isinstance(batches, str | bytes | pd.DataFrame | Mapping) or not isinstance(
            batches, Iterable
        ):
            raise InputTypeError(
                "apply takes an UpdateBatch or a list of them (ringml.UpdateBatch.inserts("
                f"table, rows) / .deletes(...)); got {type(batches).__name__}"
            )
        batches = list(batches)
        changes = self._check(batches)
        if not changes:
            return
        try:
            diffs = self._apply_views(changes)
        except BaseException:
            abandon_changes(self._tables, changes)
            raise
        for table, change in changes.items():
            self._tables[table].commit(change)
        notify(
            (subscription.callback, diff)
            for view, diff in diffs
            if diff is not None and len(diff)
            for subscription in list(view._subscribers)
        )

    def _apply_views(self, changes: Mapping[str, TableChange]) -> list[tuple[View, object]]:
        """Feed checked table changes to every view reading a changed table (all views
        unchanged if one fails, also if a subscribed view's diff cannot be read, e.g. a
        sum read by an inequality join leaving int64); each subscribed view's diff."""
        for view in self._views.values():
            frozen = sorted(view.static & set(changes))
            if frozen:
                raise BatchError(
                    f"table {frozen[0]!r} is static for view {view.name!r} (created with "
                    f"static={sorted(view.static)}); drop the view to change it",
                    frozen[0],
                )
        typed = {t: (c.columns, c.signs) for t, c in changes.items()}
        touched = [v for v in self._views.values() if set(v.plan.tables) & set(typed)]
        # what each subscribed view's diff compares with (a LIMIT view: its whole result)
        before = {v.name: v._rows_before() for v in touched if v._subscribers}
        applied: list = []
        try:
            for view in touched:
                applied.extend(view._apply(typed))
            diffs = [(v, v._changes(before[v.name])) for v in touched if v._subscribers]
        except BaseException as error:  # a rejection, a bug or an interrupt: no view changes
            _undo(applied)
            for view in touched:
                view._invalidate()
            if isinstance(error, BatchError) or not isinstance(error, RingmlError):
                raise
            raise BatchError(str(error)) from error
        return diffs

    def _check(self, batches: Sequence[UpdateBatch]) -> dict[str, TableChange]:
        """Type-check every batch and the deletes of every table (nothing changes)."""
        return check_batches(self._tables, batches)

    # ---------------------------------------------------------------- warehouse mode
    def query(self, sql: str) -> pd.DataFrame:
        """Evaluate a SELECT once over the current tables (warehouse mode); views are read
        as tables too, their NULLs included (``SELECT ... FROM my_view WHERE ...``)."""
        catalog = self.catalog.copy()
        for name, view in self._views.items():
            outputs = view.plan.outputs
            kinds = tuple(_kind_of(o.expression.kind) for o in outputs)
            nullable = tuple(o.name for o in outputs if o.expression.nullable)
            catalog.add(TableSchema(name, view.columns, kinds, nullable=nullable))
        plan = compile_view(sql, catalog, "query")
        contents = {}
        for table in plan.tables:
            if table in self._views:  # a view: its current rows, as a table's
                view = self._views[table]
                rows = view._frame()
                columns = table_columns(table, view.plan, rows)
                contents[table] = (columns, np.ones(len(rows), dtype=np.int64))
            else:
                contents[table] = self._tables[table].distinct()
        once = View("query", plan, "recompute")
        once._apply(contents)
        return once.to_pandas()


def _kind_of(kind: str) -> str:
    return "int" if kind == "null" else kind


def table_columns(name: str, plan: ViewPlan, rows: pd.DataFrame) -> dict:
    """A view's rows (a frame of its output columns, maybe more) as the typed columns of a
    table: a column holding NULLs is ``(values, null)``, its NULL rows the kind's fill."""
    out = {}
    for output in plan.outputs:
        kind = _kind_of(output.expression.kind)
        values = rows[output.name]
        null = values.isna().to_numpy() if output.expression.nullable else None
        if null is not None and null.any():
            filled = conform_column(name, output.name, kind, values.mask(null, FILL[kind]))
            out[output.name] = (filled, null)
        else:
            out[output.name] = conform_column(name, output.name, kind, values)
    return out


def _frame(rows, table: str) -> pd.DataFrame:
    from ..batch import as_frame

    return as_frame(rows, table)
