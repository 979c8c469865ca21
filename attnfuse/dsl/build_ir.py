"""Turn a spec's blocks into an `attn.variant`: one op per block, in the user's order.

The result is deliberately not canonical (masks stay separate, `full()` stays an empty
mask): making it canonical is `canonicalize-attn`'s job, and keeping the two apart is what
lets the pass be tested on real DSL output.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.builder import Builder
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
from xdsl.rewriter import InsertPoint

from attnfuse.dialects import attn
from attnfuse.dsl.blocks import Block, Causal, Full, Rope, ScaledDotProduct, SlidingWindow


def build_module(blocks: Sequence[Block], name: str = "attention") -> ModuleOp:
    """The `attn` program of a (validated) list of blocks."""
    variant = attn.VariantOp(name)
    for arg, hint in zip(variant.body.block.args, ("q", "k", "v")):
        arg.name_hint = hint
    b = Builder(InsertPoint.at_end(variant.body.block))

    def add(op, hint: str) -> SSAValue:
        b.insert(op)
        op.results[0].name_hint = hint
        return op.results[0]

    q, k, v = variant.query, variant.key, variant.value
    for block in blocks:
        if isinstance(block, Rope):
            q = add(attn.RopeOp(q, block.theta, block.rotary_dim, block.interleaved), "q_rot")
            k = add(attn.RopeOp(k, block.theta, block.rotary_dim, block.interleaved), "k_rot")
    scale = next((blk.scale for blk in blocks if isinstance(blk, ScaledDotProduct)), None)
    scores = add(attn.ScoresOp(q, k, scale), "scores")
    for block in blocks:
        if isinstance(block, Full):
            scores = add(attn.MaskOp(scores, []), "kept")
        elif isinstance(block, Causal):
            scores = add(attn.MaskOp(scores, [attn.CausalAttr()]), "kept")
        elif isinstance(block, SlidingWindow):
            scores = add(attn.MaskOp(scores, [attn.WindowAttr(block.window)]), "kept")
    probs = add(attn.SoftmaxOp(scores), "probs")
    out = add(attn.PVOp(probs, v), "out")
    b.insert(attn.YieldOp(out))
    return ModuleOp([variant])
