"""Forgetting on teacher-student runs ([S] Sec. 4.2.1, Figs. 6 and 11): the logged forgetting and
transfer equal errors recomputed from saved weights, the ODE profile equals a direct integration,
members are grouped by (initialisation, gamma) correctly, figures are written, bad set-ups fail early."""
from __future__ import annotations

import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from helpers_fit import fit as fit_quietly
from lightning.pytorch.loggers import Logger

from callbacks.forgetting import Forgetting
from datamodules import TeacherStudent
from zoo import MultiHeadStudent
from zoo.init import Polar
from zoo.theory.meanfield import integrate



class MemoryLogger(Logger):
    """Keeps every logged scalar: ``metrics[tag] = [(step, value), ...]``."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, list[tuple[int, float]]] = {}

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        for k, v in metrics.items():
            self.metrics.setdefault(k, []).append((step, float(v)))


class SaveWeights(pl.Callback):
    """Copies of ``W`` and ``h`` at the end of every chunk, keyed by step."""

    def __init__(self) -> None:
        self.W, self.h = {}, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.W[pl_module.samples_seen] = pl_module.W.detach().double().clone()
        self.h[pl_module.samples_seen] = pl_module.h.detach().double().clone()


def fit(tmp_path, callbacks, *, d=60, gamma=(0.0, 0.5), theta=(0.0, math.pi / 4), steps=(600, 1200),
        steps_per_batch=200, logger=None, n_tasks=2, **dm_kw):
    dm = TeacherStudent(d=d, n_tasks=n_tasks, gamma=list(gamma), switch_step=steps[0] if n_tasks > 1 else None,
                        num_steps=steps[1], steps_per_batch=steps_per_batch, num_test=4000, seed=3, **dm_kw)
    net = MultiHeadStudent(d=d, n_tasks=n_tasks, init_heads=Polar(r=1.0, theta=list(theta)),
                           init_later_heads=Polar(r=0.1, theta=math.pi / 2), seed=1)
    return fit_quietly(net, dm, tmp_path, logger=logger or False, callbacks=callbacks), net, dm


def erf_error(W: torch.Tensor, h: torch.Tensor, WT: torch.Tensor, hT: torch.Tensor) -> float:
    """``eps = 1/2 <(h.phi(W x/sqrt d) - hT.phi(WT x/sqrt d))^2>`` of one member on one task, written out
    from docs/theory.md#generalisation-error (``I2 = (2/pi) asin(C12 / sqrt((1 + C11)(1 + C22)))``), independent of the zoo."""
    d = W.shape[-1]
    A = torch.cat([W, WT]).numpy()
    C = A @ A.T / d
    I2 = (2 / np.pi) * np.arcsin(C / np.sqrt(np.outer(1 + np.diag(C), 1 + np.diag(C))))
    v = np.concatenate([h.numpy(), -hT.numpy()])
    return 0.5 * float(v @ I2 @ v)


@pytest.mark.parametrize("source", ["theory", "mc"])
def test_logged_forgetting_and_transfer_equal_errors_recomputed_from_saved_weights(tmp_path, source):
    saved, lg = SaveWeights(), MemoryLogger()
    cb = Forgetting(every_n_steps=200, delta_alpha=400 / 60, source=source, ode=False, figure=False)  # tested below
    trainer, net, dm = fit(tmp_path, [saved, cb], logger=lg)
    x, y = dm.test_set()
    x = x.double()

    def eps(step, e, t):
        W, h = saved.W[step][e], saved.h[step][e, t]
        g = e % net.G
        if source == "theory":
            return erf_error(W, h, dm.W_teachers[g, t], dm.teacher_heads[g, t])
        y_hat = torch.erf(x @ W.T / math.sqrt(dm.d) / math.sqrt(2)) @ h  # Monte Carlo on the same test set
        return 0.5 * float((y_hat - y[:, t, g].double()).pow(2).mean())

    assert net.ensemble == 4
    for e, lbl in enumerate(net.labels):
        logged = lg.metrics[f"forgetting/{lbl}"]
        # logged from the switch on, every 200 steps, plus the final value
        assert [s for s, _ in logged] == [600, 800, 1000, 1200]
        for step, value in logged:
            want = eps(step, e, 0) - eps(600, e, 0)
            # float32 weights in the module vs their float64 copies: agreement to rounding
            assert value == pytest.approx(want, abs=1e-6)
        for step, value in lg.metrics[f"transfer/{lbl}"]:
            assert value == pytest.approx(eps(600, e, 1) - eps(step, e, 1), abs=1e-6)
        (step, value), = lg.metrics[f"forgetting_delta/{lbl}"]
        assert step == 1000 and value == pytest.approx(eps(1000, e, 0) - eps(600, e, 0), abs=1e-6)
        (step, value), = lg.metrics[f"forgetting_final/{lbl}"]
        assert step == 1200 and value == pytest.approx(eps(1200, e, 0) - eps(600, e, 0), abs=1e-6)
    # the test is not vacuous: task 1 was learnt a little, and task 2's training changed it
    assert any(abs(v) > 1e-3 for lbl in net.labels for _, v in lg.metrics[f"forgetting_final/{lbl}"])


def test_three_tasks_log_forgetting_of_each_finished_task(tmp_path):
    lg = MemoryLogger()
    dm_steps = dict(switch_step=[400, 800], num_steps=1200, steps_per_batch=200)
    dm = TeacherStudent(d=40, n_tasks=3, gamma=0.5, seed=0, **dm_steps)
    net = MultiHeadStudent(d=40, n_tasks=3, seed=0)
    cb = Forgetting(every_n_steps=400)
    fit_quietly(net, dm, tmp_path, logger=lg, callbacks=[cb])
    lbl = net.labels[0]
    assert [s for s, _ in lg.metrics[f"forgetting/{lbl}"]] == [400, 800, 1200]
    assert [s for s, _ in lg.metrics[f"forgetting/task2/{lbl}"]] == [800, 1200]
    assert [s for s, _ in lg.metrics[f"transfer/{lbl}"]] == [400]  # task 2 trains only until the second switch
    assert [s for s, _ in lg.metrics[f"transfer/task3/{lbl}"]] == [800, 1200]
    final = net.theory_error(dm.W_teachers, dm.teacher_heads)[0].double()
    assert lg.metrics[f"forgetting_final/task2/{lbl}"][0][1] == pytest.approx(float(final[1] - cb.history["switch_errors"][1][0, 1]), abs=1e-9)


@pytest.mark.parametrize("delta_alpha", [None, 4.0])
def test_ode_profile_of_a_member_equals_a_direct_integration(tmp_path, delta_alpha):
    d, gammas = 50, [0.5, 0.0, 1.0]  # unsorted on purpose: the profile sorts by gamma
    cb = Forgetting(every_n_steps=10_000, delta_alpha=delta_alpha)
    trainer, net, dm = fit(tmp_path, [cb], d=d, gamma=gammas, steps=(5 * d, 11 * d), steps_per_batch=d)
    r = cb.result
    group = "theta=0.7854"  # the second initialisation
    assert list(r["profiles"][group]["x"]) == [0.0, 0.5, 1.0]
    e = 1 * 3 + 1  # member e = i_init * G + i_gamma learns teacher set e mod G: gamma = gammas[1] = 0.0
    # a direct integration from this member's initial weights, order parameters computed here
    W0, WT = net.W_init[e].double(), dm.W_teachers[1]
    Q0 = W0 @ W0.T / d
    R0 = torch.einsum("id,tnd->tin", W0, WT) / d
    T = torch.einsum("tnd,smd->tsnm", WT, WT) / d
    traj = integrate(Q0, R0, T, net.h_init[e].double(), dm.teacher_heads[1], activation="erf", eta=1.0,
                     alpha_switch=5.0, alpha_end=11.0, d_alpha=0.01, record_every=0.5)
    i_end = traj.index(11.0 if delta_alpha is None else 5.0 + delta_alpha)
    want = float(traj.eps[0, i_end, 0] - traj.eps[0, traj.i_switch[0], 0])
    # the same Euler steps batched over 6 members vs alone: equal up to float64 rounding
    assert r["profiles_ode"][group]["mean"][0] == pytest.approx(want, abs=1e-10)
    assert abs(want) > 1e-3  # a real number to compare, not 0 = 0
    assert np.allclose(r["norms_ode"][group][0], traj.Q[0, -1].diagonal().sqrt().numpy(), atol=1e-10)
    # and the simulated forgetting is this member's, from its errors at the switch and at Delta
    read = cb.delta_errors if delta_alpha else r["end"]
    assert r["profiles"][group]["mean"][0] == pytest.approx(float(read[e, 0] - cb.history["switch_errors"][0][e, 0]),
                                                            abs=1e-12)
    pngs = list(tmp_path.rglob("forgetting_profile*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 10_000


def test_members_are_grouped_by_initialisation_and_gamma(tmp_path):
    lg = MemoryLogger()
    gammas = [0.3, 0.9, 0.0, 0.6]
    thetas = [0.0, 0.4, math.pi / 4]
    cb = Forgetting(every_n_steps=10_000, ode=False, figure=False)
    _, net, dm = fit(tmp_path, [cb], gamma=gammas, theta=thetas, steps=(200, 400), logger=lg)
    prof = cb.result["profiles"]
    assert list(prof) == ["theta=0", "theta=0.4", "theta=0.7854"]
    _, _, T = net.order_parameters(dm.W_teachers)
    for group, p in prof.items():
        assert list(p["x"]) == sorted(gammas)
        for g, value in zip(p["x"], p["mean"]):
            # the one member of this initialisation whose second teacher has overlap T^(1,2) = gamma ([S] Eq. 5)
            e, = [e for e in range(net.ensemble) if abs(float(T[e, 0, 1, 0, 0]) - g) < 1e-12
                  and abs(math.atan2(float(net.h_init[e, 0, 1]), float(net.h_init[e, 0, 0])) - p["params"]["theta"]) < 1e-6]
            assert value == pytest.approx(float(cb.result["forgetting"][e]), abs=1e-12)
            assert lg.metrics[f"forgetting_profile/{group}/gamma={g:g}"][0][1] == pytest.approx(value, abs=1e-6)
    assert cb.result["profiles_ode"] is None and not any(k.startswith("forgetting_profile_ode") for k in lg.metrics)


def test_grid_mode_draws_one_panel_per_initialisation(tmp_path):
    dm = TeacherStudent(d=40, gamma=[0.0, 1.0], switch_step=200, num_steps=400, steps_per_batch=200, seed=0)
    net = MultiHeadStudent(d=40, init_heads=Polar(r=1.0, theta=[0.0, math.pi / 16]),
                           init_later_heads=Polar(r=1.0, theta=[0.0, math.pi / 8, math.pi / 4]), grid=True)
    cb = Forgetting(every_n_steps=200, grid_rows="theta", grid_cols="theta2")
    fit_quietly(net, dm, tmp_path, callbacks=[cb])
    assert net.ensemble == 2 * 3 * 2 and len(cb.result["profiles"]) == 6
    assert list(cb.result["profiles"])[1] == "theta=0,theta2=0.3927"  # grid: theta2 varies fastest
    assert cb.result["png"].name == "forgetting_grid.png" and cb.result["png"].stat().st_size > 10_000


def test_bad_setups_fail_before_training(tmp_path):
    with pytest.raises(ValueError, match="no task switch"):
        fit(tmp_path, [Forgetting()], n_tasks=1, gamma=(0.5,), steps=(None, 400))
    with pytest.raises(ValueError, match="over = 'gamma' is not a parameter"):
        fit(tmp_path, [Forgetting(over="gamma")], gamma=(0.5,))  # one similarity: no profile
    with pytest.raises(ValueError, match="delta_alpha = 1.0 is not a batch end"):
        fit(tmp_path, [Forgetting(delta_alpha=1.0)])  # 60 steps after the switch: chunks are 200
    with pytest.raises(ValueError, match="delta_alpha = 16.* is not a batch end"):
        fit(tmp_path, [Forgetting(delta_alpha=1000 / 60)])  # beyond the end
    with pytest.raises(ValueError, match="grid_cols = 'xi'"):
        fit(tmp_path, [Forgetting(grid_rows="theta", grid_cols="xi")])
    for kw, name in ((dict(grid_rows="theta"), "grid_cols"), (dict(source="ode"), "source"),
                     (dict(delta_alpha=-1.0), "delta_alpha"), (dict(tol=-1), "tol"), (dict(unit="epochs"), "unit")):
        with pytest.raises(ValueError, match=f"Forgetting: {name} = "):
            Forgetting(**kw)


def test_switch_errors_survive_a_checkpoint():
    cb = Forgetting()
    cb.history["switch_errors"] = [torch.ones(2, 2)]
    cb.history["delta_errors"] = [torch.zeros(2, 2)]
    again = Forgetting()
    again.load_state_dict(cb.state_dict())
    assert torch.equal(again.history["switch_errors"][0], torch.ones(2, 2))
    assert torch.equal(again.delta_errors, torch.zeros(2, 2))
