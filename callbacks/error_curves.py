"""Every task's error over time, members grouped into panels ([S] Fig. 7)."""
from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import numpy as np
import torch

from callbacks.base import HistoryCallback, check, log_figure, log_scalars


class ErrorCurves(HistoryCallback):
    """Records every member's error on every task (``pl_module.task_errors``) and, at the end of
    the fit, draws them (``error_curves.png``, ``zoo.plots.teacher_student.error_curves_figure``).

    Errors come from the order parameters (``source="theory"``: [S] Eq. 9 on the simulated
    weights, exact, no Monte-Carlo noise) or the datamodule's test sets (``"mc"``). Logs
    ``error/<member>/task<t>`` every ``every_n_steps`` SGD samples. The figure has one panel per
    value of the member parameter ``group_by`` (e.g. ``theta``), one colour per value of
    ``color_by`` (e.g. ``xi``), task 1 solid and later tasks dashed, the switches dotted.
    """

    unit = "samples"
    HISTORY_KEYS = ("steps", "errors")

    def __init__(self, every_n_steps: int = 1000, group_by: str | None = None, color_by: str | None = None,
                 source: Literal["theory", "mc"] = "theory", log_scale: bool = False) -> None:
        super().__init__(every_n_steps)
        check("ErrorCurves", "source", source, source in ("theory", "mc"), "'theory' or 'mc'")
        self.group_by, self.color_by, self.source, self.log_scale = group_by, color_by, source, log_scale

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "task_errors")
        if self.source == "theory" and getattr(pl_module, "activation", None) == "sigmoid":
            raise ValueError("ErrorCurves: source = 'theory' has no closed form for activation 'sigmoid'; use source = 'mc'")
        for key, what in ((self.group_by, "group_by"), (self.color_by, "color_by")):
            if key is not None and not all(key in p for p in pl_module.member_params):
                raise ValueError(f"ErrorCurves: {what} = {key!r} is not a parameter of every member "
                                 f"({pl_module.member_params[:2]} ...)")

    def on_due(self, trainer, pl_module, outputs) -> None:
        eps = pl_module.task_errors(trainer.datamodule, self.source).detach().double().cpu()  # (E, n_tasks)
        self.append(steps=self.now, errors=eps)
        log_scalars(trainer, {f"error/{lbl}/task{t}": eps[e, t] for e, lbl in enumerate(pl_module.labels)
                                   for t in range(eps.shape[1])})

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or not self.history["errors"]:
            return
        from zoo.plots.teacher_student import error_curves_figure

        d = pl_module.d
        fig = error_curves_figure(np.asarray(self.history["steps"]) / d, torch.stack(self.history["errors"]).numpy(),
                                  pl_module.member_params, [s / d for s in getattr(trainer.datamodule, "switch_steps", [])],
                                  self.group_by, self.color_by, self.log_scale)
        log_figure(trainer, "error_curves", fig, png="error_curves.png", step=self.clock(trainer, pl_module))
