"""What every zoo callback shares: when it is due, and writing straight to the loggers.

Callbacks write with ``logger.log_metrics(..., step=<the module's axis>)`` rather than ``self.log`` so
that their ``every_n_steps`` is honoured exactly, independent of the Trainer's
``log_every_n_steps``; Lightning's loggers write on rank 0 only.
"""
from __future__ import annotations

import lightning.pytorch as pl

from zoo.training.distributed import all_members, gather_outputs
from zoo.training.history import packed, unpacked

# the run's loggers and folder: re-exported so that callbacks import from this module alone
from zoo.training.logs import log_figure, log_matrix, log_scalars, log_step, output_path, overlay_charts, warn_once, write_table  # noqa: F401


def check(who: str, name: str, value, ok: bool, allowed: str) -> None:
    """Unless ``ok``, the ValueError of a callback's bad argument: ``<who>: <name> = <value>; allowed: <allowed>``."""
    if not ok:
        raise ValueError(f"{who}: {name} = {value!r}; allowed: {allowed}")


def check_count(who: str, name: str, value: int, minimum: int = 1) -> int:
    """``value`` as an int; a ValueError naming ``who`` and ``name`` unless it is an integer >= ``minimum``."""
    check(who, name, value, not isinstance(value, bool) and int(value) == value >= minimum,
          "a positive integer" if minimum == 1 else f"an integer >= {minimum}")
    return int(value)


def member_charts(trainer: pl.Trainer, title: str, labels: list[str], pattern: str) -> None:
    """A CUSTOM SCALARS chart per member (``overlay_charts``) of the tags ``pattern.format(<its label, escaped>)``."""
    import re

    overlay_charts(trainer, title, {lbl: pattern.format(re.escape(lbl)) for lbl in labels})


def shown_members(callback: pl.Callback, labels: list[str], cap: int | None, arg: str,
                  what: str = "draws images of") -> list[str]:
    """The first ``cap`` of the members ``labels`` (all when ``cap`` is None); when that leaves some
    out, says so once, with how many and the argument that shows them (``cap`` 0 means "none": silent)."""
    labels = list(labels)
    if cap is None or cap >= len(labels):
        return labels
    if cap > 0:
        name = type(callback).__name__
        warn_once(f"{name} {what} the first {cap} of the {len(labels)} members; {len(labels) - cap} left out "
                  f"(from {labels[cap]}): set {name}'s {arg} to {len(labels)} to show every member")
    return labels[:cap]


class PeriodicCallback(pl.Callback):
    """A callback that works every ``every_n_steps`` units of its ``clock`` and costs nothing otherwise.

    ``unit`` says what the clock counts: ``"steps"`` (``trainer.global_step``, optimizer updates),
    ``"samples"`` (``pl_module.samples_seen``, e.g. the online-SGD steps of a teacher-student
    student, the theory's time ``alpha * d``) or ``"epochs"`` (``pl_module.epochs_done``). Scalars
    are logged on the module's axis (``zoo.training.logs.log_step``: ``global_step``, or ``samples_seen`` for a
    module that logs on samples), the same as its ``loss``, whatever the unit.
    """

    unit: str = "steps"
    NEEDS: tuple[str, ...] = ()  # the module's methods it reads, checked before training (a subclass may check more)

    def __init__(self, every_n_steps: int = 10) -> None:
        self.every_n_steps = check_count(type(self).__name__, "every_n_steps", every_n_steps)
        self._prev_step: int | None = None
        self.now = 0

    def clock(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
        """The count ``every_n_steps`` refers to (see ``unit``)."""
        if self.unit == "samples":
            return int(pl_module.samples_seen)
        if self.unit == "epochs":
            return int(pl_module.epochs_done)
        return trainer.global_step

    def due(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """True when the clock crossed a multiple of ``every_n_steps`` since the last call.

        A batch can advance the clock by many units (a block of online-SGD samples), so the
        clock can jump; call this once per ``on_train_batch_end``.
        """
        g = self.now = self.clock(trainer, pl_module)
        prev = g - 1 if self._prev_step is None or self._prev_step >= g else self._prev_step
        self._prev_step = g
        return g // self.every_n_steps > prev // self.every_n_steps

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, *self.NEEDS)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.now = self.clock(trainer, pl_module)
        # member-parallel (zoo.training.distributed): every rank gathers all members, rank 0 records and writes
        with all_members(pl_module):
            self.on_start(trainer, pl_module)
            # a resumed run starts at a checkpoint saved after this step's work was done and logged:
            # doing it again would add a second point at the same step
            if not resuming(trainer):
                self.on_due(trainer, pl_module, None)
        if resuming(trainer):  # the next due() counts from the checkpoint's step, as it did in the run that saved it
            self._prev_step = self.now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # the clock is the same on every rank (one stream, one step count), so all ranks enter together
        if self.due(trainer, pl_module):
            outputs = gather_outputs(pl_module, outputs)
            with all_members(pl_module):
                self.on_due(trainer, pl_module, outputs)

    def on_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Once, when training starts (before the first ``on_due``)."""

    def on_due(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs) -> None:
        """The callback's work: at the start of training (``outputs`` None) and every n steps."""

    def need(self, pl_module: pl.LightningModule, *methods: str) -> None:
        """Fail before training if the module lacks what this callback reads."""
        missing = [m for m in methods if not callable(getattr(pl_module, m, None))]
        if missing:
            raise TypeError(f"{type(self).__name__} needs a module with {', '.join(m + '()' for m in missing)}; "
                            f"{type(pl_module).__name__} has none")


class HistoryCallback(PeriodicCallback):
    """A periodic callback that records lists under ``HISTORY_KEYS``; the record is saved in
    checkpoints (tensors and numbers only, so it loads with ``weights_only``; each list of equal
    tensors as one, ``zoo.training.history``) and starts afresh at each ``fit`` before a checkpoint's state
    is restored."""

    HISTORY_KEYS: tuple[str, ...] = ()

    def __init__(self, every_n_steps: int = 10) -> None:
        super().__init__(every_n_steps)
        self._reset()

    def _reset(self) -> None:
        self.history: dict[str, list] = {k: [] for k in self.HISTORY_KEYS}

    def state_dict(self) -> dict:
        return {"history": packed(self.history)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = unpacked(state_dict["history"])

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._reset()

    def append(self, **values) -> None:
        """Each value appended to its list (tensors, not numpy arrays: the record loads with ``weights_only``)."""
        for key, value in values.items():
            self.history[key].append(value)


class AtTrainEnd(pl.Callback):
    """A callback whose work at the end of training reads every member: members may be sharded across
    processes until teardown (``zoo.training.distributed``), so every rank gathers them (a collective)
    and rank 0 alone runs ``publish``, which logs and writes."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with all_members(pl_module):
            if trainer.is_global_zero:
                self.publish(trainer, pl_module)

    def publish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The end-of-training work, on rank 0 with every member in the module."""


def resuming(trainer: pl.Trainer) -> bool:
    """True in a fit that resumed from a checkpoint taken after training had started."""
    return trainer.ckpt_path is not None and trainer.global_step > 0
