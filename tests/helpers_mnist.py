"""Tiny MNIST files for tests (shared by several test modules; no test module imports another)."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_RAW = next((p for p in (REPO.parent / "shared" / "data" / "MNIST" / "raw", Path("/work/shared/data/MNIST/raw"))
                   if all((p / f).is_file() for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                                      "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"))),
                  None)
TRAIN_PER_DIGIT, TEST_PER_DIGIT = 6, 3


def copy_real_mnist(folder: Path) -> bool:
    """The real MNIST files into ``folder/data/MNIST/raw``, as a user puts them (README); False where
    they are not on this machine."""
    import shutil

    if SHARED_RAW is None:
        return False
    raw = folder / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for f in SHARED_RAW.glob("*.gz"):
        shutil.copyfile(f, raw / f.name)
    return True


def idx_bytes(images: np.ndarray, digits: np.ndarray) -> tuple[bytes, bytes]:
    """The IDX format: big-endian magic 0x00000803 + (n, 28, 28) for images, 0x00000801 + n for labels."""
    n = images.shape[0]
    return (struct.pack(">IIII", 0x00000803, n, 28, 28) + images.astype(np.uint8).tobytes(),
            struct.pack(">II", 0x00000801, n) + digits.astype(np.uint8).tobytes())


def tiny_mnist(root: Path, gz: bool = False) -> Path:
    """Every digit ``TRAIN_PER_DIGIT`` (test: ``TEST_PER_DIGIT``) times, shuffled. Pixel (0, 0)
    encodes the digit (20 d + 5) and pixel (0, 1) the image's index, so a batch can be traced."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, per in (("train", TRAIN_PER_DIGIT), ("t10k", TEST_PER_DIGIT)):
        digits = rng.permutation(np.repeat(np.arange(10), per))
        images = rng.integers(0, 256, (digits.size, 28, 28))
        images[:, 0, 0] = 20 * digits + 5
        images[:, 0, 1] = np.arange(digits.size)
        for kind, blob in zip(("images-idx3", "labels-idx1"), idx_bytes(images, digits)):
            name = f"{prefix}-{kind}-ubyte"
            if gz:
                with gzip.open(raw / (name + ".gz"), "wb") as f:
                    f.write(blob)
            else:
                (raw / name).write_bytes(blob)
    return root


def trace(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(digit, image index) of each row of un-normalised inputs x (..., 784)."""
    pix = torch.round(x * 255).long()
    return (pix[..., 0] - 5) // 20, pix[..., 1]
