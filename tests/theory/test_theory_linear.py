"""zoo.theory.linear against independent computations (ODE solvers, gradient descent, autograd).

Reference solutions: scipy's DOP853 with rtol=1e-12, atol=1e-14 (global error ~1e-10 over the
horizons used), full-batch gradient descent through autograd on an explicitly whitened dataset,
and torch.func.jacrev for the NTK.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp

from zoo.theory.linear import (
    aligned_singular_value,
    escape_time,
    hitting_time,
    input_rsm,
    linear_ntk_from_qqt,
    network_map,
    omega,
    output_rsm,
    qqt,
    qqt_stable,
    saxe_mode,
)

f64 = torch.float64




def ode(rhs, y0, t_eval):
    sol = solve_ivp(rhs, (0.0, float(t_eval[-1])), np.atleast_1d(np.asarray(y0, dtype=float)),
                    t_eval=t_eval, method="DOP853", rtol=1e-12, atol=1e-14)
    assert sol.success
    return sol.y


def balanced_init(lam: float, n_in: int, n_h: int, n_out: int, scale: float, gen: torch.Generator):
    """docs/theory.md#lambda-balanced construction: A = scale randn, SVD, random R, split the singular values."""
    A = scale * torch.randn(n_out, n_in, generator=gen, dtype=f64)
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    U, S, Vh = U[:, :n_h], S[:n_h], Vh[:n_h]
    R, _ = torch.linalg.qr(torch.randn(n_h, n_h, generator=gen, dtype=f64))
    root = torch.sqrt(lam**2 + 4 * S**2)
    W2 = (U * torch.sqrt((root + lam) / 2)) @ R.T
    W1 = R @ (torch.sqrt((root - lam) / 2)[:, None] * Vh)
    return W1, W2


def whitened_task(n_in: int, n_out: int, P: int, gen: torch.Generator):
    """A dataset with sample covariance exactly I: X (P, n_in), Y (P, n_out)."""
    Z = torch.randn(P, n_in, generator=gen, dtype=f64)
    evals, evecs = torch.linalg.eigh(Z.T @ Z / P)
    X = Z @ evecs @ torch.diag(evals.rsqrt()) @ evecs.T
    Y = torch.randn(P, n_out, generator=gen, dtype=f64) / math.sqrt(n_out)
    return X, Y


def gradient_descent(W1, W2, X, Y, lr: float, steps: int):
    """Full-batch GD on the mean loss 1/(2P) sum_i |y_i - W2 W1 x_i|^2, from the data itself.

    Gradients written out per sample (checked against autograd below), not through Sigma_yx.
    """
    P = X.shape[0]
    for _ in range(steps):
        H = X @ W1.T  # (P, n_h)
        E = Y - H @ W2.T  # (P, n_out) residuals
        g2 = -E.T @ H / P
        g1 = -(E @ W2).T @ X / P
        W1, W2 = W1 - lr * g1, W2 - lr * g2
    return W1, W2


def test_gradient_descent_helper_uses_the_autograd_gradient():
    gen = torch.Generator().manual_seed(0)
    X, Y = whitened_task(4, 3, 10, gen)
    W1 = torch.randn(2, 4, generator=gen, dtype=f64, requires_grad=True)
    W2 = torch.randn(3, 2, generator=gen, dtype=f64, requires_grad=True)
    loss = 0.5 * ((X @ W1.T @ W2.T - Y) ** 2).sum(-1).mean()
    g1, g2 = torch.autograd.grad(loss, (W1, W2))
    a, b = gradient_descent(W1.detach(), W2.detach(), X, Y, 0.1, 1)
    torch.testing.assert_close(a, W1.detach() - 0.1 * g1, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(b, W2.detach() - 0.1 * g2, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(X.T @ X / 10, torch.eye(4, dtype=f64), rtol=0, atol=1e-12)


def gram(W1, W2):
    Q = torch.cat([W1.T, W2], dim=0)
    return Q @ Q.T


# --------------------------------------------------------------------------------------------
# scalar modes
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lam", [-3.0, -0.5, 0.5, 3.0, 1e-9, 0.0, 25.0, -400.0])
@pytest.mark.parametrize("a0", [1e-3, 0.3, 4.0])
def test_aligned_singular_value_matches_ode(lam, a0):
    s, tau = 2.0, 1.3
    t = np.linspace(0.0, 6.0, 61)
    ref = ode(lambda _, a: np.sqrt(lam**2 + 4 * a**2) * (s - a) / tau, a0, t)[0]
    got = aligned_singular_value(torch.tensor(t), lam=lam, s=s, tau=tau, a0=a0).numpy()
    # the closed form is exact; 1e-6 (the spec) leaves 4 orders of margin over the ODE's error
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
    assert np.abs(got - ref).max() < 1e-9  # what it actually achieves (round-off of both)


def test_aligned_singular_value_long_times_and_broadcast():
    lam = torch.tensor([-2.0, 0.0, 0.5, 40.0], dtype=f64)[:, None]
    t = torch.tensor([0.0, 1e3, 1e6], dtype=f64)
    a = aligned_singular_value(t, lam=lam, s=1.5, a0=1e-4)
    assert a.shape == (4, 3)
    assert torch.isfinite(a).all()
    # a(0) = a0 is recovered from the integration constant: absolute error ~ eps * s, i.e.
    # relative ~ eps * s / a0 ~ 1e-12 for a0 = 1e-4
    torch.testing.assert_close(a[:, 0], torch.full((4,), 1e-4, dtype=f64), rtol=1e-10, atol=0)
    torch.testing.assert_close(a[:, 1:], torch.full((4, 2), 1.5, dtype=f64), rtol=1e-12, atol=0)


def test_lam_zero_branch_is_saxe_with_finite_gradients():
    t = torch.linspace(0, 5, 11, dtype=f64)
    for a0 in (1e-3, 0.7, 3.0):
        got = aligned_singular_value(t, lam=0.0, s=2.0, tau=0.8, a0=a0)
        torch.testing.assert_close(got, saxe_mode(t, s=2.0, d=1.0, tau=0.8, a0=a0), rtol=1e-14, atol=0)
    # continuity: lam -> 0 approaches the Saxe sigmoid; the rate sqrt(lam^2 + 4a^2) differs from
    # 2a by a relative lam^2/(8 a^2) <= 1.3e-11 for lam = 1e-8, a >= a0 = 1e-3
    near = aligned_singular_value(t, lam=1e-8, s=2.0, a0=1e-3)
    torch.testing.assert_close(near, saxe_mode(t, s=2.0, a0=1e-3), rtol=1e-9, atol=0)
    # a lam tensor containing zeros: values and gradients finite (torch.where between branches)
    lam = torch.tensor([0.0, 0.5, -1.0, 0.0], dtype=f64, requires_grad=True)
    a = aligned_singular_value(torch.tensor(1.0, dtype=f64), lam=lam, s=1.0, a0=0.01)
    a.sum().backward()
    assert torch.isfinite(a).all() and torch.isfinite(lam.grad).all()
    assert lam.grad[0] == 0 and lam.grad[3] == 0  # a depends on lam^2 only


def test_saxe_mode_matches_ode():
    s, d, tau, a0 = 3.0, 2.0, 0.5, 1e-3
    t = np.linspace(0, 3, 31)
    ref = ode(lambda _, a: 2 * a * (s - d * a) / tau, a0, t)[0]
    got = saxe_mode(torch.tensor(t), s=s, d=d, tau=tau, a0=a0).numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("lam", [-4.0, -0.25, 0.0, 0.25, 1.0, 4.0])
@pytest.mark.parametrize("omega0", [1e-3, 0.5, 2.5])
def test_omega_matches_pathway_ode(lam, omega0):
    """[S] Eq. 3 against the weights' own dynamics: h scalar, w a vector in R^3, input variance d.

    tau dw/dt = h (s v - d h w), tau dh/dt = w . (s v - d h w); omega = h w . v. omega0 = 2.5 lies
    above the fixed point s/d = 1.5 (the pathway unlearns towards it).
    """
    s, d, tau = 3.0, 2.0, 1.5
    v = np.array([0.6, 0.0, 0.8])
    root = math.sqrt(lam**2 + 4 * omega0**2)
    h0, wn = math.sqrt((root + lam) / 2), math.sqrt((root - lam) / 2)

    def rhs(_, y):
        h, w = y[0], y[1:]
        err = s * v - d * h * w
        return np.concatenate([[w @ err], h * err]) / tau

    t = np.linspace(0, 4, 41)
    y = ode(rhs, np.concatenate([[h0], wn * v]), t)
    ref = y[0] * (v @ y[1:])
    got = omega(torch.tensor(t), lam=lam, s=s, d=d, tau=tau, omega0=omega0).numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
    assert np.abs(got - ref).max() < 1e-9


def paper_time_to(target, lam, s, d, tau, omega0):
    """docs/theory.md#escape-hitting-times / [S] Eqs. 15-18 inversion, implemented literally (lam != 0, omega0 < s/d)."""
    k = math.sqrt(4 * s**2 + lam**2 * d**2)
    T0 = math.tanh(math.asinh(2 * omega0 / lam) / 2)
    c = abs(2 * s * T0 + k + lam * d) / abs(2 * s * T0 - k + lam * d)
    T = math.tanh(math.asinh(2 * target / lam) / 2)
    return tau / (math.copysign(1, lam) * k) * math.log((k + 2 * s * T + lam * d) / (c * (k - 2 * s * T - lam * d)))


@pytest.mark.parametrize("lam", [-3.0, -0.3, 0.3, 3.0])
def test_escape_and_hitting_times_invert_omega(lam):
    s, d, tau = 2.0, 0.5, 2.0
    omega0 = torch.tensor([1e-4, 1e-2, 0.5], dtype=f64)[:, None]
    v = torch.tensor([0.6, 1.0, 3.0], dtype=f64)  # between omega0 and s/d = 4
    t_hat = escape_time(v, lam=lam, s=s, d=d, tau=tau, omega0=omega0)
    assert (t_hat > 0).all()
    back = omega(t_hat, lam=lam, s=s, d=d, tau=tau, omega0=omega0)
    torch.testing.assert_close(back, v.expand_as(back), rtol=1e-10, atol=0)
    v_star = torch.tensor([1e-1, 1e-3, 1e-6], dtype=f64)
    t_star = hitting_time(v_star, lam=lam, s=s, d=d, tau=tau, omega0=omega0)
    gap = s / d - omega(t_star, lam=lam, s=s, d=d, tau=tau, omega0=omega0)
    # the gap is the difference of two O(1) numbers: absolute round-off ~1e-15, so relative 1e-8
    torch.testing.assert_close(gap, v_star.expand_as(gap), rtol=1e-8, atol=1e-13)
    # and the paper's printed inversion (Eqs. 15-18) gives the same numbers
    for i in range(3):
        for j in range(3):
            w0 = float(omega0[i, 0])
            assert t_hat[i, j].item() == pytest.approx(paper_time_to(float(v[j]), lam, s, d, tau, w0), rel=1e-9)
            assert t_star[i, j].item() == pytest.approx(
                paper_time_to(s / d - float(v_star[j]), lam, s, d, tau, w0), rel=1e-6)


def test_escape_time_lam_zero_is_saxe():
    s, d, tau, w0, v = 2.0, 0.5, 2.0, 1e-3, 1.0
    expected = tau / (2 * s) * math.log(v * (s - d * w0) / (w0 * (s - d * v)))
    assert escape_time(v, lam=0.0, s=s, d=d, tau=tau, omega0=w0).item() == pytest.approx(expected, rel=1e-12)
    # the fixed point is never reached -> inf; beyond it -> NaN; a target behind the start was
    # passed before t = 0 -> negative time, consistent with running the flow backwards
    assert math.isinf(escape_time(s / d, lam=1.0, s=s, d=d, omega0=w0).item())
    assert math.isnan(escape_time(s / d + 1, lam=1.0, s=s, d=d, omega0=w0).item())
    back = escape_time(w0 / 2, lam=1.0, s=s, d=d, omega0=w0)
    assert back.item() < 0
    assert omega(back, lam=1.0, s=s, d=d, omega0=w0).item() == pytest.approx(w0 / 2, rel=1e-9)


# --------------------------------------------------------------------------------------------
# QQ^T
# --------------------------------------------------------------------------------------------
DIMS = [(5, 3, 4), (4, 4, 4), (3, 2, 5)]


@pytest.mark.parametrize("dims", DIMS)
@pytest.mark.parametrize("lam", [-2.0, 0.0, 2.0])
def test_qqt_matches_gradient_descent(dims, lam):
    """Closed form vs Euler (GD) at lr and lr/2: error below 5 lr and halving with lr.

    GD is the Euler discretisation of the flow with tau = 1/lr steps, so its global error at fixed
    time is C lr with C = O(1) for these O(1) weights and times (observed C ~ 0.3-1.6).
    """
    n_in, n_h, n_out = dims
    gen = torch.Generator().manual_seed(1000 + 10 * len(dims) + int(lam))
    X, Y = whitened_task(n_in, n_out, 24, gen)
    sigma_yx = Y.T @ X / X.shape[0]
    W1, W2 = balanced_init(lam, n_in, n_h, n_out, 0.3, gen)
    T = 3.0
    pred = qqt(W1, W2, sigma_yx, lam=lam, t=torch.tensor([T], dtype=f64))[0]
    errs = []
    for lr in (0.02, 0.01):
        a, b = gradient_descent(W1, W2, X, Y, lr, round(T / lr))
        errs.append((pred - gram(a, b)).abs().max().item())
        assert errs[-1] < 5 * lr
    assert 1.7 < errs[0] / errs[1] < 2.3  # first order in lr


@pytest.mark.parametrize("dims", DIMS)
@pytest.mark.parametrize("lam", [-2.0, 0.0, 0.7, 2.0])
def test_qqt_matches_gradient_flow_ode(dims, lam):
    n_in, n_h, n_out = dims
    gen = torch.Generator().manual_seed(7)
    sig = torch.randn(n_out, n_in, generator=gen, dtype=f64)
    W1, W2 = balanced_init(lam, n_in, n_h, n_out, 0.1, gen)
    tau = 2.0
    t = np.array([0.0, 0.5, 2.0, 6.0])

    def rhs(_, y):
        A = y[: n_h * n_in].reshape(n_h, n_in)
        B = y[n_h * n_in:].reshape(n_out, n_h)
        E = sig.numpy() - B @ A
        return np.concatenate([(B.T @ E).ravel(), (E @ A.T).ravel()]) / tau

    y = ode(rhs, np.concatenate([W1.numpy().ravel(), W2.numpy().ravel()]), t)
    pred = qqt(W1, W2, sig, lam=lam, t=torch.tensor(t), tau=tau)
    for k in range(len(t)):
        A = torch.tensor(y[: n_h * n_in, k]).reshape(n_h, n_in)
        B = torch.tensor(y[n_h * n_in:, k]).reshape(n_out, n_h)
        # exact formula vs DOP853 (global error ~1e-11 here)
        torch.testing.assert_close(pred[k], gram(A, B), rtol=0, atol=1e-8)


def test_qqt_blocks_and_layout():
    gen = torch.Generator().manual_seed(3)
    W1, W2 = balanced_init(1.0, 5, 3, 4, 0.5, gen)
    sig = torch.randn(4, 5, generator=gen, dtype=f64)
    Q0 = qqt(W1, W2, sig, lam=1.0, t=0.0)[0]
    torch.testing.assert_close(Q0, gram(W1, W2), rtol=0, atol=1e-13)
    torch.testing.assert_close(network_map(Q0, 5), W2 @ W1, rtol=0, atol=1e-13)
    torch.testing.assert_close(input_rsm(Q0, 5), W1.T @ W1, rtol=0, atol=1e-13)
    torch.testing.assert_close(output_rsm(Q0, 5), W2 @ W2.T, rtol=0, atol=1e-13)
    torch.testing.assert_close(Q0[:5, 5:], (W2 @ W1).T, rtol=0, atol=1e-13)


def test_qqt_batched_over_ensemble_equals_single_calls():
    gen = torch.Generator().manual_seed(11)
    lams = [-1.5, 0.0, 0.5, 3.0]
    pairs = [balanced_init(l, 4, 3, 5, 0.2, gen) for l in lams]
    W1 = torch.stack([p[0] for p in pairs])
    W2 = torch.stack([p[1] for p in pairs])
    sig = torch.randn(5, 4, generator=gen, dtype=f64)
    t = torch.linspace(0, 10, 7, dtype=f64)
    batch = qqt(W1, W2, sig, lam=torch.tensor(lams, dtype=f64), t=t)
    assert batch.shape == (4, 7, 9, 9)
    for e, l in enumerate(lams):
        torch.testing.assert_close(batch[e], qqt(W1[e], W2[e], sig, lam=l, t=t), rtol=0, atol=1e-12)


@pytest.mark.parametrize("lam", [-2.0, -0.3, 0.4, 2.0])
def test_stable_form_agrees_with_general_and_stays_finite(lam):
    n = 4
    gen = torch.Generator().manual_seed(5)
    sig = torch.randn(n, n, generator=gen, dtype=f64)
    W1, W2 = balanced_init(lam, n, n, n, 0.05, gen)
    t = torch.tensor([0.0, 0.3, 2.0, 10.0, 1e2, 1e4], dtype=f64)
    stable = qqt_stable(W1, W2, sig, lam=lam, t=t)
    general = qqt(W1, W2, sig, lam=lam, t=t)
    assert torch.isfinite(stable).all() and torch.isfinite(general).all()
    # two different exact formulas: agreement at round-off level (entries are O(1-10))
    torch.testing.assert_close(stable, general, rtol=0, atol=1e-9)
    torch.testing.assert_close(stable[0], gram(W1, W2), rtol=0, atol=1e-12)
    # at t = 1e4 tau the equal-dimension network has learnt the task exactly
    torch.testing.assert_close(network_map(stable[-1], n), sig, rtol=0, atol=1e-10)
    # and its representations are the balanced fixed point: W2^T W2 - W1 W1^T = lam I is conserved,
    # so the RSMs at convergence have eigenvalues (sqrt(lam^2 + 4 s^2) +- lam)/2
    S = torch.linalg.svdvals(sig)
    root = torch.sqrt(lam**2 + 4 * S**2)
    torch.testing.assert_close(torch.linalg.eigvalsh(input_rsm(stable[-1], n)).flip(0), (root - lam) / 2,
                               rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(torch.linalg.eigvalsh(output_rsm(stable[-1], n)).flip(0), (root + lam) / 2,
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("lam", [-1.0, 0.0, 1.0])
def test_general_form_long_times_unequal_dims(lam):
    """At t = 1e4 tau, n_h = 3 < rank: the map is the best rank-3 approximation of sigma_yx."""
    gen = torch.Generator().manual_seed(9)
    sig = torch.randn(4, 5, generator=gen, dtype=f64)
    W1, W2 = balanced_init(lam, 5, 3, 4, 0.05, gen)
    out = qqt(W1, W2, sig, lam=lam, t=torch.tensor([1e4, 1e6], dtype=f64))
    assert torch.isfinite(out).all()
    U, S, Vh = torch.linalg.svd(sig, full_matrices=False)
    best = U[:, :3] @ torch.diag(S[:3]) @ Vh[:3]
    for k in range(2):
        torch.testing.assert_close(network_map(out[k], 5), best, rtol=0, atol=1e-9)


def test_stable_form_rejects_what_it_cannot_do():
    gen = torch.Generator().manual_seed(0)
    W1, W2 = balanced_init(0.0, 3, 3, 3, 0.1, gen)
    sig = torch.randn(3, 3, generator=gen, dtype=f64)
    with pytest.raises(ValueError, match="lam = 0"):
        qqt_stable(W1, W2, sig, lam=0.0, t=1.0)
    W1, W2 = balanced_init(1.0, 4, 3, 3, 0.1, gen)
    with pytest.raises(ValueError, match="n_in = n_h = n_out"):
        qqt_stable(W1, W2, torch.randn(3, 4, dtype=f64), lam=1.0, t=1.0)
    with pytest.raises(ValueError, match="do not chain"):
        qqt(W1, W2, torch.randn(4, 4, dtype=f64), lam=1.0, t=1.0)


def test_ntk_from_qqt_matches_jacobian():
    """K[(o,i),(o',j)] = sum over W1, W2 of df_o(x_i) df_o'(x_j), output index slowest."""
    gen = torch.Generator().manual_seed(2)
    n_in, n_h, n_out, P = 3, 2, 4, 5
    W1 = torch.randn(n_h, n_in, generator=gen, dtype=f64)
    W2 = torch.randn(n_out, n_h, generator=gen, dtype=f64)
    X = torch.randn(P, n_in, generator=gen, dtype=f64)  # samples as rows

    def f(A, B):
        return (B @ A @ X.T).reshape(-1)  # (n_out * P,), index o * P + i

    J1, J2 = torch.func.jacrev(f, argnums=(0, 1))(W1, W2)
    J1, J2 = J1.reshape(n_out * P, -1), J2.reshape(n_out * P, -1)
    direct = J1 @ J1.T + J2 @ J2.T
    K = linear_ntk_from_qqt(gram(W1, W2), X, n_in)
    torch.testing.assert_close(K, direct, rtol=1e-12, atol=1e-12)
    # batched over times of a qqt trajectory
    lam = 0.0
    W1b, W2b = balanced_init(lam, n_in, n_h, n_out, 0.5, gen)
    traj = qqt(W1b, W2b, torch.randn(n_out, n_in, generator=gen, dtype=f64), lam=lam,
               t=torch.tensor([0.0, 1.0], dtype=f64))
    Kt = linear_ntk_from_qqt(traj, X, n_in)
    assert Kt.shape == (2, n_out * P, n_out * P)
    torch.testing.assert_close(Kt[0], linear_ntk_from_qqt(gram(W1b, W2b), X, n_in), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="samples as rows"):
        linear_ntk_from_qqt(gram(W1, W2), X.T, n_in)


def test_qqt_blocking_and_autograd_paths_agree(monkeypatch):
    """Blocked evaluation (members, then times) and the autograd path give the same numbers."""
    import zoo.theory.linear as lin

    gen = torch.Generator().manual_seed(4)
    lams = torch.tensor([-1.0, 0.0, 2.0], dtype=f64)
    pairs = [balanced_init(float(l), 3, 2, 4, 0.3, gen) for l in lams]
    W1 = torch.stack([p[0] for p in pairs])
    W2 = torch.stack([p[1] for p in pairs])
    sig = torch.randn(4, 3, generator=gen, dtype=f64)
    t = torch.linspace(0, 5, 50, dtype=f64)
    whole = qqt(W1, W2, sig, lam=lams, t=t)
    for block in (2 * 7 * 50, 2 * 7 * 7):  # two members per block; one member and 7 times per block
        monkeypatch.setattr(lin, "_QQT_BLOCK", block)
        torch.testing.assert_close(qqt(W1, W2, sig, lam=lams, t=t), whole, rtol=0, atol=1e-13)
    W1g = W1.clone().requires_grad_(True)
    out = qqt(W1g, W2, sig, lam=lams, t=t)
    torch.testing.assert_close(out.detach(), whole, rtol=0, atol=1e-13)
    out.sum().backward()
    assert torch.isfinite(W1g.grad).all() and W1g.grad.abs().sum() > 0
