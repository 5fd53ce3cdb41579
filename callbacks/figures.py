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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
