"""A matrix as a heatmap (order parameters, RSMs, NTKs, network maps)."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
from matplotlib.ticker import FormatStrFormatter
from torch import Tensor

from zoo.plots import pyplot

#: figure size (inches) and resolution of a heatmap: 256 x 224 pixels
SIZE, DPI = (3.2, 2.8), 80


def _array(M: Tensor | np.ndarray) -> np.ndarray:
    return M.detach().cpu().double().numpy() if isinstance(M, Tensor) else np.asarray(M, dtype=float)


def _draw(fig, shape: tuple[int, ...], symmetric: bool):
    """A heatmap's axes on ``fig``: the image (``shape``, a diverging map or viridis), its colour bar
    and a title, in a fixed layout (no ``tight_layout``: ~10 ms a figure, and its result depends on
    the tick labels); returns the image and the title."""
    ax = fig.add_axes((0.03, 0.03, 0.68, 0.83))
    im = ax.imshow(np.zeros(shape), cmap="RdBu_r" if symmetric else "viridis", interpolation="nearest")
    ax.apply_aspect()  # the image's box (square cells), so that the colour bar can take its height
    box = ax.get_position()
    bar = fig.colorbar(im, cax=fig.add_axes((box.x1 + 0.025, box.y0, 0.04, box.height)))
    # each tick its own number: a common offset or factor ("1e-6") would be drawn over the title
    bar.formatter = FormatStrFormatter("%.3g")
    bar.ax.tick_params(labelsize=8)
    ax.set_xticks([]), ax.set_yticks([])
    return im, ax.set_title("", fontsize=8, pad=3, wrap=True)  # a long title on two lines, not cut at the edges


def _show(im, title_text, A: np.ndarray, title: str, symmetric: bool) -> None:
    im.set_data(A)
    if symmetric:  # centred on 0
        vmax = float(np.abs(A).max()) or 1.0
        im.set_clim(-vmax, vmax)
    else:
        im.set_clim(float(A.min()), float(A.max()))
    title_text.set_text(title)


def heatmap(M: Tensor | np.ndarray, title: str = "", symmetric: bool = True):
    """A small figure of ``M``: a diverging map centred on 0 (``symmetric``) or viridis."""
    A = _array(M)
    fig = pyplot().figure(figsize=SIZE, dpi=DPI)
    im, title_text = _draw(fig, A.shape, symmetric)
    _show(im, title_text, A, title, symmetric)
    return fig


class HeatmapCanvas:
    """:func:`heatmap`'s picture drawn into one figure kept for matrices of one shape: each call sets
    the image's data, colour limits and title and renders (~16 ms against ~45 ms for a new figure and
    its rendering: a network map every few steps of a long run spent most of its time there)."""

    def __init__(self, shape: tuple[int, ...], symmetric: bool) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.fig, self.symmetric = Figure(figsize=SIZE, dpi=DPI), symmetric
        FigureCanvasAgg(self.fig)  # outside pyplot: nothing to close, no open-figure warning
        self.im, self.title = _draw(self.fig, shape, symmetric)

    def rgb(self, M: Tensor | np.ndarray, title: str = "") -> np.ndarray:
        """The heatmap of ``M`` as pixels (H, W, 3), uint8."""
        _show(self.im, self.title, _array(M), title, self.symmetric)
        self.fig.canvas.draw()
        return np.asarray(self.fig.canvas.buffer_rgba())[..., :3].copy()


_CANVASES: OrderedDict[tuple, HeatmapCanvas] = OrderedDict()


def heatmap_rgb(M: Tensor | np.ndarray, title: str = "", symmetric: bool = True) -> np.ndarray:
    """:func:`heatmap` of ``M`` rendered to pixels (H, W, 3), on a canvas kept per shape (the 16
    used last)."""
    key = (tuple(M.shape), symmetric)
    canvas = _CANVASES.pop(key, None) or HeatmapCanvas(key[0], symmetric)
    _CANVASES[key] = canvas
    if len(_CANVASES) > 16:
        _CANVASES.popitem(last=False)
    return canvas.rgb(M, title)
