"""`share-offsets`: let a dK/dV kernel's dO loads reuse q's address arithmetic.

A `key_blocks` kernel (dK/dV) whose query loop loads full rows of dO and of q (or its rotated
copy), with `D = Dv`, gets `shared_offsets = ["do", "q"]`: the Triton target then emits both
address computations behind a `SHARED_OFFSETS` constexpr, and the runtime sets it per call
when the two tensors' row and column strides are equal (a model's q and its output gradient
usually share the `[B, N, H, D]` layout). One address computation per loop step instead of
two measured 6% less time for the dK/dV kernel at the Llama-3-8B geometry on the H200 (the
kernel runs at the 255-register limit; bench/results/20261129T1833Z-emitted_variants-
fold-scale.log). Forward and dQ kernels (k and v) are not specialized: not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.dialects import tile
from attnfuse.transforms.pass_options import TypedOptionsPass

FOLLOWER = "do"
LEADERS = ("q_rot", "q")
"""The role whose offsets are shared, and the roles that may lead (the first one loaded)."""


class ShareOffsets(RewritePattern):
    """A dK/dV kernel loading full rows of dO and q in its loop -> `shared_offsets`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: tile.KernelOp, rewriter: PatternRewriter) -> None:
        if op.shared_offsets is not None or op.grid != "key_blocks":
            return
        if op.get("head_dim") != op.get("head_dim_v"):
            return
        loop_loads = {
            load.role for load in op.walk()
            if isinstance(load, tile.LoadOp) and load.rows.data == "loop"
            and load.cols is not None and load.cols.data == "all"
        }
        leader = next((role for role in LEADERS if role in loop_loads), None)
        if FOLLOWER not in loop_loads or leader is None:
            return
        op.attributes["shared_offsets"] = ArrayAttr([StringAttr(FOLLOWER), StringAttr(leader)])
        rewriter.handle_operation_modification(op)


@dataclass(frozen=True)
class ShareOffsetsPass(TypedOptionsPass):
    """Marks the kernels whose loads may share offsets (see the module docstring)."""

    name = "share-offsets"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(ShareOffsets(), apply_recursively=False).rewrite_module(op)
