"""Summaries of a sweep's results over seeds (one row per model, [S] Fig. 4's box plots)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def group_means(rows: Sequence[dict], param: str, keys: Sequence[str]) -> dict[float, dict[str, float]]:
    """For each value of ``param`` (sorted), the mean of every ``keys`` entry over the rows that share it."""
    values = sorted({float(r[param]) for r in rows})
    return {v: {k: float(np.mean([r[k] for r in rows if float(r[param]) == v])) for k in keys} for v in values}
