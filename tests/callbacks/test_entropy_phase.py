"""EntropyPhaseDiagram ([S] Figs. 5, 10): the grid cells hold the right members, the simulated and
ODE entropies equal direct computations, the figure and TensorBoard output are written, and a
module that is not a (sigma_w, r, theta) grid is refused before training."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.entropy_phase import EntropyPhaseDiagram
from datamodules import RankOne, TeacherStudent
from zoo import DeepLinearNet, MultiHeadStudent
from zoo.init import Gaussian, Polar, Xavier
from helpers_fit import trainer as quiet
from zoo.analysis.init_grid import init_grid, variance_explained
from zoo.theory.meanfield import integrate


D = 100
SIGMAS = [1e-3, 1e-1]  # 100x apart: a member's sample std of W (200 entries) cannot be mistaken
RS = [0.5, 2.0]
THETAS = [0.0, 0.3]
AXES = ("sigma", "r", "theta")


def student(**kw) -> MultiHeadStudent:
    args = dict(d=D, p=2, n_tasks=1, activation="erf", eta=1.0, grid=True, init_w=Gaussian(sigma=SIGMAS),
                init_heads=Polar(r=RS, theta=THETAS), seed=0)
    return MultiHeadStudent(**(args | kw))


def data(activation="erf", num_steps=1000) -> TeacherStudent:
    return TeacherStudent(d=D, p_star=1, n_tasks=1, activation=activation, num_steps=num_steps, steps_per_batch=100,
                          num_test=1000, seed=0)


def eq10(Q: torch.Tensor, h: torch.Tensor) -> dict[str, float]:
    """[S] Eq. 10 written out for one member (independent of zoo.metrics.overlaps)."""
    q = torch.diagonal(Q).double()
    q = q / q.sum()
    a = h.double().abs() / h.double().abs().sum()

    def H(x):
        x = x[x > 0]
        return float(-(x * x.log()).sum())

    return {"H_h": H(a), "H_Q": H(q), "H_m": H(q * a)}


def check_cells(net: MultiHeadStudent) -> None:
    """Every cell's member has that cell's sigma_w, r and theta in its own initial weights."""
    grid = init_grid(net.member_params, AXES)
    assert grid.member.shape == (2, 2, 2)
    assert [list(grid.values[a]) for a in AXES] == [SIGMAS, RS, THETAS]
    assert sorted(grid.member.ravel().tolist()) == list(range(8))
    for (i, j, k), e in np.ndenumerate(grid.member):
        h = net.h_init[e, 0].double()
        # the heads are stored in float32: relative rounding ~1e-7
        assert float(h.norm()) == pytest.approx(RS[j], rel=1e-6)
        assert float(torch.atan2(h[1], h[0])) == pytest.approx(THETAS[k], abs=1e-6)
        # sample std of 2 x 100 Gaussian entries: relative standard error 1/sqrt(400) = 5 %; 25 % is 5 SE
        assert float(net.W_init[e].double().std()) == pytest.approx(SIGMAS[i], rel=0.25)


def test_grid_cells_hold_the_members_with_those_initial_weights():
    check_cells(student())


def test_grid_order_is_read_from_the_members_not_assumed():
    # zipped lists that enumerate the same 8 cells in a shuffled order (grid: false)
    combos = list(itertools.product(SIGMAS, RS, THETAS))
    random.Random(1).shuffle(combos)
    net = student(grid=False, init_w=Gaussian(sigma=[c[0] for c in combos]),
                  init_heads=Polar(r=[c[1] for c in combos], theta=[c[2] for c in combos]))
    assert init_grid(net.member_params, AXES).member.ravel().tolist() != list(range(8))  # the shuffle changed the order
    check_cells(net)


@pytest.mark.slow
def test_fit_gives_eq10_of_the_simulation_and_of_a_separate_ode_call(tmp_path):
    cb = EntropyPhaseDiagram(every_n_steps=500)
    trainer = quiet(tmp_path, logger=True, callbacks=[cb], existing=("entropy_phase.png",))
    net, dm = student(), data()
    trainer.fit(net, dm)
    r, grid = cb.result, cb.grid
    assert r["step"] == 1000 and r["alpha"] == pytest.approx(1000 / D)

    # simulation: Eq. 10 of each member's trained weights, in its own cell
    Q = net.W.detach().double() @ net.W.detach().double().transpose(1, 2) / D
    for (i, j, k), e in np.ndenumerate(grid.member):
        direct = eq10(Q[e], net.h[e, 0])
        for H, v in direct.items():
            assert r["sim"][H][i, j, k] == pytest.approx(v, abs=1e-9)  # float64 both ways

    # ODE: one member integrated on its own to the same alpha gives the batched result
    cell = (1, 0, 1)
    e = int(grid.member[cell])
    Q0, R0, T = net.order_parameters(dm.W_teachers, initial=True)
    hT = net.member_teacher_heads(dm.teacher_heads)
    tr = integrate(Q0[e], R0[e], T[e], net.h_init[e].double(), hT[e], activation="erf", eta=1.0,
                   alpha_switch=[], alpha_end=1000 / D, d_alpha=0.01, record_every=1000 / D)
    assert float(tr.alpha[-1]) == pytest.approx(r["alpha"])
    direct = eq10(tr.Q[0, -1], tr.heads[0, -1, 0])
    for H, v in direct.items():
        # the same Euler arithmetic batched or alone: equal up to rounding (1e-12 over 1000 steps)
        assert r["ode"][H][cell] == pytest.approx(v, abs=1e-9)
    # and the ODE's error is that member's [S] Eq. 9 at the ODE's end
    assert r["ode_error"][cell] == pytest.approx(float(tr.eps[0, -1, 0]), abs=1e-12)

    # the agreement scalars are what they say
    for H in ("H_m", "H_Q", "H_h"):
        assert r["mean_abs_diff"][H] == pytest.approx(float(np.abs(r["sim"][H] - r["ode"][H]).mean()))
        assert r["var_explained"]["sim"][H] == variance_explained(r["sim"][H], AXES)

    # the PNG is written beside the user's file, which is left alone
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "entropy_phase.png").read_bytes() == b"a user's file"
    assert r["path"].parent == folder and r["path"].name != "entropy_phase.png"
    assert r["path"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    # recorded at the start, every 500 steps and at the end (1000 is both)
    assert [ev.step for ev in acc.Scalars("entropy_phase/H_m/mean_abs_diff")] == [0, 500, 1000]
    assert acc.Scalars("entropy_phase/H_m/mean_abs_diff")[0].value == pytest.approx(0.0, abs=1e-12)  # same start
    assert acc.Scalars("entropy_phase/sim/H_m/var_explained/theta")[-1].value == pytest.approx(
        r["var_explained"]["sim"]["H_m"]["theta"], rel=1e-6)
    assert {"entropy_phase/error/median", "entropy_phase/error/fraction_converged",
            "entropy_phase/H_Q/same_side"} <= set(acc.Tags()["scalars"])
    assert {"entropy_phase/H_m", "entropy_phase/H_Q", "entropy_phase/H_h"} <= set(acc.Tags()["images"])
    assert [ev.step for ev in acc.Images("entropy_phase/H_m")] == [0, 500, 1000]


def test_variance_explained_of_grids_with_known_structure():
    axes = ("sigma_w", "r", "theta")
    s, r, t = np.meshgrid(np.arange(3.0), np.arange(4.0), np.arange(5.0), indexing="ij")
    assert variance_explained(np.sin(t), axes) == pytest.approx({"sigma_w": 0.0, "r": 0.0, "theta": 1.0})
    # additive effects: shares are the variances of each term (var(2 s) = 4 * 2/3, var(t) = 2)
    shares = variance_explained(2 * s + t, axes)
    assert shares == pytest.approx({"sigma_w": (8 / 3) / (8 / 3 + 2), "r": 0.0, "theta": 2 / (8 / 3 + 2)})
    # a pure interaction of centred contrasts has no main effect
    assert variance_explained((s - 1) * (t - 2), axes) == pytest.approx({"sigma_w": 0.0, "r": 0.0, "theta": 0.0}, abs=1e-12)
    assert variance_explained(np.ones((2, 2, 2)), axes) == {"sigma_w": 0.0, "r": 0.0, "theta": 0.0}


@pytest.mark.parametrize("make, match", [
    (lambda: student(grid=False), "do not fill the grid"),  # zipped lists: 2 members, 2x2x2 cells
    (lambda: student(init_heads=Gaussian(sigma=[0.1, 1.0])), "axes"),  # no r, theta: other parameters vary
    (lambda: student(init_w=Xavier(gain=[0.5, 1.0])), "share the cell"),  # gain varies, no sigma axis
    (lambda: student(seed=[0, 1]), "share the cell"),  # a seed axis doubles every cell
])
def test_a_module_that_is_not_a_sigma_r_theta_grid_is_refused_before_training(tmp_path, make, match):
    trainer = quiet(tmp_path, callbacks=[EntropyPhaseDiagram()], logger=False)
    net = make()
    with pytest.raises(ValueError, match=match):
        trainer.fit(net, data())
    assert trainer.global_step == 0


def test_other_modules_and_sigmoid_with_ode_are_refused(tmp_path):
    trainer = quiet(tmp_path, callbacks=[EntropyPhaseDiagram()], logger=False)
    with pytest.raises(TypeError, match="EntropyPhaseDiagram needs"):
        trainer.fit(DeepLinearNet(dims=[1, 2, 1]), RankOne(n_in=1, n_out=1))
    trainer = quiet(tmp_path, callbacks=[EntropyPhaseDiagram()], logger=False)
    with pytest.raises(ValueError, match="ode: false"):
        trainer.fit(student(activation="sigmoid"), data(activation="sigmoid"))
    assert trainer.global_step == 0


@pytest.mark.parametrize("kw", [dict(every_n_steps=0), dict(threshold=1.5), dict(d_alpha=-0.1), dict(converged=0.0)])
def test_bad_arguments_are_clear_errors(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        EntropyPhaseDiagram(**kw)
