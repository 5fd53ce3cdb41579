"""Shuffled training loaders that a mid-epoch checkpoint resumes where they stopped.

Lightning saves ``state_dict()`` of a training DataLoader that has one in a mid-epoch checkpoint
and hands it to ``load_state_dict`` before it iterates the loader again (its loops do this only
for the DataLoader object itself, not for its sampler). A plain shuffled DataLoader has no
state: a resumed run started a fresh permutation, and Lightning, counting batches from the
restored index, ended that epoch early with different data.

:class:`ResumableBatches` yields the batches of one seeded permutation of ``range(n)`` per epoch
(exactly the batches of ``DataLoader(shuffle=True, generator=g)``, or of a ``BatchSampler`` over a
``RandomSampler(generator=g)``), and can skip the first ``skip`` batches of the next epoch without
fetching them. :class:`ResumableLoader` is a DataLoader using one as its ``sampler`` or
``batch_sampler``; its state is the generator's state at the start of the epoch and the batches
served since: loading it replays that epoch's permutation and skips what was served, so the
resumed run sees the same batches in the same order, and the generator then advances as in the
uninterrupted run. Between epochs (all batches served) the state is the generator's current
state, from which the next epoch's permutation is drawn.

Batches are counted where the loader hands them out, so worker prefetching does not count.
Lightning does not prefetch a loader whose length it knows (these have one). Under DDP, Lightning
puts its ``DistributedSampler`` into a ``batch_sampler=ResumableBatches`` loader; a loader that
passes a ``ResumableBatches`` as its ``sampler`` (batches fetched whole, ``batch_size=None``) stays
single-process.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler


class ResumableBatches(BatchSampler):
    """A ``BatchSampler`` whose next epoch starts ``skip`` batches in. With the same ``sampler`` it
    yields exactly ``BatchSampler``'s batches; it keeps ``BatchSampler``'s constructor so that under
    DDP Lightning can put its ``DistributedSampler`` in place of ``sampler`` (each rank then skips
    its own served batches of the epoch's permutation, which ``set_epoch`` fixes)."""

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool = False) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.skip = 0

    @property
    def generator(self) -> torch.Generator | None:
        """The shuffling generator whose state a checkpoint keeps (None for a ``DistributedSampler``,
        whose permutation is a function of its seed and epoch)."""
        return getattr(self.sampler, "generator", None)

    def __iter__(self) -> Iterator[list[int]]:
        # a generator function: the permutation is drawn at the first batch, as RandomSampler draws it
        skip, self.skip = self.skip, 0
        batches = super().__iter__()
        for _ in range(skip):
            next(batches)
        yield from batches


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> ResumableBatches:
    """The batches of ``DataLoader(range(n), batch_size, shuffle=True, generator=generator)``, resumable."""
    return ResumableBatches(RandomSampler(range(n), generator=generator), batch_size)


class ResumableLoader(DataLoader):
    """A DataLoader whose sampler or batch sampler is a :class:`ResumableBatches`, with the
    ``state_dict`` / ``load_state_dict`` that Lightning saves and restores (see the module docstring)."""

    def _resumable(self) -> ResumableBatches:
        for s in (self.batch_sampler, self.sampler):
            if isinstance(s, ResumableBatches):
                return s
        raise TypeError(f"{type(self).__name__} needs a ResumableBatches as its sampler or batch_sampler; "
                        f"got sampler {type(self.sampler).__name__}, batch_sampler {type(self.batch_sampler).__name__}")

    def __iter__(self) -> "_Counted":
        batches = self._resumable()
        self._epoch_start = None if batches.generator is None else batches.generator.get_state()
        self._served = batches.skip
        return _Counted(super().__iter__(), self)

    def state_dict(self) -> dict:
        batches = self._resumable()
        start, served = getattr(self, "_epoch_start", None), getattr(self, "_served", 0)
        if served == 0 or served >= len(batches):  # before the first epoch, or after one
            return {"generator": None if batches.generator is None else batches.generator.get_state(), "served": 0}
        return {"generator": start, "served": served}

    def load_state_dict(self, state_dict: dict) -> None:
        batches = self._resumable()
        if (state_dict["generator"] is None) != (batches.generator is None):
            raise ValueError(f"{type(self).__name__}: the checkpoint's loader state is for a run "
                             f"{'with' if batches.generator is None else 'without'} a distributed sampler; "
                             "allowed: resume with the number of devices the run started with")
        if batches.generator is not None:
            batches.generator.set_state(state_dict["generator"])
        batches.skip = int(state_dict["served"])
        self._epoch_start, self._served = None, 0


class _Counted:
    """The loader's iterator, counting the batches it hands out into ``loader._served``."""

    def __init__(self, iterator, loader: ResumableLoader) -> None:
        self._iterator, self._loader = iterator, loader

    def __iter__(self) -> "_Counted":
        return self

    def __next__(self):
        batch = next(self._iterator)
        self._loader._served += 1
        return batch

    def __len__(self) -> int:
        return len(self._iterator)
