"""Stop a run whose loss went NaN or infinite, with a message that says where and why.

Both checks cost one host synchronisation per call, so a module calls them once per
``training_step`` (on a GPU each sync stalls the queue of kernels): a module that takes several
steps inside one ``training_step`` stacks their losses, ``(n, E)``, and checks them together.
Under ``torch.distributed`` (several processes, each with a slice of the members, or a
data-parallel model) the decision is taken for the whole run: the count of non-finite losses is
summed over the ranks before it is read, so every rank raises together (a rank that raised alone
would leave the others waiting in their next collective). Both functions are then collectives:
call them on every rank, the same number of times. A data-parallel module (every rank holds all
the members and sees its own part of the batch) passes ``replicated=True`` to ``drop_diverged``,
so that every rank drops the same members.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


class DivergenceError(FloatingPointError):
    """Raised by a zoo module when its loss is not finite; training stops before the step."""


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _summed_over_ranks(counts: Tensor) -> list[int]:
    """``counts`` (int64) summed over the processes of the run; the one host sync of a check."""
    if _world()[0] > 1:
        counts = counts.clone()
        dist.all_reduce(counts)  # on the tensors' device: gloo for CPU, NCCL for CUDA
    return counts.tolist()


def _local_labels(labels: Sequence[str], n: int) -> Sequence[str]:
    """The labels of this rank's ``n`` members: ``labels`` itself, or, when a module passes the labels
    of the whole ensemble while it holds a slice (``zoo.training.distributed``), that slice."""
    world, rank = _world()
    if len(labels) != n and world > 1 and len(labels) >= world:
        from zoo.training.distributed import member_bounds

        lo, hi = member_bounds(len(labels), world, rank)
        if hi - lo == n:
            return labels[lo:hi]
    return labels


def _names(labels: Sequence[str], index: list[int]) -> list[str]:
    return [labels[i] if i < len(labels) else str(i) for i in index]


def _everyone(local: list) -> list:
    """The lists of every rank, concatenated in rank order (a collective; only on the failure path)."""
    if _world()[0] == 1:
        return local
    parts: list = [None] * _world()[0]
    dist.all_gather_object(parts, local)
    return [x for part in parts for x in part]


def check_finite(losses: Tensor, *, step: int, labels: Sequence[str], hint: str) -> None:
    """Raise ``DivergenceError`` naming the step and the members whose loss is NaN/inf.

    ``losses`` holds one loss per ensemble member, ``(E,)``, or the losses of ``n`` consecutive
    steps, ``(n, E)``, the first of them at ``step`` (then the message names the first step at
    which each member diverged). ``labels`` names the members in ``losses`` (or the whole
    ensemble, when the module holds a slice of it). One host sync per call; under
    ``torch.distributed`` a collective that raises on every rank.
    """
    losses = losses.detach()
    bad = ~torch.isfinite(losses if losses.dim() == 2 else losses.reshape(1, -1))  # (n, E)
    if _summed_over_ranks(bad.sum().reshape(1))[0] == 0:
        return
    labels = _local_labels(labels, bad.shape[-1])
    first = torch.where(bad.any(0), bad.int().argmax(0), -1).tolist()  # the first bad step of each member
    local = [(step + s, name) for s, name in zip(first, _names(labels, list(range(len(first))))) if s >= 0]
    everyone = list(dict.fromkeys(_everyone(local)))  # once each, should ranks pass the same members
    at = sorted({s for s, _ in everyone})
    where = f"step {at[0]}" if len(at) == 1 else f"steps {at[0]}-{at[-1]}"
    raise DivergenceError(
        f"the loss is not finite at {where} for ensemble member(s) {', '.join(name for _, name in everyone)}: "
        f"training diverged and was stopped before the update. {hint}"
    )


def drop_diverged(losses: Tensor, alive: Tensor, *, step: int, labels: Sequence[str], hint: str,
                  replicated: bool = False) -> Tensor:
    """The ensemble's survivors after this step's losses (E,): members whose loss is NaN/inf drop
    out with a warning that names them and the step; ``DivergenceError`` when none is left (in the
    whole run, when several processes share the members).

    For sweeps over thousands of initialisations, where the edge of stability is part of what is
    being mapped: one diverging member should not end the others' run. Returns the new mask (E,).
    One host sync per call; under ``torch.distributed`` a collective.

    ``replicated``: every process holds these same members (data-parallel: each its own part of
    the batch, so a member's loss may be non-finite on one rank only). A member then drops out
    where its loss is not finite on any rank, and every rank returns the same mask: ranks that
    kept different members would train different replicas. Otherwise each rank decides for the
    members it holds (member-parallel) and only the counts are summed.
    """
    finite = torch.isfinite(losses.detach())
    if replicated and _world()[0] > 1:
        bad_anywhere = (~finite).to(torch.int64)
        dist.all_reduce(bad_anywhere)  # the one collective: which members any rank saw diverge
        finite = bad_anywhere == 0
    survivors = alive & finite
    newly = alive & ~finite
    counts = torch.stack([newly.sum(), survivors.sum()])
    n_new, n_left = counts.tolist() if replicated else _summed_over_ranks(counts)
    if n_new:
        local = _names(_local_labels(labels, newly.shape[0]), torch.nonzero(newly).flatten().tolist())
        names = local if replicated else list(dict.fromkeys(_everyone(local)))
        if not n_left:
            raise DivergenceError(f"the loss is not finite at step {step} for every remaining ensemble member "
                                  f"({', '.join(names)}): training diverged and was stopped. {hint}")
        if _world()[1] == 0:  # one warning for the run, not one per process
            warnings.warn(f"ensemble member(s) {', '.join(names)} diverged at step {step} (loss not finite) and "
                          f"were dropped: they get no gradient from now on and their measures are no longer "
                          f"logged. {hint}", RuntimeWarning, stacklevel=2)
    return survivors
