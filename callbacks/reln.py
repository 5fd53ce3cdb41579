"""Callbacks for finding a ReLU net's ReLN ([H] App. B, Figs. 8-9) and for the MDS of hidden
representations ([H] Figs. 3-4). Thin: the maths is in ``zoo.reln``.

``ActivationPatterns`` records the binary activation pattern of every hidden unit of a
``zoo.gdln.ReLUNet`` (or of the first ReLU net of a ``zoo.gdln.Comparison``) every n epochs, and at
the end k-means them for each k, logs the centroids as images, trains a GDLN with each k's gates
and picks k at the elbow of the ReLU-vs-GDLN output error (``reln_gates.png``).

``HiddenMDS`` embeds the hidden representations of the data points in two dimensions by
classical MDS every n steps (``hidden_mds.png``).
"""
from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor

from callbacks.base import PeriodicCallback, output_path, resuming, warn_once, log_scalars
from callbacks.figures import _plt, save_figure
from callbacks.base import log_matrix
from zoo import reln


def _network(pl_module: pl.LightningModule, name: str | None, kind: str) -> tuple[str, pl.LightningModule]:
    """The network to watch: the module itself, or a member of a Comparison (by name, else the
    first of class ``kind``)."""
    if hasattr(pl_module, "models") and hasattr(pl_module, "names"):
        pairs = list(zip(pl_module.names, pl_module.models))
        if name is not None:
            for n, m in pairs:
                if n == name:
                    return n, m
            raise ValueError(f"model = {name!r} is not in the Comparison; allowed: {pl_module.names}")
        for n, m in pairs:
            if type(m).__name__ == kind:
                return n, m
        return pairs[0]
    return type(pl_module).__name__, pl_module


def _epochs_done(pl_module: pl.LightningModule) -> int:
    return int(pl_module.global_step * pl_module.epochs_per_step)


class ActivationPatterns(pl.Callback):
    """ReLN discovery by k-means ([H] App. B, Alg. 1; Figs. 8-9).

    Every ``every_n_epochs`` epochs (and at epoch 0) the hidden units' binary patterns over the
    data points are stacked as rows (all members = independent runs, [H] Alg. 1's
    ``num_trainings``). At the end of training, for each k in ``ks``: k-means centroids (TensorBoard
    image ``reln/centroids/k<k>``); for the last hidden layer also the imitation error of a GDLN
    with the thresholded centroids as gates (``reln/imitation_error/k<k>``) and the elbow
    (``reln/elbow_k``). PNG ``reln_gates.png``: centroids for every k (the chosen one marked) and
    the elbow curve.

    Args:
        every_n_epochs: epochs between recordings ([H] Alg. 1: 100). Recordings happen at the end
            of a training step, so the spacing is at least the module's ``epochs_per_step``.
        ks: numbers of clusters to try ([H] Fig. 8: 2-4; Fig. 9: the elbow).
        layer: which hidden layer's patterns to cluster (-1: the last, which gates in [H] Fig. 6).
        elbow: train a GDLN per k and pick k at the elbow of the error (the last hidden layer; for a
            two-hidden-layer net the GDLN is a ``zoo.gdln_depth.DepthGDLN``, [H] Sec. 6).
        n_hidden: hidden units per pathway of those GDLNs.
        elbow_rule: 'kneedle' or 'within' (``zoo.reln.elbow``); rel_tol: the latter's tolerance.
        threshold: centroid level above which a data point is in the pathway.
        random_state: k-means seed; n_init: k-means restarts.
        model: name of the ReLU net in a Comparison (default: its first ReLUNet).
    """

    def __init__(self, every_n_epochs: int = 100, ks: list[int] = [1, 2, 3, 4, 5, 6], layer: int = -1,
                 elbow: bool = True, elbow_rule: Literal["kneedle", "within"] = "kneedle", rel_tol: float = 0.1,
                 n_hidden: int = 100, threshold: float = 0.5, random_state: int = 0, n_init: int = 10,
                 model: str | None = None) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"ActivationPatterns: every_n_epochs = {every_n_epochs}; allowed: a positive integer")
        if not ks or any(int(k) < 1 for k in ks) or len(set(ks)) != len(ks):
            raise ValueError(f"ActivationPatterns: ks = {ks}; allowed: distinct positive integers")
        if elbow_rule not in ("kneedle", "within") or not rel_tol >= 0:
            raise ValueError(f"ActivationPatterns: elbow_rule = {elbow_rule!r}, rel_tol = {rel_tol}; allowed: "
                             "'kneedle' or 'within', and rel_tol >= 0")
        self.elbow_rule, self.rel_tol = elbow_rule, rel_tol
        if n_hidden < 1:
            raise ValueError(f"ActivationPatterns: n_hidden = {n_hidden}; allowed: a positive integer")
        if not 0 < threshold < 1:
            raise ValueError(f"ActivationPatterns: threshold = {threshold}; allowed: a number in (0, 1)")
        self.every_n_epochs, self.ks, self.layer, self.do_elbow = every_n_epochs, sorted(int(k) for k in ks), layer, elbow
        self.n_hidden, self.threshold, self.random_state, self.n_init, self.model = n_hidden, threshold, random_state, n_init, model
        self._reset()

    def _reset(self) -> None:
        self.epochs: list[int] = []
        self.rows: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.result: dict = {}

    @property
    def state_key(self) -> str:
        # one callback per layer (recipes/haste_slowly/fig6_depth.yaml): each keeps its own record
        return self._generate_state_key(layer=self.layer, model=self.model, every_n_epochs=self.every_n_epochs)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a fresh record per fit; a checkpoint's is loaded after this
            self._reset()

    # the patterns recorded so far are part of what k-means clusters at the end: keep them
    def state_dict(self) -> dict:
        return {"epochs": self.epochs, "rows": self.rows, "outputs": self.outputs}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epochs, self.rows, self.outputs = (list(state_dict[k]) for k in ("epochs", "rows", "outputs"))

    def _record(self, net, X: Tensor, epoch: int) -> None:
        patterns = net.activation_patterns(X)
        self.rows.append(reln.pattern_rows(patterns[self.layer]).to(torch.uint8).cpu())
        self.outputs.append(net(X).detach().cpu())
        self.epochs.append(epoch)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.name, self.net = _network(pl_module, self.model, "ReLUNet")
        if not callable(getattr(self.net, "activation_patterns", None)):
            raise TypeError(f"ActivationPatterns needs a ReLUNet (activation_patterns()); {type(self.net).__name__} has none")
        n_layers = len(self.net.hidden)
        if not -n_layers <= self.layer < n_layers:
            raise ValueError(f"ActivationPatterns: layer = {self.layer}; allowed: -{n_layers} .. {n_layers - 1}")
        if self.every_n_epochs < pl_module.epochs_per_step or self.every_n_epochs % pl_module.epochs_per_step:
            warn_once(f"ActivationPatterns: every_n_epochs = {self.every_n_epochs} is not a multiple of epochs_per_step = "
                      f"{pl_module.epochs_per_step}; patterns are recorded at the first step end past each multiple")
        if resuming(trainer):  # the record up to the checkpoint came with it
            if not self.epochs:
                raise RuntimeError("ActivationPatterns: the checkpoint holds no recorded patterns for this callback "
                                   f"(layer = {self.layer}); resume with the callbacks the run started with")
            return
        self._record(self.net, trainer.datamodule.X.to(self.net.W[0].device), 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        done = _epochs_done(pl_module)
        if done // self.every_n_epochs > self.epochs[-1] // self.every_n_epochs:
            self._record(self.net, batch[0], done)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        dm, net = trainer.datamodule, self.net
        X, Y = dm.X.to(net.W[0].dtype), dm.Y.to(net.W[0].dtype)
        samples = torch.cat(self.rows).float()
        ks = [k for k in self.ks if k <= int((samples.sum(1) > 0).sum())]
        cents = [reln.cluster_patterns(samples, k, random_state=self.random_state, n_init=self.n_init) for k in ks]
        errors: list[float] = []
        chosen = None
        last = self.layer % len(net.hidden) == len(net.hidden) - 1
        if self.do_elbow and last:
            # two hidden layers: the first is shared and ungated in the ReLN ([H] Sec. 6, zoo.gdln_depth)
            n_shared = net.hidden[0] if len(net.hidden) == 2 else None
            relu_out = torch.stack(self.outputs).double()
            for C in cents:
                g = reln.gating_from_patterns(reln.threshold_centroids(C, self.threshold), X.shape[-1])
                m = reln.gdln_from_gating(g, X.cpu(), Y.cpu(), n_hidden=self.n_hidden, init=net.init_scheme,
                                          ensemble=net.ensemble, lr=net.lr, reduction=net.reduction, seed=net.seed,
                                          n_shared=n_shared)
                errors.append(reln.imitation_error(relu_out, reln.train_outputs(m, X.cpu(), Y.cpu(), self.epochs)))
            chosen = reln.elbow(ks, errors, self.elbow_rule, self.rel_tol)
        elif self.do_elbow:
            warn_once("ActivationPatterns: the elbow gates the last hidden layer (the first of a two-layer net is the "
                      "ReLN's shared linear layer, [H] Sec. 6); for this layer only the centroids are reported")
        self.result = {"ks": ks, "centroids": cents, "errors": errors, "elbow_k": chosen, "epochs": list(self.epochs)}
        # a deep net's layers get their own tags and PNGs (one callback per layer)
        self.prefix = "reln" if len(net.hidden) == 1 else f"reln/layer{self.layer % len(net.hidden)}"
        for k, C in zip(ks, cents):
            log_matrix(trainer, f"{self.prefix}/centroids/k{k}", C, symmetric=False)
        metrics = {f"reln/imitation_error/k{k}": e for k, e in zip(ks, errors)}
        if chosen is not None:
            metrics["reln/elbow_k"] = chosen
        if metrics:
            log_scalars(trainer, metrics)
        self._figure(trainer, dm)

    def _figure(self, trainer: pl.Trainer, dm) -> None:
        plt = _plt()
        ks, cents, errors, chosen = (self.result[x] for x in ("ks", "centroids", "errors", "elbow_k"))
        n = len(ks)
        heights = [max(k, 1) for k in ks]
        fig = plt.figure(figsize=(10, 1.2 + 0.35 * sum(heights) + 0.3 * n), dpi=100)
        grid = fig.add_gridspec(n, 2, width_ratios=[2.2, 1], height_ratios=heights)
        N = cents[0].shape[1] if cents else 0
        bounds = []
        if hasattr(dm, "n_items") and hasattr(dm, "n_contexts"):
            bounds = [c * dm.n_items - 0.5 for c in range(1, dm.n_contexts)]
        for r, (k, C) in enumerate(zip(ks, cents)):
            ax = fig.add_subplot(grid[r, 0])
            ax.imshow(C.numpy(), cmap="Greys", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
            for b in bounds:
                ax.axvline(b, color="tab:red", lw=1)
            ax.set_yticks(range(k))
            ax.set_ylabel(f"k={k}" + (" (elbow)" if k == chosen else ""), fontsize=8,
                          color="tab:red" if k == chosen else "black")
            ax.set_xticks([] if r < n - 1 else range(0, N, max(1, N // 12)))
            if r == 0:
                ax.set_title(f"{self.name} {self.prefix}: k-means centroids (black = active; columns = data points; "
                             f"{len(self.epochs)} records)", fontsize=9)
        ax = fig.add_subplot(grid[:, 1])
        if errors:
            ax.plot(ks, errors, "o-")
            if chosen is not None:
                ax.plot([chosen], [errors[ks.index(chosen)]], "o", color="tab:red", ms=10, mfc="none")
            ax.set_yscale("log")
            ax.set_xlabel("k (clusters = ReLN pathways)")
            ax.set_ylabel("|f_ReLU - f_GDLN|^2 (mean)")
            ax.set_title(f"elbow ({self.elbow_rule}): k = {chosen}", fontsize=9)
        else:
            ax.axis("off")
        save_figure(fig, output_path(trainer, self.prefix.replace("/", "_") + "_gates.png"))


class HiddenMDS(PeriodicCallback):
    """Classical MDS ([H] Figs. 3-4) of a network's hidden representations of the data points.

    Every ``every_n_steps`` steps: the Euclidean distances between the data points' hidden
    activity (layer ``layer``), averaged over members (each member's hidden basis is its own, the
    distances are not), embedded in ``dim`` dimensions by ``zoo.reln.classical_mds``. TensorBoard
    image ``mds/<model>``; scalar ``mds/<model>/explained`` (share of the Gram spectrum in the
    plotted dimensions). At the end, ``hidden_mds.png``: one panel per record, points coloured by
    context and labelled by item when the datamodule has ``context`` / ``n_items``.

    Args:
        every_n_steps: steps between embeddings.
        layer: hidden layer (-1: the last).
        dim: embedding dimension (2 for the images).
        model: name of the network in a Comparison (default: its first).
        max_panels: panels in the PNG (evenly spaced records).
    """

    def __init__(self, every_n_steps: int = 4, layer: int = -1, dim: int = 2, model: str | None = None,
                 max_panels: int = 6) -> None:
        super().__init__(every_n_steps)
        if dim < 1:
            raise ValueError(f"HiddenMDS: dim = {dim}; allowed: a positive integer")
        if max_panels < 1:
            raise ValueError(f"HiddenMDS: max_panels = {max_panels}; allowed: a positive integer")
        self.layer, self.dim, self.model, self.max_panels = layer, dim, model, max_panels
        self.records: list[tuple[int, Tensor]] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(layer=self.layer, model=self.model)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a fresh record per fit; a checkpoint's is loaded after this
            self.records = []

    def state_dict(self) -> dict:
        return {"records": self.records}

    def load_state_dict(self, state_dict: dict) -> None:
        self.records = list(state_dict["records"])

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.name, self.net = _network(pl_module, self.model, "ReLUNet")
        if not callable(getattr(self.net, "_forward", None)):
            raise TypeError(f"HiddenMDS needs a zoo.gdln network; {type(self.net).__name__} is not one")

    def hidden(self, X: Tensor) -> Tensor:
        """Hidden activity (E, N, H) of layer ``layer``."""
        _, acts, _ = self.net._forward(X.to(self.net.W[0].dtype), [w.detach() for w in self.net.W])
        hidden = acts[1:]
        if not -len(hidden) <= self.layer < len(hidden):
            raise ValueError(f"HiddenMDS: layer = {self.layer}; allowed: -{len(hidden)} .. {len(hidden) - 1}")
        return hidden[self.layer]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # the resumed run's TensorBoard starts at this epoch (zoo.gdln.save_log_step): log again
        # what was recorded here before the checkpoint
        if resuming(trainer) and trainer.is_global_zero and self.records \
                and self.records[-1][0] == _epochs_done(pl_module):
            self._publish(trainer, *self._embed(trainer))

    def _embed(self, trainer: pl.Trainer) -> tuple[Tensor, float]:
        """The MDS coordinates (N, dim) and the share of the Gram spectrum they hold."""
        X = trainer.datamodule.X.to(self.net.W[0].device)
        D = reln.pairwise_distances(self.hidden(X)).mean(0).cpu()
        coords, evals = reln.classical_mds(D, self.dim)
        pos = evals.clamp(min=0)
        return coords, float(pos[: self.dim].sum() / pos.sum()) if float(pos.sum()) > 0 else 0.0

    def _publish(self, trainer: pl.Trainer, coords: Tensor, explained: float) -> None:
        # on the epoch axis, with the GDLN modules' other scalars
        epoch = _epochs_done(trainer.lightning_module)
        self.log_scalars(trainer, {f"mds/{self.name}/explained": explained}, step=epoch)
        img = self._render([(epoch, coords)], trainer.datamodule)
        for lg in trainer.loggers:
            if isinstance(lg, TensorBoardLogger):
                lg.experiment.add_image(f"mds/{self.name}", img, epoch, dataformats="HWC")

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if not trainer.is_global_zero:
            return
        coords, explained = self._embed(trainer)
        self.records.append((_epochs_done(pl_module), coords))
        self._publish(trainer, coords, explained)

    def _render(self, records: list[tuple[int, Tensor]], dm, path=None) -> np.ndarray | None:
        plt = _plt()
        n = len(records)
        fig, axes = plt.subplots(1, n, figsize=(3.0 * n, 3.0), dpi=90, squeeze=False)
        context = getattr(dm, "context", None)
        n_items = getattr(dm, "n_items", None)
        for ax, (epoch, c) in zip(axes[0], records):
            c = c.numpy()
            y = c[:, 1] if c.shape[1] > 1 else np.zeros(len(c))
            colours = None if context is None else np.asarray(context)
            ax.scatter(c[:, 0], y, c=colours, cmap="tab10", vmin=0, vmax=9, s=25)
            if n_items is not None:
                for i, (a, b) in enumerate(zip(c[:, 0], y)):
                    ax.annotate(str(i % n_items), (a, b), fontsize=6, xytext=(2, 2), textcoords="offset points")
            ax.set_title(f"{self.name} epoch {epoch}", fontsize=8)
            ax.set_xticks([]), ax.set_yticks([])
            ax.set_aspect("equal", adjustable="datalim")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
            plt.close(fig)
            return None
        fig.canvas.draw()
        img = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
        plt.close(fig)
        return img

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or not self.records:
            return
        idx = np.unique(np.linspace(0, len(self.records) - 1, min(self.max_panels, len(self.records))).round().astype(int))
        self._render([self.records[i] for i in idx], trainer.datamodule, output_path(trainer, "hidden_mds.png"))
