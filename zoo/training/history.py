"""A callback's record as a checkpoint holds it: each list of equal tensors as one tensor.

``torch.save`` costs ~20-30 us a tensor (a Python call per pickled object, a file record per
storage): the quickstart's ``SingularValues`` record, two small tensors every 10 steps, held 4,001
tensors after 20,000 steps, and each save of ``last.ckpt`` took ~130-280 ms (its load ~390 ms),
~3% of the run over its ten saves. Stacked, the record is a handful of tensors whatever the run's
length. Lists of anything else (numbers, dicts, tensors of differing shapes) are kept as they are,
and a record saved as plain lists (before this) loads as it is."""
from __future__ import annotations

from typing import Any

import torch

#: the key of a stacked list: ``{STACKED: tensor}`` stands for ``list(tensor.unbind(0))``
STACKED = "stacked_list_of_tensors"


def packed(history: dict[str, list]) -> dict[str, Any]:
    """``history`` with each list of two or more tensors of one shape, dtype and device stacked."""
    return {key: _stacked(items) for key, items in history.items()}


def unpacked(history: dict[str, Any]) -> dict[str, list]:
    """The lists :func:`packed` stood for (views of the stacked tensor, equal to the originals)."""
    return {key: list(value[STACKED].unbind(0)) if isinstance(value, dict) and set(value) == {STACKED} else value
            for key, value in history.items()}


def _stacked(items: list) -> Any:
    if len(items) < 2 or not all(isinstance(t, torch.Tensor) for t in items):
        return items
    first = items[0]
    if not all(t.shape == first.shape and t.dtype == first.dtype and t.device == first.device for t in items):
        return items
    with torch.no_grad():
        return {STACKED: torch.stack(items)}
