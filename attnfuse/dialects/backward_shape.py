"""The shape of the fused backward's `attention_bwd_dkdv_dq` kernel (`lower-to-tile{bwd-dq=fused}`):
the analysis a warp-specialized (Gluon, Hopper) backward schedules by, the backward's
counterpart of `flash_shape.flash_kernel`.

A kernel has the fused-backward shape when it loads its key block (k, v) whole, zeroes dK and
dV, bounds its query range and runs query loops over consecutive ranges (or, under block
lists, runs the loops over its full and then its partial query-block list), each carrying
(dK, dV) and each

    load q, dO whole, lse, delta; s^T = k @ q^T; score ops refining the previous tile (masks,
    maps, ALiBi, scales); p^T = recompute_probs; dp^T = v @ dO^T; ds^T = softmax_grad;
    VJP ops refining ds^T (maps, scales: the chain's derivatives), the bias gradient's
    stores among them (`tile.store_scores` of the gradient tile as it is there); dV += p^T dO;
    dK += ds^T q; dq_part = ds k (dot_lhs_transposed); store_add dq_part into dq_acc;
    yield (dK, dV)

then scales dK, optionally rotates it back (RoPE, pre-rotated backward) and stores dK and dV.
These are the parts of the hand-written probe's consumer (bench/gluon_backward_probe.py).

A pointwise normalizer (ReLU, sigmoid) has the same shape without the row statistics: no
loads of lse and delta; p^T is the last of the ops refining the scores (the normalizer's:
`tile.relu_probs`, sigmoid's map, with the `tile.seq_len` scalars they read among them); and
the normalizer's own derivative (`tile.relu_grad` of the refined scores, or a map of p^T and
dP^T) stands where `tile.softmax_grad` does, reading dP^T last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.ir import Operation, SSAValue

from attnfuse.dialects import tile
from attnfuse.dialects.flash_shape import (
    INDEX_OPS,
    NORMALIZER_OPS,
    POINTER_KINDS,
    SCORE_OPS,
    chained_loops,
    check_schedulable,
    listed_loops,
    refining_chain,
    refuse,
)

BACKWARD_HEAD_DIMS = (64, 128)
"""Head dims the fused backward's schedule covers: at 256 its q/dO ring and dQ staging exceed
Hopper's shared memory (the portable backward runs there)."""

VJP_OPS = (tile.MapOp, tile.ApplyScaleOp, tile.MaskOp)
"""Ops between `tile.softmax_grad` and the dK accumulate: the score chain's derivatives,
elementwise on the score-gradient tile."""

POINTWISE_GRAD_OPS = (tile.ReluGradOp, tile.MapOp)
"""A pointwise normalizer's derivative, the first op of the gradient step where the softmax
has `tile.softmax_grad`: ReLU's, or a map (sigmoid: `(p, dp) -> dp * p * (1 - p)`)."""

GRADIENT_STORES = (tile.StoreScoresOp,)
"""Ops among the VJP ops that store the gradient tile as it is there (an additive bias's
gradient, in `attention_bwd_dkdv_dq_bias`)."""

FUSED_BACKWARD_KERNELS = ("attention_bwd_dkdv_dq", "attention_bwd_dkdv_dq_bias")
"""The fused backward's dK/dV kernels (`lower_backward.build_fused_backward_kernels`): the
second, which also stores the bias gradient, exists for a variant with a bias."""

EPILOGUE_OPS = (tile.ApplyScaleOp, tile.SplitOp, tile.RotateOp, tile.StoreOp)
"""What follows the query loops: dK's scale, its inverse rotation (RoPE) and the stores."""


@dataclass
class BackwardLoop:
    """One query loop of a fused backward kernel, by the part of the schedule each op goes to."""

    op: tile.QLoopOp
    q_load: tile.LoadOp
    do_load: tile.LoadOp
    lse_load: tile.LoadOp | None
    """None under a pointwise normalizer (as `delta_load`)."""
    delta_load: tile.LoadOp | None
    scores: tile.ScoresOp
    score_ops: list[Operation]
    """The ops refining the scores before `probs`, with the index tiles among them
    (`flash_shape.INDEX_OPS`; under a pointwise normalizer, its own ops but the last and the
    `tile.seq_len`s they read, too)."""
    probs: Operation
    """`tile.recompute_probs`, or a pointwise normalizer's last op (whose result is p^T)."""
    grad_probs: tile.DotTransposedOp
    grad_scores: Operation
    """dS^T of dP^T through the normalizer: `tile.softmax_grad`, or one of `POINTWISE_GRAD_OPS`."""
    vjp_ops: list[Operation]
    """The VJP ops in order, with the gradient stores (`GRADIENT_STORES`) among them."""
    dv_accumulate: tile.AccumulateOp
    dk_accumulate: tile.AccumulateOp
    dq_part: tile.DotLhsTransposedOp
    store_add: tile.StoreAddOp

    @property
    def masked(self) -> bool:
        """Whether the loop's blocks need their masks (the partial blocks of a band or a list)."""
        return self.op.masked is not None

    @property
    def list_roles(self) -> list[str]:
        """The roles of the block list the loop walks, its count and its ranks (none for a range)."""
        if not isinstance(self.op, tile.SparseQLoopOp):
            return []
        values = [self.op.blocks, self.op.count, *([] if self.op.ranks is None else [self.op.ranks])]
        return [v.type.role.data for v in values]  # type: ignore[union-attr]

    @property
    def softmax(self) -> bool:
        """Whether p^T is recomputed from lse (else a pointwise normalizer's)."""
        return self.lse_load is not None

    @property
    def gradient_ops(self) -> list[Operation]:
        """The gradient step's ops in order: the normalizer's derivative, then the VJP ops."""
        return [self.grad_scores, *self.vjp_ops]


@dataclass
class BackwardKernel:
    """A fused backward kernel's parts."""

    kernel: tile.KernelOp
    k_load: tile.LoadOp
    v_load: tile.LoadOp
    bounds: Operation | None
    """`tile.q_bounds`, or None where the loops walk block lists (`tile.sparse_q_loop`)."""
    loops: list[BackwardLoop]
    epilogue: list[Operation] = field(default_factory=list)

    @property
    def listed(self) -> bool:
        """Whether the query loops walk block lists (documents, block sparsity), not a range."""
        return self.bounds is None

    @property
    def operands(self) -> tuple[str, str, str, str]:
        """The roles of q, k, v and dO (copied by TMA)."""
        first = self.loops[0]
        return (first.q_load.role, self.k_load.role, self.v_load.role, first.do_load.role)

    @property
    def softmax(self) -> bool:
        """Whether the loops recompute p^T from lse and read delta (else a pointwise normalizer)."""
        return self.loops[0].softmax


def _whole(op: Operation | None, roles: tuple[str, ...]) -> bool:
    return (isinstance(op, tile.LoadOp) and op.role in roles and op.cols is not None
            and op.cols.data == "all")


def gradient_operand(op: Operation) -> SSAValue:
    """The gradient tile a gradient-step op refines: a map's last input (its primal inputs come
    first), the `grad_probs` of a normalizer's derivative, else the op's input."""
    if isinstance(op, tile.MapOp):
        return op.inputs[-1]
    if isinstance(op, (tile.SoftmaxGradOp, tile.ReluGradOp)):
        return op.grad_probs
    return op.input


def primal_operands(op: Operation) -> list[SSAValue]:
    """What a gradient-step op reads from the probability step besides the gradient: a map's
    other inputs, ReLU's refined scores (the softmax's p^T and delta are the step's own)."""
    if isinstance(op, tile.MapOp):
        return list(op.inputs[:-1])
    if isinstance(op, tile.ReluGradOp):
        return [op.scores]
    return []


def _pointwise_weights(kernel: tile.KernelOp, it, scores: tile.ScoresOp
                       ) -> tuple[list[Operation], Operation, Operation | None]:
    """Under a pointwise normalizer: the ops refining the scores up to p^T (score ops, then the
    normalizer's; `tile.seq_len` scalars among them), as (the ops before p^T, p^T's op, the op
    after them). Which of them is the normalizer the gradient step says (`tile.relu_grad` or
    the map reading p^T); here p^T is the last."""
    ops, _, op = refining_chain(kernel, it, scores.result, SCORE_OPS + NORMALIZER_OPS, "score and normalizer ops",
                                scalars=(tile.SeqLenOp, *INDEX_OPS))
    refining = [o for o in ops if not isinstance(o, (tile.SeqLenOp, *INDEX_OPS))]
    if not refining or isinstance(refining[-1], tile.MaskOp):
        raise refuse(kernel, op, "without lse and delta, the loop needs a pointwise normalizer (relu, sigmoid) "
                                 "turning the scores into p^T")
    probs = refining[-1]
    return [o for o in ops if o is not probs], probs, op


def backward_loop(kernel: tile.KernelOp, loop: Operation, k, v) -> BackwardLoop:
    """The parts of one query loop, or `NotFlashShaped`."""
    if not isinstance(loop, (tile.QLoopOp, tile.SparseQLoopOp)):
        raise refuse(kernel, loop, "query loops (over a range or a block list)")
    it = iter(loop.body.block.ops)

    def take(kind: type[Operation], what: str, op: Operation | None = None) -> Operation:
        op = next(it, None) if op is None else op
        if not isinstance(op, kind):
            raise refuse(kernel, op, f"expected {what} here in the query loop")
        return op

    q_load = take(tile.LoadOp, "the load of q")
    if not _whole(q_load, ("q", "q_rot")):
        raise refuse(kernel, q_load, "queries must be loaded whole (no rotation in the kernel)")
    do_load = take(tile.LoadOp, "the load of dO")
    if not _whole(do_load, ("do",)):
        raise refuse(kernel, do_load, "dO must be loaded whole")
    # The row statistics (lse, delta) come next under the softmax; a pointwise normalizer reads none.
    op = next(it, None)
    lse_load = delta_load = None
    if isinstance(op, tile.LoadOp):
        lse_load = op
        delta_load = take(tile.LoadOp, "the load of delta")
        if lse_load.role != "lse" or delta_load.role != "delta":
            raise refuse(kernel, lse_load, "the row statistics are lse then delta (softmax)")
        op = None
    scores = take(tile.ScoresOp, "tile.scores", op)
    # The transposed product: the score tile's rows are the program's keys, so the op's
    # first (row) operand is k and its second q.
    if len(scores.queries) != 1 or scores.queries[0] is not k or scores.keys[0] is not q_load.result:
        raise refuse(kernel, scores, "one k @ q^T product of the loaded tiles")
    if lse_load is not None:
        # Index tiles (a position-aware block's map reads them) may sit among the score ops.
        score_ops, chain, op = refining_chain(kernel, it, scores.result, SCORE_OPS, "score ops", scalars=INDEX_OPS)
        probs = take(tile.RecomputeProbsOp, "tile.recompute_probs (softmax)", op)
        if probs.scores is not chain or probs.lse is not lse_load.result:
            raise refuse(kernel, probs, "the probabilities of the refined scores and the loop's lse")
        op = None
    else:
        score_ops, probs, op = _pointwise_weights(kernel, it, scores)
    # Values of the probability step the gradient step may read (primal tiles, seq_len scalars).
    step_values = [scores.result, probs.result] + [o.result for o in score_ops]
    grad_probs = take(tile.DotTransposedOp, "tile.dot_transposed", op)
    if grad_probs.lhs is not v or grad_probs.rhs is not do_load.result:
        raise refuse(kernel, grad_probs, "dP^T = v @ dO^T of the loaded tiles")
    grad_scores = take(tile.SoftmaxGradOp if lse_load is not None else POINTWISE_GRAD_OPS,
                       "the normalizer's gradient (tile.softmax_grad; tile.relu_grad or a map under a pointwise one)")
    if isinstance(grad_scores, tile.SoftmaxGradOp):
        if (grad_scores.probs is not probs.result or grad_scores.grad_probs is not grad_probs.result
                or grad_scores.delta is not delta_load.result):
            raise refuse(kernel, grad_scores, "dS^T of the loop's p^T, dP^T and delta")
    elif gradient_operand(grad_scores) is not grad_probs.result or any(
            x not in step_values for x in primal_operands(grad_scores)):
        raise refuse(kernel, grad_scores, "the normalizer's gradient reads dP^T last and, before it, only "
                                          "values of the probability step (the scores, p^T)")
    # The dV accumulate may sit before or among the VJP ops; take it where it is.
    vjp_ops: list[Operation] = []
    dv_accumulate = None
    chain = grad_scores.result
    op = next(it, None)
    while isinstance(op, VJP_OPS + GRADIENT_STORES + (tile.AccumulateOp,)):
        if isinstance(op, tile.AccumulateOp):
            if dv_accumulate is not None or op.probs is not probs.result:
                break
            dv_accumulate = op
        elif isinstance(op, GRADIENT_STORES):
            # The step refines one gradient tile in place: a store reads it as it is here.
            if op.value is not chain:
                raise refuse(kernel, op, "a gradient store reads the gradient tile as the VJP ops have "
                                         "refined it at that point")
            vjp_ops.append(op)
        else:
            # A map's VJP reads the primal score tiles it needs first and the gradient last
            # (softcap: (s, ds) -> ds * (1 - tanh(s / c)^2)).
            if gradient_operand(op) is not chain or any(x not in step_values for x in primal_operands(op)):
                raise refuse(kernel, op, "VJP ops must refine the previous gradient tile, in order")
            vjp_ops.append(op)
            chain = op.result
        op = next(it, None)
    dk_dv = loop.body.block.args
    if dv_accumulate is None or dv_accumulate.value is not do_load.result or dv_accumulate.acc is not dk_dv[1]:
        raise refuse(kernel, dv_accumulate or op, "dV += p^T dO of the loop's dV")
    dk_accumulate = take(tile.AccumulateOp, "the dK accumulate", op)
    if (dk_accumulate.probs is not chain or dk_accumulate.value is not q_load.result
            or dk_accumulate.acc is not dk_dv[0]):
        raise refuse(kernel, dk_accumulate, "dK += dS^T q of the loop's dK")
    dq_part = take(tile.DotLhsTransposedOp, "tile.dot_lhs_transposed (the fused backward's dQ part)")
    if dq_part.lhs is not chain or dq_part.rhs is not k:
        raise refuse(kernel, dq_part, "dQ part = dS k of the block's gradient and keys")
    store_add = take(tile.StoreAddOp, "tile.store_add into dq_acc")
    if store_add.value is not dq_part.result or store_add.role != "dq_acc" \
            or store_add.cols is None or store_add.cols.data != "all":
        raise refuse(kernel, store_add, "the whole dQ part added into dq_acc (no column parts)")
    end = take(tile.YieldOp, "tile.yield")
    if list(end.operands) != [dk_accumulate.result, dv_accumulate.result]:
        raise refuse(kernel, end, "the loop carries dK then dV")
    return BackwardLoop(loop, q_load, do_load, lse_load, delta_load, scores, score_ops, probs,
                        grad_probs, grad_scores, vjp_ops, dv_accumulate, dk_accumulate, dq_part,
                        store_add)


def backward_kernel(kernel: tile.KernelOp) -> BackwardKernel:
    """The parts of a fused backward kernel (`FUSED_BACKWARD_KERNELS`), or `NotFlashShaped`
    saying why not (the op at fault, or the kernel)."""
    check_schedulable(kernel, "the fused backward kernel", FUSED_BACKWARD_KERNELS, "key_blocks", BACKWARD_HEAD_DIMS)
    ops = list(kernel.body.block.ops)
    if len(ops) < 6:
        raise refuse(kernel, None, "expected k, v loads, dK/dV zeros, query bounds, query loops, epilogue")
    k_load, v_load = ops[0], ops[1]
    if not _whole(k_load, ("k", "k_rot")) or not _whole(v_load, ("v",)):
        raise refuse(kernel, k_load, "k then v, loaded whole (no rotation in the kernel)")
    if not (isinstance(ops[2], tile.ZerosOp) and isinstance(ops[3], tile.ZerosOp)):
        raise refuse(kernel, ops[2], "dK and dV start at zero")
    # Block lists (documents, block sparsity) give each key block its query blocks: no bounds.
    listed = isinstance(ops[4], tile.SparseQLoopOp)
    bounds = None if listed else ops[4]
    if not listed and not isinstance(bounds, tile.QBoundsOp):
        raise refuse(kernel, bounds, "the query range's bounds (tile.q_bounds), or loops over block lists")
    rest = ops[4:] if listed else ops[5:]
    n_loops = 0
    while n_loops < len(rest) and not isinstance(rest[n_loops], EPILOGUE_OPS + (tile.ReturnOp,)):
        n_loops += 1
    if n_loops == 0:
        raise refuse(kernel, rest[0], "expected query loops after the bounds")
    loops = [backward_loop(kernel, op, k_load.result, v_load.result) for op in rest[:n_loops]]
    if {isinstance(loop.op, tile.SparseQLoopOp) for loop in loops} != {listed}:
        raise refuse(kernel, next(loop.op for loop in loops if isinstance(loop.op, tile.SparseQLoopOp) != listed),
                     "the query loops walk one range (after tile.q_bounds) or block lists, not both")
    if listed:
        listed_loops(kernel, loops, ("full_q_blocks", "partial_q_blocks"))
    first = loops[0]
    for loop in loops[1:]:
        # One probability step and one gradient step serve every loop: they may differ by masks only.
        if (loop.softmax, loop.probs.name, loop.grad_scores.name) != (first.softmax, first.probs.name,
                                                                       first.grad_scores.name):
            raise refuse(kernel, loop.probs, "every query loop normalizes alike (softmax from lse, or the same "
                                             "pointwise normalizer and derivative)")
    ordered = {loop.store_add.ordered for loop in loops}
    if len(ordered) > 1:
        # The schedule's one dQ writer adds every step alike.
        unordered = next(loop.store_add for loop in loops if not loop.store_add.ordered)
        raise refuse(kernel, unordered, "the dQ parts of every query loop added alike: all in key-block order "
                                        "(in_order) or none")
    chained_loops(kernel, loops, [ops[2].results[0], ops[3].results[0]], "query loops", "dK and dV")
    epilogue = rest[n_loops:-1]
    for op in epilogue:
        if not isinstance(op, EPILOGUE_OPS):
            raise refuse(kernel, op, "after the loops: dK's scale and rotation, the stores of dK and dV")
    if not isinstance(rest[-1], tile.ReturnOp):
        raise refuse(kernel, rest[-1], "the kernel ends in tile.return")
    parts = BackwardKernel(kernel, k_load, v_load, bounds, loops, epilogue)
    # lse and delta only where the loops read them: the launch passes their descriptors by role.
    # Call-time RoPE positions: dK's inverse rotation reads the keys' (`tile.rotate`'s given
    # positions, in the epilogue); the queries' belong to dQ's, in the finish kernel, and are
    # only passed along.
    allowed = set(parts.operands) | {"dk", "dv", "dq_acc", "dq_order", "rope_table", "q_positions", "k_positions"}
    allowed |= {"lse", "delta"} if parts.softmax else set()
    # Block lists: each loop's list, its count and (ordered adds) its ranks, and a document
    # filter's ids, all read through pointers.
    allowed |= {role for loop in parts.loops for role in loop.list_roles} | {"doc_ids"}
    # ALiBi's slopes and additive biases (read in the probability step, `POINTER_KINDS`, as in
    # the forward), the biases' gradients (stored in the gradient step), all through pointers.
    for role in kernel.roles:
        if role not in allowed and tile.role_kind(role) not in (*POINTER_KINDS, "dbias"):
            raise refuse(kernel, None, f"role {role} has no place in the schedule")
    return parts


__all__ = ["BACKWARD_HEAD_DIMS", "FUSED_BACKWARD_KERNELS", "GRADIENT_STORES", "POINTWISE_GRAD_OPS", "BackwardKernel", "BackwardLoop", "backward_kernel", "backward_loop",
           "gradient_operand", "primal_operands"]
