"""DeepLinearNet: ensemble semantics, conservation laws, divergence, resume."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from datamodules import SemanticHierarchy, WhitenedRegression
from zoo import DeepLinearNet, DivergenceError
from zoo.init import Gaussian, LambdaBalanced



def trainer(max_steps: int, **kw) -> pl.Trainer:
    opts = dict(max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, accelerator="cpu", devices=1)
    opts.update(kw)
    return pl.Trainer(**opts)


def test_weights_forward_and_map():
    net = DeepLinearNet(dims=[5, 4, 3, 2], init=Gaussian(sigma=[0.1, 0.2]))
    Ws = net.weights()
    assert [tuple(w.shape) for w in Ws] == [(2, 4, 5), (2, 3, 4), (2, 2, 3)]
    x = torch.randn(7, 5)
    M = Ws[2] @ Ws[1] @ Ws[0]
    assert torch.allclose(net.network_map(), M)
    assert torch.allclose(net(x), torch.einsum("eoi,bi->ebo", M, x), atol=1e-6)
    assert net.labels == ["sigma=0.1", "sigma=0.2"]


def test_each_member_gets_exactly_its_own_gradient():
    dm = WhitenedRegression(n_in=4, n_out=3, num_samples=16)
    ens = DeepLinearNet(dims=[4, 3, 3], init=LambdaBalanced(lam=[-1.0, 0.0, 2.0], scale=0.3)).double()
    batch = (dm.X.double(), dm.Y.double())
    ens.member_loss(batch).sum().backward()
    for e in range(3):
        single = DeepLinearNet(dims=[4, 3, 3], init=LambdaBalanced(lam=0.0)).double()
        with torch.no_grad():
            for p, q in zip(single.W, ens.W):
                p.copy_(q[e : e + 1])
        single.member_loss(batch).sum().backward()
        for p, q in zip(single.W, ens.W):
            assert torch.allclose(p.grad[0], q.grad[e], atol=1e-12)


@pytest.mark.parametrize("dims, per_member_x", [([4, 3, 3], False), ([5, 4, 3, 2], False), ([3, 2], True)])
def test_closed_form_gradients_equal_autograd(dims, per_member_x):
    g = torch.Generator().manual_seed(0)
    net = DeepLinearNet(dims=dims, init=Gaussian(sigma=[0.3, 0.6, 0.9])).double()
    x = torch.randn(*((3,) if per_member_x else ()), 11, dims[0], generator=g, dtype=torch.float64)
    y = torch.randn(11, dims[-1], generator=g, dtype=torch.float64)
    losses, grads = net.losses_and_gradients((x, y))
    auto = net.member_loss((x, y))
    auto.sum().backward()
    assert torch.allclose(losses, auto.detach(), atol=1e-14)
    for W, G in zip(net.W, grads):
        assert G.shape == W.shape and torch.allclose(G, W.grad, atol=1e-14)


def test_a_subclass_with_its_own_loss_trains_on_it():
    """Overriding member_loss switches training to autograd: twice the loss is twice the lr."""
    class Doubled(DeepLinearNet):
        def member_loss(self, batch):
            return 2 * super().member_loss(batch)

    def run(cls, lr):
        dm = WhitenedRegression(n_in=4, n_out=4, num_samples=12, batches_per_epoch=5)
        return _train(cls(dims=[4, 4, 4], init=LambdaBalanced(lam=[0.5, 1.0]), lr=lr, steps_per_batch=3), dm, 30)

    a, b = run(Doubled, 0.05), run(DeepLinearNet, 0.1)
    for p, q in zip(a.W, b.W):
        assert torch.allclose(p, q, atol=1e-6)
    assert not torch.allclose(run(DeepLinearNet, 0.05).W[0], a.W[0], atol=1e-4)


def _train(net, dm, steps):
    trainer(steps).fit(net, datamodule=dm)
    return net


def test_balance_is_conserved_up_to_the_step_size():
    """GD breaks the conservation law at O(lr^2) per step, so O(lr) at a fixed time t = lr*steps."""
    devs = []
    for lr in (0.02, 0.01):
        dm = WhitenedRegression(n_in=5, n_out=5, num_samples=30, batches_per_epoch=50)
        # 10 GD steps per batch: the same trajectory (test_steps_per_batch_gives_the_same_trajectory), less overhead
        net = DeepLinearNet(dims=[5, 5, 5], init=LambdaBalanced(lam=[-1.0, 1.0], scale=0.5), lr=lr, steps_per_batch=10)
        _train(net, dm, int(4 / lr))
        devs.append(net.balance_deviation())
        assert torch.allclose(net.lam_estimate(), torch.tensor([-1.0, 1.0]), atol=20 * lr)
    assert devs[0].max() < 0.05
    ratio = devs[0] / devs[1]
    assert torch.all((ratio > 1.6) & (ratio < 2.5)), ratio  # first order in lr


@pytest.mark.slow
def test_task_aligned_modes_follow_theorem_5_1_to_order_lr():
    from zoo.theory.linear import aligned_singular_value

    errors = []
    for lr in (0.04, 0.02):
        dm = SemanticHierarchy(batches_per_epoch=20)
        # 10 GD steps per batch on the full-batch task: the same trajectory, a tenth of the loop's overhead
        net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-3.0, 0.0, 5.0], scale=1e-2), lr=lr,
                            task_aligned=True, steps_per_batch=10).double()
        steps = int(round(40 / lr))  # 40 time units of tau = 1/lr: past every mode's transition
        _train(net, dm, steps)
        m = dm.modes()
        a = net.mode_strengths(m.U, m.V)
        lam = torch.tensor([-3.0, 0.0, 5.0], dtype=torch.float64)[:, None]
        pred = aligned_singular_value(torch.tensor(float(steps)), lam=lam, s=m.s, tau=1 / (lr * m.c), a0=1e-2)
        assert torch.allclose(net.predicted_mode_strengths(torch.tensor([steps]), m)[:, 0], pred)
        errors.append((a - pred).abs().max().item())
    # Euler's global error is proportional to the step: halving lr halves it
    assert errors[1] < 0.6 * errors[0], errors
    assert errors[0] < 5 * 0.04 * 8, errors  # 5 x lr in units of the whitened time (c = 1/8)


def test_steps_per_batch_gives_the_same_trajectory():
    dm = WhitenedRegression(n_in=4, n_out=4, num_samples=12, batches_per_epoch=7)
    a = _train(DeepLinearNet(dims=[4, 4, 4], init=LambdaBalanced(lam=[0.5, 1.0]), lr=0.05), dm, 60)
    dm = WhitenedRegression(n_in=4, n_out=4, num_samples=12, batches_per_epoch=7)
    b = DeepLinearNet(dims=[4, 4, 4], init=LambdaBalanced(lam=[0.5, 1.0]), lr=0.05, steps_per_batch=5)
    t = trainer(60)
    t.fit(b, datamodule=dm)
    assert t.global_step == 60
    for p, q in zip(a.W, b.W):
        assert torch.allclose(p, q, atol=1e-6)


def test_divergence_stops_with_a_message_naming_step_and_member():
    dm = WhitenedRegression(n_in=4, n_out=4, num_samples=12)
    net = DeepLinearNet(dims=[4, 4, 4], init=LambdaBalanced(lam=[0.0, 30.0], scale=1.0), lr=0.2)
    with pytest.raises(DivergenceError, match=r"not finite at step \d+ for ensemble member\(s\) lam=30: .*lr=0.2"):
        _train(net, dm, 500)


def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(tmp_path):
    def fit(max_steps, ckpt=None, root=tmp_path):
        dm = SemanticHierarchy(batches_per_epoch=25)
        net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-1.0, 1.0], scale=0.01), lr=0.05, seed=3)
        from callbacks import SingularValues

        # a stateful callback rides along: its state must load from the checkpoint too
        t = trainer(max_steps, enable_checkpointing=True, default_root_dir=root, callbacks=[SingularValues(10, figure=False)])
        t.fit(net, datamodule=dm, ckpt_path=ckpt)
        return net, t

    whole, _ = fit(100, root=tmp_path / "a")
    _, half = fit(50, root=tmp_path / "b")
    ckpt = half.checkpoint_callback.best_model_path
    assert ckpt.endswith(".ckpt")
    resumed, t = fit(100, ckpt=ckpt, root=tmp_path / "c")
    assert t.global_step == 100
    for p, q in zip(whole.W, resumed.W):
        assert torch.equal(p, q)
    assert torch.equal(whole.balance0, resumed.balance0)
    # the checkpoint holds plain data (the init scheme as a spec), so it loads with weights_only
    loaded = DeepLinearNet.load_from_checkpoint(ckpt, weights_only=True)
    assert loaded.labels == ["lam=-1", "lam=1"] and loaded.init_scheme.spec() == whole.init_scheme.spec()


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(dims=[4]), "dims = \\[4\\]"),
        (dict(dims=[4, 4], lr=-1.0), "lr = -1.0"),
        (dict(dims=[4, 4, 4], init=LambdaBalanced(lam=[1.0, 2.0]), ensemble=3), "ensemble = 3"),
        (dict(dims=[4, 4, 4], init=Gaussian(), task_aligned=True), "task_aligned = true needs init lambda_balanced"),
        (dict(dims=[4, 9, 4], init=LambdaBalanced(lam=1.0)), "n_h <= min"),
        (dict(dims=[4, 4, 4], steps_per_batch=0), "steps_per_batch = 0"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        DeepLinearNet(**kwargs)
