"""3dshapes / dSprites datamodules (datamodules/shapes.py): the generators' factor grids, the
readers on real-layout files written here, clear errors, and the batch interface."""
from __future__ import annotations

import itertools
import math

import h5py
import lightning.pytorch as pl
from helpers_fit import fit
import numpy as np
import pytest
import torch

from datamodules.shapes import DSPRITES, SHAPES3D, DSprites, Shapes3D, generate_dsprites, generate_shapes3d

# tiny grids: two or three levels per factor (extremes included), 8-16 px images
SUB3D = {"floor_hue": [0, 9], "wall_hue": [0, 5], "object_hue": [2, 7], "scale": [0, 7], "orientation": [0, 7, 14]}
SUBDS = {"scale": [0, 5], "orientation": [0, 10], "posX": [0, 31], "posY": [0, 16]}


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory):
    """One generated tiny 3dshapes-like and dSprites-like file, shared by the tests below."""
    d = tmp_path_factory.mktemp("shapes")
    Shapes3D(str(d), generate=True, resolution=16, subsample=SUB3D, processes=2).prepare_data()
    DSprites(str(d), generate=True, resolution=16, subsample=SUBDS, processes=2).prepare_data()
    return d


def test_factor_grids_are_the_real_ones():
    # DESIGN.md "Data", written out independently of the module's own construction
    assert SHAPES3D.factor_names == ("floor_hue", "wall_hue", "object_hue", "scale", "shape", "orientation")
    for k in range(3):
        np.testing.assert_allclose(SHAPES3D.values[k], [i / 10 for i in range(10)], atol=1e-12)
    np.testing.assert_allclose(SHAPES3D.values[3], 0.75 + np.arange(8) * 0.5 / 7, atol=1e-12)
    assert SHAPES3D.values[4] == (0.0, 1.0, 2.0, 3.0)
    np.testing.assert_allclose(SHAPES3D.values[5], -30 + np.arange(15) * 60 / 14, atol=1e-12)
    assert math.prod(len(v) for v in SHAPES3D.values) == 480_000
    assert DSPRITES.factor_names == ("shape", "scale", "orientation", "posX", "posY")
    np.testing.assert_allclose(DSPRITES.values[1], 0.5 + np.arange(6) * 0.1, atol=1e-12)
    np.testing.assert_allclose(DSPRITES.values[2], np.arange(40) * 2 * np.pi / 39, atol=1e-12)
    np.testing.assert_allclose(DSPRITES.values[3], np.arange(32) / 31, atol=1e-12)
    assert math.prod(len(v) for v in DSPRITES.values) * 1 == 737_280  # colour: one level
    dm = Shapes3D("unused", resolution=32)
    assert dm.factor_sizes == [10, 10, 10, 8, 4, 15] and dm.image_shape == (3, 32, 32)
    assert DSprites("unused", subsample=2).factor_sizes == [2, 3, 20, 16, 16]


def test_generated_3dshapes_file_is_the_grid(shapes_dir):
    dm = Shapes3D(str(shapes_dir), generate=True, resolution=16, subsample=SUB3D)
    with h5py.File(dm.generated_path, "r") as f:
        images, labels = f["images"][:], f["labels"][:]
    want_values = [[SHAPES3D.values[k][i] for i in SUB3D.get(name, range(4))]
                   for k, name in enumerate(SHAPES3D.factor_names)]
    # every combination once, floor hue slowest and orientation fastest, as in the real file
    np.testing.assert_array_equal(labels, np.array(list(itertools.product(*want_values))))
    assert labels.dtype == np.float64 and images.dtype == np.uint8
    assert images.shape == (2 * 2 * 2 * 2 * 4 * 3, 16, 16, 3)


def test_generated_dsprites_file_is_the_grid(shapes_dir):
    dm = DSprites(str(shapes_dir), generate=True, resolution=16, subsample=SUBDS)
    with np.load(dm.generated_path) as z:
        imgs, classes, values = z["imgs"], z["latents_classes"], z["latents_values"]
    kept = [[0], [0, 1, 2]] + [SUBDS[n] for n in ("scale", "orientation", "posX", "posY")]
    np.testing.assert_array_equal(classes, np.array(list(itertools.product(*kept))))
    want = [[1.0], [1.0, 2.0, 3.0]] + [[DSPRITES.values[k][i] for i in kept[k + 1]] for k in range(1, 5)]
    np.testing.assert_array_equal(values, np.array(list(itertools.product(*want))))
    assert imgs.shape == (3 * 2 * 2 * 2 * 2, 16, 16) and imgs.dtype == np.uint8
    assert set(np.unique(imgs)) == {0, 1}  # binary, like the real sprites


@pytest.mark.parametrize("cls, sub", [(Shapes3D, SUB3D), (DSprites, SUBDS)])
def test_images_change_with_every_factor(shapes_dir, cls, sub):
    dm = cls(str(shapes_dir), generate=True, resolution=16, subsample=sub)
    dm.setup("fit")
    grid = dm.images.float().reshape(*dm.factor_sizes, -1) / 255
    for k, name in enumerate(dm.factor_names):
        means = grid.movedim(k, 0).reshape(dm.factor_sizes[k], -1, grid.shape[-1]).mean(dim=1)
        for a, b in itertools.combinations(range(dm.factor_sizes[k]), 2):
            # distinct mean images: differ somewhere by more than 2 grey levels of 255
            assert (means[a] - means[b]).abs().max() > 2 / 255, (name, a, b)


def test_parallel_generation_matches_one_process(shapes_dir, tmp_path):
    sub = {"floor_hue": [3], "wall_hue": [0, 5], "object_hue": [1], "scale": [2], "orientation": [0, 14]}
    one, two = generate_shapes3d(tmp_path / "a.h5", 8, sub, 1), generate_shapes3d(tmp_path / "b.h5", 8, sub, 2)
    with h5py.File(one, "r") as a, h5py.File(two, "r") as b:
        np.testing.assert_array_equal(a["images"][:], b["images"][:])
    subd = {"scale": [5], "orientation": [3, 9], "posX": [0, 9], "posY": [30]}
    one, two = generate_dsprites(tmp_path / "a.npz", 8, subd, 1), generate_dsprites(tmp_path / "b.npz", 8, subd, 2)
    with np.load(one) as a, np.load(two) as b:
        np.testing.assert_array_equal(a["imgs"], b["imgs"])


# -- real-layout files written here ------------------------------------------------------------------------
# a tiny sub-grid with fake images, labels float32-rounded as a file written from float32 would be
REAL3D_SUB = {"floor_hue": [0, 1], "wall_hue": [4], "object_hue": [5, 9], "scale": [0], "orientation": [0, 14]}


def write_real_3dshapes(path, side: int = 8) -> tuple[np.ndarray, np.ndarray]:
    vals = [[SHAPES3D.values[k][i] for i in REAL3D_SUB.get(n, range(4))] for k, n in enumerate(SHAPES3D.factor_names)]
    labels = np.array(list(itertools.product(*vals))).astype(np.float32).astype(np.float64)
    images = np.random.default_rng(0).integers(0, 256, (labels.shape[0], side, side, 3), dtype=np.uint8)
    with h5py.File(path, "w") as f:
        f["images"], f["labels"] = images, labels
    return images, labels


def test_real_3dshapes_file_read_back(tmp_path):
    images, _ = write_real_3dshapes(tmp_path / "3dshapes.h5")
    dm = Shapes3D(str(tmp_path), resolution=8, subsample=REAL3D_SUB, batch_size=5)
    dm.prepare_data()
    dm.setup("fit")
    torch.testing.assert_close(dm.images, torch.from_numpy(images).permute(0, 3, 1, 2), rtol=0, atol=0)
    # a batch's factors index the images it holds
    x, f = next(iter(dm.train_dataloader()))
    torch.testing.assert_close(x, dm.images_for(f), rtol=0, atol=0)
    flat = (f * torch.tensor([16, 16, 8, 8, 2, 1])).sum(1)  # strides of sizes (2, 1, 2, 1, 4, 2)
    torch.testing.assert_close(x, torch.from_numpy(images).permute(0, 3, 1, 2)[flat].float() / 255)
    # half the resolution: 2x2 area averages, rounded to uint8
    small = Shapes3D(str(tmp_path), resolution=4, subsample=REAL3D_SUB)
    small.setup("fit")
    want = np.rint(images.reshape(-1, 4, 2, 4, 2, 3).mean(axis=(2, 4))).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(small.images.numpy(), want)
    # only part of the file's grid: the rows of the kept levels, in grid order
    part = Shapes3D(str(tmp_path), resolution=8, subsample={**REAL3D_SUB, "object_hue": [9]})
    part.setup("fit")
    np.testing.assert_array_equal(part.images.numpy(), images.reshape(2, 2, 8, 8, 8, 3)[:, 1].reshape(-1, 8, 8, 3)
                                  .transpose(0, 3, 1, 2))


def test_real_dsprites_file_read_back(tmp_path):
    kept = [[0], [0, 2], [3], [0, 39], [1, 2], [31]]
    classes = np.array(list(itertools.product(*kept)), dtype=np.int64)
    values = np.array(list(itertools.product([1.0], *[[DSPRITES.values[k][i] for i in kept[k + 1]]
                                                      for k in range(5)])))
    imgs = np.random.default_rng(1).integers(0, 2, (classes.shape[0], 8, 8), dtype=np.uint8)
    path = tmp_path / "elsewhere.npz"
    np.savez_compressed(path, imgs=imgs, latents_classes=classes, latents_values=values)
    sub = {"shape": [0, 2], "scale": [3], "orientation": [0, 39], "posX": [1, 2], "posY": [31]}
    dm = DSprites(str(tmp_path / "nothing_here"), path=str(path), resolution=8, subsample=sub)
    dm.setup("fit")
    np.testing.assert_array_equal(dm.images.numpy(), imgs[:, None] * 255)
    x, f = dm.sample(6, torch.Generator().manual_seed(0))
    assert x.shape == (6, 1, 8, 8) and f.dtype == torch.int64
    np.testing.assert_array_equal(x.numpy()[:, 0], imgs[(f * torch.tensor([4, 4, 2, 1, 1])).sum(1).numpy()])


# -- errors ---------------------------------------------------------------------------------------------------
def test_missing_file_says_where_and_how(tmp_path):
    dm = Shapes3D(str(tmp_path), resolution=8)
    with pytest.raises(FileNotFoundError, match=r"3dshapes\.h5.*generate=True") as e:
        dm.prepare_data()
    assert str(tmp_path.resolve()) in str(e.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DSprites(str(tmp_path), path=str(tmp_path / "d.npz")).prepare_data()


def test_corrupt_files_are_reported(tmp_path):
    (tmp_path / "3dshapes.h5").write_bytes(b"not an hdf5 file" * 100)
    with pytest.raises(RuntimeError, match="3dshapes.h5.*corrupt"):
        Shapes3D(str(tmp_path), resolution=8).setup("fit")
    # wrong dtype
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f["images"], f["labels"] = np.zeros((4, 8, 8, 3), np.float32), np.zeros((4, 6))
    with pytest.raises(RuntimeError, match="uint8"):
        Shapes3D(str(tmp_path), path=str(bad), resolution=8).setup("fit")
    # rows out of grid order
    images, labels = write_real_3dshapes(tmp_path / "shuffled.h5")
    with h5py.File(tmp_path / "shuffled.h5", "r+") as f:
        f["labels"][...] = labels[::-1]
    with pytest.raises(RuntimeError, match="not the full factor grid in order"):
        Shapes3D(str(tmp_path), path=str(tmp_path / "shuffled.h5"), resolution=8, subsample=REAL3D_SUB).setup("fit")
    # a value that is no level of its factor
    with h5py.File(tmp_path / "shuffled.h5", "r+") as f:
        f["labels"][0, 3] = 0.8
    with pytest.raises(RuntimeError, match="'scale' holds value 0.8"):
        Shapes3D(str(tmp_path), path=str(tmp_path / "shuffled.h5"), resolution=8, subsample=REAL3D_SUB).setup("fit")
    # a truncated npz
    good = tmp_path / "d.npz"
    np.savez_compressed(good, imgs=np.zeros((3, 8, 8), np.uint8), latents_classes=np.zeros((3, 6), np.int64),
                        latents_values=np.zeros((3, 6)))
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    with pytest.raises(RuntimeError, match="d.npz.*corrupt or truncated"):
        DSprites(str(tmp_path), path=str(good), resolution=8).setup("fit")


def test_resolution_must_divide_the_file(tmp_path):
    write_real_3dshapes(tmp_path / "3dshapes.h5")
    with pytest.raises(ValueError, match="resolution = 6.*divisor of 8"):
        Shapes3D(str(tmp_path), resolution=6, subsample=REAL3D_SUB).setup("fit")


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="subsample = 0"):
        Shapes3D(subsample=0)
    with pytest.raises(ValueError, match=r"unknown factors \['hue'\]"):
        Shapes3D(subsample={"hue": 2})
    with pytest.raises(ValueError, match=r"subsample\['posX'\].*0\.\.31"):
        DSprites(subsample={"posX": [0, 32]})
    with pytest.raises(ValueError, match="resolution"):
        DSprites(resolution=0)
    with pytest.raises(ValueError, match="batch_size"):
        DSprites(batch_size=0)
    with pytest.raises(ValueError, match="val_size"):
        DSprites(subsample=40, val_size=6)  # a 3 x 1 x 1 x 1 x 1 grid
    dm = DSprites(subsample=40)
    with pytest.raises(ValueError, match=r"level indices \(n, 5\)"):
        dm.flat_index(torch.zeros(2, 4, dtype=torch.long))


def test_cached_and_user_files_are_never_overwritten(shapes_dir, tmp_path):
    dm = Shapes3D(str(shapes_dir), generate=True, resolution=16, subsample=SUB3D)
    p = dm.generated_path
    before = (p.stat().st_mtime_ns, p.read_bytes())
    dm.prepare_data()  # cached: not generated again
    assert (p.stat().st_mtime_ns, p.read_bytes()) == before
    # a corrupt file under the cached name is reported, not replaced
    user = tmp_path / p.name
    user.write_bytes(b"mine")
    dm2 = Shapes3D(str(tmp_path), generate=True, resolution=16, subsample=SUB3D)
    dm2.prepare_data()
    with pytest.raises(RuntimeError, match="corrupt"):
        dm2.setup("fit")
    assert user.read_bytes() == b"mine"
    # a real file in data_dir wins over generating, and is only read
    write_real_3dshapes(tmp_path / "3dshapes.h5")
    before = (tmp_path / "3dshapes.h5").read_bytes()
    dm3 = Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=REAL3D_SUB)
    dm3.prepare_data()
    dm3.setup("fit")
    assert (tmp_path / "3dshapes.h5").read_bytes() == before
    assert not list(tmp_path.glob("3dshapes-like*8px*"))


# -- the interface the beta-VAE trains on ---------------------------------------------------------------------
class _Probe(pl.LightningModule):
    """Checks every batch against the documented interface."""

    def __init__(self, dm) -> None:
        super().__init__()
        self.dm, self.w, self.seen = dm, torch.nn.Parameter(torch.zeros(())), []

    def training_step(self, batch, i):
        x, f = batch
        assert x.dtype == torch.float32 and x.shape[1:] == self.dm.image_shape and 0 <= x.min() and x.max() <= 1
        assert f.dtype == torch.int64 and f.shape == (x.shape[0], len(self.dm.factor_sizes))
        assert bool((f < torch.tensor(self.dm.factor_sizes)).all()) and bool((f >= 0).all())
        torch.testing.assert_close(x, self.dm.images_for(f), rtol=0, atol=0)
        self.seen.append(f)
        return (self.w * x.mean()) ** 2

    def validation_step(self, batch, i):
        self.seen_val = True

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_epoch_covers_the_training_grid(shapes_dir):
    dm = DSprites(str(shapes_dir), generate=True, resolution=16, subsample=SUBDS, batch_size=7, val_size=5, seed=3)
    probe = _Probe(dm)
    fit(probe, dm, num_sanity_val_steps=0)
    seen = torch.cat(probe.seen)
    flat = dm.flat_index(seen)
    # one epoch visits each training point once, and never a validation point
    assert flat.numel() == dm.num_points - 5 and flat.unique().numel() == flat.numel()
    assert probe.seen_val
    assert not set(flat.tolist()) & set(dm._val_index.tolist())
    # without val_size there is no validation loop, and every grid point is trained on
    dm = DSprites(str(shapes_dir), generate=True, resolution=16, subsample=SUBDS, batch_size=7)
    probe = _Probe(dm)
    fit(probe, dm)
    assert not hasattr(probe, "seen_val")
    assert dm.flat_index(torch.cat(probe.seen)).sort().values.tolist() == list(range(dm.num_points))


def test_sample_is_seeded_and_uniform(shapes_dir):
    dm = Shapes3D(str(shapes_dir), generate=True, resolution=16, subsample=SUB3D)
    dm.setup("fit")
    a = dm.sample(50, torch.Generator().manual_seed(4))
    b = dm.sample(50, torch.Generator().manual_seed(4))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a[0], dm.images_for(a[1]), rtol=0, atol=0)
    # each factor's levels are drawn uniformly: counts over 4,000 draws within 5 sigma of n/size
    _, f = dm.sample(4000, torch.Generator().manual_seed(5))
    for k, s in enumerate(dm.factor_sizes):
        counts = torch.bincount(f[:, k], minlength=s).double()
        sigma = math.sqrt(4000 * (1 / s) * (1 - 1 / s))
        assert (counts - 4000 / s).abs().max() < 5 * sigma
