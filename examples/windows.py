"""Windows over a stream table: ViewDF's packet-loss feed S(ts, src, dest, loss).

One stream, four consumers, fed by one WindowedStream:

* a Maintainer keeping SUM(loss) and COUNT(*) per (src, dest) over the last 10 minutes;
* a MinMaxView keeping the exact MAX(loss) per (src, dest) over the same window (a deleted
  maximum falls back to the next one);
* ViewDF's View2 pattern view: pairs with at least four consecutive minutes of loss > 10;
* a SQL view over a 5-minute window, in a StreamDatabase of its own.

Events arrive out of order within a 30-second lateness; later ones are dead-lettered.
After every minute each result is checked against pandas over the rows inside its window.
Run: ``python examples/windows.py``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from ringml.rings.scalar import IntegerRing, ProductRing, RealRing

from ringml import Maintainer, Query
from ringml.sql import StreamDatabase
from ringml.windows import MinMaxView, PatternView, StreamTable, WindowedStream

rng = np.random.default_rng(7)
PAIRS = [("a", "b"), ("b", "c"), ("c", "d")]
START = pd.Timestamp("2026-01-01 09:00")


def minute(i: int) -> pd.DataFrame:
    """One measurement per pair in minute ``i``, a few seconds out of order."""
    seconds = rng.uniform(0, 59, len(PAIRS))
    loss = np.where(rng.random(len(PAIRS)) < 0.7, rng.integers(11, 40, 3), rng.integers(0, 11, 3))
    return pd.DataFrame(
        {
            "ts": START + pd.to_timedelta(i * 60 + seconds, unit="s"),
            "src": [p[0] for p in PAIRS],
            "dest": [p[1] for p in PAIRS],
            "loss": loss.astype(float),
        }
    ).sample(frac=1, random_state=i)


ring = ProductRing(RealRing(["loss"]), IntegerRing(), names=("sum", "count"))
totals = Maintainer(Query({"S": ["src", "dest", "loss"]}, ring, free=["src", "dest"]))
maxima = MinMaxView("S", values=["loss"], by=["src", "dest"])


def red(new, prev):
    return new["loss"] > 10


view2 = PatternView(
    "S",
    by=["src", "dest"],
    pattern="a b c d+",
    where={"a": red, "b": red, "c": red, "d": red, "d[i]": red},
    sums=["loss"],
)
stream = WindowedStream(
    [totals, maxima, view2],
    {"S": StreamTable("ts", partition="1 MINUTE", window="RANGE 10 MINUTES", origin=START)},
    lateness="30s",
    late="dead_letter",
)

sdb = StreamDatabase(lateness="30s", late="dead_letter")
sdb.create_stream_table(
    "CREATE TABLE S (ts TIMESTAMP, src TEXT, dest TEXT, loss DOUBLE)",
    time_column="ts",
    partition="1 MINUTE",
    origin=START,
)
recent = sdb.create_view(
    "recent",
    "SELECT src, COUNT(*) AS n, MAX(loss) AS worst FROM S WHERE loss > 10 GROUP BY src",
    window="RANGE 5 MINUTES",
)

rows = []
for i in range(30):
    batch = minute(i)
    if i == 20:  # a straggler from minute 2: far behind the watermark
        batch = pd.concat([batch, minute(2).iloc[:1]], ignore_index=True)
    # the rows behind the watermark before the batch (-inf before the first event) are late
    late = (batch["ts"] < stream.watermark).to_numpy() if i else np.zeros(len(batch), bool)
    stream.insert("S", batch)
    sdb.insert("S", batch)
    rows.append(batch[~late])
    # check every consumer against pandas over the rows inside its window
    everything = pd.concat(rows, ignore_index=True)
    watermark = stream.watermark
    end = everything["ts"].dt.floor("1min") + pd.Timedelta(minutes=1)
    window = everything[end + pd.Timedelta(minutes=10) > watermark]
    expected = window.groupby(["src", "dest"])["loss"].agg(["sum", "count", "max"])
    got = {k: (float(v[0]), int(v[1])) for k, v in totals.result().items()}
    assert got == {k: (r["sum"], r["count"]) for k, r in expected.iterrows()}
    mx = maxima.result().set_index(["src", "dest"])["max_loss"]
    assert mx.sort_index().tolist() == expected["max"].sort_index().tolist()
    short = everything[end + pd.Timedelta(minutes=5) > watermark]
    short = short[short["loss"] > 10].groupby("src")["loss"].agg(["size", "max"])
    ours = recent.to_pandas().set_index("src").sort_index()
    assert ours["n"].tolist() == short["size"].tolist()
    assert ours["worst"].tolist() == short["max"].tolist()

print(f"watermark {stream.watermark}; partitions (minutes since 9:00) {stream.partitions('S')}")
summary = maxima.result().merge(
    pd.DataFrame(
        [(*k, v[0]) for k, v in totals.result().items()], columns=["src", "dest", "sum_loss"]
    )
)
print("last 10 minutes per pair (SUM by F-IVM, exact MAX under expiry):")
print(summary.to_string(index=False))
print(f"View2 at partition {view2.partition} (>= 4 consecutive red minutes):")
print(view2.result()[["src", "dest", "count", "sum_loss"]].to_string(index=False))
print("SQL view over the last 5 minutes:")
print(recent.to_pandas().sort_values("src").to_string(index=False))
print(f"dead letters: {len(stream.dead_letters('S'))} row(s) behind the watermark")
