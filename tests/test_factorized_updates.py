"""Factorizable updates (F-IVM §7, Example 10): a delta given as a product of small relations
is propagated without expanding the product, and equals the expanded delta's effect."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ringml.rings import IntegerRing, RealRing

import ringml.maintainer as maintainer_module
from ringml import BatchError, Maintainer, Query, covariance_query

FIG3 = "A{ B{R}, C{ D{T}, E{S} } }"
RELATIONS = {"R": ["A", "B"], "S": ["A", "C", "E"], "T": ["C", "D"]}
R = pd.DataFrame({"A": [1, 1, 2, 3], "B": [1, 2, 3, 4]})
S = pd.DataFrame({"A": [1, 1, 1, 2], "C": [1, 1, 2, 2], "E": [1, 2, 3, 4]})
T = pd.DataFrame({"C": [1, 2, 2, 3], "D": [1, 2, 3, 4]})


def loaded(query: Query, strategy: str = "fivm", **options) -> Maintainer:
    m = Maintainer(query, order=FIG3, strategy=strategy, **options)
    m.insert("R", R)
    m.insert("S", S)
    m.insert("T", T)
    return m


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute"])
def test_example_10_w15(strategy):
    """δS = δS_A ⊗ δS_C ⊗ δS_E: factors 3, 1, 2 give δroot = 6 and the count 16."""
    m = loaded(Query(RELATIONS, IntegerRing()), strategy)
    assert m.result() == 10
    factors = [pd.DataFrame({"A": [1, 2]}), pd.DataFrame({"C": [1]}), pd.DataFrame({"E": [5, 6]})]
    m.apply_factorized("S", factors)
    assert m.result() == 16
    expanded = factors[0].merge(factors[1], how="cross").merge(factors[2], how="cross")
    m.delete("S", expanded[["A", "C", "E"]])  # the expanded tuples are really there
    assert m.result() == 10


def test_product_is_never_expanded(monkeypatch):
    """100,000 E-values under one (A, C): views get the product over their own keys only."""
    m = loaded(Query(RELATIONS, IntegerRing()), allow_absent_deletes=True)

    def refuse(frames):
        raise AssertionError("the factorized delta was expanded")

    monkeypatch.setattr(maintainer_module, "_cross_product", refuse)
    factors = [
        pd.DataFrame({"A": [1]}),
        pd.DataFrame({"C": [1]}),
        pd.DataFrame({"E": np.arange(100, 100_100)}),
    ]
    m.apply_factorized("S", factors)
    # V@B_R[1] = 2 and V@D_T[1] = 1: the join gains 2 · 1 · 100,000 tuples
    assert m.result() == 10 + 200_000
    assert m.view("V@E_S")[(1, 1)] == 2 + 100_000
    m.apply_factorized("S", factors, multiplicity=-1)
    assert m.result() == 10


def rows(draw, columns):
    n = draw(st.integers(1, 3))
    return pd.DataFrame({c: [draw(st.integers(1, 4)) for _ in range(n)] for c in columns})


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_factorized_equals_expanded_with_deletes(data):
    """Random factorized inserts and deletes: covariance and grouped counts equal the
    maintainer fed the expanded tuples, after every update."""
    grouped = data.draw(st.booleans())
    make = (
        (lambda: Query(RELATIONS, IntegerRing(["E"]), free=["A"]))
        if grouped
        else (lambda: covariance_query(RELATIONS))
    )
    fact, flat = loaded(make()), loaded(make())
    history = []
    for _ in range(data.draw(st.integers(1, 8))):
        if history and data.draw(st.integers(0, 2)) == 0:  # delete an earlier update
            relation, factors = history.pop(data.draw(st.integers(0, len(history) - 1)))
            sign = -1
        else:
            relation = data.draw(st.sampled_from(sorted(RELATIONS)))
            columns = RELATIONS[relation]
            cut = data.draw(st.integers(1, len(columns) - 1))
            factors = [rows(data.draw, columns[:cut]), rows(data.draw, columns[cut:])]
            history.append((relation, factors))
            sign = 1
        fact.apply_factorized(relation, factors, multiplicity=sign)
        expanded = factors[0].merge(factors[1], how="cross")[RELATIONS[relation]]
        (flat.insert if sign > 0 else flat.delete)(relation, expanded)
        if grouped:
            assert fact.result() == flat.result()
        else:
            a, b = fact.query.ring.moments(fact.result()), flat.query.ring.moments(flat.result())
            assert a[0] == b[0]
            np.testing.assert_allclose(a[1], b[1], rtol=1e-12)
            np.testing.assert_allclose(a[2], b[2], rtol=1e-12)


def test_bad_factorized_updates_change_nothing():
    m = loaded(Query(RELATIONS, IntegerRing()))
    with pytest.raises(BatchError, match="cover"):
        m.apply_factorized("S", [pd.DataFrame({"A": [1]}), pd.DataFrame({"C": [1]})])
    with pytest.raises(BatchError, match="cover"):
        m.apply_factorized(
            "S", [pd.DataFrame({"A": [1], "C": [1]}), pd.DataFrame({"C": [1], "E": [1]})]
        )
    with pytest.raises(BatchError, match="not present"):
        m.apply_factorized(
            "S", [pd.DataFrame({"A": [1, 3]}), pd.DataFrame({"C": [1], "E": [1]})], multiplicity=-1
        )
    with pytest.raises(BatchError, match="unknown relation"):
        m.apply_factorized("X", [pd.DataFrame({"A": [1]})])
    assert m.result() == 10
    static = Maintainer(Query(RELATIONS, IntegerRing()), order=FIG3, updatable=["R"])
    with pytest.raises(BatchError, match="static"):
        static.apply_factorized("S", [pd.DataFrame({"A": [1]}), pd.DataFrame({"C": [1], "E": [1]})])


@pytest.mark.parametrize("multiplicity", [float("nan"), 2**70, 0.5, True, "1", 0])
def test_bad_factorized_multiplicities_are_named(multiplicity):
    """NaN raised a bare ValueError, 2**70 an OverflowError (or 'got object')."""
    m = loaded(Query(RELATIONS, IntegerRing()))
    factors = [pd.DataFrame({"A": [1]}), pd.DataFrame({"C": [1], "E": [1]})]
    with pytest.raises(BatchError, match="multiplicity must be a non-zero integer within int64"):
        m.apply_factorized("S", factors, multiplicity=multiplicity)
    assert m.result() == 10


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute", "higher_order"])
def test_factorized_updates_reach_subscribers(strategy):
    """Under fivm the factorized path never published the result's change."""
    query = Query({"R": ["A", "B"], "S": ["A", "C"]}, IntegerRing(), free=["A"])
    m = Maintainer(query, strategy=strategy)
    seen: dict = {}

    def mirror(delta):
        for key, value in delta.items():
            seen[key] = seen.get(key, 0) + value

    m.subscribe(mirror)
    m.insert("R", pd.DataFrame({"A": [1, 2], "B": [1, 1]}))
    delta = m.apply_factorized("S", [pd.DataFrame({"A": [1, 2]}), pd.DataFrame({"C": [5, 6]})])
    assert dict(delta.items()) == {(1,): 2, (2,): 2}
    assert seen == m.result() == {(1,): 2, (2,): 2}


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute", "higher_order"])
@pytest.mark.parametrize("subscribed", [False, True])
def test_factorized_updates_of_a_filtered_relation_agree_everywhere(strategy, subscribed):
    """fivm refused a filtered relation's factors unless someone had subscribed; the other
    strategies took them: now every strategy expands and filters them alike."""
    query = Query({"S": ["A", "C"], "R": ["A", "B"]}, IntegerRing(), free=["A"],
                  filters={"S": "C > 0"})  # fmt: skip
    m = Maintainer(query, strategy=strategy)
    if subscribed:
        m.subscribe(lambda delta: None)
    m.insert("R", {"A": [1, 2], "B": [0, 0]})
    delta = m.apply_factorized("S", [pd.DataFrame({"A": [1, 2]}), pd.DataFrame({"C": [0, 5]})])
    assert dict(delta.items()) == m.result() == {(1,): 1, (2,): 1}
    m.apply_factorized("S", [pd.DataFrame({"A": [1]}), pd.DataFrame({"C": [0, 5]})], -1)
    assert m.result() == {(2,): 1}


def test_a_rejected_factorized_update_keeps_the_loading_phase_open():
    """A rejected apply_factorized (an int64 overflow) ended the loading phase, unlike a
    rejected apply: the static relation could no longer be loaded."""
    query = Query({"R": ["A", "B"], "S": ["A", "C"]}, IntegerRing(["B"]), free=["A"])
    m = Maintainer(query, updatable=["R"])
    m.load("S", {"A": [1], "C": [0]})
    with pytest.raises(BatchError, match="overflow"):
        m.apply_factorized("R", [pd.DataFrame({"A": [1]}), pd.DataFrame({"B": [2**62, 2**62]})])
    assert m.result() == {}
    m.load("S", {"A": [2], "C": [0]})
    m.apply_factorized("R", [pd.DataFrame({"A": [1, 2]}), pd.DataFrame({"B": [3]})])
    assert m.result() == {(1,): 3, (2,): 3}
    with pytest.raises(Exception, match="streaming has started"):
        m.load("S", {"A": [3], "C": [0]})


def test_factorized_update_joining_an_empty_sibling_with_an_unseen_lifted_variable():
    """δR joins S in a view that also lifts S's C: while S is empty, C's dictionary holds no
    value yet, and the lift of no rows crashed (TypeError) instead of adding nothing."""
    m = Maintainer(Query({"R": ["A", "B"], "S": ["B", "C"]}, RealRing(["C"])), order="C{B{A}}")
    m.insert("R", pd.DataFrame({"A": [1], "B": [1]}))  # ends loading: the factorized path
    m.apply_factorized("R", [pd.DataFrame({"A": [2, 3]}), pd.DataFrame({"B": [1, 2]})])
    assert m.result() == 0.0
    s = pd.DataFrame({"B": [1, 2, 2], "C": [0.5, 2.0, -1.25]})
    m.insert("S", s)
    r = pd.DataFrame({"A": [1, 2, 3, 2, 3], "B": [1, 1, 1, 2, 2]})
    assert m.result() == r.merge(s, on="B")["C"].sum()  # SUM(C) over the join
