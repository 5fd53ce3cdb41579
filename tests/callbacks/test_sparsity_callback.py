"""callbacks.sparsity.Sparsity: the chunked counts equal zoo.metrics.sparsity on the whole activity
matrix, the half-space invariant of [S] Eq. 30 for bias-free units, what it logs and writes, bad input."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

from callbacks.sparsity import Sparsity
from helpers_fit import trainer as quiet
from zoo.init import Imbalance
from zoo.metrics.sparsity import sparsity
from zoo.models.sae import SparseAutoencoder


class Vectors(pl.LightningDataModule):
    """A fixed (N, d) data set with the ``samples(n)`` the callback reads (the first n rows)."""

    def __init__(self, x: torch.Tensor, batch_size: int = 16) -> None:
        super().__init__()
        self.x, self.batch_size = x, batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x), batch_size=self.batch_size)

    def samples(self, n: int | None) -> torch.Tensor:
        return self.x if n is None else self.x[:n]


def _net(**kw) -> SparseAutoencoder:
    args = dict(d=4, n=12, l1=[0.0, 0.05], init=Imbalance(v=[0.5, 4.0], sigma=0.5), grid=True, lr=0.05)
    args.update(kw)
    return SparseAutoencoder(**args)


@pytest.mark.parametrize("threshold", [0.0, 0.05])
def test_chunked_measures_equal_the_metric_on_the_whole_matrix(threshold, monkeypatch):
    monkeypatch.setattr("zoo.models.sae.CHUNK", 7)  # 7 does not divide 50: a ragged last chunk
    net = _net()
    with torch.no_grad():  # biases of both signs, so some units are dead or dense
        net.b_enc.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    out = net.measure(x, threshold, dense_threshold=0.4)  # SparseAutoencoder.measure feeds the Metrics by chunks
    with torch.no_grad():
        H, xh = net.hidden(x), net(x)
    for e in range(net.ensemble):
        # the metric's own definition, on the activity shifted by the threshold (H > t <=> H - t > 0)
        ref = sparsity(H[e] - threshold, x, xh[e], dense_threshold=0.4)
        for key in ("eq31", "l0", "dead_fraction", "dense_fraction"):
            assert float(out[key][e]) == pytest.approx(ref[key], abs=1e-12)  # integer counts: exact
        torch.testing.assert_close(out["density"][e], ref["density"])
        assert float(out["explained_variance"][e]) == pytest.approx(ref["explained_variance"], rel=1e-5)  # float32 x_hat
        assert float(out["mse"][e]) == pytest.approx(float((xh[e] - x).pow(2).mean()), rel=1e-5)
    assert 0 < float(out["dead_fraction"].max()) and 0 < float(out["dense_fraction"].max())  # not vacuous


def test_bias_free_units_fire_on_exactly_half_of_symmetric_data():
    # [S] Eq. 30 with no bias: relu(w.x) > 0 on exactly one of x and -x (w.x != 0 almost surely), so
    # every unit fires on N/2 points of a data set closed under x -> -x, whatever the weight scale:
    # Eq. 31 = N/2 and L0 = n/2 for every v. This is why the iSAE needs its biases to become sparse.
    half = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    x = torch.cat([half, -half])
    net = SparseAutoencoder(d=4, n=16, init=Imbalance(v=[0.125, 1.0, 8.0], sigma=1e-3), bias=False)
    out = net.measure(x)
    assert out["eq31"].eq(40).all() and out["density"].eq(0.5).all() and out["l0"].eq(8).all()


def test_callback_logs_every_member_histograms_and_the_figure(tmp_path):
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    net = _net()
    cb = Sparsity(every_n_steps=2, window=32)
    trainer = quiet(tmp_path, logger=True, callbacks=[cb], existing=("sparsity_vs_v.png",))
    trainer.fit(net, Vectors(x))  # 4 steps: measured at 0, 2, 4 and at the end (step 4 again)
    acc = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    for lbl in net.labels:
        for key in ("eq31", "l0", "dead_fraction", "dense_fraction", "mse", "explained_variance"):
            assert {ev.step for ev in acc.Scalars(f"sparsity/{key}/{lbl}")} == {0, 2, 4}
        assert f"sparsity/density/{lbl}" in tags["histograms"]
    # the last value logged is the measure of the trained net on the first 32 points, recomputed here
    with torch.no_grad():
        ref = [sparsity(h)["eq31"] for h in net.hidden(x[:32])]
    for e, lbl in enumerate(net.labels):
        assert acc.Scalars(f"sparsity/eq31/{lbl}")[-1].value == pytest.approx(ref[e], abs=1e-5)
    folder = tmp_path / "tb" / "version_0"
    assert (folder / "sparsity_vs_v.png").read_bytes() == b"a user's file"  # never overwritten
    assert (folder / "sparsity_vs_v_1.png").stat().st_size > 1000


def test_a_dropped_member_is_no_longer_logged(tmp_path):
    """A member that diverged under on_divergence='drop' stops getting sparsity values (its figure
    point is blank); the others are logged as before."""
    x = 3 * torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    net = SparseAutoencoder(d=4, n=8, lr=0.01, seed=3, init=Imbalance(v=[1.0, 300.0, 2.0], sigma=0.3),
                            on_divergence="drop")
    cb = Sparsity(every_n_steps=2, window=32)
    trainer = quiet(tmp_path, logger=True, callbacks=[cb])
    with pytest.warns(RuntimeWarning, match="v=300 diverged"):
        trainer.fit(net, Vectors(x, batch_size=4))  # 16 steps; v = 300 diverges within the first 5
    acc = EventAccumulator(trainer.log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    steps = {lbl: {ev.step for ev in acc.Scalars(f"sparsity/eq31/{lbl}")} for lbl in net.labels}
    assert steps["v=1"] == steps["v=2"] == {0, 2, 4, 6, 8, 10, 12, 14, 16}
    assert max(steps["v=300"]) < 6 and 0 in steps["v=300"]
    assert torch.isnan(cb.last["eq31"][1]) and not torch.isnan(cb.last["eq31"][[0, 2]]).any()


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window = 0; allowed: a positive number of samples, or null"),
    (dict(threshold=-0.1), r"threshold = -0.1; allowed: a number >= 0 \(0 is \[S\] Eq. 30\)"),
    (dict(dense_threshold=1.0), "dense_threshold = 1.0; allowed"),
    (dict(every_n_steps=0), "every_n_steps = 0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sparsity(**kwargs)


def test_a_datamodule_without_samples_fails_before_training(tmp_path):
    net = _net()
    before = net.W_enc.detach().clone()
    loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=8)
    with pytest.raises(TypeError, match=r"needs a datamodule with samples\(n\)"):
        quiet(tmp_path, logger=True, callbacks=[Sparsity()]).fit(net, loader)
    assert torch.equal(net.W_enc.detach(), before)  # no step was taken
