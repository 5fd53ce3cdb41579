"""MNIST's files: found in ``data_dir/MNIST/raw``, verified, extracted into the cache, read.

``data_dir`` is only ever read. With the four original ``.gz`` files there, their md5 is checked
(torchvision's list) and they are extracted once into the cache folder
(:func:`datamodules.files.cache_root`, ``$ZOO_CACHE`` or ``~/.cache/specialisation-zoo``) under
``MNIST/<key>``, the key naming the files' md5, so every copy of the same files shares one
extraction; a log line says which folder. Each file is extracted under a temporary name and
renamed when complete, so two runs extracting at once both succeed and neither reads a half
file. Without the ``.gz`` files, the four extracted ``*-ubyte`` files in ``data_dir/MNIST/raw``
are read directly (that is how unit tests pass tiny IDX files). ``download=True`` fetches
missing files into the cache with torchvision's downloader (needs the network).
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from datamodules.files import DataFileError, atomic_path, cache_dir, part_name, remove_stale_parts

N_DIGITS = 10
# torchvision's list of the original files and the md5 of their .gz
MNIST_FILES = {
    "train-images-idx3-ubyte": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte": "ec29112dd5afa0611ce80d1b7f02629c",
}
SPLIT_PREFIX = {"train": "train", "test": "t10k"}
HOW_TO_GET = (
    "Put the four original MNIST files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) in <data_dir>/MNIST/raw: offline, point data_dir "
    "at the project's shared data (data_dir: ../shared/data; it may be read-only) or copy it "
    "(`mkdir -p data && cp -r ../shared/data/MNIST data/`); online, pass download=True.")


def md5_of(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes with ``ndim`` dimensions (big-endian header: 0, 0, 0x08,
    ndim, then the sizes), checked to hold exactly the bytes its header announces."""
    try:
        data = bytearray(Path(path).read_bytes())  # bytearray: a writable array, as torch wants
    except OSError as e:
        raise DataFileError(f"could not read {path}: {e}") from e
    head = 4 + 4 * ndim
    if len(data) < head or data[:3] != b"\x00\x00\x08" or data[3] != ndim:
        raise DataFileError(f"could not read {path}: not an IDX file of bytes with {ndim} dimension(s) "
                            f"(header {bytes(data[:4]).hex()})")
    dims = struct.unpack(f">{ndim}I", data[4:head])
    if len(data) != head + int(np.prod(dims)):
        raise DataFileError(f"could not read {path}: {len(data)} bytes, but its header {list(dims)} needs "
                            f"{head + int(np.prod(dims))}: truncated or corrupt")
    return np.frombuffer(data, np.uint8, offset=head).reshape(dims)


def _gz_folder(raw: Path, download: bool, who: str, param: str) -> Path | None:
    """The folder holding the four verified ``.gz`` files: ``raw``, or (``download``) the cache's
    download folder; None if ``raw`` holds the extracted files instead."""
    present = [f for f in MNIST_FILES if (raw / (f + ".gz")).is_file()]
    if len(present) == len(MNIST_FILES):
        for f, md5 in MNIST_FILES.items():
            got = md5_of(raw / (f + ".gz"))
            if got != md5:
                raise DataFileError(
                    f"{who}: {param}: {raw.resolve() / (f + '.gz')} is corrupt or not the original file (md5 {got}, "
                    f"expected {md5}); replace it with the original. {HOW_TO_GET}")
        return raw
    if all((raw / f).is_file() for f in MNIST_FILES):
        return None
    if download:
        return _download(who)
    where = raw.resolve()
    missing = [f + ".gz" for f in MNIST_FILES if f not in present]
    if not where.is_dir():
        found = next((p for p in where.parents if p.is_dir()), None)
        what = f"the folder {where} does not exist" + (f" ({found} is the nearest that does)" if found else "")
    else:
        what = (f"no {missing} in {where} (looked for the four original .gz files and for the four extracted "
                "*-ubyte files)")
    raise FileNotFoundError(f"{who}: {param}: {what}. {HOW_TO_GET}")


def _download(who: str) -> Path:
    """Missing ``.gz`` files fetched into the cache (each under a temporary name, md5 checked)."""
    from torchvision.datasets import MNIST
    from torchvision.datasets.utils import download_url

    folder = cache_dir("MNIST", "download")
    remove_stale_parts(folder)
    for f, md5 in MNIST_FILES.items():
        final = folder / (f + ".gz")
        if final.is_file() and md5_of(final) == md5:
            continue
        errors = []
        for mirror in MNIST.mirrors:
            tmp = part_name(final)
            try:
                download_url(mirror + final.name, str(folder), tmp.name, md5)
                os.replace(tmp, final)
                break
            except Exception as e:  # URLError, HTTPError, torchvision's md5 RuntimeError, ...
                errors.append(f"{mirror}: {type(e).__name__}: {e}")
            finally:
                tmp.unlink(missing_ok=True)
        else:
            raise RuntimeError(f"{who}: download=True, but {final.name} could not be downloaded ({'; '.join(errors)}). "
                               f"{HOW_TO_GET}")
    rank_zero_info(f"{who}: MNIST downloaded into {folder}")
    return folder


def _cache_folder() -> Path:
    # keyed by the .gz files' md5: their content, whichever folder they came from
    return cache_dir("MNIST", hashlib.sha1("".join(MNIST_FILES.values()).encode()).hexdigest()[:12])


def _extract(gz: Path) -> Path:
    """The cache folder holding the four files extracted from ``gz`` (extracting what is missing)."""
    folder = _cache_folder()
    if all((folder / f).is_file() for f in MNIST_FILES):
        rank_zero_info(f"MNIST: reading the files extracted from {gz.resolve()} in the cache {folder}")
        return folder
    remove_stale_parts(folder)
    for f in MNIST_FILES:
        if not (folder / f).is_file():
            with atomic_path(folder / f) as tmp, gzip.open(gz / (f + ".gz"), "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    rank_zero_info(f"MNIST: extracted {gz.resolve()} into the cache {folder} (data_dir is never written; "
                   "ZOO_CACHE chooses the cache)")
    return folder


def _read_splits(folder: Path) -> dict[str, tuple[Tensor, Tensor]]:
    out = {}
    for split, prefix in SPLIT_PREFIX.items():
        images = read_idx(folder / f"{prefix}-images-idx3-ubyte", 3)
        digits = read_idx(folder / f"{prefix}-labels-idx1-ubyte", 1)
        if (images.shape[1:] != (28, 28) or digits.shape != (images.shape[0],) or images.shape[0] == 0
                or int(digits.max()) >= N_DIGITS):
            raise DataFileError(
                f"the {split} files in {folder.resolve()} do not hold MNIST: images {tuple(images.shape)}, labels "
                f"{tuple(digits.shape)} up to {int(digits.max(initial=0))} (expected (n, 28, 28) images and n "
                "labels in 0..9)")
        out[split] = (torch.from_numpy(images), torch.from_numpy(digits).long())
    return out


def prepare_mnist(data_dir: str | os.PathLike, download: bool = False, who: str = "MNISTContinual") -> None:
    """Everything :func:`load_mnist` may write, done ahead: the ``.gz`` files verified (fetched
    with ``download``) and extracted into the cache. For a datamodule's ``prepare_data``, which
    Lightning runs on one process per node while the others wait, so that their ``setup`` only reads."""
    raw = Path(data_dir).expanduser() / "MNIST" / "raw"
    gz = _gz_folder(raw, download, who, f"data_dir = {str(data_dir)!r}")
    if gz is not None:
        _extract(gz)


def load_mnist(data_dir: str | os.PathLike, download: bool = False,
               who: str = "MNISTContinual") -> dict[str, tuple[Tensor, Tensor]]:
    """MNIST from ``data_dir/MNIST/raw`` (see the module docstring): ``{"train": (images, digits),
    "test": ...}`` with images (n, 28, 28) uint8 and digits (n,) int64.

    Raises ``FileNotFoundError`` (naming ``data_dir``, the folder and how to get the files) if they
    are missing, :class:`~datamodules.files.DataFileError` (a ValueError) if they are corrupt.
    """
    raw = Path(data_dir).expanduser() / "MNIST" / "raw"
    param = f"data_dir = {str(data_dir)!r}"
    gz = _gz_folder(raw, download, who, param)
    if gz is None:  # the user's extracted files
        try:
            return _read_splits(raw)
        except DataFileError as e:
            raise DataFileError(f"{who}: {param}: {e}. Replace the *-ubyte files in {raw.resolve()} with good "
                                f"copies, or delete them and put the .gz files there. {HOW_TO_GET}") from e
    try:
        return _read_splits(_extract(gz))
    except DataFileError:
        # our extraction of verified .gz files was damaged after it was written: extract again, once
        for f in MNIST_FILES:
            (_cache_folder() / f).unlink(missing_ok=True)
    try:
        return _read_splits(_extract(gz))
    except DataFileError as e:
        raise DataFileError(f"{who}: {param}: {e}, although extracted just now from the verified .gz files "
                            f"in {gz.resolve()}") from e
