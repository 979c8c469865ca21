"""`fire_log(r1, c, threshold)`: FIRE's relative-position bias (Li et al., 2023) with a fixed
log transform and a per-head scale,

    s <- s - r1 / (h + 1) * log(1 + c |q_pos - k_pos|) / log(1 + c max(threshold, q_pos))

for query head `h`: the distance is normalized by the query's own position (progressive
interpolation), so the bias is not a function of the distance alone. A block defined outside
the package in this one file (docs/architecture.md §10.1): it reads each entry's positions and
query head through the kernel builder's `pair_position` and `query_head` (`tile.pair_position`,
`tile.query_head`), mapped with the scores by one `tile.map`. The term does not depend on the
scores: additive (it commutes with ALiBi and the bias; derivative 1). Registered by its tests
(test_position_block.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects import arith
from xdsl.dialects import math as xmath
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


@dataclass(frozen=True)
class FireLogSemantics(ScoreModifier):
    """`attn.fire_log` to the compiler, the runtime and the reference."""

    rank: int = 15
    additive: bool = True

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        r1, c, threshold = self.params(op)
        inputs = [scores, kernel.pair_position("query"), kernel.pair_position("key"), kernel.query_head()]

        def body(b: Any, args: Any) -> SSAValue:
            s, q_pos, k_pos, head = args

            def const(value: float) -> SSAValue:
                return b.insert(arith.ConstantOp(FloatAttr(value, f32))).result

            def log1p_c(x: SSAValue) -> SSAValue:  # log(1 + c x)
                grown = b.insert(arith.AddfOp(b.insert(arith.MulfOp(x, const(c))).result, const(1.0))).result
                return b.insert(xmath.LogOp(grown)).result

            distance = b.insert(xmath.AbsFOp(b.insert(arith.SubfOp(q_pos, k_pos)).result)).result
            reach = b.insert(arith.MaximumfOp(q_pos, const(threshold))).result
            relative = b.insert(arith.DivfOp(log1p_c(distance), log1p_c(reach))).result
            scale = b.insert(arith.DivfOp(const(r1), b.insert(arith.AddfOp(head, const(1.0))).result)).result
            return b.insert(arith.SubfOp(s, b.insert(arith.MulfOp(scale, relative)).result)).result

        return kernel.scalar_map(inputs, "scores", body)

    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        import torch

        r1, c, threshold = self.params(op)
        q_pos, k_pos = env.q_pos.to(scores)[:, None], env.k_pos.to(scores)[None, :]
        relative = torch.log1p(c * (q_pos - k_pos).abs()) / torch.log1p(c * q_pos.clamp(min=threshold))
        heads = torch.arange(env.heads_q).to(scores)
        return scores - (r1 / (heads + 1))[None, :, None, None] * relative

    @staticmethod
    def params(op: Operation) -> tuple[float, float, float]:
        assert isinstance(op, FireLogOp)
        return op.r1.value.data, op.c.value.data, op.threshold.value.data


MAX_C = 1e30
"""The largest `c`: `c` times a distance (below 2^24) stays within f32's range."""


def parameter_problem(r1: float, c: float, threshold: float) -> str | None:
    """What is wrong with fire_log's parameters, or None (the block and the op's verifier
    ask alike). The kernels compute in f32: `log(1 + c x)` must neither overflow nor round to
    `log(1) = 0` at the normalizing reach (0 / 0 where the float64 reference is finite)."""
    if not all(math.isfinite(x) for x in (r1, c, threshold)):
        return f"fire_log's r1, c and threshold must be finite, got {r1!r}, {c!r}, {threshold!r}"
    if not 0 <= r1 <= FP32_MAX:
        return f"fire_log's r1 must be in [0, {FP32_MAX!r}] (f32's range), got {r1!r}"
    if not 1 <= threshold <= FP32_MAX:
        return f"fire_log's threshold must be in [1, {FP32_MAX!r}], got {threshold!r}"
    if not (0 < c <= MAX_C and c * threshold >= 2.0 ** -20):
        return (f"fire_log's c must be at most {MAX_C!r} and c * threshold at least 2^-20 (so that "
                f"1 + c * threshold is above 1 in f32), got c={c!r}, threshold={threshold!r}")
    return None


@irdl_op_definition
class FireLogOp(IRDLOperation):
    """FIRE's bias with a log transform: `s[h, i, j] <- s - r1 / (h + 1) * log(1 + c |i_pos -
    j_pos|) / log(1 + c max(threshold, i_pos))`."""

    name = "attn.fire_log"

    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    r1 = prop_def(FloatAttr)
    c = prop_def(FloatAttr)
    threshold = prop_def(FloatAttr)

    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), FireLogSemantics())

    def __init__(self, scores: SSAValue, r1: float, c: float, threshold: float):
        super().__init__(operands=[scores], result_types=[ScoresType()],
                         properties={name: FloatAttr(value, f64)
                                     for name, value in (("r1", r1), ("c", c), ("threshold", threshold))})

    def verify_(self) -> None:
        problem = parameter_problem(self.r1.value.data, self.c.value.data, self.threshold.value.data)
        if problem is not None:
            raise VerifyException(problem)


@dataclass(frozen=True, repr=False)
class FireLog(Block):
    """FIRE's log bias, normalized by the query position and scaled per query head."""

    r1: float = 1.0
    c: float = 1.0
    threshold: float = 16.0
    category: ClassVar[str] = "modifier"
    hint: ClassVar[str] = "biased"

    def __post_init__(self) -> None:
        for name in ("r1", "c", "threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CompositionError(f"fire_log: {name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))
        problem = parameter_problem(self.r1, self.c, self.threshold)
        if problem is not None:
            raise CompositionError(problem)

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return FireLogOp(value, self.r1, self.c, self.threshold)


def fire_log(r1: float, c: float, threshold: float = 16.0) -> FireLog:
    """FIRE's relative-position bias with a log transform, scaled per query head."""
    return FireLog(r1, c, threshold)


OPS = (FireLogOp,)
