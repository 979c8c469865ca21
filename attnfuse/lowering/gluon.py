"""The Gluon target: a forward `tile.kernel` as a warp-specialized Hopper kernel (`-t gluon`).

The portable target (`lowering/triton.py`) prints each tile op as `tl` code and leaves the
schedule to Triton. On Hopper the fast schedule is one `tl` cannot say: a producer warp that only
issues TMA copies into a ring of shared-memory buffers, consumer warpgroups that run the
products with `warpgroup_mma` (P from registers) and overlap the softmax of one key block with
the P @ V product of the previous one. This target prints that schedule in Gluon
(`triton.experimental.gluon`), for the forward kernels whose key loops have the flash shape:

    k = tile.load k[loop, all]; s = tile.scores(q) x(k); <score ops>; v = tile.load v[loop, all]
    p, m, l, alpha = tile.softmax_update s, ...; acc = tile.accumulate acc, p, v rescaled alpha

The loads become the loader partition's TMA copies, `tile.scores` and `tile.accumulate` the
consumer's `warpgroup_mma`s; everything between them (masks, ALiBi, maps such as soft-capping,
scales) and the online-softmax step are printed by the portable target's own op printers into
one `@gluon.jit` step function per key loop, so a block's meaning is still printed in one place.
Consecutive key loops (full blocks, then masked ones) become one pipelined range whose steps
pick their loop's function by the block's start.

A kernel outside that shape (a rotation in the kernel, a bias tile, a document mask, a pointwise
normalizer, backward and decode kernels) is refused with `GluonUnsupported`, naming the op: the
runtime then runs the portable kernel (`runtime/gluon_forward.py`).

Launch ABI: `q_desc, k_desc, v_desc, o_desc` (TMA descriptors over the rows of `[B*H*N, D]`
views), then every other role's pointer and strides as the portable target passes them
(`lse`, `slopes`), then `sm_scale, n_q, n_k, num_heads, group_size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.utils.target import Target

from attnfuse.dialects import tile
from attnfuse.errors import AttnFuseError, IRError
from attnfuse.lowering.triton import HELPERS, KernelEmitter, LoopRows

SCORE_OPS = (tile.MaskOp, tile.MapOp, tile.AlibiOp, tile.ApplyScaleOp)
"""Ops between `tile.scores` and `tile.softmax_update` that this target prints (elementwise on
the score tile)."""

DESCRIPTOR_ROLES = ("q", "q_rot", "k", "k_rot", "v", "o")
"""Roles a kernel may read or write through TMA descriptors (a pre-rotated copy in place of q
or k); every other role is a pointer with strides."""

HEAD_DIMS = (64, 128)
"""Head dims with a schedule: a [128, D] query tile and two [128, D] K and V stages fit in
shared memory, and D is a whole number of `warpgroup_mma` steps."""

BLOCK_M = 128
BLOCK_N = 128
STAGES = 2
NUM_WARPS = 8
MAX_REGISTERS = 168
"""Per-thread register cap of the whole kernel: with 8 consumer warps and a 4-warp loader group
at 24 registers, the consumers get 240 (the H200's 64K registers, one program per SM)."""


class GluonUnsupported(IRError):
    """A kernel this target does not lower (the portable target prints every kernel); `op` is
    the op at fault, or the kernel."""


@dataclass
class FlashLoop:
    """One key loop of a flash-shaped forward kernel, split into what each partition runs."""

    op: tile.KVLoopOp
    k_load: tile.LoadOp
    scores: tile.ScoresOp
    score_ops: list[Operation]
    v_load: tile.LoadOp
    update: tile.SoftmaxUpdateOp
    accumulate: tile.AccumulateOp


def _refuse(kernel: tile.KernelOp, op: Operation | None, why: str) -> GluonUnsupported:
    where = f" ({op.name})" if op is not None else ""
    return GluonUnsupported(f"the gluon target cannot lower {kernel.sym_name.data}{where}: {why}",
                            op if op is not None else kernel)


def flash_loop(kernel: tile.KernelOp, loop: tile.KVLoopOp) -> FlashLoop:
    """The parts of one key loop, or `GluonUnsupported` if it is not flash-shaped."""
    ops = list(loop.body.block.ops)
    it = iter(ops)

    def take(kind: type[Operation], what: str) -> Operation:
        op = next(it, None)
        if not isinstance(op, kind):
            raise _refuse(kernel, op, f"expected {what} here in the key loop")
        return op

    k_load = take(tile.LoadOp, "the load of k")
    if k_load.role not in ("k", "k_rot") or k_load.cols is None or k_load.cols.data != "all":
        raise _refuse(kernel, k_load, "keys must be loaded whole (no rotation in the kernel)")
    scores = take(tile.ScoresOp, "tile.scores")
    if len(scores.queries) != 1 or scores.keys[0] is not k_load.result:
        raise _refuse(kernel, scores, "one q @ k^T product of the loaded tiles")
    score_ops: list[Operation] = []
    op = next(it, None)
    while isinstance(op, SCORE_OPS):
        score_ops.append(op)
        op = next(it, None)
    if not isinstance(op, tile.LoadOp) or op.role != "v":
        raise _refuse(kernel, op, "score ops are masks, maps, ALiBi and scales, then the load of v")
    v_load = op
    update = take(tile.SoftmaxUpdateOp, "tile.softmax_update")
    accumulate = take(tile.AccumulateOp, "tile.accumulate")
    if accumulate.value is not v_load.result or accumulate.probs is not update.probs or accumulate.alpha is None:
        raise _refuse(kernel, accumulate, "acc * alpha + p @ v of the softmax step's p")
    take(tile.YieldOp, "tile.yield")
    return FlashLoop(loop, k_load, scores, score_ops, v_load, update, accumulate)


class GluonEmitter(KernelEmitter):
    """Prints one flash-shaped forward kernel as a loader partition, a consumer partition, one
    score-step function per key loop and the entry kernel."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check()

    def check(self) -> None:
        """Refuses what the schedule does not cover (`GluonUnsupported`)."""
        k = self.kernel
        name = k.sym_name.data
        if self.grid != "query_blocks" or name != "attention_fwd":
            raise _refuse(k, None, "only the forward kernel (query_blocks grid) has a Gluon schedule")
        if self.elem not in ("f16", "bf16"):
            raise _refuse(k, None, f"element type {self.elem}: the products take f16 or bf16")
        if self.head_dim not in HEAD_DIMS or self.head_dim_v != self.head_dim:
            raise _refuse(k, None, f"head dim {self.head_dim}/{self.head_dim_v}: scheduled for {HEAD_DIMS}")
        ops = list(k.body.block.ops)
        first = ops[0]
        if isinstance(first, tile.LoadOp) and (first.cols is None or first.cols.data != "all"):
            raise _refuse(k, first, "the query must be loaded whole (no rotation in the kernel)")
        # q load, softmax init, key bounds, the key loops, finalize, the o and lse stores.
        shape = [tile.LoadOp, tile.SoftmaxInitOp, tile.KVBoundsOp]
        tail = [tile.SoftmaxFinalizeOp, tile.StoreOp, tile.StoreOp, tile.ReturnOp]
        expected = shape + [tile.KVLoopOp] * (len(ops) - len(shape) - len(tail)) + tail
        for op, kind in zip(ops, expected):
            if not isinstance(op, kind):
                raise _refuse(k, op, "expected q load, softmax init, key bounds, key loops, finalize, stores")
        if len(ops) < len(shape) + len(tail):
            raise _refuse(k, None, "expected q load, softmax init, key bounds, key loops, finalize, stores")
        self.q_load, self.init, self.bounds = ops[0], ops[1], ops[2]
        if self.q_load.role not in ("q", "q_rot") or self.q_load.cols is None or self.q_load.cols.data != "all":
            raise _refuse(k, self.q_load, "the query must be loaded whole (no rotation in the kernel)")
        self.loops = [flash_loop(k, op) for op in ops[3:-4]]
        if not self.loops:
            raise _refuse(k, None, "no key loop")
        # The loops must cover one range in order, each carrying the previous one's state.
        carried = list(self.init.results)
        for loop in self.loops:
            if list(loop.op.inits) != carried:
                raise _refuse(k, loop.op, "key loops must chain their accumulator and row statistics")
            carried = list(loop.op.results)
        for before, after in zip(self.loops, self.loops[1:]):
            if after.op.lower is not before.op.upper:
                raise _refuse(k, after.op, "key loops must cover consecutive ranges")
        self.finalize = ops[-4]
        if list(self.finalize.operands) != carried:
            raise _refuse(k, self.finalize, "finalize must read the last loop's state")
        self.o_store, self.lse_store = ops[-3], ops[-2]
        if self.o_store.role != "o" or self.lse_store.role != "lse":
            raise _refuse(k, self.o_store, "stores of o and lse")
        for role in self.roles:
            if role not in DESCRIPTOR_ROLES and role != "lse" and tile.role_kind(role) != "slopes":
                raise _refuse(k, None, f"role {role} has no place in the schedule")

    # -- printing ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.kernel.sym_name.data

    @property
    def operands(self) -> tuple[str, str, str, str]:
        """The roles of the four descriptors, in the entry's order (q, k, v, o)."""
        first = self.loops[0]
        return (self.q_load.role, first.k_load.role, first.v_load.role, self.o_store.role)

    def pointer_roles(self) -> list[str]:
        return [role for role in self.roles if role not in self.operands]

    def run(self) -> list[str]:
        out: list[str] = []
        for i, loop in enumerate(self.loops):
            out += self.step_function(i, loop) + ["", ""]
        out += self.loader() + ["", ""]
        out += self.consumer() + ["", ""]
        out += self.entry()
        return out

    def function(self, header: str, body: list[str]) -> list[str]:
        return ["@gluon.jit", header] + body

    def slope_params(self) -> list[str]:
        return [self.slope_name(role) for role in self.slope_roles()]

    def step_function(self, index: int, loop: FlashLoop) -> list[str]:
        """`<name>_step_<index>(scores, row_max, row_sum, start_n, ...)`: the score ops and the
        online-softmax step of one key loop's body, on the raw q @ k^T tile."""
        self.lines, self.indent = [], 1
        masked = loop.op.masked is not None
        self.emit(f"# tile.kv_loop {index} over {'partial key blocks: masked' if masked else 'full key blocks'}")
        self.emit("rows = block_id * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_LAYOUT))")
        self.emit("row_in_bounds = rows < n_q")
        self.emit("q_pos = rows + (n_k - n_q)  # bottom-right aligned: the last query sits at the last key")
        self.emit("keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))")
        if masked:
            self.emit("key_in_bounds = keys < n_k")
        block = loop.op.body.block
        for arg, name in zip(block.args, ("acc", "row_max", "row_sum")):
            self.namer.alias(arg, name)
        for init, name in zip(loop.op.inits, ("acc", "row_max", "row_sum")):
            self.namer.alias(init, name)
        self.namer.alias(loop.scores.result, "scores")
        self.emit_score_scale("scores", loop.scores)
        self.loop_vars.append(LoopRows("keys", "key_in_bounds" if masked else "", "keys"))
        for op in [*loop.score_ops, loop.update]:
            self.HANDLERS[type(op)](self, op)
        self.loop_vars.pop()
        u = loop.update
        self.emit(f"return {self.namer[u.probs]}, {self.namer[u.alpha]}, "
                  f"{self.namer[u.new_row_max]}, {self.namer[u.new_row_sum]}")
        params = ["scores", "row_max", "row_sum", "start_n", "block_id", "sm_scale", "n_q", "n_k",
                  *self.slope_params(), "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr",
                  "S_LAYOUT: gl.constexpr"]
        return self.function(f"def {self.name}_step_{index}({', '.join(params)}):", self.lines)

    def emit_score_scale(self, name: str, op: tile.ScoresOp) -> None:
        """The scale `tile.scores` applies to its product (none when folded into the exponential)."""
        self.emit("# tile.scores: q @ k^T came from warpgroup_mma (fp32)")
        super().emit_score_scale(name, op)

    def loader(self) -> list[str]:
        body = [
            "    # The producer: one warp issuing TMA copies. Barriers start as if phase 1 had",
            "    # completed, so the first round of waits on the empty barriers passes.",
            "    mbarrier.expect(q_bar, q_desc.block_type.nbytes)",
            "    tma_load(q_desc, [q_row, 0], q_bar, q_smem)",
            "    for j in range(n_blocks):",
            "        stage = j % STAGES",
            "        phase = (j // STAGES) & 1",
            "        start_n = kv_start + j * BLOCK_N",
            "        mbarrier.wait(k_empty.index(stage), phase ^ 1)",
            "        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)",
            "        tma_load(k_desc, [kv_row + start_n, 0], k_ready.index(stage), k_bufs.index(stage))",
            "        mbarrier.wait(v_empty.index(stage), phase ^ 1)",
            "        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)",
            "        tma_load(v_desc, [kv_row + start_n, 0], v_ready.index(stage), v_bufs.index(stage))",
        ]
        params = "q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, q_row, kv_row, kv_start, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr"
        return self.function(f"def {self.name}_load({params}):", body)

    def step_call(self, indent: str) -> list[str]:
        """The step of the block at `start_n`: the function of the key loop that holds it."""
        args = ", ".join(["scores", "row_max", "row_sum", "start_n", "block_id", "sm_scale", "n_q", "n_k",
                          *self.slope_params(), "BLOCK_M", "BLOCK_N", "S_LAYOUT"])
        call = "probs, alpha, row_max, row_sum = {}_step_{}(" + args + ")"
        if len(self.loops) == 1:
            return [indent + call.format(self.name, 0)]
        lines = []
        for i in range(len(self.loops)):
            if i < len(self.loops) - 1:
                keyword = "if" if i == 0 else "elif"
                lines.append(f"{indent}{keyword} start_n < bound_{i + 1}:")
            else:
                lines.append(f"{indent}else:")
            lines.append(f"{indent}    " + call.format(self.name, i))
        return lines

    def consumer(self) -> list[str]:
        b = [
            "    # The consumers: two warpgroups on BLOCK_M rows. Step j issues S_j = q @ k_j^T, then",
            "    # P_{j-1} @ v_{j-1}, waits for S_j alone and runs its score step while the tensor",
            "    # cores finish P_{j-1} @ v_{j-1}.",
            "    dtype: gl.constexpr = q_smem.dtype",
            "    row_max = gl.full([BLOCK_M], float(\"-inf\"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))",
            "    row_sum = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))",
            "    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=O_LAYOUT)",
            "    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_LAYOUT)",
            "    probs = s_zero",
            "    alpha = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))",
            "    if n_blocks > 0:",
            "        mbarrier.wait(q_bar, 0)",
            "        start_n = kv_start",
            "        mbarrier.wait(k_ready.index(0), 0)",
            "        scores = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            "        scores = warpgroup_mma_wait(0, deps=(scores,))",
            "        mbarrier.arrive(k_empty.index(0), count=1)",
            *self.step_call("        "),
            "    for j in range(1, n_blocks):",
            "        stage = j % STAGES",
            "        phase = (j // STAGES) & 1",
            "        prev = (j - 1) % STAGES",
            "        prev_phase = ((j - 1) // STAGES) & 1",
            "        start_n = kv_start + j * BLOCK_N",
            "        mbarrier.wait(k_ready.index(stage), phase)",
            "        scores = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            "        # tile.accumulate of block j-1: acc * alpha + p @ v",
            "        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]",
            "        mbarrier.wait(v_ready.index(prev), prev_phase)",
            "        p_op = gl.convert_layout(probs.to(dtype), P_LAYOUT)",
            "        acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)",
            "        # Groups complete in issue order: one outstanding means S_j is done.",
            "        scores = warpgroup_mma_wait(1, deps=(scores,))",
            "        mbarrier.arrive(k_empty.index(stage), count=1)",
            *self.step_call("        "),
            "        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))",
            "        mbarrier.arrive(v_empty.index(prev), count=1)",
            "    if n_blocks > 0:",
            "        last = (n_blocks - 1) % STAGES",
            "        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]",
            "        mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // STAGES) & 1)",
            "        p_op = gl.convert_layout(probs.to(dtype), P_LAYOUT)",
            "        acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)",
            "        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))",
            "        mbarrier.arrive(v_empty.index(last), count=1)",
            "    return acc, gl.convert_layout(row_max, gl.SliceLayout(1, O_LAYOUT)), gl.convert_layout(row_sum, gl.SliceLayout(1, O_LAYOUT))",
        ]
        bounds = [f"bound_{i}" for i in range(1, len(self.loops))]
        params = ["q_smem", "k_bufs", "v_bufs", "q_bar", "k_ready", "k_empty", "v_ready", "v_empty",
                  "kv_start", "n_blocks", *bounds, "block_id", "sm_scale", "n_q", "n_k", *self.slope_params(),
                  "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr", "HEAD_DIM: gl.constexpr",
                  "STAGES: gl.constexpr", "S_LAYOUT: gl.constexpr", "O_LAYOUT: gl.constexpr",
                  "P_LAYOUT: gl.constexpr"]
        return self.function(f"def {self.name}_consume({', '.join(params)}):", b)

    def entry(self) -> list[str]:
        self.lines, self.indent = [], 1
        self.emit("dtype: gl.constexpr = q_desc.dtype")
        self.emit("S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])")
        self.emit("O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])")
        self.emit("P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)")
        self.emit("# Program grid (one program per block of BLOCK_M query rows of one (batch, head)).")
        self.emit("block_id = tl.num_programs(1) - 1 - tl.program_id(1)" if self.kernel.block_order == tile.BlockOrder.DESCENDING
                  else "block_id = tl.program_id(1)")
        self.emit("batch_head = tl.program_id(0)")
        self.emit("batch = batch_head // num_heads")
        self.emit("head = batch_head % num_heads")
        self.emit("kv_head = head // group_size  # GQA/MQA: query heads share a key/value head")
        self.emit("# Rows of the [B*H*N, D] views the descriptors cover.")
        self.emit("q_row = batch_head * n_q + block_id * BLOCK_M")
        self.emit("kv_row = (batch * (num_heads // group_size) + kv_head) * n_k")
        self.emit_slope_loads()
        self.emit_kv_bounds(self.bounds)
        kv_start = self.namer[self.loops[0].op.lower]
        kv_end = self.namer[self.loops[-1].op.upper]
        self.emit(f"n_blocks = ({kv_end} - {kv_start} + BLOCK_N - 1) // BLOCK_N")
        self.emit("q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)")
        self.emit("k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)")
        self.emit("v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)")
        self.emit("q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())")
        for bar in ("k_ready", "k_empty", "v_ready", "v_empty"):
            self.emit(f"{bar} = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())")
        self.emit("mbarrier.init(q_bar, count=1)")
        self.emit("for i in gl.static_range(STAGES):")
        for bar in ("k_ready", "k_empty", "v_ready", "v_empty"):
            self.emit(f"    mbarrier.init({bar}.index(i), count=1)")
        bounds = [self.namer[loop.op.lower] for loop in self.loops[1:]]
        consume_args = ", ".join(["q_smem", "k_bufs", "v_bufs", "q_bar", "k_ready", "k_empty", "v_ready", "v_empty",
                                  kv_start, "n_blocks", *bounds, "block_id", "sm_scale", "n_q", "n_k",
                                  *self.slope_params(), "BLOCK_M", "BLOCK_N", "HEAD_DIM", "STAGES",
                                  "S_LAYOUT", "O_LAYOUT", "P_LAYOUT"])
        load_args = ("q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, "
                     f"v_empty, q_row, kv_row, {kv_start}, n_blocks, BLOCK_N, STAGES")
        acc, row_max, row_sum = (self.namer.define(v) for v in self.finalize.operands)
        self.emit(f"{acc}, {row_max}, {row_sum} = gl.warp_specialize([")
        self.emit(f"    ({self.name}_consume, ({consume_args})),")
        self.emit(f"    ({self.name}_load, ({load_args})),")
        self.emit("], [1], [24])")
        self.emit("rows = block_id * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, O_LAYOUT))")
        self.emit("row_in_bounds = rows < n_q")
        self.emit_softmax_finalize(self.finalize)
        self.emit("# tile.store: lse rows (program)")
        self.emit(f"tl.store(lse_ptr + batch * stride_lse_b + head * stride_lse_h + rows * stride_lse_n, "
                  f"{self.namer[self.lse_store.value]}, mask=row_in_bounds)")
        self.emit("# tile.store: o rows (program), through shared memory (q's buffer) and a TMA store")
        self.emit(f"q_smem.store({self.namer[self.o_store.value]}.to(dtype))")
        self.emit("fence_async_shared()")
        self.emit("tma_store(o_desc, [q_row, 0], q_smem)")
        self.emit("tma.store_wait(0)")
        params = ["q_desc", "k_desc", "v_desc", "o_desc"]
        for role in self.pointer_roles():
            params.append(", ".join([f"{role}_ptr", *self.strides(role)]))
        params += ["sm_scale", "n_q", "n_k", "num_heads", "group_size",
                   f"BLOCK_M: gl.constexpr = {BLOCK_M}", f"BLOCK_N: gl.constexpr = {BLOCK_N}",
                   f"HEAD_DIM: gl.constexpr = {self.head_dim}", f"STAGES: gl.constexpr = {STAGES}",
                   "num_warps: gl.constexpr = 8"]
        header = [f"def {self.name}(", *[f"    {p}," for p in params], "):"]
        return ["@gluon.jit", *header, *self.lines]


HEADER = '''"""Generated by AttnFuse from tile IR for Hopper (the Gluon target). Do not edit."""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

# The TMA copies are tma.async_load / async_store from Triton 3.7 on, async_copy_* before.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
'''


@dataclass(frozen=True)
class GluonKernel:
    """How to launch one Gluon kernel (`runtime/gluon_forward.py`)."""

    name: str
    roles: tuple[str, ...]
    operands: tuple[str, str, str, str]
    """The roles behind `q_desc, k_desc, v_desc, o_desc`."""
    block_m: int = BLOCK_M
    block_n: int = BLOCK_N
    num_warps: int = NUM_WARPS
    max_registers: int = MAX_REGISTERS


@dataclass(frozen=True)
class GluonProgram:
    """A generated Gluon module: its source and its kernels."""

    source: str
    kernels: tuple[GluonKernel, ...]


def emit_gluon_kernel(kernel: tile.KernelOp) -> GluonProgram:
    """The Gluon module of one flash-shaped forward kernel, or `GluonUnsupported`."""
    emitter = GluonEmitter(kernel)
    body = "\n".join(emitter.run())
    helpers = "".join("\n\n" + HELPERS[name].replace("@triton.jit", "@gluon.jit") for name in sorted(emitter.helpers))
    source = HEADER + helpers + "\n\n" + body + "\n"
    return GluonProgram(source, (GluonKernel(kernel.sym_name.data, tuple(kernel.roles), emitter.operands),))


def emit_gluon_module(module: ModuleOp) -> GluonProgram:
    """The Gluon module of the forward kernel in `module` (every other kernel is refused)."""
    kernels = [op for op in module.ops if isinstance(op, tile.KernelOp)]
    if not kernels:
        raise AttnFuseError("no tile.kernel to print: run lower-to-tile first")
    for kernel in kernels:
        if kernel.sym_name.data != "attention_fwd":
            raise _refuse(kernel, None, "only forward kernels have a Gluon schedule (lower with backward=false)")
    return emit_gluon_kernel(kernels[0])


@dataclass(frozen=True)
class GluonTarget(Target):
    """`-t gluon`: print the module's forward kernel as a warp-specialized Hopper kernel."""

    name = "gluon"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(emit_gluon_module(module).source)


__all__ = ["GluonTarget", "GluonUnsupported", "emit_gluon_kernel", "emit_gluon_module"]
