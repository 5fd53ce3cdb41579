"""DCI on 10 codes x the 6 factors of 3dshapes: the ``full`` setting ([S] App. D) against ``fast``.

    python bench/bench_dci.py [--skip-full]

Points are drawn uniformly from the 3dshapes factor grid (10, 10, 10, 8, 4, 15 levels); the codes
stand in for a partly disentangled encoder: codes 0-5 are the six factors (scaled to [0, 1])
mixed with their neighbour at weight 0.3, plus Gaussian noise of s.d. 0.05; codes 6-9 are noise.
The cost of gradient boosting depends on the number of points, classes and rounds, not on
what the codes are, so this times what a beta-VAE's evaluation costs.

Rows: ``full`` (10,000 / 5,000 points, 100 rounds, the baseline) and ``fast`` (2,000 / 1,000
points, 20 rounds; target under 10 s on 2 cores), fitting the 6 factors' classifiers one after
the other or on 2 threads (``n_jobs=2``, identical result). The machine these ran on may be
shared, so the table gives wall time and this process's CPU time (what the fit costs a
dedicated core). The last columns show how far ``fast``'s scores are from ``full``'s.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from zoo.metrics.dci import DCI_SETTINGS, DCISetting, dci

from gpu_column import GPU, HEADING

SIZES = (10, 10, 10, 8, 4, 15)


def points(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    f = np.stack([rng.integers(0, s, n) for s in SIZES], axis=1)
    z = f / (np.array(SIZES) - 1)
    mixed = z + 0.3 * np.roll(z, 1, axis=1)
    codes = np.concatenate([mixed, np.zeros((n, 4))], axis=1) + 0.05 * rng.standard_normal((n, 10))
    return codes, f


def run(setting: DCISetting, n_jobs: int) -> tuple[float, float, dict]:
    rng = np.random.default_rng(0)
    ctr, ftr = points(setting.n_train, rng)
    cte, fte = points(setting.n_test, rng)
    t, c = time.perf_counter(), time.process_time()
    out = dci(ctr, ftr, cte, fte, random_state=0, n_estimators=setting.n_estimators, n_jobs=n_jobs)
    return time.perf_counter() - t, time.process_time() - c, out


def main() -> None:
    rows = []
    if "--skip-full" not in sys.argv:
        rows += [("full, 1 thread (baseline)", *run(DCI_SETTINGS["full"], 1))]
    rows += [("fast, 1 thread", *run(DCI_SETTINGS["fast"], 1)), ("fast, n_jobs=2", *run(DCI_SETTINGS["fast"], 2))]
    base = rows[0][1]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nDCI, 10 codes x 6 factors (3dshapes grid), GradientBoostingClassifier per factor "
          f"({os.cpu_count()} cores, load average {load:.1f} at the end)")
    print(f"{'setting':26s} {'points':>13s} {'rounds':>6s} {'wall (s)':>9s} {'CPU (s)':>8s} {'speed-up':>9s} "
          f"{'D':>6s} {'C':>6s} {'I test':>6s} {HEADING:>10s}")
    for label, t, cpu, out in rows:
        s = DCI_SETTINGS[label.split(",")[0]]
        print(f"{label:26s} {s.n_train:>6,}/{s.n_test:>6,} {s.n_estimators:>6d} {t:9.1f} {cpu:8.1f} {base / t:8.1f}x "
              f"{out['disentanglement']:6.3f} {out['completeness']:6.3f} {out['informativeness_test_acc']:6.3f} "
              f"{'n/a' if GPU is None else 'host only':>10s}")
    print("(DCI fits scikit-learn's gradient boosting on the host: a GPU does not change this table)")


if __name__ == "__main__":
    main()
