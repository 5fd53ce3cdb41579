"""MultiHeadStudent throughput: ``Trainer.fit`` against the manual-gradient loops, in one process.

    python bench/bench_student.py               # 1 torch thread (both sides)
    python bench/bench_student.py --threads 2   # torch's 2 threads: the student's own choice holds
    python bench/bench_student.py --single      # the single-student rows only (d = 500, 1000, 10,000)

Online SGD of [S] Eqs. 6-7 (p = 2, p* = 1, erf, eta = 1) on ``TeacherStudent``'s stream. The
baselines are hand-written loops of the same update, one step at a time with the gradient in
closed form, on the same chunks of the same stream (``TeacherStudent.chunk``: the data cost is
the same on both sides) from the same initial weights. One student: its two pre-activations, the
head and every scalar of the step in Python floats, and only the three d-sized operations as
tensor ops (``W x`` into a buffer, one in-place ``axpy`` per row of ``W``): the strongest loop we
know, 2-3x faster at d = 1000 (~1.3x at d = 10,000) than the same loop written with a dozen
tensor ops on 2-element tensors (the loop of issue #21's table). A single student gets two rows:
against the scalar loop, goal 1.0x (#21's title), and against the tensor-op loop with #21's own
goals (2.0x at d = 500 and 1000, 1.0x at d = 10,000). Since issue 32 the single student trains
through the ensembles' blocked kernel (no Python-float twin): a step is ~10 tensor ops on views of
the block's buffers, ~1 us of dispatch each, so it sits at about the tensor-op loop's rate (1.0-1.1x)
and below the scalar loop's (0.4x at d = 500 and 1000, 0.8x at d = 10,000, where the inputs' draw
and the block's products dominate). The float twin it replaced ran 1.1-1.3x of the scalar loop.
An ensemble shares the input: an in-place rank-one update of the stacked first layers. The
zoo side is a whole ``Trainer.fit`` (setup included, validation left out: the loops have none) of
``MultiHeadStudent``: exact blocked SGD, 1000 steps per ``training_step``. Each row
checks that the sides end at the same weights (float32 rounding: the zoo sums each block's
updates in another order) and prints the largest difference.

With ``--threads`` above 1 the single-student rows run (a single student chooses one thread for
itself, ``MultiHeadStudent._cpu_threads``, while the loop runs at torch's count), and a last row
compares that scoped choice with the same fit at torch's thread count. The ensemble row is left
out there: 1,024 members keep the caller's count on both sides, and on a loaded 2-core machine
both then wait on each other's threads for minutes.
"""
from __future__ import annotations

import logging
import math
import time
import warnings
from math import erf, exp

import harness
import lightning.pytorch as pl
import torch

from datamodules import TeacherStudent
from zoo import MultiHeadStudent
from zoo.init import Gaussian, Polar

from gpu_column import ACCELERATOR, GPU, HEADING, cell, clock, on_gpu

CHUNK = 1000
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def setup(d: int, E: int, steps: int) -> tuple[TeacherStudent, MultiHeadStudent]:
    dm = TeacherStudent(d=d, n_tasks=1, num_steps=steps, steps_per_batch=CHUNK, num_test=10)
    net = MultiHeadStudent(d=d, n_tasks=1, init_w=Gaussian(sigma=1e-3), init_heads=Polar(r=1.0, theta=0.0), ensemble=E)
    return dm, net


def scalar_loop(d: int, E: int, steps: int) -> tuple[float, torch.Tensor]:
    """One student (``E`` = 1) step by step, on the CPU: ``u = W x / sqrt(2 d)`` into a buffer, the
    rest of the step on Python floats, ``W``'s rows updated in place; returns (steps/s, final W)."""
    dm, net = setup(d, E, steps)
    W = net.W.detach()[0].clone()  # the zoo's initial weights, (2, d)
    w0, w1 = W.unbind(0)
    h0, h1 = net.h.detach()[0, 0].tolist()
    a, c_W, c_h = 1.0 / math.sqrt(2.0 * d), SQRT_2_OVER_PI / math.sqrt(d), 1.0 / d
    u = torch.empty(2)
    t = clock(None)
    for k in range(len(dm.chunks)):
        batch = dm.chunk(k)
        for x, y in zip(batch["x"][:, 0].unbind(0), batch["y"][:, 0, 0].tolist()):
            u0, u1 = torch.mv(W, x, out=u).tolist()
            u0, u1 = a * u0, a * u1
            f0, f1 = erf(u0), erf(u1)
            delta = h0 * f0 + h1 * f1 - y
            w0.add_(x, alpha=-c_W * delta * h0 * exp(-u0 * u0))  # Delta h phi'(lam) / sqrt(2 / pi)
            w1.add_(x, alpha=-c_W * delta * h1 * exp(-u1 * u1))
            h0, h1 = h0 - c_h * delta * f0, h1 - c_h * delta * f1
    return steps / (clock(None) - t), W.view(1, 2, d)


def manual_loop(d: int, E: int, steps: int, device: torch.device | None = None) -> tuple[float, torch.Tensor]:
    """Step-by-step SGD with the closed-form gradient, every step a dozen tensor ops (the strongest
    loop for an ensemble, and on a GPU); returns (student-steps/s, final W (E, 2, d))."""
    dm, net = setup(d, E, steps)
    W = net.W.detach().reshape(E * 2, d).clone().to(device)  # the zoo's initial weights
    h = net.h.detach()[:, 0].reshape(E * 2).clone().to(device)
    a, c_W, c_h = 1.0 / math.sqrt(2.0 * d), SQRT_2_OVER_PI / math.sqrt(d), 1.0 / d  # u = lam / sqrt 2; eta = 1
    t = clock(device)
    for k in range(len(dm.chunks)):
        batch = dm.chunk(k)  # drawn on the host, as the datamodule does for the zoo
        X, Y = batch["x"][:, 0].to(device), batch["y"][:, 0, 0].to(device)
        for x, y in zip(X, Y):
            u = torch.mv(W, x).mul_(a)
            f = torch.erf(u)
            # one student: a dot product; an ensemble: each member's pair of units, its Delta on both
            delta = torch.dot(h, f).sub_(y) if E == 1 else (h * f).view(E, 2).sum(-1).sub_(y).repeat_interleave(2)
            g = u.square_().neg_().exp_().mul_(h).mul_(delta)  # Delta h phi'(lam) / sqrt(2 / pi)
            W.addr_(g, x, alpha=-c_W)
            h.addcmul_(f, delta, value=-c_h)
    return E * steps / (clock(device) - t), W.view(E, 2, d).cpu()


def zoo_fit(d: int, E: int, steps: int, accelerator: str = "cpu", scoped: bool = True) -> tuple[float, torch.Tensor]:
    """``Trainer.fit``; returns (student-steps/s, final W). ``scoped=False``: at torch's thread count."""
    dm, net = setup(d, E, steps)
    if not scoped:
        net._cpu_threads = lambda device: None
    # no validation (the sanity check and the epoch's end): the loops have no counterpart of it, as
    # in bench_deep_linear and bench_ddp
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                         accelerator=accelerator, devices=1)
    device = GPU if accelerator == ACCELERATOR else None
    t = clock(device)
    trainer.fit(net, datamodule=dm)
    return E * steps / (clock(device) - t), net.W.detach().cpu()


def agreement(W_zoo: torch.Tensor, W_loop: torch.Tensor) -> tuple[float, bool]:
    """Largest difference relative to the weights' scale, and whether it is float32 rounding."""
    rel = float((W_zoo - W_loop).abs().max() / W_loop.abs().max())
    return rel, rel < 1e-3


PATHS = [  # (path, d, E, steps, goal against #21's loop: the tensor-op loop of one student)
    ("MultiHeadStudent, one student, d = 500", 500, 1, 20_000, 2.0),
    ("MultiHeadStudent, one student, d = 1000", 1000, 1, 20_000, 2.0),
    ("MultiHeadStudent, E = 1024, d = 1000", 1000, 1024, 2_000, 2.0),
    ("MultiHeadStudent, one student, d = 10,000", 10_000, 1, 10_000, 1.0),
]
#: a single student against the strongest (scalar) loop
PARITY = 1.0


def main() -> None:
    args = harness.arguments(__doc__, extra=lambda p: p.add_argument(
        "--single", action="store_true", help="only the single-student rows (E = 1)"))
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    zoo_fit(1000, 1, 2000)  # warm-up: first-call costs (imports, allocator) out of the timings
    rows, gpu = [], []
    threaded = torch.get_num_threads() > 1
    for path, d, E, steps, goal in PATHS:
        if (threaded or args.single) and E > 1:
            continue
        final = {}

        def side(name, fn):
            def run() -> float:
                rate, final[name] = fn(d, E, steps)
                return rate
            return run

        start = time.perf_counter()
        sides = {"zoo": side("zoo", zoo_fit), "loop": side("loop", scalar_loop if E == 1 else manual_loop)}
        if E == 1:
            sides["tensor loop"] = side("tensor loop", manual_loop)
        rates = harness.interleaved(sides, args.rounds)
        for name in list(sides)[1:]:
            rel, ok = agreement(final["zoo"], final[name])
            print(f"{path}: final W, zoo vs {name}: max |dW| / max |W| = {rel:.1e} ({'float32 rounding' if ok else 'DIFFERENT'})",
                  flush=True)
            if not ok:
                raise SystemExit(f"{path}: the zoo and the {name} end at different weights")
        if E == 1:
            tensor_loop = harness.median(rates["tensor loop"])
            print(f"{path}: the tensor-op loop {tensor_loop:,.0f} student-steps/s: zoo {harness.median(rates['zoo']) / tensor_loop:.2f}x"
                  f" of it, the scalar loop {harness.median(rates['loop']) / tensor_loop:.2f}x", flush=True)
        print(f"{path}: [{time.perf_counter() - start:.0f} s]", flush=True)
        if E == 1:
            rows.append(harness.Row(f"{path}, vs the scalar loop", harness.median(rates["zoo"]),
                                    harness.median(rates["loop"]), "student-steps/s", PARITY))
            rows.append(harness.Row(f"{path}, vs #21's tensor-op loop", harness.median(rates["zoo"]),
                                    harness.median(rates["tensor loop"]), "student-steps/s", goal))
        else:
            rows.append(harness.Row(path, harness.median(rates["zoo"]), harness.median(rates["loop"]), "student-steps/s", goal))
        gpu.append((path, on_gpu(lambda: zoo_fit(d, E, steps, accelerator=ACCELERATOR)[0]),
                    on_gpu(lambda: manual_loop(d, E, steps, GPU)[0])))
    if threaded:
        path, d, E, steps, _ = PATHS[1]
        rates = harness.interleaved({"scoped": lambda: zoo_fit(d, E, steps)[0],
                                     "unscoped": lambda: zoo_fit(d, E, steps, scoped=False)[0]}, args.rounds)
        rows.append(harness.Row(f"{path}: 1-thread scope vs {torch.get_num_threads()} threads",
                                harness.median(rates["scoped"]), harness.median(rates["unscoped"]), "student-steps/s", 1.0))
    harness.report(rows)
    print(f"\n{'path':45s} {HEADING + ' zoo':>16s} {HEADING + ' loop':>16s}  (student-steps/s)")
    for path, zoo, loop in gpu:
        print(f"{path:45s} {cell(zoo, 16, ',.0f')} {cell(loop, 16, ',.0f')}")


if __name__ == "__main__":
    main()
