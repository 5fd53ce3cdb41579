"""The autoencoders across processes (issue 19): a ``BetaVAESweep`` and a ``SparseAutoencoder``
ensemble trained member-parallel by 2 CPU processes (gloo, ``--trainer.devices=2 --trainer.strategy=ddp``) equal the
single-process run bit for bit: the final checkpoint (every member's weights and Adam state, the
noise generator's state), the logged scalars and the figures. Each rank trains its own members on
the whole stream (zoo.training.distributed); the sweep's members draw their noise in turn from one
generator, so a rank also draws (and drops) the noise of the members it does not train.

Both runs use one thread per process: a float reduction split over another number of threads may
round otherwise (conv-free MLPs here, whose CPU kernels are deterministic at a fixed thread count).

Also here: one BetaVAE trained data-parallel (its metrics over every rank's images), training under
bf16 autocast, and MNIST extracted in ``prepare_data`` (once per node) with ``setup`` only reading.
The 2-process runs are forked from this process with the launcher's environment (tests/helpers_ddp.run_forked);
the quickstart's test in test_ddp_linear.py goes through Lightning's own launcher.
"""
from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from helpers_ddp import RANK_STATE, assert_one_set, fit_one, rank_states, run_forked
from helpers_fit import fit
from resume_harness import REPO, figures, scalars

from tests.helpers_mnist import SHARED_RAW, tiny_mnist

RECIPES = REPO / "recipes" / "specialisation"
slow = pytest.mark.slow


def _both(tmp: Path, args: list[str]) -> tuple[Path, Path]:
    """The run on 1 process (here, one thread) and on 2 (``devices=2``, forked, one thread each); their run folders."""
    return fit_one(tmp / "p1", *args), run_forked(tmp / "p2", *args)


def _checkpoint(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def _assert_equal_runs(one: Path, two: Path) -> dict:
    a, b = _checkpoint(one), _checkpoint(two)
    assert a["global_step"] == b["global_step"] > 0
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), f"weight {k} differs on 2 processes"
    # every parameter's optimizer state, from the rank that trained it
    sa, sb = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for i in sa:
        for key in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][key]), torch.as_tensor(sb[i][key])), f"optimizer {i}/{key}"
    assert scalars(one) == scalars(two)
    fa, fb = figures(one), figures(two)
    assert fa == fb
    for run in (one, two):  # written once, by rank 0: no name_1.png / name_1.csv beside a name.png
        names = sorted(p.name for p in run.iterdir() if p.suffix in (".png", ".csv"))
        assert not [n for n in names if Path(n).stem.rsplit("_", 1)[-1] == "1"], names
    return a


@pytest.fixture(scope="module")
def sweep_runs(tmp_path_factory):
    """fig4 shrunk: 3 members (uneven over 2 ranks: 2 + 1), 8x8 images, 6 steps, DCI at step 3 and at the end."""
    tmp = tmp_path_factory.mktemp("sweep")
    args = ["--config", str(RECIPES / "fig4_gain_dci.yaml"), "--trainer.max_steps=6",
            "--model.init_args.seeds=[0]", "--model.init_args.encoder_widths=[16,8]",
            "--model.init_args.decoder_widths=[8,16]", "--model.init_args.init.init_args.g=[0.3,1.0,3.0]",
            f"--data.init_args.data_dir={tmp / 'data'}", "--data.init_args.resolution=8",
            "--data.init_args.subsample=4", "--data.init_args.batch_size=16", "--data.init_args.val_size=32",
            "--trainer.val_check_interval=3", "--trainer.callbacks.init_args.n_train=60",
            "--trainer.callbacks.init_args.n_test=30", "--trainer.callbacks.init_args.n_estimators=3",
            "--trainer.callbacks.init_args.every_n_steps=3"]
    return _both(tmp, args)


@slow
def test_beta_vae_sweep_on_two_processes_equals_one(sweep_runs):
    one, two = sweep_runs
    ckpt = _assert_equal_runs(one, two)
    assert ckpt["reparameterisation_noise"].equal(_checkpoint(two)["reparameterisation_noise"])
    names = sorted(p.name for p in two.iterdir() if p.suffix in (".png", ".csv"))
    assert "fig4_gain_dci.csv" in names and "fig4_gain_dci.png" in names
    tags = scalars(two)
    assert len(tags["dci_final/disentanglement/g=0.3"]) == 1  # the final DCI, logged once
    assert [s for s, _ in tags["dci/disentanglement/g=3"]] == [3, 6]
    assert "val/reconstruction/g=1" in tags  # validation per member, gathered


@pytest.fixture(scope="module")
def sae_runs(tmp_path_factory):
    """fig13_isae shrunk: 3 SAEs (uneven: 2 + 1) with Adam (so its sharded state is checked too) on
    16-d codes of a random tiny VAE of tiny MNIST files; on_divergence 'drop' (its mask stays whole
    on every rank, from the gathered losses)."""
    tmp = tmp_path_factory.mktemp("sae")
    data = tiny_mnist(tmp / "mnist")
    args = ["--config", str(RECIPES / "fig13_isae.yaml"), "--trainer.max_steps=6",
            "--data.init_args.checkpoint=null", "--data.init_args.vae=zoo.models.vae.BetaVAE",
            "--data.init_args.vae.latent_dim=16", "--data.init_args.vae.encoder_widths=[8]",
            "--data.init_args.vae.decoder_widths=[8]", f"--data.init_args.data_dir={data}",
            "--data.init_args.batch_size=16", "--model.init_args.n=32", "--model.init_args.grid=false",
            "--model.init_args.l1=[0.0,0.001,0.001]", "--model.init_args.optimizer=adam",
            "--model.init_args.lr=0.01", "--model.init_args.init.init_args.v=[1.0,16.0,64.0]",
            "--model.init_args.on_divergence=drop",
            "--trainer.callbacks.init_args.window=40", "--trainer.callbacks.init_args.every_n_steps=4"]
    return _both(tmp, args)


@slow
def test_sparse_autoencoder_ensemble_on_two_processes_equals_one(sae_runs):
    one, two = sae_runs
    ckpt = _assert_equal_runs(one, two)
    assert ckpt["state_dict"]["W_enc"].shape[0] == 3  # the checkpoint holds every member
    assert "sparsity_vs_v.png" in [p.name for p in two.iterdir()]



# -- one SparseAutoencoder: nothing to shard, so data-parallel (EnsembleDDP shards 2 members or more) ------
SAE_ARGS = ["--config", str(RECIPES / "fig13_isae.yaml"), "--trainer.max_steps=4", "--trainer.val_check_interval=2",
            "--data.init_args.checkpoint=null", "--data.init_args.vae=zoo.models.vae.BetaVAE",
            "--data.init_args.vae.latent_dim=16", "--data.init_args.vae.encoder_widths=[8]",
            "--data.init_args.vae.decoder_widths=[8]", "--model.init_args.n=32", "--model.init_args.grid=false",
            "--model.init_args.l1=0.001", "--model.init_args.lr=0.01", "--model.init_args.init.init_args.v=4.0",
            "--trainer.callbacks=[]", "--trainer.log_every_n_steps=2"]


@slow
def test_one_sparse_autoencoder_trains_data_parallel_with_metrics_over_all_ranks(tmp_path):
    """One member on 2 processes: neither rank is left without members; each trains on its half of every
    batch (DDP averages the gradients) and validates on its half of the held-out codes, and the
    metrics sum both halves' states, so the logged values are those of all the held-out codes."""
    from datamodules.latents import Latents
    from zoo.models.sae import MEASURES, SparseAutoencoder
    from zoo.models.vae import BetaVAE

    data = tiny_mnist(tmp_path / "mnist")
    args = [*SAE_ARGS, f"--data.init_args.data_dir={data}"]
    one = fit_one(tmp_path / "p1", *args, "--data.init_args.batch_size=16", RANK_STATE)
    two = run_forked(tmp_path / "p2", *args, "--data.init_args.batch_size=8", RANK_STATE)
    assert_one_set(tmp_path / "p2", tmp_path / "p1")  # written once, by rank 0
    ckpt = _checkpoint(two)
    assert ckpt["global_step"] == 4 and ckpt["state_dict"]["W_enc"].shape[0] == 1
    # each rank trained on batches of 8 + 8 + 8 + 6 of its 30 codes: the run's 4 steps took all 60 (one
    # epoch), as the one-process run's 16 + 16 + 16 + 12; every rank counts the run's samples
    assert int(ckpt["state_dict"]["samples_seen_"]) == 60
    assert [s["samples_seen"] for s in rank_states(two)] == [60, 60] and rank_states(one, 1)[0]["samples_seen"] == 60
    logged, reference = scalars(two), scalars(one)
    assert logged.keys() == reference.keys()
    # the last validation, recomputed here from the final weights on all 30 held-out codes (the CLI's VAE:
    # the same arguments, its weights seeded by its own seed)
    codes = Latents(vae=BetaVAE(latent_dim=16, encoder_widths=[8], decoder_widths=[8]), data_dir=str(data)).held_out
    sae = SparseAutoencoder.load_from_checkpoint(two / "checkpoints" / "last.ckpt", map_location="cpu")
    whole, half = sae.measure(codes), sae.measure(codes[0::2])  # rank 0's half (DistributedSampler, in order)
    for name in MEASURES:
        step, value = logged[f"val/{name}"][-1]
        assert step == 4 and value == pytest.approx(float(whole[name]), rel=1e-5, abs=1e-7), name
    assert float(half["mse"]) != pytest.approx(float(whole["mse"]), rel=1e-3)  # the halves do differ
    # resumed on 2 processes from the count saved: 2 more steps of 8 + 8 samples on each rank
    resumed = run_forked(tmp_path / "p2", *args, "--data.init_args.batch_size=8", RANK_STATE, "--trainer.max_steps=6",
                         "--ckpt_path=last")
    assert int(_checkpoint(resumed)["state_dict"]["samples_seen_"]) == 60 + 2 * 16
    assert [s["samples_seen"] for s in rank_states(resumed)] == [92, 92]


# -- one BetaVAE, data-parallel (plain DDP: each rank its share of every batch, gradients averaged) ----
@pytest.fixture(scope="module")
def data_parallel_runs(tmp_path_factory):
    """fig13_vae_mnist shrunk: 256 real MNIST images, 2 epochs; 2 processes of batch 16 against 1 of batch 32."""
    if SHARED_RAW is None:
        pytest.skip("the real MNIST files (../shared/data/MNIST/raw) are not here")
    tmp = tmp_path_factory.mktemp("dp")
    args = ["--config", str(RECIPES / "fig13_vae_mnist.yaml"), f"--data.init_args.data_dir={SHARED_RAW.parents[1]}",
            "--data.init_args.num_samples=256", "--model.init_args.encoder_widths=[32]",
            "--model.init_args.decoder_widths=[32]", "--trainer.max_epochs=2"]
    fit_one(tmp / "p1", *args, "--data.init_args.batch_size=32")
    run_forked(tmp / "p2", *args, "--data.init_args.batch_size=16")
    return tmp


@slow
def test_one_beta_vae_trains_data_parallel_with_metrics_over_all_ranks(data_parallel_runs):
    from datamodules.mnist_images import MNISTImages
    from zoo.models.vae import BetaVAE

    tmp = data_parallel_runs
    assert [p.name for p in (tmp / "p2/checkpoints/fig13").iterdir()] == ["vae_mnist.ckpt"]  # once, by rank 0
    one, two = (scalars(tmp / f"p{n}/lightning_logs/version_0") for n in (1, 2))
    # 2 epochs of the 256 training images: 16 steps of 32 in one process, of 16 + 16 on two
    assert [int(_checkpoint(tmp / f"p{n}/lightning_logs/version_0")["state_dict"]["samples_seen_"])
            for n in (1, 2)] == [512, 512]
    # the metrics are over all 256 held-out images, not rank 0's half: recomputed here from the final weights
    vae = BetaVAE.load_from_checkpoint(tmp / "p2/lightning_logs/version_0/checkpoints/last.ckpt", map_location="cpu")
    dm = MNISTImages(data_dir=str(SHARED_RAW.parents[1]), num_samples=256)
    out = vae.eval().evaluate(dm.held_out)
    mse = (out["x_hat"].double() - dm.held_out.double()).pow(2).mean()
    assert two["val/mse"][-1][1] == pytest.approx(float(mse), rel=1e-5)
    assert two["val/reconstruction"][-1][1] == pytest.approx(float(out["reconstruction"].double().mean()), rel=1e-5)
    # Same init, lr, steps and images per step (32): the runs differ only in how each step's images
    # are drawn (and their noise), which moves the result as a different data order does; two
    # 1-process runs with data seeds 0 and 1 end 0.8 % of their progress apart (measured). The
    # progress is from the untrained loss, 784 ln 2 (the init's logits are ~0).
    start = 784 * math.log(2)
    progress = [start - run["val/reconstruction"][-1][1] for run in (one, two)]
    assert progress[0] > 1 and abs(progress[1] - progress[0]) <= 0.1 * progress[0], progress


# -- bf16 autocast (precision="bf16-mixed"; CPUs support it) -------------------------------------------
class _Losses(pl.Callback):
    """Every training step's loss, as the module returned it."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))


def _fit_losses(tmp_path, make_model, data, precision: str, steps: int = 3) -> list[float]:
    torch.manual_seed(0)  # the VAE's noise starts from the global generator's state
    record = _Losses()
    fit(make_model(), data, tmp_path, callbacks=[record], max_steps=steps, precision=precision)
    return record.losses


# Under autocast only the matmuls' inputs and outputs are rounded to bf16 (8 significant bits, 2^-8
# relative); the losses' reductions (BCE, sums, means) run in fp32, so the rounding errors of the
# many summed terms average out: a loss within one bf16 rounding of fp32's (measured: 1e-5 to 1e-4
# over three Adam steps) says every term is there in the right dtype; a wrong cast (the noise or the
# logits in the wrong dtype, a term dropped) moves it by far more.
BF16_RTOL = 2.0 ** -8


def test_beta_vae_sweep_trains_under_bf16_autocast_close_to_fp32(tmp_path):
    from tests.helpers_vae import TinySquares
    from zoo.models.vae import BetaVAESweep

    def make():
        return BetaVAESweep(seeds=[0, 1], encoder_widths=[32, 16], decoder_widths=[16, 32], lr=1e-3, latent_dim=4)

    data = TinySquares(batch_size=16)
    full = _fit_losses(tmp_path / "fp32", make, data, "32-true")
    half = _fit_losses(tmp_path / "bf16", make, data, "bf16-mixed")
    assert len(full) == len(half) == 3 and all(map(math.isfinite, half))
    assert half != full  # autocast did act
    for a, b in zip(full, half):
        assert abs(b - a) <= BF16_RTOL * abs(a), (full, half)


def test_sparse_autoencoder_trains_under_bf16_autocast_close_to_fp32(tmp_path):
    from torch.utils.data import DataLoader, TensorDataset

    from zoo.init import Imbalance
    from zoo.models.sae import SparseAutoencoder

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(x), batch_size=16)

    def make():
        return SparseAutoencoder(d=8, n=32, l1=[0.0, 0.01], init=Imbalance(v=[1.0, 4.0], sigma=0.1), lr=1e-3,
                                 optimizer="adam")

    full = _fit_losses(tmp_path / "fp32", make, data, "32-true")
    half = _fit_losses(tmp_path / "bf16", make, data, "bf16-mixed")
    assert len(half) == 3 and all(map(math.isfinite, half)) and half != full
    for a, b in zip(full, half):
        assert abs(b - a) <= BF16_RTOL * abs(a), (full, half)


# -- data written once: prepare_data (one process per node; the others wait), setup only reads --------
def test_mnist_is_extracted_in_prepare_data_and_setup_only_reads(tmp_path, monkeypatch):
    from datamodules import mnist_files
    from datamodules.latents import Latents
    from zoo.models.vae import BetaVAE

    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "cache"))
    root = tiny_mnist(tmp_path / "data", gz=True)
    raw = root / "MNIST" / "raw"
    monkeypatch.setattr(mnist_files, "MNIST_FILES", {f: mnist_files.md5_of(raw / (f + ".gz"))
                                                     for f in mnist_files.MNIST_FILES})  # the tiny files pass
    dm = Latents(vae=BetaVAE(latent_dim=2, encoder_widths=[4], decoder_widths=[4]), data_dir=str(root))
    dm.prepare_data()
    assert len(list((tmp_path / "cache").glob("MNIST/*/*-ubyte"))) == 4
    monkeypatch.setattr(mnist_files.gzip, "open", lambda *a, **k: pytest.fail("setup extracted"))
    monkeypatch.setattr(mnist_files, "atomic_path", lambda *a, **k: pytest.fail("setup wrote"))
    dm.setup("fit")
    # pixel (0, 1) of tiny image k is k: every training image, in file order, was read
    assert dm.images.images[:, 0, 0, 1].mul(255).round().long().tolist() == list(range(60))
    assert dm.codes.shape == (60, 2)
