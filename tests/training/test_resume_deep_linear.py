"""Exact resume of DeepLinearNet (the quickstart recipe): stopped by max_steps, killed with SIGKILL
after a mid-run checkpoint, or stopped by SIGTERM, then resumed with --ckpt_path last: the same
final weights, scalars and figures as the uninterrupted run, bit for bit."""
from __future__ import annotations

import os
import signal

import lightning.pytorch as pl
import pytest
from resume_harness import assert_same_run, checkpoint_step, fit, fit_killed, resume_from_kept, scalars

pytestmark = pytest.mark.slow  # runs of recipes through the CLI (several seconds each)

# 300 steps: three epochs of 100 (10 batches of 10 steps), a checkpoint every 30 steps (a tenth),
# NetworkMap's figure at step 250, after every interruption below
RECIPE = ["--config", "recipes/quickstart.yaml", "--trainer.max_steps=300"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from resume_harness import REPO

    args = [a.replace("recipes/", f"{REPO}/recipes/") for a in RECIPE]
    return args, fit(tmp_path_factory.mktemp("full"), *args)


def test_stop_by_max_steps_then_resume(reference, tmp_path):
    args, full = reference
    fit(tmp_path, *args, "--trainer.max_steps=130")
    ckpt = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert checkpoint_step(ckpt) == 130  # saved mid-epoch, where max_steps stopped it
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert not (tmp_path / "lightning_logs/version_1").exists()  # resumed into its own folder
    assert checkpoint_step(ckpt) == 300
    assert_same_run(full, run, stop_step=130)


def test_kill_then_resume(reference, tmp_path):
    args, full = reference
    step = fit_killed(tmp_path, *args)
    assert 0 < step < 300
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert_same_run(full, run)


def test_killed_after_its_checkpoint_every_point_shows_once(reference, tmp_path):
    """The batch after the checkpoint at step 90 logged its loss at 90 (every batch is written:
    log_every_n_steps 1) and a validation ran at 90 (every 3 batches of 10 steps); then the run was
    killed. Resumed, TensorBoard shows each point once: the loss at 90 of the resumed run, the
    validation of the killed one (Lightning does not run it again), the callbacks' points at 90."""
    from resume_harness import REPO

    args = [a.replace("recipes/", f"{REPO}/recipes/") for a in RECIPE]
    # 120 steps: a checkpoint at the first batch end past every 12 steps (90 among them)
    args += ["--trainer.max_steps=120", "--trainer.log_every_n_steps=1", "--trainer.val_check_interval=3"]
    full = fit(tmp_path / "full", *args)
    run = resume_from_kept(tmp_path / "killed", args, 90)
    assert_same_run(full, run)
    shown = scalars(run)
    assert any(s == 90 for s, _ in shown["loss"]) and any(s == 90 for s, _ in shown["val/mse"])
    for tag, points in shown.items():
        steps = [s for s, _ in points]
        assert len(steps) == len(set(steps)), f"{tag}: a step shown twice"


def test_a_checkpoint_of_your_own_model_checkpoint_shows_every_point_once(tmp_path):
    """A config with a ModelCheckpoint of its own (no RunCheckpoint): its checkpoint at step 90 was
    kept, and the batch after it had logged its loss at 90 (every batch written). Resumed, the loss
    at 90 shows once: the module's checkpoint records where the resumed run picks up its curves,
    whichever callback saved it (with Lightning's rule of purging after the step it showed twice)."""
    import json

    from resume_harness import REPO

    own = json.dumps({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                      "init_args": {"every_n_train_steps": 30, "save_last": True}})
    args = ["--config", f"{REPO}/recipes/quickstart.yaml", "--trainer.max_steps=120",
            "--trainer.log_every_n_steps=1", f"--trainer.callbacks+={own}"]
    full = fit(tmp_path / "full", *args)
    run = resume_from_kept(tmp_path / "killed", args, 90)
    assert_same_run(full, run)
    shown = scalars(run)
    assert [s for s, _ in shown["loss"]] == list(range(0, 120, 10))
    for tag, points in shown.items():
        steps = [s for s, _ in points]
        assert len(steps) == len(set(steps)), f"{tag}: a step shown twice"


def test_resumed_from_an_epochs_end_the_loss_keeps_its_rows(tmp_path):
    """A checkpoint saved at an epoch's end (step 100: epochs of 10 batches of 10 steps); the loss
    is written every 3rd batch. Resumed from it, the run writes the rows of the uninterrupted run
    (Lightning's own count of batches runs one ahead after such a resume: rows it chose moved by a
    batch, and the zoo's loss, logged on the rows the zoo counts, went missing from there on)."""
    import json

    from resume_harness import REPO

    every_100 = json.dumps({"class_path": "zoo.training.checkpoint.RunCheckpoint", "init_args": {"every_n_train_steps": 100}})
    args = ["--config", f"{REPO}/recipes/quickstart.yaml", "--trainer.max_steps=200",
            "--trainer.log_every_n_steps=3", f"--trainer.callbacks+={every_100}"]
    full = fit(tmp_path / "full", *args)
    run = resume_from_kept(tmp_path / "killed", args, 100)
    assert [s for s, _ in scalars(run)["loss"]] == [20, 50, 80, 110, 140, 170]
    assert_same_run(full, run)


class SigtermAt(pl.Callback):
    """Sends this process SIGTERM at the end of the batch that reaches ``step``, as a cluster
    scheduler would mid-run (in-process: the subprocess of the SIGKILL test costs an interpreter
    and Lightning's import, and the signal takes the same path)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_exits_143_and_resumes(reference, tmp_path, capsys):
    """What a cluster scheduler sends before killing a job: the run saves after the batch in
    progress and exits 143, and resuming from that checkpoint gives the uninterrupted run. Step 130
    is between the scheduled checkpoints (every 30): the save is the SIGTERM's."""
    from zoo.cli import main

    args, full = reference
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(SystemExit) as stop:
            main(["fit", *args, "--trainer.enable_progress_bar=false",
                  '--trainer.callbacks+={"class_path": "test_resume_deep_linear.SigtermAt", "init_args": {"step": 130}}'])
    finally:
        os.chdir(cwd)
    assert stop.value.code == 143
    out, err = capsys.readouterr()
    assert "stopped by SIGTERM" in err
    assert (out + err).count("--ckpt_path last") == 1  # the end-of-run block says how to resume, once
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # Lightning put the handler back
    assert checkpoint_step(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt") == 130
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert_same_run(full, run)
