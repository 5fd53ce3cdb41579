"""Diagonal Fisher of a 784-1000-5 network: ``zoo.metrics.fisher_diagonal`` against the strongest
hand-written code of the same arithmetic.

    python bench/bench_fisher.py [--threads T] [--rounds R]

The network of [S] App. G's MNIST task: ``Linear(784, 1000) -> sigmoid -> Linear(1000, 5)``,
cross-entropy, random inputs ``x ~ N(0, I)`` with random labels (the Fisher's cost does not depend
on the data), float32, ``F = mean_n g_n^2`` (squared per-sample gradients). Three rows:

* ``method="auto"`` (the default) on 10,000 samples against a hand-written closed form: the
  network's backward pass written out (``delta2 = softmax(f) - onehot(y)``,
  ``delta1 = (delta2 W2) * h (1 - h)``) and ``sum_n (delta_n a_n^T)^2 = (delta^2)^T (a^2)``, one
  matrix product per weight, in chunks of 1,000 samples (the fastest chunk tried). The zoo takes
  the same closed form for ``nn.Linear`` layers, with autograd for the deltas. Goal 0.9x (the
  generic path's hooks, ``functional_call`` and chunking may cost at most 10%; the issue #5
  target, 10,000 samples in under 10 s, is met by both by far).
* the generic path (what any layer that is not ``nn.Linear`` takes) on 500 samples, against a
  per-sample autograd loop (one backward pass per sample, squares summed), the strongest plain code
  for a generic module. The network is written with ``Dense``, the same arithmetic as
  ``nn.Linear`` in a module of another type, so ``method="auto"`` cannot use the closed form. Two
  widths: the 784-1000-5 network (785k per-sample gradient entries: ``auto`` runs one backward pass
  per sample there, since ``vmap`` is 0.25-0.8x the loop's speed on a CPU at that width; its rate
  is printed beside) and a 784-50-5 one (39k entries: ``auto`` runs ``vmap``). Goal 1.0x
  (vectorising should not lose to the loop; the wide row is the loop itself, so 1.0x is its
  ceiling and the row measures the generic path's overhead).

Each side's result is compared with the other's in the bench (max relative difference over
entries: float rounding only, the sums run in different orders). Rounds interleave the two sides.
The GPU column times the same pairs on a CUDA device (medians of the same rounds).
"""
from __future__ import annotations

import harness
import torch
from torch import nn

from zoo.metrics.fisher import fisher_diagonal

from gpu_column import GPU, HEADING, cell, clock, on_gpu

N, N_LOOP = 10_000, 500
NARROW = 50  # hidden units of the row where vmap is the generic path (784-50-5: 39k entries)
# the hand-written closed form's chunk: the fastest of 500, 1,000, 2,500 and 10,000 samples (1 thread)
CHUNK = 1000
TOLERANCE = 1e-5  # float32 sums in another order: a few ulps of the largest entry


def network(device: torch.device | None = None, hidden: int = 1000) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, hidden), nn.Sigmoid(), nn.Linear(hidden, 5)).to(device)


class Dense(nn.Module):
    """``nn.Linear``'s arithmetic in a module of another type: its parameters take
    ``fisher_diagonal``'s generic path, as any custom layer's do."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(layer.weight.detach().clone())
        self.bias = nn.Parameter(layer.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


def generic(net: nn.Sequential) -> nn.Sequential:
    """The same network (same parameter names and values) built from ``Dense`` layers."""
    return nn.Sequential(Dense(net[0]), net[1], Dense(net[2]))


def data(device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 784, generator=g).to(device), torch.randint(0, 5, (N,), generator=g).to(device)


def ce(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(f, y)


def closed_form(net: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The Fisher of the 784-1000-5 sigmoid network by hand: per chunk of ``CHUNK`` samples one
    forward, the backward written out, ``(delta^2)^T (a^2)`` per weight and ``sum_n delta_n^2`` per
    bias, totals in float64 (as the zoo)."""
    W1, b1, W2, b2 = (p.detach() for p in net.parameters())
    F = {n: torch.zeros(p.shape, dtype=torch.float64, device=x.device) for n, p in net.named_parameters()}
    for a in range(0, x.shape[0], CHUNK):
        xc, yc = x[a:a + CHUNK], y[a:a + CHUNK]
        h = torch.sigmoid(torch.addmm(b1, xc, W1.T))
        delta2 = torch.softmax(torch.addmm(b2, h, W2.T), dim=1)
        delta2[torch.arange(xc.shape[0], device=x.device), yc] -= 1.0  # d CE / d logits
        delta1 = (delta2 @ W2) * h * (1.0 - h)
        d1, d2 = delta1.square(), delta2.square()
        F["0.weight"] += d1.T @ xc.square()
        F["0.bias"] += d1.sum(0)
        F["2.weight"] += d2.T @ h.square()
        F["2.bias"] += d2.sum(0)
    return {n: (f / x.shape[0]).float() for n, f in F.items()}


def per_sample_loop(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The definition: one backward pass per sample, squares summed."""
    params = list(net.parameters())
    F = [torch.zeros_like(p) for p in params]
    for i in range(x.shape[0]):
        for acc, g in zip(F, torch.autograd.grad(ce(net(x[i:i + 1])[0], y[i]), params)):
            acc.addcmul_(g, g)
    return {n: f / x.shape[0] for (n, _), f in zip(net.named_parameters(), F)}


def rel_diff(F: dict[str, torch.Tensor], G: dict[str, torch.Tensor]) -> float:
    return max(float((F[n] - G[n]).abs().max() / G[n].abs().max()) for n in G)


LABELS = ("fisher_diagonal auto vs closed form by hand", "generic path 784-1000-5 vs per-sample loop",
          f"generic path 784-{NARROW}-5 (vmap) vs per-sample loop")


def pairs(net: nn.Module, narrow: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """The sides of each row of ``LABELS`` ("zoo", "loop" and others shown beside), and its samples."""
    xs, ys = x[:N_LOOP], y[:N_LOOP]
    wide = generic(net)
    return [({"zoo": lambda: fisher_diagonal(net, ce, (x, y)), "loop": lambda: closed_form(net, x, y)}, N),
            ({"zoo": lambda: fisher_diagonal(wide, ce, (xs, ys)), "loop": lambda: per_sample_loop(wide, xs, ys),
              "vmap": lambda: fisher_diagonal(wide, ce, (xs, ys), method="vmap")}, N_LOOP),
            ({"zoo": lambda: fisher_diagonal(narrow, ce, (xs, ys)), "loop": lambda: per_sample_loop(narrow, xs, ys)},
             N_LOOP)]


def measure(rounds: int, device: torch.device | None = None) -> list[tuple[float, float, float, float | None]]:
    """Per row: median samples/s of the zoo and of the baseline, their results' relative
    difference, and the median samples/s of ``method="vmap"`` where it is shown beside."""
    net = network(device)
    x, y = data(device)
    out = []
    for sides, n in pairs(net, generic(network(device, NARROW)), x, y):
        results = {k: f() for k, f in sides.items()}  # warm-up (first-call costs), and the results compared

        def timed(fn):
            def run() -> float:
                t = clock(device)
                fn()
                return n / (clock(device) - t)
            return run

        rates = harness.interleaved({k: timed(f) for k, f in sides.items()}, rounds)
        diff = max(rel_diff(results[k], results["loop"]) for k in results if k != "loop")
        out.append((harness.median(rates["zoo"]), harness.median(rates["loop"]), diff,
                    harness.median(rates["vmap"]) if "vmap" in rates else None))
    return out


def main() -> None:
    args = harness.arguments(__doc__)
    cpu = measure(args.rounds)
    gpu = on_gpu(measure, args.rounds, GPU)
    print(f"\nDiagonal Fisher, 784-1000-5 sigmoid network, cross-entropy, float32 ({N:,} samples; the loop row "
          f"{N_LOOP}), {args.rounds} interleaved rounds")
    gw = max(16, len(HEADING) + 9)
    print(f"{'row':46s} {'zoo samples/s':>14s} {'hand samples/s':>15s} {'max rel. diff':>14s} "
          f"{HEADING + ' zoo/hand':>{gw}s}")
    for i, (label, (zoo, base, diff, _)) in enumerate(zip(LABELS, cpu)):
        g = gpu if not isinstance(gpu, list) else f"{gpu[i][0]:,.0f}/{gpu[i][1]:,.0f}"
        print(f"{label:46s} {zoo:14,.0f} {base:15,.0f} {diff:14.1e} {cell(g, gw)}")
        if diff > TOLERANCE:
            raise SystemExit(f"{label}: the two sides differ by {diff:.1e} (relative), over {TOLERANCE:.0e}")
    print(f"(results agree within {TOLERANCE:.0e} relative: float rounding of sums in another order)")
    print(f"784-1000-5, method='vmap' forced: {cpu[1][3]:,.0f} samples/s ({cpu[1][3] / cpu[1][1]:.2f}x the loop; "
          "the generic path loops at this width on a CPU)")
    harness.report([
        harness.Row(f"Fisher 784-1000-5, {N:,} samples: auto vs closed form by hand", zoo=cpu[0][0],
                    baseline=cpu[0][1], unit="samples/s", goal=0.9),
        harness.Row(f"Fisher 784-1000-5 non-Linear layers, {N_LOOP} samples: generic path (loop) vs per-sample loop",
                    zoo=cpu[1][0], baseline=cpu[1][1], unit="samples/s", goal=1.0),
        harness.Row(f"Fisher 784-{NARROW}-5 non-Linear layers, {N_LOOP} samples: generic path (vmap) vs per-sample loop",
                    zoo=cpu[2][0], baseline=cpu[2][1], unit="samples/s", goal=1.0)])


if __name__ == "__main__":
    main()
