"""DBToaster's workloads as datasets: the order-book adaptor on hand-written messages, the
generated feed against the book rebuilt independently from its messages (pandas), and the
TPC-H streams (deletes only of present rows, the live-orders window, the typed tables)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ringml.datasets import (
    FINANCE_COLUMNS,
    final_state,
    order_book_messages,
    order_book_stream,
    order_book_updates,
    tpch_stream,
    tpch_tables,
)


def messages(*rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["t", "id", "action", "volume", "price"])


def test_adaptor_turns_messages_into_bids_and_asks_inserts_and_deletes():
    m = messages(
        (1, 1, "B", 300, 100),
        (2, 2, "S", 200, 120),
        (3, 1, "E", 100, 0),  # partial execution: 300 -> 200, same price
        (4, 9, "D", 50, 10),  # unknown order: nothing
        (5, 2, "X", 10, 0),  # a type the adaptor ignores
        (6, 2, "E", 200, 0),  # the whole rest executed: deleted, not re-inserted
        (7, 1, "D", 200, 100),  # cancelled
        (8, 3, "B", 100, 99),
        (9, 3, "F", 100, 99),  # filled
    )
    u = order_book_updates(m, brokers=4, deterministic=True)
    got = [
        (r.relation, r.sign, r.message, r.t, r.id, r.broker_id, r.price, r.volume)
        for r in u.itertuples()
    ]
    assert got == [
        ("bids", 1, 0, 1.0, 1, 1, 100.0, 300.0),
        ("asks", 1, 1, 2.0, 2, 2, 120.0, 200.0),
        ("bids", -1, 2, 1.0, 1, 1, 100.0, 300.0),
        ("bids", 1, 2, 1.0, 1, 1, 100.0, 200.0),
        ("asks", -1, 5, 2.0, 2, 2, 120.0, 200.0),
        ("bids", -1, 6, 1.0, 1, 1, 100.0, 200.0),
        ("bids", 1, 7, 8.0, 3, 3, 99.0, 100.0),
        ("bids", -1, 8, 8.0, 3, 3, 99.0, 100.0),
    ]
    refreshes = order_book_stream(u, batch_size=4, messages=len(m))
    assert len(refreshes) == 3  # messages 0-3, 4-7, 8
    assert [[(b.relation, len(b)) for b in r.batches] for r in refreshes] == [
        [("bids", 3), ("asks", 1)],
        [("bids", 2), ("asks", 1)],
        [("bids", 1)],
    ]
    assert list(refreshes[0].batches[0].rows.columns) == list(FINANCE_COLUMNS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_feed_ends_in_the_book_its_messages_describe(seed):
    m = order_book_messages(5000, seed=seed, book_size=300)
    assert set(m.action) == {"B", "S", "E", "F", "D"}
    u = order_book_updates(m, brokers=10, seed=seed)
    # independent oracle: per order, the volume left after its executions, unless ended
    adds = m[m.action.isin(["B", "S"])].set_index("id")
    executed = m[m.action == "E"].groupby("id").volume.sum()
    ended = set(m[m.action.isin(["F", "D"])].id)
    left = adds.volume.sub(executed, fill_value=0).loc[adds.index]
    live = adds[(left > 0) & ~adds.index.isin(list(ended))]
    assert len(live) <= 300
    stream = [b for r in order_book_stream(u, batch_size=50) for b in r.batches]
    state = final_state(stream)
    for relation, side in (("bids", "B"), ("asks", "S")):
        expected = live[live.action == side]
        got = state[relation].set_index("id").sort_index()
        assert list(got.index) == sorted(expected.index)
        np.testing.assert_array_equal(got.volume, left.loc[got.index])
        np.testing.assert_array_equal(got.price, expected.price.loc[got.index])
        np.testing.assert_array_equal(got.t, expected.t.loc[got.index])
        assert got.broker_id.between(0, 9).all()
    # every delete is of a tuple present at that point, in stream order
    count: dict[tuple, int] = {}
    for batch in stream:
        for row, sign in zip(batch.rows.itertuples(index=False), batch.multiplicity, strict=True):
            key = (batch.relation, *row)
            count[key] = count.get(key, 0) + int(sign)
            assert count[key] in (0, 1), key
    assert (u.sign < 0).mean() > 0.3  # a feed with deletes


def small_tpch(n_orders: int = 500) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(3)
    return {
        "customer": pd.DataFrame({"c_custkey": np.arange(50), "c_acctbal": rng.random(50)}),
        "orders": pd.DataFrame(
            {"o_orderkey": np.arange(n_orders), "o_custkey": rng.integers(0, 50, n_orders)}
        ),
    }


def test_tpch_stream_keeps_at_most_the_live_orders_and_deletes_present_rows():
    tables = small_tpch()
    shuffled, batches = tpch_stream(
        tables, ["customer", "orders"], batch_size=40, seed=5, live_orders=100
    )
    assert {t: len(f) for t, f in shuffled.items()} == {"customer": 50, "orders": 500}
    live: dict[int, int] = {}
    for batch in batches:
        if batch.relation == "customer":
            assert (batch.multiplicity == 1).all()
            continue
        for key, sign in zip(batch.rows.o_orderkey, batch.multiplicity, strict=True):
            live[key] = live.get(key, 0) + int(sign)
            assert live[key] in (0, 1)
        assert sum(live.values()) <= 100
        # the rows are the shuffled frame's rows named by row_ids
        pd.testing.assert_frame_equal(
            batch.rows, shuffled["orders"].iloc[batch.row_ids].reset_index(drop=True)
        )
    assert sum(live.values()) == 100
    with pytest.raises(ValueError, match="live_orders"):
        tpch_stream(tables, ["customer"], live_orders=10)


def test_tpch_stream_with_a_delete_fraction_is_the_shuffled_round_robin_stream():
    tables = small_tpch()
    shuffled, batches = tpch_stream(
        tables, ["orders", "customer"], batch_size=20, delete_fraction=0.2, seed=1
    )
    deletes = sum(b.n_deletes for b in batches)
    total = sum(len(b) for b in batches)
    assert abs(deletes / total - 0.2) < 0.01
    assert [b.relation for b in batches[:4]] == ["orders", "customer", "orders", "customer"]
    state = final_state(batches)
    assert len(state["orders"]) + len(state["customer"]) == total - 2 * deletes


def test_tpch_tables_are_typed_frames():
    frames = tpch_tables(0.01, tables=["nation", "orders"])
    orders = frames["orders"]
    assert orders.o_orderkey.dtype == np.int64
    assert orders.o_totalprice.dtype == np.float64
    assert orders.o_orderdate.dtype == "datetime64[ns]"
    assert isinstance(orders.o_orderstatus.iloc[0], str)
    assert len(frames["nation"]) == 25
    with pytest.raises(ValueError, match="unknown TPC-H tables"):
        tpch_tables(0.01, tables=["nations"])
