"""Sigmoid attention (Apple's FlashSigmoid), `sigmoid(bias=None)`: a third normalizer.

`p[i, j] = sigmoid(s[i, j] + b)` on kept keys, 0 elsewhere, and `o = p @ v`: each weight on
its own, no row normalization, so no log-sum-exp (`return_lse=True` is an error). `b`
defaults to `-ln(Nk)`, which keeps the weights' sum near that of a softmax at the start of
training. It needs no tile op of its own: the probabilities and their derivative are
`tile.map`s,

    forward  p  = 1 / (1 + exp(-(s + b)))        (a dropped key, s = -inf, gives 0)
    backward ds = dp * p * (1 - p)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects import arith
from xdsl.dialects import math as math_dialect
from xdsl.dialects.builtin import FloatAttr, f32, f64
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def
from xdsl.irdl import opt_prop_def, result_def, traits_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.blocks._pointwise import PointwiseNormalizer
from attnfuse.dialects import tile
from attnfuse.dialects.attn import FP32_MAX, ProbsType, ScoresType
from attnfuse.dsl.blocks import Block
from attnfuse.errors import CompositionError


@dataclass(frozen=True)
class SigmoidSemantics(PointwiseNormalizer):
    """What `attn.sigmoid` means to the compiler and the reference."""

    def probs(self, op: Operation, kernel: Any, scores: SSAValue, lse: SSAValue | None) -> SSAValue:
        assert isinstance(op, SigmoidOp)
        given = op.bias_value
        inputs = [scores]
        if given is None:
            inputs.append(kernel.add(tile.SeqLenOp("key"), "num_keys").results[0])

        def body(b: Any, args: Any) -> SSAValue:
            if given is None:  # b = -ln(Nk)
                shift = b.insert(arith.NegfOp(b.insert(math_dialect.LogOp(args[1])).result)).result
            else:
                shift = b.insert(arith.ConstantOp(FloatAttr(given, f32))).result
            x = b.insert(arith.AddfOp(args[0], shift)).result
            one = b.insert(arith.ConstantOp(FloatAttr(1.0, f32))).result
            decay = b.insert(math_dialect.ExpOp(b.insert(arith.NegfOp(x)).result)).result
            # An approximate quotient (the targets' fast division), as exp's own.
            return b.insert(arith.DivfOp(one, b.insert(arith.AddfOp(one, decay)).result, tile.APPROXIMATE)).result

        return kernel.scalar_map(inputs, "probs", body)

    def grad_scores(self, op: Operation, kernel: Any, scores: SSAValue, probs: SSAValue,
                    grad_probs: SSAValue, delta: SSAValue | None) -> SSAValue:
        def body(b: Any, args: Any) -> SSAValue:
            p, dp = args
            one = b.insert(arith.ConstantOp(FloatAttr(1.0, f32))).result
            slope = b.insert(arith.MulfOp(p, b.insert(arith.SubfOp(one, p)).result)).result
            return b.insert(arith.MulfOp(dp, slope)).result

        return kernel.scalar_map([probs, grad_probs], "grad_scores", body)

    def evaluate(self, op: Operation, scores: Any, keep: Any, env: Any) -> tuple[Any, Any]:
        import torch

        assert isinstance(op, SigmoidOp)
        # Without keys there is nothing to shift (and ln(0) has no value).
        default = -math.log(env.seq_k) if env.seq_k > 0 else 0.0
        shift = op.bias_value if op.bias_value is not None else default
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        return torch.where(keep, torch.sigmoid(scores + shift), zero), None


@irdl_op_definition
class SigmoidOp(IRDLOperation):
    """Sigmoid attention: `p[i, j] = sigmoid(s[i, j] + bias)` on kept keys, 0 elsewhere;
    `bias` defaults to `-ln(Nk)`."""

    name = "attn.sigmoid"

    input = operand_def(ScoresType)
    result = result_def(ProbsType)
    bias = opt_prop_def(FloatAttr)

    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), SigmoidSemantics())

    def __init__(self, scores: SSAValue, bias: float | None = None):
        super().__init__(
            operands=[scores],
            result_types=[ProbsType()],
            properties={"bias": None if bias is None else FloatAttr(bias, f64)},
        )

    @property
    def bias_value(self) -> float | None:
        """The explicit bias, or None for `-ln(Nk)`."""
        return None if self.bias is None else self.bias.value.data

    def verify_(self) -> None:
        if self.bias is not None and not abs(self.bias.value.data) <= FP32_MAX:
            raise VerifyException(
                f"sigmoid bias must be a finite fp32 number (|bias| <= {FP32_MAX:.3g}), got "
                f"{self.bias.value.data}"
            )


@dataclass(frozen=True, repr=False)
class Sigmoid(Block):
    """Sigmoid attention: `p = sigmoid(s + bias)` on kept keys, `bias` default `-ln(Nk)`."""

    bias: float | None = None
    category: ClassVar[str] = "normalizer"
    hint: ClassVar[str] = "probs"

    def __post_init__(self) -> None:
        b = self.bias
        if b is None:
            return
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not abs(b) <= FP32_MAX:
            raise CompositionError(
                f"sigmoid: bias must be a finite number (|bias| <= {FP32_MAX:.3g}, fp32) or None, "
                f"got {b!r}"
            )
        object.__setattr__(self, "bias", float(b))

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return SigmoidOp(value, self.bias)


def sigmoid(bias: float | None = None) -> Sigmoid:
    """Normalize with a sigmoid per score instead of softmax: `p = sigmoid(s + bias)` on kept
    keys (`bias` defaults to `-ln(Nk)`); no log-sum-exp."""
    return Sigmoid(bias)


OPS = (SigmoidOp,)
