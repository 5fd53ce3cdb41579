"""Reconstruction quality of an ensemble of autoencoders, accumulated over batches and devices.

For data ``x`` (N, D) and each member's reconstruction ``x_hat_e`` (N, D):

* ``mse_e = sum |x - x_hat_e|^2 / (N D)``;
* ``explained_variance_e = 1 - sum |x - x_hat_e|^2 / sum |x - mean(x)|^2``, the fraction of the
  data's variance about its mean that the reconstruction recovers (the sparse-autoencoder
  literature's "explained variance"; ``zoo.metrics.sparsity.sparsity`` on one batch).

torchmetrics' ``R2Score(multioutput="variance_weighted")`` is not used for the second: it drops
the error made on outputs that are constant in the data (MNIST's border pixels), so a model that
paints the border would not lose score there. ``MeanSquaredError`` would serve for the first but
not per member with one shared target; one state (the summed squared error) gives both.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class Reconstruction(Metric):
    """``mse`` and ``explained_variance`` (each (E,)) of ``E`` members' reconstructions of the same data.

    ``update(x (B, ...), x_hat (E, B, ...))`` (``x_hat`` may drop the ``E`` dimension when ``E = 1``);
    sums reduce across devices, so the result is that of all the data seen.
    """

    full_state_update = False

    def __init__(self, members: int = 1, sync_on_compute: bool = True) -> None:
        super().__init__(sync_on_compute=sync_on_compute)
        self.members = int(members)
        self.add_state("sse", default=torch.zeros(self.members, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("sum_x", default=torch.zeros(0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("sum_xx", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("n", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, x: Tensor, x_hat: Tensor) -> None:
        x = x.detach().flatten(1).double()
        x_hat = x_hat.detach().double().reshape(self.members, *x.shape)
        if self.sum_x.numel() == 0:  # the data's dimension D is first known here
            self.sum_x = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
        self.sse += (x_hat - x).pow(2).sum((1, 2))
        self.sum_x += x.sum(0)
        self.sum_xx += x.pow(2).sum()
        self.n += x.shape[0]

    def compute(self) -> dict[str, Tensor]:
        # sum |x - mean|^2 = sum x^2 - |sum x|^2 / N, over points and dimensions
        total = self.sum_xx - self.sum_x.pow(2).sum() / self.n
        D = self.sum_x.numel()
        return {"mse": self.sse / (self.n * D),
                "explained_variance": 1 - self.sse / total if total > 0 else torch.full_like(self.sse, torch.nan)}
