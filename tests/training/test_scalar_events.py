"""A record of scalars written as one TensorBoard event (``zoo.training.scalar_events``) reads back as
Lightning's ``TensorBoardLogger.log_metrics`` writes it, one event per scalar."""
from __future__ import annotations

import math
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from zoo.training.scalar_events import write_scalars

RECORDS = [{"modes/lam=-2/a0": 0.1 * s, "modes/lam=-2/a0_theory": 1 / 3 + s, "loss": math.pi * 10 ** -s,
            "tiny": 1e-40, "big": 3.4e38 * (s % 2)} for s in range(4)]


def scalars(path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_one_event_per_record_reads_back_as_lightnings_event_per_scalar(tmp_path):
    ours, theirs = TensorBoardLogger(tmp_path, name="ours"), TensorBoardLogger(tmp_path, name="theirs")
    for step, values in zip([0, 10, 10, 25], RECORDS):  # a step may come twice (a validation beside a batch)
        write_scalars(ours, values, step)
        theirs.log_metrics(values, step=step)
    ours.experiment.flush(), theirs.experiment.flush()
    got, want = scalars(ours.log_dir), scalars(theirs.log_dir)
    assert set(want) == set(RECORDS[0]) and got == want  # tags, steps and float32 values, in order
    # and it is one event per record: fewer events in the file than scalars written
    files = list(Path(ours.log_dir).glob("events.out.tfevents.*"))
    events = sum(1 for f in files for _ in EventFileLoader(str(f)).Load())
    assert events == 1 + len(RECORDS)  # the file's version event, then one per record


def test_records_after_the_writer_was_closed_reach_a_new_event_file(tmp_path):
    """A closed SummaryWriter has no ``file_writer``: the next record goes through ``log_metrics``,
    whose ``add_scalar`` opens a new event file, and the ones after it are one event again."""
    ours, theirs = TensorBoardLogger(tmp_path, name="ours"), TensorBoardLogger(tmp_path, name="theirs")
    for step, values in zip([0, 10, 20, 30], RECORDS):
        if step == 20:
            ours.finalize("success"), theirs.finalize("success")  # closes the writers
            assert ours.experiment.file_writer is None
        write_scalars(ours, values, step)
        theirs.log_metrics(values, step=step)
    ours.experiment.flush(), theirs.experiment.flush()
    assert scalars(ours.log_dir) == scalars(theirs.log_dir)
    first, second = sorted(Path(ours.log_dir).glob("events.out.tfevents.*"), key=lambda f: f.stat().st_mtime)
    # the first file: its version event and two records; the new one: its version event, the record
    # that reopened it (an event a scalar) and the next record as one event
    assert sum(1 for _ in EventFileLoader(str(first)).Load()) == 1 + 2
    assert sum(1 for _ in EventFileLoader(str(second)).Load()) == 1 + len(RECORDS[2]) + 1


def test_a_logger_of_another_kind_a_prefix_or_an_own_log_metrics_get_log_metrics(tmp_path):
    seen = []

    class Watched(TensorBoardLogger):
        def log_metrics(self, metrics, step=None):
            seen.append((dict(metrics), step))
            super().log_metrics(metrics, step)

    write_scalars(Watched(tmp_path, name="own"), RECORDS[1], 7)
    assert seen == [(RECORDS[1], 7)]
    prefixed = TensorBoardLogger(tmp_path, name="prefixed", prefix="run1")
    write_scalars(prefixed, RECORDS[1], 7)
    prefixed.experiment.flush()
    assert set(scalars(prefixed.log_dir)) == {f"run1-{k}" for k in RECORDS[1]}  # Lightning's prefix, kept
    csv = CSVLogger(tmp_path, name="csv")
    write_scalars(csv, RECORDS[1], 7)
    csv.save()
    assert "modes/lam=-2/a0_theory" in (tmp_path / "csv" / "version_0" / "metrics.csv").read_text()


def test_off_rank_zero_nothing_is_written(tmp_path, monkeypatch):
    from lightning.pytorch.utilities import rank_zero_only

    logger = TensorBoardLogger(tmp_path, name="tb")
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    write_scalars(logger, RECORDS[0], 0)
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    assert not (tmp_path / "tb").exists()  # not even the writer was made
