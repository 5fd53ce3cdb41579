"""XoR with a linear margin ([H] Sec. 3, App. C Eqs. 11-12; docs/theory.md#xor-margin).

Four points in three dimensions: XoR in the first two, linearly separable with margin 2 Delta in
the third. ``Delta`` may be a list: member e of an ensemble then trains on margin ``Delta[e]``
(``X`` is (E, 4, 3)), so a sweep over margins is one fit. The datamodule also gives the gates of
the two candidate ReLNs: "linear" (one pathway on the positive, one on the negative examples)
and "xor" (four pathways, one per example).
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import Tensor

from datamodules.regression import DescribedByData, RepeatedBatch
from zoo.theory.gdln import Gating


class GatedTask(DescribedByData, pl.LightningDataModule):
    """Base of the GDLN tasks: a fixed (X, Y) served as full batches, plus named gatings."""

    GATINGS: tuple[str, ...] = ()

    def __init__(self, batches_per_epoch: int = 1) -> None:
        super().__init__()
        if batches_per_epoch < 1:
            raise ValueError(f"{type(self).__name__}: batches_per_epoch = {batches_per_epoch}; allowed: a positive integer")
        self.batches_per_epoch = batches_per_epoch

    @property
    def X(self) -> Tensor:
        raise NotImplementedError

    @property
    def Y(self) -> Tensor:
        raise NotImplementedError

    def gating(self, name: str) -> Gating:
        raise NotImplementedError

    def _check_gating(self, name: str) -> None:
        if name not in self.GATINGS:
            raise ValueError(f"{type(self).__name__}: gating = {name!r}; allowed: {', '.join(self.GATINGS)}")

    def full_batch(self) -> tuple[Tensor, Tensor]:
        """(X, Y) on the device of the Trainer's model: every batch is the whole task, so it is
        copied there once per loader rather than by Lightning at every step (and every process of a
        member-parallel run reads the same one)."""
        trainer = self.trainer
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        return self.X.to(device), self.Y.to(device)

    def train_dataloader(self) -> RepeatedBatch:
        return RepeatedBatch(*self.full_batch(), self.batches_per_epoch)

    # The evaluation set is the task itself: these tasks are the whole data set ([H] studies how
    # the training loss falls), and there is no held-out point to generalise to.
    def val_dataloader(self) -> RepeatedBatch | list:
        # in a fit the validation MSE would repeat the training loss after every chunk of epochs
        if self.trainer is not None and self.trainer.state.fn == "fit":
            return []
        return RepeatedBatch(*self.full_batch(), 1)

    def test_dataloader(self) -> RepeatedBatch:
        return RepeatedBatch(*self.full_batch(), 1)


class XorMargin(GatedTask):
    """The XoR task with margin ([H] App. C Eq. 11): columns (-1,-1,-D), (1,-1,D), (-1,1,D), (1,1,-D),
    targets y = (-1, 1, 1, -1).

    Args:
        Delta: the margin parameter (>= 0), or a list (one per ensemble member).
        batches_per_epoch: full batches per epoch (the module takes many GD steps per batch anyway).
    """

    GATINGS = ("linear", "xor")

    def __init__(self, Delta: float | list[float] = 1.0, batches_per_epoch: int = 1) -> None:
        super().__init__(batches_per_epoch)
        deltas = [float(d) for d in Delta] if isinstance(Delta, (list, tuple)) else [float(Delta)]
        if not deltas or any(not (math.isfinite(d) and d >= 0) for d in deltas):
            raise ValueError(f"XorMargin: Delta = {Delta!r}; allowed: a number >= 0 or a non-empty list of them")
        self.Delta = Delta
        self.deltas = torch.tensor(deltas, dtype=torch.float64)
        # member e of the module's ensemble trains on margin Delta[e]
        self.member_params = [{"Delta": d} for d in deltas] if len(deltas) > 1 else None

    @property
    def X(self) -> Tensor:
        base = torch.tensor([[-1.0, -1.0, -1.0], [1.0, -1.0, 1.0], [-1.0, 1.0, 1.0], [1.0, 1.0, -1.0]], dtype=torch.float64)
        X = base[None].repeat(len(self.deltas), 1, 1)
        X[:, :, 2] *= self.deltas[:, None]
        return (X[0] if len(self.deltas) == 1 else X).float()

    @property
    def Y(self) -> Tensor:
        return torch.tensor([[-1.0], [1.0], [1.0], [-1.0]])

    def gating(self, name: str) -> Gating:
        """'linear': pathways on the positive / negative examples; 'xor': one pathway per example."""
        self._check_gating(name)
        if name == "linear":
            gates = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
            names = ["positive", "negative"]
        else:
            gates, names = torch.eye(4), [f"example{i}" for i in range(4)]
        P = gates.shape[1]
        return Gating(gates, torch.ones(P, 3), torch.zeros(P, dtype=torch.bool), names)
