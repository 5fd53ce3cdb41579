"""Shared fixtures: runs happen in a temporary folder; the CLI runs in-process (imports are slow)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _zoo_cache(tmp_path_factory):
    """Tests never write into the user's cache folder (~/.cache/specialisation-zoo): extracted
    MNIST, generated files and verification markers go to one temporary cache per session."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ZOO_CACHE", str(tmp_path_factory.mktemp("zoo-cache")))
    yield
    patch.undo()


@pytest.fixture
def one_thread():
    """Pins torch to one thread for tests of tiny networks: they gain nothing from threads, and on
    a loaded CPU a second OpenMP thread makes every tiny op wait for a core (measured 30x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(*args: str):
    """Run the zoo's LightningCLI on ``args`` in this process; returns the CLI object."""
    from zoo.cli import build_cli

    return build_cli(list(args))


def quiet_trainer(tmp_path, callbacks, logger: bool = True, existing: tuple[str, ...] = ()):
    """A one-epoch CPU Trainer logging to ``tmp_path/tb/version_0``; ``existing`` files are put
    in that folder first (a user's files that callbacks must not overwrite)."""
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger

    lg = TensorBoardLogger(tmp_path, name="tb", version=0) if logger else False
    if logger:
        folder = tmp_path / "tb" / "version_0"
        folder.mkdir(parents=True)
        for name in existing:
            (folder / name).write_bytes(b"a user's file")
    return pl.Trainer(max_epochs=1, logger=lg, callbacks=callbacks, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                      default_root_dir=tmp_path)
