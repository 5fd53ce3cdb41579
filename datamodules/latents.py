"""The latent codes of a trained VAE as a data set: phase 2 of [S] App. H (Fig. 13).

Phase 1 trains a VAE on MNIST (``recipes/specialisation/fig13_vae_mnist.yaml``) and saves a
checkpoint; this datamodule loads its encoder with ``BetaVAE.load_from_checkpoint`` and serves the
posterior means ``mu`` of the MNIST images (16 numbers each in [S]) as the inputs of a
(implicit) sparse autoencoder: batches ``(x,)``, ``x`` (B, L) float32. The codes are computed once,
at ``setup``, in inference mode; the training order is a seeded shuffle.

Instead of a checkpoint a :class:`zoo.models.vae.BetaVAE` itself may be passed as ``vae`` (from a
notebook, or an untrained one for smoke tests); exactly one of the two is required, and a
checkpoint path that does not exist is an error naming the path, raised when the datamodule is
built (before any training).

Validation and testing run on the codes of the other split's images (``held_out``, encoded when
first asked for; centred with the training codes' mean).

``centre`` subtracts the codes' mean (over the split used): a VAE's means are near zero on
average but not exactly, and a bias-free unit's firing depends on where the data sit relative to
the origin (see ``recipes/specialisation/fig13_isae.yaml``).
"""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from datamodules.mnist_images import MNISTImages, _positive, held_out_loader
from datamodules.resumable import ResumableLoader, shuffled_batches
from zoo.models.vae import BetaVAE

ENCODE_CHUNK = 2048
"""Images encoded per forward pass at setup (bounds memory; the codes do not depend on it)."""


class Latents(pl.LightningDataModule):
    """Posterior means of a trained VAE's encoder on MNIST, as batches ``(x,)`` ([S] App. H).

    Args:
        checkpoint: path of a :class:`zoo.models.vae.BetaVAE` checkpoint (phase 1's ``.ckpt``).
        vae: a BetaVAE to encode with instead of a checkpoint (give exactly one of the two).
        data_dir: the folder holding ``MNIST/raw``.
        split: ``"train"`` (the 60,000 images of [S] Eq. 31) or ``"test"``.
        num_samples: encode only the first ``num_samples`` images of the split; default all.
        batch_size: codes per step.
        centre: subtract the mean code (see the module docstring).
        seed: seed of the shuffle and of :meth:`samples`.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        checkpoint: str | None = None,
        vae: BetaVAE | None = None,
        data_dir: str = "data",
        split: str = "train",
        num_samples: int | None = None,
        batch_size: int = 64,
        centre: bool = False,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if (checkpoint is None) == (vae is None):
            raise ValueError(f"{name}: give exactly one of checkpoint (a path to a BetaVAE .ckpt, e.g. phase 1's "
                             "of recipes/specialisation/fig13_vae_mnist.yaml) and vae (a BetaVAE); got "
                             f"checkpoint = {checkpoint!r}, vae = {'a ' + type(vae).__name__ if vae is not None else None}")
        if checkpoint is not None and not Path(checkpoint).expanduser().is_file():
            raise FileNotFoundError(
                f"{name}: checkpoint = {checkpoint!r}: no such file ({Path(checkpoint).expanduser().resolve()}). "
                "Train phase 1 first (`lightning fit --config recipes/specialisation/fig13_vae_mnist.yaml`) and "
                "pass the .ckpt it writes")
        if vae is not None and not isinstance(vae, BetaVAE):
            raise TypeError(f"{name}: vae is a {type(vae).__name__}; allowed: a zoo.models.vae.BetaVAE")
        # the image datamodule checks data_dir, split, num_samples, batch_size and num_workers
        self.images = MNISTImages(data_dir=data_dir, split=split, num_samples=num_samples, batch_size=batch_size,
                                  seed=seed, num_workers=num_workers)
        self.save_hyperparameters(ignore=["vae"], logger=False)
        self.checkpoint, self.vae, self.centre = checkpoint, vae, bool(centre)
        self.batch_size, self.seed, self.num_workers = int(batch_size), int(seed), int(num_workers)
        self._codes: Tensor | None = None
        self._held_out: Tensor | None = None
        self.mean: Tensor | None = None

    def encoder(self) -> BetaVAE:
        """The VAE whose posterior means are the codes (loaded on the CPU, in eval mode)."""
        if self.vae is None:
            try:
                self.vae = BetaVAE.load_from_checkpoint(str(Path(self.checkpoint).expanduser()), map_location="cpu")
            except Exception as err:  # torch/Lightning raise many kinds for a file that is not a BetaVAE's
                first = str(err).strip().split("\n", 1)[0][:200]
                raise ValueError(f"{type(self).__name__}: checkpoint = {self.checkpoint!r} is not a readable BetaVAE "
                                 f"checkpoint ({type(err).__name__}: {first}); allowed: the .ckpt of "
                                 "recipes/specialisation/fig13_vae_mnist.yaml") from err
        if not self.vae.built:
            self.vae.adopt_image_shape(MNISTImages.image_shape)
        return self.vae.eval()

    def prepare_data(self) -> None:
        self.images.prepare_data()  # the images' extraction, once per node; encoding is read-only, per process

    def setup(self, stage: str | None = None) -> None:
        self._load()

    def _encode(self, x: Tensor) -> Tensor:
        vae = self.encoder()
        if list(vae.image_shape) != list(MNISTImages.image_shape):
            raise ValueError(f"{type(self).__name__}: the VAE was built for images {vae.image_shape}, "
                             f"not MNIST's {list(MNISTImages.image_shape)}")
        device = next(vae.parameters()).device
        with torch.inference_mode():
            return torch.cat([vae.codes(x[i:i + ENCODE_CHUNK].to(device)).float().cpu()
                              for i in range(0, x.shape[0], ENCODE_CHUNK)])

    def _load(self) -> Tensor:
        if self._codes is None:
            self.encoder()  # a bad checkpoint is the first error, before the images are read
            codes = self._encode(self.images.images)
            self.mean = codes.mean(0)
            self._codes = codes - self.mean if self.centre else codes
        return self._codes

    @property
    def held_out(self) -> Tensor:
        """Codes of the other split's images (centred with the training codes' mean if ``centre``)."""
        if self._held_out is None:
            self._load()  # the training codes' mean
            codes = self._encode(self.images.held_out)
            self._held_out = codes - self.mean if self.centre else codes
        return self._held_out

    def val_dataloader(self) -> DataLoader:
        return held_out_loader(self.held_out, self.batch_size, self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    @property
    def codes(self) -> Tensor:
        """All codes (N, L), file order (centred if ``centre``)."""
        return self._load()

    @property
    def d(self) -> int:
        """Dimension of a code (the VAE's ``latent_dim``): the SAE's ``d``."""
        return int(self._load().shape[1])

    def train_dataloader(self) -> DataLoader:
        # the batches of DataLoader(shuffle=True, generator=g), resumable mid-epoch (datamodules.resumable)
        g = torch.Generator().manual_seed(self.seed)
        data = TensorDataset(self._load())
        return ResumableLoader(data, batch_sampler=shuffled_batches(len(data), self.batch_size, g), generator=g,
                               num_workers=self.num_workers)

    def samples(self, n: int | None = None) -> Tensor:
        """A fixed evaluation set: ``n`` codes drawn without replacement from their own seed, or all
        of them (file order) when ``n`` is None or at least their number."""
        _positive(type(self).__name__, "n", n, allow_none=True)
        codes = self._load()
        if n is None or n >= codes.shape[0]:
            return codes
        idx = torch.randperm(codes.shape[0], generator=torch.Generator().manual_seed(self.seed + 1))[:n]
        return codes[idx]
