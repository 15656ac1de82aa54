"""Engine building blocks kept fast without changing what they compute.

Grouping, row hashing and tuple fingerprints are compared with straightforward reference
versions (fingerprints are stored in pickled maintainers, so they must never change), and a
delta that joins with nothing must leave every view as it was.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ringml.applications import covariance_query
from ringml.batch import TupleCounts, _exact_big
from ringml.encoding import _INT, _value_keys
from ringml.keyindex import hash_rows
from ringml.maintainer import Maintainer
from ringml.store import group_rows

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX = np.uint64(0xBF58476D1CE4E5B9)


def reference_hash(columns: list[np.ndarray]) -> np.ndarray:
    h = np.zeros(columns[0].shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in columns:
            h ^= column.view(np.uint64)
            h *= GOLDEN
            h ^= h >> np.uint64(31)
        h *= MIX
        h ^= h >> np.uint64(29)
    return h


def reference_fingerprints(columns: list[np.ndarray]) -> np.ndarray:
    hashed = []
    for data in columns:
        if data.dtype.kind in "iufb":
            bits = (data.astype(np.float64) + 0.0).view(np.int64)
            if data.dtype.kind == "i":
                bits = _exact_big(bits, data)
            hashed.append(bits)
        else:
            keys = _value_keys(data)[0]
            ints = keys[:, 0] == _INT
            as_float = (keys[ints, 1].astype(np.float64) + 0.0).view(np.int64)
            keys[ints, 1] = _exact_big(as_float, keys[ints, 1])
            hashed.append(keys[:, 1])
    return reference_hash(hashed).view(np.int64)


@pytest.mark.parametrize("big", [False, True])
def test_fingerprints_and_row_hashes_are_unchanged(big):
    rng = np.random.default_rng(1)
    n = 300
    ints = rng.integers(-(10**6), 10**6, n)
    if big:  # beyond 2**53 integers hash exactly, not by their rounded float
        ints[:5] = [2**53 + 1, -(2**63), 2**62 + 3, -(2**53) - 1, 2**53]
    columns = [
        ints,
        rng.normal(size=n),
        np.where(rng.random(n) < 0.5, -0.0, 0.0),
        rng.integers(0, 2, n).astype(bool),
        rng.integers(0, 2**63, n, dtype=np.uint64),
        np.array(["a", 1, 2.0, 2**70, -0.0], dtype=object)[rng.integers(0, 5, n)],
        rng.integers(0, 5, n).astype(np.int32),
    ]
    np.testing.assert_array_equal(
        TupleCounts.fingerprints(columns), reference_fingerprints(columns)
    )
    keys = np.stack([ints, rng.integers(0, 9, n)], axis=1)
    np.testing.assert_array_equal(hash_rows(keys), reference_hash([keys[:, 0], keys[:, 1]]))
    # 1 == 1.0 and -0.0 == 0.0 as tuples
    a = TupleCounts.fingerprints([np.array([1, 2]), np.array([0.0, 3.0])])
    b = TupleCounts.fingerprints([np.array([1.0, 2.0]), np.array([-0.0, 3.0])])
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("ordered", [True, False])
def test_group_rows_matches_np_unique(width, ordered):
    rng = np.random.default_rng(width)
    for n in (0, 1, 2, 50):
        columns = rng.integers(0, 6, (n, width))
        if ordered:  # rows in lexicographic order: grouped without a sort
            columns = columns[np.lexsort(columns.T[::-1])]
        unique, groups = group_rows(columns)
        if n == 0:
            assert unique.shape[0] == 0 and groups.size == 0
            continue
        expected, inverse = np.unique(columns, axis=0, return_inverse=True)
        np.testing.assert_array_equal(unique, expected)
        np.testing.assert_array_equal(groups, inverse.ravel())
        np.testing.assert_array_equal(unique[groups], columns)


def star() -> dict[str, list[str]]:
    return {"F": ["k", "x", "y"], "D1": ["k", "u"], "D2": ["k", "v", "w"]}


def test_a_delta_joining_nothing_changes_no_view_above_its_own():
    query = covariance_query(star())
    m = Maintainer(query)
    rng = np.random.default_rng(0)
    m.insert("D1", pd.DataFrame({"k": [1, 2], "u": [0.5, 1.5]}))
    m.insert("D2", pd.DataFrame({"k": [2, 3], "v": [1.0, 2.0], "w": [3.0, 4.0]}))
    before = {n.name: m.view(n.name) for n in m.tree.materialized()}
    assert before[m.tree.root.name] == {}  # nothing joins yet
    facts = pd.DataFrame({"k": [1, 1, 3], "x": rng.normal(size=3), "y": rng.normal(size=3)})
    m.insert("F", facts)  # key 1 lacks D2, key 3 lacks D1: the join stays empty
    after = {n.name: m.view(n.name) for n in m.tree.materialized()}
    f_view = next(n.name for n in m.tree.materialized() if "F" in n.atoms and n.parent)
    assert set(after[f_view]) == {(1,), (3,)}  # the leaf's own view did change
    assert after[m.tree.root.name] == {}
    for name, content in before.items():
        if name != f_view:
            assert after[name].keys() == content.keys()
    # the key joins once D2 catches up: the result equals numpy moments of the join
    m.insert("D2", pd.DataFrame({"k": [1], "v": [5.0], "w": [-1.0]}))
    m.insert("D1", pd.DataFrame({"k": [3], "u": [2.5]}))
    d1 = pd.DataFrame({"k": [1, 2, 3], "u": [0.5, 1.5, 2.5]})
    d2 = pd.DataFrame({"k": [2, 3, 1], "v": [1.0, 2.0, 5.0], "w": [3.0, 4.0, -1.0]})
    joined = facts.merge(d1, on="k").merge(d2, on="k")
    x = joined[list(query.ring.variables)].to_numpy()
    count, sums, products = query.ring.moments(m.result())
    assert count == len(joined) == 3
    np.testing.assert_allclose(sums, x.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(products, x.T @ x, rtol=1e-12)
