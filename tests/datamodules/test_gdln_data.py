"""The [H] datasets and gates: check values from docs/theory.md#contexts and the paper's App. C."""
from __future__ import annotations

import math

import pytest
import torch

from datamodules.contexts import Contexts, cross, hierarchy, ring
from datamodules.xor import XorMargin


def test_same_structure_check_values():
    dm = Contexts(3, "same")
    X, Y = dm.X.double(), dm.Y.double()
    assert X.shape == (24, 11) and Y.shape == (24, 60)
    # docs/theory.md#contexts: 1/2 |Y|_F^2 = 96 exactly (0/1 targets: 192 ones)
    assert 0.5 * Y.pow(2).sum().item() == 96.0
    s = torch.linalg.svdvals(Y.T @ X / 24)
    # printed to 4 decimals in docs/theory.md#contexts
    assert torch.allclose(s[:4], torch.tensor([1.0704, 0.4564, 0.4564, 0.3819], dtype=torch.float64), atol=5e-5)


def test_different_structure_initial_loss():
    dm = Contexts(3, "different")
    # the authors' summed loss at a vanishing init is 1/2 |Y|^2 = 105.623 (docs/theory.md#contexts check value)
    assert 0.5 * dm.Y.double().pow(2).sum().item() == pytest.approx(105.623, abs=5e-4)
    # ring: every row after the first is the graded bump moved by one item; cross keeps the hierarchy elsewhere
    R = ring()
    assert torch.equal(R[2], torch.roll(R[1], -1)) and torch.equal(R[9], R[1])
    C, H = cross(), hierarchy()
    assert torch.equal(C[:3], H[:3]) and torch.equal(C[7:], H[7:]) and torch.equal(C[3], torch.tensor([1.0, 0, 1, 0, 0, 0, 0, 0]))


@pytest.mark.parametrize("C", [3, 4, 5])
def test_context_gates(C):
    dm = Contexts(C, "same")
    X, Y = dm.X, dm.Y
    assert X.shape == (8 * C, 8 + C) and Y.shape == (8 * C, 15 * (C + 1))
    g = dm.gating("reln")
    ctx = dm.context
    assert g.n_pathways == C + 1 and bool(g.common[0]) and not bool(g.common[1:].any())
    assert bool((g.gates[:, 0] == 1).all())  # the common pathway is on for every point
    for p in range(1, C + 1):  # each context pathway: on in C - 1 contexts, off in its own
        on = set(ctx[g.gates[:, p] == 1].tolist())
        assert on == set(range(C)) - {p - 1}
    assert torch.equal(g.inputs[1:, 8:], torch.zeros(C, C)) and bool((g.inputs[1:, :8] == 1).all())  # items only
    single = dm.gating("single")
    for p in range(1, C + 1):
        assert set(ctx[single.gates[:, p] == 1].tolist()) == {p - 1}
    # the authors' seven-module network (C = 3): common, then the 'single' pathways, then the 'reln' ones
    full = dm.gating("reln_full")
    assert full.n_pathways == 2 * C + 1 and full.names[1] == "only_ctx0" and full.names[-1] == f"not_ctx{C - 1}"
    assert torch.equal(full.gates, torch.cat([g.gates, single.gates[:, 1:]], 1)[:, [0, *range(C + 1, 2 * C + 1), *range(1, C + 1)]])
    assert torch.equal(full.inputs[1:], torch.cat([g.inputs[1:], single.inputs[1:]])) and full.common.sum() == 1


def test_context_scale_scales_the_context_inputs():
    plain, scaled = Contexts(4, "same"), Contexts(4, "same", context_scale=1.1)  # the authors' C = 4 data
    assert torch.equal(scaled.X[:, :8], plain.X[:, :8]) and torch.allclose(scaled.X[:, 8:], 1.1 * plain.X[:, 8:])
    assert torch.equal(scaled.Y, plain.Y)
    with pytest.raises(ValueError, match="context_scale"):
        Contexts(3, context_scale=0.0)


def test_xor_margin_values():
    dm = XorMargin(Delta=0.5)
    expected = torch.tensor([[-1, -1, -0.5], [1, -1, 0.5], [-1, 1, 0.5], [1, 1, -0.5]])  # [H] App. C Eq. 11 (columns)
    assert torch.equal(dm.X, expected) and torch.equal(dm.Y.flatten(), torch.tensor([-1.0, 1, 1, -1]))
    many = XorMargin(Delta=[0.0, 1.0, 2.0])
    assert many.X.shape == (3, 4, 3) and torch.equal(many.X[2, :, 2], torch.tensor([-2.0, 2, 2, -2]))
    lin, xor = dm.gating("linear"), dm.gating("xor")
    # the linear ReLN: one pathway on the positive examples (y = 1), one on the negative
    assert torch.equal(lin.gates[:, 0], (dm.Y.flatten() > 0).float())
    assert torch.equal(xor.gates, torch.eye(4))


@pytest.mark.parametrize("kwargs, word", [
    (dict(n_contexts=2), "n_contexts"), (dict(structure="ring"), "structure"),
    (dict(n_contexts=4, structure="different"), "different"), (dict(n_items=6), "n_items"),
])
def test_contexts_bad_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Contexts(**kwargs)


def test_xor_bad_input():
    with pytest.raises(ValueError, match="Delta"):
        XorMargin(Delta=-1.0)
    with pytest.raises(ValueError, match="gating"):
        XorMargin().gating("relu")


def test_deterministic():
    assert torch.equal(Contexts(4).Y, Contexts(4).Y) and math.isfinite(float(Contexts(5).X.sum()))
