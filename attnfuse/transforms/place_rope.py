"""`place-rope`: decide, per operand, where each RoPE rotation runs.

Sets `placement = "fused"` (rotated in registers inside the attention kernel) or
`"pre_rotated"` (rotated by its own kernel before attention) on every `attn.rope`.

`key=given` marks the key rotation `given` instead: the caller passes keys already rotated
(a KV cache stores each key rotated once, when it is written), so nothing rotates them. That
is not a performance choice but a change of what the key input means, so a rotation already
marked `given` (in hand-written IR, or by an earlier run) keeps it whatever the options say.
`given` is no placement for the query.

Options `query` and `key` force a placement or leave it to the Rotation Calculus (`auto`, see
`rotation_calculus.py`), which needs the call's shape: `batch-heads`, `kv-heads-ratio`,
`seq-len-q`, `seq-len-k`, `head-dim`, `rotary-dim`, `block-m`, `elem-bytes` and the GPU's
`flops-per-byte` (the H200's by default: the runtime does not yet pass per-GPU rates). Under
`auto` the key rotation is fused only when recomputing it per query block is cheaper than a
memory pass, and the query rotation is fused (done once per element either way) except at
long query lengths with a pre-rotated key, where measurement says pre-rotation wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.dialects.attn import (
    KeyType,
    Placement,
    PlacementAttr,
    QueryType,
    RopeOp,
    ScoresOp,
    VariantOp,
)
from attnfuse.errors import IRError, PassOptionError
from attnfuse.transforms.pass_options import TypedOptionsPass
from attnfuse.transforms.rotation_calculus import (
    H200,
    GpuRates,
    RotationProblem,
    fuse_key_rotation,
    fuse_query_rotation,
)

PLACEMENT_CHOICES = ("auto", "fused", "pre_rotated")
"""What the `query` option takes."""

KEY_PLACEMENT_CHOICES = (*PLACEMENT_CHOICES, "given")
"""What the `key` option takes: also `given`, a key the caller passes rotated."""


@dataclass(frozen=True)
class PlaceRotation(RewritePattern):
    """Sets the placement of one rotation from the decided query and key placements."""

    query: str
    key: str

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: RopeOp, rewriter: PatternRewriter) -> None:
        wanted = self.query if isinstance(op.input.type, QueryType) else self.key
        if op.given:
            return  # the program's meaning (keys passed rotated), not a choice to revisit
        if op.placement is not None and op.placement.data == wanted:
            return
        if wanted == Placement.GIVEN and op.positions is not None:
            # A given key arrives rotated: it reads no positions (the verifier's rule), so
            # marking this rotation would make the program invalid rather than say why.
            raise IRError(
                "place-rope: key=given, but this key rotation reads call-time positions "
                "(attn.rope ... at %positions); a given key arrives rotated and reads none: "
                "place it fused or pre_rotated, or drop the positions", op)
        op.properties["placement"] = PlacementAttr(Placement(wanted))
        rewriter.handle_operation_modification(op)


@dataclass(frozen=True)
class PlaceRopePass(TypedOptionsPass):
    """Chooses fused or pre-rotated per operand, or marks the key given (see the module
    docstring)."""

    name = "place-rope"

    query: str = "auto"
    """fused, pre_rotated, or auto (the Rotation Calculus decides)."""
    key: str = "auto"
    """fused, pre_rotated, auto (the Rotation Calculus decides), or given (the caller passes
    keys rotated: no kernel rotates them)."""
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

    def check_problem(self) -> None:
        """The problem options `auto` weighs, checked (a `PassOptionError` naming the first one
        out of range)."""
        for key, value in (("batch-heads", self.batch_heads), ("kv-heads-ratio", self.kv_heads_ratio),
                           ("seq-len-q", self.seq_len_q), ("seq-len-k", self.seq_len_k),
                           ("elem-bytes", self.elem_bytes)):
            if value < 1:
                raise self.option_error(key, ">= 1", value)
        if not 1 <= self.head_dim <= 256:
            raise self.option_error("head-dim", "in [1, 256]", self.head_dim)
        if self.rotary_dim < 0 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise self.option_error("rotary-dim", "even and in [0, head-dim] (0: the head dim)", self.rotary_dim)
        if self.block_m < 1:
            # Only a divisor here (the tiles themselves are lower-to-tile's to check).
            raise self.option_error("block-m", ">= 1", self.block_m)
        if not (math.isfinite(self.flops_per_byte) and self.flops_per_byte > 0):
            raise self.option_error("flops-per-byte", "a positive number", self.flops_per_byte)

    def decide(self) -> tuple[str, str]:
        """The (query, key) placements these options ask for."""
        if self.query == "given":
            raise PassOptionError(
                self.name, "query", "query=given is not a placement: only keys arrive rotated (from a "
                "KV cache); the query is rotated by the kernels"
            )
        for operand, choice, choices in (("query", self.query, PLACEMENT_CHOICES),
                                         ("key", self.key, KEY_PLACEMENT_CHOICES)):
            if choice not in choices:
                raise self.option_error(operand, f"one of {', '.join(choices)}", choice)
        query, key = self.query, self.key
        if "auto" in (query, key):
            self.check_problem()
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
                # A given key is read as it is, like a pre-rotated one: not rotated in the loop.
                query = "fused" if fuse_query_rotation(problem, key == "fused") else "pre_rotated"
        return query, key

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        query, key = self.decide()
        PatternRewriteWalker(PlaceRotation(query, key), apply_recursively=False).rewrite_module(op)


def key_rotation(variant: VariantOp) -> RopeOp | None:
    """The rotation of the key that the variant's scores read, or None."""
    (scores,) = variant.ops_of(ScoresOp)
    owner = scores.key.owner
    return owner if isinstance(owner, RopeOp) and isinstance(owner.input.type, KeyType) else None


def give_key_rotation(variant: VariantOp) -> None:
    """Marks the variant's key rotation `given` (in place): the key arrives rotated. What
    `place-rope{key=given}` does, for callers that need the meaning before the pipeline runs
    (the reference)."""
    rope = key_rotation(variant)
    if rope is not None:
        rope.properties["placement"] = PlacementAttr(Placement.GIVEN)
