"""The command line: ``lightning fit --config recipes/quickstart.yaml`` (also ``zoo`` and ``python -m zoo``).

A LightningCLI in subclass mode: any LightningModule / LightningDataModule by class path, the
zoo's own also by short name (``class_path: DeepLinearNet``); ``seed_everything`` defaults to
0; the config is saved with each run; TensorBoard is the logger unless the config says
otherwise.

The ``lightning-sdk`` package installs a ``lightning`` command of its own (a cloud CLI without
``fit``). Whichever was installed last owns the name, so when the first argument is not one of
fit/validate/test/predict and ``lightning_sdk`` is importable, the arguments are handed to its
CLI unchanged: installing the zoo never takes that command away.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def _is_ours(argv: list[str]) -> bool:
    if not argv or argv[0] in SUBCOMMANDS:
        return True
    if importlib.util.find_spec("lightning_sdk") is None:
        return True
    return False


def _run_lightning_sdk(argv: list[str]) -> object:
    entry = importlib.import_module("lightning_sdk.cli.entrypoint")
    sys.argv = [sys.argv[0] if sys.argv else "lightning", *argv]
    return entry.main_cli()


def _cli_class():
    from lightning.pytorch.cli import LightningCLI

    class ZooCLI(LightningCLI):
        """LightningCLI whose invalid constructor arguments are usage errors, not tracebacks."""

        def instantiate_classes(self) -> None:
            try:
                super().instantiate_classes()
            except (ValueError, TypeError) as err:
                # constructors validate their arguments (ranges, shapes): report it as the CLI
                # reports a parse error, before anything runs
                self.parser.error(f"invalid configuration: {err}")

    return ZooCLI


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``lightning`` / ``zoo`` scripts. ``args`` defaults to ``sys.argv[1:]``."""
    argv = sys.argv[1:] if args is None else list(args)
    if not _is_ours(argv):
        _run_lightning_sdk(argv)
        return
    # from a console script, LightningCLI reads sys.argv itself and reports bad input as a
    # usage error (exit code 2) rather than a traceback
    build_cli(None if args is None else argv)


def build_cli(args: list[str] | None = None, *, run: bool = True):
    """The zoo's LightningCLI on ``args`` (a list, as after the program name, or None for
    ``sys.argv[1:]``); returns it. In-process callers (tests, notebooks) get exceptions."""

    # importing them registers the zoo's classes, so YAML can name them by their short names
    import callbacks  # noqa: F401
    import datamodules  # noqa: F401
    import zoo.deep_linear  # noqa: F401
    import zoo.classifier  # noqa: F401
    import zoo.student  # noqa: F401
    import zoo.vae  # noqa: F401
    import zoo.sae  # noqa: F401
    import zoo.gdln  # noqa: F401
    import zoo.gdln_depth  # noqa: F401
    import zoo.init  # noqa: F401

    return _cli_class()(
        model_class=None,
        datamodule_class=None,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )


if __name__ == "__main__":
    main()
