"""Data-parallel runs (every process holds every member, each trains on its own part of the data)
stay one run: ``samples_seen`` is the run's count on every rank (zoo.training.progress) and an ensemble's
drop-outs are the same on every rank (zoo.training.divergence, ``replicated``), so the replicas stay equal.

The runs are 2 CPU processes forked from this one (tests/helpers_ddp; about 1 s each, in the slow
tier with the other multi-process runs); an ensemble trains data-parallel under Lightning's plain
DDP (``ddp_find_unused_parameters_false``; the zoo's ``ddp`` would shard its members).
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from helpers_ddp import RANK_STATE, assert_close_results, fit_one, in_process_group, rank_states, run_forked, scalars

from tests.helpers_mnist import tiny_mnist
from datamodules import WhitenedRegression
from datamodules.regression import EpochShuffle
from zoo.training.divergence import DivergenceError, drop_diverged
from zoo.models.sae import SparseAutoencoder

NAN = math.nan
PLAIN_DDP = "ddp_find_unused_parameters_false"


# -- drop_diverged(replicated=True): one decision from every rank's losses ---------------------------
def _drop_on_two_ranks(rank: int, world: int) -> dict:
    """Members a, b, c on both ranks; b's loss is NaN on rank 1 only (its part of the batch)."""
    losses = torch.tensor([1.0, 2.0, 3.0]) if rank == 0 else torch.tensor([1.0, NAN, 3.0])
    alive = torch.ones(3, dtype=torch.bool)
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["replicated"] = drop_diverged(losses, alive, step=5, labels=["a", "b", "c"], hint="", replicated=True).tolist()
    out["warned"] = [str(w.message) for w in caught]
    # every remaining member non-finite somewhere (a on rank 0, c on rank 1): the run stops, on both ranks
    last = torch.tensor([NAN, 1.0, 1.0]) if rank == 0 else torch.tensor([1.0, 1.0, NAN])
    try:
        drop_diverged(last, torch.tensor([True, False, True]), step=6, labels=["a", "b", "c"], hint="", replicated=True)
        out["error"] = None
    except DivergenceError as e:
        out["error"] = str(e)
    # the member-parallel meaning (each rank its own members) is kept without the flag
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["own"] = drop_diverged(losses, alive, step=5, labels=["a", "b", "c"], hint="").tolist()
    assert dist.get_world_size() == world
    return out


def test_replicated_members_drop_out_on_every_rank_alike(tmp_path):
    ranks = in_process_group(tmp_path, _drop_on_two_ranks)
    assert [r["replicated"] for r in ranks] == [[True, False, True]] * 2
    assert len(ranks[0]["warned"]) == 1 and "member(s) b diverged at step 5" in ranks[0]["warned"][0]
    assert ranks[1]["warned"] == []  # one warning for the run
    for r in ranks:
        assert r["error"] is not None and "at step 6 for every remaining ensemble member (a, c)" in r["error"]
    assert [r["own"] for r in ranks] == [[True, True, True], [True, False, True]]


# -- a SparseAutoencoder ensemble, data-parallel, whose member b diverges on rank 1's part only --------
class SAEWithNaNOnRankOne(SparseAutoencoder):
    """Member 1's loss (and so its gradient) is NaN on rank 1 at step 1: what a part of the batch
    that only one rank sees can do to one member."""

    def member_loss(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = super().member_loss(x)
        if dist.is_initialized() and dist.get_rank() == 1 and self.global_step == 1:
            poison = torch.ones_like(parts["loss"])
            poison[1] = NAN
            parts = {**parts, "loss": parts["loss"] * poison}
        return parts


def _sae_config(folder: Path) -> list[str]:
    data = tiny_mnist(folder / "mnist")
    return [f"--model={__name__}.SAEWithNaNOnRankOne", "--model.init_args.n=16",
            "--model.init_args.l1=[0.0,0.001,0.002]", "--model.init_args.lr=0.01",
            "--model.init_args.init=zoo.init.Imbalance", "--model.init_args.init.init_args.v=4.0",
            "--model.init_args.on_divergence=drop", "--seed_everything=0",
            "--data=datamodules.latents.Latents", "--data.init_args.checkpoint=null", f"--data.init_args.data_dir={data}",
            "--data.init_args.vae=zoo.models.vae.BetaVAE", "--data.init_args.vae.latent_dim=16",
            "--data.init_args.vae.encoder_widths=[8]", "--data.init_args.vae.decoder_widths=[8]",
            "--trainer.max_steps=3", "--trainer.logger=false", "--trainer.enable_checkpointing=false", RANK_STATE]


@pytest.mark.slow
def test_an_ensemble_on_two_processes_drops_a_member_on_both_and_stays_one_run(tmp_path):
    args = _sae_config(tmp_path)
    run = run_forked(tmp_path / "p2", *args, "--data.init_args.batch_size=8", strategy=PLAIN_DDP)
    ranks = rank_states(run)
    for k, v in ranks[0]["state_dict"].items():  # the replicas are one network
        assert torch.equal(ranks[1]["state_dict"][k], v), f"{k} differs between the ranks"
    for r in ranks:
        assert r["state_dict"]["alive"].tolist() == [True, False, True]
        assert r["state_dict"]["W_enc"].shape[0] == 3  # every member on every rank: not sharded
    # the run counted 3 steps of 8 + 8 samples on both ranks, as one process with batches of 16
    one = fit_one(tmp_path / "p1", *args, "--data.init_args.batch_size=16")
    assert [r["samples_seen"] for r in ranks] == [48, 48] == [rank_states(one, 1)[0]["samples_seen"]] * 2


# -- full-batch GD data-parallel: every rank's batch is the whole task, the run's step counts it once --
LINEAR = """\
seed_everything: 0
model: {class_path: DeepLinearNet, init_args: {dims: [4, 3, 4], lr: 0.05, steps_per_batch: 2,
        init: {class_path: LambdaBalanced, init_args: {lam: [1.0], scale: 0.1}}}}
data: {class_path: WhitenedRegression, init_args: {n_in: 4, n_out: 4, num_samples: 16, batches_per_epoch: 4}}
"""
XOR = """\
seed_everything: 0
model:
  class_path: zoo.models.gdln.GDLN
  init_args: {gating: xor, n_hidden: 4, init: {class_path: zoo.init.Gaussian, init_args: {sigma: 0.01}}, lr: 0.4,
              epochs_per_step: 5}
data:
  class_path: datamodules.xor.XorMargin
  init_args: {Delta: [1.0]}
"""


# (config, samples after 6 steps in one process): 3 batches of 2 steps on 16 samples; 6 epochs on XoR's 4 points
@pytest.mark.slow
@pytest.mark.parametrize("config, samples", [(LINEAR, 96), (XOR, 24)], ids=["deep_linear", "gdln"])
def test_one_full_batch_net_on_two_processes_counts_the_samples_of_one(tmp_path, config, samples):
    (tmp_path / "run.yaml").write_text(config)
    args = ["--config", str(tmp_path / "run.yaml"), "--trainer.max_steps=6", "--trainer.max_epochs=-1",
            "--trainer.logger=false", "--trainer.enable_checkpointing=false", RANK_STATE]
    ranks = rank_states(run_forked(tmp_path / "p2", *args))
    one = rank_states(fit_one(tmp_path / "p1", *args), 1)[0]
    assert [r["samples_seen"] for r in ranks] == [one["samples_seen"]] * 2 == [samples] * 2
    assert [r["epoch"] for r in ranks] == [one["epoch"]] * 2  # an epoch takes as many steps as in one process
    for k, v in one["state_dict"].items():  # every rank's gradient is the task's: the same run as on one
        for r in ranks:
            torch.testing.assert_close(r["state_dict"][k], v, rtol=1e-6, atol=1e-7, msg=k)


# -- minibatch SGD of one DeepLinearNet, data-parallel: each rank deals itself its part of each epoch --------
MINIBATCH = """\
seed_everything: 0
model: {class_path: DeepLinearNet, init_args: {dims: [4, 3, 4], lr: 0.05, steps_per_batch: 2,
        init: {class_path: LambdaBalanced, init_args: {lam: [1.0], scale: 0.1}}}}
data: {class_path: WhitenedRegression, init_args: {n_in: 4, n_out: 4, num_samples: 16}}
"""


def _minibatch_args(folder: Path, *extra: str) -> list[str]:
    (folder / "run.yaml").write_text(MINIBATCH)
    return ["--config", str(folder / "run.yaml"), "--trainer.max_epochs=-1", "--trainer.log_every_n_steps=1", RANK_STATE,
            *extra]


@pytest.mark.slow
def test_minibatches_on_two_processes_train_as_one_process_with_both_parts(tmp_path):
    """Batches of 4 on each of 2 ranks are one process's batches of 8 (16 samples: 2 batches an
    epoch, so 3 batches cross into the second epoch); a checkpoint after the first batch, mid-epoch,
    resumes on 2 processes to the uninterrupted run."""
    args = _minibatch_args(tmp_path, "--trainer.max_steps=6")
    two = run_forked(tmp_path / "p2", *args, "--data.init_args.batch_size=4", timeout=120)
    one = fit_one(tmp_path / "p1", *args, "--data.init_args.batch_size=8")
    full = rank_states(two)
    assert [r["samples_seen"] for r in full] == [6 * 8] * 2 == [rank_states(one, 1)[0]["samples_seen"]] * 2
    for k, v in full[0]["state_dict"].items():
        assert torch.equal(full[1]["state_dict"][k], v), f"{k} differs between the ranks"
    # the mean of the two parts' mean gradients is the whole batch's, summed in another order; the
    # logged loss is the whole batch's too
    assert_close_results(one, two, rtol=1e-6, atol=1e-7)
    assert len(scalars(two)["loss"]) == 3
    half = _minibatch_args(tmp_path, "--trainer.max_steps=2", "--data.init_args.batch_size=4")
    run_forked(tmp_path / "resumed", *half, timeout=120)
    resumed = rank_states(run_forked(tmp_path / "resumed", *args, "--data.init_args.batch_size=4", "--ckpt_path", "last",
                                     timeout=120))
    for r, ref in zip(resumed, full):
        assert r["samples_seen"] == ref["samples_seen"]
        for k, v in ref["state_dict"].items():
            assert torch.equal(r["state_dict"][k], v), f"resumed: {k} differs from the uninterrupted run"


class NaNInRankOnesPart(WhitenedRegression):
    """A NaN target in the sample at position 1 of the first epoch's permutation: rank 1's first
    batch has it, rank 0's has not."""

    def make(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        X, Y = super().make(generator)
        Y[EpochShuffle(X.shape[0], self.seed).order()[1], 0] = NAN
        return X, Y


@pytest.mark.slow
def test_a_nan_in_one_ranks_part_stops_both_ranks_at_its_step(tmp_path):
    # one step a batch: rank 0's own loss is finite at step 0, only the ranks' mean says that the step diverged
    args = _minibatch_args(tmp_path, "--trainer.max_steps=4", "--data.init_args.batch_size=4",
                           f"--data={__name__}.NaNInRankOnesPart", "--model.init_args.steps_per_batch=1")
    with pytest.raises(AssertionError, match="exit") as failed:
        run_forked(tmp_path / "p2", *args, timeout=60)
    assert "did not finish" not in str(failed.value)
    for r in rank_states(tmp_path / "p2/lightning_logs/version_0"):
        assert r["error"].startswith("the loss is not finite at step 0 for ensemble member(s) member0: training diverged")


class PlainShuffledLoader(WhitenedRegression):
    """A user's own minibatches: a plain shuffled DataLoader, which Lightning deals out to the ranks
    with its own DistributedSampler."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.X, self.Y), batch_size=self.batch_size, shuffle=True)


@pytest.mark.slow
def test_a_users_loader_dealt_out_by_lightning_counts_both_parts(tmp_path):
    args = _minibatch_args(tmp_path, "--trainer.max_steps=6", "--data.init_args.batch_size=4", "--trainer.logger=false",
                           f"--data={__name__}.PlainShuffledLoader")
    ranks = rank_states(run_forked(tmp_path / "p2", *args, timeout=120))
    assert [r["samples_seen"] for r in ranks] == [6 * 8] * 2  # 3 batches of 2 steps on 4 + 4 samples
    for k, v in ranks[0]["state_dict"].items():
        assert torch.equal(ranks[1]["state_dict"][k], v), f"{k} differs between the ranks"
