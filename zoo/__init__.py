"""specialisation-zoo: models, theory and metrics for how initialisation shapes learning.

The LightningModules are exported lazily (PEP 562) so that ``zoo.theory`` and ``zoo.metrics``
can be imported from a notebook without importing Lightning.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "DeepLinearNet": "zoo.models.deep_linear",
    "DivergenceError": "zoo.training.divergence",
    "MultiHeadStudent": "zoo.models.student",
    "MultiHeadClassifier": "zoo.models.classifier",
    "SparseAutoencoder": "zoo.models.sae",
    "BetaVAE": "zoo.models.vae",
    "BetaVAESweep": "zoo.models.vae",
    "GDLN": "zoo.models.gdln",
    "ReLUNet": "zoo.models.gdln",
    "Comparison": "zoo.models.gdln",
    "DepthGDLN": "zoo.models.gdln_depth",
}


# module paths before the layout by job (models/, training/, cli/, ...) -> where they live now: a
# user's config with ``class_path: zoo.gdln.GDLN`` or an old checkpoint's hyperparameters keep
# resolving, to the very same module object
MOVED = {
    "deep_linear": "models.deep_linear", "multihead": "models.multihead", "student": "models.student",
    "classifier": "models.classifier", "sae": "models.sae", "vae": "models.vae", "gdln": "models.gdln",
    "gdln_depth": "models.gdln_depth", "reln": "models.reln", "reln_imitation": "models.reln_imitation",
    "gdln_fast": "kernels.gdln", "vae_stacked": "kernels.vae",
    "steps": "training.steps", "logs": "training.logs", "scalar_events": "training.scalar_events",
    "history": "training.history", "checkpoint": "training.checkpoint", "distributed": "training.distributed",
    "divergence": "training.divergence", "progress": "training.progress", "devices": "training.devices",
    "hparams": "training.hparams", "lazy": "training.lazy", "evaluation": "training.evaluation",
    "resume_events": "training.resume_events", "member_modules": "training.member_modules",
    "ensemble": "training.ensemble", "ewc": "training.ewc", "task_switch": "training.task_switch",
    "threads": "utils.threads", "extras": "utils.extras", "labels": "utils.labels",
    "errors": "cli.errors", "config_checks": "cli.config_checks",
    "checkpoint_checks": "cli.checkpoint_checks", "run_summary": "cli.run_summary", "recipes": "cli.recipes",
    "quiet": "cli.quiet", "runs": "cli.runs",
}
MOVED = {f"zoo.{old}": f"zoo.{new}" for old, new in MOVED.items()}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``zoo.<old>`` as the module it moved to (``MOVED``), without a file at the old path."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        self._own_spec = module.__spec__, module.__loader__
        return module

    def exec_module(self, module):
        # the module ran already, at its own path; the import system set the old path's spec on
        # it, which is put back
        module.__spec__, module.__loader__ = self._own_spec


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
