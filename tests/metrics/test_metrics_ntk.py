"""zoo.metrics.ntk: empirical NTK (two methods), closed-form linear NTK, kernel distance.

Tolerances: everything runs in float64 (unit roundoff 1.1e-16) on kernels whose entries are
O(1)-O(10) and that are sums of at most a few hundred products, so two exact computations of
the same kernel agree to ~1e-14; the tolerances below (1e-10 absolute on O(1) entries) leave
four orders of magnitude of headroom for summation order while still failing on any real
formula error (those are O(1e-2) or larger).
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from zoo.metrics.ntk import empirical_ntk, kernel_distance, linear_ntk

# torch's jvp decompositions call the deprecated torch.jit.script once on first use (torch internals)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")

TOL = dict(rtol=1e-10, atol=1e-10)
DT = torch.float64


class Normalised(nn.Module):
    """An MLP with a nonlinearity, a buffer used in forward, and a frozen parameter."""

    def __init__(self, n_in: int = 3, n_h: int = 6, n_out: int = 2) -> None:
        super().__init__()
        self.register_buffer("shift", torch.linspace(-0.5, 0.5, n_in))
        self.fc1 = nn.Linear(n_in, n_h)
        self.fc2 = nn.Linear(n_h, n_out)
        self.frozen_scale = nn.Parameter(torch.tensor(1.7), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frozen_scale * self.fc2(torch.tanh(self.fc1(x - self.shift)))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return Normalised().to(DT)


def deep_mlp() -> nn.Module:
    """Three layers: unlike a two-layer net, its O x O blocks K(x_i, x_j) are not symmetric for
    i != j, so a swap of the output indices a <-> b would show."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4), nn.Softplus(), nn.Linear(4, 2)).to(DT)


def two_layer_linear(n_in: int = 4, n_h: int = 3, n_out: int = 2, seed: int = 1) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, n_h, bias=False), nn.Linear(n_h, n_out, bias=False)).to(DT)


def loop_jacobian(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(N*O, P) Jacobian, sample-major rows, one torch.autograd.grad call per scalar output."""
    ps = [p for p in model.parameters() if p.requires_grad]
    out = model(x).reshape(x.shape[0], -1)
    rows = []
    for i in range(out.shape[0]):
        for a in range(out.shape[1]):
            grads = torch.autograd.grad(out[i, a], ps, retain_graph=True)
            rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows)


def to_output_major(K: torch.Tensor, N: int, O: int) -> torch.Tensor:
    """Permute a sample-major (i*O + a) kernel to output-major (a*N + i)."""
    perm = torch.arange(N * O).reshape(N, O).T.reshape(-1)  # output-major position -> sample-major index
    return K[perm][:, perm]


@pytest.mark.parametrize("layout", ["sample_major", "output_major"])
@pytest.mark.parametrize("make", [mlp, deep_mlp, two_layer_linear], ids=["mlp_tanh", "deep_mlp", "linear"])
def test_methods_agree(make, layout):
    model = make()
    n_in = 4 if make is two_layer_linear else 3
    x = torch.randn(5, n_in, generator=torch.Generator().manual_seed(2), dtype=DT)
    Kj = empirical_ntk(model, x, method="jacobian", layout=layout)
    Kv = empirical_ntk(model, x, method="ntk_vp", layout=layout)
    assert Kj.shape == (10, 10)
    assert Kj.abs().max() > 1e-2  # not trivially zero
    torch.testing.assert_close(Kj, Kv, **TOL)
    for reduce in ("trace", "sum"):
        torch.testing.assert_close(
            empirical_ntk(model, x, method="jacobian", reduce=reduce),
            empirical_ntk(model, x, method="ntk_vp", reduce=reduce),
            **TOL,
        )


def test_matches_independent_loop_jacobian_and_excludes_frozen():
    """K = J J^T with J from a plain autograd loop: checks the layout, the buffer and that the
    frozen parameter (which enters the output) contributes no gradient direction."""
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(3), dtype=DT)
    deep = deep_mlp()
    J = loop_jacobian(deep, x)
    for method in ("jacobian", "ntk_vp"):
        torch.testing.assert_close(empirical_ntk(deep, x, method=method), J @ J.T, **TOL)
    model = mlp()
    J = loop_jacobian(model, x)
    K_ref = J @ J.T  # sample-major
    assert J.shape[1] == sum(p.numel() for p in model.parameters()) - 1  # frozen scalar excluded
    for method in ("jacobian", "ntk_vp"):
        torch.testing.assert_close(empirical_ntk(model, x, method=method), K_ref, **TOL)
        torch.testing.assert_close(
            empirical_ntk(model, x, method=method, layout="output_major"), to_output_major(K_ref, 4, 2), **TOL
        )
    # the buffer is really used: a different shift changes the kernel
    K_shift = empirical_ntk(model, x, params={"shift": torch.zeros(3, dtype=DT)})
    assert (K_shift - K_ref).abs().max() > 1e-3


@pytest.mark.parametrize("layout", ["sample_major", "output_major"])
def test_empirical_equals_linear_closed_form(layout):
    model = two_layer_linear(n_in=4, n_h=3, n_out=2)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(4), dtype=DT)
    W1, W2 = model[0].weight.detach(), model[1].weight.detach()
    K_closed = linear_ntk(W1, W2, x, layout=layout)
    assert K_closed.shape == (12, 12)
    for method in ("jacobian", "ntk_vp"):
        torch.testing.assert_close(empirical_ntk(model, x, method=method, layout=layout), K_closed, **TOL)
    for reduce in ("trace", "sum"):
        torch.testing.assert_close(empirical_ntk(model, x, reduce=reduce), linear_ntk(W1, W2, x, reduce=reduce), **TOL)


def test_output_major_is_braun_kronecker_form():
    """Output-major layout is literally I_out (x) X^T W1^T W1 X + W2 W2^T (x) X^T X (columns = samples)."""
    g = torch.Generator().manual_seed(5)
    W1, W2 = torch.randn(3, 4, generator=g, dtype=DT), torch.randn(2, 3, generator=g, dtype=DT)
    Xc = torch.randn(4, 5, generator=g, dtype=DT)  # (n_in, N): Braun's column convention
    K = torch.kron(torch.eye(2, dtype=DT), Xc.T @ W1.T @ W1 @ Xc) + torch.kron(W2 @ W2.T, Xc.T @ Xc)
    torch.testing.assert_close(linear_ntk(W1, W2, Xc.T, layout="output_major"), K, **TOL)
    # sample-major is the same kernel under the permutation a*N + i <-> i*O + a
    torch.testing.assert_close(to_output_major(linear_ntk(W1, W2, Xc.T), 5, 2), K, **TOL)


def test_linear_ntk_batched_over_ensemble():
    g = torch.Generator().manual_seed(6)
    E, n_in, n_h, n_out, N = 3, 4, 3, 2, 5
    W1 = torch.randn(E, n_h, n_in, generator=g, dtype=DT)
    W2 = torch.randn(E, n_out, n_h, generator=g, dtype=DT)
    X = torch.randn(N, n_in, generator=g, dtype=DT)
    K = linear_ntk(W1, W2, X, layout="output_major")
    assert K.shape == (E, N * n_out, N * n_out)
    for e in range(E):
        model = two_layer_linear(n_in, n_h, n_out)
        with torch.no_grad():
            model[0].weight.copy_(W1[e])
            model[1].weight.copy_(W2[e])
        torch.testing.assert_close(K[e], empirical_ntk(model, X, layout="output_major"), **TOL)


@pytest.mark.parametrize("method", ["jacobian", "ntk_vp"])
def test_symmetric_psd_and_trace_is_sum_of_squared_gradients(method):
    model = mlp()
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(7), dtype=DT)
    K = empirical_ntk(model, x, method=method)
    torch.testing.assert_close(K, K.T, **TOL)
    evals = torch.linalg.eigvalsh(K)
    # K = J J^T is PSD; rank <= min(N*O, P) = 12 here, roundoff can make zero modes ~ -1e-15 * |K|
    assert evals.min() > -1e-10 * evals.max()
    # independent: sum over samples and outputs of |d f_a(x_i) / d theta|^2, one autograd call each
    ps = [p for p in model.parameters() if p.requires_grad]
    total = torch.zeros((), dtype=DT)
    out = model(x)
    for i in range(x.shape[0]):
        for a in range(out.shape[1]):
            grads = torch.autograd.grad(out[i, a], ps, retain_graph=True)
            total = total + sum((g**2).sum() for g in grads)
    torch.testing.assert_close(torch.trace(K), total.detach(), **TOL)


def test_scalar_output_and_summed_output():
    """(N,) outputs are O = 1; reduce='sum' is the NTK of the summed output; 'trace' sums diagonal blocks."""
    model = mlp()
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(8), dtype=DT)

    class Summed(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).sum(-1)  # (N,)

    summed = Summed(model)
    for method in ("jacobian", "ntk_vp"):
        K_scalar = empirical_ntk(summed, x, method=method)
        assert K_scalar.shape == (5, 5)
        torch.testing.assert_close(empirical_ntk(model, x, method=method, reduce="sum"), K_scalar, **TOL)
    K4 = empirical_ntk(model, x).reshape(5, 2, 5, 2)
    torch.testing.assert_close(empirical_ntk(model, x, reduce="trace"), K4[:, 0, :, 0] + K4[:, 1, :, 1], **TOL)


@pytest.mark.parametrize("method", ["jacobian", "ntk_vp"])
def test_cross_kernel_is_off_diagonal_block(method):
    model = deep_mlp()
    g = torch.Generator().manual_seed(9)
    xa, xb = torch.randn(3, 3, generator=g, dtype=DT), torch.randn(4, 3, generator=g, dtype=DT)
    K_all = empirical_ntk(model, torch.cat([xa, xb]), method=method)  # sample-major: rows of xa first
    K_ab = empirical_ntk(model, xa, x2=xb, method=method)
    assert K_ab.shape == (6, 8)
    torch.testing.assert_close(K_ab, K_all[:6, 6:], **TOL)
    for reduce in ("trace", "sum"):  # (N1, N2) blocks of the reduced kernels
        K_red = empirical_ntk(model, torch.cat([xa, xb]), method=method, reduce=reduce)
        torch.testing.assert_close(empirical_ntk(model, xa, x2=xb, method=method, reduce=reduce), K_red[:3, 3:], **TOL)


def test_params_override_evaluates_elsewhere():
    model = mlp()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(10), dtype=DT)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5).add_(0.1)
    params = {n: p.detach().clone() for n, p in other.named_parameters()}
    K_other = empirical_ntk(other, x)
    for method in ("jacobian", "ntk_vp"):
        torch.testing.assert_close(empirical_ntk(model, x, params=params, method=method), K_other, **TOL)
    assert (K_other - empirical_ntk(model, x)).abs().max() > 1e-2
    with pytest.raises(KeyError, match="neither parameters nor buffers"):
        empirical_ntk(model, x, params={"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="method"):
        empirical_ntk(model, x, method="finite_differences")  # type: ignore[arg-type]


def test_kernel_distance_values():
    g = torch.Generator().manual_seed(11)
    J = torch.randn(6, 4, generator=g, dtype=DT)
    K = J @ J.T
    # identical kernels and a positive rescaling: distance 0 up to roundoff (cosine of a vector
    # with itself, computed with ~1e-16 relative error per operation)
    assert kernel_distance(K, K).abs() < 1e-12
    assert kernel_distance(K, 3.7 * K).abs() < 1e-12
    # orthogonal under the Frobenius inner product: 1
    e1, e2 = torch.diag(torch.tensor([1.0, 0.0], dtype=DT)), torch.diag(torch.tensor([0.0, 2.0], dtype=DT))
    assert kernel_distance(e1, e2) == pytest.approx(1.0, abs=1e-15)
    # hand-computed: <I, 11^T>_F = 2, |I|_F = sqrt 2, |11^T|_F = 2, so S = 1 - 1/sqrt 2
    I2, ones = torch.eye(2, dtype=DT), torch.ones(2, 2, dtype=DT)
    assert kernel_distance(I2, ones) == pytest.approx(1 - 1 / math.sqrt(2), abs=1e-15)
    assert kernel_distance(I2, -I2) == pytest.approx(2.0, abs=1e-15)
    # layout invariance: the same permutation applied to both kernels
    perm = torch.randperm(6, generator=g)
    K2 = K + 0.3 * torch.ones(6, 6, dtype=DT)
    assert kernel_distance(K[perm][:, perm], K2[perm][:, perm]) == pytest.approx(kernel_distance(K, K2).item(), abs=1e-14)
    assert 0 < kernel_distance(K, K2) < 1


def test_kernel_distance_batched():
    g = torch.Generator().manual_seed(12)
    E, n = 4, 5
    K0 = torch.randn(E, n, n, generator=g, dtype=DT)
    Kt = torch.randn(E, n, n, generator=g, dtype=DT)
    S = kernel_distance(K0, Kt)
    assert S.shape == (E,)
    for e in range(E):
        assert S[e] == pytest.approx(kernel_distance(K0[e], Kt[e]).item(), abs=1e-14)
    # a shared reference kernel broadcasts against an ensemble; member 0 equal to it -> 0
    Kt[0] = 2 * K0[1]
    S_b = kernel_distance(K0[1], Kt)
    assert S_b.shape == (E,)
    assert S_b[0].abs() < 1e-12
    with pytest.raises(ValueError, match="last two dims"):
        kernel_distance(K0, Kt[..., :-1])


def test_kernel_distance_of_linear_ntk_lazy_vs_rich():
    """Scaling both layers by c scales both terms of K by c^2 (S = 0: the lazy picture); moving
    W1 alone changes the kernel's shape (S > 0)."""
    g = torch.Generator().manual_seed(13)
    W1, W2 = torch.randn(2, 3, 4, generator=g, dtype=DT), torch.randn(2, 2, 3, generator=g, dtype=DT)
    X = torch.randn(5, 4, generator=g, dtype=DT)
    K0 = linear_ntk(W1, W2, X)
    assert (kernel_distance(K0, linear_ntk(2 * W1, 2 * W2, X)).abs() < 1e-12).all()
    assert (kernel_distance(K0, linear_ntk(W1 + 0.5 * torch.randn(2, 3, 4, generator=g, dtype=DT), W2, X)) > 1e-4).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = mlp()
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(14), dtype=DT)
    K_cpu = empirical_ntk(model, x)
    model_gpu, x_gpu = model.to("cuda"), x.to("cuda")
    for method in ("jacobian", "ntk_vp"):
        K = empirical_ntk(model_gpu, x_gpu, method=method)
        assert K.device.type == "cuda"
        torch.testing.assert_close(K.cpu(), K_cpu, **TOL)
    W1, W2 = model_gpu.fc1.weight.detach(), model_gpu.fc2.weight.detach()
    K_lin = linear_ntk(W1, W2, x_gpu)
    assert K_lin.device.type == "cuda"
    assert kernel_distance(K_lin, K_lin).abs().item() < 1e-12
