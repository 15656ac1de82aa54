"""Aggregate arguments as sums of products of per-item factors (a polynomial over the FROM
items), the form the ring components take.

:func:`expand` maps an expression over several FROM items to ``(V, N)``: its value with NULL
read as 0 and its non-NULL indicator, each a :data:`Poly` -- a mapping from monomials (sorted
``(alias, factor)`` pairs; a factor is an expression of one item) to coefficients.  Sums,
differences, products, division by a constant or by an expression of one item, negation and
CASE with one-item conditions expand; anything else is refused.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from typing import Any

from .expressions import NUMBERS, Arith, Case, Cast, Expr, IsNull, Lit, Neg

Poly = dict[tuple, Any]  # monomial (sorted ((alias, factor), ...)) -> coefficient
ONE: Poly = {(): 1}

#: ``refuse(what, construct)``: the error to raise for a construct that does not expand
Refuse = Callable[[str, str], Exception]


def expand(ir: Expr, refuse: Refuse) -> tuple[Poly, Poly]:
    """``(V, N)``: ``ir`` with NULL read as 0, and its non-NULL indicator, each as a sum
    of products of per-atom factors (``V`` means nothing for a non-numeric ``ir``, whose
    aggregate can only be COUNT)."""
    sources = ir.sources()
    if isinstance(ir, Lit):
        if ir.value is None:
            return {}, {}
        if ir.kind not in NUMBERS and ir.kind != "bool":
            # a text or date constant has no numeric value: only its non-NULL indicator
            # counts (COUNT; SUM/AVG of a non-numeric argument are refused by type)
            return {}, dict(ONE)
        value = int(ir.value) if isinstance(ir.value, bool) else ir.value
        return ({(): value} if value != 0 else {}), dict(ONE)
    if len(sources) <= 1:
        if not sources:
            raise refuse(
                f"the constant expression {ir.sql()} in an aggregate", "constant aggregate"
            )
        alias = next(iter(sources))
        value = {((alias, ir),): 1}
        nonnull = dict(ONE) if not ir.nullable else {((alias, IsNull(ir, True)),): 1}
        return value, nonnull
    if isinstance(ir, Arith):
        lv, ln = expand(ir.left, refuse)
        if ir.op == "/":
            right = ir.right
            if isinstance(right, Lit):
                if right.value in (None, 0):
                    raise refuse(f"division by {right.sql()} in an aggregate", "division by zero")
                inverse = decimal.Decimal(1) / decimal.Decimal(right.value)
                return _scale(lv, inverse), ln
            if len(right.sources()) != 1:
                raise refuse(
                    f"division by {right.sql()} (an expression of several tables) in an aggregate",
                    "division by several tables in an aggregate",
                )
            alias = next(iter(right.sources()))
            reciprocal = {((alias, Arith("/", Lit(1, "int"), right)),): 1}
            _, rn = expand(right, refuse)
            return _mul(lv, reciprocal), _mul(ln, rn)
        rv, rn = expand(ir.right, refuse)
        if ir.op == "*":
            return _mul(lv, rv), _mul(ln, rn)
        sign = 1 if ir.op == "+" else -1
        return _add(_mul(lv, rn), _scale(_mul(rv, ln), sign)), _mul(ln, rn)
    if isinstance(ir, Neg):
        v, n = expand(ir.operand, refuse)
        return _scale(v, -1), n
    if isinstance(ir, Cast) and ir.type == "float" and ir.operand.kind in NUMBERS:
        return expand(ir.operand, refuse)
    if isinstance(ir, Case):
        value: Poly = {}
        nonnull: Poly = {}
        rest: Poly = dict(ONE)  # no earlier WHEN was TRUE
        for cond, branch in ir.whens:
            if len(cond.sources()) > 1:
                raise refuse(
                    f"the CASE condition {cond.sql()} over several tables",
                    "CASE condition over several tables",
                )
            if not cond.sources():
                raise refuse(f"the constant CASE condition {cond.sql()}", "constant CASE condition")
            alias = next(iter(cond.sources()))
            taken = _mul(
                rest, {((alias, Case(((cond, Lit(1, "int")),), Lit(0, "int"), "int")),): 1}
            )
            bv, bn = expand(branch, refuse)
            value = _add(value, _mul(taken, bv))
            nonnull = _add(nonnull, _mul(taken, bn))
            rest = _mul(rest, {((alias, Case(((cond, Lit(0, "int")),), Lit(1, "int"), "int")),): 1})
        if ir.default is not None:
            dv, dn = expand(ir.default, refuse)
            value = _add(value, _mul(rest, dv))
            nonnull = _add(nonnull, _mul(rest, dn))
        return value, nonnull
    raise refuse(
        f"{ir.sql()} inside an aggregate (over columns of several tables only + - * /, "
        "CASE with one-table conditions and constants combine)",
        "expression over several tables in an aggregate",
    )


def _order_key(monomial_factor: tuple[str, Expr]) -> tuple[str, str]:
    return monomial_factor[0], monomial_factor[1].sql()


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb, key=_order_key))
            out[m] = out.get(m, 0) + _times(ca, cb)
    return {m: c for m, c in out.items() if c != 0}


def _times(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return decimal.Decimal(a) * decimal.Decimal(b)


def _add(a: Poly, b: Poly) -> Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + c
    return {m: c for m, c in out.items() if c != 0}


def _scale(a: Poly, k) -> Poly:
    return {m: _times(c, k) for m, c in a.items() if _times(c, k) != 0}
