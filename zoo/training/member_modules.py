"""Member-parallel training of an ensemble whose members are whole modules (an ``nn.ModuleList``).

``zoo.training.distributed.MemberParallel`` slices tensors whose first axis is the member axis. A
``BetaVAESweep`` holds E separate ``BetaVAE``s instead, so here every rank keeps the whole list
and trains only its members ``lo:hi`` (``zoo.training.distributed.member_bounds``): the others get no
gradient, and Adam (like SGD) skips a parameter whose ``grad`` is None, so this rank's optimizer
holds state for its own members only. The other members' weights on this rank are stale copies
that nothing reads until they are gathered.

Gathering is each member's tensors broadcast from the rank that trains it (its owner), in place:
afterwards every rank holds every member's current weights, and a stale copy stays harmless (it is
overwritten at the next gather). The optimizer's ``state_dict()`` is made the full one while
sharded (a ``state_dict`` post-hook, :meth:`ModuleMembers.track_optimizer`): each member's state
comes from its owner, so a checkpoint equals the single-process one and loads on any number of
processes (loaded whole on every rank: the state of members another rank trains is never used).
All of it is a collective: every rank calls it (the strategy's checkpoint and teardown do).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from zoo.training.distributed import MemberParallel, member_bounds


def owners(E: int, world: int) -> list[int]:
    """The rank that trains each of ``E`` members among ``world`` ranks."""
    out = []
    for r in range(world):
        lo, hi = member_bounds(E, world, r)
        out += [r] * (hi - lo)
    return out


class ModuleMembers(MemberParallel):
    """:class:`~zoo.training.distributed.MemberParallel` for members that are modules (see the module
    docstring). The class says which modules are its members (:meth:`member_modules`); its
    training step runs ``member_modules()[member_slice]`` only, and its ``configure_optimizers``
    passes each optimizer through :meth:`track_optimizer`."""

    def member_modules(self) -> list[nn.Module]:
        raise NotImplementedError(f"{type(self).__name__} must list its member modules (member_modules)")

    def n_members(self) -> int:
        return len(self.member_modules())

    def member_tensor_names(self) -> list[str]:
        return []  # nothing is sliced: every rank keeps every member

    def keep_members(self, lo: int, hi: int) -> None:
        self._sharded_names = []
        self.member_range = (lo, hi, self.n_members())

    def _broadcast_members(self) -> None:
        world = dist.get_world_size()
        for module, owner in zip(self.member_modules(), owners(self.n_members(), world)):
            for t in module.state_dict(keep_vars=True).values():
                if isinstance(t, Tensor):
                    dist.broadcast(t.data, src=owner)

    def show_all_members(self) -> Callable[[], None]:
        self._broadcast_members()
        return lambda: None  # the other members' copies stay: harmless, refreshed at the next gather

    # -- the optimizer's state --------------------------------------------------------------------------
    def track_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``optimizer`` (over this module's parameters), whose ``state_dict()`` holds every
        member's state, from its owner, while the module is sharded (a collective then)."""
        optimizer.register_state_dict_post_hook(self._full_optimizer_state)
        return optimizer

    def _full_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> dict:
        if self.member_range is None:
            return state
        params = [p for group in optimizer.param_groups for p in group["params"]]
        member_of = {id(p): k for k, m in enumerate(self.member_modules()) for p in m.parameters()}
        lo, hi, E = self.member_range
        # this rank's members' state, on the CPU (picklable across backends); the rest: from their owners
        mine = {i: {key: (v.cpu(), v.device == params[i].device) if isinstance(v, Tensor) else (v, False)
                    for key, v in s.items()}
                for i, s in state["state"].items() if lo <= member_of.get(id(params[i]), -1) < hi}
        parts: list[dict | None] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
        full = {i: s for i, s in state["state"].items() if id(params[i]) not in member_of}  # shared parameters
        for part in parts:
            for i, s in part.items():
                full[i] = {key: v.to(params[i].device) if on_param else v for key, (v, on_param) in s.items()}
        return {**state, "state": dict(sorted(full.items()))}


__all__ = ["ModuleMembers", "owners"]
