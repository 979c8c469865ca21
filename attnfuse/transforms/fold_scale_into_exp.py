"""`fold-scale-into-exp`: scores that only meet an exponential are left unscaled.

A softmax exponentiates `scale * q.k`; the Triton target computes `exp` as `exp2` of the
scores times `log2(e)`, one multiply per score it does anyway. When a `tile.scores` result
reaches nothing but exponentials (`tile.softmax_update`, `tile.recompute_probs`, possibly
through `tile.mask`), this pass marks it `unscaled` and each exponential `unscaled_scores`
(with the scores' static `scale`, if any): the exponential then multiplies by
`scale * log2(e)` and the row max by `scale` once per row, one multiply per score less. A
score modifier (ALiBi, a bias, a `tile.map`) between the product and the exponential keeps
the scale where it is, since it must see scaled scores.

Valid because the scale is a positive normal fp32 number, and so is `scale * log2(e)`
(`attn.MIN_SCORE_SCALE`): a mask's -inf stays -inf rather than becoming NaN, and the max of
scaled scores is the scaled max (rounding is monotonic, so even bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.dialects import tile
from attnfuse.transforms.pass_options import TypedOptionsPass


class FoldScaleIntoExp(RewritePattern):
    """`tile.scores` whose every consumer is an exponential -> unscaled, the scale moved to
    the exponentials."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: tile.ScoresOp, rewriter: PatternRewriter) -> None:
        if op.unscaled is not None:
            return
        consumers = tile.scale_consumers(op.result)
        if not consumers or not all(
            user.has_trait(tile.ExponentiatesScores, value_if_unregistered=False) and value is user.scores
            for user, value in consumers
        ):
            return
        op.properties["unscaled"] = UnitAttr()
        rewriter.handle_operation_modification(op)
        for user, _value in consumers:
            user.properties["unscaled_scores"] = UnitAttr()
            if op.scale is not None:
                user.properties["scale"] = op.scale
            rewriter.handle_operation_modification(user)


@dataclass(frozen=True)
class FoldScaleIntoExpPass(TypedOptionsPass):
    """Moves the score scale into the exponentials wherever that is exact (see the module
    docstring)."""

    name = "fold-scale-into-exp"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(FoldScaleIntoExp(), apply_recursively=False).rewrite_module(op)
