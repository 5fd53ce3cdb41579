"""Invalid settings as one line on stderr and exit code 2, before training starts.

Every setting is checked before the first training batch: jsonargparse checks the types as it
parses, ``zoo.cli.config_checks`` the Trainer's settings, the modules' constructors and ``setup``
their own arguments (``ValueError("Class: param = value; allowed: ...")``). :func:`one_line_errors`
(used by ``zoo.cli.main`` only) reports such an error as one line:

- the module's (or Lightning's, or the OS's) own message, the first cause that jsonargparse did not
  raise (jsonargparse wraps a constructor's error in its union dump);
- a parse error: jsonargparse's parser key as typed (``model.init_args.lr``), the value given and the
  types its error lists (``trainer.precision = bogus; allowed: 64, 32, ..., '16-mixed', ... or null``);
- :class:`~zoo.training.divergence.DivergenceError` (the loss went NaN during training): one line
  with the step, the members and the cause, exit code 1 (the run failed; the settings parsed);
- anything else, or raised after training started, is a bug: the normal traceback.

Lightning logs "Seed set to 0", "GPU available: ..." before a ``setup`` check can fail, so stderr
is held back until the first training batch: the message is the first line. ``ZOO_TRACEBACK=1`` shows
what was held back and the full traceback. In-process callers (``zoo.cli.build_cli``) get the exceptions.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import sys
import traceback
from collections.abc import Iterator

import jsonargparse
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from zoo.cli.before_training import hold_stderr, release_stderr, stop_holding, training_started
from zoo.cli.config_checks import yaml_non_finite  # noqa: F401  (its old home: zoo.cli.errors)
from zoo.training.divergence import DivergenceError

CONFIG_ERROR_EXIT = 2  # argparse's code for a usage error
DIVERGENCE_EXIT = 1
TRACEBACK_ENV = "ZOO_TRACEBACK"
HINT = f"(set {TRACEBACK_ENV}=1 for the full traceback)"
# what a wrong setting raises; AttributeError, RuntimeError and the like are bugs and keep their traceback
CONFIG_ERRORS = (ValueError, TypeError, LookupError, OSError, MisconfigurationException, argparse.ArgumentError)
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)"')
_JSONARGPARSE_DIR = os.path.dirname(os.path.abspath(jsonargparse.__file__)) + os.sep
# how jsonargparse's type names read to a user; other classes read "a <Name>"
_TYPE_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true/false",
               "NoneType": "null", "list": "a list", "tuple": "a list", "dict": "a mapping"}
_PLURALS = {"int": "integers", "float": "numbers", "str": "strings", "bool": "booleans"}


def raising_parser_kwargs(subcommands: tuple[str, ...]) -> dict:
    """LightningCLI ``parser_kwargs`` whose parsers raise instead of printing usage and exiting."""
    return {"exit_on_error": False, **{s: {"exit_on_error": False} for s in subcommands}}


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from, outermost first."""
    seen: list[BaseException] = []
    while err is not None and all(err is not s for s in seen):
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def _from_jsonargparse(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return isinstance(err, argparse.ArgumentError) or (
        tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_JSONARGPARSE_DIR))


def _own(chain: list[BaseException]) -> BaseException | None:
    """The first exception in ``chain`` that jsonargparse did not raise (a constructor's, Lightning's)."""
    return next((e for e in chain if not _from_jsonargparse(e)), None)


def _split(items: str) -> list[str]:
    """``"a, b[c, d], e"`` -> ``["a", "b[c, d]", "e"]``: a list of type names at its top level."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(items):
        depth += (ch in "[(") - (ch in "])")
        if ch == "," and depth == 0:
            parts.append(items[start:i])
            start = i + 1
    return [p.strip() for p in [*parts, items[start:]] if p.strip()]


def describe(type_name: str) -> str:
    """A type as jsonargparse names it (``<class 'float'>``, ``typing.Literal['a', 'b']``,
    ``list[float]``) in a user's words: ``a number``, ``'a', 'b'``, ``a list of numbers``."""
    m = re.fullmatch(r"<class '([\w.]+)'>", type_name)
    if m:
        name = m.group(1).rsplit(".", 1)[-1]
        return _TYPE_NAMES.get(name, f"a {name}")
    head, _, inner = type_name.partition("[")
    head, inner = head.rsplit(".", 1)[-1], inner[:-1]
    if head == "Literal":
        with contextlib.suppress(ValueError, SyntaxError):
            return ", ".join(repr(v) for v in ast.literal_eval(f"[{inner}]"))
    if head.lower() in ("list", "tuple", "sequence", "iterable") and inner:
        item = inner.split(",")[0].strip().rsplit(".", 1)[-1]
        return f"a list of {_PLURALS.get(item, item)}"
    if head.lower() in ("dict", "mapping"):
        return "a mapping"
    return type_name


def _parse_message(chain: list[BaseException]) -> str:
    """jsonargparse's error as one line: the dotted key (``model.init_args.init.init_args.lam``),
    the value given and what its type allows (each union subtype, or the one type)."""
    keys: list[str] = []
    inner = ""
    for e in chain:
        text = str(e).strip()
        m = _PARSER_KEY.match(text)
        if m and (not keys or keys[-1] != m.group(1)):
            keys.append(m.group(1))
            inner = text
        elif text.startswith("Problem with given class_path") and keys and keys[-1] != "init_args":
            keys.append("init_args")
    key = ".".join(keys)
    inner = _PARSER_KEY.sub("", inner, count=1).lstrip(":").strip() if inner else str(chain[-1]).strip()
    given = re.search(r"(?:Given|Got) value: (.*)", inner)
    subtypes = re.search(r"^\s*Subtypes: \[(.*)\]\s*$", inner, re.MULTILINE)
    types = _split(subtypes.group(1)) if subtypes else re.findall(r"^Expected a (.+?)\. Got value", inner)
    if key and given and types:
        allowed = [describe(t) for t in types]
        allowed = ", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 else allowed[0]
        return f"{key} = {given.group(1).strip()}; allowed: {allowed}"
    text = " ".join(inner.split())
    return f"{key}: {text}" if key and not text.startswith(key) else text


def message(err: BaseException) -> str:
    """The one-line message for ``err``: the first cause that jsonargparse did not wrap (the zoo's
    own words), else jsonargparse's parse error with its key (:func:`_parse_message`)."""
    chain = _chain(err)
    own = _own(chain)
    if own is None:
        return _parse_message(chain)
    text = " ".join(str(own).split()) or type(own).__name__
    return f"{type(own).__name__}: {text}" if isinstance(own, (OSError, KeyError)) and ":" not in text else text


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Report configuration errors and divergence as one line and exit (see the module docstring)."""
    hold_stderr()
    try:
        yield
    except DivergenceError as err:
        _exit(err, DIVERGENCE_EXIT)
    except Exception as err:
        if training_started(err) or not isinstance(err, CONFIG_ERRORS):
            raise
        _exit(err, CONFIG_ERROR_EXIT)
    finally:
        stop_holding()


def _exit(err: BaseException, code: int) -> None:
    held = release_stderr(replay=False)
    lines = [message(err)]
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        # jsonargparse raises its errors "from None": show the traceback of the zoo's own exception
        lines += [held.rstrip(), "".join(traceback.format_exception(_own(_chain(err)) or err)).rstrip()]
    else:
        lines.append(HINT)
    sys.stderr.write("\n".join(line for line in lines if line) + "\n")
    sys.stderr.flush()
    raise SystemExit(code) from None
