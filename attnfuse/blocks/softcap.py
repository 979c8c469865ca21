"""Soft-capping (Gemma 2), `softcap(cap)`: `s <- cap * tanh(s / cap)`, `cap > 0`.

Scores are squashed smoothly into `(-cap, cap)`. In the DSL it caps the scaled dot product,
before ALiBi and the bias (its `stage` is 0); in hand-written IR it applies where the IR puts
it. It is not additive, so it commutes with no other modifier (canonicalize-attn never moves
an ALiBi or a bias across it); like every modifier it commutes with the filters. It needs no
tile op of its own: forward and derivative are `tile.map`s,

    forward  s' = cap * tanh(s / cap)
    VJP      ds = ds' * (1 - tanh(s / cap)^2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects import arith
from xdsl.dialects import math as math_dialect
from xdsl.dialects.builtin import FloatAttr, f32, f64
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def
from xdsl.irdl import prop_def, result_def, traits_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects import tile
from attnfuse.dialects.attn import FP32_MAX, FP32_MIN_NORMAL, ScoresType, finite_real
from attnfuse.dialects.interfaces import ScoreModifier
from attnfuse.dsl.blocks import Block
from attnfuse.errors import CompositionError


def _tanh_of_scaled(b: Any, scores: SSAValue, cap: float) -> tuple[SSAValue, SSAValue]:
    """Builds `tanh(s / cap)` in a map body; returns it and the cap constant."""
    cap_value = b.insert(arith.ConstantOp(FloatAttr(cap, f32))).result
    # An approximate quotient (the targets' fast division): tanh itself is within a few ulp.
    scaled = b.insert(arith.DivfOp(scores, cap_value, tile.APPROXIMATE)).result
    return b.insert(math_dialect.TanhOp(scaled)).result, cap_value


@dataclass(frozen=True)
class SoftcapSemantics(ScoreModifier):
    """What `attn.softcap` means to the compiler, the runtime and the reference."""

    rank: int = 5

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        cap = self.cap(op)

        def body(b: Any, args: Any) -> SSAValue:
            tanh, cap_value = _tanh_of_scaled(b, args[0], cap)
            return b.insert(arith.MulfOp(tanh, cap_value)).result

        return kernel.scalar_map([scores], "scores", body)

    def vjp(self, op: Operation, kernel: Any, scores_in: SSAValue, grad: SSAValue) -> SSAValue:
        cap = self.cap(op)

        def body(b: Any, args: Any) -> SSAValue:
            tanh, _cap = _tanh_of_scaled(b, args[0], cap)
            one = b.insert(arith.ConstantOp(FloatAttr(1.0, f32))).result
            square = b.insert(arith.MulfOp(tanh, tanh)).result
            slope = b.insert(arith.SubfOp(one, square)).result
            return b.insert(arith.MulfOp(args[1], slope)).result

        return kernel.scalar_map([scores_in, grad], "grad_scores", body)

    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        cap = self.cap(op)
        return cap * (scores / cap).tanh()

    @staticmethod
    def cap(op: Operation) -> float:
        assert isinstance(op, SoftcapOp)
        return op.cap.value.data


@irdl_op_definition
class SoftcapOp(IRDLOperation):
    """Soft-capping: `s[i, j] <- cap * tanh(s[i, j] / cap)`, `cap > 0` (Gemma 2)."""

    name = "attn.softcap"

    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    cap = prop_def(FloatAttr)

    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), SoftcapSemantics())

    def __init__(self, scores: SSAValue, cap: float):
        super().__init__(
            operands=[scores], result_types=[ScoresType()], properties={"cap": FloatAttr(cap, f64)}
        )

    def verify_(self) -> None:
        cap = self.cap.value.data
        if not FP32_MIN_NORMAL <= cap <= FP32_MAX:
            raise VerifyException(
                f"softcap cap must lie in [{FP32_MIN_NORMAL:.3g}, {FP32_MAX:.3g}] (kernels divide "
                f"by it in fp32), got {cap}"
            )


@dataclass(frozen=True, repr=False)
class Softcap(Block):
    """`s <- cap * tanh(s / cap)` on the scaled dot product (before ALiBi and the bias)."""

    cap: float = 0.0
    category: ClassVar[str] = "modifier"
    stage: ClassVar[int] = 0
    hint: ClassVar[str] = "capped"

    def __post_init__(self) -> None:
        cap = finite_real(self.cap)
        if cap is None or cap <= 0:
            raise CompositionError(f"softcap: cap must be a positive finite number, got {self.cap!r}")
        if not FP32_MIN_NORMAL <= cap <= FP32_MAX:
            raise CompositionError(
                f"softcap: cap must lie in [{FP32_MIN_NORMAL:.3g}, {FP32_MAX:.3g}] (kernels divide "
                f"by it in fp32), got {cap!r}"
            )
        object.__setattr__(self, "cap", float(cap))

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return SoftcapOp(value, self.cap)


def softcap(cap: float) -> Softcap:
    """Gemma 2's soft-capping of the scores: `s <- cap * tanh(s / cap)`, `cap > 0`."""
    return Softcap(cap)


OPS = (SoftcapOp,)
