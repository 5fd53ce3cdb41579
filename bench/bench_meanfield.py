"""Mean-field ODE throughput: one vectorised integration of a 20 x 20 grid against a member loop.

    python bench/bench_meanfield.py [--loop-members 4] [--threads 1 2]

(default: one thread, integrate's default; on a busy 2-core machine 2 threads were 4x slower).

The grid is the polar readout of [S] Sec. 4.2 (r in [0.1, 2], theta in [0, pi/4]) for p = 2
students and p* = 1 teacher per task, erf, eta = 1, sigma_w = 1e-3, two teachers at feature
similarity gamma = 0.5, 30 time units on each task (60 in all), Euler step 0.01 (6000 steps).
All 400 members are integrated at once by `zoo.theory.meanfield.integrate`; the reference is the
same call made member by member in a Python loop, timed on a few members and scaled to 400.
Target: under 30 s for the grid on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from zoo.theory.meanfield import integrate

from gpu_column import GPU, HEADING, cell, clock, on_gpu

N_R, N_THETA, ALPHA1, ALPHA2, D_ALPHA = 20, 20, 30.0, 30.0, 0.01


def grid() -> tuple[torch.Tensor, ...]:
    r = torch.linspace(0.1, 2.0, N_R, dtype=torch.float64)
    theta = torch.linspace(0.0, math.pi / 4, N_THETA, dtype=torch.float64)
    rr, tt = torch.meshgrid(r, theta, indexing="ij")
    h = torch.stack([rr * torch.cos(tt), rr * torch.sin(tt)], dim=-1).reshape(-1, 2)  # (400, 2)
    E = h.shape[0]
    heads0 = torch.stack([h, 0.01 * torch.ones_like(h)], dim=1)  # (E, task, p): small second head
    g = torch.Generator().manual_seed(0)
    Q0 = 1e-6 * torch.eye(2, dtype=torch.float64).expand(E, 2, 2).clone()
    R0 = 3e-5 * torch.randn(E, 2, 2, 1, dtype=torch.float64, generator=g)  # ~ sigma_w / sqrt(d)
    T = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64).reshape(2, 2, 1, 1)
    hT = torch.ones(2, 1, dtype=torch.float64)
    return Q0, R0, T, heads0, hT


def run(Q0, R0, T, heads0, hT, threads: int):
    return integrate(Q0, R0, T, heads0, hT, activation="erf", eta=1.0, alpha_switch=ALPHA1,
                     alpha_end=ALPHA1 + ALPHA2, d_alpha=D_ALPHA, record_every=0.5, cpu_threads=threads)


def vectorised_on_gpu(Q0, R0, T, heads0, hT) -> float:
    """The vectorised integration with every input on ``GPU`` (cpu_threads is ignored there)."""
    args = [t.to(GPU) for t in (Q0, R0, T, heads0, hT)]
    run(*args, threads=1)  # warm-up: kernels and allocator
    t0 = clock(GPU)
    run(*args, threads=1)
    return clock(GPU) - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loop-members", type=int, default=4, help="members timed in the Python loop")
    ap.add_argument("--threads", type=int, nargs="+", default=[1],
                    help="torch intra-op threads to try (integrate's cpu_threads)")
    args = ap.parse_args()
    Q0, R0, T, heads0, hT = grid()
    E = Q0.shape[0]
    steps = round((ALPHA1 + ALPHA2) / D_ALPHA)
    rows = []
    for threads in args.threads:
        t0 = time.perf_counter()
        tr = run(Q0, R0, T, heads0, hT, threads)
        vec = time.perf_counter() - t0
        m = args.loop_members
        t0 = time.perf_counter()
        for e in range(m):
            one = run(Q0[e], R0[e], T, heads0[e], hT, threads)
        loop = (time.perf_counter() - t0) * E / m
        assert torch.allclose(one.eps[0], tr.eps[m - 1], rtol=1e-10, atol=1e-14)
        rows.append((threads, E, steps, vec, loop))
    print(f"mean-field ODE, erf, p=2, p*=1, {E} members ({N_R} x {N_THETA} polar heads), "
          f"{ALPHA1 + ALPHA2:g} time units, d_alpha={D_ALPHA} ({steps} Euler steps)")
    gpu = on_gpu(vectorised_on_gpu, Q0, R0, T, heads0, hT)
    print(f"{'threads':>7} | {'members':>7} | {'vectorised s':>12} | {'us/member-step':>14} | "
          f"{'loop s (scaled)':>15} | {'speed-up':>8} | {HEADING + ' vectorised s':>20}")
    print("-" * 103)
    for threads, E, steps, vec, loop in rows:
        print(f"{threads:>7} | {E:>7} | {vec:>12.2f} | {vec / (E * steps) * 1e6:>14.3f} | "
              f"{loop:>15.1f} | {loop / vec:>7.1f}x | {cell(gpu, 20)}")
    print(f"(loop: {args.loop_members} members timed one by one with the same integrate call, scaled to {E})")


if __name__ == "__main__":
    main()
