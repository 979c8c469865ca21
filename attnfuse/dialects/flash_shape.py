"""The flash shape of a forward `tile.kernel`: the analysis `warp-specialize`
(transforms/warp_specialize.py) schedules by and the Gluon target (lowering/gluon.py) prints
from, kept beside the dialect so that both layers read one definition.

A forward kernel has the flash shape when it loads q whole, initializes the online softmax,
bounds its key range, runs key loops over consecutive ranges, each carrying the previous one's
state and each

    load k whole; s = q @ k^T; score ops, each refining the previous tile (masks, maps, ALiBi,
    scales); load v; online-softmax step of the refined tile and the loop's row statistics;
    acc = acc * alpha + p @ v; yield (acc, row max, row sum)

then finalizes and stores that o and log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Operation

from attnfuse.dialects import tile
from attnfuse.errors import IRError

SCORE_OPS = (tile.MaskOp, tile.MapOp, tile.AlibiOp, tile.ApplyScaleOp)
"""Ops between `tile.scores` and `tile.softmax_update` a scheduled kernel may hold
(elementwise on the score tile)."""

OPERAND_ROLES = ("q", "q_rot", "k", "k_rot", "v", "o")
"""Roles the producer copies (or the epilogue stores) by TMA: a pre-rotated copy may stand in
for q or k."""

POINTER_ROLES = ("lse",)
"""Other roles a scheduled kernel may take, besides ALiBi slopes."""

HEAD_DIMS = (64, 128)
"""Head dims the schedule covers: a [128, D] query tile and two stages of [128, D] k and v
fit in shared memory, and D is a whole number of warpgroup MMA steps."""

ELEMENT_TYPES = ("f16", "bf16")
"""What warpgroup MMAs take here."""


class NotFlashShaped(IRError):
    """Why a kernel has no warp-specialized schedule; `op` is the op at fault, or the kernel."""


@dataclass
class FlashLoop:
    """One key loop of a flash-shaped kernel, by the part of the schedule each op goes to."""

    op: tile.KVLoopOp
    k_load: tile.LoadOp
    scores: tile.ScoresOp
    score_ops: list[Operation]
    v_load: tile.LoadOp
    update: tile.SoftmaxUpdateOp
    accumulate: tile.AccumulateOp


@dataclass
class FlashKernel:
    """A flash-shaped forward kernel's parts."""

    kernel: tile.KernelOp
    q_load: tile.LoadOp
    init: tile.SoftmaxInitOp
    bounds: tile.KVBoundsOp
    loops: list[FlashLoop]
    finalize: tile.SoftmaxFinalizeOp
    o_store: tile.StoreOp
    lse_store: tile.StoreOp

    @property
    def operands(self) -> tuple[str, str, str, str]:
        """The roles of q, k, v and o (copied or stored by TMA)."""
        first = self.loops[0]
        return (self.q_load.role, first.k_load.role, first.v_load.role, self.o_store.role)


def _refuse(kernel: tile.KernelOp, op: Operation | None, why: str) -> NotFlashShaped:
    where = f" ({op.name})" if op is not None else ""
    return NotFlashShaped(f"{kernel.sym_name.data}{where}: {why}", op if op is not None else kernel)


def _whole(load: Operation) -> bool:
    return isinstance(load, tile.LoadOp) and load.cols is not None and load.cols.data == "all"


def flash_loop(kernel: tile.KernelOp, loop: tile.KVLoopOp) -> FlashLoop:
    """The parts of one key loop, or `NotFlashShaped`."""
    it = iter(loop.body.block.ops)

    def take(kind: type[Operation], what: str) -> Operation:
        op = next(it, None)
        if not isinstance(op, kind):
            raise _refuse(kernel, op, f"expected {what} here in the key loop")
        return op

    k_load = take(tile.LoadOp, "the load of k")
    if k_load.role not in ("k", "k_rot") or not _whole(k_load):
        raise _refuse(kernel, k_load, "keys must be loaded whole (no rotation in the kernel)")
    scores = take(tile.ScoresOp, "tile.scores")
    if len(scores.queries) != 1 or scores.keys[0] is not k_load.result:
        raise _refuse(kernel, scores, "one q @ k^T product of the loaded tiles")
    score_ops: list[Operation] = []
    chain = scores.result  # the score tile each op refines, in order
    op = next(it, None)
    while isinstance(op, SCORE_OPS):
        # The consumer hands the step one tile: each op refines the previous one's result
        # (a map reads it first; its other inputs are vectors and scalars).
        first = op.inputs[0] if isinstance(op, tile.MapOp) else op.input
        if first is not chain:
            raise _refuse(kernel, op, "score ops must refine the previous score tile, in order")
        score_ops.append(op)
        chain = op.result
        op = next(it, None)
    if not isinstance(op, tile.LoadOp) or op.role != "v" or not _whole(op):
        raise _refuse(kernel, op, "score ops are masks, maps, ALiBi and scales, then the load of v")
    update = take(tile.SoftmaxUpdateOp, "tile.softmax_update")
    acc, row_max, row_sum = loop.body.block.args
    if update.scores is not chain or update.row_max is not row_max or update.row_sum is not row_sum:
        raise _refuse(kernel, update, "the softmax step reads the refined scores and the loop's row statistics")
    accumulate = take(tile.AccumulateOp, "tile.accumulate")
    if (accumulate.value is not op.result or accumulate.probs is not update.probs
            or accumulate.alpha is not update.alpha or accumulate.acc is not acc):
        raise _refuse(kernel, accumulate, "acc * alpha + p @ v of the loop's accumulator and the softmax step's p")
    end = take(tile.YieldOp, "tile.yield")
    if list(end.operands) != [accumulate.result, update.new_row_max, update.new_row_sum]:
        raise _refuse(kernel, end, "the loop carries the accumulator, row max and row sum, in that order")
    return FlashLoop(loop, k_load, scores, score_ops, op, update, accumulate)


def flash_kernel(kernel: tile.KernelOp) -> FlashKernel:
    """The parts of a flash-shaped forward kernel, or `NotFlashShaped` saying why not."""
    if kernel.grid != "query_blocks" or kernel.sym_name.data != "attention_fwd":
        raise _refuse(kernel, None, "only the forward kernel (query_blocks grid) has the flash shape")
    if kernel.elem not in ELEMENT_TYPES:
        raise _refuse(kernel, None, f"element type {kernel.elem}: warpgroup MMAs take f16 or bf16 here")
    dim, dim_v = kernel.get("head_dim"), kernel.get("head_dim_v")
    if dim not in HEAD_DIMS or dim_v != dim:
        raise _refuse(kernel, None, f"head dim {dim}/{dim_v}: the schedule covers {HEAD_DIMS}")
    ops = list(kernel.body.block.ops)
    if isinstance(ops[0], tile.LoadOp) and not _whole(ops[0]):
        raise _refuse(kernel, ops[0], "the query must be loaded whole (no rotation in the kernel)")
    head = [tile.LoadOp, tile.SoftmaxInitOp, tile.KVBoundsOp]
    tail = [tile.SoftmaxFinalizeOp, tile.StoreOp, tile.StoreOp, tile.ReturnOp]
    shape = "expected q load, softmax init, key bounds, key loops, finalize, stores"
    for op, kind in zip(ops, head + [tile.KVLoopOp] * (len(ops) - len(head) - len(tail)) + tail):
        if not isinstance(op, kind):
            raise _refuse(kernel, op, shape)
    if len(ops) < len(head) + len(tail) + 1:
        raise _refuse(kernel, None, shape)
    q_load, init, bounds = ops[0], ops[1], ops[2]
    if q_load.role not in ("q", "q_rot"):
        raise _refuse(kernel, q_load, "the first load must be the query's")
    loops = [flash_loop(kernel, op) for op in ops[3:-4]]
    for loop in loops:
        if loop.scores.queries[0] is not q_load.result:
            raise _refuse(kernel, loop.scores, "the scores read the loaded query")
    carried = list(init.results)
    for loop in loops:
        if list(loop.op.inits) != carried:
            raise _refuse(kernel, loop.op, "key loops must chain their accumulator and row statistics")
        carried = list(loop.op.results)
    for before, after in zip(loops, loops[1:]):
        if after.op.lower is not before.op.upper:
            raise _refuse(kernel, after.op, "key loops must cover consecutive ranges")
    finalize, o_store, lse_store = ops[-4], ops[-3], ops[-2]
    if list(finalize.operands) != carried:
        raise _refuse(kernel, finalize, "finalize must read the last loop's state")
    if o_store.role != "o" or lse_store.role != "lse" or o_store.value is not finalize.output \
            or lse_store.value is not finalize.lse:
        raise _refuse(kernel, o_store, "stores of finalize's o and lse")
    parts = FlashKernel(kernel, q_load, init, bounds, loops, finalize, o_store, lse_store)
    for role in kernel.roles:
        if role not in parts.operands and role not in POINTER_ROLES and tile.role_kind(role) != "slopes":
            raise _refuse(kernel, None, f"role {role} has no place in the schedule")
    return parts


__all__ = ["FlashKernel", "FlashLoop", "NotFlashShaped", "flash_kernel", "flash_loop"]
