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

    def on_test_epoch_end(self) -> None:
        self.log_evaluation("test")
