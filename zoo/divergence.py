"""Stop a run whose loss went NaN or infinite, with a message that says where and why."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class DivergenceError(FloatingPointError):
    """Raised by a zoo module when its loss is not finite; training stops before the step."""


def check_finite(losses: Tensor, *, step: int, labels: Sequence[str], hint: str) -> None:
    """Raise ``DivergenceError`` naming the step and the members whose loss is NaN/inf.

    ``losses`` holds one loss per ensemble member (E,). One host sync per call: a cheap price
    for never logging a NaN curve.
    """
    finite = torch.isfinite(losses.detach())
    if bool(finite.all()):
        return
    bad = [labels[i] if i < len(labels) else str(i) for i in torch.nonzero(~finite).flatten().tolist()]
    raise DivergenceError(
        f"the loss is not finite at step {step} for ensemble member(s) {', '.join(bad)}: training diverged "
        f"and was stopped before the update. {hint}"
    )
