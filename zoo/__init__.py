"""specialisation-zoo: models, theory and metrics for how initialisation shapes learning.

The LightningModules are exported lazily (PEP 562) so that ``zoo.theory`` and ``zoo.metrics``
can be imported from a notebook without importing Lightning.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "DeepLinearNet": "zoo.deep_linear",
    "DivergenceError": "zoo.divergence",
    "MultiHeadStudent": "zoo.student",
    "MultiHeadClassifier": "zoo.classifier",
    "SparseAutoencoder": "zoo.sae",
    "BetaVAE": "zoo.vae",
    "BetaVAESweep": "zoo.vae",
    "GDLN": "zoo.gdln",
    "ReLUNet": "zoo.gdln",
    "Comparison": "zoo.gdln",
    "DepthGDLN": "zoo.gdln_depth",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
