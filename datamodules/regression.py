"""Regression tasks for linear networks ([L] App. E.2, [S] Sec. 3; docs/theory.md#linear-tasks).

Every task is a fixed dataset ``X`` (N, n_in), ``Y`` (N, n_out), generated from a seed. The
input-output statistics the theory uses are properties: ``sigma_x = X^T X / N`` and
``sigma_yx = Y^T X / N``. With the zoo's mean loss ``1/(2N) sum_i |y_i - W x_i|^2`` and
learning rate ``lr``, gradient descent follows ``tau dW/dt = sigma_yx - W sigma_x`` with
``tau = 1/lr`` (time in steps). For ``sigma_x = c I`` this is whitened dynamics with target
``sigma_yx / c`` and time constant ``tau / c``: ``modes()`` returns them in that form.

By default a training epoch is ``batches_per_epoch`` full batches (full-batch gradient
descent, the papers' setting); ``batch_size`` switches to shuffled minibatches. A full batch is
served from the device the model trains on (``trainer.strategy.root_device``), copied there once,
so an accelerator does not receive the same data set again at every step.

Data-parallel (one network on N > 1 processes, ``trainer.distributed_sampler_kwargs``): each rank
takes its share of every epoch's minibatches (:class:`ShardedEpochShuffle`), so that a step of N
ranks with ``batch_size`` b trains on the samples of one process's step with N b; a full batch
stays the whole task on every rank, ``batches_per_epoch`` steps an epoch as in one process.

Validation and test evaluate on the task's data set itself, as one batch: [L]'s tasks are fixed
data sets to fit (the papers study the learning dynamics, not generalisation), so the error on
them is the training error of the current weights.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Iterator, NamedTuple

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset

from zoo.training.devices import kept_on
from zoo.training.logs import batch_progress


class TaskModes(NamedTuple):
    """Whitened form of a linear task: ``sigma_yx sigma_x^-1 = U diag(s) V^T``, time scale ``c``.

    ``U`` (n_out, k), ``s`` (k,), ``V`` (n_in, k); a mode of strength ``a`` follows the whitened
    theory with target ``s`` and time constant ``tau / c`` (``c`` the input variance).
    """

    U: Tensor
    s: Tensor
    V: Tensor
    c: float


def on_model_device(datamodule: pl.LightningDataModule, *tensors: Tensor) -> tuple[Tensor, ...]:
    """``tensors`` on the device of the model that ``datamodule``'s Trainer trains
    (``trainer.strategy.root_device``), copied there once and kept on the datamodule; unchanged
    without a Trainer or on that device already. For loaders that serve a whole data set as every
    batch (``RepeatedBatch``): Lightning would otherwise copy it to the accelerator at every step."""
    trainer = getattr(datamodule, "trainer", None)
    if trainer is None:
        return tensors
    return tuple(kept_on(datamodule, t, trainer.strategy.root_device) for t in tensors)


class RepeatedBatch:
    """The whole dataset as one batch, ``repeats`` times: one epoch = ``repeats`` GD steps.

    The loader itself: Lightning runs any iterable with a length as a dataloader (on every rank as
    it is: it adds a distributed sampler to a torch ``DataLoader`` only). A ``DataLoader`` around a
    batch that never changes cost ~0.1 ms a step (its sampler, fetch and conversion, and Lightning's
    handling of a ``DataLoader``), as much as Lightning's own batch loop around a small network's GD
    step. It also indexes as a map-style dataset (every index the whole batch), as before."""

    def __init__(self, X: Tensor, Y: Tensor, repeats: int) -> None:
        self.X, self.Y, self.repeats = X, Y, repeats

    def __len__(self) -> int:
        return self.repeats

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return itertools.repeat((self.X, self.Y), self.repeats)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.X, self.Y


class DescribedByData:
    """``str()`` of a datamodule whose loaders include :class:`RepeatedBatch`: its class and data
    set, without calling its loaders. Lightning 2.6's ``LightningDataModule.__str__`` calls each
    loader method and reads torch ``DataLoader``s only: it would iterate a plain loader's batches as
    if they were loaders and fail (jsonargparse puts a datamodule's ``str`` in some of its messages)."""

    def __str__(self) -> str:
        X, Y = self.X, self.Y  # type: ignore[attr-defined]
        return f"{type(self).__name__}: {X.shape[0]} points, {X.shape[1]} inputs, {Y.shape[1]} outputs"


class EpochShuffle(Sampler[int]):
    """A fresh permutation of ``range(n)`` each epoch, drawn from ``(seed, epoch)`` alone, so any
    epoch's order is known without replaying the ones before (Lightning calls ``set_epoch``).
    ``skip`` samples are left out of the next pass only: the part of an epoch a checkpoint had
    already trained on."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.skip = n, seed, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        return iter(self.mine(self.order())[skip:])

    def order(self) -> list[int]:
        """The epoch's permutation of ``range(n)``."""
        state = int(np.random.SeedSequence([self.seed, self.epoch]).generate_state(1)[0])
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(state)).tolist()

    def mine(self, order: list[int]) -> list[int]:
        """This process's part of the epoch's ``order``: all of it."""
        return order


class ShardedEpochShuffle(EpochShuffle, DistributedSampler):
    """:class:`EpochShuffle`'s epoch dealt out to ``num_replicas`` processes: rank r takes positions
    r, r + N, r + 2N, ... of the permutation, padded with its first entries to a multiple of N (as
    ``DistributedSampler`` pads), so every rank has as many batches (a rank with one batch less
    would leave the others waiting in a collective). Batch k of every rank together is positions
    ``k N b ... (k + 1) N b - 1``: one process's batch k with batch size N b. ``skip`` counts this
    rank's own samples. A ``DistributedSampler``, so Lightning does not wrap it in another one."""

    def __init__(self, n: int, seed: int, num_replicas: int, rank: int) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"ShardedEpochShuffle: rank = {rank}, num_replicas = {num_replicas}; allowed: 0 <= rank < num_replicas")
        EpochShuffle.__init__(self, n, seed)
        self.num_replicas, self.rank = num_replicas, rank
        self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle, self.drop_last = True, False

    def __len__(self) -> int:
        return self.num_samples

    def mine(self, order: list[int]) -> list[int]:
        padded = (order * math.ceil(self.total_size / self.n))[: self.total_size]
        return padded[self.rank : self.total_size : self.num_replicas]


class ResumableLoader(DataLoader):
    """Shuffled minibatches that resume mid-epoch: the checkpoint (Lightning saves the state of a
    DataLoader that has ``state_dict``) holds how many batches of the epoch were trained on, and a
    resumed run's first pass leaves them out. ``batches_done`` reads that count from the Trainer:
    the loader itself has already drawn the batch Lightning fetches ahead."""

    def __init__(self, dataset: Dataset, batch_size: int, sampler: EpochShuffle,
                 batches_done: Callable[[], int]) -> None:
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, drop_last=False)
        self._batches_done = batches_done

    def state_dict(self) -> dict:
        return {"batches_done": int(self._batches_done())}

    def load_state_dict(self, state_dict: dict) -> None:
        done = int(state_dict["batches_done"])
        # a checkpoint at the end of an epoch resumes with the next one, from its start
        self.sampler.skip = done * self.batch_size if done < len(self) else 0


class LinearTask(DescribedByData, pl.LightningDataModule):
    """Base of the regression tasks: holds ``X``, ``Y`` and serves full batches or minibatches.

    Subclasses implement ``make(generator)`` returning ``(X, Y)``.
    """

    def __init__(self, batch_size: int | None = None, batches_per_epoch: int = 100, seed: int = 0) -> None:
        super().__init__()
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"{type(self).__name__}: batch_size = {batch_size}; allowed: a positive integer or null (full batch)")
        if batches_per_epoch < 1:
            raise ValueError(f"{type(self).__name__}: batches_per_epoch = {batches_per_epoch}; allowed: a positive integer")
        self.batch_size, self.batches_per_epoch, self.seed = batch_size, batches_per_epoch, seed
        self._X: Tensor | None = None
        self._Y: Tensor | None = None

    def make(self, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _data(self) -> tuple[Tensor, Tensor]:
        if self._X is None:
            X, Y = self.make(torch.Generator().manual_seed(self.seed))
            self._X, self._Y = X.to(torch.float32), Y.to(torch.float32)
        return self._X, self._Y  # type: ignore[return-value]

    def _full_batch(self) -> tuple[Tensor, Tensor]:
        return on_model_device(self, *self._data())  # type: ignore[return-value]

    @property
    def X(self) -> Tensor:
        return self._data()[0]

    @property
    def Y(self) -> Tensor:
        return self._data()[1]

    @property
    def n_in(self) -> int:
        return self.X.shape[1]

    @property
    def n_out(self) -> int:
        return self.Y.shape[1]

    @property
    def sigma_x(self) -> Tensor:
        X = self.X.double()
        return X.T @ X / X.shape[0]

    @property
    def sigma_yx(self) -> Tensor:
        X, Y = self.X.double(), self.Y.double()
        return Y.T @ X / X.shape[0]

    def modes(self) -> TaskModes:
        """The task's modes in whitened form; requires ``sigma_x = c I`` (else the theory does not apply)."""
        sx = self.sigma_x
        c = float(sx.diagonal().mean())
        if not torch.allclose(sx, c * torch.eye(sx.shape[0], dtype=sx.dtype), atol=1e-5 * max(c, 1e-12)):
            raise ValueError(
                f"{type(self).__name__}: the input covariance is not a multiple of the identity, so the whitened "
                "theory does not apply to this task"
            )
        U, s, Vh = torch.linalg.svd(self.sigma_yx / c, full_matrices=False)
        return TaskModes(U, s, Vh.T, c)

    def train_dataloader(self) -> RepeatedBatch | DataLoader:
        if self.batch_size is None:
            # on every rank (data-parallel too) the whole task at every step, batches_per_epoch steps an epoch
            return RepeatedBatch(*self._full_batch(), self.batches_per_epoch)
        world, rank = self._data_parallel_ranks()
        X, Y = self._data()  # minibatches are drawn on the host (Lightning moves each one)
        n = X.shape[0]
        sampler = EpochShuffle(n, self.seed) if world == 1 else ShardedEpochShuffle(n, self.seed, world, rank)
        return ResumableLoader(TensorDataset(X, Y), self.batch_size, sampler, batches_done=self._batches_done)

    def _data_parallel_ranks(self) -> tuple[int, int]:
        """(processes that share each batch, this one's rank): the strategy's sampler arguments, which
        say 1 for a member-parallel ensemble (every rank reads the whole stream) and without a Trainer."""
        trainer = getattr(self, "trainer", None)
        kwargs = trainer.distributed_sampler_kwargs if trainer is not None else None
        return (int(kwargs["num_replicas"]), int(kwargs["rank"])) if kwargs else (1, 0)

    def val_dataloader(self) -> RepeatedBatch:
        return RepeatedBatch(*self._full_batch(), 1)

    def test_dataloader(self) -> RepeatedBatch:
        return self.val_dataloader()

    def _batches_done(self) -> int:
        """Batches of the current epoch trained on (0 outside a fit)."""
        trainer = getattr(self, "trainer", None)
        return batch_progress(trainer).current.processed if trainer is not None else 0


def whiten(X: Tensor, variance: float = 1.0) -> Tensor:
    """Rows of X transformed so that ``X^T X / N = variance * I`` exactly (symmetric whitening)."""
    N = X.shape[0]
    evals, evecs = torch.linalg.eigh(X.T @ X / N)
    return X @ (evecs * (variance / evals).sqrt()) @ evecs.T


class WhitenedRegression(LinearTask):
    """Whitened random regression ([L] App. E.2.1): x ~ N(0, I) whitened to sample covariance I;
    targets independent N(0, 1/n_out), so there is no exact linear solution.
    """

    def __init__(
        self, n_in: int = 8, n_out: int = 8, num_samples: int = 64,
        batch_size: int | None = None, batches_per_epoch: int = 100, seed: int = 0,
    ) -> None:
        super().__init__(batch_size, batches_per_epoch, seed)
        if min(n_in, n_out) < 1:
            raise ValueError(f"WhitenedRegression: n_in = {n_in}, n_out = {n_out}; allowed: positive integers")
        if num_samples < n_in:
            raise ValueError(f"WhitenedRegression: num_samples = {num_samples} must be >= n_in = {n_in} to whiten the inputs")
        self.n_in_, self.n_out_, self.num_samples = n_in, n_out, num_samples

    def make(self, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        X = whiten(torch.randn(self.num_samples, self.n_in_, generator=generator, dtype=torch.float64))
        Y = torch.randn(self.num_samples, self.n_out_, generator=generator, dtype=torch.float64) / self.n_out_**0.5
        return X, Y


HIERARCHY_LABELS = torch.tensor(
    [
        [1, 1, 1, 0, 1, 0, 0, 0],
        [1, 1, 1, 0, -1, 0, 0, 0],
        [1, 1, -1, 0, 0, 1, 0, 0],
        [1, 1, -1, 0, 0, -1, 0, 0],
        [1, -1, 0, 1, 0, 0, 1, 0],
        [1, -1, 0, 1, 0, 0, -1, 0],
        [1, -1, 0, -1, 0, 0, 0, 1],
        [1, -1, 0, -1, 0, 0, 0, -1],
    ],
    dtype=torch.float64,
)
"""The eight items' features (rows = items) of [L] App. E.2.2 / Braun et al. 2022."""


def hierarchy_targets(perturb: bool = True, reverse_modes: list[int] | None = None) -> Tensor:
    """Targets of the semantic hierarchy (items as rows).

    ``perturb`` splits the repeated singular values by scaling feature column i (i = 1..8) by
    ``1 + 0.1/i`` (docs/theory.md#semantic-hierarchy). ``reverse_modes`` flips the sign of those left singular
    vectors of the task ([L] App. D.2, reversal learning): ``Y -> Y - 2 s_i (u_i v_i^T)^T``.
    """
    Y = HIERARCHY_LABELS.clone()
    if perturb:
        Y = Y * (1 + 0.1 / torch.arange(1, 9, dtype=torch.float64))
    if reverse_modes:
        U, s, Vh = torch.linalg.svd(Y.T, full_matrices=False)  # Y^T = features x items
        for i in reverse_modes:
            if not 0 <= i < len(s):
                raise ValueError(f"SemanticHierarchy: reverse_modes contains {i}; allowed: 0..{len(s) - 1}")
            Y = Y - 2 * s[i] * torch.outer(U[:, i], Vh[i]).T
    return Y


class SemanticHierarchy(LinearTask):
    """The semantic hierarchy ([L] App. E.2.2, Braun et al. 2022): one-hot items, hierarchical features.

    X = I_8 (N = 8 items), so ``sigma_x = I/8``: the whitened form has target ``Y^T`` and time
    constant ``8 tau``. ``perturb`` breaks the ties between singular values;
    ``reverse_modes`` gives the reversal-learning variant ([L] App. D.2).
    """

    def __init__(
        self, perturb: bool = True, reverse_modes: list[int] | None = None,
        batch_size: int | None = None, batches_per_epoch: int = 100, seed: int = 0,
    ) -> None:
        super().__init__(batch_size, batches_per_epoch, seed)
        self.perturb, self.reverse_modes = perturb, list(reverse_modes or [])
        hierarchy_targets(perturb, self.reverse_modes)  # validate now, before training

    def make(self, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return torch.eye(8, dtype=torch.float64), hierarchy_targets(self.perturb, self.reverse_modes)


class RankOne(LinearTask):
    """Rank-one regression ([S] Sec. 3, Eq. 1): ``sigma_yx = u s v^T``, ``sigma_x = d I``.

    Inputs are whitened to variance ``d``; targets are exactly linear, ``y = (s/d) u v^T x``.
    """

    def __init__(
        self, n_in: int = 8, n_out: int = 1, s: float = 1.0, d: float = 1.0, num_samples: int = 64,
        batch_size: int | None = None, batches_per_epoch: int = 100, seed: int = 0,
    ) -> None:
        super().__init__(batch_size, batches_per_epoch, seed)
        if s <= 0 or d <= 0:
            raise ValueError(f"RankOne: s = {s}, d = {d}; allowed: s > 0 and d > 0")
        if num_samples < n_in:
            raise ValueError(f"RankOne: num_samples = {num_samples} must be >= n_in = {n_in}")
        self.n_in_, self.n_out_, self.s, self.d, self.num_samples = n_in, n_out, s, d, num_samples

    def make(self, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        X = whiten(torch.randn(self.num_samples, self.n_in_, generator=generator, dtype=torch.float64), self.d)
        u = torch.randn(self.n_out_, generator=generator, dtype=torch.float64)
        v = torch.randn(self.n_in_, generator=generator, dtype=torch.float64)
        W = (self.s / self.d) * torch.outer(u / u.norm(), v / v.norm())
        return X, X @ W.T
