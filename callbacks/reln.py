"""Callbacks for finding a ReLU net's ReLN ([H] App. B, Figs. 8-9) and for the MDS of hidden
representations ([H] Figs. 3-4). They record and log; the k-means, the GDLNs fitted per k and
the MDS are ``zoo.reln``'s, the figures ``zoo.plots.gdln``'s."""
from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor

from callbacks.base import PeriodicCallback, log_figure, log_matrix, log_scalars, resuming, warn_once
from zoo import reln
from zoo.plots import gdln as plots


def _network(pl_module: pl.LightningModule, name: str | None) -> tuple[str, pl.LightningModule]:
    """The network to watch: ``name`` among the module's ``networks()``, else its first ReLU net
    (a ``zoo.gdln.ReLUNet``), else its first."""
    nets = pl_module.networks() if callable(getattr(pl_module, "networks", None)) else {type(pl_module).__name__: pl_module}
    if name is not None and name not in nets:
        raise ValueError(f"model = {name!r} is not in the Comparison; allowed: {list(nets)}")
    name = name or next((n for n, m in nets.items() if hasattr(m, "activation_patterns")), next(iter(nets)))
    return name, nets[name]


class ActivationPatterns(pl.Callback):
    """ReLN discovery by k-means ([H] App. B, Alg. 1; Figs. 8-9).

    Every ``every_n_epochs`` epochs (and at epoch 0) the hidden units' binary patterns over the
    data points are stacked as rows (all members = independent runs, Alg. 1's ``num_trainings``).
    At the end ``zoo.reln.discover_gates`` k-means them for each k in ``ks`` (TensorBoard image
    ``reln/centroids/k<k>``) and, for the last hidden layer with ``elbow``, fits a GDLN per k
    (``reln/imitation_error/k<k>``, ``reln/elbow_k``). PNG ``reln_gates.png`` (``reln_layer<l>_gates.png``
    for a two-layer net): centroids for every k, the chosen one marked, and the elbow curve.

    Args:
        every_n_epochs: epochs between recordings ([H] Alg. 1: 100), at the first step end past each multiple.
        ks: numbers of clusters to try ([H] Fig. 8: 2-4; Fig. 9: the elbow).
        layer: which hidden layer's patterns to cluster (-1: the last, which gates in [H] Fig. 6).
        elbow: fit a GDLN per k and pick k at the elbow of the error (last hidden layer only).
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
        if n_hidden < 1:
            raise ValueError(f"ActivationPatterns: n_hidden = {n_hidden}; allowed: a positive integer")
        if not 0 < threshold < 1:
            raise ValueError(f"ActivationPatterns: threshold = {threshold}; allowed: a number in (0, 1)")
        self.every_n_epochs, self.ks, self.layer, self.do_elbow = every_n_epochs, sorted(int(k) for k in ks), layer, elbow
        self.kw = dict(n_hidden=n_hidden, threshold=threshold, rule=elbow_rule, rel_tol=rel_tol,
                       random_state=random_state, n_init=n_init)
        self.elbow_rule, self.model = elbow_rule, model
        self.epochs, self.rows, self.outputs, self.result = [], [], [], {}

    @property
    def state_key(self) -> str:
        # one callback per layer (recipes/haste_slowly/fig6_depth.yaml): each keeps its own record
        return self._generate_state_key(layer=self.layer, model=self.model, every_n_epochs=self.every_n_epochs)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a fresh record per fit; a checkpoint's is loaded after this
            self.epochs, self.rows, self.outputs, self.result = [], [], [], {}

    # the patterns recorded so far are part of what k-means clusters at the end: keep them
    def state_dict(self) -> dict:
        return {"epochs": self.epochs, "rows": self.rows, "outputs": self.outputs}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epochs, self.rows, self.outputs = (list(state_dict[k]) for k in ("epochs", "rows", "outputs"))

    def _record(self, X: Tensor, epoch: int) -> None:
        self.rows.append(reln.pattern_rows(self.net.activation_patterns(X)[self.layer]).to(torch.uint8).cpu())
        with torch.no_grad():
            self.outputs.append(self.net(X).cpu())
        self.epochs.append(epoch)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.name, self.net = _network(pl_module, self.model)
        if not callable(getattr(self.net, "activation_patterns", None)):
            raise TypeError(f"ActivationPatterns needs a ReLUNet (activation_patterns()); {type(self.net).__name__} has none")
        n_layers = len(self.net.hidden)
        if not -n_layers <= self.layer < n_layers:
            raise ValueError(f"ActivationPatterns: layer = {self.layer}; allowed: -{n_layers} .. {n_layers - 1}")
        if self.every_n_epochs % pl_module.epochs_per_step:
            warn_once(f"ActivationPatterns: every_n_epochs = {self.every_n_epochs} is not a multiple of epochs_per_step = "
                      f"{pl_module.epochs_per_step}; patterns are recorded at the first step end past each multiple")
        if not resuming(trainer):
            self._record(trainer.datamodule.X.to(self.net.W[0].device), 0)
        elif not self.epochs:  # the record up to the checkpoint came with it
            raise RuntimeError("ActivationPatterns: the checkpoint holds no recorded patterns for this callback "
                               f"(layer = {self.layer}); resume with the callbacks the run started with")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        done = pl_module.epochs_done
        if done // self.every_n_epochs > self.epochs[-1] // self.every_n_epochs:
            self._record(batch[0], done)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        dm, deep = trainer.datamodule, len(self.net.hidden) > 1
        last = self.layer % len(self.net.hidden) == len(self.net.hidden) - 1
        if self.do_elbow and not last:
            warn_once("ActivationPatterns: the elbow gates the last hidden layer (the first of a two-layer net is the "
                      "ReLN's shared linear layer, [H] Sec. 6); for this layer only the centroids are reported")
        self.result = r = reln.discover_gates(self.net, torch.cat(self.rows).float(), torch.stack(self.outputs), self.epochs,
                                              dm.X, dm.Y, self.ks, layer=self.layer, fit_gdlns=self.do_elbow, **self.kw)
        prefix = f"reln/layer{self.layer % len(self.net.hidden)}" if deep else "reln"
        for k, C in zip(r["ks"], r["centroids"]):
            log_matrix(trainer, f"{prefix}/centroids/k{k}", C, symmetric=False)
        metrics = {f"reln/imitation_error/k{k}": e for k, e in zip(r["ks"], r["errors"])}
        if r["elbow_k"] is not None:
            metrics["reln/elbow_k"] = r["elbow_k"]
        if metrics:
            log_scalars(trainer, metrics)
        bounds = [c * dm.n_items - 0.5 for c in range(1, dm.n_contexts)] if hasattr(dm, "n_contexts") else []
        title = (f"{self.name} {prefix}: k-means centroids (black = active; columns = data points; "
                 f"{len(self.epochs)} records)")
        log_figure(trainer, f"{prefix}/gates", plots.reln_gates(r, title, bounds, self.elbow_rule),
                   png=prefix.replace("/", "_") + "_gates.png")


class HiddenMDS(PeriodicCallback):
    """Classical MDS ([H] Figs. 3-4) of a network's hidden representations of the data points.

    Every ``every_n_steps`` epochs: the distances between the data points' hidden activity (layer
    ``layer``), averaged over members (each member's hidden basis is its own, the distances are
    not), embedded in ``dim`` dimensions by ``zoo.reln.classical_mds``. TensorBoard image
    ``mds/<model>``, scalar ``mds/<model>/explained`` (share of the Gram spectrum in the plotted
    dimensions). At the end ``hidden_mds.png``: one panel per record (up to ``max_panels``, evenly
    spaced), points coloured by context and labelled by item where the datamodule has them.

    Args:
        every_n_steps: epochs (GD updates) between embeddings.
        layer: hidden layer (-1: the last).
        dim: embedding dimension (2 for the images).
        model: name of the network in a Comparison (default: its first ReLU net).
        max_panels: panels in the PNG.
    """

    unit = "epochs"

    def __init__(self, every_n_steps: int = 400, layer: int = -1, dim: int = 2, model: str | None = None,
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
        self.name, self.net = _network(pl_module, self.model)
        self.need(self.net, "hidden_activity")
        n = len(self.net.hidden_activity(trainer.datamodule.X[:1]))
        if not -n <= self.layer < n:
            raise ValueError(f"HiddenMDS: layer = {self.layer}; allowed: -{n} .. {n - 1}")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # the resumed run's TensorBoard starts at this epoch (zoo.gdln.save_log_step): log again
        # what was recorded here before the checkpoint
        if resuming(trainer) and trainer.is_global_zero and self.records and self.records[-1][0] == self.now:
            self._publish(trainer, *self._embed(trainer))

    def _embed(self, trainer: pl.Trainer) -> tuple[Tensor, float]:
        """The MDS coordinates (N, dim) and the share of the Gram spectrum they hold."""
        H = self.net.hidden_activity(trainer.datamodule.X.to(self.net.W[0].device))[self.layer]
        coords, evals = reln.classical_mds(reln.pairwise_distances(H).mean(0).cpu(), self.dim)
        pos = evals.clamp(min=0)
        return coords, float(pos[: self.dim].sum() / pos.sum()) if float(pos.sum()) > 0 else 0.0

    def _publish(self, trainer: pl.Trainer, coords: Tensor, explained: float) -> None:
        self.log_scalars(trainer, {f"mds/{self.name}/explained": explained})
        dm = trainer.datamodule
        log_figure(trainer, f"mds/{self.name}", plots.mds([(self.now, coords)], self.name, getattr(dm, "context", None),
                                                          getattr(dm, "n_items", None)), step=self.now)

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if trainer.is_global_zero:
            coords, explained = self._embed(trainer)
            self.records.append((self.now, coords))
            self._publish(trainer, coords, explained)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or not self.records:
            return
        idx = np.unique(np.linspace(0, len(self.records) - 1, min(self.max_panels, len(self.records))).round().astype(int))
        dm = trainer.datamodule
        fig = plots.mds([self.records[i] for i in idx], self.name, getattr(dm, "context", None), getattr(dm, "n_items", None))
        log_figure(trainer, f"mds_panels/{self.name}", fig, png="hidden_mds.png")
