"""From the maintained groups to the view's rows, and from two sets of rows to a diff.

:func:`view_columns` takes the groups of a view (decoded key columns and one array per ring
component) and applies what follows aggregation, on whole columns: the aggregates as sums of
components (NULL where no argument was non-NULL), the output expressions, HAVING, the
repetition of a bag projection's rows by their multiplicity, ORDER BY and LIMIT/OFFSET.
:func:`row_changes` is the signed multiset difference of two results.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

import numpy as np
import pandas as pd

from ..encoding import factorize, factorize_rows
from ..rings.scalar import checked_add, checked_mul
from .expressions import DTYPES, truth
from .logical import COUNT, HIDDEN_AGGREGATES, Terms, ViewPlan, valued

MULTIPLICITY = "multiplicity"


def key_column(values: np.ndarray, kind: str) -> np.ndarray:
    """Decoded key values (objects) as the array of their kind."""
    if kind == "str" or kind == "null":
        return np.asarray(values, dtype=object)
    if kind == "date":  # a DatetimeIndex, not a Series: ~5x less overhead on few values
        return (
            pd.DatetimeIndex(np.asarray(values, dtype=object)).to_numpy().astype("datetime64[ns]")
        )
    return np.asarray(values).astype(DTYPES[kind])


def _sum_terms(terms: Terms, components: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """``Σ coefficient · component``: exact int64 when every part is an integer."""
    integer = all(isinstance(c, int) and components[name].dtype.kind == "i" for c, name in terms)
    if integer:
        total = np.zeros(n, dtype=np.int64)
        for c, name in terms:
            total = checked_add(total, checked_mul(components[name], np.full(n, c, np.int64)))
        return total
    total = np.zeros(n, dtype=np.float64)
    for c, name in terms:
        factor = float(c) if isinstance(c, Decimal | int) else c
        total = total + factor * components[name].astype(np.float64)
    return total


def mean(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``sums / counts`` (counts > 0) as float64; integer sums (int64, or Python ints as
    objects) exactly rounded: in float64 where a sum is exact there (below 2**53), by
    Python's exactly rounded integer division elsewhere."""
    floats = sums.astype(np.float64)
    out = floats / counts
    if sums.dtype.kind == "f":
        return out
    wide = np.flatnonzero(np.abs(floats) >= 2.0**53)
    out[wide] = [s / c for s, c in zip(sums[wide].tolist(), counts[wide].tolist(), strict=True)]
    return out


class Aggregated(dict):
    """The names expressions over the groups read, each computed on first use: key columns
    decoded, aggregates summed from the components, output columns (``#oI``) evaluated.
    A read that keeps few groups then decodes and evaluates only what it needs."""

    def __init__(
        self,
        plan: ViewPlan,
        keys: Mapping[str, np.ndarray],
        components: Mapping[str, np.ndarray],
        n: int,
        lookups: Mapping | None = None,
    ) -> None:
        super().__init__(lookups or {})
        self.plan, self.keys, self.components, self.n = plan, keys, components, n
        self._kinds = dict(plan.keys)
        self._aggregates = {a.slot: a for a in plan.aggregates}

    def __missing__(self, name: str):
        if name in self._kinds:
            value = key_column(self.keys[name], self._kinds[name])
        elif name in self._aggregates:
            value = self._aggregate(self._aggregates[name])
        elif name.startswith("#o") and name[2:].isdigit():
            value = self.plan.outputs[int(name[2:])].expression.evaluate(self, self.n)
        else:
            raise KeyError(name)
        self[name] = value
        return value

    def _aggregate(self, aggregate) -> tuple[np.ndarray, np.ndarray | None]:
        components, n = self.components, self.n
        if aggregate.function in HIDDEN_AGGREGATES:  # computed by the collapse of the groups
            value = components[aggregate.slot]
            if aggregate.function == "count_distinct":
                return value, None
            null = components[COUNT] == 0  # MIN/MAX/SUM/AVG over no rows: NULL
            if aggregate.argument_null is not None:  # ... or over NULLs only
                null |= ~components[valued(aggregate.slot)].astype(bool)
            return value, null if null.any() else None
        value = _sum_terms(aggregate.value, components, n)
        if aggregate.function == "count":
            return value, None
        present = (
            components[COUNT]
            if aggregate.nonnull is None
            else _sum_terms(aggregate.nonnull, components, n)
        )
        null = present == 0
        if aggregate.function == "avg":
            value = mean(value, np.where(null, 1, present))
        if null.any():  # a harmless value where NULL (an integer SUM stays exact)
            value = np.where(null, 0, value)
        return value, null if null.any() else None


def columns_frame(columns: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Columns of one length as a DataFrame (fresh arrays: no copy, no consolidation)."""
    n = len(next(iter(columns.values()))) if columns else 0
    return pd.DataFrame(columns, index=pd.RangeIndex(n), copy=False)


def exact_frame(frame: pd.DataFrame, plan: ViewPlan) -> pd.DataFrame:
    """``frame`` (of the view's output columns, maybe more) with its integer output columns
    that hold NULLs (Python ints and None) as pandas "Int64", their values exact."""
    for output in plan.outputs:
        if output.expression.kind != "int" or output.name not in frame.columns:
            continue
        column = frame[output.name]
        if column.dtype == object:
            frame[output.name] = pd.array(column.to_numpy(), dtype="Int64")
    return frame


def view_columns(
    plan: ViewPlan,
    keys: Mapping[str, np.ndarray],
    components: Mapping[str, np.ndarray],
    lookups: Mapping | None = None,
) -> dict[str, np.ndarray]:
    """The view's output rows, column by column, from its groups (``keys``: per free
    variable its decoded values, a mapping that may decode on demand and offer
    ``take(rows)``; ``components``: per ring component its values, aligned with the keys;
    ``lookups``: per subquery slot ``#sI`` of SELECT and HAVING its lookup).

    With ORDER BY and LIMIT, the groups whose first ORDER BY key is among the
    OFFSET + LIMIT smallest (ties included: ``np.partition``) are kept before anything
    else is decoded, evaluated or sorted; the order and the rows are those of sorting
    everything (a row after the cut has OFFSET + LIMIT rows before it on that key)."""
    n = len(components[COUNT])
    if plan.global_aggregate and n == 0:  # no rows at all: one row of empty aggregates
        n = 1
        components = {name: np.zeros(1, dtype=np.int64) for name in components}
    wanted = None if plan.limit is None else plan.offset + plan.limit
    if wanted is not None and plan.order and plan.grouped and n > 4 * wanted + 64:
        chosen = _top_candidates(plan, Aggregated(plan, keys, components, n, lookups), n, wanted)
        if chosen is not None:
            keys = (
                keys.take(chosen)
                if hasattr(keys, "take")
                else {var: np.asarray(values)[chosen] for var, values in keys.items()}
            )
            components = {name: values[chosen] for name, values in components.items()}
            n = chosen.size
    env = Aggregated(plan, keys, components, n, lookups)
    columns = {}
    for i, output in enumerate(plan.outputs):
        values, null = env[f"#o{i}"]
        columns[output.name] = _nullable(values, null, output.expression.kind)
    keep = truth(plan.having, env, n) if plan.having is not None else None
    order_keys = []
    for k, key in enumerate(plan.order):
        values, null = key.expression.evaluate(env, n)
        order_keys.append((f"#k{k}", values, null, key))
    rows = np.arange(n) if keep is None else np.flatnonzero(keep)
    if not plan.grouped:  # a bag projection: each group's row, its multiplicity times
        rows = np.repeat(rows, components[COUNT][rows])
    if order_keys:
        rows = _sorted(rows, order_keys, columns)
    start = plan.offset
    stop = None if plan.limit is None else start + plan.limit
    rows = rows[start:stop]
    return {name: values[rows] for name, values in columns.items()}


def _top_candidates(plan: ViewPlan, env: Aggregated, n: int, wanted: int) -> np.ndarray | None:
    """The groups (HAVING applied) whose first ORDER BY key is among the ``wanted``
    smallest in its order, ties included; None when the key has NULLs (sorted apart)."""
    first = plan.order[0]
    values, null = first.expression.evaluate(env, n)
    if null is not None and null.any():
        return None
    kept = None
    if plan.having is not None:
        kept = np.flatnonzero(truth(plan.having, env, n))
        values = values[kept]
    if values.size <= wanted:
        return kept
    codes = _sort_codes(values, descending=first.descending)
    cut = np.partition(codes, wanted - 1)[wanted - 1]
    chosen = np.flatnonzero(codes <= cut)
    return chosen if kept is None else kept[chosen]


def _nullable(values: np.ndarray, null: np.ndarray | None, kind: str) -> np.ndarray:
    if kind == "null":  # the NULL literal's column, also over no rows
        return np.full(values.shape[0], None, dtype=object)
    if null is None or not null.any():
        return values
    if kind == "float":
        out = values.astype(np.float64)
        out[null] = np.nan
        return out
    if kind == "int" and values.dtype.kind in "iub":
        # exact: Python ints and None (float64 would round beyond 2**53); frames for users
        # hold them as "Int64" (:func:`exact_frame`)
        out = values.astype(np.int64).astype(object)
        out[null] = None
        return out
    if kind == "date":
        out = values.astype("datetime64[ns]").copy()
        out[null] = np.datetime64("NaT")
        return out
    out = values.astype(object)
    out[null] = None
    return out


def _sorted(rows: np.ndarray, order_keys: list, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """``rows`` in ORDER BY order (NULLs last unless asked first); ties keep a fixed order
    (by the output columns, NULLs last).

    Each sort column becomes the codes of its sorted distinct values (:func:`factorize`,
    missing values after all others), reversed for DESC, and one stable ``np.lexsort``
    orders the rows: the order ``DataFrame.sort_values(kind="mergesort",
    na_position="last")`` gives, without building a frame and a Categorical per column
    (that took ~2 ms per read of a 600-group view, more than its maintenance)."""
    codes = []
    for _, values, null, key in order_keys:
        isnull = np.zeros(len(values), dtype=bool) if null is None else null
        codes.append(_sort_codes(isnull[rows], descending=key.nulls_first))
        codes.append(_sort_codes(values[rows], descending=key.descending))
    for values in columns.values():
        codes.append(_sort_codes(np.asarray(values)[rows], descending=False))
    if not codes or not len(rows):
        return rows
    return rows[np.lexsort(codes[::-1])]


def _sort_codes(values: np.ndarray, descending: bool) -> np.ndarray:
    """Keys that order ``values`` (reversed if ``descending``), missing values (NaN, NaT,
    None) after all others: numbers, dates and booleans without missing values as they are
    (``~`` reverses integers without overflow), anything else as the ranks of its sorted
    distinct values."""
    kind = values.dtype.kind
    if kind in "Mm":
        if not np.isnat(values).any():
            ints = values.view(np.int64)
            return ~ints if descending else ints
    elif kind in "biu" and (kind != "u" or not len(values) or values.max() < 2**63):
        ints = values.astype(np.int64) if kind == "u" else values
        return ~ints if descending else ints
    elif kind == "f" and not np.isnan(values).any():
        return -values if descending else values
    codes, uniques = factorize(values, sort=True)
    size = len(uniques)
    missing = codes < 0
    if descending:
        codes = size - 1 - codes
    if missing.any():
        codes = np.where(missing, size, codes)
    return codes


#: :func:`row_changes` groups rows as Python tuples up to this many cells (rows x columns),
#: by coding the columns with :func:`factorize_rows` beyond (~10 us per column and call)
ROW_TUPLE_CELLS = 1024
_NULL = object()  # every NULL (None, NaN, NaT) of a column as one key in a row tuple


def row_changes(
    before: pd.DataFrame | Mapping[str, np.ndarray], after: pd.DataFrame | Mapping[str, np.ndarray]
) -> pd.DataFrame:
    """The signed multiset difference ``after - before`` (frames, or mappings of the same
    columns to arrays): each distinct row whose count changed, with the change in a
    ``multiplicity`` column (-1: a row left, +1: a row came), in the order of the rows'
    first appearance in ``before`` then ``after``.

    Rows are equal when every column is (:func:`factorize`'s equality: NULLs equal to each
    other, ``-0.0 == 0.0``, numbers by value, strings as Python compares them); no frame
    groupby: a small diff groups Python tuples in a dict, a large one codes the columns
    into one integer per row and sums the signs by ``np.bincount``."""
    name = MULTIPLICITY
    columns = list(before.columns) if isinstance(before, pd.DataFrame) else list(before)
    while name in columns:
        name += "_"
    if not columns:
        delta = len(after) - len(before)
        return pd.DataFrame({name: [delta]} if delta else {name: []}, dtype=np.int64)
    before, after = _arrays(before, columns), _arrays(after, columns)
    joined = {}
    for column in columns:
        old, new = before[column], after[column]
        if old.dtype != new.dtype and old.dtype.kind in "iub" and new.dtype.kind in "iufb":
            # an integer column that became float (a NULL came): compared as Python numbers,
            # so that integers beyond 2**53 stay distinct
            joined[column] = np.concatenate([old.astype(object), new.astype(object)])
        else:
            joined[column] = np.concatenate([old, new])
    n_before = len(before[columns[0]])
    cells = len(joined[columns[0]]) * len(columns)
    group = _tuple_groups if cells <= ROW_TUPLE_CELLS else _coded_groups
    rows, net = group(list(joined.values()), n_before)
    out = {}
    for column in columns:  # the view's dtype where the values allow, else the widest
        values = joined[column][rows]
        for dtype in (before[column].dtype, after[column].dtype):
            if values.dtype == dtype or not len(rows):
                break
            if dtype.kind == "b" and pd.isna(values).any():  # a NULL does not become False
                continue
            try:  # pandas' cast: NULLs (NaN) do not become integers, nor 2.0**63
                values = pd.Series(values, copy=False).astype(dtype).to_numpy()
                break
            except (TypeError, ValueError, OverflowError):
                continue
        out[column] = values
    out[name] = net
    return pd.DataFrame(out, index=pd.RangeIndex(rows.size), copy=False)


def _arrays(rows: pd.DataFrame | Mapping[str, np.ndarray], columns: list[str]) -> dict:
    """The columns of a frame or mapping as numpy arrays."""
    if isinstance(rows, pd.DataFrame):
        return {c: rows[c].to_numpy() for c in columns}
    return {c: np.asarray(rows[c]) for c in columns}


def _tuple_groups(columns: list[np.ndarray], n_before: int) -> tuple[np.ndarray, np.ndarray]:
    """For rows ``0 .. n_before - 1`` counted -1 and the rest +1: the first row of every
    distinct row whose count is not 0, in order, and that count (rows as tuples in a dict)."""
    lists = []
    for values in columns:
        items = values.tolist()
        if values.dtype.kind in "fOMm":  # the kinds that hold NULLs
            null = pd.isna(values)
            if null.any():
                items = [_NULL if n else v for v, n in zip(items, null.tolist(), strict=True)]
        lists.append(items)
    seen: dict[tuple, list[int]] = {}  # row -> [count, first position]; insertion ordered
    for i, row in enumerate(zip(*lists, strict=True)):
        sign = -1 if i < n_before else 1
        entry = seen.get(row)
        if entry is None:
            seen[row] = [sign, i]
        else:
            entry[0] += sign
    changed = [entry for entry in seen.values() if entry[0]]
    rows = np.fromiter((first for _, first in changed), np.int64, len(changed))
    net = np.fromiter((count for count, _ in changed), np.int64, len(changed))
    return rows, net


def _coded_groups(columns: list[np.ndarray], n_before: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_tuple_groups` by codes: one integer per row (:func:`factorize_rows`, group
    ids in order of first appearance)."""
    total = len(columns[0])
    row_key = factorize_rows(columns)
    groups = int(row_key.max()) + 1 if total else 0
    net = np.bincount(row_key[n_before:], minlength=groups) - np.bincount(
        row_key[:n_before], minlength=groups
    )
    first = np.empty(groups, dtype=np.int64)
    first[row_key[::-1]] = np.arange(total - 1, -1, -1)
    changed = np.flatnonzero(net)
    return first[changed], net[changed].astype(np.int64)
