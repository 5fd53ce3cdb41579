"""MultiHeadStudent's one blocked SGD kernel by size and kind: a single student (the ensemble of
one, unpadded), blocks chosen by d, overridden steps through the same blocks, the products on W's
own rows (slice-exactness at a large d), and the scoped one-thread choice."""
from __future__ import annotations

import math

import pytest
import torch

import zoo.models.student
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


class Spy:
    """Records the buffers of every online block a student runs (``_online_block``'s first argument)."""

    def __init__(self, net, monkeypatch):
        self.shapes, self.threads, block = [], [], net._online_block

        def spy(b, *args):
            self.shapes.append(tuple(b.U.shape))
            self.threads.append(torch.get_num_threads())
            return block(b, *args)
        monkeypatch.setattr(net, "_online_block", spy)


@pytest.mark.parametrize("activation", ["erf", "relu", "sigmoid", "tanh", "linear"])
def test_a_single_student_runs_the_blocks_unpadded_and_follows_step_by_step_sgd(activation, monkeypatch):
    """E = 1 is the smallest ensemble: the same blocked kernel, its units alone (no zero members)."""
    net = MultiHeadStudent(d=40, p=3, activation=activation, eta=0.7, init_w=Gaussian(sigma=0.5),
                           init_heads=Gaussian(sigma=1.0)).double()
    spy = Spy(net, monkeypatch)
    W0, h0, other = net.W[0].detach().clone(), net.h[0, 0].detach().clone(), net.h[0, 1].detach().clone()
    x, y = stream(1, 40, 300)  # blocks of 128 at d = 40: 128, 128 and a short last block of 44
    delta = net.sgd_steps(x, y, task=0)
    W1, h1, delta1 = online_sgd(W0, h0, x[:, 0], y[:, 0, 0], 0.7, activation)
    assert spy.shapes == [(128, 3), (128, 3), (44, 3)]  # the pre-activations of 3 units, not 64
    # the same arithmetic in another order: float64 rounding only
    torch.testing.assert_close(net.W[0], W1, rtol=0, atol=1e-12)
    torch.testing.assert_close(net.h[0, 0], h1, rtol=0, atol=1e-12)
    torch.testing.assert_close(delta[:, 0, 0], delta1, rtol=0, atol=1e-12)
    assert torch.equal(net.h[0, 1], other)  # the inactive head never moves


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_single_student_has_the_same_bits_however_the_chunks_split_at_its_blocks(dtype):
    """Blocks restart at every call: chunks that split the stream at multiples of the block (128
    at d = 30) train to the same bits as one chunk (a resumed run splits the stream at chunks)."""
    def trained(splits):
        net = MultiHeadStudent(d=30, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=0.3)).to(dtype)
        x, y = stream(1, 30, 300)
        deltas = [net.sgd_steps(x[a:b].to(dtype), y[a:b].to(dtype), task=0) for a, b in zip(splits, splits[1:])]
        return net.W.detach(), net.h.detach(), torch.cat(deltas)

    assert MultiHeadStudent(d=30)._block_size(1) == 128
    whole = trained([0, 300])
    for part, one in zip(trained([0, 128, 256, 300]), whole):
        assert torch.equal(part, one)


def test_a_single_students_blocks_shrink_with_d_and_still_follow_step_by_step_sgd(monkeypatch):
    """The block rule of d (``_block_size``) holds for one student too: 16 samples at d = 8,200,
    and a short last block where the chunk ends mid-block."""
    d = 8200
    net = MultiHeadStudent(d=d, eta=0.7, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=0.3)).double()
    spy = Spy(net, monkeypatch)
    W0, h0 = net.W[0].detach().clone(), net.h[0, 0].detach().clone()
    x, y = stream(1, d, 40)
    delta = net.sgd_steps(x, y, task=0)
    W1, h1, delta1 = online_sgd(W0, h0, x[:, 0], y[:, 0, 0], 0.7, "erf")
    assert spy.shapes == [(16, 2), (16, 2), (8, 2)]
    torch.testing.assert_close(net.W[0], W1, rtol=0, atol=1e-12)
    torch.testing.assert_close(net.h[0, 0], h1, rtol=0, atol=1e-12)
    torch.testing.assert_close(delta[:, 0, 0], delta1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_single_student_in_half_precision_follows_the_float64_one(dtype):
    """The blocks take any float dtype: a student in bfloat16 or float16 ends where the float64
    one does, to its dtype's rounding."""
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


class ClippedStudent(MultiHeadStudent):
    """A loss whose derivative clips ``Delta`` at 0.1 (Huber's), and phi = tanh written by hand."""

    def activation(self, lam):
        return torch.tanh(lam)

    def loss_grad(self, delta):
        return delta.clamp(-0.1, 0.1)


@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("thetas", [0.3, [0.1, 0.5, 0.9]])
def test_overridden_steps_train_through_the_same_blocks(B, thetas, monkeypatch):
    """A subclass's ``activation`` and ``loss_grad`` are called by the blocked kernels themselves
    (not a step-by-step path), one student or an ensemble, online or minibatch: the weights follow
    SGD on that loss written here step by step (phi' by autograd)."""
    d, eta, S = 30, 0.8, 200
    net = ClippedStudent(d=d, eta=eta, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=thetas)).double()
    assert net.custom_update and not MultiHeadStudent(d=d).custom_update
    E = net.ensemble
    blocks = []
    for name in ("_online_block", "_minibatch_block"):
        monkeypatch.setattr(net, name, (lambda f, n: lambda *a: blocks.append(n) or f(*a))(getattr(net, name), name))
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(S, B, d, generator=g, dtype=torch.float64), torch.randn(S, B, E, generator=g, dtype=torch.float64)
    W, h = net.W.detach().clone(), net.h[:, 0].detach().clone()
    net.sgd_steps(x, y, task=0)
    assert set(blocks) == {"_online_block" if B == 1 else "_minibatch_block"} and len(blocks) == -(-S * B // net._block_size(B))
    for s in range(S):  # minibatch SGD with the mean step, every member at once
        lam = (torch.einsum("epd,bd->ebp", W, x[s]) / math.sqrt(d)).requires_grad_(True)
        f = torch.tanh(lam)
        (df,) = torch.autograd.grad(f.sum(), lam)
        l = ((f.detach() * h[:, None]).sum(-1) - y[s].T).clamp(-0.1, 0.1)  # (E, B)
        W = W - eta / math.sqrt(d) * torch.einsum("eb,ep,ebp,bd->epd", l, h, df, x[s]) / B
        h = h - eta / d * torch.einsum("eb,ebp->ep", l, f.detach()) / B
    torch.testing.assert_close(net.W, W, rtol=0, atol=1e-12)
    torch.testing.assert_close(net.h[:, 0], h, rtol=0, atol=1e-12)


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
    net = MultiHeadStudent(d=40)
    spy = Spy(net, monkeypatch)
    x, y = stream(1, 40, 40)
    net.sgd_steps(x.float(), y.float(), task=0)
    assert spy.threads and set(spy.threads) == {1} and torch.get_num_threads() == 2
    # also when the step fails
    monkeypatch.setattr(net, "_online_block", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
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


@pytest.mark.parametrize("activation", ["erf", "relu", "sigmoid", "tanh", "linear"])
def test_the_built_in_steps_written_into_buffers_are_the_closed_forms_to_the_bit(activation):
    """The blocks' fused steps (phi and phi' into preallocated rows) compute what
    ``zoo.models.multihead.phi_u`` and ``dphi_u`` compute, bit for bit (NaN, +-0 and the SIMD tail
    of a length that is not a multiple of the vector included)."""
    from zoo.models.multihead import dphi_u, phi_u

    u = torch.cat([torch.randn(67, generator=torch.Generator().manual_seed(6)) * 3,
                   torch.tensor([0.0, -0.0, float("nan"), 40.0, -40.0])])
    f, df = zoo.models.student._BUILTIN_STEPS[activation](u, torch.empty_like(u), torch.empty_like(u))
    want_f = phi_u(activation, u)
    want_df = dphi_u(activation, u, want_f)
    assert torch.equal(f.view(torch.int32), want_f.view(torch.int32))
    assert (df is None and want_df is None) or torch.equal(df.view(torch.int32), want_df.view(torch.int32))
