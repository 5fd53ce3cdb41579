"""``RunCheckpoint``: the zoo's default checkpoint, ``last.ckpt`` in the run folder, refreshed during the run.

Lightning's default ``ModelCheckpoint`` saves at the end of an epoch. Most zoo recipes are one
long epoch (a streamed SGD schedule) or a few epochs of many optimizer steps, so a run killed
mid-way left no checkpoint, and one stopped by ``max_steps`` saved a state that Lightning reads
back as "epoch finished" (a resumed run then trained nothing). This callback saves

- every ``every`` fraction of the run's optimizer steps (default 10%), or every
  ``every_n_train_steps`` if given, mid-epoch, after a training batch;
- when ``max_steps`` is reached mid-epoch, the state after that batch, which resumes mid-epoch;
- at the end of an epoch in which a save fell due or the run ends, the end-of-epoch state;
- when the run is stopped by SIGTERM (cluster schedulers send it before killing a job), after the
  batch in progress (Lightning raises ``SIGTERMException`` there; the CLI then exits with 143).

Steps are ``global_step`` (optimizer updates as the module counts them). A module may advance
``global_step`` by many per batch, so a save is due when a multiple of the interval is crossed,
not hit exactly. Only ``last.ckpt`` is kept (``save_top_k=0``); pass a ``ModelCheckpoint`` of your
own in ``trainer.callbacks`` for more.

It is a ``ModelCheckpoint`` so that Lightning adds no default one and resolves the run folder's
``checkpoints/`` for it; the saves themselves go through public API only (``trainer.save_checkpoint``,
``format_checkpoint_name``, ``last_model_path``), none of the base class's protected helpers.

Files are written by :class:`AtomicLocalCheckpointIO` while the callback is attached (unless the
trainer was given a checkpoint plugin of its own): the bytes go to a file beside the target,
which is then renamed onto it, so a run killed at any moment leaves the previous ``last.ckpt`` or
the new one, whole. Lightning's default writes a temporary file in the
system's temp folder and moves it (an fsspec transaction: 1.5 ms a save against 0.9 ms for the
quickstart's 11.6 kB, ``torch.save`` included, on the shared 2-core machine); where that folder
is on another file system, the move is a copy onto the target that a kill can leave half-written.
"""
from __future__ import annotations

import io
import math
import os
from typing import Any
from weakref import proxy

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from zoo.training.logs import batch_progress


class CheckpointMismatch(ValueError):
    """The checkpoint cannot be the start of a run of the configured model (raised before training)."""


class AtomicLocalCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves to a local path are atomic and cheap: ``torch.save`` into
    memory, the bytes written to ``<path>.part-<pid>`` in the same folder, then ``os.replace`` onto
    ``path`` (one rename within a file system: readers see the old file or the new, never a part).
    URLs and ``storage_options`` go to Lightning's own save. No ``fsync``, as Lightning's: a killed
    process cannot tear the file. The rename onto the old file is the costliest step of a small
    checkpoint's save on ext4 (0.2-5 ms: ``auto_da_alloc`` writes the new file's blocks out
    first), and kept for that: a power cut after it leaves the old file or the new one, where an
    exchange of the two names (``renameat2``, ~0.05 ms; measured) could leave an empty file."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        path = os.fspath(path)
        part = f"{path}.part-{os.getpid()}"
        try:
            try:
                f = open(part, "wb")
            except FileNotFoundError:  # the folder is made at the first save only (~0.1 ms a save)
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                f = open(part, "wb")
            with f:
                f.write(buffer.getbuffer())
            os.replace(part, path)
        except BaseException:
            if os.path.exists(part):
                os.remove(part)
            raise


class RunCheckpoint(ModelCheckpoint):
    """``last.ckpt`` every ``every`` of the run (a fraction in (0, 1]) or every ``every_n_train_steps``
    optimizer steps, resumable mid-epoch; ``dirpath`` defaults to ``<run folder>/checkpoints``."""

    def __init__(self, every: float = 0.1, every_n_train_steps: int | None = None, dirpath: str | None = None) -> None:
        if not (isinstance(every, (int, float)) and 0.0 < every <= 1.0):
            raise ValueError(f"RunCheckpoint: every = {every!r}; allowed: a fraction of the run in (0, 1]")
        if every_n_train_steps is not None and (int(every_n_train_steps) != every_n_train_steps
                                                 or every_n_train_steps < 1):
            raise ValueError(f"RunCheckpoint: every_n_train_steps = {every_n_train_steps!r}; "
                             "allowed: a positive integer, or null to use `every`")
        # every_n_train_steps=0 / every_n_epochs=0: the base class's own schedule is off, this class decides
        # (on_exception too, below: no save_on_exception, which lightning 2.5.0's ModelCheckpoint lacks)
        super().__init__(dirpath=dirpath, save_last=True, save_top_k=0, every_n_train_steps=0, every_n_epochs=0,
                         save_on_train_epoch_end=True, enable_version_counter=False)
        self.every = float(every)
        self.every_n = every_n_train_steps
        self._interval: int | None = every_n_train_steps
        self._first_step: int | None = None
        self._prev_step = 0
        self._epoch_due = False
        self._saved_step: int | None = None  # global_step of this run's last save
        self._replaced_io: TorchCheckpointIO | None = None  # the trainer's own, put back at teardown
        self._state_key: str | None = None

    # ---- how files are written ------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._replaced_io = None
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default, no plugin given
            self._replaced_io = trainer.strategy.checkpoint_io
            trainer.strategy.checkpoint_io = AtomicLocalCheckpointIO()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._replaced_io is not None:
            trainer.strategy.checkpoint_io, self._replaced_io = self._replaced_io, None
        super().teardown(trainer, pl_module, stage)

    # ---- schedule -----------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._first_step = self._prev_step = trainer.global_step

    def _steps_in_run(self, trainer: pl.Trainer, per_batch: int) -> float:
        """The run's length in optimizer steps, from its budget: ``max_steps`` and/or epochs."""
        by_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else math.inf
        batches = trainer.num_training_batches
        epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs > 0 else math.inf
        by_epochs = per_batch * batches * epochs if math.isfinite(batches) else math.inf
        return min(by_steps, by_epochs)

    def _due(self, trainer: pl.Trainer) -> bool:
        g = trainer.global_step
        if self._interval is None:  # fixed after the first batch, when the steps a batch takes are known
            per_batch = max(1, g - (self._first_step or 0))
            total = self._steps_in_run(trainer, per_batch)
            self._interval = max(1, math.ceil(self.every * total)) if math.isfinite(total) else per_batch * 1000
        prev, self._prev_step = self._prev_step, g
        return g // self._interval > prev // self._interval

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        due = self._due(trainer)
        at_budget = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
        if not (due or at_budget):
            return
        if batch_progress(trainer).is_last_batch:
            # the epoch ends with this batch (max_steps may end the run there too): save the
            # end-of-epoch state, after the epoch's validation, which Lightning resumes cleanly
            self._epoch_due = True
            return
        self._save_last(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        last_epoch = trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch + 1
        completed = batch_progress(trainer).is_last_batch
        # cut short by max_steps: the batch-end save above holds the resumable mid-epoch state
        if completed and (self._epoch_due or last_epoch):
            self._save_last(trainer)
        self._epoch_due = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A validation that runs at the step of a save just made (``val_check_interval``) is saved
        with it: Lightning does not run it again when resuming from a batch-end checkpoint, so its
        points must come before the checkpoint, which a run resumed from it keeps
        (``zoo.training.resume_events``). Otherwise no saves are keyed to validation: the schedule covers every run."""
        if not trainer.sanity_checking and self._saved_step == trainer.global_step:
            self._saved_step = None
            self._save_last(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # SIGTERM is raised between batches, at a consistent state; any other exception may leave
        # the module half-updated, so the last scheduled checkpoint stays the one to resume from
        if isinstance(exception, SIGTERMException):
            self._save_last(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the schedule above saved the run's end; a run that saved nothing (no batch) saves once
        if self._saved_step is None:
            self._save_last(trainer)

    def _save_last(self, trainer: pl.Trainer) -> bool:
        """Write ``last.ckpt`` unless nothing is to be saved (not fitting, a dry run, saved at this step
        already); returns whether it wrote."""
        if (trainer.fast_dev_run or trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING
                or self._saved_step == trainer.global_step):
            return False
        # what was logged up to this checkpoint reaches the disk first: callbacks write to the loggers
        # directly (no flush), and a run killed after the checkpoint must not lose what it covers
        for logger in trainer.loggers:
            logger.save()
        path = self.format_checkpoint_name({}, self.CHECKPOINT_NAME_LAST)
        self.last_model_path = path  # before saving: it is part of the state saved
        trainer.save_checkpoint(path, self.save_weights_only)
        self._saved_step = trainer.global_step
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))
        return True

    @property
    def state_key(self) -> str:
        """ModelCheckpoint's key (its settings' repr), built once: Lightning formats it for every hook
        call of every batch (~1,300 a quickstart run), and the settings it names never change here."""
        if self._state_key is None:
            self._state_key = super().state_key
        return self._state_key

    # the schedule's position must survive a resume, or the resumed run would save at other steps
    def state_dict(self) -> dict:
        return {**super().state_dict(), "interval": self._interval}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        if self.every_n is None:
            self._interval = state_dict.get("interval")
