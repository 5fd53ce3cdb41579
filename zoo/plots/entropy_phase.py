"""Entropy phase diagrams over a grid of initialisations ([S] Fig. 5, Fig. 10): a ``Figure``."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zoo.plots import pyplot
from zoo.plots.teacher_student import angle_text, pretty


def _ticks(values: np.ndarray, most: int = 4) -> list[int]:
    """Indices of at most ``most`` evenly spread grid values to label (first and last included)."""
    n = len(values)
    return sorted({int(round(i)) for i in np.linspace(0, n - 1, min(n, most))})


def _colorbar(fig, row_axes, mappable) -> None:
    first, last = row_axes[0].get_position(), row_axes[-1].get_position()
    cax = fig.add_axes([last.x1 + 0.01, first.y0, 0.012, first.height])
    fig.colorbar(mappable, cax=cax).ax.tick_params(labelsize=6)


def entropy_phase_figure(r: dict, rows: Sequence[str], header: str, error: bool = True, dpi: int = 100):
    """Rows (entropy, source: simulation above ODE) x one panel per value of the grid's third
    axis; the first axis on x, the second on y; colour = entropy on ``[0, r["max"][H]]``; a last
    row with the final error (log colour scale) if ``error`` and ``r`` has one.

    ``r``: ``axes`` (three names), ``values`` (name -> sorted values), ``max`` (H -> maximum),
    ``sim`` and optionally ``ode`` (H -> grid array), ``error`` (grid array), ``mean_abs_diff``,
    ``same_side`` (H -> float), ``var_explained`` (source -> H -> axis -> share). Cells are drawn in
    index space with the grid values as tick labels: on log-spaced grids that is a log axis.
    """
    from matplotlib.colors import LogNorm

    plt = pyplot()
    ax_x, ax_y, ax_p = r["axes"]
    xs, ys, ps = (r["values"][a] for a in r["axes"])
    sources = [s for s in ("sim", "ode") if s in r]
    panels = [(H, s) for H in rows for s in sources]
    has_error = error and "error" in r
    n_rows, n_cols = len(panels) + has_error, len(ps)
    head = 0.45 + 0.17 * (1 + len(rows))  # inches for the title lines and the panel titles
    height = 1.55 * n_rows + head + 0.45
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(1.7 * n_cols + 1.4, height), dpi=dpi, squeeze=False)
    fig.subplots_adjust(left=0.09, right=0.9, bottom=0.45 / height, top=1.0 - head / height, wspace=0.08, hspace=0.12)
    kw = dict(origin="lower", aspect="auto", interpolation="nearest")
    for row, (H, src) in enumerate(panels):
        for k in range(n_cols):
            im = axes[row][k].imshow(r[src][H][:, :, k].T, cmap="viridis", vmin=0.0, vmax=r["max"][H], **kw)
        axes[row][0].set_ylabel(f"{H} {'simulation' if src == 'sim' else 'ODE'}\n{ax_y}", fontsize=8)
        _colorbar(fig, axes[row], im)
    if has_error:
        eps = np.clip(r["error"], 1e-10, None)
        norm = LogNorm(vmin=eps.min(), vmax=max(eps.max(), eps.min() * 10))
        for k in range(n_cols):
            im = axes[-1][k].imshow(eps[:, :, k].T, cmap="magma", norm=norm, **kw)
        axes[-1][0].set_ylabel(f"final error\n(simulation)\n{ax_y}", fontsize=8)
        _colorbar(fig, axes[-1], im)
    xt, yt = _ticks(xs), _ticks(ys)
    for (row, k), ax in np.ndenumerate(axes):
        ax.set_xticks(xt, [f"{xs[i]:.2g}" for i in xt] if row == n_rows - 1 else [])
        ax.set_yticks(yt, [f"{ys[i]:.2g}" for i in yt] if k == 0 else [])
        ax.tick_params(labelsize=6, length=2)
    for k, v in enumerate(ps):
        axes[0][k].set_title(f"{ax_p} = {angle_text(v)}" if ax_p.startswith("theta") else pretty({ax_p: v}), fontsize=8)
        axes[-1][k].set_xlabel(ax_x, fontsize=8)
    lines = [header]
    for H in rows:
        line = f"{H}: "
        if "ode" in r:
            line += f"mean |sim - ODE| {r['mean_abs_diff'][H]:.3f}, same side {r['same_side'][H]:.0%}; "
        line += "variance explained (sim) " + ", ".join(f"{f} {v:.2f}" for f, v in r["var_explained"]["sim"][H].items())
        lines.append(line)
    fig.suptitle("\n".join(lines), fontsize=8)
    return fig
