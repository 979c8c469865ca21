"""Turn a spec's blocks into an `attn.variant`: one op per block.

The core blocks come first (`rope` rotates q and k, `scaled_dot_product` makes the scores),
then every score block in DSL order (each block's `stage`: soft-capping the scaled dot
product first, then the modifiers and masks in the user's order), then
the normalizer (softmax when none is given) and the value product.

The result is deliberately not canonical (masks stay separate, `full()` stays an empty
mask, blocks of one stage stay in the user's order): making it canonical is
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
from attnfuse.dialects.attribute_walk import op_attributes
from attnfuse.errors import CompositionError
from attnfuse.dsl.blocks import Block, Rope, ScaledDotProduct


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


ARGUMENT_NAMES = {
    attn.BiasType(): "bias",
    attn.LayoutType(): "layout",
    attn.DocIdsType(): "doc_ids",
    attn.PositionsType("query"): "q_positions",
    attn.PositionsType("key"): "k_positions",
}
"""The names of the call-time data arguments in the printed IR."""


def check_op_name(op: Operation) -> None:
    """Raises unless the dialect parses `op`'s name as `op`'s own class, and each `attn.`
    attribute it carries (a mask predicate) as that attribute's class. A block may build an op
    or attribute no module registered (the DSL works with the objects), but not one whose name
    the `attn` dialect gives another class: the program's text (`spec.ir()`, a saved program,
    the compile cache's key) would then mean that one instead."""
    from attnfuse.blocks import registered_attribute, registered_op

    _check_registered(op.name, type(op), registered_op(op.name), "op")
    for attribute in op_attributes(op):
        name = getattr(attribute, "name", "")
        if name.startswith("attn."):
            _check_registered(name, type(attribute), registered_attribute(name), "attribute")


def _check_registered(name: str, cls: type, registered: type | None, kind: str) -> None:
    if registered is None or registered is cls:
        return
    if (registered.__module__, registered.__qualname__) == (cls.__module__, cls.__qualname__):
        raise CompositionError(
            f"a block builds {name} from another {cls.__module__}.{cls.__qualname__} than the one "
            "registered (its module was reloaded): register the module again (register_block_module)")
    raise CompositionError(
        f"a block builds {name} as {cls.__module__}.{cls.__qualname__}, but the attn dialect's "
        f"{name} is {registered.__module__}.{registered.__qualname__}: the program's text would mean "
        f"the other {kind}. Give the block's {kind} a name of its own")


def build_module(
    blocks: Sequence[Block],
    name: str = "attention",
    explicit_positions: tuple[bool, bool] = (False, False),
) -> ModuleOp:
    """The `attn` program of a (validated) list of blocks. `explicit_positions` says whether
    the query / key RoPE positions are call-time tensors."""
    wanted = {t for block in blocks for t in block.arguments}
    has_rope = any(isinstance(b, Rope) for b in blocks)
    for role, given in zip(("query", "key"), explicit_positions):
        if given and has_rope:
            wanted.add(attn.PositionsType(role))
    extra = [t for t in attn.VariantOp.EXTRA_ARGUMENT_TYPES if t in wanted]
    variant = attn.VariantOp(name, extra=extra)
    for arg, hint in zip(variant.body.block.args, ("q", "k", "v")):
        arg.name_hint = hint
    for arg in variant.body.block.args[3:]:
        arg.name_hint = ARGUMENT_NAMES[arg.type]
    b = Builder(InsertPoint.at_end(variant.body.block))

    def add(op: Operation, hint: str) -> SSAValue:
        check_op_name(op)
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
    score_blocks = [blk for blk in blocks if blk.category in ("modifier", "mask")]
    for block in sorted(score_blocks, key=lambda blk: blk.stage):  # stable: user order per stage
        scores = add(block.build(variant, scores), block.hint)
    normalizer = next((blk for blk in blocks if blk.category == "normalizer"), None)
    if normalizer is None:
        from attnfuse.blocks.softmax import Softmax  # the default normalizer

        normalizer = Softmax()
    probs = add(normalizer.build(variant, scores), "probs")
    out = add(attn.PVOp(probs, v), "out")
    b.insert(attn.YieldOp(out))
    return ModuleOp([variant])
