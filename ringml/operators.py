"""The operators a maintenance plan runs, on whole batches: join, lift, group, step, add.

Every operator takes an explicit :class:`Context` (the ring, the dictionaries, which
variables are lifted and which are lifted by their codes, whether exact derivation counts
are kept) and works on :class:`Rows` -- key codes, feature values and payloads of the rows
in flight -- and on :class:`~ringml.store.ViewStore` objects.  Nothing here knows about
strategies or triggers: :mod:`ringml.plan` says what runs, :mod:`ringml.maintainer` runs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .encoding import Dictionary
from .plan import ViewSpec
from .rings.base import Ring
from .rings.scalar import checked_mul
from .store import ViewStore, group_codes, group_rows

Member = tuple[ViewStore, tuple[str, ...]]  # a stored relation and the variables of its keys


@dataclass(frozen=True)
class Context:
    """What the operators need besides their arguments."""

    ring: Ring
    dictionaries: Mapping[str, Dictionary]
    lifted: frozenset[str]
    keyed: frozenset[str]  # lifted by their dictionary codes (categories, listed variables)
    track_support: bool  # stores keep exact derivation counts (F-IVM Remark 1)


@dataclass
class Rows:
    """Rows in flight: key codes, feature values, payloads."""

    codes: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    payload: object  # a ring batch aligned with the rows; None: ``multiplicity`` times one
    multiplicity: np.ndarray | None = None
    support: np.ndarray | None = None  # exact derivation counts, when tracked


def _key_columns(columns: list[np.ndarray]) -> np.ndarray:
    """Key columns side by side, ``(n, len(columns))``: ``np.column_stack``, or for one
    column an ``(n, 1)`` view of it (no copy; keys in flight are never written)."""
    return columns[0][:, None] if len(columns) == 1 else np.column_stack(columns)


def group_sum(values: np.ndarray | None, groups: np.ndarray | None, n_groups: int):
    """Exact per-group sums of int64 derivation counts (None passes through)."""
    if values is None:
        return None
    if groups is None:
        return np.asarray([int(values.sum())], dtype=np.int64)
    if len(values) and float(np.abs(values).max()) * len(values) >= 2.0**53:
        # rare (huge multiplicities): float weights would round; sum in int64
        out = np.zeros(n_groups, dtype=np.int64)
        np.add.at(out, groups, values)
        return out
    return np.bincount(groups, weights=values, minlength=n_groups).astype(np.int64)


def size(ctx: Context, rows: Rows) -> int:
    """Number of rows in flight."""
    if rows.payload is None:
        return rows.multiplicity.shape[0]
    return ctx.ring.batch_len(rows.payload)


def payload(ctx: Context, rows: Rows):
    """The rows' payloads as a ring batch."""
    if rows.payload is None:
        n = rows.multiplicity.shape[0]
        if (rows.multiplicity == 1).all():
            return ctx.ring.batch_ones(n)
        return ctx.ring.batch_scale(ctx.ring.batch_ones(n), rows.multiplicity)
    return rows.payload


def empty(ctx: Context, keys: Sequence[str], support: bool) -> Rows:
    """No rows (the zero delta) over ``keys``."""
    return Rows(
        {v: np.zeros(0, dtype=np.int64) for v in keys},
        {},
        ctx.ring.batch_zeros(0),
        None,
        np.zeros(0, dtype=np.int64) if support else None,
    )


def lift_columns(
    ctx: Context,
    variables: Sequence[str],
    codes: Mapping[str, np.ndarray],
    values: Mapping[str, np.ndarray],
) -> list[np.ndarray]:
    """What the ring lifts for each variable: codes for keyed ones, numbers for the others
    (the batch's feature values, or the numbers behind the codes of a join variable)."""
    out = []
    for v in variables:
        if v in ctx.keyed:
            out.append(codes[v])
        elif v in values:
            out.append(values[v])
        else:
            out.append(ctx.dictionaries[v].numeric(codes[v]))
    return out


def lift(
    ctx: Context,
    variables: Sequence[str],
    codes: Mapping[str, np.ndarray],
    values: Mapping[str, np.ndarray],
) -> list:
    """Lifted payloads of the lifted ones among ``variables`` (ones are skipped)."""
    lifted = [v for v in variables if v in ctx.lifted]
    if not lifted:
        return []
    return ctx.ring.batch_lift_factors(lifted, lift_columns(ctx, lifted, codes, values))


def group(ctx: Context, cols, keys: Sequence[str], factors: list, support, scale=None) -> Rows:
    """``⊕`` of the product of ``factors`` (times the multiplicities ``scale``, if any)
    grouped by ``keys``."""
    ring = ctx.ring
    if keys:
        unique, groups = group_rows(_key_columns([cols[v] for v in keys]))
        return Rows(
            {v: unique[:, j] for j, v in enumerate(keys)},
            {},
            ring.batch_scaled_mul_sum(factors, scale, groups, unique.shape[0]),
            None,
            group_sum(support, groups, unique.shape[0]),
        )
    summed = ring.batch_scaled_mul_sum(factors, scale)
    return Rows({}, {}, summed, None, group_sum(support, None, 1))


def group_keys(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``group_rows`` of key columns; one column of codes without a sort (groups in order of
    first appearance)."""
    if len(columns) == 1:
        grouped = group_codes(columns[0])
        if grouped is not None:
            return grouped
    return group_rows(_key_columns(columns))


def join(
    cols: dict[str, np.ndarray],
    n: int,
    members: Sequence[Member],
    stop_empty: bool = False,
) -> tuple[np.ndarray, dict[str, np.ndarray], list[tuple[ViewStore, np.ndarray]]]:
    """Join ``n`` rows (key columns ``cols``) with stored relations, one after the other.

    Returns the joined rows' index into the input rows, their key columns, and for every
    member the slots of its matching entries.  ``stop_empty``: once no row is left, return
    at once (the later members' columns and slots are then missing).
    """
    rows = np.arange(n)
    matched: list[tuple[ViewStore, np.ndarray]] = []
    for store, keys in members:
        if stop_empty and rows.size == 0:
            break
        known = [v for v in keys if v in cols]
        probe = (
            _key_columns([cols[v] for v in known])
            if known
            else np.zeros((rows.size, 0), dtype=np.int64)
        )
        if len(known) == len(keys):
            slots = store.lookup(probe)
            found = slots >= 0
            if found.all():  # every row matches once: the rows stay as they are
                selected = None
            else:
                selected = np.flatnonzero(found)
                slots = slots[selected]
        elif known:
            positions = tuple(keys.index(v) for v in known)
            selected, slots = store.matches(positions, probe)
        else:  # no shared variable: every stored entry pairs with every row
            live = store.index.live_slots()
            selected = np.repeat(np.arange(rows.size), live.size)
            slots = np.tile(live, rows.size)
        if selected is not None and (
            selected.size != rows.size or not np.array_equal(selected, np.arange(rows.size))
        ):
            rows = rows[selected]
            cols = {v: c[selected] for v, c in cols.items()}
            matched = [(s, sl[selected]) for s, sl in matched]
        for j, v in enumerate(keys):
            if v not in cols:
                cols[v] = store.index.keys[slots, j]
        matched.append((store, slots))
    return rows, cols, matched


def step(ctx: Context, view: ViewSpec, siblings: Sequence[Member], delta: Rows) -> Rows:
    """``δV = ⊕_marginalized (δchild ⊗ siblings ⊗ lifts)``, grouped by V's keys.

    A delta that joins with nothing is returned as no rows (the zero delta)."""
    ring = ctx.ring
    n = size(ctx, delta)
    rows, cols, sibling_slots = join(dict(delta.codes), n, siblings, stop_empty=True)
    if rows.size == 0:
        return empty(ctx, view.keys, delta.support is not None)
    identity = rows.size == n and np.array_equal(rows, np.arange(n))
    values = {
        v: delta.values[v] if identity else delta.values[v][rows]
        for v in view.marginalized
        if v in delta.values
    }
    mult = None
    if delta.payload is None:  # leaf multiplicities fold into the first factor
        mult = delta.multiplicity if identity else delta.multiplicity[rows]
        if (mult == 1).all():  # inserts: scaling by 1 changes nothing
            mult = None
    support = None
    derived = delta.support is not None and ring.counts_derivations
    if delta.support is not None and not derived:
        support = delta.support if identity else delta.support[rows]
        for store, slots in sibling_slots:
            support = support * store.support[slots]
    if view.keys:
        unique, groups = group_keys([cols[v] for v in view.keys])
        n_groups = unique.shape[0]
        codes = {v: unique[:, j] for j, v in enumerate(view.keys)}
    else:
        groups, n_groups, codes = None, 1, {}
    factors = [store.take(slots) for store, slots in sibling_slots]
    if delta.payload is None and view.lifted:
        counts = [ring.batch_multiplicities(f) for f in factors]
        if all(c is not None for c in counts):
            # the rows and the siblings carry multiplicities only (a leaf's rows, stored base
            # relations): lifted and summed at once, the multiplicities as weights
            for c in counts:
                mult = c if mult is None else checked_mul(mult, c, "a product of counts")
            columns = lift_columns(ctx, view.lifted, cols, values)
            result = ring.batch_lift_sum_by(view.lifted, columns, groups, n_groups, mult)
            if derived:
                return Rows(codes, {}, result, None, ring.batch_derivations(result))
            return Rows(codes, {}, result, None, group_sum(support, groups, n_groups))
    factors += lift(ctx, view.lifted, cols, values)
    if delta.payload is not None:
        factors.insert(0, delta.payload if identity else ring.batch_take(delta.payload, rows))
    elif not factors:
        factors = [ring.batch_ones(rows.size)]
    # leaf multiplicities scale the products inside the sum (ℤ: exactly, no int64 overflow
    # of a scaled product whose group's sum fits)
    result = ring.batch_scaled_mul_sum(factors, mult, groups, n_groups)
    if derived:
        return Rows(codes, {}, result, None, ring.batch_derivations(result))
    return Rows(codes, {}, result, None, group_sum(support, groups, n_groups))


def add_grouped(ctx: Context, store: ViewStore, keys: Sequence[str], rows: Rows) -> None:
    """Add rows (any keys, repeated ones too) to a store: grouped by ``keys`` first."""
    unique, groups = group_rows(_key_columns([rows.codes[v] for v in keys]))
    n = unique.shape[0]
    store.add(
        unique,
        ctx.ring.batch_sum_by(payload(ctx, rows), groups, n),
        group_sum(rows.support, groups, n),
    )


def add(ctx: Context, store: ViewStore, keys: Sequence[str], rows: Rows) -> None:
    """Add a step's delta (one row per key) to a store."""
    codes = (
        _key_columns([rows.codes[v] for v in keys])
        if keys
        else np.zeros((ctx.ring.batch_len(rows.payload), 0), dtype=np.int64)
    )
    store.add(codes, rows.payload, rows.support)


def contents(ctx: Context, store: ViewStore) -> Rows:
    """A store's entries as rows (payloads and derivation counts)."""
    codes, stored = store.entries()
    support = store.support[store.index.live_slots()] if ctx.track_support else None
    return Rows({v: codes[:, j] for j, v in enumerate(store.keys)}, {}, stored, None, support)


# ------------------------------------------------------------------ factorized updates
def components(variable_sets: Sequence[set[str]]) -> list[list[int]]:
    """Connected components of members that share variables."""
    parent = list(range(len(variable_sets)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(variable_sets):
        for j in range(i):
            if a & variable_sets[j]:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(variable_sets)):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values())


def aggregate_rows(ctx: Context, f: Rows, summed: Sequence[str], keep: tuple[str, ...]) -> Rows:
    """Lift ``summed`` variables of a factor and sum them out, grouping by ``keep``."""
    lifts = lift(ctx, summed, f.codes, f.values)
    if f.payload is None:
        lifts = lifts or [ctx.ring.batch_ones(size(ctx, f))]
    else:
        lifts.insert(0, f.payload)
    cols = {v: f.codes[v] for v in keep}
    return group(ctx, cols, keep, lifts, f.support, f.multiplicity if f.payload is None else None)


def temporary_store(ctx: Context, f: Rows) -> ViewStore:
    """A factor as a store keyed by its variables (to join it like a view)."""
    keys = tuple(f.codes)
    store = ViewStore(keys, ctx.ring)
    if keys:
        unique, groups = group_rows(_key_columns([f.codes[v] for v in keys]))
    else:
        unique = np.zeros((1, 0), dtype=np.int64)
        groups = np.zeros(ctx.ring.batch_len(payload(ctx, f)), dtype=np.int64)
    store.add(
        unique,
        ctx.ring.batch_sum_by(payload(ctx, f), groups, unique.shape[0]),
        group_sum(f.support, groups, unique.shape[0]),
    )
    return store


def add_product(ctx: Context, store: ViewStore, keys: Sequence[str], factors: list[Rows]) -> None:
    """Add the product of factors to a stored view (expanded over its keys only)."""
    ring = ctx.ring
    sizes = [size(ctx, f) for f in factors]
    total = int(np.prod(sizes)) if sizes else 0
    if total == 0:
        return
    index = np.indices(sizes).reshape(len(sizes), -1)
    product = None
    support = None
    cols: dict[str, np.ndarray] = {}
    for f, idx in zip(factors, index, strict=True):
        p = ring.batch_take(payload(ctx, f), idx)
        product = p if product is None else ring.batch_mul(product, p)
        if f.support is not None:
            support = f.support[idx] if support is None else support * f.support[idx]
        cols.update({v: c[idx] for v, c in f.codes.items()})
    if keys:
        unique, groups = group_rows(_key_columns([cols[v] for v in keys]))
    else:
        unique, groups = np.zeros((1, 0), dtype=np.int64), np.zeros(total, dtype=np.int64)
    store.add(
        unique,
        ring.batch_sum_by(product, groups, unique.shape[0]),
        group_sum(support, groups, unique.shape[0]),
    )


def factorized_step(
    ctx: Context, view: ViewSpec, siblings: Sequence[Member], factors: list[Rows]
) -> list[Rows]:
    """``δV = ⊕_M (F1 ⊗ ... ⊗ siblings ⊗ lifts)`` with ⊕ pushed into each component."""
    ring = ctx.ring
    marginalized = set(view.marginalized)
    sibling_vars = set().union(*(set(k) for _, k in siblings)) if siblings else set()
    # 1. sum out, inside a factor, the marginalized variables no one else has
    local_factors = []
    for f in factors:
        variables = set(f.codes) | set(f.values)
        local = [v for v in variables if v in marginalized and v not in sibling_vars]
        if local:
            keep = tuple(v for v in f.codes if v not in local)
            f = aggregate_rows(ctx, f, local, keep)
        local_factors.append(f)
    # 2. connected components of factors and siblings over shared variables
    members: list[tuple[str, object, set[str]]] = [
        ("factor", f, set(f.codes)) for f in local_factors
    ] + [("store", m, set(m[1])) for m in siblings]
    out = []
    for component in components([vars_ for _, _, vars_ in members]):
        parts = [members[i] for i in component]
        factor_parts = [p[1] for p in parts if p[0] == "factor"]
        stores = [p[1] for p in parts if p[0] == "store"]
        if factor_parts:
            start, others = factor_parts[0], factor_parts[1:]
        else:  # a sibling no factor touches: its own content, summed
            start, others = contents(ctx, stores.pop(0)[0]), []
        stores += [(temporary_store(ctx, f), tuple(f.codes)) for f in others]
        rows, cols, slots = join(dict(start.codes), size(ctx, start), stores)
        variables = set(cols)
        lifted = [v for v in view.marginalized if v in variables]
        keys = tuple(v for v in view.keys if v in variables)
        parts_ = [store.take(sl) for store, sl in slots]
        parts_ += lift(ctx, lifted, cols, {})
        scale = None
        if start.payload is None:
            parts_ = parts_ or [ring.batch_ones(rows.size)]
            scale = start.multiplicity[rows]
        else:
            parts_.insert(0, ring.batch_take(start.payload, rows))
        support = None
        if start.support is not None:
            support = start.support[rows]
            for store, sl in slots:
                support = support * store.support[sl]
        out.append(group(ctx, cols, keys, parts_, support, scale))
    return out
