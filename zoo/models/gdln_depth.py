"""The ReLN of a two-hidden-layer ReLU network ([H] Sec. 6, Fig. 6 left).

[H] Sec. 6 reports that with a second hidden ReLU layer the network does not gate in its first
layer: every first-layer unit is on for every data point, so that layer is a shared, ungated
LINEAR layer. The second layer gates, into a common pathway and pathways each on in two of the
three contexts, as the one-hidden-layer ReLN of [H] Sec. 4 does. ``DepthGDLN`` is that ReLN
(how nearly a ReLU net's first layer is all-on: recipes/haste_slowly/fig6_depth.yaml):

    x --W0 (shared, no gates)--> h0 --W1_p (pathway p, node gate g_p^i)--> h1_p --W2_p--> y

Every pathway reads the whole shared layer and writes to the whole output, so pathway p's
network map is ``W2_p W1_p W0``: three linear layers, of which the first is common to all
pathways. Only the node gates of the datamodule's gating apply; its ``inputs`` (which features
a one-layer pathway reads) do not, because after the shared layer every pathway sees a mixture
of items and contexts ([H] Sec. 6: depth "removes the constraint from Lemma 4.1").
"""
from __future__ import annotations

from typing import Literal

from zoo.training.lazy import lazy_instance
from torch import Tensor

from zoo.models.gdln import GDLN, members_of
from zoo.training.hparams import save_own_hyperparameters, store_hparams
from zoo.init import Gaussian, InitScheme


class DepthGDLN(GDLN):
    """A GDLN with a shared ungated linear first layer before the gated pathways ([H] Sec. 6, Fig. 6).

    Weights (E members): ``W0`` (n_shared, n_in), ``W1`` (P n_hidden, n_shared) whose rows are the
    pathways' units (gated by the datamodule's node gates ``g_p^i``), ``W2`` (n_out, P n_hidden).
    The gating's ``inputs`` masks are ignored (every pathway reads all of the shared layer).

    Args:
        gating: name of the datamodule's gating ("reln" for [H] Fig. 6).
        n_shared: width of the shared ungated first layer (the ReLU net's first hidden layer).
        n_hidden: hidden units per pathway in the gated second layer.
        init: init scheme for all three layers.
        ensemble, lr, reduction, epochs_per_step, seed, num_threads: as for ``zoo.models.gdln.GDLN``.
        training: 'joint' (one loss, [H] Eq. 2) or 'two_loss' (the authors' scheme: the common
            pathway learns ``Y``, the others the residual ``Y - Y_common``; the shared layer gets
            both gradients, the common loss's through the common units and the residual loss's
            through the others).
    """

    def __init__(
        self,
        gating: str = "reln",
        n_shared: int = 100,
        n_hidden: int = 100,
        init: InitScheme = lazy_instance(Gaussian, sigma=1e-7),
        ensemble: int | None = None,
        lr: float = 1e-3,
        reduction: Literal["mean", "sum"] = "sum",
        training: Literal["joint", "two_loss"] = "joint",
        epochs_per_step: int = 100,
        seed: int = 0,
        num_threads: int | None = 1,
    ) -> None:
        # the parent's 'residual' mode fits a fixed one-layer common limit; not defined here
        if training not in ("joint", "two_loss"):
            raise ValueError(f"DepthGDLN: training = {training!r}; allowed: 'joint' or 'two_loss'")
        if isinstance(n_shared, bool) or not isinstance(n_shared, int) or n_shared < 1:
            raise ValueError(f"DepthGDLN: n_shared = {n_shared!r}; allowed: a positive integer")
        super().__init__(gating=gating, n_hidden=n_hidden, init=init, ensemble=ensemble, lr=lr, reduction=reduction,
                         training=training, epochs_per_step=epochs_per_step, seed=seed, num_threads=num_threads)
        save_own_hyperparameters(self, init=self.init_scheme.spec())
        # GDLN.__init__ recorded its own arguments first; the one this class does not take would make
        # the recorded arguments fail to build it again (load_from_checkpoint, --ckpt_path, a Comparison)
        self.remove_ignored_hparams(["context_init_gain"])
        store_hparams(self)  # and hparams_initial (what the logger writes) from it
        self.n_shared = n_shared

    def layer_shapes(self, n_in: int, n_out: int) -> list[tuple[int, int]]:
        if self.gating is None:
            raise RuntimeError("DepthGDLN: call set_gating(...) (or train with a datamodule) before build")
        H = self.gating.n_pathways * self.n_hidden
        return [(self.n_shared, n_in), (H, self.n_shared), (n_out, H)]

    def _gates(self, pre: Tensor, layer: int) -> Tensor:
        if layer == 0:  # the shared layer is linear: on for every data point
            return pre.new_ones(()).expand_as(pre)
        return members_of(self, self.unit_gates).to(pre)

    def _input_mask(self) -> Tensor | None:
        return None

    # -- analytic quantities --------------------------------------------------------------------
    def pathway_maps(self) -> Tensor:
        """Each pathway's network map ``W2_p W1_p W0`` (E, P, n_out, n_in) (its gate not applied)."""
        W0, W1, W2 = (w.detach() for w in self.W)
        E, P, n = W0.shape[0], self.gating.n_pathways, self.n_hidden
        return W2.reshape(E, -1, P, n).permute(0, 2, 1, 3) @ W1.reshape(E, P, n, -1) @ W0[:, None]

    def initial_mode_strength(self) -> float:
        raise NotImplementedError(
            "DepthGDLN: the neural race of [H] Eq. 6 (zoo.theory.gdln.race_trajectory) is for two-layer "
            "pathways; a DepthGDLN pathway has three layers with a shared first one, and no race or closed "
            "form is implemented for it. Use callbacks.gdln.LossCurves with predict: false (and no "
            "callbacks.gdln.PathwaySingularValues); callbacks.gdln.StereotypicalLoss draws the runs.")
