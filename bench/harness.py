"""What every bench shares: one thread by default, interleaved rounds, medians, the load average,
and one summary row per measured path.

A bench compares the zoo with the strongest hand-written loop of the same arithmetic. The machines
are noisy, so the two sides are timed in interleaved rounds in one process (a burst of load hits
both) and the median of each side's rounds is compared. Each row a bench reports is also appended,
as one JSON line, to the file named by ``BENCH_SUMMARY`` (``make bench`` sets it); ``summary.py``
prints those rows as one table: path, zoo, baseline, ratio, goal, met.

    import harness
    args = harness.arguments(__doc__)          # --threads (default 1), --rounds
    times = harness.interleaved({"zoo": run_zoo, "loop": run_loop}, args.rounds)
    harness.report([harness.Row("DeepLinearNet, 100 steps/batch", zoo=..., baseline=..., unit="steps/s", goal=0.9)])
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import asdict, dataclass
from typing import Callable


def arguments(description: str | None = None, rounds: int = 5,
              extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The benches' common flags, with torch's thread count set from ``--threads`` (default 1:
    ratios are compared at one thread on both sides); ``extra(parser)`` adds a bench's own."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both sides (default 1)")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"interleaved rounds (default {rounds})")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    import torch  # here, not at the top: summary.py reads rows without paying torch's import

    torch.set_num_threads(args.threads)
    return args


def interleaved(candidates: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each candidate once per round, the order rotating from round to round so that none always
    runs first (warm caches, a burst of load); returns every round's value per candidate."""
    names = list(candidates)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            out[name].append(candidates[name]())
    return out


def median(values: list[float]) -> float:
    return statistics.median(values)


def load_average() -> str:
    """The 1-minute load average as text ("n/a" where the OS does not say)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"


@dataclass
class Row:
    """One measured path: the zoo's median and the baseline's, in the same unit (higher is
    faster: a rate such as steps/s; give times as their inverse, or set ``lower_is_better``)."""

    path: str
    zoo: float
    baseline: float
    unit: str
    goal: float
    lower_is_better: bool = False

    @property
    def ratio(self) -> float:
        """How many times faster the zoo is than the baseline."""
        return self.baseline / self.zoo if self.lower_is_better else self.zoo / self.baseline

    @property
    def met(self) -> bool:
        return self.ratio >= self.goal


def _number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def table(rows: list[dict]) -> str:
    """Rows (``Row`` fields plus ratio and met) as a Markdown table."""
    lines = ["| path | zoo | baseline | unit | ratio | goal | met |", "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['path']} | {_number(r['zoo'])} | {_number(r['baseline'])} | {r['unit']} | "
                     f"{r['ratio']:.2f}x | {r['goal']:.2f}x | {'yes' if r['met'] else 'NO'} |")
    return "\n".join(lines)


def report(rows: list[Row]) -> None:
    """Print the rows with the load average and the thread count, and append them to
    ``$BENCH_SUMMARY`` when set."""
    import torch

    as_dicts = [{**asdict(r), "ratio": r.ratio, "met": r.met, "load": load_average(),
                 "threads": torch.get_num_threads()} for r in rows]
    print(table(as_dicts))
    print(f"(medians of interleaved rounds; load average {load_average()}, {torch.get_num_threads()} torch thread(s))")
    target = os.environ.get("BENCH_SUMMARY")
    if target:
        with open(target, "a") as f:
            for d in as_dicts:
                f.write(json.dumps(d) + "\n")
