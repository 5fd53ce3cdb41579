"""Stop a run whose loss went NaN or infinite, with a message that says where and why."""
from __future__ import annotations

import warnings
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


def drop_diverged(losses: Tensor, alive: Tensor, *, step: int, labels: Sequence[str], hint: str) -> Tensor:
    """The ensemble's survivors after this step's losses (E,): members whose loss is NaN/inf drop
    out with a warning that names them and the step; ``DivergenceError`` when none is left.

    For sweeps over thousands of initialisations, where the edge of stability is part of what is
    being mapped: one diverging member should not end the others' run. Returns the new mask (E,).
    """
    finite = torch.isfinite(losses.detach())
    survivors = alive & finite
    newly = alive & ~finite
    if bool(newly.any()):
        names = [labels[i] if i < len(labels) else str(i) for i in torch.nonzero(newly).flatten().tolist()]
        if not bool(survivors.any()):
            raise DivergenceError(f"the loss is not finite at step {step} for every remaining ensemble member "
                                  f"({', '.join(names)}): training diverged and was stopped. {hint}")
        warnings.warn(f"ensemble member(s) {', '.join(names)} diverged at step {step} (loss not finite) and were "
                      f"dropped: they get no gradient from now on and their measures are no longer logged. {hint}",
                      RuntimeWarning, stacklevel=2)
    return survivors
