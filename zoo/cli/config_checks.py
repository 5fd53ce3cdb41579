"""Settings that pass the parser and the constructors but make no sense, refused before the run.

- Trainer settings Lightning takes as given: it checks ``max_epochs``, ``max_steps`` and
  ``limit_*_batches`` itself, but a negative ``min_epochs`` or ``log_every_n_steps`` runs, and
  silently means nothing or logs never.
- NaN anywhere in the configuration: never a valid setting, and a constructor without its own
  finite check would train on it until the loss diverges.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
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


def check_trainer_settings(trainer: Mapping[str, Any]) -> None:
    """Raise ``ValueError("trainer.<name> = <value>; allowed: ...")`` for the first setting in
    ``trainer`` (the parsed ``trainer:`` section) outside :data:`LOWER_BOUNDS`."""
    for name, (low, allowed) in LOWER_BOUNDS.items():
        value = trainer.get(name)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value < low:
            raise ValueError(f"trainer.{name} = {value}; allowed: {allowed}")


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
