"""A quiet one-CPU Trainer for in-process module tests (no logger, checkpoints, bar or summary)."""
from __future__ import annotations

import lightning.pytorch as pl


def trainer(**kw) -> pl.Trainer:
    opts = dict(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, accelerator="cpu", devices=1)
    opts.update(kw)
    return pl.Trainer(**opts)
