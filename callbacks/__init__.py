"""Lightning callbacks: thin wrappers that call ``zoo.metrics`` / module methods and log."""
from callbacks.balance import Balance
from callbacks.entropy_phase import EntropyPhaseDiagram
from callbacks.error_curves import ErrorCurves
from callbacks.forgetting import Forgetting
from callbacks.gdln import LossCurves, PathwaySingularValues, StereotypicalLoss, XorLearningTimes
from callbacks.network_map import NetworkMap
from callbacks.ntk import NTKDistance
from callbacks.phase import PhaseDiagram
from callbacks.reln import ActivationPatterns, HiddenMDS
from callbacks.rsm import RSM
from callbacks.singular_values import SingularValues
from callbacks.sparsity import Sparsity
from callbacks.teacher_student import Entropies, OrderParameters, TheoryOverlay
from callbacks.vae import DCI, LatentTraversals, Reconstructions, SweepFigure

__all__ = [
    "ActivationPatterns", "Balance", "DCI", "Entropies", "EntropyPhaseDiagram", "ErrorCurves", "Forgetting",
    "HiddenMDS", "LatentTraversals", "LossCurves", "NetworkMap", "NTKDistance", "OrderParameters", "PathwaySingularValues",
    "PhaseDiagram", "Reconstructions", "RSM", "SingularValues", "Sparsity", "StereotypicalLoss", "SweepFigure", "TheoryOverlay",
    "XorLearningTimes",
]
