"""Casts, substrings and BIGINT arithmetic in views against DuckDB, value for value (Python
values from ``fetchall``: integers exact, NULL as None)."""

from __future__ import annotations

import re
from decimal import Decimal

import duckdb
import numpy as np
import pandas as pd
import pytest

from ringml.errors import BatchError
from ringml.sql import Database, SqlUnsupportedError

STRATEGIES = ["fivm", "first_order", "higher_order", "recompute"]
SCHEMA = "CREATE TABLE R (a BIGINT, s VARCHAR, d DATE, x DOUBLE);"


def frame(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    base = {"a": [0] * n, "s": [""] * n, "d": ["2020-01-01"] * n, "x": [0.0] * n}
    return pd.DataFrame({**base, **columns})


def same_as_duckdb(sql: str, rows: pd.DataFrame, strategy: str) -> None:
    """The view over ``rows`` (inserted, then half deleted) equals DuckDB's result."""
    db = Database(SCHEMA)
    view = db.create_view("v", sql, strategy=strategy)
    con = duckdb.connect()
    for current in (rows, rows.iloc[: len(rows) // 2]):
        if len(current) < len(rows):
            db.delete("R", rows.iloc[len(rows) // 2 :].to_dict("list"))
        else:
            db.insert("R", rows.to_dict("list"))
        con.register("raw", current.assign(d=pd.to_datetime(current["d"])))
        con.execute("CREATE OR REPLACE VIEW R AS SELECT a, s, CAST(d AS DATE) AS d, x FROM raw")
        expected = sorted(con.sql(sql).fetchall(), key=repr)
        got = sorted(
            (tuple(None if v is None or v is pd.NA or v != v else v for v in row) for row in
             view.to_pandas().astype(object).itertuples(index=False, name=None)),
            key=repr,
        )  # fmt: skip
        assert [tuple(_plain(v) for v in r) for r in got] == [
            tuple(_plain(v) for v in r) for r in expected
        ], sql


def _plain(value):
    if isinstance(value, Decimal):  # DuckDB's DECIMAL, which ringml holds as a DOUBLE
        return float(value)
    if isinstance(value, pd.Timestamp):
        return value.date() if value == value.normalize() else value.to_pydatetime()
    return value.item() if hasattr(value, "item") else value


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_double_to_bigint_rounds_half_to_even_and_decimal_literals_half_away(strategy):
    """DuckDB rounds a DOUBLE half to even (the away-from-zero trick also turned
    0.49999999999999994 into 1 and odd integers beyond 2**52 into the next)."""
    xs = [-2.5, -0.5, 0.5, 1.5, 2.5, 0.49999999999999994, 4503599627370497.0, -7.25]
    sql = "SELECT x, CAST(x AS BIGINT) AS c, CAST(2.5 AS BIGINT) AS k FROM R"
    same_as_duckdb(sql, frame(x=xs), strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_text_to_bigint_is_exact_whatever_else_the_batch_holds(strategy):
    """One non-integral text made the whole column float64: 2**53 + 1 came back even."""
    texts = ["9007199254740993", "2.5", "12345678901234567.4", " -42 ", "+7", "-2.5",
             "9223372036854775807", "-9223372036854775808"]  # fmt: skip
    same_as_duckdb("SELECT s, CAST(s AS BIGINT) AS c FROM R", frame(s=texts), strategy)
    db = Database(SCHEMA)
    db.create_view("v", "SELECT CAST(s AS BIGINT) AS c FROM R", strategy=strategy)
    for beyond in ("9223372036854775808", "-9223372036854775809", "18446744073709551616"):
        with pytest.raises(BatchError, match="overflows BIGINT"):
            db.insert("R", frame(s=[beyond]).to_dict("list"))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_booleans_cast_to_numbers_keep_null_and_the_target_type(strategy):
    sql = (
        "SELECT a, CAST(CASE WHEN a > 0 THEN a > 2 END AS BIGINT) AS c, "
        "CAST(a > 0 AS DOUBLE) AS f FROM R"
    )
    same_as_duckdb(sql, frame(a=[-1, 1, 3, 5]), strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_substring_with_negative_starts_and_lengths(strategy):
    calls = [f"substring(s, {start}, {length})" for start in (-6, -2, 0, 2, 7) for length in
             (-3, 0, 2, 9)] + ["substring(s, -2)", "substring(s, 3)"]  # fmt: skip
    sql = "SELECT s, " + ", ".join(f"{c} AS c{i}" for i, c in enumerate(calls)) + " FROM R"
    same_as_duckdb(sql, frame(s=["hello", "hi", "", "abcdefgh"]), strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_date_is_the_day_of_a_text_with_a_time(strategy):
    """DATE '... 13:45' and CAST(text AS DATE) kept the time (no row matched)."""
    rows = frame(d=["2020-01-31", "2020-01-01"], s=["2020-01-31 13:45:00", "2021-06-05T23:59"])
    same_as_duckdb("SELECT d FROM R WHERE d = DATE '2020-01-31 13:45:00'", rows, strategy)
    same_as_duckdb("SELECT s, CAST(s AS DATE) AS c FROM R", rows, strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bigint_arithmetic_reaches_the_ends_of_int64_and_no_further(strategy):
    """A float estimate rejected 2**63 - 1 and -2**63 as overflows."""
    edge = frame(a=[9223372036854775806, -9223372036854775807, 4611686018427387903, 3])
    sql = "SELECT a, a + 1 AS p, a - 1 AS m FROM R"
    same_as_duckdb(sql, edge.iloc[[0, 1, 3]], strategy)
    same_as_duckdb("SELECT a * 2 AS t FROM R", edge.iloc[[2, 3]], strategy)
    db = Database(SCHEMA)
    db.create_view("v", "SELECT a * 2 AS t FROM R", strategy=strategy)
    with pytest.raises(BatchError, match="overflows BIGINT"):
        db.insert("R", frame(a=[4611686018427387904]).to_dict("list"))


def test_try_cast_is_refused_by_name_not_taken_for_cast():
    db = Database(SCHEMA)
    with pytest.raises(SqlUnsupportedError, match="TRY_CAST"):
        db.create_view("v", "SELECT TRY_CAST(s AS BIGINT) AS c FROM R")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bigint_compares_with_a_decimal_literal_exactly(strategy):
    """Through DOUBLE, 2**53 + 1 equalled 9007199254740992.0."""
    values = frame(a=[9007199254740993, 9007199254740992, 2, 3, -2, -3, 0, 2**62])
    for op in ("=", "<>", "<", "<=", ">", ">="):
        for literal in ("9007199254740992.0", "2.5", "-2.5", "2.0", "-0.5"):
            same_as_duckdb(f"SELECT a FROM R WHERE a {op} {literal}", values, strategy)
            same_as_duckdb(f"SELECT a FROM R WHERE {literal} {op} a", values, strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_abs_of_the_smallest_bigint_overflows_as_in_duckdb(strategy):
    """np.abs wrapped -2**63 to itself: a negative ABS, and a row WHERE ABS(a) >= 0 lost."""
    edge = frame(a=[-9223372036854775807, 9223372036854775807, -5, 0])
    same_as_duckdb("SELECT a, ABS(a) AS b FROM R WHERE ABS(a) >= 0", edge, strategy)
    with pytest.raises(duckdb.OutOfRangeException):
        duckdb.sql("SELECT ABS(CAST(-9223372036854775808 AS BIGINT))").fetchall()
    for sql in ("SELECT a, ABS(a) AS b FROM R", "SELECT a FROM R WHERE ABS(a) >= 0"):
        db = Database(SCHEMA)
        db.create_view("v", sql, strategy=strategy)
        with pytest.raises(BatchError, match=r"abs\(R\.a\) overflows BIGINT"):
            db.insert("R", frame(a=[-9223372036854775808, -5]).to_dict("list"))


def test_upper_and_lower_map_every_character_as_duckdb_does_one_to_one():
    """Python's full case mapping made UPPER('Straße') 'STRASSE' (DuckDB: 'STRAẞE'),
    UPPER('ﬁ') 'FI', LOWER('İ') two characters and a final 'Σ' 'ς'.  Every code point that
    DuckDB or Python maps, alone and in words."""
    con = duckdb.connect()
    everything = con.sql(
        "SELECT chr(CAST(i AS INTEGER)) AS s FROM range(1, 1114112) t(i) "
        "WHERE i NOT BETWEEN 55296 AND 57343"
    ).df()
    text = everything["s"]
    cased = text[text.str.upper().ne(text) | text.str.lower().ne(text)]
    mapped = con.sql("SELECT s FROM everything WHERE upper(s) <> s OR lower(s) <> s").df()["s"]
    texts = sorted(set(cased) | set(mapped)) + ["Straße", "ΟΔΟΣ ΟΔΟΣ", "İstanbul", "ﬁnal"]
    rows = frame(s=texts)
    sql = "SELECT s, UPPER(s) AS u, LOWER(s) AS l, LENGTH(UPPER(s)) AS n FROM R"
    same_as_duckdb(sql, rows, "fivm")
    same_as_duckdb("SELECT s FROM R WHERE UPPER(s) = 'STRAẞE' OR LOWER(s) = 'i'", rows, "fivm")


def _random_decimals(rng: np.random.Generator, n: int) -> tuple[list, list, list]:
    """Doubles, digit strings and integers, many of them halves at some scale."""
    digits = rng.integers(-(10**7), 10**7, n)
    places = rng.integers(0, 6, n)
    texts = [f"{d / 10**k:.{k}f}" for d, k in zip(digits, places, strict=True)]
    texts += ["1.005", "-0.125", "2.5", "-2.5", " 7 ", "1e2", "0.045", "-1.0005", "99.995"]
    doubles = [float(t) for t in texts] + [0.125, -0.375, 2.675, 1e-7, -1234.5625]
    integers = [int(d) for d in digits[: n // 2]] + [0, -7, 10**7 - 1]
    return doubles, texts, integers


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_casts_to_decimal_round_to_the_scale_as_duckdb_does(strategy):
    """DECIMAL(p,s) dropped p and s: CAST(2.7 AS DECIMAL(10,0)) was 2.7 (DuckDB 3),
    CAST('1.005' AS DECIMAL(10,2)) 1.005 (DuckDB 1.01).  Compared exactly (as DOUBLEs)."""
    doubles, texts, integers = _random_decimals(np.random.default_rng(7), 300)
    targets = ["DECIMAL(18, 3)", "DECIMAL(12,2)", "NUMERIC(10)", "DECIMAL(13,5)", "DECIMAL"]
    casts = ", ".join(
        f"CAST({c} AS {t}) AS {c}{i}" for i, t in enumerate(targets) for c in ("x", "s", "a")
    )
    rows = pd.concat(
        [
            frame(x=doubles, s=[str(x) for x in doubles]),
            frame(s=texts),
            frame(a=integers, s=[str(a) for a in integers]),
        ],
        ignore_index=True,
    )
    same_as_duckdb(f"SELECT x, s, a, {casts} FROM R", rows, strategy)
    literals = ["1.005", "-0.125", "2.5", "2.675", "7", "1e2", "-0.0005"]
    sql = ", ".join(f"CAST({v} AS DECIMAL(10, 2)) AS l{i}" for i, v in enumerate(literals))
    same_as_duckdb(
        f"SELECT a, {sql}, CAST(2.5 AS DECIMAL(2,0)) AS h FROM R", frame(a=[1]), strategy
    )
    chained = "SELECT x, CAST(CAST(x AS DECIMAL(10,1)) AS INTEGER) AS c FROM R"  # half away
    same_as_duckdb(chained, frame(x=[2.45, -2.45, 0.25, 1.5, 2.5, 3.04]), strategy)
    where = "SELECT x FROM R WHERE CAST(x AS DECIMAL(10,2)) = 1.01"
    same_as_duckdb(where, frame(x=[1.005, 1.0149, 1.015, 1.0]), strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_casts_to_narrow_integers_keep_their_range_as_duckdb_does(strategy):
    """SMALLINT, TINYINT, UTINYINT, INTEGER, ... were BIGINT: CAST(300 AS TINYINT) was 300."""
    edges = [-128, 127, 0, 255, -32768, 32767, 65535, -(2**31), 2**31 - 1, 2**32 - 1]
    sql = (
        "SELECT a, x, s, CAST(x AS TINYINT) AS t, CAST(s AS SMALLINT) AS m, "
        "CAST(x AS UTINYINT) AS u, CAST(a AS BIGINT) AS b FROM R WHERE a = 0"
    )
    rows = frame(x=[-128.0, 127.4, 2.5, 3.5, 0.0], s=["-32768", "32767", "2.5", " 7", "-3"])
    same_as_duckdb(sql.replace("CAST(x AS UTINYINT)", "CAST(ABS(x) AS UTINYINT)"), rows, strategy)
    for target, low, high in [
        ("TINYINT", -128, 127),
        ("SMALLINT", -32768, 32767),
        ("INTEGER", -(2**31), 2**31 - 1),
        ("UTINYINT", 0, 255),
        ("USMALLINT", 0, 65535),
        ("UINTEGER", 0, 2**32 - 1),
    ]:
        inside = [e for e in edges if low <= e <= high]
        same_as_duckdb(f"SELECT a, CAST(a AS {target}) AS c FROM R", frame(a=inside), strategy)


@pytest.mark.parametrize(
    "sql, value",
    [
        ("SELECT CAST(a AS TINYINT) AS c FROM R", 128),
        ("SELECT CAST(a AS UTINYINT) AS c FROM R", -1),
        ("SELECT a FROM R WHERE CAST(a AS SMALLINT) > 0", 32768),
        ("SELECT CAST(a AS INTEGER) AS c FROM R", -(2**31) - 1),
        ("SELECT CAST(a AS UBIGINT) AS c FROM R", -5),
        ("SELECT CAST(x AS TINYINT) AS c FROM R", 127.5),
        ("SELECT CAST(x AS DECIMAL(5,2)) AS c FROM R", 999.995),
        ("SELECT CAST(s AS DECIMAL(4,2)) AS c FROM R", "100"),
        ("SELECT CAST(s AS DECIMAL(4,2)) AS c FROM R", "99.995"),
        ("SELECT CAST(a AS DECIMAL(3,1)) AS c FROM R", 100),
    ],
)
def test_a_cast_beyond_its_type_rejects_the_batch_naming_the_value(sql, value):
    """DuckDB refuses these values; the batch is refused, the value named."""
    column = {int: "a", float: "x", str: "s"}[type(value)]
    rows = frame(**{column: [value]})
    con = duckdb.connect()
    con.register("R", rows)
    with pytest.raises(duckdb.Error, match="range|cast"):
        con.sql(sql).fetchall()
    db = Database(SCHEMA)
    db.create_view("v", sql)
    with pytest.raises(BatchError, match=r"overflows [A-Z]+.*: " + re.escape(repr(value))):
        db.insert("R", rows.to_dict("list"))
    assert db.view("v").to_pandas().empty


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_decimal_arithmetic_to_bigint_rounds_half_away_as_duckdb(strategy):
    """``0.5 * a`` is a DECIMAL in DuckDB (a decimal literal times a BIGINT), rounded half
    away from zero by CAST; it was rounded as a DOUBLE, half to even (CAST(0.5 * 1) was 0)."""
    sql = (
        "SELECT a, CAST(0.5 * a AS BIGINT) AS h, CAST(-(a * 2.5) AS BIGINT) AS n, "
        "CAST(a - 0.5 AS BIGINT) AS m, CAST(a / 2 AS BIGINT) AS d, CAST(x * 0.5 AS BIGINT) AS f "
        "FROM R"
    )
    same_as_duckdb(sql, frame(a=[1, 3, -1, 5, 0, 2], x=[1.0, 5.0, -1.0, 3.0, 0.0, 2.0]), strategy)
