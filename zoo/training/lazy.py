"""``lazy_instance`` for the zoo's constructor defaults, without its cost at import.

jsonargparse's ``lazy_instance`` finds its caller's module with ``inspect.stack()``, which reads the
source of every frame of the calling thread; each of importlib's frozen frames makes
``inspect.getmodule`` scan all of ``sys.modules`` (thousands once torch and Lightning are loaded).
A default argument is built while its module is imported, several imports deep under the CLI:
the zoo's 13 defaults cost 1.7 s of the 7 s CPU of ``zoo fit --config R --print_config`` (measured).
Made on a thread of its own, the stack is a few frames of ``threading``: the same lazy instance
(its class is created once per scheme, ``zoo.training.lazy.LazyInstance_<Scheme>``), in milliseconds.
"""
from __future__ import annotations

import threading
from typing import TypeVar

from jsonargparse import lazy_instance as _jsonargparse_lazy_instance

T = TypeVar("T")


def lazy_instance(class_type: type[T], **kwargs) -> T:
    """``jsonargparse.lazy_instance(class_type, **kwargs)``: an instance whose ``__init__`` runs at
    its first use, which LightningCLI prints as ``class_path`` + ``init_args``."""
    made: list = []

    def make() -> None:
        try:
            made.append(_jsonargparse_lazy_instance(class_type, **kwargs))
        except BaseException as err:  # re-raised in the caller's thread
            made.append(err)

    worker = threading.Thread(target=make, name="zoo-lazy-instance")
    worker.start()
    worker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]
