"""Variable orders (F-IVM Definition 2) and the constructions of F-IVM §4.3.

A :class:`VariableOrder` is a rooted forest over the query's variables.  It is valid for a
query when every atom's variables lie on one root-to-leaf path; each atom then hangs under its
lowest variable.  Orders are given by the user (nested mappings or the bracket text format of
the F-IVM reference implementation), built by the reference heuristic, or derived: the
canonical free-top order of a q-hierarchical query, a free-top order of a free-connex query by
GYO elimination, and orders chosen on the Σ-reduct under functional dependencies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .errors import VariableOrderError
from .query import Query

Nested = Mapping[str, "Nested"]


@dataclass
class VariableOrder:
    """A forest over variables: ``parent[v]`` is v's parent (None for roots)."""

    parent: dict[str, str | None]
    children: dict[str | None, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.children:
            children: dict[str | None, list[str]] = {None: []}
            for v in self.parent:
                children.setdefault(v, [])
            for v, p in self.parent.items():
                children.setdefault(p, []).append(v)
            self.children = children
        self._check_forest()

    # ----------------------------------------------------------------- building
    @classmethod
    def from_nested(cls, nested: Nested | Sequence) -> VariableOrder:
        """From ``{"A": {"B": {}, "C": {"D": {}, "E": {}}}}``; a list of names is a chain."""
        parent: dict[str, str | None] = {}
        children: dict[str | None, list[str]] = {None: []}

        def visit(tree, up: str | None) -> None:
            if isinstance(tree, str):
                tree = {tree: {}}
            elif isinstance(tree, Sequence):
                chain = list(tree)
                tree = {}
                node = tree
                for name in chain:
                    node[name] = {}
                    node = node[name]
            if not isinstance(tree, Mapping):
                raise VariableOrderError(
                    f"under {up!r} the order has {tree!r}: each variable maps to a mapping of "
                    "the variables below it (or a list of names: a chain)"
                )
            for name, sub in tree.items():
                if not isinstance(name, str):
                    raise VariableOrderError(
                        f"variable names in an order are strings, got {name!r}"
                    )
                if name in parent:
                    raise VariableOrderError(f"variable {name!r} occurs twice in the order")
                parent[name] = up
                children.setdefault(up, []).append(name)
                children.setdefault(name, [])
                visit(sub or {}, name)

        visit(nested, None)
        return cls(parent, children)

    @classmethod
    def parse(cls, text: str, query: Query | None = None) -> VariableOrder:
        """Parse the bracket format of the F-IVM reference, e.g. ``A{ B{R}, C{ D{T}, E{S} } }``.

        Names of atoms (relations) at leaves are accepted and ignored: atoms always hang under
        their lowest variable.  ``X...{R}`` (or ``X…{R}``) is a chain that starts at ``X`` and
        continues with the variables of the atoms inside the braces not placed elsewhere.
        Names are letters, digits, ``_`` and ``.`` (not starting with a digit), separated by
        ``,``; any other character, and a name or ``{`` where neither may stand, raises
        :class:`VariableOrderError` with its position.
        """
        tokens, starts = _tokens(text)
        if not tokens:
            raise VariableOrderError("empty variable order")
        atom_names = {a.name for a in query.atoms} if query is not None else set()
        position = 0

        def unexpected(why: str) -> VariableOrderError:
            token, at = tokens[position], starts[position]
            return VariableOrderError(
                f"unexpected {token!r} at position {at} in variable order {text!r}: {why}"
            )

        def parse_list() -> list:
            nonlocal position
            items = []
            while position < len(tokens) and tokens[position] != "}":
                if tokens[position] == ",":
                    position += 1
                    continue
                items.append(parse_item())
                if position < len(tokens) and tokens[position] not in ",}":
                    raise unexpected("siblings are separated by ','")
            return items

        def parse_item():
            nonlocal position
            if tokens[position] == "{":
                raise unexpected("'{' follows the name of the variable it opens")
            name = tokens[position]
            position += 1
            subtree: list = []
            if position < len(tokens) and tokens[position] == "{":
                position += 1
                subtree = parse_list()
                if position >= len(tokens) or tokens[position] != "}":
                    raise VariableOrderError(f"unbalanced braces in variable order {text!r}")
                position += 1
            return name, subtree

        items = parse_list()
        if position != len(tokens):
            raise unexpected("'}' closes no '{'")
        variables = set(query.variables) if query is not None else set()
        uses: dict[str, int] = {}

        def count(item) -> None:
            uses[item[0].rstrip(".…")] = uses.get(item[0].rstrip(".…"), 0) + 1
            for s in item[1]:
                count(s)

        for item in items:
            count(item)

        def is_atom(name: str, sub: list) -> bool:
            """An atom is a leaf; a name that is also a variable is the atom only when the
            variable stands elsewhere in the order (``A{B{C}}`` over relations named A and
            B places variables A and B)."""
            return name in atom_names and not sub and (name not in variables or uses[name] > 1)

        explicit = set()

        def collect(item) -> None:
            name, sub = item
            base = name.rstrip(".…")
            if not is_atom(base, sub):
                explicit.add(base)
            for s in sub:
                collect(s)

        for item in items:
            collect(item)

        def to_nested(item_list) -> dict:
            result: dict = {}
            for name, sub in item_list:
                ellipsis = name.endswith("...") or name.endswith("…")
                base = name.rstrip(".…")
                if not ellipsis and is_atom(base, sub):
                    continue
                inner = to_nested(sub)
                if ellipsis:
                    if query is None:
                        raise VariableOrderError("a chain 'X...' needs the query to expand it")
                    rest = []
                    for atom_name, _ in sub:
                        atom = query.atom(atom_name.rstrip(".…"))
                        rest += [v for v in atom.variables if v not in explicit and v not in rest]
                    chain = [base] + [v for v in rest if v != base]
                    node: dict = {}
                    result[chain[0]] = node
                    for v in chain[1:]:
                        node[v] = {}
                        node = node[v]
                    node.update(inner)
                else:
                    result[base] = inner
            return result

        return cls.from_nested(to_nested(items))

    @classmethod
    def auto(cls, query: Query) -> VariableOrder:
        """The reference heuristic (§4.3a): variables in more atoms go higher."""
        position: dict[str, int] = {}
        for atom in query.atoms:
            for i, v in enumerate(atom.variables):
                position[v] = max(position.get(v, -1), i)
        first_seen = {v: i for i, v in enumerate(query.variables)}
        order = sorted(
            query.variables,
            key=lambda v: (len(query.rels(v)), -position[v], -first_seen[v]),
        )
        trees: list[tuple[set[str], str | None]] = [
            ({a.name}, None) for a in query.atoms
        ]  # (atoms in tree, root variable)
        parent: dict[str, str | None] = {}
        for v in order:
            touching = [t for t in trees if t[0] & query.rels(v)]
            others = [t for t in trees if not (t[0] & query.rels(v))]
            atoms: set[str] = set()
            for t_atoms, root in touching:
                atoms |= t_atoms
                if root is not None:
                    parent[root] = v
            trees = others + [(atoms, v)]
        for _, root in trees:
            parent[root] = None
        ordered = {v: parent[v] for v in reversed(order)}
        return cls(ordered)

    @classmethod
    def canonical(cls, query: Query) -> VariableOrder:
        """The canonical free-top order of a q-hierarchical query (§4.3b)."""
        if not is_q_hierarchical(query):
            raise VariableOrderError("the query is not q-hierarchical; no canonical order")
        free = set(query.free)
        nested: dict = {}
        for atom in query.atoms:
            path = sorted(
                atom.variables,
                key=lambda v: (-len(query.rels(v)), v not in free, v),
            )
            node = nested
            for v in path:
                node = node.setdefault(v, {})
        return cls.from_nested(nested)

    @classmethod
    def free_connex(cls, query: Query) -> VariableOrder:
        """A free-top order of a free-connex acyclic query by GYO elimination (§4.3c)."""
        edges = [set(a.variables) for a in query.atoms]
        originals = [frozenset(e) for e in edges]
        free = set(query.free)
        remaining = set(query.variables)
        eliminated: list[str] = []
        deps: dict[str, set[str]] = {}
        while remaining:
            candidates = [v for v in sorted(remaining, key=lambda v: (v in free, v))]
            chosen = None
            for v in candidates:
                if v in free and any(u not in free for u in remaining):
                    break
                neighbourhood = set().union(*(e for e in edges if v in e))
                if any(neighbourhood <= o for o in originals):
                    chosen = v
                    break
            if chosen is None:
                raise VariableOrderError("the query is not free-connex acyclic")
            neighbourhood = set().union(*(e for e in edges if chosen in e))
            deps[chosen] = neighbourhood - {chosen}
            edges = [e for e in edges if chosen not in e] + [neighbourhood - {chosen}]
            remaining.discard(chosen)
            eliminated.append(chosen)
        rank = {v: i for i, v in enumerate(eliminated)}
        parent = {}
        for v in reversed(eliminated):
            above = deps[v]
            parent[v] = min(above, key=lambda u: rank[u]) if above else None
        return cls(parent)

    @classmethod
    def from_functional_dependencies(
        cls, query: Query, dependencies: Iterable[tuple[Iterable[str], Iterable[str]]]
    ) -> VariableOrder:
        """An order chosen on the Σ-reduct of ``query`` (§4.3d), valid for ``query`` itself."""
        fds = [(frozenset(lhs), frozenset(rhs)) for lhs, rhs in dependencies]
        reduct = sigma_reduct(query, fds)
        if is_q_hierarchical(reduct):
            order = cls.canonical(reduct)
        elif is_free_connex(reduct):
            order = cls.free_connex(reduct)
        else:
            order = cls.auto(reduct)
        order.validate(query)
        return order

    # ------------------------------------------------------------------ queries
    @property
    def variables(self) -> list[str]:
        """Variables in pre-order."""
        out: list[str] = []

        def visit(v: str) -> None:
            out.append(v)
            for c in self.children.get(v, []):
                visit(c)

        for root in self.children.get(None, []):
            visit(root)
        return out

    @property
    def roots(self) -> list[str]:
        return list(self.children.get(None, []))

    def ancestors(self, variable: str) -> list[str]:
        """Ancestors from the parent up to the root."""
        out = []
        v = self.parent[variable]
        while v is not None:
            out.append(v)
            v = self.parent[v]
        return out

    def depth(self, variable: str) -> int:
        return len(self.ancestors(variable))

    def subtree(self, variable: str) -> list[str]:
        """``variable`` and all its descendants."""
        out = [variable]
        for c in self.children.get(variable, []):
            out += self.subtree(c)
        return out

    def lowest(self, variables: Iterable[str]) -> str:
        """The deepest of ``variables`` (they must lie on one path)."""
        return max(variables, key=self.depth)

    def atoms_under(self, variable: str, query: Query) -> list[str]:
        """Atoms hanging in the subtree of ``variable``."""
        below = set(self.subtree(variable))
        return [a.name for a in query.atoms if self.lowest(a.variables) in below]

    def dep(self, variable: str, query: Query) -> set[str]:
        """``dep(X) = anc(X) ∩ vars of the atoms below X``."""
        below: set[str] = set()
        for name in self.atoms_under(variable, query):
            below |= set(query.atom(name).variables)
        return set(self.ancestors(variable)) & below

    def validate(self, query: Query) -> None:
        """Check Definition 2 for ``query``; raise :class:`VariableOrderError` if broken."""
        missing = set(query.variables) - set(self.parent)
        if missing:
            raise VariableOrderError(f"variables {sorted(missing)} are missing from the order")
        extra = set(self.parent) - set(query.variables)
        if extra:
            raise VariableOrderError(f"the order names unknown variables {sorted(extra)}")
        for atom in query.atoms:
            path = sorted(atom.variables, key=self.depth)
            for upper, lower in zip(path, path[1:], strict=False):
                if upper not in self.ancestors(lower):
                    raise VariableOrderError(
                        f"relation {atom.name!r}: variables {upper!r} and {lower!r} are not on "
                        f"one root-to-leaf path (relation variables {list(atom.variables)})"
                    )

    def is_free_top(self, free: Iterable[str]) -> bool:
        """No bound variable is an ancestor of a free one."""
        free = set(free)
        return all(set(self.ancestors(v)) <= free for v in free)

    def __str__(self) -> str:
        def render(v: str) -> str:
            kids = self.children.get(v, [])
            return v + ("{" + ", ".join(render(c) for c in kids) + "}" if kids else "")

        return ", ".join(render(r) for r in self.roots)

    def _check_forest(self) -> None:
        for v in self.parent:
            seen = {v}
            p = self.parent[v]
            while p is not None:
                if p in seen:
                    raise VariableOrderError(f"the order has a cycle through {p!r}")
                if p not in self.parent:
                    raise VariableOrderError(f"parent {p!r} of {v!r} is not in the order")
                seen.add(p)
                p = self.parent[p]


_TOKEN = re.compile(r"\s*(?:([^\W\d][\w.]*…?)|([{},]))")


def _tokens(text: str) -> tuple[list[str], list[int]]:
    """Names and brackets of the variable-order text format and where each starts; junk
    raises with its position."""
    tokens, starts = [], []
    position = 0
    end = len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None:
            at = position + len(text[position:]) - len(text[position:].lstrip())
            raise VariableOrderError(
                f"unexpected {text[at]!r} at position {at} in variable order {text!r}: names "
                f"are letters, digits, '_' and '.'; the other characters are '{{', '}}' and ','"
            )
        tokens.append(match.group(1) or match.group(2))
        starts.append(match.start(1) if match.group(1) else match.start(2))
        position = match.end()
    return tokens, starts


# ---------------------------------------------------------------------- query classes
def _gyo_acyclic(edges: list[set[str]]) -> bool:
    edges = [set(e) for e in edges]
    changed = True
    while changed:
        changed = False
        counts: dict[str, int] = {}
        for e in edges:
            for v in e:
                counts[v] = counts.get(v, 0) + 1
        for e in edges:
            lonely = {v for v in e if counts[v] == 1}
            if lonely:
                e -= lonely
                changed = True
        kept: list[set[str]] = []
        for i, e in enumerate(edges):
            contained = any((e <= f and (e != f or j < i)) for j, f in enumerate(edges) if j != i)
            if contained or not e:
                changed = True
            else:
                kept.append(e)
        edges = kept
        if len(edges) <= 1:
            return True
    return len(edges) <= 1


def is_acyclic(query: Query) -> bool:
    """α-acyclicity by GYO reduction."""
    return _gyo_acyclic([set(a.variables) for a in query.atoms])


def is_free_connex(query: Query) -> bool:
    """Acyclic, and still acyclic with an extra hyperedge over the free variables."""
    edges = [set(a.variables) for a in query.atoms]
    return _gyo_acyclic(edges) and _gyo_acyclic(edges + [set(query.free)])


def is_hierarchical(query: Query) -> bool:
    """For all X, Y: rels(X) ⊆ rels(Y), rels(Y) ⊆ rels(X), or they are disjoint."""
    rels = {v: query.rels(v) for v in query.variables}
    for x in rels:
        for y in rels:
            a, b = rels[x], rels[y]
            if not (a <= b or b <= a or not (a & b)):
                return False
    return True


def is_q_hierarchical(query: Query) -> bool:
    """Hierarchical, and rels(X) ⊋ rels(Y) with Y free implies X free."""
    if not is_hierarchical(query):
        return False
    free = set(query.free)
    rels = {v: query.rels(v) for v in query.variables}
    return all(x in free for x in rels for y in free if y in rels and rels[x] > rels[y])


def closure(variables: Iterable[str], dependencies) -> set[str]:
    """Attribute closure under functional dependencies ``[(lhs, rhs), ...]``."""
    result = set(variables)
    changed = True
    while changed:
        changed = False
        for lhs, rhs in dependencies:
            if set(lhs) <= result and not set(rhs) <= result:
                result |= set(rhs)
                changed = True
    return result


def sigma_reduct(query: Query, dependencies) -> Query:
    """The Σ-reduct: every atom's schema extended to its closure (used to choose orders)."""
    from .query import Atom

    atoms = []
    relations = {}
    for atom in query.atoms:
        extended = tuple(atom.variables) + tuple(
            sorted(closure(atom.variables, dependencies) - set(atom.variables))
        )
        relations[atom.name] = extended
        atoms.append(Atom(atom.name, extended))
    return Query(relations, query.ring, query.free, atoms)
