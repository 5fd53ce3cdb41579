"""Many scalars at one step as one TensorBoard event.

Lightning's ``TensorBoardLogger.log_metrics`` writes each scalar as an event of its own
(``SummaryWriter.add_scalar``), and each event passes through the writer's queue of 10 to its
thread, with a checksum computed in Python: ~50 us a scalar, ~4 ms for the 75 mode strengths a
quickstart record logs. A TensorBoard ``Summary`` holds any number of values, so the zoo writes a
record's scalars as one event with one value per tag: the same tags, steps and float32 values,
read back alike by TensorBoard and ``EventAccumulator`` (tests/training/test_scalar_events.py), at ~0.4 ms
a record (``bench/bench_logging.py``). Every other logger, and a ``TensorBoardLogger`` that a user
subclassed to change ``log_metrics`` or gave a ``prefix``, gets ``log_metrics`` as before. The event
goes through the writer's public ``file_writer`` (``FileWriter.add_summary``)."""
from __future__ import annotations

from collections.abc import Mapping

from lightning.fabric.loggers import TensorBoardLogger
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only


def write_scalars(logger: Logger, values: Mapping[str, float], step: int) -> None:
    """``logger.log_metrics(values, step=step)``, with a plain ``TensorBoardLogger``'s scalars (numbers)
    written as one event. Rank 0 writes, as ``log_metrics`` does."""
    if not _plain_tensorboard(logger):
        logger.log_metrics(dict(values), step=step)
    elif rank_zero_only.rank == 0:  # log_metrics is rank_zero_only: nothing is written elsewhere
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter

        writer = logger.experiment
        # the writer's public event file (torch's own add_hparams writes through it); None once the
        # writer was closed, when log_metrics' add_scalar opens a new one (then this path again)
        file_writer = getattr(writer, "file_writer", None) if isinstance(writer, SummaryWriter) else None
        if file_writer is None:  # closed, or tensorboardX's writer where torch's is missing
            logger.log_metrics(dict(values), step=step)
            return
        summary = Summary()
        add = summary.value.add  # (half the time of a list of Summary.Value)
        for k, v in values.items():
            add(tag=k, simple_value=float(v))  # simple_value, as add_scalar writes: the value rounded to float32
        file_writer.add_summary(summary, step)


def _plain_tensorboard(logger: Logger) -> bool:
    """A ``TensorBoardLogger`` whose ``log_metrics`` is Lightning's own and puts no prefix on the tags.

    The prefix is read from Lightning's private ``_prefix`` (it has no public accessor; listed in
    docs/development.md): a release without it gets ``log_metrics``, which puts on the prefix itself."""
    return (isinstance(logger, TensorBoardLogger) and type(logger).log_metrics is TensorBoardLogger.log_metrics
            and getattr(logger, "_prefix", None) == "")
