"""Exact-resume checks shared by the per-family tests: run a recipe uninterrupted, stopped by a
smaller ``max_steps`` or killed with SIGKILL after a mid-run checkpoint, resume it with
``--ckpt_path last``, and compare final weights, logged scalars and figures bit for bit.

Runs go through the zoo's CLI (``zoo.cli.build_cli`` in-process, or ``python -m zoo`` in a
subprocess for the kill), each in its own folder, so ``lightning_logs/version_0`` is the run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

REPO = Path(__file__).resolve().parents[1]


def fit(folder: Path, *args: str) -> Path:
    """``zoo fit *args`` in-process with ``folder`` as the working directory; returns the run folder."""
    from zoo.cli import build_cli

    folder.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        build_cli(["fit", *args, "--trainer.enable_progress_bar=false"])
    finally:
        os.chdir(cwd)
    return folder / "lightning_logs" / "version_0"


def checkpoint_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def fit_killed(folder: Path, *args: str, sig: int = signal.SIGKILL, timeout: float = 120.0) -> int:
    """``python -m zoo fit *args`` in a subprocess, sent ``sig`` (SIGKILL) as soon as its first
    ``last.ckpt`` exists; returns the step of the ``last.ckpt`` it leaves. Fails if the run finished
    first (then nothing was tested: give it a longer budget). A SIGTERM must end it with exit code
    143 (the zoo's: stopped, checkpoint saved)."""
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = folder / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    # as many threads as this process: a float reduction split over another number of threads may
    # round differently, and the resumed part runs here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(torch.get_num_threads())}
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "fit", *args, "--trainer.enable_progress_bar=false"],
                            cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while not ckpt.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before its first checkpoint:\n"
                                 f"{proc.stderr.read().decode()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("no checkpoint within the timeout")
        time.sleep(0.02)
    proc.send_signal(sig)
    proc.wait(timeout=timeout)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 143
    assert proc.returncode == expected, f"exit {proc.returncode}, expected {expected}:\n{err[-3000:]}"
    # TensorBoard reads a folder's event files in name order, whose first key is the second they were
    # opened in: the resumed part's file (which carries the purge) must come after the killed part's
    time.sleep(1.05 - time.time() % 1.0)
    return checkpoint_step(ckpt)


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run's TensorBoard events, as TensorBoard shows it (events after a
    resumed run's purge step dropped): tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def figures(run: Path) -> dict[str, bytes]:
    """The newest PNG of each name in the run folder (a resumed run writes ``name_1.png`` beside the
    stopped run's ``name.png``): stem -> bytes."""
    newest: dict[str, Path] = {}
    for p in sorted(run.glob("*.png"), key=lambda p: p.stat().st_mtime):
        stem = p.stem.rsplit("_", 1)[0] if p.stem.rsplit("_", 1)[-1].isdigit() and p.with_name(
            p.stem.rsplit("_", 1)[0] + ".png").exists() else p.stem
        newest[stem] = p
    return {k: p.read_bytes() for k, p in newest.items()}


def assert_same_run(reference: Path, resumed: Path, *, stop_step: int | None = None) -> None:
    """Final weights, scalars and figures of ``resumed`` equal ``reference``'s bit for bit.

    ``stop_step``: the step a ``max_steps`` stop ended the first part at. That run logged its
    end-of-run summaries there, and they stay in TensorBoard (only steps after the checkpoint are
    purged); at that step the reference's points must be among the resumed run's.
    """
    wa, wb = weights(reference), weights(resumed)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), f"weight {k} differs after the resume"
    sa, sb = scalars(reference), scalars(resumed)
    for tag, points in sa.items():
        got = sb.get(tag, [])
        if stop_step is not None:
            extra = [p for p in got if p[0] == stop_step and p not in points]
            got = [p for p in got if p not in extra]
        assert got == points, f"scalar {tag}: {points[:5]}... != {got[:5]}..."
    extra_tags = [t for t in sb if t not in sa and any(s != stop_step for s, _ in sb[t])]
    assert not extra_tags, f"tags only in the resumed run: {extra_tags[:5]}"
    fa, fb = figures(reference), figures(resumed)
    assert fa.keys() <= fb.keys(), f"figures missing after the resume: {sorted(fa.keys() - fb.keys())}"
    for name in fa:
        assert fa[name] == fb[name], f"figure {name}.png differs after the resume"


class KeepCheckpoint(pl.Callback):
    """Copies ``last.ckpt`` as it was at ``step`` to ``kept.ckpt``. Put back after the run, the run
    folder is that of a run killed later than that checkpoint: it holds what it logged after it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # runs before RunCheckpoint's save of this batch: last.ckpt still holds an earlier step
        ckpt = Path(trainer.log_dir) / "checkpoints" / "last.ckpt"
        if ckpt.exists() and not ckpt.with_name("kept.ckpt").exists() and checkpoint_step(ckpt) == self.step:
            shutil.copy(ckpt, ckpt.with_name("kept.ckpt"))


def resume_from_kept(folder: Path, args: list[str], step: int) -> Path:
    """A whole run that kept its checkpoint at ``step``, resumed from that checkpoint: as a run killed
    after it (every point logged after the checkpoint is purged), in-process. Returns the run folder."""
    keep = json.dumps({"class_path": "resume_harness.KeepCheckpoint", "init_args": {"step": step}})
    fit(folder, *args, f"--trainer.callbacks+={keep}")
    ckpts = folder / "lightning_logs/version_0/checkpoints"
    shutil.move(ckpts / "kept.ckpt", ckpts / "last.ckpt")
    return fit(folder, *args, "--ckpt_path", "last")
