"""The queries of DBToaster's Fig. 7 (VLDB 2012, Appendix A, cleaned in
``notes/dbtoaster.md`` §7.3) as SQL text over ringml's schemas, and :func:`gmr_sql`, which
turns a query into the SQL another database (DuckDB) must run to give the same answer under
ring (GMR) semantics: scalar subqueries over SUM are 0, not NULL, when empty.

TPC-H queries use the standard TPC-H column names (``tests/test_sql_tpch.py``'s DDL and
``tpchgen-cli`` data); the finance queries read ``bids`` and ``asks`` with columns
``(t, id, broker_id, price, volume)`` (:data:`FINANCE_SCHEMA`).

All twelve compile into views of every strategy (``fivm``, ``first_order``, ``recompute``,
``higher_order``), checked against DuckDB on random insert/delete streams and on the notes'
T7/T8 traces (``tests/test_sql_dbtoaster.py``).  How: Q3, Q11, SSB4 and BSV are SPJA; BSP
is two side views (bids by broker and ``t``) joined on read by prefix sums; AXF an equality
join whose disjunction of inequalities is a residual filter over the engine's groups by
(broker, both prices); Q17 and Q18 (FROM-less middle level) compare
with an equality-correlated SUM subquery, Q22 with an uncorrelated one and a COUNT
correlated by customer, VWAP and MST with SUMs correlated by an inequality (prefix sums),
PSP with uncorrelated SUMs.
"""

from __future__ import annotations

FINANCE_SCHEMA = """
CREATE TABLE bids (t DOUBLE, id BIGINT, broker_id BIGINT, price DOUBLE, volume DOUBLE);
CREATE TABLE asks (t DOUBLE, id BIGINT, broker_id BIGINT, price DOUBLE, volume DOUBLE);
"""

#: the finance (order book) queries of Fig. 7
FINANCE = {
    # broker variance: a self-join on the broker
    "bsv": """
        SELECT x.broker_id, SUM(x.volume * x.price * y.volume * y.price * 0.5) AS v
        FROM bids x, bids y
        WHERE x.broker_id = y.broker_id
        GROUP BY x.broker_id""",
    # broker spread: an inequality self-join
    "bsp": """
        SELECT x.broker_id, SUM(x.volume * x.price - y.volume * y.price) AS spread
        FROM bids x, bids y
        WHERE x.broker_id = y.broker_id AND x.t > y.t
        GROUP BY x.broker_id""",
    # axfinder: an equality join with a disjunction of inequalities across the tables
    "axf": """
        SELECT b.broker_id, SUM(a.volume - b.volume) AS v
        FROM bids b, asks a
        WHERE b.broker_id = a.broker_id
          AND (a.price - b.price > 1000 OR b.price - a.price > 1000)
        GROUP BY b.broker_id""",
    # price spread: a cross join filtered by two uncorrelated nested aggregates
    "psp": """
        SELECT SUM(a.price - b.price) AS spread
        FROM bids b, asks a
        WHERE b.volume > 0.0001 * (SELECT SUM(b1.volume) FROM bids b1)
          AND a.volume > 0.0001 * (SELECT SUM(a1.volume) FROM asks a1)""",
    # missed trades: two uncorrelated and two inequality-correlated nested aggregates
    "mst": """
        SELECT b.broker_id, SUM(a.price * a.volume - b.price * b.volume) AS v
        FROM bids b, asks a
        WHERE 0.25 * (SELECT SUM(a1.volume) FROM asks a1)
                > (SELECT SUM(a2.volume) FROM asks a2 WHERE a2.price > a.price)
          AND 0.25 * (SELECT SUM(b1.volume) FROM bids b1)
                > (SELECT SUM(b2.volume) FROM bids b2 WHERE b2.price > b.price)
        GROUP BY b.broker_id""",
    # volume-weighted average price: an inequality-correlated and an uncorrelated aggregate
    "vwap": """
        SELECT SUM(b1.price * b1.volume) AS vwap
        FROM bids b1
        WHERE 0.25 * (SELECT SUM(b3.volume) FROM bids b3)
                > (SELECT SUM(b2.volume) FROM bids b2 WHERE b2.price > b1.price)""",
}

#: the TPC-H and SSB queries of Fig. 7 (DBToaster's simplified forms)
TPCH = {
    "q3": """
        SELECT o_orderkey, o_orderdate, o_shippriority,
               SUM(l_extendedprice * (1 - l_discount)) AS revenue
        FROM customer, orders, lineitem
        WHERE c_mktsegment = 'BUILDING' AND o_custkey = c_custkey AND l_orderkey = o_orderkey
          AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
        GROUP BY o_orderkey, o_orderdate, o_shippriority""",
    "q11": """
        SELECT ps_partkey, SUM(ps_supplycost * ps_availqty) AS value
        FROM partsupp, supplier
        WHERE ps_suppkey = s_suppkey
        GROUP BY ps_partkey""",
    "q17": """
        SELECT SUM(l.l_extendedprice) AS revenue
        FROM lineitem l, part p
        WHERE p.p_partkey = l.l_partkey
          AND l.l_quantity < 0.005 * (SELECT SUM(l2.l_quantity) FROM lineitem l2
                                      WHERE l2.l_partkey = p.p_partkey)""",
    "q18": """
        SELECT c.c_custkey, SUM(l1.l_quantity) AS quantity
        FROM customer c, orders o, lineitem l1
        WHERE 1 <= (SELECT SUM(1) WHERE 100 < (SELECT SUM(l2.l_quantity) FROM lineitem l2
                                                WHERE l1.l_orderkey = l2.l_orderkey))
          AND c.c_custkey = o.o_custkey AND o.o_orderkey = l1.l_orderkey
        GROUP BY c.c_custkey""",
    "q22": """
        SELECT c1.c_nationkey, SUM(c1.c_acctbal) AS balance
        FROM customer c1
        WHERE c1.c_acctbal < (SELECT SUM(c2.c_acctbal) FROM customer c2
                              WHERE c2.c_acctbal > 0)
          AND 0 = (SELECT SUM(1) FROM orders o WHERE o.o_custkey = c1.c_custkey)
        GROUP BY c1.c_nationkey""",
    "ssb4": """
        SELECT sn.n_regionkey AS s_region, cn.n_regionkey AS c_region, p.p_type,
               SUM(li.l_quantity) AS quantity
        FROM customer c, orders o, lineitem li, part p, supplier s, nation cn, nation sn
        WHERE c.c_custkey = o.o_custkey AND o.o_orderkey = li.l_orderkey
          AND p.p_partkey = li.l_partkey AND s.s_suppkey = li.l_suppkey
          AND o.o_orderdate >= DATE '1997-01-01' AND o.o_orderdate < DATE '1998-01-01'
          AND cn.n_nationkey = c.c_nationkey AND sn.n_nationkey = s.s_nationkey
        GROUP BY sn.n_regionkey, cn.n_regionkey, p.p_type""",
}

#: all twelve, in Fig. 7's order
FIG7_ORDER = ("q3", "q11", "q17", "q18", "q22", "ssb4", "bsv", "bsp", "axf", "psp", "mst", "vwap")
FIG7 = {name: {**TPCH, **FINANCE}[name] for name in FIG7_ORDER}


def gmr_sql(sql: str) -> str:
    """``sql`` with every scalar subquery whose value is built from SUM wrapped in
    ``COALESCE(..., 0)``: what a SQL database must run to answer as ringml (and DBToaster)
    do, where an empty sum is 0 (ring semantics) rather than NULL."""
    import sqlglot
    from sqlglot import exp

    from .parse import DIALECT

    tree = sqlglot.parse_one(sql, read=DIALECT)

    def wrap(node):
        if (
            isinstance(node, exp.Subquery)
            and isinstance(node.this, exp.Select)
            and not isinstance(node.parent, (exp.From, exp.Join, exp.Exists, exp.In))
            and len(node.this.expressions) == 1
            and any(isinstance(n, exp.Sum) for n in node.this.expressions[0].walk())
        ):
            return exp.Coalesce(this=node.copy(), expressions=[exp.Literal.number(0)])
        return node

    return tree.transform(wrap).sql(dialect=DIALECT)
