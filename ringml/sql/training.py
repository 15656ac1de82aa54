"""Training data in SQL: a SELECT of feature columns FROM a join WHERE ... as the join a model
keeps fresh (``SELECT price, livingarea, nbbedrooms FROM House JOIN Shop USING (postcode)
WHERE price > 0``).

:func:`training_join` compiles the query like a view (one engine relation per FROM item,
filters and computed columns per item) whose selected columns become the variables of a
covariance payload, named after the output columns.  :meth:`TrainingJoin.covariance_query`
is the engine query; :class:`Feed` turns rows of the base tables into rows of the FROM
items (type-checked, deletes checked against the rows fed so far) and applies them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..batch import UpdateBatch
from ..maintainer import Maintainer
from ..query import Atom, Query
from ..rings.categorical import GeneralizedCovarianceRing
from ..rings.covariance import CovarianceRing
from .catalog import Catalog
from .compiler import compile_view
from .errors import SqlNameError, SqlTypeError, SqlUnsupportedError
from .expressions import Col
from .logical import AtomPlan, ViewPlan
from .tables import TableChange, TableStore, abandon_changes, check_batches
from .views import item_batches


@dataclass(frozen=True)
class TrainingJoin:
    """A compiled training query: its FROM items (feature variables and columns named after
    the output columns), the features in SELECT order and their kinds."""

    plan: ViewPlan
    atoms: tuple[AtomPlan, ...]
    features: tuple[str, ...]
    kinds: tuple[str, ...]
    catalog: Catalog

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.table for a in self.atoms))

    @property
    def joined(self) -> tuple[str, ...]:
        """The features that are join columns (bound by several FROM items)."""
        counts: dict[str, int] = {}
        for atom in self.atoms:
            for v in atom.variables:
                counts[v] = counts.get(v, 0) + 1
        return tuple(f for f in self.features if counts.get(f, 0) > 1)

    def covariance_query(
        self, features: Sequence[str] | None = None, categorical: Iterable[str] = ()
    ) -> Query:
        """Count, Σx and Σxxᵀ of ``features`` (default: all selected columns) over the join;
        ``categorical`` ones use the generalized covariance ring."""
        features = list(self.features if features is None else features)
        categorical = list(categorical)
        unknown = set(categorical) - set(features)
        if unknown:
            raise SqlNameError(f"categorical {sorted(unknown)} are not among the features")
        for name in features:
            if name not in self.features:
                raise SqlNameError(
                    f"{name!r} is not a selected column; the query selects {list(self.features)}",
                    construct=name,
                )
        kinds = dict(zip(self.features, self.kinds, strict=True))
        for name in features:
            if name not in categorical and kinds[name] not in ("int", "float"):
                raise SqlTypeError(
                    f"the continuous feature {name!r} is {kinds[name].upper()}, not a number; "
                    "declare it categorical",
                    construct=name,
                )
        if categorical:
            continuous = [v for v in features if v not in set(categorical)]
            ring = GeneralizedCovarianceRing(continuous, categorical)
        else:
            ring = CovarianceRing(features)
        relations = {a.alias: a.columns for a in self.atoms}
        atoms = [Atom(a.alias, a.variables, a.alias) for a in self.atoms]
        return Query(relations, ring, (), atoms)

    def feed(self) -> Feed:
        """A fresh feed (no rows yet) from the base tables to the FROM items."""
        return Feed(self)


class Feed:
    """Base-table rows -> the rows of a training query's FROM items.  Rows of any table of
    the catalog are type-checked and deletes checked against the rows fed so far (rows of
    tables the query does not read go nowhere else); :meth:`prepare` changes no row,
    :meth:`commit` records a prepared change once the model took it (:meth:`abandon` drops
    it otherwise)."""

    def __init__(self, join: TrainingJoin) -> None:
        self.join = join
        # every table of the catalog: a stream may carry tables this query does not read
        self.tables = {t: TableStore(join.catalog.table(t)) for t in join.catalog}
        self._atoms: dict[str, list[AtomPlan]] = {}
        for atom in join.atoms:
            self._atoms.setdefault(atom.table, []).append(atom)

    def prepare(self, updates: Sequence[UpdateBatch]) -> tuple[list[UpdateBatch], dict]:
        """The engine batches of base-table updates, and the checked changes to commit."""
        changes = check_batches(self.tables, updates)
        typed = {t: (c.columns, c.signs) for t, c in changes.items()}
        return item_batches(self._atoms, typed, "the training query"), changes

    def commit(self, changes: dict[str, TableChange]) -> None:
        for table, change in changes.items():
            self.tables[table].commit(change)

    def abandon(self, changes: dict[str, TableChange]) -> None:
        """Drop prepared changes the model did not take."""
        abandon_changes(self.tables, changes)

    def apply(self, maintainer: Maintainer, updates: Sequence[UpdateBatch]) -> None:
        """Feed ``updates`` to ``maintainer`` atomically."""
        batches, changes = self.prepare(updates)
        try:
            if batches:
                maintainer.apply(batches)
        except BaseException:
            self.abandon(changes)
            raise
        self.commit(changes)


def training_join(sql: str, catalog: Catalog | object) -> TrainingJoin:
    """Compile a SELECT of columns (or one-table expressions) FROM a join WHERE ...; the
    selected columns become the features, named as in the output."""
    if not isinstance(catalog, Catalog):
        catalog = Catalog(catalog)
    plan = compile_view(sql, catalog)
    for clause, present in (
        ("GROUP BY, aggregates or DISTINCT", plan.grouped),
        ("ORDER BY", bool(plan.order)),
        ("LIMIT/OFFSET", plan.limit is not None or plan.offset > 0),
        # the covariance query keeps each table's own filter and the equality joins only
        ("a subquery in WHERE", bool(plan.subqueries)),
        ("a condition over several tables other than an equality", plan.residual is not None),
        ("a derived table with GROUP BY or aggregates", bool(plan.derived)),
        ("a column the join keeps hidden", bool(plan.hidden)),
    ):
        if present:
            raise SqlUnsupportedError(
                f"a training query selects the join's rows: {clause} is not supported",
                construct=clause,
            )
    rename: dict[str, str] = {}
    kinds = []
    for output in plan.outputs:
        expression = output.expression
        if not isinstance(expression, Col) or expression.source:
            raise SqlUnsupportedError(
                f"the feature {output.name!r} = {expression.sql()} reads several tables; a "
                "feature is an expression of one table",
                construct=output.name,
            )
        if expression.name in rename:
            raise SqlNameError(
                f"{output.name!r} and {rename[expression.name]!r} are the same column",
                construct=output.name,
            )
        if expression.nullable:
            raise SqlUnsupportedError(
                f"the feature {output.name!r} = {expression.sql()} is a column declared NULL; "
                "a feature holds a value in every row (declare the column NOT NULL, or leave "
                "it out of the features)",
                construct=output.name,
            )
        rename[expression.name] = output.name
        kinds.append(expression.type)
    taken = {v for a in plan.atoms for v in a.variables} - set(rename)
    clash = sorted(set(rename.values()) & taken)
    if clash:
        raise SqlNameError(f"feature names {clash} clash with internal variables; rename them")
    atoms = []
    for atom in plan.atoms:
        columns = tuple(rename.get(v, c) for c, v in zip(atom.columns, atom.variables, strict=True))
        if len(set(columns)) != len(columns):
            raise SqlNameError(
                f"a feature name repeats a column name of {atom.alias!r}; rename the feature",
                construct=atom.alias,
            )
        variables = tuple(rename.get(v, v) for v in atom.variables)
        atoms.append(replace(atom, columns=columns, variables=variables))
    features = tuple(o.name for o in plan.outputs)
    return TrainingJoin(plan, tuple(atoms), features, tuple(kinds), catalog)
