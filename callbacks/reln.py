"""Callbacks for finding a ReLU net's ReLN ([H] App. B, Figs. 8-9) and for the MDS of hidden
representations ([H] Figs. 3-4). They record and log; the k-means, the GDLNs fitted per k and
the MDS are ``zoo.reln``'s, the figures ``zoo.plots.gdln``'s."""
from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from torch import Tensor

from callbacks.base import HistoryCallback, check_count, log_figure, log_matrix, log_scalars, resuming, warn_once
from zoo import reln
from zoo.plots import gdln as plots


def _network(pl_module: pl.LightningModule, name: str | None) -> tuple[str, pl.LightningModule]:
    """``name`` among the module's ``networks()``, else its first ReLU net, else its first network."""
    nets = pl_module.networks() if callable(getattr(pl_module, "networks", None)) else {type(pl_module).__name__: pl_module}
    if name is not None and name not in nets:
        raise ValueError(f"model = {name!r} is not in the Comparison; allowed: {list(nets)}")
    name = name or next((n for n, m in nets.items() if hasattr(m, "activation_patterns")), next(iter(nets)))
    return name, nets[name]


def _data_layout(dm) -> dict:
    """What the figures mark: each point's context and item, where the datamodule has them."""
    return {"context": getattr(dm, "context", None), "n_items": getattr(dm, "n_items", None)}


class ActivationPatterns(HistoryCallback):
    """ReLN discovery by k-means ([H] App. B, Alg. 1; Figs. 8-9) in hidden ``layer`` (-1: the last)
    of a ReLU net (``model`` in a Comparison, default its first). At epoch 0 and every
    ``every_n_epochs`` (Alg. 1: 100; at the first step end past each multiple) every unit's binary
    pattern over the data is kept as a row (all members: Alg. 1's runs). At the end
    ``zoo.reln.discover_gates`` (its settings: ``ks``, ``n_hidden``, ...) k-means them per k
    (images ``reln/centroids/k<k>``) and with ``elbow``, for the last layer, fits a GDLN per k
    (``reln/imitation_error/k<k>``, ``reln/elbow_k``); PNG ``reln_gates.png`` (``reln_layer<l>_...``)."""

    unit = "epochs"
    HISTORY_KEYS = ("epochs", "rows", "outputs")

    def __init__(self, every_n_epochs: int = 100, ks: list[int] = [1, 2, 3, 4, 5, 6], layer: int = -1,
                 elbow: bool = True, elbow_rule: Literal["kneedle", "within"] = "kneedle", rel_tol: float = 0.1,
                 n_hidden: int = 100, threshold: float = 0.5, random_state: int = 0, n_init: int = 10,
                 model: str | None = None) -> None:
        super().__init__(every_n_epochs)
        self.kw = dict(n_hidden=n_hidden, threshold=threshold, rule=elbow_rule, rel_tol=rel_tol, n_init=n_init)
        reln.check_discovery(ks, caller="ActivationPatterns", **self.kw)
        self.ks, self.layer, self.do_elbow, self.model = sorted(int(k) for k in ks), layer, elbow, model
        self.kw["random_state"], self.result = random_state, {}

    @property
    def state_key(self) -> str:
        # one callback per layer (recipes/haste_slowly/fig6_depth.yaml): each keeps its own record
        return self._generate_state_key(layer=self.layer, model=self.model, every_n_epochs=self.every_n_steps)

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.name, self.net = _network(pl_module, self.model)
        if not callable(getattr(self.net, "activation_patterns", None)):
            raise TypeError(f"ActivationPatterns needs a ReLUNet (activation_patterns()); {type(self.net).__name__} has none")
        n = len(self.net.hidden)
        if not -n <= self.layer < n:
            raise ValueError(f"ActivationPatterns: layer = {self.layer}; allowed: -{n} .. {n - 1}")

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        X = trainer.datamodule.X.to(self.net.W[0].device)
        self.history["rows"].append(reln.pattern_rows(self.net.activation_patterns(X)[self.layer]).to(torch.uint8).cpu())
        with torch.no_grad():
            self.history["outputs"].append(self.net(X).cpu())
        self.history["epochs"].append(self.now)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        dm, n_layers = trainer.datamodule, len(self.net.hidden)
        if self.do_elbow and self.layer % n_layers != n_layers - 1:
            warn_once("ActivationPatterns: the elbow gates the last hidden layer (the first of a two-layer net is the "
                      "ReLN's shared linear layer, [H] Sec. 6); for this layer only the centroids are reported")
        h = self.history
        self.result = r = reln.discover_gates(self.net, torch.cat(h["rows"]).float(), torch.stack(h["outputs"]), h["epochs"],
                                              dm.X, dm.Y, self.ks, layer=self.layer, fit_gdlns=self.do_elbow, **self.kw)
        prefix = f"reln/layer{self.layer % n_layers}" if n_layers > 1 else "reln"
        for k, C in zip(r["ks"], r["centroids"]):
            log_matrix(trainer, f"{prefix}/centroids/k{k}", C, symmetric=False)
        metrics = {f"reln/imitation_error/k{k}": e for k, e in zip(r["ks"], r["errors"])}
        metrics.update({} if r["elbow_k"] is None else {"reln/elbow_k": r["elbow_k"]})
        if metrics:
            log_scalars(trainer, metrics)
        bounds = [c * dm.n_items - 0.5 for c in range(1, dm.n_contexts)] if hasattr(dm, "n_contexts") else []
        title = f"{self.name} {prefix}: k-means centroids (black = active; columns = data points; {len(h['epochs'])} records)"
        log_figure(trainer, f"{prefix}/gates", plots.reln_gates(r, title, bounds, self.kw["rule"]),
                   png=prefix.replace("/", "_") + "_gates.png")


class HiddenMDS(HistoryCallback):
    """Classical MDS ([H] Figs. 3-4, ``zoo.reln.classical_mds``) in ``dim`` dimensions of the data
    points' hidden activity (``layer`` of ``model``, as ActivationPatterns), distances averaged over
    members (each member's hidden basis is its own), every ``every_n_steps`` epochs: image
    ``mds/<model>``, scalar ``mds/<model>/explained`` (share of the Gram spectrum shown); at the
    end ``hidden_mds.png`` (up to ``max_panels`` records, coloured by context, labelled by item)."""

    unit = "epochs"
    HISTORY_KEYS = ("records",)

    def __init__(self, every_n_steps: int = 400, layer: int = -1, dim: int = 2, model: str | None = None,
                 max_panels: int = 6) -> None:
        super().__init__(every_n_steps)
        self.dim, self.max_panels = check_count("HiddenMDS", "dim", dim), check_count("HiddenMDS", "max_panels", max_panels)
        self.layer, self.model = layer, model

    @property
    def state_key(self) -> str:
        return self._generate_state_key(layer=self.layer, model=self.model)

    @property
    def records(self) -> list[tuple[int, Tensor]]:
        """(epoch, MDS coordinates (N, dim)) of every embedding so far."""
        return self.history["records"]

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.name, self.net = _network(pl_module, self.model)
        self.need(self.net, "hidden_activity")
        n = len(self.net.hidden_activity(trainer.datamodule.X[:1]))
        if not -n <= self.layer < n:
            raise ValueError(f"HiddenMDS: layer = {self.layer}; allowed: -{n} .. {n - 1}")
        # the resumed run's TensorBoard starts at this epoch (zoo.gdln.save_log_step): log again
        # what was recorded here before the checkpoint
        if resuming(trainer) and trainer.is_global_zero and self.records and self.records[-1][0] == self.now:
            self._publish(trainer, *self._embed(trainer))

    def _embed(self, trainer: pl.Trainer) -> tuple[Tensor, float]:
        """The MDS coordinates (N, dim) and the share of the Gram spectrum they hold (``zoo.reln.hidden_mds``)."""
        H = self.net.hidden_activity(trainer.datamodule.X.to(self.net.W[0].device))[self.layer]
        return reln.hidden_mds(H, self.dim)

    def _publish(self, trainer: pl.Trainer, coords: Tensor, explained: float) -> None:
        self.log_scalars(trainer, {f"mds/{self.name}/explained": explained})
        fig = plots.mds([(self.now, coords)], self.name, **_data_layout(trainer.datamodule))
        log_figure(trainer, f"mds/{self.name}", fig, step=self.now)

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        if trainer.is_global_zero:
            coords, explained = self._embed(trainer)
            self.records.append((self.now, coords))
            self._publish(trainer, coords, explained)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and self.records:
            fig = plots.mds(self.records, self.name, max_panels=self.max_panels, **_data_layout(trainer.datamodule))
            log_figure(trainer, f"mds_panels/{self.name}", fig, png="hidden_mds.png")
