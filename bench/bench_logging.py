"""What the zoo's callbacks pay to write to TensorBoard: a record of scalars, and a matrix image.

    python bench/bench_logging.py [--threads 1] [--rounds 5]

Two rows, each the zoo's writer against the strongest hand-written code we know that writes the
same thing into the same kind of event file, in interleaved rounds:

* a record of 75 scalars (the quickstart's ``SingularValues`` record: 5 members x 15 mode strengths
  and their theory), 200 records: ``zoo.training.logs.log_scalars`` (one event holding the record,
  ``zoo.training.scalar_events``) against that one ``Summary`` written by hand into a ``SummaryWriter``. Both
  files read back with the same tags, steps and values (checked here). Lightning's own
  ``TensorBoardLogger.log_metrics`` (an event per scalar, as the zoo wrote before) is timed in the
  same rounds and printed: ~4 ms a record against ~0.5 ms.
* an 8 x 8 heatmap (a ``NetworkMap`` image), 40 images: ``zoo.training.logs.log_matrix`` (a canvas kept per
  shape, ``zoo.plots.matrix.heatmap_rgb``) against a figure built once by hand and redrawn
  (``set_data``, ``set_clim``, the title) into ``add_image``. A new matplotlib figure per image
  through ``add_figure`` (what the zoo did before, with ``tight_layout``) is printed beside them:
  ~45 ms an image against ~16 ms.

Goals: 0.9x for the image (the canvas cache costs next to nothing beside the drawing); 0.8x for the
record, whose write is ~0.35 ms on both sides (mostly the event's checksum, computed in Python by
TensorBoard's writer) while the zoo's ``host_floats`` takes any mapping (Python numbers, tensors of
any dtype on any device: ~40 us a record to sort and stack them) where the hand-written side knows
it holds 75 CPU float64 tensors (~20 us to stack). Measured 0.82-0.89x in rounds of 5-7 on the
loaded 2-core machine (the writer's thread makes this row noisy).
"""
from __future__ import annotations

import logging
import tempfile
import time
import warnings

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter

import harness
from zoo.training.logs import log_matrix, log_scalars
from zoo.plots.matrix import heatmap

RECORDS, IMAGES = 200, 40
#: a record: 5 members' 8 mode strengths and 7 of their theory values, elements of float64 tensors
VALUES = {f"modes/lam={lam}/a{i}{kind}": torch.tensor(0.01 * i + lam + 0.5 * (kind != ""), dtype=torch.float64)
          for lam in (-8, -2, 0, 2, 8) for kind, n in (("", 8), ("_theory", 7)) for i in range(n)}
MATRICES = [torch.randn(8, 8, generator=torch.Generator().manual_seed(i)) for i in range(IMAGES)]


def trainer_in(root: str) -> pl.Trainer:
    return pl.Trainer(logger=TensorBoardLogger(root, name="run"), enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)


def read(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def scalars_zoo(files: dict) -> float:
    with tempfile.TemporaryDirectory() as root:
        trainer = trainer_in(root)
        writer = trainer.logger.experiment  # made before the clock starts, as on the other sides
        t = time.perf_counter()
        for step in range(RECORDS):
            log_scalars(trainer, VALUES, step=step)
        writer.flush()
        seconds = time.perf_counter() - t
        files["zoo"] = read(trainer.logger.log_dir)
    return seconds


def scalars_by_hand(files: dict) -> float:
    with tempfile.TemporaryDirectory() as root:
        writer = SummaryWriter(root)
        t = time.perf_counter()
        for step in range(RECORDS):
            values = torch.stack([v for v in VALUES.values()]).tolist()
            summary = Summary()
            add = summary.value.add
            for k, v in zip(VALUES, values):
                add(tag=k, simple_value=v)
            writer._get_file_writer().add_summary(summary, step)
        writer.flush()
        seconds = time.perf_counter() - t
        files["hand"] = read(root)
        writer.close()
    return seconds


def scalars_lightning(files: dict) -> float:
    with tempfile.TemporaryDirectory() as root:
        logger = TensorBoardLogger(root, name="run")
        writer = logger.experiment
        t = time.perf_counter()
        for step in range(RECORDS):
            logger.log_metrics(VALUES, step=step)
        writer.flush()
        seconds = time.perf_counter() - t
        files["lightning"] = read(logger.log_dir)
    return seconds


def images_zoo() -> float:
    with tempfile.TemporaryDirectory() as root:
        trainer = trainer_in(root)
        writer = trainer.logger.experiment
        t = time.perf_counter()
        for step, M in enumerate(MATRICES):
            log_matrix(trainer, "map/lam=2", M, step=step, title=f"W_L...W_1 (lam=2), step {step}")
        writer.flush()
        return time.perf_counter() - t


def images_by_hand() -> float:
    with tempfile.TemporaryDirectory() as root:
        writer = SummaryWriter(root)
        fig = heatmap(MATRICES[0], "")
        ax = fig.axes[0]
        im = ax.images[0]
        t = time.perf_counter()
        for step, M in enumerate(MATRICES):
            A = M.double().numpy()
            vmax = float(np.abs(A).max()) or 1.0
            im.set_data(A)
            im.set_clim(-vmax, vmax)
            ax.set_title(f"W_L...W_1 (lam=2), step {step}", fontsize=8)
            fig.canvas.draw()
            writer.add_image("map/lam=2", np.asarray(fig.canvas.buffer_rgba())[..., :3].copy(), step,
                             dataformats="HWC")
        writer.flush()
        seconds = time.perf_counter() - t
        writer.close()
        return seconds


def images_new_figures() -> float:
    """A new figure per image, laid out by ``tight_layout`` and logged by ``add_figure``."""
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory() as root:
        writer = SummaryWriter(root)
        t = time.perf_counter()
        for step, M in enumerate(MATRICES):
            fig, ax = plt.subplots(figsize=(3.2, 2.8), dpi=80)
            A = M.double().numpy()
            vmax = float(np.abs(A).max()) or 1.0
            im = ax.imshow(A, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
            fig.colorbar(im, ax=ax, fraction=0.046)
            ax.set_title(f"W_L...W_1 (lam=2), step {step}", fontsize=8)
            ax.set_xticks([]), ax.set_yticks([])
            fig.tight_layout()
            writer.add_figure("map/lam=2", fig, step)
        writer.flush()
        seconds = time.perf_counter() - t
        writer.close()
        return seconds


def main() -> None:
    args = harness.arguments(__doc__)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    files: dict = {}
    s = harness.interleaved({"zoo": lambda: scalars_zoo(files), "hand": lambda: scalars_by_hand(files),
                             "lightning": lambda: scalars_lightning(files)}, args.rounds)
    same = files["zoo"] == files["hand"] == files["lightning"]
    print(f"scalars: {len(VALUES)} a record, {RECORDS} records; the three files read back the same: {same}")
    if not same:
        raise SystemExit("the zoo's scalars differ from the hand-written ones; the comparison is void")
    m = {k: harness.median(v) / RECORDS * 1e3 for k, v in s.items()}
    print(f"  ms a record: zoo {m['zoo']:.3f}, by hand {m['hand']:.3f}, Lightning's log_metrics {m['lightning']:.3f}")
    i = harness.interleaved({"zoo": images_zoo, "hand": images_by_hand, "new": images_new_figures}, args.rounds)
    n = {k: harness.median(v) / IMAGES * 1e3 for k, v in i.items()}
    print(f"images: 8 x 8 heatmaps, {IMAGES} a round; ms an image: zoo {n['zoo']:.1f}, by hand {n['hand']:.1f}, "
          f"a new figure each {n['new']:.1f}")
    harness.report([
        harness.Row("TensorBoard record of 75 scalars: log_scalars vs one Summary by hand", zoo=m["zoo"],
                    baseline=m["hand"], unit="ms/record", goal=0.8, lower_is_better=True),
        harness.Row("TensorBoard 8x8 heatmap image: log_matrix vs a kept figure by hand", zoo=n["zoo"],
                    baseline=n["hand"], unit="ms/image", goal=0.9, lower_is_better=True)])


if __name__ == "__main__":
    main()
