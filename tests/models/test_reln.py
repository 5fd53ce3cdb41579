"""zoo.models.reln: k-means ReLN discovery ([H] App. B) on planted patterns and on a trained ReLU net,
the elbow rule, gatings from patterns, and classical MDS against known configurations."""
from __future__ import annotations

import math

import pytest
import torch

from datamodules.contexts import Contexts
from zoo.models import reln
from zoo.models.gdln import ReLUNet
from zoo.init import Gaussian



def _contexts_of(pattern: torch.Tensor, C: int = 3, n: int = 8) -> list[float]:
    return pattern.float().reshape(C, n).mean(1).tolist()


def test_kmeans_recovers_planted_patterns():
    # 4 planted gating patterns over 24 points, 200 noisy copies each (5% of bits flipped):
    # k-means with k = 4 must return them after thresholding, whatever the row order.
    g = torch.Generator().manual_seed(0)
    planted = Contexts(3, "same").gating("reln").gates.T.bool()  # common + three "not context c"
    rows = planted.repeat_interleave(200, 0)
    flips = torch.rand(rows.shape, generator=g) < 0.05
    rows = (rows ^ flips)[torch.randperm(rows.shape[0], generator=g)]
    C = reln.cluster_patterns(rows.float(), 4, random_state=0, n_init=4)
    found = reln.threshold_centroids(C)
    assert sorted(map(tuple, found.int().tolist())) == sorted(map(tuple, planted.int().tolist()))
    # a centroid is the mean of its rows: 1 - 0.05 on the pattern, 0.05 off it (200 rows: +- 0.05)
    assert torch.allclose(C, found.double() * 0.9 + 0.05, atol=0.05)


def test_kmeans_on_three_context_relu_net_finds_the_reln():
    """[H] App. B: k = 4 on the three-context ReLU net gives a common pathway and pathways active
    in two of the three contexts. Short run: 3 members x 100 units, 5,000 epochs, patterns every
    100 epochs (the authors' spacing), same-structure task (exact patterns; see the report for the
    different-structure task, where one item of the ring context is an exception)."""
    dm = Contexts(3, "same")
    X, Y = dm.X, dm.Y
    m = ReLUNet(hidden=[100], ensemble=3, init=Gaussian(sigma=7.142857e-06), lr=1e-3, reduction="sum", seed=0)
    m.build(X, Y)
    rows = [reln.pattern_rows(m.activation_patterns(X)[0])]
    for _ in range(50):
        m.run_epochs(X, Y, 100)
        rows.append(reln.pattern_rows(m.activation_patterns(X)[0]))
    found = reln.threshold_centroids(reln.cluster_patterns(torch.cat(rows), 4, random_state=0, n_init=10))
    per_context = [_contexts_of(p) for p in found]
    assert per_context[0] == [1.0, 1.0, 1.0]  # the common pathway: every data point
    silent = sorted(ctx.index(0.0) for ctx in per_context[1:])
    assert silent == [0, 1, 2]  # one pathway silent in each context ...
    for ctx in per_context[1:]:
        assert sorted(ctx) == [0.0, 1.0, 1.0]  # ... and on for every point of the other two


def test_gating_from_patterns():
    dm = Contexts(3, "same")
    hand = dm.gating("reln")
    pats = torch.cat([hand.gates.T, torch.zeros(1, 24), hand.gates.T[:1]])  # + an empty and a repeated pattern
    g = reln.gating_from_patterns(pats, 11)
    assert torch.equal(g.gates, hand.gates)  # empty and duplicate dropped, order kept
    assert g.common.tolist() == [True, False, False, False]
    assert torch.equal(g.inputs, torch.ones(4, 11))
    with pytest.raises(ValueError, match="inputs"):
        reln.gating_from_patterns(pats, 11, inputs=torch.ones(3, 11))
    with pytest.raises(ValueError, match="empty"):
        reln.gating_from_patterns(torch.zeros(2, 24), 11)


def test_gdln_from_found_gates_trains_like_hand_built_reln():
    # The GDLN built from the hand-built ReLN gates (and their input masks) is the GDLN of
    # zoo.models.gdln with gating 'reln': same init seed -> identical weights and losses.
    from zoo.models.gdln import GDLN

    dm = Contexts(3, "same")
    hand = dm.gating("reln")
    g = reln.gating_from_patterns(hand.gates.T, 11, inputs=hand.inputs)
    kw = dict(n_hidden=5, init=Gaussian(sigma=0.1), ensemble=2, lr=1e-3, reduction="sum", seed=3)
    a = reln.gdln_for_gating(g, **kw)
    a.build(dm.X, dm.Y)
    b = GDLN(gating="reln", **kw)
    b.attach(dm)
    b.build(dm.X, dm.Y)
    la, lb = a.run_epochs(dm.X, dm.Y, 20), b.run_epochs(dm.X, dm.Y, 20)
    assert torch.equal(la, lb)


def test_train_outputs_and_imitation_error():
    dm = Contexts(3, "same")
    g = reln.gating_from_patterns(dm.gating("reln").gates.T, 11)
    kw = dict(n_hidden=4, init=Gaussian(sigma=0.1), ensemble=2, lr=1e-3, reduction="sum", seed=1)
    a, b = (reln.gdln_for_gating(g, **kw) for _ in range(2))
    a.build(dm.X, dm.Y), b.build(dm.X, dm.Y)
    outs_a, outs_b = reln.train_outputs(a, dm.X, dm.Y, [0, 5, 10]), reln.train_outputs(b, dm.X, dm.Y, [0, 10])
    assert outs_a.shape == (3, 2, 24, 60)
    assert torch.equal(outs_a[-1], outs_b[-1])  # 10 epochs in one go or in two chunks: the same
    assert reln.imitation_error(outs_a, outs_a) == 0.0
    diff = outs_a[[0, 2]].double().mean(1) - outs_b.double().mean(1)
    assert math.isclose(reln.imitation_error(outs_a[[0, 2]], outs_b), float(diff.pow(2).mean()), rel_tol=1e-12)
    with pytest.raises(ValueError, match="same records"):
        reln.imitation_error(outs_a, outs_b)
    with pytest.raises(ValueError, match="increasing"):
        reln.train_outputs(a, dm.X, dm.Y, [10, 5])


def test_elbow_rule():
    ks = [1, 2, 3, 4, 5, 6]
    # a curve that falls steeply to k = 4 and is flat after: the elbow is 4
    assert reln.elbow(ks, [10.0, 6.0, 3.0, 0.5, 0.45, 0.4]) == 4
    # invariant to the error's scale and offset (both axes are normalised)
    assert reln.elbow(ks, [7 + 100 * e for e in (10.0, 6.0, 3.0, 0.5, 0.45, 0.4)]) == 4
    assert reln.elbow([2, 3], [1.0, 0.5]) == 2  # too few points: the first
    assert reln.elbow(ks, [1.0] * 6) == 1  # flat: the first
    # "within": the first k within 10% of the best; on the curve measured by the Figs. 8-9 recipe
    # (errors for k = 1..6) kneedle says 3 and "within" 4 (0.00135 <= 1.1 * 0.00126)
    measured = [0.0113, 0.00645, 0.00192, 0.00135, 0.00126, 0.00212]
    assert reln.elbow(ks, measured) == 3
    assert reln.elbow(ks, measured, "within", 0.1) == 4
    assert reln.elbow(ks, measured, "within", 0.0) == 5  # the best k itself
    with pytest.raises(ValueError, match="ks"):
        reln.elbow([1, 2], [1.0])
    with pytest.raises(ValueError, match="rule"):
        reln.elbow(ks, measured, "knee")


def test_centroids_per_k_leaves_out_ks_above_the_non_silent_rows():
    rows = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 0], [1, 0, 0]])  # one silent row
    ks, cents = reln.centroids_per_k(rows, [1, 2, 3, 4], n_init=2)
    assert ks == [1, 2, 3] and [C.shape for C in cents] == [(1, 3), (2, 3), (3, 3)]
    # a centroid is the mean of its rows (k-means' float64 sums: 1e-12)
    assert torch.allclose(cents[0], torch.tensor([[2 / 3, 1 / 3, 0]], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(cents[1], torch.tensor([[1.0, 0, 0], [0, 1, 0]], dtype=torch.float64), atol=1e-12)


def test_cluster_patterns_rejects_bad_input():
    with pytest.raises(ValueError, match="k = 0"):
        reln.cluster_patterns(torch.ones(5, 3), 0)
    with pytest.raises(ValueError, match="rows"):
        reln.cluster_patterns(torch.ones(2, 3), 4)
    with pytest.raises(ValueError, match="level"):
        reln.threshold_centroids(torch.ones(2, 3), 1.5)
    with pytest.raises(ValueError, match="patterns"):
        reln.pattern_rows(torch.ones(3))


def test_classical_mds_recovers_a_square_and_a_line():
    # a unit square rotated and shifted in 5 dimensions: MDS in 2-d reproduces all distances
    # (exact up to float64 round-off: 1e-10), and the Gram spectrum has exactly two non-zero values
    square = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    Q, _ = torch.linalg.qr(torch.randn(5, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    H = torch.cat([square, torch.zeros(4, 3, dtype=torch.float64)], 1) @ Q.T + 3.0
    D = reln.pairwise_distances(H)
    assert torch.allclose(D[0], torch.tensor([0.0, 1.0, math.sqrt(2), 1.0], dtype=torch.float64), atol=1e-7)
    coords, evals = reln.classical_mds(D, 2)
    assert torch.allclose(reln.pairwise_distances(coords), D, atol=1e-10)
    # B is the centred Gram matrix: its non-zero eigenvalues are those of sum_i x_i x_i^T over the
    # centred corners (+-1/2, +-1/2), i.e. 4 * 1/4 = 1 on each axis
    assert torch.allclose(evals[:2], torch.tensor([1.0, 1.0], dtype=torch.float64), atol=1e-10)
    assert evals[2:].abs().max() < 1e-10
    # points on a line at 0, 1, 3, 7: one axis carries them all
    line = torch.tensor([[0.0], [1.0], [3.0], [7.0]], dtype=torch.float64) * torch.tensor([[0.6, 0.8]], dtype=torch.float64)
    coords, evals = reln.classical_mds(reln.pairwise_distances(line), 2)
    assert torch.allclose(coords[:, 1], torch.zeros(4, dtype=torch.float64), atol=1e-7)
    assert torch.allclose((coords[:, 0] - coords[0, 0]).abs(), torch.tensor([0.0, 1.0, 3.0, 7.0], dtype=torch.float64), atol=1e-10)
    with pytest.raises(ValueError, match="square"):
        reln.classical_mds(torch.ones(3, 4))
