"""Property tests: random schemas, random key domains, random streams with deletes, every ring
and every strategy, checked against DuckDB after every batch.

Hypothesis draws

* a schema: an acyclic join tree of 2-5 atoms (with self-joins), a cycle (triangle, square,
  triangle with a tail, a triangle or a path over one edge table), or a random hypergraph of
  1-3-ary edges over five variables (often cyclic, sometimes a Cartesian product of
  several connected pieces);
* static relations, loaded once before streaming;
* per class of joined columns a key domain: small, negative, huge (±2**63 edges, 2**53 + 1),
  mixed magnitudes, strings, floats (with -0.0 and 1e300) or timestamps; lifted variables
  take small integers or dyadic floats (their sums are exact in float64);
* a ring (COUNT, integer and real SUM of products, a product ring, the covariance ring, the
  generalized covariance ring with categorical variables from the key domains, the relational
  ring listing variables, the matrix ring), free variables and a variable order;
* a stream of inserts, deletes of present tuples, updates, mixed-sign batches, several
  batches in one atomic ``apply``, batches of one tuple, and deletes of absent tuples (which
  must be rejected and change nothing), topped up so that deletes are at least 30% of it.

After every operation every maintainer -- F-IVM on the drawn order and on the default one, F-IVM
on a ν tree where the query allows one, first-order IVM and recomputation -- is compared with
the aggregate of the flat join that DuckDB computes from the current relations, and the change
of the result the operation returned (its root delta: per group the payload change and the
change of the number of derivations) with the difference of two consecutive DuckDB results.
The default run is a fast profile; ``-m slow`` runs the long one (>= 200 cases, >= 10^5
tuple changes).
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ringml.rings.categorical import GeneralizedCovarianceRing
from ringml.rings.covariance import CovarianceRing
from ringml.rings.matrix import MatrixRing
from ringml.rings.relational import RelationalRing
from ringml.rings.scalar import IntegerRing, ProductRing, RealRing
from test_engine_oracle import random_order, random_tree_order

from ringml.batch import UpdateBatch
from ringml.errors import BatchError, VariableOrderError
from ringml.maintainer import Maintainer
from ringml.query import Atom, Query
from ringml.variable_order import is_free_connex, is_q_hierarchical

RTOL = 1e-9
KEY_DOMAINS = {
    "small": [0, 1, 2, 3],
    "negative": [-3, -1, 0, -2],
    "huge": [2**63 - 1, -(2**63), 2**53 + 1, 2**53, 0, -1],
    "mixed": [70_000, 0, 2**40, -5, 1, 2**62],
    "strings": ["a", "", "é", "a b", "0", "A"],
    "floats": [0.5, -0.0, 1e300, -2.25, 0.0, 1e-300],
    "timestamps": [pd.Timestamp(t) for t in ("2024-02-29", "1970-01-01", "1969-12-31 23:59:59.5")],
}
NUMERIC_DOMAINS = {"ints": [1, -2, 0, 3], "dyadic": [0.5, -1.25, 2.0, 3.75, 0.0]}
RING_KINDS = (
    "count",
    "sum_int",
    "sum_real",
    "product",
    "covariance",
    "categorical",
    "relational",
    "matrix",
)


@dataclass
class Profile:
    """Sizes of one run: initial rows per relation, operations, rows per batch, row cap."""

    initial: int
    operations: tuple[int, int]
    batch: int
    cap: int
    examples: int


FAST = Profile(initial=5, operations=(2, 8), batch=4, cap=12, examples=25)
LONG = Profile(initial=30, operations=(30, 80), batch=30, cap=60, examples=35)


# ------------------------------------------------------------------------------ schemas
@st.composite
def tree_schemas(draw):
    """(relations, atoms): a random acyclic join tree of 2-5 atoms, sometimes a self-join."""
    counter = iter(range(100))
    first = [f"V{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
    relations: dict[str, tuple[str, ...]] = {"R0": tuple(first)}
    atoms: list[tuple[str, tuple[str, ...]]] = [("R0", tuple(first))]
    for _ in range(draw(st.integers(1, 4))):
        parent = atoms[draw(st.integers(0, len(atoms) - 1))][1]
        shared = draw(st.lists(st.sampled_from(parent), min_size=1, max_size=2, unique=True))
        reusable = [r for r, cols in relations.items() if len(shared) <= len(cols) <= 3]
        if reusable and draw(st.integers(0, 3)) == 0:
            relation = draw(st.sampled_from(reusable))
            arity = len(relations[relation])
        else:
            relation = f"R{len(relations)}"
            arity = min(len(shared) + draw(st.integers(0, 2)), 3)
        fresh = [f"V{next(counter)}" for _ in range(arity - len(shared))]
        variables = tuple(draw(st.permutations(shared + fresh)))
        relations.setdefault(relation, variables)
        atoms.append((relation, variables))
    return relations, atoms


CYCLES = {
    "triangle": [("R", "AB"), ("S", "BC"), ("T", "CA")],
    "square": [("R", "AB"), ("S", "BC"), ("T", "CD"), ("U", "DA")],
    "triangle_tail": [("R", "AB"), ("S", "BC"), ("T", "CA"), ("W", "CE")],
    "triangle_wide": [("R", "ABD"), ("S", "BC"), ("T", "CAE")],
    "edge_triangle": [("E", "AB"), ("E", "BC"), ("E", "CA")],
    "edge_path": [("E", "AB"), ("E", "BC"), ("E", "CD")],
    "product": [("R", "AB"), ("S", "CD")],  # Cartesian products of connected pieces
    "product_of_join": [("R", "AB"), ("S", "BC"), ("T", "DE")],
    "edge_product": [("E", "AB"), ("E", "CD")],
}


@st.composite
def cyclic_schemas(draw):
    """A cycle (possibly over one edge table) or a random hypergraph over A-E."""
    kind = draw(st.sampled_from([*CYCLES, "hypergraph", "hypergraph"]))
    if kind != "hypergraph":
        atoms = [(r, tuple(vs)) for r, vs in CYCLES[kind]]
    else:
        names = list("ABCDE")[: draw(st.integers(2, 5))]
        edge = st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)
        edges = draw(st.lists(edge, min_size=2, max_size=5))
        atoms = [(f"R{i}", tuple(e)) for i, e in enumerate(edges)]
        if draw(st.booleans()):  # keep the piece connected to the first edge
            reached, changed = set(atoms[0][1]), True
            while changed:
                changed = False
                for _, vs in atoms:
                    if reached & set(vs) and not set(vs) <= reached:
                        reached |= set(vs)
                        changed = True
            atoms = [(r, vs) for r, vs in atoms if set(vs) <= reached]
        # otherwise the pieces may be several: a Cartesian product of connected pieces
    relations: dict[str, tuple[str, ...]] = {}
    for relation, variables in atoms:
        self_join = sum(r == relation for r, _ in atoms) > 1
        columns = tuple(f"c{j}" for j in range(len(variables))) if self_join else variables
        relations.setdefault(relation, columns)
    return relations, atoms


def make_query(relations, atom_list, ring, free=()) -> Query:
    seen: Counter = Counter()
    atoms = []
    for relation, variables in atom_list:
        seen[relation] += 1
        name = relation if seen[relation] == 1 else f"{relation}_{seen[relation]}"
        atoms.append(Atom(relation, tuple(variables), name))
    return Query(relations, ring, free=free, atoms=atoms)


def column_classes(query: Query) -> dict[str, int]:
    """Class id of every variable: variables bound by one relation column share values."""
    parent: dict = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            x = parent[x]
        return x

    for atom in query.atoms:
        for column, variable in zip(query.relations[atom.relation], atom.variables, strict=True):
            parent[find(("v", variable))] = find(("c", atom.relation, column))
    roots = {}
    return {v: roots.setdefault(find(("v", v)), len(roots)) for v in query.variables}


# ------------------------------------------------------------------------------ scenarios
def make_ring(kind: str, lifted: list[str], keyed: list[str]):
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
    if kind == "categorical":
        return GeneralizedCovarianceRing(lifted, keyed)
    if kind == "relational":
        return RelationalRing(keyed)
    return MatrixRing(2)


@dataclass
class Scenario:
    kind: str
    query: Query
    order: object
    static: list[str]
    lifted: list[str]  # numeric lifts
    keyed: list[str]  # categorical / listed lifts
    domains: dict[str, list]  # per variable
    profile: Profile
    stats: dict = field(default_factory=dict)


@st.composite
def scenarios(draw, kind: str, profile: Profile):
    relations, atom_list = draw(st.one_of(tree_schemas(), cyclic_schemas()))
    probe = make_query(relations, atom_list, IntegerRing())
    variables = list(probe.variables)
    numeric_lift = kind in ("sum_int", "sum_real", "product", "covariance", "categorical")
    keyed_lift = kind in ("categorical", "relational")
    needs_bound = kind in ("covariance", "categorical", "relational")
    free = draw(
        st.lists(st.sampled_from(variables), unique=True, max_size=len(variables) - needs_bound)
    )
    free = [v for v in variables if v in free]
    bound = [v for v in variables if v not in free]
    lifted: list[str] = []
    keyed: list[str] = []
    if numeric_lift and bound:
        lifted = draw(st.lists(st.sampled_from(bound), unique=True, max_size=3))
    if keyed_lift:
        rest = [v for v in bound if v not in lifted]
        if rest:
            keyed = draw(st.lists(st.sampled_from(rest), unique=True, max_size=2))
    if kind in ("covariance",) and not lifted:
        lifted = [bound[0]]
    if kind == "categorical" and not lifted and not keyed:
        keyed = [bound[0]]
    lifted = [v for v in variables if v in lifted]
    keyed = [v for v in variables if v in keyed]
    query = make_query(relations, atom_list, make_ring(kind, lifted, keyed), free)

    classes = column_classes(query)
    numeric_domain = NUMERIC_DOMAINS["ints" if kind == "sum_int" else draw(
        st.sampled_from(sorted(NUMERIC_DOMAINS)))]  # fmt: skip
    class_domain: dict[int, list] = {}
    for c in sorted(set(classes.values())):
        if any(classes[v] == c for v in lifted):
            values = numeric_domain
        else:
            values = KEY_DOMAINS[draw(st.sampled_from(sorted(KEY_DOMAINS)))]
        class_domain[c] = values[: draw(st.integers(2, len(values)))]
    domains = {v: class_domain[classes[v]] for v in variables}

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
    static: list[str] = []
    if len(relations) > 1 and draw(st.integers(0, 3)) == 0:
        static = sorted(draw(st.lists(st.sampled_from(sorted(relations)), unique=True,
                                      max_size=len(relations) - 1)))  # fmt: skip
    return Scenario(kind, query, order, static, lifted, keyed, domains, profile)


# ------------------------------------------------------------------------------ stream
def relation_domains(scenario: Scenario) -> dict[str, list[list]]:
    """Per relation, the domain of every column (columns share the values of their class)."""
    out = {}
    query = scenario.query
    for relation, columns in query.relations.items():
        atom = query.atoms_of(relation)[0]
        out[relation] = [scenario.domains[v] for v in atom.variables]
        assert len(out[relation]) == len(columns)
    return out


def frame_of(columns: tuple[str, ...], domains: list[list], rows: list[tuple]) -> pd.DataFrame:
    data = {}
    for j, column in enumerate(columns):
        values = [row[j] for row in rows]
        sample = domains[j][0]
        if isinstance(sample, pd.Timestamp):
            data[column] = pd.to_datetime(pd.Series(values, dtype=object)).astype("datetime64[ns]")
        elif isinstance(sample, str):
            data[column] = pd.Series(values, dtype=object)
        elif isinstance(sample, float):
            data[column] = pd.Series(values, dtype=np.float64)
        else:
            data[column] = pd.Series(values, dtype=np.int64)
    return pd.DataFrame(data, columns=list(columns))


class Stream:
    """Draws operations and keeps the oracle's multiset of every relation."""

    def __init__(self, draw, scenario: Scenario) -> None:
        self.draw = draw
        self.profile = scenario.profile
        self.relations = scenario.query.relations
        self.domains = relation_domains(scenario)
        self.updatable = [r for r in self.relations if r not in scenario.static]
        self.present: dict[str, Counter] = {r: Counter() for r in self.relations}
        self.inserted = self.deleted = 0

    def frame(self, relation: str, rows: list[tuple]) -> pd.DataFrame:
        return frame_of(self.relations[relation], self.domains[relation], rows)

    def new_rows(self, relation: str, low: int, high: int) -> list[tuple]:
        room = max(self.profile.cap - sum(self.present[relation].values()), 0)
        high = max(min(high, room), low)
        row = st.tuples(*[st.sampled_from(d) for d in self.domains[relation]])
        size = self.draw(st.integers(low, high))  # uniform: lists alone favour short ones
        return self.draw(st.lists(row, min_size=size, max_size=size))

    def present_rows(self, relation: str, high: int, state: Counter | None = None) -> list[tuple]:
        pool = sorted((state if state is not None else self.present[relation]).elements(), key=repr)
        if not pool:
            return []
        picks = self.draw(st.lists(st.integers(0, len(pool) - 1), min_size=1,
                                   max_size=min(high, len(pool)), unique=True))  # fmt: skip
        return [pool[i] for i in picks]

    def absent_row(self, relation: str) -> tuple | None:
        row = self.new_rows(relation, 1, 1)[0]
        return None if self.present[relation][row] else row

    def record(self, relation: str, inserts: list[tuple], deletes: list[tuple]) -> None:
        self.present[relation].update(inserts)
        self.present[relation].subtract(deletes)
        assert min(self.present[relation].values(), default=0) >= 0
        self.present[relation] = +self.present[relation]
        self.inserted += len(inserts)
        self.deleted += len(deletes)

    def batch(self, relation: str) -> tuple[UpdateBatch, list[tuple], list[tuple]]:
        """Inserts, deletes of present tuples, or both (mixed signs, in a random order)."""
        kind = self.draw(st.sampled_from(["insert", "delete", "mixed", "mixed"]))
        size = self.profile.batch
        inserts = self.new_rows(relation, 1, size) if kind != "delete" else []
        deletes = self.present_rows(relation, size) if kind != "insert" else []
        if kind == "mixed" and inserts and self.draw(st.booleans()):
            deletes.append(inserts[0])  # inserted and deleted in the same batch
        rows = inserts + deletes
        signs = np.array([1] * len(inserts) + [-1] * len(deletes), dtype=np.int64)
        order = self.draw(st.permutations(range(len(rows))))
        frame = self.frame(relation, [rows[i] for i in order])
        return UpdateBatch(relation, frame, signs[list(order)]), inserts, deletes

    def operation(self):
        """``(method, args, size)`` to run on every maintainer; ``None`` method args for a
        batch that must be rejected.  The oracle is updated for accepted operations."""
        relation = self.draw(st.sampled_from(self.updatable))
        op = self.draw(
            st.sampled_from(["apply", "apply", "update", "multi", "one", "delete", "bad"])
        )
        if op == "bad":
            row = self.absent_row(relation)
            if row is not None:
                good = [r for r in self.new_rows(relation, 0, 2) if r != row]
                rows, signs = good + [row], [1] * len(good) + [-1]
                batch = UpdateBatch(relation, self.frame(relation, rows), np.array(signs))
                return "reject", (batch,), 0
        if op == "update" and self.present[relation]:
            old = self.present_rows(relation, 2)
            new = self.new_rows(relation, len(old), len(old))
            self.record(relation, new, old)
            args = (relation, self.frame(relation, old), self.frame(relation, new))
            return "update", args, len(old) + len(new)
        if op == "delete" and self.present[relation]:
            rows = self.present_rows(relation, self.profile.batch)
            self.record(relation, [], rows)
            return "delete", (relation, self.frame(relation, rows)), len(rows)
        if op == "one":  # a batch of one tuple
            if self.present[relation] and self.draw(st.booleans()):
                rows = self.present_rows(relation, 1)
                self.record(relation, [], rows)
                return "delete", (relation, self.frame(relation, rows)), 1
            rows = self.new_rows(relation, 1, 1)
            self.record(relation, rows, [])
            return "insert", (relation, self.frame(relation, rows)), 1
        if op == "multi":
            batches, size = [], 0
            for _ in range(self.draw(st.integers(2, 3))):
                relation = self.draw(st.sampled_from(self.updatable))
                batch, inserts, deletes = self.batch(relation)
                self.record(relation, inserts, deletes)  # later batches see earlier ones
                batches.append(batch)
                size += len(inserts) + len(deletes)
            return "apply", (batches,), size
        batch, inserts, deletes = self.batch(relation)
        self.record(relation, inserts, deletes)
        return "apply", (batch,), len(inserts) + len(deletes)

    def top_up_deletes(self):
        """Delete present tuples until deletes are >= 30% of the streamed tuples."""
        while self.deleted < 0.3 * (self.inserted + self.deleted):
            relation = next(r for r in self.updatable if self.present[r])
            rows = sorted(self.present[relation].elements(), key=repr)[: self.profile.batch]
            self.record(relation, [], rows)
            yield "delete", (relation, self.frame(relation, rows)), len(rows)


# ------------------------------------------------------------------------------ oracle
def canon(value):
    """A comparable form of a key value (numpy scalars, -0.0, timestamps)."""
    if isinstance(value, pd.Timestamp | np.datetime64) or hasattr(value, "isoformat"):
        return ("time", pd.Timestamp(value).value)
    if isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value) + 0.0


class Oracle:
    """DuckDB evaluates the join of the current relations; the result is reduced per ring."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        query = scenario.query
        self.con = duckdb.connect()
        first: dict[str, str] = {}
        joins = []
        for i, atom in enumerate(query.atoms):
            for column, variable in zip(
                query.relations[atom.relation], atom.variables, strict=True
            ):
                ref = f'a{i}."{column}"'
                if variable in first:
                    joins.append(f"{first[variable]} = {ref}")
                else:
                    first[variable] = ref
        tables = ", ".join(f'"{a.relation}" AS a{i}' for i, a in enumerate(query.atoms))
        weight = " * ".join(f"CAST(a{i}._m AS HUGEINT)" for i in range(len(query.atoms)))
        self.keys = list(query.free) + [
            v for v in [*scenario.lifted, *scenario.keyed] if v not in query.free
        ]
        select = ", ".join(f'{first[v]} AS "{v}"' for v in self.keys)
        where = f" WHERE {' AND '.join(joins)}" if joins else ""
        group = f" GROUP BY {', '.join(str(j + 1) for j in range(len(self.keys)))}"
        self.sql = (
            f"SELECT {select + ', ' if select else ''}SUM({weight}) AS w FROM {tables}{where}"
            + (group if self.keys else "")
        )

    def rows(self, present: dict[str, Counter]) -> list[tuple]:
        """(key values..., weight) of every distinct free/lifted combination of the join."""
        streams = relation_domains(self.scenario)
        for relation, columns in self.scenario.query.relations.items():
            items = list(present[relation].items())
            frame = frame_of(columns, streams[relation], [t for t, _ in items])
            frame["_m"] = np.asarray([c for _, c in items], dtype=np.int64)
            self.con.register(relation, frame)
        rows = self.con.execute(self.sql).fetchall()
        return [r for r in rows if r[-1] is not None and r[-1] != 0]

    def expected(self, present: dict[str, Counter]) -> tuple[dict, dict]:
        """``{group: comparable payload}`` (without free variables ``{(): payload}``) and
        ``{group: number of derivations}``."""
        scenario, query = self.scenario, self.scenario.query
        nfree = len(query.free)
        position = {v: j for j, v in enumerate(self.keys)}
        groups: dict[tuple, list] = {}
        for row in self.rows(present):
            key = tuple(canon(x) for x in row[:nfree])
            groups.setdefault(key, []).append(row)
        counts = {key: sum(int(r[-1]) for r in rows) for key, rows in groups.items()}
        if not query.free and not groups:
            groups[()] = []
        values = {key: reduce_rows(scenario, rows, position) for key, rows in groups.items()}
        return values, counts


def reduce_rows(scenario: Scenario, rows: list[tuple], position: dict[str, int]):
    """The payload of one group, in the comparable form of :func:`comparable`."""
    kind, lifted = scenario.kind, scenario.lifted
    weights = [int(r[-1]) for r in rows]
    count = sum(weights)

    def product(row) -> object:
        value = 1
        for v in lifted:
            value = value * row[position[v]]
        return value

    if kind in ("count", "matrix"):
        return count
    if kind == "sum_int":
        return sum(w * product(r) for w, r in zip(weights, rows, strict=True))
    if kind in ("sum_real", "product"):
        total = math.fsum(w * float(product(r)) for w, r in zip(weights, rows, strict=True))
        return total if kind == "sum_real" else (count, total)
    if kind == "relational":
        out: Counter = Counter()
        for w, r in zip(weights, rows, strict=True):
            out[tuple((v, canon(r[position[v]])) for v in sorted(scenario.keyed))] += w
        return dict(+out)
    # covariance and categorical: moments of the (one-hot) features, as {entry: value}
    out = Counter()
    for w, r in zip(weights, rows, strict=True):
        features = [((v,), float(r[position[v]])) for v in lifted]
        features += [((v, canon(r[position[v]])), 1.0) for v in scenario.keyed]
        out[("c",)] += w
        for i, (a, x) in enumerate(features):
            out[("s", a)] += w * x
            for b, y in features[i:]:
                out[("q", *sorted([a, b], key=repr))] += w * x * y
    return dict(out)


def comparable(m: Maintainer, scenario: Scenario, payload):
    """An engine payload in the form :func:`reduce_rows` gives."""
    kind, ring = scenario.kind, m.ring
    if kind in ("count", "sum_int", "sum_real"):
        return payload
    if kind == "product":
        return tuple(payload)
    if kind == "matrix":
        assert np.array_equal(payload, payload[0, 0] * np.eye(2)), payload
        return int(round(payload[0, 0]))
    if kind == "relational":
        return {
            tuple((v, canon(m.decode(v, [code])[0])) for v, code in key): mult
            for key, mult in payload.items()
        }
    if kind == "covariance":
        count, sums, products = ring.moments(payload)
        names = list(ring.variables)
        labels = [(v,) for v in names]
    else:
        codes = {v: sorted(_categories(payload, ring, v)) for v in ring.categorical}
        count, sums, products = ring.to_dense(payload, codes)
        labels = [(v,) for v in ring.continuous]
        for v in ring.categorical:
            labels += [(v, canon(x)) for x in m.decode(v, codes[v])]
    out = {("c",): count}
    for i, a in enumerate(labels):
        out[("s", a)] = sums[i]
        for j in range(i, len(labels)):
            out[("q", *sorted([a, labels[j]], key=repr))] = products[i, j]
    return out


def _categories(payload, ring, variable: str) -> set[int]:
    """The category codes of ``variable`` that a generalized covariance payload holds."""
    j = ring.variables.index(variable)
    found: set[int] = set(payload.sums.get(j, {}) or {})
    for (a, b), rel in payload.products.items():
        if not isinstance(rel, dict):
            continue
        for key in rel:
            if a == b == j:
                found.add(key)
            elif b == j and a != j:
                found.add(key[1] if isinstance(key, tuple) else key)
            elif a == j:
                found.add(key[0] if isinstance(key, tuple) else key)
    return found


def assert_same(got, expected, label: str) -> None:
    if isinstance(expected, dict):
        keys = set(got) | set(expected)
        for k in keys:
            assert_same(got.get(k, 0), expected.get(k, 0), f"{label} [{k}]")
        return
    if isinstance(expected, tuple):
        assert len(got) == len(expected), label
        for a, b in zip(got, expected, strict=True):
            assert_same(a, b, label)
        return
    if isinstance(expected, int) and isinstance(got, int | np.integer):
        assert int(got) == expected, f"{label}: {got} != {expected}"
        return
    a, b = float(got), float(expected)
    assert math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-9), f"{label}: {a} != {b}"


def zero_like(value):
    if isinstance(value, dict):
        return {}
    if isinstance(value, tuple):
        return tuple(zero_like(x) for x in value)
    return 0


def difference(after, before):
    """``after - before`` of comparable payloads (dicts entrywise, tuples componentwise)."""
    if isinstance(after, dict) or isinstance(before, dict):
        a, b = after or {}, before or {}
        return {k: difference(a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b)}
    if isinstance(after, tuple):
        return tuple(difference(x, y) for x, y in zip(after, before, strict=True))
    return after - before


def check_delta(m: Maintainer, scenario: Scenario, delta, before, after, label: str) -> None:
    """The delta an apply returned is the change of the oracle's result and group counts."""
    if not m._has_result_deltas():
        assert delta is None, label
        return
    (values_before, counts_before), (values_after, counts_after) = before, after
    keys = [tuple(canon(x) for x in k) for k in delta.keys()]
    assert len(keys) == len(set(keys)), f"{label}: a group changes twice in one delta"
    got = {k: comparable(m, scenario, p) for k, p in zip(keys, delta.payloads(), strict=True)}
    groups = set(values_before) | set(values_after) | set(got)
    for g in groups:
        shape = values_after.get(g, values_before.get(g, got.get(g)))
        want = difference(
            values_after.get(g, zero_like(shape)), values_before.get(g, zero_like(shape))
        )
        assert_same(got.get(g, zero_like(want)), want, f"{label} Δ group {g}")
    now = m.groups(at=delta.codes)  # the current payloads and counts of the changed groups
    for key, payload in zip(keys, now.payloads(), strict=True):
        shape = values_after.get(key, values_before.get(key))
        want = values_after.get(key, zero_like(shape))
        assert_same(comparable(m, scenario, payload), want, f"{label} groups(at) {key}")
    if delta.support is not None:
        for key, count in zip(keys, now.support.tolist(), strict=True):
            assert count == counts_after.get(key, 0), f"{label} derivations now of {key}"
        support = dict(zip(keys, delta.support.tolist(), strict=True))
        for g in set(counts_before) | set(counts_after) | set(support):
            change = counts_after.get(g, 0) - counts_before.get(g, 0)
            assert support.get(g, 0) == change, f"{label} Δ derivations of {g}"


def engine_result(m: Maintainer, scenario: Scenario) -> dict:
    if not m.query.free:
        return {(): comparable(m, scenario, m.result())}
    pairs = list(m.enumerate())
    keys = [tuple(canon(x) for x in k) for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"a group is enumerated twice: {keys}"
    return {k: comparable(m, scenario, p) for k, (_, p) in zip(keys, pairs, strict=True)}


def check(maintainers: dict[str, Maintainer], scenario: Scenario, expected, label: str):
    expected = expected[0]
    for name, m in maintainers.items():
        got = engine_result(m, scenario)
        if scenario.query.free:
            assert set(got) == set(expected), f"{name} {label}: groups {set(got) ^ set(expected)}"
        for key in expected:
            assert_same(got[key], expected[key], f"{name} {label} group {key}")


# ------------------------------------------------------------------------------ driver
def build_maintainers(scenario: Scenario) -> dict[str, Maintainer]:
    query = scenario.query
    updatable = [r for r in query.relations if r not in scenario.static]
    maintainers = {
        "fivm": Maintainer(query, updatable=updatable, order=scenario.order),
        "fivm-auto": Maintainer(query, updatable=updatable),
        "first_order": Maintainer(query, updatable=updatable, strategy="first_order"),
        "recompute": Maintainer(query, updatable=updatable, strategy="recompute"),
        "higher_order": Maintainer(query, updatable=updatable, strategy="higher_order"),
    }
    try:
        maintainers["fivm-nu"] = Maintainer(query, updatable=updatable, tree="nu")
    except VariableOrderError:  # ν needs a free-connex or q-hierarchical query
        pass
    return maintainers


def run(data, scenario: Scenario) -> int:
    """Stream and check; returns the number of tuple changes applied."""
    maintainers = build_maintainers(scenario)
    oracle = Oracle(scenario)
    stream = Stream(data.draw, scenario)
    profile = scenario.profile
    for relation in scenario.static:
        rows = stream.new_rows(relation, 0, profile.initial)
        stream.record(relation, rows, [])
        for m in maintainers.values():
            m.load(relation, stream.frame(relation, rows))
    for relation in stream.updatable:
        rows = stream.new_rows(relation, 0, profile.initial)
        stream.record(relation, rows, [])
        for m in maintainers.values():
            m.insert(relation, stream.frame(relation, rows))
    changes = stream.inserted
    stream.inserted = stream.deleted = 0
    before = oracle.expected(stream.present)
    check(maintainers, scenario, before, "after loading")

    def snapshot():
        return {r: Counter(c) for r, c in stream.present.items()}

    operations = [(*stream.operation(), snapshot())
                  for _ in range(data.draw(st.integers(*profile.operations)))]  # fmt: skip
    operations += [(*op, snapshot()) for op in stream.top_up_deletes()]
    assert stream.deleted >= 0.3 * (stream.inserted + stream.deleted)
    for step, (method, args, size, present) in enumerate(operations):
        label = f"after step {step} ({method})"
        after = oracle.expected(present)
        for name, m in maintainers.items():
            if method == "reject":
                with pytest.raises(BatchError, match="not present"):
                    m.apply(*args)
            else:
                delta = getattr(m, method)(*args)
                check_delta(m, scenario, delta, before, after, f"{name} {label}")
        check(maintainers, scenario, after, label)
        before = after
        changes += size
    return changes


TOTALS: Counter = Counter()


def property_test(profile: Profile):
    @settings(
        max_examples=profile.examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def test(kind, data):
        scenario = data.draw(scenarios(kind, profile))
        TOTALS[(profile.cap, "changes")] += run(data, scenario)
        TOTALS[(profile.cap, "cases")] += 1

    return test


@pytest.mark.parametrize("kind", RING_KINDS)
def test_random_streams_match_duckdb(kind):
    property_test(FAST)(kind)


@pytest.mark.slow
def test_long_profile_random_streams_match_duckdb():
    """>= 200 random cases and >= 10^5 tuple changes, every ring, checked after every batch."""
    for kind in RING_KINDS:
        property_test(LONG)(kind)
    cases, changes = TOTALS[(LONG.cap, "cases")], TOTALS[(LONG.cap, "changes")]
    print(f"\nlong profile: {cases} cases, {changes} tuple changes, every one checked")
    assert cases >= 200 and changes >= 10**5
