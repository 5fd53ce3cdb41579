"""TEMPORARY (tscallbacks, issue #18): ``member_params`` for the multi-head modules until the
"multihead" branch adds the real attribute; the callbacks read ``pl_module.member_params`` only.
Importing this module installs a property on classes that lack one. Delete after the merge."""
from __future__ import annotations

from zoo.classifier import MultiHeadClassifier
from zoo.student import MultiHeadStudent


def _member_params(module) -> list[dict]:
    E0 = module.ensemble // module.G
    base: list[dict] = [{} for _ in range(E0)]
    for key, scheme in module.schemes.items():
        for name, values in scheme.params.items():
            if len(set(map(float, values))) > 1:
                for e in range(E0):
                    base[e][name + ("2" if key == "init_later_heads" else "")] = float(values[e])
    for e, label in enumerate(module.base_labels):  # the seeds are not kept otherwise (temporary helper)
        seeds = [part[5:] for part in label.split(",") if part.startswith("seed=")]
        if seeds:
            base[e]["seed"] = int(seeds[0])
    if module.xis is not None and len(set(module.xis)) > 1:
        for e in range(E0):
            base[e]["xi"] = float(module.xis[e])
    if module.G == 1:
        return base
    if isinstance(module, MultiHeadStudent):
        sets = [{"gamma": float(g)} for g in getattr(module, "gammas", range(module.G))]
    else:  # the data sets' names, "k=2,draw=1" (temporary: the real attribute holds numbers)
        sets = [{k: float(v) for k, v in (kv.split("=") for kv in name.split(","))}
                for name in getattr(module, "set_names", [f"set={g}" for g in range(module.G)])]
    return [{**b, **s} for b in base for s in sets]


for _cls in (MultiHeadStudent, MultiHeadClassifier):
    if not hasattr(_cls, "member_params"):
        _cls.member_params = property(_member_params)
