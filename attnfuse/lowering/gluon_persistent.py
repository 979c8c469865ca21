"""The Gluon target's persistent grid (`persistent = 1` on a warp-specialized kernel).

One program per SM (the runtime launches `min(tiles, SMs)` programs) walks the tiles, a tile
being one block of BLOCK_M query rows of one (batch, head): tile t is batch x head
`t % batch_heads` and query block `t // batch_heads` counted from the last block under
`block_order = descending` (the longest causal work first), program p taking tiles p, p + G,
.... No program launch sits between tiles, and the producer copies the next tile's q, k and v
while the consumers finish the current one: the k/v ring's position (`kv_count`, blocks so far)
runs on across tiles in every partition, a consumer releases its q buffer (`q_empty`) once the
last S product of its tile is done, and o leaves through a buffer of its own. Partitions agree
on the phases by counting the same things: `kv_count` and `q_count` (tiles with at least one
key block; a tile without any copies nothing and its consumers write zeros).

The hand-written probe's `ps2` (bench/gluon_forward_probe.py) is this schedule; it was 3-5%
faster than the non-persistent kernel at head dim 128. The printed kernel is 1-3% faster than
the printed non-persistent one on the H200 for dense attention at head dim 128, and 3-15% slower
under a causal band and at head dim 64 (bench/results/20261203T131515Z-gluon-persistent-ab.md),
so the runtime takes it for kernels of uniform tiles at head dim 128 (`gluon_forward.SCHEDULES`).
Everything else (the score step, finalize, the stores' meaning) is `GluonEmitter`'s.
"""

from __future__ import annotations

from attnfuse.dialects import tile
from attnfuse.lowering.gluon import GluonEmitter, GluonUnsupported


class PersistentGluonEmitter(GluonEmitter):
    """`GluonEmitter` for a kernel with `persistent = 1`: a tile function, and a loader, a
    consumer and an entry that walk the program's tiles."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.listed:
            # `warp-specialize` never sets it on one; hand-written IR may.
            raise GluonUnsupported("the gluon target's persistent grid walks key ranges, not block lists: "
                                   f"{self.name} has tile.sparse_kv_loop and persistent = 1", self.kernel)

    def run(self) -> list[str]:
        out = self.tile_function() + ["", ""] + self.bias_function()
        out += self.step_function() + ["", ""]
        out += self.loader() + ["", ""]
        out += self.consumer() + ["", ""]
        out += self.entry()
        return out

    def tile_results(self) -> list[str]:
        """What `<name>_tile` returns: the tile's coordinates, its key range, the loops' lower
        bounds (`bound_i`) and its head's slopes."""
        bounds = self.bound_params()
        return ["batch", "head", "kv_head", "q_start", "kv_start", "n_blocks", *bounds, *self.slope_params()]

    TILE_SCALARS = ["n_q", "n_k", "num_heads", "group_size", "batch_heads"]

    def tile_args(self) -> list[str]:
        """`<name>_tile`'s arguments after t (the consumers have the slope pointers among
        their pointer parameters, the producer as its own)."""
        return [*self.TILE_SCALARS, *[f"{r}_ptr" for r in self.slope_roles()]]

    def tile_function(self) -> list[str]:
        """`<name>_tile(t, ...)`: tile t's batch, heads, first query row and key blocks, the key
        bounds as the portable target prints them."""
        k = self.kernel
        self.lines, self.indent = [], 1
        self.emit("n_row_blocks = (n_q + BLOCK_M - 1) // BLOCK_M")
        self.emit("batch_head = t % batch_heads")
        if k.block_order == tile.BlockOrder.DESCENDING:
            self.emit("block_id = n_row_blocks - 1 - t // batch_heads  # the last query blocks (most keys) first")
        else:
            self.emit("block_id = t // batch_heads")
        kv_start = self.emit_tile_start()
        values = ["batch", "head", "kv_head", "q_start", kv_start, "n_blocks",
                  *[self.namer[loop.op.lower] for loop in self.loops[1:]], *self.slope_params()]
        self.emit(f"return {', '.join(values)}")
        params = ["t", *self.tile_args(), "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr"]
        return self.function(f"def {self.name}_tile({', '.join(params)}):", self.lines)

    def tile_loop(self) -> list[str]:
        """The loop over this program's tiles, and the tile's values (at indent 1)."""
        return [
            "n_tiles = (n_q + BLOCK_M - 1) // BLOCK_M * batch_heads",
            "kv_count = 0  # key blocks before this tile: the k/v ring's position",
            "q_count = 0  # tiles before this one that copied q: the q barriers' phase",
            "for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):",
            f"    {', '.join(self.tile_results())} = {self.name}_tile(t, {', '.join(self.tile_args())}, BLOCK_M, BLOCK_N)",
        ]

    def loader(self) -> list[str]:
        body = [
            "    # The producer: TMA copies only, tile after tile. Each consumer's q once its buffer",
            "    # is free (every S product of its previous tile done), then k and v of every block",
            "    # into the ring, whose position runs on across tiles. Empty barriers start as if",
            "    # phase 1 had completed, so the first round of waits passes.",
            *["    " + line for line in self.tile_loop()],
            "        if n_blocks > 0:",
            "            mbarrier.wait(q_empty.index(0), (q_count & 1) ^ 1)",
            "            mbarrier.expect(q_bars.index(0), q_desc.block_type.nbytes)",
            "            tma_load(q_desc, [batch, head, q_start, 0], q_bars.index(0), q_bufs.index(0))",
            "        for j in range(n_blocks):",
            "            c = kv_count + j",
            "            stage = c % STAGES",
            "            phase = (c // STAGES) & 1",
            "            start_n = kv_start + j * BLOCK_N",
            "            mbarrier.wait(k_empty.index(stage), phase ^ 1)",
            "            mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)",
            "            tma_load(k_desc, [batch, kv_head, start_n, 0], k_ready.index(stage), k_bufs.index(stage))",
            "            if j == 0:",
            "                for w in gl.static_range(1, CONSUMERS):",
            "                    mbarrier.wait(q_empty.index(w), (q_count & 1) ^ 1)",
            "                    mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)",
            "                    tma_load(q_desc, [batch, head, q_start + w * ROWS, 0], q_bars.index(w), q_bufs.index(w))",
            "            mbarrier.wait(v_empty.index(stage), phase ^ 1)",
            "            mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)",
            "            tma_load(v_desc, [batch, kv_head, start_n, 0], v_ready.index(stage), v_bufs.index(stage))",
            "        kv_count += n_blocks",
            "        if n_blocks > 0:",
            "            q_count += 1",
        ]
        params = ["q_desc", "k_desc", "v_desc", "q_bufs", "k_bufs", "v_bufs", "q_bars", "q_empty", "k_ready",
                  "k_empty", "v_ready", "v_empty", *self.tile_args(), "CONSUMERS: gl.constexpr",
                  "ROWS: gl.constexpr", "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr", "STAGES: gl.constexpr"]
        return self.function(f"def {self.name}_load({', '.join(params)}):", body)

    def consumer(self) -> list[str]:
        """`<name>_consume(..., WG)`: one consumer warpgroup's tiles, each as the
        non-persistent consumer runs its program, on the ring's running position."""
        self.lines, self.indent = [], 1
        for line in [
            "# One consumer warpgroup on ROWS query rows of each tile; per tile as the",
            "# non-persistent kernel's consumer (S_j beside P_{j-1} @ v_{j-1}), with the ring's",
            "# stage and phase of block j counted from kv_count.",
            "S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])",
            "O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])",
            "P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)",
            "q_tile = tile_2d(q_bufs.index(WG))",
            "o_smem = o_bufs.index(WG)",
            "o_tile = tile_2d(o_smem)",
            "dtype: gl.constexpr = o_smem.dtype",
            "s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=S_LAYOUT)",
            *self.tile_loop(),
            "    row_start = q_start + WG * ROWS",
            *self.state_init("    "),
            "    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=O_LAYOUT)",
            "    if n_blocks > 0:",
            "        mbarrier.wait(q_bars.index(WG), q_count & 1)",
            "        start_n = kv_start",
            "        first = kv_count % STAGES",
            "        mbarrier.wait(k_ready.index(first), (kv_count // STAGES) & 1)",
            "        scores = warpgroup_mma(q_tile, tile_2d(k_bufs.index(first)).permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            *self.bias_call("        "),
            "        scores = warpgroup_mma_wait(0, deps=(scores,))",
            "        mbarrier.arrive(k_empty.index(first), count=1)",
            *[line[4:] for line in self.step_call("            ")],
            "        # P is carried in 16 bits in the product's operand layout (half the registers of fp32),",
            "        # first defined here: with a zeros tile before the `if`, the loop carried P as 16-bit",
            "        # halves and every step copied its 32 registers after the product's wait (PRMT).",
            "        p_op = gl.convert_layout(probs.to(dtype), P_LAYOUT)",
            "        for j in range(1, n_blocks):",
            "            c = kv_count + j",
            "            stage = c % STAGES",
            "            phase = (c // STAGES) & 1",
            "            prev = (c - 1) % STAGES",
            "            prev_phase = ((c - 1) // STAGES) & 1",
            "            start_n = kv_start + j * BLOCK_N",
            "            mbarrier.wait(k_ready.index(stage), phase)",
            "            mbarrier.wait(v_ready.index(prev), prev_phase)",
            *self.rescale("            "),
            "            scores = warpgroup_mma(q_tile, tile_2d(k_bufs.index(stage)).permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            "            acc = warpgroup_mma(p_op, tile_2d(v_bufs.index(prev)), acc, is_async=True)",
            *self.bias_call("            "),
            "            scores = warpgroup_mma_wait(1, deps=(scores,))",
            "            mbarrier.arrive(k_empty.index(stage), count=1)",
            *self.step_call("            "),
            "            p_next = gl.convert_layout(probs.to(dtype), P_LAYOUT)",
            "            # The block boundary that keeps the product's wait below the score step, on a",
            "            # barrier completed before the partitions start (q's phases move on per tile).",
            "            mbarrier.wait(always, 0)",
            "            acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))",
            "            mbarrier.arrive(v_empty.index(prev), count=1)",
            "            p_op = p_next",
            "        # Every S product of this tile is done: the producer may copy the next tile's q.",
            "        mbarrier.arrive(q_empty.index(WG), count=1)",
            "        c_last = kv_count + n_blocks - 1",
            "        last = c_last % STAGES",
            "        mbarrier.wait(v_ready.index(last), (c_last // STAGES) & 1)",
            *self.rescale("        "),
            "        acc = warpgroup_mma(p_op, tile_2d(v_bufs.index(last)), acc, is_async=True)",
            "        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))",
            "        mbarrier.arrive(v_empty.index(last), count=1)",
            *self.state_to_output_layout("    "),
            "    rows = row_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, O_LAYOUT))",
            "    row_in_bounds = rows < n_q",
        ]:
            self.emit(line)
        self.indent = 2
        self.emit_finalize()
        self.emit("# tile.store: o rows (program), through this consumer's o buffer (free: the previous")
        self.emit("# tile's store was waited for) and a TMA store, which clips at the sequence end.")
        self.emit("if row_start < n_q:")
        self.emit(f"    o_tile.store({self.namer[self.o_store.value]}.to(dtype))")
        self.emit("    fence_async_shared()")
        self.emit("    tma_store(o_desc, [batch, head, row_start, 0], o_smem)")
        self.emit("    tma.store_wait(0)")
        self.emit("kv_count += n_blocks")
        self.emit("if n_blocks > 0:")
        self.emit("    q_count += 1")
        params = ["o_desc", *self.pointer_params(), "q_bufs", "o_bufs", "k_bufs", "v_bufs", "q_bars", "q_empty",
                  "always", "k_ready", "k_empty", "v_ready", "v_empty", *self.TILE_SCALARS, "sm_scale",
                  "WG: gl.constexpr", "ROWS: gl.constexpr", "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr",
                  "HEAD_DIM: gl.constexpr", "STAGES: gl.constexpr"]
        return self.function(f"def {self.name}_consume({', '.join(params)}):", self.lines)

    def entry(self) -> list[str]:
        k = self.kernel
        self.lines, self.indent = [], 1
        self.emit("dtype: gl.constexpr = q_desc.dtype")
        self.emit("# Persistent grid: each program walks tiles program_id, + num_programs, ... (`_tile`).")
        self.emit("# Buffers in the descriptors' [1, 1, rows, D] block shape; the products read 2-D views.")
        self.emit("q_bufs = gl.allocate_shared_memory(dtype, [CONSUMERS, 1, 1, ROWS, HEAD_DIM], q_desc.layout)")
        self.emit("o_bufs = gl.allocate_shared_memory(dtype, [CONSUMERS, 1, 1, ROWS, HEAD_DIM], o_desc.layout)")
        self.emit("k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)")
        self.emit("v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)")
        for bar in ("q_bars", "q_empty"):
            self.emit(f"{bar} = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())")
        for bar in ("k_ready", "k_empty", "v_ready", "v_empty"):
            self.emit(f"{bar} = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())")
        self.emit("always = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())")
        self.emit("for c in gl.static_range(CONSUMERS):")
        self.emit("    mbarrier.init(q_bars.index(c), count=1)")
        self.emit("    mbarrier.init(q_empty.index(c), count=1)")
        self.emit("for i in gl.static_range(STAGES):")
        self.emit("    mbarrier.init(k_ready.index(i), count=1)")
        self.emit("    mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer releases it")
        self.emit("    mbarrier.init(v_ready.index(i), count=1)")
        self.emit("    mbarrier.init(v_empty.index(i), count=CONSUMERS)")
        self.emit("mbarrier.init(always, count=1)")
        self.emit("mbarrier.arrive(always, count=1)  # phase 0 complete for good: waits on it return at once")
        consume_args = ["o_desc", *self.pointer_params(), "q_bufs", "o_bufs", "k_bufs", "v_bufs", "q_bars",
                        "q_empty", "always", "k_ready", "k_empty", "v_ready", "v_empty", *self.TILE_SCALARS, "sm_scale"]
        tail = ["ROWS", "BLOCK_M", "BLOCK_N", "HEAD_DIM", "STAGES"]
        load_args = ["q_desc", "k_desc", "v_desc", "q_bufs", "k_bufs", "v_bufs", "q_bars", "q_empty", "k_ready",
                     "k_empty", "v_ready", "v_empty", *self.tile_args(), "CONSUMERS", "ROWS", "BLOCK_M", "BLOCK_N",
                     "STAGES"]
        self.emit("gl.warp_specialize([")
        for wg in range(self.consumers):
            self.emit(f"    ({self.name}_consume, ({', '.join([*consume_args, str(wg), *tail])})),")
        self.emit(f"    ({self.name}_load, ({', '.join(load_args)})),")
        registers = k.get("consumer_registers")
        warps = [4] * (self.consumers - 1) + [k.get("producer_warps")]
        regs = [registers] * (self.consumers - 1) + [24]
        self.emit(f"], {warps}, {regs})  # the other consumers, then the producer (TMA issue only)")
        params = ["q_desc", "k_desc", "v_desc", "o_desc", *self.pointer_params(),
                  "sm_scale", "n_q", "n_k", "num_heads", "group_size", "batch_heads",
                  f"BLOCK_M: gl.constexpr = {k.get('block_m')}", f"BLOCK_N: gl.constexpr = {k.get('block_n')}",
                  f"HEAD_DIM: gl.constexpr = {self.head_dim}", f"STAGES: gl.constexpr = {k.get('num_stages')}",
                  f"CONSUMERS: gl.constexpr = {self.consumers}", "ROWS: gl.constexpr = 64"]
        header = [f"def {self.name}(", *[f"    {p}," for p in params], "):"]
        return ["@gluon.jit", *header, *self.lines]


__all__ = ["PersistentGluonEmitter"]
