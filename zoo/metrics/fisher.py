"""The diagonal Fisher information of any module, computed per sample (EWC; docs/theory.md#fisher).

``F_i = (1/N) sum_n (d loss(f(x_n; theta), y_n) / d theta_i)^2``: the mean over samples of the
*squared per-sample* gradient, for each selected parameter. Elastic weight consolidation
([S] Sec. 4.2.2; Kirkpatrick et al. 2017) weighs its penalty ``xi/2 sum_i F_i (theta_i - theta*_i)^2``
with it. It is not the square of a minibatch-mean gradient, the bug DESIGN.md warns about:
that estimate's expectation is ``F/B + (mean gradient)^2`` for batches of ``B``, so it changes
with the batch size and, where the mean gradient vanishes (at a minimum, or with labels drawn
from the model), shrinks like ``1/B``.

Per-sample gradients come from ``torch.func`` (``vmap`` of ``grad`` of a ``functional_call``),
a chunk of samples at a time so that memory stays bounded (``chunk_size`` samples x the number
of selected parameters are held at once), or, where that is faster (wide layers on a CPU), from
one backward pass per sample. For ``nn.Linear`` layers the sum of squared per-sample gradients
has an exact closed form, ``(delta^2)^T (a^2)`` (output gradients and inputs per sample), which
``method="auto"`` (the default) uses instead of materialising them.
Pure torch, no Lightning: usable from a notebook.

Two estimators (``mode``):

* ``"empirical"``: ``y_n`` are the data's labels (the "empirical Fisher").
* ``"sampled"``: ``y_n`` is drawn from the model's own predictive distribution at ``x_n``
  (one draw per sample), which makes ``F`` a Monte-Carlo estimate of the true Fisher
  ``E_x E_{y ~ p(y|x)} [(d log p(y|x) / d theta)^2]``. The ``likelihood`` says what the model
  predicts; ``loss_fn`` must then be that likelihood's negative log (up to a constant):

  - ``"categorical"`` (a classifier; ``loss_fn`` = cross-entropy): ``y ~ Categorical(softmax(f(x)))``
    over the output's last dimension;
  - ``"gaussian"`` (a regression; ``loss_fn = 1/2 |y - f(x)|^2``, summed over outputs):
    ``y ~ N(f(x), I)``, the unit-variance Gaussian whose negative log-likelihood is
    ``1/2 |y - f|^2 + const``. Its true Fisher is ``E_x[J^T J]``, ``J = df/dtheta``.
  - a callable ``sample(output, generator) -> target`` for any other likelihood.

  By default it is inferred from the labels: integer labels -> categorical, floating -> gaussian.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, Union

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

__all__ = ["fisher_diagonal", "fisher_summary", "select_parameters"]

Pattern = Union[str, "re.Pattern[str]"]
Likelihood = Union[Literal["categorical", "gaussian"], Callable[[Tensor, Union[torch.Generator, None]], Tensor]]

_MODES = ("empirical", "sampled")
# gradient entries held at once (chunk_size's default). On a CPU, ~24 MB in float32 keeps a chunk
# of per-sample gradients in a typical L3 cache: for the 784-1000-5 network of bench_fisher.py,
# 8 samples a chunk ran 2-3x faster than 12 or more (which spill out of a 32 MB L3). A GPU wants
# large chunks (fewer kernel launches) and has the memory for them.
_CHUNK_ELEMENTS = {"cpu": 6_000_000, "cuda": 2**27}
# per-sample gradient entries above which method="auto" takes one backward pass per sample on a CPU
# instead of vmap. vmap's per-call cost (~1 ms) is shared by a chunk, but its batched outer products
# (bmm with an inner dimension of 1) and a chunk of per-sample gradients that outgrows the cache
# cost ~3 ns per entry and sample, three times a backward pass of one sample, whose ~0.4 ms of
# overhead is its own. Measured at 1 thread (sigmoid MLPs, 2-core EPYC, 32 MB L3): vmap 5-10x the
# loop's speed at 3k-10k entries, 1.6-3x at 40k (bench_fisher's 784-50-5), level at ~100k-250k,
# 0.25-0.8x at 785k (784-1000-5).
_LOOP_WIDTH = 2**17


# -- parameter selection ----------------------------------------------------------------------------
def _as_patterns(patterns: Pattern | Iterable[Pattern] | None, arg: str) -> list[Pattern] | None:
    if patterns is None:
        return None
    if isinstance(patterns, (str, re.Pattern)):
        patterns = [patterns]
    out = list(patterns)
    for p in out:
        if not isinstance(p, (str, re.Pattern)):
            raise TypeError(f"fisher_diagonal: {arg} contains {p!r}; allowed: glob strings, 're:<regex>' strings "
                            "or compiled re.Pattern objects")
    return out


def _matches(name: str, pattern: Pattern) -> bool:
    if isinstance(pattern, re.Pattern):
        return pattern.search(name) is not None
    if pattern.startswith("re:"):
        return re.search(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def select_parameters(module: nn.Module, include: Pattern | Iterable[Pattern] | None = None,
                      exclude: Pattern | Iterable[Pattern] | None = None) -> dict[str, Tensor]:
    """The parameters of ``module`` (by ``named_parameters`` name) that the filters select.

    A name is selected if it matches some ``include`` pattern (every name if ``include`` is
    ``None``) and no ``exclude`` pattern. A pattern is

    * a string: a shell-style glob matched against the *whole* name, case-sensitively
      (``"body.*"``, ``"*.weight"``, ``"heads.?.weight"``);
    * a string ``"re:<regex>"`` or a compiled ``re.Pattern``: a regular expression that must
      match *somewhere* in the name (``re.search``; anchor it with ``^...$`` for a whole match).

    ``requires_grad`` is ignored: the Fisher is a property of the model, not of what is trained.
    """
    inc, exc = _as_patterns(include, "include"), _as_patterns(exclude, "exclude")
    names = dict(module.named_parameters())
    chosen = {n: p for n, p in names.items()
              if (inc is None or any(_matches(n, q) for q in inc)) and not any(_matches(n, q) for q in exc or [])}
    if not chosen:
        raise ValueError(f"fisher_diagonal: include = {include!r}, exclude = {exclude!r} select no parameter; "
                         f"the module's parameters are {list(names)}")
    return chosen


# -- data ---------------------------------------------------------------------------------------------
def _is_batch(obj: object) -> bool:
    if isinstance(obj, Mapping):
        return "x" in obj
    return (isinstance(obj, (tuple, list)) and len(obj) >= 2 and isinstance(obj[0], Tensor)
            and (obj[1] is None or isinstance(obj[1], Tensor)))


def _unpack(batch: object) -> tuple[Tensor, Tensor | None]:
    if isinstance(batch, Mapping):
        if "x" not in batch:
            raise TypeError(f"fisher_diagonal: a dict batch needs keys 'x' (and 'y'); got {list(batch)}")
        return batch["x"], batch.get("y")
    if not _is_batch(batch):
        raise TypeError("fisher_diagonal: each batch must be (x, y) (a tuple or list starting with two tensors; "
                        f"y may be None in sampled mode) or a dict with 'x' and 'y'; got {type(batch).__name__}")
    return batch[0], batch[1]


def _batches(data: object) -> Iterable[tuple[Tensor, Tensor | None]]:
    """One ``(x, y)``, or an iterable of them (a DataLoader, a list of tuples)."""
    if _is_batch(data):
        yield _unpack(data)
        return
    if isinstance(data, Tensor) or not isinstance(data, Iterable):
        raise TypeError("fisher_diagonal: data must be an (x, y) batch or an iterable of them (e.g. a DataLoader); "
                        f"got {type(data).__name__}")
    for batch in data:
        yield _unpack(batch)


# -- label sampling (mode="sampled") --------------------------------------------------------------
def _infer_likelihood(y: Tensor | None) -> str:
    if y is None:
        raise ValueError("fisher_diagonal: mode = 'sampled' without labels needs likelihood = 'categorical', "
                         "'gaussian' or a sampler callable (it is inferred from the labels' dtype otherwise)")
    return "gaussian" if y.is_floating_point() else "categorical"


def _draw(output: Tensor, likelihood: Likelihood, generator: torch.Generator | None) -> Tensor:
    """A target per sample from the model's predictive distribution, with no gradient."""
    if callable(likelihood):
        return likelihood(output, generator)
    where = generator.device if generator is not None else output.device
    if likelihood == "categorical":
        probs = torch.softmax(output.detach().double(), dim=-1).to(where)
        flat = probs.reshape(-1, probs.shape[-1])
        y = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
        return y.to(output.device)
    if likelihood == "gaussian":
        noise = torch.randn(output.shape, generator=generator, device=where, dtype=output.dtype)
        return output.detach() + noise.to(output.device)
    raise ValueError(f"fisher_diagonal: likelihood = {likelihood!r}; allowed: 'categorical', 'gaussian', "
                     "None (inferred from the labels) or a callable (output, generator) -> target")


# -- the Fisher ---------------------------------------------------------------------------------------
def _linear_layers(module: nn.Module, chosen: dict[str, Tensor]) -> dict[str, tuple[nn.Linear, list[str]]]:
    """``nn.Linear`` layers owning a selected parameter that no other module shares:
    prefix -> (layer, its selected parameter names)."""
    owners: dict[int, int] = {}
    for m in module.modules():
        # its own, not its children's, each name counted (remove_duplicate=False); None skipped
        for _, p in m.named_parameters(recurse=False, remove_duplicate=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    layers = {}
    for prefix, m in module.named_modules():
        if type(m) is not nn.Linear:
            continue
        own = list(m.named_parameters(recurse=False, remove_duplicate=False))
        names = [f"{prefix}.{k}" if prefix else k for k, _ in own]
        mine = [n for n in names if n in chosen]
        if mine and all(owners[id(p)] == 1 for _, p in own):
            layers[prefix] = (m, mine)
    return layers


def _linear_pass(module: nn.Module, state: tuple[dict[str, Tensor], dict[str, Tensor]], layers: dict,
                 loss_fn: Callable, x: Tensor, y: Tensor) -> dict[str, tuple[Tensor, Tensor] | None]:
    """Per-sample ``(delta, a)`` of each layer in ``layers``: its input rows ``a`` (B, in) and the
    per-sample gradients ``delta_n = d loss_n / d z_n`` (B, out) of its outputs ``z = W a + b``.

    One batched forward with a zero "probe" added to every layer's output; the gradient of
    ``sum_n loss_n`` with respect to the probe's row ``n`` is ``delta_n``, because sample ``n``'s
    loss depends on no other row. A layer that is not called exactly once on a (B, in) input
    maps to ``None`` (its per-sample gradient is not a single outer product).
    """
    B = x.shape[0]
    seen: dict[str, list[Tensor]] = {p: [] for p in layers}
    dtype = next(iter(state[0].values())).dtype
    probes = {p: torch.zeros(B, m.out_features, dtype=dtype, device=x.device, requires_grad=True)
              for p, (m, _) in layers.items()}

    def hook_for(prefix: str):
        def hook(mod: nn.Module, inputs: tuple, output: Tensor) -> None:
            seen[prefix].append(inputs[0].detach())
            probe = probes[prefix]
            if len(seen[prefix]) == 1 and output.shape == probe.shape:
                # in place: the layer's backward does not read its output, and a new (B, out) sum
                # cost ~5% of the closed form's time (bench_fisher)
                output.add_(probe)
        return hook

    handles = [m.register_forward_hook(hook_for(p)) for p, (m, _) in layers.items()]
    try:
        with torch.enable_grad():
            out = functional_call(module, state, (x,))
            losses = vmap(loss_fn)(out, y)
            if losses.shape != (B,):
                raise ValueError("fisher_diagonal: loss_fn must return a scalar loss for one sample; "
                                 f"got {tuple(losses.shape[1:])} per sample")
            deltas = torch.autograd.grad(losses.sum(), list(probes.values()), allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    result: dict[str, tuple[Tensor, Tensor] | None] = {}
    for (prefix, calls), delta in zip(seen.items(), deltas):
        ok = len(calls) == 1 and calls[0].dim() == 2 and calls[0].shape[0] == B
        result[prefix] = ((torch.zeros_like(probes[prefix]) if delta is None else delta), calls[0]) if ok else None
    return result


def _add_squares(partial: dict[str, Tensor], grads: Iterable[tuple[str, Tensor | None]]) -> None:
    """``partial[n] += g^2`` for one sample's gradients (``None``: the loss does not use it).
    addcmul_ reads a gradient once, where square_().sum(0) over a chunk of samples passed over
    it three times (2-5x slower)."""
    for n, g in grads:
        if g is not None:
            partial[n].addcmul_(g, g)


def _looped_squares(loss_one: Callable, own: dict[str, Tensor], x: Tensor, y: Tensor,
                    partial: dict[str, Tensor]) -> None:
    """Squared per-sample gradients of the module's parameters ``own`` added to ``partial``, one
    backward pass per sample. Where they all require gradients, the module is called as it is
    (``loss_one(None, ...)``): ``functional_call``'s swap of its parameters cost ~15% of a
    sample's time (784-1000-5); ``torch.autograd.grad`` leaves their ``.grad`` alone."""
    names = list(own)
    if all(p.requires_grad for p in own.values()):
        leaves, theta = list(own.values()), None
    else:
        leaves = [p.detach().requires_grad_() for p in own.values()]
        theta = dict(zip(names, leaves))
    accs = [partial[n] for n in names]
    with torch.enable_grad():
        for i in range(x.shape[0]):
            # the gradients live only in this zip: freed before the next backward pass, as in a
            # hand-written loop, so that no two samples' gradients are held at once
            for acc, g in zip(accs, torch.autograd.grad(loss_one(theta, x[i:i + 1], y[i], True), leaves,
                                                        allow_unused=True)):
                if g is not None:
                    acc.addcmul_(g, g)


def fisher_diagonal(
    module: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    data: object,
    *,
    max_samples: int | None = None,
    mode: Literal["empirical", "sampled"] = "empirical",
    include: Pattern | Iterable[Pattern] | None = None,
    exclude: Pattern | Iterable[Pattern] | None = None,
    generator: torch.Generator | None = None,
    chunk_size: int | None = None,
    likelihood: Likelihood | None = None,
    method: Literal["auto", "vmap", "loop"] = "auto",
) -> dict[str, Tensor]:
    """Diagonal Fisher ``F = mean_n (d loss_n / d theta)^2`` of the selected parameters.

    Args:
        module: any ``nn.Module`` mapping a batch ``x`` (B, ...) to outputs (B, ...), batch first,
            that treats samples independently. It is evaluated as it is (call ``module.eval()``
            first if it has dropout or batch norm) and is not changed. Computed on the module's
            device.
        loss_fn: the loss of *one* sample, ``loss_fn(output, target) -> scalar``, where
            ``output`` is the module's output for that sample without the batch dimension and
            ``target`` its label, e.g. ``lambda f, y: F.cross_entropy(f, y)`` or
            ``lambda f, y: 0.5 * ((f - y) ** 2).sum()``.
        data: one batch ``(x, y)``, or an iterable of batches (a ``DataLoader``, a list of
            tuples). A batch is a tuple/list whose first two entries are ``x`` and ``y``
            (further entries are ignored; ``y`` may be ``None`` in sampled mode) or a dict with
            keys ``"x"`` and ``"y"``. Floating ``x`` and ``y`` are cast to the parameters' dtype.
        max_samples: use at most this many samples in total (the first ones; the last batch is
            cut); default all of ``data``.
        mode: ``"empirical"`` (the data's labels) or ``"sampled"`` (labels drawn from the
            model, one per sample; see the module docstring).
        include, exclude: which parameters count (glob or regex patterns on their names, see
            :func:`select_parameters`); e.g. ``exclude="heads*"`` leaves out task heads.
        generator: random numbers of the sampled labels (its device is where they are drawn);
            default the global generator.
        chunk_size: samples whose per-sample gradients are held at once; default: as many as
            fit in 6 million gradient entries on a CPU (24 MB in float32, cache-sized) or
            ``2^27`` on a GPU, at least one.
        likelihood: the model's predictive distribution in sampled mode: ``"categorical"``,
            ``"gaussian"`` or a callable ``(output (B, ...), generator) -> target (B, ...)``;
            default inferred from the labels (integer -> categorical, floating -> gaussian).
        method: ``"vmap"``: every selected parameter's per-sample gradients from ``torch.func``
            (``vmap`` of ``grad``), materialised a chunk at a time. ``"loop"``: one backward
            pass per sample, each gradient squared into the sum as it comes (the definition).
            ``"auto"`` (default): for the weight and bias of an ``nn.Linear`` layer called once
            per forward on a (B, in) input, the per-sample gradient is the outer product
            ``delta_n a_n^T`` of the output gradient and the input, so
            ``sum_n (delta_n a_n^T)^2 = (delta^2)^T (a^2)``, one matrix product, exact, without
            materialising the gradients (``bench/bench_fisher.py``, 784-1000-5 network, 1 CPU
            thread: level with a hand-written closed form, ~20x faster than a per-sample loop);
            the other parameters take ``"vmap"`` on a GPU or while their per-sample
            gradient has at most ``2^17`` entries, ``"loop"`` above that on a CPU (there vmap's
            batched outer products and out-of-cache chunks cost more than a backward pass per
            sample: 0.25-0.8x the loop's speed at 785k entries).

    Returns:
        name -> ``F`` with the parameter's shape, dtype and device.
    """
    if mode not in _MODES:
        raise ValueError(f"fisher_diagonal: mode = {mode!r}; allowed: 'empirical' or 'sampled'")
    if method not in ("auto", "vmap", "loop"):
        raise ValueError(f"fisher_diagonal: method = {method!r}; allowed: 'auto', 'vmap' or 'loop'")
    if max_samples is not None and (isinstance(max_samples, bool) or int(max_samples) != max_samples
                                    or max_samples < 1):
        raise ValueError(f"fisher_diagonal: max_samples = {max_samples!r}; allowed: a positive integer or None (all)")
    if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) != chunk_size or chunk_size < 1):
        raise ValueError(f"fisher_diagonal: chunk_size = {chunk_size!r}; allowed: a positive integer or None")
    if not callable(loss_fn):
        raise TypeError(f"fisher_diagonal: loss_fn = {loss_fn!r} is not callable; it must map (output, target) "
                        "of one sample to a scalar loss")
    if likelihood is not None and not callable(likelihood) and likelihood not in ("categorical", "gaussian"):
        raise ValueError(f"fisher_diagonal: likelihood = {likelihood!r}; allowed: 'categorical', 'gaussian', "
                         "None or a callable (output, generator) -> target")
    chosen = select_parameters(module, include, exclude)
    params = {n: p.detach() for n, p in chosen.items()}
    fixed = {n: p.detach() for n, p in module.named_parameters() if n not in params}
    fixed.update({n: b for n, b in module.named_buffers()})
    ref = next(iter(params.values()))
    device, dtype = ref.device, ref.dtype
    # the Linear layers take the closed form unless the first chunk shows they do not qualify
    linear = _linear_layers(module, params) if method == "auto" else {}
    planned = False
    looped: bool | None = None  # the non-closed-form parameters: one backward pass per sample
    vmapped, constants = dict(params), fixed  # what vmap differentiates, and everything else

    def loss_one(theta: dict[str, Tensor] | None, x: Tensor, y: Tensor, batched: bool = False) -> Tensor:
        """One sample's loss at ``theta`` (None: the module's own parameters, as they are); ``x`` is
        the sample, or a batch of it alone if ``batched``."""
        batch = x if batched else x.unsqueeze(0)
        out = module(batch) if theta is None else functional_call(module, (theta, constants), (batch,))
        loss = loss_fn(out.squeeze(0), y)
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise ValueError(f"fisher_diagonal: loss_fn must return a scalar loss for one sample; got {shape}")
        return loss

    per_sample_grads = vmap(grad(loss_one), in_dims=(None, 0, 0))
    budget = _CHUNK_ELEMENTS["cuda" if device.type == "cuda" else "cpu"]
    # accumulate in float64: a sum of 10^4..10^5 squares in float32 would lose ~4 digits. The
    # per-sample squares of vmapped parameters first go into a partial sum in their own dtype,
    # flushed every ~256 samples (float64 traffic per chunk of 8 would cost ~10% of the time).
    partial: dict[str, Tensor] = {}
    unflushed = 0
    seen = 0
    # callable from validation hooks: inference mode off (autograd is needed), a no_grad context
    # is fine (grad and the closed form's pass switch gradients on themselves)
    with torch.inference_mode(False):
        # float64 sums, made at their first term (a float64 copy of it: a zeroed array and an add
        # cost ~3 ms a call for 785k entries, 5% of bench_fisher's 500-sample rows)
        total: dict[str, Tensor] = {}

        def add(n: str, term: Tensor) -> None:
            if n in total:
                total[n] += term  # promoted to float64 in place, exact
            else:
                total[n] = term.to(torch.float64, copy=True)
        for x, y in _batches(data):
            if max_samples is not None and seen >= max_samples:
                break
            x = x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)
            x = x.clone() if x.is_inference() else x  # made under inference_mode: not differentiable
            if y is not None:
                y = y.to(device=device, dtype=dtype if y.is_floating_point() else y.dtype)
                y = y.clone() if y.is_inference() else y
                if y.shape[0] != x.shape[0]:
                    raise ValueError(f"fisher_diagonal: a batch has {x.shape[0]} inputs but {y.shape[0]} labels")
            elif mode == "empirical":
                raise ValueError("fisher_diagonal: mode = 'empirical' needs labels; got a batch with y = None")
            take = x.shape[0] if max_samples is None else min(x.shape[0], max_samples - seen)
            a = 0
            while a < take:
                # gradient entries held at once: per-sample gradients of the vmapped parameters, or
                # the Linear layers' inputs, outputs, probes, output gradients and the backward's
                # intermediates (~in + 4 out a layer: 1,034 samples a chunk for 784-1000-5, near the
                # best chunk of bench_fisher's hand-written closed form, 1,000)
                width = (sum(p.numel() for p in vmapped.values()) if planned and vmapped else
                         sum(m.in_features + 4 * m.out_features for m, _ in linear.values()) if planned else
                         sum(p.numel() for p in params.values()))
                # the loop holds one sample's gradients whatever the chunk: chunks of the flush interval
                b = min(take, a + (int(chunk_size) if chunk_size is not None else 256 if looped
                                   else max(1, budget // max(width, 1))))
                xc = x[a:b]
                if mode == "sampled":
                    with torch.no_grad():
                        out = functional_call(module, (params, fixed), (xc,))
                    yc = _draw(out, likelihood if likelihood is not None else _infer_likelihood(y), generator)
                else:
                    yc = y[a:b]
                if linear:
                    found = _linear_pass(module, (params, fixed), linear, loss_fn, xc, yc)
                    if not planned:  # the first chunk decides which layers take the closed form
                        linear = {p: linear[p] for p, r in found.items() if r is not None}
                        found = {p: found[p] for p in linear}
                    elif any(r is None for r in found.values()):
                        raise RuntimeError("fisher_diagonal: a Linear layer was called differently on a later "
                                           "batch than on the first; use method='vmap'")
                    for prefix, (delta, inp) in found.items():
                        m, names = linear[prefix]
                        d2 = delta.detach().pow(2)
                        for n in names:
                            # added in float64 in place (promoted, exact): no float64 copy of the block
                            add(n, d2.T @ inp.pow(2) if n.endswith("weight") else d2.sum(0))
                if not planned:
                    fast = {n for _, names in linear.values() for n in names}
                    vmapped = {n: p for n, p in params.items() if n not in fast}
                    constants = {**fixed, **{n: p for n, p in params.items() if n in fast}}
                    planned = True
                if vmapped:
                    if looped is None:  # the first chunk: vmap or one backward pass per sample
                        width = sum(p.numel() for p in vmapped.values())
                        looped = method == "loop" or (method == "auto" and device.type != "cuda"
                                                      and width > _LOOP_WIDTH)
                        partial = {n: torch.zeros_like(p) for n, p in vmapped.items()}
                    if looped:
                        _looped_squares(loss_one, {n: chosen[n] for n in vmapped}, xc, yc, partial)
                    else:
                        g = per_sample_grads(vmapped, xc, yc)
                        for i in range(b - a):
                            _add_squares(partial, ((n, g[n][i]) for n in g))
                    unflushed += b - a
                    if unflushed >= 256:
                        for n, s in partial.items():
                            add(n, s)
                            s.zero_()
                        unflushed = 0
                a = b
            seen += take
        if seen == 0:
            raise ValueError("fisher_diagonal: data holds no samples")
        for n, s in partial.items():
            add(n, s)
        return {n: total[n].div_(seen).to(params[n].dtype) for n in params}


def fisher_summary(fisher: Mapping[str, Tensor] | Tensor, *, rtol: float = 1e-6) -> dict[str, float]:
    """Summary statistics of a diagonal Fisher over all its entries, for logging.

    Returns ``mean``, ``max``, ``sum`` (the trace of the diagonal Fisher) and ``near_zero``:
    the fraction of entries ``F_i <= rtol * max F`` (weights the penalty leaves almost free;
    1.0 if ``F`` is identically zero).
    """
    if not rtol >= 0:
        raise ValueError(f"fisher_summary: rtol = {rtol}; allowed: a number >= 0")
    parts = list(fisher.values()) if isinstance(fisher, Mapping) else [fisher]
    if not parts:
        raise ValueError("fisher_summary: an empty Fisher (no parameters)")
    F = torch.cat([p.detach().flatten().double().cpu() for p in parts])
    if F.numel() == 0:
        raise ValueError("fisher_summary: the Fisher has no entries")
    top = float(F.max())
    return {"mean": float(F.mean()), "max": top, "sum": float(F.sum()),
            "near_zero": float((F <= rtol * top).double().mean())}
