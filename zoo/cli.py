"""The command line: ``lightning fit --config recipes/quickstart.yaml`` (also ``zoo`` and ``python -m zoo``).

A LightningCLI in subclass mode: any LightningModule / LightningDataModule by class path, the
zoo's own also by short name (``class_path: DeepLinearNet``); ``seed_everything`` defaults to
0; the config is saved with each run; TensorBoard is the logger unless the config says
otherwise.

The ``lightning-sdk`` package installs a ``lightning`` command of its own (a cloud CLI without
``fit``). Whichever was installed last owns the name, so when the first argument is not one of
fit/validate/test/predict and ``lightning_sdk`` is importable, the arguments are handed to its
CLI unchanged: installing the zoo never takes that command away.

Bad input: ``main`` reports it as one line and exit code 2 before training (``zoo.errors``); a
``--ckpt_path`` is checked against the configured model (``zoo.checkpoint_checks``) instead of
silently replacing its arguments; Trainer settings and NaNs are checked by ``zoo.config_checks``.
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

    from zoo.checkpoint_checks import check_checkpoint
    from zoo.errors import before_first_batch, yaml_non_finite
    from zoo.config_checks import check_finite_settings, check_trainer_settings

    class ZooCLI(LightningCLI):
        """LightningCLI whose invalid settings are reported before training, not as tracebacks."""

        def instantiate_classes(self) -> None:
            try:
                super().instantiate_classes()
            except (ValueError, TypeError) as err:
                # constructors validate their arguments (ranges, shapes): report it as the CLI
                # reports a parse error, before anything runs
                self.parser.error(f"invalid configuration: {err}")

        def parse_arguments(self, parser, args) -> None:
            # `nan`/`inf` on the command line reach the zoo's finite checks instead of being "a string"
            if isinstance(args, list) or args is None:
                args = yaml_non_finite(sys.argv[1:] if args is None else args)
                self.config = parser.parse_args(args)
            else:
                super().parse_arguments(parser, args)

        def _parse_ckpt_path(self) -> None:
            # Lightning would overwrite the configured model with the checkpoint's hyperparameters
            # (another class, other dims) without a word; with a model configured, the checkpoint is
            # checked against it instead (zoo.checkpoint_checks), before training
            sub = self.config.get("subcommand")
            if sub is None or self.config[sub].get("model") is None:
                super()._parse_ckpt_path()

        def _run_subcommand(self, subcommand: str) -> None:
            with before_first_batch(self.trainer):
                check_trainer_settings(self._get(self.config, "trainer", default={}))
                check_finite_settings(self.config.get(subcommand, self.config).as_dict())
                check_checkpoint(self._get(self.config_init, "ckpt_path"), self.model)
                super()._run_subcommand(subcommand)

    return ZooCLI


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``lightning`` / ``zoo`` scripts. ``args`` defaults to ``sys.argv[1:]``."""
    argv = sys.argv[1:] if args is None else list(args)
    if not _is_ours(argv):
        _run_lightning_sdk(argv)
        return
    from zoo.errors import one_line_errors, raising_parser_kwargs

    # bad input ends as one line and exit code 2, before training (zoo.errors)
    with one_line_errors():
        build_cli(None if args is None else argv, parser_kwargs=raising_parser_kwargs(SUBCOMMANDS))


def build_cli(args: list[str] | None = None, *, run: bool = True, parser_kwargs: dict | None = None):
    """The zoo's LightningCLI on ``args`` (a list, as after the program name, or None for
    ``sys.argv[1:]``); returns it. In-process callers (tests, notebooks) get exceptions.
    ``parser_kwargs`` go to LightningCLI (e.g. ``exit_on_error``)."""

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
        parser_kwargs=parser_kwargs,
    )


if __name__ == "__main__":
    main()
