"""GDLN / ReLUNet throughput: the Lightning path against hand-written loops, in one process.

    python bench/bench_gdln.py [--threads 2]

The issue's target ([H] App. H sizes): the three-context task, a ReLU net with 700 hidden units and
its ReLN (4 pathways x 100), 8,000 full-batch epochs each, under 2 s and 6 s on 2 cores. Prints
the wall time of ``Trainer.fit`` (``epochs_per_step`` epochs per ``training_step``, no logger, no
checkpoint) with the modules' default ``num_threads=1`` and with torch's ``--threads``, and its
ratio to two plain-PyTorch loops of the same updates on the same single thread: autograd + SGD
(what a user would write), and the same hand-written gradients in a bare loop (the floor).
"""
from __future__ import annotations

import argparse
import logging
import time
import warnings

import lightning.pytorch as pl
import torch

from datamodules.contexts import Contexts
from zoo.gdln import GDLN, ReLUNet, cpu_threads
from zoo.init import Gaussian

from gpu_column import ACCELERATOR, GPU, HEADING, cell, clock, on_gpu

EPOCHS, SIGMA, LR = 8000, 7.142857e-6, 1e-3


def make(kind: str, dm: Contexts, num_threads: int | None = 1):
    init = Gaussian(sigma=SIGMA)
    if kind == "ReLU net (700)":
        net = ReLUNet(hidden=[700], init=init, lr=LR, epochs_per_step=1000, num_threads=num_threads)
    else:
        net = GDLN(gating="reln", n_hidden=100, init=init, lr=LR, epochs_per_step=1000, num_threads=num_threads)
        net.attach(dm)
    net.build(dm.X, dm.Y)
    return net


def autograd_loop(kind: str, dm: Contexts) -> float:
    net = make(kind, dm)
    params = [torch.nn.Parameter(w.detach().clone()) for w in net.W]
    opt = torch.optim.SGD(params, lr=LR)
    X, Y = dm.X, dm.Y
    relu = kind.startswith("ReLU")
    with cpu_threads(1):
        t = time.perf_counter()
        _autograd_epochs(params, opt, X, Y, net, relu)
        return time.perf_counter() - t


def _autograd_epochs(params, opt, X, Y, net, relu: bool) -> None:
    for _ in range(EPOCHS):
        W1 = params[0] if relu else params[0] * net.unit_inputs
        pre = X @ W1.transpose(-1, -2)
        h = torch.relu(pre) if relu else pre * net.unit_gates
        loss = 0.5 * (h @ params[1].transpose(-1, -2) - Y).pow(2).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def bare_loop(kind: str, dm: Contexts) -> float:
    net = make(kind, dm)
    t = time.perf_counter()
    net.run_epochs(dm.X, dm.Y, EPOCHS)
    return time.perf_counter() - t


def lightning_path(kind: str, dm: Contexts, num_threads: int | None = 1, accelerator: str = "cpu") -> float:
    net = make(kind, dm, num_threads)
    trainer = pl.Trainer(max_steps=EPOCHS, max_epochs=-1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator=accelerator, devices=1)
    device = GPU if accelerator == ACCELERATOR else None
    t = clock(device)
    trainer.fit(net, datamodule=dm)
    assert net.epochs_done == EPOCHS
    return clock(device) - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    dm = Contexts(3, "different")
    print(f"{EPOCHS} full-batch epochs, three-context task; torch's threads: {args.threads}; the loops: 1 thread")
    print(f"{'network':<16}{'Lightning s':>13}{f'at {args.threads} thr s':>12}{'autograd s':>12}{'bare s':>9}"
          f"{'L/autograd':>12}{'L/bare':>8}{'target s':>10}{HEADING + ' Lightning s':>18}")
    for kind, target in (("ReLU net (700)", 2.0), ("ReLN (4 x 100)", 6.0)):
        light, light_n = lightning_path(kind, dm), lightning_path(kind, dm, num_threads=None)
        auto, bare = autograd_loop(kind, dm), bare_loop(kind, dm)
        gpu = on_gpu(lightning_path, kind, dm, None, ACCELERATOR)
        print(f"{kind:<16}{light:>13.2f}{light_n:>12.2f}{auto:>12.2f}{bare:>9.2f}{light / auto:>12.2f}"
              f"{light / bare:>8.2f}{target:>10.1f}{cell(gpu, 18)}")


if __name__ == "__main__":
    main()
