"""A quiet one-CPU Trainer for in-process module tests: ``helpers_fit.trainer``, one epoch unless told."""
from __future__ import annotations

import lightning.pytorch as pl

from helpers_fit import trainer as _trainer


def trainer(**kw) -> pl.Trainer:
    return _trainer(max_epochs=kw.pop("max_epochs", 1), **kw)
