"""Benchmark: closed-form linear-network theory vs simulating it (not a test; prints a table).

Rows:
* the two-pathway specialisation phase diagram ([S] Fig. 3c, App. B Algorithm 1) on a 50 x 50
  (lam1, lam2) grid from theory (``zoo.theory.phase.phase_diagram``) vs gradient descent on the
  same 2500 two-pathway networks (``simulate_two_pathways``), target < 10 s;
* the exact QQ^T ([L] Thm. 4.3, ``zoo.theory.linear.qqt``) at 1000 time points for a 100-member
  lambda ensemble of 8x8x8 networks vs batched gradient descent of those 100 networks to the same
  final time, target < 1 s (the stable equal-dimension form ``qqt_stable`` is timed too).

Run: ``python3 bench/bench_linear_theory.py [--threads N] [--repeats R]``. Times are the best of
R runs (wall clock) in float64.
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch

from zoo.theory.linear import network_map, qqt, qqt_stable
from zoo.theory.phase import phase_diagram, simulate_two_pathways

from gpu_column import GPU, HEADING, cell, clock, on_gpu


def best_of(fn: Callable[[], object], repeats: int, device: torch.device | None = None) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = clock(device)
        out = fn()
        best = min(best, clock(device) - t0)
    return best, out


def gpu_seconds(fn: Callable[..., object], *tensors: torch.Tensor, repeats: int) -> float:
    """``fn(*tensors)`` with the tensors on ``GPU``: the best of ``repeats`` after a warm-up."""
    moved = [t.to(GPU) for t in tensors]
    fn(*moved)
    return best_of(lambda: fn(*moved), repeats, GPU)[0]


def lambda_ensemble(lams: torch.Tensor, n: int, scale: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lambda-balanced 8x8x8 weights (docs/theory.md#lambda-balanced), one member per lam, batched."""
    g = torch.Generator().manual_seed(seed)
    E = lams.shape[0]
    A = scale * torch.randn(E, n, n, generator=g, dtype=torch.float64)
    U, S, Vh = torch.linalg.svd(A)
    R, _ = torch.linalg.qr(torch.randn(E, n, n, generator=g, dtype=torch.float64))
    root = torch.sqrt(lams[:, None] ** 2 + 4 * S**2)
    W2 = (U * torch.sqrt((root + lams[:, None]) / 2)[:, None, :]) @ R.transpose(-1, -2)
    W1 = R @ (torch.sqrt((root - lams[:, None]) / 2)[:, :, None] * Vh)
    return W1, W2


def batched_gd(W1: torch.Tensor, W2: torch.Tensor, sigma_yx: torch.Tensor, lr: float, steps: int):
    """Full-batch GD on whitened data (gradients from the input-output statistics)."""
    for _ in range(steps):
        E = sigma_yx - W2 @ W1
        W1, W2 = W1 + lr * W2.transpose(-1, -2) @ E, W2 + lr * E @ W1.transpose(-1, -2)
    return W1, W2


def batched_gd_recorded(W1: torch.Tensor, W2: torch.Tensor, sigma_yx: torch.Tensor, lr: float, steps: int,
                        every: int) -> torch.Tensor:
    """The same GD, recording QQ^T = [W1^T; W2][W1^T; W2]^T every ``every`` steps, (E, T, N, N)."""
    snaps = []
    for k in range(1, steps + 1):
        E = sigma_yx - W2 @ W1
        W1, W2 = W1 + lr * W2.transpose(-1, -2) @ E, W2 + lr * E @ W1.transpose(-1, -2)
        if k % every == 0:
            Q = torch.cat([W1.transpose(-1, -2), W2], dim=-2)
            snaps.append(Q @ Q.transpose(-1, -2))
    return torch.stack(snaps, dim=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows: list[tuple[str, float, str, str, object]] = []

    # ---- phase diagram -------------------------------------------------------------------------
    lam1 = torch.logspace(-3, 0, 50, dtype=torch.float64)[:, None]
    lam2 = torch.logspace(-6, 0, 50, dtype=torch.float64)[None, :]
    a0, s, lr, T = 1e-3, 1.0, 0.01, 30.0
    t_th, res = best_of(lambda: phase_diagram(lam1, lam2, s=s, a0=a0, return_details=True), args.repeats)
    t_sim, frac = best_of(lambda: simulate_two_pathways(lam1, lam2, s=s, a0=a0, lr=lr, steps=round(T / lr)),
                          args.repeats)
    valid = ~torch.isnan(res.min_escape_time)
    spec = res.specialised[valid]
    slow_small = (frac[valid] < 0.05)
    agree = (spec == slow_small).double().mean().item()
    rows.append(("phase diagram 50x50, theory (Alg. 1)", t_th, "< 10 s", "",
                 on_gpu(gpu_seconds, lambda a, b: phase_diagram(a, b, s=s, a0=a0, return_details=True), lam1, lam2,
                        repeats=args.repeats)))
    rows.append((f"phase diagram 50x50, GD ({round(T / lr)} steps)", t_sim, "", f"x{t_sim / t_th:.1f}",
                 on_gpu(gpu_seconds, lambda a, b: simulate_two_pathways(a, b, s=s, a0=a0, lr=lr, steps=round(T / lr)),
                        lam1, lam2, repeats=args.repeats)))

    # ---- QQ^T ensemble -------------------------------------------------------------------------
    n, E, Tn, T_end, lr_q = 8, 100, 1000, 20.0, 0.01
    lams = torch.linspace(-3, 3, E, dtype=torch.float64)
    W1, W2 = lambda_ensemble(lams, n, 0.05, 0)
    g = torch.Generator().manual_seed(1)
    sigma_yx = torch.randn(n, n, generator=g, dtype=torch.float64) / n**0.5
    times = torch.arange(1, Tn + 1, dtype=torch.float64) * (T_end / Tn)  # GD's every-2nd-step times
    t_q, Q = best_of(lambda: qqt(W1, W2, sigma_yx, lam=lams, t=times), args.repeats)
    t_qs, Qs = best_of(lambda: qqt_stable(W1, W2, sigma_yx, lam=lams, t=times), args.repeats)
    steps = round(T_end / lr_q)
    t_gd, (a, b) = best_of(lambda: batched_gd(W1, W2, sigma_yx, lr_q, steps), args.repeats)
    t_gdr, Qgd = best_of(lambda: batched_gd_recorded(W1, W2, sigma_yx, lr_q, steps, steps // Tn), args.repeats)
    err = (network_map(Q[:, -1], n) - b @ a).abs().max().item()
    err_all = (Q - Qgd).abs().max().item()  # the same times: GD step k is time k * lr
    gap = (Q - Qs).abs().max().item()
    ins = (W1, W2, sigma_yx, lams, times)
    rows.append((f"QQ^T closed form, {E} nets x {Tn} times", t_q, "< 1 s", "",
                 on_gpu(gpu_seconds, lambda a, b, c, l, t: qqt(a, b, c, lam=l, t=t), *ins, repeats=args.repeats)))
    rows.append((f"QQ^T stable form, {E} nets x {Tn} times", t_qs, "", "",
                 on_gpu(gpu_seconds, lambda a, b, c, l, t: qqt_stable(a, b, c, lam=l, t=t), *ins, repeats=args.repeats)))
    rows.append((f"QQ^T by batched GD, {E} nets, {steps} steps", t_gd, "", f"x{t_gd / t_q:.1f}",
                 on_gpu(gpu_seconds, lambda a, b, c: batched_gd(a, b, c, lr_q, steps), W1, W2, sigma_yx,
                        repeats=args.repeats)))
    rows.append((f"  ... recording QQ^T at {Tn} times", t_gdr, "", f"x{t_gdr / t_q:.1f}",
                 on_gpu(gpu_seconds, lambda a, b, c: batched_gd_recorded(a, b, c, lr_q, steps, steps // Tn),
                        W1, W2, sigma_yx, repeats=args.repeats)))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float64, best of {args.repeats}")
    w = max(len(r[0]) for r in rows)
    print(f"{'benchmark':<{w}}  {'seconds':>8}  {'target':>7}  {'sim/theory':>10}  {HEADING + ' seconds':>12}")
    print("-" * (w + 47))
    for name, sec, target, ratio, gpu in rows:
        print(f"{name:<{w}}  {sec:8.3f}  {target:>7}  {ratio:>10}  {cell(gpu, 12, '.3f')}")
    print()
    print(f"phase: theory 'specialised' vs GD slow share < 5%: agree on {100 * agree:.1f}% of "
          f"{int(valid.sum())} grid points (|lam1| >= |lam2|)")
    print(f"QQ^T: closed form vs GD (lr={lr_q}): network map at t={T_end:g} max |diff| = {err:.2e}, "
          f"whole QQ^T trajectory max |diff| = {err_all:.2e}; general vs stable form: {gap:.2e}")


if __name__ == "__main__":
    main()
