"""How far the neural tangent kernel moves: lazy networks keep it, rich ones change it ([L] Fig. 5)."""
from __future__ import annotations

import re
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor

from callbacks.base import PeriodicCallback, output_path, overlay_charts
from callbacks.figures import curves_figure


class NTKDistance(PeriodicCallback):
    """Logs the kernel distance ``1 - <K0, Kt>_F / (|K0|_F |Kt|_F)`` (Fort et al. 2020) of the
    empirical NTK on a fixed probe batch, per member: ``ntk/distance/<member>``.

    For two-layer lambda-balanced networks the closed form ([L] Thm. 4.3 + Braun et al. 2022)
    gives the NTK at every time: ``ntk/distance_theory/<member>`` beside it (CUSTOM SCALARS
    overlays the two). The NTK at initialisation is kept in the callback's state, so a
    resumed run continues the same curve. Writes ``ntk_distance.png`` at the end.

    Args:
        every_n_steps: period in optimizer steps.
        probe_size: the probe batch is the datamodule's ``X`` if it has at most this many rows,
            else a seeded random subset of this size.
        seed: seed of that subset.
    """

    def __init__(self, every_n_steps: int = 10, probe_size: int = 32, seed: int = 0, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        if probe_size < 1:
            raise ValueError(f"NTKDistance: probe_size = {probe_size}; allowed: a positive integer")
        self.probe_size, self.seed, self.figure = probe_size, seed, figure
        self.K0: Tensor | None = None
        self.history: dict[str, list] = {"steps": [], "distance": [], "theory": []}
        self._probe: Tensor | None = None
        self._task = None

    def state_dict(self) -> dict[str, Any]:
        return {"K0": self.K0, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.K0, self.history = state_dict["K0"], state_dict["history"]

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "ntk")
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "X"):
            raise TypeError("NTKDistance needs a datamodule with an input tensor X (e.g. datamodules.SemanticHierarchy)")
        X = dm.X
        if X.shape[0] > self.probe_size:
            idx = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(self.seed))[: self.probe_size]
            X = X[idx]
        self._probe = X
        m = dm.modes() if callable(getattr(dm, "modes", None)) else None
        self._task = (dm.sigma_yx, m.c) if m is not None else None
        overlay_charts(trainer, "NTK kernel distance (simulation vs theory)",
                       {lbl: f"ntk/distance(_theory)?/{re.escape(lbl)}$" for lbl in pl_module.labels})

    def _theory_kernels(self, pl_module, steps: Tensor) -> Tensor | None:
        predict = getattr(pl_module, "predicted_qqt", None)
        if self._task is None or predict is None:
            return None
        Q = predict(steps, *self._task)
        if Q is None:
            return None
        from zoo.theory.linear import linear_ntk_from_qqt

        return linear_ntk_from_qqt(Q, self._probe.double(), self._probe.shape[1])  # (E, T, n, n)

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.K0 is None:  # a resumed run keeps the kernel at initialisation from its state
            self.K0 = pl_module.ntk(self._probe).detach().cpu().double()

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        from zoo.metrics.ntk import kernel_distance

        g = trainer.global_step
        if self.history["steps"] and self.history["steps"][-1] == g:  # resumed at a logged step
            return
        Kt = pl_module.ntk(self._probe).detach().cpu().double()
        dist = kernel_distance(self.K0, Kt)
        theory = self._theory_kernels(pl_module, torch.tensor([float(g)]))
        metrics = {f"ntk/distance/{lbl}": dist[e] for e, lbl in enumerate(pl_module.labels)}
        th = None
        if theory is not None:
            K0_theory = self._theory_kernels(pl_module, torch.tensor([0.0]))[:, 0]
            th = kernel_distance(K0_theory, theory[:, 0])
            metrics.update({f"ntk/distance_theory/{lbl}": th[e] for e, lbl in enumerate(pl_module.labels)})
        self.history["steps"].append(g)
        # tensors, not numpy arrays: callback state must load from checkpoints with weights_only
        self.history["distance"].append(dist.clone())
        self.history["theory"].append(None if th is None else th.clone())
        self.log_scalars(trainer, metrics, step=g)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        h = self.history
        if not (self.figure and trainer.is_global_zero and h["steps"]):
            return
        theory = None if any(t is None for t in h["theory"]) else torch.stack(h["theory"]).numpy()
        curves_figure(output_path(trainer, "ntk_distance.png"), pl_module.labels, np.asarray(h["steps"]),
                      torch.stack(h["distance"]).numpy(), theory, ylabel="kernel distance S(t)",
                      title="NTK movement: 0 = lazy (kernel fixed), larger = rich")
