"""Sparsity of a sparse autoencoder's hidden activity ([S] App. H, Eqs. 30-31, Fig. 13).

Every ``every_n_steps``, ``SparseAutoencoder.measure`` of every member on a fixed evaluation set
(``window`` samples of the datamodule's ``samples(n)``; null: all, [S] Eq. 31's 60,000 points),
logged as ``sparsity/<measure>/<label>`` (``zoo.models.sae.MEASURES``: eq31, l0, dead_fraction,
dense_fraction, mse, explained_variance) with a histogram ``sparsity/density/<label>``; at the end
[S] Fig. 13 (``zoo.plots.sparsity``), also written as ``sparsity_vs_v.png``. ``threshold > 0``
asks which units respond *appreciably* (tiny encoder weights can fire on half the data while
contributing nothing to the reconstruction); [S] Eq. 30 is 0.
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks.base import PeriodicCallback, all_members, check, log_figure, log_scalars
from zoo.plots.sparsity import sparsity_figure
from zoo.models.sae import MEASURES


class Sparsity(PeriodicCallback):
    """[S] Eq. 31 and the usual SAE measures per member, over ``window`` samples (see the module docstring).

    Args:
        every_n_steps: measure every this many optimizer steps (and at the start and the end).
        window: samples in the fixed evaluation set (drawn once from the datamodule's
            ``samples(n)``); null: all of the datamodule's data.
        threshold: a unit is active where ``H > threshold``; 0 is [S] Eq. 30.
        dense_threshold: a unit is dense when active on more than this fraction of the window.
        histograms: log the density histogram of every member.
        figure: [S] Fig. 13 at the end (when the members differ in ``v``).
    """

    def __init__(self, every_n_steps: int = 500, window: int | None = 10000, threshold: float = 0.0,
                 dense_threshold: float = 0.5, histograms: bool = True, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        name = type(self).__name__
        check(name, "window", window, window is None or (isinstance(window, int) and not isinstance(window, bool)
              and window >= 1), "a positive number of samples, or null for all")
        check(name, "threshold", threshold, math.isfinite(threshold) and threshold >= 0, "a number >= 0 (0 is [S] Eq. 30)")
        check(name, "dense_threshold", dense_threshold, 0.0 <= dense_threshold < 1.0, "0 <= threshold < 1")
        self.window, self.threshold, self.dense_threshold = window, float(threshold), float(dense_threshold)
        self.histograms, self.figure = histograms, figure
        self._x: torch.Tensor | None = None
        self.last: dict[str, torch.Tensor] = {}
        self._measured_at: int | None = None

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "measure")
        if not callable(getattr(trainer.datamodule, "samples", None)):
            raise TypeError(f"{type(self).__name__} needs a datamodule with samples(n) -> (N, d) tensor "
                            "(e.g. datamodules.latents.Latents)")
        self._x = trainer.datamodule.samples(self.window)

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        self._measured_at = trainer.global_step  # on every rank: on_train_end's decision must be the same on all
        if not trainer.is_global_zero:  # every rank holds every member here; rank 0 measures and logs
            return
        if self._x.device != pl_module.device:  # moved once, not at every measurement
            self._x = self._x.to(pl_module.device)
        out = pl_module.measure(self._x, self.threshold, self.dense_threshold)
        self.last = {k: v.cpu() for k, v in out.items()}
        # a member dropped after diverging (on_divergence='drop') has no measure
        alive = pl_module.alive.cpu()
        for k in MEASURES:
            self.last[k] = torch.where(alive, self.last[k].double(), torch.nan)
        members = [(e, lbl) for e, lbl in enumerate(pl_module.labels) if bool(alive[e])]
        log_scalars(trainer, {f"sparsity/{k}/{lbl}": float(self.last[k][e]) for k in MEASURES for e, lbl in members})
        for lg in trainer.loggers if self.histograms else []:  # rank 0 only, as above
            for e, lbl in members if isinstance(lg, TensorBoardLogger) else []:
                lg.experiment.add_histogram(f"sparsity/density/{lbl}", self.last["density"][e], global_step=trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._x is None:
            return
        if self._measured_at != trainer.global_step:  # the last step was not a multiple of every_n_steps
            with all_members(pl_module):  # a collective when member-parallel: on every rank
                self.on_due(trainer, pl_module, None)
        params = pl_module.member_params
        if self.figure and trainer.is_global_zero and "v" in params[0]:
            fig = sparsity_figure([p["v"] for p in params], [p["l1"] for p in params],
                                  {k: self.last[k].numpy() for k in ("eq31", "l0")}, self._x.shape[0], self.threshold)
            log_figure(trainer, "sparsity_vs_v", fig, png="sparsity_vs_v.png")


__all__ = ["Sparsity"]
