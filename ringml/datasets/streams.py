"""Update streams over a database: round-robin batches of inserts and (optional) deletes.

The F-IVM experiments (notes §11.1) interleave the insertions into the input relations
round-robin, in batches of 1000 tuples.  :func:`build_stream` reproduces that and can mix
in deletes of earlier-inserted tuples; :func:`final_state` and :func:`stream_to_frame`
give oracles the net database and a flat view of the stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["StreamBatch", "build_stream", "final_state", "stream_to_frame"]


@dataclass(frozen=True, eq=False)
class StreamBatch:
    """One update batch to one relation.

    Attributes:
        relation: the relation name.
        rows: the tuples (columns = the relation's schema, fresh RangeIndex).
        multiplicity: int64 array, ``+1`` for an insert and ``-1`` for a delete, per row.
        row_ids: int64 positions of the tuples in the source relation (a tuple and its
            later delete share the id).
    """

    relation: str
    rows: pd.DataFrame
    multiplicity: np.ndarray
    row_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def n_inserts(self) -> int:
        return int((self.multiplicity > 0).sum())

    @property
    def n_deletes(self) -> int:
        return int((self.multiplicity < 0).sum())

    def __repr__(self) -> str:
        return f"StreamBatch({self.relation!r}, +{self.n_inserts}/-{self.n_deletes})"


def _allocate(total: int, weights: np.ndarray) -> np.ndarray:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder)."""
    if total == 0 or weights.sum() == 0:
        return np.zeros(len(weights), dtype=np.int64)
    exact = total * weights / weights.sum()
    out = np.floor(exact).astype(np.int64)
    rest = total - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:rest]] += 1
    return out


def _relation_batches(
    name: str,
    df: pd.DataFrame,
    n_del: int,
    batch_size: int,
    delete_fraction: float,
    rng: np.random.Generator,
) -> list[StreamBatch]:
    """All batches of one relation: its rows in order, plus ``n_del`` deletes.

    Each batch holds ``ins`` inserts (the next rows) and up to ``batch_size - ins``
    deletes drawn uniformly among the tuples inserted by *earlier* batches and not yet
    deleted.  Once the inserts run out, delete-only batches follow.
    """
    n = len(df)
    per_batch_ins = batch_size
    if n_del > 0:  # leave room for deletes in every batch
        per_batch_ins = min(batch_size - 1, max(1, round(batch_size * (1.0 - delete_fraction))))
    pool = np.empty(n, dtype=np.int64)  # alive ids inserted by earlier batches: pool[:m]
    m = 0
    inserted = deleted = 0
    out: list[StreamBatch] = []
    while inserted < n or deleted < n_del:
        ins = min(per_batch_ins, n - inserted)
        k = min(batch_size - ins, n_del - deleted, m)
        if ins == 0 and k <= 0:  # cannot happen while n_del <= n; guards an endless loop
            raise AssertionError("stream builder stalled")
        if k > 0:
            pos = rng.choice(m, size=k, replace=False)
            gone = pool[pos]
            # Remove pos from pool[:m]: refill the holes below m-k with the unchosen tail.
            tail = np.ones(k, dtype=bool)
            tail[pos[pos >= m - k] - (m - k)] = False
            holes = pos[pos < m - k]
            pool[holes] = pool[m - k + np.flatnonzero(tail)]
            m -= k
        else:
            k, gone = 0, np.empty(0, dtype=np.int64)
        new = np.arange(inserted, inserted + ins, dtype=np.int64)
        ids = np.concatenate([new, gone])
        out.append(
            StreamBatch(
                relation=name,
                rows=df.iloc[ids].reset_index(drop=True),
                multiplicity=np.concatenate(
                    [np.ones(ins, dtype=np.int64), -np.ones(k, dtype=np.int64)]
                ),
                row_ids=ids,
            )
        )
        pool[m : m + ins] = new  # usable by later batches only
        m += ins
        inserted += ins
        deleted += k
    return out


def build_stream(
    relations: Mapping[str, pd.DataFrame],
    batch_size: int = 1000,
    delete_fraction: float = 0.0,
    seed: int = 0,
    order: Sequence[str] | None = None,
) -> list[StreamBatch]:
    """Turn a database into a round-robin update stream.

    Every tuple of every streamed relation is inserted once, in the relation's row
    order (pre-sort the frames to get the paper's top-down variable order).  Batches go
    round-robin over ``order`` (default: mapping order): one batch per relation per
    round; exhausted relations drop out and the others continue.  A batch holds at most
    ``batch_size`` tuples of one relation.

    With ``delete_fraction = f`` (``0 <= f <= 0.5``) the stream also deletes
    ``round(f / (1 - f) * N)`` earlier-inserted tuples (``N`` = tuples inserted), spread
    over the relations in proportion to their sizes, so deletes are (up to that one
    rounding) exactly a fraction ``f`` of all emitted tuples.  A delete targets a tuple
    inserted by an earlier batch of the same relation and not yet deleted, chosen
    uniformly at random; each batch fills its spare capacity (``batch_size`` minus about
    ``(1 - f) * batch_size`` inserts) with deletes, and delete-only batches follow the
    last inserts if needed.  ``f = 0.5`` ends with every tuple deleted.

    Relations missing from ``order`` are not streamed (e.g. non-updatable ones).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if not 0.0 <= delete_fraction <= 0.5:
        raise ValueError("delete_fraction must be in [0, 0.5] (deletes never exceed inserts)")
    names = list(relations) if order is None else list(order)
    missing = [r for r in names if r not in relations]
    if missing:
        raise KeyError(f"order names unknown relations {missing}")
    if len(set(names)) != len(names):
        raise ValueError("order lists a relation twice")
    if delete_fraction > 0.0 and batch_size < 2:
        raise ValueError("deletes need batch_size >= 2")
    sizes = np.array([len(relations[r]) for r in names], dtype=np.int64)
    total_del = round(delete_fraction / (1.0 - delete_fraction) * int(sizes.sum()))
    n_del = np.minimum(_allocate(min(total_del, int(sizes.sum())), sizes.astype(float)), sizes)
    rng = np.random.default_rng(seed)
    per_rel = [
        _relation_batches(r, relations[r], int(d), batch_size, delete_fraction, rng)
        for r, d in zip(names, n_del, strict=True)
    ]
    stream: list[StreamBatch] = []
    for rnd in range(max((len(b) for b in per_rel), default=0)):
        stream.extend(b[rnd] for b in per_rel if rnd < len(b))
    return stream


def stream_to_frame(stream: Sequence[StreamBatch]) -> pd.DataFrame:
    """The stream as one frame: ``relation, mult`` then the union of the columns.

    Rows follow stream order; columns a relation lacks are NaN.
    """
    parts = []
    for b in stream:
        if {"relation", "mult"} & set(b.rows.columns):
            raise ValueError("relations with a column named 'relation' or 'mult' are not supported")
        part = b.rows.copy()
        part.insert(0, "mult", b.multiplicity)
        part.insert(0, "relation", b.relation)
        parts.append(part)
    if not parts:
        return pd.DataFrame(
            {"relation": pd.Series(dtype=object), "mult": pd.Series(dtype=np.int64)}
        )
    return pd.concat(parts, ignore_index=True)


def final_state(stream: Sequence[StreamBatch]) -> dict[str, pd.DataFrame]:
    """The net relations after applying the stream (multiset semantics).

    Tuples are compared by value: each distinct tuple appears ``sum(multiplicities)``
    times, in order of first appearance.  Relations that end empty are present (empty,
    with their columns).

    Raises:
        ValueError: if some tuple ends with a negative multiplicity.
    """
    by_rel: dict[str, list[StreamBatch]] = {}
    for b in stream:
        by_rel.setdefault(b.relation, []).append(b)
    out: dict[str, pd.DataFrame] = {}
    for rel, batches in by_rel.items():
        rows = pd.concat([b.rows for b in batches], ignore_index=True)
        mult = np.concatenate([b.multiplicity for b in batches]).astype(np.int64)
        cols = list(rows.columns)
        if not cols:
            raise ValueError(f"relation {rel!r} has no columns")
        codes = rows.groupby(cols, sort=False, dropna=False).ngroup().to_numpy()
        net = np.bincount(codes, weights=mult, minlength=codes.max(initial=-1) + 1)
        net = np.rint(net).astype(np.int64)
        if (net < 0).any():
            raise ValueError(f"relation {rel!r}: a tuple is deleted more often than inserted")
        first = np.full(len(net), len(rows), dtype=np.int64)
        np.minimum.at(first, codes, np.arange(len(rows), dtype=np.int64))
        keep = np.flatnonzero(net > 0)
        keep = keep[np.argsort(first[keep], kind="stable")]
        out[rel] = rows.iloc[np.repeat(first[keep], net[keep])].reset_index(drop=True)
    return out
