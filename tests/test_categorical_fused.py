"""The generalized covariance ring's fused product and packed takes are the stepwise ones, bit
for bit: ``batch_mul_sum`` of factors over disjoint variables (what F-IVM's view steps
multiply) against ``reduce(batch_mul)`` + ``batch_sum_by``; ``batch_take`` of an accumulator
whose table is deferred (main run, pending run, zeros) against the same rows of the plain
table; and a Housing star stream against a maintainer whose ring multiplies step by step."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ringml.rings.base import Ring
from ringml.rings.categorical import GeneralizedCovarianceRing as G

from ringml import Maintainer, UpdateBatch
from ringml.applications import covariance_query
from ringml.datasets import build_stream, housing_star
from ringml.query import Query

CONT = ["a", "b", "c", "d", "e", "f"]
CAT = ["u", "v", "w", "z"]


class Stepwise(G):
    """The ring with the stepwise product only (the reference)."""

    def batch_mul_sum(self, factors, groups=None, n_groups=1):
        return Ring.batch_mul_sum(self, list(factors), groups, n_groups)


def stepwise(ring: G) -> Stepwise:
    ref = Stepwise(ring.continuous, ring.categorical)
    ref._shifts = ring._shifts  # the same shifts (fixed by the lifts)
    return ref


def view(ring: G, rng, variables, n_rows: int, n_keys: int, deletes: bool, weight: float = 1.0):
    """``⊕`` by key of lifted random rows over ``variables`` (a view's payloads), keys
    0..n_keys-1; ``weight`` != 1 makes counts and category counts non-integers."""
    cols = []
    for v in variables:
        if ring.is_categorical(v):
            cols.append(rng.integers(0, 4, n_rows))
        else:  # few distinct values: shifted values of 0 and cancelling sums happen
            cols.append(rng.integers(-3, 4, n_rows) * 0.75 + rng.choice([0.0, 0.1, 1e-3], n_rows))
    lifted = ring.batch_lift_many(variables, cols) if variables else ring.batch_ones(n_rows)
    mult = rng.choice([1, 1, 1, 2, -1] if deletes else [1, 1, 2], n_rows)
    lifted = ring.batch_scale(lifted, mult * weight)
    return ring.batch_sum_by(lifted, rng.integers(0, n_keys, n_rows), n_keys)


def factors_of(ring: G, rng: np.random.Generator, deletes: bool, n: int, weight: float = 1.0):
    """Factors over disjoint variable subsets, each row taken at random keys of its view."""
    names = rng.permutation(CONT + CAT).tolist()
    cuts = np.sort(rng.choice(np.arange(1, len(names)), size=3, replace=False))
    parts = [names[i:j] for i, j in zip([0, *cuts], [*cuts, len(names)], strict=True)]
    parts.append([])  # a factor without lifted variables (counts only)
    out = []
    for part in parts:
        keys = int(rng.integers(3, 12))
        v = view(ring, rng, [x for x in CONT + CAT if x in part], 60, keys, deletes, weight)
        out.append(ring.batch_take(v, rng.integers(0, keys, n)))
    out.append(ring.batch_ones(n))  # counts 1 (multiplying by them is skipped)
    return [out[i] for i in rng.permutation(len(out))]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("grouped", [False, True])
def test_fused_product_is_the_stepwise_product_bit_for_bit(seed, grouped):
    rng = np.random.default_rng([seed, grouped])
    ring = G(CONT, CAT)
    n = int(rng.integers(1, 40))
    weight = 0.3 if seed % 3 == 2 else 1.0  # non-integer terms: no exact shortcut
    factors = factors_of(ring, rng, deletes=seed % 2 == 1, n=n, weight=weight)
    groups, n_groups = (rng.integers(0, 5, n), 5) if grouped else (None, 1)
    assert ring._fused_mul_sum(factors, groups, n_groups) is not None  # not left to stepwise
    got = ring.batch_mul_sum(factors, groups, n_groups)
    want = stepwise(ring).batch_mul_sum(factors, groups, n_groups)
    assert ring.batch_to_bytes(got) == ring.batch_to_bytes(want)


def test_fused_product_leaves_shared_variables_and_bad_values_to_the_stepwise_one():
    ring = G(["a", "b"], ["u", "v"])
    rng = np.random.default_rng(0)
    x = ring.batch_lift_many(["a", "u"], [rng.random(5), rng.integers(0, 3, 5)])
    y = ring.batch_lift_many(["b", "u"], [rng.random(5), rng.integers(0, 3, 5)])  # u twice
    assert ring._fused_mul_sum([x, y], None, 1) is None
    ref = stepwise(ring)
    assert ring.batch_to_bytes(ring.batch_mul_sum([x, y])) == ring.batch_to_bytes(
        ref.batch_mul_sum([x, y])
    )
    with np.errstate(over="ignore"):  # its square overflows (not the point here)
        z = ring.batch_lift_many(["b", "v"], [np.array([1.0, 2, 3, 4, 1e308]), np.zeros(5, int)])
    big = ring.batch_scale(x, np.array([1, 1, 1, 1, 10]))
    with np.errstate(over="ignore", invalid="ignore"):
        assert ring._fused_mul_sum([big, z], None, 1) is None  # 1e308 * 10 overflows
        got = ring.batch_mul_sum([big, z])
        want = ref.batch_mul_sum([big, z])
    for name in ("count", "sums", "prods", "value"):
        assert np.array_equal(getattr(got, name), getattr(want, name), equal_nan=True)
    negative = ring.batch_lift_many(["b", "v"], [rng.random(5), np.array([-1, 0, 1, 2, 3])])
    assert ring._fused_mul_sum([x, negative], None, 1) is None  # codes must be >= 0


@pytest.mark.parametrize("seed", range(6))
def test_take_from_a_deferred_table_is_the_plain_take(seed):
    """Takes from an accumulator with pending entries, cancelled (zero) entries and cleared
    rows, and takes of those takes, equal the same takes from its plain table."""
    rng = np.random.default_rng(seed)
    ring = G(["a"], ["u", "v"])
    n = 40
    acc = ring.batch_accumulator(n, compensated=False)
    for step in range(12):
        m = int(rng.integers(1, 25))
        slots = rng.choice(n, m, replace=False)
        cols = [rng.integers(-2, 3, m) * 0.5, rng.integers(0, 3 + step, m), rng.integers(0, 5, m)]
        values = ring.batch_lift_many(["a", "u", "v"], cols)
        acc = ring.batch_scatter_add(acc, slots, ring.batch_scale(values, rng.choice([1, -1], m)))
        if step % 4 == 3:
            acc = ring.batch_clear(acc, rng.choice(n, 3, replace=False))
        assert acc._deferred is not None
        plain = ring.batch_take(acc, np.arange(n))
        plain.rows  # noqa: B018 - reading a column turns the table plain
        assert plain._deferred is None
        idx = rng.integers(0, n, int(rng.integers(0, 30)))
        taken = ring.batch_take(acc, idx)
        want = ring.batch_take(plain, idx)
        assert taken.nnz == want.nnz
        assert ring.batch_to_bytes(taken) == ring.batch_to_bytes(want)
        order = rng.permutation(len(idx))
        again = ring.batch_take(ring.batch_take(acc, idx), order)  # a take of a take
        assert ring.batch_to_bytes(again) == ring.batch_to_bytes(ring.batch_take(want, order))


def test_housing_star_stream_is_bit_for_bit_the_stepwise_one():
    data = housing_star(postcodes=300, seed=3)
    rng = np.random.default_rng(7)
    relations = {
        r: f.iloc[rng.permutation(len(f))].reset_index(drop=True) for r, f in data.relations.items()
    }
    stream = build_stream(relations, batch_size=400, delete_fraction=0.3, seed=1)
    categorical = ["nbbedrooms", "house", "flat", "pricerangeshop", "typeeducation"]
    query = covariance_query(data.schemas, categorical=categorical)
    ring = query.ring
    maintainers = [
        Maintainer(Query(query.relations, r, query.free, None, dict(query.filters)))
        for r in (G(ring.continuous, ring.categorical), Stepwise(ring.continuous, ring.categorical))
    ]
    for batch in stream:
        for m in maintainers:
            m.apply(UpdateBatch(batch.relation, batch.rows, batch.multiplicity))
        a, b = (m._stores[m.plan.root].payload for m in maintainers)
        assert maintainers[0].ring.batch_to_bytes(a) == maintainers[1].ring.batch_to_bytes(b)
    for view_id, store in maintainers[0]._stores.items():
        other = maintainers[1]._stores[view_id]
        slots = store.index.live_slots()
        assert np.array_equal(slots, other.index.live_slots())
        got = store.ring.batch_take(store.payload, slots)
        want = other.ring.batch_take(other.payload, slots)
        assert store.ring.batch_to_bytes(got) == other.ring.batch_to_bytes(want)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("compensated", [False, True])
def test_compact_products_are_the_full_ones(compensated, seed):
    """An accumulator holding only the product columns it received (the compact form) goes
    through additions (new columns, zero and negative-zero values, repeated slots), clears,
    resizes, takes and pickling exactly as one holding all columns."""
    import pickle

    rng = np.random.default_rng([11, seed])
    ring = G(["a", "b", "c"], ["u"], compensated=compensated)
    compact = ring.batch_accumulator(8)
    full = ring.batch_accumulator(8)
    full._full()
    assert compact.pcols is not None and full.pcols is None
    for step in range(30):
        n = len(compact)
        m = int(rng.integers(1, n))
        slots = rng.choice(n, m, replace=step % 7 == 5)  # sometimes repeated slots
        names = rng.choice(["a", "b", "c", "u"], int(rng.integers(1, 4)), replace=False).tolist()
        cols = [
            rng.integers(0, 3, m) if v == "u" else rng.choice([0.0, -0.0, 1.5, -2.25, 1e-9], m)
            for v in names
        ]
        values = ring.batch_scale(ring.batch_lift_many(names, cols), rng.choice([1, -1, 2], m))
        compact = ring.batch_scatter_add(compact, slots, values)
        full = ring.batch_scatter_add(full, slots, values)
        if step % 5 == 4:
            cleared = rng.choice(n, 2, replace=False)
            compact, full = ring.batch_clear(compact, cleared), ring.batch_clear(full, cleared)
        if step % 9 == 8:
            compact, full = ring.batch_resize(compact, n + 5), ring.batch_resize(full, n + 5)
        assert compact.pcols is not None and full.pcols is None
        assert ring.batch_to_bytes(compact) == ring.batch_to_bytes(full)
        idx = rng.integers(0, len(compact), 6)
        assert ring.batch_to_bytes(ring.batch_take(compact, idx)) == ring.batch_to_bytes(
            ring.batch_take(full, idx)
        )
        # a view step's product: the columns a compact factor never received are zeros,
        # also where it holds both variables' sums (a column that is not held is not ab's)
        counts = ring.batch_scale(ring.batch_ones(6), rng.choice([1, -1, 2], 6))
        got = ring.batch_mul_sum([ring.batch_take(compact, idx), counts])
        want = ring.batch_mul_sum([ring.batch_take(full, idx), counts])
        assert ring.batch_to_bytes(got) == ring.batch_to_bytes(want)
    again = pickle.loads(pickle.dumps(compact))
    assert again.pcols is not None and ring.batch_to_bytes(again) == ring.batch_to_bytes(full)
    np.testing.assert_array_equal(compact.prods, full.prods)  # reading turns it full
    assert compact.pcols is None
    if compensated:
        np.testing.assert_array_equal(compact.prods_lo, full.prods_lo)


def test_a_view_that_never_held_a_cross_product_multiplies_it_as_zero():
    """Found by the long property profile (seed 20261125): R1's rows make the shifted
    Σab of its view zero in every addition while Σa and Σb are not, so the compact view
    never holds column ab; an R0 insert then multiplied the view's Σbb as Σab."""
    relations = {"R0": ("k",), "R1": ("k", "a", "b"), "R2": ("k", "c")}
    m = Maintainer(Query(relations, G(["a", "b"], [])))
    rows = {
        "R1": [(0.5, 0.5, 0.5), (0.5, 0.5, 0.5)],  # the shifts: a and b at 0.5
        "R2": [(0.5, 0.5)],
        "R1+": [(0.5, -1.25, 0.5), (0.5, 0.5, 0.5), (0.5, 0.5, -1.25)],
        "R0": [(0.5,)],
    }
    for name, batch in rows.items():
        relation = name.rstrip("+")
        m.insert(relation, pd.DataFrame(batch, columns=list(relations[relation])))
    x = np.array(rows["R1"] + rows["R1+"])[:, 1:]  # every R1 row joins once
    count, sums, products = m.ring.to_dense(m.result(), {})
    assert count == len(x)
    np.testing.assert_array_equal(sums, x.sum(axis=0))
    np.testing.assert_array_equal(products, x.T @ x)  # Σab = -0.5, not Σbb = 2.5625


VALUES = [0.5, -1.25]  # two values: shifted zeros, cancelling sums and unheld columns


@st.composite
def star_streams(draw):
    """A star on ``k`` with 2-4 relations, each 0-3 further variables (continuous or
    categorical, drawn), and a stream of batches of inserts and deletes of present rows."""
    relations, continuous, categorical = {}, [], []
    for r in range(draw(st.integers(2, 4))):
        own = [f"x{r}{i}" for i in range(draw(st.integers(0, 3)))]
        for v in own:
            (categorical if draw(st.booleans()) else continuous).append(v)
        relations[f"R{r}"] = ("k", *own)
    present = {r: [] for r in relations}
    batches = []
    for _ in range(draw(st.integers(1, 25))):
        r = draw(st.sampled_from(sorted(relations)))
        values = [
            st.integers(0, 2) if v in categorical else st.sampled_from(VALUES)
            for v in relations[r][1:]
        ]
        inserts = draw(st.lists(st.tuples(st.integers(0, 2), *values), max_size=4))
        deletes = []
        if present[r]:
            deletes = draw(st.lists(st.sampled_from(present[r]), max_size=3, unique_by=id))
        kept = list(present[r])
        for row in deletes:
            kept.remove(row)
        present[r] = kept + inserts
        if inserts or deletes:
            batches.append((r, inserts + deletes, [1] * len(inserts) + [-1] * len(deletes)))
    return relations, continuous, categorical, batches


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(star_streams())
def test_random_star_streams_are_bit_for_bit_the_stepwise_ones(case):
    """Every view of F-IVM with the fused product equals, bit for bit, the same views kept
    with the stepwise product, after every batch of a random star stream with deletes."""
    relations, continuous, categorical, batches = case
    maintainers = [
        Maintainer(Query(relations, ring_class(continuous, categorical)))
        for ring_class in (G, Stepwise)
    ]
    for relation, rows, signs in batches:
        frame = pd.DataFrame(rows, columns=list(relations[relation]))
        for m in maintainers:
            m.apply(UpdateBatch(relation, frame, np.array(signs)))
        mine, ref = maintainers
        for view_id, store in mine._stores.items():
            other = ref._stores[view_id]
            slots = store.index.live_slots()
            assert np.array_equal(slots, other.index.live_slots())
            got = store.ring.batch_take(store.payload, slots)
            want = other.ring.batch_take(other.payload, slots)
            assert store.ring.batch_to_bytes(got) == other.ring.batch_to_bytes(want), view_id
