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

Only public Lightning API: the CLI's arguments are recognised by the ``_instantiator`` key it adds
to what ``save_hyperparameters()`` records, and a module that got another class's arguments records
its own with ``lightning.pytorch.utilities.parsing.save_hyperparameters`` (the function the
method calls, here without the CLI's arguments).
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.parsing import save_hyperparameters

# the key LightningCLI adds to the arguments it hands to save_hyperparameters() (load_from_checkpoint reads it)
CLI_KEY = "_instantiator"


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
    ``spec()``). The CLI's configured arguments are kept only when they are this module's, and
    under their canonical names (an alias such as ``eta`` recorded as ``lr``)."""
    frame = inspect.currentframe().f_back
    module.save_hyperparameters(ignore=list(plain), frame=frame)
    given = module.hparams
    if CLI_KEY in given and not _names(given.get("_class_path"), type(module)):
        # built inside another configured module: its arguments are not ours; hparams is documented
        # as mutable, and save_hyperparameters only adds to it
        given.clear()
        save_hyperparameters(module, ignore=list(plain), frame=frame)
    # another name of an argument (zoo.models.base.ZooModule.aliases) is recorded under the canonical one
    if any(alias in module.hparams for alias in getattr(module, "aliases", {})):
        canonical = type(module).resolve_aliases(dict(module.hparams))
        module.hparams.clear()
        store_hparams(module, **canonical)
    if plain:
        store_hparams(module, **plain)
