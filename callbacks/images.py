"""Matrices as heatmap images in TensorBoard."""
from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor

from callbacks.base import warn_once


def matrix_to_image(M: Tensor | np.ndarray, title: str = "", symmetric: bool = True) -> np.ndarray:
    """Render a matrix as an RGB heatmap (H, W, 3) uint8; a diverging map centred on 0 by default."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    A = M.detach().cpu().double().numpy() if isinstance(M, Tensor) else np.asarray(M, dtype=float)
    fig, ax = plt.subplots(figsize=(3.2, 2.8), dpi=80)
    vmax = float(np.abs(A).max()) or 1.0
    im = ax.imshow(A, cmap="RdBu_r" if symmetric else "viridis", vmin=-vmax if symmetric else None,
                   vmax=vmax if symmetric else None, interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046)
    ax.set_title(title, fontsize=8)
    ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return img


def log_matrix(trainer: pl.Trainer, tag: str, M: Tensor | np.ndarray, step: int | None = None, **kw) -> bool:
    """Log ``M`` as a heatmap image to every TensorBoard logger; warn once and skip otherwise."""
    tb = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
    if not tb:
        warn_once("matrix images need a TensorBoardLogger; none is attached, so they are skipped")
        return False
    img = matrix_to_image(M, title=kw.pop("title", tag), **kw)
    for lg in tb:
        lg.experiment.add_image(tag, img, trainer.global_step if step is None else step, dataformats="HWC")
    return True
