"""zoo.training.checkpoint.AtomicLocalCheckpointIO: whole files or none, and RunCheckpoint's use of it (and its state key)."""
from __future__ import annotations

import os

import pytest
import torch
from helpers_fit import trainer as quiet
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from zoo.training.checkpoint import AtomicLocalCheckpointIO, RunCheckpoint


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot be saved")


def test_writes_what_torch_load_reads_and_leaves_no_part_file(tmp_path):
    path = tmp_path / "deeper" / "last.ckpt"  # the folder is made
    first = {"global_step": 3, "state_dict": {"w": torch.arange(6.0).view(2, 3)}}
    AtomicLocalCheckpointIO().save_checkpoint(first, path)
    second = {"global_step": 7, "state_dict": {"w": -torch.ones(4)}}
    AtomicLocalCheckpointIO().save_checkpoint(second, str(path))  # replaces it
    back = torch.load(path, weights_only=False)
    assert back["global_step"] == 7 and torch.equal(back["state_dict"]["w"], second["state_dict"]["w"])
    assert os.listdir(path.parent) == ["last.ckpt"]
    # the same bytes as Lightning's own save of the same dict: only the way to the file differs
    TorchCheckpointIO().save_checkpoint(second, tmp_path / "lightning.ckpt")
    assert path.read_bytes() == (tmp_path / "lightning.ckpt").read_bytes()


def test_a_failed_save_keeps_the_previous_file_whole(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicLocalCheckpointIO().save_checkpoint({"global_step": 1}, path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="cannot be saved"):
        AtomicLocalCheckpointIO().save_checkpoint({"global_step": 2, "bad": Unpicklable()}, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["last.ckpt"]
    # a failure while writing the part file (here: its name is taken by a folder) leaves it too
    os.mkdir(f"{path}.part-{os.getpid()}")
    with pytest.raises(OSError):
        AtomicLocalCheckpointIO().save_checkpoint({"global_step": 3}, path)
    assert path.read_bytes() == before


class _SeesIO(RunCheckpoint):
    """Records the trainer's checkpoint IO at each save."""

    def __init__(self) -> None:
        super().__init__(every_n_train_steps=3)
        self.seen: list[type] = []

    def _save_last(self, trainer):
        self.seen.append(type(trainer.strategy.checkpoint_io))
        return super()._save_last(trainer)


def _fit(tmp_path, plugins=None):
    from datamodules import SemanticHierarchy
    from zoo import DeepLinearNet
    from zoo.init import LambdaBalanced

    cb = _SeesIO()
    trainer = quiet(tmp_path, callbacks=[cb], max_steps=6, plugins=plugins, enable_checkpointing=True)
    before = trainer.strategy.checkpoint_io
    trainer.fit(DeepLinearNet(dims=[8, 4, 8], init=LambdaBalanced(lam=0.0, scale=0.1), lr=0.05, steps_per_batch=3),
                SemanticHierarchy(batches_per_epoch=2))
    return cb, before, trainer


def test_run_checkpoint_saves_through_it_and_gives_the_trainers_io_back(tmp_path):
    cb, before, trainer = _fit(tmp_path)
    assert cb.seen and set(cb.seen) == {AtomicLocalCheckpointIO}
    assert trainer.strategy.checkpoint_io is before and type(before) is TorchCheckpointIO
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 6
    # the callback's state under ModelCheckpoint's own key (RunCheckpoint builds it once only)
    assert list(ckpt["callbacks"]) == [ModelCheckpoint.state_key.fget(cb)] == [cb.state_key]
    assert os.listdir(tmp_path / "checkpoints") == ["last.ckpt"]


class OwnIO(TorchCheckpointIO):
    """A user's checkpoint plugin."""


def test_a_checkpoint_plugin_of_the_users_is_kept(tmp_path):
    cb, before, trainer = _fit(tmp_path, plugins=[OwnIO()])
    assert set(cb.seen) == {OwnIO} and trainer.strategy.checkpoint_io is before
