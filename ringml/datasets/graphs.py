"""Edge relations for k-path queries (notes §11.3)."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["graph_edges", "path_query_relations"]


def graph_edges(
    nodes: int,
    edges: int,
    seed: int = 0,
    skew: float = 0.0,
    *,
    unique: bool = True,
    self_loops: bool = False,
) -> pd.DataFrame:
    """A random directed edge table ``E(src, dst)`` (int64 node ids ``0..nodes-1``).

    Endpoints are drawn independently with probability proportional to
    ``rank ** -skew`` over a random ranking of the nodes (``skew = 0``: uniform;
    ``skew ~ 1``: Zipf-like hubs, as in TikTok vs Twitter).  With ``unique`` the edges
    are distinct (set semantics; redrawn in vectorized rounds), otherwise duplicates
    are kept as multiplicities; near saturation under heavy skew the redraw budget
    (about 32 draws per edge) can run out, which raises.  Rows are sorted by ``(src, dst)``.

    Raises:
        ValueError: if ``edges`` distinct edges do not exist or cannot be drawn.
    """
    if nodes < 1 or edges < 0 or skew < 0:
        raise ValueError("need nodes >= 1, edges >= 0, skew >= 0")
    n = int(nodes)
    capacity = n * n - (0 if self_loops else n)
    if unique and edges > capacity:
        raise ValueError(f"only {capacity} distinct edges exist on {n} nodes")
    rng = np.random.default_rng(seed)
    if skew > 0:
        p = np.arange(1, n + 1, dtype=np.float64) ** (-float(skew))
        p /= p.sum()
        perm = rng.permutation(n)  # rank -> node id

        def draw(k: int) -> np.ndarray:
            return perm[rng.choice(n, size=k, p=p)]
    else:

        def draw(k: int) -> np.ndarray:
            return rng.integers(0, n, k)

    codes = np.empty(0, dtype=np.int64)
    rate = 1.0  # fraction of the last draw that yielded new distinct edges
    budget = 32 * edges + 100_000  # total endpoint pairs we are willing to draw
    while (missing := edges - len(codes)) > 0:
        k = missing if not unique else min(int(missing * 1.2 / rate) + 16, budget)
        if k <= 0:
            raise ValueError(
                f"could not draw {edges} distinct edges with skew={skew} on {n} nodes; "
                "lower edges or skew, or pass unique=False"
            )
        budget -= k
        src, dst = draw(k), draw(k)
        if not self_loops:
            keep = src != dst
            src, dst = src[keep], dst[keep]
        new = src.astype(np.int64) * n + dst
        if unique:
            new = np.setdiff1d(np.unique(new), codes, assume_unique=True)
            rate = max(len(new) / k, 1e-3)
            new = rng.permutation(new)[:missing]  # unbiased choice among the new ones
            codes = np.union1d(codes, new)
        else:
            codes = np.concatenate([codes, new[:missing]])
    codes = np.sort(codes)
    return pd.DataFrame({"src": codes // n, "dst": codes % n})


def path_query_relations(edges: pd.DataFrame, k: int) -> dict[str, pd.DataFrame]:
    """``k`` renamed copies ``R1(A1, A2), R2(A2, A3), ..., Rk(Ak, A{k+1})`` of an edge table.

    The k-path query joins them on the shared ``A_i`` (left-deep order ``A1 – ... –
    A{k+1}``).  ``edges`` must have columns ``src, dst`` (else its first two columns
    are used).  Each copy is an independent DataFrame.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    cols = ["src", "dst"] if {"src", "dst"} <= set(edges.columns) else list(edges.columns[:2])
    base = edges[cols].reset_index(drop=True)
    return {f"R{i}": base.set_axis([f"A{i}", f"A{i + 1}"], axis=1).copy() for i in range(1, k + 1)}
