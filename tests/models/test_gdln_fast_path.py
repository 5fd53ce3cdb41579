"""zoo.kernels.gdln: the reused-tensor epoch of one-hidden-layer nets and the plain GD optimizer give
the bits of the generic hand-written path (``FullBatchNet._grads`` + ``torch.optim.SGD``)."""
from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import lightning.pytorch as pl

from datamodules.contexts import Contexts
from datamodules.xor import XorMargin
from zoo.models.gdln import GDLN, Comparison, ReLUNet
import zoo
from zoo.kernels.gdln import GradientDescent, PlainUpdate, TwoLayerEpoch
from zoo.init import Gaussian
from zoo.training.steps import direct_updates_allowed



def _net(kind: str, seed: int = 0):
    if kind.startswith("relu"):
        dm = Contexts(3, "different")
        m = ReLUNet(hidden=[9], init=Gaussian(sigma=0.4), ensemble=3 if kind.endswith("E3") else 1,
                    lr=0.01, reduction="mean" if "mean" in kind else "sum", seed=seed)
    elif kind.startswith("xor"):  # per-member data and gates (E, N, .)
        dm = XorMargin(Delta=[0.5, 0.9])
        m = GDLN(gating="xor", n_hidden=3, init=Gaussian(sigma=0.4), ensemble=2, lr=0.05, reduction="mean", seed=seed)
        m.attach(dm)
    else:
        dm = Contexts(3, "different")
        m = GDLN(gating="reln", n_hidden=4, init=Gaussian(sigma=0.4), ensemble=2 if kind.endswith("E2") else 1,
                 lr=0.01, reduction="mean" if "mean" in kind else "sum", context_init_gain=2.0, seed=seed)
        m.attach(dm)
    m.build(dm.X, dm.Y)
    return m, dm


class _Generic:
    """The same network trained by the generic ``_grads`` (no fast path)."""

    def _fast_epoch(self, x, y, Ws):
        return None


def _generic(m):
    cls = type(m)
    m.__class__ = type("Generic" + cls.__name__, (_Generic, cls), {})
    return m


KINDS = ["relu", "relu_mean", "relu_E3", "reln", "reln_mean_E2", "xor"]


@pytest.mark.parametrize("kind, n", [(k, 25) for k in KINDS] + [("relu_E3", 2 * TwoLayerEpoch.BLOCK + 7),
                                                                  ("reln", 2 * TwoLayerEpoch.BLOCK + 7)])
def test_fast_epochs_are_the_generic_bits(kind, n):
    """``run``'s losses, computed a block of epochs at a time (n crosses two block ends), and its
    weights are those of the generic path epoch by epoch."""
    fast, dm = _net(kind)
    slow, _ = _net(kind)
    _generic(slow)
    assert isinstance(fast._fast_epoch(dm.X, dm.Y, [w.data for w in fast.W]), TwoLayerEpoch)
    assert slow._fast_epoch(dm.X, dm.Y, list(slow.W)) is None
    L_fast, L_slow = fast.run_epochs(dm.X, dm.Y, n), slow.run_epochs(dm.X, dm.Y, n)
    assert L_fast.shape == L_slow.shape == (n, fast.ensemble)
    assert torch.equal(L_fast, L_slow)
    for a, b in zip(fast.W, slow.W):
        assert torch.equal(a, b)
    assert not torch.equal(fast.W[0], fast.W0_init)  # it did train


@pytest.mark.parametrize("E", [1, 2])
def test_own_update_is_the_steps_bits_on_dense_inputs(E):
    """Where run_together applies the plain update inside the epoch (its working copies, W0 laid
    out (n_in, H)), the weights and losses are those of gradients-then-step and of the generic
    path, bit for bit, on dense random inputs (not one-hot: every product rounds) with the hidden
    layer wider than the input (W0's gradient a transposed product)."""
    g = torch.Generator().manual_seed(3)
    X, Y = torch.randn(13, 5, generator=g), torch.randn(13, 4, generator=g)
    own, stepped, slow = (ReLUNet(hidden=[24], init=Gaussian(sigma=0.3), ensemble=E, lr=1e-3, seed=1) for _ in range(3))
    for m in (own, stepped, slow):
        m.build(X, Y)
    _generic(slow)
    update = stepped.sgd_step()
    L = [own.run_epochs(X, Y, 40), stepped.run_epochs(X, Y, 40, lambda: update()), slow.run_epochs(X, Y, 40)]
    for other, Lo in zip((stepped, slow), L[1:]):
        assert torch.equal(L[0], Lo)
        assert all(torch.equal(a, b) for a, b in zip(own.W, other.W))
    # W.grad: the last epoch's gradients, as the step leaves them
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(own.W, stepped.W))
    assert L[0][-1].sum() < 0.8 * L[0][0].sum()  # it did train
    # a rate per layer (two update passes), and a step that is not the plain update (run as given)
    rates = [(W, lr) for W, lr in zip(own.W, (2e-3, 5e-4))]
    own_rates = PlainUpdate(rates)
    stepped_rates = PlainUpdate([(W, lr) for W, (_, lr) in zip(stepped.W, rates)])
    La, Lb = own.run_epochs(X, Y, 9, own_rates), stepped.run_epochs(X, Y, 9, lambda: stepped_rates())
    assert torch.equal(La, Lb) and all(torch.equal(a, b) for a, b in zip(own.W, stepped.W))


@pytest.mark.parametrize("kind", ["relu_E3", "reln_mean_E2", "xor"])
def test_run_epochs_trains_in_the_own_loop(kind, monkeypatch):
    """With its default step (the plain update) ``run_epochs`` trains in ``updating``'s own loop, one
    ``updating`` per network and chunk and no ``gradients`` call: so the bit-for-bit comparisons
    above compare that loop (gates, input masks, the mean's scale, members) with the generic path."""
    net, dm = _net(kind)
    made = []
    updating = TwoLayerEpoch.updating

    def counted(self, rates, outs):
        made.append(rates)
        return updating(self, rates, outs)

    def refused(self, out):
        raise AssertionError("gradients called: the epochs did not run in the own loop")

    monkeypatch.setattr(TwoLayerEpoch, "updating", counted)
    monkeypatch.setattr(TwoLayerEpoch, "gradients", refused)
    L = net.run_epochs(dm.X, dm.Y, TwoLayerEpoch.BLOCK + 5)
    assert made == [[net.lr, net.lr]]
    assert torch.isfinite(L).all() and not torch.equal(net.W[0], net.W0_init)


def test_the_kernels_are_plain_torch():
    """No TorchScript in the package (``torch.jit`` is deprecated in torch 2.x): every fast path is
    plain torch called from Python."""
    def uses_jit(tree: ast.AST) -> bool:  # the code's ``torch.jit`` attributes and imports, not its prose
        return any(isinstance(n, ast.Attribute) and n.attr == "jit" and isinstance(n.value, ast.Name) and n.value.id == "torch"
                   or isinstance(n, ast.ImportFrom) and (n.module or "").startswith("torch.jit")
                   or isinstance(n, ast.Import) and any(a.name.startswith("torch.jit") for a in n.names)
                   for n in ast.walk(tree))

    assert uses_jit(ast.parse("import torch\nf = torch.jit.script(g)"))  # the check sees a use
    root = pathlib.Path(zoo.__file__).parent
    users = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py")) if uses_jit(ast.parse(p.read_text()))]
    assert users == []


def test_overridden_steps_and_two_layers_take_the_generic_path():
    class Leaky(ReLUNet):
        def gates(self, h):
            return (h > 0).to(h) * 0.9 + 0.1

    dm = Contexts(3, "different")
    for m in (Leaky(hidden=[5]), ReLUNet(hidden=[5, 4])):
        m.build(dm.X, dm.Y)
        assert m._fast_epoch(dm.X, dm.Y, [w.data for w in m.W]) is None
    m = GDLN(gating="reln", n_hidden=3, training="two_loss")
    m.attach(dm)
    m.build(dm.X, dm.Y)
    assert m._fast_epoch(dm.X, dm.Y, [w.data for w in m.W]) is None


def test_gradient_descent_is_sgd_to_the_bit_and_reads_its_state():
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    gd = GradientDescent([{"params": a[:1], "lr": 0.1}, {"params": a[1:], "lr": 0.03}], lr=0.1)
    sgd = torch.optim.SGD([{"params": b[:1], "lr": 0.1}, {"params": b[1:], "lr": 0.03}])
    for _ in range(3):
        for p, q in zip(a, b):
            p.grad = q.grad = torch.randn_like(p)
        gd.step()
        sgd.step()
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    # update_fn (what training_step applies each epoch): the same update as step, to the bit
    c = [torch.nn.Parameter(p.detach().clone()) for p in a]
    update = GradientDescent([{"params": c[:1], "lr": 0.1}, {"params": c[1:], "lr": 0.03}], lr=0.1).update_fn()
    for p, q in zip(a, c):
        p.grad = q.grad = torch.randn_like(p)
    gd.step()
    with torch.no_grad():
        update()
    assert all(torch.equal(p, q) for p, q in zip(a, c)) and not torch.equal(c[0], b[0])
    a[1].grad = c[1].grad = None  # left alone, as SGD leaves it
    before = a[1].detach().clone()
    gd.step()
    with torch.no_grad():
        update()
    assert torch.equal(a[1], before) and torch.equal(c[1], before)
    # a checkpoint written with SGD (before this class) restores the learning rates
    state = sgd.state_dict()
    state["param_groups"][1]["lr"] = 0.5
    gd.load_state_dict(state)
    assert [g["lr"] for g in gd.param_groups] == [0.1, 0.5]
    assert gd.state_dict()["param_groups"] == [{"lr": 0.1, "params": [0]}, {"lr": 0.5, "params": [1]}]
    with pytest.raises(ValueError, match="momentum"):
        gd.load_state_dict(torch.optim.SGD([{"params": b[:1]}, {"params": b[1:]}], lr=0.1, momentum=0.9).state_dict())
    with pytest.raises(ValueError, match="other parameter groups"):
        gd.load_state_dict(torch.optim.SGD(b, lr=0.1).state_dict())


def test_trainer_path_is_run_epochs_bits(tmp_path):
    """Through Lightning (one GradientDescent step per epoch, chunks of 7 cut at max_steps) the
    weights and losses are those of the plain loop; global_step counts epochs."""
    net, dm = _net("reln")
    ref, _ = _net("reln")
    net.epochs_per_step = 7
    seen = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(outputs["epoch_loss"]["GDLN"])

    trainer = pl.Trainer(max_steps=30, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", callbacks=[Record()])
    trainer.fit(net, datamodule=dm)
    assert trainer.global_step == net.epochs_done == 30
    L = ref.run_epochs(dm.X, dm.Y, 30)
    assert torch.equal(torch.cat(seen, dim=1), L.T)
    for a, b in zip(net.W, ref.W):
        assert torch.equal(a, b)


class EveryUpdate(pl.Callback):
    """A hook Lightning calls at every optimizer step: its presence sends each epoch's update
    through ``LightningOptimizer.step`` (zoo.training.steps)."""

    def __init__(self) -> None:
        self.calls = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.calls += 1


class Record(pl.Callback):
    """Every network's epoch losses from each step's outputs."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses += list(outputs["epoch_loss"].values())


def _fit(module, dm, max_steps: int, callbacks=()):
    trainer = pl.Trainer(max_steps=max_steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         callbacks=list(callbacks))
    trainer.fit(module, datamodule=dm)
    return trainer


@pytest.mark.parametrize("comparison", [False, True])
def test_direct_updates_are_lightnings_steps_to_the_bit(comparison):
    """Epochs applied by the optimizer itself (zoo.training.steps.Updates) and epochs through Lightning's
    optimizer step (forced by a per-step hook) give the same weights, losses, global_step and loop
    state; the hook sees every epoch. Also for a Comparison (models in lockstep)."""
    def make():
        net, dm = _net("reln")
        net.epochs_per_step = 6
        if not comparison:
            return net, dm, lambda: list(net.W)
        relu, _ = _net("relu")
        both = Comparison([net, relu], epochs_per_step=6)
        return both, dm, lambda: list(net.W) + list(relu.W)

    direct, dm, W_direct = make()
    seen_direct, seen_via = Record(), Record()
    t_direct = _fit(direct, dm, 15, [seen_direct])
    via, dm, W_via = make()
    hook = EveryUpdate()
    t_via = _fit(via, dm, 15, [hook, seen_via])
    assert direct_updates_allowed(direct) and not direct_updates_allowed(via)
    assert hook.calls == t_via.global_step == t_direct.global_step == 15
    assert len(seen_direct.losses) == 3 * len(direct.networks())  # chunks of 6, 6, 3 epochs
    assert all(torch.equal(a, b) for a, b in zip(seen_direct.losses, seen_via.losses))
    assert t_direct.fit_loop.epoch_loop.state_dict() == t_via.fit_loop.epoch_loop.state_dict()
    for a, b in zip(W_direct(), W_via()):
        assert torch.equal(a, b)
    assert not torch.equal(W_direct()[0], _net("reln")[0].W[0])  # it did train


def test_comparison_in_lockstep_is_each_network_alone():
    """A Comparison's epochs (every network's gradients, then one step; losses a block at a time)
    are each network's own run_epochs, bit for bit; a network without the fast epoch (two hidden
    layers) sends the Comparison down the generic path, to the same bits."""
    n = TwoLayerEpoch.BLOCK + 9
    for deep in (False, True):
        reln, dm = _net("reln")
        relu = ReLUNet(hidden=[6, 5] if deep else [9], init=Gaussian(sigma=0.4), lr=0.01, seed=1)
        relu.build(dm.X, dm.Y)
        alone = [_net("reln")[0], ReLUNet(hidden=[6, 5] if deep else [9], init=Gaussian(sigma=0.4), lr=0.01, seed=1)]
        alone[1].build(dm.X, dm.Y)
        seen = Record()
        _fit(Comparison([reln, relu], epochs_per_step=n), dm, n, [seen])
        for net, ref, L in zip((reln, relu), alone, seen.losses):
            assert torch.equal(L, ref.run_epochs(dm.X, dm.Y, n).T)
            assert all(torch.equal(a, b) for a, b in zip(net.W, ref.W))
