"""The one table ``make bench`` ends with: every row the benches reported (``harness.report``).

    python bench/summary.py ROWS.jsonl
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys

from harness import table


def main(path: str) -> int:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        print("no bench reported a row")
        return 1
    loads = sorted({r["load"] for r in rows})
    print(f"\n## Summary ({datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{rows[0]['threads']} torch thread(s), load averages seen {loads[0]}-{loads[-1]})\n")
    print(table(rows))
    missed = [r["path"] for r in rows if not r["met"]]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} rows at or over their goal" +
          (f"; missed: {', '.join(missed)}" if missed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
