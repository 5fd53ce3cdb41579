"""beta-VAE with fully connected encoder and decoder, and a sweep of them in one fit ([S] Sec. 3.2, App. D).

Architecture ([S] App. D: the deep fully connected networks of Abdi et al. 2019,
*disentanglement-pytorch*, default widths; five linear layers each, ReLU between them):

* encoder ``D -> 1000 -> 400 -> 200 -> 100 -> 2L``: a body of four layers and one readout whose
  ``2L`` outputs are the posterior means ``mu`` (first ``L``) and log-variances ``logvar``;
* decoder ``L -> 100 -> 200 -> 400 -> 1000 -> D``: Bernoulli logits of every pixel.

[S] App. D calls the encoder "DeepLinear" and the decoder "DeepGaussianLinear"; in the cited
framework it is the other way round (``DeepGaussianLinear`` is the encoder with Gaussian heads,
``DeepLinear`` the decoder). The two heads there are separate layers of ``L`` outputs each; here
they are one readout of ``2L`` outputs, so Xavier's bound on the readout uses ``fan_out = 2L``
(``sqrt((100 + L)/(100 + 2L))`` = 0.96 of the separate heads' bound at L = 10).

Loss (Higgins et al. 2017, [S] Sec. 3.2): Bernoulli reconstruction (binary cross-entropy with
logits, summed over pixels, mean over the batch) plus ``regulariser(mu, logvar, z, step)``, which
for the beta-VAE is ``beta KL(q(z|x) || N(0, I))`` (closed form, summed over latents, mean over the
batch). A variant (beta-TC, annealed capacity) overrides that one method.

Initialisation ([S] Sec. 3.2, App. D): every layer's weights come from a scheme of ``zoo.init``,
one for the encoder and one for the decoder, filled input to output; biases start at zero. The
paper's experiment is ``Gain(g)`` on the encoder: Xavier-uniform with gain ``g`` on the body and
``1/g`` on the readout. Smaller ``g`` is predicted to disentangle more (higher DCI) at equal
reconstruction.

**Reparameterisation noise** comes from a generator of the model's own, on the CPU, not from
torch's global one: Lightning does not save the global generator in checkpoints, so a resumed
run would draw other noise. At the start of training the generator takes the global
generator's state, so ``seed_everything`` still chooses the noise (and where nothing else drew
from the global generator during training, as with the MNIST loaders, a run draws the noise it
drew when the noise came from there); its state is saved in every checkpoint and restored on
resume. A sweep's members share one generator and draw in turn, as they drew from the global one.

**Active latents**: a latent is active when the variance of its posterior mean across the batch
exceeds 0.01 (the usual definition, Burda et al. 2016's activity statistic with their threshold):
below it the encoder maps every input to (nearly) the same mean, so the latent carries no
information and its KL goes to zero.

:class:`BetaVAESweep` trains several independent beta-VAEs (one per member of a list-valued init
scheme and per seed, e.g. ``Gain(g=[0.3, 1, 3])`` x seeds ``[0, 1, 2, 3]``) side by side on the
same batches, so a whole figure is one ``lightning fit``. One Adam over all their parameters is
the same as one Adam per model: Adam's update of a parameter depends only on that parameter's
own gradients, and each member's gradient is that of its own loss (the total is their sum).
Its ``member_params`` (list-valued init parameters and seed of each member) name the members.

**Evaluation**: ``validation_step`` / ``test_step`` score the posterior means (no noise drawn) on
the datamodule's held-out batches: Bernoulli reconstruction, KL, and the pixel probabilities'
MSE and explained variance (``zoo.metrics.reconstruction``), so ``lightning test --config R
--ckpt_path C`` prints them. ``samples_seen`` counts the training images (``zoo.training.progress``).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

import torch
from zoo.training.lazy import lazy_instance
from torch import Tensor, nn
from torch.nn import functional as F

from zoo.training.distributed import is_sharded
from zoo.models.base import ZooModule, check_positive_ints
from zoo.training.divergence import check_finite
from zoo.training.ensemble import ensemble_size
from zoo.training.hparams import save_own_hyperparameters, store_hparams
from zoo.init import Gain, InitScheme, Xavier, from_spec
from zoo.utils.labels import MAX_MEMBER_TAGS, member_labels
from zoo.training.member_modules import ModuleMembers
from zoo.metrics.reconstruction import Reconstruction
from zoo.training.evaluation import StagedEvaluation
from zoo.training.logs import log_batch_rows
from zoo.training.progress import Progress, attached_trainer
from zoo.kernels.vae import SharedStacks, StackedAdam, stacked_layers, stacked_mlp

ENCODER_WIDTHS = [1000, 400, 200, 100]
"""Hidden widths of the encoder body (disentanglement-pytorch's deep fully connected encoder)."""
DECODER_WIDTHS = [100, 200, 400, 1000]
"""Hidden widths of the decoder (its mirror image)."""
ACTIVE_THRESHOLD = 0.01
"""A latent is active when Var_batch(mu) exceeds this (see the module docstring)."""


# ------------------------------------------------------------------------------------------------
# pure functions
# ------------------------------------------------------------------------------------------------
def gaussian_kl(mu: Tensor, logvar: Tensor) -> Tensor:
    """``KL(N(mu, diag exp(logvar)) || N(0, I))`` per sample and latent, ``(..., L)``.

    Closed form ``(mu^2 + exp(logvar) - 1 - logvar) / 2`` (Kingma & Welling 2014, App. B).
    """
    return 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar)


class _BernoulliNLL(torch.autograd.Function):
    """``softplus(l) - x l`` summed over dimension ``dim``, written with vectorised CPU kernels:
    ``softplus(l) = relu(l) - log(sigmoid(|l|))`` (no overflow; ``sigmoid(|l|)`` in [1/2, 1)), where
    torch's ``binary_cross_entropy_with_logits`` spends most of its time in a scalar
    ``log_sigmoid`` on the CPU. The gradient is torch's own formula, ``(sigmoid(l) - x) g``, op
    for op, so training steps are the same bits; the value differs from torch's in the last digit
    (``log`` of ``sigmoid(|l|)`` rather than ``log1p(exp(-|l|))``: ~1e-7 absolute per pixel)."""

    @staticmethod
    def forward(ctx, logits: Tensor, x: Tensor, dim: int) -> Tensor:
        ctx.save_for_backward(logits, x)
        ctx.dim = dim
        nll, scratch = torch.relu(logits), logits.abs()  # two buffers for the whole sum (each pass is memory-bound)
        nll.sub_(torch.sigmoid(scratch, out=scratch).log_())
        return nll.sub_(torch.mul(logits, x, out=scratch)).sum(dim)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        logits, x = ctx.saved_tensors
        return torch.sigmoid(logits).sub_(x).mul_(grad.unsqueeze(ctx.dim)), None, None


def bernoulli_nll(logits: Tensor, x: Tensor, dim: int = -1) -> Tensor:
    """Negative Bernoulli log-likelihood of ``x`` in [0, 1] given ``logits``, summed over ``dim``
    (the pixels); ``x`` broadcasts against ``logits`` (one image batch for a stack of models)."""
    if (logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and x.dtype == logits.dtype
            and not x.requires_grad and not torch.is_autocast_enabled("cpu")):
        return _BernoulliNLL.apply(logits, x, dim)
    # elsewhere torch's fused kernel (its gradient is the same formula)
    return F.binary_cross_entropy_with_logits(logits, x.expand_as(logits), reduction="none").sum(dim)


def bernoulli_reconstruction(logits: Tensor, x: Tensor) -> Tensor:
    """Negative Bernoulli log-likelihood of ``x`` in [0, 1] given ``logits``, summed over pixels, (B,)."""
    return bernoulli_nll(logits.flatten(1), x.flatten(1))


def active_latents(mu: Tensor, threshold: float = ACTIVE_THRESHOLD) -> Tensor:
    """Number of latents whose posterior mean varies across the batch: ``Var_b(mu) > threshold``."""
    if mu.shape[0] < 2:
        return torch.zeros((), device=mu.device)
    return (mu.detach().var(0) > threshold).sum().float()


def _widths(owner: str, name: str, widths: Sequence[int]) -> list[int]:
    if len(widths) < 1:
        raise ValueError(f"{owner}: {name} = {list(widths)}; allowed: at least one hidden width")
    return list(check_positive_ints(owner, **{f"{name}[{i}]": w for i, w in enumerate(widths)}))


def _mlp(dims: Sequence[int]) -> nn.Sequential:
    """Linear layers ``dims[0] -> ... -> dims[-1]`` with ReLU between them (none after the last),
    uninitialised (:func:`_fill` sets them): torch's default init would draw from the global
    generator, and the noise takes its state from there at the start of training, so a model built
    at construction would shift the noise against one built at setup, and against a DDP rank
    (Lightning reseeds each rank between the two)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(torch.nn.utils.skip_init(nn.Linear, a, b))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _fill(net: nn.Sequential, scheme: InitScheme, generator: torch.Generator) -> None:
    """Weights from ``scheme`` (input to output), biases zero."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    ws = scheme.weights([tuple(m.weight.shape) for m in linears], ensemble=1, generator=generator)
    with torch.no_grad():
        for m, w in zip(linears, ws):
            m.weight.copy_(w[0])
            m.bias.zero_()


def _mean_over_ranks(t: Tensor) -> Tensor:
    """``t`` averaged over the processes (a collective), or ``t`` without a process group."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return t
    t = t.clone()
    torch.distributed.all_reduce(t)
    return t / torch.distributed.get_world_size()


NOISE_KEY = "reparameterisation_noise"
"""Checkpoint entry holding the noise generator's state (see the module docstring)."""


def _generator_like_global() -> torch.Generator:
    """A CPU generator in the global CPU generator's current state."""
    g = torch.Generator()
    g.set_state(torch.get_rng_state())
    return g


class _OwnNoise:
    """Training hooks that give the module's VAEs (``_noise_models()``) one noise generator, taken
    from the global one when training starts and from the checkpoint when it resumes."""

    _noise_restored = False

    def _noise_models(self) -> list["BetaVAE"]:
        raise NotImplementedError

    def _share_noise(self, generator: torch.Generator) -> None:
        for m in self._noise_models():
            m.noise_generator = generator

    def on_train_start(self) -> None:
        # data-parallel (plain DDP: every rank its own images): each rank its own block of the stream;
        # member-parallel ranks read the same images and draw the single-process stream
        world = self.trainer.world_size
        block = (world, self.trainer.global_rank) if world > 1 and not is_sharded(self) else (1, 0)
        for m in self._noise_models():
            m.noise_block = block
        if self._noise_restored:  # on_load_checkpoint of this fit set it
            self._noise_restored = False
            return
        if self.trainer.ckpt_path is not None and self.trainer.global_step > 0:
            raise RuntimeError(f"{type(self).__name__}: the checkpoint {self.trainer.ckpt_path} has no state of the "
                               "reparameterisation noise (saved before it had one), so the resumed run would draw "
                               "other noise; start the run again instead")
        self._share_noise(_generator_like_global())

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[NOISE_KEY] = self._noise_models()[0].noise().get_state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # a model saved before samples_seen existed (e.g. phase 1 of fig13 for Latents) still loads, counting from 0
        state = checkpoint.get("state_dict", {})
        for key, value in self.state_dict().items():
            if key.endswith("samples_seen_"):
                state.setdefault(key, torch.zeros_like(value))
        if NOISE_KEY in checkpoint:
            g = torch.Generator()
            g.set_state(checkpoint[NOISE_KEY])
            self._share_noise(g)
            self._noise_restored = True


class _Evaluation(StagedEvaluation, Progress):
    """``validation_step`` / ``test_step`` of the module's VAEs (``_noise_models()``, labels
    ``labels``) on the datamodule's held-out batches ``(x, ...)``: from the posterior means, so
    no noise is drawn and the training stream is untouched. Logs ``<stage>/reconstruction`` (the
    Bernoulli loss, summed over pixels), ``<stage>/kl``, and ``<stage>/mse`` and
    ``<stage>/explained_variance`` of the pixel probabilities (``zoo.metrics.reconstruction``, a
    torchmetrics ``Metric``: it reduces over batches and devices); means over the members, and
    per member (``.../<label>``) for a sweep of up to ``MAX_MEMBER_TAGS``."""

    labels: list[str]
    batch_format = "images"

    def divergence_hint(self) -> str:
        return f"lr = {self.lr} may be too large (try lr / 10), or the init too large."

    def init_evaluation(self, members: int) -> None:
        self.init_progress()
        self.eval_metrics = nn.ModuleDict({"val": Reconstruction(members), "test": Reconstruction(members)})

    def _local_models(self) -> list["BetaVAE"]:
        """The VAEs this process trains and evaluates (a member-parallel sweep: its slice)."""
        return self._noise_models()

    def _all_members(self, values: Tensor) -> Tensor:
        """Per-member ``values`` of :meth:`_local_models` -> of every member (a collective when sharded)."""
        return values

    def _per_member(self, stage: str, name: str, values: Tensor, **kw) -> None:
        # member-parallel: every rank holds the same gathered values, so a mean over ranks would only
        # cost a collective (and round); data-parallel: each rank scored its own images
        sync = not is_sharded(self)
        values = self._all_members(values)
        self.log(f"{stage}/{name}", values.mean(), sync_dist=sync, **kw)
        if 1 < len(values) <= MAX_MEMBER_TAGS:
            for label, v in zip(self.labels, values):
                self.log(f"{stage}/{name}/{label}", v, sync_dist=sync, **kw)

    def evaluate_batch(self, batch, stage: str) -> None:
        x = batch[0]
        outs = [m.evaluate(x) for m in self._local_models()]
        self.eval_metrics[stage].update(x, torch.stack([o["x_hat"] for o in outs]))
        for name in ("reconstruction", "kl"):
            self._per_member(stage, name, torch.stack([o[name].mean() for o in outs]), on_epoch=True,
                             batch_size=x.shape[0])

    def log_evaluation(self, stage: str) -> None:
        metric = self.eval_metrics[stage]
        if metric.update_count:
            for name, values in metric.compute().items():
                self._per_member(stage, name, values.float().reshape(-1))  # torchmetrics squeezes one member's
        metric.reset()


# ------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------
class BetaVAE(_OwnNoise, _Evaluation, ZooModule):
    """A beta-VAE with deep fully connected encoder and decoder ([S] Sec. 3.2, App. D).

    Args:
        latent_dim: number of latents ``L`` (10, as in disentanglement_lib's studies).
        beta: weight of the KL term (1 is the plain VAE; Higgins et al. 2017 use beta > 1).
        lr: Adam's learning rate (1e-4, the framework's default).
        encoder_widths: hidden widths of the encoder body (four layers in [S]).
        decoder_widths: hidden widths of the decoder.
        init: scheme of the encoder's weights; ``Gain(g)`` is [S]'s experiment (``init_encoder``,
            its former name, is an alias: ``ZooModule.aliases``).
        init_decoder: scheme of the decoder's weights.
        image_shape: ``[C, H, W]`` of the inputs; default: read from the datamodule's
            ``image_shape`` at setup (and stored, so checkpoints load).
        seed: seed of the initial weights (independent of the global seed).
    """

    # hyperparameters set from the datamodule at setup, not by the config (zoo.cli.checkpoint_checks)
    hparams_from_data: tuple[str, ...] = ("image_shape",)
    aliases = {"init_encoder": "init"}
    # the steps the vectorised sweep computes for every member at once (BetaVAESweep._vectorised)
    fast_steps = ("encode", "decode", "losses", "build", "reparameterise", "regulariser")

    def __init__(
        self,
        latent_dim: int = 10,
        beta: float = 1.0,
        lr: float = 1e-4,
        encoder_widths: list[int] = ENCODER_WIDTHS,
        decoder_widths: list[int] = DECODER_WIDTHS,
        init: InitScheme = lazy_instance(Gain, g=1.0),
        init_decoder: InitScheme = lazy_instance(Xavier, gain=1.0),
        image_shape: list[int] | None = None,
        seed: int = 0,
        init_encoder: InitScheme | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        (self.latent_dim,) = check_positive_ints(name, latent_dim=latent_dim)
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"{name}: beta = {beta!r}; allowed: a number >= 0")
        self.encoder_widths = _widths(name, "encoder_widths", encoder_widths)
        self.decoder_widths = _widths(name, "decoder_widths", decoder_widths)
        self.schemes = {"init": from_spec(init).checked(), "init_decoder": from_spec(init_decoder).checked()}
        for key, scheme in self.schemes.items():
            if scheme.ensemble_size > 1:
                raise ValueError(
                    f"{name}: {key} has list-valued parameters ({scheme!r}): one BetaVAE is one model; "
                    "use zoo.models.vae.BetaVAESweep to train one model per value"
                )
        self.beta, self.lr, self.seed = float(beta), self.check_lr(lr), int(seed)
        self.labels = [""]
        self.init_evaluation(1)
        save_own_hyperparameters(self, **{key: scheme.spec() for key, scheme in self.schemes.items()})
        self.image_shape: list[int] | None = None
        self.noise_generator: torch.Generator | None = None  # see the module docstring
        self.encoder: nn.Sequential | None = None
        self.decoder: nn.Sequential | None = None
        if image_shape is not None:
            self.build(image_shape)

    # -- structure ----------------------------------------------------------------------------------
    def build(self, image_shape: Sequence[int]) -> None:
        """Create and initialise encoder and decoder for inputs of shape ``[C, H, W]``."""
        shape = [int(n) for n in image_shape]
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"{type(self).__name__}: image_shape = {list(image_shape)}; "
                             "allowed: [C, H, W], all positive")
        self.image_shape = shape
        store_hparams(self, image_shape=shape)
        D, L = math.prod(shape), self.latent_dim
        self.encoder = _mlp([D, *self.encoder_widths, 2 * L])
        self.decoder = _mlp([L, *self.decoder_widths, D])
        generator = torch.Generator().manual_seed(self.seed)
        _fill(self.encoder, self.schemes["init"], generator)
        _fill(self.decoder, self.schemes["init_decoder"], generator)

    @property
    def built(self) -> bool:
        return self.encoder is not None

    def setup(self, stage: str) -> None:
        dm = getattr(attached_trainer(self), "datamodule", None)
        self.adopt_image_shape(getattr(dm, "image_shape", None))

    def adopt_image_shape(self, shape: Sequence[int] | None) -> None:
        """Build for the data's image shape, or check it against the one given (before training)."""
        if shape is not None:
            shape = [int(n) for n in shape]
            if not self.built:
                self.build(shape)
            elif shape != self.image_shape:
                raise ValueError(f"{type(self).__name__}: image_shape = {self.image_shape} but the datamodule's "
                                 f"images are {shape}; leave image_shape unset to take it from the data")
        if not self.built:
            raise ValueError(f"{type(self).__name__}: image_shape is unset and the datamodule has no image_shape; "
                             "give image_shape: [C, H, W]")

    # -- the model ----------------------------------------------------------------------------------
    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior parameters ``(mu, logvar)``, each (B, L), of images x (B, C, H, W)."""
        h = self.encoder(x.flatten(1).to(self.encoder[0].weight.dtype))
        mu, logvar = h.chunk(2, dim=-1)
        return mu, logvar

    def decode(self, z: Tensor) -> Tensor:
        """Bernoulli logits (B, C, H, W) of latents z (B, L)."""
        return self.decoder(z).view(z.shape[0], *self.image_shape)

    @torch.no_grad()
    def codes(self, x: Tensor) -> Tensor:
        """The representation DCI scores: the posterior means ``mu`` (B, L) ([S] App. D)."""
        return self.encode(x)[0]

    def noise(self) -> torch.Generator:
        """The generator of the reparameterisation noise (outside a fit, first taken from the global one)."""
        if self.noise_generator is None:
            self.noise_generator = _generator_like_global()
        return self.noise_generator

    noise_block: tuple[int, int] = (1, 0)
    """``(world, rank)`` under data-parallel training: each step draws ``world`` blocks of noise
    and this rank takes block ``rank``, so ranks (which share the generator's state) give their
    different images different noise. ``(1, 0)`` otherwise (set at the start of training)."""

    def draw_noise(self, batch: int) -> Tensor:
        """eps ~ N(0, I) of shape (batch, L) from :meth:`noise`, on the CPU (so its stream is the same
        on every device) in the weights' dtype: under autocast ``mu`` is bf16 but the stream is the
        float32 one, and a member that another rank trains can skip its draw (:meth:`skip_noise`)
        without knowing ``mu``."""
        world, rank = self.noise_block
        dtype = self.encoder[0].weight.dtype
        eps = torch.randn((world * batch, self.latent_dim), generator=self.noise(), dtype=dtype)
        return eps[rank * batch:(rank + 1) * batch] if world > 1 else eps

    def skip_noise(self, batch: int) -> None:
        """Advance the generator past one step's draw of a batch of ``batch`` images (a sweep member
        trained by another rank: the members share the generator and draw in turn)."""
        self.draw_noise(batch)

    def reparameterise(self, mu: Tensor, logvar: Tensor) -> Tensor:
        """A sample ``z = mu + exp(logvar / 2) eps``, eps from :meth:`draw_noise`."""
        eps = self.draw_noise(mu.shape[0])
        if mu.device.type == "cuda":
            # from pinned memory the copy is queued on the stream: no wait for the GPU at every step
            eps = eps.pin_memory().to(mu.device, non_blocking=True)
        return mu + torch.exp(0.5 * logvar) * eps.to(mu.device, mu.dtype)

    def _noise_models(self) -> list["BetaVAE"]:
        return [self]

    def forward(self, x: Tensor) -> Tensor:
        """Reconstruction logits of x from the posterior means (no sampling)."""
        return self.decode(self.codes(x))

    @contextmanager
    def evaluating(self) -> Iterator[torch.device]:
        """In eval mode for the block (the mode before is restored after it); yields the device of
        the weights (a sweep member is moved by its parent, so this is where its inputs go)."""
        was = self.training
        self.eval()
        try:
            yield next(self.parameters()).device
        finally:
            self.train(was)

    @torch.no_grad()
    def evaluate(self, x: Tensor) -> dict[str, Tensor]:
        """Per image, from the posterior means (no noise drawn): ``reconstruction`` (Bernoulli loss
        summed over pixels, (B,)), ``kl`` (summed over latents, (B,)) and ``x_hat`` (the pixel
        probabilities, like x)."""
        mu, logvar = self.encode(x)
        logits = self.decode(mu)
        return {"reconstruction": bernoulli_reconstruction(logits, x.to(mu.dtype)),
                "kl": gaussian_kl(mu, logvar).sum(-1), "x_hat": torch.sigmoid(logits)}

    @torch.no_grad()
    def traversal(self, x: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[S] Fig. 4c: from the posterior mean of one image x (1, C, H, W), each latent in turn set
        to every entry of ``values`` (S,), the others kept. Returns the decoded pixel probabilities
        (L * S, C, H, W), one row of S per latent in the order of their KL on x (largest first), that
        order (L,) and those KLs (L,)."""
        mu, logvar = self.encode(x)
        kl = gaussian_kl(mu, logvar)[0]
        order = torch.argsort(kl, descending=True)
        S = len(values)
        z = mu.repeat(len(order) * S, 1)
        rows = torch.arange(len(order) * S, device=z.device)
        z[rows, order.repeat_interleave(S)] = values.to(z).repeat(len(order))
        return torch.sigmoid(self.decode(z)), order, kl[order]

    def regulariser(self, mu: Tensor, logvar: Tensor, z: Tensor, step: int) -> Tensor:
        """The term added to the reconstruction loss, a scalar: ``beta`` times the batch-mean KL.

        Override this one method for a variant, e.g. annealed capacity (Burgess et al. 2018):
        ``gamma |KL - C(step)|``; beta-TC (Chen et al. 2018) from ``z`` and the posterior.
        """
        return self.beta * gaussian_kl(mu, logvar).sum(-1).mean()

    def losses(self, x: Tensor, step: int) -> dict[str, Tensor]:
        """Everything one step needs and logs: ``loss`` (to minimise), ``reconstruction``, ``kl``
        (batch means), ``kl_per_latent`` (L,), ``regulariser`` and ``active_latents``."""
        mu, logvar = self.encode(x)
        z = self.reparameterise(mu, logvar)
        recon = bernoulli_reconstruction(self.decode(z), x.to(mu.dtype)).mean()
        kl_per_latent = gaussian_kl(mu, logvar).mean(0)
        reg = self.regulariser(mu, logvar, z, step)
        return {"loss": recon + reg, "reconstruction": recon, "kl": kl_per_latent.sum(), "regulariser": reg,
                "kl_per_latent": kl_per_latent, "active_latents": active_latents(mu)}

    # -- training -----------------------------------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x = batch[0]
        self.count_samples(x.shape[0], per_rank=True)  # data-parallel: this rank's part of the batch
        out = self.losses(x, self.global_step)
        # data-parallel: the mean over the ranks' images (one collective), so every rank logs it and
        # decides about divergence alike (a rank that raised alone would leave the others waiting)
        stats = _mean_over_ranks(torch.cat([torch.stack([out[k].detach().float() for k in
                                                         ("loss", "reconstruction", "kl", "active_latents")]),
                                            out["kl_per_latent"].detach().float()]))
        check_finite(stats[:1], step=self.global_step, labels=[type(self).__name__], hint=self.divergence_hint())
        # the zoo's rows, not Lightning's (zoo.training.logs.log_batch_rows: the same after a resume); the step
        # of the weights the losses were measured on, before this batch's update
        log_batch_rows(self, self.global_step, {"loss": stats[0], "reconstruction": stats[1], "kl": stats[2],
                                                "active_latents": stats[3]}
                       | {f"kl/z{i}": v for i, v in enumerate(stats[4:])}, pending=1)
        return out["loss"]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


# ------------------------------------------------------------------------------------------------
# a sweep of independent models in one fit
# ------------------------------------------------------------------------------------------------
class BetaVAESweep(ModuleMembers, _OwnNoise, _Evaluation, ZooModule):
    """Independent beta-VAEs trained side by side on the same batches: one per (init member, seed).

    ``init: Gain(g=[0.3, 1, 3])`` with ``seeds: [0, 1, 2, 3]`` gives 12 models, member
    ``i * len(seeds) + j`` with gain ``g[i]`` and seed ``seeds[j]``: ``member_params[k]`` is that
    member's list-valued init parameters and seed (``{"g": 0.3, "seed": 0}``), its label the
    ones that vary (``zoo.utils.labels.member_labels``: ``g=0.3,seed=0``). The
    total loss is the sum of the members' losses, so each member gets exactly its own gradient,
    and one Adam over all parameters equals one Adam per model (Adam is per parameter). Only the
    data order and the reparameterisation noise are shared structure; [S] App. D varies the data
    order with the seed as well.

    Args: as :class:`BetaVAE`, with ``seeds`` the weight seeds of every initialisation, and
    ``vectorise``: step the members together (issue #21; default) rather than one after another.
    Vectorised, a training step runs every member's encoder and decoder as one batched computation
    over their stacked weights (``zoo.kernels.vae``; each member keeps its own parameters) and Adam
    is torch's fused kernel (one pass over the parameters instead of seven), run over the stacked
    tensors (``StackedAdam``): the same maths per member, rounded otherwise (summation order;
    tests/models/test_vae_vectorised.py checks it against the members stepped one by one), so
    ``vectorise: false`` trains as runs made before it did, bit for bit (the logged losses differ
    in the last digit: :func:`bernoulli_nll`).
    A ``member_class`` that overrides ``encode``, ``decode``, ``losses`` or ``build`` is stepped
    one by one; one that overrides ``reparameterise`` or ``regulariser`` is vectorised around them.
    ``member_class`` (a class attribute) is the model each member is: a subclass of this sweep
    that sets it sweeps a variant.
    """

    # hyperparameters set from the datamodule at setup, not by the config (zoo.cli.checkpoint_checks)
    hparams_from_data: tuple[str, ...] = ("image_shape",)

    member_class: ClassVar[type[BetaVAE]] = BetaVAE
    aliases = BetaVAE.aliases

    def __init__(  # what is swept first
        self,
        init: InitScheme = lazy_instance(Gain, g=[0.3, 1.0, 3.0]),
        init_decoder: InitScheme = lazy_instance(Xavier, gain=1.0),
        seeds: list[int] = [0, 1, 2, 3],
        latent_dim: int = 10,
        beta: float = 1.0,
        lr: float = 1e-4,
        encoder_widths: list[int] = ENCODER_WIDTHS,
        decoder_widths: list[int] = DECODER_WIDTHS,
        image_shape: list[int] | None = None,
        vectorise: bool = True,
        init_encoder: InitScheme | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(vectorise, bool):
            raise ValueError(f"{name}: vectorise = {vectorise!r}; allowed: true or false")
        self.vectorise = vectorise
        enc, dec = from_spec(init).checked(), from_spec(init_decoder).checked()
        if not seeds:
            raise ValueError(f"{name}: seeds = {seeds!r}; allowed: a non-empty list of integers")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{name}: seeds = {seeds!r} repeat a seed; allowed: distinct integers")
        # seeds replicate every initialisation (the ensemble rule's replication, with named seeds)
        n_init = ensemble_size(name, {"init": enc.ensemble_size, "init_decoder": dec.ensemble_size})
        save_own_hyperparameters(self, init=enc.spec(), init_decoder=dec.spec())
        self.lr = self.check_lr(lr)
        self.member_params: list[dict] = []
        members = []
        for i in range(n_init):
            for s in seeds:
                members.append(self.member_class(
                    latent_dim=latent_dim, beta=beta, lr=lr, encoder_widths=encoder_widths,
                    decoder_widths=decoder_widths, init=enc.member(i) if enc.ensemble_size > 1 else enc,
                    init_decoder=dec.member(i) if dec.ensemble_size > 1 else dec, image_shape=image_shape,
                    seed=int(s)))
                self.member_params.append({**self._varying(enc, dec, i), "seed": int(s)})
        self.members = nn.ModuleList(members)
        self.labels = member_labels(self.member_params)
        self.init_evaluation(len(members))

    @staticmethod
    def _varying(enc: InitScheme, dec: InitScheme, i: int) -> dict[str, float]:
        """Init member i's list-valued parameters (the decoder's prefixed ``dec_``)."""
        return {prefix + k: v[i] for prefix, scheme in (("", enc), ("dec_", dec))
                for k, v in scheme.params.items() if len(v) > 1}

    def __len__(self) -> int:
        return len(self.members)

    def _noise_models(self) -> list[BetaVAE]:
        return list(self.members)

    def select(self, where: Sequence[dict] | None = None) -> list[tuple[str, BetaVAE]]:
        """``(label, model)`` of the members whose ``member_params`` contain one of the dicts in
        ``where`` (e.g. ``[{"g": 0.3, "seed": 0}]``), in member order; all of them for None."""
        def has(params: dict, w: dict) -> bool:
            return all(params.get(k) == v for k, v in w.items())

        unmatched = [w for w in where or [] if not any(has(p, w) for p in self.member_params)]
        if unmatched:
            raise ValueError(f"{type(self).__name__}: no member has {unmatched}; members: {self.member_params}")
        return [(lbl, m) for lbl, m, p in zip(self.labels, self.members, self.member_params)
                if not where or any(has(p, w) for w in where)]

    def member(self, label: str) -> BetaVAE:
        """The member with this label (e.g. ``g=0.3,seed=0``)."""
        if label not in self.labels:
            raise KeyError(f"{type(self).__name__}: no member {label!r}; members: {', '.join(self.labels)}")
        return self.members[self.labels.index(label)]

    def setup(self, stage: str) -> None:
        dm = getattr(attached_trainer(self), "datamodule", None)
        for m in self.members:
            m.adopt_image_shape(getattr(dm, "image_shape", None))
        store_hparams(self, image_shape=self.members[0].image_shape)

    # -- member-parallel (zoo.training.member_modules): this rank trains members[member_slice] -------------------
    def member_modules(self) -> list[BetaVAE]:
        return list(self.members)

    def _local_models(self) -> list[BetaVAE]:
        return list(self.members)[self.member_slice]

    def _all_members(self, values: Tensor) -> Tensor:
        return self.all_member_values(values)

    def _metrics_for(self, members: int) -> None:
        """Evaluation metrics of the members held, this rank's own while sharded (``member_metrics``)."""
        device = self.eval_metrics["val"].sse.device
        self.eval_metrics = self.member_metrics(nn.ModuleDict({stage: Reconstruction(members).to(device)
                                                               for stage in ("val", "test")}))

    def keep_members(self, lo: int, hi: int) -> None:
        super().keep_members(lo, hi)
        self._metrics_for(hi - lo)

    def on_all_members_back(self) -> None:
        self._metrics_for(len(self.members))

    def _vectorised(self) -> bool:
        """Whether a step runs the members together (``vectorise`` and a member class whose network
        and loss are BetaVAE's own)."""
        cls = type(self.members[0])
        return self.vectorise and not any(cls.overrides(f) for f in ("encode", "decode", "losses", "build"))

    def _losses_one_by_one(self, x: Tensor, step: int) -> dict[str, Tensor]:
        """``losses`` of this rank's members, each entry stacked over them."""
        local = range(len(self.members))[self.member_slice]
        outs = []
        for k, m in enumerate(self.members):
            # the members draw their noise in turn from one generator: one trained elsewhere still draws
            if k in local:
                outs.append(m.losses(x, step))
            else:
                m.skip_noise(x.shape[0])
        return {key: torch.stack([o[key] for o in outs]) for key, v in outs[0].items() if isinstance(v, Tensor)}

    _shared_stacks: dict[str, SharedStacks] | None = None

    def _stacked_layers(self, local: range) -> tuple[list[tuple[Tensor, Tensor]], list[tuple[Tensor, Tensor]]]:
        """Encoder and decoder layers ``(W, b)`` of members ``local``, stacked (``zoo.kernels.vae``):
        views of the members' parameters, or, under data-parallel DDP (whose gradient hooks sit on
        the parameters), copies."""
        trainer = attached_trainer(self)
        if trainer is not None and trainer.world_size > 1 and not is_sharded(self):
            return (stacked_layers([self.members[k].encoder for k in local]),
                    stacked_layers([self.members[k].decoder for k in local]))
        return tuple(self._stacks()[part].leaves(local.start, local.stop) for part in ("encoder", "decoder"))

    def _stacks(self) -> dict[str, SharedStacks]:
        if self._shared_stacks is None:
            self._shared_stacks = {part: SharedStacks([getattr(m, part) for m in self.members])
                                   for part in ("encoder", "decoder")}
        return self._shared_stacks

    def _losses_together(self, x: Tensor, step: int) -> dict[str, Tensor]:
        """:meth:`BetaVAE.losses` of this rank's members computed together (``zoo.kernels.vae``),
        each entry stacked over them: the same terms, the noise drawn in the same order."""
        local = range(len(self.members))[self.member_slice]
        models = [self.members[k] for k in local]
        encoder, decoder = self._stacked_layers(local)
        pixels = x.flatten(1).to(models[0].encoder[0].weight.dtype)
        mu, logvar = stacked_mlp(pixels, encoder).chunk(2, dim=-1)
        cls, B = type(models[0]), x.shape[0]
        if not cls.overrides("reparameterise"):  # one noise tensor, one transfer
            eps = [m.draw_noise(B) if k in local else m.skip_noise(B) for k, m in enumerate(self.members)]
            eps = torch.stack([e for e in eps if e is not None])
            if mu.device.type == "cuda":
                eps = eps.pin_memory().to(mu.device, non_blocking=True)
            z = mu + torch.exp(0.5 * logvar) * eps.to(mu.device, mu.dtype)
        else:
            zs = [m.reparameterise(mu[local.index(k)], logvar[local.index(k)]) if k in local else m.skip_noise(B)
                  for k, m in enumerate(self.members)]
            z = torch.stack([v for v in zs if v is not None])
        logits = stacked_mlp(z, decoder)  # (E, B, D), a transposed view of the contiguous (E, D, B)
        # summed over the pixels in the logits' own layout, the images laid out alike (a broadcast
        # operand whose rows are strided would make every elementwise pass a gather)
        recon = bernoulli_nll(logits.transpose(1, 2), pixels.t().to(logits.dtype).contiguous(), dim=-2).mean(-1)
        kl = gaussian_kl(mu, logvar)
        kl_per_latent = kl.mean(1)
        if not cls.overrides("regulariser"):  # beta KL of every member at once
            betas = {m.beta for m in models}
            beta = betas.pop() if len(betas) == 1 else torch.tensor([m.beta for m in models]).to(kl)
            reg = beta * kl.sum(-1).mean(-1)
        else:
            reg = torch.stack([m.regulariser(mu[i], logvar[i], z[i], step) for i, m in enumerate(models)])
        active = ((mu.detach().var(1) > ACTIVE_THRESHOLD).sum(-1).float() if B > 1
                  else torch.zeros(len(models), device=mu.device))
        return {"loss": recon + reg, "reconstruction": recon, "kl": kl_per_latent.sum(-1), "regulariser": reg,
                "kl_per_latent": kl_per_latent, "active_latents": active}

    def member_losses(self, x: Tensor, step: int) -> dict[str, Tensor]:
        """:meth:`BetaVAE.losses` of this rank's members on images x at ``step``, each entry stacked
        over them (``loss`` (E,), ..., ``kl_per_latent`` (E, L)); vectorised or one by one (``vectorise``).
        Draws every member's noise, in member order."""
        return (self._losses_together if self._vectorised() else self._losses_one_by_one)(x, step)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x = batch[0]
        self.count_samples(x.shape[0], per_rank=True)  # data-parallel: this rank's part of the batch
        out = self.member_losses(x, self.global_step)
        losses = out["loss"]
        # one gather of every member's numbers (identity in one process), so that all ranks decide alike
        stats = self._all_members(torch.stack([out[k].detach().float() for k in
                                               ("loss", "reconstruction", "kl", "active_latents")], 1))
        loss, recon, kl, active = stats.unbind(1)
        self.stop_if_diverged(loss, self.global_step)
        scalars = {"loss": loss.mean(), "reconstruction": recon.mean(), "kl": kl.mean(), "active_latents": active.mean()}
        if len(self.members) <= MAX_MEMBER_TAGS:
            for tag, values in (("reconstruction", recon), ("kl", kl), ("active_latents", active)):
                scalars |= {f"{tag}/{lbl}": v for lbl, v in zip(self.labels, values)}
        log_batch_rows(self, self.global_step, scalars, pending=1)  # as BetaVAE's
        return losses.sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # over every member: the same parameter list (and checkpoint layout) on any number of processes;
        # fused (vectorised): one pass over each tensor, per element the same Adam, rounded otherwise
        # (StackedAdam: over the stacked tensors where the members' parameters and gradients are stacked)
        fused = self.vectorise and {p.device.type for p in self.parameters()} <= {"cpu", "cuda"}
        if fused and self._vectorised():
            return self.track_optimizer(StackedAdam(self.parameters(), list(self._stacks().values()), lr=self.lr))
        return self.track_optimizer(torch.optim.Adam(self.parameters(), lr=self.lr, fused=fused or None))


def vae_members(module: nn.Module, where: Sequence[dict] | None = None) -> list[tuple[str, BetaVAE]]:
    """``(label, model)`` for every VAE in ``module``: the members of a sweep (those matching
    ``where``, see :meth:`BetaVAESweep.select`), or the module itself (label "")."""
    if callable(getattr(module, "select", None)):
        return module.select(where)
    if where:
        raise ValueError(f"members = {list(where)} selects members of a BetaVAESweep; the module is one "
                         f"{type(module).__name__}")
    return [("", module)]


__all__ = ["BetaVAE", "BetaVAESweep", "gaussian_kl", "bernoulli_nll", "bernoulli_reconstruction", "active_latents",
           "vae_members", "ENCODER_WIDTHS", "DECODER_WIDTHS", "ACTIVE_THRESHOLD"]
