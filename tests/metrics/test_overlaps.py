"""Tests of zoo.metrics.overlaps against hand-computed values ([S] Eqs. 8, 10; docs/theory.md#entropies)."""
from __future__ import annotations

import math

import pytest
import torch

from zoo.metrics.overlaps import entropies, forgetting, order_parameters, transfer

DT = torch.float64


# --------------------------------------------------------------------------------------------
# order parameters
# --------------------------------------------------------------------------------------------
def test_order_parameters_hand_computed() -> None:
    # d = 4, p = 2, two teachers with p* = 1
    W = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 1.0, -1.0]], dtype=DT)
    WT1 = torch.tensor([[2.0, 0.0, 0.0, 0.0]], dtype=DT)
    WT2 = torch.tensor([[0.0, 0.0, 1.0, 1.0]], dtype=DT)
    Q, R, T = order_parameters(W, [WT1, WT2])
    # Q = W W^T / 4: |w1|^2 = 5, |w2|^2 = 3, w1.w2 = 2
    assert torch.equal(Q, torch.tensor([[5 / 4, 2 / 4], [2 / 4, 3 / 4]], dtype=DT))
    # R^(1): w1.wT1 = 2, w2.wT1 = 0 ; R^(2): w1.wT2 = 2, w2.wT2 = 0
    assert R.shape == (2, 2, 1)
    assert torch.equal(R[0], torch.tensor([[2 / 4], [0.0]], dtype=DT))
    assert torch.equal(R[1], torch.tensor([[2 / 4], [0.0]], dtype=DT))
    # T: |wT1|^2 = 4, |wT2|^2 = 2, wT1.wT2 = 0
    assert T.shape == (2, 2, 1, 1)
    assert torch.equal(T.reshape(2, 2), torch.tensor([[1.0, 0.0], [0.0, 0.5]], dtype=DT))


def test_order_parameters_layouts_agree() -> None:
    g = torch.Generator().manual_seed(0)
    E, p, ps, d = 3, 4, 2, 50
    W = torch.randn(E, p, d, dtype=DT, generator=g)
    teachers = [torch.randn(ps, d, dtype=DT, generator=g) for _ in range(3)]
    Q, R, T = order_parameters(W, teachers)
    Q2, R2, T2 = order_parameters(W, torch.stack(teachers))
    assert Q.shape == (E, p, p) and R.shape == (E, 3, p, ps) and T.shape == (3, 3, ps, ps)
    assert torch.equal(Q, Q2) and torch.equal(R, R2) and torch.equal(T, T2)
    # entry by entry against explicit dot products
    for e, t, i, n in [(0, 0, 0, 0), (2, 1, 3, 1), (1, 2, 2, 0)]:
        assert R[e, t, i, n].item() == pytest.approx(float(W[e, i] @ teachers[t][n]) / d, rel=1e-14)
    assert T[0, 2, 1, 0].item() == pytest.approx(float(teachers[0][1] @ teachers[2][0]) / d, rel=1e-14)
    # the ensemble dimension is member by member
    Qe, Re, _ = order_parameters(W[1], teachers)
    assert torch.allclose(Qe, Q[1], rtol=1e-15) and torch.allclose(Re, R[1], rtol=1e-15)
    # a single (p*, d) teacher is one task
    _, R1, T1 = order_parameters(W, teachers[0])
    assert R1.shape == (E, 1, p, ps) and torch.allclose(R1[:, 0], R[:, 0]) and T1.shape == (1, 1, ps, ps)


def test_order_parameters_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="input dimension"):
        order_parameters(torch.zeros(2, 5), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="same shape"):
        order_parameters(torch.zeros(2, 5), [torch.zeros(1, 5), torch.zeros(2, 5)])


# --------------------------------------------------------------------------------------------
# entropies
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 7])
def test_entropies_identical_units_and_one_active_unit(p: int) -> None:
    # identical units: equal Q_ii and |h_i| -> maximal entropies
    Q = 0.3 * torch.ones(p, p, dtype=DT)
    h = torch.full((p,), -0.8, dtype=DT)
    H = entropies(Q, h)
    assert H["H_h"].item() == pytest.approx(math.log(p), abs=1e-14)
    assert H["H_Q"].item() == pytest.approx(math.log(p), abs=1e-14)
    # H_m: the products Q~_ii |h~_i| are 1/p^2 each, so H_m = p * (1/p^2) log(p^2) = (2/p) log p
    assert H["H_m"].item() == pytest.approx(2 * math.log(p) / p, abs=1e-14)
    # one active unit (zero weights and zero head elsewhere): all entropies 0, no NaN (0 log 0 = 0)
    Q1 = torch.zeros(p, p, dtype=DT)
    Q1[0, 0] = 2.0
    h1 = torch.zeros(p, dtype=DT)
    h1[0] = 1.5
    H1 = entropies(Q1, h1)
    for key in ("H_h", "H_Q", "H_m"):
        assert H1[key].item() == 0.0


def test_entropies_hand_computed_and_batched() -> None:
    # h = (3, -1): |h~| = (3/4, 1/4); Q_ii = (1, 3): Q~ = (1/4, 3/4); products (3/16, 3/16)
    Q = torch.tensor([[1.0, 0.2], [0.2, 3.0]], dtype=DT)
    h = torch.tensor([3.0, -1.0], dtype=DT)
    H = entropies(Q, h)
    hh = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert H["H_h"].item() == pytest.approx(hh, abs=1e-14)
    assert H["H_Q"].item() == pytest.approx(hh, abs=1e-14)
    assert H["H_m"].item() == pytest.approx(-2 * (3 / 16) * math.log(3 / 16), abs=1e-14)
    # batched over leading dims, each entry as if computed alone; heads broadcast against Q
    Qb = torch.stack([Q, torch.eye(2, dtype=DT), torch.diag(torch.tensor([1.0, 0.0], dtype=DT))])
    hb = torch.stack([h, torch.tensor([1.0, 1.0], dtype=DT), torch.tensor([0.0, 0.0], dtype=DT)])
    Hb = entropies(Qb, hb)
    assert Hb["H_h"].shape == (3,)
    assert Hb["H_h"][0].item() == pytest.approx(hh) and Hb["H_Q"][1].item() == pytest.approx(math.log(2))
    # an all-zero head has nothing to normalise: entropy 0, not NaN
    assert Hb["H_h"][2].item() == 0.0 and Hb["H_m"][2].item() == 0.0 and Hb["H_Q"][2].item() == 0.0
    assert entropies(Qb, h)["H_h"].shape == (3,)


# --------------------------------------------------------------------------------------------
# forgetting and transfer
# --------------------------------------------------------------------------------------------
def test_forgetting_and_transfer_on_a_hand_made_trajectory() -> None:
    # two runs x 6 records; the switch is at record 2, the end at record 5
    eps1 = torch.tensor([[0.5, 0.2, 0.1, 0.3, 0.4, 0.45],
                         [0.5, 0.1, 0.05, 0.05, 0.06, 0.07]], dtype=DT)
    eps2 = torch.tensor([[0.6, 0.6, 0.6, 0.3, 0.2, 0.1],
                         [0.4, 0.4, 0.4, 0.39, 0.38, 0.35]], dtype=DT)
    f = forgetting(eps1, i_switch=2, delta=3)  # eps1(t_switch + Delta) - eps1(t_switch)
    assert torch.allclose(f, torch.tensor([0.35, 0.02], dtype=DT), atol=1e-15)
    assert torch.allclose(forgetting(eps1, 2, 1), torch.tensor([0.2, 0.0], dtype=DT), atol=1e-15)
    tr = transfer(eps2, i_switch=2, i_end=5)  # eps2(t_switch) - eps2(t_end)
    assert torch.allclose(tr, torch.tensor([0.5, 0.05], dtype=DT), atol=1e-15)
    assert torch.equal(transfer(eps2, 2, -1), tr)
    # a 1-d trajectory gives a scalar
    assert forgetting(eps1[0], 2, 3).item() == pytest.approx(0.35)
    with pytest.raises(ValueError):
        forgetting(eps1, 2, 4)
    with pytest.raises(ValueError):
        transfer(eps2, 2, 6)
