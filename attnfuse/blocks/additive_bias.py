"""The additive bias, `additive_bias()`: `s += bias[b, h, i, j]`.

The bias is call-time data (`bias=`), broadcastable to `[B, Hq, Nq, Nk]` and read through its
strides (a broadcast dim has stride 0, so nothing is expanded in memory). When it requires a
gradient, the backward stores the gradient of the op's result as the full-size bias
gradient, which the runtime sums over the broadcast dims.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from attnfuse.blocks.alibi import ALIBI_RANK
from attnfuse.dialects import tile
from attnfuse.dialects.attn import BiasType, ScoresType
from attnfuse.dialects.interfaces import DataUse, ScoreModifier
from attnfuse.dsl.blocks import Block
from attnfuse.errors import ArgumentError


@dataclass(frozen=True)
class AddBiasSemantics(ScoreModifier):
    """What `attn.add_bias` means to the compiler, the runtime and the reference."""

    rank: int = ALIBI_RANK + 1
    additive: bool = True

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        return kernel.add(tile.AddBiasOp(scores, kernel.data_arg(op, "bias")), "scores").results[0]

    def data(self, op: Operation) -> Sequence[DataUse]:
        return (DataUse("bias", argument="bias", gradient="dbias"),)

    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        bias = env.tensors.get("bias")
        if bias is None:
            raise ArgumentError("additive_bias() needs bias= at call time")
        return scores + bias.to(scores)

    def bind(self, op: Operation, use: DataUse, problem: Any, arguments: dict[str, Any]) -> Any:
        """`bias=` broadcast to `[B, Hq, Nq, Nk]` as a view (zero strides, no copy), checked."""
        import torch

        bias = arguments.get("bias")
        if bias is None:
            raise ArgumentError("additive_bias() needs bias= at call time, broadcastable to [B, Hq, Nq, Nk]")
        if not isinstance(bias, torch.Tensor):
            raise ArgumentError(f"bias must be a torch.Tensor, got {type(bias).__name__}")
        if not bias.is_floating_point() or bias.dtype == torch.float64:
            raise ArgumentError(f"bias must be float16, bfloat16 or float32, got {bias.dtype}")
        if bias.device != problem.device:
            raise ArgumentError(f"bias is on {bias.device}, but q is on {problem.device}")
        target = (problem.batch, problem.heads_q, problem.seq_q, problem.seq_k)
        if bias.dim() > 4:
            raise ArgumentError(f"bias must have at most 4 dims, got shape {tuple(bias.shape)}")
        try:
            return bias.expand(target)
        except RuntimeError:
            raise ArgumentError(
                f"bias of shape {tuple(bias.shape)} does not broadcast to [B, Hq, Nq, Nk] = {list(target)}"
            ) from None


@irdl_op_definition
class AddBiasOp(IRDLOperation):
    """`s[i, j] += bias[b, h, i, j]`, the bias broadcast to `[B, Hq, Nq, Nk]`."""

    name = "attn.add_bias"

    input = operand_def(ScoresType)
    bias = operand_def(BiasType)
    result = result_def(ScoresType)

    assembly_format = "$input `,` $bias attr-dict"
    traits = traits_def(Pure(), AddBiasSemantics())

    def __init__(self, scores: SSAValue, bias: SSAValue):
        super().__init__(operands=[scores, bias], result_types=[ScoresType()])


@dataclass(frozen=True, repr=False)
class AdditiveBias(Block):
    """`s += bias[b, h, i, j]`; the bias tensor is passed at call time as `bias=`."""

    category: ClassVar[str] = "modifier"
    arguments: ClassVar[tuple[Attribute, ...]] = (BiasType(),)
    hint: ClassVar[str] = "biased"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        bias = variant.argument(BiasType())
        assert bias is not None
        return AddBiasOp(value, bias)


def additive_bias() -> AdditiveBias:
    """`s += bias[b, h, i, j]`: pass `bias=` (broadcastable to `[B, Hq, Nq, Nk]`) at call time."""
    return AdditiveBias()


OPS = (AddBiasOp,)
