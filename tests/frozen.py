"""What a user sees of a recipe's smoke run, recorded so that a refactor can be shown to change none of it.

    python tests/frozen.py          # writes tests/data/frozen_recipes.json from this checkout

For each recipe: the last value of every TensorBoard scalar of its smoke run (all of the run's
event files, every version folder), the set of image tags, and a fingerprint of the final weights
of the module (per tensor: shape, sum, sum of squares, the first 8 values), at one torch thread
(the tests' rule, conftest). ``test_recipes`` compares every smoke run against the file. The file was written before the layout change of
issue 32 and is the frozen reference: rewrite it only for a change of behaviour that is meant.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FROZEN = REPO / "tests" / "data" / "frozen_recipes.json"
# tags whose value is a wall-clock measurement, not a result
CLOCK_TAGS = ("time", "seconds", "throughput", "per_s")


def scalars_and_images(log_root: Path) -> tuple[dict[str, float], list[str]]:
    """The last value (by step, then by file order) of every scalar tag under ``log_root``, and the image tags."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    last: dict[str, tuple[int, float]] = {}
    images: set[str] = set()
    for events in sorted(log_root.rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "images": 1, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        images.update(tags.get("images", []))
        for tag in tags.get("scalars", []):
            for ev in acc.Scalars(tag):
                if tag not in last or ev.step >= last[tag][0]:
                    last[tag] = (ev.step, float(ev.value))
    keep = {t: v for t, (_, v) in last.items() if not any(c in t.lower() for c in CLOCK_TAGS)}
    return dict(sorted(keep.items())), sorted(images)


def weights_fingerprint(module) -> dict[str, list]:
    """Per tensor of the state dict: [shape, sum, sum of squares, first 8 values] in float64."""
    out = {}
    for name, t in module.state_dict().items():
        if not hasattr(t, "detach") or not t.is_floating_point():
            continue
        # numpy's sums: the same order of additions whatever torch's thread count
        flat = t.detach().cpu().double().reshape(-1).numpy()
        out[name] = [list(t.shape), float(flat.sum()), float((flat * flat).sum()), [float(v) for v in flat[:8]]]
    return out


def record(cli) -> dict:
    root = Path(cli.trainer.logger.root_dir if cli.trainer.logger is not None else cli.trainer.default_root_dir)
    scalars, images = scalars_and_images(root)
    return {"scalars": scalars, "images": images, "weights": weights_fingerprint(cli.model)}


def close(a: float, b: float, rel: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b if rel == 0 else abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def differences(got: dict, want: dict, rel: float = 0.0) -> list[str]:
    """Every way ``got`` departs from ``want`` (empty when equal, or within ``rel`` where a kernel was rewritten)."""
    out = []
    for key in ("scalars", "weights"):
        missing, extra = sorted(set(want[key]) - set(got[key])), sorted(set(got[key]) - set(want[key]))
        if missing or extra:
            out.append(f"{key}: missing {missing[:5]}, new {extra[:5]}")
    if sorted(got["images"]) != sorted(want["images"]):
        out.append(f"image tags {sorted(set(want['images']) ^ set(got['images']))[:5]} differ")
    for tag in set(want["scalars"]) & set(got["scalars"]):
        if not close(got["scalars"][tag], want["scalars"][tag], rel):
            out.append(f"scalar {tag}: {got['scalars'][tag]!r} != {want['scalars'][tag]!r}")
    for name in set(want["weights"]) & set(got["weights"]):
        g, w = got["weights"][name], want["weights"][name]
        if g[0] != w[0]:
            out.append(f"weight {name}: shape {g[0]} != {w[0]}")
        elif not all(close(x, y, rel) for x, y in zip([g[1], g[2], *g[3]], [w[1], w[2], *w[3]])):
            out.append(f"weight {name}: fingerprint {g[1:3]} != {w[1:3]}")
    return sorted(out)


def main() -> int:
    import os
    import tempfile

    sys.path.insert(0, str(REPO))
    from tests.conftest import recipe_phase_1, recipe_smoke_args, run_cli
    from tests.helpers_mnist import copy_real_mnist

    import torch

    torch.set_num_threads(1)  # as in the tests
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("ZOO_CACHE", tempfile.mkdtemp(prefix="zoo-cache-"))
    out = {}
    for recipe in sorted((REPO / "recipes").rglob("*.yaml")):
        name = str(recipe.relative_to(REPO / "recipes"))
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            if "# needs-data: MNIST" in recipe.read_text() and not copy_real_mnist(Path(tmp)):
                print("skipped (no MNIST):", name)
                continue
            if (p1 := recipe_phase_1(recipe)) is not None:
                run_cli("fit", "--config", str(p1), "--trainer.enable_progress_bar=false", *recipe_smoke_args(p1))
            cli = run_cli("fit", "--config", str(recipe), "--trainer.enable_progress_bar=false",
                          *recipe_smoke_args(recipe))
            out[name] = record(cli)
            print(name, len(out[name]["scalars"]), "scalars", len(out[name]["weights"]), "tensors", flush=True)
        os.chdir(REPO)
    FROZEN.parent.mkdir(exist_ok=True)
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else FROZEN
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
