"""zoo.training.steps: updates applied by the torch optimizer directly are counted by Lightning as if each
had gone through ``LightningOptimizer.step`` (global_step, max_steps, checkpointed loop state)."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from zoo.training.steps import Updates, direct_updates_allowed

K = 5  # updates per batch


class ManySteps(pl.LightningModule):
    """K plain GD updates of a linear map per batch, through zoo.training.steps.Updates."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.W = torch.nn.Parameter(torch.full((2, 3), 0.1))
        self.direct: list[bool] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        updates = Updates(self)
        self.direct.append(updates.direct)
        for _ in range(K):
            loss = 0.5 * ((x @ self.W.T - y) ** 2).sum(-1).mean()
            self.W.grad = torch.autograd.grad(loss, self.W)[0]
            updates()
        updates.finish()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(8, 3, generator=g)
        return DataLoader(TensorDataset(x, x[:, :2] * 2.0), batch_size=4)


class AppliedItself(ManySteps):
    """The same K updates written into the module's own loop (``W -= lr grad``), counted with ``applied``."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        updates = Updates(self)
        self.direct.append(updates.direct)
        lr = self.optimizers().optimizer.param_groups[0]["lr"]
        for _ in range(K):
            loss = 0.5 * ((x @ self.W.T - y) ** 2).sum(-1).mean()
            with torch.no_grad():
                self.W.sub_(torch.autograd.grad(loss, self.W)[0], alpha=lr)
        updates.applied(K)
        updates.finish()


class EveryUpdate(pl.Callback):
    """A hook Lightning calls at every update: its presence sends each update through Lightning."""

    def __init__(self) -> None:
        self.calls = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.calls += 1


def fit(max_steps: int, callbacks=(), module_type: type[ManySteps] = ManySteps, **kw) -> tuple[pl.Trainer, ManySteps]:
    module = module_type()
    checkpointing = any(isinstance(cb, pl.callbacks.ModelCheckpoint) for cb in callbacks)
    trainer = pl.Trainer(max_steps=max_steps, max_epochs=3, logger=False, enable_checkpointing=checkpointing,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks), **kw)
    trainer.fit(module)
    return trainer, module


def test_global_step_counts_every_update_and_matches_lightnings_own_step():
    trainer, direct = fit(6 * K)  # six batches (three epochs of two)
    assert all(direct.direct) and trainer.global_step == 6 * K
    hook = EveryUpdate()
    trainer_l, via_lightning = fit(6 * K, callbacks=[hook])
    assert not any(via_lightning.direct) and hook.calls == 6 * K and trainer_l.global_step == 6 * K
    assert torch.equal(direct.W, via_lightning.W)  # the same updates, bit for bit
    assert trainer.fit_loop.epoch_loop.state_dict() == trainer_l.fit_loop.epoch_loop.state_dict()


def test_resume_from_a_checkpoint_continues_the_count(tmp_path):
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2 * K, save_top_k=-1)
    fit(6 * K, callbacks=[ckpt])
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"epoch={e}-step={s}.ckpt" for e, s in
                                                         ((0, 2 * K), (1, 4 * K), (2, 6 * K))]
    module = ManySteps()
    trainer = pl.Trainer(max_steps=6 * K, max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module, ckpt_path=tmp_path / f"epoch=0-step={2 * K}.ckpt")
    assert trainer.global_step == 6 * K and len(module.direct) == 4
    _, straight = fit(6 * K)
    assert torch.equal(module.W, straight.W)


@pytest.mark.parametrize("precision, direct", [("32-true", True), ("64-true", True), ("bf16-mixed", False)])
def test_direct_only_under_plain_precision(precision, direct):
    module = ManySteps()
    trainer = pl.Trainer(max_steps=1, precision=precision, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    module.trainer = trainer
    assert direct_updates_allowed(module) is direct


def test_updates_applied_by_the_module_count_as_its_optimizers_steps():
    trainer, itself = fit(6 * K, module_type=AppliedItself)
    trainer_o, through = fit(6 * K)
    assert all(itself.direct) and trainer.global_step == trainer_o.global_step == 6 * K
    assert torch.equal(itself.W, through.W)  # plain SGD's update, bit for bit
    assert trainer.fit_loop.epoch_loop.state_dict() == trainer_o.fit_loop.epoch_loop.state_dict()
    # where a hook expects every update, Lightning must see each one: applying them unseen is refused
    with pytest.raises(RuntimeError, match="Updates.applied: these updates go through LightningOptimizer.step"):
        fit(K, callbacks=[EveryUpdate()], module_type=AppliedItself)
