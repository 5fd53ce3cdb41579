"""MNIST images for an autoencoder: phase 1 of the implicit sparse autoencoder experiment ([S] App. H).

Batches are ``(x,)`` with ``x`` (B, 1, 28, 28) float32, ``x = pixel / 255`` in [0, 1] (what
:class:`zoo.models.vae.BetaVAE`'s Bernoulli reconstruction expects); ``image_shape = (1, 28, 28)`` tells the
VAE its input size before it builds. Files are read by :func:`datamodules.mnist_files.load_mnist` from
``data_dir/MNIST/raw`` (offline, never written: the ``.gz`` files are extracted into the cache; a
missing or corrupt file is a clear error naming ``data_dir`` and the folder).
The training order is a seeded shuffle, so a run is reproducible. Validation and testing run on
the other split (``held_out``: the 10,000 test images when training on ``"train"``), in file order.
"""
from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from datamodules.mnist_files import load_mnist, prepare_mnist

SPLITS = ("train", "test")


def _positive(owner: str, arg: str, value: object, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {arg} = {value!r}; allowed: a positive integer" + (" or null" if allow_none else ""))


def held_out_loader(x: Tensor, batch_size: int, num_workers: int) -> DataLoader:
    """Batches ``(x,)`` in order. The loader has a generator of its own: each iterator draws a base
    seed, and from the global generator that would shift what training draws after a validation."""
    return DataLoader(TensorDataset(x), batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      generator=torch.Generator().manual_seed(0))


class MNISTImages(pl.LightningDataModule):
    """MNIST digits as images in [0, 1] for an autoencoder ([S] App. H, phase 1).

    Args:
        data_dir: the folder holding ``MNIST/raw`` (see :func:`datamodules.mnist_files.load_mnist`).
        split: ``"train"`` (60,000 images, what [S] App. H trains and measures on) or ``"test"``.
        num_samples: use only the first ``num_samples`` images of the split (file order); default all.
        batch_size: images per step.
        seed: seed of the shuffle.
        num_workers: DataLoader workers.
    """

    image_shape: tuple[int, int, int] = (1, 28, 28)

    def __init__(
        self,
        data_dir: str = "data",
        split: str = "train",
        num_samples: int | None = None,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if split not in SPLITS:
            raise ValueError(f"{name}: split = {split!r}; allowed: 'train' or 'test'")
        _positive(name, "num_samples", num_samples, allow_none=True)
        _positive(name, "batch_size", batch_size)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"{name}: num_workers = {num_workers!r}; allowed: an integer >= 0")
        # by name: built inside another datamodule's __init__ (Latents), Lightning would otherwise
        # collect that caller's arguments too
        self.save_hyperparameters("data_dir", "split", "num_samples", "batch_size", "seed", "num_workers", logger=False)
        self.data_dir, self.split, self.num_samples = data_dir, split, num_samples
        self.batch_size, self.seed, self.num_workers = int(batch_size), int(seed), int(num_workers)
        self._images: Tensor | None = None
        self._digits: Tensor | None = None
        self._held_out: Tensor | None = None

    def prepare_data(self) -> None:
        prepare_mnist(self.data_dir, who=type(self).__name__)  # extraction on one process per node

    def setup(self, stage: str | None = None) -> None:
        self._load()

    def _read(self, split: str) -> tuple[Tensor, Tensor]:
        """Images (N, 1, 28, 28) in [0, 1] and digits of a split (its first ``num_samples``)."""
        images, digits = load_mnist(self.data_dir, who=type(self).__name__)[split]
        n = self.num_samples
        return images[:n].unsqueeze(1).float().div_(255.0), digits[:n]

    def _load(self) -> Tensor:
        if self._images is None:
            self._images, self._digits = self._read(self.split)
        return self._images

    @property
    def held_out(self) -> Tensor:
        """The other split's images (first ``num_samples``), for validation and testing."""
        if self._held_out is None:
            self._held_out = self._read(SPLITS[1 - SPLITS.index(self.split)])[0]
        return self._held_out

    @property
    def images(self) -> Tensor:
        """All images of the split (N, 1, 28, 28) in [0, 1], file order."""
        return self._load()

    @property
    def digits(self) -> Tensor:
        """Their digit labels (N,) (not used for training; for plots and probes)."""
        self._load()
        return self._digits

    def train_dataloader(self) -> DataLoader:
        from datamodules.resumable import ResumableLoader, shuffled_batches

        # the batches of DataLoader(shuffle=True, generator=g), resumable mid-epoch (datamodules.resumable)
        g = torch.Generator().manual_seed(self.seed)
        data = TensorDataset(self._load())
        return ResumableLoader(data, batch_sampler=shuffled_batches(len(data), self.batch_size, g), generator=g,
                               num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return held_out_loader(self.held_out, self.batch_size, self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def samples(self, n: int) -> Tensor:
        """``n`` images drawn without replacement from their own seed (a fixed evaluation set)."""
        _positive(type(self).__name__, "n", n)
        x = self._load()
        idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(self.seed + 1))[:n]
        return x[idx]
