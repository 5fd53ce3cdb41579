"""A zoo run's console without other projects' advertisements and deprecation notices.

Lightning logs "💡 Tip: ..." lines that advertise its cloud products (``litlogger``,
``litmodels``) and "TPU available: False ..." on machines without one, through its rank-zero
logger; its own code triggers a torch deprecation (``LeafSpec``) and jsonargparse deprecations
(its CLI) that a zoo user can do nothing about. :func:`quiet_run` drops exactly those messages, by
logger and message or by message, category and module, for the duration of a CLI run
(``zoo.cli.build_cli``) and nothing else: importing the zoo changes no filter; Lightning's other
messages (a misconfiguration, a slow data loader) and the zoo's own warnings stay.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

# the logger Lightning's rank_zero_info writes to (lightning.pytorch.utilities.rank_zero)
TIP_LOGGER = "lightning.pytorch.utilities.rank_zero"
# Lightning's advertisements: "💡 Tip: For seamless cloud logging ..." / "... cloud uploads ..."
TIP_PREFIX = "💡 Tip: For seamless cloud "
# lines of that logger that say nothing on a machine without the hardware they name
IDLE_LINES = ("TPU available: False, using: 0 TPU cores",)

# (message regex, category, module regex) of warnings that are noise in a zoo run
NOISE_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    # torch deprecates LeafSpec; Lightning's _pytree still builds one at every batch
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
    # the zoo's full-batch tasks (datamodules.xor, shapes with val_size=0) return [] for "no
    # validation in fit", Lightning's documented way; a zero-length DataLoader still warns
    (r"Total length of `list` across ranks is zero", UserWarning, r"lightning\.pytorch\.utilities\.data"),
    # Lightning's CLI calls jsonargparse API deprecated in 4.49 (add_instantiator, skip_none, ...);
    # hidden by Python's default filters, shown under -W default, pytest or a notebook
    (r"(?s).*(JsonargparseDeprecationWarning per type|was deprecated in v4\.\d+\.\d+ and will be removed in v5)",
     DeprecationWarning, r"lightning\.pytorch\.cli"),
    # `zoo validate|test --ckpt_path`: the CLI adds its RunCheckpoint to fit only, and evaluating
    # needs nothing of its state; any other missing callback is still reported
    (r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided "
     r"during `Trainer` instantiation\. Please add the following callbacks: \[\"RunCheckpoint\{[^\]]*\]\.$",
     UserWarning, r"lightning\.pytorch\.trainer\.call"),
)


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(TIP_PREFIX) or message in IDLE_LINES)


@contextlib.contextmanager
def quiet_run() -> Iterator[None]:
    """Within the block: Lightning's tips are not logged and :data:`NOISE_WARNINGS` not shown;
    the warning filters and the logger are as before afterwards."""
    tips, drop = logging.getLogger(TIP_LOGGER), _DropTips()
    tips.addFilter(drop)
    try:
        with warnings.catch_warnings():
            for message, category, module in NOISE_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category, module=module)
            yield
    finally:
        tips.removeFilter(drop)
