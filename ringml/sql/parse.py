"""Parsing with sqlglot (DuckDB dialect) and source positions of syntax-tree nodes."""

from __future__ import annotations

import re
from typing import Any

from .errors import SqlSyntaxError, position_of

DIALECT = "duckdb"


def parse_statements(text: str) -> list[Any]:
    """The statements of ``text`` as sqlglot trees; :class:`SqlSyntaxError` with the
    position of the first error."""
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    if not isinstance(text, str):
        raise SqlSyntaxError(f"SQL must be a string, got {type(text).__name__}")
    try:
        statements = [s for s in sqlglot.parse(text, read=DIALECT) if s is not None]
    except ParseError as error:
        first = (error.errors or [{}])[0]
        line, col = first.get("line"), first.get("col")
        highlight = first.get("highlight") or ""
        if line is not None and col is not None and highlight:
            col = max(col - len(highlight) + 1, 1)  # sqlglot points at the token's end
        raise SqlSyntaxError(
            f"syntax error: {first.get('description', str(error)).split('. Line')[0]}",
            (line, col) if line is not None else None,
            highlight or None,
        ) from None
    except TokenError as error:
        raise SqlSyntaxError(
            f"syntax error: {error}", position_of(text, _token_failure(text)), None
        ) from None
    if not statements:
        raise SqlSyntaxError("empty SQL text", (1, 1))
    return statements


def _token_failure(text: str) -> int:
    """Where the tokenizer stops (an unterminated string or quoted name)."""
    match = re.search(r"'(?:[^']|'')*$|\"(?:[^\"]|\"\")*$", text)
    return match.start() if match else 0


def parse_select(text: str) -> Any:
    """One SELECT statement (a trailing ``;`` is fine)."""
    from sqlglot import exp

    statements = parse_statements(text)
    if len(statements) > 1:
        raise SqlSyntaxError(
            "expected one SELECT statement, got several",
            position_of(text, keyword_offset(text, statements[1], "SELECT")),
            "statement",
        )
    tree = statements[0]
    if isinstance(tree, exp.SetOperation):
        from .errors import SqlUnsupportedError

        raise SqlUnsupportedError(
            f"{type(tree).__name__.upper()} of queries is not supported; define one view "
            "per SELECT",
            position_of(text, keyword_offset(text, tree, type(tree).__name__.upper())),
            type(tree).__name__.upper(),
        )
    if not isinstance(tree, exp.Select):
        raise SqlSyntaxError(
            f"expected a SELECT statement, got {tree.sql(dialect=DIALECT)[:60]!r}",
            position_of(text, start_offset(tree) or 0),
            type(tree).__name__,
        )
    return tree


def _span(node: Any) -> tuple[int | None, int | None]:
    """The smallest and largest source offsets recorded in ``node`` or below (identifiers,
    literals and function names carry one)."""
    first = last = None
    for sub in node.walk():
        meta = getattr(sub, "_meta", None) or {}
        start, end = meta.get("start"), meta.get("end")
        if start is not None and (first is None or start < first):
            first = start
        if end is not None and (last is None or end > last):
            last = end
    return first, last


def start_offset(node: Any) -> int | None:
    """The smallest source offset recorded in ``node`` or below."""
    return _span(node)[0]


def _preceding_end(node: Any) -> int | None:
    """The largest source offset recorded before ``node`` in its statement (depth first)."""
    last = None
    for sub in node.root().dfs():
        if sub is node:
            break
        end = (getattr(sub, "_meta", None) or {}).get("end")
        if end is not None and (last is None or end > last):
            last = end
    return last


def keyword_offset(text: str, node: Any, keyword: str) -> int | None:
    """The offset of ``keyword`` (a word or phrase, case-insensitive) for ``node``: its first
    occurrence inside the node's span, else its last one before it; for a node without
    recorded offsets (``CURRENT_DATE``, ``()``), its first one after what precedes the node.
    The node's start when none is found."""
    start, end = _span(node)
    pattern = r"\b" + r"\s+".join(re.escape(w) for w in keyword.split()) + r"\b"
    if start is not None:
        inside = re.compile(pattern, re.IGNORECASE).search(text, start, (end or start) + 1)
        if inside:
            return inside.start()
    else:
        after = _preceding_end(node)
        found = re.compile(pattern, re.IGNORECASE).search(text, 0 if after is None else after + 1)
        if found:
            return found.start()
    limit = len(text) if start is None else start
    before = [m.start() for m in re.finditer(pattern, text[:limit], flags=re.IGNORECASE)]
    return before[-1] if before else start


def node_position(text: str, node: Any, keyword: str | None = None) -> tuple[int, int] | None:
    """``(line, column)`` of ``node`` in ``text`` (of ``keyword`` when given and found)."""
    offset = keyword_offset(text, node, keyword) if keyword else start_offset(node)
    return position_of(text, offset)


_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\((?:[\s(]|\b[A-Za-z_]\w*\s)*$")


def function_name(text: str, node: Any) -> str | None:
    """The name of the function call ``node`` as ``text`` writes it (``STRING_AGG`` where
    sqlglot says ``GroupConcat``): the node's own offsets, else the word before the last
    ``(`` opening its arguments, else the first of its names after what precedes it."""
    meta = getattr(node, "_meta", None) or {}
    if meta.get("start") is not None and meta.get("end") is not None:
        return text[meta["start"] : meta["end"] + 1]
    start = start_offset(node)
    if start is not None:  # NAME( [words] first argument, as in TRIM(BOTH 'x' FROM s)
        call = _CALL.search(text[:start])
        return call.group(1) if call else None
    names = "|".join(re.escape(n) for n in type(node).sql_names())
    after = _preceding_end(node)
    found = re.compile(rf"\b(?:{names})\b", re.IGNORECASE).search(
        text, 0 if after is None else after + 1
    )
    return found.group(0) if found else None
