"""Generating "3dshapes-like" and "dSprites-like" files at 64 px: the zoo's generators against
hand-written code of the same pictures.

    python bench/bench_shapes.py [--threads T] [--rounds R]

The full files (480,000 and 737,280 images) take minutes, so each row generates a slice of the
factor grid (``subsample``), the same slice on both sides, written to a temporary folder:

* 3dshapes-like, floor hues 0 and 1, scale 0, cube and sphere (30 geometries, 6,000 images).
  zoo: ``generate_shapes3d`` (each geometry ray cast once, every (floor, wall) block coloured,
  deflated and hashed by blocks, the chunks written as they are). Hand-written: the same ray
  caster per geometry (it is the picture's definition), the colouring ``sum_r w_r rgb_r`` written
  out for all images, then h5py's own gzip filter on the whole array and one sha256 of the
  arrays. Goal 0.95x: the same work on both sides, the zoo's bookkeeping (atomic rename, block
  hashes) may cost at most 5%.
* dSprites-like, the three shapes at scale 0 and one orientation (3 x 1,024 positions = 3,072
  images). zoo: ``generate_dsprites`` (the point-in-polygon test once per distinct pixel offset,
  images gathered from that table). Hand-written: the same even-odd test at every pixel of every
  image (NumPy, vectorised over positions), ``np.savez_compressed`` and one sha256. Goal 1.0x
  (the zoo's generator no slower than the plain definition; no goal was stated before).

Each pair of files must hold equal arrays (checked here, bit for bit). The rows compare one
process on each side at the default ``--threads 1``; ``--threads T`` gives the zoo T worker
processes (its default is all cores), the hand-written code stays one process. The generators run
NumPy on the host: the GPU column says so.
"""
from __future__ import annotations

import colorsys
import hashlib
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

from datamodules import shapes_render as render
from datamodules.shapes import DSPRITES, SHAPES3D, generate_dsprites, generate_shapes3d
from zoo.utils.extras import require

from gpu_column import GPU, HEADING

RES = 64
S3D = {"floor_hue": [0, 1], "scale": [0], "shape": [0, 2]}
SPRITES = {"scale": [0], "orientation": [3]}


def kept_values(spec, subsample: dict[str, list[int]]) -> list[list[float]]:
    return [[v[i] for i in subsample[name]] if name in subsample else list(v)
            for name, v in zip(spec.factor_names, spec.values)]


def rgb(hue: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(hue % 1.0, 1.0, 1.0), dtype=np.float32)


def hand_shapes3d(path: Path) -> None:
    """The 3dshapes-like slice in plain code: geometries, colours, one h5py write, one hash."""
    h5py = require("h5py", "shapes", "bench_shapes.py")
    floor_hues, wall_hues, object_hues, scales, shapes, orientations = kept_values(SHAPES3D, S3D)
    w = np.stack([render.render_geometry(sc, int(sh), o, RES) for sc in scales for sh in shapes for o in orientations])
    obj = np.stack([rgb(h) for h in object_hues])
    blocks = []
    for fh in floor_hues:
        for wh in wall_hues:
            room = w[:, 0, ..., None] * rgb(fh) + w[:, 1, ..., None] * rgb(wh)
            img = room[None] + w[None, :, 2, ..., None] * obj[:, None, None, None, :]
            blocks.append(np.clip(np.rint(img * 255), 0, 255).astype(np.uint8).reshape(-1, RES, RES, 3))
    images = np.concatenate(blocks)
    labels = np.array(np.meshgrid(floor_hues, wall_hues, object_hues, scales, shapes, orientations, indexing="ij"),
                      dtype=np.float64).reshape(6, -1).T
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=images, chunks=(len(shapes) * len(orientations), RES, RES, 3),
                         compression="gzip")
        f.create_dataset("labels", data=labels)
        f.attrs["content_sha256"] = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()


def hand_dsprites(path: Path) -> None:
    """The dSprites-like slice in plain code: the even-odd test at every pixel of every image."""
    shapes, scales, orientations, pos_x, pos_y = kept_values(DSPRITES, SPRITES)
    pix = (np.arange(RES) + 0.5) / RES
    cx = 0.5 + (np.array(pos_x) - 0.5) * render.POSITION_SPAN
    cy = 0.5 + (np.array(pos_y) - 0.5) * render.POSITION_SPAN
    # pixel (v, u) of the image at (posX i, posY j), relative to the sprite's centre: (i, j, v, u)
    X, Y = np.broadcast_arrays(pix[None, None, None, :] - cx[:, None, None, None],
                               pix[None, None, :, None] - cy[None, :, None, None])
    imgs = []
    for sh in shapes:
        for sc in scales:
            for o in orientations:
                rot = np.array([[np.cos(o), -np.sin(o)], [np.sin(o), np.cos(o)]])
                poly = render.sprite_polygon(int(sh) - 1) * render.SPRITE_HALF_SIZE * sc @ rot.T
                inside = np.zeros(X.shape, bool)
                for (a, b), (c, e) in zip(poly, np.roll(poly, -1, axis=0)):
                    with np.errstate(divide="ignore", invalid="ignore"):
                        inside ^= ((b > Y) != (e > Y)) & (X < a + (Y - b) * (c - a) / (e - b))
                imgs.append(inside.astype(np.uint8).reshape(-1, RES, RES))
    arrays = {"imgs": np.concatenate(imgs),
              "latents_values": np.array(np.meshgrid([1.0], shapes, scales, orientations, pos_x, pos_y, indexing="ij"),
                                         dtype=np.float64).reshape(6, -1).T}
    digest = hashlib.sha256(b"".join(a.tobytes() for a in arrays.values())).hexdigest()
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays, content_sha256=np.array(digest))


def read(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".h5":
        import h5py

        with h5py.File(path, "r") as f:
            return {"images": f["images"][:], "labels": f["labels"][:]}
    with np.load(path) as f:
        return {"imgs": f["imgs"], "latents_values": f["latents_values"]}


def main() -> None:
    args = harness.arguments(__doc__, rounds=3)
    folder = Path(tempfile.mkdtemp(prefix="bench_shapes_"))
    pairs = {"3dshapes-like": (lambda p: generate_shapes3d(p, RES, S3D, args.threads), hand_shapes3d, ".h5"),
             "dSprites-like": (lambda p: generate_dsprites(p, RES, SPRITES, args.threads), hand_dsprites, ".npz")}
    versus = {"3dshapes-like": "plain NumPy + h5py gzip", "dSprites-like": "even-odd test per pixel"}
    rows, lines = [], []
    for name, (zoo, hand, ext) in pairs.items():
        files = {side: folder / f"{side}{ext}" for side in ("zoo", "hand")}

        def timed(side: str, fn):
            def run() -> float:
                t = time.perf_counter()
                fn(files[side])
                return time.perf_counter() - t
            return run

        times = harness.interleaved({"zoo": timed("zoo", zoo), "hand": timed("hand", hand)}, args.rounds)
        a, b = read(files["zoo"]), read(files["hand"])
        equal = all(np.array_equal(a[k], b[k]) for k in a)
        n = len(a.get("images", a.get("imgs")))
        for f in files.values():
            f.unlink()
        lines.append((name, n, harness.median(times["zoo"]), harness.median(times["hand"]), equal))
        rows.append(harness.Row(f"{name} file, {n:,} images at {RES} px: zoo vs {versus[name]}",
                                zoo=n / harness.median(times["zoo"]), baseline=n / harness.median(times["hand"]),
                                unit="images/s", goal=0.95 if name == "3dshapes-like" else 1.0))
    folder.rmdir()
    print(f"\nGenerating slices of the factor grids at {RES} px; zoo with {args.threads} process(es), hand-written "
          f"with one; {args.rounds} interleaved rounds")
    print(f"{'file':14s} {'images':>7s} {'zoo s':>7s} {'hand s':>7s} {'arrays equal':>13s} {HEADING:>10s}")
    for name, n, tz, th, equal in lines:
        print(f"{name:14s} {n:7,d} {tz:7.2f} {th:7.2f} {str(equal):>13s} {'n/a' if GPU is None else 'host only':>10s}")
    if not all(line[-1] for line in lines):
        raise SystemExit("a zoo file and its hand-written twin hold different arrays")
    harness.report(rows)


if __name__ == "__main__":
    main()
