"""The compiler's logical plans of small queries: atoms per alias, join variables, per-atom
filters and computed columns, aggregates as sums of components, constant folding."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest
from ringml.rings.scalar import IntegerRing, ProductRing, RealRing

from ringml.sql import Catalog, compile_view
from ringml.sql.expressions import Case, Col, Extract, Lit, Logic

CATALOG = Catalog(
    {
        "R": {"a": "INTEGER", "b": "INTEGER", "x": "DOUBLE"},
        "S": {"b": "INTEGER", "c": "VARCHAR", "y": "INTEGER"},
        "T": {"c": "VARCHAR", "d": "DATE", "z": "DOUBLE"},
        "E": {"src": "INTEGER", "dst": "INTEGER"},
        "lineitem": {
            "l_partkey": "INTEGER",
            "l_extendedprice": "DECIMAL(15,2)",
            "l_discount": "DECIMAL(15,2)",
            "l_shipdate": "DATE",
        },
        "part": {"p_partkey": "INTEGER", "p_type": "VARCHAR"},
    }
)


def plan(sql: str):
    return compile_view(sql, CATALOG)


def atom(p, alias):
    return next(a for a in p.atoms if a.alias == alias)


def test_join_classes_become_shared_variables():
    p = plan("SELECT R.a, S.c FROM R, S, T WHERE R.b = S.b AND S.c = T.c AND R.x > 1")
    r, s, t = atom(p, "R"), atom(p, "S"), atom(p, "T")
    assert r.variables[r.columns.index("b")] == s.variables[s.columns.index("b")]
    assert s.variables[s.columns.index("c")] == t.variables[t.columns.index("c")]
    assert r.filter.sql() == "(R.x > 1)"
    assert s.filter is None and t.filter is None
    assert t.columns == ("c",)  # only what the view needs: T.d, T.z are never read
    assert not p.grouped and [v for v, _ in p.keys] == ["R.a", "S.c"]
    assert isinstance(p.ring(), IntegerRing) and p.query().free == ("R.a", "S.c")


def test_self_join_has_one_atom_per_alias():
    p = plan("SELECT COUNT(*) FROM E e1, E e2, E e3 WHERE e1.dst = e2.src AND e2.dst = e3.src")
    assert [(a.alias, a.table, a.columns) for a in p.atoms] == [
        ("e1", "E", ("dst",)),
        ("e2", "E", ("src", "dst")),
        ("e3", "E", ("src",)),
    ]
    assert p.tables == ("E",)
    query = p.query()
    assert [a.relation for a in query.atoms] == ["e1", "e2", "e3"]


def test_two_columns_of_one_atom_in_one_class_become_a_selection():
    p = plan("SELECT COUNT(*) FROM E e1, E e2 WHERE e1.dst = e2.src AND e2.src = e1.src")
    e1 = atom(p, "e1")
    assert len(e1.columns) == 1 and e1.filter.sql() in ("(e1.dst = e1.src)", "(e1.src = e1.dst)")


def test_q14_aggregates_are_sums_of_products_of_per_atom_factors():
    p = plan(
        "select 100.00 * sum(case when p_type like 'PROMO%' then l_extendedprice * "
        "(1 - l_discount) else 0 end) / sum(l_extendedprice * (1 - l_discount)) as promo "
        "from lineitem, part where l_partkey = p_partkey and l_shipdate >= date '1995-09-01' "
        "and l_shipdate < date '1995-09-01' + interval '1' month"
    )
    line, part = atom(p, "lineitem"), atom(p, "part")
    # the indicator of the part's condition and the lineitem's revenue, each one factor column
    (indicator,) = [e for e, n in zip(part.expressions, part.numeric, strict=True) if n]
    assert isinstance(indicator, Case) and indicator.sql().startswith("CASE WHEN (part.p_type LIKE")
    (revenue,) = [e for e, n in zip(line.expressions, line.numeric, strict=True) if n]
    assert revenue.sql() == "(lineitem.l_extendedprice * (1 - lineitem.l_discount))"
    names = {c.name: c for c in p.components}
    assert [c.name for c in p.components] == ["count", "c1", "c2"]
    assert len(names["c1"].lifted) == 2 and len(names["c2"].lifted) == 1
    promo, total = p.aggregates
    assert promo.value == ((1, "c1"),) and total.value == ((1, "c2"),)
    assert isinstance(p.ring(), ProductRing) and p.global_aggregate
    # the INTERVAL is folded: the filter compares with two date constants
    assert isinstance(line.filter, Logic)
    bounds = [part.right.value for part in line.filter.parts]
    assert bounds == [np.datetime64("1995-09-01", "ns"), np.datetime64("1995-10-01", "ns")]


def test_sums_over_several_tables_expand_into_components():
    p = plan("SELECT R.a, SUM(R.x + 2 * S.y), AVG(S.y) FROM R JOIN S USING (b) GROUP BY R.a")
    components = {c.name: c for c in p.components}
    total, average = p.aggregates
    (x, (x_var,)), (two_y, (y_var,)) = sorted((c, components[n].lifted) for c, n in total.value)
    assert (x, x_var, two_y) == (1, "R.x", 1)  # 2 * S.y is one factor of S: a computed column
    s = atom(p, "S")
    assert s.expressions[s.variables.index(y_var)].sql() == "(2 * S.y)"
    assert total.type == "float" and average.function == "avg" and average.nonnull is None
    assert isinstance(p.ring().rings[1], RealRing) and isinstance(p.ring().rings[2], IntegerRing)


def test_nullable_case_counts_its_non_null_arguments():
    p = plan(
        "SELECT S.c, SUM(CASE WHEN R.a > 1 THEN S.y END) FROM R JOIN S ON R.b = S.b GROUP BY S.c"
    )
    (total,) = p.aggregates
    assert total.nonnull is not None and total.nonnull != total.value
    lifted = {c.name: c.lifted for c in p.components}
    assert [lifted[n] for _, n in total.nonnull] == [lifted[n][:1] for _, n in total.nonnull]


def test_computed_group_key_is_a_per_atom_column():
    p = plan("SELECT EXTRACT(year FROM d) AS yr, SUM(z) FROM T GROUP BY 1")
    ((key, kind),) = p.keys
    t = atom(p, "T")
    position = t.variables.index(key)
    assert kind == "int" and isinstance(t.expressions[position], Extract)
    assert p.outputs[0].expression == Col("", key, "int")


def test_derived_tables_are_inlined():
    p = plan(
        "SELECT q.c, SUM(q.v) FROM (SELECT S.c, R.x * S.y AS v FROM R JOIN S ON R.b = S.b "
        "WHERE S.y > 0) AS q GROUP BY q.c"
    )
    assert [a.alias for a in p.atoms] == ["q.R", "q.S"]
    assert atom(p, "q.S").filter.sql() == "(q.S.y > 0)"
    (component,) = [c for c in p.components if c.lifted]
    assert component.lifted == ("q.R.x", "q.S.y")


def test_using_and_natural_columns_appear_once():
    assert plan("SELECT * FROM R JOIN S USING (b)").columns == ("a", "b", "x", "c", "y")
    assert plan("SELECT * FROM S NATURAL JOIN T").columns == ("b", "c", "y", "d", "z")
    assert plan("SELECT b FROM R JOIN S USING (b)").columns == ("b",)
    p = plan("SELECT * FROM E e1 JOIN E e2 ON e1.dst = e2.src")
    assert p.columns == ("src", "dst", "src_1", "dst_1")


def test_constants_fold_exactly():
    p = plan("SELECT COUNT(*) FROM R WHERE x BETWEEN .06 - 0.01 AND .06 + 0.01")
    low, high = atom(p, "R").filter.parts
    assert low.right == Lit(Decimal("0.05"), "float") and high.right.python() == 0.07
    p = plan("SELECT COUNT(*) FROM T WHERE d < DATE '1994-01-01' + INTERVAL '13' MONTH")
    assert atom(p, "T").filter.right == Lit(np.datetime64("1995-02-01", "ns"), "date")
    p = plan("SELECT COUNT(*) FROM R WHERE a < 2 * 3 + 1 AND x > 1e3")
    assert [part.right for part in atom(p, "R").filter.parts] == [
        Lit(7, "int"),
        Lit(Decimal("1E+3"), "float"),
    ]


@pytest.mark.parametrize(
    "sql, grouped, having",
    [
        ("SELECT a, COUNT(*) FROM R GROUP BY a HAVING SUM(x) > 1", True, "(SUM(x) > 1)"),
        ("SELECT DISTINCT c FROM S", True, None),
        ("SELECT a FROM R ORDER BY x", False, None),
    ],
)
def test_grouping_modes(sql, grouped, having):
    p = plan(sql)
    assert p.grouped is grouped
    assert (p.having.sql().replace('"', "") if p.having is not None else None) == having


def test_order_by_a_column_outside_a_bag_projection_keeps_it_as_a_hidden_key():
    p = plan("SELECT a FROM R ORDER BY x DESC LIMIT 3")
    assert [v for v, _ in p.keys] == ["R.a", "R.x"] and p.columns == ("a",)
    assert p.order[0].descending and p.limit == 3


def test_items_joined_by_nothing_form_a_cartesian_product():
    p = plan("SELECT COUNT(*) FROM R, E")
    assert [(a.alias, a.columns) for a in p.atoms] == [("R", ("#0",)), ("E", ("#0",))]
    assert p.query().components() == [["R"], ["E"]]
    p = plan("SELECT R.a, S.c FROM R, S, T WHERE S.c = T.c")
    assert p.query().components() == [["R"], ["S", "T"]]
