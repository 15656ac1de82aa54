"""Maintenance plans (strategies as plan builders) and root deltas (the change of the result
each apply returns and subscribers receive)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pandas as pd
import pytest
from ringml.rings.categorical import GeneralizedCovarianceRing
from ringml.rings.covariance import CovarianceRing
from ringml.rings.scalar import IntegerRing, RealRing

from ringml import Maintainer, Query, SchemaError, covariance_query
from ringml.errors import BatchError
from ringml.plan import MaintenancePlan

SALES = {
    "Sales": ["store", "item", "units"],
    "Stores": ["store", "size"],
    "Items": ["item", "price"],
}


def names(plan: MaintenancePlan, ids) -> list[str]:
    return [plan.views[i].name for i in ids]


def test_fivm_plan_lists_views_with_stable_ids_and_triggers_naming_their_siblings():
    m = Maintainer(covariance_query(SALES))
    plan = m.plan
    assert plan.strategy == "fivm" and [v.id for v in plan.views] == list(range(len(plan.views)))
    assert plan.root == 0 and plan.views[0].name == "V@store_ISS"
    (sales,) = plan.triggers["Sales"]
    assert names(plan, [sales.leaf]) == ["Sales"]
    # Sales joins Items' view on item, then Stores' view on store
    assert [(plan.views[s.view].name, names(plan, s.siblings)) for s in sales.steps] == [
        ("V@units_S", []),
        ("V@item_IS", ["V@price_I"]),
        ("V@store_ISS", ["V@size_S"]),
    ]
    assert all(s.stored for s in sales.steps)
    leaf = plan.views[sales.leaf]
    assert leaf.is_leaf and leaf.keys == ("store", "item", "units") and not leaf.stored
    lifted = {v.name: v.lifted for v in plan.views if not v.is_leaf}
    assert lifted["V@store_ISS"] == () and lifted["V@units_S"] == ("units",)  # joins: not lifted
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.root = 1  # type: ignore[misc]
    # the same query and order give the same plan (ids are stable)
    assert Maintainer(covariance_query(SALES)).plan == plan
    text = m.explain()
    assert "maintenance plan (fivm):" in text and "δV@store_ISS[] = ⊕_{store}" in text


def test_first_order_plan_joins_a_delta_with_every_other_base_relation_connected_first():
    query = Query({"R": ["A", "B"], "S": ["B", "C"], "T": ["C", "D"]}, IntegerRing())
    plan = Maintainer(query, strategy="first_order").plan
    root = plan.views[plan.root]
    assert root.keys == () and set(root.marginalized) == {"A", "B", "C", "D"}
    (r,) = plan.triggers["R"]
    (t,) = plan.triggers["T"]
    assert [names(plan, s.siblings) for s in r.steps] == [["S", "T"]]
    assert [names(plan, s.siblings) for s in t.steps] == [["S", "R"]]
    assert all(plan.views[i].stored for i in root.children)
    recompute = Maintainer(query, strategy="recompute").plan
    assert recompute.recompute and all(
        not t.steps for ts in recompute.triggers.values() for t in ts
    )
    assert "evaluated from the stored leaves" in recompute.explain()


def test_self_joins_fire_one_trigger_per_occurrence():
    from ringml.query import Atom

    query = Query(
        {"E": ["x", "y"]},
        IntegerRing(),
        atoms=[Atom("E", ("A", "B"), "E1"), Atom("E", ("B", "C"), "E2")],
    )
    for strategy in ("fivm", "first_order", "recompute"):
        plan = Maintainer(query, strategy=strategy).plan
        assert [t.atom for t in plan.triggers["E"]] == ["E1", "E2"]


def test_stores_are_keyed_by_view_id_and_survive_pickling():
    m = Maintainer(covariance_query(SALES))
    m.insert("Stores", pd.DataFrame({"store": [1, 2], "size": [120.0, 300.0]}))
    m.insert("Items", pd.DataFrame({"item": [10, 11], "price": [2.5, 4.0]}))
    m.insert(
        "Sales", pd.DataFrame({"store": [1, 1, 2], "item": [10, 11, 10], "units": [3.0, 1, 7]})
    )
    assert set(m._stores) == set(m.plan.stored(loading=False))
    copy = pickle.loads(pickle.dumps(m))
    for mm in (m, copy):
        mm.delete("Sales", pd.DataFrame({"store": [1], "item": [11], "units": [1.0]}))
    a, b = m.query.ring.moments(m.result()), copy.query.ring.moments(copy.result())
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------------------------ root deltas
@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute", "higher_order"])
def test_apply_returns_the_change_of_each_group_and_subscribers_receive_it(strategy):
    query = Query({"R": ["A", "B"], "S": ["B", "C"]}, RealRing(["C"]), free=["A"])
    m = Maintainer(query, strategy=strategy)
    seen = []
    stop = m.subscribe(seen.append)
    m.insert("S", pd.DataFrame({"B": [1, 2], "C": [10.0, 0.0]}))
    assert seen == []  # nothing joined yet: the result did not change
    delta = m.insert("R", pd.DataFrame({"A": ["x", "y", "y"], "B": [1, 2, 1]}))
    assert seen == [delta]
    assert delta.to_dict() == {("x",): 10.0, ("y",): 10.0}
    frame = delta.to_frame().sort_values("A")
    assert frame["support"].tolist() == [1, 2]  # y appears with two derivations, one worth 0
    delta = m.update(
        "S", pd.DataFrame({"B": [2], "C": [0.0]}), pd.DataFrame({"B": [2], "C": [5.0]})
    )
    assert delta.to_dict() == {("y",): 5.0} and delta.support.tolist() == [0]
    delta = m.delete("R", pd.DataFrame({"A": ["x"], "B": [1]}))
    assert delta.to_dict() == {("x",): -10.0} and delta.support.tolist() == [-1]  # x vanishes
    assert dict(m.enumerate()) == {("y",): 15.0}
    with pytest.raises(BatchError):
        m.delete("R", pd.DataFrame({"A": ["x"], "B": [1]}))
    assert len(seen) == 3
    stop()
    m.insert("R", pd.DataFrame({"A": ["z"], "B": [2]}))
    assert len(seen) == 3


def test_one_apply_over_several_relations_and_occurrences_gives_one_change_per_group():
    query = Query({"R": ["A", "B"], "S": ["B", "C"]}, IntegerRing(), free=["A"])
    m = Maintainer(query)
    m.insert("S", pd.DataFrame({"B": [1], "C": [1]}))
    from ringml import UpdateBatch

    delta = m.apply(
        [
            UpdateBatch.inserts("R", pd.DataFrame({"A": [7, 8], "B": [1, 1]})),
            UpdateBatch.inserts("S", pd.DataFrame({"B": [1], "C": [2]})),
            UpdateBatch.deletes("R", pd.DataFrame({"A": [8], "B": [1]})),
        ]
    )
    assert delta.to_dict() == {(7,): 2}  # 8 came and went in the same apply: no change


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute", "higher_order"])
def test_kept_previous_payloads_are_the_groups_as_read_before_the_apply(strategy):
    """With keep_previous, one apply over several relations gives each changed group's
    payload before it, bit for bit (zero for a group it creates)."""
    from ringml import UpdateBatch

    query = Query({"R": ["A", "B"], "S": ["B", "C"]}, RealRing(["C"]), free=["A"])
    m = Maintainer(query, strategy=strategy)
    m.keep_previous = True
    rng = np.random.default_rng(3)
    for _ in range(20):
        before = m.groups().to_dict()
        r = pd.DataFrame({"A": rng.integers(0, 6, 4), "B": rng.integers(0, 3, 4)})
        s = pd.DataFrame({"B": rng.integers(0, 3, 3), "C": rng.standard_normal(3) * 1e3})
        delta = m.apply([UpdateBatch.inserts("S", s), UpdateBatch.inserts("R", r)])
        previous = dict(zip(delta.keys(), m.ring.batch_to_list(delta.previous), strict=True))
        assert previous == {k: before.get(k, 0.0) for k in delta.keys()}
        assert set(delta.keys()) <= set(m.groups().to_dict())


def test_covariance_deltas_and_nu_trees():
    m = Maintainer(covariance_query(SALES))
    m.insert("Stores", pd.DataFrame({"store": [1], "size": [100.0]}))
    m.insert("Items", pd.DataFrame({"item": [10], "price": [2.0]}))
    delta = m.insert("Sales", pd.DataFrame({"store": [1], "item": [10], "units": [3.0]}))
    ((key, change),) = delta.items()
    count, sums, _ = m.query.ring.moments(change)
    assert key == () and count == 1 and sums.tolist() == [3.0, 100.0, 2.0]
    nu = Maintainer(Query({"R": ["A", "B"]}, IntegerRing(), free=["A", "B"]), tree="nu")
    assert nu.insert("R", pd.DataFrame({"A": [1], "B": [2]})) is None
    with pytest.raises(SchemaError, match="factorized"):
        nu.subscribe(print)


# ------------------------------------------------------------------------------ ring hooks
def test_the_lift_hooks_default_to_the_product_of_the_lifts():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=50), rng.integers(0, 4, 50)
    groups = rng.integers(0, 5, 50)
    weights = rng.choice([-1, 1, 2], 50)
    for ring, columns in (
        (RealRing(["x", "y"]), [x, y.astype(float)]),
        (IntegerRing(["y"]), [y]),
        (GeneralizedCovarianceRing(["x"], ["y"]), [x, y]),
        (CovarianceRing(["x", "y"]), [x, y.astype(float)]),
    ):
        variables = ["x", "y"][-len(columns) :]
        lifts = [ring.batch_lift(v, c) for v, c in zip(variables, columns, strict=True)]
        product = lifts[0]
        for f in lifts[1:]:
            product = ring.batch_mul(product, f)
        expected = ring.batch_sum_by(ring.batch_scale(product, weights), groups, 5)
        got = ring.batch_lift_sum_by(variables, columns, groups, 5, weights)
        for a, b in zip(ring.batch_to_list(got), ring.batch_to_list(expected), strict=True):
            assert ring.equal(a, b, rtol=1e-12, atol=1e-12), type(ring).__name__


# ------------------------------------------------------------------------------ products
@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute", "higher_order"])
def test_a_cartesian_product_of_connected_pieces_is_the_product_of_their_results(strategy):
    from ringml.errors import VariableOrderError

    query = Query(
        {"R": ["A", "B"], "S": ["C", "D"], "T": ["D", "E"]}, RealRing(["B", "E"]), free=["A"]
    )
    assert query.components() == [["R"], ["S", "T"]] and not query.is_connected
    m = Maintainer(query, strategy=strategy)
    m.insert("R", pd.DataFrame({"A": [1, 1, 2], "B": [1.0, 2.0, 3.0]}))
    m.insert("S", pd.DataFrame({"C": [1, 2], "D": [5, 5]}))
    delta = m.insert("T", pd.DataFrame({"D": [5, 6], "E": [10.0, 1.0]}))
    # per A: SUM(B) over R times SUM(E) over S ⋈ T (= 2 * 10)
    assert m.result() == {(1,): 60.0, (2,): 60.0} == delta.to_dict()
    delta = m.delete("R", pd.DataFrame({"A": [1], "B": [2.0]}))
    assert delta.to_dict() == {(1,): -40.0} and m.result() == {(1,): 20.0, (2,): 60.0}
    if strategy == "fivm":
        assert "V@product[A] = V@A_R ⊗ V@E_ST" in m.explain()
    with pytest.raises(VariableOrderError, match="connected"):
        Maintainer(query, strategy=strategy, tree="nu")


def test_groups_read_the_result_and_trusted_deletes_keep_counts():
    query = Query(
        {"Sales": ["store", "units"], "Stores": ["store", "city"]},
        RealRing(["units"]),
        free=["city"],
    )
    m = Maintainer(query, trust_deletes=True)
    m.insert("Stores", pd.DataFrame({"store": [1, 2], "city": ["Oslo", "Rome"]}))
    m.insert("Sales", pd.DataFrame({"store": [1, 1, 2], "units": [3.0, 1.0, 7.0]}))
    delta = m.delete("Sales", pd.DataFrame({"store": [2], "units": [7.0]}))
    groups = m.groups()
    assert groups.to_dict() == {("Oslo",): 4.0} and groups.support.tolist() == [2]
    at = m.groups(at=delta.codes)  # Rome is gone: zero payload, no derivation left
    assert at.to_dict() == {("Rome",): 0.0} and at.support.tolist() == [0]
    assert m.description()["deletes"] == "trusted" and m._preparer.counts is None
    # trusted deletes are not checked: the caller vouches for them
    m.delete("Sales", pd.DataFrame({"store": [1], "units": [1.0]}))
    assert m.groups().support.tolist() == [1]
    nu = Maintainer(Query({"R": ["A", "B"]}, IntegerRing(), free=["A", "B"]), tree="nu")
    with pytest.raises(SchemaError, match="enumerate"):
        nu.groups()


def test_one_group_lift_sums_use_a_matrix_product_and_multiplicities_fold_into_weights():
    rng = np.random.default_rng(8)
    ring = CovarianceRing(["x", "y", "z"])
    columns = [rng.normal(5.0, 2.0, 500) for _ in range(3)]
    weights = rng.choice([-1, 1, 3], 500)
    lifted = ring.batch_lift_block(["x", "y", "z"], np.column_stack(columns))
    expected = ring.batch_sum(ring.batch_scale(lifted, weights))
    got = ring.batch_to_list(ring.batch_lift_sum_by(["x", "y", "z"], columns, None, 1, weights))[0]
    assert got.count == expected.count == int(weights.sum())
    assert ring.equal(got, expected, rtol=1e-12, atol=1e-9)
    # stored base relations hold multiples of one: their counts are the weights
    counts = ring.batch_scale(ring.batch_ones(3), np.array([2, -1, 4]))
    assert ring.batch_multiplicities(counts).tolist() == [2, -1, 4]
    assert ring.batch_multiplicities(lifted) is None
    assert IntegerRing().batch_multiplicities(np.array([3, 0])).tolist() == [3, 0]
    assert RealRing(["x"]).batch_multiplicities(np.array([1.5])) is None
