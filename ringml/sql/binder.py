"""Binding SQL expressions: sqlglot expression trees -> typed expressions over FROM items.

Names resolve against a :class:`Scope` (the FROM items, their columns and the columns merged
by USING/NATURAL); types are checked as nodes are built (:class:`SqlTypeError` at the
construct's position); aggregate calls are collected by :class:`Aggregates` and stand as
:class:`~ringml.sql.expressions.AggRef` in the expression.  :class:`Binder` is the base of the
compiler, which adds FROM, WHERE, GROUP BY and the rest.
"""

from __future__ import annotations

import dataclasses
import decimal
from dataclasses import dataclass, field
from typing import Any

from .catalog import Catalog
from .errors import SqlNameError, SqlSemanticError, SqlTypeError, SqlUnsupportedError
from .expressions import (
    NUMBERS,
    AggRef,
    Arith,
    Case,
    Cast,
    Cmp,
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
from .parse import DIALECT, function_name, node_position


@dataclass
class Item:
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
class Scope:
    items: list[Item] = field(default_factory=list)
    merged: dict[str, set[str]] = field(default_factory=dict)  # USING/NATURAL columns

    def item(self, alias: str) -> Item | None:
        exact = [i for i in self.items if i.alias == alias]
        if exact:
            return exact[0]
        loose = [i for i in self.items if i.alias.lower() == alias.lower()]
        return loose[0] if len(loose) == 1 else None


@dataclass
class Context:
    """How to resolve an expression: the scope, the aggregate collector (None: aggregates
    are not allowed here, ``clause`` says where) and SELECT aliases as a fallback."""

    scope: Scope
    aggregates: Aggregates | None
    clause: str
    aliases: dict[str, Expr] = field(default_factory=dict)


@dataclass
class Aggregates:
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
        function, argument, node = self.calls[i]
        text = node.sql(dialect=DIALECT)
        if function in ("count", "count_distinct"):
            return AggRef(i, "int", False, text)
        kind = "float" if function in ("avg", "avg_distinct") else argument.kind
        return AggRef(i, kind, argument.nullable or self.global_aggregate, text)


class Binder:
    """Resolves and type-checks expressions of one SQL text (positions point into it)."""

    def __init__(self, text: str, catalog: Catalog, noun: str = "view") -> None:
        from sqlglot import exp

        self.exp = exp
        self.text = text
        self.catalog = catalog
        self.noun = noun  # what the text defines: a view, or a query run once

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
            f"{what} is not supported in a {self.noun}{'; ' + hint if hint else ''}",
            self.pos(node, keyword),
            construct or keyword or what,
        )

    def condition(self, node: Any, context: Context, clause: str) -> Expr:
        ir = self.expr(node, context)
        if ir.kind not in ("bool", "null"):
            raise SqlTypeError(
                f"{clause} needs a BOOLEAN condition, got {ir.sql()}", self.pos(node), clause
            )
        return ir

    # ---------------------------------------------------------------- expressions
    def expr(self, node: Any, context: Context) -> Expr:
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
            return fold(Neg(operand))
        arith = {e.Add: "+", e.Sub: "-", e.Mul: "*", e.Div: "/"}
        if type(node) in arith:
            return self.arithmetic(arith[type(node)], node, context)
        if isinstance(node, (e.IntDiv, e.Mod, e.Pow, e.DPipe, e.BitwiseAnd, e.BitwiseOr)):
            raise self.unsupported(f"the operator in {node.sql(dialect=DIALECT)}", node)
        if isinstance(node, e.Subquery):
            return self.scalar_subquery(node.this, node, context)
        if isinstance(node, e.Exists):
            return self.exists_subquery(node.this, node, context)
        compare = {e.EQ: "=", e.NEQ: "<>", e.LT: "<", e.LTE: "<=", e.GT: ">", e.GTE: ">="}
        if type(node) in compare and isinstance(node.expression, (e.All, e.Any)):
            return self.quantified_subquery(compare[type(node)], node, context)
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
                return dataclasses.replace(operand, negate=not operand.negate)
            if isinstance(operand, IsNull):
                return IsNull(operand.operand, not operand.negate)
            return fold(Not(operand))
        if isinstance(node, e.Between):
            x = self.expr(node.this, context)
            low = self.expr(node.args["low"], context)
            high = self.expr(node.args["high"], context)
            between = Logic(
                "and", (self.compare(">=", x, low, node), self.compare("<=", x, high, node))
            )
            if not node.args.get("symmetric"):
                return between
            # SYMMETRIC: (x BETWEEN low AND high) OR (x BETWEEN high AND low), three-valued
            swapped = Logic(
                "and", (self.compare(">=", x, high, node), self.compare("<=", x, low, node))
            )
            return fold(Logic("or", (between, swapped)))
        if isinstance(node, e.In):
            if node.args.get("query") is not None:
                return self.in_subquery(node, context)
            if node.args.get("unnest") is not None:
                raise self.unsupported("IN UNNEST", node, "IN")
            x = self.expr(node.this, context)
            values = []
            for v in node.expressions:
                ir = fold(self.expr(v, context))
                if not isinstance(ir, Lit):
                    raise self.unsupported(f"IN with the non-constant value {ir.sql()}", v)
                ir = self.coerce_literal(ir, x, v)
                comparable(x, ir, "IN", self.pos(v))
                values.append(ir)
            return fold(InList(x, tuple(values)))
        if isinstance(node, (e.Like, e.ILike)):
            return self.like(node, None, context)
        if isinstance(node, e.Escape) and isinstance(node.this, (e.Like, e.ILike)):
            return self.like(node.this, node.expression, context)
        if isinstance(node, e.Escape):
            raise self.unsupported("ESCAPE outside LIKE", node, "ESCAPE")
        if isinstance(node, e.Is):
            if isinstance(node.expression, e.Null):
                return IsNull(self.expr(node.this, context))
            raise self.unsupported(f"IS {node.expression.sql(dialect=DIALECT)}", node, "IS")
        if isinstance(node, e.Case):
            return self.case(node, context)
        if isinstance(node, e.Nullif):  # CASE WHEN a = b THEN NULL ELSE a END
            value = self.expr(node.this, context)
            equal = self.compare("=", value, self.expr(node.expression, context), node)
            kind = unify(["null", value.kind], "NULLIF", pos)
            return fold(Case(((equal, Lit(None, "null")),), value, kind))
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
        if isinstance(node, e.TryCast):  # (a subclass of Cast)
            raise self.unsupported("TRY_CAST (NULL where the cast fails)", node, "TRY_CAST")
        if isinstance(node, e.Cast):
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
        if isinstance(node, e.Func):  # CURRENT_DATE, TRIM, ...: named as written
            name = function_name(self.text, node) or type(node).sql_names()[0]
            raise self.unsupported(f"the function {name.upper()}", node, name)
        label = type(node).__name__
        raise self.unsupported(f"{label} ({node.sql(dialect=DIALECT)[:40]})", node)

    # ---------------------------------------------------------------- subqueries
    def scalar_subquery(self, select: Any, node: Any, context: Context) -> Expr:
        """A scalar subquery (the compiler maintains those of WHERE)."""
        raise self.unsupported("a subquery here", node, "SELECT", construct="subquery")

    def exists_subquery(self, select: Any, node: Any, context: Context) -> Expr:
        raise self.unsupported("EXISTS (subquery) here", node, "EXISTS", construct="subquery")

    def quantified_subquery(self, op: str, node: Any, context: Context) -> Expr:
        raise self.unsupported("ALL/ANY (subquery) here", node, construct="subquery")

    def in_subquery(self, node: Any, context: Context) -> Expr:
        raise self.unsupported("IN (subquery) here", node, "IN", construct="subquery")

    def column(self, node: Any, context: Context) -> Expr:
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

    def arithmetic(self, op: str, node: Any, context: Context) -> Expr:
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
        if _decimal(left) and right.kind == "int":  # the literal on the right
            op, left, right = _MIRROR[op], right, left
        if _decimal(right) and left.kind == "int":
            return fold(_integer_comparison(op, left, right.value))
        return fold(Cmp(op, left, right))

    def case(self, node: Any, context: Context) -> Expr:
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

    def extract(self, node: Any, context: Context) -> Expr:
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
            written = function_name(self.text, node) or "EXTRACT"
            what = f"{written.upper()}({part.upper()} ...)"
            raise self.unsupported(what, node, written, construct=what)
        operand = self.expr(operand, context)
        require(operand, ("date",), f"EXTRACT({part.upper()})", self.pos(node))
        return fold(Extract(part, operand))

    def cast(self, node: Any, context: Context) -> Expr:
        from .catalog import type_kind

        to = node.args["to"]
        target = to.sql(dialect=DIALECT)
        try:
            kind = type_kind(target)
        except SqlTypeError:
            raise self.unsupported(f"CAST to {target}", node, "CAST") from None
        scale, limits = self.cast_limits(to, node)
        operand = self.expr(node.this, context)
        # a DATE (not a TIMESTAMP) is the day of its value
        day = kind == "date" and target.upper() in ("DATE", "DATE32")
        if isinstance(operand, Lit) and operand.type == "str" and kind == "date":
            return date_literal(operand.value, self.pos(node), day)
        allowed = {
            "int": ("int", "float", "str", "bool"),
            "float": ("int", "float", "str", "bool"),
            "date": ("date", "str"),
            "str": ("str", "int", "float"),
            "bool": ("bool",),
        }[kind]
        require(operand, allowed, f"CAST to {target}", self.pos(node))
        narrow = target if limits is not None else ""
        return fold(Cast(operand, kind, day, narrow, scale, limits))

    def cast_limits(self, to: Any, node: Any) -> tuple[int | None, tuple[int, int] | None]:
        """The scale a CAST to ``to`` rounds to (DECIMAL(p,s): s, else None) and the range
        of its (scaled) integers (None: BIGINT's, or a DOUBLE)."""
        name = to.this.name
        if name in _INTEGER_BITS:
            bits = _INTEGER_BITS[name]
            return None, (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if name in _UNSIGNED_BITS:  # held as BIGINT: UBIGINT up to 2**63 - 1
            return None, (0, min(2 ** _UNSIGNED_BITS[name], 2**63) - 1)
        if name != "DECIMAL" or not to.expressions:
            return None, None
        precision, scale = [int(p.name) for p in to.expressions] + [0] * (2 - len(to.expressions))
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise SqlTypeError(
                f"DECIMAL({precision}, {scale}): the width must be 1 to 38 and the scale 0 "
                "to the width",
                self.pos(node, "DECIMAL"),
                "DECIMAL",
            )
        return scale, (-(10**precision - 1), 10**precision - 1)

    def function(self, node: Any, context: Context) -> Expr:
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

    def like(self, node: Any, escape_node: Any, context: Context) -> Expr:
        """``x [NOT] [I]LIKE pattern [ESCAPE escape]`` with constant pattern and escape."""
        e = self.exp
        pos = self.pos(node)
        x = self.expr(node.this, context)
        require(x, ("str",), "LIKE", pos)
        pattern = fold(self.expr(node.expression, context))
        escape = Lit("", "str") if escape_node is None else fold(self.expr(escape_node, context))
        if any(isinstance(c, Lit) and c.value is None for c in (pattern, escape)):
            return Lit(None, "bool")  # x LIKE NULL, ... ESCAPE NULL: NULL
        for what, value in (("a pattern", pattern), ("an ESCAPE", escape)):
            if not (isinstance(value, Lit) and isinstance(value.value, str)):
                raise self.unsupported(f"LIKE with {what} that is not a string constant", node)
        if len(escape.value) > 1:
            raise SqlSemanticError(
                f"ESCAPE {escape.value!r}: the escape is one character (or empty)",
                self.pos(escape_node),
                "ESCAPE",
            )
        text = pattern.value
        escaped = len(text) - len(text.rstrip(escape.value)) if escape.value else 0
        if escaped % 2:  # an odd run of escapes at the end: the last one escapes nothing
            raise SqlSemanticError(
                f"LIKE pattern {pattern.value!r} ends with its escape character",
                pos,
                "ESCAPE",
            )
        negate = bool(node.args.get("negate"))
        return fold(Like(x, pattern.value, negate, isinstance(node, e.Like), escape.value))

    def aggregate(self, node: Any, context: Context) -> Expr:
        e = self.exp
        written = function_name(self.text, node)
        if type(node).__name__ in _AGGREGATES and str(written).upper() not in node.sql_names():
            written = None  # the name of a call in the argument (MIN(CAST(x AS ...)): CAST)
        name = (written or type(node).__name__).upper()
        if context.aggregates is None:
            where = (
                "inside another aggregate"
                if context.clause == "aggregate"
                else (f"in {context.clause}")
            )
            raise SqlSemanticError(
                f"aggregate function {name} is not allowed {where}", self.pos(node, written), name
            )
        if not isinstance(node, (e.Count, e.Sum, e.Avg, e.Min, e.Max)):
            raise self.unsupported(
                f"the aggregate {name}",
                node,
                written,
                "use SUM, COUNT, AVG, MIN or MAX",
                f"the aggregate {name}",
            )
        argument = node.this
        inner = Context(context.scope, None, "aggregate", context.aliases)
        function = _AGGREGATES[type(node).__name__]
        if isinstance(argument, e.Distinct):
            if len(argument.expressions) != 1:
                raise self.unsupported(f"{name}(DISTINCT ...) of several values", node, "DISTINCT")
            argument = argument.expressions[0]
            if function in ("count", "sum", "avg"):
                function += "_distinct"
        if isinstance(node, e.Count) and (argument is None or isinstance(argument, e.Star)):
            if function != "count":
                raise self.unsupported("COUNT(DISTINCT *)", node, "DISTINCT")
            return context.aggregates.add("count", None, node)
        if node.expressions:
            raise self.unsupported(f"{name} with several arguments", node)
        ir = self.expr(argument, inner)
        if function in ("sum", "avg", "sum_distinct", "avg_distinct"):
            require(ir, NUMBERS, name, self.pos(node))
        if isinstance(ir, Lit) and ir.value is None:  # no value to aggregate in any group
            return _of_nothing(function, ir.kind)
        return context.aggregates.add(function, ir, node)


#: the aggregate functions of a view, by sqlglot node class
_AGGREGATES = {"Count": "count", "Sum": "sum", "Avg": "avg", "Min": "min", "Max": "max"}

#: integer CAST targets narrower than BIGINT (sqlglot's names): their bits
_INTEGER_BITS = {"TINYINT": 8, "SMALLINT": 16, "INT": 32}
_UNSIGNED_BITS = {"UTINYINT": 8, "USMALLINT": 16, "UINT": 32, "UBIGINT": 64}


def _of_nothing(function: str, kind: str) -> Lit:
    """An aggregate over NULL only: COUNT is 0, SUM, AVG, MIN and MAX NULL (of the
    argument's kind; a BIGINT for the untyped NULL, a DOUBLE for AVG)."""
    if function in ("count", "count_distinct"):
        return Lit(0, "int")
    if function in ("avg", "avg_distinct"):
        return Lit(None, "float")
    return Lit(None, "int" if kind == "null" else kind)


def _flatten(node: Any, kind: type) -> list:
    out = []
    for side in (node.this, node.expression):
        inner = side
        if isinstance(inner, kind):
            out.extend(_flatten(inner, kind))
        else:
            out.append(side)
    return out


_MIRROR = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _decimal(expression: Expr) -> bool:
    """A non-NULL decimal literal within BIGINT's range (compared with BIGINT exactly)."""
    return (
        isinstance(expression, Lit)
        and expression.type == "float"
        and isinstance(expression.value, decimal.Decimal)
        and expression.value.is_finite()
        and abs(expression.value) < 2**63 - 1
    )


def _integer_comparison(op: str, x: Expr, value: decimal.Decimal) -> Expr:
    """``x op value`` for a BIGINT ``x`` as DuckDB compares it with a DECIMAL: exactly (in
    DOUBLE, 2**53 + 1 equalled 9007199254740992.0)."""
    floor = int(value.to_integral_value(decimal.ROUND_FLOOR))
    if floor == value:
        return Cmp(op, x, Lit(floor, "int"))
    ceiling = floor + 1
    if op in ("=", "<>"):  # never equal: x <> x is FALSE (= x = x is TRUE), NULL for NULL
        return Cmp("<>" if op == "=" else "=", x, x)
    bound = ceiling if op in ("<", ">=") else floor  # x < 2.5 is x < 3, x <= 2.5 is x <= 2
    return Cmp(op, x, Lit(bound, "int"))
