"""Exact resume of the streamed families across the task switch: MultiHeadStudent on
TeacherStudent (ode_vs_simulation: TheoryOverlay, OrderParameters, Entropies; fig6: Forgetting;
fig7: EWC anchored at the switch, ErrorCurves) and MultiHeadClassifier on MNISTContinual (fig12:
Forgetting over k, on tiny IDX files from helpers_mnist.tiny_mnist). Each run is stopped by a smaller max_steps (before
and after the switch) or killed with SIGKILL after its first mid-run checkpoint, then resumed with
--ckpt_path last: weights, scalars and figures equal the uninterrupted run's, bit for bit.
Without the slow ones (-m "not slow"): a stop before the switch (student), at it and a kill after
a checkpoint there (EWC), a stop after it and a kill before it (classifier), a changed stream."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from resume_harness import REPO, assert_same_run, checkpoint_step, fit, fit_killed, resume_from_kept, scalars

ODE = ["--config", f"{REPO}/recipes/specialisation/ode_vs_simulation.yaml", "--data.init_args.num_steps=4000",
       "--data.init_args.switch_step=2000", "--data.init_args.d=400", "--model.init_args.d=400",
       "--data.init_args.steps_per_batch=300", "--data.init_args.num_test=500"]
FIG6 = ["--config", f"{REPO}/recipes/specialisation/fig6_forgetting_vs_similarity.yaml",
        "--data.init_args.num_steps=2000", "--data.init_args.switch_step=1000", "--data.init_args.d=100",
        "--model.init_args.d=100", "--data.init_args.steps_per_batch=250", "--data.init_args.num_test=100"]
FIG7 = ["--config", f"{REPO}/recipes/specialisation/fig7_ewc.yaml", "--data.init_args.num_steps=1200",
        "--data.init_args.switch_step=600", "--data.init_args.d=60", "--model.init_args.d=60",
        "--data.init_args.steps_per_batch=200", "--data.init_args.num_test=100", "--model.init_args.ewc.samples=200",
        "--trainer.callbacks.init_args.every_n_steps=200"]


def fig12(data_dir) -> list[str]:
    return ["--config", f"{REPO}/recipes/specialisation/fig12_mnist_forgetting.yaml",
            f"--data.init_args.data_dir={data_dir}", "--data.init_args.steps=[10,10]", "--data.init_args.num_test=200",
            "--data.init_args.digit_draws=1", "--data.init_args.batch_size=16", "--model.init_args.hidden=16",
            "--trainer.callbacks.init_args.every_n_steps=3"]


def stop_then_resume(folder, args, stop: int, reference, samples: int | None = None):
    """``stop``: max_steps (optimizer updates: batches for the student, whose batch is a chunk of
    ``samples`` SGD steps in all, its log axis; SGD steps for the classifier)."""
    fit(folder, *args, f"--trainer.max_steps={stop}")
    ckpt = folder / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert checkpoint_step(ckpt) == stop  # saved mid-epoch, where max_steps stopped it
    if samples is not None:
        assert checkpoint_samples(ckpt) == samples
    run = fit(folder, *args, "--ckpt_path", "last")
    assert not (folder / "lightning_logs/version_1").exists()  # resumed into its own folder
    assert_same_run(reference, run, stop_step=stop if samples is None else samples)
    return run


def checkpoint_samples(path: Path) -> int:
    """The student's theory clock in a checkpoint (``samples_seen``: SGD steps of online SGD)."""
    return int(torch.load(path, map_location="cpu", weights_only=False)["state_dict"]["samples_seen_"])


def kill_then_resume(folder, args, reference, switch: int):
    step = fit_killed(folder, *args)
    assert 0 < step < switch  # killed in task 1: the resumed run crosses the switch
    run = fit(folder, *args, "--ckpt_path", "last")
    assert_same_run(reference, run)
    return run


# -- MultiHeadStudent on TeacherStudent ---------------------------------------------------------------
@pytest.fixture(scope="module")
def ode_reference(tmp_path_factory):
    run = fit(tmp_path_factory.mktemp("ode_full"), *ODE)
    assert checkpoint_step(run / "checkpoints/last.ckpt") == 14  # chunks: 7 per task (the last 200 steps)
    assert checkpoint_samples(run / "checkpoints/last.ckpt") == 4000
    return run


def images(run: Path) -> dict[str, list[int]]:
    """The steps of every image in the run's TensorBoard events (after a resume's purge)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"images": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Images(tag)] for tag in acc.Tags()["images"]}


# chunks of 300 steps: the first batch after a stop at 900 crosses 1000, where TheoryOverlay (every
# 500) and OrderParameters (every 1000) are due, as in the uninterrupted run
@pytest.mark.slow
@pytest.mark.parametrize("stop, samples", [(3, 900), (9, 2600)])  # before the switch (2000), after
def test_ode_vs_simulation_stopped_by_max_steps(ode_reference, tmp_path, stop, samples):
    run = stop_then_resume(tmp_path, ODE, stop, ode_reference, samples)
    # the resumed run trained to the end of the schedule (the reported bug stopped early)
    assert checkpoint_samples(run / "checkpoints/last.ckpt") == 4000
    assert {"theory_overlay", "order_parameters"} <= set(p.stem.split("_1")[0] for p in run.glob("*.png"))
    expected = images(ode_reference)
    assert expected["Q/member0"] == [0]  # the recipe's images_every_n_steps (10000): only at the start
    # the stopped part's end-of-run figures stay at its last step (as its summaries in assert_same_run)
    assert {tag: [s for s in steps if s != samples or s in expected.get(tag, [])]
            for tag, steps in images(run).items()} == expected


@pytest.fixture(scope="module")
def fig6_reference(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("fig6_full"), *FIG6)


@pytest.mark.slow
def test_fig6_forgetting_profile_stopped_after_the_switch(fig6_reference, tmp_path):
    # the errors at the switch were recorded by the first part: the profile needs them
    run = stop_then_resume(tmp_path, FIG6, 5, fig6_reference, samples=1250)
    assert (run / "forgetting_profile_1.png").is_file()


@pytest.mark.slow
def test_fig6_forgetting_profile_killed(fig6_reference, tmp_path):
    kill_then_resume(tmp_path, FIG6, fig6_reference, switch=4)  # 4 chunks of 250 steps


@pytest.fixture(scope="module")
def fig7_reference(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("fig7_full"), *FIG7)


# at the switch (EWC anchors at the end of its batch); stops before and after a switch are the
# ode_vs_simulation cases
@pytest.mark.parametrize("stop, samples", [(3, 600)])
@pytest.mark.slow
def test_fig7_ewc_stopped_by_max_steps(fig7_reference, tmp_path, stop, samples):
    run = stop_then_resume(tmp_path, FIG7, stop, fig7_reference, samples)
    ref = torch.load(fig7_reference / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert int(ref["state_dict"]["ewc.consolidations"]) == 1  # the penalty was on in task 2
    got = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert int(got["state_dict"]["ewc.consolidations"]) == 1  # anchored once, not again after the resume


@pytest.mark.slow
def test_fig7_killed_after_the_checkpoint_at_the_switch(fig7_reference, tmp_path):
    """The EWC anchors (and their logged summary) belong to the checkpoint at the switch: a run killed
    after it and resumed neither anchors twice nor logs ewc/fisher/* twice at the switch."""
    assert_same_run(fig7_reference, resume_from_kept(tmp_path, FIG7, 3))  # 3 chunks of 200 steps


# -- MultiHeadClassifier on MNISTContinual ------------------------------------------------------------
@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    from helpers_mnist import tiny_mnist

    return tiny_mnist(tmp_path_factory.mktemp("mnist"))


@pytest.fixture(scope="module")
def fig12_reference(tmp_path_factory, mnist_dir):
    return fit(tmp_path_factory.mktemp("fig12_full"), *fig12(mnist_dir))


@pytest.mark.parametrize("stop", [13])  # after the switch (10): the ode and fig7 cases stop before it
@pytest.mark.slow
def test_fig12_mnist_stopped_by_max_steps(fig12_reference, mnist_dir, tmp_path, stop):
    run = stop_then_resume(tmp_path, fig12(mnist_dir), stop, fig12_reference)
    # the table of members too (the first part wrote one at its stop if that was after the switch)
    table = max(run.glob("forgetting_members*.csv"), key=lambda p: p.stat().st_mtime)
    assert table.name == ("forgetting_members_1.csv" if stop > 10 else "forgetting_members.csv")
    assert table.read_bytes() == (fig12_reference / "forgetting_members.csv").read_bytes()


@pytest.mark.slow
def test_fig12_mnist_killed(fig12_reference, mnist_dir, tmp_path):
    kill_then_resume(tmp_path, fig12(mnist_dir), fig12_reference, switch=10)


@pytest.mark.slow
def test_fig12_ewc_killed_after_the_checkpoint_at_the_switch(mnist_dir, tmp_path_factory):
    """As for the student (fig7): the classifier anchors EWC inside the switch's last batch."""
    args = [*fig12(mnist_dir), '--model.init_args.ewc={"xi": 1.0, "samples": 20}']
    reference = fit(tmp_path_factory.mktemp("fig12_ewc_full"), *args)
    run = resume_from_kept(tmp_path_factory.mktemp("fig12_ewc_killed"), args, 10)
    assert_same_run(reference, run)
    assert [s for s, _ in scalars(run)["ewc/fisher/mean"]] == [10]  # anchored once, at the switch


def test_a_changed_stream_is_refused(tmp_path):
    """Resuming with other data settings would train a different run: a one-line error instead,
    before any step (step 900 starts a chunk in both schedules: only the saved settings tell)."""
    fit(tmp_path, *ODE, "--trainer.max_steps=3")  # 3 chunks, 900 SGD steps
    with pytest.raises(ValueError, match="steps_per_batch = 300 in the checkpoint but 100 now") as err:
        fit(tmp_path, *ODE, "--data.init_args.steps_per_batch=100", "--ckpt_path", "last")
    assert "\n" not in str(err.value)
    assert checkpoint_step(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt") == 3  # nothing trained


def test_schedule_loader_saves_where_it_stopped_and_keeps_the_schedule_length():
    """The loader state Lightning checkpoints: the next chunk handed out, restored where it stopped;
    the length stays the whole schedule (a resumed epoch must not end early)."""
    from types import SimpleNamespace

    from datamodules import TeacherStudent

    def loader(step: int):
        dm = TeacherStudent(d=20, num_steps=1000, switch_step=500, steps_per_batch=100, num_test=10)
        dm.trainer = SimpleNamespace(global_step=step)  # a resumed run's optimizer updates: chunks done
        return dm.train_dataloader()

    first = loader(0)
    it = iter(first)
    seen = [next(it) for _ in range(3)]
    state = first.state_dict()
    assert state["next_batch"] == 3 and len(first) == 10
    resumed = loader(3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(resumed) == 10 and [int(b["step"]) for b in rest] == list(range(300, 1000, 100))
    assert torch.equal(rest[0]["x"], list(loader(0))[3]["x"]) and not torch.equal(rest[0]["x"], seen[0]["x"])
    with pytest.raises(ValueError, match="stopped before batch 3 but its training step says batch 4"):
        loader(4).load_state_dict(state)
