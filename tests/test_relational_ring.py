"""F[ℤ] (RelationalRing) and the factorized ring of Example 21 (FactorizedRing)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ring_laws import check_axioms, check_batched_agrees
from ringml.rings.base import RingError
from ringml.rings.relational import (
    CONFLICT,
    FactorizedBatch,
    FactorizedRing,
    RelationalRing,
    RelationBatch,
    make_relation,
)
from ringml.rings.scalar import IntegerRing

SETTINGS = settings(max_examples=60, deadline=None)
VARS = ("A", "B", "C")

# ------------------------------------------------------------------ strategies
mults = st.integers(-3, 3).filter(bool)


@st.composite
def keys(draw, variables=VARS):
    schema = draw(st.lists(st.sampled_from(variables), unique=True, max_size=len(variables)))
    return tuple(sorted((v, draw(st.integers(0, 2))) for v in schema))


# relations whose tuples carry their own (mixed) schemas
relations = st.dictionaries(keys(), mults, max_size=4)


@st.composite
def fixed_schema_relations(draw, schema):
    rows = draw(st.dictionaries(st.tuples(*[st.integers(0, 2)] * len(schema)), mults, max_size=4))
    return make_relation(schema, rows)


@st.composite
def relation_lists(draw, min_size=0, max_size=6):
    """A list of relations over one schema (as a view's batch) -- or mixed, half the time."""
    if draw(st.booleans()):
        return draw(st.lists(relations, min_size=min_size, max_size=max_size))
    schema = draw(st.lists(st.sampled_from(VARS), unique=True, max_size=3))
    return draw(st.lists(fixed_schema_relations(schema), min_size=min_size, max_size=max_size))


ORDER = ("A", "B", "C", "D")


@st.composite
def factorized(draw):
    out: dict = {}
    for _ in range(draw(st.integers(0, 4))):
        v = draw(st.sampled_from(ORDER + (None,)))
        value = draw(st.integers(0, 2) | st.just(CONFLICT))
        key = () if v is None else ((v, value),)
        out[key] = draw(mults)
    return out


# ------------------------------------------------------------------ F[ℤ]: scalar face
def test_zero_one_and_construction():
    ring = RelationalRing()
    assert ring.zero() == {} and ring.one() == {(): 1}
    r = make_relation(["B", "A"], {(1, 2): 3, (0, 0): 0})
    assert r == {(("A", 2), ("B", 1)): 3}  # keys sorted by variable, zeros dropped
    assert RelationalRing.schema_of(r) == frozenset({"A", "B"})
    assert RelationalRing.schema_of(ring.one()) == frozenset()
    assert make_relation(["A"], [(1,), (1,), (2,)]) == {(("A", 1),): 2, (("A", 2),): 1}
    assert ring.equal({(("B", 1), ("A", 2)): 3}, r)  # unsorted keys are accepted


@SETTINGS
@given(relations, relations, relations)
def test_relational_axioms(a, b, c):
    check_axioms(RelationalRing(["A"]), a, b, c)


def test_w1_operators_ex3():
    """W1 with the F[ℤ] operations themselves: ⊎ is +, ⊗ is * (natural join)."""
    ring = RelationalRing()
    R = make_relation(["A", "B"], {(1, 1): 2, (2, 1): 3})
    S = make_relation(["A", "B"], {(2, 1): 5, (3, 2): 7})
    T = make_relation(["B", "C"], {(1, 1): 11, (2, 2): 13})
    assert ring.add(R, S) == make_relation(["A", "B"], {(1, 1): 2, (2, 1): 8, (3, 2): 7})
    assert ring.mul(S, T) == make_relation(["A", "B", "C"], {(2, 1, 1): 55, (3, 2, 2): 91})
    S2 = make_relation(["A", "B"], {(2, 1): -3, (3, 2): 7})
    assert (("A", 2), ("B", 1)) not in ring.add(R, S2)
    # ⊕_A S with g_A(a) = a, as a group-by of the ℤ payloads
    marg: dict = {}
    for key, m in S.items():
        a, rest = dict(key)["A"], tuple(p for p in key if p[0] != "A")
        marg[rest] = marg.get(rest, 0) + m * a
    assert marg == {(("B", 1),): 10, (("B", 2),): 21}


def test_cross_schema_union_and_join():
    ring = RelationalRing()
    ra = make_relation(["A"], {(1,): 2})
    rb = make_relation(["B"], {(5,): 3})
    u = ring.add(ra, rb)
    assert u == {(("A", 1),): 2, (("B", 5),): 3}
    assert RelationalRing.schema_of(u) is None
    # the join of disjoint schemas is the Cartesian product; inconsistent tuples vanish
    assert ring.mul(ra, rb) == {(("A", 1), ("B", 5)): 6}
    ab = make_relation(["A", "B"], {(1, 5): 1, (2, 5): 1})
    assert ring.mul(ab, ra) == {(("A", 1), ("B", 5)): 2}
    # join accounts for multiple derivations: (A=1)·(A=1,B=5) and (B=5)·(A=1,B=5) both hit
    assert ring.mul(u, ab) == {(("A", 1), ("B", 5)): 5, (("A", 2), ("B", 5)): 3}


def test_relational_lift_and_errors():
    ring = RelationalRing(["A", "B"])
    assert ring.lifted_variables == {"A", "B"}
    assert ring.lift("A", 3) == {(("A", 3),): 1}
    assert ring.lift("E", 3) == ring.one()
    assert ring.lift("A", "x") == {(("A", "x"),): 1}  # any hashable on the scalar face
    with pytest.raises(RingError):
        ring.lift("A", [1, 2])
    with pytest.raises(RingError):
        ring.add({(("A", 1), ("A", 2)): 1}, {})  # a variable twice in one tuple
    with pytest.raises(RingError):
        ring.add({(("A", 1),): 1.5}, {})  # non-integer multiplicity
    with pytest.raises(RingError):
        ring.mul([("A", 1)], {})
    with pytest.raises(RingError, match="integer codes"):
        ring.batch_from([{(("A", "x"),): 1}])  # batched values are int64 codes
    with pytest.raises(RingError, match="'A'"):
        ring.batch_lift("A", np.array(["x", "y"]))
    with pytest.raises(RingError, match="'A'"):
        ring.batch_lift("A", np.array([1.0, np.nan]))
    with pytest.raises(RingError):
        RelationalRing(["A"]).check_same_ring(RelationalRing(["B"]))
    with pytest.raises(RingError):
        RelationalRing().check_same_ring(IntegerRing())
    RelationalRing(["A"]).check_same_ring(RelationalRing(["A"]))
    with pytest.raises(RingError):
        ring.batch_add(ring.batch_ones(2), ring.batch_ones(3))
    with pytest.raises(RingError):
        ring.batch_add(ring.batch_ones(2), np.ones(2, dtype=np.int64))


def test_bytes_roundtrip_with_strings():
    ring = RelationalRing()
    r = {(("A", "x"), ("B", 2)): 3, (): -1}
    assert ring.from_bytes(ring.to_bytes(r)) == r
    with pytest.raises(RingError):
        ring.to_bytes({(("A", (1, 2)),): 1})


# ------------------------------------------------------------------ F[ℤ]: batched face
@SETTINGS
@given(relation_lists(), st.data())
def test_relational_batched_agrees(xs, data):
    ys = data.draw(relation_lists(min_size=len(xs), max_size=len(xs)))
    check_batched_agrees(RelationalRing(["A"]), xs, ys)


@SETTINGS
@given(st.lists(relations, max_size=5), st.lists(relations, max_size=5))
def test_batch_concat_and_add_across_schemas(xs, ys):
    ring = RelationalRing()
    n = min(len(xs), len(ys))
    xs, ys = xs[:n], ys[:n]
    bx, by = ring.batch_from(xs), ring.batch_from(ys)
    got = ring.batch_to_list(ring.batch_mul(ring.batch_add(bx, by), by))
    assert got == [ring.mul(ring.add(x, y), y) for x, y in zip(xs, ys, strict=True)]


def test_fixed_schema_batches_and_mixed_sums():
    ring = RelationalRing(["A", "B"])
    a = ring.batch_lift("A", np.array([1, 2, 1]))
    b = ring.batch_lift("B", np.array([7, 7, 8]))
    assert a.schema == ("A",) and b.schema == ("B",)
    ab = ring.batch_mul(a, b)
    assert ab.schema == ("A", "B")
    assert ring.batch_to_list(ab)[2] == {(("A", 1), ("B", 8)): 1}
    mixed = ring.batch_add(a, b)  # union across schemas
    assert mixed.schema is None
    assert ring.batch_to_list(mixed)[0] == {(("A", 1),): 1, (("B", 7),): 1}
    # and back: subtracting b leaves a fixed-schema batch again
    back = ring.batch_sub(mixed, b)
    assert back.schema == ("A",)
    assert ring.batch_to_list(back) == ring.batch_to_list(a)
    summed = ring.batch_sum_by(ab, np.array([0, 0, 0]), 1)
    assert ring.batch_to_list(summed) == [
        {(("A", 1), ("B", 7)): 1, (("A", 2), ("B", 7)): 1, (("A", 1), ("B", 8)): 1}
    ]


def test_batched_join_many_matches():
    """Sort-merge join with many-to-many matches per row (repeat/offset arithmetic)."""
    ring = RelationalRing()
    rng = np.random.default_rng(0)
    xs = [
        make_relation(
            ["A", "B"], {tuple(rng.integers(0, 3, 2)): int(rng.integers(1, 4)) for _ in range(6)}
        )
        for _ in range(20)
    ]
    ys = [
        make_relation(
            ["B", "C"], {tuple(rng.integers(0, 3, 2)): int(rng.integers(-3, 4)) for _ in range(6)}
        )
        for _ in range(20)
    ]
    got = ring.batch_to_list(ring.batch_mul(ring.batch_from(xs), ring.batch_from(ys)))
    assert got == [ring.mul(x, y) for x, y in zip(xs, ys, strict=True)]


def test_relational_overflow():
    ring = RelationalRing()
    big = ring.batch_from([{(("A", 1),): 2**62}])
    with pytest.raises(RingError, match="overflow"):
        ring.batch_add(big, big)
    with pytest.raises(RingError, match="overflow"):
        ring.batch_mul(big, ring.batch_from([{(): 4}]))


# ------------------------------------------------------------------ view-tree helpers
# A view is (schema, {key values tuple: payload}); these mirror ⊗ and ⊕_X of §2.3.
R_ROWS = [(1, 1), (1, 2), (2, 3), (3, 4)]
S_ROWS = [(1, 1, 1), (1, 1, 2), (1, 2, 3), (2, 2, 4)]
T_ROWS = [(1, 1), (2, 2), (2, 3), (3, 4)]


def base_view(ring, schema, rows):
    return (tuple(schema), {r: ring.one() for r in rows})


def join(ring, v1, v2):
    (s1, d1), (s2, d2) = v1, v2
    schema = s1 + tuple(x for x in s2 if x not in s1)
    out = {}
    for k1, p1 in d1.items():
        for k2, p2 in d2.items():
            t1, t2 = dict(zip(s1, k1, strict=True)), dict(zip(s2, k2, strict=True))
            if all(t1[x] == t2[x] for x in t1.keys() & t2.keys()):
                t = {**t1, **t2}
                out[tuple(t[x] for x in schema)] = ring.mul(p1, p2)
    return schema, out


def marginalize(ring, view, var):
    schema, d = view
    j = schema.index(var)
    rest = schema[:j] + schema[j + 1 :]
    out = {}
    for k, p in d.items():
        kk = k[:j] + k[j + 1 :]
        term = ring.mul(p, ring.lift(var, k[j]))  # payload first, the lift last
        out[kk] = ring.add(out.get(kk, ring.zero()), term)
    return rest, {k: p for k, p in out.items() if not ring.is_zero(p)}


def fig3_views(ring):
    """The Fig. 3 view tree of Q = R(A,B), S(A,C,E), T(C,D), all variables marginalized."""
    R = base_view(ring, "AB", R_ROWS)
    S = base_view(ring, "ACE", S_ROWS)
    T = base_view(ring, "CD", T_ROWS)
    v_b = marginalize(ring, R, "B")
    v_e = marginalize(ring, S, "E")
    v_d = marginalize(ring, T, "D")
    v_c = marginalize(ring, join(ring, v_d, v_e), "C")
    root = marginalize(ring, join(ring, v_b, v_c), "A")
    return {"B": v_b, "E": v_e, "D": v_d, "C": v_c, "root": root}


def lst(schema, rows):
    return make_relation(list(schema), rows)


def test_w2_count_tree_with_same_helpers():
    views = fig3_views(IntegerRing())
    assert views["C"][1] == {(1,): 4, (2,): 2}
    assert views["root"][1] == {(): 10}


def test_w13_listing_view_tree():
    ring = RelationalRing(["A", "B", "C", "D"])
    views = fig3_views(ring)
    assert views["D"][1] == {
        (1,): lst("D", {(1,): 1}),
        (2,): lst("D", {(2,): 1, (3,): 1}),
        (3,): lst("D", {(4,): 1}),
    }
    assert views["E"][1] == {(1, 1): {(): 2}, (1, 2): {(): 1}, (2, 2): {(): 1}}
    assert views["B"][1] == {
        (1,): lst("B", {(1,): 1, (2,): 1}),
        (2,): lst("B", {(3,): 1}),
        (3,): lst("B", {(4,): 1}),
    }
    assert views["C"][1] == {
        (1,): lst("CD", {(1, 1): 2, (2, 2): 1, (2, 3): 1}),
        (2,): lst("CD", {(2, 2): 1, (2, 3): 1}),
    }
    root = views["root"][1][()]
    expected = lst(
        "ABCD",
        {
            (1, 1, 1, 1): 2, (1, 1, 2, 2): 1, (1, 1, 2, 3): 1,
            (1, 2, 1, 1): 2, (1, 2, 2, 2): 1, (1, 2, 2, 3): 1,
            (2, 3, 2, 2): 1, (2, 3, 2, 3): 1,
        },
    )  # fmt: skip
    assert root == expected
    assert RelationalRing.total(root) == 10
    # brute force: the join projected on (A,B,C,D), counting E-derivations
    brute: dict = {}
    for a, b in R_ROWS:
        for a2, c, _e in S_ROWS:
            for c2, d in T_ROWS:
                if a == a2 and c == c2:
                    brute[(a, b, c, d)] = brute.get((a, b, c, d), 0) + 1
    assert root == lst("ABCD", brute)


def test_w13_factorized_view_tree():
    ring = FactorizedRing(["A", "B", "C", "D"])
    views = fig3_views(ring)
    assert views["C"][1] == {
        (1,): lst("C", {(1,): 2, (2,): 2}),
        (2,): lst("C", {(2,): 2}),
    }
    assert views["root"][1] == {(): lst("A", {(1,): 8, (2,): 2})}
    assert views["D"][1][(2,)] == lst("D", {(2,): 1, (3,): 1})
    assert views["B"][1][(1,)] == lst("B", {(1,): 1, (2,): 1})
    assert views["E"][1] == {(1, 1): {(): 2}, (1, 2): {(): 1}, (2, 2): {(): 1}}
    # every factorized view is the projection of the listing view (article semantics)
    listing = fig3_views(RelationalRing(["A", "B", "C", "D"]))
    for name, (_, d) in views.items():
        proj = {k: ring.project(p) for k, p in listing[name][1].items()}
        assert d == proj, name
    # not the reference's 0/1 quirk: c2 under a1 has 2 derivations (d2, d3)
    assert views["C"][1][(1,)][(("C", 2),)] == 2


# ------------------------------------------------------------------ batched view tree
def batch_view(ring, schema, rows):
    keys = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(schema))
    return tuple(schema), keys, ring.batch_ones(len(rows))


def batch_join(ring, v1, v2):
    (s1, k1, p1), (s2, k2, p2) = v1, v2
    shared = [x for x in s1 if x in s2]
    c1 = [s1.index(x) for x in shared]
    c2 = [s2.index(x) for x in shared]
    match = (k1[:, None, c1] == k2[None, :, c2]).all(axis=2)
    i1, i2 = np.nonzero(match)
    extra = [j for j, x in enumerate(s2) if x not in s1]
    keys = np.hstack([k1[i1], k2[i2][:, extra]])
    schema = s1 + tuple(s2[j] for j in extra)
    return schema, keys, ring.batch_mul(ring.batch_take(p1, i1), ring.batch_take(p2, i2))


def batch_marginalize(ring, view, var):
    schema, keys, payload = view
    j = schema.index(var)
    lifted = ring.batch_mul(payload, ring.batch_lift(var, keys[:, j]))
    rest = np.delete(keys, j, axis=1)
    uniq, groups = np.unique(rest, axis=0, return_inverse=True)
    summed = ring.batch_sum_by(lifted, groups.reshape(-1), len(uniq))
    return schema[:j] + schema[j + 1 :], uniq, summed


def batched_fig3_root(ring):
    R = batch_view(ring, "AB", R_ROWS)
    S = batch_view(ring, "ACE", S_ROWS)
    T = batch_view(ring, "CD", T_ROWS)
    v_b = batch_marginalize(ring, R, "B")
    v_e = batch_marginalize(ring, S, "E")
    v_d = batch_marginalize(ring, T, "D")
    v_c = batch_marginalize(ring, batch_join(ring, v_d, v_e), "C")
    root = batch_marginalize(ring, batch_join(ring, v_b, v_c), "A")
    return v_c, root


@pytest.mark.parametrize(
    "ring",
    [IntegerRing(), RelationalRing(["A", "B", "C", "D"]), FactorizedRing(["A", "B", "C", "D"])],
    ids=repr,
)
def test_w13_batched_face_matches_scalar_face(ring):
    (_, c_keys, c_payload), (_, _, root) = batched_fig3_root(ring)
    scalar = fig3_views(ring)
    got_c = dict(zip(map(tuple, c_keys.tolist()), ring.batch_to_list(c_payload), strict=True))
    assert got_c == scalar["C"][1]
    assert ring.batch_to_list(root) == [scalar["root"][1][()]]
    if isinstance(ring, FactorizedRing):
        assert isinstance(root, FactorizedBatch)
        assert ring.batch_total(root).tolist() == [10]
    if isinstance(ring, RelationalRing):
        assert isinstance(root, RelationBatch) and root.schema == ("A", "B", "C", "D")


# ------------------------------------------------------------------ factorized ring
@SETTINGS
@given(factorized(), factorized(), factorized())
def test_factorized_axioms(a, b, c):
    check_axioms(FactorizedRing(ORDER), a, b, c)


@SETTINGS
@given(st.lists(factorized(), max_size=6), st.data())
def test_factorized_batched_agrees(xs, data):
    ys = data.draw(st.lists(factorized(), min_size=len(xs), max_size=len(xs)))
    check_batched_agrees(FactorizedRing(ORDER), xs, ys)


@st.composite
def listing_over(draw, schema):
    return draw(fixed_schema_relations(schema))


@SETTINGS
@given(listing_over(("A", "C")), listing_over(("B", "D")), listing_over(("B", "D")))
def test_project_is_a_homomorphism_on_disjoint_operands(r, s, s2):
    """project(R ⊗ S) = project(R) · project(S) for disjoint schemas, project is additive."""
    lr, fr = RelationalRing(), FactorizedRing(ORDER)
    assert fr.project(lr.mul(r, s)) == fr.mul(fr.project(r), fr.project(s))
    assert fr.project(lr.add(s, s2)) == fr.add(fr.project(s), fr.project(s2))
    assert fr.total(fr.project(r)) == lr.total(r)


def test_factorized_product_rules():
    fr = FactorizedRing(ORDER)
    x = lst("C", {(1,): 2, (2,): 3})  # over C
    d = lst("D", {(5,): 1, (6,): 4})  # over D (higher index), total 5
    assert fr.mul(x, d) == lst("C", {(1,): 10, (2,): 15})  # C's relation scaled by 5
    assert fr.mul(d, x) == fr.mul(x, d)
    assert fr.mul(x, {(): 3}) == lst("C", {(1,): 6, (2,): 9})
    # same variable: agreeing values multiply (a join on C), the rest goes to C=CONFLICT
    assert fr.mul(x, lst("C", {(2,): 5, (9,): 1})) == {
        (("C", 2),): 15,
        (("C", CONFLICT),): 2 * 5 + 2 * 1 + 3 * 1,
    }
    # associativity needs CONFLICT: a plain join would give 0 on the right-hand side
    a0, b0, b1 = fr.lift("A", 0), fr.lift("B", 0), fr.lift("B", 1)
    assert fr.mul(fr.mul(a0, b0), b1) == fr.mul(a0, fr.mul(b0, b1)) == a0
    a = lst("A", {(7,): 1})
    assert fr.mul(fr.mul(d, x), a) == lst("A", {(7,): 25})  # totals multiply up the tree
    assert fr.lift("B", 4) == lst("B", {(4,): 1}) and fr.lift("E", 4) == {(): 1}
    with pytest.raises(RingError):
        fr.mul(lst("AB", {(1, 1): 1}), {})  # more than one variable
    with pytest.raises(RingError):
        fr.add(lst("E", {(1,): 1}), {})  # variable outside the order
    with pytest.raises(RingError):
        fr.batch_add(fr.batch_ones(1), RelationalRing().batch_ones(1))
    with pytest.raises(RingError):
        fr.check_same_ring(FactorizedRing(["B", "A"]))
    with pytest.raises(RingError, match="'A'"):
        fr.batch_lift("A", np.array(["a"]))


@SETTINGS
@given(factorized(), factorized())
def test_factorized_total_is_multiplicative(a, b):
    fr = FactorizedRing(ORDER)
    assert fr.total(fr.mul(a, b)) == fr.total(a) * fr.total(b)
    assert fr.from_bytes(fr.to_bytes(a)) == fr.add(a, {})


def test_factorized_deletes_propagate():
    """A delete (negative multiplicities) is faithfully propagated, unlike the reference."""
    fr = FactorizedRing(ORDER)
    delta_d = fr.neg(fr.lift("D", 3))  # delete T(2,3): V_T[2] loses d3
    payload = fr.mul(fr.mul(delta_d, {(): 1}), fr.lift("C", 2))
    assert payload == lst("C", {(2,): -1})


# ------------------------------------------------------------------ recode (codes moved into
# another code space, e.g. a shard's dictionary into the distributed driver's)
@st.composite
def injective_maps(draw, variables):
    """Per variable, codes 0..2 mapped injectively into 0..9, and the values of old and new
    codes (new[v][map[c]] == old[v][c])."""
    maps, old, new = {}, {}, {}
    for v in variables:
        target = draw(st.lists(st.integers(0, 9), min_size=3, max_size=3, unique=True))
        maps[v] = np.asarray(target)
        old[v] = [f"{v}{c}" for c in range(3)]
        new[v] = [None] * 10
        for c, t in enumerate(target):
            new[v][t] = old[v][c]
    return maps, old, new


def decoded_relation(rel, values):
    """Codes of the variables in ``values`` replaced by their values (CONFLICT kept)."""
    out = {}
    for key, m in rel.items():
        k = tuple((v, values[v][c] if v in values and c is not CONFLICT else c) for v, c in key)
        out[k] = m
    return out


@SETTINGS
@given(relation_lists(min_size=1), st.data())
def test_relational_recode_then_decode_equals_decode(xs, data):
    ring = RelationalRing(listed=["A", "B"])  # C is not keyed: left alone
    maps, old, new = data.draw(injective_maps(["A", "B"]))
    for a in xs:
        moved = ring.recode(a, maps)
        assert decoded_relation(moved, new) == decoded_relation(ring.add(a, {}), old)
        used = ring.used_codes(moved)
        assert set(used) == {"A", "B"}
        for v in ("A", "B"):
            before = {c for key in a for var, c in key if var == v}
            assert set(used[v].tolist()) == {int(maps[v][c]) for c in before}
    batch = ring.recode(ring.batch_from(xs), maps)
    assert isinstance(batch, RelationBatch)
    got = [decoded_relation(r, new) for r in ring.batch_to_list(batch)]
    assert got == [decoded_relation(ring.add(a, {}), old) for a in xs]
    identity = {"A": np.arange(3), "B": np.arange(3)}
    assert all(ring.equal(ring.recode(a, identity), a) for a in xs)
    same = ring.batch_to_list(ring.recode(ring.batch_from(xs), identity))
    assert same == ring.batch_to_list(ring.batch_from(xs))
    assert ring.recode(xs[0], {}) is xs[0]


@SETTINGS
@given(st.lists(factorized(), min_size=1, max_size=5), st.data())
def test_factorized_recode_then_decode_equals_decode(xs, data):
    ring = FactorizedRing(ORDER)
    maps, old, new = data.draw(injective_maps(["A", "C"]))
    for a in xs:
        moved = ring.recode(a, maps)
        assert decoded_relation(moved, new) == decoded_relation(ring.add(a, {}), old)
        used = ring.used_codes(moved)
        for v in ("A", "C"):
            before = {c for key in a for var, c in key if var == v and c is not CONFLICT}
            assert set(used[v].tolist()) == {int(maps[v][c]) for c in before}
    batch = ring.recode(ring.batch_from(xs), maps)
    assert isinstance(batch, FactorizedBatch)
    got = [decoded_relation(r, new) for r in ring.batch_to_list(batch)]
    assert got == [decoded_relation(ring.add(a, {}), old) for a in xs]
    identity = {v: np.arange(3) for v in ORDER}
    assert all(ring.equal(ring.recode(a, identity), a) for a in xs)


def test_recode_errors_and_rings_without_codes():
    listing = RelationalRing(listed=["A"])
    rel = make_relation(["A", "B"], {(0, 5): 2, (3, 5): 1})
    assert listing.recode(rel, {"A": [4, -1, -1, 0]}) == make_relation(
        ["A", "B"], {(4, 5): 2, (0, 5): 1}
    )
    with pytest.raises(RingError, match=r"code 3 of 'A' has no new code"):
        listing.recode(rel, {"A": [4, 1]})
    with pytest.raises(RingError, match=r"'B' is not a keyed variable"):
        listing.recode(rel, {"B": [0]})
    factorized_ring = FactorizedRing(["A"])
    with pytest.raises(RingError, match=r"code 1 of 'A' has no new code"):
        factorized_ring.recode({(("A", 1),): 1}, {"A": [0, -1]})
    # rings without keyed variables: identity without maps, an error with them
    assert IntegerRing().recode(5, {}) == 5 and IntegerRing().used_codes(5) == {}
    with pytest.raises(RingError, match="not a keyed variable"):
        IntegerRing().recode(5, {"A": [0]})
