"""Tensors copied to a device once: a data set served as every batch, or a test set evaluated again
and again, is not sent to the accelerator at every use (on a GPU each copy also waits for it)."""
from __future__ import annotations

import torch
from torch import Tensor


def kept_on(owner: object, t: Tensor, device: torch.device, keep: int | None = None) -> Tensor:
    """``t`` on ``device``, copied there once and kept on ``owner`` (keyed by the tensor object: the
    same tensor asked for again gets the same copy); ``t`` itself when already there. ``keep``
    bounds how many copies ``owner`` holds (the newest stay)."""
    if t.device == device:
        return t
    copies: list[tuple[Tensor, Tensor]] = owner.__dict__.setdefault("_device_copies", [])
    hit = next((c for src, c in copies if src is t and c.device == device), None)
    if hit is None:
        hit = t.to(device)
        copies.append((t, hit))
        if keep is not None:
            del copies[:-keep]
    return hit
