"""Entropy phase diagrams of specialisation ([S] Sec. 4.2, Fig. 5; App. E, Fig. 10).

One ensemble fit of :class:`zoo.MultiHeadStudent` whose members form a grid over the initial
first-layer scale ``sigma_w`` (``init_w: gaussian``) and the polar readout
``h(0) = (r cos theta, r sin theta)`` (``init_heads: polar``, p = 2) learns one teacher.
:class:`EntropyPhaseDiagram` arranges the final specialisation entropies of [S] Eq. 10
(``H_m``, the aggregate of Fig. 5, and ``H_Q``, ``H_h`` of Fig. 10) on that grid, for the
simulation and for the mean-field ODE ([S] App. C, Eqs. 20-22) started from every member's own
initial order parameters, and measures how much of their variation each initial parameter
explains ([S] Sec. 4.2: "the strongest determinant of specialisation is ... the theta
parameter").

The maths lives in :mod:`zoo.metrics.overlaps` (entropies) and :mod:`zoo.theory.meanfield`
(the ODE); the grid bookkeeping (:func:`init_grid`) and the variance decomposition
(:func:`variance_explained`) are pure functions here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from callbacks.base import PeriodicCallback, output_path, resuming, warn_once

ENTROPIES = ("H_m", "H_Q", "H_h")
"""[S] Eq. 10: the aggregate (Fig. 5) first, then the unit and head entropies (Fig. 10)."""
FACTORS = ("sigma_w", "r", "theta")
RELU_SMALL_ETA = 0.1
"""Above this learning rate the ReLU ODE (small-eta limit, no ``eta^2`` term in dQ/dalpha) is
warned about. Measured on the fig5_entropy_phase_relu grid (343 members, d = 1000, eta alpha = 30):
mean |H_m(simulation) - H_m(ODE)| over the grid = 0.003 at eta = 0.1 and 0.019 at eta = 1 (the
erf grid, whose ODE is exact in eta, gives 0.007 at eta = 0.1 and 0.018 at eta = 1: at eta = 1
finite-d SGD fluctuations, not the missing term, dominate the entropies' gap)."""


# ------------------------------------------------------------------------------------------------
# pure functions
# ------------------------------------------------------------------------------------------------
@dataclass
class InitGrid:
    """The ensemble as a grid: ``member[i, j, k]`` is the member initialised with
    ``sigma_w[i]``, ``r[j]``, ``theta[k]`` (each axis sorted ascending)."""

    sigma_w: np.ndarray
    r: np.ndarray
    theta: np.ndarray
    member: np.ndarray

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.member.shape  # type: ignore[return-value]

    def arrange(self, values: torch.Tensor | np.ndarray) -> np.ndarray:
        """Per-member values ``(E,)`` as a ``(n_sigma, n_r, n_theta)`` array."""
        v = values.detach().double().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values, float)
        return v[self.member]


def init_grid(pl_module: pl.LightningModule) -> InitGrid:
    """Find the (sigma_w, r, theta) cell of every member of a grid ensemble.

    Reads the per-member parameter lists of the module's schemes (``schemes['init_w']`` a
    ``gaussian``, ``schemes['init_heads']`` a ``polar``) and checks that the members enumerate
    the full Cartesian product exactly once, whatever their order (so zipped lists that happen
    to enumerate a grid work too); a scalar parameter is an axis of length 1.

    Raises:
        TypeError: the module has no such schemes, or its members are not one grid over them.
    """
    name = type(pl_module).__name__
    schemes = getattr(pl_module, "schemes", None)
    need = ("EntropyPhaseDiagram needs a zoo.MultiHeadStudent(p=2, grid=true) initialised with "
            "init_w: gaussian(sigma) and init_heads: polar(r, theta)")
    if not isinstance(schemes, dict) or "init_w" not in schemes or "init_heads" not in schemes:
        raise TypeError(f"{need}; {name} has no init_w / init_heads schemes")
    params_w, params_h = schemes["init_w"].params, schemes["init_heads"].params
    if set(params_w) != {"sigma"}:
        raise TypeError(f"{need}; its init_w is {type(schemes['init_w']).__name__} with parameters {sorted(params_w)}")
    if set(params_h) != {"r", "theta"}:
        raise TypeError(f"{need}; its init_heads is {type(schemes['init_heads']).__name__} with parameters "
                        f"{sorted(params_h)}")
    columns = {"sigma_w": params_w["sigma"], "r": params_h["r"], "theta": params_h["theta"]}
    G = int(getattr(pl_module, "G", 1))
    E0 = pl_module.ensemble // G
    if G != 1:
        raise TypeError(f"{need}; this run has {G} teacher sets (a list of gamma), each cell would hold {G} members: "
                        "use one teacher set")
    for key, col in columns.items():
        if len(col) not in (1, E0):
            raise TypeError(f"{need}; {key} has {len(col)} values for {E0} members")
    values = {k: np.unique(np.asarray(col, dtype=float)) for k, col in columns.items()}
    shape = tuple(len(values[k]) for k in FACTORS)
    member = np.full(shape, -1, dtype=np.int64)
    for e in range(E0):  # bookkeeping once per fit over a few hundred members
        cell = tuple(int(np.searchsorted(values[k], columns[k][e if len(columns[k]) > 1 else 0])) for k in FACTORS)
        if member[cell] >= 0:
            raise TypeError(
                f"{need}; members {member[cell]} and {e} share the cell (sigma_w, r, theta) = "
                f"{tuple(float(values[k][c]) for k, c in zip(FACTORS, cell))}: another parameter varies (a list of "
                "seeds, ewc.xi, init_later_heads), which this diagram cannot show")
        member[cell] = e
    if (member < 0).any():
        raise TypeError(
            f"{need}; its {E0} members are not the full grid of {shape[0]} sigma_w x {shape[1]} r x {shape[2]} theta "
            f"values (zipped lists?): set grid: true")
    return InitGrid(values["sigma_w"], values["r"], values["theta"], member)


def variance_explained(H: np.ndarray) -> dict[str, float]:
    """Share of the variance of ``H`` over a full ``(n_sigma, n_r, n_theta)`` grid explained by
    each factor alone: the main-effect sums of squares of a balanced three-way ANOVA,
    ``SS_f / SS_total`` with ``SS_f = sum_cells (mean of H at the cell's level of f - mean H)^2``.

    On a balanced grid the main effects are orthogonal, so the three shares sum to at most 1;
    the rest is interaction between the factors. All 0 when ``H`` is constant.
    """
    H = np.asarray(H, dtype=float)
    total = ((H - H.mean()) ** 2).sum()
    out = {}
    for axis, key in enumerate(FACTORS):
        others = tuple(a for a in range(3) if a != axis)
        level_means = H.mean(axis=others, keepdims=True)
        ss = (np.broadcast_to(level_means, H.shape) - H.mean()) ** 2
        out[key] = float(ss.sum() / total) if total > 0 else 0.0
    return out


def max_entropy(name: str, p: int) -> float:
    """Upper end of an entropy of [S] Eq. 10: ``log p`` for H_h, H_Q; ``(2/p) log p`` for H_m
    (identical units; ``zoo.metrics.overlaps.entropies``); ``log 2`` for all three at p = 2."""
    return (2.0 / p) * math.log(p) if name == "H_m" else math.log(p)


# ------------------------------------------------------------------------------------------------
# the callback
# ------------------------------------------------------------------------------------------------
class EntropyPhaseDiagram(PeriodicCallback):
    """Phase diagrams of the specialisation entropies over the initialisation ([S] Figs. 5, 10).

    For a :class:`zoo.MultiHeadStudent` whose members are a grid over ``sigma_w`` (``init_w:
    gaussian``), ``r`` and ``theta`` (``init_heads: polar``; ``grid: true``), at the end of the
    fit (and every ``every_n_steps`` if given) it takes ``H_m``, ``H_Q``, ``H_h`` of [S] Eq. 10
    of every member's active head:

    * simulation: ``pl_module.entropies()`` of the trained weights;
    * ODE: :func:`zoo.theory.meanfield.integrate` over all members in one call, from each
      member's own initial ``Q, R, T`` and heads, to the fit's final ``alpha = steps / d``;
      entropies of its ``Q`` and head (:func:`zoo.metrics.overlaps.entropies`).

    It writes ``entropy_phase.png``: one row per entropy and source (simulation above ODE), one
    panel per ``theta``, ``sigma_w`` on x and ``r`` on y (one equal cell per grid value, so
    log-spaced grids read as log axes), colour = entropy on one
    scale ``[0, max]`` (``log 2`` for all three at p = 2; blue = specialised, yellow = not, as in
    Fig. 5), and a last row with the simulation's final error ([S] Eq. 9 on its order
    parameters; Monte Carlo for sigmoid). TensorBoard IMAGES ``entropy_phase/<H>`` show the same
    per entropy (at every recorded step). SCALARS (at the recorded steps):

    * ``entropy_phase/<H>/mean_abs_diff``: mean over the grid of ``|H_sim - H_ode|``;
    * ``entropy_phase/<H>/same_side``: fraction of cells where both lie on the same side of
      ``threshold * max`` (specialised below it);
    * ``entropy_phase/<source>/<H>/var_explained/<factor>``: the share of the variance over the
      grid explained by ``sigma_w``, ``r`` or ``theta`` alone (:func:`variance_explained`), the
      quantitative form of Sec. 4.2's claim that theta matters most; printed at the end too;
    * ``entropy_phase/error/{median,max,fraction_converged}``: the simulation's final errors
      (converged: below ``converged``), and ``entropy_phase/error/ode_median``.

    The ODE needs erf, ReLU or linear (``ode: false`` draws the simulation alone, e.g. for
    sigmoid). For ReLU it is the small-learning-rate limit (no ``eta^2`` term): a warning above
    ``eta = RELU_SMALL_ETA``. ``self.result`` holds the arrays of the last record and
    ``self.trajectory`` the ODE's :class:`zoo.theory.meanfield.MeanFieldTrajectory`.

    Args:
        every_n_steps: also record the diagrams every this many SGD steps (and at the start);
            default ``None``: only at the end of the fit.
        ode: integrate the mean-field ODE and draw it beside the simulation.
        d_alpha: Euler step of the ODE in alpha; default ``0.01 / eta`` (the rates scale with eta).
        threshold: the specialisation threshold, as a fraction of each entropy's maximum.
        converged: a member whose final error is below this counts as converged.
        figure: write ``entropy_phase.png``.
    """

    def __init__(self, every_n_steps: int | None = None, ode: bool = True, d_alpha: float | None = None,
                 threshold: float = 0.5, converged: float = 1e-3, figure: bool = True) -> None:
        who = "EntropyPhaseDiagram"
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or int(every_n_steps) != every_n_steps
                                          or every_n_steps < 1):
            raise ValueError(f"{who}: every_n_steps = {every_n_steps!r}; allowed: a positive integer or null (end only)")
        super().__init__(1 if every_n_steps is None else int(every_n_steps))
        self.intermediate = every_n_steps is not None
        if d_alpha is not None and not (isinstance(d_alpha, (int, float)) and 0 < d_alpha < math.inf):
            raise ValueError(f"{who}: d_alpha = {d_alpha!r}; allowed: a positive number or null (0.01 / eta)")
        if not 0 < threshold < 1:
            raise ValueError(f"{who}: threshold = {threshold!r}; allowed: a fraction of the maximal entropy in (0, 1)")
        if not converged > 0:
            raise ValueError(f"{who}: converged = {converged!r}; allowed: an error > 0")
        self.ode, self.d_alpha, self.threshold = bool(ode), d_alpha, float(threshold)
        self.converged, self.figure = float(converged), bool(figure)
        self.grid: InitGrid | None = None
        self.records: dict[int, dict[str, torch.Tensor]] = {}
        self.trajectory = None
        self.result: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"records": self.records}  # a resumed fit keeps the intermediate records

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.records = dict(state_dict["records"])

    # -- checks before training ---------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.records = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.grid = init_grid(pl_module)  # first: its message names what this callback needs
        self.need(pl_module, "entropies", "order_parameters", "member_teacher_heads")
        if getattr(pl_module, "p", 2) != 2:
            raise TypeError(f"EntropyPhaseDiagram: polar heads need p = 2 hidden units; the module has p = {pl_module.p}")
        dm = trainer.datamodule
        missing = [a for a in ("W_teachers", "teacher_heads", "switch_steps") if dm is None or not hasattr(dm, a)]
        if missing:
            raise TypeError("EntropyPhaseDiagram needs a teacher-student datamodule (datamodules.TeacherStudent) with "
                            f"{', '.join(missing)}; got {type(dm).__name__ if dm is not None else 'none'}")
        act = pl_module.activation
        if self.ode:
            from zoo.theory.meanfield import ACTIVATIONS

            if act not in ACTIVATIONS:
                raise ValueError(f"EntropyPhaseDiagram: ode = true but the student's activation is {act!r}, which has no "
                                 f"mean-field theory; allowed: {', '.join(ACTIVATIONS)}, or ode: false")
            if getattr(dm, "activation", act) != act:
                rank_zero_warn(f"EntropyPhaseDiagram: the teacher's activation ({dm.activation}) differs from the "
                               f"student's ({act}); the ODE uses the student's for both, so it does not describe this run")
            if act == "relu" and pl_module.eta > RELU_SMALL_ETA:
                rank_zero_warn(f"EntropyPhaseDiagram: eta = {pl_module.eta:g} with ReLU: the ReLU ODE is the "
                               f"small-learning-rate limit (no eta^2 term), expect it to differ (eta <= "
                               f"{RELU_SMALL_ETA:g} advised)")
        if act == "sigmoid":
            missing = [] if callable(getattr(dm, "test_set", None)) else ["test_set"]
            if missing or not callable(getattr(pl_module, "test_error", None)):
                raise TypeError("EntropyPhaseDiagram: a sigmoid student's final error is Monte Carlo: it needs "
                                "test_error() and a datamodule with test_set()")

    # -- recording ----------------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if resuming(trainer):  # due() counts from the checkpoint's step, as in the run that saved it
            self._prev_step = trainer.global_step
        if self.intermediate:
            self._record(trainer, pl_module)  # resumed: the checkpoint's record again, the same weights

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.intermediate and self.due(trainer, pl_module):
            self._record(trainer, pl_module)

    def _record(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.records[int(trainer.global_step)] = {k: v.detach().double().cpu() for k, v in pl_module.entropies().items()}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or self.grid is None:
            return
        self._record(trainer, pl_module)
        final = int(trainer.global_step)
        ode = self.trajectory = self.integrate(trainer, pl_module) if self.ode else None
        error = self.final_error(trainer, pl_module)
        for step in sorted(self.records):
            r = self.compute(pl_module, step, ode, error if step == final else None)
            self.log_record(trainer, pl_module, step, r)
            if step == final:
                self.result = r
        self.report(pl_module)
        if self.figure:
            path = output_path(trainer, "entropy_phase.png")
            fig = self.make_figure(self.result, pl_module, rows=ENTROPIES, with_error=True)
            fig.savefig(path)
            _plt().close(fig)
            self.result["path"] = path

    # -- theory and error ---------------------------------------------------------------------------
    def integrate(self, trainer: pl.Trainer, pl_module: pl.LightningModule):
        """The ODE of every member, from its initial order parameters to the fit's final alpha,
        recorded at the steps this callback recorded (one vectorised call)."""
        from zoo.theory.meanfield import integrate

        dm, d, final = trainer.datamodule, pl_module.d, int(trainer.global_step)
        alpha_end = final / d
        if alpha_end <= 0:
            return None
        Q0, R0, T = (x.cpu() for x in pl_module.order_parameters(dm.W_teachers, initial=True))
        heads0 = pl_module.h_init.detach().double().cpu()
        teacher_heads = pl_module.member_teacher_heads(dm.teacher_heads).cpu()
        # only the tasks that started by the end: a later task's head and R do not act on W
        switches = [s for s in dm.switch_steps if s < final]
        k = len(switches) + 1
        d_alpha = self.d_alpha if self.d_alpha is not None else 0.01 / max(pl_module.eta, 1e-12)
        d_alpha = min(d_alpha, alpha_end)
        self._d_alpha_used = d_alpha
        record_every = self.every_n_steps / d if self.intermediate else alpha_end
        return integrate(Q0, R0[:, :k], T[:, :k, :k], heads0[:, :k], teacher_heads[:, :k],
                         activation=pl_module.activation, eta=pl_module.eta,
                         alpha_switch=[s / d for s in switches], alpha_end=alpha_end, d_alpha=d_alpha,
                         record_every=record_every)

    def final_error(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> torch.Tensor:
        """The active task's error of every member at the end, (E,): [S] Eq. 9 on the order
        parameters (exact for the weights), Monte Carlo for sigmoid."""
        dm, task = trainer.datamodule, int(pl_module.task)
        if pl_module.activation == "sigmoid":
            eps = pl_module.test_error(*dm.test_set())
        else:
            eps = pl_module.theory_error(dm.W_teachers, dm.teacher_heads)
        return eps[:, task].detach().double().cpu()

    def compute(self, pl_module: pl.LightningModule, step: int, ode, error: torch.Tensor | None) -> dict[str, Any]:
        """Grids of the recorded simulation at ``step`` and of the ODE at the same alpha."""
        from zoo.metrics.overlaps import entropies

        g, p = self.grid, pl_module.p
        r: dict[str, Any] = {"step": step, "alpha": step / pl_module.d, "sigma_w": g.sigma_w, "r": g.r,
                             "theta": g.theta, "max": {H: max_entropy(H, p) for H in ENTROPIES},
                             "sim": {H: g.arrange(self.records[step][H]) for H in ENTROPIES}}
        if ode is not None:
            i = ode.index(step / pl_module.d)
            if abs(float(ode.alpha[i]) - step / pl_module.d) > 0.5 * self._d_alpha_used:
                warn_once("EntropyPhaseDiagram: a recorded step is not on the ODE's record grid (every_n_steps / d "
                          "in Euler steps); the nearest record is used")
            # the head trained on the step just completed (the module switches heads on the next step)
            task = sum(step / pl_module.d > a + 1e-12 for a in ode.alpha_switch)
            H_ode = entropies(ode.Q[:, i], ode.heads[:, i, task])
            r["ode"] = {H: g.arrange(H_ode[H]) for H in ENTROPIES}
            r["ode_alpha"] = float(ode.alpha[i])
            r["ode_error"] = g.arrange(ode.eps[:, i, task])
            r["mean_abs_diff"] = {H: float(np.abs(r["sim"][H] - r["ode"][H]).mean()) for H in ENTROPIES}
            r["same_side"] = {H: float(((r["sim"][H] < self.threshold * r["max"][H])
                                        == (r["ode"][H] < self.threshold * r["max"][H])).mean()) for H in ENTROPIES}
        r["var_explained"] = {src: {H: variance_explained(r[src][H]) for H in ENTROPIES}
                              for src in ("sim", "ode") if src in r}
        if error is not None:
            r["error"] = g.arrange(error)
        return r

    # -- output -------------------------------------------------------------------------------------
    def log_record(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int, r: dict[str, Any]) -> None:
        """Scalars and TensorBoard images of one record."""
        metrics: dict[str, float] = {}
        for src, table in r["var_explained"].items():
            for H, shares in table.items():
                metrics.update({f"entropy_phase/{src}/{H}/var_explained/{f}": v for f, v in shares.items()})
        for H in ENTROPIES:
            metrics[f"entropy_phase/sim/{H}/mean"] = float(r["sim"][H].mean())
            if "ode" in r:
                metrics[f"entropy_phase/ode/{H}/mean"] = float(r["ode"][H].mean())
                metrics[f"entropy_phase/{H}/mean_abs_diff"] = r["mean_abs_diff"][H]
                metrics[f"entropy_phase/{H}/same_side"] = r["same_side"][H]
        if "error" in r:
            eps = r["error"]
            metrics |= {"entropy_phase/error/median": float(np.median(eps)), "entropy_phase/error/max": float(eps.max()),
                        "entropy_phase/error/fraction_converged": float((eps < self.converged).mean())}
            if "ode_error" in r:
                metrics["entropy_phase/error/ode_median"] = float(np.median(r["ode_error"]))
        self.log_scalars(trainer, metrics, step=step)
        tb = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not tb:
            return
        plt = _plt()
        for H in ENTROPIES:
            fig = self.make_figure(r, pl_module, rows=(H,), with_error=False, dpi=80)
            fig.canvas.draw()
            img = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
            plt.close(fig)
            for lg in tb:
                lg.experiment.add_image(f"entropy_phase/{H}", img, step, dataformats="HWC")

    def report(self, pl_module: pl.LightningModule) -> None:
        """Print the variance decomposition and the agreement (also in ``self.result``)."""
        r = self.result
        lines = [f"EntropyPhaseDiagram ({pl_module.activation}, eta = {pl_module.eta:g}, alpha = {r['alpha']:g}): "
                 "share of the variance over the grid explained by each initial parameter alone"]
        for src, table in r["var_explained"].items():
            for H, s in table.items():
                top = max(s, key=s.get)
                lines.append(f"  {src:3s} {H}: " + ", ".join(f"{f} {v:.2f}" for f, v in s.items()) + f"  -> {top}")
        for H in ENTROPIES:
            H_sim = r["sim"][H]
            lines.append(f"  sim {H} mean at each theta: " + " ".join(f"{v:.2f}" for v in H_sim.mean(axis=(0, 1)))
                         + " | each sigma_w: " + " ".join(f"{v:.2f}" for v in H_sim.mean(axis=(1, 2)))
                         + " | each r: " + " ".join(f"{v:.2f}" for v in H_sim.mean(axis=(0, 2))))
        if "ode" in r:
            lines.append("  simulation vs ODE: " + ", ".join(
                f"{H} mean |diff| {r['mean_abs_diff'][H]:.3f}, same side {r['same_side'][H]:.0%}" for H in ENTROPIES))
        if "error" in r:
            eps = r["error"]
            lines.append(f"  final error: median {np.median(eps):.2e}, max {eps.max():.2e}, "
                         f"{(eps < self.converged).mean():.0%} of members below {self.converged:g}")
        rank_zero_info("\n".join(lines))

    def make_figure(self, r: dict[str, Any], pl_module: pl.LightningModule, rows=ENTROPIES, with_error: bool = True,
                    dpi: int = 100):
        """Rows (entropy, source) x one panel per theta; an error row at the bottom if asked.

        Cells are drawn in index space (``imshow``) with the grid values as tick labels: the
        recipes' grids are log-spaced, so this is a log axis without matplotlib's slow log ticks.
        """
        plt = _plt()
        from matplotlib.colors import LogNorm

        sources = [s for s in ("sim", "ode") if s in r]
        panels = [(H, s) for H in rows for s in sources]
        has_error = with_error and "error" in r
        n_rows, n_cols = len(panels) + has_error, len(r["theta"])
        head = 0.45 + 0.17 * (1 + len(rows))  # inches for the title lines and the panel titles
        height = 1.55 * n_rows + head + 0.45
        fig, axes = plt.subplots(n_rows, n_cols, figsize=(1.7 * n_cols + 1.4, height), dpi=dpi, squeeze=False)
        fig.subplots_adjust(left=0.09, right=0.9, bottom=0.45 / height, top=1.0 - head / height, wspace=0.08,
                            hspace=0.12)
        names = {"sim": "simulation", "ode": "ODE"}
        kw = dict(origin="lower", aspect="auto", interpolation="nearest")
        for row, (H, src) in enumerate(panels):
            for k in range(n_cols):
                im = axes[row][k].imshow(r[src][H][:, :, k].T, cmap="viridis", vmin=0.0, vmax=r["max"][H], **kw)
            axes[row][0].set_ylabel(f"{H} {names[src]}\nr", fontsize=8)
            _colorbar(fig, axes[row], im)
        if has_error:
            eps = np.clip(r["error"], 1e-10, None)
            norm = LogNorm(vmin=eps.min(), vmax=max(eps.max(), eps.min() * 10))
            for k in range(n_cols):
                im = axes[-1][k].imshow(eps[:, :, k].T, cmap="magma", norm=norm, **kw)
            axes[-1][0].set_ylabel("final error\n(simulation)\nr", fontsize=8)
            _colorbar(fig, axes[-1], im)
        xt, yt = _ticks(r["sigma_w"]), _ticks(r["r"])
        for (row, k), ax in np.ndenumerate(axes):
            ax.set_xticks(xt, [f"{r['sigma_w'][i]:.2g}" for i in xt] if row == n_rows - 1 else [])
            ax.set_yticks(yt, [f"{r['r'][i]:.2g}" for i in yt] if k == 0 else [])
            ax.tick_params(labelsize=6, length=2)
        for k, th in enumerate(r["theta"]):
            axes[0][k].set_title(f"theta = {_angle(th)}", fontsize=8)
            axes[-1][k].set_xlabel("sigma_w", fontsize=8)
        lines = [f"[S] Fig. 5 / 10: entropies of Eq. 10 at alpha = {r['alpha']:g} ({pl_module.activation}, "
                 f"eta = {pl_module.eta:g}, d = {pl_module.d}); blue = specialised, yellow = not (max log 2)"]
        for H in rows:
            line = f"{H}: "
            if "ode" in r:
                line += f"mean |sim - ODE| {r['mean_abs_diff'][H]:.3f}, same side {r['same_side'][H]:.0%}; "
            line += "variance explained (sim) " + ", ".join(f"{f} {v:.2f}" for f, v in r["var_explained"]["sim"][H].items())
            lines.append(line)
        title = "\n".join(lines)
        fig.suptitle(title, fontsize=8)
        return fig


def _plt():
    from callbacks.figures import _plt as plt

    return plt()


def _angle(theta: float) -> str:
    """``theta`` as a fraction of pi where it is one (``pi/24``), else in radians."""
    from fractions import Fraction

    f = Fraction(theta / math.pi).limit_denominator(96)
    if abs(float(f) - theta / math.pi) > 1e-9:
        return f"{theta:.3g}"
    if f == 0:
        return "0"
    return f"{'' if f.numerator == 1 else f.numerator}pi" + ("" if f.denominator == 1 else f"/{f.denominator}")


def _ticks(values: np.ndarray, most: int = 4) -> list[int]:
    """Indices of at most ``most`` evenly spread grid values to label (first and last included)."""
    n = len(values)
    return sorted({int(round(i)) for i in np.linspace(0, n - 1, min(n, most))})


def _colorbar(fig, row_axes, mappable) -> None:
    """One colour bar to the right of a row of panels."""
    first, last = row_axes[0].get_position(), row_axes[-1].get_position()
    cax = fig.add_axes([last.x1 + 0.01, first.y0, 0.012, first.height])
    fig.colorbar(mappable, cax=cax).ax.tick_params(labelsize=6)
