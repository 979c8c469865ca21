"""`sink_window(sinks, window)`: StreamingLLM's attention pattern (Xiao et al., 2023) as a
filter: key `j` is kept for query `i` iff it is one of the first `sinks` keys (the attention
sinks) or lies within `window` positions of the query, `q_pos - k_pos < window` (with
`causal()` beside it, the recent keys). A block defined outside the package in this one file
(docs/architecture.md §10.1): an element-wise filter, neither a band nor block lists, whose
`lower` tests each entry of a block from the entries' positions (`tile.pair_position`) with one
`tile.map` (two comparisons joined by `arith.ori`), dropping an entry as -inf. Registered by its tests (test_elementwise_filter.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects import arith
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

MAX_POSITION = 1 << 24
"""Positions reach the test as f32, exact up to 2^24: larger sinks or windows are refused."""


@dataclass(frozen=True)
class SinkWindowSemantics(KeyFilter):
    """`attn.sink_window` to the compiler, the runtime and the reference."""

    rank: int = 103

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        sinks, window = self.params(op)
        inputs = [scores, kernel.pair_position("query"), kernel.pair_position("key")]

        def body(b: Any, args: Any) -> SSAValue:
            s, q_pos, k_pos = args

            def const(value: float) -> SSAValue:
                return b.insert(arith.ConstantOp(FloatAttr(value, f32))).result

            recent = b.insert(arith.CmpfOp(b.insert(arith.SubfOp(q_pos, k_pos)).result, const(window), "olt")).result
            sink = b.insert(arith.CmpfOp(k_pos, const(sinks), "olt")).result
            kept = b.insert(arith.OrIOp(sink, recent)).result
            return b.insert(arith.SelectOp(kept, s, const(float("-inf")))).result

        return kernel.scalar_map(inputs, "scores", body)

    def evaluate(self, op: Operation, env: Any) -> Any:
        sinks, window = self.params(op)
        q_pos, k_pos = env.q_pos[:, None], env.k_pos[None, :]
        return ((k_pos < sinks) | (q_pos - k_pos < window))[None, None]

    @staticmethod
    def params(op: Operation) -> tuple[int, int]:
        assert isinstance(op, SinkWindowOp)
        return op.sinks.value.data, op.window.value.data


@irdl_op_definition
class SinkWindowOp(IRDLOperation):
    """Keeps key `j` for query `i` iff `j_pos < sinks` or `i_pos - j_pos < window`."""

    name = "attn.sink_window"

    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    sinks = prop_def(IntegerAttr)
    window = prop_def(IntegerAttr)

    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), SinkWindowSemantics())

    def __init__(self, scores: SSAValue, sinks: int, window: int):
        super().__init__(operands=[scores], result_types=[ScoresType()],
                         properties={"sinks": IntegerAttr(sinks, i64), "window": IntegerAttr(window, i64)})

    def verify_(self) -> None:
        sinks, window = self.sinks.value.data, self.window.value.data
        if not (0 <= sinks <= MAX_POSITION and 1 <= window <= MAX_POSITION):
            raise VerifyException(f"sink_window needs 0 <= sinks <= 2^24 and 1 <= window <= 2^24, got {sinks}, {window}")


@dataclass(frozen=True, repr=False)
class SinkWindow(Block):
    """Attention sinks plus a window of recent keys."""

    sinks: int = 4
    window: int = 1024
    category: ClassVar[str] = "mask"
    hint: ClassVar[str] = "kept"

    def __post_init__(self) -> None:
        for name, least in (("sinks", 0), ("window", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_POSITION:
                raise CompositionError(f"sink_window: {name} must be an int in [{least}, 2^24], got {value!r}")

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return SinkWindowOp(value, self.sinks, self.window)


def sink_window(sinks: int, window: int) -> SinkWindow:
    """StreamingLLM's pattern: the first `sinks` keys and the last `window` positions."""
    return SinkWindow(sinks, window)


OPS = (SinkWindowOp,)
