"""Gated deep linear networks: effective datasets, the neural race, and the ReLN closed forms ([H]).

Conventions (docs/theory.md#gdln-model). Data are row-major: ``X`` (N, n_in), ``Y`` (N, n_out). A
GDLN here is a set of *pathways* p = input -> hidden module -> output; pathway p sees the input
features selected by ``inputs[p]`` (a 0/1 mask over the n_in features) and is switched on for
data point i when ``gates[i, p] = 1`` (the node gate of its hidden module, [H] Eq. 1). The loss is
``1/(2N) sum_i |y_i - sum_p g_p^i W_p x^i_{s(p)}|^2`` ([H] Eq. 2) and gradient descent with
learning rate ``lr`` on it follows ``tau dW/dt = -dL/dW`` with ``tau = 1/lr`` (time in steps; the
authors' summed loss ``1/2 sum_i`` with step ``eps`` is the same with ``tau = 1/(N eps)``).

Pure torch, no Lightning: a researcher can use it from a notebook.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from zoo.theory.linear import saxe_mode
from zoo.utils.threads import sized_threads

__all__ = [
    "pathway_mode_matrices",
    "Gating", "effective_datasets", "pathway_modes", "common_limit", "race_trajectory", "loss_of_maps",
    "xor_reln_constants", "xor_loss", "xor_time_to_loss", "xor_crossover",
    "context_overlap", "context_m", "contexts_closed_form", "times_to_fraction", "time_to_loss",
]


@dataclass
class Gating:
    """The gates of a one-hidden-layer GDLN ([H] Eq. 1, Def. 3.1).

    gates: (N, P) 0/1, pathway p's hidden module is on for data point i (node gate g_v);
        (E, N, P) when the ensemble members see different data (e.g. one XoR margin each).
    inputs: (P, n_in) 0/1, the input features pathway p reads (its edge gates from the input).
    common: (P,) bool, pathways trained on the full target under the authors' two-loss scheme
        (docs/theory.md#two-loss); the others learn the residual.
    names: one name per pathway.
    """

    gates: Tensor
    inputs: Tensor
    common: Tensor
    names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        P = self.gates.shape[-1]
        if self.inputs.shape[0] != P or self.common.shape != (P,):
            raise ValueError(f"Gating: gates have {P} pathways but inputs {tuple(self.inputs.shape)} and "
                             f"common {tuple(self.common.shape)}; allowed: inputs (P, n_in), common (P,)")
        if not self.names:
            self.names = [f"p{i}" for i in range(P)]

    @property
    def n_pathways(self) -> int:
        return int(self.gates.shape[-1])


# ---------------------------------------------------------------------------------------------
# effective datasets and the race ([H] Eqs. 3-6)
# ---------------------------------------------------------------------------------------------
def effective_datasets(X: Tensor, Y: Tensor, gating: Gating) -> tuple[Tensor, Tensor]:
    """Each pathway's effective dataset ([H] Eq. 4), in the full input space.

    ``Sigma_yx(p) = 1/N sum_i g_p^i y_i (M_p x_i)^T`` (P, n_out, n_in) and
    ``Sigma_x(j, p) = 1/N sum_i g_j^i g_p^i (M_j x_i)(M_p x_i)^T`` (P, P, n_in, n_in), with
    ``M_p = diag(inputs[p])`` the pathway's input selection.
    """
    X, Y = X.double(), Y.double()
    g, M = gating.gates.double(), gating.inputs.double()
    if g.dim() != 2:
        raise ValueError("effective_datasets: give one member's gates (N, P)")
    N = X.shape[0]
    syx = torch.einsum("ip,io,ik,pk->pok", g, Y, X, M) / N
    sx = torch.einsum("ij,ip,ik,il,jk,pl->jpkl", g, g, X, X, M, M) / N
    return syx, sx


def pathway_modes(sigma_yx: Tensor, tol: float = 1e-10) -> list[tuple[Tensor, Tensor, Tensor]]:
    """SVD ``Sigma_yx(p) = U_p S_p V_p^T`` of each pathway ([H] Eq. 5), rank-truncated at ``tol``."""
    out = []
    for syx in sigma_yx:
        U, S, Vh = torch.linalg.svd(syx, full_matrices=False)
        k = int((S > tol * max(float(S[0]), 1e-300)).sum()) if S.numel() else 0
        out.append((U[:, :k], S[:k], Vh[:k].T))
    return out


def pathway_mode_matrices(sigma_yx: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The top ``k`` modes of every pathway's ``Sigma_yx(p)`` ([H] Eq. 5) stacked: U (P, n_out, k),
    V (P, n_in, k), zero columns where a pathway has fewer (for ``GDLN.pathway_singular_values``)."""
    modes = pathway_modes(sigma_yx)
    pad = [(torch.nn.functional.pad(u[:, :k], (0, k - u[:, :k].shape[1])),
            torch.nn.functional.pad(v[:, :k], (0, k - v[:, :k].shape[1]))) for u, _, v in modes]
    return torch.stack([u for u, _ in pad]), torch.stack([v for _, v in pad])


def common_limit(X: Tensor, Y: Tensor, gating: Gating) -> Tensor:
    """``Y_common(inf)``: the output the common pathways converge to when they learn ``Y`` alone
    ([H] App. F, first display: each mode goes to ``S/D``), (N, n_out).

    Gradient descent on the common pathways' own loss converges to the least-squares fit of ``Y``
    from their gated inputs ``g_p^i M_p x_i``; the fitted values are unique even where the
    features are collinear (the contexts' one-hots sum to the items'). ``Y - common_limit`` is the
    residual ``Y*`` on which App. F trains the context pathways.
    """
    X, Y = X.double(), Y.double()
    g, M = gating.gates.double(), gating.inputs.double()
    if g.dim() != 2:
        raise ValueError("common_limit: give one member's gates (N, P)")
    common = torch.nonzero(gating.common.bool()).flatten().tolist()
    if not common:
        raise ValueError("common_limit: the gating has no common pathway (Gating.common is all False)")
    features = torch.cat([g[:, p : p + 1] * X * M[p] for p in common], dim=1)
    coef = torch.linalg.lstsq(features, Y, driver="gelsd").solution
    return features @ coef


def loss_of_maps(X: Tensor, Y: Tensor, gating: Gating, maps: Tensor) -> Tensor:
    """The loss ``1/(2N) sum_i |y_i - sum_p g_p^i W_p M_p x_i|^2`` of pathway maps (..., P, n_out, n_in)."""
    X, Y = X.double(), Y.double()
    g, M = gating.gates.double(), gating.inputs.double()
    out = torch.einsum("...pok,pk,ik,ip->...io", maps.double(), M, X, g)
    return 0.5 * (out - Y).pow(2).sum((-1, -2)) / X.shape[0]


def _race_work(X: Tensor, Y: Tensor, gating: Gating, *args, **kwargs) -> tuple[int, torch.device]:
    """Elements of ``race_trajectory``'s largest per-step operation (the einsum over pathway pairs,
    P^2 n_out n_in multiply-adds) and the device, for :func:`zoo.utils.threads.sized_threads`."""
    P = gating.n_pathways
    return P * P * Y.shape[1] * X.shape[1], X.device


# a few small einsums and products a step, thousands of steps: one thread unless a step is large
@sized_threads(_race_work)
def race_trajectory(
    X: Tensor, Y: Tensor, gating: Gating, steps: int, *, tau: float, a0: float | Tensor,
    training: Literal["joint", "two_loss", "residual"] = "joint", record_every: int = 1,
) -> tuple[Tensor, Tensor, Tensor]:
    """The neural race ([H] Eq. 6) integrated step by step for a given gating.

    Each pathway is a balanced two-layer linear module of the minimal width started aligned with
    its effective dataset, ``W2_p(0) = sqrt(a0) U_p``, ``W1_p(0) = sqrt(a0) V_p^T`` ([H] Eq. 5,
    Assumption 2.1.2; ``a0`` a number, or one per pathway (P,)), and follows [H] Eq. 3 with the pathway's error
    ``E_p = Sigma_yx(p) - sum_j W_j Sigma_x(j, p)``: ``tau dW1_p = W2_p^T E_p``, ``tau dW2_p = E_p W1_p^T``.
    In each pathway's singular basis ``W2_p = U_p B2 R^T``, ``W1_p = R B1 V_p^T`` this is Eq. 6 mode
    by mode whenever the effective datasets are mutually diagonalisable; integrating the factors
    keeps the cross-pathway overlaps ``U_p^T U_j`` exact when they are not (the different-structure
    task) and needs no matrix square roots.
    With ``training = "two_loss"`` the common pathways see only themselves in their error (the
    authors' scheme, docs/theory.md#two-loss). With ``training = "residual"`` (the scheme [H] App. F derives
    its closed forms for) the common pathways also learn ``Y`` alone, while the other pathways
    learn the fixed residual ``Y* = Y - common_limit`` and see only each other.
    Forward Euler with step 1 = one gradient step at ``lr = 1/tau``.

    Returns (record_steps (T,), maps (T, P, n_out, n_in), loss (T,)).
    """
    if training not in ("joint", "two_loss", "residual"):
        raise ValueError(f"race_trajectory: training = {training!r}; allowed: 'joint', 'two_loss' or 'residual'")
    syx, sx = effective_datasets(X, Y, gating)
    common = gating.common.bool()
    if training == "residual":
        syx_star, _ = effective_datasets(X, Y.double() - common_limit(X, Y, gating), gating)
        syx = torch.where(common[:, None, None], syx, syx_star)
    P, n_out, n_in = syx.shape
    a0s = torch.as_tensor(a0, dtype=torch.float64).expand(P)
    if not bool((a0s > 0).all()):
        raise ValueError(f"race_trajectory: a0 = {a0}; allowed: a positive number or one per pathway ({P})")
    k = min(n_out, n_in)
    # balanced two-layer factors of the minimal width k: W_p = W2_p W1_p, W2_p = U sqrt(a0), W1_p = sqrt(a0) V^T
    W1 = torch.zeros(P, k, n_in, dtype=torch.float64)
    W2 = torch.zeros(P, n_out, k, dtype=torch.float64)
    for p, (U, S, V) in enumerate(pathway_modes(syx)):
        r = U.shape[1]
        W1[p, :r] = math.sqrt(float(a0s[p])) * V.T
        W2[p, :, :r] = math.sqrt(float(a0s[p])) * U
    sees = torch.ones(P, P, dtype=torch.float64)
    if training in ("two_loss", "residual"):
        sees[common] = 0.0
        for p in torch.nonzero(common).flatten().tolist():
            sees[p, p] = 1.0
    if training == "residual":
        sees[~common[:, None] & common[None, :]] = 0.0  # the residual already holds the common output
    sx_seen = sees[:, :, None, None].transpose(0, 1) * sx  # sx_seen[j, p] = sees[p, j] Sigma_x(j, p)
    rec_t, rec_m = [], []
    for t in range(steps + 1):
        maps = W2 @ W1
        if t % record_every == 0 or t == steps:
            rec_t.append(t)
            rec_m.append(maps)
        if t == steps:
            break
        # E_p = Sigma_yx(p) - sum_j sees[p, j] W_j Sigma_x(j, p)   ([H] Eq. 3)
        err = syx - torch.einsum("jok,jpkl->pol", maps, sx_seen)
        W1, W2 = W1 + W2.transpose(-1, -2) @ err / tau, W2 + err @ W1.transpose(-1, -2) / tau
    record = torch.stack(rec_m)
    return torch.tensor(rec_t), record, loss_of_maps(X, Y, gating, record)


# ---------------------------------------------------------------------------------------------
# XoR with a linear margin ([H] Sec. 3, App. C)
# ---------------------------------------------------------------------------------------------
def xor_reln_constants(Delta: float | Tensor, kind: Literal["linear", "xor"]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(s, d, n_paths, c)`` of one pathway of the XoR-margin GDLNs ([H] App. C Eqs. 13-23).

    linear (two pathways, positive / negative examples): ``s = D/2``, ``d = D^2/2``.
    xor (four pathways, one example each): ``s = sqrt(1/8 + D^2/16)``, ``d = 4 s^2 = 1/2 + D^2/4``
    (**typo** in [H] App. C, which prints ``d = 1/8 + D^2/16``; docs/theory.md#xor-margin).
    The loss is ``1/2 - n s a + n d a^2 / 2`` with n pathways; c = 1/2 is the loss at a = 0.
    """
    D = torch.as_tensor(Delta, dtype=torch.float64)
    if kind == "linear":
        s, d, n = D / 2, D**2 / 2, torch.tensor(2.0, dtype=torch.float64)
    elif kind == "xor":
        s = torch.sqrt(1 / 8 + D**2 / 16)
        d, n = 4 * s**2, torch.tensor(4.0, dtype=torch.float64)
    else:
        raise ValueError(f"xor_reln_constants: kind = {kind!r}; allowed: 'linear' or 'xor'")
    return s, d, n, torch.tensor(0.5, dtype=torch.float64)


def xor_loss(t: float | Tensor, Delta: float | Tensor, kind: Literal["linear", "xor"], *, tau: float,
             a0: float) -> Tensor:
    """Closed-form loss of an XoR-margin GDLN ([H] App. C Eqs. 22-23) with Saxe modes a(t) (Eq. 18)."""
    s, d, n, c = xor_reln_constants(Delta, kind)
    a = saxe_mode(torch.as_tensor(t, dtype=torch.float64), s=s, d=d, tau=tau, a0=a0)
    loss = c - n * s * a + n * d * a**2 / 2
    return torch.where(s > 0, loss, c)  # Delta = 0 leaves the linear pathways nothing to learn


def xor_time_to_loss(Delta: float | Tensor, kind: Literal["linear", "xor"], *, tau: float, a0: float,
                     criterion: float = 0.2) -> Tensor:
    """Time at which ``xor_loss`` reaches ``criterion`` ([H] Fig. 2d), by inverting Eq. 18.

    The loss ``1/2 - n s a + n d a^2/2`` falls to ``L`` at ``a* = (s - sqrt(s^2 - 2 d (1/2 - L)/n)) / d``;
    ``a(t) = a*`` at ``t = tau/(2 s) log[(s/a0 - d)/(s/a* - d)]``. Inf where the loss never gets there.
    """
    s, d, n, c = xor_reln_constants(Delta, kind)
    disc = s**2 - 2 * d * (c - criterion) / n
    a_star = (s - torch.sqrt(disc.clamp(min=0))) / d
    t = tau / (2 * s) * torch.log((s / a0 - d) / (s / a_star - d))
    return torch.where((disc >= 0) & (s > 0), t, torch.full_like(t, math.inf))


def xor_crossover() -> float:
    """The margin at which the linear and XoR ReLNs learn equally fast: ``sqrt(2/3)`` ([H] App. C Eq. 26).

    Found numerically from the closed forms, not typed in: a Saxe mode's escape rate is ``2 s/tau``
    (Eq. 18), so the race is decided where the two pathways' singular values ``s`` are equal;
    bisection on ``s_linear(D) - s_xor(D)`` (negative below the crossover, positive above).
    """
    def gap(D: float) -> float:
        return float(xor_reln_constants(D, "linear")[0] - xor_reln_constants(D, "xor")[0])

    lo, hi = 0.0, 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
        if hi - lo < 1e-15:
            break
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------------------------------------
# the symmetric C-context task ([H] Sec. 5, App. F-G)
# ---------------------------------------------------------------------------------------------
def _common_fit(X: Tensor, Y: Tensor, gating: Gating) -> tuple[Tensor, Tensor, Tensor, Tensor, int, list[int]]:
    """The common pathway's modes (U, S, V), input variances d along them, its index and the others'."""
    syx, sx = effective_datasets(X, Y, gating)
    c = int(torch.nonzero(gating.common.bool()).flatten()[0])
    U, S, V = pathway_modes(syx[c : c + 1])[0]
    d = torch.einsum("kn,kl,ln->n", V, sx[c, c], V)
    ctx = [p for p in range(gating.n_pathways) if not bool(gating.common[p])]
    return U, S, V, d, c, ctx


def context_overlap(X: Tensor, Y: Tensor, gating: Gating) -> tuple[Tensor, Tensor]:
    """The overlaps the closed form needs ([H] App. F): ``r`` with ``Sigma_x(j,p) = r Sigma_x(p,p)``
    and ``kappa`` with ``U_p^T U_j = -kappa I`` (j != p), on the residual of the common pathway.

    Returns the matrices ``U_p^T U_j V_j^T V_p`` stacked (P', P', k, k) and ``r`` (from the data);
    with C symmetric contexts r = (C-2)/(C-1) and kappa is read from the mean diagonal.
    """
    U, S, V, d, c, ctx = _common_fit(X, Y, gating)
    resid = Y.double() - common_limit(X, Y, gating)
    sub = Gating(gating.gates[:, ctx], gating.inputs[ctx], gating.common[ctx], [gating.names[p] for p in ctx])
    syx, sx = effective_datasets(X, resid, sub)
    modes = pathway_modes(syx)
    k = min(m[0].shape[1] for m in modes)
    Us = torch.stack([m[0][:, :k] for m in modes])
    Vs = torch.stack([m[2][:, :k] for m in modes])
    # U_p^T U_j V_j^T V_p: the output overlap of mode a of p with the mode of j along the same input
    # direction (degenerate singular values leave each pathway's basis free inside a subspace)
    overlaps = torch.einsum("pok,qol,qil,pim->pqkm", Us, Us, Vs, Vs)
    r = torch.einsum("kl,kl->", sx[0, 1], sx[0, 0]) / torch.einsum("kl,kl->", sx[0, 0], sx[0, 0])
    return overlaps, r


def context_m(X: Tensor, Y: Tensor, gating: Gating) -> float:
    """The factor m of the context pathways' closed form ``tau dB/dt = 2 B (S - B D / m)``.

    Derived from the task's overlaps as in [H] App. F: the coupling term of Eq. 6 is
    ``B_p + r sum_{j != p} U_p^T U_j B_j = B_p (1 - (C-1) r kappa)`` for C context pathways with equal
    B, so ``m = 1 / (1 - (C-1) r kappa)``. For C = 3 (kappa = 1/2, r = 1/2) m = 2 as printed; App. G
    prints 3 and 4 for four and five contexts from inconsistent arithmetic (docs/theory.md#contexts-closed-form): this
    function computes m from the data instead.
    """
    overlaps, r = context_overlap(X, Y, gating)
    C = overlaps.shape[0]
    off = [overlaps[p, q].diagonal().mean() for p in range(C) for q in range(C) if p != q]
    kappa = -float(torch.stack(off).mean())
    return 1.0 / (1.0 - (C - 1) * float(r) * kappa)


def contexts_closed_form(X: Tensor, Y: Tensor, gating: Gating, t: Tensor, *, tau: float, a0: float,
                         m: float | None = None, a0_context: float | None = None) -> tuple[Tensor, Tensor]:
    """Closed-form pathway maps and loss of the symmetric-context ReLN ([H] App. F-G, corrected).

    Common pathway: Saxe modes on the full target, ``pi(t)`` with ``S``, ``D`` of its effective
    dataset (App. F, first display). Context pathways: modes of their effective dataset on the
    residual ``Y* = Y - Y_common(inf)``, ``B(t) = (m S/D) / (1 - (1 - m S/(D B0)) exp(-2 S t/tau))``
    (the printed form has ``exp(+2 S t/tau)`` and lacks m inside, docs/theory.md#contexts-closed-form). Returns maps
    (T, P, n_out, n_in) and the loss (T,) of the summed network. ``a0`` starts the common
    pathway's modes, ``a0_context`` (default ``a0``) the context pathways'.
    """
    t = torch.as_tensor(t, dtype=torch.float64)
    a0_context = a0 if a0_context is None else a0_context
    U, S, V, d, c, ctx = _common_fit(X, Y, gating)
    m = context_m(X, Y, gating) if m is None else m
    maps = torch.zeros(t.shape[0], gating.n_pathways, Y.shape[1], X.shape[1], dtype=torch.float64)
    a = saxe_mode(t[:, None], s=S, d=d, tau=tau, a0=a0)
    maps[:, c] = torch.einsum("ok,tk,ik->toi", U, a, V)
    resid = Y.double() - common_limit(X, Y, gating)
    sub = Gating(gating.gates[:, ctx], gating.inputs[ctx], gating.common[ctx])
    syx, sx = effective_datasets(X, resid, sub)
    for i, (Up, Sp, Vp) in enumerate(pathway_modes(syx)):
        Dp = torch.einsum("kn,kl,ln->n", Vp, sx[i, i], Vp)
        # the closed form is Saxe's with S -> S and D -> D/m
        B = saxe_mode(t[:, None], s=Sp, d=Dp / m, tau=tau, a0=a0_context)
        maps[:, ctx[i]] = torch.einsum("ok,tk,ik->toi", Up, B, Vp)
    return maps, loss_of_maps(X, Y, gating, maps)


# ---------------------------------------------------------------------------------------------
# reading learning curves
# ---------------------------------------------------------------------------------------------
def time_to_loss(steps: Tensor, loss: Tensor, criterion: float | Tensor) -> Tensor:
    """First step at which ``loss`` (T, ...) is at or below ``criterion``, linearly interpolated
    between records; inf where it never gets there. Returns (...)."""
    loss = loss.double()
    steps = steps.double().reshape(-1, *([1] * (loss.dim() - 1)))
    crit = torch.as_tensor(criterion, dtype=torch.float64)
    below = loss <= crit
    first = torch.where(below.any(0), below.double().argmax(0), torch.full(loss.shape[1:], -1, dtype=torch.long))
    out = torch.full(loss.shape[1:], math.inf, dtype=torch.float64)
    ok = first >= 0
    i1 = first.clamp(min=1)
    i0 = i1 - 1
    l0, l1 = loss.gather(0, i0[None]).squeeze(0), loss.gather(0, i1[None]).squeeze(0)
    s0 = steps.expand_as(loss).gather(0, i0[None]).squeeze(0)
    s1 = steps.expand_as(loss).gather(0, i1[None]).squeeze(0)
    frac = ((l0 - crit) / (l0 - l1).clamp(min=1e-300)).clamp(0, 1)
    interp = torch.where(first == 0, steps.expand_as(loss)[0], s0 + frac * (s1 - s0))
    out[ok] = interp[ok]
    return out


def times_to_fraction(steps: Tensor, loss: Tensor, fractions: tuple[float, ...] = (0.5, 0.1, 0.01)) -> Tensor:
    """Steps needed to reach each fraction of the initial loss ([H] Sec. 4 criteria), (len(fractions), ...)."""
    return torch.stack([time_to_loss(steps, loss, f * loss[0]) for f in fractions])
