"""The benches' GPU column: the same arithmetic on a CUDA device, timed with the device
synchronised before each clock reading (kernels run asynchronously: without the sync a timer
measures only their launch); "n/a" on a machine without CUDA.

``BENCH_GPU_AS=cpu`` runs the column's code on the CPU instead: a check of that code where no GPU
is present (the numbers are then CPU numbers, labelled so).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch

_AS = os.environ.get("BENCH_GPU_AS")
#: the device of the GPU column, or None (no CUDA: the column says n/a)
GPU: torch.device | None = torch.device(_AS) if _AS else (torch.device("cuda") if torch.cuda.is_available() else None)
#: Lightning's name for it (``Trainer(accelerator=...)``)
ACCELERATOR = None if GPU is None else ("gpu" if GPU.type == "cuda" else GPU.type)
#: the column's heading
HEADING = "GPU" if GPU is None or GPU.type == "cuda" else f"GPU col. on {GPU.type}"


def clock(device: torch.device | str | None = None) -> float:
    """``time.perf_counter()`` once ``device`` has finished its queued work."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def on_gpu(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` for the GPU column (``fn`` reads ``GPU``/``ACCELERATOR``): None
    without a device, the exception's name if it fails (the CPU columns still print)."""
    if GPU is None:
        return None
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - one failing cell must not hide the CPU table
        return f"failed ({type(e).__name__}: {str(e)[:60]})"


def cell(value: Any, width: int, fmt: str = ".2f") -> str:
    """A right-aligned table cell: ``value`` formatted, "n/a" for None, a failure's text as is."""
    if value is None:
        return f"{'n/a':>{width}}"
    if isinstance(value, str):
        return f"{value:>{width}}"
    return f"{value:>{width}{fmt}}"
