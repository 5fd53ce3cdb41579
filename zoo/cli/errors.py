"""Invalid settings as one line on stderr and exit code 2, before training starts.

The zoo's constructors and ``setup`` hooks raise ``ValueError("Class: param = value; allowed:
...")``. By the time such an error reaches the user, jsonargparse has wrapped it in a union dump
("Does not validate against any of the Union subtypes ...") and printed a usage block, or Lightning
has let it end in a traceback. :func:`one_line_errors` (used by ``zoo.cli.main`` only) reports the
innermost message instead:

- raised while parsing or building the classes, or during ``fit`` before the first training batch
  (``prepare_data``/``setup``, checkpoint checks, the Trainer's own checks): one line, exit code 2
  (argparse's code for a usage error);
- :class:`~zoo.training.divergence.DivergenceError` (a loss that went NaN during training): one line with
  the step, the members and the cause, exit code 1 (the run failed; the settings parsed);
- anything else raised after training started is a bug, not a setting: the normal traceback.
  Before training, the kinds in :data:`CONFIG_ERRORS` count as settings, and a ``RuntimeError``
  only when the zoo's own code raised it (a corrupt data file), not torch.

Lightning logs "Seed set to 0", "GPU available: ..." and warnings before any error from
``setup`` can happen; stderr is held back until the first training batch so that the message is
the first line (what was held back is shown with ``ZOO_TRACEBACK=1``, or once training starts).

``ZOO_TRACEBACK=1`` in the environment shows the full traceback in every case. In-process callers
(``zoo.cli.build_cli``) get the exceptions themselves.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import linecache
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator

import jsonargparse
from lightning.pytorch import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from zoo.training.divergence import DivergenceError

CONFIG_ERROR_EXIT = 2
DIVERGENCE_EXIT = 1
TRACEBACK_ENV = "ZOO_TRACEBACK"
HINT = f"(set {TRACEBACK_ENV}=1 for the full traceback)"

# what a wrong setting raises; AttributeError, NameError and the like are bugs and keep their traceback
CONFIG_ERRORS = (ValueError, TypeError, LookupError, OSError, MisconfigurationException, argparse.ArgumentError)
# a float the YAML loader reads as a string when written the Python way ("nan", "-inf")
_NON_FINITE = re.compile(r"^([+-]?)(nan|inf|infinity)$", re.IGNORECASE)
_NON_FINITE_ITEM = re.compile(r"(?<![\w.])([+-]?)(nan|inf|infinity)(?![\w])", re.IGNORECASE)
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":')
_EXPECTED = re.compile(r"^Expected a <class '([\w.]+)'>\. Got value: (.*)$", re.DOTALL)
_STARTED = "_zoo_training_started"
# the packages whose RuntimeErrors are messages for the user (zoo, datamodules, callbacks)
_OWN_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), name) + os.sep
                  for name in ("zoo", "datamodules", "callbacks"))
_JSONARGPARSE_DIR = os.path.dirname(os.path.abspath(jsonargparse.__file__)) + os.sep


def raising_parser_kwargs(subcommands: tuple[str, ...]) -> dict:
    """LightningCLI ``parser_kwargs`` whose parsers raise instead of printing usage and exiting."""
    return {"exit_on_error": False, **{s: {"exit_on_error": False} for s in subcommands}}


def yaml_non_finite(args: list[str]) -> list[str]:
    """``args`` with ``nan``/``inf``/``-inf`` values spelled as YAML floats (``.nan``, ``-.inf``).

    jsonargparse reads command-line values as YAML, where ``nan`` is a string: without this, the
    parser rejects it as "a string" before the zoo's own finite check can name the parameter.
    """
    def spell(m: re.Match) -> str:
        return f"{m.group(1)}.{'nan' if m.group(2).lower() == 'nan' else 'inf'}"

    def fix(value: str) -> str:
        if value.lstrip().startswith(("[", "{")):  # a list or mapping: each element
            return _NON_FINITE_ITEM.sub(spell, value)
        m = _NON_FINITE.match(value.strip())
        return value if m is None else spell(m)

    out: list[str] = []
    for i, a in enumerate(args):
        prev = args[i - 1] if i > 0 else ""
        if a.startswith("--") and "=" in a:
            key, _, value = a.partition("=")
            out.append(f"{key}={fix(value)}")
        elif prev.startswith("--") and "=" not in prev and fix(a) != a:
            out[-1] = f"{prev}={fix(a)}"  # joined: argparse would take "-inf" for an option
        else:
            out.append(a)
    return out


def is_config_error(err: BaseException) -> bool:
    """Whether ``err``, raised before training, reports a setting: one of :data:`CONFIG_ERRORS`, or
    a ``RuntimeError`` that the zoo's own code raised (a corrupt data file), not torch's."""
    if isinstance(err, CONFIG_ERRORS):
        return True
    return (isinstance(err, RuntimeError) and not isinstance(err, NotImplementedError) and _raised_in(err, _OWN_DIRS)
            and _raise_statement(err))


def _raise_statement(err: BaseException) -> bool:
    """Whether ``err`` comes from a ``raise`` in Python code, not from a torch op called there (a C
    function adds no frame, so its errors seem to come from the line that called it)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).lstrip().startswith(
        "raise")


def _raised_in(err: BaseException, folders: tuple[str, ...]) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(folders)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from, outermost first."""
    seen: list[BaseException] = []
    while err is not None and all(err is not s for s in seen):
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def _from_jsonargparse(err: BaseException) -> bool:
    return _raised_in(err, (_JSONARGPARSE_DIR,))


def _key_path(chain: list[BaseException]) -> str:
    """The dotted parameter name (``model.init_args.lr``) from jsonargparse's nested 'Parser key' errors."""
    keys: list[str] = []
    for e in chain:
        first = str(e).lstrip().split("\n", 1)[0]
        m = _PARSER_KEY.match(first)
        if m and (not keys or keys[-1] != m.group(1)):
            if keys and any(s.startswith("Problem with given class_path") for s in str(e).split("\n")[:1]):
                keys.append("init_args")
            keys.append(m.group(1))
        elif first.startswith("Problem with given class_path") and keys:
            keys.append("init_args")
    return ".".join(keys)


def _own(chain: list[BaseException]) -> BaseException | None:
    """The first exception in ``chain`` that jsonargparse did not raise (a constructor's, Lightning's)."""
    return next((e for e in chain if not _from_jsonargparse(e) and not isinstance(e, argparse.ArgumentError)), None)


def message(err: BaseException) -> str:
    """The one-line message for ``err``: the first cause that jsonargparse did not wrap (the zoo's
    own words), or for a parse error, the parameter, the value and the type expected."""
    chain = _chain(err)
    own = _own(chain)
    if own is not None:
        # the zoo's own message (or Lightning's, or the OS's) already names the setting
        text = " ".join(str(own).split()) or type(own).__name__
        return f"{type(own).__name__}: {text}" if isinstance(own, (OSError, KeyError)) and ":" not in text else text
    inner = chain[-1]
    text = " ".join(str(inner).split())
    key = _key_path(chain)
    m = _EXPECTED.match(str(inner).strip())
    if key and m:
        return f"{key} = {m.group(2).strip()}; allowed: a value of type {m.group(1)}"
    return f"{key}: {text}" if key and not text.startswith(key) else text


class _DeferredStderr:
    """Holds back what Python writes to stderr (Lightning's "Seed set to 0", "GPU available: ...",
    warnings) until training starts, so that a configuration error is the first line the user sees."""

    def __init__(self) -> None:
        self.real, self.buffer = sys.stderr, io.StringIO()
        loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                           if isinstance(v, logging.Logger))]
        self.handlers = [h for lg in loggers for h in lg.handlers
                         if isinstance(h, logging.StreamHandler) and h.stream is self.real]
        for h in self.handlers:
            h.setStream(self.buffer)
        sys.stderr = self.buffer
        self.active = True

    def release(self, replay: bool = True) -> str:
        """Restore stderr; write what was held back to it when ``replay``. Returns that text."""
        if not self.active:
            return ""
        self.active = False
        if sys.stderr is self.buffer:
            sys.stderr = self.real
        for h in self.handlers:
            if h.stream is self.buffer:
                h.setStream(self.real)
        held = self.buffer.getvalue()
        if replay and held:
            self.real.write(held)
            self.real.flush()
        return held


_deferred: _DeferredStderr | None = None


def _release_stderr() -> None:
    if _deferred is not None:
        _deferred.release()


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Report configuration errors and divergence as one line and exit (see the module docstring)."""
    global _deferred
    _deferred = _DeferredStderr()
    try:
        yield
    except DivergenceError as err:
        _exit(err, DIVERGENCE_EXIT)
    except Exception as err:
        if getattr(err, _STARTED, False) or not is_config_error(err):
            raise
        _exit(err, CONFIG_ERROR_EXIT)
    finally:
        _release_stderr()
        _deferred = None


def _exit(err: BaseException, code: int) -> None:
    held = _deferred.release(replay=False) if _deferred is not None else ""
    lines = [message(err)]
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        # jsonargparse raises its errors "from None": show the traceback of the zoo's own exception
        source = _own(_chain(err)) or err
        lines += [held.rstrip(), "".join(traceback.format_exception(source)).rstrip()]
    else:
        lines.append(HINT)
    sys.stderr.write("\n".join(line for line in lines if line) + "\n")
    sys.stderr.flush()
    raise SystemExit(code) from None


class _FirstBatch(Callback):
    """Notes when the first batch starts (errors before it are the settings' fault) and lets stderr
    through from then on. The batches of the sanity check still count as "before"."""

    started = False

    def _start(self) -> None:
        if not self.started:
            self.started = True
            _release_stderr()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._start()

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._start()

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._start()


@contextlib.contextmanager
def before_first_batch(trainer) -> Iterator[None]:
    """Run a subcommand on ``trainer``, marking any exception with whether training had started, so
    :func:`one_line_errors` reports errors from ``setup``/``prepare_data``/checkpoint loading as
    settings and lets errors from training keep their traceback."""
    flag = _FirstBatch()
    trainer.callbacks.insert(0, flag)
    try:
        yield
    except BaseException as err:
        with contextlib.suppress(AttributeError):
            setattr(err, _STARTED, flag.started)
        raise
    finally:
        with contextlib.suppress(ValueError):
            trainer.callbacks.remove(flag)
