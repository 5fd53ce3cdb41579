"""NTKDistance, RSM and PhaseDiagram: they fire, log what they document, and their numbers are
the independent computations they claim to be."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers_fit import fit
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import RSM, NTKDistance, PhaseDiagram
from datamodules import RankOne, SemanticHierarchy, WhitenedRegression
from zoo import DeepLinearNet
from zoo.init import Gaussian, LambdaBalanced, PathwayGrid
from zoo.metrics import kernel_distance, linear_ntk



def _fit(tmp_path, net, dm, callbacks, steps, ckpt=None, name="tb"):
    trainer = fit(net, dm, tmp_path, logger=TensorBoardLogger(tmp_path, name=name), callbacks=callbacks, max_steps=steps,
                  ckpt_path=ckpt, enable_checkpointing=True)
    acc = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return trainer, acc


def test_ntk_distance_matches_an_independent_kernel_and_the_theory(tmp_path):
    dm = WhitenedRegression(n_in=4, n_out=3, num_samples=10, batches_per_epoch=10)
    net = DeepLinearNet(dims=[4, 3, 3], init=LambdaBalanced(lam=[-2.0, 0.0, 2.0], scale=0.3), lr=0.05)
    K0 = linear_ntk(net.W[0].detach(), net.W[1].detach(), dm.X, layout="output_major").double()
    cb = NTKDistance(every_n_steps=10)
    trainer, acc = _fit(tmp_path, net, dm, [cb], steps=60)
    assert [e.step for e in acc.Scalars("ntk/distance/lam=0")] == [0, 10, 20, 30, 40, 50, 60]
    # the logged distance is the kernel distance of the closed-form NTK of the current weights
    Kt = linear_ntk(net.W[0].detach(), net.W[1].detach(), dm.X, layout="output_major").double()
    expected = kernel_distance(K0, Kt)
    logged = [acc.Scalars(f"ntk/distance/{lbl}")[-1].value for lbl in net.labels]
    assert logged == pytest.approx(expected.tolist(), abs=1e-5)
    # the theory curve ([L] Thm. 4.3) agrees with gradient descent to O(lr)
    theory = [acc.Scalars(f"ntk/distance_theory/{lbl}")[-1].value for lbl in net.labels]
    assert logged == pytest.approx(theory, abs=5e-3)
    assert logged[1] > 10 * max(logged[0], logged[2])  # rich lam = 0 moves its kernel most


def test_ntk_distance_resume_keeps_the_initial_kernel(tmp_path):
    dm = WhitenedRegression(n_in=3, n_out=3, num_samples=8, batches_per_epoch=20)
    make = lambda: DeepLinearNet(dims=[3, 3, 3], init=LambdaBalanced(lam=[0.0, 1.0], scale=0.2), lr=0.05)
    cb = NTKDistance(every_n_steps=10)
    trainer, _ = _fit(tmp_path, make(), dm, [cb], steps=20, name="a")
    ckpt = trainer.checkpoint_callback.best_model_path
    cb2 = NTKDistance(every_n_steps=10)
    _, acc = _fit(tmp_path, make(), dm, [cb2], steps=40, ckpt=ckpt, name="b")
    assert torch.equal(cb2.history["K0"][0], cb.history["K0"][0])
    assert cb2.history["steps"][0] == 0 and cb2.history["steps"][-1] == 40


def test_rsm_images_and_theory_and_png(tmp_path):
    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[0.0, 2.0], scale=0.01), lr=0.05, steps_per_batch=10)
    trainer, acc = _fit(tmp_path, net, SemanticHierarchy(batches_per_epoch=10), [RSM(every_n_steps=50)], steps=100)
    assert [e.step for e in acc.Images("rsm/input/lam=0")] == [0, 50, 100]
    assert len(acc.Images("rsm/output/lam=2/theory")) == 3
    assert any(p.name == "rsm.png" for p in (tmp_path / "tb").rglob("*.png"))


def test_rsm_without_theory_for_a_gaussian_init(tmp_path):
    net = DeepLinearNet(dims=[8, 8, 8], init=Gaussian(sigma=0.5), lr=0.05)
    assert net.lam_init() is None and net.predicted_qqt(torch.tensor([1.0]), torch.eye(8)) is None
    _, acc = _fit(tmp_path, net, SemanticHierarchy(batches_per_epoch=10), [RSM(every_n_steps=10)], steps=10)
    assert "rsm/input/member0" in acc.Tags()["images"]
    assert not any(t.endswith("/theory") for t in acc.Tags()["images"])


def test_phase_diagram_simulation_equals_plain_gradient_descent(tmp_path):
    from zoo.theory.phase import simulate_two_pathways

    lam1, lam2 = [0.0, 0.5, 1.0], [0.0, 0.05]
    net = DeepLinearNet(dims=[1, 2, 1], init=PathwayGrid(lam1=lam1, lam2=lam2, a0=1e-2), lr=0.02, steps_per_batch=50)
    net = net.double()
    cb = PhaseDiagram()
    trainer, acc = _fit(tmp_path, net, RankOne(n_in=1, n_out=1, s=1.0, d=1.0, num_samples=8), [cb], steps=500)
    share = simulate_two_pathways(torch.tensor(lam1)[:, None], torch.tensor(lam2)[None, :], s=1.0, lr=0.02,
                                  steps=500, a0=1e-2)
    assert np.allclose(cb.result["share"], share.numpy(), atol=1e-6)
    assert cb.result["escape"].shape == (3, 2)
    assert "phase/agreement" in acc.Tags()["scalars"]
    assert any(p.name == "phase_diagram.png" for p in (tmp_path / "tb").rglob("*.png"))


def test_phase_diagram_refuses_other_inits(tmp_path):
    net = DeepLinearNet(dims=[1, 2, 1], init=LambdaBalanced(lam=0.0), lr=0.02)
    with pytest.raises(TypeError, match="PathwayGrid"):
        _fit(tmp_path, net, RankOne(n_in=1, n_out=1), [PhaseDiagram()], steps=2)


def test_pathway_grid_sets_each_pathways_imbalance():
    W1, W2 = PathwayGrid(lam1=[0.0, 2.0], lam2=[0.5, 1.0, 1.5], omega0=0.01).weights([(2, 1), (1, 2)], ensemble=6,
                                                                                   dtype=torch.float64)
    lam = W2[:, 0, :] ** 2 - W1[:, :, 0] ** 2
    expected = torch.tensor([[0.0, 0.5], [0.0, 1.0], [0.0, 1.5], [2.0, 0.5], [2.0, 1.0], [2.0, 1.5]], dtype=torch.float64)
    assert torch.allclose(lam, expected, atol=1e-12)
    assert torch.allclose(W2[:, 0, :] * W1[:, :, 0], torch.full((6, 2), 0.01, dtype=torch.float64), atol=1e-12)
    with pytest.raises(ValueError, match="exactly one of 'omega0' and 'a0'"):
        PathwayGrid(omega0=0.1, a0=0.1)


def test_phase_agreement_counts_only_points_where_pathway_one_is_faster():
    from zoo.analysis.phase import phase_agreement

    lam1, lam2 = torch.tensor([0.0, 1.0, -2.0]), torch.tensor([0.5, 1.5])
    # rows lam1, columns lam2; the lam1 = 0 row and (1, 1.5) are outside |lam1| > |lam2|
    escape = torch.tensor([[9.0, 9.0], [5.0, 9.0], [float("nan"), 3.0]])  # NaN: never stalls
    share = torch.tensor([[0.9, 0.9], [0.01, 0.9], [0.3, 0.5]])
    # (1, 0.5): both specialised; (-2, 0.5): neither; (-2, 1.5): theory yes, simulation no
    assert phase_agreement(lam1, lam2, escape, share) == pytest.approx(2 / 3)
    assert phase_agreement(lam1, lam2, escape, share, threshold_steps=4.0) == 1.0  # (-2, 1.5): neither
    assert np.isnan(phase_agreement(torch.tensor([0.0]), lam2, escape[:1], share[:1]))
