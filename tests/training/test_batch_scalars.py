"""zoo.training.logs.log_batch_scalars for the GDLN modules: the rows a logger receives for ``loss``,
``step`` and ``loss/<label>`` are those of logging every batch (every ``log_every_n_steps``-th
batch of the fit, Lightning's rule), each holding the loss of its batch's first epoch at that
epoch's step, and ``callback_metrics`` hold the last batch's loss at each epoch's end."""
from __future__ import annotations

import csv

import lightning.pytorch as pl
import pytest
import torch
from helpers_fit import fit as fit_quietly, trainer as quiet
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from datamodules import XorMargin
from zoo.models.gdln import GDLN, Comparison, ReLUNet
from zoo.init import Gaussian

BATCHES, EPOCHS, K = 4, 3, 2  # batches per Lightning epoch, Lightning epochs, GD epochs per batch


class Record(pl.Callback):
    """Each batch's first-epoch losses (the module's outputs) and ``callback_metrics`` at each epoch's end."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.epoch_end: list[dict[str, torch.Tensor]] = []
        self.bar: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches.append((outputs["first_epoch"], {n: l[:, 0].clone() for n, l in outputs["epoch_loss"].items()}))
        self.bar.append(dict(trainer.progress_bar_metrics))

    def on_train_epoch_end(self, trainer, pl_module):
        self.epoch_end.append(dict(trainer.callback_metrics))


def fit(module: pl.LightningModule, every: int, tmp_path, bar: bool = False) -> tuple[Record, list[dict], dict]:
    """Fit on ``BATCHES`` x ``EPOCHS`` full batches with a CSV and a TensorBoard logger (and a
    progress bar if ``bar``); the CSV rows and the TensorBoard scalars (tag -> [(step, value)])."""
    record = Record()
    loggers = [CSVLogger(tmp_path, name="csv", version=0), TensorBoardLogger(tmp_path, name="tb", version=0)]
    fit_quietly(module, XorMargin(Delta=[0.3, 1.5], batches_per_epoch=BATCHES), logger=loggers, callbacks=[record],
                max_epochs=EPOCHS, log_every_n_steps=every, enable_progress_bar=bar)
    with open(tmp_path / "csv" / "version_0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    acc = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return record, rows, scalars


def written(record: Record, every: int) -> list[tuple[int, dict[str, torch.Tensor]]]:
    """The batches Lightning writes: every ``every``-th of the fit, counted across epochs."""
    assert len(record.batches) == BATCHES * EPOCHS
    return [b for i, b in enumerate(record.batches, 1) if i % every == 0]


def check_rows(rows: list[dict], scalars: dict, expected: dict[int, dict[str, torch.Tensor]]) -> None:
    """Exactly the ``expected`` rows (step -> key -> value): in the CSV to the bit, in TensorBoard as float32."""
    keys = set(next(iter(expected.values())))
    csv_rows = {int(r["step"]): {k: float(r[k]) for k in keys if r[k] != ""} for r in rows if keys & {k for k in r if r[k]}}
    assert csv_rows == {s: {k: float(v) for k, v in m.items()} for s, m in expected.items()}
    for key in keys:
        assert scalars[key] == [(s, float(m[key].float())) for s, m in expected.items()]


@pytest.mark.parametrize("every", [1, 3])
def test_a_full_batch_nets_rows_and_epoch_end_loss(every, tmp_path):
    net = GDLN(gating="xor", n_hidden=4, init=Gaussian(sigma=0.1), ensemble=2, lr=0.2, epochs_per_step=K)
    record, rows, scalars = fit(net, every, tmp_path)
    labels = net.labels
    expected = {step: {"loss": l["GDLN"].mean()} | {f"loss/{lbl}": v for lbl, v in zip(labels, l["GDLN"])}
                for step, l in written(record, every)}
    # a batch's row sits at the step of its first epoch: K GD epochs per batch
    assert list(expected) == [K * (i - 1) for i in range(every, BATCHES * EPOCHS + 1, every)]
    check_rows(rows, scalars, expected)
    # at each epoch's end the last batch's loss, whether that batch was written or not
    ends = [record.batches[BATCHES * (e + 1) - 1][1]["GDLN"].mean() for e in range(EPOCHS)]
    assert [torch.equal(m["loss"], end) for m, end in zip(record.epoch_end, ends)] == [True] * EPOCHS


@pytest.mark.parametrize("every", [1, 3])
def test_a_comparisons_rows_and_epoch_end_losses(every, tmp_path):
    kw = dict(init=Gaussian(sigma=0.1), ensemble=2, lr=0.2)
    c = Comparison([ReLUNet(hidden=[4], **kw), GDLN(gating="xor", n_hidden=4, **kw)], names=["relu", "xor"],
                   epochs_per_step=K)
    record, rows, scalars = fit(c, every, tmp_path)
    expected = {step: {f"loss/{n}": v.mean() for n, v in l.items()} for step, l in written(record, every)}
    check_rows(rows, scalars, expected)
    assert "loss" not in scalars and "loss" not in record.epoch_end[-1]  # a comparison has no overall loss
    for e, metrics in enumerate(record.epoch_end):
        last = record.batches[BATCHES * (e + 1) - 1][1]
        assert all(torch.equal(metrics[f"loss/{n}"], last[n].mean()) for n in ("relu", "xor"))


def test_a_progress_bar_shows_every_batchs_loss_and_only_the_loss(tmp_path):
    net = GDLN(gating="xor", n_hidden=4, init=Gaussian(sigma=0.1), ensemble=2, lr=0.2, epochs_per_step=K)
    record, rows, _ = fit(net, 3, tmp_path / "net", bar=True)
    assert [m["loss"] for m in record.bar] == [float(l["GDLN"].mean()) for _, l in record.batches]
    assert len([r for r in rows if r["loss"]]) == BATCHES * EPOCHS // 3  # the rows stay every third batch's
    kw = dict(init=Gaussian(sigma=0.1), ensemble=2, lr=0.2)
    c = Comparison([ReLUNet(hidden=[4], **kw), GDLN(gating="xor", n_hidden=4, **kw)], names=["relu", "xor"],
                   epochs_per_step=K)
    record, _, _ = fit(c, 3, tmp_path / "comparison", bar=True)
    assert all(not any(k.startswith("loss") for k in m) for m in record.bar)  # a comparison's losses are not on it


class _Regression(pl.LightningModule):
    """Automatic optimisation on fixed batches; the loss logged by ``zoo.training.logs.log_batch_rows``, or by
    ``self.log`` (``own_rows=False``: Lightning's rows)."""

    def __init__(self, own_rows: bool) -> None:
        super().__init__()
        self.own_rows, self.w = own_rows, torch.nn.Parameter(torch.ones(1))

    def training_step(self, batch, batch_idx):
        from zoo.training.logs import log_batch_rows

        loss = (self.w * batch[0]).pow(2).mean()
        if self.own_rows:
            log_batch_rows(self, self.global_step, {"loss": loss.detach()}, pending=1)
        else:
            self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val", (self.w * batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _KeepEpochEnd(pl.Callback):
    """Keeps the checkpoint saved at the end of epoch 0 (after its validation), as a run killed later."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import shutil

        kept = trainer.checkpoint_callback.dirpath + "/kept.ckpt"
        if trainer.current_epoch == 1 and batch_idx == 0:
            shutil.copy(trainer.checkpoint_callback.last_model_path, kept)


def _loss_rows(tmp_path, name: str, own_rows: bool, ckpt: str | None = None) -> list[tuple[int, float]]:
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(40, 1)), batch_size=4)  # 10 fixed batches an epoch
    saves = ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True, save_on_train_epoch_end=True)
    trainer = quiet(logger=CSVLogger(tmp_path, name=name, version=0), callbacks=[saves] + ([] if ckpt else [_KeepEpochEnd()]),
                            max_steps=17, log_every_n_steps=3, enable_checkpointing=True)
    trainer.fit(_Regression(own_rows), data, data, ckpt_path=ckpt)
    with open(tmp_path / name / "version_0" / "metrics.csv", newline="") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f) if r.get("loss")]


@pytest.mark.parametrize("own_rows", [True, False])
def test_resumed_from_an_epochs_end_after_its_validation_the_rows_are_the_runs(own_rows, tmp_path):
    """Lightning 2.6 counts one batch more after resuming from a checkpoint saved at an epoch's end
    after that epoch's validation, under max_steps: ``self.log``'s rows move by a batch (the row at
    step 11 holds batch 10's loss). ``log_batch_rows`` writes the uninterrupted run's rows."""
    full = _loss_rows(tmp_path, "full", own_rows)
    resumed = _loss_rows(tmp_path, "resumed", own_rows, ckpt=str(tmp_path / "ck" / "kept.ckpt"))
    same = resumed == [row for row in full if row[0] >= 10]
    assert same == own_rows  # Lightning's own rows move (if this fails for self.log, Lightning was fixed)
