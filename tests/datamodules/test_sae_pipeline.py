"""The [S] App. H pipeline: MNIST images for the VAE (phase 1), the VAE's codes as data (phase 2),
on tiny IDX files written here, and an SAE trained on them through Lightning."""
from __future__ import annotations

import pytest
import torch

from datamodules.latents import Latents
from datamodules.mnist_images import MNISTImages
from helpers_fit import trainer as quiet
from tests.helpers_mnist import TEST_PER_DIGIT, TRAIN_PER_DIGIT, trace
from zoo.init import Gaussian, Imbalance
from zoo.models.sae import SparseAutoencoder
from zoo.models.vae import BetaVAE

N_TRAIN = 10 * TRAIN_PER_DIGIT


def _vae(seed: int = 0) -> BetaVAE:
    return BetaVAE(latent_dim=3, encoder_widths=[8], decoder_widths=[8], init_encoder=Gaussian(sigma=0.1),
                   init_decoder=Gaussian(sigma=0.1), image_shape=[1, 28, 28], seed=seed)


def test_images_are_pixels_over_255_in_file_order(tiny):
    dm = MNISTImages(data_dir=str(tiny), num_samples=25)
    x = dm.images
    assert x.shape == (25, 1, 28, 28) and x.dtype == torch.float32
    digit, index = trace(x.flatten(1))  # pixels (0, 0) and (0, 1) encode the digit and the index (tiny_mnist)
    assert torch.equal(index, torch.arange(25)) and torch.equal(digit, dm.digits)
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def test_a_shuffled_epoch_is_a_seeded_permutation_of_the_split(tiny):
    order = [trace(b[0].flatten(1))[1] for b in MNISTImages(data_dir=str(tiny), batch_size=16, seed=3).train_dataloader()]
    again = [trace(b[0].flatten(1))[1] for b in MNISTImages(data_dir=str(tiny), batch_size=16, seed=3).train_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(order, again))
    assert torch.equal(torch.cat(order).sort().values, torch.arange(N_TRAIN))  # every image once


def test_latents_are_the_vae_posterior_means(tiny):
    vae = _vae()
    dm = Latents(vae=vae, data_dir=str(tiny), batch_size=8)
    dm.setup("fit")
    x = MNISTImages(data_dir=str(tiny)).images
    with torch.no_grad():  # independent: the encoder's first L outputs, by hand
        h = vae.encoder(x.flatten(1))
    assert torch.allclose(dm.codes, h[:, :3], atol=1e-6)  # float32, same ops in other chunks
    assert dm.d == 3
    (batch,) = next(iter(dm.train_dataloader()))
    assert batch.shape == (8, 3)
    centred = Latents(vae=vae, data_dir=str(tiny), centre=True).codes
    assert torch.allclose(centred.mean(0), torch.zeros(3), atol=1e-6)
    assert torch.allclose(centred + dm.codes.mean(0), dm.codes, atol=1e-6)


def test_held_out_data_is_the_other_split_in_file_order(tiny):
    images = MNISTImages(data_dir=str(tiny), batch_size=7)
    (first,) = next(iter(images.test_dataloader()))
    digit, index = trace(first.flatten(1))
    assert torch.equal(index, torch.arange(7))  # file order
    held = torch.cat([b[0] for b in images.val_dataloader()])
    assert held.shape == (10 * TEST_PER_DIGIT, 1, 28, 28)
    assert not torch.equal(held[:7], images.images[:7])  # not the training split
    vae = _vae()
    dm = Latents(vae=vae, data_dir=str(tiny), centre=True, batch_size=8)
    codes = torch.cat([b[0] for b in dm.test_dataloader()])
    with torch.no_grad():  # independent: the test images' means, less the TRAINING codes' mean
        train_mean = vae.encoder(images.images.flatten(1))[:, :3].mean(0)
        expected = vae.encoder(held.flatten(1))[:, :3] - train_mean
    assert torch.allclose(codes, expected, atol=1e-6)
    assert float(codes.mean(0).abs().max()) > 1e-4  # centred with the training mean, not their own


def test_latents_from_a_checkpoint_equal_those_of_the_saved_model(tiny, tmp_path):
    vae = _vae(seed=1)
    trainer = quiet(tmp_path, callbacks=[], logger=False)
    trainer.fit(vae, MNISTImages(data_dir=str(tiny), batch_size=30))  # 2 Adam steps: weights != init
    path = tmp_path / "vae.ckpt"
    trainer.save_checkpoint(path)
    from_ckpt = Latents(checkpoint=str(path), data_dir=str(tiny)).codes
    direct = Latents(vae=vae.cpu(), data_dir=str(tiny)).codes
    assert torch.allclose(from_ckpt, direct, atol=1e-6)
    assert not torch.allclose(direct, Latents(vae=_vae(seed=1), data_dir=str(tiny)).codes, atol=1e-4)


def test_missing_checkpoint_is_an_error_naming_the_path_before_anything_loads(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint = '.*nope\.ckpt': no such file .*fig13_vae_mnist"):
        Latents(checkpoint=str(tmp_path / "nope.ckpt"), data_dir=str(tmp_path))


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(), ValueError, "give exactly one of checkpoint .* and vae"),
    (dict(checkpoint="x.ckpt", vae="a VAE"), ValueError, "give exactly one of checkpoint"),
    (dict(vae=torch.nn.Linear(2, 2)), TypeError, "vae is a Linear; allowed: a zoo.models.vae.BetaVAE"),
    (dict(vae="v", batch_size=0), TypeError, "vae is a str"),
])
def test_latents_bad_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        Latents(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(split="val"), "split = 'val'; allowed: 'train' or 'test'"),
    (dict(num_samples=0), "num_samples = 0; allowed: a positive integer or null"),
    (dict(batch_size=1.5), "batch_size = 1.5; allowed: a positive integer"),
    (dict(num_workers=-1), "num_workers = -1; allowed: an integer >= 0"),
])
def test_images_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MNISTImages(**kwargs)


def test_missing_mnist_names_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "empty" / "MNIST" / "raw")):
        MNISTImages(data_dir=str(tmp_path / "empty")).setup("fit")


def test_sae_trains_on_the_codes_and_reconstructs_them(tiny, tmp_path):
    # Phase 2 end to end on the tiny set: 3-d codes, 2 members; the iSAE (l1 = 0) with enough units
    # must reconstruct its inputs far better than their mean (explained variance from 0 to > 0.9).
    dm = Latents(vae=_vae(), data_dir=str(tiny), batch_size=10, centre=True)
    net = SparseAutoencoder(d=3, n=32, l1=[0.0, 0.0], init=Imbalance(v=[1.0, 4.0], sigma=0.3), lr=0.2)
    # 360 SGD steps on 60 codes, ~1 s; no validation (tested below)
    trainer = quiet(tmp_path, max_epochs=60, limit_val_batches=0)
    from zoo.metrics.sparsity import sparsity

    trainer.fit(net, dm)
    x = dm.codes
    with torch.no_grad():
        H, xh = net.hidden(x), net(x)
    # measured: 0.98 and 0.94 after training, from 0.06 and 0.23 at initialisation; 0.9 leaves room for
    # a different BLAS summation order while still failing an SAE that did not learn
    for e in range(2):
        assert sparsity(H[e], x, xh[e])["explained_variance"] > 0.9
