"""Bad input is rejected at the edge with a BatchError, and a rejected batch changes nothing.

Every rejection must name the relation, the column and the value, and leave the result and
every stored view exactly as before — also when the bad batch is the second of a multi-batch
``apply([...])`` whose first batch is fine.  ``allow_absent_deletes=True`` turns the check of
deletes off (plain ring semantics: payloads may go negative).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from ringml.rings.scalar import IntegerRing

from ringml.batch import UpdateBatch
from ringml.errors import BatchError
from ringml.maintainer import Maintainer
from ringml.query import Query

RELS = {"R": ["A", "B"], "S": ["A", "C", "E"], "T": ["C", "D"]}
STRATEGIES = ["fivm", "first_order", "recompute", "higher_order"]
FREE = [(), ("A", "C")]


def fig6() -> dict[str, pd.DataFrame]:
    return {
        "R": pd.DataFrame({"A": [1, 1, 2, 3], "B": [1, 2, 3, 4]}),
        "S": pd.DataFrame({"A": [1, 1, 1, 2], "C": [1, 1, 2, 2], "E": [1, 2, 3, 4]}),
        "T": pd.DataFrame({"C": [1, 2, 2, 3], "D": [1, 2, 3, 4]}),
    }


def loaded(strategy: str, free=(), **options) -> Maintainer:
    """Fig. 6 data; B and E are lifted features (SUM(B·E)), A and C join keys."""
    m = Maintainer(Query(RELS, IntegerRing(["B", "E"]), free=list(free)), strategy=strategy,
                   **options)  # fmt: skip
    for name, frame in fig6().items():
        m.insert(name, frame)
    return m


def snapshot(m: Maintainer) -> dict:
    """The result and the content of every stored view."""
    state = {"result": m.result(), "entries": m.stored_entries()}
    if m.strategy == "fivm":
        for node in m.tree.materialized():
            state[node.name] = m.view(node.name)
    return state


GOOD_T = UpdateBatch.inserts("T", pd.DataFrame({"C": [1, 3], "D": [7, 8]}))

# (name, batch, relation, column or None, text of the value in the message)
BAD_BATCHES = [
    ("unknown relation", UpdateBatch.inserts("U", pd.DataFrame({"A": [1]})), "U", None, None),
    ("missing column", UpdateBatch.inserts("R", pd.DataFrame({"A": [5]})), "R", "B", None),
    (
        "extra column",
        UpdateBatch.inserts("R", pd.DataFrame({"A": [5], "B": [5], "Z": [0]})),
        "R",
        "Z",
        None,
    ),
    (
        "string in a feature column",
        UpdateBatch.inserts("R", pd.DataFrame({"A": [5, 6], "B": [5, "five"]})),
        "R",
        "B",
        "'five'",
    ),
    (
        "NaN in a feature column",
        UpdateBatch.inserts("S", pd.DataFrame({"A": [1, 2], "C": [1, 2], "E": [5.0, np.nan]})),
        "S",
        "E",
        "nan",
    ),
    (
        "infinity in a feature column",
        UpdateBatch.inserts("R", pd.DataFrame({"A": [1], "B": [np.inf]})),
        "R",
        "B",
        "inf",
    ),
    (
        "non-integer for an integer lift",
        UpdateBatch.inserts("R", pd.DataFrame({"A": [1, 2], "B": [2.0, 2.5]})),
        "R",
        "B",
        "2.5",
    ),
    (
        "NaN in a join key",
        UpdateBatch.inserts("S", pd.DataFrame({"A": [1, np.nan], "C": [1, 1], "E": [5, 6]})),
        "S",
        "A",
        "nan",
    ),
    (
        "None in a join key",
        UpdateBatch.inserts("T", pd.DataFrame({"C": [2, None], "D": [5, 6]}, dtype=object)),
        "T",
        "C",
        "None",
    ),
    (
        "deleting an absent tuple",
        UpdateBatch.deletes("R", pd.DataFrame({"A": [1, 7], "B": [1, 7]})),
        "R",
        "A",
        "7",
    ),
    (
        "deleting a tuple more often than present",
        UpdateBatch.deletes("R", pd.DataFrame({"A": [1, 1], "B": [2, 2]})),
        "R",
        "B",
        "2",
    ),
    (
        "fractional multiplicity",
        UpdateBatch("R", pd.DataFrame({"A": [1], "B": [9]}), np.array([0.5])),
        "R",
        None,
        None,
    ),
    (
        "multiplicities of the wrong length",
        UpdateBatch("R", pd.DataFrame({"A": [1], "B": [9]}), np.array([1, 1])),
        "R",
        None,
        None,
    ),
]
IDS = [case[0] for case in BAD_BATCHES]


def check_error(error: BatchError, relation, column, value) -> None:
    message = str(error)
    assert error.relation == relation
    assert f"'{relation}'" in message
    if column is not None:
        assert f"'{column}'" in message
    if value is not None:
        assert value in message


@pytest.mark.parametrize("free", FREE)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("name", "batch", "relation", "column", "value"), BAD_BATCHES, ids=IDS)
def test_bad_batch_is_rejected_and_changes_nothing(
    name, batch, relation, column, value, strategy, free
):
    m = loaded(strategy, free)
    before = snapshot(m)
    with pytest.raises(BatchError) as caught:
        m.apply(batch)
    check_error(caught.value, relation, column, value)
    assert snapshot(m) == before


@pytest.mark.parametrize("free", FREE)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("name", "batch", "relation", "column", "value"), BAD_BATCHES, ids=IDS)
def test_bad_second_batch_rejects_the_whole_apply(
    name, batch, relation, column, value, strategy, free
):
    m = loaded(strategy, free)
    before = snapshot(m)
    with pytest.raises(BatchError) as caught:
        m.apply([GOOD_T, batch])
    check_error(caught.value, relation, column, value)
    assert snapshot(m) == before
    # nothing of the rejected apply was recorded: the good batch still applies exactly once
    m.apply(GOOD_T)
    reference = loaded("recompute", free)
    reference.apply(GOOD_T)
    assert m.result() == reference.result()
    with pytest.raises(BatchError, match="not present"):
        m.apply([UpdateBatch.deletes("T", GOOD_T.rows)] * 2)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rejected_insert_is_not_recorded_as_present(strategy):
    m = loaded(strategy)
    bad = pd.DataFrame({"A": [1, 2], "B": [5, "x"]})
    with pytest.raises(BatchError):
        m.insert("R", bad)
    with pytest.raises(BatchError, match="not present"):
        m.delete("R", pd.DataFrame({"A": [1], "B": [5]}))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_updating_a_static_relation_is_rejected(strategy):
    query = Query(RELS, IntegerRing(["B", "E"]))
    m = Maintainer(query, updatable=["R", "T"], strategy=strategy)
    m.load("S", fig6()["S"])
    m.insert("R", fig6()["R"])
    m.insert("T", fig6()["T"])
    before = snapshot(m)
    with pytest.raises(BatchError, match="'S' is static") as caught:
        m.apply([GOOD_T, UpdateBatch.inserts("S", pd.DataFrame({"A": [1], "C": [1], "E": [1]}))])
    assert caught.value.relation == "S"
    assert snapshot(m) == before


def test_batch_error_is_a_value_error_with_fields():
    m = loaded("fivm")
    with pytest.raises(ValueError) as caught:
        m.insert("S", pd.DataFrame({"A": [1], "C": [1], "E": ["e"]}))
    error = caught.value
    assert isinstance(error, BatchError)
    assert (error.relation, error.column, error.value) == ("S", "E", "e")


@pytest.mark.parametrize("free", FREE)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_allow_absent_deletes_gives_plain_ring_semantics(strategy, free):
    m = loaded(strategy, free, allow_absent_deletes=True)
    reference = loaded("recompute", free, allow_absent_deletes=True)
    # (1, 1) is present once: deleting it three times leaves payload -2 on that tuple, and
    # (9, 9) was never there: it gets -1 (it joins with nothing)
    deletes = UpdateBatch.deletes("R", pd.DataFrame({"A": [1, 1, 1, 9], "B": [1, 1, 1, 9]}))
    m.apply(deletes)
    reference.apply(deletes)
    # SUM(B·E) over the join is 51; R[(1,1)] contributes 1 · (1+2+3+3) = 9 per unit and
    # goes from 1 to -2
    if free:
        # the groups (1,1) and (1,2) cancel to exactly 0 and vanish (t ∈ R iff R[t] ≠ 0)
        assert m.result() == {(2, 2): 24} == reference.result()
    else:
        assert m.result() == 51 - 3 * 9 == reference.result()
    # inserting the tuples back restores the original state
    m.insert("R", pd.DataFrame({"A": [1, 1, 1, 9], "B": [1, 1, 1, 9]}))
    assert m.result() == loaded("fivm", free).result()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_numbers_in_object_columns_join_like_numeric_ones(strategy):
    """An object-dtype column of numbers (JSON, dtype=object, after a None was filled) must key
    like an int64 column: 1 == 1.0 == object 1, for joins, groups and the delete check."""
    query = Query({"R": ["A", "B"], "S": ["A", "C"]}, IntegerRing(["B"]), free=["C"])
    m = Maintainer(query, strategy=strategy)
    m.insert("R", pd.DataFrame({"A": [1, 2, 3], "B": [10, 20, 30]}))
    m.insert("S", pd.DataFrame({"A": [1, 2.0, "3"], "C": [7, 7, 8]}, dtype=object))
    assert m.result() == {(7,): 30}  # the string "3" is not the number 3
    m.delete("R", pd.DataFrame({"A": [1.0], "B": [10]}, dtype=object))
    assert m.result() == {(7,): 20}
    m.delete("S", pd.DataFrame({"A": [2], "C": [7]}))
    assert m.result() == {}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    ("bad", "text"),
    [(None, "None"), (np.nan, "nan"), (np.inf, "inf"), (pd.NaT, "NaT")],
    ids=["None", "NaN", "inf", "NaT"],
)
def test_missing_value_in_an_unused_column_is_rejected_by_every_strategy(strategy, bad, text):
    """D is neither a key nor a feature of SUM(B) GROUP BY A under F-IVM, but the classic
    strategies key every variable: all strategies must accept the same batches."""
    query = Query({"R": ["A", "B"], "T": ["A", "D"]}, IntegerRing(["B"]), free=["A"])
    m = Maintainer(query, strategy=strategy)
    m.insert("R", pd.DataFrame({"A": [1], "B": [5]}))
    m.insert("T", pd.DataFrame({"A": [1], "D": ["x"]}))
    before = snapshot(m)
    rows = pd.DataFrame({"A": [1, 1], "D": [2.0, bad]}, dtype=object if bad is None else None)
    with pytest.raises(BatchError) as caught:
        m.insert("T", rows)
    check_error(caught.value, "T", "D", text)
    assert snapshot(m) == before


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ring_overflow_during_propagation_changes_nothing(strategy):
    query = Query({"R": ["A", "B"], "S": ["A", "C"]}, IntegerRing(["B"]))
    m = Maintainer(query, strategy=strategy)
    m.insert("S", pd.DataFrame({"A": [1] * 8, "C": range(8)}))
    m.insert("R", pd.DataFrame({"A": [1], "B": [2**59]}))  # SUM = 8 · 2^59 = 2^62
    before = snapshot(m)
    with pytest.raises(BatchError, match="no view changed"):  # 2^63 does not fit int64
        m.insert("R", pd.DataFrame({"A": [1], "B": [2**59]}))
    assert snapshot(m) == before
    with pytest.raises(BatchError, match="not present"):
        m.delete("R", pd.DataFrame({"A": [1, 1], "B": [2**59, 2**59]}))
    m.insert("S", pd.DataFrame({"A": [2], "C": [0]}))  # joins nothing
    assert m.result() == 2**62


def test_decode_maps_category_codes_back_to_values():
    from ringml import covariance_query

    query = covariance_query({"R": ["k", "color", "x"], "S": ["k", "y"]}, categorical=["color"])
    m = Maintainer(query)
    m.insert("R", pd.DataFrame({"k": [1, 1, 2], "color": ["red", "blue", "red"], "x": [1.0, 2, 3]}))
    m.insert("S", pd.DataFrame({"k": [1, 2], "y": [10.0, 20.0]}))
    counts = query.ring.count_tables(m.result())[("color",)]
    assert dict(zip(m.decode("color", list(counts)), counts.values(), strict=True)) == {
        "red": 2,
        "blue": 1,
    }
    with pytest.raises(KeyError, match="unknown variable"):
        m.decode("colour", [0])


@pytest.mark.parametrize("tree", ["tau", "nu"])
def test_a_pickled_maintainer_resumes_where_it_stopped(tree):
    import pickle

    query = Query({"R": ["A", "B"], "S": ["A", "C"]}, IntegerRing(), free=["A", "B"])
    m = Maintainer(query, tree=tree)
    m.insert("R", pd.DataFrame({"A": [1, 1, 2], "B": [1, 2, 3]}))
    m.insert("S", pd.DataFrame({"A": [1, 2, 2], "C": [5, 6, 7]}))
    copy = pickle.loads(pickle.dumps(m))
    assert copy.result() == m.result()
    for each in (m, copy):
        each.delete("S", pd.DataFrame({"A": [2], "C": [6]}))
        each.insert("R", pd.DataFrame({"A": [2], "B": [4]}))
    assert copy.result() == m.result() == {(1, 1): 1, (1, 2): 1, (2, 3): 1, (2, 4): 1}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_pickled_maintainer_continues_bit_for_bit(strategy):
    """Floating payloads of a restored maintainer stay equal to the original's bit for bit
    (first_order and recompute used to rebuild their secondary indexes after a restore and
    to sum the matches of a join in another order)."""
    import pickle

    from ringml import covariance_query

    relations = {"R": ["a", "x"], "S": ["a", "b", "y"], "T": ["b", "z"]}
    rng = np.random.default_rng(14)

    def rows(relation: str, n: int) -> pd.DataFrame:
        data = {
            "a": rng.integers(0, 5, n),
            "b": rng.integers(0, 5, n),
            "x": rng.normal(1e3, 1, n),
            "y": rng.normal(size=n),
            "z": rng.normal(-5, 3, n),
        }
        return pd.DataFrame({c: data[c] for c in relations[relation]})

    m = Maintainer(covariance_query(relations), strategy=strategy)
    for relation in relations:
        m.insert(relation, rows(relation, 5))
    copy = pickle.loads(pickle.dumps(m))
    for _ in range(12):
        batch = rows(list(relations)[rng.integers(3)], int(rng.integers(1, 5)))
        relation = next(r for r in relations if list(batch.columns) == relations[r])
        m.insert(relation, batch)
        copy.insert(relation, batch)
        a, b = m.result(), copy.result()
        assert a.count == b.count
        np.testing.assert_array_equal(a.sums, b.sums)
        np.testing.assert_array_equal(a.products, b.products)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_error_that_is_not_a_rejection_changes_no_view(monkeypatch, strategy):
    """A bug (any exception) while a batch propagates rolls back what the batch changed,
    as a rejection does, and is raised as it is."""
    from ringml.store import ViewStore

    m = loaded(strategy)
    before = snapshot(m)
    add = ViewStore.add
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # after a first store changed
            raise RuntimeError("boom")
        return add(self, *args, **kwargs)

    monkeypatch.setattr(ViewStore, "add", failing)
    with pytest.raises(RuntimeError, match="boom"):
        m.insert("R", pd.DataFrame({"A": [1, 2], "B": [7, 8]}))
    monkeypatch.setattr(ViewStore, "add", add)
    assert len(calls) >= 2  # the batch failed part way (undoing it may add again)
    assert snapshot(m) == before
    m.insert("R", pd.DataFrame({"A": [1, 2], "B": [7, 8]}))  # not recorded as present before
    m.delete("R", pd.DataFrame({"A": [1, 2], "B": [7, 8]}))
    assert snapshot(m) == before


@pytest.mark.parametrize("flush_at", [1, 3, 10**9])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_absent_deletes_are_rejected_whenever_the_counts_are_folded(
    monkeypatch, strategy, flush_at
):
    """The tuple counts fold their recorded changes into the index only now and then: a
    delete must be checked the same before and after, across batches and within one."""
    from ringml import batch as batch_module

    monkeypatch.setattr(batch_module, "_FLUSH_AT", flush_at)
    m = loaded(strategy)
    extra = pd.DataFrame({"A": [5, 5, 6], "B": [7, 7, 8]})  # (5, 7) twice
    m.insert("R", extra)
    m.apply(UpdateBatch.deletes("R", extra.iloc[:1]))  # one (5, 7) left

    def rejected(batches, value):
        before = snapshot(m)
        with pytest.raises(BatchError, match="not present") as caught:
            m.apply(batches)
        check_error(caught.value, "R", "B", value)
        assert snapshot(m) == before

    rejected(UpdateBatch.deletes("R", extra.iloc[:2]), "7")  # more copies than present
    rejected([UpdateBatch.deletes("R", extra.iloc[:1])] * 2, "7")  # across two batches
    # (6, 8) is present once; an insert and three deletes of it in one batch: one short
    both = pd.DataFrame({"A": [6] * 4, "B": [8] * 4})
    rejected(UpdateBatch("R", both, np.array([1, -1, -1, -1])), "8")
    rejected(UpdateBatch("R", both, np.array([-1, -1, -1, 1])), "8")
    # with a copy to spare the batch is fine, and leaves one (6, 8)
    m.apply(UpdateBatch("R", both, np.array([1, -1, 1, -1])))
    m.apply(UpdateBatch("R", both.iloc[:3], np.array([1, -1, -1])))
    rejected(UpdateBatch.deletes("R", both.iloc[:1]), "8")
    # an insert earlier in the same apply may be deleted later in it
    m.apply([UpdateBatch.inserts("R", both.iloc[:1]), UpdateBatch.deletes("R", both.iloc[:1])])
    m.apply(UpdateBatch.deletes("R", extra.iloc[:1]))
    rejected(UpdateBatch.deletes("R", extra.iloc[:1]), "7")
    reference = loaded("recompute")
    assert m.result() == reference.result()
