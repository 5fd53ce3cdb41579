"""``make test``: the whole suite as two pytest processes side by side, one per core.

    python tests/shards.py [pytest options...]      # e.g. -m "not slow", -x

Most tests run torch on one thread (bit-exact comparisons need a fixed thread count), so one
pytest process leaves the second core of a 2-core machine idle. This splits the test files into
two shards of about equal time (``SECONDS``: per-file times measured on an idle 2-core machine;
a file not listed counts 1 s), runs each shard in its own pytest process with its own temporary
folder, prints both reports, and exits with the first non-zero exit code. ``python -m pytest
tests`` in one process runs the same tests.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# seconds per file (setup, call and teardown of its tests), in the two shards of `make test` on an idle
# 2-core machine (2026-11-26); only for balance
SECONDS = {
    "test_recipes.py": 68.3, "test_resume_streams.py": 52.9, "test_resume_gdln.py": 47.4, "test_gdln.py": 41.5,
    "test_resume_deep_linear.py": 39.7, "test_errors.py": 37.9, "test_ddp_linear.py": 34.4,
    "test_resume_vae.py": 27.8, "test_meanfield.py": 18.4, "test_ddp_vae.py": 14.5, "test_cli.py": 12.0,
    "test_wheel.py": 10.5, "test_data_parallel.py": 8.9, "test_ddp_multihead.py": 8.8,
    "test_teacher_student_callbacks.py": 6.5, "test_reln_imitation.py": 6.2, "test_ddp_gdln.py": 4.9,
    "test_docs.py": 4.6, "test_entropy_phase.py": 3.5, "test_forgetting_callbacks.py": 3.2,
    "test_multihead.py": 3.0, "test_linear_callbacks.py": 2.9, "test_student.py": 2.5, "test_dci.py": 2.1,
    "test_fisher.py": 2.0, "test_mnist_continual.py": 1.8, "test_shapes.py": 1.8, "test_gdln_theory.py": 1.7,
    "test_accelerators.py": 1.6, "test_run_summary.py": 1.6, "test_vae_callbacks.py": 1.6,
    "test_callbacks.py": 1.5,
}


def split(files: list[Path], n: int = 2) -> list[list[Path]]:
    """``files`` in ``n`` shards of about equal time (the longest first, each to the lightest shard)."""
    shards: list[list[Path]] = [[] for _ in range(n)]
    load = [0.0] * n
    for f in sorted(files, key=lambda f: -SECONDS.get(f.name, 1.0)):
        i = load.index(min(load))
        shards[i].append(f)
        load[i] += SECONDS.get(f.name, 1.0)
    return shards


def main(options: list[str]) -> int:
    files = sorted(TESTS.glob("test_*.py"))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zoo-tests-") as tmp:
        procs, logs = [], []
        for i, shard in enumerate(split(files)):
            log = open(Path(tmp) / f"shard{i}.log", "w+")
            cmd = [sys.executable, "-m", "pytest", "-q", f"--basetemp={Path(tmp) / f'shard{i}'}", *options,
                   *map(str, shard)]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=TESTS.parent))
            logs.append(log)
        codes = [p.wait() for p in procs]
        for i, log in enumerate(logs):
            log.seek(0)
            print(f"==== shard {i + 1} of {len(logs)} (exit {codes[i]})")
            print(log.read(), end="")
            log.close()
    # pytest's exit code 5 means "no tests collected": a shard whose files a -m/-k deselected entirely
    failed = [c for c in codes if c not in (0, 5)]
    print(f"==== {len(codes)} shards in {time.monotonic() - start:.0f} s: "
          + ("all passed" if not failed else f"exit codes {codes}"))
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
