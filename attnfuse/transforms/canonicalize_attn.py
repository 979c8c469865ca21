"""`canonicalize-attn`: bring an attention program to its one canonical form.

Variants that mean the same thing must become the same IR, because the canonical IR is what
the rest of the pipeline (and the kernel cache) sees. The rewrites:

- score modifications (`attn.alibi`, then `attn.add_bias`) move before masks
  (`attn.mask`, then `attn.block_sparse`): a dropped key stays dropped whatever is added to
  it, so the order never changes the result, and one order makes equal variants equal IR;
- adjacent masks merge into one mask whose predicate list is their union;
- a mask's predicates are sorted and deduplicated, and windows intersect to the narrowest;
- a mask with no predicates (the DSL's `full()`) keeps every key and is dropped.

A merged mask loses any `band` annotation: `analyze-masks` recomputes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.dialects.attn import (
    AddBiasOp,
    AlibiOp,
    BlockSparseOp,
    MaskOp,
    MaskPredicate,
    WindowAttr,
)

SCORE_CHAIN_ORDER: dict[type[Operation], int] = {AlibiOp: 0, AddBiasOp: 1, MaskOp: 2, BlockSparseOp: 3}
"""Canonical order of the ops between `attn.scores` and the normalizer."""


def canonical_predicates(predicates: list[MaskPredicate]) -> list[MaskPredicate]:
    """Sorted, deduplicated predicates, with all windows intersected into the narrowest."""
    windows = [p for p in predicates if isinstance(p, WindowAttr)]
    others = {str(p): p for p in predicates if not isinstance(p, WindowAttr)}
    merged = list(others.values())
    if windows:
        merged.append(min(windows, key=lambda w: w.size.data))
    return sorted(merged, key=str)


class OrderScoreChain(RewritePattern):
    """`y(x(s))` -> `x(y(s))` for two score ops out of canonical order (`SCORE_CHAIN_ORDER`),
    when `x`'s result feeds only `y`."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        rank = SCORE_CHAIN_ORDER.get(type(op))
        if rank is None:
            return
        inner = op.operands[0].owner
        inner_rank = SCORE_CHAIN_ORDER.get(type(inner))
        if not isinstance(inner, Operation) or inner_rank is None or inner_rank <= rank:
            return
        if not inner.results[0].has_one_use():
            return
        # Rebuild the pair swapped: op reads the inner op's input, the inner op reads op.
        moved_up = op.clone()
        moved_up.operands[0] = inner.operands[0]
        moved_down = inner.clone()
        moved_down.operands[0] = moved_up.results[0]
        rewriter.insert([moved_up, moved_down], InsertPoint.before(inner))
        rewriter.replace(op, [], [moved_down.results[0]])
        rewriter.erase(inner)


class MergeAdjacentMasks(RewritePattern):
    """`mask(mask(s, A), B)` -> `mask(s, A + B)` when the inner mask has no other use."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        inner = op.input.owner
        if not isinstance(inner, MaskOp) or not inner.result.has_one_use():
            return
        # Intersecting two masks is concatenating their predicates; the sort pattern then
        # orders and deduplicates them.
        merged = MaskOp(inner.input, inner.predicate_list + op.predicate_list)
        rewriter.replace(op, merged)
        rewriter.erase(inner)


class SortMaskPredicates(RewritePattern):
    """Puts a mask's predicates in canonical order, without duplicates or redundant windows."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        current = op.predicate_list
        canonical = canonical_predicates(current)
        if canonical == current:
            return
        op.properties["predicates"] = ArrayAttr(canonical)
        op.properties.pop("band", None)
        rewriter.handle_operation_modification(op)


class DropEmptyMask(RewritePattern):
    """A mask with no predicates keeps every key: its scores are its input's."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        if op.predicate_list:
            return
        rewriter.replace(op, [], [op.input])


@dataclass(frozen=True)
class CanonicalizeAttnPass(ModulePass):
    """Rewrites every `attn.variant` into canonical form (see the module docstring)."""

    name = "canonicalize-attn"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [OrderScoreChain(), MergeAdjacentMasks(), SortMaskPredicates(), DropEmptyMask()],
                # attn ops are Pure: DCE would also erase ops a test deliberately left unused.
                dce_enabled=False,
            )
        ).rewrite_module(op)
