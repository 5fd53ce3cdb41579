"""Mean-field (d -> infinity) theory of online SGD in the two-layer teacher-student setup.

Sources: [S] Jarvis, Lee et al. 2025, "specialisation", Sec. 4 (Eq. 9) and App. C
(Eqs. 20-28), which follow Saad & Solla 1995, Goldt et al. 2019 and Lee et al. 2021/2022.
``docs/theory.md#teacher-student`` restates the formulas with the paper's typos corrected; this
module follows it.

Model and conventions (docs/theory.md#student-sgd):

* student ``y_hat = h^(t) . phi(lam)``, ``lam = W x / sqrt(d)``, one head ``h^(t)`` per task and
  a shared first layer ``W`` (``p`` units); teacher ``y = h_T^(t) . phi(rho^(t))``,
  ``rho^(t) = W_T^(t) x / sqrt(d)`` (``p*`` units), ``x ~ N(0, I_d)``; no ``1/K`` output scaling;
  teacher rows of norm ``sqrt(d)`` so that ``T_nn = 1``.
* loss ``1/2 Delta^2``, ``Delta = h^(t).phi(lam) - h_T^(t).phi(rho^(t))``; online SGD, one sample
  per step: ``W <- W - (eta/sqrt d) Delta (h^(t) * phi'(lam)) x^T``,
  ``h^(t) <- h^(t) - (eta/d) Delta phi(lam)``; only the active task's head learns, W always.
* time ``alpha = steps / d``. Order parameters ``Q = W W^T/d`` ``(p, p)``,
  ``R^(t) = W W_T^(t)T/d`` ``(p, p*)``, ``T^(t,t') = W_T^(t) W_T^(t')T/d`` (fixed).
* generalisation error ``eps^(t) = 1/2 <Delta^(t)2>`` (docs/theory.md#generalisation-error; [S] Eq. 9).

Activations: ``"erf"`` is ``phi(z) = erf(z/sqrt 2)`` (all averages in closed form, ODE exact
including the ``eta^2`` term), ``"linear"`` is ``phi(z) = z`` (Gaussian moments), ``"relu"`` is
``phi(z) = max(z, 0)`` with ``phi' = 1{z > 0}``: ``I2`` and ``I3`` are closed forms, but there is no
closed form for ``I4 = <phi'(a) phi'(b) phi(c) phi(d)>``. **For ReLU this module integrates the
small-learning-rate limit**: the ``eta^2 I4`` term of the ``Q`` equation ([S] Eq. 20) is dropped
(error ``O(eta^2)`` in ``dQ/dalpha``, so ReLU trajectories are only accurate for ``eta << 1``);
:func:`integrate` records this in ``MeanFieldTrajectory.eta2_term``.

Gaussian averages. For a centred Gaussian vector with covariance ``C`` (1-based indices as in
the papers), ``I2 = <phi(u1) phi(u2)>``, ``I3 = <phi'(u1) u2 phi(u3)>``,
``I4 = <phi'(u1) phi'(u2) phi(u3) phi(u4)>``. Entry-level functions take the covariance entries
as broadcastable tensors (``erf_I2(c11, c12, c22)``, ``erf_I3(c11, c12, c13, c23, c33)``,
``erf_I4(c11, c12, c13, c14, c22, c23, c24, c33, c34, c44)``, same for ``linear_*`` and
``relu_I2``/``relu_I3``); :func:`I2`, :func:`I3`, :func:`I4` take a covariance matrix
``(..., n, n)`` with ``n = 2, 3, 4``.

Runnable example (a 3-member ensemble, p = 2 students, two teachers with p* = 1 at feature
similarity gamma = 0.5, 5 time units per task)::

    >>> import math, torch
    >>> from zoo.theory.meanfield import integrate
    >>> E, p, g = 3, 2, 0.5
    >>> Q0 = 1e-6 * torch.eye(p).expand(E, p, p)                  # sigma_w = 1e-3
    >>> R0 = torch.zeros(E, 2, p, 1)                               # (E, n_tasks, p, p*)
    >>> T = torch.tensor([[1.0, g], [g, 1.0]]).reshape(2, 2, 1, 1)  # (n_tasks, n_tasks, p*, p*)
    >>> th = math.pi / 8
    >>> h0 = torch.tensor([math.cos(th), math.sin(th)]).expand(E, 2, p)  # both heads polar(1, pi/8)
    >>> hT = torch.ones(2, 1)                                      # teacher heads (n_tasks, p*)
    >>> traj = integrate(Q0, R0, T, h0, hT, activation="erf", eta=1.0,
    ...                  alpha_switch=5.0, alpha_end=10.0, d_alpha=0.01, record_every=0.5)
    >>> traj.eps.shape                                             # (E, n_records, n_tasks)
    torch.Size([3, 21, 2])
    >>> round(float(traj.eps[0, 0, 0]), 4)                         # tiny student: eps = 1/6
    0.1667
    >>> bool(traj.eps[0, traj.i_switch[0], 0] < 0.01)              # task 1 learnt by the switch
    True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from zoo.utils.threads import num_threads, sized_threads, threads_for

__all__ = [
    "ACTIVATIONS",
    "activation_fn",
    "erf_I2",
    "erf_I3",
    "erf_I4",
    "linear_I2",
    "linear_I3",
    "linear_I4",
    "relu_I2",
    "relu_I3",
    "I2",
    "I3",
    "I4",
    "generalisation_error",
    "MeanFieldTrajectory",
    "derivatives",
    "integrate",
]

_2_PI = 2.0 / math.pi
_4_PI2 = 4.0 / math.pi**2


# ---------------------------------------------------------------------------------------------
# activations (for simulations that want the same phi as the theory)
# ---------------------------------------------------------------------------------------------
def _erf_phi(z: Tensor) -> Tensor:
    return torch.erf(z / math.sqrt(2.0))


def _erf_dphi(z: Tensor) -> Tensor:
    return math.sqrt(2.0 / math.pi) * torch.exp(-0.5 * z * z)


def activation_fn(name: str) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """``(phi, phi')`` for ``name`` in ``ACTIVATIONS`` (``"erf"``, ``"relu"``, ``"linear"``)."""
    _check_activation(name)
    if name == "erf":
        return _erf_phi, _erf_dphi
    if name == "relu":
        return torch.relu, lambda z: (z > 0).to(z.dtype)
    return (lambda z: z), torch.ones_like


ACTIVATIONS = ("erf", "relu", "linear")


def _check_activation(name: str) -> None:
    if name not in ACTIVATIONS:
        raise ValueError(f"meanfield: activation must be one of {ACTIVATIONS}, got {name!r}")


# ---------------------------------------------------------------------------------------------
# Gaussian averages, entry level
# ---------------------------------------------------------------------------------------------
def _asin(x: Tensor) -> Tensor:
    """asin with its argument clipped to [-1, 1] (rounding can push |x| a hair above 1)."""
    return torch.asin(x.clamp(-1.0, 1.0))


def erf_I2(c11: Tensor, c12: Tensor, c22: Tensor) -> Tensor:
    """``<phi(u1) phi(u2)>`` for ``phi(z) = erf(z/sqrt 2)``: ``(2/pi) asin(C12/sqrt((1+C11)(1+C22)))``.

    [S] Eq. 23 with its typo corrected (the paper prints ``1/pi``; docs/theory.md#gaussian-averages).
    """
    return _2_PI * _asin(c12 / torch.sqrt((1.0 + c11) * (1.0 + c22)))


def erf_I3(c11: Tensor, c12: Tensor, c13: Tensor, c23: Tensor, c33: Tensor) -> Tensor:
    """``<phi'(u1) u2 phi(u3)>`` for erf: ``(2/pi) (C23 (1+C11) - C12 C13) / ((1+C11) sqrt(L3))``.

    ``L3 = (1+C11)(1+C33) - C13^2`` ([S] Eqs. 24, 29; the paper drops the ``1/pi``, docs/theory.md#gaussian-averages).
    """
    l3 = (1.0 + c11) * (1.0 + c33) - c13 * c13
    return _2_PI * (c23 * (1.0 + c11) - c12 * c13) / ((1.0 + c11) * torch.sqrt(l3))


def erf_I4(
    c11: Tensor, c12: Tensor, c13: Tensor, c14: Tensor, c22: Tensor,
    c23: Tensor, c24: Tensor, c33: Tensor, c34: Tensor, c44: Tensor,
) -> Tensor:
    """``<phi'(u1) phi'(u2) phi(u3) phi(u4)>`` for erf: ``(4/pi^2) asin(L0/sqrt(L1 L2)) / sqrt(L4)``.

    ``L4 = (1+C11)(1+C22) - C12^2`` and ``L0, L1, L2`` as in [S] Eqs. 25-28.
    """
    a1, a2 = 1.0 + c11, 1.0 + c22
    l4 = a1 * a2 - c12 * c12
    l0 = l4 * c34 - c23 * c24 * a1 - c13 * c14 * a2 + c12 * c13 * c24 + c12 * c14 * c23
    l1 = l4 * (1.0 + c33) - c23 * c23 * a1 - c13 * c13 * a2 + 2.0 * c12 * c13 * c23
    l2 = l4 * (1.0 + c44) - c24 * c24 * a1 - c14 * c14 * a2 + 2.0 * c12 * c14 * c24
    return _4_PI2 * _asin(l0 / torch.sqrt(l1 * l2)) / torch.sqrt(l4)


def linear_I2(c11: Tensor, c12: Tensor, c22: Tensor) -> Tensor:
    """``<u1 u2> = C12`` (``phi(z) = z``)."""
    return c12 + 0.0 * (c11 + c22)


def linear_I3(c11: Tensor, c12: Tensor, c13: Tensor, c23: Tensor, c33: Tensor) -> Tensor:
    """``<1 * u2 u3> = C23`` (``phi' = 1``)."""
    return c23 + 0.0 * (c11 + c12 + c13 + c33)


def linear_I4(
    c11: Tensor, c12: Tensor, c13: Tensor, c14: Tensor, c22: Tensor,
    c23: Tensor, c24: Tensor, c33: Tensor, c34: Tensor, c44: Tensor,
) -> Tensor:
    """``<1 * 1 * u3 u4> = C34``."""
    return c34 + 0.0 * (c11 + c12 + c13 + c14 + c22 + c23 + c24 + c33 + c44)


def _sqrt0(x: Tensor) -> Tensor:
    """sqrt of a quantity that is >= 0 in exact arithmetic (a Gram determinant)."""
    return torch.sqrt(x.clamp_min(0.0))


def relu_I2(c11: Tensor, c12: Tensor, c22: Tensor) -> Tensor:
    """``<relu(u1) relu(u2)> = [sqrt(C11 C22 - C12^2) + C12 (pi/2 + asin(C12/sqrt(C11 C22)))] / (2 pi)``.

    The arc-cosine kernel (docs/theory.md#relu-averages; ``atan(C12/sqrt(C11 C22 - C12^2))`` there equals the
    ``asin`` here, which stays finite when ``C11 C22 = C12^2``). ``C11 = C22 = C12 = c`` gives ``c/2``.
    """
    prod = c11 * c22
    safe = torch.where(prod > 0, prod, torch.ones_like(prod))
    r = torch.where(prod > 0, c12 / torch.sqrt(safe), torch.zeros_like(c12))
    return (_sqrt0(prod - c12 * c12) + c12 * (0.5 * math.pi + _asin(r))) / (2.0 * math.pi)


def relu_I3(c11: Tensor, c12: Tensor, c13: Tensor, c23: Tensor, c33: Tensor) -> Tensor:
    """``<relu'(u1) u2 relu(u3)>`` (docs/theory.md#relu-averages)::

        C12 sqrt(C11 C33 - C13^2) / (2 pi C11) + C23 asin(C13 / sqrt(C11 C33)) / (2 pi) + C23 / 4

    A unit with ``C11 = 0`` (zero weights) is assigned the ``C11 -> 0`` value ``C23/4`` of the
    formula for ``C12 = C13 = 0``.
    """
    prod = c11 * c33
    safe_prod = torch.where(prod > 0, prod, torch.ones_like(prod))
    safe_c11 = torch.where(c11 > 0, c11, torch.ones_like(c11))
    r = torch.where(prod > 0, c13 / torch.sqrt(safe_prod), torch.zeros_like(c13))
    first = torch.where(c11 > 0, c12 * _sqrt0(prod - c13 * c13) / safe_c11, torch.zeros_like(c12))
    return (first + c23 * _asin(r)) / (2.0 * math.pi) + 0.25 * c23


def _relu_I4(*args: Tensor) -> Tensor:
    raise NotImplementedError(
        "meanfield: <relu'(a) relu'(b) relu(c) relu(d)> has no closed form; the ReLU ODE is the "
        "small-learning-rate limit without the eta^2 term (integrate(..., eta2_term=False))"
    )


class _Averages(NamedTuple):
    I2: Callable[..., Tensor]
    I3: Callable[..., Tensor]
    I4: Callable[..., Tensor]


_AVERAGES = {
    "erf": _Averages(erf_I2, erf_I3, erf_I4),
    "linear": _Averages(linear_I2, linear_I3, linear_I4),
    "relu": _Averages(relu_I2, relu_I3, _relu_I4),
}


def _averages(activation: str) -> _Averages:
    _check_activation(activation)
    return _AVERAGES[activation]


# ---------------------------------------------------------------------------------------------
# Gaussian averages, covariance-matrix level
# ---------------------------------------------------------------------------------------------
def _check_cov(C: Tensor, n: int, name: str) -> None:
    if C.dim() < 2 or C.shape[-1] != n or C.shape[-2] != n:
        raise ValueError(f"meanfield.{name}: expected a covariance of shape (..., {n}, {n}), got {tuple(C.shape)}")


def I2(C: Tensor, activation: str = "erf") -> Tensor:
    """``<phi(u1) phi(u2)>`` for ``u ~ N(0, C)``, ``C`` of shape ``(..., 2, 2)``."""
    _check_cov(C, 2, "I2")
    return _averages(activation).I2(C[..., 0, 0], C[..., 0, 1], C[..., 1, 1])


def I3(C: Tensor, activation: str = "erf") -> Tensor:
    """``<phi'(u1) u2 phi(u3)>`` for ``u ~ N(0, C)``, ``C`` of shape ``(..., 3, 3)``."""
    _check_cov(C, 3, "I3")
    return _averages(activation).I3(C[..., 0, 0], C[..., 0, 1], C[..., 0, 2], C[..., 1, 2], C[..., 2, 2])


def I4(C: Tensor, activation: str = "erf") -> Tensor:
    """``<phi'(u1) phi'(u2) phi(u3) phi(u4)>`` for ``u ~ N(0, C)``, ``C`` of shape ``(..., 4, 4)``.

    Not available for ReLU (NotImplementedError; see the module docstring).
    """
    _check_cov(C, 4, "I4")
    c = lambda i, j: C[..., i, j]  # noqa: E731
    return _averages(activation).I4(
        c(0, 0), c(0, 1), c(0, 2), c(0, 3), c(1, 1), c(1, 2), c(1, 3), c(2, 2), c(2, 3), c(3, 3)
    )


# ---------------------------------------------------------------------------------------------
# generalisation error
# ---------------------------------------------------------------------------------------------
def _float(x: Union[Tensor, float, Sequence[float]], like: Optional[Tensor] = None) -> Tensor:
    x = torch.as_tensor(x)
    if not x.is_floating_point():
        x = x.to(torch.float64 if like is None else like.dtype)
    return x


@sized_threads()
def generalisation_error(
    Q: Tensor, R: Tensor, T: Tensor, h: Tensor, h_T: Tensor, activation: str = "erf"
) -> Tensor:
    """``eps = 1/2 <Delta^2>`` from the order parameters of one task ([S] Eq. 9, docs/theory.md#generalisation-error).

    ``eps = 1/2 [sum_ik h_i h_k I2(Q) + sum_nm hT_n hT_m I2(T) - 2 sum_in h_i hT_n I2(R)]``.

    Args:
        Q: ``(..., p, p)``; R: ``(..., p, p*)`` (this task's teacher); T: ``(..., p*, p*)``
            (``T^(t,t)``); h: ``(..., p)``; h_T: ``(..., p*)``. Leading dimensions broadcast.
        activation: ``"erf"``, ``"relu"`` or ``"linear"``.

    Returns:
        ``(...)``.
    """
    av = _averages(activation)
    Q = _float(Q)
    R, T, h, h_T = (_float(x, Q) for x in (R, T, h, h_T))
    qd = torch.diagonal(Q, dim1=-2, dim2=-1)
    td = torch.diagonal(T, dim1=-2, dim2=-1)
    iqq = av.I2(qd.unsqueeze(-1), Q, qd.unsqueeze(-2))
    itt = av.I2(td.unsqueeze(-1), T, td.unsqueeze(-2))
    iqt = av.I2(qd.unsqueeze(-1), R, td.unsqueeze(-2))
    ss = torch.einsum("...i,...ik,...k->...", h, iqq, h)
    tt = torch.einsum("...n,...nm,...m->...", h_T, itt, h_T)
    st = torch.einsum("...i,...in,...n->...", h, iqt, h_T)
    return 0.5 * (ss + tt - 2.0 * st)


# ---------------------------------------------------------------------------------------------
# the ODEs ([S] Eqs. 20-22)
# ---------------------------------------------------------------------------------------------
def _covariance(Q: Tensor, R: Tensor, T: Tensor) -> Tensor:
    """Joint covariance of ``(lam_1..lam_p, rho^(1)_1..rho^(1)_p*, ..., rho^(n)_p*)``.

    Q ``(E, p, p)``, R ``(E, n, p, p*)``, T ``(E, n, n, p*, p*)`` -> ``(E, N, N)``,
    ``N = p + n p*``: ``[[Q, R1, R2, ..], [R1^T, T11, T12, ..], ..]``.
    """
    E, n, p, ps = R.shape
    Rf = R.permute(0, 2, 1, 3).reshape(E, p, n * ps)
    Tf = T.permute(0, 1, 3, 2, 4).reshape(E, n * ps, n * ps)
    top = torch.cat([Q, Rf], dim=-1)
    bottom = torch.cat([Rf.transpose(-1, -2), Tf], dim=-1)
    return torch.cat([top, bottom], dim=-2)


class _TaskIndex(NamedTuple):
    """Flat indices into the covariance ``C.reshape(N*N, E)`` of the entries one task needs.

    The I4 average is symmetric under ``i <-> k`` and under ``a <-> c``; only pairs ``i <= k``
    and ``a <= c`` are evaluated (``w_ac`` counts the off-diagonal pairs twice) and ``ik_full``
    maps the ``(p, p)`` grid back onto the evaluated pairs.
    """

    A: Tensor  # (M,) pre-activations in Delta: the p students, then this task's p* teachers
    i2: Tensor  # (3 p M,): entries of I2(i, a)
    i3: Tensor  # (5 p N M,): entries of I3(i, b, a)
    i4: Tensor  # (10 P1 P2,): entries of I4(i, k, a, c) for i <= k, a <= c
    a_pair: Tensor  # (P2,) first member a of each pair a <= c, as a position in A
    c_pair: Tensor  # (P2,) second member c
    w_ac: Tensor  # (P2, 1) multiplicity of the pair (1 on the diagonal, 2 off it)
    ik_full: Tensor  # (p p,) index of pair (min(i,k), max(i,k)) among the P1 pairs


def _task_indices(p: int, ps: int, n: int, device: torch.device, dtype: torch.dtype) -> list[_TaskIndex]:
    N = p + n * ps
    out = []
    iu_p = torch.triu_indices(p, p)  # (2, P1)
    pair_of = torch.empty(p, p, dtype=torch.long)
    pair_of[iu_p[0], iu_p[1]] = torch.arange(iu_p.shape[1])
    pair_of[iu_p[1], iu_p[0]] = torch.arange(iu_p.shape[1])
    for t in range(n):
        A = torch.cat([torch.arange(p), torch.arange(p + t * ps, p + (t + 1) * ps)])
        M = A.numel()
        f = lambda r, c: r * N + c  # noqa: E731
        i, a = torch.arange(p).view(p, 1), A.view(1, M)
        i2 = torch.stack(torch.broadcast_tensors(f(i, i), f(i, a), f(a, a)))
        i, b, a = torch.arange(p).view(p, 1, 1), torch.arange(N).view(1, N, 1), A.view(1, 1, M)
        i3 = torch.stack(torch.broadcast_tensors(f(i, i), f(i, b), f(i, a), f(b, a), f(a, a)))
        iu_m = torch.triu_indices(M, M)  # (2, P2), positions in A
        i, k = iu_p[0].view(-1, 1), iu_p[1].view(-1, 1)
        a, c = A[iu_m[0]].view(1, -1), A[iu_m[1]].view(1, -1)
        i4 = torch.stack(torch.broadcast_tensors(
            f(i, i), f(i, k), f(i, a), f(i, c), f(k, k), f(k, a), f(k, c), f(a, a), f(a, c), f(c, c)
        ))
        w_ac = torch.where(iu_m[0] == iu_m[1], 1.0, 2.0).to(dtype).view(-1, 1)
        out.append(_TaskIndex(
            *(x.reshape(-1).contiguous().to(device) for x in (A, i2, i3, i4, iu_m[0], iu_m[1])),
            w_ac.to(device), pair_of.reshape(-1).to(device),
        ))
    return out


def _gather(Cf: Tensor, idx: Tensor, k: int, shape: tuple[int, ...]) -> tuple[Tensor, ...]:
    """``k`` covariance-entry tensors of shape ``(*shape, E)`` gathered from ``Cf (N*N, E)``."""
    return torch.index_select(Cf, 0, idx).view(k, *shape, Cf.shape[-1]).unbind(0)


def _full_I2(C: Tensor, av: _Averages) -> Tensor:
    """``I2`` between every pair of pre-activations, ``C (N, N, E)`` -> ``(N, N, E)``."""
    diag = torch.diagonal(C, dim1=0, dim2=1).T  # (N, E)
    return av.I2(diag[:, None], C, diag[None, :])


def _eps_all(I2full: Tensor, heads: Tensor, teacher_heads: Tensor, tix: list[_TaskIndex]) -> Tensor:
    """Generalisation error of every task, ``(n, E)``, from ``I2full (N, N, E)``.

    heads ``(n, p, E)``, teacher_heads ``(n, p*, E)``.
    """
    out = []
    for t, ti in enumerate(tix):
        v = torch.cat([heads[t], -teacher_heads[t]], dim=0)  # (M, E)
        sub = I2full[ti.A][:, ti.A]  # (M, M, E)
        out.append(0.5 * (sub * v.unsqueeze(0) * v.unsqueeze(1)).sum((0, 1)))
    return torch.stack(out, dim=0)


def _rates(
    C: Tensor, heads: Tensor, teacher_heads: Tensor, task: int, av: _Averages,
    eta: float, eta2_term: bool, ti: _TaskIndex,
) -> tuple[Tensor, Tensor, Tensor]:
    """Rates at covariance ``C (N, N, E)`` (ensemble last) while ``task`` trains.

    heads ``(n, p, E)``, teacher_heads ``(n, p*, E)``. Returns ``dQ/dalpha (p, p, E)``,
    ``d[R^(1) .. R^(n)]/dalpha`` as one ``(p, n p*, E)`` block (the student-teacher block of C)
    and ``dh^(task)/dalpha (p, E)``.
    """
    N, _, E = C.shape
    p = heads.shape[1]
    M = ti.A.numel()
    Cf = C.view(N * N, E)
    h = heads[task]  # (p, E)
    v = torch.cat([h, -teacher_heads[task]], dim=0)  # (M, E): Delta = sum_a v_a phi(u_a)
    # dh_i = -eta <Delta phi(lam_i)> = -eta sum_a v_a I2(i, a)                       [S] Eq. 22
    I2_SA = av.I2(*_gather(Cf, ti.i2, 3, (p, M)))  # (p, M, E)
    dh = -eta * (I2_SA * v).sum(1)
    # G[i, b] = <phi'(lam_i) Delta u_b> = sum_a v_a I3(i, b, a), b over all N pre-activations
    i3 = av.I3(*_gather(Cf, ti.i3, 5, (p, N, M)))  # (p, N, M, E)
    hG = h.unsqueeze(1) * (i3 * v).sum(2)  # (p, N, E): h_i <phi'(lam_i) Delta u_b>
    dQ = hG[:, :p]
    dQ = -eta * (dQ + dQ.transpose(0, 1))  # [S] Eq. 20, first two terms
    if eta2_term:
        # + eta^2 h_i h_k <phi'(lam_i) phi'(lam_k) Delta^2> = eta^2 h_i h_k sum_ac v_a v_c I4(i,k,a,c)
        i4 = av.I4(*_gather(Cf, ti.i4, 10, (-1, ti.w_ac.shape[0])))  # (P1, P2, E)
        vv = ti.w_ac * v[ti.a_pair] * v[ti.c_pair]  # (P2, E)
        D2 = (i4 * vv).sum(1)[ti.ik_full].view(p, p, E)
        dQ = dQ + (eta * eta) * (h.unsqueeze(1) * h.unsqueeze(0)) * D2
    # dR^(t')_in = -eta h_i <phi'(lam_i) Delta rho^(t')_n>, every teacher t'           [S] Eq. 21
    dRf = -eta * hG[:, p:]
    return dQ, dRf, dh


def _to_last(x: Tensor) -> Tensor:
    """Move the leading ensemble axis last (contiguous)."""
    return x.movedim(0, -1).contiguous()


@sized_threads(lambda Q, R, *args, **kwargs: (_step_work(Q, R), torch.as_tensor(Q).device))
def derivatives(
    Q: Tensor, R: Tensor, T: Tensor, heads: Tensor, teacher_heads: Tensor, task: int, *,
    activation: str = "erf", eta: float = 1.0, eta2_term: Optional[bool] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-hand side of [S] Eqs. 20-22 while task ``task`` (0-based) is trained.

    Shapes as in :func:`integrate` (an unbatched input gets ``E = 1``). Returns
    ``(dQ/dalpha (E, p, p), dR/dalpha (E, n_tasks, p, p*), dh^(task)/dalpha (E, p))``; the other
    heads do not move.
    """
    Q, R, T, heads, teacher_heads = _prepare(Q, R, T, heads, teacher_heads)
    eta2 = _eta2(activation, eta2_term)
    E, n, p, ps = R.shape
    ti = _task_indices(p, ps, n, Q.device, Q.dtype)[task]
    C = _to_last(_covariance(Q, R, T))
    dQ, dRf, dh = _rates(C, _to_last(heads), _to_last(teacher_heads), task, _averages(activation), eta, eta2, ti)
    dR = dRf.reshape(p, n, ps, E).permute(3, 1, 0, 2)
    return dQ.movedim(-1, 0), dR, dh.movedim(-1, 0)


@dataclass
class MeanFieldTrajectory:
    """Recorded trajectories of :func:`integrate` (time on axis 1, after the ensemble axis).

    Attributes:
        alpha: ``(n_rec,)`` recorded times (``alpha = steps / d``).
        Q: ``(E, n_rec, p, p)``; R: ``(E, n_rec, n_tasks, p, p*)``; heads: ``(E, n_rec, n_tasks, p)``.
        eps: ``(E, n_rec, n_tasks)`` generalisation error of every task at every record.
        task: ``(n_rec,)`` index of the task trained on the step that starts at each record.
        i_switch: record indices of the task switches (``alpha[i_switch[k]]`` is switch ``k``).
        alpha_switch: the switch times actually used (rounded to the Euler grid).
        eta2_term: whether the ``eta^2 I4`` term was included in the ``Q`` equation.
        activation: the activation name.
    """

    alpha: Tensor
    Q: Tensor
    R: Tensor
    heads: Tensor
    eps: Tensor
    task: Tensor
    i_switch: list[int]
    alpha_switch: list[float]
    eta2_term: bool
    activation: str

    def index(self, alpha: float) -> int:
        """Index of the record nearest to time ``alpha``."""
        return int(torch.argmin((self.alpha - alpha).abs()))

    def error_at(self, alpha: float) -> Tensor:
        """Every member's error on every task at time ``alpha``, (E, n_tasks) float64, interpolated
        linearly between the records."""
        a, eps = self.alpha.numpy(), self.eps.numpy()
        return torch.tensor([[np.interp(alpha, a, eps[e, :, t]) for t in range(eps.shape[2])] for e in range(eps.shape[0])],
                            dtype=torch.float64)


def _eta2(activation: str, eta2_term: Optional[bool]) -> bool:
    _check_activation(activation)
    if eta2_term is None:
        return activation != "relu"
    if eta2_term and activation == "relu":
        raise ValueError(
            "meanfield: eta2_term=True is not available for activation='relu' (no closed form for "
            "<relu'(a) relu'(b) relu(c) relu(d)>); use eta2_term=False, the small-learning-rate limit"
        )
    return bool(eta2_term)


def _prepare(Q, R, T, heads, teacher_heads):
    """Validate shapes, add the ensemble dimension where missing, broadcast T and teacher heads."""
    Q = _float(Q)
    if Q.dim() == 2:
        Q = Q.unsqueeze(0)
        R, heads = torch.as_tensor(R).unsqueeze(0), torch.as_tensor(heads).unsqueeze(0)
    if Q.dim() != 3 or Q.shape[-1] != Q.shape[-2]:
        raise ValueError(f"meanfield: Q0 must be (p, p) or (E, p, p), got {tuple(Q.shape)}")
    E, p, _ = Q.shape
    R, T, heads, teacher_heads = (_float(x, Q).to(device=Q.device, dtype=Q.dtype) for x in (R, T, heads, teacher_heads))
    if R.dim() != 4 or R.shape[0] != E or R.shape[2] != p:
        raise ValueError(f"meanfield: R0 must be (E, n_tasks, p, p*) = ({E}, n, {p}, p*), got {tuple(R.shape)}")
    n, ps = R.shape[1], R.shape[3]
    if T.dim() == 4:
        T = T.unsqueeze(0)
    if T.dim() != 5 or T.shape[-4:] != (n, n, ps, ps) or T.shape[0] not in (1, E):
        raise ValueError(f"meanfield: T must be ([E,] {n}, {n}, {ps}, {ps}), got {tuple(T.shape)}")
    T = T.expand(E, n, n, ps, ps)
    if heads.shape != (E, n, p):
        raise ValueError(f"meanfield: heads0 must be (E, n_tasks, p) = ({E}, {n}, {p}), got {tuple(heads.shape)}")
    if teacher_heads.dim() == 2:
        teacher_heads = teacher_heads.unsqueeze(0)
    if teacher_heads.dim() != 3 or teacher_heads.shape[-2:] != (n, ps) or teacher_heads.shape[0] not in (1, E):
        raise ValueError(f"meanfield: teacher_heads must be ([E,] {n}, {ps}), got {tuple(teacher_heads.shape)}")
    teacher_heads = teacher_heads.expand(E, n, ps).contiguous()
    Q = 0.5 * (Q + Q.transpose(-1, -2))
    return Q.contiguous(), R.contiguous(), T.contiguous(), heads.clone().contiguous(), teacher_heads


def integrate(
    Q0: Tensor,
    R0: Tensor,
    T: Tensor,
    heads0: Tensor,
    teacher_heads: Tensor,
    *,
    activation: str = "erf",
    eta: float = 1.0,
    alpha_switch: Union[float, Sequence[float]],
    alpha_end: float,
    d_alpha: float = 0.01,
    record_every: float = 0.1,
    eta2_term: Optional[bool] = None,
    cpu_threads: Union[int, Literal["auto"], None] = "auto",
) -> MeanFieldTrajectory:
    """Euler integration of the continual-learning ODEs [S] Eqs. 20-22 (Lee et al. 2021).

    Task ``k`` (0-based) is trained on ``[alpha_switch[k-1], alpha_switch[k])`` (task 0 from 0,
    the last task until ``alpha_end``): ``W`` (so ``Q`` and every ``R^(t)``) always learns, only the
    active task's head learns, ``T`` is fixed. All ensemble members are integrated at once as
    batched tensor operations; the loop is over Euler steps only. Computation runs in the dtype
    and on the device of ``Q0`` (float64 if it is not floating point).

    Args:
        Q0: ``(E, p, p)`` initial student overlaps, or ``(p, p)`` for a single member (then
            ``R0`` and ``heads0`` are unbatched too, and the outputs have ``E = 1``).
        R0: ``(E, n_tasks, p, p*)`` initial student-teacher overlaps.
        T: ``(n_tasks, n_tasks, p*, p*)`` or ``(E, n_tasks, n_tasks, p*, p*)`` teacher overlaps.
        heads0: ``(E, n_tasks, p)`` initial heads of every task (a head waits, unchanged, until its
            task starts).
        teacher_heads: ``(n_tasks, p*)`` or ``(E, n_tasks, p*)``.
        activation: ``"erf"``, ``"linear"`` or ``"relu"`` (ReLU: small-learning-rate limit, see
            the module docstring).
        eta: learning rate as in docs/theory.md#student-sgd (``W`` step ``eta/sqrt d``, head step ``eta/d``).
        alpha_switch: time of the switch to the second task, or a sequence of ``n_tasks - 1``
            increasing switch times (rounded to the Euler grid); ignored for one task.
        alpha_end: total training time.
        d_alpha: Euler step in alpha.
        record_every: record spacing in alpha (rounded to a whole number of Euler steps); the
            start, every switch and the end are always recorded.
        eta2_term: include the ``eta^2 I4`` term of the ``Q`` equation; default True for erf and
            linear, False (and True not allowed) for ReLU.
        cpu_threads: torch intra-op threads while integrating on the CPU, for this call only (the
            previous count is restored on return or error). ``"auto"`` (default) chooses by size
            (:func:`zoo.utils.threads.threads_for` of the per-step work ``E p N (p + p*)``, ``N = p +
            n_tasks p*``): one thread below :data:`zoo.utils.threads.SMALL_WORK` elements (a 400-member
            grid ran 14x slower on 2 threads than on 1 with the other core busy), torch's setting
            above; an integer forces that count; ``None`` leaves torch's setting alone. Ignored on
            other devices.

    Returns:
        A :class:`MeanFieldTrajectory`.
    """
    if isinstance(cpu_threads, str):
        if cpu_threads != "auto":
            raise ValueError(f"meanfield: cpu_threads must be 'auto', a positive integer or None, got {cpu_threads!r}")
        cpu_threads = threads_for(_step_work(Q0, R0), torch.as_tensor(Q0).device)
    elif torch.as_tensor(Q0).device.type != "cpu":
        cpu_threads = None
    with num_threads(cpu_threads):
        return _integrate(Q0, R0, T, heads0, teacher_heads, activation, eta, alpha_switch, alpha_end,
                          d_alpha, record_every, eta2_term)


def _step_work(Q0: Tensor, R0: Tensor) -> int:
    """Elements of the largest elementwise tensor of one Euler step: the ``I3`` terms, ``E p N M``."""
    shape = torch.as_tensor(R0).shape
    if len(shape) < 3:
        return 0  # malformed: _prepare raises the error that names it
    E = 1 if torch.as_tensor(Q0).dim() == 2 else shape[0]
    n, p, ps = shape[-3], shape[-2], shape[-1]
    return E * p * (p + n * ps) * (p + ps)


def _integrate(Q0, R0, T, heads0, teacher_heads, activation, eta, alpha_switch, alpha_end, d_alpha,
               record_every, eta2_term) -> MeanFieldTrajectory:
    av = _averages(activation)
    eta2 = _eta2(activation, eta2_term)
    Q, R, T, heads, teacher_heads = _prepare(Q0, R0, T, heads0, teacher_heads)
    E, n, p, ps = R.shape
    N = p + n * ps
    if isinstance(alpha_switch, (list, tuple)):
        switches = [float(a) for a in alpha_switch]
    else:
        switches = [float(alpha_switch)]
    if n == 1:
        switches = []
    elif len(switches) != n - 1:
        raise ValueError(f"meanfield: {n} tasks need {n - 1} switch times, got alpha_switch={alpha_switch}")
    if not (d_alpha > 0 and alpha_end > 0 and record_every > 0):
        raise ValueError(
            f"meanfield: d_alpha, alpha_end and record_every must be > 0, got {d_alpha}, {alpha_end}, {record_every}"
        )
    n_steps = int(round(alpha_end / d_alpha))
    switch_steps = [int(round(a / d_alpha)) for a in switches]
    bounds = [0] + switch_steps + [n_steps]
    if any(b <= a for a, b in zip(bounds[:-1], bounds[1:])):
        raise ValueError(
            f"meanfield: need 0 < alpha_switch[0] < ... < alpha_end on the Euler grid, got "
            f"alpha_switch={switches}, alpha_end={alpha_end}, d_alpha={d_alpha}"
        )
    stride = max(1, int(round(record_every / d_alpha)))
    rec_steps = sorted(set(range(0, n_steps + 1, stride)) | set(switch_steps) | {n_steps})
    rec_pos = {s: k for k, s in enumerate(rec_steps)}
    n_rec = len(rec_steps)

    dt = dict(dtype=Q.dtype, device=Q.device)
    out_C = torch.empty(n_rec, p, N, E, **dt)  # student rows of C: [Q | R^(1) .. R^(n)]
    out_h = torch.empty(n_rec, n, p, E, **dt)
    out_eps = torch.empty(n_rec, n, E, **dt)
    out_task = torch.empty(n_rec, dtype=torch.long)
    tix = _task_indices(p, ps, n, Q.device, Q.dtype)

    # state, ensemble axis last: the joint covariance C (N, N, E), whose student rows and columns
    # evolve (the teacher block is T), and the heads (n, p, E)
    C = _to_last(_covariance(Q, R, T))
    heads = _to_last(heads)
    teacher_heads = _to_last(teacher_heads)
    task = 0
    for step in range(n_steps + 1):
        while task < len(switch_steps) and step >= switch_steps[task]:
            task += 1
        k = rec_pos.get(step)
        if k is not None:
            out_C[k] = C[:p]
            out_h[k] = heads
            out_eps[k] = _eps_all(_full_I2(C, av), heads, teacher_heads, tix)
            out_task[k] = task
        if step == n_steps:
            break
        dQ, dRf, dh = _rates(C, heads, teacher_heads, task, av, eta, eta2, tix[task])
        C[:p, :p] += d_alpha * dQ
        dRf = d_alpha * dRf
        C[:p, p:] += dRf
        C[p:, :p] += dRf.transpose(0, 1)
        heads[task] += d_alpha * dh

    out_C = out_C.movedim(-1, 0)  # (E, n_rec, p, N)
    return MeanFieldTrajectory(
        alpha=torch.tensor(rec_steps, dtype=Q.dtype) * d_alpha,
        Q=out_C[..., :p].contiguous(),
        R=out_C[..., p:].reshape(E, n_rec, p, n, ps).permute(0, 1, 3, 2, 4).contiguous(),
        heads=out_h.movedim(-1, 0).contiguous(), eps=out_eps.movedim(-1, 0).contiguous(), task=out_task,
        i_switch=[rec_pos[s] for s in switch_steps],
        alpha_switch=[s * d_alpha for s in switch_steps],
        eta2_term=eta2, activation=activation,
    )


# ------------------------------------------------------------------------------------------------
# the ODE of a student ensemble, and when it describes a run
# ------------------------------------------------------------------------------------------------
RELU_SMALL_ETA = 0.01
"""The largest learning rate at which the ReLU ODE is trusted. It drops the ``eta^2 I4`` term of
dQ/dalpha ([S] Eq. 20; no closed form), a relative error of order ``eta`` in the rates that
accumulates in time, and the error curves are what it is compared with. Measured (d = 1000,
p = 2, p* = 1, sigma_w = 1e-3, theta = pi/32, one stream), the simulated error exceeded the ODE's
at ``eta alpha = 1`` by 17 % (eta = 0.1), 7 % (0.03) and 1.4 % (0.01), and at ``eta alpha = 3`` by
150 %, 27 % and 9 %: only at 0.01 is the gap of the size of one run's finite-d fluctuations
(~5 % at d = 1000). Final entropies are less sensitive (mean |H_m(sim) - H_m(ODE)| 0.003 at
eta = 0.1 on the fig5 ReLU grid), but one rule serves every comparison."""


def ode_caveats(activation: str, eta: float, data: object = None, ewc: bool = False) -> list[str]:
    """Why the mean-field ODE ([S] Eqs. 20-22) does not describe a run; empty when it does.

    The ODE is exact as ``d -> infinity`` for online SGD (one fresh, noiseless sample per step)
    with one ``phi`` for teacher and student and no penalty: erf and linear at any ``eta``, ReLU in
    its small-learning-rate limit (``eta <= RELU_SMALL_ETA``); sigmoid has no closed-form averages.
    ``data`` is read duck-typed (a ``datamodules.TeacherStudent``: ``activation``, ``batch_size``,
    ``num_samples``, ``noise_std``).
    """
    if activation not in ACTIVATIONS:
        return [f"activation {activation!r} has no mean-field theory (allowed: {', '.join(ACTIVATIONS)})"]
    checks = (
        (activation == "relu" and eta > RELU_SMALL_ETA,
         f"eta = {eta:g} with ReLU, whose ODE is the small-eta limit (no eta^2 term): trusted for eta <= {RELU_SMALL_ETA:g}"),
        (getattr(data, "activation", activation) != activation,
         f"the teacher's activation ({getattr(data, 'activation', '')}) differs from the student's ({activation})"),
        (getattr(data, "batch_size", 1) != 1, "minibatches (batch_size > 1)"),
        (getattr(data, "num_samples", None) is not None, "a finite training pool (num_samples)"),
        (getattr(data, "noise_std", 0.0) > 0, "label noise (noise_std > 0)"),
        (ewc, "an EWC penalty"),
    )
    return [why for bad, why in checks if bad]


def student_mean_field(
    Q0: Tensor, R0: Tensor, T: Tensor, heads0: Tensor, teacher_heads: Tensor, *, activation: str, eta: float,
    alpha_switch: Sequence[float], alpha_end: float, d_alpha: float = 0.01,
    record_at: Sequence[float] = (), record_every: Optional[float] = None, members: Optional[int] = None,
) -> MeanFieldTrajectory:
    """:func:`integrate` from a student ensemble's initial order parameters (``Q0, R0, T`` of
    ``MultiHeadStudent.order_parameters(initial=True)``, its initial heads and its teachers' heads),
    for its first ``members`` members, on the CPU in float64.

    Only the tasks that start before ``alpha_end`` are integrated (a later task's head and ``R`` do
    not act on ``W``). Records every ``record_every`` (default ``d_alpha``) on a grid that holds
    each time in ``record_at`` exactly (the start, the switches and the end always are).
    """
    cut = slice(None) if members is None else slice(0, members)
    switches = [float(a) for a in alpha_switch if a < alpha_end]
    k = len(switches) + 1
    Q0, R0, T, heads0, teacher_heads = (x[cut].detach().double().cpu() for x in (Q0, R0, T, heads0, teacher_heads))
    every = d_alpha if record_every is None else max(float(record_every), d_alpha)
    stride = max(1, int(round(every / d_alpha)))
    for a in record_at:
        stride = math.gcd(stride, int(round(a / d_alpha)))
    return integrate(Q0, R0[:, :k], T[:, :k, :k], heads0[:, :k], teacher_heads[:, :k], activation=activation, eta=eta,
                     alpha_switch=switches, alpha_end=alpha_end, d_alpha=d_alpha, record_every=stride * d_alpha)
