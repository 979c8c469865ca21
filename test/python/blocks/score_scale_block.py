"""`score_scale(factor)`, `s <- s * factor`: a modifier that is not additive, defined outside
the package in this one file (docs/architecture.md §10.1), laid out as `score_offset_block.py`
is. It commutes with the filters only, so where the user puts it among ALiBi and a bias is part
of the variant's meaning; its derivative is `factor`, its own `vjp`. Registered by its tests
(test_score_scale.py).
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


def _times(kernel: Any, value: SSAValue, factor: float, hint: str) -> SSAValue:
    """`value * factor`, a `tile.map`."""

    def body(b: Any, args: Any) -> SSAValue:
        constant = b.insert(arith.ConstantOp(FloatAttr(factor, f32))).result
        return b.insert(arith.MulfOp(args[0], constant)).result

    return kernel.scalar_map([value], hint, body)


@dataclass(frozen=True)
class ScoreScaleSemantics(ScoreModifier):
    """`attn.score_scale` to the compiler, the runtime and the reference: not additive (the
    default `commutes_with` keeps it where it is among modifiers), derivative `factor`."""

    rank: int = 14

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        return _times(kernel, scores, self.factor(op), "scores")

    def vjp(self, op: Operation, kernel: Any, scores_in: SSAValue, grad: SSAValue) -> SSAValue:
        return _times(kernel, grad, self.factor(op), "grad_scores")

    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        return scores * self.factor(op)

    @staticmethod
    def factor(op: Operation) -> float:
        assert isinstance(op, ScoreScaleOp)
        return op.factor.value.data


@irdl_op_definition
class ScoreScaleOp(IRDLOperation):
    """Multiplies every score by a constant: `s[i, j] <- s[i, j] * factor`."""

    name = "attn.score_scale"

    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    factor = prop_def(FloatAttr)

    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), ScoreScaleSemantics())

    def __init__(self, scores: SSAValue, factor: float):
        super().__init__(operands=[scores], result_types=[ScoresType()],
                         properties={"factor": FloatAttr(factor, f64)})

    def verify_(self) -> None:
        factor = self.factor.value.data
        if not abs(factor) <= FP32_MAX:
            raise VerifyException(f"score_scale factor must be a finite fp32 number, got {factor}")


@dataclass(frozen=True, repr=False)
class ScoreScale(Block):
    """`s <- s * factor`."""

    factor: float = 1.0
    category: ClassVar[str] = "modifier"
    hint: ClassVar[str] = "scaled"

    def __post_init__(self) -> None:
        f = self.factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or abs(f) > FP32_MAX:
            raise CompositionError(f"score_scale: factor must be a finite fp32 number, got {f!r}")
        object.__setattr__(self, "factor", float(f))

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return ScoreScaleOp(value, self.factor)


def score_scale(factor: float) -> ScoreScale:
    """Multiplies every score by `factor`."""
    return ScoreScale(factor)


OPS = (ScoreScaleOp,)
