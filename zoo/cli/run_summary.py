"""The block a CLI run prints at its end: where its folder, figures and checkpoint are, and how to
look at its curves.

::

    zoo: fit finished
      run folder   lightning_logs/version_3
      figures      singular_values.png, balance.png
      checkpoint   lightning_logs/version_3/checkpoints/last.ckpt
      TensorBoard  tensorboard --logdir lightning_logs

:func:`run_summary` builds the text from the folder alone (pure: it reads file names, nothing
else); ``zoo.cli`` prints it on rank 0 after ``fit``, ``validate`` and ``test``, and after a run
stopped by SIGTERM or a diverging loss (then it says what the checkpoint holds).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

# more figures than this: their count and folder instead of their names
MAX_LISTED = 6
# why a run ended early -> (the first line, what its checkpoint holds)
STOPS = {
    "sigterm": ("stopped by SIGTERM", "the state after the last finished batch: resume with --ckpt_path last"),
    "diverged": ("stopped: the loss diverged", "the last one saved before the divergence"),
}


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies below it (shorter to read and to paste)."""
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def find_checkpoint(folder: str | Path) -> Path | None:
    """``<folder>/checkpoints/last.ckpt``, else the newest ``*.ckpt`` there, else None."""
    ckpts = Path(folder) / "checkpoints"
    if (ckpts / "last.ckpt").is_file():
        return ckpts / "last.ckpt"
    found = [p for p in ckpts.glob("*.ckpt") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_summary(folder: str | Path, subcommand: str = "fit", checkpoint: str | Path | None = None,
                stop: str | None = None) -> str:
    """The end-of-run block for the run folder ``folder``.

    Args:
        folder: the run folder (``<save_dir>/<name>/version_N``, or the root folder of a run
            without a logger).
        subcommand: what ran (``fit``, ``validate``, ``test``).
        checkpoint: the run's checkpoint if it lies elsewhere (a ``ModelCheckpoint`` with a
            ``dirpath`` of its own); default :func:`find_checkpoint` of ``folder``.
        stop: why the run ended early, a key of :data:`STOPS`, or None for a finished run.
    """
    if stop is not None and stop not in STOPS:
        raise ValueError(f"run_summary: stop = {stop!r}; allowed: {', '.join(STOPS)} or None")
    folder = Path(folder)
    lines = [f"zoo: {subcommand} {'finished' if stop is None else STOPS[stop][0]}",
             f"  run folder   {_shown(folder)}"]
    pngs = sorted(p.name for p in folder.glob("*.png"))
    if len(pngs) > MAX_LISTED:
        lines.append(f"  figures      {len(pngs)} PNG files in {_shown(folder)}")
    elif pngs:
        lines.append(f"  figures      {', '.join(pngs)}")
    ckpt = Path(checkpoint) if checkpoint else find_checkpoint(folder)
    if ckpt is not None and ckpt.is_file():
        lines.append(f"  checkpoint   {_shown(ckpt)}" + ("" if stop is None else f" ({STOPS[stop][1]})"))
    if any(folder.glob("events.out.tfevents.*")):
        # the logger's root: every version of the run side by side
        lines.append(f"  TensorBoard  tensorboard --logdir {_shown(folder.parent)}")
    return "\n".join(lines)


@contextlib.contextmanager
def reported_run(trainer, subcommand: str, ckpt_path: str | None = None) -> Iterator[None]:
    """Print :func:`run_summary` on rank 0 when the block (a Trainer's ``fit``, ``validate`` or
    ``test``) ends, or is stopped by SIGTERM or a diverging loss (the exception goes on)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from zoo.training.divergence import DivergenceError

    stop, ended = None, False
    try:
        yield
        ended = True
    except SIGTERMException:
        stop = "sigterm"
        raise
    except DivergenceError:
        stop = "diverged"
        raise
    finally:
        # any other error (a setting, a bug) leaves nothing to point at: no block
        if (ended or stop) and trainer.is_global_zero and subcommand in ("fit", "validate", "test"):
            print(run_summary(_run_folder(trainer), subcommand, _checkpoint(trainer, subcommand, ckpt_path), stop),
                  flush=True)


def _run_folder(trainer) -> Path:
    # the logger's own folder, not trainer.log_dir (a broadcast: this runs on rank 0 only)
    log_dir = trainer.loggers[0].log_dir if trainer.loggers else None
    return Path(log_dir or trainer.default_root_dir)


def _checkpoint(trainer, subcommand: str, ckpt_path: str | None) -> str | None:
    """What the run saved (fit) or evaluated (validate, test: ``--ckpt_path``)."""
    if subcommand != "fit":
        return ckpt_path if ckpt_path and Path(ckpt_path).is_file() else None
    cb = trainer.checkpoint_callback
    return (cb.last_model_path or cb.best_model_path or None) if cb is not None else None
