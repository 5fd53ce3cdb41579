"""zoo.utils.threads: the scoped thread count (restored on return and on error), its size rule, and the
theory entry points that use it (one thread for small work, the same bits as without the scope)."""
from __future__ import annotations

import math

import pytest
import torch

import zoo.theory.linear as linear
import zoo.theory.meanfield as meanfield
import zoo.theory.phase as phase
from zoo.utils.threads import SMALL_WORK, broadcast_work, num_threads, threads_for


def test_num_threads_sets_then_restores(two_threads):
    with num_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with num_threads(None):
        assert torch.get_num_threads() == 2


def test_num_threads_restores_when_the_block_raises(two_threads):
    with pytest.raises(KeyError):
        with num_threads(1):
            raise KeyError("inside")
    assert torch.get_num_threads() == 2


def test_num_threads_rejects_a_count_below_one():
    with pytest.raises(ValueError, match="positive integer"):
        with num_threads(0):
            pass


def test_one_thread_below_the_threshold_torch_setting_above():
    assert threads_for(SMALL_WORK - 1) == 1
    assert threads_for(SMALL_WORK) is None
    assert threads_for(10, "cuda") is None  # other devices: torch's setting (no CPU threads to choose)
    assert broadcast_work(torch.zeros(3, 1), torch.zeros(1, 5), s=2.0) == (15, torch.device("cpu"))


def _ode_inputs(E: int):
    g = torch.Generator().manual_seed(0)
    Q0 = 1e-2 * torch.eye(2, dtype=torch.float64).expand(E, 2, 2).clone()
    R0 = 1e-2 * torch.randn(E, 2, 2, 1, dtype=torch.float64, generator=g)
    T = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64).reshape(2, 2, 1, 1)
    heads0 = torch.rand(E, 2, 2, dtype=torch.float64, generator=g)
    return Q0, R0, T, heads0, torch.ones(2, 1, dtype=torch.float64)


def _spy(monkeypatch, module, name: str) -> list[int]:
    """Record the thread count each call of ``module.name`` runs with."""
    seen: list[int] = []
    real = getattr(module, name)

    def recorded(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recorded)
    return seen


def test_ode_runs_on_one_thread_and_gives_the_same_bits(two_threads, monkeypatch):
    seen = _spy(monkeypatch, meanfield, "_integrate")
    kw = dict(activation="erf", eta=1.0, alpha_switch=0.5, alpha_end=1.0, d_alpha=0.05, record_every=0.25)
    scoped = meanfield.integrate(*_ode_inputs(3), **kw)
    unscoped = meanfield.integrate(*_ode_inputs(3), cpu_threads=None, **kw)
    assert seen == [1, 2] and torch.get_num_threads() == 2
    for a, b in ((scoped.Q, unscoped.Q), (scoped.R, unscoped.R), (scoped.heads, unscoped.heads), (scoped.eps, unscoped.eps)):
        assert torch.equal(a, b)


def test_ode_restores_the_thread_count_when_it_raises(two_threads):
    with pytest.raises(ValueError, match="alpha_switch"):
        meanfield.integrate(*_ode_inputs(2), alpha_switch=2.0, alpha_end=1.0)  # switch after the end
    assert torch.get_num_threads() == 2


def test_student_ode_and_theory_error_run_on_one_thread(two_threads, monkeypatch):
    """What MultiHeadStudent.mean_field (the ODE overlays of the teacher-student callbacks) and
    theory_error call."""
    seen = _spy(monkeypatch, meanfield, "_integrate")
    Q0, R0, T, heads0, hT = _ode_inputs(2)
    meanfield.student_mean_field(Q0, R0, T.expand(2, 2, 2, 1, 1), heads0, hT.expand(2, 2, 1), activation="erf",
                                 eta=1.0, alpha_switch=[0.5], alpha_end=1.0, d_alpha=0.1)
    averages = _spy(monkeypatch, meanfield, "_averages")
    meanfield.generalisation_error(Q0, R0[:, 0], T[0, 0], heads0[:, 0], hT[0])
    assert seen == [1] and averages == [1]


def _linear_inputs(E: int = 3, n: int = 2):
    g = torch.Generator().manual_seed(1)
    A = 0.1 * torch.randn(E, n, n, dtype=torch.float64, generator=g)
    lam = torch.linspace(-1.0, 1.0, E, dtype=torch.float64)
    U, S, Vh = torch.linalg.svd(A)
    root = torch.sqrt(lam[:, None] ** 2 + 4 * S**2)
    W2 = U * torch.sqrt((root + lam[:, None]) / 2)[:, None, :]
    W1 = torch.sqrt((root - lam[:, None]) / 2)[:, :, None] * Vh
    sigma = torch.tensor([[1.0, 0.2], [0.0, 0.5]], dtype=torch.float64)
    return W1, W2, sigma, lam


def test_qqt_runs_on_one_thread_and_gives_the_same_bits(two_threads, monkeypatch):
    W1, W2, sigma, lam = _linear_inputs()
    t = torch.linspace(0.0, 5.0, 7, dtype=torch.float64)
    seen = _spy(monkeypatch, linear, "_riccati_F")
    scoped = linear.qqt(W1, W2, sigma, lam=lam, t=t)
    unscoped = linear.qqt.__wrapped__(W1, W2, sigma, lam=lam, t=t)
    assert seen == [1, 2]
    assert torch.equal(scoped, unscoped)
    lam_nz = lam + 0.5  # the stable form needs lam != 0
    assert torch.equal(linear.qqt_stable(W1, W2, sigma, lam=lam_nz, t=t), linear.qqt_stable.__wrapped__(W1, W2, sigma, lam=lam_nz, t=t))


def test_large_qqt_keeps_torch_setting(two_threads, monkeypatch):
    """Above the threshold the user's count stays (batched work gains from threads on free cores)."""
    E = math.ceil(SMALL_WORK / (5 * 16))  # members x 5 times x N^2 = 16 >= SMALL_WORK
    W1, W2, sigma, _ = _linear_inputs(E)
    seen = _spy(monkeypatch, linear, "_riccati_F")
    linear.qqt(W1, W2, sigma, lam=torch.zeros(E, dtype=torch.float64), t=torch.linspace(0.0, 1.0, 5))
    assert seen == [2]


def test_closed_forms_run_on_one_thread_and_give_the_same_bits(two_threads, monkeypatch):
    t = torch.linspace(0.0, 20.0, 50, dtype=torch.float64)[:, None]
    lam = torch.linspace(-2.0, 2.0, 9, dtype=torch.float64)[None, :]
    seen = _spy(monkeypatch, linear, "_inv_g")
    a = linear.aligned_singular_value(t, lam=lam, s=1.5, a0=1e-3)
    assert seen == [1]
    assert torch.equal(a, linear.aligned_singular_value.__wrapped__(t, lam=lam, s=1.5, a0=1e-3))
    assert torch.equal(linear.escape_time(0.1, lam=lam, s=1.0, omega0=1e-3),
                       linear.escape_time.__wrapped__(0.1, lam=lam, s=1.0, omega0=1e-3))


def test_phase_diagram_runs_on_one_thread_and_gives_the_same_bits(two_threads, monkeypatch):
    """What DeepLinearNet.pathway_phase (the phase-diagram callback) calls."""
    lam1 = torch.logspace(-2, 0, 4, dtype=torch.float64)[:, None]
    lam2 = torch.logspace(-3, 0, 5, dtype=torch.float64)[None, :]
    seen = _spy(monkeypatch, phase, "hitting_time")
    scoped = phase.phase_diagram(lam1, lam2, s=1.0, a0=1e-3, n_steps=20)
    unscoped = phase.phase_diagram.__wrapped__(lam1, lam2, s=1.0, a0=1e-3, n_steps=20)
    assert seen == [1, 2]
    torch.testing.assert_close(scoped, unscoped, rtol=0, atol=0, equal_nan=True)  # NaN: |lam1| < |lam2|
    kw = dict(s=1.0, a0=1e-3, lr=0.1, steps=30)
    assert torch.equal(phase.simulate_two_pathways(lam1, lam2, **kw), phase.simulate_two_pathways.__wrapped__(lam1, lam2, **kw))


def test_race_trajectory_runs_on_one_thread_and_gives_the_same_bits(two_threads, monkeypatch):
    """[H]'s neural race: thousands of steps of a few small einsums (the XoR task's 2 pathways)."""
    import zoo.theory.gdln as gdln
    from datamodules.xor import XorMargin

    dm = XorMargin(Delta=0.4)
    seen = _spy(monkeypatch, gdln, "effective_datasets")
    args = (dm.X, dm.Y, dm.gating("linear"), 50)
    scoped = gdln.race_trajectory(*args, tau=10.0, a0=1e-3)
    unscoped = gdln.race_trajectory.__wrapped__(*args, tau=10.0, a0=1e-3)
    assert seen == [1, 2]
    assert all(torch.equal(a, b) for a, b in zip(scoped, unscoped))
