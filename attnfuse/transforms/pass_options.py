"""Pass options of the kind each pass declares.

xDSL's pipeline parser converts an option's text by its value (`true` is a bool, `3` an int) and
accepts it for a field whose type it is an instance of; a bool is an int in Python, so
`lower-to-tile{head-dim=true}` would lower for head dim 1. Every AttnFuse pass derives from
`TypedOptionsPass`, which refuses that at construction (a `PassOptionError`, which
`attnfuse-opt` locates in the `-p` argument).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from xdsl.passes import ModulePass

from attnfuse.errors import PassOptionError


class TypedOptionsPass(ModulePass):
    """A `ModulePass` whose dataclass options are checked to be of their declared kind: no
    bool where the field is a number (xDSL lets it through, see the module's docstring)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            # Annotations are strings here (`from __future__ import annotations`).
            declared = {part.strip() for part in str(field.type).split("|")}
            if isinstance(value, bool) and "bool" not in declared:
                kind = "a number" if declared & {"int", "float"} else f"a {' or '.join(sorted(declared))}"
                raise self.option_error(field.name.replace("_", "-"), kind, value)

    def option_error(self, option: str, requirement: str, got: Any = ...) -> PassOptionError:
        """The error for this pass's `option`: `"<option> must be <requirement>, got <got>"`
        (a text value quoted, so `attnfuse-opt` points at it; a bool spelled as in the
        pipeline), under the name the pass was invoked by (`convert-attn-to-tile` for the alias,
        so the location is found in the `-p` argument). `got` left out: no value in the message."""
        problem = f"{option} must be {requirement}"
        if got is not ...:
            shown = f"'{got}'" if isinstance(got, str) else str(got).lower() if isinstance(got, bool) else got
            problem += f", got {shown}"
        return PassOptionError(self.name, option, problem)
