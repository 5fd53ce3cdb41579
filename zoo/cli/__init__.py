"""The command line (``zoo fit``, ``lightning fit``): LightningCLI, config checks, one-line error
messages, run folders. The composition root: the only layer that imports ``callbacks`` and
``datamodules`` to offer them on the command line.
"""
from zoo.cli.app import LINKED, build_cli, linked_conflicts, main

__all__ = ["LINKED", "build_cli", "linked_conflicts", "main"]
