"""One x-axis for every scalar of a run (zoo.training.logs.log_step): a value measured on the weights after x
updates is logged at x, on the module's axis (``global_step``; ``samples_seen`` for the
teacher-student students), and a callback logs there whatever unit it schedules on."""
from __future__ import annotations

import pytest
import torch
from helpers_fit import fit

from helpers_mnist import tiny_mnist


def _events(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _fit(tmp_path, net, dm, callbacks, max_steps=-1):
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path, name="tb", version=0, default_hp_metric=False)
    trainer = fit(net, dm, tmp_path, logger=logger, callbacks=callbacks, max_steps=max_steps, log_every_n_steps=1)
    return trainer, _events(tmp_path / "tb" / "version_0")


def _steps(events, prefix: str) -> list[int]:
    tag = next(t for t in sorted(events) if t.startswith(prefix))
    return [s for s, _ in events[tag]]


def test_deep_linear_loss_and_callbacks_count_gd_steps(tmp_path):
    from callbacks.singular_values import SingularValues
    from datamodules.regression import SemanticHierarchy
    from zoo.models.deep_linear import DeepLinearNet

    net = DeepLinearNet(dims=[8, 8, 8], lr=0.05, steps_per_batch=10)
    W0 = [W.detach().clone() for W in net.W]
    trainer, ev = _fit(tmp_path, net, SemanticHierarchy(batches_per_epoch=10), [SingularValues(every_n_steps=10)], 40)
    assert trainer.global_step == 40
    # a batch of 10 GD steps logs the loss of the weights it started from, at that step
    assert [s for s, _ in ev["loss"]] == [0, 10, 20, 30]
    assert _steps(ev, "modes/") == [0, 10, 20, 30, 40]
    X, Y = next(iter(trainer.datamodule.train_dataloader()))  # the full batch: every batch is the task
    # the loss at x = 0 is the loss of the initial weights (computed here independently)
    initial = 0.5 * (X @ W0[0].transpose(-1, -2) @ W0[1].transpose(-1, -2) - Y).pow(2).sum(-1).mean(-1)
    assert ev["loss"][0][1] == pytest.approx(float(initial.mean()), rel=1e-5)


def test_gdln_loss_and_callbacks_count_epochs(tmp_path):
    from callbacks.gdln import PathwaySingularValues
    from datamodules import XorMargin
    from zoo.models.gdln import GDLN
    from zoo.init import Gaussian

    net = GDLN(gating="xor", n_hidden=8, init=Gaussian(sigma=0.1), lr=0.2, epochs_per_step=5)
    trainer, ev = _fit(tmp_path, net, XorMargin(Delta=0.5), [PathwaySingularValues(every_n_steps=5, n_modes=1)], 20)
    assert trainer.global_step == 20
    assert [s for s, _ in ev["loss"]] == [0, 5, 10, 15]
    assert _steps(ev, "pathway_sv/") == [0, 5, 10, 15, 20]


def test_student_loss_and_callbacks_count_sgd_steps(tmp_path):
    from callbacks.teacher_student import OrderParameters
    from datamodules import TeacherStudent
    from zoo import MultiHeadStudent
    from zoo.init import Gaussian, Polar

    net = MultiHeadStudent(d=20, activation="erf", eta=0.5, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=0.1))
    dm = TeacherStudent(d=20, num_steps=80, steps_per_batch=20, switch_step=40, num_test=50)
    trainer, ev = _fit(tmp_path, net, dm, [OrderParameters(every_n_steps=20, figure=False, error_curve=False)])
    assert trainer.global_step == 4 and net.samples_seen == 80  # four batches of 20 SGD steps
    # the loss of a block of SGD steps (its mean) is logged at the block's end
    assert [s for s, _ in ev["loss"]] == [20, 40, 60, 80]
    assert _steps(ev, "Q/") == [0, 20, 40, 60, 80]


def test_a_callback_on_samples_logs_on_the_classifier_steps(tmp_path):
    from callbacks.forgetting import Forgetting
    from datamodules.mnist import MNISTContinual
    from zoo.models.classifier import MultiHeadClassifier

    dm = MNISTContinual(str(tiny_mnist(tmp_path / "mnist")), shared=[0], batch_size=8, steps=[3, 3], seed=0)
    # scheduled every 16 training samples (2 batches of 8), the Forgetting default unit
    trainer, ev = _fit(tmp_path, MultiHeadClassifier(hidden=8, n_classes=5), dm, [Forgetting(every_n_steps=16)])
    assert trainer.global_step == 6
    assert [s for s, _ in ev["loss"]] == [0, 1, 2, 3, 4, 5]  # the loss of batch k: weights after k updates
    errors = _steps(ev, "error/task1")
    assert errors[0] == 0 and errors[-1] == trainer.global_step and set(errors) <= set(range(7))
    assert torch.tensor(errors).diff().ge(1).all()  # one point per due, never two at one step
    # validation at the end of the epoch: at the updates its weights have had (Lightning: one less)
    assert [s for s, _ in ev["val/task1/error"]] == [6]
