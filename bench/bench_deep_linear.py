"""DeepLinearNet throughput: the Lightning path against a plain loop of its own closed-form update.

    python bench/bench_deep_linear.py [--threads 1] [--rounds 5]

Full-batch gradient descent of lambda ensembles of 8-8-8 networks on the semantic hierarchy. The
baseline is the strongest hand-written loop of the same arithmetic: the closed-form gradients
([L] Eq. 2) written out for two layers, on plain tensors, into tensors allocated once, and the SGD
update in place; no loss, no logging, no checks. The zoo is a ``Trainer.fit`` of ``DeepLinearNet`` (timed from the start of
training to its end: every batch's Lightning loop, hooks, logging, the loss of its first (and
last) step and the finiteness check on it; no progress bar, whose live loss costs a ``self.log``
a batch, and no validation, which the plain loop has no counterpart of). Both sides end on the
same weights, checked bit for bit here.

Two regimes: 100 steps per batch (E = 100, the recipes' many-step setting: the batch's steps run
as one loop with ``zoo.kernels.gdln.GradientDescent``'s update written in, counted by Lightning
through ``zoo.training.steps``; what remains beside the arithmetic is Lightning's loop between batches and
the module's per-batch loss, check and bookkeeping), and one step per batch with E = 4096 members (every
batch pays Lightning's per-batch loop and the zoo's loss of every member, needed for the
divergence check and the callbacks: at this size a step takes about 4-5 ms on an idle core, the
loss ~0.06 ms (one sum over each member's 64 squares; 0.2 ms as a sum per sample then a mean) and Lightning's loop ~0.15-0.3 ms; with fewer members a step costs less and raising
``steps_per_batch`` is the setting that amortises that work).

At one step per batch the bench also times Lightning's floor: a ``LightningModule`` whose
``training_step`` is the plain loop's own step, ``plain_step`` (no loss, no check, no logging, no
counting), run by the same ``Trainer`` settings on the lightest loader there is (the full batch repeated by a
plain iterable, ``RepeatedBatch``, passed to ``fit`` without a datamodule and its per-batch hooks),
interleaved with the other two and checked to the same bits. No module under Lightning's batch
loop can beat it, so its ratio bounds what the zoo's row can reach.
"""
from __future__ import annotations

import logging
import warnings

import lightning.pytorch as pl
import torch

import harness
from datamodules import SemanticHierarchy
from datamodules.regression import RepeatedBatch
from gpu_column import ACCELERATOR, GPU, HEADING, cell, clock, on_gpu
from zoo import DeepLinearNet
from zoo.init import LambdaBalanced

LR = 0.05
#: (label, members, steps per batch, steps timed)
CASES = [("E = 100, 100 steps/batch", 100, 100, 2000), ("E = 4096, 1 step/batch", 4096, 1, 60)]


def network(E: int, steps_per_batch: int) -> DeepLinearNet:
    return DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=torch.linspace(-4, 4, E).tolist(), scale=1e-3),
                         lr=LR, steps_per_batch=steps_per_batch)


def plain_loop(E: int, steps: int, device: torch.device | None = None) -> tuple[float, list[torch.Tensor]]:
    """Steps/s of closed-form GD by hand, and the final weights. Every intermediate is written into a
    tensor allocated once (``out=``; in place): with many members a fresh megabyte-sized tensor per
    operation costs page faults at every step (~10-20% at E = 4096), and the same kernels give the
    same bits."""
    dm = SemanticHierarchy()
    W1, W2 = (W.detach().clone().to(device) for W in network(E, 1).W)
    X, Y = dm.X.to(device), dm.Y.to(device)
    x = X.expand(E, *X.shape)
    M, D, G, g1, g2 = (torch.empty_like(W1) for _ in range(5))  # 8-8-8 on 8 samples: every one (E, 8, 8)
    with torch.no_grad():
        t = clock(device)
        for _ in range(steps):
            plain_step(W1, W2, x, Y, M, D, G, g1, g2)
        return steps / (clock(device) - t), [W1, W2]


def plain_step(W1, W2, x, Y, M, D, G, g1, g2) -> None:
    """One GD step of the plain loop, in place: the closed-form gradients into ``M, D, G, g1, g2``
    (each (E, 8, 8)), then torch.optim.SGD's update."""
    torch.matmul(W2, W1, out=M)  # the map W2 W1
    torch.matmul(x, M.mT, out=D).sub_(Y)  # its residual
    torch.matmul(D.mT, x, out=G).div_(D.shape[-2])  # dL/dM
    torch.matmul(G, W1.mT, out=g2)
    torch.matmul(W2.mT, G, out=g1)
    W2.add_(g2, alpha=-LR)
    W1.add_(g1, alpha=-LR)


class BareStep(pl.LightningModule):
    """Lightning's floor: the plain loop's step (its very operations) as a ``training_step``, and
    nothing else; manual optimisation, so Lightning counts no optimizer step (the fit is bounded by
    ``limit_train_batches``)."""

    def __init__(self, E: int) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.W = torch.nn.ParameterList(W.detach().clone() for W in network(E, 1).W)
        self.buffers_ = [torch.empty_like(self.W[0]) for _ in range(5)]

    def configure_optimizers(self) -> None:
        return None

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        X, Y = batch
        W1, W2 = (W.detach() for W in self.W)
        with torch.no_grad():
            plain_step(W1, W2, X.expand(W1.shape[0], *X.shape), Y, *self.buffers_)


class Stopwatch(pl.Callback):
    """Seconds from the start of training to its end (the Trainer's own setup left out)."""

    def __init__(self, device: torch.device | None) -> None:
        self.device, self.seconds = device, 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self.t0 = clock(self.device)

    def on_train_end(self, trainer, pl_module) -> None:
        self.seconds = clock(self.device) - self.t0


def zoo_path(E: int, steps_per_batch: int, steps: int, accelerator: str = "cpu") -> tuple[float, list[torch.Tensor]]:
    """Steps/s of ``DeepLinearNet`` under ``Trainer.fit``, and the final weights."""
    dm = SemanticHierarchy(batches_per_epoch=max(1, 1000 // steps_per_batch))
    net = network(E, steps_per_batch)
    watch = Stopwatch(GPU if accelerator == ACCELERATOR else None)
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, accelerator=accelerator, devices=1,
                         callbacks=[watch])
    trainer.fit(net, datamodule=dm)
    return steps / watch.seconds, [W.detach() for W in net.W]


def floor_path(E: int, steps: int) -> tuple[float, list[torch.Tensor]]:
    """Steps/s of :class:`BareStep` under ``Trainer.fit`` (one step a batch), and the final weights."""
    net, watch = BareStep(E), Stopwatch(None)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         accelerator="cpu", devices=1, callbacks=[watch])
    dm = SemanticHierarchy()
    trainer.fit(net, train_dataloaders=RepeatedBatch(dm.X, dm.Y, steps))
    return steps / watch.seconds, [W.detach() for W in net.W]


def main() -> None:
    args = harness.arguments(__doc__)
    warnings.filterwarnings("ignore")  # Lightning's advice on small data sets would hide the table
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    rows, gpu = [], []
    for label, E, k, steps in CASES:
        finals: dict[str, list[torch.Tensor]] = {}

        def timed(name, fn, *a):
            def run() -> float:
                rate, finals[name] = fn(*a)
                return rate
            return run
        sides = {"zoo": timed("zoo", zoo_path, E, k, steps), "loop": timed("loop", plain_loop, E, steps)}
        if k == 1:
            sides["floor"] = timed("floor", floor_path, E, steps)
        rates = harness.interleaved(sides, args.rounds)
        for side in set(sides) - {"loop"}:
            same = all(torch.equal(a, b) for a, b in zip(finals[side], finals["loop"]))
            print(f"{label}: final weights of the {side} and the plain loop bit-identical: {same}")
            if not same:
                raise SystemExit(f"{label}: the {side} and the plain loop disagree; the comparison is void")
        if k == 1:
            floor, loop = harness.median(rates["floor"]), harness.median(rates["loop"])
            print(f"{label}: Lightning's floor (the plain loop's step as a bare training_step) {floor:,.0f} steps/s, "
                  f"{floor / loop:.2f}x the plain loop: the most a module under Lightning's batch loop can reach")
        rows.append(harness.Row(f"DeepLinearNet 8-8-8, {label}", zoo=harness.median(rates["zoo"]),
                                baseline=harness.median(rates["loop"]), unit="steps/s", goal=0.9))
        gpu.append((label, on_gpu(lambda: zoo_path(E, k, steps, ACCELERATOR)[0]),
                    on_gpu(lambda: plain_loop(E, steps, GPU)[0])))
    print()
    harness.report(rows)
    print(f"\n{HEADING} (one run each, steps/s):")
    for label, z, b in gpu:
        print(f"  {label:28s} zoo {cell(z, 10, '.0f')}   plain loop {cell(b, 10, '.0f')}")


if __name__ == "__main__":
    main()
