"""SparseAutoencoder: per-member gradients against autograd on one member, the imbalance init,
the grid, divergence and bad input."""
from __future__ import annotations

import pytest
import torch

from zoo.init import Imbalance
from zoo.models.sae import SparseAutoencoder


def test_each_member_gets_the_gradient_of_its_own_loss():
    net = SparseAutoencoder(d=5, n=7, l1=[0.0, 0.3], init=Imbalance(v=[0.5, 2.0], sigma=0.5)).double()
    with torch.no_grad():
        net.b_enc.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    net.member_loss(x)["loss"].sum().backward()
    for e in range(2):
        We, Wd = net.W_enc[e].detach().clone().requires_grad_(), net.W_dec[e].detach().clone().requires_grad_()
        be = net.b_enc[e, 0].detach().clone().requires_grad_()
        h = torch.relu(x @ We.T + be)
        loss = 0.5 * ((h @ Wd.T - x) ** 2).sum(1).mean() + [0.0, 0.3][e] * h.abs().sum(1).mean()
        loss.backward()
        assert torch.allclose(net.W_enc.grad[e], We.grad, atol=1e-12)
        assert torch.allclose(net.W_dec.grad[e], Wd.grad, atol=1e-12)
        assert torch.allclose(net.b_enc.grad[e, 0], be.grad, atol=1e-12)


def test_imbalance_init_scales_encoder_down_and_decoder_up():
    net = SparseAutoencoder(d=64, n=512, init=Imbalance(v=[0.5, 4.0], sigma=1e-3))
    # 32,768 draws per matrix: the sample std is within 2% of its value (5 standard errors)
    for e, v in enumerate((0.5, 4.0)):
        assert float(net.W_enc[e].detach().std()) == pytest.approx(1e-3 / v, rel=0.02)
        assert float(net.W_dec[e].detach().std()) == pytest.approx(1e-3 * v, rel=0.02)
    assert float(net.b_enc.abs().max()) == 0.0


def test_grid_is_the_product_of_v_and_l1():
    net = SparseAutoencoder(d=3, n=4, l1=[0.0, 0.1], init=Imbalance(v=[0.5, 1.0, 2.0]), grid=True)
    assert net.ensemble == 6
    assert net.labels == ["v=0.5,l1=0", "v=0.5,l1=0.1", "v=1,l1=0", "v=1,l1=0.1", "v=2,l1=0", "v=2,l1=0.1"]
    with pytest.raises(ValueError, match="2 values of l1 but the init describes 3 members"):
        SparseAutoencoder(d=3, n=4, l1=[0.0, 0.1], init=Imbalance(v=[0.5, 1.0, 2.0]))


def test_divergence_stops_with_a_message(tmp_path):
    from helpers_fit import trainer as fit_trainer
    from zoo.training.divergence import DivergenceError

    x = 100 * torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4)  # 16 steps
    net = SparseAutoencoder(d=4, n=8, init=Imbalance(v=1.0, sigma=1.0), lr=10.0)
    with pytest.raises(DivergenceError, match="lr = 10.0 is probably too large"):
        fit_trainer(tmp_path).fit(net, loader)


def test_diverged_member_drops_out_and_the_others_train_on(tmp_path):
    """on_divergence='drop': the member at a huge v diverges, the others finish exactly as they
    would beside a member that never diverges (members share only the batches)."""
    from helpers_fit import trainer as fit_trainer
    from zoo.training.divergence import DivergenceError

    x = 3 * torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4)  # 16 steps
    kw = dict(d=4, n=8, lr=0.01, seed=3)
    net = SparseAutoencoder(init=Imbalance(v=[1.0, 300.0, 2.0], sigma=0.3), on_divergence="drop", **kw)
    with pytest.warns(RuntimeWarning, match=r"v=300 diverged at step \d+ .* dropped"):
        fit_trainer(tmp_path).fit(net, loader)
    assert net.alive.tolist() == [True, False, True]
    calm = SparseAutoencoder(init=Imbalance(v=[1.0, 1.0, 2.0], sigma=0.3), **kw)
    fit_trainer(tmp_path).fit(calm, loader)
    for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
        a, b = getattr(net, name).detach(), getattr(calm, name).detach()
        assert torch.equal(a[[0, 2]], b[[0, 2]]), name
    # with 'stop' (the default) the same sweep ends at the divergence
    net = SparseAutoencoder(init=Imbalance(v=[1.0, 300.0, 2.0], sigma=0.3), **kw)
    with pytest.raises(DivergenceError, match="v=300"):
        fit_trainer(tmp_path).fit(net, loader)


@pytest.mark.parametrize("kwargs, match", [
    (dict(on_divergence="skip"), "on_divergence = 'skip'; allowed"),
    (dict(d=0), "d = 0; allowed: a positive integer"),
    (dict(n=2.5), "n = 2.5"),
    (dict(l1=-1.0), "l1 = -1.0; allowed"),
    (dict(lr=0.0), "lr = 0.0; allowed"),
    (dict(optimizer="rmsprop"), "optimizer = 'rmsprop'"),
])
def test_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SparseAutoencoder(**kwargs)


class SquaredPenaltySAE(SparseAutoencoder):
    """A user's variant: the L1 weight applies to the squared activity (an L2 penalty on h)."""

    def member_loss(self, x):
        h = self.hidden(x)
        rec = 0.5 * (self.decode(h) - x).pow(2).sum(-1).mean(-1)
        act = h.pow(2).sum(-1).mean(-1)
        return {"reconstruction": rec, "l1": act, "loss": rec + self.l1 * act}


def test_an_overridden_member_loss_is_what_sgd_minimises(tmp_path):
    from helpers_fit import trainer as fit_trainer

    x = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))
    kw = dict(d=3, n=5, l1=[0.0, 0.5], init=Imbalance(v=[0.5, 2.0], sigma=0.7), grid=True, lr=0.2, seed=4)
    net = SquaredPenaltySAE(**kw)
    W_enc, W_dec = net.W_enc.detach().clone(), net.W_dec.detach().clone()
    b_enc, b_dec = net.b_enc.detach().clone(), net.b_dec.detach().clone()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4)  # 3 steps
    fit_trainer(tmp_path, logger=True, max_steps=3).fit(net, loader)
    # independent: three plain SGD steps on each member's L2-penalised loss, written out here
    for e, lam in enumerate([0.0, 0.5, 0.0, 0.5]):
        p = [t[e].clone().requires_grad_() for t in (W_enc, W_dec, b_enc, b_dec)]
        for xb in x.split(4):
            h = torch.relu(xb @ p[0].T + p[2])
            loss = 0.5 * ((h @ p[1].T + p[3] - xb) ** 2).sum(1).mean() + lam * (h ** 2).sum(1).mean()
            grads = torch.autograd.grad(loss, p)
            p = [(t - 0.2 * g).detach().requires_grad_() for t, g in zip(p, grads)]
        for got, want in zip((net.W_enc, net.W_dec, net.b_enc, net.b_dec), p):
            torch.testing.assert_close(got[e].detach(), want.detach(), atol=1e-6, rtol=1e-5)
    # the plain SAE (L1) trains to other weights: the override is what was trained
    plain = SparseAutoencoder(**kw)
    fit_trainer(tmp_path / "plain", logger=True, max_steps=3).fit(plain, loader)
    assert not torch.allclose(plain.W_enc[1], net.W_enc[1], atol=1e-5)
