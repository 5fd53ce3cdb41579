"""Writing to a run's loggers and folder, for callbacks and modules alike: scalars at a chosen
step, figures through ``add_figure`` plus one PNG, heatmaps, TensorBoard's custom-scalar layout,
fresh file names that never overwrite a user's file, and warnings given once. Rank 0 writes."""
from __future__ import annotations

import csv
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn


def host_floats(metrics: dict[str, object]) -> dict[str, float]:
    """``{k: float(v)}`` with one device-to-host transfer per device for the tensor values
    (``float()`` of each one would wait for the device once per value); the same numbers: every
    float dtype of one element converts exactly to float64."""
    out: dict[str, float] = {}
    on: dict[torch.device, list[str]] = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            on.setdefault(v.device, []).append(k)
        else:
            out[k] = float(v)  # type: ignore[arg-type]
    for keys in on.values():
        values = torch.stack([metrics[k].detach().reshape(()).to(torch.float64) for k in keys]).tolist()  # type: ignore[union-attr]
        out.update(zip(keys, values))
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
    """Write ``metrics`` straight to every logger at ``step`` (default :func:`log_step`)."""
    step = log_step(trainer) if step is None else step
    if trainer.loggers:
        values = host_floats(metrics)
        for logger in trainer.loggers:
            logger.log_metrics(dict(values), step=step)


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
    """Log ``M`` as a heatmap (``zoo.plots.matrix.heatmap``) to every TensorBoard logger; warn once
    and skip where none is attached."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from zoo.plots.matrix import heatmap

    if not any(isinstance(lg, TensorBoardLogger) for lg in trainer.loggers):
        warn_once("matrix images need a TensorBoardLogger; none is attached, so they are skipped")
        return False
    log_figure(trainer, tag, heatmap(M, title=kw.pop("title", tag), **kw), step=step)
    return True
