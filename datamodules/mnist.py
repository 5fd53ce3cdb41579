"""Continual learning on MNIST digits with a tunable task similarity ([S] App. G, Fig. 12).

Task 1 classifies 5 of the 10 digits; task 2 classifies 5 digits of which ``k = shared`` are
task 1's: ``k = 5`` is the same task again, ``k = 0`` the other five digits ([S] App. G: "0
corresponds to 5 new classes and 5 corresponds to the same 5 classes").

**Which digits, and the label each gets.** A permutation ``pi`` of the digits 0..9 is drawn
from ``seed``; with ``first_task`` (e.g. ``[0, 1, 2, 3, 4]``, [S] App. G's "first 5 classes"),
a permutation of those five followed by one of the other five. Task 1 is ``pi[0:5]``, and digit
``pi[i]`` has label ``i``. Task 2 with ``k`` shared digits is ``pi[0:k] + pi[5:10-k]``: the
first ``k`` digits of task 1 *keep their labels* ``0..k-1`` (so ``k = 5`` is exactly task 1),
and labels ``k..4`` go to the first ``5-k`` unused digits. The sets are nested: task 2 for ``k`` and for ``k+1`` differ in one digit. Or give
both lists yourself: ``task_digits=[[0, 1, 2, 3, 4], [0, 1, 5, 6, 7]]`` (label ``i`` = the
``i``-th digit of each list; ``k`` is their overlap). ``digits[s][t]`` holds the result.

**Several similarities in one fit.** ``shared`` may be a list of ``G`` values, e.g.
``[0, 1, 2, 3, 4, 5]``: there are then ``G`` data sets, one per ``k``, sharing task 1 (the same
images in the same order), and batches carry all of them at once, ``x`` (G, B, 784), as
``zoo.MultiHeadClassifier`` expects (member ``e`` trains on set ``e mod G``): a
forgetting-vs-similarity profile ([S] Fig. 12) is one run. Set ``g``'s stream equals that of a
run with ``shared = k_g`` alone.

**Several digit draws in one fit.** Which digits a task holds changes how much one digit more or
less in common matters, so a profile over ``k`` from one draw mixes similarity with the identity
of the digits. ``digit_draws = D`` repeats every ``k`` for ``D`` draws: draw ``d`` takes the
digits a run with ``seed + d`` would (its own task 1), and the ``D x G`` sets are ordered draw by
draw, named ``"k=<k>,draw=<d>"``; callbacks that group members by initialisation average over
draws as over seeds.

**Input similarity (not in [S]).** Digits share strokes, so even ``k = 0`` leaves task 2's
images close to task 1's. ``permute_new = f`` shuffles a fraction ``f`` of the pixel positions,
by one permutation drawn from ``seed``, in the images of task 2's new digits (those not in its
task 1; task 1's digits and the kept ones are untouched), in training, test and Fisher data
alike: ``f = 1`` makes the new digits share no spatial structure with task 1's (as in permuted
MNIST), so ``k = 0`` is also dissimilar in input, like orthogonal teachers in [S] Fig. 6.

**Batches** are dicts ``{"x": (B, 784) float32, "y": (B,) int64 in 0..4, "task": int,
"step": int}`` (``x`` (G, B, 784), ``y`` (G, B) with several sets): one SGD step each, the
task index saying which head to train (what a two-layer network with one head per task needs).
The schedule trains task 1 for ``epochs[0]`` passes over task 1's training images, then task 2
for ``epochs[1]`` (``steps`` gives step counts directly); both are counted in steps of task 1's
size, so every set trains the same number of steps. One Lightning epoch is the whole schedule:
train with ``max_epochs: 1``. Each task's stream is a sequence of seeded permutations of its
training images, so batch ``s`` is a function of ``(seed, s)`` only; the loader is stateful
(``datamodules.resumable.ScheduleLoader``), so a run resumed from a mid-epoch checkpoint
continues the stream exactly where it stopped.

**Evaluation.** ``test_set(task)`` gives the task's test images (the MNIST test split) with
their labels, to measure task 1 while task 2 trains (forgetting); ``fisher_data(task, n)``
gives ``n`` training samples for an EWC Fisher. ``test_dataloader`` and ``val_dataloader`` serve
the same test images, task by task, in batches of ``{"x", "y", "task"}`` (of at most
``eval_batch_size`` images): validation is the MNIST test split too (the training split is the
stream; holding part of it out would change every recipe's run), so it is what the forgetting
callbacks measure, not a separate model-selection set.

**Pixels**: ``x = pixel / 255``, and with ``normalise`` standardised with the mean and standard
deviation of all 60,000 training images (0.1307 and 0.3081 for the real MNIST), so that a
first layer ``W x / sqrt(784)`` with ``W ~ N(0, 1)`` has pre-activations of order one.

**Files** are read by :func:`datamodules.mnist_files.load_mnist` from ``data_dir/MNIST/raw``,
which is never written: the four original ``.gz`` files (md5 checked) are extracted once into the
cache folder (``$ZOO_CACHE`` or ``~/.cache/specialisation-zoo``; a log line names it), or the four
extracted ``*-ubyte`` files there are read directly (that is how unit tests pass tiny IDX files).
Missing or corrupt files are a clear error naming ``data_dir`` before training;
``download=True`` fetches missing files into the cache instead.
"""
from __future__ import annotations

import functools
import math

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.mnist_files import load_mnist
from datamodules.resumable import ScheduleLoader
from zoo.utils.labels import member_label

N_DIGITS, PER_TASK = 10, 5


def _seed(seed: int, *keys: int) -> int:
    # distinct, reproducible seeds per purpose (digits, permutation j of a stream, Fisher samples)
    s = int(seed)
    for k in keys:
        s = (s * 1_000_003 + 7919 * (int(k) + 11)) % (2**63 - 1)
    return s


class _Steps(Dataset):
    """The batches of the schedule: item ``i`` is the batch of SGD step ``i``."""

    def __init__(self, dm: "MNISTContinual") -> None:
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.num_steps

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return self.dm.batch(i)


class MNISTContinual(pl.LightningDataModule):
    """Two 5-digit MNIST classification tasks sharing ``k`` digits ([S] App. G).

    Args:
        data_dir: the folder holding ``MNIST/raw`` (only read; it may be read-only).
        shared: ``k``, how many of task 2's 5 digits are task 1's, in 0..5; a list gives one data
            set per value (see the module docstring). Required unless ``task_digits`` is given.
        task_digits: both tasks' digits in label order, ``[[5 digits], [5 digits]]``; default
            drawn from ``seed``.
        first_task: task 1's 5 digits, fixed for every draw (``[0, 1, 2, 3, 4]`` is [S] App. G's
            "first 5 classes"); ``seed`` then draws only their labels, which of them task 2 keeps
            and which of the other five come in. Default: task 1 is drawn too.
        batch_size: samples per SGD step.
        epochs: passes over task 1's training images, per task (a number: the same for both).
        steps: SGD steps per task (one number or one per task); overrides ``epochs``.
        num_test: test samples per task (the first ones of the MNIST test split); default all,
            and with several sets the smallest set's size, so every set has the same count.
        seed: seed of the digits, the training streams and the Fisher samples.
        digit_draws: how many digit draws (seeds ``seed``, ``seed + 1``, ...) each ``k`` is repeated
            for (see the module docstring); the training steps are counted in draw 0's task 1.
        permute_new: fraction in [0, 1] of the pixel positions shuffled in task 2's new digits
            (module docstring, "Input similarity"); 0, the default, is [S] App. G's construction.
        num_workers: DataLoader workers.
        normalise: standardise pixels with the training set's mean and std (else ``pixel/255``).
        download: download missing files into the cache (needs internet; default: an error).
    """

    n_tasks = 2

    def __init__(
        self,
        data_dir: str = "data",
        shared: int | list[int] | None = None,
        task_digits: list[list[int]] | None = None,
        first_task: list[int] | None = None,
        batch_size: int = 64,
        epochs: float | list[float] = 1.0,
        steps: int | list[int] | None = None,
        num_test: int | None = None,
        seed: int = 0,
        digit_draws: int = 1,
        permute_new: float = 0.0,
        num_workers: int = 0,
        normalise: bool = True,
        download: bool = False,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if isinstance(digit_draws, bool) or int(digit_draws) != digit_draws or digit_draws < 1:
            raise ValueError(f"{name}: digit_draws = {digit_draws!r}; allowed: a positive integer")
        if isinstance(permute_new, bool) or not (isinstance(permute_new, (int, float)) and 0 <= permute_new <= 1):
            raise ValueError(f"{name}: permute_new = {permute_new!r}; allowed: a fraction of pixel positions in [0, 1]")
        if digit_draws > 1 and task_digits is not None:
            raise ValueError(f"{name}: digit_draws = {digit_draws} draws digits, but task_digits fixes them; give one")
        for arg, value in (("batch_size", batch_size), ("num_test", num_test)):
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise ValueError(f"{name}: {arg} = {value!r}; allowed: a positive integer")
        if isinstance(num_workers, bool) or int(num_workers) != num_workers or num_workers < 0:
            raise ValueError(f"{name}: num_workers = {num_workers!r}; allowed: an integer >= 0")
        per_task = lambda v: list(v) if isinstance(v, (list, tuple)) else [v] * self.n_tasks  # noqa: E731
        if steps is not None:
            steps_l = per_task(steps)
            if len(steps_l) != self.n_tasks or any(isinstance(s, bool) or int(s) != s or s < 1 for s in steps_l):
                raise ValueError(f"{name}: steps = {steps!r}; allowed: a positive integer or a list of "
                                 f"{self.n_tasks} of them (one per task)")
        epochs_l = per_task(epochs)
        if len(epochs_l) != self.n_tasks or any(not (float(e) > 0 and math.isfinite(float(e))) for e in epochs_l):
            raise ValueError(f"{name}: epochs = {epochs!r}; allowed: a positive number or a list of "
                             f"{self.n_tasks} of them (one per task)")
        self.digit_draws, self.permute_new = int(digit_draws), float(permute_new)
        if first_task is not None:
            ft = list(first_task) if isinstance(first_task, (list, tuple)) else []
            if (len(ft) != PER_TASK or len(set(ft)) != PER_TASK or any(
                    isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < N_DIGITS for v in ft)):
                raise ValueError(f"{name}: first_task = {first_task!r}; allowed: 5 distinct digits in 0..9, "
                                 "e.g. [0, 1, 2, 3, 4]")
            if task_digits is not None:
                raise ValueError(f"{name}: first_task fixes task 1 and task_digits fixes both tasks; give one")
            first_task = ft
        sets = [self._digit_sets(shared, task_digits, seed + d, first_task) for d in range(self.digit_draws)]
        self.digits = [ds for digits, _ in sets for ds in digits]
        self.shared = [k for _, ks in sets for k in ks]  # one per set, draw by draw
        self.save_hyperparameters(logger=False)  # the module logs its own; equal keys (seed) may differ
        self.data_dir, self.batch_size, self.seed = data_dir, int(batch_size), int(seed)
        self.epochs, self.steps = [float(e) for e in epochs_l], None if steps is None else [int(s) for s in steps_l]
        self.num_test, self.num_workers, self.normalise, self.download = num_test, int(num_workers), normalise, download
        self._data: dict | None = None
        self._perms: dict[tuple[int, int, int, int], Tensor] = {}

    # -- which digits -------------------------------------------------------------------------------
    @staticmethod
    def _digit_sets(shared, task_digits, seed, first_task=None) -> tuple[list[list[list[int]]], list[int]]:
        name = "MNISTContinual"
        if task_digits is not None:
            lists = [list(d) for d in task_digits] if isinstance(task_digits, (list, tuple)) else []
            ok = (len(lists) == 2 and all(len(d) == PER_TASK and len(set(d)) == PER_TASK for d in lists)
                  and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < N_DIGITS
                          for d in lists for v in d))
            if not ok:
                raise ValueError(f"{name}: task_digits = {task_digits!r}; allowed: two lists of 5 distinct digits "
                                 "in 0..9, each in label order, e.g. [[0, 1, 2, 3, 4], [0, 1, 5, 6, 7]]")
            k = len(set(lists[0]) & set(lists[1]))
            if shared is not None and shared != k:
                raise ValueError(f"{name}: shared = {shared!r} but task_digits {lists} share {k} digits; "
                                 "give one of them, or shared equal to the overlap")
            return [lists], [k]
        if shared is None:
            raise ValueError(f"{name}: give shared (how many of task 2's digits are task 1's, 0..5, or a list) "
                             "or task_digits")
        ks = list(shared) if isinstance(shared, (list, tuple)) else [shared]
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= PER_TASK for k in ks):
            raise ValueError(f"{name}: shared = {shared!r}; allowed: an integer in 0..5 or a non-empty list of them")
        g = torch.Generator().manual_seed(_seed(seed, -1))
        if first_task is None:
            pi = torch.randperm(N_DIGITS, generator=g).tolist()
        else:  # the same construction within each half: task 1's digits, then the others
            rest = [d for d in range(N_DIGITS) if d not in first_task]
            pi = ([first_task[i] for i in torch.randperm(PER_TASK, generator=g).tolist()]
                  + [rest[i] for i in torch.randperm(PER_TASK, generator=g).tolist()])
        task1 = pi[:PER_TASK]
        return [[task1, pi[:k] + pi[PER_TASK:N_DIGITS - k]] for k in ks], ks

    # sizes a model must match (checked by MultiHeadClassifier.setup)
    n_in, n_classes = 784, PER_TASK

    @property
    def data_sets(self) -> int:
        """``G``, the number of data sets (one per value of ``shared`` and digit draw)."""
        return len(self.shared)

    def draw_of(self, set_index: int) -> int:
        """The digit draw of data set ``set_index``."""
        return set_index // (len(self.shared) // self.digit_draws)

    def _task1_set(self, set_index: int) -> int:
        """The set whose task 1 data set ``set_index`` trains on: the first of its draw."""
        return self.draw_of(set_index) * (len(self.shared) // self.digit_draws)

    @property
    def set_params(self) -> list[dict[str, int]]:
        """What tells the data sets apart, one dict per set (``MultiHeadClassifier.member_params``)."""
        if self.digit_draws == 1:
            return [{"k": k} for k in self.shared]
        return [{"k": k, "draw": self.draw_of(s)} for s, k in enumerate(self.shared)]

    @property
    def set_names(self) -> list[str]:
        return [member_label(p) for p in self.set_params]

    # -- the data ------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        self._load()

    def setup(self, stage: str | None = None) -> None:
        self._load()

    def raw(self, train: bool = True) -> tuple[Tensor, Tensor]:
        """All of MNIST's ``train`` (or test) split: images (n, 28, 28) uint8, digits (n,) int64."""
        return self._load()["splits"]["train" if train else "test"]

    def _load(self) -> dict:
        if self._data is None:
            splits = load_mnist(self.data_dir, self.download, type(self).__name__)
            X, D = splits["train"]
            pix = X.double() / 255.0
            mean, std = (float(pix.mean()), float(pix.std())) if self.normalise else (0.0, 1.0)
            data: dict = {"splits": splits, "mean": mean, "std": std, "index": {}}
            for split, (_, digits) in splits.items():
                for s, per_set in enumerate(self.digits):
                    for t, ds in enumerate(per_set):
                        idx = torch.cat([torch.nonzero(digits == d).flatten() for d in ds]).sort().values
                        empty = [d for d in ds if not bool((digits == d).any())]
                        if empty:
                            raise RuntimeError(f"MNISTContinual: the {split} split in {self.data_dir} has no image of "
                                               f"digit(s) {empty}, which task {t + 1} needs")
                        lut = torch.full((N_DIGITS,), -1, dtype=torch.long)
                        lut[torch.tensor(ds)] = torch.arange(PER_TASK)
                        data["index"][split, s, t] = (idx, lut[digits[idx]])  # file order, labels 0..4
            self._data = data
        return self._data

    @property
    def pixel_stats(self) -> tuple[float, float]:
        """(mean, std) subtracted from and divided into ``pixel / 255``: the training set's, or (0, 1)."""
        d = self._load()
        return d["mean"], d["std"]

    @functools.cached_property
    def pixel_permutation(self) -> Tensor:
        """The permutation of the 784 pixel positions applied to task 2's new digits: a random
        ``round(permute_new * 784)`` of them shuffled among themselves (identity if 0)."""
        g = torch.Generator().manual_seed(_seed(self.seed, -3))
        moved = torch.randperm(784, generator=g)[: round(self.permute_new * 784)]
        perm = torch.arange(784)
        perm[moved] = moved[torch.randperm(moved.numel(), generator=g)]
        return perm

    def _images(self, split: str, set_index: int, task: int, rows: Tensor) -> Tensor:
        """Images ``rows`` of ``split`` as task ``task`` of set ``set_index`` serves them: with
        ``permute_new``, task 2's new digits (not in the set's task 1) have their pixels permuted."""
        images, digits = self._load()["splits"][split]
        out = images[rows]
        if task > 0 and self.permute_new > 0:
            new = ~torch.isin(digits[rows], torch.tensor(self.digits[set_index][0]))
            out[new] = out[new].reshape(-1, 784)[:, self.pixel_permutation].reshape(-1, 28, 28)
        return out

    def _pixels(self, images: Tensor) -> Tensor:
        d = self._load()
        return (images.reshape(*images.shape[:-2], 784).float() / 255.0 - d["mean"]) / d["std"]

    def train_size(self, task: int, set_index: int = 0) -> int:
        """Training images of ``task`` in data set ``set_index``."""
        return int(self._load()["index"]["train", set_index, task][0].numel())

    # -- the schedule ---------------------------------------------------------------------------------
    @property
    def task_steps(self) -> list[int]:
        """SGD steps of each task."""
        if self.steps is not None:
            return list(self.steps)
        n1 = self.train_size(0)
        return [max(1, math.ceil(e * n1 / self.batch_size)) for e in self.epochs]

    @property
    def switch_steps(self) -> list[int]:
        """The step at which task 2 starts (a list, as ``TeacherStudent.switch_steps``)."""
        return [self.task_steps[0]]

    @property
    def num_steps(self) -> int:
        return sum(self.task_steps)

    def task_at(self, step: int) -> int:
        """The task trained at SGD step ``step``."""
        return sum(step >= s for s in self.switch_steps)

    def _stream(self, task: int, set_index: int, first: int, n: int) -> tuple[Tensor, Tensor]:
        """Positions ``first .. first+n-1`` of the task's stream: images (n, 28, 28), labels (n,).

        The stream is permutation 0 of the task's training images, then permutation 1, ...; set
        ``g`` of task 2 is keyed by its ``k``, so it equals a single-set run with that ``k``.
        """
        idx, labels = self._load()["index"]["train", set_index, task]
        N = idx.numel()
        key = 0 if task == 0 else 1 + self.shared[set_index]
        pos = torch.arange(first, first + n)
        out = torch.empty(n, dtype=torch.long)
        for j in range(first // N, (first + n - 1) // N + 1):
            perm = self._perm(task, key, j, N)
            here = (pos // N) == j
            out[here] = perm[pos[here] % N]
        return self._images("train", set_index, task, idx[out]), labels[out]

    def _perm(self, task: int, key: int, j: int, N: int) -> Tensor:
        """Permutation ``j`` of a stream (a few are cached: a batch needs one, rarely two)."""
        cache = self._perms
        if (task, key, j, N) not in cache:  # N: digit draws give one task different sizes
            if len(cache) >= 64:
                cache.pop(next(iter(cache)))
            g = torch.Generator().manual_seed(_seed(self.seed, task, key, j))
            cache[task, key, j, N] = torch.randperm(N, generator=g)
        return cache[task, key, j, N]

    def batch(self, step: int) -> dict[str, Tensor]:
        """The batch of SGD step ``step``: ``{"x", "y", "task", "step"}`` (see the module docstring)."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"MNISTContinual: step {step} outside the schedule 0..{self.num_steps - 1}")
        task = self.task_at(step)
        local = step - ([0] + self.switch_steps)[task]
        B, G = self.batch_size, self.data_sets
        if task == 0 and self.digit_draws == 1:  # the same task in every set: the same images
            imgs, y = self._stream(0, 0, local * B, B)
            x = self._pixels(imgs)
            if G > 1:
                x, y = x.expand(G, *x.shape), y.expand(G, *y.shape)
        elif task == 0:  # one task 1 per draw, shared by that draw's sets
            parts = {t: self._stream(0, t, local * B, B) for t in sorted({self._task1_set(s) for s in range(G)})}
            x = torch.stack([self._pixels(parts[self._task1_set(s)][0]) for s in range(G)])
            y = torch.stack([parts[self._task1_set(s)][1] for s in range(G)])
        else:
            parts = [self._stream(task, s, local * B, B) for s in range(G)]
            x = torch.stack([self._pixels(p[0]) for p in parts]) if G > 1 else self._pixels(parts[0][0])
            y = torch.stack([p[1] for p in parts]) if G > 1 else parts[0][1]
        return {"x": x, "y": y, "task": task, "step": step}  # ints: read on the host at every step

    def stream_fingerprint(self) -> dict:
        """What decides the batches of the stream: a checkpoint saved with other values cannot be
        continued exactly (``ScheduleLoader`` refuses it)."""
        return {"seed": self.seed, "digits": self.digits, "shared": self.shared, "batch_size": self.batch_size,
                "task_steps": self.task_steps, "permute_new": self.permute_new, "normalise": self.normalise}

    def train_dataloader(self) -> DataLoader:
        step = self.trainer.global_step if self.trainer is not None else 0
        # each item is a whole batch; a checkpoint's loader state (the next step) replaces the start
        return ScheduleLoader(_Steps(self), type(self).__name__, self.stream_fingerprint(),
                              min(step, self.num_steps), num_workers=self.num_workers)

    # -- evaluation -----------------------------------------------------------------------------------
    def _check_task(self, task: int, what: str) -> None:
        if isinstance(task, bool) or int(task) != task or not 0 <= task < self.n_tasks:
            raise ValueError(f"MNISTContinual.{what}: task = {task!r}; allowed: 0 or 1")

    def test_set(self, task: int) -> tuple[Tensor, Tensor]:
        """The test images of ``task`` (MNIST's test split, file order) and their labels 0..4:
        x (N, 784), y (N,); with several sets x (G, N, 784), y (G, N), N the same for all."""
        self._check_task(task, "test_set")
        # the same tensors on every call: evaluated again and again, they are copied to a model's device once
        cache: dict[int, tuple[Tensor, Tensor]] = self.__dict__.setdefault("_test_sets", {})
        if task not in cache:
            cache[task] = self._test_set(task)
        return cache[task]

    def _test_set(self, task: int) -> tuple[Tensor, Tensor]:
        d = self._load()
        per_set = [d["index"]["test", s, task] for s in range(self.data_sets)]
        N = min(i.numel() for i, _ in per_set)
        if self.data_sets == 1:
            N = per_set[0][0].numel()
        if self.num_test is not None:
            N = min(N, self.num_test)
        xs = [self._pixels(self._images("test", s, task, i[:N])) for s, (i, _) in enumerate(per_set)]
        ys = [lab[:N] for _, lab in per_set]
        return (xs[0], ys[0]) if self.data_sets == 1 else (torch.stack(xs), torch.stack(ys))

    def fisher_data(self, task: int, n: int) -> tuple[Tensor, Tensor]:
        """``n`` training samples of ``task`` (drawn without replacement from their own seed; at
        most the smallest set's size): x (n, 784), y (n,), or (G, n, 784), (G, n)."""
        self._check_task(task, "fisher_data")
        if isinstance(n, bool) or int(n) != n or n < 1:
            raise ValueError(f"MNISTContinual.fisher_data: n = {n!r}; allowed: a positive integer")
        d = self._load()
        xs, ys = [], []
        sets = range(self.data_sets) if task > 0 else [self._task1_set(s) for s in range(self.data_sets)]
        m = min(n, min(self.train_size(task, s) for s in sets))
        for s in sets:
            idx, labels = d["index"]["train", s, task]
            key = 0 if task == 0 else 1 + self.shared[s]
            g = torch.Generator().manual_seed(_seed(self.seed, -2, task, key))
            pick = torch.randperm(idx.numel(), generator=g)[:m]
            xs.append(self._pixels(self._images("train", s, task, idx[pick])))
            ys.append(labels[pick])
        return (xs[0], ys[0]) if self.data_sets == 1 else (torch.stack(xs), torch.stack(ys))

    eval_batch_size = 1000
    """Test images per evaluation batch (an ensemble evaluates every member on each)."""

    def _eval_loader(self) -> DataLoader:
        batches = []
        for task in range(self.n_tasks):
            x, y = self.test_set(task)
            for a in range(0, y.shape[-1], self.eval_batch_size):
                batches.append({"x": x[..., a:a + self.eval_batch_size, :], "y": y[..., a:a + self.eval_batch_size],
                                "task": task})
        return DataLoader(batches, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader()

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader()
