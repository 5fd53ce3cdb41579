"""Member-parallel ensembles: each process trains its own slice of an ensemble's members.

The zoo's ensembles (``DeepLinearNet``, ``MultiHeadStudent``, ``MultiHeadClassifier``, GDLN and
ReLU nets, ``BetaVAESweep``, ``SparseAutoencoder``) hold E independent members, so a phase
diagram is one fit. Across N processes (``--trainer.devices=N --trainer.strategy=ddp``, and
``--trainer.num_nodes``) nothing has to be averaged: every rank draws the same data stream and
trains members ``lo:hi`` of :func:`member_bounds`; callbacks and checkpoints see all E members,
gathered when they need them. The arithmetic of every member is the one of the single-process
run, so the results are equal (bit for bit on the deterministic CPU paths).

The pieces:

* :class:`MemberParallel`, a mixin for a module: which tensors carry the member axis
  (``member_tensor_names``), how many members there are (``n_members``), how to keep a slice
  (``keep_members``) and how to show every member for a moment (``members_gathered``).
* :class:`EnsembleDDP`, the strategy: Lightning's own DDP (its launcher, process group, cluster
  environments), which shards a :class:`MemberParallel` module with more than one member instead
  of wrapping it in ``DistributedDataParallel``, gives every rank the whole stream (no
  distributed sampler) and writes full checkpoints. Any other module trains data-parallel, as
  under plain DDP. The CLI runs it for ``--trainer.strategy=ddp`` (:func:`register`).
* :func:`gather_members`: a tensor with the member axis first, concatenated over the ranks.
* :func:`set_metric_sync`: whether torchmetrics metrics reduce their states across processes;
  :meth:`MemberParallel.member_metrics` sets it from the sharding (a rank's per-member states are
  its own members', never summed with another rank's).

Every function here that communicates is a collective: call it on every rank, never inside an
``is_global_zero`` branch.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

STRATEGY_NAME = "ddp"
_Metrics = TypeVar("_Metrics")


def member_bounds(E: int, world: int, rank: int) -> tuple[int, int]:
    """Members ``lo:hi`` of ``rank`` among ``world`` ranks: contiguous, in rank order, the first
    ``E % world`` ranks one member more (an ensemble that does not divide evenly)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank = {rank}, world = {world}; allowed: 0 <= rank < world")
    if E < world:
        raise ValueError(f"an ensemble of {E} members cannot be shared by {world} processes: "
                         f"allowed devices x num_nodes <= {E} (or strategy 'auto' on one device)")
    base, extra = divmod(E, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def gather_members(t: Tensor, E: int, dim: int = 0) -> Tensor:
    """``t`` holds this rank's members along ``dim`` (:func:`member_bounds` of ``E``); returns all
    ``E`` members in order, on every rank (a collective). Without a process group: ``t``."""
    world, rank = _world()
    if world == 1:
        return t
    bounds = [member_bounds(E, world, r) for r in range(world)]
    width = max(hi - lo for lo, hi in bounds)
    t = t.movedim(dim, 0).contiguous()
    if t.shape[0] != bounds[rank][1] - bounds[rank][0]:
        raise ValueError(f"gather_members: rank {rank} holds {t.shape[0]} members along dim {dim}; "
                         f"expected {bounds[rank][1] - bounds[rank][0]} of {E}")
    padded = t.new_zeros((width, *t.shape[1:]))
    padded[: t.shape[0]] = t  # all_gather wants one shape on every rank
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    full = torch.cat([p[: hi - lo] for p, (lo, hi) in zip(parts, bounds)])
    return full.movedim(0, dim)


class _ThisProcessOnly:
    """A metric's ``distributed_available_fn`` that says "no process group": torchmetrics then
    computes from this process's states alone. Keeps the function it replaced, to put it back."""

    def __init__(self, replaced: Callable[[], bool] | None) -> None:
        self.replaced = replaced

    def __call__(self) -> bool:
        return False


def _each_metric(metrics: Any) -> Iterator[Any]:
    from torchmetrics import Metric

    if isinstance(metrics, torch.nn.Module):
        yield from (m for m in metrics.modules() if isinstance(m, Metric))
    elif isinstance(metrics, dict):
        for v in metrics.values():
            yield from _each_metric(v)
    elif isinstance(metrics, (list, tuple)):
        for v in metrics:
            yield from _each_metric(v)
    else:
        raise TypeError(f"set_metric_sync: metrics = {type(metrics).__name__}; allowed: a torchmetrics Metric, "
                        "a module holding them (ModuleDict, ModuleList) or a dict, list or tuple of those")


def set_metric_sync(metrics: _Metrics, sync: bool) -> _Metrics:
    """Whether the torchmetrics ``Metric``s in ``metrics`` (one, a module holding some, or a dict,
    list or tuple of those) reduce their states across processes when computed; returns ``metrics``.

    ``sync=False`` sets each one's ``distributed_available_fn`` (a public argument of
    ``Metric``, read at every ``compute``, unlike ``sync_on_compute``, which a built metric has
    already copied) to one that finds no process group; ``sync=True`` puts back the function it
    replaced. Local, not a collective; idempotent."""
    for m in _each_metric(metrics):
        fn = m.distributed_available_fn
        if not sync and not isinstance(fn, _ThisProcessOnly):
            m.distributed_available_fn = _ThisProcessOnly(fn)
        elif sync and isinstance(fn, _ThisProcessOnly):
            m.distributed_available_fn = fn.replaced
    return metrics


class MemberParallel:
    """Mixin for a LightningModule whose E members are independent, so that ranks can train
    disjoint slices of them (:class:`EnsembleDDP`).

    The default covers a module whose members are the leading axis of some of its parameters and
    buffers (``W`` of shape (E, ...)): :meth:`member_tensor_names` lists them (by default every
    parameter and persistent buffer whose first dimension is ``n_members()``), :meth:`keep_members`
    slices them in place. A module with other per-member state (Python lists, metrics, a
    ``ModuleList`` of members) overrides :meth:`keep_members` and/or :meth:`members_gathered` and
    calls ``super()``. ``member_range`` is ``(lo, hi, E)`` while sharded, else ``None``.
    """

    member_range: tuple[int, int, int] | None = None
    # training_step output keys whose tensors hold this rank's members (first axis): callbacks get them gathered
    member_outputs: tuple[str, ...] = ()

    def n_members(self) -> int:
        """E, the number of members (all of them, also while sharded)."""
        raise NotImplementedError(f"{type(self).__name__} must say how many members it has (n_members)")

    def all_member_values(self, t: Tensor, dim: int = 0) -> Tensor:
        """``t`` holds this rank's members along ``dim`` (losses, outputs, metrics): every member's,
        on every rank (a collective while sharded; ``t`` itself otherwise, also under data-parallel
        DDP), contiguous (a reduction over a strided view may round otherwise than over the
        one-process tensor)."""
        if self.member_range is None:
            return t
        return gather_members(t, self.member_range[2], dim=dim).contiguous()

    def member_metrics(self, metrics: _Metrics) -> _Metrics:
        """``metrics`` (torchmetrics ``Metric``s whose states hold the members this module holds now:
        one, a module holding some, or a dict, list or tuple of those), made to follow the sharding;
        returns them. While sharded every rank evaluates its own members on the same batches, so a sum
        over the ranks would add other members' numbers (or count the batches twice): the states stay
        this rank's, and :meth:`all_member_values` gathers the computed values. Otherwise (one
        process, data-parallel DDP) they reduce across processes as torchmetrics does. Call it on
        metrics built for the members held: in ``__init__``, after ``super().keep_members`` and in
        :meth:`on_all_members_back` (:func:`set_metric_sync`)."""
        return set_metric_sync(metrics, sync=self.member_range is None)

    @property
    def member_slice(self) -> slice:
        """This rank's members, for indexing per-member lists kept whole (``init_params[s]``)."""
        return slice(None) if self.member_range is None else slice(*self.member_range[:2])

    def member_tensor_names(self) -> list[str]:
        """State-dict names of the tensors whose first axis is the member axis."""
        E = self.n_members() if self.member_range is None else self.member_range[1] - self.member_range[0]
        state = self.state_dict(keep_vars=True)
        return [k for k, v in state.items() if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == E]

    def _member_tensors(self) -> dict[str, Tensor]:
        state = self.state_dict(keep_vars=True)
        return {k: state[k] for k in self._sharded_names}

    def keep_members(self, lo: int, hi: int) -> None:
        """Make this module the ensemble of members ``lo:hi`` (before the optimizers are built)."""
        self._sharded_names = self.member_tensor_names()
        E = self.n_members()
        for t in self._member_tensors().values():
            t.data = t.data[lo:hi].clone()
        self.member_range = (lo, hi, E)

    def show_all_members(self) -> Callable[[], None]:
        """Put every member's state on this module, on every rank (a collective), and return the
        function that puts this rank's slice back. The override point for per-member state that is
        not a sliced tensor: extend it, and chain the function ``super()`` returned."""
        E = self.member_range[2]
        tensors = self._member_tensors()
        local = {k: t.data for k, t in tensors.items()}
        for t in tensors.values():
            t.data = gather_members(t.data, E)

        def back() -> None:
            for k, t in tensors.items():
                t.data = local[k]
        return back

    def on_all_members_back(self) -> None:
        """After :meth:`all_members_back`: rebuild what was sized for this rank's slice (metrics)."""

    @contextmanager
    def members_gathered(self) -> Iterator[None]:
        """Inside: every member on this module, on every rank (a collective on entry). Outside
        again: this rank's slice, unchanged. Nothing may train inside."""
        if self.member_range is None:
            yield
            return
        back, saved = self.show_all_members(), self.member_range
        self.member_range = None
        try:
            yield
        finally:
            self.member_range = saved
            back()

    def all_members_back(self) -> None:
        """End the sharding: every rank holds all members again (a collective)."""
        if self.member_range is None:
            return
        self.show_all_members()  # and the slice is not put back
        self.member_range = None
        self.on_all_members_back()


def is_sharded(module: Any) -> bool:
    return isinstance(module, MemberParallel) and module.member_range is not None


@contextmanager
def all_members(module: Any) -> Iterator[Any]:
    """``module`` with all its members (gathered if sharded; a collective then), for callbacks."""
    if is_sharded(module):
        with module.members_gathered():
            yield module
    else:
        yield module


def gather_outputs(module: Any, outputs: Any) -> Any:
    """A ``training_step``'s outputs with the entries the module names in ``member_outputs`` (dict
    keys whose tensors hold this rank's members along the first axis) gathered over the ranks.

    Declared, not guessed from shapes: with an uneven split a tensor's length can equal one rank's
    member count and not another's, and a rank that gathers alone waits for ever. The zoo's own
    modules return every member already (they gather once per step for the divergence check)."""
    keys = getattr(module, "member_outputs", ())
    if not is_sharded(module) or not isinstance(outputs, dict) or not keys:
        return outputs
    E = module.member_range[2]
    return {k: gather_members(v, E) if k in keys else v for k, v in outputs.items()}


_STRATEGY: type | None = None


def _strategy_class() -> type:
    global _STRATEGY
    if _STRATEGY is None:
        _STRATEGY = _build_strategy_class()
    return _STRATEGY


def _build_strategy_class() -> type:
    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DistributedSampler
    from lightning.pytorch.trainer.states import TrainerFn

    class EnsembleDDP(DDPStrategy):
        """Lightning's DDP, member-parallel for a :class:`MemberParallel` module with more than
        one member (see the module docstring), data-parallel for anything else."""

        strategy_name = "ddp_members"

        def _member_parallel(self) -> bool:
            m = self.lightning_module
            return isinstance(m, MemberParallel) and m.n_members() > 1 and self.world_size > 1

        @property
        def distributed_sampler_kwargs(self) -> dict[str, Any]:
            if self.lightning_module is not None and self._member_parallel():
                # the mark process_dataloader looks for: every member-parallel rank must read the whole stream
                return {"num_replicas": 1, "rank": 0}
            return super().distributed_sampler_kwargs

        def process_dataloader(self, dataloader: object) -> object:
            sampler = getattr(dataloader, "sampler", None)
            if self._member_parallel() and isinstance(sampler, DistributedSampler) and sampler.num_replicas == 1:
                raise ValueError(
                    "member-parallel training needs every process to read the whole data stream: build the Trainer "
                    "with use_distributed_sampler=False (the zoo's CLI does so for its ensembles)")
            return super().process_dataloader(dataloader)

        def setup(self, trainer) -> None:
            if not self._member_parallel():
                return super().setup(trainer)
            module = self.lightning_module
            self.accelerator.setup(trainer)
            self.precision_plugin.convert_module(self.model)
            self.model_to_device()
            if module.member_range is None:
                module.keep_members(*member_bounds(module.n_members(), self.world_size, self.global_rank))
            if trainer.state.fn == TrainerFn.FITTING:
                # built on the slice, already on this rank's device
                self.setup_optimizers(trainer)
            self.setup_precision_plugin()

        def lightning_module_state_dict(self) -> dict[str, Any]:
            module = self.lightning_module
            if not is_sharded(module):
                return super().lightning_module_state_dict()
            with module.members_gathered():
                # the state dict holds the gathered tensors themselves: they outlive the context
                return module.state_dict()

        def optimizer_state(self, optimizer) -> dict[str, Any]:
            state = super().optimizer_state(optimizer)
            module = self.lightning_module
            if not is_sharded(module):
                return state
            return _map_member_state(module, optimizer, state, lambda t, E: gather_members(t, E))

        def load_optimizer_state_dict(self, checkpoint) -> None:
            module = self.lightning_module
            if is_sharded(module):
                lo, hi, _ = module.member_range
                checkpoint = dict(checkpoint)
                checkpoint["optimizer_states"] = [
                    _map_member_state(module, opt, s, lambda t, E: t[lo:hi].clone(), full=True)
                    for opt, s in zip(self.optimizers, checkpoint["optimizer_states"])]
            super().load_optimizer_state_dict(checkpoint)

        def teardown(self) -> None:
            # after fit every rank holds the whole ensemble again, as a single-process run leaves it
            module = self.lightning_module
            if is_sharded(module):
                full = [self.optimizer_state(opt) for opt in self.optimizers]
                module.all_members_back()
                for opt, state in zip(self.optimizers, full):
                    opt.load_state_dict(state)
            super().teardown()

    return EnsembleDDP


def _map_member_state(module, optimizer, state: dict, fn, full: bool = False) -> dict:
    """An optimizer's state dict with ``fn`` applied to each per-member state tensor (those of a
    member-axis parameter with the member axis first): gather for saving, slice for loading."""
    from lightning.pytorch.core.optimizer import LightningOptimizer

    opt = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
    lo, hi, E = module.member_range
    names = {id(p): n for n, p in module.named_parameters()}
    member = set(module._sharded_names)
    index = [p for group in opt.param_groups for p in group["params"]]
    width = E if full else hi - lo
    out = {"state": {}, "param_groups": state["param_groups"]}
    for i, s in state["state"].items():
        is_member = names.get(id(index[i])) in member
        out["state"][i] = {k: fn(v, E) if is_member and isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == width else v
                           for k, v in s.items()}
    return out


_registered = False


def register() -> None:
    """Make ``strategy: ddp`` (and ``ddp_members``) :class:`EnsembleDDP` in this process: the CLI
    calls it. ``ddp_spawn``/``ddp_notebook`` are left as Lightning has them."""
    global _registered
    if _registered:
        return
    from lightning.pytorch.strategies import StrategyRegistry

    cls = _strategy_class()
    for name in (STRATEGY_NAME, cls.strategy_name):
        StrategyRegistry.register(name, cls, description="zoo: member-parallel ensembles on Lightning's DDP",
                                  override=True)
    _registered = True


def EnsembleDDP(**kwargs: Any):
    """The strategy object, for a ``Trainer`` built in Python: ``Trainer(strategy=EnsembleDDP())``."""
    return _strategy_class()(**kwargs)
