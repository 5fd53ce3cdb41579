"""Callbacks for GDLNs and ReLU nets ([H]): loss curves beside the theory, pathway singular values,
and the XoR learning times of [H] Fig. 2d.

They read ``epoch_loss`` from the outputs of ``zoo.gdln`` modules (a (epochs, E) tensor, or a dict
name -> tensor for ``zoo.gdln.Comparison``), so the loss of every epoch is kept without extra work.
The theory comes from ``zoo.theory.gdln``: the race ([H] Eq. 6) for a GDLN on a single dataset,
the closed forms ([H] App. C Eqs. 22-23) on the XoR-margin task.
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor

from callbacks.base import PeriodicCallback, output_path, overlay_charts, resuming, log_scalars
from callbacks.figures import _plt, save_figure
from zoo.theory import gdln as theory


def _models(pl_module: pl.LightningModule) -> dict[str, pl.LightningModule]:
    """name -> network for a Comparison, or {'model': module} for a single network."""
    if hasattr(pl_module, "models") and hasattr(pl_module, "names"):
        return dict(zip(pl_module.names, pl_module.models))
    return {type(pl_module).__name__: pl_module}


def _total_epochs(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
    steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else \
        (trainer.max_epochs or 1) * trainer.num_training_batches
    return int(steps) * pl_module.epochs_per_step


def predicted_loss(model, X: Tensor, Y: Tensor, epochs: int, record_every: int = 10) -> tuple[Tensor, Tensor] | None:
    """The theory's loss curve for ``model`` in its own loss units, (steps (T,), loss (T, E')), or None.

    A GDLN on one dataset: the race ([H] Eq. 6, ``race_trajectory``) from the module's initial mode
    strength. A GDLN on the XoR-margin ensemble (X (E, 4, 3)): the closed forms of [H] App. C per
    member. A ReLU net has no theory of its own: its prediction is its ReLN's.
    """
    from zoo.gdln import GDLN

    if not isinstance(model, GDLN) or model.gating is None:
        return None
    N = X.shape[-2]
    unit = N if model.reduction == "sum" else 1.0
    tau, a0 = model.tau(N), model.initial_mode_strength()
    if X.dim() == 3:
        if model.gating_name not in ("linear", "xor"):
            return None
        deltas = X[:, 0, 2].abs().double()
        t = torch.arange(0, epochs + 1, record_every, dtype=torch.float64)
        loss = theory.xor_loss(t[:, None], deltas[None, :], model.gating_name, tau=tau, a0=a0)
        return t, unit * loss
    steps, _, loss = theory.race_trajectory(X, Y, model.gating, epochs, tau=tau, a0=model.pathway_a0(),
                                            training=model.training_mode, record_every=record_every)
    return steps.double(), unit * loss[:, None]


def closed_form_loss(model, datamodule, steps: Tensor) -> tuple[Tensor, Tensor] | None:
    """The corrected closed form of [H] App. F-G (m = C - 1) for a ReLN on the symmetric task, or None.

    Only for a ReLN trained with ``training='residual'``: the closed form solves that scheme (the
    context pathways learn the fixed residual from the start). A jointly trained ReLN learns
    faster (its context pathways grow while the common pathway learns); its theory is the race."""
    from zoo.gdln import GDLN

    if not (isinstance(model, GDLN) and model.gating_name == "reln" and model.training_mode == "residual"
            and getattr(datamodule, "structure", "") == "same"):
        return None
    X, Y = datamodule.X, datamodule.Y
    unit = X.shape[0] if model.reduction == "sum" else 1.0
    a0, common = model.pathway_a0(), model.gating.common
    _, loss = theory.contexts_closed_form(X, Y, model.gating, steps, tau=model.tau(X.shape[0]),
                                          a0=float(a0[common].mean()), a0_context=float(a0[~common].mean()))
    return steps, unit * loss[:, None]


class EpochLosses(pl.Callback):
    """Records the loss of every epoch of a ``zoo.gdln`` module (or every model of a ``Comparison``)
    from the ``epoch_loss`` of its step outputs: ``curves[name]``, chunks of (epochs, E).

    The base of the callbacks that draw these curves. When several of them train together, the
    later ones read the first one's record (``record``) instead of keeping their own copy: 100 runs
    x 20,000 epochs are 16 MB per copy.
    """

    def __init__(self) -> None:
        self.curves: dict[str, list[Tensor]] = {}
        self.record: "EpochLosses" = self

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a fresh record per fit; a checkpoint's is loaded after this
            self.curves = {}

    # the losses so far are the curves' first part after a resume: they live in the checkpoint
    def state_dict(self) -> dict:
        return {"curves": {name: torch.cat(parts) for name, parts in self.curves.items() if parts}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.curves = {name: [L] for name, L in state_dict["curves"].items()}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not hasattr(pl_module, "epochs_per_step"):
            raise TypeError(f"{type(self).__name__} needs a zoo.gdln module; {type(pl_module).__name__} is not one")
        self.record = next(c for c in trainer.callbacks if isinstance(c, EpochLosses))
        recorded = sum(len(L) for L in self.curves.get(next(iter(_models(pl_module))), []))
        if self.record is self and recorded != pl_module.epochs_done:
            raise RuntimeError(f"{type(self).__name__}: the checkpoint holds {recorded} epochs of losses but the module "
                               f"is at epoch {pl_module.epochs_done}; resume from a checkpoint of this run")
        self.curves = {name: self.curves.get(name, []) for name in _models(pl_module)}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.record is not self:
            return
        losses = outputs["epoch_loss"]
        losses = losses if isinstance(losses, dict) else {next(iter(self.curves)): losses}
        for name, l in losses.items():
            self.curves[name].append(l.detach().double().cpu())

    def recorded(self) -> list[str]:
        """The models with at least one recorded epoch."""
        return [name for name, parts in self.record.curves.items() if parts]

    def curve(self, name: str) -> tuple[Tensor, Tensor]:
        """Epochs (T,) and every epoch's loss (T, E) of model ``name`` so far."""
        L = torch.cat(self.record.curves[name])
        return torch.arange(L.shape[0], dtype=torch.float64), L


class LossCurves(EpochLosses):
    """Every epoch's loss of every network, the theory's curve beside it, a PNG at the end.

    TensorBoard: ``loss_curve/<model>`` (member mean) and ``loss_curve/<model>_predicted`` every
    ``every_n_epochs`` epochs, overlaid in the CUSTOM SCALARS chart "loss curves"; at the end
    ``epochs_to/<model>/<fraction>`` (epochs to reach that fraction of the initial loss, mean over
    members, [H] Sec. 4 criteria). PNG ``loss_curves.png``.

    Args:
        every_n_epochs: TensorBoard spacing of the curves.
        fractions: fractions of the initial loss whose epochs-to-reach are reported.
        predict: draw the theory (the race can take a few seconds for 8,000 epochs).
        log_y: logarithmic loss axis.
        closed_form: also draw the symmetric-context closed form ([H] App. F-G, corrected) for a
            ReLN trained with ``training='residual'`` on ``Contexts(structure='same')``, as
            ``<model>_closed_form``.
    """

    def __init__(self, every_n_epochs: int = 50, fractions: list[float] = [0.5, 0.1, 0.01], predict: bool = True,
                 log_y: bool = True, closed_form: bool = False) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"LossCurves: every_n_epochs = {every_n_epochs}; allowed: a positive integer")
        if not fractions or any(not 0 < f < 1 for f in fractions):
            raise ValueError(f"LossCurves: fractions = {fractions}; allowed: numbers in (0, 1)")
        super().__init__()
        self.every_n_epochs, self.fractions, self.predict, self.log_y = every_n_epochs, list(fractions), predict, log_y
        self.closed_form = closed_form
        self.predictions: dict[str, tuple[Tensor, Tensor]] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.predictions = {}
        if self.predict:
            dm = trainer.datamodule
            epochs = _total_epochs(trainer, pl_module)
            # the grid holds every logged epoch, so the logged prediction does not depend on the run's length
            every = max(d for d in range(1, self.every_n_epochs + 1)
                        if self.every_n_epochs % d == 0 and d <= max(1, epochs // 2000))
            for name, m in _models(pl_module).items():
                pred = predicted_loss(m, dm.X, dm.Y, epochs, record_every=every)
                if pred is not None:
                    self.predictions[name] = pred
                closed = closed_form_loss(m, dm, pred[0]) if self.closed_form and pred is not None else None
                if closed is not None:
                    self.predictions[f"{name}_closed_form"] = closed
        overlay_charts(trainer, "loss curves", {"simulated and predicted": r"loss_curve/.*"})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        losses = outputs["epoch_loss"]
        losses = losses if isinstance(losses, dict) else {next(iter(self.curves)): losses}
        first = outputs["first_epoch"]
        for name, l in losses.items():
            due = [k for k in range(l.shape[0]) if (first + k) % self.every_n_epochs == 0]
            for k in due:
                metrics = {f"loss_curve/{name}": float(l[k].mean())}
                for key, tag in ((name, f"{name}_predicted"), (f"{name}_closed_form", f"{name}_closed_form")):
                    if key in self.predictions:
                        t, p = self.predictions[key]
                        i = int(torch.searchsorted(t, torch.tensor(float(first + k), dtype=t.dtype)).clamp(max=len(t) - 1))
                        metrics[f"loss_curve/{tag}"] = float(p[i].mean())
                log_scalars(trainer, metrics, step=first + k)

    def epochs_to(self) -> dict[str, Tensor]:
        """Epochs to reach each fraction of the initial loss, mean over members, per model (and prediction)."""
        out = {}
        for name in self.recorded():
            t, L = self.curve(name)
            out[name] = theory.times_to_fraction(t, L, tuple(self.fractions)).mean(-1)
        for name, (t, p) in self.predictions.items():
            out[f"{name}_predicted"] = theory.times_to_fraction(t, p, tuple(self.fractions)).mean(-1)
        return out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or not self.recorded():
            return
        times = self.epochs_to()
        metrics = {f"epochs_to/{name}/{f:g}": float(v) for name, vs in times.items() for f, v in zip(self.fractions, vs)
                   if math.isfinite(float(v))}
        log_scalars(trainer, metrics)
        plt = _plt()
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
        colours = plt.cm.tab10(np.arange(10))
        lines = []
        for i, name in enumerate(self.curves):
            if name not in times:
                continue
            t, L = self.curve(name)
            c = colours[i % 10]
            ax.plot(t.numpy(), L.mean(-1).numpy(), color=c, lw=1.8, label=f"{name} (simulated)")
            if name in self.predictions:
                tp, p = self.predictions[name]
                ax.plot(tp.numpy(), p.mean(-1).numpy(), color=c, ls="--", lw=1.2, label=f"{name} (predicted)")
            lines.append(f"{name}: " + ", ".join(f"{v:.0f}" for v in times[name].tolist()))
            if f"{name}_closed_form" in self.predictions:
                tp, p = self.predictions[f"{name}_closed_form"]
                ax.plot(tp.numpy(), p.mean(-1).numpy(), color=c, lw=5, alpha=0.3, label=f"{name} (closed form)")  # wide: the race runs on it
                lines.append("closed form: " + ", ".join(f"{v:.0f}" for v in times[f"{name}_closed_form_predicted"].tolist()))
        if self.log_y:
            ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        ax.legend(fontsize=8)
        ax.set_title("epochs to " + "/".join(f"{f:g}" for f in self.fractions) + " of the initial loss\n" + "; ".join(lines),
                     fontsize=7)
        save_figure(fig, output_path(trainer, "loss_curves.png"))


class PathwaySingularValues(PeriodicCallback):
    """Each GDLN pathway's map projected on the modes of its effective dataset ([H] Eq. 5: the B of
    Eq. 6), beside the race's prediction; PNG ``pathway_singular_values.png`` at the end.

    TensorBoard: ``pathway_sv/<model>/<pathway>/mode<k>`` and ``..._predicted`` (member mean).

    Args:
        every_n_steps: training steps (chunks of ``epochs_per_step`` epochs) between records.
        n_modes: modes per pathway.
    """

    def __init__(self, every_n_steps: int = 1, n_modes: int = 3) -> None:
        super().__init__(every_n_steps)
        if n_modes < 1:
            raise ValueError(f"PathwaySingularValues: n_modes = {n_modes}; allowed: a positive integer")
        self.n_modes = n_modes
        self.history: dict[str, list] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a fresh record per fit; a checkpoint's is loaded after this
            self.history = {}

    def state_dict(self) -> dict:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = state_dict["history"]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # the resumed run's TensorBoard starts at this epoch (zoo.gdln.save_log_step): log again
        # what was recorded here before the checkpoint
        epoch = pl_module.epochs_done
        if resuming(trainer):
            for name, m in self.gdlns.items():
                if self.history[name] and self.history[name][-1][0] == epoch:
                    self._log(trainer, name, m, epoch, self.history[name][-1][1])

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.gdln import GDLN

        dm = trainer.datamodule
        if dm.X.dim() != 2:
            raise ValueError("PathwaySingularValues: needs one dataset (not an ensemble over data, e.g. a Delta list)")
        self.gdlns = {n: m for n, m in _models(pl_module).items() if isinstance(m, GDLN)}
        if not self.gdlns:
            raise TypeError("PathwaySingularValues needs a GDLN (or a Comparison holding one)")
        self.modes, self.race = {}, {}
        self.history = {n: self.history.get(n, []) for n in self.gdlns}
        epochs = _total_epochs(trainer, pl_module)
        for name, m in self.gdlns.items():
            syx, _ = theory.effective_datasets(dm.X, dm.Y, m.gating)
            k = self.n_modes
            modes = theory.pathway_modes(syx)
            U = torch.stack([torch.nn.functional.pad(u[:, :k], (0, k - u[:, :k].shape[1])) for u, _, _ in modes])
            V = torch.stack([torch.nn.functional.pad(v[:, :k], (0, k - v[:, :k].shape[1])) for _, _, v in modes])
            self.modes[name] = (U, V)
            t, maps, _ = theory.race_trajectory(dm.X, dm.Y, m.gating, epochs, tau=m.tau(dm.X.shape[0]),
                                                a0=m.pathway_a0(), training=m.training_mode,
                                                record_every=max(1, pl_module.epochs_per_step * self.every_n_steps))
            self.race[name] = (t, torch.einsum("pok,tpoi,pik->tpk", U, maps, V))

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        epoch = pl_module.epochs_done
        for name, m in self.gdlns.items():
            U, V = self.modes[name]
            sv = m.pathway_singular_values(U, V).mean(0).cpu()  # (P, k)
            self.history[name].append((epoch, sv))
            self._log(trainer, name, m, epoch, sv)

    def _log(self, trainer: pl.Trainer, name: str, m, epoch: int, sv: Tensor) -> None:
        t, pred = self.race[name]
        i = int(torch.searchsorted(t, torch.tensor(epoch)).clamp(max=len(t) - 1))
        metrics = {}
        for p, pname in enumerate(m.gating.names):
            for k in range(self.n_modes):
                metrics[f"pathway_sv/{name}/{pname}/mode{k}"] = float(sv[p, k])
                metrics[f"pathway_sv/{name}/{pname}/mode{k}_predicted"] = float(pred[i, p, k])
        self.log_scalars(trainer, metrics, step=epoch)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or not self.history:
            return
        plt = _plt()
        for name, m in self.gdlns.items():
            P = m.gating.n_pathways
            fig, axes = plt.subplots(1, P, figsize=(3.2 * P, 3.2), dpi=100, squeeze=False)
            ep = np.array([e for e, _ in self.history[name]])
            sv = torch.stack([s for _, s in self.history[name]]).numpy()
            t, pred = self.race[name]
            for p in range(P):
                ax = axes[0, p]
                for k in range(self.n_modes):
                    ax.plot(ep, sv[:, p, k], color=plt.cm.viridis(k / max(self.n_modes, 2)), lw=1.6)
                    ax.plot(t.numpy(), pred[:, p, k].numpy(), color="k", ls="--", lw=0.8)
                ax.set_title(f"{name}: {m.gating.names[p]}", fontsize=8)
                ax.set_xlabel("epoch")
            axes[0, 0].set_ylabel("u_k^T W_p v_k (dashed: race)")
            save_figure(fig, output_path(trainer, f"pathway_singular_values_{name}.png"))


class XorLearningTimes(pl.Callback):
    """[H] Fig. 2d: time to reach loss ``criterion`` vs the margin Delta, for every network of a
    ``Comparison`` on ``XorMargin(Delta=[...])`` (one member per Delta), beside the closed forms
    of the linear and XoR ReLNs ([H] App. C) and the crossover ``sqrt(2/3)``.

    Needs a ``LossCurves`` callback in the same Trainer (it reads its record). TensorBoard:
    ``xor_time/<model>/Delta=<D>`` and ``xor_time/closed_form_<kind>/Delta=<D>``; PNG ``xor_times.png``.
    [H] Fig. 2e as well: for the members nearest each of ``trajectory_deltas``, every network's
    simulated loss beside the closed-form loss of both GDLNs; PNG ``xor_trajectories.png``.
    """

    def __init__(self, criterion: float = 0.2, trajectory_deltas: list[float] = [0.3, 0.6, 1.0, 1.6]) -> None:
        if not 0 < criterion < 0.5:
            raise ValueError(f"XorLearningTimes: criterion = {criterion}; allowed: a loss in (0, 0.5)")
        if any(not (d >= 0) for d in trajectory_deltas):
            raise ValueError(f"XorLearningTimes: trajectory_deltas = {trajectory_deltas}; allowed: margins >= 0")
        self.criterion, self.trajectory_deltas = criterion, list(trajectory_deltas)

    def trajectories(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[dict]:
        """[H] Fig. 2e data, one dict per requested margin: the member nearest it (``member``, its
        ``Delta``), the steps ``t``, each network's simulated loss (``simulated``: name -> (T,)) and
        the closed forms (``closed_form``: 'linear'/'xor' -> (T,)), all in the networks' loss units."""
        curves = next((c for c in trainer.callbacks if isinstance(c, LossCurves)), None)
        if curves is None:
            raise TypeError("XorLearningTimes needs a callbacks.gdln.LossCurves in the same Trainer")
        deltas = trainer.datamodule.deltas.double()
        models = _models(pl_module)
        m0 = next(iter(models.values()))
        a0 = next((m.initial_mode_strength() for m in models.values() if hasattr(m, "initial_mode_strength")), 1e-6)
        unit = 4.0 if m0.reduction == "sum" else 1.0  # the closed forms are the mean loss over the 4 points
        out = []
        for e in sorted({int((deltas - d).abs().argmin()) for d in self.trajectory_deltas}):
            t = curves.curve(next(iter(models)))[0].double()
            out.append({
                "member": e, "Delta": float(deltas[e]), "t": t,
                "simulated": {name: curves.curve(name)[1][:, e] for name in models},
                "closed_form": {kind: unit * theory.xor_loss(t, deltas[e], kind, tau=m0.tau(4), a0=a0)
                                for kind in ("linear", "xor")},
            })
        return out

    def times(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[Tensor, dict[str, Tensor]]:
        """Deltas (E,) and time to the criterion per model, simulated and closed form."""
        curves = next((c for c in trainer.callbacks if isinstance(c, LossCurves)), None)
        if curves is None:
            raise TypeError("XorLearningTimes needs a callbacks.gdln.LossCurves in the same Trainer")
        dm = trainer.datamodule
        deltas = dm.deltas
        out = {}
        for name, m in _models(pl_module).items():
            t, L = curves.curve(name)
            crit = self.criterion * (4 if m.reduction == "sum" else 1)  # the closed forms use the mean loss
            out[name] = theory.time_to_loss(t, L, crit)
        m0 = next(iter(_models(pl_module).values()))
        a0 = next((m.initial_mode_strength() for m in _models(pl_module).values() if hasattr(m, "initial_mode_strength")), 1e-6)
        for kind in ("linear", "xor"):
            out[f"closed_form_{kind}"] = theory.xor_time_to_loss(deltas, kind, tau=m0.tau(4), a0=a0, criterion=self.criterion)
        return deltas, out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        deltas, times = self.times(trainer, pl_module)
        metrics = {f"xor_time/{name}/Delta={d:g}": float(v) for name, ts in times.items()
                   for d, v in zip(deltas.tolist(), ts.tolist()) if math.isfinite(v)}
        log_scalars(trainer, metrics)
        plt = _plt()
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        style = {"closed_form_linear": dict(color="tab:blue", ls="-", lw=2.5, alpha=0.6, label="linear GDLN (closed form)"),
                 "closed_form_xor": dict(color="tab:orange", ls="-", lw=2.5, alpha=0.6, label="XoR GDLN (closed form)")}
        markers = iter(["o", "s", "^", "v", "D"])
        for name, ts in times.items():
            kw = style.get(name, dict(ls="none", marker=next(markers, "o"), ms=5, label=f"{name} (simulated)"))
            ax.plot(deltas.numpy(), ts.numpy(), **kw)
        ax.axvline(theory.xor_crossover(), color="grey", ls="--", lw=1, label="sqrt(2/3)")
        ax.set_xlabel("Delta")
        ax.set_ylabel(f"steps to loss {self.criterion:g}")
        ax.legend(fontsize=7)
        save_figure(fig, output_path(trainer, "xor_times.png"))
        self.trajectory_figure(trainer, pl_module)

    def trajectory_figure(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """[H] Fig. 2e: one panel per margin, simulated (solid) and closed-form (wide, pale) losses."""
        panels = self.trajectories(trainer, pl_module)
        plt = _plt()
        fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), dpi=100, squeeze=False)
        colours = {"linear": "tab:blue", "xor": "tab:orange"}
        for ax, p in zip(axes[0], panels):
            for kind, L in p["closed_form"].items():
                ax.plot(p["t"].numpy(), L.numpy(), color=colours[kind], lw=5, alpha=0.3, label=f"{kind} GDLN (closed form)")
            for i, (name, L) in enumerate(p["simulated"].items()):
                ax.plot(p["t"].numpy(), L.numpy(), color=f"C{i + 2}", lw=1.2, label=f"{name} (simulated)")
            ax.set_title(f"Delta = {p['Delta']:.3g}", fontsize=9)
            ax.set_xlabel("step")
            # the drops are sharp: show up to a little past the last curve's fall below 2% of its start
            busy = [float(p["t"][(L > 0.02 * L[0]).nonzero().max()]) for L in
                    [*p["simulated"].values(), *p["closed_form"].values()] if bool((L > 0.02 * L[0]).any())]
            if busy:
                ax.set_xlim(0, min(float(p["t"][-1]), 1.3 * max(busy)))
        axes[0, 0].set_ylabel("loss")
        axes[0, -1].legend(fontsize=6)
        save_figure(fig, output_path(trainer, "xor_trajectories.png"))
