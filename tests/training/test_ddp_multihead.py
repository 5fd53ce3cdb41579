"""The multi-head ensembles across two CPU processes (``--trainer.strategy=ddp``, ``zoo.training.distributed``):
a teacher-student ensemble through its task switch (EWC anchors, forgetting table and figures) and
the MNIST classifier ensemble train member-parallel to the same bits as one process; a single
classifier trains data-parallel to the one-process run within float rounding.

Each run is the CLI as a user starts it; the two-process one (``--trainer.devices=2``) as two
processes forked from this one (tests/helpers_ddp.run_forked; the quickstart's test in test_ddp_linear.py goes through
Lightning's own launcher), the reference in this process, both with one torch thread (a reduction split over
another number of threads rounds differently).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from datamodules import MNISTContinual, TeacherStudent
from helpers_ddp import fit_one, run_forked
from resume_harness import REPO, assert_same_run, scalars, weights
from tests.helpers_mnist import tiny_mnist
from zoo import MultiHeadClassifier, MultiHeadStudent
from zoo.training.ewc import EWC
from zoo.init import Gaussian, Polar

STUDENT = [
    "--model=MultiHeadStudent", "--model.init_args.d=40", "--model.init_args.p=2", "--model.init_args.eta=1.0",
    "--model.init_args.init=Gaussian", "--model.init_args.init.init_args.sigma=0.001",
    "--model.init_args.init_heads=Polar", "--model.init_args.init_heads.init_args.theta=[0.785,0.0,0.3]",
    # EWC with one xi per initialisation: the anchors, Fishers and xi are sharded with the members
    "--model.init_args.ewc.xi=[0.0,0.5,1.0]", "--model.init_args.ewc.samples=100",
    "--data=TeacherStudent", "--data.init_args.d=40", "--data.init_args.n_tasks=2",
    "--data.init_args.gamma=[0.0,0.5,1.0]", "--data.init_args.switch_step=160", "--data.init_args.num_steps=320",
    "--data.init_args.steps_per_batch=40", "--data.init_args.num_test=200",
    "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1",
    "--trainer.callbacks+=callbacks.forgetting.Forgetting", "--trainer.callbacks.every_n_steps=80",
    "--trainer.callbacks.table=true",
    # Q and R of every member as scalars (gathered); no images, no figure: matplotlib costs seconds
    "--trainer.callbacks+=callbacks.teacher_student.OrderParameters", "--trainer.callbacks.every_n_steps=80",
    "--trainer.callbacks.max_members=9", "--trainer.callbacks.max_images=0", "--trainer.callbacks.figure=false",
]


def classifier(data: Path, *extra: str) -> list[str]:
    """The fig12 recipe on tiny MNIST files: 12 initialisations x 2 similarities, validated."""
    return ["--config", f"{REPO}/recipes/specialisation/fig12_mnist_forgetting.yaml",
            f"--data.init_args.data_dir={data}", "--data.init_args.steps=[3,3]", "--data.init_args.digit_draws=1",
            "--data.init_args.shared=[0,5]", "--data.init_args.batch_size=8", "--data.init_args.num_test=20",
            "--model.init_args.hidden=8", "--trainer.check_val_every_n_epoch=1", "--trainer.log_every_n_steps=1", *extra]


# one member: a single initialisation on one data set trains data-parallel
ONE_MEMBER = ["--model.init_args.init_heads.init_args.gamma=0.0", "--model.init_args.init_heads.init_args.sigma=1.0",
              "--model.init_args.init_later_heads.init_args.gamma=0.0", "--model.init_args.init_later_heads.init_args.sigma=0.1",
              "--model.init_args.seed=0", "--data.init_args.shared=[2]", "--trainer.callbacks=[]"]


def _files(run: Path) -> list[str]:
    """The run folder's files (an event file by its folder: its name holds the time and process id)."""
    return sorted(str(p.relative_to(run).parent / "events") if p.name.startswith("events.out") else str(p.relative_to(run))
                  for p in run.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def student_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp_student")
    return fit_one(root / "one", *STUDENT), run_forked(root / "two", *STUDENT)


@pytest.fixture(scope="module")
def mnist(tmp_path_factory) -> Path:
    return tiny_mnist(tmp_path_factory.mktemp("mnist"))


@pytest.mark.slow
def test_student_ensemble_across_the_switch_equals_one_process(student_runs):
    one, two = student_runs
    # 3 initialisations x 3 teacher sets = 9 members, 5 and 4 per process; one set of files, by rank 0
    assert weights(two)["W"].shape[0] == 9
    assert _files(two) == _files(one) == sorted(["checkpoints/last.ckpt", "config.yaml", "hparams.yaml", "events",
                                                 "forgetting_members.csv", "forgetting_profile.png"])
    assert_same_run(one, two)  # every weight (EWC's anchors and Fishers too), scalar and figure, bit for bit
    assert (two / "forgetting_members.csv").read_bytes() == (one / "forgetting_members.csv").read_bytes()
    assert int(weights(two)["ewc.consolidations"]) == 1  # the switch consolidated once, on every rank
    assert len(scalars(two)["ewc/fisher/mean"]) == 1
    assert "Q/theta=0.3,xi=1,gamma=1/01" in scalars(two)  # the last member's, from rank 1's slice


@pytest.fixture(scope="module")
def classifier_runs(tmp_path_factory, mnist):
    root = tmp_path_factory.mktemp("ddp_classifier")
    args = classifier(mnist)
    return fit_one(root / "one", *args), run_forked(root / "two", *args)


@pytest.mark.slow
def test_classifier_ensemble_equals_one_process(classifier_runs):
    one, two = classifier_runs
    assert weights(two)["W"].shape[0] == 24
    assert _files(two) == _files(one)
    assert "forgetting_members.csv" in _files(two)
    assert_same_run(one, two)
    assert (two / "forgetting_members.csv").read_bytes() == (one / "forgetting_members.csv").read_bytes()
    assert any(t.startswith("val/task2/accuracy/") for t in scalars(two))  # per member, gathered on rank 0


@pytest.mark.slow
def test_one_classifier_trains_data_parallel_like_one_process(tmp_path, mnist):
    args = classifier(mnist, *ONE_MEMBER)
    one, two = fit_one(tmp_path / "one", *args), run_forked(tmp_path / "two", *args)
    wa, wb = weights(one), weights(two)
    assert wa["W"].shape[0] == 1
    # each process takes 4 of the 8 samples of a batch; DDP averages the two half-batch mean gradients,
    # i.e. the batch's mean gradient summed in another order: float32 rounding (~1e-7 relative a step)
    # over 6 steps, far below the change of the weights (lr = 1)
    for k in ("W", "heads"):
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6)
    sa, sb = scalars(one), scalars(two)
    loss = [v for _, v in sa["loss"]]
    assert max(loss) - min(loss) > 1e-2  # it trained: the tolerance is far below what the steps change
    for tag in ("loss", "val/task1/accuracy", "val/task2/accuracy", "val/task1/loss", "val/task2/loss"):
        assert [s for s, _ in sb[tag]] == [s for s, _ in sa[tag]]
        # the loss logged is the mean over both halves (reduced across the processes), accuracy the sum of hits
        torch.testing.assert_close(torch.tensor([v for _, v in sb[tag]]), torch.tensor([v for _, v in sa[tag]]),
                                   rtol=1e-5, atol=1e-6)


def _student_after(E: int, B: int, lo: int | None = None, hi: int | None = None, ewc: bool = False):
    """A student ensemble (or its members lo:hi, as a process of a member-parallel run holds them)
    after 2 chunks of SGD on one stream (with the EWC penalty on: the step-by-step path)."""
    net = MultiHeadStudent(d=24, p=2, init_w=Gaussian(sigma=0.5), init_heads=Polar(r=1.0, theta=[0.2 * e for e in range(E)]),
                           ewc=EWC(xi=[0.1 * e for e in range(E)]) if ewc else None)
    if lo is not None:
        net.keep_members(lo, hi)
    if ewc:
        net.ewc.consolidate({"W": net.W}, {"W": torch.full_like(net.W, 0.05)})
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        x, y = torch.randn(20, B, 24, generator=g), torch.randn(20, B, E, generator=g)
        net.sgd_steps(x, y[..., slice(lo, hi)], task=0)
    return net.W, net.h


@pytest.mark.parametrize("E, B, ewc", [(9, 1, False), (3, 1, False), (5, 3, False), (3, 1, True)])
def test_a_member_trains_to_the_same_bits_in_any_slice_of_the_ensemble(E, B, ewc):
    """The kernels (online, minibatch, step-by-step with EWC) give a member the same bits whichever
    members share its process: what makes a member-parallel run equal the one-process run."""
    W, h = _student_after(E, B, ewc=ewc)
    k = (E + 1) // 2  # uneven: E - k members on the second process, one when E = 3
    for lo, hi in ((0, k), (k, E)):
        W_part, h_part = _student_after(E, B, lo, hi, ewc)
        assert W_part.shape[0] == hi - lo
        assert torch.equal(W_part, W[lo:hi]) and torch.equal(h_part, h[lo:hi])


def test_what_cannot_run_on_several_processes_says_so_before_training(tmp_path):
    one = MultiHeadStudent(d=10)
    with pytest.raises(ValueError, match="one member cannot train across 2 processes.*at least devices x num_nodes = 2"):
        one.check_data_parallel(TeacherStudent(d=10), 2)
    net = MultiHeadClassifier(hidden=4)
    dm = MNISTContinual(str(tiny_mnist(tmp_path)), shared=2, batch_size=9, steps=[2, 2])
    with pytest.raises(ValueError, match="batch_size = 9; allowed: a multiple of 2"):
        net.check_data_parallel(dm, 2)
    net.check_data_parallel(dm, 3)  # 3 processes of 3 samples each
