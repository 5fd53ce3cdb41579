"""Callbacks of the disentanglement experiment ([S] Sec. 3.2, Fig. 4, App. D).

* :class:`DCI`: disentanglement, completeness and informativeness (``zoo.metrics.dci``) of the
  posterior means on points drawn uniformly from the datamodule's factor grid; the ``fast``
  setting every ``every_n_steps``, the ``full`` one ([S] App. D: 10,000 / 5,000 points) at the end;
  the importance matrix as an image.
* :class:`LatentTraversals`: per latent, decoded images as it sweeps -2..2 around a base code
  ([S] Fig. 4c).
* :class:`Reconstructions`: inputs above their reconstructions.
* :class:`SweepFigure`: [S] Fig. 4a-b, DCI and reconstruction against the gain of a
  ``zoo.vae.BetaVAESweep``, box plots over seeds, as a PNG.

Every callback handles one ``zoo.vae.BetaVAE`` (tags without a member) or every member of a
``BetaVAESweep`` (tags end in ``/<label>``, e.g. ``dci/disentanglement/g=0.3,seed=0``). They need a
datamodule with ``sample(n, generator) -> (x, factors)`` (``datamodules.shapes``).
"""
from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from typing import Literal

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor

from callbacks.base import PeriodicCallback, output_path, warn_once, log_scalars
from callbacks.figures import save_figure
from callbacks.base import log_matrix
from zoo.metrics.dci import DCI_SETTINGS, DCISetting, dci_on_grid
from zoo.vae import BetaVAE, bernoulli_reconstruction, vae_members

Setting = Literal["fast", "full"]
DCI_KEYS = ("disentanglement", "completeness", "informativeness_test_acc", "informativeness_train_acc")


def _tag(name: str, label: str) -> str:
    return f"{name}/{label}" if label else name


def _selected(pl_module: pl.LightningModule, members: Sequence[str] | None) -> list[tuple[str, BetaVAE]]:
    allv = vae_members(pl_module)
    if not members:
        return allv
    known = {lbl: m for lbl, m in allv}
    missing = [m for m in members if m not in known]
    if missing:
        raise ValueError(f"members {missing} are not in the module; its members: {', '.join(known) or '(one model)'}")
    return [(m, known[m]) for m in members]


def _device(vae: BetaVAE) -> torch.device:
    # a sweep member is moved by its parent's .to(): read the device off its weights
    return next(vae.parameters()).device


def _sampler(trainer: pl.Trainer, owner: str):
    dm = trainer.datamodule
    if dm is None or not callable(getattr(dm, "sample", None)):
        raise TypeError(f"{owner} needs a datamodule with sample(n, generator) -> (x, factors) "
                        "(e.g. datamodules.shapes.Shapes3D)")
    return dm.sample


def _tensorboards(trainer: pl.Trainer) -> list[TensorBoardLogger]:
    tb = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
    if not tb:
        warn_once("image callbacks need a TensorBoardLogger; none is attached, so images are skipped")
    return tb


def image_grid(images: Tensor, rows: int, pad: int = 1) -> Tensor:
    """Tile images (rows * cols, C, H, W) in [0, 1] into one (3, H', W') image with white gaps."""
    n, C, H, W = images.shape
    cols = math.ceil(n / rows)
    imgs = images.detach().float().cpu().clamp(0, 1)
    if C == 1:
        imgs = imgs.expand(n, 3, H, W)
    grid = torch.ones(3, rows * (H + pad) + pad, cols * (W + pad) + pad)
    for k in range(n):
        r, c = divmod(k, cols)
        grid[:, pad + r * (H + pad): pad + r * (H + pad) + H, pad + c * (W + pad): pad + c * (W + pad) + W] = imgs[k]
    return grid


class DCI(PeriodicCallback):
    """DCI of the posterior means ([S] App. D, THEORY.md sec. 4) every ``every_n_steps`` and at the end.

    Logs ``dci/disentanglement``, ``dci/completeness``, ``dci/informativeness_test_acc`` and
    ``dci/informativeness_train_acc`` (per member of a sweep: ``.../<label>``) and the importance
    matrix ``R[code, factor]`` as the image ``dci/importance``. At the end of training the ``final``
    setting is evaluated once (tags ``dci_final/...``); :meth:`final_scores` returns it to other
    callbacks (``SweepFigure``) without computing it twice.

    Args:
        every_n_steps: period in optimizer steps.
        setting: ``"fast"`` (2,000 / 1,000 points, 50 boosting rounds) or ``"full"`` (10,000 /
            5,000, 100 rounds: disentanglement_lib's) during training.
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
        for name, value in (("setting", setting), ("final", final)):
            if value is not None and value not in DCI_SETTINGS:
                raise ValueError(f"DCI: {name} = {value!r}; allowed: {', '.join(sorted(DCI_SETTINGS))}"
                                 + (" or null" if name == "final" else ""))
        for name, value in (("n_train", n_train), ("n_test", n_test), ("n_estimators", n_estimators)):
            least = 2 if name == "n_train" else 1
            if value is not None and (isinstance(value, bool) or int(value) != value or value < least):
                raise ValueError(f"DCI: {name} = {value!r}; allowed: a positive integer (n_train >= 2) or null")
        if n_jobs == 0:
            raise ValueError("DCI: n_jobs = 0; allowed: a positive number of processes, or -1 for all cores")
        self.setting, self.final = self._override(setting, n_train, n_test, n_estimators), None
        if final is not None:
            self.final = self._override(final, n_train, n_test, n_estimators)
        self.random_state, self.n_jobs, self.at_start = int(random_state), int(n_jobs), at_start
        self._final_cache: tuple[int, dict[str, dict]] | None = None

    @staticmethod
    def _override(name: str, n_train: int | None, n_test: int | None, n_estimators: int | None) -> DCISetting:
        s = DCI_SETTINGS[name]
        return DCISetting(n_train=int(n_train or s.n_train), n_test=int(n_test or s.n_test),
                          n_estimators=int(n_estimators or s.n_estimators))

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _sampler(trainer, "DCI")
        for _, m in vae_members(pl_module):
            self.need(m, "codes")

    def scores(self, trainer: pl.Trainer, pl_module: pl.LightningModule, setting: DCISetting) -> dict[str, dict]:
        """DCI of every VAE in the module, ``{label: dci result}`` (label "" for a single model)."""
        sample = _sampler(trainer, "DCI")
        out = {}
        for label, vae in vae_members(pl_module):
            was_training = vae.training
            vae.eval()
            out[label] = dci_on_grid(lambda x: vae.codes(x.to(_device(vae))), sample, setting,
                                     random_state=self.random_state, n_jobs=self.n_jobs)
            vae.train(was_training)
        return out

    def _log(self, trainer: pl.Trainer, prefix: str, results: dict[str, dict]) -> None:
        metrics = {}
        for label, r in results.items():
            metrics.update({_tag(f"{prefix}/{k}", label): r[k] for k in DCI_KEYS})
        self.log_scalars(trainer, metrics)
        for label, r in results.items():
            log_matrix(trainer, _tag(f"{prefix}/importance", label), r["importance"], symmetric=False,
                       title=f"importance R[code, factor] {label}".strip())

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if outputs is None and not self.at_start:
            return
        if trainer.is_global_zero:
            self._log(trainer, "dci", self.scores(trainer, pl_module, self.setting))

    def final_scores(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, dict] | None:
        """The ``final`` setting's results at the current step (computed once, then cached)."""
        if self.final is None:
            return None
        if self._final_cache is None or self._final_cache[0] != trainer.global_step:
            self._final_cache = (trainer.global_step, self.scores(trainer, pl_module, self.final))
        return self._final_cache[1]

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and self.final is not None:
            self._log(trainer, "dci_final", self.final_scores(trainer, pl_module))


class _ImageCallback(PeriodicCallback):
    """Periodic images of selected VAEs on fixed data points (drawn once from ``seed``)."""

    def __init__(self, every_n_steps: int, members: list[str] | None, seed: int) -> None:
        super().__init__(every_n_steps)
        self.members, self.seed = list(members or []), int(seed)
        self._x: Tensor | None = None

    def _points(self, trainer: pl.Trainer, n: int) -> Tensor:
        if self._x is None:
            self._x, _ = _sampler(trainer, type(self).__name__)(n, torch.Generator().manual_seed(self.seed))
        return self._x

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _sampler(trainer, type(self).__name__)
        _selected(pl_module, self.members)  # unknown member labels fail before training


class LatentTraversals(_ImageCallback):
    """One row per latent: the decoded image as that latent sweeps ``span`` around a base code
    while the others stay put ([S] Fig. 4c). The base code is the posterior mean of a fixed image.
    Rows are in the order of the latents' KL (largest first), so informative latents come first.

    Logs the image ``traversals`` (``traversals/<label>`` per member); at the end writes
    ``traversals_<label>.png`` with each row's latent index and KL.

    Args:
        every_n_steps: period in optimizer steps.
        steps: images per row.
        span: the sweep ``[lo, hi]`` of the latent's value (-2..2 in [S] Fig. 4c).
        members: labels of the sweep members to draw (default all), e.g. ``["g=0.3,seed=0"]``.
        seed: seed of the base image.
        png: write the PNG at the end.
    """

    def __init__(self, every_n_steps: int = 1000, steps: int = 9, span: list[float] = [-2.0, 2.0],
                 members: list[str] | None = None, seed: int = 0, png: bool = True) -> None:
        super().__init__(every_n_steps, members, seed)
        if steps < 2:
            raise ValueError(f"LatentTraversals: steps = {steps}; allowed: an integer >= 2")
        if len(span) != 2 or not span[0] < span[1]:
            raise ValueError(f"LatentTraversals: span = {span}; allowed: [lo, hi] with lo < hi")
        self.steps, self.span, self.png = int(steps), [float(s) for s in span], png

    @torch.no_grad()
    def traversal(self, vae: BetaVAE, x: Tensor) -> tuple[Tensor, Tensor]:
        """Images (L * steps, C, H, W) of the traversal from image x (1, C, H, W), rows ordered by
        KL, and the latents' order (L,) with their KL on x's posterior ((L,) each)."""
        mu, logvar = vae.encode(x.to(_device(vae)))
        kl = (0.5 * (mu.pow(2) + logvar.exp() - 1 - logvar))[0]
        order = torch.argsort(kl, descending=True)
        values = torch.linspace(*self.span, self.steps, device=mu.device)
        z = mu.repeat(len(order) * self.steps, 1)
        for r, i in enumerate(order.tolist()):
            z[r * self.steps:(r + 1) * self.steps, i] = values
        return torch.sigmoid(vae.decode(z)), order, kl[order]

    def _draw(self, trainer: pl.Trainer, pl_module: pl.LightningModule):
        x = self._points(trainer, 1)
        for label, vae in _selected(pl_module, self.members):
            was = vae.training
            vae.eval()
            images, order, kl = self.traversal(vae, x)
            vae.train(was)
            yield label, images, order, kl

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        tb = _tensorboards(trainer)
        if not (tb and trainer.is_global_zero):
            return
        for label, images, order, _ in self._draw(trainer, pl_module):
            grid = image_grid(images, rows=len(order))
            for lg in tb:
                lg.experiment.add_image(_tag("traversals", label), grid, trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not (self.png and trainer.is_global_zero):
            return
        from callbacks.figures import _plt

        plt = _plt()
        for label, images, order, kl in self._draw(trainer, pl_module):
            L = len(order)
            grid = image_grid(images, rows=L).permute(1, 2, 0).numpy()
            fig, ax = plt.subplots(figsize=(0.7 * self.steps + 1.2, 0.7 * L + 0.6), dpi=100)
            ax.imshow(grid, interpolation="nearest")
            H = images.shape[-2] + 1
            ax.set_yticks([1 + H * (r + 0.5) for r in range(L)],
                          [f"z{i} KL {k:.2f}" for i, k in zip(order.tolist(), kl.tolist())], fontsize=7)
            ax.set_xticks([1 + (images.shape[-1] + 1) * (c + 0.5) for c in range(self.steps)],
                          [f"{v:.1f}" for v in np.linspace(*self.span, self.steps)], fontsize=7)
            ax.set_title(f"latent traversals {label} (step {trainer.global_step})".replace("  ", " "), fontsize=9)
            fig.tight_layout()
            name = f"traversals_{label.replace(',', '_').replace('=', '')}.png" if label else "traversals.png"
            fig.savefig(output_path(trainer, name))
            plt.close(fig)


class Reconstructions(_ImageCallback):
    """Fixed inputs (top row) above their reconstructions from the posterior mean (bottom row).

    Logs the image ``reconstructions`` (``reconstructions/<label>`` per member).

    Args:
        every_n_steps: period in optimizer steps.
        n_images: inputs shown.
        members: labels of the sweep members to draw (default all).
        seed: seed of the inputs.
    """

    def __init__(self, every_n_steps: int = 1000, n_images: int = 8, members: list[str] | None = None,
                 seed: int = 0) -> None:
        super().__init__(every_n_steps, members, seed)
        if n_images < 1:
            raise ValueError(f"Reconstructions: n_images = {n_images}; allowed: a positive integer")
        self.n_images = int(n_images)

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        tb = _tensorboards(trainer)
        if not (tb and trainer.is_global_zero):
            return
        x = self._points(trainer, self.n_images)
        for label, vae in _selected(pl_module, self.members):
            with torch.no_grad():
                was = vae.training
                vae.eval()
                recon = torch.sigmoid(vae(x.to(_device(vae)))).cpu()
                vae.train(was)
            grid = image_grid(torch.cat([x.cpu(), recon]), rows=2)
            for lg in tb:
                lg.experiment.add_image(_tag("reconstructions", label), grid, trainer.global_step)


class SweepFigure(pl.Callback):
    """[S] Fig. 4a-b for a ``zoo.vae.BetaVAESweep``: DCI and reconstruction against the swept init
    parameter (the gain ``g``), box plots over seeds with every model as a dot; ``fig4_gain_dci.png``
    and a table ``fig4_gain_dci.csv`` (one row per model) at the end of training.

    DCI is the ``final`` setting of the run's :class:`DCI` callback (required; computed once).
    Reconstruction is the mean Bernoulli loss (summed over pixels) of the posterior mean's decoding
    on ``n_points`` grid points drawn with ``seed``: the paper's reconstruction loss without the
    sampling noise.

    Args:
        param: the swept scheme parameter on the x axis (``g`` for ``Gain``).
        n_points: points for the reconstruction loss.
        seed: seed of those points.
        name: file name stem.
    """

    def __init__(self, param: str = "g", n_points: int = 1000, seed: int = 1, name: str = "fig4_gain_dci") -> None:
        if n_points < 1:
            raise ValueError(f"SweepFigure: n_points = {n_points}; allowed: a positive integer")
        self.param, self.n_points, self.seed, self.name = param, int(n_points), int(seed), name
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
            raise TypeError(f"SweepFigure needs a zoo.vae.BetaVAESweep whose members differ in {self.param!r}; "
                            f"got {type(pl_module).__name__}")

    @torch.no_grad()
    def reconstruction(self, vae: BetaVAE, x: Tensor) -> float:
        """Mean Bernoulli loss (summed over pixels) of decoding the posterior means of x."""
        was = vae.training
        vae.eval()
        total = 0.0
        for i in range(0, len(x), 500):
            xb = x[i:i + 500].to(_device(vae))
            total += float(bernoulli_reconstruction(vae(xb), xb).sum())
        vae.train(was)
        return total / len(x)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        scores = self._dci_callback(trainer).final_scores(trainer, pl_module)
        x, _ = _sampler(trainer, "SweepFigure")(self.n_points, torch.Generator().manual_seed(self.seed))
        self.results = []
        for (label, vae), params in zip(vae_members(pl_module), pl_module.member_params):
            row = {"label": label, **params, **{k: scores[label][k] for k in DCI_KEYS},
                   "reconstruction": self.reconstruction(vae, x)}
            self.results.append(row)
        with open(output_path(trainer, f"{self.name}.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.results[0]))
            w.writeheader()
            w.writerows(self.results)
        path = sweep_figure(output_path(trainer, f"{self.name}.png"), self.results, self.param,
                            title=f"[S] Fig. 4: DCI and reconstruction vs {self.param} (step {trainer.global_step})")
        summary = summarise(self.results, self.param)
        self.log_summary(trainer, summary)
        tb = _tensorboards(trainer)
        if tb:
            from PIL import Image

            img = np.asarray(Image.open(path).convert("RGB"))
            for lg in tb:
                lg.experiment.add_image(self.name, img, trainer.global_step, dataformats="HWC")

    def log_summary(self, trainer: pl.Trainer, summary: dict[float, dict[str, float]]) -> None:
        metrics = {f"{self.name}/{k}/{self.param}={v:g}": s for v, row in summary.items() for k, s in row.items()}
        log_scalars(trainer, metrics)


METRICS = (("disentanglement", "DCI disentanglement"), ("completeness", "DCI completeness"),
           ("informativeness_test_acc", "DCI informativeness (test acc.)"),
           ("reconstruction", "reconstruction loss (BCE, summed)"))


def summarise(rows: list[dict], param: str) -> dict[float, dict[str, float]]:
    """Mean of every metric over the models sharing a value of ``param``."""
    values = sorted({float(r[param]) for r in rows})
    return {v: {k: float(np.mean([r[k] for r in rows if float(r[param]) == v])) for k, _ in METRICS}
            for v in values}


def sweep_figure(path, rows: list[dict], param: str, title: str = ""):
    """Four panels (D, C, I, reconstruction) against ``param``: a box per value over seeds, dots on top."""
    from callbacks.figures import _plt

    plt = _plt()
    values = sorted({float(r[param]) for r in rows})
    fig, axes = plt.subplots(1, len(METRICS), figsize=(3.6 * len(METRICS), 3.4), dpi=100)
    for ax, (key, name) in zip(axes, METRICS):
        data = [[r[key] for r in rows if float(r[param]) == v] for v in values]
        pos = np.arange(len(values))
        if max(len(d) for d in data) >= 3:
            ax.violinplot(data, positions=pos, showextrema=False)
        ax.boxplot(data, positions=pos, widths=0.35)
        for p, d in zip(pos, data):
            ax.plot(np.full(len(d), p), d, "o", ms=3, color="k", alpha=0.6)
        ax.set_xticks(pos, [f"{v:g}" for v in values])
        ax.set_xlabel(param)
        ax.set_title(name, fontsize=9)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)
    return path


__all__ = ["DCI", "LatentTraversals", "Reconstructions", "SweepFigure", "image_grid", "summarise", "sweep_figure"]
