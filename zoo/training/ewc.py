"""Elastic weight consolidation (Kirkpatrick et al. 2017; [S] Sec. 4.2.2, docs/theory.md#ewc).

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

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor, nn


@dataclass
class EWC:
    """EWC settings.

    Args:
        xi: penalty strength (0 switches the penalty off but still records the Fisher); a list
            gives each ensemble member its own (the protected parameters' leading dimension).
        tasks: tasks (0-based) whose end consolidates; default every task but the last.
        decay: online EWC's decay of the accumulated Fisher per consolidation, in [0, 1];
            ``None`` sums the Fishers (plain EWC).
        samples: samples the Fisher averages over.
        fisher: ``"sampled"`` (the true Fisher: labels drawn from the model; for the squared
            error of a regression, ``y ~ N(f(x), 1)``) or ``"empirical"`` (the true labels;
            note that it vanishes where a noiseless teacher is fitted exactly).
    """

    xi: float | list[float] = 0.0
    tasks: list[int] | None = None
    decay: float | None = None
    samples: int = 2000
    fisher: Literal["sampled", "empirical"] = "sampled"

    def __post_init__(self) -> None:
        xis = self.xi if isinstance(self.xi, (list, tuple)) else [self.xi]
        if not xis or any(not (0 <= float(x) < float("inf")) for x in xis):
            raise ValueError(f"EWC: xi = {self.xi}; allowed: a finite number >= 0 or a non-empty list of them")
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


def _count_from_buffer(module: "EWCState", incompatible_keys) -> None:
    module.n_consolidated = int(module.consolidations)


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
        # a host copy of the count: `active` is read at every step, and reading a GPU buffer waits for the GPU
        self.n_consolidated = 0
        self.register_load_state_dict_post_hook(_count_from_buffer)

    @property
    def xi(self) -> float | Tensor:
        """The strength: a float, or (E,) with one value per ensemble member."""
        x = self.config.xi
        if isinstance(x, (list, tuple)):
            return torch.tensor([float(v) for v in x], dtype=torch.float64, device=self.consolidations.device)
        return float(x)

    def _xi_like(self, t: Tensor) -> float | Tensor:
        """``xi`` broadcastable against ``t`` (per-member values along its leading dimension)."""
        xi = self.xi
        if isinstance(xi, float):
            return xi
        if t.dim() == 0 or t.shape[0] != xi.shape[0]:
            raise ValueError(f"EWC: {xi.shape[0]} values of xi but the parameter has shape {tuple(t.shape)}")
        return xi.to(t).view(-1, *([1] * (t.dim() - 1)))

    @property
    def active(self) -> bool:
        """True once a task was consolidated and some ``xi > 0``: the penalty is on."""
        x = self.config.xi
        return self.n_consolidated > 0 and any(float(v) > 0 for v in (x if isinstance(x, (list, tuple)) else [x]))

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
            F.mul_(0.0 if self.n_consolidated == 0 else (1.0 if g is None else g))
            F.add_(fisher[n].detach().to(F))
            self.anchor(n).copy_(params[n].detach())
        self.consolidations += 1
        self.n_consolidated += 1

    def penalty(self, params: dict[str, Tensor]) -> Tensor:
        """``xi/2 sum F (W - W*)^2`` over the protected parameters (differentiable; 0 if inactive)."""
        total = torch.zeros(())
        for n in self.names:
            sq = self.fisher(n) * (params[n] - self.anchor(n)).pow(2)
            total = total + (self._xi_like(sq) * sq).sum()
        return 0.5 * total

    def member_penalty(self, params: dict[str, Tensor]) -> Tensor:
        """The penalty of every ensemble member (leading dimension of each parameter), (E,)."""
        total = 0.0
        for n in self.names:
            sq = self.fisher(n) * (params[n] - self.anchor(n)).pow(2)
            total = total + (self._xi_like(sq) * sq).flatten(1).sum(1)
        return 0.5 * total

    def gradient(self, name: str, param: Tensor) -> Tensor:
        """``d penalty / d param = xi F (W - W*)``."""
        diff = self.fisher(name) * (param - self.anchor(name))
        return self._xi_like(diff) * diff

    def check_step_size(self, step: float, labels: list[str], owner: str, step_name: str = "lr") -> None:
        """Raise if plain SGD with step size ``step`` on the penalty would oscillate and grow: its
        update of one weight is ``W - W* <- (1 - step xi F)(W - W*)``, stable only for
        ``step xi F < 2``. ``labels`` name the members (the parameters' leading dimension)."""
        F_max = torch.stack([self.fisher(n).flatten(1).amax(1) for n in self.names]).amax(0).double().cpu()  # (E,)
        xi = torch.as_tensor(self.xi, dtype=torch.float64).cpu().expand(F_max.shape[0])
        stiff = step * xi * F_max
        if bool((stiff >= 2.0).any()):
            e = int(stiff.argmax())
            raise ValueError(
                f"{owner}: ewc.xi = {float(xi[e]):g} is too large for SGD ({labels[e]}): "
                f"{step_name} * xi * max(F) = {float(stiff[e]):.3g} >= 2 (the largest Fisher entry is "
                f"{float(F_max[e]):.3g}); allowed: xi < {2.0 / (step * float(F_max[e])):.3g} at {step_name} = {step:g}")

    def summary(self) -> dict[str, float]:
        """Summary statistics of the stored Fisher, for logging."""
        Fs = torch.cat([self.fisher(n).flatten() for n in self.names]) if self.names else torch.zeros(1)
        return {"fisher/mean": float(Fs.mean()), "fisher/max": float(Fs.max()),
                "fisher/consolidations": float(self.consolidations)}


def ensemble_state(config: EWC | None, xis: list[float] | None, G: int,
                   shapes: dict[str, torch.Size | tuple[int, ...]]) -> EWCState | None:
    """The EWC buffers of an ensemble module whose initialisations are each replicated for ``G``
    data sets: a per-initialisation ``xi`` list is repeated like the weights (``None`` without EWC)."""
    if config is None:
        return None
    if xis is not None:
        config = replace(config, xi=[x for x in xis for _ in range(G)])
    return EWCState(shapes, config)
