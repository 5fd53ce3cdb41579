"""ReLN discovery, phase 2: the GDLN per k that imitates a trained ReLU net, and the elbow
([H] App. B, Alg. 1, Fig. 9).

Phase 1 (``recipes/haste_slowly/fig8_9_reln_discovery.yaml``) trains the ReLU net; its
``callbacks.reln.ActivationPatterns`` records, every ``every_n_epochs``, every hidden unit's binary
pattern over the data (the rows) and the net's outputs, in its checkpointed state. Phase 2
(``recipes/haste_slowly/fig9_reln_elbow.yaml``) is :class:`ImitationGDLNs`: from that checkpoint
it k-means the rows for every k (``zoo.models.reln.centroids_per_k``), thresholds the centroids into
gates and trains one GDLN per k, all in one fit (full batch, in lockstep, as a
``zoo.models.gdln.Comparison``), from the ReLU net's init scheme, ensemble, learning rate, loss reduction
and seed. Their outputs are taken at the epochs phase 1 recorded; at the end the imitation error
per k (``zoo.models.reln.imitation_error``: the mean of ``|f_ReLU - f_GDLN|^2`` over records, points and
outputs of member-mean outputs) and the k at the elbow (``zoo.models.reln.elbow``) are logged, with the
figure of [H] Figs. 8-9 (``zoo.plots.gdln.reln_gates``).

For the last hidden layer of a one- or two-hidden-layer ReLU net: with two, each GDLN is a
``zoo.models.gdln_depth.DepthGDLN`` whose shared linear layer stands for the first ([H] Sec. 6).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
import torch
from torch import Tensor

from zoo.models import reln
from zoo.training.checkpoint import CheckpointMismatch
from zoo.models.gdln import Comparison, ReLUNet
from zoo.training.hparams import save_own_hyperparameters
from zoo.training.history import unpacked
from zoo.training.logs import log_figure, log_scalars, warn_once
from zoo.plots import gdln as plots

PHASE_1 = "recipes/haste_slowly/fig8_9_reln_discovery.yaml"
RECORD = ("epochs", "rows", "outputs")  # callbacks.reln.ActivationPatterns' history


@dataclass
class ReLURecord:
    """What phase 1 left: the trained ReLU net, its pattern rows (R, N) of the last hidden layer, its
    outputs (T, E, N, n_out) at ``epochs`` (T,), and the step its checkpoint was saved at."""

    net: ReLUNet
    rows: Tensor
    outputs: Tensor
    epochs: list[int]
    step: int


def read_relu_record(path: str, network: str | None = None, who: str = "ImitationGDLNs") -> ReLURecord:
    """The ``ActivationPatterns`` record of a ReLU net's last hidden layer in the checkpoint at
    ``path`` (``network``: the net's name in a ``Comparison``; default the one recorded), and the
    net itself (``load_from_checkpoint``). A ``FileNotFoundError`` or ``ValueError`` that names the
    checkpoint and what is allowed otherwise."""
    where = f"{who}: relu_checkpoint = {path!r}"
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{where}: no such file ({file.resolve()}); train phase 1 first "
                                f"(`lightning fit --config {PHASE_1}`) and give its checkpoints/last.ckpt")
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a file that is not a checkpoint
        first = str(err).strip().split("\n", 1)[0][:200]
        raise CheckpointMismatch(f"{where}: not a readable checkpoint ({type(err).__name__}: {first}); allowed: "
                                 f"the last.ckpt of phase 1 ({PHASE_1})") from err
    states = ckpt.get("callbacks") if isinstance(ckpt, dict) else None
    found = [s for s in (states or {}).values() if isinstance(s, dict) and set(RECORD) <= set(s.get("history", {}))
             and s.get("layer") is not None and s["layer"] == s["n_layers"] - 1]
    if network is not None:
        found = [s for s in found if s["network"] == network]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} ({', '.join(str(s['network']) for s in found)}: give network)"
        raise CheckpointMismatch(f"{where}: {what} record of callbacks.reln.ActivationPatterns on the last hidden "
                                 f"layer{'' if network is None else f' of network {network!r}'}; allowed: the "
                                 f"last.ckpt of a fit with that callback, e.g. phase 1 ({PHASE_1})")
    state = found[0]
    history = unpacked(state["history"])
    if len(history["epochs"]) < 2:
        raise ValueError(f"{where}: ActivationPatterns recorded epochs {history['epochs']}, nothing after the start; "
                         "allowed: a run that recorded after training too (every_n_epochs at most its max_steps)")
    return ReLURecord(_relu_net(file, ckpt, state, where), torch.cat(history["rows"]).float(),
                      torch.stack(history["outputs"]), [int(e) for e in history["epochs"]], int(ckpt["global_step"]))


def _relu_net(file: Path, ckpt: dict, state: dict, where: str) -> ReLUNet:
    """The trained ReLU net the record is of: the checkpoint's module (a ``ReLUNet`` or a module
    with ``networks()``, e.g. a ``Comparison``), loaded by its class's ``load_from_checkpoint``."""
    import importlib

    # the CLI records the module's class; a ReLUNet saved from a notebook's Trainer has no record of it
    class_path = (ckpt.get("hyper_parameters") or {}).get("_class_path", "zoo.models.gdln.ReLUNet")
    module_name, _, name = str(class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, pl.LightningModule)):
        raise CheckpointMismatch(f"{where}: model class {class_path!r} cannot be imported; allowed: a checkpoint "
                                 f"written by `lightning fit`, e.g. phase 1's ({PHASE_1})")
    module = cls.load_from_checkpoint(str(file), map_location="cpu")
    nets = module.networks() if callable(getattr(module, "networks", None)) else {type(module).__name__: module}
    net = list(nets.values())[state["network_index"]]
    if not isinstance(net, ReLUNet):
        raise CheckpointMismatch(f"{where}: the recorded network is a {type(net).__name__}; allowed: a zoo.models.gdln.ReLUNet")
    return net.eval()


class ImitationGDLNs(Comparison):
    """One GDLN per k with the gates that k-means found in a trained ReLU net, trained side by side
    to imitate it ([H] App. B, Alg. 1, Fig. 9); phase 2 of ReLN discovery (module docstring).

    Trains on the datamodule phase 1 trained on (checked against the ReLU net's outputs) for
    ``trainer.max_steps`` epochs: the last epoch phase 1 recorded (fewer: the error over the records
    up to there). Logs ``loss/k<k>`` while training; at the end ``reln/imitation_error/k<k>``,
    ``reln/elbow_k`` and the figure ``reln/elbow`` (PNG ``reln_elbow.png``); ``validate``/``test``:
    each GDLN's ``val|test/mse/k<k>`` on the task.

    Args:
        relu_checkpoint: phase 1's checkpoint (``<run>/checkpoints/last.ckpt``).
        ks: the numbers of clusters (pathways) to try; those above the number of non-silent rows are left out.
        n_hidden: hidden units per pathway of each GDLN.
        threshold: a data point is in a pathway where the centroid exceeds it (``zoo.models.reln.threshold_centroids``).
        elbow_rule, rel_tol: how k is chosen (``zoo.models.reln.elbow``).
        random_state, n_init: the k-means' seed and restarts (as phase 1's, for the same centroids).
        network: the ReLU net's name in phase 1's ``Comparison``; default: the one recorded.
    """

    def __init__(
        self,
        relu_checkpoint: str,
        ks: list[int] = [1, 2, 3, 4, 5, 6],
        n_hidden: int = 100,
        threshold: float = 0.5,
        elbow_rule: Literal["kneedle", "within"] = "kneedle",
        rel_tol: float = 0.1,
        random_state: int = 0,
        n_init: int = 10,
        network: str | None = None,
    ) -> None:
        reln.check_discovery(ks, n_hidden=n_hidden, threshold=threshold, rule=elbow_rule, rel_tol=rel_tol, n_init=n_init,
                             caller="ImitationGDLNs")
        record = read_relu_record(relu_checkpoint, network)
        found_ks, centroids = reln.centroids_per_k(record.rows, sorted(ks), random_state=random_state, n_init=n_init)
        relu = record.net
        n_in, n_shared = relu.W[0].shape[-1], relu.hidden[0] if len(relu.hidden) == 2 else None
        models = [reln.gdln_for_gating(reln.gating_from_patterns(reln.threshold_centroids(C, threshold), n_in),
                                       n_hidden=n_hidden, init=relu.init_scheme, ensemble=relu.ensemble, lr=relu.lr,
                                       reduction=relu.reduction, seed=relu.seed, n_shared=n_shared) for C in centroids]
        # every recorded epoch ends a chunk of epochs (see epochs_per_step)
        super().__init__(models, names=[f"k{k}" for k in found_ks], epochs_per_step=math.gcd(*record.epochs))
        # this module's arguments, not the Comparison's it was built from (load_from_checkpoint calls it with them)
        self.remove_ignored_hparams(["models", "names", "epochs_per_step"])
        save_own_hyperparameters(self)
        self.record, self.ks, self.centroids = record, found_ks, centroids
        self.rule, self.rel_tol = elbow_rule, rel_tol
        self.gdln_outputs: list[Tensor] = []  # (K, E, N, n_out) at each recorded epoch reached

    # Comparison.training_step takes epochs_per_step epochs per step: the chunk is cut at the next
    # multiple of the records' spacing, so a run resumed from any step still meets every record
    @property
    def epochs_per_step(self) -> int:
        return self.record_spacing - self.global_step % self.record_spacing

    @epochs_per_step.setter
    def epochs_per_step(self, value: int) -> None:
        self.record_spacing = int(value)

    def setup(self, stage: str) -> None:
        X, Y = self.trainer.datamodule.X, self.trainer.datamodule.Y
        self.check_data(X, Y)
        if stage == "fit":
            last, steps = self.record.epochs[-1], self.trainer.max_steps
            if not (steps is not None and 0 < steps <= last):
                raise ValueError(f"ImitationGDLNs: trainer.max_steps = {steps}; allowed: 1 .. {last}, the last epoch "
                                 f"phase 1 recorded ({last} for the whole comparison)")
            self.gdln_outputs = []  # a resumed fit gets them back from its checkpoint (on_load_checkpoint)
        for m in self.models:
            if not m.built:
                m.build(X, Y)

    def check_data(self, X: Tensor, Y: Tensor) -> None:
        """Raise unless (X, Y) is the task phase 1 trained on: its shapes, and the ReLU net's outputs on X
        at the checkpoint equal those recorded there (float32 round-off: 1e-4 of their scale)."""
        relu, rec = self.record.net, self.record
        shapes = (rec.rows.shape[1], relu.W[0].shape[-1], relu.W[-1].shape[-2])
        if (X.shape[-2], X.shape[-1], Y.shape[-1]) != shapes:
            raise ValueError(f"ImitationGDLNs: the datamodule has {X.shape[-2]} points of {X.shape[-1]} inputs and "
                             f"{Y.shape[-1]} outputs; phase 1's ReLU net had {shapes[0]}, {shapes[1]} and {shapes[2]}: "
                             "give phase 1's data")
        if rec.epochs[-1] == rec.step:
            with torch.no_grad():
                out, ref = relu(X.cpu()), rec.outputs[-1]
            if not torch.allclose(out, ref, rtol=0, atol=1e-4 * float(ref.abs().max()) + 1e-12):
                raise ValueError("ImitationGDLNs: the ReLU net of relu_checkpoint gives other outputs on this "
                                 "datamodule's inputs than it did in phase 1; give phase 1's data (its config.yaml's data)")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["reln_imitation_outputs"] = self.gdln_outputs

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.gdln_outputs = list(checkpoint.get("reln_imitation_outputs", []))

    def _record_outputs(self) -> None:
        done = len(self.gdln_outputs)
        if done < len(self.record.epochs) and self.global_step == self.record.epochs[done]:
            X = self.trainer.datamodule.X.to(self.device)
            with torch.no_grad():
                # every member on every rank: the members are sharded across processes under strategy ddp
                self.gdln_outputs.append(self.all_member_values(torch.stack([m(X) for m in self.models]), dim=1).cpu())

    def on_train_start(self) -> None:
        self._record_outputs()  # epoch 0 (a resumed run has it from its checkpoint)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict:
        out = super().training_step(batch, batch_idx)
        self._record_outputs()  # here, not in a batch-end hook: before the step's checkpoint is saved
        return out

    def imitation(self) -> dict:
        """The imitation error per k over the records so far ([H] Fig. 9) and the k at the elbow:
        ``{"ks", "centroids", "errors", "elbow_k", "epochs"}``."""
        T = len(self.gdln_outputs)
        if T == 0:
            raise RuntimeError("ImitationGDLNs.imitation: no outputs recorded yet; fit the module first")
        relu, gdln = self.record.outputs[:T].double(), torch.stack(self.gdln_outputs, 1)  # (K, T, E, N, n_out)
        errors = [reln.imitation_error(relu, g) for g in gdln]
        return {"ks": self.ks, "centroids": self.centroids, "errors": errors,
                "elbow_k": reln.elbow(self.ks, errors, self.rule, self.rel_tol), "epochs": self.record.epochs[:T]}

    def on_train_end(self) -> None:
        trainer = self.trainer
        if not trainer.is_global_zero or not self.gdln_outputs:
            return
        r = self.imitation()
        if len(r["epochs"]) < len(self.record.epochs):
            warn_once(f"ImitationGDLNs: the imitation errors cover the records up to epoch {r['epochs'][-1]}, not "
                      f"all of phase 1's (to {self.record.epochs[-1]}): trainer.max_steps = {trainer.max_steps}")
        log_scalars(trainer, {**{f"reln/imitation_error/k{k}": e for k, e in zip(r["ks"], r["errors"])},
                              "reln/elbow_k": r["elbow_k"]})
        dm = trainer.datamodule
        title = (f"{type(self.record.net).__name__}, last hidden layer: k-means centroids (black = active), "
                 f"{len(r['epochs'])} records")
        log_figure(trainer, "reln/elbow", plots.reln_gates(r, title, getattr(dm, "n_contexts", None),
                                                           getattr(dm, "n_items", None), self.rule),
                   png="reln_elbow.png")
