"""Forgetting, transfer, and forgetting vs task similarity ([S] Sec. 4.2.1, Fig. 6; App. F, Fig. 11).

Definitions (THEORY.md sec. 2, after Lee et al. 2021/2022): with ``eps_t`` the generalisation
error of task ``t`` ([S] Eq. 9) and ``t_switch`` the end of task 1,

* **forgetting** ``= eps_1(t_switch + Delta) - eps_1(t_switch)``: how much task 1 got worse while
  task 2 was trained (positive = forgotten);
* **transfer** ``= eps_2(t_switch) - eps_2(t_end)``: how much task 2's error fell while training on it.

:class:`Forgetting` records every task's error of every member at each switch and logs both
quantities while the later tasks train. :class:`ForgettingProfile` adds the paper's figure: one
fit holds every initialisation replicated over a list of feature similarities ``gamma``
(``datamodules.TeacherStudent(gamma=[...])``; member ``e = i_init * G + i_gamma``), and at the end
it draws forgetting vs ``gamma``, one curve per initialisation, beside the mean-field ODE
([S] Eqs. 20-22, :func:`zoo.theory.meanfield.integrate`) started from the same initial order
parameters, plus the final node norms ``sqrt(Q_ii)`` ([S] Fig. 6b). Maslow's hammer is a profile
whose maximum lies at an intermediate similarity; specialisation is what produces it ([S] Sec. 4.2.1).

The maths (grouping members, the shape of a profile, the ODE's prediction) are pure functions
below; the callbacks only gather the errors and log.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor

from callbacks.base import PeriodicCallback, output_path, warn_once
from callbacks.error_curves import parse_label
from callbacks.figures import save_figure
from zoo.metrics.overlaps import forgetting, transfer

Source = Literal["theory", "mc"]
ODE_ACTIVATIONS = ("erf", "linear")
"""Activations whose mean-field ODE is exact at any ``eta`` (ReLU's omits the ``eta^2`` term)."""


# ------------------------------------------------------------------------------------------------
# pure functions
# ------------------------------------------------------------------------------------------------
def member_grid(ensemble: int, teacher_sets: int) -> np.ndarray:
    """Member index of every (initialisation, similarity) pair, ``(n_init, G)``.

    ``zoo.MultiHeadStudent`` replicates each initialisation once per teacher set, so member
    ``e = i_init * G + i_gamma`` learns teacher set ``i_gamma``.
    """
    if ensemble % teacher_sets:
        raise ValueError(f"member_grid: ensemble = {ensemble} is not a multiple of teacher_sets = {teacher_sets}")
    return np.arange(ensemble).reshape(ensemble // teacher_sets, teacher_sets)


def forgetting_now(eps_switch: Tensor, eps_now: Tensor, task: int = 0) -> Tensor:
    """``eps_t(now) - eps_t(switch)`` of task ``task`` for every member, from errors (E, n_tasks)."""
    return forgetting(torch.stack([eps_switch[:, task], eps_now[:, task]], -1), i_switch=0, delta=1)


def transfer_now(eps_switch: Tensor, eps_now: Tensor, task: int = 1) -> Tensor:
    """``eps_t(switch) - eps_t(now)`` of task ``task`` (the one trained since the switch), (E,)."""
    return transfer(torch.stack([eps_switch[:, task], eps_now[:, task]], -1), i_switch=0, i_end=1)


def profile_shape(gammas: Sequence[float], values: Sequence[float], tol: float = 0.01) -> dict[str, float | bool]:
    """Shape of one forgetting-vs-similarity curve ([S] Sec. 4.2.1).

    Returns ``peak_gamma`` (the similarity of the largest forgetting), ``monotonic`` (forgetting
    never rises with ``gamma`` by more than ``tol``: the profile of non-specialised students),
    ``maslow`` (Maslow's hammer: the maximum lies inside the range and exceeds both ends by more
    than ``tol``) and ``flat`` (all values within ``tol`` of each other; such a curve also counts as
    monotonic). ``monotonic`` and ``maslow`` exclude each other; both are False for a curve that rises.
    """
    g = np.asarray(gammas, dtype=float)
    f = np.asarray(values, dtype=float)
    if g.shape != f.shape or g.ndim != 1 or len(g) < 2:
        raise ValueError(f"profile_shape: need equal-length 1-d gammas and values with >= 2 points; got {g.shape}, {f.shape}")
    order = np.argsort(g)
    g, f = g[order], f[order]
    k = int(np.argmax(f))
    # the largest rise between any earlier and later similarity
    rise = max(float(np.max(f[j:] - f[j])) for j in range(len(f)))
    return {
        "peak_gamma": float(g[k]),
        "monotonic": rise <= tol,
        "maslow": 0 < k < len(f) - 1 and f[k] - f[0] > tol and f[k] - f[-1] > tol,
        "flat": float(f.max() - f.min()) <= tol,
    }


def ode_forgetting(
    Q0: Tensor, R0: Tensor, T: Tensor, heads0: Tensor, teacher_heads: Tensor, *,
    activation: str, eta: float, alpha_switch: Sequence[float], alpha_end: float,
    alpha_read: float | None = None, alpha_norms: float | None = None, d_alpha: float = 0.01,
) -> dict[str, Tensor]:
    """The mean-field prediction of forgetting for every member ([S] Eqs. 20-22, THEORY.md sec. 2).

    Integrates :func:`zoo.theory.meanfield.integrate` once for all members (shapes as there) up to
    ``alpha_end`` and reads ``eps_1`` at the first switch and at ``alpha_read`` (default: the end).

    Returns:
        ``forgetting`` (E,) and ``transfer`` (E,) of task 2, both at ``alpha_read``; ``norms`` (E, p):
        the node norms ``sqrt(Q_ii)`` at ``alpha_norms`` (default: the end); the trajectory's
        ``alpha`` (n,) and ``eps`` (E, n, n_tasks).
    """
    from zoo.theory.meanfield import integrate

    alpha_read = alpha_end if alpha_read is None else float(alpha_read)
    alpha_norms = alpha_end if alpha_norms is None else float(alpha_norms)
    # record on a grid that holds both read-out times exactly (the switches and the end always are)
    stride = max(1, int(round(1.0 / d_alpha)))
    for a in (alpha_read, alpha_norms):
        stride = math.gcd(stride, int(round(a / d_alpha)))
    traj = integrate(Q0, R0, T, heads0, teacher_heads, activation=activation, eta=eta,
                     alpha_switch=list(alpha_switch), alpha_end=alpha_end, d_alpha=d_alpha,
                     record_every=stride * d_alpha)
    i_s, i_r, i_n = traj.i_switch[0], traj.index(alpha_read), traj.index(alpha_norms)
    return {
        "forgetting": forgetting(traj.eps[..., 0], i_s, i_r - i_s),
        "transfer": transfer(traj.eps[..., 1], i_s, i_r),
        "norms": torch.diagonal(traj.Q[:, i_n], dim1=-2, dim2=-1).clamp_min(0).sqrt(),
        "alpha": traj.alpha,
        "eps": traj.eps,
    }


def angle_text(value: float) -> str:
    """``0.3927`` -> ``"pi/8"``: angles that are multiples of pi/16 ([S] Fig. 11) in words."""
    k = value * 16 / math.pi
    if abs(k - round(k)) > 2e-3 * max(1.0, abs(k)):
        return f"{value:.4g}"
    k = int(round(k))
    if k == 0:
        return "0"
    g = math.gcd(k, 16)
    num, den = k // g, 16 // g
    return ("pi" if num == 1 else f"{num}pi") + ("" if den == 1 else f"/{den}")


def pretty_label(label: str) -> str:
    """A member label for a legend: angles (keys ``theta...``) as multiples of pi, ``, `` between parts."""
    parts = []
    for key, value in parse_label(label).items():
        if key.startswith("theta"):
            try:
                value = angle_text(float(value))
            except ValueError:
                pass
        parts.append(f"{key}={value}")
    return ", ".join(parts) if parts else label


# ------------------------------------------------------------------------------------------------
# callbacks
# ------------------------------------------------------------------------------------------------
class Forgetting(PeriodicCallback):
    """Logs forgetting and transfer of every member while the later tasks train.

    At each task switch it stores every task's error of every member (the weights at the end of
    the finished task: a switch always falls between two chunks of the stream). Then, every
    ``every_n_steps``, it logs ``forgetting/<member>`` = ``eps_1(now) - eps_1(switch)`` and
    ``transfer/<member>`` = ``eps_2(switch) - eps_2(now)`` (with more than two tasks also
    ``forgetting/task<t>/<member>`` of every finished task ``t >= 2`` and ``transfer/task<t>/<member>``
    of the task ``t >= 3`` in training; 1-based ``t``), for up to
    ``max_members`` members. With ``delta_alpha`` it logs ``forgetting_delta/<member>`` once, at
    ``Delta = delta_alpha`` time units after the first switch; at the end of training it logs
    ``forgetting_final/<member>`` and ``transfer_final/<member>``.

    Args:
        every_n_steps: SGD steps between logs.
        delta_alpha: ``Delta`` of the forgetting in time units (``alpha = steps / d``); must fall
            on a chunk boundary of the stream; default: none (only the running and final values).
        source: ``"theory"``: errors from the order parameters (``theory_error``, [S] Eq. 9 on the
            simulated weights: exact, no Monte-Carlo noise; erf/relu/linear); ``"mc"``: the
            datamodule's test sets (any activation; a ``zoo.classifier.MultiHeadClassifier`` on
            ``datamodules.MNISTContinual`` too, whose errors are ``1 - accuracy``). The module's
            ``task_errors(datamodule, source)`` gives them.
        max_members: members with their own tags (a large ensemble would flood TensorBoard).
    """

    def __init__(self, every_n_steps: int = 1000, delta_alpha: float | None = None, source: Source = "theory",
                 max_members: int = 64) -> None:
        super().__init__(every_n_steps)
        name = type(self).__name__
        if source not in ("theory", "mc"):
            raise ValueError(f"{name}: source = {source!r}; allowed: 'theory' or 'mc'")
        if delta_alpha is not None and not (delta_alpha > 0 and math.isfinite(delta_alpha)):
            raise ValueError(f"{name}: delta_alpha = {delta_alpha}; allowed: a positive number of time units, or null")
        if max_members < 0:
            raise ValueError(f"{name}: max_members = {max_members}; allowed: >= 0")
        self.delta_alpha, self.source, self.max_members = delta_alpha, source, int(max_members)
        self._reset()

    def _reset(self) -> None:
        self.switch_errors: dict[int, Tensor] = {}  # switch k -> errors (E, n_tasks) at its step
        self.delta_errors: Tensor | None = None
        self.final_errors: Tensor | None = None
        self.delta_step: int | None = None

    # -- checks --------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._reset()  # a checkpoint's state (load_state_dict) is restored after this

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        name = type(self).__name__
        self.need(pl_module, "task_errors", *(("theory_error",) if self.source == "theory" else ()))
        dm = trainer.datamodule
        if dm is None or (self.source == "theory" and not hasattr(dm, "W_teachers")):
            raise TypeError(f"{name}: source = 'theory' needs a teacher-student datamodule (datamodules.TeacherStudent)")
        if self.source == "mc" and not callable(getattr(dm, "test_set", None)):
            raise TypeError(f"{name}: source = 'mc' needs a datamodule with test sets (TeacherStudent, MNISTContinual)")
        if self.delta_alpha is not None and not hasattr(pl_module, "d"):
            raise ValueError(f"{name}: delta_alpha is in time units alpha = steps / d of a teacher-student run; "
                             f"{type(pl_module).__name__} has no d: leave delta_alpha unset")
        switches = list(getattr(dm, "switch_steps", []) or [])
        if getattr(dm, "n_tasks", 1) < 2 or not switches:
            raise ValueError(f"{name}: the datamodule has no task switch (n_tasks = {getattr(dm, 'n_tasks', 1)}); "
                             "forgetting needs n_tasks >= 2 and a switch_step")
        if self.source == "theory" and getattr(pl_module, "activation", None) == "sigmoid":
            raise ValueError(f"{name}: source = 'theory' has no closed form for activation 'sigmoid'; use source = 'mc'")
        self.switch_steps = [int(s) for s in switches]
        if self.delta_alpha is not None:
            d = pl_module.d
            step = self.switch_steps[0] + int(round(self.delta_alpha * d))
            if step > dm.num_steps:
                raise ValueError(f"{name}: delta_alpha = {self.delta_alpha} reaches beyond the end of training "
                                 f"(alpha = {dm.num_steps / d:g}; the switch is at {self.switch_steps[0] / d:g})")
            ends = {c[0] + c[1] for c in getattr(dm, "chunks", [])} or {step}
            if abs(self.delta_alpha * d - round(self.delta_alpha * d)) > 1e-6 or step not in ends:
                spb = getattr(dm, "steps_per_batch", "?")
                raise ValueError(
                    f"{name}: delta_alpha = {self.delta_alpha} is {self.delta_alpha * d:g} steps after the switch, which is "
                    f"not the end of a chunk of the stream (steps_per_batch = {spb}, d = {d}); allowed: a multiple of "
                    f"steps_per_batch / d up to the end of training")
            self.delta_step = step

    # -- recording -----------------------------------------------------------------------------------
    def error(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Tensor:
        """Every member's error on every task now, (E, n_tasks), float64 on the CPU."""
        return pl_module.task_errors(trainer.datamodule, self.source)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        eps = None
        if step in self.switch_steps and self.switch_steps.index(step) not in self.switch_errors:
            eps = self.error(trainer, pl_module)
            self.switch_errors[self.switch_steps.index(step)] = eps
        if step == self.delta_step and 0 in self.switch_errors:
            eps = self.error(trainer, pl_module) if eps is None else eps
            self.delta_errors = eps
            self._log_members(trainer, pl_module, "forgetting_delta", forgetting_now(self.switch_errors[0], eps))
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_due(self, trainer, pl_module, outputs) -> None:
        if not self.switch_errors:
            return
        self._log_now(trainer, pl_module, self.error(trainer, pl_module), prefix="")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.switch_errors:
            warn_once(f"{type(self).__name__}: training ended before the first task switch; nothing to report")
            return
        self.final_errors = self.error(trainer, pl_module)
        self._log_now(trainer, pl_module, self.final_errors, prefix="_final")

    def _log_now(self, trainer, pl_module, eps: Tensor, prefix: str) -> None:
        """Forgetting of every finished task and transfer to the task in training."""
        for k, at_switch in sorted(self.switch_errors.items()):
            # switch k ends task k (0-based) and starts task k + 1
            tag = "" if k == 0 else f"/task{k + 1}"
            self._log_members(trainer, pl_module, f"forgetting{prefix}{tag}", forgetting_now(at_switch, eps, task=k))
            if k == max(self.switch_errors):
                tag = "" if k == 0 else f"/task{k + 2}"
                self._log_members(trainer, pl_module, f"transfer{prefix}{tag}", transfer_now(at_switch, eps, task=k + 1))

    def _log_members(self, trainer, pl_module, tag: str, values: Tensor) -> None:
        labels = pl_module.labels[: self.max_members]
        self.log_scalars(trainer, {f"{tag}/{lbl}": values[e] for e, lbl in enumerate(labels)})

    # -- resume ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"switch_errors": dict(self.switch_errors), "delta_errors": self.delta_errors}

    def load_state_dict(self, state_dict: dict) -> None:
        self.switch_errors = dict(state_dict.get("switch_errors", {}))
        self.delta_errors = state_dict.get("delta_errors")


class ForgettingProfile(Forgetting):
    """Forgetting vs task similarity, one curve per initialisation, simulation beside theory ([S] Fig. 6, 11).

    Needs a datamodule with several similarities (``gamma: [0.0, 0.1, ..., 1.0]``), so that every
    initialisation of the student is trained once per ``gamma`` in the same fit. At the end of
    training it takes each member's forgetting (``Delta = delta_alpha`` after the first switch, or
    the end of training) and the final node norms ``sqrt(Q_ii)``, groups the members by
    initialisation, and integrates the mean-field ODE for all members at once from their initial
    order parameters (erf and linear students, online SGD without label noise: there the ODE is
    exact as ``d -> infinity``; the ReLU ODE omits the ``eta^2`` term and sigmoid has none, so they
    are drawn as simulation only).

    Writes ``forgetting_profile.png`` (a: forgetting vs gamma, simulation solid with markers, ODE
    dashed; b: final ``sqrt(Q_ii)`` of unit 1 solid, unit 2 dashed, ODE as crosses) or, with
    ``grid_rows`` and ``grid_cols`` (label keys, e.g. ``theta`` and ``theta2``: [S] Fig. 11),
    ``forgetting_grid.png``: one small panel per (row, column) initialisation, coloured by shape
    (green: Maslow's hammer, blue: monotonic, grey: flat, orange: other). Logs, per initialisation ``<init>``
    (its label, e.g. ``theta=0,r2=0.01,theta2=1.571``), ``forgetting_profile/<init>/gamma=<g>``,
    ``forgetting_profile/<init>/peak_gamma``, ``.../monotonic``, ``.../maslow`` and ``.../flat`` (1 or 0; see
    :func:`profile_shape`), the same under ``forgetting_profile_ode/``, and the counts
    ``forgetting_profile/n_maslow`` and ``n_monotonic``. Also logs what :class:`Forgetting` logs.

    Args:
        every_n_steps, delta_alpha, source, max_members: as :class:`Forgetting`.
        ode: draw the mean-field prediction where it is exact (see above).
        d_alpha: Euler step of the ODE (THEORY.md: 0.01).
        grid_rows, grid_cols: label keys that span the panel grid (both or neither).
        tol: forgetting differences below this count as flat when classifying a profile.
    """

    def __init__(self, every_n_steps: int = 1000, delta_alpha: float | None = None, source: Source = "theory",
                 max_members: int = 64, ode: bool = True, d_alpha: float = 0.01, grid_rows: str | None = None,
                 grid_cols: str | None = None, tol: float = 0.01) -> None:
        super().__init__(every_n_steps, delta_alpha, source, max_members)
        name = type(self).__name__
        if (grid_rows is None) != (grid_cols is None):
            raise ValueError(f"{name}: grid_rows = {grid_rows!r}, grid_cols = {grid_cols!r}; allowed: both label keys or neither")
        if not d_alpha > 0:
            raise ValueError(f"{name}: d_alpha = {d_alpha}; allowed: a positive Euler step")
        if not tol >= 0:
            raise ValueError(f"{name}: tol = {tol}; allowed: >= 0")
        self.ode, self.d_alpha, self.grid_rows, self.grid_cols, self.tol = ode, float(d_alpha), grid_rows, grid_cols, float(tol)
        self.result: dict | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        name = type(self).__name__
        dm = trainer.datamodule
        gammas = list(getattr(dm, "gammas", []))
        if len(gammas) < 2:
            raise ValueError(f"{name}: the datamodule has {len(gammas)} similarity (gamma = {gammas}); a profile needs "
                             "several: give it a list, e.g. gamma: [0.0, 0.1, ..., 1.0]")
        if getattr(pl_module, "G", 1) != len(gammas):
            raise ValueError(f"{name}: the module has {getattr(pl_module, 'G', 1)} teacher sets but the datamodule "
                             f"{len(gammas)}; use a module that replicates its members per teacher set (zoo.MultiHeadStudent)")
        if self.grid_rows is not None:
            for key, what in ((self.grid_rows, "grid_rows"), (self.grid_cols, "grid_cols")):
                if not all(key in parse_label(lbl) for lbl in self.init_labels(pl_module)):
                    raise ValueError(f"{name}: {what} = {key!r} is not a parameter in every initialisation's label "
                                     f"({self.init_labels(pl_module)[:3]}...)")
        self.need(pl_module, "order_parameters", *(("member_teacher_heads",) if self.ode else ()))
        if self.ode and pl_module.activation not in ODE_ACTIVATIONS:
            warn_once(f"{name}: no exact mean-field ODE for activation {pl_module.activation!r}; drawing the simulation only")

    @staticmethod
    def init_labels(pl_module: pl.LightningModule) -> list[str]:
        """One label per initialisation (the member labels without their ``gamma``)."""
        base = getattr(pl_module, "base_labels", None)
        if base is not None:
            return list(base)
        return [",".join(p for p in lbl.split(",") if not p.startswith("gamma=")) for lbl in pl_module.labels[:: pl_module.G]]

    def _ode_ok(self, trainer, pl_module) -> bool:
        dm = trainer.datamodule
        if not self.ode or pl_module.activation not in ODE_ACTIVATIONS:
            return False
        reasons = [why for bad, why in ((getattr(dm, "noise_std", 0) > 0, "label noise"),
                                        (getattr(dm, "batch_size", 1) != 1, "minibatches"),
                                        (getattr(dm, "num_samples", None) is not None, "a finite training pool"),
                                        (getattr(pl_module, "ewc", None) is not None, "EWC"))
                   if bad]
        if reasons:
            warn_once(f"{type(self).__name__}: the mean-field ODE describes noiseless online SGD on fresh samples; "
                      f"this run has {', '.join(reasons)}, so only the simulation is drawn")
            return False
        return True

    def predict(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Tensor]:
        """The ODE's forgetting, transfer and final norms of every member (see :func:`ode_forgetting`)."""
        dm = trainer.datamodule
        Q, R, T = pl_module.order_parameters(dm.W_teachers, initial=True)
        d, end = pl_module.d, trainer.global_step  # the simulation's end (max_steps may stop it early)
        read = end if self.delta_errors is None else self.delta_step
        return ode_forgetting(
            Q.cpu(), R.cpu(), T.cpu(), pl_module.h_init.detach().double().cpu(),
            pl_module.member_teacher_heads(dm.teacher_heads).cpu(), activation=pl_module.activation,
            eta=pl_module.eta, alpha_switch=[s / d for s in self.switch_steps], alpha_end=dm.num_steps / d,
            alpha_read=read / d, alpha_norms=end / d, d_alpha=self.d_alpha)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self.final_errors is None:
            return
        at = self.final_errors if self.delta_errors is None else self.delta_errors
        if self.delta_step is not None and self.delta_errors is None:
            warn_once(f"{type(self).__name__}: no record at delta_alpha = {self.delta_alpha}; using the end of training")
        sim = forgetting_now(self.switch_errors[0], at).numpy()
        Q, _, _ = pl_module.order_parameters(trainer.datamodule.W_teachers)
        norms = torch.diagonal(Q, dim1=-2, dim2=-1).clamp_min(0).sqrt().cpu().numpy()
        ode = self.predict(trainer, pl_module) if self._ode_ok(trainer, pl_module) else None
        grid = member_grid(pl_module.ensemble, pl_module.G)
        gammas = np.asarray(pl_module.gammas if hasattr(pl_module, "gammas") else trainer.datamodule.gammas, dtype=float)
        order = np.argsort(gammas, kind="stable")
        grid, gammas = grid[:, order], gammas[order]
        self.result = {
            "init_labels": self.init_labels(pl_module), "gammas": gammas, "members": grid,
            "forgetting": sim[grid], "norms": norms[grid],
            "forgetting_ode": None if ode is None else ode["forgetting"].numpy()[grid],
            "norms_ode": None if ode is None else ode["norms"].numpy()[grid],
        }
        self.result["shape"] = [profile_shape(gammas, f, self.tol) for f in self.result["forgetting"]]
        self.result["shape_ode"] = None if ode is None else [profile_shape(gammas, f, self.tol) for f in self.result["forgetting_ode"]]
        self._log_profile(trainer)
        if trainer.is_global_zero:
            if self.grid_rows is None:
                path = self.figure(output_path(trainer, "forgetting_profile.png"), pl_module, trainer)
            else:
                path = self.grid_figure(output_path(trainer, "forgetting_grid.png"), trainer)
            self.result["png"] = path

    def _log_profile(self, trainer) -> None:
        r = self.result
        metrics = {}
        for kind, F, shapes in (("forgetting_profile", r["forgetting"], r["shape"]),
                                ("forgetting_profile_ode", r["forgetting_ode"], r["shape_ode"])):
            if F is None:
                continue
            for i, lbl in enumerate(r["init_labels"]):
                for j, g in enumerate(r["gammas"]):
                    metrics[f"{kind}/{lbl}/gamma={g:g}"] = F[i, j]
                metrics[f"{kind}/{lbl}/peak_gamma"] = shapes[i]["peak_gamma"]
                metrics[f"{kind}/{lbl}/monotonic"] = float(shapes[i]["monotonic"])
                metrics[f"{kind}/{lbl}/maslow"] = float(shapes[i]["maslow"])
                metrics[f"{kind}/{lbl}/flat"] = float(shapes[i]["flat"])
            metrics[f"{kind}/n_maslow"] = sum(s["maslow"] for s in shapes)
            metrics[f"{kind}/n_monotonic"] = sum(s["monotonic"] for s in shapes)
        self.log_scalars(trainer, metrics)

    # -- figures --------------------------------------------------------------------------------------
    def _when(self) -> str:
        if self.delta_alpha is not None:
            return f"Delta = {self.delta_alpha:g} after the switch"
        return "at the end of training"

    @staticmethod
    def _shape_text(shape: dict) -> str:
        if shape["maslow"]:
            return f"hammer, peak at {shape['peak_gamma']:g}"
        if shape["flat"]:
            return "flat"
        return "monotonic" if shape["monotonic"] else f"peak at {shape['peak_gamma']:g}"

    def figure(self, path, pl_module, trainer: pl.Trainer | None = None):
        """[S] Fig. 6: (a) forgetting vs gamma per initialisation; (b) final sqrt(Q_ii) vs gamma."""
        from callbacks.figures import _plt

        plt = _plt()
        r = self.result
        g = r["gammas"]
        n = len(r["init_labels"])
        colours = plt.cm.tab10(np.arange(n) % 10)
        fig, (ax, axb) = plt.subplots(1, 2, figsize=(12.0, 4.6), dpi=100)
        for i, lbl in enumerate(r["init_labels"]):
            c = colours[i]
            ax.plot(g, r["forgetting"][i], "o-", color=c, lw=1.8, ms=4,
                    label=f"{pretty_label(lbl)} ({self._shape_text(r['shape'][i])})")
            if r["forgetting_ode"] is not None:
                ax.plot(g, r["forgetting_ode"][i], "--", color=c, lw=1.2, alpha=0.9)
            p = r["norms"].shape[-1]
            for u in range(p):
                axb.plot(g, r["norms"][i, :, u], ("o-", "s--", "^:")[u % 3], color=c, lw=1.6, ms=4)
                if r["norms_ode"] is not None:
                    axb.plot(g, r["norms_ode"][i, :, u], "x", color="k", ms=5, alpha=0.6)
        ax.set_xlabel("feature similarity gamma")
        ax.set_ylabel(f"forgetting of task 1 ({self._when()})")
        extra = "; dashed: mean-field ODE" if r["forgetting_ode"] is not None else ""
        ax.set_title(f"(a) forgetting vs similarity (solid: simulation, d = {pl_module.d}{extra})", fontsize=9)
        ax.axhline(0, color="grey", lw=0.5)
        ax.legend(fontsize=7)
        axb.set_xlabel("feature similarity gamma")
        axb.set_ylabel("final node norm sqrt(Q_ii)")
        axb.set_title("(b) final node norms; colours as in (a); solid: unit 1, dashed: unit 2" +
                      ("; x: ODE" if r["norms_ode"] is not None else ""), fontsize=9)
        save_figure(fig, path)
        _to_tensorboard(trainer, path, "forgetting_profile")
        return path

    def grid_figure(self, path, trainer: pl.Trainer | None = None):
        """[S] Fig. 11: a panel per (grid_rows, grid_cols) initialisation, forgetting vs gamma."""
        from callbacks.figures import _plt

        plt = _plt()
        r = self.result
        parsed = [parse_label(lbl) for lbl in r["init_labels"]]
        rows = sorted({float(p[self.grid_rows]) for p in parsed})
        cols = sorted({float(p[self.grid_cols]) for p in parsed})
        fig, axes = plt.subplots(len(rows), len(cols), figsize=(1.9 * len(cols) + 0.8, 1.6 * len(rows) + 0.8),
                                 dpi=100, squeeze=False, sharex=True, sharey=True)
        for ax in axes.flat:
            ax.set_visible(False)
        style = {"maslow": "tab:green", "flat": "tab:grey", "monotonic": "tab:blue", "other": "tab:orange"}
        for i, p in enumerate(parsed):
            ax = axes[rows.index(float(p[self.grid_rows]))][cols.index(float(p[self.grid_cols]))]
            ax.set_visible(True)
            s = r["shape"][i]
            kind = "maslow" if s["maslow"] else "flat" if s["flat"] else "monotonic" if s["monotonic"] else "other"
            ax.plot(r["gammas"], r["forgetting"][i], "-", color=style[kind], lw=1.8)
            if r["forgetting_ode"] is not None:
                ax.plot(r["gammas"], r["forgetting_ode"][i], ":", color="k", lw=1.0)
            ax.axhline(0, color="grey", lw=0.4)
            ax.tick_params(labelsize=6)
        for k, v in enumerate(cols):
            axes[0][k].set_title(f"{self.grid_cols} = {angle_text(v)}", fontsize=8)
        for k, v in enumerate(rows):
            axes[k][0].set_ylabel(f"{self.grid_rows} = {angle_text(v)}", fontsize=8)
        ode = " (dotted: mean-field ODE)" if r["forgetting_ode"] is not None else ""
        fig.suptitle(f"forgetting vs similarity gamma (x axis 0..1){ode}; green: Maslow's hammer, "
                     f"blue: monotonic, grey: flat (within {self.tol:g}), orange: other", fontsize=9)
        # fixed margins: tight_layout measures every one of the many panels (seconds for 45)
        fig.subplots_adjust(left=0.8 / fig.get_figwidth(), right=0.99, bottom=0.4 / fig.get_figheight(),
                            top=1 - 0.6 / fig.get_figheight(), wspace=0.15, hspace=0.2)
        fig.savefig(path)
        plt.close(fig)
        _to_tensorboard(trainer, path, "forgetting_grid")
        return path


def _to_tensorboard(trainer: pl.Trainer | None, path, tag: str) -> None:
    """The PNG at ``path`` as an image in every TensorBoard logger (IMAGES tab), at the current step."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from callbacks.figures import _plt

    tb = [lg for lg in (trainer.loggers if trainer is not None else []) if isinstance(lg, TensorBoardLogger)]
    if not tb:
        return
    img = (_plt().imread(path)[..., :3] * 255).round().astype(np.uint8)  # read back: drawing twice is slow
    for lg in tb:
        lg.experiment.add_image(tag, img, trainer.global_step, dataformats="HWC")
