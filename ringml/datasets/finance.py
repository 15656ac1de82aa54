"""The finance order-book feed of DBToaster's experiments (VLDB 2012, §7), synthetic.

DBToaster replays an order-book message trace (one day of MSFT) through its ``orderbook``
adaptor (``StandardAdaptors.ml`` in DBToaster): each message ``(t, id, action, volume,
price)`` becomes inserts and deletes of the tables ``Bids`` and ``Asks`` with columns
``(t, id, broker_id, price, volume)``:

* ``B`` (a new bid) inserts the order into Bids, ``S`` (a new ask) into Asks, with a
  broker id drawn uniformly from ``0..brokers-1`` (or ``id mod brokers``);
* ``E`` (a partial execution) of a live order deletes its tuple and, unless the remaining
  volume is 0, inserts it again with ``volume - message volume`` and ``price - message
  price`` (executions carry price 0 here, so the price stays), same t, id and broker;
* ``F`` (filled) and ``D`` (deleted, i.e. cancelled) delete the order's tuple;
* a message for an order not in the book changes nothing.

The trace itself is not public; :func:`order_book_messages` generates one of the same form:
a mid price that random-walks by ticks, bids below and asks above it (integer prices in
1/10000 dollars, as the trace's), volumes in round lots, a book that fills up to half of
``book_size`` live orders, then grows to at most ``book_size`` and turns over (new orders,
executions, fills and cancellations at fixed rates).  :func:`order_book_updates` is the adaptor;
:func:`order_book_stream` cuts the updates into refreshes of ``batch_size`` messages.
Both walk the messages in order (the book is state), one Python step per message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .streams import StreamBatch

__all__ = [
    "FINANCE_COLUMNS",
    "OrderBookRefresh",
    "order_book_messages",
    "order_book_stream",
    "order_book_updates",
]

#: the columns of ``bids`` and ``asks`` (``ringml.sql.dbtoaster_queries.FINANCE_SCHEMA``)
FINANCE_COLUMNS = ("t", "id", "broker_id", "price", "volume")
#: relative rates of the messages once the book is full: new bids, new asks, executions,
#: fills, cancellations
MESSAGE_RATES = {"B": 0.25, "S": 0.25, "E": 0.2, "F": 0.1, "D": 0.2}


def order_book_messages(
    n: int,
    seed: int = 0,
    book_size: int = 2000,
    mid_price: int = 250_000,
    tick: int = 100,
    spread_ticks: float = 20.0,
) -> pd.DataFrame:
    """``n`` order-book messages ``(t, id, action, volume, price)``, in time order.

    Orders are added (``B``/``S``) until about ``book_size`` are live, then messages
    follow :data:`MESSAGE_RATES`: executions take part of a live order's volume (a lot
    count up to what is left; price 0), fills and cancellations end one (carrying its
    volume and price).  Prices are multiples of ``tick`` at a geometric distance from the
    mid price (mean ``spread_ticks`` ticks); volumes are 100 to 5000 in lots of 100.
    """
    if n < 0 or book_size < 1:
        raise ValueError("n must be >= 0 and book_size >= 1")
    rng = np.random.default_rng(seed)
    actions = np.array(list(MESSAGE_RATES))
    rates = np.array(list(MESSAGE_RATES.values()))
    drawn = rng.choice(actions, size=n, p=rates / rates.sum())
    distance = rng.geometric(1.0 / spread_ticks, size=n) * tick
    lots = rng.integers(1, 51, size=n)
    walk = np.cumsum(rng.choice([-tick, 0, tick], size=n, p=[0.05, 0.9, 0.05]))
    picks = rng.random(n)  # which live order a message names
    shares = rng.random(n)  # how much of it an execution takes
    live: list[int] = []  # ids of live orders
    book: dict[int, list] = {}  # id -> [side, volume, price]
    out_id = np.zeros(n, dtype=np.int64)
    out_action = np.empty(n, dtype=object)
    out_volume = np.zeros(n, dtype=np.float64)
    out_price = np.zeros(n, dtype=np.float64)
    next_id = 1
    for i in range(n):
        action = drawn[i]
        if len(live) < book_size // 2 or not live:  # filling the book
            action = "B" if action in ("B", "E", "F") else "S"
        elif len(live) >= book_size and action in ("B", "S"):  # full: turn over
            action = "D"
        if action in ("B", "S"):
            mid = mid_price + walk[i]
            price = mid - distance[i] if action == "B" else mid + distance[i]
            volume = 100 * lots[i]
            book[next_id] = [action, volume, price]
            live.append(next_id)
            out_id[i], out_volume[i], out_price[i] = next_id, volume, price
            next_id += 1
        else:
            j = int(picks[i] * len(live))
            order = live[j]
            side, volume, price = book[order]
            out_id[i] = order
            if action == "E" and volume > 100:
                executed = 100 * (1 + int(shares[i] * (volume // 100 - 1)))
                book[order][1] = volume - executed
                out_volume[i], out_price[i] = executed, 0.0
            else:
                if action == "E":  # the whole rest executed
                    out_volume[i], out_price[i] = volume, 0.0
                else:
                    out_volume[i], out_price[i] = volume, price
                live[j] = live[-1]
                live.pop()
                del book[order]
        out_action[i] = action
    return pd.DataFrame(
        {
            "t": np.arange(1, n + 1, dtype=np.float64),
            "id": out_id,
            "action": out_action,
            "volume": out_volume,
            "price": out_price,
        }
    )


def order_book_updates(
    messages: pd.DataFrame, brokers: int = 10, seed: int = 0, deterministic: bool = False
) -> pd.DataFrame:
    """DBToaster's orderbook adaptor: the inserts and deletes of ``bids``/``asks`` the
    messages make, in order, as a frame ``relation, sign, message, t, id, broker_id,
    price, volume`` (``message``: the position of the message that made the update)."""
    if brokers < 1:
        raise ValueError("brokers must be >= 1")
    rng = np.random.default_rng(seed)
    t = messages["t"].to_numpy(np.float64)
    ids = messages["id"].to_numpy(np.int64)
    actions = messages["action"].to_numpy(object)
    volumes = messages["volume"].to_numpy(np.float64)
    prices = messages["price"].to_numpy(np.float64)
    draws = rng.integers(0, brokers, size=len(messages))
    book: dict[int, tuple[str, tuple]] = {}  # id -> (relation, (t, id, broker, price, volume))
    out: list[tuple] = []
    for i in range(len(messages)):
        action, order = actions[i], int(ids[i])
        if action in ("B", "S"):
            broker = order % brokers if deterministic else int(draws[i])
            row = (t[i], order, broker, prices[i], volumes[i])
            relation = "bids" if action == "B" else "asks"
            book[order] = (relation, row)
            out.append((relation, 1, i, *row))
            continue
        if order not in book or action not in ("E", "F", "D"):
            continue  # unknown order, or a message type the adaptor ignores
        relation, old = book[order]
        out.append((relation, -1, i, *old))
        if action == "E":
            volume, price = old[4] - volumes[i], old[3] - prices[i]
            if volume != 0:
                new = (old[0], old[1], old[2], price, volume)
                book[order] = (relation, new)
                out.append((relation, 1, i, *new))
                continue
        del book[order]
    frame = pd.DataFrame(out, columns=["relation", "sign", "message", *FINANCE_COLUMNS])
    return frame.astype(
        {"sign": np.int64, "message": np.int64, "t": np.float64, "id": np.int64,
         "broker_id": np.int64, "price": np.float64, "volume": np.float64}
    )  # fmt: skip


@dataclass(frozen=True, eq=False)
class OrderBookRefresh:
    """The updates of ``batch_size`` consecutive messages: one batch per table touched."""

    batches: tuple[StreamBatch, ...]

    def __len__(self) -> int:
        return sum(len(b) for b in self.batches)


def order_book_stream(
    updates: pd.DataFrame, batch_size: int = 100, messages: int | None = None
) -> list[OrderBookRefresh]:
    """Cut :func:`order_book_updates` into refreshes of ``batch_size`` messages (the
    last may be shorter; ``messages``: how many the trace had, default the last one with
    an update + 1); a refresh holds per table the updates in message order, ``row_ids``
    their positions in ``updates``.  Messages that change nothing still count."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    total = int(updates["message"].max()) + 1 if messages is None and len(updates) else 0
    total = total if messages is None else messages
    windows = updates["message"].to_numpy() // batch_size
    n_windows = (total + batch_size - 1) // batch_size
    signs = updates["sign"].to_numpy(np.int64)
    columns = {c: updates[c].to_numpy() for c in FINANCE_COLUMNS}
    relation = updates["relation"].to_numpy()
    per_table = {}
    for table in ("bids", "asks"):
        rows = np.flatnonzero(relation == table)
        per_table[table] = (rows, np.searchsorted(windows[rows], np.arange(n_windows + 1)))
    refreshes = []
    for w in range(n_windows):
        batches = []
        for table, (rows, starts) in per_table.items():
            mine = rows[starts[w] : starts[w + 1]]
            if len(mine):
                frame = pd.DataFrame({c: v[mine] for c, v in columns.items()})
                batches.append(StreamBatch(table, frame, signs[mine], mine.astype(np.int64)))
        refreshes.append(OrderBookRefresh(tuple(batches)))
    return refreshes
