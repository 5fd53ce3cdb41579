"""Teacher-student observables ([S] Sec. 4): :class:`OrderParameters` (``Q``, ``R^(t)``, [S] Eq. 8;
Fig. 1b), :class:`Entropies` ([S] Eq. 10) and :class:`TheoryOverlay` (every task's error beside the
mean-field ODE, [S] Eqs. 20-22, from the run's own start: ``MultiHeadStudent.mean_field``).

They schedule on the student's theory clock, SGD samples (``unit = "samples"``), and log at it;
``alpha = samples / d``. The maths is in the module's methods and ``zoo.theory.meanfield``.
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from callbacks.base import (HistoryCallback, PeriodicCallback, all_members, check, check_count, log_figure, log_matrix,
                            log_scalars, member_charts, output_path, overlay_charts, shown_members)
from zoo.plots import pyplot


def teacher_data(trainer: pl.Trainer, who: str, *attrs: str):
    """The run's teacher-student datamodule; a TypeError before training if it is not one."""
    dm = trainer.datamodule
    missing = [a for a in ("W_teachers", *attrs) if dm is None or not hasattr(dm, a)]
    if missing:
        raise TypeError(f"{who} needs a teacher-student datamodule (datamodules.TeacherStudent) with "
                        f"{', '.join(missing)}; got {type(dm).__name__ if dm is not None else 'none'}")
    return dm


def _pair(i: int, j: int, n: int) -> str:
    """Index pair of a tag: ``01`` while every index has one digit, ``3_12`` beyond (unambiguous)."""
    return f"{i}{j}" if n <= 10 else f"{i}_{j}"


def _end_figure(trainer: pl.Trainer, cb: PeriodicCallback, pl_module, tag: str, fig) -> None:
    """A PNG; in TensorBoard too once the whole schedule ran (a fit stopped early by max_steps
    and resumed would keep a second image at its stop step: only steps after it are purged)."""
    if cb.clock(trainer, pl_module) >= trainer.datamodule.num_steps:
        return log_figure(trainer, tag, fig, png=f"{tag}.png", step=cb.clock(trainer, pl_module))
    fig.savefig(output_path(trainer, f"{tag}.png"))
    pyplot().close(fig)


def student_errors(trainer: pl.Trainer, pl_module: pl.LightningModule) -> Tensor:
    """Every member's error per task (E, n_tasks): [S] Eq. 9 on the order parameters, or Monte
    Carlo on the test set where there is no closed form (sigmoid)."""
    return pl_module.task_errors(trainer.datamodule, "mc" if pl_module.activation_name == "sigmoid" else "theory")


class OrderParameters(HistoryCallback):
    """Logs ``Q = W W^T / d`` and ``R^(t) = W W_T^(t)T / d`` ([S] Eq. 8).

    Scalars ``Q/<member>/<i><j>`` (``i <= j``) and ``R/<member>/task<t>/<i><n>`` (student unit
    ``i``, teacher unit ``n``; 0-based) for up to ``max_members`` members; Q and every task's R as
    heatmaps (``Q/<member>``, ``R/<member>/task<t>``) for up to ``max_images`` members, every
    ``images_every_n_steps`` SGD samples (an image costs ~50 ms, a scalar nothing).

    At the end, ``order_parameters.png`` ([S] Fig. 1b): every task's error over alpha ([S] Eq. 9;
    Monte Carlo for sigmoid) and, per member, Q and R at every switch and at the end. Sparse Q and
    R (one active unit per teacher unit) = specialised; dense = redundant units.

    Args:
        every_n_steps: log every this many SGD samples (and at the start).
        max_members: members logged as scalars (0: none).
        max_images: members shown as images and in the PNG (0: none).
        images_every_n_steps: the images' period; default: at every logging step.
        error_curve: draw the error curves in the PNG.
        figure: write ``order_parameters.png``.
    """

    unit = "samples"
    HISTORY_KEYS = ("steps", "errors", "snap_steps", "snap_Q", "snap_R", "images")  # images: their steps

    def __init__(self, every_n_steps: int = 1000, max_members: int = 8, max_images: int = 4,
                 images_every_n_steps: int | None = None, error_curve: bool = True, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        self.max_members = check_count("OrderParameters", "max_members", max_members, 0)
        self.max_images = check_count("OrderParameters", "max_images", max_images, 0)
        self.images_every_n_steps = every_n_steps if images_every_n_steps is None else check_count(
            "OrderParameters", "images_every_n_steps", images_every_n_steps, 1)
        self.error_curve, self.figure = bool(error_curve), bool(figure)
        self._switches: set[int] = set()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "order_parameters", *(("task_errors",) if self.error_curve and self.figure else ()))
        dm = teacher_data(trainer, "OrderParameters")
        self._switches = {int(s) for s in getattr(dm, "switch_steps", [])}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        # a batch never straddles a switch, so the last sample of every task ends a batch
        if self.figure and self.max_images and self.clock(trainer, pl_module) in self._switches:
            self._snapshot(trainer, pl_module)

    def _snapshot(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = self.clock(trainer, pl_module)
        if now in self.history["snap_steps"]:
            return
        with all_members(pl_module):  # every rank at a switch (a collective while sharded); full after fit
            Q, R, _ = pl_module.order_parameters(trainer.datamodule.W_teachers)
        self.append(snap_steps=now, snap_Q=Q[: self.max_images].detach().cpu(), snap_R=R[: self.max_images].detach().cpu())

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        g = self.now
        Q, R, _ = (x.detach().cpu() for x in pl_module.order_parameters(trainer.datamodule.W_teachers))
        labels = pl_module.labels
        p, n_tasks, ps = R.shape[-2], R.shape[1], R.shape[-1]
        metrics = {}
        for e, lbl in enumerate(shown_members(self, labels, self.max_members, "max_members", "logs scalars of")):
            metrics |= {f"Q/{lbl}/{_pair(i, j, p)}": Q[e, i, j] for i in range(p) for j in range(i, p)}
            metrics |= {f"R/{lbl}/task{t}/{_pair(i, n, max(p, ps))}": R[e, t, i, n]
                        for t in range(n_tasks) for i in range(p) for n in range(ps)}
        log_scalars(trainer, metrics)
        if trainer.is_global_zero and self._images_due(g):
            for e, lbl in enumerate(shown_members(self, labels, self.max_images, "max_images")):
                log_matrix(trainer, f"Q/{lbl}", Q[e], step=g, title=f"Q = W W^T / d  ({lbl}, step {g})")
                for t in range(n_tasks):
                    log_matrix(trainer, f"R/{lbl}/task{t}", R[e, t], step=g,
                               title=f"R task {t + 1}: rows student, cols teacher ({lbl})")
        if self.figure and self.error_curve and (not self.history["steps"] or self.history["steps"][-1] != g):
            self.append(steps=g, errors=student_errors(trainer, pl_module))

    def _images_due(self, g: int) -> bool:
        """At the first logging step of a fit, then when ``g`` crosses a multiple of ``images_every_n_steps``
        (the history keeps the schedule across a resume)."""
        n, done = self.images_every_n_steps, self.history["images"]
        if done and (g <= done[-1] or g // n == done[-1] // n):
            return False
        done.append(g)
        return True

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not (self.figure and self.max_images and trainer.is_global_zero):
            return
        from zoo.metrics.overlaps import entropies
        from zoo.plots.teacher_student import order_parameters_figure

        self._snapshot(trainer, pl_module)  # the end of training (no-op if it is a switch)
        h, d = self.history, pl_module.d
        Qs = [q.numpy() for q in h["snap_Q"]]
        H_Q = [entropies(q, torch.ones(q.shape[:-1]))["H_Q"].numpy() for q in h["snap_Q"]]
        fig = order_parameters_figure(
            shown_members(self, pl_module.labels, self.max_images, "max_images"), np.asarray(h["steps"], dtype=float) / d,
            torch.stack(h["errors"]).numpy() if h["errors"] else None, [s / d for s in h["snap_steps"]], Qs,
            [r.numpy() for r in h["snap_R"]], H_Q, [s / d for s in sorted(self._switches)], pl_module.activation_name)
        _end_figure(trainer, self, pl_module, "order_parameters", fig)


class Entropies(PeriodicCallback):
    """Logs the specialisation entropies ``H_h``, ``H_Q``, ``H_m`` ([S] Eq. 10) of the active
    head, per member (``entropy/<H>/<member>``, up to ``max_members``) and their ensemble mean
    (``entropy/<H>/mean``). ``H_h, H_Q`` lie in ``[0, log p]``: ``log p`` for identical units, 0
    for one active unit; ``H_m`` is ``(2/p) log p`` for identical units.
    """

    unit = "samples"
    NEEDS = ("entropies",)

    def __init__(self, every_n_steps: int = 1000, max_members: int = 32) -> None:
        super().__init__(every_n_steps)
        self.max_members = check_count("Entropies", "max_members", max_members, 0)

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        metrics = {}
        for name, values in pl_module.entropies().items():
            values = values.detach().cpu()
            metrics[f"entropy/{name}/mean"] = values.mean()
            labels = shown_members(self, pl_module.labels, self.max_members, "max_members", "logs scalars of")
            metrics |= {f"entropy/{name}/{lbl}": values[e] for e, lbl in enumerate(labels)}
        log_scalars(trainer, metrics)


class TheoryOverlay(HistoryCallback):
    """The simulated error of every task beside the mean-field ODE's ([S] App. C, Eqs. 20-22).

    When training starts, ``pl_module.mean_field`` integrates the ODE from the run's own initial
    order parameters over the datamodule's schedule (its switches, ``alpha_end = num_steps / d``;
    Euler step ``d_alpha``) for the first ``max_members`` members. At the start and every
    ``every_n_steps`` SGD samples it logs, per member and task ``t``:

    ``error/<member>/task<t>/order_params`` ([S] Eq. 9 on the simulated order parameters),
    ``.../simulation`` (Monte Carlo on the test set, if ``mc``), ``.../ode`` (at the same ``alpha``),
    ``.../rel_deviation`` (``(order_params - ode) / ode``) and ``error/rel_deviation_max``.

    CUSTOM SCALARS overlays a member's curves; at the end, ``theory_overlay.png``
    (``zoo.plots.teacher_student.theory_overlay_figure``). Sigmoid has no theory (a ValueError);
    where the ODE does not describe the run (``zoo.theory.meanfield.ode_caveats``: ReLU above
    ``RELU_SMALL_ETA``, minibatches, label noise, EWC, ...) it warns. At finite ``d`` one run
    fluctuates around the ODE by ``O(1/sqrt d)``: 5-10 % relative at ``d = 1000``.

    Args:
        every_n_steps: log every this many SGD samples (and at the start).
        max_members: members integrated and logged.
        mc: also log the Monte Carlo test error.
        d_alpha: Euler step of the ODE in alpha (the rates scale with eta: ~0.01 / eta is enough).
        figure: write ``theory_overlay.png``.
    """

    unit = "samples"
    HISTORY_KEYS = ("steps", "order_params", "simulation", "ode")

    def __init__(self, every_n_steps: int = 1000, max_members: int = 8, mc: bool = True,
                 d_alpha: float = 0.01, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        self.max_members = check_count("TheoryOverlay", "max_members", max_members, 1)
        check("TheoryOverlay", "d_alpha", d_alpha, not isinstance(d_alpha, bool) and isinstance(d_alpha, (int, float))
              and 0 < d_alpha < math.inf,
              "a positive number (the ODE's Euler step in alpha: 0.01 at eta ~ 1, about 0.01 / eta for smaller eta)")
        self.mc, self.d_alpha, self.figure = bool(mc), float(d_alpha), bool(figure)
        self.trajectory = None  # zoo.theory.meanfield.MeanFieldTrajectory

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.theory.meanfield import ACTIVATIONS, ode_caveats

        self.need(pl_module, "mean_field", "task_errors")
        dm = teacher_data(trainer, "TheoryOverlay", "teacher_heads", "switch_steps", "num_steps",
                           *(("test_set",) if self.mc else ()))
        if pl_module.activation_name not in ACTIVATIONS:
            raise ValueError(f"TheoryOverlay: the student's activation is {pl_module.activation_name!r}, for which there is "
                             f"no mean-field theory; allowed: {', '.join(ACTIVATIONS)}. Use ErrorCurves(source='mc').")
        for why in ode_caveats(pl_module.activation_name, pl_module.eta, dm, getattr(pl_module, "ewc", None) is not None):
            rank_zero_warn(f"TheoryOverlay: the mean-field ODE does not describe this run: {why}")
        labels = shown_members(self, pl_module.labels, self.max_members, "max_members", "overlays the theory on")
        member_charts(trainer, "error: simulation vs mean-field ODE", labels, "error/{}/task\\d+/(simulation|order_params|ode)$")
        overlay_charts(trainer, "error: relative deviation from the ODE", {"all members": "error/.*/rel_deviation$"})

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm, d = trainer.datamodule, pl_module.d
        E, alpha_end = min(self.max_members, pl_module.ensemble), dm.num_steps / d
        p, n = pl_module.p, pl_module.n_tasks
        # every Euler step is recorded (exact values at the logging steps) unless that is large; then
        # every 0.1, interpolated linearly (error ~ 0.1^2 |eps''| / 8, far below SGD noise)
        fine = E * (alpha_end / self.d_alpha) * (p * (p + n * dm.p_star) + n * p + n)
        self.trajectory = pl_module.mean_field(
            dm.W_teachers, dm.teacher_heads, [s / d for s in dm.switch_steps], alpha_end, d_alpha=self.d_alpha,
            record_every=None if fine <= 4e6 else 0.1, members=self.max_members)

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        g, m, dm = self.now, self.max_members, trainer.datamodule
        if self.history["steps"] and self.history["steps"][-1] == g:
            return  # resumed at a logged step
        op = pl_module.task_errors(dm, "theory")[:m]
        ode = self.trajectory.error_at(g / pl_module.d)
        sim = pl_module.task_errors(dm, "mc")[:m] if self.mc else None
        dev = (op - ode) / ode.abs().clamp_min(1e-12)
        metrics = {"error/rel_deviation_max": dev.abs().max()}
        for e, lbl in enumerate(pl_module.labels[:m]):
            for t in range(op.shape[1]):
                key = f"error/{lbl}/task{t}"
                metrics |= {f"{key}/order_params": op[e, t], f"{key}/ode": ode[e, t], f"{key}/rel_deviation": dev[e, t]}
                if sim is not None:
                    metrics[f"{key}/simulation"] = sim[e, t]
        log_scalars(trainer, metrics)
        self.append(steps=g, order_params=op, ode=ode, **({} if sim is None else {"simulation": sim}))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        h, tr = self.history, self.trajectory
        if not (self.figure and trainer.is_global_zero and h["steps"] and tr is not None):
            return
        from zoo.plots.teacher_student import theory_overlay_figure

        d, act = pl_module.d, pl_module.activation_name
        fig = theory_overlay_figure(
            pl_module.labels[: self.max_members], np.asarray(h["steps"], dtype=float) / d,
            torch.stack(h["order_params"]).numpy(), torch.stack(h["simulation"]).numpy() if h["simulation"] else None,
            tr.alpha.numpy(), tr.eps.numpy(), torch.stack(h["ode"]).numpy(), list(tr.alpha_switch),
            title=f"{act} student, eta = {pl_module.eta:g}, d = {d}" + (" (ReLU ODE: small-eta limit)" if act == "relu" else ""))
        _end_figure(trainer, self, pl_module, "theory_overlay", fig)
