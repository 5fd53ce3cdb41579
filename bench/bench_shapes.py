"""Generating the "3dshapes-like" (480,000 images) and "dSprites-like" (737,280) files at 64 px:
one process against all cores.

    python bench/bench_shapes.py [--fraction-only] [--out DIR]

The full files take minutes (and 5.9 GB / 3 GB uncompressed in memory), so each row times a
fraction and extrapolates, as its label says:

* 3dshapes-like: the 480 geometries (scale x shape x orientation) are ray cast once whatever
  the hues, a fixed cost timed on its own; colouring + compressing + writing is linear in the
  number of (floor, wall, object hue) combinations and is timed on one floor hue (1/10 of the
  file, all 480 geometries). Full = geometry + 10 x (generate(floor hue 0) - geometry).
* dSprites-like: linear in the number of (shape, scale, orientation) sprites, timed on one shape
  (1/3) and multiplied by 3.

The baseline is one process, measured in the same run; "full" columns are extrapolated. The CPU
column (this process and its workers) is the work done: on a machine shared with other jobs the
wall-clock speed-up is only what their load leaves, while CPU / processes is what dedicated
cores would take. Files go to a temporary folder (or
``--out``) and are deleted.
"""
from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from datamodules.shapes import SHAPES3D, _processes, generate_dsprites, generate_shapes3d, geometry_weights

from gpu_column import GPU, HEADING


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the generator's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, *args) -> tuple[float, float]:
    """(wall, CPU) seconds of ``fn(*args)``."""
    t, c = time.perf_counter(), cpu_seconds()
    fn(*args)
    return time.perf_counter() - t, cpu_seconds() - c


def main() -> None:
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else Path(tempfile.mkdtemp())
    cores = _processes(None)
    rows = []
    for procs in sorted({1, cores}):
        geo, geo_cpu = timed(geometry_weights, *SHAPES3D.values[3:], 64, procs)
        f = out / f"s3d_{procs}.h5"
        part, part_cpu = timed(generate_shapes3d, f, 64, {"floor_hue": [0]}, procs)
        size = f.stat().st_size
        f.unlink()
        rows.append(("3dshapes-like", procs, "floor hue 0 (1/10)", part, geo + 10 * (part - geo),
                     geo_cpu + 10 * (part_cpu - geo_cpu), f"{10 * size / 2**20:.0f} MB"))
        f = out / f"ds_{procs}.npz"
        part, part_cpu = timed(generate_dsprites, f, 64, {"shape": [0]}, procs)
        size = f.stat().st_size
        f.unlink()
        rows.append(("dSprites-like", procs, "shape 0 (1/3)", part, 3 * part, 3 * part_cpu,
                     f"{3 * size / 2**20:.0f} MB"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nGeneration at 64 px ({cores} cores usable; load average {load:.1f} at the end: on a shared "
          "machine the speed-up is what the other load leaves)")
    print(f"{'file':14s} {'processes':>9s} {'timed on':>20s} {'wall (s)':>9s} {'full wall (s)':>14s} "
          f"{'full CPU (s)':>13s} {'speed-up':>9s} {'file size':>10s} {HEADING:>10s}")
    base = {r[0]: r[4] for r in rows if r[1] == 1}
    for name, procs, what, t, full, cpu, size in rows:
        print(f"{name:14s} {procs:9d} {what:>20s} {t:9.1f} {full:14.0f} {cpu:13.0f} {base[name] / full:8.2f}x "
              f"{size:>10s} {'n/a' if GPU is None else 'host only':>10s}")
    print("(the generator renders with NumPy in worker processes on the host: a GPU does not change this table)")


if __name__ == "__main__":
    main()
