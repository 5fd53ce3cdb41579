"""Sparse autoencoders and the implicit sparse autoencoder of output-heavy initialisation ([S] App. H).

``h = relu(W_enc x + b_enc)`` (n hidden units), ``x_hat = W_dec h + b_dec``; loss
``1/2 |x - x_hat|^2 + l1 |h|_1`` per data point, averaged over the batch. With ``l1 = 0`` and an
``imbalance`` initialisation ``v > 1`` (encoder ``N(0, (sigma/v)^2)``, decoder
``N(0, (sigma v)^2)``) the linear theory of [S] Sec. 3 predicts sparse hidden activity without any
penalty: the iSAE. Trained by plain SGD by default, because the prediction is about gradient
flow from the initial imbalance; Adam rescales every step and forgets the initial scales.

**Ensemble.** ``E`` members train in one fit on the same batches as batched tensor ops: the
init's list parameters (e.g. ``v: [0.25, 1, 4]``) and a list of ``l1`` zipped, or with
``grid: true`` their Cartesian product, so SAE and iSAE over a range of ``v`` is one run.
``member_params[e]`` holds member e's list-valued init parameters, its ``l1`` and the seed; its
label (``v=4,l1=0``) names those that vary (``zoo.utils.labels.member_labels``).

**Evaluation.** ``validation_step`` / ``test_step`` feed torchmetrics ``Metric``s (they reduce
over batches and devices): the firing counts of every unit ([S] Eq. 30-31, ``eq31``, ``l0``,
``dead_fraction``, ``dense_fraction``: ``zoo.metrics.sparsity.FiringCounts``) and the
reconstruction's ``mse`` and ``explained_variance`` (``zoo.metrics.reconstruction``); logged as
``<stage>/<measure>`` (mean over the surviving members) and ``<stage>/<measure>/<label>``.
:meth:`measure` gives the same measures for a tensor of data (``callbacks.sparsity``).
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from zoo.training.lazy import lazy_instance
from torch import Tensor, nn

from zoo.training.distributed import MemberParallel, is_sharded
from zoo.models.base import ZooModule, check_positive_ints
from zoo.training.divergence import drop_diverged
from zoo.training.hparams import save_own_hyperparameters
from zoo.init import Imbalance, InitScheme, from_spec
from zoo.training.ensemble import grid_product
from zoo.utils.labels import MAX_MEMBER_TAGS, member_labels
from zoo.metrics.reconstruction import Reconstruction
from zoo.metrics.sparsity import FiringCounts
from zoo.training.evaluation import StagedEvaluation
from zoo.training.logs import log_batch_rows
from zoo.training.progress import Progress

MEASURES = ("eq31", "l0", "dead_fraction", "dense_fraction", "mse", "explained_variance")
"""What :meth:`SparseAutoencoder.measure` and the evaluation steps report per member."""
CHUNK = 1024
"""Data points per forward pass of :meth:`SparseAutoencoder.measure` (bounds memory; results do not depend on it)."""


class SparseAutoencoder(MemberParallel, StagedEvaluation, Progress, ZooModule):
    """A one-hidden-layer ReLU autoencoder with an optional L1 penalty on its hidden activity.

    Args:
        d: input (and output) dimension, e.g. 16 VAE latents ([S] App. H).
        n: hidden units (2048 in [S] App. H).
        l1: weight of the L1 penalty on hidden activity; 0 is the iSAE; a list gives each member its own.
        init: scheme of ``[W_enc, W_dec]`` (``imbalance`` for the paper's experiment); list
            parameters make an ensemble. Biases start at zero.
        lr: learning rate.
        optimizer: ``"sgd"`` (default; see the module docstring) or ``"adam"``.
        bias: learn the biases ``b_enc`` and ``b_dec``.
        grid: the Cartesian product of the list-valued ``init`` parameters and ``l1``.
        seed: seed of the initial weights.
        on_divergence: ``"stop"`` (default): a member whose loss goes NaN/inf stops the fit with a
            message; ``"drop"``: that member drops out (a warning names it; its gradient is zero
            from then on, so under SGD its weights freeze; its measures are no longer logged) and
            the others train on, so a sweep over ``v`` may run into the divergence boundary. The
            mask of survivors is the buffer ``alive``.
    """

    batch_format = "vectors"

    def __init__(
        self,
        d: int = 16,
        n: int = 2048,
        l1: float | list[float] = 0.0,
        init: InitScheme = lazy_instance(Imbalance, v=1.0, sigma=1e-3),
        lr: float = 0.1,
        optimizer: Literal["sgd", "adam"] = "sgd",
        bias: bool = True,
        grid: bool = False,
        seed: int = 0,
        on_divergence: Literal["stop", "drop"] = "stop",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_positive_ints(name, d=d, n=n)
        l1s = [float(x) for x in l1] if isinstance(l1, (list, tuple)) else [float(l1)]
        if not l1s or any(not (x >= 0 and math.isfinite(x)) for x in l1s):
            raise ValueError(f"{name}: l1 = {l1!r}; allowed: a number >= 0 or a non-empty list of them")
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"{name}: optimizer = {optimizer!r}; allowed: 'sgd' or 'adam'")
        if on_divergence not in ("stop", "drop"):
            raise ValueError(f"{name}: on_divergence = {on_divergence!r}; allowed: 'stop' or 'drop'")
        scheme = from_spec(init).checked()
        save_own_hyperparameters(self, init=scheme.spec())
        if grid:
            schemes, lists = grid_product({"init": scheme}, {"l1": l1s})
            scheme, l1s = schemes["init"], lists["l1"]
        E = scheme.ensemble_size
        if len(l1s) > 1 and E > 1 and len(l1s) != E:
            raise ValueError(f"{name}: {len(l1s)} values of l1 but the init describes {E} members; give lists of one "
                             "length, or grid: true for their product")
        E = max(E, len(l1s))
        self.d, self.n, self.lr, self.optimizer_name, self.scheme = int(d), int(n), self.check_lr(lr), optimizer, scheme
        self.register_buffer("l1", torch.tensor(l1s * (E if len(l1s) == 1 else 1), dtype=torch.float32))
        W_enc, W_dec = scheme.weights([(self.n, self.d), (self.d, self.n)], ensemble=E,
                                      generator=torch.Generator().manual_seed(int(seed)))
        self.W_enc, self.W_dec = nn.Parameter(W_enc.float()), nn.Parameter(W_dec.float())
        self.b_enc = nn.Parameter(torch.zeros(E, 1, self.n), requires_grad=bias)
        self.b_dec = nn.Parameter(torch.zeros(E, 1, self.d), requires_grad=bias)
        self.on_divergence = on_divergence
        self.register_buffer("alive", torch.ones(E, dtype=torch.bool))  # in checkpoints: a resumed run keeps its drop-outs
        self.init_progress()
        varying = {k: v for k, v in scheme.params.items() if len(v) > 1}
        self.member_params = [{**{k: vals[e] for k, vals in varying.items()}, "l1": float(self.l1[e]), "seed": int(seed)}
                              for e in range(E)]
        self.labels = member_labels(self.member_params)
        self.eval_metrics = self._eval_metrics(E)

    @property
    def ensemble(self) -> int:
        """The members this module holds now: E, or this rank's slice while member-parallel."""
        return self.W_enc.shape[0]

    # -- member-parallel (zoo.training.distributed): this rank trains members[member_slice] --------------------
    def n_members(self) -> int:
        return self.member_range[2] if self.member_range is not None else self.ensemble

    def member_tensor_names(self) -> list[str]:
        # ``alive`` stays whole on every rank: each rank drops members from the gathered losses alike
        return ["W_enc", "W_dec", "b_enc", "b_dec", "l1"]

    def _eval_metrics(self, members: int) -> nn.ModuleDict:
        """Evaluation metrics of the members held, this rank's own while sharded (``member_metrics``)."""
        return self.member_metrics(nn.ModuleDict({stage: nn.ModuleList([FiringCounts(members, self.n),
                                                                        Reconstruction(members)])
                                                  for stage in ("val", "test")}).to(self.W_enc.device))

    def keep_members(self, lo: int, hi: int) -> None:
        super().keep_members(lo, hi)
        self.eval_metrics = self._eval_metrics(hi - lo)

    def on_all_members_back(self) -> None:
        self.eval_metrics = self._eval_metrics(self.ensemble)

    def hidden(self, x: Tensor) -> Tensor:
        """Hidden activity ``relu(W_enc x + b_enc)`` of every member: x (B, d) -> (E, B, n)."""
        x = x.to(self.W_enc.dtype).unsqueeze(0).expand(self.ensemble, *x.shape)
        return torch.relu(torch.bmm(x, self.W_enc.transpose(1, 2)) + self.b_enc)

    def decode(self, h: Tensor) -> Tensor:
        """``W_dec h + b_dec``: (E, B, n) -> (E, B, d)."""
        return torch.bmm(h, self.W_dec.transpose(1, 2)) + self.b_dec

    def forward(self, x: Tensor) -> Tensor:
        """Reconstructions of every member, (E, B, d)."""
        return self.decode(self.hidden(x))

    def member_loss(self, x: Tensor) -> dict[str, Tensor]:
        """Per member (E,): ``reconstruction`` (1/2 |x - x_hat|^2, batch mean), ``l1`` (|h|_1,
        batch mean, before its weight) and ``loss`` = reconstruction + l1 weight * l1."""
        h = self.hidden(x)
        rec = 0.5 * (self.decode(h) - x.to(h.dtype)).pow(2).sum(-1).mean(-1)
        act = h.sum(-1).mean(-1)  # h >= 0, so |h|_1 = sum h
        return {"reconstruction": rec, "l1": act, "loss": rec + self.l1 * act}

    @staticmethod
    def inputs(batch) -> Tensor:
        """The vectors of a batch: a tensor, a tuple/list (its first entry) or a dict (``"x"``)."""
        if isinstance(batch, dict):
            return batch["x"]
        return batch[0] if isinstance(batch, (tuple, list)) else batch

    def _vectors(self, batch) -> Tensor:
        x = self.inputs(batch)
        if x.dim() != 2 or x.shape[1] != self.d:
            raise ValueError(f"{type(self).__name__}: batches must be (B, d = {self.d}); got {tuple(x.shape)}")
        return x

    @torch.no_grad()
    def _update(self, x: Tensor, counts: FiringCounts, reconstruction: Reconstruction) -> None:
        h = self.hidden(x)
        counts.update(h)
        reconstruction.update(x, self.decode(h))

    def _measures(self, counts: FiringCounts, reconstruction: Reconstruction) -> dict[str, Tensor]:
        # torchmetrics squeezes a one-element result: one member's measures keep their member axis
        return {k: v.reshape(self.ensemble, -1).squeeze(1) for k, v in {**counts.compute(),
                                                                         **reconstruction.compute()}.items()}

    @torch.no_grad()
    def measure(self, x: Tensor, threshold: float = 0.0, dense_threshold: float = 0.5) -> dict[str, Tensor]:
        """[S] Eq. 31 and the usual SAE measures of every member on data x (N, d), computed
        ``CHUNK`` rows at a time: tensors (E,) named in ``MEASURES``, and ``density`` (E, n).
        A unit is active where ``H > threshold`` ([S] Eq. 30: 0). Local: nothing is synchronised."""
        x = x.to(self.W_enc.device, self.W_enc.dtype)
        counts = FiringCounts(self.ensemble, self.n, threshold, dense_threshold, sync_on_compute=False).to(x.device)
        reconstruction = Reconstruction(self.ensemble, sync_on_compute=False).to(x.device)
        for i in range(0, x.shape[0], CHUNK):
            self._update(x[i:i + CHUNK], counts, reconstruction)
        return self._measures(counts, reconstruction)

    def evaluate_batch(self, batch, stage: str) -> None:
        self._update(self._vectors(batch), *self.eval_metrics[stage])

    def log_evaluation(self, stage: str) -> None:
        counts, reconstruction = self.eval_metrics[stage]
        if counts.update_count:
            out, alive = self._measures(counts, reconstruction), self.alive
            for name in MEASURES:
                values = self.all_member_values(out[name].float())  # a collective when sharded
                self.log(f"{stage}/{name}", values[alive].mean())
                if self.n_members() <= MAX_MEMBER_TAGS:
                    self.log_dict({f"{stage}/{name}/{lbl}": v for lbl, v, a in zip(self.labels, values, alive) if a})
        counts.reset()
        reconstruction.reset()


    def training_step(self, batch, batch_idx: int) -> Tensor:
        x = self._vectors(batch)
        self.count_samples(x.shape[0], per_rank=True)  # data-parallel: this rank's part of the batch
        parts = self.member_loss(x)
        # every member's numbers on every rank (one gather; identity in one process): all ranks decide alike
        full = self.all_member_values(torch.stack([parts["loss"].detach(), parts["reconstruction"].detach()], 1))
        if self.on_divergence == "stop":
            self.stop_if_diverged(full[:, 0], self.global_step)
        else:
            # data-parallel, each rank saw its own part of the batch: a member drops out everywhere or nowhere
            self.alive = drop_diverged(full[:, 0], self.alive, step=self.global_step, labels=self.labels,
                                       hint=self.divergence_hint(), replicated=not is_sharded(self))
        alive = self.alive
        n_alive = alive.sum()
        # masked sums rather than boolean indexing: no host sync
        # the zoo's rows at the step of the weights measured (zoo.training.logs.log_batch_rows: the same after a resume)
        log_batch_rows(self, self.global_step, {"loss": torch.where(alive, full[:, 0], 0.0).sum() / n_alive,
                                                "reconstruction": torch.where(alive, full[:, 1], 0.0).sum() / n_alive},
                       pending=1)
        # each member receives exactly its own gradient; a dropped one none
        local = alive[self.member_slice]
        return torch.where(local, parts["loss"], torch.zeros_like(parts["loss"])).sum()

    def on_after_backward(self) -> None:
        dead = ~self.alive[self.member_slice]
        for p in self.parameters():
            if p.grad is not None:
                # where() sends 0, but 0 * inf upstream is NaN; masked_fill needs no host sync
                p.grad.masked_fill_(dead.view(-1, *[1] * (p.dim() - 1)), 0.0)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_name == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr)
