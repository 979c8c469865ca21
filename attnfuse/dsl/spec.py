"""`attention(...)`: a variant as a composition of blocks.

A spec is pure structure plus static parameters: hashable, printable and the compile-cache
key. Blocks may come in any order; two specs with the same blocks in another order are equal.
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


class AttentionSpec:
    """An attention variant: its blocks, validated. Call it like a function of (q, k, v)."""

    __slots__ = ("blocks", "_key", "_compiled")

    def __init__(self, blocks: tuple[Block, ...]):
        validate_blocks(blocks)
        self.blocks = blocks
        # The canonical key: blocks ordered by category, then name, without the blocks that
        # only restate a default (full(), softmax(), scaled_dot_product() without a scale).
        ordered = sorted(
            (b for b in blocks if not b.restates_default()),
            key=lambda b: (CATEGORY_ORDER[b.category], b.block_name),
        )
        self._key = tuple(ordered)
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
