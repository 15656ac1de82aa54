"""Maintenance plans: what a maintainer stores and what every update runs, as data.

A :class:`MaintenancePlan` is frozen and inspectable.  It lists the views (stable integer
ids in pre-order, keys, marginalized and lifted variables, children, which ones are stored)
and, per base relation, the *triggers* an update of it fires: one per occurrence of the
relation (an atom), each an ordered list of steps ``δview = ⊕ (δchild ⊗ siblings ⊗ lifts)``
naming the sibling views the delta joins.  Strategies are plan builders:

* :func:`fivm_plan` -- F-IVM: the views of a view tree (τ or ν), a delta travels from its
  leaf to the root, joining the stored siblings on its path;
* :func:`first_order_plan` -- classic first-order IVM: the base relations are stored, and a
  delta is joined with all of them (connected ones first) and aggregated into the result;
* :func:`recompute_plan` -- the base relations are stored and the result is evaluated from
  scratch after every batch;
* :func:`higher_order_plan` -- DBToaster's higher-order IVM (the viewlet transform): for every
  atom R of a stored view V the delta view ∂V/∂R (the rest of V's join, aggregated to the
  variables it shares with R or keeps) is stored too, split into connected pieces, and
  recursively the delta views those need; an update of R joins δR with the pieces of ∂V/∂R,
  for every stored V that R occurs in.

The maintainer validates batches and runs the triggers with :mod:`ringml.operators`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import SchemaError
from .query import Query
from .view_tree import ViewNode, ViewTree, has_siblings


@dataclass(frozen=True)
class ViewSpec:
    """One view (or an atom's leaf): ``V[keys] = ⊕_{marginalized} ⊗ children``."""

    id: int
    name: str
    keys: tuple[str, ...]
    marginalized: tuple[str, ...] = ()
    lifted: tuple[str, ...] = ()  # the marginalized variables the ring lifts
    children: tuple[int, ...] = ()
    atom: str | None = None  # the atom of a leaf
    stored: bool = False  # materialized after loading
    stored_while_loading: bool = False

    @property
    def is_leaf(self) -> bool:
        return self.atom is not None


@dataclass(frozen=True)
class Step:
    """``δview = ⊕_{marginalized} (δchild ⊗ siblings ⊗ lifts)``, joining ``siblings`` in
    order; the result is added to the view's store when ``stored``.

    ``marginalized``, when given, are the variables this step sums out (and lifts) instead of
    the view's own: a higher-order view is summed from the deltas of several atoms, each
    bringing a different part of what the view marginalizes."""

    view: int
    child: int
    siblings: tuple[int, ...]
    stored: bool
    marginalized: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Trigger:
    """What an update of one atom runs: add it to the leaf's store, then the steps."""

    atom: str
    leaf: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class MaintenancePlan:
    """Views, per-relation triggers and how the result is read."""

    strategy: str
    views: tuple[ViewSpec, ...]
    triggers: Mapping[str, tuple[Trigger, ...]]
    root: int
    recompute: bool = False  # evaluate the root from the stored leaves after every batch

    def view(self, view_id: int) -> ViewSpec:
        return self.views[view_id]

    def id_of(self, name: str) -> int:
        """The id of the view or leaf called ``name``."""
        for spec in self.views:
            if spec.name == name:
                return spec.id
        raise KeyError(f"no view named {name!r}")

    def stored(self, loading: bool) -> list[int]:
        """Ids of the views kept in stores (while loading, also those only loading needs)."""
        return [v.id for v in self.views if v.stored or (loading and v.stored_while_loading)]

    def explain(self) -> str:
        """The triggers, step by step, naming the views they join and store into."""
        names = [v.name for v in self.views]
        lines = [f"maintenance plan ({self.strategy}):"]
        if self.strategy == "higher_order":
            lines.append("  views:")
            for v in self.views:
                if v.is_leaf:
                    continue
                atoms = " ⊗ ".join(names[c] for c in v.children) or "1"
                summed = f"⊕_{{{', '.join(v.marginalized)}}} " if v.marginalized else ""
                kept = " (stored)" if v.stored else " (while loading)"
                lines.append(f"    {v.name}[{', '.join(v.keys)}] = {summed}{atoms}{kept}")
        for relation, triggers in self.triggers.items():
            for trigger in triggers:
                leaf = self.views[trigger.leaf]
                head = f"  on {relation}"
                if trigger.atom != relation:
                    head += f" as {trigger.atom}"
                stored = " (stored)" if leaf.stored else ""
                lines.append(f"{head}: δ{leaf.name}{stored}")
                for step in trigger.steps:
                    view = self.views[step.view]
                    joined = " ⊗ ".join(
                        [f"δ{names[step.child]}"] + [names[s] for s in step.siblings]
                    )
                    marginalized = (
                        view.marginalized if step.marginalized is None else step.marginalized
                    )
                    summed = f"⊕_{{{', '.join(marginalized)}}} " if marginalized else ""
                    into = " -> stored" if step.stored else ""
                    lines.append(
                        f"    δ{view.name}[{', '.join(view.keys)}] = {summed}{joined}{into}"
                    )
        if self.recompute:
            lines.append(
                f"  after every batch: {names[self.root]} evaluated from the stored leaves"
            )
        return "\n".join(lines)


# ------------------------------------------------------------------------------ builders
def fivm_plan(tree: ViewTree, lifted: Iterable[str]) -> MaintenancePlan:
    """F-IVM over a view tree: ids in pre-order; leaves stored where the tree says."""
    lifted = frozenset(lifted)
    nodes = tree.nodes()
    ids = {id(node): i for i, node in enumerate(nodes)}
    views = []
    for i, node in enumerate(nodes):
        keeps = isinstance(node, ViewNode) or has_siblings(node) or node.materialized
        if isinstance(node, ViewNode):
            spec = ViewSpec(
                i,
                node.name,
                node.keys,
                node.marginalized,
                tuple(v for v in node.marginalized if v in lifted),
                tuple(ids[id(c)] for c in node.children),
                stored=node.materialized,
                stored_while_loading=keeps,
            )
        else:
            spec = ViewSpec(
                i, node.name, node.keys, atom=node.atom.name, stored=node.materialized,
                stored_while_loading=keeps,
            )  # fmt: skip
        views.append(spec)
    triggers: dict[str, list[Trigger]] = {}
    for atom in tree.query.atoms:
        leaf = tree.leaf(atom.name)
        steps, child = [], leaf
        for node in tree.path(atom.name):
            siblings = tuple(ids[id(c)] for c in node.children if c is not child)
            steps.append(Step(ids[id(node)], ids[id(child)], siblings, node.materialized))
            child = node
        triggers.setdefault(atom.relation, []).append(
            Trigger(atom.name, ids[id(leaf)], tuple(steps))
        )
    return MaintenancePlan(
        "fivm", tuple(views), {r: tuple(t) for r, t in triggers.items()}, ids[id(tree.root)]
    )


def first_order_plan(query: Query, lifted: Iterable[str]) -> MaintenancePlan:
    """Classic IVM: every atom's base relation is stored; a delta joins all the others."""
    return _flat_plan("first_order", query, lifted, recompute=False)


def recompute_plan(query: Query, lifted: Iterable[str]) -> MaintenancePlan:
    """Re-evaluation: the base relations are stored, the result is recomputed every batch."""
    return _flat_plan("recompute", query, lifted, recompute=True)


def _flat_plan(strategy: str, query: Query, lifted: Iterable[str], recompute: bool):
    """One root view ``V[free] = ⊕_{bound} ⊗ atoms`` over stored leaves (ids 1..k)."""
    lifted = frozenset(lifted)
    atoms = list(query.atoms)
    root = ViewSpec(
        0,
        "V@result",
        tuple(query.free),
        tuple(query.bound),
        tuple(v for v in query.bound if v in lifted),
        tuple(range(1, len(atoms) + 1)),
        stored=True,
        stored_while_loading=True,
    )
    leaves = [
        ViewSpec(i, a.name, a.variables, atom=a.name, stored=True, stored_while_loading=True)
        for i, a in enumerate(atoms, start=1)
    ]
    triggers: dict[str, list[Trigger]] = {}
    for i, atom in enumerate(atoms, start=1):
        steps = () if recompute else (Step(0, i, _connected_order(atoms, i), True),)
        triggers.setdefault(atom.relation, []).append(Trigger(atom.name, i, steps))
    return MaintenancePlan(
        strategy, (root, *leaves), {r: tuple(t) for r, t in triggers.items()}, 0, recompute
    )


def _connected_order(atoms, start: int) -> tuple[int, ...]:
    """The other atoms' ids (1-based), each next one sharing a variable with those joined
    so far when one does (a Cartesian product only where the query has one)."""
    bound = set(atoms[start - 1].variables)
    remaining = [i for i in range(1, len(atoms) + 1) if i != start]
    order = []
    while remaining:
        nxt = next((i for i in remaining if bound & set(atoms[i - 1].variables)), remaining[0])
        remaining.remove(nxt)
        order.append(nxt)
        bound |= set(atoms[nxt - 1].variables)
    return tuple(order)


#: the most views :func:`higher_order_plan` builds (a join of k atoms can need ~2^k)
MAX_HIGHER_ORDER_VIEWS = 1024


def higher_order_plan(
    query: Query, lifted: Iterable[str], updatable: Iterable[str] | None = None
) -> MaintenancePlan:
    """DBToaster's recursive delta materialization (the viewlet transform, DBToaster §4-5).

    A view is ``V[K] = ⊕_{vars(A) ∖ K} ⊗_{a ∈ A} a`` over a set A of atoms.  Its delta for
    an update of atom R is ``⊕_{vars(R) ∖ K} δR ⊗ ∂V/∂R`` with ``∂V/∂R = ⊕ ⊗_{A ∖ R}`` keyed
    by the variables of ``A ∖ R`` in K or in R; ∂V/∂R is split into the pieces its atoms
    form when joined over the variables it sums out (DBToaster's rule 1: δR binds R's
    variables, so pieces that met only there decompose), and each piece is a view of its
    own, deduplicated by atoms and keys (``Δ_R Δ_S Q = Δ_S Δ_R Q``).  A delta over no atoms
    is the constant 1 (no view: δR is lifted and summed alone).  The root is stored, and
    recursively every piece a stored view's delta for an updatable relation needs; the
    pieces only static relations' deltas need are kept while loading only.

    Input variables (DBToaster §3.3, a delta variable nothing range-restricts) cannot arise:
    the query is a natural join, so every delta view is a join-aggregate of stored relations
    over their own variables, finitely supported.  Conditions across relations (``a.price >
    b.price``, correlated subqueries) reach the engine as join queries grouped by the
    columns they compare (the SQL layer's hidden keys), so a delta view is kept
    pre-aggregated on those columns and the condition is evaluated when the result is read:
    DBToaster's rule 3 (partial materialization) without an input variable in any view.
    """
    lifted = frozenset(lifted)
    atoms = list(query.atoms)
    updatable = frozenset(query.relations if updatable is None else updatable)
    all_vars = query.variables
    order = {v: i for i, v in enumerate(all_vars)}
    atom_vars = {a.name: set(a.variables) for a in atoms}
    leaf_id = {a.name: i for i, a in enumerate(atoms, start=1)}
    # views: (atoms in query order, keys) -> id; ids 0 (root), 1..k leaves, then in creation
    defs: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
        (tuple(a.name for a in atoms), tuple(query.free))
    ]
    index = {(frozenset(defs[0][0]), frozenset(defs[0][1])): 0}
    names = ["V@result"]
    steps: dict[str, list[Step]] = {a.name: [] for a in atoms}
    needs: dict[int, dict[str, tuple[int, ...]]] = {}  # view -> atom -> piece ids

    def view_id(members: tuple[str, ...], keys: tuple[str, ...]) -> int:
        key = (frozenset(members), frozenset(keys))
        if key not in index:
            index[key] = len(defs)
            defs.append((members, keys))
            names.append(f"M{len(defs) - 1}@{'_'.join(members)}")
        return index[key]

    work = deque([0])
    while work:
        if len(defs) > MAX_HIGHER_ORDER_VIEWS:
            raise SchemaError(
                f"higher_order would store more than {MAX_HIGHER_ORDER_VIEWS} delta views for "
                f"this join of {len(atoms)} atoms ({[a.name for a in atoms]}); maintain it "
                f"with strategy='fivm' (one view tree) or 'first_order'"
            )
        vid = work.popleft()
        members, keys = defs[vid]
        variables = set().union(*(atom_vars[m] for m in members))
        summed = variables - set(keys)
        needs[vid] = {}
        for a in members:
            rest = [m for m in members if m != a]
            rest_vars = set().union(*(atom_vars[m] for m in rest)) if rest else set()
            rest_keys = rest_vars & (set(keys) | atom_vars[a])
            pieces = _pieces(rest, atom_vars, rest_vars - rest_keys)
            ids = []
            for piece in pieces:
                piece_vars = set().union(*(atom_vars[m] for m in piece))
                piece_keys = tuple(sorted(piece_vars & rest_keys, key=order.__getitem__))
                new = (frozenset(piece), frozenset(piece_keys)) not in index
                ids.append(view_id(tuple(piece), piece_keys))
                if new:
                    work.append(ids[-1])
            needs[vid][a] = _join_order(ids, atom_vars[a], defs)
            mine = summed & atom_vars[a]
            marginalized = tuple(v for v in all_vars if v in mine)
            steps[a].append(Step(vid, leaf_id[a], needs[vid][a], False, marginalized))
    # stored: the root and, recursively, the pieces updatable atoms' deltas read
    loading = _closure(needs, None)
    stored = _closure(needs, lambda a: query.atom(a).relation in updatable)
    views: list[ViewSpec] = [None] * (len(defs) + len(atoms))  # type: ignore[list-item]
    n_atoms = len(atoms)

    def spec_id(vid: int) -> int:  # root 0, leaves 1..k, derived views after them
        return 0 if vid == 0 else vid + n_atoms

    for vid, (members, keys) in enumerate(defs):
        variables = set().union(*(atom_vars[m] for m in members))
        marginalized = tuple(v for v in all_vars if v in variables - set(keys))
        views[spec_id(vid)] = ViewSpec(
            spec_id(vid),
            names[vid],
            keys,
            marginalized,
            tuple(v for v in marginalized if v in lifted),
            tuple(leaf_id[m] for m in members),
            stored=vid in stored,
            stored_while_loading=vid in loading,
        )
    for a in atoms:
        views[leaf_id[a.name]] = ViewSpec(leaf_id[a.name], a.name, a.variables, atom=a.name)
    triggers: dict[str, list[Trigger]] = {}
    for a in atoms:
        own = tuple(
            Step(
                spec_id(s.view),
                s.child,
                tuple(spec_id(p) for p in s.siblings),
                s.view in stored,
                s.marginalized,
            )
            for s in steps[a.name]
            if s.view in loading
        )
        triggers.setdefault(a.relation, []).append(Trigger(a.name, leaf_id[a.name], own))
    return MaintenancePlan(
        "higher_order", tuple(views), {r: tuple(t) for r, t in triggers.items()}, 0
    )


def _pieces(members: list[str], atom_vars: Mapping[str, set[str]], summed: set[str]):
    """The atoms grouped into pieces connected through the variables ``summed`` out
    (union-find over the atoms, linked through each summed variable's first atom)."""
    parent = list(range(len(members)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, m in enumerate(members):
        for v in atom_vars[m] & summed:
            j = first.setdefault(v, i)
            parent[find(i)] = find(j)
    pieces: dict[int, list[str]] = {}
    for i, m in enumerate(members):
        pieces.setdefault(find(i), []).append(m)
    return sorted(pieces.values(), key=lambda p: members.index(p[0]))


def _join_order(ids: list[int], start: set[str], defs) -> tuple[int, ...]:
    """Pieces ordered so that each next one shares a key with those joined so far when one
    does (a Cartesian product only where the delta has one)."""
    bound, remaining, out = set(start), list(ids), []
    while remaining:
        nxt = next((i for i in remaining if bound & set(defs[i][1])), remaining[0])
        remaining.remove(nxt)
        out.append(nxt)
        bound |= set(defs[nxt][1])
    return tuple(out)


def _closure(needs: Mapping[int, Mapping[str, tuple[int, ...]]], keep) -> set[int]:
    """The root and the pieces read by the deltas of the atoms ``keep`` accepts (all: None)."""
    seen, work = {0}, [0]
    while work:
        vid = work.pop()
        for a, pieces in needs[vid].items():
            if keep is not None and not keep(a):
                continue
            for p in pieces:
                if p not in seen:
                    seen.add(p)
                    work.append(p)
    return seen


def recompute_order(plan: MaintenancePlan, atoms) -> tuple[int, tuple[int, ...]]:
    """The leaf a recomputation starts from and the order of the others."""
    first = plan.views[plan.root].children[0]
    return first, _connected_order(list(atoms), first)
