"""The main job on embedded defaults: a Housing-like star, a stream with deletes, a check."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from .applications import covariance_query
from .batch import UpdateBatch
from .datasets import build_stream, final_state, housing_star
from .maintainer import Maintainer


def run_demo(
    postcodes: int = 1000,
    delete_fraction: float = 0.3,
    batch_size: int = 1000,
    seed: int = 0,
    out=print,
) -> dict:
    """Stream inserts and deletes into a Housing-like star and keep its covariance fresh."""
    data = housing_star(postcodes=postcodes, seed=seed)
    relations = {name: list(frame.columns) for name, frame in data.relations.items()}
    query = covariance_query(relations)
    maintainer = Maintainer(query)
    stream = build_stream(
        data.relations, batch_size=batch_size, delete_fraction=delete_fraction, seed=seed
    )
    tuples = sum(len(b.rows) for b in stream)
    out(
        f"Housing-like star: {len(relations)} relations, {postcodes} postcodes; "
        f"stream of {len(stream)} batches, {tuples:,} tuples ({delete_fraction:.0%} deletes)"
    )
    out(maintainer.explain())
    start = time.perf_counter()
    for batch in stream:
        maintainer.apply(UpdateBatch(batch.relation, batch.rows, batch.multiplicity))
    elapsed = time.perf_counter() - start
    stats = query.ring.statistics(maintainer.result())
    out(
        f"\nmaintained {tuples:,} tuples in {elapsed:.2f} s ({tuples / elapsed:,.0f} tuples/s); "
        f"the join now has {stats.count:,} rows (never materialized)"
    )
    shown = ["price", "livingarea", "nbbedrooms", "averagesalary", "distancecitycentre"]
    index = [query.ring.variables.index(v) for v in shown]
    out("\ncovariance of a few of the 26 features:")
    with pd.option_context("display.float_format", "{:.4g}".format):
        out(
            pd.DataFrame(
                stats.covariance[np.ix_(index, index)], index=shown, columns=shown
            ).to_string()
        )
    final = final_state(stream)
    frames = list(final.values())
    flat = frames[0]
    for frame in frames[1:]:
        flat = flat.merge(frame, on="postcode")
    features = list(query.ring.variables)
    matrix = flat[features].to_numpy(dtype=float)
    expected = np.cov(matrix.T, bias=True)
    error = np.max(np.abs(stats.covariance - expected)) / np.max(np.abs(expected))
    out(
        f"\ncheck against numpy on the materialized join ({len(flat):,} rows): "
        f"count {'equal' if len(flat) == stats.count else 'DIFFERENT'}, "
        f"max covariance difference {error:.1e} (relative)"
    )
    return {
        "tuples": tuples,
        "seconds": elapsed,
        "join_rows": stats.count,
        "max_error": float(error),
        "count_ok": len(flat) == stats.count,
    }
