"""EWC: the penalty and its gradient, the student's Fisher, consolidation at the switch, resume."""
from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from datamodules import TeacherStudent
from zoo import MultiHeadStudent
from zoo.training.ewc import EWC, EWCState
from zoo.init import Gaussian, Polar
from helpers_fit import trainer
from zoo.models.student import phi



def test_penalty_is_zero_at_the_anchor_positive_elsewhere_and_has_gradient_xi_F_diff():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(3, 4, generator=g, dtype=torch.float64)
    F = torch.rand(3, 4, generator=g, dtype=torch.float64)
    state = EWCState({"W": W.shape}, EWC(xi=0.3)).double()
    state.consolidate({"W": W}, {"W": F})
    assert state.active
    assert float(state.penalty({"W": W})) == 0.0
    V = (W + 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    pen = state.penalty({"W": V})
    assert float(pen) > 0
    assert math.isclose(float(pen), 0.15 * float((F * (V - W) ** 2).sum()), rel_tol=1e-12)
    (grad,) = torch.autograd.grad(pen, V)
    assert torch.allclose(grad, 0.3 * F * (V.detach() - W), atol=1e-14)
    assert torch.allclose(state.gradient("W", V.detach()), grad, atol=1e-14)


def test_online_ewc_decays_the_old_fisher():
    state = EWCState({"W": (2,)}, EWC(xi=1.0, decay=0.5)).double()
    state.consolidate({"W": torch.zeros(2)}, {"W": torch.tensor([4.0, 0.0])})
    state.consolidate({"W": torch.ones(2)}, {"W": torch.tensor([0.0, 2.0])})
    assert torch.equal(state.fisher("W"), torch.tensor([2.0, 2.0], dtype=torch.float64))
    assert torch.equal(state.anchor("W"), torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("kwargs, match", [(dict(xi=-1.0), "xi"), (dict(decay=2.0), "decay"), (dict(samples=0), "samples"),
                                           (dict(fisher="diag"), "fisher")])
def test_ewc_config_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EWC(**kwargs)


@pytest.mark.parametrize("mode", ["empirical", "sampled"])
@pytest.mark.parametrize("activation", ["erf", "relu"])
def test_student_fisher_equals_a_per_sample_autograd_loop(mode, activation):
    d, N = 30, 40
    net = MultiHeadStudent(d=d, activation=activation, init_w=Gaussian(sigma=[0.5, 1.0]),
                           init_heads=Polar(r=1.0, theta=[0.2, 0.6])).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, d, generator=g, dtype=torch.float64)
    y = torch.randn(N, 2, generator=g, dtype=torch.float64)
    F = net.fisher_W(x, y, task=0, mode=mode)
    expect = torch.zeros_like(F)
    for s in range(N):
        for e in range(2):
            W = net.W[e].detach().clone().requires_grad_(True)
            out = (phi(activation, W @ x[s] / math.sqrt(d)) * net.h[e, 0]).sum()
            if mode == "empirical":
                loss = 0.5 * (out - y[s, e]) ** 2
                (gr,) = torch.autograd.grad(loss, W)
            else:  # expectation over y ~ N(out, 1): E[(out - y)^2] (d out/dW)^2 = (d out/dW)^2
                (gr,) = torch.autograd.grad(out, W)
            expect[e] += gr**2 / N
    assert torch.allclose(F, expect, atol=1e-12)


def _plain_ewc_sgd(W, h, X, Y, eta, xi, F, W_star, task):
    """Step-by-step SGD on L + xi/2 sum F (W - W*)^2, gradients by autograd."""
    W, h = W.clone(), h.clone()
    d = W.shape[-1]
    for s in range(X.shape[0]):
        Wg = W.clone().requires_grad_(True)
        hg = h[:, task].clone().requires_grad_(True)
        x = X[s, 0]
        out = (phi("erf", Wg @ x / math.sqrt(d)) * hg).sum(-1)  # (E,)
        loss = (0.5 * (out - Y[s, 0]) ** 2).sum() + 0.5 * xi * (F * (Wg - W_star) ** 2).sum()
        gW, gh = torch.autograd.grad(loss, [Wg, hg])
        # [S] Eqs. 6-7 in gradient form: W steps eta dL/dW, heads (eta / d) dL/dh
        W = W - eta * gW
        h[:, task] = h[:, task] - eta / d * gh
    return W, h


def test_penalised_sgd_equals_sgd_on_the_ewc_loss():
    d = 25
    dm = TeacherStudent(d=d, num_steps=200, steps_per_batch=100)
    net = MultiHeadStudent(d=d, eta=0.8, init_w=Gaussian(sigma=[0.5, 1.0]), init_heads=Polar(r=1.0, theta=[0.1, 0.5]),
                           ewc=EWC(xi=2.0)).double()
    g = torch.Generator().manual_seed(2)
    F = torch.rand(2, 2, d, generator=g, dtype=torch.float64)
    W_star = net.W.detach() + 0.3 * torch.randn(2, 2, d, generator=g, dtype=torch.float64)
    net.ewc.consolidate({"W": W_star}, {"W": F})
    W0, h0 = net.W.detach().clone(), net.h.detach().clone()
    batch = dm.chunk(0)
    y = batch["y"].double().expand(-1, -1, 2)
    net.sgd_steps(batch["x"].double(), y, task=1)
    W1, h1 = _plain_ewc_sgd(W0, h0, batch["x"].double(), y, 0.8, 2.0, F, W_star, task=1)
    assert torch.allclose(net.W, W1, atol=1e-12) and torch.allclose(net.h, h1, atol=1e-12)


def test_consolidation_happens_at_the_switch_with_the_end_of_task_weights():
    dm = TeacherStudent(d=40, num_steps=2000, switch_step=1000, steps_per_batch=250)
    net = MultiHeadStudent(d=40, ewc=EWC(xi=0.5, samples=500))
    seen = {}

    class Spy(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if pl_module.samples_seen == 1000:
                seen["W"] = pl_module.W.detach().clone()

    trainer(callbacks=[Spy()]).fit(net, dm)
    assert int(net.ewc.consolidations) == 1
    assert torch.equal(net.ewc.anchor("W"), seen["W"])
    x, y = dm.sample(0, 500)
    assert torch.allclose(net.ewc.fisher("W"), net_fisher_at(seen["W"], net, x, y), atol=1e-10)


def net_fisher_at(W, net, x, y):
    """The sampled Fisher of a copy of the student with first layer W (head 0 froze at the switch)."""
    copy = MultiHeadStudent(d=net.d)
    with torch.no_grad():
        copy.W.copy_(W)
        copy.h.copy_(net.h)
    return copy.fisher_W(x, y, task=0)


def test_xi_zero_changes_nothing_and_a_large_xi_holds_the_weights():
    def run(ewc):
        dm = TeacherStudent(d=50, num_steps=4000, switch_step=2000, steps_per_batch=500, gamma=0.0)
        net = MultiHeadStudent(d=50, init_heads=Polar(r=1.0, theta=math.pi / 4), ewc=ewc)
        trainer().fit(net, dm)
        return net, dm

    plain, _ = run(None)
    zero, _ = run(EWC(xi=0.0))
    assert torch.equal(plain.W, zero.W)
    held, dm = run(EWC(xi=50.0))  # F ~ (2/pi) h^2 / d ~ 0.013, so eta xi F < 2: stable SGD
    free_eps = plain.theory_error(dm.W_teachers, dm.teacher_heads)[0]
    held_eps = held.theory_error(dm.W_teachers, dm.teacher_heads)[0]
    assert held_eps[0] < 0.5 * free_eps[0]  # task 1 is protected ...
    assert held_eps[1] > free_eps[1]  # ... at the price of learning task 2 (non-specialised student)


def test_a_xi_too_large_for_sgd_is_a_clear_error():
    dm = TeacherStudent(d=50, num_steps=2000, switch_step=1000, steps_per_batch=500)
    net = MultiHeadStudent(d=50, ewc=EWC(xi=1e4))
    with pytest.raises(ValueError, match="ewc.xi = 10000 is too large"):
        trainer().fit(net, dm)


def test_resumed_run_keeps_the_penalty(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    def make():
        return (TeacherStudent(d=30, num_steps=2000, switch_step=1000, steps_per_batch=250),
                MultiHeadStudent(d=30, ewc=EWC(xi=5.0, samples=300)))

    dm, net = make()
    trainer().fit(net, dm)
    dm1, net1 = make()
    trainer(enable_checkpointing=True, callbacks=[ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)]).fit(net1, dm1)
    dm2, net2 = make()
    trainer().fit(net2, dm2, ckpt_path=tmp_path / "epoch=0-step=6.ckpt")  # 6 chunks of 250 SGD steps
    assert int(net2.ewc.consolidations) == 1  # restored from the checkpoint, not recomputed
    assert torch.equal(net2.W, net.W)


def test_per_member_xi_in_a_grid_and_with_teacher_sets():
    dm = TeacherStudent(d=40, num_steps=2000, switch_step=1000, steps_per_batch=500, gamma=[0.2, 0.8])
    # seed=[5]: every member draws its W from seed 5, so members are comparable across ensembles
    net = MultiHeadStudent(d=40, init_heads=Polar(r=1.0, theta=[0.0, 0.7]), ewc=EWC(xi=[0.0, 20.0], samples=300),
                           grid=True, seed=[5])
    assert net.base_labels == ["theta=0,xi=0", "theta=0,xi=20", "theta=0.7,xi=0", "theta=0.7,xi=20"]
    trainer().fit(net, dm)
    assert net.ensemble == 8 and net.labels[3] == "theta=0,xi=20,gamma=0.8"
    assert torch.equal(net.ewc.xi, torch.tensor([0.0, 0.0, 20.0, 20.0, 0.0, 0.0, 20.0, 20.0], dtype=torch.float64))
    # a member with xi = 0 trains as without EWC (same init, stream and teacher); after the switch
    # it runs step by step instead of blocked, so float32 rounding differs slightly
    dm2 = TeacherStudent(d=40, num_steps=2000, switch_step=1000, steps_per_batch=500, gamma=[0.2, 0.8])
    plain = MultiHeadStudent(d=40, init_heads=Polar(r=1.0, theta=[0.0, 0.7]), seed=[5])
    trainer().fit(plain, dm2)
    for e_ewc, e_plain in ((0, 0), (1, 1), (4, 2), (5, 3)):
        assert torch.allclose(net.W[e_ewc], plain.W[e_plain], atol=1e-6)
    # the penalised members moved less from their anchor during task 2
    moved = (net.W - net.ewc.anchor("W")).flatten(1).norm(dim=1)
    assert (moved[[2, 3, 6, 7]] < moved[[0, 1, 4, 5]]).all()
