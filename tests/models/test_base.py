"""zoo.models.base.ZooModule: one alias mechanism, one ensemble-size rule, one rule for the fast
kernels, ``member_params`` on every family and ``params`` on every init scheme."""
from __future__ import annotations

import pytest
import torch

from zoo import (GDLN, BetaVAE, BetaVAESweep, DeepLinearNet, MultiHeadClassifier, MultiHeadStudent, ReLUNet,
                 SparseAutoencoder)
from zoo.init import REGISTRY, Gain, Gaussian, InitScheme, LambdaBalanced, PathwayGrid, Polar, Xavier
from zoo.models.base import ZooModule
from zoo.training.ensemble import ensemble_size

CLASSIFIER = dict(n_in=4, hidden=3, n_classes=2)
VAE = dict(image_shape=[1, 4, 4], latent_dim=2, encoder_widths=[4], decoder_widths=[4])


# -- aliases ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls, kw, alias", [
    (MultiHeadClassifier, CLASSIFIER, "init_w"),
    (BetaVAE, VAE, "init_encoder"),
    (BetaVAESweep, dict(VAE, seeds=[0]), "init_encoder"),
])
def test_an_old_name_builds_the_same_module_and_records_todays_name(cls, kw, alias):
    scheme = Gaussian(sigma=[0.5, 2.0]) if cls is MultiHeadClassifier else Gain(g=[0.5, 2.0] if cls is BetaVAESweep else 0.5)
    old, new = cls(**kw, **{alias: scheme}), cls(**kw, init=scheme)
    assert dict(old.hparams) == dict(new.hparams) and alias not in old.hparams
    assert old.hparams["init"] == scheme.spec()
    for (name, a), (_, b) in zip(old.state_dict().items(), new.state_dict().items()):
        assert torch.equal(a, b), name


def test_giving_a_name_and_its_alias_is_an_error_naming_both():
    with pytest.raises(ValueError, match="init = Gaussian.*init_w = Gaussian.*another name of init"):
        MultiHeadClassifier(**CLASSIFIER, init=Gaussian(sigma=3.0), init_w=Gaussian(sigma=2.0))
    # the canonical one at its default is "not given": the alias decides
    m = MultiHeadClassifier(**CLASSIFIER, init=Gaussian(sigma=1.0), init_w=Gaussian(sigma=2.0))
    assert m.hparams["init"]["init_args"]["sigma"] == 2.0


def test_the_command_line_takes_the_old_names_and_records_todays(in_tmp):
    from zoo.cli import build_cli

    cli = build_cli(["--model=MultiHeadClassifier", "--model.init_args.n_in=4", "--model.init_args.hidden=3",
                     "--model.init_args.n_classes=2", "--model.init_args.init_w=Gaussian",
                     "--model.init_args.init_w.init_args.sigma=[0.5,0.7]"], run=False)
    assert cli.model.ensemble == 2 and "init_w" not in cli.model.hparams
    assert cli.model.hparams["init"]["init_args"]["sigma"] == [0.5, 0.7]
    assert cli.model.hparams_initial["init"] == cli.model.hparams["init"]


def _save_with_old_names(path, model, renames):
    """A checkpoint as an earlier release wrote it: its hyperparameters under the old names."""
    hp = {"_class_path": f"zoo.{type(model).__name__}", **model.hparams}
    for old, new in renames.items():
        hp[old] = hp.pop(new)
    import lightning

    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hp,
                "pytorch-lightning_version": lightning.__version__}, path)
    return path


def test_a_checkpoint_with_the_old_names_loads_and_passes_the_checkpoint_check(tmp_path):
    from zoo.cli.checkpoint_checks import CheckpointMismatch, check_checkpoint

    model = MultiHeadClassifier(**CLASSIFIER, init=Gaussian(sigma=[0.5, 2.0]))
    path = _save_with_old_names(tmp_path / "old.ckpt", model, {"init_w": "init"})
    assert "init_w" in torch.load(path, weights_only=True)["hyper_parameters"]
    check_checkpoint(path, MultiHeadClassifier(**CLASSIFIER, init=Gaussian(sigma=[0.5, 2.0])))
    # the comparison reads the old name as today's: another init is still refused
    with pytest.raises(CheckpointMismatch, match=r"init\.init_args\.sigma = \[0.5, 3.0\] in the config but \[0.5, 2.0\]"):
        check_checkpoint(path, MultiHeadClassifier(**CLASSIFIER, init=Gaussian(sigma=[0.5, 3.0])))
    loaded = MultiHeadClassifier.load_from_checkpoint(path)
    assert loaded.ensemble == 2 and loaded.hparams["init"] == model.hparams["init"]
    assert torch.equal(loaded.W, model.W)


# -- ensemble size ------------------------------------------------------------------------------------
def test_one_ensemble_size_rule():
    assert ensemble_size("M", {"init": 3, "seed": 1, "l1": 3}) == 3  # length 1 broadcasts
    assert ensemble_size("M", {"init": 1}, ensemble=5) == 5  # a replication count of scalar settings
    assert ensemble_size("M", {"init": 1}) == 1
    with pytest.raises(ValueError, match=r"M: the ensemble sizes disagree \(init = 3, seed = 2\)"):
        ensemble_size("M", {"init": 3, "seed": 2})
    with pytest.raises(ValueError, match=r"init = 2, ensemble = 3"):
        ensemble_size("M", {"init": 2}, ensemble=3)
    with pytest.raises(ValueError, match="ensemble = 0; allowed: a positive integer"):
        ensemble_size("M", {}, ensemble=0)


@pytest.mark.parametrize("build", [
    lambda: DeepLinearNet(dims=[2, 2, 2], init=LambdaBalanced(lam=[0.0, 1.0]), ensemble=3),
    lambda: GDLN(init=Gaussian(sigma=[1e-3, 1e-2]), ensemble=3),
    lambda: MultiHeadClassifier(**CLASSIFIER, init=Gaussian(sigma=[1.0, 2.0]), seed=[0, 1, 2]),
    lambda: MultiHeadStudent(d=8, init_heads=Polar(theta=[0.0, 0.1]), seed=[0, 1, 2]),
    lambda: BetaVAESweep(**VAE, init=Gain(g=[0.5, 1.0]), init_decoder=Xavier(gain=[1.0, 2.0, 3.0])),
])
def test_a_length_mismatch_is_an_error_before_training_naming_the_lengths(build):
    with pytest.raises(ValueError, match=r"ensemble sizes disagree \(.* = [23], .* = [23]\)"):
        build()


# -- the rule for the fast kernels ---------------------------------------------------------------------
def test_overrides_tells_a_redefined_step_from_the_familys_own():
    class Huber(DeepLinearNet):
        def member_loss(self, batch):
            return super().member_loss(batch)

    class Deeper(Huber):  # inherits the redefinition: still not the family's own
        pass

    assert not DeepLinearNet.overrides("member_loss")
    assert Huber.overrides("member_loss") and Deeper.overrides("member_loss")

    class Tanh(MultiHeadClassifier):
        def activation(self, lam):
            return torch.tanh(lam)

    assert not MultiHeadClassifier.overrides("activation") and Tanh.overrides("activation")
    assert not Tanh.overrides("loss_grad") and Tanh(**CLASSIFIER).custom_update
    assert not MultiHeadClassifier(**CLASSIFIER).custom_update

    class Capacity(BetaVAE):
        def regulariser(self, mu, logvar, z, step):
            return super().regulariser(mu, logvar, z, step)

    assert Capacity.overrides("regulariser") and not Capacity.overrides("encode")
    with pytest.raises(AttributeError, match="no class lists 'forward'"):
        DeepLinearNet.overrides("forward")


# -- members and schemes as data -----------------------------------------------------------------------
FAMILIES = {
    "deep_linear": lambda: DeepLinearNet(dims=[2, 2, 2], init=LambdaBalanced(lam=[0.0, 1.0, 2.0])),
    "pathway_grid": lambda: DeepLinearNet(dims=[1, 2, 1], init=PathwayGrid(lam1=[0.0, 1.0], lam2=[0.0, 2.0])),
    "gdln": lambda: GDLN(init=Gaussian(sigma=[1e-3, 1e-2, 1e-1])),
    "relu": lambda: ReLUNet(init=Gaussian(sigma=1e-3), ensemble=3),
    "student": lambda: MultiHeadStudent(d=8, init_heads=Polar(theta=[0.0, 0.1, 0.2])),
    "classifier": lambda: MultiHeadClassifier(**CLASSIFIER, init=Gaussian(sigma=[1.0, 2.0, 3.0])),
    "sae": lambda: SparseAutoencoder(d=4, n=8, l1=[0.0, 0.1, 0.2]),
    "vae_sweep": lambda: BetaVAESweep(**VAE, init=Gain(g=[0.5, 1.0, 2.0]), seeds=[0]),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_ensemble_module_has_member_params_one_dict_per_member(name):
    m = FAMILIES[name]()
    assert isinstance(m, ZooModule)
    params = m.member_params
    assert isinstance(params, list) and len(params) == m.n_members() == 3 + (name == "pathway_grid")
    assert all(isinstance(p, dict) for p in params)
    # what tells the members apart is in their dicts, and it tells them apart
    if name != "relu":
        assert len({tuple(sorted(p.items())) for p in params}) == len(params)
    assert len(set(m.labels)) == len(params)


def test_every_registered_scheme_exposes_its_parameters():
    for name, cls in REGISTRY.items():
        scheme = cls()
        assert isinstance(scheme, InitScheme)
        assert scheme.params and all(isinstance(v, list) and v for v in scheme.params.values()), name
        # every numeric constructor argument is in params, and the spec rebuilds the same scheme
        rebuilt = type(scheme)(**scheme.spec()["init_args"])
        assert rebuilt.params == scheme.params, name
    grid = PathwayGrid(lam1=[0.0, 1.0], lam2=[0.0, 2.0, 4.0], a0=0.01)
    assert grid.params == {"lam1": [0.0, 1.0], "lam2": [0.0, 2.0, 4.0], "a0": [0.01]}
    assert PathwayGrid(omega0=0.1).params["omega0"] == [0.1] and grid.ensemble_size == 6


def test_the_student_takes_lr_and_the_papers_eta_on_the_command_line(in_tmp):
    from zoo.cli import build_cli

    base = ["--model=MultiHeadStudent", "--model.init_args.d=8"]
    for flag in ("lr", "eta"):
        cli = build_cli(base + [f"--model.init_args.{flag}=0.25"], run=False)
        assert cli.model.lr == cli.model.eta == 0.25 and cli.model.hparams["lr"] == 0.25
        assert "eta" not in cli.model.hparams
    assert MultiHeadStudent(d=8, eta=0.5).hparams == MultiHeadStudent(d=8, lr=0.5).hparams
    with pytest.raises(ValueError, match="lr = 0.5 and eta = 0.25 are both given"):
        MultiHeadStudent(d=8, lr=0.5, eta=0.25)


def test_a_batch_of_another_kind_is_an_error_naming_the_expected_format():
    net = DeepLinearNet(dims=[2, 2, 2])
    net.check_batch((torch.zeros(3, 2), torch.zeros(3, 2)))
    with pytest.raises(TypeError, match=r"DeepLinearNet reads regression batches: a tuple \(x, y\).*got a dict "
                                        r"with keys \['task', 'x', 'y'\]"):
        net.check_batch({"x": torch.zeros(3, 2), "y": torch.zeros(3), "task": 0})
    student = MultiHeadStudent(d=8)
    student.check_batch({"x": torch.zeros(1, 1, 8), "y": torch.zeros(1, 1, 1), "task": 0})
    with pytest.raises(TypeError, match=r"reads stream batches: a dict \{'x', 'y', 'task'\}.*got a tuple of 2"):
        student.check_batch((torch.zeros(1, 8), torch.zeros(1)))
    with pytest.raises(TypeError, match=r"BetaVAE reads images batches.*\(B, C, H, W\)"):
        BetaVAE(**VAE).check_batch([torch.zeros(2, 16)])
    SparseAutoencoder(d=4, n=8).check_batch({"x": torch.zeros(2, 4)})
