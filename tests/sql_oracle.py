"""DuckDB as the oracle of SQL views: run the view's SQL on the current tables, compare the
rows as multisets (floats within a tolerance), and the multiset difference of two results."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import duckdb
import numpy as np
import pandas as pd

RTOL = 1e-9


_CONNECTION = None


def _connection():
    global _CONNECTION
    if _CONNECTION is None:
        _CONNECTION = duckdb.connect()
    return _CONNECTION


def duckdb_rows(sql: str, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """``sql`` run by DuckDB over ``tables`` (registered DataFrames)."""
    return duckdb_results({"": sql}, tables)[""]


def duckdb_results(queries: dict[str, str], tables: dict[str, pd.DataFrame]) -> dict:
    """Several queries over the same ``tables`` (one registration)."""
    con = _connection()
    for name, frame in tables.items():
        con.register(name, frame)
    try:
        return {key: con.sql(sql).df() for key, sql in queries.items()}
    finally:
        for name in tables:
            con.unregister(name)


def _normal(frame: pd.DataFrame) -> list[np.ndarray]:
    """The columns as comparable arrays: numbers as float64 (NULL as NaN), dates as int64
    nanoseconds, the rest as objects (NULL as None)."""
    out = []
    for _, values in frame.items():
        kind = values.dtype.kind
        if kind in "mM":
            out.append(values.to_numpy().astype("datetime64[ns]").view(np.int64).astype(float))
        elif kind in "iufb":
            out.append(values.to_numpy(dtype=np.float64, na_value=np.nan))
        else:
            data = values.to_numpy(dtype=object)
            present = [v for v in data if v is not None and v == v]
            if present and all(isinstance(v, int | float | Decimal) for v in present):
                out.append(np.asarray([np.nan if v is None else float(v) for v in data]))
            else:
                out.append(
                    np.asarray([None if v is None or v != v else v for v in data], dtype=object)
                )
    return out


def _sorted_columns(frame: pd.DataFrame) -> list[np.ndarray]:
    """The normalized columns, rows sorted by all of them (NULLs first)."""
    columns = _normal(frame)
    if not columns or not len(frame):
        return columns
    keys = []
    for c in columns:
        if c.dtype.kind == "f":
            missing = np.isnan(c)
            keys += [~missing, np.where(missing, 0.0, c)]
        else:
            keys.append(_ranks(c))
    order = np.lexsort(keys[::-1])
    return [c[order] for c in columns]


def _ranks(values: np.ndarray) -> np.ndarray:
    """Each value's rank among the distinct ones, NULL first, in Python's order and equality
    (pandas would factorize strings as C strings: "a" and "a\\x00" as one)."""
    rank = {v: i for i, v in enumerate(sorted({v for v in values if v is not None}), 1)}
    return np.asarray([0 if v is None else rank[v] for v in values], dtype=np.int64)


def _null(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def _close(a, b, rtol: float) -> bool:
    if _null(a) or _null(b):
        return _null(a) and _null(b)
    if isinstance(a, float) and isinstance(b, float):
        return bool(np.isclose(a, b, rtol=rtol, atol=rtol))
    return a == b


def assert_same_rows(
    ours: pd.DataFrame, theirs: pd.DataFrame, what: str = "", rtol: float = RTOL
) -> None:
    """Equal as multisets of rows (by position of columns), floats within ``rtol``."""
    assert ours.shape == theirs.shape, (
        f"{what}: {ours.shape} rows/columns vs DuckDB {theirs.shape}\nours:\n{ours}\n"
        f"duckdb:\n{theirs}"
    )
    for j, (a, b) in enumerate(zip(_sorted_columns(ours), _sorted_columns(theirs), strict=True)):
        if a.dtype.kind == "f" and b.dtype.kind == "f":
            same = np.isclose(a, b, rtol=rtol, atol=rtol, equal_nan=True)
        else:
            same = np.asarray([_close(x, y, rtol) for x, y in zip(a, b, strict=True)], dtype=bool)
        if not same.all():
            at = int(np.flatnonzero(~same)[0])
            raise AssertionError(
                f"{what}: column {j}, sorted row {at}: {a[at]!r} vs DuckDB {b[at]!r}\n"
                f"ours:\n{ours}\nduckdb:\n{theirs}"
            )


def assert_same_order(ours: pd.DataFrame, theirs: pd.DataFrame, columns: list[int], what=""):
    """The ORDER BY columns come in the same sequence."""
    for j in columns:
        a, b = _normal(ours.iloc[:, [j]])[0], _normal(theirs.iloc[:, [j]])[0]
        assert len(a) == len(b), what
        for u, v in zip(a, b, strict=True):
            assert _close(u, v, RTOL), f"{what}: ORDER BY column {j}: {a} vs {b}"


def _key(v):
    """A row value as a Counter key: NULL as None, floats to 10 significant digits."""
    if _null(v):
        return None
    if isinstance(v, float):
        return float(f"{v:.10g}") + 0.0
    return v


def multiset_difference(before: pd.DataFrame, after: pd.DataFrame) -> Counter:
    """``after - before`` as a Counter of rows (floats to 10 significant digits)."""

    def rows(frame):
        columns = _normal(frame)
        out = Counter()
        for row in zip(*columns, strict=True) if columns else [()] * len(frame):
            out[tuple(_key(v) for v in row)] += 1
        return out

    delta = rows(after)
    delta.subtract(rows(before))
    return Counter({k: v for k, v in delta.items() if v})


def diff_counter(diff: pd.DataFrame) -> Counter:
    """A view diff (rows and a trailing multiplicity column) as a Counter."""
    if diff is None or not len(diff):
        return Counter()
    columns = _normal(diff.iloc[:, :-1])
    out = Counter()
    mult = diff.iloc[:, -1].to_numpy()
    for row, m in zip(
        zip(*columns, strict=True) if columns else [()] * len(diff), mult, strict=True
    ):
        out[tuple(_key(v) for v in row)] += int(m)
    return Counter({k: v for k, v in out.items() if v})


def assert_views_match(databases: dict, views: dict, results: dict, what: str) -> None:
    """Every view of ``views`` (name -> (SQL, ORDER BY columns compared in sequence)) in
    every database of ``databases`` (strategy -> database) reads DuckDB's ``results``."""
    for name, (_, order) in views.items():
        expected = results[name]
        for strategy, db in databases.items():
            ours = db.view(name).to_pandas()
            assert_same_rows(ours, expected, f"{what}, view {name}, {strategy}")
            if order:
                assert_same_order(ours, expected, order, f"{what}, view {name}, {strategy}")


def assert_published_diffs(diffs: dict, before: dict, after: dict, what: str) -> None:
    """The diffs each view published (``diffs``: (strategy, view) -> list, at most one per
    batch) add up to the multiset difference of DuckDB's results ``before`` and ``after``;
    empties the lists."""
    for (strategy, name), published in diffs.items():
        got = diff_counter(None)
        for d in published:
            got.update(diff_counter(d))
        got = type(got)({k: v for k, v in got.items() if v})
        expected = multiset_difference(before[name], after[name])
        assert got == expected, f"{what}, diff of view {name} ({strategy})"
        assert len(published) <= 1
        published.clear()
