"""Forgetting vs task similarity ([S] Figs. 6, 11, 12): figure builders returning a ``Figure``.

``prof`` is what :func:`zoo.analysis.forgetting.profiles` returns (one entry per group of members,
``x`` the similarity), with each entry's ``shape`` from :func:`zoo.analysis.forgetting.profile_shape`.
"""
from __future__ import annotations

import numpy as np

from zoo.plots import pyplot
from zoo.plots.teacher_student import angle_text, pretty

SHAPE_COLOURS = {"maslow": "tab:green", "flat": "tab:grey", "monotonic": "tab:blue", "other": "tab:orange"}


def shape_text(shape: dict, over: str) -> str:
    return {"maslow": f"hammer, peak at {over}={shape['peak']:g}", "flat": "flat", "monotonic": "monotonic",
            "other": f"peak at {over}={shape['peak']:g}"}[shape["kind"]]


def forgetting_profile_figure(prof: dict, over: str, when: str, ode: dict | None = None, norms: dict | None = None,
                              norms_ode: dict | None = None, later: dict | None = None, title: str = ""):
    """(a) forgetting vs ``over`` per group: mean (solid, markers), the standard deviation over
    runs (bars) and single runs (dots) where a group has several, the ODE dashed; (b) with
    ``norms`` (group -> (n, p) final node norms sqrt(Q_ii); ``norms_ode`` alike, crosses);
    (c) with ``later`` (profiles of the last task's final error): did the later task get learned?"""
    plt = pyplot()
    panels = 1 + (norms is not None) + (later is not None)
    fig, axes = plt.subplots(1, panels, figsize=(6.0 * panels, 4.6), dpi=100, squeeze=False)
    ax = axes[0][0]
    colours = plt.cm.tab10(np.arange(10))
    for i, (g, p) in enumerate(prof.items()):
        c = colours[i % 10]
        ax.errorbar(p["x"], p["mean"], yerr=p["std"] if p["std"].any() else None, color=c, marker="o", ms=4, lw=1.8,
                    capsize=3, label=f"{pretty(p['params'])} ({shape_text(p['shape'], over)})")
        for x, samples in zip(p["x"], p["all"]):
            if len(samples) > 1:
                ax.plot(np.full(len(samples), x), samples, ".", color=c, alpha=0.35)
        if ode is not None:
            ax.plot(ode[g]["x"], ode[g]["mean"], "--", color=c, lw=1.2)
        panel = 1
        if norms is not None:
            for u in range(norms[g].shape[-1]):
                axes[0][1].plot(p["x"], norms[g][:, u], ("o-", "s--", "^:")[u % 3], color=c, lw=1.6, ms=4)
                if norms_ode is not None:
                    axes[0][1].plot(p["x"], norms_ode[g][:, u], "x", color="k", ms=5, alpha=0.6)
            panel = 2
        if later is not None:
            q = later[g]
            axes[0][panel].errorbar(q["x"], q["mean"], yerr=q["std"] if q["std"].any() else None, color=c, marker="o",
                                    capsize=3)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel(f"task similarity {over}")
    ax.set_ylabel(f"forgetting of task 1 ({when})")
    ax.set_title("(a) forgetting vs similarity" + ("; dashed: mean-field ODE" if ode is not None else ""), fontsize=9)
    ax.legend(fontsize=7)
    if norms is not None:
        axes[0][1].set_xlabel(f"task similarity {over}")
        axes[0][1].set_ylabel("final node norm sqrt(Q_ii)")
        axes[0][1].set_title("(b) final node norms; colours as in (a); solid: unit 1, dashed: unit 2"
                             + ("; x: ODE" if norms_ode is not None else ""), fontsize=9)
    if later is not None:
        axes[0][-1].set_xlabel(f"task similarity {over}")
        axes[0][-1].set_ylabel("last task's error at the end")
        axes[0][-1].set_title(f"({'abc'[panels - 1]}) was the later task learned?", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def forgetting_grid_figure(prof: dict, over: str, rows: str, cols: str, tol: float, ode: dict | None = None):
    """[S] Fig. 11: one small panel per group at (its ``rows`` value, its ``cols`` value), the
    profile coloured by its shape (green: Maslow's hammer, blue: monotonic, grey: flat, orange: other)."""
    plt = pyplot()
    row_values = sorted({float(p["params"][rows]) for p in prof.values()})
    col_values = sorted({float(p["params"][cols]) for p in prof.values()})
    fig, axes = plt.subplots(len(row_values), len(col_values), figsize=(1.9 * len(col_values) + 0.8,
                             1.6 * len(row_values) + 0.8), dpi=100, squeeze=False, sharex=True, sharey=True)
    for ax in axes.flat:
        ax.set_visible(False)
    for g, p in prof.items():
        ax = axes[row_values.index(float(p["params"][rows]))][col_values.index(float(p["params"][cols]))]
        ax.set_visible(True)
        ax.plot(p["x"], p["mean"], "-", color=SHAPE_COLOURS[p["shape"]["kind"]], lw=1.8)
        if ode is not None:
            ax.plot(ode[g]["x"], ode[g]["mean"], ":", color="k", lw=1.0)
        ax.axhline(0, color="grey", lw=0.4)
        ax.tick_params(labelsize=6)
    for k, v in enumerate(col_values):
        axes[0][k].set_title(f"{cols} = {angle_text(v)}", fontsize=8)
    for k, v in enumerate(row_values):
        axes[k][0].set_ylabel(f"{rows} = {angle_text(v)}", fontsize=8)
    fig.suptitle(f"forgetting vs similarity {over}{' (dotted: mean-field ODE)' if ode is not None else ''}; green: "
                 f"Maslow's hammer, blue: monotonic, grey: flat (within {tol:g}), orange: other", fontsize=9)
    # fixed margins: tight_layout measures every one of the many panels (seconds for 45)
    fig.subplots_adjust(left=0.8 / fig.get_figwidth(), right=0.99, bottom=0.4 / fig.get_figheight(),
                        top=1 - 0.6 / fig.get_figheight(), wspace=0.15, hspace=0.2)
    return fig
