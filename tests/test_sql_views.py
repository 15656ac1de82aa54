"""The Database/View API: reading views as pandas and Arrow, subscriptions, updates, Arrow
input, views created over loaded tables, dropping views."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from ringml import UpdateBatch
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
