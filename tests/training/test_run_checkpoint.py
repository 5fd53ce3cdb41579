"""RunCheckpoint's schedule and the CLI's checkpoint defaults (zoo.training.checkpoint, zoo.cli, zoo.cli.runs)."""
from __future__ import annotations

import pytest
import torch
from helpers_fit import fit

from zoo.training.checkpoint import RunCheckpoint
from zoo.cli.runs import newest_last_checkpoint, resumed_config_name, run_folder_of


class _Saves(RunCheckpoint):
    """Records the step of every save instead of only keeping the last file."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.saved: list[int] = []

    def _save_last(self, trainer):
        wrote = super()._save_last(trainer)
        if wrote:
            self.saved.append(trainer.global_step)
        return wrote


def _fit(tmp_path, cb, **trainer_kw):
    from datamodules import SemanticHierarchy
    from zoo import DeepLinearNet
    from zoo.init import LambdaBalanced

    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=0.0, scale=0.1), lr=0.05, steps_per_batch=3)
    return fit(net, SemanticHierarchy(batches_per_epoch=7), tmp_path, callbacks=[cb], enable_checkpointing=True, **trainer_kw)


def test_every_tenth_of_the_run_and_at_the_end(tmp_path):
    # 5 epochs x 7 batches x 3 steps = 105 steps: interval ceil(10.5) = 11; a batch takes 3 steps, so a
    # save is due at the first batch end past each multiple of 11, except where the epoch ends then
    # (saved at the epoch's end instead, same step), plus the end of the run
    cb = _Saves()
    _fit(tmp_path, cb, max_epochs=5)
    assert cb._interval == 11
    expected = sorted({((k * 11 + 2) // 3) * 3 for k in range(1, 10)} | {105})
    assert cb.saved == expected
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name != "last.ckpt"]


def test_max_steps_mid_epoch_saves_there(tmp_path):
    cb = _Saves(every_n_train_steps=1000)
    _fit(tmp_path, cb, max_steps=32)  # 32 is not a batch boundary of 3 steps: it stops at 33
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert cb.saved == [33] and ckpt["global_step"] == 33
    # saved after the batch, mid-epoch: the epoch is not counted as finished, so a resume continues it
    assert ckpt["epoch"] == 1
    progress = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert progress["processed"] == 4  # 33 steps = epoch 0 (7 batches) + 4 batches of epoch 1


def test_a_save_records_where_a_resumed_run_picks_up_its_curves(tmp_path):
    import time

    from zoo.training import resume_events

    before = time.time()
    trainer = _fit(tmp_path, _Saves(every_n_train_steps=1000), max_steps=12)
    after = time.time()
    point = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")[resume_events.KEY]
    assert point["step"] == trainer.global_step == 12  # the x-axis step of the weights saved
    assert before < point["saved_at"] < after


class _SavesWhere(_Saves):
    """Records (step, whether inside a validation) of every save."""

    def _save_last(self, trainer):
        wrote = RunCheckpoint._save_last(self, trainer)
        if wrote:
            self.saved.append((trainer.global_step, trainer.validating))
        return wrote


def test_a_validation_at_a_save_step_is_saved_with_it(tmp_path):
    # batches of 3 steps, a save every 6 steps, a validation every 2 batches: each save's step has a
    # validation after it, which Lightning does not run again on resuming, so the save is made again
    # after it (the points it logs then come before the checkpoint that a resumed run starts from)
    cb = _SavesWhere(every_n_train_steps=6)
    _fit(tmp_path, cb, max_steps=18, val_check_interval=2, num_sanity_val_steps=1)
    assert cb.saved == [(6, False), (6, True), (12, False), (12, True), (18, False), (18, True)]


class _SavesAfter(_Saves):
    """Records (step, validation batches run so far) of every save."""

    def _save_last(self, trainer):
        wrote = RunCheckpoint._save_last(self, trainer)
        if wrote:
            self.saved.append((trainer.global_step, trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed))
        return wrote


def test_max_steps_at_an_epochs_end_saves_once_after_its_validation(tmp_path):
    # 7 batches of 3 steps: max_steps 21 ends the run with the first epoch, whose validation (one
    # batch) runs after its last batch; the one save holds the state after it
    cb = _SavesAfter(every_n_train_steps=1000)
    _fit(tmp_path, cb, max_steps=21, num_sanity_val_steps=0)
    assert cb.saved == [(21, 1)]


@pytest.mark.parametrize("kw, match", [({"every": 0.0}, "every = 0.0"), ({"every": 1.5}, "every = 1.5"),
                                       ({"every_n_train_steps": 0}, "every_n_train_steps = 0")])
def test_bad_settings_name_the_parameter(kw, match):
    with pytest.raises(ValueError, match=match):
        RunCheckpoint(**kw)


def test_run_folders(tmp_path):
    root = tmp_path / "lightning_logs"
    assert newest_last_checkpoint(root) is None
    for v in (0, 3):
        (root / f"version_{v}" / "checkpoints").mkdir(parents=True)
        (root / f"version_{v}" / "checkpoints" / "last.ckpt").write_bytes(b"x")
    import os

    os.utime(root / "version_0" / "checkpoints" / "last.ckpt", (1e9, 1e9))  # older
    newest = newest_last_checkpoint(root)
    assert newest == root / "version_3" / "checkpoints" / "last.ckpt"
    assert run_folder_of(newest, root) == (root / "version_3").resolve()
    assert run_folder_of(tmp_path / "elsewhere.ckpt", root) is None
    assert resumed_config_name(root / "version_3", 40) == "config.yaml"
    (root / "version_3" / "config.yaml").write_text("a user's run")
    assert resumed_config_name(root / "version_3", 40) == "config_resumed_step40.yaml"
    (root / "version_3" / "config_resumed_step40.yaml").write_text("")
    assert resumed_config_name(root / "version_3", 40) == "config_resumed_step40_1.yaml"


def _trainer_callbacks(tmp_path, monkeypatch, *extra):
    from zoo.cli import build_cli

    monkeypatch.chdir(tmp_path)
    cli = build_cli(["--config", f"{REPO}/recipes/quickstart.yaml", *extra], run=False)
    return cli.trainer.callbacks


from conftest import REPO  # noqa: E402


def test_cli_adds_run_checkpoint_unless_told_otherwise(tmp_path, monkeypatch):
    from lightning.pytorch.callbacks import ModelCheckpoint

    cbs = _trainer_callbacks(tmp_path, monkeypatch)
    assert sum(isinstance(c, RunCheckpoint) for c in cbs) == 1
    assert not any(isinstance(c, ModelCheckpoint) and not isinstance(c, RunCheckpoint) for c in cbs)
    cbs = _trainer_callbacks(tmp_path, monkeypatch, "--trainer.enable_checkpointing=false")
    assert not any(isinstance(c, ModelCheckpoint) for c in cbs)
    own = ('--trainer.callbacks+={"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
           '"init_args": {"every_n_train_steps": 7}}')
    cbs = _trainer_callbacks(tmp_path, monkeypatch, own)
    ckpts = [c for c in cbs if isinstance(c, ModelCheckpoint)]
    assert len(ckpts) == 1 and not isinstance(ckpts[0], RunCheckpoint)


def test_ckpt_path_last_without_a_run_is_an_error(tmp_path, monkeypatch):
    from zoo.cli import build_cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="ckpt_path = 'last'"):
        build_cli(["fit", "--config", f"{REPO}/recipes/quickstart.yaml", "--ckpt_path", "last"])
