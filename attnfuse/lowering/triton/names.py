"""Python identifiers for the SSA values of a printed kernel."""

from __future__ import annotations

from xdsl.ir import SSAValue


class Namer:
    """Python identifiers for SSA values: the IR's name hint, made unique."""

    def __init__(self, reserved: set[str]):
        self.taken = set(reserved)
        self.names: dict[SSAValue, str] = {}
        self.pins: dict[SSAValue, str] = {}

    def fresh(self, hint: str) -> str:
        name, i = hint, 1
        while name in self.taken:
            name, i = f"{hint}_{i}", i + 1
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
        """Bind `value` to an existing name (a loop-carried variable)."""
        self.names[value] = name

    def pin(self, value: SSAValue, name: str) -> None:
        """Make the coming `define` of `value` reuse `name` (a variable the printer reassigns,
        such as the Gluon target's score tile, which each score op refines in place)."""
        self.pins[value] = name

    def __getitem__(self, value: SSAValue) -> str:
        return self.names[value]
