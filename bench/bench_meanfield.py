"""Mean-field ODE ([S] Eqs. 20-22): the 20 x 20 grid against a hand-written Euler loop, and steady under load.

    python bench/bench_meanfield.py [--threads 1] [--rounds 3]

The grid is the polar readout of [S] Sec. 4.2 (r in [0.1, 2], theta in [0, pi/4]): 400 members,
p = 2 students, p* = 1 teacher per task, erf, eta = 1, sigma_w = 1e-3, two teachers at feature
similarity gamma = 0.5, 30 time units on each task, Euler step 0.01 (6000 steps).

Rows:
1. ``integrate`` (all members at once, the loop over Euler steps only) against the strongest
   hand-written loop of the same arithmetic: an Euler loop that calls ``derivatives`` (the public
   right-hand side, vectorised over members) every step and adds ``d_alpha`` times it to
   ``Q, R, h``. Both end on the same bits (checked). At ``--threads`` (default 1) on both sides.
2. Under load: torch at 2 threads (``max(2, --threads)``) and a process spinning on a core for
   the length of the measurement (an artificial load, bounded in time and stopped after it),
   ``integrate`` with its scoped thread choice (``cpu_threads="auto"``: one thread at this size,
   ``zoo.utils.threads``) against the unscoped call (``cpu_threads=None``: torch's 2 threads), on the
   first ``LOAD_ALPHA`` time units (the unscoped call is ~10-20x slower there). Same bits checked.
   Goal 2x: a second thread that waits for a busy core costs more than that; the scoped path must
   not pay it.

The GPU column: the vectorised integration with every input on the GPU (n/a without one).
"""
from __future__ import annotations

import math
import subprocess
import sys
import time

import torch

import harness
from gpu_column import GPU, HEADING, cell, clock, on_gpu
from zoo.theory.meanfield import derivatives, integrate
from zoo.utils.threads import num_threads

N_R, N_THETA, ALPHA1, ALPHA2, D_ALPHA = 20, 20, 30.0, 30.0, 0.01
LOAD_ALPHA = 2.0  # time units integrated under load (1 on each task)
SPIN_LIMIT_S = 300  # the load process stops by itself after this, whatever happens here


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


def zoo_ode(inputs, alpha_end: float, cpu_threads="auto"):
    """``integrate`` over ``[0, alpha_end]``, switching task halfway; the final (Q, R, heads)."""
    tr = integrate(*inputs, activation="erf", eta=1.0, alpha_switch=alpha_end / 2, alpha_end=alpha_end,
                   d_alpha=D_ALPHA, record_every=0.5, cpu_threads=cpu_threads)
    return tr.Q[:, -1], tr.R[:, -1], tr.heads[:, -1]


def euler_loop(inputs, alpha_end: float):
    """The hand-written loop: ``X <- X + d_alpha dX/dalpha`` with ``derivatives`` every step."""
    Q, R, T, heads, hT = (x.clone() for x in inputs)
    n_steps, switch = round(alpha_end / D_ALPHA), round(alpha_end / 2 / D_ALPHA)
    for step in range(n_steps):
        task = 0 if step < switch else 1
        dQ, dR, dh = derivatives(Q, R, T, heads, hT, task, activation="erf", eta=1.0)
        Q += D_ALPHA * dQ
        R += D_ALPHA * dR
        heads[:, task] += D_ALPHA * dh
    return Q, R, heads


def timed(fn, *args, **kwargs):
    """A callable for ``harness.interleaved``: runs ``fn`` and returns its seconds, keeping the
    last result in ``timed.result[fn]`` for the equality check."""
    def run() -> float:
        t0 = time.perf_counter()
        timed.result[(fn, kwargs.get("cpu_threads"))] = fn(*args, **kwargs)
        return time.perf_counter() - t0
    return run


timed.result = {}


def same_bits(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def spinning(seconds: float) -> subprocess.Popen:
    """A process that keeps one core busy for at most ``seconds`` (killed earlier by the caller)."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def gpu_seconds(inputs) -> float:
    """The vectorised integration with every input on ``GPU`` (the thread choice is CPU only)."""
    moved = [t.to(GPU) for t in inputs]
    zoo_ode(moved, ALPHA1 + ALPHA2)  # warm-up: kernels and allocator
    t0 = clock(GPU)
    zoo_ode(moved, ALPHA1 + ALPHA2)
    return clock(GPU) - t0


def main() -> None:
    args = harness.arguments(__doc__, rounds=3)
    inputs = grid()
    E, alpha = inputs[0].shape[0], ALPHA1 + ALPHA2
    print(f"mean-field ODE, erf, p=2, p*=1, {E} members ({N_R} x {N_THETA} polar heads), {alpha:g} time units, "
          f"d_alpha={D_ALPHA} ({round(alpha / D_ALPHA)} Euler steps), load average {harness.load_average()}")

    times = harness.interleaved({"zoo": timed(zoo_ode, inputs, alpha), "loop": timed(euler_loop, inputs, alpha)},
                                args.rounds)
    equal = same_bits(timed.result[(zoo_ode, None)], timed.result[(euler_loop, None)])
    print(f"integrate vs the hand-written Euler loop: final Q, R, heads bit-identical: {equal}")

    threads = max(2, args.threads)
    spinner = spinning(SPIN_LIMIT_S)
    try:
        time.sleep(0.2)  # let the spinner start
        with num_threads(threads):
            loaded = harness.interleaved({"scoped": timed(zoo_ode, inputs, LOAD_ALPHA, cpu_threads="auto"),
                                          "unscoped": timed(zoo_ode, inputs, LOAD_ALPHA, cpu_threads=None)},
                                         args.rounds)
            load_seen = harness.load_average()
    finally:
        spinner.kill()
        spinner.wait()
    equal_load = same_bits(timed.result[(zoo_ode, "auto")], timed.result[(zoo_ode, None)])
    print(f"under load ({threads} torch threads, a spinning process, load average {load_seen}): scoped vs unscoped "
          f"bit-identical: {equal_load}")

    harness.report([
        harness.Row(f"mean-field ODE, {N_R}x{N_THETA} grid x {alpha:g} time units, vs Euler loop of derivatives",
                    zoo=harness.median(times["zoo"]), baseline=harness.median(times["loop"]), unit="s", goal=1.0,
                    lower_is_better=True),
        harness.Row(f"mean-field ODE under load, {threads} threads, {LOAD_ALPHA:g} time units: scoped vs unscoped",
                    zoo=harness.median(loaded["scoped"]), baseline=harness.median(loaded["unscoped"]), unit="s",
                    goal=2.0, lower_is_better=True),
    ])
    gpu = on_gpu(gpu_seconds, inputs)
    print(f"{HEADING} column, vectorised integration, {alpha:g} time units: {cell(gpu, 8)} s")
    if not (equal and equal_load):
        sys.exit("bench_meanfield: the two sides' results differ")


if __name__ == "__main__":
    main()
