"""Closed-form learning dynamics of two-layer linear networks (pure torch, no Lightning).

Sources (see ``docs/theory.md#linear-networks``, which restates and checks every formula used here):

* [S] Jarvis, Lee et al. 2025, "specialisation": one pathway ``y = h w^T x`` with imbalance
  ``lam = h^2 - |w|^2`` ([S] Eq. 3 / Eq. 14, App. A), escape and hitting times ([S] Eqs. 15-18).
* [L] Dominé et al. 2025, "from lazy to rich": the lambda-balanced two-layer network, its exact
  matrix Riccati solution ([L] Thm. 4.3), the stable equal-dimension form ([L] App. B.5) and the
  task-aligned singular values ([L] Thm. 5.1).
* [H] Jarvis et al., "make haste slowly", App. C Eq. 18: the Saxe sigmoid.

Conventions. Whitened inputs (``Sigma_x = I``, or ``d I`` where a ``d`` argument exists), loss
``1/2 <|y - W2 W1 x|^2>`` (mean over samples), so full-batch gradient descent with learning rate
``eta`` follows gradient flow with ``tau = 1/eta`` (time in steps). Every scalar argument may be a
Python number or a tensor; tensors broadcast against each other and against ``t`` so a whole
parameter grid is evaluated in one call. Computations are carried out in float64 unless a tensor
argument is already floating point of another precision (then the common torch promotion applies).
"""
from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor

from zoo.utils.threads import broadcast_work, sized_threads

Number = Union[float, int, Tensor]

__all__ = [
    "saxe_mode",
    "aligned_singular_value",
    "omega",
    "escape_time",
    "hitting_time",
    "qqt",
    "qqt_stable",
    "network_map",
    "input_rsm",
    "output_rsm",
    "linear_ntk_from_qqt",
]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _tensors(*xs: Number) -> list[Tensor]:
    """Turn numbers/tensors into tensors of one common floating dtype (float64 by default)."""
    dtype = torch.float64
    device = None
    float_ts = [x for x in xs if isinstance(x, Tensor) and x.is_floating_point()]
    if float_ts:
        dtype = float_ts[0].dtype
        for x in float_ts[1:]:
            dtype = torch.promote_types(dtype, x.dtype)
    for x in xs:
        if isinstance(x, Tensor):
            device = x.device
            break
    return [torch.as_tensor(x, dtype=dtype, device=device) for x in xs]


def _phi(mu: Tensor, t: Tensor) -> Tensor:
    """``expm1(2 mu t) / mu`` with its ``mu -> 0`` limit ``2 t`` (NaN-free values and gradients)."""
    small = mu.abs() < 1e-300
    safe_mu = torch.where(small, torch.ones_like(mu), mu)
    return torch.where(small, 2.0 * t + 0.0 * mu, torch.expm1(2.0 * safe_mu * t) / safe_mu)


# ---------------------------------------------------------------------------------------------
# scalar modes
# ---------------------------------------------------------------------------------------------
@sized_threads()
def saxe_mode(t: Number, *, s: Number, d: Number = 1.0, tau: Number = 1.0, a0: Number) -> Tensor:
    """Saxe sigmoid of a balanced mode from small init ([H] App. C Eq. 18, docs/theory.md#saxe-mode).

    ``a(t) = (s/d) / (1 - (1 - s/(d a0)) exp(-2 s t / tau))``, the solution of
    ``tau da/dt = 2 a (s - d a)`` (a lam = 0 mode, whose rate is ``h^2 + |w|^2 = 2 a``).
    ``s`` is the input-output singular value, ``d`` the input variance along the mode and
    ``a0 > 0`` the initial strength. Written as ``s a0 / (d a0 + (s - d a0) exp(-2 s t/tau))``,
    which is finite for every ``t >= 0``.
    """
    t, s, d, tau, a0 = _tensors(t, s, d, tau, a0)
    decay = torch.exp(-2.0 * s * t / tau)
    return s * a0 / (d * a0 + (s - d * a0) * decay)


def _inv_g(a: Tensor, l: Tensor, s: Tensor, gap: Tensor | None = None) -> Tensor:
    """The integration constant ``1/G(a)`` of [L] Thm. 5.1 (``l = |lam| >= 0``, ``s > 0``).

    With ``K = sqrt(l^2 + 4 s^2)``, ``p = K - l``, ``q = K + l``, ``r = sqrt(l^2 + 4 a^2)`` and
    ``u = 2 a / (l + r)`` (so that ``a = l u / (1 - u^2)``), the constant of docs/theory.md#aligned-singular-values is
    ``C = (q + 2 s u) / (p - 2 s u)`` and the solution depends on time only through
    ``E(t) = C exp(K t / tau)``. We carry ``g = 1 / (l C)`` instead: the denominator
    ``p - 2 s u`` cancels catastrophically as ``l -> 0``, and rationalising it gives
    ``p - 2 s u = 4 s l (s - a) [1 + l (s + a)/(s r + a K)] / ((K + l)(l + r))``, so
    ``1/(l C) = 4 s (s - a) [1 + l (s + a)/(s r + a K)] / ((q + 2 s u)(K + l)(l + r))``,
    finite and smooth at ``l = 0`` (where it becomes the Saxe constant ``(s - a)/(4 s a)``).
    ``gap`` is ``s - a`` when the caller knows it more accurately than the subtraction.
    """
    if gap is None:
        gap = s - a
    K = torch.hypot(l, 2.0 * s)
    r = torch.hypot(l, 2.0 * a)
    u = 2.0 * a / (l + r)
    # l (s + a) / (s r + a K) is 0/0 at a = -s (a reversed mode at full strength); there use the
    # equal form (s r - a K) / (l (s - a)), obtained by multiplying through by (s r - a K)
    den = s * r + a * K
    safe = den.abs() > 1e-9 * (s * r + a.abs() * K)
    # (safe denominator where alt is not used: l * gap = 0 at l = 0 would make the unused branch
    # NaN, and torch.where would pass 0 * NaN = NaN into the gradient with respect to lam)
    alt = (s * r - a * K) / torch.where(safe, torch.ones_like(den), l * gap)
    corr = 1.0 + torch.where(safe, l * (s + a) / torch.where(safe, den, torch.ones_like(den)), alt)
    return 4.0 * s * gap * corr / ((K + l + 2.0 * s * u) * (K + l) * (l + r))


def _aligned_from_g(g: Tensor, l: Tensor, s: Tensor) -> Tensor:
    """``a`` as a function of ``g = exp(-K t/tau) / (l C)`` (see :func:`aligned_singular_value`)."""
    K = torch.hypot(l, 2.0 * s)
    q = K + l
    p = 4.0 * s * s / q  # = K - l without cancellation when l >> s
    return s * (p - l * q * g) * (1.0 + l * g) / (p + 2.0 * p * q * g - l * l * q * g * g)


@sized_threads()
def aligned_singular_value(
    t: Number, *, lam: Number, s: Number, tau: Number = 1.0, a0: Number
) -> Tensor:
    """Task-aligned singular value of a lambda-balanced two-layer net ([L] Thm. 5.1).

    Solves ``tau da/dt = sqrt(lam^2 + 4 a^2) (s - a)`` (whitened input, ``s > 0``, any ``a0``: a
    negative ``a0`` is a reversed mode, [L] App. D.2, which stalls at the saddle when lam = 0;
    ``a`` depends on ``lam`` only through ``lam^2``). Closed form (docs/theory.md#aligned-singular-values): ``K = sqrt(lam^2 +
    4 s^2)``, ``u0 = 2 a0 sgn(lam)/(|lam| + sqrt(lam^2 + 4 a0^2))``, ``C = (K + lam + 2 s u0)/(K -
    lam - 2 s u0)``, ``E = C exp(sgn(lam) K t/tau)``, ``u = (K(E - 1) - lam(E + 1))/(2 s (E + 1))``,
    ``a = lam u / (1 - u^2)``.

    Implementation: by the ``lam -> -lam`` symmetry we work with ``l = |lam|``, and eliminate
    ``u`` algebraically. With ``p = K - l``, ``q = K + l`` and ``g = exp(-K t / tau) / (l C)``::

        a(t) = s (p - l q g)(1 + l g) / (p + 2 p q g - l^2 q g^2),

    where ``1/(l C)`` is computed in rationalised form (:func:`_inv_g`). This expression has only
    a decaying exponential (finite for every ``t >= 0``, ``a -> s``), works for ``a0`` above or
    below ``s``, and is exact and smooth at ``lam = 0``, where it reduces to the Saxe sigmoid with
    ``d = 1`` (:func:`saxe_mode`). For ``lam == 0`` exactly the Saxe branch is selected with
    ``torch.where`` (both branches are NaN-free, so gradients with respect to a ``lam`` tensor
    containing zeros are finite). Limits: ``|lam| -> inf`` gives lazy, exponential learning
    ``a ~ s + (a0 - s) exp(-|lam| t / tau)``.
    """
    t, lam, s, tau, a0 = _tensors(t, lam, s, tau, a0)
    l = lam.abs()
    K = torch.hypot(l, 2.0 * s)
    g = _inv_g(a0, l, s) * torch.exp(-K * t / tau)
    rich = _aligned_from_g(g, l, s)
    return torch.where(lam == 0, _balanced_mode(t, s, tau, a0), rich)


def _balanced_mode(t: Tensor, s: Tensor, tau: Tensor, a0: Tensor) -> Tensor:
    """The lam = 0 mode, ``tau da/dt = 2 |a| (s - a)``, for either sign of ``a0``.

    ``a0 >= 0``: the Saxe sigmoid. ``a0 < 0`` (a reversed mode, [L] App. D.2): with ``b = -a``,
    ``tau db/dt = -2 b (s + b)``, so ``a(t) = -s |a0| e / (s + |a0| (1 - e))``, ``e = exp(-2 s t/tau)``:
    the mode decays to the saddle ``a = 0`` and stalls there; it never changes sign.
    """
    e = torch.exp(-2.0 * s * t / tau)
    b0 = (-a0).clamp_min(0.0)
    reversed_ = -s * b0 * e / (s + b0 * (1.0 - e))
    return torch.where(a0 < 0, reversed_, saxe_mode(t, s=s, d=1.0, tau=tau, a0=a0.clamp_min(0.0)))


@sized_threads()
def omega(t: Number, *, lam: Number, s: Number, d: Number = 1.0, tau: Number = 1.0,
          omega0: Number) -> Tensor:
    """Effective singular value of one pathway ``y = h w^T x`` ([S] Eq. 3 = Eq. 14, App. A).

    The pathway's imbalance ``lam = h^2 - |w|^2`` (positive = output heavy) is conserved; with the
    input weights aligned to the task, ``omega = h |w|`` obeys
    ``tau d omega/dt = sqrt(lam^2 + 4 omega^2) (s - d omega)``, i.e. [S] Eq. 12. Closed form
    (docs/theory.md#one-pathway): ``theta0 = asinh(2 omega0/lam)``, ``k = sqrt(4 s^2 + lam^2 d^2)``, ``c``,
    ``e(t) = c exp(sgn(lam) k t/tau)``, ``omega = (lam/2) sinh(2 atanh((k(e - 1) - lam d (e + 1))
    / (2 s (e + 1))))``.

    Implementation: ``b = d omega`` obeys ``tau db/dt = sqrt((d lam)^2 + 4 b^2)(s - b)``, the
    equation of :func:`aligned_singular_value` with imbalance ``d lam`` and start ``d omega0``,
    which is evaluated in its overflow-free form. ``lam -> 0`` is handled exactly: ``lam == 0``
    gives the Saxe limit ``saxe_mode(t, s=s, d=d, tau=tau, a0=omega0)`` (no error is raised).
    Requires ``s > 0``, ``d > 0``, ``omega0 > 0``.
    """
    t, lam, s, d, tau, omega0 = _tensors(t, lam, s, d, tau, omega0)
    return aligned_singular_value(t, lam=d * lam, s=s, tau=tau, a0=d * omega0) / d


def _time_to(target: Tensor, *, lam: Tensor, s: Tensor, d: Tensor, tau: Tensor,
             omega0: Tensor, target_gap: Tensor | None = None) -> Tensor:
    """Time for :func:`omega` to go from ``omega0`` to ``target`` (both on the same side of s/d).

    Equivalent to the inversion of docs/theory.md#escape-hitting-times, ``t = tau/(sgn(lam) k) log((k + 2 s T + lam d) /
    (c (k - 2 s T - lam d)))``: ``omega`` depends on time only through ``g(t) = g0 exp(-k t/tau)``
    with ``g0 = 1/(l c)`` evaluated at the start, and the value ``target`` corresponds to
    ``g = 1/(l c)`` evaluated at the target (the flow is autonomous), hence
    ``t = (tau / k) log(g(omega0) / g(target))``. It is ``+inf`` when the target is the fixed
    point ``s/d``, NaN when it lies on the other side of the fixed point (never reached), and
    negative when the target lies behind ``omega0`` (passed before ``t = 0``: the flow run
    backwards).
    """
    l = (d * lam).abs()
    k = torch.hypot(l, 2.0 * s)
    g_start = _inv_g(d * omega0, l, s)
    g_end = _inv_g(d * target, l, s, None if target_gap is None else d * target_gap)
    ratio = g_start / g_end
    ratio = torch.where(ratio > 0, ratio, torch.full_like(ratio, float("nan")))
    return tau / k * torch.log(ratio)


@sized_threads()
def escape_time(v_hat: Number, *, lam: Number, s: Number, d: Number = 1.0, tau: Number = 1.0,
                omega0: Number) -> Tensor:
    """Escape time ``t_hat``: the time at which ``omega(t) = v_hat`` ([S] Eqs. 15-16).

    Exact inverse of :func:`omega` (see :func:`_time_to`): ``omega(escape_time(v)) == v`` for
    ``omega0 < v < s/d``. Broadcasts over all arguments; ``lam == 0`` gives the Saxe escape time
    ``tau/(2 s) log(v (s - d omega0) / (omega0 (s - d v)))``.
    """
    v_hat, lam, s, d, tau, omega0 = _tensors(v_hat, lam, s, d, tau, omega0)
    return _time_to(v_hat, lam=lam, s=s, d=d, tau=tau, omega0=omega0)


@sized_threads()
def hitting_time(v_star: Number, *, lam: Number, s: Number, d: Number = 1.0, tau: Number = 1.0,
                 omega0: Number) -> Tensor:
    """Hitting time ``t*``: the time at which ``omega(t) = s/d - v_star`` ([S] Eqs. 17-18).

    ``v_star > 0`` is the remaining distance to the fixed point ``s/d``. The rationalised
    constant keeps the factor ``s - d omega = d v_star`` exact, so small ``v_star`` loses no
    precision.
    """
    v_star, lam, s, d, tau, omega0 = _tensors(v_star, lam, s, d, tau, omega0)
    return _time_to(s / d - v_star, lam=lam, s=s, d=d, tau=tau, omega0=omega0, target_gap=v_star)


# ---------------------------------------------------------------------------------------------
# full matrix dynamics of a lambda-balanced two-layer network
# ---------------------------------------------------------------------------------------------
def _prepare(W1: Tensor, W2: Tensor, sigma_yx: Tensor, lam: Number, t: Number, tau: Number):
    """Validate shapes, promote dtypes and broadcast the batch dimensions of the QQ^T inputs."""
    W1, W2, sigma_yx, lam, t, tau = _tensors(W1, W2, sigma_yx, lam, t, tau)
    if W1.dim() < 2 or W2.dim() < 2 or sigma_yx.dim() < 2:
        raise ValueError("qqt: W1 (..., n_h, n_in), W2 (..., n_out, n_h) and sigma_yx "
                         "(..., n_out, n_in) must be at least 2-D")
    n_h, n_in = W1.shape[-2:]
    n_out = W2.shape[-2]
    if W2.shape[-1] != n_h or tuple(sigma_yx.shape[-2:]) != (n_out, n_in):
        raise ValueError(f"qqt: shapes do not chain: W1 {tuple(W1.shape)}, W2 {tuple(W2.shape)}, "
                         f"sigma_yx {tuple(sigma_yx.shape)}; need W1 (..., n_h, n_in), "
                         "W2 (..., n_out, n_h), sigma_yx (..., n_out, n_in)")
    if t.dim() > 1:
        raise ValueError(f"qqt: t must be a scalar or a 1-D tensor of times, got shape {tuple(t.shape)}")
    if bool((t < 0).any()):
        raise ValueError("qqt: times must be >= 0 (the closed form runs forward from the initial weights)")
    if tau.dim() != 0:
        raise ValueError("qqt: tau must be a scalar")
    t = t.reshape(-1)
    batch = torch.broadcast_shapes(W1.shape[:-2], W2.shape[:-2], sigma_yx.shape[:-2], lam.shape)
    W1 = W1.expand(*batch, n_h, n_in)
    W2 = W2.expand(*batch, n_out, n_h)
    sigma_yx = sigma_yx.expand(*batch, n_out, n_in)
    lam = lam.expand(batch)
    return W1, W2, sigma_yx, lam, t / tau, batch, (n_in, n_h, n_out)


def _riccati_F(sigma_yx: Tensor, lam: Tensor) -> Tensor:
    """``F = [[-lam/2 I, Sigma_yx^T], [Sigma_yx, lam/2 I]]`` of [L] Thm. 4.3, shape (..., N, N)."""
    n_out, n_in = sigma_yx.shape[-2:]
    half = (lam / 2.0)[..., None]
    diag = torch.cat([-half.expand(*lam.shape, n_in), half.expand(*lam.shape, n_out)], dim=-1)
    top = torch.cat([torch.zeros_like(sigma_yx[..., :1, :1]).expand(*lam.shape, n_in, n_in),
                     sigma_yx.transpose(-1, -2)], dim=-1)
    bottom = torch.cat([sigma_yx, torch.zeros_like(sigma_yx[..., :1, :1]).expand(*lam.shape, n_out, n_out)],
                       dim=-1)
    return torch.cat([top, bottom], dim=-2) + torch.diag_embed(diag)


@sized_threads(lambda *a, **k: _qqt_work(*a, **k))
def qqt(W1: Tensor, W2: Tensor, sigma_yx: Tensor, *, lam: Number, t: Number,
        tau: Number = 1.0) -> Tensor:
    """Exact ``QQ^T(t)`` of a lambda-balanced two-layer linear network ([L] Thm. 4.3).

    Network ``y = W2 W1 x`` on whitened input (``Sigma_x = I``), loss ``1/2 <|y - W2 W1 x|^2>``,
    gradient flow ``tau dW1/dt = W2^T (Sigma_yx - W2 W1)``, ``tau dW2/dt = (Sigma_yx - W2 W1) W1^T``,
    initial weights lambda-balanced: ``W2^T W2 - W1 W1^T = lam I`` (``lam`` must be the
    balance of the given weights; it is not re-estimated). With ``Q = [W1^T; W2]`` and
    ``F = [[-lam/2 I, Sigma_yx^T], [Sigma_yx, lam/2 I]]``, ``QQ^T`` solves the Riccati equation
    ``tau d(QQ^T)/dt = F QQ^T + QQ^T F - (QQ^T)^2``, with solution

        ``QQ^T(t) = e^{Ft/tau} Q0 [I + 1/2 Q0^T F^{-1}(e^{2Ft/tau} - I) Q0]^{-1} Q0^T e^{Ft/tau}``.

    Shapes: ``W1`` (..., n_h, n_in), ``W2`` (..., n_out, n_h), ``sigma_yx`` (n_out, n_in) or
    (..., n_out, n_in), ``lam`` a number or (...,), ``t`` a number or 1-D tensor of T times;
    the batch dimensions broadcast. Returns (..., T, n_in + n_out, n_in + n_out), laid out as

        ``[[W1^T W1 (input RSM), (W2 W1)^T], [W2 W1 (network map), W2 W2^T (output RSM)]]``

    (see :func:`input_rsm`, :func:`network_map`, :func:`output_rsm`). Any dimensions (also
    ``n_in != n_out`` and ``lam = 0``, where F is singular) are allowed; ``n_h <= n_in + n_out``.

    Evaluation. ``F = P diag(mu) P^T`` (symmetric, eigenvalues sorted descending) and
    ``F^{-1}(e^{2Ft} - I) = P diag(expm1(2 mu t)/mu) P^T`` with the ``mu -> 0`` limit ``2t``.
    In the eigenbasis ``A = P^T Q0`` and ``QQ^T = P D A M^{-1} A^T D P^T`` with
    ``D = diag(e^{mu t})``, ``M = I + 1/2 A^T diag(expm1(2 mu t)/mu) A``. For long times both
    ``D A`` and ``M`` overflow. We rescale once, exactly: take the LQ factorisation of the
    ``n_h`` rows of ``A`` belonging to the largest eigenvalues, ``A_top = L_top Qm^T`` (``L_top``
    lower triangular), so ``A Qm = L`` is lower trapezoidal, and with ``c_j = max(mu_j, 0)``
    (j over the top ``n_h`` eigenvalues) ``QQ^T = P Y' W Y'^T P^T`` where
    ``Y'_ij = exp((mu_i - c_j) t) L_ij`` and ``W^{-1} = diag(e^{-2 c t}) + 1/2 Y''^T
    diag(-expm1(-2 |mu| t)/|mu|) Y''``, ``Y''_ij = exp((max(mu_i,0) - c_j) t) L_ij``. Every
    exponent that multiplies a structurally nonzero entry is ``<= 0``, so nothing overflows and
    this general form stays finite for any ``t`` (the identity is exact for every ``t``; it is a
    rescaling, not an approximation). ``W^{-1}`` is symmetric positive definite; it is factored
    by Cholesky, and the result is assembled as a Gram matrix ``V V^T`` (symmetric PSD by
    construction). It therefore never needs to dispatch to :func:`qqt_stable` (the equal-
    dimension form of [L] App. B.5), which is kept as an independent check.
    Cost: one batched ``eigh`` and QR, then O(T N n_h (N + n_h)) per batch member, evaluated
    in blocks of members (and of times) whose intermediates are ~8 MiB, written straight into
    the output (a 100-member ensemble of 8x8x8 nets at 1000 times takes ~0.5 s on 2 CPU cores).
    ``t`` must be >= 0; gradients flow through ``W1`` and ``W2`` (and ``sigma_yx`` when F has
    distinct eigenvalues: ``eigh``'s backward is singular otherwise). ``lam`` is taken as given:
    it must equal the balance ``W2^T W2 - W1 W1^T`` of the weights.
    """
    W1, W2, sigma_yx, lam, t, batch, (n_in, n_h, n_out) = _prepare(W1, W2, sigma_yx, lam, t, tau)
    N = n_in + n_out
    if n_h > N:
        raise ValueError(f"qqt: hidden width n_h = {n_h} exceeds n_in + n_out = {N}; "
                         "a lambda-balanced network needs n_h <= min(n_in, n_out) (lam != 0)")
    F = _riccati_F(sigma_yx, lam)
    mu, P = torch.linalg.eigh(F)
    mu, P = mu.flip(-1), P.flip(-1)  # descending
    Q0 = torch.cat([W1.transpose(-1, -2), W2], dim=-2)  # (..., N, n_h)
    A = P.transpose(-1, -2) @ Q0  # (..., N, n_h)
    Qm, Rm = torch.linalg.qr(A[..., :n_h, :].transpose(-1, -2))  # A_top^T = Qm Rm
    L = torch.cat([Rm.transpose(-1, -2), A[..., n_h:, :] @ Qm], dim=-2)  # (..., N, n_h)

    # flatten the batch so the rotation by P is one large bmm per member, shared over times
    Bn, T = int(math.prod(batch)), t.shape[0]
    mu, P, L = mu.reshape(Bn, N), P.reshape(Bn, N, N), L.reshape(Bn, N, n_h)
    # work in blocks of members (and of times, for very long time grids) so that the
    # intermediates stay cache-sized; write straight into the output unless autograd is on
    per_member = T * n_h * N
    mb = max(1, _QQT_BLOCK // per_member)
    tb = T if per_member <= _QQT_BLOCK else max(1, _QQT_BLOCK // (n_h * N))
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (mu, P, L, t))
    if grad:
        rows = [torch.cat([_qqt_block(mu[b:b + mb], P[b:b + mb], L[b:b + mb], t[s:s + tb])
                           for s in range(0, T, tb)], dim=1) for b in range(0, Bn, mb)]
        out = torch.cat(rows, dim=0)
    else:
        out = torch.empty(Bn, T, N, N, dtype=mu.dtype, device=mu.device)
        for b in range(0, Bn, mb):
            for s in range(0, T, tb):  # tb < T only when mb == 1: the slice is contiguous
                _qqt_block(mu[b:b + mb], P[b:b + mb], L[b:b + mb], t[s:s + tb], out=out[b:b + mb, s:s + tb])
    return out.reshape(*batch, T, N, N)



def _qqt_work(W1: Tensor, W2: Tensor, sigma_yx: Tensor, *, lam: Number, t: Number, tau: Number = 1.0
              ) -> tuple[int, torch.device | None]:
    """Elements of :func:`qqt`'s per-block intermediates (members x times x N x N, capped at
    ``_QQT_BLOCK``) for :func:`zoo.utils.threads.threads_for`, and the device."""
    try:
        batch, _ = broadcast_work(W1[..., 0, 0], W2[..., 0, 0], sigma_yx[..., 0, 0], torch.as_tensor(lam))
        N = W1.shape[-1] + W2.shape[-2]
    except (TypeError, IndexError):
        return 0, None  # malformed: qqt raises the error that names it
    work = batch * max(1, torch.as_tensor(t).numel()) * N * N
    return min(work, _QQT_BLOCK), W1.device


_QQT_BLOCK = 1 << 20  # elements per (members x times x n_h x N) intermediate (8 MiB in float64)


def _qqt_block(mu: Tensor, P: Tensor, L: Tensor, t: Tensor, out: Tensor | None = None) -> Tensor:
    """The time-dependent part of :func:`qqt` for a block of members (B, ...) and times (T,)."""
    Bn, N, n_h = L.shape
    T = t.shape[0]
    tt = t.reshape(1, T, 1, 1)
    c = mu[:, :n_h].clamp(min=0.0)  # (B, n_h) scale of each column of L
    # exponents (max(mu_i, 0) - c_j), clamped at 0 where L_ij is structurally zero; t >= 0
    expo = (mu.clamp(min=0.0)[:, None, :] - c[:, :, None]).clamp(max=0.0)[:, None]  # (B,1,n_h,N)
    Ypp = torch.exp(expo * tt) * L.transpose(-1, -2)[:, None]  # Y''^T, (B, T, n_h, N)
    phi = _phi(-mu.abs()[:, None, None, :], tt)  # -expm1(-2|mu|t)/|mu|, (B, T, 1, N)
    Winv = 0.5 * torch.matmul(Ypp * phi, Ypp.transpose(-1, -2))  # (B, T, n_h, n_h)
    Winv = Winv + torch.diag_embed(torch.exp(-2.0 * c[:, None, :] * tt[..., 0]))
    chol, info = torch.linalg.cholesky_ex(Winv)
    if bool((info != 0).any()):
        raise RuntimeError("qqt: the inner matrix lost positive definiteness (degenerate "
                           "initialisation, e.g. a hidden unit with zero weights, at a very long time)")
    Yp = Ypp * torch.exp(mu.clamp(max=0.0)[:, None, None, :] * tt)  # Y'^T
    Z = torch.linalg.solve_triangular(chol, Yp, upper=False)  # chol^-1 Y'^T, (B, T, n_h, N)
    Vt = torch.bmm(Z.reshape(Bn, T * n_h, N), P.transpose(-1, -2)).reshape(Bn, T, n_h, N)
    if out is None:
        return torch.matmul(Vt.transpose(-1, -2), Vt)  # (P Y' chol^-T)(...)^T, (B, T, N, N)
    return torch.matmul(Vt.transpose(-1, -2), Vt, out=out)


@sized_threads(lambda *a, **k: _qqt_work(*a, **k))
def qqt_stable(W1: Tensor, W2: Tensor, sigma_yx: Tensor, *, lam: Number, t: Number,
               tau: Number = 1.0) -> Tensor:
    """``QQ^T(t)`` in the stable equal-dimension form ([L] App. B.5; docs/theory.md#qqt-stable).

    Same signature, assumptions and output layout as :func:`qqt`, but requires
    ``n_in = n_h = n_out = n``. Task SVD ``Sigma_yx = U~ S~ V~^T``; diagonal
    ``X = (sqrt(lam^2 + 4 S~^2) - 2 S~)/lam`` (computed as ``lam/(sqrt(lam^2 + 4 S~^2) + 2 S~)``,
    which is also valid at ``lam = 0``), ``A = (I + X^2)^{-1/2}``, ``Lam = sqrt(S~^2 + lam^2/4)``,
    ``e = exp(-Lam t/tau)``. With the initial ``W2(0) = U S2 R^T``, ``W1(0) = R S1 V^T``,
    ``B = S2 U^T U~ (A + XA) + S1 V^T V~ (A - XA)``, ``C = S2 U^T U~ (A - XA) - S1 V^T V~ (A + XA)``,

        ``Z = [V~((A - XA) - (A + XA) e C^T B^-T e); U~((A + XA) + (A - XA) e C^T B^-T e)]``,
        ``M = 4 e B^-1 B^-T e + (I - e^2) Lam^-1 - e B^-1 C (e^2 - I) Lam^-1 C^T B^-T e``,
        ``QQ^T = Z M^-1 Z^T`` (Cholesky on M).

    The rotation ``R`` cancels from every product (``B = R^T B'``, ``C = R^T C'``), so we use
    ``B' = W2^T U~ (A + XA) + W1 V~ (A - XA)`` and ``C' = W2^T U~ (A - XA) - W1 V~ (A + XA)``
    straight from the weights, with no SVD of the initial map. ``(I - e^2) Lam^-1`` is evaluated
    as ``-expm1(-2 Lam t)/Lam`` (limit ``2t``). Only decaying exponentials appear: finite for any
    ``t >= 0``. Needs ``lam != 0`` (a ValueError otherwise) and ``B`` invertible (true for a
    generic initialisation when ``lam != 0``; at ``lam = 0``, ``B = R^T S^(1/2)(U^T U~ + V^T V~)``
    is singular whenever the orthogonal ``U~^T U V^T V~`` has determinant -1).
    """
    W1, W2, sigma_yx, lam, t, batch, (n_in, n_h, n_out) = _prepare(W1, W2, sigma_yx, lam, t, tau)
    if not (n_in == n_h == n_out):
        raise ValueError(f"qqt_stable: needs n_in = n_h = n_out, got n_in={n_in}, n_h={n_h}, "
                         f"n_out={n_out}; use qqt for unequal dimensions")
    if bool((lam == 0).any()):
        raise ValueError("qqt_stable: lam = 0 is outside the stable form's domain (its matrix B is "
                         "singular for half of all balanced initialisations at lam = 0); use qqt, "
                         "which is exact and overflow-free for every lam")
    Ut, St, Vth = torch.linalg.svd(sigma_yx)
    Vt = Vth.transpose(-1, -2)
    lam_ = lam[..., None]
    den = torch.hypot(lam_, 2.0 * St) + 2.0 * St
    X = torch.where(den > 0, lam_ / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))
    A = torch.rsqrt(1.0 + X * X)
    Lam = torch.hypot(St, lam_ / 2.0)
    a_p, a_m = A + X * A, A - X * A  # (..., n)
    W2tU = W2.transpose(-1, -2) @ Ut
    W1V = W1 @ Vt
    B = W2tU * a_p[..., None, :] + W1V * a_m[..., None, :]
    C = W2tU * a_m[..., None, :] - W1V * a_p[..., None, :]
    Binv = torch.linalg.inv(B)
    H = Binv @ C  # B^-1 C
    BBt = Binv @ Binv.transpose(-1, -2)

    tt = t.reshape(*([1] * len(batch)), -1, 1)  # (..., T, 1)
    e = torch.exp(-Lam[..., None, :] * tt)  # (..., T, n)
    phi = _phi(-Lam[..., None, :], tt)  # (1 - e^2)/Lam
    eH = e[..., :, None] * H[..., None, :, :]  # e H, (..., T, n, n)
    eHtE = e[..., :, None] * eH.transpose(-1, -2)  # e H^T e = e C^T B^-T e
    M = 4.0 * e[..., :, None] * BBt[..., None, :, :] * e[..., None, :]
    M = M + torch.diag_embed(phi) + (eH * phi[..., None, :]) @ eH.transpose(-1, -2)
    Zt = Vt[..., None, :, :] @ (torch.diag_embed(a_m)[..., None, :, :] - a_p[..., None, :, None] * eHtE)
    Zb = Ut[..., None, :, :] @ (torch.diag_embed(a_p)[..., None, :, :] + a_m[..., None, :, None] * eHtE)
    Z = torch.cat([Zt, Zb], dim=-2)  # (..., T, 2n, n)
    chol = torch.linalg.cholesky(M)
    G = torch.linalg.solve_triangular(chol, Z.transpose(-1, -2), upper=False)  # L^-1 Z^T
    return G.transpose(-1, -2) @ G


# ---------------------------------------------------------------------------------------------
# reading QQ^T
# ---------------------------------------------------------------------------------------------
def network_map(qqt: Tensor, n_in: int) -> Tensor:
    """The network function ``W2 W1`` (..., n_out, n_in): the lower-left block of ``QQ^T``."""
    return qqt[..., n_in:, :n_in]


def input_rsm(qqt: Tensor, n_in: int) -> Tensor:
    """Input representational similarity ``W1^T W1`` (..., n_in, n_in): upper-left block."""
    return qqt[..., :n_in, :n_in]


def output_rsm(qqt: Tensor, n_in: int) -> Tensor:
    """Output representational similarity ``W2 W2^T`` (..., n_out, n_out): lower-right block."""
    return qqt[..., n_in:, n_in:]


def linear_ntk_from_qqt(qqt: Tensor, X: Tensor, n_in: int) -> Tensor:
    """NTK of the two-layer linear net ``f(x) = W2 W1 x`` read off ``QQ^T`` (Braun et al. 2022; [L] Eq. 5).

    ``K = I_out (x) X^T W1^T W1 X + W2 W2^T (x) X^T X`` in the papers' notation, whose data
    matrix has samples as columns. Here ``X`` follows the zoo's data convention, samples as
    rows: ``X`` is (P, n_in) (or (..., P, n_in), broadcasting with ``qqt``'s batch dimensions),
    i.e. the papers' ``X`` is our ``X.T``. The kernel is ``K[(o, i), (o', j)] = d f_o(x_i)/d theta
    . d f_o'(x_j)/d theta`` over ``theta = (W1, W2)``, returned as a matrix of shape
    (..., n_out P, n_out P) whose row index is ``o * P + i``: the OUTPUT index is the slowest
    (``torch.kron(I_out, X W1^T W1 X^T)`` ordering).
    """
    if X.shape[-1] != n_in:
        raise ValueError(f"linear_ntk_from_qqt: X must be (P, n_in) with samples as rows; got "
                         f"{tuple(X.shape)} for n_in = {n_in}")
    X = X.to(qqt.dtype)
    P = X.shape[-2]
    Xt = X.transpose(-1, -2)
    k_in = X @ input_rsm(qqt, n_in) @ Xt  # (..., P, P): x_i^T W1^T W1 x_j
    k_x = X @ Xt  # (..., P, P)
    out = output_rsm(qqt, n_in)  # (..., n_out, n_out)
    n_out = out.shape[-1]
    eye = torch.eye(n_out, dtype=qqt.dtype, device=qqt.device)
    K = eye[:, None, :, None] * k_in[..., None, :, None, :] + out[..., :, None, :, None] * k_x[..., None, :, None, :]
    return K.reshape(*K.shape[:-4], n_out * P, n_out * P)
