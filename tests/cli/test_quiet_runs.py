"""A CLI run shows no Lightning advertisement and no third-party deprecation, and leaves every
filter as it found it (zoo.cli.quiet); the zoo's own and Lightning's other warnings still come through."""
from __future__ import annotations

import logging
import warnings

import pytest

from conftest import REPO, run_cli
from zoo.cli.quiet import TIP_LOGGER, quiet_run

# a GDLN on the contexts task: full-batch, no validation loader in fit ([]), Lightning's pytree per batch
GDLN = ["--model=zoo.models.gdln.GDLN", "--model.init_args.gating=reln", "--model.init_args.n_hidden=4",
        "--model.init_args.epochs_per_step=5", "--data=datamodules.contexts.Contexts", "--trainer.max_steps=10",
        "--trainer.max_epochs=-1", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
QS = ["--config", f"{REPO}/recipes/quickstart.yaml", "--trainer.max_steps=20", "--trainer.enable_progress_bar=false",
      "--trainer.enable_model_summary=false", "--trainer.callbacks=[]"]
NOISE = ("💡 Tip", "litlogger", "litmodels", "LeafSpec", "Total length of `list`", "Please add the following callbacks",
         "TPU available: False")


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def heard():
    """Everything Lightning logs and every warning raised (each time, not once per place), as lines."""
    rec, lightning_log = Recorder(), logging.getLogger("lightning.pytorch")
    lightning_log.addHandler(rec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield lambda: rec.lines + [f"{w.category.__name__}: {w.message}" for w in caught]
    lightning_log.removeHandler(rec)


def test_a_bare_trainer_shows_the_tip(heard, tmp_path):
    # the control: outside a zoo run Lightning advertises, and this fixture hears it
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    pl.Trainer(logger=CSVLogger(tmp_path), enable_checkpointing=False, enable_progress_bar=False)
    assert any(line.startswith("💡 Tip") for line in heard())


def test_fit_and_test_runs_are_quiet(heard, in_tmp):
    filters, tip_filters = list(warnings.filters), list(logging.getLogger(TIP_LOGGER).filters)
    run_cli("fit", *GDLN)
    run_cli("fit", *QS)
    run_cli("test", *QS, "--ckpt_path", "last")
    lines = heard()
    assert lines, "the fixture heard nothing: Lightning's 'GPU available' line at least is logged"
    assert not [line for line in lines if any(n in line for n in NOISE)]
    # no deprecation of another project's API reaches the user (jsonargparse's show once per process)
    assert not [line for line in lines if line.startswith(("DeprecationWarning", "FutureWarning"))]
    # nothing stays behind: a user's own code keeps its warnings and Lightning's logger its messages
    assert warnings.filters == filters and logging.getLogger(TIP_LOGGER).filters == tip_filters


def test_only_the_named_messages_are_dropped(heard):
    from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

    with quiet_run():
        rank_zero_info("💡 Tip: For seamless cloud things, install more")
        rank_zero_info("Tip: a message of the same logger that is no advertisement")
        # the same text from another module (the zoo's, a user's) and another category still show
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated in my code", DeprecationWarning)
        rank_zero_warn("Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be "
                       "provided during `Trainer` instantiation. Please add the following callbacks: ['Mine'].")
    lines = heard()
    assert not any(line.startswith("💡") for line in lines)
    assert "Tip: a message of the same logger that is no advertisement" in lines
    assert sum("LeafSpec" in line for line in lines) == 2
    assert any("['Mine']" in line for line in lines)


@pytest.mark.parametrize("max_images", [4, None])
def test_an_image_callback_shows_every_member_or_says_how_many_it_left_out(tmp_path, max_images):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from callbacks.balance import Balance
    from datamodules.regression import SemanticHierarchy
    from zoo.models.deep_linear import DeepLinearNet
    from zoo.init import LambdaBalanced

    net = DeepLinearNet(dims=[8, 8, 8], init=LambdaBalanced(lam=[-8.0, -2.0, 0.0, 2.0, 8.0], scale=1e-3))
    balance = Balance(every_n_steps=1) if max_images is None else Balance(every_n_steps=1, max_images=max_images)
    trainer = pl.Trainer(max_steps=2, logger=TensorBoardLogger(tmp_path, name="tb", version=0), callbacks=[balance],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(net, datamodule=SemanticHierarchy(batches_per_epoch=2))
    acc = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"images": 0})
    acc.Reload()
    drawn = sorted(t for t in acc.Tags()["images"] if t.startswith("balance/"))
    said = [str(w.message) for w in caught if "left out" in str(w.message)]
    if max_images is None:  # the default shows the quickstart's five
        assert len(drawn) == 5 and not said
    else:
        assert drawn == sorted(f"balance/{lbl}" for lbl in net.labels[:4])
        assert len(said) == 1, said  # once, though the images are drawn twice (start and end)
        assert f"the first 4 of the 5 members; 1 left out (from {net.labels[4]})" in said[0]
        assert "set Balance's max_images to 5" in said[0]
