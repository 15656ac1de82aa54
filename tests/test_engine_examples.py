"""F-IVM's worked examples (notes §13, W2-W18) run through the engine.

Data is the Fig. 6 database instantiated numerically (notes §13): every value ``x_i = i`` and
every payload 1.  View names are the engine's (``V@<variable>_<relation initials>``, see
``Maintainer.explain()``).  These tests use τ view trees (the default: one view per variable,
all free variables kept in the views above them); where the notes give an ``H^{@X}`` view we
check the τ view that holds the same relation.  ν's H/V views are tested in
``test_nu_trees.py``.
"""

from __future__ import annotations

from itertools import product

import numpy as np
import pandas as pd
import pytest
from ringml.rings.scalar import IntegerRing

from ringml import operators
from ringml.batch import UpdateBatch
from ringml.errors import BatchError, SchemaError, VariableOrderError
from ringml.maintainer import Maintainer
from ringml.query import Atom, Query
from ringml.variable_order import (
    VariableOrder,
    closure,
    is_acyclic,
    is_free_connex,
    is_hierarchical,
    is_q_hierarchical,
    sigma_reduct,
)
from ringml.view_tree import ViewNode, ViewTree

RELS = {"R": ["A", "B"], "S": ["A", "C", "E"], "T": ["C", "D"]}
RELS_H = {"R": ["A", "B"], "S": ["A", "C", "E"], "T": ["A", "C", "D"]}  # Q_h of Ex. 15
FIG3 = "A{ B{R}, C{ D{T}, E{S} } }"


def fig6() -> dict[str, pd.DataFrame]:
    return {
        "R": pd.DataFrame({"A": [1, 1, 2, 3], "B": [1, 2, 3, 4]}),
        "S": pd.DataFrame({"A": [1, 1, 1, 2], "C": [1, 1, 2, 2], "E": [1, 2, 3, 4]}),
        "T": pd.DataFrame({"C": [1, 2, 2, 3], "D": [1, 2, 3, 4]}),
    }


def fig6_h() -> dict[str, pd.DataFrame]:
    data = fig6()
    data["T"] = pd.DataFrame({"A": [1, 1, 1, 2], "C": [1, 2, 2, 2], "D": [1, 2, 3, 2]})
    return data


def fig3_maintainer(ring=None, free=(), updatable=None, strategy="fivm") -> Maintainer:
    query = Query(RELS, ring or IntegerRing(), free=list(free))
    order = VariableOrder.parse(FIG3, query)
    return Maintainer(query, updatable=updatable, order=order, strategy=strategy)


def load(m: Maintainer, data: dict[str, pd.DataFrame]) -> Maintainer:
    for name, frame in data.items():
        m.insert(name, frame)
    return m


def plain(view: dict) -> dict:
    """View contents with numpy scalars turned into Python ints (for readable diffs)."""
    return {tuple(int(x) for x in k): int(v) for k, v in view.items()}


def view_names(m: Maintainer) -> set[str]:
    return {n.name for n in m.tree.materialized() if isinstance(n, ViewNode)}


def brute_force(data: dict[str, pd.DataFrame], free: list[str], lifted=()) -> dict:
    """SUM(∏ lifted) GROUP BY free over the pandas join (count when ``lifted`` is empty)."""
    joined = data["R"].merge(data["S"]).merge(data["T"])
    weight = np.ones(len(joined), dtype=np.int64)
    for v in lifted:
        weight = weight * joined[v].to_numpy()
    joined = joined.assign(_w=weight)
    if not free:
        return {(): int(joined["_w"].sum())}
    grouped = joined.groupby(free)["_w"].sum()
    return {tuple(int(x) for x in (k if isinstance(k, tuple) else (k,))): int(v)
            for k, v in grouped.items() if v != 0}  # fmt: skip


# ------------------------------------------------------------------------------ W2
def test_w2_count_view_tree_fig6():
    m = load(fig3_maintainer(), fig6())
    assert plain(m.view("V@B_R")) == {(1,): 2, (2,): 1, (3,): 1}
    assert plain(m.view("V@E_S")) == {(1, 1): 2, (1, 2): 1, (2, 2): 1}
    assert plain(m.view("V@D_T")) == {(1,): 1, (2,): 2, (3,): 1}
    assert plain(m.view("V@C_ST")) == {(1,): 4, (2,): 2}
    assert plain(m.view("V@A_RST")) == {(): 10}
    assert m.result() == 10
    # the view tree is Fig. 3 (right): one view per variable, keyed by dep(X)
    explained = m.explain()
    for line in (
        "V@A_RST[] = ⊕_{A} V@B_R ⊗ V@C_ST",
        "V@B_R[A] = ⊕_{B} R",
        "V@C_ST[A] = ⊕_{C} V@D_T ⊗ V@E_S",
        "V@D_T[C] = ⊕_{D} T",
        "V@E_S[A, C] = ⊕_{E} S",
    ):
        assert line in explained


@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute"])
def test_w2_count_every_strategy(strategy):
    m = load(fig3_maintainer(strategy=strategy), fig6())
    assert m.result() == 10


# ------------------------------------------------------------------------------ W3
def test_w3_delta_of_example7():
    m = load(fig3_maintainer(), fig6())
    before = {name: plain(m.view(name)) for name in ("V@D_T", "V@C_ST", "V@A_RST")}
    delta_t = pd.DataFrame({"C": [1, 2], "D": [1, 2]})
    m.apply(UpdateBatch("T", delta_t, np.array([-1, 3])))

    def delta(name):
        after = plain(m.view(name))
        keys = set(after) | set(before[name])
        out = {k: after.get(k, 0) - before[name].get(k, 0) for k in keys}
        return {k: v for k, v in out.items() if v}

    assert delta("V@D_T") == {(1,): -1, (2,): 3}
    assert delta("V@C_ST") == {(1,): 1, (2,): 3}
    assert delta("V@A_RST") == {(): 5}
    assert m.result() == 15
    # key c1 of V@D_T vanished with its last T-tuple
    assert plain(m.view("V@D_T")) == {(2,): 5, (3,): 1}
    # recomputation over T' = {(2,2)->4, (2,3)->1, (3,4)->1}
    t_prime = pd.DataFrame({"C": [2, 2, 2, 2, 2, 3], "D": [2, 2, 2, 2, 3, 4]})
    fresh = load(fig3_maintainer(), {**fig6(), "T": t_prime})
    assert fresh.result() == 15
    for name in ("V@B_R", "V@C_ST", "V@D_T", "V@E_S", "V@A_RST"):
        assert plain(m.view(name)) == plain(fresh.view(name))


def test_w3_delete_removes_key():
    m = load(fig3_maintainer(), fig6())
    m.delete("R", pd.DataFrame({"A": [3], "B": [4]}))
    assert plain(m.view("V@B_R")) == {(1,): 2, (2,): 1}
    assert m.result() == 10


# ------------------------------------------------------------------------------ W4
W4_TABLE = [
    ({"T"}, {"V@A_RST", "V@E_S", "V@B_R"}),
    ({"R"}, {"V@A_RST", "V@C_ST"}),
    ({"S"}, {"V@A_RST", "V@B_R", "V@D_T"}),
    ({"R", "S", "T"}, {"V@A_RST", "V@B_R", "V@C_ST", "V@D_T", "V@E_S"}),
    (set(), {"V@A_RST"}),
]


@pytest.mark.parametrize(("updatable", "stored"), W4_TABLE)
def test_w4_materialized_views(updatable, stored):
    query = Query(RELS, IntegerRing())
    order = VariableOrder.parse(FIG3, query)
    tree = ViewTree.build(query, order, updatable)
    assert {n.name for n in tree.materialized() if isinstance(n, ViewNode)} == stored
    m = Maintainer(query, updatable=sorted(updatable), order=order)
    assert view_names(m) == stored
    data = fig6()
    for name in sorted(data, key=lambda r: r in updatable):  # static relations first
        if name in updatable:
            m.insert(name, data[name])
        else:
            m.load(name, data[name])
    # after streaming starts only the materialized views are kept
    m.apply([])
    assert m.result() == 10
    for node in m.tree.views():
        if node.name in stored:
            m.view(node.name)
        else:
            with pytest.raises(KeyError, match="not materialized"):
                m.view(node.name)


# ------------------------------------------------------------------------------ W5
def test_w5_group_by_sum():
    m = load(fig3_maintainer(IntegerRing(["B", "D", "E"]), free=["A", "C"]), fig6())
    assert plain(m.view("V@B_R")) == {(1,): 3, (2,): 3, (3,): 4}
    assert plain(m.view("V@E_S")) == {(1, 1): 3, (1, 2): 3, (2, 2): 4}
    assert plain(m.view("V@D_T")) == {(1,): 1, (2,): 5, (3,): 4}
    expected = {(1, 1): 9, (1, 2): 45, (2, 2): 60}
    assert plain(m.result()) == expected
    assert expected == brute_force(fig6(), ["A", "C"], lifted=["B", "D", "E"])
    # the default order (free-connex) and the other strategies agree
    query = Query(RELS, IntegerRing(["B", "D", "E"]), free=["A", "C"])
    for strategy in ("fivm", "first_order", "recompute"):
        assert plain(load(Maintainer(query, strategy=strategy), fig6()).result()) == expected


# ------------------------------------------------------------------------------ W6
def test_w6_auto_order_heuristic():
    query = Query(RELS, IntegerRing())
    order = VariableOrder.auto(query)
    assert order.parent == {"A": None, "B": "A", "C": "A", "D": "C", "E": "C"}
    assert {v: order.dep(v, query) for v in "ABCDE"} == {
        "A": set(),
        "B": {"A"},
        "C": {"A"},
        "D": {"C"},
        "E": {"A", "C"},
    }
    query_h = Query(RELS_H, IntegerRing())
    assert VariableOrder.auto(query_h).parent == order.parent
    # a query without free variables uses the heuristic by default
    assert Maintainer(query).order.parent == order.parent


# ------------------------------------------------------------------------------ W7
def test_w7_query_classes_and_closure():
    q = Query(RELS, IntegerRing(), free=["A", "B", "C"])
    assert is_acyclic(q) and is_free_connex(q)
    triangle = Query({"R": ["A", "B"], "S": ["B", "C"], "T": ["A", "C"]}, IntegerRing())
    assert not is_acyclic(triangle)
    assert not is_free_connex(Query(RELS, IntegerRing(), free=["B", "C"]))
    assert not is_hierarchical(q)
    q_h = Query(RELS_H, IntegerRing(), free=["A", "B", "C"])
    assert is_hierarchical(q_h) and is_q_hierarchical(q_h)
    q_h_bound_a = Query(RELS_H, IntegerRing(), free=["B", "C"])
    assert is_hierarchical(q_h_bound_a) and not is_q_hierarchical(q_h_bound_a)
    fds = [({"A"}, {"D"}), ({"B", "D"}, {"E"})]
    assert closure({"A", "B", "C"}, fds) == {"A", "B", "C", "D", "E"}


def test_w7_example17_sigma_reduct_order():
    """Ex. 17: with B→C, C→D the Σ-reduct is q-hierarchical; its canonical order is used."""
    q = Query({"R": ["A", "B"], "S": ["B", "C"], "T": ["C", "D"]}, free=["A", "B", "C", "D"])
    fds = [({"B"}, {"C"}), ({"C"}, {"D"})]
    assert not is_hierarchical(q)
    reduct = sigma_reduct(q, fds)
    assert {a.name: set(a.variables) for a in reduct.atoms} == {
        "R": {"A", "B", "C", "D"},
        "S": {"B", "C", "D"},
        "T": {"C", "D"},
    }
    assert is_q_hierarchical(reduct)
    order = VariableOrder.from_functional_dependencies(q, fds)
    # C and D have equal rels and are both free: either may be on top (ties go by name)
    assert order.parent in (
        {"D": None, "C": "D", "B": "C", "A": "B"},
        {"C": None, "D": "C", "B": "D", "A": "B"},
    )
    assert order.is_free_top(q.free)
    # maintaining Q over that order gives the brute-force result
    data = {
        "R": pd.DataFrame({"A": [1, 2, 3, 4], "B": [1, 1, 2, 3]}),
        "S": pd.DataFrame({"B": [1, 2, 3], "C": [10, 10, 20]}),
        "T": pd.DataFrame({"C": [10, 20], "D": [7, 8]}),
    }
    m = load(Maintainer(q, order=order), data)
    joined = data["R"].merge(data["S"]).merge(data["T"])
    assert plain(m.result()) == {
        tuple(int(x) for x in row): 1 for row in joined[list("ABCD")].values
    }


# ------------------------------------------------------------------------------ W8
W8_ENUMERATION = {(1, 1, 1): 2, (1, 1, 2): 2, (1, 2, 1): 2, (1, 2, 2): 2, (2, 3, 2): 2}


@pytest.mark.parametrize("order", ["fig3", "auto"])
def test_w8_free_connex_enumeration(order):
    query = Query(RELS, IntegerRing(), free=["A", "B", "C"])
    chosen = VariableOrder.parse(FIG3, query) if order == "fig3" else None
    m = load(Maintainer(query, order=chosen), fig6())
    assert m.order.is_free_top(query.free)
    enumerated = list(m.enumerate())
    assert len(enumerated) == len({k for k, _ in enumerated})  # no group twice
    assert plain(dict(enumerated)) == W8_ENUMERATION
    assert W8_ENUMERATION == brute_force(fig6(), ["A", "B", "C"])
    assert sum(W8_ENUMERATION.values()) == 10
    if order == "fig3":
        # V@C_ST[A, C] = V@D_T ⊗ V@E_S holds H^{@C}_{ST} of Ex. 12; V@B_R[A, B] is R itself
        assert plain(m.view("V@C_ST")) == {(1, 1): 2, (1, 2): 2, (2, 2): 2}
        assert plain(m.view("V@B_R")) == {(1, 1): 1, (1, 2): 1, (2, 3): 1, (3, 4): 1}
        # Ex. 14: the payload of (a, b, c) is R[a, b] · H^{@C}[a, c]
        r, h = m.view("V@B_R"), m.view("V@C_ST")
        for (a, b, c), payload in m.enumerate():
            assert payload == r[(a, b)] * h[(a, c)]


def test_w8_enumeration_after_deletes_drops_groups():
    query = Query(RELS, IntegerRing(), free=["A", "B", "C"])
    m = load(Maintainer(query, order=VariableOrder.parse(FIG3, query)), fig6())
    m.delete("T", pd.DataFrame({"C": [1], "D": [1]}))
    data = fig6()
    data["T"] = data["T"].iloc[1:]
    assert plain(m.result()) == brute_force(data, ["A", "B", "C"])
    assert (1, 1, 1) not in m.result()


# ------------------------------------------------------------------------------ W9
W9_VIEWS = {
    "V@B_R": {(1, 1): 1, (1, 2): 1, (2, 3): 1, (3, 4): 1},  # B is free: R itself
    "V@E_S": {(1, 1): 2, (1, 2): 1, (2, 2): 1},
    "V@D_T": {(1, 1): 1, (1, 2): 2, (2, 2): 1},
    "V@C_ST": {(1, 1): 2, (1, 2): 2, (2, 2): 1},  # H^{@C}_{ST}
}


def q_hierarchical_maintainer() -> Maintainer:
    query = Query(RELS_H, IntegerRing(), free=["A", "B", "C"])
    return Maintainer(query, order="canonical")


def record_deltas(m: Maintainer, monkeypatch) -> list[tuple[str, int, int]]:
    """Instrument F-IVM's delta step: (view, rows in, keys out) per step."""
    log: list[tuple[str, int, int]] = []
    original = operators.step

    def step(ctx, view, siblings, delta):
        out = original(ctx, view, siblings, delta)
        log.append(
            (
                view.name,
                ctx.ring.batch_len(operators.payload(ctx, delta)),
                ctx.ring.batch_len(out.payload),
            )
        )
        return out

    monkeypatch.setattr(operators, "step", step)
    return log


def test_w9_canonical_order_shape():
    query = Query(RELS_H, IntegerRing(), free=["A", "B", "C"])
    order = VariableOrder.canonical(query)
    assert order.parent == {"A": None, "B": "A", "C": "A", "E": "C", "D": "C"}
    assert order.is_free_top(query.free)
    # every root-to-leaf path is exactly one relation's schema
    leaves = [v for v in order.variables if not order.children.get(v)]
    paths = {frozenset([leaf, *order.ancestors(leaf)]) for leaf in leaves}
    assert paths == {frozenset(cols) for cols in RELS_H.values()}
    with pytest.raises(VariableOrderError, match="not q-hierarchical"):
        VariableOrder.canonical(Query(RELS, IntegerRing(), free=["A", "B", "C"]))


def test_w9_views_and_enumeration():
    m = load(q_hierarchical_maintainer(), fig6_h())
    for name, content in W9_VIEWS.items():
        assert plain(m.view(name)) == content
    expected = {(1, 1, 1): 2, (1, 1, 2): 2, (1, 2, 1): 2, (1, 2, 2): 2, (2, 3, 2): 1}
    assert plain(m.result()) == expected


def test_w9_single_tuple_deltas_have_constant_size(monkeypatch):
    m = load(q_hierarchical_maintainer(), fig6_h())
    log = record_deltas(m, monkeypatch)

    m.insert("T", pd.DataFrame({"A": [2], "C": [2], "D": [4]}))
    # δV@D_T = {(2,2)→1}, δV@C_ST = δH^{@C} = {(2,2)→1}, δroot = {(2,3,2)→1}
    assert log == [("V@D_T", 1, 1), ("V@C_ST", 1, 1), ("V@A_RST", 1, 1)]
    assert plain(m.view("V@C_ST"))[(2, 2)] == 2
    assert plain(m.result())[(2, 3, 2)] == 2

    log.clear()
    m.insert("R", pd.DataFrame({"A": [2], "B": [5]}))
    assert log == [("V@B_R", 1, 1), ("V@A_RST", 1, 1)]
    expected = {(1, 1, 1): 2, (1, 1, 2): 2, (1, 2, 1): 2, (1, 2, 2): 2, (2, 3, 2): 2, (2, 5, 2): 2}
    assert plain(m.result()) == expected
    data = fig6_h()
    data["T"] = pd.concat([data["T"], pd.DataFrame({"A": [2], "C": [2], "D": [4]})])
    data["R"] = pd.concat([data["R"], pd.DataFrame({"A": [2], "B": [5]})])
    joined = data["R"].merge(data["S"]).merge(data["T"])
    assert expected == plain(joined.groupby(["A", "B", "C"]).size().to_dict())


def test_w9_delta_size_does_not_grow_with_the_database(monkeypatch):
    """Example 16: a single-tuple update touches O(1) keys whatever the database size."""
    rng = np.random.default_rng(7)
    big = fig6_h()
    n = 3000
    a = np.arange(10, 10 + n)
    big["R"] = pd.concat([big["R"], pd.DataFrame({"A": a, "B": rng.integers(0, 5, n)})])
    big["S"] = pd.concat(
        [big["S"], pd.DataFrame({"A": a, "C": rng.integers(0, 5, n), "E": np.arange(n)})]
    )
    big["T"] = pd.concat(
        [big["T"], pd.DataFrame({"A": a, "C": rng.integers(0, 5, n), "D": np.arange(n)})]
    )
    m = load(q_hierarchical_maintainer(), big)
    sizes = {name: len(m.view(name)) for name in W9_VIEWS}
    log = record_deltas(m, monkeypatch)
    updates = [
        ("insert", "T", {"A": [2], "C": [2], "D": [4]}),
        ("insert", "S", {"A": [1], "C": [1], "E": [99]}),
        ("delete", "R", {"A": [1], "B": [2]}),
    ]
    for kind, relation, row in updates:
        before = m.result()
        log.clear()
        getattr(m, kind)(relation, pd.DataFrame(row))
        after = m.result()
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        *lower, (root, root_in, root_out) = log
        # below the root every delta is a single key; the root's delta is exactly the
        # changed result tuples (here at most the 2 B-values of a=1), independent of n
        assert all(rows_in == 1 and keys_out == 1 for _, rows_in, keys_out in lower), log
        assert root == "V@A_RST" and root_in == 1 and root_out == len(changed) <= 2, log
    # the views changed by at most one key each
    for name in W9_VIEWS:
        assert abs(len(m.view(name)) - sizes[name]) <= 1


# ------------------------------------------------------------------------------ W15
def test_w15_expanded_factorized_delta():
    """W15's δS = δS_A ⊗ δS_C ⊗ δS_E, applied in expanded (listed) form.

    The engine has no factorized-update API (deltas are always lists of tuples), so this
    checks only the numbers of Ex. 10: δroot = 3 · 1 · 2 = 6 and the new count 16.
    """
    m = load(fig3_maintainer(), fig6())
    expanded = pd.DataFrame(
        [(a, c, e) for a, c, e in product([1, 2], [1], [5, 6])], columns=["A", "C", "E"]
    )
    m.insert("S", expanded)
    assert m.result() == 16
    data = fig6()
    data["S"] = pd.concat([data["S"], expanded])
    assert brute_force(data, []) == {(): 16}


# ------------------------------------------------------------------------------ W18
def test_w18_static_relation_views_and_triggers():
    query = Query(RELS, IntegerRing())
    order = VariableOrder.parse(FIG3, query)
    m = Maintainer(query, updatable=["R", "T"], order=order)
    assert view_names(m) == {"V@A_RST", "V@B_R", "V@C_ST", "V@E_S"}
    reference = Maintainer(query, strategy="recompute")
    data = fig6()
    m.load("S", data["S"])
    reference.insert("S", data["S"])
    v_e_s = plain(m.view("V@E_S"))
    for name in ("R", "T"):
        m.insert(name, data[name])
        reference.insert(name, data[name])
    assert m.result() == reference.result() == 10

    rng = np.random.default_rng(3)
    present = {"R": [tuple(r) for r in data["R"].values], "T": [tuple(r) for r in data["T"].values]}
    for step in range(40):
        name = ["R", "T"][step % 2]
        cols = RELS[name]
        inserts = [tuple(int(x) for x in rng.integers(1, 4, 2)) for _ in range(rng.integers(1, 4))]
        deletes = []
        if present[name] and step >= 2:
            for i in sorted(rng.choice(len(present[name]), size=min(2, len(present[name])),
                                       replace=False), reverse=True):  # fmt: skip
                deletes.append(present[name].pop(i))
        rows = pd.DataFrame(inserts + deletes, columns=cols)
        signs = np.array([1] * len(inserts) + [-1] * len(deletes))
        batch = UpdateBatch(name, rows, signs)
        m.apply(batch)
        reference.apply(batch)
        present[name] += inserts
        assert m.result() == reference.result(), step
        # the static side never changes; V@D_T (sibling of the static V@E_S) is not stored
        assert plain(m.view("V@E_S")) == v_e_s
    with pytest.raises(KeyError, match="not materialized"):
        m.view("V@D_T")
    with pytest.raises(BatchError, match="'S' is static"):
        m.insert("S", pd.DataFrame({"A": [1], "C": [1], "E": [9]}))
    with pytest.raises(SchemaError, match="streaming has started"):
        m.load("S", data["S"])
    assert m.result() == reference.result()


# ------------------------------------------------------------------------------ orders
def test_order_breaking_definition_2_names_the_relation():
    query = Query(RELS, IntegerRing())
    # E is not below C, so S(A, C, E) is not on one root-to-leaf path
    bad = VariableOrder.parse("A{ B{R}, C{ D{T} }, E{S} }", query)
    with pytest.raises(VariableOrderError, match="relation 'S'"):
        bad.validate(query)
    with pytest.raises(VariableOrderError, match="relation 'S'"):
        Maintainer(query, order=bad)
    with pytest.raises(VariableOrderError, match="relation 'S'"):
        Maintainer(query, order="A{ B{R}, C{ D{T} }, E{S} }")
    with pytest.raises(VariableOrderError, match="relation 'T'"):
        Maintainer(query, order={"A": {"B": {}, "C": {"E": {}}, "D": {}}})
    with pytest.raises(VariableOrderError, match=r"\['E'\] are missing"):
        Maintainer(query, order="A{ B, C{ D } }")
    with pytest.raises(VariableOrderError, match="unknown variables"):
        Maintainer(query, order="A{ B, C{ D, E, F } }")


def test_parser_text_format():
    query = Query(RELS, IntegerRing())
    order = VariableOrder.parse(FIG3, query)
    assert order.parent == {"A": None, "B": "A", "C": "A", "D": "C", "E": "C"}
    # relation names at the leaves are optional
    assert VariableOrder.parse("A{B, C{D, E}}", query).parent == order.parent
    assert str(order) == "A{B, C{D, E}}"
    with pytest.raises(VariableOrderError, match="unbalanced"):
        VariableOrder.parse("A{ B{R}, C{ D{T}, E{S} }", query)
    with pytest.raises(VariableOrderError, match="twice"):
        VariableOrder.parse("A{ B, C{ B, D, E } }", query)


@pytest.mark.parametrize("ellipsis", ["...", "…"])
def test_parser_chain(ellipsis):
    """``X...{R}`` is a chain from X through R's variables not placed elsewhere."""
    rels = {"House": ["P", "X1", "X2", "X3"], "Shop": ["P", "Y1", "Y2"], "Inst": ["P", "Z"]}
    query = Query(rels, IntegerRing())
    text = f"P{{ X1{ellipsis}{{House}}, Y2{ellipsis}{{Shop}}, Z{{Inst}} }}"
    order = VariableOrder.parse(text, query)
    assert order.parent == {
        "P": None,
        "X1": "P",
        "X2": "X1",
        "X3": "X2",
        "Y2": "P",
        "Y1": "Y2",
        "Z": "P",
    }
    order.validate(query)
    data = {
        "House": pd.DataFrame({"P": [1, 1, 2], "X1": [1, 2, 3], "X2": [0, 0, 1], "X3": [5, 6, 7]}),
        "Shop": pd.DataFrame({"P": [1, 2, 2], "Y1": [1, 1, 2], "Y2": [3, 3, 3]}),
        "Inst": pd.DataFrame({"P": [1, 1, 2], "Z": [4, 5, 6]}),
    }
    m = Maintainer(query, order=text)
    for name, frame in data.items():
        m.insert(name, frame)
    # fused chains: one view per relation below the root
    assert {len(n.children) for n in m.tree.views() if n is not m.tree.root} == {1}
    assert m.result() == 2 * 1 * 2 + 1 * 2 * 1


def test_parser_chain_with_self_join_atoms():
    edges = {"E": ["src", "dst"]}
    atoms = [Atom("E", ("A", "B"), "E1"), Atom("E", ("B", "C"), "E2")]
    query = Query(edges, IntegerRing(), atoms=atoms)
    order = VariableOrder.parse("B{ A{E1}, C{E2} }", query)
    assert order.parent == {"B": None, "A": "B", "C": "B"}
    m = Maintainer(query, order=order)
    m.insert("E", pd.DataFrame({"src": [1, 2, 2, 3], "dst": [2, 3, 4, 1]}))
    # paths of length 2: 1-2-3, 1-2-4, 2-3-1, 3-1-2
    assert m.result() == 4
