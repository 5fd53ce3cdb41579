"""How far training has come, in the units callbacks schedule on (``callbacks.base.PeriodicCallback``).

``trainer.global_step`` is Lightning's count of optimizer updates and the zoo never writes it.
A module whose batch is more than one step of the theory's clock (a block of online-SGD samples
in the teacher-student setting, [S] Sec. 2.2) counts that clock here.

The count is the run's, the same on every process (a schedule that differed across ranks would
leave one waiting in a collective), and a run on N processes counts what the one-process run on
the same global batches counts. Data-parallel (every process holds all the members and
Lightning's distributed sampler, or a datamodule's own, deals each its own part of every batch:
SparseAutoencoder, BetaVAE, DeepLinearNet on minibatches, :func:`dealt_out`) a module counts its
part with ``per_rank=True``: the sampler pads the data so that every rank gets as many samples,
hence batches of one size at every step, and the run's step took ``n * world_size`` (no
collective; the padding, fewer than ``world_size`` repeated samples an epoch, counts as trained
on, as it is). Every rank reads the whole stream
(member-parallel, ``zoo.training.distributed``), a module splits the batch itself (the classifier), or
every rank's batch is the whole task (full-batch GD: DeepLinearNet, GDLN, whose ranks then take
the one-process step): ``n``, the samples of the run's step.
"""
from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler

from zoo.training import resume_events
from zoo.training.distributed import is_sharded


class Progress:
    """Mixin for a LightningModule: ``samples_seen`` (a buffer, so it is saved in checkpoints and
    lives on the module's device) and ``epochs_done``. Call ``count_samples(n)`` once per batch.

    The count is kept on the host as well and read from there: reading the buffer on a GPU would
    wait for every queued kernel, at each step and in each callback that schedules on samples.
    The buffer is written (no sync) at each count and read once when a state dict is loaded.
    """

    def init_progress(self) -> None:
        """Call in ``__init__`` after ``LightningModule.__init__``."""
        self.register_buffer("samples_seen_", torch.zeros((), dtype=torch.int64))
        self.samples_counted = 0
        self.register_load_state_dict_post_hook(_count_from_buffer)

    def count_samples(self, n: int, *, per_rank: bool = False) -> None:
        """Count one step's ``n`` samples; ``per_rank``: ``n`` is what this process got of the step's
        batch, counted ``world_size`` times where a distributed sampler dealt the batch out
        (:func:`data_parallel_ranks`; see the module docstring)."""
        if per_rank:
            n = int(n) * data_parallel_ranks(self)
        self.samples_counted += int(n)
        self.samples_seen_.fill_(self.samples_counted)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Record in every checkpoint of the module, whichever callback saves it, where a run resumed
        from it picks up its TensorBoard curves (``zoo.training.resume_events``: the x-axis step of the weights
        saved and the time of the save)."""
        trainer = attached_trainer(self)
        if trainer is not None:
            checkpoint[resume_events.KEY] = resume_events.resume_point(trainer)
        super().on_save_checkpoint(checkpoint)

    @property
    def samples_seen(self) -> int:
        """Training samples consumed so far by the run, every process's (for online SGD: the SGD steps taken)."""
        return self.samples_counted

    @property
    def epochs_done(self) -> int:
        """Completed passes over the training data (0 when no trainer is attached)."""
        trainer = attached_trainer(self)
        return int(trainer.current_epoch) if trainer is not None else 0


def _count_from_buffer(module, incompatible_keys) -> None:
    """After ``load_state_dict`` (a checkpoint, a resumed run): the host count is the loaded one."""
    module.samples_counted = int(module.samples_seen_)


def data_parallel_ranks(module) -> int:
    """The processes that each train ``module`` whole on their own part of the data: the Trainer's
    world size where its training batches are dealt out (:func:`dealt_out`), else 1 (one process,
    members sharded (``zoo.training.distributed``), or every rank reading the whole batch)."""
    trainer = attached_trainer(module)
    if trainer is None or trainer.world_size == 1 or is_sharded(module) or not dealt_out(trainer):
        return 1
    return int(trainer.world_size)


def dealt_out(trainer) -> bool:
    """Whether ``trainer``'s training batches are dealt out to its processes, each taking its part:
    the training loader's sampler is a ``DistributedSampler`` of more than one replica (Lightning's
    own, put into a user's loader, or a datamodule's that deals itself, as
    ``datamodules.regression.ShardedEpochShuffle``). Not so where every rank reads every batch (a
    full batch, a member-parallel ensemble): then a rank's batch is the run's."""
    loader = trainer.train_dataloader
    for sampler in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if isinstance(sampler, DistributedSampler):
            return sampler.num_replicas > 1
    return False


def attached_trainer(module):
    """The module's Trainer, or None when it is used on its own (``module.trainer`` raises then)."""
    try:
        return module.trainer
    except RuntimeError:
        return None
