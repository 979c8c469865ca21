"""`sink_softmax(logit=0.0)`, softmax with an attention sink of score `logit` (0: the
"off-by-one" softmax): a normalizer defined outside the package, in this one file
(docs/architecture.md §10.1); with `c = logit`:

    p[i, j] = exp(s[i, j]) / (exp(c) + sum_k exp(s[i, k]))   over the kept keys (0 elsewhere)
    lse[i]  = log(exp(c) + sum_k exp(s[i, k]))

Its semantics subclass softmax's: the forward is the online softmax started with the sink
already counted (row max c, in the base-2 units `tile.softmax_update` carries: c * log2(e);
row sum 1), so `tile.softmax_finalize` divides by `exp(c) + sum exp(s)`; the backward is softmax's, since `dp_ij / ds_ik = p_ij (delta_jk - p_ik)`
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
from xdsl.dialects.builtin import FloatAttr, f32, f64
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure

from attnfuse.blocks.softmax import SoftmaxSemantics
from attnfuse.dialects import tile
from attnfuse.dialects.attn import ProbsType, ScoresType
from attnfuse.lowering.triton import LOG2E
from attnfuse.dsl.blocks import Block


@dataclass(frozen=True)
class SinkSoftmaxSemantics(SoftmaxSemantics):
    """`attn.sink_softmax` to the compiler, the runtime and the reference: softmax's loop, its
    backward and its `has_lse`, with the sink counted from the start. It changes softmax's
    forward (`init_state`), so softmax's `merges_splits` does not carry over
    (`interfaces.partials_merge`): it decodes through the one-pass kernel."""

    def init_state(self, op: Operation, kernel: Any) -> Sequence[SSAValue]:
        acc = kernel.add(tile.ZerosOp(tile.TileType(("m", "dv"), f32)), "acc").results[0]
        zero = kernel.add(tile.ZerosOp(tile.TileType(("m",), f32)), "row_zero").results[0]

        def constant(value: float):
            return lambda b, args: b.insert(arith.ConstantOp(FloatAttr(value, f32))).result

        # The row max in base-2 units, as `tile.softmax_update` carries it: the sink's score
        # times log2(e); its weight exp(c - c) = 1 is the row sum's start.
        row_max = kernel.scalar_map([zero], "row_max", constant(sink_logit(op) * LOG2E))
        return [acc, row_max, kernel.scalar_map([zero], "row_sum", constant(1.0))]

    def evaluate(self, op: Operation, scores: Any, keep: Any, env: Any) -> tuple[Any, Any]:
        import torch

        s = scores.masked_fill(~keep, float("-inf"))
        sink = torch.full(s.shape[:-1] + (1,), sink_logit(op), dtype=s.dtype, device=s.device)
        with_sink = torch.cat([s, sink], dim=-1)
        probs = torch.softmax(with_sink, dim=-1)[..., :-1]
        return probs.masked_fill(~keep, 0.0), torch.logsumexp(with_sink, dim=-1)


def sink_logit(op: Operation) -> float:
    """The sink's score `c` of an `attn.sink_softmax` (0 when the op has no `logit`)."""
    return 0.0 if op.logit is None else op.logit.value.data  # type: ignore[attr-defined]


@irdl_op_definition
class SinkSoftmaxOp(IRDLOperation):
    """Softmax with a sink of score `logit` (0 when absent): `p = exp(s) / (exp(logit) + sum
    exp(s))` over the kept keys."""

    name = "attn.sink_softmax"

    input = operand_def(ScoresType)
    result = result_def(ProbsType)
    logit = opt_prop_def(FloatAttr)
    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), SinkSoftmaxSemantics())

    def __init__(self, scores: SSAValue, logit: float = 0.0):
        properties = {"logit": FloatAttr(logit, f64)} if logit else {}
        super().__init__(operands=[scores], result_types=[ProbsType()], properties=properties)


@dataclass(frozen=True, repr=False)
class SinkSoftmax(Block):
    """Softmax with an attention sink of score `logit`."""

    category: ClassVar[str] = "normalizer"
    hint: ClassVar[str] = "probs"
    logit: float = 0.0

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return SinkSoftmaxOp(value, self.logit)


def sink_softmax(logit: float = 0.0) -> SinkSoftmax:
    """Softmax with an attention sink of score `logit`: `exp(s) / (exp(logit) + sum exp(s))`."""
    return SinkSoftmax(logit)


OPS = (SinkSoftmaxOp,)
