"""ν view trees for free-connex and q-hierarchical queries (F-IVM §8.1, Fig. 9; §8.2).

τ keeps every free variable in the keys of the views above it, so its root holds the whole
grouped result: for a free-connex query its size (and the cost of an update) can be that of
the result, not of the database.  ν keeps the result *factorized* over the views at the top
of the tree, over a free-top variable order:

* a **bound** variable X gives ``V^{@X}[dep(X)] = ⊕_X ⊗ children`` with X's lift, exactly as
  τ does (below a bound variable everything is bound, so its keys are ``dep(X)``); chains of
  single-child bound variables are fused into one view, as τ does;
* a **free** variable X with two or more children gives ``H^{@X}[{X} ∪ dep(X)] = ⊗ children``
  (used to enumerate the X-values of a ``dep(X)``-tuple) and, if X has a sibling,
  ``V^{@X}[dep(X)] = ⊕_X H^{@X}`` on top of it (used by the siblings' updates);
* a free X with one child gives ``V^{@X}[dep(X)] = ⊕_X child`` if X has a sibling, and
  otherwise the child's tree itself.

``⊕`` over a free variable sums with the identity lift: free variables are never lifted, and
the views above the lowest all-free views carry only multiplicities in effect (Remark 1).
The maintainer's generic propagation works on these trees unchanged.

Besides the views of Fig. 8's rule, the views enumeration reads are materialized: the H views,
the child view that enumerates a free variable with a single child, and the lowest views whose
keys are exactly the free variables below them (the payload function of Fig. 11 multiplies
their payloads).  :mod:`ringml.enumeration` enumerates the result from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import VariableOrderError
from .query import Atom, Query
from .variable_order import VariableOrder, is_q_hierarchical
from .view_tree import AtomLeaf, Node, ViewNode, ViewTree, view_name


@dataclass
class NuTree(ViewTree):
    """A ν view tree.  ``root`` may be an :class:`AtomLeaf` (e.g. one all-free relation).

    ``enumeration`` maps the free variables, top-down (pre-order of the variable order), to the
    view their values are enumerated from: ``H^{@X}`` when X has at least two children, else
    the root of X's only child subtree.  ``payload_views`` are the lowest all-free views whose
    payloads the payload function (Fig. 11) multiplies.
    """

    enumeration: dict[str, Node] = field(default_factory=dict)
    payload_views: list[Node] = field(default_factory=list)

    def explain(self) -> str:
        lines = [super().explain()]
        if self.enumeration:
            lines.append(
                "enumeration (top-down): "
                + ", ".join(f"{x} from {n.name}" for x, n in self.enumeration.items())
            )
            lines.append("payload: " + " ⊗ ".join(n.name for n in self.payload_views))
        return "\n".join(lines)

    def _materialize(self) -> None:
        super()._materialize()  # Fig. 8: the root and the views a sibling's delta probes
        for node in self.enumeration.values():
            node.materialized = True
        for node in self.payload_views:
            node.materialized = True


def nu_order(query: Query) -> VariableOrder:
    """ν's default order: canonical (q-hierarchical), else free-connex (free variables), else
    the reference heuristic (no free variable: ν is τ).  Raises :class:`VariableOrderError`
    for a query with free variables that is not free-connex acyclic."""
    if is_q_hierarchical(query):
        return VariableOrder.canonical(query)
    if query.free:
        return VariableOrder.free_connex(query)
    return VariableOrder.auto(query)


def build_nu(
    query: Query,
    order: VariableOrder | None = None,
    updatable_relations: Iterable[str] | None = None,
) -> NuTree:
    """ν over the free-top ``order`` (default :func:`nu_order`), materialized for the
    ``updatable_relations`` (default: all)."""
    if order is None:
        order = nu_order(query)
    order.validate(query)
    free = set(query.free)
    for x in query.free:
        bound_above = [v for v in order.ancestors(x) if v not in free]
        if bound_above:
            raise VariableOrderError(
                f"ν needs a free-top variable order: bound variable {bound_above[0]!r} is "
                f"above free variable {x!r} in {order}"
            )
    roots = order.roots
    if len(roots) != 1:
        raise VariableOrderError(
            "ν needs a connected join; a Cartesian product of pieces is kept by τ (tree='tau')"
        )
    attached: dict[str, list[Atom]] = {}
    for atom in query.atoms:
        attached.setdefault(order.lowest(atom.variables), []).append(atom)
    taken = {a.name for a in query.atoms}  # view names never equal an atom's
    enumeration: dict[str, Node] = {}

    def keys_of(variables: set[str]) -> tuple[str, ...]:
        return tuple(v for v in query.variables if v in variables)

    def has_sibling(x: str) -> bool:  # in the order extended with relation leaves
        up = order.parent[x]
        return up is not None and len(order.children.get(up, [])) + len(attached.get(up, [])) > 1

    def view(prefix: str, x: str, keys, summed, kids: list[Node]) -> ViewNode:
        atoms = frozenset().union(*(k.atoms for k in kids))
        node = ViewNode(
            view_name(x, atoms, taken, prefix), (x,), keys, tuple(summed), kids, atoms=atoms
        )
        for k in kids:
            k.parent = node
        return node

    def build(x: str) -> Node:
        kids: list[Node] = [build(c) for c in order.children.get(x, [])]
        kids += [AtomLeaf(a) for a in attached.get(x, [])]
        dep = order.dep(x, query)
        if x not in free:  # V^{@X}[dep(X)] = ⊕_X ⊗ children, with X's lift
            if len(kids) == 1 and isinstance(kids[0], ViewNode):  # a chain: fuse (§5.3)
                child = kids[0]  # bound as well: the order is free-top
                child.variables = (x,) + child.variables
                child.marginalized = (x,) + child.marginalized
                child.keys = keys_of(dep)
                child.name = view_name(x, child.atoms, taken)
                return child
            return view("V", x, keys_of(dep), (x,), kids)
        if len(kids) >= 2:
            h = view("H", x, keys_of(dep | {x}), (), kids)
            enumeration[x] = h
            return view("V", x, keys_of(dep), (x,), [h]) if has_sibling(x) else h
        (child,) = kids
        enumeration[x] = child
        if not has_sibling(x):
            return child
        # ⊕_X child: X, and any free variable below X the child keeps, sum with identity lift
        summed = [x] + [v for v in child.keys if v != x and v not in dep]
        return view("V", x, keys_of(dep), summed, [child])

    root = build(roots[0])
    updatable = frozenset(
        a.name
        for a in query.atoms
        if updatable_relations is None or a.relation in set(updatable_relations)
    )
    top_down = [v for v in order.variables if v in free]
    tree = NuTree(
        query,
        order,
        root,  # type: ignore[arg-type]  # a leaf when the whole query is one all-free atom
        updatable,
        enumeration={x: enumeration[x] for x in top_down},
        payload_views=_payload_views(root, free, query),
    )
    tree._materialize()
    return tree


def _payload_views(root: Node, free: set[str], query: Query) -> list[Node]:
    """The views the payload function (Fig. 11) stops at: from the root down, the first views
    whose keys are exactly the free variables occurring in their subtree."""
    if not free:
        return []
    out: list[Node] = []

    def visit(node: Node) -> None:
        below = set().union(*(query.atom(a).variables for a in node.atoms)) & free
        if set(node.keys) == below:
            out.append(node)
        elif isinstance(node, ViewNode):
            for child in node.children:
                visit(child)
        else:  # cannot happen over a free-top order: such a leaf lies under a bound view
            raise VariableOrderError(f"relation {node.name!r} mixes free and bound variables")

    visit(root)
    return out
