"""BetaVAE and BetaVAESweep ([S] Sec. 3.2, App. D): loss terms against closed forms and hand
computations, the Gain initialisation's bounds, the architecture, a one-method variant, errors,
divergence, and that a sweep trains each member exactly as it would train alone."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from helpers_fit import trainer as fit_trainer
from tests.helpers_vae import TinySquares
from zoo.training.divergence import DivergenceError
from zoo.init import Gain, Xavier
from zoo.models.vae import (ACTIVE_THRESHOLD, BetaVAE, BetaVAESweep, active_latents, bernoulli_nll,
                     bernoulli_reconstruction, gaussian_kl)


def _vae(**kw) -> BetaVAE:
    args = dict(latent_dim=3, encoder_widths=[16, 12, 8, 6], decoder_widths=[6, 8, 12, 16], image_shape=[1, 8, 8])
    args.update(kw)
    return BetaVAE(**args)


def test_gaussian_kl_matches_closed_form_and_torch():
    mu, logvar = torch.tensor([[0.5, -1.0, 0.0]]), torch.tensor([[math.log(2.0), 0.0, 0.0]])
    # by hand: (mu^2 + sigma^2 - 1 - log sigma^2) / 2 = (0.25 + 2 - 1 - ln 2)/2, 1/2, 0
    expected = torch.tensor([[(1.25 - math.log(2.0)) / 2, 0.5, 0.0]])
    # tolerances: float32 rounding of O(1) numbers
    torch.testing.assert_close(gaussian_kl(mu, logvar), expected, atol=1e-7, rtol=0)
    q = torch.distributions.Normal(mu, torch.exp(0.5 * logvar))
    p = torch.distributions.Normal(torch.zeros_like(mu), torch.ones_like(mu))
    torch.testing.assert_close(gaussian_kl(mu, logvar), torch.distributions.kl_divergence(q, p), atol=1e-6, rtol=0)


def test_bernoulli_reconstruction_is_summed_negative_log_likelihood():
    logits = torch.tensor([[[[0.0, 2.0], [-1.0, 3.0]]]])  # (1, 1, 2, 2)
    x = torch.tensor([[[[1.0, 0.0], [0.25, 1.0]]]])
    p = torch.sigmoid(logits)
    by_hand = -(x * torch.log(p) + (1 - x) * torch.log(1 - p)).sum()  # atol: float32 rounding
    torch.testing.assert_close(bernoulli_reconstruction(logits, x), by_hand.view(1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bernoulli_nll_has_torchs_gradient_bit_for_bit_and_its_value_to_rounding(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (8 * torch.randn(3, 5, 40, generator=g, dtype=dtype)).index_fill_(2, torch.tensor([0, 1]), 0.0)
    logits[0, 0, :4] = torch.tensor([-100.0, 100.0, -30.0, 30.0], dtype=dtype)  # where exp(-|l|) underflows
    x = torch.rand(5, 40, generator=g, dtype=dtype)
    x[0, :2] = torch.tensor([0.0, 1.0])
    mine, ref = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = bernoulli_nll(mine, x)
    torchs = torch.nn.functional.binary_cross_entropy_with_logits(ref, x.expand_as(ref), reduction="none").sum(-1)
    # ~1e-7 absolute per pixel (float32): log(sigmoid(|l|)) against torch's log1p(exp(-|l|))
    torch.testing.assert_close(ours, torchs, atol=40 * 2e-7, rtol=1e-6)
    weights = torch.rand(3, 5, generator=g, dtype=dtype)
    (ours * weights).sum().backward()
    (torchs * weights).sum().backward()
    assert torch.equal(mine.grad, ref.grad)  # the same training steps
    # summed over another dimension (the sweep's feature-major logits): the same numbers
    transposed = bernoulli_nll(logits.transpose(1, 2).contiguous(), x.t().contiguous(), dim=-2)
    torch.testing.assert_close(transposed, ours.detach(), atol=1e-5, rtol=1e-6)


def test_active_latents_counts_variance_above_threshold():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4000, 5, generator=g)
    # variances 0.04, 0.02, 0.005, 0.001, 0: two exceed 0.01 (sampling error of a variance with
    # n = 4000 is ~sqrt(2/n) = 2% relative, far from the threshold)
    mu = z * torch.tensor([0.2, math.sqrt(0.02), math.sqrt(0.005), math.sqrt(0.001), 0.0])
    assert ACTIVE_THRESHOLD == 0.01
    assert active_latents(mu).item() == 2


def test_architecture_is_five_linear_layers_each_with_app_d_widths():
    vae = BetaVAE(latent_dim=10, image_shape=[3, 16, 16])
    enc = [tuple(m.weight.shape) for m in vae.encoder if isinstance(m, torch.nn.Linear)]
    dec = [tuple(m.weight.shape) for m in vae.decoder if isinstance(m, torch.nn.Linear)]
    assert enc == [(1000, 768), (400, 1000), (200, 400), (100, 200), (20, 100)]
    assert dec == [(100, 10), (200, 100), (400, 200), (1000, 400), (768, 1000)]
    assert sum(isinstance(m, torch.nn.ReLU) for m in vae.encoder) == 4
    x = torch.rand(5, 3, 16, 16)
    mu, logvar = vae.encode(x)
    assert mu.shape == logvar.shape == (5, 10)
    assert vae.decode(mu).shape == (5, 3, 16, 16)
    torch.testing.assert_close(vae.codes(x), mu)


@pytest.mark.parametrize("g", [0.3, 3.0])
def test_gain_init_bounds(g):
    vae = BetaVAE(latent_dim=10, init_encoder=Gain(g=g), image_shape=[1, 32, 32])
    linears = [m for m in vae.encoder if isinstance(m, torch.nn.Linear)]
    for i, m in enumerate(linears):
        fan_out, fan_in = m.weight.shape
        bound = (g if i < len(linears) - 1 else 1 / g) * math.sqrt(6 / (fan_in + fan_out))
        w = m.weight.detach()
        assert w.abs().max() <= bound * (1 + 1e-6)
        # U(-a, a) has std a/sqrt 3; >= 2000 entries per layer: relative error of the std ~ 1/sqrt(2n) < 2%
        assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
        assert w.abs().max().item() > 0.95 * bound  # the max of >= 2000 uniform draws is near the bound
        assert torch.count_nonzero(m.bias) == 0
    for m in vae.decoder:
        if isinstance(m, torch.nn.Linear):  # Xavier gain 1
            bound = math.sqrt(6 / sum(m.weight.shape))
            assert m.weight.abs().max() <= bound * (1 + 1e-6) and torch.count_nonzero(m.bias) == 0


def test_seed_fixes_the_initial_weights():
    a, b, c = _vae(seed=3), _vae(seed=3), _vae(seed=4)
    torch.testing.assert_close(a.encoder[0].weight, b.encoder[0].weight, atol=0, rtol=0)
    assert not torch.equal(a.encoder[0].weight, c.encoder[0].weight)


def test_loss_equals_hand_computation():
    vae = _vae(beta=4.0)
    x = TinySquares().sample(6, torch.Generator().manual_seed(1))[0]
    torch.manual_seed(7)
    out = vae.losses(x, step=0)
    # independent computation from the layers, with the same noise
    torch.manual_seed(7)
    h = x.flatten(1)
    for m in vae.encoder:
        h = m(h)
    mu, logvar = h[:, :3], h[:, 3:]
    z = mu + torch.exp(logvar / 2) * torch.randn(6, 3)
    p = torch.sigmoid(vae.decoder(z))
    xf = x.flatten(1)
    recon = -(xf * torch.log(p) + (1 - xf) * torch.log(1 - p)).sum(1).mean()
    kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(1).mean()
    # the two paths differ only in float32 summation order over 64 pixels (reconstruction ~ 40)
    torch.testing.assert_close(out["reconstruction"], recon, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out["kl"], kl, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out["loss"], recon + 4.0 * kl, atol=1e-4, rtol=1e-5)


class AnnealedCapacityVAE(BetaVAE):
    """Burgess et al. 2018: ``gamma |KL - C(step)|`` with C rising linearly; one method overridden."""

    gamma, c_max, c_steps = 100.0, 5.0, 10

    def regulariser(self, mu, logvar, z, step):
        capacity = self.c_max * min(step / self.c_steps, 1.0)
        return self.gamma * (gaussian_kl(mu, logvar).sum(-1).mean() - capacity).abs()


def test_a_variant_overrides_only_the_regulariser(tmp_path):
    vae = AnnealedCapacityVAE(latent_dim=3, encoder_widths=[16, 12, 8, 6], decoder_widths=[6, 8, 12, 16])
    x = TinySquares().sample(8, torch.Generator().manual_seed(2))[0]
    vae.build([1, 8, 8])
    out = vae.losses(x, step=5)
    # C(5) = 5 * 5/10 = 2.5; atol 1e-3 on a regulariser of order 100-1000 is float32 rounding
    torch.testing.assert_close(out["loss"] - out["reconstruction"], 100.0 * (out["kl"] - 2.5).abs(),
                               atol=1e-3, rtol=1e-5)
    trainer = fit_trainer(tmp_path, logger=True, max_steps=4)
    trainer.fit(vae, datamodule=TinySquares())  # builds from the datamodule's image_shape
    assert trainer.global_step == 4 and vae.image_shape == [1, 8, 8]
    assert {"loss", "reconstruction", "kl", "active_latents", "kl/z0", "kl/z2"} <= set(trainer.callback_metrics)


class NoiselessCapacityVAE(AnnealedCapacityVAE):
    """z = mu, so training is deterministic and can be recomputed outside Lightning."""

    def reparameterise(self, mu, logvar):
        return mu


def test_the_overridden_regulariser_is_what_adam_minimises(tmp_path):
    kw = dict(latent_dim=3, encoder_widths=[16, 8], decoder_widths=[8, 16], lr=1e-2, seed=2)
    dm = TinySquares(batch_size=16)
    vae = NoiselessCapacityVAE(**kw)
    fit_trainer(tmp_path, logger=True, max_steps=3).fit(vae, datamodule=dm)
    # independent: the same network from the same seed, three Adam steps on the loss written out here
    # (Bernoulli reconstruction at z = mu plus gamma |KL - C(step)|, C rising by c_max / c_steps a step)
    ref = BetaVAE(image_shape=[1, 8, 8], **kw)
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    dm.setup("fit")
    for step, (x, _) in zip(range(3), dm.train_dataloader()):
        mu, logvar = ref.encode(x)
        recon = torch.nn.functional.binary_cross_entropy_with_logits(ref.decode(mu).flatten(1), x.flatten(1),
                                                                     reduction="sum") / len(x)
        kl = 0.5 * (mu ** 2 + logvar.exp() - 1 - logvar).sum(1).mean()
        opt.zero_grad()
        (recon + 100.0 * (kl - 5.0 * step / 10).abs()).backward()
        opt.step()
    for a, b in zip(vae.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    plain = BetaVAE(**kw)
    plain.reparameterise = lambda mu, logvar: mu
    fit_trainer(tmp_path / "plain", logger=True, max_steps=3).fit(plain, datamodule=dm)
    assert not torch.allclose(plain.encoder[0].weight, vae.encoder[0].weight, atol=1e-4)  # the override mattered


@pytest.mark.parametrize("kwargs, words", [
    ({"latent_dim": 0}, "latent_dim"),
    ({"beta": -1.0}, "beta"),
    ({"lr": 0.0}, "lr"),
    ({"encoder_widths": []}, "encoder_widths"),
    ({"decoder_widths": [4, -1]}, "decoder_widths[1]"),
    ({"init_encoder": Gain(g=[0.3, 3.0])}, "BetaVAESweep"),
    ({"image_shape": [8, 8]}, "image_shape"),
])
def test_bad_arguments_raise_naming_the_parameter(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        _vae(**kwargs)
    with pytest.raises(ValueError, match="g"):
        Gain(g=-1.0)


def test_image_shape_must_match_the_data(tmp_path):
    vae = _vae(image_shape=[1, 16, 16])
    trainer = fit_trainer(tmp_path, logger=True)
    with pytest.raises(ValueError, match="image_shape"):
        trainer.fit(vae, datamodule=TinySquares())


def test_divergence_stops_with_a_message(tmp_path):
    class NaNData(TinySquares):
        def setup(self, stage):
            x, f = self.sample(32, torch.Generator().manual_seed(0))
            x[3] = float("nan")
            self.data = TensorDataset(x, f)

    vae = _vae()
    trainer = fit_trainer(tmp_path, logger=True)
    with pytest.raises(DivergenceError, match="not finite at step 0.*lr = "):
        trainer.fit(vae, datamodule=NaNData(batch_size=32))


class NoNoiseVAE(BetaVAE):
    """Deterministic z = mu, so a member's run does not depend on the noise drawn for the others."""

    def reparameterise(self, mu, logvar):
        return mu


class NoNoiseSweep(BetaVAESweep):
    member_class = NoNoiseVAE


def test_sweep_trains_each_member_as_it_would_train_alone(tmp_path):
    args = dict(latent_dim=3, encoder_widths=[16, 12, 8, 6], decoder_widths=[6, 8, 12, 16], lr=1e-2, beta=2.0)
    sweep = NoNoiseSweep(init_encoder=Gain(g=[0.5, 2.0]), seeds=[0, 1], **args)
    assert sweep.labels == ["g=0.5,seed=0", "g=0.5,seed=1", "g=2,seed=0", "g=2,seed=1"]
    assert [p["g"] for p in sweep.member_params] == [0.5, 0.5, 2.0, 2.0]
    trainer = fit_trainer(tmp_path / "sweep", logger=True, max_steps=5)
    trainer.fit(sweep, datamodule=TinySquares())
    for label, g, seed in (("g=0.5,seed=1", 0.5, 1), ("g=2,seed=0", 2.0, 0)):
        alone = NoNoiseVAE(init_encoder=Gain(g=g), seed=seed, **args)
        t = fit_trainer(tmp_path / label, logger=True, max_steps=5)
        t.fit(alone, datamodule=TinySquares())
        # same batches, same Adam state per parameter: equal up to float32 summation order
        for a, b in zip(alone.parameters(), sweep.member(label).parameters()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        # and 5 Adam steps at lr 1e-2 moved the weights (the comparison is not vacuous)
        assert not torch.allclose(alone.encoder[0].weight, NoNoiseVAE(init_encoder=Gain(g=g), seed=seed,
                                                                     image_shape=[1, 8, 8], **args).encoder[0].weight)
    assert {"reconstruction/g=0.5,seed=0", "kl/g=2,seed=1", "active_latents"} <= set(trainer.callback_metrics)


def test_sweep_rejects_bad_seeds_and_unknown_members():
    with pytest.raises(ValueError, match="seeds"):
        BetaVAESweep(seeds=[])
    with pytest.raises(ValueError, match="seeds"):
        BetaVAESweep(seeds=[1, 1])
    sweep = BetaVAESweep(latent_dim=2, encoder_widths=[4], decoder_widths=[4], init_encoder=Gain(g=[1.0, 2.0]),
                         seeds=[0], image_shape=[1, 4, 4])
    # one seed: the labels name what varies (zoo.utils.labels), member_params keep the seed
    assert sweep.labels == ["g=1", "g=2"]
    assert sweep.member_params == [{"g": 1.0, "seed": 0}, {"g": 2.0, "seed": 0}]
    with pytest.raises(KeyError, match="g=1, g=2"):
        sweep.member("g=3,seed=0")
    assert [lbl for lbl, _ in sweep.select([{"g": 2.0}])] == ["g=2"]
    assert sweep.select([{"g": 2, "seed": 0}])[0][1] is sweep.members[1]
    with pytest.raises(ValueError, match="no member has .*'g': 3"):
        sweep.select([{"g": 1.0}, {"g": 3}])
    assert isinstance(sweep.members[0].schemes["init"], Gain)
    assert isinstance(sweep.members[0].schemes["init_decoder"], Xavier)


def test_checkpoint_restores_a_sweep_built_from_the_data(tmp_path):
    sweep = BetaVAESweep(latent_dim=3, encoder_widths=[16, 8], decoder_widths=[8, 16], init_encoder=Gain(g=[0.5, 2.0]),
                         seeds=[0, 1])
    trainer = fit_trainer(tmp_path, logger=True, max_steps=2)
    trainer.fit(sweep, datamodule=TinySquares())
    trainer.save_checkpoint(tmp_path / "sweep.ckpt")
    # image_shape came from the datamodule at setup and is stored, so no datamodule is needed here
    again = BetaVAESweep.load_from_checkpoint(tmp_path / "sweep.ckpt", weights_only=True)
    assert again.labels == sweep.labels and again.hparams["image_shape"] == [1, 8, 8]
    for a, b in zip(sweep.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_a_checkpoint_from_before_samples_seen_still_loads(tmp_path):
    vae = _vae()
    trainer = fit_trainer(tmp_path, logger=True, max_steps=2)
    trainer.fit(vae, datamodule=TinySquares())
    trainer.save_checkpoint(tmp_path / "new.ckpt")
    ckpt = torch.load(tmp_path / "new.ckpt", weights_only=False)
    assert int(ckpt["state_dict"].pop("samples_seen_")) == 2 * 16
    torch.save(ckpt, tmp_path / "old.ckpt")  # as saved before the counter existed (fig13 phase 1)
    old = BetaVAE.load_from_checkpoint(tmp_path / "old.ckpt", weights_only=False)
    assert old.samples_seen == 0 and torch.equal(old.encoder[0].weight, vae.encoder[0].weight)
