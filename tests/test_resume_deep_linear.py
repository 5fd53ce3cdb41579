"""Exact resume of DeepLinearNet (the quickstart recipe): stopped by max_steps, or killed with
SIGKILL after a mid-run checkpoint, then resumed with --ckpt_path last: the same final weights,
scalars and figures as the uninterrupted run, bit for bit."""
from __future__ import annotations

import pytest
from resume_harness import assert_same_run, checkpoint_step, fit, fit_killed

pytestmark = pytest.mark.slow  # runs of recipes through the CLI (several seconds each)

RECIPE = ["--config", "recipes/quickstart.yaml", "--trainer.max_steps=600"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from resume_harness import REPO

    args = [a.replace("recipes/", f"{REPO}/recipes/") for a in RECIPE]
    return args, fit(tmp_path_factory.mktemp("full"), *args)


def test_stop_by_max_steps_then_resume(reference, tmp_path, one_thread):
    args, full = reference
    fit(tmp_path, *args, "--trainer.max_steps=230")
    ckpt = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert checkpoint_step(ckpt) == 230  # saved mid-epoch, where max_steps stopped it
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert not (tmp_path / "lightning_logs/version_1").exists()  # resumed into its own folder
    assert checkpoint_step(ckpt) == 600
    assert_same_run(full, run, stop_step=230)


def test_kill_then_resume(reference, tmp_path):
    args, full = reference
    step = fit_killed(tmp_path, *args)
    assert 0 < step < 600
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert_same_run(full, run)


def test_sigterm_saves_exits_143_and_resumes(reference, tmp_path):
    """What a cluster scheduler sends before killing a job: the run saves after the batch in
    progress and exits non-zero, and resuming from that checkpoint gives the uninterrupted run."""
    import signal

    args, full = reference
    step = fit_killed(tmp_path, *args, sig=signal.SIGTERM)
    assert 0 < step < 600
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert_same_run(full, run)
