"""Every callback fires when due, writes the tags it documents, and costs nothing otherwise."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers_fit import fit
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import Balance, NetworkMap, SingularValues
from callbacks.base import PeriodicCallback
from datamodules import SemanticHierarchy
from zoo import DeepLinearNet
from zoo.init import LambdaBalanced



def _fit(tmp_path, callbacks, steps=40, steps_per_batch=1, aligned=True, logger=True):
    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-2.0, 2.0], scale=0.01), lr=0.05,
                        task_aligned=aligned, steps_per_batch=steps_per_batch)
    return fit(net, SemanticHierarchy(batches_per_epoch=10), tmp_path, logger=logger, callbacks=callbacks,
               max_steps=steps, log_every_n_steps=1), net


def _events(trainer):
    acc = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


@pytest.mark.parametrize("steps_per_batch", [1, 5])
def test_singular_values_fires_every_n_steps_with_theory_and_png(tmp_path, steps_per_batch):
    trainer, net = _fit(tmp_path, [SingularValues(every_n_steps=10)], steps_per_batch=steps_per_batch)
    acc = _events(trainer)
    steps = [e.step for e in acc.Scalars("modes/lam=-2/a0")]
    assert steps == [0, 10, 20, 30, 40]
    theory = acc.Scalars("modes/lam=2/a0_theory")
    sim = acc.Scalars("modes/lam=2/a0")
    assert [e.step for e in theory] == steps
    # the logged theory is the module's closed form at that step
    m = trainer.datamodule.modes()
    pred = net.predicted_mode_strengths(torch.tensor(steps), m)
    assert [e.value for e in theory] == pytest.approx(pred[1, :, 0].tolist(), rel=1e-5)
    assert abs(sim[-1].value - theory[-1].value) < 0.05 * abs(theory[-1].value) + 1e-3
    pngs = list((tmp_path / "tb").glob("version_*/singular_values.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 10_000


def test_balance_logs_deviation_lam_and_images(tmp_path):
    trainer, net = _fit(tmp_path, [Balance(every_n_steps=20)])
    acc = _events(trainer)
    assert [e.step for e in acc.Scalars("balance/deviation/lam=2")] == [0, 20, 40]
    assert acc.Scalars("balance/deviation/lam=2")[0].value == 0.0
    # B(0) = lam I exactly, so the mean diagonal moves by at most the largest entry's deviation
    lam_end, dev_end = acc.Scalars("balance/lam/lam=-2")[-1].value, acc.Scalars("balance/deviation/lam=-2")[-1].value
    assert abs(lam_end + 2.0) <= dev_end + 1e-6 and 0 < dev_end < 0.05
    assert len(acc.Images("balance/lam=-2")) == 2  # start and end


def test_network_map_logs_member_and_target_images(tmp_path):
    trainer, _ = _fit(tmp_path, [NetworkMap(every_n_steps=20)])
    acc = _events(trainer)
    assert len(acc.Images("map/target")) == 1
    assert [e.step for e in acc.Images("map/lam=2")] == [0, 20, 40]


def test_images_without_tensorboard_warn_once_and_skip(tmp_path):
    with pytest.warns(UserWarning, match="need a TensorBoardLogger") as record:
        _fit(tmp_path, [NetworkMap(every_n_steps=10)], steps=20, logger=False)
    ours = [w for w in record if "TensorBoardLogger" in str(w.message)]
    assert len(ours) == 1
    # the warning points at the code that decided to skip (a warn_once call), not into warn_once
    line = open(ours[0].filename).read().splitlines()[ours[0].lineno - 1]
    assert "warn_once(" in line and "def warn_once" not in line


def test_periodic_callback_is_due_only_when_a_multiple_is_crossed():
    cb = PeriodicCallback(every_n_steps=10)

    class T:
        global_step = 0

    t, fired = T(), []
    for g in [1, 2, 9, 10, 11, 25, 30, 31, 47, 50]:
        t.global_step = g
        if cb.due(t, None):
            fired.append(g)
    assert fired == [10, 25, 30, 47, 50]
    with pytest.raises(ValueError, match="every_n_steps = 0"):
        PeriodicCallback(every_n_steps=0)


def test_callbacks_refuse_a_module_without_what_they_read(tmp_path):
    class Plain(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def training_step(self, batch, i):
            return (self.lin(batch[0]) - batch[1]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(TypeError, match=r"SingularValues needs a module with mode_strengths\(\); Plain has none"):
        fit(Plain(), SemanticHierarchy(), callbacks=[SingularValues()], max_steps=2)
