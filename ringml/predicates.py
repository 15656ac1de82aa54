"""Single-relation filters as data: immutable predicates evaluated on whole numpy columns.

Build them in Python — ``col("price") > 100_000``, ``(col("a") == 1) | col("b").isin([2, 3])``,
``col("name").like("ab%")``, ``~col("x").is_null()``, arithmetic ``col("a") + col("b") * 2`` —
or parse a SQL boolean expression with :func:`where` (``where("price > 1e5 AND kind IN ('a',
'b')")``; sqlglot is imported only then).  Predicates pickle, compare equal structurally
(``==`` between two predicates; ``==`` on a column or value expression builds a comparison),
and their ``repr`` is a canonical SQL text that :func:`where` parses back to an equal
predicate (query fingerprints use it).

Semantics are SQL's: NULL (None, NaN, NaT, ``pd.NA``) makes a comparison unknown, ``NOT``,
``AND`` and ``OR`` follow three-valued logic, and a row is kept only where the condition is
TRUE; ``x / 0`` is NULL.  Numbers never compare with strings (a :class:`~ringml.BatchError`
naming the relation, column and value); in object columns ``=``/``<>``/``IN`` compare values
of different types as unequal and ordering them is an error.

A Python callable is accepted only wrapped as :func:`opaque`, which opts the query out of
pickling and checkpointing.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .errors import BatchError, SchemaError

__all__ = [
    "Col",
    "Expr",
    "Lit",
    "Opaque",
    "Predicate",
    "col",
    "lit",
    "opaque",
    "where",
]

_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
}


# ---------------------------------------------------------------------------- evaluation
@dataclass
class _Val:
    """An evaluated expression: values (array of the batch's length, or a scalar), NULL mask
    (array, or a bool for scalars) and the column the values come from (for messages)."""

    values: Any
    null: Any
    column: str | None = None


class _Rows:
    """The columns of one batch, read on demand (``frame[c].to_numpy()``)."""

    def __init__(self, data: pd.DataFrame | Mapping[str, Any], relation: str) -> None:
        self.data = data
        self.relation = relation
        if isinstance(data, pd.DataFrame):
            self.n = len(data)
        else:
            self.n = len(next(iter(data.values()))) if len(data) else 0
        self._cache: dict[str, _Val] = {}

    def column(self, name: str) -> _Val:
        if name not in self._cache:
            if name not in self.data:
                raise BatchError(
                    f"relation {self.relation!r}: the filter needs column {name!r}, which the "
                    "rows lack",
                    self.relation,
                    name,
                )
            raw = self.data[name]
            values = raw.to_numpy() if isinstance(raw, pd.Series) else np.asarray(raw)
            self._cache[name] = _Val(values, _nulls(values), name)
        return self._cache[name]

    def error(self, message: str, column: str | None, value: Any) -> BatchError:
        where = f"relation {self.relation!r}" + (f", column {column!r}" if column else "")
        return BatchError(f"{where}: {message}", self.relation, column, value)


def _nulls(values: np.ndarray) -> np.ndarray | bool:
    """The NULL rows (None, NaN, NaT, ``pd.NA``), or False when there is none."""
    kind = values.dtype.kind
    if kind == "f":
        mask = np.isnan(values)
    elif kind in "mM":
        mask = np.isnat(values)
    elif kind == "O":
        mask = np.asarray(pd.isna(values), dtype=bool)
    else:
        return False
    return mask if mask.any() else False


_KINDS = {"i": "number", "u": "number", "f": "number", "b": "number", "U": "string",
          "S": "string", "M": "time", "m": "time"}  # fmt: skip


def _kind(values: Any) -> str:
    """``number``, ``string``, ``time``, ``null`` or ``object`` (mixed, checked per value)."""
    if isinstance(values, np.ndarray):
        return _KINDS.get(values.dtype.kind, "object")
    if values is None:
        return "null"
    if isinstance(values, (bool, int, float)):
        return "number"
    return "string" if isinstance(values, str) else "object"


def _first(val: _Val, rows: _Rows, mask: np.ndarray | None = None) -> Any:
    """The first value of ``val`` (where ``mask``), for messages."""
    if not isinstance(val.values, np.ndarray):
        return val.values
    at = np.flatnonzero(mask) if mask is not None else np.arange(min(rows.n, 1))
    if not at.size:
        return None
    value = val.values[at[0]]
    return value.item() if isinstance(value, np.generic) else value


def _check_kinds(left: _Val, right: _Val, rows: _Rows, what: str) -> None:
    """Numbers and strings (or times) never meet: name the column side's first value."""
    kinds = {_kind(left.values), _kind(right.values)} - {"null", "object"}
    if len(kinds) > 1:
        column, other = (left, right) if left.column is not None else (right, left)
        raise rows.error(
            f"value {_first(column, rows)!r} ({_kind(column.values)}) cannot be {what} "
            f"{_first(other, rows)!r} ({_kind(other.values)})",
            column.column,
            _first(column, rows),
        )


def _or_null(a: Any, b: Any) -> Any:
    if a is False:
        return b
    if b is False:
        return a
    return np.logical_or(a, b)


def _full(mask: Any, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(mask, dtype=bool), (n,))


def _binary(
    fn: Callable[[Any, Any], Any], left: _Val, right: _Val, rows: _Rows, what: str
) -> tuple[Any, np.ndarray]:
    """``fn(left, right)`` on the rows where neither is NULL; TypeError -> BatchError."""
    null = _full(_or_null(left.null, right.null), rows.n)
    lv, rv = left.values, right.values
    some = None
    if null.any():
        some = ~null
        lv = lv[some] if isinstance(lv, np.ndarray) else lv
        rv = rv[some] if isinstance(rv, np.ndarray) else rv
    try:
        with np.errstate(all="ignore"):
            out = fn(lv, rv)
    except (TypeError, ValueError, OverflowError):
        a, b = _culprit(fn, lv, rv)
        column = left if left.column is not None else right
        value = a if column is left else b
        raise rows.error(
            f"value {value!r} cannot be {what} {b if column is left else a!r}",
            column.column,
            value,
        ) from None
    return out, some


def _culprit(fn, lv, rv) -> tuple[Any, Any]:
    """The first pair of values on which ``fn`` fails (error path only)."""
    n = max(len(x) if isinstance(x, np.ndarray) else 1 for x in (lv, rv))
    for i in range(n):
        a = lv[i] if isinstance(lv, np.ndarray) else lv
        b = rv[i] if isinstance(rv, np.ndarray) else rv
        try:
            fn(a, b)
        except (TypeError, ValueError, OverflowError):
            return a, b
    return (lv[0] if isinstance(lv, np.ndarray) and len(lv) else lv), rv


def _place(out: Any, keep: np.ndarray | None, n: int, fill: Any, dtype) -> np.ndarray:
    """Spread results computed on the rows ``keep`` (None: all rows) over all ``n`` rows."""
    if keep is None:
        return np.broadcast_to(np.asarray(out, dtype=dtype), (n,))
    full = np.full(n, fill, dtype=dtype)
    full[keep] = out
    return full


# ---------------------------------------------------------------------------- value expressions
def _literal(value: Any) -> Expr:
    return value if isinstance(value, Expr) else Lit(value)


class Expr:
    """A value expression over one relation's columns (column, literal, arithmetic).

    Comparison operators build predicates; use :meth:`equals` for structural equality.
    """

    def columns(self) -> frozenset[str]:
        """The columns the expression reads."""
        raise NotImplementedError

    def sql(self) -> str:
        """Canonical SQL text."""
        raise NotImplementedError

    def _key(self) -> tuple:
        raise NotImplementedError

    def _eval(self, rows: _Rows) -> _Val:
        raise NotImplementedError

    def equals(self, other: object) -> bool:
        """Structural equality."""
        return isinstance(other, Expr) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # ``==`` builds a predicate

    def __repr__(self) -> str:
        return self.sql()

    def __bool__(self) -> bool:
        raise TypeError(f"{self.sql()} has no truth value; combine conditions with & | ~")

    # comparisons
    def __eq__(self, other: object) -> Predicate:  # type: ignore[override]
        return Compare("=", self, _literal(other))

    def __ne__(self, other: object) -> Predicate:  # type: ignore[override]
        return Compare("<>", self, _literal(other))

    def __lt__(self, other: Any) -> Predicate:
        return Compare("<", self, _literal(other))

    def __le__(self, other: Any) -> Predicate:
        return Compare("<=", self, _literal(other))

    def __gt__(self, other: Any) -> Predicate:
        return Compare(">", self, _literal(other))

    def __ge__(self, other: Any) -> Predicate:
        return Compare(">=", self, _literal(other))

    def between(self, low: Any, high: Any) -> Predicate:
        """``low <= self <= high`` (SQL BETWEEN)."""
        return Between(self, _literal(low), _literal(high))

    def isin(self, values: Iterable[Any]) -> Predicate:
        """SQL ``IN (values)``."""
        if isinstance(values, str):
            raise SchemaError(f"isin() takes a list of values, not the string {values!r}")
        return In(self, tuple(Lit(v) if not isinstance(v, Lit) else v for v in values))

    def is_null(self) -> Predicate:
        """SQL ``IS NULL`` (None, NaN, NaT)."""
        return IsNull(self)

    def not_null(self) -> Predicate:
        """SQL ``IS NOT NULL``."""
        return Not(IsNull(self))

    def like(self, pattern: str) -> Predicate:
        """SQL ``LIKE`` (``%``: any run of characters, ``_``: one character)."""
        return Like(self, pattern, True)

    def ilike(self, pattern: str) -> Predicate:
        """Case-insensitive :meth:`like`."""
        return Like(self, pattern, False)

    # arithmetic
    def __add__(self, other: Any) -> Expr:
        return Arith("+", self, _literal(other))

    def __radd__(self, other: Any) -> Expr:
        return Arith("+", _literal(other), self)

    def __sub__(self, other: Any) -> Expr:
        return Arith("-", self, _literal(other))

    def __rsub__(self, other: Any) -> Expr:
        return Arith("-", _literal(other), self)

    def __mul__(self, other: Any) -> Expr:
        return Arith("*", self, _literal(other))

    def __rmul__(self, other: Any) -> Expr:
        return Arith("*", _literal(other), self)

    def __truediv__(self, other: Any) -> Expr:
        return Arith("/", self, _literal(other))

    def __rtruediv__(self, other: Any) -> Expr:
        return Arith("/", _literal(other), self)

    def __neg__(self) -> Expr:
        return Arith("-", Lit(0), self)


@dataclass(frozen=True, eq=False, repr=False)
class Col(Expr):
    """A column of the filtered relation."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError(f"a column name must be a non-empty string, got {self.name!r}")

    def columns(self) -> frozenset[str]:
        return frozenset([self.name])

    def sql(self) -> str:
        return '"' + self.name.replace('"', '""') + '"'

    def _key(self) -> tuple:
        return ("col", self.name)

    def _eval(self, rows: _Rows) -> _Val:
        return rows.column(self.name)


@dataclass(frozen=True, eq=False, repr=False)
class Lit(Expr):
    """A constant: a finite number, a bool, a string or None (SQL NULL)."""

    value: Any

    def __post_init__(self) -> None:
        value = self.value
        if isinstance(value, np.generic):
            value = value.item()
            object.__setattr__(self, "value", value)
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise SchemaError(
                f"filter literal {value!r} ({type(value).__name__}) is not a number, bool, "
                "string or None"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(f"filter literal {value!r} is not finite")

    def columns(self) -> frozenset[str]:
        return frozenset()

    def sql(self) -> str:
        value = self.value
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, str):
            return "'" + value.replace("'", "''") + "'"
        return repr(value)

    def _key(self) -> tuple:
        return ("lit", type(self.value).__name__, self.value)

    def _eval(self, rows: _Rows) -> _Val:
        return _Val(self.value, self.value is None)


@dataclass(frozen=True, eq=False, repr=False)
class Arith(Expr):
    """``left op right`` for op in ``+ - * /`` on numbers (``x / 0`` is NULL)."""

    op: str
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if self.op not in _ARITH:
            raise SchemaError(f"unknown arithmetic operator {self.op!r}; use one of {list(_ARITH)}")

    def columns(self) -> frozenset[str]:
        return self.left.columns() | self.right.columns()

    def sql(self) -> str:
        return f"({self.left.sql()} {self.op} {self.right.sql()})"

    def _key(self) -> tuple:
        return ("arith", self.op, self.left._key(), self.right._key())

    def _eval(self, rows: _Rows) -> _Val:
        left = _numbers(self.left._eval(rows), rows)
        right = _numbers(self.right._eval(rows), rows)
        column = left.column if left.column is not None else right.column
        if left.null is True or right.null is True:
            return _Val(np.zeros(rows.n), np.ones(rows.n, dtype=bool), column)
        out, keep = _binary(_ARITH[self.op], left, right, rows, f"combined by {self.op} with")
        null = _full(_or_null(left.null, right.null), rows.n)
        if self.op == "/":
            zero = _place(np.asarray(right.values) == 0, None, rows.n, False, bool)
            null = null | zero
        elif np.asarray(out).dtype.kind == "i":  # int64 wraps silently: check in float
            as_float = (np.asarray(v.values, dtype=np.float64) for v in (left, right))
            approx = _ARITH[self.op](*as_float)
            big = _place(np.abs(approx) >= 2.0**63, None, rows.n, False, bool) & ~null
            if big.any():
                value = _first(left if left.column is not None else right, rows, big)
                raise rows.error(f"{self.sql()} overflows int64", column, value)
        values = _place(out, keep, rows.n, 0, np.asarray(out).dtype)
        return _Val(values, null if np.any(null) else False, column)


def _numbers(val: _Val, rows: _Rows) -> _Val:
    """Operands of arithmetic as numeric arrays or scalars (bools as ints)."""
    values = val.values
    if values is None:
        return val
    if not isinstance(values, np.ndarray):
        if _kind(values) != "number":
            raise rows.error(f"{values!r} is not a number", None, values)
        return _Val(int(values) if isinstance(values, bool) else values, val.null, val.column)
    if values.dtype.kind == "b":
        return _Val(values.astype(np.int64), val.null, val.column)
    if values.dtype.kind in "iuf":
        return val
    converted = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy()
    bad = np.isnan(converted.astype(np.float64)) & ~_full(val.null, len(values))
    if bad.any() or values.dtype.kind in "USmM":
        i = int(np.flatnonzero(bad)[0]) if bad.any() else 0
        raise rows.error(f"value {values[i]!r} is not a number", val.column, values[i])
    return _Val(converted, val.null, val.column)


# ---------------------------------------------------------------------------- predicates
class Predicate:
    """A boolean condition on one relation's rows; ``&``, ``|``, ``~`` combine predicates."""

    @property
    def checkpointable(self) -> bool:
        """False when an :func:`opaque` callable is part of it: it cannot be pickled."""
        return all(part.checkpointable for part in self._parts())

    def _parts(self) -> tuple[Predicate, ...]:
        return ()

    def columns(self) -> frozenset[str]:
        """The columns the condition reads."""
        raise NotImplementedError

    def sql(self) -> str:
        """Canonical SQL text (:func:`where` parses it back to an equal predicate)."""
        raise NotImplementedError

    def _key(self) -> tuple:
        raise NotImplementedError

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        """(rows where TRUE, rows where FALSE); the others are UNKNOWN (NULL)."""
        raise NotImplementedError

    def mask(self, rows: pd.DataFrame | Mapping[str, Any], relation: str = "") -> np.ndarray:
        """The rows where the condition is TRUE, as a boolean array.

        ``rows``: a DataFrame or a mapping of column name to values.  A value that does not
        fit the condition (a string compared with a number, ...) raises
        :class:`~ringml.BatchError` naming ``relation``, the column and the value.
        """
        batch = _Rows(rows, relation)
        if batch.n == 0:  # no value to check (an empty column's dtype says nothing)
            return np.zeros(0, dtype=bool)
        true, _ = self._truth(batch)
        return np.array(_full(true, batch.n), dtype=bool)

    def __and__(self, other: Predicate) -> Predicate:
        return And(_parts(And, self) + _parts(And, _predicate(other)))

    def __or__(self, other: Predicate) -> Predicate:
        return Or(_parts(Or, self) + _parts(Or, _predicate(other)))

    def __invert__(self) -> Predicate:
        return Not(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Predicate) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return self.sql()

    def __bool__(self) -> bool:
        raise TypeError(f"{self.sql()} has no truth value; combine conditions with & | ~")


def _predicate(value: Any) -> Predicate:
    if isinstance(value, Predicate):
        return value
    raise SchemaError(f"{value!r} is not a predicate (build one with col(...) or where(...))")


def _parts(kind: type, p: Predicate) -> tuple[Predicate, ...]:
    return p.parts if isinstance(p, kind) else (p,)  # type: ignore[attr-defined]


def _known(true: Any, unknown: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    true = _full(true, n)
    if unknown is False:
        return true, ~true
    unknown = _full(unknown, n)
    return true & ~unknown, ~true & ~unknown


def _compare(op: str, left: _Val, right: _Val, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """(TRUE rows, FALSE rows) of ``left op right``."""
    if left.null is True or right.null is True:
        return _known(False, True, rows.n)
    _check_kinds(left, right, rows, "compared with")
    out, keep = _binary(_COMPARE[op], left, right, rows, "compared with")
    true = _place(out, keep, rows.n, False, bool)
    return _known(true, _or_null(left.null, right.null), rows.n)


@dataclass(frozen=True, eq=False, repr=False)
class Compare(Predicate):
    """``left op right`` for op in ``= <> < <= > >=``."""

    op: str
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if self.op not in _COMPARE:
            raise SchemaError(f"unknown comparison {self.op!r}; use one of {list(_COMPARE)}")

    def columns(self) -> frozenset[str]:
        return self.left.columns() | self.right.columns()

    def sql(self) -> str:
        return f"({self.left.sql()} {self.op} {self.right.sql()})"

    def _key(self) -> tuple:
        return ("compare", self.op, self.left._key(), self.right._key())

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        return _compare(self.op, self.left._eval(rows), self.right._eval(rows), rows)


@dataclass(frozen=True, eq=False, repr=False)
class Between(Predicate):
    """``expr BETWEEN low AND high`` (both ends included)."""

    expr: Expr
    low: Expr
    high: Expr

    def columns(self) -> frozenset[str]:
        return self.expr.columns() | self.low.columns() | self.high.columns()

    def sql(self) -> str:
        return f"({self.expr.sql()} BETWEEN {self.low.sql()} AND {self.high.sql()})"

    def _key(self) -> tuple:
        return ("between", self.expr._key(), self.low._key(), self.high._key())

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        value = self.expr._eval(rows)  # once, for both ends
        above, below = _compare(">=", value, self.low._eval(rows), rows)
        under, over = _compare("<=", value, self.high._eval(rows), rows)
        return above & under, below | over


@dataclass(frozen=True, eq=False, repr=False)
class In(Predicate):
    """``expr IN (values...)`` over literals (a NULL in the list makes misses unknown)."""

    expr: Expr
    values: tuple[Lit, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        for v in self.values:
            if not isinstance(v, Lit):
                raise SchemaError(f"IN lists hold literals only, got {v!r}")

    def columns(self) -> frozenset[str]:
        return self.expr.columns()

    def sql(self) -> str:
        return f"({self.expr.sql()} IN ({', '.join(v.sql() for v in self.values)}))"

    def _key(self) -> tuple:
        return ("in", self.expr._key(), tuple(v._key() for v in self.values))

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        val = self.expr._eval(rows)
        listed = [v.value for v in self.values if v.value is not None]
        list_null = len(listed) < len(self.values)
        if val.null is True:
            return _known(False, True, rows.n)
        for item in listed:
            _check_kinds(val, _Val(item, False), rows, "compared with")
        values = val.values
        if not isinstance(values, np.ndarray):
            hit: Any = any(values == item for item in listed)
        elif values.dtype.kind in "iufb":
            hit = np.isin(values, np.asarray(listed)) if listed else False
        else:
            hit = pd.Series(values, dtype=object).isin(listed).to_numpy(dtype=bool)
        null = _full(val.null, rows.n)
        true = _full(hit, rows.n) & ~null
        return true, ~true & ~null & (not list_null)


@dataclass(frozen=True, eq=False, repr=False)
class IsNull(Predicate):
    """``expr IS NULL`` (never unknown)."""

    expr: Expr

    def columns(self) -> frozenset[str]:
        return self.expr.columns()

    def sql(self) -> str:
        return f"({self.expr.sql()} IS NULL)"

    def _key(self) -> tuple:
        return ("is_null", self.expr._key())

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        null = _full(self.expr._eval(rows).null, rows.n)
        return null, ~null


@dataclass(frozen=True, eq=False, repr=False)
class Like(Predicate):
    """``expr LIKE pattern`` (``ILIKE`` when not ``case_sensitive``) on strings."""

    expr: Expr
    pattern: str
    case_sensitive: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            raise SchemaError(f"a LIKE pattern must be a string, got {self.pattern!r}")

    def columns(self) -> frozenset[str]:
        return self.expr.columns()

    def sql(self) -> str:
        word = "LIKE" if self.case_sensitive else "ILIKE"
        return f"({self.expr.sql()} {word} {Lit(self.pattern).sql()})"

    def _key(self) -> tuple:
        return ("like", self.expr._key(), self.pattern, self.case_sensitive)

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        val = self.expr._eval(rows)
        if val.null is True:
            return _known(False, True, rows.n)
        values = val.values if isinstance(val.values, np.ndarray) else np.asarray([val.values])
        null = _full(val.null, len(values))
        if values.dtype.kind not in "OUS":
            raise rows.error(
                f"value {_first(val, rows)!r} is not a string (LIKE {self.pattern!r})",
                val.column,
                _first(val, rows),
            )
        text = pd.Series(values[~null], dtype=object)
        try:
            hit = _like(text, self.pattern, self.case_sensitive)
        except AttributeError:  # no string at all: pandas refuses the .str accessor
            hit = pd.Series(np.nan, index=text.index, dtype=object)
        strings = hit.notna().to_numpy()
        if not strings.all():
            value = text.to_numpy()[np.flatnonzero(~strings)[0]]
            raise rows.error(
                f"value {value!r} is not a string (LIKE {self.pattern!r})", val.column, value
            )
        true = np.zeros(len(values), dtype=bool)
        true[~null] = hit.to_numpy(dtype=bool)
        if not isinstance(val.values, np.ndarray):
            return _known(bool(true[0]), bool(null[0]), rows.n)
        return _known(true, null, rows.n)


def _like(text: pd.Series, pattern: str, case_sensitive: bool) -> pd.Series:
    """LIKE on an object Series (NaN where a value is not a string); plain prefix, suffix and
    substring patterns avoid regular expressions."""
    if not case_sensitive:
        text, pattern = text.str.lower(), pattern.lower()
    body = pattern.strip("%")
    simple = "_" not in pattern and "%" not in body and body
    if simple and pattern == body + "%":
        return text.str.startswith(body)
    if simple and pattern == "%" + body:
        return text.str.endswith(body)
    if simple and pattern == "%" + body + "%":
        return text.str.contains(body, regex=False)
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return text.str.fullmatch(regex, flags=re.DOTALL)


@dataclass(frozen=True, eq=False, repr=False)
class And(Predicate):
    """All parts hold."""

    parts: tuple[Predicate, ...]

    def columns(self) -> frozenset[str]:
        return frozenset().union(*(p.columns() for p in self.parts))

    def sql(self) -> str:
        return "(" + " AND ".join(p.sql() for p in self.parts) + ")"

    def _key(self) -> tuple:
        return ("and", tuple(p._key() for p in self.parts))

    def _parts(self) -> tuple[Predicate, ...]:
        return self.parts

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        true, false = np.ones(rows.n, dtype=bool), np.zeros(rows.n, dtype=bool)
        for part in self.parts:
            t, f = part._truth(rows)
            true &= t
            false |= f
        return true, false


@dataclass(frozen=True, eq=False, repr=False)
class Or(Predicate):
    """Some part holds."""

    parts: tuple[Predicate, ...]

    def columns(self) -> frozenset[str]:
        return frozenset().union(*(p.columns() for p in self.parts))

    def sql(self) -> str:
        return "(" + " OR ".join(p.sql() for p in self.parts) + ")"

    def _key(self) -> tuple:
        return ("or", tuple(p._key() for p in self.parts))

    def _parts(self) -> tuple[Predicate, ...]:
        return self.parts

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        true, false = np.zeros(rows.n, dtype=bool), np.ones(rows.n, dtype=bool)
        for part in self.parts:
            t, f = part._truth(rows)
            true |= t
            false &= f
        return true, false


@dataclass(frozen=True, eq=False, repr=False)
class Not(Predicate):
    """The part does not hold (NOT UNKNOWN is UNKNOWN)."""

    part: Predicate

    def columns(self) -> frozenset[str]:
        return self.part.columns()

    def sql(self) -> str:
        return f"(NOT {self.part.sql()})"

    def _key(self) -> tuple:
        return ("not", self.part._key())

    def _parts(self) -> tuple[Predicate, ...]:
        return (self.part,)

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        true, false = self.part._truth(rows)
        return false, true


@dataclass(frozen=True, eq=False, repr=False)
class Opaque(Predicate):
    """A Python callable ``fn(frame) -> mask``: not data, so a query holding it cannot be
    pickled or checkpointed (see :func:`opaque`)."""

    fn: Callable[[pd.DataFrame], Any]

    @property
    def checkpointable(self) -> bool:
        return False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise SchemaError(f"opaque() takes a callable, got {self.fn!r}")

    def columns(self) -> frozenset[str]:
        return frozenset()

    def sql(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"opaque({getattr(self.fn, '__module__', '?')}.{name})"

    def _key(self) -> tuple:
        return ("opaque", id(self.fn))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.fn is self.fn

    def __hash__(self) -> int:
        return hash(self._key())

    def mask(self, rows: pd.DataFrame | Mapping[str, Any], relation: str = "") -> np.ndarray:
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        result = np.asarray(self.fn(frame))
        if result.shape != (len(frame),) or result.dtype.kind != "b":
            raise BatchError(
                f"relation {relation!r}: the opaque filter {self.sql()} returned "
                f"{result.dtype} of shape {result.shape}, not one bool per row",
                relation,
                None,
                result.shape,
            )
        return result

    def _truth(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        true = self.mask(rows.data, rows.relation)
        return true, ~true

    def __reduce__(self):
        raise SchemaError(
            f"the filter {self.sql()} is an opaque Python callable, which cannot be pickled or "
            "checkpointed; express it as a predicate (ringml.predicates.col / where)"
        )

    def __copy__(self) -> Opaque:
        return self

    def __deepcopy__(self, memo: dict) -> Opaque:
        return self


# ---------------------------------------------------------------------------- constructors
def col(name: str) -> Col:
    """A column reference: ``col("price") > 100_000``."""
    return Col(name)


def lit(value: Any) -> Lit:
    """A literal value (numbers, bools, strings, None)."""
    return Lit(value)


def opaque(fn: Callable[[pd.DataFrame], Any]) -> Opaque:
    """Accept a Python callable ``fn(frame) -> bool mask`` as a filter, opting the query out
    of pickling and checkpointing (prefer :func:`col` / :func:`where`)."""
    return Opaque(fn)


def where(text: str) -> Predicate:
    """Parse a SQL boolean expression over one relation's columns (needs sqlglot)."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    if not isinstance(text, str):
        raise SchemaError(f"where() takes SQL text, got {text!r}")
    try:
        tree = sqlglot.parse_one(text)
    except SqlglotError as error:
        raise SchemaError(f"cannot parse the filter {text!r}: {error}") from None
    return _SqlReader(exp, text).predicate(tree)


class _SqlReader:
    """sqlglot expression tree -> predicates."""

    def __init__(self, exp: Any, text: str) -> None:
        self.exp = exp
        self.text = text
        e = exp
        self.compare = {e.EQ: "=", e.NEQ: "<>", e.LT: "<", e.LTE: "<=", e.GT: ">", e.GTE: ">="}
        self.arith = {e.Add: "+", e.Sub: "-", e.Mul: "*", e.Div: "/"}

    def unsupported(self, node: Any) -> SchemaError:
        return SchemaError(
            f"filter {self.text!r}: {node.sql()!r} ({type(node).__name__}) is not supported; "
            "use comparisons, BETWEEN, IN, IS NULL, LIKE, AND/OR/NOT and + - * / on columns"
        )

    def predicate(self, node: Any) -> Predicate:
        e = self.exp
        while isinstance(node, e.Paren):
            node = node.this
        if type(node) in self.compare:
            op = self.compare[type(node)]
            return Compare(op, self.value(node.this), self.value(node.expression))
        if isinstance(node, e.And):
            return self.predicate(node.this) & self.predicate(node.expression)
        if isinstance(node, e.Or):
            return self.predicate(node.this) | self.predicate(node.expression)
        if isinstance(node, e.Not):
            return ~self.predicate(node.this)
        if isinstance(node, e.Between):
            return Between(
                self.value(node.this), self.value(node.args["low"]), self.value(node.args["high"])
            )
        if isinstance(node, e.In):
            if node.args.get("query") is not None or node.args.get("unnest") is not None:
                raise self.unsupported(node)
            values = [self.value(v) for v in node.expressions]
            if not all(isinstance(v, Lit) for v in values):
                raise self.unsupported(node)
            return In(self.value(node.this), tuple(values))  # type: ignore[arg-type]
        if isinstance(node, e.Is) and isinstance(node.expression, e.Null):
            return IsNull(self.value(node.this))
        if isinstance(node, (e.Like, e.ILike)):
            pattern = self.value(node.expression)
            if not isinstance(pattern, Lit) or not isinstance(pattern.value, str):
                raise self.unsupported(node)
            if node.args.get("escape") is not None:
                raise self.unsupported(node)
            like = Like(self.value(node.this), pattern.value, isinstance(node, e.Like))
            return ~like if node.args.get("negate") else like
        if isinstance(node, e.Column):  # a bare boolean column
            return Compare("=", self.value(node), Lit(True))
        raise self.unsupported(node)

    def value(self, node: Any) -> Expr:
        e = self.exp
        while isinstance(node, e.Paren):
            node = node.this
        if isinstance(node, e.Column):
            return Col(node.name)
        if isinstance(node, e.Literal):
            if node.is_string:
                return Lit(node.this)
            number = node.this
            try:
                return Lit(int(number))
            except ValueError:
                return Lit(float(number))
        if isinstance(node, e.Boolean):
            return Lit(bool(node.this))
        if isinstance(node, e.Null):
            return Lit(None)
        if isinstance(node, e.Neg):
            inner = self.value(node.this)
            if isinstance(inner, Lit) and _kind(inner.value) == "number":
                return Lit(-inner.value)
            return -inner
        if type(node) in self.arith:
            return Arith(self.arith[type(node)], self.value(node.this), self.value(node.expression))
        raise self.unsupported(node)
