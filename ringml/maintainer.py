"""The maintainer: validates batches, runs a maintenance plan, answers queries.

A :class:`Maintainer` builds a :class:`~ringml.plan.MaintenancePlan` for its strategy -- the
views it stores and, per relation, the trigger steps an update runs (:mod:`ringml.plan`) --
and runs it with the operators of :mod:`ringml.operators`:

* ``fivm`` (default): F-IVM.  A delta goes from its leaf to the root of the view tree once,
  joining the stored sibling views and marginalizing; stored views on its path are updated.
  A relation occurring several times is propagated once per occurrence, in sequence.
* ``first_order``: classic IVM.  Only base relations are stored; each delta is joined with
  them (the flat join of the delta) and aggregated.
* ``recompute``: the query is evaluated from scratch -- flat join, then aggregate -- after
  every batch.
* ``higher_order``: DBToaster's recursive delta materialization (the viewlet transform): the
  delta view of every stored view for every relation in it is stored too, recursively; an
  update joins its delta with the (decomposed) delta views of each stored view it occurs in.

All share validation, encoding and the result interface, so they can be compared on
identical streams.  Every apply returns the change of the result it caused
(:class:`~ringml.delta.ResultDelta`), which subscribers receive too.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from . import operators as ops
from .batch import BatchPreparer, PreparedRows, UpdateBatch, as_frame
from .delta import Groups, ResultDelta, notify
from .encoding import Dictionary, key_array
from .enumeration import enumerate_nu
from .errors import BatchError, InputTypeError, SchemaError, SubscriberError
from .nu_tree import NuTree, build_nu, nu_order
from .plan import (
    MaintenancePlan,
    first_order_plan,
    fivm_plan,
    higher_order_plan,
    recompute_order,
    recompute_plan,
)
from .query import Atom, Query, fingerprint
from .rings.base import RingError
from .store import ViewStore, group_rows
from .variable_order import VariableOrder
from .view_tree import AtomLeaf, Node, ViewNode, ViewTree, has_siblings

STRATEGIES = ("fivm", "first_order", "recompute", "higher_order")
_PLANS = {"first_order": first_order_plan, "recompute": recompute_plan}


class Maintainer:
    """Keeps ``query``'s result fresh under batches of inserts, deletes and updates.

    ``updatable`` names the relations that change (default: all); the others are static and
    loaded once with :meth:`load`.  ``order`` is a :class:`VariableOrder`, its text format, a
    nested mapping, or one of ``"canonical"``, ``"free_connex"`` and ``"auto"`` (as None,
    the default: a free-connex order when the query has free variables and one exists,
    else :meth:`VariableOrder.auto`).  ``strategy`` (one of :data:`STRATEGIES`) picks how
    deltas are propagated: ``"fivm"`` (default) through the view tree of ``order``;
    ``"first_order"`` classic IVM, every base relation stored and a delta joined with all
    the others; ``"recompute"`` every base relation stored, the result recomputed on every
    batch; ``"higher_order"`` DBToaster's recursive delta views.

    ``tree="nu"`` builds ν (F-IVM §8.1) instead of τ: grouped results stay factorized over
    H/V views (linear in the database for free-connex queries) and are enumerated with
    constant delay; its default order is canonical (q-hierarchical) or free-connex.

    Deletes of tuples that are not present are rejected (each relation's tuples are counted
    by fingerprint).  ``trust_deletes=True`` skips that check for a caller that already
    made it (e.g. a SQL database feeding several views) and keeps exact derivation counts;
    ``allow_absent_deletes=True`` gives plain ring semantics (no check, no counts).

    With :attr:`keep_previous` set, the change an apply returns also holds each changed
    group's payload before it (:attr:`Groups.previous`): the row a subscriber saw, exactly
    (``now - change`` can differ from it by rounding).
    """

    #: Record the changed groups' payloads before each apply (see the class docstring).
    keep_previous: bool = False

    def __init__(
        self,
        query: Query,
        updatable: Iterable[str] | None = None,
        order: VariableOrder | str | Mapping | None = None,
        strategy: str = "fivm",
        allow_absent_deletes: bool = False,
        tree: str = "tau",
        trust_deletes: bool = False,
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
        lifted = self.ring.lifted_variables
        if strategy == "fivm":
            self.plan: MaintenancePlan = fivm_plan(self.tree, lifted)
        elif strategy == "higher_order":
            self.plan = higher_order_plan(query, lifted, self.updatable)
        else:
            self.plan = _PLANS[strategy](query, lifted)
        self._dictionaries = self._make_dictionaries()
        # with checked deletes every multiplicity is >= 0, so a key exists iff it has
        # derivations: stores count them exactly instead of trusting float payloads
        self._ctx = ops.Context(
            self.ring,
            self._dictionaries,
            frozenset(lifted),
            frozenset(self.ring.keyed_variables),
            track_support=not allow_absent_deletes,
        )
        self._deletes = (
            "unchecked" if allow_absent_deletes else "trusted" if trust_deletes else "checked"
        )
        encoded, numeric = self._column_needs()
        self._preparer = BatchPreparer(
            query,
            {key: self._dictionaries[var] for key, var in self._column_variable.items()},
            encoded,
            numeric,
            check_deletes=self._deletes == "checked",
        )
        self._loading = True
        self._journal: list = []  # additions of the batch being applied, to undo on failure
        # compensated sums where they change the result: the root, which adds up every
        # change, and every store of rings whose inner sums need it (Ring.plain_inner_sums)
        inner, root = not self.ring.plain_inner_sums, self.plan.root
        self._stores: dict[int, ViewStore] = {
            i: ViewStore(self.plan.views[i].keys, self.ring, self._journal, inner or i == root)
            for i in self.plan.stored(loading=True)
        }
        self._runs: dict[str, tuple] = {}  # per atom: its leaf store and steps' stores
        self._subscribers: list[Callable[[ResultDelta], None]] = []
        self.batches_applied = 0
        self.tuples_applied = 0

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict:
        """Everything but the resolved triggers (rebuilt on use) and the subscribers
        (callbacks of this process: subscribe again after restoring)."""
        self.query.require_checkpointable()
        state = self.__dict__.copy()
        state["_runs"] = {}
        state["_subscribers"] = []
        return state

    def adopt_state(self, other: Maintainer) -> None:
        """Take over the state of ``other`` (e.g. restored from a checkpoint like this
        maintainer), which must have this maintainer's :meth:`description`; this object
        keeps its identity, its subscribers and :attr:`keep_previous` (``other`` should not
        be used afterwards)."""
        if not isinstance(other, Maintainer):
            raise InputTypeError(f"adopt_state takes a Maintainer, got {type(other).__name__}")
        if other is self:
            return
        mine, theirs = self.description(), other.description()
        differing = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if differing:
            raise SchemaError(
                "cannot adopt the state of a maintainer of another query (differing: "
                f"{', '.join(differing)})"
            )
        own = vars(self)
        kept = {name: own[name] for name in ("_subscribers", "keep_previous") if name in own}
        own.clear()
        own.update(vars(other))
        own.pop("keep_previous", None)
        own.update(kept)

    # ------------------------------------------------------------------ updates
    def insert(self, relation: str, rows) -> ResultDelta | None:
        """Insert ``rows`` (a DataFrame or column mapping) into ``relation``."""
        return self.apply([UpdateBatch.inserts(relation, rows)])

    def delete(self, relation: str, rows) -> ResultDelta | None:
        """Delete ``rows`` from ``relation``."""
        return self.apply([UpdateBatch.deletes(relation, rows)])

    def update(self, relation: str, old_rows, new_rows) -> ResultDelta | None:
        """Replace ``old_rows`` by ``new_rows`` (a delete and an insert, applied atomically)."""
        return self.apply(
            [UpdateBatch.deletes(relation, old_rows), UpdateBatch.inserts(relation, new_rows)]
        )

    def load(self, relation: str, rows) -> ResultDelta | None:
        """Bulk-load a relation before streaming starts (static relations are loaded so)."""
        return self.load_batches([UpdateBatch.inserts(relation, rows)])

    def load_batches(self, batches: Sequence[UpdateBatch] | UpdateBatch) -> ResultDelta | None:
        """Like :meth:`apply`, static relations included, before streaming starts; the
        loading phase stays open (the first :meth:`apply` ends it)."""
        batches = _as_batches(batches)
        if not self._loading:
            names = ", ".join(sorted({repr(b.relation) for b in batches}))
            raise SchemaError(
                f"cannot load {names}: streaming has started; load static relations first"
            )
        return self._apply(batches)

    def apply(self, batches: Sequence[UpdateBatch] | UpdateBatch) -> ResultDelta | None:
        """Apply batches (any relations, any interleaving) atomically: all or none.

        Returns the change of the result (also handed to every subscriber); None only for
        a ν tree with free variables, whose result stays factorized (see :meth:`subscribe`).
        The first apply ends the loading phase, once it succeeded (a rejected one leaves
        :meth:`load` open)."""
        batches = _as_batches(batches)
        self._check_updatable([batch.relation for batch in batches])
        return self._apply_ending_load(batches)

    def _apply_ending_load(self, batches: Sequence[UpdateBatch]) -> ResultDelta | None:
        """:meth:`_apply`; an apply that succeeded ends the loading phase (one whose
        subscriber raised too: the batch was applied)."""
        try:
            delta = self._apply(batches)
        except SubscriberError:
            if self._loading:
                self._finish_loading()
            raise
        if self._loading:
            self._finish_loading()
        return delta

    def subscribe(self, callback: Callable[[ResultDelta], None]) -> Callable[[], None]:
        """Call ``callback(delta)`` after every apply that changed the result; returns a
        function that unsubscribes.  Not for ν trees with free variables: their grouped
        result is never materialized, so its change is not known without enumerating it."""
        if not self._has_result_deltas():
            raise SchemaError(
                "a ν tree keeps the grouped result factorized: its changes are not "
                "materialized; subscribe to a τ tree (tree='tau') instead"
            )
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def _rollback(self, committed: Sequence[PreparedRows], lift_state=None) -> None:
        """Undo the journaled store additions, the recorded tuples and what lifting fixed
        (``lift_state``: the ring's state before) of a rejected apply."""
        for store, record in reversed(self._journal):
            store.undo(record)
        for rows in committed:
            self._preparer.uncommit(rows)
        self.ring.restore_lift_state(lift_state)

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

    def _apply(self, batches: Sequence[UpdateBatch]) -> ResultDelta | None:
        prepared = self._prepare_all(batches)
        committed: list[PreparedRows] = []
        lift_state = self.ring.lift_state()
        before = self._root_contents() if self.plan.recompute else None
        roots: list[ops.Rows] = []
        self._journal.clear()
        root_store = self._stores.get(self.plan.root)
        previous = [] if self.keep_previous and root_store is not None else None
        if before is None and root_store is not None:
            root_store.previous = previous  # each root addition records the rows it changes
        try:
            for rows in prepared:
                self._preparer.commit(rows)
                committed.append(rows)
                if rows.size:
                    for atom in self.query.atoms_of(rows.relation):
                        self._trigger(atom, self._atom_rows(atom, rows), roots)
            if self.plan.recompute and prepared:
                self._recompute()
        except RingError as error:  # e.g. an int64 overflow deep in a view: undo everything
            self._rollback(committed, lift_state)
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
        except BaseException:  # a bug or an interrupt: no view keeps part of the batch
            self._rollback(committed, lift_state)
            raise
        finally:
            self._journal.clear()
            if root_store is not None:
                root_store.previous = None
        self.tuples_applied += sum(rows.size for rows in prepared)
        self.batches_applied += 1
        if before is not None:
            roots = [before, self._root_contents()]
            roots[0] = ops.Rows(
                before.codes, {}, self.ring.batch_neg(before.payload), None,
                None if before.support is None else -before.support,
            )  # fmt: skip
            if previous is not None:  # a group absent before was zero
                after = self.ring.batch_len(roots[1].payload)
                previous = [before.payload, self.ring.batch_zeros(after)]
        return self._publish(roots, previous)

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
        if self.ring.lifts_finite_numbers:  # feature columns hold finite numbers only
            return
        columns = self.query.relations[rows.relation]
        for atom in self.query.atoms_of(rows.relation):
            for column, variable in zip(columns, atom.variables, strict=True):
                if column not in rows.values or variable not in self._ctx.lifted - self._ctx.keyed:
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
            codes, payload = self._stores[self.plan.root].entries()
            elements = self.ring.batch_to_list(self._read(payload))
            return elements[0] if elements else self.ring.zero()
        return dict(self.enumerate())

    def enumerate(self) -> Iterator[tuple[tuple, object]]:
        """Yield ``(group values, payload)`` for every group of a grouped result."""
        if not self._has_result_deltas():  # ν: enumerated from its views with constant delay
            yield from enumerate_nu(
                self.tree,
                self._node_store,
                self._dictionaries,
                self.ring,
                self._ctx.track_support,
            )
            return
        store = self._stores[self.plan.root]
        codes, payload = store.entries()
        positions = [store.keys.index(v) for v in self.query.free]
        decoded = [
            self._dictionaries[v].decode(codes[:, p])
            for v, p in zip(self.query.free, positions, strict=True)
        ]
        for i, element in enumerate(self.ring.batch_to_list(self._read(payload))):
            yield tuple(column[i] for column in decoded), element

    def groups(self, at: np.ndarray | None = None) -> Groups:
        """The result as :class:`~ringml.delta.Groups`: every group's payload and number
        of derivations in one ring batch (a vectorized read), or, with ``at`` (group codes
        in ``query.free`` order, e.g. a delta's :attr:`~ringml.delta.Groups.codes`), the
        current payload and count of those groups (zero where a group is gone)."""
        if not self._has_result_deltas():
            raise SchemaError("a ν tree keeps the grouped result factorized: use enumerate()")
        store = self._stores[self.plan.root]
        free = tuple(self.query.free)
        order = [store.keys.index(v) for v in free]
        if at is None:
            slots = store.index.live_slots()
            codes = store.index.keys[slots][:, order] if free else np.zeros((len(slots), 0), int)
            payload = self._read(store.take(slots))
            support = store.support[slots] if self._ctx.track_support else None
            return Groups(free, codes, payload, support, self.ring, self.decode)
        at = _as_codes(at, "groups(at=...)")
        if at.ndim == 1 and len(free) == 1:
            at = at[:, None]
        if at.ndim != 2 or at.shape[1] != len(free):
            raise InputTypeError(f"groups(at=...) takes codes of shape (n, {len(free)})")
        back = np.argsort(order)  # from free order to the store's key order
        slots = store.lookup(at[:, back] if free else np.zeros((len(at), 0), np.int64))
        found = np.flatnonzero(slots >= 0)
        payload = self.ring.batch_scatter_add(
            self.ring.batch_zeros(len(at)), found, self._read(store.take(slots[found]))
        )
        support = None
        if self._ctx.track_support:
            support = np.zeros(len(at), dtype=np.int64)
            support[found] = store.support[slots[found]]
        return Groups(free, at, payload, support, self.ring, self.decode)

    def explain(self) -> str:
        """The variable order, the view tree and which views are stored, and the plan."""
        header = f"strategy: {self.strategy}; ring: {type(self.ring).__name__}"
        if self.strategy in ("first_order", "recompute"):
            header += "\nstores base relations only: " + ", ".join(self.query.relations)
        elif self.strategy == "fivm":
            header += "\n" + self.tree.explain()
        return header + "\n" + self.plan.explain()

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
            "deletes": self._deletes,
        }

    def fingerprint(self) -> str:
        """Hex SHA-256 of :meth:`description`."""
        return fingerprint(self.description())

    def view(self, name: str) -> dict[tuple, object]:
        """The content of a stored view (by name, e.g. ``V@B_R``) as ``{key values: payload}``."""
        view_id = self.plan.id_of(name)
        store = self._stores.get(view_id)
        if store is None:
            raise KeyError(f"view {name!r} is not materialized")
        codes, payload = store.entries()
        keys = self.plan.views[view_id].keys
        decoded = [self._dictionaries[v].decode(codes[:, j]) for j, v in enumerate(keys)]
        return {
            tuple(c[i] for c in decoded): p
            for i, p in enumerate(self.ring.batch_to_list(self._read(payload)))
        }

    def _read(self, payload):
        """Stored payloads as reads show them: with exact counts (checked or trusted
        deletes), without the rounding residue those counts prove zero."""
        return self.ring.batch_without_residue(payload) if self._ctx.track_support else payload

    def decode(self, variable: str, codes) -> np.ndarray:
        """The values of ``variable`` behind integer codes (e.g. category keys of payloads)."""
        if variable not in self._dictionaries:
            raise KeyError(f"unknown variable {variable!r}")
        dictionary = self._dictionaries[variable]
        codes = _as_codes(codes, f"decode({variable!r}, ...)")
        if codes.size and (codes.min() < 0 or codes.max() >= len(dictionary)):
            bad = codes[(codes < 0) | (codes >= len(dictionary))].flat[0]
            raise KeyError(
                f"variable {variable!r} has no value of code {int(bad)} (codes 0 to "
                f"{len(dictionary) - 1}; codes_of gives -1 for a value never seen)"
            )
        return dictionary.decode(codes)

    def groups_matching(self, variables: Sequence[str], values: Sequence) -> np.ndarray:
        """Codes (in ``query.free`` order) of the current groups whose free ``variables``
        take one of the rows of ``values`` (one array per variable), through a secondary
        index on the result kept across changes."""
        if not self._has_result_deltas():
            raise SchemaError("a ν tree keeps the grouped result factorized: use enumerate()")
        store = self._stores[self.plan.root]
        codes = [self._dictionaries[v].lookup(x) for v, x in zip(variables, values, strict=True)]
        probe = np.column_stack(codes) if codes else np.zeros((0, 0), dtype=np.int64)
        probe = probe[(probe >= 0).all(axis=1)]
        _, slots = store.matches(tuple(store.keys.index(v) for v in variables), probe)
        return store.index.keys[slots][:, [store.keys.index(v) for v in self.query.free]]

    def codes_of(self, variable: str, values) -> np.ndarray:
        """The codes of ``variable``'s values, -1 for values never seen (no code is
        assigned)."""
        if variable not in self._dictionaries:
            raise KeyError(f"unknown variable {variable!r}")
        values = key_array(values)
        if not values.size:
            return np.zeros(0, dtype=np.int64)
        return self._dictionaries[variable].lookup(values)

    def decode_numbers(self, variable: str, codes) -> np.ndarray:
        """The values of a numeric ``variable`` behind integer codes as one int64 array
        while every value is an integer, else float64 (each value converted once)."""
        if variable not in self._dictionaries:
            raise KeyError(f"unknown variable {variable!r}")
        codes = _as_codes(codes, f"decode_numbers({variable!r}, ...)")
        if not codes.size:  # also before the dictionary holds any value
            return np.zeros(0, dtype=np.int64)
        return self._dictionaries[variable].numeric(codes)

    def stored_entries(self) -> int:
        """Number of keys held in all stores (a proxy for memory)."""
        return sum(len(s) for s in self._stores.values())

    def _node_store(self, node: Node) -> ViewStore:
        """The store of a view tree node (ν enumeration reads them)."""
        return self._stores[self.plan.id_of(node.name)]

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
        keyed: set[str] = set(self.query.free) | self._ctx.keyed
        if self.strategy == "fivm":
            for node in self.tree.nodes():
                keyed |= set(node.keys) if isinstance(node, ViewNode) else set()
                if isinstance(node, ViewNode):
                    seen: set[str] = set()
                    for child in node.children:
                        keyed |= seen & set(child.keys)
                        seen |= set(child.keys)
                if isinstance(node, AtomLeaf) and has_siblings(node):
                    keyed |= set(node.keys)
            keyed |= {v for v in self.query.variables if len(self.query.rels(v)) > 1}
        elif self.strategy == "higher_order":  # the keys of its views; lifts read numbers
            for spec in self.plan.views:
                if not spec.is_leaf and (spec.stored or spec.stored_while_loading):
                    keyed |= set(spec.keys)
            keyed |= {v for v in self.query.variables if len(self.query.rels(v)) > 1}
        else:
            keyed |= set(self.query.variables)
        numeric_vars = self._ctx.lifted - self._ctx.keyed
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
        self._runs.clear()
        kept = set(self.plan.stored(loading=False))
        for view_id in [i for i in self._stores if i not in kept]:
            del self._stores[view_id]

    # ------------------------------------------------------------------ helpers
    def _atom_rows(self, atom: Atom, rows: PreparedRows) -> ops.Rows:
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
        support = rows.multiplicity if self._ctx.track_support else None
        return ops.Rows(codes, values, None, rows.multiplicity, support)

    # ------------------------------------------------------------------ factorized updates
    def apply_factorized(
        self, relation: str, factors: Sequence[pd.DataFrame], multiplicity: int = 1
    ) -> ResultDelta | None:
        """Apply ``δR = multiplicity · (F1 ⊗ F2 ⊗ ...)`` without expanding the product (§7).

        Each factor is a DataFrame over some of ``relation``'s columns; the factors' columns
        are disjoint and together cover the relation.  F-IVM pushes each marginalization past
        the product, so the cost follows the factors' sizes, not the product's; a
        materialized view on the path receives the product of the factors over its own keys
        only.  With absent deletes checked, the expanded tuples are still fingerprinted for
        the bookkeeping; ``allow_absent_deletes=True`` skips even that.  The product is
        expanded and applied as rows -- returning the change of the result, which the
        factorized path does not sum -- under another strategy than fivm, when there are
        subscribers (they get the change), when ``relation`` has a filter (it tests whole
        rows) and during the loading phase; else the update returns None.  A rejected
        update changes nothing, the loading phase included.
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
        if (
            isinstance(multiplicity, bool)
            or not isinstance(multiplicity, numbers.Real)
            or not float(multiplicity).is_integer()
            or multiplicity == 0
            or abs(multiplicity) >= 2**63
        ):
            raise BatchError(
                f"relation {relation!r}: multiplicity must be a non-zero integer within int64, "
                f"got {multiplicity!r}",
                relation,
                "multiplicity",
                multiplicity,
            )
        if (
            self.strategy != "fivm"
            or any(len(f) == 0 for f in factors)
            or self._subscribers  # they need the result's change, which it does not sum
            or relation in self.query.filters  # a filter tests whole rows
            or self._loading  # the loading views would need the expansion
        ):
            expanded = _cross_product(factors)[list(columns)]
            mult = np.full(len(expanded), int(multiplicity), dtype=np.int64)
            if not len(expanded):
                return None
            return self._apply_ending_load([UpdateBatch(relation, expanded, mult)])
        prepared = [self._preparer.prepare_factor(relation, f) for f in factors]
        for rows in prepared:
            self._check_lifts(rows)
        bookkeeping = None
        if self._preparer.counts is not None:
            expanded = _cross_product(factors)[list(columns)]
            bookkeeping = self._preparer.prepare(
                UpdateBatch(relation, expanded, np.full(len(expanded), int(multiplicity)))
            )
        lift_state = self.ring.lift_state()
        self._journal.clear()
        try:
            if bookkeeping is not None:
                self._preparer.commit(bookkeeping)
            for atom in self.query.atoms_of(relation):
                self._propagate_factorized(atom, prepared, int(multiplicity))
        except RingError as error:
            self._rollback([bookkeeping] if bookkeeping is not None else [], lift_state)
            raise BatchError(
                f"relation {relation!r}: the update was rejected while maintaining the views "
                f"({error}); no view changed",
                relation,
            ) from None
        except BaseException:  # a bug or an interrupt: no view keeps part of the update
            self._rollback([bookkeeping] if bookkeeping is not None else [], lift_state)
            raise
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
        leaf, leaf_store, steps = self._run_of(atom.name)
        if leaf_store is not None:
            ops.add_product(self._ctx, leaf_store, leaf.keys, factors)
        for view, _, siblings, store in steps:
            factors = ops.factorized_step(self._ctx, view, siblings, factors)
            if store is not None:
                ops.add_product(self._ctx, store, view.keys, factors)

    def _atom_rows_partial(self, atom: Atom, rows: PreparedRows) -> ops.Rows:
        """A factor's rows under the atom's variable names."""
        columns = self.query.relations[atom.relation]
        rename = dict(zip(columns, atom.variables, strict=True))
        codes = {rename[c]: a for c, a in rows.codes.items()}
        values = {rename[c]: a for c, a in rows.values.items()}
        support = rows.multiplicity.copy() if self._ctx.track_support else None
        return ops.Rows(codes, values, None, rows.multiplicity.copy(), support)

    # ------------------------------------------------------------------ plan
    def _run_of(self, atom: str) -> tuple:
        """The trigger of ``atom`` with its stores resolved: the leaf's store (or None) and
        per step its view (with the step's own marginalization), the view its delta starts
        from, sibling stores and own store (or None); steps whose delta no one keeps or
        reads are left out.  Fixed once loading is over, so worked out once (cleared when
        loading ends)."""
        run = self._runs.get(atom)
        if run is None:
            trigger = next(t for ts in self.plan.triggers.values() for t in ts if t.atom == atom)
            leaf = self.plan.views[trigger.leaf]
            steps = []
            for i, s in enumerate(trigger.steps):
                store = self._stores.get(s.view)
                read = s.view == self.plan.root or any(
                    later.child == s.view for later in trigger.steps[i + 1 :]
                )
                if store is None and not read:
                    continue
                view = self.plan.views[s.view]
                if s.marginalized is not None:
                    lifted = tuple(v for v in view.lifted if v in s.marginalized)
                    view = replace(view, marginalized=s.marginalized, lifted=lifted)
                siblings = tuple((self._stores[j], self.plan.views[j].keys) for j in s.siblings)
                steps.append((view, s.child, siblings, store))
            run = (leaf, self._stores.get(trigger.leaf), tuple(steps))
            self._runs[atom] = run
        return run

    def _trigger(self, atom: Atom, delta: ops.Rows, roots: list[ops.Rows]) -> None:
        """Run ``atom``'s trigger on a delta; the root's delta goes to ``roots``.  Each step
        starts from the delta of its child (the leaf's, or an earlier step's); a delta that
        joined nothing changes no view above it."""
        leaf, leaf_store, steps = self._run_of(atom.name)
        if leaf_store is not None:
            ops.add_grouped(self._ctx, leaf_store, leaf.keys, delta)
        deltas = {leaf.id: delta}
        for view, child, siblings, store in steps:
            source = deltas.get(child)
            if source is None:  # the child's delta joined nothing
                continue
            delta = ops.step(self._ctx, view, siblings, source)
            if ops.size(self._ctx, delta) == 0:
                continue
            deltas[view.id] = delta
            if store is not None:
                ops.add(self._ctx, store, view.keys, delta)
            if view.id == self.plan.root and not self.plan.recompute:
                roots.append(delta)

    def _recompute(self) -> None:
        """Evaluate the root from the stored leaves (the ``recompute`` strategy)."""
        root = self.plan.views[self.plan.root]
        first, others = recompute_order(self.plan, self.query.atoms)
        start = ops.contents(self._ctx, self._stores[first])
        members = [(self._stores[i], self.plan.views[i].keys) for i in others]
        result = ops.step(self._ctx, root, members, start)
        store = ViewStore(root.keys, self.ring)
        if ops.size(self._ctx, result):
            ops.add(self._ctx, store, root.keys, result)
        self._stores[self.plan.root] = store

    def _root_contents(self) -> ops.Rows:
        return ops.contents(self._ctx, self._stores[self.plan.root])

    def _has_result_deltas(self) -> bool:
        return not (isinstance(self.tree, NuTree) and self.query.free and self.strategy == "fivm")

    def _publish(self, roots: list[ops.Rows], previous: list | None) -> ResultDelta | None:
        """The root deltas of one apply summed per group, handed to the subscribers;
        ``previous``: per root delta, the root's payloads at its groups before it."""
        if not self._has_result_deltas():
            return None
        root = self.plan.views[self.plan.root]
        free = tuple(self.query.free)
        ring = self.ring
        first = None
        if not roots:
            support = np.zeros(0, dtype=np.int64) if self._ctx.track_support else None
            codes, payload = np.zeros((0, len(free)), np.int64), ring.batch_zeros(0)
        elif len(roots) == 1:  # one step's delta: already one row per group
            payload, support = roots[0].payload, roots[0].support
            if free:
                codes = np.column_stack([roots[0].codes[v] for v in free])
            else:
                codes = np.zeros((ring.batch_len(payload), 0), dtype=np.int64)
        else:
            codes, payload, support, first = self._combine(root.keys, roots)
            codes = codes[:, [root.keys.index(v) for v in free]]
        if previous is not None:  # a group's payload before its first change
            previous = ring.batch_concat(previous) if previous else ring.batch_zeros(0)
            previous = previous if first is None else ring.batch_take(previous, first)
        delta = ResultDelta(
            free, codes, payload, support, ring, self.decode, prune=True, previous=previous
        )
        if self._subscribers and delta:
            notify([(callback, delta) for callback in self._subscribers])
        return delta

    def _combine(self, keys: tuple[str, ...], roots: list[ops.Rows]):
        """Several deltas of the root, summed per key; also each key's first row."""
        ring = self.ring
        payload = ring.batch_concat([r.payload for r in roots])
        n = ring.batch_len(payload)
        if keys:
            stacked = np.concatenate([np.column_stack([r.codes[v] for v in keys]) for r in roots])
            unique, groups = group_rows(stacked)
        else:
            unique, groups = np.zeros((1 if n else 0, 0), np.int64), np.zeros(n, np.int64)
        support = None
        if all(r.support is not None for r in roots):
            support = ops.group_sum(np.concatenate([r.support for r in roots]), groups, len(unique))
        first = np.full(len(unique), n, dtype=np.int64)
        np.minimum.at(first, groups, np.arange(n, dtype=np.int64))
        return unique, ring.batch_sum_by(payload, groups, len(unique)), support, first


def _as_codes(codes, where: str) -> np.ndarray:
    """``codes`` as an int64 array; :class:`InputTypeError` for anything but integers (a
    float 1.5, a bool or the text "1" was cast to a code silently, naming another group).
    Integral floats pass (codes read back from a float column)."""
    array = np.asarray(codes)
    if not array.size or array.dtype.kind in "iu":
        return array.astype(np.int64)
    bad = np.ones(array.shape, dtype=bool)
    if array.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(array) | (array != np.round(array))
    elif array.dtype.kind == "O":
        bad = np.frompyfunc(_not_an_integer, 1, 1)(array).astype(bool)
    if bad.any():
        raise InputTypeError(
            f"{where} takes integer codes, got {array.dtype} values such as {array[bad].flat[0]!r}"
        )
    return array.astype(np.int64)


def _not_an_integer(value) -> bool:
    return not isinstance(value, numbers.Integral) or isinstance(value, bool | np.bool_)


def _cross_product(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The Cartesian product of DataFrames over disjoint columns."""
    result = frames[0].reset_index(drop=True)
    for frame in frames[1:]:
        result = result.merge(frame.reset_index(drop=True), how="cross")
    return result


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
