"""`place-rope`: decide, per operand, where each RoPE rotation runs.

Sets `placement = "fused"` (rotated in registers inside the attention kernel) or
`"pre_rotated"` (rotated by its own kernel before attention) on every `attn.rope`.

Options `query` and `key` force a placement or leave it to the Rotation Calculus (`auto`, see
`rotation_calculus.py`), which needs the call's shape: `batch-heads`, `kv-heads-ratio`,
`seq-len-q`, `seq-len-k`, `head-dim`, `rotary-dim`, `block-m`, `elem-bytes` and the GPU's
`flops-per-byte` (the H200's by default: the runtime does not yet pass per-GPU rates). Under
`auto` the key rotation is fused only when recomputing it per query block is cheaper than a
memory pass, and the query rotation is fused (done once per element either way) except at
long query lengths with a pre-rotated key, where measurement says pre-rotation wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.dialects.attn import Placement, PlacementAttr, QueryType, RopeOp
from attnfuse.errors import PassOptionError
from attnfuse.transforms.rotation_calculus import (
    H200,
    GpuRates,
    RotationProblem,
    fuse_key_rotation,
    fuse_query_rotation,
)

PLACEMENT_CHOICES = ("auto", "fused", "pre_rotated")


@dataclass(frozen=True)
class PlaceRotation(RewritePattern):
    """Sets the placement of one rotation from the decided query and key placements."""

    query: str
    key: str

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: RopeOp, rewriter: PatternRewriter) -> None:
        wanted = self.query if isinstance(op.input.type, QueryType) else self.key
        if op.placement is not None and op.placement.data == wanted:
            return
        op.properties["placement"] = PlacementAttr(Placement(wanted))
        rewriter.handle_operation_modification(op)


@dataclass(frozen=True)
class PlaceRopePass(ModulePass):
    """Chooses fused or pre-rotated per operand (see the module docstring)."""

    name = "place-rope"

    query: str = "auto"
    """fused, pre_rotated, or auto (the Rotation Calculus decides)."""
    key: str = "auto"
    """fused, pre_rotated, or auto (the Rotation Calculus decides)."""
    batch_heads: int = 1
    """Batch size times query heads (auto only)."""
    kv_heads_ratio: int = 1
    """Query heads per key/value head (auto only)."""
    seq_len_q: int = 4096
    seq_len_k: int = 4096
    head_dim: int = 128
    rotary_dim: int = 0
    """0 means the head dim."""
    block_m: int = 64
    elem_bytes: int = 2
    flops_per_byte: float = H200.flops_per_byte

    def decide(self) -> tuple[str, str]:
        """The (query, key) placements these options ask for."""
        for operand, choice in (("query", self.query), ("key", self.key)):
            if choice not in PLACEMENT_CHOICES:
                raise PassOptionError(
                    f"place-rope: {operand} must be one of {', '.join(PLACEMENT_CHOICES)}, "
                    f"got '{choice}'"
                )
        query, key = self.query, self.key
        if "auto" in (query, key):
            problem = RotationProblem(
                batch_heads_q=self.batch_heads,
                batch_heads_kv=max(1, self.batch_heads // max(1, self.kv_heads_ratio)),
                seq_len_q=self.seq_len_q,
                seq_len_k=self.seq_len_k,
                rotary_dim=self.rotary_dim or self.head_dim,
                head_dim=self.head_dim,
                elem_bytes=self.elem_bytes,
                block_m=self.block_m,
            )
            rates = GpuRates(self.flops_per_byte, H200.bytes_per_second)
            if key == "auto":
                key = "fused" if fuse_key_rotation(problem, rates) else "pre_rotated"
            if query == "auto":
                query = "fused" if fuse_query_rotation(problem, key == "fused") else "pre_rotated"
        return query, key

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        query, key = self.decide()
        PatternRewriteWalker(PlaceRotation(query, key), apply_recursively=False).rewrite_module(op)
