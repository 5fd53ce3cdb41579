"""Figures of the gated deep linear network recipes ([H]): loss curves beside the theory, pathway
singular values, XoR learning times (Fig. 2d-e), stereotypical runs (Fig. 6b), k-means gates and
their elbow (Figs. 8-9), MDS of hidden representations (Figs. 3-4). Each returns a Figure."""
from __future__ import annotations

import numpy as np
from torch import Tensor

from zoo.plots import pyplot

MAX_POINTS = 2000  # per faded curve: 100 runs x 20,000 epochs would draw slowly and show no more


def epochs_to_title(fractions: list[float], times: dict[str, Tensor], names: list[str], closed: list[str]) -> str:
    """The title of :func:`loss_curves`: epochs to each of ``fractions`` of the initial loss of every
    network in ``names`` and of the closed form of those in ``closed`` (``times``: member means)."""
    lines = [f"{n}: " for n in names] + ["closed form: " for _ in closed]
    lines = [h + ", ".join(f"{v:.0f}" for v in times[k].tolist()) for h, k in
             zip(lines, [*names, *(f"{n}_closed_form_predicted" for n in closed)])]
    return "epochs to " + "/".join(f"{f:g}" for f in fractions) + " of the initial loss\n" + "; ".join(lines)


def loss_curves(curves: dict[str, tuple[Tensor, Tensor]], predicted: dict[str, tuple[Tensor, Tensor]],
                closed_form: dict[str, tuple[Tensor, Tensor]], title: str, log_y: bool = True):
    """Member-mean loss (T, E) of every network (solid), its theory (dashed) and the closed form
    (wide, pale: the race runs on it), all keyed by network name."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for i, (name, (t, L)) in enumerate(curves.items()):
        c = f"C{i % 10}"
        ax.plot(t.cpu().numpy(), L.mean(-1).cpu().numpy(), color=c, lw=1.8, label=f"{name} (simulated)")
        for source, kw, what in ((predicted, dict(ls="--", lw=1.2), "predicted"),
                                 (closed_form, dict(lw=5, alpha=0.3), "closed form")):
            if name in source:
                tp, p = source[name]
                ax.plot(tp.cpu().numpy(), p.mean(-1).cpu().numpy(), color=c, label=f"{name} ({what})", **kw)
    ax.set_yscale("log" if log_y else "linear")
    ax.set(xlabel="epoch", ylabel="loss")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=7)
    return fig


def pathway_singular_values(epochs: np.ndarray, sv: np.ndarray, t: Tensor, predicted: Tensor, names: list[str],
                            model: str):
    """One panel per pathway: ``u_k^T W_p v_k`` (epochs, P, k) over epochs, the race's (T, P, k) dashed."""
    plt = pyplot()
    P, K = sv.shape[1], sv.shape[2]
    fig, axes = plt.subplots(1, P, figsize=(3.2 * P, 3.2), dpi=100, squeeze=False)
    for p, ax in enumerate(axes[0]):
        for k in range(K):
            ax.plot(epochs, sv[:, p, k], color=plt.cm.viridis(k / max(K, 2)), lw=1.6)
            ax.plot(t.cpu().numpy(), predicted[:, p, k].cpu().numpy(), color="k", ls="--", lw=0.8)
        ax.set_title(f"{model}: {names[p]}", fontsize=8)
        ax.set_xlabel("epoch")
    axes[0, 0].set_ylabel("u_k^T W_p v_k (dashed: race)")
    return fig


def xor_times(deltas: Tensor, times: dict[str, Tensor], criterion: float, crossover: float):
    """[H] Fig. 2d: steps to the loss criterion against the margin; ``closed_form_<kind>`` as lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    markers = iter(["o", "s", "^", "v", "D"])
    for name, ts in times.items():
        if name.startswith("closed_form_"):
            kind = name[len("closed_form_"):]
            kw = dict(color={"linear": "tab:blue"}.get(kind, "tab:orange"), lw=2.5, alpha=0.6,
                      label=f"{'XoR' if kind == 'xor' else kind} GDLN (closed form)")
        else:
            kw = dict(ls="none", marker=next(markers, "o"), ms=5, label=f"{name} (simulated)")
        ax.plot(deltas.cpu().numpy(), ts.cpu().numpy(), **kw)
    ax.axvline(crossover, color="grey", ls="--", lw=1, label="sqrt(2/3)")
    ax.set(xlabel="Delta", ylabel=f"steps to loss {criterion:g}")
    ax.legend(fontsize=7)
    return fig


def xor_trajectories(panels: list[dict]):
    """[H] Fig. 2e: one panel per margin, simulated (thin) and closed-form (wide, pale) losses
    (``zoo.models.gdln`` ``xor_trajectories``' dicts)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), dpi=100, squeeze=False)
    for ax, p in zip(axes[0], panels):
        t = p["t"]
        for kind, L in p["closed_form"].items():
            ax.plot(t.cpu().numpy(), L.cpu().numpy(), color={"linear": "tab:blue"}.get(kind, "tab:orange"), lw=5, alpha=0.3,
                    label=f"{kind} GDLN (closed form)")
        for i, (name, L) in enumerate(p["simulated"].items()):
            ax.plot(t.cpu().numpy(), L.cpu().numpy(), color=f"C{i + 2}", lw=1.2, label=f"{name} (simulated)")
        ax.set_title(f"Delta = {p['Delta']:.3g}", fontsize=9)
        ax.set_xlabel("step")
        # the drops are sharp: show up to a little past the last curve's fall below 2% of its start
        busy = [float(t[(L > 0.02 * L[0]).nonzero().max()]) for L in [*p["simulated"].values(), *p["closed_form"].values()]
                if bool((L > 0.02 * L[0]).any())]
        if busy:
            ax.set_xlim(0, min(float(t[-1]), 1.3 * max(busy)))
    axes[0, 0].set_ylabel("loss")
    axes[0, -1].legend(fontsize=6)
    return fig


def stereotypical_loss(curves: dict[str, Tensor], summary: dict[str, dict], fractions: list[float], log_y: bool = True):
    """[H] Fig. 6b: every run's loss (T, E) faded, each network's stereotypical run (``summary[name]
    ["member"]``) bold; the title gives the bold run's epochs to each fraction [range over runs]."""
    plt = pyplot()
    scales = ["linear", "log"] if log_y else ["linear"]
    fig, axes = plt.subplots(1, len(scales), figsize=(6 * len(scales), 4.5), dpi=100, squeeze=False)
    lines = []
    for i, (name, s) in enumerate(summary.items()):
        L = curves[name].cpu().numpy()
        t, every = np.arange(L.shape[0]), max(1, L.shape[0] // MAX_POINTS)
        for ax in axes[0]:
            ax.plot(t[::every], L[::every], color=f"C{i % 10}", lw=0.6, alpha=0.15)
            ax.plot(t, L[:, s["member"]], color=f"C{i % 10}", lw=2.0, label=f"{name}: run {s['member']} of {L.shape[1]}")
        lines.append(f"{name}: " + ", ".join(f"{v:.0f} [{lo:.0f}-{hi:.0f}]" for v, lo, hi in
                                             zip(s["epochs_to"].tolist(), s["min"].tolist(), s["max"].tolist())))
    for ax, scale in zip(axes[0], scales):
        ax.set(yscale=scale, xlabel="epoch", ylabel="loss")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("bold: the run closest to the mean curve; faded: all runs. Epochs to " + "/".join(f"{f:g}" for f in fractions)
                 + " of the initial loss, bold run [range over runs]\n" + "; ".join(lines), fontsize=8)
    fig.tight_layout()
    return fig


def reln_gates(result: dict, title: str, n_contexts: int | None = None, n_items: int | None = None,
               rule: str | None = None):
    """[H] Figs. 8-9: k-means centroids (k, N) for every k (black = active; red lines between the
    ``n_contexts`` blocks of ``n_items`` points) and, where ``result`` has ``errors``, the imitation
    error over k with the k at the elbow (by ``rule``) circled. ``result``: ``{"ks", "centroids"}``
    (``zoo.models.reln.centroids_per_k``), optionally ``"errors"`` and ``"elbow_k"``
    (``zoo.models.reln_imitation.ImitationGDLNs.imitation``)."""
    plt = pyplot()
    ks, cents, errors, chosen = result["ks"], result["centroids"], result.get("errors") or [], result.get("elbow_k")
    bounds = [c * n_items - 0.5 for c in range(1, n_contexts)] if n_contexts and n_items else []
    heights = [max(k, 1) for k in ks]
    fig = plt.figure(figsize=(10 if errors else 7, 1.2 + 0.35 * sum(heights) + 0.3 * len(ks)), dpi=100)
    grid = (fig.add_gridspec(len(ks), 2, width_ratios=[2.2, 1], height_ratios=heights, wspace=0.35) if errors  # room for the y ticks
            else fig.add_gridspec(len(ks), 1, height_ratios=heights))
    for r, (k, C) in enumerate(zip(ks, cents)):
        ax = fig.add_subplot(grid[r, 0])
        ax.imshow(C.cpu().numpy(), cmap="Greys", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        for b in bounds:
            ax.axvline(b, color="tab:red", lw=1)
        ax.set_yticks(range(k))
        ax.set_ylabel(f"k={k}" + (" (elbow)" if k == chosen else ""), fontsize=8, color="tab:red" if k == chosen else "black")
        N = C.shape[1]
        ax.set_xticks([] if r < len(ks) - 1 else range(0, N, max(1, N // 12)))
        if r == 0:
            ax.set_title(title, fontsize=9)
    if not errors:
        return fig
    ax = fig.add_subplot(grid[:, 1])
    ax.plot(ks, errors, "o-")
    if chosen is not None:
        ax.plot([chosen], [errors[ks.index(chosen)]], "o", color="tab:red", ms=10, mfc="none")
    ax.set(yscale="log", xlabel="k (clusters = ReLN pathways)", ylabel="|f_ReLU - f_GDLN|^2 (mean)")
    ax.set_title(f"elbow ({rule}): k = {chosen}", fontsize=9)
    return fig


def mds(records: list[tuple[int, Tensor]], name: str, context: Tensor | None = None, n_items: int | None = None,
        max_panels: int | None = None):
    """Classical-MDS coordinates (N, dim) of the data points, one panel per (epoch, coords) record
    (at most ``max_panels``, evenly spaced, first and last kept); coloured by ``context`` and
    labelled by item when given."""
    if max_panels is not None and len(records) > max_panels:
        idx = np.unique(np.linspace(0, len(records) - 1, max_panels).round().astype(int))
        records = [records[i] for i in idx]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(records), figsize=(3.0 * len(records), 3.0), dpi=90, squeeze=False)
    for ax, (epoch, c) in zip(axes[0], records):
        c = c.cpu().numpy()
        y = c[:, 1] if c.shape[1] > 1 else np.zeros(len(c))
        ax.scatter(c[:, 0], y, c=None if context is None else np.asarray(context), cmap="tab10", vmin=0, vmax=9, s=25)
        if n_items is not None:
            for i, (a, b) in enumerate(zip(c[:, 0], y)):
                ax.annotate(str(i % n_items), (a, b), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set_title(f"{name} epoch {epoch}", fontsize=8)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_aspect("equal", adjustable="datalim")
    fig.tight_layout()
    return fig
