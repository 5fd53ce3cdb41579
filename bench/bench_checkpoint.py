"""The cost of the default checkpoints (``zoo.checkpoint.RunCheckpoint``: last.ckpt every tenth of
the run, issue #17's target: under ~2% of the run time).

    python bench/bench_checkpoint.py

The same fit with and without ``RunCheckpoint``, in interleaved rounds, at 1 torch thread: a
MultiHeadStudent ensemble of 256 members (d = 1000, 60,000 and 240,000 SGD steps: a checkpoint of
~4 MB written 10 times) and the quickstart's DeepLinearNet (1,000 steps of a tiny network, where
Lightning's own per-save work weighs most). The table gives each median time and their ratio.
"""
from __future__ import annotations

import logging
import statistics
import tempfile
import warnings

import lightning.pytorch as pl
import torch

from datamodules import SemanticHierarchy, TeacherStudent
from zoo import DeepLinearNet, MultiHeadStudent
from zoo.checkpoint import RunCheckpoint
from zoo.init import Gaussian, LambdaBalanced, Polar

from gpu_column import ACCELERATOR, GPU, HEADING, cell, clock, on_gpu

ROUNDS = 3


def student(num_steps: int = 60_000):
    net = MultiHeadStudent(d=1000, init_w=Gaussian(sigma=1e-3), n_tasks=1,
                           init_heads=Polar(r=1.0, theta=[0.01 * i for i in range(256)]))
    return net, TeacherStudent(d=1000, n_tasks=1, num_steps=num_steps, steps_per_batch=1000), {"max_epochs": 1}


def long_student():
    return student(240_000)


def deep_linear():
    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-8.0, -2.0, 0.0, 2.0, 8.0], scale=1e-3),
                        lr=0.05, task_aligned=True, steps_per_batch=10)
    return net, SemanticHierarchy(perturb=True, batches_per_epoch=10), {"max_steps": 1000}


def timed(make, checkpoint: bool, accelerator: str = "cpu") -> float:
    net, dm, budget = make()
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(callbacks=[RunCheckpoint()] if checkpoint else [], enable_checkpointing=checkpoint,
                             logger=False, enable_progress_bar=False, enable_model_summary=False,
                             accelerator=accelerator, devices=1, default_root_dir=root, **budget)
        device = GPU if accelerator == ACCELERATOR else None
        start = clock(device)
        trainer.fit(net, dm)
        return clock(device) - start


def ratio_on_gpu(make) -> float:
    """RunCheckpoint's time over the plain fit's on ``GPU`` (medians of interleaved rounds)."""
    times = {False: [], True: []}
    for _ in range(ROUNDS):
        for ckpt in (False, True):
            times[ckpt].append(timed(make, ckpt, ACCELERATOR))
    return statistics.median(times[True]) / statistics.median(times[False])


def main() -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(f"{'fit':<34}{'no checkpoint [s]':>18}{'RunCheckpoint [s]':>19}{'ratio':>8}{HEADING + ' ratio':>14}")
    for name, make in (("MultiHeadStudent, 256 members", student), ("the same, 4x the steps", long_student),
                       ("DeepLinearNet (quickstart)", deep_linear)):
        times = {False: [], True: []}
        for _ in range(ROUNDS):  # interleaved: the machine's load drifts
            for ckpt in (False, True):
                times[ckpt].append(timed(make, ckpt))
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"{name:<34}{off:>18.2f}{on:>19.2f}{on / off:>8.3f}{cell(on_gpu(ratio_on_gpu, make), 14, '.3f')}")


if __name__ == "__main__":
    main()
