"""NULL in SQL views and queries, checked against DuckDB under every strategy: the NULL
literal in WHERE, SELECT, CASE, HAVING, GROUP BY, IN and LIKE; COUNT, SUM, AVG, MIN and MAX
of NULL; GROUP BY and DISTINCT over expressions that can be NULL; derived tables holding
NULLs; ``Database.query`` over a view that holds NULLs.  Each view is compared over empty
tables, after a load and after deletes, and under the random insert/delete streams of
``test_sql_streams`` (published diffs included).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from sql_oracle import assert_same_rows, assert_views_match, duckdb_results
from test_sql_streams import SCHEMA, SETTINGS, current_frames, frame, streams
from test_sql_streams import run_stream as run_views_stream

from ringml.maintainer import STRATEGIES
from ringml.sql import Database, SqlUnsupportedError

#: name -> (SQL, indices of ORDER BY columns compared in sequence)
VIEWS = {
    "where_null": ("SELECT a, b FROM R WHERE NULL", []),
    "three_valued": (
        "SELECT a, b FROM R WHERE (NULL OR a > 1) AND NOT (NULL AND b > 1) AND b <> NULL + 1 "
        "OR a = 0",
        [],
    ),
    "null_arithmetic": (
        "SELECT a, NULL + b AS c, -NULL AS d, x * NULL AS e, COALESCE(NULL, x) AS f, "
        "NULL = a AS g, NULL AS h, LOWER(NULL) AS i FROM R",
        [],
    ),
    "case_when_null": (
        "SELECT CASE WHEN NULL THEN 1 ELSE 2 END AS c, COUNT(*) AS n FROM R GROUP BY c",
        [],
    ),
    "having_null": ("SELECT a, COUNT(*) AS n FROM R GROUP BY a HAVING NULL", []),
    "having_null_or": (
        "SELECT a, COUNT(*) AS n FROM R GROUP BY a HAVING NULL OR COUNT(*) > 1",
        [],
    ),
    "count_of_null": (
        "SELECT COUNT(NULL) AS n, COUNT(CAST(NULL AS BIGINT)) AS m, COUNT(*) AS k FROM R",
        [],
    ),
    "grouped_count_of_null": (
        "SELECT a, COUNT(NULL) AS n, COUNT(CAST(NULL AS BIGINT)) AS m, "
        "COUNT(DISTINCT NULL) AS nd, COUNT(*) AS k FROM R GROUP BY a",
        [],
    ),
    "aggregates_of_null": (
        "SELECT SUM(NULL + b) AS s, SUM(NULL) AS t, AVG(NULL) AS v, MIN(NULL) AS lo, "
        "MAX(NULL) AS hi, SUM(DISTINCT NULL) AS sd, COUNT(*) AS k FROM R",
        [],
    ),
    "grouped_aggregates_of_null": (
        "SELECT a, SUM(NULL) AS s, AVG(NULL) AS v, MIN(NULL) AS lo, MAX(CAST(NULL AS DATE)) "
        "AS hi, SUM(x) AS sx FROM R GROUP BY a",
        [],
    ),
    "join_constant_case": (
        "SELECT R.a, SUM(CASE WHEN NULL THEN R.x WHEN R.a > 1 THEN S.y ELSE R.x * S.y END) "
        "AS s, COUNT(CASE WHEN NULL THEN S.y END) AS n FROM R JOIN S ON R.b = S.b GROUP BY R.a",
        [],
    ),
    "in_like_null": (
        "SELECT R.b, S.c FROM R JOIN S ON R.b = S.b WHERE R.b IN (1, NULL) "
        "OR R.a NOT IN (2, NULL) OR S.c LIKE NULL OR S.c LIKE 'a%'",
        [],
    ),
    "nullable_group": (
        "SELECT CASE WHEN a > 1 THEN a END AS k, NULLIF(b, 0) AS nb, COUNT(*) AS n, "
        "SUM(x) AS s FROM R GROUP BY 1, 2",
        [],
    ),
    "nullable_join_group": (
        "SELECT NULLIF(S.c, 'a') AS k, COUNT(*) AS n, SUM(R.x) AS s FROM R JOIN S "
        "ON R.b = S.b GROUP BY k",
        [],
    ),
    "distinct_nullable": ("SELECT DISTINCT NULLIF(a, 1) AS k, NULL AS z FROM R", []),
    "group_by_null": ("SELECT NULL AS g, COUNT(*) AS n, SUM(x) AS s FROM R GROUP BY NULL", []),
    "derived_null_groups": (
        "SELECT q.s, COUNT(*) AS n, SUM(q.a) AS t FROM (SELECT a, SUM(CASE WHEN b > 1 "
        "THEN b END) AS s FROM R GROUP BY a) AS q GROUP BY q.s",
        [],
    ),
    "derived_null_filter": (
        "SELECT q.a, q.s, q.s + 1 AS t FROM (SELECT a, SUM(CASE WHEN b > 1 THEN b END) AS s "
        "FROM R GROUP BY a) AS q WHERE q.s IS NULL OR q.s > 2",
        [],
    ),
    "ordered_null_key": (
        "SELECT CASE WHEN a > 1 THEN a END AS k, COUNT(*) AS n FROM R GROUP BY k "
        "ORDER BY k NULLS FIRST",
        [0],
    ),
    # a NULL correlation value matches no row of the subquery
    "exists_null_key": (
        "SELECT a, b FROM R WHERE EXISTS (SELECT * FROM S WHERE S.b = NULLIF(R.a, 0)) "
        "OR NOT EXISTS (SELECT * FROM S WHERE S.b = NULLIF(R.b, 1) AND S.y > 0)",
        [],
    ),
    "scalar_null_key": (
        "SELECT a, x FROM R WHERE x < (SELECT AVG(S.y) FROM S WHERE S.b = NULLIF(R.b, 0)) "
        "OR (SELECT COUNT(*) FROM S WHERE S.b = NULLIF(R.b, 1)) = 0",
        [],
    ),
    # x IN / NOT IN / op ALL / op ANY (subquery) with x NULL: NULL, unless the subquery
    # is empty (IN, ANY: FALSE; NOT IN, ALL: TRUE)
    "in_null_operand": (
        "SELECT a, b FROM R WHERE NULLIF(R.b, 0) IN (SELECT b FROM S) "
        "OR NOT (NULLIF(R.a, 1) IN (SELECT b FROM S WHERE S.y > 1)) "
        "OR NULL NOT IN (SELECT b FROM S WHERE S.y > 2)",
        [],
    ),
    "all_any_null_operand": (
        "SELECT a, b FROM R WHERE NULLIF(R.b, 2) > ALL (SELECT b FROM S WHERE S.y > 1) "
        "OR NOT (NULLIF(R.a, 1) = ANY (SELECT b FROM S)) "
        "OR NOT (NULLIF(R.b, 0) = ALL (SELECT b FROM S WHERE S.y = R.a))",
        [],
    ),
    # MIN/MAX/DISTINCT over an expression that can be NULL skip its NULLs (NULL over
    # NULLs only); a subquery correlated by one: its NULL rows meet no outer row
    "min_max_of_nullable": (
        "SELECT a, MIN(CASE WHEN b > 0 THEN x END) AS lo, MAX(NULLIF(b, 2)) AS hi, "
        "COUNT(DISTINCT NULLIF(b, 1)) AS n, SUM(DISTINCT NULLIF(b, 0)) AS s, "
        "AVG(DISTINCT CASE WHEN x > 0 THEN x END) AS m FROM R GROUP BY a",
        [],
    ),
    "global_min_of_nullable": (
        "SELECT MIN(NULLIF(a, 0)) AS lo, MAX(CASE WHEN x < 0 THEN x END) AS hi FROM R",
        [],
    ),
    "nullable_correlation": (
        "SELECT a FROM R WHERE x > (SELECT AVG(y) FROM S WHERE NULLIF(S.b, 0) = R.b) "
        "OR (SELECT COUNT(*) FROM S WHERE NULLIF(S.b, 1) = R.a) = 0 "
        "OR x < (SELECT AVG(y) FROM S WHERE CASE WHEN S.b > 0 THEN NULL END = R.b)",
        [],
    ),
    # x IN / NOT IN / op ALL / op ANY (subquery) whose rows can be NULL: NULL where no
    # non-NULL row decides it and some row is NULL
    "in_nullable_rows": (
        "SELECT a, b FROM R WHERE NOT (R.b IN (SELECT NULLIF(b, 0) FROM S)) "
        "OR NULLIF(R.a, 2) NOT IN (SELECT NULLIF(S.b, 1) FROM S WHERE S.y > 0)",
        [],
    ),
    "all_any_nullable_rows": (
        "SELECT a, b FROM R WHERE NOT (R.b > ALL (SELECT NULLIF(b, 0) FROM S)) "
        "OR NOT (R.a < ANY (SELECT NULLIF(S.b, 2) FROM S WHERE S.y > 0)) "
        "OR NOT (R.b = ALL (SELECT NULLIF(S.b, 1) FROM S WHERE S.y = R.a)) "
        "OR R.a <> ANY (SELECT NULLIF(S.b, 0) FROM S WHERE S.y < 5)",
        [],
    ),
    "grouped_in_null": (
        "SELECT a, b FROM R WHERE NULLIF(R.b, 0) NOT IN (SELECT NULLIF(b, 2) FROM S GROUP BY b) "
        "OR NOT (NULLIF(R.a, 3) IN (SELECT b FROM S GROUP BY b))",
        [],
    ),
}

#: a view holding NULLs (groups with no b > 1, no x > 0), read by the queries below
HOLDER = (
    "SELECT a, SUM(CASE WHEN b > 1 THEN b END) AS s, AVG(CASE WHEN x > 0 THEN x END) AS m, "
    "COUNT(*) AS n FROM R GROUP BY a"
)
QUERIES = {
    "star": "SELECT * FROM holder",
    "grouped": "SELECT s, COUNT(*) AS k, SUM(n) AS t FROM holder GROUP BY s",
    "aggregates": "SELECT COUNT(s) AS c, SUM(s) AS t, AVG(m) AS am, COUNT(*) AS k FROM holder",
    "filtered": "SELECT a, m FROM holder WHERE s IS NULL OR m < 1",
    "joined": "SELECT holder.a, S.c FROM holder JOIN S ON holder.s = S.y",
    "distinct": "SELECT DISTINCT s, m FROM holder",
    "ordered": "SELECT a, s FROM holder ORDER BY s NULLS FIRST, a",
}


def check(databases: dict, tables: dict, what: str, views=VIEWS, queries=QUERIES) -> dict:
    """Every view of ``views`` and query of ``queries`` over the ``holder`` view equal
    DuckDB's answers on the current tables; DuckDB's results of the views."""
    sql = {name: text for name, (text, _) in views.items()}
    sql["holder"] = HOLDER
    for name, text in queries.items():
        sql[f"query {name}"] = f"WITH holder AS ({HOLDER}) {text}"
    results = duckdb_results(sql, current_frames(tables))
    assert_views_match(databases, views, results, what)
    for strategy, db in databases.items():
        for name, text in queries.items():
            ours = db.query(text)
            assert_same_rows(ours, results[f"query {name}"], f"{what}, query {name}, {strategy}")
    return results


ROWS = {
    "R": [(0, 1, 0.5), (1, 2, -1.25), (1, 0, 2.0), (2, 2, 3.75), (3, 1, -1.25), (2, 0, 0.5)],
    "S": [(1, "a", 2), (2, "ab", 1), (0, "b", 5), (2, "A", 0)],
    "T": [],
    "E": [],
}
#: deleted after the load: groups 1 and 2 are left with no b > 1
GONE = [(1, 2, -1.25), (2, 2, 3.75)]


def follow(views: dict, queries: dict) -> None:
    """``views`` (and ``holder``) in one database per strategy, and ``queries`` over
    ``holder``, against DuckDB over empty tables (one row of empty aggregates, no group),
    after a load, after deletes that leave groups with no non-NULL value, and with R
    emptied."""
    dbs = {}
    for strategy in STRATEGIES:
        dbs[strategy] = Database(SCHEMA)
        for name, (sql, _) in {**views, "holder": (HOLDER, [])}.items():
            dbs[strategy].create_view(name, sql, strategy=strategy)
    tables = {t: [] for t in ROWS}

    def step(what: str, change) -> None:
        for db in dbs.values():
            change(db)
        check(dbs, tables, what, views, queries)

    step("empty tables", lambda db: None)
    tables.update({t: list(rows) for t, rows in ROWS.items()})
    step("loaded", lambda db: [db.insert(t, frame(t, r)) for t, r in ROWS.items() if r])
    tables["R"] = [r for r in tables["R"] if r not in GONE]
    step("after deletes", lambda db: db.delete("R", frame("R", GONE)))
    left, tables["R"] = tables["R"], []
    step("R emptied", lambda db: db.delete("R", frame("R", left)))


@pytest.mark.parametrize("name", VIEWS)
def test_a_view_with_null_follows_duckdb(name):
    follow({name: VIEWS[name]}, {})


@pytest.mark.parametrize("name", QUERIES)
def test_a_query_over_a_view_holding_nulls_follows_duckdb(name):
    follow({}, {name: QUERIES[name]})


@settings(max_examples=6, **SETTINGS)
@given(streams(max_rows=8, max_steps=6))
def test_views_with_null_follow_duckdb_under_random_streams(stream):
    views = {**VIEWS, "holder": (HOLDER, [])}
    run_views_stream(*stream, views, check, STRATEGIES)


def test_a_query_reads_the_nulls_of_a_view():
    """The view of a group with no b > 5 holds NULL; a query reads it as a table does
    (MIN/MAX/DISTINCT over such a column skip its NULLs)."""
    db = Database("CREATE TABLE R (a INTEGER, b INTEGER);")
    db.insert("R", {"a": [1, 1, 2], "b": [3, 7, 4]})
    db.create_view("v", "SELECT a, SUM(CASE WHEN b > 5 THEN b END) AS s FROM R GROUP BY a")
    rows = db.query("SELECT * FROM v ORDER BY a")
    assert rows["a"].tolist() == [1, 2]
    assert rows["s"].iloc[0] == 7 and rows["s"].isna().iloc[1]
    assert db.query("SELECT a FROM v WHERE s IS NULL")["a"].tolist() == [2]
    assert db.query("SELECT COUNT(s) AS n, COUNT(*) AS m FROM v").values.tolist() == [[1, 2]]
    got = db.query("SELECT MIN(s) AS lo, MAX(s) AS hi, COUNT(DISTINCT s) AS n FROM v")
    assert got.values.tolist() == [[7, 7, 1]]
    got = db.query("SELECT MIN(s) AS lo, COUNT(DISTINCT s) AS n FROM v WHERE a = 2")
    assert got["lo"].isna().all() and got["n"].tolist() == [0]


def test_errors_of_a_query_speak_of_a_query():
    db = Database("CREATE TABLE R (a INTEGER, b INTEGER); CREATE TABLE S (b INTEGER);")
    sql = "SELECT R.a FROM R LEFT JOIN S ON R.b = S.b"
    with pytest.raises(SqlUnsupportedError, match="in a query") as error:
        db.query(sql)
    assert "view" not in str(error.value) and error.value.position == (1, 19)
    with pytest.raises(SqlUnsupportedError, match="in a view"):
        db.create_view("v", sql)


def test_an_int_column_getting_a_null_at_the_edge_of_int64_publishes_its_diff():
    """The column holds NULLs as pandas "Int64": 2**63 - 1 stays exact in the diffs."""
    db = Database("CREATE TABLE R (a BIGINT, b INTEGER);")
    view = db.create_view("v", "SELECT b, SUM(CASE WHEN a > 1 THEN a END) AS k FROM R GROUP BY b")
    diffs = []
    view.subscribe(diffs.append)
    db.insert("R", {"a": [2**63 - 1], "b": [1]})
    db.insert("R", {"a": [0, 0], "b": [1, 2]})
    assert diffs[-1]["k"].dtype == "Int64" and diffs[-1]["k"].isna().sum() == 1
    db.delete("R", {"a": [2**63 - 1], "b": [1]})
    assert diffs[-1]["k"].dtype == "Int64"
    assert diffs[-1]["k"].tolist()[0] == 2**63 - 1 and diffs[-1]["multiplicity"].tolist() == [-1, 1]


def _nulls_first(row: tuple) -> list:
    return [(v is not None, v or 0) for v in row]


def test_nullable_bigint_output_columns_stay_exact():
    """A nullable BIGINT output (bag projection, SUM/MIN/MAX with NULL groups) is "Int64"
    with exact values, in to_pandas, to_arrow, diffs, ORDER BY and a query over the view
    (it was float64: 2**62 + 1 read back as 2**62)."""
    import duckdb
    import pandas as pd
    import pyarrow as pa

    big = 2**62 + 1
    tables = {
        "R": pd.DataFrame({"g": [1, 1, 2, 3], "a": pd.array([big, None, None, -big], "Int64")})
    }
    views = {
        "bag": "SELECT a FROM R",
        "agg": "SELECT g, SUM(a) AS s, MAX(a) AS m, MIN(a) AS lo FROM R GROUP BY g",
        "first": "SELECT g, SUM(a) AS s FROM R GROUP BY g ORDER BY s NULLS FIRST, g",
        "last": "SELECT g, MAX(a) AS m FROM R GROUP BY g ORDER BY m DESC NULLS LAST, g",
    }
    for strategy in STRATEGIES:
        db = Database("CREATE TABLE R (g BIGINT, a BIGINT NULL)")
        diffs = {name: [] for name in views}
        for name, sql in views.items():
            db.create_view(name, sql, strategy=strategy).subscribe(diffs[name].append)
        db.insert("R", tables["R"])
        con = duckdb.connect()  # rows as Python ints (a frame would hold them as floats)
        con.register("R", tables["R"])
        for name in views:
            got = db.view(name).to_pandas()
            ints = [c for c in got.columns if c != "g"]
            assert all(got[c].dtype == "Int64" for c in ints), got.dtypes
            rows = [tuple(None if v is pd.NA else int(v) for v in r) for r in got.itertuples(False)]
            theirs = con.sql(views[name]).fetchall()
            if name in ("first", "last"):
                assert rows == theirs, (name, rows, theirs)
            else:
                assert sorted(rows, key=_nulls_first) == sorted(theirs, key=_nulls_first), name
            diff = diffs[name][-1]
            assert all(diff[c].dtype == "Int64" for c in ints)
        arrow = db.view("bag").to_arrow().column("a")
        assert arrow.type == pa.int64() and sorted(arrow.drop_null().to_pylist()) == [-big, big]
        assert arrow.null_count == 2
        got = db.query("SELECT g, s + 1 AS t FROM agg WHERE s IS NULL OR s > 0")
        assert got["t"].dtype == "Int64"
        assert sorted(got.astype(object).where(got.notna(), None).values.tolist(), key=str) == [
            [1, big + 1],
            [2, None],
        ]
        db.delete("R", {"g": [1], "a": [big]})
        diff = diffs["agg"][-1]
        assert diff["s"].dtype == "Int64" and big in diff["s"].tolist()
        assert db.view("agg").to_pandas().set_index("g")["m"].isna().tolist() == [True, True, False]
