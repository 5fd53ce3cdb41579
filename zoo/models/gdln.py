"""Gated deep linear networks and the ReLU networks they imitate ([H] Secs. 2-5).

``GDLN``: pathways (modules of hidden units) from input to output, one hidden layer each; pathway
p reads the input features ``inputs[p]`` and is switched on for data point i by its node gate
``g_p^i`` ([H] Eq. 1, ``h_v = g_v sum_e g_e W_e h_s(e)``). The gates come from the datamodule
(``datamodule.gating(name)``, a ``zoo.theory.gdln.Gating``) and stay fixed in training, as in a
ReLN ([H] Def. 3.1). ``ReLUNet``: the matching one- or two-hidden-layer ReLU network without
biases. A ReLU net is a GDLN whose gates are ``step(pre-activation)`` recomputed every step, so
both share one training loop.

Loss ``1/(2N) sum_i |y_i - h_i|^2`` ([H] Eq. 2, ``reduction = "mean"``; ``tau = 1/lr``) or the
authors' summed ``1/2 sum_i`` (``reduction = "sum"``; ``tau = 1/(N lr)``, [H] App. A), full-batch
gradient descent. E members (their own draws of the init) train as batched tensor ops.

Each ``training_step`` takes ``epochs_per_step`` full-batch gradient-descent updates (an epoch of
these small networks costs less than Lightning's per-step overhead). Every update is one step of
the module's optimizer (``configure_optimizers``: plain gradient descent at ``lr``,
``zoo.kernels.gdln.GradientDescent``, SGD's update without its per-call machinery), applied by the
optimizer itself (``GradientDescent.update_fn``, via :func:`epoch_update`) and counted by Lightning
(``zoo.training.steps.Updates``; through ``LightningOptimizer.step`` where a hook needs every step), so ``global_step`` counts GD updates = epochs, and ``max_steps`` is
the number of epochs. The gradients are written by
hand (no autograd graph, no per-epoch host sync; a one-hidden-layer net computes them into tensors
reused from epoch to epoch, ``zoo.kernels.gdln.TwoLayerEpoch``, and applies the optimizer's plain update
inside the epoch where nothing needs to see each step, the same bits) unless a subclass
overrides ``member_loss`` (or, for a ``ReLUNet``, ``gates``), which then trains by autograd on its
own loss. The loss of every epoch
is returned in the step's outputs for the callbacks (``epoch_loss``: network name -> (E, epochs_per_step),
every member, the member axis first as in every zoo output).

Across processes (``--trainer.strategy=ddp``, ``zoo.training.distributed``) the members are shared out:
every rank trains its slice of each network on the same full batch (a member's own data, e.g. its
XoR margin, is sliced with it) and the step's losses are gathered, so every rank logs, checks and
returns all E members, bit for bit those of one process.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Literal

import lightning.pytorch as pl
import torch
from zoo.training.lazy import lazy_instance
from torch import Tensor, nn
from torchmetrics import MeanSquaredError

from zoo.training.distributed import MemberParallel
from zoo.training.divergence import check_finite
from zoo.kernels.gdln import GradientDescent, PlainUpdate, TwoLayerEpoch, run_together
from zoo.models.base import ZooModule
from zoo.training.ensemble import ensemble_size
from zoo.training.hparams import save_own_hyperparameters
from zoo.init import Gaussian, InitScheme, from_spec
from zoo.utils.labels import member_labels
from zoo.training.logs import log_batch_scalars
from zoo.training.progress import Progress
from zoo.training.steps import Updates
from zoo.theory import gdln as theory
from zoo.theory.gdln import Gating, common_limit
from zoo.utils.threads import num_threads as scoped_threads  # the constructors take an argument named num_threads


def _outer(delta: Tensor, act: Tensor) -> Tensor:
    """The weight gradient ``delta^T act`` (..., out, in), computed in whichever orientation is
    faster: for a wide layer fed by few inputs (700 x 11) ``(act^T delta)^T`` takes a quarter of
    the time on CPU BLAS (a transposed view; ``W.sub_`` reads it as it is)."""
    if delta.shape[-1] > act.shape[-1]:
        return (act.transpose(-1, -2) @ delta).transpose(-1, -2)
    return delta.transpose(-1, -2) @ act


def updates_this_step(module: pl.LightningModule, per_step: int) -> int:
    """``per_step`` GD updates, fewer where ``max_steps`` falls inside the chunk (Lightning stops
    after the step that reaches it)."""
    trainer = module.trainer
    left = trainer.max_steps - trainer.global_step if trainer.max_steps is not None and trainer.max_steps > 0 else per_step
    return max(1, min(per_step, left))


def descend(grad_fns: list[Callable[[], Tensor]], n: int, step: Callable[[], object], threads: int | None) -> list[Tensor]:
    """``n`` gradient-descent updates: each ``grad_fns[i]()`` fills its network's ``W.grad`` and
    returns its loss (E,) before the update, then ``step()`` applies all of them. The losses, one
    (n, E) tensor per function."""
    losses: list[list[Tensor]] = [[] for _ in grad_fns]
    # an epoch of a small net is ~15 tensor ops of a few microseconds each: keep the loop lean
    with torch.no_grad(), scoped_threads(threads):
        for _ in range(n):
            for L, fn in zip(losses, grad_fns):
                L.append(fn())
            step()
    return [torch.stack(L) for L in losses]


def epoch_update(module: pl.LightningModule, updates: Updates, n: int) -> Callable[[], object]:
    """The update a training step applies after each of its ``n`` epochs: the optimizer's own
    update without its per-call checks (``GradientDescent.update_fn``, ~1 us an epoch less) where
    ``updates`` may bypass Lightning's step (``zoo.training.steps``), counted as the ``n`` updates the
    epochs' loop applies; else ``updates`` itself."""
    optimizer = GradientDescent.stepped_directly(updates)
    if optimizer is None:
        return updates
    updates.applied(n)  # run_together and descend apply it exactly n times
    return optimizer.update_fn()


def members_of(module: MemberParallel, t: Tensor) -> Tensor:
    """``t`` (E, ...) with one entry per member (a member's own data set or gates, 3-D) cut to the
    members this rank trains, while ``module`` is sharded; else ``t``."""
    r = module.member_range
    if r is not None and t.dim() == 3 and t.shape[0] == r[2]:
        return t[r[0]:r[1]]
    return t


#: the steps of ``FullBatchNet._grads``: one overridden trains by the generic code (``ZooModule.overrides``)
_GRAD_STEPS = ("_grads", "_forward", "_activate", "_gates", "_gate_backward", "_output_errors", "_backprop_last",
               "_input_mask", "gates")


def _loss_scale(reduction: str, y: Tensor) -> float:
    return 1.0 if reduction == "sum" else 1.0 / y.shape[-2]


class FullBatchNet(MemberParallel, Progress, ZooModule):
    """Shared machinery: shapes from the datamodule, the GD loop, losses and logging.

    Override points: ``member_loss`` (a subclass's loss trains by autograd), ``ReLUNet.gates``.
    Member-parallel (``zoo.training.distributed.MemberParallel``): the weights ``W.<i>`` and their initial
    values ``W<i>_init`` carry the member axis first; ``member_params`` stays whole.
    ``member_params``: one dict per member (its init parameters, ``seed`` and ``draw`` = its index
    among the seed's draws, and the datamodule's per-member data, e.g. XoR's ``Delta``)."""

    fast_steps, batch_format = ("member_loss",), "regression"

    def __init__(self, init: InitScheme, ensemble: int | None, lr: float, reduction: str,
                 epochs_per_step: int, seed: int, num_threads: int | None = 1) -> None:
        super().__init__()
        name = type(self).__name__
        scheme = from_spec(init).checked()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"{name}: reduction = {reduction!r}; allowed: 'mean' or 'sum'")
        if epochs_per_step < 1:
            raise ValueError(f"{name}: epochs_per_step = {epochs_per_step}; allowed: a positive integer")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"{name}: num_threads = {num_threads}; allowed: a positive integer or None")
        E = ensemble_size(name, {"init": scheme.ensemble_size}, ensemble)
        self.init_scheme, self.ensemble, self.lr, self.reduction = scheme, E, self.check_lr(lr), reduction
        self.epochs_per_step, self.seed, self.num_threads = epochs_per_step, seed, num_threads
        self.member_params = [{**{k: v[e] if len(v) > 1 else v[0] for k, v in scheme.params.items()},
                               "seed": seed, "draw": e} for e in range(E)]
        self.automatic_optimization = False
        self.W = nn.ParameterList()
        self.init_progress()
        self.val_mse, self.test_mse = MeanSquaredError(), MeanSquaredError()

    @property
    def labels(self) -> list[str]:
        """Each member's name in TensorBoard tags, from ``member_params`` (``zoo.utils.labels``)."""
        return member_labels(self.member_params)

    def n_members(self) -> int:
        return self.ensemble

    def member_tensor_names(self) -> list[str]:
        # by name, not by the size of the first axis: the residual target (N, n_out) has N rows
        return [k for k in self.state_dict(keep_vars=True) if re.fullmatch(r"W\.\d+|W\d+_init", k)]

    # -- structure ----------------------------------------------------------------------------
    @property
    def built(self) -> bool:
        return len(self.W) > 0

    def layer_shapes(self, n_in: int, n_out: int) -> list[tuple[int, int]]:
        raise NotImplementedError

    def build(self, X: Tensor, Y: Tensor) -> None:
        """Create the weights for data of these shapes (the Trainer calls it from ``setup``)."""
        shapes = self.layer_shapes(X.shape[-1], Y.shape[-1])
        ws = self.init_scheme.weights(shapes, ensemble=self.ensemble, generator=torch.Generator().manual_seed(self.seed))
        self.W = nn.ParameterList([nn.Parameter(w) for w in ws])
        for i, w in enumerate(ws):
            self.register_buffer(f"W{i}_init", w.clone())

    def setup(self, stage: str) -> None:
        if not self.built:
            dm = self.trainer.datamodule
            self.attach(dm)
            self.build(dm.X, dm.Y)

    def attach(self, datamodule) -> None:
        """Read what the module needs from the datamodule besides (X, Y) (GDLN: its gates), and
        the datamodule's ``member_params`` (one dict per member, e.g. XoR's margins) if it has them."""
        data = getattr(datamodule, "member_params", None)
        if data and len(data) == self.ensemble:
            self.member_params = [{**d, **p} for d, p in zip(data, self.member_params)]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # The weights are shaped by the data at setup(); a module loaded without a datamodule
        # (load_from_checkpoint) takes the shapes from the checkpoint, then load_state_dict fills them.
        if self.built:
            return
        state = checkpoint["state_dict"]
        n = sum(1 for key in state if key.startswith("W.") and key[2:].isdigit())
        self.W = nn.ParameterList([nn.Parameter(torch.empty_like(state[f"W.{i}"])) for i in range(n)])
        for key, value in state.items():
            if not key.startswith("W.") and "." not in key and not hasattr(self, key):
                self.register_buffer(key, torch.empty_like(value))

    def divergence_hint(self) -> str:
        return (f"lr = {self.lr} is probably too large for this task (reduction = {self.reduction!r}: the summed "
                "loss needs an lr N times smaller than the mean); try lr / 10.")

    def tau(self, N: int) -> float:
        """The time constant in steps: ``1/lr`` (mean loss) or ``1/(N lr)`` (summed loss)."""
        return 1.0 / (self.lr * (N if self.reduction == "sum" else 1))

    def networks(self) -> dict[str, "FullBatchNet"]:
        """name -> network trained by this module (itself; a ``Comparison``: its models)."""
        return {type(self).__name__: self}

    def predicted_loss(self, X: Tensor, Y: Tensor, epochs: int, record_every: int = 10) -> tuple[Tensor, Tensor] | None:
        """The theory's loss curve in this module's loss units, (epochs (T,), loss (T, E')), or None
        where there is none (a ReLU net's theory is its ReLN's)."""
        return None

    def closed_form_loss(self, datamodule, steps: Tensor) -> tuple[Tensor, Tensor] | None:
        """A closed-form loss curve at ``steps`` for this network on ``datamodule``, or None."""
        return None

    def _gates(self, pre: Tensor, layer: int) -> Tensor:
        """The gates of hidden layer ``layer`` given its pre-activations (E, N, H)."""
        raise NotImplementedError

    def _input_mask(self) -> Tensor | None:
        return None

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, n_in) or (E, N, n_in); returns (E, N, n_out)."""
        # the weights' dtype and device: a caller may pass the datamodule's inputs, on the host
        return self._forward(members_of(self, x).to(self.W[0]), list(self.W))[0]

    def hidden_activity(self, x: Tensor) -> list[Tensor]:
        """Every hidden layer's activity on the data points, one (E, N, H) tensor per layer."""
        with torch.no_grad():
            return self._forward(members_of(self, x).to(self.W[0]), list(self.W))[1][1:]

    def _forward(self, x: Tensor, Ws: list[Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        mask = self._input_mask()
        acts, gates = [x], []
        h = x
        for layer, W in enumerate(Ws[:-1]):
            if layer == 0 and mask is not None:
                W = W * mask
            h, g = self._activate(h @ W.transpose(-1, -2), layer)
            acts.append(h)
            gates.append(g)
        return h @ Ws[-1].transpose(-1, -2), acts, gates

    def _activate(self, pre: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        """Hidden activity ``g * pre`` and the gates ``g`` of layer ``layer`` ([H] Eq. 1)."""
        g = self._gates(pre, layer)
        return pre * g, g

    def _gate_backward(self, delta: Tensor, gates: Tensor, h: Tensor) -> Tensor:
        """Backpropagate through a gated layer: the gates are constants of the step."""
        return delta * gates

    def member_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """The loss ``1/(2N) sum_i |y_i - h_i|^2`` (or ``1/2 sum_i`` with reduction 'sum') per member, (E,)
        ([H] Eq. 2). Override it to train on another loss: training then takes its gradient by
        autograd (the hand-written gradients are this loss's, or the ``training`` scheme's)."""
        x, y = batch
        out = self(x)
        scale = 1.0 if self.reduction == "sum" else 1.0 / y.shape[-2]
        return 0.5 * scale * (out - y.to(out)).pow(2).sum((-1, -2))

    # -- gradients ------------------------------------------------------------------------------
    def _grads(self, x: Tensor, y: Tensor, Ws: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """Gradients of the loss for every weight (E, out, in) and the loss before the step (E,)."""
        scale = _loss_scale(self.reduction, y)
        out, acts, gates = self._forward(x, Ws)
        err = out - y
        loss = 0.5 * scale * err.pow(2).sum((-1, -2))
        errs = self._output_errors(err, out, acts[-1], Ws[-1], y)
        grads: list[Tensor] = [None] * len(Ws)  # type: ignore[list-item]
        grads[-1] = _outer(errs, acts[-1]) if errs.dim() == err.dim() else None
        if scale != 1.0 and grads[-1] is not None:
            grads[-1] = grads[-1] * scale
        delta = self._backprop_last(errs, Ws[-1], acts[-1], grads, scale)
        for layer in range(len(Ws) - 2, -1, -1):
            delta = self._gate_backward(delta, gates[layer], acts[layer + 1])
            g = _outer(delta, acts[layer])
            if scale != 1.0:
                g = g * scale
            if x.dim() == 2 and g.dim() == 2:
                g = g.expand_as(Ws[layer])
            if layer == 0 and self._input_mask() is not None:
                g = g * self._input_mask()
            grads[layer] = g
            if layer > 0:
                delta = delta @ Ws[layer]
        return grads, loss

    def _output_errors(self, err: Tensor, out: Tensor, h: Tensor, W_out: Tensor, y: Tensor) -> Tensor:
        return err

    def _backprop_last(self, errs: Tensor, W_out: Tensor, h: Tensor, grads: list[Tensor], scale: float) -> Tensor:
        return errs @ W_out

    # -- training ---------------------------------------------------------------------------------
    def hand_written(self) -> bool:
        """True when the hand-written gradients (``_grads``) are the gradients of what is trained:
        no subclass changed ``member_loss``."""
        return not self.overrides("member_loss")

    @property
    def epochs_done(self) -> int:
        """Full-batch GD updates so far: one per epoch, = ``global_step``."""
        return self.global_step

    def _cast(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The full batch as this rank trains it: its members' slice, the weights' dtype."""
        dtype = self.W[0].dtype
        return members_of(self, x).to(dtype), y.to(dtype)

    def gradient_fn(self, x: Tensor, y: Tensor) -> Callable[[], Tensor]:
        """A function that puts the loss gradient of every weight in ``W.grad`` and returns the
        loss (E,) at the current weights, on the full batch (x, y). Call it under ``no_grad``."""
        x, y = self._cast(x, y)
        params = list(self.W)
        if not self.hand_written():
            def autograd() -> Tensor:
                with torch.enable_grad():
                    loss = self.member_loss((x, y))
                    grads = torch.autograd.grad(loss.sum(), params)
                for W, g in zip(params, grads):
                    W.grad = g
                return loss.detach()
            return autograd
        epoch = self._prepared_fast_epoch(x, y)
        if epoch is not None:
            def fast() -> Tensor:
                loss, grads = epoch()
                for W, g in zip(params, grads):
                    if W.grad is None or W.grad.data_ptr() != g.data_ptr():  # the same tensors every epoch
                        W.grad = g.view(W.shape)
                return loss.view(-1)
            return fast

        Ws = self._weights_data(x)

        def hand_written() -> Tensor:
            grads, loss = self._grads(x, y, Ws)
            for W, g in zip(params, grads):
                W.grad = g.reshape(W.shape)
            return loss.reshape(-1)  # (E,), this rank's members
        return hand_written

    def _weights_data(self, x: Tensor) -> list[Tensor]:
        Ws = [w.data for w in self.W]
        if self.ensemble == 1 and x.dim() == 2:
            Ws = [w[0] for w in Ws]  # views: plain matrix products are ~10% faster than batched ones of size 1
        return Ws

    def _prepared_fast_epoch(self, x: Tensor, y: Tensor) -> TwoLayerEpoch | None:
        """``_fast_epoch`` on (x, y) already cut to this rank's members and cast, where the
        hand-written gradients are trained; else None."""
        if not self.hand_written() or y.dim() > x.dim():  # (targets with more axes would outgrow the reused output)
            return None
        return self._fast_epoch(x, y, self._weights_data(x))

    def _fast_epoch(self, x: Tensor, y: Tensor, Ws: list[Tensor]) -> TwoLayerEpoch | None:
        """``_grads`` of a one-hidden-layer net in reused tensors (``zoo.kernels.gdln``), where the
        network computes what ``TwoLayerEpoch`` does (no subclass changed a step of ``_grads``); else None."""
        return None

    def sgd_step(self) -> PlainUpdate:
        """The plain GD update ``W -= lr W.grad`` (what ``run_epochs`` applies without a Trainer)."""
        return PlainUpdate([(W, self.lr) for W in self.W])

    def threads(self, x: Tensor) -> int | None:
        return self.num_threads if x.device.type == "cpu" else None

    def run_epochs(self, x: Tensor, y: Tensor, n: int, step: Callable[[], object] | None = None) -> Tensor:
        """``n`` full-batch gradient steps in place, each applied by ``step()`` (default: ``sgd_step``;
        a one-hidden-layer net applies a ``PlainUpdate`` inside its epochs instead, to the same bits);
        returns the loss before each step, (n, E)."""
        step = step or self.sgd_step()
        epoch = self._prepared_fast_epoch(*self._cast(x, y))
        if epoch is not None:  # the epochs in one loop, their losses a block at a time (zoo.kernels.gdln)
            with torch.no_grad(), scoped_threads(self.threads(x)):
                return run_together([epoch], [list(self.W)], n, step)[0].view(n, -1)
        return descend([self.gradient_fn(x, y)], n, step, self.threads(x))[0]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict:
        x, y = batch
        first_epoch, n = self.global_step, updates_this_step(self, self.epochs_per_step)
        # each epoch's update by the optimizer itself, counted in global_step (zoo.training.steps)
        updates = Updates(self)
        losses = self.run_epochs(x, y, n, step=epoch_update(self, updates, n))
        updates.finish()
        losses = self.all_member_values(losses, dim=1)  # (n, E)
        self.count_samples(n * y.shape[-2])
        # every rank holds every member's losses: one decision, the same on all of them
        self.stop_if_diverged(losses[-1], first_epoch + n - 1)
        # at the step of the weights it was measured on (Lightning's own axis counts batches)
        log_batch_scalars(self, first_epoch, {"loss": losses[0]}, members=losses[0])
        return {"loss": losses[0].sum(), "epoch_loss": {type(self).__name__: losses.detach().T}, "first_epoch": first_epoch}

    def evaluate(self, batch: tuple[Tensor, Tensor], metric: MeanSquaredError) -> MeanSquaredError:
        """Update ``metric`` with the mean squared error of every member's output on ``batch``."""
        x, y = batch
        out = self(x)
        metric.update(out.reshape(-1), y.to(out).expand_as(out).reshape(-1))
        return metric

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.log("val/mse", self.evaluate(batch, self.val_mse), on_epoch=True, on_step=False)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.log("test/mse", self.evaluate(batch, self.test_mse), on_epoch=True, on_step=False)

    def configure_optimizers(self) -> GradientDescent:
        # plain GD without SGD's per-call machinery: one step per epoch (zoo.kernels.gdln)
        return GradientDescent(self.parameters(), lr=self.lr)


class GDLN(FullBatchNet):
    """A one-hidden-layer gated deep linear network ([H] Eqs. 1-2) with the gates of a datamodule.

    Hidden units are grouped in pathways of ``n_hidden`` units; unit j of pathway p computes
    ``g_p^i w_j^T (M_p x_i)`` and all pathways write to the whole output.

    Args:
        gating: name of the datamodule's gating ("reln", "single", "linear", "xor", ...).
        n_hidden: hidden units per pathway ([H] App. H: 100).
        init: init scheme for both layers ([H] App. H: Gaussian, scale 1e-7).
        ensemble: members (independent draws); default: the scheme's list length.
        lr: gradient-descent step.
        reduction: 'mean' (``1/(2N) sum``) or 'sum' (the authors' ``1/2 sum``).
        training: 'joint' (one loss, [H] Eq. 2), 'two_loss' (the authors' code: common
            pathways learn the target, the others the residual ``Y - Y_common``; both gradients
            are applied each step. The context pathways' gradient is the same as under 'joint';
            only the common pathways stop seeing the others' output) or 'residual' (the scheme
            [H] App. F derives its closed forms for: the common pathways learn the target alone,
            the others the FIXED residual ``Y* = Y - Y_common(inf)``, ``zoo.theory.gdln.common_limit``,
            from the first step, so they do not wait for the common pathway; the closed forms
            of ``zoo.theory.gdln.contexts_closed_form`` describe this network).
        context_init_gain: the init std of every non-common pathway (both layers) is this times the
            scheme's. The authors' code for the three-context task ([H] Figs. 3-4) starts its
            context modules at twice the common module's std (0.01/700 against 0.005/700): 2 there.
            Their late learning is set by it (the small context modes are learnt last).
        epochs_per_step: full-batch epochs per ``training_step``.
        seed: seed of the initial weights.
        num_threads: CPU threads while training (torch's setting is restored after each chunk of
            epochs); None leaves torch's. Default 1: an epoch of these networks is a few small
            matrix products, too small to share between cores, and OpenMP's synchronisation costs
            more than the second core gives (the three-context ReLU net: 2.8 s on 1 thread, 6.1 s
            on 2 for 8,000 epochs on an idle 2-core machine; far worse when the cores are shared).
            Raise it for large ensembles or wide nets.
    """

    fast_steps = _GRAD_STEPS  # the two-layer fast epoch (TwoLayerEpoch) is these steps

    def __init__(
        self,
        gating: str = "reln",
        n_hidden: int = 100,
        init: InitScheme = lazy_instance(Gaussian, sigma=1e-7),
        ensemble: int | None = None,
        lr: float = 1e-3,
        reduction: Literal["mean", "sum"] = "sum",
        training: Literal["joint", "two_loss", "residual"] = "joint",
        context_init_gain: float = 1.0,
        epochs_per_step: int = 100,
        seed: int = 0,
        num_threads: int | None = 1,
    ) -> None:
        super().__init__(init, ensemble, lr, reduction, epochs_per_step, seed, num_threads)
        if n_hidden < 1:
            raise ValueError(f"GDLN: n_hidden = {n_hidden}; allowed: a positive integer")
        if not (context_init_gain > 0 and math.isfinite(context_init_gain)):
            raise ValueError(f"GDLN: context_init_gain = {context_init_gain}; allowed: a positive number")
        if training not in ("joint", "two_loss", "residual"):
            raise ValueError(f"GDLN: training = {training!r}; allowed: 'joint', 'two_loss' or 'residual'")
        save_own_hyperparameters(self, init=self.init_scheme.spec())
        self.gating_name, self.n_hidden, self.training_mode = gating, n_hidden, training
        self.context_init_gain = float(context_init_gain)
        self.gating: Gating | None = None

    def attach(self, datamodule) -> None:
        if not callable(getattr(datamodule, "gating", None)):
            raise TypeError(f"GDLN needs a datamodule with gating(name); {type(datamodule).__name__} has none")
        super().attach(datamodule)
        self.set_gating(datamodule.gating(self.gating_name))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.gating is not None:  # the gates are data, not weights: keep them for load_from_checkpoint
            g = self.gating
            checkpoint["gdln_gating"] = {"gates": g.gates, "inputs": g.inputs, "common": g.common, "names": list(g.names)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.gating is None and "gdln_gating" in checkpoint:
            self.set_gating(Gating(**checkpoint["gdln_gating"]))
        super().on_load_checkpoint(checkpoint)

    def set_gating(self, gating: Gating) -> None:
        """Use these gates; pathways are laid out common ones first (so the two-loss split is a slice)."""
        order = sorted(range(gating.n_pathways), key=lambda p: not bool(gating.common[p]))
        self.gating = Gating(gating.gates[..., order], gating.inputs[order], gating.common[order],
                             [gating.names[p] for p in order])
        n = self.n_hidden
        self.register_buffer("unit_gates", self.gating.gates.float().repeat_interleave(n, dim=-1), persistent=False)
        self.register_buffer("unit_inputs", self.gating.inputs.float().repeat_interleave(n, dim=0), persistent=False)
        self.n_common_units = int(self.gating.common.sum()) * n

    def layer_shapes(self, n_in: int, n_out: int) -> list[tuple[int, int]]:
        if self.gating is None:
            raise RuntimeError("GDLN: call set_gating(...) (or train with a datamodule) before build")
        H = self.gating.n_pathways * self.n_hidden
        return [(H, n_in), (n_out, H)]

    def _gates(self, pre: Tensor, layer: int) -> Tensor:
        return members_of(self, self.unit_gates).to(pre)

    def _input_mask(self) -> Tensor | None:
        return self.unit_inputs.to(self.W[0].dtype) if self.gating is not None else None

    def pathway_gains(self) -> Tensor:
        """Each pathway's init gain (P,): 1 for the common pathways, ``context_init_gain`` for the others."""
        return torch.where(self.gating.common, 1.0, self.context_init_gain).double()

    def _layer_gains(self) -> tuple[Tensor, Tensor]:
        """The gains as factors of the input layer (H, 1) and the output layer (H,), unit by unit."""
        g = self.pathway_gains().repeat_interleave(self.n_hidden)
        return g[:, None], g

    def build(self, X: Tensor, Y: Tensor) -> None:
        super().build(X, Y)
        if self.context_init_gain != 1.0:
            if len(self.W) != 2:
                raise ValueError(f"{type(self).__name__}: context_init_gain is defined for one hidden layer only")
            with torch.no_grad():
                for i, g in enumerate(self._layer_gains()):
                    for w in (self.W[i], getattr(self, f"W{i}_init")):
                        w.mul_(g.to(w))
        if self.training_mode == "residual":
            if self.n_common_units == 0:
                raise ValueError(f"GDLN: training = 'residual' needs a common pathway; gating {self.gating_name!r} has none")
            if self.gating.gates.dim() != 2:
                raise ValueError("GDLN: training = 'residual' needs one set of gates (N, P) for all members")
            # on the module's threads, as its training: BLAS sums in another order on another count,
            # and a resumed run must find the same limit as the run it continues
            with scoped_threads(self.num_threads if X.device.type == "cpu" else None):
                limit = common_limit(X, Y, self.gating)
            self.register_buffer("y_common_limit", limit)  # float64: cast at use

    def _fast_epoch(self, x: Tensor, y: Tensor, Ws: list[Tensor]) -> TwoLayerEpoch | None:
        if len(Ws) != 2 or self._two_loss() or any(self.overrides(n) for n in _GRAD_STEPS):
            return None
        gates = members_of(self, self.unit_gates).to(x)
        if gates.dim() > Ws[0].dim():  # per-member gates of a single member: the generic code's shapes
            return None
        return TwoLayerEpoch(x, y, Ws, gates, self._input_mask(), _loss_scale(self.reduction, y))

    def _two_loss(self) -> bool:
        return self.training_mode != "joint" and 0 < self.n_common_units < self.unit_gates.shape[-1]

    def hand_written(self) -> bool:
        if not super().hand_written() and self.training_mode != "joint":
            raise ValueError(f"{type(self).__name__}: training = {self.training_mode!r} splits the loss in the "
                             "hand-written gradients; a subclass that overrides member_loss trains on its own loss: "
                             "use training = 'joint'")
        return super().hand_written()

    def _output_errors(self, err: Tensor, out: Tensor, h: Tensor, W_out: Tensor, y: Tensor) -> Tensor:
        if not self._two_loss():
            return err
        c = self.n_common_units
        err_common = h[..., :c] @ W_out[..., :c].transpose(-1, -2) - y
        if self.training_mode == "residual":
            if y.shape[-2:] != self.y_common_limit.shape:
                raise ValueError(f"GDLN: training = 'residual' trains on the full batch it was built for "
                                 f"{tuple(self.y_common_limit.shape)}; got targets {tuple(y.shape)}")
            err = h[..., c:] @ W_out[..., c:].transpose(-1, -2) - (y - self.y_common_limit.to(y))
        return torch.stack([err_common, err])  # (2, E, N, n_out): common units' error, the others'

    def _backprop_last(self, errs: Tensor, W_out: Tensor, h: Tensor, grads: list[Tensor], scale: float) -> Tensor:
        if errs.dim() == h.dim():
            return errs @ W_out
        c = self.n_common_units
        grads[-1] = scale * torch.cat([errs[0].transpose(-1, -2) @ h[..., :c], errs[1].transpose(-1, -2) @ h[..., c:]], -1)
        # (the caller's scaling of grads[-1] is skipped for this stacked error)
        return torch.cat([errs[0] @ W_out[..., :c], errs[1] @ W_out[..., c:]], -1)

    # -- analytic quantities --------------------------------------------------------------------
    def predicted_loss(self, X: Tensor, Y: Tensor, epochs: int, record_every: int = 10) -> tuple[Tensor, Tensor] | None:
        """On one dataset: the neural race ([H] Eq. 6, ``zoo.theory.gdln.race_trajectory``) from each
        pathway's initial strength. On the XoR-margin ensemble (X (E, 4, 3)): the closed forms of
        [H] App. C per member (gatings 'linear' and 'xor' only)."""
        if self.gating is None:
            return None
        N = X.shape[-2]
        unit = N if self.reduction == "sum" else 1.0
        if X.dim() == 3:
            if self.gating_name not in ("linear", "xor"):
                return None
            t = torch.arange(0, epochs + 1, record_every, dtype=torch.float64)
            loss = theory.xor_loss(t[:, None], X[:, 0, 2].abs().double()[None, :], self.gating_name, tau=self.tau(N),
                                   a0=self.initial_mode_strength())
            return t, unit * loss
        steps, _, loss = theory.race_trajectory(X, Y, self.gating, epochs, tau=self.tau(N), a0=self.pathway_a0(),
                                                training=self.training_mode, record_every=record_every)
        return steps.double(), unit * loss[:, None]

    def closed_form_loss(self, datamodule, steps: Tensor) -> tuple[Tensor, Tensor] | None:
        """The corrected closed form of [H] App. F-G (m = C - 1) for a ReLN on the symmetric task,
        or None. Only with ``training='residual'``: the closed form solves that scheme (the context
        pathways learn the fixed residual from the start); a jointly trained ReLN learns faster."""
        if not (self.gating_name == "reln" and self.training_mode == "residual"
                and getattr(datamodule, "structure", "") == "same"):
            return None
        X, Y = datamodule.X, datamodule.Y
        a0, common = self.pathway_a0(), self.gating.common
        _, loss = theory.contexts_closed_form(X, Y, self.gating, steps, tau=self.tau(X.shape[0]),
                                              a0=float(a0[common].mean()), a0_context=float(a0[~common].mean()))
        return steps, (X.shape[0] if self.reduction == "sum" else 1.0) * loss[:, None]

    def predicted_pathway_strengths(self, X: Tensor, Y: Tensor, epochs: int, n_modes: int,
                                    record_every: int = 1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The race's ([H] Eq. 6) strength of each pathway's top ``n_modes`` modes of its effective
        dataset ([H] Eq. 5): the modes U (P, n_out, k), V (P, n_in, k) (for ``pathway_singular_values``),
        the epochs (T,) and ``u_k^T W_p(t) v_k`` (T, P, k)."""
        U, V = theory.pathway_mode_matrices(theory.effective_datasets(X, Y, self.gating)[0], n_modes)
        t, maps, _ = theory.race_trajectory(X, Y, self.gating, epochs, tau=self.tau(X.shape[0]), a0=self.pathway_a0(),
                                            training=self.training_mode, record_every=record_every)
        # a matrix product per (epoch, pathway), then the diagonal: the same bits for every run length
        # (one einsum over all epochs contracts in an order that depends on their number)
        return U, V, t, (U.transpose(-1, -2) @ maps @ V).diagonal(dim1=-2, dim2=-1)

    def pathway_maps(self) -> Tensor:
        """Each pathway's network map ``W2_p diag(M_p) W1_p`` (E, P, n_out, n_in) (its gate not applied)."""
        W1 = (self.W[0].detach() * self._input_mask())
        W2 = self.W[1].detach()
        E, H, n_in = W1.shape
        P, n = self.gating.n_pathways, self.n_hidden
        return torch.einsum("eopj,epji->epoi", W2.reshape(E, -1, P, n), W1.reshape(E, P, n, n_in))

    def pathway_singular_values(self, U: Tensor | None = None, V: Tensor | None = None) -> Tensor:
        """Singular values of each pathway's map (E, P, k); with task modes ``U`` (P, n_out, k),
        ``V`` (P, n_in, k) (from ``zoo.theory.gdln.pathway_modes``), the projections ``u_a^T W_p v_a``
        instead ([H] Eq. 5, the B of Eq. 6)."""
        M = self.pathway_maps().double()
        if U is None:
            return torch.linalg.svdvals(M)
        return torch.einsum("pok,epoi,pik->epk", U.to(M), M, V.to(M))

    def initial_mode_strength(self) -> float:
        """The initial strength a0 of a pathway mode for the race ([H] Eq. 6): ``sigma^2 n_hidden``.

        From a small random init the hidden units of a pathway align with its top mode before the
        mode grows, so the mode starts from ``(|W1_p v|^2 + |W2_p^T u|^2)/2 ~ n_hidden sigma^2``, not
        from the rms entry of the initial map (measured from the initial weights, averaged)."""
        mask = self._input_mask().double().expand_as(self.W0_init)
        W1, W2 = self.W0_init.double(), self.W1_init.double()
        if self.context_init_gain != 1.0:  # the scheme's std: pathway_a0() applies the gains
            g1, g2 = (g.to(W1.device) for g in self._layer_gains())  # the gating lives on the host
            W1, W2 = W1 / g1, W2 / g2
        sigma2 = (W1.pow(2)[mask > 0].sum() + W2.pow(2).sum()) / (mask.sum() + W2.numel())
        return float(sigma2 * self.n_hidden)

    def pathway_a0(self) -> Tensor:
        """Each pathway's initial mode strength for the race (P,): ``initial_mode_strength()``
        times its init gain squared (both layers carry the gain)."""
        return self.initial_mode_strength() * self.pathway_gains().pow(2)


class ReLUNet(FullBatchNet):
    """A ReLU network without biases, ``y = W_L relu(... relu(W_1 x))`` ([H] Secs. 3-6).

    Args:
        hidden: hidden widths, e.g. ``[700]`` or ``[700, 700]`` ([H] App. H: 700; Sec. 6: two layers).
        init, ensemble, lr, reduction, epochs_per_step, seed, num_threads: as for ``GDLN`` (same
            defaults, so a ReLU net and its ReLN start at the same scale and learn at the same rate).
    """

    fast_steps = _GRAD_STEPS  # the two-layer fast epoch (TwoLayerEpoch) is these steps

    def __init__(
        self,
        hidden: list[int] = [700],
        init: InitScheme = lazy_instance(Gaussian, sigma=1e-7),
        ensemble: int | None = None,
        lr: float = 1e-3,
        reduction: Literal["mean", "sum"] = "sum",
        epochs_per_step: int = 100,
        seed: int = 0,
        num_threads: int | None = 1,
    ) -> None:
        super().__init__(init, ensemble, lr, reduction, epochs_per_step, seed, num_threads)
        if not hidden or any(int(h) < 1 for h in hidden) or len(hidden) > 2:
            raise ValueError(f"ReLUNet: hidden = {hidden}; allowed: one or two positive widths, e.g. [700]")
        save_own_hyperparameters(self, init=self.init_scheme.spec())
        self.hidden = [int(h) for h in hidden]

    def layer_shapes(self, n_in: int, n_out: int) -> list[tuple[int, int]]:
        dims = [n_in, *self.hidden, n_out]
        return [(b, a) for a, b in zip(dims[:-1], dims[1:])]

    def gates(self, h: Tensor) -> Tensor:
        """The gates of a hidden layer given its pre-activations ``h`` (E, N, H): ``step(h)``, which
        makes ``g * h`` a ReLU ([H] Sec. 3: a ReLU net is a GDLN whose gates depend on the input).
        Override it to gate otherwise; the gates are constants of each step (no gradient flows
        through them, as through the step function of a ReLU)."""
        return (h > 0).to(h.dtype)

    def _relu_gates(self) -> bool:
        return not self.overrides("gates")

    def _gates(self, pre: Tensor, layer: int) -> Tensor:
        return self.gates(pre).detach()

    def _activate(self, pre: Tensor, layer: int) -> tuple[Tensor, Tensor | None]:
        if not self._relu_gates():
            return super()._activate(pre, layer)
        # the gates step(pre) are read back from relu(pre) > 0 where needed: one pass instead of three
        return torch.relu(pre), None

    def _gate_backward(self, delta: Tensor, gates: Tensor | None, h: Tensor) -> Tensor:
        if gates is not None:
            return delta * gates
        return torch.ops.aten.threshold_backward(delta, h, 0.0)

    def _fast_epoch(self, x: Tensor, y: Tensor, Ws: list[Tensor]) -> TwoLayerEpoch | None:
        if len(Ws) != 2 or any(self.overrides(n) for n in _GRAD_STEPS):
            return None
        return TwoLayerEpoch(x, y, Ws, None, None, _loss_scale(self.reduction, y))

    def first_layer_on(self, X: Tensor) -> tuple[float, float]:
        """How linear a two-hidden-layer net's first layer is ([H] Sec. 6: "all neurons are active
        for all datapoints"): the fraction of first-layer units on per data point, each unit
        weighted by its path strength ``|W0_j| |W1_{:, j}|`` (units still at their small random init
        compute nothing and are half on by chance). Returns (mean, min) over points and members."""
        on = self.activation_patterns(X)[0].double()  # (E, N, H)
        W0, W1 = self.W[0].detach().double(), self.W[1].detach().double()
        weight = W0.norm(dim=-1) * W1.norm(dim=-2)  # (E, H)
        frac = (on * weight[:, None, :]).sum(-1) / weight.sum(-1, keepdim=True)  # (E, N)
        return float(frac.mean()), float(frac.min())

    def activation_patterns(self, x: Tensor) -> list[Tensor]:
        """Binary activation pattern of every hidden unit over the data points, one (E, N, H) bool
        tensor per hidden layer ([H] App. B: the rows k-means clusters into gates)."""
        return [h != 0 for h in self.hidden_activity(x)]


def _model_from_spec(model: FullBatchNet | dict, i: int) -> FullBatchNet:
    """A model of a :class:`Comparison`, from itself or from its ``{"class_path", "init_args"}``
    (how ``load_from_checkpoint`` gives it back)."""
    if isinstance(model, FullBatchNet):
        return model
    if isinstance(model, dict) and isinstance(model.get("class_path"), str):
        import importlib

        module, _, name = model["class_path"].rpartition(".")
        try:
            cls = getattr(importlib.import_module(module or "zoo"), name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"Comparison: models[{i}].class_path = {model['class_path']!r} cannot be imported: {e}") from e
        if isinstance(cls, type) and issubclass(cls, FullBatchNet):
            return cls(**model.get("init_args", {}))
    raise ValueError(f"Comparison: models[{i}] = {model!r}; allowed: a GDLN / ReLUNet (a FullBatchNet) or its "
                     "{'class_path': ..., 'init_args': {...}}")


def _model_spec(model: FullBatchNet) -> dict:
    """``{"class_path", "init_args"}`` of a model, from the arguments it recorded."""
    return {"class_path": f"{type(model).__module__}.{type(model).__name__}",
            "init_args": {k: v for k, v in model.hparams.items() if not k.startswith("_")}}


class Comparison(MemberParallel, Progress, ZooModule):
    """Several full-batch networks trained side by side on one datamodule, e.g. a ReLU net, its
    ReLN and a GDLN that does not match ([H] Figs. 2, 4, 5).

    One fit, one set of loss curves on one plot and in one TensorBoard chart: the comparison is
    the experiment, so the networks are members of one module rather than a callback's side job.
    Each model keeps its own init, ensemble and learning rate; ``epochs_per_step`` here overrides
    theirs so they stay in lockstep.

    The hyperparameters hold every model as ``{"class_path", "init_args"}`` (in ``hparams.yaml``
    and the checkpoint), so ``Comparison.load_from_checkpoint(path)`` rebuilds all of them.

    Member-parallel across processes (``zoo.training.distributed``) when every model has the same ensemble
    E: member e of every model trains on the same rank, so the models stay in lockstep there.

    Args:
        models: the networks (``GDLN``, ``ReLUNet``, ...), built from the datamodule at setup; or
            their ``{"class_path", "init_args"}`` specs.
        names: a short name per model (default: class name, plus the gating for a GDLN).
        epochs_per_step: full-batch epochs per ``training_step`` for every model.
    """

    def __init__(self, models: list[FullBatchNet], names: list[str] | None = None, epochs_per_step: int = 100) -> None:
        super().__init__()
        if not models:
            raise ValueError("Comparison: models is empty; allowed: a non-empty list of GDLN / ReLUNet")
        models = [_model_from_spec(m, i) for i, m in enumerate(models)]
        if names is not None and len(names) != len(models):
            raise ValueError(f"Comparison: {len(names)} names for {len(models)} models; give one name per model")
        if epochs_per_step < 1:
            raise ValueError(f"Comparison: epochs_per_step = {epochs_per_step}; allowed: a positive integer")
        specs = [_model_spec(m) for m in models]
        # given as a dict: what the logger writes (hparams_initial) holds the specs, not the modules;
        # with the class path, as the CLI records its modules, so `--ckpt_path` can read them back
        self.save_hyperparameters({"_class_path": f"{type(self).__module__}.{type(self).__qualname__}",
                                   "models": specs, "names": names, "epochs_per_step": epochs_per_step})
        self.models = nn.ModuleList(models)
        self.names = names or [type(m).__name__ + (f"_{m.gating_name}" if isinstance(m, GDLN) else "") for m in models]
        self.epochs_per_step = epochs_per_step
        for m in models:
            m.epochs_per_step = epochs_per_step
        self.automatic_optimization = False
        self.init_progress()

    @property
    def epochs_done(self) -> int:
        """Full-batch GD updates so far, = ``global_step``."""
        return self.global_step

    # -- member-parallel: the models' members e share a rank -------------------------------------
    def n_members(self) -> int:
        Es = [m.ensemble for m in self.models]
        if len(set(Es)) > 1:
            raise ValueError(f"Comparison: the models' ensembles are {dict(zip(self.names, Es))}; training across "
                             "processes (strategy 'ddp') shares members out and needs one ensemble size for every "
                             "model; allowed: equal ensembles, or one process (devices = 1, strategy 'auto')")
        return Es[0]

    def member_tensor_names(self) -> list[str]:
        return [f"models.{i}.{k}" for i, m in enumerate(self.models) for k in m.member_tensor_names()]

    def _share_range(self) -> None:
        # each model slices its own per-member data (XoR margins, per-member gates) by it
        for m in self.models:
            m.member_range = self.member_range

    def keep_members(self, lo: int, hi: int) -> None:
        super().keep_members(lo, hi)
        self._share_range()

    def show_all_members(self) -> Callable[[], None]:
        back = super().show_all_members()
        for m in self.models:
            m.member_range = None

        def restore() -> None:
            back()
            self._share_range()
        return restore

    def on_all_members_back(self) -> None:
        self._share_range()

    def networks(self) -> dict[str, FullBatchNet]:
        return dict(zip(self.names, self.models))

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule
        for m in self.models:
            if not m.built:
                m.attach(dm)
                m.build(dm.X, dm.Y)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        # Lightning calls these hooks on the top module only: each model keeps what it saves (a GDLN's gates)
        for i, m in enumerate(self.models):
            sub: dict = {}
            m.on_save_checkpoint(sub)
            checkpoint[f"comparison_model{i}"] = sub

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        for i, m in enumerate(self.models):
            prefix = f"models.{i}."
            state = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
            m.on_load_checkpoint({**checkpoint.get(f"comparison_model{i}", {}), "state_dict": state})

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict:
        x, y = batch
        first_epoch, n = self.global_step, updates_this_step(self, self.epochs_per_step)
        # in lockstep: one optimizer step updates every model (each in its own parameter group),
        # counted in global_step (zoo.training.steps)
        updates = Updates(self)
        step = epoch_update(self, updates, n)
        epochs = [m._prepared_fast_epoch(*m._cast(x, y)) for m in self.models]
        if all(e is not None for e in epochs):  # one loop, the losses a block of epochs at a time (zoo.kernels.gdln)
            with torch.no_grad(), scoped_threads(self.models[0].threads(x)):
                all_losses = [L.view(n, -1) for L in run_together(epochs, [list(m.W) for m in self.models], n, step)]
        else:
            all_losses = descend([m.gradient_fn(x, y) for m in self.models], n, step, self.models[0].threads(x))
        updates.finish()
        if self.member_range is not None:  # every model's members, gathered in one collective
            all_losses = list(self.all_member_values(torch.stack(all_losses), dim=2))
        self.count_samples(n * y.shape[-2])
        # one host sync for all models, the same decision on every rank
        check_finite(torch.cat([losses[-1] for losses in all_losses]), step=first_epoch + n - 1,
                     labels=[f"{name}/{lbl}" for name, m in zip(self.names, self.models) for lbl in m.labels],
                     hint="lr = " + ", ".join(f"{m.lr} ({name})" for name, m in zip(self.names, self.models))
                     + " is probably too large for this task; try lr / 10.")
        out, first = {}, {}
        for name, losses in zip(self.names, all_losses):
            out[name], first[f"loss/{name}"] = losses.detach().T, losses[0]
        log_batch_scalars(self, first_epoch, first, prog_bar=False)  # each model's loss, as a FullBatchNet's
        return {"loss": sum(l[:, 0].sum() for l in out.values()), "epoch_loss": out, "first_epoch": first_epoch}

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        for name, m in zip(self.names, self.models):
            metric = m.evaluate(batch, m.val_mse if stage == "val" else m.test_mse)
            self.log(f"{stage}/mse/{name}", metric, on_epoch=True, on_step=False)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> GradientDescent:
        return GradientDescent([{"params": m.parameters(), "lr": m.lr} for m in self.models], lr=self.models[0].lr)
