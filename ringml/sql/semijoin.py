"""Semijoin reduction of a view's static tables before they are loaded.

A row of a static table that joins with no row of another static table on their shared
variables never reaches the view's result, now or later: the other table does not change
while the view lives.  A view created with ``static=[...]`` therefore loads only the static
rows that survive semijoins with the other static items, repeated until nothing changes
(Yannakakis' reducer, run to a fixpoint so that cyclic joins are reduced too), and its
stored views, and every probe of a later batch into them, only hold rows that can join;
e.g. TPC-H Q5 keeps the suppliers of the selected region's nations.  The result is the
same: only rows that contribute nothing are left out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import pandas as pd

from ..batch import UpdateBatch
from ..encoding import factorize_rows
from ..query import Query


def reduce_static(
    query: Query, batches: Sequence[UpdateBatch], static: Collection[str]
) -> list[UpdateBatch]:
    """``batches`` with the rows of the ``static`` relations that cannot join left out.

    ``batches`` hold every static relation's current rows (inserts; a static relation
    without a batch is empty).  Relations with several atoms are kept whole (a row dangling
    in one role may join in another); the other relations' rows are untouched."""
    reducible = [r for r in static if r in query.relations and len(query.atoms_of(r)) == 1]
    if len(reducible) < 2:
        return list(batches)
    frames: dict[str, pd.DataFrame] = {}
    signs: dict[str, np.ndarray] = {}
    for batch in batches:
        if batch.relation in reducible:
            if batch.relation in frames or (batch.signs() <= 0).any():
                return list(batches)  # not one batch of inserts: nothing to reduce safely
            frames[batch.relation], signs[batch.relation] = batch.rows, batch.signs()
    names = {
        r: dict(zip(query.atoms_of(r)[0].variables, query.relations[r], strict=True))
        for r in reducible
    }
    keep = {r: np.ones(len(frames[r]) if r in frames else 0, dtype=bool) for r in reducible}
    changed = True
    while changed:
        changed = False
        for r in reducible:
            for s in reducible:
                if r == s or not keep[r].any():
                    continue
                shrunk = keep[r] & _joins(frames, names, keep, r, s)
                if shrunk.sum() < keep[r].sum():
                    keep[r], changed = shrunk, True
    out = []
    for batch in batches:
        mask = keep.get(batch.relation)
        if mask is None or mask.all():
            out.append(batch)
        elif mask.any():
            rows = batch.rows[mask].reset_index(drop=True)
            out.append(UpdateBatch(batch.relation, rows, signs[batch.relation][mask]))
    return out


def _joins(
    frames: dict[str, pd.DataFrame],
    names: dict[str, dict[str, str]],
    keep: dict[str, np.ndarray],
    r: str,
    s: str,
) -> np.ndarray:
    """Which rows of ``r`` match a kept row of ``s`` on their shared variables."""
    shared = [v for v in names[r] if v in names[s]]
    others = keep[s]
    if not others.any():  # ``s`` is empty: nothing joins
        return np.zeros(keep[r].size, dtype=bool)
    if not shared:  # a Cartesian product: every row joins
        return np.ones(keep[r].size, dtype=bool)
    mine = frames[r][[names[r][v] for v in shared]]
    theirs = frames[s][[names[s][v] for v in shared]][others]
    if len(shared) == 1:
        return mine.iloc[:, 0].isin(theirs.iloc[:, 0]).to_numpy()
    # both sides' rows coded together (a MultiIndex would factorize strings as C strings)
    columns = [
        np.concatenate([mine.iloc[:, j].to_numpy(), theirs.iloc[:, j].to_numpy()])
        for j in range(len(shared))
    ]
    codes = factorize_rows(columns)
    return np.isin(codes[: len(mine)], codes[len(mine) :])
