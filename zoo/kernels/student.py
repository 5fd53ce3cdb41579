"""Exact blocked online SGD of ONE student with its per-step recursion in Python floats.

The blocked kernels of :class:`zoo.models.student.MultiHeadStudent` run every SGD step as ~12 tensor
operations on the block's pre-activations. For a single student those tensors hold a handful of
numbers, and a step costs the dispatch of its operations (~1 us each): as much as a plain loop's
step, which is made of the same operations. Here the recursion of the module docstring of
:mod:`zoo.models.student` ([S] Eqs. 6-7, blocked):

    u_j = s (W_0 x_j) - c sum_{m < j} (x_m . x_j) g_m,    g_m = Delta_m h * phi'(lam_m) / phi'_0

runs on Python floats (float64: the rounding differs from the tensor kernels, the arithmetic is
the same), with the block's products (``W_0 X^T``, the Gram matrix ``X X^T``, ``G^T X``) still
BLAS products: a step is then ~30 float operations and two short sums of products. One call
trains a whole chunk, block after block, with the head and the ``Delta`` in Python floats in
between (a block costs its three products, written into buffers made once a call, and reads
them through memoryviews: ~8 us of Python and dispatch a block, not a dozen ops a step).

The loop a user would write the same way (``bench/bench_student.py``'s baseline: ``W x`` and one
``axpy`` per row of ``W`` a step, the rest on floats) costs three tensor operations a step. On the
2-core machine, one thread, CPU time per step of the kernels alone (inputs drawn fresh, as the
datamodule does): at d = 1000 ~2.8 us (blocks of 16) against ~6 us for the loop; at d = 10,000
~9 us (blocks of 4: the Gram's ``n d`` a step costs more there than the Python a block spreads
over its ``n`` steps, ``MultiHeadStudent._scalar_block_size``) against ~13 us.
"""
from __future__ import annotations

import math
from array import array
from operator import mul

import torch
from torch import Tensor


def _erf(u: float) -> tuple[float, float]:
    return math.erf(u), math.exp(-u * u)


def _relu(u: float) -> tuple[float, float]:
    return (u, 1.0) if u > 0 else (0.0, 0.0)


def _sigmoid(u: float) -> tuple[float, float]:
    if u >= 0:
        f = 1.0 / (1.0 + math.exp(-u))
    else:  # exp(-u) would overflow for u < -709
        e = math.exp(u)
        f = e / (1.0 + e)
    return f, f - f * f


def _tanh(u: float) -> tuple[float, float]:
    f = math.tanh(u)
    return f, 1.0 - f * f


def _linear(u: float) -> tuple[float, float]:
    return u, 1.0


#: ``phi(u)`` and ``phi'(lam) / dphi_const`` of ``u = kappa lam`` (``zoo.models.multihead.phi_u``, ``dphi_u``)
ACTIVATIONS = {"erf": _erf, "relu": _relu, "sigmoid": _sigmoid, "tanh": _tanh, "linear": _linear}


def online_steps(W: Tensor, h: Tensor, X: Tensor, y: Tensor, D: Tensor, activation: str, scale_u: float,
                 c_u: float, c_head: float, c_W: float, block: int) -> None:
    """Online SGD of one student on ``S`` samples, in place: ``W`` (p, d), ``h`` (p,), ``D`` (S,).

    ``X`` (S, d) and ``y`` (S,) are the inputs and labels, run in blocks of ``block`` samples;
    ``scale_u = kappa / sqrt d`` makes ``u``; ``c_u``, ``c_head``, ``c_W`` are the steps of ``u``
    (per Gram entry), the head and ``W`` (``MultiHeadStudent._constants``). ``D`` receives every
    step's ``Delta``. The head is rounded to ``h``'s dtype at the end of every block, as if it were
    written back to ``h`` there: the bits do not depend on how the samples are split into calls.
    """
    act = ACTIVATIONS[activation]
    head, labels, deltas = h.tolist(), y.tolist(), []
    recursion = _two_units if len(head) == 2 else _any_units
    S = X.shape[0]
    full = S - S % block
    # every block's X_b and X_b^T as views made at once (unbind), not two slices a block
    blocks = X[:full].unflatten(0, (-1, block))
    blocks = list(zip(range(0, full, block), blocks.unbind(0), blocks.transpose(1, 2).unbind(0)))
    if full < S:
        blocks.append((full, X[full:], X[full:].T))
    buffers = None
    for a, Xb, Xt in blocks:
        n = Xb.shape[0]
        if buffers is None or n != block:  # once a call, and once more for a short last block
            buffers = _block_buffers(W, n)
        U, U_rows, K, K_rows, G, G_flat = buffers
        # the scales are applied in the recursion, on Python floats: a tensor op per block less each
        torch.mm(W, Xt, out=U)  # (p, n): W_0 x_j
        # x_m . x_j, read in place: the recursion reads x_m . x_j for m < j only, and a memoryview
        # makes a Python float of an entry when it is read (tolist would make all n^2)
        if K.dtype == Xb.dtype:
            torch.mm(Xb, Xt, out=K)
        else:
            K.copy_(Xb @ Xt)  # bfloat16 -> float32: exact
        g, block_deltas = recursion(act, K_rows, U_rows or U.tolist(), labels[a:a + n], head, scale_u, c_u, c_head)
        g = [v for unit in g for v in unit] if len(g) != 2 else g[0] + g[1]
        if G_flat is None:
            G = torch.tensor(g, dtype=W.dtype).view(U.shape)
        else:
            G_flat[:] = array(G_flat.format, g)
        W.addmm_(G, Xb, alpha=-c_W)
        head = _rounded(head, h.dtype)
        deltas += block_deltas
    h.copy_(torch.tensor(head, dtype=h.dtype))
    D.copy_(torch.tensor(deltas, dtype=D.dtype))


def _block_buffers(W: Tensor, n: int) -> tuple[Tensor, list[memoryview] | None, Tensor, list[memoryview], Tensor,
                                               memoryview | None]:
    """A block's products, written in place (``out=``), and memoryviews of them, made once a call,
    not once a block (each costs about a microsecond, as much as a product at d = 1000):
    ``(U, U_rows, K, K_rows, G, G_flat)``: ``U`` (p, n) ``W_0 X^T`` and ``U_rows`` its rows; ``K``
    (n, n) the Gram matrix and ``K_rows`` its rows; ``G`` (p, n) the block's update directions and
    ``G_flat`` their buffer. For dtypes the array module does not hold (bfloat16, float16) ``K`` is
    float32 (the Gram's entries exactly), ``U_rows`` and ``G_flat`` None: ``U`` is read with
    ``tolist`` and ``G`` made from the Python floats each block."""
    kind = _TYPECODES.get(W.dtype)
    U, G = W.new_empty(W.shape[0], n), W.new_empty(W.shape[0], n)
    K = torch.empty(n, n, dtype=W.dtype if kind else torch.float32)
    U_rows = _rows(U) if kind else None
    return U, U_rows, K, _rows(K), G, _flat(G) if kind else None


def _rows(A: Tensor) -> list[memoryview]:
    """The rows of ``A`` (2-d, contiguous), each a memoryview of Python floats."""
    flat, n = _flat(A), A.shape[1]
    return [flat[i * n:(i + 1) * n] for i in range(A.shape[0])]


def _flat(A: Tensor) -> memoryview:
    """The entries of ``A`` (contiguous, float32 or float64) as a flat memoryview of Python floats."""
    return memoryview(A.numpy()).cast("B").cast(_TYPECODES[A.dtype])


#: array typecodes of the dtypes whose values the array module holds exactly
_TYPECODES = {torch.float32: "f", torch.float64: "d"}


def _rounded(values: list[float], dtype: torch.dtype) -> list[float]:
    """``values`` rounded to ``dtype``, as if stored in a tensor of it and read back."""
    kind = _TYPECODES.get(dtype)
    return array(kind, values).tolist() if kind else torch.tensor(values, dtype=dtype).tolist()


def _any_units(act, K, U0, y, head, scale_u, c_u, c_head):
    """The block's steps for any number of units: ``g`` of every unit (p lists) and every ``Delta``;
    ``K`` the rows of the Gram matrix, ``U0`` (p lists of n) ``W_0 x_j``; ``head`` (a list) is
    updated in place."""
    G: list[list[float]] = [[] for _ in head]  # g of every step so far, unit by unit
    deltas = []
    for j, (k, y_j) in enumerate(zip(K, y)):
        # sum(map(mul, k, g)): the corrections of the earlier steps (g holds them; map stops there)
        fd = [act(scale_u * u[j] - c_u * sum(map(mul, k, g))) for u, g in zip(U0, G)]
        delta = sum([f * h_i for (f, _), h_i in zip(fd, head)]) - y_j
        for i, ((f, df), g) in enumerate(zip(fd, G)):
            g.append(delta * head[i] * df)
            head[i] -= c_head * delta * f
        deltas.append(delta)
    return G, deltas


def _two_units(act, K, U0, y, head, scale_u, c_u, c_head):
    """:func:`_any_units` written out for p = 2 ([S]'s students), twice as fast; the same
    operations in the same order, so the same bits."""
    h0, h1 = head
    G0: list[float] = []
    G1: list[float] = []
    deltas = []
    for u0, u1, k, y_j in zip(*U0, K, y):
        f0, df0 = act(scale_u * u0 - c_u * sum(map(mul, k, G0)))
        f1, df1 = act(scale_u * u1 - c_u * sum(map(mul, k, G1)))
        delta = 0.0 + f0 * h0 + f1 * h1 - y_j  # sum() of _any_units starts at 0.0 too
        G0.append(delta * h0 * df0)
        G1.append(delta * h1 * df1)
        h0 -= c_head * delta * f0
        h1 -= c_head * delta * f1
        deltas.append(delta)
    head[:] = [h0, h1]
    return [G0, G1], deltas
