"""zoo.theory.phase: Algorithm 1 of [S] App. B against an independent integration, its provable
properties, and its agreement with gradient descent on two-pathway networks.

What is provable (gradient flow, aligned weights; tau domega_i/dt = f_i(omega_i) r(t),
f_i = sqrt(lam_i^2 + 4 omega_i^2), r = s - d(omega_1 + omega_2) >= 0 throughout):
* the true fast pathway is a subsolution of its uncoupled ODE, so omega_1 <= omega_1^alg(t);
  hence the true slow pathway is a supersolution of the algorithm's slow ODE: omega_2 >= omega_2^alg.
  omega_2 is non-decreasing (r >= 0), so the simulated final omega_2 >= max_t omega_2^alg(t), and
  "escapes in theory" implies "reaches v_hat in the simulation";
* with |lam1| >= |lam2| and omega_1(0) >= omega_2(0), omega_1 >= omega_2 for all t (same r(t),
  larger f): the fast pathway carries at least half of the map;
* identical pathways stay identical: the slow fraction is exactly 1/2;
* min_escape_time is non-increasing in |lam2| and non-decreasing in |lam1| (comparison again), and
  t_escape_slow - t_hit_fast <= min_escape_time <= t_escape_slow.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.integrate import quad, solve_ivp

from zoo.theory.linear import escape_time
from zoo.theory.phase import initial_omegas, phase_diagram, simulate_two_pathways

f64 = torch.float64




def reference_algorithm(lam1, lam2, s, d, tau, w1, w2, v_hat, v_star, K):
    """Algorithm 1 with scipy only: event-located t1*, DOP853 for both pathways, quad for the
    remaining escape time tau * int_{omega_2}^{v_hat} domega / (f_2(omega) (S - d omega))."""
    def rate(l, w, S):
        return math.sqrt(l * l + 4 * w * w) * (S - d * w) / tau

    def hit(_, y):
        return y[0] - (s / d - v_star)
    hit.terminal = True
    sol = solve_ivp(lambda t, y: [rate(lam1, y[0], s)], (0, 1e6), [w1], events=hit,
                    rtol=1e-12, atol=1e-15, method="DOP853")
    t1 = sol.t_events[0][0]
    tk = np.linspace(0, t1, K + 1)
    sol = solve_ivp(lambda t, y: [rate(lam1, y[0], s), rate(lam2, y[1], s - d * y[0])], (0, t1),
                    [w1, w2], t_eval=tk, rtol=1e-12, atol=1e-15, method="DOP853")
    remaining = []
    for a, b in zip(*sol.y):
        S = s - d * a
        if b >= v_hat:
            remaining.append(0.0)
        elif v_hat >= S / d:
            remaining.append(math.inf)
        else:
            remaining.append(quad(lambda w: tau / (math.sqrt(lam2**2 + 4 * w * w) * (S - d * w)),
                                  b, v_hat, epsabs=0, epsrel=1e-12, limit=200)[0])
    return t1, sol.y[1].max(), min(remaining)


@pytest.mark.parametrize(
    "lam1, lam2, s, d, tau, init",
    [
        (1.0, 0.05, 1.0, 1.0, 1.0, {"a0": 1e-3}),  # slow pathway stays below v_hat
        (0.02, 1e-4, 1.0, 1.0, 1.0, {"a0": 1e-3}),
        (0.3, 0.3, 2.0, 0.5, 3.0, {"omega0": 1e-4}),  # symmetric: escapes
        (2.0, 0.0, 1.0, 1.0, 1.0, {"omega0": 1e-3}),  # lam2 = 0 (Saxe slow pathway)
        (-0.5, 0.2, 1.0, 2.0, 1.0, {"omega0": 1e-5}),  # signs do not matter, only |lam|
    ],
)
def test_phase_diagram_matches_independent_integration(lam1, lam2, s, d, tau, init):
    r = phase_diagram(lam1, lam2, s=s, d=d, tau=tau, n_steps=400, return_details=True, **init)
    w1, w2 = (float(w) for w in initial_omegas(torch.tensor(lam1, dtype=f64), torch.tensor(lam2, dtype=f64),
                                                 init.get("omega0"), init.get("a0")))
    t1, w2_max, min_rem = reference_algorithm(abs(lam1), abs(lam2), s, d, tau, w1, w2,
                                              0.05 * s / d, 0.01 * s / d, 400)
    # closed-form t1* vs event location (both ~1e-12); RK4 with 400 steps vs DOP853: observed
    # relative error <= 1e-9 for these rates, so 1e-7 leaves margin
    assert r.t_hit_fast.item() == pytest.approx(t1, rel=1e-9)
    assert r.omega_slow_max.item() == pytest.approx(w2_max, rel=1e-7)
    assert r.min_escape_time.item() == pytest.approx(min_rem, rel=1e-6, abs=1e-9)


def grid():
    lam1 = torch.logspace(-3, 0, 8, dtype=f64)[:, None]
    lam2 = torch.logspace(-6, 0, 10, dtype=f64)[None, :]
    return lam1, lam2


def test_phase_diagram_shape_nan_region_and_bounds():
    lam1, lam2 = grid()
    r = phase_diagram(lam1, lam2, s=1.0, a0=1e-3, return_details=True)
    assert r.min_escape_time.shape == (8, 10)
    valid = lam1 >= lam2
    assert torch.isnan(r.min_escape_time[~valid]).all()
    assert not torch.isnan(r.min_escape_time[valid]).any()
    m, te, t1 = r.min_escape_time[valid], r.t_escape_slow[valid], r.t_hit_fast.expand(8, 10)[valid]
    assert (m >= 0).all()
    # the min includes t = 0, where the residual is s - omega_1(0) ...
    w1, w2 = initial_omegas(lam1.expand(8, 10), lam2.expand(8, 10), None, 1e-3)
    at0 = escape_time(0.05, lam=lam2, s=1.0 - w1, omega0=w2)[valid]
    assert (m <= at0 * (1 + 1e-12)).all()
    # ... and the slow pathway's drive never exceeds the uncoupled one (remaining >= t_esc - t)
    assert (m >= te - t1 - 1e-9).all()
    # both sides of the transition occur on this grid
    assert (m == 0).any() and (m > 0.5).any()
    assert torch.equal(r.specialised, valid & (r.min_escape_time > 0))


def test_phase_diagram_is_monotone_in_the_imbalances():
    lam1 = torch.linspace(0.05, 1.0, 12, dtype=f64)[:, None]
    lam2 = torch.logspace(-6, -1.5, 12, dtype=f64)[None, :]
    m = phase_diagram(lam1, lam2, s=1.0, a0=1e-3)
    ok = ~torch.isnan(m)
    # discretisation of the min over a 400-step grid: ~1e-6 relative slack
    slack = 1e-6 * m.nan_to_num(0).abs().max()
    d2 = m[:, 1:] - m[:, :-1]  # along lam2: the slow pathway gets faster -> closer to escaping
    assert (d2[ok[:, 1:] & ok[:, :-1]] <= slack).all()
    d1 = m[1:, :] - m[:-1, :]  # along lam1: the fast pathway gets faster -> further away
    assert (d1[ok[1:, :] & ok[:-1, :]] >= -slack).all()


def test_symmetric_pathways_do_not_specialise():
    lam = torch.tensor([0.0, 0.1, 0.5, 2.0, 10.0], dtype=f64)
    m = phase_diagram(lam, lam, s=1.0, omega0=1e-4)
    assert (m == 0).all()  # the slow copy reaches v_hat while the fast one is still learning
    frac = simulate_two_pathways(lam, lam, s=1.0, omega0=1e-4, lr=0.01, steps=200)
    torch.testing.assert_close(frac, torch.full_like(frac, 0.5), rtol=0, atol=1e-12)


def test_a_very_slow_pathway_never_escapes():
    # slow pathway: lam2 -> -a0^2 makes its readout and initial omega vanish (a0 init) ...
    lam1 = torch.tensor([0.1, 1.0], dtype=f64)
    r = phase_diagram(lam1, -1e-6 + 1e-12, s=1.0, a0=1e-3, return_details=True)
    assert r.specialised.all()
    assert (r.min_escape_time >= r.t_escape_slow - r.t_hit_fast).all()
    assert (r.t_escape_slow - r.t_hit_fast > 1).all()
    # ... or lam2 = 0 from a tiny common omega0 against a lazy fast pathway
    r = phase_diagram(torch.tensor([5.0, 50.0], dtype=f64), 0.0, s=1.0, omega0=1e-8, return_details=True)
    assert r.specialised.all() and (r.min_escape_time > 5).all()
    frac = simulate_two_pathways(torch.tensor([5.0, 50.0], dtype=f64), 0.0, s=1.0, omega0=1e-8,
                                 lr=0.005, steps=4000)
    assert (frac < 1e-3).all()


def test_theory_and_simulation_agree_on_who_carries_the_map():
    lam1, lam2 = grid()
    v_hat = 0.05
    r = phase_diagram(lam1, lam2, s=1.0, a0=1e-3, v_hat=v_hat, return_details=True)
    lr = 0.005
    frac, o1, o2 = simulate_two_pathways(lam1, lam2, s=1.0, a0=1e-3, lr=lr, steps=6000, return_omegas=True)
    valid = ~torch.isnan(r.min_escape_time)
    # the task is learnt (t = 30 tau) and the fast pathway carries at least half (provable)
    torch.testing.assert_close(o1 + o2, torch.ones_like(o1), rtol=0, atol=1e-6)
    assert (frac[valid] <= 0.5 + 1e-9).all()
    # provable: the simulated slow pathway ends at least where the algorithm's peaked; GD with
    # lr = 0.005 deviates from the flow by O(lr) relative (~1%), hence the 3% slack
    assert (o2[valid] >= 0.97 * r.omega_slow_max[valid]).all()
    # provable: theory says "escapes" -> the simulation's slow pathway reaches v_hat
    escaped = valid & (r.min_escape_time == 0)
    assert escaped.sum() >= 5 and (o2[escaped] >= 0.97 * v_hat).all()
    # qualitative (not a theorem): clearly specialised in theory -> slow pathway below v_hat and
    # a small share of the map in the simulation
    clear = valid & (r.min_escape_time > 1.0)
    assert clear.sum() >= 10 and (o2[clear] < v_hat).all() and (frac[clear] < 0.05).all()


def test_simulation_follows_the_coupled_flow():
    """GD with n_in = 1 against DOP853 of the two-pathway ODE: error O(lr), halving with lr."""
    lam1, lam2, s, d, w0 = 0.8, 0.1, 1.5, 2.0, 1e-3
    T = 6.0

    def rhs(_, y):
        r = s - d * (y[0] + y[1])
        return [math.sqrt(lam1**2 + 4 * y[0] ** 2) * r, math.sqrt(lam2**2 + 4 * y[1] ** 2) * r]

    ref = solve_ivp(rhs, (0, T), [w0, w0], rtol=1e-12, atol=1e-15, method="DOP853").y[:, -1]
    errs = []
    for lr in (0.004, 0.002):
        _, o1, o2 = simulate_two_pathways(lam1, lam2, s=s, d=d, lr=lr, steps=round(T / lr), omega0=w0,
                                          return_omegas=True)
        errs.append(max(abs(o1.item() - ref[0]), abs(o2.item() - ref[1])))
    assert errs[0] < 0.05 and 1.6 < errs[0] / errs[1] < 2.4
    # imbalances are conserved up to O(lr^2) per step; with random input directions (n_in = 4)
    # the silent alignment happens and the task is still learnt
    frac = simulate_two_pathways(lam1, lam2, s=s, d=d, lr=0.004, steps=3000, omega0=w0, n_in=4, seed=1)
    assert 0 <= frac.item() <= 0.5


def test_inputs_are_validated():
    with pytest.raises(ValueError, match="exactly one"):
        phase_diagram(1.0, 0.5, s=1.0, omega0=1e-3, a0=1e-3)
    with pytest.raises(ValueError, match="exactly one"):
        simulate_two_pathways(1.0, 0.5, s=1.0, lr=0.1, steps=1)
    with pytest.raises(ValueError, match="lam > -a0"):
        phase_diagram(1.0, -0.5, s=1.0, a0=1e-3)
