"""bench/harness.py and bench/summary.py, what every bench relies on: interleaved rounds rotate the
order, a row's ratio and goal read the same way for rates and for times, the summary prints one
table from the rows the benches appended, and a bad flag is refused."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _harness():
    # bench/ is not a package: load its harness by path under a name of its own (sys.path stays;
    # the module is registered because its dataclass looks itself up there)
    spec = importlib.util.spec_from_file_location("bench_harness_under_test", BENCH / "harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


harness = _harness()


def test_interleaved_rotates_the_order_and_keeps_each_candidates_values():
    calls: list[str] = []

    def candidate(name: str, value: float):
        def run() -> float:
            calls.append(name)
            return value + len(calls)  # which call this was: the values follow the calls
        return run

    out = harness.interleaved({"a": candidate("a", 0.0), "b": candidate("b", 100.0), "c": candidate("c", 200.0)}, 4)
    assert calls == list("abc" "bca" "cab" "abc")
    assert out == {"a": [1.0, 6.0, 8.0, 10.0], "b": [102.0, 104.0, 109.0, 111.0], "c": [203.0, 205.0, 207.0, 212.0]}
    assert harness.median(out["b"]) == 106.5


def test_row_ratio_and_goal_for_rates_and_for_times():
    rate = harness.Row("p", zoo=300.0, baseline=200.0, unit="steps/s", goal=1.5)
    assert rate.ratio == 1.5 and rate.met
    assert not harness.Row("p", zoo=200.0, baseline=300.0, unit="steps/s", goal=0.9).met  # 0.67x
    # times: lower is better, the ratio is still "how many times faster the zoo is"
    time = harness.Row("p", zoo=4.0, baseline=2.0, unit="s", goal=0.9, lower_is_better=True)
    assert time.ratio == 0.5 and not time.met
    assert harness.Row("p", zoo=2.0, baseline=3.0, unit="s", goal=1.5, lower_is_better=True).met


def test_summary_prints_one_table_from_the_reported_rows(tmp_path, monkeypatch, capsys):
    rows = tmp_path / "rows.jsonl"
    monkeypatch.setenv("BENCH_SUMMARY", str(rows))
    harness.report([harness.Row("fast path", zoo=3.0, baseline=1.0, unit="steps/s", goal=2.0)])
    harness.report([harness.Row("slow path", zoo=2.0, baseline=1.0, unit="s", goal=0.9, lower_is_better=True)])
    assert "| fast path | 3 | 1 | steps/s | 3.00x | 2.00x | yes |" in capsys.readouterr().out
    out = subprocess.run([sys.executable, str(BENCH / "summary.py"), str(rows)], capture_output=True, text=True,
                         check=True).stdout
    assert out.count("| path | zoo | baseline | unit | ratio | goal | met |") == 1
    assert "| fast path | 3 | 1 | steps/s | 3.00x | 2.00x | yes |" in out
    assert "| slow path | 2 | 1 | s | 0.50x | 0.90x | NO |" in out
    assert "1 of 2 rows at or over their goal; missed: slow path" in out


@pytest.mark.parametrize("flag", ["--threads", "--rounds"])
def test_a_count_below_one_is_refused(flag, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_x.py", flag, "0"])
    with pytest.raises(SystemExit) as stop:
        harness.arguments("a bench")
    assert stop.value.code == 2
    assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err
