"""One training step of the CPU-sized Fig. 4 sweep (recipes/specialisation/fig4_gain_dci.yaml):
the vectorised BetaVAESweep against the same models stepped one after another.

    python bench/bench_vae.py [--threads 1] [--rounds 5]

Sizes of the recipe: 12 beta-VAEs (3 gains x 4 seeds), 16x16x3 images, widths 256-128-64-32,
L = 10, batch 64, lr 1e-3. Each step is the forward pass, the backward pass and Adam's update.

* zoo: ``BetaVAESweep.member_losses`` (vectorised: every member's encoder and decoder as one batched
  computation over stacked weights, ``zoo.kernels.vae``), the sum backward, and the sweep's own
  optimizer (``configure_optimizers``: ``StackedAdam``, torch's fused Adam kernel run over the
  stacked parameters, gradients and state).
* baseline (the strongest hand-written loop of the same arithmetic): 12 separate ``BetaVAE``s, each
  ``losses``, backward and its own fused Adam (the zoo's optimizer, model by model).
* a second row: the same separate models with the Adam ``BetaVAE.configure_optimizers`` gives each
  (torch's default, seven passes per tensor): what one separate run per model costs.

Both sides draw the reparameterisation noise from one generator each, model by model in member
order, so they draw the same noise. The check printed at the end: the largest relative difference
of the losses between the zoo and each baseline over every timed step, and the weights' difference
after 3 steps from the same start relative to the distance training moved them (float tolerance:
the batched products round otherwise); the bench fails above 1e-4 for either.
The GPU column (when CUDA is present) is the same pair on the GPU, and its speed-up.
"""
from __future__ import annotations

import harness
import torch
from gpu_column import GPU, HEADING, cell, clock, on_gpu

from zoo.init import Gain
from zoo.models.vae import BetaVAE, BetaVAESweep

ARGS = dict(latent_dim=10, encoder_widths=[256, 128, 64, 32], decoder_widths=[32, 64, 128, 256], lr=1e-3,
            image_shape=[3, 16, 16])
GAINS, SEEDS, BATCH = [0.3, 1.0, 3.0], [0, 1, 2, 3], 64


def sweep_side(device: torch.device | None = None):
    sweep = BetaVAESweep(init_encoder=Gain(g=GAINS), seeds=SEEDS, **ARGS).to(device)
    noise = torch.Generator().manual_seed(1)
    for m in sweep.members:
        m.noise_generator = noise
    opt = sweep.configure_optimizers()

    def step(x: torch.Tensor, i: int) -> torch.Tensor:
        out = sweep.member_losses(x, i)
        opt.zero_grad()
        out["loss"].sum().backward()
        opt.step()
        return out["loss"].detach()

    return step, [p for m in sweep.members for p in m.parameters()]


def separate_side(fused: bool, device: torch.device | None = None):
    models = [BetaVAE(init_encoder=Gain(g=g), seed=s, **ARGS).to(device) for g in GAINS for s in SEEDS]
    noise = torch.Generator().manual_seed(1)
    for m in models:
        m.noise_generator = noise
    opts = [torch.optim.Adam(m.parameters(), lr=m.lr, fused=True) if fused else m.configure_optimizers()
            for m in models]

    def step(x: torch.Tensor, i: int) -> torch.Tensor:
        losses = []
        for m, opt in zip(models, opts):
            loss = m.losses(x, i)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return torch.stack(losses)

    return step, [p for m in models for p in m.parameters()]


def timed(step, x: torch.Tensor, steps: int, counter: list[int], losses: list[torch.Tensor],
          device: torch.device | None = None) -> float:
    """Seconds per step over ``steps`` steps (continuing the side's run); the losses kept."""
    t = clock(device)
    for _ in range(steps):
        losses.append(step(x, counter[0]))
        counter[0] += 1
    return (clock(device) - t) / steps


def relative_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest ``|u - v| / |v|`` (Frobenius norms) over the pairs of tensors."""
    return max(((u - v).norm() / v.norm().clamp_min(1e-30)).item() for u, v in zip(a, b))


def moved_gap(a: list[torch.Tensor], b: list[torch.Tensor], start: list[torch.Tensor]) -> float:
    """The weights' difference relative to how far training moved them (norms over all the
    weights). Adam moves an element by about lr whatever its gradient's size, so an element whose
    gradient is near zero (the small-gain members' deep layers) may move either way on a rounding
    difference, and the runs drift apart there: the norm over all weights, not the largest
    element, says whether two runs are the same training."""
    diff = sum(((u - v).norm() ** 2 for u, v in zip(a, b)), torch.zeros(())) ** 0.5
    travel = sum(((v - w).norm() ** 2 for v, w in zip(b, start)), torch.zeros(())) ** 0.5
    return (diff / travel).item()


CHECK_STEPS = 3


def fresh_weight_gap(fused: bool) -> float:
    """:func:`moved_gap` of a fresh zoo and a fresh baseline after ``CHECK_STEPS`` steps (few:
    the runs drift apart over many, see there)."""
    x = torch.rand(BATCH, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    (zoo, a), (loop, b) = sweep_side(), separate_side(fused)
    start = [p.detach().clone() for p in b]
    for i in range(CHECK_STEPS):
        zoo(x, i)
        loop(x, i)
    return moved_gap(a, b, start)


def gpu_pair(steps: int, rounds: int) -> tuple[float, float]:
    """Median s/step of the zoo and of the separate models (fused Adam) on the GPU."""
    x = torch.rand(BATCH, 3, 16, 16, generator=torch.Generator().manual_seed(0)).to(GPU)
    sides = {"zoo": sweep_side(GPU)[0], "loop": separate_side(True, GPU)[0]}
    counters = {k: [0] for k in sides}
    for k, step in sides.items():  # warm-up: kernels chosen, allocator filled
        timed(step, x, 2, counters[k], [], GPU)
    times = harness.interleaved({k: (lambda k=k: timed(sides[k], x, steps, counters[k], [], GPU)) for k in sides},
                                rounds)
    return harness.median(times["zoo"]), harness.median(times["loop"])


def main() -> None:
    args = harness.arguments(__doc__, rounds=5)
    steps = 4
    x = torch.rand(BATCH, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    sides = {"zoo": sweep_side(), "loop": separate_side(fused=True), "loop (default Adam)": separate_side(False)}
    counters = {k: [0] for k in sides}
    losses: dict[str, list[torch.Tensor]] = {k: [] for k in sides}
    for k, (step, _) in sides.items():  # warm-up, also part of the compared runs
        timed(step, x, 1, counters[k], losses[k])
    times = harness.interleaved({k: (lambda k=k: timed(sides[k][0], x, steps, counters[k], losses[k]))
                                 for k in sides}, args.rounds)
    zoo = harness.median(times["zoo"])
    rows = [harness.Row("BetaVAESweep vectorised vs separate models (fused Adam), per step", zoo,
                        harness.median(times["loop"]), "s/step", goal=1.5, lower_is_better=True),
            harness.Row("BetaVAESweep vectorised vs separate models (default Adam), per step", zoo,
                        harness.median(times["loop (default Adam)"]), "s/step", goal=1.5, lower_is_better=True)]
    harness.report(rows)
    agree = True
    for k in ("loop", "loop (default Adam)"):
        loss_gap = relative_gap(losses["zoo"], losses[k])
        weight_gap = fresh_weight_gap(k == "loop")
        agree = agree and loss_gap <= 1e-4 and weight_gap <= 1e-4
        print(f"zoo vs {k}: over {counters[k][0]} steps the losses differ by {loss_gap:.1e} (relative, largest); "
              f"after {CHECK_STEPS} steps from the same start the weights by {weight_gap:.1e} of their travel")
    gpu = on_gpu(gpu_pair, steps, args.rounds)
    if isinstance(gpu, tuple):
        print(f"{HEADING}: zoo {gpu[0]:.4f} s/step, separate models (fused Adam) {gpu[1]:.4f} s/step, "
              f"speed-up {gpu[1] / gpu[0]:.2f}x")
    else:
        print(f"{HEADING}: {cell(gpu, 0)}")
    if not agree:
        raise SystemExit("the zoo and the separate models disagree: not the same arithmetic")


if __name__ == "__main__":
    main()
