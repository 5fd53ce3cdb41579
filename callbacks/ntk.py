"""How far the neural tangent kernel moves: lazy networks keep it, rich ones change it ([L] Fig. 5)."""
from __future__ import annotations

import lightning.pytorch as pl
import torch

from callbacks.base import HistoryCallback, check_count, log_figure, log_scalars, member_charts


class NTKDistance(HistoryCallback):
    """Logs the kernel distance ``1 - <K0, Kt>_F / (|K0|_F |Kt|_F)`` (Fort et al. 2020) of the
    empirical NTK on a fixed probe batch, per member: ``ntk/distance/<member>``.

    Where the module predicts the NTK (``predicted_ntk``: two-layer lambda-balanced networks,
    [L] Thm. 4.3 + Braun et al. 2022) ``ntk/distance_theory/<member>`` is logged beside it (CUSTOM
    SCALARS overlays the two). Logs ``zoo.plots.linear.curves_with_theory`` at the
    end and writes it as ``ntk_distance.png``.

    Args:
        every_n_steps: period in optimizer steps.
        probe_size: the probe batch is the datamodule's ``X`` if it has at most this many rows,
            else a seeded random subset of this size.
        seed: seed of that subset.
    """

    HISTORY_KEYS = ("steps", "distance", "theory", "K0")  # K0: the NTK at initialisation, kept on resume

    def __init__(self, every_n_steps: int = 10, probe_size: int = 32, seed: int = 0, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        self.probe_size = check_count("NTKDistance", "probe_size", probe_size)
        self.seed, self.figure = seed, figure

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "ntk")
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "X"):
            raise TypeError("NTKDistance needs a datamodule with an input tensor X (e.g. datamodules.SemanticHierarchy)")
        X = dm.X
        if X.shape[0] > self.probe_size:
            X = X[torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(self.seed))[: self.probe_size]]
        self._probe = X
        self._task = (dm.sigma_yx, dm.modes().c) if callable(getattr(dm, "modes", None)) else None
        member_charts(trainer, "NTK kernel distance (simulation vs theory)", pl_module.labels, "ntk/distance(_theory)?/{}$")

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.history["K0"]:  # a resumed run has it from the checkpoint
            self.history["K0"].append(pl_module.ntk(self._probe).detach().cpu().double())

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        from zoo.metrics.ntk import kernel_distance

        g, h = trainer.global_step, self.history
        if h["steps"] and h["steps"][-1] == g:  # resumed at a logged step
            return
        dist = kernel_distance(h["K0"][0], pl_module.ntk(self._probe).detach().cpu().double())
        metrics = {f"ntk/distance/{lbl}": dist[e] for e, lbl in enumerate(pl_module.labels)}
        predict = getattr(pl_module, "predicted_ntk", None)
        K = None if self._task is None or predict is None else predict(torch.tensor([0.0, g]), self._probe, *self._task)
        th = None if K is None else kernel_distance(K[:, 0], K[:, 1])
        if th is not None:
            metrics.update({f"ntk/distance_theory/{lbl}": th[e] for e, lbl in enumerate(pl_module.labels)})
        self.append(steps=g, distance=dist.clone(), theory=th)
        log_scalars(trainer, metrics)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.plots.linear import curves_with_theory

        h = self.history
        if not (self.figure and trainer.is_global_zero and h["steps"]):
            return
        theory = None if any(t is None for t in h["theory"]) else torch.stack(h["theory"]).numpy()
        fig = curves_with_theory(pl_module.labels, h["steps"], torch.stack(h["distance"]).numpy(), theory,
                                 ylabel="kernel distance S(t)", title="NTK movement: 0 = lazy (kernel fixed), larger = rich")
        log_figure(trainer, "ntk_distance", fig, png="ntk_distance.png")
