"""The task switch of the multi-head ensembles (``MultiHeadStudent``, ``MultiHeadClassifier``),
done at the end of the old task's last batch so that checkpoints and resumes see it once."""
from __future__ import annotations

from zoo.training.progress import attached_trainer


class TaskSwitchAtBatchEnd:
    """Mixin for a LightningModule with ``on_task_switch(old, new)`` trained on a datamodule with
    ``task_at(step)`` and ``num_steps``.

    After the last update of a task, :meth:`end_of_task` calls ``on_task_switch`` inside the batch:
    a checkpoint taken at the switch then holds its work (EWC anchors, their logged summary), and a
    run resumed from it neither repeats it nor logs its points twice. ``_task_ended`` (saved in
    checkpoints) is the task whose end was handled last; ``_switch_step`` the step it was handled at.
    """

    _task_ended: int | None = None
    _switch_step: int = 0

    def end_of_task(self, task: int, step: int) -> None:
        """Switch if the datamodule's ``task_at(step)``, the next step's task, is not ``task``."""
        dm = getattr(attached_trainer(self), "datamodule", None)
        task_at, end = getattr(dm, "task_at", None), getattr(dm, "num_steps", None)
        if not callable(task_at) or end is None or step >= end:
            return
        new = int(task_at(step))
        if new != task:
            self._switch_step = step
            self.on_task_switch(task, new)
            self._task_ended = task

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["task_ended"] = self._task_ended

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._task_ended = checkpoint.get("task_ended")
