"""Invalid settings end as one line on stderr and exit code 2, before the first training batch.

The fuzz test runs ``zoo.cli.main`` in-process (Lightning's import is paid once) on invalid
configurations of every kind the zoo has: numbers out of range or not finite (command line and
YAML), model/datamodule mismatches, indices out of range, Trainer settings, checkpoints, data
files, recipe paths. Two subprocess runs check the real entry point: the message is stderr's first
line, before Lightning's own "Seed set" / "GPU available" lines.
"""
from __future__ import annotations

import gzip
import textwrap

import pytest
import torch

from tests.conftest import REPO, finish, selected, start_zoo, stop_zoo

R = REPO / "recipes"
QS = str(R / "quickstart.yaml")
STUDENT = str(R / "specialisation" / "fig1b_relu_specialises.yaml")
MNIST = str(R / "specialisation" / "fig12_mnist_forgetting.yaml")
VAE = str(R / "specialisation" / "fig13_vae_mnist.yaml")
ISAE = str(R / "specialisation" / "fig13_isae.yaml")
SHAPES = str(R / "specialisation" / "fig4_gain_dci.yaml")
XOR = str(R / "haste_slowly" / "fig2_xor_margin.yaml")
CONTEXTS = str(R / "haste_slowly" / "fig4_contexts.yaml")
RELU = str(R / "haste_slowly" / "fig8_9_reln_discovery.yaml")
NTK = str(R / "lazy_rich" / "ntk_square.yaml")
REVERSAL = str(R / "lazy_rich" / "reversal.yaml")
PHASE = str(R / "specialisation" / "phase_diagram.yaml")
EWC = str(R / "specialisation" / "fig7_ewc.yaml")
# a short run if a case were (wrongly) accepted; no progress bar in the captured stderr
SHORT = ["--trainer.max_steps=2", "--trainer.enable_progress_bar=false"]

# (config, overrides, what the first stderr line must contain: the parameter and the value given).
# "{tmp}" is the test's folder; files the case needs are made by _make_files.
CASES = [
    # numbers out of range or not finite, from the command line
    (QS, ["--model.init_args.lr=-1"], ["lr", "-1"]),
    (QS, ["--model.init_args.lr=nan"], ["lr", "nan"]),
    (QS, ["--model.init_args.lr", "-inf"], ["lr", "-inf"]),
    (QS, ["--model.init_args.lr=abc"], ["lr", "abc"]),
    (QS, ["--model.init_args.steps_per_batch=0"], ["steps_per_batch", "0"]),
    (QS, ["--model.init_args.init.init_args.scale=-1"], ["scale", "-1"]),
    (QS, ["--model.init_args.init.init_args.lam=[0.0,nan]"], ["lam", "nan"]),
    (QS, ["--model.init_args.dims=[8,9,8]"], ["n_h", "9"]),
    (QS, ["--model.init_args.dims=[8]"], ["dims", "[8]"]),
    (QS, ["--model.init_args.ensemble=3"], ["ensemble", "3"]),
    (QS, ["--model.init_args.init=NoSuchScheme"], ["init", "NoSuchScheme"]),
    (QS, ["--model.init_args.no_such_setting=1"], ["no_such_setting"]),
    (QS, ["--data.init_args.batch_size=0"], ["batch_size", "0"]),
    (QS, ["--data.init_args.batches_per_epoch=-2"], ["batches_per_epoch", "-2"]),
    (QS, ["--seed_everything=abc"], ["seed_everything", "abc"]),
    (STUDENT, ["--model.init_args.eta=nan"], ["eta", "nan"]),
    (STUDENT, ["--model.init_args.p=0"], ["p", "0"]),
    (STUDENT, ["--model.init_args.activation=tanhh"], ["activation", "tanhh"]),
    (STUDENT, ["--model.init_args.init_heads.init_args.r=-1"], ["r", "-1"]),
    (STUDENT, ["--model.init_args.init.init_args.sigma=inf"], ["sigma", "inf"]),
    (STUDENT, ["--data.init_args.p_star=0"], ["p_star", "0"]),
    (STUDENT, ["--data.init_args.num_steps=0"], ["num_steps", "0"]),
    (EWC, ["--model.init_args.ewc.init_args.xi=-1"], ["xi", "-1"]),
    (MNIST, ["--model.init_args.hidden=0"], ["hidden", "0"]),
    (MNIST, ["--data.init_args.permute_new=2"], ["permute_new", "2"]),
    (MNIST, ["--model.init_args.lr=0"], ["lr", "0"]),
    (VAE, ["--model.init_args.beta=-1"], ["beta", "-1"]),
    # the datamodule is built first (the model takes values from it, zoo.cli.LINKED): without it
    # (the iSAE's needs phase 1's checkpoint) the model's own checks speak
    (ISAE, ["--data=null", "--model.init_args.l1=[-1.0]"], ["l1", "-1"]),
    (ISAE, ["--data=null", "--model.init_args.optimizer=adamw"], ["optimizer", "adamw"]),
    (SHAPES, ["--model.init_args.seeds=[]"], ["seeds", "[]"]),
    (XOR, ["--data.init_args.Delta=-1"], ["Delta", "-1"]),
    (CONTEXTS, ["--data.init_args.n_contexts=7"], ["n_contexts", "7"]),
    (CONTEXTS, ["--model.init_args.epochs_per_step=0"], ["epochs_per_step", "0"]),
    (RELU, ["--model.init_args.hidden=[0]"], ["hidden", "[0]"]),
    (NTK, ["--data.init_args.num_samples=2"], ["num_samples", "2"]),
    (PHASE, ["--data.init_args.s=nan"], ["s", "nan"]),
    # from YAML: the same checks
    ("{tmp}/nan_lr.yaml", [], ["lr", "nan"]),
    ("{tmp}/neg_sigma.yaml", [], ["sigma", "-0.5"]),
    # model/datamodule mismatches (found at setup, before the first batch)
    (STUDENT, ["--model.init_args.d=500"], ["d = 500", "d = 1000"]),
    # a linked value (the model takes the data's) given to the model too, differently
    (STUDENT, ["--model.init_args.n_tasks=3"], ["n_tasks = 3", "n_tasks = 1"]),
    (STUDENT, ["--model.init_args.teacher_sets=3"], ["teacher_sets = 3"]),
    (NTK, ["--data.init_args.n_in=5"], ["dims[0] = 4", "n_in = 5"]),
    (QS, ["--data=TeacherStudent"], ["task_aligned", "TeacherStudent"]),
    (QS, ["--model.init_args.task_aligned=false", "--data=WhitenedRegression", "--data.init_args.n_out=3"],
     ["dims[-1] = 8", "n_out = 3"]),
    # indices out of range
    (REVERSAL, ["--model.init_args.reversed_modes=[99]"], ["reversed_modes", "99"]),
    (REVERSAL, ["--model.init_args.reversed_modes=[-1]"], ["reversed_modes", "-1"]),
    (QS, ["--data.init_args.reverse_modes=[99]"], ["reverse_modes", "99"]),
    (MNIST, ["--data.init_args.shared=[99]"], ["shared", "99"]),
    # Trainer settings
    (QS, ["--trainer.max_epochs=-5"], ["max_epochs", "-5"]),
    (QS, ["--trainer.max_steps=-5"], ["max_steps", "-5"]),
    (QS, ["--trainer.min_epochs=-3"], ["min_epochs", "-3"]),
    (QS, ["--trainer.log_every_n_steps=0"], ["log_every_n_steps", "0"]),
    (QS, ["--trainer.limit_train_batches=-1"], ["limit_train_batches", "-1"]),
    (QS, ["--trainer.accelerator=quantum"], ["accelerator", "quantum"]),
    (QS, ["--trainer.precision=7"], ["precision", "7"]),
    (QS, ["--trainer.gradient_clip_val=nan"], ["gradient_clip_val", "nan"]),
    (QS, ["--trainer.fast_dev_run=-1"], ["fast_dev_run", "-1"]),
    (QS, ["--trainer.callbacks+=SingularValues", "--trainer.callbacks.init_args.every_n_steps=0"],
     ["every_n_steps", "0"]),
    # checkpoints: missing, garbage, another model's
    (QS, ["--ckpt_path={tmp}/missing.ckpt"], ["ckpt_path", "missing.ckpt"]),
    (QS, ["--ckpt_path={tmp}/garbage.ckpt"], ["ckpt_path", "garbage.ckpt"]),
    (QS, ["--ckpt_path={tmp}/student.ckpt"], ["ckpt_path", "MultiHeadStudent", "DeepLinearNet"]),
    # data: missing folders, missing / corrupt files, recipe paths that do not exist
    (MNIST, ["--data.init_args.data_dir={tmp}/no_data"], ["no_data", "MNIST"]),
    (MNIST, ["--data.init_args.data_dir={tmp}/corrupt"], ["corrupt", "train-images"]),
    (VAE, ["--data.init_args.data_dir={tmp}/no_data"], ["no_data", "MNIST"]),
    (ISAE, [], ["checkpoint", "vae_mnist.ckpt"]),
    (SHAPES, ["--data.init_args.data_dir={tmp}/no_data", "--data.init_args.generate=false"], ["no_data", "3dshapes"]),
    ("{tmp}/no_such_recipe.yaml", [], ["no_such_recipe.yaml"]),
    ("{tmp}", [], ["config", "not a file"]),
    ("{tmp}/broken.yaml", [], ["expected ',' or ']'"]),
    (ISAE, ["--data.init_args.checkpoint={tmp}/garbage.ckpt"], ["checkpoint", "garbage.ckpt"]),
    (SHAPES, ["--data.init_args.path={tmp}/garbage.ckpt"], ["garbage.ckpt", "HDF5"]),
    (QS, ["--ckpt_path={tmp}"], ["ckpt_path", "no such file"]),
    # more numbers, shapes and types
    (QS, ["--trainer.max_epochs=abc"], ["max_epochs", "abc"]),
    (QS, ["--model.init_args.ensemble=0"], ["ensemble = 0"]),
    (QS, ["--model.init_args.dims=[8,8]"], ["shapes", "(8, 8)"]),
    (QS, ["--model.init_args.init.class_path=Polar"], ["task_aligned", "Polar"]),
    (STUDENT, ["--model.init_args.init_heads.init_args.theta=nan"], ["theta", "nan"]),
    (CONTEXTS, ["--data.init_args.n_items=3"], ["n_items", "3"]),
    (STUDENT, ["--data.init_args.activation=tanhh"], ["activation", "tanhh"]),
]


def _make_files(tmp):
    """The YAML configs, checkpoints and data folders that CASES refer to."""
    from zoo.models.student import MultiHeadStudent

    (tmp / "nan_lr.yaml").write_text(open(QS).read().replace("lr: 0.05", "lr: .nan"))
    (tmp / "neg_sigma.yaml").write_text(textwrap.dedent("""
        model:
          class_path: MultiHeadStudent
          init_args: {init_w: {class_path: Gaussian, init_args: {sigma: -0.5}}}
        data: {class_path: TeacherStudent, init_args: {d: 10}}
    """))
    (tmp / "garbage.ckpt").write_bytes(b"not a checkpoint at all")
    (tmp / "broken.yaml").write_text("model: [unclosed\n  x: 1\n")
    student = MultiHeadStudent(d=10)
    torch.save({"state_dict": student.state_dict(),
                "hyper_parameters": {"_class_path": "zoo.MultiHeadStudent", **student.hparams}}, tmp / "student.ckpt")
    raw = tmp / "corrupt" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (raw / f"{name}.gz").write_bytes(gzip.compress(b"truncated")[:12])


@pytest.fixture
def no_training(monkeypatch):
    """Records every training step the Strategy runs (it runs them for automatic and manual optimisation)."""
    from lightning.pytorch.strategies import Strategy

    steps = []
    original = Strategy.training_step

    def counted(self, *args, **kwargs):
        steps.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Strategy, "training_step", counted)
    return steps


def test_the_fuzz_set_covers_every_kind(in_tmp):
    assert len(CASES) >= 50
    configs = {c for c, _, _ in CASES}
    assert {QS, STUDENT, MNIST, VAE, ISAE, SHAPES, XOR, CONTEXTS, RELU, NTK, PHASE} <= configs


def _tiered(cases) -> list:
    """The quick tier (-m "not slow") runs each config's first case, one per recipe family and YAML
    file; the rest are slow (a CLI parse each, about 0.3 s: together the quick tier's longest check)."""
    seen: set[str] = set()
    out = []
    for i, case in enumerate(cases):
        marks = () if case[0] not in seen else (pytest.mark.slow,)
        seen.add(case[0])
        out.append(pytest.param(*case, marks=marks, id=f"{i:02d}"))
    return out


@pytest.mark.parametrize("config, overrides, expected", _tiered(CASES))
def test_invalid_setting_is_one_line_and_exit_2_before_training(in_tmp, capsys, no_training, config, overrides,
                                                                 expected):
    from zoo.cli import main

    _make_files(in_tmp)
    args = ["fit", "--config", config.format(tmp=in_tmp), *SHORT, *(a.format(tmp=in_tmp) for a in overrides)]
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    lines = err.strip("\n").split("\n")
    assert stop.value.code == 2, err[-3000:]
    first = lines[0]
    for word in expected:
        assert word in first, (word, err[-3000:])
    assert len(lines) <= 3, err
    assert not any(s in err for s in ("Traceback", "usage:", "Union subtypes", "Given value")), err
    assert no_training == []  # stopped before the first batch
    assert not list((in_tmp / "lightning_logs").rglob("*.ckpt"))  # no checkpoint of a run that should not be


ENTRY_POINT = [
    (["--model.init_args.lr=nan"], "DeepLinearNet: lr = nan; allowed: a positive number"),
    # found at setup, after Lightning has logged "Seed set", "GPU available", ...: still the first line
    (["--data=TeacherStudent"], "DeepLinearNet: task_aligned = true needs a datamodule with modes()"),
]


@pytest.fixture(scope="module", autouse=True)
def entry_point_runs(request, tmp_path_factory):
    """The real entry point's runs, started as this module begins (when their test is selected):
    they run beside the in-process cases. Run i: (its default_root_dir, the started process)."""
    runs = {}
    if selected(request, "real_entry_point"):
        for i, (overrides, _) in enumerate(ENTRY_POINT):
            root = tmp_path_factory.mktemp(f"entry{i}")
            runs[i] = root, start_zoo(root / "out", "fit", "--config", QS, f"--trainer.default_root_dir={root}",
                                      *SHORT, *overrides)
    yield runs
    for _, started in runs.values():
        stop_zoo(started)


@pytest.mark.parametrize("case", range(len(ENTRY_POINT)), ids=[m.split(":")[1].strip() for _, m in ENTRY_POINT])
@pytest.mark.slow
def test_the_real_entry_point_prints_the_message_first(entry_point_runs, case):
    root, started = entry_point_runs[case]
    out = finish(started)
    lines = out.stderr.strip("\n").split("\n")
    assert out.returncode == 2, out.stderr[-3000:]
    assert lines[0].startswith(ENTRY_POINT[case][1]) and len(lines) <= 3, out.stderr[-3000:]
    assert not list(root.rglob("*.ckpt"))


def test_zoo_traceback_shows_the_full_traceback_after_the_message(in_tmp, capsys, monkeypatch):
    from zoo.cli import main

    monkeypatch.setenv("ZOO_TRACEBACK", "1")
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", QS, *SHORT, "--model.init_args.lr=-1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("DeepLinearNet: lr = -1.0; allowed: a positive number\n")
    assert "Traceback (most recent call last)" in err and "raise ValueError" in err


def test_divergence_is_one_line_with_step_members_and_cause_and_exit_1(in_tmp, capsys):
    from zoo.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", QS, *SHORT, "--trainer.max_steps=50", "--trainer.callbacks=null",
              "--model.init_args.lr=1000", "--model.init_args.task_aligned=false",
              "--model.init_args.init.init_args.scale=1"])
    err = capsys.readouterr().err.strip("\n").split("\n")
    assert stop.value.code == 1
    # the message, then the hint; whatever Lightning logged once training started comes before
    assert "the loss is not finite at step" in err[-2] and "lam=0" in err[-2] and "lr=1000.0" in err[-2]
    assert err[-1].startswith("(set ZOO_TRACEBACK=1") and "DivergenceError" not in "\n".join(err), err


def test_errors_after_training_started_keep_their_traceback(in_tmp, monkeypatch):
    """A ValueError from the training step is a bug in a module, not a setting: it is re-raised."""
    from zoo.cli import main

    (in_tmp / "broken_module.py").write_text(textwrap.dedent("""
        from zoo import DeepLinearNet

        class Broken(DeepLinearNet):
            def training_step(self, batch, batch_idx):
                raise ValueError("a bug in training_step")
    """))
    monkeypatch.syspath_prepend(str(in_tmp))
    with pytest.raises(ValueError, match="a bug in training_step"):
        main(["fit", "--config", QS, *SHORT, "--model=broken_module.Broken"])


def test_build_cli_keeps_raising_the_exception(in_tmp):
    from zoo.cli import build_cli

    with pytest.raises(ValueError, match="task_aligned = true needs a datamodule with modes"):
        build_cli(["fit", "--config", QS, *SHORT, "--data=TeacherStudent"])


def test_nan_and_inf_on_the_command_line_are_yaml_floats():
    from zoo.cli.errors import yaml_non_finite

    assert yaml_non_finite(["fit", "--a=nan", "--b", "-inf", "--c=[0.0,NaN]", "--d=info", "--e", "x"]) == \
        ["fit", "--a=.nan", "--b=-.inf", "--c=[0.0,.nan]", "--d=info", "--e", "x"]


def _precisions() -> list:
    """Lightning's precision values, from the Trainer's public signature (the Literals of its union)."""
    import inspect
    import typing

    import lightning.pytorch as pl

    def leaves(t):
        return [v for a in typing.get_args(t) for v in (leaves(a) if typing.get_origin(a) is not None else [a])]

    hint = inspect.signature(pl.Trainer.__init__).parameters["precision"].annotation
    return [v for v in leaves(hint) if v is not type(None)]


# (recipe, overrides with "{root}" the run's folder, the first line's start, words it must hold too,
# folders under {root} that must not exist: data not read nor written, no run folder)
AS_A_USER = [
    (QS, ["--trainer.max_time=abc"], "trainer.max_time = 'abc'; allowed: ", ['"DD:HH:MM:SS"', "days", "timedelta"], []),
    (QS, ["--trainer.precision=bogus"], "trainer.precision = bogus; allowed: ", [repr(p) for p in _precisions()], []),
    # a bad model value with data to read: named before the data folder is looked at
    (MNIST, ["--data.init_args.data_dir={root}/mnist", "--model.init_args.lr=-1"],
     "MultiHeadClassifier: lr = -1.0; allowed: a positive number", [], ["mnist"]),
    (SHAPES, ["--data.init_args.data_dir={root}/shapes", "--model.init_args.lr=-1"],
     "BetaVAESweep: lr = -1.0; allowed: a positive number", [], ["shapes"]),
    # the datamodule checks its checkpoint as it is built, and encodes MNIST to give the model its d
    (ISAE, ["--data.init_args.checkpoint={root}/vae/none.ckpt", "--model.init_args.lr=-1"],
     "SparseAutoencoder: lr = -1.0; allowed: a positive number", [], ["vae"]),
]


@pytest.fixture(scope="module")
def as_a_user_runs(request, tmp_path_factory):
    """``python -m zoo fit`` of each AS_A_USER case in a folder of its own (its working directory)."""
    runs = {}
    if selected(request, "as_a_user"):
        for i, (config, overrides, *_) in enumerate(AS_A_USER):
            root = tmp_path_factory.mktemp(f"user{i}")
            runs[i] = root, start_zoo(tmp_path_factory.mktemp(f"user{i}_out"), "fit", "--config", config, *SHORT,
                                      *(a.format(root=root) for a in overrides), cwd=root)
    yield runs
    for _, started in runs.values():
        stop_zoo(started)


@pytest.mark.parametrize("case", range(len(AS_A_USER)), ids=[f"{c[0].rsplit('/', 1)[-1]}:{c[1][-1]}" for c in AS_A_USER])
@pytest.mark.slow
def test_as_a_user_the_setting_is_named_in_one_line_before_data_or_runs(as_a_user_runs, case):
    root, started = as_a_user_runs[case]
    _, _, first, words, absent = AS_A_USER[case]
    out = finish(started)
    lines = out.stderr.strip("\n").split("\n")
    assert out.returncode == 2, out.stderr[-3000:]
    assert lines[0].startswith(first) and len(lines) == 2 and lines[1].startswith("(set ZOO_TRACEBACK=1"), out.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not (root / "lightning_logs").exists() and not list(root.rglob("*.ckpt"))
    for folder in absent:
        assert not (root / folder).exists(), folder


def test_jsonargparse_types_in_a_users_words():
    from zoo.cli.errors import describe

    assert describe("<class 'float'>") == "a number" and describe("<class 'NoneType'>") == "null"
    assert describe("typing.Literal['16-mixed', 64]") == "'16-mixed', 64"
    assert describe("list[float]") == "a list of numbers" and describe("dict[str, int]") == "a mapping"
    assert describe("<class 'lightning.pytorch.loggers.logger.Logger'>") == "a Logger"
