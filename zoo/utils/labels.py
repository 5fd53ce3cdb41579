"""Member labels: derived from each member's parameters (``member_params``), never parsed back.

An ensemble module keeps ``member_params: list[dict]``, one dict per member (its varying init
parameters, seed, data set, ...). TensorBoard tags and figure legends name a member by the
parameters that vary across the ensemble, e.g. ``theta=0.3927,seed=1``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

MAX_MEMBER_TAGS = 32
"""Ensembles up to this size log one curve per member under its label; larger ones log the mean."""


def format_value(value: object) -> str:
    """Four significant digits for numbers (``0.7854``), ``str`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.4g}"


def member_label(params: Mapping[str, object]) -> str:
    """``k=v`` pairs joined by commas, in the mapping's order."""
    return ",".join(f"{k}={format_value(v)}" for k, v in params.items())


def varying_keys(member_params: Sequence[Mapping[str, object]]) -> list[str]:
    """The keys whose values differ between members, in first-seen order."""
    keys: list[str] = []
    for params in member_params:
        keys += [k for k in params if k not in keys]
    return [k for k in keys if len({repr(p.get(k)) for p in member_params}) > 1]


def member_labels(member_params: Sequence[Mapping[str, object]]) -> list[str]:
    """One label per member from the parameters that vary across the ensemble;
    ``member<e>`` where nothing varies."""
    keys = varying_keys(member_params)
    if not keys:
        return [f"member{e}" for e in range(len(member_params))]
    return [member_label({k: p[k] for k in keys if k in p}) for p in member_params]
