"""The fully connected networks of several models as one computation: each layer's weights stacked
over the models, batched matrix products (issue #21: a ``BetaVAESweep`` steps its members together).

The members keep their own ``nn.Linear`` parameters (checkpoints, member-parallel ownership and the
callbacks see separate models); a step reads them stacked (:class:`SharedStacks`: the parameters
are views into one tensor per layer; under data-parallel DDP :func:`stacked_layers`' copies), and
each member gets its own slice of the gradient, so the arithmetic per member is the member's own
``Linear`` chain ([S] App. D's deep fully connected encoder and decoder) with its matrix products
batched (``torch.baddbmm``): equal to the member's up to float summation order. Adam steps the
stacks too (:class:`StackedAdam`).

The first layer of an encoder reads the same images for every member: they enter the batched
product broadcast over the members (a stride-0 batch, no copy). Measured on a 1-thread CPU
(issue #21), this is faster than one product with the E weight matrices concatenated into one
``(E * H, D)`` matrix: the weight gradient comes out as E blocks that each stay in cache.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.optim.adam import adam as functional_adam  # Adam.step's computation (public: in its __all__)


def _linears(nets: Sequence[nn.Sequential]) -> list[tuple[nn.Linear, ...]]:
    """The linear layers of ``nets`` (same architecture), layer by layer, one per net."""
    return list(zip(*[[m for m in net if isinstance(m, nn.Linear)] for net in nets]))


def stacked_layers(nets: Sequence[nn.Sequential]) -> list[tuple[Tensor, Tensor]]:
    """``(W, b)`` of every linear layer of ``nets`` (same architecture), stacked over the nets:
    ``W`` (E, out, in), ``b`` (E, out); copies, differentiable to each net's parameters."""
    return [(torch.stack([m.weight for m in layer]), torch.stack([m.bias for m in layer]))
            for layer in _linears(nets)]


class SharedStacks:
    """The linear layers of E nets (same architecture) whose parameters are views into one tensor
    per layer and kind (``W`` (E, out, in), ``b`` (E, out)), so that a step reads the stack without
    copying it (:func:`stacked_layers` copies every weight, forward, and every gradient, backward).

    Each net keeps its own ``nn.Parameter`` objects (optimizer state, checkpoints, member-parallel
    broadcasts in place are unchanged); only their ``.data`` points into the stack. A device or
    dtype move gives a parameter new storage: :meth:`leaves` notices and stacks again (one copy).
    The gradients of :meth:`leaves` go to the nets' parameters as views of the stacked gradient
    (a hook), added to a ``.grad`` already there (gradient accumulation); ``grads[j]`` refers
    (weakly) to the stacked gradient of ``params[j]`` and the views handed out (:class:`StackedAdam`
    reads it while every net's gradient is still that view). Leaves do not go through the parameters'
    autograd hooks: a module wrapped in ``DistributedDataParallel`` must use :func:`stacked_layers`.
    """

    def __init__(self, nets: Sequence[nn.Sequential]) -> None:
        self.params = [group for layer in _linears(nets)
                       for group in ([m.weight for m in layer], [m.bias for m in layer])]
        self.stacks: list[Tensor] = []
        # weak: the views keep the stacked gradient alive, and once the parameters drop their
        # gradients (zero_grad) it is freed, not held until the next backward
        self.grads: list[tuple[weakref.ref, list[weakref.ref]] | None] = [None] * len(self.params)

    def _shared(self) -> bool:
        # a move gives every parameter new storage; the stacks keep theirs, so no address is reused
        return len(self.stacks) == len(self.params) and all(
            group[0].dtype == s.dtype and group[0].device == s.device
            and all(p.data_ptr() == at for p, at in zip(group, addresses))
            for group, s, addresses in zip(self.params, self.stacks, self._addresses))

    def _share(self) -> None:
        self.stacks, self._addresses = [], []
        for group in self.params:
            stack = torch.stack([p.detach() for p in group])
            for p, view in zip(group, stack):
                p.data = view
            self.stacks.append(stack)
            self._addresses.append([p.data_ptr() for p in group])

    def leaves(self, lo: int, hi: int) -> list[tuple[Tensor, Tensor]]:
        """``(W, b)`` of nets ``lo:hi``, layer by layer, as leaves sharing the parameters' storage."""
        if not self._shared():
            self._share()
        out = [self._leaf(j, lo, hi) for j in range(len(self.params))]
        return list(zip(out[0::2], out[1::2]))

    def _leaf(self, j: int, lo: int, hi: int) -> Tensor:
        leaf = self.stacks[j][lo:hi].detach().requires_grad_()
        params, whole = self.params[j][lo:hi], hi - lo == len(self.params[j])

        def hand_out(leaf: Tensor) -> None:
            # after autograd stored the gradient in the leaf (the product's output, no copy, in the
            # leaf's contiguous layout: a fused optimizer reads each parameter's gradient as such); a
            # hook on the gradient itself would hold a second reference, and autograd would copy it
            grad, leaf.grad = leaf.grad, None
            views = list(grad.unbind(0))
            if whole and all(p.grad is None for p in params):
                self.grads[j] = (weakref.ref(grad), [weakref.ref(v) for v in views])
            for p, g in zip(params, views):
                if p.grad is None:
                    p.grad = g  # a view: no copy
                else:
                    p.grad += g

        leaf.register_post_accumulate_grad_hook(hand_out)
        return leaf


_VECTOR_BYTES = 64
"""The widest vector torch's CPU kernels use (AVX-512): a tensor of a multiple of it in bytes has no
scalar tail at any narrower width either."""


class StackedAdam(torch.optim.Adam):
    """torch's fused Adam (``fused=True``) over the parameters of :class:`SharedStacks`, whose
    update runs over the stacked tensors (one per layer and kind) instead of one per net, without
    the work per tensor that torch's optimizer does in Python (a sweep has hundreds of parameters).

    The stacked step is torch's public fused Adam itself, its functional form
    (``torch.optim.adam.adam(..., fused=True)``, the computation of ``Adam.step``) over the stacks
    (plain tensors sharing the nets' storage, with the stacked gradients) and views into the stacked
    state. The same Adam bit for bit: torch's CPU kernel treats the elements past the last full vector
    of a tensor with scalar code, which rounds otherwise, so a stack whose nets' tensors do not fill
    whole vectors (``_VECTOR_BYTES``) is stepped tensor by tensor (the nets' own, in the same call).

    The state stays per parameter (``state_dict``, checkpoints): each parameter's ``exp_avg``,
    ``exp_avg_sq`` and ``step`` become views into stacked tensors on the first step that finds
    them elsewhere (after the first step, or a checkpoint load). A step is torch's own whenever
    the stacked one does not apply: a parameter's gradient is not the view the stacks handed out
    (a member-parallel slice, data-parallel copies), the steps differ, or an option the stacked
    step does not take (amsgrad, a tensor lr, several parameter groups, a GradScaler's scale).
    """

    def __init__(self, params: Iterable[nn.Parameter], stacks: Sequence[SharedStacks], lr: float) -> None:
        super().__init__(params, lr=lr, fused=True)
        self.shared_stacks = stacks
        self._views: list | None = None
        # the step counts the functional step reads and advances, one per tensor stepped (it advances
        # each count passed to it, while the stacked state holds one per net), and the state's counts
        # they were copied from: copied again when those change (a load) or torch's own step ran
        self._counts: list[Tensor] = []
        self._counted: list[Tensor] = []

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stacked = self._stacked()
        if stacked is None:
            self._counted = []  # the counts move without the functional step's
            # torch's step itself: the class attribute is wrapped in the optimizer's hooks, which ran
            getattr(torch.optim.Adam.step, "__wrapped__", torch.optim.Adam.step)(self)
            return loss
        (tensors, grads, avgs, sqs, steps), counter = stacked
        if len(steps) != len(self._counted) or any(a is not b for a, b in zip(steps, self._counted)):
            self._counts, self._counted = list(torch.stack(steps).unbind(0)), steps
        group = self.param_groups[0]
        functional_adam(tensors, grads, avgs, sqs, [], self._counts, fused=True, amsgrad=False,
                        beta1=group["betas"][0], beta2=group["betas"][1], lr=group["lr"],
                        weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"])
        counter.add_(1)  # every parameter's count, as the functional step advanced its own
        return loss

    def _stacked(self) -> tuple | None:
        """The stacked tensors of a step (lists of tensors, gradients, exp_avg, exp_avg_sq, steps) and
        the stacked step counts, or None where the stacked step does not apply."""
        if len(self.param_groups) != 1:
            return None
        group = self.param_groups[0]
        if (group["amsgrad"] or group.get("decoupled_weight_decay") or not group["fused"]
                or isinstance(group["lr"], Tensor)
                or getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None):
            return None  # (grad_scale, found_inf: a GradScaler's unscaling, which torch's step does)
        entries = [(shared, j) for shared in self.shared_stacks for j in range(len(shared.params))]
        if sum(len(shared.params[j]) for shared, j in entries) != len(group["params"]):
            return None
        grads = []
        for shared, j in entries:
            handed = shared.grads[j]
            if handed is None or any(p.grad is None or p.grad is not view()
                                     for p, view in zip(shared.params[j], handed[1])):
                return None
            grads.append((handed[0](), [p.grad for p in shared.params[j]]))
        if not self._state_stacked([shared.params[j] for shared, j in entries]):
            return None
        avgs, sqs, counter, views = self._views
        tensors: tuple[list[Tensor], ...] = ([], [], [], [], [])
        for (shared, j), (grad, grad_views), avg, sq, triples in zip(entries, grads, avgs, sqs, views):
            stack = shared.stacks[j]
            if stack.numel() // len(stack) * stack.element_size() % _VECTOR_BYTES == 0:
                items = [(stack, grad, avg, sq, triples[0][2])]
            else:  # each net's tensor alone, as torch's step (see the class docstring)
                items = [(p, g, a, q, c) for p, g, (a, q, c) in zip(shared.params[j], grad_views, triples)]
            for item in items:
                for lst, t in zip(tensors, item):
                    lst.append(t)
        return tensors, counter

    def _state_stacked(self, groups: list[list[Tensor]]) -> bool:
        """Whether every parameter's state is a view into the stacked state (made so if it can be)."""
        states = [[self.state.get(p) for p in ps] for ps in groups]
        if self._views is not None and all(
                s and s["exp_avg"] is a and s["exp_avg_sq"] is q and s["step"] is c
                for ss, triples in zip(states, self._views[3]) for s, (a, q, c) in zip(ss, triples)):
            return True
        flat = [s for ss in states for s in ss]
        if not all(flat) or len({float(s["step"]) for s in flat}) != 1:
            return False
        counter = torch.stack([s["step"] for s in flat])  # every parameter's step count, one tensor
        counts = iter(counter.unbind(0))
        avgs, sqs, views = [], [], []
        for ss in states:
            avg, sq = torch.stack([s["exp_avg"] for s in ss]), torch.stack([s["exp_avg_sq"] for s in ss])
            triples = []
            for s, a, q in zip(ss, avg.unbind(0), sq.unbind(0)):
                s["exp_avg"], s["exp_avg_sq"], s["step"] = a, q, next(counts)
                triples.append((a, q, s["step"]))
            avgs.append(avg)
            sqs.append(sq)
            views.append(triples)
        self._views = [avgs, sqs, counter, views]
        return True


def stacked_mlp(h: Tensor, layers: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """The chain ``Linear, ReLU, ..., Linear`` (no ReLU after the last) of E nets at once.

    ``h`` is (B, in), the same inputs for every net, or (E, B, in), each net its own; returns
    (E, B, out), a transposed view. ``layers`` from :func:`stacked_layers` or
    :meth:`SharedStacks.leaves`. The products run feature-major, ``h^T <- W h^T + b``, so the
    weights' gradients come out in the weights' own (contiguous) layout."""
    hT = h.t() if h.dim() == 2 else h.transpose(1, 2)
    for i, (W, b) in enumerate(layers):
        if hT.dim() == 2:  # shared input: broadcast over the nets (no copy)
            hT = hT.expand(W.shape[0], *hT.shape)
        hT = torch.baddbmm(b.unsqueeze(-1), W, hT)
        if i < len(layers) - 1:
            # in place: the product's backward does not read its output, and the activation stays
            # in the cache lines the product just wrote (no new buffer per layer)
            hT = torch.relu_(hT)
    return hT.transpose(1, 2)


__all__ = ["SharedStacks", "StackedAdam", "stacked_layers", "stacked_mlp"]
