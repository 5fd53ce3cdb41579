"""Diagonal Fisher of a 784-1000-5 network: zoo.metrics.fisher_diagonal against a per-sample loop.

    python bench/bench_fisher.py

The network of [S] App. G's MNIST task: ``Linear(784, 1000) -> sigmoid -> Linear(1000, 5)``,
cross-entropy, 10,000 random inputs ``x ~ N(0, I)`` with random labels (the Fisher's cost does
not depend on the data), float32. Three ways to the same ``F = mean_n g_n^2``:

* a per-sample Python loop (autograd on one sample at a time; timed on 500 samples and scaled
  per sample, the baseline);
* ``method="vmap"``: per-sample gradients from ``torch.func`` (``vmap`` of ``grad``),
  materialised a cache-sized chunk at a time;
* ``method="auto"`` (the default): the same, except that ``nn.Linear`` layers take the exact
  closed form ``sum_n (delta_n a_n^T)^2 = (delta^2)^T (a^2)`` (one matrix product).

Target (issue #5): 10,000 samples in under 10 s on 2 cores. The last column checks that each
path agrees with the loop on the loop's 500 samples (max relative difference over entries).
"""
from __future__ import annotations

import torch
from torch import nn

from zoo.metrics.fisher import fisher_diagonal

from gpu_column import GPU, HEADING, cell, clock, on_gpu

N, N_LOOP = 10_000, 500


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 1000), nn.Sigmoid(), nn.Linear(1000, 5))


def ce(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(f, y)


def loop(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The definition: one backward pass per sample, squares summed."""
    params = list(net.parameters())
    F = [torch.zeros_like(p) for p in params]
    for i in range(x.shape[0]):
        for acc, g in zip(F, torch.autograd.grad(ce(net(x[i:i + 1])[0], y[i]), params)):
            acc.addcmul_(g, g)
    return {n: f / x.shape[0] for (n, _), f in zip(net.named_parameters(), F)}


def timed(fn, *args, device: torch.device | None = None, **kw) -> tuple[float, dict[str, torch.Tensor]]:
    t = clock(device)
    out = fn(*args, **kw)
    return clock(device) - t, out


def on_device(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The rows' timings with the network and the data on ``GPU`` (after a warm-up there)."""
    net, x, y = network().to(GPU), x.to(GPU), y.to(GPU)
    fisher_diagonal(net, ce, (x[:64], y[:64]), method="vmap")
    loop(net, x[:16], y[:16])
    out = {"loop": timed(loop, net, x[:N_LOOP], y[:N_LOOP], device=GPU)[0] * N / N_LOOP}
    for label, kw in KWARGS:
        if "generator" in kw:  # the sampled labels' generator lives on the device of the draws
            kw = {**kw, "generator": torch.Generator(GPU).manual_seed(2)}
        out[label] = timed(fisher_diagonal, net, ce, (x, y), device=GPU, **kw)[0]
    return out


KWARGS = (("fisher_diagonal, method='vmap'", {"method": "vmap"}),
          ("fisher_diagonal, method='auto' (default)", {}),
          ("fisher_diagonal, method='auto', mode='sampled'", {"mode": "sampled", "generator": None}))


def rel_diff(F: dict[str, torch.Tensor], G: dict[str, torch.Tensor]) -> float:
    return max(float((F[n] - G[n]).abs().max() / G[n].abs().max()) for n in G)


def main() -> None:
    net = network()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(N, 784, generator=g), torch.randint(0, 5, (N,), generator=g)
    fisher_diagonal(net, ce, (x[:64], y[:64]), method="vmap")  # warm-up: first-call costs out of the timings
    loop(net, x[:16], y[:16])

    t_loop, F_loop = timed(loop, net, x[:N_LOOP], y[:N_LOOP])
    t_loop_full = t_loop * N / N_LOOP
    rows = [(f"per-sample Python loop ({N_LOOP} samples, scaled)", t_loop_full, None)]
    for label, kw in KWARGS:
        if "generator" in kw:
            kw = {**kw, "generator": torch.Generator().manual_seed(2)}
        t, _ = timed(fisher_diagonal, net, ce, (x, y), **kw)
        check = None
        if "mode" not in kw:  # sampled labels differ from the loop's: no entry-wise comparison
            check = rel_diff(fisher_diagonal(net, ce, (x[:N_LOOP], y[:N_LOOP]), **kw), F_loop)
        rows.append((label, t, check))

    print(f"\nDiagonal Fisher, 784-1000-5 sigmoid network, cross-entropy, float32, {N:,} samples "
          f"({torch.get_num_threads()} threads)")
    gpu = on_gpu(on_device, x, y)
    print(f"{'path':48s} {'time (s)':>9s} {'speed-up':>9s} {'vs loop':>9s} {HEADING + ' (s)':>12s}")
    for i, (label, t, check) in enumerate(rows):
        speed = t_loop_full / t
        g = gpu.get("loop" if i == 0 else label) if isinstance(gpu, dict) else gpu
        print(f"{label:48s} {t:9.2f} {speed:8.1f}x {'' if check is None else f'{check:9.1e}':>9s} {cell(g, 12)}")


if __name__ == "__main__":
    main()
