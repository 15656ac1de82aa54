"""Errors of SQL views: every one names the construct and where it is in the SQL text."""

from __future__ import annotations

from ..errors import RingmlError


class SqlError(RingmlError, ValueError):
    """A SQL text that ringml cannot turn into a view; nothing was changed.

    ``position`` is ``(line, column)`` (1-based) of the offending construct, or None;
    ``construct`` names it (e.g. ``"MAX"``, ``"LEFT JOIN"``, ``"column 'x'"``)."""

    def __init__(
        self,
        message: str,
        position: tuple[int, int] | None = None,
        construct: str | None = None,
    ) -> None:
        where = f" (line {position[0]}, column {position[1]})" if position else ""
        super().__init__(message + where)
        self.position = position
        self.construct = construct


class SqlSyntaxError(SqlError):
    """The text does not parse (or is not one SELECT / CREATE TABLE statement)."""


class SqlNameError(SqlError):
    """An unknown or ambiguous table, column or alias."""


class SqlTypeError(SqlError):
    """Values of types that do not fit together (a VARCHAR compared with a number, SUM over
    text, ...)."""


class SqlUnsupportedError(SqlError):
    """Valid SQL outside the view class ringml maintains (outer joins, window functions,
    MIN/MAX over several tables, ...)."""


class SqlSemanticError(SqlError):
    """SQL that no database would accept: a column outside GROUP BY, an aggregate in WHERE,
    nested aggregates, a duplicate alias, ..."""


def position_of(text: str, offset: int | None) -> tuple[int, int] | None:
    """1-based ``(line, column)`` of a character offset in ``text``."""
    if offset is None or offset < 0:
        return None
    offset = min(offset, len(text))
    line = text.count("\n", 0, offset) + 1
    start = text.rfind("\n", 0, offset) + 1
    return line, offset - start + 1
