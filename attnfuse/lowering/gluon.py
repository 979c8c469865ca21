"""The Gluon target: warp-specialized forward kernels for Hopper (`-t gluon`).

The portable target (`lowering/triton/`) prints each tile op as `tl` code and leaves the
schedule to Triton. On Hopper the fast schedule is one `tl` cannot say: a producer warp that only
issues TMA copies into a ring of shared-memory buffers, consumer warpgroups that run the
products with `warpgroup_mma` (P from registers) and overlap the score step of one key block
with the P @ V product of the previous one. `warp-specialize` (transforms/warp_specialize.py)
decides which kernels get that schedule and its tile sizes (`#tile<schedule warp_specialized>`);
this target prints them in Gluon (`triton.experimental.gluon`):

- the loads of q, k and v become the producer partition's TMA copies (`<kernel>_load`);
- `tile.scores` and `tile.accumulate` become the consumers' warpgroup MMAs (`<kernel>_consume`);
- the score ops between them (masks, ALiBi, an additive bias, maps such as soft-capping,
  scales, and the index tiles a position-aware map reads, `tile.pair_position` and
  `tile.query_head`, in the score tile's layout) and the online-softmax step (or a pointwise
  normalizer's weights: ReLU, sigmoid) are printed by the portable target's own op printers
  (a bias's block loaded beforehand by `<kernel>_bias`, from its pointer and strides) into one
  `@gluon.jit` step function (`<kernel>_step`), so a block's meaning is still printed in one
  place. The consecutive key loops (full blocks, then masked ones; masked, full, masked under a
  sliding window) are one pipelined range: the step prints what the loops share once and runs
  a loop's masks under a runtime test of the block's start against the loops' bounds (one
  function per loop, chosen at the call site, put two softmax steps into every consumer, and
  three consumers' 160 registers spilled);
- finalize as the portable target prints it (a pointwise normalizer has none: its
  accumulator is o, and the consumer neither rescales it nor keeps row statistics); o leaves
  through shared memory and a TMA store.

A kernel without the schedule is refused (`GluonUnsupported`, naming why `warp-specialize` left
it alone): the runtime then runs the portable kernel (`runtime/gluon_forward.py`).

Launch ABI: `q_desc, k_desc, v_desc, o_desc` (4-D TMA descriptors over the `[B, H, N, D]`
tensors of the roles `FlashKernel.operands` names, with their strides and `[1, 1, rows, D]`
blocks, so a block past a sequence's end is zero-filled on loads and clipped on stores), then every other role's pointer and strides
as the portable target passes them (`lse` under the softmax, `slopes`, `bias`), then `sm_scale, n_q, n_k, num_heads,
group_size`; launched with 4 warps (the first consumer, the default partition), the other
consumers and the producer being worker partitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
from xdsl.utils.target import Target

from attnfuse.dialects import tile
from attnfuse.errors import AttnFuseError, IRError
from attnfuse.lowering.gluon_steps import BiasBlocks, GluonFunctions, MaskedLoopSteps
from attnfuse.lowering.triton import HELPERS, LN2, KernelEmitter, LoopRows
from attnfuse.dialects.flash_shape import INDEX_OPS, FlashLoop, NotFlashShaped, flash_kernel

class GluonUnsupported(IRError):
    """A kernel this target does not print (the portable target prints every kernel); `op` is
    the op at fault, or the kernel."""


class GluonEmitter(BiasBlocks, GluonFunctions, MaskedLoopSteps, KernelEmitter):
    """Prints one flash-shaped forward kernel as a loader partition, a consumer partition, the
    score-step function and the entry kernel."""

    PRINTED_NAMES = ("O_LAYOUT", "P_LAYOUT", "S_LAYOUT", "always", "block", "c", "c_last", "dtype", "first", "i",
                     "j", "k_bufs", "k_empty", "k_ready", "kv_count", "last", "n_blocks", "n_row_blocks", "n_tiles",
                     "o_bufs", "o_smem", "o_tile", "p_next", "p_op", "phase", "prev", "prev_phase",
                     "q_bars", "q_bufs", "q_count", "q_empty", "q_smem", "q_start", "q_tile", "row_start", "s_zero",
                     "stage", "t", "v_bufs", "v_empty", "v_ready", "w", "batch_heads",
                     # Read only: the Gluon module's names, the entry's compile-time parameters.
                     "gl", "gluon", "tma", "mbarrier", "warpgroup_mma", "warpgroup_mma_wait", "fence_async_shared",
                     "tile_2d", "tma_load", "tma_store", "CONSUMERS", "ROWS", "STAGES", "WG", "q_desc", "k_desc", "v_desc", "o_desc")
    """Names the printed partitions and their persistent form write or read themselves,
    besides `{role}_tile`, `{role}_desc`, the kernel's functions `<kernel>_<part>`,
    `bound_<i>`, `count_<i>` and, under a pointwise normalizer, `probs`: the ops' results take
    others."""
    FUNCTION_PARTS = ("step", "consume", "load", "bias", "block_start", "tile")
    """The kernel's functions besides its entry: `<kernel name>_<part>`."""

    def reserved_names(self) -> set[str]:
        numbered = {f"{prefix}_{i}" for prefix in ("bound", "count") for i in range(8)}
        functions = {f"{self.kernel.sym_name.data}_{part}" for part in self.FUNCTION_PARTS}
        per_role = {f"{role}_{suffix}" for role in self.roles for suffix in ("tile", "desc")}
        return super().reserved_names() | set(self.PRINTED_NAMES) | per_role | numbered | functions

    BIAS_BLOCK = ("start_n", "row_start", "ROWS")
    BIAS_HEADER = ("rows = row_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))",
                   "row_in_bounds = rows < n_q",
                   "keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))",
                   "key_in_bounds = keys < n_k")
    BIAS_LOOP_ROWS = LoopRows("keys", "key_in_bounds", "keys")

    def __post_init__(self) -> None:
        super().__post_init__()
        k = self.kernel
        if k.schedule != tile.Schedule.WARP_SPECIALIZED:
            try:
                flash_kernel(k)
                why = "run warp-specialize first"
            except NotFlashShaped as err:
                raise GluonUnsupported(f"the gluon target cannot lower {err}", err.op) from err
            raise GluonUnsupported(f"the gluon target prints warp-specialized kernels: {k.sym_name.data} has no "
                                   f"#tile<schedule warp_specialized> ({why})", k)
        parts = flash_kernel(k)
        self.parts = parts
        if not self.softmax:
            # The consumer names a pointwise step's weights `probs`; under the softmax it is
            # the step's own name for its probabilities, which the namer hands out.
            self.namer.taken.add("probs")
        self.q_load, self.init, self.bounds = parts.q_load, parts.init, parts.bounds
        self.loops, self.finalize = parts.loops, parts.finalize
        self.o_store, self.lse_store = parts.o_store, parts.lse_store

    # -- printing ----------------------------------------------------------------------------

    def run(self) -> list[str]:
        out: list[str] = self.bias_function() + self.block_start_function()
        out += self.step_function() + ["", ""]
        out += self.loader() + ["", ""]
        out += self.consumer() + ["", ""]
        out += self.entry()
        return out

    @property
    def consumers(self) -> int:
        """Consumer partitions: one warpgroup (4 warps, 16 rows per warp) each."""
        return self.kernel.get("num_warps") // 4

    @property
    def softmax(self) -> bool:
        """Whether the kernel runs the online softmax (else a pointwise normalizer, whose step
        carries no row statistics and whose accumulator is never rescaled)."""
        return self.parts.softmax

    def step_params(self) -> list[str]:
        bounds = self.bound_params()
        state = ["row_max", "row_sum"] if self.softmax else []
        step = ["step"] if self.listed else []
        # The tile's query head, where a block maps with it (`tile.query_head`).
        head = ["head"] if any(isinstance(op, tile.QueryHeadOp) for loop in self.loops for op in loop.score_ops) else []
        return ["scores", *state, "start_n", *step, "row_start", *bounds, "sm_scale", "n_q", "n_k", *head,
                *self.slope_params(), *self.bias_tiles(), *self.document_params()]

    def emit_index_tile(self, result: SSAValue, index: str) -> None:
        """`result`, an f32 tile of `index` in the score tile's layout (the step's `rows`, `q_pos`
        and `keys` are its slices; `head` is the tile's)."""
        self.emit(f"{self.namer.define(result)} = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT) + {index}")

    # -- block lists -------------------------------------------------------------------------

    def list_roles(self) -> list[str]:
        """The block lists the loops walk, in order."""
        return [loop.op.blocks.type.role.data for loop in self.loops]  # type: ignore[union-attr]

    def list_args(self, strides: bool = True) -> list[str]:
        """Each list's base for this tile and (with `strides`) its entries' stride, then the first
        list's count (`bound_1`, where there are two): what `<kernel>_block_start` reads."""
        return [name for role in self.list_roles()
                for name in (f"{role}_base", *([f"stride_{role}_d"] if strides else []))] + self.bound_params()

    def walk_params(self, strides: bool) -> list[str]:
        """What a partition needs to find each step's key block: the key range's start, or the
        lists (`list_args`; without their strides for the consumer, which has them among its
        pointer parameters)."""
        return self.list_args(strides) if self.listed else ["kv_start"]

    def block_start(self, step: str) -> str:
        """The first key of step `step`'s block."""
        if not self.listed:
            return "kv_start" if step == "0" else f"kv_start + {step} * BLOCK_N"
        return f"{self.name}_block_start({', '.join([step, *self.list_args(), 'BLOCK_N'])})"

    def block_start_function(self) -> list[str]:
        """`<name>_block_start(j, lists..., BLOCK_N)`: the first key of step j's block, from the
        full blocks' list for its first `bound_1` steps, then from the partial blocks'
        (`tile.sparse_kv_loop`: entries are block indices in units of BLOCK_N)."""
        if not self.listed:
            return []
        roles = self.list_roles()
        body = ["# tile.sparse_kv_loop: the step's entry of its list (one pipelined range over the lists)"]
        if len(roles) == 1:
            body.append(f"block = tl.load({roles[0]}_base + j * stride_{roles[0]}_d)")
        else:
            first, second = roles
            body += [f"if j < bound_1:",
                     f"    block = tl.load({first}_base + j * stride_{first}_d)",
                     "else:",
                     f"    block = tl.load({second}_base + (j - bound_1) * stride_{second}_d)"]
        body.append("return block * BLOCK_N")
        params = ["j", *self.list_args(), "BLOCK_N: gl.constexpr"]
        return self.function(f"def {self.name}_block_start({', '.join(params)}):",
                             ["    " + line for line in body]) + ["", ""]

    def step_results(self) -> list[str]:
        """What a step returns (and its call site assigns), in order."""
        return ["probs", "alpha", "row_max", "row_sum"] if self.softmax else ["probs"]

    @property
    def accumulate_formula(self) -> str:
        return "acc * alpha + p @ v" if self.softmax else "acc + p @ v"

    def rescale(self, indent: str) -> list[str]:
        """`acc *= alpha` before the product of the previous block (nothing for a pointwise
        normalizer, whose accumulator is a plain sum)."""
        if not self.softmax:
            return []
        return [f"{indent}acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]"]

    def state_init(self, indent: str) -> list[str]:
        """The online softmax's row statistics before the first block (none for a pointwise
        normalizer)."""
        if not self.softmax:
            return []
        return [f"{indent}row_max = gl.full([ROWS], {self.softmax_floor!r}, gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))  # the softmax's floor",
                f"{indent}row_sum = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))",
                f"{indent}alpha = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))"]

    def state_to_output_layout(self, indent: str) -> list[str]:
        """The row statistics in the accumulator's row layout, for finalize."""
        if not self.softmax:
            return []
        return [f"{indent}row_max = gl.convert_layout(row_max, gl.SliceLayout(1, O_LAYOUT))",
                f"{indent}row_sum = gl.convert_layout(row_sum, gl.SliceLayout(1, O_LAYOUT))"]

    def emit_finalize(self) -> None:
        """finalize and the lse store as the portable target prints them; under a pointwise
        normalizer the last loop's accumulator is o (nothing to print)."""
        if not self.softmax:
            self.namer.alias(self.o_store.value, "acc")
            return
        for value, name in zip(self.finalize.operands, ("acc", "row_max", "row_sum")):
            self.namer.alias(value, name)
        self.emit_softmax_finalize(self.finalize)
        self.emit("# tile.store: lse rows (program)")
        self.emit(f"tl.store(lse_ptr + batch * stride_lse_b + head * stride_lse_h + rows * stride_lse_n, "
                  f"{self.namer[self.lse_store.value]}, mask=row_in_bounds)")

    def loop_pieces(self, loop: FlashLoop) -> list[tuple[bool, list[str]]]:
        """One key loop's score ops, op by op, then its normalizer (the softmax step, or a
        pointwise normalizer's ops) as one piece, as printed by the portable handlers: (is a
        mask, its lines at indent 0). Every score op's result is the variable `scores` (each
        refines the previous tile in place), so that the pieces of different loops read and
        write the same names."""
        block = loop.op.body.block
        for arg, init, name in zip(block.args, loop.op.inits, ("acc", "row_max", "row_sum")):
            self.namer.alias(arg, name)
            self.namer.alias(init, name)
        self.namer.alias(loop.scores.result, "scores")
        pieces: list[tuple[bool, list[str]]] = []
        self.lines, self.indent = [], 0
        self.emit_score_scale("scores", loop.scores)
        pieces.append((False, self.lines))
        self.loop_vars.append(LoopRows("keys", "key_in_bounds" if loop.op.masked is not None else "", "keys"))
        # The normalizer (the softmax step, or a pointwise normalizer's weights) is the last
        # piece, one for all its ops: what every loop shares after its masks.
        normalizer = [loop.update] if loop.update is not None else loop.weights
        for op in loop.score_ops:
            self.lines = []
            if isinstance(op, INDEX_OPS):
                # An index tile (a position-aware block's map reads it): a tile of its own name.
                self.HANDLERS[type(op)](self, op)
                pieces.append((False, self.lines))
                continue
            self.namer.pin(op.result, "scores")
            self.HANDLERS[type(op)](self, op)
            assert self.namer[op.result] == "scores", f"{op.name} named its result itself"
            pieces.append((isinstance(op, tile.FILTER_OPS), self.lines))
        self.lines = []
        for op in normalizer:
            # A pointwise normalizer's ops refine the tile in place too (`tile.seq_len` gives a scalar).
            refines = op is not loop.update and not isinstance(op, tile.SeqLenOp)
            if refines:
                self.namer.pin(op.result, "scores")
            self.HANDLERS[type(op)](self, op)
        pieces.append((False, self.lines))
        self.loop_vars.pop()
        return pieces

    def step_function(self) -> list[str]:
        """`<name>_step(scores, row_max, row_sum, start_n, row_start, bound_1.., ...)` (without the
        row statistics under a pointwise normalizer; with the block's bias tiles after the
        slopes): the score ops and the online-softmax step (or the weights) of the block at
        `start_n`, on one consumer's raw
        q @ k^T tile (its ROWS query rows from `row_start`). One function for every key loop:
        the ops the loops share are printed once and a loop's own masks run under a runtime
        test of the block's start. (One inlined function per loop, chosen at the call site,
        doubled the softmax step in the consumer, and three consumers' 160 registers spilled.)"""
        per_loop = self.pieces_per_loop(self.loop_pieces)
        body = [
            "# The block's key loop decides its masks: " + "; ".join(
                f"loop {i} over {'partial key blocks: masked' if loop.op.masked is not None else 'full key blocks'}"
                for i, loop in enumerate(self.loops)),
            "rows = row_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))",
            "row_in_bounds = rows < n_q",
            "q_pos = rows + (n_k - n_q)  # bottom-right aligned: the last query sits at the last key",
            "keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))",
        ]
        if any(loop.op.masked is not None for loop in self.loops):
            body.append("key_in_bounds = keys < n_k")
        if self.same_skeleton(per_loop):
            body += self.merged_steps(per_loop)
        else:
            body += self.branched_steps(per_loop)
        u = self.loops[0].update
        if self.softmax:
            body.append(f"return {self.namer[u.probs]}, {self.namer[u.alpha]}, "
                        f"{self.namer[u.new_row_max]}, {self.namer[u.new_row_sum]}")
        else:
            body.append("return scores  # the weights (each normalizer op refined the tile in place)")
        params = [*self.step_params(), "ROWS: gl.constexpr", "BLOCK_N: gl.constexpr", "S_LAYOUT: gl.constexpr"]
        return self.function(f"def {self.name}_step({', '.join(params)}):", ["    " + line if line else ""
                                                                              for line in body])

    def branched_steps(self, per_loop: list[list[tuple[bool, list[str]]]]) -> list[str]:
        """Loops whose score ops differ beyond masks: each loop's score ops under its own test,
        then the normalizer they share."""
        updates = [pieces[-1][1] for pieces in per_loop]
        if any(u != updates[0] for u in updates):
            raise GluonUnsupported("the gluon target cannot lower key loops whose normalizers differ",
                                   self.loops[-1].update or self.loops[-1].accumulate)
        groups = [([i], [line for _, lines in pieces[:-1] for line in lines]) for i, pieces in enumerate(per_loop)]
        return self.guarded(groups) + updates[0]

    def emit_score_scale(self, name: str, op: tile.ScoresOp) -> None:
        """The scale `tile.scores` applies to its product (none when folded into the exponential)."""
        self.emit("# tile.scores: q @ k^T came from warpgroup_mma (fp32)")
        super().emit_score_scale(name, op)

    def loader(self) -> list[str]:
        body = [
            "    # The producer: TMA copies only. Each consumer's q tile once (the first consumer's",
            "    # before k_0, the others' after it, so the first products start early), then k and v",
            "    # of every block into the ring. Empty barriers start as if phase 1 had completed, so",
            "    # the first round of waits passes; each needs every consumer's release after that.",
            "    # Nothing when the program visits no key block: its consumers then wait on no copy",
            "    # and write zeros through their q buffers, which no copy may still be filling.",
            "    if n_blocks > 0:",
            "        mbarrier.expect(q_bars.index(0), q_desc.block_type.nbytes)",
            "        tma_load(q_desc, [batch, head, q_start, 0], q_bars.index(0), q_bufs.index(0))",
            "    for j in range(n_blocks):",
            "        stage = j % STAGES",
            "        phase = (j // STAGES) & 1",
            f"        start_n = {self.block_start('j')}",
            "        mbarrier.wait(k_empty.index(stage), phase ^ 1)",
            "        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)",
            "        tma_load(k_desc, [batch, kv_head, start_n, 0], k_ready.index(stage), k_bufs.index(stage))",
            "        if j == 0:",
            "            for c in gl.static_range(1, CONSUMERS):",
            "                mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)",
            "                tma_load(q_desc, [batch, head, q_start + c * ROWS, 0], q_bars.index(c), q_bufs.index(c))",
            "        mbarrier.wait(v_empty.index(stage), phase ^ 1)",
            "        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)",
            "        tma_load(v_desc, [batch, kv_head, start_n, 0], v_ready.index(stage), v_bufs.index(stage))",
        ]
        params = ", ".join(["q_desc", "k_desc", "v_desc", "q_bufs", "k_bufs", "v_bufs", "q_bars", "k_ready", "k_empty",
                            "v_ready", "v_empty", "batch", "head", "kv_head", "q_start", *self.walk_params(strides=True),
                            "n_blocks", "CONSUMERS: gl.constexpr", "ROWS: gl.constexpr", "BLOCK_N: gl.constexpr",
                            "STAGES: gl.constexpr"])
        # A static range of 1 is empty (one consumer): the loop then prints nothing.
        return self.function(f"def {self.name}_load({params}):", body)

    def step_call(self, indent: str) -> list[str]:
        """The step of the block at `start_n` (its loop's masks are the step's to choose)."""
        args = ", ".join([*self.step_params(), "ROWS", "BLOCK_N", "S_LAYOUT"])
        return [f"{indent}{', '.join(self.step_results())} = {self.name}_step({args})"]

    def consumer(self) -> list[str]:
        """`<name>_consume(..., WG)`: one consumer warpgroup's whole program, its stores
        included (worker partitions return nothing)."""
        self.lines, self.indent = [], 1
        for line in [
            "# One consumer warpgroup on ROWS query rows. Step j issues S_j = q @ k_j^T and then",
            "# P_{j-1} @ v_{j-1}, waits for S_j alone and runs block j's score step while the",
            "# tensor cores finish P_{j-1} @ v_{j-1}; the other consumers do the same on their own",
            "# rows, so one's score step overlaps another's products.",
            "S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])",
            "O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])",
            "P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)",
            "q_smem = q_bufs.index(WG)",
            "q_tile = tile_2d(q_smem)",
            "dtype: gl.constexpr = q_smem.dtype",
            "row_start = q_start + WG * ROWS",
            *self.document_bases(),
            *self.state_init(""),
            "acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=O_LAYOUT)",
            "s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=S_LAYOUT)",
            "if n_blocks > 0:",
            "    mbarrier.wait(q_bars.index(WG), 0)",
            f"    start_n = {self.block_start('0')}",
            *(["    step = 0"] if self.listed else []),
            "    mbarrier.wait(k_ready.index(0), 0)",
            "    scores = warpgroup_mma(q_tile, tile_2d(k_bufs.index(0)).permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            *self.bias_call("    "),
            "    scores = warpgroup_mma_wait(0, deps=(scores,))",
            "    mbarrier.arrive(k_empty.index(0), count=1)",
            *[line[4:] for line in self.step_call("        ")],
            "    # P is carried in 16 bits in the product's operand layout (half the registers of fp32),",
            "    # first defined here: with a zeros tile before the `if`, the loop carried P as 16-bit",
            "    # halves and every step copied its 32 registers after the product's wait (PRMT).",
            "    p_op = gl.convert_layout(probs.to(dtype), P_LAYOUT)",
            "    for j in range(1, n_blocks):",
            "        stage = j % STAGES",
            "        phase = (j // STAGES) & 1",
            "        prev = (j - 1) % STAGES",
            "        prev_phase = ((j - 1) // STAGES) & 1",
            f"        start_n = {self.block_start('j')}",
            *(["        step = j"] if self.listed else []),
            "        # Data first: no consumer issues products while it waits on a copy.",
            "        mbarrier.wait(k_ready.index(stage), phase)",
            "        mbarrier.wait(v_ready.index(prev), prev_phase)",
            f"        # tile.accumulate of block j-1 ({self.accumulate_formula}), issued behind S_j.",
            *self.rescale("        "),
            "        scores = warpgroup_mma(q_tile, tile_2d(k_bufs.index(stage)).permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            "        acc = warpgroup_mma(p_op, tile_2d(v_bufs.index(prev)), acc, is_async=True)",
            *self.bias_call("        "),
            "        # Groups complete in issue order: one outstanding means S_j is done.",
            "        scores = warpgroup_mma_wait(1, deps=(scores,))",
            "        mbarrier.arrive(k_empty.index(stage), count=1)",
            *self.step_call("        "),
            "        p_next = gl.convert_layout(probs.to(dtype), P_LAYOUT)",
            "        # ptxas moves a wgmma wait above the code before it in the same basic block, which",
            "        # would put the score step after the product; a wait on q's barrier (complete long",
            "        # ago, it returns at once) is a block boundary that keeps the order.",
            "        mbarrier.wait(q_bars.index(WG), 0)",
            "        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))",
            "        mbarrier.arrive(v_empty.index(prev), count=1)",
            "        p_op = p_next",
            "    last = (n_blocks - 1) % STAGES",
            "    mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // STAGES) & 1)",
            *self.rescale("    "),
            "    acc = warpgroup_mma(p_op, tile_2d(v_bufs.index(last)), acc, is_async=True)",
            "    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))",
            "    mbarrier.arrive(v_empty.index(last), count=1)",
            *self.state_to_output_layout(""),
            "rows = row_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, O_LAYOUT))",
            "row_in_bounds = rows < n_q",
        ]:
            self.emit(line)
        self.emit_finalize()
        self.emit("# tile.store: o rows (program), through q's buffer (free once S of the last block is")
        self.emit("# done) and a TMA store, which clips at the sequence end: no row past n_q is written.")
        self.emit("if row_start < n_q:")
        self.emit(f"    q_tile.store({self.namer[self.o_store.value]}.to(dtype))")
        self.emit("    fence_async_shared()")
        self.emit("    tma_store(o_desc, [batch, head, row_start, 0], q_smem)")
        self.emit("    tma.store_wait(0)")
        bounds = self.bound_params()
        params = ["o_desc", *self.pointer_params(), "q_bufs", "k_bufs", "v_bufs", "q_bars", "k_ready", "k_empty",
                  "v_ready", "v_empty", "batch", "head", "q_start", *self.walk_params(strides=False), "n_blocks",
                  *([] if self.listed else bounds), "sm_scale",
                  "n_q", "n_k", *self.slope_params(), "WG: gl.constexpr", "ROWS: gl.constexpr",
                  "BLOCK_N: gl.constexpr", "HEAD_DIM: gl.constexpr", "STAGES: gl.constexpr"]
        return self.function(f"def {self.name}_consume({', '.join(params)}):", self.lines)

    def emit_tile_start(self) -> str:
        """From `block_id` and `batch_head` (the grid's, or a persistent program's tile): the
        tile's batch, heads and first query row, its ALiBi slopes, its key bounds and
        `n_blocks`, the key blocks it visits. Returns the name of its first key."""
        self.emit("batch = batch_head // num_heads")
        self.emit("head = batch_head % num_heads")
        self.emit("kv_head = head // group_size  # GQA/MQA: query heads share a key/value head")
        self.emit("q_start = block_id * BLOCK_M")
        self.emit_slope_loads()
        if self.listed:
            return self.emit_list_start()
        self.emit_kv_bounds(self.bounds)
        kv_start = self.namer[self.loops[0].op.lower]
        kv_end = self.namer[self.loops[-1].op.upper]
        self.emit(f"n_blocks = ({kv_end} - {kv_start} + BLOCK_N - 1) // BLOCK_N")
        return kv_start

    def emit_list_start(self) -> str:
        """A block-sparse tile's lists: their bases for this (batch, head, query block), their
        counts, `n_blocks` (the entries of both) and `bound_1` (the first list's count: the
        steps from it on walk the second list). Returns the first list's base."""
        counts = []
        for i, loop in enumerate(self.loops):
            blocks, count = loop.op.blocks.type.role.data, loop.op.count.type.role.data  # type: ignore[union-attr]
            self.emit(f"# {loop.op.name} over {blocks}: {count} entries for this tile")
            self.emit(self.base_line(blocks))
            self.emit(self.base_line(count))
            self.emit(f"count_{i} = tl.load({count}_base)")
            counts.append(f"count_{i}")
        self.emit(f"n_blocks = {' + '.join(counts)}")
        if len(counts) > 1:
            self.emit("bound_1 = count_0")
        return f"{self.list_roles()[0]}_base"

    def entry(self) -> list[str]:
        k = self.kernel
        self.lines, self.indent = [], 1
        self.emit("dtype: gl.constexpr = q_desc.dtype")
        self.emit("# Program grid: one program per block of BLOCK_M query rows of one (batch, head),")
        self.emit("# CONSUMERS warpgroups of ROWS rows each.")
        self.emit("block_id = tl.num_programs(1) - 1 - tl.program_id(1)" if k.block_order == tile.BlockOrder.DESCENDING
                  else "block_id = tl.program_id(1)")
        self.emit("batch_head = tl.program_id(0)")
        kv_start = self.emit_tile_start()
        self.emit("# Buffers in the descriptors' [1, 1, rows, D] block shape; the products read 2-D views.")
        self.emit("q_bufs = gl.allocate_shared_memory(dtype, [CONSUMERS, 1, 1, ROWS, HEAD_DIM], q_desc.layout)")
        self.emit("k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)")
        self.emit("v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)")
        self.emit("q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())")
        for bar in ("k_ready", "k_empty", "v_ready", "v_empty"):
            self.emit(f"{bar} = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())")
        self.emit("for c in gl.static_range(CONSUMERS):")
        self.emit("    mbarrier.init(q_bars.index(c), count=1)")
        self.emit("for i in gl.static_range(STAGES):")
        self.emit("    mbarrier.init(k_ready.index(i), count=1)")
        self.emit("    mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer releases it")
        self.emit("    mbarrier.init(v_ready.index(i), count=1)")
        self.emit("    mbarrier.init(v_empty.index(i), count=CONSUMERS)")
        if self.listed:
            # The key walk is the lists' (bases, then bound_1 where there are two lists).
            walk_consume, walk_load, bounds = self.walk_params(strides=False), self.walk_params(strides=True), []
        else:
            walk_consume = walk_load = [kv_start]
            bounds = [self.namer[loop.op.lower] for loop in self.loops[1:]]
        consume_args = ["o_desc", *self.pointer_params(), "q_bufs", "k_bufs", "v_bufs", "q_bars", "k_ready",
                        "k_empty", "v_ready", "v_empty", "batch", "head", "q_start", *walk_consume, "n_blocks", *bounds,
                        "sm_scale", "n_q", "n_k", *self.slope_params()]
        tail = ["ROWS", "BLOCK_N", "HEAD_DIM", "STAGES"]
        load_args = ", ".join(["q_desc", "k_desc", "v_desc", "q_bufs", "k_bufs", "v_bufs", "q_bars", "k_ready", "k_empty",
                               "v_ready", "v_empty", "batch", "head", "kv_head", "q_start", *walk_load, "n_blocks",
                               "CONSUMERS", "ROWS", "BLOCK_N", "STAGES"])
        # Gluon takes the partitions as a literal list: one entry per consumer warpgroup (the
        # first is the default partition, the kernel's own 4 warps), then the producer.
        self.emit("gl.warp_specialize([")
        for wg in range(self.consumers):
            self.emit(f"    ({self.name}_consume, ({', '.join([*consume_args, str(wg), *tail])})),")
        self.emit(f"    ({self.name}_load, ({load_args})),")
        registers = k.get("consumer_registers")
        warps = [4] * (self.consumers - 1) + [k.get("producer_warps")]
        regs = [registers] * (self.consumers - 1) + [24]
        self.emit(f"], {warps}, {regs})  # the other consumers, then the producer (TMA issue only)")
        params = ["q_desc", "k_desc", "v_desc", "o_desc", *self.pointer_params(),
                  "sm_scale", "n_q", "n_k", "num_heads", "group_size",
                  f"BLOCK_M: gl.constexpr = {k.get('block_m')}", f"BLOCK_N: gl.constexpr = {k.get('block_n')}",
                  f"HEAD_DIM: gl.constexpr = {self.head_dim}", f"STAGES: gl.constexpr = {k.get('num_stages')}",
                  f"CONSUMERS: gl.constexpr = {self.consumers}", "ROWS: gl.constexpr = 64"]
        header = [f"def {self.name}(", *[f"    {p}," for p in params], "):"]
        return ["@gluon.jit", *header, *self.lines]


# The forward's online softmax keeps its row max in base-2 units (`GluonEmitter.emit_softmax_update`;
# its finalize, called directly, reads it so).
GluonEmitter.HANDLERS = {**KernelEmitter.HANDLERS, tile.SoftmaxUpdateOp: GluonEmitter.emit_softmax_update,
                         tile.AddBiasOp: GluonEmitter.emit_add_bias}


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
# A CTA-wide barrier is gl.thread_barrier in Triton 3.6, gl.barrier from 3.7 on.
thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def tile_2d(buffer):
    """A [1, 1, rows, D] buffer (a descriptor's block over [B, H, N, D]) as [rows, D]."""
    return buffer.reshape([buffer.shape[2], buffer.shape[3]])
'''

REDUCE_ADD_HELPER = '''

from triton.experimental.gluon.language._core import builtin


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """global[block at coord] += shared `src` (cp.reduce.async.bulk.tensor.add), clipped at the
    tensor's bounds; completes like a TMA store (`tma.store_wait`). Gluon 3.6 has the builder
    call (ttng.async_tma_reduce) but no Python wrapper for it."""
    from triton._C.libtriton import ir

    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                              coord, src.handle)


@gluon.jit
def tma_writes_wait():
    """Waits until the warp's TMA stores and reduces have written global memory
    (`cp.async.bulk.wait_group 0`; `tma.store_wait` waits only until they have read their
    shared memory, `.read`, which frees the buffer but publishes nothing). Each thread waits
    for the copies it issued (the elected one issued them all), then the warp syncs, so that
    whichever lane releases what the copies wrote comes after them."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0; bar.warp.sync -1; mov.u32 $0, 0;", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@builtin
def reinterpret_shared(buffer, dtype, shape, layout, _semantic=None):
    """`buffer`'s bytes as a buffer of another type, shape or layout (`_reinterpret` in Triton
    3.6, `reinterpret` from 3.7 on)."""
    method = getattr(buffer, "reinterpret", None) or buffer._reinterpret
    return method(dtype, shape, layout, _semantic=_semantic)
'''


@dataclass(frozen=True)
class GluonKernel:
    """How to launch one Gluon kernel (`runtime/gluon_forward.py`)."""

    name: str
    roles: tuple[str, ...]
    operands: tuple[str, str, str, str]
    """The roles behind `q_desc, k_desc, v_desc, o_desc`."""
    block_m: int
    block_n: int
    num_warps: int
    """Warps of the launch (the default partition: the first consumer)."""
    persistent: bool = False
    """One program per SM walking the tiles (`gluon_persistent.py`): launched on
    `min(tiles, SMs)` programs, with `batch_heads` after `group_size`."""


@dataclass(frozen=True)
class GluonProgram:
    """A generated Gluon module: its source and its kernels."""

    source: str
    kernels: tuple[GluonKernel, ...]


def kernel_source(kernel: tile.KernelOp) -> tuple[str, set[str], GluonKernel]:
    """One warp-specialized kernel's functions, the helpers they call and its launch, or
    `GluonUnsupported`: a forward (`query_blocks`) or the fused backward (`key_blocks`)."""
    from attnfuse.lowering.gluon_backward import GluonBackwardEmitter
    from attnfuse.lowering.gluon_persistent import PersistentGluonEmitter

    persistent = kernel.int_attr("persistent") == 1
    if kernel.grid == "key_blocks":
        backward = GluonBackwardEmitter(kernel)
        info = GluonKernel(kernel.sym_name.data, tuple(kernel.roles), backward.operands, kernel.get("block_m"),
                           kernel.get("block_n"), kernel.get("num_warps"))
        return "\n".join(backward.run()), backward.helpers | {"tma_reduce_add"}, info
    emitter = (PersistentGluonEmitter if persistent else GluonEmitter)(kernel)
    info = GluonKernel(kernel.sym_name.data, tuple(kernel.roles), emitter.operands, kernel.get("block_m"),
                       kernel.get("block_n"), 4, persistent)
    return "\n".join(emitter.run()), emitter.helpers, info


def gluon_source(bodies: list[str], helpers: set[str]) -> str:
    """The generated module: the header, the helpers the kernels call, the kernels."""
    source = HEADER + (REDUCE_ADD_HELPER if "tma_reduce_add" in helpers else "")
    source += "".join("\n\n" + HELPERS[name].replace("@triton.jit", "@gluon.jit")
                      for name in sorted(helpers - {"tma_reduce_add"}))
    return source + "".join("\n\n" + body for body in bodies) + "\n"


def emit_gluon_kernel(kernel: tile.KernelOp) -> GluonProgram:
    """The Gluon module of one warp-specialized kernel, or `GluonUnsupported`."""
    body, helpers, info = kernel_source(kernel)
    return GluonProgram(gluon_source([body], helpers), (info,))


def emit_gluon_module(module: ModuleOp) -> GluonProgram:
    """The Gluon module of the warp-specialized kernels in `module` (the forward, the fused
    backward). Kernels without the schedule (rotation kernels, the separate backward's) are
    the portable target's: the source lists them in a comment. A module with no scheduled
    kernel is refused, saying why its forward (or else its first kernel) was left alone."""
    kernels = [op for op in module.ops if isinstance(op, tile.KernelOp)]
    if not kernels:
        raise AttnFuseError("no tile.kernel to print: run lower-to-tile first")
    scheduled = [k for k in kernels if k.schedule is not None]
    if not scheduled:
        forward = next((k for k in kernels if k.sym_name.data == "attention_fwd"), kernels[0])
        emit_gluon_kernel(forward)  # raises, with the reason
    printed = [kernel_source(k) for k in scheduled]
    helpers = set().union(*(h for _, h, _ in printed))
    source = gluon_source([body for body, _, _ in printed], helpers)
    portable = [k.sym_name.data for k in kernels if k.schedule is None]
    note = f"\n# Not warp-specialized (printed by -t triton): {', '.join(portable)}\n" if portable else ""
    return GluonProgram(source + note, tuple(info for _, _, info in printed))


@dataclass(frozen=True)
class GluonTarget(Target):
    """`-t gluon`: print the module's warp-specialized kernel for Hopper, in Gluon."""

    name = "gluon"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(emit_gluon_module(module).source)


__all__ = ["GluonTarget", "GluonUnsupported", "emit_gluon_kernel", "emit_gluon_module"]
