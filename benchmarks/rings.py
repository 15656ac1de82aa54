"""Throughput of the batched covariance ring against plain numpy (run: python benchmarks/rings.py).

1. Disjoint-block products (the engine's hot path): ``CovarianceRing.batch_mul`` on batches of
   1000 payloads whose blocks split m = 27 and m = 39 variables, next to a plain numpy version
   of the same arithmetic on full (n, k, k) matrices.  Criterion: the ring reaches at least
   half the plain implementation's throughput.
2. Fused ``batch_mul_sum`` of 6 factors over a Housing-like 10+5+2+2+4+3 split versus
   materializing the products and summing them.

Timings: ``time.perf_counter``, several rounds of several calls, best and median per call.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from functools import reduce

import numpy as np
from ringml.rings.covariance import CovarianceBatch, CovarianceRing

N = 1000
ROUNDS = 15
CALLS = 10


def timed(fn, rounds: int = ROUNDS, calls: int = CALLS) -> tuple[float, float]:
    """(best, median) seconds per call."""
    fn()  # warm caches (index maps, allocator)
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls)
    return min(per_call), float(np.median(per_call))


def timed_pair(f, g) -> tuple[tuple[float, float], tuple[float, float]]:
    """Time two functions in interleaved rounds, so machine load hits both alike."""
    f(), g()
    tf, tg = [], []
    for _ in range(ROUNDS):
        for fn, out in ((f, tf), (g, tg)):
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            out.append((time.perf_counter() - start) / CALLS)
    return (min(tf), float(np.median(tf))), (min(tg), float(np.median(tg)))


def unpack(batch: CovarianceBatch) -> np.ndarray:
    k = len(batch.block)
    i, j = np.triu_indices(k)
    full = np.empty((len(batch.count), k, k))
    full[:, i, j] = batch.products
    full[:, j, i] = batch.products
    return full


def plain_mul(ca, sa, qa, cb, sb, qb):
    """Plain numpy disjoint-block product on full matrices (the same arithmetic)."""
    n, ka, kb = len(ca), sa.shape[1], sb.shape[1]
    k = ka + kb
    wa = cb.astype(np.float64)
    wb = ca.astype(np.float64)
    count = ca * cb
    sums = np.concatenate([wa[:, None] * sa, wb[:, None] * sb], axis=1)
    q = np.empty((n, k, k))
    q[:, :ka, :ka] = wa[:, None, None] * qa
    q[:, :ka, ka:] = np.einsum("ni,nj->nij", sa, sb)
    q[:, ka:, :ka] = q[:, :ka, ka:].transpose(0, 2, 1)
    q[:, ka:, ka:] = wb[:, None, None] * qb
    return count, sums, q


def operands(ring: CovarianceRing, ka: int, kb: int, rng: np.random.Generator):
    names = ring.variables
    a = ring.batch_lift_block(names[:ka], rng.normal(10.0, 3.0, (N, ka)))
    b = ring.batch_lift_block(names[ka : ka + kb], rng.normal(-4.0, 2.0, (N, kb)))
    # realistic operands are sums of lifts: counts > 1 and non-rank-one Gram matrices
    a = ring.batch_add(
        ring.batch_scale(a, rng.integers(1, 4, N)), ring.batch_take(a, rng.permutation(N))
    )
    b = ring.batch_add(
        ring.batch_scale(b, rng.integers(1, 4, N)), ring.batch_take(b, rng.permutation(N))
    )
    return a, b


def bench_products() -> bool:
    rng = np.random.default_rng(0)
    print(f"1. disjoint-block products, batches of {N} (payload products per second)")
    header = (
        f"{'m':>3} {'split':>7} {'ring prod/s':>13} {'plain prod/s':>13} "
        f"{'ring/plain':>10} {'ring best/median ms':>20} {'plain best/median ms':>21}"
    )
    print(header)
    print("-" * len(header))
    ok = True
    for m, splits in ((27, [(10, 17), (17, 10)]), (39, [(13, 26), (26, 13)])):
        ring = CovarianceRing([f"x{j}" for j in range(m)])
        for ka, kb in splits:
            a, b = operands(ring, ka, kb, rng)
            full = (a.count, a.sums, unpack(a), b.count, b.sums, unpack(b))
            # same result
            got = ring.batch_mul(a, b)
            _, plain_sums, plain_q = plain_mul(*full)
            assert np.array_equal(got.sums, plain_sums)
            assert np.array_equal(unpack(got), plain_q)
            (r_best, r_med), (p_best, p_med) = timed_pair(
                lambda a=a, b=b, ring=ring: ring.batch_mul(a, b), lambda full=full: plain_mul(*full)
            )
            ratio = p_med / r_med
            ok &= ratio >= 0.5
            print(
                f"{m:>3} {f'{ka}+{kb}':>7} {N / r_med:>13,.0f} {N / p_med:>13,.0f} "
                f"{ratio:>10.2f} {f'{r_best * 1e3:.3f}/{r_med * 1e3:.3f}':>20} "
                f"{f'{p_best * 1e3:.3f}/{p_med * 1e3:.3f}':>21}"
            )
    print("(throughput from the median; ring/plain > 1 means the ring is faster)")
    print(f"criterion ring >= 0.5 x plain throughput on every row: {'PASS' if ok else 'FAIL'}")
    return ok


def bench_fused() -> None:
    rng = np.random.default_rng(1)
    sizes = [10, 5, 2, 2, 4, 3]
    names = [f"x{j}" for j in range(sum(sizes))]
    ring = CovarianceRing(names)
    factors, at = [], 0
    for k in sizes:
        lifted = ring.batch_lift_block(names[at : at + k], rng.normal(5.0, 2.0, (N, k)))
        factors.append(ring.batch_scale(lifted, rng.integers(1, 4, N)))
        at += k
    fused = ring.batch_to_list(ring.batch_mul_sum(factors))[0]
    materialized = ring.batch_sum(reduce(ring.batch_mul, factors))
    assert ring.equal(fused, materialized, rtol=1e-10, atol=1e-8)
    (f_best, f_med), (m_best, m_med) = timed_pair(
        lambda: ring.batch_mul_sum(factors),
        lambda: ring.batch_sum(reduce(ring.batch_mul, factors)),
    )
    print(
        f"\n2. fused batch_mul_sum, 6 factors split {'+'.join(map(str, sizes))} "
        f"(m={sum(sizes)}), batch {N}, summed to one payload"
    )
    print(f"   fused contraction      : best {f_best * 1e3:7.3f} ms  median {f_med * 1e3:7.3f} ms")
    print(f"   materialize then sum   : best {m_best * 1e3:7.3f} ms  median {m_med * 1e3:7.3f} ms")
    print(f"   speed-up (median)      : {m_med / f_med:.1f}x")


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print(
        f"numpy {np.__version__}, python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, {platform.platform()}"
    )
    print(f"timing: {ROUNDS} interleaved rounds x {CALLS} calls, perf_counter\n")
    ok = bench_products()
    bench_fused()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
