"""The flash shape of a forward `tile.kernel`: the analysis `warp-specialize`
(transforms/warp_specialize.py) schedules by and the Gluon target (lowering/gluon.py) prints
from, kept beside the dialect so that both layers read one definition.

A forward kernel has the flash shape when it loads q whole, initializes the online softmax,
bounds its key range, runs key loops over consecutive ranges, each carrying the previous one's
state and each

    load k whole; s = q @ k^T; score ops, each refining the previous tile (masks, maps, ALiBi,
    an additive bias, scales); load v; online-softmax step of the refined tile and the loop's
    row statistics; acc = acc * alpha + p @ v; yield (acc, row max, row sum)

then finalizes and stores that o and log-sum-exp. A pointwise normalizer (ReLU, sigmoid) has
the same shape without the softmax's state: the accumulator starts as `tile.zeros`, each loop
turns the refined scores into weights elementwise after the load of v (`NORMALIZER_OPS`) and
yields `acc + p @ v` alone, and the last loop's accumulator is stored as o (no log-sum-exp).
A block-sparse or document kernel has the same shape with key loops over block lists
(`tile.sparse_kv_loop`: the full blocks, then the partial ones, whose documents are told
apart by `tile.document_mask`) instead of key bounds and ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.ir import Operation, SSAValue

from attnfuse.dialects import tile
from attnfuse.errors import IRError

SCORE_OPS = (tile.MaskOp, tile.DocumentMaskOp, tile.MapOp, tile.AlibiOp, tile.AddBiasOp, tile.ApplyScaleOp)
"""Ops between `tile.scores` and `tile.softmax_update` a scheduled kernel may hold
(elementwise on the score tile; the bias is read block by block through its pointer, a
document filter's ids per query row and per key through theirs)."""

INDEX_OPS = (tile.PairPositionOp, tile.QueryHeadOp)
"""Index tiles that may sit among the score ops (a position-aware block's map reads them):
each entry's query or key position, or its query head, which the step computes from its rows."""

NORMALIZER_OPS = (tile.ReluProbsOp, tile.MapOp, tile.ApplyScaleOp)
"""A pointwise normalizer's ops between the load of v and `tile.accumulate`, each refining the
previous tile (ReLU's `relu(s) / Nk`, sigmoid's map of s and `-ln(Nk)`); `tile.seq_len`
scalars may sit among them."""

OPERAND_ROLES = ("q", "q_rot", "k", "k_rot", "v", "o")
"""Roles the producer copies (or the epilogue stores) by TMA: a pre-rotated copy may stand in
for q or k."""

POINTER_ROLES = ("lse",)
"""Other roles a scheduled kernel may take, besides ALiBi slopes and additive biases."""

LIST_ROLES = ("full_blocks", "full_count", "partial_blocks", "partial_count", "doc_ids")
"""What a listed kernel's loops read through pointers: the block lists (per program), and a
document filter's ids (per row)."""

POINTER_KINDS = ("slopes", "bias")
"""Kinds of indexed roles (`slopes_1`, `bias_1`, ...) a scheduled kernel reads through pointers."""

HEAD_DIMS = (64, 128, 256)
"""Head dims the forward's schedule covers: D is a whole number of warpgroup MMA steps, and a
query tile and two stages of k and v blocks fit in shared memory (128-key blocks up to head
dim 128, 64-key blocks at 256: `tile.KernelOp`'s verifier checks the bytes)."""

ELEMENT_TYPES = ("f16", "bf16")
"""What warpgroup MMAs take here."""


class NotFlashShaped(IRError):
    """Why a kernel has no warp-specialized schedule; `op` is the op at fault, or the kernel."""


@dataclass
class FlashLoop:
    """One key loop of a flash-shaped kernel, by the part of the schedule each op goes to."""

    op: tile.KVLoopOp | tile.SparseKVLoopOp
    k_load: tile.LoadOp
    scores: tile.ScoresOp
    score_ops: list[Operation]
    v_load: tile.LoadOp
    update: tile.SoftmaxUpdateOp | None
    """The online-softmax step; None under a pointwise normalizer (`weights`)."""
    accumulate: tile.AccumulateOp
    weights: list[Operation] = field(default_factory=list)
    """A pointwise normalizer's ops (`NORMALIZER_OPS` and the `tile.seq_len`s they read), in
    order; empty under the softmax."""


@dataclass
class FlashKernel:
    """A flash-shaped forward kernel's parts."""

    kernel: tile.KernelOp
    q_load: tile.LoadOp
    init: tile.SoftmaxInitOp | tile.ZerosOp
    bounds: tile.KVBoundsOp | None
    """None in a block-sparse kernel: its loops walk block lists."""
    loops: list[FlashLoop]
    finalize: tile.SoftmaxFinalizeOp | None
    """None under a pointwise normalizer: the last loop's accumulator is o."""
    o_store: tile.StoreOp
    lse_store: tile.StoreOp | None

    @property
    def softmax(self) -> bool:
        """Whether the kernel runs the online softmax (else a pointwise normalizer)."""
        return self.finalize is not None

    @property
    def listed(self) -> bool:
        """Whether the key loops walk block lists (`tile.sparse_kv_loop`), not a key range."""
        return self.bounds is None

    @property
    def operands(self) -> tuple[str, str, str, str]:
        """The roles of q, k, v and o (copied or stored by TMA)."""
        first = self.loops[0]
        return (self.q_load.role, first.k_load.role, first.v_load.role, self.o_store.role)


def refuse(kernel: tile.KernelOp, op: Operation | None, why: str) -> NotFlashShaped:
    """The `NotFlashShaped` naming the kernel, the op at fault (or the kernel) and why."""
    where = f" ({op.name})" if op is not None else ""
    return NotFlashShaped(f"{kernel.sym_name.data}{where}: {why}", op if op is not None else kernel)


def check_schedulable(kernel: tile.KernelOp, what: str, names: tuple[str, ...], grid: str,
                      head_dims: tuple[int, ...] = HEAD_DIMS) -> None:
    """`NotFlashShaped` unless `kernel` is `what`, a kernel of `names` on `grid`, of an element type and
    a head dim of `head_dims` (what the forward and the fused backward analyses both ask first)."""
    if kernel.grid != grid or kernel.sym_name.data not in names:
        raise refuse(kernel, None, f"only {what} ({' or '.join(names)}, {grid} grid) has this shape")
    if kernel.elem not in ELEMENT_TYPES:
        raise refuse(kernel, None, f"element type {kernel.elem}: warpgroup MMAs take f16 or bf16 here")
    dim, dim_v = kernel.get("head_dim"), kernel.get("head_dim_v")
    if dim not in head_dims or dim_v != dim:
        raise refuse(kernel, None, f"head dim {dim}/{dim_v}: the schedule covers {head_dims}")


def refining_chain(kernel: tile.KernelOp, it, first_value, kinds, what: str, scalars: tuple = (),
                   earlier: tuple = ()) -> tuple[list[Operation], object, Operation | None]:
    """The ops of `kinds` (and of `scalars`, such as `tile.seq_len`, which may sit among them)
    that `it` yields next, each op of `kinds` refining the previous one's result starting from
    `first_value`, the last value, and the op after them. A map reads the tile it refines first;
    its other inputs are vectors and scalars, never an earlier tile of the chain (`earlier` and
    those refined since): the warp-specialized step prints every tile of the chain as the one
    variable `scores`. The consumer hands each step one tile, so any other order is
    `NotFlashShaped` (`what`: the chain's name)."""
    ops: list[Operation] = []
    chain = first_value
    tiles = {*earlier, first_value}
    op = next(it, None)
    while isinstance(op, kinds + scalars):
        if not isinstance(op, scalars):
            source = op.inputs[0] if isinstance(op, tile.MapOp) else op.input
            if source is not chain:
                raise refuse(kernel, op, f"{what} must refine the previous tile, in order")
            if isinstance(op, tile.MapOp) and any(v in tiles for v in op.inputs[1:]):
                raise refuse(kernel, op, "a map of the scores may read the tile it refines, but no earlier "
                                         "score tile")
            chain = op.result
            tiles.add(chain)
        ops.append(op)
        op = next(it, None)
    return ops, chain, op


def _whole(load: Operation) -> bool:
    return isinstance(load, tile.LoadOp) and load.cols is not None and load.cols.data == "all"


def flash_loop(kernel: tile.KernelOp, loop: tile.KVLoopOp | tile.SparseKVLoopOp) -> FlashLoop:
    """The parts of one key loop, or `NotFlashShaped`."""
    it = iter(loop.body.block.ops)

    def take(kind: type[Operation], what: str) -> Operation:
        op = next(it, None)
        if not isinstance(op, kind):
            raise refuse(kernel, op, f"expected {what} here in the key loop")
        return op

    k_load = take(tile.LoadOp, "the load of k")
    if k_load.role not in ("k", "k_rot") or not _whole(k_load):
        raise refuse(kernel, k_load, "keys must be loaded whole (no rotation in the kernel)")
    scores = take(tile.ScoresOp, "tile.scores")
    if len(scores.queries) != 1 or scores.keys[0] is not k_load.result:
        raise refuse(kernel, scores, "one q @ k^T product of the loaded tiles")
    score_ops, chain, op = refining_chain(kernel, it, scores.result, SCORE_OPS, "score ops", scalars=INDEX_OPS)
    if not isinstance(op, tile.LoadOp) or op.role != "v" or not _whole(op):
        raise refuse(kernel, op, "score ops are masks, document filters, maps, ALiBi, biases and scales, "
                                 "then the load of v")
    v_load = op
    if len(loop.body.block.args) == 1:
        return pointwise_loop(kernel, loop, it, k_load, scores, score_ops, chain, v_load)
    update = take(tile.SoftmaxUpdateOp, "tile.softmax_update")
    acc, row_max, row_sum = loop.body.block.args
    if update.scores is not chain or update.row_max is not row_max or update.row_sum is not row_sum:
        raise refuse(kernel, update, "the softmax step reads the refined scores and the loop's row statistics")
    accumulate = take(tile.AccumulateOp, "tile.accumulate")
    if (accumulate.value is not v_load.result or accumulate.probs is not update.probs
            or accumulate.alpha is not update.alpha or accumulate.acc is not acc):
        raise refuse(kernel, accumulate, "acc * alpha + p @ v of the loop's accumulator and the softmax step's p")
    end = take(tile.YieldOp, "tile.yield")
    if list(end.operands) != [accumulate.result, update.new_row_max, update.new_row_sum]:
        raise refuse(kernel, end, "the loop carries the accumulator, row max and row sum, in that order")
    return FlashLoop(loop, k_load, scores, score_ops, v_load, update, accumulate)


def pointwise_loop(kernel: tile.KernelOp, loop: tile.KVLoopOp | tile.SparseKVLoopOp, it, k_load: tile.LoadOp, scores: tile.ScoresOp,
                   score_ops: list[Operation], chain: SSAValue, v_load: tile.LoadOp) -> FlashLoop:
    """The rest of a key loop under a pointwise normalizer (it carries the accumulator alone),
    after the load of v: the weights (`NORMALIZER_OPS`, refining the scores), `acc + p @ v`,
    the yield."""
    scores_in = chain
    earlier = (scores.result, *(o.result for o in score_ops))
    weights, chain, op = refining_chain(kernel, it, chain, NORMALIZER_OPS, "a pointwise normalizer's ops",
                                        scalars=(tile.SeqLenOp,), earlier=earlier)
    if chain is scores_in:
        raise refuse(kernel, op, "a loop carrying the accumulator alone needs a pointwise normalizer "
                                 "(relu, sigmoid) after the load of v")
    accumulate = op
    if (not isinstance(accumulate, tile.AccumulateOp) or accumulate.value is not v_load.result
            or accumulate.probs is not chain or accumulate.alpha is not None
            or accumulate.acc is not loop.body.block.args[0]):
        raise refuse(kernel, accumulate, "acc + p @ v of the loop's accumulator and the normalizer's weights")
    end = next(it, None)
    if not isinstance(end, tile.YieldOp) or list(end.operands) != [accumulate.result]:
        raise refuse(kernel, end, "the loop carries the accumulator")
    return FlashLoop(loop, k_load, scores, score_ops, v_load, None, accumulate, weights)


def chained_loops(kernel: tile.KernelOp, loops: list, carried: list[SSAValue], what: str,
                  state: str) -> list[SSAValue]:
    """Check that `loops` (each with its loop op as `.op`) run one after another: each starts
    from the previous one's results (the first from `carried`) over the range after the
    previous one's; returns the last loop's results. `what` and `state` name the loops and
    what they carry in the refusal."""
    for loop in loops:
        if list(loop.op.inits) != carried:
            raise refuse(kernel, loop.op, f"{what} must chain {state}")
        carried = list(loop.op.results)
    for before, after in zip(loops, loops[1:]):
        if isinstance(after.op, (tile.SparseKVLoopOp, tile.SparseQLoopOp)):
            continue  # lists, not ranges: `listed_loops` checks them
        if after.op.lower is not before.op.upper:
            raise refuse(kernel, after.op, f"{what} must cover consecutive ranges")
    return carried


def listed_loops(kernel: tile.KernelOp, loops: list, lists: tuple[str, str] = ("full_blocks", "partial_blocks")) -> None:
    """A listed kernel's loops (each with its loop op as `.op`): the full blocks' list
    (unmasked), then the partial blocks' (masked), each at most once: the schedule walks them
    as one range of steps, the first list's entries first. `lists` names the two lists (the
    forward's key lists, or the backward's query lists)."""
    roles = [(loop.op.blocks.type.role.data, loop.op.masked is not None) for loop in loops]  # type: ignore[union-attr]
    expected = [(lists[0], False), (lists[1], True)]
    if roles not in (expected, expected[:1], expected[1:]):
        raise refuse(kernel, loops[0].op, "the block lists are walked full blocks (unmasked) then partial "
                                          "blocks (masked), each once")


def flash_kernel(kernel: tile.KernelOp) -> FlashKernel:
    """The parts of a flash-shaped forward kernel, or `NotFlashShaped` saying why not."""
    check_schedulable(kernel, "the forward kernel", ("attention_fwd",), "query_blocks")
    ops = list(kernel.body.block.ops)
    if isinstance(ops[0], tile.LoadOp) and not _whole(ops[0]):
        raise refuse(kernel, ops[0], "the query must be loaded whole (no rotation in the kernel)")
    softmax = len(ops) < 2 or not isinstance(ops[1], tile.ZerosOp)
    # A block-sparse kernel's loops walk lists: no key bounds before them.
    listed = len(ops) > 2 and isinstance(ops[2], tile.SparseKVLoopOp)
    bounds_kind = [] if listed else [tile.KVBoundsOp]
    loop_kind = tile.SparseKVLoopOp if listed else tile.KVLoopOp
    bounds_what = "" if listed else "key bounds, "
    if softmax:
        head = [tile.LoadOp, tile.SoftmaxInitOp, *bounds_kind]
        tail = [tile.SoftmaxFinalizeOp, tile.StoreOp, tile.StoreOp, tile.ReturnOp]
        shape = f"expected q load, softmax init, {bounds_what}key loops, finalize, stores"
    else:
        head = [tile.LoadOp, tile.ZerosOp, *bounds_kind]
        tail = [tile.StoreOp, tile.ReturnOp]
        shape = f"expected q load, zeros, {bounds_what}key loops, the store of o (a pointwise normalizer)"
    for op, kind in zip(ops, head + [loop_kind] * (len(ops) - len(head) - len(tail)) + tail):
        if not isinstance(op, kind):
            raise refuse(kernel, op, shape)
    if len(ops) < len(head) + len(tail) + 1:
        raise refuse(kernel, None, shape)
    q_load, init, bounds = ops[0], ops[1], (None if listed else ops[2])
    if q_load.role not in ("q", "q_rot"):
        raise refuse(kernel, q_load, "the first load must be the query's")
    loops = [flash_loop(kernel, op) for op in ops[len(head):-len(tail)]]
    for loop in loops:
        if loop.scores.queries[0] is not q_load.result:
            raise refuse(kernel, loop.scores, "the scores read the loaded query")
        if (loop.update is None) == softmax:
            raise refuse(kernel, loop.op, "every key loop runs the kernel's normalizer")
    carried = chained_loops(kernel, loops, list(init.results), "key loops",
                            "their accumulator and row statistics" if softmax else "their accumulator")
    if listed:
        listed_loops(kernel, loops)
    if softmax:
        finalize, o_store, lse_store = ops[-4], ops[-3], ops[-2]
        if list(finalize.operands) != carried:
            raise refuse(kernel, finalize, "finalize must read the last loop's state")
        if o_store.role != "o" or lse_store.role != "lse" or o_store.value is not finalize.output \
                or lse_store.value is not finalize.lse:
            raise refuse(kernel, o_store, "stores of finalize's o and lse")
    else:
        finalize, lse_store, o_store = None, None, ops[-2]
        if o_store.role != "o" or o_store.value is not carried[0]:
            raise refuse(kernel, o_store, "the store of the last loop's accumulator as o")
    parts = FlashKernel(kernel, q_load, init, bounds, loops, finalize, o_store, lse_store)
    pointer_roles = POINTER_ROLES + (LIST_ROLES if listed else ())
    for role in kernel.roles:
        if role not in parts.operands and role not in pointer_roles and tile.role_kind(role) not in POINTER_KINDS:
            raise refuse(kernel, None, f"role {role} has no place in the schedule")
    return parts


__all__ = ["LIST_ROLES", "FlashKernel", "FlashLoop", "NotFlashShaped", "flash_kernel", "flash_loop", "listed_loops",
           "pointwise_loop"]
