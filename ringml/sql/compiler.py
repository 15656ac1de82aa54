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
product becomes one ring component.  Anything else raises a :class:`SqlError` naming the
construct and its position.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass, field
from typing import Any

from .catalog import Catalog
from .errors import (
    SqlNameError,
    SqlSemanticError,
    SqlTypeError,
    SqlUnsupportedError,
)
from .expressions import (
    NUMBERS,
    AggRef,
    Arith,
    Case,
    Cast,
    Cmp,
    Col,
    DateShift,
    Expr,
    Extract,
    Func,
    InList,
    Interval,
    IsNull,
    Like,
    Lit,
    Logic,
    Neg,
    Not,
    comparable,
    date_literal,
    fold,
    literal,
    require,
    unify,
)
from .logical import (
    COUNT,
    AggregatePlan,
    AtomPlan,
    Component,
    OrderKey,
    OutputColumn,
    ViewPlan,
)
from .parse import DIALECT, node_position, parse_select

Poly = dict[tuple, Any]  # monomial (sorted ((alias, factor), ...)) -> coefficient
ONE: Poly = {(): 1}


def compile_view(sql: str, catalog: Catalog) -> ViewPlan:
    """Compile a SELECT over ``catalog``'s tables into a view plan (nothing is changed)."""
    return _Compiler(sql, catalog).compile()


# ------------------------------------------------------------------------------ scopes
@dataclass
class _Item:
    """A FROM item as SQL names see it: its alias and columns (name -> expression)."""

    alias: str
    columns: dict[str, Expr]
    node: Any

    def find(self, name: str) -> str | None:
        if name in self.columns:
            return name
        matches = [c for c in self.columns if c.lower() == name.lower()]
        return matches[0] if len(matches) == 1 else None


@dataclass
class _Scope:
    items: list[_Item] = field(default_factory=list)
    merged: dict[str, set[str]] = field(default_factory=dict)  # USING/NATURAL columns

    def item(self, alias: str) -> _Item | None:
        exact = [i for i in self.items if i.alias == alias]
        if exact:
            return exact[0]
        loose = [i for i in self.items if i.alias.lower() == alias.lower()]
        return loose[0] if len(loose) == 1 else None


@dataclass
class _Context:
    """How to resolve an expression: the scope, the aggregate collector (None: aggregates
    are not allowed here, ``clause`` says where) and SELECT aliases as a fallback."""

    scope: _Scope
    aggregates: _Aggregates | None
    clause: str
    aliases: dict[str, Expr] = field(default_factory=dict)


@dataclass
class _Aggregates:
    """The aggregate calls of a query, each once."""

    global_aggregate: bool
    calls: list[tuple[str, Expr | None, Any]] = field(default_factory=list)

    def add(self, function: str, argument: Expr | None, node: Any) -> AggRef:
        for i, (f, a, _) in enumerate(self.calls):
            if f == function and a == argument:
                return self.ref(i)
        self.calls.append((function, argument, node))
        return self.ref(len(self.calls) - 1)

    def ref(self, i: int) -> AggRef:
        function, argument, _ = self.calls[i]
        if function == "count":
            return AggRef(i, "int", False)
        kind = "float" if function == "avg" else argument.kind
        return AggRef(i, kind, argument.nullable or self.global_aggregate)


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
class _Compiler:
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

    # ---------------------------------------------------------------- errors
    def pos(self, node: Any, keyword: str | None = None):
        return node_position(self.text, node, keyword) if node is not None else None

    def unsupported(
        self,
        what: str,
        node: Any,
        keyword: str | None = None,
        hint: str = "",
        construct: str | None = None,
    ) -> SqlUnsupportedError:
        """The error for ``what`` at ``node`` (at ``keyword`` when given); ``construct``
        names it (default: the keyword, else ``what``)."""
        return SqlUnsupportedError(
            f"{what} is not supported in a view{'; ' + hint if hint else ''}",
            self.pos(node, keyword),
            construct or keyword or what,
        )

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
        grouped = bool(group) or has_aggregates or distinct
        global_aggregate = has_aggregates and not group
        if distinct and (group or has_aggregates):
            raise self.unsupported(
                "DISTINCT over grouped or aggregated rows",
                select,
                "DISTINCT",
                "group by the output columns instead",
            )
        aggregates = _Aggregates(global_aggregate)
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
        if select.args.get("having") is not None:
            node = select.args["having"].this
            if not grouped:
                grouped = True
            context = _Context(scope, aggregates, "HAVING", aliases)
            having = self.post(self.condition(node, context, "HAVING"), False, node)
        order = self.order_by(
            select, scope, aggregates if grouped else None, create, aliases, output_slots
        )
        limit, offset = self.limit(select)
        aggregate_plans, components = self.aggregate_plans(aggregates)
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
    def from_clause(self, select: Any, prefix: str) -> _Scope:
        e = self.exp
        scope = _Scope()
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
                    context = _Context(scope, None, "ON")
                    self.conjuncts.append((self.condition(conjunct, context, "ON"), conjunct))
            elif not using and kind == "INNER":
                raise SqlSemanticError("JOIN needs ON or USING", self.pos(join), "JOIN")
        return scope

    def using_column(self, scope: _Scope, left: list[_Item], item: _Item, name: str, node):
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

    def add_item(self, scope: _Scope, node: Any, prefix: str) -> _Item:
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
                item = _Item(alias, columns, node)
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

    def derived(self, body: Any, alias: str, prefix: str, renames: list[str], node) -> _Item:
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
        return _Item(alias, columns, node)

    # ---------------------------------------------------------------- WHERE and joins
    def where(self, select: Any, scope: _Scope) -> None:
        node = select.args.get("where")
        if node is None:
            return
        for conjunct in _conjuncts(self.exp, node.this):
            context = _Context(scope, None, "WHERE")
            self.conjuncts.append((self.condition(conjunct, context, "WHERE"), conjunct))

    def condition(self, node: Any, context: _Context, clause: str) -> Expr:
        ir = self.expr(node, context)
        if ir.kind not in ("bool", "null"):
            raise SqlTypeError(
                f"{clause} needs a BOOLEAN condition, got {ir.sql()}", self.pos(node), clause
            )
        return ir

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
    def select_items(self, select: Any, scope: _Scope, aggregates: _Aggregates | None):
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
            context = _Context(scope, aggregates, "SELECT")
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
    def group_keys(self, group: Any, scope: _Scope, items, aliases) -> None:
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

    def group_expression(self, node: Any, scope: _Scope, items, aliases) -> Expr:
        e = self.exp
        if isinstance(node, e.Literal) and not node.is_string:
            k = int(node.this)
            if not 1 <= k <= len(items):
                raise SqlSemanticError(
                    f"GROUP BY {k}: there are {len(items)} output columns", self.pos(node), str(k)
                )
            return items[k - 1][1]
        return self.expr(node, _Context(scope, None, "GROUP BY", aliases))

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
                context = _Context(scope, aggregates, "ORDER BY", aliases)
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

    # ---------------------------------------------------------------- expressions
    def expr(self, node: Any, context: _Context) -> Expr:
        e = self.exp
        while isinstance(node, e.Paren):
            node = node.this
        pos = self.pos(node)
        if isinstance(node, e.Column):
            if isinstance(node.this, e.Star):
                raise SqlSemanticError("* is only allowed in the SELECT list or COUNT(*)", pos, "*")
            return self.column(node, context)
        if isinstance(node, e.Literal):
            if node.is_string:
                return Lit(node.this, "str")
            return literal(decimal.Decimal(node.this))
        if isinstance(node, e.Boolean):
            return Lit(bool(node.this), "bool")
        if isinstance(node, e.Null):
            return Lit(None, "null")
        if isinstance(node, e.Neg):
            operand = self.expr(node.this, context)
            require(operand, NUMBERS, "unary minus", pos)
            if isinstance(operand, Lit) and operand.value is not None:
                return Lit(-operand.value, operand.type)
            return Neg(operand)
        arith = {e.Add: "+", e.Sub: "-", e.Mul: "*", e.Div: "/"}
        if type(node) in arith:
            return self.arithmetic(arith[type(node)], node, context)
        if isinstance(node, (e.IntDiv, e.Mod, e.Pow, e.DPipe, e.BitwiseAnd, e.BitwiseOr)):
            raise self.unsupported(f"the operator in {node.sql(dialect=DIALECT)}", node)
        compare = {e.EQ: "=", e.NEQ: "<>", e.LT: "<", e.LTE: "<=", e.GT: ">", e.GTE: ">="}
        if type(node) in compare:
            left = self.expr(node.this, context)
            right = self.expr(node.expression, context)
            return self.compare(compare[type(node)], left, right, node)
        if isinstance(node, (e.And, e.Or)):
            op = "and" if isinstance(node, e.And) else "or"
            parts = []
            for part in _flatten(node, type(node)):
                ir = self.expr(part, context)
                require(ir, ("bool",), op.upper(), self.pos(part))
                parts.extend(ir.parts if isinstance(ir, Logic) and ir.op == op else [ir])
            return fold(Logic(op, tuple(parts)))
        if isinstance(node, e.Not):
            operand = self.expr(node.this, context)
            require(operand, ("bool",), "NOT", pos)
            if isinstance(operand, InList):
                return InList(operand.operand, operand.values, not operand.negate)
            if isinstance(operand, Like):
                return Like(
                    operand.operand, operand.pattern, not operand.negate, operand.case_sensitive
                )
            if isinstance(operand, IsNull):
                return IsNull(operand.operand, not operand.negate)
            return fold(Not(operand))
        if isinstance(node, e.Between):
            x = self.expr(node.this, context)
            low = self.expr(node.args["low"], context)
            high = self.expr(node.args["high"], context)
            return Logic(
                "and", (self.compare(">=", x, low, node), self.compare("<=", x, high, node))
            )
        if isinstance(node, e.In):
            if node.args.get("query") is not None or node.args.get("unnest") is not None:
                raise self.unsupported("IN (subquery)", node, "IN")
            x = self.expr(node.this, context)
            values = []
            for v in node.expressions:
                ir = fold(self.expr(v, context))
                if not isinstance(ir, Lit):
                    raise self.unsupported(f"IN with the non-constant value {ir.sql()}", v)
                ir = self.coerce_literal(ir, x, v)
                comparable(x, ir, "IN", self.pos(v))
                values.append(ir)
            return InList(x, tuple(values))
        if isinstance(node, (e.Like, e.ILike)):
            x = self.expr(node.this, context)
            require(x, ("str",), "LIKE", pos)
            pattern = fold(self.expr(node.expression, context))
            if not (isinstance(pattern, Lit) and isinstance(pattern.value, str)):
                raise self.unsupported("LIKE with a pattern that is not a string constant", node)
            if node.args.get("escape") is not None:
                raise self.unsupported("LIKE ... ESCAPE", node, "ESCAPE")
            return Like(x, pattern.value, bool(node.args.get("negate")), isinstance(node, e.Like))
        if isinstance(node, e.Escape):
            raise self.unsupported("LIKE ... ESCAPE", node, "ESCAPE")
        if isinstance(node, e.Is):
            if isinstance(node.expression, e.Null):
                return IsNull(self.expr(node.this, context))
            raise self.unsupported(f"IS {node.expression.sql(dialect=DIALECT)}", node, "IS")
        if isinstance(node, e.Case):
            return self.case(node, context)
        if isinstance(node, e.If):
            cond = self.condition(node.this, context, "IF")
            true = self.expr(node.args["true"], context)
            false = node.args.get("false")
            false = self.expr(false, context) if false is not None else None
            kind = unify([true.kind] + ([false.kind] if false else []), "IF", pos)
            return Case(((cond, true),), false, kind)
        if isinstance(node, e.Extract) or isinstance(node, (e.Year, e.Month, e.Day, e.Quarter)):
            return self.extract(node, context)
        if isinstance(node, e.Anonymous) and node.name.lower() in ("date_part", "datepart"):
            return self.extract(node, context)
        if isinstance(node, (e.Cast, e.TryCast)):
            return self.cast(node, context)
        if isinstance(node, e.Interval):
            raise self.unsupported(
                "INTERVAL outside date arithmetic (date +/- INTERVAL)", node, "INTERVAL"
            )
        if isinstance(node, (e.Abs, e.Lower, e.Upper, e.Length, e.Substring, e.Coalesce)):
            return self.function(node, context)
        if isinstance(node, e.AggFunc):
            return self.aggregate(node, context)
        if isinstance(node, e.Anonymous):
            raise self.unsupported(f"the function {node.name.upper()}", node, node.name)
        label = type(node).__name__
        raise self.unsupported(f"{label} ({node.sql(dialect=DIALECT)[:40]})", node)

    def column(self, node: Any, context: _Context) -> Expr:
        name, table = node.name, node.table
        scope = context.scope
        if table:
            item = scope.item(table)
            if item is None:
                raise SqlNameError(
                    f"unknown table or alias {table!r} in {table}.{name}; the FROM clause has "
                    f"{[i.alias for i in scope.items]}",
                    self.pos(node),
                    f"{table}.{name}",
                )
            found = item.find(name)
            if found is None:
                raise SqlNameError(
                    f"{item.alias!r} has no column {name!r}; its columns are {list(item.columns)}",
                    self.pos(node),
                    f"{table}.{name}",
                )
            return item.columns[found]
        holders = [i for i in scope.items if i.find(name)]
        if not holders:
            if name.lower() in context.aliases:
                return context.aliases[name.lower()]
            known = sorted({c for i in scope.items for c in i.columns})
            raise SqlNameError(
                f"unknown column {name!r}; the FROM items have {known}", self.pos(node), name
            )
        if len(holders) > 1:
            merged = scope.merged.get(name.lower(), set())
            if not {h.alias for h in holders} <= merged:
                raise SqlNameError(
                    f"column {name!r} is ambiguous: it is in {[h.alias for h in holders]}; "
                    "qualify it (alias.column)",
                    self.pos(node),
                    name,
                )
        return holders[0].columns[holders[0].find(name)]

    def arithmetic(self, op: str, node: Any, context: _Context) -> Expr:
        e = self.exp
        pos = self.pos(node)
        left = self.expr(node.this, context)
        right_node = node.expression
        while isinstance(right_node, e.Paren):
            right_node = right_node.this
        if isinstance(right_node, e.Interval) and op in "+-":
            interval = self.interval(right_node)
            require(left, ("date",), "date +/- INTERVAL", pos)
            sign = 1 if op == "+" else -1
            shifted = DateShift(left, sign * interval.months, sign * interval.days)
            return fold(shifted)
        right = self.expr(right_node, context)
        for side in (left, right):
            require(side, NUMBERS, f"the operator {op}", pos)
        return fold(Arith(op, left, right))

    def interval(self, node: Any) -> Interval:
        value = node.this
        unit = node.args.get("unit")
        text = value.this if value is not None else ""
        unit_name = unit.name.lower() if unit is not None else ""
        if not unit_name and isinstance(text, str) and len(text.split()) == 2:
            text, unit_name = text.split()
        try:
            amount = int(str(text).strip())
        except ValueError:
            raise self.unsupported(
                f"INTERVAL {node.sql(dialect=DIALECT)}", node, "INTERVAL"
            ) from None
        unit_name = unit_name.rstrip("s")
        if unit_name == "year":
            return Interval(12 * amount, 0)
        if unit_name == "month":
            return Interval(amount, 0)
        if unit_name == "quarter":
            return Interval(3 * amount, 0)
        if unit_name == "week":
            return Interval(0, 7 * amount)
        if unit_name == "day":
            return Interval(0, amount)
        raise self.unsupported(f"INTERVAL in {unit_name or '?'} units", node, "INTERVAL")

    def coerce_literal(self, literal_: Expr, other: Expr, node: Any) -> Expr:
        """A string constant compared with a date is a date (as in DuckDB)."""
        if isinstance(literal_, Lit) and literal_.type == "str" and other.kind == "date":
            return date_literal(literal_.value, self.pos(node))
        return literal_

    def compare(self, op: str, left: Expr, right: Expr, node: Any) -> Expr:
        left = self.coerce_literal(left, right, node)
        right = self.coerce_literal(right, left, node)
        comparable(left, right, f"the comparison {op}", self.pos(node))
        return fold(Cmp(op, left, right))

    def case(self, node: Any, context: _Context) -> Expr:
        subject = node.this
        subject = self.expr(subject, context) if subject is not None else None
        whens = []
        for branch in node.args.get("ifs") or []:
            if subject is not None:
                value = self.expr(branch.this, context)
                cond = self.compare("=", subject, value, branch)
            else:
                cond = self.condition(branch.this, context, "CASE WHEN")
            whens.append((cond, self.expr(branch.args["true"], context)))
        default = node.args.get("default")
        default = self.expr(default, context) if default is not None else None
        kinds = [v.kind for _, v in whens] + ([default.kind] if default is not None else [])
        kind = unify(kinds, "CASE", self.pos(node))
        if kind == "null":
            kind = "int"
        return fold(Case(tuple(whens), default, kind))

    def extract(self, node: Any, context: _Context) -> Expr:
        e = self.exp
        if isinstance(node, e.Extract):
            part, operand = node.this.name.lower(), node.expression
        elif isinstance(node, e.Anonymous):
            args = node.expressions
            if len(args) != 2 or not (isinstance(args[0], e.Literal) and args[0].is_string):
                raise self.unsupported("DATE_PART with a part that is not a string", node)
            part, operand = args[0].this.lower(), args[1]
        else:
            part, operand = type(node).__name__.lower(), node.this
        aliases = {
            "years": "year",
            "months": "month",
            "days": "day",
            "dayofweek": "dow",
            "weekday": "dow",
            "dayofyear": "doy",
            "quarters": "quarter",
        }
        part = aliases.get(part, part)
        if part not in (
            "year",
            "month",
            "day",
            "quarter",
            "doy",
            "dow",
            "isodow",
            "hour",
            "minute",
            "second",
        ):
            raise self.unsupported(f"EXTRACT({part.upper()} ...)", node)
        operand = self.expr(operand, context)
        require(operand, ("date",), f"EXTRACT({part.upper()})", self.pos(node))
        return fold(Extract(part, operand))

    def cast(self, node: Any, context: _Context) -> Expr:
        from .catalog import type_kind

        target = node.args["to"].sql(dialect=DIALECT)
        try:
            kind = type_kind(target)
        except SqlTypeError:
            raise self.unsupported(f"CAST to {target}", node, "CAST") from None
        operand = self.expr(node.this, context)
        if isinstance(operand, Lit) and operand.type == "str" and kind == "date":
            return date_literal(operand.value, self.pos(node))
        allowed = {
            "int": ("int", "float", "str", "bool"),
            "float": ("int", "float", "str", "bool"),
            "date": ("date", "str"),
            "str": ("str", "int", "float"),
            "bool": ("bool",),
        }[kind]
        require(operand, allowed, f"CAST to {target}", self.pos(node))
        if operand.kind == "bool" and kind in NUMBERS:
            return Case(((operand, Lit(1, "int")),), Lit(0, "int"), "int")
        return fold(Cast(operand, kind))

    def function(self, node: Any, context: _Context) -> Expr:
        e = self.exp
        pos = self.pos(node)
        name = {
            e.Abs: "abs",
            e.Lower: "lower",
            e.Upper: "upper",
            e.Length: "length",
            e.Substring: "substring",
            e.Coalesce: "coalesce",
        }[type(node)]
        if name == "coalesce":
            args = [self.expr(a, context) for a in [node.this, *node.expressions]]
            kind = unify([a.kind for a in args], "COALESCE", pos)
            return fold(Func(name, tuple(args), kind))
        if name == "substring":
            x = self.expr(node.this, context)
            require(x, ("str",), "SUBSTRING", pos)
            bounds = [
                fold(self.expr(node.args[k], context))
                for k in ("start", "length")
                if node.args.get(k) is not None
            ]
            if not all(isinstance(b, Lit) and b.type == "int" for b in bounds):
                raise self.unsupported("SUBSTRING with bounds that are not integer constants", node)
            return fold(Func(name, (x, *bounds), "str"))
        x = self.expr(node.this, context)
        if name == "abs":
            require(x, NUMBERS, "ABS", pos)
            return fold(Func(name, (x,), x.kind))
        require(x, ("str",), name.upper(), pos)
        return fold(Func(name, (x,), "int" if name == "length" else "str"))

    def aggregate(self, node: Any, context: _Context) -> Expr:
        e = self.exp
        name = type(node).__name__.upper()
        if context.aggregates is None:
            where = (
                "inside another aggregate"
                if context.clause == "aggregate"
                else (f"in {context.clause}")
            )
            raise SqlSemanticError(
                f"aggregate function {name} is not allowed {where}", self.pos(node), name
            )
        if isinstance(node, (e.Min, e.Max)):
            raise self.unsupported(
                f"{name} (not maintainable under deletes in a ring)",
                node,
                name,
                "use SUM, COUNT or AVG",
            )
        if not isinstance(node, (e.Count, e.Sum, e.Avg)):
            raise self.unsupported(f"the aggregate {name}", node, None, "use SUM, COUNT or AVG")
        argument = node.this
        if isinstance(argument, e.Distinct):
            raise self.unsupported(f"{name}(DISTINCT ...)", node, "DISTINCT")
        inner = _Context(context.scope, None, "aggregate", context.aliases)
        function = name.lower()
        if isinstance(node, e.Count) and (argument is None or isinstance(argument, e.Star)):
            return context.aggregates.add("count", None, node)
        if node.expressions:
            raise self.unsupported(f"{name} with several arguments", node)
        ir = self.expr(argument, inner)
        if function in ("sum", "avg"):
            require(ir, NUMBERS, name, self.pos(node))
            if ir.kind == "null":
                ir = Lit(None, "int")
        return context.aggregates.add(function, ir, node)

    # ---------------------------------------------------------------- aggregates
    def aggregate_plans(self, aggregates: _Aggregates):
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
            if argument is None:
                plans.append(AggregatePlan(slot, "count", ((1, COUNT),), None, "int", text))
                continue
            value, nonnull = self.expand(argument, node)
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

    def expand(self, ir: Expr, node: Any) -> tuple[Poly, Poly]:
        """``(V, N)``: ``ir`` with NULL read as 0, and its non-NULL indicator, each as a sum
        of products of per-atom factors."""
        sources = ir.sources()
        if isinstance(ir, Lit):
            if ir.value is None:
                return {}, {}
            value = int(ir.value) if isinstance(ir.value, bool) else ir.value
            return ({(): value} if value != 0 else {}), dict(ONE)
        if len(sources) <= 1:
            if not sources:
                raise self.unsupported(f"the constant expression {ir.sql()} in an aggregate", node)
            alias = next(iter(sources))
            value = {((alias, ir),): 1}
            nonnull = dict(ONE) if not ir.nullable else {((alias, IsNull(ir, True)),): 1}
            return value, nonnull
        if isinstance(ir, Arith):
            lv, ln = self.expand(ir.left, node)
            if ir.op == "/":
                right = ir.right
                if isinstance(right, Lit):
                    if right.value in (None, 0):
                        raise self.unsupported(f"division by {right.sql()} in an aggregate", node)
                    inverse = decimal.Decimal(1) / decimal.Decimal(right.value)
                    return _scale(lv, inverse), ln
                if len(right.sources()) != 1:
                    raise self.unsupported(
                        f"division by {right.sql()} (an expression of several tables) in an "
                        "aggregate",
                        node,
                        construct="division by several tables in an aggregate",
                    )
                alias = next(iter(right.sources()))
                reciprocal = {((alias, Arith("/", Lit(1, "int"), right)),): 1}
                _, rn = self.expand(right, node)
                return _mul(lv, reciprocal), _mul(ln, rn)
            rv, rn = self.expand(ir.right, node)
            if ir.op == "*":
                return _mul(lv, rv), _mul(ln, rn)
            sign = 1 if ir.op == "+" else -1
            return _add(_mul(lv, rn), _scale(_mul(rv, ln), sign)), _mul(ln, rn)
        if isinstance(ir, Neg):
            v, n = self.expand(ir.operand, node)
            return _scale(v, -1), n
        if isinstance(ir, Cast) and ir.type == "float" and ir.operand.kind in NUMBERS:
            return self.expand(ir.operand, node)
        if isinstance(ir, Case):
            value: Poly = {}
            nonnull: Poly = {}
            rest: Poly = dict(ONE)  # no earlier WHEN was TRUE
            for cond, branch in ir.whens:
                if len(cond.sources()) > 1:
                    raise self.unsupported(
                        f"the CASE condition {cond.sql()} over several tables",
                        node,
                        construct="CASE condition over several tables",
                    )
                if not cond.sources():
                    raise self.unsupported(f"the constant CASE condition {cond.sql()}", node)
                alias = next(iter(cond.sources()))
                taken = _mul(
                    rest, {((alias, Case(((cond, Lit(1, "int")),), Lit(0, "int"), "int")),): 1}
                )
                bv, bn = self.expand(branch, node)
                value = _add(value, _mul(taken, bv))
                nonnull = _add(nonnull, _mul(taken, bn))
                rest = _mul(
                    rest, {((alias, Case(((cond, Lit(0, "int")),), Lit(1, "int"), "int")),): 1}
                )
            if ir.default is not None:
                dv, dn = self.expand(ir.default, node)
                value = _add(value, _mul(rest, dv))
                nonnull = _add(nonnull, _mul(rest, dn))
            return value, nonnull
        raise self.unsupported(
            f"{ir.sql()} inside an aggregate (over columns of several tables only + - * /, "
            "CASE with one-table conditions and constants combine)",
            node,
            construct="expression over several tables in an aggregate",
        )

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


def _flatten(node: Any, kind: type) -> list:
    out = []
    for side in (node.this, node.expression):
        inner = side
        if isinstance(inner, kind):
            out.extend(_flatten(inner, kind))
        else:
            out.append(side)
    return out


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


def _order_key(monomial_factor: tuple[str, Expr]) -> tuple[str, str]:
    return monomial_factor[0], monomial_factor[1].sql()


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb, key=_order_key))
            out[m] = out.get(m, 0) + _times(ca, cb)
    return {m: c for m, c in out.items() if c != 0}


def _times(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return decimal.Decimal(a) * decimal.Decimal(b)


def _add(a: Poly, b: Poly) -> Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + c
    return {m: c for m, c in out.items() if c != 0}


def _scale(a: Poly, k) -> Poly:
    return {m: _times(c, k) for m, c in a.items() if _times(c, k) != 0}
