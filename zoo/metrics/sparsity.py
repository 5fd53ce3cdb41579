"""Sparsity of hidden activity: [S] App. H, Eq. 31, and the standard sparse-autoencoder measures.

``H`` is the hidden activity of a dataset, (N data points, n units); a unit is *active* on a data
point when ``H > 0`` ([S] Eq. 30; ReLU units).

* ``eq31``: the mean over units of the number of data points that activate them ([S] Eq. 31; the
  printed triple sum repeats the index j, docs/theory.md#sae-sparsity: it is ``1/n sum_i sum_j 1(H_ji > 0)``).
  Lower is sparser; it ranges from 0 (no unit ever fires) to N (every unit fires on everything).
* ``l0``: the mean over data points of the number of active units (the usual SAE "L0").
* ``dead_fraction``: units active on no data point of the window; ``dense_fraction``: units active
  on more than ``dense_threshold`` of the data points. Both count over the data points given,
  so the window is a number of samples, not of steps.
* ``density``: each unit's fraction of data points that activate it, (n,), for a histogram.
* ``explained_variance`` (when the reconstruction is given): ``1 - sum |x - x_hat|^2 / sum |x -
  mean(x)|^2`` over the window, the fraction of the data's variance about its mean that the
  reconstruction recovers (1 = perfect, 0 = no better than the mean).

``FiringCounts`` (a ``torchmetrics.Metric``) accumulates the counts behind these measures over
batches and devices; ``zoo.metrics.reconstruction.Reconstruction`` the explained variance.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


def from_counts(per_unit: Tensor, N: int, dense_threshold: float = 0.5) -> dict[str, Tensor]:
    """The measures from firing counts: ``per_unit`` (..., n) data points (of ``N``) that activate
    each unit; leading dimensions (e.g. ensemble members) are kept. ``l0`` needs no more data:
    the active entries summed over units equal those summed over data points."""
    if N < 1:
        raise ValueError(f"sparsity: N = {N}; allowed: at least one data point")
    if not 0.0 <= dense_threshold < 1.0:
        raise ValueError(f"sparsity: dense_threshold = {dense_threshold}; allowed: 0 <= threshold < 1")
    per_unit = per_unit.double()
    return {
        "eq31": per_unit.mean(-1),
        "l0": per_unit.sum(-1) / N,
        "dead_fraction": (per_unit == 0).double().mean(-1),
        "dense_fraction": (per_unit > dense_threshold * N).double().mean(-1),
        "density": per_unit / N,
    }


def sparsity(H: Tensor, x: Tensor | None = None, x_hat: Tensor | None = None,
             dense_threshold: float = 0.5) -> dict[str, Tensor | float]:
    """The measures above for hidden activity ``H`` (N, n); ``x``, ``x_hat`` (N, d) optional.

    Returns floats, and ``density`` as a tensor (n,).
    """
    if H.dim() != 2 or H.shape[0] == 0:
        raise ValueError(f"sparsity: H must be (data points, units) with at least one data point; got {tuple(H.shape)}")
    N = H.shape[0]
    counts = from_counts((H > 0).sum(0), N, dense_threshold)
    out: dict[str, Tensor | float] = {k: (v if k == "density" else float(v)) for k, v in counts.items()}
    if (x is None) != (x_hat is None):
        raise ValueError("sparsity: give both x and x_hat (for the explained variance) or neither")
    if x is not None:
        if x.shape != x_hat.shape or x.shape[0] != N:
            raise ValueError(f"sparsity: x {tuple(x.shape)} and x_hat {tuple(x_hat.shape)} must both be (N = {N}, d)")
        x, x_hat = x.double(), x_hat.double()
        total = (x - x.mean(0)).pow(2).sum()
        out["explained_variance"] = float(1 - (x - x_hat).pow(2).sum() / total) if total > 0 else float("nan")
    return out


class FiringCounts(Metric):
    """Per member, how many data points activate each unit (``H > threshold``, [S] Eq. 30), summed
    over batches and devices; ``compute()`` gives :func:`from_counts`'s measures (``eq31`` ...).

    ``update(H (E, B, n) or (B, n))``; ``threshold = 0`` is [S] Eq. 30.
    """

    full_state_update = False

    def __init__(self, members: int, units: int, threshold: float = 0.0, dense_threshold: float = 0.5,
                 sync_on_compute: bool = True) -> None:
        super().__init__(sync_on_compute=sync_on_compute)
        self.members, self.units = int(members), int(units)
        self.threshold, self.dense_threshold = float(threshold), float(dense_threshold)
        self.add_state("counts", default=torch.zeros(self.members, self.units, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("N", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, H: Tensor) -> None:
        H = H.detach().reshape(self.members, -1, self.units)
        self.counts += (H > self.threshold).sum(1)
        self.N += H.shape[1]

    def compute(self) -> dict[str, Tensor]:
        return from_counts(self.counts, int(self.N), self.dense_threshold)
