"""MultiHeadStudent's kernels by size: the scalar kernel of a single student, blocks chosen by d,
the products on W's own rows (slice-exactness at a large d), and the scoped one-thread choice."""
from __future__ import annotations

import math

import pytest
import torch

import zoo.models.student
import zoo.kernels.student
import zoo.utils.threads
from zoo import MultiHeadStudent
from zoo.init import Gaussian, Polar
from zoo.models.student import phi

LARGE_D = 4100  # above 4,096: blocks of 16 samples instead of the 128 of d <= 1,024


def online_sgd(W, h, X, Y, eta, activation):
    """One member's online SGD ([S] Eqs. 6-7), a sample at a time, phi' by autograd: W (p, d), h (p,)."""
    W, h = W.clone(), h.clone()
    d = W.shape[-1]
    deltas = []
    for x, y in zip(X, Y):
        lam = (W @ x / math.sqrt(d)).requires_grad_(True)
        f = phi(activation, lam)
        (df,) = torch.autograd.grad(f.sum(), lam)
        delta = f.detach() @ h - y
        W -= eta / math.sqrt(d) * torch.outer(delta * h * df, x)
        h -= eta / d * delta * f.detach()
        deltas.append(delta)
    return W, h, torch.stack(deltas)


def stream(E: int, d: int, steps: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, 1, d, generator=g, dtype=torch.float64), torch.randn(steps, 1, E, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("activation", ["erf", "relu", "sigmoid", "tanh", "linear"])
def test_a_single_student_takes_the_scalar_kernel_and_follows_step_by_step_sgd(activation, monkeypatch):
    calls, kernel = [], zoo.kernels.student.online_steps
    monkeypatch.setattr(zoo.models.student, "online_steps", lambda *a, **k: calls.append(a[-1]) or kernel(*a, **k))
    net = MultiHeadStudent(d=40, p=3, activation=activation, eta=0.7, init_w=Gaussian(sigma=0.5),
                           init_heads=Gaussian(sigma=1.0)).double()
    W0, h0, other = net.W[0].detach().clone(), net.h[0, 0].detach().clone(), net.h[0, 1].detach().clone()
    x, y = stream(1, 40, 100)  # 100 steps: six blocks of 16 and one of 4 (_scalar_block_size)
    delta = net.sgd_steps(x, y, task=0)
    W1, h1, delta1 = online_sgd(W0, h0, x[:, 0], y[:, 0, 0], 0.7, activation)
    assert calls == [16]  # one call for the whole chunk, which runs its own blocks
    # the same arithmetic in another order (Python floats): float64 rounding only
    torch.testing.assert_close(net.W[0], W1, rtol=0, atol=1e-12)
    torch.testing.assert_close(net.h[0, 0], h1, rtol=0, atol=1e-12)
    torch.testing.assert_close(delta[:, 0, 0], delta1, rtol=0, atol=1e-12)
    assert torch.equal(net.h[0, 1], other)  # the inactive head never moves


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_scalar_kernel_has_the_same_bits_however_the_chunks_split_at_its_blocks(dtype):
    """The scalar kernel keeps the head in Python floats within a call and rounds it to h's dtype at
    every block's end, as if written back to h there: chunks that split the stream at multiples
    of its block (16) train to the same bits as one chunk (a resumed run splits it at chunks)."""
    def trained(splits):
        net = MultiHeadStudent(d=30, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=0.3)).to(dtype)
        x, y = stream(1, 30, 100)
        deltas = [net.sgd_steps(x[a:b].to(dtype), y[a:b].to(dtype), task=0) for a, b in zip(splits, splits[1:])]
        return net.W.detach(), net.h.detach(), torch.cat(deltas)

    assert MultiHeadStudent(d=30)._scalar_block_size() == 16
    whole = trained([0, 100])
    for part, one in zip(trained([0, 48, 64, 100]), whole):
        assert torch.equal(part, one)


def test_the_scalar_kernels_blocks_shrink_with_d_and_still_follow_step_by_step_sgd(monkeypatch):
    """Blocks of n samples with n d <= 2^16, 16 to 4 (the Gram matrix costs n d a step): 16 up to
    d = 4,096, 8 up to 8,192, 4 beyond; a short last block where the chunk ends mid-block."""
    sizes = {d: MultiHeadStudent(d=d)._scalar_block_size() for d in (30, 1000, 4096, 4097, 8192, 8193, 10_000)}
    assert sizes == {30: 16, 1000: 16, 4096: 16, 4097: 8, 8192: 8, 8193: 4, 10_000: 4}
    calls, kernel = [], zoo.kernels.student.online_steps
    monkeypatch.setattr(zoo.models.student, "online_steps", lambda *a, **k: calls.append(a[-1]) or kernel(*a, **k))
    d = 8200
    net = MultiHeadStudent(d=d, eta=0.7, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=0.3)).double()
    W0, h0 = net.W[0].detach().clone(), net.h[0, 0].detach().clone()
    x, y = stream(1, d, 10)  # blocks of 4, 4 and 2
    delta = net.sgd_steps(x, y, task=0)
    W1, h1, delta1 = online_sgd(W0, h0, x[:, 0], y[:, 0, 0], 0.7, "erf")
    assert calls == [4]
    torch.testing.assert_close(net.W[0], W1, rtol=0, atol=1e-12)
    torch.testing.assert_close(net.h[0, 0], h1, rtol=0, atol=1e-12)
    torch.testing.assert_close(delta[:, 0, 0], delta1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_single_student_in_half_precision_follows_the_float64_one(dtype):
    """The scalar kernel takes any float dtype (the array module has no 16-bit floats): a student
    in bfloat16 or float16 ends where the float64 one does, to its dtype's rounding."""
    def trained(dt):
        net = MultiHeadStudent(d=30, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=0.3)).to(dt)
        x, y = stream(1, 30, 40)
        delta = net.sgd_steps(x.to(dt), y.to(dt), task=0)
        return net.W.detach().double(), delta.double()

    W, delta = trained(dtype)
    W64, delta64 = trained(torch.float64)
    eps = torch.finfo(dtype).eps
    assert float((W - W64).abs().max() / W64.abs().max()) < 10 * eps
    assert float((delta - delta64).abs().max()) < 10 * eps


def test_blocks_shrink_with_d_and_still_follow_step_by_step_sgd():
    E = 3
    net = MultiHeadStudent(d=LARGE_D, p=2, eta=1.0, init_w=Gaussian(sigma=0.5),
                           init_heads=Polar(r=1.0, theta=[0.1, 0.4, 0.7])).double()
    assert net._block_size(1) == 16 and net._block_size(3) == 15  # n d <= 2^17, a multiple of B
    assert MultiHeadStudent(d=1000)._block_size(1) == 128  # the recipes' d: the blocks they were measured with
    W0, h0 = net.W.detach().clone(), net.h[:, 0].detach().clone()
    x, y = stream(E, LARGE_D, 40)
    delta = net.sgd_steps(x, y, task=0)
    for e in range(E):
        W1, h1, delta1 = online_sgd(W0[e], h0[e], x[:, 0], y[:, 0, e], 1.0, "erf")
        torch.testing.assert_close(net.W[e], W1, rtol=0, atol=1e-12)
        torch.testing.assert_close(net.h[e, 0], h1, rtol=0, atol=1e-12)
        torch.testing.assert_close(delta[:, 0, e], delta1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("B", [1, 2])
def test_a_member_has_the_same_bits_in_any_slice_at_a_large_d(B):
    """W's products run on the members' own rows (no padding rows): a member's bits still do not
    depend on which members share the process, also a member alone in its slice (which keeps the
    tensor kernels: the choice is made from the whole ensemble)."""
    def trained(lo=None, hi=None):
        net = MultiHeadStudent(d=LARGE_D, p=2, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=[0.2, 0.5, 0.9]))
        if lo is not None:
            net.keep_members(lo, hi)
        g = torch.Generator().manual_seed(3)
        x, y = torch.randn(24, B, LARGE_D, generator=g), torch.randn(24, B, 3, generator=g)
        net.sgd_steps(x, y[..., slice(lo, hi)], task=0)
        return net.W, net.h

    W, h = trained()
    for lo, hi in ((0, 2), (2, 3)):
        W_part, h_part = trained(lo, hi)
        assert torch.equal(W_part, W[lo:hi]) and torch.equal(h_part, h[lo:hi])


def test_a_small_student_steps_on_one_thread_and_restores_the_callers_count(two_threads, monkeypatch):
    seen = []
    kernel = zoo.models.student.online_steps
    monkeypatch.setattr(zoo.models.student, "online_steps", lambda *a, **k: seen.append(torch.get_num_threads()) or kernel(*a, **k))
    net = MultiHeadStudent(d=40)
    x, y = stream(1, 40, 40)
    net.sgd_steps(x.float(), y.float(), task=0)
    assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    # also when the step fails
    monkeypatch.setattr(zoo.models.student, "online_steps", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        net.sgd_steps(x.float(), y.float(), task=0)
    assert torch.get_num_threads() == 2


def test_a_large_ensemble_keeps_the_callers_thread_count(two_threads, monkeypatch):
    seen = []
    net = MultiHeadStudent(d=40, init_heads=Polar(r=1.0, theta=[0.1, 0.2]))
    block = net._online_block
    monkeypatch.setattr(net, "_online_block", lambda *a: seen.append(torch.get_num_threads()) or block(*a))
    x, y = stream(2, 40, 20)
    net.sgd_steps(x.float(), y.float(), task=0)
    monkeypatch.setattr(zoo.utils.threads, "SMALL_WORK", 2 * 2 * 40)  # this ensemble's first layer: "large"
    net.sgd_steps(x.float(), y.float(), task=0)
    assert seen == [1, 2]


def test_the_two_unit_recursion_is_the_general_one_written_out():
    """p = 2 (every [S] student) takes a written-out loop: the same operations, the same bits."""
    g = torch.Generator().manual_seed(5)
    U0, K = torch.randn(2, 12, generator=g).tolist(), torch.randn(12, 12, generator=g).tolist()
    y, head = torch.randn(12, generator=g).tolist(), [0.8, -0.3]
    for name, act in zoo.kernels.student.ACTIVATIONS.items():
        fast_head, any_head = list(head), list(head)
        fast = zoo.kernels.student._two_units(act, K, U0, y, fast_head, 0.7, 1e-2, 0.05)
        general = zoo.kernels.student._any_units(act, K, U0, y, any_head, 0.7, 1e-2, 0.05)
        assert fast == general and fast_head == any_head, name
