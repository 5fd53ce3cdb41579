"""Writing to a run's loggers and folder, for callbacks and modules alike: scalars at a chosen
step, a training batch's losses, figures through ``add_figure`` plus one PNG, heatmaps,
TensorBoard's custom-scalar layout, fresh file names that never overwrite a user's file, and
warnings given once. Rank 0 writes."""
from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from zoo.utils.labels import MAX_MEMBER_TAGS
from zoo.training.scalar_events import write_scalars


def host_floats(metrics: dict[str, object]) -> dict[str, float]:
    """``{k: float(v)}`` with one device-to-host transfer per device for the tensor values
    (``float()`` of each one would wait for the device once per value); the same numbers: every
    float dtype of one element converts exactly to float64, and ``tolist`` gives a float dtype's
    values exactly. Values of one dtype on a device are stacked as they are (a conversion of each
    first costs ~3 us a value: ~0.2 ms for a record of 75 mode strengths)."""
    values = list(metrics.values())
    if values and all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in values) and len({v.dtype for v in values}) == 1:
        try:  # the usual record, numbers of one dtype on one device (else stack refuses)
            with torch.no_grad():
                return dict(zip(metrics, map(float, torch.stack(values).tolist())))
        except RuntimeError:
            pass
    out: dict[str, float] = {}
    on: dict[torch.device, list[str]] = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            on.setdefault(v.device, []).append(k)
        else:
            out[k] = float(v)  # type: ignore[arg-type]
    with torch.no_grad():
        for keys in on.values():
            scalars = [metrics[k] for k in keys]
            scalars = [t if t.dim() == 0 else t.reshape(()) for t in scalars]  # type: ignore[union-attr]
            if len({t.dtype for t in scalars}) > 1:
                scalars = [t.to(torch.float64) for t in scalars]
            out.update((k, float(x)) for k, x in zip(keys, torch.stack(scalars).tolist()))
    return {k: out[k] for k in metrics}


def log_step(trainer: pl.Trainer) -> int:
    """Where the run's scalars go on TensorBoard's x-axis now: the updates the module's weights have
    had, ``global_step``, or for a module whose batch is a block of online-SGD steps
    (``logs_on_samples``, the teacher-student students: [S] Sec. 2.2) the SGD steps, ``samples_seen``.

    The convention of every scalar the zoo logs: a value measured on the weights after ``x`` updates
    is logged at ``x``; a callback logs at the module's axis whatever unit it schedules on."""
    module = trainer.lightning_module
    return int(module.samples_seen) if getattr(module, "logs_on_samples", False) else trainer.global_step


def log_scalars(trainer: pl.Trainer, metrics: dict[str, float], step: int | None = None) -> None:
    """Write ``metrics`` straight to every logger at ``step`` (default :func:`log_step`); a
    TensorBoard logger gets them as one event (:func:`zoo.training.scalar_events.write_scalars`)."""
    step = log_step(trainer) if step is None else step
    if trainer.loggers:
        values = host_floats(metrics)
        for logger in trainer.loggers:
            write_scalars(logger, values, step)


def log_batch_scalars(module: pl.LightningModule, step: int, losses: Mapping[str, torch.Tensor],
                      members: torch.Tensor | None = None, prog_bar: bool = True) -> None:
    """A training batch's scalars: under each key of ``losses`` the mean of its tensor (e.g.
    ``{"loss": member_losses}``) and each member's loss ``members`` (E,) as ``loss/<label>``
    (``module.labels``; while ``1 < E <= MAX_MEMBER_TAGS``), at ``step``, the step of the weights the
    losses were measured on. Call it once per training batch, after the batch's updates.

    The loggers get a row on every ``log_every_n_steps``-th batch of the fit (:func:`batch_written`),
    written here, at ``step``: the rows Lightning writes when a module logs every batch, but counted
    by the zoo, so that a resumed run writes the rows of the run it continues (Lightning 2.6 counts
    one batch more after resuming from a checkpoint saved at an epoch's end, and its rows move by one
    batch). ``module.log`` (``logger=False``) gives the progress bar (``prog_bar``: it shows every
    batch's ``losses``) and ``callback_metrics``: the losses at the last batch of an epoch and of the
    fit (:func:`ends_epoch_or_fit`: what ``EarlyStopping`` and ``ModelCheckpoint(monitor="loss")``
    read at the epoch's end), every key on the written batches; between them ``callback_metrics``
    hold the last logged values. Why not every batch: ``self.log`` costs ~0.2-0.5 ms a key
    (Lightning moves its stored result to the value's device at every call), as much as a GD step of
    4,096 members, so a key is logged where something reads it."""
    bar = tuple(losses) if prog_bar else ()
    if not batch_written(module.trainer) and not read_keys(module, tuple(losses), False, bar):
        return  # nothing reads this batch's values (most batches): they are not even computed
    means = {key: values.mean() for key, values in losses.items()}
    per_member = ({f"loss/{lbl}": l for lbl, l in zip(module.labels, members)}
                  if members is not None and 1 < len(members) <= MAX_MEMBER_TAGS else {})
    log_batch_rows(module, step, {**means, **per_member}, prog_bar=tuple(means) if prog_bar else ())


def log_batch_rows(module: pl.LightningModule, step: int, values: Mapping[str, torch.Tensor],
                   prog_bar: tuple[str, ...] = ("loss",), pending: int = 0) -> None:
    """A training batch's scalars ``values`` (each a number), by :func:`log_batch_scalars`' rule: a
    row in the loggers on every ``log_every_n_steps``-th batch of the fit (:func:`batch_written`),
    written here at ``step``; ``module.log`` (``logger=False``) of the keys in ``prog_bar`` while a
    progress bar shows them, of every key on the written batches and at the end of an epoch or of
    the fit. For a module that logs per-batch values by ``self.log``, counted so that a resumed run
    writes the rows of the run it continues: Lightning 2.6 counts one batch more after resuming from a
    checkpoint saved at an epoch's end after that epoch's validation, under ``max_steps``, and its
    rows move by one batch from there on (automatic optimisation or not). ``pending``: the updates
    of this batch still to come (1 from a ``training_step`` under automatic optimisation)."""
    written = batch_written(module.trainer)
    log_where_read(module, values, written, prog_bar, pending)
    if written:
        log_scalars(module.trainer, values, step=step)


def log_where_read(module: pl.LightningModule, values: Mapping[str, torch.Tensor], written: bool,
                   prog_bar: tuple[str, ...] = ("loss",), pending: int = 0) -> None:
    """``module.log`` of a training batch's ``values``, not to the loggers, where something reads them:
    every key on a batch whose row the loggers get (``written``) and at the end of an epoch or of the
    fit (``EarlyStopping``, ``ModelCheckpoint(monitor=...)`` read ``callback_metrics`` there), the keys
    in ``prog_bar`` on every batch while a progress bar shows them. ``self.log`` costs ~0.2-0.5 ms a
    key, as much as a step of the zoo's small networks."""
    for key in read_keys(module, tuple(values), written, prog_bar, pending):
        module.log(key, values[key], prog_bar=key in prog_bar, logger=False)


def read_keys(module: pl.LightningModule, keys: tuple[str, ...], written: bool,
              prog_bar: tuple[str, ...] = ("loss",), pending: int = 0) -> tuple[str, ...]:
    """Which of a training batch's ``keys`` something reads (:func:`log_where_read`'s rule): all of
    them on a written batch and at the end of an epoch or of the fit, else those in ``prog_bar``
    while a progress bar shows them, else none."""
    if written or ends_epoch_or_fit(module, pending):
        return keys
    if prog_bar and module.trainer.progress_bar_callback is not None:
        return tuple(k for k in keys if k in prog_bar)
    return ()


def batch_progress(trainer: pl.Trainer) -> Any:
    """Lightning's count of the fit's training batches (its ``_BatchProgress``: ``total`` and
    ``current`` counts of the batches ready, started, processed and completed, and ``is_last_batch``).

    The zoo's one read of the fit loop's state (``trainer.fit_loop.epoch_loop.batch_progress``, the
    same chain in lightning 2.5 and 2.6): Lightning exposes no public count of the batches of a fit
    across epochs and resumes, nor whether a batch ends its epoch when the loader has no length
    (it knows by fetching the next one). Listed in docs/development.md."""
    return trainer.fit_loop.epoch_loop.batch_progress


def batch_written(trainer: pl.Trainer) -> bool:
    """Whether this training batch gets a row in the loggers: every ``log_every_n_steps``-th batch of
    the fit (counted across epochs and resumes, by the batches started), and any batch once the run
    is stopping or in a ``fast_dev_run`` (Lightning's rule for what a module logs, lightning 2.6;
    tests/models/test_deep_linear_fast_path.py and tests/training/test_batch_scalars.py check the rows)."""
    every = trainer.log_every_n_steps
    batches = batch_progress(trainer).total.ready  # this one included
    return (every > 0 and batches % every == 0) or trainer.should_stop or bool(trainer.fast_dev_run)


def ends_epoch_or_fit(module: pl.LightningModule, pending: int = 0) -> bool:
    """This training batch ends an epoch or the fit (``max_steps``; ``global_step`` counts its
    updates already, but for ``pending`` of them)."""
    trainer = module.trainer
    return (batch_progress(trainer).is_last_batch
            or 0 <= trainer.max_steps <= module.global_step + pending)


def overlay_charts(trainer: pl.Trainer, title: str, charts: dict[str, str]) -> None:
    """A TensorBoard CUSTOM SCALARS section ``title`` with one multi-line chart per entry
    (chart name -> tag regex), e.g. a member's simulated curve and its theory on one plot."""
    from lightning.pytorch.loggers import TensorBoardLogger

    if not trainer.is_global_zero:
        return
    layout = {title: {name: ["Multiline", [regex]] for name, regex in charts.items()}}
    for lg in trainer.loggers:
        if isinstance(lg, TensorBoardLogger):
            lg.experiment.add_custom_scalars(layout)


def output_path(trainer: pl.Trainer, name: str) -> Path:
    """A fresh path for ``name`` in the run's log folder; never overwrites an existing file."""
    # the logger's own folder, not trainer.log_dir: that one is a broadcast (a collective), and this
    # is called on rank 0 only
    log_dir = trainer.loggers[0].log_dir if trainer.loggers else None
    folder = Path(log_dir or trainer.default_root_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path, stem, i = folder / name, Path(name).stem, 1
    while path.exists():
        path, i = folder / f"{stem}_{i}{Path(name).suffix}", i + 1
    return path


_warned: set[str] = set()


def write_table(trainer: pl.Trainer, name: str, rows: list[dict]) -> Path:
    """``rows`` as the CSV file ``name`` (a fresh path, :func:`output_path`); the columns are every
    row's keys in order of appearance."""
    with open(path := output_path(trainer, name), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    return path


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        rank_zero_warn(message, stacklevel=5)  # where warn_once was called, not this line


def log_figure(trainer: pl.Trainer, tag: str, fig, png: str | None = None, step: int | None = None) -> Path | None:
    """Log a matplotlib ``fig`` (from ``zoo.plots``) to every TensorBoard logger with
    ``add_figure`` and, if ``png`` is given, write it once as a PNG in the run folder (a fresh
    name, see ``output_path``). Rank 0 only; the figure is closed afterwards. Returns the PNG path."""
    import matplotlib.pyplot as plt
    from lightning.pytorch.loggers import TensorBoardLogger

    path = None
    try:
        if not trainer.is_global_zero:
            return None
        if png is not None:
            path = output_path(trainer, png)
            fig.savefig(path)
        step = log_step(trainer) if step is None else step
        for lg in trainer.loggers:
            if isinstance(lg, TensorBoardLogger):
                lg.experiment.add_figure(tag, fig, global_step=step, close=False)
    finally:
        plt.close(fig)
    return path


def log_matrix(trainer: pl.Trainer, tag: str, M, step: int | None = None, **kw) -> bool:
    """Log ``M`` as a heatmap (``zoo.plots.matrix.heatmap``'s picture, drawn on a canvas kept per
    shape: ``heatmap_rgb``) to every TensorBoard logger, rank 0 only; warn once and skip where none
    is attached."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from zoo.plots.matrix import heatmap_rgb

    loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
    if not loggers:
        warn_once("matrix images need a TensorBoardLogger; none is attached, so they are skipped")
        return False
    if trainer.is_global_zero:
        rgb = heatmap_rgb(M, title=kw.pop("title", tag), **kw)
        step = log_step(trainer) if step is None else step
        for lg in loggers:
            lg.experiment.add_image(tag, rgb, global_step=step, dataformats="HWC")
    return True
