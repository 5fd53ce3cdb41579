"""Forgetting, transfer and the shape of a forgetting profile ([S] Sec. 4.2.1, App. G).

Pure functions on error tensors and on ``member_params`` (one dict of parameters per member, as
ensemble modules expose them); no Lightning, no plotting.

Definitions (docs/theory.md#forgetting, after Lee et al. 2021/2022): with ``eps_t`` the error of task ``t``,
**forgetting** of task ``t`` is ``eps_t(now) - eps_t(end of task t)`` (positive = forgotten) and
**transfer** to task ``t`` is ``eps_t(start of task t) - eps_t(now)``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from zoo.utils.labels import member_label


def error_matrix(at_task_ends: Sequence[Tensor]) -> Tensor:
    """The continual-learning error matrix ``M[e, i, j]``: member ``e``'s error on task ``j`` at
    the end of task ``i`` (the accuracy matrix of Lopez-Paz & Ranzato 2017, in errors), from the
    ``(E, n_tasks)`` errors recorded at the end of each task so far, in task order."""
    if not at_task_ends:
        raise ValueError("error_matrix: no task has ended yet")
    # on the host: the errors may come from the module's device, and M is for tables and figures
    M = torch.stack([torch.as_tensor(a).to("cpu", torch.float64) for a in at_task_ends], 1)
    if M.dim() != 3 or M.shape[1] > M.shape[2]:
        raise ValueError(f"error_matrix: need (E, n_tasks) errors for at most n_tasks task ends; got {tuple(M.shape)}")
    return M


def forgetting_transfer(M: Tensor, now: Tensor) -> tuple[Tensor, Tensor]:
    """From the error matrix ``M`` (E, k, n_tasks) of the ``k`` finished tasks and the errors
    ``now`` (E, n_tasks): forgetting of every finished task ``now[:, i] - M[:, i, i]``, (E, k),
    and transfer to the task after the last finished one ``M[:, k-1, k] - now[:, k]``, (E,)
    (NaN once every task has finished)."""
    k, n = M.shape[1], M.shape[2]
    M = M.to(now.device)  # M is kept on the host (error_matrix); now may be on the module's device
    forgetting = now[:, :k] - torch.diagonal(M, dim1=1, dim2=2)
    transfer = M[:, k - 1, k] - now[:, k] if k < n else torch.full_like(now[:, 0], math.nan)
    return forgetting, transfer


def profile_shape(x: Sequence[float], values: Sequence[float], tol: float = 0.01,
                  runs: np.ndarray | None = None) -> dict[str, float | bool | str]:
    """The shape of a forgetting profile over task similarity ([S] Sec. 4.2.1).

    ``x`` is a similarity (the feature similarity ``gamma`` of [S] Eq. 5, or the number ``k`` of
    shared classes, App. G), ``values`` the forgetting at each ``x`` (a mean over runs if ``runs``,
    ``(n, R)``, gives each run's value: then a difference counts only beyond two standard errors
    of the ``R`` paired differences, since a run's points share its seed and data).

    One definition for every profile: a difference between two points is *significant* when it
    exceeds ``tol`` (and the noise, with ``runs``).

    * ``monotonic``: forgetting never rises with similarity by more than ``tol``, the profile of
      non-specialised students ([S] Sec. 4.2.1: "forgetting decreases monotonically with task
      similarity"); a flat profile is monotonic too;
    * ``maslow``: Maslow's hammer, the maximum lies strictly inside the range and exceeds both
      ends significantly ([S] Sec. 4.2.1: forgetting is worst at intermediate similarity);
    * ``flat``: no two points differ significantly;
    * ``kind``: ``"maslow"``, ``"flat"``, ``"monotonic"`` or ``"other"`` (in that precedence);
    * ``peak``: the ``x`` of the largest value.
    """
    x, m = np.asarray(x, dtype=float), np.asarray(values, dtype=float)
    if x.shape != m.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"profile_shape: need equal-length 1-d x and values with >= 2 points; got {x.shape}, {m.shape}")
    if not tol >= 0:
        raise ValueError(f"profile_shape: tol = {tol}; allowed: >= 0")
    order = np.argsort(x, kind="stable")
    x, m = x[order], m[order]
    runs = None if runs is None or np.asarray(runs).shape[1] < 2 else np.asarray(runs, dtype=float)[order]

    def above(i: int, j: int) -> bool:  # point i significantly above point j
        if runs is None:
            return bool(m[i] - m[j] > tol)
        diff = runs[i] - runs[j]
        return bool(diff.mean() > max(tol, 2 * diff.std(ddof=1) / math.sqrt(diff.size)))

    k, n = int(np.argmax(m)), len(m)
    shape = {
        "peak": float(x[k]),
        "monotonic": not any(m[j] - m[i] > tol for i in range(n) for j in range(i + 1, n)),
        "maslow": 0 < k < n - 1 and above(k, 0) and above(k, n - 1),
        "flat": not any(above(i, j) for i in range(n) for j in range(n) if i != j),
    }
    shape["kind"] = next(kind for kind in ("maslow", "flat", "monotonic", "other") if shape.get(kind, True))
    return shape


def profiles(values: Tensor | np.ndarray, member_params: Sequence[Mapping[str, object]], over: str,
             repeats: Sequence[str] = ("seed", "draw")) -> dict[str, dict]:
    """Forgetting profiles over the member parameter ``over`` (``"gamma"``, ``"k"``).

    Members are grouped by their other parameters except ``repeats`` (runs of one experiment: a
    seed, a digit draw); per group (named by :func:`zoo.utils.labels.member_label` of its parameters,
    ``"all"`` when none is left) and per value of ``over``, the mean of ``values`` (E,) over the
    runs and their sample standard deviation.

    Returns ``{group: {"params": dict, "x": (n,), "mean": (n,), "std": (n,), "all": [arrays],
    "runs": (n, R) or None}}`` with ``x`` sorted; ``runs[i, r]`` is run ``r``'s value at ``x[i]``
    when every run has every ``x`` (then the points of a run are paired).
    """
    v = np.asarray(values.detach().cpu() if isinstance(values, Tensor) else values, dtype=float)
    if v.shape != (len(member_params),):
        raise ValueError(f"profiles: {v.size} values for {len(member_params)} members")
    grouped: dict[str, dict] = {}
    for value, params in zip(v, member_params):
        if over not in params:
            raise ValueError(f"profiles: a member has no parameter {over!r} ({dict(params)}); the profile's axis must be "
                             "a parameter of every member (a list of gamma, or MNISTContinual(shared=[...]))")
        group = {k: p for k, p in params.items() if k != over and k not in repeats}
        run = tuple((k, repr(p)) for k, p in params.items() if k in repeats)
        entry = grouped.setdefault(member_label(group) or "all", {"params": group, "points": {}})
        entry["points"].setdefault(float(params[over]), {})[run] = float(value)
    out = {}
    for name, entry in grouped.items():
        per_x = entry["points"]
        xs = sorted(per_x)
        samples = [np.asarray(list(per_x[x].values())) for x in xs]
        keys = sorted(per_x[xs[0]])
        paired = all(sorted(per_x[x]) == keys for x in xs)
        out[name] = {
            "params": entry["params"], "x": np.asarray(xs), "all": samples,
            "mean": np.asarray([s.mean() for s in samples]),
            "std": np.asarray([s.std(ddof=1) if len(s) > 1 else 0.0 for s in samples]),
            "runs": np.asarray([[per_x[x][r] for r in keys] for x in xs]) if paired else None,
        }
    return out



def paired_differences(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error over the runs (axis 1) of each point's difference from the first
    point of the same run: what the shape test of :func:`profile_shape` weighs."""
    diff = runs - runs[:1]
    return diff.mean(1), diff.std(1, ddof=1) / math.sqrt(diff.shape[1])


def per_group(values: np.ndarray, member_params: Sequence[Mapping[str, object]], over: str,
              repeats: tuple[str, ...]) -> dict:
    """Per-member rows ``values`` (E, u) as profiles: group -> (n_x, u), the mean over a group's runs."""
    units = [profiles(values[:, u], member_params, over, repeats) for u in range(values.shape[1])]
    return {g: np.stack([prof[g]["mean"] for prof in units], -1) for g in units[0]}


def member_table(member_params: Sequence[Mapping[str, object]], forgetting: Tensor, at_switch: Tensor,
                 end: Tensor) -> list[dict]:
    """A row per member: its parameters, its forgetting and every task's error at the switch and at the end."""
    n = end.shape[1]
    return [{**p, "forgetting": float(forgetting[e]), **{f"task{t + 1}_error_switch": float(at_switch[e, t]) for t in range(n)},
             **{f"task{t + 1}_error_end": float(end[e, t]) for t in range(n)}} for e, p in enumerate(member_params)]

def errors_to_kept(pred: Tensor, target: Tensor, task1: Sequence[int], task2: Sequence[int]) -> float:
    """Of task 1's test errors on the digits task 2 dropped, the fraction predicted as a label whose
    digit task 2 kept ([S] App. G runs; ``pred``, ``target`` (N,) task 1 labels, ``task1``/``task2``
    the digits in label order, as ``MNISTContinual.digits[s]``). Errors spread evenly would give
    ``k / 4`` (``k`` kept of the 4 wrong labels); near 1, task 2 merged the dropped digits into the
    kept ones. NaN without such errors."""
    kept = torch.tensor([i for i, d in enumerate(task1) if d in task2], dtype=torch.long, device=pred.device)
    dropped_wrong = (pred != target) & ~torch.isin(target, kept)
    n = int(dropped_wrong.sum())
    return float(torch.isin(pred[dropped_wrong], kept).sum()) / n if n else math.nan
