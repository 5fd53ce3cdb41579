"""Metrics as pure functions on tensors: no Lightning (usable from a notebook)."""
from zoo.metrics.ntk import empirical_ntk, kernel_distance, linear_ntk
from zoo.metrics.overlaps import entropies, forgetting, order_parameters, transfer

__all__ = ["empirical_ntk", "entropies", "forgetting", "kernel_distance", "linear_ntk", "order_parameters", "transfer"]
