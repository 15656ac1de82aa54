"""Exact integers and exact strings in SQL views, checked against DuckDB: SUM/AVG(DISTINCT)
of BIGINTs beyond 2**53 and 2**63, sums whose rows times their multiplicities leave int64
while the sum does not, and strings that differ by a NUL character ("a" < "a\\x00")."""

from __future__ import annotations

import math
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest
from sql_oracle import assert_same_order, assert_same_rows, duckdb_rows

from ringml.encoding import factorize, factorize_rows
from ringml.errors import BatchError, RingmlError
from ringml.sql import Database
from ringml.sql import output as sql_output

STRATEGIES = ["fivm", "first_order", "higher_order", "recompute"]
B = 2**62


def exact_rows(sql: str, tables: dict[str, pd.DataFrame]) -> list[tuple]:
    """DuckDB's rows as Python values (HUGEINT sums as ints, not rounded to float64)."""
    con = duckdb.connect()
    for name, frame in tables.items():
        con.register(name, frame)
    return sorted(con.sql(sql).fetchall())


def view_rows(db: Database, name: str) -> list[tuple]:
    frame = db.view(name).to_pandas()
    return sorted(zip(*(frame[c].tolist() for c in frame.columns), strict=True))


def load(strategy: str, first: bool, schema: str, tables: dict, views: dict) -> Database:
    """A database with ``tables`` inserted before (``first``) or after its ``views``."""
    db = Database(schema)

    def insert():
        for name, frame in tables.items():
            db.insert(name, frame)

    if first:
        insert()
    for name, sql in views.items():
        db.create_view(name, sql, strategy=strategy)
    if not first:
        insert()
    return db


# ------------------------------------------------------------------ SUM/AVG(DISTINCT)
DISTINCT = {
    # SUM(DISTINCT) wrapped around int64 (a pandas sum), AVG(DISTINCT) was a float mean
    "sums": "SELECT g, SUM(DISTINCT x) AS s, AVG(DISTINCT x) AS m FROM R WHERE g < 3 GROUP BY g",
    "avgs": "SELECT g, AVG(DISTINCT x) AS m, COUNT(DISTINCT x) AS n FROM R GROUP BY g",
}


@pytest.mark.parametrize("first", [True, False], ids=["loaded", "streamed"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_integer_sum_and_avg_distinct_are_exact(strategy, first):
    """Per group: 2**62 + 1 from values beyond 2**62; 2 and 2/3 from {2, 2**62, -2**62}
    (a float mean gave 0.0); the mean of three values near 2**63 (their sum leaves
    int64, their mean does not); 2**52 + 1 from {2**53 + 1, 1}."""
    rows = pd.DataFrame(
        [(1, B), (1, B + 1), (1, -B), (1, B + 1), (2, 2), (2, B), (2, -B),
         (3, 2**63 - 1), (3, 2**63 - 2), (3, 2**63 - 3), (4, 2**53 + 1), (4, 1), (4, 1)],
        columns=["g", "x"],
    )  # fmt: skip
    db = load(strategy, first, "CREATE TABLE R (g BIGINT, x BIGINT);", {"R": rows}, DISTINCT)
    assert view_rows(db, "sums") == [(1, B + 1, (B + 1) / 3), (2, 2, 2 / 3)]
    for name, sql in DISTINCT.items():
        assert view_rows(db, name) == exact_rows(sql, {"R": rows}), name
    db.delete("R", {"g": [2, 1], "x": [2, B + 1]})
    rest = rows.drop(index=[4, 1])
    for name, sql in DISTINCT.items():
        assert view_rows(db, name) == exact_rows(sql, {"R": rest}), name


@pytest.mark.parametrize("read", [True, False], ids=["read", "unread"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_sum_distinct_beyond_bigint_rejects_the_batch(strategy, read):
    """2**62 + (2**62 + 1) came back as -2**63 + 1; now the batch is rejected and every
    view and table stays as it was, whether the view was read since its last batch (its
    result kept) or not.  A view created over such rows is refused."""
    db = Database("CREATE TABLE R (x BIGINT);")
    db.insert("R", {"x": [B]})
    sql = "SELECT SUM(DISTINCT x) AS s, COUNT(DISTINCT x) AS n FROM R"
    view = db.create_view("v", sql, strategy=strategy)
    count = db.create_view("n", "SELECT COUNT(*) AS n FROM R", strategy=strategy)
    if read:
        assert view.to_pandas().values.tolist() == [[B, 1]]
    with pytest.raises(BatchError, match=r"view 'v': SUM\(DISTINCT x\) overflows BIGINT"):
        db.insert("R", {"x": [B + 1]})
    assert view.to_pandas().values.tolist() == [[B, 1]]
    assert count.to_pandas().values.tolist() == [[1]] and len(db.table("R")) == 1
    db.insert("R", {"x": [B, -5]})  # a value already there adds nothing to the sum
    assert view.to_pandas().values.tolist() == [[B - 5, 2]]
    db.insert("R", {"x": [B + 1]})
    assert view.to_pandas().values.tolist() == [[2 * B - 4, 3]]
    with pytest.raises(BatchError, match="overflows BIGINT"):
        db.create_view("again", "SELECT SUM(DISTINCT x) AS s FROM R WHERE x > 0")
    assert "again" not in db.views


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_sum_over_the_groups_of_a_collapsed_view_beyond_bigint_rejects_the_batch(strategy):
    """With MIN(y) the engine groups by (g, y) and the view adds their SUMs up per g: two
    groups of 2**62 wrapped around to -2**63."""
    db = Database("CREATE TABLE R (g BIGINT, x BIGINT, y BIGINT);")
    db.insert("R", {"g": [1], "x": [B], "y": [1]})
    view = db.create_view(
        "v", "SELECT g, SUM(x) AS s, MIN(y) AS m FROM R GROUP BY g", strategy=strategy
    )
    with pytest.raises(BatchError, match="view 'v': an integer aggregate overflows BIGINT"):
        db.insert("R", {"g": [1], "x": [B], "y": [2]})
    assert view.to_pandas().values.tolist() == [[1, B, 1]] and len(db.table("R")) == 1
    db.insert("R", {"g": [1, 1], "x": [B, -B], "y": [2, 0]})
    assert view.to_pandas().values.tolist() == [[1, B, 0]]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT SUM(R.a * S.b) AS total FROM R, S WHERE R.s < S.s",
        "SELECT R.a FROM R WHERE R.a < (SELECT SUM(S.b) FROM S WHERE S.s < R.s)",
    ],
    ids=["join", "subquery"],
)
def test_sums_over_an_inequality_beyond_bigint_fail_the_read(sql):
    """Prefix sums: an inequality join and an inequality subquery sum on read.  Sums that
    leave int64 on the way and come back are exact; one beyond it read as wrapped around
    (2**62 * 2 as -2**63): now the read fails (the batch was accepted)."""
    db = Database("CREATE TABLE R (s VARCHAR, a BIGINT); CREATE TABLE S (s VARCHAR, b BIGINT);")
    view = db.create_view("v", sql)
    db.insert("R", {"s": ["a", "z"], "a": [1, 2]})
    db.insert("S", {"s": ["b", "c", "d"], "b": [B, B, -B]})
    tables = {"R": db.table("R"), "S": db.table("S")}
    assert_same_rows(view.to_pandas(), duckdb_rows(sql, tables))
    db.insert("S", {"s": ["e"], "b": [B]})
    with pytest.raises(RingmlError, match="view 'v': .*overflows BIGINT"):
        view.to_pandas()
    db.delete("S", {"s": ["e"], "b": [B]})
    assert_same_rows(view.to_pandas(), duckdb_rows(sql, tables))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT SUM(R.a * S.b) AS total FROM R, S WHERE R.s < S.s",
        "SELECT R.a FROM R WHERE R.a < (SELECT SUM(S.b) FROM S WHERE S.s < R.s)",
    ],
    ids=["join", "subquery"],
)
def test_a_subscribed_view_whose_diff_overflows_rejects_the_batch(sql):
    """A subscriber's diff reads the view with the batch: a sum it cannot read rejects the
    batch (every view and table as before, no callback) instead of failing after it."""
    db = Database("CREATE TABLE R (s VARCHAR, a BIGINT); CREATE TABLE S (s VARCHAR, b BIGINT);")
    view = db.create_view("v", sql)
    diffs: list = []
    view.subscribe(diffs.append)
    db.insert("R", {"s": ["a", "z"], "a": [1, 2]})
    db.insert("S", {"s": ["b", "c", "d"], "b": [B, B, -B]})
    seen, before = len(diffs), view.to_pandas()
    with pytest.raises(BatchError, match="view 'v': .*overflows BIGINT"):
        db.insert("S", {"s": ["e"], "b": [B]})
    assert len(diffs) == seen and len(db.table("S")) == 3
    pd.testing.assert_frame_equal(view.to_pandas(), before)
    db.insert("S", {"s": ["e"], "b": [-B]})
    tables = {"R": db.table("R"), "S": db.table("S")}
    assert_same_rows(view.to_pandas(), duckdb_rows(sql, tables))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_double_sum_and_avg_distinct_are_exactly_rounded(strategy):
    """Group 1 cancels (DuckDB's plain sum of the distinct values loses the 1.5, or part of
    it, depending on its hash order): ours is the exactly rounded sum.  Group 2 is exact in
    float64, as DuckDB's sum is."""
    rows = pd.DataFrame(
        {"g": [1, 1, 1, 1, 1, 2, 2, 2, 2], "x": [1e16, 1.0, -1e16, 1.0, 0.5, 0.5, 0.25, 0.5, -2.0]}
    )
    sql = "SELECT g, SUM(DISTINCT x) AS s, AVG(DISTINCT x) AS m FROM R GROUP BY g"
    db = load(strategy, True, "CREATE TABLE R (g BIGINT, x DOUBLE);", {"R": rows}, {"v": sql})
    ours = view_rows(db, "v")
    theirs = exact_rows(sql, {"R": rows})
    exact = math.fsum({1e16, 1.0, -1e16, 0.5})
    assert ours[0] == (1, exact, exact / 4)
    assert abs(ours[0][1] - exact) <= abs(theirs[0][1] - exact)
    assert ours[1] == theirs[1] == (2, -1.25, -1.25 / 3)


# ------------------------------------------------------------------ multiplicities
SCALED = {
    "total": "SELECT SUM(a) AS s, COUNT(*) AS n FROM T",
    "grouped": "SELECT g, SUM(a) AS s, AVG(a) AS m FROM T GROUP BY g",
    "joined": "SELECT R.g, SUM(R.a) AS s FROM R JOIN S ON R.b = S.b GROUP BY R.g",
    "product": "SELECT SUM(R.a * S.c) AS s FROM R JOIN S ON R.b = S.b",
}
SCALED_SCHEMA = """
CREATE TABLE T (g BIGINT, a BIGINT);
CREATE TABLE R (g BIGINT, a BIGINT, b BIGINT);
CREATE TABLE S (b BIGINT, c BIGINT);
"""


@pytest.mark.parametrize("first", [True, False], ids=["loaded", "streamed"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rows_times_their_multiplicity_may_leave_bigint_while_the_sum_does_not(strategy, first):
    """T holds 2**62 twice: the row times its multiplicity is 2**63, the SUM 2**62.  S holds
    (0, 1) twice: R's sum 2**62 at b = 0 times 2 is 2**63 before R's -2**62 at b = 1 joins
    in.  Those products overflowed (at create_view for every strategy, always for
    recompute); only a sum that leaves int64 is an error."""
    tables = {
        "T": pd.DataFrame({"g": [1, 1, 1], "a": [B, B, -B]}),
        "R": pd.DataFrame({"g": [1, 1], "a": [B, -B], "b": [0, 1]}),
        "S": pd.DataFrame({"b": [0, 0, 1], "c": [1, 1, 1]}),
    }
    db = load(strategy, first, SCALED_SCHEMA, tables, SCALED)
    assert view_rows(db, "total") == [(B, 3)]
    for name, sql in SCALED.items():
        assert view_rows(db, name) == exact_rows(sql, tables), name
    before = {name: view_rows(db, name) for name in SCALED}
    with pytest.raises(BatchError, match="overflow"):  # SUM(a) would be 2**63
        db.delete("T", {"g": [1], "a": [-B]})
    assert {name: view_rows(db, name) for name in SCALED} == before
    db.delete("T", {"g": [1], "a": [B]})
    db.delete("S", {"b": [0], "c": [1]})
    tables["T"] = tables["T"].iloc[1:]
    tables["S"] = tables["S"].iloc[1:]
    for name, sql in SCALED.items():
        assert view_rows(db, name) == exact_rows(sql, tables), name


# ------------------------------------------------------------------ strings with NUL
NUL_SCHEMA = """
CREATE TABLE R (s VARCHAR, t VARCHAR, a BIGINT);
CREATE TABLE S (s VARCHAR, t VARCHAR, b BIGINT);
"""
NUL_R = pd.DataFrame(
    {"s": ["a", "a\x00", "a\x00b", "b", "a", "", "a\x00"],
     "t": ["x", "x", "x\x00", "x", "x\x00", "x", "x\x00"],
     "a": [1, 2, 3, 4, 5, 6, 7]}
)  # fmt: skip
NUL_S = pd.DataFrame(
    {"s": ["a\x00", "a", "b\x00", "a\x00b", "a"],
     "t": ["x", "x\x00", "x", "x\x00", "x"],
     "b": [10, 20, 30, 40, 50]}
)  # fmt: skip
#: name -> (SQL, ORDER BY columns compared in sequence)
NUL_VIEWS = {
    "group": ("SELECT s, t, COUNT(*) AS n, SUM(a) AS total FROM R GROUP BY s, t", []),
    "join": ("SELECT R.a, S.b FROM R JOIN S ON R.s = S.s", []),
    "join2": ("SELECT R.a, S.b FROM R JOIN S ON R.s = S.s AND R.t = S.t", []),
    "distinct": (
        "SELECT t, COUNT(DISTINCT s) AS n, MIN(s) AS lo, MAX(s) AS hi FROM R GROUP BY t",
        [],
    ),
    "below": ("SELECT R.a FROM R WHERE R.a < (SELECT SUM(S.b) FROM S WHERE S.s < R.s)", []),
    "at_most": ("SELECT R.a FROM R WHERE 25 < (SELECT SUM(S.b) FROM S WHERE S.s <= R.s)", []),
    "keyed": ("SELECT R.a FROM R WHERE R.a * 5 < (SELECT SUM(S.b) FROM S WHERE S.s = R.s)", []),
    "keyed2": (
        "SELECT R.a FROM R WHERE R.a < (SELECT COUNT(*) FROM S WHERE S.s = R.s AND S.t = R.t) + 4",
        [],
    ),
    "member": ("SELECT R.a FROM R WHERE R.s IN (SELECT S.s FROM S)", []),
    "range": ("SELECT SUM(R.a * S.b) AS total FROM R, S WHERE R.s < S.s", []),
    "first": ("SELECT s, COUNT(*) AS n FROM R GROUP BY s ORDER BY s LIMIT 3", [0]),
    "last": ("SELECT s, t, a FROM R ORDER BY s DESC, t, a LIMIT 4", [0, 1, 2]),
}


def assert_nul_views(db: Database, tables: dict, what: str) -> None:
    for name, (sql, order) in NUL_VIEWS.items():
        ours, theirs = db.view(name).to_pandas(), duckdb_rows(sql, tables)
        assert_same_rows(ours, theirs, f"{what}: {name}")
        assert_same_order(ours, theirs, order, f"{what}: {name}")


@pytest.mark.parametrize("first", [True, False], ids=["loaded", "streamed"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strings_differing_by_a_nul_character_are_distinct_and_ordered(strategy, first):
    """pandas factorizes an array of strings as C strings, cut at the first NUL: "a",
    "a\\x00" and "a\\x00b" were one value in COUNT(DISTINCT), inequality subqueries,
    inequality joins, ORDER BY and two-column keys.  DuckDB orders "a" < "a\\x00"."""
    views = {name: sql for name, (sql, _) in NUL_VIEWS.items()}
    db = load(strategy, first, NUL_SCHEMA, {"R": NUL_R, "S": NUL_S}, views)
    assert_nul_views(db, {"R": NUL_R, "S": NUL_S}, "start")
    db.delete("R", NUL_R.iloc[[1, 6]])
    db.delete("S", NUL_S.iloc[[1]])
    tables = {"R": NUL_R.drop(index=[1, 6]), "S": NUL_S.drop(index=[1])}
    assert_nul_views(db, tables, "after deletes")


def test_the_semijoin_of_static_tables_keeps_rows_differing_by_a_nul_character():
    """The semijoin reduction of static tables matched two-column keys through
    MultiIndexes, whose levels factorize strings as C strings: no row of R was kept."""
    sql = "SELECT R.a, S.b FROM R JOIN S ON R.s = S.s AND R.t = S.t"
    db = Database(NUL_SCHEMA)
    db.insert("R", NUL_R)
    db.insert("S", NUL_S.iloc[[0, 1]])  # ("a\x00", "x") and ("a", "x\x00")
    view = db.create_view("v", sql, static=["R", "S"])
    assert_same_rows(view.to_pandas(), duckdb_rows(sql, {"R": NUL_R, "S": NUL_S.iloc[[0, 1]]}))
    assert sorted(view.to_pandas()["a"]) == [2, 5]


def test_order_by_limit_over_many_groups_ranks_strings_with_nul_characters():
    """Beyond 4 * LIMIT + 64 groups a read keeps the candidates of the first ORDER BY key
    before sorting (another path through the same ranks)."""
    keys = [f"k{i:03d}" for i in range(100)] + ["a", "a\x00", "a\x00\x00"]
    rows = pd.DataFrame({"s": keys, "t": ["x"] * len(keys), "a": range(len(keys))})
    db = Database(NUL_SCHEMA)
    db.insert("R", rows)
    for sql in (
        "SELECT s, SUM(a) AS total FROM R GROUP BY s ORDER BY s LIMIT 2",
        "SELECT s, SUM(a) AS total FROM R GROUP BY s ORDER BY s DESC LIMIT 102",
    ):
        ours, theirs = db.query(sql), duckdb_rows(sql, {"R": rows})
        assert_same_rows(ours, theirs, sql)
        assert_same_order(ours, theirs, [0], sql)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_keyed_table_update_to_a_string_with_a_nul_character(strategy):
    """The update's two rows of key 1 ("a" out, "a\\x00" in) were one row to the table
    (it kept "a") while the view took the change."""
    db = Database("CREATE TABLE K (k BIGINT PRIMARY KEY, s VARCHAR);")
    db.insert("K", {"k": [1], "s": ["a"]})
    view = db.create_view("v", "SELECT s, COUNT(*) AS n FROM K GROUP BY s", strategy=strategy)
    diffs = []
    view.subscribe(diffs.append)
    db.update("K", {"k": [1], "s": ["a"]}, {"k": [1], "s": ["a\x00"]})
    assert db.table("K").values.tolist() == [[1, "a\x00"]]
    assert view.to_pandas().values.tolist() == [["a\x00", 1]]
    assert sorted(diffs[0].values.tolist()) == [["a", 1, -1], ["a\x00", 1, 1]]
    db.delete("K", {"k": [1], "s": ["a\x00"]})
    assert not len(db.table("K")) and not len(view.to_pandas())


@pytest.mark.parametrize("tuple_cells", [0, 10**6], ids=["coded", "tuples"])
def test_row_changes_tell_strings_with_nul_characters_apart(monkeypatch, tuple_cells):
    monkeypatch.setattr(sql_output, "ROW_TUPLE_CELLS", tuple_cells)
    before = {"s": np.array(["a", "a\x00b"], dtype=object), "n": np.array([1, 2])}
    after = {"s": np.array(["a\x00", "a\x00b"], dtype=object), "n": np.array([1, 2])}
    diff = sql_output.row_changes(before, after)
    assert diff.values.tolist() == [["a", 1, -1], ["a\x00", 1, 1]]


def test_factorize_finds_strings_equal_exactly_when_python_does():
    values = np.array(["a", "a\x00", "a\x00b", "a", "", "a\x00"], dtype=object)
    codes, uniques = factorize(values)
    assert codes.tolist() == [0, 1, 2, 0, 3, 1] and uniques.tolist() == ["a", "a\x00", "a\x00b", ""]
    codes, uniques = factorize(values, sort=True)
    assert uniques.tolist() == sorted(set(values)) and codes.tolist() == [1, 2, 3, 1, 0, 2]
    assert factorize(np.array(["b", None, "a"], dtype=object))[0].tolist() == [0, -1, 1]
    other = np.array(["x", "x", "x", "x\x00", "x", "x"], dtype=object)
    assert factorize_rows([values, other]).tolist() == [0, 1, 2, 3, 4, 1]


def test_exactly_rounded_means_of_integer_sums():
    sums = np.array([2, 2**63 - 2, 2**53 + 1, -7], dtype=np.int64)
    counts = np.array([3, 1, 3, 2])
    wide = np.array([3 * (2**63) - 6, 2**64 + 1], dtype=object)
    for s, c in [(sums, counts), (wide, np.array([3, 2]))]:
        expected = [float(Fraction(int(a), int(b))) for a, b in zip(s, c, strict=True)]
        assert sql_output.mean(s, c).tolist() == expected
