"""Callbacks of [S] Fig. 4 (Sec. 3.2, App. D): DCI, latent traversals, reconstructions, the sweep figure.

They handle one ``BetaVAE`` (tags without a member) or every member of a sweep (tags end in
``/<label>``, e.g. ``dci/disentanglement/g=0.3,seed=0``; ``members`` selects them by their
``member_params``: ``[{g: 0.3, seed: 0}]``), and need a datamodule with
``sample(n, generator) -> (x, factors)`` (``datamodules.shapes``).
"""
from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torchvision.utils import make_grid

from callbacks.base import (AtTrainEnd, PeriodicCallback, check, check_count, log_figure, log_matrix, log_scalars, warn_once,
                            write_table)
from zoo.analysis.sweeps import group_means
from zoo.metrics.dci import DCIMetric, DCISetting, setting_with, update_on_grid
from zoo.utils.extras import require
from zoo.plots.vae import SWEEP_METRICS, sweep_figure, traversal_figure
from zoo.models.vae import vae_members

Setting = Literal["fast", "full"]
DCI_KEYS = ("disentanglement", "completeness", "informativeness_test_acc", "informativeness_train_acc")


def _tag(name: str, label: str) -> str:
    return f"{name}/{label}" if label else name


def _sampler(trainer: pl.Trainer, owner: str):
    if not callable(getattr(trainer.datamodule, "sample", None)):
        raise TypeError(f"{owner} needs a datamodule with sample(n, generator) -> (x, factors) "
                        "(e.g. datamodules.shapes.Shapes3D)")
    return trainer.datamodule.sample


class DCI(PeriodicCallback, AtTrainEnd):
    """DCI of the posterior means ([S] App. D, docs/theory.md#dci) every ``every_n_steps`` and at the end.

    Logs ``dci/<DCI_KEYS>`` and the importance matrix ``R[code, factor]`` (figure ``dci/importance``);
    the ``final`` setting once at the end (``dci_final/...``; :meth:`final_scores` hands it to
    ``SweepFigure``). The scores are ``zoo.metrics.dci.DCIMetric``'s on grid points.

    Args:
        every_n_steps: period in optimizer steps.
        setting: ``"fast"`` or ``"full"`` (``zoo.metrics.dci.DCI_SETTINGS``) during training.
        final: the setting at the end of training (None: none).
        n_train, n_test, n_estimators: override those of both settings (e.g. for a CPU-sized run).
        random_state: seeds the drawn points and every classifier (reproducible DCI).
        n_jobs: factors fitted in parallel by scikit-learn/joblib.
        at_start: also evaluate at step 0 (the untrained encoder).
    """

    def __init__(self, every_n_steps: int = 1000, setting: Setting = "fast", final: Setting | None = "full",
                 n_train: int | None = None, n_test: int | None = None, n_estimators: int | None = None,
                 random_state: int = 0, n_jobs: int = 1, at_start: bool = False) -> None:
        super().__init__(every_n_steps)
        check("DCI", "n_jobs", n_jobs, n_jobs != 0, "a positive number of processes, or -1 for all cores")
        require("sklearn", "dci", "callbacks.vae.DCI (gradient-boosted classifiers)")  # before the data is made
        self.setting = setting_with(setting, n_train, n_test, n_estimators, who="DCI")
        self.final = None if final is None else setting_with(final, n_train, n_test, n_estimators, who="DCI final")
        self.random_state, self.n_jobs, self.at_start = int(random_state), int(n_jobs), at_start
        self._final_cache: tuple[int, dict[str, dict]] | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _sampler(trainer, "DCI")
        for _, m in vae_members(pl_module):
            self.need(m, "codes")

    def scores(self, trainer: pl.Trainer, pl_module: pl.LightningModule, setting: DCISetting) -> dict[str, dict]:
        """DCI of every VAE in the module, ``{label: DCIMetric result}`` (label "" for one model).
        Called on rank 0 only, so the metric keeps to its own points (no synchronisation)."""
        sample, out = _sampler(trainer, "DCI"), {}
        for label, vae in vae_members(pl_module):
            metric = DCIMetric(self.random_state, setting.n_estimators, self.n_jobs, sync_on_compute=False)
            with vae.evaluating() as device:
                update_on_grid(metric, lambda x: vae.codes(x.to(device)), sample, setting,
                               random_state=self.random_state)
            out[label] = metric.compute()
        return out

    def _log(self, trainer: pl.Trainer, prefix: str, results: dict[str, dict]) -> None:
        log_scalars(trainer, {_tag(f"{prefix}/{k}", label): r[k] for label, r in results.items() for k in DCI_KEYS})
        for label, r in results.items():
            log_matrix(trainer, _tag(f"{prefix}/importance", label), r["importance"], symmetric=False,
                       title=f"importance R[code, factor] {label}".strip())

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if (outputs is not None or self.at_start) and trainer.is_global_zero:
            self._log(trainer, "dci", self.scores(trainer, pl_module, self.setting))

    def final_scores(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, dict] | None:
        """The ``final`` setting's results at the current step (computed once, then cached)."""
        if self.final is None:
            return None
        if self._final_cache is None or self._final_cache[0] != trainer.global_step:
            self._final_cache = (trainer.global_step, self.scores(trainer, pl_module, self.final))
        return self._final_cache[1]

    def publish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.final is not None:
            self._log(trainer, "dci_final", self.final_scores(trainer, pl_module))


class _ImageCallback(PeriodicCallback):
    """Periodic image grids (``make_grid``) of the selected VAEs on fixed points drawn once from ``seed``: a
    subclass's ``grids`` yields ``(label, images)`` of each."""

    def __init__(self, every_n_steps: int, members: list[dict[str, float]] | None, seed: int) -> None:
        super().__init__(every_n_steps)
        self.members, self.seed = list(members or []), int(seed)
        self._x: torch.Tensor | None = None

    def _points(self, trainer: pl.Trainer, n: int) -> torch.Tensor:
        if self._x is None:
            self._x, _ = _sampler(trainer, type(self).__name__)(n, torch.Generator().manual_seed(self.seed))
        return self._x

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _sampler(trainer, type(self).__name__)
        vae_members(pl_module, self.members)  # unknown members fail before training

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        tb = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not tb:
            warn_once(f"{type(self).__name__} needs a TensorBoardLogger; none is attached, so images are skipped")
        if not (tb and trainer.is_global_zero):
            return
        for label, grid in self.grids(trainer, pl_module):
            for lg in tb:
                lg.experiment.add_image(_tag(self.tag, label), grid, trainer.global_step)


class LatentTraversals(_ImageCallback, AtTrainEnd):
    """[S] Fig. 4c (``BetaVAE.traversal`` of a fixed image): the image ``traversals[/<label>]``; at the
    end the labelled figure (``zoo.plots.vae``), also written as ``traversals_<label>.png``.

    Args:
        every_n_steps: period in optimizer steps.
        steps: images per row.
        span: the sweep ``[lo, hi]`` of the latent's value (-2..2 in [S] Fig. 4c).
        members: sweep members to draw, by their parameters (default all).
        seed: seed of the base image.
        png: log the figure and write the PNG at the end.
    """

    tag = "traversals"

    def __init__(self, every_n_steps: int = 1000, steps: int = 9, span: list[float] = [-2.0, 2.0],
                 members: list[dict[str, float]] | None = None, seed: int = 0, png: bool = True) -> None:
        super().__init__(every_n_steps, members, seed)
        steps = check_count("LatentTraversals", "steps", steps, minimum=2)
        check("LatentTraversals", "span", span, len(span) == 2 and span[0] < span[1], "[lo, hi] with lo < hi")
        self.values, self.png = torch.linspace(float(span[0]), float(span[1]), int(steps)), png

    def traversals(self, trainer: pl.Trainer, pl_module: pl.LightningModule):
        x = self._points(trainer, 1)
        for label, vae in vae_members(pl_module, self.members):
            with vae.evaluating() as device:
                yield (label, *vae.traversal(x.to(device), self.values))

    def grids(self, trainer: pl.Trainer, pl_module: pl.LightningModule):
        for label, images, _, _ in self.traversals(trainer, pl_module):
            yield label, make_grid(images.cpu(), nrow=len(self.values), padding=1, pad_value=1.0)

    def publish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for label, images, order, kl in self.traversals(trainer, pl_module) if self.png else ():
            title = f"latent traversals {label} (step {trainer.global_step})".replace("  ", " ")
            name = f"traversals_{label.replace(',', '_').replace('=', '')}.png" if label else "traversals.png"
            log_figure(trainer, _tag("traversals_figure", label),
                       traversal_figure(images, order.tolist(), kl.tolist(), self.values.tolist(), title), png=name)


class Reconstructions(_ImageCallback):
    """Fixed inputs (top row) above their reconstructions from the posterior mean (bottom row): the
    image ``reconstructions`` (``reconstructions/<label>``).

    Args:
        every_n_steps: period in optimizer steps.
        n_images: inputs shown.
        members: sweep members to draw, by their parameters (default all).
        seed: seed of the inputs.
    """

    tag = "reconstructions"

    def __init__(self, every_n_steps: int = 1000, n_images: int = 8, members: list[dict[str, float]] | None = None,
                 seed: int = 0) -> None:
        super().__init__(every_n_steps, members, seed)
        self.n_images = check_count("Reconstructions", "n_images", n_images)

    def grids(self, trainer: pl.Trainer, pl_module: pl.LightningModule):
        x = self._points(trainer, self.n_images)
        for label, vae in vae_members(pl_module, self.members):
            with vae.evaluating() as device:
                x_hat = vae.evaluate(x.to(device))["x_hat"].cpu()
            yield label, make_grid(torch.cat([x, x_hat]), nrow=self.n_images, padding=1, pad_value=1.0)


class SweepFigure(AtTrainEnd):
    """[S] Fig. 4a-b at the end of training: DCI (the final setting of the run's :class:`DCI`) and
    the reconstruction loss (``BetaVAE.evaluate`` on ``n_points`` grid points drawn with ``seed``)
    of every member of a ``BetaVAESweep`` against the swept parameter: the figure ``<name>``
    (``zoo.plots.vae.sweep_figure``, also ``<name>.png``), ``<name>.csv`` (a row per member) and
    the means over seeds as scalars ``<name>/<metric>/<param>=<value>``.

    Args:
        param: the swept scheme parameter on the x axis (``g`` for ``Gain``).
        n_points: points for the reconstruction loss.
        seed: seed of those points.
        name: file name stem and tag.
    """

    def __init__(self, param: str = "g", n_points: int = 1000, seed: int = 1, name: str = "fig4_gain_dci") -> None:
        self.n_points = check_count("SweepFigure", "n_points", n_points)
        self.param, self.seed, self.name = param, int(seed), name
        self.results: list[dict] = []

    def _dci_callback(self, trainer: pl.Trainer) -> DCI:
        found = [c for c in trainer.callbacks if isinstance(c, DCI)]
        if not found or found[0].final is None:
            raise TypeError("SweepFigure needs a callbacks.vae.DCI callback with a final setting in the same run")
        return found[0]

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dci_callback(trainer)
        _sampler(trainer, "SweepFigure")
        params = getattr(pl_module, "member_params", None)
        if params is None or any(self.param not in p for p in params):
            raise TypeError(f"SweepFigure needs a zoo.models.vae.BetaVAESweep whose members differ in {self.param!r}; "
                            f"got {type(pl_module).__name__}")

    def publish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        scores = self._dci_callback(trainer).final_scores(trainer, pl_module)
        x, _ = _sampler(trainer, "SweepFigure")(self.n_points, torch.Generator().manual_seed(self.seed))
        self.results = []
        for (label, vae), params in zip(vae_members(pl_module), pl_module.member_params):
            with vae.evaluating() as device:
                recon = torch.cat([vae.evaluate(xb.to(device))["reconstruction"].cpu() for xb in x.split(500)])
            self.results.append({"label": label, **params, **{k: scores[label][k] for k in DCI_KEYS},
                                 "reconstruction": float(recon.double().mean())})
        write_table(trainer, f"{self.name}.csv", self.results)
        title = f"[S] Fig. 4: DCI and reconstruction vs {self.param} (step {trainer.global_step})"
        log_figure(trainer, self.name, sweep_figure(self.results, self.param, title), png=f"{self.name}.png")
        summary = group_means(self.results, self.param, [k for k, _ in SWEEP_METRICS])
        log_scalars(trainer, {f"{self.name}/{k}/{self.param}={v:g}": s for v, row in summary.items()
                              for k, s in row.items()})


__all__ = ["DCI", "LatentTraversals", "Reconstructions", "SweepFigure"]
