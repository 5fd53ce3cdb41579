"""DCI, LatentTraversals, Reconstructions and SweepFigure ([S] Fig. 4): each fires when due, logs
what it says, and its numbers equal an independent computation."""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.vae import DCI, LatentTraversals, Reconstructions, SweepFigure
from helpers_fit import trainer as quiet
from tests.helpers_vae import TinySquares
from zoo.init import Gain
from zoo.metrics.dci import dci
from zoo.models.vae import BetaVAE, BetaVAESweep, bernoulli_reconstruction

SMALL = dict(latent_dim=3, encoder_widths=[16, 12, 8, 6], decoder_widths=[6, 8, 12, 16], lr=1e-2)
TINY_DCI = dict(n_train=200, n_test=100, n_estimators=5)  # a few hundred points: fast, still deterministic


def events(trainer) -> EventAccumulator:
    acc = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def image(acc: EventAccumulator, tag: str, i: int = -1) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(acc.Images(tag)[i].encoded_image_string)).convert("RGB"))


def tiled(images: torch.Tensor, rows: int) -> np.ndarray:
    """The expected grid, built by hand: (H, W, 3) with white 1-pixel gaps, row-major."""
    n, C, H, W = images.shape
    cols = -(-n // rows)
    grid = torch.ones(3, rows * (H + 1) + 1, cols * (W + 1) + 1)
    for k in range(n):
        r, c = divmod(k, cols)
        grid[:, 1 + r * (H + 1): 1 + r * (H + 1) + H, 1 + c * (W + 1): 1 + c * (W + 1) + W] = images[k].clamp(0, 1)
    return grid.permute(1, 2, 0).numpy()


class OracleVAE(BetaVAE):
    """Codes = the true factors read off the TinySquares image (a perfectly disentangled code)."""

    def codes(self, x):
        x = x[:, 0]
        rows = x.amax(2)[:, ::2].argmax(1).float()  # the square covers rows 2r, 2r+1
        cols = x.amax(1)[:, ::2].argmax(1).float()
        bright = (x.amax((1, 2)) > 0.75).float()
        return torch.stack([rows, cols, bright], 1)


def test_dci_fires_when_due_and_equals_a_direct_computation(tmp_path):
    vae, dm = BetaVAE(**SMALL), TinySquares()
    cb = DCI(every_n_steps=2, setting="fast", final="fast", **TINY_DCI)
    trainer = quiet(tmp_path, logger=True, max_steps=5, callbacks=[cb])
    trainer.fit(vae, datamodule=dm)
    acc = events(trainer)
    assert [e.step for e in acc.Scalars("dci/disentanglement")] == [2, 4]  # not at start, every 2 steps
    assert [e.step for e in acc.Scalars("dci_final/completeness")] == [5]
    # what the callback computed before it used DCIMetric: all training points, then all test points,
    # drawn from one generator seeded with random_state, encoded at once, scored by the pure function
    g = torch.Generator().manual_seed(0)
    (x_tr, f_tr), (x_te, f_te) = dm.sample(200, g), dm.sample(100, g)
    direct = dci(vae.codes(x_tr), f_tr, vae.codes(x_te), f_te, random_state=0, n_estimators=5)
    for key in ("disentanglement", "completeness", "informativeness_test_acc", "informativeness_train_acc"):
        assert acc.Scalars(f"dci_final/{key}")[-1].value == pytest.approx(direct[key], abs=1e-6)
        assert 0.0 <= direct[key] <= 1.0
    assert "dci/importance" in acc.Tags()["images"] and "dci_final/importance" in acc.Tags()["images"]


def test_dci_of_a_perfect_code_is_one(tmp_path):
    # codes equal to the factors: each code predicts one factor only, so D = C = 1 (up to the
    # trees' tiny importances on irrelevant codes) and every factor is predicted exactly
    vae = OracleVAE(**SMALL)
    trainer = quiet(tmp_path, logger=True, max_steps=1, callbacks=[DCI(every_n_steps=100, final="fast", **TINY_DCI)])
    trainer.fit(vae, datamodule=TinySquares())
    acc = events(trainer)
    assert acc.Scalars("dci_final/disentanglement")[-1].value > 0.99
    assert acc.Scalars("dci_final/completeness")[-1].value > 0.99
    assert acc.Scalars("dci_final/informativeness_test_acc")[-1].value == 1.0
    assert "dci/disentanglement" not in acc.Tags()["scalars"]  # never due in one step


def test_dci_rejects_bad_arguments():
    with pytest.raises(ValueError, match="setting"):
        DCI(setting="slow")
    with pytest.raises(ValueError, match="n_train"):
        DCI(n_train=1)
    with pytest.raises(ValueError, match="every_n_steps"):
        DCI(every_n_steps=0)


def test_latent_traversals_decode_one_latent_at_a_time(tmp_path):
    vae, dm = BetaVAE(**SMALL), TinySquares()
    cb = LatentTraversals(every_n_steps=3, steps=5, span=[-2.0, 2.0], seed=0)
    trainer = quiet(tmp_path, logger=True, max_steps=3, callbacks=[cb])
    (tmp_path / "tb" / "version_0" / "traversals.png").write_bytes(b"a user's file")
    trainer.fit(vae, datamodule=dm)
    acc = events(trainer)
    assert [e.step for e in acc.Images("traversals")] == [0, 3]
    got = image(acc, "traversals").astype(float) / 255
    # independent: decode the base code with latent i replaced by each value
    x, _ = dm.sample(1, torch.Generator().manual_seed(0))
    with torch.no_grad():
        mu, logvar = vae.encode(x)
        kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar)[0]
        rows = []
        for i in torch.argsort(kl, descending=True).tolist():
            z = mu.repeat(5, 1)
            z[:, i] = torch.linspace(-2, 2, 5)
            rows.append(torch.sigmoid(vae.decode(z)))
    expected = tiled(torch.cat(rows), rows=3)
    assert got.shape == (3 * 9 + 1, 5 * 9 + 1, 3)  # 8x8 images with 1-pixel gaps
    assert np.abs(got - expected).max() <= 1 / 255 + 1e-6  # PNG quantisation to 8 bits
    assert (tmp_path / "tb" / "version_0" / "traversals.png").read_bytes() == b"a user's file"
    assert (tmp_path / "tb" / "version_0" / "traversals_1.png").stat().st_size > 1000


def test_reconstructions_show_inputs_above_outputs(tmp_path):
    vae, dm = BetaVAE(**SMALL), TinySquares()
    trainer = quiet(tmp_path, logger=True, max_steps=2, callbacks=[Reconstructions(every_n_steps=2, n_images=4, seed=5)])
    trainer.fit(vae, datamodule=dm)
    acc = events(trainer)
    assert [e.step for e in acc.Images("reconstructions")] == [0, 2]
    got = image(acc, "reconstructions").astype(float) / 255
    x, _ = dm.sample(4, torch.Generator().manual_seed(5))
    with torch.no_grad():
        recon = torch.sigmoid(vae.decode(vae.encode(x)[0]))
    expected = tiled(torch.cat([x, recon]), rows=2)
    assert np.abs(got - expected).max() <= 1 / 255 + 1e-6


def test_sweep_figure_writes_png_and_table_from_the_dci_callback(tmp_path):
    sweep = BetaVAESweep(init_encoder=Gain(g=[0.5, 2.0]), seeds=[0, 1], **SMALL)
    dm = TinySquares()
    dci_cb = DCI(every_n_steps=100, final="fast", **TINY_DCI)
    fig = SweepFigure(n_points=64, seed=3)
    trainer = quiet(tmp_path, logger=True, max_steps=3, callbacks=[dci_cb, fig,
                                          LatentTraversals(every_n_steps=100, members=[{"g": 0.5, "seed": 0}])])
    trainer.fit(sweep, datamodule=dm)
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "fig4_gain_dci.png").stat().st_size > 10_000
    assert (folder / "traversals_g0.5_seed0.png").exists() and not (folder / "traversals_g2_seed0.png").exists()
    rows = list(csv.DictReader(open(folder / "fig4_gain_dci.csv")))
    assert [r["label"] for r in rows] == sweep.labels
    x, _ = dm.sample(64, torch.Generator().manual_seed(3))
    for r, (label, vae) in zip(rows, zip(sweep.labels, sweep.members)):
        final = dci_cb.final_scores(trainer, sweep)[label]  # cached: the same numbers the figure drew
        assert float(r["disentanglement"]) == pytest.approx(final["disentanglement"])
        with torch.no_grad():
            direct = bernoulli_reconstruction(vae.decode(vae.encode(x)[0]), x).mean().item()
        assert float(r["reconstruction"]) == pytest.approx(direct, rel=1e-5)
    acc = events(trainer)
    assert "dci_final/disentanglement/g=2,seed=1" in acc.Tags()["scalars"]
    means = acc.Scalars("fig4_gain_dci/reconstruction/g=0.5")[-1].value
    assert means == pytest.approx(np.mean([float(r["reconstruction"]) for r in rows[:2]]), rel=1e-5)


def test_sweep_figure_needs_a_dci_callback_and_a_sweep(tmp_path):
    trainer = quiet(tmp_path / "a", logger=True, max_steps=1, callbacks=[SweepFigure()])
    with pytest.raises(TypeError, match="DCI"):
        trainer.fit(BetaVAESweep(init_encoder=Gain(g=[1.0, 2.0]), seeds=[0], **SMALL), datamodule=TinySquares())
    trainer = quiet(tmp_path / "b", logger=True, max_steps=1, callbacks=[DCI(final="fast", **TINY_DCI), SweepFigure()])
    with pytest.raises(TypeError, match="BetaVAESweep"):
        trainer.fit(BetaVAE(**SMALL), datamodule=TinySquares())
    trainer = quiet(tmp_path / "c", logger=True, max_steps=1, callbacks=[LatentTraversals(members=[{"g": 9, "seed": 0}])])
    with pytest.raises(ValueError, match="no member has .*'g': 9"):
        trainer.fit(BetaVAESweep(init_encoder=Gain(g=[1.0, 2.0]), seeds=[0], **SMALL), datamodule=TinySquares())
