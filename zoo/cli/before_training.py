"""Before the first training batch: where an error is the settings' fault (``zoo.cli.errors``).

Lightning logs "Seed set to 0", "GPU available: ..." and warnings before a ``setup`` check can
fail; :func:`hold_stderr` keeps stderr back until the first batch (:class:`FirstBatch`), so that a
setting's message is the first line the user sees. :func:`before_first_batch` marks an exception
with whether training had started.
"""
from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator

from lightning.pytorch import Callback

STARTED = "_zoo_training_started"


class HeldStderr:
    """What Python and the loggers write to stderr (Lightning's "Seed set to 0", "GPU available: ...",
    warnings), held back until training starts, so that a configuration error is the first line."""

    def __init__(self) -> None:
        self.real, self.buffer = sys.stderr, io.StringIO()
        loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                           if isinstance(v, logging.Logger))]
        self.handlers = [h for lg in loggers for h in lg.handlers
                         if isinstance(h, logging.StreamHandler) and h.stream is self.real]
        for h in self.handlers:
            h.setStream(self.buffer)
        sys.stderr = self.buffer

    def release(self, replay: bool = True) -> str:
        """Restore stderr; write what was held back to it when ``replay``. Returns that text."""
        if sys.stderr is self.buffer:
            sys.stderr = self.real
        for h in self.handlers:
            if h.stream is self.buffer:
                h.setStream(self.real)
        held, self.buffer = self.buffer.getvalue(), io.StringIO()
        if replay and held:
            self.real.write(held)
            self.real.flush()
        return held


_held: HeldStderr | None = None


def hold_stderr() -> None:
    global _held
    _held = HeldStderr()


def release_stderr(replay: bool = True) -> str:
    """Let stderr through (what was held back written first when ``replay``); returns that text."""
    return _held.release(replay) if _held is not None else ""


def stop_holding() -> None:
    global _held
    release_stderr()
    _held = None


def training_started(err: BaseException) -> bool:
    return bool(getattr(err, STARTED, False))


class FirstBatch(Callback):
    """Notes when the first batch starts (errors before it are the settings' fault) and lets stderr
    through from then on. The batches of the sanity check still count as "before"."""

    started = False

    def _start(self, trainer) -> None:
        if not self.started and not trainer.sanity_checking:
            self.started = True
            release_stderr()

    def on_train_batch_start(self, trainer, *args) -> None:
        self._start(trainer)

    def on_validation_batch_start(self, trainer, *args) -> None:
        self._start(trainer)

    def on_test_batch_start(self, trainer, *args) -> None:
        self._start(trainer)

    def on_predict_batch_start(self, trainer, *args) -> None:
        self._start(trainer)


@contextlib.contextmanager
def before_first_batch(trainer) -> Iterator[None]:
    """Run a subcommand on ``trainer``, marking any exception with whether training had started, so
    :func:`zoo.cli.errors.one_line_errors` reports errors from ``setup``/``prepare_data``/checkpoint loading as
    settings and lets errors from training keep their traceback."""
    flag = FirstBatch()
    trainer.callbacks.insert(0, flag)
    try:
        yield
    except BaseException as err:
        with contextlib.suppress(AttributeError):
            setattr(err, STARTED, flag.started)
        raise
    finally:
        with contextlib.suppress(ValueError):
            trainer.callbacks.remove(flag)
