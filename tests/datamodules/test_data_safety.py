"""Data safety (issue #17, point 5): read-only data folders are never written (the cache is used and
reused), first-time extraction is atomic under concurrency, stale part files of dead processes are
removed, generated files carry a content checksum verified on first load; and clear errors."""
from __future__ import annotations

import gzip
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import datamodules.files as files
import datamodules.mnist_files as mnist_files
from datamodules.files import DataFileError, checksum_of, is_writable, remove_stale_parts
from datamodules.mnist import MNISTContinual
from datamodules.shapes import DSprites, Shapes3D
from tests.helpers_mnist import idx_bytes, tiny_mnist

SUB3D = {"floor_hue": [0, 9], "wall_hue": [0, 5], "object_hue": [2, 7], "scale": [0, 7], "orientation": [0, 7, 14]}
SUBDS = {"scale": [0, 5], "orientation": [0, 10], "posX": [0, 31], "posY": [0, 16]}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Every test gets its own empty cache folder."""
    c = tmp_path / "cache"
    monkeypatch.setenv("ZOO_CACHE", str(c))
    return c


@pytest.fixture
def tiny_gz(tmp_path, monkeypatch) -> Path:
    """A data_dir with tiny MNIST .gz files, accepted as the originals (their md5 patched in)."""
    root = tiny_mnist(tmp_path / "data", gz=True)
    raw = root / "MNIST" / "raw"
    monkeypatch.setattr(mnist_files, "MNIST_FILES", {f: mnist_files.md5_of(raw / (f + ".gz"))
                                                     for f in mnist_files.MNIST_FILES})
    return root


def expected_arrays(root: Path) -> dict[str, np.ndarray]:
    """The tiny files' content, decompressed here independently of the loader."""
    raw = root / "MNIST" / "raw"
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        img = gzip.decompress((raw / f"{prefix}-images-idx3-ubyte.gz").read_bytes())
        lab = gzip.decompress((raw / f"{prefix}-labels-idx1-ubyte.gz").read_bytes())
        out[split] = (np.frombuffer(img, np.uint8, offset=16).reshape(-1, 28, 28),
                      np.frombuffer(lab, np.uint8, offset=8))
    return out


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its size and mtime: what "nothing was written" compares."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def read_only(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -- 1. a read-only data_dir is never written; the cache is said and reused ------------------------------
def test_is_writable_follows_the_permission_bits_even_as_root(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    assert is_writable(d)
    d.chmod(0o555)
    assert not is_writable(d)  # as root os.access(W_OK) is True here: the bits are what the user meant
    assert list(d.iterdir()) == []  # the probe left nothing


def test_mnist_from_a_read_only_data_dir_extracts_into_the_cache_and_reuses_it(tiny_gz, cache, caplog, monkeypatch):
    read_only(tiny_gz)
    before = tree(tiny_gz)
    caplog.set_level(logging.INFO)
    dm = MNISTContinual(str(tiny_gz), shared=2)
    dm.setup("fit")
    want = expected_arrays(tiny_gz)
    for split, train in (("train", True), ("test", False)):
        X, D = dm.raw(train=train)
        assert np.array_equal(X.numpy(), want[split][0]) and np.array_equal(D.numpy(), want[split][1])
    assert tree(tiny_gz) == before  # not one file written, touched or added
    extracted = sorted(cache.glob("MNIST/*/*-ubyte"))
    assert len(extracted) == 4 and str(extracted[0].parent) in caplog.text  # the log line says which folder
    # next time: read from the cache, nothing extracted again
    monkeypatch.setattr(mnist_files.gzip, "open", lambda *a, **k: pytest.fail("extracted again"))
    caplog.clear()
    X2, _ = MNISTContinual(str(tiny_gz), shared=2).raw(train=True)
    assert np.array_equal(X2.numpy(), want["train"][0]) and "in the cache" in caplog.text


def test_a_damaged_extraction_in_the_cache_is_extracted_again(tiny_gz, cache):
    MNISTContinual(str(tiny_gz), shared=2).setup("fit")
    f = next(cache.glob("MNIST/*/train-images-idx3-ubyte"))
    f.write_bytes(f.read_bytes()[:500])
    X, _ = MNISTContinual(str(tiny_gz), shared=2).raw(train=True)
    assert np.array_equal(X.numpy(), expected_arrays(tiny_gz)["train"][0])


def test_generation_into_a_read_only_data_dir_goes_to_the_cache_and_is_reused(tmp_path, cache, caplog, monkeypatch):
    data = tmp_path / "ro"
    data.mkdir()
    (data / "note.txt").write_text("the user's")
    read_only(data)
    before = tree(data)
    caplog.set_level(logging.INFO)
    dm = DSprites(str(data), generate=True, resolution=8, subsample=SUBDS, processes=1)
    dm.prepare_data()
    dm.setup("fit")
    assert tree(data) == before
    assert dm.generated_path.parent == cache / "generated" and dm.generated_path.is_file()
    assert str(cache / "generated") in caplog.text and "read-only" in caplog.text
    monkeypatch.setattr(DSprites, "_generate", lambda self, p: pytest.fail("generated again"))
    again = DSprites(str(data), generate=True, resolution=8, subsample=SUBDS)
    again.prepare_data()
    again.setup("fit")
    assert bool((again.images == dm.images).all())


# -- 2. first-time extraction is atomic: two runs at once both succeed -----------------------------------
def test_concurrent_first_extraction_both_succeed(tiny_gz, cache, monkeypatch):
    # both runs must have written their own copy of a file before either renames it: a real overlap
    barrier, first = threading.Barrier(2, timeout=20), set()
    real_replace = os.replace

    def replace(src, dst):
        if threading.get_ident() not in first:
            first.add(threading.get_ident())
            barrier.wait()
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    results, errors = [None, None], []

    def run(i):
        try:
            results[i] = mnist_files.load_mnist(tiny_gz)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(first) == 2  # both extracted, both succeeded
    want = expected_arrays(tiny_gz)
    for r in results:
        for split in ("train", "test"):
            assert np.array_equal(r[split][0].numpy(), want[split][0])
            assert np.array_equal(r[split][1].numpy(), want[split][1])
    assert sorted(p.name for p in next(cache.glob("MNIST/*")).iterdir()) == sorted(mnist_files.MNIST_FILES)


# -- 3. stale part files of dead processes are removed -----------------------------------------------------
def test_stale_parts_of_dead_generators_are_removed(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    name = "dsprites-like_v1_8px_x.npz"
    host, pid = files._host(), dead_pid()
    dead = [data / f"{name}.part{pid}-{host}-aa", data / f"3dshapes-like_v1.h5.part{pid}",  # the old naming too
            data / f"{name}.part{pid}.npz"]
    alive = [data / f"{name}.part{os.getpid()}-{host}-bb",  # this process is writing it
             data / f"{name}.part{pid}-0000beef-cc"]  # another host's, fresh: its pid means nothing here
    old_foreign = data / f"{name}.part{pid}-0000beef-dd"
    users = [data / f"notes.part{pid}"]  # not a generator's name: the user's
    for p in dead + alive + [old_foreign] + users:
        p.write_bytes(b"half a file")
    t = time.time() - 2 * files.FOREIGN_PART_AGE_S
    os.utime(old_foreign, (t, t))
    DSprites(str(data), generate=True, resolution=8, subsample=SUBDS, processes=1).prepare_data()
    removed = remove_stale_parts(data, prefix="3dshapes-like")
    assert removed == [dead[1]]
    assert not any(p.exists() for p in dead + [old_foreign]) and all(p.exists() for p in alive + users)


# -- 4. generated files carry a checksum of their content, verified on first load ---------------------------
def test_stored_checksum_is_the_content_of_the_arrays(tmp_path):
    dm = Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=SUB3D, processes=2)
    dm.prepare_data()
    with h5py.File(dm.generated_path, "r") as f:
        stored, images, labels = f.attrs["content_sha256"], f["images"][:], f["labels"][:]
        rows = f["images"].chunks[0]
    # hashed in the workers from the chunks they rendered; here from the arrays read back
    assert stored == checksum_of({"images": images, "labels": labels}, rows)
    swapped = images.copy()
    swapped[[0, rows]] = swapped[[rows, 0]]
    assert checksum_of({"images": swapped, "labels": labels}, rows) != stored


def test_swapped_image_chunks_are_detected_on_first_load(tmp_path):
    dm = Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=SUB3D, processes=1)
    dm.prepare_data()
    with h5py.File(dm.generated_path, "r+") as f:
        im, rows = f["images"], f["images"].chunks[0]
        a, b = im[0:rows], im[rows:2 * rows]
        assert not np.array_equal(a, b)
        im[0:rows], im[rows:2 * rows] = b, a  # the labels still form the grid: only the checksum can tell
    with pytest.raises(ValueError, match="does not match the checksum") as e:
        Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=SUB3D).setup("fit")
    assert isinstance(e.value, DataFileError) and f"data_dir = {str(tmp_path)!r}" in str(e.value)
    assert str(dm.generated_path) in str(e.value) and "\n" not in str(e.value)

    ds = DSprites(str(tmp_path), generate=True, resolution=8, subsample=SUBDS, processes=1)
    ds.prepare_data()
    with np.load(ds.generated_path) as z:
        arrays = {k: z[k] for k in z.files}
    imgs = arrays["imgs"]
    j = next(j for j in range(1, len(imgs)) if not np.array_equal(imgs[0], imgs[j]))
    imgs[[0, j]] = imgs[[j, 0]]
    with open(ds.generated_path, "wb") as f:
        np.savez_compressed(f, **arrays)
    with pytest.raises(DataFileError, match="does not match the checksum"):
        DSprites(str(tmp_path), generate=True, resolution=8, subsample=SUBDS).setup("fit")


def test_verification_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    calls = []
    real = files.block_digests
    monkeypatch.setattr(files, "block_digests", lambda *a: calls.append(1) or real(*a))
    dm = Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=SUB3D, processes=1)
    dm.prepare_data()
    calls.clear()
    dm.setup("fit")
    assert calls  # first load: hashed
    calls.clear()
    Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=SUB3D).setup("fit")
    assert not calls  # remembered
    os.utime(dm.generated_path, ns=(time.time_ns(), time.time_ns() + 10**9))
    Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=SUB3D).setup("fit")
    assert calls  # the file changed: hashed again


# -- clear errors: the parameter, where it looked, what to do, on one line ------------------------------------
def test_missing_and_corrupt_files_name_the_parameter_and_the_folder(tmp_path, tiny_gz):
    nowhere = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as e:
        MNISTContinual(str(nowhere), shared=2).prepare_data()
    msg = str(e.value)
    assert f"data_dir = {str(nowhere)!r}" in msg and "does not exist" in msg and "download=True" in msg
    assert str(nowhere / "MNIST" / "raw") in msg and "\n" not in msg

    cut = tiny_mnist(tmp_path / "cut")
    f = cut / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    f.write_bytes(f.read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated") as e:
        MNISTContinual(str(cut), shared=2).setup("fit")
    assert f"data_dir = {str(cut)!r}" in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)

    bad = tiny_gz / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz"
    bad.write_bytes(gzip.compress(idx_bytes(np.zeros((1, 28, 28)), np.array([3]))[1]))
    with pytest.raises(ValueError, match="md5") as e:
        MNISTContinual(str(tiny_gz), shared=2).setup("fit")
    assert f"data_dir = {str(tiny_gz)!r}" in str(e.value) and str(bad) in str(e.value)

    ds = DSprites(str(tmp_path / "shapes"), generate=True, resolution=8, subsample=SUBDS, processes=1)
    ds.prepare_data()
    ds.generated_path.write_bytes(ds.generated_path.read_bytes()[:ds.generated_path.stat().st_size // 2])
    with pytest.raises(ValueError, match="corrupt or truncated") as e:
        DSprites(str(tmp_path / "shapes"), generate=True, resolution=8, subsample=SUBDS).setup("fit")
    assert f"data_dir = {str(tmp_path / 'shapes')!r}" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError, match=r"data_dir = .*does not exist.*generate=True"):
        Shapes3D(str(nowhere), resolution=8).prepare_data()


def test_a_generated_file_without_a_checksum_loads_with_a_warning(tmp_path):
    dm = Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=SUB3D, processes=1)
    dm.prepare_data()
    with h5py.File(dm.generated_path, "r+") as f:
        del f.attrs["content_sha256"]  # as files generated before checksums
    with pytest.warns(UserWarning, match="cannot be verified; delete it"):
        Shapes3D(str(tmp_path), generate=True, resolution=8, subsample=SUB3D).setup("fit")
