"""Typed scalar expressions over the columns of one batch, evaluated on whole numpy columns.

The compiler turns SQL expressions into these frozen nodes, checking types as it builds them
(:class:`~ringml.sql.errors.SqlTypeError` at the construct's position); the views evaluate
them on a batch's columns: per table alias (filters, computed join/group-by columns, the
per-table factors of an aggregate) and after aggregation (HAVING, arithmetic over aggregates,
ORDER BY keys).  Kinds are ``int``, ``float``, ``str``, ``date``, ``bool`` and ``null`` (the
NULL literal).  Semantics follow DuckDB: NULL propagates through arithmetic and comparisons,
AND/OR/NOT use three-valued logic, ``/`` is floating-point division (``x / 0`` is ±inf),
integer arithmetic that leaves int64 is an error.

Evaluation returns ``(values, null)``: an array of the batch's length and a bool mask of its
NULL rows (or None when there is none).  A NULL row's value is a harmless one of its kind
(the NULL literal's is FALSE), so whole-column operations never meet None.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from ..rings.scalar import int64_wrapped
from .errors import SqlTypeError, SqlUnsupportedError

NUMBERS = ("int", "float")
DTYPES = {
    "int": np.dtype(np.int64),
    "float": np.dtype(np.float64),
    "str": np.dtype(object),
    "date": np.dtype("datetime64[ns]"),
    "bool": np.dtype(bool),
    "null": np.dtype(bool),
}
FILL = {
    "int": 0,
    "float": 0.0,
    "str": "",
    "date": np.datetime64(0, "ns"),
    "bool": False,
    "null": False,
}
_SQL_TYPE = {
    "int": "BIGINT",
    "float": "DOUBLE",
    "str": "VARCHAR",
    "date": "DATE",
    "bool": "BOOLEAN",
    "null": "NULL",
}


class EvaluationError(Exception):
    """A value a batch cannot be evaluated on (an int64 overflow, a bad cast); the caller
    names the table and column."""

    def __init__(self, message: str, value: Any = None) -> None:
        super().__init__(message)
        self.value = value


Result = tuple[np.ndarray, "np.ndarray | None"]


# ------------------------------------------------------------------------------ nodes
@dataclass(frozen=True)
class Expr:
    """A typed expression; ``kind`` is its value kind.  Equality is structural (positions
    are not compared)."""

    @property
    def kind(self) -> str:
        raise NotImplementedError

    @property
    def nullable(self) -> bool:
        """Whether some row may evaluate to NULL (a base table's column only if declared
        ``NULL``)."""
        return any(c.nullable for c in self.children())

    def children(self) -> tuple[Expr, ...]:
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Expr):
                out.append(value)
            elif isinstance(value, tuple):
                for item in value:
                    if isinstance(item, Expr):
                        out.append(item)
                    elif isinstance(item, tuple):
                        out.extend(x for x in item if isinstance(x, Expr))
        return tuple(out)

    def map(self, fn: Callable[[Expr], Expr]) -> Expr:
        """This node with ``fn`` applied to each direct child."""
        changes = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Expr):
                changes[f.name] = fn(value)
            elif isinstance(value, tuple) and any(isinstance(x, Expr | tuple) for x in value):
                changes[f.name] = tuple(
                    fn(x)
                    if isinstance(x, Expr)
                    else tuple(fn(y) if isinstance(y, Expr) else y for y in x)
                    if isinstance(x, tuple)
                    else x
                    for x in value
                )
        return replace(self, **changes) if changes else self

    def walk(self):
        yield self
        for child in self.children():
            yield from child.walk()

    def sources(self) -> frozenset[str]:
        """The aliases whose columns the expression reads."""
        return frozenset(n.source for n in self.walk() if isinstance(n, Col))

    def columns(self) -> frozenset[str]:
        """The names of the columns the expression reads."""
        return frozenset(n.name for n in self.walk() if isinstance(n, Col))

    def sql(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.sql()

    def evaluate(self, env: Mapping[str, np.ndarray], n: int) -> Result:
        raise NotImplementedError


@dataclass(frozen=True)
class _Typed(Expr):
    """A node whose value kind is its ``type`` field."""

    @property
    def kind(self) -> str:
        return self.type


@dataclass(frozen=True)
class _TypedNullable(_Typed):
    """A typed node that may be NULL where its ``nulls`` field says so."""

    @property
    def nullable(self) -> bool:
        return self.nulls


@dataclass(frozen=True)
class Col(_TypedNullable):
    """A column: of table alias ``source``, or a slot of the aggregated result (``""``)."""

    source: str
    name: str
    type: str
    # post-aggregation slots may hold NULL (SUM of no value), and so may a table's columns
    # declared NULL and the columns of a view read as a table (their values are then
    # ``(values, null)`` pairs)
    nulls: bool = False
    # how the SQL text wrote an aggregate's slot (``SUM(i)`` for ``#a0``), for messages
    label: str = field(default="", compare=False)

    def sql(self) -> str:
        if self.label:
            return self.label
        name = (
            self.name
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name)
            else ('"' + self.name.replace('"', '""') + '"')
        )
        return f"{self.source}.{name}" if self.source else name

    def evaluate(self, env, n):
        values = env[self.name]
        if isinstance(values, tuple):
            return values
        return values, None


@dataclass(frozen=True)
class Lit(_Typed):
    """A constant: int, float (held as ``decimal.Decimal`` for exact folding), str, bool,
    date (``numpy.datetime64`` in ns) or None."""

    value: Any
    type: str

    @property
    def nullable(self) -> bool:
        return self.value is None

    def python(self) -> Any:
        if isinstance(self.value, decimal.Decimal):
            return float(self.value)
        return self.value

    def sql(self) -> str:
        v = self.value
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "TRUE" if v else "FALSE"
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        if self.type == "date":
            return f"TIMESTAMP '{pd.Timestamp(v)}'"
        return str(v)

    def evaluate(self, env, n):
        if self.value is None:
            return np.full(n, FILL[self.type], dtype=DTYPES[self.type]), np.ones(n, dtype=bool)
        value = self.python()
        if self.type == "str":
            out = np.empty(n, dtype=object)
            out[:] = value
            return out, None
        return np.full(n, value, dtype=DTYPES[self.type]), None


@dataclass(frozen=True)
class Interval:
    """An INTERVAL literal (only ever added to or subtracted from a date)."""

    months: int
    days: int


@dataclass(frozen=True)
class Arith(Expr):
    """``left op right`` for ``+ - * /`` on numbers (``/`` gives a float)."""

    op: str
    left: Expr
    right: Expr

    @property
    def kind(self) -> str:
        if self.op == "/" or "float" in (self.left.kind, self.right.kind):
            return "float"
        return "int"

    def sql(self) -> str:
        return f"({self.left.sql()} {self.op} {self.right.sql()})"

    def evaluate(self, env, n):
        lv, ln = self.left.evaluate(env, n)
        rv, rn = self.right.evaluate(env, n)
        null = _or(ln, rn)
        if self.kind == "int":
            lv, rv = lv.astype(np.int64, copy=False), rv.astype(np.int64, copy=False)
            with np.errstate(over="ignore"):
                out = _OPS[self.op](lv, rv)
            big = int64_wrapped(self.op, lv, rv, out)
            if null is not None:
                big &= ~null
            if big.any():
                at = int(np.flatnonzero(big)[0])
                raise EvaluationError(f"{self.sql()} overflows BIGINT", (lv[at], rv[at]))
            return out, null
        with np.errstate(all="ignore"):
            out = _OPS[self.op](lv.astype(np.float64), rv.astype(np.float64))
        return out, null


_OPS: dict[str, Callable] = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": np.true_divide,
}


@dataclass(frozen=True)
class Neg(Expr):
    operand: Expr

    @property
    def kind(self) -> str:
        return self.operand.kind

    def sql(self) -> str:
        return f"(-{self.operand.sql()})"

    def evaluate(self, env, n):
        v, null = self.operand.evaluate(env, n)
        _check_negatable(self, v, null)
        return np.negative(v), null


def _check_negatable(expr: Expr, v: np.ndarray, null: np.ndarray | None) -> None:
    """:class:`EvaluationError` where ``expr`` (a negation or ABS) would negate -2**63."""
    if v.dtype.kind != "i" or not v.size:
        return
    smallest = v == np.iinfo(np.int64).min
    if null is not None:
        smallest &= ~null
    if smallest.any():
        raise EvaluationError(f"{expr.sql()} overflows BIGINT", int(np.iinfo(np.int64).min))


@dataclass(frozen=True)
class DateShift(Expr):
    """A date plus (or minus) an interval of months and days."""

    operand: Expr
    months: int
    days: int

    @property
    def kind(self) -> str:
        return "date"

    def sql(self) -> str:
        return f"({self.operand.sql()} + INTERVAL '{self.months} months {self.days} days')"

    def evaluate(self, env, n):
        v, null = self.operand.evaluate(env, n)
        out = pd.DatetimeIndex(v)
        if self.months:
            out = out + pd.DateOffset(months=self.months)
        if self.days:
            out = out + pd.Timedelta(days=self.days)
        return out.to_numpy().astype("datetime64[ns]"), null


@dataclass(frozen=True)
class Cmp(Expr):
    """``left op right`` for ``= <> < <= > >=``."""

    op: str
    left: Expr
    right: Expr

    @property
    def kind(self) -> str:
        return "bool"

    def sql(self) -> str:
        return f"({self.left.sql()} {self.op} {self.right.sql()})"

    def evaluate(self, env, n):
        lv, ln = self.left.evaluate(env, n)
        rv, rn = self.right.evaluate(env, n)
        null = _or(ln, rn)
        if null is not None:  # object comparisons with None would raise
            lv, rv = _filled(lv, null, self.left.kind), _filled(rv, null, self.right.kind)
        with np.errstate(invalid="ignore"):
            out = _compare(self.op, np.asarray(lv), np.asarray(rv))
        return out, null


def _compare(op: str, lv: np.ndarray, rv: np.ndarray) -> np.ndarray:
    """``lv op rv`` in DuckDB's order of floats: NaN equals NaN and is greater than every
    other number (numpy's comparisons with NaN are all false but ``<>``)."""
    out = np.asarray(_CMP[op](lv, rv), dtype=bool)
    if "f" not in (lv.dtype.kind, rv.dtype.kind):
        return out
    ln = np.isnan(lv) if lv.dtype.kind == "f" else np.zeros(lv.shape, dtype=bool)
    rn = np.isnan(rv) if rv.dtype.kind == "f" else np.zeros(rv.shape, dtype=bool)
    either = ln | rn
    if not either.any():
        return out
    both = ln & rn
    nan_order = {"=": both, "<>": ~both, "<": ~ln & rn, "<=": rn, ">": ln & ~rn, ">=": ln}[op]
    return np.where(either, nan_order, out)


_CMP: dict[str, Callable] = {
    "=": np.equal,
    "<>": np.not_equal,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


@dataclass(frozen=True)
class InList(Expr):
    """``operand [NOT] IN (constants)``."""

    operand: Expr
    values: tuple[Lit, ...]
    negate: bool = False

    @property
    def kind(self) -> str:
        return "bool"

    @property
    def nullable(self) -> bool:
        return self.operand.nullable or any(v.value is None for v in self.values)

    def sql(self) -> str:
        inner = ", ".join(v.sql() for v in self.values)
        return f"({self.operand.sql()} {'NOT ' if self.negate else ''}IN ({inner}))"

    def evaluate(self, env, n):
        v, null = self.operand.evaluate(env, n)
        present = [x.python() for x in self.values if x.value is not None]
        hit = pd.Series(v).isin(present).to_numpy()
        if any(x.value is None for x in self.values):  # x IN (.., NULL): NULL unless found
            null = _or(null, ~hit)
        return (~hit if self.negate else hit), null


@dataclass(frozen=True)
class Like(Expr):
    """``operand [NOT] [I]LIKE pattern [ESCAPE escape]`` (``%`` any run, ``_`` one
    character; the escape character, when given, makes the next one literal)."""

    operand: Expr
    pattern: str
    negate: bool = False
    case_sensitive: bool = True
    escape: str = ""

    @property
    def kind(self) -> str:
        return "bool"

    def sql(self) -> str:
        word = "LIKE" if self.case_sensitive else "ILIKE"
        pattern = self.pattern.replace("'", "''")
        escape = " ESCAPE '{}'".format(self.escape.replace("'", "''")) if self.escape else ""
        return f"({self.operand.sql()} {'NOT ' if self.negate else ''}{word} '{pattern}'{escape})"

    def evaluate(self, env, n):
        v, null = self.operand.evaluate(env, n)
        regex = like_regex(self.pattern, self.escape)
        text = pd.Series(_filled(v, null, "str"), dtype=object)
        hit = text.str.fullmatch(regex, case=self.case_sensitive, flags=re.DOTALL)
        hit = hit.fillna(False).to_numpy(dtype=bool)
        return (~hit if self.negate else hit), null


def like_regex(pattern: str, escape: str = "") -> str:
    """The regular expression of a LIKE pattern (``escape``: "" or one character, which the
    pattern does not end with)."""
    parts, literal = [], False
    for ch in pattern:
        if literal or ch not in ("%", "_", escape):
            parts.append(re.escape(ch))
            literal = False
        elif ch == escape:
            literal = True
        else:
            parts.append(".*" if ch == "%" else ".")
    return "".join(parts)


@dataclass(frozen=True)
class IsNull(Expr):
    operand: Expr
    negate: bool = False

    @property
    def kind(self) -> str:
        return "bool"

    @property
    def nullable(self) -> bool:
        return False

    def sql(self) -> str:
        return f"({self.operand.sql()} IS {'NOT ' if self.negate else ''}NULL)"

    def evaluate(self, env, n):
        _, null = self.operand.evaluate(env, n)
        out = np.zeros(n, dtype=bool) if null is None else null.copy()
        return (~out if self.negate else out), None


@dataclass(frozen=True)
class Logic(Expr):
    """``AND`` / ``OR`` of conditions (three-valued)."""

    op: str
    parts: tuple[Expr, ...]

    @property
    def kind(self) -> str:
        return "bool"

    def sql(self) -> str:
        return "(" + f" {self.op.upper()} ".join(p.sql() for p in self.parts) + ")"

    def evaluate(self, env, n):
        decided = np.zeros(n, dtype=bool)  # a FALSE part (AND) / a TRUE part (OR)
        unknown = np.zeros(n, dtype=bool)
        for part in self.parts:
            v, null = part.evaluate(env, n)
            known = v if null is None else v & ~null
            if self.op == "and":
                decided |= ~v if null is None else ~v & ~null
            else:
                decided |= known
            if null is not None:
                unknown |= null
        unknown &= ~decided
        value = ~decided if self.op == "and" else decided
        return value & ~unknown, (unknown if unknown.any() else None)


@dataclass(frozen=True)
class Not(Expr):
    operand: Expr

    @property
    def kind(self) -> str:
        return "bool"

    def sql(self) -> str:
        return f"(NOT {self.operand.sql()})"

    def evaluate(self, env, n):
        v, null = self.operand.evaluate(env, n)
        return ~v, null


@dataclass(frozen=True)
class Case(_Typed):
    """``CASE WHEN cond THEN value ... [ELSE default] END`` (no ELSE: NULL)."""

    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr | None
    type: str

    @property
    def nullable(self) -> bool:
        branches = [v for _, v in self.whens] + ([self.default] if self.default else [])
        return self.default is None or any(b.nullable for b in branches)

    def sql(self) -> str:
        parts = " ".join(f"WHEN {c.sql()} THEN {v.sql()}" for c, v in self.whens)
        tail = f" ELSE {self.default.sql()}" if self.default is not None else ""
        return f"CASE {parts}{tail} END"

    def evaluate(self, env, n):
        if self.default is None:
            out = np.full(n, FILL[self.type], dtype=DTYPES[self.type])
            null = np.ones(n, dtype=bool)
        else:
            v, vn = self.default.evaluate(env, n)
            out = _as_kind(v, self.type).copy()
            null = np.zeros(n, dtype=bool) if vn is None else vn.copy()
        for cond, value in reversed(self.whens):
            c, cn = cond.evaluate(env, n)
            take = c if cn is None else c & ~cn
            if not take.any():
                continue
            v, vn = value.evaluate(env, n)
            out[take] = _as_kind(v, self.type)[take]
            null[take] = False if vn is None else vn[take]
        return out, (null if null.any() else None)


@dataclass(frozen=True)
class Extract(Expr):
    """``EXTRACT(part FROM date)``."""

    part: str
    operand: Expr

    @property
    def kind(self) -> str:
        return "int"

    def sql(self) -> str:
        return f"EXTRACT({self.part.upper()} FROM {self.operand.sql()})"

    def evaluate(self, env, n):
        v, null = self.operand.evaluate(env, n)
        index = pd.DatetimeIndex(v)
        if self.part == "dow":  # DuckDB: Sunday is 0
            out = (index.dayofweek.to_numpy() + 1) % 7
        elif self.part == "isodow":
            out = index.dayofweek.to_numpy() + 1
        else:
            out = getattr(index, _PARTS[self.part]).to_numpy()
        return np.asarray(out, dtype=np.int64), null


_PARTS = {
    "year": "year",
    "month": "month",
    "day": "day",
    "quarter": "quarter",
    "doy": "dayofyear",
    "hour": "hour",
    "minute": "minute",
    "second": "second",
    "dow": "dayofweek",
    "isodow": "dayofweek",
}


@dataclass(frozen=True)
class Func(_Typed):
    """A scalar function: ``abs``, ``lower``, ``upper``, ``length``, ``substring``,
    ``coalesce``."""

    name: str
    args: tuple[Expr, ...]
    type: str

    @property
    def nullable(self) -> bool:
        if self.name == "coalesce":
            return all(a.nullable for a in self.args)
        return super().nullable

    def sql(self) -> str:
        return f"{self.name}({', '.join(a.sql() for a in self.args)})"

    def evaluate(self, env, n):
        values = [a.evaluate(env, n) for a in self.args]
        if self.name == "coalesce":
            out = np.full(n, FILL[self.type], dtype=DTYPES[self.type])
            null = np.ones(n, dtype=bool)
            for v, vn in reversed(values):
                take = np.ones(n, dtype=bool) if vn is None else ~vn
                out[take] = _as_kind(v, self.type)[take]
                null[take] = False
            return out, (null if null.any() else None)
        null = None
        for _, vn in values:
            null = _or(null, vn)
        v = values[0][0]
        if self.name == "abs":
            _check_negatable(self, v, null)
            return np.abs(v), null
        text = pd.Series(_filled(v, null, "str"), dtype=object).str
        if self.name in ("lower", "upper"):
            return text.translate(_case_table(self.name)).to_numpy(dtype=object), null
        if self.name == "length":
            return text.len().to_numpy(dtype=np.int64), null
        if self.name == "substring":  # 1-based start, optional length (literals)
            start = int(values[1][0][0]) if n else 1
            length = int(values[2][0][0]) if len(values) > 2 and n else None
            return text.slice(*_substring_bounds(start, length)).to_numpy(dtype=object), null
        raise AssertionError(self.name)


@dataclass(frozen=True)
class Cast(_Typed):
    """``CAST(operand AS type)`` between numbers, and from text to numbers or dates.

    ``target`` is the type as written when narrower than the kind: an integer type whose
    values must lie in ``limits`` (TINYINT: -128..127), or a DECIMAL(p,s), rounded to
    ``scale`` s places half away from zero and held as a DOUBLE, whose scaled values must
    lie in ``limits`` (+-(10**p - 1)).  A value outside fails the batch, named."""

    operand: Expr
    type: str
    day: bool = False  # a DATE: the day of the value (a TIMESTAMP keeps its time)
    target: str = ""
    scale: int | None = None
    limits: tuple[int, int] | None = None

    def sql(self) -> str:
        target = "TIMESTAMP" if self.type == "date" and not self.day else _SQL_TYPE[self.type]
        return f"CAST({self.operand.sql()} AS {self.target or target})"

    def evaluate(self, env, n):
        v, null = self.operand.evaluate(env, n)
        try:
            out = self._decimal(v, null) if self.scale is not None else self._convert(v, null)
        except (ValueError, TypeError, OverflowError) as error:
            raise EvaluationError(f"{self.sql()}: {error}") from None
        if self.limits is not None and self.scale is None:
            self._check(out, v, null)
        return out, null

    def _convert(self, v: np.ndarray, null: np.ndarray | None) -> np.ndarray:
        source = self.operand.kind
        if source == self.type and not self.day:
            return v
        if self.type == "float":
            return pd.to_numeric(pd.Series(_filled(v, null, source))).to_numpy(dtype=np.float64)
        if self.type == "int":
            if source == "str":
                return _text_to_int(self.sql(), _filled(v, null, source))
            x = pd.to_numeric(pd.Series(_filled(v, null, source))).to_numpy()
            if x.dtype.kind == "f":
                # DuckDB rounds a DOUBLE half to even, a DECIMAL (a decimal literal) half away
                x = _round_half_away(x) if _duckdb_decimal(self.operand) else np.rint(x)
                if not np.all(np.abs(x) < 2.0**63):
                    raise EvaluationError(f"{self.sql()} overflows BIGINT")
            return x.astype(np.int64)
        if self.type == "date":
            out = pd.to_datetime(pd.Series(_filled(v, null, source)), format="ISO8601")
            out = out.dt.floor("D") if self.day else out
            return out.to_numpy().astype("datetime64[ns]")
        if self.type == "str":
            return np.asarray(pd.Series(v).astype(str), dtype=object)
        raise AssertionError(self.type)

    def _decimal(self, v: np.ndarray, null: np.ndarray | None) -> np.ndarray:
        """DuckDB's DECIMAL(p,s) of each value as a DOUBLE: a DOUBLE times 10**s rounded
        half away from zero (as DuckDB does, in DOUBLE), a text or decimal literal by its
        digits, an integer exactly."""
        source, unit = self.operand.kind, 10.0**self.scale
        if isinstance(self.operand, Lit) and source in NUMBERS:  # by its digits, as text
            v, source = np.full(len(v), str(self.operand.value), dtype=object), "str"
        if source in ("int", "bool"):
            x = v.astype(np.int64)
            bound = self.limits[1] // 10**self.scale
            if bound < 2**63 - 1:
                self._check(x, v, null, (-bound, bound))
            return x.astype(np.float64)
        if source == "str":
            text = pd.Series(_filled(v, null, "str"), dtype=object).str.strip()
            y = pd.to_numeric(text).to_numpy(dtype=np.float64) * unit
        else:
            y = v.astype(np.float64) * unit
        scaled = _round_half_away(y)
        if source == "str":  # a digit string near a half (y is off by ~1e-16 y): by its digits
            tie = np.abs(np.abs(y - np.trunc(y)) - 0.5) <= 1e-12 * np.maximum(1.0, np.abs(y))
            tie &= np.isfinite(y)
            if tie.any():
                with decimal.localcontext() as context:
                    context.prec = 80  # DECIMAL(38, s) and an exponent: every digit
                    exact = [decimal.Decimal(t).scaleb(self.scale) for t in text.to_numpy()[tie]]
                    scaled[tie] = [float(d.quantize(1, decimal.ROUND_HALF_UP)) for d in exact]
        self._check(scaled, v, null)
        return scaled / unit

    def _check(self, x: np.ndarray, v: np.ndarray, null, limits=None) -> None:
        """:class:`EvaluationError` naming the first value ``v`` whose ``x`` leaves the
        target's range (NaN, of a NaN or an empty text, does)."""
        low, high = limits or self.limits
        bad = ~((x >= low) & (x <= high))
        if null is not None:
            bad &= ~null
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            value = v[at].item() if isinstance(v[at], np.generic) else v[at]
            what = "is not a number" if np.isnan(x[at]) else f"overflows {self.target}"
            raise EvaluationError(f"{self.sql()} {what}: {value!r}", value)


@dataclass(frozen=True)
class AggRef(_TypedNullable):
    """An aggregate call inside a post-aggregation expression, before it gets a slot
    (compile time only)."""

    index: int
    type: str
    nulls: bool = field(default=False)
    text: str = field(default="", compare=False)  # the call as written, e.g. ``SUM(i)``

    def sql(self) -> str:
        return self.text or f"#agg{self.index}"


# ------------------------------------------------------------------------------ helpers
def _substring_bounds(start: int, length: int | None) -> tuple[int | None, int | None]:
    """DuckDB's ``substring(s, start, length)`` as one Python slice of every string: a
    negative start counts from the end, a negative length takes the characters before
    ``start``; the slice's negative bounds count from each string's own end."""
    if start < 0:  # offsets from the end: Python's negative indices
        begin, end = start, None if length is None else start + length
        if length is not None and length < 0:
            begin, end = start + length, start
        return begin, None if end is None or end >= 0 else end
    begin = start - 1  # 0-based; start 0 is the position before the first character
    end = None if length is None else begin + length
    if length is not None and length < 0:
        begin, end = begin + length, begin
    return max(begin, 0), None if end is None else max(end, 0)


@functools.cache
def _case_table(name: str) -> dict[int, str]:
    """DuckDB's UPPER/LOWER, one character to one (Unicode's simple case mapping, and 'ß'
    to 'ẞ'), as a ``str.translate`` table.  Python's ``str.upper``/``lower`` map fully and
    in context: 'ß' to 'SS', 'ﬁ' to 'FI', 'İ' to 'i' + U+0307, a final 'Σ' to 'ς'.  Here a
    character whose full mapping is several keeps its simple one: the titlecase letter for
    the Greek letters with ypogegrammeni ('ᾳ' to 'ᾼ'), 'ẞ' for 'ß', 'i' for 'İ'; else it
    stays."""
    table = {}
    for code in range(0x110000):
        char = chr(code)
        mapped = char.upper() if name == "upper" else char.lower()
        if len(mapped) > 1 and name == "upper":
            mapped = char.title()
        if mapped != char and len(mapped) == 1:
            table[code] = mapped
    table.update({0xDF: "\u1e9e"} if name == "upper" else {0x130: "i"})
    return table


def _duckdb_decimal(x: Expr) -> bool:
    """Whether DuckDB types ``x`` DECIMAL: a decimal literal, a CAST to DECIMAL, and ``+ - *``
    or a negation of those and integers (``0.5 * n``; ``/`` and DOUBLE operands give DOUBLE)."""
    if isinstance(x, Lit | Cast):
        return isinstance(x, Lit) and x.type == "float" or getattr(x, "scale", None) is not None
    if isinstance(x, Neg):
        return _duckdb_decimal(x.operand)
    if isinstance(x, Arith) and x.op != "/":
        sides = (x.left, x.right)
        return all(s.kind == "int" or _duckdb_decimal(s) for s in sides) and any(
            _duckdb_decimal(s) for s in sides
        )
    return False


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to integers, halves away from zero (``x - trunc(x)`` is exact)."""
    whole = np.trunc(x)
    return np.where(np.abs(x - whole) >= 0.5, whole + np.sign(x), whole)


_WHOLE = r"\s*[+-]?\d+\s*"


def _text_to_int(what: str, text: np.ndarray) -> np.ndarray:
    """``CAST(text AS BIGINT)``: whole numbers exactly, others rounded half away from zero
    (exactly, by their digits, where a float would not hold them)."""
    series = pd.Series(text, dtype=object)
    whole = series.str.fullmatch(_WHOLE).fillna(False).to_numpy(dtype=bool)
    out = np.zeros(len(series), dtype=np.int64)
    if whole.any():
        try:
            values = pd.to_numeric(series[whole]).to_numpy()
        except ValueError:  # "Integer out of range"
            values = np.zeros(0, dtype=np.uint64)
        if values.dtype != np.int64:  # beyond int64 (pandas went unsigned, or refused)
            raise EvaluationError(f"{what} overflows BIGINT")
        out[whole] = values
    if not whole.all():
        floats = pd.to_numeric(series[~whole]).to_numpy(dtype=np.float64)
        rounded = _round_half_away(floats)
        if not np.all(np.abs(rounded) < 2.0**63):
            raise EvaluationError(f"{what} overflows BIGINT")
        wide = np.abs(floats) >= 2.0**52  # beyond the floats' integers: by the digits
        if wide.any():
            half_up = decimal.ROUND_HALF_UP
            digits = series[~whole].to_numpy()[wide]
            rounded = rounded.astype(object)
            rounded[wide] = [int(decimal.Decimal(t.strip()).quantize(1, half_up)) for t in digits]
        out[~whole] = rounded
    return out


def _or(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def _filled(values: np.ndarray, null: np.ndarray | None, kind: str) -> np.ndarray:
    """``values`` with NULL rows replaced by a harmless value of their kind."""
    if null is None or not null.any():
        return values
    out = values.copy()
    out[null] = FILL[kind]
    return out


def _as_kind(values: np.ndarray, kind: str) -> np.ndarray:
    dtype = DTYPES[kind]
    if values.dtype == dtype:
        return values
    if values.dtype.kind == "O":  # NULLs as objects (a subquery's all-NULL column)
        return np.full(values.shape[0], FILL[kind], dtype=dtype)
    return values.astype(dtype)


def truth(expr: Expr, env: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """The rows where a condition is TRUE (not FALSE, not NULL)."""
    v, null = expr.evaluate(env, n)
    return v if null is None else v & ~null


def key_values(expr: Expr, env: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """A key column's values, NULL rows holding their kind's fill (the compiler makes the
    NULL indicator a key of its own)."""
    v, null = expr.evaluate(env, n)
    return _filled(v, null, expr.kind)


def as_numbers(expr: Expr, env: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """A numeric expression's values with NULL as 0 (bools as 0/1)."""
    v, null = expr.evaluate(env, n)
    if v.dtype.kind == "b":
        v = v.astype(np.int64)
    if null is not None and null.any():
        v = v.copy()
        v[null] = 0
    return v


# ------------------------------------------------------------------------------ typing
def unify(kinds: list[str], what: str, position=None) -> str:
    """The common kind of values meeting in a CASE / COALESCE / comparison."""
    real = [k for k in kinds if k != "null"]
    if not real:
        return "null"
    if all(k in NUMBERS for k in real):
        return "float" if "float" in real else "int"
    if len(set(real)) == 1:
        return real[0]
    raise SqlTypeError(
        f"{what} mixes {' and '.join(sorted({_SQL_TYPE[k] for k in real}))} values",
        position,
        what,
    )


def comparable(left: Expr, right: Expr, what: str, position=None) -> None:
    """:class:`SqlTypeError` unless ``left`` and ``right`` can be compared."""
    kinds = {left.kind, right.kind} - {"null"}
    if len(kinds) <= 1 or kinds <= set(NUMBERS):
        return
    raise SqlTypeError(
        f"cannot compare {_describe(left)} with {_describe(right)} in {what}", position, what
    )


def _describe(expr: Expr) -> str:
    return f"{expr.sql()} ({_SQL_TYPE[expr.kind]})"


def require(expr: Expr, kinds: tuple[str, ...], what: str, position=None) -> None:
    """:class:`SqlTypeError` unless ``expr`` is of one of ``kinds`` (or NULL)."""
    if expr.kind not in kinds and expr.kind != "null":
        wanted = " or ".join(_SQL_TYPE[k] for k in kinds)
        raise SqlTypeError(f"{what} needs {wanted}, got {_describe(expr)}", position, what)


def date_literal(text: str, position=None, day: bool = False) -> Lit:
    """A DATE/TIMESTAMP literal from its text (``day``: a DATE, the day of the text)."""
    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError):
        raise SqlTypeError(f"{text!r} is not a date", position, text) from None
    if stamp is pd.NaT or stamp.tzinfo is not None:
        raise SqlTypeError(f"{text!r} is not a date without time zone", position, text)
    if day:
        stamp = stamp.floor("D")
    return Lit(np.datetime64(stamp.to_datetime64(), "ns"), "date")


def literal(value: Any) -> Lit:
    """A literal from a Python value."""
    if value is None:
        return Lit(None, "null")
    if isinstance(value, bool | np.bool_):
        return Lit(bool(value), "bool")
    if isinstance(value, int | np.integer):
        return Lit(int(value), "int")
    if isinstance(value, decimal.Decimal):
        text = str(value).lower()
        integral = value == value.to_integral_value() and "." not in text and "e" not in text
        if integral and abs(value) < 2**63:
            return Lit(int(value), "int")
        return Lit(value, "float")
    if isinstance(value, float | np.floating):
        return Lit(decimal.Decimal(repr(float(value))), "float")
    if isinstance(value, str):
        return Lit(value, "str")
    if isinstance(value, datetime.date | np.datetime64 | pd.Timestamp):
        return date_literal(str(pd.Timestamp(value)))
    raise SqlUnsupportedError(f"literal {value!r} of type {type(value).__name__}")


@dataclass(frozen=True)
class SubqueryRef(_TypedNullable):
    """The value of the view's subquery ``index`` for each row: ``args`` are the outer
    values it is correlated with (one per equality, then the inequality's, if any).  A read
    evaluates it with ``env["#s<index>"](values, null, n)``, a lookup into the subquery's
    maintained view (``null``: the rows with a NULL argument, which no correlation holds
    for)."""

    index: int
    args: tuple[Expr, ...]
    type: str
    nulls: bool
    text: str

    def sql(self) -> str:
        return f"({self.text})"

    def evaluate(self, env, n):
        values, null = [], None
        for arg in self.args:
            v, vn = arg.evaluate(env, n)
            values.append(v)
            null = _or(null, vn)
        return env[f"#s{self.index}"](values, null, n)


def fold(expr: Expr) -> Expr:
    """``expr`` as a literal when it reads no column (and evaluates without error) or is
    NULL on every row (NULL propagates from a NULL literal operand); a CASE without the
    WHENs whose condition is a constant."""
    if _null_operand(expr):
        return Lit(None, expr.kind)
    if isinstance(expr, Case):
        expr = _constant_whens(expr)
    if (
        isinstance(expr, Lit | Col | AggRef)
        or expr.columns()
        or any(isinstance(n, AggRef | SubqueryRef) for n in expr.walk())
    ):
        return expr
    if isinstance(expr, Arith) and isinstance(expr.left, Lit) and isinstance(expr.right, Lit):
        exact = _exact_arith(expr)
        if exact is not None:
            return exact
    try:
        values, null = expr.evaluate({}, 1)
    except (EvaluationError, ValueError, TypeError, OverflowError):
        return expr
    if null is not None and null[0]:
        return Lit(None, expr.kind)
    value = values[0]
    if expr.kind == "date":
        return Lit(np.datetime64(value, "ns"), "date")
    if isinstance(value, np.generic):
        value = value.item()
    if expr.kind == "float":
        return Lit(decimal.Decimal(repr(float(value))), "float")
    return Lit(value, expr.kind)


def _null_operand(expr: Expr) -> bool:
    """Whether ``expr`` is NULL whenever an operand is, and one is the NULL literal."""
    if isinstance(expr, InList):  # x IN (.., NULL) may hold: only x counts
        operands = (expr.operand,)
    elif isinstance(expr, Arith | Neg | DateShift | Cmp | Like | Extract | Cast | Not) or (
        isinstance(expr, Func) and expr.name != "coalesce"
    ):
        operands = expr.children()
    else:
        return False
    return any(isinstance(x, Lit) and x.value is None for x in operands)


def _constant_whens(case: Case) -> Expr:
    """``case`` without its WHENs of constant conditions: a FALSE or NULL one never holds,
    a TRUE one's value is the ELSE of the WHENs before it."""
    whens, default = [], case.default
    for cond, value in case.whens:
        if not isinstance(cond, Lit):
            whens.append((cond, value))
        elif cond.value is True:
            default = value
            break
    if len(whens) == len(case.whens):
        return case
    if whens:
        return Case(tuple(whens), default, case.type)
    if default is None:
        return Lit(None, case.type)
    return default if default.kind == case.type else fold(Cast(default, case.type))


def _exact_arith(expr: Arith) -> Lit | None:
    """Literal arithmetic in exact decimals (``.06 + 0.01`` is ``0.07``, as in DuckDB)."""
    a, b = expr.left.value, expr.right.value
    if not all(isinstance(x, int | decimal.Decimal) and not isinstance(x, bool) for x in (a, b)):
        return None
    da, db = decimal.Decimal(a), decimal.Decimal(b)
    with decimal.localcontext() as context:
        context.prec = 38
        if expr.op == "+":
            out = da + db
        elif expr.op == "-":
            out = da - db
        elif expr.op == "*":
            out = da * db
        else:
            if db == 0:
                return None
            out = da / db
    if expr.kind == "int":
        if abs(out) >= 2**63:
            return None
        return Lit(int(out), "int")
    return Lit(out, "float")
