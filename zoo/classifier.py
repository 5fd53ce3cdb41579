"""Two-layer multi-head classifiers for continual learning on real data ([S] App. G, Fig. 12).

``logits^(t) = H^(t) phi(W x / sqrt n_in)``: a shared hidden layer ``W`` (hidden, n_in) and one
readout head ``H^(t)`` (n_classes, hidden) per task, the architecture of the teacher-student
students with a wide hidden layer. Cross-entropy on the active task's head, minibatch SGD;
only the active head and ``W`` receive gradients, so a finished task's head stays frozen.

**Ensemble.** ``E`` members (list-valued init parameters, zipped or with ``grid: true`` their
Cartesian product, and per-member seeds) train in one fit as batched tensor ops. When the
datamodule serves ``G`` data sets at once (batches ``x`` (G, B, n_in), e.g. one per task
similarity), each initialisation is replicated ``G`` times at setup and member ``e`` trains on
set ``e mod G``, as the students do with teacher sets.

**EWC** ([S] Sec. 4.2.2): with ``ewc`` set, the end of a consolidated task stores ``W`` and its
per-sample diagonal Fisher (buffers), and the loss of later tasks gains ``xi/2 sum F (W - W*)^2``.
"""
from __future__ import annotations

import math
from dataclasses import asdict
from typing import Literal

import lightning.pytorch as pl
import torch
from jsonargparse import lazy_instance
from torch import Tensor, nn

from zoo.divergence import check_finite
from zoo.hparams import save_own_hyperparameters, store_hparams
from zoo.ewc import EWC, EWCState, ensemble_state
from zoo.init import EntropyMix, Gaussian, InitScheme
from zoo.task_switch import TaskSwitchAtBatchEnd
from zoo.ensemble import MAX_MEMBER_TAGS, layer_schemes, member_labels, multi_head_weights, resolve_members

Activation = Literal["sigmoid", "erf", "relu", "tanh"]


def _phi(activation: str, z: Tensor) -> Tensor:
    if activation == "sigmoid":
        return torch.sigmoid(z)
    if activation == "erf":
        return torch.erf(z / math.sqrt(2.0))
    if activation == "relu":
        return torch.relu(z)
    return torch.tanh(z)


def _dphi(activation: str, z: Tensor) -> Tensor:
    if activation == "sigmoid":
        s = torch.sigmoid(z)
        return s * (1 - s)
    if activation == "erf":
        return math.sqrt(2.0 / math.pi) * torch.exp(-0.5 * z * z)
    if activation == "relu":
        return (z > 0).to(z.dtype)
    return 1 - torch.tanh(z) ** 2


class MultiHeadClassifier(TaskSwitchAtBatchEnd, pl.LightningModule):
    """A two-layer classifier with a shared hidden layer and one head per task ([S] App. G).

    Args:
        n_in: input dimension (784 for MNIST).
        hidden: hidden units.
        n_classes: classes per task (one head of this many outputs per task).
        n_tasks: number of heads.
        activation: ``"sigmoid"`` (the paper's), ``"erf"``, ``"relu"`` or ``"tanh"``.
        lr: SGD learning rate.
        init_w: scheme of the hidden layer (pre-activations are ``W x / sqrt n_in``).
        init_heads: scheme of every head (``entropy_mix``: [S] App. G's entropy and scale).
        init_later_heads: scheme of the heads of tasks 2, 3, ... if different.
        ensemble: number of initialisations; default: the schemes' list length.
        seed: seed of the initial weights; a list gives each member its own.
        grid: the Cartesian product of all list-valued parameters (see ``MultiHeadStudent``).
        ewc: elastic weight consolidation of ``W`` (:class:`zoo.ewc.EWC`); needs a datamodule with
            ``fisher_data(task, n) -> (x, y)``.
        data_sets: set at setup from the datamodule's ``data_sets`` (stored for checkpoints).
    """

    # hyperparameters set from the datamodule at setup, not by the config (zoo.checkpoint_checks)
    hparams_from_data: tuple[str, ...] = ("data_sets",)

    def __init__(
        self,
        n_in: int = 784,
        hidden: int = 512,
        n_classes: int = 5,
        n_tasks: int = 2,
        activation: Activation = "sigmoid",
        lr: float = 0.1,
        init_w: InitScheme = lazy_instance(Gaussian, sigma=1.0),
        init_heads: InitScheme = lazy_instance(EntropyMix, gamma=1.0, sigma=0.1),
        init_later_heads: InitScheme | None = None,
        ensemble: int | None = None,
        seed: int | list[int] = 0,
        grid: bool = False,
        ewc: EWC | None = None,
        data_sets: int = 1,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, value in (("n_in", n_in), ("hidden", hidden), ("n_classes", n_classes), ("n_tasks", n_tasks),
                           ("data_sets", data_sets)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name}: {arg} = {value!r}; allowed: a positive integer")
        if activation not in ("sigmoid", "erf", "relu", "tanh"):
            raise ValueError(f"{name}: activation = {activation!r}; allowed: sigmoid, erf, relu, tanh")
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"{name}: lr = {lr}; allowed: a positive number")
        schemes = layer_schemes(init_w, init_heads, init_later_heads)
        if isinstance(ewc, dict):
            ewc = EWC(**ewc)
        xis = [float(x) for x in ewc.xi] if ewc is not None and isinstance(ewc.xi, (list, tuple)) else None
        save_own_hyperparameters(self, **{key: scheme.spec() for key, scheme in schemes.items()},
                      **({"ewc": asdict(ewc)} if ewc is not None else {}))
        members = resolve_members(name, schemes, seed, xis, grid, ensemble)
        self.n_in, self.hidden, self.n_classes, self.n_tasks = int(n_in), int(hidden), int(n_classes), int(n_tasks)
        self.activation, self.lr, self.schemes, self.G = activation, float(lr), members.schemes, int(data_sets)
        self.xis = members.xis
        W, heads = multi_head_weights(members, self.n_tasks, (self.hidden, self.n_in), (self.n_classes, self.hidden))
        self.base_labels = member_labels(members.schemes, members.E, members.seeds, self.xis)
        self.W = nn.Parameter(W.float().repeat_interleave(self.G, 0))
        self.heads = nn.Parameter(heads.float().repeat_interleave(self.G, 0))  # (E, T, C, H)
        self.register_buffer("task", torch.tensor(0))
        self.ewc_config = ewc
        self.ewc = self._ewc_state()

    def _ewc_state(self) -> EWCState | None:
        state = ensemble_state(self.ewc_config, self.xis, self.G, {"W": self.W.shape})
        return None if state is None else state.to(self.W.device)

    # -- structure ----------------------------------------------------------------------------------
    @property
    def ensemble(self) -> int:
        return self.W.shape[0]

    @property
    def labels(self) -> list[str]:
        if self.G == 1:
            return list(self.base_labels)
        names = getattr(self, "set_names", [f"set{g}" for g in range(self.G)])
        return [f"{b},{n}" if b != "member0" else n for b in self.base_labels for n in names]

    @property
    def set_index(self) -> Tensor:
        """The data set of every member, (E,): ``e mod G``."""
        return torch.arange(self.ensemble, device=self.W.device) % self.G

    def member_inputs(self, x: Tensor) -> Tensor:
        """Inputs per member: x (B, n_in) shared, or (G, B, n_in) per data set -> (E, B, n_in)."""
        if x.dim() == 2:
            return x.unsqueeze(0).expand(self.ensemble, *x.shape)
        if x.dim() != 3 or x.shape[0] not in (1, self.G):
            raise ValueError(f"{type(self).__name__}: x must be (B, n_in) or (G = {self.G}, B, n_in); got {tuple(x.shape)}")
        return x[self.set_index % x.shape[0]]

    def member_targets(self, y: Tensor) -> Tensor:
        """Labels per member: y (B,) or (G, B) -> (E, B)."""
        if y.dim() == 1:
            return y.unsqueeze(0).expand(self.ensemble, *y.shape)
        return y[self.set_index % y.shape[0]]

    def preactivations(self, x: Tensor) -> Tensor:
        """``W x / sqrt n_in`` per member: (E, B, n_in) -> (E, B, hidden)."""
        return torch.bmm(x.to(self.W.dtype), self.W.transpose(1, 2)) / math.sqrt(self.n_in)

    def forward(self, x: Tensor, task: int | None = None) -> Tensor:
        """Logits of head ``task`` (default: the active one): x (B, n_in) or (G, B, n_in) -> (E, B, C)."""
        t = int(self.task) if task is None else task
        hidden = _phi(self.activation, self.preactivations(self.member_inputs(x)))
        return torch.bmm(hidden, self.heads[:, t].transpose(1, 2))

    def member_loss(self, x: Tensor, y: Tensor, task: int) -> Tensor:
        """Cross-entropy of every member on head ``task``, (E,)."""
        logits = self(x, task)
        target = self.member_targets(y).to(logits.device)
        return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(
            target.shape).mean(1)

    @torch.no_grad()
    def accuracy(self, x: Tensor, y: Tensor, task: int) -> Tensor:
        """Accuracy of every member on head ``task``, (E,)."""
        return (self(x, task).argmax(-1) == self.member_targets(y).to(self.W.device)).float().mean(1)

    def task_errors(self, datamodule, source: str = "mc") -> Tensor:
        """Test error ``1 - accuracy`` of every member on every task's head now, on the datamodule's
        ``test_set(task)``: (E, n_tasks), float64 on the CPU (what the forgetting callbacks record;
        a classifier has no closed form, so ``source`` must be ``"mc"``)."""
        if source != "mc":
            raise ValueError(f"task_errors: source = {source!r}; allowed for a classifier: 'mc' (test sets)")
        errors = []
        for t in range(self.n_tasks):
            x, y = datamodule.test_set(t)
            errors.append(1 - self.accuracy(x.to(self.W.device), y, t))
        return torch.stack(errors, -1).double().cpu()

    @torch.no_grad()
    def fisher_W(self, x: Tensor, y: Tensor, task: int, mode: str = "sampled") -> Tensor:
        """Diagonal Fisher of ``W`` for head ``task``, per member, (E, hidden, n_in).

        Per sample, ``d CE / dW = ((H^T (p - e_y)) * phi'(z)) x^T / sqrt n_in``, so
        ``F = mean_s a_s^2 x_s^2 / n_in`` with ``a = (H^T (p - e_y)) * phi'(z)``. ``"empirical"``
        uses the true labels ``y``; ``"sampled"`` the exact expectation over labels drawn from the
        model, ``E_c[(H^T (p - e_c))_i^2] = sum_c p_c ((H^T p)_i - H_ci)^2``.
        """
        if mode not in ("sampled", "empirical"):
            raise ValueError(f"fisher_W: mode = {mode!r}; allowed: 'sampled' or 'empirical'")
        xs = self.member_inputs(x).to(self.W.dtype)  # (E, N, n_in)
        z = self.preactivations(xs)
        p = torch.softmax(torch.bmm(_phi(self.activation, z), self.heads[:, task].transpose(1, 2)), -1)  # (E, N, C)
        Ht = self.heads[:, task]  # (E, C, H)
        v = torch.einsum("enc,ech->enh", p, Ht)  # H^T p
        if mode == "empirical":
            onehot = nn.functional.one_hot(self.member_targets(y).to(p.device), self.n_classes).to(p)
            sq = (v - torch.einsum("enc,ech->enh", onehot, Ht)) ** 2
        else:
            sq = torch.einsum("enc,ench->enh", p, (v.unsqueeze(2) - Ht.unsqueeze(1)) ** 2)
        a2 = sq * _dphi(self.activation, z) ** 2
        return torch.einsum("enh,end->ehd", a2, xs**2) / (xs.shape[1] * self.n_in)

    # -- training -----------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or stage != "fit":
            return
        for attr in ("n_in", "n_classes"):
            if isinstance(getattr(dm, attr, None), int) and getattr(dm, attr) != getattr(self, attr):
                raise ValueError(f"{type(self).__name__}: {attr} = {getattr(self, attr)} but the datamodule has "
                                 f"{attr} = {getattr(dm, attr)}")
        G = int(getattr(dm, "data_sets", 1))
        if G != self.G:
            if self.G != 1:
                raise ValueError(f"{type(self).__name__}: data_sets = {self.G} but the datamodule serves {G}")
            with torch.no_grad():
                self.W = nn.Parameter(self.W.detach().repeat_interleave(G, 0))
                self.heads = nn.Parameter(self.heads.detach().repeat_interleave(G, 0))
            self.G = G
            store_hparams(self, data_sets=G)
            self.ewc = self._ewc_state()
        if hasattr(dm, "set_names"):
            self.set_names = list(dm.set_names)
        if self.ewc is not None and not callable(getattr(dm, "fisher_data", None)):
            raise TypeError(f"{type(self).__name__}: ewc needs a datamodule with fisher_data(task, n)")

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        task = int(batch["task"])
        if not 0 <= task < self.n_tasks:
            raise ValueError(f"{type(self).__name__}: batch task {task} but the classifier has {self.n_tasks} heads")
        # a batch that names its SGD step must be the run's next one: a resumed run that continued its
        # stream elsewhere would train a different run
        if (self._trainer is not None and "step" in batch and self.trainer.current_epoch == 0
                and self.trainer.accumulate_grad_batches == 1
                and int(batch["step"]) != self.global_step):
            raise RuntimeError(f"{type(self).__name__}: the batch is for SGD step {int(batch['step'])} but the run is "
                               f"at step {self.global_step}; the data stream and the checkpoint do not match")
        if task != int(self.task):
            if self._task_ended != int(self.task):  # a datamodule without task_at: at the new task's first step
                self._switch_step = self.global_step
                self.on_task_switch(int(self.task), task)
            if self.ewc is not None and self.ewc.active:  # before the first step on the penalty
                self.ewc.check_step_size(self.lr, self.labels, type(self).__name__, "lr")
            self.task.fill_(task)
        losses = self.member_loss(batch["x"], batch["y"], task)
        check_finite(losses, step=self.global_step, labels=self.labels,
                     hint=f"lr = {self.lr} is probably too large; try lr / 10.")
        total = losses.sum()
        if self.ewc is not None and self.ewc.active:
            pen = self.ewc.member_penalty({"W": self.W})
            total = total + pen.sum()
            self.log("ewc/penalty", pen.detach().mean())
        self.log("loss", losses.detach().mean(), prog_bar=True)
        if 1 < self.ensemble <= MAX_MEMBER_TAGS:
            self.log_dict({f"loss/{lbl}": l for lbl, l in zip(self.labels, losses.detach())})
        return total

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self.end_of_task(int(self.task), self.global_step + 1)  # global_step counts this update after the hook

    def on_task_switch(self, old: int, new: int) -> None:
        """With the weights after the last update of task ``old`` (at the end of its last batch
        when the datamodule has ``task_at``, else at the first step of ``new``): consolidate task
        ``old`` for EWC if configured; logged at the switch's step."""
        if self.ewc is None or not self.ewc_config.consolidates(old, self.n_tasks):
            return
        x, y = self.trainer.datamodule.fisher_data(old, self.ewc_config.samples)
        F = self.fisher_W(x.to(self.W.device), y.to(self.W.device), old, mode=self.ewc_config.fisher)
        self.ewc.consolidate({"W": self.W.detach()}, {"W": F})
        for lg in self.trainer.loggers:
            lg.log_metrics({f"ewc/{k}": v for k, v in self.ewc.summary().items()}, step=self._switch_step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    @property
    def samples_seen(self) -> int:  # TEMPORARY (tscallbacks): multihead's zoo.progress.Progress replaces it
        return self.global_step
