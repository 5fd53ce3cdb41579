"""Elastic weight consolidation (Kirkpatrick et al. 2017; [S] Sec. 4.2.2, THEORY.md sec. 2).

``L_EWC(W) = L(W) + xi/2 sum_i F_i (W_i - W*_i)^2`` (the paper prints the penalty without its
square, a typo), with ``W*`` the weights at the end of a consolidated task and ``F`` the
diagonal Fisher there, computed per sample (``zoo.metrics.fisher.fisher_diagonal``).

Two pieces, usable by any module:

* :class:`EWC`, the configuration a module takes as a constructor argument (YAML:
  ``ewc: {xi: 0.01}``): the strength ``xi``, which tasks consolidate, online EWC's decay, and
  how the Fisher is estimated.
* :class:`EWCState`, an ``nn.Module`` holding the anchors and the Fisher of the protected
  parameters as buffers, so they are saved in checkpoints and a resumed run keeps its penalty.
  It computes the penalty (to add to an autograd loss) and its gradient
  ``xi F (W - W*)`` (for modules with an explicit update rule, like ``MultiHeadStudent``).

Online EWC (Schwarz et al. 2018): with ``decay = g`` the stored Fisher becomes
``g F_old + F_new`` at each consolidation and the anchor moves to the newest weights; without
it the Fishers of all consolidated tasks add up, anchored at the newest weights as well (a
single quadratic penalty; exact for one consolidated task, the case of [S] Fig. 7).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn


@dataclass
class EWC:
    """EWC settings.

    Args:
        xi: penalty strength (0 switches the penalty off but still records the Fisher).
        tasks: tasks (0-based) whose end consolidates; default every task but the last.
        decay: online EWC's decay of the accumulated Fisher per consolidation, in [0, 1];
            ``None`` sums the Fishers (plain EWC).
        samples: samples the Fisher averages over.
        fisher: ``"sampled"`` (the true Fisher: labels drawn from the model; for the squared
            error of a regression, ``y ~ N(f(x), 1)``) or ``"empirical"`` (the true labels;
            note that it vanishes where a noiseless teacher is fitted exactly).
    """

    xi: float = 0.0
    tasks: list[int] | None = None
    decay: float | None = None
    samples: int = 2000
    fisher: Literal["sampled", "empirical"] = "sampled"

    def __post_init__(self) -> None:
        if not (self.xi >= 0 and self.xi < float("inf")):
            raise ValueError(f"EWC: xi = {self.xi}; allowed: a finite number >= 0")
        if self.decay is not None and not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"EWC: decay = {self.decay}; allowed: null (plain EWC) or a number in [0, 1]")
        if int(self.samples) != self.samples or self.samples < 1:
            raise ValueError(f"EWC: samples = {self.samples}; allowed: a positive integer")
        if self.fisher not in ("sampled", "empirical"):
            raise ValueError(f"EWC: fisher = {self.fisher!r}; allowed: 'sampled' or 'empirical'")
        if self.tasks is not None and any(int(t) != t or t < 0 for t in self.tasks):
            raise ValueError(f"EWC: tasks = {self.tasks}; allowed: null or a list of task indices >= 0")

    def consolidates(self, task: int, n_tasks: int) -> bool:
        """Whether the end of ``task`` consolidates."""
        return task in self.tasks if self.tasks is not None else task < n_tasks - 1


def _key(name: str) -> str:
    return name.replace(".", "__")


class EWCState(nn.Module):
    """Anchors ``W*`` and Fisher ``F`` of the named parameters, as buffers.

    Args:
        shapes: name -> shape of every protected parameter (names as in ``named_parameters``).
        config: the :class:`EWC` settings.
    """

    def __init__(self, shapes: dict[str, torch.Size | tuple[int, ...]], config: EWC) -> None:
        super().__init__()
        self.config, self.names = config, list(shapes)
        for name, shape in shapes.items():
            self.register_buffer(f"anchor__{_key(name)}", torch.zeros(shape))
            self.register_buffer(f"fisher__{_key(name)}", torch.zeros(shape))
        self.register_buffer("consolidations", torch.tensor(0))

    @property
    def xi(self) -> float:
        return float(self.config.xi)

    @property
    def active(self) -> bool:
        """True once a task was consolidated and ``xi > 0``: the penalty is on."""
        return int(self.consolidations) > 0 and self.xi > 0

    def anchor(self, name: str) -> Tensor:
        return getattr(self, f"anchor__{_key(name)}")

    def fisher(self, name: str) -> Tensor:
        return getattr(self, f"fisher__{_key(name)}")

    @torch.no_grad()
    def consolidate(self, params: dict[str, Tensor], fisher: dict[str, Tensor]) -> None:
        """Store the current weights as the anchor and fold in the new Fisher."""
        missing = [n for n in self.names if n not in params or n not in fisher]
        if missing:
            raise ValueError(f"EWCState.consolidate: no weights or Fisher for {missing}")
        g = self.config.decay
        for n in self.names:
            F = self.fisher(n)
            F.mul_(0.0 if int(self.consolidations) == 0 else (1.0 if g is None else g))
            F.add_(fisher[n].detach().to(F))
            self.anchor(n).copy_(params[n].detach())
        self.consolidations += 1

    def penalty(self, params: dict[str, Tensor]) -> Tensor:
        """``xi/2 sum F (W - W*)^2`` over the protected parameters (differentiable; 0 if inactive)."""
        total = None
        for n in self.names:
            term = (self.fisher(n) * (params[n] - self.anchor(n)).pow(2)).sum()
            total = term if total is None else total + term
        if total is None:
            return torch.zeros(())
        return 0.5 * self.xi * total

    def member_penalty(self, params: dict[str, Tensor]) -> Tensor:
        """The penalty of every ensemble member (leading dimension of each parameter), (E,)."""
        total = 0.0
        for n in self.names:
            diff = (self.fisher(n) * (params[n] - self.anchor(n)).pow(2))
            total = total + diff.flatten(1).sum(1)
        return 0.5 * self.xi * total

    def gradient(self, name: str, param: Tensor) -> Tensor:
        """``d penalty / d param = xi F (W - W*)``."""
        return self.xi * self.fisher(name) * (param - self.anchor(name))

    def summary(self) -> dict[str, float]:
        """Summary statistics of the stored Fisher, for logging."""
        Fs = torch.cat([self.fisher(n).flatten() for n in self.names]) if self.names else torch.zeros(1)
        return {"fisher/mean": float(Fs.mean()), "fisher/max": float(Fs.max()),
                "fisher/consolidations": float(self.consolidations)}
