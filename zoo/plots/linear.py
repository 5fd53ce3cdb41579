"""Figures of the deep linear family ([L] Figs. 1, 4, 5; [S] Fig. 3c): each builder takes arrays and
returns a matplotlib ``Figure`` (nothing written), for a notebook or ``zoo.training.logs.log_figure``.

From a notebook, on a trained ``net`` (``zoo.DeepLinearNet``) and its task ``dm``::

    from zoo.plots.linear import matrix_grid
    rin, rout = net.input_rsm(), net.output_rsm()
    fig = matrix_grid(net.labels, ["W1^T W1", "W2 W2^T"], [[rin[e], rout[e]] for e in range(net.ensemble)])
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zoo.plots import pyplot


def _colours(plt, E: int):
    # diverging: an ensemble is usually a sweep of lam, whose sign matters
    return plt.cm.coolwarm(np.linspace(0, 1, max(E, 2)))


def loss_and_modes(labels: Sequence[str], loss_steps: np.ndarray, losses: np.ndarray, mode_steps: np.ndarray,
                   strengths: np.ndarray, theory_steps: np.ndarray | None = None, theory: np.ndarray | None = None,
                   targets: np.ndarray | None = None, title: str = ""):
    """Loss per member (top) and each member's mode strengths ``a_i = u_i^T W v_i``, simulation
    against [L] Thm. 5.1's closed form (dashed), one panel per member (bottom).

    losses: (T, E); strengths: (T', E, k); theory: (T'', E, k) or None; targets: (k,) singular
    values of the task (dotted) or None.
    """
    plt = pyplot()
    E, k = strengths.shape[1], strengths.shape[2]
    fig = plt.figure(figsize=(max(3.0 * E, 6.0), 6.0), dpi=100)
    grid = fig.add_gridspec(2, E, height_ratios=[1, 1.2])
    ax = fig.add_subplot(grid[0, :])
    colours = _colours(plt, E)
    for e in range(E):
        ax.plot(loss_steps, losses[:, e], color=colours[e], label=labels[e])
    # linear scale: rich learning's plateaus and drops are what the eye should catch
    ax.set(xlabel="step", ylabel="loss")
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
    return fig


def curves_with_theory(labels: Sequence[str], steps: np.ndarray, values: np.ndarray, theory: np.ndarray | None = None,
                       ylabel: str = "", title: str = ""):
    """Left: one curve per member (values (T, E)), the theory dotted on top. Right: each member's
    final value, simulation and theory (e.g. [L] Fig. 5C's kernel distance against lam)."""
    plt = pyplot()
    E = values.shape[1]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.5, 4.0), dpi=100, gridspec_kw={"width_ratios": [1.6, 1]})
    colours = _colours(plt, E)
    for e in range(E):
        ax.plot(steps, values[:, e], color=colours[e], lw=2.2, label=labels[e])
        if theory is not None:
            ax.plot(steps, theory[:, e], color="k", ls=":", lw=1.0)
    ax.set(xlabel="step", ylabel=ylabel + (" (dotted: theory)" if theory is not None else ""))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    x = np.arange(E)
    ax2.plot(x, values[-1], "o-", color="tab:blue", label="simulation")
    if theory is not None:
        ax2.plot(x, theory[-1], "k+", ms=12, label="theory")
    ax2.set_xticks(x, labels, rotation=45, fontsize=7)
    ax2.set_ylabel(f"{ylabel} at step {int(steps[-1])}")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return fig


def matrix_grid(rows: Sequence[str], cols: Sequence[str], mats: Sequence[Sequence[np.ndarray | None]], title: str = ""):
    """A grid of heatmaps, ``mats[r][c]`` (None leaves the cell empty), each on its own symmetric
    colour scale: e.g. simulated and predicted RSMs of every member ([L] Fig. 4)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.4 * len(cols), 2.2 * len(rows)), dpi=100, squeeze=False)
    for r, row in enumerate(rows):
        for c, col in enumerate(cols):
            ax, M = axes[r][c], mats[r][c]
            ax.set_xticks([]), ax.set_yticks([])
            if M is not None:
                M = np.asarray(M, dtype=float)
                vmax = float(np.abs(M).max()) or 1.0
                ax.imshow(M, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
            if r == 0:
                ax.set_title(col, fontsize=8)
            if c == 0:
                ax.set_ylabel(row, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def two_pathway_phase(lam1: np.ndarray, lam2: np.ndarray, escape: np.ndarray, share: np.ndarray, agreement: float):
    """[S] Fig. 3c: left, Algorithm 1's minimum escape time of the slow pathway (steps; > 0: the
    network specialises); right, the simulated slow pathway's share of the final map. lam2 on x,
    lam1 on y; escape and share are (len(lam1), len(lam2)); cells with |lam1| <= |lam2| blank."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), dpi=100)
    extent = [lam2[0], lam2[-1], lam1[0], lam1[-1]]
    im = axes[0].imshow(np.log10(1 + escape), origin="lower", aspect="auto", extent=extent, cmap="viridis")
    fig.colorbar(im, ax=axes[0], label="log10(1 + min escape time of slow pathway) [steps]")
    axes[0].set_title("theory ([S] Alg. 1): > 0 = specialises; white: |lam1| <= |lam2|", fontsize=9)
    valid = np.abs(lam1)[:, None] > np.abs(lam2)[None, :]
    im = axes[1].imshow(np.where(valid, share, np.nan), origin="lower", aspect="auto", extent=extent,
                        cmap="magma_r", vmin=0, vmax=0.5)
    fig.colorbar(im, ax=axes[1], label="slow pathway's share of the map (0 = specialised)")
    axes[1].set_title(f"simulation (gradient descent); agreement {agreement:.0%}", fontsize=9)
    for ax in axes:
        ax.set(xlabel="lam2 (slow pathway)", ylabel="lam1 (fast pathway)")
    fig.tight_layout()
    return fig
