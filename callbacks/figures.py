"""Transitional: the figure builders moved to ``zoo.plots`` (they return a Figure; log it with
``callbacks.base.log_figure``). What is left serves callbacks not yet moved; delete this file
when nothing imports ``callbacks.figures`` any more."""
from __future__ import annotations


def _plt():
    from zoo.plots import pyplot

    return pyplot()


def save_figure(fig, path, **savefig_kw):
    """Lay out, write and close a figure; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, **savefig_kw)
    _plt().close(fig)
    return path
