"""Multi-process runs for the DDP tests (``zoo.training.distributed``): the zoo's CLI with N CPU processes
under Lightning's DDP launcher, or as the processes of simulated nodes, each run in its own folder
so that ``lightning_logs/version_0`` is the run; and the checks the tests share (one set of files,
results equal to the one-process run).

Every run here has one torch thread per process: a float reduction split over another number of
threads may round differently, and the comparisons are bit for bit. The reference run
(:func:`fit_one`) runs in this process with one thread too, which saves an interpreter start.
Readers of checkpoints, scalars and figures are ``tests/resume_harness.py``'s.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Callable

import lightning.pytorch as pl
import torch

from resume_harness import REPO, assert_same_run, fit, scalars, weights

__all__ = ["RankState", "RANK_STATE", "rank_states", "run_ddp", "start_ddp", "run_nodes", "run_forked", "in_process_group", "fit_one", "written_files", "assert_one_set", "assert_same_results",
           "assert_close_results", "free_port", "weights", "scalars"]

DDP = ("--trainer.accelerator=cpu", "--trainer.strategy=ddp", "--trainer.enable_progress_bar=false")


def free_port() -> int:
    """A TCP port nobody listens on now (the rendezvous of one run)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           # a launcher's variables from an outer run would make the child believe it is one of its ranks
           if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK", "RANK", "MASTER_PORT", "MASTER_ADDR")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", **extra}


def _check(procs: list[subprocess.Popen], timeout: float) -> None:
    errors = []
    for i, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"process {i} did not finish within {timeout} s")
        if p.returncode != 0:
            errors.append(f"process {i}: exit {p.returncode}\n{err.decode()[-3000:]}")
    assert not errors, "\n".join(errors)


def start_ddp(folder: Path, *args: str, devices: int = 2, timeout: float = 240.0) -> Callable[[], Path]:
    """:func:`run_ddp` started in the background (its processes start while this one works on,
    e.g. on the reference run); returns the function that waits for it, asserts exit code 0 and
    returns the run folder."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "zoo", "fit", *args, *DDP, f"--trainer.devices={devices}"]
    env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finish() -> Path:
        _check([proc], timeout)
        return folder / "lightning_logs" / "version_0"
    return finish


def run_ddp(folder: Path, *args: str, devices: int = 2, timeout: float = 240.0) -> Path:
    """``python -m zoo fit *args`` with ``devices`` CPU processes (``--trainer.strategy=ddp``,
    Lightning's launcher starts the other ranks) in ``folder``; asserts exit code 0 and returns the
    run folder ``folder/lightning_logs/version_0``."""
    return start_ddp(folder, *args, devices=devices, timeout=timeout)()


def run_nodes(folder: Path, *args: str, nodes: int = 2, timeout: float = 240.0) -> Path:
    """``nodes`` simulated machines of one process each on localhost: this function starts every
    process itself (as a cluster's scheduler would, not Lightning's launcher), each
    ``--trainer.devices=1 --trainer.num_nodes=<nodes>`` with the variables Lightning's
    ``LightningEnvironment`` reads (``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``LOCAL_RANK``;
    ``WORLD_SIZE`` as torchrun sets it). All share ``folder`` as a cluster shares a file system;
    returns the run folder."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "zoo", "fit", *args, *DDP, "--trainer.devices=1", f"--trainer.num_nodes={nodes}"]
    port = str(free_port())
    procs = [subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(n),
                                       LOCAL_RANK="0", WORLD_SIZE=str(nodes)))
             for n in range(nodes)]
    _check(procs, timeout)
    return folder / "lightning_logs" / "version_0"


def run_forked(folder: Path, *args: str, nodes: int = 1, devices: int = 2, timeout: float = 240.0,
               strategy: str = "ddp") -> Path:
    """``devices`` processes on each of ``nodes`` simulated machines, ``--trainer.devices=<devices>
    --trainer.num_nodes=<nodes> --trainer.strategy=ddp``, without new interpreters: each process is a
    forked child of this one, started with the variables Lightning's ``LightningEnvironment`` reads
    (``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``), as Lightning's
    own launcher or a cluster's scheduler starts them, and it calls the CLI's ``main`` itself with
    torch, Lightning and the zoo already imported (about 5 s saved per process). Safe because this
    process runs torch with one thread (no OpenMP pool to inherit) and holds no process group. A
    child's output goes to ``<folder>.rank<r>.log``, beside the folder; returns the run folder.
    ``strategy``: another ``--trainer.strategy``, e.g. Lightning's plain DDP
    (``ddp_find_unused_parameters_false``), under which an ensemble trains data-parallel."""
    folder.mkdir(parents=True, exist_ok=True)
    port, world = str(free_port()), nodes * devices
    _fork([partial(_forked_rank, folder, (*args, *DDP, f"--trainer.strategy={strategy}"), r // devices, r % devices,
                   nodes, devices, port) for r in range(world)],
          [Path(f"{folder}.rank{r}.log") for r in range(world)], timeout)
    return folder / "lightning_logs" / "version_0"


def _forked_rank(folder: Path, args: tuple[str, ...], node: int, local: int, nodes: int, devices: int,
                 port: str) -> int:
    os.chdir(folder)
    for k in ("GROUP_RANK", "RANK"):
        os.environ.pop(k, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(node), LOCAL_RANK=str(local),
                      WORLD_SIZE=str(nodes * devices), OMP_NUM_THREADS="1")
    from zoo.cli import main

    try:
        main(["fit", *args, f"--trainer.devices={devices}", f"--trainer.num_nodes={nodes}"])
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


def in_process_group(folder: Path, fn: Callable[[int, int], object], world: int = 2, timeout: float = 60.0) -> list:
    """``fn(rank, world)`` in each of ``world`` processes forked from this one that form a gloo process
    group (``torch.distributed``, rendezvous in a file under ``folder``): what one rank of a run
    computes, without a Trainer. Returns each rank's return value (saved with ``torch.save``), in
    rank order. Forked as :func:`run_forked` (this process must hold no process group)."""
    folder.mkdir(parents=True, exist_ok=True)
    _fork([partial(_group_rank, folder, fn, r, world) for r in range(world)],
          [folder / f"rank{r}.log" for r in range(world)], timeout)
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _group_rank(folder: Path, fn: Callable[[int, int], object], rank: int, world: int) -> int:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder / 'rendezvous'}", rank=rank, world_size=world)
    try:
        torch.save(fn(rank, world), folder / f"rank{rank}.pt")
        dist.barrier()  # no rank leaves while another may still call a collective
    finally:
        dist.destroy_process_group()
    return 0


def _fork(jobs: list[Callable[[], int]], logs: list[Path], timeout: float) -> None:
    """Each job (rank r: ``jobs[r]``, returning an exit code) in a child forked from this process,
    its output to ``logs[r]``; asserts that every child exits with 0 within ``timeout`` s."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_child, args=(job, log)) for job, log in zip(jobs, logs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    if any(p.is_alive() for p in procs):
        for p in procs:
            p.kill()
        raise AssertionError(f"a forked process did not finish within {timeout} s")
    errors = [f"rank {r}: exit {p.exitcode}\n{logs[r].read_text()[-3000:]}" for r, p in enumerate(procs) if p.exitcode != 0]
    assert not errors, "\n".join(errors)


def _child(job: Callable[[], int], log_path: Path) -> None:
    code = 1
    try:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        torch.set_num_threads(1)
        code = job()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # not pytest's exit handlers: this is a copy of the test process


class RankState(pl.Callback):
    """At the end of training every rank saves what it holds, its module's state dict,
    ``samples_seen`` and the epoch it is in, beside the working directory (the run's folder):
    ``<folder>.rank<r>.pt``, as :func:`run_forked`'s logs, so that the folder holds the run's files
    alone. What the checkpoint, rank 0's, cannot show; or, where the rank stopped on an exception,
    its message (``error``: a forked child's messages do not reach its log). Add it with
    ``RANK_STATE``; read it with :func:`rank_states`."""

    def on_train_end(self, trainer, pl_module) -> None:
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        self._save(trainer, {"samples_seen": pl_module.samples_seen, "epoch": trainer.current_epoch, "state_dict": state})

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._save(trainer, {"error": str(exception)})

    @staticmethod
    def _save(trainer, what: dict) -> None:
        here = Path.cwd()
        torch.save(what, here.parent / f"{here.name}.rank{trainer.global_rank}.pt")


RANK_STATE = '--trainer.callbacks=[{"class_path": "helpers_ddp.RankState"}]'


def rank_states(run: Path, world: int = 2) -> list[dict]:
    """What :class:`RankState` saved on each rank of the run whose folder is ``run`` (``.../version_0``)."""
    folder = run.parents[1]
    return [torch.load(folder.parent / f"{folder.name}.rank{r}.pt", weights_only=False) for r in range(world)]


def fit_one(folder: Path, *args: str) -> Path:
    """The reference: ``zoo fit *args`` in this process on one CPU device with one torch thread;
    returns the run folder."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fit(folder, *args, "--trainer.accelerator=cpu", "--trainer.devices=1")
    finally:
        torch.set_num_threads(before)


def written_files(folder: Path) -> list[str]:
    """Every file under ``folder`` (paths relative to it), TensorBoard's event files by their
    folder only (their names carry the time and the process id)."""
    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            rel = p.relative_to(folder)
            out.append(str(rel.parent / "events.out.tfevents") if p.name.startswith("events.out.tfevents") else str(rel))
    return out


def assert_one_set(folder: Path, reference: Path) -> None:
    """``folder`` holds exactly the files the one-process run left in ``reference`` (same names,
    one event file, no ``_1`` copy written by a second rank, nothing in another version folder)."""
    got, want = written_files(folder), written_files(reference)
    assert got == want, f"files differ from the one-process run: only here {sorted(set(got) - set(want))}, " \
                        f"missing {sorted(set(want) - set(got))}, or repeated: {len(got)} vs {len(want)}"


def assert_same_results(reference: Path, run: Path) -> None:
    """Final weights (``last.ckpt``'s state dict), every TensorBoard scalar and every PNG of ``run``
    equal ``reference``'s bit for bit (member-parallel on CPU)."""
    assert_same_run(reference, run)


def assert_close_results(reference: Path, run: Path, *, rtol: float, atol: float, tags: list[str] | None = None) -> None:
    """Final weights and the scalars ``tags`` (default: every tag of ``reference``) of ``run``
    within ``rtol``/``atol`` of ``reference``'s, at the same steps (data-parallel: the same sums in
    another order)."""
    wa, wb = weights(reference), weights(run)
    assert wa.keys() == wb.keys(), f"state dicts differ: {sorted(wa.keys() ^ wb.keys())}"
    for k in wa:
        if torch.is_tensor(wa[k]) and wa[k].is_floating_point():
            torch.testing.assert_close(wb[k], wa[k], rtol=rtol, atol=atol, msg=lambda m: f"weight {k}: {m}")
    sa, sb = scalars(reference), scalars(run)
    for tag in tags if tags is not None else list(sa):
        assert tag in sb, f"scalar {tag} missing"
        assert [s for s, _ in sb[tag]] == [s for s, _ in sa[tag]], f"scalar {tag}: logged at other steps"
        torch.testing.assert_close(torch.tensor([v for _, v in sb[tag]]), torch.tensor([v for _, v in sa[tag]]),
                                   rtol=rtol, atol=atol, msg=lambda m: f"scalar {tag}: {m}")
