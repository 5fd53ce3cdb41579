"""The zoo as a pip user gets it: a wheel built from the sources, installed (not editable) into a
fresh virtual environment, runs a bundled recipe by name from an empty folder.

The environment sees the packages already installed here (``--system-site-packages``, offline:
``--no-index --no-deps``); the checkout is kept off its path (no ``PYTHONPATH``, another working
folder), and the test checks that ``zoo`` is imported from the environment's own site-packages.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

SOURCES = ("pyproject.toml", "README.md", "zoo", "datamodules", "callbacks", "recipes")
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_the_package_list_names_every_package_folder():
    # pyproject.toml lists its packages (zoo_recipes is recipes/ under another name): a new
    # subpackage or recipe folder missing from the list would be missing from the wheel
    code = {p.parent.relative_to(REPO).as_posix().replace("/", ".")
            for top in ("zoo", "datamodules", "callbacks") for p in (REPO / top).rglob("__init__.py")}
    data = {p.parent.relative_to(REPO / "recipes").as_posix() for p in (REPO / "recipes").rglob("*.yaml")}
    data = {"zoo_recipes" + ("" if d == "." else "." + d.replace("/", ".")) for d in data}
    assert set(SETUPTOOLS["packages"]) == code | data
    assert SETUPTOOLS["package-dir"] == {"zoo_recipes": "recipes"}
    assert all(SETUPTOOLS["package-data"][d] == ["*.yaml"] for d in data)


def _run(*args, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv folder, its site-packages, an environment without the checkout, the wheel's file names)."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    # a copy of the sources: the in-tree build folder of `pip wheel .` stays out of the checkout
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    _run(sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist",
         cwd=tmp, env=env)
    (wheel,) = (tmp / "dist").glob("specialisation_zoo-*.whl")
    venv = tmp / "venv"
    # without pip of its own: the installed pip is seen through --system-site-packages
    _run(sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv, cwd=tmp, env=env)
    python = venv / "bin" / "python"
    own_site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp,
                         env=env).stdout.strip())
    if sys.prefix != sys.base_prefix:
        # the tests run in a virtual environment: its packages are not the system's; a .pth puts them
        # after the new environment's own site-packages (their .pth files, the checkout's editable
        # install among them, are not read)
        (own_site / "outer_environment.pth").write_text(
            "\n".join(p for p in site.getsitepackages() if p.startswith(sys.prefix)) + "\n")
    _run(python, "-m", "pip", "install", "--no-index", "--no-deps", "-q", wheel, cwd=tmp, env=env)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    work = tmp / "work"
    work.mkdir()
    return venv, own_site, env, work, names


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_recipe(installed):
    *_, names = installed
    code = {p.relative_to(REPO).as_posix() for top in ("zoo", "datamodules", "callbacks") for p in (REPO / top).rglob("*.py")}
    recipes = {"zoo_recipes/" + p.relative_to(REPO / "recipes").as_posix() for p in (REPO / "recipes").rglob("*.yaml")}
    assert code <= names and recipes <= names
    assert not any(n.startswith(("tests/", "recipes/", "bench/")) for n in names)


@pytest.mark.slow
def test_the_installed_zoo_is_the_wheels_and_finds_its_recipes(installed):
    venv, site, env, work, _ = installed
    out = _run(venv / "bin" / "python", "-c", "import zoo, zoo.cli.recipes as r; print(zoo.__file__); print(r.recipes_dir())",
               cwd=work, env=env).stdout.split()
    assert out == [str(site / "zoo" / "__init__.py"), str(site / "zoo_recipes")]


@pytest.mark.slow
def test_zoo_recipes_lists_the_bundled_recipes_with_their_descriptions(installed):
    from zoo.cli.recipes import description

    venv, _, env, work, _ = installed
    lines = _run(venv / "bin" / "zoo", "recipes", cwd=work, env=env).stdout.splitlines()
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines}
    for name in ("quickstart", "specialisation/fig6_forgetting_vs_similarity", "haste_slowly/fig9_reln_elbow",
                 "lazy_rich/singular_values"):
        assert listed[name] == description(REPO / "recipes" / f"{name}.yaml")
    assert len(listed) == len(list((REPO / "recipes").rglob("*.yaml")))


@pytest.mark.slow
def test_a_bundled_recipe_runs_by_name_from_an_empty_folder(installed):
    venv, _, env, work, _ = installed
    _run(venv / "bin" / "zoo", "fit", "--config", "quickstart", "--trainer.max_steps=5",
         "--trainer.enable_progress_bar=false", cwd=work, env=env)
    run = work / "lightning_logs" / "version_0"
    assert any(p.name.startswith("events.out.tfevents") for p in run.iterdir())
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "config.yaml").is_file()
