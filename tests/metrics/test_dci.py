"""DCI (zoo/metrics/dci.py; docs/theory.md#dci): exact D and C from hand-built importance matrices,
and the gradient-boosted pipeline on codes whose answer is known."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy

from zoo.metrics.dci import DCIMetric, DCISetting, dci, dci_from_importance, dci_on_grid

SIZES = (4, 5, 3)  # levels per factor of the synthetic grids below
N_TRAIN, N_TEST, TREES = 600, 300, 20  # small: every fit here takes well under a second


def grid_points(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, s, n) for s in SIZES], axis=1)


def perfect_code(f: np.ndarray, seed: int, noise: float = 0.05) -> np.ndarray:
    """Each code is one factor's level plus noise far below the level spacing (1)."""
    return f + noise * np.random.default_rng(seed).standard_normal(f.shape)


def run(code_fn, random_state: int = 0) -> dict:
    ftr, fte = grid_points(N_TRAIN, 1), grid_points(N_TEST, 2)
    return dci(code_fn(ftr, 3), ftr, code_fn(fte, 4), fte, random_state=random_state, n_estimators=TREES)


# -- D and C from an importance matrix: exact --------------------------------------------------------------
def test_hand_computed_importance():
    # 3 codes x 2 factors. Code 0 predicts factor 0 only (1 - H = 1, weight 1/3); code 1 both
    # equally (1 - H_2(1/2, 1/2) = 0, weight 2/3); code 2 nothing (weight 0): D = 1/3.
    # Factor 0 is split over codes 0 and 1 (1 - log 2 / log 3, weight 2/3); factor 1 lives in
    # code 1 alone (1, weight 1/3): C = 2/3 (1 - log 2 / log 3) + 1/3.
    R = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    out = dci_from_importance(R)
    # the 1e-11 offset changes entropies by ~ -eps log eps ~ 3e-10
    assert out["disentanglement"] == pytest.approx(1 / 3, abs=1e-8)
    assert out["completeness"] == pytest.approx(2 / 3 * (1 - math.log(2) / math.log(3)) + 1 / 3, abs=1e-8)
    np.testing.assert_allclose(out["disentanglement_per_code"], [1, 0, 0], atol=1e-8)


def test_importance_against_scipy_entropy():
    # an arbitrary matrix against an independent computation with scipy's entropy
    R = np.random.default_rng(0).random((5, 3)) ** 3
    out = dci_from_importance(torch.tensor(R))
    d = 1 - entropy(R.T, base=3)  # scipy normalises each column of its argument
    c = 1 - entropy(R, base=5)
    assert out["disentanglement"] == pytest.approx(float(d @ (R.sum(1) / R.sum())), abs=1e-8)
    assert out["completeness"] == pytest.approx(float(c @ (R.sum(0) / R.sum())), abs=1e-8)


def test_zero_importance_scores_zero():
    # no code predicts anything: every row and column is the uniform (eps) distribution, entropy 1
    out = dci_from_importance(np.zeros((4, 3)))
    assert out["disentanglement"] == pytest.approx(0.0, abs=1e-9)
    assert out["completeness"] == pytest.approx(0.0, abs=1e-9)


def test_importance_rejects_negative():
    with pytest.raises(ValueError, match="non-negative"):
        dci_from_importance(np.array([[1.0, -0.1]]))


# -- the gradient-boosted pipeline ---------------------------------------------------------------------------
def test_perfect_code_scores_one():
    out = run(perfect_code)
    # a code that is the factors: each classifier splits on its own code only, so R is diagonal
    # up to importances of order the 1e-11 offset
    assert out["disentanglement"] == pytest.approx(1.0, abs=1e-6)
    assert out["completeness"] == pytest.approx(1.0, abs=1e-6)
    assert out["informativeness_test_acc"] == 1.0 and out["informativeness_train_acc"] == 1.0
    R = out["importance"]
    assert R.shape == (3, 3)
    np.testing.assert_allclose(R, np.eye(3), atol=1e-6)  # feature_importances_ sum to 1 per factor


def test_duplicated_factor_has_analytic_completeness():
    # codes: f0, f0 (a second noisy copy), f1, f2 -> n_codes M = 4. Factor 0's importance is
    # split over two codes; with an exact 50/50 split its completeness is 1 - log 2 / log 4 = 1/2.
    # Which copy a tree splits on is a tie broken by the tree's random feature order, so the
    # split is p : 1-p with p near 1/2; p in [0.4, 0.6] moves 1 - H(p) / log 4 by at most 0.015.
    def code(f, seed):
        c = perfect_code(f, seed)
        return np.concatenate([c[:, :1], perfect_code(f[:, :1], seed + 10), c[:, 1:]], axis=1)

    out = run(code)
    R = out["importance"]
    p = R[0, 0] / R[:2, 0].sum()
    assert 0.4 < p < 0.6, p
    per_factor = dci_from_importance(R)["completeness_per_factor"]
    assert per_factor[0] == pytest.approx(1 - math.log(2) / math.log(4), abs=0.015)
    np.testing.assert_allclose(per_factor[1:], 1.0, atol=1e-6)
    # every code still speaks of one factor only
    assert out["disentanglement"] == pytest.approx(1.0, abs=1e-6)


def test_rotated_code_scores_much_lower():
    # a random rotation mixes every factor into every code: same information, no disentanglement
    Q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((3, 3)))

    def rotated(f, seed):
        return perfect_code(f, seed) @ Q.T

    perfect, mixed = run(perfect_code), run(rotated)
    assert mixed["disentanglement"] < 0.6 * perfect["disentanglement"]
    assert mixed["completeness"] < 0.6 * perfect["completeness"]


def test_reproducible_and_seeded():
    a, b = run(perfect_code, random_state=7), run(perfect_code, random_state=7)
    for k in ("disentanglement", "completeness", "informativeness_test_acc"):
        assert a[k] == b[k]
    np.testing.assert_array_equal(a["importance"], b["importance"])

    # and random_state reaches the trees: with two identical copies of a factor the tie between
    # them is broken by the trees' random feature order, so another seed gives another split
    def tied(f, seed):
        c = perfect_code(f, seed)
        return np.concatenate([c[:, :1], c], axis=1)

    assert not np.array_equal(run(tied, 0)["importance"], run(tied, 1)["importance"])


def test_threads_give_the_same_result():
    ftr, fte = grid_points(300, 1), grid_points(100, 2)
    ctr, cte = perfect_code(ftr, 3, noise=0.6), perfect_code(fte, 4, noise=0.6)  # overlapping levels
    one = dci(ctr, ftr, cte, fte, n_estimators=5, n_jobs=1)
    two = dci(ctr, ftr, cte, fte, n_estimators=5, n_jobs=2)
    np.testing.assert_array_equal(one["importance"], two["importance"])
    assert one["informativeness_test_acc"] == two["informativeness_test_acc"] < 1  # a non-trivial fit


def test_torch_inputs_and_bad_shapes():
    f = torch.from_numpy(grid_points(200, 0))
    c = torch.from_numpy(perfect_code(f.numpy(), 0)).float()
    out = dci(c[:150], f[:150], c[150:], f[150:], n_estimators=5)
    assert out["importance"].shape == (3, 3)
    with pytest.raises(ValueError, match="number of points"):
        dci(c[:150], f[:140], c[150:], f[150:])
    with pytest.raises(ValueError, match="integer level indices"):
        dci(c[:150], f[:150].float(), c[150:], f[150:])
    with pytest.raises(ValueError, match="n_estimators"):
        dci(c[:150], f[:150], c[150:], f[150:], n_estimators=0)


def test_metric_accumulates_like_the_function():
    ftr, fte = grid_points(300, 1), grid_points(150, 2)
    ctr, cte = perfect_code(ftr, 3) @ np.diag([1, 2, 3]), perfect_code(fte, 4) @ np.diag([1, 2, 3])
    m = DCIMetric(n_estimators=10)
    with pytest.raises(RuntimeError, match="training and test"):
        m.update(torch.tensor(ctr), torch.tensor(ftr))
        m.compute()
    m.reset()
    for i in range(0, 300, 64):  # uneven batches
        m.update(torch.tensor(ctr[i:i + 64]), torch.tensor(ftr[i:i + 64]))
    for i in range(0, 150, 64):
        m.update(torch.tensor(cte[i:i + 64]), torch.tensor(fte[i:i + 64]), split="test")
    got, want = m.compute(), dci(ctr, ftr, cte, fte, n_estimators=10)
    np.testing.assert_allclose(got["importance"], want["importance"], rtol=1e-6)  # float32 codes in the metric
    assert got["disentanglement"] == pytest.approx(want["disentanglement"], abs=1e-6)


def test_dci_on_grid_draws_train_then_test():
    calls = []

    def sample(n, g):
        f = torch.stack([torch.randint(0, s, (n,), generator=g) for s in SIZES], 1)
        calls.append(n)
        return f.float(), f  # "images" are the factors themselves

    setting = DCISetting(n_train=200, n_test=100, n_estimators=5)
    out = dci_on_grid(lambda x: x + 0.01, sample, setting, random_state=3)
    assert calls == [setting.n_train, setting.n_test]
    assert out["disentanglement"] == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="setting"):
        dci_on_grid(lambda x: x, sample, "medium")
