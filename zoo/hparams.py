"""Hyperparameters as plain data, both in checkpoints and in what the logger writes.

Two Lightning behaviours this module works around, for every zoo module:

- The logger writes ``hparams_initial``, a copy taken when ``save_hyperparameters()`` runs; a value
  changed afterwards in ``hparams`` (an init scheme replaced by its spec, a size learnt from the
  datamodule at setup) reaches the checkpoint but not ``hparams.yaml`` or TensorBoard's HPARAMS.
  :func:`store_hparams` sets both.
- Lightning's CLI builds the configured module inside a context that hands the module's
  configured arguments to every ``save_hyperparameters()`` call, including those of modules built
  inside it (a ``Comparison``'s networks, a ``BetaVAESweep``'s members), which would then record
  the outer module's arguments. :func:`save_own_hyperparameters` records a module's own.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

import lightning.pytorch as pl

try:
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
except ImportError:  # a Lightning without the CLI context: nothing to undo
    _given_hyperparameters = None


def store_hparams(module: pl.LightningModule, **values: Any) -> None:
    """Set ``values`` in ``module.hparams`` and in ``module.hparams_initial`` (plain data only:
    checkpoints load with ``weights_only``, and ``hparams.yaml`` stays readable)."""
    module.save_hyperparameters({**module.hparams, **values})


def _names(class_path: object, cls: type) -> bool:
    """Whether ``class_path`` (e.g. ``"zoo.DeepLinearNet"``, a re-export) imports as ``cls``."""
    if not isinstance(class_path, str) or "." not in class_path:
        return False
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None) is cls
    except ImportError:
        return False


def save_own_hyperparameters(module: pl.LightningModule, **plain: Any) -> None:
    """``save_hyperparameters()`` for the ``__init__`` that calls this (a subclass's arguments
    too), with ``plain`` replacing arguments that are not plain data (an init scheme by its
    ``spec()``). The CLI's configured arguments are used only when they are this module's."""
    frame = inspect.currentframe().f_back
    given = _given_hyperparameters.get() if _given_hyperparameters is not None else None
    mine = given is None or _names(given.get("_class_path"), type(module))
    token = None if mine else _given_hyperparameters.set(None)
    try:
        module.save_hyperparameters(ignore=list(plain), frame=frame)
    finally:
        if token is not None:
            _given_hyperparameters.reset(token)
    if plain:
        store_hparams(module, **plain)
