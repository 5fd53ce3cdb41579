"""DeepLinearNet ensembles across processes (``zoo.training.distributed``, member-parallel): with 2 CPU
processes (Lightning's DDP launcher) or 2 simulated nodes of one process each, every rank trains
its slice of the members on the whole data, and the run equals the one-process run bit for bit:
final weights, every TensorBoard scalar, every figure, and one set of files (rank 1 writes
none). A checkpoint written by 2 processes resumes on 1 to the uninterrupted run's bits.

The ensembles here do not divide by 2 (E = 5: members 0-2 and 3-4; E = 3: 0-1 and 2), so the
uneven split is what is tested.
"""
from __future__ import annotations

import shutil

import pytest
import torch
from helpers_ddp import assert_one_set, assert_same_results, fit_one, run_forked, start_ddp
from resume_harness import REPO, assert_same_run, checkpoint_step

from zoo.training.distributed import member_bounds

# the quickstart (E = 5), with epochs of 50 steps so that a validation (gathered val/mse) falls in each part
QUICKSTART = ["--config", str(REPO / "recipes/quickstart.yaml"), "--data.init_args.batches_per_epoch=5"]

# E = 3 with the callbacks the quickstart lacks (RSM with theory, NTK distance with theory)
SMALL = """\
seed_everything: 0
model:
  class_path: DeepLinearNet
  init_args:
    dims: [4, 3, 4]
    init: {class_path: LambdaBalanced, init_args: {lam: [-1.0, 0.0, 1.0], scale: 0.1}}
    lr: 0.05
    steps_per_batch: 5
data:
  class_path: WhitenedRegression
  init_args: {n_in: 4, n_out: 4, num_samples: 8, batches_per_epoch: 2}
trainer:
  max_steps: 20
  log_every_n_steps: 1
  callbacks:
    - {class_path: RSM, init_args: {every_n_steps: 10}}
    - {class_path: NTKDistance, init_args: {every_n_steps: 5}}
    - {class_path: NetworkMap, init_args: {every_n_steps: 10}}
    - {class_path: Balance, init_args: {every_n_steps: 5}}
"""


@pytest.mark.parametrize("E, world", [(5, 2), (4, 2), (3, 3), (7, 3), (1000, 7)])
def test_member_bounds_tile_the_ensemble_in_order(E, world):
    bounds = [member_bounds(E, world, r) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == E
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous, in rank order
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)  # the first E % world ranks hold one more


def test_member_bounds_refuse_more_processes_than_members():
    with pytest.raises(ValueError, match="cannot be shared by 3 processes"):
        member_bounds(2, 3, 0)
    with pytest.raises(ValueError, match="rank = 2, world = 2"):
        member_bounds(4, 2, 2)


@pytest.mark.parametrize("dims", [[1, 2, 1], [8, 8, 8], [4, 3, 2, 4]])
def test_a_slice_of_members_computes_their_bits(dims):
    """What the bit-equality of member-parallel runs rests on: a member's loss, gradients and outputs
    do not depend on which other members share its tensors (here members 5:9 of 9, alone). A shared
    input folded into one matrix product of all members broke this for n_in = 1 in about half of
    these draws (the kernel blocks the rows of an E-row product differently)."""
    from zoo import DeepLinearNet
    from zoo.init import Gaussian

    for seed in range(10):
        net = DeepLinearNet(dims=dims, init=Gaussian(sigma=0.5), ensemble=9, seed=seed)
        g = torch.Generator().manual_seed(seed)
        batch = torch.randn(16, dims[0], generator=g), torch.randn(16, dims[-1], generator=g)
        loss, grads = net.losses_and_gradients(batch)
        out = net(batch[0])
        net.keep_members(5, 9)
        loss_s, grads_s = net.losses_and_gradients(batch)
        assert torch.equal(loss_s, loss[5:]) and torch.equal(net(batch[0]), out[5:]), f"seed {seed}"
        assert all(torch.equal(a, b[5:]) for a, b in zip(grads_s, grads)), f"seed {seed}"


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart stopped at step 50 by 1 process and by 2, and the uninterrupted 100 steps by 1."""
    two_folder = tmp_path_factory.mktemp("two")
    finish = start_ddp(two_folder, *QUICKSTART, "--trainer.max_steps=50")  # its processes start meanwhile
    one = fit_one(tmp_path_factory.mktemp("one"), *QUICKSTART, "--trainer.max_steps=50")
    full = fit_one(tmp_path_factory.mktemp("full"), *QUICKSTART, "--trainer.max_steps=100")
    return one, two_folder, finish(), full


@pytest.mark.slow
def test_two_processes_equal_one(quickstart):
    one, two_folder, two, _ = quickstart
    assert_one_set(two_folder, one.parents[1])
    assert_same_results(one, two)


@pytest.mark.slow
def test_checkpoint_of_two_processes_resumes_on_one(quickstart, tmp_path):
    _, two_folder, _, full = quickstart
    shutil.copytree(two_folder, tmp_path, dirs_exist_ok=True)
    assert checkpoint_step(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt") == 50
    run = fit_one(tmp_path, *QUICKSTART, "--trainer.max_steps=100", "--ckpt_path", "last")
    assert_same_run(full, run, stop_step=50)


@pytest.mark.slow
def test_checkpoint_of_two_processes_resumes_on_two(quickstart, tmp_path):
    """Resumed on 2 processes, the stopped run's TensorBoard points at its checkpoint's step are
    written back once (by rank 0: zoo.training.resume_events) and the run ends as the uninterrupted one."""
    _, two_folder, _, full = quickstart
    shutil.copytree(two_folder, tmp_path, dirs_exist_ok=True)
    run = start_ddp(tmp_path, *QUICKSTART, "--trainer.max_steps=100", "--ckpt_path", "last")()
    assert len(list(run.glob("events.out.tfevents.*"))) == 2  # the stopped part's file and rank 0's
    assert_same_run(full, run, stop_step=50)


@pytest.mark.slow
def test_two_simulated_nodes_equal_one_process(tmp_path):
    (tmp_path / "small.yaml").write_text(SMALL)
    config = ["--config", str(tmp_path / "small.yaml")]
    one = fit_one(tmp_path / "one", *config)
    nodes = run_forked(tmp_path / "nodes", *config, nodes=2, devices=1)
    assert_one_set(tmp_path / "nodes", tmp_path / "one")
    assert_same_results(one, nodes)
