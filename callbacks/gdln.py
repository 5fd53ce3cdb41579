"""Callbacks for GDLNs and ReLU nets ([H]): loss curves beside the theory, pathway singular values,
XoR learning times (Fig. 2d-e), stereotypical runs (Fig. 6b). They read ``epoch_loss`` (name ->
(E, epochs), every member on every rank) from ``zoo.models.gdln`` step outputs; theory and figures are
the zoo's. Across processes (``zoo.training.distributed``) a hook that reads the module's weights gathers
its members on every rank first (``all_members``); rank 0 alone logs and writes."""
from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import Tensor

from callbacks.base import (AtTrainEnd, HistoryCallback, all_members, check, check_count, log_figure, log_scalars,
                            overlay_charts, resuming)
from zoo.analysis.gdln import run_summary, xor_setting, xor_times, xor_trajectories
from zoo.plots import gdln as plots
from zoo.theory import gdln as theory


def _fractions(owner: str, fractions: list[float]) -> list[float]:
    check(owner, "fractions", fractions, bool(fractions) and all(0 < f < 1 for f in fractions), "numbers in (0, 1)")
    return list(fractions)


def _total_epochs(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
    """The run's GD updates (= epochs): ``max_steps``, or the epochs' batches times their updates."""
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    return int((trainer.max_epochs or 1) * trainer.num_training_batches * pl_module.epochs_per_step)


def _on_host(parts: list[Tensor]) -> Tensor:
    """The recorded chunks as one host tensor (a resumed run's first chunk is on the host already)."""
    return torch.cat([p.cpu() for p in parts])


class EpochLosses(pl.Callback):
    """Records the loss of every epoch of a ``zoo.models.gdln`` module (every model of a ``Comparison``):
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
        return {"curves": {name: _on_host(parts) for name, parts in self.curves.items() if parts}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.curves = {name: [L] for name, L in state_dict["curves"].items()}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not callable(getattr(pl_module, "networks", None)):
            raise TypeError(f"{type(self).__name__} needs a zoo.models.gdln module; {type(pl_module).__name__} is not one")
        self.record = next(c for c in trainer.callbacks if isinstance(c, EpochLosses))
        names = list(pl_module.networks())
        recorded = sum(len(L) for L in self.curves.get(names[0], []))
        if self.record is self and recorded != pl_module.epochs_done:
            raise RuntimeError(f"{type(self).__name__}: the checkpoint holds {recorded} epochs of losses but the module "
                               f"is at epoch {pl_module.epochs_done}; resume from a checkpoint of this run")
        self.curves = {name: self.curves.get(name, []) for name in names}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for name, l in outputs["epoch_loss"].items() if self.record is self else ():
            self.curves[name].append(l.detach().T.double())  # (epochs, E), left on the module's device: no sync

    def recorded(self) -> list[str]:
        """The models with at least one recorded epoch."""
        return [name for name, parts in self.record.curves.items() if parts]

    def curve(self, name: str) -> tuple[Tensor, Tensor]:
        """Epochs (T,) and every epoch's loss (T, E) of model ``name`` so far."""
        L = _on_host(self.record.curves[name])
        return torch.arange(L.shape[0], dtype=torch.float64), L


class LossCurves(EpochLosses):
    """Every epoch's loss of every network beside its theory (``predicted_loss``, if ``predict``)
    and, with ``closed_form``, its ``closed_form_loss`` ([H] App. F-G). TensorBoard every
    ``every_n_epochs``: ``loss_curve/<model>``, ``..._predicted``, ``..._closed_form`` (member mean;
    CUSTOM SCALARS "loss curves"); at the end ``epochs_to/<model>/<f>`` (epochs to each of
    ``fractions`` of the initial loss, member mean, [H] Sec. 4) and ``loss_curves.png`` (``log_y``)."""

    def __init__(self, every_n_epochs: int = 50, fractions: list[float] = [0.5, 0.1, 0.01], predict: bool = True,
                 log_y: bool = True, closed_form: bool = False) -> None:
        self.every_n_epochs = check_count("LossCurves", "every_n_epochs", every_n_epochs)
        super().__init__()
        self.fractions, self.predict = _fractions("LossCurves", fractions), predict
        self.log_y, self.closed_form, self.predictions = log_y, closed_form, {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.predictions = {}
        dm, epochs = trainer.datamodule, _total_epochs(trainer, pl_module)
        # the grid holds every logged epoch, so the logged prediction does not depend on the run's length
        every = max(d for d in range(1, self.every_n_epochs + 1)
                    if self.every_n_epochs % d == 0 and d <= max(1, epochs // 2000))
        # from every member's initial weights; on every rank, so that one that cannot predict fails on all
        with all_members(pl_module):
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
        if not trainer.is_global_zero:  # the loggers write on rank 0 only
            return
        first = outputs["first_epoch"]
        for name, l in outputs["epoch_loss"].items():
            logged = [k for k in range(l.shape[1]) if (first + k) % self.every_n_epochs == 0]
            l = l.detach().cpu() if logged else l  # (E, epochs): one copy to the host, then the logged means
            for k in logged:
                metrics = {f"loss_curve/{name}": float(l[:, k].mean())}
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
        closed = {n[: -len("_closed_form")]: p for n, p in self.predictions.items() if n.endswith("_closed_form")}
        title = plots.epochs_to_title(self.fractions, times, self.recorded(), list(closed))
        fig = plots.loss_curves({n: self.curve(n) for n in self.recorded()}, self.predictions, closed, title, self.log_y)
        log_figure(trainer, "loss_curves", fig, png="loss_curves.png")


class PathwaySingularValues(HistoryCallback):
    """Each GDLN pathway's map projected on the modes of its effective dataset ([H] Eq. 5: the B of
    Eq. 6) every ``every_n_steps`` epochs, beside the race (``GDLN.predicted_pathway_strengths``):
    TensorBoard ``pathway_sv/<model>/<pathway>/mode<k>`` and ``..._predicted`` (member mean); PNG
    ``pathway_singular_values_<model>.png`` at the end. ``n_modes``: modes per pathway."""

    unit = "epochs"
    HISTORY_KEYS = ("epochs", "sv")

    def __init__(self, every_n_steps: int = 100, n_modes: int = 3) -> None:
        super().__init__(every_n_steps)
        self.n_modes = check_count("PathwaySingularValues", "n_modes", n_modes)

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        if dm.X.dim() != 2:
            raise ValueError("PathwaySingularValues: needs one dataset (not an ensemble over data, e.g. a Delta list)")
        self.gdlns = {n: m for n, m in pl_module.networks().items() if hasattr(m, "predicted_pathway_strengths")}
        if not self.gdlns:
            raise TypeError("PathwaySingularValues needs a GDLN (or a Comparison holding one)")
        self.race = {n: m.predicted_pathway_strengths(dm.X, dm.Y, _total_epochs(trainer, pl_module), self.n_modes,
                                                      self.every_n_steps) for n, m in self.gdlns.items()}
        # the resumed run's TensorBoard starts at this epoch (zoo.training.resume_events): log again
        # what was recorded here before the checkpoint
        if resuming(trainer) and self.history["epochs"] and self.history["epochs"][-1] == self.now:
            self._log(trainer, self.now, self.history["sv"][-1])

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        sv = {n: m.pathway_singular_values(*self.race[n][:2]).mean(0).cpu() for n, m in self.gdlns.items()}  # (P, k)
        self.append(epochs=self.now, sv=sv)
        self._log(trainer, self.now, sv)

    def _log(self, trainer: pl.Trainer, epoch: int, sv: dict[str, Tensor]) -> None:
        for name, m in self.gdlns.items():
            t, pred = self.race[name][2:]
            i = int(torch.searchsorted(t, torch.tensor(epoch)).clamp(max=len(t) - 1))
            log_scalars(trainer, {f"pathway_sv/{name}/{p}/mode{k}{tag}": float(v[j, k])
                                       for j, p in enumerate(m.gating.names) for k in range(self.n_modes)
                                       for tag, v in (("", sv[name]), ("_predicted", pred[i]))}, step=epoch)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name, m in self.gdlns.items() if trainer.is_global_zero and self.history["sv"] else ():
            sv = torch.stack([s[name] for s in self.history["sv"]]).numpy()
            fig = plots.pathway_singular_values(torch.tensor(self.history["epochs"]).numpy(), sv, *self.race[name][2:],
                                                m.gating.names, name)
            log_figure(trainer, f"pathway_singular_values/{name}", fig, png=f"pathway_singular_values_{name}.png")


class XorLearningTimes(AtTrainEnd):
    """[H] Fig. 2d (``xor_times.png``, ``xor_time/<model or closed_form_<kind>>/Delta=<D>``): epochs to
    loss ``criterion`` vs the margin for every network on ``XorMargin(Delta=[...])``, the closed forms
    of the linear and XoR ReLNs ([H] App. C) and ``sqrt(2/3)``; Fig. 2e (``xor_trajectories.png``):
    the losses of the members nearest ``trajectory_deltas``. Reads a ``LossCurves``' record."""

    def __init__(self, criterion: float = 0.2, trajectory_deltas: list[float] = [0.3, 0.6, 1.0, 1.6]) -> None:
        who = "XorLearningTimes"
        check(who, "criterion", criterion, 0 < criterion < 0.5, "a loss in (0, 0.5)")
        check(who, "trajectory_deltas", trajectory_deltas, all(d >= 0 for d in trajectory_deltas), "margins >= 0")
        self.criterion, self.trajectory_deltas = criterion, list(trajectory_deltas)

    def _setting(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[dict, Tensor, dict]:
        curves = next((c for c in trainer.callbacks if isinstance(c, LossCurves)), None)
        if curves is None:
            raise TypeError("XorLearningTimes needs a callbacks.gdln.LossCurves in the same Trainer")
        nets = pl_module.networks()
        return {name: curves.curve(name) for name in nets}, trainer.datamodule.deltas, xor_setting(nets)

    def trajectories(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[dict]:
        """[H] Fig. 2e data (``zoo.analysis.gdln.xor_trajectories``)."""
        curves, deltas, kw = self._setting(trainer, pl_module)
        return xor_trajectories(curves, deltas, self.trajectory_deltas, **kw)

    def times(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[Tensor, dict[str, Tensor]]:
        """Deltas (E,) and time to the criterion per model, simulated and closed form."""
        curves, deltas, kw = self._setting(trainer, pl_module)
        return deltas, xor_times(curves, deltas, self.criterion, **kw)

    def publish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        deltas, times = self.times(trainer, pl_module)
        log_scalars(trainer, {f"xor_time/{name}/Delta={d:g}": float(v) for name, ts in times.items()
                              for d, v in zip(deltas.tolist(), ts.tolist()) if math.isfinite(v)})
        for tag, fig in (("xor_times", plots.xor_times(deltas, times, self.criterion, theory.xor_crossover())),
                         ("xor_trajectories", plots.xor_trajectories(self.trajectories(trainer, pl_module)))):
            log_figure(trainer, tag, fig, png=f"{tag}.png")


class StereotypicalLoss(EpochLosses, AtTrainEnd):
    """[H] Fig. 6b (``stereotypical_loss``, PNG and TensorBoard; a log panel with ``log_y``): every
    run's (member's) loss faded, each network's stereotypical run (``zoo.analysis.gdln``) bold.
    Scalars ``stereotypical/<model>/member``, ``.../epochs_to/<f>`` for each of ``fractions`` (with
    ``/min``, ``/max`` over runs) and for a two-layer ReLU net ``.../first_layer_on`` and ``_min``
    (``ReLUNet.first_layer_on``: 1 when its first layer is linear on the data, [H] Sec. 6)."""

    def __init__(self, fractions: list[float] = [0.5, 0.1, 0.01], log_y: bool = True) -> None:
        super().__init__()
        self.fractions, self.log_y, self.summary = _fractions("StereotypicalLoss", fractions), log_y, {}

    def publish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.recorded():
            return
        nets, metrics = pl_module.networks(), {}
        for name in self.recorded():
            s = self.summary[name] = run_summary(self.curve(name)[1], tuple(self.fractions))
            metrics[f"stereotypical/{name}/member"] = s["member"]
            metrics.update({f"stereotypical/{name}/epochs_to/{f:g}{tag}": float(s[key][i]) for i, f in enumerate(
                self.fractions) for key, tag in (("epochs_to", ""), ("min", "/min"), ("max", "/max")) if s[key][i].isfinite()})
            if len(getattr(nets[name], "hidden", [])) == 2:
                s["first_layer_on"] = nets[name].first_layer_on(trainer.datamodule.X.to(nets[name].W[0].device))
                metrics[f"stereotypical/{name}/first_layer_on"], metrics[f"stereotypical/{name}/first_layer_on_min"] = \
                    s["first_layer_on"]
        log_scalars(trainer, metrics)
        fig = plots.stereotypical_loss({n: self.curve(n)[1] for n in self.summary}, self.summary, self.fractions, self.log_y)
        log_figure(trainer, "stereotypical_loss", fig, png="stereotypical_loss.png")
