"""DCI on 10 codes x the 6 factors of 3dshapes, ``fast`` setting: the zoo's ``DCIMetric`` against a
hand-written scikit-learn loop.

    python bench/bench_dci.py [--threads T] [--rounds R]

Points are drawn uniformly from the 3dshapes factor grid (10, 10, 10, 8, 4, 15 levels); the codes
stand in for a partly disentangled encoder: codes 0-5 are the six factors (scaled to [0, 1])
mixed with their neighbour at weight 0.3, plus Gaussian noise of s.d. 0.05; codes 6-9 are noise.
The cost of gradient boosting depends on the number of points, classes and rounds, not on
what the codes are, so this times what a beta-VAE's periodic evaluation costs: the ``fast``
setting (2,000 / 1,000 points, 20 boosting rounds per factor).

* zoo: ``DCIMetric`` as the callbacks use it, fed batches of 500 codes and factors (tensors),
  then ``compute()``: one ``GradientBoostingClassifier`` per factor, the importance matrix, and
  disentanglement, completeness and informativeness from it.
* hand-written: the same in plain code, NumPy arrays in, a loop over the factors fitting
  scikit-learn's classifier, and the entropies of Eastwood & Williams (2018) written out.

The two must agree bit for bit (same classifiers, same seeds); the bench checks it. Goal 0.95x:
both sides spend their time in scikit-learn's boosting, so the zoo's wrapper (the metric's
accumulation, input checks) may cost at most 5% (no goal was stated before). ``--threads T`` fits
T factors at a time on both sides (``n_jobs``). DCI runs on the host whatever the accelerator: the
GPU column says so.
"""
from __future__ import annotations

import time

import harness
import numpy as np
import torch

from zoo.metrics.dci import DCI_SETTINGS, DCIMetric

from gpu_column import GPU, HEADING

SIZES = (10, 10, 10, 8, 4, 15)
SETTING = DCI_SETTINGS["fast"]
BATCH = 500


def points(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Codes (n, 10) float32, as an encoder gives them, and factor levels (n, 6)."""
    f = np.stack([rng.integers(0, s, n) for s in SIZES], axis=1)
    z = f / (np.array(SIZES) - 1)
    mixed = z + 0.3 * np.roll(z, 1, axis=1)
    codes = np.concatenate([mixed, np.zeros((n, 4))], axis=1) + 0.05 * rng.standard_normal((n, 10))
    return codes.astype(np.float32), f


def zoo_dci(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], n_jobs: int) -> dict:
    metric = DCIMetric(random_state=0, n_estimators=SETTING.n_estimators, n_jobs=n_jobs, sync_on_compute=False)
    for split, (codes, factors) in (("train", train), ("test", test)):
        for i in range(0, codes.shape[0], BATCH):
            metric.update(torch.from_numpy(codes[i:i + BATCH]), torch.from_numpy(factors[i:i + BATCH]), split)
    return metric.compute()


def one_minus_entropy(p: np.ndarray, axis: int) -> np.ndarray:
    q = p / p.sum(axis=axis, keepdims=True)
    return 1.0 - (-(q * np.log(q)).sum(axis=axis)) / np.log(p.shape[axis])


def hand_dci(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], n_jobs: int) -> dict:
    """DCI in plain code: one classifier per factor, importances as columns of R, then
    D = sum_i rho_i (1 - H_K(P_i.)), C = sum_k rho_k (1 - H_M(P_.k)) (disentanglement_lib's 1e-11)."""
    from joblib import Parallel, delayed
    from sklearn.ensemble import GradientBoostingClassifier

    (xtr, ftr), (xte, fte) = train, test
    xtr, xte = xtr.astype(np.float64), xte.astype(np.float64)

    def fit(k: int) -> tuple[np.ndarray, float, float]:
        model = GradientBoostingClassifier(n_estimators=SETTING.n_estimators, random_state=0).fit(xtr, ftr[:, k])
        return (np.abs(model.feature_importances_), float(np.mean(model.predict(xtr) == ftr[:, k])),
                float(np.mean(model.predict(xte) == fte[:, k])))

    out = ([fit(k) for k in range(ftr.shape[1])] if n_jobs == 1 else
           Parallel(n_jobs=n_jobs, prefer="threads")(delayed(fit)(k) for k in range(ftr.shape[1])))
    R = np.stack([o[0] for o in out], axis=1)
    return {"disentanglement": float(np.sum(one_minus_entropy(R + 1e-11, 1) * R.sum(1) / R.sum())),
            "completeness": float(np.sum(one_minus_entropy(R + 1e-11, 0) * R.sum(0) / R.sum())),
            "informativeness_test_acc": float(np.mean([o[2] for o in out])),
            "informativeness_train_acc": float(np.mean([o[1] for o in out])), "importance": R}


def main() -> None:
    args = harness.arguments(__doc__, rounds=3)
    rng = np.random.default_rng(0)
    train, test = points(SETTING.n_train, rng), points(SETTING.n_test, rng)
    results: dict[str, dict] = {}

    def timed(name: str, fn):
        def run() -> float:
            t = time.perf_counter()
            results[name] = fn(train, test, args.threads)
            return time.perf_counter() - t
        return run

    times = harness.interleaved({"zoo": timed("zoo", zoo_dci), "hand": timed("hand", hand_dci)}, args.rounds)
    zoo, hand = results["zoo"], results["hand"]
    keys = ("disentanglement", "completeness", "informativeness_test_acc", "informativeness_train_acc")
    equal = all(zoo[k] == hand[k] for k in keys) and np.array_equal(zoo["importance"], hand["importance"])
    print(f"\nDCI, 10 codes x 6 factors (3dshapes grid), setting 'fast' ({SETTING.n_train:,} / {SETTING.n_test:,} "
          f"points, {SETTING.n_estimators} rounds), n_jobs = {args.threads}, {args.rounds} interleaved rounds")
    print(f"{'side':14s} {'median s':>9s} {'D':>6s} {'C':>6s} {'I test':>6s} {HEADING:>10s}")
    for name, out in (("DCIMetric", zoo), ("hand-written", hand)):
        t = harness.median(times["zoo" if out is zoo else "hand"])
        print(f"{name:14s} {t:9.2f} {out['disentanglement']:6.3f} {out['completeness']:6.3f} "
              f"{out['informativeness_test_acc']:6.3f} {'n/a' if GPU is None else 'host only':>10s}")
    print(f"results bit-equal (D, C, I, importance matrix): {equal}")
    if not equal:
        raise SystemExit("DCIMetric and the hand-written loop disagree")
    harness.report([harness.Row(f"DCI fast ({SETTING.n_train:,} pts, {SETTING.n_estimators} rounds): DCIMetric vs "
                                "sklearn loop by hand", zoo=harness.median(times["zoo"]),
                                baseline=harness.median(times["hand"]), unit="s", goal=0.95, lower_is_better=True)])


if __name__ == "__main__":
    main()
