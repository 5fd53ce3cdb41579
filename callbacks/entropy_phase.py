"""Entropy phase diagrams of specialisation ([S] Sec. 4.2, Fig. 5; App. E, Fig. 10).

One ensemble fit of :class:`zoo.MultiHeadStudent` whose members form a grid over their initial
parameters (``grid: true``; by default the first layer's ``sigma`` and the polar readout's ``r``
and ``theta``) learns one teacher. :class:`EntropyPhaseDiagram` arranges the specialisation
entropies of [S] Eq. 10 on that grid, for the simulation and for the mean-field ODE started from
every member's own initial order parameters, and measures how much of their variation each
parameter explains ([S] Sec. 4.2: "the strongest determinant of specialisation is ... theta").
The grid and the variance decomposition are in ``zoo.analysis.init_grid``, the figure in
``zoo.plots.entropy_phase``, the ODE in ``MultiHeadStudent.mean_field``.
"""
from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from callbacks.base import HistoryCallback, check, log_figure, log_scalars, warn_once
from callbacks.teacher_student import student_errors, teacher_data
from zoo.analysis.init_grid import ENTROPIES, InitGrid, init_grid, phase_record, phase_report

class EntropyPhaseDiagram(HistoryCallback):
    """Phase diagrams of the specialisation entropies over the initialisation ([S] Figs. 5, 10).

    At the end of the fit (and every ``every_n_steps`` SGD samples if given) it takes ``H_m``,
    ``H_Q``, ``H_h`` of [S] Eq. 10 of every member's active head, from the trained weights
    (``pl_module.entropies()``) and from the mean-field ODE (``pl_module.mean_field``, all members
    in one call) at the same alpha, on the grid of ``axes`` (member parameters: x, y, panels).

    It writes ``entropy_phase.png`` (rows: entropy x source, and the simulation's final error,
    [S] Eq. 9 or Monte Carlo for sigmoid; blue = specialised, yellow = not) and logs the figure
    per entropy (``entropy_phase/<H>``, at every record) and the SCALARS
    ``entropy_phase/<H>/mean_abs_diff`` (mean over the grid of ``|H_sim - H_ode|``),
    ``entropy_phase/<H>/same_side`` (fraction of cells on the same side of ``threshold * max``),
    ``entropy_phase/<source>/<H>/var_explained/<axis>`` (main-effect share, printed at the end),
    ``entropy_phase/<source>/<H>/mean`` and ``entropy_phase/error/{median,max,fraction_converged,ode_median}``.
    It warns where the ODE does not describe the run (``meanfield.ode_caveats``); ``self.result``
    holds the last record's arrays.

    Args:
        every_n_steps: also record every this many SGD samples (and at the start); default: end only.
        ode: integrate the mean-field ODE and draw it beside the simulation (erf, relu, linear).
        d_alpha: Euler step of the ODE in alpha; default ``0.01 / eta`` (the rates scale with eta).
        threshold: the specialisation threshold, as a fraction of each entropy's maximum.
        converged: a member whose final error is below this counts as converged.
        figure: write ``entropy_phase.png``.
        axes: the three member parameters of the grid (x, y, panels).
    """

    unit = "samples"
    HISTORY_KEYS = ("steps", "entropies")  # kept in checkpoints: a resumed fit keeps the intermediate records

    def __init__(self, every_n_steps: int | None = None, ode: bool = True, d_alpha: float | None = None,
                 threshold: float = 0.5, converged: float = 1e-3, figure: bool = True,
                 axes: tuple[str, str, str] = ("sigma", "r", "theta")) -> None:
        who = "EntropyPhaseDiagram"
        check(who, "every_n_steps", every_n_steps, every_n_steps is None or (not isinstance(every_n_steps, bool)
              and int(every_n_steps) == every_n_steps >= 1), "a positive integer or null (end only)")
        super().__init__(1 if every_n_steps is None else int(every_n_steps))
        self.intermediate = every_n_steps is not None
        check(who, "d_alpha", d_alpha, d_alpha is None or (isinstance(d_alpha, (int, float)) and 0 < d_alpha < math.inf),
              "a positive number or null (0.01 / eta)")
        check(who, "threshold", threshold, 0 < threshold < 1, "a fraction of the maximal entropy in (0, 1)")
        check(who, "converged", converged, converged > 0, "an error > 0")
        check(who, "axes", axes, len(axes) == 3 and len(set(axes)) == 3, "three distinct member parameters (x, y, panels)")
        self.ode, self.d_alpha, self.threshold = bool(ode), d_alpha, float(threshold)
        self.converged, self.figure, self.axes = float(converged), bool(figure), tuple(axes)
        self.grid: InitGrid | None = None
        self.trajectory = None
        self.result: dict[str, Any] = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.theory.meanfield import ACTIVATIONS, ode_caveats

        self.need(pl_module, "entropies", "task_errors", *(("mean_field",) if self.ode else ()))
        try:
            self.grid = init_grid(pl_module.member_params, self.axes)
        except ValueError as err:
            raise ValueError(f"EntropyPhaseDiagram: axes = {list(self.axes)}: {err}") from None
        dm = teacher_data(trainer, "EntropyPhaseDiagram")
        act = pl_module.activation_name
        if self.ode:
            if act not in ACTIVATIONS:
                raise ValueError(f"EntropyPhaseDiagram: ode = true but the student's activation is {act!r}, which has no "
                                 f"mean-field theory; allowed: {', '.join(ACTIVATIONS)}, or ode: false")
            for why in ode_caveats(act, pl_module.eta, dm, getattr(pl_module, "ewc", None) is not None):
                rank_zero_warn(f"EntropyPhaseDiagram: the mean-field ODE does not describe this run: {why}")

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if self.intermediate:
            self._record(trainer, pl_module)

    def _record(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = self.clock(trainer, pl_module)
        if step not in self.history["steps"]:
            self.append(steps=step, entropies={k: v.detach().double().cpu() for k, v in pl_module.entropies().items()})

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or self.grid is None:
            return
        self._record(trainer, pl_module)
        final, d, dm = self.clock(trainer, pl_module), pl_module.d, trainer.datamodule
        if self.ode and final > 0:
            self._d_alpha = min(self.d_alpha or 0.01 / max(pl_module.eta, 1e-12), final / d)
            self.trajectory = pl_module.mean_field(
                dm.W_teachers, dm.teacher_heads, [s / d for s in dm.switch_steps], final / d, d_alpha=self._d_alpha,
                record_every=self.every_n_steps / d if self.intermediate else final / d)
        error = student_errors(trainer, pl_module)[:, int(pl_module.task)]
        for step in sorted(self.history["steps"]):
            r = self.compute(pl_module, step, error if step == final else None)
            self.log_record(trainer, pl_module, step, r)
        self.result = r
        self.report(pl_module)
        if self.figure:
            self.result["path"] = log_figure(trainer, "entropy_phase", self.make_figure(r, pl_module, ENTROPIES),
                                             png="entropy_phase.png", step=final)

    def compute(self, pl_module: pl.LightningModule, step: int, error: torch.Tensor | None) -> dict[str, Any]:
        """Grids of the recorded simulation at ``step`` and of the ODE at the same alpha
        (``zoo.analysis.init_grid.phase_record``)."""
        from zoo.metrics.overlaps import entropies, max_entropy

        alpha, ode, H_ode, ode_error = step / pl_module.d, self.trajectory, None, None
        if ode is not None:
            i = ode.index(alpha)
            if abs(float(ode.alpha[i]) - alpha) > 0.5 * self._d_alpha:
                warn_once("EntropyPhaseDiagram: a recorded step is not on the ODE's record grid; the nearest record is used")
            task = sum(alpha > a + 1e-12 for a in ode.alpha_switch)  # the head trained on the step just completed
            H_ode, ode_error = entropies(ode.Q[:, i], ode.heads[:, i, task]), ode.eps[:, i, task]
        sim = self.history["entropies"][self.history["steps"].index(step)]
        maxima = {H: max_entropy(H, pl_module.p) for H in ENTROPIES}
        return {"step": step, "alpha": alpha} | phase_record(self.grid, sim, maxima, self.threshold, H_ode, ode_error, error)

    def log_record(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int, r: dict[str, Any]) -> None:
        metrics: dict[str, float] = {}
        for src, table in r["var_explained"].items():
            for H, shares in table.items():
                metrics |= {f"entropy_phase/{src}/{H}/var_explained/{f}": v for f, v in shares.items()}
                metrics[f"entropy_phase/{src}/{H}/mean"] = float(r[src][H].mean())
        if "ode" in r:
            metrics |= {f"entropy_phase/{H}/mean_abs_diff": r["mean_abs_diff"][H] for H in ENTROPIES}
            metrics |= {f"entropy_phase/{H}/same_side": r["same_side"][H] for H in ENTROPIES}
        if "error" in r:
            eps = r["error"]
            metrics |= {"entropy_phase/error/median": float(np.median(eps)), "entropy_phase/error/max": float(eps.max()),
                        "entropy_phase/error/fraction_converged": float((eps < self.converged).mean())}
            if "ode_error" in r:
                metrics["entropy_phase/error/ode_median"] = float(np.median(r["ode_error"]))
        log_scalars(trainer, metrics, step=step)
        for H in ENTROPIES:
            log_figure(trainer, f"entropy_phase/{H}", self.make_figure(r, pl_module, (H,), error=False, dpi=80), step=step)

    def make_figure(self, r: dict[str, Any], pl_module: pl.LightningModule, rows=ENTROPIES, error: bool = True,
                    dpi: int = 100):
        from zoo.plots.entropy_phase import entropy_phase_figure

        header = (f"[S] Fig. 5 / 10: entropies of Eq. 10 at alpha = {r['alpha']:g} ({pl_module.activation_name}, "
                  f"eta = {pl_module.eta:g}, d = {pl_module.d}); blue = specialised, yellow = not (max log 2)")
        return entropy_phase_figure(r, rows, header, error=error, dpi=dpi)

    def report(self, pl_module: pl.LightningModule) -> None:
        """Print the variance decomposition and the agreement (also in ``self.result``)."""
        header = f"EntropyPhaseDiagram ({pl_module.activation_name}, eta = {pl_module.eta:g}, alpha = {self.result['alpha']:g})"
        rank_zero_info(phase_report(self.result, header, self.converged))
