"""Two-pathway specialisation phase diagram ([S] Sec. 3.1, Fig. 3c, App. B Algorithm 1).

Setting ([S] Sec. 3, Eq. 1): a rank-one regression task on whitened input, ``Sigma_x = d I``,
``Sigma_yx = s v^T`` (scalar output, ``u = 1``), learnt by a network with two hidden units,
``y_hat = sum_i h_i w_i^T x``. Pathway ``i`` has the conserved imbalance
``lam_i = h_i^2 - |w_i|^2`` and effective singular value ``omega_i = h_i w_i^T v``. With the input
weights aligned to ``v`` the pathways race for the same residual:

    ``tau d omega_i/dt = sqrt(lam_i^2 + 4 omega_i^2) (s - d (omega_1 + omega_2))``.

The pathway with the larger ``|lam|`` learns faster ([S] Eq. 3: the rate is
``k = sqrt(4 s^2 + lam^2 d^2)``); when it finishes before the other one escapes its plateau,
the map ends up in one pathway: the network has specialised.

:func:`phase_diagram` is the theory's measure of this race (Algorithm 1), :func:`simulate_two_pathways`
the gradient-descent counterpart. Both are pure torch and vectorised over ``(lam1, lam2)`` grids.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from zoo.theory.linear import Number, _tensors, _time_to, hitting_time, omega
from zoo.utils.threads import broadcast_work, sized_threads

__all__ = ["PhaseDiagram", "phase_diagram", "simulate_two_pathways", "initial_omegas"]


class PhaseDiagram(NamedTuple):
    """Details of :func:`phase_diagram` (all tensors of the broadcast grid shape).

    ``min_escape_time``: min over ``t in [0, t_hit_fast]`` of the slow pathway's remaining escape
    time (0 where it escapes, ``inf`` where it can no longer escape, NaN where ``|lam1| < |lam2|``).
    ``t_hit_fast``: hitting time ``t1*`` of the fast pathway (the integration window).
    ``t_escape_slow``: the slow pathway's escape time if it were alone (uncoupled, [S] Eq. 15);
    the coupling only slows it down, so ``min_escape_time >= t_escape_slow - t_hit_fast`` ([S] App. B:
    "the slower pathway will never be quicker than its initial escaping time").
    ``omega_slow_max``: the largest slow-pathway singular value reached in the window.
    ``specialised``: ``min_escape_time > threshold``.
    """

    min_escape_time: Tensor
    t_hit_fast: Tensor
    t_escape_slow: Tensor
    omega_slow_max: Tensor
    specialised: Tensor


def initial_omegas(lam1: Tensor, lam2: Tensor, omega0: Optional[Number], a0: Optional[Number]
                   ) -> tuple[Tensor, Tensor]:
    """Initial singular values of the two pathways.

    Either a common ``omega0`` (both pathways start at ``omega_i(0) = omega0``), or, as in [S]
    Algorithm 1, a common input weight ``a0``: readout ``b_i = sqrt(lam_i + a0^2)`` so that
    ``lam_i = b_i^2 - a0^2`` and ``omega_i(0) = a0 b_i`` (needs ``lam_i > -a0^2``).
    """
    if (omega0 is None) == (a0 is None):
        raise ValueError("give exactly one of omega0 (common initial singular value) or a0 "
                         "(common input weight, [S] Algorithm 1)")
    if omega0 is not None:
        (w0,) = _tensors(omega0)
        w0 = w0.to(lam1)
        if bool((w0 <= 0).any()):
            raise ValueError(f"omega0 must be > 0, got {omega0}")
        return torch.broadcast_tensors(w0 + 0 * lam1, w0 + 0 * lam2)
    (a,) = _tensors(a0)
    a = a.to(lam1)
    if bool((a <= 0).any()):
        raise ValueError(f"a0 must be > 0, got {a0}")
    b1sq, b2sq = lam1 + a * a, lam2 + a * a
    if bool((b1sq <= 0).any()) or bool((b2sq <= 0).any()):
        raise ValueError("a0: the readout b = sqrt(lam + a0^2) needs lam > -a0^2 for both pathways")
    return a * torch.sqrt(b1sq), a * torch.sqrt(b2sq)


@sized_threads()  # the RK4 loop's operations are grid-sized
def phase_diagram(
    lam1: Number,
    lam2: Number,
    *,
    s: Number,
    d: Number = 1.0,
    tau: Number = 1.0,
    omega0: Optional[Number] = None,
    a0: Optional[Number] = None,
    v_hat: Optional[Number] = None,
    v_star: Optional[Number] = None,
    n_steps: int = 400,
    threshold: float = 0.0,
    return_details: bool = False,
) -> Tensor | PhaseDiagram:
    """How close the slow pathway comes to escaping while the fast one learns ([S] App. B, Alg. 1).

    ``lam1`` (fast pathway) and ``lam2`` (slow pathway) broadcast against each other (and against
    ``s``, ``d``, ``tau``, ``omega0``/``a0``), e.g. ``lam1[:, None]`` and ``lam2[None, :]`` for a grid.
    What is computed for every grid point (Algorithm 1, with the decisions its text leaves open):

    1. Initial singular values: a common ``omega0``, or Algorithm 1's common input weight ``a0``
       with readouts ``b_i = sqrt(lam_i + a0^2)`` (``omega_i(0) = a0 b_i``); exactly one is given.
    2. The fast pathway follows its own closed form ``omega_1(t)`` ([S] Eq. 3, :func:`omega`) as if
       it were alone, up to its hitting time ``t1* = hitting_time(v_star)`` ([S] Eq. 17): the time at
       which ``omega_1 = s/d - v_star``. Beyond ``t1*`` the residual left to the slow pathway is
       ``d v_star`` and (for ``v_hat > v_star``) it can no longer escape, so ``[0, t1*]`` is the
       window the algorithm searches.
    3. The slow pathway is integrated coupled to it: ``tau d omega_2/dt = sqrt(lam_2^2 + 4 omega_2^2)
       (s - d omega_1(t) - d omega_2)``, i.e. [S] Eq. 11-12 with the effective singular value
       ``S = s - d omega_1(t)`` (Algorithm 1's ``ThetaDeriv(theta_2, lam_2, s - omega(t))``; we carry
       ``d`` explicitly, the paper has ``d = 1``). Classical RK4 on ``omega_2`` with ``n_steps``
       uniform steps over ``[0, t1*]`` (the step ``h`` satisfies ``h * rate <~ log(s/omega0)/n_steps``
       because ``|lam1| >= |lam2|``, so RK4 is well inside its stability region).
    4. At every step, the remaining escape time of the slow pathway is the time it would need to go
       from its current ``omega_2(t)`` to ``v_hat`` if the residual stayed at ``S(t)`` ([S] Eq. 15,
       ``EscapeTime(SlowThetas, lam_2, s - omega(t))``): 0 once ``omega_2 >= v_hat``, ``inf`` when
       ``S(t)/d <= v_hat`` (unreachable).
    5. The result is its minimum over the window (Algorithm 1's ``min_t t_hat_2^coupled(t)``), in
       the time units of ``tau`` (with ``tau = 1/lr``: GD steps, so the paper's criterion "less than
       one epoch from escaping" is ``min_escape_time < 1``). 0 means the slow pathway escapes:
       no specialisation; a positive value means it never escapes before the fast pathway finishes:
       specialisation (``specialised = min_escape_time > threshold``).

    Decisions where the paper is silent or ambiguous: only ``|lam1| >= |lam2|`` is computed (the
    fast pathway is the one with the larger ``|lam|``; the dynamics depend on ``lam`` only through
    ``lam^2``); elsewhere the result is NaN (the white region of Fig. 3c; Algorithm 1 breaks out
    for ``lam1 < lam2``). The diagonal ``|lam1| == |lam2|`` is computed (Algorithm 1 computes it;
    Fig. 3c's caption paints it white). ``v_hat`` (escape threshold) defaults to ``0.05 s/d`` and
    ``v_star`` (hitting distance) to ``0.01 s/d``, the ratios of Algorithm 1's
    ``eps_hat = 5``, ``eps* = 1`` to its ``S = 105`` (read as s ~ 100). The fast pathway's closed
    form ignores the slow pathway's share of the residual, so it overestimates ``omega_1`` and the
    slow pathway's drive is underestimated: a slow pathway that escapes here also escapes in the
    full coupled dynamics (a comparison argument), whereas a positive value is the theory's
    approximate prediction of specialisation.

    Returns ``min_escape_time`` (grid shape), or a :class:`PhaseDiagram` with ``return_details``.
    """
    if n_steps < 1:
        raise ValueError(f"phase_diagram: n_steps = {n_steps}; allowed: a positive integer")
    lam1, lam2, s, d, tau = _tensors(lam1, lam2, s, d, tau)
    lam1, lam2, s, d, tau = torch.broadcast_tensors(lam1, lam2, s, d, tau)
    w1_0, w2_0 = initial_omegas(lam1, lam2, omega0, a0)
    lam1, lam2, s, d, tau, w1_0, w2_0 = torch.broadcast_tensors(lam1, lam2, s, d, tau, w1_0, w2_0)
    v_hat_ = (0.05 * s / d) if v_hat is None else _tensors(v_hat)[0].to(s)
    v_star_ = (0.01 * s / d) if v_star is None else _tensors(v_star)[0].to(s)
    lam1, lam2, s, d, tau, w1_0, w2_0, v_hat_, v_star_ = torch.broadcast_tensors(
        lam1, lam2, s, d, tau, w1_0, w2_0, v_hat_, v_star_)
    l1, l2 = lam1.abs(), lam2.abs()

    t_hit = hitting_time(v_star_, lam=l1, s=s, d=d, tau=tau, omega0=w1_0).clamp(min=0.0)
    t_hit = torch.nan_to_num(t_hit, nan=0.0)  # omega_1(0) already within v_star of s/d
    K = n_steps
    grid = torch.arange(2 * K + 1, dtype=s.dtype, device=s.device) / (2 * K)  # half steps
    shape = s.shape
    ex = (...,) + (None,)
    t_half = t_hit[ex] * grid  # (..., 2K+1): t_k at even indices, midpoints at odd
    om1 = omega(t_half, lam=l1[ex], s=s[ex], d=d[ex], tau=tau[ex], omega0=w1_0[ex])
    S_eff = s[ex] - d[ex] * om1  # effective singular value seen by the slow pathway
    # RK4 on tau d omega_2/dt = sqrt(lam_2^2 + 4 omega_2^2)(S(t) - d omega_2); time-major and
    # contiguous so that each step touches contiguous memory
    S_tm = S_eff.movedim(-1, 0).contiguous()  # (2K+1, ...)
    l2c = l2.contiguous()
    dc = d.contiguous()
    h = (t_hit / K / tau).contiguous()  # step in units of tau
    half, sixth = 0.5 * h, h / 6.0

    def rate(w: Tensor, S: Tensor) -> Tensor:
        # hypot, not sqrt: torch's sqrt/log on CPU go through a VML path that spawns threads for
        # a few thousand elements, which costs milliseconds per call on a busy machine
        return torch.hypot(l2c, 2.0 * w).mul_(torch.addcmul(S, dc, w, value=-1.0))

    w = w2_0.contiguous().clone()
    traj = [w]
    for k in range(K):
        S0, Sm, S1 = S_tm[2 * k], S_tm[2 * k + 1], S_tm[2 * k + 2]
        k1 = rate(w, S0)
        k2 = rate(torch.addcmul(w, half, k1), Sm)
        k3 = rate(torch.addcmul(w, half, k2), Sm)
        k4 = rate(torch.addcmul(w, h, k3), S1)
        incr = k2.add_(k3).mul_(2.0).add_(k1).add_(k4)
        w = torch.addcmul(w, sixth, incr)
        traj.append(w)
    om2 = torch.stack(traj, dim=-1)  # (..., K+1)
    S_k = S_eff[..., ::2]

    # remaining escape time of the slow pathway at every step, residual frozen at S(t_k)
    cur = torch.minimum(om2, S_k / d[ex])  # guard; om2 < S_k/d up to round-off
    reach = v_hat_[ex] < S_k / d[ex]
    done = om2 >= v_hat_[ex]
    safe_S = torch.where(reach, S_k, torch.ones_like(S_k))
    t_rem = _time_to(torch.where(reach, v_hat_[ex] + 0 * cur, 0.5 * safe_S / d[ex]), lam=l2[ex],
                     s=safe_S, d=d[ex], tau=tau[ex],
                     omega0=torch.where(reach & ~done, cur, 0.25 * safe_S / d[ex]))
    inf = torch.full_like(t_rem, float("inf"))
    t_rem = torch.where(done, torch.zeros_like(t_rem), torch.where(reach, t_rem.clamp(min=0.0), inf))
    min_t = t_rem.amin(dim=-1)
    valid = l1 >= l2
    nan = torch.full(shape, float("nan"), dtype=s.dtype, device=s.device)
    min_t = torch.where(valid, min_t, nan)
    if not return_details:
        return min_t
    t_esc = _time_to(v_hat_, lam=l2, s=s, d=d, tau=tau, omega0=w2_0)
    t_esc = torch.where(w2_0 >= v_hat_, torch.zeros_like(t_esc), t_esc)
    return PhaseDiagram(
        min_escape_time=min_t,
        t_hit_fast=t_hit,
        t_escape_slow=torch.where(valid, t_esc, nan),
        omega_slow_max=torch.where(valid, om2.amax(dim=-1), nan),
        specialised=valid & (min_t > threshold),
    )


@sized_threads(lambda *a, n_in=1, **k: (2 * n_in * broadcast_work(*a, **k)[0], broadcast_work(*a, **k)[1]))
def simulate_two_pathways(
    lam1: Number,
    lam2: Number,
    *,
    s: Number,
    d: Number = 1.0,
    lr: float,
    steps: int,
    omega0: Optional[Number] = None,
    a0: Optional[Number] = None,
    n_in: int = 1,
    seed: int = 0,
    return_omegas: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Full-batch gradient descent on two-hidden-unit linear networks: the simulation of Fig. 3c.

    Network ``y_hat = h_1 w_1^T x + h_2 w_2^T x`` on the rank-one whitened task ``Sigma_x = d I``,
    ``Sigma_yx = s v^T`` (``v = e_1``), loss ``1/2 <(y - y_hat)^2>`` (its gradient needs only
    ``Sigma_x`` and ``Sigma_yx``, so this is exact full-batch GD): with ``beta = sum_i h_i w_i``,
    ``w_i <- w_i - lr h_i (d beta - s v)``, ``h_i <- h_i - lr w_i . (d beta - s v)`` (simultaneous).
    One network per grid point of the broadcast ``(lam1, lam2)``, all trained in one batched loop
    over ``steps`` (time ``t = lr * steps`` in units of ``tau``).

    Initialisation with imbalance ``lam_i = h_i^2 - |w_i|^2`` and product ``h_i |w_i| = omega_i(0)``
    (from ``omega0`` or Algorithm 1's ``a0``, see :func:`initial_omegas`):
    ``h_i = sqrt((sqrt(lam_i^2 + 4 omega_i0^2) + lam_i)/2)``, ``|w_i| = sqrt((sqrt(...) - lam_i)/2)``.
    With ``n_in = 1`` the input weights are aligned with the task (the theory's assumption);
    with ``n_in > 1`` each ``w_i`` points in a random direction (seeded by ``seed``, the same for
    every grid point), so the silent-alignment phase is simulated too.

    Returns the fraction of the map carried by pathway 2 (the slow one) at the end,
    ``omega_2 / (omega_1 + omega_2)`` with ``omega_i = h_i w_i . v``; with ``return_omegas`` also
    ``(omega_1, omega_2)``.
    """
    if steps < 0 or n_in < 1:
        raise ValueError(f"simulate_two_pathways: steps = {steps}, n_in = {n_in}; allowed: steps >= 0, n_in >= 1")
    lam1, lam2, s, d = _tensors(lam1, lam2, s, d)
    lam1, lam2, s, d = torch.broadcast_tensors(lam1, lam2, s, d)
    w1_0, w2_0 = initial_omegas(lam1, lam2, omega0, a0)
    lam = torch.stack(torch.broadcast_tensors(lam1, lam2, w1_0)[:2], dim=-1)  # (..., 2)
    om0 = torch.stack(torch.broadcast_tensors(w1_0, w2_0, lam1)[:2], dim=-1)
    s_, d_ = torch.broadcast_tensors(s, lam1)[0][..., None], torch.broadcast_tensors(d, lam1)[0][..., None]
    root = torch.sqrt(lam * lam + 4.0 * om0 * om0)
    h = torch.sqrt((root + lam) / 2.0)  # (..., 2)
    wn = torch.sqrt((root - lam) / 2.0)
    if n_in == 1:
        direction = torch.ones(2, 1, dtype=h.dtype, device=h.device)
    else:
        g = torch.Generator().manual_seed(seed)
        direction = torch.randn(2, n_in, generator=g, dtype=torch.float64).to(h)
        direction = direction / direction.norm(dim=-1, keepdim=True)
    w = wn[..., None] * direction  # (..., 2, n_in)
    v = torch.zeros(n_in, dtype=h.dtype, device=h.device)
    v[0] = 1.0
    sv = s_[..., None] * v  # (..., 1, n_in)
    dd = d_[..., None]
    for _ in range(steps):
        beta = (h[..., None] * w).sum(dim=-2, keepdim=True)  # (..., 1, n_in)
        err = dd * beta - sv  # gradient of the loss with respect to beta
        gh = (w * err).sum(dim=-1)  # (..., 2)
        w = w - lr * h[..., None] * err
        h = h - lr * gh
    om = h * w[..., 0]  # projections on v = e_1
    frac = om[..., 1] / om.sum(dim=-1)
    if return_omegas:
        return frac, om[..., 0], om[..., 1]
    return frac
