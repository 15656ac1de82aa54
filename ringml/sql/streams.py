"""Stream tables and windowed SQL views: a :class:`StreamDatabase` is a
:class:`~ringml.sql.Database` whose stream tables are appended to by event time and whose
views read them through windows (:mod:`ringml.windows`).

sqlglot does not parse CQL's ``FROM S [RANGE 10 MINUTES]``, so the window is an argument of
the view, not SQL text::

    sdb = StreamDatabase("CREATE TABLE D (src TEXT, region TEXT)", lateness="30s")
    sdb.create_stream_table(
        "CREATE TABLE S (ts TIMESTAMP, src TEXT, loss DOUBLE)", time_column="ts",
        partition="1 MINUTE",
    )
    sdb.create_view(
        "recent", "SELECT region, SUM(loss) FROM S JOIN D USING (src) GROUP BY region",
        window="RANGE 10 MINUTES",
    )
    sdb.insert("S", rows)        # late rows rejected or dead-lettered; expiry = deletes

Every stream table a windowed view reads is seen through its window (a view reading two
stream tables windows both; ordinary tables are read whole).  Each distinct window over a
stream table is one hidden table of the database (``S__range_600s``) fed by the stream:
views sharing a window share its rows, and their SQL is rewritten to read it under the
original name.  A view without ``window`` reads the stream table UNBOUNDED (every row
stays).  Windows over a stream table are declared before its first rows; views over a
window that exists may be created at any time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from ..batch import UpdateBatch, as_frame
from ..errors import BatchError, InputTypeError
from ..windows import Duration, StreamTable, Window, WindowedStream
from .catalog import Catalog, TableSchema, parse_ddl
from .compiler import compile_view
from .errors import SqlNameError, SqlSemanticError
from .parse import DIALECT, parse_select
from .views import Database, View


def _slug(window: Window) -> str:
    """A name part for ``window``, distinct for distinct windows: whole numbers as digits
    (``range_600``), whole seconds as ``600s``, other Timedeltas in nanoseconds, other
    numbers by their exact repr (``1e-06`` as ``1em06``, ``0.5`` as ``0_5``)."""
    if window.kind == "range":
        length = window.length
        if isinstance(length, pd.Timedelta):
            nanos = length.value
            text = f"{nanos // 10**9}s" if nanos % 10**9 == 0 else f"{nanos}ns"
        elif float(length).is_integer() and abs(length) < 2.0**53:
            text = str(int(length))
        else:
            text = repr(float(length)).replace(".", "_").replace("-", "m").replace("+", "p")
        return "range_" + text
    return f"partitions_{window.first}_{window.last}".replace("-", "m")


class StreamDatabase:
    """A database with stream tables and windowed views (see the module docs).

    ``catalog``: the ordinary tables (as for :class:`Database`); ``lateness`` and ``late``
    (``"reject"`` / ``"dead_letter"``) as for :class:`~ringml.windows.WindowedStream`.
    ``database`` is the underlying :class:`Database` (its views, hidden window tables
    included); :attr:`stream` the :class:`~ringml.windows.WindowedStream` feeding it.
    """

    def __init__(
        self,
        catalog: Catalog | Mapping | str | None = None,
        lateness: Duration = 0.0,
        late: str = "reject",
    ) -> None:
        self.database = Database(catalog)
        self.stream = WindowedStream(self.database, {}, lateness=lateness, late=late)
        self._streams: dict[str, StreamTable] = {}  # declared stream tables: their partitioning
        self._windows: dict[str, str | None] = {}  # view -> its window text

    # ---------------------------------------------------------------- schema
    def create_table(self, ddl: str) -> None:
        """Ordinary tables (read whole by every view)."""
        self.database.create_table(ddl)

    def create_stream_table(
        self, ddl: str, time_column: str, partition: Duration, origin: Any = 0.0
    ) -> None:
        """An append-only table partitioned by ``time_column`` into partitions of width
        ``partition`` (a number in the column's units, or ``"1 MINUTE"``...)."""
        schemas = parse_ddl(ddl)
        if len(schemas) != 1:
            raise SqlSemanticError(
                f"create_stream_table takes one CREATE TABLE, got {len(schemas)}"
            )
        schema = schemas[0]
        found = schema.find(time_column) if isinstance(time_column, str) else None
        if found is None or schema.type_of(found) not in ("int", "float", "date"):
            raise SqlNameError(
                f"stream table {schema.name!r}: the event-time column {time_column!r} must be a "
                f"number or date column of {list(schema.columns)}",
                construct=str(time_column),
            )
        if found in schema.nullable:
            raise SqlSemanticError(
                f"stream table {schema.name!r}: the event-time column {found!r} is declared "
                "NULL; every row needs its event time",
                construct=found,
            )
        spec = StreamTable(found, partition, None, origin)
        self._check_clock(schema.name, schema.sql_type(found), spec)
        self.database.create_table(ddl)
        self._streams[schema.name] = spec

    def _check_clock(self, table: str, sql_type: str, spec: StreamTable) -> None:
        """The stream tables share one watermark, so one kind of event time; a DATE or
        TIMESTAMP one takes durations (``"1 MINUTE"``) and a datetime origin, not plain
        numbers, which would fail every insert later."""
        dated = sql_type in ("DATE", "TIMESTAMP")
        for other in self._streams:
            other_type = self._time_type(other)
            if (other_type in ("DATE", "TIMESTAMP")) != dated:
                raise SqlSemanticError(
                    f"stream table {table!r}: its event time is {sql_type}, but stream table "
                    f"{other!r}'s is {other_type}; the stream tables share one watermark, so "
                    "their event times are all numbers or all dates/timestamps",
                    construct=spec.time_column,
                )
        if not dated:
            return
        for what, value in (
            ("partition width", spec.partition),
            ("lateness", self.stream.lateness),
        ):
            if not isinstance(value, pd.Timedelta) and value != 0:
                raise SqlSemanticError(
                    f"stream table {table!r}: the {what} is {value!r}, a plain number, but its "
                    f"event time is {sql_type}: give a duration such as '1 MINUTE'",
                    construct=spec.time_column,
                )
        origin = spec.origin
        if isinstance(origin, int | float) and not isinstance(origin, bool) and origin != 0:
            raise SqlSemanticError(
                f"stream table {table!r}: the origin is {origin!r}, a plain number, but its "
                f"event time is {sql_type}: give a time such as '2024-01-01'",
                construct=spec.time_column,
            )

    def _time_type(self, table: str) -> str:
        """The SQL type of stream table ``table``'s event-time column."""
        return self.database.catalog.table(table).sql_type(self._streams[table].time_column)

    def create_view(
        self, name: str, sql: str, window: str | Window | None = None, strategy: str = "fivm"
    ) -> View:
        """Maintain ``sql``, reading its stream tables through ``window`` (``"RANGE 10
        MINUTES"``, ``"PARTITIONS 3 TO 5"``, None: unbounded); nothing changes if the view
        is rejected."""
        from sqlglot import exp

        parsed = Window.parse(window)
        tree = parse_select(sql)
        catalog = self.database.catalog
        nodes = []
        for node in tree.find_all(exp.Table):
            schema = catalog.find(node.name)
            if schema is not None and schema.name in self._streams:
                nodes.append((node, schema))
        if window is not None and not nodes:
            raise SqlSemanticError(
                f"view {name!r} has a window but reads no stream table "
                f"(the stream tables are {sorted(self._streams)})"
            )
        for _, schema in nodes:
            self._check_window(name, schema.name, parsed)
        staged = catalog.copy()
        added: dict[str, tuple[TableSchema, StreamTable]] = {}
        for node, schema in nodes:
            hidden = self._window_table(schema.name, parsed) or next(
                (h for h, (s, _) in added.items() if s.name == schema.name), None
            )
            if hidden is None:  # a new window over this stream table
                if schema.name in self.stream._seen:
                    raise SqlSemanticError(
                        f"view {name!r}: stream table {schema.name!r} has rows already, which a "
                        f"new window ({parsed}) would miss; declare its windows first"
                    )
                hidden = schema.name
                if parsed.kind != "unbounded":
                    hidden = self._new_name(schema.name, parsed, staged)
                    staged.add(
                        TableSchema(
                            hidden,
                            schema.columns,
                            schema.types,
                            schema.key,
                            schema.nullable,
                            schema.dates,
                        )
                    )
                base = self._streams[schema.name]
                spec = StreamTable(
                    base.time_column, base.partition, parsed, base.origin, source=schema.name
                )
                added[hidden] = (schema, spec)
            alias = node.alias or node.name
            node.set("this", exp.to_identifier(hidden))
            node.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
        rewritten = tree.sql(dialect=DIALECT)
        compile_view(rewritten, staged)  # raises before anything changes
        catalog_before, streamed = self.database.catalog, []
        try:
            for hidden, (schema, spec) in added.items():
                if hidden != schema.name:
                    self.database.create_table(_ddl(hidden, schema))
                self.stream.add_table(hidden, spec)
                streamed.append(hidden)
            view = self.database.create_view(name, rewritten, strategy)
        except BaseException:  # e.g. the view's name is taken: take the new windows back
            self.database.catalog = catalog_before
            for hidden, (schema, _) in added.items():
                if hidden != schema.name:
                    self.database._tables.pop(hidden, None)
            for hidden in reversed(streamed):  # reads the targets' tables again
                self.stream._remove_table(hidden)
            raise
        self._windows[view.name] = None if window is None else str(parsed)
        return view

    def _check_window(self, view: str, table: str, window: Window) -> None:
        """A RANGE over a DATE or TIMESTAMP stream table is a duration (a plain number would
        fail every insert later, naming the hidden window table)."""
        sql_type = self._time_type(table)
        if (
            window.kind == "range"
            and sql_type in ("DATE", "TIMESTAMP")
            and not isinstance(window.length, pd.Timedelta)
        ):
            raise SqlSemanticError(
                f"view {view!r}: the window {window} over stream table {table!r} is a plain "
                f"number, but its event time is {sql_type}: give a duration such as "
                "'RANGE 10 MINUTES'",
                construct=str(window),
            )

    def _window_table(self, table: str, window: Window) -> str | None:
        """The hidden table holding stream table ``table``'s rows inside exactly ``window``
        (``table`` itself for UNBOUNDED), or None if no view reads it so."""
        for name, spec in self.stream.tables.items():
            if (spec.source or name) == table and spec.window == window:
                return name
        return None

    def _new_name(self, table: str, window: Window, staged: Catalog) -> str:
        """A name for a new window table over ``table``, taken by no table or view."""
        base = f"{table}__{_slug(window)}"
        views = {v.lower() for v in self.database.views}
        name, n = base, 1
        while staged.find(name) is not None or name in self.stream.tables or name.lower() in views:
            n += 1
            name = f"{base}_{n}"
        return name

    def _stream_table(self, table: str) -> str | None:
        """The declared stream table ``table`` names (matched like SQL names), or None."""
        schema = self.database.catalog.find(table) if isinstance(table, str) else None
        return schema.name if schema is not None and schema.name in self._streams else None

    def view(self, name: str) -> View:
        return self.database.view(name)

    @property
    def views(self) -> dict[str, View]:
        return self.database.views

    def window_of(self, view: str) -> str | None:
        """The window a view reads its stream tables through (None: unbounded)."""
        return self._windows[self.view(view).name]

    # ---------------------------------------------------------------- changes
    @property
    def watermark(self) -> Any:
        return self.stream.watermark

    def insert(self, table: str, rows) -> None:
        """Append rows to a stream table, or insert them into an ordinary table."""
        self.apply([UpdateBatch.inserts(table, as_frame(rows, table))])

    def delete(self, table: str, rows) -> None:
        """Delete rows of an ordinary table (stream tables are append-only)."""
        self.apply([UpdateBatch.deletes(table, as_frame(rows, table))])

    def apply(self, batches: Iterable[UpdateBatch] | UpdateBatch) -> None:
        """Apply batches atomically (see :meth:`WindowedStream.apply`)."""
        if isinstance(batches, UpdateBatch):
            batches = [batches]
        if isinstance(batches, str | bytes | pd.DataFrame | Mapping) or not isinstance(
            batches, Iterable
        ):
            raise InputTypeError(f"apply takes UpdateBatches, got {type(batches).__name__}")
        named = []
        for batch in batches:
            schema = self.database.catalog.find(getattr(batch, "relation", ""))
            if schema is not None and schema.name in self._streams:
                if schema.name not in self.stream._sources:
                    raise BatchError(
                        f"stream table {schema.name!r}: no view reads it yet, so its rows "
                        "would be lost to every later window; create its views first",
                        schema.name,
                    )
                # checked (columns, types) and typed against the stream table itself, so
                # that an error names it, not the hidden window tables its rows go to
                rows = schema.conform(batch.rows)
                batch = UpdateBatch(schema.name, rows, batch.multiplicity)
            named.append(batch)
        self.stream.apply(named)

    def advance_watermark(self, time: Any) -> None:
        """Move the watermark (expiring what left the windows)."""
        self.stream.advance_watermark(time)

    def dead_letters(self, table: str) -> pd.DataFrame:
        """The late rows of a stream table kept with ``late="dead_letter"`` (``table``
        matched like :meth:`insert` matches it)."""
        return self.stream.dead_letters(self._stream_table(table) or table)

    def window_rows(self, table: str, window: str | Window | None) -> pd.DataFrame:
        """The rows of stream table ``table`` inside ``window`` now (a window some view
        reads it through)."""
        name = self._stream_table(table)
        if name is None:
            raise SqlNameError(
                f"unknown stream table {table!r}; the stream tables are {sorted(self._streams)}",
                construct=str(table),
            )
        parsed = Window.parse(window)
        hidden = self._window_table(name, parsed)
        if hidden is None:
            raise SqlSemanticError(f"no view reads stream table {name!r} through {parsed}")
        return self.database.table(hidden)

    def tables(self) -> Sequence[str]:
        """The stream tables."""
        return sorted(self._streams)


def _ddl(name: str, schema: TableSchema) -> str:
    columns = [
        f'"{c}" {schema.sql_type(c)}{" NULL" if c in schema.nullable else ""}'
        for c in schema.columns
    ]
    if schema.key:
        columns.append("PRIMARY KEY (" + ", ".join(f'"{c}"' for c in schema.key) + ")")
    return f'CREATE TABLE "{name}" ({", ".join(columns)})'
