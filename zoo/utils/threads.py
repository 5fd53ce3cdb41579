"""Thread counts chosen for a computation's size, for the call only (never the process).

Code made of many small tensor operations (the mean-field ODE of :mod:`zoo.theory.meanfield`,
the closed forms of :mod:`zoo.theory.linear`, the RK4 loop of :mod:`zoo.theory.phase`, the neural
race of :mod:`zoo.theory.gdln`) gains
nothing from a second intra-op thread and loses a great deal when the machine is busy: an
operation that opens an OpenMP parallel region (index_select, the VML paths of sqrt/asin/exp from
a few thousand elements on) waits for its second thread to be scheduled, and on a loaded core that
is a time slice, milliseconds against microseconds of work. Measured on the 2-core machine
(mean-field ODE, erf, p = 2, p* = 1, two tasks; "work" is the elements of the largest per-step
tensor, 24 E; microseconds per Euler step, 1 thread -> 2 threads, best of 2)::

    members E   work      idle machine (load ~1)    busy (a spinning process on the other core)
    40          960       262 -> 295   (1.1x slower)    869 -> 30,655   (35x slower)
    400         9,600     513 -> 784   (1.5x slower)  1,708 -> 23,402   (14x slower)
    4,000       96,000    6,430 -> 5,883 (1.1x faster) 20,154 -> 335,260 (17x slower)
    40,000      960,000   97,395 -> 65,103 (1.5x faster) 298,050 -> 1,064,002 (3.6x slower)

So a second thread pays off only from ~10^5 elements per operation, and only on an idle machine.
:data:`SMALL_WORK` = 2^16 elements (512 KiB of float64) sits between the last size where one
thread won on the idle machine and the first where two did: below it the theory functions run on
one thread; at or above it torch's own setting (the user's ``torch.set_num_threads``, or
torch's default) is left alone, since large batched work does gain from threads when the cores are
free, and how many to use on a shared machine is the user's call. Every choice is scoped: the
previous count is restored when the call returns or raises.

Results do not depend on the choice below the threshold for the sizes the tests use (an
operation smaller than torch's grain size runs on one thread whatever the setting); for larger
operations a different split can change the last bit of a reduction, as any change of thread
count does.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch

__all__ = ["SMALL_WORK", "num_threads", "threads_for", "threads_for_work", "broadcast_work", "sized_threads"]

SMALL_WORK = 1 << 16
"""Elements per tensor operation below which a CPU computation runs on one intra-op thread (see
the module docstring for the measurement)."""

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def num_threads(n: Optional[int]) -> Iterator[None]:
    """Run the block with ``n`` intra-op CPU threads (``torch.set_num_threads``), then restore
    the previous count, also when the block raises. ``None`` leaves torch's setting alone."""
    if n is not None and n < 1:
        raise ValueError(f"num_threads: n must be a positive integer or None, got {n}")
    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def threads_for(work: int, device: Optional[torch.device | str] = None) -> Optional[int]:
    """The thread count for a computation whose largest tensor operation touches ``work``
    elements: 1 on the CPU below :data:`SMALL_WORK`, else None (torch's setting stays)."""
    if device is not None and torch.device(device).type != "cpu":
        return None
    return 1 if work < SMALL_WORK else None


def threads_for_work(work: int, device: Optional[torch.device | str] = None):
    """``num_threads(threads_for(work, device))``: the scoped choice for one computation."""
    return num_threads(threads_for(work, device))


def broadcast_work(*args: Any, **kwargs: Any) -> tuple[int, Optional[torch.device]]:
    """Elements of the broadcast of every tensor argument (numbers count as scalars) and the
    device of the first tensor: the size of one elementwise operation of a closed form that
    broadcasts its arguments. Arguments that do not broadcast count by their total size."""
    tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
    if not tensors:
        return 1, None
    # by hand: torch.broadcast_shapes costs ~0.5 s on its first call (an import)
    ndim = max(t.dim() for t in tensors)
    work = 1
    for axis in range(1, ndim + 1):
        sizes = {t.shape[-axis] for t in tensors if t.dim() >= axis} - {1}
        if len(sizes) > 1:
            return sum(t.numel() for t in tensors), tensors[0].device
        work *= sizes.pop() if sizes else 1
    return work, tensors[0].device

def sized_threads(work: Callable[..., tuple[int, Optional[torch.device]]] = broadcast_work) -> Callable[[F], F]:
    """Decorator: run the function under ``threads_for_work(*work(*args, **kwargs))``; ``work``
    returns the elements of the function's largest per-operation tensor and its device."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            with threads_for_work(*work(*args, **kwargs)):
                return fn(*args, **kwargs)

        return scoped  # type: ignore[return-value]

    return wrap
