"""No private torch or Lightning name in the product code but those docs/development.md lists (issue
#32, item 4: "Lightning's public API only").

The scan (AST) over zoo/, callbacks/ and datamodules/ finds: an underscore attribute (not a dunder)
read or written on anything but ``self``, ``cls``, ``super()`` or a name of the module itself,
unless the project defines that name itself (a method, a ``self._x`` attribute, a module's global:
the zoo's own private names, used across its modules); the same through ``getattr``/``setattr``/
``hasattr``/``delattr`` with a constant name; an import of an underscore module or name from outside
the project (``torch._dynamo``, ``from lightning... import _x``); and any read or write through
Lightning's ``fit_loop`` (its loops' state, public names but no public contract). Each finding is
a pair (file, name); the section "## Private names that remain" of docs/development.md lists each
that remains as a bullet ``- `file`, `name`: the reason``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("zoo", "callbacks", "datamodules")
SECTION = "## Private names that remain"
ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_names(tree: ast.AST) -> set[str]:
    """Every name a piece of source defines: functions, classes, arguments, assigned names and
    attributes assigned on anything (``self._x = ...``, ``obj._y: int = ...``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
    return names


def _module_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level: its own definitions and what it imports from the
    project (``torch``, imported, is not the module's own)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ImportFrom) and not _outside(node):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in ROOTS)
    return names


def _own(base: ast.expr, own: set[str]) -> bool:
    if isinstance(base, ast.Name):
        return base.id in ("self", "cls") or base.id in own
    return isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"


def _outside(node: ast.ImportFrom) -> bool:
    """An import from outside the project (not relative, not of zoo/callbacks/datamodules)."""
    return node.level == 0 and node.module.split(".")[0] not in (*ROOTS, "__future__")


def findings(source: str, project: set[str]) -> set[str]:
    """The private names ``source`` uses (see the module docstring); ``project``: the names the
    project defines."""
    tree = ast.parse(source)
    own = _module_names(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == "fit_loop":
                found.add("fit_loop")
            elif _private(node.attr) and not _own(node.value, own) and node.attr not in project:
                found.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            name = node.args[1].value
            if name == "fit_loop" or (_private(name) and not _own(node.args[0], own) and name not in project):
                found.add(name)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] not in ROOTS
                         and any(_private(part) for part in a.name.split(".")))
        elif isinstance(node, ast.ImportFrom) and _outside(node):
            if any(_private(part) for part in node.module.split(".")):
                found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if _private(a.name))
    return found


def _sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


def scan() -> set[tuple[str, str]]:
    sources = _sources()
    project = set().union(*(defined_names(ast.parse(s)) for s in sources.values()))
    return {(path, name) for path, s in sources.items() for name in findings(s, project)}


def listed() -> dict[tuple[str, str], str]:
    """docs/development.md's section: (file, name) -> the reason given."""
    page = (REPO / "docs" / "development.md").read_text()
    assert SECTION in page, f"docs/development.md has no section {SECTION!r}"
    section = page.split(SECTION, 1)[1].split("\n## ", 1)[0]
    entries = {}
    for line in section.splitlines():
        m = re.match(r"^- `([^`]+\.py)`, `([^`]+)`: (.+)", line)
        if m:
            entries[(m.group(1), m.group(2))] = m.group(3).strip()
    return entries


def test_no_private_name_but_those_listed_with_their_reason():
    unlisted = scan() - set(listed())
    assert not unlisted, (f"private names not listed under {SECTION!r} in docs/development.md "
                          f"(replace them with public API, or list each with its reason): {sorted(unlisted)}")


def test_every_listed_name_is_still_used_and_has_a_reason():
    entries = listed()
    assert not set(entries) - scan(), f"listed but no longer used: {sorted(set(entries) - scan())}"
    assert all(len(reason) > 20 for reason in entries.values())


PLANTED = '''
import torch._dynamo
from lightning.pytorch.loops.progress import _BatchProgress
from lightning.pytorch.utilities import _x_helper
from zoo.theory.linear import _tensors
from ._local import thing
import torch


def _helper():
    return 1


_helper._cache = {}


class Box:
    def step(self, writer, trainer, obj):
        torch._fused_adam_([])
        writer._get_file_writer().add_summary(None)
        trainer.fit_loop.epoch_loop.batch_progress.total.ready
        getattr(torch, "_foreach_add_", None)
        setattr(trainer, "fit_loop", None)
        obj._zoo_own = 1
        self._mine, cls_ = self._mine, type(self)
        super()._base()
        obj.__class__, obj.__dict__
        getattr(self, "_mine", None)
        return obj._zoo_own, _tensors
'''


def test_the_scan_finds_a_planted_example_and_only_it():
    found = findings(PLANTED, project=defined_names(ast.parse(PLANTED)))
    assert found == {"torch._dynamo", "lightning.pytorch.loops.progress._BatchProgress",
                     "lightning.pytorch.utilities._x_helper", "_fused_adam_", "_get_file_writer",
                     "fit_loop", "_foreach_add_"}
    # a name the project does not define is private to someone else, on any object
    assert "_zoo_own" in findings(PLANTED, project=set())
