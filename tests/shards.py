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
# seconds per file, whole suite, one process, idle 2-core machine (2026-11-25); only for balance
SECONDS = {
    "test_recipes.py": 44.7, "test_resume_streams.py": 41.0, "test_gdln.py": 35.0, "test_resume_gdln.py": 34.6,
    "test_errors.py": 27.6, "test_resume_vae.py": 26.1, "test_ddp_linear.py": 24.1, "test_resume_deep_linear.py": 36.0,
    "test_meanfield.py": 14.0, "test_ddp_vae.py": 9.9, "test_cli.py": 9.4, "test_teacher_student_callbacks.py": 7.4,
    "test_ddp_multihead.py": 5.4, "test_reln_imitation.py": 5.0, "test_linear_callbacks.py": 3.9,
    "test_ddp_gdln.py": 3.1, "test_student.py": 2.9, "test_entropy_phase.py": 2.6, "test_forgetting_callbacks.py": 2.3,
    "test_deep_linear.py": 2.2, "test_multihead.py": 2.1, "test_dci.py": 2.0,
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
