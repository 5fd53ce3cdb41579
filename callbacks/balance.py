"""The balance ``W2^T W2 - W1 W1^T``, conserved by gradient flow ([L] Def. A.1)."""
from __future__ import annotations

import lightning.pytorch as pl

from callbacks.base import AtTrainEnd, PeriodicCallback, log_matrix, log_scalars, resuming, shown_members


class Balance(PeriodicCallback, AtTrainEnd):
    """Logs, per member, the largest deviation of the balance from its initial value
    (``balance/deviation/<member>``, 0 under gradient flow, O(lr) under GD) and the imbalance
    read off the weights (``balance/lam/<member>``). The balance matrices of up to
    ``max_images`` members are logged as heatmaps at the start and the end of the fit (a warning
    says how many were left out).
    """

    NEEDS = ("balance_deviation", "lam_estimate", "balance")

    def __init__(self, every_n_steps: int = 10, max_images: int = 8) -> None:
        super().__init__(every_n_steps)
        self.max_images = max_images

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not resuming(trainer):  # the first part of the run logged the initial balance
            self.publish(trainer, pl_module)

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        dev, lam = pl_module.balance_deviation().cpu(), pl_module.lam_estimate().cpu()  # one copy, not one per scalar
        metrics = {f"balance/deviation/{lbl}": dev[e] for e, lbl in enumerate(pl_module.labels)}
        log_scalars(trainer, metrics | {f"balance/lam/{lbl}": lam[e] for e, lbl in enumerate(pl_module.labels)})

    def publish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        B = pl_module.balance().cpu()
        if not trainer.is_global_zero or B.numel() == 0:
            return
        for e, lbl in enumerate(shown_members(self, pl_module.labels, self.max_images, "max_images")):
            log_matrix(trainer, f"balance/{lbl}", B[0, e], title=f"W2^T W2 - W1 W1^T ({lbl})")
