"""``ScheduleLoader``: a DataLoader over a fixed schedule of batches that resumes mid-epoch exactly.

The streamed datamodules (``TeacherStudent``, ``MNISTContinual``) serve one epoch that is the
whole training schedule: batch ``i`` is a pure function of the seed and ``i``. Lightning resumes
a mid-epoch checkpoint by restoring its batch counter and the state of every *stateful* loader
(one with ``state_dict``/``load_state_dict``, saved in the checkpoint's loop state); the epoch
still ends after ``len(loader)`` batches counted from the start of the epoch. So this loader

- always has the length of the whole schedule (a loader whose length were the batches left would
  end a resumed epoch early by the batches already trained: issue #17);
- counts the batches it has handed out (in the main process, so also with workers), saves the
  position of the next one, and after ``load_state_dict`` starts there;
- refuses a state saved for another schedule (``fingerprint``: the settings that decide what
  batch ``i`` is), since continuing it would silently train a different run.
"""
from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader, Dataset, Sampler


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
