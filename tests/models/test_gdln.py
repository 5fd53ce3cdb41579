"""zoo.models.gdln: hand-written gradients against autograd, GDLN simulations against the theory, ReLU
nets against their ReLNs ([H] Fig. 2d, Secs. 4-5 acceptance), and the Lightning path."""
from __future__ import annotations

import math

import pytest
import torch

from datamodules.contexts import Contexts
from datamodules.xor import XorMargin
from zoo.training.divergence import DivergenceError
from zoo.models.gdln import GDLN, Comparison, ReLUNet
from zoo.init import Gaussian
from zoo.theory import gdln as th




def _gdln(dm, gating, **kw) -> GDLN:
    m = GDLN(gating=gating, **kw)
    m.attach(dm)
    m.build(dm.X, dm.Y)
    return m


def _relu(dm, **kw) -> ReLUNet:
    m = ReLUNet(**kw)
    m.build(dm.X, dm.Y)
    return m


@pytest.mark.parametrize("training, gating", [("joint", "reln"), ("two_loss", "reln"), ("residual", "reln"),
                                              ("two_loss", "reln_full"), ("joint", "reln_full")])
def test_gdln_gradients_match_autograd(training, gating):
    dm = Contexts(3, "different")
    m = _gdln(dm, gating, n_hidden=4, ensemble=2, init=Gaussian(sigma=0.3), training=training, reduction="mean",
              context_init_gain=1.5)
    X, Y = dm.X.double(), dm.Y.double()
    Ws = [w.detach().double().clone().requires_grad_() for w in m.W]
    grads, _ = m._grads(X, Y, [w.detach() for w in Ws])
    h = (X @ (Ws[0] * m.unit_inputs.double()).transpose(-1, -2)) * m.unit_gates.double()  # [H] Eq. 1
    c = m.n_common_units
    if training == "joint":
        loss = 0.5 * (h @ Ws[1].transpose(-1, -2) - Y).pow(2).sum() / 24
    elif training == "two_loss":  # the authors' two losses: common pathway on Y, the others on the residual
        common = h[..., :c] @ Ws[1][..., :c].transpose(-1, -2)
        rest = h[..., c:] @ Ws[1][..., c:].transpose(-1, -2)
        loss = (0.5 * (common - Y).pow(2).sum() + 0.5 * (rest - (Y - common.detach())).pow(2).sum()) / 24
    else:  # [H] App. F: the others on the fixed residual Y* = Y - (least-squares fit from items + contexts)
        common = h[..., :c] @ Ws[1][..., :c].transpose(-1, -2)
        rest = h[..., c:] @ Ws[1][..., c:].transpose(-1, -2)
        Y_star = Y - X @ torch.linalg.pinv(X) @ Y
        loss = (0.5 * (common - Y).pow(2).sum() + 0.5 * (rest - Y_star).pow(2).sum()) / 24
    loss.backward()
    for g, w in zip(grads, Ws):
        assert torch.allclose(g, w.grad, atol=1e-12, rtol=1e-9)


def test_relu_gradients_and_patterns():
    dm = Contexts(3, "same")
    m = _relu(dm, hidden=[7, 5], ensemble=3, init=Gaussian(sigma=0.5))
    X, Y = dm.X.double(), dm.Y.double()
    Ws = [w.detach().double().clone().requires_grad_() for w in m.W]
    grads, loss = m._grads(X, Y, [w.detach() for w in Ws])
    h = X
    for W in Ws[:-1]:
        h = torch.relu(h @ W.transpose(-1, -2))
    ref = 0.5 * (h @ Ws[-1].transpose(-1, -2) - Y).pow(2).sum((-1, -2))  # reduction 'sum'
    ref.sum().backward()
    assert torch.allclose(loss, ref.detach())
    for g, w in zip(grads, Ws):
        assert torch.allclose(g, w.grad, atol=1e-12, rtol=1e-9)
    pats = m.activation_patterns(dm.X)
    assert [p.shape for p in pats] == [(3, 24, 7), (3, 24, 5)]
    assert torch.equal(pats[0], dm.X @ m.W[0].detach().transpose(-1, -2) > 0)


@pytest.mark.parametrize("kind", ["linear", "xor"])
def test_gdln_follows_closed_form_on_xor(kind):
    """A simulated GDLN (64 units per pathway, random init) against [H] App. C Eqs. 22-23 with the
    module's a0: the alignment phase of a random init is what the closed form leaves out."""
    dm = XorMargin(Delta=[0.4, 1.4])
    m = _gdln(dm, kind, n_hidden=64, init=Gaussian(sigma=1e-4), ensemble=2, lr=0.05, reduction="mean")
    L = m.run_epochs(dm.X, dm.Y, 1500)
    t_sim = th.time_to_loss(torch.arange(1500.0), L, 0.2)
    t_cf = th.xor_time_to_loss(dm.deltas, kind, tau=m.tau(4), a0=m.initial_mode_strength())
    assert torch.allclose(t_sim, t_cf, rtol=0.10), (t_sim, t_cf)  # measured 6-7% late: the alignment phase


def test_relu_follows_faster_gdln_on_both_sides_of_the_crossover():
    """[H] Fig. 2d at the paper's parameters (128 units, variance 4e-8/128, lr 0.4, mean loss)."""
    deltas = [0.3, 0.6, 1.1, 1.6]
    dm = XorMargin(Delta=deltas)
    sigma = math.sqrt(4e-8 / 128)
    t = torch.arange(300.0)
    relu = th.time_to_loss(t, _relu(dm, hidden=[128], init=Gaussian(sigma=sigma), ensemble=4, lr=0.4,
                                     reduction="mean").run_epochs(dm.X, dm.Y, 300), 0.2)
    times = {}
    for kind in ("linear", "xor"):
        m = _gdln(dm, kind, n_hidden=128, init=Gaussian(sigma=sigma), ensemble=4, lr=0.4, reduction="mean")
        times[kind] = th.time_to_loss(t, m.run_epochs(dm.X, dm.Y, 300), 0.2)
    fast, slow = torch.minimum(times["linear"], times["xor"]), torch.maximum(times["linear"], times["xor"])
    cross = th.xor_crossover()
    assert bool((times["xor"][:2] < times["linear"][:2]).all()) and bool((times["linear"][2:] < times["xor"][2:]).all())
    assert all((d < cross) == (i < 2) for i, d in enumerate(deltas))
    # the ReLU net is nearer the faster GDLN than the slower, and within 12% of it (measured 4-9%)
    assert bool(((relu - fast).abs() < (relu - slow).abs()).all()), (relu, times)
    assert bool(((relu - fast).abs() / fast < 0.12).all()), (relu, fast)


def test_three_contexts_relu_reln_and_single():
    """[H] Sec. 4-5 criteria (epochs to 50%, 10%, 1% of the initial loss, mean of 3 seeds), small
    version: same-structure task, summed loss at lr 8e-3 for 1,000 epochs (the paper's 1e-3 for
    8,000 scaled by 8: the same trajectory in time lr * epochs up to discretisation). The ReLN has
    700 / 4 = 175 units per pathway, as many hidden units in all as the ReLU net ([H] App. F)."""
    dm = Contexts(3, "same")
    kw = dict(init=Gaussian(sigma=7.142857e-6), ensemble=3, lr=8e-3, reduction="sum")
    T = 1000
    t = torch.arange(float(T))
    relu = th.times_to_fraction(t, _relu(dm, hidden=[700], **kw).run_epochs(dm.X, dm.Y, T)).mean(-1)
    reln_net = _gdln(dm, "reln", n_hidden=175, **kw)
    reln = th.times_to_fraction(t, reln_net.run_epochs(dm.X, dm.Y, T)).mean(-1)
    single = th.times_to_fraction(t, _gdln(dm, "single", n_hidden=175, **kw).run_epochs(dm.X, dm.Y, T)).mean(-1)
    assert torch.allclose(reln, relu, rtol=0.05), (reln, relu)  # the 5%
    assert not float(single[2]) <= 1.2 * float(relu[2])  # misses by > 20% (or never gets there)
    steps, _, race = th.race_trajectory(dm.X, dm.Y, reln_net.gating, T, tau=reln_net.tau(24),
                                        a0=reln_net.initial_mode_strength(), record_every=2)
    pred = th.times_to_fraction(steps, race)
    assert torch.allclose(pred[:2], reln[:2], rtol=0.10), (pred, reln)


@pytest.mark.slow
def test_three_contexts_different_structure_matches_the_relu_net():
    """[H] Sec. 4 acceptance on the different-structure task at the paper's scale (lr 1e-3, 8,000
    epochs, init std 0.005/700, 3 seeds): the ReLN of [H] Fig. 3 (175 units per pathway, 700 in all,
    the authors' two losses, context pathways started at twice the common std as in the authors'
    code) reaches 50% / 10% / 1% of the initial loss within 5% of the ReLU net (measured +3.6%,
    0.0%, +3.7%), both end near the issue's check value 0.02-0.03 (measured 0.023 and 0.018), the
    race predicts the ReLN within 10% (measured 4% early on all three) and GDLN single misses 1%."""
    dm = Contexts(3, "different")
    kw = dict(init=Gaussian(sigma=0.005 / 700), ensemble=3, lr=1e-3, reduction="sum")
    T = 8000
    t = torch.arange(float(T + 1))
    relu_loss = _relu(dm, hidden=[700], **kw).run_epochs(dm.X, dm.Y, T + 1)
    assert float(relu_loss[0, 0]) == pytest.approx(105.623, abs=1e-3)  # the initial loss
    reln_net = _gdln(dm, "reln", n_hidden=175, training="two_loss", context_init_gain=2.0, **kw)
    reln_loss = reln_net.run_epochs(dm.X, dm.Y, T + 1)
    relu, reln = (th.times_to_fraction(t, l).mean(-1) for l in (relu_loss, reln_loss))
    assert torch.allclose(reln, relu, rtol=0.05), (reln, relu)  # the 5%
    for final in (relu_loss[-1].mean(), reln_loss[-1].mean()):
        assert 0.015 < float(final) < 0.035, final  # "both end near 0.02-0.03"
    steps, _, race = th.race_trajectory(dm.X, dm.Y, reln_net.gating, T, tau=reln_net.tau(24),
                                        a0=reln_net.pathway_a0(), training="two_loss", record_every=4)
    pred = th.times_to_fraction(steps, race)
    assert torch.allclose(pred, reln, rtol=0.10), (pred, reln)
    single = _gdln(dm, "single", n_hidden=175, context_init_gain=2.0, **kw).run_epochs(dm.X, dm.Y, T + 1)
    assert not float(th.times_to_fraction(t, single).mean(-1)[2]) <= 1.2 * float(relu[2])


def test_context_init_gain():
    dm = Contexts(3, "different")
    kw = dict(n_hidden=5, ensemble=2, init=Gaussian(sigma=0.1), seed=3)
    plain, gained = _gdln(dm, "reln", **kw), _gdln(dm, "reln", context_init_gain=2.0, **kw)
    c = plain.n_common_units
    for a, b in ((plain.W[0], gained.W[0]), (plain.W0_init, gained.W0_init)):
        assert torch.equal(b[:, :c], a[:, :c]) and torch.allclose(b[:, c:], 2 * a[:, c:])
    for a, b in ((plain.W[1], gained.W[1]), (plain.W1_init, gained.W1_init)):
        assert torch.equal(b[..., :c], a[..., :c]) and torch.allclose(b[..., c:], 2 * a[..., c:])
    # the race starts each pathway from the scheme's strength times its gain squared
    assert gained.initial_mode_strength() == pytest.approx(plain.initial_mode_strength(), rel=1e-6)
    assert torch.allclose(gained.pathway_a0(), plain.initial_mode_strength() * torch.tensor([1.0, 4, 4, 4], dtype=torch.float64))
    # a per-pathway a0 of equal values is the scalar a0
    a0 = plain.initial_mode_strength()
    _, m1, _ = th.race_trajectory(dm.X, dm.Y, plain.gating, 50, tau=200.0, a0=a0)
    _, m2, _ = th.race_trajectory(dm.X, dm.Y, plain.gating, 50, tau=200.0, a0=torch.full((4,), a0, dtype=torch.float64))
    assert torch.equal(m1, m2)
    with pytest.raises(ValueError, match="context_init_gain"):
        GDLN(context_init_gain=0.0)
    with pytest.raises(ValueError, match="a0"):
        th.race_trajectory(dm.X, dm.Y, plain.gating, 5, tau=200.0, a0=torch.tensor([1.0, 0, 1, 1]))


def test_comparison_records_its_models_and_loads_from_a_checkpoint(tmp_path):
    """hparams.yaml names every model with its arguments, and load_from_checkpoint rebuilds the
    whole comparison (weights, a GDLN's gates) without the datamodule."""
    import lightning.pytorch as pl
    import yaml
    from lightning.pytorch.loggers import TensorBoardLogger

    dm = Contexts(3, "same")
    kw = dict(init=Gaussian(sigma=0.01), ensemble=2)
    module = Comparison([ReLUNet(hidden=[20, 7], **kw), GDLN(n_hidden=5, context_init_gain=2.0, **kw)],
                        names=["relu", "reln"], epochs_per_step=10)
    trainer = pl.Trainer(max_steps=30, max_epochs=-1, logger=TensorBoardLogger(tmp_path, name="tb", version=0),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu")
    trainer.fit(module, datamodule=dm)
    saved = yaml.safe_load((tmp_path / "tb" / "version_0" / "hparams.yaml").read_text())
    assert saved["names"] == ["relu", "reln"] and saved["epochs_per_step"] == 10
    assert [m["class_path"] for m in saved["models"]] == ["zoo.models.gdln.ReLUNet", "zoo.models.gdln.GDLN"]
    assert saved["models"][0]["init_args"]["hidden"] == [20, 7]
    assert saved["models"][1]["init_args"]["context_init_gain"] == 2.0
    trainer.save_checkpoint(ckpt := tmp_path / "c.ckpt")
    loaded = Comparison.load_from_checkpoint(ckpt)
    assert loaded.names == ["relu", "reln"]
    for a, b in zip(loaded.models, module.models):
        assert type(a) is type(b) and torch.allclose(a(dm.X), b(dm.X))
        assert torch.equal(a.run_epochs(dm.X, dm.Y, 3), b.run_epochs(dm.X, dm.Y, 3))
    with pytest.raises(ValueError, match=r"models\[0\]"):
        Comparison([{"class_path": "torch.nn.Linear", "init_args": {}}])


def test_comparison_through_trainer(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger

    from callbacks.gdln import LossCurves, XorLearningTimes

    dm = XorMargin(Delta=[0.3, 1.5])
    kw = dict(init=Gaussian(sigma=1e-4), ensemble=2, lr=0.4, reduction="mean")
    models = [ReLUNet(hidden=[32], **kw), GDLN(gating="linear", n_hidden=32, **kw), GDLN(gating="xor", n_hidden=32, **kw)]
    module = Comparison(models, names=["relu", "linear", "xor"], epochs_per_step=20)
    curves = LossCurves(every_n_epochs=10)
    trainer = pl.Trainer(max_steps=100, max_epochs=-1, logger=TensorBoardLogger(tmp_path, name="tb", version=0),
                         callbacks=[curves, times := XorLearningTimes(trajectory_deltas=[0.2, 1.4])],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, datamodule=dm)
    assert module.epochs_done == trainer.global_step == 100  # global_step counts GD updates
    t, L = curves.curve("relu")
    assert L.shape == (100, 2)
    # the recorded curve is the module's own loss: recompute the last epoch's loss from the weights
    with torch.no_grad():
        for i, name in enumerate(module.names):
            assert torch.allclose(curves.curve(name)[1][0], torch.full((2,), 0.5, dtype=torch.float64), atol=1e-3)
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "loss_curves.png").exists() and (folder / "xor_times.png").exists()
    assert (folder / "xor_trajectories.png").exists()
    # [H] Fig. 2e's panels: the members nearest 0.2 and 1.4 are Delta 0.3 and 1.5; each network's own
    # curve, and the closed forms recomputed independently (mean loss, a0 of the first GDLN)
    panels = times.trajectories(trainer, module)
    assert [p["member"] for p in panels] == [0, 1] and [p["Delta"] for p in panels] == pytest.approx([0.3, 1.5])
    a0 = models[1].initial_mode_strength()
    for p in panels:
        assert torch.equal(p["simulated"]["relu"], curves.curve("relu")[1][:, p["member"]])
        for kind in ("linear", "xor"):
            ref = th.xor_loss(p["t"], p["Delta"], kind, tau=models[0].tau(4), a0=a0)
            assert torch.allclose(p["closed_form"][kind], ref)
    assert "linear" in curves.predictions and curves.predictions["linear"][1].shape[1] == 2


def test_divergence_and_bad_input():
    dm = XorMargin(Delta=1.0)
    m = _relu(dm, hidden=[16], init=Gaussian(sigma=1.0), lr=50.0, epochs_per_step=50)
    import lightning.pytorch as pl

    trainer = pl.Trainer(max_steps=150, max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    with pytest.raises(DivergenceError, match="lr"):
        trainer.fit(m, datamodule=dm)
    for kwargs, word in [(dict(lr=-1.0), "lr"), (dict(reduction="max"), "reduction"), (dict(n_hidden=0), "n_hidden"),
                         (dict(training="both"), "training"), (dict(epochs_per_step=0), "epochs_per_step"),
                         (dict(num_threads=0), "num_threads")]:
        with pytest.raises(ValueError, match=word):
            GDLN(**kwargs)
    with pytest.raises(ValueError, match="hidden"):
        ReLUNet(hidden=[10, 10, 10])
    with pytest.raises(ValueError, match="training = 'residual' needs a common pathway"):
        _gdln(XorMargin(Delta=[0.5]), "xor", training="residual")  # four pathways, none common
    with pytest.raises(ValueError, match="gating"):
        _gdln(dm, "reln")


@pytest.mark.parametrize("C, context_scale", [pytest.param(*c, marks=pytest.mark.slow)
                                                    for c in [(3, 1.0), (4, 1.0), (5, 1.0), (5, 1.35)]])
def test_closed_form_describes_the_residual_trained_reln(C, context_scale):
    """[H] Sec. 5 acceptance: the corrected closed form (App. F-G, m = C - 1) against a simulated
    ReLN trained as App. F derives it (training='residual': the context pathways learn the fixed
    residual of the converged common pathway), on epochs to 50%, 10% and 1% of the initial loss.
    The paper's 1e-3 x 16,000 epochs scaled to 2e-3 x 8,000 (at 8e-3 the discrete steps already
    run 7% behind the flow at 50%); 50 units per pathway, init std 0.005/700. context_scale 1.35:
    the authors' five-context data (measured 4.3-5.1% early)."""
    dm = Contexts(C, "same", context_scale=context_scale)
    m = _gdln(dm, "reln", n_hidden=50, init=Gaussian(sigma=0.005 / 700), lr=2e-3, reduction="sum", training="residual")
    T = 8000
    sim = th.times_to_fraction(torch.arange(float(T)), m.run_epochs(dm.X, dm.Y, T))[:, 0]
    t = torch.arange(0.0, T + 1, 4.0)
    tau, a0 = m.tau(dm.X.shape[0]), m.initial_mode_strength()
    pred = th.times_to_fraction(t, th.contexts_closed_form(dm.X, dm.Y, m.gating, t, tau=tau, a0=a0)[1])
    assert bool(torch.isfinite(sim).all()), sim
    # the closed form starts aligned, a random init first has to align: it is early by 3-5%
    # (measured at lr 1e-3 with 100 units for C = 3, 4, 5)
    assert torch.allclose(pred, sim, rtol=0.06), (pred, sim)
    assert bool((pred < sim).all())
    # the race of the same scheme is the closed form where the task is symmetric (Euler vs flow)
    steps, _, race = th.race_trajectory(dm.X, dm.Y, m.gating, T, tau=tau, a0=a0, training="residual", record_every=4)
    assert torch.allclose(th.times_to_fraction(steps, race), pred, rtol=0.02)


def test_common_limit_is_the_least_squares_fit():
    dm = Contexts(4, "same")
    g = dm.gating("reln")
    X, Y = dm.X.double(), dm.Y.double()
    assert torch.allclose(th.common_limit(dm.X, dm.Y, g), X @ torch.linalg.pinv(X) @ Y, atol=1e-10)
    # a common pathway that reads the items only and is on in context 0 only fits those points only
    sub = th.Gating(torch.nn.functional.one_hot(dm.context, 4)[:, :1].float(), torch.cat([torch.ones(1, 8), torch.zeros(1, 4)], 1),
                    torch.tensor([True]))
    fit = th.common_limit(dm.X, dm.Y, sub)
    assert torch.allclose(fit[:8], Y[:8], atol=1e-10) and float(fit[8:].abs().max()) == 0.0


@pytest.mark.parametrize("make", ["relu", "reln", "xor_one_margin", "relu_two_members"])
def test_run_epochs_is_gradient_descent(make):
    """``run_epochs`` (single members run as plain matrices, the chosen thread count) against an
    autograd SGD loop on the same loss, three steps."""
    if make.startswith("relu"):
        dm = Contexts(3, "different")
        E = 2 if make.endswith("members") else 1
        m = _relu(dm, hidden=[9, 6] if E == 2 else [9], init=Gaussian(sigma=0.4), ensemble=E, lr=0.01, num_threads=2)
    elif make == "reln":
        dm = Contexts(3, "same")
        m = _gdln(dm, "reln", n_hidden=3, init=Gaussian(sigma=0.4), lr=0.01, training="two_loss")
    else:  # member-specific gates (E, N, P) with one member
        dm = XorMargin(Delta=[0.9])
        m = _gdln(dm, "xor", n_hidden=3, init=Gaussian(sigma=0.4), lr=0.05, reduction="mean")
    X, Y = dm.X.double(), dm.Y.double()
    m = m.double()
    Ws = [w.detach().clone().requires_grad_() for w in m.W]
    ref = []
    for _ in range(3):
        grads, loss = m._grads(X, Y, [w.detach() for w in Ws])
        ref.append(loss)
        with torch.no_grad():
            for w, g in zip(Ws, grads):
                w -= m.lr * g
    threads = torch.get_num_threads()
    L = m.run_epochs(X, Y, 3)
    assert torch.get_num_threads() == threads  # restored
    assert torch.allclose(L, torch.stack(ref).reshape(L.shape))
    for w, r in zip(m.W, Ws):
        assert torch.allclose(w, r.detach(), atol=1e-14)
    # and _grads itself is autograd's (the relu and reln cases are covered above with more detail)
    if make == "relu":
        Wa = [w.detach().clone().requires_grad_() for w in m.W]
        out = torch.relu(X @ Wa[0].transpose(-1, -2)) @ Wa[1].transpose(-1, -2)
        (0.5 * (out - Y).pow(2).sum()).backward()
        for g, w in zip(m._grads(X, Y, [w.detach() for w in Wa])[0], Wa):
            assert torch.allclose(g, w.grad)


@pytest.mark.parametrize("make", ["relu", "reln_residual", "depth"])
def test_checkpoints_load_without_the_datamodule_and_resume(tmp_path, make):
    """``load_from_checkpoint`` rebuilds the weights (and a GDLN's gates) from the checkpoint alone:
    same outputs, same next steps; and a fit resumed from it ends where an uninterrupted fit ends."""
    import lightning.pytorch as pl

    from zoo.models.gdln_depth import DepthGDLN

    dm = Contexts(3, "same")
    kw = dict(init=Gaussian(sigma=0.01), epochs_per_step=10, ensemble=2)
    build = {"relu": lambda: ReLUNet(hidden=[20, 7], **kw),
             "reln_residual": lambda: GDLN(n_hidden=5, training="residual", **kw),
             "depth": lambda: DepthGDLN(n_hidden=5, n_shared=6, **kw)}[make]

    def trainer(steps):
        return pl.Trainer(max_steps=steps, max_epochs=-1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                          accelerator="cpu")

    m, ckpt = build(), tmp_path / "m.ckpt"
    t = trainer(30)
    t.fit(m, datamodule=dm)
    t.save_checkpoint(ckpt)
    loaded = type(m).load_from_checkpoint(ckpt)
    assert torch.allclose(loaded(dm.X), m(dm.X))
    # gates, weights and (residual) the fixed target all came back: the next epochs are the same
    assert torch.equal(loaded.run_epochs(dm.X, dm.Y, 5), m.run_epochs(dm.X, dm.Y, 5))
    resumed, straight = build(), build()
    trainer(60).fit(resumed, datamodule=dm, ckpt_path=ckpt)
    trainer(60).fit(straight, datamodule=dm)
    for a, b in zip(resumed.W, straight.W):
        assert torch.equal(a, b)
