"""Shared fixtures: runs happen in a temporary folder; the CLI runs in-process (imports are slow)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _zoo_cache(tmp_path_factory):
    """Tests never write into the user's cache folder (~/.cache/specialisation-zoo): extracted
    MNIST, generated files and verification markers go to one temporary cache per session."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ZOO_CACHE", str(tmp_path_factory.mktemp("zoo-cache")))
    yield
    patch.undo()


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The one thread rule, for every test: torch on one intra-op thread here and in every subprocess
    a test starts (OMP_NUM_THREADS). The networks under test are tiny, so a second thread only waits
    for a core (measured 30x slower on a loaded CPU); pytest-xdist runs one worker per core instead;
    and bit-exact comparisons need one thread count on both sides. ``two_threads`` is for the
    tests of the zoo's own scoped thread choice (zoo.utils.threads)."""
    import os

    import torch

    patch = pytest.MonkeyPatch()
    patch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    patch.undo()


@pytest.fixture
def two_threads():
    """The process at 2 intra-op threads (torch's default on the 2-core machine), restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny(tmp_path):
    """A tiny MNIST folder in ``tmp_path/mnist`` (``helpers_mnist.tiny_mnist``: every digit a few times,
    each image traceable by its pixels), for the tests of the MNIST data modules."""
    from helpers_mnist import tiny_mnist

    return tiny_mnist(tmp_path / "mnist")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(*args: str):
    """Run the zoo's LightningCLI on ``args`` in this process; returns the CLI object."""
    from zoo.cli import build_cli

    return build_cli(list(args))


def recipe_smoke_args(path: Path) -> list[str]:
    """A recipe's ``# smoke-test: <extra CLI args>`` header (a tiny budget), else ``max_steps=3``."""
    import shlex

    for line in path.read_text().splitlines():
        if line.startswith("# smoke-test:"):
            return shlex.split(line.split(":", 1)[1])
    return ["--trainer.max_steps=3"]


def recipe_phase_1(path: Path) -> Path | None:
    """The recipe a phase 2 recipe reads the run folder of (``# needs-phase-1: <recipe>``), or None."""
    for line in path.read_text().splitlines():
        if line.startswith("# needs-phase-1:"):
            return REPO / "recipes" / line.split(":", 1)[1].strip()
    return None


def selected(request, name: str) -> bool:
    """Whether a test of ``request``'s module whose name contains ``name`` is in this session's run
    (for a module fixture that starts work those tests will need, only when they run)."""
    return any(item.module is request.module and name in item.name for item in request.session.items)


def start_zoo(folder: Path, *args: str, cwd: Path = REPO) -> tuple:
    """``python -m zoo *args`` started in the background, stdout and stderr into files in ``folder``.
    A module starts its subprocess runs when it begins: each pays an interpreter and Lightning's import
    (seconds), on the other core while the in-process tests run here. ``finish`` waits for it."""
    import os
    import subprocess
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    out, err = open(folder / "stdout", "w+"), open(folder / "stderr", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "zoo", *args], stdout=out, stderr=err, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc, out, err


def finish(started: tuple, timeout: float = 300.0):
    """Waits for a ``start_zoo`` run; returns a ``subprocess.CompletedProcess`` with its text output."""
    import subprocess

    proc, out, err = started
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read())
        f.close()
    return subprocess.CompletedProcess(proc.args, proc.returncode, *texts)


def stop_zoo(started: tuple) -> None:
    """Ends a ``start_zoo`` run still going (a fixture's teardown: its test did not ``finish`` it)."""
    proc, *files = started
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for f in files:
        f.close()
