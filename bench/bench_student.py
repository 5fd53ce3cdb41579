"""MultiHeadStudent throughput: the Lightning path against hand-written loops, in one process.

    python bench/bench_student.py

Online SGD of [S] Eqs. 6-7 (d = 1000, p = 2, p* = 1, erf). Baselines are plain PyTorch loops of
the same update, step by step, with the inputs drawn a chunk at a time as the datamodule does:
one student (vectors), and an ensemble sharing the input stream (an in-place rank-one update of
the stacked first layers). The zoo path is a full ``Trainer.fit`` of ``MultiHeadStudent`` on
``TeacherStudent`` (exact blocked SGD, ``steps_per_batch`` steps per ``training_step``).
Targets (issue #4): one student >= 1.0x the single loop; 1,024 members >= 0.8x the batched loop.
"""
from __future__ import annotations

import logging
import math
import warnings

import lightning.pytorch as pl
import torch

from datamodules import TeacherStudent
from zoo import MultiHeadStudent
from zoo.init import Gaussian, Polar

from gpu_column import ACCELERATOR, GPU, HEADING, cell, clock, on_gpu

D, CHUNK = 1000, 1000


def _teacher(d: int) -> torch.Tensor:
    w = torch.randn(d, generator=torch.Generator().manual_seed(1))
    return w * (math.sqrt(d) / w.norm())


def plain_loop(E: int, steps: int, device: torch.device | None = None) -> float:
    """Step-by-step SGD; E = 1 uses vectors, E > 1 the stacked (E p, d) first layer."""
    g = torch.Generator().manual_seed(0)
    wT = _teacher(D).to(device)
    W = 1e-3 * torch.randn(E * 2, D, generator=g).to(device)
    h = torch.tensor([1.0, 0.0]).repeat(E).to(device)
    c, s2 = 1 / math.sqrt(D), 1 / math.sqrt(2)
    t = clock(device)
    for a in range(0, steps, CHUNK):
        X = torch.randn(CHUNK, D, generator=g).to(device)  # drawn on the host, as the datamodule does
        Y = torch.erf(X @ wT * (c * s2))
        for x, y in zip(X, Y):
            lam = (W @ x) * c
            phi = torch.erf(lam * s2)
            dphi = math.sqrt(2 / math.pi) * torch.exp(-0.5 * lam * lam)
            delta = (h * phi).view(E, 2).sum(-1) - y
            dd = delta.repeat_interleave(2) if E > 1 else delta
            W.addr_(dd * h * dphi, x, alpha=-c)
            h.sub_(dd * phi, alpha=1.0 / D)
    return E * steps / (clock(device) - t)


def zoo_path(E: int, steps: int, steps_per_batch: int = CHUNK, accelerator: str = "cpu") -> float:
    dm = TeacherStudent(d=D, n_tasks=1, num_steps=steps, steps_per_batch=steps_per_batch, num_test=10)
    net = MultiHeadStudent(d=D, n_tasks=1, init_w=Gaussian(sigma=1e-3), init_heads=Polar(r=1.0, theta=0.0),
                           ensemble=E)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator=accelerator, devices=1)
    device = GPU if accelerator == ACCELERATOR else None
    t = clock(device)
    trainer.fit(net, datamodule=dm)
    return E * steps / (clock(device) - t)


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    zoo_path(1, 2000)  # warm-up: first-call costs (imports, allocator) out of the timings
    on_gpu(zoo_path, 1, 2000, accelerator=ACCELERATOR)
    rows = []
    single = plain_loop(1, 20_000)
    rows += [("single student, plain loop", single, 1.0, on_gpu(plain_loop, 1, 20_000, GPU)),
             ("single student, zoo (Lightning, 1000 steps/batch)", zoo_path(1, 20_000), None,
              on_gpu(zoo_path, 1, 20_000, accelerator=ACCELERATOR)),
             ("single student, zoo (Lightning, 1 step/batch)", zoo_path(1, 1000, steps_per_batch=1), None,
              on_gpu(zoo_path, 1, 1000, steps_per_batch=1, accelerator=ACCELERATOR))]
    rows = [(n, r, r / single, g) for n, r, _, g in rows]
    batched = plain_loop(1024, 2000)
    rows += [("1024 members, plain batched loop", batched, 1.0, on_gpu(plain_loop, 1024, 2000, GPU)),
             ("1024 members, zoo (Lightning)", zoo_path(1024, 4000), None,
              on_gpu(zoo_path, 1024, 4000, accelerator=ACCELERATOR))]
    rows[-1] = (rows[-1][0], rows[-1][1], rows[-1][1] / batched, rows[-1][3])
    print(f"\nOnline SGD, d = {D}, p = 2, erf ({torch.get_num_threads()} threads); ratio against the plain loop above it")
    print(f"{'path':55s} {'student-steps/s':>16s} {'ratio':>7s} {HEADING + ' steps/s':>16s}")
    for name, rate, ratio, gpu in rows:
        print(f"{name:55s} {rate:16,.0f} {ratio:7.2f} {cell(gpu, 16, ',.0f')}")


if __name__ == "__main__":
    main()
