"""Order parameters, specialisation entropies and continual-learning metrics (pure torch).

Source: [S] Jarvis, Lee et al. 2025, "specialisation", Sec. 4 (Eqs. 8 and 10) and
``docs/theory.md#teacher-student`` (Lee et al. 2021/2022 for forgetting and transfer).

Everything here is a pure function on tensors, batched over leading dimensions, with no
Lightning import, so it can be used from a notebook, a callback or :mod:`zoo.theory.meanfield`.

Shapes (``...`` is any number of leading batch dimensions, e.g. an ensemble dimension ``E``):

* student first layer ``W``: ``(..., p, d)``
* teachers ``W_teachers``: a list/tuple of ``n_tasks`` tensors of shape ``(p*, d)``, a stacked
  tensor ``(n_tasks, p*, d)``, or a single ``(p*, d)`` tensor (one task)
* ``Q``: ``(..., p, p)``; ``R``: ``(..., n_tasks, p, p*)``; ``T``: ``(n_tasks, n_tasks, p*, p*)``

Example::

    >>> import torch
    >>> from zoo.metrics.overlaps import order_parameters, entropies
    >>> W = torch.randn(5, 2, 100)                        # ensemble of 5 students, p = 2
    >>> WT = [torch.randn(1, 100), torch.randn(1, 100)]   # two teachers, p* = 1
    >>> Q, R, T = order_parameters(W, WT)
    >>> Q.shape, R.shape, T.shape
    (torch.Size([5, 2, 2]), torch.Size([5, 2, 2, 1]), torch.Size([2, 2, 1, 1]))
    >>> sorted(entropies(Q, torch.ones(5, 2)))
    ['H_Q', 'H_h', 'H_m']
"""
from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import Tensor

__all__ = ["order_parameters", "entropies", "max_entropy", "forgetting", "transfer"]

Teachers = Union[Tensor, Sequence[Tensor]]


def _stack_teachers(W_teachers: Teachers) -> Tensor:
    """Teachers as one ``(n_tasks, p*, d)`` tensor."""
    if isinstance(W_teachers, Tensor):
        if W_teachers.dim() == 2:
            return W_teachers.unsqueeze(0)
        if W_teachers.dim() == 3:
            return W_teachers
        raise ValueError(
            "order_parameters: W_teachers must be (p*, d), (n_tasks, p*, d) or a list of (p*, d) "
            f"tensors; got a tensor of shape {tuple(W_teachers.shape)}"
        )
    teachers = list(W_teachers)
    if not teachers:
        raise ValueError("order_parameters: W_teachers is empty (need at least one teacher)")
    shapes = {tuple(t.shape) for t in teachers}
    if len(shapes) != 1 or teachers[0].dim() != 2:
        raise ValueError(
            "order_parameters: every teacher must be a (p*, d) tensor of the same shape; "
            f"got shapes {[tuple(t.shape) for t in teachers]}"
        )
    return torch.stack(teachers, dim=0)


def order_parameters(W: Tensor, W_teachers: Teachers) -> tuple[Tensor, Tensor, Tensor]:
    """Overlaps ``Q = W W^T/d``, ``R^(t) = W W_T^(t)T/d``, ``T^(t,t') = W_T^(t) W_T^(t')T/d``.

    [S] Eq. 8 (``d`` is the input dimension, the last axis of every weight matrix).

    Args:
        W: student first layer, ``(..., p, d)``; leading dimensions (an ensemble ``E``) are kept.
        W_teachers: ``n_tasks`` teacher first layers: a list/tuple of ``(p*, d)`` tensors, a
            stacked ``(n_tasks, p*, d)`` tensor, or one ``(p*, d)`` tensor (``n_tasks = 1``).

    Returns:
        ``(Q, R, T)`` with ``Q`` of shape ``(..., p, p)``, ``R`` of shape
        ``(..., n_tasks, p, p*)`` (``R[..., t, i, n] = W_i . W_T^(t)_n / d``) and ``T`` of shape
        ``(n_tasks, n_tasks, p*, p*)`` (``T[t, s, n, m] = W_T^(t)_n . W_T^(s)_m / d``).
    """
    WT = _stack_teachers(W_teachers).to(dtype=W.dtype, device=W.device)
    d = W.shape[-1]
    if WT.shape[-1] != d:
        raise ValueError(
            f"order_parameters: the student has input dimension {d} but the teachers have {WT.shape[-1]}"
        )
    Q = W @ W.transpose(-1, -2) / d
    R = torch.einsum("...id,tnd->...tin", W, WT) / d
    T = torch.einsum("tnd,smd->tsnm", WT, WT) / d
    return Q, R, T


def _normalise(x: Tensor) -> Tensor:
    """``x / sum(x)`` over the last axis, with 0 where the sum is 0 (no NaN)."""
    s = x.sum(dim=-1, keepdim=True)
    return torch.where(s > 0, x / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(x))


def _plogp(x: Tensor) -> Tensor:
    """``x log x`` with ``0 log 0 = 0``."""
    return torch.where(x > 0, x * torch.log(torch.where(x > 0, x, torch.ones_like(x))), torch.zeros_like(x))


def entropies(Q: Tensor, h: Tensor) -> dict[str, Tensor]:
    """Specialisation entropies ``H_h``, ``H_Q``, ``H_m`` of [S] Eq. 10 (docs/theory.md#entropies).

    With ``|h~_i| = |h_i| / sum_j |h_j|`` and ``Q~_ii = Q_ii / sum_j Q_jj``:
    ``H_h = -sum_i |h~_i| log |h~_i|``, ``H_Q = -sum_i Q~_ii log Q~_ii`` and
    ``H_m = -sum_i Q~_ii |h~_i| log(Q~_ii |h~_i|)`` (natural log; ``0 log 0 = 0``).

    ``H_h`` and ``H_Q`` lie in ``[0, log p]``: ``log p`` for identical units, ``0`` for one active
    unit. ``H_m`` is 0 for one active unit and ``(2/p) log p`` for identical units (which is
    ``log 2`` at ``p = 2``), since the products ``Q~_ii |h~_i|`` sum to ``1/p``, not to 1.
    A head (or diagonal of ``Q``) that is zero everywhere is treated as all-zero weights, giving 0.

    Args:
        Q: student overlaps ``(..., p, p)`` (only the diagonal is used).
        h: readout ``(..., p)``; leading dimensions broadcast against ``Q``'s.

    Returns:
        ``{"H_h": (...), "H_Q": (...), "H_m": (...)}``.
    """
    q = _normalise(torch.diagonal(Q, dim1=-2, dim2=-1).clamp_min(0))
    a = _normalise(h.abs())
    q, a = torch.broadcast_tensors(q, a)
    return {
        "H_h": -_plogp(a).sum(-1),
        "H_Q": -_plogp(q).sum(-1),
        "H_m": -_plogp(q * a).sum(-1),
    }


def max_entropy(name: str, p: int) -> float:
    """Upper end of an entropy of [S] Eq. 10 with ``p`` units (identical units): ``log p`` for
    ``H_h`` and ``H_Q``, ``(2/p) log p`` for ``H_m``; ``log 2`` for all three at ``p = 2``."""
    import math

    return (2.0 / p) * math.log(p) if name == "H_m" else math.log(p)


def forgetting(eps1: Tensor, i_switch: int, delta: int) -> Tensor:
    """Forgetting of task 1: ``eps_1(t_switch + Delta) - eps_1(t_switch)`` (docs/theory.md#forgetting).

    Args:
        eps1: task-1 error trajectory, time on the last axis ``(..., n_times)``.
        i_switch: index of the task switch on that axis.
        delta: number of recorded points after the switch (``Delta``, in samples of the
            trajectory, not in time units); ``i_switch + delta`` must be a valid index.

    Returns:
        ``(...)``: positive when task 1 got worse after the switch.
    """
    eps1 = torch.as_tensor(eps1)
    n = eps1.shape[-1]
    if not (0 <= i_switch < n and 0 <= i_switch + delta < n):
        raise ValueError(
            f"forgetting: i_switch={i_switch} and i_switch + delta={i_switch + delta} must index a "
            f"trajectory of length {n}"
        )
    return eps1[..., i_switch + delta] - eps1[..., i_switch]


def transfer(eps2: Tensor, i_switch: int, i_end: int) -> Tensor:
    """Transfer to task 2: ``eps_2(t_switch) - eps_2(t_end)`` (docs/theory.md#forgetting).

    Args:
        eps2: task-2 error trajectory, time on the last axis ``(..., n_times)``.
        i_switch: index of the task switch; i_end: index of the end of training (``-1`` allowed).

    Returns:
        ``(...)``: how much task 2's error fell while training on it.
    """
    eps2 = torch.as_tensor(eps2)
    n = eps2.shape[-1]
    for name, i in (("i_switch", i_switch), ("i_end", i_end)):
        if not -n <= i < n:
            raise ValueError(f"transfer: {name}={i} does not index a trajectory of length {n}")
    return eps2[..., i_switch] - eps2[..., i_end]
