"""Forgetting on the MNIST classifier ([S] App. G, Fig. 12): errors per task, forgetting of task 1
and its profile over shared classes k, checked against an independent evaluation of saved weights
and hand-computed statistics (the profile over seeds and digit draws, paired differences, the table)."""
from __future__ import annotations

import copy
import csv

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from callbacks.forgetting import Forgetting
from datamodules.mnist import MNISTContinual
from helpers_fit import trainer as quiet
from zoo.models.classifier import MultiHeadClassifier
from zoo.init import EntropyMix, Gaussian

from tests.helpers_mnist import tiny_mnist



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
    cb = Forgetting(every_n_steps=4, unit="steps", tol=0.005)
    snap = Snapshot(switch=6)
    trainer = quiet(tmp_path, logger=True, callbacks=[cb, snap], existing=existing)
    trainer.fit(net, dm)
    return trainer, net, dm, cb, snap


def test_forgetting_equals_an_independent_evaluation(tmp_path):
    trainer, net, dm, cb, snap = _run(tmp_path, existing=("forgetting_profile.png",))
    assert cb.source == "mc"  # a classifier has no closed form: the test sets
    x, y = dm.test_set(0)
    with torch.no_grad():
        err_switch = 1 - snap.module.accuracy(x, y, 0)
        err_end = 1 - net.accuracy(x, y, 0)
    expected = err_end - err_switch
    torch.testing.assert_close(cb.result["forgetting"], expected.double(), atol=1e-12, rtol=0)
    # training did change the first layer, so a zero forgetting everywhere would be suspicious
    assert not torch.equal(snap.module.W, net.W.cpu())
    # 2 initialisations (seeds) x 3 data sets; one profile over k = 0, 3, 5, averaged over the seeds
    prof = cb.result["profiles"]
    assert list(prof) == ["all"] and list(prof["all"]["x"]) == [0, 3, 5]
    f = cb.result["forgetting"].numpy().reshape(2, 3)  # (seed, k)
    np.testing.assert_allclose(prof["all"]["mean"], f.mean(0))
    np.testing.assert_allclose(prof["all"]["runs"], f.T)  # each seed's own profile: paired
    # the figure is written next to the events, and the user's file of the same name is kept
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "forgetting_profile.png").read_bytes() == b"a user's file"
    assert (folder / "forgetting_profile_1.png").stat().st_size > 10_000


def test_refuses_a_module_or_datamodule_it_cannot_read(tmp_path):
    from datamodules import RankOne
    from zoo import DeepLinearNet

    with pytest.raises(TypeError, match=r"Forgetting needs a module with task_errors\(\)"):
        quiet(tmp_path, callbacks=[Forgetting()], logger=False).fit(DeepLinearNet(dims=[2, 2, 2]), RankOne(n_in=2, n_out=2))
    root = tiny_mnist(tmp_path / "data")
    dm = MNISTContinual(data_dir=str(root), shared=0, batch_size=10, steps=[2, 2])
    net = MultiHeadClassifier(hidden=4)
    with pytest.raises(ValueError, match="source = 'theory' has no closed form for activation 'sigmoid'"):
        quiet(tmp_path, callbacks=[Forgetting(source="theory")], logger=False).fit(net, dm)


def test_per_draw_profiles_paired_differences_and_member_table(tmp_path):
    root = tiny_mnist(tmp_path / "data")
    dm = MNISTContinual(data_dir=str(root), shared=[0, 2], batch_size=10, steps=[4, 4], seed=3, digit_draws=2,
                        first_task=[0, 1, 2, 3, 4])
    net = MultiHeadClassifier(hidden=8, lr=2.0, init_w=Gaussian(sigma=1.0), seed=[0, 1, 2])
    cb = Forgetting(every_n_steps=4, unit="steps", table=True, tol=0.005)
    lg = pl.loggers.CSVLogger(tmp_path, name="csv")
    trainer = quiet(tmp_path, logger=True, callbacks=[cb])
    trainer.loggers = [*trainer.loggers, lg]
    trainer.fit(net, dm)
    # members e = seed * 4 + set, sets ordered draw by draw: (k=0, d=0), (k=2, d=0), (k=0, d=1), (k=2, d=1)
    f = cb.result["forgetting"].numpy().reshape(3, 2, 2)  # (seed, draw, k)
    np.testing.assert_allclose(cb.result["profiles"]["all"]["mean"], f.mean((0, 1)))  # over seeds and draws
    lg.save()
    rows = list(csv.DictReader(open(lg.log_dir + "/metrics.csv")))
    logged = {k: float(v) for r in rows for k, v in r.items() if v not in ("", None) and k != "step"}
    for d in (0, 1):  # one profile per digit draw, the mean over seeds
        for j, k in enumerate((0, 2)):
            assert logged[f"forgetting_by_draw/draw={d}/k={k}"] == pytest.approx(f[:, d, j].mean(), abs=1e-6)
    # each run's (seed and draw) difference from k = 0, averaged, and its standard error
    diff = (f[:, :, 1] - f[:, :, 0]).ravel()
    assert logged["forgetting_profile/all/paired/k=2-k=0"] == pytest.approx(diff.mean(), abs=1e-6)
    assert logged["forgetting_profile/all/paired_se/k=2-k=0"] == pytest.approx(diff.std(ddof=1) / np.sqrt(6), abs=1e-6)
    table = list(csv.DictReader(open(tmp_path / "tb" / "version_0" / "forgetting_members.csv")))
    assert len(table) == net.ensemble
    for e, r in enumerate(table):
        assert float(r["k"]) == (0, 2)[e % 2] and float(r["draw"]) == (e % 4) // 2 and float(r["seed"]) == e // 4
        np.testing.assert_allclose(float(r["forgetting"]), cb.result["forgetting"][e].item())
        np.testing.assert_allclose(float(r["task1_error_end"]) - float(r["task1_error_switch"]), float(r["forgetting"]),
                                   atol=1e-12)
        np.testing.assert_allclose(float(r["task2_error_end"]), cb.result["end"][e, 1].item())
