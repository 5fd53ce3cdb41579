"""End-of-fit figures written as PNG beside the TensorBoard events (matplotlib, Agg backend)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, **savefig_kw):
    """Lay out, write and close a figure (closing frees it: a long sweep draws many); returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, **savefig_kw)
    _plt().close(fig)
    return path


def loss_and_modes_figure(
    path: Path,
    labels: Sequence[str],
    loss_steps: np.ndarray,
    losses: np.ndarray,
    mode_steps: np.ndarray,
    strengths: np.ndarray,
    theory_steps: np.ndarray | None = None,
    theory: np.ndarray | None = None,
    targets: np.ndarray | None = None,
    title: str = "",
) -> Path:
    """Loss per member (top) and each member's mode strengths, simulation vs theory (bottom).

    losses: (T, E); strengths: (T', E, k); theory: (T'', E, k) or None; targets: (k,) or None.
    """
    plt = _plt()
    E, k = strengths.shape[1], strengths.shape[2]
    fig = plt.figure(figsize=(max(3.0 * E, 6.0), 6.0), dpi=100)
    grid = fig.add_gridspec(2, E, height_ratios=[1, 1.2])
    ax = fig.add_subplot(grid[0, :])
    colours = plt.cm.coolwarm(np.linspace(0, 1, max(E, 2)))
    for e in range(E):
        ax.plot(loss_steps, losses[:, e], color=colours[e], label=labels[e])
    # linear scale: rich learning's plateaus and drops are what the eye should catch
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, ncol=min(E, 6))
    ax.set_title(title, fontsize=10)
    mode_colours = plt.cm.viridis(np.linspace(0, 0.9, max(k, 2)))
    for e in range(E):
        axm = fig.add_subplot(grid[1, e])
        for i in range(k):
            axm.plot(mode_steps, strengths[:, e, i], color=mode_colours[i], lw=1.5)
            if theory is not None:
                axm.plot(theory_steps, theory[:, e, i], color="k", ls="--", lw=0.8)
            if targets is not None:
                axm.axhline(targets[i], color=mode_colours[i], ls=":", lw=0.6)
        axm.set_title(labels[e], fontsize=8)
        axm.set_xlabel("step")
        if e == 0:
            axm.set_ylabel("mode strength u_i^T W v_i" + ("\n(dashed: theory)" if theory is not None else ""))
    save_figure(fig, path)
    return path


def curves_figure(
    path: Path,
    labels: Sequence[str],
    steps: np.ndarray,
    values: np.ndarray,
    theory: np.ndarray | None = None,
    ylabel: str = "",
    title: str = "",
) -> Path:
    """Left: one curve per member (values: (T, E)), theory as black dots on top. Right: the
    final value of each member (simulation and theory), e.g. kernel distance vs lam."""
    plt = _plt()
    E = values.shape[1]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.5, 4.0), dpi=100, gridspec_kw={"width_ratios": [1.6, 1]})
    colours = plt.cm.coolwarm(np.linspace(0, 1, max(E, 2)))
    for e in range(E):
        ax.plot(steps, values[:, e], color=colours[e], lw=2.2, label=labels[e])
        if theory is not None:
            ax.plot(steps, theory[:, e], color="k", ls=":", lw=1.0)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel + (" (dotted: theory)" if theory is not None else ""))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    x = np.arange(E)
    ax2.plot(x, values[-1], "o-", color="tab:blue", label="simulation")
    if theory is not None:
        ax2.plot(x, theory[-1], "k+", ms=12, label="theory")
    ax2.set_xticks(x, labels, rotation=45, fontsize=7)
    ax2.set_ylabel(f"{ylabel} at step {int(steps[-1])}")
    ax2.legend(fontsize=7)
    save_figure(fig, path)
    return path


def matrix_grid_figure(path: Path, rows: Sequence[str], cols: Sequence[str], mats: list[list[np.ndarray | None]],
                       title: str = "") -> Path:
    """A grid of heatmaps: ``mats[r][c]`` (None leaves the cell empty); each on its own colour scale."""
    plt = _plt()
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.4 * len(cols), 2.2 * len(rows)), dpi=100, squeeze=False)
    for r, row in enumerate(rows):
        for c, col in enumerate(cols):
            ax, M = axes[r][c], mats[r][c]
            ax.set_xticks([]), ax.set_yticks([])
            if M is not None:
                vmax = float(np.abs(M).max()) or 1.0
                ax.imshow(M, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
            if r == 0:
                ax.set_title(col, fontsize=8)
            if c == 0:
                ax.set_ylabel(row, fontsize=8)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)
    return path
