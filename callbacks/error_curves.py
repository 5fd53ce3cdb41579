"""Every task's generalisation error over time, members grouped into panels ([S] Fig. 7)."""
from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch

from callbacks.base import PeriodicCallback, output_path
from callbacks.figures import save_figure


def parse_label(label: str) -> dict[str, str]:
    """``"theta=0,xi=0.01"`` -> ``{"theta": "0", "xi": "0.01"}`` (member labels of the zoo's modules)."""
    out = {}
    for part in label.split(","):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


class ErrorCurves(PeriodicCallback):
    """Records the error of every task for every member and, at the end of the fit, draws them.

    Errors come from the order parameters (``theory_error``: [S] Eq. 9 evaluated on the
    simulated weights, exact and free of Monte-Carlo noise) or, with ``source="mc"``, from the
    datamodule's test set. Logs ``error/<member>/task<t>``. The figure ``error_curves.png`` has one
    panel per value of the label key ``group_by`` (e.g. ``theta``: the initialisation), one colour
    per value of ``color_by`` (e.g. ``xi``), task 1 solid and later tasks dashed, the switches
    dotted.
    """

    def __init__(self, every_n_steps: int = 1000, group_by: str | None = None, color_by: str | None = None,
                 source: str = "theory", log_scale: bool = False) -> None:
        super().__init__(every_n_steps)
        if source not in ("theory", "mc"):
            raise ValueError(f"ErrorCurves: source = {source!r}; allowed: 'theory' or 'mc'")
        self.group_by, self.color_by, self.source, self.log_scale = group_by, color_by, source, log_scale
        self.steps: list[int] = []
        self.errors: list[torch.Tensor] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.need(pl_module, "task_errors", "theory_error" if self.source == "theory" else "test_error")
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "W_teachers"):
            raise TypeError("ErrorCurves needs a teacher-student datamodule (datamodules.TeacherStudent)")
        if self.source == "theory" and getattr(pl_module, "activation", None) == "sigmoid":
            raise ValueError("ErrorCurves: source = 'theory' has no closed form for activation 'sigmoid'; use source = 'mc'")

    def on_start(self, trainer, pl_module) -> None:
        labels = pl_module.labels
        for key, what in ((self.group_by, "group_by"), (self.color_by, "color_by")):
            if key is not None and not all(key in parse_label(lbl) for lbl in labels):
                raise ValueError(f"ErrorCurves: {what} = {key!r} is not a parameter in every member's label ({labels[:3]}...)")

    # the curves so far are saved in checkpoints: a resumed fit draws the whole run, not its last part
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":  # before a checkpoint's state is restored
            self.steps, self.errors = [], []

    def state_dict(self) -> dict:
        return {"steps": list(self.steps), "errors": list(self.errors)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.steps, self.errors = list(state_dict["steps"]), list(state_dict["errors"])

    def error(self, trainer, pl_module) -> torch.Tensor:
        return pl_module.task_errors(trainer.datamodule, self.source)

    def on_due(self, trainer, pl_module, outputs) -> None:
        eps = self.error(trainer, pl_module)  # (E, n_tasks)
        self.steps.append(trainer.global_step)
        self.errors.append(eps)
        self.log_scalars(trainer, {f"error/{lbl}/task{t}": eps[e, t] for e, lbl in enumerate(pl_module.labels)
                                   for t in range(eps.shape[1])})

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or not self.errors:
            return
        alpha = np.array(self.steps) / pl_module.d
        eps = torch.stack(self.errors).numpy()  # (T, E, n_tasks)
        switches = [s / pl_module.d for s in getattr(trainer.datamodule, "switch_steps", [])]
        self.figure(output_path(trainer, "error_curves.png"), alpha, eps, pl_module.labels, switches)

    def figure(self, path, alpha: np.ndarray, eps: np.ndarray, labels: list[str], switches: list[float]):
        from callbacks.figures import _plt

        plt = _plt()
        parsed = [parse_label(lbl) for lbl in labels]
        groups = list(dict.fromkeys(p[self.group_by] for p in parsed)) if self.group_by else [None]
        colours_by = list(dict.fromkeys(p[self.color_by] for p in parsed)) if self.color_by else labels
        cmap = plt.cm.viridis(np.linspace(0, 0.95, max(len(colours_by), 2)))
        fig, axes = plt.subplots(1, len(groups), figsize=(5.0 * len(groups), 4.0), dpi=100, squeeze=False, sharey=True)
        for g, ax in zip(groups, axes[0]):
            for e, (lbl, p) in enumerate(zip(labels, parsed)):
                if g is not None and p[self.group_by] != g:
                    continue
                key = p[self.color_by] if self.color_by else lbl
                c = cmap[colours_by.index(key)]
                name = f"{self.color_by}={key}" if self.color_by else lbl
                for t in range(eps.shape[2]):
                    ax.plot(alpha, eps[:, e, t], color=c, ls="-" if t == 0 else "--", lw=1.6,
                            label=name if t == 0 else None)
            for s in switches:
                ax.axvline(s, color="grey", ls=":", lw=0.8)
            if self.log_scale:
                ax.set_yscale("log")
            ax.set_xlabel("alpha = steps / d")
            ax.set_title(f"{self.group_by}={g}" if g is not None else "", fontsize=10)
        axes[0][0].set_ylabel("generalisation error (solid: task 1, dashed: task 2)")
        axes[0][-1].legend(fontsize=7)
        save_figure(fig, path)
        return path
