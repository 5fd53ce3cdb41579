"""What the two multi-head ensembles of [S] share (``MultiHeadStudent``, Sec. 4; ``MultiHeadClassifier``,
App. G): a first layer ``W`` shared by the tasks and one readout head per task, ``E`` members
trained in one fit, each initialisation replicated once per data set the datamodule serves
(teacher sets, MNIST similarities), EWC of ``W`` ([S] Sec. 4.2.2) at a task switch, and
per-task validation and test metrics.

**Members are data.** ``member_params`` holds one dict per member (its init parameters, seed,
EWC ``xi`` and data set, e.g. ``{"theta": 0.39, "r": 1.0, "seed": 0, "gamma": 0.5}``); ``labels``
are derived from it by ``zoo.utils.labels.member_labels`` and never parsed back.

**Across processes** (``zoo.training.distributed``, ``--trainer.strategy=ddp``): the members are independent,
so each rank trains its slice of the ``E G`` rows (member-parallel, :class:`~zoo.training.distributed.MemberParallel`)
on the whole stream; ``replicate`` runs at setup, before the strategy shards. Per-member Python
state (``init_params``, ``sets``, labels, EWC's ``xi``) stays whole; the training losses, validation
metrics and EWC's summary are gathered so that rank 0 logs every member. One member (a single
classifier) trains data-parallel instead: every rank reads the same batch and trains on its part of
it (:meth:`MultiHeadModule.rank_part`), DDP averages the gradients, the metrics are summed over ranks.

**Override points** (README table): ``activation(lam)`` and ``activation_grad(lam)`` (``phi`` and
``phi'`` of the hidden units, elementwise) and ``loss_grad(delta)`` (the derivative of the
per-sample loss with respect to the readout). The built-in activations are named by the
``activation`` argument; a subclass that overrides one of the methods is trained through them
(``custom_update``, by ``ZooModule.overrides``), and ``activation_grad`` falls back to autograd of
``activation``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchmetrics import Metric

from zoo.models.base import ZooModule, check_positive_ints  # noqa: F401 (re-exported for the families)
from zoo.training.devices import kept_on
from zoo.training.distributed import MemberParallel, all_members, is_sharded
from zoo.training.ensemble import layer_schemes, member_params, multi_head_weights, resolve_members
from zoo.training.evaluation import log_at_global_step
from zoo.training.ewc import EWC, EWCState, ensemble_state
from zoo.utils.labels import MAX_MEMBER_TAGS, member_labels
from zoo.training.logs import log_scalars
from zoo.training.progress import Progress
from zoo.training.progress import attached_trainer
from zoo.training.task_switch import TaskSwitchAtBatchEnd

ACTIVATIONS = ("erf", "relu", "sigmoid", "linear", "tanh")
"""The built-in ``phi`` (``erf`` is ``erf(lam / sqrt 2)``, [S] Sec. 2.2)."""


# The built-ins in the scaled variable ``u = kappa lam`` that the student's SGD kernel runs on
# (erf: ``phi = erf(u)``, ``u = lam / sqrt 2``); ``phi'(lam) = dphi_const * dphi_u(u)``.
def kappa(name: str) -> float:
    return 1.0 / math.sqrt(2.0) if name == "erf" else 1.0


def dphi_const(name: str) -> float:
    return math.sqrt(2.0 / math.pi) if name == "erf" else 1.0


def phi_u(name: str, u: Tensor) -> Tensor:
    if name == "erf":
        return torch.erf(u)
    if name == "relu":
        return torch.relu(u)
    if name == "sigmoid":
        return torch.sigmoid(u)
    if name == "tanh":
        return torch.tanh(u)
    return u


def dphi_u(name: str, u: Tensor, phi: Tensor) -> Tensor | None:
    """``phi'(lam) / dphi_const`` from ``u`` and ``phi`` (None for linear: it is 1)."""
    if name == "erf":
        return torch.exp(-(u * u))
    if name == "relu":
        return (u > 0).to(u.dtype)
    if name in ("sigmoid", "tanh"):
        return phi - phi * phi if name == "sigmoid" else 1 - phi * phi
    return None


def phi(name: str, lam: Tensor) -> Tensor:
    """The built-in activation ``name`` at ``lam``."""
    return phi_u(name, lam * kappa(name))


def phi_grad(name: str, lam: Tensor) -> Tensor:
    """``phi'(lam)`` of the built-in activation ``name``, in closed form."""
    u = lam * kappa(name)
    grad = dphi_u(name, u, phi_u(name, u))
    return torch.ones_like(lam) if grad is None else dphi_const(name) * grad


class BuiltinActivation(str):
    """A built-in activation's name that is also its function: ``module.activation`` reads as the
    name (``"erf"``: what the mean-field theory and the callbacks dispatch on) and calls as ``phi``.
    Set on a module only when its class does not override ``activation``."""

    def __call__(self, lam: Tensor) -> Tensor:
        return phi(str(self), lam)


class MemberMean(Metric):
    """Mean of a per-sample quantity for every ensemble member, (E,): a ``torchmetrics.Metric``, so
    the sums reduce across devices (accuracy: the mean of ``argmax == y``)."""

    full_state_update = False

    def __init__(self, members: int) -> None:
        super().__init__()
        self.add_state("total", torch.zeros(members, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: Tensor) -> None:
        """``values`` (E, N): one value per member and sample."""
        self.total += values.detach().sum(-1).to(self.total)
        self.count += values.shape[-1]

    def compute(self) -> Tensor:
        return self.total / self.count


def _task_from_buffer(module: "MultiHeadModule", incompatible_keys) -> None:
    module.task_index = int(module.task)


class MultiHeadModule(MemberParallel, Progress, TaskSwitchAtBatchEnd, ZooModule):
    """Base of ``MultiHeadStudent`` and ``MultiHeadClassifier``: members, replication over data sets,
    EWC at the switch, the override points, per-task ``validation_step``/``test_step``.

    A subclass sets ``sets_arg`` (its constructor argument holding ``G``, set from the datamodule),
    ``sets_attr`` (the datamodule's attribute giving ``G``; its ``set_params`` name the sets),
    and ``sizes_shared_with_data``, and implements ``consolidation_fisher(x, y,
    task)`` and ``eval_metrics``/``update_eval``.
    """

    fast_steps, batch_format = ("activation", "activation_grad", "loss_grad"), "stream"
    sets_arg = "teacher_sets"
    sets_attr = "teacher_sets"
    whole_stream = True
    """Every process reads the whole step schedule (``zoo.cli``: no distributed sampler), also with one
    member (``E G`` is known only at setup) and data-parallel, where :meth:`rank_part` splits each batch."""

    # -- construction ---------------------------------------------------------------------------------
    def init_members(self, init, init_heads, init_later_heads, ewc: EWC | dict | None) -> tuple[dict, EWC | None, dict]:
        """The checked schemes, the EWC settings (a checkpoint's dict made an ``EWC``) and the plain
        hyperparameters to record for them (a subclass passes these to ``save_own_hyperparameters``)."""
        self.init_progress()
        schemes = layer_schemes(init, init_heads, init_later_heads)
        if isinstance(ewc, dict):
            ewc = EWC(**ewc)
        plain = {key: scheme.spec() for key, scheme in schemes.items()} | ({"ewc": asdict(ewc)} if ewc else {})
        return schemes, ewc, plain

    def build_members(self, schemes: dict, ewc: EWC | None, seed, grid: bool, ensemble: int | None, sets: int,
                      n_tasks: int, w_shape: tuple[int, int], head_shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """Resolve the members, remember their parameters and return ``W`` (E G, *w_shape) and the
        heads (E G, n_tasks, *head_shape) of every member, each initialisation repeated ``G = sets`` times."""
        name = type(self).__name__
        check_positive_ints(name, **{self.sets_arg: sets})
        xis = [float(x) for x in ewc.xi] if ewc is not None and isinstance(ewc.xi, (list, tuple)) else None
        members = resolve_members(name, schemes, seed, xis, grid, ensemble)
        self.schemes, self.xis, self.G = members.schemes, members.xis, int(sets)
        self.init_params = member_params(members.schemes, members.E, members.seeds, members.xis)
        self.sets: list[dict] = [{"set": g} for g in range(self.G)]
        self.register_buffer("task", torch.tensor(0))
        # the task on the host: read at every step, and reading the (GPU) buffer would wait for the GPU
        self.task_index = 0
        self.register_load_state_dict_post_hook(_task_from_buffer)
        self.ewc_config = ewc
        W, heads = multi_head_weights(members, n_tasks, w_shape, head_shape)
        return W.float().repeat_interleave(self.G, 0), heads.float().repeat_interleave(self.G, 0)

    def set_activation(self, activation: str) -> None:
        """``activation_name``, and unless a subclass overrides ``activation(lam)``, ``activation``
        as a :class:`BuiltinActivation` (the name, callable)."""
        if activation not in ACTIVATIONS:
            raise ValueError(f"{type(self).__name__}: activation = {activation!r}; allowed: {', '.join(ACTIVATIONS)}")
        self.activation_name = str(activation)
        if not self.overrides("activation"):
            self.activation = BuiltinActivation(activation)

    def _ewc_state(self) -> EWCState | None:
        """Buffers for EWC of ``W``, with one ``xi`` per member if ``xi`` is a list."""
        state = ensemble_state(self.ewc_config, self.xis, self.G, {"W": self.W.shape})
        return None if state is None else state.to(self.W.device)

    # -- members as data ------------------------------------------------------------------------------
    @property
    def ensemble(self) -> int:
        """Number of members ``E`` held here (initialisations times data sets; while the members are
        sharded across processes, this rank's: the tensors' leading dimension). All: ``n_members()``."""
        return self.W.shape[0]

    def n_members(self) -> int:
        """``E``, every member, also while sharded (``zoo.training.distributed.MemberParallel``)."""
        return self.W.shape[0] if self.member_range is None else self.member_range[2]

    def keep_members(self, lo: int, hi: int) -> None:
        """Members ``lo:hi`` only (``zoo.training.distributed``): the tensors are sliced, and EWC's per-member
        ``xi`` with them; the other per-member state is kept whole and read through ``member_slice``."""
        super().keep_members(lo, hi)
        self._ewc_config_all = self.ewc.config if self.ewc is not None else None
        if self.ewc is not None and isinstance(self.ewc.config.xi, (list, tuple)):
            self.ewc.config = replace(self.ewc.config, xi=list(self.ewc.config.xi[lo:hi]))

    def show_all_members(self) -> Callable[[], None]:
        back = super().show_all_members()
        if self.ewc is None:
            return back
        local, self.ewc.config = self.ewc.config, self._ewc_config_all

        def restore() -> None:
            back()
            self.ewc.config = local
        return restore

    def across_ranks(self, values: Tensor) -> Tensor:
        """Per-member values computed here -> the whole run's, equal on every rank (a collective
        across processes; call on every rank): member-parallel, every member's (gathered);
        data-parallel, the mean over the ranks' equal parts of the batch; one process: ``values``."""
        if is_sharded(self):
            return self.all_member_values(values)
        if not self.data_parallel:
            return values
        total = values.detach().clone()
        dist.all_reduce(total)
        return total / dist.get_world_size()

    @property
    def data_parallel(self) -> bool:
        """True when one member trains across several processes (every rank its part of each batch)."""
        trainer = attached_trainer(self)
        return (trainer is not None and trainer.world_size > 1 and not is_sharded(self)
                and dist.is_available() and dist.is_initialized())

    def kept_on_device(self, t: Tensor) -> Tensor:
        """``t`` on this module's device, copied there once (``zoo.training.devices.kept_on``): a test set that
        the forgetting callbacks evaluate again and again (the datamodules hand out the same tensors)."""
        return kept_on(self, t, self.W.device, keep=2 * self.n_tasks)  # one x and one y per task

    def rank_part(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Data-parallel: this rank's contiguous part of the samples of ``batch`` (``x`` (..., N, n),
        ``y`` (..., N)); otherwise ``batch``. With ``N`` a multiple of the world size the parts are
        equal, so the average of their mean gradients is the whole batch's."""
        if not self.data_parallel:
            return batch
        world, rank = dist.get_world_size(), dist.get_rank()
        part = dict(batch)
        part["y"] = batch["y"].tensor_split(world, dim=-1)[rank]
        part["x"] = batch["x"].tensor_split(world, dim=-2)[rank]
        return part

    @property
    def member_params(self) -> list[dict]:
        """One dict per member of what tells it apart: the init parameters, seed and ``xi`` that vary
        (``zoo.training.ensemble.member_params``) and, with several data sets, its set's parameters (e.g.
        ``gamma``; member ``e`` is initialisation ``e // G`` on data set ``e mod G``)."""
        if self.G == 1:
            return [dict(p) for p in self.init_params]
        # an init parameter named like a data set's (EntropyMix's gamma beside the teachers' gamma)
        # is qualified, so that neither overwrites the other
        taken = {k for s in self.sets for k in s}
        inits = [{f"init.{k}" if k in taken else k: v for k, v in p.items()} for p in self.init_params]
        return [{**p, **s} for p in inits for s in self.sets]

    @property
    def labels(self) -> list[str]:
        """One label per member from the parameters that vary, e.g. ``theta=0.3927,gamma=0.5``."""
        key = (self.G, repr(self.sets))  # kept: the training step names members on every batch
        if getattr(self, "_labels", (None,))[0] != key:
            self._labels = (key, member_labels(self.member_params))
        return list(self._labels[1])

    @property
    def base_labels(self) -> list[str]:
        """One label per initialisation (what varies across them, data sets left out)."""
        return member_labels(self.init_params)

    @property
    def set_index(self) -> Tensor:
        """The data set of every member held, (E,): ``e mod G`` of its index ``e`` in the whole ensemble."""
        lo = 0 if self.member_range is None else self.member_range[0]
        return (torch.arange(self.ensemble, device=self.W.device) + lo) % self.G

    # -- override points ------------------------------------------------------------------------------
    def activation(self, lam: Tensor) -> Tensor:
        """``phi(lam)`` of the hidden units, elementwise. Override to train another activation."""
        return phi(self.activation_name, lam)

    def activation_grad(self, lam: Tensor) -> Tensor:
        """``phi'(lam)``: closed form for the built-ins, autograd of :meth:`activation` when a
        subclass overrides it."""
        if not self.overrides("activation"):
            return phi_grad(self.activation_name, lam)
        with torch.enable_grad():
            z = lam.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.activation(z).sum(), z)
        return grad

    def loss_grad(self, delta: Tensor) -> Tensor:
        """The derivative of the per-sample loss with respect to the readout's output, as a function
        of the residual ``delta``: ``Delta = y_hat - y`` for the student's ``1/2 Delta^2`` ([S] Eq. 6),
        ``softmax - onehot(y)`` for the classifier's cross-entropy; both losses' derivative is
        ``delta`` itself. Override to train another loss."""
        return delta

    @property
    def custom_update(self) -> bool:
        """Whether a subclass overrides an override point (``ZooModule.overrides``): the student's blocked
        SGD then calls them on ``lam``; else the built-ins run in closed form (in ``u = kappa lam``)."""
        return any(self.overrides(m) for m in self.fast_steps)

    # -- data sets ------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Match the datamodule: sizes, and ``G`` data sets (each initialisation replicated ``G``
        times on the first setup; a checkpoint then reloads the replicated ensemble). Every stage:
        ``lightning test --ckpt_path`` builds the module from its config before loading the weights."""
        dm = getattr(attached_trainer(self), "datamodule", None)
        if dm is None:
            return
        name = type(self).__name__
        for attr in self.sizes_shared_with_data:
            theirs = getattr(dm, attr, None)
            if isinstance(theirs, int) and theirs != getattr(self, attr):
                raise ValueError(f"{name}: {attr} = {getattr(self, attr)} but the datamodule has {attr} = {theirs}")
        G = int(getattr(dm, self.sets_attr, 1))
        if G != self.G:
            if self.G != 1:
                raise ValueError(f"{name}: {self.sets_arg} = {self.G} but the datamodule has {G} data sets")
            self.replicate(G)
        self.sets = self.set_params(dm)
        world = attached_trainer(self).world_size
        if world > 1 and self.n_members() == 1:
            self.check_data_parallel(dm, world)
        if self.ewc_config is not None and not callable(getattr(dm, "fisher_data", None)):
            raise TypeError(f"{name}: ewc needs a datamodule with fisher_data(task, n) to estimate the Fisher")

    sizes_shared_with_data: tuple[str, ...] = ()

    def check_data_parallel(self, dm, world: int) -> None:
        """One member across ``world`` processes trains data-parallel; raise if this module cannot."""
        raise ValueError(f"{type(self).__name__}: one member cannot train across {world} processes; allowed: "
                         f"an ensemble of at least devices x num_nodes = {world} members, or strategy 'auto' on one device")

    def on_train_start(self) -> None:
        from torch.utils.data import DistributedSampler

        loader = self.trainer.train_dataloader
        if isinstance(getattr(loader, "sampler", None), DistributedSampler):
            # a distributed sampler would deal the schedule's steps out to the ranks, breaking the tasks' order
            raise ValueError(f"{type(self).__name__} reads a step schedule that every process must read whole: build "
                             "the Trainer with use_distributed_sampler=False (the zoo's CLI does so for strategy 'ddp')")

    def set_params(self, dm) -> list[dict]:
        """One dict per data set of ``dm``, its ``set_params`` (e.g. ``{"gamma": 0.5}``; else the index)."""
        return [dict(s) for s in getattr(dm, "set_params", None) or [{"set": g} for g in range(self.G)]]

    @torch.no_grad()
    def replicate(self, G: int) -> None:
        """Repeat every initialisation ``G`` times (parameters and per-member buffers)."""
        for name, param in list(self.named_parameters(recurse=False)):
            setattr(self, name, nn.Parameter(param.detach().repeat_interleave(G, 0), requires_grad=param.requires_grad))
        self.G = G
        from zoo.training.hparams import store_hparams

        store_hparams(self, **{self.sets_arg: G})
        self.ewc = self._ewc_state()

    # -- EWC at the switch ----------------------------------------------------------------------------
    def on_task_switch(self, old: int, new: int) -> None:
        """Called with the weights at the end of task ``old``, before any step of task ``new``:
        consolidates ``old`` for EWC if configured (anchors ``W``, stores its Fisher, logs its
        summary). Override to add behaviour at a switch."""
        if self.ewc is None or not self.ewc_config.consolidates(old, self.n_tasks):
            return
        x, y = self.trainer.datamodule.fisher_data(old, self.ewc_config.samples)
        F = self.consolidation_fisher(x.to(self.W.device), y.to(self.W.device), old)
        self.ewc.consolidate({"W": self.W.detach()}, {"W": F})
        with all_members(self):
            summary = self.ewc.summary()
        log_scalars(self.trainer, {f"ewc/{k}": v for k, v in summary.items()}, step=self.event_step())

    def begin_task(self, task: int) -> None:
        """At a training batch of ``task``: switch if it is a new one (a datamodule without
        ``task_at`` switches here, at the new task's first step) and, before the first step on an
        EWC penalty, check that SGD is stable on it."""
        if task == self.task_index:
            return
        if self._task_ended != self.task_index:
            self._switch_step = self.global_step
            self.on_task_switch(self.task_index, task)
        if self.ewc is not None and self.ewc.active:
            with all_members(self):  # every rank decides on every member: all raise, or none
                self.ewc.check_step_size(self.lr, self.labels, type(self).__name__, "lr")
        self.task.fill_(task)
        self.task_index = task

    logs_on_samples = False
    """True: the module logs at ``samples_seen`` (Lightning's ``step`` key) instead of ``global_step``."""

    def event_step(self) -> int:
        """Where a switch's summary is logged: the step of the switch on the module's log axis."""
        return self.samples_seen if self.logs_on_samples else self._switch_step

    # -- evaluation -----------------------------------------------------------------------------------
    def eval_metrics(self) -> dict[str, Metric]:
        """Fresh metrics of one task (name -> a per-member ``Metric``)."""
        raise NotImplementedError

    def update_eval(self, metrics: dict[str, Metric], batch: dict[str, Tensor], task: int) -> None:
        """Update ``metrics`` with an evaluation batch of ``task``."""
        raise NotImplementedError

    def _metrics(self, stage: str, task: int) -> dict[str, Metric]:
        """The metrics of ``stage`` and ``task``, made for the members held (they grow at setup, and
        a rank of a member-parallel run holds its slice: its metrics are its own, never summed)."""
        if getattr(self, "eval_members", None) != (self.ensemble, self.member_range):
            self.eval_store = self.member_metrics(nn.ModuleDict({
                f"{s}{t}": nn.ModuleDict(self.eval_metrics()) for s in ("val", "test") for t in range(self.n_tasks)
            }).to(self.W.device))
            self.eval_members = (self.ensemble, self.member_range)
        return self.eval_store[f"{stage}{task}"]

    def _evaluate(self, stage: str, batch: dict[str, Tensor]) -> None:
        task = int(batch["task"])
        if not 0 <= task < self.n_tasks:
            raise ValueError(f"{type(self).__name__}: {stage} batch of task {task} but the module has {self.n_tasks} heads")
        with torch.no_grad():
            self.update_eval(self._metrics(stage, task), self.rank_part(batch), task)

    def _log_eval(self, stage: str) -> None:
        """Log ``<stage>/task<t>/<metric>`` (mean over members) and, for up to ``MAX_MEMBER_TAGS``
        members, ``<stage>/task<t>/<metric>/<label>``; tasks numbered from 1. ``self.log`` gives the
        printed table of ``lightning validate|test``; inside ``fit`` a module on the samples axis writes
        the loggers itself, at ``samples_seen`` (``self.log`` would write at ``global_step``)."""
        if getattr(self, "eval_members", None) != (self.ensemble, self.member_range):
            return
        labels, metrics, E = self.labels, {}, self.n_members()
        for task in range(self.n_tasks):
            for name, metric in self.eval_store[f"{stage}{task}"].items():
                if not metric.update_called:
                    continue
                values = self.all_member_values(metric.compute().float())
                metrics[f"{stage}/task{task + 1}/{name}"] = values.mean()
                if 1 < E <= MAX_MEMBER_TAGS:
                    metrics |= {f"{stage}/task{task + 1}/{name}/{label}": v for label, v in zip(labels, values)}
                metric.reset()
        if metrics:  # plain numbers, one host sync: already equal on every rank (gathered or summed over ranks)
            metrics = dict(zip(metrics, torch.stack([v.float() for v in metrics.values()]).tolist()))
        # Lightning's printed table of `lightning validate|test` holds only what self.log sends to
        # the loggers: outside fit, let it; inside fit, keep the samples axis
        own_axis = self.logs_on_samples and self.trainer.state.fn == "fit"
        # equal on every rank: the max over ranks is each one's value (and Lightning does not warn)
        self.log_dict(metrics, logger=not own_axis, sync_dist=True, reduce_fx="max")
        if metrics and not own_axis:
            log_at_global_step(self)
        if own_axis:
            log_scalars(self.trainer, metrics)  # at the module's axis, samples_seen (zoo.training.logs.log_step)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")
