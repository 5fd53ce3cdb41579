"""The fully connected networks of several models as one computation: each layer's weights stacked
over the models, batched matrix products (issue #21: a ``BetaVAESweep`` steps its members together).

The members keep their own ``nn.Linear`` parameters (checkpoints, member-parallel ownership and the
callbacks see separate models); a step stacks them (``torch.stack``, a copy whose backward hands
each member its own slice of the gradient), so the arithmetic per member is the member's own
``Linear`` chain ([S] App. D's deep fully connected encoder and decoder) with its matrix products
batched (``torch.baddbmm``): equal to the member's up to float summation order.

The first layer of an encoder reads the same images for every member: they enter the batched
product broadcast over the members (a stride-0 batch, no copy). Measured on a 1-thread CPU
(issue #21), this is faster than one product with the E weight matrices concatenated into one
``(E * H, D)`` matrix: the weight gradient comes out as E blocks that each stay in cache.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


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
    (a hook), added to a ``.grad`` already there (gradient accumulation). Leaves do not go through
    the parameters' autograd hooks: a module wrapped in ``DistributedDataParallel`` must use
    :func:`stacked_layers`.
    """

    def __init__(self, nets: Sequence[nn.Sequential]) -> None:
        self.params = [group for layer in _linears(nets)
                       for group in ([m.weight for m in layer], [m.bias for m in layer])]
        self.stacks: list[Tensor] = []

    def _shared(self) -> bool:
        return len(self.stacks) == len(self.params) and all(
            p.dtype == s.dtype and p.device == s.device and p.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()
            for group, s in zip(self.params, self.stacks) for p in group)

    def _share(self) -> None:
        self.stacks = []
        for group in self.params:
            stack = torch.stack([p.detach() for p in group])
            for p, view in zip(group, stack):
                p.data = view
            self.stacks.append(stack)

    def leaves(self, lo: int, hi: int) -> list[tuple[Tensor, Tensor]]:
        """``(W, b)`` of nets ``lo:hi``, layer by layer, as leaves sharing the parameters' storage."""
        if not self._shared():
            self._share()
        out = [_leaf(stack[lo:hi], group[lo:hi]) for group, stack in zip(self.params, self.stacks)]
        return list(zip(out[0::2], out[1::2]))


def _leaf(stack: Tensor, params: Sequence[Tensor]) -> Tensor:
    leaf = stack.detach().requires_grad_()

    def hand_out(leaf: Tensor) -> None:
        # after autograd stored the gradient in the leaf (taking the product's output, no copy, in the
        # leaf's contiguous layout: a fused optimizer reads each parameter's gradient as such); a
        # hook on the gradient itself would hold a second reference, and autograd would copy it
        grad, leaf.grad = leaf.grad, None
        for p, g in zip(params, grad.unbind(0)):
            if p.grad is None:
                p.grad = g  # a view: no copy
            else:
                p.grad += g

    leaf.register_post_accumulate_grad_hook(hand_out)
    return leaf


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
            hT = torch.relu(hT)
    return hT.transpose(1, 2)


__all__ = ["SharedStacks", "stacked_layers", "stacked_mlp"]
