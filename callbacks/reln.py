"""Callbacks for finding a ReLU net's ReLN ([H] App. B, Figs. 8-9) and for the MDS of hidden
representations ([H] Figs. 3-4). They record and log; the k-means and the MDS are ``zoo.models.reln``'s,
the figures ``zoo.plots.gdln``'s; the GDLN per k that imitates the ReLU net is a fit of its own
(``zoo.models.reln_imitation``)."""
from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor

from callbacks.base import HistoryCallback, check, check_count, log_figure, log_matrix, log_scalars, resuming
from zoo.models import reln
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
    """ReLN discovery by k-means, phase 1 ([H] App. B, Alg. 1; Fig. 8) in hidden ``layer`` (-1: the
    last) of a ReLU net (``model`` in a Comparison, default its first). At epoch 0 and every
    ``every_n_epochs`` (Alg. 1: 100; at the first step end past each multiple) every unit's binary
    pattern over the data is kept as a row (all members: Alg. 1's runs), with the net's outputs;
    the record is in the callback's checkpointed state. At the end ``zoo.models.reln.centroids_per_k``
    k-means the rows for each k in ``ks`` (images ``reln/centroids/k<k>``, PNG ``reln_gates.png``,
    ``reln_layer<l>_gates.png`` for a deeper net). The GDLN per k and the elbow ([H] Fig. 9) are
    phase 2, a fit of their own that reads this run's checkpoint (``zoo.models.reln_imitation.ImitationGDLNs``);
    ``elbow`` stays only to say so."""

    unit = "epochs"
    HISTORY_KEYS = ("epochs", "rows", "outputs")

    def __init__(self, every_n_epochs: int = 100, ks: list[int] = [1, 2, 3, 4, 5, 6], layer: int = -1,
                 random_state: int = 0, n_init: int = 10, model: str | None = None, elbow: bool = False) -> None:
        super().__init__(every_n_epochs)
        if elbow:
            raise ValueError("ActivationPatterns: elbow = True; allowed: false. The GDLN per k and the elbow are a "
                             "fit of their own (phase 2): lightning fit --config recipes/haste_slowly/fig9_reln_elbow.yaml "
                             "--model.init_args.relu_checkpoint=<this run>/checkpoints/last.ckpt")
        reln.check_discovery(ks, n_init=n_init, caller="ActivationPatterns")
        self.ks, self.layer, self.model = sorted(int(k) for k in ks), layer, model
        self.kw, self.result = dict(random_state=random_state, n_init=n_init), {}
        self.name: str | None = None  # the network's name and place in the module's networks(), from on_start
        self.index = 0

    @property
    def state_key(self) -> str:
        # one callback per layer (recipes/haste_slowly/fig6_depth.yaml): each keeps its own record
        return self._generate_state_key(layer=self.layer, model=self.model, every_n_epochs=self.every_n_steps)

    def state_dict(self) -> dict:
        # what phase 2 (zoo.models.reln_imitation) reads besides the record: which network and layer it is of
        if self.name is None:
            return super().state_dict()
        n = len(self.net.hidden)
        return {**super().state_dict(), "network": self.name, "network_index": self.index, "layer": self.layer % n,
                "n_layers": n}

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.name, self.net = _network(pl_module, self.model)
        self.index = list(pl_module.networks()).index(self.name) if callable(getattr(pl_module, "networks", None)) else 0
        if not callable(getattr(self.net, "activation_patterns", None)):
            raise TypeError(f"ActivationPatterns needs a ReLUNet (activation_patterns()); {type(self.net).__name__} has none")
        n = len(self.net.hidden)
        check("ActivationPatterns", "layer", self.layer, -n <= self.layer < n, f"-{n} .. {n - 1}")

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        X = trainer.datamodule.X.to(self.net.W[0].device)
        self.history["rows"].append(reln.pattern_rows(self.net.activation_patterns(X)[self.layer]).to(torch.uint8).cpu())
        with torch.no_grad():
            self.history["outputs"].append(self.net(X).cpu())
        self.history["epochs"].append(self.now)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        dm, n_layers, h = trainer.datamodule, len(self.net.hidden), self.history
        ks, cents = reln.centroids_per_k(torch.cat(h["rows"]).float(), self.ks, **self.kw)
        self.result = {"ks": ks, "centroids": cents, "epochs": list(h["epochs"])}
        prefix = f"reln/layer{self.layer % n_layers}" if n_layers > 1 else "reln"
        for k, C in zip(ks, cents):
            log_matrix(trainer, f"{prefix}/centroids/k{k}", C, symmetric=False)
        title = f"{self.name} {prefix}: k-means centroids (black = active; columns = data points; {len(h['epochs'])} records)"
        log_figure(trainer, f"{prefix}/gates", plots.reln_gates(self.result, title, getattr(dm, "n_contexts", None),
                                                                getattr(dm, "n_items", None)),
                   png=prefix.replace("/", "_") + "_gates.png")


class HiddenMDS(HistoryCallback):
    """Classical MDS ([H] Figs. 3-4, ``zoo.models.reln.classical_mds``) in ``dim`` dimensions of the data
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
        check("HiddenMDS", "layer", self.layer, -n <= self.layer < n, f"-{n} .. {n - 1}")
        # the resumed run's TensorBoard starts at this epoch (zoo.training.resume_events): log again
        # what was recorded here before the checkpoint
        if resuming(trainer) and trainer.is_global_zero and self.records and self.records[-1][0] == self.now:
            self._publish(trainer, *self._embed(trainer))

    def _embed(self, trainer: pl.Trainer) -> tuple[Tensor, float]:
        """The MDS coordinates (N, dim) and the share of the Gram spectrum they hold (``zoo.models.reln.hidden_mds``)."""
        H = self.net.hidden_activity(trainer.datamodule.X.to(self.net.W[0].device))[self.layer]
        return reln.hidden_mds(H, self.dim)

    def _publish(self, trainer: pl.Trainer, coords: Tensor, explained: float) -> None:
        log_scalars(trainer, {f"mds/{self.name}/explained": explained})
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
