"""`score_offset(offset)`, `s <- s + offset`: a block defined outside the package, in this one
file, laid out as `attnfuse/blocks/softcap.py` is (docs/architecture.md §10.1). Registered with
`attnfuse.blocks.register_block_module` by its tests (test_out_of_tree_block.py), and loaded
by `attnfuse-opt --block-module` in test/lit/tools/out-of-tree-block.mlir.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects import arith
from xdsl.dialects.builtin import FloatAttr, f32, f64
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def
from xdsl.irdl import prop_def, result_def, traits_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn import FP32_MAX, ScoresType
from attnfuse.dialects.interfaces import ScoreModifier
from attnfuse.dsl.blocks import Block
from attnfuse.errors import CompositionError


@dataclass(frozen=True)
class ScoreOffsetSemantics(ScoreModifier):
    """`attn.score_offset` to the compiler, the runtime and the reference. Additive: it
    commutes with ALiBi and the bias, and its derivative is 1 (the default `vjp`)."""

    rank: int = 12
    additive: bool = True

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        offset = self.offset(op)

        def body(b: Any, args: Any) -> SSAValue:
            constant = b.insert(arith.ConstantOp(FloatAttr(offset, f32))).result
            return b.insert(arith.AddfOp(args[0], constant)).result

        return kernel.scalar_map([scores], "scores", body)

    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        return scores + self.offset(op)

    @staticmethod
    def offset(op: Operation) -> float:
        assert isinstance(op, ScoreOffsetOp)
        return op.offset.value.data


@irdl_op_definition
class ScoreOffsetOp(IRDLOperation):
    """Adds a constant to every score: `s[i, j] <- s[i, j] + offset`."""

    name = "attn.score_offset"

    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    offset = prop_def(FloatAttr)

    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), ScoreOffsetSemantics())

    def __init__(self, scores: SSAValue, offset: float):
        super().__init__(operands=[scores], result_types=[ScoresType()],
                         properties={"offset": FloatAttr(offset, f64)})

    def verify_(self) -> None:
        offset = self.offset.value.data
        if not abs(offset) <= FP32_MAX:
            raise VerifyException(f"score_offset offset must be a finite fp32 number, got {offset}")


@dataclass(frozen=True, repr=False)
class ScoreOffset(Block):
    """`s <- s + offset`."""

    offset: float = 0.0
    category: ClassVar[str] = "modifier"
    hint: ClassVar[str] = "shifted"

    def __post_init__(self) -> None:
        o = self.offset
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not math.isfinite(o) or abs(o) > FP32_MAX:
            raise CompositionError(f"score_offset: offset must be a finite fp32 number, got {o!r}")
        object.__setattr__(self, "offset", float(o))

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return ScoreOffsetOp(value, self.offset)


def score_offset(offset: float) -> ScoreOffset:
    """Adds `offset` to every score."""
    return ScoreOffset(offset)


OPS = (ScoreOffsetOp,)
