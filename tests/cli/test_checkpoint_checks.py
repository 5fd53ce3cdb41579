"""zoo.cli.checkpoint_checks: a checkpoint of another model, or with other settings, is refused before training."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import REPO

QS = str(REPO / "recipes" / "quickstart.yaml")


def _net(**kw):
    from zoo.models.deep_linear import DeepLinearNet

    return DeepLinearNet(**{"dims": [4, 3, 4], "lr": 0.05, **kw})


def _save(path, model, class_path="zoo.DeepLinearNet", hparams=True):
    """A checkpoint as Lightning writes it, for what the check reads: state_dict and hyper_parameters."""
    ckpt = {"state_dict": model.state_dict()}
    if hparams:
        ckpt["hyper_parameters"] = {"_class_path": class_path, **model.hparams}
    torch.save(ckpt, path)
    return path


def test_a_matching_checkpoint_passes(tmp_path):
    from zoo.cli.checkpoint_checks import check_checkpoint

    assert check_checkpoint(_save(tmp_path / "a.ckpt", _net()), _net()) is None
    assert check_checkpoint(None, _net()) is None
    assert check_checkpoint("last", _net()) is None  # Lightning resolves it itself


def test_missing_and_garbage_files(tmp_path):
    from zoo.cli.checkpoint_checks import CheckpointMismatch, check_checkpoint

    with pytest.raises(FileNotFoundError, match=r"ckpt_path = '.*nope.ckpt': no such file"):
        check_checkpoint(tmp_path / "nope.ckpt", _net())
    (tmp_path / "g.ckpt").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointMismatch, match=r"g.ckpt'.*not a readable checkpoint"):
        check_checkpoint(tmp_path / "g.ckpt", _net())
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointMismatch, match="no state_dict"):
        check_checkpoint(tmp_path / "other.pt", _net())


def test_another_model_class_is_named_with_both_classes(tmp_path):
    from zoo.cli.checkpoint_checks import CheckpointMismatch, check_checkpoint
    from zoo.models.student import MultiHeadStudent

    student = MultiHeadStudent(d=10)
    path = _save(tmp_path / "s.ckpt", student, class_path="zoo.MultiHeadStudent")
    with pytest.raises(CheckpointMismatch) as err:
        check_checkpoint(path, _net())
    msg = str(err.value)
    assert "s.ckpt" in msg and "DeepLinearNet in the config" in msg and "zoo.MultiHeadStudent in the checkpoint" in msg
    # the same class under another import path (a re-export) is the same class
    assert check_checkpoint(_save(tmp_path / "d.ckpt", _net(), "zoo.models.deep_linear.DeepLinearNet"), _net()) is None


def test_conflicting_hyperparameters_name_the_setting_and_both_values(tmp_path):
    from zoo.cli.checkpoint_checks import CheckpointMismatch, check_checkpoint, hparam_conflicts

    path = _save(tmp_path / "a.ckpt", _net())
    with pytest.raises(CheckpointMismatch) as err:
        check_checkpoint(path, _net(dims=[4, 2, 4], lr=0.1))
    msg = str(err.value)
    assert "model.init_args.dims = [4, 2, 4] in the config but [4, 3, 4] in the checkpoint" in msg
    assert "model.init_args.lr = 0.1 in the config but 0.05 in the checkpoint" in msg
    # nested settings by their dotted name; None (inferred at setup) and bookkeeping keys are not compared
    given = {"init": {"init_args": {"lam": [0.0, 1.0]}}, "ensemble": None, "_class_path": "x", "seed": 0}
    stored = {"init": {"init_args": {"lam": [0.0, 2.0]}}, "ensemble": 2, "_class_path": "y", "seed": 0}
    assert list(hparam_conflicts(given, stored)) == [("init.init_args.lam", [0.0, 1.0], [0.0, 2.0])]


def test_without_stored_hyperparameters_the_weight_shapes_decide(tmp_path):
    from zoo.cli.checkpoint_checks import CheckpointMismatch, check_checkpoint

    path = _save(tmp_path / "a.ckpt", _net(), hparams=False)
    assert check_checkpoint(path, _net()) is None
    with pytest.raises(CheckpointMismatch, match=r"W0_init has shape \(1, 2, 4\) in the model but \(1, 3, 4\)"):
        check_checkpoint(path, _net(dims=[4, 2, 4]))


def test_cli_refuses_a_conflicting_checkpoint_and_resumes_a_matching_one(in_tmp, capsys):
    """Through the CLI: Lightning alone would train the quickstart checkpoint with its own dims and
    exit 0; the zoo stops with the setting named. The matching resume still trains on."""
    from zoo.cli import build_cli, main

    quiet = ["--trainer.enable_progress_bar=false", "--trainer.callbacks=null", "--trainer.enable_model_summary=false"]
    first_run = build_cli(["fit", "--config", QS, "--trainer.max_steps=2", *quiet]).trainer.global_step
    (ckpt,) = (in_tmp / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt")
    capsys.readouterr()  # what that run logged
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", QS, f"--ckpt_path={ckpt}", "--model.init_args.dims=[8,4,8]", *quiet])
    first = capsys.readouterr().err.splitlines()[0]
    assert stop.value.code == 2
    assert str(ckpt) in first and "dims = [8, 4, 8] in the config but [8, 8, 8] in the checkpoint" in first
    assert not (in_tmp / "lightning_logs" / "version_1").exists()
    cli = build_cli(["fit", "--config", QS, f"--ckpt_path={ckpt}", f"--trainer.max_steps={2 * first_run}", *quiet])
    assert first_run > 0 and cli.trainer.global_step == 2 * first_run  # resumed where the first run stopped
