"""`attention(...)`: a variant as a composition of blocks.

A spec is pure structure plus static parameters: hashable, printable and the compile-cache
key. Blocks may come in any order that means the same: two specs with the same blocks are
equal unless two of their score modifiers that do not commute (a soft-cap and a bias, say, or
an out-of-tree modifier written without an `additive` term) apply in another order.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from attnfuse.dsl.blocks import Block
from attnfuse.errors import CompositionError

if TYPE_CHECKING:
    import torch

CATEGORY_ORDER = {"transform": 0, "scores": 1, "modifier": 2, "mask": 3, "normalizer": 4}


def validate_blocks(blocks: tuple[Block, ...]) -> None:
    """Raises `CompositionError` naming the blocks at fault, if they cannot be combined."""
    for block in blocks:
        if not isinstance(block, Block):
            raise CompositionError(
                f"attention() takes building blocks such as af.causal(), got {block!r}"
            )
        if not isinstance(block.category, str) or block.category not in CATEGORY_ORDER:
            # An out-of-tree block's typo: the category orders the canonical key.
            raise CompositionError(
                f"{block.block_name}: category {block.category!r} is none of {', '.join(CATEGORY_ORDER)}"
            )
    counts = Counter(type(b) for b in blocks)
    for kind, count in counts.items():
        if count > 1:
            name = next(b.block_name for b in blocks if type(b) is kind)
            raise CompositionError(f"{name} appears {count} times; each block may appear once")
    normalizers = [b.block_name for b in blocks if b.category == "normalizer"]
    if len(normalizers) > 1:
        raise CompositionError(f"a variant has one normalizer, got {' and '.join(normalizers)}")
    masks = [b.block_name for b in blocks if b.category == "mask"]
    if "full" in masks and len(masks) > 1:
        others = ", ".join(m for m in masks if m != "full")
        raise CompositionError(f"full() keeps every key and cannot be combined with {others}")


SCORE_CATEGORIES = ("modifier", "mask")
"""The blocks applied to the scores one after another, in `Block.stage` order."""


def canonical_key(blocks: tuple[Block, ...]) -> tuple[Block, ...]:
    """The blocks in an order that equal variants share, without the blocks that only restate
    a default (full(), softmax(), scaled_dot_product() without a scale): by category, then
    name, except where two score modifiers of one `stage` do not commute, whose order is
    part of the meaning (`canonical_score_order`)."""
    kept = [b for b in blocks if not b.restates_default()]
    by_name = sorted(kept, key=lambda b: (CATEGORY_ORDER[b.category], b.block_name))
    stages = Counter(b.stage for b in kept if b.category == "modifier")
    if all(count == 1 for count in stages.values()):
        # Modifiers of distinct stages apply in stage order whatever the user's, and filters
        # commute with everything: the set of blocks is the meaning.
        return tuple(by_name)
    score_blocks = tuple(b for b in kept if b.category in SCORE_CATEGORIES)
    return tuple(b for b in by_name if b.category not in SCORE_CATEGORIES) + _score_order(score_blocks)


_known_score_orders: dict[tuple[Block, ...], tuple[Block, ...]] = {}
"""`canonical_score_order` by the score blocks as the user wrote them: it builds the blocks'
ops (about a millisecond), and a model may make its spec on every call."""
MAX_KNOWN_SCORE_ORDERS = 1024


def _score_order(score_blocks: tuple[Block, ...]) -> tuple[Block, ...]:
    """`canonical_score_order(score_blocks)`, remembered (a block holding an unhashable
    parameter is ordered anew each time)."""
    try:
        known = _known_score_orders.get(score_blocks)
    except TypeError:
        return canonical_score_order(list(score_blocks))
    if known is None:
        known = canonical_score_order(list(score_blocks))
        if len(_known_score_orders) >= MAX_KNOWN_SCORE_ORDERS:
            # Specs made with ever-new parameters would otherwise grow it forever; forgetting
            # costs each a millisecond once more.
            _known_score_orders.clear()
        _known_score_orders[score_blocks] = known
    return known


def canonical_score_order(score_blocks: list[Block]) -> tuple[Block, ...]:
    """Score blocks (validated) in the one order that every order of equal meaning gives:
    from the order they apply in (stage, then the user's), the least block (by its op's
    `canonical_order`, the one canonicalize-attn sorts by, then the block's name, defining
    module and class) of those that commute with
    every block still before them (`interfaces.commute`, the ops' own algebra) comes first,
    then again for the rest. Moving a block only across blocks it commutes with keeps the
    meaning, and this picks the lexicographically least order among those reachable so."""
    from attnfuse.dialects.attn import is_score_op
    from attnfuse.dialects.interfaces import canonical_order, commute
    from attnfuse.dsl.build_ir import build_module

    applied = sorted(score_blocks, key=lambda b: b.stage)  # stable: the user's order per stage
    (variant,) = build_module(applied).ops
    ops = [op for op in variant.body.block.ops if is_score_op(op)]
    assert len(ops) == len(applied), "a score block builds one score op"
    remaining = list(zip(applied, ops))
    ordered: list[Block] = []
    while remaining:
        free = [i for i, (_block, op) in enumerate(remaining)
                if all(commute(earlier, op) for _b, earlier in remaining[:i])]
        # canonicalize-attn's order (rank, op name, attributes), then the block's own names.
        first = min(free, key=lambda i: (canonical_order(remaining[i][1]), remaining[i][0].block_name,
                                         type(remaining[i][0]).__module__, type(remaining[i][0]).__qualname__))
        ordered.append(remaining.pop(first)[0])
    return tuple(ordered)


class AttentionSpec:
    """An attention variant: its blocks, validated. Call it like a function of (q, k, v)."""

    __slots__ = ("blocks", "_key", "_compiled")

    def __init__(self, blocks: tuple[Block, ...]):
        validate_blocks(blocks)
        self.blocks = blocks
        self._key = canonical_key(blocks)
        self._compiled: Any = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AttentionSpec) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"attention({', '.join(repr(b) for b in self.blocks)})"

    @property
    def canonical_blocks(self) -> tuple[Block, ...]:
        """The blocks in canonical order, without blocks that restate defaults: equal specs
        have equal canonical blocks."""
        return self._key

    def block(self, kind: type[Block]) -> Block | None:
        """The block of a kind, or None."""
        return next((b for b in self.blocks if isinstance(b, kind)), None)

    def module(self, explicit_positions: tuple[bool, bool] = (False, False)):
        """The variant as an `attn` module (a fresh xDSL `ModuleOp`); `explicit_positions`:
        whether query / key RoPE positions are passed at call time."""
        from attnfuse.dsl.build_ir import build_module

        return build_module(self.blocks, explicit_positions=explicit_positions)

    def ir(self, explicit_positions: tuple[bool, bool] = (False, False)) -> str:
        """The variant in the attn dialect, as text that `attnfuse-opt` parses."""
        return str(self.module(explicit_positions))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any):
        """Runs the variant (compiling it on first use; the compiled form is cached)."""
        # The runtime, loaded on first use: the DSL itself imports nothing of it.
        from attnfuse.runtime.api import compiled_form

        return compiled_form(self)(q, k, v, **kwargs)


def attention(*blocks: Block) -> AttentionSpec:
    """Compose building blocks, in any order, into an attention variant."""
    return AttentionSpec(tuple(blocks))
