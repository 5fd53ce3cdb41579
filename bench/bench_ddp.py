"""Member-parallel speed-up: a MultiHeadStudent ensemble on 2 CPU processes against 1 (``zoo.distributed``).

    python bench/bench_ddp.py [--steps N] [--rounds R]

E = 4096 students (d = 1000, p = 2, erf, online SGD on one task), each process with one torch
thread: one process trains all members; two (``EnsembleDDP``, Lightning's DDP launcher, gloo)
train 2048 each on the same stream. Rounds alternate the two (and which goes first), so that the
load of a shared machine weighs on both alike. Reported: the training time (``on_train_start`` to
``on_train_end`` on rank 0, what sharding speeds up) and the whole fit (process start, the
rendezvous, setup and teardown included). Goal (issue #19): >= 1.6x on 2 cores. The results are
bit-equal to the one-process run (``tests/test_ddp_multihead.py``). On a machine with a GPU, a
column times the same ensemble on one GPU (one process).
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
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch

REPO = Path(__file__).resolve().parents[1]
E, D = 4096, 1000


class _TrainTime(pl.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def on_train_end(self, trainer, pl_module) -> None:
        self.train_s, self.cpu_s = time.perf_counter() - self.t0, time.process_time() - self.cpu0


def worker(devices: int, steps: int, accelerator: str = "cpu") -> None:
    """One fit (this process is rank 0; Lightning's launcher starts the others with this command);
    every rank prints its timings as a JSON line (the launched ranks share rank 0's stdout)."""
    from datamodules import TeacherStudent
    from zoo import MultiHeadStudent
    from zoo.distributed import EnsembleDDP
    from zoo.init import Gaussian, Polar

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    dm = TeacherStudent(d=D, n_tasks=1, num_steps=steps, steps_per_batch=1000, num_test=10, seed=0)
    net = MultiHeadStudent(d=D, n_tasks=1, init_w=Gaussian(sigma=1e-3), init_heads=Polar(r=1.0, theta=0.0), ensemble=E,
                           seed=list(range(E)))
    timer = _TrainTime()
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer],
                         accelerator=accelerator, devices=devices, use_distributed_sampler=False,
                         strategy=EnsembleDDP() if devices > 1 else "auto")
    trainer.fit(net, datamodule=dm)
    print(json.dumps({"rank": trainer.global_rank, "train_s": timer.train_s, "cpu_s": timer.cpu_s}), flush=True)
    if torch.distributed.is_initialized():  # gloo's threads must not outlive the interpreter's teardown
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(devices: int, steps: int, accelerator: str = "cpu") -> tuple[float, float, float]:
    """Seconds of one fit on ``devices`` processes of one thread: training (rank 0's wall clock), the
    largest CPU time of a process in training, and the whole run (interpreter start included)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--worker", str(devices), "--steps", str(steps),
                          "--accelerator", accelerator], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"the {devices}-process run failed:\n{out.stderr[-3000:]}")
    # the ranks print at the same moment: their lines may run together
    ranks = [json.loads(m) for m in re.findall(r'\{"rank".*?\}', out.stdout)]
    assert len(ranks) == devices, out.stdout
    return next(r["train_s"] for r in ranks if r["rank"] == 0), max(r["cpu_s"] for r in ranks), wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.accelerator)
    load = os.getloadavg()[0]
    times: dict[int, list[tuple[float, float, float]]] = {1: [], 2: []}
    for r in range(args.rounds):
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            times[n].append(timed(n, args.steps))
    gpu = timed(1, args.steps, "gpu") if torch.cuda.is_available() else None
    best = {n: tuple(min(r[i] for r in v) for i in range(3)) for n, v in times.items()}
    print(f"\nMember-parallel MultiHeadStudent: E = {E}, d = {D}, p = 2, erf, {args.steps:,} online SGD steps; "
          f"1 torch thread per process; best of {args.rounds} interleaved rounds; load average {load:.1f} at the start "
          f"(on {os.cpu_count()} cores)")
    print(f"{'processes':>10s} {'train s':>9s} {'student-steps/s':>16s} {'speed-up':>9s} {'CPU s/proc':>11s} "
          f"{'CPU ratio':>10s} {'whole run s':>12s} {'speed-up':>9s} {'GPU train s':>12s}")
    for n in (1, 2):
        t, c, w = best[n]
        gpu_col = f"{gpu[0]:12.1f}" if gpu and n == 1 else f"{'n/a':>12s}"
        print(f"{n:>10d} {t:9.1f} {E * args.steps / t:16,.0f} {best[1][0] / t:9.2f} {c:11.1f} {best[1][1] / c:10.2f} "
              f"{w:12.1f} {best[1][2] / w:9.2f} {gpu_col}")
    print("CPU s/proc: the busiest process's CPU time in training; CPU ratio: the speed-up two idle cores would show "
          "(the processes wait on each other once a batch only), unless they contend for memory bandwidth")
    print(f"rounds (train s): 1 process {[round(r[0], 1) for r in times[1]]}, 2 processes {[round(r[0], 1) for r in times[2]]}")


if __name__ == "__main__":
    main()
