"""Figures of the disentanglement experiment ([S] Sec. 3.2, Fig. 4): latent traversals and a
sweep's DCI and reconstruction against the swept init parameter."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor
from torchvision.utils import make_grid

from zoo.plots import pyplot

SWEEP_METRICS = (("disentanglement", "DCI disentanglement"), ("completeness", "DCI completeness"),
                 ("informativeness_test_acc", "DCI informativeness (test acc.)"),
                 ("reconstruction", "reconstruction loss (BCE, summed)"))
"""The panels of :func:`sweep_figure`: (key of a row, title)."""


def traversal_figure(images: Tensor, order: Sequence[int], kl: Sequence[float], values: Sequence[float],
                     title: str = ""):
    """[S] Fig. 4c: one row per latent (``images`` (L * S, C, H, W) in [0, 1], row-major, as
    ``zoo.models.vae.BetaVAE.traversal`` returns them), each row labelled with its latent and KL, each
    column with the latent's value."""
    plt = pyplot()
    L, S = len(order), len(values)
    H, W = images.shape[-2:]
    grid = make_grid(images.detach().float().cpu().clamp(0, 1), nrow=S, padding=1, pad_value=1.0)
    fig, ax = plt.subplots(figsize=(0.7 * S + 1.2, 0.7 * L + 0.6), dpi=100)
    ax.imshow(grid.permute(1, 2, 0).numpy(), interpolation="nearest")
    ax.set_yticks([1 + (H + 1) * (r + 0.5) for r in range(L)],
                  [f"z{int(i)} KL {float(k):.2f}" for i, k in zip(order, kl)], fontsize=7)
    ax.set_xticks([1 + (W + 1) * (c + 0.5) for c in range(S)], [f"{float(v):.1f}" for v in values], fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def sweep_figure(rows: Sequence[dict], param: str, title: str = ""):
    """[S] Fig. 4a-b: each metric of ``SWEEP_METRICS`` against ``param`` (one row per model, a dict
    with ``param`` and the metrics): a box per value over seeds (and a violin from 3 seeds), every
    model a dot."""
    plt = pyplot()
    values = sorted({float(r[param]) for r in rows})
    fig, axes = plt.subplots(1, len(SWEEP_METRICS), figsize=(3.6 * len(SWEEP_METRICS), 3.4), dpi=100)
    pos = np.arange(len(values))
    for ax, (key, name) in zip(axes, SWEEP_METRICS):
        data = [[r[key] for r in rows if float(r[param]) == v] for v in values]
        if max(len(d) for d in data) >= 3:
            ax.violinplot(data, positions=pos, showextrema=False)
        ax.boxplot(data, positions=pos, widths=0.35)
        for p, d in zip(pos, data):
            ax.plot(np.full(len(d), p), d, "o", ms=3, color="k", alpha=0.6)
        ax.set_xticks(pos, [f"{v:g}" for v in values])
        ax.set_xlabel(param)
        ax.set_title(name, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
