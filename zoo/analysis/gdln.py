"""Statistics of many runs of a network ([H] Sec. 6, Fig. 6b): the stereotypical run and the
spread of the epochs to fractions of the initial loss."""
from __future__ import annotations

import torch
from torch import Tensor

from zoo.theory.gdln import times_to_fraction


def stereotypical_member(losses: Tensor) -> int:
    """The run whose loss curve is closest to the mean curve ([H] Fig. 6 caption: "the sum of L2
    distances across all timepoints"): ``argmin_e sum_t |L[t, e] - mean_e' L[t, e']|`` for a (T, E)
    array of losses (at one time point the L2 distance of two losses is their absolute difference)."""
    if losses.dim() != 2 or losses.shape[0] < 1 or losses.shape[1] < 1:
        raise ValueError(f"stereotypical_member: losses of shape {tuple(losses.shape)}; allowed: (T, E), T, E >= 1")
    L = losses.double()
    return int((L - L.mean(1, keepdim=True)).abs().sum(0).argmin())


def run_summary(losses: Tensor, fractions: tuple[float, ...]) -> dict:
    """The stereotypical run of every-epoch losses (T, E) (``member``), its epochs to each fraction
    of its initial loss (``epochs_to``, (F,)) and their range over the runs (``min``, ``max``)."""
    e = stereotypical_member(losses)
    times = times_to_fraction(torch.arange(losses.shape[0], dtype=torch.float64), losses, tuple(fractions))  # (F, E)
    return {"member": e, "epochs_to": times[:, e], "min": times.min(1).values, "max": times.max(1).values}
