"""Metrics as pure functions on tensors: no Lightning (usable from a notebook)."""
from zoo.metrics.ntk import empirical_ntk, kernel_distance, linear_ntk

__all__ = ["empirical_ntk", "kernel_distance", "linear_ntk"]
