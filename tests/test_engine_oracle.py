"""Property tests: every strategy equals an independent flat-join oracle after every batch.

Hypothesis draws a random acyclic, connected join (a random join tree of 2-5 atoms: each new
atom shares a non-empty subset of a parent atom's variables; sometimes it is a second
occurrence of an existing relation, i.e. a self-join), free variables, a ring, a variable
order (the default, a random valid order from the §4.3a construction, a random forest that
satisfies Definition 2, or the canonical/free-connex one when it applies),
static relations, data over small domains, and a stream of batches (inserts, deletes of
present tuples, mixed-sign batches, updates, multi-batch ``apply``) whose deletes are at
least 30% of the streamed tuples.  After every batch the result of F-IVM (two orders),
first-order IVM and recomputation is compared with the aggregate over the flat join built
with pandas merges.  Groups must match exactly: a group is present iff its payload is not
ring-zero (F-IVM §2.2: ``t ∈ R`` iff ``R[t] ≠ 0``).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ringml.rings.categorical import GeneralizedCovarianceRing
from ringml.rings.covariance import CovarianceRing
from ringml.rings.scalar import IntegerRing, ProductRing, RealRing

from ringml.batch import UpdateBatch
from ringml.errors import BatchError, VariableOrderError
from ringml.maintainer import Maintainer
from ringml.query import Atom, Query
from ringml.variable_order import (
    VariableOrder,
    is_acyclic,
    is_free_connex,
    is_q_hierarchical,
)

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
INT_DOMAIN = [0, 1, 2, 3]
FLOAT_DOMAIN = [0.5, -1.25, 2.0, 3.75]  # dyadic: sums of products stay exact in float64
RTOL = 1e-9


# ------------------------------------------------------------------------------ scenario
def random_order(query: Query, processing: list[str]) -> VariableOrder:
    """The §4.3a construction with an arbitrary processing order: always a valid order."""
    trees: list[tuple[set[str], str | None]] = [({a.name}, None) for a in query.atoms]
    parent: dict[str, str | None] = {}
    for v in processing:
        touching = [t for t in trees if t[0] & query.rels(v)]
        atoms: set[str] = set()
        for t_atoms, root in touching:
            atoms |= t_atoms
            if root is not None:
                parent[root] = v
        trees = [t for t in trees if not (t[0] & query.rels(v))] + [(atoms, v)]
    for _, root in trees:
        parent[root] = None
    return VariableOrder({v: parent[v] for v in reversed(processing)})


def random_tree_order(query: Query, draw) -> VariableOrder:
    """A random forest over the variables if it satisfies Definition 2, else a random chain.

    Unlike :func:`random_order`, this reaches orders where a variable sits above subtrees
    that do not mention it (siblings sharing no key, single-child chains, bound variables
    above free ones).
    """
    variables = draw(st.permutations(list(query.variables)))
    parent = {variables[0]: None}
    for i, v in enumerate(variables[1:], start=1):
        parent[v] = variables[draw(st.integers(0, i - 1))]
    order = VariableOrder(parent)
    try:
        order.validate(query)
    except VariableOrderError:
        order = VariableOrder(
            {v: (variables[i - 1] if i else None) for i, v in enumerate(variables)}
        )
    return order


@st.composite
def schemas(draw):
    """(relations, atoms or None): a random acyclic connected join of 2-5 atoms."""
    counter = iter(range(100))

    def fresh() -> str:
        return f"V{next(counter)}"

    first = [fresh() for _ in range(draw(st.integers(1, 3)))]
    relations: dict[str, list[str]] = {"R0": first}
    atoms: list[tuple[str, tuple[str, ...]]] = [("R0", tuple(first))]
    for _ in range(draw(st.integers(1, 4))):
        parent = atoms[draw(st.integers(0, len(atoms) - 1))][1]
        shared = draw(
            st.lists(st.sampled_from(parent), min_size=1, max_size=min(2, len(parent)), unique=True)
        )
        reusable = [r for r, cols in relations.items() if len(shared) <= len(cols) <= 3]
        if reusable and draw(st.integers(0, 3)) == 0:  # a self-join: another occurrence
            relation = draw(st.sampled_from(reusable))
            arity = len(relations[relation])
        else:
            relation = f"R{len(relations)}"
            arity = min(len(shared) + draw(st.integers(0, 2)), 3)
        variables = tuple(
            draw(st.permutations(shared + [fresh() for _ in range(arity - len(shared))]))
        )
        relations.setdefault(relation, list(variables))
        atoms.append((relation, variables))
    self_join = len(relations) < len(atoms)
    return relations, atoms if self_join else None


def make_query(relations, atom_list, ring, free) -> Query:
    atoms = None
    if atom_list is not None:
        seen: Counter = Counter()
        atoms = []
        for relation, variables in atom_list:
            seen[relation] += 1
            name = relation if seen[relation] == 1 else f"{relation}x{seen[relation]}"
            atoms.append(Atom(relation, variables, name))
    return Query(relations, ring, free=free, atoms=atoms)


RING_KINDS = ("count", "sum_int", "sum_real", "product", "covariance", "categorical")


def make_ring(kind: str, lifted: list[str], categorical: list[str]):
    if kind == "count":
        return IntegerRing()
    if kind == "sum_int":
        return IntegerRing(lifted)
    if kind == "sum_real":
        return RealRing(lifted)
    if kind == "product":
        return ProductRing(IntegerRing(), RealRing(lifted), names=["n", "total"])
    if kind == "covariance":
        return CovarianceRing(lifted)
    continuous = [v for v in lifted if v not in categorical]
    return GeneralizedCovarianceRing(continuous, categorical)


@st.composite
def scenarios(draw, kinds=RING_KINDS):
    relations, atom_list = draw(schemas())
    probe = make_query(relations, atom_list, IntegerRing(), ())
    variables = list(probe.variables)
    kind = draw(st.sampled_from(kinds))
    needs_lift = kind in ("covariance", "categorical")
    free = draw(
        st.lists(st.sampled_from(variables), unique=True, max_size=len(variables) - needs_lift)
    )
    free = [v for v in variables if v in free]
    bound = [v for v in variables if v not in free]
    lifted = []
    if bound:
        lifted = draw(st.lists(st.sampled_from(bound), unique=True, min_size=int(needs_lift)))
    categorical = []
    if kind == "categorical":
        categorical = draw(st.lists(st.sampled_from(lifted), unique=True))
    domain = INT_DOMAIN if kind in ("count", "sum_int") or draw(st.booleans()) else FLOAT_DOMAIN
    domain = domain[: draw(st.integers(2, len(domain)))]
    query = make_query(relations, atom_list, make_ring(kind, lifted, categorical), free)

    choices = ["default", "random", "random_tree"]
    if is_q_hierarchical(query):
        choices.append("canonical")
    if free and is_free_connex(query):
        choices.append("free_connex")
    order_kind = draw(st.sampled_from(choices))
    order = order_kind if order_kind in ("canonical", "free_connex") else None
    if order_kind == "random":
        order = random_order(query, draw(st.permutations(variables)))
    elif order_kind == "random_tree":
        order = random_tree_order(query, draw)
    static = []
    if len(relations) > 1 and draw(st.integers(0, 3)) == 0:
        static = draw(st.lists(st.sampled_from(sorted(relations)), unique=True,
                               max_size=len(relations) - 1))  # fmt: skip
    return {
        "kind": kind,
        "query": query,
        "order": order,
        "static": sorted(static),
        "domain": domain,
        "lifted": lifted,
        "categorical": categorical,
    }


class Stream:
    """Draws operations and keeps the oracle's multiset of every relation."""

    def __init__(self, draw, relations: dict[str, list[str]], domain: list, static: list[str]):
        self.draw = draw
        self.relations = relations
        self.domain = domain
        self.updatable = [r for r in relations if r not in static]
        self.present = {r: Counter() for r in relations}
        self.inserted = 0
        self.deleted = 0

    def frame(self, relation: str, rows: list[tuple]) -> pd.DataFrame:
        columns = self.relations[relation]
        dtype = np.float64 if isinstance(self.domain[0], float) else np.int64
        data = np.asarray(rows, dtype=dtype).reshape(len(rows), len(columns))
        return pd.DataFrame({c: data[:, j] for j, c in enumerate(columns)})

    def new_rows(self, relation: str, low: int = 0, high: int = 4) -> list[tuple]:
        arity = len(self.relations[relation])
        value = st.sampled_from(self.domain)
        row = st.tuples(*[value] * arity)
        return self.draw(st.lists(row, min_size=low, max_size=high))

    def present_rows(self, relation: str, high: int, state: Counter | None = None) -> list[tuple]:
        state = self.present[relation] if state is None else state
        pool = sorted(state.elements())
        if not pool:
            return []
        k = self.draw(st.integers(1, min(high, len(pool))))
        picks = self.draw(st.lists(st.integers(0, len(pool) - 1), min_size=k, max_size=k,
                                   unique=True))  # fmt: skip
        return [pool[i] for i in picks]

    def record(self, relation: str, inserts: list[tuple], deletes: list[tuple]) -> None:
        self.present[relation].update(inserts)
        self.present[relation].subtract(deletes)
        assert min(self.present[relation].values(), default=0) >= 0
        self.present[relation] = +self.present[relation]  # drop tuples with count 0
        self.inserted += len(inserts)
        self.deleted += len(deletes)

    def batch(self, relation: str, state: Counter | None = None):
        """One UpdateBatch: inserts, deletes of present tuples, or both (mixed signs)."""
        kind = self.draw(st.sampled_from(["insert", "delete", "mixed", "mixed"]))
        inserts = self.new_rows(relation, 1) if kind != "delete" else []
        deletes = self.present_rows(relation, 4, state) if kind != "insert" else []
        if kind == "mixed" and inserts and self.draw(st.booleans()):
            deletes.append(inserts[0])  # insert and delete the same tuple in one batch
        rows = inserts + deletes
        signs = np.array([1] * len(inserts) + [-1] * len(deletes), dtype=np.int64)
        order = self.draw(st.permutations(range(len(rows))))
        batch = UpdateBatch(relation, self.frame(relation, [rows[i] for i in order]), signs[order])
        return batch, inserts, deletes

    def operation(self):
        """An operation ``(method, args)`` to run on every maintainer; the oracle is updated."""
        relation = self.draw(st.sampled_from(self.updatable))
        op = self.draw(st.sampled_from(["apply", "apply", "update", "multi", "insert", "delete"]))
        if op == "update" and self.present[relation]:
            old = self.present_rows(relation, 2)
            new = self.new_rows(relation, len(old), len(old))
            self.record(relation, new, old)
            return "update", (relation, self.frame(relation, old), self.frame(relation, new))
        if op == "delete" and self.present[relation]:
            rows = self.present_rows(relation, 3)
            self.record(relation, [], rows)
            return "delete", (relation, self.frame(relation, rows))
        if op == "insert":
            rows = self.new_rows(relation, 1)
            self.record(relation, rows, [])
            return "insert", (relation, self.frame(relation, rows))
        if op == "multi":
            batches = []
            for _ in range(self.draw(st.integers(2, 3))):
                relation = self.draw(st.sampled_from(self.updatable))
                batch, inserts, deletes = self.batch(relation)
                self.record(relation, inserts, deletes)  # later batches see earlier ones
                batches.append(batch)
            return "apply", (batches,)
        batch, inserts, deletes = self.batch(relation)
        self.record(relation, inserts, deletes)
        return "apply", (batch,)

    def top_up_deletes(self):
        """Delete present tuples until deletes are >= 30% of the streamed tuples."""
        while self.deleted < 0.3 * (self.inserted + self.deleted):
            relation = next(r for r in self.updatable if self.present[r])
            rows = sorted(self.present[relation].elements())[:3]
            self.record(relation, [], rows)
            yield "delete", (relation, self.frame(relation, rows))


# ------------------------------------------------------------------------------ oracle
def flat_join(query: Query, present: dict[str, Counter], domain: list) -> pd.DataFrame:
    """The join of the current relations (pandas merges); column ``_w`` is the multiplicity."""
    dtype = np.float64 if isinstance(domain[0], float) else np.int64
    frames = []
    for i, atom in enumerate(query.atoms):
        items = [(t, c) for t, c in present[atom.relation].items() if c > 0]
        data = np.asarray([t for t, _ in items], dtype=dtype).reshape(
            len(items), len(atom.variables)
        )
        frame = pd.DataFrame({v: data[:, j] for j, v in enumerate(atom.variables)})
        frame[f"_w{i}"] = np.asarray([c for _, c in items], dtype=np.int64)
        frames.append(frame)
    joined, todo = frames[0], frames[1:]
    while todo:
        nxt = next(f for f in todo if set(f.columns) & set(joined.columns))
        todo = [f for f in todo if f is not nxt]
        joined = joined.merge(nxt, on=[c for c in nxt.columns if c in joined.columns])
    weight = np.ones(len(joined), dtype=np.int64)
    for i in range(len(frames)):
        weight = weight * joined[f"_w{i}"].to_numpy()
    return joined.assign(_w=weight)


def groups_of(query: Query, joined: pd.DataFrame):
    """(group key, rows) pairs; the single group ``()`` when the query has no free variable."""
    if not query.free:
        return [((), joined)] if len(joined) else []
    return [
        (key if isinstance(key, tuple) else (key,), rows)
        for key, rows in joined.groupby(list(query.free), sort=False)
    ]


def scalar_oracle(query, joined, lifted, real: bool):
    out = {}
    for key, rows in groups_of(query, joined):
        value = rows["_w"].to_numpy().astype(np.float64 if real else np.int64)
        for v in lifted:
            value = value * rows[v].to_numpy()
        total = float(value.sum()) if real else int(value.sum())
        # a group exists while it has derivations, even when its sum is 0 (F-IVM Remark 1);
        # without free variables the result is the one payload, compared as a value
        if query.free or total != 0:
            out[key] = total
    return out


def moments_oracle(query, joined, variables):
    out = {}
    for key, rows in groups_of(query, joined):
        w = rows["_w"].to_numpy().astype(np.float64)
        x = rows[list(variables)].to_numpy(dtype=np.float64).reshape(len(rows), len(variables))
        out[key] = (int(w.sum()), x.T @ w, x.T @ (w[:, None] * x))
    return out


def close(a, b, what) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(b), initial=0.0)))
    assert np.allclose(a, b, rtol=RTOL, atol=RTOL * scale), f"{what}: {a} != {b}"


def engine_groups(m: Maintainer) -> dict:
    if m.query.free:
        pairs = list(m.enumerate())
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), "a group is enumerated twice"
        return dict(pairs)
    ring = m.ring
    payload = m.result()
    return {} if ring.is_zero(payload) else {(): payload}


def check(m: Maintainer, scenario, present: dict[str, Counter], label: str) -> None:
    query, kind = m.query, scenario["kind"]
    joined = flat_join(query, present, scenario["domain"])
    got = engine_groups(m)
    if kind in ("count", "sum_int"):
        expected = scalar_oracle(
            query, joined, scenario["lifted"] if kind == "sum_int" else [], False
        )
        assert got == expected, label
        return
    if kind == "sum_real":
        expected = scalar_oracle(query, joined, scenario["lifted"], True)
        assert set(got) == set(expected), label
        for key in expected:
            assert math.isclose(got[key], expected[key], rel_tol=RTOL, abs_tol=1e-12), label
        return
    if kind == "product":
        counts = scalar_oracle(query, joined, [], False)
        totals = scalar_oracle(query, joined, scenario["lifted"], True)
        assert set(got) == set(counts), label  # the count component is never zero in a group
        for key, (n, total) in got.items():
            assert n == counts[key], label
            assert math.isclose(total, totals.get(key, 0.0), rel_tol=RTOL, abs_tol=1e-12), label
        return
    if kind == "covariance":
        expected = moments_oracle(query, joined, m.ring.variables)
        assert set(got) == set(expected), label
        for key, (count, sums, products) in expected.items():
            c, s, q = m.ring.moments(got[key])
            assert c == count, label
            close(s, sums, f"{label} Σx")
            close(q, products, f"{label} Σxxᵀ")
        return
    # categorical: one-hot expand the categorical variables in dictionary-code order.  The
    # engine's payloads hold dictionary codes and it has no public decoder for them yet, so
    # the test reads the code -> value table from the maintainer's dictionaries.
    ring = m.ring
    values = {v: list(m._dictionaries[v].values) for v in ring.categorical}
    codes = {v: list(range(len(values[v]))) for v in ring.categorical}
    columns = []
    for v in ring.continuous:
        columns.append(joined[v].to_numpy(dtype=np.float64))
    for v in ring.categorical:
        code_of = {value: code for code, value in enumerate(values[v])}
        onehot = np.zeros((len(joined), len(values[v])))
        onehot[np.arange(len(joined)), [code_of[x] for x in joined[v]]] = 1.0
        columns.extend(onehot.T)
    dense = joined[[]].copy()
    for j, col in enumerate(columns):
        dense[f"_x{j}"] = col
    expanded = pd.concat([joined, dense], axis=1)
    expected = moments_oracle(query, expanded, [f"_x{j}" for j in range(len(columns))])
    assert set(got) == set(expected), label
    for key, (count, sums, products) in expected.items():
        c, s, q = ring.to_dense(got[key], codes)
        assert c == count, label
        close(s, sums, f"{label} Σx")
        close(q, products, f"{label} Σxxᵀ")


# ------------------------------------------------------------------------------ driver
def run(data, scenario) -> None:
    query = scenario["query"]
    relations = {r: list(c) for r, c in query.relations.items()}
    static = scenario["static"]
    updatable = [r for r in relations if r not in static]
    maintainers = {
        "fivm": Maintainer(query, updatable=updatable, order=scenario["order"]),
        "fivm-auto": Maintainer(query, updatable=updatable, order="auto"),
        "first_order": Maintainer(query, updatable=updatable, strategy="first_order"),
        "recompute": Maintainer(query, updatable=updatable, strategy="recompute"),
        "higher_order": Maintainer(query, updatable=updatable, strategy="higher_order"),
    }
    stream = Stream(data.draw, relations, scenario["domain"], static)
    for relation in static:  # static relations are loaded before streaming
        rows = stream.new_rows(relation, 0, 6)
        stream.record(relation, rows, [])
        for m in maintainers.values():
            m.load(relation, stream.frame(relation, rows))
    stream.inserted = stream.deleted = 0
    for relation in updatable:
        rows = stream.new_rows(relation, 0, 6)
        stream.record(relation, rows, [])
        for m in maintainers.values():
            m.insert(relation, stream.frame(relation, rows))
    for name, m in maintainers.items():
        check(m, scenario, stream.present, f"{name} after the initial load")

    def snapshot() -> dict[str, Counter]:
        return {r: Counter(c) for r, c in stream.present.items()}

    operations = []  # (method, args, the oracle's relations after it)
    for _ in range(data.draw(st.integers(2, 8))):
        operations.append((*stream.operation(), snapshot()))
    for method, args in stream.top_up_deletes():
        operations.append((method, args, snapshot()))
    assert stream.deleted >= 0.3 * (stream.inserted + stream.deleted)
    for step, (method, args, present) in enumerate(operations):
        for name, m in maintainers.items():
            getattr(m, method)(*args)
            check(m, scenario, present, f"{name} after step {step} ({method})")


@SETTINGS
@given(data=st.data())
def test_counts_and_integer_sums_match_the_flat_join(data):
    run(data, data.draw(scenarios(("count", "sum_int"))))


@SETTINGS
@given(data=st.data())
def test_real_sums_match_the_flat_join(data):
    run(data, data.draw(scenarios(("sum_real", "product"))))


@SETTINGS
@given(data=st.data())
def test_covariance_matches_numpy_moments(data):
    run(data, data.draw(scenarios(("covariance",))))


@settings(SETTINGS, max_examples=30)
@given(data=st.data())
def test_generalized_covariance_matches_one_hot(data):
    run(data, data.draw(scenarios(("categorical",))))


# ------------------------------------------------------------------------------ Housing
def test_housing_covariance_through_a_stream_with_deletes():
    datasets = pytest.importorskip("ringml.datasets")
    try:
        housing = datasets.load_housing()
    except FileNotFoundError as error:
        pytest.skip(f"Housing data not available: {error}")
    relations = housing.relations  # all 6 x 25,000 rows: the stream takes about 1 s
    variables = housing.variables
    assert len(variables) == 26
    ring = CovarianceRing(variables)
    query = Query({r: list(df.columns) for r, df in relations.items()}, ring)
    m = Maintainer(query)
    stream = datasets.build_stream(relations, batch_size=1000, delete_fraction=0.3, seed=11)
    assert sum(b.n_deletes for b in stream) >= 0.29 * sum(len(b) for b in stream)
    checkpoints = set(np.linspace(5, len(stream) - 1, 8).astype(int))
    for i, batch in enumerate(stream):
        m.apply(UpdateBatch(batch.relation, batch.rows, batch.multiplicity))
        if i in checkpoints:
            state = datasets.final_state(stream[: i + 1])
            joined = datasets.natural_join(state)
            x = joined[variables].to_numpy(dtype=np.float64)
            count, sums, products = ring.moments(m.result())
            assert count == len(joined)
            close(sums, x.sum(axis=0), f"batch {i} Σx")
            close(products, x.T @ x, f"batch {i} Σxxᵀ")


# ------------------------------------------------------------------------------ float residue


@pytest.mark.parametrize(
    "strategy",
    [
        "fivm",
        "first_order",
        "recompute",
        "higher_order",
    ],
)
@pytest.mark.parametrize("ring_kind", ["real", "covariance"])
def test_deleting_every_tuple_leaves_no_group(strategy, ring_kind):
    """Realistic magnitudes (prices ~ 1e6), inserted and deleted in different batchings."""
    ring = RealRing(["B"]) if ring_kind == "real" else CovarianceRing(["B"])
    query = Query({"R": ["A", "B"], "S": ["A", "C"]}, ring, free=["C"])
    m = Maintainer(query, strategy=strategy)
    m.insert("S", pd.DataFrame({"A": [1, 2], "C": [1, 2]}))
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"A": rng.integers(1, 3, 200), "B": rng.normal(1e6, 3e5, 200)})
    for i in range(0, 200, 20):
        m.insert("R", rows.iloc[i : i + 20])
    order = rng.permutation(200)
    for i in range(0, 200, 7):
        m.delete("R", rows.iloc[order[i : i + 7]])
    assert dict(m.enumerate()) == {}


# ------------------------------------------------------------------------------ query classes
def has_join_tree(edges: list[frozenset[str]]) -> bool:
    """α-acyclicity, independently of GYO: a maximum-weight spanning tree of the intersection
    graph (weights |e ∩ f|) is a join tree iff one exists; check the running intersection."""
    n = len(edges)
    pairs = sorted(
        ((len(edges[i] & edges[j]), i, j) for i in range(n) for j in range(i + 1, n)),
        reverse=True,
    )
    component = list(range(n))

    def find(i: int) -> int:
        while component[i] != i:
            i = component[i]
        return i

    adjacent: dict[int, list[int]] = {i: [] for i in range(n)}
    for _, i, j in pairs:
        if find(i) != find(j):
            component[find(i)] = find(j)
            adjacent[i].append(j)
            adjacent[j].append(i)
    for v in set().union(*edges):
        holding = {i for i in range(n) if v in edges[i]}
        start = next(iter(holding))
        seen, todo = {start}, [start]
        while todo:  # the edges holding v must be connected in the tree
            i = todo.pop()
            for j in adjacent[i]:
                if j in holding and j not in seen:
                    seen.add(j)
                    todo.append(j)
        if seen != holding:
            return False
    return True


@st.composite
def hypergraph_queries(draw):
    """Connected queries over 2-5 atoms of 1-3 of the variables A-E (often cyclic)."""
    names = list("ABCDE")[: draw(st.integers(3, 5))]
    edge = st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)
    edges = draw(st.lists(edge, min_size=2, max_size=5))
    relations = {f"R{i}": cols for i, cols in enumerate(edges)}
    free = draw(st.lists(st.sampled_from(names), unique=True))
    probe = Query(relations, IntegerRing())
    assume(probe.is_connected)
    free = [v for v in free if v in probe.variables]
    return Query(relations, IntegerRing(), free=free)


@settings(max_examples=300, deadline=None)
@given(query=hypergraph_queries())
def test_query_classes_and_order_constructions(query):
    edges = [frozenset(a.variables) for a in query.atoms]
    acyclic = has_join_tree(edges)
    assert is_acyclic(query) == acyclic
    free_connex = acyclic and has_join_tree(
        edges + [frozenset(query.free)] if query.free else edges
    )
    assert is_free_connex(query) == free_connex
    VariableOrder.auto(query).validate(query)
    if free_connex:
        order = VariableOrder.free_connex(query)
        order.validate(query)
        assert order.is_free_top(query.free)
    else:
        with pytest.raises(VariableOrderError):
            VariableOrder.free_connex(query)
    if is_q_hierarchical(query):
        order = VariableOrder.canonical(query)
        order.validate(query)
        assert order.is_free_top(query.free)


# ------------------------------------------------------------------------------ exact integers
@pytest.mark.parametrize("dtype", [None, object])
@pytest.mark.parametrize("b_is_a_join_key", [False, True])
@pytest.mark.parametrize("strategy", ["fivm", "first_order", "recompute", "higher_order"])
def test_integer_sums_are_exact_beyond_2_53(strategy, b_is_a_join_key, dtype):
    """ℤ lifts must not pass through float64: 2**53 + 1 is not 2**53."""
    big = 2**53 + 1
    other = "B" if b_is_a_join_key else "A"
    query = Query({"R": ["A", "B"], "S": [other, "C"]}, IntegerRing(["B"]))
    m = Maintainer(query, strategy=strategy)
    m.insert("S", pd.DataFrame({other: [big if b_is_a_join_key else 1], "C": [1]}))
    m.insert("R", pd.DataFrame({"A": [1], "B": [big]}, dtype=dtype))
    assert m.result() == big
    with pytest.raises(BatchError, match="not present"):  # 2**53 was never inserted
        m.delete("R", pd.DataFrame({"A": [1], "B": [big - 1]}, dtype=dtype))
    m.delete("R", pd.DataFrame({"A": [1], "B": [big]}, dtype=dtype))
    assert m.result() == 0
