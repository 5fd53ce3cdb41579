"""Two-layer multi-head students trained by online SGD ([S] Sec. 4, Eqs. 6-7; THEORY.md sec. 2).

``y_hat^(t) = h^(t) . phi(lam)``, ``lam = W x / sqrt d``: a shared first layer ``W`` (p, d) and
one head ``h^(t)`` (p,) per task. The loss of a sample is ``1/2 Delta^2`` with
``Delta = y_hat^(t) - y``, and SGD on the active task ``t`` is ([S] Eqs. 6-7, the paper's
``v^(t)`` read as ``h^(t)``)::

    W     <- W     - (eta / sqrt d) Delta (h^(t) * phi'(lam)) x^T
    h^(t) <- h^(t) - (eta / d)      Delta phi(lam)

(with ``batch_size`` samples per step the step is their mean). Only the active head learns: at
a switch the old head freezes. Time is ``alpha = steps / d``.

**Ensemble.** ``E`` students with their own initialisation parameters (list-valued scheme
parameters, or a list of seeds) learn from the same input stream in one fit: ``W`` is
(E, p, d), the heads (E, n_tasks, p). When the datamodule has ``G`` teacher sets (a list of
similarities), each initialisation is replicated ``G`` times at setup: member ``e`` learns
from teacher set ``e mod G``.

**Exact blocked SGD.** Online SGD is sequential, but the input stream is known a block ahead,
and every update of ``W`` is rank one along an input. Within a block of ``n`` samples, with
``W_0`` the weights at its start and ``g_m = Delta_m h * phi'(lam_m)`` the update directions,
``lam_j = W_0 x_j / sqrt d - (eta / d) sum_{m < j} g_m (x_m . x_j)``. So the block precomputes
``W_0 X^T`` and the Gram matrix ``X X^T`` as matrix products, runs the sequential recursion on
the block's pre-activations only (``n x E p`` numbers, not ``E p x d``), and applies all
updates at the end with one product
``W <- W_0 - (eta / sqrt d) G^T X``. This is the same arithmetic as step-by-step SGD (up to
rounding; a test checks it against a plain loop) at a fraction of its memory traffic.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict
from typing import Literal

import lightning.pytorch as pl
import torch
from jsonargparse import lazy_instance
from torch import Tensor, nn

from zoo.divergence import check_finite
from zoo.hparams import save_own_hyperparameters, store_hparams
from zoo.ewc import EWC, EWCState, ensemble_state
from zoo.ensemble import MAX_MEMBER_TAGS, layer_schemes, member_labels, multi_head_weights, resolve_members
from zoo.init import Gaussian, InitScheme, Polar
from zoo.task_switch import TaskSwitchAtBatchEnd

# the update is explicit SGD without a torch optimizer, so Lightning's note about it is noise
warnings.filterwarnings("ignore", message=r".*`configure_optimizers` returned `None`.*")

Activation = Literal["erf", "relu", "sigmoid", "linear"]
ACTIVATIONS = ("erf", "relu", "sigmoid", "linear")


# ------------------------------------------------------------------------------------------------
# activations, in the scaled variable the inner loop uses
# ------------------------------------------------------------------------------------------------
def _kappa(activation: str) -> float:
    """The loop works with ``u = kappa * lam`` (erf: ``phi = erf(u)`` with ``u = lam / sqrt 2``)."""
    return 1.0 / math.sqrt(2.0) if activation == "erf" else 1.0


def _dphi_const(activation: str) -> float:
    """``phi'(lam) = const * _dphi_u(u)``; the constant is folded into the step sizes."""
    return math.sqrt(2.0 / math.pi) if activation == "erf" else 1.0


def _phi_u(activation: str, u: Tensor) -> Tensor:
    if activation == "erf":
        return torch.erf(u)
    if activation == "relu":
        return torch.relu(u)
    if activation == "sigmoid":
        return torch.sigmoid(u)
    return u


def _dphi_u(activation: str, u: Tensor, phi: Tensor) -> Tensor | None:
    """``phi'(lam) / const`` (None for linear: it is 1)."""
    if activation == "erf":
        return torch.exp(-(u * u))
    if activation == "relu":
        return (u > 0).to(u.dtype)
    if activation == "sigmoid":
        return phi - phi * phi
    return None


def phi(activation: str, lam: Tensor) -> Tensor:
    """The student's activation ``phi(lam)``: ``erf(lam / sqrt 2)``, ``relu``, ``sigmoid`` or identity."""
    return _phi_u(activation, lam * _kappa(activation))


class MultiHeadStudent(TaskSwitchAtBatchEnd, pl.LightningModule):
    """A two-layer student with a shared first layer and one readout head per task.

    Args:
        d: input dimension (must match the datamodule's).
        p: hidden units.
        n_tasks: number of heads (must match the datamodule's).
        activation: ``phi``: ``"erf"`` (``erf(z / sqrt 2)``, the default), ``"relu"``,
            ``"sigmoid"`` or ``"linear"``.
        eta: learning rate ([S] Eqs. 6-7: ``W`` steps ``eta / sqrt d``, heads ``eta / d``).
        init_w: scheme of the first layer; ``gaussian(sigma)`` gives i.i.d. ``N(0, sigma_w^2)``.
        init_heads: scheme of the heads (one readout of shape (1, p) per task): ``polar(r, theta)``
            (p = 2), ``gaussian`` or ``entropy_mix``.
        init_later_heads: scheme of the heads of tasks 2, 3, ... if different from ``init_heads``
            (e.g. a small second head, [S] Fig. 6; or a second angle, Fig. 11).
        ensemble: number of initialisations; default: the schemes' list length (or of ``seed``).
        seed: seed of the initial weights; a list gives member ``e`` its own seed ``seed[e]``.
        grid: make the ensemble the Cartesian product of every list-valued parameter (of all
            schemes, and ``seed``) instead of zipping equal-length lists: ``sigma: [a, b]``,
            ``r: [c, d]``, ``theta: [e, f, g]`` give 12 members (a phase diagram, [S] Fig. 5),
            ordered with the last-listed parameter varying fastest.
        ewc: elastic weight consolidation of ``W`` ([S] Sec. 4.2.2, :mod:`zoo.ewc`): at the end
            of each consolidated task the Fisher of ``W`` and its anchor are stored; later SGD
            steps add ``eta xi F (W - W*)`` to the ``W`` step (so SGD descends ``L_EWC``). With
            the penalty on, steps run one at a time (the penalty is not rank one).
        teacher_sets: how many teacher sets each initialisation was replicated for; set at
            setup from the datamodule (stored so that checkpoints reload); leave at 1.
    """

    # hyperparameters set from the datamodule at setup, not by the config (zoo.checkpoint_checks)
    hparams_from_data: tuple[str, ...] = ("teacher_sets",)

    def __init__(
        self,
        d: int = 1000,
        p: int = 2,
        n_tasks: int = 2,
        activation: Activation = "erf",
        eta: float = 1.0,
        init_w: InitScheme = lazy_instance(Gaussian, sigma=1e-3),
        init_heads: InitScheme = lazy_instance(Polar, r=1.0, theta=0.0),
        init_later_heads: InitScheme | None = None,
        ensemble: int | None = None,
        seed: int | list[int] = 0,
        grid: bool = False,
        ewc: EWC | None = None,
        teacher_sets: int = 1,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, value in (("d", d), ("p", p), ("n_tasks", n_tasks), ("teacher_sets", teacher_sets)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name}: {arg} = {value!r}; allowed: a positive integer")
        if activation not in ACTIVATIONS:
            raise ValueError(f"{name}: activation = {activation!r}; allowed: {', '.join(ACTIVATIONS)}")
        if not (eta > 0 and math.isfinite(eta)):
            raise ValueError(f"{name}: eta = {eta}; allowed: a positive number")
        schemes = layer_schemes(init_w, init_heads, init_later_heads)
        if isinstance(ewc, dict):  # from a checkpoint's hyperparameters
            ewc = EWC(**ewc)
        xis = [float(x) for x in ewc.xi] if ewc is not None and isinstance(ewc.xi, (list, tuple)) else None
        save_own_hyperparameters(self, **{key: scheme.spec() for key, scheme in schemes.items()},
                      **({"ewc": asdict(ewc)} if ewc is not None else {}))
        members = resolve_members(name, schemes, seed, xis, grid, ensemble)
        self.xis = members.xis
        self.d, self.p, self.n_tasks, self.activation, self.eta = int(d), int(p), int(n_tasks), activation, float(eta)
        self.schemes, self.G = members.schemes, int(teacher_sets)
        self.automatic_optimization = False
        W, heads = multi_head_weights(members, self.n_tasks, (self.p, self.d), (1, self.p))
        self.base_labels = member_labels(self.schemes, members.E, members.seeds, self.xis)
        self.W = nn.Parameter(W.float().repeat_interleave(self.G, 0), requires_grad=False)
        self.h = nn.Parameter(heads[:, :, 0].float().repeat_interleave(self.G, 0), requires_grad=False)
        self.register_buffer("task", torch.tensor(0))
        self._remember_init()
        self.ewc_config = ewc
        self.ewc = self._ewc_state()

    def _ewc_state(self) -> EWCState | None:
        """Buffers for EWC of ``W``, with one ``xi`` per member if ``xi`` is a list."""
        state = ensemble_state(self.ewc_config, self.xis, self.G, {"W": self.W.shape})
        return None if state is None else state.to(self.W.device)

    def _remember_init(self) -> None:
        """Buffers of the initial weights: the ODE of ``TheoryOverlay`` starts from them."""
        self.register_buffer("W_init", self.W.detach().clone())
        self.register_buffer("h_init", self.h.detach().clone())

    # -- structure ----------------------------------------------------------------------------------
    @property
    def ensemble(self) -> int:
        """Number of members ``E`` (initialisations times teacher sets)."""
        return self.W.shape[0]

    @property
    def labels(self) -> list[str]:
        """One label per member, e.g. ``theta=0.3927`` or ``theta=0,gamma=0.5``."""
        if self.G == 1:
            return list(self.base_labels)
        gammas = getattr(self, "gammas", list(range(self.G)))
        return [f"{b},gamma={g:g}" if b != "member0" else f"gamma={g:g}" for b in self.base_labels for g in gammas]

    @property
    def teacher_index(self) -> Tensor:
        """The teacher set of every member, (E,): ``e mod G``."""
        return torch.arange(self.ensemble, device=self.W.device) % self.G

    def alpha(self, step: int | None = None) -> float:
        """Time ``alpha = steps / d`` ([S] Sec. 4)."""
        return (self.global_step if step is None else step) / self.d

    def preactivations(self, x: Tensor) -> Tensor:
        """``lam = W x / sqrt d`` of every member: x (N, d) -> (E, N, p)."""
        return x.to(self.W.dtype) @ self.W.transpose(-1, -2) / math.sqrt(self.d)

    def forward(self, x: Tensor) -> Tensor:
        """Outputs of every head: x (N, d) -> (E, N, n_tasks)."""
        return phi(self.activation, self.preactivations(x)) @ self.h.transpose(-1, -2)

    # -- analytic quantities (used by the callbacks) ------------------------------------------------
    def member_teachers(self, W_teachers: Tensor) -> Tensor:
        """Teachers per member, (E, n_tasks, p*, d), from (n_tasks, p*, d) or (G, n_tasks, p*, d)."""
        WT = torch.as_tensor(W_teachers).to(self.W.device, torch.float64)
        if WT.dim() == 3:
            WT = WT.unsqueeze(0)
        if WT.dim() != 4 or WT.shape[0] not in (1, self.G) or WT.shape[1] != self.n_tasks or WT.shape[-1] != self.d:
            raise ValueError(
                f"{type(self).__name__}: W_teachers must be (n_tasks, p*, d) or (G, n_tasks, p*, d) with n_tasks = "
                f"{self.n_tasks}, G = {self.G}, d = {self.d}; got {tuple(WT.shape)}")
        return WT[self.teacher_index % WT.shape[0]]

    def order_parameters(self, W_teachers: Tensor, initial: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """``Q = W W^T / d``, ``R^(t) = W W_T^(t)T / d``, ``T^(t,t')`` of every member ([S] Eq. 8).

        Args:
            W_teachers: the datamodule's ``W_teachers``, (G, n_tasks, p*, d) or (n_tasks, p*, d).
            initial: use the initial weights instead of the current ones.

        Returns:
            ``Q`` (E, p, p), ``R`` (E, n_tasks, p, p*), ``T`` (E, n_tasks, n_tasks, p*, p*); float64.
        """
        W = (self.W_init if initial else self.W).detach().double()
        WT = self.member_teachers(W_teachers)
        Q = W @ W.transpose(-1, -2) / self.d
        R = torch.einsum("eid,etnd->etin", W, WT) / self.d
        T = torch.einsum("etnd,esmd->etsnm", WT, WT) / self.d
        return Q, R, T

    def active_head(self) -> Tensor:
        """The head of the task being trained, (E, p)."""
        return self.h.detach()[:, int(self.task)]

    def entropies(self) -> dict[str, Tensor]:
        """``H_h``, ``H_Q``, ``H_m`` ([S] Eq. 10) of the active head and ``Q``, each (E,)."""
        from zoo.metrics.overlaps import entropies

        W = self.W.detach().double()
        return entropies(W @ W.transpose(-1, -2) / self.d, self.active_head().double())

    def test_error(self, x: Tensor, y: Tensor) -> Tensor:
        """Monte-Carlo generalisation error ``1/2 <Delta^2>`` of every member on every task, (E, n_tasks).

        ``x`` (N, d), ``y`` (N, n_tasks, G) as from ``TeacherStudent.test_set()``.
        """
        with torch.no_grad():
            y_hat = self(x.to(self.W.device))  # (E, N, n_tasks)
            target = y.to(y_hat).permute(2, 0, 1)[self.teacher_index % y.shape[-1]]
            return 0.5 * (y_hat - target).pow(2).mean(1)

    def theory_error(self, W_teachers: Tensor, teacher_heads: Tensor, initial: bool = False) -> Tensor:
        """Generalisation error of every member on every task from its order parameters ([S] Eq. 9),
        (E, n_tasks); closed forms for erf, relu and linear (``zoo.theory.meanfield``)."""
        from zoo.theory.meanfield import generalisation_error

        if self.activation == "sigmoid":
            raise ValueError("theory_error: no closed form for activation 'sigmoid'; use test_error")
        Q, R, T = self.order_parameters(W_teachers, initial=initial)
        hT = self.member_teacher_heads(teacher_heads)
        h = (self.h_init if initial else self.h).detach().double()
        eps = [generalisation_error(Q, R[:, t], T[:, t, t], h[:, t], hT[:, t], self.activation) for t in range(self.n_tasks)]
        return torch.stack(eps, -1)

    def task_errors(self, datamodule, source: str = "theory") -> Tensor:
        """Every member's error on every task now, (E, n_tasks), float64 on the CPU: from the order
        parameters (``"theory"``, [S] Eq. 9: exact, no Monte-Carlo noise) or the datamodule's test
        set (``"mc"``). What the forgetting and error-curve callbacks record."""
        if source == "theory":
            eps = self.theory_error(datamodule.W_teachers, datamodule.teacher_heads)
        elif source == "mc":
            eps = self.test_error(*datamodule.test_set())
        else:
            raise ValueError(f"task_errors: source = {source!r}; allowed: 'theory' or 'mc'")
        return eps.detach().double().cpu()

    def member_teacher_heads(self, teacher_heads: Tensor) -> Tensor:
        """Teacher heads per member, (E, n_tasks, p*), from (n_tasks, p*) or (G, n_tasks, p*)."""
        hT = torch.as_tensor(teacher_heads).to(self.W.device, torch.float64)
        if hT.dim() == 2:
            hT = hT.unsqueeze(0)
        return hT[self.teacher_index % hT.shape[0]]

    # -- training -----------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or stage != "fit":
            return
        name = type(self).__name__
        for attr in ("d", "n_tasks"):
            if hasattr(dm, attr) and getattr(dm, attr) != getattr(self, attr):
                raise ValueError(f"{name}: {attr} = {getattr(self, attr)} but the datamodule has {attr} = {getattr(dm, attr)}")
        G = getattr(dm, "teacher_sets", 1)
        if G != self.G:
            if self.G != 1:
                raise ValueError(f"{name}: teacher_sets = {self.G} but the datamodule has {G} teacher sets")
            with torch.no_grad():
                self.W = nn.Parameter(self.W.repeat_interleave(G, 0), requires_grad=False)
                self.h = nn.Parameter(self.h.repeat_interleave(G, 0), requires_grad=False)
            self.G = G
            store_hparams(self, teacher_sets=G)
            self._remember_init()
            if self.ewc is not None:
                self.ewc = self._ewc_state()
        if self.ewc is not None and not callable(getattr(dm, "sample", None)):
            raise TypeError(f"{name}: ewc needs a datamodule with sample(task, n) to estimate the Fisher "
                            "(datamodules.TeacherStudent has one)")
        if hasattr(dm, "gammas"):
            self.gammas = list(dm.gammas)

    def configure_optimizers(self):
        return None  # the update is the explicit SGD of [S] Eqs. 6-7 (training_step)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        x, y, task = batch["x"], batch["y"], int(batch["task"])
        if x.dim() != 3 or x.shape[-1] != self.d:
            raise ValueError(f"{type(self).__name__}: batch 'x' must be (steps, batch_size, d = {self.d}); got {tuple(x.shape)}")
        if not 0 <= task < self.n_tasks:
            raise ValueError(f"{type(self).__name__}: batch task {task} but the student has {self.n_tasks} heads")
        S = x.shape[0]
        y = y.to(self.W.dtype)[..., self.teacher_index % y.shape[-1]]  # (S, B, E)
        self._check_stream_position(batch)
        if task != int(self.task) and self._task_ended != int(self.task):
            self.on_task_switch(int(self.task), task)  # a datamodule without task_at: at the new task's first step
        self.task.fill_(task)
        Delta = self.sgd_steps(x.to(self.W.dtype), y, task)  # (S, B, E)
        losses = 0.5 * Delta.pow(2).mean((0, 1))
        check_finite(losses, step=self.global_step, labels=self.labels,
                     hint=f"eta = {self.eta} is probably too large (online SGD needs eta of order 1 or less).")
        self._advance_global_step(S)
        self.log("loss", losses.mean(), prog_bar=True, logger=False)
        metrics = {"loss": losses.mean()}
        if 1 < self.ensemble <= MAX_MEMBER_TAGS:
            metrics |= {f"loss/{lbl}": l for lbl, l in zip(self.labels, losses)}
        if self.ewc is not None and self.ewc.active:
            pen = self.ewc.member_penalty({"W": self.W.detach()})
            metrics["ewc/penalty"] = pen.mean()
            if 1 < self.ensemble <= MAX_MEMBER_TAGS:
                metrics |= {f"ewc/penalty/{lbl}": v for lbl, v in zip(self.labels, pen)}
        self._log_at_sgd_step(metrics)
        self.end_of_task(task, self.global_step)
        return {"member_loss": losses.detach()}

    def _check_stream_position(self, batch: dict[str, Tensor]) -> None:
        """A batch that says which SGD step it starts at must start at ``global_step``: otherwise a
        resumed run would continue its stream at another place, i.e. train a different run."""
        if self._trainer is None or "step" not in batch or self.trainer.current_epoch > 0:
            return
        if int(batch["step"]) != self.global_step:
            raise RuntimeError(f"{type(self).__name__}: the batch starts at SGD step {int(batch['step'])} but the run "
                               f"is at step {self.global_step}; the data stream and the checkpoint do not match")

    def _log_at_sgd_step(self, metrics: dict[str, Tensor]) -> None:
        """Write ``metrics`` to the loggers at ``global_step`` (SGD steps, the step of every zoo
        callback), on the batches where ``self.log`` would (every ``log_every_n_steps`` batches).

        ``self.log`` would write at Lightning's batch count, a second time axis: a run resumed
        from a checkpoint at SGD step ``s`` drops what a killed run logged after ``s`` (TensorBoard
        purge), which on the batch axis is not what came after the checkpoint."""
        if self._trainer is None or not self.trainer.loggers or not self.trainer._logger_connector.should_update_logs:
            return
        for lg in self.trainer.loggers:
            lg.log_metrics({k: float(v) for k, v in metrics.items()}, step=self.global_step)

    def on_task_switch(self, old: int, new: int) -> None:
        """Called with the weights at the end of task ``old``, before any step of task ``new``
        (at the end of ``old``'s last batch when the datamodule has ``task_at``, else at the start
        of ``new``'s first): consolidates ``old`` for EWC if configured. Override to add behaviour
        at a switch."""
        if self.ewc is None or not self.ewc_config.consolidates(old, self.n_tasks):
            return
        x, y = self.trainer.datamodule.sample(old, self.ewc_config.samples)
        y = y.to(self.W)[..., self.teacher_index % y.shape[-1]]
        F = self.fisher_W(x.to(self.W), y, old, mode=self.ewc_config.fisher)
        self.ewc.consolidate({"W": self.W.detach()}, {"W": F})
        self.ewc.check_step_size(self.eta, self.labels, type(self).__name__, "eta")
        for lg in self.trainer.loggers:
            lg.log_metrics({f"ewc/{k}": v for k, v in self.ewc.summary().items()}, step=self.global_step)

    @torch.no_grad()
    def fisher_W(self, x: Tensor, y: Tensor, task: int, mode: str = "sampled") -> Tensor:
        """Diagonal Fisher of ``W`` for head ``task``, per member, (E, p, d) (THEORY.md sec. 2, EWC).

        The per-sample gradient of ``1/2 Delta^2`` is ``Delta h_i phi'(lam_i) x / sqrt d``, so
        ``F_ik = mean_s (Delta_s h_i phi'(lam_si))^2 x_sk^2 / d``. ``"empirical"`` uses the true
        labels ``y`` (N, E); ``"sampled"`` takes the expectation over labels from the model's own
        predictive ``y ~ N(y_hat, 1)``, i.e. ``Delta^2 -> 1`` (exact, no sampling noise).
        """
        if mode not in ("sampled", "empirical"):
            raise ValueError(f"fisher_W: mode = {mode!r}; allowed: 'sampled' or 'empirical'")
        lam = self.preactivations(x)  # (E, N, p)
        u = lam * _kappa(self.activation)
        f = _phi_u(self.activation, u)
        df = _dphi_u(self.activation, u, f)
        df = torch.ones_like(u) if df is None else df * _dphi_const(self.activation)
        a = self.h[:, task, None, :] * df  # (E, N, p): h_i phi'(lam_i)
        if mode == "empirical":
            delta = (f * self.h[:, task, None, :]).sum(-1) - y.T  # (E, N)
            a = a * delta.unsqueeze(-1)
        return torch.einsum("enp,nd->epd", a.pow(2), x.pow(2)) / (x.shape[0] * self.d)

    def _advance_global_step(self, n: int) -> None:
        """Count ``n`` SGD steps in ``trainer.global_step`` (the update happens without an optimizer)."""
        if self._trainer is None:
            return
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.total
        progress.ready += n
        progress.completed += n

    def _block_size(self, B: int) -> int:
        """Samples per exact SGD block. The block's products (``W_0 X^T``, ``X X^T``, ``G^T X``)
        get more efficient and the Python overhead per block smaller as it grows, while the
        per-step correction grows with it; 128 was fastest for 1 and for 1,024 members
        (``bench/bench_student.py``)."""
        return max(1, 128 // B) * B

    @torch.no_grad()
    def sgd_steps(self, x: Tensor, y: Tensor, task: int) -> Tensor:
        """Run ``S`` SGD steps on head ``task``: x (S, B, d), y (S, B, E). Returns ``Delta`` (S, B, E).

        Exact blocked SGD (module docstring); ``B > 1`` is minibatch SGD with the mean step.
        """
        S, B, d = x.shape
        E = self.ensemble
        W = self.W.data.view(E * self.p, d)
        h = self.h.data[:, task].clone()  # (E, p) contiguous working copy of the active head
        Xf, Yf = x.reshape(S * B, d), y.reshape(S * B, E)
        Delta = torch.empty(S * B, E, dtype=x.dtype, device=x.device)
        nb = self._block_size(B)
        block = self._online_block if B == 1 else self._minibatch_block
        if self.ewc is not None and self.ewc.active:
            block = self._penalised_block
        for a in range(0, S * B, nb):
            block(W, h, Xf[a:a + nb], Yf[a:a + nb], Delta[a:a + nb], B)
        self.h.data[:, task] = h
        return Delta.view(S, B, E)

    def _constants(self, B: int) -> tuple[float, float, float, float]:
        """``kappa`` and the step sizes of ``u`` (per Gram entry and unit of g), heads and ``W``."""
        act, d = self.activation, self.d
        kappa, const = _kappa(act), _dphi_const(act)
        return kappa, kappa * self.eta * const / (d * B), self.eta / (d * B), self.eta * const / (math.sqrt(d) * B)

    def _online_block(self, W: Tensor, h: Tensor, Xb: Tensor, Yb: Tensor, Db: Tensor, B: int) -> None:
        """One block of online SGD (B = 1), in place on ``W`` (E p, d), ``h`` (E, p), ``Db`` (n, E).

        ``U`` holds the block's pre-activations ``u = kappa W X^T / sqrt d``; after step ``j`` the
        rows of the later samples take the rank-one correction ``-c K[:, j] g_j^T``, so row ``j``
        is exact when it is read. Every per-step tensor is a view made once per block (unbind).
        """
        E, p, act, d = self.ensemble, self.p, self.activation, self.d
        kappa, c_u, c_head, c_W = self._constants(1)
        n = Xb.shape[0]
        U = (Xb @ W.T).mul_(kappa / math.sqrt(d))  # (n, E p)
        K = Xb @ Xb.T
        Gb = torch.empty(n, E * p, dtype=Xb.dtype, device=Xb.device)
        u_rows, k_rows, g_rows, g_mats = U.unbind(0), K.unbind(0), Gb.unbind(0), Gb.view(n, E, p).unbind(0)
        d_rows, d_cols, y_rows = Db.unbind(0), Db.view(n, E, 1).unbind(0), Yb.unbind(0)
        erf = act == "erf"
        for j in range(n):
            u = u_rows[j]
            f = _phi_u(act, u)
            fE = f.view(E, p)
            torch.sub(torch.linalg.vecdot(fE, h), y_rows[j], out=d_rows[j])
            df = torch.square(u).neg_().exp_() if erf else _dphi_u(act, u, f)
            gE, dl = g_mats[j], d_cols[j]
            if df is None:
                gE.copy_(h)
            else:
                torch.mul(h, df.view(E, p), out=gE)
            gE.mul_(dl)
            h.addcmul_(fE, dl, value=-c_head)
            U.addr_(k_rows[j], g_rows[j], alpha=-c_u)
        W.addmm_(Gb.T, Xb, alpha=-c_W)

    def _penalised_block(self, W: Tensor, h: Tensor, Xb: Tensor, Yb: Tensor, Db: Tensor, B: int) -> None:
        """SGD steps on ``L_EWC`` one at a time: ``W`` also decays towards its anchor,
        ``W <- W - eta xi F (W - W*)``, which is not rank one, so there is no blocking."""
        E, p, act, d = self.ensemble, self.p, self.activation, self.d
        kappa, _, c_head, c_W = self._constants(B)
        F = self.ewc.fisher("W").view(E * p, d)
        W_star = self.ewc.anchor("W").view(E * p, d)
        xi = self.ewc.xi
        c_pen = self.eta * (xi if isinstance(xi, float) else xi.to(W).repeat_interleave(p)[:, None])
        pull = torch.empty_like(W)
        for j in range(0, Xb.shape[0], B):
            x = Xb[j:j + B]
            u = (x @ W.T).mul_(kappa / math.sqrt(d)).view(B, E, p)
            f = _phi_u(act, u)
            torch.sub((f * h).sum(-1), Yb[j:j + B], out=Db[j:j + B])
            dl = Db[j:j + B].unsqueeze(-1)
            df = _dphi_u(act, u, f)
            g = dl * h if df is None else dl * h * df
            torch.sub(W, W_star, out=pull).mul_(F).mul_(c_pen)
            W.addmm_(g.view(B, E * p).T, x, alpha=-c_W)
            W.sub_(pull)
            h.sub_((dl * f).sum(0), alpha=c_head)

    def _minibatch_block(self, W: Tensor, h: Tensor, Xb: Tensor, Yb: Tensor, Db: Tensor, B: int) -> None:
        """One block of minibatch SGD (``B`` samples per step, the mean step), in place.

        ``u_j = u_j(W_0) - c K[j, :j] G[:j]``: the corrections of the earlier steps of the block.
        """
        E, p, act, d = self.ensemble, self.p, self.activation, self.d
        kappa, c_u, c_head, c_W = self._constants(B)
        n = Xb.shape[0]
        U = (Xb @ W.T).mul_(kappa / math.sqrt(d))  # (n, E p)
        K = Xb @ Xb.T
        Gb = torch.zeros(n, E * p, dtype=Xb.dtype, device=Xb.device)
        for j in range(0, n, B):
            u = torch.addmm(U[j:j + B], K[j:j + B, :j], Gb[:j], alpha=-c_u).view(B, E, p)
            f = _phi_u(act, u)
            torch.sub((f * h).sum(-1), Yb[j:j + B], out=Db[j:j + B])
            dl = Db[j:j + B].unsqueeze(-1)
            df = _dphi_u(act, u, f)
            g = Gb[j:j + B].view(B, E, p)
            torch.mul(dl, h, out=g)
            if df is not None:
                g.mul_(df)
            h.sub_((dl * f).sum(0), alpha=c_head)
        W.addmm_(Gb.T, Xb, alpha=-c_W)

    @property
    def samples_seen(self) -> int:  # TEMPORARY (tscallbacks): multihead's zoo.progress.Progress replaces it
        return self.global_step

    def mean_field(self, W_teachers: Tensor, teacher_heads: Tensor, alpha_switch: list[float], alpha_end: float,
                   d_alpha: float = 0.01, record_at: tuple[float, ...] = (), record_every: float | None = None,
                   members: int | None = None):
        """The mean-field ODE ([S] App. C, Eqs. 20-22) of this ensemble's first ``members`` members,
        started from their own initial order parameters and heads, with this student's activation
        and ``eta`` (:func:`zoo.theory.meanfield.student_mean_field`; whether it describes the run:
        :func:`zoo.theory.meanfield.ode_caveats`). Returns a ``MeanFieldTrajectory``."""
        from zoo.theory.meanfield import student_mean_field

        return student_mean_field(
            *self.order_parameters(W_teachers, initial=True), self.h_init, self.member_teacher_heads(teacher_heads),
            activation=self.activation, eta=self.eta, alpha_switch=alpha_switch, alpha_end=alpha_end, d_alpha=d_alpha,
            record_at=record_at, record_every=record_every, members=members)
