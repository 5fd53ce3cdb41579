"""Every module fitted on every accelerator present matches the CPU run (issue 19, item 5).

Each case fits one of the zoo's modules for a few steps on its own datamodule (tiny sizes) with
validation on, once on the CPU (the reference) and once on each accelerator present: "cpu"
always (then the two CPU runs must agree bit for bit: the fit is deterministic), "cuda" when
``torch.cuda.is_available()`` (skipped otherwise). On an accelerator the module must hold every
parameter and buffer on that device at the end of training (tensors created where the module
lives), and its weights and logged scalars (training, validation and test) must equal the CPU
run's within float tolerance: a float32 sum of
``k`` terms is reassociated on a GPU (other reduction trees, fused multiply-add), an error of
about ``k * 2**-24`` relative per reduction; the networks here sum over at most ~100 terms and
take at most a few dozen steps, so the drift stays below 1e-4 relative, which ``RTOL``/``ATOL``
allow with a margin (TF32 is off: the zoo never enables it, and Lightning leaves it off).
"""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import REPO, recipe_phase_1, recipe_smoke_args, run_cli
from tests.helpers_mnist import copy_real_mnist

RTOL, ATOL = 1e-4, 1e-5

ACCELERATORS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                             reason="no CUDA device on this machine")),
]



class Vectors(pl.LightningDataModule):
    """Gaussian vectors (n, d) in shuffled minibatches, the same points for validation: the
    SparseAutoencoder's input (it reads ``(B, d)`` batches)."""

    def __init__(self, d: int = 6, n: int = 48, batch_size: int = 16) -> None:
        super().__init__()
        self.x = torch.randn(n, d, generator=torch.Generator().manual_seed(5))
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x), batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(0))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x), batch_size=self.batch_size)


def deep_linear(tmp_path):
    from datamodules import SemanticHierarchy
    from zoo import DeepLinearNet
    from zoo.init import LambdaBalanced

    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-2.0, 0.0, 2.0], scale=0.1), lr=0.05,
                        task_aligned=True, steps_per_batch=3)
    return net, SemanticHierarchy(batches_per_epoch=4), 6


def student(tmp_path):
    from datamodules import TeacherStudent
    from zoo import MultiHeadStudent
    from zoo.init import Gaussian, Polar

    net = MultiHeadStudent(d=20, activation="erf", eta=0.5, init_w=Gaussian(sigma=[0.5, 1.0]),
                           init_heads=Polar(r=1.0, theta=[0.1, 0.5]))
    # the task switch (at step 40 of 80) falls inside the fit
    return net, TeacherStudent(d=20, num_steps=80, steps_per_batch=20, switch_step=40, num_test=50), 4


def classifier(tmp_path):
    from datamodules.mnist import MNISTContinual
    from tests.helpers_mnist import tiny_mnist
    from zoo.models.classifier import MultiHeadClassifier
    from zoo.training.ewc import EWC

    dm = MNISTContinual(str(tiny_mnist(tmp_path / "mnist")), shared=[0, 5], batch_size=8, steps=[2, 2], seed=0)
    # EWC: the Fisher is computed at the task switch, on the module's device
    return MultiHeadClassifier(hidden=16, n_classes=5, ewc=EWC(xi=1.0, samples=20)), dm, 4


def gdln(tmp_path):
    from datamodules import XorMargin
    from zoo.models.gdln import GDLN
    from zoo.init import Gaussian

    net = GDLN(gating="xor", n_hidden=8, init=Gaussian(sigma=0.1), ensemble=2, lr=0.2, epochs_per_step=5)
    return net, XorMargin(Delta=[0.3, 1.5]), 4


def relu_net(tmp_path):
    from datamodules import Contexts
    from zoo.models.gdln import ReLUNet
    from zoo.init import Gaussian

    return ReLUNet(hidden=[12, 6], init=Gaussian(sigma=0.1), ensemble=2, lr=0.1, epochs_per_step=5), Contexts(3, "same"), 4


def comparison(tmp_path):
    from datamodules import XorMargin
    from zoo.models.gdln import GDLN, Comparison, ReLUNet
    from zoo.init import Gaussian

    kw = dict(init=Gaussian(sigma=0.1), ensemble=2, lr=0.2)
    models = [ReLUNet(hidden=[8], **kw), GDLN(gating="xor", n_hidden=8, **kw)]
    return Comparison(models, names=["relu", "xor"], epochs_per_step=5), XorMargin(Delta=[0.3, 1.5]), 3


def beta_vae(tmp_path):
    from tests.helpers_vae import TinySquares
    from zoo.models.vae import BetaVAE

    net = BetaVAE(latent_dim=3, lr=1e-3, encoder_widths=[16], decoder_widths=[16])
    return net, TinySquares(batch_size=16, n_train=48), 3


def beta_vae_sweep(tmp_path):
    from tests.helpers_vae import TinySquares
    from zoo.init import Gain
    from zoo.models.vae import BetaVAESweep

    net = BetaVAESweep(init_encoder=Gain(g=[0.5, 2.0]), seeds=[0, 1], latent_dim=3, lr=1e-3,
                       encoder_widths=[16], decoder_widths=[16])
    return net, TinySquares(batch_size=16, n_train=48), 3


def sae(tmp_path):
    from zoo.init import Imbalance
    from zoo.models.sae import SparseAutoencoder

    net = SparseAutoencoder(d=6, n=12, l1=[0.0, 0.05], init=Imbalance(v=[1.0, 2.0], sigma=0.3), lr=0.1)
    return net, Vectors(d=6), 3


CASES = {f.__name__: f for f in (deep_linear, student, classifier, gdln, relu_net, comparison, beta_vae, beta_vae_sweep, sae)}


class Record(pl.Callback):
    """Keeps the module's state at the start of training (weights built at setup included) and
    where its tensors are at the end (before the Trainer's teardown takes the module back to the CPU)."""

    def on_train_start(self, trainer, pl_module) -> None:
        pl_module.state_at_start = state(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.devices_at_end = {n: t.device.type for n, t in [*pl_module.named_parameters(), *pl_module.named_buffers()]}


def fit(case: str, accelerator: str, tmp_path, precision: str = "32-true") -> tuple[pl.LightningModule, dict[str, torch.Tensor]]:
    """Fit ``case`` for its few steps on ``accelerator``; returns the module and the logged
    scalars (CPU copies)."""
    pl.seed_everything(0, verbose=False)  # the VAE's reparameterisation noise starts from the global seed
    net, dm, steps = CASES[case](tmp_path)
    trainer = pl.Trainer(accelerator=accelerator, devices=1, precision=precision, max_steps=steps, max_epochs=-1,
                         logger=CSVLogger(tmp_path), callbacks=[Record()],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, val_check_interval=None, check_val_every_n_epoch=1,
                         default_root_dir=tmp_path)
    trainer.fit(net, datamodule=dm)
    logged = {k: v.detach().cpu() for k, v in trainer.callback_metrics.items() if isinstance(v, torch.Tensor)}
    if type(dm).test_dataloader is not pl.LightningDataModule.test_dataloader:  # evaluation on the device too
        trainer.test(net, datamodule=dm, verbose=False)
        logged.update({k: v.detach().cpu() for k, v in trainer.callback_metrics.items() if k.startswith("test")})
    return net, logged


def state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in net.state_dict().items() if isinstance(v, torch.Tensor)}


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    """The CPU reference of each case, fitted once per module of tests."""
    cache: dict[str, tuple[dict, dict]] = {}

    def get(case: str):
        if case not in cache:
            with torch.random.fork_rng():
                before = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    net, logged = fit(case, "cpu", tmp_path_factory.mktemp(f"ref-{case}"))
                finally:
                    torch.set_num_threads(before)
            cache[case] = (state(net), logged)
        return cache[case]

    return get


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("case", list(CASES))
def test_fit_on_the_accelerator_equals_the_cpu_fit(case, accelerator, cpu_runs, tmp_path):
    ref_state, ref_logged = cpu_runs(case)
    net, logged = fit(case, accelerator, tmp_path)
    device_type = "cuda" if accelerator == "cuda" else "cpu"
    # every tensor of the module lived where the module was put, buffers created during setup included
    assert net.devices_at_end and set(net.devices_at_end.values()) == {device_type}, \
        f"{case}: {sorted(n for n, d in net.devices_at_end.items() if d != device_type)} not on {device_type}"
    if hasattr(net, "samples_counted"):  # zoo.training.progress: the host count is the buffer's
        assert net.samples_seen == int(net.samples_seen_) > 0
    got = state(net)
    assert got.keys() == ref_state.keys()
    assert set(logged) == set(ref_logged) and logged, f"{case}: logged {sorted(logged)} vs {sorted(ref_logged)}"
    for kind, ours, theirs in (("weight", got, ref_state), ("logged scalar", logged, ref_logged)):
        for name, a in ours.items():
            b = theirs[name]
            if accelerator == "cpu":  # the same arithmetic twice: the same bits
                assert torch.equal(a, b), f"{case}: {kind} {name} differs between two CPU fits"
            elif a.is_floating_point():
                assert torch.allclose(a.double(), b.double(), rtol=RTOL, atol=ATOL, equal_nan=False), \
                    f"{case}: {kind} {name}: max |cuda - cpu| = {float((a.double() - b.double()).abs().max()):.3g}"
            else:
                assert torch.equal(a, b), f"{case}: {kind} {name} (integer) differs from the CPU fit"
    # the fit trained: a weight left its value at the start (a fit that did nothing would pass the rest)
    assert any(not torch.equal(got[k], v) for k, v in net.state_at_start.items() if v.is_floating_point()), \
        f"{case}: no weight changed during the fit"


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("case", ["beta_vae", "beta_vae_sweep", "sae"])
def test_bf16_mixed_trains_the_image_models_close_to_float32(case, accelerator, cpu_runs, tmp_path):
    """``precision="bf16-mixed"`` (autocast; CPU and CUDA both have it): weights stay float32, the
    losses stay finite and within 3% of the float32 run's. bfloat16 keeps 8 significant bits, a
    relative rounding of 2**-9 per product; a few steps of sums over <= 64 terms move the loss by
    ~0.1-1% (measured 0.1% for the VAE, 0.6% for the SAE on the CPU)."""
    _, ref = cpu_runs(case)
    net, logged = fit(case, accelerator, tmp_path, precision="bf16-mixed")
    assert all(p.dtype == torch.float32 for p in net.parameters())
    for name in ("loss", "reconstruction"):
        assert torch.isfinite(logged[name]) and float(logged[name]) == pytest.approx(float(ref[name]), rel=3e-2)
    # autocast did run in bfloat16: the bits differ from the float32 run's
    assert any(not torch.equal(logged[k], ref[k]) for k in ("loss", "reconstruction"))


def test_samples_seen_is_read_from_the_host_and_follows_a_loaded_state():
    from zoo.models.sae import SparseAutoencoder

    a, b = SparseAutoencoder(d=2, n=3), SparseAutoencoder(d=2, n=3)
    a.count_samples(5)
    a.count_samples(7)
    assert a.samples_seen == int(a.samples_seen_) == 12
    b.load_state_dict(a.state_dict())  # a checkpoint, a resumed run
    assert b.samples_seen == 12
    b.count_samples(1)
    assert int(b.state_dict()["samples_seen_"]) == 13


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_a_full_batch_goes_to_the_device_once(accelerator, tmp_path):
    """Full-batch gradient descent (datamodules.regression): every training and validation step
    receives the same device tensors, not a new copy of the data set."""
    seen = []

    class Batches(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(("train", batch[0].device.type, batch[0].data_ptr(), batch[1].data_ptr()))

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            seen.append(("val", batch[0].device.type, batch[0].data_ptr(), batch[1].data_ptr()))

    net, dm, _ = deep_linear(tmp_path)
    pl.Trainer(accelerator=accelerator, devices=1, max_steps=6, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, callbacks=[Batches()]).fit(net, datamodule=dm)
    # 2 batches of 3 GD steps each, and the sanity check's validation
    assert [s[0] for s in seen] == ["val", "train", "train"]
    assert {s[1:] for s in seen} == {seen[0][1:]} and seen[0][1] == accelerator


RECIPES = sorted((REPO / "recipes").rglob("*.yaml"))


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the CPU runs are tests/project/test_recipes.py)")
@pytest.mark.parametrize("recipe", RECIPES, ids=[str(p.relative_to(REPO / "recipes")) for p in RECIPES])
def test_recipe_runs_on_the_gpu(recipe, in_tmp):
    """Every recipe's smoke run (its callbacks, figures and files included) with
    ``--trainer.accelerator=gpu``, as a user would start it on a GPU machine."""
    if "# needs-data: MNIST" in recipe.read_text() and not copy_real_mnist(in_tmp):
        pytest.skip("the real MNIST files (../shared/data/MNIST/raw) are not here")
    on_gpu = ["--trainer.enable_progress_bar=false", "--trainer.accelerator=gpu", "--trainer.devices=1"]
    if (phase_1 := recipe_phase_1(recipe)) is not None:  # its checkpoint, trained on the GPU too
        run_cli("fit", "--config", str(phase_1), *on_gpu, *recipe_smoke_args(phase_1))
    cli = run_cli("fit", "--config", str(recipe), *on_gpu, *recipe_smoke_args(recipe))
    assert cli.trainer.global_step > 0 and cli.trainer.strategy.root_device.type == "cuda"
    assert any(p.name.startswith("events.out.tfevents") for p in Path(cli.trainer.log_dir).iterdir())


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the CPU runs are tests/test_resume_*.py)")
def test_a_run_resumed_on_the_gpu_equals_the_uninterrupted_one(tmp_path):
    """The quickstart on the GPU, its checkpoint at step 90 kept and the run resumed from it as after
    a kill (every batch's loss logged, a validation every 3 batches): the final weights, scalars and
    figures equal the uninterrupted GPU run's bit for bit (seen on an H200, 2026-11-26)."""
    from resume_harness import assert_same_run, fit, resume_from_kept

    args = ["--config", str(REPO / "recipes/quickstart.yaml"), "--trainer.max_steps=120", "--trainer.log_every_n_steps=1",
            "--trainer.val_check_interval=3", "--trainer.accelerator=gpu", "--trainer.devices=1"]
    full = fit(tmp_path / "full", *args)
    assert_same_run(full, resume_from_kept(tmp_path / "killed", args, 90))


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_logged_values_reach_the_host_in_one_transfer_with_their_exact_values(accelerator):
    from zoo.training.logs import host_floats

    device = "cuda" if accelerator == "cuda" else "cpu"
    x = torch.randn(5, generator=torch.Generator().manual_seed(0))
    metrics = {"a": x[0].to(device), "b": x[1].to(device, torch.bfloat16), "c": torch.tensor(7, device=device),
               "d": 0.25, "e": x[2].double().to(device), "f": torch.tensor(True, device=device), "g": x[3]}
    got = host_floats(metrics)
    assert list(got) == list(metrics)  # in order
    assert got == {k: float(v) for k, v in metrics.items()}  # exactly float() of each
    assert all(type(v) is float for v in got.values())
    one_dtype = {"a": metrics["a"], "g": x[3].to(device), "h": x[4].reshape(1, 1).to(device)}  # stacked as they are
    assert host_floats(one_dtype) == {k: float(v) for k, v in one_dtype.items()}
    numbers = {"a": metrics["a"], "g": metrics["g"], "i": x[4].to(device)}  # 0-dim, one dtype (on CUDA, two devices)
    assert host_floats(numbers) == {k: float(v) for k, v in numbers.items()}
