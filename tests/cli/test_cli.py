"""The command line: parse-time errors, --print_config, defaults, and the lightning-sdk hand-off."""
from __future__ import annotations

import sys
import textwrap

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from tests.conftest import REPO, finish, run_cli, selected, start_zoo, stop_zoo

QUICKSTART = str(REPO / "recipes" / "quickstart.yaml")


def test_print_config_shows_the_init_scheme_and_its_parameters(in_tmp, capsys):
    with pytest.raises(SystemExit) as stop:
        run_cli("fit", "--config", QUICKSTART, "--print_config")
    assert stop.value.code in (0, None)
    out = capsys.readouterr().out
    assert "class_path: zoo.init.LambdaBalanced" in out
    assert "lam:" in out and "- -8.0" in out and "scale: 0.001" in out


def test_default_seed_and_tensorboard_logger_and_saved_config(in_tmp):
    # no figure callbacks: what is checked here is the run's folder, not the quickstart's figures
    cli = run_cli("fit", "--config", QUICKSTART, "--trainer.max_steps=2", "--trainer.enable_progress_bar=false",
                  "--trainer.callbacks=null")
    assert cli.config["fit"]["seed_everything"] == 0
    assert isinstance(cli.trainer.logger, TensorBoardLogger)
    # the configured module keeps the CLI's record of how it was built (load_from_checkpoint uses it)
    assert cli.model.hparams["_instantiator"] == "lightning.pytorch.cli.instantiate_module"
    assert cli.model.hparams["init"]["class_path"] == "zoo.init.LambdaBalanced"
    log_dir = in_tmp / "lightning_logs" / "version_0"
    assert (log_dir / "config.yaml").exists()
    assert any(p.name.startswith("events.out.tfevents") for p in log_dir.iterdir())


@pytest.mark.parametrize(
    "override, message",
    [
        ("--model.init_args.init=NoSuchScheme", "NoSuchScheme"),
        ("--model.init_args.lr=abc", "abc"),
        ("--model.init_args.init.init_args.scale=-1", "lambda_balanced: parameter 'scale' = -1.0 is out of range"),
        ("--model.init_args.dims=[8,9,8]", "n_h <= min(n_in, n_out)"),
    ],
)
def test_bad_config_fails_at_parse_time_with_the_cli_message(in_tmp, capsys, override, message):
    with pytest.raises(SystemExit) as stop:
        run_cli("fit", "--config", QUICKSTART, override)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (in_tmp / "lightning_logs").exists()  # nothing started


def test_a_users_own_module_by_class_path(in_tmp, monkeypatch):
    (in_tmp / "my_research.py").write_text(textwrap.dedent("""
        from zoo import DeepLinearNet

        class Mine(DeepLinearNet):
            def member_loss(self, batch):
                return 2 * super().member_loss(batch)
    """))
    monkeypatch.syspath_prepend(str(in_tmp))
    cli = run_cli("fit", "--config", QUICKSTART, "--model=my_research.Mine", "--trainer.max_steps=10",
                  "--trainer.enable_progress_bar=false", "--trainer.callbacks=null")
    assert type(cli.model).__name__ == "Mine" and cli.trainer.global_step == 10


def _fake_sdk(tmp_path):
    pkg = tmp_path / "fake_sdk" / "lightning_sdk" / "cli"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "entrypoint.py").write_text(textwrap.dedent("""
        import json, os, sys

        def main_cli():
            with open(os.environ["FAKE_SDK_RECORD"], "w") as f:
                json.dump(sys.argv[1:], f)
    """))
    return tmp_path / "fake_sdk"


@pytest.fixture
def fake_sdk(in_tmp, monkeypatch):
    monkeypatch.syspath_prepend(str(_fake_sdk(in_tmp)))
    yield
    for name in [m for m in sys.modules if m == "lightning_sdk" or m.startswith("lightning_sdk.")]:
        del sys.modules[name]


def test_non_fit_commands_go_to_lightning_sdk_unchanged(in_tmp, monkeypatch, fake_sdk):
    import json

    from zoo.cli import main

    monkeypatch.setattr(sys, "argv", ["lightning"])
    record = in_tmp / "argv.json"
    monkeypatch.setenv("FAKE_SDK_RECORD", str(record))
    main(["studio", "start", "--name", "x y"])
    assert json.loads(record.read_text()) == ["studio", "start", "--name", "x y"]
    # fit stays with the zoo even when lightning_sdk is importable
    record.unlink()
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert not record.exists()


def test_without_lightning_sdk_unknown_commands_are_the_clis_error(in_tmp, capsys):
    from zoo.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["studio"])
    assert stop.value.code == 2


@pytest.fixture(scope="module", autouse=True)
def dash_m_help(request, tmp_path_factory):
    """``python -m zoo fit --help``, started as this module begins (when its test is selected): it
    runs beside the in-process tests."""
    started = start_zoo(tmp_path_factory.mktemp("dash_m"), "fit", "--help") if selected(request, "dash_m") else None
    yield started
    if started is not None:
        stop_zoo(started)


@pytest.mark.slow
def test_python_dash_m_zoo_runs_the_same_cli(dash_m_help):
    out = finish(dash_m_help)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--model" in out.stdout and "--data" in out.stdout and "seed_everything" in out.stdout


def test_every_public_module_has_a_short_name(in_tmp, capsys):
    """``class_path: DepthGDLN`` (or any name ``zoo`` exports lazily) resolves in a config, because
    the CLI imports every module that defines one."""
    import zoo

    for name in ("DeepLinearNet", "MultiHeadStudent", "MultiHeadClassifier", "SparseAutoencoder", "BetaVAE",
                 "GDLN", "ReLUNet", "DepthGDLN"):
        assert name in dir(zoo)
        with pytest.raises(SystemExit) as stop:
            run_cli("fit", "--model", name, "--data", "Contexts", "--print_config")
        assert stop.value.code in (0, None), name
        out = capsys.readouterr().out
        assert f"class_path: zoo.{name}\n" in out or f"class_path: {getattr(zoo, name).__module__}.{name}\n" in out


def test_a_comparison_from_the_cli_records_each_models_own_arguments(in_tmp):
    """The CLI builds a Comparison's models inside the Comparison's hyperparameter context: each
    model must still record its own arguments, and the checkpoint must load without the CLI."""
    import torch
    import yaml

    from datamodules.contexts import Contexts
    from zoo.models.gdln import Comparison

    (in_tmp / "cmp.yaml").write_text(textwrap.dedent("""
        model:
          class_path: Comparison
          init_args:
            epochs_per_step: 10
            names: [relu, reln]
            models:
              - class_path: ReLUNet
                init_args: {hidden: [20, 7], ensemble: 2, init: {class_path: Gaussian, init_args: {sigma: 0.01}}}
              - class_path: GDLN
                init_args: {n_hidden: 5, gating: reln, context_init_gain: 2.0, ensemble: 2,
                            init: {class_path: Gaussian, init_args: {sigma: 0.01}}}
        data:
          class_path: Contexts
          init_args: {n_contexts: 3, structure: same}
        trainer: {max_steps: 2, max_epochs: -1, enable_progress_bar: false}
    """))
    cli = run_cli("fit", "--config", str(in_tmp / "cmp.yaml"))
    folder = in_tmp / "lightning_logs" / "version_0"
    saved = yaml.safe_load((folder / "hparams.yaml").read_text())
    relu, reln = (m["init_args"] for m in saved["models"])
    assert relu["hidden"] == [20, 7] and "models" not in relu and "_class_path" not in relu
    assert reln["n_hidden"] == 5 and reln["gating"] == "reln" and reln["context_init_gain"] == 2.0
    assert reln["init"]["init_args"]["sigma"] == 0.01
    (ckpt,) = (folder / "checkpoints").glob("*.ckpt")
    loaded = Comparison.load_from_checkpoint(ckpt)
    X = Contexts(3, "same").X
    for a, b in zip(loaded.models, cli.model.models):
        assert type(a) is type(b) and torch.allclose(a(X), b(X))


# ---- values model and data share: given once, to the data (zoo.cli.LINKED) ---------------------------------------
def test_a_config_without_the_models_d_gives_the_model_the_datas(in_tmp):
    import yaml

    (in_tmp / "ts.yaml").write_text(textwrap.dedent("""
        model:
          class_path: MultiHeadStudent
          init_args: {p: 2, init_w: {class_path: Gaussian, init_args: {sigma: 0.001}}}
        data:
          class_path: TeacherStudent
          init_args: {d: 37, n_tasks: 3, gamma: [0.0, 1.0], num_steps: 30, steps_per_batch: 10, num_test: 50}
        trainer: {max_epochs: 1, enable_progress_bar: false, enable_model_summary: false}
    """))
    cli = run_cli("fit", "--config", str(in_tmp / "ts.yaml"))
    m = cli.model
    # the student's defaults are d = 1000, n_tasks = 2, teacher_sets = 1: every one came from the data
    assert (m.d, m.n_tasks, m.G) == (37, 3, 2)
    assert m.W.shape[-1] == 37
    assert m.hparams["d"] == 37 and m.hparams["n_tasks"] == 3
    assert cli.trainer.global_step > 0
    folder = in_tmp / "lightning_logs" / "version_0"
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    assert "d" not in saved["model"]["init_args"] and saved["data"]["init_args"]["d"] == 37  # stated once
    assert yaml.safe_load((folder / "hparams.yaml").read_text())["d"] == 37
    # the saved config runs again as it is, to the same model
    again = run_cli("fit", "--config", str(folder / "config.yaml"), "--trainer.max_epochs=0")
    assert (again.model.d, again.model.n_tasks) == (37, 3)


def test_a_linked_value_given_to_the_model_too_must_agree():
    """The model's value, when given, must be the data's; its default counts as not given, also in a
    user's subclass that passes its arguments on as **kwargs."""
    from types import SimpleNamespace

    from jsonargparse import Namespace

    from zoo.cli import linked_conflicts
    from zoo.models.student import MultiHeadStudent

    class Mine(MultiHeadStudent):
        def __init__(self, scale: float = 1.0, **kwargs) -> None:
            super().__init__(**kwargs)

    data = SimpleNamespace(d=100, n_tasks=3)

    def model(**init_args):
        return Namespace(class_path="Mine", init_args=Namespace(**init_args))

    assert linked_conflicts(model(d=100, n_tasks=3, p=2), Mine, data) == []  # an old recipe: both agree
    assert linked_conflicts(model(d=1000, n_tasks=2), Mine, data) == []  # the defaults: nothing given
    (msg,) = linked_conflicts(model(d=500, n_tasks=3), Mine, data)
    assert msg.startswith("model.init_args.d = 500 but the datamodule's d = 100;")
    assert len(linked_conflicts(model(d=500, n_tasks=4), Mine, data)) == 2
    assert linked_conflicts(model(d=500), Mine, None) == []  # no datamodule: nothing linked


def test_a_model_without_the_linked_argument_is_left_alone(in_tmp, capsys):
    """DeepLinearNet has no ``d``; TeacherStudent has: nothing is linked, the model's arguments print as given."""
    with pytest.raises(SystemExit):
        run_cli("fit", "--config", QUICKSTART, "--print_config")
    out = capsys.readouterr().out
    assert "dims:" in out and "\n    d:" not in out


# ---- validate / test a checkpoint: a user's own module with a test_step --------------------------------------------
W_TRUE = (1.0, -2.0, 0.5)


class TinyData(pl.LightningDataModule):
    """64 points of y = x . W_TRUE in 4 batches of 16 (the same batches for every stage)."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        import torch

        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, generator=g)
        self.y = self.x @ torch.tensor(W_TRUE)

    def train_dataloader(self):
        from torch.utils.data import DataLoader, TensorDataset

        return DataLoader(TensorDataset(self.x, self.y), batch_size=16)

    val_dataloader = test_dataloader = train_dataloader


class TinyRegression(pl.LightningModule):
    """A linear regression whose test_step / validation_step log the mean squared error."""

    def __init__(self, lr: float = 0.05) -> None:
        import torch

        super().__init__()
        self.save_hyperparameters()
        self.lin = torch.nn.Linear(3, 1)

    def _mse(self, batch):
        x, y = batch
        return ((self.lin(x).squeeze(-1) - y) ** 2).mean()

    def training_step(self, batch, batch_idx):
        return self._mse(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_mse", self._mse(batch), on_epoch=True)

    def test_step(self, batch, batch_idx):
        self.log("test_mse", self._mse(batch), on_epoch=True)

    def configure_optimizers(self):
        import torch

        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


TINY = ["--model=tests.cli.test_cli.TinyRegression", "--data=tests.cli.test_cli.TinyData", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false"]


def _printed(out: str, name: str) -> float:
    import re

    m = re.search(rf"{name}\W+([0-9.eE+-]+)", out)
    assert m, out
    return float(m.group(1))


def test_validate_and_test_evaluate_the_newest_runs_last_checkpoint(in_tmp, capsys):
    import torch

    from zoo.training.checkpoint import RunCheckpoint
    from zoo.cli import main

    run_cli("fit", *TINY, "--trainer.max_epochs=3")
    run = in_tmp / "lightning_logs" / "version_0"
    ckpt = run / "checkpoints" / "last.ckpt"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    # the metric printed is the checkpoint's weights' error on the data, computed here without Lightning
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    data = TinyData()
    expected = ((data.x @ state["lin.weight"][0] + state["lin.bias"][0] - data.y) ** 2).mean().item()
    assert expected > 1e-3  # three epochs do not fit the data: a weight left untrained would show
    capsys.readouterr()

    for subcommand, metric in (("test", "test_mse"), ("validate", "val_mse")):
        cli = run_cli(subcommand, *TINY, "--ckpt_path", "last")
        assert _printed(capsys.readouterr().out, metric) == pytest.approx(expected, rel=1e-5)
        assert not any(isinstance(c, RunCheckpoint) for c in cli.trainer.callbacks)
        # the evaluated run's folder is untouched; the evaluation logs into a folder of its own
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
        assert cli.trainer.log_dir != str(run)
    assert list((in_tmp / "lightning_logs").glob("version_*/checkpoints/*.ckpt")) == [ckpt]  # only the fit's

    # the one-line errors of fit: a missing file, and a checkpoint of other settings
    for bad, words in ((["--ckpt_path", "nope.ckpt"], ["ckpt_path", "nope.ckpt"]),
                       (["--ckpt_path", str(ckpt), "--model.init_args.lr=0.5"], ["lr = 0.5", "0.05"])):
        with pytest.raises(SystemExit) as stop:
            main(["test", *TINY, *bad])
        err = capsys.readouterr().err.strip().split("\n")
        assert stop.value.code == 2 and len(err) <= 2 and all(w in err[0] for w in words), err
