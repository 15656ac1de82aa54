"""SQL text -> :class:`~ringml.sql.logical.ViewPlan` (sqlglot parses; this module binds names,
checks types and normalizes).

The SPJA core: SELECT-FROM-WHERE-GROUP BY-HAVING-ORDER BY-LIMIT over inner joins (comma,
``JOIN ... ON``, ``NATURAL JOIN``, ``USING``), table aliases and self-joins, derived tables
and CTEs without aggregates (inlined).  WHERE/ON conjuncts that are selections on one FROM
item or equalities between expressions of two items (joins: union-find of join terms, one
query variable per class) run in the engine; items joined by no equality form a Cartesian
product of connected pieces.  Group-by keys are expressions of one item (a constant groups
nothing; ``GROUP BY ()`` alone is one group of every row, as no GROUP BY; a key that can be
NULL holds its kind's fill there, and its NULL indicator is a key of its own).
``COUNT``/``SUM``/``AVG`` take expressions over any items: each argument is expanded into a
sum of products of per-item factors (NULLs tracked by a second such sum), so each distinct
product becomes one ring component.

Beyond SPJA (DBToaster's query class); every engine part is maintained incrementally by the
view's strategy, and what is read after it is kept per batch (:mod:`ringml.sql.residual`):

* ``MIN``/``MAX`` and ``COUNT``/``SUM``/``AVG(DISTINCT x)`` over an expression of one item:
  ``x`` becomes a *hidden key* -- the engine keeps the multiset of its values per group,
  exact under deletes -- and the output groups collapse the hidden keys (a nullable ``x``'s
  NULL indicator is hidden too, and the collapse skips its NULL groups).
* Any other WHERE conjunct over several items -- inequality and band joins, ``OR`` across
  tables, conditions on subqueries: its columns become hidden keys and the condition (the
  *residual* filter) selects the engine groups that count.  Two items joined by one
  inequality are instead two side views joined on read by prefix sums
  (:mod:`ringml.sql.rangejoin`).
* Subqueries in WHERE, SELECT and HAVING, each maintained as a view of its own
  (:class:`SubqueryPlan`) keyed by its correlated inner expressions and looked up per outer
  group: scalar subqueries with aggregates, uncorrelated or correlated by equalities and at
  most one inequality (a SUM/COUNT summed over the range by prefix sums); ``EXISTS``/``NOT
  EXISTS``, ``IN``/``NOT IN`` and ``op ALL``/``op ANY|SOME`` as row counts with the
  comparison as a correlation; ``IN`` over an uncorrelated grouped subquery as membership in
  its rows; FROM-less ``(SELECT SUM(c) WHERE cond)``.  A correlated inner side that can be
  NULL leaves its NULL rows out (they meet no outer value); ``IN``/``ANY``/``ALL`` then
  count them apart, for SQL's NULL where no other row decides.  An empty SUM or COUNT subquery is 0
  (ring semantics, as in DBToaster; ``dbtoaster_queries.gmr_sql`` is the SQL another database
  runs for the same answer), AVG/MIN/MAX NULL.
* Derived tables and CTEs with GROUP BY, HAVING or DISTINCT: a view of their own whose row
  changes feed one atom of the outer view.

Anything else (outer joins, window functions, set operations, MIN/MAX over several items,
subqueries correlated by several inequalities or outside WHERE/SELECT/HAVING, ...) raises a
:class:`SqlError` naming the construct and its position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .aggregates import Poly, expand
from .binder import Aggregates, Binder, Context, Item, Scope
from .catalog import Catalog
from .errors import SqlNameError, SqlSemanticError
from .expressions import (
    AggRef,
    Arith,
    Case,
    Cmp,
    Col,
    Expr,
    IsNull,
    Lit,
    Logic,
    SubqueryRef,
    comparable,
    fold,
)
from .logical import (
    COUNT,
    HIDDEN_AGGREGATES,
    AggregatePlan,
    AtomPlan,
    Component,
    OrderKey,
    OutputColumn,
    SubqueryPlan,
    ViewPlan,
)
from .parse import DIALECT, parse_select


def compile_view(sql: str, catalog: Catalog, noun: str = "view") -> ViewPlan:
    """Compile a SELECT over ``catalog``'s tables into a view plan (nothing is changed);
    errors say what is not supported in a ``noun`` (a view, a query)."""
    return _Compiler(sql, catalog, noun).compile()


@dataclass
class _Cte:
    """A CTE: its body, its column renames, and the CTEs visible inside its body (those
    defined before it and the enclosing statements'; not itself)."""

    body: Any
    names: list[str]
    scope: dict[str, _Cte]


@dataclass
class _AtomState:
    table: str
    node: Any
    filters: list[Expr] = field(default_factory=list)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Expr, Expr] = {}

    def __contains__(self, x: Expr) -> bool:
        return x in self.parent

    def find(self, x: Expr) -> Expr:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: Expr, b: Expr) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra

    def classes(self) -> dict[Expr, list[Expr]]:
        out: dict[Expr, list[Expr]] = {}
        for x in self.parent:
            out.setdefault(self.find(x), []).append(x)
        return out


# ------------------------------------------------------------------------------ compiler
class _Compiler(Binder):
    def __init__(
        self,
        text: str,
        catalog: Catalog,
        noun: str = "view",
        ctes: dict[str, _Cte] | None = None,
    ) -> None:
        super().__init__(text, catalog, noun)
        self.atoms: dict[str, _AtomState] = {}
        self.conjuncts: list[tuple[Expr, Any]] = []
        # the CTEs visible where the compiler is; they shadow catalog tables of their name
        self.ctes: dict[str, _Cte] = dict(ctes or {})
        self.joins = _UnionFind()
        self.variables: dict[Expr, str] = {}  # binding term -> variable
        self.factors: dict[Expr, str] = {}  # factor column -> variable
        self.keys: dict[str, str] = {}  # free variable -> kind
        self.key_terms: dict[Expr, str] = {}  # canonical term -> free variable
        self.null_keys: dict[str, str] = {}  # nullable key variable -> its NULL indicator's
        # the correlated inner expressions of the last subquery that can be NULL (by id)
        self.null_inners: set[int] = set()
        self.counter = 0
        self.residuals: list[tuple[Expr, Any]] = []  # WHERE conjuncts read after the engine
        self.subqueries: list[SubqueryPlan] = []
        self.derived_tables: list[tuple[str, ViewPlan]] = []  # aggregate derived tables

    def inner(self) -> _Compiler:
        """A compiler of a subquery or derived table of this text, seeing the CTEs visible
        here."""
        return _Compiler(self.text, self.catalog, self.noun, self.ctes)

    # ---------------------------------------------------------------- entry
    def compile(self, select: Any = None) -> ViewPlan:
        """The plan of ``select`` (default: the one SELECT of the text)."""
        e = self.exp
        top = select is None
        if top:
            select = parse_select(self.text)
        self.check_clauses(select)
        scope = self.from_clause(select, "")
        self.where(select, scope)
        self.bind_joins()

        group = select.args.get("group")
        grand_total = group is not None and _only_empty_grouping_sets(e, group)
        distinct = select.args.get("distinct") is not None
        has_aggregates = any(
            isinstance(n, e.AggFunc)
            for part in (
                select.expressions,
                [select.args.get("having")],
                [select.args.get("order")],
            )
            for root in part
            if root is not None
            for n in _walk_here(e, root)
        )
        has_having = select.args.get("having") is not None  # HAVING alone aggregates too
        grouped = bool(group) or has_aggregates or distinct or has_having
        # GROUP BY () groups every row into one group, as no GROUP BY with aggregates does
        global_aggregate = grand_total or ((has_aggregates or has_having) and not group)
        if distinct and (group or has_aggregates or has_having):
            raise self.unsupported(
                "DISTINCT over grouped or aggregated rows",
                select,
                "DISTINCT",
                "group by the output columns instead",
            )
        aggregates = Aggregates(global_aggregate)
        items = self.select_items(select, scope, aggregates if grouped else None)
        aliases = {name.lower(): ir for name, ir, _ in items}

        if group:
            self.group_keys(group, scope, items, aliases)
        if distinct:
            for _, ir, node in items:
                if isinstance(ir, Lit):  # one value: splits no group
                    continue
                if len(ir.sources()) != 1:
                    raise self.unsupported(
                        f"DISTINCT over {ir.sql()} (not an expression of one table)",
                        node,
                        construct="DISTINCT over several tables",
                    )
                self.add_key(ir)
        create = not grouped
        outputs = [OutputColumn(name, self.post(ir, create, node)) for name, ir, node in items]
        output_slots = {o.name.lower(): i for i, o in enumerate(outputs)}
        having = None
        if has_having:
            node = select.args["having"].this
            context = Context(scope, aggregates, "HAVING", aliases)
            having = self.post(self.condition(node, context, "HAVING"), False, node)
        order = self.order_by(
            select, scope, aggregates if grouped else None, create, aliases, output_slots
        )
        limit, offset = self.limit(select)
        visible = set(self.keys)
        # hidden keys before the aggregates' factor columns, whose names must not clash
        residual = None
        if self.residuals:
            parts = tuple(self.slots(ir) for ir, _ in self.residuals)
            residual = parts[0] if len(parts) == 1 else Logic("and", parts)
        aggregate_plans, components = self.aggregate_plans(aggregates)
        hidden = tuple(v for v in self.keys if v not in visible)
        atoms = self.atom_plans()
        return ViewPlan(
            sql=self.text if top else select.sql(dialect=DIALECT),
            atoms=atoms,
            keys=tuple(self.keys.items()),
            components=components,
            aggregates=aggregate_plans,
            outputs=tuple(_unique_names(outputs)),
            having=having,
            order=order,
            limit=limit,
            offset=offset,
            grouped=grouped,
            global_aggregate=global_aggregate,
            hidden=hidden,
            residual=residual,
            subqueries=tuple(self.subqueries),
            derived=tuple(self.derived_tables),
        )

    def slots(self, ir: Expr) -> Expr:
        """A residual condition over key slots: each column a (hidden) key."""
        if isinstance(ir, Col) and ir.source:
            return self.key_slot(self.add_key(ir), ir)
        return ir.map(self.slots)

    def check_clauses(self, select: Any) -> None:
        """Clauses outside the view class, by name."""
        e = self.exp
        for key, label in (
            ("qualify", "QUALIFY"),
            ("windows", "WINDOW"),
            ("sample", "TABLESAMPLE"),
            ("pivots", "PIVOT"),
            ("into", "SELECT INTO"),
            ("laterals", "LATERAL"),
            ("prewhere", "PREWHERE"),
            ("connect", "CONNECT BY"),
            ("settings", "SETTINGS"),
            ("locks", "FOR UPDATE"),
        ):
            if select.args.get(key):
                value = select.args[key]
                node = value[0] if isinstance(value, list) else value
                raise self.unsupported(label, node, label.split()[0])
        if select.args.get("kind"):
            raise self.unsupported(f"SELECT AS {select.args['kind']}", select, "SELECT")
        with_ = select.args.get("with_") or select.args.get("with")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise self.unsupported("WITH RECURSIVE", with_, "RECURSIVE")
            for cte in with_.expressions:
                names = [c.name for c in (cte.args.get("alias").columns or [])]
                self.ctes[cte.alias.lower()] = _Cte(cte.this, names, dict(self.ctes))
        for node in select.walk():
            if isinstance(node, e.Window):
                raise self.unsupported("a window function (OVER)", node, "OVER")
            if isinstance(node, (e.Subquery, e.Exists)) or (
                isinstance(node, e.Select) and node is not select
            ):
                parent = node.parent
                in_from = (
                    isinstance(parent, (e.From, e.Join))
                    or (
                        isinstance(node, e.Select)
                        and isinstance(parent, e.Subquery)
                        and isinstance(parent.parent, (e.From, e.Join))
                    )
                    or (isinstance(node, e.Select) and isinstance(parent, e.CTE))
                )
                if not in_from and not any(
                    _inside(node, clause, select)
                    for clause in [select.args.get("where"), select.args.get("having")]
                    + list(select.expressions)
                ):
                    body = next(
                        (p for p in _ancestors(node, select) if isinstance(p, (e.Select, e.CTE))),
                        None,
                    )
                    if body is None:
                        what = "a subquery outside FROM, WHERE, SELECT and HAVING"
                    elif isinstance(body, e.CTE) or isinstance(body.parent, e.CTE):
                        what = "a subquery inside a CTE (WITH name AS (SELECT ...))"
                    else:
                        what = "a subquery inside a derived table (FROM (SELECT ...))"
                    raise self.unsupported(what, node, "SELECT", construct="subquery")

    # ---------------------------------------------------------------- FROM
    def from_clause(self, select: Any, prefix: str) -> Scope:
        e = self.exp
        scope = Scope()
        from_ = select.args.get("from_") or select.args.get("from")
        if from_ is None:
            raise self.unsupported("SELECT without FROM", select, "SELECT")
        if from_.expressions:
            raise self.unsupported("several items in one FROM node", from_, "FROM")
        self.add_item(scope, from_.this, prefix)
        for join in select.args.get("joins") or []:
            side = (join.side or "").upper()
            kind = (join.kind or "").upper()
            method = (join.method or "").upper()
            if side:
                label = f"{side} JOIN" if side != "FULL" else "FULL JOIN"
                raise self.unsupported(
                    f"{side} OUTER JOIN",
                    join,
                    label.split()[0],
                    "only inner joins are maintained this way",
                    construct=f"{side} JOIN",
                )
            if kind not in ("", "INNER", "CROSS"):
                raise self.unsupported(f"{kind} JOIN", join, kind)
            if method not in ("", "NATURAL"):
                raise self.unsupported(f"{method} JOIN", join, method)
            if join.args.get("match_condition") is not None:
                raise self.unsupported("ASOF JOIN", join, "ASOF")
            left = list(scope.items)
            item = self.add_item(scope, join.this, prefix)
            using = [(u.name, u) for u in join.args.get("using") or []]
            if method == "NATURAL":
                visible = {c.lower() for i in left for c in i.columns}
                using = [(c, join) for c in item.columns if c.lower() in visible]
            for name, where in using:
                self.using_column(scope, left, item, name, where)
            on = join.args.get("on")
            if on is not None:
                if kind == "CROSS":
                    raise self.unsupported("CROSS JOIN ... ON", on, "ON")
                for conjunct in _conjuncts(e, on):
                    context = Context(scope, None, "ON")
                    self.conjuncts.append((self.condition(conjunct, context, "ON"), conjunct))
            elif not using and kind == "INNER":
                raise SqlSemanticError("JOIN needs ON or USING", self.pos(join), "JOIN")
        return scope

    def using_column(self, scope: Scope, left: list[Item], item: Item, name: str, node):
        right_name = item.find(name)
        holders = [i for i in left if i.find(name)]
        if right_name is None or not holders:
            side = item.alias if right_name is None else "the left side"
            raise SqlNameError(
                f"USING column {name!r} is not a column of {side}", self.pos(node), name
            )
        key = name.lower()
        merged = scope.merged.get(key, set())
        if len(holders) > 1 and not {h.alias for h in holders} <= merged:
            raise SqlNameError(
                f"USING column {name!r} is ambiguous on the left side",
                self.pos(node),
                name,
            )
        left_expr = holders[0].columns[holders[0].find(name)]
        right_expr = item.columns[right_name]
        comparable(left_expr, right_expr, f"USING ({name})", self.pos(node))
        self.conjuncts.append((Cmp("=", left_expr, right_expr), node))
        scope.merged[key] = merged | {h.alias for h in holders} | {item.alias}

    def add_item(self, scope: Scope, node: Any, prefix: str) -> Item:
        e = self.exp
        alias_node = node.args.get("alias")
        alias = node.alias if alias_node is not None else ""
        renames = [c.name for c in (alias_node.columns if alias_node is not None else []) or []]
        if isinstance(node, e.Table):
            if node.args.get("db") or node.args.get("catalog"):
                pass  # schema-qualified names resolve in the one catalog
            name = node.name
            if not name:
                raise self.unsupported(f"a table function ({node.sql(dialect=DIALECT)})", node)
            cte = self.ctes.get(name.lower())
            if cte is not None:
                item = self.derived(
                    cte.body, alias or name, prefix, renames or cte.names, node, cte.scope
                )
            else:
                schema = self.catalog.find(name)
                if schema is None:
                    raise SqlNameError(
                        f"unknown table {name!r}; the catalog has {sorted(self.catalog)}",
                        self.pos(node),
                        name,
                    )
                alias = alias or schema.name
                engine_alias = prefix + alias
                columns = {
                    c: Col(engine_alias, c, k, c in schema.nullable)
                    for c, k in zip(schema.columns, schema.types, strict=True)
                }
                if renames:
                    columns = _rename(columns, renames, alias, self.pos(node))
                item = Item(alias, columns, node)
                self.register_atom(engine_alias, schema.name, node)
        elif isinstance(node, e.Subquery):
            body = node.this
            if not isinstance(body, e.Select):
                raise self.unsupported(f"{type(body).__name__.upper()} in FROM", body)
            alias = alias or f"subquery{len(scope.items)}"
            item = self.derived(body, alias, prefix, renames, node)
        else:
            raise self.unsupported(f"{type(node).__name__} in FROM", node)
        if scope.item(item.alias) is not None:
            raise SqlSemanticError(
                f"duplicate alias {item.alias!r} in FROM; name each "
                "occurrence of a table differently",
                self.pos(node),
                item.alias,
            )
        scope.items.append(item)
        return item

    def register_atom(self, alias: str, table: str, node: Any) -> None:
        if alias in self.atoms:
            raise SqlSemanticError(f"duplicate alias {alias!r}", self.pos(node), alias)
        self.atoms[alias] = _AtomState(table, node)

    def derived(
        self,
        body: Any,
        alias: str,
        prefix: str,
        renames: list[str],
        node,
        ctes: dict[str, _Cte] | None = None,
    ) -> Item:
        """``derived_item`` with the CTEs visible in ``body``: ``ctes`` (a CTE's), else
        those visible here; the body's own WITH does not leak out."""
        outer = self.ctes
        self.ctes = dict(outer if ctes is None else ctes)
        try:
            return self.derived_item(body, alias, prefix, renames, node)
        finally:
            self.ctes = outer

    def derived_item(self, body: Any, alias: str, prefix: str, renames: list[str], node) -> Item:
        """A derived table or CTE.  Without aggregates it is inlined: its FROM items become
        atoms named ``alias.inner``, its WHERE joins the view's, its SELECT list its
        columns.  With GROUP BY (aggregates, HAVING) or DISTINCT it is a view of its own,
        maintained by the same strategy, whose row changes feed one atom of this view."""
        e = self.exp
        for key, label in (("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET")):
            if body.args.get(key):
                raise self.unsupported(
                    f"a derived table with {label}",
                    body.args[key],
                    label.split()[0],
                    construct=f"derived table with {label}",
                )
        aggregate = next(
            (n for x in body.expressions for n in _walk_here(e, x) if isinstance(n, e.AggFunc)),
            None,
        )
        if body.args.get("group") or body.args.get("distinct") or body.args.get("having"):
            return self.aggregate_table(body, alias, prefix, renames, node)
        if aggregate is not None:
            raise self.unsupported(
                "a derived table with aggregates but no GROUP BY",
                aggregate,
                hint="group it, or aggregate in the outer query",
                construct="derived table with aggregates but no GROUP BY",
            )
        self.check_clauses(body)
        inner = self.from_clause(body, f"{prefix}{alias}.")
        self.where(body, inner)
        columns: dict[str, Expr] = {}
        for name, ir, _ in self.select_items(body, inner, None):
            columns.setdefault(name, ir)
        if renames:
            columns = _rename(columns, renames, alias, self.pos(node))
        return Item(alias, columns, node)

    def aggregate_table(self, body: Any, alias: str, prefix: str, renames, node) -> Item:
        plan = self.inner().compile(body.copy())
        table = f"#d{len(self.derived_tables)}"
        self.derived_tables.append((table, plan))
        engine_alias = prefix + alias
        columns = {
            o.name: Col(
                engine_alias,
                o.name,
                "int" if o.expression.kind == "null" else o.expression.kind,
                o.expression.nullable,
            )
            for o in plan.outputs
        }
        if renames:
            columns = _rename(columns, renames, alias, self.pos(node))
        self.register_atom(engine_alias, table, node)
        return Item(alias, columns, node)

    # ---------------------------------------------------------------- subqueries
    def scalar_subquery(self, select: Any, node: Any, context: Context) -> Expr:
        """``(SELECT agg FROM ... WHERE ...)``: a maintained view keyed by the correlated
        inner expressions; FROM-less ``(SELECT SUM(c) WHERE cond)`` is ``CASE WHEN cond
        THEN c ELSE 0 END``."""
        e = self.exp
        select = _unwrap(e, select)
        if not isinstance(select, e.Select):
            raise self.unsupported(f"{type(select).__name__.upper()} as a subquery", node)
        if len(select.expressions) != 1:
            raise self.unsupported("a scalar subquery with several columns", node, "SELECT")
        value = _unaliased(e, select.expressions[0])
        if (select.args.get("from_") or select.args.get("from")) is None:
            return self.fromless(select, value, node, context)
        for key in ("group", "having", "order", "limit", "distinct"):
            if select.args.get(key):
                raise self.unsupported(
                    f"a scalar subquery with {key.upper()}",
                    select.args[key],
                    construct=f"scalar subquery with {key.upper()}",
                )
        if not any(isinstance(n, e.AggFunc) for n in value.walk()):
            raise self.unsupported(
                "a scalar subquery without an aggregate",
                node,
                "SELECT",
                construct="scalar subquery without an aggregate",
            )
        return self.subquery(select, value, [], node, context)

    def fromless(self, select: Any, value: Any, node: Any, context: Context) -> Expr:
        e = self.exp
        constant = None
        if isinstance(value, e.Count) and (
            value.this is None or isinstance(value.this, (e.Star, e.Literal))
        ):
            constant = Lit(1, "int")
        elif isinstance(value, e.Sum) and isinstance(value.this, e.Literal):
            constant = fold(self.expr(value.this, context))
        if not isinstance(constant, Lit) or constant.type not in ("int", "float"):
            raise self.unsupported(
                "a subquery without FROM other than SELECT SUM(constant) or COUNT(*)",
                node,
                "SELECT",
                construct="subquery without FROM",
            )
        where = select.args.get("where")
        if where is None:
            return constant
        cond = self.condition(where.this, context, "WHERE")
        return Case(((cond, constant),), Lit(0, constant.type), constant.type)

    def exists_subquery(self, select: Any, node: Any, context: Context) -> Expr:
        """``EXISTS (...)``: the subquery's row count per correlation key is positive."""
        select = self.plain_subquery(select, node, "EXISTS", columns=None)
        count = self.subquery(select, self.exp.Count(this=self.exp.Star()), [], node, context)
        return Cmp(">", count, Lit(0, "int"))

    def in_subquery(self, node: Any, context: Context) -> Expr:
        """``x IN (SELECT y ...)``: EXISTS with the correlation ``y = x``; a subquery with
        GROUP BY, HAVING, DISTINCT or aggregates (uncorrelated) is a maintained view whose
        first column is looked up."""
        e = self.exp
        self.refuse_aggregate_operand(node, "IN", context)
        select = _unwrap(e, node.args["query"])
        grouped = isinstance(select, e.Select) and (
            any(select.args.get(k) for k in ("group", "having", "distinct"))
            or any(isinstance(n, e.AggFunc) for x in select.expressions for n in x.walk())
        )
        if grouped:
            return self.membership(select, node, context)
        select = self.plain_subquery(select, node, "IN", columns=1)
        inner = _unaliased(e, select.expressions[0])
        count = self.subquery(
            select, e.Count(this=e.Star()), [(inner, "=", node.this)], node, context
        )
        found = Cmp(">", count, Lit(0, "int"))
        if id(inner) in self.null_inners:
            found = self.null_inner(found, True, select, context)
        return self.null_operand(found, select, node, context, False)

    def null_inner(self, decides: Expr, value: bool, select: Any, context: Context) -> Expr:
        """``x op ANY/ALL (SELECT y ...)`` whose ``y`` can be NULL: ``value`` where its
        non-NULL rows decide it (``decides``), else NULL if some ``y`` is, else ``not
        value``."""
        star = self.exp.Count(this=self.exp.Star())
        rows = self.subquery(self.null_rows(select), star, [], select, context)
        some = Cmp(">", rows, Lit(0, "int"))
        whens = ((decides, Lit(value, "bool")), (some, Lit(None, "bool")))
        return Case(whens, Lit(not value, "bool"), "bool")

    def null_rows(self, select: Any) -> Any:
        """``select`` keeping only its rows whose (one) output is NULL."""
        e = self.exp
        nulls = select.copy()
        where = nulls.args.get("where")
        null = e.Is(this=_unaliased(e, nulls.expressions[0]).copy(), expression=e.Null())
        nulls.set("where", e.Where(this=e.and_(where.this.copy(), null) if where else null))
        return nulls

    def refuse_aggregate_operand(self, node: Any, word: str, context: Context) -> None:
        """``x IN / op ALL|ANY (subquery)`` in HAVING with an aggregate in ``x``: refused
        (the subquery's rows are matched before the aggregation; a GROUP BY key works)."""
        if context.clause == "HAVING" and any(
            isinstance(n, self.exp.AggFunc) for n in node.this.walk()
        ):
            raise self.unsupported(
                f"{word} (subquery) in HAVING over the aggregate {node.this.sql(dialect=DIALECT)}",
                node,
                word,
                hint="compare in an outer query: SELECT ... FROM (the grouped query) WHERE ...",
                construct=f"{word} (subquery) in HAVING",
            )

    def quantified_subquery(self, op: str, node: Any, context: Context) -> Expr:
        """``x op ALL/ANY (SELECT y ...)``: no row with ``NOT (x op y)`` / some row with
        ``x op y`` -- a count with that inequality as a correlation; ``= ALL`` / ``<> ANY``:
        the rows equal to ``x`` are all / not all the rows."""
        e = self.exp
        quantifier = node.expression
        every = isinstance(quantifier, e.All)
        word = "ALL" if every else "ANY"
        self.refuse_aggregate_operand(node, word, context)
        select = self.plain_subquery(_unwrap(e, quantifier.this), node, word, columns=1)
        inner = _unaliased(e, select.expressions[0])
        if op == "=" and not every or op == "<>" and every:
            condition = "="  # IN / NOT IN
        elif op in ("=", "<>"):  # = ALL: every row equals x; <> ANY: some row differs
            star = e.Count(this=e.Star())
            rows = self.subquery(select, star, [], node, context)
            equal = self.subquery(select, star.copy(), [(inner, "=", node.this)], node, context)
            plain = Cmp("=" if every else "<", equal, rows)
            if id(inner) not in self.null_inners:
                return self.null_operand(plain, select, node, context, every)
            # a row that differs from x is neither equal nor NULL: = ALL is FALSE there,
            # <> ANY TRUE; else NULL if a row is NULL
            nulls = self.subquery(self.null_rows(select), star.copy(), [], node, context)
            differs = Cmp("<", equal, Arith("-", rows, nulls))
            whens = (
                (differs, Lit(not every, "bool")),
                (Cmp(">", nulls, Lit(0, "int")), Lit(None, "bool")),
            )
            found = Case(whens, Lit(every, "bool"), "bool")
            return self.null_operand(found, select, node, context, every)
        else:
            condition = _NEGATE[op] if every else op
        # ``x condition y`` is ``y flipped x``: the inner side first
        count = self.subquery(
            select, e.Count(this=e.Star()), [(inner, _FLIP[condition], node.this)], node, context
        )
        found = Cmp("=" if every else ">", count, Lit(0, "int"))
        if id(inner) in self.null_inners:
            # ALL: a row with NOT (x op y) makes it FALSE; ANY: a row with x op y TRUE
            decides = Cmp(">", count, Lit(0, "int"))
            found = self.null_inner(decides, not every, select, context)
        return self.null_operand(found, select, node, context, every)

    def null_operand(self, found: Expr, select: Any, node: Any, context: Context, empty: bool):
        """``x IN / op ALL / op ANY (select)``: ``found`` where ``x`` (``node.this``) is not
        NULL; where it is, NULL -- ``empty`` when the subquery has no row."""
        x = self.expr(node.this, Context(context.scope, None, "WHERE"))
        if not x.nullable:
            return found
        rows = self.subquery(select, self.exp.Count(this=self.exp.Star()), [], node, context)
        some = Cmp(">", rows, Lit(0, "int"))
        unknown = Case(((some, Lit(None, "bool")),), Lit(empty, "bool"), "bool")
        return Case(((IsNull(x), unknown),), found, "bool")

    def plain_subquery(self, select: Any, node: Any, word: str, columns: int | None) -> Any:
        e = self.exp
        select = _unwrap(e, select)
        if (
            not isinstance(select, e.Select)
            or (select.args.get("from_") or select.args.get("from")) is None
        ):
            raise self.unsupported(f"{word} over a subquery without FROM", node, word)
        if columns is not None and len(select.expressions) != columns:
            raise self.unsupported(f"{word} (subquery) with several columns", node, word)
        for key in ("group", "having", "distinct", "order", "limit"):
            if select.args.get(key):
                raise self.unsupported(
                    f"{word} (subquery with {key.upper()})",
                    select.args[key],
                    word,
                    construct=f"{word} subquery with {key.upper()}",
                )
        if any(isinstance(n, e.AggFunc) for x in select.expressions for n in x.walk()):
            raise self.unsupported(f"{word} (subquery with an aggregate)", node, word)
        return select

    def membership(self, select: Any, node: Any, context: Context) -> Expr:
        e = self.exp
        if len(select.expressions) != 1:
            raise self.unsupported("IN (subquery) with several columns", node, "IN")
        if self.correlations(select)[1]:
            raise self.unsupported(
                "a correlated IN (subquery) with GROUP BY, HAVING, DISTINCT or aggregates",
                node,
                "IN",
                construct="correlated grouped IN subquery",
            )
        plan = self.inner().compile(select.copy())
        x = self.expr(node.this, Context(context.scope, None, "WHERE"))
        comparable(x, _output_expr(plan, 0), "IN (subquery)", self.pos(node))
        text = select.sql(dialect=DIALECT)
        self.subqueries.append(SubqueryPlan(plan, "in", 0, None, None, text))
        del e
        nulls = x.nullable or _output_expr(plan, 0).nullable  # three-valued membership
        return SubqueryRef(len(self.subqueries) - 1, (x,), "bool", nulls, text)

    def correlations(self, select: Any) -> tuple[list, list]:
        """The conjuncts of ``select``'s WHERE without and with columns of the outer query
        (columns inside nested subqueries are theirs to resolve)."""
        e = self.exp
        inner = self.inner_names(select)
        where = select.args.get("where")
        local, correlated = [], []
        for conjunct in _conjuncts(e, where.this) if where is not None else []:
            (correlated if self.outer_columns(conjunct, inner) else local).append(conjunct)
        for part in (select.expressions, [select.args.get("group"), select.args.get("having")]):
            for root in part:
                if root is not None and self.outer_columns(root, inner):
                    raise self.unsupported(
                        "a correlated column outside the subquery's WHERE",
                        self.outer_columns(root, inner)[0],
                        construct="correlated column outside WHERE",
                    )
        return local, correlated

    def inner_names(self, select: Any) -> tuple[set[str], set[str]]:
        """The aliases of ``select``'s FROM items and the columns of its tables and CTEs."""
        e = self.exp
        from_ = select.args.get("from_") or select.args.get("from")
        items = [from_.this] + [j.this for j in select.args.get("joins") or []]
        with_ = select.args.get("with_") or select.args.get("with")
        ctes = {k: c.names or c.body.named_selects for k, c in self.ctes.items()}
        for cte in with_.expressions if with_ is not None else []:
            renames = [c.name for c in (cte.args.get("alias").columns or [])]
            ctes[cte.alias.lower()] = renames or cte.this.named_selects
        aliases, columns = set(), set()
        for item in items:
            aliases.add((item.alias or item.name).lower())
            if isinstance(item, e.Table) and item.name.lower() in ctes:
                columns |= {c.lower() for c in ctes[item.name.lower()]}
            elif isinstance(item, e.Table):
                schema = self.catalog.find(item.name)
                if schema is not None:
                    columns |= {c.lower() for c in schema.columns}
            elif isinstance(item, e.Subquery) and isinstance(item.this, e.Select):
                columns |= {x.alias_or_name.lower() for x in item.this.expressions}
        return aliases, columns

    def outer_columns(self, node: Any, inner: tuple[set[str], set[str]]) -> list:
        e = self.exp
        aliases, columns = inner
        out = []
        for column in node.find_all(e.Column):
            if isinstance(column.this, e.Star):
                continue
            if any(isinstance(p, (e.Select, e.Subquery)) for p in _ancestors(column, node)):
                continue
            table = column.table.lower()
            if (table and table not in aliases) or (
                not table and column.name.lower() not in columns
            ):
                out.append(column)
        return out

    def subquery(
        self, select: Any, value: Any, extra: list, node: Any, context: Context
    ) -> SubqueryRef:
        """A maintained view of ``select`` grouped by its correlated inner expressions
        (equalities; one inequality at most), with ``value`` as ``__v`` and its row count
        as ``__n``; ``extra``: correlations ``(inner, op, outer)`` to add."""
        e = self.exp
        local, correlated = self.correlations(select)
        inner_names = self.inner_names(select)
        pairs = []
        for conjunct in correlated:
            pairs.append(self.correlation(conjunct, inner_names))
        pairs.extend(extra)
        equalities = [(i, o) for i, op, o in pairs if op == "="]
        inequalities = [(i, op, o) for i, op, o in pairs if op != "="]
        if len(inequalities) > 1:
            raise self.unsupported(
                "a subquery correlated by several inequalities",
                node,
                "SELECT",
                construct="subquery correlated by several inequalities",
            )
        if inequalities and not (
            isinstance(value, (e.Sum, e.Count)) and not isinstance(value.this, e.Distinct)
        ):
            raise self.unsupported(
                f"an inequality-correlated subquery of {value.sql(dialect=DIALECT)} "
                "(only one SUM or COUNT is summed over a range)",
                node,
                "SELECT",
                construct="inequality-correlated subquery other than SUM/COUNT",
            )
        inners = [i for i, _ in equalities] + [i for i, _, _ in inequalities]
        keys = [i.copy() for i in inners]
        names = [f"__k{j}" for j in range(len(equalities))] + ["__r"] * len(inequalities)
        sub = select.copy()

        def compile_sub(keys: list, local: list) -> ViewPlan:
            sub.set(
                "expressions",
                [e.alias_(k, n) for k, n in zip(keys, names, strict=True)]
                + [e.alias_(value.copy(), "__v"), e.alias_(e.Count(this=e.Star()), "__n")],
            )
            sub.set("where", e.Where(this=e.and_(*[c.copy() for c in local])) if local else None)
            sub.set("group", e.Group(expressions=[k.copy() for k in keys]) if keys else None)
            return self.inner().compile(sub)

        plan = compile_sub(keys, local)
        nullable = [j for j in range(len(inners)) if _output_expr(plan, j).nullable]
        for j in nullable:
            if _output_expr(plan, j).kind == "null":  # NULL itself: no group would be read
                raise self.unsupported(
                    f"a subquery correlated by {inners[j].sql(dialect=DIALECT)}, which is NULL",
                    inners[j],
                    construct="correlation by a nullable expression",
                )
        if nullable:
            # a comparison with NULL holds for no outer value: the rows whose inner side is
            # NULL are left out, and the key reads the inner side as never NULL
            for j in nullable:
                fill = e.maybe_parse(_NULL_FILL[_output_expr(plan, j).kind], dialect=DIALECT)
                keys[j] = e.Coalesce(this=keys[j], expressions=[fill])
            present = [
                e.Not(this=e.Is(this=inners[j].copy(), expression=e.Null())) for j in nullable
            ]
            plan = compile_sub(keys, local + present)
        self.null_inners = {id(inners[j]) for j in nullable}
        outer_context = Context(context.scope, None, "WHERE")
        args = []
        for _, op, outer in [(i, "=", o) for i, o in equalities] + inequalities:
            x = self.expr(outer, outer_context)
            comparable(_output_expr(plan, len(args)), x, f"the correlation {op}", self.pos(outer))
            args.append(x)
        slot = len(keys)
        kind = _output_expr(plan, slot).kind
        kind = "int" if kind == "null" else kind
        default = _empty_value(plan, slot)
        text = select.sql(dialect=DIALECT)
        self.subqueries.append(
            SubqueryPlan(
                plan,
                "value",
                len(equalities),
                inequalities[0][1] if inequalities else None,
                default,
                text,
            )
        )
        nulls = default is None or _output_expr(plan, slot).nullable
        return SubqueryRef(len(self.subqueries) - 1, tuple(args), kind, nulls, text)

    def correlation(self, conjunct: Any, inner: tuple[set[str], set[str]]) -> tuple:
        """``(inner side, op, outer side)`` of a correlated comparison (op read as
        ``inner op outer``)."""
        e = self.exp
        compare = {e.EQ: "=", e.LT: "<", e.LTE: "<=", e.GT: ">", e.GTE: ">="}
        node = _unwrap(e, conjunct)
        if type(node) in compare:
            left_outer = bool(self.outer_columns(node.this, inner))
            right_outer = bool(self.outer_columns(node.expression, inner))
            left_inner = _reads_columns(e, node.this) and not left_outer
            right_inner = _reads_columns(e, node.expression) and not right_outer
            op = compare[type(node)]
            if right_outer and left_inner and not self.outer_columns(node.this, inner):
                return node.this, op, node.expression
            if left_outer and right_inner:
                return node.expression, _FLIP[op], node.this
        if isinstance(node, e.NEQ):
            raise self.unsupported(
                f"a subquery correlated by <> (not equal), as in {conjunct.sql(dialect=DIALECT)},",
                conjunct,
                hint="correlations by =, <, <=, > and >= are",
                construct="correlation by <>",
            )
        raise self.unsupported(
            f"the correlated condition {conjunct.sql(dialect=DIALECT)} (a subquery may be "
            "correlated by comparisons of an inner and an outer expression)",
            conjunct,
            construct="correlated condition",
        )

    # ---------------------------------------------------------------- WHERE and joins
    def where(self, select: Any, scope: Scope) -> None:
        node = select.args.get("where")
        if node is None:
            return
        for conjunct in _conjuncts(self.exp, node.this):
            context = Context(scope, None, "WHERE")
            self.conjuncts.append((self.condition(conjunct, context, "WHERE"), conjunct))

    def bind_joins(self) -> None:
        """Each conjunct is a selection on one atom or a join equality (union-find)."""
        first = next(iter(self.atoms))
        for ir, node in self.conjuncts:
            if any(isinstance(n, SubqueryRef) for n in ir.walk()):
                self.residuals.append((ir, node))
                continue
            sources = ir.sources()
            if len(sources) <= 1:
                folded = fold(ir)
                if isinstance(folded, Lit) and folded.value is True:
                    continue
                self.atoms[next(iter(sources)) if sources else first].filters.append(ir)
                continue
            if isinstance(ir, Cmp) and ir.op == "=":
                left, right = ir.left.sources(), ir.right.sources()
                if len(left) == 1 and len(right) == 1 and left != right:
                    for side in (ir.left, ir.right):
                        if side.nullable:  # NULL joins nothing
                            self.atoms[next(iter(side.sources()))].filters.append(
                                IsNull(side, True)
                            )
                    self.joins.union(ir.left, ir.right)
                    continue
            # inequality and band joins, OR across tables, ...: the columns become hidden
            # keys of the engine's groups, the condition filters them on read
            self.residuals.append((ir, node))

    def canonical(self, term: Expr) -> Expr:
        """``term`` with joined sub-terms replaced by their class representative."""
        if term in self.joins:
            return self.joins.find(term)
        return term.map(self.canonical)

    def variable(self, term: Expr) -> str:
        """The query variable a single-atom term binds (its join class's, if joined)."""
        root = self.joins.find(term) if term in self.joins else term
        if root not in self.variables:
            alias = next(iter(root.sources()))
            if isinstance(root, Col):
                name = f"{alias}.{root.name}"
            else:
                self.counter += 1
                name = f"{alias}.#{self.counter}"
            self.variables[root] = name
        var = self.variables[root]
        self.variables.setdefault(term, var)
        return var

    # ---------------------------------------------------------------- SELECT list
    def select_items(self, select: Any, scope: Scope, aggregates: Aggregates | None):
        """``(name, expression, node)`` per output column (``*`` expanded)."""
        e = self.exp
        out = []
        for node in select.expressions:
            if isinstance(node, e.Star) or (
                isinstance(node, e.Column) and isinstance(node.this, e.Star)
            ):
                if node.args.get("except") or node.args.get("replace") or node.args.get("rename"):
                    raise self.unsupported("* EXCEPT/REPLACE", node, "EXCEPT")
                table = node.table if isinstance(node, e.Column) else ""
                items = scope.items
                if table:
                    item = scope.item(table)
                    if item is None:
                        raise SqlNameError(
                            f"unknown table alias {table!r} in {table}.*", self.pos(node), table
                        )
                    items = [item]
                seen: set[str] = set()
                for item in items:
                    for name, ir in item.columns.items():
                        key = name.lower()
                        if not table and key in scope.merged and item.alias in scope.merged[key]:
                            if key in seen:
                                continue
                            seen.add(key)
                        out.append((name, ir, node))
                continue
            context = Context(scope, aggregates, "SELECT")
            inner = node.this if isinstance(node, e.Alias) else node
            ir = self.expr(inner, context)
            if isinstance(node, e.Alias):
                name = node.alias
            elif isinstance(inner, e.Column):
                name = inner.name
            else:
                name = inner.sql(dialect=DIALECT)
            out.append((name, ir, node))
        return out

    # ---------------------------------------------------------------- GROUP BY
    def group_keys(self, group: Any, scope: Scope, items, aliases) -> None:
        for key in ("rollup", "cube", "grouping_sets", "totals"):
            if group.args.get(key):
                raise self.unsupported(key.replace("_", " ").upper(), group, "GROUP")
        for node in group.expressions:
            if _is_empty_grouping_set(self.exp, node):  # splits no group
                continue
            ir = self.group_expression(node, scope, items, aliases)
            if any(isinstance(n, AggRef) for n in ir.walk()):
                raise SqlSemanticError(
                    "GROUP BY cannot hold an aggregate", self.pos(node), "GROUP BY"
                )
            if isinstance(ir, Lit):  # one value: splits no group
                continue
            if len(ir.sources()) != 1:
                raise self.unsupported(
                    f"GROUP BY {ir.sql()} (the key must be an expression of one table)",
                    node,
                    construct="GROUP BY over several tables",
                )
            self.add_key(ir)

    def group_expression(self, node: Any, scope: Scope, items, aliases) -> Expr:
        e = self.exp
        negative = _negative_ordinal(e, node)
        if negative is not None:  # out of range, as DuckDB says (not a constant)
            raise SqlSemanticError(
                f"GROUP BY {negative}: there are {len(items)} output columns",
                self.pos(node),
                negative,
            )
        if isinstance(node, e.Literal) and node.is_int:  # an ordinal (2.0 is a constant)
            k = int(node.this)
            if not 1 <= k <= len(items):
                raise SqlSemanticError(
                    f"GROUP BY {k}: there are {len(items)} output columns", self.pos(node), str(k)
                )
            return items[k - 1][1]
        return self.expr(node, Context(scope, None, "GROUP BY", aliases))

    def add_key(self, ir: Expr) -> str:
        """The key variable of ``ir``; one that can be NULL holds its kind's fill there, and
        a second key, ``ir IS NULL``, tells those rows apart."""
        canonical = self.canonical(ir)
        if canonical in self.key_terms:
            return self.key_terms[canonical]
        var = self.variable(ir)
        self.keys.setdefault(var, ir.kind)
        self.key_terms[canonical] = var
        if ir.nullable:
            self.null_keys[var] = self.add_key(IsNull(ir))
        return var

    def key_slot(self, var: str, ir: Expr) -> Expr:
        """The value of ``ir``'s key ``var`` after aggregation (NULL where it was)."""
        slot = Col("", var, ir.kind)
        if var not in self.null_keys:
            return slot
        null = Col("", self.null_keys[var], "bool")
        return Case(((null, Lit(None, ir.kind)),), slot, ir.kind)

    def post(self, ir: Expr, create: bool, node: Any) -> Expr:
        """``ir`` over result slots: aggregates, keys (created in a bag projection)."""
        if isinstance(ir, AggRef):
            return Col("", f"#a{ir.index}", ir.type, ir.nulls, ir.text)
        if isinstance(ir, Lit):
            return ir
        if any(isinstance(n, SubqueryRef) for n in ir.walk()):  # read after the engine
            return ir.map(lambda child: self.post(child, create, node))
        has_aggregate = any(isinstance(n, AggRef) for n in ir.walk())
        sources = ir.sources()
        if not has_aggregate and len(sources) == 1:
            var = self.key_terms.get(self.canonical(ir))
            # a nullable expression is computed from its parts' keys, unless it is a column
            if var is None and create and (not ir.nullable or isinstance(ir, Col)):
                var = self.add_key(ir)
            if var is not None:
                return self.key_slot(var, ir)
        if isinstance(ir, Col):
            raise SqlSemanticError(
                f"column {ir.sql()} must appear in GROUP BY or be inside an aggregate",
                self.pos(node),
                ir.name,
            )
        return ir.map(lambda child: self.post(child, create, node))

    # ---------------------------------------------------------------- ORDER BY, LIMIT
    def order_by(self, select, scope, aggregates, create, aliases, outputs) -> tuple:
        e = self.exp
        order = select.args.get("order")
        if order is None:
            return ()
        keys = []
        for ordered in order.expressions:
            node = ordered.this
            negative = _negative_ordinal(e, node)
            if negative is not None:
                raise SqlSemanticError(
                    f"ORDER BY {negative}: there are {len(outputs)} output columns",
                    self.pos(node),
                    negative,
                )
            if isinstance(node, e.Literal) and not node.is_string and not node.is_int:
                raise SqlSemanticError(
                    f"ORDER BY {node.this}: a non-integer constant orders nothing",
                    self.pos(node),
                    node.this,
                )
            if isinstance(node, e.Literal) and not node.is_string:
                k = int(node.this)
                if not 1 <= k <= len(outputs):
                    raise SqlSemanticError(
                        f"ORDER BY {k}: there are {len(outputs)} output columns",
                        self.pos(node),
                        str(k),
                    )
                slot = Col("", f"#o{k - 1}", "null")
                expression = slot
            elif isinstance(node, e.Column) and not node.table and node.name.lower() in outputs:
                expression = Col("", f"#o{outputs[node.name.lower()]}", "null")
            else:
                context = Context(scope, aggregates, "ORDER BY", aliases)
                expression = self.post(self.expr(node, context), create, node)
            nulls_first = bool(ordered.args.get("nulls_first"))
            if not ordered.args.get("desc") and ordered.args.get("nulls_first") is None:
                nulls_first = False
            keys.append(OrderKey(expression, bool(ordered.args.get("desc")), nulls_first))
        return tuple(keys)

    def limit(self, select) -> tuple[int | None, int]:
        e = self.exp
        values = []
        for key in ("limit", "offset"):
            node = select.args.get(key)
            if node is None:
                values.append(None)
                continue
            value = node.args.get("expression")
            if isinstance(node, e.Fetch) or node.args.get("percent"):
                raise self.unsupported(f"{key.upper()} ... PERCENT / FETCH", node, key.upper())
            if not (isinstance(value, e.Literal) and not value.is_string and value.this.isdigit()):
                raise self.unsupported(
                    f"{key.upper()} that is not a non-negative integer", node, key.upper()
                )
            values.append(int(value.this))
        return values[0], values[1] or 0

    # ---------------------------------------------------------------- aggregates
    def aggregate_plans(self, aggregates: Aggregates):
        """Aggregates as sums of components; components in first-use order, the row count
        first."""
        components: dict[tuple[str, ...], Component] = {(): Component(COUNT, (), True)}
        plans = []

        def terms(poly: Poly, node) -> tuple:
            out: dict[str, Any] = {}
            for monomial, coefficient in poly.items():
                name = self.component(monomial, components, node).name
                out[name] = out.get(name, 0) + coefficient
            return tuple((c, name) for name, c in out.items() if c != 0)

        hidden = {  # first: their keys take the plain variable names
            i: self.hidden_aggregate(f"#a{i}", function, argument, node, node.sql(dialect=DIALECT))
            for i, (function, argument, node) in enumerate(aggregates.calls)
            if function in HIDDEN_AGGREGATES
        }
        for i, (function, argument, node) in enumerate(aggregates.calls):
            slot = f"#a{i}"
            text = node.sql(dialect=DIALECT)
            if i in hidden:
                plans.append(hidden[i])
                continue
            if argument is None:
                plans.append(AggregatePlan(slot, "count", ((1, COUNT),), None, "int", text))
                continue
            value, nonnull = expand(
                argument,
                lambda what, construct, at=node: self.unsupported(what, at, construct=construct),
            )
            counted = terms(nonnull, node) if argument.nullable else None
            if function == "count":  # counted is () when no argument is ever non-NULL: 0
                counts = ((1, COUNT),) if counted is None else counted
                plans.append(AggregatePlan(slot, "count", counts, None, "int", text))
                continue
            value_terms = terms(value, node)
            integer = (
                argument.kind == "int"
                and all(isinstance(c, int) for c, _ in value_terms)
                and all(components[_key(components, n)].integer for _, n in value_terms)
            )
            kind = "float" if function == "avg" else ("int" if integer else "float")
            plans.append(AggregatePlan(slot, function, value_terms, counted, kind, text))
        return tuple(plans), tuple(components.values())

    def hidden_aggregate(self, slot: str, function: str, argument: Expr, node, text: str):
        """MIN/MAX/COUNT|SUM|AVG(DISTINCT x): ``x`` becomes a hidden key (the engine keeps
        the multiset of its values per group, exactly under deletes); a read takes the
        extreme or the distinct values of each group, those of its non-NULL ``x``."""
        label = text.split("(")[0].upper()
        if len(argument.sources()) != 1:
            what = "a constant" if not argument.sources() else "an expression of several tables"
            raise self.unsupported(
                f"{label} over {argument.sql()} ({what})",
                node,
                label,
                construct=f"{label} over several tables" if argument.sources() else label,
            )
        kind = {"count_distinct": "int", "avg_distinct": "float"}.get(function, argument.kind)
        var = self.add_key(argument)
        # a nullable argument's NULL rows are a group of their own (its indicator key):
        # a read skips them, as SQL's aggregates skip NULLs
        null = self.null_keys.get(var) if argument.nullable else None
        return AggregatePlan(slot, function, (), None, kind, text, var, null)

    def component(self, monomial: tuple, components: dict, node) -> Component:
        by_alias: dict[str, list[Expr]] = {}
        for alias, factor in monomial:
            by_alias.setdefault(alias, []).append(factor)
        lifted = []
        integer = True
        for _, factors in sorted(by_alias.items()):
            product = factors[0]
            for f in factors[1:]:
                product = Arith("*", product, f)
            integer = integer and product.kind in ("int", "bool")
            lifted.append(self.factor_variable(product))
        key = tuple(sorted(lifted))
        if key not in components:
            components[key] = Component(f"c{len(components)}", key, integer)
        return components[key]

    def factor_variable(self, factor: Expr) -> str:
        """The variable of a factor column: the column's own when it is nothing else."""
        if factor in self.factors:
            return self.factors[factor]
        alias = next(iter(factor.sources()))
        if isinstance(factor, Col) and factor not in self.variables and factor not in self.joins:
            var = f"{alias}.{factor.name}"
        else:
            self.counter += 1
            var = f"{alias}.#{self.counter}"
        self.factors[factor] = var
        return var

    # ---------------------------------------------------------------- atoms
    def atom_plans(self) -> tuple[AtomPlan, ...]:
        columns: dict[str, list[tuple[str, Expr, str, bool]]] = {a: [] for a in self.atoms}
        filters = {a: list(s.filters) for a, s in self.atoms.items()}
        bound: dict[tuple[str, str], Expr] = {}  # (alias, variable) -> the binding term
        terms = [t for t in self.joins.parent] + [t for t in self.variables if t not in self.joins]
        used = set(self.keys) | {
            v
            for cls in self.joins.classes().values()
            if len(cls) > 1
            for v in [self.variable(cls[0])]
        }
        for term in dict.fromkeys(terms):
            var = self.variable(term)
            if var not in used:
                continue
            alias = next(iter(term.sources()))
            if (alias, var) in bound:  # two terms of one atom in one class: a selection
                if bound[(alias, var)] != term:
                    filters[alias].append(Cmp("=", bound[(alias, var)], term))
                continue
            bound[(alias, var)] = term
            name = term.name if isinstance(term, Col) else f"#{var.rsplit('#', 1)[-1]}"
            columns[alias].append((name, term, var, False))
        for factor, var in self.factors.items():
            alias = next(iter(factor.sources()))
            name = (
                factor.name
                if (isinstance(factor, Col) and var == f"{alias}.{factor.name}")
                else f"#{var.rsplit('#', 1)[-1]}"
            )
            columns[alias].append((name, factor, var, True))
        plans = []
        for alias, state in self.atoms.items():
            cols = columns[alias]
            if not cols:  # an atom nothing reads from: one constant column
                cols = [("#0", Lit(0, "int"), f"{alias}.#0", False)]
            condition = None
            if filters[alias]:
                parts = filters[alias]
                condition = parts[0] if len(parts) == 1 else Logic("and", tuple(parts))
            plans.append(
                AtomPlan(
                    alias=alias,
                    table=state.table,
                    filter=condition,
                    columns=tuple(c[0] for c in cols),
                    expressions=tuple(c[1] for c in cols),
                    variables=tuple(c[2] for c in cols),
                    numeric=tuple(c[3] for c in cols),
                )
            )
        return tuple(plans)


# ------------------------------------------------------------------------------ helpers
def _key(components: dict, name: str) -> tuple:
    return next(k for k, c in components.items() if c.name == name)


_FLIP = {"=": "=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def _unwrap(e: Any, node: Any) -> Any:
    while isinstance(node, (e.Paren, e.Subquery)):
        node = node.this
    return node


def _unaliased(e: Any, node: Any) -> Any:
    return node.this if isinstance(node, e.Alias) else node


def _ancestors(node: Any, stop: Any):
    """The nodes strictly between ``node`` and ``stop`` (none when ``node`` is ``stop``)."""
    if node is stop:
        return
    node = node.parent
    while node is not None and node is not stop:
        yield node
        node = node.parent


def _negative_ordinal(e: Any, node: Any) -> str | None:
    """``-k`` (in parentheses or not) for an integer ``k``: an ordinal out of range, as DuckDB
    reads it; None for anything else."""
    while isinstance(node, e.Paren):
        node = node.this
    if isinstance(node, e.Neg) and isinstance(node.this, e.Literal) and node.this.is_int:
        return f"-{node.this.this}"
    return None


def _is_empty_grouping_set(e: Any, node: Any) -> bool:
    """Whether a GROUP BY item is ``()``, the empty grouping set."""
    return isinstance(node, e.Tuple) and not node.expressions


def _only_empty_grouping_sets(e: Any, group: Any) -> bool:
    """Whether a GROUP BY lists nothing but ``()`` (one group of every row, even of none)."""
    items = group.expressions
    return bool(items) and all(_is_empty_grouping_set(e, n) for n in items)


def _walk_here(e: Any, root: Any):
    """The nodes of ``root`` outside its subqueries."""
    yield root
    for child in root.iter_expressions():
        if not isinstance(child, (e.Subquery, e.Select, e.Exists)):
            yield from _walk_here(e, child)


def _reads_columns(e: Any, node: Any) -> bool:
    return any(True for _ in node.find_all(e.Column))


def _output_expr(plan: ViewPlan, index: int) -> Expr:
    return plan.outputs[index].expression


#: per kind, a literal a correlated inner expression reads as where it was NULL (those rows
#: are filtered out: the value is never used)
_NULL_FILL = {
    "int": "0",
    "float": "0.0",
    "str": "''",
    "date": "DATE '1970-01-01'",
    "bool": "FALSE",
}


def _empty_value(plan: ViewPlan, index: int):
    """The value of output ``index`` of an aggregate view over no rows, with ring
    semantics: SUM and COUNT are 0, AVG, MIN and MAX NULL."""
    import numpy as np

    env = {}
    for a in plan.aggregates:
        null = a.function not in ("sum", "count", "count_distinct", "sum_distinct")
        env[a.slot] = (np.zeros(1, dtype=np.int64), np.ones(1, dtype=bool) if null else None)
    values, null = _output_expr(plan, index).evaluate(env, 1)
    if null is not None and null[0]:
        return None
    value = values[0]
    return value.item() if hasattr(value, "item") else value


def _inside(node: Any, clause: Any, stop: Any) -> bool:
    """Whether ``node`` lies in ``clause`` (below ``stop``)."""
    while clause is not None and node is not None and node is not stop:
        if node is clause:
            return True
        node = node.parent
    return False


def _conjuncts(e: Any, node: Any) -> list:
    """The conjuncts of ``node``.  Conjuncts common to every branch of an OR are factored
    out of it: ``(A AND B) OR (A AND C)`` is ``A AND (B OR C)``, and ``A OR (A AND B)`` is
    ``A`` (both hold in three-valued logic), so that a join equality repeated in each
    branch (TPC-H Q19) joins instead of filtering a Cartesian product."""
    while isinstance(node, e.Paren):
        node = node.this
    if isinstance(node, e.And):
        return _conjuncts(e, node.this) + _conjuncts(e, node.expression)
    if not isinstance(node, e.Or):
        return [node]
    branches = [_conjuncts(e, b) for b in _disjuncts(e, node)]
    keys = [[_conjunct_key(e, c) for c in b] for b in branches]
    common, shared = [], set()
    for c, key in zip(branches[0], keys[0], strict=True):
        if key not in shared and all(key in k for k in keys[1:]):
            common.append(c)
            shared.add(key)
    if not common:
        return [node]
    rest = [
        [c for c, key in zip(b, k, strict=True) if key not in shared]
        for b, k in zip(branches, keys, strict=True)
    ]
    if not all(rest):  # a branch is just the common conjuncts: it absorbs the others
        return common
    return common + [e.or_(*[e.and_(*[c.copy() for c in b]) for b in rest], copy=False)]


def _disjuncts(e: Any, node: Any) -> list:
    while isinstance(node, e.Paren):
        node = node.this
    if isinstance(node, e.Or):
        return _disjuncts(e, node.this) + _disjuncts(e, node.expression)
    return [node]


def _conjunct_key(e: Any, node: Any) -> Any:
    """``node`` compared by structure, ``a = b`` the same as ``b = a``."""
    if isinstance(node, e.EQ):
        return ("=", frozenset((node.this, node.expression)))
    return node


def _rename(columns: dict[str, Expr], names: list[str], alias: str, position) -> dict:
    if len(names) > len(columns):
        raise SqlSemanticError(
            f"{alias!r} has {len(columns)} columns but {len(names)} names are given",
            position,
            alias,
        )
    items = list(columns.items())
    renamed = {names[i]: ir for i, (_, ir) in enumerate(items[: len(names)])}
    renamed.update(items[len(names) :])
    return renamed


def _unique_names(outputs: list[OutputColumn]) -> list[OutputColumn]:
    """Repeated output names get ``_1``, ``_2``, ... (as DuckDB names them)."""
    seen: dict[str, int] = {}
    taken = {o.name for o in outputs}
    out = []
    for o in outputs:
        name = o.name
        if name in seen:
            k = seen[name]
            while f"{o.name}_{k}" in taken:
                k += 1
            seen[name] = k + 1
            name = f"{o.name}_{k}"
            taken.add(name)
        else:
            seen[name] = 1
        out.append(OutputColumn(name, o.expression))
    return out
