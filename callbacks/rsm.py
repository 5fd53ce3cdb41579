"""Representational similarity matrices of a linear network, simulation beside theory ([L] Sec. 5)."""
from __future__ import annotations

import lightning.pytorch as pl
import torch

from callbacks.base import PeriodicCallback, output_path
from callbacks.figures import matrix_grid_figure
from callbacks.base import log_matrix


class RSM(PeriodicCallback):
    """Logs the input RSM ``W1^T W1`` and output RSM ``W2 W2^T`` of up to ``max_images`` members
    as images (``rsm/input/<member>``, ``rsm/output/<member>``) every n steps; where the
    closed form applies (two-layer lambda-balanced, [L] Thm. 4.3) also ``.../theory`` images.
    At the end writes ``rsm.png``: one row per member, simulated and predicted RSMs side by side.
    """

    def __init__(self, every_n_steps: int = 100, max_images: int = 8, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        self.max_images, self.figure = max_images, figure

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "input_rsm", "output_rsm")

    def _theory(self, trainer, pl_module):
        dm, predict = trainer.datamodule, getattr(pl_module, "predicted_qqt", None)
        if predict is None or dm is None or not callable(getattr(dm, "modes", None)):
            return None
        Q = predict(torch.tensor([float(trainer.global_step)]), dm.sigma_yx, dm.modes().c)
        if Q is None:
            return None
        n_in = dm.sigma_yx.shape[1]
        return Q[:, 0, :n_in, :n_in], Q[:, 0, n_in:, n_in:]

    def on_due(self, trainer, pl_module, outputs) -> None:
        if not trainer.is_global_zero:
            return
        rin, rout, theory = pl_module.input_rsm(), pl_module.output_rsm(), self._theory(trainer, pl_module)
        for e, lbl in enumerate(pl_module.labels[: self.max_images]):
            log_matrix(trainer, f"rsm/input/{lbl}", rin[e], title=f"W1^T W1 ({lbl})")
            log_matrix(trainer, f"rsm/output/{lbl}", rout[e], title=f"W2 W2^T ({lbl})")
            if theory is not None:
                log_matrix(trainer, f"rsm/input/{lbl}/theory", theory[0][e], title=f"theory W1^T W1 ({lbl})")
                log_matrix(trainer, f"rsm/output/{lbl}/theory", theory[1][e], title=f"theory W2 W2^T ({lbl})")

    def on_fit_end(self, trainer, pl_module) -> None:
        if not (self.figure and trainer.is_global_zero):
            return
        rin, rout, theory = pl_module.input_rsm().cpu(), pl_module.output_rsm().cpu(), self._theory(trainer, pl_module)
        labels = pl_module.labels[: self.max_images]
        cols = ["input RSM W1^T W1", "output RSM W2 W2^T"]
        if theory is not None:
            cols = ["input RSM", "input RSM (theory)", "output RSM", "output RSM (theory)"]
        mats = []
        for e in range(len(labels)):
            row = [rin[e].numpy(), rout[e].numpy()]
            if theory is not None:
                row = [rin[e].numpy(), theory[0][e].numpy(), rout[e].numpy(), theory[1][e].numpy()]
            mats.append(row)
        matrix_grid_figure(output_path(trainer, "rsm.png"), labels, cols, mats,
                           title=f"representational similarity at step {trainer.global_step}")
