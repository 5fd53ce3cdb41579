"""The cost of the default checkpoints (``zoo.training.checkpoint.RunCheckpoint``: last.ckpt every tenth of
the run): the same fit with and without them.

    python bench/bench_checkpoint.py [--threads T] [--rounds R]

The baseline is the plain fit, which saves nothing; the zoo's side is that fit with
``RunCheckpoint`` writing ``last.ckpt`` ten times. Both fits train the same bits (checked here:
saving must not change the run). Rounds interleave the two (the quickstart's row runs 5 rounds
per ``--rounds``), each row gives the median times:

* a MultiHeadStudent ensemble of 256 members (d = 1000, 60,000 SGD steps: a checkpoint of ~4 MB
  written 10 times). Goal 0.98x, issue #17's target: checkpoints cost under ~2% of the run.
* the quickstart's DeepLinearNet (1,000 steps of a tiny network in about 0.13 s), where
  Lightning's own per-save work weighs most. Goal 0.9x (a run this short may pay up to 10%). It
  saves 10 times: every 100 steps, each at an epoch's end, the last after the run's last
  validation. A save of its 11.6 kB checkpoint costs ~1.8 ms inside this fit, twice what the same
  save costs when saves follow each other (0.9 ms): 13 ms of training between two saves leave
  their code cold. Of the 1.8 ms (the fit with each stage's work cut off, load ~1.4): Lightning
  collecting the state (``dump_checkpoint``, 0.64 ms; two thirds of it the loops' progress
  counters turned into dicts), ``torch.save`` into memory (0.8 ms: a Python call for each of the
  ~500 objects pickled), writing the part file and renaming it onto the old one (0.4 ms, and
  0.2-5 ms more under load: ext4 writes the new file out before such a rename returns, which is
  what leaves the old file or the new one after a power cut; an exchange of the two names instead
  saved that time but could leave an empty file, and was dropped); the callback's hooks add ~2 ms
  a run. What is left is Lightning's and torch's per-save Python work, which no public API
  shortens, and the rename.

For the quickstart the bench also times Lightning's own ``ModelCheckpoint(save_last=True,
save_top_k=0, every_n_train_steps=100)`` in the same rounds: the stock way to keep a ``last.ckpt``
10 times in that fit (written in place, not atomically), the reference for what a save costs under
Lightning.

The GPU column gives the same ratio (no checkpoint / RunCheckpoint) with the fits on a CUDA device.
"""
from __future__ import annotations

import logging
import tempfile
import warnings

import harness
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from datamodules import SemanticHierarchy, TeacherStudent
from zoo import DeepLinearNet, MultiHeadStudent
from zoo.training.checkpoint import RunCheckpoint
from zoo.init import Gaussian, LambdaBalanced, Polar

from gpu_column import ACCELERATOR, GPU, HEADING, cell, clock, on_gpu


def student():
    net = MultiHeadStudent(d=1000, init_w=Gaussian(sigma=1e-3), n_tasks=1,
                           init_heads=Polar(r=1.0, theta=[0.01 * i for i in range(256)]))
    return net, TeacherStudent(d=1000, n_tasks=1, num_steps=60_000, steps_per_batch=1000), {"max_epochs": 1}


def deep_linear():
    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-8.0, -2.0, 0.0, 2.0, 8.0], scale=1e-3),
                        lr=0.05, task_aligned=True, steps_per_batch=10)
    return net, SemanticHierarchy(perturb=True, batches_per_epoch=10), {"max_steps": 1000}


#: the fits for which Lightning's own ModelCheckpoint is timed too: its every_n_train_steps
STOCK = {"DeepLinearNet quickstart, 1,000 steps": 100}

# name -> (fit, goal, rounds per --rounds): the quickstart's sub-second fits run 5x the rounds, as
# its median of 3 moved by +-10% between runs of this bench on the shared machine (~1 s a round)
FITS = {"MultiHeadStudent, 256 members, 60k steps": (student, 0.98, 1),
        "DeepLinearNet quickstart, 1,000 steps": (deep_linear, 0.9, 5)}


def fit(make, checkpoint: bool | int, accelerator: str = "cpu") -> tuple[float, dict[str, torch.Tensor]]:
    """Seconds of ``trainer.fit`` and the trained weights; ``checkpoint``: True for RunCheckpoint, a
    number of steps for Lightning's ``ModelCheckpoint`` keeping ``last.ckpt`` every that many steps."""
    net, dm, budget = make()
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging intervals
        callbacks = ([RunCheckpoint()] if checkpoint is True else [] if checkpoint is False else
                     [ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0, every_n_train_steps=checkpoint)])
        trainer = pl.Trainer(callbacks=callbacks, enable_checkpointing=checkpoint is not False,
                             logger=False, enable_progress_bar=False, enable_model_summary=False,
                             accelerator=accelerator, devices=1, default_root_dir=root, **budget)
        device = GPU if accelerator == ACCELERATOR else None
        start = clock(device)
        trainer.fit(net, dm)
        seconds = clock(device) - start
    return seconds, {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}


def measure(make, rounds: int, accelerator: str = "cpu", stock: int | None = None
            ) -> tuple[float, float, bool, float | None]:
    """Median seconds with and without RunCheckpoint, whether every round trained the same weights,
    and the median with Lightning's ModelCheckpoint every ``stock`` steps (None: not timed)."""
    weights: list[dict[str, torch.Tensor]] = []

    def side(checkpoint: bool):
        def run() -> float:
            seconds, w = fit(make, checkpoint, accelerator)
            weights.append(w)
            return seconds
        return run

    sides = {"RunCheckpoint": side(True), "none": side(False)} | ({"stock": side(stock)} if stock else {})
    times = harness.interleaved(sides, rounds)
    same = all(w.keys() == weights[0].keys() and all(torch.equal(w[k], weights[0][k]) for k in w) for w in weights)
    return (harness.median(times["RunCheckpoint"]), harness.median(times["none"]), same,
            harness.median(times["stock"]) if stock else None)


def gpu_ratio(make, rounds: int) -> float:
    on, off, _, _ = measure(make, rounds, ACCELERATOR)
    return off / on


def main() -> None:
    args = harness.arguments(__doc__, rounds=3)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # this script's output: the table only
    results = {name: (measure(make, args.rounds * k, stock=STOCK.get(name)), on_gpu(gpu_ratio, make, args.rounds * k), goal)
               for name, (make, goal, k) in FITS.items()}
    rounds = ", ".join(f"{args.rounds * k} ({name.split(',')[0]})" for name, (_, _, k) in FITS.items())
    print(f"\nRunCheckpoint (last.ckpt 10 times) against the same fit without; interleaved rounds: {rounds}")
    gw = max(14, len(HEADING) + 7)
    print(f"{'fit':42s} {'none s':>8s} {'RunCheckpoint s':>16s} {'ratio':>6s} {'same weights':>13s} "
          f"{HEADING + ' ratio':>{gw}s}")
    for name, ((on, off, same, _), gpu, _) in results.items():
        print(f"{name:42s} {off:8.2f} {on:16.2f} {off / on:6.3f} {str(same):>13s} {cell(gpu, gw, '.3f')}")
    for name, ((on, off, _, stock), _, _) in results.items():
        if stock is not None:
            print(f"{name}: Lightning's ModelCheckpoint (last.ckpt every {STOCK[name]} steps, in place) "
                  f"{stock:.3f} s, {off / stock:.3f}x the fit without; RunCheckpoint {off / on:.3f}x")
    if not all(r[0][2] for r in results.values()):
        raise SystemExit("a fit with RunCheckpoint trained other weights than the same fit without")
    harness.report([harness.Row(f"RunCheckpoint overhead, {name}", zoo=on, baseline=off, unit="s", goal=goal,
                                lower_is_better=True) for name, ((on, off, _, _), _, goal) in results.items()])


if __name__ == "__main__":
    main()
