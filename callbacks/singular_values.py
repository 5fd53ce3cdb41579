"""Mode strengths of a linear network's map along the task's singular directions, with theory."""
from __future__ import annotations

import re
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from callbacks.base import PeriodicCallback, output_path, overlay_charts
from callbacks.figures import loss_and_modes_figure


class SingularValues(PeriodicCallback):
    """Logs ``a_i = u_i^T W v_i`` for the task's modes (``modes/<member>/a<i>``) every n steps.

    Where the module has a closed form (``predicted_mode_strengths``: task-aligned two-layer
    lambda-balanced nets, [L] Thm. 5.1, ``tau da/dt = sqrt(lam^2 + 4 a^2)(s - a)``) the theory
    is logged beside it (``modes/<member>/a<i>_theory``) and a TensorBoard custom-scalars chart
    per member overlays the two (the "CUSTOM SCALARS" tab). At the end of the fit it writes
    ``singular_values.png`` (loss and modes, theory dashed) into the run's log folder.

    Needs a module with ``mode_strengths(U, V)`` and a datamodule with ``modes()``.
    """

    def __init__(self, every_n_steps: int = 10, max_modes: int = 8, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        if max_modes < 1:
            raise ValueError(f"SingularValues: max_modes = {max_modes}; allowed: a positive integer")
        self.max_modes, self.figure = max_modes, figure
        self.history: dict[str, list] = {"loss_steps": [], "losses": [], "steps": [], "strengths": []}
        self._modes = None

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = state_dict["history"]

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "mode_strengths")
        dm = trainer.datamodule
        if dm is None or not callable(getattr(dm, "modes", None)):
            raise TypeError("SingularValues needs a datamodule with modes() (e.g. datamodules.SemanticHierarchy)")
        m = dm.modes()
        k = min(self.max_modes, len(m.s))
        self._modes = type(m)(m.U[:, :k], m.s[:k], m.V[:, :k], m.c)
        overlay_charts(trainer, "mode strengths (simulation vs theory)",
                       {lbl: f"modes/{re.escape(lbl)}/a\\d+(_theory)?$" for lbl in pl_module.labels})

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if outputs is None and self.history["steps"] and self.history["steps"][-1] == trainer.global_step:
            return  # resumed at a logged step
        if isinstance(outputs, dict) and "member_loss" in outputs:
            # tensors, not numpy arrays: callback state must load from checkpoints with weights_only
            self.history["loss_steps"].append(int(outputs.get("loss_step", trainer.global_step - 1)))
            self.history["losses"].append(outputs["member_loss"].detach().cpu().double())
        self._record(trainer, pl_module)

    def _record(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        m, g = self._modes, trainer.global_step
        a = pl_module.mode_strengths(m.U, m.V).cpu().double()
        pred = pl_module.predicted_mode_strengths(torch.tensor([g]), m)
        self.history["steps"].append(g)
        self.history["strengths"].append(a.clone())
        metrics = {}
        for e, lbl in enumerate(pl_module.labels):
            for i in range(a.shape[1]):
                metrics[f"modes/{lbl}/a{i}"] = a[e, i]
                if pred is not None:
                    metrics[f"modes/{lbl}/a{i}_theory"] = pred[e, 0, i]
        self.log_scalars(trainer, metrics, step=g)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        h = self.history
        if not (self.figure and trainer.is_global_zero and h["steps"] and h["losses"]):
            return
        steps = np.asarray(h["steps"])
        dense = torch.linspace(0, float(steps.max()), 400)
        pred = pl_module.predicted_mode_strengths(dense, self._modes)
        loss_and_modes_figure(
            output_path(trainer, "singular_values.png"),
            pl_module.labels,
            np.asarray(h["loss_steps"]),
            torch.stack(h["losses"]).numpy(),
            steps,
            torch.stack(h["strengths"]).numpy(),
            dense.numpy() if pred is not None else None,
            pred.transpose(0, 1).numpy() if pred is not None else None,
            targets=self._modes.s.numpy(),
            title=f"{type(pl_module).__name__}: loss and mode strengths (dotted: task singular values)",
        )
