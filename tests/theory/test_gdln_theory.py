"""zoo.theory.gdln against the paper's closed forms, its corrected typos and direct integration."""
from __future__ import annotations

import math

import pytest
import torch

from datamodules.contexts import Contexts
from datamodules.xor import XorMargin
from zoo.theory import gdln as th




def test_xor_crossover_is_sqrt_two_thirds():
    # [H] App. C Eq. 26, found by bisection on the closed forms' singular values
    assert abs(th.xor_crossover() - math.sqrt(2 / 3)) < 1e-9


def test_xor_effective_datasets_match_app_c():
    D = 0.7
    dm = XorMargin(Delta=D)
    syx, sx = th.effective_datasets(dm.X, dm.Y, dm.gating("linear"))
    # [H] App. C Eqs. 14 and 16 for the positive-example pathway
    assert torch.allclose(syx[0], torch.tensor([[0.0, 0.0, D / 2]], dtype=torch.float64), atol=1e-7)
    expected = 0.5 * torch.tensor([[1, -1, 0], [-1, 1, 0], [0, 0, D**2]], dtype=torch.float64)
    assert torch.allclose(sx[0, 0], expected, atol=1e-7)
    # the two pathways never share a data point: no cross term
    assert sx[0, 1].abs().max() == 0
    # XoR pathway: s = sqrt(1/8 + D^2/16), and d = u^T Sigma_x v with v the mode is 4 s^2 (the typo fix)
    syx, sx = th.effective_datasets(dm.X, dm.Y, dm.gating("xor"))
    U, S, V = th.pathway_modes(syx)[0]
    s, d, _, _ = th.xor_reln_constants(D, "xor")
    assert float(S[0]) == pytest.approx(float(s), rel=1e-6)
    assert float(V[:, 0] @ sx[0, 0] @ V[:, 0]) == pytest.approx(float(d), rel=1e-6)
    assert float(d) == pytest.approx(0.5 + D**2 / 4, rel=1e-12) and float(d) != pytest.approx(1 / 8 + D**2 / 16)


@pytest.mark.parametrize("kind", ["linear", "xor"])
@pytest.mark.parametrize("D", [0.4, 1.3])
def test_xor_closed_form_matches_race(kind, D):
    dm = XorMargin(Delta=D)
    tau, a0 = 100.0, 1e-4  # slow enough that forward Euler (one step = one GD step) is within 1% of the flow
    steps, _, loss = th.race_trajectory(dm.X, dm.Y, dm.gating(kind), 3000, tau=tau, a0=a0)
    closed = th.xor_loss(steps.double(), D, kind, tau=tau, a0=a0)
    assert float(loss[0]) == pytest.approx(0.5, abs=1e-3)
    assert (loss - closed).abs().max() < 0.01  # curves of height 0.5
    t_race = th.time_to_loss(steps, loss, 0.2)
    assert float(t_race) == pytest.approx(float(th.xor_time_to_loss(D, kind, tau=tau, a0=a0)), rel=0.01)
    assert float(th.xor_loss(1e9, D, kind, tau=tau, a0=a0)) == pytest.approx(0.0, abs=1e-12)  # converges to zero loss


def test_xor_faster_reln_switches_at_crossover():
    D = torch.tensor([0.6, 0.8, 1.0, 1.2])
    lin = th.xor_time_to_loss(D, "linear", tau=2.5, a0=1e-12)
    xor = th.xor_time_to_loss(D, "xor", tau=2.5, a0=1e-12)
    # the time ~ log(1/a0)/(2 s): the pathway with the larger s wins (at finite a0 the switch of the
    # times lies a little above sqrt(2/3): 0.83 at a0 = 1e-12)
    assert bool((xor[:2] < lin[:2]).all()) and bool((lin[2:] < xor[2:]).all())


@pytest.mark.parametrize("C", [3, 4, 5])
def test_context_m_is_c_minus_one(C):
    dm = Contexts(C, "same")
    overlaps, r = th.context_overlap(dm.X, dm.Y, dm.gating("reln"))
    # Sigma_x(j, p) = (C-2)/(C-1) Sigma_x(p, p): the pathways share C - 2 of their C - 1 contexts
    assert float(r) == pytest.approx((C - 2) / (C - 1), rel=1e-12)
    # U_p^T U_j = -I/(C-1) on every mode (App. F prints -I/2 for C = 3; App. G's -I/6, -I/12 are typos)
    off = overlaps[0, 1]
    assert torch.allclose(off, -torch.eye(off.shape[0], dtype=off.dtype) / (C - 1), atol=1e-9)
    assert th.context_m(dm.X, dm.Y, dm.gating("reln")) == pytest.approx(C - 1, rel=1e-9)


@pytest.mark.parametrize("C", [3, 5])
def test_context_closed_form_against_race(C):
    """The corrected closed form (App. F-G, m = C - 1) against the race of the same ReLN on the
    authors' two-loss training. Both start from the same a0; the criterion is the first one of [H]
    Sec. 4 (half the initial loss), which the common pathway decides."""
    dm = Contexts(C, "same")
    g = dm.gating("reln")
    N = dm.X.shape[0]
    tau, a0, T = 1 / (N * 4e-3), 1e-8, 1500
    steps, _, race = th.race_trajectory(dm.X, dm.Y, g, T, tau=tau, a0=a0, training="two_loss", record_every=5)
    _, closed = th.contexts_closed_form(dm.X, dm.Y, g, steps, tau=tau, a0=a0)
    t_race = th.times_to_fraction(steps, race, (0.5,))
    t_closed = th.times_to_fraction(steps, closed, (0.5,))
    assert float(t_closed) == pytest.approx(float(t_race), rel=0.03)  # measured 0.4-0.9%; Euler vs flow
    # the context pathways converge to the residual: the closed form's end loss is the two-loss optimum 0
    _, late = th.contexts_closed_form(dm.X, dm.Y, g, torch.tensor([1e7]), tau=tau, a0=a0)
    assert float(late) < 1e-8


def test_time_to_loss_interpolates():
    t = torch.arange(5.0)
    L = torch.tensor([[1.0, 2.0], [0.8, 1.0], [0.4, 0.5], [0.2, 0.1], [0.1, 0.05]])
    out = th.time_to_loss(t, L, 0.6)
    assert float(out[0]) == pytest.approx(1.5) and float(out[1]) == pytest.approx(1.8)
    assert math.isinf(float(th.time_to_loss(t, L[:, :1], 0.01)))
