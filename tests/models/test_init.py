"""The init registry: every scheme's defining property, and its errors."""
from __future__ import annotations

import math

import pytest
import torch

import zoo.init as zi


def test_registry_holds_every_scheme_of_the_papers():
    expected = {"lambda_balanced", "polar", "gain", "imbalance", "entropy_mix", "gaussian", "xavier", "kaiming"}
    assert expected <= set(zi.REGISTRY)
    for name in expected:
        assert zi.build(name).name == name


def test_build_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown init scheme 'nope'.*lambda_balanced"):
        zi.build("nope")


def test_register_a_user_scheme_and_duplicates_raise():
    @zi.register("test_constant_scheme")
    class Constant(zi.InitScheme):
        def __init__(self, value: float = 0.5) -> None:
            super().__init__()
            self._member("value", value, allowed="any", ok=lambda v: True)

        def _draw(self, shapes, E, generator):
            return [torch.full((E, *s), self.params["value"][0], dtype=torch.float64) for s in shapes]

    try:
        (w,) = zi.build("test_constant_scheme", value=2.0).weights([(3, 4)], ensemble=2)
        assert w.shape == (2, 3, 4) and torch.all(w == 2.0)
        with pytest.raises(ValueError, match="already registered"):
            zi.register("test_constant_scheme")(Constant)
    finally:
        zi.REGISTRY.pop("test_constant_scheme")


@pytest.mark.parametrize("lam", [-3.0, -0.5, 0.0, 0.7, 4.0])
@pytest.mark.parametrize("dims", [(5, 3, 4), (6, 6, 6), (4, 2, 7)])
def test_lambda_balanced_balance_and_product(lam, dims):
    n_in, n_h, n_out = dims
    scheme = zi.build("lambda_balanced", lam=lam, scale=0.3)
    W1, W2 = scheme.weights([(n_h, n_in), (n_out, n_h)], ensemble=3, dtype=torch.float64,
                            generator=torch.Generator().manual_seed(1))
    # the defining property, to 1e-6 in float64 (the construction is exact up to round-off)
    B = W2.mT @ W2 - W1 @ W1.mT
    assert torch.allclose(B, lam * torch.eye(n_h, dtype=torch.float64).expand_as(B), atol=1e-6)
    # a requested product of rank <= n_h is kept exactly
    A = torch.randn(3, n_out, n_h, dtype=torch.float64) @ torch.randn(3, n_h, n_in, dtype=torch.float64)
    V1, V2 = scheme.factor(A, [(n_h, n_in), (n_out, n_h)])
    assert torch.allclose(V2 @ V1, A, atol=1e-9)
    B = V2.mT @ V2 - V1 @ V1.mT
    assert torch.allclose(B, lam * torch.eye(n_h, dtype=torch.float64).expand_as(B), atol=1e-6)


def test_lambda_balanced_deep_chain_is_pairwise_balanced():
    lam = torch.tensor([-1.0, 0.0, 2.0])
    scheme = zi.LambdaBalanced(lam=lam.tolist(), scale=0.5)
    A = torch.randn(3, 4, 5, dtype=torch.float64)
    Ws = scheme.factor(A, [(4, 5), (4, 4), (4, 4), (4, 4)])
    M = Ws[0]
    for W in Ws[1:]:
        M = W @ M
    assert torch.allclose(M, A, atol=1e-9)
    for Wa, Wb in zip(Ws[:-1], Ws[1:]):
        B = Wb.mT @ Wb - Wa @ Wa.mT
        assert torch.allclose(B, lam[:, None, None] * torch.eye(4, dtype=torch.float64), atol=1e-8)


def test_lambda_balanced_per_member_lam_and_sign_conventions():
    scheme = zi.LambdaBalanced(lam=[-4.0, 4.0], scale=1e-3)
    W1, W2 = scheme.weights([(3, 3), (3, 3)], ensemble=2, dtype=torch.float64)
    # lam > 0 puts the scale in the readout, lam < 0 in the input layer
    assert W1[0].norm() > 10 * W2[0].norm() and W2[1].norm() > 10 * W1[1].norm()
    assert scheme.labels(2) == ["lam=-4", "lam=4"]


def test_lambda_balanced_wide_hidden_layer_is_impossible():
    with pytest.raises(ValueError, match=r"lambda_balanced.*n_h <= min\(n_in, n_out\) = 4, got n_h = 6"):
        zi.build("lambda_balanced", lam=1.0).weights([(6, 4), (5, 6)])
    # lam = 0 is possible (extra hidden units start at zero, balanced)
    W1, W2 = zi.build("lambda_balanced", lam=0.0).weights([(6, 4), (5, 6)], dtype=torch.float64)
    assert torch.allclose(W2.mT @ W2, W1 @ W1.mT, atol=1e-12)


def test_polar_is_exactly_r_cos_r_sin():
    (h,) = zi.build("polar", r=[1.0, 2.0], theta=[0.0, math.pi / 8]).weights([(1, 2)], ensemble=2, dtype=torch.float64)
    expected = torch.tensor([[[1.0, 0.0]], [[2 * math.cos(math.pi / 8), 2 * math.sin(math.pi / 8)]]], dtype=torch.float64)
    assert torch.equal(h, expected)


def test_polar_needs_a_two_wide_readout():
    with pytest.raises(ValueError, match=r"polar.*\(1, 2\).*p = 2"):
        zi.build("polar").weights([(1, 3)])


def test_gain_bounds_body_g_and_readout_one_over_g():
    g = 2.5
    shapes = [(400, 300), (300, 400), (10, 300)]
    Ws = zi.build("gain", g=g).weights(shapes, dtype=torch.float64)
    for W, (fo, fi), k in zip(Ws, shapes, [g, g, 1 / g]):
        bound = k * math.sqrt(6 / (fi + fo))
        assert W.abs().max() <= bound
        # uniform on [-bound, bound]: the extremes are reached to within a few per cent
        assert W.abs().max() > 0.97 * bound
        # variance of U(-a, a) is a^2/3; 120k samples give ~0.5% relative error, allow 3%
        if W.numel() > 10_000:
            assert abs(W.var().item() / (bound**2 / 3) - 1) < 0.03


def test_imbalance_std_ratio_is_v_squared():
    v, sigma = 3.0, 1e-3
    W1, W2 = zi.build("imbalance", v=v, sigma=sigma).weights([(500, 400), (400, 500)], dtype=torch.float64)
    # 2e5 Gaussian draws per layer: std estimates within ~0.2%; allow 2%
    assert abs(W1.std().item() / (sigma / v) - 1) < 0.02
    assert abs(W2.std().item() / (sigma * v) - 1) < 0.02
    assert abs(W2.std().item() / W1.std().item() / v**2 - 1) < 0.03


def _normalised_entropy(w: torch.Tensor) -> float:
    """H of |w_i| / sum |w_j| ([S] Eq. 10's H_h applied to a weight sample)."""
    p = w.abs().flatten() / w.abs().sum()
    return float(-torch.special.xlogy(p, p).sum())  # 0 log 0 = 0: the sparse base has exact zeros


@pytest.mark.parametrize("base", ["normal", "laplace", "sparse", "units"])
def test_entropy_mix_keeps_variance_and_moves_entropy(base):
    sigma, n = 0.1, (1, 200_000)
    extra = {"density": 0.2} if base in ("sparse", "units") else {}
    entropies = []
    for gamma in [0.0, 0.25, 0.5, 0.75, 1.0]:
        (w,) = zi.build("entropy_mix", gamma=gamma, sigma=sigma, base=base, **extra).weights(
            [n], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        if base == "sparse" and gamma == 0.0:
            assert abs((w != 0).double().mean().item() - 0.2) < 0.005  # exact zeros elsewhere
        if base == "units" and gamma == 0.0:  # the first 20% of the units, exact zeros elsewhere
            assert bool((w[..., :40_000] != 0).all()) and not bool(w[..., 40_000:].any())
        # 2e5 draws: variance estimate within ~1% (heavier for Laplace); allow 3%
        assert abs(w.var().item() / sigma**2 - 1) < 0.03
        entropies.append(_normalised_entropy(w))
    # from the base's entropy (gamma=0) monotonically up to the uniform's (gamma=1)
    assert all(a < b for a, b in zip(entropies[:-1], entropies[1:])), entropies
    # reference values from independent unit-variance draws of the two ends
    g = torch.Generator().manual_seed(4)
    u = (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1) * math.sqrt(3)
    if base == "normal":
        z = torch.randn(n, generator=g, dtype=torch.float64)
    elif base == "laplace":
        z = torch.distributions.Laplace(0.0, 1 / math.sqrt(2)).sample(n).double()
    elif base == "sparse":
        z = torch.randn(n, generator=g, dtype=torch.float64) * (torch.rand(n, generator=g, dtype=torch.float64) < 0.2) / math.sqrt(0.2)
    else:
        z = torch.randn(n, generator=g, dtype=torch.float64) * (torch.arange(n[1]) < 40_000) / math.sqrt(0.2)
    assert abs(entropies[-1] - _normalised_entropy(u)) < 2e-3
    assert abs(entropies[0] - _normalised_entropy(z)) < 5e-3


def test_entropy_mix_units_base_concentrates_every_head_on_the_same_units():
    """[S] Eq. 10's H_h is over units: at gamma = 0 a (classes, hidden) head has ceil(density n)
    non-zero columns, the same ones for every member and seed (theta = 0 of the polar readout puts
    every head on one unit); its unit entropy is log m, the uniform head's about log n."""
    scheme = zi.build("entropy_mix", gamma=[0.0, 0.0, 1.0], sigma=0.1, base="units", density=1 / 16)
    (a,) = scheme.weights([(5, 128)], ensemble=3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (b,) = scheme.weights([(5, 128)], ensemble=3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for w in (a, b):
        support = w[:2].abs().sum(-2) > 0  # (members, units)
        assert support[:, :8].all() and not support[:, 8:].any()
    unit_norms = a.abs().sum(-2)  # |h_i| summed over classes
    H = [-(p * p.log()).nan_to_num().sum().item() for p in unit_norms / unit_norms.sum(-1, keepdim=True)]
    assert H[0] < math.log(8) + 1e-9 and H[2] > math.log(128) - 0.2


def test_gaussian_xavier_kaiming_statistics():
    (w,) = zi.build("gaussian", sigma=0.2).weights([(300, 300)], dtype=torch.float64)
    assert abs(w.std().item() / 0.2 - 1) < 0.02
    (w,) = zi.build("xavier", gain=1.0).weights([(300, 100)], dtype=torch.float64)
    assert w.abs().max() <= math.sqrt(6 / 400)
    (w,) = zi.build("kaiming").weights([(300, 200)], dtype=torch.float64)
    assert abs(w.std().item() / math.sqrt(2 / 200) - 1) < 0.03


@pytest.mark.parametrize(
    "name, params, pattern",
    [
        ("lambda_balanced", {"scale": -1.0}, "lambda_balanced: parameter 'scale' = -1.0 is out of range; allowed: a positive"),
        ("polar", {"r": -0.5}, "polar: parameter 'r' = -0.5 is out of range; allowed: r >= 0"),
        ("gain", {"g": 0.0}, "gain: parameter 'g' = 0.0 is out of range; allowed: g > 0"),
        ("imbalance", {"v": -2.0}, "imbalance: parameter 'v' = -2.0"),
        ("entropy_mix", {"gamma": 1.5}, "entropy_mix: parameter 'gamma' = 1.5 is out of range; allowed: 0 <= gamma <= 1"),
        ("entropy_mix", {"base": "cauchy"}, "entropy_mix: parameter 'base' = 'cauchy'"),
        ("entropy_mix", {"base": "sparse", "density": 0.0}, "entropy_mix: parameter 'density' = 0.0; allowed: 0 < density <= 1"),
        ("gaussian", {"sigma": -0.1}, "gaussian: parameter 'sigma' = -0.1"),
        ("lambda_balanced", {"lam": float("nan")}, "lambda_balanced: parameter 'lam' = nan"),
    ],
)
def test_out_of_range_parameters_name_scheme_parameter_and_range(name, params, pattern):
    with pytest.raises(ValueError, match=pattern.replace("(", r"\(").replace(")", r"\)")):
        zi.build(name, **params)


def test_list_parameters_make_an_ensemble_and_must_agree():
    s = zi.build("polar", r=[1.0, 2.0, 3.0], theta=0.1)
    assert s.ensemble_size == 3
    with pytest.raises(ValueError, match="equal lengths"):
        zi.build("polar", r=[1.0, 2.0], theta=[0.0, 0.1, 0.2]).weights([(1, 2)], ensemble=3)
