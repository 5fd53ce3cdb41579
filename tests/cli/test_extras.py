"""Optional dependencies (zoo.utils.extras): a missing one stops its part before training, naming the pip
extra that installs it, and that extra (pyproject.toml) does install it."""
from __future__ import annotations

import sys
import tomllib

import pytest

from tests.conftest import REPO
from zoo.utils.extras import MissingExtra, require

EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _block(monkeypatch, module: str) -> None:
    """``import module`` fails as it does where the package is not installed (ModuleNotFoundError)."""
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)


def test_require_returns_the_module_when_it_is_there():
    import json

    assert require("json", "shapes", "a test") is json


def test_a_missing_module_names_the_extra_and_stays_an_import_error(monkeypatch):
    _block(monkeypatch, "h5py")
    with pytest.raises(ImportError) as err:
        require("h5py", "shapes", "3dshapes files")
    assert isinstance(err.value, MissingExtra) and err.value.name == "h5py"
    assert str(err.value) == ("3dshapes files needs 'h5py', which is not installed; install it with: "
                              'pip install "specialisation-zoo[shapes]"')


def test_a_broken_install_keeps_its_own_error(tmp_path, monkeypatch):
    # the package is there but one of its own imports is missing: not ours to explain
    (tmp_path / "zoo_extras_probe.py").write_text("import zoo_extras_probe_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as err:
        require("zoo_extras_probe", "shapes", "a test")
    assert not isinstance(err.value, MissingExtra) and err.value.name == "zoo_extras_probe_dependency"


@pytest.mark.parametrize("extra, distribution", [("shapes", "h5py"), ("dci", "scikit-learn"), ("reln", "scikit-learn")])
def test_each_extra_named_in_a_message_installs_its_package(extra, distribution):
    assert any(req.startswith(distribution + ">=") for req in EXTRAS[extra])
    assert extra in EXTRAS["all"][0] and "specialisation-zoo[all]" in EXTRAS["dev"]


def test_shapes3d_without_h5py_names_the_shapes_extra_before_any_work(tmp_path, monkeypatch):
    from datamodules.shapes import generate_shapes3d, read_shapes3d

    _block(monkeypatch, "h5py")
    for call in (lambda: generate_shapes3d(tmp_path / "s.h5", resolution=8, subsample=10),
                 lambda: read_shapes3d(tmp_path / "s.h5", [[0]] * 6, 8)):
        with pytest.raises(MissingExtra, match=r'pip install "specialisation-zoo\[shapes\]"'):
            call()
    assert list(tmp_path.iterdir()) == []


def test_dci_without_scikit_learn_names_the_dci_extra_when_built(monkeypatch):
    from callbacks.vae import DCI
    from zoo.metrics.dci import DCIMetric

    _block(monkeypatch, "sklearn")
    for build in (DCI, DCIMetric):
        with pytest.raises(MissingExtra, match=r'specialisation-zoo\[dci\]'):
            build()


def test_reln_discovery_without_scikit_learn_names_the_reln_extra_when_built(monkeypatch):
    from callbacks.reln import ActivationPatterns

    _block(monkeypatch, "sklearn")
    with pytest.raises(MissingExtra, match=r'ActivationPatterns .*specialisation-zoo\[reln\]'):
        ActivationPatterns()


def test_the_cli_reports_a_missing_extra_in_one_line_before_training(in_tmp, capsys, monkeypatch):
    from zoo.cli import main

    _block(monkeypatch, "sklearn")
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(REPO / "recipes" / "haste_slowly" / "fig8_9_reln_discovery.yaml"),
              "--trainer.max_steps=2", "--trainer.enable_progress_bar=false"])
    assert done.value.code == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("ActivationPatterns") and first.endswith('pip install "specialisation-zoo[reln]"')
    assert not (in_tmp / "lightning_logs").exists()
