"""The network map ``W_L ... W_1`` of each member as a heatmap, beside the task's target."""
from __future__ import annotations

import lightning.pytorch as pl

from callbacks.base import PeriodicCallback, log_matrix, resuming, shown_members


class NetworkMap(PeriodicCallback):
    """Every n steps, logs ``map/<member>`` images of up to ``max_images`` members (a warning says
    how many were left out); at the start,
    ``map/target``, the whitened task map ``sigma_yx / c`` the network converges to.
    """

    NEEDS = ("network_map",)

    def __init__(self, every_n_steps: int = 100, max_images: int = 8) -> None:
        super().__init__(every_n_steps)
        self.max_images = max_images

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        # once per run: the first part of a resumed run logged it
        if trainer.is_global_zero and not resuming(trainer) and callable(getattr(dm, "modes", None)):
            log_matrix(trainer, "map/target", dm.sigma_yx / dm.modes().c, title="target map sigma_yx / c")

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if not trainer.is_global_zero:
            return
        M = pl_module.network_map().detach().cpu()
        for e, lbl in enumerate(shown_members(self, pl_module.labels, self.max_images, "max_images")):
            log_matrix(trainer, f"map/{lbl}", M[e], title=f"W_L...W_1 ({lbl}), step {trainer.global_step}")
