"""The higher-order strategy (DBToaster's viewlet transform) on the worked examples of the
DBToaster notes (T1, T2, T6: which maps it stores and the values after every update), on a
self-join (BSV), on static relations, and on random insert/delete streams against a pandas
flat join (the property suite of tests/test_property_streams.py runs it on every ring too)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from ringml.rings.scalar import IntegerRing, RealRing

from ringml.maintainer import Maintainer
from ringml.query import Atom, Query


def stored_views(m: Maintainer) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Every stored view (not the leaves) as (its atoms, its keys)."""
    plan = m.plan
    return {
        v.name: (frozenset(plan.views[c].name for c in v.children), frozenset(v.keys))
        for v in plan.views
        if not v.is_leaf and v.id in m._stores
    }


def test_count_of_a_product_keeps_the_first_order_deltas_and_inlines_the_second():
    """T1: Q = count(R × S), maps Q, Δ_R Q = count(S), Δ_S Q = count(R); Δ_RΔ_S Q = 1 is
    no map.  Values 6, 8, 12, 15, 18 after loading 2 and 3 tuples and inserting S, R, S, S."""
    m = Maintainer(Query({"R": ["A"], "S": ["B"]}), strategy="higher_order")
    assert set(stored_views(m).values()) == set(
        [
            (frozenset({"R", "S"}), frozenset()),
            (frozenset({"R"}), frozenset()),
            (frozenset({"S"}), frozenset()),
        ]
    )
    m.insert("R", pd.DataFrame({"A": [1, 2]}))
    m.insert("S", pd.DataFrame({"B": [1, 2, 3]}))
    values = [m.result()]
    for relation, value in [("S", 4), ("R", 3), ("S", 5), ("S", 6)]:
        m.insert(relation, pd.DataFrame({"A" if relation == "R" else "B": [value]}))
        values.append(m.result())
    assert values == [6, 8, 12, 15, 18]
    assert m.view("M1@S") == {(): 6} and m.view("M2@R") == {(): 3}


def test_orders_lineitem_trace_has_three_maps_and_constant_triggers():
    """T2: sum(LI.price * O.xch) over O ⋈ LI on ordk; maps Q, Q_O[ordk], Q_LI[ordk]."""
    query = Query(
        {"O": ["ordk", "custk", "xch"], "LI": ["ordk", "partk", "price"]},
        RealRing(["xch", "price"]),
    )
    m = Maintainer(query, strategy="higher_order")
    assert set(stored_views(m).values()) == set(
        [
            (frozenset({"O", "LI"}), frozenset()),
            (frozenset({"LI"}), frozenset({"ordk"})),
            (frozenset({"O"}), frozenset({"ordk"})),
        ]
    )
    for trigger in (t for ts in m.plan.triggers.values() for t in ts):
        # each update joins one map at most: constant work per update tuple
        assert all(len(s.siblings) <= 1 for s in trigger.steps)
    trace = [
        ("insert", "O", (1, 10, 2.0), 0.0),
        ("insert", "LI", (1, 100, 5.0), 10.0),
        ("insert", "LI", (1, 101, 3.0), 16.0),
        ("insert", "LI", (2, 100, 7.0), 16.0),
        ("insert", "O", (2, 11, 0.5), 19.5),
        ("insert", "O", (1, 12, 1.0), 27.5),
        ("delete", "LI", (1, 100, 5.0), 12.5),
        ("delete", "O", (1, 10, 2.0), 6.5),
    ]
    for method, relation, row, expected in trace:
        getattr(m, method)(relation, pd.DataFrame([row], columns=query.relations[relation]))
        assert m.result() == pytest.approx(expected), (method, relation, row)


def test_three_way_chain_stores_the_six_maps_of_the_optimized_program():
    """T6: R(A,B) ⋈ S(B,C) ⋈ T(C,D); Δ_S Q decomposes into mS1[B] ⊗ mS2[C]."""
    m = Maintainer(
        Query({"R": ["A", "B"], "S": ["B", "C"], "T": ["C", "D"]}), strategy="higher_order"
    )
    assert set(stored_views(m).values()) == set(
        [
            (frozenset({"R", "S", "T"}), frozenset()),
            (frozenset({"S", "T"}), frozenset({"B"})),  # mR
            (frozenset({"R", "S"}), frozenset({"C"})),  # mT
            (frozenset({"R"}), frozenset({"B"})),  # mS1
            (frozenset({"T"}), frozenset({"C"})),  # mS2
            (frozenset({"S"}), frozenset({"B", "C"})),  # mS
        ]
    )
    (s_trigger,) = m.plan.triggers["S"]
    root_step = next(s for s in s_trigger.steps if s.view == m.plan.root)
    assert len(root_step.siblings) == 2  # decomposed, not the product of R and T
    text = m.explain()
    assert "views:" in text and "δV@result[] = ⊕_{B, C} δS ⊗ M" in text
    values = []
    for relation, row in [
        ("R", (1, 1)), ("S", (1, 2)), ("T", (2, 5)), ("T", (2, 6)), ("R", (9, 1)),
        ("S", (1, 3)), ("T", (3, 0)),
    ]:  # fmt: skip
        m.insert(relation, pd.DataFrame([row], columns=m.query.relations[relation]))
        values.append(m.result())
    assert values == [0, 0, 1, 2, 4, 4, 6]


def test_self_join_variance_per_broker_is_maintained_under_deletes():
    """BSV: sum(x.volume·x.price·y.volume·y.price·0.5) over Bids x ⋈ Bids y on broker, the
    relation's two occurrences updated one after the other, against a pandas self-join."""
    query = Query(
        {"Bids": ["broker", "pv"]},
        IntegerRing(["pv1", "pv2"]),
        free=["broker"],
        atoms=[Atom("Bids", ("broker", "pv1"), "x"), Atom("Bids", ("broker", "pv2"), "y")],
    )
    m = Maintainer(query, strategy="higher_order")
    rng = np.random.default_rng(7)
    present = pd.DataFrame({"broker": [], "pv": []}, dtype=np.int64)
    for step in range(30):
        if step % 3 == 2 and len(present):
            gone = present.sample(n=min(len(present), int(rng.integers(1, 4))), random_state=step)
            m.delete("Bids", gone)
            present = present.drop(gone.index)
        else:
            new = pd.DataFrame({"broker": rng.integers(0, 3, 4), "pv": rng.integers(-5, 6, 4)})
            m.insert("Bids", new)
            present = pd.concat([present, new], ignore_index=True)
        joined = present.merge(present, on="broker")
        joined = joined.assign(p=joined.pv_x * joined.pv_y).groupby("broker").p.agg(["sum", "size"])
        expected = {(b,): int(s) for b, s in joined["sum"].items() if s != 0}
        got = {k: v for k, v in m.result().items() if v != 0}
        assert got == expected, step


def test_views_only_static_relations_need_are_dropped_after_loading():
    """SSB4-style: with T static, no delta view for T is kept once streaming starts, and
    the result still follows R and S."""
    query = Query({"R": ["A", "B"], "S": ["B", "C"], "T": ["C", "D"]})
    m = Maintainer(query, updatable=["R", "S"], strategy="higher_order")
    m.load("T", pd.DataFrame({"C": [1, 1, 2], "D": [1, 2, 3]}))
    while_loading = {v.name for v in m.plan.views if v.stored_while_loading}
    m.insert("R", pd.DataFrame({"A": [1, 2], "B": [1, 1]}))
    m.insert("S", pd.DataFrame({"B": [1, 1], "C": [1, 2]}))
    kept = set(stored_views(m))
    assert kept < while_loading
    for name in kept:  # no kept view is Δ_T of anything: each has T or lacks R and S
        atoms, _ = stored_views(m)[name]
        assert "T" in atoms or atoms <= {"R", "S"}
    assert not any(
        stored_views(m)[n][0] == frozenset({"R", "S"}) for n in kept
    )  # Δ_T Q = R ⋈ S is not kept
    assert m.result() == 2 * 2 + 2 * 1  # (2 R tuples on B=1) x (S to C=1: 2 T, C=2: 1 T)
    m.delete("R", pd.DataFrame({"A": [1], "B": [1]}))
    assert m.result() == 3


@pytest.mark.parametrize("seed", range(4))
def test_random_streams_equal_a_flat_join_with_free_variables(seed):
    """A star with a Cartesian piece: Q[A, E] = Σ B·D over R(A,B) ⋈ S(B,C) ⋈ T(C,D) × U(E)."""
    rng = np.random.default_rng(seed)
    relations = {"R": ["A", "B"], "S": ["B", "C"], "T": ["C", "D"], "U": ["E"]}
    query = Query(relations, IntegerRing(["B", "D"]), free=["A", "E"])
    m = Maintainer(query, strategy="higher_order")
    present = {r: pd.DataFrame(columns=c, dtype=np.int64) for r, c in relations.items()}
    for step in range(40):
        relation = list(relations)[int(rng.integers(0, 4))]
        frame = present[relation]
        if step % 4 == 3 and len(frame):
            gone = frame.sample(n=min(len(frame), 2), random_state=step)
            m.delete(relation, gone)
            present[relation] = frame.drop(gone.index)
        else:
            new = pd.DataFrame(rng.integers(0, 3, (3, len(relations[relation]))),
                               columns=relations[relation])  # fmt: skip
            m.insert(relation, new)
            present[relation] = pd.concat([frame, new], ignore_index=True)
        joined = (
            present["R"].merge(present["S"], on="B").merge(present["T"], on="C")
            .merge(present["U"], how="cross")
        )  # fmt: skip
        sums = (joined.B * joined.D).groupby([joined.A, joined.E]).sum()
        expected = {(int(a), int(e)): int(s) for (a, e), s in sums.items() if s != 0}
        got = {k: v for k, v in m.result().items() if v != 0}
        assert got == expected, step


def test_sql_view_of_broker_variance_follows_the_finance_trace():
    """The DBToaster notes' T7 trace on BSV as a SQL view kept by higher_order: one value
    per broker, maintained from constant-size delta views (one per occurrence of bids)."""
    from ringml.sql import Database

    db = Database(
        "CREATE TABLE bids (t DOUBLE, id BIGINT, broker_id BIGINT, price DOUBLE, volume DOUBLE)"
    )
    view = db.create_view(
        "bsv",
        """SELECT x.broker_id, SUM(x.volume * x.price * y.volume * y.price * 0.5) AS v
           FROM bids x, bids y WHERE x.broker_id = y.broker_id GROUP BY x.broker_id""",
        strategy="higher_order",
    )
    assert all(
        set(v.keys) == {next(iter(view.maintainer.query.free))}
        for v in view.maintainer.plan.views
        if not v.is_leaf
    )
    columns = ["t", "id", "broker_id", "price", "volume"]
    trace = [
        ("insert", (1, 1, 1, 100, 10), {1: 500000}),
        ("insert", (2, 2, 1, 101, 20), {1: 4560200}),
        ("insert", (4, 4, 2, 102, 30), {1: 4560200, 2: 4681800}),
        ("delete", (2, 2, 1, 101, 20), {1: 500000, 2: 4681800}),
        ("insert", (7, 7, 2, 98, 5), {1: 500000, 2: 6301250}),
    ]
    for method, row, expected in trace:
        getattr(db, method)("bids", pd.DataFrame([row], columns=columns))
        got = view.to_pandas()
        assert dict(zip(got.broker_id, got.v, strict=True)) == pytest.approx(expected)


def test_a_pickled_maintainer_goes_on_as_the_original():
    import pickle

    query = Query({"R": ["A", "B"], "S": ["B", "C"]}, IntegerRing(["C"]), free=["A"])
    m = Maintainer(query, strategy="higher_order")
    m.insert("R", pd.DataFrame({"A": [1, 2], "B": [1, 1]}))
    m.insert("S", pd.DataFrame({"B": [1, 1], "C": [3, 4]}))
    copy = pickle.loads(pickle.dumps(m))
    for mm in (m, copy):
        mm.delete("S", pd.DataFrame({"B": [1], "C": [3]}))
        mm.insert("R", pd.DataFrame({"A": [3], "B": [1]}))
    assert m.result() == copy.result() == {(1,): 4, (2,): 4, (3,): 4}
    assert m.description()["strategy"] == "higher_order"


def test_a_join_needing_too_many_delta_views_is_refused_with_a_clear_error():
    from ringml.errors import SchemaError

    # a star whose leaves hang off a centre variable Y: a delta of any set of the S_i keeps
    # the rest joined through Y, keyed by the removed ones' Z_i -- one view per subset
    # (a star joined on the deltas' own variable, by contrast, decomposes: linear)
    star = {f"R{i}": ["A", f"B{i}"] for i in range(14)}
    assert len(Maintainer(Query(star), strategy="higher_order").plan.views) == 1 + 14 + 14
    relations = {f"R{i}": ["Y", f"Z{i}"] for i in range(10)}
    relations |= {f"S{i}": [f"Z{i}"] for i in range(10)}
    with pytest.raises(SchemaError, match="more than 1024 delta views.*fivm"):
        Maintainer(Query(relations), strategy="higher_order")
