"""Hand-specialized numpy F-IVM for one query: the covariance matrix over a star join.

The query is ``ringml.covariance_query`` over a star schema whose relations share exactly
one join variable (Housing: House, Shop, Institution, Restaurant, Demographics, Transport on
``postcode``) and every other variable belongs to one relation: count, Σx and Σxxᵀ over the
natural join, for all non-join variables (26 for Housing: 1 + 26 + 351 = 378 aggregates).

This is the *bar* the engine is measured against in ``benchmarks/engine.py``'s
``star-shuffled-P`` workloads, so it is written to be fast for this one query and nothing
else:

* **State** (the memory-minimal layout): one float64 array with a row per postcode code
  holding, for every relation ``R`` (``k`` own variables), the count, ``Σx`` and the packed
  upper triangle of ``Σxxᵀ`` of R's rows with that postcode -- columns ``[counts | Σx of
  all variables | packed Σxxᵀ of each relation]``, 124 numbers per postcode for Housing, so
  that one gather fetches every relation at a batch's postcodes; the root ``(count, Σx,
  Σxxᵀ)``; the postcode dictionary (a direct-address table for small non-negative integer
  keys, a dict otherwise).  No tuple is stored.  The array grows in place
  (``ndarray.resize``, i.e. realloc), so growing never holds two copies.
* **Update** of a batch ``δR`` (rows with multiplicities ±1): lift the rows to
  ``[m, m·x, m·xxᵀ (packed)]`` (transposed, so every operation runs along the batch); when
  most rows have distinct postcodes (shuffled streams) keep one column per row -- the delta
  rule is linear in the rows -- otherwise sort by postcode and sum per postcode
  (``np.add.reduceat``).  Then the F-IVM delta rule ``δroot = Σ_p δR_p ⊗ Π_{S ≠ R} S_p`` in
  the covariance ring, assembled blockwise with a handful of matrix products: with
  ``e_p = Π_{S ≠ R} c_S,p``, ``e_S,p = Π_{T ≠ R, S} c_T,p`` and ``μ_S,p = s_S,p / c_S,p`` (0
  where ``c_S,p = 0``, where the terms using it vanish anyway),

  - count ``δc·e``; ``Σx_R``: ``δsᵀe``; ``Σx_S``: ``(s_S e_S)ᵀ δc``;
  - ``Q_RR``: ``δQᵀe``; ``Q_RS``: ``δsᵀ (s_S e_S)``; ``Q_SS``: ``Q_Sᵀ (δc e_S)``;
  - ``Q_ST`` (``S ≠ T``, both ≠ R): ``(μ_S · δc e)ᵀ μ_T`` -- one product for all pairs;

  then R's columns of the gathered rows get ``δR_p`` added (rows of one postcode summed
  first) and go back (a postcode left without rows gets exact zeros, as the engine drops
  keys without derivations).  Large temporaries live in reused scratch buffers: a fresh
  megabyte per batch would be fresh pages, i.e. page faults, every time.
* **Numerics** as the engine: every variable gets a fixed shift ``h`` from its first batch
  (:func:`choose_shift`, the rule of ``ringml.rings.covariance``) and the state holds the
  moments of ``x − h``; :meth:`StarCovariance.moments` returns original units.  Counts are
  sums of ±1 held in float64, exact below 2**53; the root count is a Python int.

No dependency on ringml: numpy and pandas only.  Inputs are the engine's: a relation name,
the rows as a DataFrame with the relation's columns, and the multiplicities.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["StarCovariance", "choose_shift", "star_variables"]

#: Keys below this bound are coded by a direct-address table (else: a dict).
_DIRECT_LIMIT = 1 << 26


def choose_shift(x: np.ndarray) -> float:
    """The batch mean rounded to a multiple of the largest power of two <= its sd.

    The same rule as ``ringml.rings.covariance.choose_shift`` (copied so that this module
    does not import the engine it is the baseline of).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        h = float(np.mean(x))
        sd = float(np.std(x)) if len(x) > 1 else 0.0
    if not math.isfinite(h):
        return float(np.partition(x, len(x) // 2)[len(x) // 2])
    if sd > 0.0 and math.isfinite(sd):
        step = math.ldexp(1.0, math.frexp(sd)[1] - 1)
        h = float(np.round(h / step) * step)
    return h


def star_variables(schema: Mapping[str, Sequence[str]], key: str) -> list[str]:
    """The non-join variables in schema order (``covariance_query``'s ring order)."""
    return [c for cols in schema.values() for c in cols if c != key]


class _KeyCodes:
    """Dictionary encoding of the join key: codes 0, 1, ... in order of first appearance."""

    def __init__(self) -> None:
        self.table = np.full(1024, -1, dtype=np.int64)  # value -> code (direct keys)
        self.other: dict = {}  # value -> code (keys that are not small non-negative ints)
        self.size = 0

    def encode(self, keys: np.ndarray) -> np.ndarray:
        if keys.dtype.kind in "iu" and len(keys):
            lo, hi = int(keys.min()), int(keys.max())
            if lo >= 0 and hi < _DIRECT_LIMIT:
                if hi >= len(self.table):
                    old = len(self.table)
                    self.table.resize(max(hi + 1, old + old // 2), refcheck=False)
                    self.table[old:] = -1
                codes = self.table[keys]
                new = codes < 0
                if new.any():
                    fresh, first = np.unique(keys[new], return_index=True)
                    fresh = fresh[np.argsort(first, kind="stable")]  # first-appearance order
                    self.table[fresh] = np.arange(self.size, self.size + len(fresh))
                    self.size += len(fresh)
                    codes = self.table[keys]
                return codes
        out = np.empty(len(keys), dtype=np.int64)  # general keys: a dict
        for i, v in enumerate(keys.tolist()):
            if isinstance(v, int) and 0 <= v < _DIRECT_LIMIT:
                if v >= len(self.table):
                    self.encode(np.array([v], dtype=np.int64))
                c = int(self.table[v])
                if c < 0:
                    c = self.table[v] = self.size
                    self.size += 1
            else:
                c = self.other.get(v)
                if c is None:
                    c = self.other[v] = self.size
                    self.size += 1
            out[i] = c
        return out

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + 100 * len(self.other)


class _Relation:
    """One relation's place in the state and its precomputed index maps."""

    def __init__(self, index: int, columns: Sequence[str], key: str, start: int, poff: int):
        self.index = index  # its count column
        self.columns = list(columns)
        var_pos = [i for i, c in enumerate(self.columns) if c != key]
        self.k = k = len(var_pos)
        lo = var_pos[0] if var_pos else 0
        # the variables' columns of a batch: a slice when contiguous (Housing: postcode first)
        self.var_cols = slice(lo, lo + k) if var_pos == list(range(lo, lo + k)) else var_pos
        self.start, self.stop = start, start + k  # block of global variable positions
        iu, ju = np.triu_indices(k)
        self.plen = len(iu)
        self.poff = poff  # first packed column of its Σxxᵀ among all relations'
        self.row_offsets = np.concatenate(([0], np.cumsum(np.arange(k, 0, -1)))).astype(int)
        full = np.zeros((k, k), dtype=np.intp)  # full (i, j) -> packed position
        full[iu, ju] = np.arange(self.plen)
        full[ju, iu] = np.arange(self.plen)
        self.unpack = full.ravel()


class StarCovariance:
    """F-IVM of count, Σx, Σxxᵀ over a star join on ``key``; see the module docstring.

    ``apply(relation, rows, multiplicity)`` applies one batch; :meth:`moments` gives
    ``(count, Σx, Σxxᵀ)`` in original units, variables in :attr:`variables` order.

    State: one float64 array, a row per postcode code, columns ``[counts (one per relation)
    | Σx (all variables, global order) | packed Σxxᵀ of each relation]`` (124 columns for
    Housing), so that one gather fetches every relation's moments at the batch's postcodes.
    Counts are sums of ±1, exact in float64.
    """

    def __init__(self, schema: Mapping[str, Sequence[str]], key: str = "postcode") -> None:
        self.key = key
        self.variables = star_variables(schema, key)
        if len(set(self.variables)) != len(self.variables):
            raise ValueError("a non-join variable occurs in two relations: not a star on one key")
        m = self.m = len(self.variables)
        self.rel: dict[str, _Relation] = {}
        start = poff = 0
        for i, (name, cols) in enumerate(schema.items()):
            if key not in cols:
                raise ValueError(f"relation {name!r} lacks the join key {key!r}")
            r = self.rel[name] = _Relation(i, cols, key, start, poff)
            start += r.k
            poff += r.plen
        nrel = self.nrel = len(self.rel)
        self.sum0 = nrel  # first Σx column
        self.prod0 = nrel + m  # first packed Σxxᵀ column
        self.width = nrel + m + poff
        rels = list(self.rel.values())
        self._rel_of_var = np.concatenate([np.full(r.k, r.index) for r in rels]).astype(np.intp)
        self._rel_of_pcol = np.concatenate([np.full(r.plen, r.index) for r in rels]).astype(np.intp)
        self._pcols = np.arange(poff)
        # per delta relation R: the other relations' diagonal blocks (m x m flat positions)
        # and where their entries are in the packed vector
        self._diag = {}
        for name, r in self.rel.items():
            dst, src = [], []
            for o in rels:
                if o is r:
                    continue
                ii, jj = np.meshgrid(
                    np.arange(o.start, o.stop), np.arange(o.start, o.stop), indexing="ij"
                )
                dst.append((ii * m + jj).ravel())
                src.append(o.poff + o.unpack)
            self._diag[name] = (
                np.concatenate(dst).astype(np.intp),
                np.concatenate(src).astype(np.intp),
            )
        self.codes = _KeyCodes()
        self.state = np.zeros((0, self.width))
        self._slot = np.zeros(0, dtype=np.int64)  # scratch: -1, or a row of the batch
        self._buffers: dict[str, np.ndarray] = {}
        self.shift = np.full(m, np.nan)
        self.count = 0
        self.sums = np.zeros(m)
        self.products = np.zeros((m, m))

    def _reserve(self, n: int) -> None:
        cap = len(self.state)
        if n > cap:  # in place (realloc): no second copy of the state while growing
            new = max(n, cap + cap // 2, 1024)
            self.state.resize((new, self.width), refcheck=False)  # new rows are zeros
            self._slot.resize(new, refcheck=False)
            self._slot[cap:] = -1

    def _scratch(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A reused (rows, cols) work array (a view of a buffer that only grows): large
        temporaries would otherwise be fresh pages, i.e. page faults, on every batch."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < rows or buf.shape[1] < cols:
            shape = (
                (rows, cols) if buf is None else (max(rows, buf.shape[0]), max(cols, buf.shape[1]))
            )
            buf = self._buffers[name] = np.empty(shape)
        return buf[:rows, :cols]

    # ------------------------------------------------------------------ update
    def apply(self, relation: str, rows: pd.DataFrame, multiplicity: np.ndarray) -> None:
        """Apply one batch of ``relation``: ``rows`` with multiplicities ±1."""
        r = self.rel[relation]
        n = len(rows)
        if n == 0:
            return
        if list(rows.columns) != r.columns:
            rows = rows[r.columns]
        data = rows.to_numpy(dtype=np.float64)  # one conversion of the whole batch
        codes = self.codes.encode(rows[self.key].to_numpy())
        if self.codes.size > len(self.state):
            self._reserve(self.codes.size)
        k, a, b = r.k, r.start, r.stop
        h = self.shift[a:b]
        if np.isnan(h).any():  # the first batch of this relation fixes its shifts
            for j in np.flatnonzero(np.isnan(h)):
                h[j] = choose_shift(data[:, r.var_cols][:, j])
        mult = np.asarray(multiplicity, dtype=np.float64)

        # distinct postcodes of the batch (a scratch slot per code, no sort)
        slot = self._slot
        slot[codes] = np.arange(n)
        last = slot[codes]  # the last row of each row's postcode
        lead = last == np.arange(n)
        slot[codes] = -1
        nu = int(np.count_nonzero(lead))
        grouped = 2 * nu <= n  # many rows per postcode: aggregate per postcode first

        # the lifted batch, transposed: wT = [m; m x; m x_i x_j (packed upper triangle)]
        w = 1 + k + r.plen
        if grouped:  # sorted by postcode, then summed per run
            order = np.argsort(codes, kind="stable")
            src, ms = data[order], mult[order]
        else:
            src, ms = data, mult
        xT = self._scratch("x", k, n)
        np.subtract(src[:, r.var_cols].T, h[:, None], out=xT)
        wT = self._scratch("w", w, n)
        wT[0] = ms
        np.multiply(xT, ms, out=wT[1 : 1 + k])
        off = r.row_offsets + 1 + k
        for i in range(k):
            np.multiply(xT[i], wT[1 + i : 1 + k], out=wT[off[i] : off[i + 1]])
        if grouped:
            sc = codes[order]
            first = np.empty(n, dtype=bool)
            first[0] = True
            np.not_equal(sc[1:], sc[:-1], out=first[1:])
            starts = np.flatnonzero(first)
            cols = sc[starts]
            agg = np.add.reduceat(wT, starts, axis=1)
        else:  # one column per row: the delta rule is linear in the rows
            cols = codes
            agg = wT
        nc = len(cols)
        dc = agg[0]
        dsT = agg[1 : 1 + k]
        dqT = agg[1 + k :]

        # every relation's moments at these postcodes (R's own are used for its update)
        g = self._scratch("g", nc, self.width)
        np.take(self.state, cols, axis=0, out=g, mode="clip")  # "clip": no buffered copy
        nrel = self.nrel
        cT = self._scratch("c", nrel, nc)  # counts, transposed
        np.copyto(cT, g[:, :nrel].T)
        ones = np.ones(nc)
        fwd = [ones]  # Π of the other relations' counts before / after each relation
        for t in range(nrel - 1):
            fwd.append(fwd[-1] if t == r.index else fwd[-1] * cT[t])
        excl = self._scratch("excl", nrel, nc)  # Π_{T ≠ R, S} c_T for each other S
        above = ones
        for t in range(nrel - 1, -1, -1):
            np.multiply(fwd[t], above, out=excl[t])
            if t != r.index:
                above = above * cT[t]
        e = above  # Π_{S ≠ R} c_S
        inv = self._scratch("inv", nrel, nc)
        inv.fill(0.0)
        np.divide(1.0, cT, out=inv, where=cT != 0)
        sT = self._scratch("s", self.m, nc)  # Σx of every relation, transposed
        np.copyto(sT, g[:, self.sum0 : self.prod0].T)
        muT = self._scratch("mu", self.m, nc)  # μ_S = s_S / c_S
        np.multiply(sT, inv[self._rel_of_var], out=muT)
        yT = self._scratch("y", self.m, nc)  # s_S Π_{T ≠ R, S} c_T
        np.multiply(sT, excl[self._rel_of_var], out=yT)
        we = dc * e

        # δroot: Q_ST = Σ δc e μ_S μ_Tᵀ for S ≠ T (one product for all pairs), then the
        # others' diagonal blocks Σ δc Π_{T ≠ R, S} c_T Q_S, R's rows and columns, R's block
        wmu = self._scratch("wmu", self.m, nc)
        np.multiply(muT, we, out=wmu)
        delta = wmu @ muT.T
        np.multiply(excl, dc, out=excl)
        qv = (excl @ g[:, self.prod0 :])[self._rel_of_pcol, self._pcols]
        dst, src_ = self._diag[relation]
        delta.reshape(-1)[dst] = qv[src_]
        q_r = dsT @ yT.T
        delta[a:b, :] = q_r
        delta[:, a:b] = q_r.T
        delta[a:b, a:b] = (dqT @ e)[r.unpack].reshape(k, k)
        dsum = yT @ dc
        dsum[a:b] = dsT @ e
        self.products += delta
        self.sums += dsum
        self.count += int(round(float(dc @ e)))

        # R's own per-postcode moments (its count, Σx and packed Σxxᵀ columns): added to
        # the gathered rows, which go back whole (a row copy beats a fancy column update)
        ps = self.sum0 + a
        pp = self.prod0 + r.poff
        d = agg
        if not (grouped or nu == n):  # rows of one postcode: sum them into its last row
            rest = np.flatnonzero(~lead)
            while len(rest):  # rounds of distinct targets
                rc = codes[rest]
                slot[rc] = rest
                now = slot[rc] == rest
                slot[rc] = -1
                d[:, last[rest[now]]] += d[:, rest[now]]  # agg is scratch: summed in place
                rest = rest[~now]
        g[:, r.index] += d[0]
        g[:, ps : ps + k] += d[1 : 1 + k].T
        g[:, pp : pp + r.plen] += d[1 + k :].T
        if grouped or nu == n:
            rows_g, targets = g, cols
        else:  # only the last row of each postcode holds its sum
            leads = np.flatnonzero(lead)
            rows_g = self._scratch("gl", nu, self.width)
            np.take(g, leads, axis=0, out=rows_g, mode="clip")
            targets = cols[leads]
        if (dc < 0).any():
            cnt = rows_g[:, r.index]
            gone = cnt == 0.0
            if gone.any():  # no rows left: exact zeros, as the engine drops the key
                rows_g[gone, ps : ps + k] = 0.0
                rows_g[gone, pp : pp + r.plen] = 0.0
            if (cnt < 0).any():
                raise ValueError(f"relation {relation!r}: more deletes than inserts")
        self.state[targets] = rows_g

    # ------------------------------------------------------------------ read-outs
    def moments(self) -> tuple[int, np.ndarray, np.ndarray]:
        """``(count, Σx, Σxxᵀ)`` in original units (the shifts undone), variables in order."""
        h = np.nan_to_num(self.shift)
        c = float(self.count)
        s = self.sums + c * h
        q = self.products + np.outer(self.sums, h) + np.outer(h, self.sums) + c * np.outer(h, h)
        return self.count, s, q

    def state_nbytes(self) -> dict[str, int]:
        """Bytes of the state: allocated arrays, and the minimal layout for the keys used."""
        keys = self.codes.size
        root = 8 + self.sums.nbytes + self.products.nbytes + self.shift.nbytes
        return {
            "allocated": self.state.nbytes + root + self.codes.nbytes,
            "minimal": 8 * self.width * keys + root + keys * 8,
            "keys": keys,
        }
