"""The skeleton of every family: :class:`ZooModule` (docs/models-skeleton.md).

What is the same in every family lives here once, under one name each:

- **Step size** ``lr``, checked by :meth:`ZooModule.check_lr`. A paper's own name for it (``eta`` in
  [S] Eqs. 6-7) and the names of earlier releases (``init_w``, ``init_encoder``) are *aliases*: a class
  lists them in ``aliases = {"eta": "lr"}`` and :meth:`ZooModule.resolve_aliases` maps them to the
  canonical name before ``__init__`` runs (for Python calls, configs, and checkpoints' hparams
  alike). An alias is a parameter of the signature (so jsonargparse and ``load_from_checkpoint``
  accept it) that ``__init__`` always sees as ``None``; the recorded hyperparameters hold only the
  canonical names (``zoo.training.hparams.save_own_hyperparameters``).
- **Init schemes**: ``init`` is the main scheme, ``init_<part>`` the others (``init_heads``,
  ``init_decoder``); one table in docs/models-skeleton.md.
- **Ensemble size**: :func:`zoo.training.ensemble.ensemble_size`, one rule for every family.
- **Members as data**: ``member_params``, one dict per member; ``labels`` are made from it.
- **Overridable steps** (``member_loss``, ``activation``, ``activation_grad``, ``loss_grad``,
  ``gates``, ``regulariser``, where a family has the concept) and the rule that picks a family's
  fast closed-form kernel: :meth:`ZooModule.overrides`.
- **Divergence**: :meth:`ZooModule.stop_if_diverged` with the family's :meth:`ZooModule.divergence_hint`.
- **Batches**: one format per kind of data (:data:`BATCH_FORMATS`), checked in one place
  (:meth:`ZooModule.check_batch`).
"""
from __future__ import annotations

import inspect
import math
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from torch import Tensor

from zoo.training.divergence import check_finite


def check_positive_ints(owner: str, **values: object) -> tuple[int, ...]:
    """Sizes as ints; a bad one is an error naming the argument, before anything is built."""
    for arg, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
            raise ValueError(f"{owner}: {arg} = {value!r}; allowed: a positive integer")
    return tuple(int(v) for v in values.values())


class _ResolvesAliases(type):
    """Maps a class's ``aliases`` to the canonical names before ``__init__`` runs: every way of
    building a module (a call, jsonargparse, ``load_from_checkpoint``) goes through here."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        # type.__call__, not super(): a super() call gives this frame a __class__ cell, which lightning
        # 2.5's save_hyperparameters takes for a module's __init__ frame (KeyError: 'self')
        return type.__call__(cls, *args, **cls.resolve_aliases(kwargs))


def _default(cls: type, name: str) -> Any:
    """The signature default of ``name`` in the first ``__init__`` of ``cls``'s MRO that has it."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            param = inspect.signature(init).parameters.get(name)
            if param is not None:
                return param.default
    return inspect.Parameter.empty


def _same(a: Any, b: Any) -> bool:
    """Whether two argument values are the same setting (init schemes by their ``spec()``)."""
    if a is b:
        return True
    spec_a, spec_b = getattr(a, "spec", None), getattr(b, "spec", None)
    if callable(spec_a) and callable(spec_b):
        return spec_a() == spec_b()
    try:
        return bool(a == b)
    except Exception:  # a tensor or another value without a plain equality
        return False


class ZooModule(pl.LightningModule, metaclass=_ResolvesAliases):
    """Base of every family (directly, or through ``MultiHeadModule`` / ``FullBatchNet``)."""

    aliases: ClassVar[dict[str, str]] = {}
    """Other names of constructor arguments, ``{alias: canonical}`` (e.g. ``{"eta": "lr"}``)."""

    fast_steps: ClassVar[tuple[str, ...]] = ()
    """The overridable steps for which the class defining this tuple has a fast closed-form kernel
    (see :meth:`overrides`)."""

    # -- one alias mechanism --------------------------------------------------------------------------
    @classmethod
    def resolve_aliases(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with every alias replaced by its canonical name; an alias left ``None`` is
        dropped. Giving both (the canonical one not at its default) is an error naming both."""
        out = dict(kwargs)
        for alias, name in cls.aliases.items():
            if alias not in out:
                continue
            value = out.pop(alias)
            if value is None:
                continue
            if out.get(name) is not None and not _same(out[name], _default(cls, name)):
                raise ValueError(f"{cls.__name__}: {name} = {out[name]!r} and {alias} = {value!r} are both given, "
                                 f"but {alias} is another name of {name}; give one of them")
            out[name] = value
        return out

    # -- checks shared by every family ----------------------------------------------------------------
    def check_lr(self, lr: float, name: str = "lr") -> float:
        """The step size as a float; not a positive finite number is an error naming it."""
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"{type(self).__name__}: {name} = {lr!r}; allowed: a positive number")
        return float(lr)

    # -- the rule that picks the fast kernels -------------------------------------------------------
    @classmethod
    def overrides(cls, name: str) -> bool:
        """Whether this class redefines the step ``name`` below the class that has a fast kernel for
        it (the nearest class in the MRO listing ``name`` in its own ``fast_steps``). True: the
        generic path runs (autograd, or step by step through the overridable methods); False: the
        family's closed-form kernel, which computes the same numbers as its own definition of ``name``."""
        owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
        family = next((k for k in cls.__mro__ if name in k.__dict__.get("fast_steps", ())), None)
        if family is None:
            raise AttributeError(f"{cls.__name__}.overrides: no class lists {name!r} in its fast_steps")
        # the family's own definition may be inherited from above it (FullBatchNet's _forward in GDLN)
        return owner is not None and owner is not family and issubclass(owner, family)

    # -- divergence -----------------------------------------------------------------------------------
    def divergence_hint(self) -> str:
        """What the message of a diverged run suggests; families with a sharper rule override it."""
        return f"lr = {self.lr} is probably too large; try lr / 10."

    def stop_if_diverged(self, losses: Tensor, step: int) -> None:
        """Stop the run, naming the step and the members, if a loss in ``losses`` ((E,) or
        (steps, E), every member's) is not finite (``zoo.training.divergence.check_finite``)."""
        check_finite(losses, step=step, labels=self.labels, hint=self.divergence_hint())

    # -- one batch format per data kind ---------------------------------------------------------------
    batch_format: ClassVar[str | None] = None
    """The kind of data the family reads, a key of :data:`BATCH_FORMATS` (None: not checked)."""

    def check_batch(self, batch: Any) -> None:
        """A batch of another form than the family's kind is an error naming what is expected
        (run by Lightning before every training and evaluation batch: a data module of the wrong
        kind fails at its first batch, not inside the arithmetic)."""
        if self.batch_format is not None and not _BATCH_CHECKS[self.batch_format](batch):
            got = (f"a dict with keys {sorted(batch)}" if isinstance(batch, dict) else
                   f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, (tuple, list)) else
                   f"a {type(batch).__name__}")
            raise TypeError(f"{type(self).__name__} reads {self.batch_format} batches: "
                            f"{BATCH_FORMATS[self.batch_format]}; got {got}")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.check_batch(batch)

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.check_batch(batch)

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.check_batch(batch)


BATCH_FORMATS = {
    "regression": "a tuple (x, y), x (N, n_in) or (E, N, n_in) and y (N, n_out) or (E, N, n_out) "
                  "(a full batch or a minibatch; E: one data set per member)",
    "stream": "a dict {'x', 'y', 'task'} (and 'step', the stream's position): the teacher-student chunks "
              "x (S, B, d), y (S, B, G), the MNIST steps x (B, 784) or (G, B, 784), y (B,) or (G, B)",
    "images": "a tuple or list (x, ...), x (B, C, H, W) in [0, 1]",
    "vectors": "x (B, d), alone, first in a tuple or list, or under 'x' in a dict",
}
"""What each kind of data module hands the families (docs/models-skeleton.md#batches)."""


def _tensors(*xs: Any) -> bool:
    return all(isinstance(x, Tensor) for x in xs)


_BATCH_CHECKS = {
    "regression": lambda b: isinstance(b, (tuple, list)) and len(b) == 2 and _tensors(*b),
    "stream": lambda b: isinstance(b, dict) and {"x", "y", "task"} <= set(b) and _tensors(b["x"], b["y"]),
    "images": lambda b: isinstance(b, (tuple, list)) and len(b) >= 1 and _tensors(b[0]) and b[0].dim() == 4,
    "vectors": lambda b: _tensors(b) or (isinstance(b, (tuple, list)) and len(b) >= 1 and _tensors(b[0]))
                         or (isinstance(b, dict) and _tensors(b.get("x"))),
}


__all__ = ["ZooModule", "check_positive_ints"]
