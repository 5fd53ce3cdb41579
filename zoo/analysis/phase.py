"""Does a simulated two-pathway phase diagram agree with the theory's ([S] Sec. 3.1, Fig. 3c)?"""
from __future__ import annotations

import torch
from torch import Tensor


def phase_agreement(lam1: Tensor, lam2: Tensor, escape: Tensor, share: Tensor, threshold_steps: float = 1.0,
                    max_share: float = 0.05) -> float:
    """Fraction of the grid points with ``|lam1| > |lam2|`` (where pathway 1 is the fast one, the
    only points [S] Algorithm 1 speaks about) on which theory and simulation call the same regime:
    specialised when the slow pathway's minimum escape time exceeds ``threshold_steps`` (theory)
    and when its share of the map is below ``max_share`` (simulation). NaN if no point qualifies.

    lam1 (n1,), lam2 (n2,); escape and share (n1, n2).
    """
    valid = lam1.abs()[:, None] > lam2.abs()[None, :]
    if not bool(valid.any()):
        return float("nan")
    theory = torch.nan_to_num(escape, nan=0.0) > threshold_steps
    simulated = share < max_share
    return float((theory == simulated)[valid].double().mean())
