"""`analyze-masks`: the block-level iteration space of every mask.

Causal and sliding-window masks are *bands*: query i keeps key j iff
`q_pos(i) + lower <= j <= q_pos(i) + upper`. A mask's band is the intersection of its
predicates' bands, recorded as `band = #attn.band<...>` on the `attn.mask`.

The band decides, for a query block of `block_m` rows and key blocks of `block_n` keys, which
key blocks are *empty* (no row keeps any key: never visited), *full* (every row keeps every
key: no mask work) or *partial* (the mask is evaluated). `lower-to-tile` turns it into
`tile.kv_bounds`, e.g. for `causal` (`upper = 0`) the blocks above the diagonal are never
visited and only blocks crossing the diagonal are masked.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.blocks.masks import MaskOp
from attnfuse.dialects.attn import BandAttr, intersect_bands
from attnfuse.transforms.pass_options import TypedOptionsPass


def mask_band(op: MaskOp) -> BandAttr:
    """The band kept by all of a mask's predicates."""
    bands = [p.band() for p in op.predicate_list]
    return BandAttr(*intersect_bands([b for b in bands if b is not None]))


class AnnotateBand(RewritePattern):
    """Records the intersection of a mask's band predicates as its `band` property."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        band = mask_band(op)
        if op.band == band:
            return
        op.properties["band"] = band
        rewriter.handle_operation_modification(op)


@dataclass(frozen=True)
class AnalyzeMasksPass(TypedOptionsPass):
    """Annotates every `attn.mask` with its band (see the module docstring)."""

    name = "analyze-masks"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(AnnotateBand(), apply_recursively=False).rewrite_module(op)
