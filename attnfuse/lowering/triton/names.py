"""Python identifiers for the SSA values of a printed kernel."""

from __future__ import annotations

import builtins
import keyword
import re

from xdsl.ir import SSAValue

BUILTIN_NAMES = frozenset(dir(builtins))
"""Python's built-in names (`float`, `range`, `min`): printed code calls some of them, so a
value never takes one."""


def identifier(hint: str) -> str:
    """A Python identifier for an IR name hint: MLIR's names may hold `.`, `$` and `-` and
    be keywords or built-ins (`%for`, `%a-b`, `%float`), which printed as they are would not
    parse or would mean something else. Other characters become `_`; a keyword, a built-in
    or a name starting with a digit gets `v_` before it."""
    name = re.sub(r"[^0-9A-Za-z_]", "_", hint) or "value"
    if name[0].isdigit() or keyword.iskeyword(name) or name in BUILTIN_NAMES:
        name = f"v_{name}"
    return name


class Namer:
    """Python identifiers for SSA values: the IR's name hint as an identifier, made unique
    among the names taken (the printer's own, `reserved`, and every name handed out)."""

    def __init__(self, reserved: set[str]):
        self.taken = set(reserved)
        self.names: dict[SSAValue, str] = {}
        self.pins: dict[SSAValue, str] = {}

    def fresh(self, hint: str) -> str:
        base = identifier(hint)
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def define(self, value: SSAValue, hint: str | None = None) -> str:
        if value in self.pins:
            name = self.names[value] = self.pins.pop(value)
            return name
        name = self.fresh(hint or value.name_hint or "value")
        self.names[value] = name
        return name

    def alias(self, value: SSAValue, name: str) -> None:
        """Bind `value` to an existing name (a loop-carried variable); no value defined later
        takes the name."""
        self.names[value] = name
        self.taken.add(name)

    def pin(self, value: SSAValue, name: str) -> None:
        """Make the coming `define` of `value` reuse `name` (a variable the printer reassigns,
        such as the Gluon target's score tile, which each score op refines in place); no
        other value takes the name."""
        self.pins[value] = name
        self.taken.add(name)

    def __getitem__(self, value: SSAValue) -> str:
        return self.names[value]
