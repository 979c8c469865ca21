"""The Gluon target's backward: the fused 5-product backward (`attention_bwd_dkdv_dq`,
`lower-to-tile{bwd-dq=fused}`) as a warp-specialized Hopper kernel.

One program owns a block of BLOCK_M keys (two consumer warpgroups of 64 keys each, 8 warps) of
one (batch, key/value head) and walks every query block of every query head of its GQA group,
as the portable kernel does; the schedule is FlashAttention-3's and the hand-written probe's
(`bench/gluon_backward_probe.py`, variant `wg2_writer_lse`):

- a loader partition (1 warp, TMA only): k and v once, then q, dO, lse and delta of each query
  block into a ring of `num_stages` shared-memory buffers (ready/empty barriers);
- the consumer partition (the kernel's own warps), per block, in the key-major orientation the
  tile IR already has (`tile.scores` of k and q is s^T):
      s^T = k q^T, dp^T = v dO^T (both issued at once), then `<kernel>_probs`: the score ops and
      `tile.recompute_probs` (the portable target's printers); dV += p^T dO issued before the
      wait for dp^T, `<kernel>_grads` (`tile.softmax_grad` and the VJP ops) under it; dK += ds^T q;
      the dQ part ds k (`tile.dot_lhs_transposed`, A = ds^T from shared memory, transposed view);
- dQ writer partitions (`dq_writers`: 1 warp, or 2 each owning one staging buffer and so
  every other step): `tile.store_add` as TMA reduce-adds of the staged dQ parts into the f32
  `dq_acc`, two staging buffers: unordered (not deterministic), or, for a `store_add ...
  in_order`, each after every lower key block visiting the query block has added
  (deterministic; the key block before, in a range, or the list entry's rank under lists);
- the epilogue (`tile.apply_scale`, a RoPE inverse rotation, the stores): whole tiles leave
  through k's and v's buffers and TMA stores; a rotation's halves go through the dQ staging
  buffers (free by then) and are stored from registers as the portable target stores them.

The loops of the kernel (masked, full, masked) are one pipelined range of `group_size *
n_blocks` steps, whose (head, start_m) each partition carries from step to step (under block
lists, `walk`: head by head, the entries of the head's full then partial list, each from its
last entry down, `total` steps in all, summed by the entry kernel); a step runs
its loop's masks under a test of its start (`gluon_steps`), and lse's guards with them
(`lse_guard`), so a full step runs no guard. Query rows past `n_q` and key rows past `n_k` are
zero-filled by the 4-D descriptors and clipped on the stores and reduces; their lse is taken as
+inf, so their probabilities are 0 (and ds, for any finite delta: delta is not guarded).

Launch ABI: descriptors `q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_acc_desc`
(4-D over `[B, H, N, D]`, blocks `[1, 1, rows, D]`), `lse_desc, delta_desc` (1-D over the
`[B * Hq * Nq']` f32 rows, each head's Nq rows padded to Nq' = a multiple of 4, blocks of BLOCK_N), then the pointer and strides of every
other role (`dk` for the stores by column part, `rope_table`, `slopes`, `q_positions` and
`k_positions` at call-time RoPE positions, `doc_ids`, and under block lists each list, its
count and, ordered, its ranks), then `sm_scale, n_q,
n_k, num_heads (Hkv), group_size`; grid `(B * Hkv, cdiv(n_k, BLOCK_M))`, `num_warps` warps.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from attnfuse.dialects import tile
from attnfuse.dialects.backward_shape import BackwardLoop, backward_kernel, primal_operands
from attnfuse.dialects.flash_shape import INDEX_OPS, NotFlashShaped
from attnfuse.lowering.gluon_steps import BiasBlocks, GluonFunctions, MaskedLoopSteps, Pieces
from attnfuse.lowering.triton import LOG2E, KernelEmitter, LoopRows, padded

DESCRIPTOR_ROLES = ("do", "dv", "dq_acc", "lse", "delta")
"""Roles read or written only through descriptors (besides q, k and v, whose roles vary)."""

DQ_BUFFERS = 2
"""dQ staging buffers between the consumer and the writer (the probe's best)."""

ROW_ALIGNMENT = 4
"""The loader reads a head's rows of lse and delta through one flat descriptor at element
`(b * Hq + h) * Nq' + m`, Nq' being Nq rounded up to a multiple of this (`n_rows`): a TMA
copy's start in global memory must be 16-byte aligned (at Nq = 2043 read in place, the copies
of head 1 on started unaligned and the H200 stopped the kernel with an illegal instruction,
which poisons the CUDA context). Where Nq is off the multiple, the runtime copies the rows
into padded buffers first (`runtime/gluon_backward.py`, `GluonBackwardLaunch.padded_rows`)."""


def padded_rows_per_head(n_q: int) -> int:
    """Nq', the rows a head takes in the flat lse / delta the loader reads (`n_rows`)."""
    return -(-n_q // ROW_ALIGNMENT) * ROW_ALIGNMENT


def _unsupported(message: str, op: Operation | None):
    from attnfuse.lowering.gluon import GluonUnsupported

    return GluonUnsupported(message, op)


class GluonBackwardEmitter(BiasBlocks, GluonFunctions, MaskedLoopSteps, KernelEmitter):
    """Prints one warp-specialized fused backward kernel: the probability and gradient step
    functions, the loader, the dQ writer, the consumer and the entry kernel."""

    DESCRIPTOR_ROLES = DESCRIPTOR_ROLES
    RANGE_START = "start_m"
    # A bias block is the step's: the program's keys down, the step's queries across.
    BIAS_BLOCK = ("start_m", "n_start", "BLOCK_M")
    BIAS_FUNCTION = "load_bias"  # (`<kernel>_bias` would be the name of the dbias kernel)
    BIAS_LOOP_ROWS = LoopRows("queries", "query_in_bounds", "q_pos")

    def __post_init__(self) -> None:
        super().__post_init__()
        k = self.kernel
        try:
            parts = backward_kernel(k)
        except NotFlashShaped as err:
            raise _unsupported(f"the gluon target cannot lower {err}", err.op) from err
        if k.schedule != tile.Schedule.WARP_SPECIALIZED:
            raise _unsupported(f"the gluon target prints warp-specialized kernels: {k.sym_name.data} has no "
                               "#tile<schedule warp_specialized> (run warp-specialize first)", k)
        if padded(self.head_dim) != self.head_dim or self.head_dim != self.head_dim_v:
            raise _unsupported("the gluon backward needs equal power-of-two head dims", k)
        self.parts = parts
        self.loops: list[BackwardLoop] = parts.loops
        if self.splits_dk and DQ_BUFFERS * k.get("block_n") < k.get("block_m"):
            # dK's halves go through the dQ staging buffers: they must hold BLOCK_M f32 rows.
            raise _unsupported(f"the gluon backward rotates dK back through {DQ_BUFFERS} dQ staging buffers of "
                               f"block_n rows: block_n = {k.get('block_n')} holds fewer than block_m = "
                               f"{k.get('block_m')}", k)
        self.primal: dict[SSAValue, str] = {}
        """Values of the probability step the gradient step reads besides p^T (soft-capping's
        s, ReLU's refined scores), by the name that carries them from one step to the other."""

    # -- names -------------------------------------------------------------------------------

    CONSUMER_NAMES = ("dk", "dv", "scores", "probs", "grad_probs", "grad_scores", "lse", "lse_log2", "delta", "p_op", "ds16",
                      "ds_op", "dq_part", "q_s", "do_s", "k_tile", "v_tile", "s_zero", "dq_zero", "stage", "phase",
                      "it", "b", "WRITER", "total", "n_blocks", "n_start", "halves", "first_head", "counter", "dtype", "row", "step_bytes",
                      "S_LAYOUT", "KV_LAYOUT", "A_LAYOUT", "DQ_LAYOUT", "EPI_LAYOUT", "DS_SMEM", "NW",
                      "k_smem", "v_smem", "q_bufs", "do_bufs", "lse_bufs", "delta_bufs", "ds_smem", "dq_bufs",
                      "kv_bar", "ready", "empty", "dq_full", "dq_empty", "dk_base", "bound", "i", "wrap", "head", "n_rows",
                      "head_in_group", "step", "n_steps", "rank", "block_id", "next_start_m", "next_rank",
                      "tile_2d", "tma_load", "tma_store", "tma_reduce_add", "tma_writes_wait", "reinterpret_shared", "thread_barrier",
                      "gl", "gluon", "mbarrier", "tma", "warpgroup_mma", "warpgroup_mma_wait", "fence_async_shared")
    """Names the printed partitions use themselves: the ops' results take others."""

    FUNCTION_PARTS = ("probs", "grads", "load", "dq_write", "consume", "load_bias")
    """The kernel's functions besides its entry: `<kernel name>_<part>`."""

    def reserved_names(self) -> set[str]:
        # Primal tiles are named primal_<op>_<operand> (`find_primal_values`); bounds bound_<i>;
        # the entry reads its compile-time parameters and each role's descriptor.
        primal = {f"primal_{i}_{j}" for i in range(16) for j in range(4)}
        functions = {f"{self.kernel.sym_name.data}_{part}" for part in self.FUNCTION_PARTS}
        read = {"STAGES", "num_warps", *(f"{role}_desc" for role in self.roles), "q_desc", "k_desc", "v_desc"}
        tiles = {f"{role}_tile" for role in self.roles}
        return (super().reserved_names() | set(self.CONSUMER_NAMES) | primal | {f"bound_{i}" for i in range(8)}
                | {f"count_{i}" for i in range(8)} | functions | read | tiles)

    def run(self) -> list[str]:
        self.find_primal_values()
        out: list[str] = self.bias_function()
        out += self.probs_function() + ["", ""]
        out += self.grads_function() + ["", ""]
        out += self.loader() + ["", ""]
        out += self.dq_writer() + ["", ""]
        out += self.consumer() + ["", ""]
        out += self.entry()
        return out

    # -- the step functions ------------------------------------------------------------------

    def find_primal_values(self) -> None:
        """Name the values of the probability step a gradient-step op reads besides the
        gradient and p^T (by position in the loop's list of gradient ops, so that every loop's
        steps use the same names)."""
        for loop in self.loops:
            for i, op in enumerate(loop.gradient_ops):
                for j, value in enumerate(primal_operands(op)):
                    if value is not loop.probs.result:
                        self.primal[value] = f"primal_{i}_{j}"

    def primal_names(self) -> list[str]:
        return sorted(set(self.primal.values()))

    STEP_HEADER = [
        "rows = n_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_LAYOUT))",
        "row_in_bounds = rows < n_k",
        "queries = start_m + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))",
        "query_in_bounds = queries < n_q",
        "q_pos = queries + (n_k - n_q)  # bottom-right aligned: the last query sits at the last key",
    ]
    """The row and column indices every step function starts with (the names the portable
    printers use in a `key_blocks` kernel: keys down, queries across)."""
    BIAS_HEADER = tuple(STEP_HEADER[:4])  # a bias block's indices: the step's, without q_pos

    def save_primal(self, value: SSAValue, pieces: Pieces) -> None:
        """After the piece that defines `value` (a score tile left in `scores`, a scalar):
        keep it for the gradient step, in a piece of its own, so that a masked loop's copy
        follows its masks as the unmasked loops' copy follows their last shared op."""
        name = self.primal.get(value)
        if name is not None:
            pieces.append((False, [f"{name} = {self.namer[value]}  # read in the gradient step"]))

    def probs_pieces(self, loop: BackwardLoop) -> Pieces:
        """The score ops and `tile.recompute_probs` (or a pointwise normalizer's ops) of one
        loop, op by op; every score op's result is `scores` (each refines the previous tile in
        place), p^T's is `probs`."""
        if loop.softmax:
            self.namer.alias(loop.lse_load.result, "lse_log2")
        self.namer.alias(loop.scores.result, "scores")
        pieces: Pieces = []
        self.lines, self.indent = [], 0
        self.emit("# tile.scores: k @ q^T came from warpgroup_mma (fp32)")
        self.emit_score_scale("scores", loop.scores)
        pieces.append((False, self.lines))
        self.save_primal(loop.scores.result, pieces)
        self.loop_vars.append(LoopRows("queries", "query_in_bounds" if loop.masked else "", "q_pos"))
        for op in loop.score_ops:
            if not isinstance(op, (tile.SeqLenOp, *INDEX_OPS)):  # a scalar or an index tile keeps its own name
                self.namer.pin(op.result, "scores")
            self.lines = []
            self.HANDLERS[type(op)](self, op)
            pieces.append((isinstance(op, tile.FILTER_OPS), self.lines))
            self.save_primal(op.result, pieces)
        self.namer.pin(loop.probs.result, "probs")
        if not loop.softmax:
            # The normalizer's last op turns the refined scores into p^T, elementwise: no row
            # statistics, nothing to guard (a dropped pair is -inf, which weighs 0; a padded
            # row's dO is zero-filled, so it adds nothing).
            self.lines = []
            self.HANDLERS[type(loop.probs)](self, loop.probs)
            pieces.append((False, self.lines))
            self.loop_vars.pop()
            return pieces
        if loop.probs.lse is not loop.lse_load.result:
            raise _unsupported("the gluon backward recomputes p from the loaded lse", loop.probs)
        guard = self.lse_guard(loop)
        if guard:
            pieces.append((True, guard))
        self.lines = []
        self.emit("# tile.recompute_probs: p = exp(s - lse)")
        self.emit(f"probs = tl.math.exp2(scores * {self.exponent_factor(loop.probs)} - lse_log2[None, :])")
        pieces.append((False, self.lines))
        self.loop_vars.pop()
        return pieces

    @staticmethod
    def lse_guard(loop: BackwardLoop) -> list[str]:
        """What `tile.recompute_probs` guards lse against in this loop's blocks, printed as a
        mask is (under the test of the block's loop): in a masked loop, query rows past n_q
        (zero-filled; their lse rows are another head's) and rows with no kept key (lse = -inf,
        which would make exp(s - lse) NaN) get lse = +inf, so their probabilities are 0. In an
        unmasked loop every row keeps this block's pairs, but a row whose scores all lie far
        below the softmax's floor has no weight and lse = -inf too (`attn.SOFTMAX_FLOOR`): its
        full steps run the -inf test alone."""
        if loop.masked:
            return ["# Query rows past n_q (zero-filled) or with no kept key (lse = -inf) get lse = +inf:",
                    "# their probabilities are 0.",
                    "lse_log2 = gl.where(query_in_bounds & (lse_log2 != float(\"-inf\")), lse_log2, float(\"inf\"))"]
        return ["# A row with no weight (lse = -inf: below the softmax's floor, or no kept key) gives 0.",
                "lse_log2 = gl.where(lse_log2 == float(\"-inf\"), float(\"inf\"), lse_log2)"]

    def grads_pieces(self, loop: BackwardLoop) -> Pieces:
        """The normalizer's derivative (`tile.softmax_grad`, `tile.relu_grad`, a map) and the
        VJP ops of one loop; each result is `grad_scores`."""
        self.namer.alias(loop.probs.result, "probs")
        self.namer.alias(loop.grad_probs.result, "grad_probs")
        if loop.softmax:
            self.namer.alias(loop.delta_load.result, "delta")
        for value, name in self.primal.items():
            self.namer.alias(value, name)
        pieces: Pieces = []
        self.loop_vars.append(LoopRows("queries", "query_in_bounds" if loop.masked else "", "q_pos"))
        for op in loop.gradient_ops:
            if op.results:  # (a gradient store has none)
                self.namer.pin(op.results[0], "grad_scores")
            self.lines, self.indent = [], 0
            self.HANDLERS[type(op)](self, op)
            pieces.append((isinstance(op, tile.FILTER_OPS), self.lines))
        self.loop_vars.pop()
        return pieces

    def step_body(self, pieces_of) -> list[str]:
        per_loop = self.pieces_per_loop(pieces_of)
        if self.same_skeleton(per_loop):
            return self.merged_steps(per_loop)
        return self.guarded([([i], [line for _, lines in pieces for line in lines])
                             for i, pieces in enumerate(per_loop)])

    def step_params(self) -> list[str]:
        step = ["step"] if self.listed else []
        return ["start_m", *step, "n_start", *self.bound_params(), "sm_scale", "n_q", "n_k", *self.head_param(),
                *self.slope_params(), *self.document_params()]

    def head_param(self) -> list[str]:
        """The step's query head, where a block maps with it (`tile.query_head`)."""
        reads = any(isinstance(op, tile.QueryHeadOp) for loop in self.loops for op in loop.score_ops)
        return ["head"] if reads else []

    def emit_index_tile(self, result: SSAValue, index: str) -> None:
        """`result`, `index` as f32, broadcast where it is used: a row (`rows[:, None]`) or a
        column (`q_pos[None, :]`) of the score tile's layout, or the step's `head`. Not made a
        whole tile here: three such tiles (FIRE's) cost a hundred registers a thread."""
        self.emit(f"{self.namer.define(result)} = ({index}).to(gl.float32)")

    # -- block lists -------------------------------------------------------------------------

    def list_roles(self) -> list[str]:
        """Every list the loops walk, with its count and (ordered adds) ranks, loop by loop."""
        return [role for loop in self.loops for role in loop.list_roles]

    def list_pointer_params(self) -> list[str]:
        """The lists' pointers and strides (what the loader and the writers walk; none for a
        range)."""
        return [name for role in self.list_roles() for name in (f"{role}_ptr", *self.strides(role))]

    def walk_params(self, annotated: bool = True) -> list[str]:
        """What a partition needs to find its steps besides (batch, kv_head, group_size): the
        query range's first block and block count, or the program's key block (listed: the
        lists' pointers come as well, `list_pointer_params`, or among the consumer's)."""
        if self.listed:
            return ["block_id"]
        return ["q_start" if annotated else self.namer[self.loops[0].op.lower], "n_blocks"]

    def list_entry(self, entries: list[tuple[str, str]], step: str) -> list[str]:
        """For each (`what`, `target`) of `entries`: `target` = the entry of the lists' `what`
        ("blocks" or "rank") for step `step`, from the first list for the first `bound_1` steps,
        then from the second (one test for them all), each list walked from its last entry
        down (lists hold query blocks in ascending order): as the range walk, every key block
        then starts at its highest query block, so that under a causal band the key blocks
        reach each query block together and an ordered add waits for one handover, not for
        every lower key block's walk up to it."""
        after = "" if step == "0" else f" - {step if step.isidentifier() else f'({step})'}"

        def role(loop, what: str) -> str:
            return next(r for r in loop.list_roles if r.endswith(f"_{what}"))

        def loads(loop, last: str) -> list[str]:
            return [f"{target} = tl.load({role(loop, what)}_base + ({last}{after}) * stride_{role(loop, what)}_d)"
                    for what, target in entries]

        if len(self.loops) == 1:
            return loads(self.loops[0], "n_steps - 1")
        first, second = self.loops
        return [f"if {step} < bound_1:", *["    " + line for line in loads(first, "bound_1 - 1")],
                "else:", *["    " + line for line in loads(second, "n_steps - 1")]]

    def head_lists(self, counts_only: bool = False) -> list[str]:
        """In a listed walk, at each head of the group: its lists' bases (with `counts_only`,
        the counts' alone), `bound_1` (the first list's count) and `n_steps` (the counts' sum)."""
        counts = [next(r for r in loop.list_roles if r.endswith("_count")) for loop in self.loops]
        lines = [self.base_line(role) for role in (counts if counts_only else self.list_roles())]
        names = []
        for i, role in enumerate(counts):
            name = "bound_1" if i == 0 and len(counts) > 1 else f"count_{i}"
            lines.append(f"{name} = tl.load({role}_base)")
            names.append(name)
        return [*lines, f"n_steps = {' + '.join(names)}"]

    def walk(self, body: list[str], ranked: bool = False, ahead: bool = True) -> list[str]:
        """A partition's loop over its steps around `body` (lines at indent 0): each step's
        `it` (its index over the program's steps), `head` and `start_m` (with `ranked`, its
        `rank` too). A range: the steps' (head, start_m) carried from step to step
        (`STEP_INIT`, `STEP_NEXT`). Lists: head by head of the group, the entries of the head's
        lists (their counts differ by head under a per-head block layout), `it` counted across
        them; with `ahead`, each step's entries are read during the step before (the loader's
        and the writers' partitions, whose next wait would otherwise follow the load), else at
        the step (the consumer, whose load the wait for the step's data follows anyway, and
        whose registers a carried entry would cost: its hot loop spilled more)."""
        if not self.listed:
            return [*self.STEP_INIT, "for it in range(total):", *["    " + line for line in body],
                    *["    " + line for line in self.STEP_NEXT]]
        entries = [("blocks", "start_m"), *([("rank", "rank")] if ranked else [])]
        head = ["# tile.sparse_q_loop: head by head of the group, the entries of the head's lists for this",
                "# key block (the full blocks' first), as one pipelined range of steps"
                + ("; each step's entries are read a step ahead." if ahead else "."),
                "it = 0",
                "for head_in_group in range(group_size):",
                "    head = kv_head * group_size + head_in_group",
                *["    " + line for line in self.head_lists()]]
        if not ahead:
            return [*head,
                    "    for step in range(n_steps):",
                    *["        " + line for line in self.list_entry(entries, "step")],
                    "        start_m = start_m * BLOCK_N",
                    *["        " + line for line in body],
                    "        it += 1"]
        ahead_entries = [(what, f"next_{name}") for what, name in entries]
        return [*head,
                *[f"    next_{name} = 0" for _, name in entries],
                "    if n_steps > 0:",
                *["        " + line for line in self.list_entry(ahead_entries, "0")],
                "    for step in range(n_steps):",
                "        start_m = next_start_m * BLOCK_N",
                *(["        rank = next_rank"] if ranked else []),
                "        if step + 1 < n_steps:",
                *["            " + line for line in self.list_entry(ahead_entries, "step + 1")],
                *["        " + line for line in body],
                "        it += 1"]

    def range_bounds(self) -> list[str]:
        """The loops' bounds the consumer takes from the entry: a range's (`bound_i`); a listed
        walk reads them from the lists, head by head."""
        return [] if self.listed else self.bound_params()

    def probs_function(self) -> list[str]:
        """`<name>_probs(scores, lse_log2, ...)`: p^T of the block at `start_m` from the raw
        k q^T tile and lse times log2(e) (and the score tiles the gradient step reads)."""
        body = ["# The block's query loop decides its masks: " + "; ".join(
            f"loop {i} over {'partial query blocks: masked' if loop.masked else 'full query blocks'}"
            for i, loop in enumerate(self.loops))]
        body += self.STEP_HEADER
        body += self.step_body(self.probs_pieces)
        body.append("return " + ", ".join(["probs", *self.primal_names()]))
        params = ["scores", *self.row_statistic("lse_log2"), *self.step_params(), *self.bias_tiles(),
                  "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr", "S_LAYOUT: gl.constexpr"]
        return self.function(f"def {self.name}_probs({', '.join(params)}):",
                             ["    " + line if line else "" for line in body])

    @property
    def softmax(self) -> bool:
        """Whether the steps read lse and delta (else a pointwise normalizer: no row statistics
        are loaded, and the launch takes no descriptors for them)."""
        return self.parts.softmax

    def row_names(self, suffix: str) -> list[str]:
        """`lse<suffix>`, `delta<suffix>` (descriptors, ring buffers) where the kernel reads the
        row statistics, else nothing."""
        return [f"lse{suffix}", f"delta{suffix}"] if self.softmax else []

    def row_statistic(self, name: str) -> list[str]:
        """`[name]` where the steps read the softmax's row statistics, else nothing."""
        return [name] if self.softmax else []

    def grads_function(self) -> list[str]:
        """`<name>_grads(probs, grad_probs, delta, ...)`: ds^T of the block at `start_m`."""
        body = list(self.STEP_HEADER)
        body += self.step_body(self.grads_pieces)
        body.append("return grad_scores")
        params = ["probs", "grad_probs", *self.row_statistic("delta"), *self.primal_names(), *self.step_params(),
                  *self.gradient_store_params(), "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr",
                  "S_LAYOUT: gl.constexpr"]
        return self.function(f"def {self.name}_grads({', '.join(params)}):",
                             ["    " + line if line else "" for line in body])

    # -- partitions --------------------------------------------------------------------------

    STEP_INIT = [
        "# Each step's query head and block, carried from step to step (a division by the runtime",
        "# n_blocks costs two dozen instructions a step in the consumer's loop). The query blocks",
        "# run from the last down, every head of the group at each: programs started together",
        "# then reach a query block together, which adds in key-block order need (the ordered",
        "# dQ writer), and read the same q and dO rows at about the same time (L2).",
        "first_head = kv_head * group_size",
        "head = first_head",
        "start_m = q_start + (n_blocks - 1) * BLOCK_N",
    ]
    STEP_NEXT = [
        "# The next step: the next head of the group, or the first head at the block before.",
        "wrap = head + 1 >= first_head + group_size",
        "head = gl.where(wrap, first_head, head + 1)",
        "start_m = start_m - wrap.to(gl.int32) * BLOCK_N",
    ]
    """The (head, start_m) of step `it` (head `kv_head * group_size + it % group_size`, block
    `q_start + (n_blocks - 1 - it // group_size) * BLOCK_N`), before the loop and at the end
    of each step."""

    def loader(self) -> list[str]:
        rows = self.softmax
        body = [
            "# The producer: TMA copies only. k and v of the program's key block once, then q, dO"
            + (", lse and delta" if rows else ""),
            "# of each step's query block into the ring. Empty barriers start as if phase 1 had",
            "# completed, so the first round of waits passes.",
            "mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)",
            "tma_load(k_desc, [batch, kv_head, n_start, 0], kv_bar, k_smem)",
            "tma_load(v_desc, [batch, kv_head, n_start, 0], kv_bar, v_smem)",
            "step_bytes: gl.constexpr = (q_desc.block_type.nbytes + do_desc.block_type.nbytes"
            + (" + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)" if rows else ")"),
            *(["# Each head's lse / delta rows in the flat copies, padded to a multiple of 4 (16 bytes:",
               "# where a TMA copy may start; the runtime pads the copies of an Nq off that multiple).",
               f"n_rows = (n_q + {ROW_ALIGNMENT - 1}) // {ROW_ALIGNMENT} * {ROW_ALIGNMENT}"] if rows else []),
            *self.walk([
                "stage = it % STAGES",
                "phase = (it // STAGES) & 1",
                *(["row = (batch * num_heads * group_size + head) * n_rows + start_m  # in the flat lse / delta"] if rows else []),
                "mbarrier.wait(empty.index(stage), phase ^ 1)",
                "mbarrier.expect(ready.index(stage), step_bytes)",
                "tma_load(q_desc, [batch, head, start_m, 0], ready.index(stage), q_bufs.index(stage))",
                "tma_load(do_desc, [batch, head, start_m, 0], ready.index(stage), do_bufs.index(stage))",
                *(["tma_load(lse_desc, [row], ready.index(stage), lse_bufs.index(stage))",
                   "tma_load(delta_desc, [row], ready.index(stage), delta_bufs.index(stage))"] if rows else []),
            ]),
        ]
        params = ", ".join(self.load_args(annotated=True))
        return self.function(f"def {self.name}_load({params}):", ["    " + line for line in body])

    def load_args(self, annotated: bool = False) -> list[str]:
        """The loader partition's parameters (its arguments, with the entry's names)."""
        constexpr = ": gl.constexpr" if annotated else ""
        return ["q_desc", "k_desc", "v_desc", "do_desc", *self.row_names("_desc"), "k_smem", "v_smem", "q_bufs",
                "do_bufs", *self.row_names("_bufs"), "kv_bar", "ready", "empty", "batch", "kv_head", "n_start",
                *self.walk_params(annotated), *self.list_pointer_params(), "total", "n_q",
                "num_heads", "group_size", f"BLOCK_N{constexpr}", f"STAGES{constexpr}"]

    def dq_writer(self) -> list[str]:
        store_add = self.loops[0].store_add
        ordered = store_add.ordered
        waits = (["# In key-block order (deterministic): before its reduce, wait until every lower key",
                  "# block that visits the query block has added (the counter counts the adds made; the",
                  "# list entry's rank is this key block's turn), while the consumer still computes the"]
                 if self.listed else
                 ["# In key-block order (deterministic): before its reduce, wait until the key block before",
                  "# this one has added into the query block, where it visits it (the counter holds the",
                  "# key block that adds next), while the consumer still computes the"])
        order = [*waits[:-1], waits[-1] + " part; after the",
                 "# reduce's writes are done (store_wait only waits for its reads, which free the",
                 "# buffer), hand the block on. No proxy fence between the acquire and the reduce:",
                 "# the reduce is issued only once the loop has seen the handover, as in",
                 "# FlashAttention-3's deterministic backward (PTX's model asks for one; Gluon 3.6",
                 "# has no call for it, and one through inline PTX measured the same)."] if ordered else \
                ["# (unordered between programs: not deterministic), off the consumer's path."]
        writers = self.dq_writers
        head = [
            f"# {store_add.name}: each step's dQ part added into {store_add.role} by a TMA reduce-add",
            *order,
            "# Per step: wait for a staged part, issue its reduce, wait until the copy engine has",
            "# read it, free the buffer.",
        ]
        if writers > 1:
            head += [f"# {writers} writers: writer WRITER owns staging buffer WRITER and the steps WRITER,",
                     f"# WRITER + {writers}, ...: one's hand-over overlaps the other's wait."]
        step: list[str] = [f"b = it % {DQ_BUFFERS}" if writers == 1 else "b = WRITER"]
        if ordered:
            role = store_add.order.type.role.data  # type: ignore[union-attr]
            turn = self.order_turn(store_add)
            step += [
                f"counter = {role}_ptr + batch * stride_{role}_b + head * stride_{role}_h + start_m * stride_{role}_n",
                f"if {self.order_waits(store_add)}:",
                f'    while gl.atomic_add(counter, 0, sem="acquire") != {turn}:',
                "        pass",
            ]
        step += [
            f"mbarrier.wait(dq_full.index(b), (it // {DQ_BUFFERS}) & 1)",
            "tma_reduce_add(dq_acc_desc, [batch, head, start_m, 0], dq_bufs.index(b))",
            "tma.store_wait(0)",
            "mbarrier.arrive(dq_empty.index(b), count=1)",
        ]
        if ordered:
            step += ["tma_writes_wait()  # the reduce's writes are done before the release publishes them",
                     f'gl.atomic_xchg(counter, {turn} + 1, sem="release")  # the next visitor adds next']
        if self.listed:
            # Every writer walks every step and takes its own; the entry's rank (how many lower
            # key blocks visit its query block) is this key block's turn.
            body = head + self.walk([f"if it % {writers} == WRITER:", *["    " + line for line in step]]
                                    if writers > 1 else step, ranked=ordered and self.ranked(store_add))
        elif writers == 1:
            body = head + self.walk(step)
        else:
            body = head + [*self.STEP_INIT, "if WRITER > 0:", *["    " + line for line in self.STEP_NEXT],
                           f"for it in range(WRITER, total, {writers}):", *["    " + line for line in step],
                           *["    " + line for _ in range(writers) for line in self.STEP_NEXT]]
        params = ", ".join(["dq_acc_desc", "dq_bufs", "dq_full", "dq_empty", "batch", "kv_head", *self.walk_params(),
                            *self.list_pointer_params(), "total", "group_size", *self.order_params(), "BLOCK_N: gl.constexpr",
                            *(["WRITER: gl.constexpr"] if writers > 1 else [])])
        return self.function(f"def {self.name}_dq_write({params}):", ["    " + line for line in body])

    @property
    def dq_writers(self) -> int:
        """The writer warps (`dq_writers`, 1 when absent): each owns one staging buffer."""
        return self.kernel.int_attr("dq_writers") or 1

    def order_params(self) -> list[str]:
        """The ordered writer's own parameters (none for unordered adds)."""
        store_add = self.loops[0].store_add
        if not store_add.ordered:
            return []
        role = store_add.order.type.role.data  # type: ignore[union-attr]
        if self.listed:
            return [f"{role}_ptr", *self.strides(role)]  # the turns come from the lists' ranks
        return [f"{role}_ptr", *self.strides(role), "block_id", "prev_q_end"]

    def step_args(self, extra: list[str] | tuple[str, ...] = ()) -> str:
        """A step function's arguments at the consumer's call: the shared ones, `extra` (that
        function's own), the tile sizes and the layout."""
        return ", ".join([*self.step_params(), *extra, "BLOCK_M", "BLOCK_N", "S_LAYOUT"])

    # -- the bias gradient -------------------------------------------------------------------

    def gradient_store_roles(self) -> list[str]:
        """The data gradients the gradient step stores (`dbias`, ...: `tile.store_scores`)."""
        return [role for role in self.roles if tile.role_kind(role) == "dbias"]

    def gradient_store_params(self) -> list[str]:
        """What the gradient step's stores need: the step's batch and head, and each gradient's
        pointer and strides (the store points `{role}_base` at the head's slice itself)."""
        roles = self.gradient_store_roles()
        if not roles:
            return []
        head = [] if self.head_param() else ["head"]  # (the step's own parameters may have it)
        return ["batch", *head, *[name for role in roles for name in (f"{role}_ptr", *self.strides(role))]]

    def emit_store_scores(self, op: tile.StoreScoresOp) -> None:
        """`tile.store_scores` of the gradient tile as it is at this point of the step, into
        `{role}[batch, head, query, key]` (int64 offsets: a full-size gradient can pass 2**31
        elements). Every loop's store is masked by both sequence ends, so the loops' steps
        print it alike and merge (a full block's queries are all in bounds anyway)."""
        role = self.role_of(op.dest)
        self.emit(f"# tile.store_scores: {role}[batch, head, query, key] for this block")
        self.emit(f"{role}_base = {role}_ptr + batch.to(tl.int64) * stride_{role}_b + head.to(tl.int64) * stride_{role}_h")
        self.emit(f"tl.store({self.score_pointers(role)}, {self.namer[op.value]}.to({role}_ptr.dtype.element_ty), "
                  "mask=row_in_bounds[:, None] & query_in_bounds[None, :])")

    def consumer(self) -> list[str]:
        first = self.loops[0]
        primal = self.primal_names()
        self.lines, self.indent = [], 1
        step = [
            "stage = it % STAGES",
            "phase = (it // STAGES) & 1",
            *[f"{self.slope_name(r)} = tl.load({r}_ptr + head)  # this head's ALiBi slope" for r in self.slope_roles()],
            "q_s = tile_2d(q_bufs.index(stage))",
            "do_s = tile_2d(do_bufs.index(stage))",
            "mbarrier.wait(ready.index(stage), phase)",
            f"# {first.scores.name} (s^T = k q^T) and {first.grad_probs.name} (dp^T = v dO^T), issued together",
            "scores = warpgroup_mma(k_tile, q_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            "grad_probs = warpgroup_mma(v_tile, do_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)",
            *self.bias_call(""),
            *(["# lse in log2 units (the exponent's), scaled as it is loaded, under the products",
               f"lse_log2 = lse_bufs.index(stage).load(gl.SliceLayout(0, S_LAYOUT)) * {LOG2E}"]
              if self.softmax else []),
            "# Groups complete in issue order: one outstanding means s^T is done.",
            "scores = warpgroup_mma_wait(1, deps=(scores,))",
            f"{', '.join(['probs', *primal])} = {self.name}_probs({', '.join(['scores', *self.row_statistic('lse_log2'), self.step_args(self.bias_tiles())])})",
            "# tile.accumulate: dV += p^T dO, issued before the wait for dp^T (ds^T is computed under it)",
            "p_op = gl.convert_layout(probs.to(dtype), A_LAYOUT)",
            "dv = warpgroup_mma(p_op, do_s, dv, is_async=True)",
            *(["delta = delta_bufs.index(stage).load(gl.SliceLayout(0, S_LAYOUT))"] if self.softmax else []),
            "grad_probs = warpgroup_mma_wait(1, deps=(grad_probs,))",
            f"grad_scores = {self.name}_grads({', '.join(['probs', 'grad_probs', *self.row_statistic('delta'), *primal, self.step_args(self.gradient_store_params())])})",
            "ds16 = grad_scores.to(dtype)",
            "# ds^T to shared memory for the dQ part (A = its transposed view): every warp's part",
            "# before the tensor cores read it (a fence for the async proxy, then a barrier).",
            "ds_smem.store(ds16)",
            "fence_async_shared()",
            "# tile.accumulate: dK += ds^T q",
            "ds_op = gl.convert_layout(ds16, A_LAYOUT)",
            "dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)",
            "thread_barrier()",
            "# tile.dot_lhs_transposed: the dQ part ds k",
            "dq_part = warpgroup_mma(ds_smem.permute((1, 0)), k_tile, dq_zero, use_acc=False, is_async=True)",
            "dv, dk, dq_part, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, dq_part, p_op, ds_op))",
            "# Every warpgroup's products on this stage are done before the loader may refill it.",
            "thread_barrier()",
            "mbarrier.arrive(empty.index(stage), count=1)",
            "# tile.store_add: staged for the writer partition's reduce",
            f"b = it % {DQ_BUFFERS}",
            f"mbarrier.wait(dq_empty.index(b), ((it // {DQ_BUFFERS}) & 1) ^ 1)",
            "tile_2d(dq_bufs.index(b)).store(dq_part)",
            "fence_async_shared()",
            "thread_barrier()  # every thread's part is in before the writer is told",
            "mbarrier.arrive(dq_full.index(b), count=1)",
        ]
        for line in [
            "# Two warpgroups (NW = 8 warps), each owning 64 of the block's keys; the products in",
            "# the key-major orientation, so p^T and ds^T come out of the tensor cores in the layout",
            "# of the A operand of dV and dK.",
            "S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_N, 16])",
            "KV_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, HEAD_DIM, 16])",
            "A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=KV_LAYOUT, k_width=2)",
            "# The dQ part has BLOCK_N query rows: the warpgroups split its columns.",
            "DQ_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, NW // 4], instr_shape=[16, HEAD_DIM // (NW // 4), 16])",
            "k_tile = tile_2d(k_smem)",
            "v_tile = tile_2d(v_smem)",
            "dtype: gl.constexpr = k_smem.dtype",
            "# tile.zeros: dK and dV",
            "dk = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=KV_LAYOUT)",
            "dv = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=KV_LAYOUT)",
            "s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_LAYOUT)",
            "dq_zero = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=DQ_LAYOUT)",
            "mbarrier.wait(kv_bar, 0)",
            *self.document_bases(),
            *self.walk(step, ahead=False),
        ]:
            self.emit(line)
        for loop in self.loops:
            self.namer.alias(loop.op.results[0], "dk")
            self.namer.alias(loop.op.results[1], "dv")
        self.epilogue()
        params = ["dk_desc", "dv_desc", *self.pointer_params(), "k_smem", "v_smem", "q_bufs", "do_bufs",
                  *self.row_names("_bufs"), "ds_smem", "dq_bufs", "kv_bar", "ready", "empty", "dq_full", "dq_empty", "batch",
                  "kv_head", *self.walk_params(), "total", "group_size", "n_start", *self.range_bounds(),
                  "sm_scale", "n_q", "n_k",
                  "BLOCK_M: gl.constexpr", "BLOCK_N: gl.constexpr", "HEAD_DIM: gl.constexpr", "STAGES: gl.constexpr",
                  "NW: gl.constexpr", *self.rotary_params()]
        return self.function(f"def {self.name}_consume({', '.join(params)}):", self.lines)

    def rotary_params(self) -> list[str]:
        return ["ROT_HALF: gl.constexpr", "BLOCK_HALF: gl.constexpr"] if self.splits_dk else []

    @property
    def splits_dk(self) -> bool:
        return any(isinstance(op, tile.SplitOp) for op in self.parts.epilogue)

    # -- the epilogue ------------------------------------------------------------------------

    def epilogue(self) -> None:
        """dK's scale, its inverse rotation and the stores, as the IR says them."""
        self.emit("# The epilogue. No product reads k's and v's buffers any more.")
        if self.splits_dk:
            self.emit("# The halves of a rotation are stored from registers in this layout:")
            self.emit("EPI_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [NW, 1], [1, 0])")
            self.emit("rows = n_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, EPI_LAYOUT))")
            self.emit("row_in_bounds = rows < n_k")
            self.emit("cols_half = gl.arange(0, BLOCK_HALF, layout=gl.SliceLayout(0, EPI_LAYOUT))")
            self.emit("dk_base = dk_ptr + batch.to(tl.int64) * stride_dk_b + kv_head.to(tl.int64) * stride_dk_h")
            for role in self.given_position_roles():
                self.emit(self.base_line(role))  # the batch's call-time positions
        stores = []
        for op in self.parts.epilogue:
            if isinstance(op, tile.StoreOp) and op.cols is not None and op.cols.data == "all":
                stores.append(op)
                continue
            if isinstance(op, tile.SplitOp):
                self.emit_split_halves(op)
                continue
            self.HANDLERS[type(op)](self, op)
        # Whole tiles last, through shared memory and TMA stores (clipped at the sequence end).
        buffers = {"dk": "k_smem", "dv": "v_smem"}
        for op in stores:
            self.emit(f"# tile.store: {op.role} rows (program), all columns, by TMA")
            self.emit(f"tile_2d({buffers[op.role]}).store({self.namer[op.value]}.to(dtype))")
        if stores:
            self.emit("fence_async_shared()")
            self.emit("thread_barrier()")
            for op in stores:
                self.emit(f"tma_store({op.role}_desc, [batch, kv_head, n_start, 0], {buffers[op.role]})")
            self.emit("tma.store_wait(0)")

    def given_position_roles(self) -> list[str]:
        """The call-time positions the epilogue's rotations read (dK's keys'), by role."""
        return sorted({self.role_of(op.given_positions) for op in self.parts.epilogue
                       if isinstance(op, tile.RotateOp) and op.given_positions is not None})

    def emit_split_halves(self, op: tile.SplitOp) -> None:
        """`tile.split` of a full-width tile into the two elements of every rotary pair: through
        the dQ staging buffers (f32, BLOCK_M rows in all), whose reduces are done by then. The
        halves (`half`) are column slices of the stored tile; even and odd dims (`interleaved`)
        are split in registers from a load of whole pairs."""
        value = self.namer[op.input]
        lo, hi = self.namer.define(op.lo), self.namer.define(op.hi)
        interleaved = op.pairs.data == "interleaved"
        what = "even and odd dims" if interleaved else "the halves of the rotary pairs"
        self.emit(f"# tile.split: full width into {what}, through shared memory")
        self.emit("# The writer's last reduce from each buffer is done: the k-th release of buffer b")
        self.emit("# completes phase k - 1 of its barrier; a buffer never used waits on nothing.")
        for b in range(DQ_BUFFERS):
            self.emit(f"mbarrier.wait(dq_empty.index({b}), ((total - {b} + {DQ_BUFFERS - 1}) // {DQ_BUFFERS} - 1) & 1)")
        # The two [BLOCK_N, HEAD_DIM] f32 staging buffers hold BLOCK_M rows of f32 (asserted
        # where the schedule is set); unswizzled, so that a view's elements are where the
        # tile's row-major order puts them.
        self.emit("halves = reinterpret_shared(dq_bufs, gl.float32, [BLOCK_M, HEAD_DIM], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))")
        self.emit(f"halves.store({value})")
        self.emit("thread_barrier()")
        if interleaved:
            # Each thread loads EPI_LAYOUT's columns of both elements of its pairs (8 adjacent
            # dims where EPI_LAYOUT holds 4), so splitting the pairs leaves every element where
            # EPI_LAYOUT has it: the layout change moves no data (asserted).
            self.emit("pairs = halves.load(gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0]))")
            self.emit(f"{lo}, {hi} = gl.split(gl.reshape(pairs, [BLOCK_M, ROT_HALF, 2]))")
            self.emit(f"{lo} = gl.convert_layout({lo}, EPI_LAYOUT, assert_trivial=True)")
            self.emit(f"{hi} = gl.convert_layout({hi}, EPI_LAYOUT, assert_trivial=True)")
        else:
            self.emit(f"{lo} = halves.slice(0, ROT_HALF, dim=1).load(EPI_LAYOUT)")
            self.emit(f"{hi} = halves.slice(ROT_HALF, ROT_HALF, dim=1).load(EPI_LAYOUT)")

    # -- the entry ---------------------------------------------------------------------------

    def entry(self) -> list[str]:
        k = self.kernel
        self.lines, self.indent = [], 1
        self.emit("dtype: gl.constexpr = q_desc.dtype")
        self.emit("# Program grid: one program per (batch x key/value head, block of BLOCK_M keys).")
        self.emit("block_id = tl.program_id(1)")
        self.emit("batch_head = tl.program_id(0)")
        self.emit("batch = batch_head // num_heads")
        self.emit("kv_head = batch_head % num_heads")
        self.emit("n_start = block_id * BLOCK_M")
        if self.listed:
            self.emit("# Steps: every entry of the lists of every head of the group.")
            self.emit("total = 0")
            self.emit("for head_in_group in range(group_size):")
            self.emit("    head = kv_head * group_size + head_in_group")
            for line in self.head_lists(counts_only=True):
                self.emit("    " + line)
            self.emit("    total += n_steps")
        else:
            self.HANDLERS[type(self.parts.bounds)](self, self.parts.bounds)
            q_start = self.namer[self.loops[0].op.lower]
            q_end = self.namer[self.loops[-1].op.upper]
            self.emit(f"n_blocks = ({q_end} - {q_start} + BLOCK_N - 1) // BLOCK_N")
            self.emit("total = group_size * n_blocks  # steps: every query block of every head of the group")
        self.emit("# Buffers in the descriptors' block shapes; the products read 2-D views.")
        self.emit("k_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, HEAD_DIM], k_desc.layout)")
        self.emit("v_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, HEAD_DIM], v_desc.layout)")
        self.emit("q_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], q_desc.layout)")
        self.emit("do_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], do_desc.layout)")
        for role in self.row_names(""):
            self.emit(f"{role}_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], {role}_desc.layout)")
        self.emit("DS_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)")
        self.emit("ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], DS_SMEM)")
        self.emit(f"dq_bufs = gl.allocate_shared_memory(gl.float32, [{DQ_BUFFERS}, 1, 1, BLOCK_N, HEAD_DIM], dq_acc_desc.layout)")
        self.emit("kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())")
        for bar, count in (("ready", "STAGES"), ("empty", "STAGES"), ("dq_full", DQ_BUFFERS), ("dq_empty", DQ_BUFFERS)):
            self.emit(f"{bar} = gl.allocate_shared_memory(gl.int64, [{count}, 1], mbarrier.MBarrierLayout())")
        self.emit("mbarrier.init(kv_bar, count=1)")
        self.emit("for i in gl.static_range(STAGES):")
        self.emit("    mbarrier.init(ready.index(i), count=1)")
        self.emit("    mbarrier.init(empty.index(i), count=1)")
        self.emit(f"for i in gl.static_range({DQ_BUFFERS}):")
        self.emit("    mbarrier.init(dq_full.index(i), count=1)")
        self.emit("    mbarrier.init(dq_empty.index(i), count=1)")
        bounds = [] if self.listed else [self.namer[loop.op.lower] for loop in self.loops[1:]]
        walk = self.walk_params(annotated=False)
        consume_args = ["dk_desc", "dv_desc", *self.pointer_params(), "k_smem", "v_smem", "q_bufs", "do_bufs",
                        *self.row_names("_bufs"), "ds_smem", "dq_bufs", "kv_bar", "ready", "empty", "dq_full",
                        "dq_empty", "batch", "kv_head", *walk, "total", "group_size",
                        "n_start", *bounds, "sm_scale", "n_q", "n_k",
                        "BLOCK_M", "BLOCK_N", "HEAD_DIM", "STAGES", "num_warps",
                        *(["ROT_HALF", "BLOCK_HALF"] if self.splits_dk else [])]
        load_args = self.load_args()
        write_args = ["dq_acc_desc", "dq_bufs", "dq_full", "dq_empty", "batch", "kv_head", *walk,
                      *self.list_pointer_params(), "total", "group_size", *self.order_params(), "BLOCK_N"]
        # Gluon takes the partitions as a literal list (a tuple built beforehand loses its
        # items' constexpr-ness): the consumer (the kernel's own warps), the loader, the writer.
        self.emit("gl.warp_specialize([")
        self.emit(f"    ({self.name}_consume, ({', '.join(consume_args)})),")
        self.emit(f"    ({self.name}_load, ({', '.join(load_args)})),")
        writers = self.dq_writers
        for writer in range(writers):
            self.emit(f"    ({self.name}_dq_write, ({', '.join(write_args + ([str(writer)] if writers > 1 else []))})),")
        producers = k.get("producer_warps")
        workers, registers = [producers] + [1] * writers, [24] * (1 + writers)
        self.emit(f"], {workers}, {registers})  # the loader and the writers issue TMA only")
        constexprs = [f"BLOCK_M: gl.constexpr = {k.get('block_m')}", f"BLOCK_N: gl.constexpr = {k.get('block_n')}",
                      f"HEAD_DIM: gl.constexpr = {self.head_dim}", f"STAGES: gl.constexpr = {k.get('num_stages')}"]
        if self.splits_dk:
            constexprs += [f"ROT_HALF: gl.constexpr = {self.rot_half}", f"BLOCK_HALF: gl.constexpr = {padded(self.rot_half)}"]
        params = ["q_desc", "k_desc", "v_desc", "do_desc", "dk_desc", "dv_desc", "dq_acc_desc",
                  *self.row_names("_desc"), *self.pointer_params(), "sm_scale", "n_q", "n_k", "num_heads", "group_size",
                  *constexprs, f"num_warps: gl.constexpr = {k.get('num_warps')}"]
        header = [f"def {self.name}(", *[f"    {p}," for p in params], "):"]
        return ["@gluon.jit", *header, *self.lines]


# The bias is loaded beside the step's products (`BiasBlocks`), its gradient stored masked alike
# in every loop (`emit_store_scores`).
GluonBackwardEmitter.HANDLERS = {**KernelEmitter.HANDLERS, tile.AddBiasOp: GluonBackwardEmitter.emit_add_bias,
                                 tile.StoreScoresOp: GluonBackwardEmitter.emit_store_scores}
