"""An ensemble whose members form a grid over their initial parameters, and how much of a
quantity's variation over that grid each parameter explains ([S] Sec. 4.2, Figs. 5 and 10).

Pure functions on ``member_params`` (one dict per member) and arrays; no Lightning, no plotting.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class InitGrid:
    """``member[i, j, k]`` is the member with ``values[axes[0]][i]``, ``values[axes[1]][j]``,
    ``values[axes[2]][k]`` (each axis sorted ascending)."""

    axes: tuple[str, ...]
    values: dict[str, np.ndarray]
    member: np.ndarray

    def arrange(self, per_member: torch.Tensor | np.ndarray) -> np.ndarray:
        """Per-member values ``(E,)`` as an array of the grid's shape."""
        v = per_member.detach().double().cpu().numpy() if isinstance(per_member, torch.Tensor) else np.asarray(per_member, float)
        return v[self.member]


def init_grid(member_params: Sequence[Mapping[str, object]], axes: Sequence[str]) -> InitGrid:
    """Find every member's cell on the grid spanned by the parameters ``axes``.

    A parameter no member has (it does not vary) is an axis of length 1 (value NaN). The members
    must enumerate the Cartesian product exactly once, in any order.

    Raises:
        ValueError: naming the cell two members share (another parameter varies) or the size of
            the grid the members do not fill.
    """
    E = len(member_params)
    columns = {a: np.asarray([float(p.get(a, np.nan)) for p in member_params]) for a in axes}
    values = {a: np.unique(c) if not np.isnan(c).all() else np.asarray([np.nan]) for a, c in columns.items()}
    member = np.full(tuple(len(values[a]) for a in axes), -1, dtype=np.int64)
    for e in range(E):  # bookkeeping once per fit over a few hundred members
        cell = tuple(0 if np.isnan(columns[a][e]) else int(np.searchsorted(values[a], columns[a][e])) for a in axes)
        if member[cell] >= 0:
            others = {k: v for k, v in member_params[e].items() if k not in axes}
            raise ValueError(f"init_grid: members {member[cell]} and {e} share the cell {dict(zip(axes, cell))} of "
                             f"{', '.join(axes)}; another parameter varies ({others}), which this grid cannot show")
        member[cell] = e
    if (member < 0).any():
        raise ValueError(f"init_grid: the {E} members do not fill the grid of {' x '.join(map(str, member.shape))} "
                         f"values of {', '.join(axes)} (zipped lists? set grid: true)")
    return InitGrid(tuple(axes), values, member)


def variance_explained(H: np.ndarray, axes: Sequence[str]) -> dict[str, float]:
    """Share of the variance of ``H`` over a full grid explained by each axis alone: the
    main-effect sums of squares of a balanced ANOVA, ``SS_a / SS_total`` with
    ``SS_a = sum over cells of (mean of H at the cell's level of a - mean of H)^2``.

    On a balanced grid the main effects are orthogonal, so the shares sum to at most 1; the rest
    is interaction. All 0 when ``H`` is constant.
    """
    H = np.asarray(H, dtype=float)
    total = ((H - H.mean()) ** 2).sum()
    out = {}
    for axis, key in enumerate(axes):
        level_means = H.mean(axis=tuple(a for a in range(H.ndim) if a != axis), keepdims=True)
        ss = ((np.broadcast_to(level_means, H.shape) - H.mean()) ** 2).sum()
        out[key] = float(ss / total) if total > 0 else 0.0
    return out


ENTROPIES = ("H_m", "H_Q", "H_h")
"""[S] Eq. 10: the aggregate (Fig. 5) first, then the unit and head entropies (Fig. 10)."""


def phase_record(grid: InitGrid, sim: Mapping[str, torch.Tensor], maxima: Mapping[str, float], threshold: float,
                 ode: Mapping[str, torch.Tensor] | None = None, ode_error: torch.Tensor | None = None,
                 error: torch.Tensor | None = None) -> dict:
    """The ``ENTROPIES`` of every member (``sim``; ``ode``: the mean-field ODE's at the same time)
    arranged on ``grid``, with each axis's share of their variance (``var_explained``: source ->
    entropy -> axis); beside the ODE the grid mean of ``|sim - ode|`` (``mean_abs_diff``) and the
    fraction of cells on the same side of ``threshold * maxima[H]`` (``same_side``); the final
    errors (``error``, ``ode_error``) on the grid where given."""
    r: dict = {"axes": grid.axes, "values": grid.values, "max": dict(maxima),
               "sim": {H: grid.arrange(sim[H]) for H in ENTROPIES}}
    if ode is not None:
        r["ode"] = {H: grid.arrange(ode[H]) for H in ENTROPIES}
        r["ode_error"] = grid.arrange(ode_error)
        cut = {H: threshold * r["max"][H] for H in ENTROPIES}
        r["mean_abs_diff"] = {H: float(np.abs(r["sim"][H] - r["ode"][H]).mean()) for H in ENTROPIES}
        r["same_side"] = {H: float(((r["sim"][H] < cut[H]) == (r["ode"][H] < cut[H])).mean()) for H in ENTROPIES}
    r["var_explained"] = {src: {H: variance_explained(r[src][H], grid.axes) for H in ENTROPIES}
                          for src in ("sim", "ode") if src in r}
    if error is not None:
        r["error"] = grid.arrange(error)
    return r


def phase_report(r: Mapping, header: str, converged: float) -> str:
    """A :func:`phase_record` as text: each axis's share of the variance, the simulation's mean at
    each value of each axis, the agreement with the ODE and the final errors (below ``converged``)."""
    a0, a1, a2 = r["axes"]
    lines = [f"{header}: share of the variance over the grid explained by each initial parameter alone"]
    for src, table in r["var_explained"].items():
        lines += [f"  {src:3s} {H}: " + ", ".join(f"{f} {v:.2f}" for f, v in s.items()) + f"  -> {max(s, key=s.get)}"
                  for H, s in table.items()]
    for H in ENTROPIES:
        H_sim = r["sim"][H]
        lines.append(f"  sim {H} mean at each {a2}: " + " ".join(f"{v:.2f}" for v in H_sim.mean(axis=(0, 1)))
                     + f" | each {a0}: " + " ".join(f"{v:.2f}" for v in H_sim.mean(axis=(1, 2)))
                     + f" | each {a1}: " + " ".join(f"{v:.2f}" for v in H_sim.mean(axis=(0, 2))))
    if "ode" in r:
        lines.append("  simulation vs ODE: " + ", ".join(
            f"{H} mean |diff| {r['mean_abs_diff'][H]:.3f}, same side {r['same_side'][H]:.0%}" for H in ENTROPIES))
    if "error" in r:
        eps = r["error"]
        lines.append(f"  final error: median {np.median(eps):.2e}, max {eps.max():.2e}, "
                     f"{(eps < converged).mean():.0%} of members below {converged:g}")
    return "\n".join(lines)
