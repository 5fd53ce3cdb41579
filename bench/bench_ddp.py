"""Member-parallel speed-up: a MultiHeadStudent ensemble on 2 CPU processes against 1 (``zoo.training.distributed``).

    python bench/bench_ddp.py [--threads T] [--rounds R] [--steps N]

E = 4096 students (d = 1000, p = 2, erf, online SGD on one task), each process with ``--threads``
torch threads (default 1): one process trains all members (the baseline); two (``EnsembleDDP``,
Lightning's DDP launcher, gloo) train 2048 each on the same stream. Rounds interleave the two
(rotating which goes first), so that the load of a shared machine weighs on both alike; the row is
the median training rate (student-steps/s from ``on_train_start`` to ``on_train_end`` on rank 0,
what sharding speeds up). Goal (issue #19): >= 1.6x on 2 cores. The table also gives the whole
fit (interpreter start, rendezvous, setup and teardown included) and the CPU ratio (the busiest
process's CPU time in training: the speed-up two idle cores would show). The weights after fit are
compared here: bit-equal at one thread per process (``tests/training/test_ddp_multihead.py`` asserts it).
The GPU column times the same ensemble on one GPU (one process). At the defaults (3 rounds of a
1- and a 2-process fit of 20,000 steps) it took 3.6 min on the 2-core machine at load 3, 5.5 min at
load 10; ``--steps`` shortens it.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import harness
import lightning.pytorch as pl
import torch

from gpu_column import ACCELERATOR, HEADING, cell, on_gpu

REPO = Path(__file__).resolve().parents[1]
E, D = 4096, 1000


class _TrainTime(pl.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def on_train_end(self, trainer, pl_module) -> None:
        self.train_s, self.cpu_s = time.perf_counter() - self.t0, time.process_time() - self.cpu0


def worker(devices: int, steps: int, accelerator: str, save: str) -> None:
    """One fit (this process is rank 0; Lightning's launcher starts the others with this command);
    every rank prints its timings as a JSON line (the launched ranks share rank 0's stdout); rank 0
    saves the trained weights (every rank holds all members again after fit) to ``save``."""
    from datamodules import TeacherStudent
    from zoo import MultiHeadStudent
    from zoo.training.distributed import EnsembleDDP
    from zoo.init import Gaussian, Polar

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    dm = TeacherStudent(d=D, n_tasks=1, num_steps=steps, steps_per_batch=1000, num_test=10, seed=0)
    net = MultiHeadStudent(d=D, n_tasks=1, init_w=Gaussian(sigma=1e-3), init_heads=Polar(r=1.0, theta=0.0), ensemble=E,
                           seed=list(range(E)))
    timer = _TrainTime()
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer],
                         accelerator=accelerator, devices=devices, use_distributed_sampler=False,
                         strategy=EnsembleDDP() if devices > 1 else "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging intervals
        trainer.fit(net, datamodule=dm)
    if trainer.global_rank == 0 and save:
        torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, save)
    print(json.dumps({"rank": trainer.global_rank, "train_s": timer.train_s, "cpu_s": timer.cpu_s}), flush=True)
    if torch.distributed.is_initialized():  # gloo's threads must not outlive the interpreter's teardown
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fit(devices: int, args: argparse.Namespace, accelerator: str = "cpu", save: str = "") -> dict[str, float]:
    """One fit on ``devices`` processes of ``args.threads`` threads: training seconds (rank 0's wall
    clock), the largest CPU time of a process in training, and the whole run (interpreter start included)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    env |= {"OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--worker", str(devices), "--steps", str(args.steps),
                          "--threads", str(args.threads), "--accelerator", accelerator, "--save", save],
                         env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"the {devices}-process run failed:\n{out.stderr[-3000:]}")
    # the ranks print at the same moment: their lines may run together
    ranks = [json.loads(m) for m in re.findall(r'\{"rank".*?\}', out.stdout)]
    assert len(ranks) == devices, out.stdout
    return {"train_s": next(r["train_s"] for r in ranks if r["rank"] == 0), "cpu_s": max(r["cpu_s"] for r in ranks),
            "wall_s": wall}


def max_difference(a: str, b: str) -> float:
    x, y = torch.load(a), torch.load(b)
    assert x.keys() == y.keys()
    return max(float((x[k].double() - y[k].double()).abs().max()) for k in x)


def flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20_000, help="online SGD steps per fit (default 20,000)")
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--accelerator", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--save", default="", help=argparse.SUPPRESS)


def main() -> None:
    args = harness.arguments(__doc__, rounds=3, extra=flags)
    if args.worker:
        return worker(args.worker, args.steps, args.accelerator, args.save)
    fits: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as folder:
        saved = {n: str(Path(folder) / f"{n}.pt") for n in (1, 2)}

        def side(n: int):
            def run() -> float:
                r = fit(n, args, save=saved[n] if not fits[n] else "")  # the first round's weights are compared
                fits[n].append(r)
                return E * args.steps / r["train_s"]
            return run

        rates = harness.interleaved({"1 process": side(1), "2 processes": side(2)}, args.rounds)
        diff = max_difference(saved[1], saved[2])
    gpu = on_gpu(fit, 1, args, ACCELERATOR)
    gpu_train = gpu["train_s"] if isinstance(gpu, dict) else gpu  # None without a GPU, a failure's text
    print(f"\nMember-parallel MultiHeadStudent: E = {E}, d = {D}, p = 2, erf, {args.steps:,} online SGD steps; "
          f"{args.threads} torch thread(s) per process; medians of {args.rounds} interleaved rounds "
          f"(on {os.cpu_count()} cores)")
    gw = max(14, len(HEADING) + 9)
    print(f"{'processes':>10s} {'train s':>9s} {'student-steps/s':>16s} {'speed-up':>9s} {'CPU s/proc':>11s} "
          f"{'CPU ratio':>10s} {'whole run s':>12s} {'speed-up':>9s} {HEADING + ' train s':>{gw}s}")
    med = {n: {k: harness.median([r[k] for r in fits[n]]) for k in ("train_s", "cpu_s", "wall_s")} for n in (1, 2)}
    for n in (1, 2):
        m = med[n]
        print(f"{n:>10d} {m['train_s']:9.1f} {E * args.steps / m['train_s']:16,.0f} "
              f"{med[1]['train_s'] / m['train_s']:9.2f} {m['cpu_s']:11.1f} {med[1]['cpu_s'] / m['cpu_s']:10.2f} "
              f"{m['wall_s']:12.1f} {med[1]['wall_s'] / m['wall_s']:9.2f} "
              f"{cell(gpu_train if n == 1 else None, gw, '.1f')}")
    print(f"rounds (train s): 1 process {[round(r['train_s'], 1) for r in fits[1]]}, "
          f"2 processes {[round(r['train_s'], 1) for r in fits[2]]}")
    print(f"weights after fit, 2 processes vs 1: max |difference| {diff:.1e} "
          f"({'bit-equal' if diff == 0 else 'NOT bit-equal'})")
    if diff != 0 and args.threads == 1:
        raise SystemExit("the 2-process ensemble trained other weights than the 1-process one")
    harness.report([harness.Row(f"MultiHeadStudent E = {E}, d = {D}: 2 processes vs 1 (training)",
                                zoo=harness.median(rates["2 processes"]), baseline=harness.median(rates["1 process"]),
                                unit="student-steps/s", goal=1.6)])


if __name__ == "__main__":
    main()
