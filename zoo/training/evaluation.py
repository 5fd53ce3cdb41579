"""Lightning's evaluation hooks for modules whose validation and test do the same thing.

``validation_step`` / ``test_step`` feed the module's metrics of that stage
(``evaluate_batch(batch, stage)``), and the epoch ends compute, log and reset them
(``log_evaluation(stage)``), so ``lightning validate|test --config R --ckpt_path C`` prints them.
"""
from __future__ import annotations


class StagedEvaluation:
    """Mixin for a LightningModule: define ``evaluate_batch`` and ``log_evaluation``."""

    def evaluate_batch(self, batch, stage: str) -> None:
        """Update the metrics of ``stage`` ("val" or "test") with one batch."""
        raise NotImplementedError

    def log_evaluation(self, stage: str) -> None:
        """Compute, log and reset the metrics of ``stage`` at the end of its epoch."""
        raise NotImplementedError

    def validation_step(self, batch, batch_idx: int) -> None:
        self.evaluate_batch(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self.evaluate_batch(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self.log_evaluation("val")
        log_at_global_step(self)

    def on_test_epoch_end(self) -> None:
        self.log_evaluation("test")


def log_at_global_step(module) -> None:
    """In a fit, log Lightning's ``step`` key with this epoch's metrics: they go to the loggers at
    ``global_step``, the updates the weights they measure have had, the x-axis of every scalar
    (``zoo.training.logs.log_step``). Lightning's default there is one less: validation at the end of a
    training epoch runs before it counts the epoch's last batch."""
    if module.trainer.state.fn == "fit":
        # the same number on every rank: the max over ranks is itself (and Lightning does not warn)
        module.log("step", float(module.global_step), sync_dist=True, reduce_fx="max")
