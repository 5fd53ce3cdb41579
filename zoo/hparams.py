"""Hyperparameters as plain data, both in checkpoints and in what the logger writes.

Lightning's logger writes ``hparams_initial``, a copy taken when ``save_hyperparameters()`` runs;
a value changed afterwards in ``hparams`` (an init scheme replaced by its spec, a size learnt
from the datamodule at setup) reaches the checkpoint but not ``hparams.yaml`` or TensorBoard's
HPARAMS. :func:`store_hparams` sets both.
"""
from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


def store_hparams(module: pl.LightningModule, **values: Any) -> None:
    """Set ``values`` in ``module.hparams`` and in ``module.hparams_initial`` (plain data only:
    checkpoints load with ``weights_only``, and ``hparams.yaml`` stays readable)."""
    module.save_hyperparameters({**module.hparams, **values})
