"""The logical plan of a SQL view: what the compiler produces and the views execute.

A :class:`ViewPlan` is frozen and small.  Its *atoms* are the FROM items (one per alias,
derived tables inlined): each is a virtual relation over one base table with exactly the
columns the view needs (join columns, group-by keys, aggregate factors; computed columns are
expressions of that table's row), a filter, and the query variable each column binds.
Aggregates are sums of *components*: one ring component per distinct product of per-atom
factors (``SUM(l.price * (1 - l.disc) * p.promo)`` is one component lifting one factor
column of ``l`` and one of ``p``), plus the row count.  What happens after aggregation
(arithmetic over aggregates, HAVING, ORDER BY, LIMIT) is expressions over *slots*: the
group-by keys (by variable), the aggregates and the output columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from ..query import Atom, Query
from ..rings.base import Ring
from ..rings.scalar import IntegerRing, ProductRing, RealRing
from .expressions import Expr

COUNT = "count"  # the component every view has: the number of join rows (derivations)


@dataclass(frozen=True)
class AtomPlan:
    """One FROM item: the rows of ``table`` passing ``filter``, projected on ``columns``
    (each the value of an expression over the table's row), binding ``variables``."""

    alias: str
    table: str
    filter: Expr | None
    columns: tuple[str, ...]
    expressions: tuple[Expr, ...]
    variables: tuple[str, ...]
    numeric: tuple[bool, ...]  # per column: a factor, read as a number (NULL as 0)

    def describe(self) -> str:
        cols = ", ".join(
            c if isinstance(e, Expr) and c == getattr(e, "name", None) else f"{c}={e.sql()}"
            for c, e in zip(self.columns, self.expressions, strict=True)
        )
        where = f" WHERE {self.filter.sql()}" if self.filter is not None else ""
        return f"{self.alias} <- {self.table}[{cols}]{where}"


@dataclass(frozen=True)
class Component:
    """``Σ`` over the join of the product of the ``lifted`` variables' values."""

    name: str
    lifted: tuple[str, ...]
    integer: bool

    def ring(self) -> Ring:
        if not self.lifted:
            return IntegerRing()
        return (IntegerRing if self.integer else RealRing)(list(self.lifted))


Terms = tuple[tuple[int | Decimal, str], ...]  # Σ coefficient · component


@dataclass(frozen=True)
class AggregatePlan:
    """``COUNT``/``SUM``/``AVG``: ``value`` and ``nonnull`` (how many non-NULL arguments;
    None: every row) as sums of components."""

    slot: str
    function: str
    value: Terms
    nonnull: Terms | None
    type: str
    text: str
    argument: str | None = None  # MIN/MAX/DISTINCT: the hidden key variable of the argument
    # a nullable argument's NULL indicator key: its groups where it holds are no value
    argument_null: str | None = None


#: aggregates read from the values of a hidden key in each group, not from ring components
HIDDEN_AGGREGATES = ("min", "max", "count_distinct", "sum_distinct", "avg_distinct")


def valued(slot: str) -> str:
    """The name of the values that say which groups of a MIN/MAX/DISTINCT aggregate over a
    nullable argument hold a non-NULL value (the others' aggregate is NULL)."""
    return f"{slot}#valued"


@dataclass(frozen=True)
class OutputColumn:
    name: str
    expression: Expr  # over slots


@dataclass(frozen=True)
class OrderKey:
    expression: Expr  # over slots and outputs
    descending: bool
    nulls_first: bool


@dataclass(frozen=True)
class SubqueryPlan:
    """A subquery of a view's WHERE, maintained as its own view (``plan``) and read by the
    residual filter per outer row.

    ``mode="value"``: ``plan``'s rows are ``(__k0.., [__r], __v, __n)``: per value of the
    ``equalities`` correlated inner expressions (``__kI``) -- and of the inner side ``__r``
    of an ``inequality`` (``"<"``, ``"<="``, ``">"``, ``">="``: ``__r op outer``) -- the
    subquery's value ``__v`` and its row count ``__n``; an outer row with no match gets
    ``default`` (0 for SUM/COUNT: ring semantics, NULL for AVG/MIN/MAX).  With an
    inequality, ``__v`` is a SUM or COUNT, summed over the matching ``__r``.
    ``mode="in"``: ``plan`` is the (uncorrelated) subquery itself; the outer value is
    looked up among its first column."""

    plan: ViewPlan
    mode: str
    equalities: int
    inequality: str | None
    default: object
    text: str

    def describe(self) -> str:
        how = {"value": "value", "in": "membership"}[self.mode]
        corr = f"{self.equalities} equalit{'y' if self.equalities == 1 else 'ies'}"
        if self.inequality:
            corr += f" and __r {self.inequality} outer"
        return f"({self.text}): {how}, correlated by {corr}; empty: {self.default}"


@dataclass(frozen=True)
class ViewPlan:
    """A compiled view.  ``grouped``: one output row per group (aggregates, GROUP BY,
    DISTINCT); otherwise a bag projection, each group's row repeated by its count.
    ``global_aggregate``: aggregates without GROUP BY (one row, even over no rows)."""

    sql: str
    atoms: tuple[AtomPlan, ...]
    keys: tuple[tuple[str, str], ...]  # free variables and their kinds
    components: tuple[Component, ...]
    aggregates: tuple[AggregatePlan, ...]
    outputs: tuple[OutputColumn, ...]
    having: Expr | None
    order: tuple[OrderKey, ...]
    limit: int | None
    offset: int
    grouped: bool
    global_aggregate: bool
    # free variables of the engine query that are not group-by keys: the arguments of
    # MIN/MAX/DISTINCT aggregates and the columns ``residual`` reads; the engine groups by
    # them too, and a read filters those groups by ``residual`` and collapses them
    hidden: tuple[str, ...] = ()
    residual: Expr | None = None
    subqueries: tuple[SubqueryPlan, ...] = ()
    # aggregate derived tables: (internal table name, its plan); an atom reads its rows
    derived: tuple[tuple[str, ViewPlan], ...] = ()

    @property
    def tables(self) -> tuple[str, ...]:
        """The base tables the view reads (its subqueries' and derived tables' included),
        each once."""
        own = [a.table for a in self.atoms if not a.table.startswith("#")]
        inner = [s.plan for s in self.subqueries] + [p for _, p in self.derived]
        return tuple(dict.fromkeys(own + [t for p in inner for t in p.tables]))

    @property
    def collapsed(self) -> bool:
        """Whether a read filters and collapses the engine's groups (hidden keys or a
        residual filter) or computes MIN/MAX/DISTINCT aggregates from their values (which
        may be those of a GROUP BY key, when nothing is hidden: ``MAX(k) ... GROUP BY k``)."""
        return (
            bool(self.hidden)
            or self.residual is not None
            or any(a.function in HIDDEN_AGGREGATES for a in self.aggregates)
        )

    @property
    def columns(self) -> tuple[str, ...]:
        """The output column names."""
        return tuple(o.name for o in self.outputs)

    def ring(self) -> Ring:
        """The payload ring: the count alone, or the product of the components."""
        if len(self.components) == 1:
            return self.components[0].ring()
        return ProductRing(
            *(c.ring() for c in self.components), names=[c.name for c in self.components]
        )

    def query(self) -> Query:
        """The engine query: one relation and atom per alias, the keys free."""
        relations = {a.alias: a.columns for a in self.atoms}
        atoms = [Atom(a.alias, a.variables, a.alias) for a in self.atoms]
        return Query(relations, self.ring(), tuple(v for v, _ in self.keys), atoms)

    def describe(self) -> str:
        """A readable account of the plan."""
        lines = ["atoms:"] + [f"  {a.describe()}" for a in self.atoms]
        lines.append(f"keys: {[v for v, _ in self.keys if v not in self.hidden]}")
        if self.hidden:
            lines.append(f"hidden keys (collapsed on read): {list(self.hidden)}")
        if self.residual is not None:
            lines.append(f"residual filter: {self.residual.sql()}")
        for table, plan in self.derived:
            lines.append(f"derived table {table}:")
            lines.extend("    " + line for line in plan.describe().splitlines())
        for i, sub in enumerate(self.subqueries):
            lines.append(f"subquery #s{i}: {sub.describe()}")
            lines.extend("    " + line for line in sub.plan.describe().splitlines())
        lines.append(
            "components: "
            + ", ".join(
                f"{c.name}=Σ{'·'.join(c.lifted) or '1'}{'' if c.integer else ' (real)'}"
                for c in self.components
            )
        )
        for a in self.aggregates:
            over = f" (over the hidden key {a.argument})" if a.argument else ""
            if a.argument_null:
                over += f" (NULL where {a.argument_null})"
            lines.append(f"{a.slot} = {a.text}{over}")
        lines.append(
            "outputs: " + ", ".join(f"{o.name}={o.expression.sql()}" for o in self.outputs)
        )
        if self.having is not None:
            lines.append(f"having: {self.having.sql()}")
        if self.order:
            lines.append(
                "order by: "
                + ", ".join(
                    f"{k.expression.sql()}{' DESC' if k.descending else ''}" for k in self.order
                )
            )
        if self.limit is not None or self.offset:
            lines.append(f"limit {self.limit} offset {self.offset}")
        return "\n".join(lines)
