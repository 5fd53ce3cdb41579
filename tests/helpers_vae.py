"""Shared by the VAE tests: a tiny factor-grid datamodule and a short Trainer."""
from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class TinySquares(pl.LightningDataModule):
    """A factor grid of 1x8x8 images: a 2x2 square at (row, col) of 4x4 positions with one of two
    brightnesses. Follows the interface of ``datamodules.shapes`` (batches ``(x, factors)``,
    ``factor_names``, ``factor_sizes``, ``image_shape``, ``sample``, ``images_for``)."""

    def __init__(self, batch_size: int = 16, n_train: int = 128, n_test: int = 40, seed: int = 0) -> None:
        super().__init__()
        self.batch_size, self.n_train, self.n_test, self.seed = batch_size, n_train, n_test, seed
        self.factor_names, self.factor_sizes, self.image_shape = ["row", "col", "brightness"], [4, 4, 2], (1, 8, 8)

    def images_for(self, factors: torch.Tensor) -> torch.Tensor:
        x = torch.zeros(len(factors), *self.image_shape)
        for k, (r, c, b) in enumerate(factors.tolist()):
            x[k, 0, 2 * r:2 * r + 2, 2 * c:2 * c + 2] = 0.5 + 0.5 * b
        return x

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        f = torch.stack([torch.randint(s, (n,), generator=generator) for s in self.factor_sizes], 1)
        return self.images_for(f), f

    def setup(self, stage: str) -> None:
        self.data = TensorDataset(*self.sample(self.n_train, torch.Generator().manual_seed(self.seed)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(self.seed))

    def test_dataloader(self) -> DataLoader:
        """``n_test`` points drawn with seed ``seed + 1``."""
        x, f = self.sample(self.n_test, torch.Generator().manual_seed(self.seed + 1))
        return DataLoader(TensorDataset(x, f), batch_size=self.batch_size, generator=torch.Generator())
