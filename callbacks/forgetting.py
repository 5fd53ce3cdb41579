"""Forgetting and transfer, and forgetting vs task similarity ([S] Sec. 4.2.1, Figs. 6, 11; App. G, Fig. 12).

One callback for any multi-head module with ``task_errors(datamodule, source)``: the
teacher-student ensemble (profile over the feature similarity ``gamma``, beside the mean-field
ODE) and the MNIST classifier (profile over the number ``k`` of shared digits, mean over seeds and
digit draws). Definitions, the error matrix and the shape test: ``zoo.analysis.forgetting``;
figures: ``zoo.plots.forgetting``; the ODE: ``MultiHeadStudent.mean_field``.
"""
from __future__ import annotations

import math
from typing import Literal

import lightning.pytorch as pl
import torch
from torch import Tensor

from callbacks.base import HistoryCallback, all_members, check, log_figure, log_scalars, shown_members, warn_once, write_table
from zoo.analysis.forgetting import (error_matrix, forgetting_transfer, member_table, paired_differences, per_group,
                                     profile_shape, profiles)


class Forgetting(HistoryCallback):
    """Forgetting and transfer of every member and, over a similarity, their profile.

    At the end of each task (the clock at a ``switch_steps`` of the datamodule) it records every
    member's error on every task (``pl_module.task_errors``), a row of the error matrix. Every
    ``every_n_steps`` it logs ``error/task<t>/<member>``, ``forgetting/<member>`` (of task 1;
    ``forgetting/task<t>/<member>`` of later finished tasks) and ``transfer/<member>`` (to the task in
    training, 1-based ``t``) for up to ``max_members`` members; at the end ``forgetting_final/...``
    and ``transfer_final/...``; with ``delta_alpha``, ``forgetting_delta/<member>`` at
    ``Delta = delta_alpha`` time units after the first switch.

    When the members vary in the parameter ``over`` (``member_params``: ``gamma``, a list of
    similarities of datamodules.TeacherStudent; ``k``, MNISTContinual(shared=[...])), members that
    differ only in ``repeats`` are runs of one profile: it logs ``forgetting_profile/<group>/<over>=<x>``
    (mean over runs), ``.../peak_<over>``, ``.../maslow``, ``.../monotonic``, ``.../flat``
    (``profile_shape``: beyond ``tol``, and two standard errors of the paired differences of the
    runs), ``forgetting_profile/n_maslow``, ``n_monotonic``, the paired differences from the first
    ``x`` (``.../paired/...``, ``.../paired_se/...``) and, with digit draws, the profile of each
    draw (``forgetting_by_draw/...``). For a student whose ODE describes the run
    (``zoo.theory.meanfield.ode_caveats``) the same under ``forgetting_profile_ode/``. It writes
    ``forgetting_profile.png`` (forgetting vs ``over``; the final node norms of a student, or the
    last task's final error) or, with ``grid_rows``/``grid_cols``, ``forgetting_grid.png`` ([S] Fig. 11),
    and with ``table`` ``forgetting_members.csv`` (a row per member: its parameters and errors).

    Args:
        every_n_steps: clock units between logs.
        delta_alpha: read forgetting ``delta_alpha`` time units (``alpha = samples / d``) after the
            first switch (a batch end) instead of at the end.
        source: ``"theory"`` ([S] Eq. 9 on the weights) or ``"mc"`` (the test sets); default:
            theory where the module has a closed form, else mc.
        max_members: members with their own scalar tags.
        over: the member parameter of the profile; default ``k`` or else ``gamma``, whichever members vary in.
        repeats: member parameters that only repeat an experiment (averaged over).
        tol: differences below this count as flat in the shape test.
        ode: draw the mean-field ODE where it describes the run.
        d_alpha: Euler step of the ODE.
        grid_rows, grid_cols: member parameters that span the panel grid (both or neither).
        unit: the clock: ``"samples"`` (SGD samples of a student) or ``"steps"`` (optimizer steps).
        table, figure: write ``forgetting_members.csv``; the profile's figure.
    """

    HISTORY_KEYS = ("switch_errors", "delta_errors")  # the error matrix's rows; the errors at Delta

    def __init__(self, every_n_steps: int = 1000, delta_alpha: float | None = None,
                 source: Literal["theory", "mc"] | None = None, max_members: int = 32, over: str | None = None,
                 repeats: tuple[str, ...] = ("seed", "draw"), tol: float = 0.01, ode: bool = True,
                 d_alpha: float = 0.01, grid_rows: str | None = None, grid_cols: str | None = None,
                 unit: Literal["samples", "steps"] = "samples", table: bool = False, figure: bool = True) -> None:
        super().__init__(every_n_steps)
        who = "Forgetting"
        check(who, "source", source, source in (None, "theory", "mc"), "'theory', 'mc' or null")
        check(who, "delta_alpha", delta_alpha, delta_alpha is None or 0 < delta_alpha < math.inf, "a positive number or null")
        check(who, "max_members", max_members, int(max_members) == max_members >= 0, "an integer >= 0")
        check(who, "tol", tol, tol >= 0, ">= 0")
        check(who, "d_alpha", d_alpha, d_alpha > 0, "a positive Euler step")
        check(who, "grid_cols", grid_cols, (grid_rows is None) == (grid_cols is None), "set with grid_rows, or neither")
        check(who, "unit", unit, unit in ("samples", "steps"), "'samples' or 'steps'")
        self.delta_alpha, self.source, self.max_members, self.over = delta_alpha, source, int(max_members), over
        self.repeats, self.tol, self.ode, self.d_alpha = tuple(repeats), float(tol), bool(ode), float(d_alpha)
        self.grid_rows, self.grid_cols, self.unit, self.table, self.figure = grid_rows, grid_cols, unit, table, figure
        self.result: dict = {}

    @property
    def delta_errors(self) -> Tensor | None:
        return self.history["delta_errors"][0] if self.history["delta_errors"] else None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "task_errors")
        dm, params = trainer.datamodule, pl_module.member_params
        self.switch_steps = [int(s) for s in getattr(dm, "switch_steps", []) or []]
        if getattr(dm, "n_tasks", 1) < 2 or not self.switch_steps:
            raise ValueError(f"Forgetting: the datamodule has no task switch (n_tasks = {getattr(dm, 'n_tasks', 1)}); "
                             "forgetting needs n_tasks >= 2 and a switch_step")
        if self.source is None:
            closed = callable(getattr(pl_module, "theory_error", None)) and pl_module.activation_name != "sigmoid"
            self.source = "theory" if closed else "mc"
        if self.source == "theory" and getattr(pl_module, "activation", None) == "sigmoid":
            raise ValueError("Forgetting: source = 'theory' has no closed form for activation 'sigmoid'; use source = 'mc'")
        if self.over is None:
            self.over = next((k for k in ("k", "gamma") if len({p.get(k) for p in params}) > 1), None)
        for name in ("over", "grid_rows", "grid_cols"):
            key = getattr(self, name)
            if key is not None and not all(key in p for p in params):
                raise ValueError(f"Forgetting: {name} = {key!r} is not a parameter of every member ({params[0]} ...)")
        self.delta_step = None
        if self.delta_alpha is not None:
            d = getattr(pl_module, "d", None)
            step = self.switch_steps[0] + round(self.delta_alpha * d) if d else None
            ends = {c[0] + c[1] for c in getattr(dm, "chunks", [])}
            if step is None or step > dm.num_steps or step not in ends or abs(self.delta_alpha * d - round(self.delta_alpha * d)) > 1e-6:
                raise ValueError(f"Forgetting: delta_alpha = {self.delta_alpha} is not a batch end of a teacher-student "
                                 f"stream (alpha = samples / d) after the switch; allowed: a multiple of "
                                 f"steps_per_batch / d up to the end of training")
            self.delta_step = step

    def errors(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Tensor:
        """Every member's error on every task now, (E, n_tasks): gathered across processes (a
        collective: every rank calls it at the same steps)."""
        with all_members(pl_module):
            return pl_module.task_errors(trainer.datamodule, self.source).detach().double().cpu()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = self.now = self.clock(trainer, pl_module)  # the step of what is logged here
        k = len(self.history["switch_errors"])
        if k < len(self.switch_steps) and now == self.switch_steps[k]:  # a batch never straddles a switch
            self.history["switch_errors"].append(self.errors(trainer, pl_module))
        if now == self.delta_step and self.history["switch_errors"]:
            self.history["delta_errors"] = [self.errors(trainer, pl_module)]
            self._log_members(trainer, pl_module, "forgetting_delta", self.delta_errors[:, 0] - self.history["switch_errors"][0][:, 0])
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_due(self, trainer, pl_module, outputs) -> None:
        eps = self.errors(trainer, pl_module)
        for t in range(eps.shape[1]):
            self._log_members(trainer, pl_module, f"error/task{t + 1}", eps[:, t])
        self._log_change(trainer, pl_module, eps, "")

    def _log_change(self, trainer, pl_module, eps: Tensor, suffix: str) -> None:
        if not self.history["switch_errors"]:
            return
        F, T = forgetting_transfer(error_matrix(self.history["switch_errors"]), eps)
        for i in range(F.shape[1]):
            self._log_members(trainer, pl_module, f"forgetting{suffix}" + (f"/task{i + 1}" if i else ""), F[:, i])
        k = F.shape[1]
        if k < eps.shape[1]:
            self._log_members(trainer, pl_module, f"transfer{suffix}" + (f"/task{k + 1}" if k > 1 else ""), T)

    def _log_members(self, trainer, pl_module, tag: str, values: Tensor) -> None:
        labels = shown_members(self, pl_module.labels, self.max_members, "max_members", "logs scalars of")
        log_scalars(trainer, {f"{tag}/{lbl}": values[e] for e, lbl in enumerate(labels)})

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # every rank: the ODE and the node norms read every member (a collective while sharded)
        with all_members(pl_module):
            self._report(trainer, pl_module)

    def _report(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.history["switch_errors"]:
            warn_once("Forgetting: training ended before the first task switch; nothing to report")
            return
        end, self.now = self.errors(trainer, pl_module), self.clock(trainer, pl_module)
        self._log_change(trainer, pl_module, end, "_final")
        at_switch = self.history["switch_errors"][0]
        read = end if self.delta_errors is None else self.delta_errors
        forgetting = read[:, 0] - at_switch[:, 0]
        self.result = {"forgetting": forgetting, "end": end, "at_switch": at_switch}
        if self.table and trainer.is_global_zero:
            write_table(trainer, "forgetting_members.csv", member_table(pl_module.member_params, forgetting, at_switch, end))
        if self.over is not None:
            self._profile(trainer, pl_module, forgetting, end)

    def _ode(self, trainer, pl_module) -> dict | None:
        """The ODE's forgetting (read like the simulation's) and final node norms of every member."""
        from zoo.theory.meanfield import ode_caveats

        if not (self.ode and callable(getattr(pl_module, "mean_field", None)) and self.over == "gamma"):
            return None
        dm, d, end = trainer.datamodule, pl_module.d, self.clock(trainer, pl_module)
        caveats = ode_caveats(pl_module.activation_name, pl_module.eta, dm, getattr(pl_module, "ewc", None) is not None)
        if caveats:
            warn_once(f"Forgetting: the mean-field ODE does not describe this run ({'; '.join(caveats)}): simulation only")
            return None
        read = (end if self.delta_errors is None else self.delta_step) / d
        tr = pl_module.mean_field(dm.W_teachers, dm.teacher_heads, [s / d for s in self.switch_steps], dm.num_steps / d,
                                  d_alpha=self.d_alpha, record_every=1.0, record_at=(read, end / d))
        eps = tr.eps[:, tr.index(read), 0] - tr.eps[:, tr.i_switch[0], 0]
        return {"forgetting": eps, "norms": torch.diagonal(tr.Q[:, tr.index(end / d)], dim1=-2, dim2=-1).clamp_min(0).sqrt()}

    def _profile(self, trainer, pl_module, forgetting: Tensor, end: Tensor) -> None:
        params, over = pl_module.member_params, self.over
        prof = profiles(forgetting, params, over, self.repeats)
        ode = self._ode(trainer, pl_module)
        prof_ode = None if ode is None else profiles(ode["forgetting"], params, over, self.repeats)
        metrics = {}
        for kind, P in (("forgetting_profile", prof), ("forgetting_profile_ode", prof_ode)):
            for g, p in (P or {}).items():
                p["shape"] = s = profile_shape(p["x"], p["mean"], self.tol, p["runs"])
                metrics |= {f"{kind}/{g}/{over}={x:g}": m for x, m in zip(p["x"], p["mean"])}
                metrics |= {f"{kind}/{g}/peak_{over}": s["peak"], **{f"{kind}/{g}/{c}": float(s[c])
                            for c in ("maslow", "monotonic", "flat")}}
                if p["runs"] is not None and p["runs"].shape[1] > 1:  # what the shape test weighs
                    for x, dm_, se in list(zip(p["x"], *paired_differences(p["runs"])))[1:]:
                        metrics[f"{kind}/{g}/paired/{over}={x:g}-{over}={p['x'][0]:g}"] = dm_
                        metrics[f"{kind}/{g}/paired_se/{over}={x:g}-{over}={p['x'][0]:g}"] = se
            if P:
                metrics[f"{kind}/n_maslow"] = sum(p["shape"]["maslow"] for p in P.values())
                metrics[f"{kind}/n_monotonic"] = sum(p["shape"]["monotonic"] for p in P.values())
        if "draw" in self.repeats and any("draw" in p for p in params):
            for g, p in profiles(forgetting, params, over, tuple(r for r in self.repeats if r != "draw")).items():
                metrics |= {f"forgetting_by_draw/{g}/{over}={x:g}": m for x, m in zip(p["x"], p["mean"])}
        log_scalars(trainer, metrics)
        self.result |= {"profiles": prof, "profiles_ode": prof_ode}
        if callable(getattr(pl_module, "order_parameters", None)) and hasattr(trainer.datamodule, "W_teachers"):
            Q = pl_module.order_parameters(trainer.datamodule.W_teachers)[0]  # final node norms sqrt(Q_ii), [S] Fig. 6b
            norms = torch.diagonal(Q, dim1=-2, dim2=-1).clamp_min(0).sqrt().cpu().numpy()
            self.result["norms"] = per_group(norms, params, over, self.repeats)
            if ode is not None:
                self.result["norms_ode"] = per_group(ode["norms"].numpy(), params, over, self.repeats)
        if self.figure and trainer.is_global_zero:
            self.result["png"] = self._figure(trainer, pl_module, prof, prof_ode, end)

    def _figure(self, trainer, pl_module, prof: dict, prof_ode: dict | None, end: Tensor):
        from zoo.plots.forgetting import forgetting_grid_figure, forgetting_profile_figure

        over, r, step = self.over, self.result, self.clock(trainer, pl_module)
        if self.grid_rows is not None:
            fig = forgetting_grid_figure(prof, over, self.grid_rows, self.grid_cols, self.tol, prof_ode)
            return log_figure(trainer, "forgetting_grid", fig, png="forgetting_grid.png", step=step)
        later = None if "norms" in r else profiles(end[:, -1], pl_module.member_params, over, self.repeats)
        when = "end of training" if self.delta_errors is None else f"Delta = {self.delta_alpha:g} after the switch"
        fig = forgetting_profile_figure(prof, over, when, ode=prof_ode, norms=r.get("norms"), norms_ode=r.get("norms_ode"),
                                        later=later, title=f"{type(pl_module).__name__}: forgetting of task 1 vs {over}")
        return log_figure(trainer, "forgetting_profile", fig, png="forgetting_profile.png", step=step)

