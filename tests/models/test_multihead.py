"""The multi-head ensembles' public override points, members as data, and per-task test metrics.

Each override test defines a subclass here (outside the package) that changes what is trained and
checks the trained weights against a plain loop written in this file: per-sample online SGD of
[S] Eqs. 6-7 for the student, minibatch SGD by autograd for the classifier.
"""
from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from torch.nn import functional as F

from datamodules import TeacherStudent
from datamodules.mnist import MNISTContinual
from tests.conftest import REPO, run_cli
from tests.helpers_mnist import tiny_mnist
from zoo import MultiHeadStudent
from zoo.models.classifier import MultiHeadClassifier
from zoo.init import EntropyMix, Gaussian, Polar



def fit(net, dm, **kw) -> pl.Trainer:
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0, **kw)
    trainer.fit(net, dm)
    return trainer


# -- the student ---------------------------------------------------------------------------------------
class SiLUStudent(MultiHeadStudent):
    """phi(lam) = lam sigmoid(lam); phi' left to the autograd fallback."""

    def activation(self, lam):
        return lam * torch.sigmoid(lam)


class HuberStudent(MultiHeadStudent):
    """The Huber loss of width 0.05: its derivative clips Delta."""

    def loss_grad(self, delta):
        return delta.clamp(-0.05, 0.05)


class StraightThroughStudent(MultiHeadStudent):
    """phi' replaced by 1 (a straight-through gradient) for an erf forward pass."""

    def activation_grad(self, lam):
        return torch.ones_like(lam)


def plain_online_sgd(W, h, stream, d, eta, phi, phi_grad, loss_grad):
    """[S] Eqs. 6-7 sample by sample on head 0, in float64, written out for one member."""
    W, h = W.double().clone(), h.double().clone()
    for x, y in stream:
        lam = W @ x / math.sqrt(d)
        g = loss_grad(h @ phi(lam) - y)
        W, h = W - eta / math.sqrt(d) * g * torch.outer(h * phi_grad(lam), x), h - eta / d * g * phi(lam)
    return W, h


def silu_grad(lam):
    s = torch.sigmoid(lam)
    return s + lam * s * (1 - s)


def erf_phi(lam):
    return torch.erf(lam / math.sqrt(2))


@pytest.mark.parametrize("cls, phi, phi_grad, loss_grad", [
    (SiLUStudent, lambda z: z * torch.sigmoid(z), silu_grad, lambda r: r),
    (HuberStudent, erf_phi, lambda z: math.sqrt(2 / math.pi) * torch.exp(-z * z / 2), lambda r: r.clamp(-0.05, 0.05)),
    (StraightThroughStudent, erf_phi, torch.ones_like, lambda r: r),
])
def test_student_override_points_change_what_is_trained(cls, phi, phi_grad, loss_grad):
    d, eta = 30, 0.8
    dm = TeacherStudent(d=d, n_tasks=1, num_steps=120, steps_per_batch=60, seed=3)
    net = cls(d=d, n_tasks=1, eta=eta, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=0.3)).double()
    builtin = MultiHeadStudent(d=d, n_tasks=1, eta=eta, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=0.3))
    assert net.custom_update and not builtin.custom_update
    W0, h0 = net.W[0].detach().clone(), net.h[0, 0].detach().clone()
    fit(net, dm)
    fit(builtin, TeacherStudent(d=d, n_tasks=1, num_steps=120, steps_per_batch=60, seed=3))
    stream = [(x[0].double(), float(y[0, 0])) for k in range(len(dm.chunks)) for x, y in zip(dm.chunk(k)["x"], dm.chunk(k)["y"])]
    W1, h1 = plain_online_sgd(W0, h0, stream, d, eta, phi, phi_grad, loss_grad)
    assert net.samples_seen == 120
    assert torch.allclose(net.W[0], W1, atol=1e-10) and torch.allclose(net.h[0, 0], h1, atol=1e-10)
    assert not torch.allclose(builtin.W[0].double(), W1, atol=1e-3)  # the override is what changed the run


def test_student_member_params_are_data_and_name_the_members():
    net = MultiHeadStudent(d=20, init_heads=Polar(r=1.0, theta=[0.0, math.pi / 8]),
                           init_later_heads=Polar(r=0.5, theta=[0.1, 0.2]), seed=[4, 4])
    assert net.member_params == [{"theta": 0.0, "theta2": 0.1}, {"theta": math.pi / 8, "theta2": 0.2}]  # what varies
    assert net.labels == ["theta=0,theta2=0.1", "theta=0.3927,theta2=0.2"]
    net.replicate(2)  # two teacher sets (what setup does with TeacherStudent(gamma=[a, b]))
    net.sets = TeacherStudent(d=20, gamma=[0.0, 0.5]).set_params
    assert net.member_params[1] == {"theta": 0.0, "theta2": 0.1, "gamma": 0.5} and net.ensemble == 4
    assert net.labels[1] == "theta=0,theta2=0.1,gamma=0.5" and net.base_labels == ["theta=0,theta2=0.1", "theta=0.3927,theta2=0.2"]
    mixed = MultiHeadStudent(d=20, init_heads=EntropyMix(gamma=[0.0, 1.0], sigma=1.0))  # a head parameter named gamma
    mixed.replicate(2)
    mixed.sets = TeacherStudent(d=20, gamma=[0.0, 0.5]).set_params
    assert mixed.member_params[1] == {"init.gamma": 0.0, "gamma": 0.5}
    assert net.activation == "erf" and net.activation_name == "erf"  # the built-in reads as its name


# -- the classifier ------------------------------------------------------------------------------------
class SoftplusClassifier(MultiHeadClassifier):
    def activation(self, lam):
        return F.softplus(lam)


class DoubledLossClassifier(MultiHeadClassifier):
    """loss_grad 2 delta: the readout's derivative of twice the cross-entropy."""

    def loss_grad(self, delta):
        return 2 * delta


@pytest.mark.parametrize("cls, act, scale", [(SoftplusClassifier, F.softplus, 1.0),
                                              (DoubledLossClassifier, torch.sigmoid, 2.0)])
def test_classifier_override_points_change_what_is_trained(tmp_path, cls, act, scale):
    dm = MNISTContinual(str(tiny_mnist(tmp_path)), shared=2, batch_size=8, steps=[2, 2], seed=0)
    net = cls(hidden=6, lr=0.5, init_w=Gaussian(sigma=1.0))
    W, heads = net.W[0].detach().clone().requires_grad_(True), net.heads[0].detach().clone().requires_grad_(True)
    assert net.custom_update
    fit(net, dm)
    for step in range(4):  # plain minibatch SGD on scale * CE, by autograd
        b = dm.batch(step)
        logits = act(b["x"] @ W.T / math.sqrt(784)) @ heads[int(b["task"])].T
        gW, gH = torch.autograd.grad(scale * F.cross_entropy(logits, b["y"]), (W, heads))
        with torch.no_grad():
            W -= 0.5 * gW
            heads -= 0.5 * gH
    assert torch.allclose(net.W[0], W, atol=1e-5) and torch.allclose(net.heads[0], heads, atol=1e-5)


class SteepSigmoidGradClassifier(MultiHeadClassifier):
    """Trains as the sigmoid classifier, but hands EWC twice sigmoid's slope."""

    def activation_grad(self, lam):
        s = torch.sigmoid(lam)
        return 2 * s * (1 - s)


def test_classifier_activation_grad_is_the_slope_in_the_ewc_fisher(tmp_path):
    """fisher_W (what EWC anchors task 1 with) equals the mean squared per-sample gradient of the
    cross-entropy w.r.t. W computed by autograd, with phi' replaced by the override's slope."""
    dm = MNISTContinual(str(tiny_mnist(tmp_path)), shared=2, batch_size=8, steps=[2, 2], seed=0)
    dm.setup("fit")
    b = dm.batch(0)
    x, y = b["x"][:6], b["y"][:6]
    net = SteepSigmoidGradClassifier(hidden=5, init_w=Gaussian(sigma=1.0))
    W, heads = net.W[0].detach(), net.heads[0, 0].detach()
    squares = []
    for s in range(len(y)):  # per sample, by autograd through h = sigmoid(z) with slope 2 sigmoid'(z) at z
        Wr = W.clone().requires_grad_(True)
        z = Wr @ x[s].to(W.dtype) / math.sqrt(784)
        s0 = torch.sigmoid(z.detach())
        h = s0 + 2 * s0 * (1 - s0) * (z - z.detach())
        (g,) = torch.autograd.grad(F.cross_entropy((heads @ h).unsqueeze(0), y[s:s + 1]), Wr)
        squares.append(g**2)
    expected = torch.stack(squares).mean(0)
    got = net.fisher_W(x, y, task=0, mode="empirical")[0]
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-12)
    plain = MultiHeadClassifier(hidden=5, init_w=Gaussian(sigma=1.0)).fisher_W(x, y, task=0, mode="empirical")[0]
    assert torch.allclose(got, 4 * plain, rtol=1e-6)  # the slope enters squared: the override is what EWC uses


# -- lightning test: per-task metrics from a checkpoint -----------------------------------------------
ODE_SMOKE = ["--config", f"{REPO}/recipes/specialisation/ode_vs_simulation.yaml", "--data.init_args.num_steps=1000",
             "--data.init_args.switch_step=500", "--data.init_args.d=100", "--model.init_args.d=100",
             "--data.init_args.num_test=20000", "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false"]


def test_lightning_test_of_a_student_checkpoint_prints_per_task_errors(in_tmp, capsys):
    run_cli("fit", *ODE_SMOKE)
    ckpt = in_tmp / "lightning_logs/version_0/checkpoints/last.ckpt"
    capsys.readouterr()
    cli = run_cli("test", *ODE_SMOKE, "--ckpt_path", str(ckpt))
    printed = capsys.readouterr().out  # Lightning's table holds only what goes to the loggers
    assert "test/task1/error" in printed and "test/task2/error" in printed
    got = cli.trainer.callback_metrics
    net, dm = cli.model, cli.datamodule
    assert net.samples_seen == 1000
    x, y = dm.test_set()  # direct evaluation: 1/2 mean Delta^2 of the checkpoint's weights
    lam = x.double() @ net.W[0].double().T / 10
    direct = 0.5 * ((torch.erf(lam / math.sqrt(2)) @ net.h[0].double().T - y[:, :, 0].double()) ** 2).mean(0)
    theory = net.theory_error(dm.W_teachers, dm.teacher_heads)[0]  # [S] Eq. 9, no sampling noise
    for t in range(2):
        assert float(got[f"test/task{t + 1}/error"]) == pytest.approx(float(direct[t]), rel=1e-5)
        # Monte Carlo on 20,000 points: within 4 standard errors of the exact error
        se = float((0.5 * (torch.erf(lam / math.sqrt(2)) @ net.h[0].double().T - y[:, :, 0].double()) ** 2)[:, t].std()) / math.sqrt(20000)
        assert abs(float(got[f"test/task{t + 1}/error"]) - float(theory[t])) < 4 * se
    assert float(got["test/task1/error"]) > 10 * float(got["test/task2/error"])  # task 1 forgotten


def test_lightning_test_of_a_classifier_checkpoint_prints_per_task_accuracy(in_tmp):
    args = ["--config", f"{REPO}/recipes/specialisation/fig12_mnist_forgetting.yaml",
            f"--data.init_args.data_dir={tiny_mnist(in_tmp / 'data')}", "--data.init_args.steps=[3,3]",
            "--data.init_args.digit_draws=1", "--data.init_args.shared=[0,5]", "--model.init_args.hidden=8",
            "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false"]
    run_cli("fit", *args)
    cli = run_cli("test", *args, "--ckpt_path", str(in_tmp / "lightning_logs/version_0/checkpoints/last.ckpt"))
    got, net, dm = cli.trainer.callback_metrics, cli.model, cli.datamodule
    assert net.ensemble == 24 and len(net.labels) == 24  # 12 initialisations x 2 data sets
    for t in range(2):
        x, y = dm.test_set(t)  # (G, N, 784), (G, N)
        acc = []
        for e in range(net.ensemble):
            hidden = torch.erf(x[e % 2] @ net.W[e].T / math.sqrt(784) / math.sqrt(2))
            acc.append(((hidden @ net.heads[e, t].T).argmax(-1) == y[e % 2]).double().mean())
        assert float(got[f"test/task{t + 1}/accuracy"]) == pytest.approx(float(torch.stack(acc).mean()), abs=1e-6)
        assert float(got[f"test/task{t + 1}/error"]) == pytest.approx(1 - float(torch.stack(acc).mean()), abs=1e-6)
        for e in (0, 23):
            assert float(got[f"test/task{t + 1}/accuracy/{net.labels[e]}"]) == pytest.approx(float(acc[e]), abs=1e-6)
