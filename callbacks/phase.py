"""The two-pathway specialisation phase diagram, simulated beside the theory ([S] Fig. 3c)."""
from __future__ import annotations

import lightning.pytorch as pl

from callbacks.base import log_figure, log_matrix, log_scalars


class PhaseDiagram(pl.Callback):
    """At the end of the fit, the share of the map carried by the slow pathway (lam2) for every
    (lam1, lam2) member of a ``PathwayGrid`` ensemble, beside [S] Algorithm 1's prediction
    (``DeepLinearNet.pathway_phase``: the minimum over the fast pathway's learning of the slow
    pathway's remaining escape time; 0: the slow pathway escapes, no specialisation).

    Logs both as images and ``phase/agreement`` (``zoo.analysis.phase.phase_agreement``: the
    fraction of grid points, |lam1| > |lam2|, where theory (escape time > ``threshold_steps``)
    and simulation (slow share < ``share``) agree on whether the network specialised), and
    ``zoo.plots.linear.two_pathway_phase`` (theory | simulation, lam2 on x, lam1 on y as in
    Fig. 3c), written as ``phase_diagram.png``. ``result`` holds the numbers.
    """

    def __init__(self, threshold_steps: float = 1.0, share: float = 0.05) -> None:
        self.threshold_steps, self.share = threshold_steps, share

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.init import PathwayGrid

        if not isinstance(getattr(pl_module, "init_scheme", None), PathwayGrid):
            raise TypeError("PhaseDiagram needs a DeepLinearNet initialised with PathwayGrid (dims [1, 2, 1])")
        if not callable(getattr(trainer.datamodule, "modes", None)):
            raise TypeError("PhaseDiagram needs a datamodule with modes() (e.g. datamodules.RankOne)")

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from zoo.analysis.phase import phase_agreement
        from zoo.plots.linear import two_pathway_phase

        if not trainer.is_global_zero:
            return
        r = pl_module.pathway_phase(trainer.datamodule.modes())  # lam1, lam2, share, escape
        agreement = phase_agreement(r["lam1"], r["lam2"], escape=r["escape"], share=r["share"],
                                    threshold_steps=self.threshold_steps, max_share=self.share)
        log_scalars(trainer, {"phase/agreement": agreement})
        log_matrix(trainer, "phase/simulated_slow_share", r["share"], title="slow pathway's share of the map",
                   symmetric=False)
        log_matrix(trainer, "phase/theory_log10_escape", (1 + r["escape"].nan_to_num(0.0)).log10(),
                   title="theory: log10(1 + min escape time)", symmetric=False)
        self.result = {k: v.numpy() for k, v in r.items()} | {"agreement": agreement}
        fig = two_pathway_phase(*(self.result[k] for k in ("lam1", "lam2", "escape", "share")), agreement)
        log_figure(trainer, "phase/diagram", fig, png="phase_diagram.png")
