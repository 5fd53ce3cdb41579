"""The bundled recipes: ``zoo recipes`` lists them, and ``--config`` takes one by its name.

A recipe's name is its path under ``recipes/`` without ``.yaml``: ``quickstart``,
``specialisation/fig6_forgetting_vs_similarity``. The files are read where the zoo runs from: the
checkout's top-level ``recipes/`` (an editable install, or ``PYTHONPATH``), else the wheel's
package data ``zoo_recipes`` beside the ``zoo`` package (pyproject.toml maps that package onto
``recipes/``, so the YAML files exist once in the repository).

``--config VALUE`` (:func:`resolve_config`): a path that exists is always that file; otherwise a
bundled name, with or without ``.yaml`` and with or without a leading ``recipes/`` (so the commands
in the README, ``--config recipes/quickstart.yaml``, work from any folder); a YAML or JSON string
(jsonargparse reads one there) passes unchanged; anything else is an error naming what is allowed.
A recipe's description is its first comment line (:func:`description`).

Two-phase recipes (``haste_slowly/fig9_reln_elbow``, ``specialisation/fig13_isae``) read phase
1's checkpoint by a path relative to the working folder (``lightning_logs/version_0/...``,
``checkpoints/fig13/...``): run both phases from the same folder, phase 1 first.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from pathlib import Path

SUFFIX = ".yaml"
# the package that holds the recipes in a wheel (pyproject.toml: package-dir zoo_recipes = "recipes")
PACKAGE = "zoo_recipes"
MAX_DESCRIPTION = 100
CONFIG_HELP = ("--config takes the path of a YAML file or a bundled recipe's name (`zoo recipes` lists them), "
               "e.g. --config quickstart; a file that exists wins over a name. Two-phase recipes read phase 1's "
               "checkpoint from the working folder: run both phases from the same folder, phase 1 first.")
# a value jsonargparse reads as YAML/JSON text rather than as a file name
_INLINE = re.compile(r"[\s:{}\[\]]")
_STOP = re.compile(r"[.!?](?=\s|$)")
# the papers' abbreviations, whose period ends no sentence ("[H] App. B", "Figs. 3-4")
_ABBREVIATIONS = ("App", "Fig", "Figs", "Sec", "Secs", "Eq", "Eqs", "Thm", "Alg", "cf", "vs", "e.g", "i.e", "etc")


def recipes_dir() -> Path:
    """The folder of the bundled recipes: the checkout's ``recipes/``, or the installed package data."""
    root = Path(__file__).resolve().parents[2]
    # a checkout is recognised by its pyproject.toml: site-packages may hold another project's "recipes"
    for folder in ((root / "recipes") if (root / "pyproject.toml").is_file() else None, root / PACKAGE):
        if folder is not None and folder.is_dir():
            return folder
    raise FileNotFoundError(f"no bundled recipes: neither {root / 'recipes'} (a checkout) nor {root / PACKAGE} "
                            "(an installed wheel) exists; reinstall specialisation-zoo")


def bundled(folder: Path | None = None) -> dict[str, Path]:
    """Every bundled recipe, name -> file, sorted by name."""
    folder = recipes_dir() if folder is None else folder
    return {p.relative_to(folder).with_suffix("").as_posix(): p for p in sorted(folder.rglob(f"*{SUFFIX}"))}


def description(path: Path) -> str:
    """The recipe's one-line description: its first comment line.

    A first line that breaks off mid-sentence (the next comment line continues it in lower case or
    with a parenthesis) is joined with its continuation up to the first sentence end; whatever is
    longer than :data:`MAX_DESCRIPTION` characters is cut at a word and ends in an ellipsis."""
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        text = raw.strip()
        if not text.startswith("#"):
            break
        lines.append(text.lstrip("#").strip())
    lines = lines[next((i for i, t in enumerate(lines) if t), len(lines)):]
    if not lines:
        return ""
    text = lines[0]
    for more in lines[1:]:
        # complete: the first line ends a sentence, or the next one starts a new sentence or paragraph
        if _ends_sentence(text) or not more or not (more[0].islower() or more[0] == "("):
            break
        end = _sentence_end(more)
        text += " " + more[:end]
        if end < len(more):
            break
    return _shorten(text)


def _is_stop(text: str, at: int) -> bool:
    return text[:at].split(" ")[-1].lstrip("([") not in _ABBREVIATIONS


def _ends_sentence(text: str) -> bool:
    return text.endswith((".", "!", "?")) and _is_stop(text, len(text) - 1)


def _sentence_end(text: str) -> int:
    """Where the first sentence of ``text`` ends (after its stop), or ``len(text)`` if it goes on."""
    return next((m.end() for m in _STOP.finditer(text) if _is_stop(text, m.start())), len(text))


def _shorten(text: str) -> str:
    if len(text) <= MAX_DESCRIPTION:
        return text
    cut = text[:MAX_DESCRIPTION - 1].rsplit(" ", 1)[0].rstrip(" ,;:")
    return cut + "…"


def name_of(value: str) -> str:
    """The bundled name that ``value`` would mean: without ``.yaml`` and a leading ``recipes/``."""
    name = value.replace("\\", "/").strip()
    name = name[2:] if name.startswith("./") else name
    name = name[len("recipes/"):] if name.startswith("recipes/") else name
    return name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name


def resolve_config(value: str, recipes: dict[str, Path] | None = None) -> str:
    """What ``--config value`` reads: ``value`` itself when it is a file that exists or YAML text,
    else the bundled recipe it names (a path). Raises ``ValueError`` for anything else."""
    # a folder is no config: a folder named like a recipe does not hide it (a pipe, /dev/fd/N, is one)
    if _INLINE.search(value) or (Path(value).exists() and not Path(value).is_dir()):
        return value
    recipes = bundled() if recipes is None else recipes
    name = name_of(value)
    if name in recipes:
        return str(recipes[name])
    what = "a folder, not a file" if Path(value).is_dir() else "no such file"
    raise ValueError(f"--config {value}: {what}, and no bundled recipe of that name{_did_you_mean(name, recipes)}; "
                     "allowed: the path of a YAML file, or a bundled recipe's name (`zoo recipes` lists them, "
                     "e.g. quickstart)")


def _did_you_mean(name: str, recipes: dict[str, Path]) -> str:
    close = difflib.get_close_matches(name, list(recipes), n=3)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def with_bundled_configs(args: list[str]) -> list[str]:
    """Command-line ``args`` with every ``--config``/``-c`` value resolved (:func:`resolve_config`)."""
    out, take_next = [], False
    for arg in args:
        if take_next:
            out.append(resolve_config(arg))
            take_next = False
        elif arg in ("--config", "-c"):
            out.append(arg)
            take_next = True
        elif arg.startswith("--config="):
            out.append("--config=" + resolve_config(arg[len("--config="):]))
        else:
            out.append(arg)
    return out


def listing(recipes: dict[str, Path]) -> str:
    """``zoo recipes``' table: one line per recipe, name then description."""
    width = max((len(n) for n in recipes), default=0)
    return "\n".join(f"{name:<{width}}  {description(path)}".rstrip() for name, path in recipes.items())


def main(argv: list[str]) -> int:
    """``zoo recipes [NAME]``: list the bundled recipes, or print one (to copy and edit)."""
    parser = argparse.ArgumentParser(
        prog="zoo recipes", description="The recipes bundled with the zoo. Run one from any folder with "
        "`zoo fit --config NAME`; print one with `zoo recipes NAME > my.yaml` to edit it.",
        epilog=CONFIG_HELP)
    parser.add_argument("name", nargs="?", help="print this recipe's YAML instead of the list")
    parser.add_argument("--path", action="store_true", help="print where the recipe files are (or NAME's file)")
    opts = parser.parse_args(argv)
    recipes = bundled()
    if opts.name is None:
        return _write(f"{recipes_dir()}\n" if opts.path else listing(recipes) + "\n")
    name = name_of(opts.name)
    if name not in recipes:
        print(f"zoo recipes: no bundled recipe {opts.name!r}{_did_you_mean(name, recipes)}; `zoo recipes` lists them",
              file=sys.stderr)
        return 2
    return _write(f"{recipes[name]}\n" if opts.path else recipes[name].read_text(encoding="utf-8"))


def _write(text: str) -> int:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `zoo recipes | head`: the reader left; no traceback (and none again when Python flushes at exit)
        sys.stdout = open(os.devnull, "w")
    return 0
