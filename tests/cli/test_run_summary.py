"""The block at the end of a run (zoo.cli.run_summary): built from the folder, printed by the CLI."""
from __future__ import annotations

import os

import pytest

from conftest import REPO, run_cli
from zoo.cli.run_summary import MAX_LISTED, run_summary


def _folder(root, pngs=(), ckpt=True, events=True):
    folder = root / "lightning_logs" / "version_2"
    (folder / "checkpoints").mkdir(parents=True)
    for name in pngs:
        (folder / name).write_bytes(b"png")
    if ckpt:
        (folder / "checkpoints" / "last.ckpt").write_bytes(b"c")
    if events:
        (folder / "events.out.tfevents.1.host").write_bytes(b"e")
    (folder / "config.yaml").write_text("a: 1")
    return folder


def _field(text: str, name: str) -> str | None:
    for line in text.splitlines():
        if line.strip().startswith(name):
            return line.strip()[len(name):].strip()
    return None


def test_a_finished_run(in_tmp):
    text = run_summary(_folder(in_tmp, pngs=("b.png", "a.png")))
    assert text.splitlines()[0] == "zoo: fit finished"
    assert _field(text, "run folder") == os.path.join("lightning_logs", "version_2")
    assert _field(text, "figures") == "a.png, b.png"
    assert _field(text, "checkpoint") == os.path.join("lightning_logs", "version_2", "checkpoints", "last.ckpt")
    assert _field(text, "TensorBoard") == "tensorboard --logdir lightning_logs"


def test_many_figures_are_counted_and_missing_parts_left_out(in_tmp):
    folder = _folder(in_tmp, pngs=[f"f{i}.png" for i in range(MAX_LISTED + 1)], ckpt=False, events=False)
    text = run_summary(folder, "test")
    assert text.splitlines()[0] == "zoo: test finished"
    assert _field(text, "figures") == f"{MAX_LISTED + 1} PNG files in {os.path.join('lightning_logs', 'version_2')}"
    assert _field(text, "checkpoint") is None and _field(text, "TensorBoard") is None


def test_a_stopped_run_says_what_its_checkpoint_holds(in_tmp):
    folder = _folder(in_tmp)
    sigterm = run_summary(folder, stop="sigterm")
    assert "SIGTERM" in sigterm.splitlines()[0] and "--ckpt_path last" in _field(sigterm, "checkpoint")
    assert "diverged" in run_summary(folder, stop="diverged").splitlines()[0]
    outside = in_tmp.parent / "elsewhere.ckpt"  # a folder outside the working one: shown whole
    outside.write_bytes(b"c")
    assert _field(run_summary(folder, checkpoint=outside), "checkpoint") == str(outside)
    with pytest.raises(ValueError, match="stop = 'killed'"):
        run_summary(folder, stop="killed")


def test_the_cli_prints_it_after_fit(in_tmp, capsys):
    run_cli("fit", "--config", f"{REPO}/recipes/quickstart.yaml", "--trainer.max_steps=20",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            '--trainer.callbacks=[{"class_path": "SingularValues", "init_args": {"every_n_steps": 10}}]')
    text = capsys.readouterr().out
    block = text[text.index("zoo: fit finished"):]
    folder = in_tmp / _field(block, "run folder")
    assert folder.parent.name == "lightning_logs" and folder.is_dir()
    assert _field(block, "figures") == "singular_values.png" and (folder / "singular_values.png").is_file()
    assert (in_tmp / _field(block, "checkpoint")) == folder / "checkpoints" / "last.ckpt"
    assert _field(block, "TensorBoard") == "tensorboard --logdir lightning_logs"


def test_a_diverged_run_prints_it_too(in_tmp, capsys):
    from zoo.training.divergence import DivergenceError

    with pytest.raises(DivergenceError):
        run_cli("fit", "--config", f"{REPO}/recipes/quickstart.yaml", "--trainer.max_steps=200",
                "--model.init_args.lr=50", "--trainer.enable_progress_bar=false", "--trainer.callbacks=[]",
                "--trainer.enable_model_summary=false")
    text = capsys.readouterr().out
    assert "zoo: fit stopped: the loss diverged" in text and "run folder" in text
