"""3dshapes and dSprites as LightningDataModules ([S] Sec. 3.2, App. D): the real files, or
"3dshapes-like" / "dSprites-like" files generated offline with the exact factor grid.

**Batches** are tuples ``(x, factors)``: ``x`` float32 in [0, 1], (B, C, H, W) (C = 3 for
3dshapes, 1 for dSprites); ``factors`` int64 (B, n_factors), the *level indices* of each factor
in the (possibly subsampled) grid, ``0 .. factor_sizes[k] - 1``, in ``factor_names`` order.
``factor_names``, ``factor_sizes``, ``factor_values`` (the values of the kept levels) and
``image_shape`` (C, H, W) are set by the constructor (they depend only on its arguments);
the images are read by ``setup``. ``sample(n, generator)`` draws ``n`` grid points uniformly
(with replacement, as disentanglement_lib draws points for DCI); ``images_for(factors)`` gives
the images at given level indices. Training batches run over the whole grid (less ``val_size``
held-out points), reshuffled each epoch from ``seed``. Validation runs on the held-out points;
testing on them too, or, with ``val_size = 0``, on ``test_size`` grid points drawn uniformly
from their own seed (the grid is the population disentanglement is measured on, [S] App. D).
Neither draws from the training stream's generators, nor from torch's global one.

**Files.** The real files keep their names and layouts:

* ``3dshapes.h5``: ``images`` (480000, 64, 64, 3) uint8, ``labels`` (480000, 6) float64 (floor
  hue, wall hue, object hue in 0.0..0.9 step 0.1; scale linspace(0.75, 1.25, 8); shape 0..3 =
  cube, cylinder, sphere, capsule; orientation linspace(-30, 30, 15); floor hue slowest,
  orientation fastest). From https://github.com/deepmind/3d-shapes.
* ``dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz``: ``imgs`` (737280, 64, 64) uint8 0/1,
  ``latents_classes`` (737280, 6) int64, ``latents_values`` (737280, 6) float64 (colour (one
  level, dropped here as in disentanglement_lib), shape 1..3 = square, ellipse, heart, scale
  linspace(0.5, 1, 6), orientation linspace(0, 2 pi, 40), posX, posY linspace(0, 1, 32); posY
  fastest). From https://github.com/deepmind/dsprites-dataset.

Without the real file, ``generate=True`` renders a look-alike with the same layout and factor
values (datamodules/shapes_render.py) into ``data_dir`` (or, if ``data_dir`` is read-only, into
the cache folder ``$ZOO_CACHE`` / ``~/.cache/specialisation-zoo``, said in a log line and used
next time), named after its generator, version, resolution and kept levels
(``3dshapes-like_v1_64px_10x10x10x8x4x15.h5``, ...), written to a temporary
``<name>.part<pid>-...`` and renamed when complete (datamodules/files.py), so an interrupted run
leaves no half file under the cached name; parts of dead generators are removed by the next
``prepare_data``. A generated file stores a sha256 of its arrays (``content_sha256``, an h5
attribute or npz member), checked when it is first read (swapped or damaged chunks are an
error) and not again while its size, mtime and inode stay the same. Only the requested levels
and resolution are rendered, so a CPU run with ``resolution=32, subsample=2`` costs 1/4 x 1/48
of the full set. The loader is the same for both
kinds of file; it checks shapes, dtypes, and that the labels form the factor grid in order.
A real file at a lower ``resolution`` is area-averaged (the side must divide the file's).
Images are held in memory as uint8 (C, H, W): the full 3dshapes at 64 px takes 5.9 GB, at 32 px
1.5 GB.
"""
from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

from datamodules import shapes_render as render
from zoo.utils.extras import require
from datamodules.files import (ArrayHash, DataFileError, atomic_path, block_digests, cache_dir, checksum_block,
                               checksum_of, content_checksum, is_verified, mark_verified, remove_stale_parts,
                               writable_or_missing)

CHECKSUM_KEY = "content_sha256"
"""Where a generated file stores the checksum of its arrays (an h5 attribute, an npz member)."""

# subsample: None (the full grid); an int s (every s-th level of every factor: levels 0, s, 2s,
# ...); or a dict {factor name: stride (int) or list of level indices of the full grid}.
Subsample = int | dict[str, int | list[int]] | None


@dataclass(frozen=True)
class _Spec:
    """A data set's factor grid and files."""

    name: str  # the generator's name, "3dshapes-like"
    real_file: str
    url: str
    factor_names: tuple[str, ...]
    values: tuple[tuple[float, ...], ...]  # every level of every factor, in file order
    channels: int
    side: int  # the real file's image side


SHAPES3D = _Spec(
    "3dshapes-like", "3dshapes.h5", "https://github.com/deepmind/3d-shapes (3dshapes.h5)",
    ("floor_hue", "wall_hue", "object_hue", "scale", "shape", "orientation"),
    (tuple(np.round(np.arange(10) * 0.1, 10)),) * 3
    + (tuple(np.linspace(0.75, 1.25, 8)), (0.0, 1.0, 2.0, 3.0), tuple(np.linspace(-30, 30, 15))),
    channels=3, side=64)
DSPRITES = _Spec(
    "dsprites-like", "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz",
    "https://github.com/deepmind/dsprites-dataset (dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz)",
    ("shape", "scale", "orientation", "posX", "posY"),
    ((1.0, 2.0, 3.0), tuple(np.linspace(0.5, 1, 6)), tuple(np.linspace(0, 2 * np.pi, 40)),
     tuple(np.linspace(0, 1, 32)), tuple(np.linspace(0, 1, 32))),
    channels=1, side=64)


def _kept_levels(spec: _Spec, subsample: Subsample, who: str) -> list[list[int]]:
    """The level indices (of the full grid) kept per factor."""
    sizes = [len(v) for v in spec.values]
    allowed = (f"allowed: None, a positive integer stride, or a dict mapping factor names {list(spec.factor_names)} "
               "to a stride or a list of distinct level indices")
    if subsample is None:
        return [list(range(n)) for n in sizes]
    if isinstance(subsample, int) and not isinstance(subsample, bool):
        if subsample < 1:
            raise ValueError(f"{who}: subsample = {subsample!r}; {allowed}")
        return [list(range(0, n, subsample)) for n in sizes]
    if not isinstance(subsample, dict):
        raise ValueError(f"{who}: subsample = {subsample!r}; {allowed}")
    unknown = set(subsample) - set(spec.factor_names)
    if unknown:
        raise ValueError(f"{who}: subsample names unknown factors {sorted(unknown)}; {allowed}")
    kept = []
    for name, n in zip(spec.factor_names, sizes):
        s = subsample.get(name, 1)
        if isinstance(s, int) and not isinstance(s, bool) and s >= 1:
            kept.append(list(range(0, n, s)))
        elif (isinstance(s, (list, tuple)) and s and len(set(s)) == len(s)
              and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in s)):
            kept.append(sorted(s))
        else:
            raise ValueError(f"{who}: subsample[{name!r}] = {s!r}; allowed: a positive stride or a non-empty list "
                             f"of distinct level indices in 0..{n - 1}")
    return kept


def generated_name(spec: _Spec, resolution: int, kept: list[list[int]]) -> str:
    """The cache name of a generated file: generator, renderer version, resolution, grid sizes, and
    (when not the full grid) a hash of the kept levels."""
    sizes = "x".join(str(len(k)) for k in kept)
    full = all(k == list(range(len(v))) for k, v in zip(kept, spec.values))
    tag = "" if full else "_" + hashlib.sha1(repr(kept).encode()).hexdigest()[:8]
    ext = ".h5" if spec is SHAPES3D else ".npz"
    return f"{spec.name}_v{render.RENDER_VERSION}_{resolution}px_{sizes}{tag}{ext}"


# -- generation ---------------------------------------------------------------------------------------
def _pool(processes: int, initializer=None, initargs: tuple = ()) -> mp.pool.Pool:
    # fork: workers need only numpy and shapes_render, already imported (spawn would re-import Lightning)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
    return ctx.Pool(processes, initializer, initargs)


def _map(fn, jobs: list, processes: int) -> list:
    if processes <= 1 or len(jobs) <= 1:
        return [fn(*j) for j in jobs]
    with _pool(min(processes, len(jobs))) as pool:
        return pool.starmap(fn, jobs, chunksize=1)


_WEIGHTS: np.ndarray | None = None  # the geometries' region weights, shared with the worker processes


def _set_weights(weights: np.ndarray | None) -> None:
    global _WEIGHTS
    _WEIGHTS = weights


def _shapes3d_chunk(floor_hue: float, wall_hue: float, object_hues: list[float],
                    rows: int) -> list[tuple[bytes, bytes]]:
    """One (floor hue, wall hue) block: its HDF5 chunks, deflated, each with the sha256 of its
    images (hashed here, in the worker, so the parent never decompresses to checksum the file)."""
    obj = np.stack([render.hue_rgb(h) for h in object_hues])
    images = render.colourise(_WEIGHTS, render.hue_rgb(floor_hue), render.hue_rgb(wall_hue), obj)
    images = images.reshape(-1, *images.shape[2:])
    return list(zip(render.deflate_chunks(images, rows), block_digests(images, rows)))


def geometry_weights(scales: list[float], shapes: list[float], orientations: list[float], resolution: int,
                     processes: int) -> np.ndarray:
    """Region weights (G, 3, H, W) of every (scale, shape, orientation), orientation fastest,
    ray cast over ``processes`` processes."""
    geos = [(sc, int(sh), o, resolution) for sc in scales for sh in shapes for o in orientations]
    return np.stack(_map(render.render_geometry, geos, processes))


def generate_shapes3d(path: str | os.PathLike, resolution: int = 64, subsample: Subsample = None,
                      processes: int | None = None) -> Path:
    """Render a "3dshapes-like" file at ``path`` (the real file's h5 layout, the kept levels only).

    Work is spread over ``processes`` (default: all cores): the (scale, shape, orientation)
    geometries are ray cast in parallel, then each (floor hue, wall hue) block is coloured and
    deflate-compressed in parallel, and the parent writes the compressed chunks.
    """
    h5py = require("h5py", "shapes", "generate_shapes3d (3dshapes-like files, datamodules.shapes.Shapes3D)")

    kept = _kept_levels(SHAPES3D, subsample, "generate_shapes3d")
    _check_resolution(resolution, "generate_shapes3d")
    vals = [[SHAPES3D.values[k][i] for i in lv] for k, lv in enumerate(kept)]
    processes = _processes(processes)
    weights = geometry_weights(vals[3], vals[4], vals[5], resolution, processes)
    G, n_obj = weights.shape[0], len(vals[2])
    # HDF5 chunks of (shape x orientation) images (60 at 64 px: 720 KB), which tile every block
    rows = len(vals[4]) * len(vals[5])
    labels = np.array(np.meshgrid(*vals, indexing="ij"), dtype=np.float64).reshape(6, -1).T
    image_hash = ArrayHash("images", np.uint8, (labels.shape[0], resolution, resolution, 3), rows)
    label_hash = ArrayHash("labels", labels.dtype, labels.shape, rows)
    label_hash.update(labels)
    path = Path(path)
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs["generator"] = (f"{SHAPES3D.name} v{render.RENDER_VERSION}: not DeepMind's 3dshapes; "
                                    "datamodules/shapes_render.py")
            f.attrs["resolution"], f.attrs["kept_levels"] = resolution, repr(kept)
            dset = f.create_dataset("images", shape=(labels.shape[0], resolution, resolution, 3), dtype=np.uint8,
                                    chunks=(rows, resolution, resolution, 3), compression="gzip")
            f.create_dataset("labels", data=labels)
            jobs = [(fh, wh, vals[2], rows) for fh in vals[0] for wh in vals[1]]
            start = 0
            _set_weights(weights)  # sent once to each worker, not with every job
            pool = (_pool(min(processes, len(jobs)), _set_weights, (weights,)) if processes > 1 and len(jobs) > 1
                    else None)
            try:
                # blocks come back in order (imap holds only a few at a time); the parent only writes
                blocks = map(_star_shapes3d_chunk, jobs) if pool is None else pool.imap(_star_shapes3d_chunk, jobs)
                for chunks in blocks:
                    for b, digest in chunks:
                        dset.id.write_direct_chunk((start, 0, 0, 0), b)
                        image_hash.update_digest(digest, min(rows, labels.shape[0] - start))
                        start += rows
            finally:
                if pool is not None:
                    pool.close()
                    pool.join()
                _set_weights(None)
            assert start == labels.shape[0] == n_obj * G * len(vals[0]) * len(vals[1])
            f.attrs[CHECKSUM_KEY] = content_checksum([image_hash, label_hash])
    return path


def _star_shapes3d_chunk(job: tuple) -> list[bytes]:
    return _shapes3d_chunk(*job)


def generate_dsprites(path: str | os.PathLike, resolution: int = 64, subsample: Subsample = None,
                      processes: int | None = None) -> Path:
    """Render a "dSprites-like" file at ``path`` (the real file's npz layout, the kept levels only),
    one (shape, scale, orientation) at a time over ``processes`` (default: all cores)."""
    kept = _kept_levels(DSPRITES, subsample, "generate_dsprites")
    _check_resolution(resolution, "generate_dsprites")
    vals = [[DSPRITES.values[k][i] for i in lv] for k, lv in enumerate(kept)]
    jobs = [(int(sh) - 1, sc, o, np.array(vals[3]), np.array(vals[4]), resolution)
            for sh in vals[0] for sc in vals[1] for o in vals[2]]
    imgs = np.concatenate([m.reshape(-1, resolution, resolution)
                           for m in _map(render.render_sprites, jobs, _processes(processes))])
    # the real file's six columns: colour (one level, 1.0) first
    classes = np.array(np.meshgrid([0], *kept, indexing="ij")).reshape(6, -1).T.astype(np.int64)
    values = np.array(np.meshgrid([1.0], *vals, indexing="ij"), dtype=np.float64).reshape(6, -1).T
    arrays = {"imgs": imgs, "latents_classes": classes, "latents_values": values}
    path = Path(path)
    # a file object: np.savez would append ".npz" to a part name
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, **arrays, **{CHECKSUM_KEY: np.array(checksum_of(arrays))},
                            generator=np.array(f"{DSPRITES.name} v{render.RENDER_VERSION}: not DeepMind's dSprites; "
                                               f"resolution {resolution}, kept levels {kept}"))
    return path


def _processes(processes: int | None) -> int:
    if processes is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if isinstance(processes, bool) or int(processes) != processes or processes < 1:
        raise ValueError(f"processes = {processes!r}; allowed: None (all cores) or a positive integer")
    return int(processes)


def _check_resolution(resolution: int, who: str) -> None:
    if isinstance(resolution, bool) or int(resolution) != resolution or not 4 <= resolution <= 256:
        raise ValueError(f"{who}: resolution = {resolution!r}; allowed: an integer image side in 4..256 "
                         "(a divisor of the real file's 64 to use a real file)")


# -- reading ------------------------------------------------------------------------------------------
def _levels_of(spec: _Spec, labels: np.ndarray, path: Path) -> np.ndarray:
    """Level indices (n, K) of the full grid for each row's factor values (n, K)."""
    out = np.empty(labels.shape, dtype=np.int64)
    for k, v in enumerate(spec.values):
        v = np.asarray(v)
        idx = np.abs(labels[:, k, None] - v[None, :]).argmin(axis=1)
        # the real files store float32-rounded values: a small fraction of the level spacing
        tol = 1e-3 * (np.diff(v).min() if v.size > 1 else 1.0)
        bad = np.abs(labels[:, k] - v[idx]) > tol
        if bad.any():
            value = float(labels[bad.argmax(), k])
            raise DataFileError(f"{path}: factor {spec.factor_names[k]!r} holds value {value!r}, "
                                f"which is not one of its levels {np.round(v, 4).tolist()}: not a {spec.real_file} "
                                "layout, or a corrupt file")
        out[:, k] = idx
    return out


def _grid_rows(spec: _Spec, levels: np.ndarray, kept: list[list[int]], path: Path) -> np.ndarray:
    """Rows of the file that hold the kept grid, in grid order; checks the file is a grid in order."""
    present = [np.unique(levels[:, k]) for k in range(levels.shape[1])]
    sizes = [p.size for p in present]
    rank = [np.searchsorted(p, levels[:, k]) for k, p in enumerate(present)]
    flat = np.ravel_multi_index(rank, sizes)
    if levels.shape[0] != math.prod(sizes) or not np.array_equal(flat, np.arange(levels.shape[0])):
        raise DataFileError(f"{path}: the labels are not the full factor grid in order (first factor slowest): "
                            f"{levels.shape[0]} rows, levels per factor {sizes}; corrupt or not a "
                            f"{spec.real_file} layout")
    for k, (p, want) in enumerate(zip(present, kept)):
        missing = sorted(set(want) - set(p.tolist()))
        if missing:
            raise DataFileError(f"{path} lacks levels {missing} of factor {spec.factor_names[k]!r} (it holds "
                                f"{p.tolist()}): generated with another subsample; ask for a subsample within it, "
                                "or point data_dir elsewhere to generate this one")
    mask = np.ones(levels.shape[0], bool)
    for k, want in enumerate(kept):
        mask &= np.isin(levels[:, k], want)
    return np.nonzero(mask)[0]


def _to_resolution(images: np.ndarray, resolution: int) -> np.ndarray:
    """(n, H, W, C) uint8 -> (n, C, res, res) uint8, area-averaged by H // res."""
    n, H, W, C = images.shape
    if H != resolution:
        f = H // resolution
        images = np.rint(images.reshape(n, resolution, f, resolution, f, C).mean(axis=(2, 4))).astype(np.uint8)
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2))


def _check_side(H: int, resolution: int, path: Path) -> None:
    if H % resolution or resolution > H:
        raise ValueError(f"resolution = {resolution}: {path} holds {H}x{H} images; allowed: a divisor of {H}")


def read_shapes3d(path: Path, kept: list[list[int]], resolution: int) -> np.ndarray:
    """The kept grid of a 3dshapes-layout h5 file, (n, 3, res, res) uint8 in grid order."""
    h5py = require("h5py", "shapes", "read_shapes3d (3dshapes files, datamodules.shapes.Shapes3D)")

    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataFileError(f"{path} is not a readable HDF5 file ({e}); corrupt or truncated? Delete it and "
                            "get it again (or generate it again)") from e
    with f:
        if "images" not in f or "labels" not in f:
            raise DataFileError(f"{path}: expected datasets 'images' and 'labels', found {sorted(f.keys())}")
        im, lab = f["images"], f["labels"]
        n = im.shape[0]
        if (im.ndim != 4 or im.shape[3] != 3 or im.shape[1] != im.shape[2] or im.dtype != np.uint8
                or lab.shape != (n, 6) or lab.dtype.kind != "f"):
            raise DataFileError(f"{path}: images {im.shape} {im.dtype}, labels {lab.shape} {lab.dtype}; expected "
                                "images (n, H, H, 3) uint8 and labels (n, 6) float (3dshapes: (480000, 64, 64, 3))")
        _check_side(im.shape[1], resolution, path)
        labels = lab[:]
        rows = _grid_rows(SHAPES3D, _levels_of(SHAPES3D, labels, path), kept, path)
        checksum = _stored_checksum(path, f.attrs.get(CHECKSUM_KEY), "generator" in f.attrs)
        hashes = None
        if checksum is not None:  # every block is read, for the hash
            cb = checksum_block(checksum)
            hashes = [ArrayHash("images", im.dtype, im.shape, cb), ArrayHash("labels", labels.dtype, labels.shape, cb)]
            hashes[1].update(labels)
        out = np.empty((rows.size, 3, resolution, resolution), np.uint8)
        block = max(1, (1 << 26) // (im.shape[1] ** 2 * 3))  # ~64 MB of the file at a time
        if hashes is not None:
            block = max(cb, block // cb * cb)  # whole hash blocks
        done = 0
        try:
            for a in range(0, n, block):
                sel = rows[(rows >= a) & (rows < a + block)]
                if sel.size or hashes is not None:
                    part = im[a:min(n, a + block)]
                    if hashes is not None:
                        hashes[0].update(part)
                    if sel.size:
                        out[done:done + sel.size] = _to_resolution(part[sel - a], resolution)
                        done += sel.size
        except OSError as e:  # truncated or corrupt chunks surface when read
            raise DataFileError(f"{path}: reading images failed ({e}); corrupt or truncated. Delete it and get "
                                "it again (or generate it again)") from e
    if hashes is not None:
        _check_content(path, checksum, content_checksum(hashes))
    return out


def _stored_checksum(path: Path, stored: object, generated: bool) -> str | None:
    """The checksum to verify ``path`` against: None for a real file (it has none), or for a file
    already verified as it is now."""
    if stored is None:
        if generated:
            rank_zero_warn(f"{path} was generated before files carried a checksum of their content, so it cannot "
                           "be verified; delete it to have it generated again with one")
        return None
    checksum = stored.item() if isinstance(stored, np.ndarray) else stored
    checksum = checksum.decode() if isinstance(checksum, bytes) else str(checksum)
    checksum_block(checksum)  # well-formed
    return None if is_verified(path, checksum) else checksum


def _check_content(path: Path, stored: str, computed: str) -> None:
    if computed != stored:
        raise DataFileError(f"{path}: its content does not match the checksum stored when it was generated "
                            f"({stored}, now {computed}): the file was corrupted or modified. Delete it; "
                            "generate=True renders it again")
    mark_verified(path, stored)


def read_dsprites(path: Path, kept: list[list[int]], resolution: int) -> np.ndarray:
    """The kept grid of a dSprites-layout npz file, (n, 1, res, res) uint8 0..255 in grid order."""
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as z:
            missing = {"imgs", "latents_classes", "latents_values"} - set(z.files)
            if missing:
                raise DataFileError(f"{path}: missing arrays {sorted(missing)} (found {z.files}); not a dSprites "
                                    "layout")
            imgs, classes, values = z["imgs"], z["latents_classes"], z["latents_values"]
            checksum = _stored_checksum(path, z[CHECKSUM_KEY] if CHECKSUM_KEY in z.files else None,
                                        "generator" in z.files)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DataFileError(f"{path} is not a readable npz file ({e}); corrupt or truncated? Delete it and get "
                            "it again (or generate it again)") from e
    n = imgs.shape[0]
    if (imgs.ndim != 3 or imgs.shape[1] != imgs.shape[2] or imgs.dtype != np.uint8 or classes.shape != (n, 6)
            or classes.dtype.kind not in "iu" or values.shape != (n, 6) or values.dtype.kind != "f"):
        raise DataFileError(f"{path}: imgs {imgs.shape} {imgs.dtype}, latents_classes {classes.shape} "
                            f"{classes.dtype}, latents_values {values.shape} {values.dtype}; expected (n, H, H) uint8, "
                            "(n, 6) int, (n, 6) float (dSprites: (737280, 64, 64))")
    if checksum is not None:
        arrays = {"imgs": imgs, "latents_classes": classes, "latents_values": values}
        _check_content(path, checksum, checksum_of(arrays, checksum_block(checksum)))
    if imgs.max(initial=0) > 1:
        raise DataFileError(f"{path}: imgs holds values up to {imgs.max()}; dSprites images are 0/1")
    _check_side(imgs.shape[1], resolution, path)
    levels = _levels_of(DSPRITES, values[:, 1:], path)  # column 0 is the constant colour
    if not np.array_equal(levels, classes[:, 1:]):
        raise DataFileError(f"{path}: latents_classes disagree with latents_values; corrupt file")
    rows = _grid_rows(DSPRITES, levels, kept, path)
    return _to_resolution(imgs[rows, :, :, None] * np.uint8(255), resolution)


# -- the datamodules ------------------------------------------------------------------------------------
class _Batches(Dataset):
    """Items are whole batches: ``dataset[list of grid indices] -> (x, factors)``."""

    def __init__(self, dm: "_FactorImages", index: Tensor) -> None:
        self.dm, self.index = dm, index

    def __len__(self) -> int:
        return self.index.numel()

    def __getitem__(self, i: list[int]) -> tuple[Tensor, Tensor]:
        flat = self.index[torch.as_tensor(i, dtype=torch.long)]
        return self.dm._x(flat), self.dm._factors(flat)


class _FactorImages(pl.LightningDataModule):
    """Common part of Shapes3D and DSprites (see the module docstring)."""

    spec: _Spec

    def __init__(self, data_dir: str = "data", path: str | None = None, generate: bool = False,
                 resolution: int = 64, subsample: Subsample = None, batch_size: int = 64, seed: int = 0,
                 num_workers: int = 0, val_size: int = 0, test_size: int = 1000, processes: int | None = None) -> None:
        super().__init__()
        who = type(self).__name__
        _check_resolution(resolution, who)
        for arg, value, low in (("batch_size", batch_size, 1), ("num_workers", num_workers, 0),
                                ("val_size", val_size, 0), ("test_size", test_size, 1)):
            if isinstance(value, bool) or int(value) != value or value < low:
                raise ValueError(f"{who}: {arg} = {value!r}; allowed: an integer >= {low}")
        if processes is not None:
            _processes(processes)
        self.kept = _kept_levels(self.spec, subsample, who)
        self.factor_names: list[str] = list(self.spec.factor_names)
        self.factor_sizes: list[int] = [len(k) for k in self.kept]
        self.factor_values: list[list[float]] = [[float(self.spec.values[f][i]) for i in lv]
                                                 for f, lv in enumerate(self.kept)]
        self.image_shape: tuple[int, int, int] = (self.spec.channels, int(resolution), int(resolution))
        self.num_points = math.prod(self.factor_sizes)
        if val_size >= self.num_points:
            raise ValueError(f"{who}: val_size = {val_size} leaves no training points of the {self.num_points}")
        self.save_hyperparameters(logger=False)
        self.data_dir, self.path, self.generate = data_dir, path, bool(generate)
        self.resolution, self.batch_size, self.seed = int(resolution), int(batch_size), int(seed)
        self.num_workers, self.val_size, self.processes = int(num_workers), int(val_size), processes
        self.test_size = int(test_size)
        self._images: Tensor | None = None  # (N, C, H, W) uint8, grid order
        self._strides = torch.tensor([math.prod(self.factor_sizes[k + 1:]) for k in range(len(self.factor_sizes))])
        self._sizes = torch.tensor(self.factor_sizes)
        self._sample_generator = torch.Generator().manual_seed(self.seed)
        perm = torch.randperm(self.num_points, generator=torch.Generator().manual_seed(self.seed + 1))
        self._val_index, self._train_index = perm[:self.val_size].sort().values, perm[self.val_size:].sort().values

    # -- which file ---------------------------------------------------------------------------------------
    @property
    def _where(self) -> str:
        """The parameter that says where the file is, for error messages."""
        return f"path = {self.path!r}" if self.path is not None else f"data_dir = {self.data_dir!r}"

    @property
    def generated_path(self) -> Path:
        """Where the generated file for these arguments is, or will be written: ``data_dir``, or,
        when ``data_dir`` is read-only (and the file not already there), the cache folder."""
        name = generated_name(self.spec, self.resolution, self.kept)
        here = Path(self.data_dir).expanduser() / name
        if here.is_file() or writable_or_missing(here.parent):
            return here
        return cache_dir("generated") / name

    def file(self) -> tuple[Path, bool]:
        """The file to read and whether it is (to be) generated: ``path``; else ``data_dir``'s real
        file; else, with ``generate``, the generated file. A clear error otherwise."""
        who = type(self).__name__
        if self.path is not None:
            p = Path(self.path).expanduser()
            if not p.is_file():
                raise FileNotFoundError(f"{who}: path = {str(p)!r} does not exist. Get the real file from "
                                        f"{self.spec.url}, or leave path unset and pass generate=True to render a "
                                        f"{self.spec.name} file into data_dir.")
            return p, False
        real = Path(self.data_dir).expanduser() / self.spec.real_file
        if real.is_file():
            return real, False
        if self.generate:
            return self.generated_path, True
        absent = "" if real.parent.is_dir() else "; that folder does not exist"
        raise FileNotFoundError(
            f"{who}: {self._where}: no {self.spec.real_file} in {real.parent.resolve()} (looked for {real.resolve()}"
            f"{absent}). Get it from {self.spec.url} and put it there (or pass path=...), or pass generate=True to "
            f"render a {self.spec.name} file (the same factor grid and layout; not the original images) into "
            f"data_dir (or the cache, if data_dir is read-only) as "
            f"{generated_name(self.spec, self.resolution, self.kept)}.")

    def prepare_data(self) -> None:
        p, generated = self.file()
        if not generated:
            return
        who, data_dir = type(self).__name__, Path(self.data_dir).expanduser()
        # parts left by killed generators, where this one writes (never in a read-only data_dir)
        for folder in {p.parent, *([data_dir] if writable_or_missing(data_dir) else [])}:
            for stale in remove_stale_parts(folder, prefix=self.spec.name):
                rank_zero_info(f"{who}: removed {stale}, left by a generator that died")
        in_cache = p.parent != data_dir
        if p.is_file():
            if in_cache:
                rank_zero_info(f"{who}: using {p} from the cache ({self._where} is read-only)")
            return
        if in_cache:
            rank_zero_info(f"{who}: {self._where} is read-only: generating {p.name} into the cache {p.parent} "
                           "(ZOO_CACHE chooses it); later runs use it from there")
        p.parent.mkdir(parents=True, exist_ok=True)
        self._generate(p)

    def _generate(self, path: Path) -> None:
        raise NotImplementedError

    def _read(self, path: Path) -> np.ndarray:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self._images is not None:
            return
        who = type(self).__name__
        p, generated = self.file()
        if generated and not p.is_file():
            raise FileNotFoundError(f"{who}: {self._where}: {p} is not there yet; call prepare_data() first "
                                    "(the Trainer does)")
        try:
            images = self._read(p)
        except DataFileError as e:
            raise DataFileError(f"{who}: {self._where}: {e}") from e
        if images.shape != (self.num_points, *self.image_shape):
            raise DataFileError(f"{who}: {self._where}: {p}: read {images.shape}, expected "
                                f"{(self.num_points, *self.image_shape)}")
        self._images = torch.from_numpy(images)

    @property
    def images(self) -> Tensor:
        """All images of the kept grid, (N, C, H, W) uint8 in grid order (after ``setup``)."""
        if self._images is None:
            raise RuntimeError(f"{type(self).__name__}: call prepare_data() and setup() first")
        return self._images

    # -- indices ------------------------------------------------------------------------------------------
    def _factors(self, flat: Tensor) -> Tensor:
        return (flat[:, None] // self._strides) % self._sizes

    def _x(self, flat: Tensor) -> Tensor:
        return self.images[flat].float().div_(255.0)

    def flat_index(self, factors: Tensor) -> Tensor:
        """Grid positions (n,) of level indices (n, K)."""
        factors = torch.as_tensor(factors)
        if factors.dim() != 2 or factors.shape[1] != len(self.factor_sizes) or factors.dtype.is_floating_point:
            raise ValueError(f"{type(self).__name__}: factors {tuple(factors.shape)} {factors.dtype}; allowed: "
                             f"integer level indices (n, {len(self.factor_sizes)})")
        f = factors.long().cpu()
        if bool(((f < 0) | (f >= self._sizes)).any()):
            raise ValueError(f"{type(self).__name__}: factor levels out of range; sizes {self.factor_sizes}")
        return (f * self._strides).sum(dim=1)

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``n`` points drawn uniformly from the factor grid (with replacement, each factor's level
        independently): (x (n, C, H, W) float32 in [0, 1], factors (n, K) int64). Without a
        ``generator``, the datamodule's own (seeded with ``seed``, advancing with each call)."""
        if isinstance(n, bool) or int(n) != n or n < 1:
            raise ValueError(f"{type(self).__name__}.sample: n = {n!r}; allowed: a positive integer")
        g = self._sample_generator if generator is None else generator
        factors = torch.stack([torch.randint(0, s, (int(n),), generator=g) for s in self.factor_sizes], dim=1)
        return self.images_for(factors), factors

    def images_for(self, factors: Tensor) -> Tensor:
        """The images (n, C, H, W) float32 in [0, 1] at level indices ``factors`` (n, K) int64."""
        return self._x(self.flat_index(factors))

    # -- loaders ------------------------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        from datamodules.resumable import ResumableLoader, shuffled_batches

        # resumable: a mid-epoch checkpoint continues this epoch's permutation (datamodules.resumable)
        g = torch.Generator().manual_seed(self.seed + 2)
        sampler = shuffled_batches(self._train_index.numel(), self.batch_size, g)
        return ResumableLoader(_Batches(self, self._train_index), sampler=sampler, batch_size=None,
                               num_workers=self.num_workers)

    def _fixed_batches(self, index: Tensor) -> DataLoader:
        sampler = BatchSampler(SequentialSampler(range(index.numel())), self.batch_size, drop_last=False)
        # a generator of its own: each iterator draws a base seed, and from the global generator that
        # would shift what training draws after a validation (the VAE takes its noise from there)
        return DataLoader(_Batches(self, index), sampler=sampler, batch_size=None, num_workers=self.num_workers,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader | list:
        if self.val_size == 0:
            return []  # no validation
        return self._fixed_batches(self._val_index)

    def test_dataloader(self) -> DataLoader:
        """The held-out points, or (``val_size = 0``) ``test_size`` grid points drawn with seed ``seed + 3``."""
        if self.val_size:
            return self._fixed_batches(self._val_index)
        g = torch.Generator().manual_seed(self.seed + 3)
        return self._fixed_batches(torch.randint(self.num_points, (self.test_size,), generator=g))


class Shapes3D(_FactorImages):
    """3dshapes (Burgess & Kim 2018), as [S] Sec. 3.2 / App. D train the beta-VAE on: floor hue,
    wall hue, object hue (10 levels each), scale (8), shape (4), orientation (15); 480,000
    images 64x64x3. Batches ``(x (B, 3, H, W) float32 in [0, 1], factors (B, 6) int64)``.

    Args:
        data_dir: folder searched for ``3dshapes.h5`` and where generated files are cached (only
            read if it is read-only: generated files then go to the cache folder).
        path: the real ``3dshapes.h5`` elsewhere (then it must exist).
        generate: without a real file, generate (or reuse the cached) "3dshapes-like" file.
        resolution: image side: 64, or a divisor of it for the real file (area-averaged); the
            generator renders any side in 4..256.
        subsample: a subset of levels per factor keeping the grid structure: an int stride for
            every factor, or ``{factor name: stride or list of level indices}``.
        batch_size: training batch size.
        seed: seed of the shuffling, of the validation split and of ``sample``'s default generator.
        num_workers: DataLoader workers.
        val_size: grid points held out for validation and testing (a seeded random subset; 0: no validation).
        test_size: with ``val_size = 0``, the grid points drawn (seed ``seed + 3``) to test on.
        processes: worker processes for generation (default: all cores).
    """

    spec = SHAPES3D

    def _generate(self, path: Path) -> None:
        generate_shapes3d(path, self.resolution, self.hparams.subsample, self.processes)

    def _read(self, path: Path) -> np.ndarray:
        return read_shapes3d(path, self.kept, self.resolution)


class DSprites(_FactorImages):
    """dSprites (Matthey et al. 2017): shape (3: square, ellipse, heart), scale (6), orientation
    (40), posX, posY (32 each); 737,280 binary images 64x64; the constant colour factor is
    dropped, as in disentanglement_lib. Batches ``(x (B, 1, H, W) float32 in [0, 1], factors
    (B, 5) int64)``. Arguments as ``Shapes3D`` (real file
    ``dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz``; generated "dSprites-like")."""

    spec = DSPRITES

    def _generate(self, path: Path) -> None:
        generate_dsprites(path, self.resolution, self.hparams.subsample, self.processes)

    def _read(self, path: Path) -> np.ndarray:
        return read_dsprites(path, self.kept, self.resolution)
