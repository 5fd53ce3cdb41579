"""[H] Fig. 6b: many runs of the two-hidden-layer ReLU net and of its ReLN (``zoo.gdln_depth.DepthGDLN``),
every run's loss faded and each network's "stereotypical" run bold.

With depth the runs no longer agree ([H] Sec. 6: the contextual pathways align with the data's
singular vectors at run-dependent times), so the mean curve is not a trajectory any run follows;
[H] shows instead the run closest to the mean. ``stereotypical_member`` picks it; the
``StereotypicalLoss`` callback collects the losses and draws the figure.
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor

from callbacks.base import PeriodicCallback, output_path, log_scalars
from callbacks.figures import _plt
from callbacks.gdln import EpochLosses, _models
from zoo.theory.gdln import times_to_fraction

MAX_POINTS = 2000  # per drawn curve: the figure needs no more, 100 runs x 20,000 epochs would be slow


def stereotypical_member(losses: Tensor) -> int:
    """The run whose loss curve is closest to the mean curve ([H] Fig. 6 caption: "the sum of L2
    distances across all timepoints"): ``argmin_e sum_t |L[t, e] - mean_e' L[t, e']|`` for a (T, E)
    array of losses (at one time point the L2 distance of two losses is their absolute difference)."""
    if losses.dim() != 2 or losses.shape[0] < 1 or losses.shape[1] < 1:
        raise ValueError(f"stereotypical_member: losses of shape {tuple(losses.shape)}; allowed: (T, E), T, E >= 1")
    L = losses.double()
    return int((L - L.mean(1, keepdim=True)).abs().sum(0).argmin())


def first_layer_on(net, X: Tensor) -> tuple[float, float]:
    """How linear a two-hidden-layer ReLU net's first layer is ([H] Sec. 6: "all neurons are active
    for all datapoints"): the fraction of first-layer units on per data point, weighting each unit
    by its path strength ``|W0_j| |W1_{:, j}|`` (units still at their small random init do not
    compute anything and are half on by chance). Returns (mean, min) over data points and members."""
    on = net.activation_patterns(X.to(net.W[0].dtype))[0].double()  # (E, N, H)
    W0, W1 = net.W[0].detach().double(), net.W[1].detach().double()
    weight = W0.norm(dim=-1) * W1.norm(dim=-2)  # (E, H)
    frac = (on * weight[:, None, :]).sum(-1) / weight.sum(-1, keepdim=True)  # (E, N)
    return float(frac.mean()), float(frac.min())


class StereotypicalLoss(EpochLosses):
    """[H] Fig. 6b: every run's loss curve faded, each network's stereotypical run bold.

    Reads ``epoch_loss`` from the outputs of a ``zoo.gdln`` module or ``Comparison`` (one curve per
    ensemble member = run). At the end: PNG ``stereotypical_loss.png`` in the log folder, the same
    image in TensorBoard (``stereotypical_loss``), and scalars ``stereotypical/<model>/member``,
    ``stereotypical/<model>/epochs_to/<f>`` (the stereotypical run's epochs to fraction f of its
    initial loss) and ``.../epochs_to/<f>/min``, ``.../max`` (the spread over runs). For a ReLU net
    with two hidden layers also ``stereotypical/<model>/first_layer_on`` and ``..._min``
    (``first_layer_on``: 1 when its first layer is linear on the data, as [H] Sec. 6 reports).

    Args:
        fractions: fractions of the initial loss whose epochs-to-reach are reported.
        log_y: a second panel with a logarithmic loss axis.
    """

    def __init__(self, fractions: list[float] = [0.5, 0.1, 0.01], log_y: bool = True) -> None:
        if not fractions or any(not 0 < f < 1 for f in fractions):
            raise ValueError(f"StereotypicalLoss: fractions = {fractions}; allowed: numbers in (0, 1)")
        super().__init__()
        self.fractions, self.log_y = list(fractions), log_y
        self.summary: dict[str, dict] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.summary = {}

    def _summarise(self, L: Tensor, net, X: Tensor) -> dict:
        e = stereotypical_member(L)
        times = times_to_fraction(torch.arange(L.shape[0], dtype=torch.float64), L, tuple(self.fractions))  # (F, E)
        out = {"member": e, "epochs_to": times[:, e], "min": times.min(1).values, "max": times.max(1).values}
        if getattr(net, "hidden", None) is not None and len(net.hidden) == 2:
            out["first_layer_on"] = first_layer_on(net, X.to(net.W[0].device))
        return out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or not self.recorded():
            return
        nets, X = _models(pl_module), trainer.datamodule.X
        metrics = {}
        for name in self.recorded():
            s = self.summary[name] = self._summarise(self.curve(name)[1], nets[name], X)
            metrics[f"stereotypical/{name}/member"] = s["member"]
            for i, f in enumerate(self.fractions):
                for key, tag in (("epochs_to", ""), ("min", "/min"), ("max", "/max")):
                    if math.isfinite(float(s[key][i])):
                        metrics[f"stereotypical/{name}/epochs_to/{f:g}{tag}"] = float(s[key][i])
            if "first_layer_on" in s:
                metrics[f"stereotypical/{name}/first_layer_on"], metrics[f"stereotypical/{name}/first_layer_on_min"] = \
                    s["first_layer_on"]
        log_scalars(trainer, metrics)
        img = self._figure(trainer)
        for lg in trainer.loggers:
            if isinstance(lg, TensorBoardLogger):
                lg.experiment.add_image("stereotypical_loss", img, trainer.global_step, dataformats="HWC")

    def _figure(self, trainer: pl.Trainer) -> np.ndarray:
        plt = _plt()
        scales = ["linear", "log"] if self.log_y else ["linear"]
        fig, axes = plt.subplots(1, len(scales), figsize=(6 * len(scales), 4.5), dpi=100, squeeze=False)
        colours = plt.cm.tab10(np.arange(10))
        lines = []
        for i, (name, s) in enumerate(self.summary.items()):
            L = self.curve(name)[1].numpy()
            t = np.arange(L.shape[0])
            every = max(1, L.shape[0] // MAX_POINTS)
            c = colours[i % 10]
            for ax in axes[0]:
                ax.plot(t[::every], L[::every], color=c, lw=0.6, alpha=0.15)
                ax.plot(t, L[:, s["member"]], color=c, lw=2.0, label=f"{name}: run {s['member']} of {L.shape[1]}")
            lines.append(f"{name}: " + ", ".join(f"{v:.0f} [{lo:.0f}-{hi:.0f}]" for v, lo, hi in
                                                 zip(s["epochs_to"].tolist(), s["min"].tolist(), s["max"].tolist())))
        for ax, scale in zip(axes[0], scales):
            ax.set_yscale(scale)
            ax.set_xlabel("epoch")
            ax.set_ylabel("loss")
        axes[0, 0].legend(fontsize=8)
        fig.suptitle("bold: the run closest to the mean curve; faded: all runs. Epochs to "
                     + "/".join(f"{f:g}" for f in self.fractions) + " of the initial loss, bold run [range over runs]\n"
                     + "; ".join(lines), fontsize=8)
        fig.tight_layout()
        fig.savefig(output_path(trainer, "stereotypical_loss.png"))
        fig.canvas.draw()
        img = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
        plt.close(fig)
        return img
