"""Forgetting of a classifier on real data vs the classes two tasks share ([S] App. G, Fig. 12).

With ``datamodules.MNISTContinual(shared=[0, 1, ..., 5])`` one fit holds every initialisation
replicated once per number ``k`` of shared digits (``zoo.MultiHeadClassifier``: member
``e = i_init * G + i_k``). Forgetting is measured on the held-out test images of task 1 with its
(frozen) head, ``metric_1(end) - metric_1(switch)``, the definition of the teacher-student
callbacks (THEORY.md sec. 2) with the test error ``1 - accuracy`` (or the cross-entropy) in place
of the generalisation error. Members that differ only in their seed (or digit draw,
``MNISTContinual(digit_draws=...)``) are grouped: the profile is their mean, with their spread,
per ``k``.

The grouping and the statistics are pure functions; the callback only evaluates and logs.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from typing import Literal

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor

from callbacks.base import HistoryCallback, output_path, warn_once
from callbacks.error_curves import parse_label
from callbacks.figures import save_figure
from callbacks.forgetting import forgetting_now, transfer_now

Metric = Literal["error", "loss"]


def group_key(label: str, drop: Sequence[str] = ("seed", "k", "draw")) -> str:
    """A member label without the parts that only repeat an experiment (the seed, the digit draw)
    or are the profile's axis: ``"gamma=0,seed=1,k=2,draw=1"`` -> ``"gamma=0"`` (``"all"`` when
    nothing is left)."""
    kept = [f"{k}={v}" for k, v in parse_label(label).items() if k not in drop]
    return ",".join(kept) or "all"


def profiles(values: Tensor | np.ndarray, labels: Sequence[str], x_key: str = "k",
             drop: Sequence[str] = ("seed", "draw")) -> dict[str, dict[str, np.ndarray]]:
    """Per group (:func:`group_key` without ``drop`` and ``x_key``), the mean and standard
    deviation over the dropped parts (seeds, digit draws) of ``values`` (E,) at each value of the
    label key ``x_key``; ``drop=("seed",)`` gives one profile per digit draw.

    Returns ``{group: {"x": (n,), "mean": (n,), "std": (n,), "count": (n,), "all": list of arrays,
    "runs": (n, R) or None}}`` with ``x`` sorted; ``std`` is the sample standard deviation (0 for a
    single seed). ``runs[i, r]`` is run ``r``'s value at ``x[i]`` (a run: a label without
    ``x_key``, e.g. one seed and digit draw), when every run has every ``x``: a run's points share
    its seed and digits, so differences along a profile are paired.
    """
    v = np.asarray(values.detach().cpu() if isinstance(values, Tensor) else values, dtype=float)
    if v.shape != (len(labels),):
        raise ValueError(f"profiles: {v.shape[0] if v.ndim else 0} values for {len(labels)} labels")
    grouped: dict[str, dict[float, dict[str, float]]] = {}
    for value, label in zip(v, labels):
        parts = parse_label(label)
        if x_key not in parts:
            raise ValueError(f"profiles: member label {label!r} has no {x_key!r}=...; the datamodule must serve "
                             f"several data sets (e.g. MNISTContinual(shared=[0, 1, 2, 3, 4, 5]))")
        run = ",".join(f"{k}={val}" for k, val in parts.items() if k != x_key)
        grouped.setdefault(group_key(label, (*drop, x_key)), {}).setdefault(float(parts[x_key]), {})[run] = float(value)
    out = {}
    for g, per_x in grouped.items():
        xs = sorted(per_x)
        samples = [np.asarray(list(per_x[x].values())) for x in xs]
        runs = sorted(per_x[xs[0]])
        paired = all(sorted(per_x[x]) == runs for x in xs)
        out[g] = {
            "x": np.asarray(xs),
            "mean": np.asarray([s.mean() for s in samples]),
            "std": np.asarray([s.std(ddof=1) if len(s) > 1 else 0.0 for s in samples]),
            "count": np.asarray([len(s) for s in samples]),
            "all": samples,
            "runs": np.asarray([[per_x[x][r] for r in runs] for x in xs]) if paired else None,
        }
    return out


def profile_shape_with_noise(x: Sequence[float], mean: Sequence[float], std: Sequence[float],
                             count: Sequence[int], tol: float, runs: np.ndarray | None = None) -> dict[str, float | bool]:
    """:func:`callbacks.forgetting.profile_shape` for a mean over seeds, so that seed noise is not
    called a shape. A difference between two points is significant when it exceeds ``tol`` and
    twice its standard error: ``sqrt(se_a^2 + se_b^2)`` (``se = std / sqrt(count)``), or, given
    ``runs`` (n, R) (each run's value at every point, :func:`profiles`), the standard error of the
    R paired differences, which removes what a run's points share (its digits, its seed).
    ``maslow``: the peak exceeds both ends significantly. ``monotonic``: the mean never rises by
    more than ``tol`` (a noisy hammer is not monotonic: failing to prove the bump is not proving
    its absence). ``flat``: no two points differ significantly (the seeds cannot tell)."""
    x, m = np.asarray(x, float), np.asarray(mean, float)
    se = np.asarray(std, float) / np.sqrt(np.maximum(np.asarray(count, float), 1))
    order = np.argsort(x)
    x, m, se = x[order], m[order], se[order]
    if runs is not None:
        runs = np.asarray(runs, float)[order]

    def exceeds(i: int, j: int) -> bool:  # point i above point j beyond noise
        if runs is not None and runs.shape[1] > 1:
            d = runs[i] - runs[j]
            return bool(d.mean() > max(tol, 2 * d.std(ddof=1) / math.sqrt(d.size)))
        return bool(m[i] - m[j] > max(tol, 2 * math.hypot(se[i], se[j])))

    k = int(np.argmax(m))
    return {
        "peak_gamma": float(x[k]),
        "maslow": bool(0 < k < len(m) - 1 and exceeds(k, 0) and exceeds(k, len(m) - 1)),
        "monotonic": not any(m[j] - m[i] > tol for i in range(len(m)) for j in range(i + 1, len(m))),
        "flat": not any(exceeds(i, j) for i in range(len(m)) for j in range(len(m)) if i != j),
    }


@torch.no_grad()
def task_metrics(pl_module: pl.LightningModule, test_sets: Sequence[tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    """Test error ``1 - accuracy`` and cross-entropy of every member on every task's head:
    ``{"error": (E, n_tasks), "loss": (E, n_tasks)}`` on the CPU."""
    err, ce = [], []
    for t, (x, y) in enumerate(test_sets):
        x, y = x.to(pl_module.device), y.to(pl_module.device)
        err.append(1 - pl_module.accuracy(x, y, t))
        ce.append(pl_module.member_loss(x, y, t))
    return {"error": torch.stack(err, 1).double().cpu(), "loss": torch.stack(ce, 1).double().cpu()}


def member_table(labels: Sequence[str], at_switch: dict[str, Tensor], end: dict[str, Tensor], forgetting: Tensor,
                 metric: Metric, digits: Sequence[Sequence[Sequence[int]]] | None,
                 set_index: Sequence[int], to_kept: Tensor | None = None) -> list[dict[str, str | float]]:
    """One row per member: its label, group (:func:`group_key`), digit draw and ``k``, the digits of
    task 1 and task 2 in label order (``digits[set_index[e]]``, a datamodule's ``digits``; blank
    without), task 1's ``metric`` at the switch and the end, the forgetting and task 2's final
    test error, and (``to_kept``, :func:`errors_to_kept`) where task 1's errors went. Every
    per-draw or per-digit statistic can be recomputed from it."""
    rows = []
    for e, lbl in enumerate(labels):
        parts = parse_label(lbl)
        ds = digits[set_index[e]] if digits is not None else None
        rows.append({
            "member": lbl, "group": group_key(lbl), "draw": parts.get("draw", ""), "k": parts.get("k", ""),
            "task1_digits": " ".join(map(str, ds[0])) if ds else "",
            "task2_digits": " ".join(map(str, ds[1])) if ds else "",
            f"task1_{metric}_switch": float(at_switch[metric][e, 0]), f"task1_{metric}_end": float(end[metric][e, 0]),
            "forgetting": float(forgetting[e]), "task2_error_end": float(end["error"][e, 1]),
            "task1_errors_to_kept": float(to_kept[e]) if to_kept is not None else "",
        })
    return rows


def write_table(path, rows: Sequence[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def errors_to_kept(pred: Tensor, target: Tensor, task1: Sequence[int], task2: Sequence[int]) -> float:
    """Of task 1's test errors on the digits task 2 dropped, the fraction predicted as a label whose
    digit task 2 kept; ``pred``, ``target`` (N,) task 1 labels, ``task1``/``task2`` the digits in
    label order. Errors spread evenly would give ``k / 4`` (``k`` kept of the 4 wrong labels); a
    fraction near 1 means task 2 merged the dropped digits into the kept ones. NaN without errors."""
    kept = torch.tensor([i for i, d in enumerate(task1) if d in task2], dtype=torch.long)
    dropped_wrong = (pred != target) & ~torch.isin(target, kept)
    n = int(dropped_wrong.sum())
    return float(torch.isin(pred[dropped_wrong], kept).sum()) / n if n else math.nan


class TaskForgetting(HistoryCallback):
    """Test error and cross-entropy of every task, forgetting of task 1, and its profile vs ``k``.

    Every ``every_n_steps`` (and at the start, at the switch and at the end) it evaluates each
    task's head on the datamodule's ``test_set(task)`` and logs ``test_error/task<t>/<member>`` and
    ``test_loss/task<t>/<member>`` (1-based ``t``) for up to ``max_members`` members, and, after
    the switch, ``forgetting/<member>``. At the end it logs ``forgetting_final/<member>``,
    ``transfer_final/<member>`` and, per group of members that differ only in seed,
    ``forgetting_profile/<group>/k=<k>`` (mean over seeds), ``.../paired/k=<k>-k=<k0>`` and
    ``.../paired_se/...`` (each run's difference from its first ``k``, mean and standard error:
    what the shape test weighs), ``.../peak_k``, ``.../maslow`` and
    ``.../monotonic`` (:func:`profile_shape_with_noise`: beyond ``tol`` and two standard errors of
    the paired differences between a run's points), with digit draws
    ``forgetting_by_draw/<group>,draw=<d>/k=<k>`` (mean over seeds), and, when the datamodule
    has ``digits``, ``errors_to_kept/<group>/k=<k>`` (:func:`errors_to_kept`, mean over runs), and
    writes ``forgetting_members.csv`` (:func:`member_table`) and ``forgetting_vs_shared.png``:
    (a) forgetting vs ``k``, mean and spread over seeds, one curve per group; (b) task 1's test
    error over training, mean per group and ``k``.

    Args:
        every_n_steps: SGD steps between evaluations (each costs a forward pass over the test sets).
        metric: what forgetting is measured in: ``"error"`` (1 - accuracy) or ``"loss"`` (cross-entropy).
        tol: the margin of :func:`profile_shape` in units of ``metric``.
        max_members: members with their own scalar tags.
        figure: write ``forgetting_vs_shared.png``.
        table: write ``forgetting_members.csv``, one row per member (:func:`member_table`): its
            digits, task 1's metric at the switch and the end, the forgetting, task 2's final error.
    """

    HISTORY_KEYS = ("steps", "error", "loss")

    def __init__(self, every_n_steps: int = 200, metric: Metric = "error", tol: float = 0.005,
                 max_members: int = 32, figure: bool = True, table: bool = True) -> None:
        super().__init__(every_n_steps)
        name = type(self).__name__
        if metric not in ("error", "loss"):
            raise ValueError(f"{name}: metric = {metric!r}; allowed: 'error' or 'loss'")
        if not tol >= 0:
            raise ValueError(f"{name}: tol = {tol!r}; allowed: a number >= 0")
        if isinstance(max_members, bool) or int(max_members) != max_members or max_members < 0:
            raise ValueError(f"{name}: max_members = {max_members!r}; allowed: an integer >= 0")
        self.metric, self.tol, self.max_members = metric, float(tol), int(max_members)
        self.figure, self.table = bool(figure), bool(table)
        self.result: dict = {}

    def _reset(self) -> None:
        super()._reset()
        self.at_switch: dict[str, Tensor] | None = None

    def state_dict(self) -> dict:
        return super().state_dict() | {"at_switch": self.at_switch}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.at_switch = state_dict.get("at_switch")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "accuracy", "member_loss")
        dm = trainer.datamodule
        name = type(self).__name__
        if dm is None or not callable(getattr(dm, "test_set", None)) or not getattr(dm, "switch_steps", None):
            raise TypeError(f"{name} needs a continual datamodule with test_set(task) and switch_steps "
                            "(e.g. datamodules.MNISTContinual)")
        self.switch = int(dm.switch_steps[0])
        self.n_tasks = int(getattr(dm, "n_tasks", 2))
        self._tests = [dm.test_set(t) for t in range(self.n_tasks)]

    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Tensor]:
        step = trainer.global_step
        if self.history["steps"] and self.history["steps"][-1] == step:  # the switch is also due: once
            return {"error": self.history["error"][-1], "loss": self.history["loss"][-1]}
        m = task_metrics(pl_module, self._tests)
        self.history["steps"].append(step)
        self.history["error"].append(m["error"])
        self.history["loss"].append(m["loss"])
        labels = pl_module.labels[: self.max_members]
        scalars = {}
        for key in ("error", "loss"):
            for t in range(self.n_tasks):
                scalars |= {f"test_{key}/task{t + 1}/{lbl}": m[key][e, t] for e, lbl in enumerate(labels)}
        if self.at_switch is not None:
            f = forgetting_now(self.at_switch[self.metric], m[self.metric])
            scalars |= {f"forgetting/{lbl}": f[e] for e, lbl in enumerate(labels)}
        self.log_scalars(trainer, scalars, step=step)
        return m

    def on_due(self, trainer, pl_module, outputs) -> None:
        self._evaluate(trainer, pl_module)

    @torch.no_grad()
    def _errors_to_kept(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Tensor | None:
        """:func:`errors_to_kept` of every member at the end, (E,); None without the digits."""
        digits = getattr(trainer.datamodule, "digits", None)
        if digits is None or not callable(getattr(pl_module, "member_targets", None)):
            return None
        x, y = self._tests[0]
        pred = pl_module(x.to(pl_module.device), 0).argmax(-1).cpu()
        target = pl_module.member_targets(y.to(pl_module.device)).cpu()
        sets = pl_module.set_index.cpu().tolist()
        return torch.tensor([errors_to_kept(pred[e], target[e], *digits[sets[e]]) for e in range(len(sets))],
                            dtype=torch.float64)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.switch and self.at_switch is None:
            self.at_switch = self._evaluate(trainer, pl_module)  # the weights at the end of task 1
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.at_switch is None:
            warn_once(f"{type(self).__name__}: training ended before the task switch; no forgetting to report")
            return
        end = self._evaluate(trainer, pl_module)
        forgetting = forgetting_now(self.at_switch[self.metric], end[self.metric])
        transfer = transfer_now(self.at_switch[self.metric], end[self.metric])
        labels = pl_module.labels
        scalars = {f"forgetting_final/{lbl}": forgetting[e] for e, lbl in enumerate(labels[: self.max_members])}
        scalars |= {f"transfer_final/{lbl}": transfer[e] for e, lbl in enumerate(labels[: self.max_members])}
        self.result = {"forgetting": forgetting, "transfer": transfer, "labels": list(labels), "profiles": {},
                       "final": end, "to_kept": self._errors_to_kept(trainer, pl_module)}
        if any("k" in parse_label(lbl) for lbl in labels):
            prof = profiles(forgetting, labels)
            self.result["task2_profiles"] = profiles(end["error"][:, 1], labels)
            for g, p in prof.items():
                shape = profile_shape_with_noise(p["x"], p["mean"], p["std"], p["count"], self.tol, p["runs"])
                p["shape"] = shape
                scalars |= {f"forgetting_profile/{g}/k={x:g}": m for x, m in zip(p["x"], p["mean"])}
                if p["runs"] is not None and p["runs"].shape[1] > 1:
                    # paired with the first k: what the shape test weighs (a run's points share its digits)
                    d = p["runs"] - p["runs"][:1]
                    p["paired_mean"], p["paired_se"] = d.mean(1), d.std(1, ddof=1) / math.sqrt(d.shape[1])
                    x0 = p["x"][0]
                    for x, dm_, se in list(zip(p["x"], p["paired_mean"], p["paired_se"]))[1:]:
                        scalars[f"forgetting_profile/{g}/paired/k={x:g}-k={x0:g}"] = dm_
                        scalars[f"forgetting_profile/{g}/paired_se/k={x:g}-k={x0:g}"] = se
                scalars |= {f"forgetting_profile/{g}/peak_k": shape["peak_gamma"],
                            f"forgetting_profile/{g}/maslow": float(shape["maslow"]),
                            f"forgetting_profile/{g}/monotonic": float(shape["monotonic"])}
            self.result["profiles"] = prof
            if self.result["to_kept"] is not None:
                for g, p in profiles(self.result["to_kept"], labels).items():
                    for x, v in zip(p["x"], p["all"]):
                        if np.isfinite(v).any():  # NaN: no error on a dropped digit (none at k = 5)
                            scalars[f"errors_to_kept/{g}/k={x:g}"] = float(np.nanmean(v))
            if any("draw" in parse_label(lbl) for lbl in labels):
                # per digit draw, mean over seeds: which digits a draw keeps can make or unmake a bump
                by_draw = profiles(forgetting, labels, drop=("seed",))
                self.result["draw_profiles"] = by_draw
                for g, p in by_draw.items():
                    scalars |= {f"forgetting_by_draw/{g}/k={x:g}": m for x, m in zip(p["x"], p["mean"])}
        self.log_scalars(trainer, scalars)
        if self.table:
            rows = member_table(labels, self.at_switch, end, forgetting, self.metric,
                                getattr(trainer.datamodule, "digits", None), pl_module.set_index.cpu().tolist(),
                                self.result["to_kept"])
            write_table(output_path(trainer, "forgetting_members.csv"), rows)
        if self.figure and self.result["profiles"]:
            steps = np.asarray(self.history["steps"])
            err1 = torch.stack(self.history["error"])[:, :, 0].numpy()  # (n, E)
            forgetting_profile_figure(output_path(trainer, "forgetting_vs_shared.png"), self.result["profiles"],
                                      self.result["task2_profiles"], self.metric, steps, err1, labels, self.switch)


def forgetting_profile_figure(path, prof: dict, task2: dict, metric: str, steps: np.ndarray, err1: np.ndarray,
                              labels: Sequence[str], switch: int) -> None:
    """(a) forgetting vs shared classes ``k``, mean +- standard deviation over runs, a run being a
    seed and a digit draw (dots: single runs); (b) task 1's test error over steps, mean over runs,
    one line per group and ``k``;
    (c) task 2's final test error vs ``k`` (did the second task get learned?)."""
    from callbacks.figures import _plt

    plt = _plt()
    fig, (a, b, c2) = plt.subplots(1, 3, figsize=(17, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (g, p) in enumerate(prof.items()):
        c = colours[i % len(colours)]
        shape = p.get("shape", {})
        tag = " (hammer, peak k=%g)" % shape["peak_gamma"] if shape.get("maslow") else (
            " (monotonic)" if shape.get("monotonic") else " (no shape beyond seed noise)" if shape.get("flat")
            else " (neither)")
        a.errorbar(p["x"], p["mean"], yerr=p["std"], color=c, marker="o", capsize=3, label=g + tag)
        for x, samples in zip(p["x"], p["all"]):
            a.plot(np.full(len(samples), x), samples, ".", color=c, alpha=0.35)
        members = [e for e, lbl in enumerate(labels) if group_key(lbl) == g]
        ks = sorted({float(parse_label(labels[e])["k"]) for e in members})
        for j, k in enumerate(ks):
            sel = [e for e in members if float(parse_label(labels[e])["k"]) == k]
            b.plot(steps, err1[:, sel].mean(1), color=c, alpha=0.3 + 0.7 * j / max(1, len(ks) - 1), lw=1)
        q = task2[g]
        c2.errorbar(q["x"], q["mean"], yerr=q["std"], color=c, marker="o", capsize=3)
    a.axhline(0, color="grey", lw=0.5)
    a.set_xlabel("shared classes k (0: five new digits, 5: the same task)")
    a.set_ylabel(f"forgetting of task 1 (test {metric}: end - switch)")
    a.set_title("(a) forgetting vs task similarity, mean +- sd over runs (seeds x digit draws)")
    a.legend(fontsize=7)
    b.axvline(switch, color="grey", ls=":", lw=1)
    b.set_xlabel("SGD step")
    b.set_ylabel("task 1 test error (1 - accuracy)")
    b.set_title("(b) task 1 over training; darker = larger k")
    c2.set_xlabel("shared classes k")
    c2.set_ylabel("task 2 test error at the end")
    c2.set_title("(c) task 2 learned?")
    save_figure(fig, path, dpi=100)
