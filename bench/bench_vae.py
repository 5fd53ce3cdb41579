"""Cost of one optimizer step of the CPU-sized Fig. 4 sweep (recipes/specialisation/fig4_gain_dci.yaml).

    python bench/bench_vae.py [--members 12] [--steps 10]

Rows: ``BetaVAESweep`` of M CPU-sized beta-VAEs (16x16x3 inputs, widths 256-128-64-32, L = 10,
batch 64) in one module and one Adam, against the same M models stepped one after another with
their own Adams, each with 1 and 2 torch threads. On a machine whose cores are shared with other
jobs, 2 threads can be many times slower than 1 (OpenMP threads wait on each other); set
``OMP_NUM_THREADS=1`` there. The last column is the largest parameter difference between the two
ways after the timed steps: the sweep is the same computation, not an approximation.

Measured (12 models, 5 steps, 2 cores shared with 3 other jobs, load ~7)::

    threads  sweep s/step  separate s/step  max |param diff|
          1         0.541            0.523          0.00e+00
          2         5.076            6.699          0.00e+00

One module costs what the separate models cost (the sweep saves no compute; it makes the
figure one ``lightning fit``), and the parameters agree bitwise. Two threads on busy cores were
~10x slower than one.
"""
from __future__ import annotations

import argparse
import time

import torch

from zoo.init import Gain
from zoo.vae import BetaVAE, BetaVAESweep

from gpu_column import GPU, HEADING, cell, clock, on_gpu

ARGS = dict(latent_dim=10, encoder_widths=[256, 128, 64, 32], decoder_widths=[32, 64, 128, 256], lr=1e-3,
            image_shape=[3, 16, 16])


class NoNoise(BetaVAE):
    def reparameterise(self, mu, logvar):  # deterministic, so the two ways can be compared
        return mu


class NoNoiseSweep(BetaVAESweep):
    member_class = NoNoise


def gains(m: int) -> list[float]:
    return [0.3 + 2.7 * i / max(m - 1, 1) for i in range(m)]


def time_sweep(m: int, steps: int, x: torch.Tensor, device: torch.device | None = None) -> tuple[float, NoNoiseSweep]:
    sweep = NoNoiseSweep(init_encoder=Gain(g=gains(m)), seeds=[0], **ARGS).to(device)
    x = x.to(device)
    opt = sweep.configure_optimizers()
    t = 0.0
    for i in range(steps + 1):
        start = clock(device)
        loss = sum(v.losses(x, i)["loss"] for v in sweep.members)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t += (clock(device) - start) if i else 0.0  # the first step warms up
    return t / steps, sweep


def time_separate(m: int, steps: int, x: torch.Tensor) -> tuple[float, list[NoNoise]]:
    models = [NoNoise(init_encoder=Gain(g=g), seed=0, **ARGS) for g in gains(m)]
    opts = [v.configure_optimizers() for v in models]
    t = 0.0
    for i in range(steps + 1):
        start = time.perf_counter()
        for v, opt in zip(models, opts):
            loss = v.losses(x, i)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
        t += (time.perf_counter() - start) if i else 0.0
    return t / steps, models


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=12)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    x = torch.rand(64, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    gpu = on_gpu(lambda: time_sweep(a.members, a.steps, x, GPU)[0])  # one device: no threads to vary
    print(f"{'threads':>7} {'sweep s/step':>13} {'separate s/step':>16} {'max |param diff|':>17} "
          f"{HEADING + ' sweep s/step':>21}")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ts, sweep = time_sweep(a.members, a.steps, x)
        tp, models = time_separate(a.members, a.steps, x)
        diff = max((p1 - p2).abs().max().item() for v, w in zip(sweep.members, models)
                   for p1, p2 in zip(v.parameters(), w.parameters()))
        print(f"{threads:>7} {ts:>13.3f} {tp:>16.3f} {diff:>17.2e} {cell(gpu, 21, '.4f')}")


if __name__ == "__main__":
    main()
