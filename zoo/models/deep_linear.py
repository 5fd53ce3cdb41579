"""Deep linear networks with an ensemble dimension ([L], [S] Sec. 3).

``y_hat = W_L ... W_1 x``; loss ``1/(2N) sum_i |y_i - y_hat_i|^2`` (mean over samples, summed
over outputs), so plain gradient descent with learning rate ``lr`` follows
``tau dW/dt = -dL/dW`` with ``tau = 1/lr`` and time counted in steps ([L] Eq. 2).

``E`` members, each with its own initialisation parameters (e.g. ``lam: [-4, 0, 4]``), train in
one fit as batched tensor ops: weights are (E, out, in) tensors, the total loss is the sum of
the members' losses, so each member receives exactly its own gradient.

Each ``training_step`` takes ``steps_per_batch`` gradient steps on its batch (manual
optimisation): Lightning's per-step overhead is many times the cost of a step of a small
linear network, and the papers' experiments take thousands of steps. Each step is one update
by the configured optimizer, counted by Lightning as an optimizer step (``zoo.training.steps.Updates``), so
its own ``global_step`` counts gradient steps and ``max_steps`` and the callbacks'
``every_n_steps`` mean what they say; ``samples_seen`` counts the samples those steps consumed
(``zoo.training.progress``). The gradients are computed in closed form
(:meth:`DeepLinearNet.losses_and_gradients`) unless a subclass overrides ``member_loss``
(``ZooModule.overrides``), which then trains by autograd.

``validate`` / ``test`` report the mean squared error per output entry (a torchmetrics
``MeanSquaredError``, reduced across devices) of every member on the datamodule's evaluation set:
``val/mse`` and ``test/mse`` (mean over members) and, for ensembles up to ``MAX_MEMBER_TAGS``,
``.../mse/<member>``. It is ``2 / n_out`` times the training loss on the same data.

Across processes (``--trainer.devices=N --trainer.strategy=ddp``, ``zoo.training.distributed``) an
ensemble is member-parallel: each rank trains members ``lo:hi`` on the whole data; the losses
and errors are gathered so that rank 0 logs every member, and callbacks see every member
(:meth:`DeepLinearNet.show_all_members`). One member alone trains data-parallel, its gradients
averaged over the ranks: on minibatches each rank trains on its part of every batch (the zoo's
regression tasks deal them out, ``datamodules.regression.ShardedEpochShuffle``) and the logged
loss, the divergence check and ``samples_seen`` are the whole batch's; a full batch is the whole
task on every rank.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from zoo.training.lazy import lazy_instance
from torch import Tensor, nn
from torchmetrics.regression import MeanSquaredError

from zoo.training.distributed import MemberParallel, gather_members, is_sharded
from zoo.training.evaluation import log_at_global_step
from zoo.kernels.gdln import GradientDescent
from zoo.models.base import ZooModule
from zoo.training.ensemble import ensemble_size
from zoo.training.hparams import save_own_hyperparameters
from zoo.init import InitScheme, LambdaBalanced, PathwayGrid, from_spec
from zoo.utils.labels import MAX_MEMBER_TAGS, member_labels
from zoo.training.logs import log_batch_scalars
from zoo.training.progress import Progress
from zoo.training.steps import Updates


class DeepLinearNet(MemberParallel, Progress, ZooModule):
    """An L-layer linear network ``dims = [n_in, n_1, ..., n_out]``, trained by (full-batch) GD.

    Args:
        dims: layer widths from input to output, e.g. ``[8, 8, 8]`` for a two-layer network.
        init: the initialisation scheme (``zoo.init``); list-valued parameters make an ensemble.
            Its ``spec()`` dict is accepted too (that is how checkpoints store it).
        ensemble: number of members (independent draws of a scalar scheme); default: the length of the
            scheme's list parameters (``zoo.training.ensemble.ensemble_size``).
        lr: learning rate of plain gradient descent (``tau = 1/lr`` steps).
        task_aligned: start from a map that shares the task's singular vectors,
            ``W_L...W_1 = U diag(a0) V^T`` with every mode at strength ``a0 = init.scale``
            (needs a ``lambda_balanced`` init); the regime of [L] Thm. 5.1 / ``SingularValues``.
        reversed_modes: with ``task_aligned``, start these modes at ``-a0`` instead: the initial
            map shares the task's singular vectors but with those left vectors reversed, the
            reversal-learning setting of [L] App. D.2 (lam = 0 stalls at the saddle a = 0).
        steps_per_batch: gradient steps per ``training_step`` on the same batch (full-batch GD:
            raise it, e.g. to 10, to cut Lightning's per-step overhead).
        seed: seed of the initial weights (independent of the global seed, so two modules with the
            same arguments start identical).
    """

    fast_steps, batch_format = ("member_loss",), "regression"

    def __init__(
        self,
        dims: list[int],
        init: InitScheme = lazy_instance(LambdaBalanced, lam=0.0, scale=1e-3),
        ensemble: int | None = None,
        lr: float = 0.1,
        task_aligned: bool = False,
        reversed_modes: list[int] | None = None,
        steps_per_batch: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__()
        scheme = from_spec(init).checked()
        if len(dims) < 2 or any(int(n) < 1 for n in dims):
            raise ValueError(f"DeepLinearNet: dims = {dims}; allowed: at least two positive widths [n_in, ..., n_out]")
        lr, E = self.check_lr(lr), ensemble_size("DeepLinearNet", {"init": scheme.ensemble_size}, ensemble)
        if reversed_modes and not task_aligned:
            raise ValueError("DeepLinearNet: reversed_modes needs task_aligned = true (modes are the task's)")
        if steps_per_batch < 1:
            raise ValueError(f"DeepLinearNet: steps_per_batch = {steps_per_batch}; allowed: a positive integer")
        if task_aligned and not isinstance(scheme, LambdaBalanced):
            raise ValueError(f"DeepLinearNet: task_aligned = true needs init lambda_balanced, got {type(scheme).__name__}")
        save_own_hyperparameters(self, init=scheme.spec())
        self.dims, self.init_scheme, self.ensemble, self.lr = [int(n) for n in dims], scheme, E, lr
        self.task_aligned, self.seed, self.steps_per_batch = task_aligned, seed, steps_per_batch
        self.reversed_modes = list(reversed_modes or [])
        self.automatic_optimization = False
        self._two_layer = TwoLayerGradients()  # the GD step's working tensors, reused (not state)
        self.init_progress()
        self.member_params = scheme_member_params(scheme, E, seed)
        self.labels = member_labels(self.member_params)
        self.val_mse, self.test_mse = self._mse_metrics(E)
        ws = scheme.weights(self.shapes, ensemble=E, generator=torch.Generator().manual_seed(seed))
        self.W = nn.ParameterList([nn.Parameter(w) for w in ws])
        self._remember_init()

    def _remember_init(self) -> None:
        """Buffers of the initial state: the closed forms start from it, and resumes keep it."""
        for i, W in enumerate(self.W):
            self.register_buffer(f"W{i}_init", W.detach().clone())
        self.register_buffer("balance0", self._balance_stack().detach().clone())

    # -- members across processes (zoo.training.distributed) ------------------------------------------------
    def n_members(self) -> int:
        return self.ensemble

    def member_tensor_names(self) -> list[str]:
        """The layers and their initial values; ``balance0`` has the member axis second and is
        sliced and gathered by :meth:`keep_members` / :meth:`show_all_members`."""
        return [f"W.{i}" for i in range(len(self.W))] + [f"W{i}_init" for i in range(len(self.W))]

    def keep_members(self, lo: int, hi: int) -> None:
        super().keep_members(lo, hi)
        self.balance0 = self.balance0[:, lo:hi].clone()
        # each rank's errors are its own members': computed locally, then gathered (_log_mse)
        self.val_mse, self.test_mse = self._mse_metrics(hi - lo)

    def show_all_members(self) -> Callable[[], None]:
        local = self.balance0
        self.balance0 = self._all_balance0(local)
        back = super().show_all_members()

        def restore() -> None:
            back()
            self.balance0 = local
        return restore

    def on_all_members_back(self) -> None:
        self.val_mse, self.test_mse = self._mse_metrics(self.ensemble)

    def _all_balance0(self, local: Tensor) -> Tensor:
        """``balance0`` of every member (a collective), also when it is empty (a one-layer net): every
        rank decides alike, from the layer count."""
        if local.numel() == 0:
            return local.new_zeros(local.shape[0], self.ensemble, *local.shape[2:])
        return gather_members(local, self.ensemble, dim=1)

    def _mse_metrics(self, E: int) -> tuple[MeanSquaredError, MeanSquaredError]:
        """Per-member MSE of the E members held (num_outputs = E); one per stage so validation inside a
        fit leaves test's alone. Reduced across devices unless sharded (:meth:`member_metrics`)."""
        device = self.W[0].device if hasattr(self, "W") else None
        return self.member_metrics(tuple(MeanSquaredError(num_outputs=E).to(device) for _ in range(2)))

    # -- structure --------------------------------------------------------------------------------
    @property
    def shapes(self) -> list[tuple[int, int]]:
        """Layer shapes (out, in), input to output."""
        return [(b, a) for a, b in zip(self.dims[:-1], self.dims[1:])]

    def weights(self) -> list[Tensor]:
        """The weight matrices, input to output, each (E, out, in)."""
        return list(self.W)

    def network_map(self) -> Tensor:
        """The map ``W_L ... W_1`` of every member, (E, n_out, n_in)."""
        M = self.W[0]
        for W in self.W[1:]:
            M = W @ M
        return M

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, n_in) shared by all members, or (E, B, n_in). Returns (E, B, n_out)."""
        h = self._per_member(x.to(self.W[0].dtype))
        for W in self.W:
            h = h @ W.transpose(-1, -2)
        return h

    def _per_member(self, x: Tensor) -> Tensor:
        """Shared inputs (B, n) as a view (E, B, n). A product of (E, m, B) with a 2-d (B, n) is folded
        into one (E m, B) matrix product, whose rounding depends on E (the kernel blocks rows
        differently); as a batch of E products each member's numbers are its own, the same in an
        ensemble of any size, so a slice of the members on each process gives the one-process bits."""
        return x.expand(self.W[0].shape[0], *x.shape) if x.dim() == 2 else x

    # -- analytic quantities (used by the callbacks) ----------------------------------------------
    def mode_strengths(self, U: Tensor, V: Tensor) -> Tensor:
        """Strengths ``a_i = u_i^T (W_L...W_1) v_i`` of the map along the task's modes, (E, k)."""
        M = self.network_map().detach().to(U.dtype)
        return torch.einsum("ok,eoi,ik->ek", U.to(M.device), M, V.to(M.device))

    def pathway_strengths(self, u: Tensor, v: Tensor) -> Tensor:
        """Each hidden unit's share ``omega_j = (u^T W2[:, j]) (W1[j, :] v)`` of the map along one
        task mode ``u s v^T`` ([S] Sec. 3: a unit is a pathway), (E, n_h); two-layer nets only."""
        if len(self.W) != 2:
            raise ValueError("pathway_strengths: defined for two-layer networks (dims of length 3)")
        W1, W2 = self.W[0].detach().double(), self.W[1].detach().double()
        return torch.einsum("o,eoj->ej", u.double().to(W2.device), W2) * torch.einsum("eji,i->ej", W1, v.double().to(W1.device))

    def _balance_stack(self) -> Tensor:
        """``W_{l+1}^T W_{l+1} - W_l W_l^T`` for consecutive layers of equal width, (L-1, E, n, n)."""
        mats = []
        for Wa, Wb in zip(self.W[:-1], self.W[1:]):
            mats.append(Wb.transpose(-1, -2) @ Wb - Wa @ Wa.transpose(-1, -2))
        if not mats:
            return torch.zeros(0, self.W[0].shape[0], 0, 0, device=self.W[0].device)
        if len({m.shape for m in mats}) > 1:  # unequal hidden widths: keep the first pair only
            mats = mats[:1]
        return torch.stack(mats)

    def balance(self) -> Tensor:
        """The balance matrices now ([L] Def. A.1; conserved by gradient flow), (L-1, E, n, n)."""
        return self._balance_stack().detach()

    def balance_deviation(self) -> Tensor:
        """Largest entry of ``|balance(t) - balance(0)|`` per member, (E,): 0 under gradient flow."""
        dev = (self.balance() - self.balance0).abs()
        return dev.flatten(start_dim=2).amax(dim=(0, 2)) if dev.numel() else torch.zeros(dev.shape[1], device=dev.device)

    def lam_estimate(self) -> Tensor:
        """The imbalance read off the weights: mean diagonal of the first balance matrix, (E,)."""
        B = self.balance()
        return B[0].diagonal(dim1=-2, dim2=-1).mean(-1) if B.numel() else torch.zeros(B.shape[1], device=B.device)

    def predicted_mode_strengths(self, steps: Tensor, modes) -> Tensor | None:
        """Closed-form mode strengths ([L] Thm. 5.1) at the given steps, (E, T, k), or None.

        Exact for two-layer, task-aligned lambda-balanced networks under gradient flow (GD with a
        small lr follows it up to O(lr)). ``modes`` is a ``datamodules.regression.TaskModes``;
        modes beyond the hidden width stay at zero.
        """
        if not (self.task_aligned and len(self.W) == 2):
            return None
        from zoo.theory.linear import aligned_singular_value

        E, k, n_h = self.ensemble, len(modes.s), self.dims[1]
        lam = self.init_scheme.per_member("lam", E)[:, None, None]
        a0 = self.init_scheme.per_member("scale", E)[:, None, None] * self._mode_signs(k)
        t = steps.to(torch.float64)[None, :, None]
        s = modes.s.to(torch.float64)[None, None, :]
        tau = 1.0 / (self.lr * modes.c)
        pred = aligned_singular_value(t, lam=lam, s=s, tau=tau, a0=a0)
        pred = pred.expand(E, t.shape[1], k).clone()
        pred[..., n_h:] = 0.0
        return pred

    def input_rsm(self) -> Tensor:
        """Input representational similarity ``W1^T W1`` ([L] Sec. 5), (E, n_in, n_in)."""
        W1 = self.W[0].detach()
        return W1.transpose(-1, -2) @ W1

    def output_rsm(self) -> Tensor:
        """Output representational similarity ``W_L W_L^T`` ([L] Sec. 5), (E, n_out, n_out)."""
        WL = self.W[-1].detach()
        return WL @ WL.transpose(-1, -2)

    def ntk(self, x: Tensor) -> Tensor:
        """Empirical NTK of every member on inputs ``x`` (P, n_in), (E, n_out P, n_out P).

        Output-major layout (row ``o * P + i``), as Braun et al. 2022 and
        ``zoo.theory.linear.linear_ntk_from_qqt``. Computed by ``zoo.metrics.empirical_ntk``.
        """
        from zoo.metrics.ntk import empirical_ntk

        x = x.to(self.W[0])
        kernels = []
        for e in range(self.W[0].shape[0]):  # members are independent: E small kernels, not one E^2 one
            member = _Member([W[e].detach() for W in self.W])
            kernels.append(empirical_ntk(member, x, layout="output_major"))
        return torch.stack(kernels)

    def lam_init(self) -> Tensor | None:
        """The initial imbalance of each member if the init is lambda-balanced (two layers), else None."""
        if len(self.W) != 2:
            return None
        B = self.balance0[0].double()
        lam = B.diagonal(dim1=-2, dim2=-1).mean(-1)
        eye = torch.eye(B.shape[-1], dtype=B.dtype, device=B.device)
        scale = 1e-4 * (1 + lam.abs().max())
        return lam if bool(((B - lam[:, None, None] * eye).abs() <= scale).all()) else None

    def predicted_qqt(self, steps: Tensor, sigma_yx: Tensor, c: float = 1.0) -> Tensor | None:
        """``QQ^T`` at the given steps from the closed form ([L] Thm. 4.3), (E, T, N, N), or None.

        Exact under gradient flow for a two-layer lambda-balanced network from its actual initial
        weights; ``sigma_yx`` and the input variance ``c`` (``sigma_x = c I``) describe the task.
        Blocks: ``W1^T W1``, ``(W2 W1)^T`` / ``W2 W1``, ``W2 W2^T`` (see ``zoo.theory.linear``).
        """
        lam = self.lam_init()
        if lam is None:
            return None
        from zoo.theory.linear import qqt

        W1, W2 = self.W0_init.double().cpu(), self.W1_init.double().cpu()
        return qqt(W1, W2, sigma_yx.double().cpu() / c, lam=lam.cpu(), t=steps.double().cpu(),
                   tau=1.0 / (self.lr * c))

    def predicted_rsms(self, steps: Tensor, sigma_yx: Tensor, c: float = 1.0) -> tuple[Tensor, Tensor] | None:
        """Input and output RSMs ``W1^T W1``, ``W2 W2^T`` at the given steps from the closed form
        ([L] Thm. 4.3 and Sec. 5), each (E, T, n, n), or None where :meth:`predicted_qqt` is."""
        Q = self.predicted_qqt(steps, sigma_yx, c)
        if Q is None:
            return None
        from zoo.theory.linear import input_rsm, output_rsm

        return input_rsm(Q, self.dims[0]), output_rsm(Q, self.dims[0])

    def predicted_ntk(self, steps: Tensor, x: Tensor, sigma_yx: Tensor, c: float = 1.0) -> Tensor | None:
        """The NTK on inputs ``x`` (P, n_in) at the given steps from the closed form ([L] Thm. 4.3,
        Eq. 5), (E, T, n_out P, n_out P) in :meth:`ntk`'s layout, or None where
        :meth:`predicted_qqt` is."""
        Q = self.predicted_qqt(steps, sigma_yx, c)
        if Q is None:
            return None
        from zoo.theory.linear import linear_ntk_from_qqt

        return linear_ntk_from_qqt(Q, x.double().cpu(), self.dims[0])

    def pathway_phase(self, modes) -> dict[str, Tensor]:
        """The two-pathway phase diagram of a ``PathwayGrid`` ensemble ([S] Sec. 3.1, Fig. 3c) on the
        task's first mode: ``share``, the slow pathway's (lam2) share of the map now, and
        ``escape``, [S] Algorithm 1's minimum remaining escape time of the slow pathway in steps
        (``zoo.theory.phase.phase_diagram``; > 0: the network specialises), each (len(lam1),
        len(lam2)), beside the grid's ``lam1`` and ``lam2``."""
        scheme = self.init_scheme
        if not isinstance(scheme, PathwayGrid):
            raise TypeError(f"pathway_phase needs init PathwayGrid; this network has {type(scheme).__name__}")
        from zoo.theory.phase import phase_diagram

        n1, n2 = scheme.grid_shape
        omegas = self.pathway_strengths(modes.U[:, 0], modes.V[:, 0]).cpu()  # (E, 2)
        lam1 = torch.tensor(scheme.params["lam1"], dtype=torch.float64)
        lam2 = torch.tensor(scheme.params["lam2"], dtype=torch.float64)
        # whitened form: target s/c, time constant tau/c with tau = 1/lr steps: times come out in steps
        kw = dict(omega0=scheme.omega0) if scheme.omega0 is not None else dict(a0=scheme.a0)
        escape = phase_diagram(lam1[:, None], lam2[None, :], s=float(modes.s[0]), d=1.0,
                               tau=1.0 / (self.lr * modes.c), **kw)
        return {"lam1": lam1, "lam2": lam2, "share": (omegas[:, 1] / omegas.sum(-1)).reshape(n1, n2), "escape": escape}

    def _mode_signs(self, k: int) -> Tensor:
        signs = torch.ones(k, dtype=torch.float64)
        for i in self.reversed_modes:
            if not 0 <= i < k:
                raise ValueError(f"DeepLinearNet: reversed_modes contains {i}; the task has modes 0..{k - 1}")
            signs[i] = -1.0
        return signs

    # -- training ---------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        self._check_datamodule(getattr(self.trainer, "datamodule", None))
        if self.task_aligned and stage == "fit":
            modes = self.trainer.datamodule.modes()
            E, m = self.ensemble, len(modes.s)
            a0 = self.init_scheme.per_member("scale", E)[:, None] * self._mode_signs(m)
            product = torch.einsum("ok,ek,ik->eoi", modes.U, a0, modes.V)
            ws = self.init_scheme.factor(product, self.shapes, torch.Generator().manual_seed(self.seed))
            with torch.no_grad():
                for p, w in zip(self.W, ws):
                    p.copy_(w.to(p))
            self._remember_init()

    def _check_datamodule(self, dm: object) -> None:
        """The data's input/output sizes against ``dims``, and ``modes()`` for ``task_aligned``: a
        mismatch is a setting, reported before training rather than as a matmul error."""
        if dm is None:
            return
        if self.task_aligned and not callable(getattr(dm, "modes", None)):
            raise ValueError(f"DeepLinearNet: task_aligned = true needs a datamodule with modes() (a regression task "
                             f"such as SemanticHierarchy); {type(dm).__name__} has none")
        for end, attr, width in (("dims[0]", "n_in", self.dims[0]), ("dims[-1]", "n_out", self.dims[-1])):
            size = getattr(dm, attr, None)
            if isinstance(size, int) and size != width:
                raise ValueError(f"DeepLinearNet: {end} = {width} but the datamodule has {attr} = {size}; "
                                 f"allowed: dims[0] = n_in and dims[-1] = n_out of the data")

    def member_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """``1/(2N) sum_i |y_i - y_hat_i|^2`` of every member, (E,)."""
        x, y = batch
        return half_mean_squared(self(x) - y.to(self.W[0].dtype))

    def losses_and_gradients(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, list[Tensor]]:
        """:meth:`member_loss` (E,) and its gradient with respect to every layer, in closed form
        (:func:`closed_form_gradients`): the same numbers autograd gives, without building its
        graph, which costs more than the arithmetic for the papers' small networks."""
        x, y = self._gd_batch(batch)
        D, grads = closed_form_gradients(list(self.W), x, y)
        return half_mean_squared(D), grads

    def _gd_batch(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """The batch as :func:`closed_form_gradients` takes it: inputs (E, N, n_in), targets in the weights' dtype."""
        x, y = batch
        dtype = self.W[0].dtype
        return self._per_member(x.to(dtype)), y.to(dtype)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        first_step = self.global_step
        # a subclass that changes the loss gets autograd; the zoo's own loss has closed-form gradients
        if not self.overrides("member_loss"):
            first, last, start = self._closed_form_steps(batch)
            # every member's losses on every rank (members are sharded across processes): one exchange
            # and one host sync per call, and every rank takes the same decision on divergence
            losses = self._run_losses(first[None] if last is None else torch.stack([first, last]))
            total = losses[0].sum()
            # losses are >= 0 or NaN: a sum is finite unless a loss is not (or the sum overflowed: then look)
            if not math.isfinite(total if last is None else losses.sum()) and not bool(torch.isfinite(losses).all()):
                self._stop_diverged(batch, first_step, losses, start)
        else:
            losses = self._autograd_steps(batch, first_step)
            total = losses[0].sum()
        # data-parallel minibatches: this rank's part of the step's; a full batch is the run's on every rank
        self.count_samples(batch[0].shape[-2] * self.steps_per_batch, per_rank=True)
        first = losses[0]
        log_batch_scalars(self, first_step, {"loss": first}, members=first)
        # the losses of the weights at step `loss_step`, before this call's updates, of every member (on every rank)
        return {"loss": total, "member_loss": first, "loss_step": first_step}

    def _closed_form_steps(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor | None, list[Tensor] | None]:
        """``steps_per_batch`` GD steps with closed-form gradients; the losses (E,) of the first and
        the last step (None for one step), and the weights at the start (None for one step), kept so
        that a divergence can be replayed to name its first step (:meth:`_stop_diverged`).
        Data-parallel, each step's gradients are the ranks' mean.

        The loop holds only a step's arithmetic and its update by the configured optimizer, applied
        by ``zoo.training.steps.Updates`` (the optimizer's own ``step``, each update counted by Lightning as an
        optimizer step: ``global_step``, ``max_steps`` and the callbacks' ``every_n_steps`` count
        gradient steps); the losses of the steps between are not computed (the loss is logged once
        per batch) and nothing is read on the host: the caller checks the two losses once.

        Where the optimizer is the default :class:`~zoo.kernels.gdln.GradientDescent`, of a two-layer
        network in one process or sharded, the steps run as one loop with its update written in
        (:meth:`TwoLayerGradients.descend`: the same operations, ~3-4 us of Python less a step) and
        Lightning counts them at the end; ``.grad`` holds the last step's gradients, as after the
        optimizer's steps."""
        updates, params = Updates(self), list(self.W)
        Ws = [W.detach() for W in params]  # plain tensors: a Parameter's every operation costs more Python
        x, y = self._gd_batch(batch)
        start = [W.clone() for W in Ws] if self.steps_per_batch > 1 else None
        data_parallel = self._data_parallel()
        gd = None if data_parallel or len(Ws) != 2 else GradientDescent.stepped_directly(updates)
        lrs = gd.rates(params) if gd is not None else None
        if lrs is not None:  # the steps as one loop, the update written into it (the optimizer's own)
            with torch.no_grad():
                first, D = self._two_layer.descend(Ws, x, y, lrs, self.steps_per_batch)
                last = self._two_layer.loss(D) if start is not None else None
            for W, g in zip(params, (self._two_layer.g1, self._two_layer.g2)):
                W.grad = g  # as the optimizer's steps leave them: the last step's gradients
            updates.applied(self.steps_per_batch)
            updates.finish()
            return first, last, start
        if len(Ws) == 2:
            gradients, loss = self._two_layer, self._two_layer.loss
        else:
            gradients, loss = closed_form_gradients, half_mean_squared
        with torch.no_grad():
            for k in range(self.steps_per_batch):
                D, grads = gradients(Ws, x, y)
                if k == 0:
                    first = loss(D)
                if data_parallel:  # what DDP's backward hooks do for autograd: the ranks' mean gradient
                    grads = [self.trainer.strategy.reduce(g, reduce_op="mean") for g in grads]
                for W, g in zip(params, grads):
                    W.grad = g
                updates()
            last = loss(D) if start is not None else None  # D: the last step's, before its update
        updates.finish()
        return first, last, start

    def _data_parallel(self) -> bool:
        """One network on several processes, each on its part of the data (not sharded members)."""
        return not is_sharded(self) and self.trainer.world_size > 1

    def _run_losses(self, losses: Tensor) -> Tensor:
        """This rank's losses (steps, E held) as the run's, the same on every rank (one collective):
        every member's, gathered where members are sharded; the ranks' mean where data-parallel (each
        rank's is its part's of the step's batch)."""
        losses = self.all_member_values(losses, dim=1)
        return self.trainer.strategy.reduce(losses, reduce_op="mean") if self._data_parallel() else losses

    def _autograd_steps(self, batch: tuple[Tensor, Tensor], first_step: int) -> Tensor:
        """``steps_per_batch`` steps of autograd on :meth:`member_loss` (a subclass's loss); every
        step's losses of every member, (steps, E), the run's (:meth:`_run_losses`: every rank takes
        the same decision), checked (a subclass's loss may be finite again after a non-finite one)."""
        opt, updates, step_losses = self.optimizers(), Updates(self), []
        for _ in range(self.steps_per_batch):
            losses = self.member_loss(batch)
            step_losses.append(losses.detach())
            opt.zero_grad(set_to_none=True)
            self.manual_backward(losses.sum())
            updates()
        updates.finish()
        losses = self._run_losses(torch.stack(step_losses))
        self._check_finite(losses, first_step)
        return losses

    def _stop_diverged(self, batch: tuple[Tensor, Tensor], first_step: int, losses: Tensor,
                       start: list[Tensor] | None) -> None:
        """A member's loss was not finite at the first or the last step of this call (``losses``,
        (2, E)): replay the call's plain GD steps from its starting weights ``start`` (the same
        arithmetic, the same numbers) for every step's loss, and stop naming the first step at which
        each member diverged. Weights that turn non-finite stay so (NaN and inf propagate through
        the products), so a member that diverges inside a batch has a non-finite loss at its last
        step; only a loss that overflowed and came back finite within one batch goes unreported."""
        if start is not None:
            Ws, rows = [W.clone() for W in start], []
            x, y = self._gd_batch(batch)
            data_parallel = self._data_parallel()
            with torch.no_grad():
                for _ in range(self.steps_per_batch):
                    D, grads = closed_form_gradients(Ws, x, y)
                    rows.append(half_mean_squared(D))
                    if data_parallel:
                        grads = [self.trainer.strategy.reduce(g, reduce_op="mean") for g in grads]
                    for W, g in zip(Ws, grads):
                        W.add_(g, alpha=-self.lr)
            # the step's losses as the run's check saw them: the same step named on every rank
            self._check_finite(self._run_losses(torch.stack(rows)), first_step)
        # no replay (one step), or one that did not reproduce the run (an optimizer other than plain GD)
        self._check_finite(losses[:1], first_step)
        self._check_finite(losses[1:], first_step + self.steps_per_batch - 1)

    def _check_finite(self, losses: Tensor, first_step: int) -> None:
        """Stop on the first of this call's steps (rows of ``losses``, (steps, E)) where a member's
        loss is not finite. A member's weights after a non-finite loss are not finite either, so the
        later steps change nothing but that member; the run stops before any of them is logged."""
        if bool(torch.isfinite(losses).all()):
            return
        k = int(torch.isfinite(losses).all(-1).logical_not().nonzero()[0])
        self.stop_if_diverged(losses[k], first_step + k)

    def divergence_hint(self) -> str:
        return (f"The learning rate lr={self.lr} is probably too large for this initial scale: the stable step "
                "shrinks as |lam| and the weights grow (GD needs lr * curvature < 2); try lr / 10.")

    # -- evaluation ([L]'s tasks are fixed data sets: the datamodules evaluate on the task itself) ----
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._update_mse(self.val_mse, batch)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._update_mse(self.test_mse, batch)

    def on_validation_epoch_end(self) -> None:
        self._log_mse("val", self.val_mse)

    def on_test_epoch_end(self) -> None:
        self._log_mse("test", self.test_mse)

    def _update_mse(self, metric: MeanSquaredError, batch: tuple[Tensor, Tensor]) -> None:
        x, y = batch
        pred = self(x).detach()  # (E, B, n_out)
        target = y.to(pred.dtype).expand_as(pred)
        # columns are members: (B * n_out, E)
        metric.update(pred.flatten(1).transpose(0, 1), target.flatten(1).transpose(0, 1))

    def _log_mse(self, stage: str, metric: MeanSquaredError) -> None:
        # member-parallel: this rank's members, gathered; data-parallel: reduced across devices by the metric
        mse = self.all_member_values(metric.compute().reshape(-1))
        metric.reset()
        # every rank holds the same numbers now: their max across ranks is each number itself, exactly, and
        # marks them reduced (Lightning warns about epoch-level values that are not)
        same = dict(sync_dist=True, reduce_fx="max")
        self.log(f"{stage}/mse", mse.mean(), **same)
        log_at_global_step(self)  # in a fit, at the step of training; validate/test have no step of their own
        if 1 < self.ensemble <= MAX_MEMBER_TAGS:
            self.log_dict({f"{stage}/mse/{lbl}": v for lbl, v in zip(self.labels, mse)}, **same)

    def configure_optimizers(self) -> GradientDescent:
        """Plain gradient descent with ``lr``: ``torch.optim.SGD``'s update without its ~20 us of
        machinery a call (``zoo.kernels.gdln.GradientDescent``: the same bits; it loads the state of a
        checkpoint written with SGD). A subclass may return any optimizer: the steps use it."""
        return GradientDescent(self.parameters(), lr=self.lr)


def closed_form_gradients(Ws: list[Tensor], x: Tensor, y: Tensor) -> tuple[Tensor, list[Tensor]]:
    """The residual ``D = M x - y`` (E, N, n_out) and the gradient of ``1/(2N) sum_i |D_i|^2`` with
    respect to every layer of ``Ws`` (each (E, out, in), input to output); ``x`` (E, N, n_in).

    With ``M = W_L ... W_1``, ``dL/dM = D^T x / N``, and layer ``l`` receives
    ``(W_L ... W_{l+1})^T dL/dM (W_{l-1} ... W_1)^T`` ([L] Eq. 2's right-hand side). Only the
    products these need are formed (a GD step of a two-layer net is five batched matrix products).
    """
    if len(Ws) == 2:  # the loop below, unrolled: the same products, less Python a step
        W1, W2 = Ws
        D = x @ (W2 @ W1).mT - y
        G = D.mT @ x / D.shape[-2]
        return D, [W2.mT @ G, G @ W1.mT]
    below: list[Tensor | None] = [None]  # below[l] = W_{l-1} ... W_1 (None: the identity)
    for W in Ws[:-1]:
        below.append(W if below[-1] is None else W @ below[-1])
    M = Ws[-1] if below[-1] is None else Ws[-1] @ below[-1]
    D = x @ M.transpose(-1, -2) - y  # (E, N, n_out)
    G = D.transpose(-1, -2) @ x / D.shape[-2]  # dL/dM, (E, n_out, n_in)
    grads: list[Tensor] = [None] * len(Ws)  # type: ignore[list-item]
    above = None  # W_L ... W_{l+1}
    for l in range(len(Ws) - 1, -1, -1):
        g = G if above is None else above.transpose(-1, -2) @ G
        grads[l] = g if below[l] is None else g @ below[l].transpose(-1, -2)
        if l:  # the product of every layer is not needed
            above = Ws[l] if above is None else above @ Ws[l]
    return D, grads


def half_mean_squared(D: Tensor) -> Tensor:
    """``1/(2N) sum_i |D_i|^2`` of residuals (E, N, n_out): each member's loss, (E,).

    One sum over each member's N n_out squares: a reduction over the few (8) outputs of every sample
    first, then a mean, costs ~5x more with many members (0.14 against 0.03 ms at E = 4096, 8 x 8)."""
    return 0.5 * D.pow(2).flatten(-2).sum(-1) / D.shape[-2]


class TwoLayerGradients:
    """:func:`closed_form_gradients` and :func:`half_mean_squared` of a two-layer network, the same
    operations in the same order (so the same bits), written into tensors kept from call to call.

    With many members each intermediate is a megabyte or more; allocated afresh at every step, the
    allocator hands such blocks back to the system and takes them again, and the pages are mapped
    anew each time (~400 page faults a step at E = 4096, ~15% of it). The tensors returned are
    overwritten by the next call: use them before it. New tensors are made when a shape, dtype or
    device changes (a last, smaller minibatch; ``keep_members``; ``.to``)."""

    def __init__(self) -> None:
        self.key: tuple | None = None

    def __call__(self, Ws: list[Tensor], x: Tensor, y: Tensor) -> tuple[Tensor, list[Tensor]]:
        W1, W2 = Ws
        self._allocate(W1, W2, x)
        self._steps(W1, W2, x, y, 1, None)
        return self.D, [self.g1, self.g2]

    def descend(self, Ws: list[Tensor], x: Tensor, y: Tensor, lrs: list[float], steps: int) -> tuple[Tensor, Tensor]:
        """``steps`` (>= 1) plain GD steps ``W <- W - lr dL/dW`` on ``Ws`` in place: each a call and
        ``GradientDescent``'s update, the same operations (the same bits) without a call's checks and
        the optimizer's Python per step. The first step's losses (E,), and the last step's residuals
        (before its update; overwritten by the next call); the gradients returned by a call are the
        last step's."""
        W1, W2 = Ws
        self._allocate(W1, W2, x)
        self._steps(W1, W2, x, y, 1, lrs)
        first = self.loss(self.D)
        self._steps(W1, W2, x, y, steps - 1, lrs)
        return first, self.D

    def _allocate(self, W1: Tensor, W2: Tensor, x: Tensor) -> None:
        key = (W1.shape, W2.shape, x.shape, W1.dtype, W1.device)
        if key != self.key:
            self.key = key
            self.M, self.G = (W1.new_empty(*W2.shape[:-1], W1.shape[-1]) for _ in range(2))
            self.D, self.squares = (W1.new_empty(*x.shape[:-1], W2.shape[-2]) for _ in range(2))
            self.g1, self.g2 = torch.empty_like(W1), torch.empty_like(W2)

    def _steps(self, W1: Tensor, W2: Tensor, x: Tensor, y: Tensor, steps: int, lrs: list[float] | None) -> None:
        """``steps`` times: the products of a step into the kept tensors, then the update with the
        learning rates ``lrs`` (None: none, the gradients only)."""
        M, D, G, g1, g2 = self.M, self.D, self.G, self.g1, self.g2
        lr1, lr2 = lrs if lrs is not None else (0.0, 0.0)
        for _ in range(steps):
            torch.matmul(W2, W1, out=M)
            torch.matmul(x, M.mT, out=D).sub_(y)
            torch.matmul(D.mT, x, out=G).div_(D.shape[-2])
            torch.matmul(W2.mT, G, out=g1)
            torch.matmul(G, W1.mT, out=g2)
            if lrs is not None:  # GradientDescent's update (its order: the layers input to output)
                W1.sub_(g1, alpha=lr1)
                W2.sub_(g2, alpha=lr2)

    def loss(self, D: Tensor) -> Tensor:
        """:func:`half_mean_squared` of the residuals ``D`` of the last call."""
        return 0.5 * torch.pow(D, 2, out=self.squares).flatten(-2).sum(-1) / D.shape[-2]


def scheme_member_params(scheme: InitScheme, ensemble: int, seed: int) -> list[dict]:
    """One dict per member: its init parameters (``InitScheme.params``, a list parameter's
    ``e``-th value) and the weights' seed; a ``PathwayGrid`` member has its grid point (lam1, lam2)."""
    if isinstance(scheme, PathwayGrid):
        lam1, lam2 = scheme.grid()
        points = [{"lam1": a, "lam2": b} for a, b in zip(lam1.tolist(), lam2.tolist())]
        return [p | {"a0": scheme.a0, "omega0": scheme.omega0, "seed": seed} for p in points]
    return [{k: v[e] if len(v) > 1 else v[0] for k, v in scheme.params.items()} | {"seed": seed}
            for e in range(ensemble)]


class _Member(nn.Module):
    """One member's layers as a plain module (for ``torch.func``-based metrics)."""

    def __init__(self, weights: list[Tensor]) -> None:
        super().__init__()
        self.W = nn.ParameterList([nn.Parameter(w.clone()) for w in weights])

    def forward(self, x: Tensor) -> Tensor:
        for W in self.W:
            x = x @ W.transpose(-1, -2)
        return x
