"""GDLNs and ReLU nets across processes (zoo.training.distributed): [H] Fig. 2's comparison of a ReLU net
with the linear and XoR GDLNs on XoR margins, its ensemble of 3 (one margin each) shared by 2
processes (2 members and 1), equals the one-process run bit for bit: weights, every scalar, every
figure; and the files are written once. The slicing itself is checked in-process first."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from datamodules.xor import XorMargin
from helpers_ddp import assert_one_set, fit_one, run_forked, written_files
from resume_harness import assert_same_run
from zoo.models.gdln import GDLN, Comparison, ReLUNet
from zoo.init import Gaussian

DELTAS = [0.3, 1.0, 1.7]

# a two-hidden-layer ReLU net: StereotypicalLoss then reads its weights at the end (first_layer_on)
CONFIG = f"""
seed_everything: 0
model:
  class_path: zoo.models.gdln.Comparison
  init_args:
    names: [ReLU, linear_GDLN, XoR_GDLN]
    epochs_per_step: 10
    models:
      - class_path: zoo.models.gdln.ReLUNet
        init_args: {{hidden: [8, 8], init: {{class_path: zoo.init.Gaussian, init_args: {{sigma: 0.01}}}},
                    lr: 0.4, reduction: mean, ensemble: 3}}
      - class_path: zoo.models.gdln.GDLN
        init_args: {{gating: linear, n_hidden: 4, init: {{class_path: zoo.init.Gaussian, init_args: {{sigma: 0.01}}}},
                    lr: 0.4, reduction: mean, ensemble: 3}}
      - class_path: zoo.models.gdln.GDLN
        init_args: {{gating: xor, n_hidden: 4, init: {{class_path: zoo.init.Gaussian, init_args: {{sigma: 0.01}}}},
                    lr: 0.4, reduction: mean, ensemble: 3}}
data:
  class_path: datamodules.xor.XorMargin
  init_args: {{Delta: {DELTAS}}}
trainer:
  max_steps: 60
  max_epochs: -1
  log_every_n_steps: 1
  accelerator: cpu
  callbacks:
    - class_path: callbacks.gdln.LossCurves
      init_args: {{every_n_epochs: 5, log_y: false}}
    - class_path: callbacks.gdln.XorLearningTimes
      init_args: {{criterion: 0.2}}
    - class_path: callbacks.gdln.StereotypicalLoss
"""


def _comparison(dm: XorMargin) -> Comparison:
    init = Gaussian(sigma=0.1)
    c = Comparison([ReLUNet(hidden=[6], init=init, ensemble=3, lr=0.4, reduction="mean"),
                    GDLN(gating="xor", n_hidden=3, init=init, ensemble=3, lr=0.4, reduction="mean")])
    for m in c.models:
        m.attach(dm)
        m.build(dm.X, dm.Y)
    return c


def test_a_slice_of_the_members_trains_as_in_the_whole_ensemble():
    """Members 1:3 kept alone (each on its own margin: the data's member axis is sliced with the
    weights) follow the same bits as inside the ensemble of 3."""
    dm = XorMargin(Delta=DELTAS)
    whole, part = _comparison(dm), _comparison(dm)
    part.keep_members(1, 3)
    assert [m.member_range for m in part.models] == [(1, 3, 3)] * 2
    for a, b in zip(whole.models, part.models):
        La, Lb = a.run_epochs(dm.X, dm.Y, 15), b.run_epochs(dm.X, dm.Y, 15)
        assert Lb.shape == (15, 2) and torch.equal(La[:, 1:], Lb)
        for Wa, Wb in zip(a.W, b.W):
            assert torch.equal(Wa[1:], Wb)
        assert torch.equal(a.W0_init[1:], b.W0_init)
        assert torch.equal(a(dm.X)[1:], b(dm.X))  # a forward on the whole data set answers for its members


def test_a_comparison_of_unequal_ensembles_is_refused_across_processes():
    c = Comparison([ReLUNet(hidden=[4], ensemble=2), ReLUNet(hidden=[4], ensemble=3)], names=["a", "b"])
    with pytest.raises(ValueError, match=r"ensembles are \{'a': 2, 'b': 3\}.*one ensemble size"):
        c.n_members()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ddp_gdln")
    config = root / "xor.yaml"
    config.write_text(CONFIG)
    one = fit_one(root / "one", "--config", str(config))
    return one, run_forked(root / "two", "--config", str(config))


@pytest.mark.slow
def test_two_processes_write_one_set_of_files(runs):
    one, two = runs
    assert_one_set(two.parent.parent, one.parent.parent)
    assert {"loss_curves.png", "xor_times.png", "xor_trajectories.png", "stereotypical_loss.png"} <= set(written_files(two))


@pytest.mark.slow
def test_two_processes_equal_one_bit_for_bit(runs):
    one, two = runs
    assert_same_run(one, two)  # final weights (all 3 members, in order), every scalar, every PNG
    state = torch.load(two / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert state["models.1.W.0"].shape[0] == 3 and state["models.0.W0_init"].shape[0] == 3
