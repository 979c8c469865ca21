"""`sink_softmax()`, softmax with an attention sink of score 0 ("off-by-one" softmax): a
normalizer defined outside the package, in this one file (docs/architecture.md §10.1):

    p[i, j] = exp(s[i, j]) / (1 + sum_k exp(s[i, k]))   over the kept keys (0 elsewhere)
    lse[i]  = log(1 + sum_k exp(s[i, k]))

Its semantics subclass softmax's: the forward is the online softmax started with the sink
already counted (row max 0, row sum 1), so `tile.softmax_finalize` divides by
`1 + sum exp(s)`; the backward is softmax's, since `dp_ij / ds_ik = p_ij (delta_jk - p_ik)`
holds with the sink too. Its partials over disjoint key sets do *not* merge through their
log-sum-exps (each would count the sink): having changed softmax's forward, it does not
inherit softmax's `merges_splits` (`interfaces.partials_merge`), and decodes through the
one-pass kernel. The initial row sum is a
`tile.map` whose body ignores its operand (a constant 1): the targets broadcast it to a tile.
Used by test_sink_softmax.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects import arith
from xdsl.dialects.builtin import FloatAttr, f32
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from attnfuse.blocks.softmax import SoftmaxSemantics
from attnfuse.dialects import tile
from attnfuse.dialects.attn import ProbsType, ScoresType
from attnfuse.dsl.blocks import Block


@dataclass(frozen=True)
class SinkSoftmaxSemantics(SoftmaxSemantics):
    """`attn.sink_softmax` to the compiler, the runtime and the reference: softmax's loop, its
    backward and its `has_lse`, with the sink counted from the start. It changes softmax's
    forward (`init_state`), so softmax's `merges_splits` does not carry over
    (`interfaces.partials_merge`): it decodes through the one-pass kernel."""

    def init_state(self, op: Operation, kernel: Any) -> Sequence[SSAValue]:
        acc = kernel.add(tile.ZerosOp(tile.TileType(("m", "dv"), f32)), "acc").results[0]
        row_max = kernel.add(tile.ZerosOp(tile.TileType(("m",), f32)), "row_max").results[0]

        def one(b: Any, args: Any) -> SSAValue:
            return b.insert(arith.ConstantOp(FloatAttr(1.0, f32))).result

        return [acc, row_max, kernel.scalar_map([row_max], "row_sum", one)]

    def evaluate(self, op: Operation, scores: Any, keep: Any, env: Any) -> tuple[Any, Any]:
        import torch

        s = scores.masked_fill(~keep, float("-inf"))
        sink = torch.zeros(s.shape[:-1] + (1,), dtype=s.dtype, device=s.device)
        with_sink = torch.cat([s, sink], dim=-1)
        probs = torch.softmax(with_sink, dim=-1)[..., :-1]
        return probs.masked_fill(~keep, 0.0), torch.logsumexp(with_sink, dim=-1)


@irdl_op_definition
class SinkSoftmaxOp(IRDLOperation):
    """Softmax with a sink of score 0: `p = exp(s) / (1 + sum exp(s))` over the kept keys."""

    name = "attn.sink_softmax"

    input = operand_def(ScoresType)
    result = result_def(ProbsType)
    assembly_format = "$input attr-dict"
    traits = traits_def(Pure(), SinkSoftmaxSemantics())

    def __init__(self, scores: SSAValue):
        super().__init__(operands=[scores], result_types=[ProbsType()])


@dataclass(frozen=True, repr=False)
class SinkSoftmax(Block):
    """Softmax with an attention sink of score 0."""

    category: ClassVar[str] = "normalizer"
    hint: ClassVar[str] = "probs"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return SinkSoftmaxOp(value)


def sink_softmax() -> SinkSoftmax:
    """Softmax with an attention sink of score 0: `exp(s) / (1 + sum exp(s))`."""
    return SinkSoftmax()


OPS = (SinkSoftmaxOp,)
