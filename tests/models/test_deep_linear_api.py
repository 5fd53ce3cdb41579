"""DeepLinearNet as a library: members are data, the loss is an override point, Lightning counts
the steps, and ``zoo fit`` / ``zoo test`` evaluate a trained network."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from tests.conftest import run_cli

from datamodules import WhitenedRegression
from zoo import DeepLinearNet
from zoo.init import Gaussian, LambdaBalanced, PathwayGrid



def _fit(net, dm, steps):
    t = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0)
    t.fit(net, datamodule=dm)
    return t


def test_member_params_hold_each_members_numbers_and_labels_name_what_varies():
    net = DeepLinearNet(dims=[4, 4, 4], init=LambdaBalanced(lam=[-0.5, 2.0], scale=0.1), seed=7)
    assert net.member_params == [{"lam": -0.5, "scale": 0.1, "seed": 7}, {"lam": 2.0, "scale": 0.1, "seed": 7}]
    assert net.labels == ["lam=-0.5", "lam=2"]
    grid = DeepLinearNet(dims=[1, 2, 1], init=PathwayGrid(lam1=[0.0, 1.0], lam2=[0.25, 0.5, 0.75]))
    # member i * len(lam2) + j is (lam1[i], lam2[j]); the grid's own a0 is the same for all
    assert [(p["lam1"], p["lam2"]) for p in grid.member_params] == [(a, b) for a in (0.0, 1.0) for b in (0.25, 0.5, 0.75)]
    assert grid.labels[4] == "lam1=1,lam2=0.5"
    assert DeepLinearNet(dims=[3, 3], init=Gaussian(sigma=0.1), ensemble=2).labels == ["member0", "member1"]


def test_a_subclass_loss_is_what_trains_checked_against_a_plain_gradient_descent_loop():
    """Override point ``member_loss``: a quartic loss trains by autograd; the same steps written
    out by hand on each member's weights alone give the same weights."""
    class Quartic(DeepLinearNet):
        def member_loss(self, batch):
            x, y = batch
            return 0.25 * (self(x) - y.to(self.W[0].dtype)).pow(4).sum(-1).mean(-1)

    dm = WhitenedRegression(n_in=3, n_out=2, num_samples=10, batches_per_epoch=2)
    lr, steps = 0.1, 6
    net = Quartic(dims=[3, 4, 2], init=Gaussian(sigma=[0.3, 0.6]), lr=lr, steps_per_batch=3).double()
    W0 = [W.detach().clone() for W in net.W]
    _fit(net, dm, steps)
    X, Y = dm.X.double(), dm.Y.double()
    for e in range(2):
        W1, W2 = (W0[0][e].clone().requires_grad_(), W0[1][e].clone().requires_grad_())
        for _ in range(steps):
            loss = 0.25 * ((X @ W1.T @ W2.T - Y) ** 4).sum(-1).mean()
            g1, g2 = torch.autograd.grad(loss, (W1, W2))
            with torch.no_grad():
                W1 -= lr * g1
                W2 -= lr * g2
        assert torch.allclose(net.W[0][e], W1, atol=1e-12) and torch.allclose(net.W[1][e], W2, atol=1e-12)
    # and it is not the zoo's own squared loss
    plain = DeepLinearNet(dims=[3, 4, 2], init=Gaussian(sigma=[0.3, 0.6]), lr=lr, steps_per_batch=3).double()
    _fit(plain, WhitenedRegression(n_in=3, n_out=2, num_samples=10, batches_per_epoch=2), steps)
    assert not torch.allclose(plain.W[0], net.W[0], atol=1e-4)


def test_global_step_counts_optimizer_updates_and_samples_seen_the_samples_they_used():
    dm = WhitenedRegression(n_in=3, n_out=3, num_samples=12, batches_per_epoch=4)
    net = DeepLinearNet(dims=[3, 3, 3], init=LambdaBalanced(lam=0.0, scale=0.1), lr=0.05, steps_per_batch=5)
    t = _fit(net, dm, 40)
    # 40 updates = 8 batches of 5 GD steps on all 12 samples; 4 batches per epoch
    assert (t.global_step, net.samples_seen, net.epochs_done) == (40, 8 * 5 * 12, 2)


def test_fit_then_test_through_the_cli_reports_each_members_mse(in_tmp, capsys):
    config = in_tmp / "tiny.yaml"
    config.write_text("""
model:
  class_path: DeepLinearNet
  init_args: {dims: [4, 2, 2], init: {class_path: LambdaBalanced, init_args: {lam: [0.0, 1.0], scale: 0.3}}, lr: 0.1,
              steps_per_batch: 5}
data:
  class_path: WhitenedRegression
  init_args: {n_in: 4, n_out: 2, num_samples: 16, batches_per_epoch: 4}
trainer: {max_steps: 40, enable_progress_bar: false, enable_model_summary: false, num_sanity_val_steps: 0}
""")
    run_cli("fit", "--config", str(config))
    ckpt = in_tmp / "lightning_logs/version_0/checkpoints/last.ckpt"
    capsys.readouterr()
    cli = run_cli("test", "--config", str(config), "--ckpt_path", str(ckpt))
    printed = capsys.readouterr().out
    # the mean squared error per entry of each member's map on the task's data, from the saved weights
    W = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    dm = WhitenedRegression(n_in=4, n_out=2, num_samples=16)
    expected = ((dm.X @ W["W.0"].transpose(1, 2) @ W["W.1"].transpose(1, 2) - dm.Y) ** 2).mean(dim=(1, 2))
    metrics = cli.trainer.callback_metrics
    assert float(metrics["test/mse/lam=0"]) == pytest.approx(float(expected[0]), rel=1e-5)
    assert float(metrics["test/mse/lam=1"]) == pytest.approx(float(expected[1]), rel=1e-5)
    assert float(metrics["test/mse"]) == pytest.approx(float(expected.mean()), rel=1e-5)
    assert "test/mse/lam=0" in printed and "test/mse/lam=1" in printed
    assert 0 < float(expected.max()) < float(((dm.Y) ** 2).mean())  # trained: better than predicting 0
