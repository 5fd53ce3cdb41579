"""Override points of zoo.models.gdln (README table) and Lightning's own machinery: a subclass defined here
changes what is trained, checked against an autograd SGD loop written here; ``global_step``
counts GD updates; ``trainer.test`` / ``lightning test --ckpt_path`` report the MSE of every
network, checked against the outputs of the checkpoint's weights."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from datamodules.contexts import Contexts
from datamodules.xor import XorMargin
from zoo.models.gdln import GDLN, Comparison, ReLUNet
from zoo.init import Gaussian

POINT_WEIGHT = torch.linspace(0.5, 2.0, 24)  # a loss that weighs the data points unequally


def _trainer(steps: int, tmp_path) -> pl.Trainer:
    return pl.Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path)


def _weighted_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * (POINT_WEIGHT.to(out)[:, None] * (out - y).pow(2)).sum((-1, -2))


class WeightedGDLN(GDLN):
    def member_loss(self, batch):
        x, y = batch
        return _weighted_loss(self(x), y.to(self.W[0].dtype))


class WeightedReLUNet(ReLUNet):
    def member_loss(self, batch):
        x, y = batch
        return _weighted_loss(self(x), y.to(self.W[0].dtype))


class ShiftedGates(ReLUNet):
    """A unit is on where its pre-activation exceeds 0.05 instead of 0."""

    def gates(self, h):
        return (h > 0.05).to(h.dtype)


def _sgd(Ws0: list[torch.Tensor], forward, X, Y, lr: float, n: int, loss=_weighted_loss) -> list[torch.Tensor]:
    """``n`` steps of plain gradient descent by autograd on ``loss(forward(Ws, X), Y)`` summed over members."""
    Ws = [w.detach().clone().requires_grad_() for w in Ws0]
    for _ in range(n):
        grads = torch.autograd.grad(loss(forward(Ws, X), Y).sum(), Ws)
        with torch.no_grad():
            for w, g in zip(Ws, grads):
                w -= lr * g
    return [w.detach() for w in Ws]


def _relu_forward(threshold: float):
    def forward(Ws, X):
        pre = X @ Ws[0].transpose(-1, -2)
        return (pre * (pre > threshold).to(pre.dtype)) @ Ws[1].transpose(-1, -2)  # the gates: constants of a step
    return forward


@pytest.mark.parametrize("make", ["gdln", "relu"])
def test_member_loss_override_is_what_trains(make, tmp_path):
    dm = Contexts(3, "same")
    kw = dict(init=Gaussian(sigma=0.3), ensemble=2, lr=0.01, epochs_per_step=4, seed=1)
    m = WeightedGDLN(gating="reln", n_hidden=3, **kw) if make == "gdln" else WeightedReLUNet(hidden=[7], **kw)
    assert not m.hand_written()
    trainer = _trainer(10, tmp_path)
    trainer.fit(m, datamodule=dm)
    assert trainer.global_step == m.epochs_done == 10  # one optimizer step per GD update; the last chunk cut to 2
    X, Y = dm.X, dm.Y
    if make == "gdln":
        mask, gates = m.unit_inputs, m.unit_gates  # [H] Eq. 1 with the datamodule's gates
        forward = lambda Ws, X: ((X @ (Ws[0] * mask).transpose(-1, -2)) * gates) @ Ws[1].transpose(-1, -2)  # noqa: E731
    else:
        forward = _relu_forward(0.0)
    ref = _sgd([m.W0_init, m.W1_init], forward, X, Y, m.lr, 10)
    for w, r in zip(m.W, ref):
        assert torch.allclose(w, r, atol=1e-6, rtol=1e-5)
    # the zoo's own loss would have trained elsewhere: the override changed what was learnt
    plain = _sgd([m.W0_init, m.W1_init], forward, X, Y, m.lr, 10, loss=lambda o, y: 0.5 * (o - y).pow(2).sum((-1, -2)))
    assert not torch.allclose(m.W[1], plain[1], atol=1e-6)


def test_member_loss_override_needs_joint_training(tmp_path):
    with pytest.raises(ValueError, match="training = 'two_loss'"):
        _trainer(2, tmp_path).fit(WeightedGDLN(n_hidden=2, training="two_loss", epochs_per_step=1), datamodule=Contexts())


def test_gates_override_changes_the_gating(tmp_path):
    dm = Contexts(3, "different")
    m = ShiftedGates(hidden=[9], init=Gaussian(sigma=0.3), ensemble=2, lr=0.01, epochs_per_step=5, seed=2)
    assert m.hand_written()  # the hand-written gradients, through the generic gated backward
    _trainer(15, tmp_path).fit(m, datamodule=dm)
    ref = _sgd([m.W0_init, m.W1_init], _relu_forward(0.05), dm.X, dm.Y, m.lr, 15,
               loss=lambda o, y: 0.5 * (o - y).pow(2).sum((-1, -2)))
    for w, r in zip(m.W, ref):
        assert torch.allclose(w, r, atol=1e-6, rtol=1e-5)
    pre = dm.X @ m.W[0].detach().transpose(-1, -2)
    assert torch.equal(m.activation_patterns(dm.X)[0], pre > 0.05)
    assert bool(((pre > 0) & (pre <= 0.05)).any())  # points where a ReLU unit would be on but this one is off


def test_test_step_reports_each_networks_mse(tmp_path):
    dm = XorMargin(Delta=[0.3, 1.2])
    kw = dict(init=Gaussian(sigma=0.1), ensemble=2, lr=0.1, reduction="mean")
    module = Comparison([ReLUNet(hidden=[8], **kw), GDLN(gating="xor", n_hidden=4, **kw)], names=["relu", "xor"],
                        epochs_per_step=10)
    trainer = _trainer(30, tmp_path)
    trainer.fit(module, datamodule=dm)
    assert not any(k.startswith("val/") for k in trainer.callback_metrics)  # no validation inside fit
    metrics = trainer.test(module, datamodule=dm, verbose=False)[0]
    val = trainer.validate(module, datamodule=dm, verbose=False)[0]
    assert val == {k.replace("test/", "val/"): v for k, v in metrics.items()}  # the same data set
    Y = dm.Y.double()
    for name, m in zip(module.names, module.models):
        out = m(dm.X).detach().double()  # (E, 4, 1): member e on margin Delta[e]
        assert metrics[f"test/mse/{name}"] == pytest.approx(float((out - Y).pow(2).mean()), rel=1e-5)
    assert [m.labels for m in module.models] == [["Delta=0.3,draw=0", "Delta=1.2,draw=1"]] * 2


@pytest.mark.slow  # two CLI runs (~10-20 s)
def test_lightning_test_of_the_xor_recipe_checkpoint(in_tmp):
    """``lightning test --config recipes/haste_slowly/fig2_xor_margin.yaml --ckpt_path <last.ckpt>``
    prints each network's test MSE: here in-process on a short run, against the checkpoint's outputs."""
    from tests.conftest import REPO, run_cli

    recipe = str(REPO / "recipes/haste_slowly/fig2_xor_margin.yaml")
    short = ["--trainer.max_steps=20", "--model.init_args.epochs_per_step=10", "--trainer.enable_progress_bar=false",
             "--trainer.callbacks=[]"]
    run_cli("fit", "--config", recipe, *short)
    ckpt = in_tmp / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 20
    cli = run_cli("test", "--config", recipe, *short, "--ckpt_path", str(ckpt))
    loaded = Comparison.load_from_checkpoint(ckpt)
    dm = XorMargin(Delta=cli.datamodule.Delta)
    for name, m in zip(loaded.names, loaded.models):
        expected = float((m(dm.X).detach().double() - dm.Y.double()).pow(2).mean())
        assert float(cli.trainer.callback_metrics[f"test/mse/{name}"]) == pytest.approx(expected, rel=1e-5)
