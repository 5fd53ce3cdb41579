"""Neural tangent kernels: empirical (any ``nn.Module``), closed form for a two-layer linear net,
and the kernel distance that measures how far the NTK moves during training.

Pure torch (``torch.func``), no Lightning: usable from a notebook.

Index convention, shared by :func:`empirical_ntk` and :func:`linear_ntk` so that their results
can be compared entry by entry. For ``N`` samples and ``O`` outputs per sample the NTK
``K[(i, a), (j, b)] = <d f_a(x_i)/d theta, d f_b(x_j)/d theta>`` is returned as an
``(N*O, N*O)`` matrix whose row/column index is

* ``layout="sample_major"`` (default): ``i*O + a`` -- the blocks along the diagonal are the
  ``O x O`` kernels of single samples; it is ``K4.reshape(N*O, N*O)`` of the 4-way tensor
  ``K4[i, a, j, b]``, i.e. the order of ``f(X).reshape(-1)`` for an output ``f(X)`` of shape (N, O);
* ``layout="output_major"``: ``a*N + i`` -- the ordering of Braun et al. (2022) and [L] Eq. 5,
  where ``K = I_out (x) X^T W1^T W1 X + W2 W2^T (x) X^T X`` (``(x)`` = Kronecker product).

The kernel distance :func:`kernel_distance` is invariant under any permutation applied to both
of its arguments, so it does not depend on the layout as long as both kernels use the same one.

References: Jacot et al. 2018 (NTK); Braun et al. 2022 (two-layer linear NTK); Fort et al. 2020
(kernel distance); [L] = Dominé et al., "From lazy to rich", Eq. 5 and Fig. 5; docs/theory.md#linear-ntk.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap

__all__ = ["empirical_ntk", "kernel_distance", "linear_ntk"]

Layout = Literal["sample_major", "output_major"]
Reduce = Literal["none", "trace", "sum"]
Method = Literal["jacobian", "ntk_vp"]

_LAYOUTS = ("sample_major", "output_major")
_REDUCES = ("none", "trace", "sum")
_METHODS = ("jacobian", "ntk_vp")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} = {value!r}; allowed: {', '.join(repr(a) for a in allowed)}")


def _arrange(K4: Tensor, layout: str, reduce: str) -> Tensor:
    """``K4[..., i, a, j, b]`` -> the matrix in the requested layout / reduction."""
    if reduce == "trace":
        return torch.diagonal(K4, dim1=-3, dim2=-1).sum(-1)  # sum_a K4[..., i, a, j, a]
    if reduce == "sum":
        return K4.sum(dim=(-3, -1))
    N1, O, N2 = K4.shape[-4], K4.shape[-3], K4.shape[-2]
    if layout == "output_major":
        K4 = K4.transpose(-4, -3).transpose(-2, -1)  # (..., a, i, b, j)
    return K4.reshape(*K4.shape[:-4], N1 * O, N2 * O)


def _split_state(model: nn.Module, params: dict[str, Tensor] | None) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(trainable values, constant values) for ``functional_call``, all detached."""
    named_params = dict(model.named_parameters())
    named_buffers = dict(model.named_buffers())
    given = dict(params) if params is not None else {}
    unknown = sorted(set(given) - set(named_params) - set(named_buffers))
    if unknown:
        raise KeyError(
            f"empirical_ntk: params has names that are neither parameters nor buffers of the model: {unknown}; "
            f"the model's parameters are {sorted(named_params)}"
        )
    trainable: dict[str, Tensor] = {}
    constants: dict[str, Tensor] = {}
    for name, p in named_params.items():
        value = given.get(name, p).detach()
        (trainable if p.requires_grad else constants)[name] = value
    for name, b in named_buffers.items():
        constants[name] = given.get(name, b).detach()
    if not trainable:
        raise ValueError("empirical_ntk: the model has no parameter with requires_grad=True, so its NTK is zero-dimensional")
    return trainable, constants


def empirical_ntk(
    model: nn.Module,
    x: Tensor,
    *,
    method: Method = "jacobian",
    params: dict[str, Tensor] | None = None,
    layout: Layout = "sample_major",
    reduce: Reduce = "none",
    x2: Tensor | None = None,
) -> Tensor:
    """The empirical NTK ``K[(i, a), (j, b)] = sum_theta df_a(x_i)/dtheta * df_b(x_j)/dtheta``.

    Only parameters with ``requires_grad=True`` are differentiated (a frozen layer contributes
    nothing); frozen parameters and buffers enter as constants. The module is evaluated through
    ``torch.func.functional_call``, so it is not modified.

    Args:
        model: any ``nn.Module`` mapping a batch ``(N, ...)`` to outputs ``(N,)`` (``O = 1``) or
            ``(N, d1, d2, ...)`` (flattened to ``O = d1*d2*...``). Samples must not interact
            (put BatchNorm in eval mode; dropout must be off, i.e. ``model.eval()``): the NTK is
            that of the per-sample function.
        x: inputs ``(N, ...)``, on the model's device (the result is on ``x``'s device).
        method: ``"jacobian"``: per-sample Jacobians (``vmap(jacrev)``) contracted over the
            parameters, memory ``O(N O P)``; ``"ntk_vp"``: NTK-vector products ``J (J^T v)``
            (a ``vjp`` followed by a ``jvp``) for every basis vector ``v``, batched by ``vmap``,
            memory independent of the number of parameters ``P`` beyond one copy of them.
            The two agree to rounding error.
        params: optional values (name -> tensor, names as in ``model.named_parameters()`` /
            ``named_buffers()``) at which to evaluate the NTK, e.g. the weights at
            initialisation; names not given take the module's current values. Which
            parameters are differentiated is still decided by the module's ``requires_grad``.
        layout: ``"sample_major"`` (index ``i*O + a``) or ``"output_major"`` (index ``a*N + i``,
            Braun et al. 2022 / [L] Eq. 5); see the module docstring.
        reduce: ``"none"``: the full ``(N*O, N*O)`` kernel; ``"trace"``: the ``(N, N)`` kernel
            ``sum_a K[(i, a), (j, a)]`` (trace over outputs); ``"sum"``: the ``(N, N)`` NTK of
            the summed output ``sum_a f_a``, i.e. ``sum_{a, b} K[(i, a), (j, b)]``.
            ``layout`` is irrelevant for the reduced kernels.
        x2: optional second batch ``(N2, ...)``: return the cross-kernel ``K(x, x2)`` of shape
            ``(N*O, N2*O)`` (rows indexed by ``x``, columns by ``x2``, same layout).

    Returns:
        The kernel, in the dtype of the model's outputs, without an autograd graph.
    """
    _check_choice("empirical_ntk: method", method, _METHODS)
    _check_choice("empirical_ntk: layout", layout, _LAYOUTS)
    _check_choice("empirical_ntk: reduce", reduce, _REDUCES)
    trainable, constants = _split_state(model, params)
    xa = x
    xb = x if x2 is None else x2

    def f_batch(p: dict[str, Tensor], xs: Tensor) -> Tensor:
        out = functional_call(model, (p, constants), (xs,))
        return out.reshape(xs.shape[0], -1)  # (N, O); an output (N,) becomes (N, 1)

    if method == "jacobian":

        def f_single(p: dict[str, Tensor], xi: Tensor) -> Tensor:
            return f_batch(p, xi.unsqueeze(0))[0]  # (O,)

        jac_fn = vmap(jacrev(f_single), in_dims=(None, 0))
        Ja = jac_fn(trainable, xa)  # name -> (N, O, *param_shape)
        Jb = Ja if x2 is None else jac_fn(trainable, xb)
        K4 = None
        for name in trainable:
            A = Ja[name].flatten(2)  # (N1, O, P_name)
            B = Jb[name].flatten(2)  # (N2, O, P_name)
            if reduce == "trace":
                term = torch.einsum("iap,jap->ij", A, B)
            elif reduce == "sum":
                term = A.sum(1) @ B.sum(1).T
            else:
                term = torch.einsum("iap,jbp->iajb", A, B)
            K4 = term if K4 is None else K4 + term
        if reduce != "none":
            return K4.detach()
        return _arrange(K4, layout, reduce).detach()

    # method == "ntk_vp": column (j, b) of K is J_a (J_b^T e_(j,b)).
    out_b, vjp_fn = vjp(lambda p: f_batch(p, xb), trainable)
    N2, O = out_b.shape

    def kernel_vector_product(v: Tensor) -> Tensor:
        (jt_v,) = vjp_fn(v)  # J_b^T v, shaped like the parameters
        _, jj_v = jvp(lambda p: f_batch(p, xa), (trainable,), (jt_v,))
        return jj_v  # (N1, O)

    if reduce == "sum":
        # v_j = e_j (x) 1_O: the NTK of the summed output needs only N2 products.
        basis = torch.eye(N2, dtype=out_b.dtype, device=out_b.device)[:, :, None].expand(N2, N2, O)
        cols = vmap(kernel_vector_product)(basis)  # (N2, N1, O): cols[j, i, a] = sum_b K[(i,a),(j,b)]
        return cols.sum(-1).T.detach()
    basis = torch.eye(N2 * O, dtype=out_b.dtype, device=out_b.device).reshape(N2 * O, N2, O)
    cols = vmap(kernel_vector_product)(basis)  # (N2*O, N1, O): cols[(j, b), i, a] = K[(i,a),(j,b)]
    K4 = cols.reshape(N2, O, *cols.shape[1:]).permute(2, 3, 0, 1)  # (N1, O, N2, O)
    return _arrange(K4, layout, reduce).detach()


def linear_ntk(
    W1: Tensor,
    W2: Tensor,
    X: Tensor,
    *,
    layout: Layout = "sample_major",
    reduce: Reduce = "none",
) -> Tensor:
    """Closed-form NTK of the two-layer linear network ``y = W2 W1 x`` (Braun et al. 2022, [L] Eq. 5).

    With inputs as columns, ``K = I_out (x) X^T W1^T W1 X + W2 W2^T (x) X^T X`` (output-major
    Kronecker ordering). Here ``X`` holds samples as rows, so with the Gram matrices
    ``A = X W1^T W1 X^T`` and ``G = X X^T`` (both ``N x N``) and ``B = W2 W2^T`` (``O x O``)
    ``K[(i, a), (j, b)] = A_ij delta_ab + G_ij B_ab``: the first term is the gradient with
    respect to ``W2``, the second the gradient with respect to ``W1``.

    Args:
        W1: ``(..., n_h, n_in)``; leading dims (e.g. an ensemble ``E``) broadcast with ``W2``, ``X``.
        W2: ``(..., n_out, n_h)``.
        X: ``(..., N, n_in)``, one sample per row (shared by all members when 2-D).
        layout, reduce: as in :func:`empirical_ntk` (same index convention, so the two can be
            compared directly): ``"sample_major"`` index ``i*n_out + a``, ``"output_major"``
            index ``a*N + i``; ``reduce="trace"`` gives ``n_out A + tr(B) G``, ``"sum"`` gives
            ``n_out A + (1^T B 1) G``.

    Returns:
        ``(..., N*n_out, N*n_out)`` (or ``(..., N, N)`` when reduced).
    """
    _check_choice("linear_ntk: layout", layout, _LAYOUTS)
    _check_choice("linear_ntk: reduce", reduce, _REDUCES)
    if W1.shape[-1] != X.shape[-1] or W2.shape[-1] != W1.shape[-2]:
        raise ValueError(
            f"linear_ntk: shapes do not chain: W1 {tuple(W1.shape)} (n_h, n_in), W2 {tuple(W2.shape)} (n_out, n_h), "
            f"X {tuple(X.shape)} (N, n_in)"
        )
    H = X @ W1.transpose(-1, -2)  # (..., N, n_h): hidden activations
    A = H @ H.transpose(-1, -2)  # (..., N, N)
    G = X @ X.transpose(-1, -2)  # (..., N, N)
    B = W2 @ W2.transpose(-1, -2)  # (..., O, O)
    O = W2.shape[-2]
    if reduce == "trace":
        return O * A + torch.diagonal(B, dim1=-2, dim2=-1).sum(-1)[..., None, None] * G
    if reduce == "sum":
        return O * A + B.sum(dim=(-2, -1))[..., None, None] * G
    eye = torch.eye(O, dtype=B.dtype, device=B.device)
    # K4[..., i, a, j, b] = A_ij delta_ab + G_ij B_ab
    K4 = A[..., :, None, :, None] * eye[:, None, :] + G[..., :, None, :, None] * B[..., None, :, None, :]
    return _arrange(K4, layout, reduce)


def kernel_distance(K0: Tensor, Kt: Tensor) -> Tensor:
    """Kernel distance ``S = 1 - <K0, Kt>_F / (|K0|_F |Kt|_F)`` (Fort et al. 2020; [L] Fig. 5).

    One minus the cosine similarity of the two kernels as vectors: 0 when ``Kt`` is a positive
    multiple of ``K0`` (lazy regime: the kernel only rescales), up to 1 for orthogonal kernels
    (2 for ``Kt = -K0``, which no NTK reaches). Both kernels must use the same index layout;
    the value is invariant under a permutation applied to both.

    Args:
        K0, Kt: ``(..., n, m)``; leading dims broadcast (e.g. an ensemble ``(E, n, n)`` against
            ``(E, n, n)`` or a shared ``(n, n)``).

    Returns:
        ``(...)``: one distance per leading index; ``nan`` where a kernel is exactly zero.
    """
    if K0.shape[-2:] != Kt.shape[-2:] or K0.dim() < 2 or Kt.dim() < 2:
        raise ValueError(f"kernel_distance: kernels of shapes {tuple(K0.shape)} and {tuple(Kt.shape)} differ in their last two dims")
    dtype = torch.promote_types(K0.dtype, Kt.dtype)
    K0, Kt = K0.to(dtype), Kt.to(dtype)
    inner = (K0 * Kt).sum(dim=(-2, -1))
    norms = torch.linalg.matrix_norm(K0) * torch.linalg.matrix_norm(Kt)
    return 1 - inner / norms
