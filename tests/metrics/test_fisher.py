"""zoo.metrics.fisher: the per-sample diagonal Fisher against independent computations."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from zoo.metrics import fisher as fisher_module
from zoo.metrics.fisher import fisher_diagonal, fisher_summary, select_parameters


# float64 throughout: the Fisher and the loop differ only by rounding (~1e-16 relative), so 1e-10
# leaves room for summation order and still catches any real difference
RTOL, ATOL = 1e-10, 1e-14


def ce(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(f, y)


def half_sq(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of y ~ N(f, I), up to a constant."""
    return 0.5 * ((f - y) ** 2).sum()


class Scale(nn.Module):
    """An elementwise gain: a parameter outside any nn.Linear (takes the vmap path)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * self.gain


class SharedTwice(nn.Module):
    """One Linear applied twice per forward: its per-sample gradient is a sum of two outer
    products, which the closed form must not be used for."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 4)
        self.mix = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        return self.out(torch.tanh(self.mix(torch.tanh(self.mix(h)))))


class Tokens(nn.Module):
    """A Linear on (B, T, in) inputs: rows are not samples, so no closed form either."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Linear(5, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.tok(x.view(x.shape[0], 1, 5).expand(-1, 2, -1) * torch.tensor([1.0, -0.5]).to(x)[:, None]))
        return self.out(h.sum(1))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), Scale(4), nn.Linear(4, 3)).double()


def models() -> dict[str, nn.Module]:
    torch.manual_seed(1)
    return {"mlp": mlp(), "shared": SharedTwice().double(), "tokens": Tokens().double()}


def data(n: int = 40, seed: int = 0, out: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g) if out is None else torch.randn(n, out, generator=g, dtype=torch.float64)
    return x, y


def loop_fisher(net: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The definition, one sample at a time with plain autograd."""
    F = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(loss_fn(net(x[i:i + 1])[0], y[i]), list(net.parameters()))
        for (n, _), gr in zip(net.named_parameters(), grads):
            F[n] += gr.detach() ** 2 / x.shape[0]
    return F


def assert_same(F: dict[str, torch.Tensor], G: dict[str, torch.Tensor]) -> None:
    assert set(F) == set(G)
    for n in F:
        assert F[n].shape == G[n].shape and F[n].dtype == G[n].dtype
        assert torch.allclose(F[n], G[n], rtol=RTOL, atol=ATOL), n


@pytest.mark.parametrize("method", ["auto", "vmap", "loop"])
@pytest.mark.parametrize("name", ["mlp", "shared", "tokens"])
def test_equals_a_per_sample_autograd_loop(name, method):
    net = models()[name]
    x, y = data()
    F = fisher_diagonal(net, ce, (x, y), method=method)
    expect = loop_fisher(net, ce, x, y)
    assert_same(F, expect)
    assert all(float(v.max()) > 0 for v in F.values())  # no parameter silently left at zero


def test_sampled_mode_uses_the_drawn_labels_per_sample():
    net = mlp()
    x, _ = data(30)
    drawn = []

    def sampler(out: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        y = torch.multinomial(torch.softmax(out, -1), 1, generator=g).squeeze(1)
        drawn.append(y)
        return y

    F = fisher_diagonal(net, ce, (x, None), mode="sampled", likelihood=sampler, chunk_size=7,
                        generator=torch.Generator().manual_seed(0))
    assert_same(F, loop_fisher(net, ce, x, torch.cat(drawn)))


@pytest.mark.parametrize("method", ["auto", "vmap", "loop"])
def test_does_not_change_with_the_loaders_batch_size(method):
    net = models()["shared" if method == "vmap" else "mlp"]
    x, y = data(64)
    Fs = [fisher_diagonal(net, ce, DataLoader(TensorDataset(x, y), batch_size=b), method=method) for b in (1, 7, 32)]
    assert_same(Fs[0], Fs[1])
    assert_same(Fs[0], Fs[2])
    assert_same(Fs[0], fisher_diagonal(net, ce, (x, y), method=method, chunk_size=5))


def test_vmap_chunks_and_the_wide_layer_loop_equal_a_per_sample_loop_in_float32(monkeypatch):
    # float32 as bench_fisher: vmap's per-sample squares are summed a sample at a time within
    # chunks of any size (1, 3, 16 or the default), and "auto" sends a Scale layer wider than the
    # vmap limit (lowered here to 3 entries) through one backward pass per sample
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), Scale(4), nn.Linear(4, 3))
    x, y = (t.float() if t.is_floating_point() else t for t in data(40))
    expect = loop_fisher(net, ce, x, y)
    for chunk in (1, 3, 16, None):
        for n, F in fisher_diagonal(net, ce, (x, y), method="vmap", chunk_size=chunk).items():
            assert torch.allclose(F, expect[n], rtol=1e-5, atol=1e-8), (chunk, n)
    looped = []  # the parameters of each chunk that went through the per-sample loop
    real = fisher_module._looped_squares
    monkeypatch.setattr(fisher_module, "_looped_squares", lambda *a: looped.append(list(a[1])) or real(*a))
    for limit, calls in ((fisher_module._LOOP_WIDTH, []), (3, [["2.gain"]] * 3)):
        monkeypatch.setattr(fisher_module, "_LOOP_WIDTH", limit)
        looped.clear()
        for n, F in fisher_diagonal(net, ce, (x, y), chunk_size=16).items():
            assert torch.allclose(F, expect[n], rtol=1e-5, atol=1e-8), (limit, n)
        assert looped == calls  # 4 entries: vmap; over the limit: chunks of 16, 16, 8 samples looped
    net[2].gain.requires_grad_(False)  # frozen: the loop differentiates a detached copy instead
    for n, F in fisher_diagonal(net, ce, (x, y), method="loop").items():
        assert torch.allclose(F, expect[n], rtol=1e-5, atol=1e-8), n
    assert not net[2].gain.requires_grad and all(p.grad is None for p in net.parameters())


def test_closed_form_under_an_in_place_activation():
    # the probe is added to a Linear's output in place; an in-place ReLU after it must still see
    # (and differentiate) the sum, as it would the plain output
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(5, 6), nn.ReLU(inplace=True), nn.Linear(6, 3)).double()
    x, y = data(30)
    assert_same(fisher_diagonal(net, ce, (x, y), chunk_size=7), loop_fisher(net, ce, x, y))


def test_accepts_lists_of_tuples_and_dict_batches():
    net = mlp()
    x, y = data(20)
    ref = fisher_diagonal(net, ce, (x, y))
    assert_same(fisher_diagonal(net, ce, [(x[:9], y[:9]), (x[9:], y[9:])]), ref)
    assert_same(fisher_diagonal(net, ce, [{"x": x[:4], "y": y[:4], "task": 0}, {"x": x[4:], "y": y[4:]}]), ref)
    assert_same(fisher_diagonal(net, ce, [(x[:9], y[:9], 0), (x[9:], y[9:], 0)]), ref)  # (x, y, task)
    assert_same(fisher_diagonal(net, ce, (x.float(), y)), fisher_diagonal(net, ce, (x.float().double(), y)))


def test_max_samples_caps_exactly():
    net = mlp()
    x, y = data(50)
    loader = DataLoader(TensorDataset(x, y), batch_size=7)
    F20 = fisher_diagonal(net, ce, loader, max_samples=20)  # cuts the third batch after 6 of 7
    assert_same(F20, loop_fisher(net, ce, x[:20], y[:20]))
    F21 = fisher_diagonal(net, ce, loader, max_samples=21)
    assert not torch.allclose(F20["0.weight"], F21["0.weight"])  # one sample more is visible
    assert_same(fisher_diagonal(net, ce, loader, max_samples=500), fisher_diagonal(net, ce, (x, y)))


def test_include_and_exclude_select_parameters_without_changing_values():
    net = mlp()
    x, y = data()
    full = fisher_diagonal(net, ce, (x, y))
    cases = {
        "0.*": {"0.weight", "0.bias"},
        "re:^3\\.": {"3.weight", "3.bias"},
        re.compile(r"weight$"): {"0.weight", "3.weight"},
        ("*.bias", "2.gain"): {"0.bias", "3.bias", "2.gain"},
    }
    for include, names in cases.items():
        F = fisher_diagonal(net, ce, (x, y), include=include)
        assert set(F) == names
        assert_same(F, {n: full[n] for n in names})
    F = fisher_diagonal(net, ce, (x, y), exclude=["3.*", "*.bias"])
    assert set(F) == {"0.weight", "2.gain"}
    assert set(fisher_diagonal(net, ce, (x, y), include="0.*", exclude="*.bias")) == {"0.weight"}
    assert set(select_parameters(net, include="*.weight")) == {"0.weight", "3.weight"}
    # a weight without its bias: the closed form must not pick up the excluded bias
    assert_same(fisher_diagonal(net, ce, (x, y), exclude="0.bias"), {n: full[n] for n in full if n != "0.bias"})


def analytic_gaussian_fisher(net: nn.Module, x: torch.Tensor) -> tuple[dict, dict]:
    """``E_x[J^T J]`` diagonal and ``sum_n |J_n|^4`` per entry (for the Monte-Carlo error)."""
    names = [n for n, _ in net.named_parameters()]
    F = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    M4 = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    for i in range(x.shape[0]):
        out = net(x[i:i + 1])[0]
        rows = [torch.autograd.grad(out[o], list(net.parameters()), retain_graph=True) for o in range(out.shape[0])]
        for k, n in enumerate(names):
            J2 = sum(r[k] ** 2 for r in rows)  # sum_o (d f_o / d theta)^2
            F[n] += J2 / x.shape[0]
            M4[n] += J2**2
    return F, M4


def test_sampled_gaussian_fisher_is_e_jtj():
    # y ~ N(f(x), I): the per-sample gradient is -J^T eps, so E_eps[(J^T eps)_i^2] = (J^T J)_ii
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    x, _ = data(40)
    F_true, M4 = analytic_gaussian_fisher(net, x)
    R = 400  # draws per sample: the estimate is the mean over N R squared Gaussian projections
    g = torch.Generator().manual_seed(0)
    F = fisher_diagonal(net, half_sq, [(x, None)] * R, mode="sampled", likelihood="gaussian", generator=g)
    N = x.shape[0]
    for n in F:
        # Var[(J.eps)^2] = 2 |J|^4 for Gaussian eps, so the mean's standard error is
        # sqrt(2 sum_n |J_n|^4 / R) / N; every entry within 5 of them (chance of failing ~1e-5)
        se = (2 * M4[n] / R).sqrt() / N
        z = (F[n] - F_true[n]).abs() / se.clamp_min(1e-300)
        assert float(z.max()) < 5.0, (n, float(z.max()))
    # the empirical Fisher at random regression targets is a different thing
    _, y = data(40, out=2)
    F_emp = fisher_diagonal(net, half_sq, (x, y))
    assert not torch.allclose(F_emp["2.weight"], F_true["2.weight"], rtol=0.1)


def test_sampled_categorical_fisher_is_the_expectation_over_softmax_labels():
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    with torch.no_grad():
        net[2].weight.mul_(4.0)  # confident enough that the classes' weights differ
    x, _ = data(20)
    exact = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    var = {n: torch.zeros_like(p) for n, p in net.named_parameters()}  # sum_n Var_c[g_n^2]
    for i in range(20):
        p = torch.softmax(net(x[i:i + 1])[0], -1).detach()
        m2 = {n: torch.zeros_like(q) for n, q in net.named_parameters()}
        m4 = {n: torch.zeros_like(q) for n, q in net.named_parameters()}
        for c in range(3):
            grads = torch.autograd.grad(ce(net(x[i:i + 1])[0], torch.tensor(c)), list(net.parameters()))
            for (n, _), gr in zip(net.named_parameters(), grads):
                m2[n] += p[c] * gr**2
                m4[n] += p[c] * gr**4
        for n in exact:
            exact[n] += m2[n] / 20
            var[n] += m4[n] - m2[n] ** 2
    R = 500
    F = fisher_diagonal(net, ce, [(x, None)] * R, mode="sampled", likelihood="categorical",
                        generator=torch.Generator().manual_seed(1))
    for n in F:
        # standard error of the mean of N R draws of g^2: sqrt(sum_n Var_c[g^2] / R) / N
        se = (var[n].clamp_min(0) / R).sqrt() / 20
        z = (F[n] - exact[n]).abs() / se.clamp_min(1e-12)
        assert float(z.max()) < 5.0, (n, float(z.max()))


def test_differs_from_the_square_of_a_minibatch_mean_gradient():
    # The bug DESIGN.md warns about: squaring a minibatch-mean gradient. With labels from the model
    # the per-sample gradients have mean zero, so E[(mean_B g)^2] = F / B: the estimate shrinks
    # with the batch size, while the per-sample Fisher is the same for every B (tested above).
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    x, _ = data(64)
    F = fisher_diagonal(net, half_sq, [(x, None)] * 100, mode="sampled", likelihood="gaussian",
                        generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(6)
    for B in (8, 32):
        wrong = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
        reps = 400
        for r in range(reps):
            idx = torch.randperm(64, generator=g)[:B]
            with torch.no_grad():
                y = net(x[idx]) + torch.randn(B, 2, generator=g, dtype=torch.float64)
            loss = 0.5 * ((net(x[idx]) - y) ** 2).sum(1).mean()
            for (n, _), gr in zip(net.named_parameters(), torch.autograd.grad(loss, list(net.parameters()))):
                wrong[n] += gr**2 / reps
        ratio = sum(float(wrong[n].sum()) for n in F) / sum(float(F[n].sum()) for n in F)
        # ratio of traces ~ 1/B; 400 repetitions of a sum over ~50 entries: ~7% noise, 30% margin
        assert abs(ratio * B - 1) < 0.3, (B, ratio)


def test_leaves_the_module_unchanged():
    net = mlp()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    x, y = data()
    fisher_diagonal(net, ce, (x, y))
    fisher_diagonal(net, ce, (x, None), mode="sampled", generator=torch.Generator().manual_seed(0),
                    likelihood="categorical")
    for n, p in net.named_parameters():
        assert torch.equal(p, before[n]) and p.grad is None and p.requires_grad
    assert all(not m._forward_hooks for m in net.modules())


@pytest.mark.parametrize("method", ["auto", "vmap", "loop"])
def test_works_under_no_grad_and_inference_mode(method):
    # EWC consolidates from Lightning hooks, some of which run under no_grad or inference_mode
    net = mlp()
    x, y = data()
    ref = fisher_diagonal(net, ce, (x, y), method=method)
    with torch.no_grad():
        assert_same(fisher_diagonal(net, ce, (x, y), method=method), ref)
    with torch.inference_mode():
        xi, yi = x.clone(), y.clone()  # inference tensors
        assert_same(fisher_diagonal(net, ce, (xi, yi), method=method), ref)


def test_summary_statistics():
    F = {"a": torch.tensor([[0.0, 2.0], [1e-9, 4.0]]), "b": torch.tensor([1.0, 1e-7])}
    s = fisher_summary(F)  # rtol 1e-6: entries <= 4e-6 are near zero: 0, 1e-9 and 1e-7
    assert s["max"] == 4.0 and s["near_zero"] == pytest.approx(3 / 6)
    assert s["mean"] == pytest.approx((7.0 + 1e-9 + 1e-7) / 6) and s["sum"] == pytest.approx(7.0 + 1e-9 + 1e-7)
    assert fisher_summary(torch.zeros(3))["near_zero"] == 1.0
    assert fisher_summary(F, rtol=0.3)["near_zero"] == pytest.approx(4 / 6)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_samples": 0}, "max_samples"),
    ({"max_samples": -3}, "max_samples"),
    ({"max_samples": 2.5}, "max_samples"),
    ({"mode": "true"}, "mode"),
    ({"method": "closed"}, "method"),
    ({"include": "nothing*"}, "select no parameter"),
    ({"exclude": "*"}, "select no parameter"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"likelihood": "poisson", "mode": "sampled"}, "likelihood"),
])
def test_rejects_bad_input(kwargs, match):
    x, y = data(5)
    with pytest.raises(ValueError, match=match):
        fisher_diagonal(mlp(), ce, (x, y), **kwargs)


def test_rejects_bad_data_and_losses():
    net = mlp()
    x, y = data(5)
    with pytest.raises(ValueError, match="needs labels"):
        fisher_diagonal(net, ce, (x, None))
    with pytest.raises(ValueError, match="no samples"):
        fisher_diagonal(net, ce, [])
    with pytest.raises(ValueError, match="scalar"):
        fisher_diagonal(net, lambda f, t: f, (x, y))
    with pytest.raises(ValueError, match="scalar"):
        fisher_diagonal(net, lambda f, t: f, (x, y), method="vmap")
    with pytest.raises(ValueError, match="labels"):
        fisher_diagonal(net, ce, (x, y[:3]))
    with pytest.raises(TypeError, match="data"):
        fisher_diagonal(net, ce, x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_equals_the_cpu():
    net = mlp()
    x, y = data()
    cpu = fisher_diagonal(net, ce, (x, y))
    for method in ("auto", "vmap", "loop"):
        gpu = fisher_diagonal(net.cuda(), ce, (x, y), method=method)  # data moved to the module's device
        assert all(v.device.type == "cuda" for v in gpu.values())
        assert_same({n: v.cpu() for n, v in gpu.items()}, cpu)
        net.cpu()
    sampled = fisher_diagonal(net.cuda(), ce, (x, None), mode="sampled", likelihood="categorical",
                              generator=torch.Generator(device="cuda").manual_seed(0))
    assert all(v.device.type == "cuda" and bool(torch.isfinite(v).all()) for v in sampled.values())
