"""`warp-specialize`: give flash-shaped forward kernels Hopper's warp-specialized schedule.

A forward kernel has the flash shape when it loads q whole, initializes the online softmax,
bounds its key range, runs key loops that each

    load k whole; s = q @ k^T; score ops (masks, maps, ALiBi, an additive bias, scales);
    load v; online-softmax step; acc = acc * alpha + p @ v

over consecutive ranges, each carrying the previous one's state, then finalizes and stores
o and the log-sum-exp; or the same with a pointwise normalizer (ReLU, sigmoid) in place of the
softmax, its accumulator starting from zeros, never rescaled and stored as o. Its loads then need no registers of the consumers: a producer partition
can copy k and v blocks into shared memory (TMA) while the consumers compute. The pass marks
such a kernel `schedule = #tile<schedule warp_specialized>` (`tile.ScheduleAttr`) and sets
the schedule's sizes: `num_warps = 4 * consumers` (one warpgroup of 64 query rows per consumer
partition, so `block_m = 16 * num_warps`), `block_n` keys per step, `num_stages` buffers per
operand, `producer_warps`, `consumer_registers`, and with `persistent` the kernel's
`persistent = 1` (a grid of one program per SM walking the tiles).
A block-sparse or document kernel (key loops over block lists, `tile.sparse_kv_loop`) keeps the
tiles it was lowered with, which its lists name (`listed_schedule`). A kernel of another shape
(a rotation in the kernel, backward and decode kernels) is left as it is, for the portable
schedule (the fused backward has its own pattern, `WarpSpecializeBackward`).

The shape analysis, `flash_kernel`, lives in `dialects/flash_shape.py`: the Gluon target
(`lowering/gluon.py`) reads a scheduled kernel's parts through it too.

The defaults are the H200's measured best (bench/results/20261201T1650Z-gluon_forward_probe-
variants.md): 128-key blocks (64 at head dim 256, `DEFAULT_BLOCK_N`), two stages, one producer warp, two consumer warpgroups of 240
registers each (`DEFAULT_CONSUMERS`; the runtime asks for three at head dim 64,
`gluon_forward.SCHEDULES`).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from attnfuse.dialects import tile
from attnfuse.dialects.backward_shape import backward_kernel
from attnfuse.dialects.flash_shape import (
    HEAD_DIMS,
    FlashKernel,
    FlashLoop,
    NotFlashShaped,
    flash_kernel,
)
from attnfuse.transforms.pass_options import TypedOptionsPass


class WarpSpecialize(RewritePattern):
    """A flash-shaped forward kernel -> `#tile<schedule warp_specialized>` and its tile sizes."""

    def __init__(self, options: WarpSpecializePass):
        self.options = options

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: tile.KernelOp, rewriter: PatternRewriter) -> None:
        if op.schedule is not None:
            return
        try:
            parts = flash_kernel(op)
        except NotFlashShaped:
            return  # the portable schedule covers every kernel
        o = self.options
        consumers = o.consumers or DEFAULT_CONSUMERS
        block_n = o.block_n or DEFAULT_BLOCK_N[op.get("head_dim")]
        if parts.listed:
            # Block lists name tiles of the kernel's own sizes (the runtime builds them so): the
            # schedule takes them as they are, a consumer per 64 query rows, and no persistent
            # grid (its tile walk is not written for lists).
            listed = listed_schedule(op, o)
            if listed is None:
                return
            consumers, block_n = listed
        registers = o.consumer_registers or CONSUMER_REGISTERS[consumers]
        op.attributes["schedule"] = tile.ScheduleAttr(tile.Schedule.WARP_SPECIALIZED)
        op.attributes.pop("head_major", None)  # the portable grid's order; this schedule has its own
        for key, value in (("block_m", 64 * consumers), ("block_n", block_n),
                           ("num_warps", 4 * consumers), ("num_stages", o.stages),
                           ("producer_warps", o.producer_warps), ("consumer_registers", registers)):
            op.attributes[key] = IntegerAttr(value, i64)
        if o.persistent and not parts.listed:
            op.attributes["persistent"] = IntegerAttr(1, i64)
        rewriter.handle_operation_modification(op)


LISTED_BLOCK_N = (64, 128)
"""Key tiles a block-sparse kernel may keep under the schedule (warpgroup MMAs of 64 or 128
keys; the shared memory of two stages at head dims 64 and 128)."""


def listed_schedule(kernel: tile.KernelOp, options: WarpSpecializePass) -> tuple[int, int] | None:
    """(consumers, block_n) of a block-sparse forward: its own tiles, a consumer warpgroup per
    64 query rows; None where the schedule cannot take them (rows not a multiple of 64, more
    than three consumers, another key tile, head dim 256) or the options ask for other tiles."""
    rows, keys = kernel.get("block_m"), kernel.get("block_n")
    consumers = rows // 64
    if rows % 64 or not 1 <= consumers <= 3 or keys not in LISTED_BLOCK_N or kernel.get("head_dim") > 128:
        return None
    if (options.consumers and options.consumers != consumers) or (options.block_n and options.block_n != keys):
        return None
    return consumers, keys


class WarpSpecializeBackward(RewritePattern):
    """The fused backward's `attention_bwd_dkdv_dq` (`backward_shape`) -> the warp-specialized
    schedule: two consumer warpgroups of 64 keys (8 warps, `block_m` 128), `bwd_block_n`
    queries per step, `bwd_stages` ring buffers, one loader warp (the hand-written probe's
    `wg2_writer_lse`, bench/gluon_backward_probe.py: 1.00-1.08x cuDNN's backward on the H200),
    and `dq_writers` dQ writer warps (`bwd_dq_writers`; by default two where the adds are in
    key-block order, one otherwise). A kernel walking block lists is scheduled only on these
    tiles already (the runtime builds its lists for them: `CallPlanning.compile_key`)."""

    def __init__(self, options: WarpSpecializePass):
        self.options = options

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: tile.KernelOp, rewriter: PatternRewriter) -> None:
        if op.schedule is not None or op.grid != "key_blocks" or not self.options.backward:
            return
        try:
            shape = backward_kernel(op)
        except NotFlashShaped:
            return
        o = self.options
        if shape.listed and (op.get("block_m"), op.get("block_n")) != (BACKWARD_BLOCK_M, o.bwd_block_n):
            # The block lists were built for the kernel's tiles (per call, by the runtime), which
            # the schedule cannot change: it takes a listed kernel already on its own tiles.
            return
        writers = o.bwd_dq_writers or (ORDERED_DQ_WRITERS if shape.loops[0].store_add.ordered else 1)
        op.attributes["schedule"] = tile.ScheduleAttr(tile.Schedule.WARP_SPECIALIZED)
        for key, value in (("block_m", BACKWARD_BLOCK_M), ("block_n", o.bwd_block_n), ("num_warps", 8),
                           ("num_stages", o.bwd_stages), ("producer_warps", 1), ("dq_writers", writers)):
            op.attributes[key] = IntegerAttr(value, i64)
        rewriter.handle_operation_modification(op)


BACKWARD_BLOCK_M = 128
"""Keys per program of the scheduled backward: two consumer warpgroups of 64."""

DEFAULT_CONSUMERS = 2
"""Two consumer warpgroups unless the `consumers` option says otherwise: the H200's best at
head dim 128. At head dim 64 the runtime asks for three (FA3's shape, 192 rows a program:
10-14% faster there, `gluon_forward.SCHEDULES`); with the 160 registers three consumers get,
the printed kernel spills none with Triton 3.6 and 152-168 bytes with 3.9."""

ORDERED_DQ_WRITERS = 2
"""dQ writer warps of a backward whose adds are in key-block order, unless `bwd_dq_writers`
says otherwise. One writer serializes, per step, the wait for the key block before, the
reduce, the wait for its writes and the hand-over: about a step's time at the Llama-3-8B
heads, so the writer, not the products, set the pace. Two writers, each owning one dQ staging
buffer (alternate steps), overlap one step's hand-over with the next step's wait. Measured on
the H200 (bench/results/20261202T1907Z-ordered-two-writers-ab.md): backward 0.720 / 2.873 ms
at causal 4096 / 8192 against one writer's 0.801 / 3.045, within 0-9% of the unordered kernel."""

DEFAULT_BLOCK_N = {dim: 64 if dim > 128 else 128 for dim in HEAD_DIMS}
"""Keys per step unless the `block_n` option says otherwise, for each head dim the schedule
covers: 128, and 64 past head dim 128, where two stages of 128-key k and v blocks (256 KB at
head dim 256) exceed shared memory."""

CONSUMER_REGISTERS = {1: 240, 2: 240, 3: 160}
"""Registers per consumer thread by consumer count: what 64K registers hold beside a 24-register
producer warpgroup, at one program per SM."""


@dataclass(frozen=True)
class WarpSpecializePass(TypedOptionsPass):
    """Schedules the flash-shaped forward kernels warp-specialized (see the module docstring)."""

    name = "warp-specialize"

    block_n: int = 0
    """Keys per step; 0: by head dim (`DEFAULT_BLOCK_N`)."""
    stages: int = 2
    consumers: int = 0
    """Consumer warpgroups; 0: `DEFAULT_CONSUMERS`."""
    producer_warps: int = 1
    consumer_registers: int = 0
    """Registers per consumer thread; 0: by consumer count (`CONSUMER_REGISTERS`)."""
    persistent: bool = False
    """One program per SM walking the tiles (`persistent = 1` on the kernel); on the H200 1-3%
    faster than the plain grid for dense attention at head dim 128, 3-15% slower under a causal
    band and at head dim 64 (the runtime's choice: `gluon_forward.SCHEDULES`)."""

    backward: bool = True
    """Schedule the fused backward's dK/dV/dQ kernel too (`WarpSpecializeBackward`)."""
    bwd_block_n: int = 64
    """Queries per step of the scheduled backward (64 only, for now: what fits shared memory)."""
    bwd_stages: int = 2
    """Ring buffers of q, dO, lse and delta in the scheduled backward."""
    bwd_dq_writers: int = 0
    """dQ writer warps of the scheduled backward, 1 or 2 (one per staging buffer); 0: two for
    adds in key-block order (`ORDERED_DQ_WRITERS`), one otherwise."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bwd_block_n != 64:
            # 128 queries a step need ~352 KB of shared memory at head dim 128 (the dQ staging
            # and the q/dO ring double), more than an H200's 227 KB.
            raise self.option_error("bwd-block-n", "64 (the schedule's shared memory fits that at head dim 128)",
                                    self.bwd_block_n)
        if self.bwd_stages < 1:
            raise self.option_error("bwd-stages", ">= 1", self.bwd_stages)
        if self.bwd_dq_writers not in (0, 1, 2):
            raise self.option_error("bwd-dq-writers", "1 or 2 (one per dQ staging buffer; 0: by the adds' order)",
                                    self.bwd_dq_writers)
        if self.block_n and not (self.block_n >= 16 and self.block_n & (self.block_n - 1) == 0):
            raise self.option_error("block-n", "a power of two >= 16 (0: by head dim)", self.block_n)
        if self.consumers not in (0, 1, 2, 3):
            raise self.option_error("consumers", "1, 2 or 3 warpgroups (0: the default)", self.consumers)
        for option, value in (("stages", self.stages), ("producer-warps", self.producer_warps)):
            if value < 1:
                raise self.option_error(option, ">= 1", value)
        if self.consumer_registers and not 24 <= self.consumer_registers <= 255:
            raise self.option_error("consumer-registers", "in [24, 255]", self.consumer_registers)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for pattern in (WarpSpecialize(self), WarpSpecializeBackward(self)):
            PatternRewriteWalker(pattern, apply_recursively=False).rewrite_module(op)


__all__ = ["BACKWARD_BLOCK_M", "HEAD_DIMS", "LISTED_BLOCK_N", "FlashKernel", "FlashLoop", "NotFlashShaped", "WarpSpecializePass",
           "flash_kernel", "listed_schedule"]
