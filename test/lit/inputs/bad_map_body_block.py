"""A block author's mistake for tools/out-of-tree-lowering-errors.mlir: `attn.sine_keep`, an
element-wise filter whose `lower` builds a `tile.map` body with `math.sin`, which no target
prints (the body ops are `tile.MAP_BODY_OPS`). Reported at the op, naming its `lower`."""

from dataclasses import dataclass
from typing import Any

from xdsl.dialects import arith
from xdsl.dialects import math as xmath
from xdsl.dialects.builtin import FloatAttr, f32
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from attnfuse.dialects.attn import ScoresType
from attnfuse.dialects.interfaces import KeyFilter


@dataclass(frozen=True)
class SineKeepSemantics(KeyFilter):
    """Keeps key `j` iff `sin(k_pos) >= 0`."""

    rank: int = 120

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        def body(b: Any, args: Any) -> SSAValue:
            s, k_pos = args
            zero = b.insert(arith.ConstantOp(FloatAttr(0.0, f32))).result
            keep = b.insert(arith.CmpfOp(b.insert(xmath.SinOp(k_pos)).result, zero, "oge")).result
            dropped = b.insert(arith.ConstantOp(FloatAttr(float("-inf"), f32))).result
            return b.insert(arith.SelectOp(keep, s, dropped)).result

        return kernel.scalar_map([scores, kernel.pair_position("key")], "scores", body)

    def evaluate(self, op: Operation, env: Any) -> Any:
        return (env.k_pos.sin() >= 0)[None, None, None, :]


@irdl_op_definition
class SineKeepOp(IRDLOperation):
    """Keeps the keys at positions whose sine is not negative."""

    name = "attn.sine_keep"
    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    assembly_format = "$input attr-dict"
    traits = traits_def(Pure(), SineKeepSemantics())


OPS = (SineKeepOp,)
