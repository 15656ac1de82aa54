"""The catalog: tables with typed columns, from ``CREATE TABLE`` DDL or a mapping, and the
type check that turns a batch of rows into typed numpy columns.

Column types are five kinds: ``int`` (INTEGER, BIGINT, ... -> int64), ``float`` (DOUBLE,
REAL, DECIMAL, NUMERIC -> float64), ``str`` (VARCHAR, TEXT, CHAR -> Python strings),
``date`` (DATE, TIMESTAMP -> datetime64[ns]; which of the two a column was declared is kept,
:meth:`TableSchema.sql_type`) and ``bool`` (BOOLEAN).  A column is NOT NULL
unless declared ``NULL`` (``x BIGINT NULL`` in DDL, the type ``"BIGINT NULL"`` in a
mapping): a batch holding None/NaN/``pd.NA``/NaT in a NOT NULL column is rejected; in a
nullable column those are NULL, and the column is typed as ``(values, null)`` -- the
kind's array with a harmless fill value in the NULL rows, and the bool mask of those rows
(what the expressions read).  A ``PRIMARY KEY`` (a column constraint or a table
constraint) is kept: its table holds at most one row per key value, and deletes are
checked by key (:mod:`ringml.sql.tables`); its columns cannot be declared NULL.  Other
constraints are accepted and ignored.

A DECIMAL(p,s)/NUMERIC column is held as a DOUBLE (binary floating point), not as an
exact decimal: its values are not rounded to the scale nor checked against the precision,
and ``d = 1.01`` or ``SUM(d) = 0.3`` compare DOUBLEs (0.1 + 0.2 is not 0.3); REAL and
FLOAT columns are 8-byte DOUBLEs too.  Narrow integer columns (INTEGER, SMALLINT, ...)
hold any int64.  (``CAST(... AS DECIMAL(p,s))`` and casts to narrow integers do round and
check, see :class:`~ringml.sql.expressions.Cast`.)
"""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pandas.api.types import infer_dtype

from ..batch import _column_arrays, as_frame
from ..errors import BatchError, InputTypeError
from .errors import (
    SqlError,
    SqlNameError,
    SqlSemanticError,
    SqlSyntaxError,
    SqlTypeError,
    position_of,
)

KINDS = ("int", "float", "str", "date", "bool")

_TYPE_NAMES = {
    "int": (
        "INT",
        "INTEGER",
        "BIGINT",
        "SMALLINT",
        "TINYINT",
        "INT2",
        "INT4",
        "INT8",
        "LONG",
        "SHORT",
        "UINT",
        "UINTEGER",
        "UBIGINT",
        "USMALLINT",
        "UTINYINT",
        "MEDIUMINT",
    ),
    "float": (
        "DOUBLE",
        "FLOAT",
        "REAL",
        "DECIMAL",
        "NUMERIC",
        "FLOAT4",
        "FLOAT8",
        "MONEY",
        "DOUBLE PRECISION",
        "BIGDECIMAL",
    ),
    "str": ("VARCHAR", "TEXT", "CHAR", "NCHAR", "NVARCHAR", "STRING", "BPCHAR", "NAME"),
    "date": ("DATE", "TIMESTAMP", "DATETIME", "TIMESTAMPNTZ", "DATE32", "DATETIME64"),
    "bool": ("BOOLEAN", "BOOL"),
}
_KIND_OF = {name: kind for kind, names in _TYPE_NAMES.items() for name in names}
SQL_NAME = {"int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR", "date": "DATE", "bool": "BOOLEAN"}
#: the type names of the ``date`` kind whose values are whole days (a time of day is cut
#: off, as DuckDB's INSERT into a DATE column does; the others, TIMESTAMP, DATETIME, ...,
#: keep it)
DAY_TYPES = ("DATE", "DATE32")


def is_day_type(name: str) -> bool:
    """Whether a column type name (``DATE``, ``date NULL``, ...) declares whole days."""
    words = name.split()
    while words and words[-1].upper() in ("NULL", "NOT"):
        words.pop()
    return " ".join(words).upper().split("(")[0].strip() in DAY_TYPES


def type_spec(name: str) -> tuple[str, bool]:
    """The kind of a column type of the mapping form and whether it is nullable: a SQL
    type name, optionally followed by ``NULL`` (nullable) or ``NOT NULL`` (the default)."""
    if not isinstance(name, str):
        raise SqlTypeError(f"a column type must be a SQL type name, got {name!r}")
    words = name.split()
    upper = [w.upper() for w in words]
    if len(words) > 2 and upper[-2:] == ["NOT", "NULL"]:
        return type_kind(" ".join(words[:-2])), False
    if len(words) > 1 and upper[-1] == "NULL":
        return type_kind(" ".join(words[:-1])), True
    return type_kind(name), False


def type_kind(name: str) -> str:
    """The kind (``int``, ``float``, ``str``, ``date``, ``bool``) of a SQL type name."""
    if not isinstance(name, str):
        raise SqlTypeError(f"a column type must be a SQL type name, got {name!r}")
    base = name.strip().upper().split("(")[0].strip()
    if base in KINDS or base.lower() in KINDS:
        return base.lower()
    if base not in _KIND_OF:
        raise SqlTypeError(
            f"unsupported column type {name!r}; use INTEGER/BIGINT, DOUBLE/REAL/DECIMAL, "
            "VARCHAR/TEXT/CHAR, DATE/TIMESTAMP or BOOLEAN",
            construct=name,
        )
    return _KIND_OF[base]


@dataclass(frozen=True)
class TableSchema:
    """A table: its name, column names and their kinds, and its primary key columns
    (``()``: none declared); ``nullable``: the columns that may hold NULL (declared ``NULL``,
    or a view's read as a table by a query); no key column is nullable.  ``dates``: the
    ``date``-kind columns declared ``DATE`` (whole days); the others were declared
    ``TIMESTAMP`` (or are a view's, which may hold a time of day), see :meth:`sql_type`."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    key: tuple[str, ...] = ()
    nullable: tuple[str, ...] = ()
    dates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.columns:
            raise SqlTypeError(f"table {self.name!r} has no columns")
        lowered = [c.lower() for c in self.columns]
        if len(set(lowered)) != len(lowered):
            twice = next(c for c in self.columns if lowered.count(c.lower()) > 1)
            raise SqlNameError(f"table {self.name!r} declares column {twice!r} twice")
        for column in self.key:
            if column not in self.columns:
                raise SqlNameError(
                    f"table {self.name!r}: the primary key names {column!r}, not a column "
                    f"of the table {list(self.columns)}",
                    construct=column,
                )
        if len(set(self.key)) != len(self.key):
            raise SqlNameError(f"table {self.name!r}: the primary key repeats a column")
        for column in self.dates:
            if column not in self.columns or self.type_of(column) != "date":
                raise SqlTypeError(f"table {self.name!r}: {column!r} is not a DATE column")
        for column in self.nullable:
            if column not in self.columns:
                raise SqlNameError(
                    f"table {self.name!r}: nullable column {column!r} is not a column of the "
                    f"table {list(self.columns)}",
                    construct=column,
                )
            if column in self.key:
                raise SqlSemanticError(
                    f"table {self.name!r}: primary key column {column!r} is declared NULL; a "
                    "primary key holds no NULLs",
                    construct=column,
                )

    def type_of(self, column: str) -> str:
        return self.types[self.columns.index(column)]

    def sql_type(self, column: str) -> str:
        """A column's SQL type: ``BIGINT``, ``DOUBLE``, ``VARCHAR``, ``BOOLEAN``, and for the
        ``date`` kind ``DATE`` (declared so) or ``TIMESTAMP``."""
        kind = self.type_of(column)
        if kind == "date":
            return "DATE" if column in self.dates else "TIMESTAMP"
        return SQL_NAME[kind]

    def find(self, column: str) -> str | None:
        """The declared name of ``column`` (exact, else case-insensitive), or None."""
        if column in self.columns:
            return column
        matches = [c for c in self.columns if c.lower() == column.lower()]
        return matches[0] if len(matches) == 1 else None

    def conform(self, rows: object) -> pd.DataFrame:
        """``rows`` as a frame of exactly this table's columns, typed (int64, float64,
        objects holding str, datetime64[ns], bool; NULLs of a nullable column as
        :func:`nulls_column` shows them); :class:`BatchError` otherwise."""
        return typed_frame(self, self.conform_columns(rows))

    def conform_columns(self, rows: object) -> dict[str, np.ndarray | tuple]:
        """:meth:`conform`'s typed columns as numpy arrays (no frame is built): numpy
        columns are read from the frame's blocks and checked with a few whole-array
        passes (``infer_dtype`` for object columns, no Python loop per value).  A
        nullable column is the pair ``(values, null)`` (see the module docstring)."""
        frame = as_frame(rows, self.name)
        if frame.columns.has_duplicates:
            twice = frame.columns[frame.columns.duplicated()][0]
            raise BatchError(
                f"table {self.name!r}: the rows have column {twice!r} twice", self.name, twice
            )
        names = [str(c) for c in frame.columns]
        if names != list(self.columns):
            missing = [c for c in self.columns if c not in names]
            extra = [c for c in names if c not in self.columns]
            if missing or extra:
                raise BatchError(
                    f"table {self.name!r} has columns {list(self.columns)}; the rows lack "
                    f"{missing} and have extra {extra}",
                    self.name,
                    (missing or extra)[0],
                )
        if any(not isinstance(c, str) for c in frame.columns):
            frame = frame.set_axis(names, axis=1)
        arrays = _column_arrays(frame, list(self.columns))
        out = {}
        nullable = self.nullable
        for c, kind, values in zip(self.columns, self.types, arrays, strict=True):
            sql = self.sql_type(c)
            if nullable and c in nullable:
                out[c] = conform_nullable(self.name, c, kind, values, sql)
                continue
            clean = _CLEAN_ARRAY.get((kind, values.dtype))
            if clean is None or not clean(values) or sql == "DATE":
                values = conform_column(self.name, c, kind, values, sql=sql)
            out[c] = values
        return out

    def declared(self, column: str) -> str:
        """A column's declaration as DDL writes it (``x BIGINT NULL``)."""
        return f"{column} {self.sql_type(column)}{' NULL' if column in self.nullable else ''}"


def typed_frame(schema: TableSchema, columns: Mapping[str, object]) -> pd.DataFrame:
    """Typed columns (as :meth:`TableSchema.conform_columns` gives them) as a DataFrame,
    the NULLs of a nullable column as :func:`nulls_column` shows them."""
    out = {}
    for column, kind in zip(schema.columns, schema.types, strict=True):
        values = columns[column]
        out[column] = nulls_column(*values, kind) if isinstance(values, tuple) else values
    n = len(next(iter(out.values())))
    return pd.DataFrame(out, index=pd.RangeIndex(n))


def nulls_column(values: np.ndarray, null: np.ndarray, kind: str):
    """A nullable column's values as DuckDB's ``.df()`` shows them: as they are without a
    NULL, else NULL as NaN (DOUBLE), NaT (DATE), None (VARCHAR) or ``pd.NA`` (BIGINT and
    BOOLEAN, as pandas' nullable ``Int64`` / ``boolean`` arrays: exact)."""
    if not null.any():
        return values
    if kind == "float":
        out = values.copy()
        out[null] = np.nan
        return out
    if kind == "date":
        out = values.copy()
        out[null] = np.datetime64("NaT")
        return out
    if kind == "int":
        return pd.arrays.IntegerArray(values.copy(), null.copy())
    if kind == "bool":
        return pd.arrays.BooleanArray(values.copy(), null.copy())
    out = values.copy()
    out[null] = None
    return out


def _nulls(values: np.ndarray) -> np.ndarray:
    """The NULL rows of a batch column (None, NaN, ``pd.NA``, NaT): whole-array passes."""
    kind = values.dtype.kind
    if kind == "f":
        return np.isnan(values)
    if kind in "mM":
        return np.isnat(values)
    if kind == "O":
        return np.asarray(pd.isna(values), dtype=bool)
    return np.zeros(values.shape[0], dtype=bool)


def conform_nullable(
    table: str, column: str, kind: str, series, sql: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A nullable column's values as ``(values, null)``: None, NaN, ``pd.NA`` and NaT are
    NULL (the kind's fill value in ``values``), every other value as
    :func:`conform_column` takes it (±inf in a DOUBLE column is still rejected)."""
    if isinstance(series, pd.Series | pd.api.extensions.ExtensionArray):
        extension = isinstance(series.dtype, pd.api.extensions.ExtensionDtype)
        values = series.to_numpy(dtype=object) if extension else series.to_numpy()
    else:
        values = np.asarray(series)
    null = _nulls(values)
    if not null.any():
        return conform_column(table, column, kind, values, sql=sql), null
    present = np.flatnonzero(~null)  # checked alone (messages name their batch rows)
    out = np.full(values.shape[0], _FILL[kind], dtype=_EMPTY[kind])
    out[present] = conform_column(table, column, kind, values[present], present, sql)
    return out, null


def _reject(
    table: str,
    column: str,
    kind: str,
    values: np.ndarray,
    bad: np.ndarray,
    why: str,
    rows: np.ndarray | None = None,
    sql: str | None = None,
):
    at = int(np.flatnonzero(bad)[0])
    value = values[at]
    if isinstance(value, np.datetime64 | np.timedelta64):  # .item() gives nanoseconds
        value = pd.Timestamp(value) if isinstance(value, np.datetime64) else pd.Timedelta(value)
    elif isinstance(value, np.generic):
        value = value.item()
    row = at if rows is None else int(rows[at])
    raise BatchError(
        f"table {table!r}, column {column!r} ({sql or SQL_NAME[kind]}): value {value!r} (row "
        f"{row}) {why}",
        table,
        column,
        value,
    )


def _not_null(column: str, sql: str) -> str:
    return (
        f"is NULL; column {column!r} is NOT NULL (declare it `{column} {sql} NULL` to store NULLs)"
    )


def _zoned(values: np.ndarray) -> np.ndarray:
    """Values with a time zone or UTC offset (aware datetimes, ISO texts with an offset);
    error paths only."""

    def zoned(value: object) -> bool:
        try:
            return pd.Timestamp(value).tzinfo is not None
        except (ValueError, TypeError, OverflowError):
            return False

    return np.fromiter(map(zoned, values.tolist()), bool, values.shape[0])


_OUTSIDE_DATES = (
    f"is outside the dates a table holds ({pd.Timestamp.min.ceil('D').date()} to "
    f"{pd.Timestamp.max.floor('D').date()})"
)


def _is_calendar_date(value: object) -> bool:
    """A date (or an ISO date text) of any year, in or out of the range tables hold."""
    if isinstance(value, datetime.date):
        return True
    try:
        datetime.date.fromisoformat(str(value)[:10])
    except ValueError:
        return False
    return True


#: per kind, the value a NULL row of a nullable column holds (as the expressions' FILL)
_FILL = {
    "int": 0,
    "float": 0.0,
    "str": "",
    "date": np.datetime64(0, "ns"),
    "bool": False,
}

#: per kind, the dtype of its typed columns
_EMPTY = {
    "int": np.int64,
    "float": np.float64,
    "str": object,
    "date": "datetime64[ns]",
    "bool": bool,
}

#: per kind, what ``infer_dtype(skipna=False)`` says of an object column that holds no NULL
_CLEAN = {"int": "integer", "str": "string", "bool": "boolean"}

#: per (kind, numpy dtype) of a batch column that is already the kind's array, a whole-array
#: test that it is clean (no NULL, NaN, inf, NaT; text all ``str``): such a column is used
#: as it is, one numpy pass or none; any other column (or a failed test) goes through
#: :func:`conform_column`, which converts it or names the offending value.
_CLEAN_ARRAY = {
    ("int", np.dtype(np.int64)): lambda values: True,
    ("float", np.dtype(np.float64)): lambda values: bool(np.isfinite(values).all()),
    ("str", np.dtype(object)): lambda values: (
        infer_dtype(values, skipna=False) in ("string", "empty")
    ),
    ("date", np.dtype("datetime64[ns]")): lambda values: not np.isnat(values).any(),
    ("bool", np.dtype(bool)): lambda values: True,
}


def conform_column(
    table: str,
    column: str,
    kind: str,
    series,
    rows: np.ndarray | None = None,
    sql: str | None = None,
) -> np.ndarray:
    """One column's values (a Series or an array) as the numpy array of its kind (no
    NULLs, nothing lossy; a DATE column's times cut to their day); ``rows``: each value's
    row in the batch, for messages (default: its position); ``sql``: the column's declared
    type (default: its kind's, e.g. ``DATE`` for a TIMESTAMP)."""
    sql = sql or SQL_NAME[kind]

    def reject(table, column, kind, values, bad, why):
        _reject(table, column, kind, values, bad, why, rows, sql)

    if isinstance(series, pd.Series | pd.api.extensions.ExtensionArray):
        extension = isinstance(series.dtype, pd.api.extensions.ExtensionDtype)
        values = series.to_numpy(dtype=object) if extension else series.to_numpy()
    else:
        values = np.asarray(series)
    n = values.shape[0]
    if n == 0:  # an empty batch (its column may have any dtype): nothing to check
        return np.empty(0, dtype=_EMPTY[kind])
    kind_of = values.dtype.kind
    inferred = infer_dtype(values, skipna=False) if kind_of == "O" else None
    if kind_of == "O" and n and inferred != _CLEAN.get(kind):  # clean: no NULL possible
        missing = np.asarray(pd.isna(values), dtype=bool)
        if missing.any():
            reject(table, column, kind, values, missing, _not_null(column, sql))
    if kind == "int":
        if kind_of in "iu":
            if kind_of == "u" and n and values.max() > np.iinfo(np.int64).max:
                reject(
                    table,
                    column,
                    kind,
                    values,
                    values > np.iinfo(np.int64).max,
                    "does not fit in BIGINT",
                )
            return values.astype(np.int64, copy=False)
        if kind_of == "f" or inferred in ("floating", "mixed-integer-float", "decimal"):
            as_float = values.astype(np.float64)
            if kind_of == "f" and np.isnan(as_float).any():
                reject(table, column, kind, values, np.isnan(as_float), _not_null(column, sql))
            bad = ~np.isfinite(as_float) | (as_float != np.round(as_float))
            if kind_of == "O" and not bad.any():  # each value itself: floats round 2**53 + 1
                bad = np.asarray([int(v) != v for v in values.tolist()], dtype=bool)
            if bad.any():
                reject(table, column, kind, values, bad, "is not an integer")
            if kind_of == "f":  # (numpy casts a float beyond int64 to -2**63, silently)
                beyond = (as_float >= 2.0**63) | (as_float < -(2.0**63))
                if beyond.any():
                    reject(table, column, kind, values, beyond, "does not fit in BIGINT")
                return as_float.astype(np.int64)
            values = np.asarray([int(v) for v in values.tolist()], dtype=object)
            inferred = "integer"
        if inferred in ("integer", "empty"):
            try:
                return np.asarray(values.tolist(), dtype=np.int64).reshape(n)
            except OverflowError:
                big = np.asarray([abs(v) >= 2**63 for v in values.tolist()])
                reject(table, column, kind, values, big, "does not fit in BIGINT")
        reject(table, column, kind, values, _not_number(values), "is not a number")
    if kind == "float":
        if kind_of in "iuf" or inferred in (
            "integer",
            "floating",
            "mixed-integer-float",
            "decimal",
            "empty",
        ):
            out = values.astype(np.float64, copy=False)
            bad = ~np.isfinite(out)
            if bad.any():
                if np.isnan(out).any():
                    reject(table, column, kind, values, np.isnan(out), _not_null(column, sql))
                reject(table, column, kind, values, bad, "is not a finite number")
            return out
        reject(table, column, kind, values, _not_number(values), "is not a number")
    if kind == "str":
        if kind_of in "US":
            return values.astype(object)
        if kind_of == "O" and inferred in ("string", "empty"):
            return values
        bad = np.asarray([not isinstance(v, str) for v in values.tolist()], dtype=bool)
        if not bad.any():
            bad[0] = True
        reject(table, column, kind, values, bad, "is not a string")
    if kind == "date":
        if kind_of == "M":
            out = values.astype("datetime64[ns]", copy=False)
            bad = np.isnat(out)
            if bad.any():
                reject(table, column, kind, values, bad, _not_null(column, sql))
            wrapped = out.astype(values.dtype) != values  # numpy casts out of range silently
            if wrapped.any():
                reject(table, column, kind, values, wrapped, _OUTSIDE_DATES)
            return _whole_days(out) if sql == "DATE" else out
        if kind_of == "O" and inferred in ("date", "datetime", "datetime64", "string", "empty"):
            try:
                with warnings.catch_warnings():  # mixed offsets: an object result, refused
                    warnings.simplefilter("ignore", FutureWarning)
                    converted = pd.to_datetime(pd.Series(values), format="ISO8601")
            except (ValueError, TypeError, OverflowError):
                zoned = _zoned(values)  # zones mixed with others or no zone
                if zoned.any():
                    reject(table, column, kind, values, zoned, "has a time zone")
                converted = pd.to_datetime(pd.Series(values), format="ISO8601", errors="coerce")
                bad = converted.isna().to_numpy()
                first = values[np.flatnonzero(bad)[0]]
                why = _OUTSIDE_DATES if _is_calendar_date(first) else "is not a date"
                reject(table, column, kind, values, bad, why)
            if converted.dtype == object or getattr(converted.dtype, "tz", None) is not None:
                reject(table, column, kind, values, _zoned(values), "has a time zone")
            out = converted.to_numpy().astype("datetime64[ns]")
            return _whole_days(out) if sql == "DATE" else out
        reject(table, column, kind, values, np.ones(n, dtype=bool), "is not a date")
    if kind == "bool":
        if kind_of == "b":
            return values
        if kind_of == "O" and inferred in ("boolean", "empty"):
            return values.astype(bool)
        reject(table, column, kind, values, np.ones(n, dtype=bool), "is not a boolean")
    raise AssertionError(kind)


def _whole_days(times: np.ndarray) -> np.ndarray:
    """datetime64[ns] times cut to the start of their day."""
    return times.astype("datetime64[D]").astype("datetime64[ns]")


def _not_number(values: np.ndarray) -> np.ndarray:
    """Rows that are not real numbers (error path only)."""
    import numbers

    if values.dtype.kind not in "biufcO":  # dates, durations, text: none is a number
        return np.ones(values.shape[0], dtype=bool)
    return np.asarray(
        [
            isinstance(v, bool | np.bool_) or not isinstance(v, numbers.Real | np.number)
            for v in values.tolist()
        ],
        dtype=bool,
    )


class Catalog:
    """Tables by name (matched case-insensitively, like SQL identifiers).

    ``Catalog({"House": {"postcode": "INTEGER", "price": "DOUBLE"}})``, a mapping to
    ``[(column, type), ...]``, or ``Catalog("CREATE TABLE House (postcode INT, ...); ...")``.
    """

    def __init__(self, tables: Mapping[str, object] | str | None = None) -> None:
        self._tables: dict[str, TableSchema] = {}
        if tables is None:
            return
        if isinstance(tables, str):
            schemas = parse_ddl(tables)
        elif isinstance(tables, Mapping):
            schemas = [_schema_from(name, cols) for name, cols in tables.items()]
        else:
            raise InputTypeError(
                "a catalog is built from CREATE TABLE text or a mapping table -> "
                f"{{column: type}}; got {type(tables).__name__}"
            )
        staged = Catalog()
        for schema in schemas:
            staged.add(schema)
        self._tables = staged._tables

    def add(self, schema: TableSchema) -> None:
        """Add a table; :class:`SqlNameError` if one of that name exists (nothing changes)."""
        if self.find(schema.name) is not None:
            raise SqlNameError(f"table {schema.name!r} already exists", construct=schema.name)
        self._tables[schema.name] = schema

    def find(self, name: str) -> TableSchema | None:
        """The table called ``name`` (exact, else case-insensitive), or None."""
        if name in self._tables:
            return self._tables[name]
        matches = [t for n, t in self._tables.items() if n.lower() == name.lower()]
        return matches[0] if len(matches) == 1 else None

    def table(self, name: str) -> TableSchema:
        """The table called ``name``; :class:`SqlNameError` naming the known tables."""
        found = self.find(name)
        if found is None:
            raise SqlNameError(
                f"unknown table {name!r}; the catalog has {sorted(self._tables)}", construct=name
            )
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def copy(self) -> Catalog:
        out = Catalog()
        out._tables = dict(self._tables)
        return out

    def __repr__(self) -> str:
        parts = []
        for t in self._tables.values():
            parts.append(f"{t.name}({', '.join(t.declared(c) for c in t.columns)})")
        return f"Catalog({'; '.join(parts)})"


def _schema_from(name: object, columns: object) -> TableSchema:
    if not isinstance(name, str) or not name:
        raise InputTypeError(f"table names are non-empty strings, got {name!r}")
    if isinstance(columns, Mapping):
        pairs = list(columns.items())
    elif isinstance(columns, Sequence) and not isinstance(columns, str):
        pairs = list(columns)
        if not all(
            isinstance(p, Sequence) and not isinstance(p, str) and len(p) == 2 for p in pairs
        ):
            raise InputTypeError(
                f"table {name!r}: columns are a mapping column -> type or a list of "
                f"(column, type) pairs; got {columns!r:.80}"
            )
    else:
        raise InputTypeError(
            f"table {name!r}: columns are a mapping column -> SQL type, got {columns!r:.80}"
        )
    for column, _ in pairs:
        if not isinstance(column, str) or not column:
            raise InputTypeError(f"table {name!r}: column names are strings, got {column!r}")
    specs = [type_spec(t) for _, t in pairs]
    return TableSchema(
        name,
        tuple(c for c, _ in pairs),
        tuple(kind for kind, _ in specs),
        nullable=tuple(c for (c, _), (_, null) in zip(pairs, specs, strict=True) if null),
        dates=tuple(c for (c, t), (k, _) in zip(pairs, specs, strict=True) if _day(k, t)),
    )


def _day(kind: str, name: str) -> bool:
    return kind == "date" and is_day_type(name)


def parse_ddl(text: str) -> list[TableSchema]:
    """The tables of ``CREATE TABLE`` statements, with their ``PRIMARY KEY`` if declared and
    the columns declared ``NULL`` (nullable; ``NOT NULL`` is the default; other constraints
    are accepted and ignored)."""
    from sqlglot import exp

    from .parse import parse_statements

    schemas = []
    for statement in parse_statements(text):
        if not isinstance(statement, exp.Create) or str(statement.args.get("kind")).upper() != (
            "TABLE"
        ):
            raise SqlSyntaxError(
                f"expected CREATE TABLE, got {statement.sql()[:60]!r}",
                _start(text, statement),
                type(statement).__name__,
            )
        target = statement.this
        if not isinstance(target, exp.Schema) or not isinstance(target.this, exp.Table):
            raise SqlSyntaxError(
                "CREATE TABLE needs a column list (CREATE TABLE ... AS SELECT is not supported)",
                _start(text, statement),
                "CREATE TABLE AS",
            )
        columns = []
        dates: list[str] = []
        nullable: list[str] = []
        key: list[str] = []
        keys_declared = 0
        for definition in target.expressions:
            if not isinstance(definition, exp.ColumnDef):
                declared = _primary_key(definition)
                if declared is not None:
                    key, keys_declared = declared, keys_declared + 1
                continue  # other table constraints (UNIQUE, FOREIGN KEY, ...) are ignored
            kind = definition.args.get("kind")
            if kind is None:
                raise SqlTypeError(
                    f"column {definition.name!r} has no type",
                    _start(text, definition),
                    definition.name,
                )
            type_name = kind.sql(dialect="duckdb")
            try:
                columns.append((definition.name, type_kind(type_name)))
            except SqlError as error:
                raise SqlTypeError(str(error), _start(text, definition), type_name) from None
            if _day(columns[-1][1], type_name):
                dates.append(definition.name)
            constraints = definition.args.get("constraints") or []
            if any(
                isinstance(c.args.get("kind"), exp.PrimaryKeyColumnConstraint) for c in constraints
            ):
                key, keys_declared = [definition.name], keys_declared + 1
            nulls = {
                bool(c.args["kind"].args.get("allow_null"))
                for c in constraints
                if isinstance(c.args.get("kind"), exp.NotNullColumnConstraint)
            }
            if len(nulls) > 1:
                raise SqlSyntaxError(
                    f"column {definition.name!r} is declared both NULL and NOT NULL",
                    _start(text, definition),
                    definition.name,
                )
            if nulls == {True}:
                nullable.append(definition.name)
        name = target.this.name
        if keys_declared > 1:
            raise SqlSyntaxError(
                f"table {name!r} declares more than one PRIMARY KEY",
                _start(text, statement),
                "PRIMARY KEY",
            )
        names = [c for c, _ in columns]
        resolved = []
        for column in key:  # identifiers match like SQL's: exact, else case-insensitively
            found = [c for c in names if c == column] or [
                c for c in names if c.lower() == column.lower()
            ]
            if len(found) != 1:
                raise SqlNameError(
                    f"table {name!r}: the PRIMARY KEY names {column!r}, not a column of the "
                    f"table {names}",
                    _start(text, statement),
                    column,
                )
            resolved.append(found[0])
        for column in resolved:
            if column in nullable:
                raise SqlSemanticError(
                    f"table {name!r}: primary key column {column!r} is declared NULL; a "
                    "primary key holds no NULLs (drop the NULL)",
                    _start(text, statement),
                    column,
                )
        schemas.append(
            TableSchema(
                name,
                tuple(names),
                tuple(k for _, k in columns),
                tuple(resolved),
                tuple(nullable),
                tuple(dates),
            )
        )
    return schemas


def _primary_key(constraint) -> list[str] | None:
    """The columns of a ``PRIMARY KEY (...)`` table constraint (named or not), else None."""
    from sqlglot import exp

    if isinstance(constraint, exp.Constraint):
        found = [e for e in constraint.expressions if isinstance(e, exp.PrimaryKey)]
        constraint = found[0] if found else None
    if not isinstance(constraint, exp.PrimaryKey):
        return None
    return [e.name for e in constraint.expressions]


def _start(text: str, node) -> tuple[int, int] | None:
    from .parse import start_offset

    return position_of(text, start_offset(node))
