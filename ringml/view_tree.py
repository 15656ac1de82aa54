"""View trees (F-IVM τ, §5) and the choice of materialized views (Fig. 8).

One view per variable of the order, keyed by ``dep(X)`` plus the free variables below X; a
chain of single-child views (e.g. the local variables of one wide relation) is fused into one
view that marginalizes all of them at once, so Housing has one view per relation plus the root.
Atoms are the leaves.  A join of several connected pieces (a Cartesian product) has a forest
as its variable order; the pieces' root views are the children of one product view.  Given
the updatable relations, a view is materialized iff a sibling may produce deltas that must
join with it; the root always is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .query import Atom, Query
from .variable_order import VariableOrder


@dataclass(eq=False)
class AtomLeaf:
    """A relation occurrence at a leaf of the view tree."""

    atom: Atom
    parent: ViewNode | None = None
    materialized: bool = False

    @property
    def name(self) -> str:
        return self.atom.name

    @property
    def keys(self) -> tuple[str, ...]:
        return self.atom.variables

    @property
    def atoms(self) -> frozenset[str]:
        return frozenset({self.atom.name})

    def describe(self) -> str:
        return f"{self.atom.name}[{', '.join(self.atom.variables)}]"


@dataclass(eq=False)
class ViewNode:
    """``V[keys] = ⊕_{marginalized} ⊗ children`` (lifting each marginalized variable)."""

    name: str
    variables: tuple[str, ...]  # the order's variables fused into this view, top-down
    keys: tuple[str, ...]
    marginalized: tuple[str, ...]
    children: list[ViewNode | AtomLeaf]
    parent: ViewNode | None = None
    materialized: bool = False
    atoms: frozenset[str] = field(default_factory=frozenset)

    def describe(self) -> str:
        summed = f"⊕_{{{', '.join(self.marginalized)}}} " if self.marginalized else ""
        inner = " ⊗ ".join(c.name for c in self.children)
        return f"{self.name}[{', '.join(self.keys)}] = {summed}{inner}"


Node = ViewNode | AtomLeaf


def has_siblings(node: Node) -> bool:
    """Whether another child shares the node's parent (its delta joins them)."""
    return node.parent is not None and len(node.parent.children) > 1


@dataclass
class ViewTree:
    """A view tree over a query, with the materialization chosen for the updatable atoms."""

    query: Query
    order: VariableOrder
    root: ViewNode
    updatable: frozenset[str]  # atom names

    @classmethod
    def build(
        cls, query: Query, order: VariableOrder, updatable_relations: Iterable[str]
    ) -> ViewTree:
        """τ over ``order`` with fused chains; materialization for ``updatable_relations``."""
        order.validate(query)
        free = set(query.free)
        attached: dict[str, list[Atom]] = {}
        for atom in query.atoms:
            attached.setdefault(order.lowest(atom.variables), []).append(atom)
        taken = {a.name for a in query.atoms}  # view names never equal an atom's

        def build(variable: str) -> ViewNode:
            kids: list[Node] = [build(c) for c in order.children.get(variable, [])]
            kids += [AtomLeaf(a) for a in attached.get(variable, [])]
            below = set(order.subtree(variable))
            keys_set = order.dep(variable, query) | (free & below)
            keys = tuple(v for v in query.variables if v in keys_set)
            marginal = () if variable in free else (variable,)
            atoms = frozenset().union(*(k.atoms for k in kids))
            if len(kids) == 1 and isinstance(kids[0], ViewNode):
                child = kids[0]
                child.variables = (variable,) + child.variables
                child.marginalized = marginal + child.marginalized
                child.keys = keys
                child.name = view_name(variable, child.atoms, taken)
                return child
            node = ViewNode(
                view_name(variable, atoms, taken), (variable,), keys, marginal, kids, atoms=atoms
            )
            for k in kids:
                k.parent = node
            return node

        tops = [build(r) for r in order.roots]
        if len(tops) == 1:
            root = tops[0]
        else:  # a Cartesian product of connected pieces: their root views' product
            atoms = frozenset().union(*(t.atoms for t in tops))
            keys = tuple(v for v in query.variables if v in free)
            root = ViewNode("V@product", (), keys, (), tops, atoms=atoms)
            for top in tops:
                top.parent = root
        updatable = frozenset(a.name for a in query.atoms if a.relation in set(updatable_relations))
        tree = cls(query, order, root, updatable)
        tree._materialize()
        return tree

    # ------------------------------------------------------------------ queries
    def nodes(self) -> list[Node]:
        """All nodes, root first (pre-order)."""
        out: list[Node] = []

        def visit(n: Node) -> None:
            out.append(n)
            if isinstance(n, ViewNode):
                for c in n.children:
                    visit(c)

        visit(self.root)
        return out

    def views(self) -> list[ViewNode]:
        return [n for n in self.nodes() if isinstance(n, ViewNode)]

    def leaves(self) -> list[AtomLeaf]:
        return [n for n in self.nodes() if isinstance(n, AtomLeaf)]

    def leaf(self, atom_name: str) -> AtomLeaf:
        for leaf in self.leaves():
            if leaf.atom.name == atom_name:
                return leaf
        raise KeyError(atom_name)

    def path(self, atom_name: str) -> list[ViewNode]:
        """The views from the atom's parent up to the root."""
        node = self.leaf(atom_name).parent
        out = []
        while node is not None:
            out.append(node)
            node = node.parent
        return out

    def materialized(self) -> list[Node]:
        return [n for n in self.nodes() if n.materialized]

    def explain(self) -> str:
        """The variable order, the view tree and which views are materialized."""
        lines = [f"variable order: {self.order}", "view tree:"]

        def visit(n: Node, depth: int) -> None:
            mark = "*" if n.materialized else " "
            lines.append(f"  {mark} {'  ' * depth}{n.describe()}")
            if isinstance(n, ViewNode):
                for c in n.children:
                    visit(c, depth + 1)

        visit(self.root, 0)
        lines.append(
            f"materialized (*): {len(self.materialized())} "
            f"[{', '.join(n.name for n in self.materialized())}]; "
            f"updatable: {sorted(self.updatable) or 'none'}"
        )
        return "\n".join(lines)

    def _materialize(self) -> None:
        self.root.materialized = True
        for view in self.views():
            for child in view.children:
                child.materialized = any(
                    sibling is not child and sibling.atoms & self.updatable
                    for sibling in view.children
                )


def view_name(variable: str, atoms: frozenset[str], taken: set[str], prefix: str = "V") -> str:
    """``<prefix>@X_<initials of the atoms below>``, numbered past the names ``taken``
    (atoms' and views', so a relation named like a view never shadows it)."""
    base = f"{prefix}@{variable}_{''.join(sorted(a[0] for a in atoms))}"
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name
