"""`lookahead(n)`, keep keys at most `n` positions after the query (`k_pos <= q_pos + n`): a
band mask defined outside the package in this one file (docs/architecture.md §10.1). It adds
no op, only a mask predicate, `#attn.lookahead<n>`, whose `band()` is `(None, n)`; its block
builds the package's `attn.mask` with it, so `analyze-masks`, the loops' block bounds and the
kernels' masks handle it unchanged. The module lists the attribute in `ATTRIBUTES` (and has no
`OPS`). Used by test_lookahead.py and test/lit/tools/out-of-tree-mask.mlir.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects.builtin import IntAttr
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from attnfuse.blocks.masks import MaskOp
from attnfuse.dialects.attn import MAX_BAND_OFFSET, MaskPredicate
from attnfuse.dsl.blocks import Block
from attnfuse.errors import CompositionError


@irdl_attr_definition
class LookaheadAttr(MaskPredicate):
    """`#attn.lookahead<n>`: keep keys with `k_pos <= q_pos + n` (n >= 0)."""

    name = "attn.lookahead"

    steps: IntAttr

    def __init__(self, steps: int):
        super().__init__(IntAttr(steps))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            return (IntAttr(parser.parse_integer(allow_boolean=False)),)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.steps.data}>")

    def verify(self) -> None:
        if not 0 <= self.steps.data <= MAX_BAND_OFFSET:
            raise VerifyException(f"lookahead must be in [0, {MAX_BAND_OFFSET}], got {self.steps.data}")

    def band(self) -> tuple[int | None, int | None]:
        return (None, self.steps.data)


@dataclass(frozen=True, repr=False)
class Lookahead(Block):
    """Keep keys at most `steps` positions after the query."""

    steps: int = 0
    category: ClassVar[str] = "mask"
    hint: ClassVar[str] = "kept"

    def __post_init__(self) -> None:
        s = self.steps
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_BAND_OFFSET:
            raise CompositionError(f"lookahead: steps must be an int in [0, {MAX_BAND_OFFSET}], got {s!r}")

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return MaskOp(value, [LookaheadAttr(self.steps)])


def lookahead(steps: int) -> Lookahead:
    """Keep keys with `k_pos <= q_pos + steps`."""
    return Lookahead(steps)


ATTRIBUTES = (LookaheadAttr,)
