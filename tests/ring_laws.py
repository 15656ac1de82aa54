"""Reusable checks of F-IVM Definition 1 and of scalar/batched agreement for any Ring.

Each ring's test module draws random elements with hypothesis and calls these helpers.
``rtol``/``atol`` are 0 for exact rings and small for floating rings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from ringml.rings.base import Ring


def assert_equal(ring: Ring, a, b, rtol: float = 0.0, atol: float = 0.0) -> None:
    assert ring.equal(a, b, rtol=rtol, atol=atol), f"{a!r} != {b!r}"


def check_axioms(ring: Ring, a, b, c, rtol: float = 0.0, atol: float = 0.0) -> None:
    """The seven ring axioms of F-IVM Definition 1 on three elements."""
    eq = lambda x, y: assert_equal(ring, x, y, rtol, atol)  # noqa: E731
    add, mul = ring.add, ring.mul
    eq(add(a, b), add(b, a))
    eq(add(add(a, b), c), add(a, add(b, c)))
    eq(add(ring.zero(), a), a)
    eq(add(a, ring.zero()), a)
    assert ring.is_zero(add(a, ring.neg(a))) or ring.equal(
        add(a, ring.neg(a)), ring.zero(), rtol=rtol, atol=atol
    )
    eq(mul(mul(a, b), c), mul(a, mul(b, c)))
    eq(mul(a, ring.one()), a)
    eq(mul(ring.one(), a), a)
    eq(mul(a, add(b, c)), add(mul(a, b), mul(a, c)))
    eq(mul(add(a, b), c), add(mul(a, c), mul(b, c)))
    if ring.commutative:
        eq(mul(a, b), mul(b, a))


def check_batched_agrees(
    ring: Ring, xs: Sequence, ys: Sequence, rtol: float = 0.0, atol: float = 0.0
) -> None:
    """Every batched operation equals the scalar operation element by element."""
    assert len(xs) == len(ys)
    n = len(xs)
    bx, by = ring.batch_from(list(xs)), ring.batch_from(list(ys))
    assert ring.batch_len(bx) == n
    eq = lambda x, y: assert_equal(ring, x, y, rtol, atol)  # noqa: E731
    for got, x in zip(ring.batch_to_list(bx), xs, strict=True):
        eq(got, x)
    for got, x, y in zip(ring.batch_to_list(ring.batch_add(bx, by)), xs, ys, strict=True):
        eq(got, ring.add(x, y))
    for got, x, y in zip(ring.batch_to_list(ring.batch_mul(bx, by)), xs, ys, strict=True):
        eq(got, ring.mul(x, y))
    for got, x in zip(ring.batch_to_list(ring.batch_neg(bx)), xs, strict=True):
        eq(got, ring.neg(x))
    zero_flags = ring.batch_is_zero(bx)
    assert [bool(f) for f in zero_flags] == [ring.is_zero(x) for x in xs]
    ks = np.arange(n, dtype=np.int64) - n // 2
    for got, x, k in zip(ring.batch_to_list(ring.batch_scale(bx, ks)), xs, ks, strict=True):
        expected = ring.zero()
        for _ in range(abs(int(k))):
            expected = ring.add(expected, x)
        eq(got, expected if k >= 0 else ring.neg(expected))
    if n:
        index = np.arange(n)[::-1].copy()
        for got, i in zip(ring.batch_to_list(ring.batch_take(bx, index)), index, strict=True):
            eq(got, xs[i])
        groups = np.arange(n, dtype=np.int64) % 3
        sums = ring.batch_to_list(ring.batch_sum_by(bx, groups, 3))
        for g in range(3):
            expected = ring.zero()
            for i in range(n):
                if groups[i] == g:
                    expected = ring.add(expected, xs[i])
            eq(sums[g], expected)
        fused = ring.batch_to_list(ring.batch_mul_sum([bx, by], groups, 3))
        for g in range(3):
            expected = ring.zero()
            for i in range(n):
                if groups[i] == g:
                    expected = ring.add(expected, ring.mul(xs[i], ys[i]))
            eq(fused[g], expected)
        acc = ring.batch_accumulator(n + 2)
        slots = np.arange(n, dtype=np.int64) + 1
        acc = ring.batch_scatter_add(acc, slots, bx)
        acc = ring.batch_scatter_add(acc, slots, by)
        got = ring.batch_to_list(ring.batch_take(acc, slots))
        for g, x, y in zip(got, xs, ys, strict=True):
            eq(g, ring.add(x, y))
        acc = ring.batch_clear(acc, slots)
        assert all(ring.batch_is_zero(acc))
    cat = ring.batch_concat([bx, by])
    assert ring.batch_len(cat) == 2 * n
    for got, x in zip(ring.batch_to_list(cat), list(xs) + list(ys), strict=True):
        eq(got, x)
    for x in xs:
        eq(ring.from_bytes(ring.to_bytes(x)), x)
    back = ring.batch_from_bytes(ring.batch_to_bytes(bx))
    for got, x in zip(ring.batch_to_list(back), xs, strict=True):
        eq(got, x)
