"""ErrorCurves: logs every task's error per member, draws the grouped figure, rejects bad keys."""
from __future__ import annotations

import pytest
import torch
from helpers_fit import fit as fit_quietly
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.error_curves import ErrorCurves
from datamodules import TeacherStudent
from zoo import MultiHeadStudent
from zoo.init import Polar



def fit(tmp_path, callback, **net_kw):
    dm = TeacherStudent(d=30, num_steps=1200, switch_step=600, steps_per_batch=200)
    net = MultiHeadStudent(d=30, init_heads=Polar(r=1.0, theta=[0.0, 0.5]), **net_kw)
    return fit_quietly(net, dm, tmp_path, logger=True, callbacks=[callback]), net, dm


def test_logs_the_errors_of_the_order_parameters_and_writes_the_figure(tmp_path):
    cb = ErrorCurves(every_n_steps=400, group_by="theta")
    trainer, net, dm = fit(tmp_path, cb)
    assert cb.history["steps"] == [0, 400, 800, 1200]
    final = net.theory_error(dm.W_teachers, dm.teacher_heads)
    assert torch.allclose(cb.history["errors"][-1], final)
    ea = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0})
    ea.Reload()
    logged = ea.Scalars("error/theta=0.5/task1")
    assert [e.step for e in logged] == [0, 400, 800, 1200]
    assert abs(logged[-1].value - float(final[1, 1])) < 1e-6
    assert (tmp_path / "lightning_logs" / "version_0" / "error_curves.png").exists() or any(
        p.name == "error_curves.png" for p in (tmp_path).rglob("*.png"))


def test_unknown_group_key_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="group_by = 'xi' is not a parameter of every member"):
        fit(tmp_path, ErrorCurves(every_n_steps=400, group_by="xi"))


def test_bad_source():
    with pytest.raises(ValueError, match="source"):
        ErrorCurves(source="ode")
