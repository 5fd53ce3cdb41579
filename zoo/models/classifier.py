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

**Across processes** (``--trainer.strategy=ddp``): an ensemble is member-parallel (each rank trains
its slice of the members on every batch, ``zoo.training.distributed``); one member trains data-parallel
under DDP, every rank on its part of each batch (``batch_size`` must divide by the number of
processes: the parts' mean gradients then average to the whole batch's).

**EWC** ([S] Sec. 4.2.2): with ``ewc`` set, the end of a consolidated task stores ``W`` and its
per-sample diagonal Fisher (buffers), and the loss of later tasks gains ``xi/2 sum F (W - W*)^2``.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from zoo.training.lazy import lazy_instance
from torch import Tensor, nn

from zoo.training.ewc import EWC
from zoo.training.hparams import save_own_hyperparameters
from zoo.init import EntropyMix, Gaussian, InitScheme
from zoo.utils.labels import MAX_MEMBER_TAGS
from zoo.training.logs import log_batch_rows
from zoo.models.multihead import MemberMean, MultiHeadModule, check_positive_ints
from zoo.training.progress import attached_trainer

Activation = Literal["sigmoid", "erf", "relu", "tanh", "linear"]


class MultiHeadClassifier(MultiHeadModule):
    """A two-layer classifier with a shared hidden layer and one head per task ([S] App. G).

    Args:
        n_in: input dimension (784 for MNIST).
        hidden: hidden units.
        n_classes: classes per task (one head of this many outputs per task).
        n_tasks: number of heads.
        activation: ``"sigmoid"`` (the paper's), ``"erf"``, ``"relu"``, ``"tanh"`` or ``"linear"``
            (a subclass may override ``activation(lam)``).
        lr: SGD learning rate.
        init: scheme of the hidden layer (pre-activations are ``W x / sqrt n_in``); ``init_w`` is
            its former name (``ZooModule.aliases``).
        init_heads: scheme of every head (``entropy_mix``: [S] App. G's entropy and scale).
        init_later_heads: scheme of the heads of tasks 2, 3, ... if different.
        ensemble: number of initialisations; default: the schemes' list length.
        seed: seed of the initial weights; a list gives each member its own.
        grid: the Cartesian product of all list-valued parameters (see ``MultiHeadStudent``).
        ewc: elastic weight consolidation of ``W`` (:class:`zoo.training.ewc.EWC`); needs a datamodule with
            ``fisher_data(task, n) -> (x, y)``.
        data_sets: set at setup from the datamodule's ``data_sets`` (stored for checkpoints).
    """

    # hyperparameters set from the datamodule at setup, not by the config (zoo.cli.checkpoint_checks)
    hparams_from_data: tuple[str, ...] = ("data_sets",)
    sets_arg = sets_attr = "data_sets"
    sizes_shared_with_data = ("n_in", "n_classes")
    aliases = {"init_w": "init"}

    def __init__(
        self,
        n_in: int = 784,
        hidden: int = 512,
        n_classes: int = 5,
        n_tasks: int = 2,
        activation: Activation = "sigmoid",
        lr: float = 0.1,
        init: InitScheme = lazy_instance(Gaussian, sigma=1.0),
        init_heads: InitScheme = lazy_instance(EntropyMix, gamma=1.0, sigma=0.1),
        init_later_heads: InitScheme | None = None,
        ensemble: int | None = None,
        seed: int | list[int] = 0,
        grid: bool = False,
        ewc: EWC | None = None,
        data_sets: int = 1,
        init_w: InitScheme | None = None,
    ) -> None:
        super().__init__()
        sizes = check_positive_ints(type(self).__name__, n_in=n_in, hidden=hidden, n_classes=n_classes, n_tasks=n_tasks)
        self.set_activation(activation)
        self.lr = self.check_lr(lr)
        schemes, ewc, plain = self.init_members(init, init_heads, init_later_heads, ewc)
        save_own_hyperparameters(self, **plain)
        self.n_in, self.hidden, self.n_classes, self.n_tasks = sizes
        W, heads = self.build_members(schemes, ewc, seed, grid, ensemble, data_sets, self.n_tasks,
                                      (self.hidden, self.n_in), (self.n_classes, self.hidden))
        self.W = nn.Parameter(W)
        self.heads = nn.Parameter(heads)  # (E, T, C, H)
        self.ewc = self._ewc_state()

    # -- structure ----------------------------------------------------------------------------------
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
        t = self.task_index if task is None else task
        hidden = self.activation(self.preactivations(self.member_inputs(x)))
        return torch.bmm(hidden, self.heads[:, t].transpose(1, 2))

    def member_loss(self, x: Tensor, y: Tensor, task: int) -> Tensor:
        """Cross-entropy of every member on head ``task``, (E,)."""
        return self._cross_entropy(self(x, task), y).mean(1)

    def _cross_entropy(self, logits: Tensor, y: Tensor) -> Tensor:
        """Per-sample cross-entropy, (E, B), of logits (E, B, C) against labels y (B,) or (G, B)."""
        target = self.member_targets(y).to(logits.device)
        return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(target.shape)

    def training_loss(self, x: Tensor, y: Tensor, task: int) -> tuple[Tensor, Tensor]:
        """``(objective, losses)``: what SGD descends (summed over members: each member's gradient is
        its own) and each member's cross-entropy, (E,). With ``loss_grad`` overridden the objective
        is the surrogate ``mean_b <logits_b, loss_grad(delta_b)>`` with the factor held fixed, whose
        gradient is ``J^T loss_grad(delta)``: the readout's derivative replaced, as the override says."""
        logits = self(x, task)
        losses = self._cross_entropy(logits, y).mean(1)
        if not self.overrides("loss_grad"):
            return losses.sum(), losses
        target = nn.functional.one_hot(self.member_targets(y).to(logits.device), self.n_classes).to(logits)
        g = self.loss_grad(torch.softmax(logits, -1) - target).detach()
        return (logits * g).sum(-1).mean(1).sum(), losses

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
            errors.append(1 - self.accuracy(self.kept_on_device(x), self.kept_on_device(y), t))
        return torch.stack(errors, -1).double().cpu()

    @torch.no_grad()
    def fisher_W(self, x: Tensor, y: Tensor, task: int, mode: str = "sampled") -> Tensor:
        """Diagonal Fisher of ``W`` for head ``task``, per member, (E, hidden, n_in).

        Per sample, ``d CE / dW = ((H^T (p - e_y)) * phi'(z)) x^T / sqrt n_in``, so
        ``F = mean_s a_s^2 x_s^2 / n_in`` with ``a = (H^T (p - e_y)) * phi'(z)``. ``"empirical"``
        uses the true labels ``y`` (and ``loss_grad(p - e_y)``, the trained loss's derivative);
        ``"sampled"`` the exact expectation over labels drawn from the model,
        ``E_c[(H^T (p - e_c))_i^2] = sum_c p_c ((H^T p)_i - H_ci)^2``.
        """
        if mode not in ("sampled", "empirical"):
            raise ValueError(f"fisher_W: mode = {mode!r}; allowed: 'sampled' or 'empirical'")
        xs = self.member_inputs(x).to(self.W.dtype)  # (E, N, n_in)
        z = self.preactivations(xs)
        p = torch.softmax(torch.bmm(self.activation(z), self.heads[:, task].transpose(1, 2)), -1)  # (E, N, C)
        Ht = self.heads[:, task]  # (E, C, H)
        v = torch.einsum("enc,ech->enh", p, Ht)  # H^T p
        if mode == "empirical":
            onehot = nn.functional.one_hot(self.member_targets(y).to(p.device), self.n_classes).to(p)
            sq = torch.einsum("enc,ech->enh", self.loss_grad(p - onehot), Ht) ** 2
        else:
            sq = torch.einsum("enc,ench->enh", p, (v.unsqueeze(2) - Ht.unsqueeze(1)) ** 2)
        a2 = sq * self.activation_grad(z) ** 2
        return torch.einsum("enh,end->ehd", a2, xs**2) / (xs.shape[1] * self.n_in)

    # -- training -----------------------------------------------------------------------------------
    def consolidation_fisher(self, x: Tensor, y: Tensor, task: int) -> Tensor:
        """The Fisher of ``W`` EWC stores at the end of ``task`` (``fisher_W``)."""
        return self.fisher_W(x, y, task, mode=self.ewc_config.fisher)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        task = int(batch["task"])
        if not 0 <= task < self.n_tasks:
            raise ValueError(f"{type(self).__name__}: batch task {task} but the classifier has {self.n_tasks} heads")
        # a batch that names its SGD step must be the run's next one: a resumed run that continued its
        # stream elsewhere would train a different run
        if (attached_trainer(self) is not None and "step" in batch and self.trainer.current_epoch == 0
                and self.trainer.accumulate_grad_batches == 1
                and int(batch["step"]) != self.global_step):
            raise RuntimeError(f"{type(self).__name__}: the batch is for SGD step {int(batch['step'])} but the run is "
                               f"at step {self.global_step}; the data stream and the checkpoint do not match")
        self.begin_task(task)
        part = self.rank_part(batch)  # data-parallel: this rank's samples
        total, losses = self.training_loss(part["x"], part["y"], task)
        everyone = self.across_ranks(losses.detach())  # every member's, the whole batch's: the same on every rank
        self.stop_if_diverged(everyone, self.global_step)
        scalars = {"loss": everyone.mean()}
        if self.ewc is not None and self.ewc.active:
            pen = self.ewc.member_penalty({"W": self.W})
            total = total + pen.sum()
            scalars["ewc/penalty"] = self.across_ranks(pen.detach()).mean()
        self.count_samples(batch["y"].shape[-1])
        if 1 < self.n_members() <= MAX_MEMBER_TAGS:
            scalars |= {f"loss/{lbl}": l for lbl, l in zip(self.labels, everyone)}
        # the zoo's rows at the step of the weights measured (zoo.training.logs.log_batch_rows: the same after a resume)
        log_batch_rows(self, self.global_step, scalars, pending=1)
        return total

    def check_data_parallel(self, dm, world: int) -> None:
        """One member trains data-parallel: every rank on ``batch_size / world`` samples of each batch."""
        B = getattr(dm, "batch_size", None)
        if isinstance(B, int) and B % world:
            raise ValueError(f"{type(self).__name__}: one member trains data-parallel, each of the {world} processes on "
                             f"an equal part of every batch; batch_size = {B}; allowed: a multiple of {world}")

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self.end_of_task(self.task_index, self.global_step + 1)  # global_step counts this update after the hook

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([self.W, self.heads], lr=self.lr)

    # -- evaluation (validation_step / test_step of zoo.models.multihead) -------------------------------------
    def eval_metrics(self) -> dict:
        E = self.ensemble
        return {"accuracy": MemberMean(E), "error": _OneMinus(E), "loss": MemberMean(E)}

    def update_eval(self, metrics: dict, batch: dict[str, Tensor], task: int) -> None:
        """``batch``: x (N, n_in) or (G, N, n_in), y (N,) or (G, N) of ``task`` (``MNISTContinual``'s loaders)."""
        logits = self(batch["x"].to(self.W.device), task)
        correct = (logits.argmax(-1) == self.member_targets(batch["y"]).to(self.W.device)).double()
        metrics["accuracy"].update(correct)
        metrics["error"].update(correct)
        metrics["loss"].update(self._cross_entropy(logits, batch["y"]))


class _OneMinus(MemberMean):
    """The test error ``1 - accuracy`` of every member (what ``task_errors`` reports)."""

    def compute(self) -> Tensor:
        return 1 - super().compute()
