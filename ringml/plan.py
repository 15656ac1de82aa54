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
  scratch after every batch.

The maintainer validates batches and runs the triggers with :mod:`ringml.operators`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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
    order; the result is added to the view's store when ``stored``."""

    view: int
    child: int
    siblings: tuple[int, ...]
    stored: bool


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
                    summed = f"⊕_{{{', '.join(view.marginalized)}}} " if view.marginalized else ""
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


def recompute_order(plan: MaintenancePlan, atoms) -> tuple[int, tuple[int, ...]]:
    """The leaf a recomputation starts from and the order of the others."""
    first = plan.views[plan.root].children[0]
    return first, _connected_order(list(atoms), first)
