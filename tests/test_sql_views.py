"""The Database/View API: reading views as pandas and Arrow, subscriptions, updates, Arrow
input, views created over loaded tables, dropping views."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringml import UpdateBatch
from ringml.errors import BatchError
from ringml.sql import Database

SCHEMA = """
CREATE TABLE Orders (id INTEGER, customer VARCHAR, placed DATE);
CREATE TABLE Lines (id INTEGER, price DOUBLE, qty INTEGER);
"""
REVENUE = """
SELECT o.customer, SUM(l.price * l.qty) AS revenue, AVG(CASE WHEN l.qty > 1 THEN l.price END)
       AS bulk_price
FROM Orders o JOIN Lines l ON o.id = l.id GROUP BY o.customer ORDER BY o.customer
"""


def database() -> Database:
    db = Database(SCHEMA)
    db.insert(
        "Orders",
        pa.table({"id": [1, 2, 3], "customer": ["ann", "bo", "ann"],
                  "placed": pa.array([19000, 19001, 19002], pa.date32())}),
    )  # fmt: skip
    db.insert("Lines", {"id": [1, 1, 2, 3], "price": [2.0, 3.0, 5.0, 1.5], "qty": [1, 2, 1, 4]})
    return db


def test_views_read_as_pandas_and_arrow_with_nulls():
    db = database()
    view = db.create_view("revenue", REVENUE)
    frame = view.to_pandas()
    assert frame["customer"].tolist() == ["ann", "bo"]
    assert frame["revenue"].tolist() == [2.0 + 6.0 + 6.0, 5.0]
    assert frame["bulk_price"].tolist()[0] == 2.25 and pd.isna(frame["bulk_price"].iloc[1])
    table = view.to_arrow()
    assert table.column_names == ["customer", "revenue", "bulk_price"]
    assert table.column("bulk_price").null_count == 1
    assert view.columns == ("customer", "revenue", "bulk_price")


def test_updates_subscriptions_and_cancel():
    db = database()
    view = db.create_view("revenue", REVENUE)
    diffs = []
    subscription = view.subscribe(diffs.append)
    db.update("Lines", {"id": [2], "price": [5.0], "qty": [1]},
              {"id": [2], "price": [5.0], "qty": [3]})  # fmt: skip
    (diff,) = diffs  # bo's group: the old row (no bulk line: NULL) left, the new one came
    assert diff.fillna(-1).values.tolist() == [["bo", 5.0, -1, -1], ["bo", 15.0, 5.0, 1]]
    subscription.cancel()
    db.delete("Orders", {"id": [2], "customer": ["bo"], "placed": ["2022-01-09"]})
    assert len(diffs) == 1 and view.to_pandas()["customer"].tolist() == ["ann"]
    assert db.table("Orders")["id"].tolist() == [1, 3]


def test_an_error_that_is_not_a_rejection_changes_no_view_and_no_table(monkeypatch):
    """A view failing with any exception (a bug, an interrupt) while a batch propagates
    leaves the views fed before it, and the tables, as they were."""
    db = database()
    first = db.create_view("revenue", REVENUE)
    second = db.create_view("quantities", "SELECT id, SUM(qty) AS qty FROM Lines GROUP BY id")
    before = (first.to_pandas(), second.to_pandas(), db.table("Lines"))

    def failing(batches):
        raise RuntimeError("boom")

    monkeypatch.setattr(second.maintainer, "apply", failing)
    with pytest.raises(RuntimeError, match="boom"):
        db.insert("Lines", {"id": [2], "price": [4.0], "qty": [2]})
    monkeypatch.undo()
    after = (first.to_pandas(), second.to_pandas(), db.table("Lines"))
    for now, then in zip(after, before, strict=True):
        pd.testing.assert_frame_equal(now, then)
    db.insert("Lines", {"id": [2], "price": [4.0], "qty": [2]})
    assert first.to_pandas()["revenue"].tolist() == [14.0, 13.0]


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "higher_order", "recompute"])
def test_a_batch_rejected_for_overflow_leaves_every_aggregate_of_the_view(strategy):
    """SUM overflowing BIGINT rejects the batch; COUNT, in the same product payload, used to
    keep the rejected row (its component was added before SUM's refused)."""
    db = Database("CREATE TABLE T (a BIGINT, c BIGINT);")
    db.insert("T", {"a": [1], "c": [2**62]})
    view = db.create_view(
        "v", "SELECT a, COUNT(*) AS n, SUM(c) AS s FROM T GROUP BY a", strategy=strategy
    )
    with pytest.raises(BatchError):
        db.insert("T", {"a": [1], "c": [2**62]})
    assert view.to_pandas().values.tolist() == [[1, 1, 2**62]]
    db.update("T", {"a": [1], "c": [2**62]}, {"a": [1], "c": [5]})
    assert view.to_pandas().values.tolist() == [[1, 1, 5]]


def test_empty_batches_of_any_column_type_change_nothing():
    db = Database("CREATE TABLE R (a BIGINT, s VARCHAR, d DATE, f BOOLEAN, x DOUBLE);")
    view = db.create_view("v", "SELECT s, COUNT(*) AS n FROM R GROUP BY s")
    db.insert("R", {"a": [1], "s": ["x"], "d": ["2020-01-01"], "f": [True], "x": [1.5]})
    db.insert("R", {"a": [], "s": [], "d": [], "f": [], "x": []})
    db.delete("R", {"a": [], "s": [], "d": [], "f": [], "x": []})
    assert view.to_pandas().values.tolist() == [["x", 1]] and len(db.table("R")) == 1


def test_bigint_columns_mixing_ints_and_floats_keep_every_integer_exact():
    """[2**53 + 1, 2.0] used to become float64 on its way to BIGINT (2**53 + 1 -> 2**53)."""
    db = Database("CREATE TABLE R (a BIGINT);")
    view = db.create_view("v", "SELECT a, COUNT(*) AS n FROM R GROUP BY a ORDER BY a")
    db.insert("R", {"a": [2**53 + 1, 2.0]})
    db.insert("R", {"a": np.array([2**62 + 1, 3.0], dtype=object)})
    assert view.to_pandas()["a"].tolist() == [2, 3, 2**53 + 1, 2**62 + 1]
    db.delete("R", {"a": [2**53 + 1, 2**62 + 1]})
    assert view.to_pandas()["a"].tolist() == [2, 3]
    with pytest.raises(BatchError, match="not an integer"):
        db.insert("R", {"a": [2**53 + 1, 2.5]})


def test_a_view_created_after_the_data_starts_from_it_and_views_can_be_dropped():
    db = database()
    db.apply(
        [
            UpdateBatch.inserts("Lines", pd.DataFrame({"id": [3], "price": [1.5], "qty": [4]})),
            UpdateBatch.deletes("Lines", pd.DataFrame({"id": [1], "price": [2.0], "qty": [1]})),
        ]
    )
    count = db.create_view("n", "SELECT l.id, COUNT(*) AS n FROM Lines l GROUP BY l.id")
    assert sorted(count.to_pandas().values.tolist()) == [[1, 1], [2, 1], [3, 2]]
    db.drop_view("n")
    assert "n" not in db.views
    db.insert("Lines", {"id": [9], "price": [1.0], "qty": [1]})  # no view to feed
    assert len(db.table("Lines")) == 5


# ------------------------------------------------------------------ row_changes
_cell = {
    "s": st.sampled_from(["a", "b", "", None]),
    "x": st.sampled_from([0.0, -0.0, 1.5, -2.25, float("nan")]),
    "i": st.integers(-(2**62), 2**62) | st.integers(0, 2),
    "d": st.sampled_from(["2020-01-01", "2021-06-30", None]),
}


def _frame(rows: list[dict], nan_free_i: bool) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "s": pd.Series([r["s"] for r in rows], dtype=object),
            "x": pd.Series([r["x"] for r in rows], dtype=np.float64),
            "i": pd.Series([r["i"] for r in rows], dtype=np.int64),
            "d": pd.to_datetime(pd.Series([r["d"] for r in rows], dtype=object)).astype(
                "datetime64[ns]"
            ),
        }
    )
    if not nan_free_i and len(frame):  # an aggregate that is NULL after: int before, float
        frame["i"] = frame["i"].astype(np.float64)
        frame.loc[0, "i"] = np.nan
    return frame


def _normal_row(row) -> tuple:
    out = []
    for v in row:
        if v is None or v is pd.NaT or (isinstance(v, float) and np.isnan(v)):
            out.append(None)
        elif isinstance(v, float):
            out.append(v + 0.0)  # -0.0 equals 0.0
        else:
            out.append(v)
    return tuple(out)


@pytest.mark.parametrize("tuple_cells", [0, 10**6], ids=["coded", "tuples"])
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.fixed_dictionaries(_cell), max_size=8),
    st.lists(st.fixed_dictionaries(_cell), max_size=8),
    st.integers(0, 8),
    st.booleans(),
)
def test_row_changes_is_the_signed_multiset_difference(
    tuple_cells, before_rows, after_rows, kept, nan_free
):
    """Rows equal under SQL grouping (NULLs together, -0.0 = 0.0) cancel; the rest come once
    with their net count, in order of first appearance, in the columns' dtypes where the
    values allow (an int column stays int unless a NULL came, then it is float64 as in the
    view's rows, while integers beyond 2**53 still tell rows apart).  Both ways of grouping
    the rows: coded columns and Python tuples."""
    from ringml.sql import output
    from ringml.sql.output import row_changes

    before = _frame(before_rows, True)
    after = pd.concat([_frame(after_rows, nan_free), before.iloc[:kept]], ignore_index=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(output, "ROW_TUPLE_CELLS", tuple_cells)
        got = row_changes(before, after)
    assert list(got.columns) == [*before.columns, "multiplicity"]
    expected = Counter(_normal_row(r) for r in after.itertuples(index=False, name=None))
    expected.subtract(_normal_row(r) for r in before.itertuples(index=False, name=None))
    expected = Counter({k: v for k, v in expected.items() if v})
    assert len(got) == len(expected)  # each changed row once, distinct integers apart
    assert got["multiplicity"].dtype == np.int64
    for column in ("s", "x", "d"):
        assert got[column].dtype == before[column].dtype
    exact = got["i"].dtype == np.int64
    assert exact or got["i"].isna().any()

    def shown(row):  # a row as the diff can show it (float64 where a NULL came)
        return row if exact else (*row[:2], None if row[2] is None else float(row[2]), row[3])

    rows = [_normal_row(r[:-1]) for r in got.itertuples(index=False, name=None)]
    got_counter = Counter()
    for row, m in zip(rows, got["multiplicity"].tolist(), strict=True):
        got_counter[row] += m
    projected = Counter()
    for row, m in expected.items():
        projected[shown(row)] += m
    assert got_counter == projected
    if exact:
        appearance = []
        for r in pd.concat([before, after]).itertuples(index=False, name=None):
            if _normal_row(r) not in appearance:
                appearance.append(_normal_row(r))
        assert rows == [r for r in appearance if r in expected]


@pytest.mark.parametrize("tuple_cells", [0, 10**6], ids=["coded", "tuples"])
def test_row_changes_keeps_integers_beyond_2_53_apart_when_a_null_comes(monkeypatch, tuple_cells):
    """An int column that gets a NULL (a SUM of no values) is float64 after; rows whose
    integers differ beyond float64's precision must not cancel each other."""
    from ringml.sql import output
    from ringml.sql.output import row_changes

    monkeypatch.setattr(output, "ROW_TUPLE_CELLS", tuple_cells)

    before = pd.DataFrame({"g": ["a", "b"], "s": np.array([2**53, 2**53 + 1], dtype=np.int64)})
    after = pd.DataFrame({"g": ["a", "b", "c"], "s": [float(2**53), float(2**53), np.nan]})
    got = row_changes(before, after)
    # a's row is unchanged (2**53 == 2.0**53); b's changed (2**53 + 1 -> 2.0**53); c came
    assert got["g"].tolist() == ["b", "b", "c"]
    assert got["multiplicity"].tolist() == [-1, 1, 1]
