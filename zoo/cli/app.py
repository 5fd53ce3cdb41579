"""The command line: ``lightning fit --config recipes/quickstart.yaml`` (also ``zoo`` and ``python -m zoo``).

``--config`` also takes a bundled recipe by its name (``--config quickstart``) from any folder, and
``zoo recipes`` lists them (``zoo.cli.recipes``).

A LightningCLI in subclass mode: any LightningModule / LightningDataModule by class path, the
zoo's own also by short name (``class_path: DeepLinearNet``); ``seed_everything`` defaults to
0; the config is saved with each run; TensorBoard is the logger unless the config says
otherwise.

The ``lightning-sdk`` package installs a ``lightning`` command of its own (a cloud CLI without
``fit``). Whichever was installed last owns the name, so when the first argument is not one of
fit/validate/test/predict and ``lightning_sdk`` is importable, the arguments are handed to its
CLI unchanged: installing the zoo never takes that command away.

Values that model and data share are given once, to the datamodule: a model argument named in
:data:`LINKED` is set from the datamodule's attribute of that name (``parser.link_arguments``,
applied when the classes are built), whenever the chosen datamodule has that attribute and the
chosen model that argument; otherwise nothing is linked. A model value that contradicts the
data's is an error, not silently replaced (:func:`linked_conflicts`).

``validate`` and ``test`` evaluate a checkpoint: ``lightning test --config R --ckpt_path C`` (or
``--ckpt_path last``, the newest run's ``last.ckpt``) builds the configured model, checks the
checkpoint against it and logs into a new run folder; only ``fit`` adds the ``RunCheckpoint``.

Bad input: ``main`` reports it as one line and exit code 2 before training (``zoo.cli.errors``); a
``--ckpt_path`` is checked against the configured model (``zoo.cli.checkpoint_checks``) instead of
silently replacing its arguments; Trainer settings and NaNs are checked by ``zoo.cli.config_checks``.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

SUBCOMMANDS = ("fit", "validate", "test", "predict")
# model arguments taken from the datamodule's attribute of the same name (zoo.models.student/classifier/vae):
# input size, tasks, classes per task, data sets (teacher sets), image shape
LINKED = ("d", "n_tasks", "n_in", "n_classes", "teacher_sets", "data_sets", "image_shape")


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

    from zoo.cli.checkpoint_checks import check_checkpoint, plain_value
    from zoo.cli.before_training import before_first_batch
    from zoo.cli.config_checks import (check_finite_settings, check_model_without_data, check_trainer_settings,
                                       yaml_non_finite)
    from zoo.training.distributed import register
    from zoo.cli.recipes import CONFIG_HELP, with_bundled_configs

    register()  # strategy "ddp": member-parallel for the ensembles (zoo.training.distributed.EnsembleDDP)

    class ZooCLI(LightningCLI):
        """LightningCLI whose invalid settings are reported before training, not as tracebacks; that
        links the values model and data share, checkpoints every run (``zoo.training.checkpoint.RunCheckpoint``),
        resolves ``--ckpt_path last`` and resumes a run into its own folder (``zoo.cli.runs``)."""

        def add_arguments_to_parser(self, parser) -> None:
            for name in LINKED:
                # "instantiate": the source is the built datamodule's attribute (some are class
                # attributes or derived, e.g. MNISTContinual.n_tasks); a model or datamodule class
                # without that name leaves the link unused (jsonargparse skips it)
                parser.link_arguments(f"data.{name}", f"model.init_args.{name}", compute_fn=plain_value,
                                      apply_on="instantiate")

        def instantiate_trainer(self, **kwargs):
            config = {**(_section(self.config_init, "trainer") or {}), **kwargs}
            if self.subcommand in (None, "fit"):
                kwargs.update(_with_run_checkpoint(config))
            kwargs.update(_member_parallel_settings(config, self.model))
            trainer = super().instantiate_trainer(**kwargs)
            if self.subcommand == "fit":
                _resume_into_run_folder(trainer, _section(self.config_init, "ckpt_path"))
            return trainer

        def instantiate_classes(self) -> None:
            # every setting before any data is read: the Trainer's, then the model's (built once
            # without its data; the CLI builds the datamodule first, and some read files as they do)
            check_trainer_settings(_section(self.config, "trainer") or {})
            try:
                check_model_without_data(self.parser, self.config, LINKED)
                super().instantiate_classes()
                conflicts = linked_conflicts(_section(self.config, "model"), type(self.model), self.datamodule)
                if conflicts:
                    raise ValueError("; ".join(conflicts))
            except (ValueError, TypeError) as err:
                # constructors validate their arguments (ranges, shapes): report it as the CLI
                # reports a parse error, before anything runs
                self.parser.error(f"invalid configuration: {err}")

        def init_parser(self, **kwargs):
            kwargs.setdefault("epilog", CONFIG_HELP)  # --config also takes a bundled recipe's name
            return super().init_parser(**kwargs)

        def parse_arguments(self, parser, args) -> None:
            # `nan`/`inf` on the command line reach the zoo's finite checks instead of being "a string";
            # `--config quickstart`: a bundled recipe by its name (zoo.cli.recipes)
            if isinstance(args, list) or args is None:
                args = with_bundled_configs(yaml_non_finite(sys.argv[1:] if args is None else args))
                self.config = parser.parse_args(args)
            else:
                super().parse_arguments(parser, args)
            _resolve_last_checkpoint(self.config)
            self._ckpt_path = _hide_ckpt_path(self.config)

        def before_instantiate_classes(self) -> None:
            _restore_ckpt_path(self.config, self._ckpt_path)

        # LightningCLI runs a subcommand by the CLI's method of that name when it has one: each wraps
        # the Trainer's, so checks and setup errors come before the first batch (zoo.cli.errors)
        def _checked(self, subcommand: str, **kwargs) -> None:
            with before_first_batch(self.trainer):
                check_finite_settings(self.config.get(subcommand, self.config).as_dict())
                check_checkpoint(kwargs.get("ckpt_path"), self.model)
                from zoo.cli.run_summary import reported_run  # the run's folder, figures, checkpoint at its end

                with reported_run(self.trainer, subcommand, kwargs.get("ckpt_path")):
                    getattr(self.trainer, subcommand)(**kwargs)

        def fit(self, **kwargs) -> None:
            self._checked("fit", **kwargs)

        def validate(self, **kwargs) -> None:
            self._checked("validate", **kwargs)

        def test(self, **kwargs) -> None:
            self._checked("test", **kwargs)

        def predict(self, **kwargs) -> None:
            self._checked("predict", **kwargs)

    return ZooCLI


def _section(config, key: str):
    """``config[key]`` of the running subcommand's section (or of the top level without one)."""
    sub = config.get("subcommand")
    return (config[sub] if sub else config).get(key)


def _hide_ckpt_path(config) -> str | None:
    """Take ``ckpt_path`` out of a config that configures a model; returns it.

    LightningCLI, right after parsing, replaces the configured model by the checkpoint's stored
    arguments (even its class) without a word, and offers no switch for it; with the path out of
    the config until ``before_instantiate_classes`` it has nothing to replace, and the zoo checks the
    checkpoint against the configured model instead (``zoo.cli.checkpoint_checks``). With no model
    configured, Lightning's behaviour (the model from the checkpoint) stays."""
    sub = config.get("subcommand")
    if not sub or config[sub].get("model") is None:
        return None
    path, config[sub]["ckpt_path"] = config[sub].get("ckpt_path"), None
    return path


def _restore_ckpt_path(config, path: str | None) -> None:
    if path is not None:
        config[config["subcommand"]]["ckpt_path"] = path


def linked_conflicts(model_config, model_class: type, datamodule) -> list[str]:
    """What the config gives the model for a :data:`LINKED` argument that differs from the
    datamodule's value (which the model got), as messages; empty when there is nothing to say.

    The link overwrites the model's value, so a recipe from before the links (both values given)
    runs when they agree; when they differ, the user meant something the run would not do. A value
    equal to the argument's default counts as not given (the parser cannot tell them apart)."""
    from zoo.cli.checkpoint_checks import plain_value
    from zoo.cli.config_checks import init_default

    init = getattr(model_config, "init_args", None) if model_config is not None else None
    if init is None or datamodule is None:
        return []
    out = []
    for name in LINKED:
        given = plain_value(init.get(name))
        if given is None or not hasattr(datamodule, name):
            continue
        data = plain_value(getattr(datamodule, name))
        if given != data and given != plain_value(init_default(model_class, name)):
            out.append(f"model.init_args.{name} = {given!r} but the datamodule's {name} = {data!r}; "
                       f"{name} is given once, to data, and the model takes it: drop model.init_args.{name}")
    return out


def _logger_root(trainer_config) -> Path:
    """``<save_dir>/<name>`` of the run's logger as configured (Lightning's default: ./lightning_logs)."""
    logger = trainer_config.get("logger") if trainer_config else None
    init = getattr(logger, "init_args", None) if logger is not None else None
    if init is not None and init.get("save_dir") is not None:
        return Path(init.get("save_dir")) / (init.get("name") or "lightning_logs")
    return Path(trainer_config.get("default_root_dir") or ".") / "lightning_logs"


def _resolve_last_checkpoint(config) -> None:
    """``--ckpt_path last``: the newest run's ``last.ckpt`` under the logger's folder."""
    sub = config.get("subcommand")
    if not sub or config[sub].get("ckpt_path") != "last":
        return
    from zoo.cli.runs import newest_last_checkpoint

    root = _logger_root(config[sub].get("trainer"))
    found = newest_last_checkpoint(root)
    if found is None:
        raise ValueError(f"ckpt_path = 'last': no run with checkpoints/last.ckpt under {root}/version_*; "
                         "allowed: 'last' where a run has saved one, or the path of a .ckpt file")
    config[sub]["ckpt_path"] = str(found)


def _member_parallel_settings(trainer_config: dict, model) -> dict:
    """An ensemble under the member-parallel strategy reads the whole stream on every rank
    (``zoo.training.distributed``): no distributed sampler."""
    from zoo.training.distributed import MemberParallel, STRATEGY_NAME

    strategy = trainer_config.get("strategy")
    named = strategy in (STRATEGY_NAME, "ddp_members") or type(strategy).__name__ == "EnsembleDDP"
    # whole_stream: a module that reads a step schedule and splits batches itself when data-parallel
    if named and isinstance(model, MemberParallel) and (model.n_members() > 1 or getattr(model, "whole_stream", False)):
        return {"use_distributed_sampler": False}
    return {}


def _with_run_checkpoint(trainer_config: dict) -> dict:
    """The Trainer's callbacks with a ``RunCheckpoint`` added, unless checkpointing is off or the
    config has a ``ModelCheckpoint`` of its own (then nothing changes)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from zoo.training.checkpoint import RunCheckpoint

    callbacks = trainer_config.get("callbacks") or []
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if trainer_config.get("enable_checkpointing") is False or any(isinstance(c, ModelCheckpoint) for c in callbacks):
        return {}
    return {"callbacks": [*callbacks, RunCheckpoint()]}


def _resume_into_run_folder(trainer, ckpt_path: str | None) -> None:
    """A run resumed from ``<root>/version_N/checkpoints/*.ckpt`` logs into ``version_N`` again and
    saves its config beside the first one without overwriting it.

    TensorBoard shows each point once: the stopped run's events from the checkpoint's step on are
    purged, and those it logged at that step before the checkpoint was saved are written back
    (``zoo.training.resume_events``; a zoo module's checkpoint records its step and time, whichever callback
    saved it: ``zoo.training.progress.Progress``). A checkpoint without that record (another module's, or the
    zoo's before it had one) keeps the events up to its step."""
    from lightning.pytorch.cli import SaveConfigCallback
    from lightning.pytorch.loggers import TensorBoardLogger

    from zoo.training import resume_events
    from zoo.cli.runs import resumed_config_name, run_folder_of

    logger = trainer.logger
    if not ckpt_path or not isinstance(logger, TensorBoardLogger) or not Path(ckpt_path).is_file():
        return
    folder = run_folder_of(ckpt_path, logger.root_dir)
    if folder is None:
        return
    import torch

    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
        step = int(ckpt["global_step"])
        point = ckpt.get(resume_events.KEY)
        # without the record: "log_step_resumed", where the zoo's checkpoints of before the record said
        # where a module logging on an axis of its own logs first; else Lightning's rule, after the step
        purge_step = int(point["step"]) if point else int(ckpt.get("log_step_resumed", step + 1))
    except Exception:  # an unreadable checkpoint is reported when Lightning loads it
        return
    # the stopped run's events are read on the rank that writes them (the file is read whole)
    kept = (resume_events.events_before_save(folder, purge_step, float(point["saved_at"]))
            if point and trainer.is_global_zero else [])
    # default_hp_metric=False: the first part of the run wrote the HPARAMS placeholder already
    trainer.logger = TensorBoardLogger(logger.save_dir, name=logger.name, version=folder.name,
                                       default_hp_metric=False, purge_step=purge_step)
    resume_events.write_back(trainer.logger, kept)
    for cb in trainer.callbacks:
        if isinstance(cb, SaveConfigCallback):
            cb.config_filename = resumed_config_name(folder, step)


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``lightning`` / ``zoo`` scripts. ``args`` defaults to ``sys.argv[1:]``."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["recipes"]:  # `zoo recipes`: the bundled recipes (zoo.cli.recipes)
        from zoo.cli.recipes import main as list_recipes

        sys.exit(list_recipes(argv[1:]))
    if not _is_ours(argv):
        _run_lightning_sdk(argv)
        return
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from zoo.cli.errors import one_line_errors, raising_parser_kwargs

    try:
        # bad input ends as one line and exit code 2, before training (zoo.cli.errors)
        with one_line_errors():
            build_cli(None if args is None else argv, parser_kwargs=raising_parser_kwargs(SUBCOMMANDS))
    except SIGTERMException:
        # RunCheckpoint saved the state after the last finished batch; a scheduler that requeues
        # the job sees a failure, not a finished run. Rank 0's end-of-run block (stdout) has already
        # said where the checkpoint is and how to resume: one line here, on every rank, for logs
        # that keep stderr only
        print("zoo: stopped by SIGTERM (exit code 143)", file=sys.stderr)
        sys.exit(143)


def build_cli(args: list[str] | None = None, *, run: bool = True, parser_kwargs: dict | None = None):
    """The zoo's LightningCLI on ``args`` (a list, as after the program name, or None for
    ``sys.argv[1:]``); returns it. In-process callers (tests, notebooks) get exceptions.
    ``parser_kwargs`` go to LightningCLI (e.g. ``exit_on_error``)."""

    # importing them registers the zoo's classes, so YAML can name them by their short names
    import callbacks  # noqa: F401
    import datamodules  # noqa: F401
    import zoo.models.deep_linear  # noqa: F401
    import zoo.models.classifier  # noqa: F401
    import zoo.models.student  # noqa: F401
    import zoo.models.vae  # noqa: F401
    import zoo.models.sae  # noqa: F401
    import zoo.models.gdln  # noqa: F401
    import zoo.models.gdln_depth  # noqa: F401
    import zoo.models.reln_imitation  # noqa: F401
    import zoo.init  # noqa: F401

    from zoo.cli.quiet import quiet_run

    with quiet_run():  # no Lightning tips nor third-party deprecations during the run (zoo.cli.quiet)
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
