"""Derivation counts read from the covariance ring's payload counts (Ring.counts_derivations):
the same counts as tracked alongside, keys removed at 0, pickles old and new."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
from ringml.rings.scalar import IntegerRing

from ringml import Maintainer, UpdateBatch
from ringml.applications import covariance_query
from ringml.store import ViewStore

SCHEMA = {"R": ["a", "x"], "S": ["a", "b", "y"], "T": ["b", "z"]}


def stream(seed: int, batches: int = 40):
    """Random inserts of fresh rows and deletes of present ones."""
    rng = np.random.default_rng(seed)
    present = {r: [] for r in SCHEMA}
    for _ in range(batches):
        relation = str(rng.choice(list(SCHEMA)))
        rows, signs = [], []
        for _ in range(int(rng.integers(1, 12))):
            if present[relation] and rng.random() < 0.4:
                rows.append(present[relation].pop(int(rng.integers(len(present[relation])))))
                signs.append(-1)
            else:
                row = tuple(int(v) for v in rng.integers(0, 4, len(SCHEMA[relation])))
                present[relation].append(row)
                rows.append(row)
                signs.append(1)
        frame = pd.DataFrame(rows, columns=SCHEMA[relation])
        yield UpdateBatch(relation, frame, np.asarray(signs)), present


def flat_count(present) -> int:
    r = pd.DataFrame(present["R"], columns=SCHEMA["R"])
    s = pd.DataFrame(present["S"], columns=SCHEMA["S"])
    t = pd.DataFrame(present["T"], columns=SCHEMA["T"])
    return len(r.merge(s, on="a").merge(t, on="b"))


def check_stores(m: Maintainer) -> None:
    for store in m._stores.values():
        live = store.index.live_slots()
        counts = store.payload.count
        assert store.support is counts  # no second array of counts
        assert (counts[live] > 0).all()  # a key lives while it has derivations
        dead = np.ones(counts.size, dtype=bool)
        dead[live] = False
        assert not counts[dead].any()


def test_counts_follow_the_payloads_through_a_stream_and_a_pickle():
    query = covariance_query(SCHEMA)
    assert query.ring.counts_derivations and not IntegerRing().counts_derivations
    m = Maintainer(query)
    for i, (batch, present) in enumerate(stream(1)):
        delta = m.apply(batch)
        check_stores(m)
        assert m.result().count == flat_count(present)
        assert delta.support is None or np.array_equal(delta.support, delta.payload.count)
        if i == 20:
            m = pickle.loads(pickle.dumps(m))
            check_stores(m)
    groups = m.groups()
    assert np.array_equal(groups.support, groups.payload.count)


def test_a_store_pickled_with_its_own_counts_keeps_them():
    ring = covariance_query({"R": ["a", "x"]}).ring
    store = ViewStore(("a",), ring)
    store.add(np.array([[1], [2]]), ring.batch_lift("x", np.array([1.0, 2.0])), np.ones(2, int))
    state = dict(store.__dict__)
    state["support"] = store.support.copy()  # the layout before derived counts
    del state["_support"], state["_derived"]
    old = pickle.loads(pickle.dumps(store))
    old.__setstate__(state)
    assert old.support is not old.payload.count
    assert old.support.tolist() == store.support.tolist()
    gone = ring.batch_neg(ring.batch_lift("x", np.array([2.0])))
    old.add(np.array([[2]]), gone, np.array([-1]))  # key 2 loses its only derivation
    assert len(old) == 1 and old.lookup(np.array([[2]]))[0] == -1
    assert old.support[old.lookup(np.array([[1]]))[0]] == 1
