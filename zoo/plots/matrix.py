"""A matrix as a heatmap (order parameters, RSMs, NTKs, network maps)."""
from __future__ import annotations

import numpy as np
from torch import Tensor

from zoo.plots import pyplot


def heatmap(M: Tensor | np.ndarray, title: str = "", symmetric: bool = True):
    """A small figure of ``M``: a diverging map centred on 0 (``symmetric``) or viridis."""
    plt = pyplot()
    A = M.detach().cpu().double().numpy() if isinstance(M, Tensor) else np.asarray(M, dtype=float)
    fig, ax = plt.subplots(figsize=(3.2, 2.8), dpi=80)
    vmax = float(np.abs(A).max()) or 1.0
    im = ax.imshow(A, cmap="RdBu_r" if symmetric else "viridis", vmin=-vmax if symmetric else None,
                   vmax=vmax if symmetric else None, interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046)
    ax.set_title(title, fontsize=8)
    ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    return fig
