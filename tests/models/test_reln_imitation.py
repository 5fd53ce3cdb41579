"""zoo.models.reln_imitation.ImitationGDLNs (ReLN discovery, phase 2): its imitation errors equal a direct
computation from phase 1's record (k-means, gates, a GDLN per k trained by ``run_epochs``), for a
one- and a two-hidden-layer ReLU net; bad checkpoints, data and budgets are clear errors; the fit
resumes to the same bits and ``lightning test`` evaluates it."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from callbacks.reln import ActivationPatterns
from datamodules.contexts import Contexts
from tests.conftest import REPO
from zoo.models import reln
from zoo.cli.checkpoint_checks import CheckpointMismatch
from zoo.models.gdln import ReLUNet
from zoo.init import Gaussian
from zoo.models.reln_imitation import ImitationGDLNs



def _trainer(folder, max_steps: int, callbacks=()) -> pl.Trainer:
    from lightning.pytorch.loggers import TensorBoardLogger

    return pl.Trainer(max_steps=max_steps, max_epochs=-1, logger=TensorBoardLogger(folder, name="tb", version=0),
                      callbacks=list(callbacks), enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", default_root_dir=folder)


def _phase_1(folder, hidden: list[int], dm: Contexts) -> tuple[str, ReLUNet, ActivationPatterns]:
    """A small ReLU net fit with ActivationPatterns on each layer (records at 0, 40, ..., 160), saved."""
    net = ReLUNet(hidden=hidden, ensemble=2, init=Gaussian(sigma=0.05), lr=1e-3, epochs_per_step=40, seed=3)
    cb = ActivationPatterns(every_n_epochs=40, ks=[1, 2], layer=-1)
    # a deeper net's first layer has a record too: phase 2 must take the last layer's
    first = [ActivationPatterns(every_n_epochs=40, ks=[1], layer=0)] if len(hidden) == 2 else []
    trainer = _trainer(folder, 160, [*first, cb])
    trainer.fit(net, datamodule=dm)
    trainer.save_checkpoint(path := str(folder / "relu.ckpt"))
    return path, net, cb


# the two-layer case (DepthGDLNs; the last layer's record picked) in the slow tier: the quick one is full
@pytest.mark.parametrize("hidden", [[10], pytest.param([12, 12], marks=pytest.mark.slow)], ids=["one_layer", "two_layers"])
def test_imitation_errors_equal_the_direct_computation(hidden, tmp_path):
    dm = Contexts(3, "same")
    X, Y = dm.X, dm.Y
    path, relu, cb = _phase_1(tmp_path / "p1", hidden, dm)
    model = ImitationGDLNs(path, ks=[1, 2, 3], n_hidden=3, elbow_rule="within", n_init=2)
    _trainer(tmp_path / "p2", 160).fit(model, datamodule=dm)
    r = model.imitation()
    # the reference, from the record as phase 1's callback holds it: k-means, gates, one GDLN per k
    # (a DepthGDLN for two layers: its shared layer is the ReLU net's first) trained on its own
    rows, outputs, epochs = torch.cat(cb.history["rows"]).float(), torch.stack(cb.history["outputs"]), cb.history["epochs"]
    assert epochs == [0, 40, 80, 120, 160] and r["epochs"] == epochs
    ks = [k for k in (1, 2, 3) if k <= int((rows.sum(1) > 0).sum())]
    assert r["ks"] == ks and len(ks) >= 2
    errors = []
    for k, C in zip(ks, r["centroids"]):
        assert torch.equal(C, reln.cluster_patterns(rows, k, n_init=2))
        g = reln.gating_from_patterns(reln.threshold_centroids(C), X.shape[1])
        m = reln.gdln_for_gating(g, n_hidden=3, init=Gaussian(sigma=0.05), ensemble=2, lr=1e-3, reduction="sum",
                                 seed=3, n_shared=hidden[0] if len(hidden) == 2 else None)
        m.build(X, Y)
        errors.append(reln.imitation_error(outputs, reln.train_outputs(m, X, Y, epochs)))
    # the same GD updates in the same order (the optimizer's step is W - lr grad): equal to the bit
    assert r["errors"] == errors
    assert r["elbow_k"] == reln.elbow(ks, errors, "within", 0.1)
    folder = tmp_path / "p2" / "tb" / "version_0"
    assert (folder / "reln_elbow.png").stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    logged = {t: acc.Scalars(t)[-1].value for t in acc.Tags()["scalars"] if t.startswith("reln/")}
    assert logged == pytest.approx({**{f"reln/imitation_error/k{k}": e for k, e in zip(ks, errors)},
                                    "reln/elbow_k": r["elbow_k"]}, rel=1e-6)  # float32 in TensorBoard


def test_bad_checkpoint_data_or_budget_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="relu_checkpoint = .*no such file.*fig8_9_reln_discovery"):
        ImitationGDLNs(str(tmp_path / "missing.ckpt"))
    (junk := tmp_path / "junk.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointMismatch, match="relu_checkpoint = .*not a readable checkpoint"):
        ImitationGDLNs(str(junk))
    dm = Contexts(3, "same")
    path, _, _ = _phase_1(tmp_path / "p1", [10], dm)
    with pytest.raises(CheckpointMismatch, match="no record of callbacks.reln.ActivationPatterns .* network 'other'"):
        ImitationGDLNs(path, network="other")
    model = ImitationGDLNs(path, ks=[1], n_hidden=2, n_init=1)
    # phase 1's data passes the check; other targets, or other points, do not
    model.check_data(dm.X, dm.Y)
    with pytest.raises(ValueError, match="other outputs on this datamodule's inputs"):
        model.check_data(2 * dm.X, dm.Y)
    with pytest.raises(ValueError, match="24, 11 and 60: give phase 1's data"):
        model.check_data(dm.X[:5], dm.Y[:5])
    for steps in (-1, 161):
        with pytest.raises(ValueError, match=r"trainer.max_steps = .*allowed: 1 \.\. 160"):
            _trainer(tmp_path / "p2", steps).fit(model, datamodule=dm)
    with pytest.raises(ValueError, match="elbow = True.*fig9_reln_elbow"):
        ActivationPatterns(elbow=True)


@pytest.mark.slow
def test_phase_2_resumes_exactly_and_tests(tmp_path, monkeypatch):
    """The recipes through the CLI, small: phase 1, then phase 2 whole and stopped at epoch 150 then
    resumed (final weights, scalars and figure bit for bit); ``lightning test`` on its checkpoint."""
    from resume_harness import assert_same_run, checkpoint_step, fit

    from tests.conftest import run_cli

    R = REPO / "recipes" / "haste_slowly"
    relu = fit(tmp_path / "p1", "--config", str(R / "fig8_9_reln_discovery.yaml"), "--trainer.max_steps=300",
               "--model.init_args.hidden=[30]")  # records every 100 epochs
    ckpt = relu / "checkpoints" / "last.ckpt"
    args = ["--config", str(R / "fig9_reln_elbow.yaml"), f"--model.init_args.relu_checkpoint={ckpt}",
            "--model.init_args.ks=[1, 2]", "--model.init_args.n_init=2", "--trainer.max_steps=300"]
    full = fit(tmp_path / "full", *args)
    fit(tmp_path / "resumed", *args, "--trainer.max_steps=150")  # stops between two records
    assert checkpoint_step(tmp_path / "resumed/lightning_logs/version_0/checkpoints/last.ckpt") == 150
    run = fit(tmp_path / "resumed", *args, "--ckpt_path", "last")
    assert_same_run(full, run, stop_step=150)
    monkeypatch.chdir(tmp_path)  # the test command's run folder
    cli = run_cli("test", *args, "--ckpt_path", str(full / "checkpoints" / "last.ckpt"))
    assert {"test/mse/k1", "test/mse/k2"} <= set(cli.trainer.callback_metrics)
    # the checkpoint holds this module's own arguments: it loads without a config
    loaded = ImitationGDLNs.load_from_checkpoint(full / "checkpoints" / "last.ckpt", map_location="cpu")
    assert loaded.names == ["k1", "k2"] and torch.equal(loaded.models[1].W[0], cli.model.models[1].W[0])
