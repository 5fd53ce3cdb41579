"""The layers of the house (docs/development.md): every import, at module level or inside a function,
runs downwards: cli -> callbacks, datamodules -> models -> training, kernels -> theory, metrics,
analysis, plots, init -> utils. A package may import its own layer's other packages."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYER = {
    "zoo.utils": 0,
    "zoo.init": 1, "zoo.theory": 1, "zoo.metrics": 1, "zoo.analysis": 1, "zoo.plots": 1,
    "zoo.training": 2, "zoo.kernels": 2,
    "zoo.models": 3,
    "callbacks": 4, "datamodules": 4,
    "zoo.cli": 5,
}


def layer_of(module: str) -> str | None:
    """The layer's package of a dotted module name (``zoo`` itself, the public names, has none)."""
    for pkg in sorted(LAYER, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return None


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text())
    here = ".".join(path.relative_to(REPO).with_suffix("").parts)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")[: -node.level]
                base = ".".join(parts + ([base] if base else []))
            # `from zoo.training import logs` imports zoo.training.logs
            out += [(node.lineno, f"{base}.{a.name}" if base in LAYER or base == "zoo" else base) for a in node.names]
    return out


FILES = sorted(p for pkg in ("zoo", "callbacks", "datamodules") for p in (REPO / pkg).rglob("*.py"))


def upward_imports() -> list[str]:
    bad = []
    for path in FILES:
        own = layer_of(".".join(path.relative_to(REPO).with_suffix("").parts))
        if own is None:
            continue
        for line, module in imports(path):
            # `from zoo import DeepLinearNet`: the public names are the models' layer
            target = "zoo.models" if module.startswith("zoo.") and layer_of(module) is None else layer_of(module)
            if target is not None and LAYER[target] > LAYER[own]:
                bad.append(f"{path.relative_to(REPO)}:{line} ({own}) imports {module} ({target})")
    return bad


def test_every_file_is_in_a_layer():
    loose = [p.relative_to(REPO) for p in FILES if layer_of(".".join(p.relative_to(REPO).with_suffix("").parts)) is None
             and p.parent != REPO / "zoo"]
    assert loose == []
    # the top of the package holds the public names, `python -m zoo` and the init registry only
    assert sorted(p.name for p in (REPO / "zoo").glob("*.py")) == ["__init__.py", "__main__.py", "init.py"]


def test_no_import_runs_upward():
    assert upward_imports() == []


@pytest.mark.parametrize("module,layer", [("zoo.models.gdln", "zoo.models"), ("zoo.cli", "zoo.cli"),
                                          ("callbacks.vae", "callbacks"), ("zoo.init", "zoo.init"), ("zoo", None)])
def test_layer_of(module, layer):
    assert layer_of(module) == layer


def test_old_module_paths_are_the_moved_modules():
    """``zoo.MOVED``: a config or checkpoint naming a module by its path before the layout change
    gets the very module that moved (one object, its own name), with no file left at the old path."""
    import importlib

    import zoo

    assert len(zoo.MOVED) > 30
    for old, new in zoo.MOVED.items():
        assert not (REPO / (old.replace(".", "/") + ".py")).exists(), old
        moved = importlib.import_module(old)
        assert moved is importlib.import_module(new) and moved.__name__ == new and moved.__spec__.name == new


def test_a_config_with_an_old_class_path_builds_the_model(tmp_path, monkeypatch):
    from zoo.cli import build_cli
    from zoo.models.deep_linear import DeepLinearNet

    monkeypatch.chdir(tmp_path)
    cli = build_cli(["--config", str(REPO / "recipes" / "quickstart.yaml"),
                     "--model.class_path=zoo.deep_linear.DeepLinearNet", "--trainer.logger=false"], run=False)
    assert type(cli.model) is DeepLinearNet
