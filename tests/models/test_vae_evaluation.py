"""validation_step / test_step of BetaVAE, BetaVAESweep and SparseAutoencoder: the logged test
metrics (torchmetrics Metrics, reduced over batches) equal a direct computation on the whole test
set; `lightning test --config C --ckpt_path last.ckpt` prints them; and the held-out loaders of the
datamodules neither overlap the training data nor disturb its stream."""
from __future__ import annotations

import pytest
import torch
import yaml

from tests.conftest import run_cli
from helpers_fit import trainer as fit_trainer
from tests.helpers_vae import TinySquares
from zoo.init import Gain, Imbalance
from zoo.metrics.sparsity import sparsity
from zoo.models.sae import SparseAutoencoder
from zoo.models.vae import BetaVAE, BetaVAESweep, bernoulli_reconstruction, gaussian_kl

SMALL = dict(latent_dim=3, encoder_widths=[16, 8], decoder_widths=[8, 16], lr=1e-2)


def direct(vae: BetaVAE, x: torch.Tensor) -> dict[str, float]:
    """The test metrics of one VAE on all of x at once, from their definitions."""
    with torch.no_grad():
        mu, logvar = vae.encode(x)
        logits = vae.decode(mu)
    p, xf = torch.sigmoid(logits).flatten(1).double(), x.flatten(1).double()
    sse = (p - xf).pow(2).sum()
    return {"mse": float(sse / xf.numel()), "explained_variance": float(1 - sse / (xf - xf.mean(0)).pow(2).sum()),
            "reconstruction": float(bernoulli_reconstruction(logits, x).mean()),
            "kl": float(gaussian_kl(mu, logvar).sum(-1).mean())}


def test_lightning_test_prints_the_metrics_of_the_checkpoint(in_tmp, capsys):
    config = {"seed_everything": 0,
              "model": {"class_path": "zoo.models.vae.BetaVAE", "init_args": SMALL},
              "data": {"class_path": "tests.helpers_vae.TinySquares", "init_args": {"batch_size": 16, "n_test": 40}},
              "trainer": {"max_steps": 3, "accelerator": "cpu", "enable_progress_bar": False,
                          "enable_model_summary": False}}
    (in_tmp / "tiny.yaml").write_text(yaml.safe_dump(config))
    fit = run_cli("fit", "--config", "tiny.yaml")
    ckpt = in_tmp / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert fit.trainer.global_step == 3 and ckpt.is_file()
    capsys.readouterr()
    cli = run_cli("test", "--config", "tiny.yaml", "--ckpt_path", str(ckpt))
    printed = capsys.readouterr().out
    trained = BetaVAE.load_from_checkpoint(ckpt, weights_only=True)
    dm = TinySquares(n_test=40)
    x = torch.cat([b[0] for b in dm.test_dataloader()])
    expected = direct(trained, x)
    for name, value in expected.items():
        # 40 points in batches of 16, 16, 8: a mean of batch means would differ; float32 network
        assert float(cli.trainer.callback_metrics[f"test/{name}"]) == pytest.approx(value, rel=1e-5)
        assert f"test/{name}" in printed
    assert trained.samples_seen == 3 * 16  # counted in training, restored from the checkpoint


def test_a_sweep_tests_every_member(tmp_path):
    sweep = BetaVAESweep(init_encoder=Gain(g=[0.5, 2.0]), seeds=[0], **SMALL)
    dm = TinySquares(n_test=24)
    trainer = fit_trainer(tmp_path, logger=True, max_steps=2)
    trainer.fit(sweep, datamodule=dm)
    assert sweep.samples_seen == 2 * 16
    trainer.test(sweep, datamodule=dm, verbose=False)
    x = torch.cat([b[0] for b in dm.test_dataloader()])
    per_member = [direct(m, x) for m in sweep.members]
    for name in ("mse", "explained_variance", "reconstruction", "kl"):
        for label, d in zip(sweep.labels, per_member):
            assert float(trainer.callback_metrics[f"test/{name}/{label}"]) == pytest.approx(d[name], rel=1e-5)
        mean = sum(d[name] for d in per_member) / 2
        assert float(trainer.callback_metrics[f"test/{name}"]) == pytest.approx(mean, rel=1e-5)
    assert per_member[0]["mse"] != pytest.approx(per_member[1]["mse"])  # the members differ: not vacuous


class Codes(TinySquares):
    """TinySquares' images flattened to vectors of 64: data for a SparseAutoencoder."""

    def test_dataloader(self):
        x, _ = self.sample(self.n_test, torch.Generator().manual_seed(self.seed + 1))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.flatten(1) - 0.1), batch_size=16)


def test_sae_test_metrics_are_firing_counts_and_reconstruction(tmp_path):
    net = SparseAutoencoder(d=64, n=12, l1=[0.0, 0.1], init=Imbalance(v=[0.5, 2.0], sigma=0.5), grid=True)
    with torch.no_grad():  # biases of both signs: some units dead, some dense
        net.b_enc.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    dm = Codes(n_test=40)
    trainer = fit_trainer(tmp_path, logger=True, max_steps=1)
    trainer.test(net, datamodule=dm, verbose=False)
    x = torch.cat([b[0] for b in dm.test_dataloader()])
    with torch.no_grad():
        H, x_hat = net.hidden(x), net(x)
    for e, label in enumerate(net.labels):
        ref = sparsity(H[e], x, x_hat[e])  # the measures on the whole matrix at once
        for name in ("eq31", "l0", "dead_fraction", "dense_fraction", "explained_variance"):
            assert float(trainer.callback_metrics[f"test/{name}/{label}"]) == pytest.approx(ref[name], rel=1e-5)
        assert float(trainer.callback_metrics[f"test/mse/{label}"]) == pytest.approx(
            float((x_hat[e] - x).pow(2).mean()), rel=1e-5)
    eq31 = [sparsity(h)["eq31"] for h in H]
    assert float(trainer.callback_metrics["test/eq31"]) == pytest.approx(sum(eq31) / len(eq31), rel=1e-6)
    assert len(set(eq31)) > 1


def test_shapes_held_out_points_are_fixed_and_leave_the_stream_alone(tmp_path):
    from datamodules.shapes import Shapes3D

    kw = dict(data_dir=str(tmp_path), generate=True, resolution=8, batch_size=8,
              subsample={"floor_hue": 5, "wall_hue": 5, "object_hue": 5, "scale": 4, "orientation": 7})
    dm = Shapes3D(val_size=6, **kw)
    dm.prepare_data()
    dm.setup("fit")
    val = torch.cat([b[1] for b in dm.val_dataloader()])
    train = torch.cat([b[1] for b in dm.train_dataloader()])
    flat = lambda f: set(dm.flat_index(f).tolist())  # noqa: E731
    assert len(flat(val)) == 6 and not flat(val) & flat(train) and len(flat(train)) == dm.num_points - 6
    assert torch.equal(torch.cat([b[1] for b in dm.test_dataloader()]), val)  # testing on the held-out points
    # without held-out points: test_size grid points of their own seed; the training stream as before
    a, b = Shapes3D(test_size=20, **kw), Shapes3D(test_size=20, **kw)
    a.setup("fit"), b.setup("fit")
    state = torch.get_rng_state()
    test_a = torch.cat([t[1] for t in a.test_dataloader()])
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is not drawn from
    assert test_a.shape == (20, 6) and torch.equal(test_a, torch.cat([t[1] for t in b.test_dataloader()]))
    for (xa, fa), (xb, fb) in zip(a.train_dataloader(), b.train_dataloader()):
        assert torch.equal(fa, fb)
