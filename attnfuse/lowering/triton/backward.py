"""Printing the backward kernels' ops: recomputed probabilities and their gradients, the
transposed products, and `tile.store_add` (with its key-block order for a deterministic dQ)."""

from __future__ import annotations

from attnfuse.dialects import tile
from attnfuse.lowering.triton.core import COLUMN_COMMENT, EmitterCore
from attnfuse.lowering.triton.program import LOG2E, plus


class BackwardEmitter(EmitterCore):
    """The part of `KernelEmitter` that prints the backward kernels' ops."""

    def emit_store_add(self, op: tile.StoreAddOp) -> None:
        role = op.role
        cols = None if op.cols is None else op.cols.data
        ptrs, mask = self.block_pointer(role, op.rows.data, cols)
        order = "in key-block order" if op.ordered else "atomics: unordered"
        self.emit(f"# tile.store_add: added into {role} rows ({op.rows.data})"
                  + (f", {COLUMN_COMMENT[cols]}" if cols else "") + f" ({order})")
        masking = f", mask={mask}" if mask else ""
        value = self.namer[op.value]
        # The ordered adds of one step (one per column part of a rotation) share the query
        # block's counter: the first waits for it, the last hands the block on.
        step_adds = [o for o in op.parent_block().ops if isinstance(o, tile.StoreAddOp) and o.ordered] \
            if op.ordered else []
        if op.ordered and op is step_adds[0]:
            value = self.emit_order_wait(op, value)
        # Relaxed: the adds only need to be atomic (and, ordered, made before the handover,
        # which releases them); nothing reads dq_acc before the kernel ends.
        self.emit(f'tl.atomic_add({ptrs}, {value}{masking}, sem="relaxed")')
        if op.ordered and op is step_adds[-1]:
            self.emit("tl.debug_barrier()  # every thread's adds are made before the rows are handed on")
            self.emit(f'tl.atomic_xchg({self.order_counter_name}, {self.order_turn(op)} + 1, sem="release")'
                      "  # the next visitor adds next")

    def order_counter(self, op: tile.StoreAddOp) -> str:
        """The address of the counter that orders the step's adds into the loop's query
        block: its first row's in `dq_order`."""
        order = op.order
        assert order is not None and isinstance(order.type, tile.TensorType)
        role = order.type.role.data
        return f"{role}_base + {self.STEP_ROW} * stride_{role}_n"

    @staticmethod
    def ranked(op: tile.StoreAddOp) -> bool:
        """Whether the add's turn comes from its loop's ranks (a `tile.sparse_q_loop`'s): the
        counter then counts the adds made, else it holds the key block that adds next."""
        loop = op.parent_op()
        return isinstance(loop, tile.SparseQLoopOp) and loop.ranks is not None

    def order_turn(self, op: tile.StoreAddOp) -> str:
        """What the counter holds when this step's turn comes: the entry's rank (block lists),
        or the program's key block (a band's consecutive visitors)."""
        return "rank" if self.ranked(op) else "block_id"

    def order_waits(self, op: tile.StoreAddOp) -> str:
        """Whether a key block before the program's visits the loop's query block (then this
        program's add waits for it). Ranked: any lower visitor. A band: `prev_q_end` is the end
        of the previous key block's query range, whose start is at most this program's (the
        ranges move down the queries with the keys)."""
        if self.ranked(op):
            return "rank > 0"
        return f"(block_id > 0) & ({self.STEP_ROW} < prev_q_end)"

    def emit_order_wait(self, op: tile.StoreAddOp, value: str) -> str:
        """Before the step's first ordered add: wait until the key block before this one has
        added, where it visits the loop's query block (`order_counter_name`
        then names the counter). Returns the tile to add. The interpreter runs a (batch, head)'s
        programs one at a time in ascending key-block order, so there the key block before
        has always added, and the counter holds this block exactly when it visited: the
        interpreter checks both ways instead of waiting (a wait that could never end would
        hang the test) and adds NaN where the rule and the counter disagree."""
        counter = self.order_counter_name = self.namer.fresh("order_counter")
        self.emit(f"{counter} = {self.order_counter(op)}")
        turn = self.order_turn(op)
        if self.interpreter:
            in_order = self.namer.fresh("in_order")
            if self.ranked(op):
                # Every lower visitor has added, and no other block.
                self.emit(f"{in_order} = tl.load({counter}) == rank")
            else:
                self.emit(f"{in_order} = (block_id == 0) | (({self.STEP_ROW} < prev_q_end)"
                          f" == (tl.load({counter}) == block_id))")
            checked = self.namer.fresh("checked")
            self.emit(f'{checked} = tl.where({in_order}, {value}, float("nan"))  # out of order: NaN, never silently')
            return checked
        self.emit(f"if {self.order_waits(op)}:")
        self.emit(f'    while tl.atomic_add({counter}, 0, sem="acquire") != {turn}:')
        self.emit("        pass")
        return value

    def emit_previous_block_end(self, op: tile.QBoundsOp) -> None:
        """`prev_q_end`: where the query range of key block `block_id - 1` ends (as
        `emit_q_bounds` computes it for that block), for adds in key-block order."""
        lower = op.band.bounds[0]
        if lower is None:
            self.emit("prev_q_end = n_q  # every earlier key block visits every later query")
            return
        self.emit("# The query range of the previous key block ends where its last key's does.")
        self.emit(f"prev_q_end = tl.minimum({plus('tl.minimum(block_id * BLOCK_M, n_k) - 1 - (n_k - n_q)', -lower + 1)}, n_q)")

    @property
    def ordered_adds(self) -> bool:
        """Whether the kernel adds into dq_acc in key-block order (`tile.store_add ... in_order`)."""
        return any(isinstance(op, tile.StoreAddOp) and op.ordered for op in self.kernel.walk())

    def emit_row_dot(self, op: tile.RowDotOp) -> None:
        a, b = self.namer[op.lhs], self.namer[op.rhs]
        self.emit("# tile.row_dot: rowsum(a * b) in fp32")
        self.emit(f"{self.namer.define(op.result)} = tl.sum({a}.to(tl.float32) * {b}.to(tl.float32), 1)")

    def emit_dot_transposed(self, op: tile.DotTransposedOp) -> None:
        a, b = self.dot_operand(self.namer[op.lhs]), self.dot_operand(self.namer[op.rhs])
        self.emit("# tile.dot_transposed: a @ b^T, fp32 accumulation")
        self.emit(f"{self.namer.define(op.result)} = tl.dot({a}, tl.trans({b}){self.dot_options()})")

    def emit_dot_lhs_transposed(self, op: tile.DotLhsTransposedOp) -> None:
        self.emit("# tile.dot_lhs_transposed: a^T @ b, fp32 accumulation")
        a_op, b_op = self.gradient_product_operands(self.namer[op.lhs], op.rhs)
        self.emit(f"{self.namer.define(op.result)} = tl.dot(tl.trans({a_op}), {b_op}{self.dot_options()})")

    def emit_recompute_probs(self, op: tile.RecomputeProbsOp) -> None:
        lse = self.namer[op.lse]
        self.emit("# tile.recompute_probs: p = exp(s - lse); a row with no kept key (lse = -inf) gives 0")
        safe = self.namer.fresh("lse_safe")
        self.emit(f"{safe} = tl.where({lse} == float(\"-inf\"), float(\"inf\"), {lse})")
        bcast = "[:, None]" if op.lse.type.shape == ("m",) else "[None, :]"  # type: ignore[union-attr]
        self.emit(
            f"{self.namer.define(op.result)} = tl.math.exp2({self.namer[op.scores]} * {self.exponent_factor(op)}"
            f" - ({safe} * {LOG2E}){bcast})"
        )

    def emit_softmax_grad(self, op: tile.SoftmaxGradOp) -> None:
        self.emit("# tile.softmax_grad: dS = P * (dP - delta)")
        self.emit(
            f"{self.namer.define(op.result)} = {self.namer[op.probs]} * "
            f"({self.namer[op.grad_probs]} - {self.along_queries(op.delta)})"
        )

    def emit_relu_grad(self, op: tile.ReluGradOp) -> None:
        self.emit("# tile.relu_grad: dS = dP / Nk where s > 0")
        self.emit(
            f"{self.namer.define(op.result)} = tl.where({self.namer[op.scores]} > 0.0, "
            f"{self.namer[op.grad_probs]}, 0.0) / n_k"
        )

    def emit_apply_scale(self, op: tile.ApplyScaleOp) -> None:
        scale = "sm_scale" if op.scale is None else repr(op.scale.value.data)
        self.emit(f"# tile.apply_scale: times the score scale ({'static' if op.scale else 'sm_scale'})")
        self.emit(f"{self.namer.define(op.result)} = {self.namer[op.input]} * {scale}")

    def emit_store_scores(self, op: tile.StoreScoresOp) -> None:
        role = self.role_of(op.dest)
        self.emit(f"# tile.store_scores: {role}[batch, head, query, key] for this block")
        self.emit(
            f"tl.store({self.score_pointers(role)}, {self.namer[op.value]}.to({role}_ptr.dtype.element_ty),"
            f" mask={self.block_bounds()})"
        )
