"""The tests' one in-process fit: a quiet CPU Trainer (no progress bar, no model summary, no
checkpoints unless asked), optionally logging to TensorBoard in ``tmp_path/tb/version_0``.

Subprocess runs of the CLI are another thing: ``resume_harness.fit`` and ``helpers_ddp``.
"""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger


def trainer(tmp_path: Path | None = None, *, logger: bool | Logger = False, callbacks=(), max_steps: int = -1,
            max_epochs: int | None = None, existing: tuple[str, ...] = (), **kw) -> pl.Trainer:
    """A quiet one-device CPU Trainer. ``logger``: True for a TensorBoardLogger in ``tmp_path/tb/version_0``,
    where the ``existing`` files are put first (a user's files that callbacks must not overwrite), or a logger.
    ``max_epochs``: 1 by default, unlimited under a ``max_steps``. Any other Trainer argument passes on."""
    lg = logger
    if logger is True:
        from lightning.pytorch.loggers import TensorBoardLogger

        folder = Path(tmp_path) / "tb" / "version_0"
        folder.mkdir(parents=True, exist_ok=True)
        for name in existing:
            (folder / name).write_bytes(b"a user's file")
        lg = TensorBoardLogger(tmp_path, name="tb", version=0)
    if max_epochs is None:
        max_epochs = 1 if max_steps < 0 else -1
    opts = dict(max_steps=max_steps, max_epochs=max_epochs, logger=lg, callbacks=list(callbacks),
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                accelerator="cpu", devices=1)
    if tmp_path is not None:
        opts["default_root_dir"] = tmp_path
    return pl.Trainer(**(opts | kw))


def fit(module: pl.LightningModule, data=None, tmp_path: Path | None = None, *, ckpt_path: str | None = None,
        **kw) -> pl.Trainer:
    """``module`` fitted on ``data`` (a LightningDataModule or a train DataLoader) by :func:`trainer`
    (``kw``: its arguments), from ``ckpt_path`` if given; returns the trainer."""
    t = trainer(tmp_path, **kw)
    if isinstance(data, pl.LightningDataModule):
        t.fit(module, datamodule=data, ckpt_path=ckpt_path)
    else:
        t.fit(module, data, ckpt_path=ckpt_path)
    return t
