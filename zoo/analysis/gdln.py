"""Statistics of loss curves of GDLNs and ReLU nets ([H]): the stereotypical run of many and the
spread of their epochs to fractions of the initial loss (Sec. 6, Fig. 6b); learning times and
trajectories against the margin of the XoR task, beside the closed forms (Fig. 2d-e)."""
from __future__ import annotations

import torch
from torch import Tensor

from zoo.theory import gdln as theory
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


def xor_setting(nets: dict) -> dict:
    """The closed forms' ``tau``, ``a0`` and loss ``unit`` for ``nets`` (name -> network; the first
    sets the time scale, the first with ``initial_mode_strength`` the initial strength, else 1e-6):
    the keywords of :func:`xor_times` and :func:`xor_trajectories`."""
    m0 = next(iter(nets.values()))
    a0 = next((m.initial_mode_strength() for m in nets.values() if hasattr(m, "initial_mode_strength")), 1e-6)
    return dict(tau=m0.tau(4), a0=a0, unit=4.0 if m0.reduction == "sum" else 1.0)  # closed forms: mean loss


def xor_times(curves: dict[str, tuple[Tensor, Tensor]], deltas: Tensor, criterion: float, *, tau: float, a0: float,
              unit: float = 1.0) -> dict[str, Tensor]:
    """[H] Fig. 2d: steps to the loss ``criterion`` (a mean loss over the 4 points) for every
    network's curve (epochs (T,), loss (T, E), one member per margin, in units of ``unit`` times the
    mean loss) and the closed forms of the linear and XoR ReLNs ([H] App. C), ``closed_form_<kind>``."""
    out = {name: theory.time_to_loss(t, L, criterion * unit) for name, (t, L) in curves.items()}
    for kind in ("linear", "xor"):
        out[f"closed_form_{kind}"] = theory.xor_time_to_loss(deltas, kind, tau=tau, a0=a0, criterion=criterion)
    return out


def xor_trajectories(curves: dict[str, tuple[Tensor, Tensor]], deltas: Tensor, targets: list[float], *, tau: float,
                     a0: float, unit: float = 1.0) -> list[dict]:
    """[H] Fig. 2e, one dict per margin in ``targets``: the member nearest it (``member``, its
    ``Delta``), the epochs ``t``, each network's loss (``simulated``: name -> (T,)) and both closed
    forms (``closed_form``: 'linear'/'xor' -> (T,)), in the curves' loss units."""
    deltas = deltas.double()
    t = next(iter(curves.values()))[0]
    return [{"member": e, "Delta": float(deltas[e]), "t": t,
             "simulated": {name: L[:, e] for name, (_, L) in curves.items()},
             "closed_form": {k: unit * theory.xor_loss(t, deltas[e], k, tau=tau, a0=a0) for k in ("linear", "xor")}}
            for e in sorted({int((deltas - d).abs().argmin()) for d in targets})]
