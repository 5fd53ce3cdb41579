"""The fast path of full-batch training ([H] App. H sizes: an epoch is a few small matrix products).

An epoch of the three-context ReLU net (24 points, 700 hidden units) is ~10 tensor operations of
10-40 microseconds; what surrounds them decides the speed. Two pieces remove most of it:

``GradientDescent``: plain gradient descent ``W <- W - lr W.grad`` as a minimal optimizer. The
networks take one optimizer step per epoch (applied directly and counted in ``global_step`` by
``zoo.training.steps.Updates``), so the step's own cost is paid 8,000 times in an 8,000-epoch run. ``torch.optim.SGD`` adds ~25 us per
call of machinery (profiler hooks, foreach dispatch, momentum bookkeeping) to an update of ~5 us;
this class does the same update (``W.sub_(W.grad, alpha=lr)``: SGD without momentum, weight decay
or dampening, to the bit) and nothing else. It satisfies Lightning's ``Optimizable`` protocol and
reads the state dict of a plain SGD (a checkpoint written before it existed).

``TwoLayerEpoch``: one epoch of a one-hidden-layer gated network (a ReLU net or a GDLN, [H] Eqs.
1-2) by the hand-written gradients, the same operations in the same order as
``FullBatchNet._grads``, written into tensors allocated at the first epoch and reused (``out=`` and
in-place variants of the same kernels: the same bits, tested in tests/models/test_gdln_fast_path.py).
``run_together`` takes a chunk of epochs (of one network, or of several in lockstep) in one loop and
computes their losses 32 epochs at a time from the kept output errors. Where the chunk's step is
the plain update (``PlainUpdate``: what ``GradientDescent`` applies when Lightning lets it, and
``run_epochs``' default), each epoch applies it itself (``TwoLayerEpoch.updating``) on working
copies of the weights, W0 laid out as its gradient's product leaves it, both in one buffer and
both gradients in another: one update pass, no strided read, every transposed view made once.
Plain torch throughout: each epoch is ~9-13 kernel calls from Python with every operand bound
before the loop (the relu backward through its operator overload, ~2 us a call, not the operator
packet's ~6).

Why not TorchScript or ``torch.compile`` (2026-12-04, one thread, CPU s, interleaved rounds on a
machine loaded by other work, bench/bench_gdln.py): until then a block of epochs was one call of a
TorchScript function (``torch.jit.script``, deprecated in torch 2.x); the same loop in plain torch
is ~5-8% slower than TorchScript's interpreter (~0.5 us of dispatch an operation against ~1 us,
8,000 epochs of the ReLU net 0.92 against 0.85 s) and on par with the bench's hand-written plain
loop (1.01x); the zoo's own TorchScript block as it was (``torch.matmul`` throughout) took 1.10 s,
this loop 0.93 in the same rounds, to the same bits. ``torch.compile`` (inductor, default mode) of a block of 8 epochs took 17.6 s to
compile and ran ~115 us an epoch (the same epochs eager into fresh tensors ~130, this loop ~116 in
the same session), rounding otherwise (the ReLU net's input weights 17% of their largest entry
apart after 8,000 epochs): nothing to repay its compile time in a run of ~1 s, and it would break
the frozen bits, so it is not used.

Where the time goes (the [H] App. H ReLU net, 24 points x 700 units x 60 outputs, one thread, AMD
EPYC with MKL, 2026-11-26): three ~1M multiply-add products an epoch (output, its weight gradient,
backpropagation to the hidden layer) take ~25-31 us each, 60-80 GFLOP/s against ~95 GFLOP/s of a
large square sgemm; with the two input-side products (~7 us each) they are ~95 us of an epoch of
~100 us (torch.profiler: ``aten::mm`` 87% of the time). The rest is relu and its backward (~1 and
~3 us), the update pass (~4 us) and the dispatch of ~10 tensor operations (~7 us an epoch at a
tiny width from TorchScript, ~11 us from Python as it was then). Before round 25 the update of the (700 x 11)
input weights from the transposed (11 x 700) product took ~6 us (a strided read), a separate pass
for each weight, a transposed view made each epoch and Python's dispatch another ~8 us: 8,000
epochs of ``run_epochs`` took ~1.03 s, now ~0.87 s (CPU s, load ~2). The other orientations of each product and oneDNN's matmul are
slower; an update fused into its product (``addmm`` into W) rounds differently (MKL adds W into
its accumulation) and a ReLU net's training amplifies that (bench/bench_gdln.py's notes).
"""
from __future__ import annotations

import math
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
        """The optimizer whose own ``step`` ``updates`` (a ``zoo.training.steps.Updates``) applies without
        Lightning's (``updates.direct``: no hook expects each update), where it is exactly this class;
        else None. Only then may a module write the update ``W -= lr W.grad`` into its own loop
        (``update_fn``, ``rates``) and count the updates itself."""
        opt = getattr(updates.step, "__self__", None)
        if updates.direct and type(opt) is GradientDescent and getattr(updates.step, "__func__", None) is GradientDescent.step:
            return opt
        return None

    def rates(self, params: list[Tensor]) -> list[float] | None:
        """Each of ``params``' learning rates, where the groups hold exactly ``params``; else None."""
        pairs = [(W, g["lr"]) for g in self.param_groups for W in g["params"]]
        return rates_of(pairs, params) if len(pairs) == len(params) else None

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
        return rates_of(self.pairs, params)


def rates_of(pairs: list[tuple[Tensor, float]], params: list[Tensor]) -> list[float] | None:
    """The learning rate of each of ``params`` in ``pairs`` (parameter, rate), where every one has
    one; else None."""
    rates = {id(W): lr for W, lr in pairs}
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
        # zoo.models.gdln._outer's orientation, (act^T delta)^T where delta is the wider: for both gradients
        H = Ws[0].shape[-2]
        self.flip1, self.flip0 = y.shape[-1] > H, H > x.shape[-1]
        # W0's input mask as (n_in, H), the layout the products read W0 in where flip0
        self.maskT = mask.transpose(-1, -2).contiguous() if mask is not None and self.flip0 else None
        self.copies: list[tuple[Tensor, Tensor, bool]] = []  # (weight, its working copy, transposed) while ``updating`` trains
        # every intermediate: empty until the first epoch sizes it (out= resizes an empty tensor)
        self.W0m, self.pre, self.out, self.sq, self.g1, self.delta, self.g0, self.g0m = (x.new_empty(0) for _ in range(8))
        if self.flip0:  # (masked) W0 copied as (n_in, H) every epoch: sized now, copy_ does not resize
            self.W0m = Ws[0].new_empty(self.WT[0].shape)
        # the members' axes of the loss (the output errors are (*batch, N, n_out))
        self.batch = torch.broadcast_shapes(x.shape[:-2], Ws[0].shape[:-2], Ws[1].shape[:-2], y.shape[:-2],
                                            gates.shape[:-2] if gates is not None else ())

    def __call__(self) -> tuple[Tensor, list[Tensor]]:
        err, grads = self.gradients(self.out)
        loss = torch.pow(err, 2, out=self.sq).sum((-1, -2)).mul_(self.half_scale)
        return loss, grads

    def gradients(self, out: Tensor) -> tuple[Tensor, list[Tensor]]:
        """One epoch's output errors (written into ``out``) and the two weight gradients."""
        matmul, gates, mask, scale = self.matmul, self.gates, self.mask, self.scale
        W1 = self.Ws[1]
        W0T, W1T = self.WT
        # where flip0, W0 copied as (n_in, H), as ``updating``'s working copy lies: the same product
        # on the same layouts, so both paths give the same bits (the generic ``_grads`` reads a
        # transposed view: MKL gives it the same bits at these sizes, tests/models/test_gdln_fast_path.py)
        if self.flip0:
            W0T = torch.mul(W0T, self.maskT, out=self.W0m) if mask is not None else self.W0m.copy_(W0T)
        elif mask is not None:
            W0T = torch.mul(self.Ws[0], mask, out=self.W0m).transpose(-1, -2)
        h = matmul(self.x, W0T, out=self.pre)
        h = h.relu_() if gates is None else h.mul_(gates)
        err = matmul(h, W1T, out=out).sub_(self.y)
        if self.flip1:
            g1 = matmul(h.transpose(-1, -2), err, out=self.g1).transpose(-1, -2)
        else:
            g1 = matmul(err.transpose(-1, -2), h, out=self.g1)
        if scale != 1.0:
            g1.mul_(scale)
        delta = matmul(err, W1, out=self.delta)
        if gates is None:
            _threshold_backward(delta, h, 0.0, grad_input=delta)
        else:
            delta.mul_(gates)
        g0 = matmul(self.xT, delta, out=self.g0).transpose(-1, -2) if self.flip0 else matmul(delta.transpose(-1, -2), self.x, out=self.g0)
        if scale != 1.0:
            g0.mul_(scale)
        if mask is not None:
            g0 = torch.mul(g0, mask, out=self.g0m)
        return err, [g0, g1]

    def updating(self, rates: list[float], outs: list[Tensor]) -> tuple[Callable[[int], None], list[Tensor]]:
        """Epochs as ``gradients`` computes them, each followed by its own update ``W <- W - rate g``
        (``rates``: W0's and W1's), for ``run_together`` where its step is exactly that update
        (``PlainUpdate``): the same operations on the same values, so the same bits. ``outs``: the
        output errors' buffers of a block of epochs. Returns ``run(m)``, which trains m epochs
        writing ``outs[:m]``, and the gradients as the weights are shaped (the tensors every epoch
        writes).

        For the chunk, the weights live on working copies, W0 laid out as its gradient's product
        leaves it ((n_in, H) where ``flip0``, as ``gradients`` reads it too), in one buffer, and
        both gradients in another: the update reads the gradients as they lie, in one pass where
        the rates agree and W1's gradient is not transposed (the [H] App. H ReLU net's (700 x 11)
        input weights were updated from an (11 x 700) product read across, ~5% of an epoch), and
        every transposed view is made once, not each epoch (~1 us each). ``run`` is plain torch:
        the kernels of ``gradients`` called from Python with every operand bound beforehand.
        ``settle`` writes the copies back into the weights."""
        gates, mask, x, y = self.gates, self.mask, self.x, self.y
        W0, W1 = self.Ws
        N, H = x.shape[-2], W0.shape[-2]
        flip0, flip1 = self.flip0, self.flip1
        # [W0 | W1] and [g0 | g1], W0 and g0 as (n_in, H) where flip0, W1 as it is
        shapes = [W0.transpose(-1, -2).shape if flip0 else W0.shape, W1.shape]
        sizes = [math.prod(s) for s in shapes]
        W_all, g_all = W0.new_empty(sum(sizes)), W0.new_empty(sum(sizes))
        W0c, W1c = (b.view(s) for b, s in zip(W_all.split(sizes), shapes))
        g0c, g1c = (b.view(s) for b, s in zip(g_all.split(sizes), shapes))
        W0c.copy_(self.WT[0] if flip0 else W0)
        W1c.copy_(W1)
        self.copies = [(W0, W0c, flip0), (W1, W1c, False)]
        # every operand and result as the products of ``gradients`` see them, views made once
        mask_c = (self.maskT if flip0 else mask) if mask is not None else None
        W0m = W0.new_empty(shapes[0]) if mask is not None else W0c
        pre, delta = x.new_empty((*self.batch, N, H)), x.new_empty((*self.batch, N, H))
        g1 = x.new_empty((*self.batch, H, y.shape[-1])) if flip1 else g1c
        g0 = x.new_empty(shapes[0]) if mask is not None else g0c
        g1_update = g1.transpose(-1, -2) if flip1 else g1c  # W1's gradient as W1 lies
        lr0, lr1 = rates
        one_pass = lr0 == lr1 and not flip1
        # every operand of the loop bound once: each epoch is the dispatch of its ~9-13 kernels and
        # nothing else (branches decided here, no attribute read, no view made)
        matmul, mul, relu, scaled, scale = self.matmul, torch.mul, gates is None, self.scale != 1.0, self.scale
        x_in, W0_in, W1T, a0, b0 = (x, W0m if flip0 else W0m.transpose(-1, -2), W1c.transpose(-1, -2),
                                    self.xT if flip0 else delta.transpose(-1, -2), delta if flip0 else x)
        g1_operands = [(pre.transpose(-1, -2), out) if flip1 else (out.transpose(-1, -2), pre) for out in outs]

        def run(m: int) -> None:
            # the operations of ``gradients`` in its order on the working copies, then the update
            for out, (a1, b1) in zip(outs[:m], g1_operands[:m]):
                if mask_c is not None:
                    mul(W0c, mask_c, out=W0m)
                h = matmul(x_in, W0_in, out=pre)
                if relu:
                    h.relu_()
                else:
                    h.mul_(gates)
                err = matmul(h, W1T, out=out).sub_(y)
                matmul(a1, b1, out=g1)
                if scaled:
                    g1.mul_(scale)
                matmul(err, W1c, out=delta)
                if relu:
                    _threshold_backward(delta, h, 0.0, grad_input=delta)
                else:
                    delta.mul_(gates)
                matmul(a0, b0, out=g0)
                if scaled:
                    g0.mul_(scale)
                if mask_c is not None:
                    mul(g0, mask_c, out=g0c)
                if one_pass:
                    W_all.sub_(g_all, alpha=lr0)
                else:
                    W0c.sub_(g0c, alpha=lr0)
                    W1c.sub_(g1_update, alpha=lr1)
        return run, [g0c.transpose(-1, -2) if flip0 else g0c, g1_update]

    def settle(self) -> None:
        """The weights from the working copies ``updating`` trained, where it made them."""
        for W, c, flip in self.copies:
            W.copy_(c.transpose(-1, -2) if flip else c)
        self.copies = []


def run_together(epochs: list[TwoLayerEpoch], params: list[list[Tensor]], n: int, step: Callable[[], object]) -> list[Tensor]:
    """``n`` epochs of several networks in lockstep (``zoo.models.gdln.Comparison``): every network's
    gradients into its ``params``' ``grad``, then one ``step()`` for all; where ``step`` is the plain
    update of every network's weights (``PlainUpdate``), each network applies it inside its epoch
    (``TwoLayerEpoch.updating``, the same bits; the networks are independent, so the order does
    not matter). Each network's losses, (n, *batch), computed a block of epochs at a time from
    the kept output errors."""
    block = min(n, TwoLayerEpoch.BLOCK)
    # the output errors of a block of epochs, one view per epoch made once
    errs = [e.x.new_empty((block, *e.batch, e.x.shape[-2], e.y.shape[-1])) for e in epochs]
    views = [err_block.unbind(0) for err_block in errs]
    losses = [e.x.new_empty((n, *e.batch)) for e in epochs]
    rates = [step.rates(ps) for ps in params] if isinstance(step, PlainUpdate) else [None]
    own = all(r is not None for r in rates)
    try:
        runs = []
        if own:
            for e, r, ps, vs in zip(epochs, rates, params, views):
                run, grads = e.updating(r, vs)
                for W, g in zip(ps, grads):  # the last epoch's gradients once the loop ends
                    W.grad = g.view(W.shape)
                runs.append(run)
        work = [(e.gradients, vs) for e, vs in zip(epochs, views)]
        unset = True
        for start in range(0, n, block):
            m = min(block, n - start)
            for run in runs:  # a block of epochs a call; in lockstep the networks are independent
                run(m)
            for i in range(0 if own else m):
                if unset:  # the gradient tensors are the same every epoch
                    for (gradients, vs), ps in zip(work, params):
                        for W, g in zip(ps, gradients(vs[i])[1]):
                            W.grad = g.view(W.shape)
                    unset = False
                else:
                    for gradients, vs in work:
                        gradients(vs[i])
                step()
            # the block's losses: the same pow, sum and scale per epoch as TwoLayerEpoch.__call__'s
            for e, err_block, L in zip(epochs, errs, losses):
                torch.sum(err_block[:m].pow_(2), (-1, -2), out=L[start:start + m])
                L[start:start + m].mul_(e.half_scale)
    finally:
        for e in epochs:
            e.settle()
    return losses
