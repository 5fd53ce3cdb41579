"""Metrics as pure functions on tensors: no Lightning (usable from a notebook)."""
