"""The contextual semantic task ([H] Sec. 4-5, App. F-H; docs/theory.md#contexts).

Items (one-hot, n_items = 8) are queried in every one of C contexts (one-hot): X is
(C n_items) x (n_items + C), row-major here (one row per data point). Targets: a common block
``[H, ..., H]`` (the hierarchy H: a row of ones, 2 blocks of 4, 4 blocks of 2, the identity;
2 n_items - 1 rows) active in every context, then one block per context active only there.
"structure='different'" (three contexts only, as in [H] Sec. 4) makes the second context's
block a ring-like graded pattern and the third's a hierarchy whose rows 3-6 are a cross pattern.

Gatings: "reln", the ReLN of [H] Fig. 3 (a common pathway reading items and contexts on every
point, and C context pathways each active in C - 1 contexts reading items only); "single",
the GDLN of [H] Fig. 4a that does not imitate the ReLU net (a common pathway and C pathways
each active in one context); "reln_full", both sets of context pathways beside the common one
(2C + 1 pathways): the network the authors' code trains as the ReLN of [H] Figs. 3-4 (its
seven modules; their race and closed forms keep only the "reln" pathways).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from datamodules.xor import GatedTask
from zoo.theory.gdln import Gating

# graded levels of the ring pattern, as two-decimal fractions of the full value
_RING_LEVELS = (0.0, 0.33, 0.66, 1.0)


def hierarchy(n_items: int = 8) -> Tensor:
    """The hierarchy block ([H] Fig. 3): rows of 1, 2, 4, ..., n_items equal blocks, (2 n - 1, n)."""
    rows, h = [], 1
    while h <= n_items:
        block = torch.zeros(h, n_items)
        w = n_items // h
        for i in range(h):
            block[i, i * w : (i + 1) * w] = 1.0
        rows.append(block)
        h *= 2
    return torch.cat(rows)


def ring(n_items: int = 8) -> Tensor:
    """A ring-like pattern (15 x 8): a row of ones, then a graded bump moved one item on per row
    around the ring (all 8 positions, then the first 6 again)."""
    bump = torch.tensor([_RING_LEVELS[i] for i in (0, 1, 2, 3, 3, 2, 1, 0)])
    rows = [torch.ones(n_items)] + [torch.roll(bump, -k) for k in range(n_items)] * 2
    return torch.stack(rows[: 2 * n_items - 1])


def cross(n_items: int = 8) -> Tensor:
    """The hierarchy with rows 3-6 (the pairs) replaced by a cross pattern pairing items (0,2), (1,3), (4,6), (5,7)."""
    H = hierarchy(n_items)
    for row, (a, b) in zip(range(3, 7), ((0, 2), (1, 3), (4, 6), (5, 7))):
        H[row] = 0.0
        H[row, a] = H[row, b] = 1.0
    return H


class Contexts(GatedTask):
    """Items in contexts ([H] Sec. 4-5): X (C n, n + C), Y (C n, (C + 1)(2n - 1)).

    Args:
        n_contexts: C, 3 to 5 ([H] Sec. 5 uses 3, 4, 5).
        structure: 'same' (every context block is the hierarchy) or 'different' (C = 3 only,
            [H] Sec. 4: hierarchy, ring, cross).
        n_items: items (a power of two; 8 in the paper).
        context_scale: the value of a context's one-hot input (1 here by default). The authors'
            code for [H] Fig. 5 uses 1.1 with four contexts and 1.35 with five
            (CAandL-Lab/make-haste-slowly, diff_context_num/gen_data.py); give those to run their data.
        batches_per_epoch: full batches per epoch.
    """

    GATINGS = ("reln", "single", "reln_full")

    def __init__(self, n_contexts: int = 3, structure: str = "same", n_items: int = 8, context_scale: float = 1.0,
                 batches_per_epoch: int = 1) -> None:
        super().__init__(batches_per_epoch)
        if not (context_scale > 0 and math.isfinite(context_scale)):
            raise ValueError(f"Contexts: context_scale = {context_scale}; allowed: a positive number")
        if n_contexts not in (3, 4, 5):
            raise ValueError(f"Contexts: n_contexts = {n_contexts}; allowed: 3, 4 or 5")
        if structure not in ("same", "different"):
            raise ValueError(f"Contexts: structure = {structure!r}; allowed: 'same' or 'different'")
        if structure == "different" and n_contexts != 3:
            raise ValueError(f"Contexts: structure = 'different' is defined for n_contexts = 3 only, got {n_contexts}")
        if n_items < 2 or n_items & (n_items - 1):
            raise ValueError(f"Contexts: n_items = {n_items}; allowed: a power of two >= 2")
        if structure == "different" and n_items != 8:
            raise ValueError(f"Contexts: structure = 'different' needs n_items = 8, got {n_items}")
        self.n_contexts, self.structure, self.n_items = n_contexts, structure, n_items
        self.context_scale = float(context_scale)

    def blocks(self) -> list[Tensor]:
        """The target block of each context."""
        H = hierarchy(self.n_items)
        if self.structure == "same":
            return [H] * self.n_contexts
        return [H, ring(self.n_items), cross(self.n_items)]

    @property
    def context(self) -> Tensor:
        """The context of each data point, (C n,)."""
        return torch.arange(self.n_contexts).repeat_interleave(self.n_items)

    @property
    def X(self) -> Tensor:
        C, n = self.n_contexts, self.n_items
        items = torch.eye(n).repeat(C, 1)
        return torch.cat([items, self.context_scale * torch.nn.functional.one_hot(self.context, C).float()], dim=1)

    @property
    def Y(self) -> Tensor:
        C, n = self.n_contexts, self.n_items
        H = hierarchy(n)
        cols = []
        for c, block in enumerate(self.blocks()):
            ctx = [block if k == c else torch.zeros_like(block) for k in range(C)]
            cols.append(torch.cat([H] + ctx, dim=0))  # (rows, n) for the points of context c
        return torch.cat(cols, dim=1).T.contiguous()

    def gating(self, name: str) -> Gating:
        """'reln': common + C pathways active in all contexts but their own; 'single': common + one
        per context; 'reln_full': common + the 'single' pathways + the 'reln' context pathways."""
        self._check_gating(name)
        C, n = self.n_contexts, self.n_items
        onehot = torch.nn.functional.one_hot(self.context, C).float()
        ctx_gates, labels = [], []
        if name in ("single", "reln_full"):
            ctx_gates.append(onehot)
            labels += [f"only_ctx{c}" for c in range(C)]
        if name in ("reln", "reln_full"):
            ctx_gates.append(1.0 - onehot)
            labels += [f"not_ctx{c}" for c in range(C)]
        gates = torch.cat([torch.ones(C * n, 1), *ctx_gates], dim=1)
        P = gates.shape[1]
        inputs = torch.zeros(P, n + C)
        inputs[0] = 1.0
        inputs[1:, :n] = 1.0
        common = torch.zeros(P, dtype=torch.bool)
        common[0] = True
        return Gating(gates, inputs, common, ["common"] + labels)
