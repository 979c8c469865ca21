"""`chunked(size)`: chunked local attention (Llama 4's): key `j` is kept for query `i` iff
both lie in one chunk of `size` positions, `floor(q_pos / size) == floor(k_pos / size)` (with
`causal()` beside it, the chunk's earlier keys). A block defined outside the package in this
one file (docs/architecture.md §10.1): an element-wise filter whose `lower` tests each entry
from its positions (`tile.pair_position`) with `math.floor` and `arith.cmpf` in one
`tile.map`. Registered by its tests (test_elementwise_filter.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects import arith
from xdsl.dialects import math as xmath
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, f32, i64
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def
from xdsl.irdl import prop_def, result_def, traits_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn import ScoresType
from attnfuse.dialects.interfaces import KeyFilter
from attnfuse.dsl.blocks import Block
from attnfuse.errors import CompositionError

MAX_CHUNK = 1 << 23
"""floor(p / size) is exact in f32 while p + size <= 2^24 (`tile.map`): positions below 2^23."""


@dataclass(frozen=True)
class ChunkedSemantics(KeyFilter):
    """`attn.chunked` to the compiler, the runtime and the reference."""

    rank: int = 104

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        size = float(self.size(op))
        inputs = [scores, kernel.pair_position("query"), kernel.pair_position("key")]

        def body(b: Any, args: Any) -> SSAValue:
            s, q_pos, k_pos = args
            width = b.insert(arith.ConstantOp(FloatAttr(size, f32))).result

            def chunk(position: SSAValue) -> SSAValue:
                return b.insert(xmath.FloorOp(b.insert(arith.DivfOp(position, width)).result)).result

            # (A query at a negative position, past more queries than keys, has a negative
            # chunk, which no key shares.)
            same = b.insert(arith.CmpfOp(chunk(q_pos), chunk(k_pos), "oeq")).result
            dropped = b.insert(arith.ConstantOp(FloatAttr(float("-inf"), f32))).result
            return b.insert(arith.SelectOp(same, s, dropped)).result

        return kernel.scalar_map(inputs, "scores", body)

    def evaluate(self, op: Operation, env: Any) -> Any:
        size = self.size(op)
        q_pos, k_pos = env.q_pos[:, None], env.k_pos[None, :]
        return (q_pos.div(size, rounding_mode="floor") == k_pos.div(size, rounding_mode="floor"))[None, None]

    @staticmethod
    def size(op: Operation) -> int:
        assert isinstance(op, ChunkedOp)
        return op.chunk.value.data


@irdl_op_definition
class ChunkedOp(IRDLOperation):
    """Keeps key `j` for query `i` iff `floor(i_pos / chunk) == floor(j_pos / chunk)`."""

    name = "attn.chunked"

    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    chunk = prop_def(IntegerAttr)

    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), ChunkedSemantics())

    def __init__(self, scores: SSAValue, chunk: int):
        super().__init__(operands=[scores], result_types=[ScoresType()], properties={"chunk": IntegerAttr(chunk, i64)})

    def verify_(self) -> None:
        if not 1 <= self.chunk.value.data <= MAX_CHUNK:
            raise VerifyException(f"chunked needs 1 <= chunk <= 2^23, got {self.chunk.value.data}")


@dataclass(frozen=True, repr=False)
class Chunked(Block):
    """Chunked local attention: keys of the query's chunk only."""

    size: int = 8192
    category: ClassVar[str] = "mask"
    hint: ClassVar[str] = "kept"

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= MAX_CHUNK:
            raise CompositionError(f"chunked: size must be an int in [1, 2^23], got {self.size!r}")

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return ChunkedOp(value, self.size)


def chunked(size: int) -> Chunked:
    """Llama 4's chunked local attention: the keys of the query's chunk of `size` positions."""
    return Chunked(size)


OPS = (ChunkedOp,)
