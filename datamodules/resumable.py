"""Training loaders that a mid-epoch checkpoint resumes exactly.

Lightning saves ``state_dict()`` of a training DataLoader that has one in a mid-epoch checkpoint
and hands it to ``load_state_dict`` before it iterates the loader again (its loops do this only
for the DataLoader object itself, not for its sampler); the resumed epoch still ends after
``len(loader)`` batches counted from the start of the epoch. Two kinds:

**Schedules** (``ScheduleLoader``). The streamed datamodules (``TeacherStudent``,
``MNISTContinual``) serve one epoch that is the whole training schedule: batch ``i`` is a pure
function of the seed and ``i``. This loader

- always has the length of the whole schedule (a loader whose length were the batches left would
  end a resumed epoch early by the batches already trained: issue #17);
- counts the batches it has handed out (in the main process, so also with workers), saves the
  position of the next one, and after ``load_state_dict`` starts there;
- refuses a state saved for another schedule (``fingerprint``: the settings that decide what
  batch ``i`` is), since continuing it would silently train a different run.

**Shuffled data** (``ResumableLoader``). :class:`ResumableBatches` yields the batches of one
seeded permutation of ``range(n)`` per epoch (exactly the batches of ``DataLoader(shuffle=True, generator=g)``, or of a ``BatchSampler`` over a
``RandomSampler(generator=g)``), and can skip the first ``skip`` batches of the next epoch without
fetching them. :class:`ResumableLoader` is a DataLoader using one as its ``sampler`` or
``batch_sampler``; its state is the generator's state at the start of the epoch and the batches
served since: loading it replays that epoch's permutation and skips what was served, so the
resumed run sees the same batches in the same order, and the generator then advances as in the
uninterrupted run. Between epochs (all batches served) the state is the generator's current
state, from which the next epoch's permutation is drawn. An iterator that is made and dropped
before it serves a batch changes nothing: resuming from a checkpoint saved at an epoch's end under
``max_steps``, Lightning makes one, and torch's iterator draws a seed from the loader's generator
when it is made; the next iterator starts from the state before it.

Batches are counted where the loader hands them out, so worker prefetching does not count.
Lightning does not prefetch a loader whose length it knows (these have one). Under DDP, Lightning
puts its ``DistributedSampler`` into a ``batch_sampler=ResumableBatches`` loader; a loader that
passes a ``ResumableBatches`` as its ``sampler`` (batches fetched whole, ``batch_size=None``) stays
single-process.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler


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
        if self._handed_out_nothing():
            # the last iterator made served no batch (resuming at an epoch's end under max_steps,
            # Lightning makes one and drops it): undo what making it drew from the generator (torch's
            # iterator draws a seed from it), so that this one serves what that one would have
            if self._epoch_start is not None:
                batches.generator.set_state(self._epoch_start)
            batches.skip = self._skipped
        self._epoch_start = None if batches.generator is None else batches.generator.get_state()
        self._served = self._skipped = batches.skip
        return _Counted(super().__iter__(), self)

    def _handed_out_nothing(self) -> bool:
        """An iterator was made and has served no batch yet."""
        return hasattr(self, "_skipped") and self._served == self._skipped

    def state_dict(self) -> dict:
        batches = self._resumable()
        served = getattr(self, "_served", 0)
        if not hasattr(self, "_skipped") or served >= len(batches):  # before the first epoch, or after one
            return {"generator": None if batches.generator is None else batches.generator.get_state(), "served": 0}
        # within an epoch (an iterator that served nothing yet included: its epoch starts again)
        return {"generator": self._epoch_start, "served": served}

    def load_state_dict(self, state_dict: dict) -> None:
        batches = self._resumable()
        if (state_dict["generator"] is None) != (batches.generator is None):
            raise ValueError(f"{type(self).__name__}: the checkpoint's loader state is for a run "
                             f"{'with' if batches.generator is None else 'without'} a distributed sampler; "
                             "allowed: resume with the number of devices the run started with")
        if batches.generator is not None:
            batches.generator.set_state(state_dict["generator"])
        batches.skip = int(state_dict["served"])
        for name in ("_epoch_start", "_served", "_skipped"):  # no iterator of this state yet
            self.__dict__.pop(name, None)


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


class _FromSampler(Sampler[int]):
    """Indices ``start .. n - 1``; its length is ``n`` (the whole schedule) whatever ``start`` is."""

    def __init__(self, n: int, start: int = 0) -> None:
        self.n, self.start = int(n), int(start)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.n))


class ScheduleLoader(DataLoader):
    """Batches ``dataset[start], dataset[start + 1], ...`` (each item is a whole batch), resumable.

    Args:
        dataset: a map-style dataset whose item ``i`` is batch ``i`` of the schedule.
        owner: the datamodule's name, for error messages.
        fingerprint: what decides the batches (seed, sizes, switches): a checkpoint saved with
            another fingerprint is refused.
        start: the batch to start at when no state is loaded (the trainer's position).
        num_workers: DataLoader workers.
    """

    def __init__(self, dataset: Dataset, owner: str, fingerprint: dict[str, Any], start: int = 0,
                 num_workers: int = 0) -> None:
        super().__init__(dataset, batch_size=None, sampler=_FromSampler(len(dataset), start),
                         num_workers=num_workers)
        self.owner, self.fingerprint = owner, dict(fingerprint)
        self._next = int(start)

    def __iter__(self) -> Iterator[Any]:
        self._next = self.sampler.start
        return self._counted(super().__iter__())

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            self._next += 1
            yield batch
        self.sampler.start = 0  # a later epoch, if any, is the schedule from its start

    def state_dict(self) -> dict[str, Any]:
        return {"next_batch": self._next, "num_batches": len(self.dataset), "fingerprint": self.fingerprint}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = {"num_batches": state_dict.get("num_batches"), **(state_dict.get("fingerprint") or {})}
        here = {"num_batches": len(self.dataset), **self.fingerprint}
        changed = {k: (saved.get(k), here.get(k)) for k in saved.keys() | here.keys() if saved.get(k) != here.get(k)}
        if changed:
            diff = ", ".join(f"{k} = {a!r} in the checkpoint but {b!r} now" for k, (a, b) in sorted(changed.items()))
            raise ValueError(f"{self.owner}: cannot resume the stream exactly: {diff}; resume with the data "
                             "settings of the run that saved the checkpoint")
        position = int(state_dict["next_batch"])
        if position != self.sampler.start:
            raise ValueError(f"{self.owner}: cannot resume the stream exactly: the checkpoint's stream stopped before "
                             f"batch {position} but its training step says batch {self.sampler.start}")
        self.sampler.start = self._next = position
