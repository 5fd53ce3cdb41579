"""[S] Fig. 13: the sparsity of (implicit) sparse autoencoders against the initial imbalance v."""
from __future__ import annotations

import numpy as np

from zoo.plots import pyplot

TITLES = {"eq31": "Eq. 31: mean points per unit (of {N})", "l0": "L0: mean active units per point"}


def sparsity_figure(v: np.ndarray, l1: np.ndarray, measures: dict[str, np.ndarray], N: int, threshold: float = 0.0):
    """Each measure (members (E,)) against the imbalance ``v`` (E,) on a log axis, one curve per
    ``l1`` (E,): the SAE (``l1 > 0``) beside the iSAE (``l1 = 0``). ``N``: data points measured on."""
    plt = pyplot()
    v, l1 = np.asarray(v, dtype=float), np.asarray(l1, dtype=float)
    fig, axes = plt.subplots(1, len(measures), figsize=(4.2 * len(measures), 3.4), dpi=100)
    for ax, (key, values) in zip(np.atleast_1d(axes), measures.items()):
        values = np.asarray(values, dtype=float)
        for a in sorted(set(l1.tolist())):
            sel = l1 == a
            order = np.argsort(v[sel])
            ax.plot(v[sel][order], values[sel][order], "o-", label=f"{'iSAE' if a == 0 else 'SAE'} (l1={a:g})")
        ax.set_xscale("log")
        ax.set_xlabel("imbalance v")
        ax.set_title(TITLES.get(key, key).format(N=N) + (f", H > {threshold:g}" if threshold else ""), fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
