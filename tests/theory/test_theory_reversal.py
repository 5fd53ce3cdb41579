"""Reversed modes ([L] App. D.2): a negative initial strength under [L] Thm. 5.1's dynamics."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp

from zoo.theory.linear import aligned_singular_value


@pytest.mark.parametrize("lam", [0.0, 0.3, -2.0])
@pytest.mark.parametrize("a0", [-1.0, -1e-2, 0.0])
def test_reversed_modes_follow_the_ode(lam, a0):
    s, tau = 1.5, 2.0
    sol = solve_ivp(lambda t, a: np.sqrt(lam**2 + 4 * a**2) * (s - a) / tau, (0, 20), [a0],
                    rtol=1e-12, atol=1e-14, dense_output=True)
    ts = np.linspace(0, 20, 41)
    pred = aligned_singular_value(torch.tensor(ts), lam=lam, s=s, tau=tau, a0=a0).numpy()
    assert np.abs(pred - sol.sol(ts)[0]).max() < 1e-6  # the acceptance tolerance of issue 3


def test_lam_zero_stalls_at_the_saddle_and_lam_nonzero_escapes():
    t = torch.tensor([50.0])
    stalled = aligned_singular_value(t, lam=0.0, s=1.0, a0=-1.0)
    escaped = aligned_singular_value(t, lam=0.5, s=1.0, a0=-1.0)
    assert -1e-20 < stalled.item() <= 0.0
    assert escaped.item() == pytest.approx(1.0, abs=1e-6)
