"""Callbacks for GDLNs and ReLU nets ([H]): every epoch's loss beside the theory, pathway singular
values, the XoR learning times of [H] Fig. 2d-e and the stereotypical runs of Fig. 6b.

They read ``epoch_loss`` from the step outputs of ``zoo.gdln`` modules ((epochs, E), or a dict
name -> tensor for a ``Comparison``). The theory is the networks' own (``predicted_loss``,
``closed_form_loss``, ``zoo.theory.gdln``); figures are ``zoo.plots.gdln``'s.
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import Tensor

from callbacks.base import PeriodicCallback, log_figure, log_scalars, overlay_charts, resuming
from zoo.analysis.gdln import run_summary
from zoo.plots import gdln as plots
from zoo.theory import gdln as theory


def _total_epochs(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
    """The run's GD updates (= epochs): ``max_steps``, or the epochs' batches times their updates."""
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    return int((trainer.max_epochs or 1) * trainer.num_training_batches * pl_module.epochs_per_step)


class EpochLosses(pl.Callback):
    """Records the loss of every epoch of a ``zoo.gdln`` module (every model of a ``Comparison``):
    ``curves[name]``, chunks of (epochs, E). When several train together, the later ones read the
    first one's record (``record``): 100 runs x 20,000 epochs are 16 MB per copy."""

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
        if not callable(getattr(pl_module, "networks", None)):
            raise TypeError(f"{type(self).__name__} needs a zoo.gdln module; {type(pl_module).__name__} is not one")
        self.record = next(c for c in trainer.callbacks if isinstance(c, EpochLosses))
        names = list(pl_module.networks())
        recorded = sum(len(L) for L in self.curves.get(names[0], []))
        if self.record is self and recorded != pl_module.epochs_done:
            raise RuntimeError(f"{type(self).__name__}: the checkpoint holds {recorded} epochs of losses but the module "
                               f"is at epoch {pl_module.epochs_done}; resume from a checkpoint of this run")
        self.curves = {name: self.curves.get(name, []) for name in names}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.record is self:
            for name, l in _by_name(self.curves, outputs).items():
                self.curves[name].append(l.detach().double().cpu())

    def recorded(self) -> list[str]:
        """The models with at least one recorded epoch."""
        return [name for name, parts in self.record.curves.items() if parts]

    def curve(self, name: str) -> tuple[Tensor, Tensor]:
        """Epochs (T,) and every epoch's loss (T, E) of model ``name`` so far."""
        L = torch.cat(self.record.curves[name])
        return torch.arange(L.shape[0], dtype=torch.float64), L


def _by_name(curves: dict, outputs: dict) -> dict[str, Tensor]:
    losses = outputs["epoch_loss"]
    return losses if isinstance(losses, dict) else {next(iter(curves)): losses}


class LossCurves(EpochLosses):
    """Every epoch's loss of every network beside its theory (``predicted_loss``); PNG at the end.

    TensorBoard: ``loss_curve/<model>`` (member mean) and ``loss_curve/<model>_predicted`` every
    ``every_n_epochs`` epochs (CUSTOM SCALARS chart "loss curves"); at the end
    ``epochs_to/<model>/<fraction>`` (epochs to that fraction of the initial loss, member mean,
    [H] Sec. 4). PNG ``loss_curves.png``.

    Args:
        every_n_epochs: TensorBoard spacing of the curves.
        fractions: fractions of the initial loss whose epochs-to-reach are reported.
        predict: draw the theory (the race can take a few seconds for 8,000 epochs).
        log_y: logarithmic loss axis.
        closed_form: also the networks' ``closed_form_loss`` (a ReLN trained with
            ``training='residual'`` on ``Contexts(structure='same')``, [H] App. F-G), as ``<model>_closed_form``.
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
        dm, epochs = trainer.datamodule, _total_epochs(trainer, pl_module)
        # the grid holds every logged epoch, so the logged prediction does not depend on the run's length
        every = max(d for d in range(1, self.every_n_epochs + 1)
                    if self.every_n_epochs % d == 0 and d <= max(1, epochs // 2000))
        for name, m in pl_module.networks().items() if self.predict else ():
            pred = m.predicted_loss(dm.X, dm.Y, epochs, record_every=every)
            if pred is not None:
                self.predictions[name] = pred
                closed = m.closed_form_loss(dm, pred[0]) if self.closed_form else None
                if closed is not None:
                    self.predictions[f"{name}_closed_form"] = closed
        overlay_charts(trainer, "loss curves", {"simulated and predicted": r"loss_curve/.*"})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        first = outputs["first_epoch"]
        for name, l in _by_name(self.curves, outputs).items():
            for k in (k for k in range(l.shape[0]) if (first + k) % self.every_n_epochs == 0):
                metrics = {f"loss_curve/{name}": float(l[k].mean())}
                for key, tag in ((name, f"{name}_predicted"), (f"{name}_closed_form", f"{name}_closed_form")):
                    if key in self.predictions:
                        t, p = self.predictions[key]
                        i = int(torch.searchsorted(t, torch.tensor(float(first + k), dtype=t.dtype)).clamp(max=len(t) - 1))
                        metrics[f"loss_curve/{tag}"] = float(p[i].mean())
                log_scalars(trainer, metrics, step=first + k)

    def epochs_to(self) -> dict[str, Tensor]:
        """Epochs to reach each fraction of the initial loss, mean over members, per model (and prediction)."""
        out = {name: theory.times_to_fraction(*self.curve(name), tuple(self.fractions)).mean(-1) for name in self.recorded()}
        for name, (t, p) in self.predictions.items():
            out[f"{name}_predicted"] = theory.times_to_fraction(t, p, tuple(self.fractions)).mean(-1)
        return out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or not self.recorded():
            return
        times = self.epochs_to()
        log_scalars(trainer, {f"epochs_to/{name}/{f:g}": float(v) for name, vs in times.items()
                              for f, v in zip(self.fractions, vs) if math.isfinite(float(v))})
        lines = [f"{n}: " + ", ".join(f"{v:.0f}" for v in times[n].tolist()) for n in self.recorded()]
        lines += ["closed form: " + ", ".join(f"{v:.0f}" for v in times[f"{n}_predicted"].tolist())
                  for n in self.predictions if n.endswith("_closed_form")]
        title = "epochs to " + "/".join(f"{f:g}" for f in self.fractions) + " of the initial loss\n" + "; ".join(lines)
        closed = {n[: -len("_closed_form")]: p for n, p in self.predictions.items() if n.endswith("_closed_form")}
        fig = plots.loss_curves({n: self.curve(n) for n in self.recorded()}, self.predictions, closed, title, self.log_y)
        log_figure(trainer, "loss_curves", fig, png="loss_curves.png")


class PathwaySingularValues(PeriodicCallback):
    """Each GDLN pathway's map projected on the modes of its effective dataset ([H] Eq. 5: the B of
    Eq. 6) beside the race's prediction. TensorBoard ``pathway_sv/<model>/<pathway>/mode<k>`` and
    ``..._predicted`` (member mean); PNG ``pathway_singular_values_<model>.png`` at the end.

    Args:
        every_n_steps: epochs (GD updates) between records.
        n_modes: modes per pathway.
    """

    unit = "epochs"

    def __init__(self, every_n_steps: int = 100, n_modes: int = 3) -> None:
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
        for name, m in self.gdlns.items() if resuming(trainer) else ():
            if self.history[name] and self.history[name][-1][0] == pl_module.epochs_done:
                self._log(trainer, name, m, *self.history[name][-1])

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        if dm.X.dim() != 2:
            raise ValueError("PathwaySingularValues: needs one dataset (not an ensemble over data, e.g. a Delta list)")
        self.gdlns = {n: m for n, m in pl_module.networks().items() if callable(getattr(m, "pathway_singular_values", None))}
        if not self.gdlns:
            raise TypeError("PathwaySingularValues needs a GDLN (or a Comparison holding one)")
        self.modes, self.race = {}, {}
        self.history = {n: self.history.get(n, []) for n in self.gdlns}
        for name, m in self.gdlns.items():
            U, V = theory.pathway_mode_matrices(theory.effective_datasets(dm.X, dm.Y, m.gating)[0], self.n_modes)
            self.modes[name] = (U, V)
            t, maps, _ = theory.race_trajectory(dm.X, dm.Y, m.gating, _total_epochs(trainer, pl_module),
                                                tau=m.tau(dm.X.shape[0]), a0=m.pathway_a0(), training=m.training_mode,
                                                record_every=self.every_n_steps)
            self.race[name] = (t, torch.einsum("pok,tpoi,pik->tpk", U, maps, V))

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        for name, m in self.gdlns.items():
            sv = m.pathway_singular_values(*self.modes[name]).mean(0).cpu()  # (P, k)
            self.history[name].append((pl_module.epochs_done, sv))
            self._log(trainer, name, m, pl_module.epochs_done, sv)

    def _log(self, trainer: pl.Trainer, name: str, m, epoch: int, sv: Tensor) -> None:
        t, pred = self.race[name]
        i = int(torch.searchsorted(t, torch.tensor(epoch)).clamp(max=len(t) - 1))
        self.log_scalars(trainer, {f"pathway_sv/{name}/{p}/mode{k}{tag}": float(v[j, k])
                                   for j, p in enumerate(m.gating.names) for k in range(self.n_modes)
                                   for tag, v in (("", sv), ("_predicted", pred[i]))}, step=epoch)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name, m in self.gdlns.items() if trainer.is_global_zero and self.history else ():
            epochs = torch.tensor([e for e, _ in self.history[name]]).numpy()
            sv = torch.stack([s for _, s in self.history[name]]).numpy()
            fig = plots.pathway_singular_values(epochs, sv, *self.race[name], m.gating.names, name)
            log_figure(trainer, f"pathway_singular_values/{name}", fig, png=f"pathway_singular_values_{name}.png")


class XorLearningTimes(pl.Callback):
    """[H] Fig. 2d: time to loss ``criterion`` vs the margin Delta for every network of a
    ``Comparison`` on ``XorMargin(Delta=[...])`` (one member per Delta), beside the closed forms of
    the linear and XoR ReLNs ([H] App. C) and the crossover ``sqrt(2/3)``. Needs a ``LossCurves``
    in the same Trainer. TensorBoard ``xor_time/<model>/Delta=<D>``, ``xor_time/closed_form_<kind>/
    Delta=<D>``; PNG ``xor_times.png``. [H] Fig. 2e: for the members nearest each of
    ``trajectory_deltas``, every network's loss beside both closed forms; PNG ``xor_trajectories.png``.
    """

    def __init__(self, criterion: float = 0.2, trajectory_deltas: list[float] = [0.3, 0.6, 1.0, 1.6]) -> None:
        if not 0 < criterion < 0.5:
            raise ValueError(f"XorLearningTimes: criterion = {criterion}; allowed: a loss in (0, 0.5)")
        if any(not (d >= 0) for d in trajectory_deltas):
            raise ValueError(f"XorLearningTimes: trajectory_deltas = {trajectory_deltas}; allowed: margins >= 0")
        self.criterion, self.trajectory_deltas = criterion, list(trajectory_deltas)

    def _setting(self, trainer: pl.Trainer, pl_module: pl.LightningModule):
        curves = next((c for c in trainer.callbacks if isinstance(c, LossCurves)), None)
        if curves is None:
            raise TypeError("XorLearningTimes needs a callbacks.gdln.LossCurves in the same Trainer")
        nets = pl_module.networks()
        m0 = next(iter(nets.values()))
        a0 = next((m.initial_mode_strength() for m in nets.values() if hasattr(m, "initial_mode_strength")), 1e-6)
        return curves, nets, m0.tau(4), a0, 4.0 if m0.reduction == "sum" else 1.0  # closed forms: mean over 4 points

    def trajectories(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[dict]:
        """[H] Fig. 2e data, one dict per requested margin: the member nearest it (``member``, its
        ``Delta``), the steps ``t``, each network's loss (``simulated``: name -> (T,)) and the closed
        forms (``closed_form``: 'linear'/'xor' -> (T,)), all in the networks' loss units."""
        curves, nets, tau, a0, unit = self._setting(trainer, pl_module)
        deltas, t = trainer.datamodule.deltas.double(), curves.curve(next(iter(nets)))[0]
        return [{"member": e, "Delta": float(deltas[e]), "t": t,
                 "simulated": {name: curves.curve(name)[1][:, e] for name in nets},
                 "closed_form": {k: unit * theory.xor_loss(t, deltas[e], k, tau=tau, a0=a0) for k in ("linear", "xor")}}
                for e in sorted({int((deltas - d).abs().argmin()) for d in self.trajectory_deltas})]

    def times(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[Tensor, dict[str, Tensor]]:
        """Deltas (E,) and time to the criterion per model, simulated and closed form."""
        curves, nets, tau, a0, unit = self._setting(trainer, pl_module)
        deltas = trainer.datamodule.deltas
        out = {name: theory.time_to_loss(*curves.curve(name), self.criterion * unit) for name in nets}
        for kind in ("linear", "xor"):
            out[f"closed_form_{kind}"] = theory.xor_time_to_loss(deltas, kind, tau=tau, a0=a0, criterion=self.criterion)
        return deltas, out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        deltas, times = self.times(trainer, pl_module)
        log_scalars(trainer, {f"xor_time/{name}/Delta={d:g}": float(v) for name, ts in times.items()
                              for d, v in zip(deltas.tolist(), ts.tolist()) if math.isfinite(v)})
        fig = plots.xor_times(deltas, times, self.criterion, theory.xor_crossover())
        log_figure(trainer, "xor_times", fig, png="xor_times.png")
        fig = plots.xor_trajectories(self.trajectories(trainer, pl_module))
        log_figure(trainer, "xor_trajectories", fig, png="xor_trajectories.png")


class StereotypicalLoss(EpochLosses):
    """[H] Fig. 6b: every run's (ensemble member's) loss curve faded, each network's stereotypical
    run (closest to the mean curve, ``zoo.analysis.gdln``) bold. At the end: ``stereotypical_loss``
    (PNG and TensorBoard image), scalars ``stereotypical/<model>/member``, ``.../epochs_to/<f>`` (its
    epochs to fraction f of its initial loss) with ``/min``, ``/max`` over runs, and for a two-
    hidden-layer ReLU net ``stereotypical/<model>/first_layer_on`` and ``..._min`` (1 when its
    first layer is linear on the data, as [H] Sec. 6 reports; ``ReLUNet.first_layer_on``).

    Args:
        fractions: fractions of the initial loss whose epochs-to-reach are reported.
        log_y: a second panel with a logarithmic loss axis.
    """

    def __init__(self, fractions: list[float] = [0.5, 0.1, 0.01], log_y: bool = True) -> None:
        if not fractions or any(not 0 < f < 1 for f in fractions):
            raise ValueError(f"StereotypicalLoss: fractions = {fractions}; allowed: numbers in (0, 1)")
        super().__init__()
        self.fractions, self.log_y = list(fractions), log_y
        self.summary: dict[str, dict] = {}

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or not self.recorded():
            return
        nets, metrics = pl_module.networks(), {}
        for name in self.recorded():
            s = self.summary[name] = run_summary(self.curve(name)[1], tuple(self.fractions))
            metrics[f"stereotypical/{name}/member"] = s["member"]
            metrics.update({f"stereotypical/{name}/epochs_to/{f:g}{tag}": float(s[key][i])
                            for i, f in enumerate(self.fractions) for key, tag in (("epochs_to", ""), ("min", "/min"),
                                                                                   ("max", "/max"))
                            if math.isfinite(float(s[key][i]))})
            if len(getattr(nets[name], "hidden", [])) == 2:
                s["first_layer_on"] = nets[name].first_layer_on(trainer.datamodule.X.to(nets[name].W[0].device))
                metrics[f"stereotypical/{name}/first_layer_on"], metrics[f"stereotypical/{name}/first_layer_on_min"] = \
                    s["first_layer_on"]
        log_scalars(trainer, metrics)
        fig = plots.stereotypical_loss({n: self.curve(n)[1] for n in self.summary}, self.summary, self.fractions, self.log_y)
        log_figure(trainer, "stereotypical_loss", fig, png="stereotypical_loss.png")
