"""The init registry: every initialisation scheme of the papers, keyed by name.

A scheme is a small typed object (``zoo.init.build("lambda_balanced", lam=2.0, scale=0.1)``)
that fills the weights of a module, given their shapes, in input-to-output order. Modules take
schemes as typed constructor arguments, so a YAML config selects and parameterises them::

    init:
      class_path: LambdaBalanced
      init_args: {lam: [-4.0, 0.0, 4.0], scale: 0.001}

A parameter given as a list makes an *ensemble*: member ``i`` uses the ``i``-th value (all list
parameters of one scheme have the same length, or length 1). Definitions:
docs/theory.md#init-schemes; [L] Def. A.1 (lambda-balanced), [S] Sec. 4.2 (polar), [S] Sec. 3.2 / App. D (gain),
[S] App. H (imbalance), [S] App. G (entropy mix).

Weights are returned as tensors of shape ``(E, out, in)`` (``E`` ensemble members), drawn in
float64 and cast to the requested dtype.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import ClassVar, Literal

import torch
from torch import Tensor

Shape = tuple[int, int]
Scalars = float | list[float]

REGISTRY: dict[str, type["InitScheme"]] = {}


def register(name: str) -> Callable[[type["InitScheme"]], type["InitScheme"]]:
    """Class decorator adding a scheme to ``REGISTRY`` under ``name`` (a duplicate raises)."""

    def add(cls: type[InitScheme]) -> type[InitScheme]:
        if name in REGISTRY:
            raise ValueError(f"init scheme {name!r} is already registered (by {REGISTRY[name].__qualname__})")
        if not (isinstance(cls, type) and issubclass(cls, InitScheme)):
            raise TypeError(f"@register({name!r}) needs a subclass of zoo.init.InitScheme, got {cls!r}")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return add


def build(name: str, **params: object) -> "InitScheme":
    """Create the scheme registered as ``name`` with ``params``."""
    if name not in REGISTRY:
        raise ValueError(f"unknown init scheme {name!r}; registered: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name](**params)  # type: ignore[arg-type]


def from_spec(spec: "InitScheme | dict") -> "InitScheme":
    """The scheme described by ``spec`` (as returned by ``InitScheme.spec``); a scheme passes through."""
    if isinstance(spec, InitScheme):
        return spec
    import importlib

    module, _, name = str(spec["class_path"]).rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, InitScheme)):
        raise ValueError(f"init: {spec['class_path']!r} is not an init scheme (a subclass of zoo.init.InitScheme)")
    return cls(**spec.get("init_args", {}))


def _as_list(value: Scalars) -> list[float]:
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]


class InitScheme:
    """Base class of all schemes. ``params`` is the public mapping of every numeric parameter to its
    values (one per member, or one shared by all); subclasses set them with ``_member``. Choices
    that are not numbers (``EntropyMix.base``, ``Kaiming.mode``) are attributes, and in ``spec()``."""

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self.params: dict[str, list[float]] = {}
        self._extra: dict[str, object] = {}  # non-numeric constructor arguments (e.g. base)

    # -- parameters -------------------------------------------------------------------------
    def _member(self, param: str, value: Scalars, *, allowed: str, ok: Callable[[float], bool]) -> list[float]:
        """Record a per-member parameter, checking each value; the error names scheme and range."""
        values = _as_list(value)
        if not values:
            raise ValueError(f"{self.name}: parameter {param!r} is an empty list; give a number or a non-empty list")
        for v in values:
            if not (math.isfinite(v) and ok(v)):
                raise ValueError(f"{self.name}: parameter {param!r} = {v!r} is out of range; allowed: {allowed}")
        self.params[param] = values
        return values

    def checked(self) -> "InitScheme":
        """This scheme, with its list parameters checked for consistent lengths.

        Modules call it first: it also materialises a default made with jsonargparse's
        ``lazy_instance`` (whose ``__init__`` runs at the first method call).
        """
        self.ensemble_size
        return self

    @property
    def ensemble_size(self) -> int:
        """Number of members the list-valued parameters describe (1 if all are scalars)."""
        sizes = {len(v) for v in self.params.values() if len(v) > 1}
        if len(sizes) > 1:
            given = {k: len(v) for k, v in self.params.items()}
            raise ValueError(f"{self.name}: list parameters must have equal lengths (or length 1); got {given}")
        return sizes.pop() if sizes else 1

    def per_member(self, param: str, ensemble: int) -> Tensor:
        """Parameter ``param`` as a float64 tensor of shape (ensemble,)."""
        values = self.params[param]
        if len(values) not in (1, ensemble):
            raise ValueError(
                f"{self.name}: parameter {param!r} has {len(values)} values but the ensemble has {ensemble} members"
            )
        return torch.tensor(values * (ensemble if len(values) == 1 else 1), dtype=torch.float64)

    def member(self, e: int) -> "InitScheme":
        """The scheme of member ``e`` alone (every list parameter reduced to its ``e``-th value)."""
        import copy

        one = copy.copy(self)
        one.params = {k: [v[e] if len(v) > 1 else v[0]] for k, v in self.params.items()}
        return one

    def labels(self, ensemble: int) -> list[str]:
        """Short per-member labels from the varying parameters, e.g. ``['lam=-4', 'lam=0']``."""
        varying = [k for k, v in self.params.items() if len(v) > 1]
        if not varying:
            return [f"member{i}" for i in range(ensemble)] if ensemble > 1 else ["member0"]
        return [",".join(f"{k}={self.params[k][i]:g}" for k in varying) for i in range(ensemble)]

    # -- weights ------------------------------------------------------------------------------
    def weights(
        self,
        shapes: Sequence[Shape],
        *,
        ensemble: int = 1,
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> list[Tensor]:
        """Weights for layers of the given ``(out, in)`` shapes, input to output, each (E, out, in)."""
        self.ensemble_size  # raises on inconsistent list lengths
        shapes = [tuple(int(n) for n in s) for s in shapes]
        ws = self._draw(shapes, ensemble, generator)
        return [w.to(dtype) for w in ws]

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        raise NotImplementedError

    def _need_layers(self, shapes: list[Shape], n: int) -> None:
        if len(shapes) < n:
            raise ValueError(f"{self.name}: needs at least {n} layers (a body and a readout); got shapes {shapes}")

    def spec(self) -> dict:
        """Plain-data description ``{class_path, init_args}``: YAML- and checkpoint-safe."""
        args: dict[str, object] = {k: v[0] if len(v) == 1 else list(v) for k, v in self.params.items()}
        args.update(self._extra)
        # jsonargparse's lazy_instance defaults are dynamic subclasses: name the real class
        cls = next(c for c in type(self).__mro__
                   if issubclass(c, InitScheme) and not c.__name__.startswith("LazyInstance_"))
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": args}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v[0] if len(v) == 1 else v}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"


def _randn(E: int, shape: Shape, generator: torch.Generator | None) -> Tensor:
    return torch.randn(E, *shape, generator=generator, dtype=torch.float64)


def _uniform(E: int, shape: Shape, generator: torch.Generator | None) -> Tensor:
    """U(-1, 1) draws."""
    return 2 * torch.rand(E, *shape, generator=generator, dtype=torch.float64) - 1


def _xavier_bound(shape: Shape) -> float:
    fan_out, fan_in = shape
    return math.sqrt(6.0 / (fan_in + fan_out))


# ------------------------------------------------------------------------------------------------
# lambda-balanced ([L] Def. A.1)
# ------------------------------------------------------------------------------------------------
def random_orthogonal(E: int, n: int, generator: torch.Generator | None = None) -> Tensor:
    """Haar-random orthogonal matrices (E, n, n): QR of a Gaussian with the sign fix."""
    q, r = torch.linalg.qr(_randn(E, (n, n), generator))
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)


def _balanced_layer_strengths(S: Tensor, lam: Tensor, L: int) -> Tensor:
    """Per-layer singular values a_l (l = 1..L) with a_{l+1}^2 - a_l^2 = lam and prod a_l = S.

    S: (E, k) mode strengths of the product, lam: (E,). Returns (L, E, k). For L = 2 this is the
    closed form of docs/theory.md#lambda-balanced; deeper chains solve prod_l sqrt(c + (l-1) lam) = S for c = a_1^2
    by bisection (the left side increases in c).
    """
    lam = lam[:, None]
    if L == 2:
        root = torch.sqrt(lam**2 + 4 * S**2)
        return torch.stack([torch.sqrt(((root - lam) / 2).clamp_min(0)), torch.sqrt(((root + lam) / 2).clamp_min(0))])
    offsets = torch.arange(L, dtype=S.dtype)[:, None, None] * lam  # (L, E, 1)
    lo = (-offsets.min(dim=0).values).clamp_min(0).expand_as(S).clone()  # smallest c with all a_l^2 >= 0
    hi = lo + S.max().clamp_min(1.0) ** (2.0 / L) + lam.abs().max() * L + 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        prod = torch.sqrt((mid + offsets).clamp_min(0)).prod(dim=0)
        too_big = prod > S
        hi = torch.where(too_big, mid, hi)
        lo = torch.where(too_big, lo, mid)
    return torch.sqrt(((lo + hi) / 2 + offsets).clamp_min(0))


def lambda_balanced_factors(
    product: Tensor, lam: Tensor, depth: int = 2, n_hidden: int | None = None,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """Factor ``product`` (E, n_out, n_in) into ``depth`` lambda-balanced layers.

    Returns [W1, ..., W_depth] (input to output) with ``W_{l+1}^T W_{l+1} - W_l W_l^T = lam I`` for
    every consecutive pair, and ``W_depth ... W1`` equal to ``product`` truncated to its top
    ``n_hidden`` singular modes (docs/theory.md#lambda-balanced, construction verified to 1e-15). Hidden layers
    all have width ``n_hidden`` (default min(n_in, n_out)); for lam != 0 it must not exceed
    min(n_in, n_out). Random orthogonal hidden bases make the factors generic.
    """
    E, n_out, n_in = product.shape
    k = min(n_in, n_out)
    n_h = k if n_hidden is None else n_hidden
    U, S, Vh = torch.linalg.svd(product.to(torch.float64), full_matrices=False)
    m = min(n_h, k)
    U, S, Vh = U[..., :m], S[..., :m], Vh[..., :m, :]
    if n_h > m:  # lam = 0 only (checked by callers): zero-padded extra hidden units stay balanced
        U = torch.cat([U, U.new_zeros(E, n_out, n_h - m)], -1)
        Vh = torch.cat([Vh, Vh.new_zeros(E, n_h - m, n_in)], -2)
        S = torch.cat([S, S.new_zeros(E, n_h - m)], -1)
    a = _balanced_layer_strengths(S, lam.to(torch.float64), depth)  # (depth, E, n_h)
    Rs = [random_orthogonal(E, n_h, generator) for _ in range(depth - 1)]
    ws = []
    for layer in range(depth):
        left = U if layer == depth - 1 else Rs[layer]
        right = Vh if layer == 0 else Rs[layer - 1].transpose(-1, -2)
        ws.append(left * a[layer].unsqueeze(-2) @ right)
    return ws


@register("lambda_balanced")
class LambdaBalanced(InitScheme):
    """Lambda-balanced weights ([L] Def. A.1): ``W2^T W2 - W1 W1^T = lam I``.

    The product ``W_L...W_1`` is ``scale * randn(n_out, n_in)`` truncated to the hidden width
    (or a given product, e.g. aligned with a task). ``lam > 0`` puts the scale in the readout,
    ``lam < 0`` in the input layer; ``|lam|`` large is lazy, ``lam = 0`` rich. Deeper chains are
    balanced pairwise (``W_{l+1}^T W_{l+1} - W_l W_l^T = lam I``) and need equal hidden widths.

    Args:
        lam: the imbalance, one value or one per ensemble member.
        scale: standard deviation of the entries of the initial network map (> 0).
    """

    def __init__(self, lam: Scalars = 0.0, scale: Scalars = 1e-3) -> None:
        super().__init__()
        self._member("lam", lam, allowed="any finite real number", ok=lambda v: True)
        self._member("scale", scale, allowed="a positive number (std of the initial map)", ok=lambda v: v > 0)

    def _check(self, shapes: list[Shape], lam: Tensor) -> int:
        self._need_layers(shapes, 2)
        n_in, n_out = shapes[0][1], shapes[-1][0]
        hidden = [s[0] for s in shapes[:-1]]
        for a, b in zip(shapes[:-1], shapes[1:]):
            if a[0] != b[1]:
                raise ValueError(f"{self.name}: layer shapes {shapes} do not chain")
        if len(set(hidden)) > 1:
            raise ValueError(f"{self.name}: deep chains need equal hidden widths; got {hidden}")
        n_h = hidden[0]
        if n_h > min(n_in, n_out) and bool((lam != 0).any()):
            raise ValueError(
                f"{self.name}: lam={self.params['lam']} needs hidden width n_h <= min(n_in, n_out) = "
                f"{min(n_in, n_out)}, got n_h = {n_h}: a wider hidden layer cannot be lambda-balanced "
                "for lam != 0 (W2^T W2 would need full rank n_h) [L] assumption A3; use lam = 0 or narrow it"
            )
        return n_h

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        scale = self.per_member("scale", E)[:, None, None]
        product = scale * _randn(E, (shapes[-1][0], shapes[0][1]), generator)
        return self.factor(product, shapes, generator)

    def factor(self, product: Tensor, shapes: Sequence[Shape], generator: torch.Generator | None = None) -> list[Tensor]:
        """Balanced layers of the given shapes whose map is ``product`` (E, n_out, n_in)."""
        shapes = [tuple(s) for s in shapes]
        E = product.shape[0]
        lam = self.per_member("lam", E)
        n_h = self._check(shapes, lam)
        return lambda_balanced_factors(product, lam, depth=len(shapes), n_hidden=n_h, generator=generator)


# ------------------------------------------------------------------------------------------------
# readout and scale schemes of [S]
# ------------------------------------------------------------------------------------------------
@register("polar")
class Polar(InitScheme):
    """Polar readout ([S] Sec. 4.2): ``h(0) = (r cos theta, r sin theta)`` for p = 2 hidden units.

    theta = 0 is one active unit (specialised), theta = pi/4 two identical units.
    """

    def __init__(self, r: Scalars = 1.0, theta: Scalars = 0.0) -> None:
        super().__init__()
        self._member("r", r, allowed="r >= 0 (the readout norm)", ok=lambda v: v >= 0)
        self._member("theta", theta, allowed="any finite angle in radians", ok=lambda v: True)

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        if len(shapes) != 1 or shapes[0] != (1, 2):
            raise ValueError(
                f"{self.name}: fills one readout of shape (1, 2) (p = 2 hidden units, one output); got {shapes}. "
                "Polar coordinates exist only for p = 2"
            )
        r, theta = self.per_member("r", E), self.per_member("theta", E)
        return [torch.stack([r * torch.cos(theta), r * torch.sin(theta)], -1)[:, None, :]]


@register("gain")
class Gain(InitScheme):
    """Xavier-uniform with gain g on the body and 1/g on the readout ([S] Sec. 3.2, App. D).

    Body layer bound ``g sqrt(6/(fan_in+fan_out))``, readout (last layer) bound with ``1/g``.
    g = 1 is the standard initialisation; the paper sweeps g in [0.3, 3].
    """

    def __init__(self, g: Scalars = 1.0) -> None:
        super().__init__()
        self._member("g", g, allowed="g > 0", ok=lambda v: v > 0)

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        self._need_layers(shapes, 2)
        g = self.per_member("g", E)[:, None, None]
        gains = [g] * (len(shapes) - 1) + [1 / g]
        return [k * _xavier_bound(s) * _uniform(E, s, generator) for k, s in zip(gains, shapes)]


@register("imbalance")
class Imbalance(InitScheme):
    """Imbalance v ([S] App. H): first layer N(0, (sigma/v)^2), last N(0, (sigma v)^2).

    Layers in between (if any) get N(0, sigma^2). v > 1 is output-heavy (the implicit SAE).
    """

    def __init__(self, v: Scalars = 1.0, sigma: Scalars = 1e-3) -> None:
        super().__init__()
        self._member("v", v, allowed="v > 0", ok=lambda x: x > 0)
        self._member("sigma", sigma, allowed="sigma > 0", ok=lambda x: x > 0)

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        self._need_layers(shapes, 2)
        v, sigma = self.per_member("v", E)[:, None, None], self.per_member("sigma", E)[:, None, None]
        stds = [sigma / v] + [sigma] * (len(shapes) - 2) + [sigma * v]
        return [std * _randn(E, s, generator) for std, s in zip(stds, shapes)]


@register("entropy_mix")
class EntropyMix(InitScheme):
    """Interpolation between a uniform and a normal/Laplace draw at fixed variance ([S] App. G).

    ``w = sigma (gamma u + (1 - gamma) z) / sqrt(gamma^2 + (1 - gamma)^2)`` with ``u`` uniform and
    ``z`` normal (or Laplace), both of unit variance and independent, so ``Var w = sigma^2`` for
    every gamma. gamma = 1 is the uniform draw, whose magnitudes are most even (highest entropy
    of the normalised weights, [S] Eq. 10); gamma = 0 the heavier-tailed base (lower entropy).
    ``base = "sparse"`` is a much lower-entropy base than [S]'s examples: a fraction ``density``
    of the weights normal, the rest exactly 0, scaled to unit variance. ``base = "units"``
    concentrates on units instead, as [S]'s polar readout does at theta = 0 ([S] Eq. 10's entropy
    is over units, ``|h_i|``): only the first ``ceil(density n)`` of the ``n`` units a weight
    matrix reads from (its last axis; a head's hidden units) carry normal weights. The same
    units for every head, as theta = 0 puts every head on the same unit; hidden units are
    exchangeable under a random first layer, so "the first" loses nothing.
    """

    def __init__(self, gamma: Scalars = 1.0, sigma: Scalars = 1e-3, base: Literal["normal", "laplace", "sparse", "units"] = "normal",
                 density: float = 0.1) -> None:
        super().__init__()
        self._member("gamma", gamma, allowed="0 <= gamma <= 1 (relative entropy)", ok=lambda v: 0 <= v <= 1)
        self._member("sigma", sigma, allowed="sigma >= 0", ok=lambda v: v >= 0)
        if base not in ("normal", "laplace", "sparse", "units"):
            raise ValueError(f"{self.name}: parameter 'base' = {base!r}; allowed: 'normal', 'laplace', 'sparse' or 'units'")
        if not 0 < density <= 1:
            raise ValueError(f"{self.name}: parameter 'density' = {density!r}; allowed: 0 < density <= 1")
        self.base = self._extra["base"] = base
        if base in ("sparse", "units"):
            self.density = self._extra["density"] = float(density)

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        gamma, sigma = self.per_member("gamma", E)[:, None, None], self.per_member("sigma", E)[:, None, None]
        norm = torch.sqrt(gamma**2 + (1 - gamma) ** 2)
        out = []
        for s in shapes:
            u = math.sqrt(3.0) * _uniform(E, s, generator)  # unit variance
            if self.base == "normal":
                z = _randn(E, s, generator)
            elif self.base == "sparse":
                keep = torch.rand(E, *s, generator=generator, dtype=torch.float64) < self.density
                z = _randn(E, s, generator) * keep / math.sqrt(self.density)
            elif self.base == "units":
                m = math.ceil(self.density * s[-1])
                keep = torch.zeros(s[-1], dtype=torch.float64)
                keep[:m] = 1.0
                z = _randn(E, s, generator) * keep * math.sqrt(s[-1] / m)
            else:  # Laplace with unit variance: scale b = 1/sqrt(2), by inverse CDF
                p = torch.rand(E, *s, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12) - 0.5
                z = -torch.sign(p) * torch.log1p(-2 * p.abs()) / math.sqrt(2.0)
            out.append(sigma * (gamma * u + (1 - gamma) * z) / norm)
        return out


@register("pathway_grid")
class PathwayGrid(InitScheme):
    """Two pathways with imbalances (lam1, lam2) on a grid, one ensemble member per grid point
    ([S] Sec. 3.1, Fig. 3c): the network ``y = h_1 w_1 x + h_2 w_2 x`` (dims ``[1, 2, 1]``) with
    ``h_i^2 - w_i^2 = lam_i`` and initial strengths ``h_i w_i``: ``omega0`` for both, or
    Algorithm 1's common input weight ``a0`` (``w_i = a0``, ``h_i = sqrt(lam_i + a0^2)``;
    the default, with a0 = 1e-3).
    Member ``i * len(lam2) + j`` has ``(lam1[i], lam2[j])``.
    """

    def __init__(self, lam1: list[float] = [0.0, 1.0], lam2: list[float] = [0.0, 1.0],
                 omega0: float | None = None, a0: float | None = None) -> None:
        super().__init__()
        if omega0 is None and a0 is None:
            a0 = 1e-3
        self._member("lam1", lam1, allowed="finite numbers", ok=lambda v: True)
        self._member("lam2", lam2, allowed="finite numbers", ok=lambda v: True)
        if (omega0 is None) == (a0 is None):
            raise ValueError(f"{self.name}: give exactly one of 'omega0' and 'a0'; got omega0={omega0}, a0={a0}")
        if omega0 is not None and not omega0 > 0:
            raise ValueError(f"{self.name}: parameter 'omega0' = {omega0} is out of range; allowed: omega0 > 0")
        if a0 is not None and not a0 > 0:
            raise ValueError(f"{self.name}: parameter 'a0' = {a0} is out of range; allowed: a0 > 0")
        if a0 is not None and min(_as_list(lam1) + _as_list(lam2)) + a0**2 < 0:
            raise ValueError(f"{self.name}: with a0 = {a0} every lam must be >= -a0^2 (h^2 = lam + a0^2)")
        self.omega0, self.a0 = omega0, a0
        # the one given (shared by every grid point) is a parameter like the others; the other stays None
        self.params["omega0" if a0 is None else "a0"] = [float(a0 if omega0 is None else omega0)]

    @property
    def grid_shape(self) -> tuple[int, int]:
        return len(self.params["lam1"]), len(self.params["lam2"])

    @property
    def ensemble_size(self) -> int:
        n1, n2 = self.grid_shape
        return n1 * n2

    def grid(self) -> tuple[Tensor, Tensor]:
        """(lam1, lam2) of every member, each (E,)."""
        l1 = torch.tensor(self.params["lam1"], dtype=torch.float64)
        l2 = torch.tensor(self.params["lam2"], dtype=torch.float64)
        L1, L2 = torch.meshgrid(l1, l2, indexing="ij")
        return L1.flatten(), L2.flatten()

    def labels(self, ensemble: int) -> list[str]:
        l1, l2 = self.grid()
        return [f"lam1={a:g},lam2={b:g}" for a, b in zip(l1.tolist(), l2.tolist())]

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        if shapes != [(2, 1), (1, 2)]:
            raise ValueError(f"{self.name}: fills a [1, 2, 1] network (two scalar pathways); got shapes {shapes}")
        if E != self.ensemble_size:
            raise ValueError(f"{self.name}: the grid has {self.ensemble_size} points but the ensemble has {E} members")
        lam = torch.stack(self.grid(), -1)  # (E, 2)
        if self.a0 is not None:
            w = torch.full_like(lam, self.a0)
            h = torch.sqrt(lam + self.a0**2)
        else:
            root = torch.sqrt(lam**2 + 4 * self.omega0**2)
            h, w = torch.sqrt((root + lam) / 2), torch.sqrt((root - lam) / 2)
        return [w[:, :, None], h[:, None, :]]


# ------------------------------------------------------------------------------------------------
# plain schemes
# ------------------------------------------------------------------------------------------------
@register("gaussian")
class Gaussian(InitScheme):
    """I.i.d. N(0, sigma^2) entries in every layer (the students' ``sigma_w`` of [S] Sec. 4)."""

    def __init__(self, sigma: Scalars = 1e-3) -> None:
        super().__init__()
        self._member("sigma", sigma, allowed="sigma >= 0", ok=lambda v: v >= 0)

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        sigma = self.per_member("sigma", E)[:, None, None]
        return [sigma * _randn(E, s, generator) for s in shapes]


@register("xavier")
class Xavier(InitScheme):
    """Xavier/Glorot uniform, bound ``gain sqrt(6/(fan_in+fan_out))``, in every layer."""

    def __init__(self, gain: Scalars = 1.0) -> None:
        super().__init__()
        self._member("gain", gain, allowed="gain > 0", ok=lambda v: v > 0)

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        gain = self.per_member("gain", E)[:, None, None]
        return [gain * _xavier_bound(s) * _uniform(E, s, generator) for s in shapes]


@register("kaiming")
class Kaiming(InitScheme):
    """Kaiming/He normal: std ``gain / sqrt(fan)``; gain sqrt(2) suits ReLU, 1 a linear layer."""

    def __init__(self, gain: Scalars = math.sqrt(2.0), mode: Literal["fan_in", "fan_out"] = "fan_in") -> None:
        super().__init__()
        self._member("gain", gain, allowed="gain > 0", ok=lambda v: v > 0)
        if mode not in ("fan_in", "fan_out"):
            raise ValueError(f"{self.name}: parameter 'mode' = {mode!r}; allowed: 'fan_in' or 'fan_out'")
        self.mode = self._extra["mode"] = mode

    def _draw(self, shapes: list[Shape], E: int, generator: torch.Generator | None) -> list[Tensor]:
        gain = self.per_member("gain", E)[:, None, None]
        return [gain / math.sqrt(s[1] if self.mode == "fan_in" else s[0]) * _randn(E, s, generator) for s in shapes]


__all__ = [
    "REGISTRY", "register", "build", "from_spec", "InitScheme", "LambdaBalanced", "Polar", "Gain", "Imbalance",
    "EntropyMix", "PathwayGrid", "Gaussian", "Xavier", "Kaiming", "lambda_balanced_factors", "random_orthogonal",
]
