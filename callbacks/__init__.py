"""Lightning callbacks: thin wrappers that call ``zoo.metrics`` / module methods and log."""
from callbacks.balance import Balance
from callbacks.images import log_matrix, matrix_to_image
from callbacks.network_map import NetworkMap
from callbacks.ntk import NTKDistance
from callbacks.phase import PhaseDiagram
from callbacks.rsm import RSM
from callbacks.singular_values import SingularValues

__all__ = ["Balance", "NetworkMap", "NTKDistance", "PhaseDiagram", "RSM", "SingularValues", "log_matrix", "matrix_to_image"]
