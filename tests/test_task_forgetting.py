"""TaskForgetting: test metrics per task, forgetting of task 1 and its profile over shared classes,
checked against an independent evaluation of saved weights and hand-computed statistics."""
from __future__ import annotations

import copy
import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from callbacks.forgetting import Forgetting
from callbacks.task_forgetting import TaskForgetting, group_key, profile_shape_with_noise, profiles
from datamodules.mnist import MNISTContinual
from tests.conftest import quiet_trainer
from tests.test_mnist_continual import tiny_mnist
from zoo.classifier import MultiHeadClassifier
from zoo.init import EntropyMix, Gaussian


def test_group_key_drops_seed_and_k():
    assert group_key("gamma=0,sigma=0.1,gamma2=1,seed=3,k=2") == "gamma=0,sigma=0.1,gamma2=1"
    assert group_key("seed=0,k=5") == "all"
    assert group_key("gamma=0,seed=3,k=2,draw=1") == "gamma=0"  # digit draws repeat the experiment too


def test_profiles_are_mean_and_sample_sd_over_seeds():
    labels = [f"gamma={g},seed={s},k={k}" for g in (0, 1) for s in (0, 1, 2) for k in (0, 5)]
    values = np.arange(len(labels), dtype=float) ** 2
    prof = profiles(values, labels)
    assert set(prof) == {"gamma=0", "gamma=1"}
    # gamma=0, k=0: members 0, 2, 4 -> values 0, 4, 16
    p = prof["gamma=0"]
    np.testing.assert_allclose(p["x"], [0, 5])
    np.testing.assert_allclose(p["mean"][0], 20 / 3)
    np.testing.assert_allclose(p["std"][0], np.std([0, 4, 16], ddof=1))
    # gamma=1, k=5: members 7, 9, 11 -> 49, 81, 121
    np.testing.assert_allclose(prof["gamma=1"]["mean"][1], (49 + 81 + 121) / 3)
    np.testing.assert_array_equal(p["count"], [3, 3])
    # each run's (seed's) value at every k, in seed order
    np.testing.assert_allclose(p["runs"], [[0, 4, 16], [1, 9, 25]])
    with pytest.raises(ValueError, match="no 'k'"):
        profiles([1.0], ["gamma=0"])
    assert profiles([1.0, 2.0, 3.0], ["seed=0,k=0", "seed=1,k=0", "seed=0,k=1"])["all"]["runs"] is None  # unpaired


def test_a_shape_must_stand_out_of_the_seed_noise():
    x, count = [0, 1, 2, 3], [4, 4, 4, 4]
    hammer = [0.01, 0.05, 0.03, 0.0]
    # standard errors 0.005: the peak beats both ends by > 2 sqrt(2) 0.005 = 0.014
    s = profile_shape_with_noise(x, hammer, [0.01] * 4, count, tol=0.005)
    assert s["maslow"] and not s["monotonic"] and s["peak_gamma"] == 1
    # the same means with standard errors 0.02: within the noise, no shape at all; and not
    # monotonic either, since the mean rises by 0.04 > tol
    s = profile_shape_with_noise(x, hammer, [0.04] * 4, count, tol=0.005)
    assert not s["maslow"] and not s["monotonic"] and s["flat"]
    s = profile_shape_with_noise(x, [0.12, 0.09, 0.08, -0.01], [0.01] * 4, count, tol=0.005)
    assert s["monotonic"] and not s["maslow"] and not s["flat"]
    # paired runs: a hammer in every run on top of a level that differs between runs (digits,
    # seeds) is large per-point spread but a clear shape once the runs are paired
    level = np.array([0.0, 0.1, 0.2, 0.3])[None, :]
    runs = np.array([0.01, 0.05, 0.03, 0.0])[:, None] + level + np.array([[0, 0.002, -0.002, 0]]).T
    mean, std = runs.mean(1), runs.std(1, ddof=1)
    assert not profile_shape_with_noise(x, mean, std, count, tol=0.005)["maslow"]
    s = profile_shape_with_noise(x, mean, std, count, tol=0.005, runs=runs)
    assert s["maslow"] and s["peak_gamma"] == 1


class Snapshot(pl.Callback):
    """Keeps a copy of the module at the task switch (an independent record of the weights)."""

    def __init__(self, switch: int) -> None:
        self.switch, self.module = switch, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.switch:
            self.module = copy.deepcopy(pl_module).cpu()


def _run(tmp_path, existing=()):
    root = tiny_mnist(tmp_path / "data")
    dm = MNISTContinual(data_dir=str(root), shared=[0, 3, 5], batch_size=10, steps=[6, 6], seed=1)
    net = MultiHeadClassifier(hidden=16, lr=2.0, init_w=Gaussian(sigma=1.0),
                              init_heads=EntropyMix(gamma=0.0, sigma=0.5),
                              seed=[0, 1])
    cb = TaskForgetting(every_n_steps=4)
    snap = Snapshot(switch=6)
    # the teacher-student Forgetting serves a classifier too (errors from net.task_errors)
    trainer = quiet_trainer(tmp_path, [cb, snap, Forgetting(every_n_steps=4, source="mc")], existing=existing)
    trainer.fit(net, dm)
    return trainer, net, dm, cb, snap


def test_forgetting_equals_an_independent_evaluation(tmp_path):
    trainer, net, dm, cb, snap = _run(tmp_path, existing=("forgetting_vs_shared.png",))
    x, y = dm.test_set(0)
    with torch.no_grad():
        err_switch = 1 - snap.module.accuracy(x, y, 0)
        err_end = 1 - net.accuracy(x, y, 0)
        ce_switch = snap.module.member_loss(x, y, 0)
    expected = err_end - err_switch
    torch.testing.assert_close(cb.result["forgetting"], expected.double(), atol=1e-12, rtol=0)
    fg = next(c for c in trainer.callbacks if isinstance(c, Forgetting))
    torch.testing.assert_close(fg.final_errors[:, 0] - fg.switch_errors[0][:, 0], expected.double(), atol=1e-12, rtol=0)
    torch.testing.assert_close(cb.at_switch["loss"][:, 0], ce_switch.double(), atol=1e-6, rtol=1e-6)
    # training did change the first layer, so a zero forgetting everywhere would be suspicious
    assert not torch.equal(snap.module.W, net.W.cpu())
    # 2 initialisations x 3 data sets; the profile of each initialisation is over k = 0, 3, 5
    assert net.labels[:3] == ["seed=0,k=0", "seed=0,k=3", "seed=0,k=5"]
    prof = cb.result["profiles"]
    assert list(prof) == ["all"] and list(prof["all"]["x"]) == [0, 3, 5]
    f = cb.result["forgetting"].numpy()
    np.testing.assert_allclose(prof["all"]["mean"], f.reshape(2, 3).mean(0))
    # paired with k = 0: each seed's own difference, averaged; standard error over the 2 seeds
    diff = f.reshape(2, 3) - f.reshape(2, 3)[:, :1]
    np.testing.assert_allclose(prof["all"]["paired_mean"], diff.mean(0))
    np.testing.assert_allclose(prof["all"]["paired_se"], diff.std(0, ddof=1) / np.sqrt(2))
    # the figure is written next to the events, and the user's file of the same name is kept
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "forgetting_vs_shared.png").read_bytes() == b"a user's file"
    assert (folder / "forgetting_vs_shared_1.png").stat().st_size > 10_000
    # evaluations at the start, every 4 steps, the switch and the end (steps 0, 4, 6, 8, 12)
    assert cb.history["steps"] == [0, 4, 6, 8, 12]


def test_refuses_a_module_or_datamodule_it_cannot_read(tmp_path):
    from datamodules import RankOne
    from zoo import DeepLinearNet

    with pytest.raises(TypeError, match="TaskForgetting needs a module with accuracy"):
        quiet_trainer(tmp_path, [TaskForgetting()], logger=False).fit(
            DeepLinearNet(dims=[2, 2, 2]), RankOne(n_in=2, n_out=2))
    with pytest.raises(ValueError, match="metric = 'acc'; allowed"):
        TaskForgetting(metric="acc")
    # a classifier has test sets but no closed form: Forgetting's default source is refused before training
    root = tiny_mnist(tmp_path / "data")
    dm = MNISTContinual(data_dir=str(root), shared=0, batch_size=10, steps=[2, 2])
    net = MultiHeadClassifier(hidden=4)
    with pytest.raises(TypeError, match=r"Forgetting needs a module with theory_error\(\)"):
        quiet_trainer(tmp_path, [Forgetting()], logger=False).fit(net, dm)
    with pytest.raises(ValueError, match="source = 'theory'; allowed for a classifier: 'mc'"):
        net.task_errors(dm, "theory")
    with pytest.raises(ValueError, match="tol = -1"):
        TaskForgetting(tol=-1)


def test_per_draw_profiles_and_member_table_match_the_members(tmp_path):
    import csv

    root = tiny_mnist(tmp_path / "data")
    dm = MNISTContinual(data_dir=str(root), shared=[0, 2], batch_size=10, steps=[4, 4], seed=3, digit_draws=2,
                        first_task=[0, 1, 2, 3, 4])
    net = MultiHeadClassifier(hidden=8, lr=2.0, init_w=Gaussian(sigma=1.0), seed=[0, 1, 2])
    cb = TaskForgetting(every_n_steps=4, figure=False)
    quiet_trainer(tmp_path, [cb]).fit(net, dm)
    # members e = seed * 4 + set, sets ordered draw by draw: (k=0, d=0), (k=2, d=0), (k=0, d=1), (k=2, d=1)
    f = cb.result["forgetting"].numpy().reshape(3, 2, 2)  # (seed, draw, k)
    by_draw = cb.result["draw_profiles"]
    assert sorted(by_draw) == ["draw=0", "draw=1"]
    for d in (0, 1):
        np.testing.assert_allclose(by_draw[f"draw={d}"]["mean"], f[:, d].mean(0))
        np.testing.assert_array_equal(by_draw[f"draw={d}"]["count"], [3, 3])
    np.testing.assert_allclose(cb.result["profiles"]["all"]["mean"], f.mean((0, 1)))  # over seeds and draws
    rows = list(csv.DictReader(open(tmp_path / "tb" / "version_0" / "forgetting_members.csv")))
    assert [r["member"] for r in rows] == net.labels
    for e, r in enumerate(rows):
        task1, task2 = dm.digits[e % 4]
        assert r["task1_digits"] == " ".join(map(str, task1)) and r["task2_digits"] == " ".join(map(str, task2))
        assert sorted(task1) == [0, 1, 2, 3, 4] and len(set(task1) & set(task2)) == int(r["k"])
        assert r["draw"] == str((e % 4) // 2)
        np.testing.assert_allclose(float(r["forgetting"]), cb.result["forgetting"][e].item())
        np.testing.assert_allclose(float(r["task1_error_end"]) - float(r["task1_error_switch"]), float(r["forgetting"]),
                                   atol=1e-12)
        np.testing.assert_allclose(float(r["task2_error_end"]), cb.result["final"]["error"][e, 1].item())
    # where task 1's errors went, recomputed from the module's own predictions
    x, y = dm.test_set(0)
    with torch.no_grad():
        pred = net(x, 0).argmax(-1)
    target = net.member_targets(y)
    for e in range(net.ensemble):
        task1, task2 = dm.digits[e % 4]
        kept = [i for i, d in enumerate(task1) if d in task2]
        wrong = [i for i in range(len(target[e])) if pred[e, i] != target[e, i] and int(target[e, i]) not in kept]
        want = sum(int(pred[e, i]) in kept for i in wrong) / len(wrong) if wrong else math.nan
        np.testing.assert_equal(cb.result["to_kept"][e].item(), want)
        np.testing.assert_equal(float(rows[e]["task1_errors_to_kept"]), want)
    assert (cb.result["to_kept"].numpy().reshape(3, 2, 2)[:, :, 1] > 0).any()  # not all zero at k = 2


def test_errors_to_kept_counts_errors_on_dropped_digits_that_go_to_kept_labels():
    from callbacks.task_forgetting import errors_to_kept

    task1, task2 = [3, 7, 1, 0, 9], [3, 7, 5, 6, 8]  # digits 3 and 7 (labels 0, 1) kept
    target = torch.tensor([0, 1, 2, 2, 3, 4, 4, 2])
    pred = torch.tensor([1, 1, 0, 2, 1, 3, 0, 4])
    # errors on dropped digits (labels 2, 3, 4): items 2 (->0), 4 (->1), 5 (->3), 6 (->0), 7 (->4);
    # item 0 is an error on a kept digit and does not count; 3 of the 5 go to labels 0 or 1
    assert errors_to_kept(pred, target, task1, task2) == 3 / 5
    assert math.isnan(errors_to_kept(target, target, task1, task2))  # no errors
    assert errors_to_kept(pred, target, task1, [5, 6, 8, 2, 4]) == 0.0  # nothing kept
