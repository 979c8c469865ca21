"""ReLU attention, `relu()`: `p[i, j] = relu(s[i, j]) / Nk` on kept keys, 0 elsewhere.

No log-sum-exp (`return_lse=True` is an error). The derivative jumps at `s = 0`, so the
backward forms scores from unrounded rotated q and k when RoPE rotates them
(`Normalizer.smooth`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from attnfuse.blocks._pointwise import PointwiseNormalizer
from attnfuse.dialects import tile
from attnfuse.dialects.attn import ProbsType, ScoresType
from attnfuse.dsl.blocks import Block


@dataclass(frozen=True)
class ReluSemantics(PointwiseNormalizer):
    """What `attn.relu` means to the compiler and the reference."""

    smooth: bool = False

    def probs(self, op: Operation, kernel: Any, scores: SSAValue, lse: SSAValue | None) -> SSAValue:
        return kernel.add(tile.ReluProbsOp(scores), "probs").results[0]

    def grad_scores(self, op: Operation, kernel: Any, scores: SSAValue, probs: SSAValue,
                    grad_probs: SSAValue, delta: SSAValue | None) -> SSAValue:
        return kernel.add(tile.ReluGradOp(scores, grad_probs), "grad_scores").results[0]

    def evaluate(self, op: Operation, scores: Any, keep: Any, env: Any) -> tuple[Any, Any]:
        import torch

        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        return torch.where(keep, torch.relu(scores) / env.seq_k, zero), None


@irdl_op_definition
class ReluOp(IRDLOperation):
    """ReLU attention: `p[i, j] = relu(s[i, j]) / Nk` on kept keys, 0 elsewhere."""

    name = "attn.relu"

    input = operand_def(ScoresType)
    result = result_def(ProbsType)
    assembly_format = "$input attr-dict"
    traits = traits_def(Pure(), ReluSemantics())

    def __init__(self, scores: SSAValue):
        super().__init__(operands=[scores], result_types=[ProbsType()])


@dataclass(frozen=True, repr=False)
class Relu(Block):
    """ReLU attention: `p = relu(s) / Nk` on kept keys, 0 elsewhere."""

    category: ClassVar[str] = "normalizer"
    hint: ClassVar[str] = "probs"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return ReluOp(value)


def relu() -> Relu:
    """Normalize with ReLU instead of softmax: `p = relu(s) / Nk` on kept keys."""
    return Relu()


OPS = (ReluOp,)
