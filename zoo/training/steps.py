"""Gradient updates a module applies itself, counted by Lightning as optimizer steps.

The zoo's small networks take many gradient updates per batch (``DeepLinearNet.steps_per_batch``,
the gated networks' ``epochs_per_step``): a step of an 8-8-8 linear network or of the [H] App. H
ReLU net costs a few microseconds to ~150 us of arithmetic. In manual optimisation Lightning counts
``global_step`` inside ``LightningOptimizer.step``, which also runs the precision plugin and every
callback's ``on_before_optimizer_step`` hook: ~30-50 us an update, paid thousands of times.

:class:`Updates` applies the updates with the torch optimizer's own ``step`` and then advances
Lightning's count of optimizer steps by as many (``advance_global_step``), so ``global_step``,
``max_steps``, ``ModelCheckpoint(every_n_train_steps=...)`` and the loop state saved in a
checkpoint still count gradient updates, exactly as if each had gone through Lightning.

It does so only where skipping Lightning's step changes nothing but the time: plain precision
(the base ``Precision.optimizer_step``: 32, 64, 16-true, bf16-true; not AMP's gradient scaler,
DeepSpeed or FSDP), a single-device or DDP strategy, and no callback or module overriding
``on_before_optimizer_step`` (a hook that expects every update, e.g. gradient-norm logging).
Otherwise every update goes through ``LightningOptimizer.step`` as before. Hooks that run once
per batch (``on_train_batch_end``, the zoo's callbacks) are unaffected.

This is the one place the zoo writes a counter of Lightning's loops (an attribute chain of public
names, ``fit_loop.epoch_loop.manual_optimization.optim_step_progress``, the same in lightning 2.5
and 2.6; listed in docs/development.md). Lightning has no public way to count an update that did
not go through ``LightningOptimizer.step``: counting each through it (a no-op step per update) costs
what skipping it saves, ~30-60 us an update measured on this machine's CPU, against a few
microseconds for an update of the zoo's small networks.
"""
from __future__ import annotations

from typing import Any, Callable

import lightning.pytorch as pl
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from lightning.pytorch.utilities.model_helpers import is_overridden

_PLAIN_STRATEGY_STEPS = (Strategy.optimizer_step, DDPStrategy.optimizer_step)


def direct_updates_allowed(module: pl.LightningModule) -> bool:
    """Whether ``module``'s updates may bypass ``LightningOptimizer.step`` without changing what
    happens (the conditions in the module docstring)."""
    trainer = module.trainer
    strategy = trainer.strategy
    if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):
        return False
    if type(strategy).optimizer_step not in _PLAIN_STRATEGY_STEPS:
        return False
    if type(trainer.precision_plugin).optimizer_step is not Precision.optimizer_step:
        return False
    if is_overridden("on_before_optimizer_step", module, pl.LightningModule):
        return False
    return not any(is_overridden("on_before_optimizer_step", cb, pl.Callback) for cb in trainer.callbacks)


def advance_global_step(module: pl.LightningModule, n: int) -> None:
    """Count ``n`` optimizer updates the module applied itself in Lightning's progress (manual
    optimisation): ``trainer.global_step`` grows by ``n``."""
    module.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.increment_by(int(n))


class Updates:
    """The update step of one training batch: ``step()`` applies one update (``applied(n)`` counts
    ``n`` applied by the module itself); ``finish()`` after the batch's last update makes
    Lightning's ``global_step`` count them.

    ``step`` is the torch optimizer's own ``step`` where :func:`direct_updates_allowed`, else
    ``LightningOptimizer.step`` (which counts each update itself)."""

    def __init__(self, module: pl.LightningModule, optimizer: Any = None) -> None:
        lightning_optimizer = optimizer if optimizer is not None else module.optimizers()
        self.module = module
        self.direct = direct_updates_allowed(module)
        self.step: Callable[[], Any] = lightning_optimizer.optimizer.step if self.direct else lightning_optimizer.step
        self.count = 0

    def __call__(self) -> None:
        self.step()
        self.count += 1

    def applied(self, n: int) -> None:
        """``n`` updates were applied directly, not through ``step`` (a loop with the optimizer's
        update written in, ``zoo.kernels.gdln.GradientDescent.stepped_directly``): ``finish`` counts them.
        Only where updates bypass Lightning (``direct``): otherwise Lightning counts each one itself."""
        if not self.direct:
            raise RuntimeError("Updates.applied: these updates go through LightningOptimizer.step (a hook or plugin "
                               "expects every update); apply each with updates() instead")
        self.count += int(n)

    def finish(self) -> None:
        if self.direct and self.count:
            advance_global_step(self.module, self.count)
        self.count = 0
