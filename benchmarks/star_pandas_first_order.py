"""Classic first-order IVM of the star covariance query in plain pandas (issue 11, item 3).

The yardstick for ``Maintainer(strategy="first_order")``: what a pandas user writes for
"keep count, Σx, Σxxᵀ over the join fresh" without factorization --

* **State**: the base relations, stored as DataFrames (one row per stored tuple), plus the
  root ``(count, Σx, Σxxᵀ)``.  No per-postcode aggregates, no view tree.
* **Update** of a batch ``δR`` (rows with multiplicities ±1, kept as a weight column):
  ``δR ⋈ S₁ ⋈ … ⋈ S₅`` by ``DataFrame.merge(on=key)`` (hash joins) with the *stored*
  other relations, smallest first, then one matrix product for the aggregate:
  ``A = [1, x₁ … x₂₆]`` per join row, ``δ = (A · w)ᵀ A`` (27 x 27), which holds the count,
  Σx and Σxxᵀ.  Deletes are negative weights in ``δR``; then ``R``'s stored frame gets the
  inserted rows appended and the deleted ones removed (matched by value, one stored copy per
  deleted copy, through a 64-bit hash of the row kept in a column).
* Values are used as they are (no shift); the root is a 27 x 27 float64 matrix and the
  count is read back as an exact integer (< 2**53).

Inputs are the engine's: relation name, the rows as a DataFrame with the relation's
columns, the multiplicities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["StarPandasFirstOrder"]


def _row_hash(frame: pd.DataFrame) -> np.ndarray:
    return pd.util.hash_pandas_object(frame, index=False).to_numpy()


class StarPandasFirstOrder:
    """First-order IVM with pandas merges; ``apply(relation, rows, multiplicity)``."""

    def __init__(self, schema: Mapping[str, Sequence[str]], key: str = "postcode") -> None:
        self.key = key
        self.schema = {r: list(c) for r, c in schema.items()}
        self.variables = [c for cols in schema.values() for c in cols if c != key]
        self.stored = {
            r: pd.DataFrame({c: pd.Series(dtype=np.float64) for c in cols})
            for r, cols in self.schema.items()
        }
        # a 64-bit hash of every stored row, aligned with the stored frame (to find deletes)
        self.hashes = {r: np.zeros(0, dtype=np.uint64) for r in schema}
        self._typed = {r: False for r in schema}  # empty frames take the first batch's dtypes
        self.gram = np.zeros((len(self.variables) + 1, len(self.variables) + 1))

    def apply(self, relation: str, rows: pd.DataFrame, multiplicity: np.ndarray) -> None:
        cols = self.schema[relation]
        rows = rows[cols]
        weights = np.asarray(multiplicity, dtype=np.float64)
        # the delta query: δR joined with the stored other relations, smallest first
        joined = rows.assign(__w=weights)
        others = sorted(
            (r for r in self.schema if r != relation), key=lambda r: len(self.stored[r])
        )
        for other in others:
            if len(joined) == 0:
                break
            joined = joined.merge(self.stored[other], on=self.key, how="inner", copy=False)
        if len(joined):
            a = np.empty((len(joined), len(self.variables) + 1))
            a[:, 0] = 1.0
            a[:, 1:] = joined[self.variables].to_numpy(dtype=np.float64)
            w = joined["__w"].to_numpy()
            self.gram += (a * w[:, None]).T @ a
        # the stored relation: append the inserts, remove the deletes (by value)
        insert = weights > 0
        stored, hashes = self.stored[relation], self.hashes[relation]
        if not insert.all():
            stored, hashes = self._remove(relation, stored, hashes, rows[~insert])
        if insert.any():
            new = rows[insert] if not insert.all() else rows
            if not self._typed[relation]:  # the first batch gives the stored frame its dtypes
                stored = new.reset_index(drop=True)
                self._typed[relation] = True
            else:
                stored = pd.concat([stored, new], ignore_index=True, copy=False)
            hashes = np.concatenate([hashes, _row_hash(new)])
        self.stored[relation], self.hashes[relation] = stored, hashes

    def _remove(
        self, relation: str, stored: pd.DataFrame, stored_hashes: np.ndarray, gone: pd.DataFrame
    ) -> tuple[pd.DataFrame, np.ndarray]:
        """``stored`` without one stored copy of every row of ``gone`` (and their hashes)."""
        hashes = _row_hash(gone)
        cand = np.flatnonzero(pd.Series(stored_hashes, copy=False).isin(hashes).to_numpy())
        # the i-th deleted copy of a row takes the i-th stored copy with the same hash
        oc = np.argsort(stored_hashes[cand], kind="stable")
        ch, cand = stored_hashes[cand][oc], cand[oc]
        og = np.argsort(hashes, kind="stable")
        gh = hashes[og]
        first = np.ones(len(gh), dtype=bool)
        first[1:] = gh[1:] != gh[:-1]
        rank = np.arange(len(gh)) - np.maximum.accumulate(np.where(first, np.arange(len(gh)), 0))
        at = np.searchsorted(ch, gh) + rank
        found = at < len(ch)
        found[found] = ch[at[found]] == gh[found]
        if not found.all():
            row = gone.iloc[int(og[np.flatnonzero(~found)[0]])].to_dict()
            raise ValueError(f"relation {relation!r}: deleting tuple {row} that is not present")
        pos = np.empty(len(gh), dtype=np.int64)
        pos[og] = cand[at]
        cols = self.schema[relation]
        same = stored[cols].iloc[pos].to_numpy() == gone[cols].to_numpy()
        if not same.all():
            raise ValueError(f"relation {relation!r}: a 64-bit row hash collided")
        keep = np.ones(len(stored), dtype=bool)
        keep[pos] = False
        return stored[keep].reset_index(drop=True), stored_hashes[keep]

    def moments(self) -> tuple[int, np.ndarray, np.ndarray]:
        """``(count, Σx, Σxxᵀ)`` in the order of :attr:`variables`."""
        g = self.gram
        return int(round(g[0, 0])), g[0, 1:].copy(), g[1:, 1:].copy()

    def state_nbytes(self) -> int:
        """Bytes of the stored relations (deep) and the root."""
        frames = sum(int(f.memory_usage(index=True, deep=True).sum()) for f in self.stored.values())
        return frames + sum(h.nbytes for h in self.hashes.values()) + self.gram.nbytes
