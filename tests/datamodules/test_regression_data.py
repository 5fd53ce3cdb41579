"""Regression tasks: check values of docs/theory.md#semantic-hierarchy and the statistics the theory relies on."""
from __future__ import annotations

import pytest
import torch

from datamodules import RankOne, SemanticHierarchy, WhitenedRegression
from datamodules.regression import hierarchy_targets


def test_hierarchy_singular_values_match_theory_md():
    # docs/theory.md#semantic-hierarchy check values, printed to 5 significant digits
    plain = torch.linalg.svdvals(hierarchy_targets(perturb=False) / 8)
    assert torch.allclose(plain, torch.tensor([0.35355] * 2 + [0.25] * 2 + [0.17678] * 4, dtype=plain.dtype), atol=1e-5)
    pert = torch.linalg.svdvals(hierarchy_targets(perturb=True) / 8)
    expected = torch.tensor([0.38891, 0.37123, 0.25833, 0.25625, 0.18031, 0.17972, 0.17930, 0.17899], dtype=pert.dtype)
    assert torch.allclose(pert, expected, atol=1e-5)


def test_hierarchy_datamodule_statistics_and_whitened_form():
    dm = SemanticHierarchy()
    assert torch.allclose(dm.sigma_x, torch.eye(8, dtype=torch.float64) / 8)
    m = dm.modes()
    assert m.c == pytest.approx(1 / 8)
    # whitened target sigma_yx / c = Y^T: its singular values are 8x the check values
    assert torch.allclose(m.s, 8 * torch.linalg.svdvals(hierarchy_targets(True) / 8).to(m.s), atol=1e-5)
    assert torch.allclose(m.U @ torch.diag(m.s) @ m.V.T, dm.sigma_yx / m.c, atol=1e-5)


def test_reversal_flips_one_mode_and_keeps_the_spectrum():
    Y, Yr = hierarchy_targets(True), hierarchy_targets(True, reverse_modes=[0])
    U, s, Vh = torch.linalg.svd(Y.T)
    Ur, sr, Vhr = torch.linalg.svd(Yr.T)
    assert torch.allclose(s, sr, atol=1e-10)
    # mode 0's left vector is reversed relative to its right vector; the others are unchanged
    assert torch.allclose(U[:, 0] @ Yr.T @ Vh[0], -s[0], atol=1e-10)
    assert torch.allclose(U[:, 1:].T @ Yr.T @ Vh[1:].T, torch.diag(s[1:]), atol=1e-10)
    with pytest.raises(ValueError, match="reverse_modes contains 9"):
        SemanticHierarchy(reverse_modes=[9])


def test_whitened_regression_has_identity_input_covariance():
    dm = WhitenedRegression(n_in=6, n_out=3, num_samples=50, seed=1)
    assert torch.allclose(dm.sigma_x, torch.eye(6, dtype=torch.float64), atol=1e-5)
    assert dm.Y.shape == (50, 3)
    # deterministic from the seed; another seed differs
    assert torch.equal(dm.X, WhitenedRegression(n_in=6, n_out=3, num_samples=50, seed=1).X)
    assert not torch.equal(dm.X, WhitenedRegression(n_in=6, n_out=3, num_samples=50, seed=2).X)
    with pytest.raises(ValueError, match="num_samples = 4 must be >= n_in = 6"):
        WhitenedRegression(n_in=6, num_samples=4)


def test_rank_one_task_has_the_chosen_s_and_d():
    dm = RankOne(n_in=5, n_out=3, s=2.0, d=0.5, num_samples=40)
    assert torch.allclose(dm.sigma_x, 0.5 * torch.eye(5, dtype=torch.float64), atol=1e-5)
    sv = torch.linalg.svdvals(dm.sigma_yx)
    assert sv[0].item() == pytest.approx(2.0, rel=1e-5) and sv[1:].abs().max() < 1e-5
    assert dm.modes().s[0].item() == pytest.approx(2.0 / 0.5, rel=1e-5)


def test_full_batch_and_minibatch_loaders():
    dm = SemanticHierarchy(batches_per_epoch=7)
    batches = list(dm.train_dataloader())
    assert len(batches) == 7 and all(torch.equal(b[0], dm.X) for b in batches)
    dm = WhitenedRegression(num_samples=20, batch_size=8)
    assert [b[0].shape[0] for b in dm.train_dataloader()] == [8, 8, 4]
    with pytest.raises(ValueError, match="batch_size = 0"):
        WhitenedRegression(batch_size=0)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_validation_and_test_evaluate_on_the_task_itself_in_one_batch(batch_size):
    dm = RankOne(n_in=3, n_out=2, num_samples=10, batch_size=batch_size)
    for loader in (dm.val_dataloader(), dm.test_dataloader()):
        batches = list(loader)
        assert len(batches) == 1 and torch.equal(batches[0][0], dm.X) and torch.equal(batches[0][1], dm.Y)


def test_an_epoch_dealt_out_to_ranks_covers_it_evenly_and_resumes_per_rank():
    from datamodules.regression import EpochShuffle, ShardedEpochShuffle

    one = EpochShuffle(10, seed=3)
    one.set_epoch(2)
    order = list(one)
    assert sorted(order) == list(range(10)) and order == one.order()  # one process: the whole permutation
    ranks = [ShardedEpochShuffle(10, seed=3, num_replicas=4, rank=r) for r in range(4)]
    for s in ranks:
        s.set_epoch(2)
    parts = [list(s) for s in ranks]
    assert [len(p) for p in parts] == [len(s) for s in ranks] == [3] * 4  # ceil(10 / 4) each: as many batches
    # rank r holds positions r, r + 4, ... of the same permutation, padded with its first two entries
    assert [p[k] for k in range(3) for p in parts] == order + order[:2]
    assert sorted(sum(parts, [])) == sorted(order + order[:2])
    # with batch size 1 a step of the four ranks is one contiguous stretch of four positions
    assert [{p[1] for p in parts}] == [set(order[4:8])]
    # a resumed pass leaves out this rank's own first samples, the next pass is whole again
    ranks[1].skip = 2
    assert list(ranks[1]) == parts[1][2:] and list(ranks[1]) == parts[1]
    with pytest.raises(ValueError, match="rank = 4, num_replicas = 4"):
        ShardedEpochShuffle(10, seed=3, num_replicas=4, rank=4)


def test_str_of_a_full_batch_task_names_its_data_without_its_loaders():
    """Lightning 2.6's LightningDataModule.__str__ reads torch DataLoaders only; these tasks serve a
    plain iterable (RepeatedBatch), and jsonargparse puts a datamodule's str in its messages."""
    from datamodules.contexts import Contexts

    assert str(SemanticHierarchy()) == "SemanticHierarchy: 8 points, 8 inputs, 8 outputs"
    assert str(Contexts(3, "different")) == "Contexts: 24 points, 11 inputs, 60 outputs"
    dm = SemanticHierarchy(batches_per_epoch=3)
    batches = list(dm.train_dataloader())
    assert len(dm.train_dataloader()) == 3 and all(x is dm.X and y is dm.Y for x, y in batches)
