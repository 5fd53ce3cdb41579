"""The vectorised BetaVAESweep (issue #21, zoo.kernels.vae): the stacked chain against each net's
own layers, a vectorised member against a separate BetaVAE stepped by the same fused Adam on the
same noise, the switch's one-by-one path against it, a member-parallel slice against the whole
sweep, the stacked storage through a dtype move, a checkpoint load and gradient accumulation, and
StackedAdam against torch's fused Adam (stacked, restored from a state dict, falling back, a changed lr).
Every test on one thread (tiny networks; on a loaded CPU a second thread makes them crawl)."""
from __future__ import annotations

import copy

import pytest
import torch

from zoo.init import Gain
from zoo.models.vae import BetaVAE, BetaVAESweep
from zoo.kernels.vae import SharedStacks, StackedAdam, stacked_layers, stacked_mlp


ARGS = dict(latent_dim=3, encoder_widths=[16, 8], decoder_widths=[8, 16], lr=1e-2, image_shape=[1, 8, 8])
GAINS, SEEDS = [0.5, 2.0], [0, 1]


def _images(n: int = 16) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def _sweep(**kw) -> BetaVAESweep:
    sweep = BetaVAESweep(init_encoder=Gain(g=GAINS), seeds=SEEDS, **ARGS, **kw)
    noise = torch.Generator().manual_seed(3)
    for m in sweep.members:
        m.noise_generator = noise
    return sweep


@pytest.mark.parametrize("shared_input", [True, False])
def test_stacked_chain_equals_each_nets_own_layers(shared_input):
    nets = [BetaVAE(init_encoder=Gain(g=g), seed=1, **ARGS).encoder for g in (0.5, 1.0, 3.0)]
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    inputs = x if shared_input else torch.stack([x, 2 * x, -x])
    out = stacked_mlp(inputs, stacked_layers(nets))
    assert out.shape == (3, 5, 6)
    for k, net in enumerate(nets):
        torch.testing.assert_close(out[k], net(inputs if shared_input else inputs[k]), atol=1e-6, rtol=1e-5)
    # the gradients reach each net's own parameters
    out.square().sum().backward()
    for k, net in enumerate(nets):
        ref = [p.detach().clone().requires_grad_() for p in net.parameters()]
        h = inputs if shared_input else inputs[k]
        for i in range(0, len(ref), 2):
            h = torch.nn.functional.linear(h, ref[i], ref[i + 1])
            h = torch.relu(h) if i < len(ref) - 2 else h
        h.square().sum().backward()
        for p, r in zip(net.parameters(), ref):
            torch.testing.assert_close(p.grad, r.grad, atol=1e-5, rtol=1e-5)


def test_vectorised_member_equals_a_separate_beta_vae_under_the_same_adam_and_noise():
    x = _images()
    sweep = _sweep()
    assert sweep._vectorised()
    opt = sweep.configure_optimizers()
    assert opt.defaults["fused"]
    # the separate models draw from one generator in member order, as the sweep's members do
    alone = [BetaVAE(init_encoder=Gain(g=g), seed=s, **ARGS) for g in GAINS for s in SEEDS]
    noise = torch.Generator().manual_seed(3)
    for m in alone:
        m.noise_generator = noise
    opts = [torch.optim.Adam(m.parameters(), lr=m.lr, fused=True) for m in alone]
    for step in range(4):
        out = sweep.member_losses(x, step)
        opt.zero_grad()
        out["loss"].sum().backward()
        opt.step()
        for k, (m, o) in enumerate(zip(alone, opts)):
            ref = m.losses(x, step)
            for key in ("loss", "reconstruction", "kl", "regulariser", "kl_per_latent", "active_latents"):
                torch.testing.assert_close(out[key][k], ref[key].detach(), atol=1e-5, rtol=1e-5)
            o.zero_grad()
            ref["loss"].backward()
            o.step()
    for member, m in zip(sweep.members, alone):
        for a, b in zip(member.parameters(), m.parameters()):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # four Adam steps at lr 1e-2 moved every member (the comparison is not vacuous)
    fresh = BetaVAE(init_encoder=Gain(g=GAINS[0]), seed=SEEDS[0], **ARGS)
    assert (sweep.members[0].encoder[0].weight - fresh.encoder[0].weight).abs().max() > 5e-3


def test_the_switch_off_steps_members_one_by_one_and_agrees():
    x = _images()
    together, one_by_one = _sweep(), _sweep(vectorise=False)
    assert together._vectorised() and not one_by_one._vectorised()
    assert not one_by_one.configure_optimizers().defaults["fused"]
    a, b = together.member_losses(x, 0), one_by_one.member_losses(x, 0)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-5)
    a["loss"].sum().backward()
    b["loss"].sum().backward()
    for p, q in zip(together.parameters(), one_by_one.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)


def test_a_member_parallel_slice_equals_those_members_of_the_whole_sweep():
    x = _images()
    whole, part = _sweep(), _sweep()
    full = whole.member_losses(x, 0)
    full["loss"].sum().backward()
    part.member_range = (1, 3, 4)  # what keep_members(1, 3) sets on a rank training members 1 and 2
    sliced = part.member_losses(x, 0)
    sliced["loss"].sum().backward()
    # the members 1, 2 of the whole sweep bit for bit (member-parallel runs equal the single process's)
    assert torch.equal(sliced["loss"], full["loss"][1:3])
    for k in range(4):
        for p, q in zip(part.members[k].parameters(), whole.members[k].parameters()):
            assert (p.grad is None) if k in (0, 3) else torch.equal(p.grad, q.grad)
    # every member drew its noise: both generators are at the same place
    assert torch.equal(part.members[0].noise().get_state(), whole.members[0].noise().get_state())


def test_the_shared_stack_follows_a_dtype_move_a_checkpoint_and_accumulates_gradients():
    x = _images()
    sweep = _sweep()
    sweep.member_losses(x, 0)
    stacks = sweep._shared_stacks["encoder"]
    weight = sweep.members[1].encoder[0].weight
    assert weight.untyped_storage().data_ptr() == stacks.stacks[0].untyped_storage().data_ptr()
    # a checkpoint loads into the stack in place
    other = _sweep()
    other.members[1].encoder[0].weight.data.mul_(2.0)
    sweep.load_state_dict(other.state_dict())
    assert torch.equal(stacks.stacks[0][1], other.members[1].encoder[0].weight)
    # a dtype move gives the parameters new storage: stacked again, same values
    sweep.double()
    before = [p.detach().clone() for p in sweep.parameters()]
    sweep.members[0].noise_generator.manual_seed(3)
    out = sweep.member_losses(x.double(), 0)
    assert out["loss"].dtype == torch.float64 and stacks.stacks[0].dtype == torch.float64
    assert all(torch.equal(a, b) for a, b in zip(before, sweep.parameters()))
    out["loss"].sum().backward()
    once = [p.grad.clone() for p in sweep.parameters()]
    sweep.members[0].noise_generator.manual_seed(3)
    sweep.member_losses(x.double(), 0)["loss"].sum().backward()  # a second micro-batch adds
    for p, g in zip(sweep.parameters(), once):
        torch.testing.assert_close(p.grad, 2 * g)


def test_a_variant_that_changes_the_network_is_stepped_one_by_one():
    class Wider(BetaVAE):
        def encode(self, x):
            return super().encode(x)

    class WiderSweep(BetaVAESweep):
        member_class = Wider

    assert not WiderSweep(init_encoder=Gain(g=GAINS), seeds=[0], **ARGS)._vectorised()
    with pytest.raises(ValueError, match="vectorise"):
        BetaVAESweep(vectorise="yes", **ARGS)


def test_shared_stacks_hand_gradients_out_as_views():
    nets = [BetaVAE(seed=s, **ARGS).decoder for s in (0, 1)]
    shared = SharedStacks(nets)
    (W, b), *_ = shared.leaves(0, 2)
    (W.sum() + b.sum()).backward()
    grad = nets[1][0].weight.grad
    assert torch.equal(grad, torch.ones_like(grad)) and grad.untyped_storage().data_ptr() == \
        nets[0][0].weight.grad.untyped_storage().data_ptr()


def _adam_run(sweep: BetaVAESweep, opt: torch.optim.Optimizer, steps: range) -> None:
    x = _images()
    for step in steps:
        out = sweep.member_losses(x, step)
        opt.zero_grad()
        out["loss"].sum().backward()
        opt.step()


def test_stacked_adam_is_torchs_fused_adam_and_resumes_from_its_state_dict():
    stacked, plain = _sweep(), _sweep()
    opt = stacked.configure_optimizers()
    assert isinstance(opt, StackedAdam)
    ref = torch.optim.Adam(plain.parameters(), lr=plain.lr, fused=True)
    _adam_run(stacked, opt, range(3))
    _adam_run(plain, ref, range(3))
    assert opt._views is not None  # steps 2 and 3 ran over the stacks (step 1 is torch's: it makes the state)
    # the same Adam bit for bit (ARGS has stacks whose tensors fill whole vectors and some that do not)
    assert all(torch.equal(a, b) for a, b in zip(stacked.parameters(), plain.parameters()))
    state, ref_state = opt.state_dict(), ref.state_dict()
    for i, s in ref_state["state"].items():
        assert s["step"].item() == 3.0 and all(torch.equal(state["state"][i][k], s[k]) for k in s)
    # a resumed run (state dict into a fresh optimizer: stacked again) continues as the uninterrupted one, bit for bit
    resumed = _sweep()
    resumed.load_state_dict(stacked.state_dict())
    resumed.members[0].noise_generator.set_state(stacked.members[0].noise().get_state())
    again = resumed.configure_optimizers()
    again.load_state_dict(copy.deepcopy(state))  # as from a checkpoint file: the state dict holds the live views
    _adam_run(stacked, opt, range(3, 5))
    _adam_run(resumed, again, range(3, 5))
    assert all(torch.equal(a, b) for a, b in zip(stacked.parameters(), resumed.parameters()))


def test_stacked_adam_falls_back_to_torchs_step_on_a_member_parallel_slice():
    part, plain = _sweep(), _sweep()
    part.member_range = plain.member_range = (1, 3, 4)  # this rank trains members 1 and 2
    opt = part.configure_optimizers()
    ref = torch.optim.Adam(plain.parameters(), lr=plain.lr, fused=True)
    _adam_run(part, opt, range(3))
    _adam_run(plain, ref, range(3))
    assert opt._views is None  # torch's step every time: the other members have no gradient
    fresh = _sweep()
    for k, (a, b, c) in enumerate(zip(part.members, plain.members, fresh.members)):
        for p, q, r in zip(a.parameters(), b.parameters(), c.parameters()):
            assert torch.equal(p, q)
            assert torch.equal(p, r) == (k in (0, 3))  # only this rank's members moved


def test_stacked_adam_follows_a_changed_learning_rate_as_torchs_fused_adam():
    """The stacked step is torch's public functional fused Adam over the stacks: a learning rate set
    on the optimizer a user holds (as an lr scheduler does) reaches it, and the run stays torch's
    fused Adam bit for bit."""
    stacked, plain = _sweep(), _sweep()
    opt = stacked.configure_optimizers()
    ref = torch.optim.Adam(plain.parameters(), lr=plain.lr, fused=True)
    _adam_run(stacked, opt, range(3))
    _adam_run(plain, ref, range(3))
    assert opt._views is not None  # the stacked step ran
    for o in (opt, ref):
        o.param_groups[0]["lr"] = 3e-3
    _adam_run(stacked, opt, range(3, 5))
    _adam_run(plain, ref, range(3, 5))
    assert all(torch.equal(a, b) for a, b in zip(stacked.parameters(), plain.parameters()))
    # and with the learning rate unchanged the parameters would differ: the test can tell
    assert not all(torch.equal(a, b) for a, b in zip(stacked.parameters(), _trained_at_one_lr().parameters()))


def _trained_at_one_lr() -> BetaVAESweep:
    sweep = _sweep()
    _adam_run(sweep, torch.optim.Adam(sweep.parameters(), lr=sweep.lr, fused=True), range(5))
    return sweep
