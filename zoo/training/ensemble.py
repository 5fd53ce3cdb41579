"""Ensembles of initialisations shared by the zoo's modules: list-valued scheme parameters (and
per-member seeds, EWC strengths, ...) zipped or, with ``grid: true``, their Cartesian product;
per-member draws; each member's parameters as data (``zoo.utils.labels`` names members from them)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.init import InitScheme, from_spec

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

    axes = [(key, name, values) for key, sch in schemes.items() for name, values in sch.params.items() if len(values) > 1]
    axes += [(None, name, values) for name, values in lists.items() if values is not None and len(values) > 1]
    combos = list(itertools.product(*[values for _, _, values in axes]))
    out = {key: copy.copy(sch) for key, sch in schemes.items()}
    for sch in out.values():
        sch.params = dict(sch.params)
    lists = dict(lists)
    for i, (key, name, _) in enumerate(axes):
        column = [c[i] for c in combos]
        if key is None:
            lists[name] = column
        else:
            out[key].params[name] = column
    return out, lists


def member_params(schemes: dict[str, InitScheme], E: int, seeds: list[int] | None = None,
                  xis: list[float] | None = None) -> list[dict[str, float]]:
    """One dict per member of what tells the members apart: the init parameters that vary (a later
    head's with a ``2`` suffix: ``theta2``; a name two layers share is qualified by its layer,
    ``init.sigma``), and ``seed`` and EWC's ``xi`` where they vary. ``zoo.utils.labels.member_labels``
    names members from it."""
    out: list[dict[str, float]] = [{} for _ in range(E)]
    for key, scheme in schemes.items():
        for name, values in scheme.params.items():
            if len(set(values)) < 2:
                continue
            name = f"{name}2" if key == "init_later_heads" else name
            for e, params in enumerate(out):
                params[f"{key}.{name}" if name in params else name] = values[e]
    for name, values in (("seed", seeds), ("xi", xis)):
        if values is not None and len(set(values)) > 1:
            for e, params in enumerate(out):
                params[name] = values[e]
    return out


def layer_schemes(init, init_heads, init_later_heads=None) -> dict[str, InitScheme]:
    """The schemes of a two-layer multi-head module ([S] Sec. 2.2): ``init`` (of ``W``), ``init_heads``
    and, if given, ``init_later_heads`` (the heads of tasks 2, 3, ...), from specs or schemes,
    with jsonargparse's lazy defaults materialised."""
    schemes = {"init": from_spec(init), "init_heads": from_spec(init_heads)}
    if init_later_heads is not None:
        schemes["init_later_heads"] = from_spec(init_later_heads)
    for scheme in schemes.values():
        scheme.spec()
    return schemes


@dataclass
class Members:
    """The initialisations of an ensemble: checked schemes, one seed and one EWC ``xi`` per member
    (or ``None`` where they are shared), ``E`` members, and the generator seed of shared draws."""
    schemes: dict[str, InitScheme]
    seeds: list[int] | None
    xis: list[float] | None
    E: int
    base_seed: int


def ensemble_size(owner: str, sizes: dict[str, int], ensemble: int | None = None) -> int:
    """The zoo's one ensemble-size rule (docs/models-skeleton.md#ensembles): the common length of the
    list-valued settings ``sizes`` (name -> length; a length of 1 broadcasts to every member).
    ``ensemble`` is a replication count for where every setting is a scalar (that many independent
    draws of the weights) and must equal the lists' length otherwise. A mismatch is an error naming
    every setting and its length."""
    if ensemble is not None and (isinstance(ensemble, bool) or int(ensemble) != ensemble or ensemble < 1):
        raise ValueError(f"{owner}: ensemble = {ensemble!r}; allowed: a positive integer")
    lists = {key: int(n) for key, n in sizes.items() if n > 1} | ({} if ensemble is None else {"ensemble": int(ensemble)})
    if len(set(lists.values())) > 1:
        given = ", ".join(f"{key} = {n}" for key, n in lists.items())
        raise ValueError(f"{owner}: the ensemble sizes disagree ({given}); give lists of one common length (or "
                         "scalars, which broadcast), and leave ensemble unset or equal to that length")
    return next(iter(lists.values()), 1)


def resolve_members(name: str, schemes: dict[str, InitScheme], seed: int | list[int], xis: list[float] | None,
                    grid: bool, ensemble: int | None) -> Members:
    """Zip the list-valued parameters of ``schemes``, ``seed`` and ``xis`` into members (or, with
    ``grid``, take their Cartesian product), sized by :func:`ensemble_size`."""
    seeds = [int(s) for s in seed] if isinstance(seed, (list, tuple)) else None
    if grid:
        schemes, lists = grid_product(schemes, {"seed": seeds, "xi": xis})
        seeds, xis = lists["seed"], lists["xi"]
    schemes = {key: scheme.checked() for key, scheme in schemes.items()}
    sizes = {key: s.ensemble_size for key, s in schemes.items()}
    sizes |= {key: len(values) for key, values in (("seed", seeds), ("ewc.xi", xis)) if values is not None}
    E = ensemble_size(name, sizes, ensemble)
    if seeds is not None and len(seeds) == 1:
        seeds = seeds * E
    if xis is not None and len(xis) == 1:
        xis = xis * E
    return Members(schemes, seeds, xis, E, 0 if seeds is not None else int(seed))


def multi_head_weights(members: Members, n_tasks: int, w_shape: tuple[int, ...],
                       head_shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Initial weights of a two-layer multi-head module: ``W`` (E, *w_shape) from ``init`` and
    the heads (E, n_tasks, *head_shape), task 1's from ``init_heads`` and later ones from
    ``init_later_heads`` when given; each layer (and head) from its own generator seed."""
    s = members.schemes
    W = replicate_schemes(s["init"], members.E, members.seeds, [w_shape], members.base_seed)
    heads = []
    for t in range(n_tasks):
        scheme = s["init_later_heads"] if t > 0 and "init_later_heads" in s else s["init_heads"]
        heads.append(replicate_schemes(scheme, members.E, members.seeds, [head_shape], members.base_seed + 1 + t))
    return W, torch.stack(heads, 1)
