"""Figures of the teacher-student setting ([S] Sec. 4): order parameters, the error beside the
mean-field ODE, error curves. Each builder returns a matplotlib ``Figure``; alpha = SGD steps / d."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from zoo.utils.labels import format_value
from zoo.plots import pyplot


def angle_text(theta: float) -> str:
    """An angle as a multiple of pi where it is one to 1e-9 (``pi/8``, ``3pi/16``), else ``format_value``."""
    f = Fraction(theta / math.pi).limit_denominator(96)
    if abs(float(f) - theta / math.pi) > 1e-9:
        return format_value(theta)
    if f == 0:
        return "0"
    return f"{'' if f.numerator == 1 else f.numerator}pi" + ("" if f.denominator == 1 else f"/{f.denominator}")


def pretty(params: Mapping[str, object]) -> str:
    """A legend label from a member's (or a group's) parameters: angles (keys ``theta...``) as
    multiples of pi, other numbers by ``zoo.utils.labels.format_value``."""
    text = [f"{k}={angle_text(float(v)) if k.startswith('theta') else format_value(v)}" for k, v in params.items()]
    return ", ".join(text) or "all members"


def matrix_panel(ax, M: np.ndarray, title: str) -> None:
    """A heatmap on a colour scale centred on 0, with the entries written in when it is small."""
    vmax = float(np.abs(M).max()) or 1.0
    ax.imshow(M, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
    if M.shape[0] <= 8 and M.shape[1] <= 8:
        for (i, j), v in np.ndenumerate(M):
            ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7, color="white" if abs(v) > 0.6 * vmax else "black")
    ax.set_xticks(range(M.shape[1])), ax.set_yticks(range(M.shape[0]))
    ax.tick_params(labelsize=6)
    ax.set_title(title, fontsize=8)


def order_parameters_figure(labels: Sequence[str], alpha: np.ndarray, errors: np.ndarray | None,
                            snap_alpha: Sequence[float], snap_Q: Sequence[np.ndarray], snap_R: Sequence[np.ndarray],
                            snap_H_Q: Sequence[np.ndarray], switches: Sequence[float], activation: str = ""):
    """[S] Fig. 1b: error curves (left; ``errors`` (T, E, n_tasks)) and, per member (rows), Q and
    every task's R at each snapshot (columns; ``snap_Q[k]`` (E, p, p), ``snap_R[k]`` (E, n_tasks,
    p, p*), ``snap_H_Q[k]`` (E,) the entropy H_Q of [S] Eq. 10)."""
    plt = pyplot()
    m, n_tasks, p = len(labels), snap_R[0].shape[1], snap_Q[0].shape[-1]
    cols = len(snap_alpha) * (1 + n_tasks)
    left = 2 if errors is not None else 0
    fig = plt.figure(figsize=(2.0 * cols + 2.6 * left, max(2.2 * m, 3.2)), dpi=100)
    grid = fig.add_gridspec(m, cols + left)
    if errors is not None:
        ax = fig.add_subplot(grid[:, :left])
        colours = plt.cm.viridis(np.linspace(0, 0.9, max(m, 2)))
        for e in range(min(m, errors.shape[1])):
            for t in range(errors.shape[2]):
                ax.plot(alpha, errors[:, e, t], color=colours[e], ls="-" if t == 0 else "--", lw=1.6,
                        label=f"{labels[e]} task {t + 1}" if m > 1 or n_tasks > 1 else labels[e])
        for s in switches:
            ax.axvline(s, color="grey", ls=":", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("alpha = steps / d")
        ax.set_ylabel("generalisation error" + (" (Monte Carlo)" if activation == "sigmoid" else " ([S] Eq. 9)"))
        ax.set_title(f"{activation} student: error", fontsize=9)
        ax.legend(fontsize=7)
    for r, lbl in enumerate(labels):
        for k, a in enumerate(snap_alpha):
            c0 = left + k * (1 + n_tasks)
            when = "end" if k == len(snap_alpha) - 1 else f"switch {k + 1}"
            axq = fig.add_subplot(grid[r, c0])
            matrix_panel(axq, snap_Q[k][r], f"Q, {when} (alpha={a:g})\nH_Q = {float(snap_H_Q[k][r]):.2f} "
                                            f"(max {math.log(p):.2f})")
            if k == 0:
                axq.set_ylabel(lbl, fontsize=8)
            for t in range(n_tasks):
                matrix_panel(fig.add_subplot(grid[r, c0 + 1 + t]), snap_R[k][r, t], f"R task {t + 1}, {when}")
    fig.suptitle("order parameters Q = WW^T/d (student x student), R = W W_T^T/d (student x teacher)", fontsize=9)
    fig.tight_layout()
    return fig


def theory_overlay_figure(labels: Sequence[str], alpha: np.ndarray, order_params: np.ndarray,
                          simulation: np.ndarray | None, ode_alpha: np.ndarray, ode_eps: np.ndarray,
                          ode_at_steps: np.ndarray, switches: Sequence[float], title: str = ""):
    """Per member (four to a row): every task's error vs alpha, simulation solid (Monte Carlo
    dots), ODE dashed, switches dotted; below it ``(simulation - ODE) / ODE`` with the +-5 % band.
    ``order_params``, ``simulation``, ``ode_at_steps``: (T, E, n_tasks); ``ode_eps``: (E, n_rec, n_tasks)."""
    plt = pyplot()
    m, n_tasks = order_params.shape[1], order_params.shape[2]
    ncol = min(m, 4)
    nrow = -(-m // ncol)
    fig = plt.figure(figsize=(max(4.6 * ncol, 7.0), 5.0 * nrow + 0.4), dpi=100)
    grid = fig.add_gridspec(2 * nrow, ncol, height_ratios=[2.2, 1.0] * nrow)
    colours = plt.cm.tab10(np.arange(10))
    for e in range(m):
        r, c = divmod(e, ncol)
        ax = fig.add_subplot(grid[2 * r, c])
        axd = fig.add_subplot(grid[2 * r + 1, c], sharex=ax)
        for t in range(n_tasks):
            col = colours[t % 10]
            ax.plot(alpha, order_params[:, e, t], color=col, lw=1.8, label=f"task {t + 1}: simulation")
            if simulation is not None:
                ax.plot(alpha, simulation[:, e, t], "o", color=col, ms=2.5, alpha=0.7,
                        label=f"task {t + 1}: Monte Carlo" if e == 0 else None)
            ax.plot(ode_alpha, ode_eps[e, :, t], color="k", ls="--", lw=1.0, label="mean-field ODE" if t == 0 else None)
            ode = ode_at_steps[:, e, t]
            axd.plot(alpha, 100 * (order_params[:, e, t] - ode) / np.maximum(np.abs(ode), 1e-12), color=col, lw=1.2)
        for s in switches:
            ax.axvline(s, color="grey", ls=":", lw=0.8)
            axd.axvline(s, color="grey", ls=":", lw=0.8)
        axd.axhspan(-5, 5, color="grey", alpha=0.15, lw=0)
        axd.axhline(0, color="k", lw=0.6)
        ax.set_yscale("log")
        ax.set_title(labels[e], fontsize=9)
        ax.legend(fontsize=7)
        axd.set_xlabel("alpha = steps / d")
        if c == 0:
            ax.set_ylabel("generalisation error")
            axd.set_ylabel("(sim - ODE) / ODE [%]\n(grey: +-5 %)", fontsize=8)
    fig.suptitle(title + "\nsolid: simulation ([S] Eq. 9 on its weights), dots: Monte Carlo, dashed: mean-field ODE",
                 fontsize=9)
    fig.tight_layout()
    return fig


def error_curves_figure(alpha: np.ndarray, eps: np.ndarray, member_params: Sequence[Mapping[str, object]],
                        switches: Sequence[float], group_by: str | None = None, color_by: str | None = None,
                        log_scale: bool = False):
    """[S] Fig. 7: every task's error (``eps`` (T, E, n_tasks)) vs alpha, one panel per value of
    the member parameter ``group_by``, one colour per value of ``color_by`` (else per member),
    task 1 solid and later tasks dashed, the switches dotted."""
    plt = pyplot()
    groups = list(dict.fromkeys(p[group_by] for p in member_params)) if group_by else [None]
    keys = [p[color_by] if color_by else e for e, p in enumerate(member_params)]
    distinct = list(dict.fromkeys(keys))
    cmap = plt.cm.viridis(np.linspace(0, 0.95, max(len(distinct), 2)))
    fig, axes = plt.subplots(1, len(groups), figsize=(5.0 * len(groups), 4.0), dpi=100, squeeze=False, sharey=True)
    for g, ax in zip(groups, axes[0]):
        for e, params in enumerate(member_params):
            if g is not None and params[group_by] != g:
                continue
            name = pretty({color_by: keys[e]}) if color_by else pretty(params)
            for t in range(eps.shape[2]):
                ax.plot(alpha, eps[:, e, t], color=cmap[distinct.index(keys[e])], ls="-" if t == 0 else "--", lw=1.6,
                        label=name if t == 0 else None)
        for s in switches:
            ax.axvline(s, color="grey", ls=":", lw=0.8)
        if log_scale:
            ax.set_yscale("log")
        ax.set_xlabel("alpha = steps / d")
        ax.set_title(pretty({group_by: g}) if g is not None else "", fontsize=10)
    axes[0][0].set_ylabel("generalisation error (solid: task 1, dashed: task 2)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig
