"""Teacher-student continual-learning tasks ([S] Sec. 4, Eq. 5; docs/theory.md#teachers).

Inputs ``x ~ N(0, I_d)`` are streamed online: every SGD step sees fresh samples (unless
``num_samples`` fixes a finite pool). Task ``t`` is labelled by the teacher
``y = h_T^(t) . phi(W_T^(t) x / sqrt d)`` (``p*`` hidden units, no output scaling), with rows of
``W_T^(t)`` of norm ``sqrt d`` so that ``T_nn = 1``. Later teachers share features with the first:
``W_T^(t) = gamma W_T^(1) + sqrt(1 - gamma^2) W_aux^(t)`` ([S] Eq. 5), where the auxiliary rows
are drawn, orthogonalised against the first teacher's rows and normalised, so that
``T^(1,t) = gamma T^(1,1)`` holds exactly rather than up to ``O(1/sqrt d)`` noise. Their heads
have readout similarity ``rho``: ``h_T^(t) = rho h_T^(1) + sqrt(1 - rho^2) |h_T^(1)| u``, ``u`` a unit
vector orthogonal to ``h_T^(1)`` (needs ``p* >= 2`` unless ``rho = 1``).

**Several similarities in one fit.** ``gamma`` may be a list of ``G`` values: then there are
``G`` teacher sets, sharing ``W_T^(1)`` and the auxiliary rows, and every batch carries each
set's labels. ``zoo.MultiHeadStudent`` replicates each of its initialisations once per set
(member ``e`` learns from set ``e mod G``), which is how a forgetting-vs-similarity curve
([S] Fig. 6) is one run.

Batches are chunks of ``steps_per_batch`` SGD steps of ``batch_size`` samples each (online SGD:
``batch_size = 1``), as a dict ``{"x": (S, B, d), "y": (S, B, G), "task": int, "step": int}`` with the labels
of the active task. A chunk never straddles a task switch, and chunk ``k`` is drawn from its
own seed, so the stream is the same however the run is split. One epoch is the whole schedule:
train with ``max_epochs: 1``. The loader is stateful (``datamodules.resumable.ScheduleLoader``):
a mid-epoch checkpoint stores the next chunk, and a resumed run continues the stream there,
exactly; a checkpoint of another schedule (seed, sizes, switches) is refused. Lightning's
``global_step`` counts the chunks trained (one optimizer update each); the module counts the SGD
samples (``samples_seen``).

**Evaluation.** ``val_dataloader`` and ``test_dataloader`` give one batch per task,
``{"x": (num_test, d), "y": (num_test, G), "task": int}`` with noiseless labels: the test set is
``test_set()`` (what ``task_errors(source="mc")`` uses), the validation set another held-out
draw of the same size from its own seed; neither touches the training stream.
"""
from __future__ import annotations

import math
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.resumable import ScheduleLoader

Activation = Literal["erf", "relu", "sigmoid", "linear"]


def teacher_activation(name: str):
    """``phi`` of the teacher: ``erf(z / sqrt 2)``, ``relu``, ``sigmoid`` or the identity."""
    if name == "erf":
        return lambda z: torch.erf(z * (1.0 / math.sqrt(2.0)))
    if name == "relu":
        return torch.relu
    if name == "sigmoid":
        return torch.sigmoid
    if name == "linear":
        return lambda z: z
    raise ValueError(f"TeacherStudent: activation = {name!r}; allowed: 'erf', 'relu', 'sigmoid', 'linear'")


def _chunk_seed(seed: int, k: int) -> int:
    # distinct, reproducible seeds per chunk (independent of how the stream is consumed)
    return (int(seed) * 1_000_003 + 7919 * (k + 1)) % (2**63 - 1)


class _Chunks(Dataset):
    """The chunks of the SGD schedule: item ``k`` is chunk ``k``; one pass is one epoch."""

    def __init__(self, dm: "TeacherStudent") -> None:
        self.dm = dm

    def __len__(self) -> int:
        return len(self.dm.chunks)

    def __getitem__(self, k: int) -> dict[str, Tensor]:
        return self.dm.chunk(k)


class TeacherStudent(pl.LightningDataModule):
    """Two (or more) teacher tasks with feature similarity ``gamma``, streamed online.

    Args:
        d: input dimension (the papers use 1000 to 10000).
        p_star: hidden units of each teacher.
        n_tasks: number of tasks (teachers), trained one after the other.
        gamma: feature similarity of every later teacher to the first ([S] Eq. 5), in [0, 1];
            a list makes one teacher set per value (see the module docstring).
        readout_similarity: cosine between the later teachers' heads and the first's, in [-1, 1].
        activation: the teachers' ``phi``.
        teacher_head: every entry of the first teacher's head (docs/theory.md#teachers: all ones).
        switch_step: the SGD step at which task 2 starts (a list: the steps at which tasks
            2, 3, ... start); default: the tasks split ``num_steps`` evenly.
        num_steps: total SGD steps over all tasks (time ``alpha = num_steps / d``).
        batch_size: samples per SGD step (1 = online SGD, the papers' setting).
        steps_per_batch: SGD steps per chunk handed to the module (amortises Lightning's
            per-batch overhead; the student runs them in one tight loop).
        num_samples: a finite training pool of this many inputs (sampled with replacement);
            default ``None``: a fresh input at every step.
        num_test: held-out samples per task for Monte-Carlo errors.
        noise_std: standard deviation of Gaussian label noise (0: noiseless).
        seed: seed of the teachers, the stream and the test set.
    """

    def __init__(
        self,
        d: int = 1000,
        p_star: int = 1,
        n_tasks: int = 2,
        gamma: float | list[float] = 0.5,
        readout_similarity: float = 1.0,
        activation: Activation = "erf",
        teacher_head: float = 1.0,
        switch_step: int | list[int] | None = None,
        num_steps: int = 60_000,
        batch_size: int = 1,
        steps_per_batch: int = 1000,
        num_samples: int | None = None,
        num_test: int = 10_000,
        noise_std: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, value in (("d", d), ("p_star", p_star), ("n_tasks", n_tasks), ("num_steps", num_steps),
                           ("batch_size", batch_size), ("steps_per_batch", steps_per_batch), ("num_test", num_test)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name}: {arg} = {value!r}; allowed: a positive integer")
        gammas = [float(g) for g in (gamma if isinstance(gamma, (list, tuple)) else [gamma])]
        if not gammas or any(not 0.0 <= g <= 1.0 for g in gammas):
            raise ValueError(f"{name}: gamma = {gamma!r}; allowed: a number or non-empty list of numbers in [0, 1]")
        if not -1.0 <= readout_similarity <= 1.0:
            raise ValueError(f"{name}: readout_similarity = {readout_similarity}; allowed: [-1, 1]")
        if readout_similarity != 1.0 and p_star < 2 and n_tasks > 1:
            raise ValueError(
                f"{name}: readout_similarity = {readout_similarity} needs p_star >= 2 (a head of one unit "
                "has no direction to rotate); allowed with p_star = 1: 1.0")
        teacher_activation(activation)
        if not (math.isfinite(teacher_head) and teacher_head != 0):
            raise ValueError(f"{name}: teacher_head = {teacher_head}; allowed: a non-zero number")
        if num_samples is not None and num_samples < 1:
            raise ValueError(f"{name}: num_samples = {num_samples}; allowed: a positive integer or null (online)")
        if noise_std < 0:
            raise ValueError(f"{name}: noise_std = {noise_std}; allowed: >= 0")
        if switch_step is None:
            switches = [round(num_steps * t / n_tasks) for t in range(1, n_tasks)]
        else:
            switches = [int(s) for s in (switch_step if isinstance(switch_step, (list, tuple)) else [switch_step])]
        if len(switches) != n_tasks - 1 or any(not 0 < a < b for a, b in zip(switches, switches[1:] + [num_steps])):
            raise ValueError(
                f"{name}: switch_step = {switch_step!r}; allowed: {n_tasks - 1} increasing step(s) strictly "
                f"between 0 and num_steps = {num_steps} (one per task after the first)")
        self.save_hyperparameters(logger=False)  # the module logs its own; equal keys (seed, activation) may differ
        self.d, self.p_star, self.n_tasks, self.gammas = int(d), int(p_star), int(n_tasks), gammas
        self.readout_similarity, self.activation, self.teacher_head = readout_similarity, activation, teacher_head
        self.switch_steps, self.num_steps, self.batch_size = switches, int(num_steps), int(batch_size)
        self.steps_per_batch, self.num_samples, self.num_test = int(steps_per_batch), num_samples, int(num_test)
        self.noise_std, self.seed = noise_std, seed
        self.phi = teacher_activation(activation)
        self.W_teachers, self.teacher_heads = self._teachers(torch.Generator().manual_seed(seed))
        self.chunks = self._schedule()
        self._pool: tuple[Tensor, Tensor] | None = None
        self._test: tuple[Tensor, Tensor] | None = None

    # -- the teachers ------------------------------------------------------------------------------
    @property
    def teacher_sets(self) -> int:
        """``G``, the number of teacher sets (one per ``gamma`` value)."""
        return len(self.gammas)

    def _teachers(self, g: torch.Generator) -> tuple[Tensor, Tensor]:
        """``W_teachers`` (G, n_tasks, p*, d) and ``teacher_heads`` (G, n_tasks, p*), float64."""
        d, ps, n = self.d, self.p_star, self.n_tasks
        if (n - 1) * ps + ps > d:
            raise ValueError(f"TeacherStudent: d = {d} is too small for {n} teachers of p_star = {ps} units")
        W1 = torch.randn(ps, d, generator=g, dtype=torch.float64)
        W1 = W1 * (math.sqrt(d) / W1.norm(dim=-1, keepdim=True))
        # auxiliary rows orthogonal to the first teacher's rows (and to each other), norm sqrt(d)
        raw = torch.cat([W1, torch.randn((n - 1) * ps, d, generator=g, dtype=torch.float64)]).T
        basis, _ = torch.linalg.qr(raw)
        aux = basis[:, ps:].T.reshape(n - 1, ps, d) * math.sqrt(d)
        gam = torch.tensor(self.gammas, dtype=torch.float64)[:, None, None, None]
        later = gam * W1 + torch.sqrt(1 - gam**2) * aux  # (G, n-1, p*, d)
        W = torch.cat([W1.expand(len(self.gammas), 1, ps, d), later], dim=1)
        W = W * (math.sqrt(d) / W.norm(dim=-1, keepdim=True))
        h1 = torch.full((ps,), float(self.teacher_head), dtype=torch.float64)
        heads = [h1]
        for _ in range(n - 1):
            u = torch.randn(ps, generator=g, dtype=torch.float64)
            u = u - (u @ h1) / (h1 @ h1) * h1
            u = u / u.norm() if ps > 1 else torch.zeros_like(u)
            rho = self.readout_similarity
            heads.append(rho * h1 + math.sqrt(max(0.0, 1 - rho**2)) * h1.norm() * u)
        hT = torch.stack(heads).expand(len(self.gammas), n, ps).clone()
        return W, hT

    def T(self) -> Tensor:
        """Teacher overlaps ``T^(t,t') = W_T^(t) W_T^(t')T / d`` ([S] Eq. 8), (G, n_tasks, n_tasks, p*, p*)."""
        W = self.W_teachers
        return torch.einsum("gtnd,gsmd->gtsnm", W, W) / self.d

    def labels(self, X: Tensor) -> Tensor:
        """Noiseless labels of every task and teacher set for inputs ``X`` (..., d): (..., n_tasks, G)."""
        G, n, ps, d = self.teacher_sets, self.n_tasks, self.p_star, self.d
        Wt = self.W_teachers.to(X.dtype).permute(1, 0, 2, 3).reshape(n * G * ps, d)
        pre = (X @ Wt.T) * (1.0 / math.sqrt(d))
        phi = self.phi(pre).unflatten(-1, (n, G, ps))
        return (phi * self.teacher_heads.to(X.dtype).permute(1, 0, 2)).sum(-1)

    def _task_labels(self, X: Tensor, task: int) -> Tensor:
        """Labels of one task for every teacher set, (..., G)."""
        G, ps, d = self.teacher_sets, self.p_star, self.d
        Wt = self.W_teachers[:, task].to(X.dtype).reshape(G * ps, d)
        phi = self.phi((X @ Wt.T) * (1.0 / math.sqrt(d))).unflatten(-1, (G, ps))
        return (phi * self.teacher_heads[:, task].to(X.dtype)).sum(-1)

    # -- the stream ----------------------------------------------------------------------------------
    def _schedule(self) -> list[tuple[int, int, int]]:
        """Chunks ``(first_step, n_steps, task)`` covering the schedule, never across a switch."""
        bounds = [0] + self.switch_steps + [self.num_steps]
        chunks = []
        for task, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            for s in range(a, b, self.steps_per_batch):
                chunks.append((s, min(self.steps_per_batch, b - s), task))
        return chunks

    def task_at(self, step: int) -> int:
        """The task trained at SGD step ``step``."""
        return sum(step >= s for s in self.switch_steps)

    def chunk(self, k: int) -> dict[str, Tensor]:
        """Chunk ``k`` of the stream: ``{"x": (S, B, d), "y": (S, B, G), "task": int, "step": int}``."""
        first, S, task = self.chunks[k]
        g = torch.Generator().manual_seed(_chunk_seed(self.seed, k))
        B, d = self.batch_size, self.d
        if self.num_samples is None:
            x = torch.randn(S, B, d, generator=g)
            y = self._task_labels(x, task)
        else:
            X, Y = self._train_pool()
            idx = torch.randint(0, self.num_samples, (S, B), generator=g)
            x, y = X[idx], Y[idx, task]
        if self.noise_std > 0:
            y = y + self.noise_std * torch.randn(y.shape, generator=g)
        return {"x": x, "y": y, "task": task, "step": first}  # ints: read on the host at every step

    def _train_pool(self) -> tuple[Tensor, Tensor]:
        if self._pool is None:
            g = torch.Generator().manual_seed(_chunk_seed(self.seed, -2))
            X = torch.randn(self.num_samples, self.d, generator=g)
            self._pool = (X, self.labels(X))
        return self._pool

    @property
    def set_params(self) -> list[dict[str, float]]:
        """What tells the teacher sets apart, one dict per set (``MultiHeadStudent.member_params``)."""
        return [{"gamma": g} for g in self.gammas]

    def fisher_data(self, task: int, n: int) -> tuple[Tensor, Tensor]:
        """Samples for an EWC Fisher at the end of ``task`` (``zoo.models.multihead``): :meth:`sample`."""
        return self.sample(task, n)

    def sample(self, task: int, n: int) -> tuple[Tensor, Tensor]:
        """``n`` fresh samples of task ``task`` (for a Fisher estimate): x (n, d), y (n, G).

        Drawn from their own seed (never the training stream or the test set), with label
        noise if ``noise_std > 0``; the same call returns the same samples.
        """
        if not 0 <= task < self.n_tasks:
            raise ValueError(f"TeacherStudent.sample: task = {task}; allowed: 0..{self.n_tasks - 1}")
        g = torch.Generator().manual_seed(_chunk_seed(self.seed, -3 - task))
        X = torch.randn(n, self.d, generator=g)
        y = self._task_labels(X, task)
        if self.noise_std > 0:
            y = y + self.noise_std * torch.randn(y.shape, generator=g)
        return X, y

    def test_set(self) -> tuple[Tensor, Tensor]:
        """Held-out ``(x, y)``: x (num_test, d), y (num_test, n_tasks, G) noiseless labels."""
        if self._test is None:
            self._test = self._held_out(-1)
        return self._test

    def _per_task(self, X: Tensor, Y: Tensor) -> DataLoader:
        return DataLoader([{"x": X, "y": Y[:, t], "task": t} for t in range(self.n_tasks)], batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self._per_task(*self._held_out(-(10**6)))  # a key no chunk, pool or Fisher sample uses

    def test_dataloader(self) -> DataLoader:
        return self._per_task(*self.test_set())

    def _held_out(self, key: int) -> tuple[Tensor, Tensor]:
        """``num_test`` inputs from their own seed and their noiseless labels, (N, d), (N, n_tasks, G)."""
        g = torch.Generator().manual_seed(_chunk_seed(self.seed, key))
        X = torch.randn(self.num_test, self.d, generator=g)
        return X, self.labels(X)

    def _start_chunk(self) -> int:
        # one optimizer update per chunk: a resumed run's global_step is the next chunk
        return min(self.trainer.global_step if self.trainer is not None else 0, len(self.chunks))

    def stream_fingerprint(self) -> dict[str, Any]:
        """What decides the chunks of the stream: a checkpoint saved with other values cannot be
        continued exactly (``ScheduleLoader`` refuses it)."""
        return {"seed": self.seed, "d": self.d, "p_star": self.p_star, "n_tasks": self.n_tasks, "gamma": self.gammas,
                "readout_similarity": self.readout_similarity, "activation": self.activation,
                "teacher_head": self.teacher_head, "switch_step": self.switch_steps, "num_steps": self.num_steps,
                "batch_size": self.batch_size, "steps_per_batch": self.steps_per_batch,
                "num_samples": self.num_samples, "noise_std": self.noise_std}

    def train_dataloader(self) -> DataLoader:
        # each item is a whole chunk; a checkpoint's loader state (the next chunk) replaces the start
        return ScheduleLoader(_Chunks(self), type(self).__name__, self.stream_fingerprint(), self._start_chunk())
