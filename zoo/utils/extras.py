"""Optional dependencies: the parts of the zoo that need a package of their own name the pip extra
that installs it (pyproject.toml ``[project.optional-dependencies]``).

:func:`require` is called where such a part starts (a datamodule's file reading, a callback's
constructor), so a missing package stops the run before training with the command that fixes it,
not with a bare ``ModuleNotFoundError`` deep inside the first evaluation.
"""
from __future__ import annotations

import importlib
from types import ModuleType

DISTRIBUTION = "specialisation-zoo"


class MissingExtra(ModuleNotFoundError, LookupError):
    """An optional dependency is not installed. A ``ModuleNotFoundError``, so ``except ImportError``
    still catches it; also a ``LookupError``, one of the kinds that ``zoo.cli.errors`` reports as a
    setting (one line, exit code 2) rather than as a bug."""


def require(module: str, extra: str, what_for: str) -> ModuleType:
    """``import module``, or raise :class:`MissingExtra` saying which extra installs it.

    Args:
        module: the import name (``"h5py"``, ``"sklearn"``).
        extra: the extra of ``specialisation-zoo`` that brings it (``"shapes"``).
        what_for: what needs it, as the user knows it (``"datamodules.shapes.Shapes3D (3dshapes files)"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        # only the module itself missing is ours to explain; a broken install of it keeps its own message
        if not (isinstance(err, ModuleNotFoundError) and err.name in (module, module.split(".")[0])):
            raise
        raise MissingExtra(f"{what_for} needs {module!r}, which is not installed; install it with: "
                           f"pip install \"{DISTRIBUTION}[{extra}]\"", name=module) from err
