"""Relations, atoms and join-aggregate queries (F-IVM §3).

A :class:`Query` is a natural join of *atoms* — occurrences of base relations, each naming the
variables its columns bind (a relation may occur several times, e.g. a path query over copies
of one edge table) — with free (group-by) variables, a payload ring whose lifting functions
apply to the bound variables, and optional filters on single relations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from .errors import SchemaError
from .rings.base import Ring
from .rings.scalar import IntegerRing

#: a filter receives a relation's rows (columns named as in the relation) and returns a mask
RowFilter = Callable[[pd.DataFrame], "pd.Series | Sequence[bool]"]


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
        self.relations = {name: tuple(cols) for name, cols in self.relations.items()}
        for name, cols in self.relations.items():
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
        self.free = tuple(self.free)
        unknown = set(self.free) - set(self.variables)
        if unknown:
            raise SchemaError(f"free variables {sorted(unknown)} occur in no relation")
        lifted_free = set(self.free) & set(self.ring.lifted_variables)
        if lifted_free:
            raise SchemaError(f"free variables are never lifted: {sorted(lifted_free)}")
        for name in self.filters:
            if name not in self.relations:
                raise SchemaError(f"filter on unknown relation {name!r}")
        if not self._connected():
            raise SchemaError("the join is not connected (a Cartesian product); split the query")

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

    def _connected(self) -> bool:
        atoms = list(self.atoms)
        if not atoms:
            return False
        reached = {atoms[0].name}
        reached_vars = set(atoms[0].variables)
        changed = True
        while changed:
            changed = False
            for a in atoms:
                if a.name not in reached and reached_vars & set(a.variables):
                    reached.add(a.name)
                    reached_vars |= set(a.variables)
                    changed = True
        return len(reached) == len(atoms)


def natural_join_query(
    relations: Mapping[str, Sequence[str]],
    ring: Ring | None = None,
    free: Iterable[str] = (),
    filters: Mapping[str, RowFilter] | None = None,
) -> Query:
    """A natural join of ``relations`` (shared column names join) over ``ring``."""
    return Query(relations, ring or IntegerRing(), tuple(free), None, dict(filters or {}))
