"""zoo.metrics.sparsity on hand-built activity matrices with hand-counted values ([S] Eq. 31)."""
from __future__ import annotations

import pytest
import torch

from zoo.metrics.sparsity import sparsity

# 4 data points x 3 units: unit 0 fires on 3 points, unit 1 on none, unit 2 on all 4
H = torch.tensor([[1.0, 0.0, 2.0],
                  [0.5, -1.0, 0.1],
                  [0.0, 0.0, 3.0],
                  [2.0, -0.5, 1.0]])


def test_hand_counted_values():
    s = sparsity(H)
    assert s["eq31"] == pytest.approx((3 + 0 + 4) / 3)  # [S] Eq. 31: mean over units of points that activate it
    assert s["l0"] == pytest.approx((2 + 2 + 1 + 2) / 4)  # active units per data point
    assert s["dead_fraction"] == pytest.approx(1 / 3)
    assert s["dense_fraction"] == pytest.approx(2 / 3)  # units 0 (3/4) and 2 (4/4) fire on > half the points
    torch.testing.assert_close(s["density"], torch.tensor([0.75, 0.0, 1.0], dtype=torch.float64))
    assert sparsity(H, dense_threshold=0.8)["dense_fraction"] == pytest.approx(1 / 3)


def test_eq31_and_l0_are_the_same_count_seen_from_two_sides():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(50, 20, generator=g)
    s = sparsity(A)
    # sum over units of per-unit counts = sum over points of per-point counts = number of active entries
    assert s["eq31"] * 20 == pytest.approx(s["l0"] * 50)
    assert s["eq31"] * 20 == int((A > 0).sum())


def test_explained_variance():
    x = torch.tensor([[1.0, 2.0], [3.0, 0.0], [5.0, 4.0]])
    assert sparsity(H[:3], x, x)["explained_variance"] == 1.0
    mean = x.mean(0).expand_as(x)
    assert sparsity(H[:3], x, mean)["explained_variance"] == pytest.approx(0.0, abs=1e-12)
    # residual 1 on a single entry; total variance about the mean: (4 + 0 + 4) + (0 + 4 + 4) = 16
    x_hat = x.clone()
    x_hat[0, 0] += 1.0
    assert sparsity(H[:3], x, x_hat)["explained_variance"] == pytest.approx(1 - 1 / 16)


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(3),), "H must be"),
    ((torch.zeros(0, 3),), "at least one data point"),
    ((H, torch.zeros(4, 2)), "give both x and x_hat"),
    ((H, torch.zeros(4, 2), torch.zeros(3, 2)), r"must both be \(N = 4, d\)"),
])
def test_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        sparsity(*args)
