"""zoo.training.resume_events: which TensorBoard events of a stopped run a resumed run keeps, read back as
TensorBoard shows them (its EventAccumulator applies the purges)."""
from __future__ import annotations

import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from zoo.training.resume_events import event_files, events_before_save, write_back


def _shown(folder) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _stopped_run(folder) -> None:
    """A run checkpointed at step 3 at time 100: before the save it logged the batch losses ``a`` at
    steps 1 and 2 and a callback's ``b`` at 3 (at the end of the batch that reached 3); after it,
    the next batch's ``a`` at 3 (the loss of the weights it starts from) and ``a`` at 4, which a run
    resumed from the checkpoint logs anew, and another ``b`` at 3 from before, at 100 itself."""
    w = SummaryWriter(str(folder))
    w.add_scalar("a", 1.0, 1, walltime=10.0)
    w.add_scalar("a", 2.0, 2, walltime=20.0)
    w.add_scalar("b", 0.5, 3, walltime=40.0)
    w.add_scalar("c", 0.25, 3, walltime=100.0)
    w.add_scalar("a", 3.0, 3, walltime=101.0)
    w.add_scalar("a", 4.0, 4, walltime=102.0)
    w.close()


def test_the_events_at_the_checkpoint_step_from_before_its_save(tmp_path):
    _stopped_run(tmp_path)
    kept = events_before_save(tmp_path, 3, 100.0)
    assert [(e.step, e.summary.value[0].tag, e.wall_time) for e in kept] == [(3, "b", 40.0), (3, "c", 100.0)]


def test_written_back_after_the_purge_every_point_shows_once(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    run = tmp_path / "lightning_logs" / "version_0"
    run.mkdir(parents=True)
    _stopped_run(run)
    kept = events_before_save(run, 3, 100.0)
    time.sleep(1.05 - time.time() % 1.0)  # TensorBoard reads the files by name, the second first
    logger = TensorBoardLogger(str(tmp_path), version="version_0", default_hp_metric=False, purge_step=3)
    write_back(logger, kept)
    logger.experiment.add_scalar("a", 3.0, 3)  # the resumed run repeats the batch after the checkpoint
    logger.experiment.add_scalar("a", 4.0, 4)
    logger.finalize("success")
    assert len(event_files(run)) == 2
    assert _shown(run) == {"a": [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)], "b": [(3, 0.5)], "c": [(3, 0.25)]}


def test_a_second_resume_sees_the_first_ones_purge(tmp_path):
    """After a first resume from step 3 (purge at 3, the kept events written back), the stopped run's
    events past 3 are gone for TensorBoard, and so for a second resume from the same checkpoint."""
    _stopped_run(tmp_path)
    kept = events_before_save(tmp_path, 3, 100.0)
    time.sleep(1.05 - time.time() % 1.0)
    w = SummaryWriter(str(tmp_path), purge_step=3)
    for e in kept:
        w.file_writer.add_event(e, walltime=e.wall_time)
    w.add_scalar("a", 3.0, 3, walltime=200.0)  # the first resume's next batch, killed again
    w.close()
    again = events_before_save(tmp_path, 3, 100.0)
    assert [(e.summary.value[0].tag, e.summary.value[0].simple_value) for e in again] == [("b", 0.5), ("c", 0.25)]


def test_a_file_cut_short_by_a_kill_is_read_up_to_its_last_whole_event(tmp_path):
    w = SummaryWriter(str(tmp_path))
    for step in range(5):
        w.add_scalar("a", float(step), step, walltime=float(step))
    w.close()
    (path,) = event_files(tmp_path)
    path.write_bytes(path.read_bytes()[:-7])  # the last record half-written
    assert [e.step for e in events_before_save(tmp_path, 3, 100.0)] == [3]
    assert events_before_save(tmp_path, 4, 100.0) == []
