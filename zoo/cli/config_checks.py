"""Settings that pass the parser and the constructors but make no sense, refused before the run.

- Trainer settings Lightning takes as given: it checks ``max_epochs``, ``max_steps`` and
  ``limit_*_batches`` itself, but a negative ``min_epochs`` or ``log_every_n_steps`` runs, and
  silently means nothing or logs never.
- ``max_time``: Lightning's ``Timer`` checks it only when the Trainer is built, in words that do
  not name ``trainer.max_time``; here it is checked with the Timer itself, before anything is built.
- The model's own arguments before the datamodule is built (:func:`check_model_without_data`):
  the CLI builds data first (the model takes values from it, ``zoo.cli.LINKED``), and a datamodule
  may read files as it is built or as it gives those values (``Latents.d`` encodes MNIST).
- NaN anywhere in the configuration: never a valid setting, and a constructor without its own
  finite check would train on it until the loss diverges.
- ``nan``/``inf`` on the command line: YAML strings unless spelled ``.nan``/``.inf``
  (:func:`yaml_non_finite`), so that the finite checks, not the type check, name the setting.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# setting -> (smallest allowed value, what is allowed); None is always allowed (Lightning's default)
LOWER_BOUNDS: dict[str, tuple[float, str]] = {
    "min_epochs": (0, "an integer >= 0 or null"),
    "min_steps": (0, "an integer >= 0 or null"),
    "log_every_n_steps": (1, "a positive integer or null"),
    "check_val_every_n_epoch": (1, "a positive integer or null"),
    "num_sanity_val_steps": (-1, "an integer >= 0, or -1 for all batches"),
    "accumulate_grad_batches": (1, "a positive integer"),
    "gradient_clip_val": (0, "a finite number >= 0 or null"),
    "num_nodes": (1, "a positive integer"),
}


MAX_TIME_ALLOWED = ('"DD:HH:MM:SS" (e.g. "00:12:00:00"), a mapping of days/hours/minutes/seconds '
                    "(e.g. {days: 1, hours: 12}), a timedelta, or null")


def check_trainer_settings(trainer: Mapping[str, Any]) -> None:
    """Raise ``ValueError("trainer.<name> = <value>; allowed: ...")`` for the first setting in
    ``trainer`` (the parsed ``trainer:`` section) outside :data:`LOWER_BOUNDS`, or a ``max_time``
    that Lightning's ``Timer`` refuses."""
    for name, (low, allowed) in LOWER_BOUNDS.items():
        value = trainer.get(name)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value < low:
            raise ValueError(f"trainer.{name} = {value}; allowed: {allowed}")
    check_max_time(trainer.get("max_time"))


def check_max_time(value: Any) -> None:
    """``trainer.max_time`` as Lightning's ``Timer(duration=...)`` reads it (the Trainer builds one)."""
    from lightning.pytorch.callbacks import Timer
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    if hasattr(value, "as_dict"):  # a mapping as parsed (a jsonargparse Namespace)
        value = value.as_dict()
    try:
        Timer(duration=value)
    except (MisconfigurationException, TypeError, ValueError, OverflowError):
        shown = repr(value) if isinstance(value, str) else value
        raise ValueError(f"trainer.max_time = {shown}; allowed: {MAX_TIME_ALLOWED}") from None


def init_default(model_class: type, name: str) -> Any:
    """The default of ``name`` in the first ``__init__`` up ``model_class``'s hierarchy that names it
    (a subclass may pass ``**kwargs`` on); ``inspect.Parameter.empty`` when none has one."""
    for cls in model_class.__mro__:
        param = inspect.signature(cls.__init__).parameters.get(name) if "__init__" in vars(cls) else None
        if param is not None:
            return param.default
    return inspect.Parameter.empty


def check_model_without_data(parser, config, linked: Iterable[str]) -> None:
    """Build the configured model once without its datamodule, so that its constructor's checks
    (``lr = -1``) speak before the datamodule is built and reads anything; the module is then
    dropped and the run builds data and model as usual.

    Only where that build means the same checks: a datamodule is configured and the model has a
    default for each ``linked`` argument it takes (what the data would give it). The random states
    are restored after it, so the run's own build draws exactly what it would have drawn."""
    sub = config.get("subcommand")
    section = config[sub] if sub else config
    model = section.get("model")
    if model is None or section.get("data") is None or not isinstance(getattr(model, "class_path", None), str):
        return
    module, _, name = model.class_path.rpartition(".")
    model_class = getattr(importlib.import_module(module), name)
    if any(_takes(model_class, arg) and init_default(model_class, arg) is inspect.Parameter.empty for arg in linked):
        return
    alone = config.clone()
    part = alone[sub] if sub else alone
    part["data"] = None
    trainer = part.get("trainer")
    for key in list(vars(trainer)) if trainer is not None else []:
        # the Trainer's callbacks, logger, plugins, ...: built with the run, not here
        if _is_class_config(getattr(trainer, key)):
            setattr(trainer, key, None)
    with _random_states_kept():
        parser.instantiate_classes(alone)


def _takes(model_class: type, name: str) -> bool:
    return any(name in inspect.signature(cls.__init__).parameters for cls in model_class.__mro__
               if "__init__" in vars(cls))


def _is_class_config(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_is_class_config(v) for v in value)
    return hasattr(value, "class_path") or (isinstance(value, Mapping) and "class_path" in value)


@contextlib.contextmanager
def _random_states_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's (CPU) random states as they were (``seed_everything`` set them)."""
    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])


def nan_settings(config: object, prefix: str = "") -> Iterator[str]:
    """Dotted names of the NaN values in ``config`` (nested dicts and lists, as parsed)."""
    if isinstance(config, Mapping):
        for key, value in config.items():
            yield from nan_settings(value, f"{prefix}{key}.")
    elif isinstance(config, (list, tuple)):
        for i, value in enumerate(config):
            yield from nan_settings(value, f"{prefix[:-1]}[{i}].")
    elif isinstance(config, float) and math.isnan(config):
        yield prefix[:-1]


def check_finite_settings(config: Mapping[str, Any]) -> None:
    """Raise ``ValueError("<name> = nan; allowed: a number")`` for the first NaN in ``config``."""
    for name in nan_settings(config):
        raise ValueError(f"{name} = nan; allowed: a number (NaN is never a valid setting)")


# a float the YAML loader reads as a string when written the Python way ("nan", "-inf")
_NON_FINITE = re.compile(r"^([+-]?)(nan|inf|infinity)$", re.IGNORECASE)
_NON_FINITE_ITEM = re.compile(r"(?<![\w.])([+-]?)(nan|inf|infinity)(?![\w])", re.IGNORECASE)


def yaml_non_finite(args: list[str]) -> list[str]:
    """``args`` with ``nan``/``inf``/``-inf`` values spelled as YAML floats (``.nan``, ``-.inf``).

    jsonargparse reads command-line values as YAML, where ``nan`` is a string: without this, the
    parser rejects it as "a string" before the zoo's own finite check can name the parameter.
    """
    def spell(m: re.Match) -> str:
        return f"{m.group(1)}.{'nan' if m.group(2).lower() == 'nan' else 'inf'}"

    def fix(value: str) -> str:
        if value.lstrip().startswith(("[", "{")):  # a list or mapping: each element
            return _NON_FINITE_ITEM.sub(spell, value)
        m = _NON_FINITE.match(value.strip())
        return value if m is None else spell(m)

    out: list[str] = []
    for i, a in enumerate(args):
        prev = args[i - 1] if i > 0 else ""
        if a.startswith("--") and "=" in a:
            key, _, value = a.partition("=")
            out.append(f"{key}={fix(value)}")
        elif prev.startswith("--") and "=" not in prev and fix(a) != a:
            out[-1] = f"{prev}={fix(a)}"  # joined: argparse would take "-inf" for an option
        else:
            out.append(a)
    return out
