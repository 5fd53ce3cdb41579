"""DCI: disentanglement, completeness and informativeness (Eastwood & Williams 2018), computed as
disentanglement_lib does ([S] Sec. 3.2 and App. D: "we sample 10,000 training and 5,000 test
points, then use gradient-boosted trees from Scikit-learn to obtain feature importance
weights"; docs/theory.md#dci).

For each factor ``k`` a ``GradientBoostingClassifier`` (a fixed ``random_state``) predicts the
factor's level from the codes; column ``k`` of the importance matrix is ``|feature_importances_|``,
so ``R`` is (n_codes, n_factors). With ``P = R / R.sum(axis)``:

* disentanglement ``D = sum_i rho_i (1 - H_K(P[i, :]))``, ``rho_i = R[i, :].sum() / R.sum()``,
  the entropy in base ``K`` = number of factors;
* completeness ``C = sum_k rho_k (1 - H_M(P[:, k]))``, ``rho_k = R[:, k].sum() / R.sum()``, base
  ``M`` = number of codes;
* informativeness: the classifiers' accuracy, averaged over factors, on the test points (and on
  the training points).

As in disentanglement_lib, ``1e-11`` is added to every entry before the entropies (so a zero row
has entropy 1 and contributes nothing), and an all-zero matrix is weighted uniformly.
Pure numpy/torch and scikit-learn (no Lightning): usable from a notebook. ``DCIMetric`` wraps
``dci`` as a ``torchmetrics.Metric`` that accumulates codes and factors over batches and devices.

Layout: codes are (n_points, n_codes) and factors (n_points, n_factors) integer level indices
(batch first, as the datamodules give them; disentanglement_lib stores the transposes).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric

from zoo.utils.extras import require

__all__ = ["DCIMetric", "DCISetting", "DCI_SETTINGS", "dci", "dci_from_importance", "dci_on_grid",
           "importance_matrix", "setting_with", "update_on_grid"]

ArrayLike = Tensor | np.ndarray
_EPS = 1e-11  # disentanglement_lib's offset inside the entropies


@dataclass(frozen=True)
class DCISetting:
    """How many grid points to draw and how many boosting rounds per factor."""

    n_train: int
    n_test: int
    n_estimators: int = 100  # scikit-learn's default, which disentanglement_lib uses


DCI_SETTINGS: dict[str, DCISetting] = {
    # [S] App. D / disentanglement_lib: 10,000 training and 5,000 test points, default trees
    "full": DCISetting(n_train=10_000, n_test=5_000, n_estimators=100),
    # for periodic evaluation during training. Boosting's cost is mostly per tree (one per class
    # per round: 57 for 3dshapes), so fewer rounds buy more than fewer points; 20 rounds on 2,000
    # points cost ~1/30 of "full" (bench/bench_dci.py). Scores are a noisier estimate of full's
    # (within ~0.05 on the bench's codes): compare runs on one setting, report "full".
    "fast": DCISetting(n_train=2_000, n_test=1_000, n_estimators=20),
}


def _numpy(a: ArrayLike, name: str, ndim: int = 2) -> np.ndarray:
    a = a.detach().cpu().numpy() if isinstance(a, Tensor) else np.asarray(a)
    if a.ndim != ndim:
        raise ValueError(f"dci: {name} has shape {a.shape}; allowed: {ndim} dimensions (points first)")
    return a


def _one_minus_entropy(p: np.ndarray, base: int, axis: int) -> np.ndarray:
    """``1 - H_base(p / p.sum(axis))`` along ``axis`` (``p`` already offset by ``_EPS``)."""
    q = p / p.sum(axis=axis, keepdims=True)
    h = -(q * np.log(q)).sum(axis=axis)
    # base 1 (one code or one factor): the entropy is 0/0; disentanglement_lib's scipy call gives
    # nan there; a single code or factor is trivially disentangled/complete, so 1
    return 1.0 - h / np.log(base) if base > 1 else np.ones_like(h)


def dci_from_importance(importance: ArrayLike) -> dict[str, float | np.ndarray]:
    """Disentanglement and completeness from an importance matrix ``R`` (n_codes, n_factors)
    (Eastwood & Williams 2018, Eqs. 1-3; disentanglement_lib's ``disentanglement`` and
    ``completeness``). Also returns the per-code and per-factor scores."""
    R = _numpy(importance, "importance").astype(np.float64)
    if np.any(R < 0) or not np.all(np.isfinite(R)):
        raise ValueError("dci_from_importance: importance must be finite and non-negative")
    n_codes, n_factors = R.shape
    per_code = _one_minus_entropy(R + _EPS, n_factors, axis=1)
    per_factor = _one_minus_entropy(R + _EPS, n_codes, axis=0)
    W = R if R.sum() > 0 else np.ones_like(R)
    return {
        "disentanglement": float(np.sum(per_code * W.sum(axis=1) / W.sum())),
        "completeness": float(np.sum(per_factor * W.sum(axis=0) / W.sum())),
        "disentanglement_per_code": per_code,
        "completeness_per_factor": per_factor,
    }


def _fit_factor(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                n_estimators: int, random_state: int) -> tuple[np.ndarray, float, float]:
    from sklearn.ensemble import GradientBoostingClassifier

    if np.unique(y_train).size < 2:
        # a factor constant over the training points: nothing to predict, no code is important
        acc_test = float(np.mean(y_test == y_train[0]))
        return np.zeros(x_train.shape[1]), 1.0, acc_test
    model = GradientBoostingClassifier(n_estimators=n_estimators, random_state=random_state)
    model.fit(x_train, y_train)
    return (np.abs(model.feature_importances_), float(np.mean(model.predict(x_train) == y_train)),
            float(np.mean(model.predict(x_test) == y_test)))


def importance_matrix(codes_train: ArrayLike, factors_train: ArrayLike, codes_test: ArrayLike,
                      factors_test: ArrayLike, *, random_state: int = 0, n_estimators: int = 100,
                      n_jobs: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``R`` (n_codes, n_factors) and the per-factor train and test accuracies of one gradient-
    boosted classifier per factor. ``n_jobs`` fits factors in parallel (same result)."""
    xtr, ytr = _numpy(codes_train, "codes_train"), _numpy(factors_train, "factors_train")
    xte, yte = _numpy(codes_test, "codes_test"), _numpy(factors_test, "factors_test")
    if xtr.shape[0] != ytr.shape[0] or xte.shape[0] != yte.shape[0]:
        raise ValueError(f"dci: codes and factors disagree on the number of points: train {xtr.shape[0]} vs "
                         f"{ytr.shape[0]}, test {xte.shape[0]} vs {yte.shape[0]}")
    if xtr.shape[1] != xte.shape[1] or ytr.shape[1] != yte.shape[1]:
        raise ValueError(f"dci: train and test disagree on the number of codes ({xtr.shape[1]} vs {xte.shape[1]}) "
                         f"or factors ({ytr.shape[1]} vs {yte.shape[1]})")
    if xtr.shape[0] < 2 or xte.shape[0] < 1:
        raise ValueError(f"dci: {xtr.shape[0]} training and {xte.shape[0]} test points; allowed: >= 2 and >= 1")
    if not (np.issubdtype(ytr.dtype, np.integer) and np.issubdtype(yte.dtype, np.integer)):
        raise ValueError(f"dci: factors must be integer level indices (got {ytr.dtype}, {yte.dtype})")
    if isinstance(n_estimators, bool) or int(n_estimators) != n_estimators or n_estimators < 1:
        raise ValueError(f"dci: n_estimators = {n_estimators!r}; allowed: a positive integer")
    xtr, xte = xtr.astype(np.float64), xte.astype(np.float64)
    jobs = [(xtr, ytr[:, k], xte, yte[:, k], int(n_estimators), int(random_state)) for k in range(ytr.shape[1])]
    if n_jobs == 1:
        out = [_fit_factor(*j) for j in jobs]
    else:
        from joblib import Parallel, delayed

        # threads: the trees are built without the GIL, and nothing is copied to other processes
        out = Parallel(n_jobs=n_jobs, prefer="threads")(delayed(_fit_factor)(*j) for j in jobs)
    R = np.stack([o[0] for o in out], axis=1)
    return R, np.array([o[1] for o in out]), np.array([o[2] for o in out])


def dci(codes_train: ArrayLike, factors_train: ArrayLike, codes_test: ArrayLike, factors_test: ArrayLike, *,
        random_state: int = 0, n_estimators: int = 100, n_jobs: int = 1) -> dict[str, float | np.ndarray]:
    """DCI of codes (n, n_codes) against integer factor levels (n, n_factors) (module docstring).

    Returns ``disentanglement``, ``completeness``, ``informativeness_test_acc`` and
    ``informativeness_train_acc`` (mean accuracy over factors), and ``importance`` (n_codes,
    n_factors). ``random_state`` seeds every classifier (scikit-learn's trees draw a feature
    order even without subsampling, which decides ties), so the result is reproducible.
    """
    R, acc_train, acc_test = importance_matrix(codes_train, factors_train, codes_test, factors_test,
                                               random_state=random_state, n_estimators=n_estimators,
                                               n_jobs=n_jobs)
    dc = dci_from_importance(R)
    return {"disentanglement": dc["disentanglement"], "completeness": dc["completeness"],
            "informativeness_test_acc": float(acc_test.mean()),
            "informativeness_train_acc": float(acc_train.mean()), "importance": R}


def setting_with(name: str, n_train: int | None = None, n_test: int | None = None,
                 n_estimators: int | None = None, who: str = "dci") -> DCISetting:
    """The setting ``name`` of ``DCI_SETTINGS`` with the numbers given instead of its own; a
    clear error naming the argument for a bad one."""
    if name not in DCI_SETTINGS:
        raise ValueError(f"{who}: setting = {name!r}; allowed: {', '.join(sorted(DCI_SETTINGS))}")
    for arg, value in (("n_train", n_train), ("n_test", n_test), ("n_estimators", n_estimators)):
        if value is not None and (isinstance(value, bool) or int(value) != value or value < 1 + (arg == "n_train")):
            raise ValueError(f"{who}: {arg} = {value!r}; allowed: a positive integer (n_train >= 2) or null")
    s = DCI_SETTINGS[name]
    return DCISetting(n_train=int(n_train or s.n_train), n_test=int(n_test or s.n_test),
                      n_estimators=int(n_estimators or s.n_estimators))


def _setting(setting: Literal["full", "fast"] | DCISetting) -> DCISetting:
    if isinstance(setting, DCISetting):
        return setting
    if setting not in DCI_SETTINGS:
        raise ValueError(f"dci: setting = {setting!r}; allowed: {sorted(DCI_SETTINGS)} or a DCISetting")
    return DCI_SETTINGS[setting]


@torch.no_grad()
def dci_on_grid(encode: Callable[[Tensor], Tensor],
                sample: Callable[[int, torch.Generator], tuple[Tensor, Tensor]],
                setting: Literal["full", "fast"] | DCISetting = "fast", *, random_state: int = 0,
                batch_size: int = 500, n_jobs: int = 1) -> dict[str, float | np.ndarray]:
    """DCI of a representation on points drawn uniformly from the factor grid.

    ``encode(x) -> codes`` (e.g. the encoder's means, as in [S] App. D), ``sample(n, generator) ->
    (x, factors)`` (``Shapes3D.sample``). The training points then the test points are drawn from
    one generator seeded with ``random_state`` (as disentanglement_lib draws both from one
    ``RandomState``); encoding runs ``batch_size`` images at a time.
    """
    s = _setting(setting)
    metric = DCIMetric(random_state=random_state, n_estimators=s.n_estimators, n_jobs=n_jobs, sync_on_compute=False)
    update_on_grid(metric, encode, sample, s, random_state=random_state, batch_size=batch_size)
    return metric.compute()


@torch.no_grad()
def update_on_grid(metric: "DCIMetric", encode: Callable[[Tensor], Tensor],
                   sample: Callable[[int, torch.Generator], tuple[Tensor, Tensor]], setting: DCISetting, *,
                   random_state: int = 0, batch_size: int = 500) -> None:
    """Feed ``metric`` the codes and factors of ``setting.n_train`` then ``setting.n_test`` grid
    points, drawn from one generator seeded with ``random_state`` (see :func:`dci_on_grid`)."""
    g = torch.Generator().manual_seed(int(random_state))
    for split, n in (("train", setting.n_train), ("test", setting.n_test)):
        x, f = sample(n, g)
        for i in range(0, n, batch_size):
            metric.update(encode(x[i:i + batch_size]).detach().float().cpu(), f[i:i + batch_size], split)


class DCIMetric(Metric):
    """Accumulates ``(codes, factors)`` over batches (and devices, under DDP) and computes ``dci``.

    ``update(codes, factors, split="train" | "test")``: the two sets are kept apart; ``compute()``
    returns ``dci``'s dictionary (``DCI_SETTINGS[...].n_estimators`` gives the boosting rounds of a
    setting). Under DDP every process computes the same result from the gathered points;
    ``sync_on_compute=False`` keeps to the points of this process (for one drawn on rank 0 only).
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, random_state: int = 0, n_estimators: int = 100, n_jobs: int = 1,
                 sync_on_compute: bool = True) -> None:
        super().__init__(sync_on_compute=sync_on_compute)
        require("sklearn", "dci", "DCIMetric (DCI's gradient-boosted classifiers)")  # before any point is fed
        self.random_state, self.n_estimators, self.n_jobs = int(random_state), int(n_estimators), int(n_jobs)
        for name in ("codes_train", "factors_train", "codes_test", "factors_test"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, codes: Tensor, factors: Tensor, split: Literal["train", "test"] = "train") -> None:
        if split not in ("train", "test"):
            raise ValueError(f"DCIMetric.update: split = {split!r}; allowed: 'train' or 'test'")
        if codes.dim() != 2 or factors.dim() != 2 or codes.shape[0] != factors.shape[0]:
            raise ValueError(f"DCIMetric.update: codes {tuple(codes.shape)} and factors {tuple(factors.shape)}; "
                             "allowed: (B, n_codes) and (B, n_factors)")
        getattr(self, f"codes_{split}").append(codes.detach().float())
        getattr(self, f"factors_{split}").append(factors.detach().long())

    def compute(self) -> dict[str, float | np.ndarray]:
        def cat(v) -> Tensor:
            return torch.cat(v) if isinstance(v, list) else v  # a list per process; one tensor after a sync

        if not (isinstance(self.codes_test, Tensor) or self.codes_test) or not (
                isinstance(self.codes_train, Tensor) or self.codes_train):
            raise RuntimeError("DCIMetric.compute: needs both training and test points "
                               "(update(..., split='train') and update(..., split='test'))")
        return dci(cat(self.codes_train), cat(self.factors_train), cat(self.codes_test), cat(self.factors_test),
                   random_state=self.random_state, n_estimators=self.n_estimators, n_jobs=self.n_jobs)
