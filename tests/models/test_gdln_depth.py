"""zoo.models.gdln_depth.DepthGDLN ([H] Sec. 6, Fig. 6): hand-written gradients against autograd, the all-on
case against a three-layer linear network, pathway maps against the forward pass; callbacks.gdln
(the stereotypical run of [H] Fig. 6b) on hand-made curves and on a tiny Comparison run."""
from __future__ import annotations

import pytest
import torch

from callbacks.gdln import StereotypicalLoss
from zoo.analysis.gdln import stereotypical_member
from datamodules.contexts import Contexts
from zoo.models.gdln import Comparison, ReLUNet
from zoo.models.gdln_depth import DepthGDLN
from zoo.init import Gaussian
from zoo.theory.gdln import Gating



def _depth(dm, **kw) -> DepthGDLN:
    m = DepthGDLN(**kw)
    m.attach(dm)
    m.build(dm.X, dm.Y)
    return m


def _autograd_loss(Ws, X, Y, gates, c, training, scale):
    """[H] Fig. 6 written out: h1 = g * (W1 (W0 x)), y = W2 h1; the two-loss scheme (docs/theory.md#two-loss):
    the first c (common) units learn Y, the others Y - y_common with y_common held fixed."""
    h1 = (X @ Ws[0].mT @ Ws[1].mT) * gates
    if training == "joint":
        return 0.5 * scale * (h1 @ Ws[2].mT - Y).pow(2).sum()
    common = h1[..., :c] @ Ws[2][..., :c].mT
    rest = h1[..., c:] @ Ws[2][..., c:].mT
    return 0.5 * scale * ((common - Y).pow(2).sum() + (rest - (Y - common.detach())).pow(2).sum())


@pytest.mark.parametrize("training,reduction,E", [("joint", "mean", 2), ("joint", "sum", 1), ("two_loss", "mean", 2),
                                                  ("two_loss", "sum", 1)])
def test_gradients_and_one_step_match_autograd(training, reduction, E):
    dm = Contexts(3, "different")
    m = _depth(dm, n_shared=5, n_hidden=3, ensemble=E, init=Gaussian(sigma=0.3), training=training,
               reduction=reduction, lr=0.01)
    X, Y = dm.X.double(), dm.Y.double()
    Ws = [w.detach().double().clone().requires_grad_() for w in m.W]
    grads, loss = m._grads(X, Y, [w.detach() for w in Ws])
    scale = 1 / 24 if reduction == "mean" else 1.0
    ref = _autograd_loss(Ws, X, Y, m.unit_gates.double(), m.n_common_units, training, scale)
    ref.backward()
    for g, w in zip(grads, Ws):
        assert torch.allclose(g, w.grad, atol=1e-12, rtol=1e-9)
    if training == "joint":
        assert torch.allclose(loss.sum(), ref.detach(), rtol=1e-12)
    # one run_epochs step is plain gradient descent on that loss (E = 1 trains on plain matrices)
    m.double()
    before = [w.detach().clone() for w in m.W]
    m.run_epochs(dm.X, dm.Y, 1)
    for w, w0, ws in zip(m.W, before, Ws):
        assert torch.allclose(w.detach(), w0 - 0.01 * ws.grad, atol=1e-13)


def test_all_gates_on_is_a_three_layer_linear_network():
    dm = Contexts(3, "same")
    m = DepthGDLN(n_shared=6, n_hidden=2, ensemble=3, init=Gaussian(sigma=0.4), reduction="mean")
    N, n_in = dm.X.shape
    m.set_gating(Gating(torch.ones(N, 3), torch.ones(3, n_in), torch.tensor([True, False, False])))
    m.build(dm.X, dm.Y)
    X, Y = dm.X.double(), dm.Y.double()
    W0, W1, W2 = (w.detach().double().clone().requires_grad_() for w in m.W)
    out = X @ (W2 @ W1 @ W0).mT  # the linear network's map W2 W1 W0
    assert torch.allclose(m.double()(X), out.detach(), atol=1e-12)
    (0.5 * (out - Y).pow(2).sum() / N).backward()
    grads, _ = m._grads(X, Y, [w.detach() for w in m.W])
    for g, w in zip(grads, (W0, W1, W2)):
        assert torch.allclose(g, w.grad, atol=1e-12)


def test_pathway_maps_add_up_to_the_output():
    dm = Contexts(3, "different")
    m = _depth(dm, n_shared=4, n_hidden=3, ensemble=2, init=Gaussian(sigma=0.5)).double()
    maps = m.pathway_maps()  # (E, P, n_out, n_in)
    gates = m.gating.gates.double()  # (N, P): pathway p on for point i
    out = torch.einsum("ip,epok,ik->eio", gates, maps, dm.X.double())  # sum_p g_p^i (W2_p W1_p W0) x_i
    assert torch.allclose(out, m(dm.X.double()), atol=1e-12)
    sv = m.pathway_singular_values()
    assert torch.allclose(sv, torch.linalg.svdvals(maps))
    assert (sv[..., 3:] < 1e-10 * sv[..., :1]).all()  # rank <= min(n_shared, n_hidden) = 3


def test_bad_arguments_and_unsupported_theory():
    with pytest.raises(ValueError, match="n_shared"):
        DepthGDLN(n_shared=0)
    with pytest.raises(ValueError, match="n_shared"):
        DepthGDLN(n_shared=2.5)
    with pytest.raises(ValueError, match="training"):
        DepthGDLN(training="residual")
    m = _depth(Contexts(3, "different"), n_shared=3, n_hidden=2)
    with pytest.raises(NotImplementedError, match="predict: false"):
        m.initial_mode_strength()
    assert m.hparams["n_shared"] == 3 and m.hparams["init"]["class_path"] == "zoo.init.Gaussian"


def test_stereotypical_member_is_the_smallest_summed_distance():
    # mirrored pairs make the mean curve exactly 10; A strays once by 5 (summed distance 5, curve
    # L2 5), B by 0.6 at every one of 10 points (summed 6, curve L2 1.9): [H]'s sum over time points picks A
    T = 10
    A = torch.zeros(T)
    A[3] = 5.0
    B = torch.full((T,), 0.6)
    L = 10 + torch.stack([B, -B, A, -A], dim=1)
    assert stereotypical_member(L) == 2
    # scaled copies of one curve: the mean is 1.1375 x, the closest copy is 1.05 x
    base = torch.linspace(100, 1, 50)[:, None]
    assert stereotypical_member(base * torch.tensor([0.5, 1.0, 1.05, 2.0])) == 2
    with pytest.raises(ValueError, match="losses"):
        stereotypical_member(torch.ones(5))


def test_first_layer_on_weights_units_by_path_strength():
    net = ReLUNet(hidden=[2, 1], ensemble=1, init=Gaussian(sigma=1.0))
    X, Y = torch.eye(2), torch.zeros(2, 1)
    net.build(X, Y)
    with torch.no_grad():
        net.W[0].copy_(torch.tensor([[[1.0, 1.0], [1.0, -1.0]]]))  # unit 0 on for both points, unit 1 for the first
        net.W[1].copy_(torch.tensor([[[3.0, 1.0]]]))  # path strengths sqrt2 * 3 and sqrt2 * 1
    mean, low = net.first_layer_on(X)
    assert mean == pytest.approx((1.0 + 0.75) / 2) and low == pytest.approx(0.75)


def test_stereotypical_loss_callback_on_a_tiny_comparison(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dm = Contexts(3, "different")
    kw = dict(init=Gaussian(sigma=0.2), ensemble=3, lr=1e-3, reduction="sum")
    make = lambda: [ReLUNet(hidden=[6, 5], **kw), DepthGDLN(n_shared=6, n_hidden=2, **kw)]  # noqa: E731
    module = Comparison(make(), names=["relu", "reln"], epochs_per_step=5)
    from callbacks.gdln import LossCurves

    curves, cb = LossCurves(every_n_epochs=5, predict=False), StereotypicalLoss()
    trainer = pl.Trainer(max_steps=20, max_epochs=-1, logger=TensorBoardLogger(tmp_path, name="tb", version=0),
                         callbacks=[curves, cb], enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, datamodule=dm)
    # the same networks (same seeds) trained outside Lightning give the curves the callback saw
    for name, net in zip(["relu", "reln"], make()):
        net.attach(dm)
        net.build(dm.X, dm.Y)
        L = net.run_epochs(dm.X, dm.Y, 20).double()
        assert torch.allclose(cb.curve(name)[1], L)
        dist = (L - L.mean(1, keepdim=True)).abs().sum(0)
        assert cb.summary[name]["member"] == int(dist.argmin())
    assert 0 <= cb.summary["relu"]["first_layer_on"][1] <= cb.summary["relu"]["first_layer_on"][0] <= 1
    assert "first_layer_on" not in cb.summary["reln"]
    # the curves are stored once: StereotypicalLoss reads LossCurves' record
    assert cb.record is curves and not any(cb.curves.values()) and all(len(v) == 4 for v in curves.curves.values())
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "stereotypical_loss.png").exists()
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    assert "stereotypical_loss" in acc.Tags()["images"]
    assert "stereotypical/reln/member" in acc.Tags()["scalars"]
