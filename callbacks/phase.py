"""The two-pathway specialisation phase diagram, simulated beside the theory ([S] Fig. 3c)."""
from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch

from callbacks.base import output_path
from callbacks.figures import save_figure
from callbacks.base import log_matrix


class PhaseDiagram(pl.Callback):
    """At the end of the fit, the share of the map carried by the slow pathway (lam2) for every
    (lam1, lam2) member of a ``PathwayGrid`` ensemble, beside [S] Algorithm 1's prediction: the
    minimum over the fast pathway's learning of the slow pathway's remaining escape time
    (``zoo.theory.phase.phase_diagram``; 0: the slow pathway escapes, no specialisation).

    Writes ``phase_diagram.png`` (theory | simulation, lam2 on x, lam1 on y as in Fig. 3c) and
    logs both as images and ``phase/agreement``: the fraction of grid points (|lam1| > |lam2|)
    where theory (escape time > ``threshold_steps``) and simulation (slow share < ``share``)
    agree on whether the network specialised.
    """

    def __init__(self, threshold_steps: float = 1.0, share: float = 0.05) -> None:
        self.threshold_steps, self.share = threshold_steps, share

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.init import PathwayGrid

        if not isinstance(getattr(pl_module, "init_scheme", None), PathwayGrid):
            raise TypeError("PhaseDiagram needs a DeepLinearNet initialised with PathwayGrid (dims [1, 2, 1])")
        if trainer.datamodule is None or not callable(getattr(trainer.datamodule, "modes", None)):
            raise TypeError("PhaseDiagram needs a datamodule with modes() (e.g. datamodules.RankOne)")

    def compute(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, np.ndarray]:
        from zoo.theory.phase import phase_diagram

        scheme, m = pl_module.init_scheme, trainer.datamodule.modes()
        n1, n2 = scheme.grid_shape
        omegas = pl_module.pathway_strengths(m.U[:, 0], m.V[:, 0]).cpu()  # (E, 2)
        share = (omegas[:, 1] / omegas.sum(-1)).reshape(n1, n2)
        lam1 = torch.tensor(scheme.params["lam1"], dtype=torch.float64)
        lam2 = torch.tensor(scheme.params["lam2"], dtype=torch.float64)
        # whitened form: target s/c, time constant tau/c with tau = 1/lr steps: times come out in steps
        kw = dict(omega0=scheme.omega0) if scheme.omega0 is not None else dict(a0=scheme.a0)
        theory = phase_diagram(lam1[:, None], lam2[None, :], s=float(m.s[0]), d=1.0,
                               tau=1.0 / (pl_module.lr * m.c), **kw)
        return {"lam1": lam1.numpy(), "lam2": lam2.numpy(), "share": share.numpy(), "theory": theory.numpy()}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        r = self.compute(trainer, pl_module)
        valid = np.abs(r["lam1"])[:, None] > np.abs(r["lam2"])[None, :]
        theory_spec = np.nan_to_num(r["theory"], nan=0.0) > self.threshold_steps
        sim_spec = r["share"] < self.share
        agreement = float((theory_spec == sim_spec)[valid].mean()) if valid.any() else float("nan")
        for lg in trainer.loggers:
            lg.log_metrics({"phase/agreement": agreement}, step=trainer.global_step)
        log_matrix(trainer, "phase/simulated_slow_share", r["share"], title="slow pathway's share of the map",
                   symmetric=False)
        log_matrix(trainer, "phase/theory_log10_escape", np.log10(1 + np.nan_to_num(r["theory"], nan=0.0)),
                   title="theory: log10(1 + min escape time)", symmetric=False)
        self._figure(output_path(trainer, "phase_diagram.png"), r, agreement)
        self.result = r | {"agreement": agreement}

    def _figure(self, path, r, agreement: float) -> None:
        from callbacks.figures import _plt

        plt = _plt()
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), dpi=100)
        extent = [r["lam2"][0], r["lam2"][-1], r["lam1"][0], r["lam1"][-1]]
        im = axes[0].imshow(np.log10(1 + r["theory"]), origin="lower", aspect="auto", extent=extent, cmap="viridis")
        fig.colorbar(im, ax=axes[0], label="log10(1 + min escape time of slow pathway) [steps]")
        axes[0].set_title("theory ([S] Alg. 1): > 0 = specialises; white: |lam1| <= |lam2|", fontsize=9)
        valid = np.abs(r["lam1"])[:, None] > np.abs(r["lam2"])[None, :]
        im = axes[1].imshow(np.where(valid, r["share"], np.nan), origin="lower", aspect="auto", extent=extent, cmap="magma_r", vmin=0, vmax=0.5)
        fig.colorbar(im, ax=axes[1], label="slow pathway's share of the map (0 = specialised)")
        axes[1].set_title(f"simulation (gradient descent); agreement {agreement:.0%}", fontsize=9)
        for ax in axes:
            ax.set_xlabel("lam2 (slow pathway)")
            ax.set_ylabel("lam1 (fast pathway)")
        save_figure(fig, path)
