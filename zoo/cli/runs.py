"""Run folders: where a run's checkpoints live, which run ``--ckpt_path last`` means, and how a resumed
run keeps logging into the folder it resumes (one continuous TensorBoard curve).

A run folder is what the logger makes, ``<save_dir>/<name>/version_N/``, holding
``checkpoints/last.ckpt`` (``zoo.training.checkpoint.RunCheckpoint``), ``config.yaml``, ``hparams.yaml`` and
the event files. Pure path logic; the CLI (``zoo.cli``) wires it in.
"""
from __future__ import annotations

import re
from pathlib import Path

LAST = "last.ckpt"


def newest_last_checkpoint(root: str | Path) -> Path | None:
    """The most recently written ``version_*/checkpoints/last.ckpt`` under ``root`` (a logger's
    ``<save_dir>/<name>``), or None."""
    found = [p for p in Path(root).glob(f"version_*/checkpoints/{LAST}") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_folder_of(checkpoint: str | Path, root: str | Path) -> Path | None:
    """The run folder a checkpoint belongs to, if it sits at ``<root>/version_N/checkpoints/*.ckpt``."""
    path = Path(checkpoint).resolve()
    folder = path.parent.parent
    if path.parent.name == "checkpoints" and folder.parent == Path(root).resolve() and \
            re.fullmatch(r"version_\d+", folder.name):
        return folder
    return None


def resumed_config_name(folder: str | Path, step: int) -> str:
    """A name for a resumed run's config in ``folder`` that overwrites nothing: ``config.yaml`` if
    free, else ``config_resumed_step<step>.yaml`` (with a counter if that is taken too)."""
    folder = Path(folder)
    if not (folder / "config.yaml").exists():
        return "config.yaml"
    name, i = f"config_resumed_step{step}.yaml", 1
    while (folder / name).exists():
        name, i = f"config_resumed_step{step}_{i}.yaml", i + 1
    return name
