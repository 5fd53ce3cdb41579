"""Finding the gates of a ReLU network: ReLN discovery by k-means ([H] App. B, Alg. 1, Figs. 8-9),
and classical MDS of hidden representations ([H] Figs. 3-4).

[H] App. B, Algorithm 1: train the ReLU net several times; every 100 epochs take the binary
activation pattern ``step(W_0 X)`` of every hidden unit over the N data points and stack them as
rows, giving (samples * H, N) "neurons"; k-means them into k centroids (N-dimensional). Each
centroid is the gating pattern of one *type* of hidden unit, i.e. one pathway of the ReLN. k is
chosen at the elbow of the ReLU-vs-GDLN output error over k ([H] Fig. 9).

Choices the paper leaves open, made here (docs/theory.md#finding-gates):

* Units silent on every data point are dropped before clustering: a pathway that is never on
  carries nothing, yet dead units are many and would take a centroid of their own.
* A centroid becomes a gate by thresholding at 0.5 (a data point is in the pathway when most of
  the cluster's units fire on it). Empty and duplicate patterns are dropped.
* Every found pathway reads every input (the ReLU units do); a pathway on for all points is
  "common" (for the authors' two-loss scheme).
* Imitation error for k: a GDLN with the found gates, trained from the ReLU net's init scheme,
  learning rate and seed for the same epochs; the mean over recorded epochs, points and outputs of
  ``|f_ReLU - f_GDLN|^2`` (member-mean outputs of each), [H] App. B "the mean-squared error between
  the ReLU network and the GDLN". Training those GDLNs is a fit of its own
  (``zoo.models.reln_imitation.ImitationGDLNs``, phase 2, reading the ReLU net's checkpoint); here are the
  pieces it is built from.
* Elbow rule, two on offer (``elbow``): "kneedle" (normalise k and the error to [0, 1], take the
  k farthest below the chord from the first to the last point) and "within" (the smallest k whose
  error is within ``rel_tol`` = 10% of the best). On the three-context task kneedle picks 3 and
  "within" 4 (recipes/haste_slowly/fig9_reln_elbow.yaml).

Pure torch / numpy / scikit-learn: no Lightning, except that ``gdln_for_gating`` builds a
``zoo.models.gdln.GDLN`` (imported on use) and ``train_outputs`` runs its Trainer-free loop ``run_epochs``
(for notebooks, and the tests' reference for ImitationGDLNs).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np
import torch
from torch import Tensor

from zoo.utils.extras import require
from zoo.theory.gdln import Gating

if TYPE_CHECKING:  # pragma: no cover
    from zoo.models.gdln import GDLN
    from zoo.init import InitScheme

__all__ = [
    "pattern_rows", "cluster_patterns", "centroids_per_k", "threshold_centroids", "gating_from_patterns",
    "gdln_for_gating", "train_outputs", "imitation_error", "check_discovery", "elbow", "classical_mds",
    "pairwise_distances", "hidden_mds",
]


def pattern_rows(patterns: Tensor) -> Tensor:
    """Activation patterns (N, H) or (E, N, H) (``ReLUNet.activation_patterns``) as rows, one per
    hidden unit: (H, N) or (E H, N) float ([H] Alg. 1 ``sample_binary``, (H, N))."""
    if patterns.dim() not in (2, 3):
        raise ValueError(f"pattern_rows: patterns has shape {tuple(patterns.shape)}; allowed: (N, H) or (E, N, H)")
    rows = patterns.transpose(-1, -2).float()
    return rows.reshape(-1, rows.shape[-1])


def cluster_patterns(samples: Tensor, k: int, *, random_state: int = 0, n_init: int = 10,
                     drop_silent: bool = True) -> Tensor:
    """k-means of stacked binary patterns (rows = units, (R, N)) into k centroids (k, N) ([H] Alg. 1).

    Centroids are sorted by mean activity (most active first), ties by pattern, so the order does
    not depend on k-means' labelling. ``drop_silent`` removes rows that are 0 on every point.
    """
    from sklearn.cluster import KMeans

    if samples.dim() != 2:
        raise ValueError(f"cluster_patterns: samples has shape {tuple(samples.shape)}; allowed: (rows, N)")
    if k < 1:
        raise ValueError(f"cluster_patterns: k = {k}; allowed: a positive integer")
    if n_init < 1:
        raise ValueError(f"cluster_patterns: n_init = {n_init}; allowed: a positive integer")
    S = samples.detach().cpu().double()
    if drop_silent:
        S = S[S.sum(1) > 0]
    if S.shape[0] < k:
        raise ValueError(f"cluster_patterns: {S.shape[0]} (non-silent) rows for k = {k}; allowed: k <= rows")
    km = KMeans(n_clusters=k, random_state=random_state, n_init=n_init).fit(S.numpy())
    C = np.asarray(km.cluster_centers_)
    order = sorted(range(k), key=lambda j: (-C[j].mean(), tuple(-C[j])))
    return torch.from_numpy(C[order]).to(torch.float64)


def threshold_centroids(centroids: Tensor, level: float = 0.5) -> Tensor:
    """Gating patterns (k, N) bool: a point is in the pathway where the centroid exceeds ``level``."""
    if not 0 < level < 1:
        raise ValueError(f"threshold_centroids: level = {level}; allowed: a number in (0, 1)")
    return centroids > level


def gating_from_patterns(patterns: Tensor, n_in: int, inputs: Tensor | None = None) -> Gating:
    """A ``Gating`` from gating patterns (P, N) 0/1 ([H] Def. 3.1: the ReLN's node gates).

    Empty and repeated patterns are dropped (they add no pathway the GDLN lacks). ``inputs``
    (P', n_in) selects each kept pathway's input features; default: all (as a ReLU unit reads).
    """
    if patterns.dim() != 2:
        raise ValueError(f"gating_from_patterns: patterns has shape {tuple(patterns.shape)}; allowed: (P, N)")
    if n_in < 1:
        raise ValueError(f"gating_from_patterns: n_in = {n_in}; allowed: a positive integer")
    kept: list[Tensor] = []
    for p in patterns.bool():
        if p.any() and not any(torch.equal(p, q) for q in kept):
            kept.append(p)
    if not kept:
        raise ValueError("gating_from_patterns: every pattern is empty; allowed: at least one pattern with a 1")
    gates = torch.stack(kept, dim=1).float()  # (N, P)
    P = gates.shape[1]
    if inputs is None:
        inputs = torch.ones(P, n_in)
    elif tuple(inputs.shape) != (P, n_in):
        raise ValueError(f"gating_from_patterns: inputs {tuple(inputs.shape)} for {P} distinct non-empty patterns; "
                         f"allowed: ({P}, {n_in})")
    common = gates.bool().all(0)
    names = ["common" if c else f"gate{j}" for j, c in enumerate(common.tolist())]
    return Gating(gates, inputs.float(), common, names)


def gdln_for_gating(gating: Gating, *, n_hidden: int, init: "InitScheme", ensemble: int, lr: float,
                    reduction: Literal["mean", "sum"], seed: int = 0, n_shared: int | None = None) -> "GDLN":
    """A ``zoo.models.gdln.GDLN`` with these gates (its weights follow from ``build(X, Y)``, which a
    Trainer calls at setup); with ``n_shared`` a ``zoo.models.gdln_depth.DepthGDLN`` (a shared linear
    layer of that width before the gated pathways: the ReLN of a two-hidden-layer ReLU net, [H] Sec. 6)."""
    from zoo.models.gdln import GDLN
    from zoo.models.gdln_depth import DepthGDLN

    kw = dict(gating="found", n_hidden=n_hidden, init=init, ensemble=ensemble, lr=lr, reduction=reduction, seed=seed)
    m = GDLN(**kw) if n_shared is None else DepthGDLN(n_shared=n_shared, **kw)
    m.set_gating(gating)
    return m


def train_outputs(model, X: Tensor, Y: Tensor, epochs: Sequence[int]) -> Tensor:
    """Train a ``zoo.models.gdln`` network in place and return its outputs (T, E, N, n_out) after each of
    the (increasing) ``epochs``."""
    outs, done = [], 0
    for e in epochs:
        if e < done:
            raise ValueError(f"train_outputs: epochs must be increasing, got {list(epochs)}")
        if e > done:
            model.run_epochs(X, Y, int(e - done))
            done = int(e)
        outs.append(model(X).detach())
    return torch.stack(outs)


def imitation_error(relu_outputs: Tensor, gdln_outputs: Tensor) -> float:
    """Mean over records, points and outputs of ``|f_ReLU - f_GDLN|^2`` of member-mean outputs
    (T, E, N, n_out) each ([H] App. B, Fig. 9)."""
    if relu_outputs.shape[0] != gdln_outputs.shape[0] or relu_outputs.shape[2:] != gdln_outputs.shape[2:]:
        raise ValueError(f"imitation_error: outputs {tuple(relu_outputs.shape)} and {tuple(gdln_outputs.shape)}; "
                         "allowed: the same records, points and outputs (T, *, N, n_out)")
    return float((relu_outputs.double().mean(1) - gdln_outputs.double().mean(1)).pow(2).mean())


def centroids_per_k(rows: Tensor, ks: Sequence[int], *, random_state: int = 0,
                    n_init: int = 10) -> tuple[list[int], list[Tensor]]:
    """[H] Alg. 1's k-means of recorded activation-pattern rows (R, N) for every k in ``ks`` up to
    the number of non-silent rows: those ks and their centroids (k, N) (``cluster_patterns``)."""
    ks = [int(k) for k in ks if k <= int((rows.sum(1) > 0).sum())]
    return ks, [cluster_patterns(rows, k, random_state=random_state, n_init=n_init) for k in ks]


def check_discovery(ks: Sequence[int], *, n_hidden: int = 100, threshold: float = 0.5, rule: str = "kneedle",
                    rel_tol: float = 0.1, n_init: int = 10, caller: str = "ReLN discovery") -> None:
    """Raise a ValueError naming the first bad setting of ReLN discovery (``centroids_per_k``, the
    gates' ``threshold``, ``elbow``), or ``zoo.utils.extras.MissingExtra`` without scikit-learn, before a run
    that ends in it."""
    checks = [("ks", ks, bool(ks) and all(int(k) >= 1 for k in ks) and len(set(ks)) == len(ks), "distinct positive integers"),
              ("n_hidden", n_hidden, n_hidden >= 1, "a positive integer"),
              ("threshold", threshold, 0 < threshold < 1, "a number in (0, 1)"),
              ("elbow_rule", rule, rule in ("kneedle", "within"), "'kneedle' or 'within'"),
              ("rel_tol", rel_tol, rel_tol >= 0, "a number >= 0"), ("n_init", n_init, n_init >= 1, "a positive integer")]
    for name, value, ok, allowed in checks:
        if not ok:
            raise ValueError(f"{caller}: {name} = {value!r}; allowed: {allowed}")
    require("sklearn", "reln", f"{caller} (k-means of the activation patterns)")


def elbow(ks: Sequence[int], errors: Sequence[float], rule: Literal["kneedle", "within"] = "kneedle",
          rel_tol: float = 0.1) -> int:
    """The k at the elbow of an error-over-k curve ([H] App. B, Fig. 9).

    ``rule = "kneedle"``: with k and the error rescaled to [0, 1], the k whose point lies farthest
    below the chord from the first point to the last (a curve with fewer than three points, or
    none below the chord, gives its first k). ``rule = "within"``: the smallest k whose error is at
    most ``(1 + rel_tol)`` times the smallest error (where adding clusters stops paying).
    """
    if len(ks) != len(errors) or not ks:
        raise ValueError(f"elbow: {len(ks)} ks and {len(errors)} errors; allowed: the same, non-zero number")
    if rule not in ("kneedle", "within"):
        raise ValueError(f"elbow: rule = {rule!r}; allowed: 'kneedle' or 'within'")
    if not rel_tol >= 0:
        raise ValueError(f"elbow: rel_tol = {rel_tol}; allowed: a number >= 0")
    e = np.asarray(errors, dtype=float)
    if rule == "within":
        return int(ks[int(np.argmax(e <= (1 + rel_tol) * e.min()))])
    if len(ks) < 3:
        return int(ks[0])
    k = np.asarray(ks, dtype=float)
    x = (k - k[0]) / (k[-1] - k[0])
    span = e.max() - e.min()
    if span == 0:
        return int(ks[0])
    y = (e - e.min()) / span
    chord = y[0] + (y[-1] - y[0]) * x
    gap = chord - y  # positive below the chord
    j = int(np.argmax(gap))
    return int(ks[j]) if gap[j] > 0 else int(ks[0])


# ---------------------------------------------------------------------------------------------
# classical MDS of hidden representations ([H] Figs. 3-4)
# ---------------------------------------------------------------------------------------------
def pairwise_distances(H: Tensor) -> Tensor:
    """Euclidean distances between the rows of H (..., N, d): (..., N, N)."""
    # centred first (distances do not change): |h_i|^2 + |h_j|^2 - 2 h_i.h_j cancels less when the
    # points sit far from the origin; a point's distance to itself is exactly 0, not the round-off
    H = H.double()
    H = H - H.mean(-2, keepdim=True)
    sq = H.pow(2).sum(-1)
    D2 = sq[..., :, None] + sq[..., None, :] - 2 * H @ H.transpose(-1, -2)
    D2.diagonal(dim1=-2, dim2=-1).zero_()
    return D2.clamp(min=0).sqrt()


def classical_mds(D: Tensor, dim: int = 2) -> tuple[Tensor, Tensor]:
    """Classical (Torgerson) MDS of a distance matrix D (N, N): coordinates (N, dim) and the
    eigenvalues of the double-centred Gram matrix ``B = -1/2 J D^2 J`` (N,), largest first.

    Exact for Euclidean distances of points in <= dim dimensions (up to rotation and reflection);
    each axis' sign is fixed so its largest-magnitude coordinate is positive.
    """
    if D.dim() != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"classical_mds: D has shape {tuple(D.shape)}; allowed: a square (N, N) matrix")
    if dim < 1:
        raise ValueError(f"classical_mds: dim = {dim}; allowed: a positive integer")
    D = D.double()
    N = D.shape[0]
    J = torch.eye(N, dtype=torch.float64) - 1.0 / N
    B = -0.5 * J @ D.pow(2) @ J
    B = 0.5 * (B + B.T)
    evals, evecs = torch.linalg.eigh(B)
    evals, evecs = evals.flip(0), evecs.flip(1)
    d = min(dim, N)
    coords = evecs[:, :d] * evals[:d].clamp(min=0).sqrt()
    idx = coords.abs().argmax(0)
    sign = torch.sign(coords[idx, torch.arange(d)])
    coords = coords * torch.where(sign == 0, torch.ones_like(sign), sign)
    if d < dim:
        coords = torch.cat([coords, torch.zeros(N, dim - d, dtype=torch.float64)], 1)
    return coords, evals


def hidden_mds(H: Tensor, dim: int = 2) -> tuple[Tensor, float]:
    """Classical MDS in ``dim`` dimensions of the data points' hidden activity H (E, N, n): the
    coordinates (N, dim) of the distances averaged over members (each member's hidden basis is its
    own) and the share of the Gram spectrum they hold."""
    coords, evals = classical_mds(pairwise_distances(H).mean(0).cpu(), dim)
    pos = evals.clamp(min=0)
    return coords, float(pos[:dim].sum() / pos.sum()) if float(pos.sum()) > 0 else 0.0
