"""The fast path of full-batch training ([H] App. H sizes: an epoch is a few small matrix products).

An epoch of the three-context ReLU net (24 points, 700 hidden units) is ~10 tensor operations of
10-40 microseconds; what surrounds them decides the speed. Two pieces remove most of it:

``GradientDescent``: plain gradient descent ``W <- W - lr W.grad`` as a minimal optimizer. The
networks take one optimizer step per epoch (applied directly and counted in ``global_step`` by
``zoo.steps.Updates``), so the step's own cost is paid 8,000 times in an 8,000-epoch run. ``torch.optim.SGD`` adds ~25 us per
call of machinery (profiler hooks, foreach dispatch, momentum bookkeeping) to an update of ~5 us;
this class does the same update (``W.sub_(W.grad, alpha=lr)``: SGD without momentum, weight decay
or dampening, to the bit) and nothing else. It satisfies Lightning's ``Optimizable`` protocol and
reads the state dict of a plain SGD (a checkpoint written before it existed).

``TwoLayerEpoch``: one epoch of a one-hidden-layer gated network (a ReLU net or a GDLN, [H] Eqs.
1-2) by the hand-written gradients, the same operations in the same order as
``FullBatchNet._grads``, written into tensors allocated at the first epoch and reused (``out=`` and
in-place variants of the same kernels: the same bits, tested in tests/test_gdln_fast_path.py).
``run_together`` takes a chunk of epochs (of one network, or of several in lockstep) in one loop and
computes their losses 32 epochs at a time from the kept output errors.

Where the time goes (the [H] App. H ReLU net, 24 points x 700 units x 60 outputs, one thread, AMD
EPYC with MKL, 2026-11-26): three ~1M multiply-add products an epoch (output, its weight gradient,
backpropagation to the hidden layer) take ~25-34 us each, 60-80 GFLOP/s against ~95 GFLOP/s of a
large square sgemm; they are ~85 us of an epoch of ~130 us. The other orientations of each product
(transposed operands or results, contiguous copies of transposed weights) and oneDNN's matmul are
slower; an update fused into its product (``addmm`` into W) saves ~5% but rounds differently, and
a ReLU net's training amplifies that (bench/bench_gdln.py's notes).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

_threshold_backward = torch.ops.aten.threshold_backward.grad_input


class GradientDescent:
    """Plain full-batch gradient descent ``W <- W - lr W.grad``, one group of parameters per
    learning rate (``params``: tensors, or dicts ``{"params": [...], "lr": ...}`` as for torch's
    optimizers). Parameters whose ``grad`` is None are left alone (as SGD leaves them)."""

    def __init__(self, params: Iterable, lr: float) -> None:
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        self.defaults = {"lr": lr}
        self.param_groups = [{"params": list(g["params"]), "lr": g.get("lr", lr)} for g in groups]
        self.state: dict = {}

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        if torch.is_grad_enabled():  # an in-place update of a leaf; the networks step under no_grad already
            with torch.no_grad():
                self._update()
        else:
            self._update()
        return loss

    def _update(self) -> None:
        for group in self.param_groups:
            lr = group["lr"]
            for W in group["params"]:
                if W.grad is not None:
                    W.sub_(W.grad, alpha=lr)

    @staticmethod
    def stepped_directly(updates) -> "GradientDescent | None":
        """The optimizer whose own ``step`` ``updates`` (a ``zoo.steps.Updates``) applies without
        Lightning's (``updates.direct``: no hook expects each update), where it is exactly this class;
        else None. Only then may a module write the update ``W -= lr W.grad`` into its own loop
        (``update_fn``, ``rates``) and count the updates itself."""
        opt = getattr(updates.step, "__self__", None)
        if updates.direct and type(opt) is GradientDescent and getattr(updates.step, "__func__", None) is GradientDescent.step:
            return opt
        return None

    def rates(self, params: list[Tensor]) -> list[float] | None:
        """Each of ``params``' learning rates, where the groups hold exactly ``params``; else None."""
        rates = {id(W): g["lr"] for g in self.param_groups for W in g["params"]}
        if len(rates) != len(params) or any(id(W) not in rates for W in params):
            return None
        return [rates[id(W)] for W in params]

    def update_fn(self) -> "PlainUpdate":
        """``step()`` without a closure, for a caller already under ``no_grad`` (``run_epochs``): the
        same update with the parameters and learning rates read once, ~1 us less per call. Valid
        while the groups' learning rates stay as they are (one training batch)."""
        return PlainUpdate([(W, group["lr"]) for group in self.param_groups for W in group["params"]])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for W in group["params"]:
                if set_to_none:
                    W.grad = None
                elif W.grad is not None:
                    W.grad.zero_()

    def state_dict(self) -> dict:
        """As torch's optimizers write it: no per-parameter state, the groups' lr and parameter indices."""
        groups, i = [], 0
        for g in self.param_groups:
            groups.append({"lr": g["lr"], "params": list(range(i, i + len(g["params"])))})
            i += len(g["params"])
        return {"state": {}, "param_groups": groups}

    def load_state_dict(self, state: dict) -> None:
        """The groups' learning rates from ``state`` (this class's, or a plain SGD's: momentum,
        weight decay and dampening 0, which is what these networks were trained with)."""
        groups = state["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(groups, self.param_groups)):
            raise ValueError("GradientDescent: the saved optimizer state has other parameter groups than this module")
        for s in groups:
            if any(s.get(k) for k in ("momentum", "weight_decay", "dampening", "nesterov", "maximize")):
                raise ValueError("GradientDescent: the saved optimizer state is SGD with momentum, weight decay, "
                                 "dampening, nesterov or maximize; plain gradient descent cannot continue it")
        for s, g in zip(groups, self.param_groups):
            g["lr"] = s["lr"]

    def __repr__(self) -> str:
        return f"GradientDescent(lr={[g['lr'] for g in self.param_groups]})"


class PlainUpdate:
    """The update ``W <- W - lr W.grad`` of fixed (W, lr) pairs (parameters whose ``grad`` is None
    are left alone), called once per epoch under ``no_grad``. Knowing it is exactly this update,
    ``run_together`` may apply it inside each network's epoch instead (``TwoLayerEpoch.updating``:
    the same operations on the same values, so the same bits)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[Tensor, float]]) -> None:
        self.pairs = pairs

    def __call__(self) -> None:
        for W, lr in self.pairs:
            if W.grad is not None:
                W.sub_(W.grad, alpha=lr)

    def rates(self, params: list[Tensor]) -> list[float] | None:
        """Each of ``params``' learning rates, where this update covers every one of them; else None."""
        rates = {id(W): lr for W, lr in self.pairs}
        return [rates[id(W)] for W in params] if all(id(W) in rates for W in params) else None


class TwoLayerEpoch:
    """The loss gradients of a one-hidden-layer gated network on the full batch, into reused tensors.

    ``gates``: None for a ReLU net (the gate is ``step(pre)``, backpropagated through
    ``threshold_backward`` on the hidden activity), else the fixed node gates per unit (N, H) or
    (E, N, H) of a GDLN. ``mask``: the GDLN's input mask per unit (H, n_in) or None. ``scale``:
    1 (summed loss) or 1/N (mean). ``Ws`` are the weights' data (read every call: they change in
    place). Calling it returns the loss (E,) or () before the update and the two gradients,
    the same operations in the same order as ``FullBatchNet._grads`` (so the same bits).
    ``run_together`` takes many epochs in one loop and computes their losses a block at a time."""

    #: epochs whose output errors ``run_together`` keeps until their losses are computed together
    #: (one pow-sum-scale over the block instead of three small operations an epoch, ~5% of an epoch
    #: of the [H] App. H ReLU net; the block stays in the L2 cache)
    BLOCK = 32

    def __init__(self, x: Tensor, y: Tensor, Ws: list[Tensor], gates: Tensor | None, mask: Tensor | None,
                 scale: float) -> None:
        self.x, self.y, self.Ws, self.gates, self.mask, self.scale = x, y, Ws, gates, mask, scale
        self.half_scale = 0.5 * scale
        # transposed views made once (the weights change in place); mm where nothing is batched.
        # x^T is copied contiguous: BLAS reads it ~10% faster, to the same bits
        self.xT = x.transpose(-1, -2).contiguous()
        self.WT = [W.transpose(-1, -2) for W in Ws]
        self.matmul = torch.mm if x.dim() == 2 and all(W.dim() == 2 for W in Ws) else torch.matmul
        # zoo.gdln._outer's orientation, (act^T delta)^T where delta is the wider: for both gradients
        H = Ws[0].shape[-2]
        self.flip1, self.flip0 = y.shape[-1] > H, H > x.shape[-1]
        self.W0T: Tensor | None = None  # W0's transposed working copy while ``updating`` trains it
        # every intermediate: empty until the first epoch sizes it (out= resizes an empty tensor)
        self.W0m, self.pre, self.out, self.sq, self.g1, self.delta, self.g0, self.g0m = (x.new_empty(0) for _ in range(8))
        # the members' axes of the loss (the output errors are (*batch, N, n_out))
        self.batch = torch.broadcast_shapes(x.shape[:-2], Ws[0].shape[:-2], Ws[1].shape[:-2], y.shape[:-2],
                                            gates.shape[:-2] if gates is not None else ())

    def __call__(self) -> tuple[Tensor, list[Tensor]]:
        err, grads = self.gradients(self.out)
        loss = torch.pow(err, 2, out=self.sq).sum((-1, -2)).mul_(self.half_scale)
        return loss, grads

    def gradients(self, out: Tensor) -> tuple[Tensor, list[Tensor]]:
        """One epoch's output errors (written into ``out``) and the two weight gradients."""
        mask, scale = self.mask, self.scale
        W0T = self.WT[0] if mask is None else torch.mul(self.Ws[0], mask, out=self.W0m).transpose(-1, -2)
        err, g1, delta = self._backprop(W0T, out)
        if self.flip0:
            g0 = self.matmul(self.xT, delta, out=self.g0).transpose(-1, -2)
        else:
            g0 = self.matmul(delta.transpose(-1, -2), self.x, out=self.g0)
        if scale != 1.0:
            g0.mul_(scale)
        if mask is not None:
            g0 = torch.mul(g0, mask, out=self.g0m)
        return err, [g0, g1]

    def _backprop(self, W0T: Tensor, out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The output errors (into ``out``), W1's gradient and the error at the hidden layer's
        pre-activations, given the (masked) input weights as (..., n_in, H)."""
        matmul, gates, scale = self.matmul, self.gates, self.scale
        h = matmul(self.x, W0T, out=self.pre)
        h = h.relu_() if gates is None else h.mul_(gates)
        err = matmul(h, self.WT[1], out=out).sub_(self.y)
        if self.flip1:
            g1 = matmul(h.transpose(-1, -2), err, out=self.g1).transpose(-1, -2)
        else:
            g1 = matmul(err.transpose(-1, -2), h, out=self.g1)
        if scale != 1.0:
            g1.mul_(scale)
        delta = matmul(err, self.Ws[1], out=self.delta)
        if gates is None:
            _threshold_backward(delta, h, 0.0, grad_input=delta)
        else:
            delta.mul_(gates)
        return err, g1, delta

    def updating(self, rates: list[float]) -> Callable[[Tensor], tuple[Tensor, list[Tensor]]]:
        """``gradients`` followed by the epoch's own update ``W <- W - rate g`` (``rates``: W0's and
        W1's), for ``run_together`` where its step is exactly that update (``PlainUpdate``): the
        same operations on the same values, so the same bits. Where W0's gradient is a transposed
        product (``flip0``, H > n_in), W0 lives on a contiguous transposed working copy for the
        chunk: its update then reads the gradient as it lies (~5% of an epoch of the [H] App. H
        ReLU net, whose update of the (700 x 11) weights from the (11 x 700) product read it
        across), and the forward product reads the copy as it read the transposed view. ``settle``
        writes the copy back into W0."""
        lr0, lr1 = rates
        W0, W1 = self.Ws
        if not self.flip0:
            def in_place(out: Tensor) -> tuple[Tensor, list[Tensor]]:
                err, (g0, g1) = grads = self.gradients(out)
                W1.sub_(g1, alpha=lr1)
                W0.sub_(g0, alpha=lr0)
                return grads
            return in_place
        mask, scale, x = self.mask, self.scale, self.x
        self.W0T = W0T = W0.transpose(-1, -2).contiguous()
        maskT = mask.transpose(-1, -2).contiguous() if mask is not None else None
        W0mT, g0T, g0mT = (x.new_empty(0) for _ in range(3))

        def transposed(out: Tensor) -> tuple[Tensor, list[Tensor]]:
            err, g1, delta = self._backprop(W0T if maskT is None else torch.mul(W0T, maskT, out=W0mT), out)
            g0 = self.matmul(self.xT, delta, out=g0T)
            if scale != 1.0:
                g0.mul_(scale)
            if maskT is not None:
                g0 = torch.mul(g0, maskT, out=g0mT)
            W1.sub_(g1, alpha=lr1)
            W0T.sub_(g0, alpha=lr0)
            return err, [g0.transpose(-1, -2), g1]
        return transposed

    def settle(self) -> None:
        """W0 from the working copy ``updating`` trained, where it made one."""
        if self.W0T is not None:
            self.Ws[0].copy_(self.W0T.transpose(-1, -2))
            self.W0T = None


def run_together(epochs: list[TwoLayerEpoch], params: list[list[Tensor]], n: int, step: Callable[[], object]) -> list[Tensor]:
    """``n`` epochs of several networks in lockstep (``zoo.gdln.Comparison``): every network's
    gradients into its ``params``' ``grad``, then one ``step()`` for all; where ``step`` is the plain
    update of every network's weights (``PlainUpdate``), each network applies it inside its epoch
    (``TwoLayerEpoch.updating``, the same bits; the networks are independent, so the order does
    not matter). Each network's losses, (n, *batch), computed a block of epochs at a time from
    the kept output errors."""
    block = min(n, TwoLayerEpoch.BLOCK)
    rates = [step.rates(ps) for ps in params] if isinstance(step, PlainUpdate) else [None]
    own = all(r is not None for r in rates)
    fns = [e.updating(r) for e, r in zip(epochs, rates)] if own else [e.gradients for e in epochs]
    # the output errors of a block of epochs, one view per epoch made once
    errs = [e.x.new_empty((block, *e.batch, e.x.shape[-2], e.y.shape[-1])) for e in epochs]
    work = [(fn, err_block.unbind(0)) for fn, err_block in zip(fns, errs)]
    losses = [e.x.new_empty((n, *e.batch)) for e in epochs]
    unset = True
    try:
        for start in range(0, n, block):
            m = min(block, n - start)
            for i in range(m):
                if unset:  # the gradient tensors are the same every epoch
                    for (fn, views), ps in zip(work, params):
                        for W, g in zip(ps, fn(views[i])[1]):
                            W.grad = g.view(W.shape)
                    unset = False
                else:
                    for fn, views in work:
                        fn(views[i])
                if not own:
                    step()
            # the block's losses: the same pow, sum and scale per epoch as TwoLayerEpoch.__call__'s
            for e, err_block, L in zip(epochs, errs, losses):
                torch.sum(err_block[:m].pow_(2), (-1, -2), out=L[start:start + m])
                L[start:start + m].mul_(e.half_scale)
    finally:
        for e in epochs:
            e.settle()
    return losses
