"""The heatmap canvas kept per shape (``zoo.plots.matrix.heatmap_rgb``, what ``log_matrix`` logs)
draws what a new ``heatmap`` figure draws, whatever it drew before."""
from __future__ import annotations

import numpy as np
import torch

from zoo.plots.matrix import heatmap, heatmap_rgb


def fresh(M, title, symmetric=True) -> np.ndarray:
    fig = heatmap(M, title, symmetric)
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return rgb


def test_a_reused_canvas_draws_each_matrix_as_a_new_figure_does():
    g = torch.Generator().manual_seed(0)
    previous = [torch.randn(8, 8, generator=g) * 1e3, -torch.rand(8, 8, generator=g) * 1e-6]
    for symmetric in (True, False):
        for M, title in [(torch.randn(8, 8, generator=g) * 1e-3, "W_L...W_1 (lam=-2), step 1000"),
                         (torch.zeros(8, 8), "all zero")]:
            for before in previous:  # other values, limits, tick labels and a longer title on the canvas first
                heatmap_rgb(before, "a longer title drawn before, step 123456789", symmetric)
                got = heatmap_rgb(M, title, symmetric)
                assert got.shape == (224, 256, 3) and got.dtype == np.uint8
                assert np.array_equal(got, fresh(M, title, symmetric)), (symmetric, title)
    R = torch.rand(2, 5, generator=g)
    assert np.array_equal(heatmap_rgb(R, "R", False), fresh(R, "R", False))  # another shape, its own canvas


def test_the_colour_scale_is_centred_on_zero_or_spans_the_values():
    M = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    assert heatmap(M).axes[0].images[0].get_clim() == (-2.0, 2.0)
    assert heatmap(M, symmetric=False).axes[0].images[0].get_clim() == (-2.0, 1.0)
    assert heatmap(torch.zeros(2, 2)).axes[0].images[0].get_clim() == (-1.0, 1.0)  # nothing to scale by
    import matplotlib.pyplot as plt

    plt.close("all")
