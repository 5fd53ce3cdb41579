"""A griffe extension for the API pages: the docstrings are prose with reStructuredText habits
(``:func:`omega```, ``Example::``) that Markdown would print literally; show roles as code and
``::`` as ``:`` (the indented block after it is a code block in Markdown too)."""
from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc):`~?([^`]+)`")
LITERAL = re.compile(r"(\S)::$", re.MULTILINE)


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(r"`\1`", obj.docstring.value)
            obj.docstring.value = LITERAL.sub(r"\1:", text)
