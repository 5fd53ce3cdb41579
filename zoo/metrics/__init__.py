"""Metrics as pure functions on tensors: no Lightning (usable from a notebook)."""
from zoo.metrics.dci import dci, dci_from_importance, dci_on_grid
from zoo.metrics.fisher import fisher_diagonal, fisher_summary, select_parameters
from zoo.metrics.ntk import empirical_ntk, kernel_distance, linear_ntk
from zoo.metrics.overlaps import entropies, forgetting, order_parameters, transfer
from zoo.metrics.sparsity import sparsity

__all__ = [
    "dci", "dci_from_importance", "dci_on_grid", "empirical_ntk", "entropies", "fisher_diagonal", "fisher_summary",
    "forgetting", "kernel_distance", "linear_ntk", "order_parameters", "select_parameters", "sparsity", "transfer",
]
