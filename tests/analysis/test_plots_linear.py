"""zoo.plots.linear: builders return a Figure that shows the numbers they were given."""
from __future__ import annotations

import numpy as np

from zoo.plots import pyplot


def test_matrix_grid_draws_each_matrix_in_its_cell_and_leaves_none_empty():
    from zoo.plots.linear import matrix_grid

    A, B = np.arange(4.0).reshape(2, 2), -np.eye(3)
    fig = matrix_grid(["m0", "m1"], ["input", "output"], [[A, None], [B, A]])
    axes = fig.axes
    assert len(axes) == 4 and [ax.get_title() for ax in axes[:2]] == ["input", "output"]
    assert len(axes[1].images) == 0  # the None cell
    assert np.array_equal(axes[0].images[0].get_array(), A) and np.array_equal(axes[2].images[0].get_array(), B)
    # each cell on its own symmetric scale
    assert axes[0].images[0].get_clim() == (-3.0, 3.0) and axes[2].images[0].get_clim() == (-1.0, 1.0)
    pyplot().close(fig)


def test_two_pathway_phase_blanks_the_points_where_pathway_one_is_not_faster():
    from zoo.plots.linear import two_pathway_phase

    lam1, lam2 = np.array([0.0, 1.0]), np.array([0.5, 2.0])
    share = np.array([[0.1, 0.2], [0.3, 0.4]])
    fig = two_pathway_phase(lam1, lam2, np.zeros((2, 2)), share, agreement=0.5)
    shown = np.ma.filled(fig.axes[1].images[0].get_array().astype(float), np.nan)
    assert np.isnan(shown[0]).all() and np.isnan(shown[1, 1]) and shown[1, 0] == 0.3
    assert "50%" in fig.axes[1].get_title()
    pyplot().close(fig)
