"""MultiHeadClassifier: per-member losses and gradients, data sets, the Fisher, EWC in the loss."""
from __future__ import annotations

import math

import pytest
import torch

from zoo.models.classifier import MultiHeadClassifier
from zoo.training.ewc import EWC
from zoo.init import EntropyMix, Gaussian



def small(**kw) -> MultiHeadClassifier:
    opts = dict(n_in=12, hidden=7, n_classes=3, init_w=Gaussian(sigma=1.0),
                init_heads=EntropyMix(gamma=[0.0, 1.0], sigma=0.5))
    opts.update(kw)
    return MultiHeadClassifier(**opts).double()


def test_each_member_gets_its_own_gradient_and_only_the_active_head_learns():
    net = small()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(9, 12, generator=g, dtype=torch.float64), torch.randint(0, 3, (9,), generator=g)
    net.member_loss(x, y, task=1).sum().backward()
    assert float(net.heads.grad[:, 0].abs().max()) == 0.0
    for e in range(2):
        W = net.W[e].detach().clone().requires_grad_(True)
        H = net.heads[e, 1].detach().clone().requires_grad_(True)
        logits = torch.sigmoid(x @ W.T / math.sqrt(12)) @ H.T
        torch.nn.functional.cross_entropy(logits, y).backward()
        assert torch.allclose(net.W.grad[e], W.grad, atol=1e-12)
        assert torch.allclose(net.heads.grad[e, 1], H.grad, atol=1e-12)


@pytest.mark.parametrize("mode", ["empirical", "sampled"])
def test_fisher_equals_a_per_sample_autograd_loop(mode):
    net = small(activation="tanh")
    g = torch.Generator().manual_seed(1)
    N = 11
    x, y = torch.randn(N, 12, generator=g, dtype=torch.float64), torch.randint(0, 3, (N,), generator=g)
    F = net.fisher_W(x, y, task=0, mode=mode)
    expect = torch.zeros_like(F)
    for e in range(2):
        for s in range(N):
            W = net.W[e].detach().clone().requires_grad_(True)
            logits = torch.tanh(W @ x[s] / math.sqrt(12)) @ net.heads[e, 0].detach().T
            logp = torch.log_softmax(logits, -1)
            if mode == "empirical":
                (gr,) = torch.autograd.grad(-logp[y[s]], W)
                expect[e] += gr**2 / N
            else:  # expectation over c ~ softmax(logits)
                p = logp.exp().detach()
                for c in range(3):
                    (gr,) = torch.autograd.grad(-logp[c], W, retain_graph=True)
                    expect[e] += p[c] * gr**2 / N
    assert torch.allclose(F, expect, atol=1e-12)


def test_fisher_agrees_with_the_generic_fisher_diagonal():
    """The closed form of ``fisher_W`` and ``zoo.metrics.fisher_diagonal`` (vmap of per-sample
    gradients of any module) are independent computations of the same empirical Fisher."""
    from zoo.metrics import fisher_diagonal

    net = small(init_heads=EntropyMix(gamma=0.3, sigma=0.5))

    class Head0(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x, 0)[0]  # member 0's logits on head 0

    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(13, 12, generator=g, dtype=torch.float64), torch.randint(0, 3, (13,), generator=g)
    F = fisher_diagonal(Head0(net), lambda f, t: torch.nn.functional.cross_entropy(f, t), (x, y),
                        include="net.W", method="vmap")
    assert torch.allclose(F["net.W"], net.fisher_W(x, y, task=0, mode="empirical"), atol=1e-12)


def test_data_sets_route_each_member_to_its_own_inputs():
    net = small()
    net.G = 2  # as setup does for a datamodule with two data sets
    with torch.no_grad():
        net.W = torch.nn.Parameter(net.W.detach().repeat_interleave(2, 0))
        net.heads = torch.nn.Parameter(net.heads.detach().repeat_interleave(2, 0))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 12, generator=g, dtype=torch.float64)
    out = net(x, task=0)
    for e in range(4):
        ref = torch.sigmoid(x[e % 2] @ net.W[e].T / math.sqrt(12)) @ net.heads[e, 0].T
        assert torch.allclose(out[e], ref, atol=1e-12)


def test_ewc_penalty_enters_the_loss_gradient():
    net = small(ewc=EWC(xi=0.7))
    g = torch.Generator().manual_seed(3)
    F = torch.rand(net.W.shape, generator=g, dtype=torch.float64)
    anchor = net.W.detach() + 0.2
    net.ewc.consolidate({"W": anchor}, {"W": F})
    pen = net.ewc.member_penalty({"W": net.W}).sum()
    (grad,) = torch.autograd.grad(pen, net.W)
    assert torch.allclose(grad, 0.7 * F * (net.W.detach() - anchor), atol=1e-12)


@pytest.mark.parametrize("kwargs, match", [(dict(hidden=0), "hidden"), (dict(activation="gelu"), "activation"),
                                           (dict(lr=0.0), "lr"), (dict(ensemble=0), "ensemble = 0"),
                                           (dict(seed=[0, 1, 2], ensemble=2), "ensemble sizes disagree")])
def test_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadClassifier(**kwargs)


def test_ewc_too_stiff_for_sgd_stops_at_the_switch_with_a_message(tmp_path):
    """lr * xi * max F >= 2 makes SGD on the penalty oscillate and grow: an error, not a NaN run."""
    from datamodules.mnist import MNISTContinual
    from helpers_fit import trainer as fit_trainer
    from tests.helpers_mnist import tiny_mnist

    dm = MNISTContinual(data_dir=str(tiny_mnist(tmp_path / "data")), shared=2, batch_size=10, steps=[3, 3])
    net = MultiHeadClassifier(hidden=8, lr=1.0, ewc=EWC(xi=[0.0, 1e12], samples=20))
    with pytest.raises(ValueError, match=r"ewc.xi = 1e\+12 is too large for SGD \(xi=1e\+12\): lr \* xi \* max\(F\)"):
        fit_trainer(tmp_path).fit(net, dm)
    assert net.global_step == 3  # task 1 trained, nothing of task 2
