"""Ensembles of initialisations shared by the zoo's modules: list-valued scheme parameters (and
per-member seeds, EWC strengths, ...) zipped or, with ``grid: true``, their Cartesian product;
per-member draws; member labels for TensorBoard tags."""
from __future__ import annotations

import torch
from torch import Tensor

from zoo.init import InitScheme

MAX_MEMBER_TAGS = 32
"""Ensembles up to this size log one loss curve per member; larger ones log the mean."""


def replicate_schemes(scheme: InitScheme, E: int, seeds: list[int] | None, shapes, gen_seed: int) -> Tensor:
    """Weights of one layer for E members; with per-member seeds, member e is drawn from seeds[e]."""
    if seeds is None:
        return scheme.weights(shapes, ensemble=E, generator=torch.Generator().manual_seed(gen_seed))[0]
    out = []
    for e in range(E):  # initialisation only: one small draw per member
        member = scheme.member(e)
        out.append(member.weights(shapes, ensemble=1, generator=torch.Generator().manual_seed(seeds[e] + gen_seed))[0])
    return torch.cat(out)


def grid_product(schemes: dict[str, InitScheme], lists: dict[str, list | None]) -> tuple[dict[str, InitScheme], dict[str, list | None]]:
    """Schemes (copies) and per-member lists (``seed``, ``xi``) whose list-valued entries
    enumerate the Cartesian product of all of them (the last-listed varies fastest)."""
    import copy
    import itertools

    axes = [(key, name, values) for key, sch in schemes.items() for name, values in sch._params.items() if len(values) > 1]
    axes += [(None, name, values) for name, values in lists.items() if values is not None and len(values) > 1]
    combos = list(itertools.product(*[values for _, _, values in axes]))
    out = {key: copy.copy(sch) for key, sch in schemes.items()}
    for sch in out.values():
        sch._params = dict(sch._params)
    lists = dict(lists)
    for i, (key, name, _) in enumerate(axes):
        column = [c[i] for c in combos]
        if key is None:
            lists[name] = column
        else:
            out[key]._params[name] = column
    return out, lists


def member_labels(schemes: dict[str, InitScheme], E: int, seeds: list[int] | None = None,
                  xis: list[float] | None = None) -> list[str]:
    """One label per member from the varying parameters, e.g. ``theta=0.3927,xi=1`` (``2`` marks a
    later head's parameter: ``theta2``)."""
    parts = [[] for _ in range(E)]
    for key, scheme in schemes.items():
        varying = [k for k, v in scheme._params.items() if len(v) > 1]
        for e in range(E):
            parts[e] += [f"{k}{'2' if key == 'init_later_heads' else ''}={scheme._params[k][e]:.4g}" for k in varying]
    if seeds is not None and len(set(seeds)) > 1:
        for e in range(E):
            parts[e].append(f"seed={seeds[e]}")
    if xis is not None and len(set(xis)) > 1:
        for e in range(E):
            parts[e].append(f"xi={xis[e]:g}")
    if E > 1 and not any(parts):
        return [f"member{e}" for e in range(E)]
    return [",".join(p) or "member0" for p in parts]
