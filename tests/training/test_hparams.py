"""What a module's logger writes (``hparams_initial``: hparams.yaml, TensorBoard HPARAMS) is plain
data and the same as the checkpoint's ``hparams``: init schemes as specs, sizes learnt at setup."""
from __future__ import annotations

import pytest
import torch
import yaml
from helpers_fit import fit

from zoo.init import Gain, Gaussian, Imbalance, LambdaBalanced, Polar


def _modules():
    from zoo import (BetaVAE, BetaVAESweep, Comparison, DeepLinearNet, DepthGDLN, GDLN, MultiHeadClassifier,
                     MultiHeadStudent, ReLUNet, SparseAutoencoder)

    return {
        "deep_linear": lambda: DeepLinearNet(dims=[4, 3, 4], init=LambdaBalanced(lam=[0.0, 1.0], scale=1e-3)),
        "student": lambda: MultiHeadStudent(d=10, init_w=Gaussian(sigma=1e-3), init_heads=Polar(theta=[0.0, 0.3])),
        "classifier": lambda: MultiHeadClassifier(n_in=6, hidden=4, init_w=Gaussian(sigma=0.1)),
        "gdln": lambda: GDLN(n_hidden=5, init=Gaussian(sigma=0.01)),
        "relu": lambda: ReLUNet(hidden=[8], init=Gaussian(sigma=0.01)),
        "depth": lambda: DepthGDLN(n_hidden=5, n_shared=6, init=Gaussian(sigma=0.01)),
        "comparison": lambda: Comparison([ReLUNet(hidden=[8], init=Gaussian(sigma=0.01))]),
        "vae": lambda: BetaVAE(image_shape=[1, 4, 4], latent_dim=2, init_encoder=Gain(g=0.5)),
        "vae_sweep": lambda: BetaVAESweep(image_shape=[1, 4, 4], latent_dim=2, init_encoder=Gain(g=[0.5, 1.0])),
        "sae": lambda: SparseAutoencoder(d=4, n=8, init=Imbalance(v=0.5)),
    }


@pytest.mark.parametrize("name", list(_modules()))
def test_logged_hyperparameters_are_plain_data_and_match_the_checkpoints(name):
    m = _modules()[name]()
    logged = dict(m.hparams_initial)
    assert logged == dict(m.hparams)
    yaml.safe_dump(logged)  # refuses Python objects (an init scheme instead of its spec)
    for key in ("init", "init_w", "init_heads", "init_encoder"):
        if key in logged:
            assert isinstance(logged[key], dict) and "class_path" in logged[key]


def test_a_size_learnt_at_setup_reaches_the_logged_hyperparameters(tmp_path):
    from datamodules.teacher_student import TeacherStudent
    from zoo import MultiHeadStudent

    dm = TeacherStudent(d=20, gamma=[0.0, 0.5, 1.0], switch_step=2, num_test=100)
    m = MultiHeadStudent(d=20, init_w=Gaussian(sigma=1e-3))
    fit(m, dm, tmp_path, max_steps=1)
    assert m.hparams["teacher_sets"] == 3 and m.hparams_initial["teacher_sets"] == 3
    assert torch.is_tensor(m.W) and m.W.shape[0] == 3


def test_modules_built_inside_another_record_their_own_arguments(in_tmp):
    """Lightning's CLI hands the configured module's arguments to every save_hyperparameters() made
    while it is built; a BetaVAESweep's members (and a Comparison's networks) keep their own."""
    from zoo.cli import build_cli

    cli = build_cli(["--model=BetaVAESweep", "--model.init_args.image_shape=[1,4,4]", "--model.init_args.latent_dim=2",
                  "--model.init_args.beta=3.0", "--model.init_args.init_encoder=Gain",
                  "--model.init_args.init_encoder.init_args.g=[0.5,1.0]", "--model.init_args.encoder_widths=[4]",
                  "--model.init_args.decoder_widths=[4]"], run=False)
    sweep = cli.model
    # the configured module keeps the CLI's record (load_from_checkpoint rebuilds it from that)
    assert sweep.hparams["_class_path"] in ("zoo.BetaVAESweep", "zoo.models.vae.BetaVAESweep")
    assert sweep.hparams["_instantiator"] == "lightning.pytorch.cli.instantiate_module"
    members = [dict(m.hparams) for m in sweep.members]
    assert all("_class_path" not in m and "_instantiator" not in m and m["beta"] == 3.0 for m in members)
    assert {m["init"]["init_args"]["g"] for m in members} == {0.5, 1.0}
    assert all(m["encoder_widths"] == [4] and m["latent_dim"] == 2 for m in members)
