"""zoo.analysis.forgetting (the error matrix, forgetting and transfer, the one profile-shape test,
profiles grouped by member parameters) and the legend formatter of zoo.plots, on hand-computed cases."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from zoo.analysis.forgetting import error_matrix, errors_to_kept, forgetting_transfer, profile_shape, profiles
from zoo.plots.teacher_student import angle_text, pretty


def test_error_matrix_and_forgetting_and_transfer_by_hand():
    # two members, three tasks; errors at the end of task 1 and of task 2
    end1 = torch.tensor([[0.1, 0.5, 0.6], [0.2, 0.4, 0.7]])
    end2 = torch.tensor([[0.3, 0.05, 0.5], [0.2, 0.1, 0.6]])
    M = error_matrix([end1, end2])
    assert M.shape == (2, 2, 3) and M.dtype == torch.float64
    assert float(M[1, 0, 2]) == pytest.approx(0.7) and float(M[0, 1, 1]) == pytest.approx(0.05)
    now = torch.tensor([[0.4, 0.25, 0.2], [0.2, 0.3, 0.1]], dtype=torch.float64)
    F, T = forgetting_transfer(M, now)
    # forgetting of task i: now - at the end of task i; transfer to task 3: at its start - now
    assert torch.allclose(F, torch.tensor([[0.4 - 0.1, 0.25 - 0.05], [0.0, 0.3 - 0.1]], dtype=torch.float64))
    assert torch.allclose(T, torch.tensor([0.5 - 0.2, 0.6 - 0.1], dtype=torch.float64))
    # after the last task there is no task to transfer to
    F, T = forgetting_transfer(error_matrix([end1, end2, now]), now)
    assert torch.isnan(T).all() and F.shape == (2, 3) and float(F[0, 2]) == 0.0
    with pytest.raises(ValueError, match="no task has ended"):
        error_matrix([])
    with pytest.raises(ValueError, match="at most n_tasks"):
        error_matrix([end1[:, :1], end1[:, :1]])


def test_profile_shape_tells_maslows_hammer_from_monotonic():
    g = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    # docs/theory.md#maslow: reference ODE numbers for a specialised student with a small second head on the idle unit
    hammer = profile_shape(g, [0.09, 0.28, 0.23, 0.16, 0.09, 0.003])
    assert hammer == {"peak": 0.2, "monotonic": False, "maslow": True, "flat": False, "kind": "maslow"}
    mono = profile_shape(g, [0.375, 0.302, 0.229, 0.155, 0.079, 0.001])
    assert mono == {"peak": 0.0, "monotonic": True, "maslow": False, "flat": False, "kind": "monotonic"}
    flat = profile_shape(g, [0.0, 0.001, 0.002, 0.004, 0.005, 0.003])  # a large head on the idle unit
    assert flat["flat"] and flat["monotonic"] and not flat["maslow"] and flat["kind"] == "flat"
    # a wiggle below tol is flat; above it, it is a rise
    assert profile_shape(g, [0.3, 0.305, 0.2, 0.1, 0.05, 0.0])["monotonic"]
    assert not profile_shape(g, [0.3, 0.305, 0.2, 0.1, 0.05, 0.0], tol=0.001)["monotonic"]
    # order of the input does not matter; a profile that rises to the last gamma is neither
    assert profile_shape(g[::-1], [0.003, 0.09, 0.16, 0.23, 0.28, 0.09])["maslow"]
    rising = profile_shape(g, [0.0, 0.01, 0.03, 0.05, 0.08, 0.1])
    assert rising["kind"] == "other" and rising["peak"] == 1.0
    with pytest.raises(ValueError, match="profile_shape"):
        profile_shape([0.0], [0.1])


def test_a_shape_must_stand_out_of_the_noise_of_paired_runs():
    x = [0, 1, 2, 3]
    # a hammer in every run (seeds 0..3) on top of a level that differs between runs (their digits)
    level = np.array([0.0, 0.1, 0.2, 0.3])[None, :]
    runs = np.array([0.01, 0.05, 0.03, 0.0])[:, None] + level + np.array([[0, 0.002, -0.002, 0]]).T
    s = profile_shape(x, runs.mean(1), tol=0.005, runs=runs)
    # paired differences k=1 - k=0: 0.04 +- 0.001 per run: far beyond two standard errors
    assert s["maslow"] and s["peak"] == 1 and not s["monotonic"]
    # the same means with runs that disagree about the bump: within the noise, flat but not monotonic
    # (the mean rises by 0.04 > tol: failing to prove a bump is not proving its absence)
    noisy = runs.mean(1)[:, None] + 0.1 * np.array([[1, -1, 1, -1], [-1, 1, 1, -1], [1, 1, -1, -1], [-1, 1, -1, 1]])
    s = profile_shape(x, noisy.mean(1), tol=0.005, runs=noisy)
    assert not s["maslow"] and not s["monotonic"] and s["flat"] and s["kind"] == "flat"
    # one run: the tolerance alone decides, as for a deterministic profile
    assert profile_shape(x, runs[:, 0], tol=0.005, runs=runs[:, :1])["maslow"]


def test_profiles_group_members_by_their_parameters_and_average_the_runs():
    params = [{"gamma": g, "seed": s, "k": k} for g in (0, 1) for s in (0, 1, 2) for k in (0, 5)]
    values = np.arange(len(params), dtype=float) ** 2
    prof = profiles(values, params, over="k")
    assert list(prof) == ["gamma=0", "gamma=1"] and prof["gamma=0"]["params"] == {"gamma": 0}
    p = prof["gamma=0"]
    np.testing.assert_allclose(p["x"], [0, 5])
    # gamma=0, k=0: members 0, 2, 4 -> values 0, 4, 16
    np.testing.assert_allclose(p["mean"][0], 20 / 3)
    np.testing.assert_allclose(p["std"][0], np.std([0, 4, 16], ddof=1))
    np.testing.assert_allclose(prof["gamma=1"]["mean"][1], (49 + 81 + 121) / 3)  # members 7, 9, 11
    np.testing.assert_allclose(p["runs"], [[0, 4, 16], [1, 9, 25]])  # each seed's value at every k
    # nothing left after the axis and the repeats: one group; an unpaired set of runs has no "runs"
    assert profiles([1.0, 2.0, 3.0], [{"seed": 0, "k": 0}, {"seed": 1, "k": 0}, {"seed": 0, "k": 1}], "k")["all"]["runs"] is None
    with pytest.raises(ValueError, match="no parameter 'k'"):
        profiles([1.0], [{"gamma": 0}], "k")


def test_pretty_angles_come_from_the_numbers():
    assert [angle_text(k * math.pi / 16) for k in (0, 1, 4, 8, 12, 16)] == ["0", "pi/16", "pi/4", "pi/2", "3pi/4", "pi"]
    assert angle_text(math.pi / 24) == "pi/24"
    assert angle_text(0.3927) == "0.3927"  # a rounded number is not pi/8: no tolerance, nothing parsed
    assert angle_text(0.3) == "0.3"
    assert pretty({"theta": math.pi / 4, "r2": 0.01, "theta2": math.pi / 2}) == "theta=pi/4, r2=0.01, theta2=pi/2"
    assert pretty({}) == "all members"


def test_errors_to_kept_counts_errors_on_dropped_digits_that_go_to_kept_labels():
    task1, task2 = [3, 7, 1, 0, 9], [3, 7, 5, 6, 8]  # digits 3 and 7 (labels 0, 1) kept
    target = torch.tensor([0, 1, 2, 2, 3, 4, 4, 2])
    pred = torch.tensor([1, 1, 0, 2, 1, 3, 0, 4])
    # errors on dropped digits (labels 2, 3, 4): items 2 (->0), 4 (->1), 5 (->3), 6 (->0), 7 (->4);
    # item 0 is an error on a kept digit and does not count; 3 of the 5 go to labels 0 or 1
    assert errors_to_kept(pred, target, task1, task2) == 3 / 5
    assert math.isnan(errors_to_kept(target, target, task1, task2))  # no errors
    assert errors_to_kept(pred, target, task1, [5, 6, 8, 2, 4]) == 0.0  # nothing kept
