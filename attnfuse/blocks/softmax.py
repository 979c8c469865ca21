"""The softmax normalizer, `softmax()` (implied when a variant names no normalizer).

`p[i, j] = exp(s[i, j] - lse[i])` over the kept keys, `lse[i] = log sum_j exp(s[i, j])`; a
row with no kept key outputs 0 and has `lse = -inf`, never NaN, and so does a row whose largest
kept score lies more than `attn.SOFTMAX_UNDERFLOW` (87.3) below `attn.SOFTMAX_FLOOR` (-2^23: a
whole row masked by a large finite negative, -1e9 or `finfo(float32).min`). The forward is the online
softmax (a running row max and row sum carried across key blocks); the backward recomputes
the probabilities from the stored log-sum-exp and forms `dS = P * (dP - delta)` with
`delta = rowsum(dO * O)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from attnfuse.dialects import tile
from attnfuse.dialects.attn import SOFTMAX_FLOOR, SOFTMAX_UNDERFLOW, ProbsType, ScoresType
from attnfuse.dialects.interfaces import Normalizer
from attnfuse.dsl.blocks import Block


@dataclass(frozen=True)
class SoftmaxSemantics(Normalizer):
    """What `attn.softmax` means to the compiler and the reference."""

    has_lse: bool = True
    merges_splits: bool = True

    def state_names(self, op: Operation) -> tuple[str, ...]:
        return ("acc", "row_max", "row_sum")

    def init_state(self, op: Operation, kernel: Any) -> Sequence[SSAValue]:
        return kernel.add(tile.SoftmaxInitOp(), *self.state_names(op)).results

    def step(self, op: Operation, kernel: Any, state: Sequence[SSAValue], scores: SSAValue,
             value: SSAValue) -> Sequence[SSAValue]:
        acc, row_max, row_sum = state
        update = kernel.add(tile.SoftmaxUpdateOp(scores, row_max, row_sum),
                            "probs", "row_max", "row_sum", "alpha")
        probs, new_max, new_sum, alpha = update.results
        new_acc = kernel.add(tile.AccumulateOp(acc, probs, value, alpha), "acc").results[0]
        return [new_acc, new_max, new_sum]

    def finalize(self, op: Operation, kernel: Any,
                 state: Sequence[SSAValue]) -> tuple[SSAValue, SSAValue | None]:
        out, lse = kernel.add(tile.SoftmaxFinalizeOp(*state), "out", "lse").results
        return out, lse

    def probs(self, op: Operation, kernel: Any, scores: SSAValue, lse: SSAValue | None) -> SSAValue:
        assert lse is not None
        return kernel.add(tile.RecomputeProbsOp(scores, lse), "probs").results[0]

    def grad_scores(self, op: Operation, kernel: Any, scores: SSAValue, probs: SSAValue,
                    grad_probs: SSAValue, delta: SSAValue | None) -> SSAValue:
        assert delta is not None
        return kernel.add(tile.SoftmaxGradOp(probs, grad_probs, delta), "grad_scores").results[0]

    def evaluate(self, op: Operation, scores: Any, keep: Any, env: Any) -> tuple[Any, Any]:
        import torch

        scores = scores.masked_fill(~keep, float("-inf"))
        # Rows with no kept key output 0 and have lse -inf by definition, as do rows whose
        # every kept score is -inf (a bias of -inf drops a key like a mask) and rows whose
        # largest score is finite but far below `SOFTMAX_FLOOR` (`SOFTMAX_UNDERFLOW` below it;
        # compared in float64: in a 16-bit dtype such a score is already -inf). Their
        # scores are replaced by 0 before the softmax so that neither exp(-inf - -inf) nor its
        # gradient is NaN. NaN and +inf scores are not special: they propagate as in any softmax.
        row_max = scores.detach().amax(dim=-1) if scores.shape[-1] else scores.new_full(scores.shape[:-1], float("-inf"))
        empty = torch.isneginf(row_max) | (row_max.double() < SOFTMAX_FLOOR - SOFTMAX_UNDERFLOW)
        scores = scores.masked_fill(empty[..., None], 0.0)
        lse = torch.logsumexp(scores, dim=-1)
        weighted = keep & ~empty[..., None]
        zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
        # softmax (which subtracts the row max) rather than exp(s - lse): when every score of a
        # row is far from 0 (-1e17, say), lse rounds to the scores themselves and exp(s - lse)
        # gives every key weight 1.
        probs = torch.where(weighted, torch.softmax(scores, dim=-1), zero)
        return probs, lse.masked_fill(empty, float("-inf"))


@irdl_op_definition
class SoftmaxOp(IRDLOperation):
    """Row-wise softmax over the kept keys; a row with no kept key is all zeros."""

    name = "attn.softmax"

    input = operand_def(ScoresType)
    result = result_def(ProbsType)
    assembly_format = "$input attr-dict"
    traits = traits_def(Pure(), SoftmaxSemantics())

    def __init__(self, scores: SSAValue):
        super().__init__(operands=[scores], result_types=[ProbsType()])


@dataclass(frozen=True, repr=False)
class Softmax(Block):
    """Softmax over the kept keys (the default normalizer)."""

    category: ClassVar[str] = "normalizer"
    hint: ClassVar[str] = "probs"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return SoftmaxOp(value)

    def restates_default(self) -> bool:
        return True


def softmax() -> Softmax:
    """Normalize scores with a softmax over the kept keys. Implied when absent."""
    return Softmax()


OPS = (SoftmaxOp,)
