"""Representational similarity matrices of a linear network, simulation beside theory ([L] Sec. 5)."""
from __future__ import annotations

import lightning.pytorch as pl
import torch

from callbacks.base import PeriodicCallback, log_figure, log_matrix, shown_members


class RSM(PeriodicCallback):
    """Logs the input RSM ``W1^T W1`` and output RSM ``W2 W2^T`` of up to ``max_images`` members
    as images (``rsm/input/<member>``, ``rsm/output/<member>``) every n steps (a warning says how
    many were left out); where the module
    predicts them (``predicted_rsms``: two-layer lambda-balanced, [L] Thm. 4.3) also
    ``.../theory`` images. At the end it logs ``zoo.plots.linear.matrix_grid`` (one row per
    member, simulated and predicted RSMs side by side) and writes it as ``rsm.png``.
    """

    NEEDS = ("input_rsm", "output_rsm")

    def __init__(self, every_n_steps: int = 100, max_images: int = 8, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        self.max_images, self.figure = max_images, figure

    def _matrices(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, torch.Tensor]:
        """Name -> (E, n, n): the RSMs now and, where predicted, their theory."""
        mats = {"input": pl_module.input_rsm().cpu(), "output": pl_module.output_rsm().cpu()}
        dm, predict = trainer.datamodule, getattr(pl_module, "predicted_rsms", None)
        if predict is not None and dm is not None and callable(getattr(dm, "modes", None)):
            theory = predict(torch.tensor([float(trainer.global_step)]), dm.sigma_yx, dm.modes().c)
            if theory is not None:
                mats.update({"input/theory": theory[0][:, 0], "output/theory": theory[1][:, 0]})
        return mats

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if not trainer.is_global_zero:
            return
        for name, M in self._matrices(trainer, pl_module).items():
            for e, lbl in enumerate(shown_members(self, pl_module.labels, self.max_images, "max_images")):
                tag = f"rsm/{name.split('/')[0]}/{lbl}" + ("/theory" if "theory" in name else "")
                log_matrix(trainer, tag, M[e], title=f"{name} RSM ({lbl})")

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.plots.linear import matrix_grid

        if not (self.figure and trainer.is_global_zero):
            return
        mats = self._matrices(trainer, pl_module)
        cols = sorted(mats)  # input, input/theory, output, output/theory
        labels = shown_members(self, pl_module.labels, self.max_images, "max_images")
        fig = matrix_grid(labels, [c.replace("/", " RSM, ") if "/" in c else f"{c} RSM" for c in cols], [[mats[c][e].numpy() for c in cols] for e in range(len(labels))],
                          title=f"representational similarity at step {trainer.global_step}")
        log_figure(trainer, "rsm", fig, png="rsm.png")
