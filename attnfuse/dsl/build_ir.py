"""Turn a spec's blocks into an `attn.variant`: one op per block, in the user's order.

The result is deliberately not canonical (masks stay separate, `full()` stays an empty
mask, modifiers and masks stay in the user's order): making it canonical is
`canonicalize-attn`'s job, and keeping the two apart is what lets the pass be tested on real
DSL output.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.builder import Builder
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint

from attnfuse.dialects import attn
from attnfuse.dsl.blocks import (
    AdditiveBias,
    Alibi,
    Block,
    BlockSparse,
    Causal,
    Full,
    Relu,
    Rope,
    ScaledDotProduct,
    SlidingWindow,
)


def rope_op(operand: SSAValue, block: Rope, positions: SSAValue | None) -> attn.RopeOp:
    """The `attn.rope` of one operand for a `rope(...)` block."""
    scaling = block.scaling
    return attn.RopeOp(
        operand,
        block.theta,
        block.rotary_dim,
        block.interleaved,
        scaling=None
        if scaling is None
        else (
            scaling.factor,
            scaling.low_freq_factor,
            scaling.high_freq_factor,
            scaling.original_max_position,
        ),
        positions=positions,
    )


def mask_predicates(blocks: Sequence[Block]) -> list[attn.MaskPredicate]:
    """The band predicates of a spec's mask blocks."""
    predicates: list[attn.MaskPredicate] = []
    for block in blocks:
        if isinstance(block, Causal):
            predicates.append(attn.CausalAttr())
        elif isinstance(block, SlidingWindow):
            predicates.append(attn.WindowAttr(block.window))
    return predicates


def mask_band(spec) -> tuple[int | None, int | None]:
    """The band of key offsets a spec's band masks keep (what `analyze-masks` computes)."""
    bands = [p.band() for p in mask_predicates(spec.blocks)]
    return attn.intersect_bands([b for b in bands if b is not None])


def build_module(
    blocks: Sequence[Block],
    name: str = "attention",
    explicit_positions: tuple[bool, bool] = (False, False),
) -> ModuleOp:
    """The `attn` program of a (validated) list of blocks. `explicit_positions` says whether
    the query / key RoPE positions are call-time tensors."""
    extra = []
    if any(isinstance(b, AdditiveBias) for b in blocks):
        extra.append(attn.BiasType())
    if any(isinstance(b, BlockSparse) for b in blocks):
        extra.append(attn.LayoutType())
    has_rope = any(isinstance(b, Rope) for b in blocks)
    for role, given in zip(("query", "key"), explicit_positions):
        if given and has_rope:
            extra.append(attn.PositionsType(role))
    variant = attn.VariantOp(name, extra=extra)
    hints = {attn.BiasType(): "bias", attn.LayoutType(): "layout",
             attn.PositionsType("query"): "q_positions", attn.PositionsType("key"): "k_positions"}
    for arg, hint in zip(variant.body.block.args, ("q", "k", "v")):
        arg.name_hint = hint
    for arg in variant.body.block.args[3:]:
        arg.name_hint = hints[arg.type]
    b = Builder(InsertPoint.at_end(variant.body.block))

    def add(op: Operation, hint: str) -> SSAValue:
        b.insert(op)
        op.results[0].name_hint = hint
        return op.results[0]

    q, k, v = variant.query, variant.key, variant.value
    for block in blocks:
        if isinstance(block, Rope):
            q = add(rope_op(q, block, variant.argument(attn.PositionsType("query"))), "q_rot")
            k = add(rope_op(k, block, variant.argument(attn.PositionsType("key"))), "k_rot")
    scale = next((blk.scale for blk in blocks if isinstance(blk, ScaledDotProduct)), None)
    scores = add(attn.ScoresOp(q, k, scale), "scores")
    for block in blocks:
        if isinstance(block, Full):
            scores = add(attn.MaskOp(scores, []), "kept")
        elif isinstance(block, (Causal, SlidingWindow)):
            scores = add(attn.MaskOp(scores, mask_predicates([block])), "kept")
        elif isinstance(block, BlockSparse):
            layout = variant.argument(attn.LayoutType())
            assert layout is not None
            scores = add(attn.BlockSparseOp(scores, layout, block.block_size), "kept")
        elif isinstance(block, Alibi):
            scores = add(attn.AlibiOp(scores, block.slopes), "biased")
        elif isinstance(block, AdditiveBias):
            bias = variant.argument(attn.BiasType())
            assert bias is not None
            scores = add(attn.AddBiasOp(scores, bias), "biased")
    relu = any(isinstance(block, Relu) for block in blocks)
    probs = add(attn.ReluOp(scores) if relu else attn.SoftmaxOp(scores), "probs")
    out = add(attn.PVOp(probs, v), "out")
    b.insert(attn.YieldOp(out))
    return ModuleOp([variant])
