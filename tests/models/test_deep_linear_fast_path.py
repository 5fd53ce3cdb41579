"""DeepLinearNet's training loop (closed-form gradients, several steps per ``training_step``, the
loss read once per batch) against a hand-written loop of plain gradient descent: the same bits."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from datamodules import SemanticHierarchy, WhitenedRegression
from zoo import DeepLinearNet, DivergenceError
from zoo.kernels.gdln import GradientDescent
from zoo.init import Gaussian, LambdaBalanced



def fit(net: DeepLinearNet, dm, max_steps: int) -> pl.Trainer:
    t = pl.Trainer(max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, accelerator="cpu", devices=1)
    t.fit(net, datamodule=dm)
    return t


def hand_gd(Ws: list[torch.Tensor], X: torch.Tensor, Y: torch.Tensor, lr: float, steps: int):
    """Plain GD on ``1/(2N) sum |W_L...W_1 x - y|^2`` written out for two and three layers ([L] Eq. 2),
    every product in the order the module forms it; the final weights and each step's losses (E,)."""
    x = X.expand(Ws[0].shape[0], *X.shape)
    losses = []
    for _ in range(steps):
        if len(Ws) == 2:
            W1, W2 = Ws
            D = x @ (W2 @ W1).transpose(-1, -2) - Y
            G = D.transpose(-1, -2) @ x / D.shape[-2]
            grads = [W2.transpose(-1, -2) @ G, G @ W1.transpose(-1, -2)]
        else:
            W1, W2, W3 = Ws
            W21 = W2 @ W1
            D = x @ (W3 @ W21).transpose(-1, -2) - Y
            G = D.transpose(-1, -2) @ x / D.shape[-2]
            grads = [(W3 @ W2).transpose(-1, -2) @ G, W3.transpose(-1, -2) @ G @ W1.transpose(-1, -2),
                     G @ W21.transpose(-1, -2)]
        losses.append(0.5 * D.pow(2).flatten(-2).sum(-1) / D.shape[-2])  # the module's order of the sums
        Ws = [W.add(g, alpha=-lr) for W, g in zip(Ws, grads)]  # torch.optim.SGD's update
    return Ws, losses


@pytest.mark.parametrize("steps_per_batch", [1, 7])
def test_two_layers_train_to_the_bits_of_plain_gd(steps_per_batch):
    dm = SemanticHierarchy(batches_per_epoch=2)  # epochs of 2 batches: the loop crosses epoch ends
    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-2.0, 0.0, 2.0], scale=0.1), lr=0.05,
                        steps_per_batch=steps_per_batch)
    start = [W.detach().clone() for W in net.W]
    t = fit(net, dm, 21)
    assert t.global_step == 21  # one optimizer step per gradient step
    Ws, losses = hand_gd(start, dm.X, dm.Y, 0.05, 21)
    assert all(torch.equal(W, V) for W, V in zip(net.W, Ws))
    # the loss logged for the last batch is the one of the weights at its first step
    assert torch.equal(t.callback_metrics["loss"], losses[21 - steps_per_batch].mean())


def test_three_layers_train_to_the_bits_of_plain_gd():
    dm = WhitenedRegression(n_in=4, n_out=4, num_samples=12, batches_per_epoch=3)
    net = DeepLinearNet(dims=[4, 3, 2, 4], init=Gaussian(sigma=[0.3, 0.5]), lr=0.1, steps_per_batch=4)
    start = [W.detach().clone() for W in net.W]
    fit(net, dm, 24)
    Ws, _ = hand_gd(start, dm.X, dm.Y, 0.1, 24)
    assert all(torch.equal(W, V) for W, V in zip(net.W, Ws))


@pytest.mark.parametrize("steps_per_batch", [1, 10])
def test_a_divergence_inside_a_batch_names_its_first_step_and_member(steps_per_batch):
    """The loss is read at the first and the last step of a batch only; the step named is still the
    first non-finite one of plain GD (the module replays the batch to find it)."""
    dm = WhitenedRegression(n_in=4, n_out=4, num_samples=12)
    init = LambdaBalanced(lam=[0.0, 30.0], scale=1.0)
    net = DeepLinearNet(dims=[4, 4, 4], init=init, lr=0.2, steps_per_batch=steps_per_batch)
    _, losses = hand_gd([W.detach().clone() for W in net.W], dm.X, dm.Y, 0.2, 200)
    bad = [s for s, l in enumerate(losses) if not torch.isfinite(l).all()]
    assert bad and torch.isfinite(torch.stack(losses)[:, 0]).all()  # member lam=30 diverges, lam=0 does not
    # the step where a batch starts must differ from the first bad one for the replay to be tested
    assert steps_per_batch == 1 or bad[0] % steps_per_batch
    with pytest.raises(DivergenceError, match=rf"not finite at step {bad[0]} for ensemble member\(s\) lam=30: "):
        fit(net, dm, 200)


class EveryUpdate(pl.Callback):
    """A hook Lightning calls before every optimizer update: with it, each update goes through
    ``LightningOptimizer.step`` (zoo.training.steps), the path of a run without the direct updates."""

    def __init__(self) -> None:
        self.calls = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.calls += 1


class TorchSGD(DeepLinearNet):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@pytest.mark.parametrize("steps_per_batch", [1, 4])
def test_direct_updates_give_the_bits_and_steps_of_updates_through_lightning(steps_per_batch):
    """The default run (the optimizer's own step, counted by zoo.training.steps) against every update through
    Lightning's step (a hook that needs each one), and against torch's SGD as the optimizer."""
    def run(cls, callbacks=()):
        net = cls(dims=[8, 8, 8], init=LambdaBalanced(lam=[-2.0, 2.0], scale=0.1), lr=0.05, steps_per_batch=steps_per_batch)
        t = pl.Trainer(max_steps=12, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False, accelerator="cpu", devices=1, callbacks=list(callbacks))
        t.fit(net, datamodule=SemanticHierarchy(batches_per_epoch=2))
        return t, net
    hook = EveryUpdate()
    direct, via_lightning, sgd = run(DeepLinearNet), run(DeepLinearNet, [hook]), run(TorchSGD)
    assert hook.calls == 12  # every update went through Lightning
    for t, net in (direct, via_lightning, sgd):
        # the same count of updates, and of batches and epochs, in the state a checkpoint saves
        assert t.global_step == 12 and t.fit_loop.state_dict() == direct[0].fit_loop.state_dict()
        assert all(torch.equal(W, V) for W, V in zip(net.W, direct[1].W))
        assert torch.equal(t.callback_metrics["loss"], direct[0].callback_metrics["loss"])


class BatchEndGradients(pl.Callback):
    """The layers' ``.grad`` at the end of each batch."""

    def __init__(self) -> None:
        self.seen: list[list[torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append([W.grad.clone() for W in pl_module.W])


class LayerRates(DeepLinearNet):
    """A learning rate per layer, in two parameter groups listed output layer first."""

    def configure_optimizers(self):
        return GradientDescent([{"params": [self.W[1]], "lr": 0.03}, {"params": [self.W[0]]}], lr=self.lr)


def test_layer_rates_of_gradient_descent_groups_in_one_loop_are_the_optimizers_steps():
    """The steps in one loop read each layer's rate from the optimizer's groups: the bits of every
    update through the optimizer's own step (a hook makes each one go through Lightning)."""
    def run(callbacks=()):
        grads = BatchEndGradients()
        callbacks = [*callbacks, grads]
        net = LayerRates(dims=[8, 8, 8], init=LambdaBalanced(lam=[-2.0, 2.0], scale=0.1), lr=0.05, steps_per_batch=5)
        t = pl.Trainer(max_steps=15, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False, accelerator="cpu", devices=1, callbacks=list(callbacks))
        t.fit(net, datamodule=SemanticHierarchy(batches_per_epoch=2))
        return net, grads.seen
    hook = EveryUpdate()
    (one_loop, grads), (each_step, step_grads) = run(), run([hook])
    assert hook.calls == 15
    assert all(torch.equal(W, V) for W, V in zip(one_loop.W, each_step.W))
    # what a callback sees in .grad after a batch: its last update's gradients, as the optimizer left them
    assert len(grads) == 3 and all(torch.equal(a, b) for g, h in zip(grads, step_grads) for a, b in zip(g, h))
    # and the rates differ per layer: a single rate would give other weights
    single = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-2.0, 2.0], scale=0.1), lr=0.05, steps_per_batch=5)
    fit(single, SemanticHierarchy(batches_per_epoch=2), 15)
    assert not torch.equal(single.W[1], one_loop.W[1])


class Rows(pl.loggers.Logger):
    """Every row the Trainer writes: (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    name, version = "rows", 0

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def test_logged_rows_are_every_nth_batch_at_the_step_of_their_loss():
    """Lightning writes a training batch's logged values every ``log_every_n_steps`` batches (across
    epochs): each such row holds that batch's loss, of each member and their mean, at the step of
    the weights it was computed on; the module logs nothing it would not write, and the last batch's
    loss is in ``callback_metrics``."""
    dm = SemanticHierarchy(batches_per_epoch=4)
    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-2.0, 2.0], scale=0.1), lr=0.05, steps_per_batch=3)
    _, losses = hand_gd([W.detach().clone() for W in net.W], dm.X, dm.Y, 0.05, 30)
    logger = Rows()
    t = pl.Trainer(max_steps=30, logger=logger, log_every_n_steps=3, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    t.fit(net, datamodule=dm)
    rows = [(s, m) for s, m in logger.rows if "loss" in m]
    # batches 3, 6, 9 of 3 steps each (epochs of 4 batches): their first steps
    assert [s for s, _ in rows] == [6, 15, 24]
    for step, m in rows:
        assert set(m) == {"loss", "loss/lam=-2", "loss/lam=2"}
        assert m["loss"] == float(losses[step].mean())
        assert [m["loss/lam=-2"], m["loss/lam=2"]] == losses[step].tolist()
    assert torch.equal(t.callback_metrics["loss"], losses[27].mean())  # the last batch's, at step 27


def test_two_layer_gradients_in_reused_tensors_are_closed_form_gradients_bit_for_bit():
    """Across calls that change the batch (a smaller last minibatch) and the members, and back."""
    from zoo.models.deep_linear import TwoLayerGradients, closed_form_gradients, half_mean_squared

    g = torch.Generator().manual_seed(0)
    two = TwoLayerGradients()
    for E, N in ((5, 12), (5, 7), (3, 12), (5, 12)):
        Ws = [torch.randn(E, 4, 6, generator=g), torch.randn(E, 3, 4, generator=g)]
        x, y = torch.randn(N, 6, generator=g).expand(E, N, 6), torch.randn(N, 3, generator=g)
        D, grads = closed_form_gradients(Ws, x, y)
        D2, grads2 = two(Ws, x, y)
        assert torch.equal(D2, D) and all(torch.equal(a, b) for a, b in zip(grads2, grads))
        assert torch.equal(two.loss(D2), half_mean_squared(D))
