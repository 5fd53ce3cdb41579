"""Sparsity of a sparse autoencoder's hidden activity ([S] App. H, Eqs. 30-31, Fig. 13).

:class:`Sparsity` measures, every ``every_n_steps``, the hidden activity of every ensemble member
of a :class:`zoo.sae.SparseAutoencoder` on a fixed evaluation set of ``window`` samples from the
datamodule (its ``samples(n)``; ``window: null`` is the whole data set, [S] Eq. 31's 60,000
points). The set is encoded in chunks and only firing counts are kept, so the measures come from
:func:`zoo.metrics.sparsity.from_counts`; they are those of :func:`zoo.metrics.sparsity.sparsity`
on the full activity matrix (tested). Logged per member (tags end in ``/<label>``, e.g.
``sparsity/eq31/v=4,l1=0``): ``eq31`` (mean over units of the points that activate them),
``l0``, ``dead_fraction``, ``dense_fraction`` and ``explained_variance``; and a TensorBoard
histogram of the units' densities (``sparsity/density/<label>``). At the end of training it
writes ``sparsity_vs_v.png`` (a fresh name if taken): eq31 and L0 against ``v``, one curve per
``l1`` (the SAE with ``l1 > 0`` beside the iSAE with ``l1 = 0``), which is [S] Fig. 13.

``threshold``: a unit counts as active where ``H > threshold`` ([S] Eq. 30 is ``threshold = 0``).
A positive threshold asks how many units respond *appreciably*: with tiny encoder weights a unit
can be on for half of the data while contributing nothing to the reconstruction.
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor

from callbacks.base import PeriodicCallback, output_path
from callbacks.figures import save_figure
from zoo.metrics.sparsity import from_counts

SCALARS = ("eq31", "l0", "dead_fraction", "dense_fraction", "explained_variance")
CHUNK = 1024
"""Samples per forward pass of the evaluation (bounds memory at E x CHUNK x n; results do not depend on it)."""


@torch.no_grad()
def firing_counts(pl_module: pl.LightningModule, x: Tensor, threshold: float = 0.0,
                  chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """Per member, how many rows of ``x`` (N, d) activate each unit (``H > threshold``, [S] Eq. 30),
    (E, n); and the explained variance of the reconstructions (E,) (as in ``zoo.metrics.sparsity``)."""
    x = x.to(pl_module.W_enc.device, pl_module.W_enc.dtype)
    counts = torch.zeros(pl_module.ensemble, pl_module.n, dtype=torch.long, device=x.device)
    err = torch.zeros(pl_module.ensemble, dtype=torch.float64, device=x.device)
    for i in range(0, x.shape[0], chunk):
        xb = x[i:i + chunk]
        h = pl_module.hidden(xb)
        counts += (h > threshold).sum(1)
        err += (pl_module.decode(h) - xb).double().pow(2).sum((1, 2))
    total = (x.double() - x.double().mean(0)).pow(2).sum()
    ev = 1 - err / total if total > 0 else torch.full_like(err, math.nan)
    return counts, ev


class Sparsity(PeriodicCallback):
    """[S] Eq. 31 and the usual SAE measures per member, over ``window`` samples (see the module docstring).

    Args:
        every_n_steps: measure every this many optimizer steps (and at the start and the end).
        window: samples in the fixed evaluation set (drawn once from the datamodule's
            ``samples(n)``); null: all of the datamodule's data.
        threshold: a unit is active where ``H > threshold``; 0 is [S] Eq. 30.
        dense_threshold: a unit is dense when active on more than this fraction of the window.
        histograms: log the density histogram of every member.
        figure: write ``sparsity_vs_v.png`` at the end.
    """

    def __init__(
        self,
        every_n_steps: int = 500,
        window: int | None = 10000,
        threshold: float = 0.0,
        dense_threshold: float = 0.5,
        histograms: bool = True,
        figure: bool = True,
    ) -> None:
        super().__init__(every_n_steps)
        name = type(self).__name__
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"{name}: window = {window!r}; allowed: a positive number of samples, or null for all")
        if not (math.isfinite(threshold) and threshold >= 0):
            raise ValueError(f"{name}: threshold = {threshold!r}; allowed: a number >= 0 (0 is [S] Eq. 30)")
        if not 0.0 <= dense_threshold < 1.0:
            raise ValueError(f"{name}: dense_threshold = {dense_threshold!r}; allowed: 0 <= threshold < 1")
        self.window, self.threshold, self.dense_threshold = window, float(threshold), float(dense_threshold)
        self.histograms, self.figure = histograms, figure
        self._x: Tensor | None = None
        self.last: dict[str, Tensor] = {}
        self._measured_at: int | None = None

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "hidden", "decode")
        dm = trainer.datamodule
        if dm is None or not callable(getattr(dm, "samples", None)):
            raise TypeError(f"{type(self).__name__} needs a datamodule with samples(n) -> (N, d) tensor "
                            "(e.g. datamodules.latents.Latents)")
        self._x = dm.samples(self.window)

    def measure(self, pl_module: pl.LightningModule) -> dict[str, Tensor]:
        """The measures of every member on the evaluation set: tensors (E,), ``density`` (E, n)."""
        counts, ev = firing_counts(pl_module, self._x, self.threshold)
        out = from_counts(counts.cpu(), self._x.shape[0], self.dense_threshold)
        out["explained_variance"] = ev.cpu()
        return out

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        self.last, self._measured_at = self.measure(pl_module), trainer.global_step
        alive = getattr(pl_module, "alive", torch.ones(pl_module.ensemble, dtype=torch.bool)).cpu()
        for k in SCALARS:  # a member dropped after diverging (SparseAutoencoder on_divergence='drop') has no measure
            self.last[k] = torch.where(alive, self.last[k].double(), torch.nan)
        members = [(e, lbl) for e, lbl in enumerate(pl_module.labels) if bool(alive[e])]
        self.log_scalars(trainer, {f"sparsity/{k}/{lbl}": float(self.last[k][e]) for k in SCALARS for e, lbl in members})
        if self.histograms and trainer.is_global_zero:
            for lg in trainer.loggers:
                if isinstance(lg, TensorBoardLogger):
                    for e, lbl in members:
                        lg.experiment.add_histogram(f"sparsity/density/{lbl}", self.last["density"][e],
                                                    global_step=trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._x is None:
            return
        if self._measured_at != trainer.global_step:  # the last step was not a multiple of every_n_steps
            self.on_due(trainer, pl_module, None)
        if self.figure and trainer.is_global_zero and "v" in pl_module.scheme.params:
            v = pl_module.scheme.per_member("v", pl_module.ensemble).numpy()
            sparsity_figure(output_path(trainer, "sparsity_vs_v.png"), v, pl_module.l1.cpu().numpy(),
                            {k: self.last[k].numpy() for k in ("eq31", "l0")}, self._x.shape[0], self.threshold)


def sparsity_figure(path, v: np.ndarray, l1: np.ndarray, measures: dict[str, np.ndarray], N: int,
                    threshold: float = 0.0):
    """[S] Fig. 13: each measure against the imbalance ``v`` (log axis), one curve per ``l1``."""
    from callbacks.figures import _plt

    plt = _plt()
    fig, axes = plt.subplots(1, len(measures), figsize=(4.2 * len(measures), 3.4), dpi=100)
    axes = np.atleast_1d(axes)
    titles = {"eq31": f"Eq. 31: mean points per unit (of {N})", "l0": "L0: mean active units per point"}
    for ax, (key, values) in zip(axes, measures.items()):
        for a in sorted(set(l1.tolist())):
            sel = l1 == a
            order = np.argsort(v[sel])
            ax.plot(v[sel][order], values[sel][order], "o-", label=f"{'iSAE' if a == 0 else 'SAE'} (l1={a:g})")
        ax.set_xscale("log")
        ax.set_xlabel("imbalance v")
        ax.set_title(titles.get(key, key) + (f", H > {threshold:g}" if threshold else ""), fontsize=9)
        ax.legend(fontsize=8)
    save_figure(fig, path)
    return path


__all__ = ["Sparsity", "firing_counts", "sparsity_figure"]
