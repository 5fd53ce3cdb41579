"""Mode strengths of a linear network's map along the task's singular directions, with theory."""
from __future__ import annotations

import lightning.pytorch as pl
import torch

from callbacks.base import HistoryCallback, check_count, log_figure, log_scalars, member_charts


class SingularValues(HistoryCallback):
    """Logs ``a_i = u_i^T W v_i`` for the task's modes (``modes/<member>/a<i>``) every n steps.

    Where the module has a closed form (``predicted_mode_strengths``: task-aligned two-layer
    lambda-balanced nets, [L] Thm. 5.1, ``tau da/dt = sqrt(lam^2 + 4 a^2)(s - a)``) the theory
    is logged beside it (``modes/<member>/a<i>_theory``) and a TensorBoard custom-scalars chart
    per member overlays the two (the "CUSTOM SCALARS" tab). At the end of the fit it logs the
    figure ``zoo.plots.linear.loss_and_modes`` and writes it as ``singular_values.png``.

    Needs a module with ``mode_strengths(U, V)`` and a datamodule with ``modes()``.
    """

    HISTORY_KEYS = ("loss_steps", "losses", "steps", "strengths")

    def __init__(self, every_n_steps: int = 10, max_modes: int = 8, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        self.max_modes, self.figure = check_count("SingularValues", "max_modes", max_modes), figure

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "mode_strengths")
        dm = trainer.datamodule
        if dm is None or not callable(getattr(dm, "modes", None)):
            raise TypeError("SingularValues needs a datamodule with modes() (e.g. datamodules.SemanticHierarchy)")
        m = dm.modes()
        k = min(self.max_modes, len(m.s))
        self._modes = type(m)(m.U[:, :k], m.s[:k], m.V[:, :k], m.c)
        member_charts(trainer, "mode strengths (simulation vs theory)", pl_module.labels, "modes/{}/a\\d+(_theory)?$")

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        h, g = self.history, trainer.global_step
        if outputs is None and h["steps"] and h["steps"][-1] == g:
            return  # resumed at a logged step
        if isinstance(outputs, dict) and "member_loss" in outputs:
            self.append(loss_steps=int(outputs.get("loss_step", g - 1)),
                        losses=outputs["member_loss"].detach().cpu().double())
        m = self._modes
        a = pl_module.mode_strengths(m.U, m.V).cpu().double()
        pred = pl_module.predicted_mode_strengths(torch.tensor([g]), m)
        self.append(steps=g, strengths=a.clone())
        metrics = {}
        for e, lbl in enumerate(pl_module.labels):
            metrics.update({f"modes/{lbl}/a{i}": a[e, i] for i in range(a.shape[1])})
            if pred is not None:
                metrics.update({f"modes/{lbl}/a{i}_theory": pred[e, 0, i] for i in range(a.shape[1])})
        log_scalars(trainer, metrics)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.plots.linear import loss_and_modes

        h = self.history
        if not (self.figure and trainer.is_global_zero and h["steps"] and h["losses"]):
            return
        dense = torch.linspace(0, float(max(h["steps"])), 400)
        pred = pl_module.predicted_mode_strengths(dense, self._modes)
        fig = loss_and_modes(pl_module.labels, h["loss_steps"], torch.stack(h["losses"]).numpy(), h["steps"],
                             torch.stack(h["strengths"]).numpy(), None if pred is None else dense.numpy(),
                             None if pred is None else pred.transpose(0, 1).numpy(), targets=self._modes.s.numpy(),
                             title=f"{type(pl_module).__name__}: loss and mode strengths (dotted: task singular values)")
        log_figure(trainer, "singular_values", fig, png="singular_values.png")
