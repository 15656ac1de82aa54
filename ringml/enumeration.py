"""Constant-delay enumeration of a grouped result kept factorized by a ν tree (F-IVM §8.1).

The free variables ``X_1..X_n`` are taken top-down (pre-order of the free-top variable
order).  The values of ``X_j`` given the already fixed ancestors come from the view ν chose
for it (``H^{@X_j}`` if X_j has two or more children, else its child's view) through the
view's secondary index on the variables it shares with the fixed prefix (Remark 2); the
enumeration backtracks over them.  Every value found extends to at least one result tuple,
because a view entry exists only while it has derivations below it (Remark 1: existence is
the exact derivation count ``ViewStore.support``, never a payload test), and the subtrees of
a fixed variable are independent.  The payload of a tuple is the product of the payloads of
the lowest all-free views at the tuple's projections (the payload function, Fig. 11).

The last variable is handled for all its values at once (one index probe, one batched ring
product), so the work per output tuple is a constant number of lookups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import reduce

import numpy as np

from .encoding import Dictionary
from .nu_tree import NuTree
from .rings.base import Ring
from .store import ViewStore
from .view_tree import Node


@dataclass
class _Level:
    """How to enumerate one free variable."""

    variable: str
    store: ViewStore
    column: int  # position of the variable in the view's keys
    fixed_columns: tuple[int, ...]  # positions of the already fixed variables in the keys
    fixed_levels: list[int]  # ... and the levels that fixed them
    project: bool  # the view has keys below the variable: distinct values are needed
    dictionary: Dictionary


def enumerate_nu(
    tree: NuTree,
    store_of: Callable[[Node], ViewStore],
    dictionaries: Mapping[str, Dictionary],
    ring: Ring,
    check_support: bool = True,
) -> Iterator[tuple[tuple, object]]:
    """Yield ``(decoded free values in query.free order, payload)`` for every result tuple.

    ``store_of`` gives the store of a materialized node; ``check_support``: stores track exact
    derivation counts (entries exist iff their count is non-zero; payloads are read without
    the residue exact counts prove zero, :meth:`~ringml.rings.base.Ring.batch_without_residue`).
    """
    query = tree.query
    variables = list(tree.enumeration)
    if not variables:
        return
    level_of = {v: j for j, v in enumerate(variables)}
    levels = []
    for j, x in enumerate(variables):
        node = tree.enumeration[x]
        fixed = [v for v in node.keys if v in level_of and level_of[v] < j]
        levels.append(
            _Level(
                x,
                store_of(node),
                node.keys.index(x),
                tuple(node.keys.index(v) for v in fixed),
                [level_of[v] for v in fixed],
                any(v != x and v not in fixed for v in node.keys),
                dictionaries[x],
            )
        )
    terminals = [(store_of(n), [level_of[v] for v in n.keys]) for n in tree.payload_views]
    output = [level_of[v] for v in query.free]
    last = len(levels) - 1
    codes = np.zeros(len(levels), dtype=np.int64)  # the fixed prefix, by level
    values: list[object] = [None] * len(levels)

    def candidates(level: _Level) -> np.ndarray:
        store = level.store
        if level.fixed_columns:
            probe = codes[level.fixed_levels][None, :]
            _, slots = store.matches(level.fixed_columns, probe)
        else:
            slots = store.index.live_slots()
        if check_support:
            slots = slots[store.support[slots] != 0]
        found = store.index.keys[slots, level.column]
        return np.unique(found) if level.project else found

    def emit(found: np.ndarray) -> Iterator[tuple[tuple, object]]:
        n = found.size
        factors = []
        keep = np.ones(n, dtype=bool)
        for store, key_levels in terminals:
            probe = np.empty((n, len(key_levels)), dtype=np.int64)
            for k, j in enumerate(key_levels):
                probe[:, k] = found if j == last else codes[j]
            slots = store.lookup(probe)
            keep &= slots >= 0
            factors.append((store, slots))
        if check_support and not keep.all():
            raise RuntimeError("ν views out of step: a payload view misses an enumerated key")
        if not keep.all():  # untracked counts: a view dropped a key whose payload is zero
            found = found[keep]
            factors = [(store, slots[keep]) for store, slots in factors]
        product = reduce(ring.batch_mul, [store.take(slots) for store, slots in factors])
        payloads = ring.batch_to_list(
            ring.batch_without_residue(product) if check_support else product
        )
        decoded = levels[last].dictionary.decode(found)
        for i, payload in enumerate(payloads):
            values[last] = decoded[i]
            yield tuple(values[j] for j in output), payload

    def walk(j: int) -> Iterator[tuple[tuple, object]]:
        found = candidates(levels[j])
        if found.size == 0:
            return
        if j == last:
            yield from emit(found)
            return
        decoded = levels[j].dictionary.decode(found)
        for code, value in zip(found.tolist(), decoded, strict=True):
            codes[j] = code
            values[j] = value
            yield from walk(j + 1)

    yield from walk(0)
