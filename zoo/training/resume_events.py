"""Which TensorBoard events of a stopped run a resumed run keeps, so that every point shows once.

A resumed run logs into the folder of the run it resumes (``zoo.cli``) and asks TensorBoard to drop
the stopped run's points from the checkpoint's step on (``purge_step``: TensorBoard discards every
event at a step >= it that was written before the resumed run's first event). What the stopped run
logged after its checkpoint is logged again by the resumed run, which repeats that stretch of
training bit for bit; what it logged before is not.

The checkpoint's own step ``K`` holds both kinds. Before the save, the callbacks of the batch that
reached ``K`` logged what they measured on the weights after ``K`` updates; after it, the next batch
logged its loss at ``K`` (the loss of the weights it starts from) and a validation due at ``K`` ran.
A step alone cannot tell them apart, so the checkpoint records its step and the wall-clock time of
the save (:func:`resume_point`, written by ``zoo.training.checkpoint.RunCheckpoint``): the resumed run purges
from ``K`` and writes back the stopped run's events at ``K`` from before the save
(:func:`events_before_save`, :func:`write_back`), unchanged, their own times included. An event's
time is taken when it is logged, by the process that saved the checkpoint, on the same clock.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_only

from zoo.training.logs import log_step

#: the checkpoint key of :func:`resume_point`
KEY = "zoo_resume_point"


def resume_point(trainer: pl.Trainer) -> dict[str, float | int]:
    """What a checkpoint saved now records for the run resumed from it: ``step``, the x-axis step of
    the weights saved (``zoo.training.logs.log_step``), and ``saved_at``, the wall-clock time of the save."""
    return {"step": log_step(trainer), "saved_at": time.time()}


def event_files(folder: Path) -> list[Path]:
    """The folder's event files in the order TensorBoard reads them (by name: the second each was
    opened in comes first in the name)."""
    return sorted(p for p in Path(folder).glob("events.out.tfevents.*") if p.is_file())


def events_before_save(folder: Path, step: int, saved_at: float) -> list[Any]:
    """The events of ``folder`` that TensorBoard shows at ``step`` (after the purges of earlier
    resumes) and that were logged by ``saved_at``: summaries only (scalars, images, text, ...), as
    ``Event`` protos, in the order they were written."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    shown: list[Any] = []
    for path in event_files(folder):
        for record in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(record)
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                shown = [e for e in shown if e.step < event.step]  # TensorBoard's purge at a restart
            elif event.HasField("summary") and event.step == step:
                shown.append(event)
    return [e for e in shown if e.wall_time <= saved_at]


@rank_zero_only
def write_back(logger: pl.loggers.TensorBoardLogger, events: list[Any]) -> None:
    """Write ``events`` into ``logger``'s event file as they were (step and time), after its purge
    (rank 0: the one that writes the loggers' files)."""
    if not events:
        return
    writer = logger.experiment.file_writer  # made with the experiment, the purge written first
    for event in events:
        writer.add_event(event, walltime=event.wall_time)
    writer.flush()
