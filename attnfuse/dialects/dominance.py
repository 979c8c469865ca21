"""Values defined before their uses: the one-pass, in-order SSA rule every AttnFuse body follows.

xDSL's verifier checks types and traits but not dominance, so IR that reads a value before the
op defining it parses and verifies. The passes, the printers and the reference interpreter walk
a body once, in order; such IR would lower to code that reads an undefined name. The `attn`
variant's and the `tile` kernel's verifiers run `check_defined_before_use` over their bodies
(every region is one block here; a nested region sees what its enclosing blocks defined
before its op)."""

from __future__ import annotations

from xdsl.ir import Block, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException


class UseBeforeDefinition(VerifyException):
    """An op reading a value defined after it, or not in an enclosing block; `op` is the reader
    (`attnfuse-opt` locates the diagnostic there)."""

    def __init__(self, op: Operation, operand: SSAValue):
        name = f"%{operand.name_hint}" if operand.name_hint else "a value"
        super().__init__(f"'{op.name}' reads {name} before it is defined: a body defines each value "
                         "before its uses")
        self.op = op


def check_defined_before_use(op: Operation) -> None:
    """`UseBeforeDefinition` for the first op under `op` (in its regions, nested ones included)
    that reads a value not defined earlier in its block or in a block enclosing it."""
    for region in op.regions:
        for block in region.blocks:
            _check_block(block, set())


def _check_block(block: Block, outer: set[SSAValue]) -> None:
    defined = outer | set(block.args)
    for op in block.ops:
        for operand in op.operands:
            if operand not in defined:
                raise UseBeforeDefinition(op, operand)
        for region in op.regions:
            for inner in region.blocks:
                _check_block(inner, defined)
        defined.update(op.results)


__all__ = ["UseBeforeDefinition", "check_defined_before_use"]
