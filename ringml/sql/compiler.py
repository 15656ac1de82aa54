"""SQL text -> :class:`~ringml.sql.logical.ViewPlan` (sqlglot parses; this module binds names,
checks types and normalizes).

The view class: SELECT-FROM-WHERE-GROUP BY-HAVING-ORDER BY-LIMIT over inner joins (comma,
``JOIN ... ON``, ``NATURAL JOIN``, ``USING``), table aliases and self-joins, derived tables
and CTEs without aggregates (inlined).  WHERE/ON conjuncts are either selections on one FROM
item (any condition) or equalities between expressions of two items (joins: union-find of
join terms, one query variable per class); items joined by no equality form a Cartesian
product of connected pieces.  Group-by keys are expressions of one item.
``COUNT``/``SUM``/``AVG`` take expressions over any items: each argument is expanded into a
sum of products of per-item factors (NULLs tracked by a second such sum), so each distinct
product becomes one ring component.  ``MIN``/``MAX`` and ``COUNT``/``SUM``/``AVG(DISTINCT)``
over an expression of one item make it a *hidden key*: the engine groups by it too (the
multiset of its values per group, exact under deletes) and a read collapses the hidden keys,
taking each group's extreme or distinct values.  Anything else raises a :class:`SqlError`
naming the construct and its position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .aggregates import Poly, expand
from .binder import Aggregates, Binder, Context, Item, Scope
from .catalog import Catalog
from .errors import SqlNameError, SqlSemanticError
from .expressions import AggRef, Arith, Cmp, Col, Expr, IsNull, Lit, Logic, comparable, fold
from .logical import (
    COUNT,
    HIDDEN_AGGREGATES,
    AggregatePlan,
    AtomPlan,
    Component,
    OrderKey,
    OutputColumn,
    ViewPlan,
)
from .parse import DIALECT, parse_select


def compile_view(sql: str, catalog: Catalog) -> ViewPlan:
    """Compile a SELECT over ``catalog``'s tables into a view plan (nothing is changed)."""
    return _Compiler(sql, catalog).compile()


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
    def __init__(self, text: str, catalog: Catalog) -> None:
        from sqlglot import exp

        self.exp = exp
        self.text = text
        self.catalog = catalog
        self.atoms: dict[str, _AtomState] = {}
        self.conjuncts: list[tuple[Expr, Any]] = []
        self.ctes: dict[str, tuple[Any, list[str]]] = {}
        self.joins = _UnionFind()
        self.variables: dict[Expr, str] = {}  # binding term -> variable
        self.factors: dict[Expr, str] = {}  # factor column -> variable
        self.keys: dict[str, str] = {}  # free variable -> kind
        self.key_terms: dict[Expr, str] = {}  # canonical term -> free variable
        self.counter = 0

    # ---------------------------------------------------------------- entry
    def compile(self) -> ViewPlan:
        e = self.exp
        select = parse_select(self.text)
        self.check_clauses(select)
        scope = self.from_clause(select, "")
        self.where(select, scope)
        self.bind_joins()

        group = select.args.get("group")
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
            for n in root.walk()
        )
        has_having = select.args.get("having") is not None  # HAVING alone aggregates too
        grouped = bool(group) or has_aggregates or distinct or has_having
        global_aggregate = (has_aggregates or has_having) and not group
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
                if len(ir.sources()) != 1 or ir.nullable:
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
        aggregate_plans, components = self.aggregate_plans(aggregates)
        hidden = tuple(v for v in self.keys if v not in visible)
        atoms = self.atom_plans()
        return ViewPlan(
            sql=self.text,
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
        )

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
                self.ctes[cte.alias.lower()] = (cte.this, names)
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
                if not in_from:
                    raise self.unsupported(
                        "a subquery outside FROM (IN/EXISTS/scalar subqueries)",
                        node,
                        "SELECT",
                        construct="subquery",
                    )

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
                    "only inner joins keep a view maintainable this way",
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
            if name.lower() in self.ctes and self.catalog.find(name) is None:
                body, names = self.ctes[name.lower()]
                item = self.derived(body, alias or name, prefix, renames or names, node)
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
                    c: Col(engine_alias, c, k)
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

    def derived(self, body: Any, alias: str, prefix: str, renames: list[str], node) -> Item:
        """A derived table or CTE without aggregates, inlined: its FROM items become atoms
        named ``alias.inner``, its WHERE joins the view's, its SELECT list its columns."""
        e = self.exp
        for key, label in (
            ("group", "GROUP BY"),
            ("having", "HAVING"),
            ("order", "ORDER BY"),
            ("limit", "LIMIT"),
            ("offset", "OFFSET"),
            ("distinct", "DISTINCT"),
        ):
            if body.args.get(key):
                raise self.unsupported(
                    f"a derived table with {label}",
                    body.args[key],
                    label.split()[0],
                    construct=f"derived table with {label}",
                )
        for n in body.walk():
            if isinstance(n, e.AggFunc):
                raise self.unsupported(
                    "a derived table with aggregates",
                    n,
                    hint="aggregate in the outer query",
                    construct="derived table with aggregates",
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
                raise self.unsupported(
                    f"the join predicate {ir.sql()} (an expression over several tables on "
                    "one side)",
                    node,
                    construct="join predicate over an expression of several tables",
                )
            names = ", ".join(sorted(sources))
            if isinstance(ir, Logic) and ir.op == "or":
                raise self.unsupported(
                    f"OR across tables ({names})",
                    node,
                    "OR",
                    "a condition may read several tables only as an equality join",
                    construct="OR across tables",
                )
            if isinstance(ir, Cmp):
                raise self.unsupported(
                    f"the non-equality join predicate {ir.sql()}",
                    node,
                    hint="tables join on equalities only",
                    construct="non-equality join predicate",
                )
            raise self.unsupported(f"the condition {ir.sql()} across tables ({names})", node)

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
            ir = self.group_expression(node, scope, items, aliases)
            if any(isinstance(n, AggRef) for n in ir.walk()):
                raise SqlSemanticError(
                    "GROUP BY cannot hold an aggregate", self.pos(node), "GROUP BY"
                )
            if len(ir.sources()) != 1:
                raise self.unsupported(
                    f"GROUP BY {ir.sql()} (the key must be an expression of one table)",
                    node,
                    construct="GROUP BY over several tables",
                )
            if ir.nullable:
                raise self.unsupported(
                    f"GROUP BY {ir.sql()}, which can be NULL", node, construct="nullable GROUP BY"
                )
            self.add_key(ir)

    def group_expression(self, node: Any, scope: Scope, items, aliases) -> Expr:
        e = self.exp
        if isinstance(node, e.Literal) and not node.is_string:
            k = int(node.this)
            if not 1 <= k <= len(items):
                raise SqlSemanticError(
                    f"GROUP BY {k}: there are {len(items)} output columns", self.pos(node), str(k)
                )
            return items[k - 1][1]
        return self.expr(node, Context(scope, None, "GROUP BY", aliases))

    def add_key(self, ir: Expr) -> str:
        canonical = self.canonical(ir)
        if canonical in self.key_terms:
            return self.key_terms[canonical]
        var = self.variable(ir)
        self.keys.setdefault(var, ir.kind)
        self.key_terms[canonical] = var
        return var

    def post(self, ir: Expr, create: bool, node: Any) -> Expr:
        """``ir`` over result slots: aggregates, keys (created in a bag projection)."""
        if isinstance(ir, AggRef):
            return Col("", f"#a{ir.index}", ir.type, ir.nulls)
        if isinstance(ir, Lit):
            return ir
        has_aggregate = any(isinstance(n, AggRef) for n in ir.walk())
        sources = ir.sources()
        if not has_aggregate and len(sources) == 1 and not ir.nullable:
            var = self.key_terms.get(self.canonical(ir))
            if var is None and create:
                var = self.add_key(ir)
            if var is not None:
                return Col("", var, ir.kind)
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

        for i, (function, argument, node) in enumerate(aggregates.calls):
            slot = f"#a{i}"
            text = node.sql(dialect=DIALECT)
            if function in HIDDEN_AGGREGATES:
                plans.append(self.hidden_aggregate(slot, function, argument, node, text))
                continue
            if argument is None:
                plans.append(AggregatePlan(slot, "count", ((1, COUNT),), None, "int", text))
                continue
            value, nonnull = expand(
                argument,
                lambda what, construct, at=node: self.unsupported(what, at, construct=construct),
            )
            counted = None if argument.nullable is False else terms(nonnull, node)
            if function == "count":
                plans.append(
                    AggregatePlan(slot, "count", counted or ((1, COUNT),), None, "int", text)
                )
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
        extreme or the distinct values of each group."""
        label = text.split("(")[0].upper()
        if len(argument.sources()) != 1:
            what = "a constant" if not argument.sources() else "an expression of several tables"
            raise self.unsupported(
                f"{label} over {argument.sql()} ({what})",
                node,
                label,
                construct=f"{label} over several tables" if argument.sources() else label,
            )
        if argument.nullable:
            raise self.unsupported(
                f"{label} over {argument.sql()}, which can be NULL",
                node,
                label,
                construct=f"{label} over a nullable expression",
            )
        kind = {"count_distinct": "int", "avg_distinct": "float"}.get(function, argument.kind)
        return AggregatePlan(slot, function, (), None, kind, text, self.add_key(argument))

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


def _conjuncts(e: Any, node: Any) -> list:
    while isinstance(node, e.Paren):
        node = node.this
    if isinstance(node, e.And):
        return _conjuncts(e, node.this) + _conjuncts(e, node.expression)
    return [node]


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
