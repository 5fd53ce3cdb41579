"""Check a checkpoint against the configured model before a run starts from it.

Lightning's CLI, given ``--ckpt_path``, replaces the configured model's arguments with those stored
in the checkpoint (and even its class) without a word; a checkpoint of another model then fails
later with an unrelated error. The zoo's CLI keeps the configured model and calls
:func:`check_checkpoint` before ``fit``/``validate``/``test``/``predict``: a missing or unreadable
file, a checkpoint of another class, stored hyperparameters that differ from the configured ones,
or weights of other shapes stop the command with one line that names the checkpoint, the setting
and both values.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from zoo.training.checkpoint import CheckpointMismatch

# values of ckpt_path that Lightning resolves itself (the best/last checkpoint of this run, ...)
LIGHTNING_NAMES = ("best", "last", "hpc", "registry")



def check_checkpoint(path: str | os.PathLike | None, model: nn.Module) -> None:
    """Raise if the checkpoint at ``path`` does not belong to ``model`` (see the module docstring).

    ``path`` None, a name Lightning resolves itself (``"last"``, ``"best"``, ...) that is not a file,
    or a URL: nothing to check here. Raises ``FileNotFoundError`` for a missing file and
    :class:`CheckpointMismatch` (a ``ValueError``) for everything else.
    """
    if path is None or "://" in str(path) or (str(path) in LIGHTNING_NAMES and not os.path.isfile(path)):
        return
    where = f"ckpt_path = {str(path)!r}"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{where}: no such file; allowed: a checkpoint file, e.g. "
                                "lightning_logs/version_N/checkpoints/*.ckpt")
    ckpt = _load(path, where)
    stored = ckpt.get("hyper_parameters") or {}
    stored = getattr(type(model), "resolve_aliases", dict)(stored)  # old names (init_w, eta) as today's (init, lr)
    _check_class(stored.get("_class_path"), model, where)
    # sizes a module learns from the data at setup (this check runs before setup) are not the config's
    learnt = set(getattr(model, "hparams_from_data", ()))
    given = {k: v for k, v in dict(getattr(model, "hparams", {})).items() if k not in learnt}
    problems = [f"model.init_args.{name} = {value!r} in the config but {saved!r} in the checkpoint"
                for name, value, saved in hparam_conflicts(given, stored)]
    # the settings decide the shapes (some only at setup): the shapes are compared only for a
    # checkpoint that has no settings
    if not stored:
        problems = _shape_conflicts(ckpt["state_dict"], model)
    if problems:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise CheckpointMismatch(f"{where}: " + "; ".join(problems[:3]) + more + " (give the checkpoint's "
                                 "settings, or no ckpt_path to start a new run)")


def _load(path: str | os.PathLike, where: str) -> dict[str, Any]:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a file that is not a checkpoint
        first = str(err).strip().split("\n", 1)[0][:200]
        raise CheckpointMismatch(f"{where}: not a readable checkpoint ({type(err).__name__}: {first}); allowed: a "
                                 "checkpoint written by `zoo fit`") from err
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointMismatch(f"{where}: not a Lightning checkpoint (no state_dict); allowed: a checkpoint "
                                 "written by `zoo fit`")
    return ckpt


def _check_class(class_path: object, model: nn.Module, where: str) -> None:
    if not isinstance(class_path, str):
        return  # saved outside the CLI: the weights' shapes still have to match
    cls = type(model)
    module, _, name = class_path.rpartition(".")
    try:
        same = getattr(importlib.import_module(module), name, None) is cls
    except ImportError:
        same = False
    if not same:
        raise CheckpointMismatch(f"{where}: model class = {cls.__module__}.{cls.__qualname__} in the config but "
                                 f"{class_path} in the checkpoint; give the checkpoint's model or another checkpoint")


def hparam_conflicts(given: dict[str, Any], stored: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """``(name, given, stored)`` for every hyperparameter set on both sides with different values.

    Names are dotted (``init.init_args.lam``). Keys starting with ``_`` (the CLI's bookkeeping)
    and values left None on either side (sizes inferred at setup) are not compared.
    """
    for key, value in given.items():
        if key.startswith("_") or key not in stored:
            continue
        saved = stored[key]
        if value is None or saved is None:
            continue
        if isinstance(value, dict) and isinstance(saved, dict):
            yield from hparam_conflicts(value, saved, f"{prefix}{key}.")
        elif plain_value(value) != plain_value(saved):
            yield f"{prefix}{key}", plain_value(value), plain_value(saved)


def plain_value(value: Any) -> Any:
    """``value`` as YAML writes it back: tuples and tensors as lists (a stored setting compares equal)."""
    if isinstance(value, (tuple, list)):
        return [plain_value(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def _shape_conflicts(state: dict[str, Any], model: nn.Module) -> list[str]:
    """Tensors the model has whose shape differs from the checkpoint's, or that it lacks."""
    out = []
    for name, tensor in model.state_dict().items():
        if name not in state:
            if getattr(model, "strict_loading", True):
                out.append(f"{name} is missing from the checkpoint")
        elif isinstance(state[name], torch.Tensor) and tuple(state[name].shape) != tuple(tensor.shape):
            out.append(f"{name} has shape {tuple(tensor.shape)} in the model but {tuple(state[name].shape)} "
                       "in the checkpoint")
    return out
