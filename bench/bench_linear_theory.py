"""Closed-form linear-network theory against hand-written loops of the same arithmetic.

    python bench/bench_linear_theory.py [--threads 1] [--rounds 5]

Rows:
1. The two-pathway phase diagram ([S] Fig. 3c, App. B Algorithm 1) on a 50 x 50 (lam1, lam2)
   grid: ``zoo.theory.phase.phase_diagram`` against a plain RK4 loop written out step by step
   (the slow pathway's ``tau dw/dt = sqrt(lam2^2 + 4 w^2)(s - omega_1(t) - w)`` with the fast
   pathway's closed form and the remaining escape time evaluated at every step through the public
   ``omega`` and ``escape_time``). Same arithmetic in another order: float equality checked.
2. The exact QQ^T ([L] Thm. 4.3) of a 100-member lambda ensemble of 8x8x8 networks at 1000 times:
   ``zoo.theory.linear.qqt`` (rescaled, overflow-free) against the formula as printed, batched by
   hand: ``F = P diag(mu) P^T``, ``QQ^T = P D A M^-1 A^T D P^T`` with ``D = diag(e^{mu t})``,
   ``M = I + 1/2 A^T diag(expm1(2 mu t)/mu) A``. Float equality checked on times in [0, 4]: the
   printed form loses digits as ``e^{mu t}`` grows (max |diff| 2e-8 at t = 6, 0.4 at t = 10 for
   this ensemble, whose |QQ^T| <= 4), which is why the zoo rescales; the cost is the same at any t.

Both sides at ``--threads`` (default 1), float64, medians of interleaved rounds. The GPU column:
the zoo's side with every input on the GPU (n/a without one).
"""
from __future__ import annotations

import sys
import time

import torch

import harness
from gpu_column import GPU, HEADING, cell, clock, on_gpu
from zoo.theory.linear import escape_time, hitting_time, omega, qqt
from zoo.theory.phase import phase_diagram

S, A0, K = 1.0, 1e-3, 400  # phase diagram: task, initial input weight, RK4 steps (phase_diagram's default)
N, E, TN, T_END = 8, 100, 1000, 4.0  # QQ^T: width, members, times, final time (see the docstring)


def phase_loop(lam1: torch.Tensor, lam2: torch.Tensor) -> torch.Tensor:
    """Algorithm 1 as a plain loop: RK4 on the slow pathway, the escape time left at every step."""
    lam1, lam2 = torch.broadcast_tensors(lam1, lam2)
    l1, l2 = lam1.abs(), lam2.abs()
    w1_0, w = A0 * torch.sqrt(lam1 + A0 * A0), A0 * torch.sqrt(lam2 + A0 * A0)
    v_hat, v_star = 0.05 * S, 0.01 * S
    t_hit = torch.nan_to_num(hitting_time(v_star, lam=l1, s=S, omega0=w1_0).clamp(min=0.0), nan=0.0)
    h = t_hit / K
    best = torch.full_like(w, float("inf"))
    for k in range(K + 1):
        t = k * h
        S_k = S - omega(t, lam=l1, s=S, omega0=w1_0)
        reach, done = v_hat < S_k, w >= v_hat
        rem = escape_time(v_hat, lam=l2, s=torch.where(reach, S_k, 1.0), omega0=torch.minimum(w, S_k))
        rem = torch.where(done, 0.0, torch.where(reach & ~done, rem.clamp(min=0.0), float("inf")))
        best = torch.minimum(best, rem)
        if k == K:
            break
        S_m = S - omega(t + h / 2, lam=l1, s=S, omega0=w1_0)
        S_1 = S - omega(t + h, lam=l1, s=S, omega0=w1_0)
        f = lambda w_, S_: torch.sqrt(l2 * l2 + 4 * w_ * w_) * (S_ - w_)  # noqa: E731
        k1 = f(w, S_k)
        k2 = f(w + h / 2 * k1, S_m)
        k3 = f(w + h / 2 * k2, S_m)
        k4 = f(w + h * k3, S_1)
        w = w + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return torch.where(l1 >= l2, best, float("nan"))


def lambda_ensemble(lams: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Lambda-balanced 8x8x8 weights (docs/theory.md#lambda-balanced), one member per lam."""
    g = torch.Generator().manual_seed(seed)
    A = 0.05 * torch.randn(E, N, N, generator=g, dtype=torch.float64)
    U, Sv, Vh = torch.linalg.svd(A)
    R, _ = torch.linalg.qr(torch.randn(E, N, N, generator=g, dtype=torch.float64))
    root = torch.sqrt(lams[:, None] ** 2 + 4 * Sv**2)
    W2 = (U * torch.sqrt((root + lams[:, None]) / 2)[:, None, :]) @ R.transpose(-1, -2)
    W1 = R @ (torch.sqrt((root - lams[:, None]) / 2)[:, :, None] * Vh)
    return W1, W2


def qqt_by_hand(W1, W2, sigma_yx, lam, t) -> torch.Tensor:
    """[L] Thm. 4.3 as printed, in the eigenbasis of F, batched over members and times."""
    n = sigma_yx.shape[-1]
    F = torch.zeros(lam.shape[0], 2 * n, 2 * n, dtype=W1.dtype)
    F[:, :n, n:], F[:, n:, :n] = sigma_yx.T, sigma_yx
    F = F + torch.diag_embed(torch.cat([-lam[:, None].expand(-1, n), lam[:, None].expand(-1, n)], -1) / 2)
    mu, P = torch.linalg.eigh(F)
    A = P.transpose(-1, -2) @ torch.cat([W1.transpose(-1, -2), W2], dim=-2)  # (E, 2n, n_h)
    mt = mu[:, None, :] * t[None, :, None]  # (E, T, 2n)
    DA = torch.exp(mt)[..., None] * A[:, None]  # D A, (E, T, 2n, n_h)
    M = torch.eye(A.shape[-1], dtype=A.dtype) + 0.5 * A.transpose(-1, -2)[:, None] @ (
        (torch.expm1(2 * mt) / mu[:, None, :])[..., None] * A[:, None])
    PDA = P[:, None] @ DA
    return PDA @ torch.linalg.solve(M, PDA.transpose(-1, -2))


def timed(results: dict, key: str, fn):
    def run() -> float:
        t0 = time.perf_counter()
        results[key] = fn()
        return time.perf_counter() - t0
    return run


def gpu_seconds(fn, *tensors: torch.Tensor) -> float:
    """``fn(*tensors)`` with the tensors on ``GPU``, after a warm-up."""
    moved = [x.to(GPU) for x in tensors]
    fn(*moved)
    t0 = clock(GPU)
    fn(*moved)
    return clock(GPU) - t0


def main() -> None:
    args = harness.arguments(__doc__)
    print(f"linear-network theory, float64, load average {harness.load_average()}")
    out: dict = {}

    lam1 = torch.logspace(-3, 0, 50, dtype=torch.float64)[:, None]
    lam2 = torch.logspace(-6, 0, 50, dtype=torch.float64)[None, :]
    zoo_phase = lambda a, b: phase_diagram(a, b, s=S, a0=A0, n_steps=K)  # noqa: E731
    phase = harness.interleaved({"zoo": timed(out, "phase zoo", lambda: zoo_phase(lam1, lam2)),
                                 "loop": timed(out, "phase loop", lambda: phase_loop(lam1, lam2))}, args.rounds)
    a, b = out["phase zoo"], out["phase loop"]
    finite = torch.isfinite(a) & torch.isfinite(b)
    phase_equal = bool((a.isnan() == b.isnan()).all() and (a.isinf() == b.isinf()).all()
                       and torch.allclose(a[finite], b[finite], rtol=1e-8, atol=1e-9))
    print(f"phase diagram: zoo vs RK4 loop, same NaN/inf pattern and allclose(rtol=1e-8): {phase_equal} "
          f"(max |diff| {(a[finite] - b[finite]).abs().max().item():.1e})")

    lams = torch.linspace(-3, 3, E, dtype=torch.float64)  # no lam = 0: F is invertible for the printed form
    W1, W2 = lambda_ensemble(lams)
    sigma_yx = torch.randn(N, N, generator=torch.Generator().manual_seed(1), dtype=torch.float64) / N**0.5
    times = torch.arange(1, TN + 1, dtype=torch.float64) * (T_END / TN)
    zoo_qqt = lambda *x: qqt(x[0], x[1], x[2], lam=x[3], t=x[4])  # noqa: E731
    ins = (W1, W2, sigma_yx, lams, times)
    q = harness.interleaved({"zoo": timed(out, "qqt zoo", lambda: zoo_qqt(*ins)),
                             "loop": timed(out, "qqt loop", lambda: qqt_by_hand(*ins))}, args.rounds)
    diff = (out["qqt zoo"] - out["qqt loop"]).abs().max().item()
    qqt_equal = torch.allclose(out["qqt zoo"], out["qqt loop"], rtol=1e-6, atol=1e-9)
    print(f"QQ^T: zoo vs the printed formula, allclose(rtol=1e-6, atol=1e-9): {qqt_equal} (max |diff| {diff:.1e})")

    harness.report([
        harness.Row("phase diagram 50x50 (Alg. 1), vs RK4 loop", zoo=harness.median(phase["zoo"]),
                    baseline=harness.median(phase["loop"]), unit="s", goal=1.0, lower_is_better=True),
        harness.Row(f"QQ^T closed form, {E} nets x {TN} times, vs printed formula", zoo=harness.median(q["zoo"]),
                    baseline=harness.median(q["loop"]), unit="s", goal=1.0, lower_is_better=True),
    ])
    print(f"{HEADING} column (the zoo's side): phase diagram {cell(on_gpu(gpu_seconds, zoo_phase, lam1, lam2), 7, '.3f')} s, "
          f"QQ^T {cell(on_gpu(gpu_seconds, zoo_qqt, *ins), 7, '.3f')} s")
    if not (phase_equal and qqt_equal):
        sys.exit("bench_linear_theory: the two sides' results differ")


if __name__ == "__main__":
    main()
