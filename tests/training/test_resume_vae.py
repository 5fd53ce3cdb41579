"""Exact resume of the autoencoder family: BetaVAESweep on Shapes3D (fig4_gain_dci), BetaVAE on MNIST
images (fig13_vae_mnist) and the SparseAutoencoder on VAE latents (fig13_isae, with a member that
diverges and drops out). Each is stopped by a smaller max_steps, or killed after a mid-run checkpoint
(SIGKILL of a subprocess; for the sweep in-process, a whole run put back to a checkpoint it kept),
then resumed with --ckpt_path last: the final weights, scalars and figures
equal those of the uninterrupted run bit for bit. Every budget spans several epochs and stops
mid-epoch, so the shuffled loaders must continue their epoch's permutation, and the VAEs'
reparameterisation noise must continue its stream.

The loaders are also checked without Lightning: state_dict mid-epoch, a fresh loader loads it and
serves the rest of the uninterrupted sequence, across epoch ends.
"""
from __future__ import annotations

import shutil

import pytest
import torch
from resume_harness import REPO, assert_same_run, checkpoint_step, fit, fit_killed, resume_from_kept, weights

from tests.helpers_mnist import SHARED_RAW

RECIPES = REPO / "recipes" / "specialisation"
slow = pytest.mark.slow
needs_mnist = pytest.mark.skipif(SHARED_RAW is None, reason="the real MNIST files (../shared/data/MNIST/raw) are not here")


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    raw = tmp_path_factory.mktemp("mnist") / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in SHARED_RAW.glob("*.gz"):
        shutil.copyfile(f, raw / f.name)
    return str(raw.parents[1])


def _reference(tmp_path_factory, args):
    import torch as _torch

    before = _torch.get_num_threads()
    _torch.set_num_threads(1)
    try:
        return args, fit(tmp_path_factory.mktemp("full"), *args)
    finally:
        _torch.set_num_threads(before)


def _stop_then_resume(reference, tmp_path, stop: int, total: int):
    args, full = reference
    fit(tmp_path, *args, f"--trainer.max_steps={stop}")
    ckpt = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert checkpoint_step(ckpt) == stop  # saved mid-epoch, where max_steps stopped it
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert not (tmp_path / "lightning_logs/version_1").exists()  # resumed into its own folder
    assert checkpoint_step(ckpt) == total
    assert_same_run(full, run, stop_step=stop)
    return run


def _kill_then_resume(reference, tmp_path, total: int):
    # every part on one thread, as the reference: a float sum split over threads may round otherwise
    args, full = reference
    step = fit_killed(tmp_path, *args)
    assert 0 < step < total
    run = fit(tmp_path, *args, "--ckpt_path", "last")
    assert_same_run(full, run)
    return run


# -- BetaVAESweep on generated 3dshapes-like data -------------------------------------------------------
# 216 grid points, batches of 16: 14 batches an epoch (the last one of 8), 40 steps = 2.9 epochs
FIG4_STEPS = 40


@pytest.fixture(scope="module")
def fig4(tmp_path_factory):
    data = tmp_path_factory.mktemp("shapes")
    args = ["--config", str(RECIPES / "fig4_gain_dci.yaml"), f"--trainer.max_steps={FIG4_STEPS}",
            "--model.init_args.seeds=[0]", "--model.init_args.encoder_widths=[16,8,8,8]",
            "--model.init_args.decoder_widths=[8,8,8,16]", "--model.init_args.init.init_args.g=[0.3,3.0]",
            f"--data.init_args.data_dir={data}", "--data.init_args.resolution=8", "--data.init_args.subsample=4",
            "--data.init_args.batch_size=16",
            "--trainer.callbacks.init_args.n_train=60", "--trainer.callbacks.init_args.n_test=30",
            "--trainer.callbacks.init_args.n_estimators=3", "--trainer.callbacks.init_args.every_n_steps=15"]
    return _reference(tmp_path_factory, args)


@pytest.mark.slow
def test_beta_vae_sweep_stop_by_max_steps_then_resume(fig4, tmp_path):
    _stop_then_resume(fig4, tmp_path, stop=19, total=FIG4_STEPS)  # mid-way through the second epoch


@slow
def test_beta_vae_sweep_resumed_from_a_mid_run_checkpoint(fig4, tmp_path):
    """As a run killed after its checkpoint at step 20 (mid-way through the second epoch, one of the
    tenths it saves at), in-process: the points logged after it are purged. The SIGKILL of a real
    process is the sparse autoencoder's test below."""
    args, full = fig4
    assert_same_run(full, resume_from_kept(tmp_path, args, 20))


@pytest.mark.slow
def test_a_checkpoint_without_the_noise_state_is_refused(fig4, tmp_path):
    """A VAE checkpoint saved before the noise had its own generator cannot resume exactly: the
    resumed run stops before its first batch, with a message, rather than train another run."""
    from zoo.models.vae import NOISE_KEY

    args, _ = fig4
    fit(tmp_path, *args, "--trainer.max_steps=5")
    ckpt = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    del state[NOISE_KEY]
    torch.save(state, ckpt)
    with pytest.raises(RuntimeError, match="no state of the reparameterisation noise"):
        fit(tmp_path, *args, "--ckpt_path", "last")
    assert checkpoint_step(ckpt) == 5  # nothing trained, nothing saved


# -- BetaVAE on MNIST images (the recipe keeps its own ModelCheckpoint and adds the RunCheckpoint) ------
# 256 images, batches of 32: 8 batches an epoch, 2 epochs
@pytest.fixture(scope="module")
def fig13_vae(tmp_path_factory, mnist_dir):
    args = ["--config", str(RECIPES / "fig13_vae_mnist.yaml"), f"--data.init_args.data_dir={mnist_dir}",
            "--data.init_args.num_samples=256", "--data.init_args.batch_size=32",
            "--model.init_args.encoder_widths=[32]", "--model.init_args.decoder_widths=[32]"]
    return _reference(tmp_path_factory, args)


@needs_mnist
@pytest.mark.slow
def test_beta_vae_stop_by_max_steps_then_resume(fig13_vae, tmp_path):
    run = _stop_then_resume(fig13_vae, tmp_path, stop=11, total=16)
    # the recipe's own checkpoint (phase 2's input) is the final model too
    own = torch.load(tmp_path / "checkpoints/fig13/vae_mnist.ckpt", map_location="cpu", weights_only=True)
    assert own["global_step"] == 16
    for k, v in weights(run).items():
        assert torch.equal(own["state_dict"][k], v)


# -- SparseAutoencoder on latents, one member diverging (on_divergence: drop) ---------------------------
# 256 codes, batches of 64: 4 batches an epoch, 30 steps = 7.5 epochs; v = 1e5 with l1 > 0 diverges at step 3
ISAE_STEPS = 30


@pytest.fixture(scope="module")
def fig13_isae(tmp_path_factory, mnist_dir):
    args = ["--config", str(RECIPES / "fig13_isae.yaml"), f"--trainer.max_steps={ISAE_STEPS}",
            "--data.init_args.checkpoint=null", "--data.init_args.vae=zoo.models.vae.BetaVAE",
            "--data.init_args.vae.latent_dim=16", "--data.init_args.vae.encoder_widths=[8]",
            "--data.init_args.vae.decoder_widths=[8]", f"--data.init_args.data_dir={mnist_dir}",
            "--data.init_args.num_samples=256", "--model.init_args.n=32",
            "--model.init_args.init.init_args.v=[1.0,16.0,100000.0]", "--model.init_args.on_divergence=drop",
            "--trainer.callbacks.init_args.window=128", "--trainer.callbacks.init_args.every_n_steps=7"]
    return _reference(tmp_path_factory, args)


def _dropped(run):
    alive = weights(run)["alive"]
    assert alive.tolist() == [True] * 5 + [False]  # v = 1e5, l1 = 0.001 dropped out at step 3 (members v-major)
    return alive


@needs_mnist
@pytest.mark.slow
def test_sparse_autoencoder_stop_by_max_steps_then_resume(fig13_isae, tmp_path):
    _dropped(fig13_isae[1])
    _dropped(_stop_then_resume(fig13_isae, tmp_path, stop=13, total=ISAE_STEPS))


@needs_mnist
@pytest.mark.slow
def test_sparse_autoencoder_resumed_from_an_epochs_end(fig13_isae, tmp_path):
    """The checkpoint at step 12 is saved at an epoch's end (4 batches an epoch), after its
    validation, under max_steps: Lightning resumes there by making a training iterator it drops,
    which drew from the shuffle's generator (datamodules.resumable undoes that); the run ends as
    the uninterrupted one (before the fix the next epoch trained on other batches)."""
    args, full = fig13_isae
    assert_same_run(full, resume_from_kept(tmp_path, args, 12))


@needs_mnist
@pytest.mark.slow
def test_sparse_autoencoder_kill_then_resume(fig13_isae, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _dropped(_kill_then_resume(fig13_isae, tmp_path, total=ISAE_STEPS))


# -- the loaders alone ---------------------------------------------------------------------------------
def _loader(kind: str, n: int = 50, batch_size: int = 8):
    from torch.utils.data import Dataset, TensorDataset

    from datamodules.resumable import ResumableLoader, shuffled_batches

    g = torch.Generator().manual_seed(3)
    if kind == "items":  # as MNISTImages / Latents: one index per item, the loader's generator is the shuffle's
        data = TensorDataset(torch.arange(n))
        return ResumableLoader(data, batch_sampler=shuffled_batches(n, batch_size, g), generator=g)

    class Whole(Dataset):  # as Shapes3D / DSprites: the dataset takes a batch's index list
        def __len__(self):
            return n

        def __getitem__(self, i):
            return (torch.as_tensor(i),)

    return ResumableLoader(Whole(), sampler=shuffled_batches(n, batch_size, g), batch_size=None)


def _batches(loader, epochs: int) -> list[list[int]]:
    return [b[0].tolist() for _ in range(epochs) for b in loader]


@pytest.mark.parametrize("kind", ["items", "batches"])
@pytest.mark.parametrize("stop", [0, 3, 7, 9, 14, 21])  # 7 batches an epoch (the last of 2): 7, 14, 21 = epoch ends
def test_loader_state_continues_the_uninterrupted_sequence(kind, stop):
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    n_epochs = 4
    expected = _batches(_loader(kind), n_epochs)
    plain = DataLoader(torch.arange(50), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3))
    if kind == "items":  # the same batches as the loaders it replaced
        assert expected == [b.tolist() for _ in range(n_epochs) for b in plain]
    else:
        old = BatchSampler(RandomSampler(range(50), generator=torch.Generator().manual_seed(3)), 8, drop_last=False)
        assert expected == [list(b) for _ in range(n_epochs) for b in old]
    first, seen, epoch = _loader(kind), [], iter([])
    while len(seen) < stop:  # as Lightning iterates: a new iterator per epoch, stopped after `stop` batches
        batch = next(epoch, None)
        if batch is None:
            epoch = iter(first)
            continue
        seen.append(batch[0].tolist())
    state = first.state_dict()
    resumed = _loader(kind)
    resumed.load_state_dict(state)
    rest = [b[0].tolist() for b in resumed]  # the rest of the epoch it stopped in (a whole one at an epoch end)
    rest += _batches(resumed, n_epochs - 1 - stop // 7)
    assert seen + rest == expected
    assert len(rest) == 7 * n_epochs - stop


@pytest.mark.parametrize("kind", ["items", "batches"])
@pytest.mark.parametrize("stop", [3, 7])  # mid-epoch, and an epoch's end
def test_an_iterator_dropped_before_its_first_batch_changes_nothing(kind, stop):
    """Resuming from a checkpoint saved at an epoch's end under max_steps, Lightning makes an iterator
    of the training loader and drops it unused (torch's iterator draws a seed from the loader's
    generator when it is made): the loader then serves the uninterrupted batches, and its state
    while that iterator was the last one made is the state it was loaded with."""
    expected = _batches(_loader(kind), 3)
    first = _loader(kind)
    it = iter(first)
    seen = [next(it)[0].tolist() for _ in range(stop)]
    state = first.state_dict()
    resumed = _loader(kind)
    resumed.load_state_dict(state)
    iter(resumed)  # made and dropped
    again = resumed.state_dict()
    assert again["served"] == state["served"] and torch.equal(again["generator"], state["generator"])
    rest = [b[0].tolist() for b in resumed] + _batches(resumed, 2 - stop // 7)
    assert seen + rest == expected


def test_resumable_loader_with_a_distributed_sampler():
    """Under DDP Lightning puts a DistributedSampler into ResumableBatches (it keeps BatchSampler's
    constructor for that): each rank's loader, stopped mid-epoch and restored into a fresh one, serves
    the rest of that rank's epoch, and the state of a loader without a generator is refused by one with."""
    import torch
    from torch.utils.data import DistributedSampler, TensorDataset

    from datamodules.resumable import ResumableBatches, ResumableLoader, shuffled_batches

    data = TensorDataset(torch.arange(23))

    def loader(rank):
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=5)
        sampler.set_epoch(3)
        return ResumableLoader(data, batch_sampler=ResumableBatches(sampler, 4))

    for rank in (0, 1):
        whole = [b[0].tolist() for b in loader(rank)]
        first = loader(rank)
        it = iter(first)
        served = [next(it)[0].tolist() for _ in range(2)]
        state = first.state_dict()
        assert state == {"generator": None, "served": 2}
        second = loader(rank)
        second.load_state_dict(state)
        assert served + [b[0].tolist() for b in second] == whole
    single = ResumableLoader(data, batch_sampler=shuffled_batches(23, 4, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="number of devices"):
        single.load_state_dict(state)
