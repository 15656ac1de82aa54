"""The maintainer: applies batches of deltas and answers queries, under one of three strategies.

* ``fivm`` (default): F-IVM.  A delta goes from its leaf to the root of the view tree once,
  joining the materialized sibling views and marginalizing; materialized views on its path
  are updated.  A relation occurring several times is propagated once per occurrence, in
  sequence.
* ``first_order``: classic IVM.  Only base relations are stored; each delta is joined with
  them (the flat join of the delta) and aggregated.
* ``recompute``: the query is evaluated from scratch — flat join, then aggregate — after
  every batch.

All three share validation, encoding and the result interface, so they can be compared on
identical streams.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .batch import BatchPreparer, PreparedRows, UpdateBatch, as_frame
from .encoding import Dictionary
from .enumeration import enumerate_nu
from .errors import BatchError, InputTypeError, SchemaError
from .nu_tree import NuTree, build_nu, nu_order
from .query import Atom, Query, fingerprint
from .rings.base import RingError
from .store import ViewStore, group_rows
from .variable_order import VariableOrder
from .view_tree import AtomLeaf, ViewNode, ViewTree

STRATEGIES = ("fivm", "first_order", "recompute")


@dataclass
class _Rows:
    """Rows in flight during propagation: key codes, feature values, payload source."""

    codes: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    payload: object  # a ring batch aligned with the rows; None: ``multiplicity`` times one
    multiplicity: np.ndarray | None = None
    support: np.ndarray | None = None  # exact derivation counts (Remark 1), when tracked


def _group_sum(values: np.ndarray | None, groups: np.ndarray | None, n_groups: int):
    """Exact per-group sums of int64 derivation counts (None passes through)."""
    if values is None:
        return None
    if groups is None:
        return np.asarray([int(values.sum())], dtype=np.int64)
    return np.bincount(groups, weights=values, minlength=n_groups).astype(np.int64)


class Maintainer:
    """Keeps ``query``'s result fresh under batches of inserts, deletes and updates.

    ``updatable`` names the relations that change (default: all); the others are static and
    loaded once with :meth:`load`.  ``order`` is a :class:`VariableOrder`, its text format, a
    nested mapping, or one of ``"auto"`` (default), ``"canonical"``, ``"free_connex"``.
    ``tree="nu"`` builds ν (F-IVM §8.1) instead of τ: grouped results stay factorized over
    H/V views (linear in the database for free-connex queries) and are enumerated with
    constant delay; its default order is canonical (q-hierarchical) or free-connex.
    """

    def __init__(
        self,
        query: Query,
        updatable: Iterable[str] | None = None,
        order: VariableOrder | str | Mapping | None = None,
        strategy: str = "fivm",
        allow_absent_deletes: bool = False,
        tree: str = "tau",
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")
        if tree not in ("tau", "nu"):
            raise ValueError(f"unknown view tree {tree!r}; choose 'tau' or 'nu'")
        self.query = query
        self.ring = query.ring
        self.strategy = strategy
        if isinstance(updatable, str | bytes):
            raise SchemaError(
                f"updatable must be a list of relation names, not the string {updatable!r} "
                f"(write [{updatable!r}] for one relation)"
            )
        self.updatable = frozenset(query.relations if updatable is None else updatable)
        unknown = self.updatable - set(query.relations)
        if unknown:
            raise SchemaError(f"updatable relations {sorted(unknown)} are not in the query")
        nu = tree == "nu"  # ν (F-IVM §8.1): the grouped result kept factorized, enumerated
        default = order is None or (isinstance(order, str) and order == "auto")
        self.order = nu_order(query) if nu and default else _resolve_order(query, order)
        self.tree = (build_nu if nu else ViewTree.build)(query, self.order, self.updatable)
        self._keyed = self.ring.keyed_variables
        self._lifted = set(self.ring.lifted_variables)
        self._dictionaries = self._make_dictionaries()
        encoded, numeric = self._column_needs()
        self._preparer = BatchPreparer(
            query,
            {key: self._dictionaries[var] for key, var in self._column_variable.items()},
            encoded,
            numeric,
            check_deletes=not allow_absent_deletes,
        )
        # with checked deletes every multiplicity is >= 0, so a key exists iff it has
        # derivations: stores count them exactly instead of trusting float payloads
        self._track_support = not allow_absent_deletes
        self._loading = True
        self._journal: list = []  # additions of the batch being applied, to undo on failure
        self._stores: dict[int, ViewStore] = {}
        self._paths: dict = {}  # per atom its path, per (view, child) the siblings: cached
        self._base: dict[str, ViewStore] = {}
        self._root_payload = None
        if strategy == "fivm":  # while loading, every view a delta may probe is kept
            for node in self.tree.nodes():
                if isinstance(node, ViewNode) or _has_siblings(node) or node.materialized:
                    self._stores[id(node)] = ViewStore(node.keys, self.ring, self._journal)
        else:
            self._result = ViewStore(tuple(query.free), self.ring, self._journal)
        self.batches_applied = 0
        self.tuples_applied = 0

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        """Stores are keyed by node identity in memory; by node position when pickled."""
        self.query.require_checkpointable()
        state = self.__dict__.copy()
        state.pop("_paths", None)  # holds stores by reference: rebuilt on first use
        nodes = self.tree.nodes()
        state["_stores"] = {
            i: self._stores[id(node)] for i, node in enumerate(nodes) if id(node) in self._stores
        }
        return state

    def __setstate__(self, state: dict) -> None:
        stores = state.pop("_stores")
        if "_categorical" in state:  # pickled before rings declared their keyed variables
            state["_keyed"] = state.pop("_categorical")
        self.__dict__.update(state)
        self._paths = {}
        nodes = self.tree.nodes()
        self._stores = {id(nodes[i]): store for i, store in stores.items()}

    # ------------------------------------------------------------------ updates
    def insert(self, relation: str, rows) -> None:
        """Insert ``rows`` (a DataFrame or column mapping) into ``relation``."""
        self.apply([UpdateBatch.inserts(relation, rows)])

    def delete(self, relation: str, rows) -> None:
        """Delete ``rows`` from ``relation``."""
        self.apply([UpdateBatch.deletes(relation, rows)])

    def update(self, relation: str, old_rows, new_rows) -> None:
        """Replace ``old_rows`` by ``new_rows`` (a delete and an insert, applied atomically)."""
        self.apply(
            [UpdateBatch.deletes(relation, old_rows), UpdateBatch.inserts(relation, new_rows)]
        )

    def load(self, relation: str, rows) -> None:
        """Bulk-load a relation before streaming starts (static relations are loaded so)."""
        if not self._loading:
            raise SchemaError(
                f"cannot load {relation!r}: streaming has started; load static relations first"
            )
        self._apply([UpdateBatch.inserts(relation, rows)], loading=True)

    def apply(self, batches: Sequence[UpdateBatch] | UpdateBatch) -> None:
        """Apply batches (any relations, any interleaving) atomically: all or none.

        The first apply ends the loading phase, once it succeeded (a rejected one leaves
        :meth:`load` open)."""
        batches = _as_batches(batches)
        self._check_updatable([batch.relation for batch in batches])
        self._apply(batches, loading=False)
        if self._loading:
            self._finish_loading()

    def _rollback(self, committed: Sequence[PreparedRows], shifts=None) -> None:
        """Undo the journaled store additions, the recorded tuples and the shifts fixed
        (``shifts``: the ring's shifts before) of a rejected apply."""
        for store, codes, payload, support in reversed(self._journal):
            store.undo(codes, payload, support)
        for rows in committed:
            self._preparer.uncommit(rows)
        if shifts is not None:
            self.ring.reopen_shifts(shifts)

    def _check_updatable(self, relations: Iterable[str]) -> None:
        for relation in relations:
            if relation not in self.query.relations:
                raise BatchError(
                    f"unknown relation {relation!r}; the query has {sorted(self.query.relations)}",
                    relation,
                )
            if relation not in self.updatable:
                raise BatchError(
                    f"relation {relation!r} is static; declare it updatable to change it",
                    relation,
                )

    def _apply(self, batches: Sequence[UpdateBatch], loading: bool) -> None:
        prepared = self._prepare_all(batches)
        committed: list[PreparedRows] = []
        shifts = getattr(self.ring, "shifts", None)  # the rings that fix shifts on first lift
        self._journal.clear()
        try:
            for rows in prepared:
                self._preparer.commit(rows)
                committed.append(rows)
                if self.strategy == "fivm":
                    self._propagate(rows)
                elif self.strategy == "first_order":
                    self._first_order(rows)
                else:
                    for atom in self.query.atoms_of(rows.relation):
                        self._store_base(atom, self._atom_rows(atom, rows))
            if self.strategy == "recompute" and prepared:
                self._recompute()
        except RingError as error:  # e.g. an int64 overflow deep in a view: undo everything
            self._rollback(committed, shifts)
            relation = committed[-1].relation if committed else None
            column, value = committed[-1].largest_factor() if committed else (None, None)
            raise BatchError(
                f"relation {relation!r}: the batch was rejected while maintaining the views "
                f"({error}); its largest factor is column {column!r} = {value!r}; no view "
                f"changed",
                relation,
                column,
                value,
            ) from None
        finally:
            self._journal.clear()
        self.tuples_applied += sum(rows.size for rows in prepared)
        self.batches_applied += 1

    def _prepare_all(self, batches: Sequence[UpdateBatch]) -> list[PreparedRows]:
        prepared = []
        pending: dict[str, list] = {}
        for batch in batches:
            # deletes are checked against the stored tuples and the earlier batches' changes
            earlier = pending.get(batch.relation)
            rows = self._preparer.prepare(
                batch,
                (np.concatenate([e[0] for e in earlier]), np.concatenate([e[1] for e in earlier]))
                if earlier
                else None,
            )
            if rows.tuple_ids is not None:
                pending.setdefault(rows.relation, []).append((rows.tuple_ids, rows.tuple_delta))
            self._check_lifts(rows)
            prepared.append(rows)
        return prepared

    def _check_lifts(self, rows: PreparedRows) -> None:
        """Reject values the ring cannot lift (e.g. 1.5 for ℤ) before any view changes."""
        columns = self.query.relations[rows.relation]
        for atom in self.query.atoms_of(rows.relation):
            for column, variable in zip(columns, atom.variables, strict=True):
                if column not in rows.values or variable not in self._lifted - self._keyed:
                    continue
                data = rows.values[column]
                try:
                    self.ring.check_lift(variable, data)
                except RingError as error:
                    bad = next((x for x in data if not self._lifts_one(variable, x)), None)
                    raise BatchError(
                        f"relation {rows.relation!r}, column {column!r}: value {bad!r} cannot "
                        f"be lifted ({error})",
                        rows.relation,
                        column,
                        bad,
                    ) from None

    def _lifts_one(self, variable: str, value) -> bool:
        try:
            self.ring.batch_lift(variable, np.asarray([value]))
        except RingError:
            return False
        return True

    # ------------------------------------------------------------------ results
    def result(self):
        """The query result: the root payload, or ``{group tuple: payload}`` with free vars."""
        if not self.query.free:
            codes, payload = self._root_store().entries()
            elements = self.ring.batch_to_list(payload)
            return elements[0] if elements else self.ring.zero()
        return dict(self.enumerate())

    def enumerate(self) -> Iterator[tuple[tuple, object]]:
        """Yield ``(group values, payload)`` for every group of a grouped result."""
        if self.strategy == "fivm" and isinstance(self.tree, NuTree) and self.query.free:
            yield from enumerate_nu(
                self.tree,
                lambda node: self._stores[id(node)],
                self._dictionaries,
                self.ring,
                self._track_support,
            )
            return
        store = self._root_store()
        codes, payload = store.entries()
        positions = [store.keys.index(v) for v in self.query.free]
        decoded = [
            self._dictionaries[v].decode(codes[:, p])
            for v, p in zip(self.query.free, positions, strict=True)
        ]
        for i, element in enumerate(self.ring.batch_to_list(payload)):
            yield tuple(column[i] for column in decoded), element

    def explain(self) -> str:
        """The variable order, the view tree and which views are materialized."""
        header = f"strategy: {self.strategy}; ring: {type(self.ring).__name__}"
        if self.strategy != "fivm":
            return header + "\nstores base relations only: " + ", ".join(self.query.relations)
        return header + "\n" + self.tree.explain()

    def description(self) -> dict[str, Any]:
        """What is maintained and how, canonically: :meth:`Query.description` plus the
        variable order, view tree kind, strategy, updatable relations and delete checks
        (not the state); checkpoints compare it before resuming."""
        return {
            **self.query.description(),
            "order": str(self.order),
            "tree": "nu" if isinstance(self.tree, NuTree) else "tau",
            "strategy": self.strategy,
            "updatable": sorted(self.updatable),
            "deletes": "checked" if self._preparer.counts is not None else "unchecked",
        }

    def fingerprint(self) -> str:
        """Hex SHA-256 of :meth:`description`."""
        return fingerprint(self.description())

    def view(self, name: str) -> dict[tuple, object]:
        """The content of a stored view (by name, e.g. ``V@B_R``) as ``{key values: payload}``."""
        for node in self.tree.nodes():
            if node.name == name:
                store = self._stores.get(id(node))
                if store is None or not (node.materialized or self._loading):
                    raise KeyError(f"view {name!r} is not materialized")
                codes, payload = store.entries()
                decoded = [
                    self._dictionaries[v].decode(codes[:, j]) for j, v in enumerate(node.keys)
                ]
                return {
                    tuple(c[i] for c in decoded): p
                    for i, p in enumerate(self.ring.batch_to_list(payload))
                }
        raise KeyError(f"no view named {name!r}")

    def decode(self, variable: str, codes) -> np.ndarray:
        """The values of ``variable`` behind integer codes (e.g. category keys of payloads)."""
        if variable not in self._dictionaries:
            raise KeyError(f"unknown variable {variable!r}")
        return self._dictionaries[variable].decode(np.asarray(codes, dtype=np.int64))

    def stored_entries(self) -> int:
        """Number of keys held in all stores (a proxy for memory)."""
        if self.strategy == "fivm":
            return sum(len(s) for s in self._stores.values())
        return sum(len(s) for s in self._base.values()) + len(self._result)

    def _root_store(self) -> ViewStore:
        if self.strategy == "fivm":
            return self._stores[id(self.tree.root)]
        return self._result

    # ------------------------------------------------------------------ set-up
    def _make_dictionaries(self) -> dict[str, Dictionary]:
        """One dictionary per class of variables joined through relation columns."""
        parent: dict[object, object] = {}

        def find(x):
            parent.setdefault(x, x)
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        self._column_variable: dict[tuple[str, str], str] = {}
        for atom in self.query.atoms:
            for column, variable in zip(
                self.query.relations[atom.relation], atom.variables, strict=True
            ):
                parent[find(("col", atom.relation, column))] = find(("var", variable))
        classes: dict[object, Dictionary] = {}
        dictionaries: dict[str, Dictionary] = {}
        for variable in self.query.variables:
            root = find(("var", variable))
            dictionaries[variable] = classes.setdefault(root, Dictionary(variable))
        for relation, columns in self.query.relations.items():
            for column in columns:
                root = find(("col", relation, column))
                var = next((v for v in self.query.variables if find(("var", v)) == root), None)
                if var is None:  # a column no atom uses: give it its own dictionary
                    var = f"{relation}.{column}"
                    dictionaries[var] = Dictionary(var)
                self._column_variable[(relation, column)] = var
        return dictionaries

    def _column_needs(self) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        """Per relation: columns to encode and columns to read as numbers."""
        keyed: set[str] = set(self.query.free) | self._keyed
        if self.strategy == "fivm":
            for node in self.tree.nodes():
                keyed |= set(node.keys) if isinstance(node, ViewNode) else set()
                if isinstance(node, ViewNode):
                    seen: set[str] = set()
                    for child in node.children:
                        keyed |= seen & set(child.keys)
                        seen |= set(child.keys)
                if isinstance(node, AtomLeaf) and _has_siblings(node):
                    keyed |= set(node.keys)
            keyed |= {v for v in self.query.variables if len(self.query.rels(v)) > 1}
        else:
            keyed |= set(self.query.variables)
        numeric_vars = self._lifted - self._keyed
        encoded: dict[str, set[str]] = {r: set() for r in self.query.relations}
        numeric: dict[str, set[str]] = {r: set() for r in self.query.relations}
        for atom in self.query.atoms:
            for column, variable in zip(
                self.query.relations[atom.relation], atom.variables, strict=True
            ):
                if variable in keyed:
                    encoded[atom.relation].add(column)
                if variable in numeric_vars and variable not in self.query.free:
                    numeric[atom.relation].add(column)
        return encoded, numeric

    def _finish_loading(self) -> None:
        """Drop the views only the loading phase needed."""
        self._loading = False
        self._paths.clear()
        if self.strategy == "fivm":
            for node in self.tree.nodes():
                if not node.materialized:
                    self._stores.pop(id(node), None)

    # ------------------------------------------------------------------ helpers
    def _atom_rows(self, atom: Atom, rows: PreparedRows) -> _Rows:
        columns = self.query.relations[atom.relation]
        codes = {
            v: rows.codes[c]
            for c, v in zip(columns, atom.variables, strict=True)
            if c in rows.codes
        }
        values = {
            v: rows.values[c]
            for c, v in zip(columns, atom.variables, strict=True)
            if c in rows.values
        }
        support = rows.multiplicity if self._track_support else None
        return _Rows(codes, values, None, rows.multiplicity, support)

    def _size(self, rows: _Rows) -> int:
        """Number of rows in flight."""
        if rows.payload is None:
            return rows.multiplicity.shape[0]
        return self.ring.batch_len(rows.payload)

    def _payload(self, rows: _Rows):
        """The rows' payloads as a ring batch."""
        if rows.payload is None:
            n = rows.multiplicity.shape[0]
            if (rows.multiplicity == 1).all():
                return self.ring.batch_ones(n)
            return self.ring.batch_scale(self.ring.batch_ones(n), rows.multiplicity)
        return rows.payload

    def _lift_factors(
        self,
        variables: Sequence[str],
        codes: Mapping[str, np.ndarray],
        values: Mapping[str, np.ndarray],
        n: int,
    ) -> list:
        """Lifted payloads of ``variables`` for ``n`` rows (ones are skipped)."""
        lifted = [v for v in variables if v in self._lifted]
        factors = []
        continuous = [v for v in lifted if v not in self._keyed]
        columns = {}
        for v in continuous:
            columns[v] = values[v] if v in values else self._dictionaries[v].numeric(codes[v])
        many = getattr(self.ring, "batch_lift_many", None)
        if many is not None and len(lifted) > 1:  # the product of the lifts, built at once
            return [many(lifted, [columns[v] if v in columns else codes[v] for v in lifted])]
        block = getattr(self.ring, "batch_lift_block", None)
        if block is not None and len(continuous) > 1:
            factors.append(block(continuous, np.column_stack([columns[v] for v in continuous])))
        else:
            factors += [self.ring.batch_lift(v, columns[v]) for v in continuous]
        for v in lifted:
            if v in self._keyed:
                factors.append(self.ring.batch_lift(v, codes[v]))
        return factors

    # ------------------------------------------------------------------ F-IVM
    def _path(self, atom: Atom) -> tuple:
        """The leaf, its store (or None) and ``(view, its store or None)`` up to the root:
        fixed once loading is over, so worked out once (cleared when loading ends)."""
        plan = self._paths.get(atom.name)
        if plan is None:
            leaf = self.tree.leaf(atom.name)
            steps = tuple((node, self._stores.get(id(node))) for node in self.tree.path(atom.name))
            plan = (leaf, self._stores.get(id(leaf)), steps)
            self._paths[atom.name] = plan
        return plan

    def _siblings(self, node: ViewNode, child) -> tuple:
        """``(store, keys)`` of the children of ``node`` other than ``child`` (cached)."""
        key = (id(node), id(child))
        siblings = self._paths.get(key)
        if siblings is None:
            siblings = tuple((self._stores[id(c)], c.keys) for c in node.children if c is not child)
            self._paths[key] = siblings
        return siblings

    def _propagate(self, rows: PreparedRows) -> None:
        if rows.size == 0:
            return
        for atom in self.query.atoms_of(rows.relation):
            delta = self._atom_rows(atom, rows)
            leaf, leaf_store, steps = self._path(atom)
            if leaf_store is not None:
                keys = np.column_stack([delta.codes[v] for v in leaf.keys])
                unique, groups = group_rows(keys)
                leaf_store.add(
                    unique,
                    self.ring.batch_sum_by(self._payload(delta), groups, unique.shape[0]),
                    _group_sum(delta.support, groups, unique.shape[0]),
                )
            child = leaf
            for node, store in steps:
                delta = self._step(node, child, delta)
                if self._size(delta) == 0:  # joined nothing: no view above changes
                    break
                if store is not None:
                    store.add(
                        np.column_stack([delta.codes[v] for v in node.keys])
                        if node.keys
                        else np.zeros((self.ring.batch_len(delta.payload), 0), dtype=np.int64),
                        delta.payload,
                        delta.support,
                    )
                child = node

    def _join(
        self,
        cols: dict[str, np.ndarray],
        n: int,
        members: Sequence[tuple[ViewStore, tuple[str, ...]]],
        stop_empty: bool = False,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], list[tuple[ViewStore, np.ndarray]]]:
        """Join ``n`` rows (key columns ``cols``) with stored relations, one after the other.

        Returns the joined rows' index into the input rows, their key columns, and for every
        member the slots of its matching entries.  ``stop_empty``: once no row is left, return
        at once (the later members' columns and slots are then missing).
        """
        rows = np.arange(n)
        sibling_slots: list[tuple[ViewStore, np.ndarray]] = []
        for store, keys in members:
            if stop_empty and rows.size == 0:
                break
            known = [v for v in keys if v in cols]
            probe = (
                np.column_stack([cols[v] for v in known])
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
                sibling_slots = [(s, sl[selected]) for s, sl in sibling_slots]
            for j, v in enumerate(keys):
                if v not in cols:
                    cols[v] = store.index.keys[slots, j]
            sibling_slots.append((store, slots))
        return rows, cols, sibling_slots

    def _step(self, node: ViewNode, child, delta: _Rows) -> _Rows:
        """``δV = ⊕_marginalized (δchild ⊗ siblings ⊗ lifts)``, grouped by V's keys.

        A delta that joins with nothing is returned as no rows (the zero delta)."""
        n = self._size(delta)
        siblings = self._siblings(node, child)
        rows, cols, sibling_slots = self._join(dict(delta.codes), n, siblings, stop_empty=True)
        if rows.size == 0:
            return _Rows(
                {v: np.zeros(0, dtype=np.int64) for v in node.keys},
                {},
                self.ring.batch_zeros(0),
                None,
                None if delta.support is None else np.zeros(0, dtype=np.int64),
            )
        identity = rows.size == n and np.array_equal(rows, np.arange(n))
        values = {
            v: delta.values[v] if identity else delta.values[v][rows]
            for v in node.marginalized
            if v in delta.values
        }
        mult = None
        if delta.payload is None:  # leaf multiplicities fold into the first factor
            mult = delta.multiplicity if identity else delta.multiplicity[rows]
            if (mult == 1).all():  # inserts: scaling by 1 changes nothing
                mult = None
        support = None
        if delta.support is not None:
            support = delta.support if identity else delta.support[rows]
            for store, slots in sibling_slots:
                support = support * store.support[slots]
        if node.keys:
            unique, groups = group_rows(np.column_stack([cols[v] for v in node.keys]))
            n_groups = unique.shape[0]
            codes = {v: unique[:, j] for j, v in enumerate(node.keys)}
        else:
            groups, n_groups, codes = None, 1, {}
        lifted = [v for v in node.marginalized if v in self._lifted]
        fused = getattr(self.ring, "batch_lift_block_sum_by", None)
        if (
            fused is not None
            and delta.payload is None
            and not sibling_slots
            and lifted
            and self._keyed.isdisjoint(lifted)
        ):  # leaf rows lifted and summed at once: no lifted row is materialized
            columns = [
                values[v] if v in values else self._dictionaries[v].numeric(cols[v]) for v in lifted
            ]
            payload = fused(lifted, columns, groups, n_groups, mult)
        else:
            factors = [store.take(slots) for store, slots in sibling_slots]
            factors += self._lift_factors(node.marginalized, cols, values, rows.size)
            if delta.payload is None:
                if not factors:
                    factors = [self.ring.batch_ones(rows.size)]
                if mult is not None:
                    factors[0] = self.ring.batch_scale(factors[0], mult)
            else:
                factors.insert(
                    0, delta.payload if identity else self.ring.batch_take(delta.payload, rows)
                )
            if groups is None:
                payload = self.ring.batch_mul_sum(factors)
            else:
                payload = self.ring.batch_mul_sum(factors, groups, n_groups)
        support = _group_sum(support, groups, n_groups)
        return _Rows(codes, {}, payload, None, support)

    # ------------------------------------------------------------------ factorized updates
    def apply_factorized(
        self, relation: str, factors: Sequence[pd.DataFrame], multiplicity: int = 1
    ) -> None:
        """Apply ``δR = multiplicity · (F1 ⊗ F2 ⊗ ...)`` without expanding the product (§7).

        Each factor is a DataFrame over some of ``relation``'s columns; the factors' columns
        are disjoint and together cover the relation.  F-IVM pushes each marginalization past
        the product, so the cost follows the factors' sizes, not the product's; a
        materialized view on the path receives the product of the factors over its own keys
        only.  With absent deletes checked, the expanded tuples are still fingerprinted for
        the bookkeeping; ``allow_absent_deletes=True`` skips even that.
        """
        self._check_updatable([relation])
        if isinstance(factors, str | bytes | Mapping | pd.DataFrame):
            raise InputTypeError(
                f"relation {relation!r}: factors must be a list of DataFrames (or column "
                f"mappings), got {type(factors).__name__}"
            )
        factors = [as_frame(f, relation) for f in factors]
        columns = self.query.relations.get(relation, ())
        seen: list[str] = []
        for frame in factors:
            seen += list(frame.columns)
        if sorted(seen) != sorted(columns) or len(seen) != len(set(seen)):
            raise BatchError(
                f"relation {relation!r}: the factors' columns {seen} must be disjoint and cover "
                f"the relation's columns {list(columns)}",
                relation,
            )
        if int(multiplicity) != multiplicity or multiplicity == 0:
            raise BatchError(f"relation {relation!r}: multiplicity must be a non-zero integer")
        if self.strategy != "fivm" or any(len(f) == 0 for f in factors):
            expanded = _cross_product(factors)[list(columns)]
            mult = np.full(len(expanded), int(multiplicity), dtype=np.int64)
            if len(expanded):
                self._apply([UpdateBatch(relation, expanded, mult)], loading=False)
            if self._loading:
                self._finish_loading()
            return
        prepared = [self._preparer.prepare_factor(relation, f) for f in factors]
        for rows in prepared:
            self._check_lifts(rows)
        bookkeeping = None
        if self._preparer.counts is not None:
            expanded = _cross_product(factors)[list(columns)]
            bookkeeping = self._preparer.prepare(
                UpdateBatch(relation, expanded, np.full(len(expanded), int(multiplicity)))
            )
        if self._loading:  # validated: loading ends (its views would get the expansion)
            self._finish_loading()
        shifts = getattr(self.ring, "shifts", None)
        self._journal.clear()
        try:
            if bookkeeping is not None:
                self._preparer.commit(bookkeeping)
            for atom in self.query.atoms_of(relation):
                self._propagate_factorized(atom, prepared, int(multiplicity))
        except RingError as error:
            self._rollback([bookkeeping] if bookkeeping is not None else [], shifts)
            raise BatchError(
                f"relation {relation!r}: the update was rejected while maintaining the views "
                f"({error}); no view changed",
                relation,
            ) from None
        finally:
            self._journal.clear()
        self.tuples_applied += int(np.prod([len(f) for f in factors]))
        self.batches_applied += 1

    def _propagate_factorized(
        self, atom: Atom, prepared: Sequence[PreparedRows], multiplicity: int
    ) -> None:
        factors = []
        for i, rows in enumerate(prepared):
            f = self._atom_rows_partial(atom, rows)
            if i == 0:
                f.multiplicity = f.multiplicity * multiplicity
                if f.support is not None:
                    f.support = f.support * multiplicity
            factors.append(f)
        leaf = self.tree.leaf(atom.name)
        if id(leaf) in self._stores:
            self._add_product(self._stores[id(leaf)], leaf.keys, factors)
        child = leaf
        for node in self.tree.path(atom.name):
            factors = self._factorized_step(node, child, factors)
            store = self._stores.get(id(node))
            if store is not None:
                self._add_product(store, node.keys, factors)
            child = node

    def _atom_rows_partial(self, atom: Atom, rows: PreparedRows) -> _Rows:
        """A factor's rows under the atom's variable names."""
        columns = self.query.relations[atom.relation]
        rename = dict(zip(columns, atom.variables, strict=True))
        codes = {rename[c]: a for c, a in rows.codes.items()}
        values = {rename[c]: a for c, a in rows.values.items()}
        support = rows.multiplicity.copy() if self._track_support else None
        return _Rows(codes, values, None, rows.multiplicity.copy(), support)

    def _factorized_step(self, node: ViewNode, child, factors: list[_Rows]) -> list[_Rows]:
        """``δV = ⊕_M (F1 ⊗ ... ⊗ siblings ⊗ lifts)`` with ⊕ pushed into each component."""
        marginalized = set(node.marginalized)
        siblings = [(self._stores[id(c)], c.keys) for c in node.children if c is not child]
        sibling_vars = set().union(*(set(k) for _, k in siblings)) if siblings else set()
        # 1. sum out, inside a factor, the marginalized variables no one else has
        local_factors = []
        for f in factors:
            variables = set(f.codes) | set(f.values)
            local = [v for v in variables if v in marginalized and v not in sibling_vars]
            if local:
                keep = tuple(v for v in f.codes if v not in local)
                f = self._aggregate_rows(f, local, keep)
            local_factors.append(f)
        # 2. connected components of factors and siblings over shared variables
        members: list[tuple[str, object, set[str]]] = [
            ("factor", f, set(f.codes)) for f in local_factors
        ] + [("store", m, set(m[1])) for m in siblings]
        components = _components([vars_ for _, _, vars_ in members])
        out = []
        for component in components:
            parts = [members[i] for i in component]
            factor_parts = [p[1] for p in parts if p[0] == "factor"]
            stores = [p[1] for p in parts if p[0] == "store"]
            if factor_parts:
                start, others = factor_parts[0], factor_parts[1:]
            else:  # a sibling no factor touches: its own content, summed
                store, keys = stores.pop(0)
                codes, payload = store.entries()
                support = store.support[store.index.live_slots()]
                start = _Rows(
                    {v: codes[:, j] for j, v in enumerate(keys)},
                    {},
                    payload,
                    None,
                    support if self._track_support else None,
                )
                others = []
            stores += [(self._temporary_store(f), tuple(f.codes)) for f in others]
            n = self._size(start)
            rows, cols, slots = self._join(dict(start.codes), n, stores)
            variables = set(cols)
            lifted = [v for v in node.marginalized if v in variables]
            keys = tuple(v for v in node.keys if v in variables)
            joined = _Rows(
                cols,
                {},
                None if start.payload is None else self.ring.batch_take(start.payload, rows),
                None,
                None,
            )
            factors_ = [store.take(sl) for store, sl in slots]
            factors_ += self._lift_factors(lifted, cols, {}, rows.size)
            if start.payload is None:
                if not factors_:
                    factors_ = [self.ring.batch_ones(rows.size)]
                factors_[0] = self.ring.batch_scale(factors_[0], start.multiplicity[rows])
            else:
                factors_.insert(0, joined.payload)
            support = None
            if start.support is not None:
                support = start.support[rows]
                for store, sl in slots:
                    support = support * store.support[sl]
            out.append(self._group(cols, keys, factors_, support))
        return out

    def _aggregate_rows(self, f: _Rows, summed: Sequence[str], keep: tuple[str, ...]) -> _Rows:
        """Lift ``summed`` variables of a factor and sum them out, grouping by ``keep``."""
        n = self._size(f)
        lifts = self._lift_factors(summed, f.codes, f.values, n)
        if f.payload is None:
            lifts = lifts or [self.ring.batch_ones(n)]
            lifts[0] = self.ring.batch_scale(lifts[0], f.multiplicity)
        else:
            lifts.insert(0, f.payload)
        return self._group({v: f.codes[v] for v in keep}, keep, lifts, f.support)

    def _group(self, cols, keys: tuple[str, ...], factors: list, support) -> _Rows:
        """``⊕`` of the product of ``factors`` grouped by ``keys``."""
        if keys:
            unique, groups = group_rows(np.column_stack([cols[v] for v in keys]))
            payload = self.ring.batch_mul_sum(factors, groups, unique.shape[0])
            return _Rows(
                {v: unique[:, j] for j, v in enumerate(keys)},
                {},
                payload,
                None,
                _group_sum(support, groups, unique.shape[0]),
            )
        return _Rows({}, {}, self.ring.batch_mul_sum(factors), None, _group_sum(support, None, 1))

    def _temporary_store(self, f: _Rows) -> ViewStore:
        keys = tuple(f.codes)
        store = ViewStore(keys, self.ring)
        if keys:
            unique, groups = group_rows(np.column_stack([f.codes[v] for v in keys]))
        else:
            unique = np.zeros((1, 0), dtype=np.int64)
            groups = np.zeros(self.ring.batch_len(self._payload(f)), dtype=np.int64)
        store.add(
            unique,
            self.ring.batch_sum_by(self._payload(f), groups, unique.shape[0]),
            _group_sum(f.support, groups, unique.shape[0]),
        )
        return store

    def _add_product(self, store: ViewStore, keys: tuple[str, ...], factors: list[_Rows]) -> None:
        """Add the product of factors to a materialized view (expanded over its keys only)."""
        sizes = [self._size(f) for f in factors]
        total = int(np.prod(sizes)) if sizes else 0
        if total == 0:
            return
        index = np.indices(sizes).reshape(len(sizes), -1)
        payload = None
        support = None
        cols: dict[str, np.ndarray] = {}
        for f, idx in zip(factors, index, strict=True):
            p = self.ring.batch_take(self._payload(f), idx)
            payload = p if payload is None else self.ring.batch_mul(payload, p)
            if f.support is not None:
                support = f.support[idx] if support is None else support * f.support[idx]
            cols.update({v: c[idx] for v, c in f.codes.items()})
        if keys:
            unique, groups = group_rows(np.column_stack([cols[v] for v in keys]))
        else:
            unique, groups = np.zeros((1, 0), dtype=np.int64), np.zeros(total, dtype=np.int64)
        store.add(
            unique,
            self.ring.batch_sum_by(payload, groups, unique.shape[0]),
            _group_sum(support, groups, unique.shape[0]),
        )

    # ------------------------------------------------------------------ classic IVM
    def _base_store(self, atom: Atom) -> ViewStore:
        if atom.name not in self._base:
            self._base[atom.name] = ViewStore(atom.variables, self.ring, self._journal)
        return self._base[atom.name]

    def _flat_join(
        self,
        start: _Rows,
        start_atom: Atom,
        others: Sequence[Atom],
        stores: Mapping[str, ViewStore],
    ) -> tuple[dict[str, np.ndarray], list, np.ndarray | None]:
        """Join rows with base relations, tuple by tuple (no aggregation pushed past joins).

        Returns the joined rows' key columns, payload factors and derivation counts.
        """
        payload = self._payload(start)
        ordered: list[Atom] = []
        bound_vars = set(start.codes)
        remaining = list(others)
        while remaining:  # join atoms connected to what is joined so far first
            atom = next((a for a in remaining if set(a.variables) & bound_vars), remaining[0])
            remaining.remove(atom)
            ordered.append(atom)
            bound_vars |= set(atom.variables)
        members = [(stores[a.name], a.variables) for a in ordered]
        rows, cols, taken = self._join(dict(start.codes), self.ring.batch_len(payload), members)
        factors = [self.ring.batch_take(payload, rows)]
        factors += [s.take(sl) for s, sl in taken]
        support = None
        if start.support is not None:
            support = start.support[rows]
            for s, sl in taken:
                support = support * s.support[sl]
        return cols, factors, support

    def _aggregate_flat(
        self, cols: dict[str, np.ndarray], factors: list, support: np.ndarray | None
    ) -> tuple[np.ndarray, object, np.ndarray | None]:
        """Lift the bound variables of joined rows and sum them by group."""
        n = self.ring.batch_len(factors[0])
        factors = factors + self._lift_factors(self.query.bound, cols, {}, n)
        if self.query.free:
            unique, groups = group_rows(np.column_stack([cols[v] for v in self.query.free]))
            payload = self.ring.batch_mul_sum(factors, groups, unique.shape[0])
            return unique, payload, _group_sum(support, groups, unique.shape[0])
        payload = self.ring.batch_mul_sum(factors)
        return np.zeros((1, 0), dtype=np.int64), payload, _group_sum(support, None, 1)

    def _first_order(self, rows: PreparedRows) -> None:
        if rows.size == 0:
            return
        for atom in self.query.atoms_of(rows.relation):
            delta = self._atom_rows(atom, rows)
            others = [a for a in self.query.atoms if a.name != atom.name]
            stores = {a.name: self._base_store(a) for a in others}
            cols, factors, support = self._flat_join(delta, atom, others, stores)
            if self.ring.batch_len(factors[0]):
                self._result.add(*self._aggregate_flat(cols, factors, support))
            self._store_base(atom, delta)

    def _store_base(self, atom: Atom, delta: _Rows) -> None:
        """Apply a delta to the stored base relation of ``atom``."""
        keys = np.column_stack([delta.codes[v] for v in atom.variables])
        unique, groups = group_rows(keys)
        payload = self.ring.batch_sum_by(self._payload(delta), groups, unique.shape[0])
        self._base_store(atom).add(
            unique, payload, _group_sum(delta.support, groups, unique.shape[0])
        )

    def _recompute(self) -> None:
        """Evaluate the query from scratch over the current base relations."""
        stores = {atom.name: self._base_store(atom) for atom in self.query.atoms}
        first, *others = self.query.atoms
        codes, payload = stores[first.name].entries()
        support = stores[first.name].support[stores[first.name].index.live_slots()]
        start = _Rows(
            {v: codes[:, j] for j, v in enumerate(first.variables)},
            {},
            payload,
            None,
            support if self._track_support else None,
        )
        cols, factors, joined_support = self._flat_join(start, first, others, stores)
        result = ViewStore(tuple(self.query.free), self.ring)
        if self.ring.batch_len(factors[0]):
            result.add(*self._aggregate_flat(cols, factors, joined_support))
        self._result = result


def _components(variable_sets: Sequence[set[str]]) -> list[list[int]]:
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


def _cross_product(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The Cartesian product of DataFrames over disjoint columns."""
    result = frames[0].reset_index(drop=True)
    for frame in frames[1:]:
        result = result.merge(frame.reset_index(drop=True), how="cross")
    return result


def _has_siblings(node: ViewNode | AtomLeaf) -> bool:
    return node.parent is not None and len(node.parent.children) > 1


def _as_batches(batches) -> list[UpdateBatch]:
    """``apply``'s argument as a list of batches; :class:`InputTypeError` for anything else."""
    if isinstance(batches, UpdateBatch):
        return [batches]
    expected = (
        "apply takes an UpdateBatch or a list of them (rows go through "
        "insert(relation, rows), delete(...) or UpdateBatch.inserts(relation, rows))"
    )
    if isinstance(batches, str | bytes | Mapping | pd.DataFrame) or not isinstance(
        batches, Iterable
    ):
        raise InputTypeError(f"{expected}; got {type(batches).__name__}")
    batches = list(batches)
    for i, batch in enumerate(batches):
        if not isinstance(batch, UpdateBatch):
            raise InputTypeError(f"{expected}; item {i} is a {type(batch).__name__}")
    return batches


_ORDERS = (
    "a VariableOrder, its text format, a nested mapping, a list, 'auto', 'canonical' or "
    "'free_connex'"
)


def _resolve_order(query: Query, order) -> VariableOrder:
    if order is None or order == "auto":
        if query.free:
            try:
                return VariableOrder.free_connex(query)
            except SchemaError:
                pass
        return VariableOrder.auto(query)
    if isinstance(order, VariableOrder):
        order.validate(query)
        return order
    if order == "canonical":
        return VariableOrder.canonical(query)
    if order == "free_connex":
        return VariableOrder.free_connex(query)
    if isinstance(order, str):
        parsed = VariableOrder.parse(order, query)
    elif isinstance(order, Mapping | list | tuple):
        parsed = VariableOrder.from_nested(order)
    else:
        raise InputTypeError(f"order must be {_ORDERS}; got {type(order).__name__} {order!r}")
    parsed.validate(query)
    return parsed


def to_frame(
    result: Mapping[tuple, object], free: Sequence[str], value=lambda p: p
) -> pd.DataFrame:
    """A grouped result as a DataFrame with one column per free variable and ``payload``."""
    rows = [(*key, value(p)) for key, p in result.items()]
    return pd.DataFrame(rows, columns=[*free, "payload"])
