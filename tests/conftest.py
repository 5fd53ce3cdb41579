"""Shared fixtures: runs happen in a temporary folder; the CLI runs in-process (imports are slow)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(*args: str):
    """Run the zoo's LightningCLI on ``args`` in this process; returns the CLI object."""
    from zoo.cli import build_cli

    return build_cli(list(args))
