"""Teacher-student observables ([S] Sec. 4): order parameters, specialisation entropies, and the
mean-field ODE beside the simulation.

* :class:`OrderParameters`: ``Q = W W^T / d`` and ``R^(t) = W W_T^(t)T / d`` ([S] Eq. 8) as
  scalars and heatmaps; at the end of the fit ``order_parameters.png`` (the error curves, and Q
  and R at every switch and at the end: the panels of [S] Fig. 1b).
* :class:`Entropies`: ``H_h``, ``H_Q``, ``H_m`` of the active head ([S] Eq. 10).
* :class:`TheoryOverlay`: the simulated error of every task next to the mean-field ODE's
  ([S] App. C, Eqs. 20-22; ``zoo.theory.meanfield``) integrated from the run's own initial order
  parameters; ``theory_overlay.png`` at the end of the fit.

All three read the module's analytic methods (``order_parameters``, ``entropies``,
``theory_error``, ``test_error``) and the datamodule's teachers (``datamodules.TeacherStudent``);
the maths lives there and in ``zoo.theory.meanfield``.
"""
from __future__ import annotations

import math
import re

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from callbacks.base import HistoryCallback, PeriodicCallback, output_path, overlay_charts
from callbacks.figures import save_figure
from callbacks.base import log_matrix

RELU_SMALL_ETA = 0.01
"""Above this learning rate :class:`TheoryOverlay` warns for ReLU: its ODE drops the
``eta^2 I4`` term of dQ/dalpha ([S] Eq. 20; no closed form), a relative error of order eta that
accumulates in time. Measured (d = 1000, p = 2, p* = 1, sigma_w = 1e-3, theta = pi/32, one stream),
the simulated error exceeded the ODE's at ``eta alpha = 1`` by 17 % (eta = 0.1), 7 % (0.03) and
1.4 % (0.01), and at ``eta alpha = 3`` by 150 %, 27 % and 9 %; at eta = 1 it is several times off."""


def _teacher_data(trainer: pl.Trainer, who: str, *attrs: str):
    """The run's teacher-student datamodule; a TypeError before training if it is not one."""
    dm = trainer.datamodule
    missing = [a for a in ("W_teachers", *attrs) if dm is None or not hasattr(dm, a)]
    if missing:
        raise TypeError(f"{who} needs a teacher-student datamodule (datamodules.TeacherStudent) with "
                        f"{', '.join(missing)}; got {type(dm).__name__ if dm is not None else 'none'}")
    return dm


def _count(who: str, name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{who}: {name} = {value!r}; allowed: an integer >= {minimum}")
    return int(value)


def _pair(i: int, j: int, n: int) -> str:
    """Index pair of a tag: ``01`` while every index has one digit, ``3_12`` beyond (unambiguous)."""
    return f"{i}{j}" if n <= 10 else f"{i}_{j}"


# ------------------------------------------------------------------------------------------------
# order parameters
# ------------------------------------------------------------------------------------------------
class OrderParameters(HistoryCallback):
    """Logs the order parameters ``Q = W W^T / d`` and ``R^(t) = W W_T^(t)T / d`` ([S] Eq. 8).

    Scalars ``Q/<member>/<i><j>`` (``i <= j``) and ``R/<member>/task<t>/<i><n>`` (student unit
    ``i``, teacher unit ``n``; 0-based, ``<i>_<j>`` once an index has two digits) for up to
    ``max_members`` members; Q and every task's R as heatmap images (``Q/<member>``,
    ``R/<member>/task<t>``; IMAGES tab) for up to ``max_images`` members, every
    ``images_every_n_steps`` (an image costs ~50 ms of matplotlib, a scalar nothing).

    At the end of the fit it writes ``order_parameters.png`` ([S] Fig. 1b): left, every task's
    generalisation error over ``alpha = steps / d`` (from the order parameters, [S] Eq. 9;
    Monte Carlo on the test set for sigmoid, which has no closed form); right, for each of up
    to ``max_images`` members, Q and R^(t) at the end of every task (at each switch and at the
    end of training). Sparse Q and R (one active unit per teacher unit) = specialised; dense =
    redundant units.

    Args:
        every_n_steps: log every this many SGD steps (and at the start).
        max_members: members whose entries are logged as scalars (0: none).
        max_images: members shown as images and in the PNG (0: none).
        images_every_n_steps: log the images when the step crosses a multiple of this (and at
            the start); default: at every logging step.
        error_curve: draw the error curves in the PNG (recorded at the logging steps).
        figure: write ``order_parameters.png``.
    """

    HISTORY_KEYS = ("steps", "errors", "snap_steps", "snap_Q", "snap_R")

    def __init__(self, every_n_steps: int = 1000, max_members: int = 8, max_images: int = 4,
                 images_every_n_steps: int | None = None, error_curve: bool = True, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        self.max_members = _count("OrderParameters", "max_members", max_members, 0)
        self.max_images = _count("OrderParameters", "max_images", max_images, 0)
        self.images_every_n_steps = every_n_steps if images_every_n_steps is None else _count(
            "OrderParameters", "images_every_n_steps", images_every_n_steps, 1)
        self._last_image: int | None = None
        self.error_curve, self.figure = bool(error_curve), bool(figure)
        self._switches: set[int] = set()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self._last_image = None

    # when the images were last logged: a resumed fit keeps their schedule instead of starting it again
    def state_dict(self) -> dict:
        return {**super().state_dict(), "last_image": self._last_image}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._last_image = state_dict.get("last_image")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "order_parameters")
        dm = _teacher_data(trainer, "OrderParameters")
        if self.error_curve and self.figure:
            sigmoid = getattr(pl_module, "activation", None) == "sigmoid"
            self.need(pl_module, "test_error" if sigmoid else "theory_error")
            if sigmoid:
                _teacher_data(trainer, "OrderParameters (error curve, Monte Carlo)", "test_set")
        self._switches = set(int(s) for s in getattr(dm, "switch_steps", []))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        # a chunk never straddles a switch, so the last step of every task ends a batch
        if self.figure and self.max_images and trainer.global_step in self._switches:
            self._snapshot(trainer, pl_module)

    def _snapshot(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step in self.history["snap_steps"]:
            return
        Q, R, _ = pl_module.order_parameters(trainer.datamodule.W_teachers)
        m = self.max_images
        self.history["snap_steps"].append(int(trainer.global_step))
        self.history["snap_Q"].append(Q[:m].detach().cpu())
        self.history["snap_R"].append(R[:m].detach().cpu())

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        dm, g = trainer.datamodule, trainer.global_step
        Q, R, _ = pl_module.order_parameters(dm.W_teachers)
        Q, R = Q.detach().cpu(), R.detach().cpu()  # (E, p, p), (E, n_tasks, p, p*)
        labels = pl_module.labels
        p, n_tasks, ps = R.shape[-2], R.shape[1], R.shape[-1]
        metrics = {}
        for e, lbl in enumerate(labels[: self.max_members]):
            for i in range(p):
                for j in range(i, p):
                    metrics[f"Q/{lbl}/{_pair(i, j, p)}"] = Q[e, i, j]
            for t in range(n_tasks):
                for i in range(p):
                    for n in range(ps):
                        metrics[f"R/{lbl}/task{t}/{_pair(i, n, max(p, ps))}"] = R[e, t, i, n]
        self.log_scalars(trainer, metrics, step=g)
        if trainer.is_global_zero and self._images_due(g):
            for e, lbl in enumerate(labels[: self.max_images]):
                log_matrix(trainer, f"Q/{lbl}", Q[e], step=g, title=f"Q = W W^T / d  ({lbl}, step {g})")
                for t in range(n_tasks):
                    log_matrix(trainer, f"R/{lbl}/task{t}", R[e, t], step=g,
                               title=f"R task {t + 1}: rows student, cols teacher ({lbl})")
        if self.figure and self.error_curve and (not self.history["steps"] or self.history["steps"][-1] != g):
            self.history["steps"].append(int(g))
            self.history["errors"].append(_error(trainer, pl_module).cpu())

    def _images_due(self, g: int) -> bool:
        """At the first logging step of a fit, then when ``g`` crosses a multiple of ``images_every_n_steps``."""
        n, last = self.images_every_n_steps, self._last_image
        if last is not None and (g <= last or g // n == last // n):
            return False
        self._last_image = g
        return True

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not (self.figure and self.max_images and trainer.is_global_zero):
            return
        self._snapshot(trainer, pl_module)  # the end of training (no-op if it is a switch)
        h, d = self.history, pl_module.d
        errors = torch.stack(h["errors"]).numpy() if h["errors"] else None
        switches = [s / d for s in sorted(self._switches)]
        order_parameters_figure(
            output_path(trainer, "order_parameters.png"), pl_module.labels[: self.max_images],
            np.asarray(h["steps"], dtype=float) / d, errors,
            [s / d for s in h["snap_steps"]], [q.numpy() for q in h["snap_Q"]], [r.numpy() for r in h["snap_R"]],
            switches, activation=str(getattr(pl_module, "activation", "")))


def _error(trainer: pl.Trainer, pl_module: pl.LightningModule) -> Tensor:
    """Every member's error per task, (E, n_tasks): [S] Eq. 9 on the order parameters, or
    Monte Carlo on the test set where there is no closed form (sigmoid)."""
    dm = trainer.datamodule
    if getattr(pl_module, "activation", None) == "sigmoid":
        return pl_module.test_error(*dm.test_set()).detach().double()
    return pl_module.theory_error(dm.W_teachers, dm.teacher_heads).detach().double()


def _draw_matrix(ax, M: np.ndarray, title: str) -> None:
    """A heatmap on a colour scale centred on 0, with the entries written in when it is small."""
    vmax = float(np.abs(M).max()) or 1.0
    ax.imshow(M, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
    if M.shape[0] <= 8 and M.shape[1] <= 8:
        for (i, j), v in np.ndenumerate(M):
            ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7,
                    color="white" if abs(v) > 0.6 * vmax else "black")
    ax.set_xticks(range(M.shape[1])), ax.set_yticks(range(M.shape[0]))
    ax.tick_params(labelsize=6)
    ax.set_title(title, fontsize=8)


def order_parameters_figure(path, labels: list[str], alpha: np.ndarray, errors: np.ndarray | None,
                            snap_alpha: list[float], snap_Q: list[np.ndarray], snap_R: list[np.ndarray],
                            switches: list[float], activation: str = ""):
    """[S] Fig. 1b: error curves (left) and, per member (rows), Q and every task's R at each
    snapshot time (columns). ``errors`` (T, E, n_tasks); ``snap_Q[k]`` (E, p, p), ``snap_R[k]``
    (E, n_tasks, p, p*)."""
    from callbacks.figures import _plt

    from zoo.metrics.overlaps import entropies

    plt = _plt()
    m, n_tasks, p = len(labels), snap_R[0].shape[1], snap_Q[0].shape[-1]
    cols = len(snap_alpha) * (1 + n_tasks)
    left = 2 if errors is not None else 0
    fig = plt.figure(figsize=(2.0 * cols + 2.6 * left, max(2.2 * m, 3.2)), dpi=100)
    grid = fig.add_gridspec(m, cols + left)
    if errors is not None:
        ax = fig.add_subplot(grid[:, :left])
        colours = plt.cm.viridis(np.linspace(0, 0.9, max(m, 2)))
        for e in range(min(m, errors.shape[1])):
            for t in range(errors.shape[2]):
                ax.plot(alpha, errors[:, e, t], color=colours[e], ls="-" if t == 0 else "--", lw=1.6,
                        label=f"{labels[e]} task {t + 1}" if m > 1 or n_tasks > 1 else labels[e])
        for s in switches:
            ax.axvline(s, color="grey", ls=":", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("alpha = steps / d")
        ax.set_ylabel("generalisation error" + (" (Monte Carlo)" if activation == "sigmoid" else " ([S] Eq. 9)"))
        ax.set_title(f"{activation} student: error", fontsize=9)
        ax.legend(fontsize=7)
    for r, lbl in enumerate(labels):
        for k, a in enumerate(snap_alpha):
            c0 = left + k * (1 + n_tasks)
            when = "end" if k == len(snap_alpha) - 1 else f"switch {k + 1}"
            axq = fig.add_subplot(grid[r, c0])
            H_Q = float(entropies(torch.from_numpy(snap_Q[k][r]), torch.ones(p))["H_Q"])
            _draw_matrix(axq, snap_Q[k][r], f"Q, {when} (alpha={a:g})\nH_Q = {H_Q:.2f} (max {math.log(p):.2f})")
            if k == 0:
                axq.set_ylabel(lbl, fontsize=8)
            for t in range(n_tasks):
                _draw_matrix(fig.add_subplot(grid[r, c0 + 1 + t]), snap_R[k][r, t], f"R task {t + 1}, {when}")
    fig.suptitle("order parameters Q = WW^T/d (student x student), R = W W_T^T/d (student x teacher)", fontsize=9)
    save_figure(fig, path)
    return path


# ------------------------------------------------------------------------------------------------
# entropies
# ------------------------------------------------------------------------------------------------
class Entropies(PeriodicCallback):
    """Logs the specialisation entropies ``H_h``, ``H_Q``, ``H_m`` ([S] Eq. 10) of the active
    head, per member (``entropy/<H>/<member>``, up to ``max_members``) and their ensemble mean
    (``entropy/<H>/mean``). ``H_h, H_Q`` lie in ``[0, log p]``: ``log p`` for identical units (no
    specialisation), 0 for one active unit; ``H_m`` is ``(2/p) log p`` for identical units.
    """

    def __init__(self, every_n_steps: int = 1000, max_members: int = 32) -> None:
        super().__init__(every_n_steps)
        self.max_members = _count("Entropies", "max_members", max_members, 0)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "entropies")

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        metrics = {}
        for name, values in pl_module.entropies().items():
            values = values.detach().cpu()
            metrics[f"entropy/{name}/mean"] = values.mean()
            for e, lbl in enumerate(pl_module.labels[: self.max_members]):
                metrics[f"entropy/{name}/{lbl}"] = values[e]
        self.log_scalars(trainer, metrics)


# ------------------------------------------------------------------------------------------------
# theory overlay
# ------------------------------------------------------------------------------------------------
class TheoryOverlay(HistoryCallback):
    """The simulated error of every task beside the mean-field ODE's ([S] App. C, Eqs. 20-22).

    When training starts, :func:`zoo.theory.meanfield.integrate` runs from the run's own initial
    order parameters (``Q, R, T`` of the initial weights, the initial heads) over the
    datamodule's whole schedule (its switches, ``alpha_end = num_steps / d``; Euler step
    ``d_alpha``), for the first ``max_members`` members. Then, at the start and every
    ``every_n_steps`` SGD steps, it logs for those members and every task ``t``:

    * ``error/<member>/task<t>/order_params``: [S] Eq. 9 on the simulated order parameters
      (exact for the simulated weights, no sampling noise);
    * ``error/<member>/task<t>/simulation``: Monte Carlo on the datamodule's test set (if ``mc``);
    * ``error/<member>/task<t>/ode``: the ODE at the same ``alpha = steps / d``;
    * ``error/<member>/task<t>/rel_deviation``: ``(order_params - ode) / ode``, and
      ``error/rel_deviation_max``, the largest ``|rel_deviation|`` over members and tasks.

    The CUSTOM SCALARS tab overlays a member's curves on one chart. At the end of the fit it
    writes ``theory_overlay.png``: per member, error vs alpha (simulation solid, Monte Carlo
    dots, ODE dashed; the switches dotted) above the relative deviation.

    The theory is for online SGD on fresh samples with one ``phi`` for teacher and student: no
    theory for sigmoid (a ValueError); warnings when the activations differ, for ReLU with
    ``eta > RELU_SMALL_ETA`` (its ODE is the small-eta limit), for minibatches, finite training
    pools, label noise or EWC (terms the ODE does not have). At finite ``d`` one run fluctuates
    around the ODE by ``O(1/sqrt d)``: up to 5-10 % relative at ``d = 1000`` (seed averages do better).

    Args:
        every_n_steps: log every this many SGD steps (and at the start).
        max_members: members integrated and logged.
        mc: also log the Monte Carlo test error (``test_error`` on ``dm.test_set()``).
        d_alpha: Euler step of the ODE in alpha (the rates scale with eta: ~0.01 / eta is enough).
        figure: write ``theory_overlay.png``.
    """

    HISTORY_KEYS = ("steps", "order_params", "simulation", "ode")

    def __init__(self, every_n_steps: int = 1000, max_members: int = 8, mc: bool = True,
                 d_alpha: float = 0.01, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        self.max_members = _count("TheoryOverlay", "max_members", max_members, 1)
        if isinstance(d_alpha, bool) or not (isinstance(d_alpha, (int, float)) and 0 < d_alpha < math.inf):
            raise ValueError(f"TheoryOverlay: d_alpha = {d_alpha!r}; allowed: a positive number (the ODE's Euler "
                             "step in alpha: 0.01 at eta ~ 1, about 0.01 / eta for smaller eta)")
        self.mc, self.d_alpha, self.figure = bool(mc), float(d_alpha), bool(figure)
        self.trajectory = None  # zoo.theory.meanfield.MeanFieldTrajectory

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "order_parameters", "theory_error", "member_teacher_heads",
                  *(("test_error",) if self.mc else ()))
        dm = _teacher_data(trainer, "TheoryOverlay", "teacher_heads", "switch_steps", "num_steps",
                           *(("test_set",) if self.mc else ()))
        for attr in ("activation", "eta", "d", "h_init"):
            if not hasattr(pl_module, attr):
                raise TypeError(f"TheoryOverlay needs a module with {attr} (zoo.MultiHeadStudent); "
                                f"{type(pl_module).__name__} has none")
        act = pl_module.activation
        from zoo.theory.meanfield import ACTIVATIONS

        if act not in ACTIVATIONS:
            raise ValueError(f"TheoryOverlay: the student's activation is {act!r}, for which there is no mean-field "
                             f"theory (no closed-form Gaussian averages); allowed: {', '.join(ACTIVATIONS)}. "
                             "Use ErrorCurves(source='mc') to see its error.")
        if getattr(dm, "activation", act) != act:
            rank_zero_warn(f"TheoryOverlay: the student's activation ({act}) differs from the teacher's "
                           f"({dm.activation}); the ODE assumes one phi for both (the student's), so it does not "
                           "describe this run")
        if act == "relu" and pl_module.eta > RELU_SMALL_ETA:
            rank_zero_warn(f"TheoryOverlay: eta = {pl_module.eta:g} with ReLU: the ReLU ODE is the small-learning-rate "
                           "limit (no eta^2 term in dQ/dalpha), accurate only for eta << 1 "
                           f"(say eta <= {RELU_SMALL_ETA:g}); expect deviations of order eta")
        for bad, why in ((getattr(dm, "batch_size", 1) != 1, "minibatches (batch_size > 1)"),
                         (getattr(dm, "num_samples", None) is not None, "a finite training pool (num_samples)"),
                         (getattr(dm, "noise_std", 0.0) > 0, "label noise (noise_std > 0)"),
                         (getattr(pl_module, "ewc", None) is not None, "EWC")):
            if bad:
                rank_zero_warn(f"TheoryOverlay: the ODE is for online SGD (one fresh, noiseless sample per step) "
                               f"without penalties; this run has {why}, which it does not model")
        labels = pl_module.labels[: self.max_members]
        overlay_charts(trainer, "error: simulation vs mean-field ODE",
                       {lbl: f"error/{re.escape(lbl)}/task\\d+/(simulation|order_params|ode)$" for lbl in labels})
        overlay_charts(trainer, "error: relative deviation from the ODE",
                       {"all members": "error/.*/rel_deviation$"})

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.trajectory = self.integrate(trainer, pl_module)

    def integrate(self, trainer: pl.Trainer, pl_module: pl.LightningModule):
        """The ODE from the run's initial order parameters over the datamodule's schedule."""
        from zoo.theory.meanfield import integrate

        dm, m, d = trainer.datamodule, self.max_members, pl_module.d
        Q0, R0, T = (x[:m].cpu() for x in pl_module.order_parameters(dm.W_teachers, initial=True))
        heads0 = pl_module.h_init[:m].detach().double().cpu()
        teacher_heads = pl_module.member_teacher_heads(dm.teacher_heads)[:m].cpu()
        E, n, p, ps = R0.shape
        alpha_end = dm.num_steps / d
        # record every Euler step (exact values at the logging steps) unless that is large; then
        # every 0.1 and interpolate linearly (error ~ 0.1^2 |eps''| / 8, far below SGD noise)
        fine = E * (alpha_end / self.d_alpha) * (p * (p + n * ps) + n * p + n)
        record_every = self.d_alpha if fine <= 4e6 else max(self.d_alpha, 0.1)
        return integrate(Q0, R0, T, heads0, teacher_heads, activation=pl_module.activation, eta=pl_module.eta,
                         alpha_switch=[s / d for s in dm.switch_steps], alpha_end=alpha_end,
                         d_alpha=self.d_alpha, record_every=record_every)

    def ode_error(self, alpha: float) -> Tensor:
        """The ODE's error of every integrated member and task at time ``alpha``, (E', n_tasks)."""
        tr = self.trajectory
        a = tr.alpha.numpy()
        eps = tr.eps.numpy()  # (E', n_rec, n_tasks)
        out = np.empty((eps.shape[0], eps.shape[2]))
        for e in range(eps.shape[0]):  # E' <= max_members, a handful
            for t in range(eps.shape[2]):
                out[e, t] = np.interp(alpha, a, eps[e, :, t])
        return torch.from_numpy(out)

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        g = trainer.global_step
        if self.history["steps"] and self.history["steps"][-1] == g:
            return  # resumed at a logged step
        dm, m = trainer.datamodule, self.max_members
        op = pl_module.theory_error(dm.W_teachers, dm.teacher_heads)[:m].detach().double().cpu()
        ode = self.ode_error(g / pl_module.d)
        sim = pl_module.test_error(*dm.test_set())[:m].detach().double().cpu() if self.mc else None
        dev = (op - ode) / ode.abs().clamp_min(1e-12)
        metrics = {"error/rel_deviation_max": dev.abs().max()}
        for e, lbl in enumerate(pl_module.labels[:m]):
            for t in range(op.shape[1]):
                key = f"error/{lbl}/task{t}"
                metrics[f"{key}/order_params"] = op[e, t]
                metrics[f"{key}/ode"] = ode[e, t]
                metrics[f"{key}/rel_deviation"] = dev[e, t]
                if sim is not None:
                    metrics[f"{key}/simulation"] = sim[e, t]
        self.log_scalars(trainer, metrics, step=g)
        self.history["steps"].append(int(g))
        self.history["order_params"].append(op)
        self.history["ode"].append(ode)
        if sim is not None:
            self.history["simulation"].append(sim)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        h = self.history
        if not (self.figure and trainer.is_global_zero and h["steps"] and self.trajectory is not None):
            return
        d = pl_module.d
        tr = self.trajectory
        theory_overlay_figure(
            output_path(trainer, "theory_overlay.png"), pl_module.labels[: self.max_members],
            np.asarray(h["steps"], dtype=float) / d, torch.stack(h["order_params"]).numpy(),
            torch.stack(h["simulation"]).numpy() if h["simulation"] else None,
            tr.alpha.numpy(), tr.eps.numpy(), torch.stack(h["ode"]).numpy(), list(tr.alpha_switch),
            title=f"{pl_module.activation} student, eta = {pl_module.eta:g}, d = {d}"
                  + (" (ReLU ODE: small-eta limit)" if pl_module.activation == "relu" else ""))


def theory_overlay_figure(path, labels: list[str], alpha: np.ndarray, order_params: np.ndarray,
                          simulation: np.ndarray | None, ode_alpha: np.ndarray, ode_eps: np.ndarray,
                          ode_at_steps: np.ndarray, switches: list[float], title: str = ""):
    """Per member (columns, four to a row): the error of every task vs alpha, simulation solid
    (Monte Carlo dots), ODE dashed, switches dotted; below it ``(simulation - ODE) / ODE`` with
    the +-5 % band. ``order_params``, ``simulation``, ``ode_at_steps``: (T, E, n_tasks);
    ``ode_eps``: (E, n_rec, n_tasks)."""
    from callbacks.figures import _plt

    plt = _plt()
    m, n_tasks = order_params.shape[1], order_params.shape[2]
    ncol = min(m, 4)
    nrow = -(-m // ncol)
    fig = plt.figure(figsize=(max(4.6 * ncol, 7.0), 5.0 * nrow + 0.4), dpi=100)
    grid = fig.add_gridspec(2 * nrow, ncol, height_ratios=[2.2, 1.0] * nrow)
    colours = plt.cm.tab10(np.arange(10))
    for e in range(m):
        r, c = divmod(e, ncol)
        ax = fig.add_subplot(grid[2 * r, c])
        axd = fig.add_subplot(grid[2 * r + 1, c], sharex=ax)
        for t in range(n_tasks):
            col = colours[t % 10]
            ax.plot(alpha, order_params[:, e, t], color=col, lw=1.8, label=f"task {t + 1}: simulation")
            if simulation is not None:
                ax.plot(alpha, simulation[:, e, t], "o", color=col, ms=2.5, alpha=0.7,
                        label=f"task {t + 1}: Monte Carlo" if e == 0 else None)
            ax.plot(ode_alpha, ode_eps[e, :, t], color="k", ls="--", lw=1.0,
                    label="mean-field ODE" if t == 0 else None)
            ode = ode_at_steps[:, e, t]
            dev = 100 * (order_params[:, e, t] - ode) / np.maximum(np.abs(ode), 1e-12)
            axd.plot(alpha, dev, color=col, lw=1.2)
        for s in switches:
            ax.axvline(s, color="grey", ls=":", lw=0.8)
            axd.axvline(s, color="grey", ls=":", lw=0.8)
        axd.axhspan(-5, 5, color="grey", alpha=0.15, lw=0)
        axd.axhline(0, color="k", lw=0.6)
        ax.set_yscale("log")
        ax.set_title(labels[e], fontsize=9)
        ax.legend(fontsize=7)
        axd.set_xlabel("alpha = steps / d")
        if c == 0:
            ax.set_ylabel("generalisation error")
            axd.set_ylabel("(sim - ODE) / ODE [%]\n(grey: +-5 %)", fontsize=8)
    fig.suptitle(title + "\nsolid: simulation ([S] Eq. 9 on its weights), dots: Monte Carlo, dashed: mean-field ODE",
                 fontsize=9)
    save_figure(fig, path)
    return path
