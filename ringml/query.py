"""Relations, atoms and join-aggregate queries (F-IVM §3).

A :class:`Query` is a natural join of *atoms* — occurrences of base relations, each naming the
variables its columns bind (a relation may occur several times, e.g. a path query over copies
of one edge table) — with free (group-by) variables, a payload ring whose lifting functions
apply to the bound variables, and optional filters on single relations.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import SchemaError
from .predicates import Predicate, where
from .rings.base import Ring
from .rings.scalar import IntegerRing

#: a single-relation filter: a predicate (``col("price") > 1e5``) or SQL text (``"price > 1e5"``)
RowFilter = Predicate | str


@dataclass(frozen=True)
class Atom:
    """One occurrence of relation ``relation`` in a join, binding its columns to ``variables``."""

    relation: str
    variables: tuple[str, ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.relation)
        if len(set(self.variables)) != len(self.variables):
            raise SchemaError(f"atom {self.name!r} repeats a variable: {self.variables}")
        odd = [v for v in self.variables if not isinstance(v, str)]
        if odd:
            raise SchemaError(f"atom {self.name!r}: variable names are strings, got {odd[0]!r}")


@dataclass
class Query:
    """``Q[free] = ⊕_{bound} ⊗_atoms R[vars]`` over ``ring``.

    ``relations`` maps each base relation to its column names.  ``atoms`` defaults to one atom
    per relation binding each column to the variable of the same name (a natural join).
    Bound variables in ``ring.lifted_variables`` are lifted by the ring; the others lift to 1.
    """

    relations: Mapping[str, Sequence[str]]
    ring: Ring = field(default_factory=IntegerRing)
    free: Sequence[str] = ()
    atoms: Sequence[Atom] | None = None
    filters: Mapping[str, RowFilter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, cols in self.relations.items():
            if isinstance(cols, str | bytes):
                raise SchemaError(
                    f"relation {name!r}: columns must be a list of names, not the string "
                    f"{cols!r} (write {list(cols)!r} for one column per letter)"
                )
        self.relations = {name: tuple(cols) for name, cols in self.relations.items()}
        for name, cols in self.relations.items():
            if not isinstance(name, str):
                raise SchemaError(f"relation names are strings, got {name!r}")
            if not cols:
                raise SchemaError(f"relation {name!r} has no columns")
            odd = [c for c in cols if not isinstance(c, str)]
            if odd:
                raise SchemaError(f"relation {name!r}: column names are strings, got {odd[0]!r}")
            if len(set(cols)) != len(cols):
                raise SchemaError(f"relation {name!r} repeats a column: {cols}")
        if self.atoms is None:
            self.atoms = [Atom(name, cols) for name, cols in self.relations.items()]
        self.atoms = list(self.atoms)
        names = [a.name for a in self.atoms]
        if len(set(names)) != len(names):
            raise SchemaError(f"atom names must be unique, got {names}")
        for atom in self.atoms:
            if atom.relation not in self.relations:
                raise SchemaError(f"atom {atom.name!r} names unknown relation {atom.relation!r}")
            arity = len(self.relations[atom.relation])
            if len(atom.variables) != arity:
                raise SchemaError(
                    f"atom {atom.name!r} binds {len(atom.variables)} variables but relation "
                    f"{atom.relation!r} has {arity} columns"
                )
        if isinstance(self.free, str | bytes):
            raise SchemaError(
                f"free must be a list of variables, not the string {self.free!r} (write "
                f"[{self.free!r}] for one variable)"
            )
        self.free = tuple(self.free)
        unknown = set(self.free) - set(self.variables)
        if unknown:
            raise SchemaError(f"free variables {sorted(unknown)} occur in no relation")
        unbound = set(self.ring.lifted_variables) - set(self.variables)
        if unbound:
            raise SchemaError(
                f"the ring lifts variables {sorted(unbound)} that no relation has; the "
                f"relations' columns are {list(self.variables)}"
            )
        lifted_free = set(self.free) & set(self.ring.lifted_variables)
        if lifted_free:
            raise SchemaError(f"free variables are never lifted: {sorted(lifted_free)}")
        self.filters = {
            name: _as_filter(self.relations, name, f) for name, f in self.filters.items()
        }
        if not self.atoms:
            raise SchemaError("a query needs at least one relation")

    @property
    def checkpointable(self) -> bool:
        """False when a filter is an opaque Python callable (no pickling, no checkpoints)."""
        return all(f.checkpointable for f in self.filters.values())

    def require_checkpointable(self) -> None:
        """Raise :class:`SchemaError` naming the relations whose filter is an opaque callable."""
        opaque = sorted(name for name, f in self.filters.items() if not f.checkpointable)
        if opaque:
            raise SchemaError(
                f"the filters on relations {opaque} are opaque Python callables: a query or "
                "maintainer holding them cannot be pickled or checkpointed; express them as "
                "predicates (ringml.predicates.col('x') > 0, or SQL text 'x > 0')"
            )

    def description(self) -> dict[str, Any]:
        """A canonical, JSON-friendly description of the query (what :meth:`fingerprint`
        hashes): relations, atoms, ring class and configuration (not its state, e.g. the
        covariance shifts), free variables and filters."""
        return {
            "relations": {name: list(cols) for name, cols in sorted(self.relations.items())},
            "atoms": [[a.name, a.relation, list(a.variables)] for a in self.atoms],
            "ring": ring_description(self.ring),
            "free": list(self.free),
            "filters": {name: f.sql() for name, f in sorted(self.filters.items())},
        }

    def fingerprint(self) -> str:
        """Hex SHA-256 of :meth:`description`: equal for queries that maintain the same thing."""
        return fingerprint(self.description())

    @property
    def variables(self) -> tuple[str, ...]:
        """All variables, in order of first occurrence."""
        seen: dict[str, None] = {}
        for atom in self.atoms:
            for v in atom.variables:
                seen.setdefault(v)
        return tuple(seen)

    @property
    def bound(self) -> tuple[str, ...]:
        """Variables marginalized by the query."""
        return tuple(v for v in self.variables if v not in self.free)

    def atoms_of(self, relation: str) -> list[Atom]:
        """Occurrences of a base relation."""
        return [a for a in self.atoms if a.relation == relation]

    def atom(self, name: str) -> Atom:
        """The atom called ``name``."""
        for a in self.atoms:
            if a.name == name:
                return a
        raise SchemaError(f"no atom named {name!r}")

    def rels(self, variable: str) -> frozenset[str]:
        """Names of the atoms containing ``variable``."""
        return frozenset(a.name for a in self.atoms if variable in a.variables)

    def components(self) -> list[list[str]]:
        """The atoms (names) of each connected piece of the join; several pieces make a
        Cartesian product, which the engine maintains as the product of the pieces."""
        pieces: list[tuple[set[str], list[str]]] = []
        for atom in self.atoms:
            touching = [p for p in pieces if p[0] & set(atom.variables)]
            merged = (set(atom.variables), [atom.name])
            for p in touching:
                pieces.remove(p)
                merged[0].update(p[0])
                merged[1][:0] = p[1]
            pieces.append(merged)
        order = {a.name: i for i, a in enumerate(self.atoms)}
        return sorted((sorted(p[1], key=order.get) for p in pieces), key=lambda p: order[p[0]])

    @property
    def is_connected(self) -> bool:
        """Whether the join has one connected piece (no Cartesian product)."""
        return len(self.components()) == 1


def natural_join_query(
    relations: Mapping[str, Sequence[str]],
    ring: Ring | None = None,
    free: Iterable[str] = (),
    filters: Mapping[str, RowFilter] | None = None,
) -> Query:
    """A natural join of ``relations`` (shared column names join) over ``ring``."""
    return Query(relations, ring or IntegerRing(), tuple(free), None, dict(filters or {}))


def _as_filter(relations: Mapping[str, Sequence[str]], relation: str, value: Any) -> Predicate:
    """A filter as a predicate over ``relation``'s columns (SQL text is parsed)."""
    if relation not in relations:
        raise SchemaError(f"filter on unknown relation {relation!r}")
    if isinstance(value, str):
        value = where(value)
    if not isinstance(value, Predicate):
        kind = "a Python callable" if callable(value) else f"{type(value).__name__} {value!r}"
        raise SchemaError(
            f"the filter on relation {relation!r} is {kind}; give a predicate "
            "(ringml.predicates.col('price') > 1e5) or SQL text ('price > 1e5'), or wrap a "
            "callable as ringml.predicates.opaque(fn) to opt out of pickling and checkpoints"
        )
    for column in sorted(value.columns()):
        if column not in relations[relation]:
            raise SchemaError(
                f"the filter on relation {relation!r} reads column {column!r}, which is not "
                f"among its columns {list(relations[relation])}"
            )
    return value


def ring_description(ring: Ring) -> dict[str, Any]:
    """A ring's class and configuration (its ``repr``, memory addresses removed) with its
    lifted and categorical variables; the state a ring fixes while it runs is left out."""
    return {
        "class": f"{type(ring).__module__}.{type(ring).__qualname__}",
        "config": re.sub(r" at 0x[0-9a-fA-F]+", "", repr(ring)),
        "lifted": sorted(ring.lifted_variables),
        "categorical": sorted(getattr(ring, "categorical_variables", ()) or ()),
    }


def fingerprint(description: Mapping[str, Any]) -> str:
    """Hex SHA-256 of a canonical JSON text of ``description``."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
