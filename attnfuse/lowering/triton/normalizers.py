"""Printing the forward's normalizer ops: the online softmax (`tile.softmax_init`,
`tile.softmax_update`, `tile.accumulate`, `tile.softmax_finalize`), `tile.relu_probs` and
`tile.zeros`."""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from attnfuse.dialects import tile
from attnfuse.dialects.attn import FP32_MIN_NORMAL, SOFTMAX_FLOOR
from attnfuse.lowering.triton.core import TRITON_TYPES, EmitterCore
from attnfuse.lowering.triton.program import LN2, LOG2E


class NormalizerEmitter(EmitterCore):
    """The part of `KernelEmitter` that prints the online softmax and the pointwise
    normalizers' forward ops."""

    def emit_softmax_init(self, op: tile.SoftmaxInitOp) -> None:
        acc, row_max, row_sum = (self.namer.define(r) for r in op.results)
        self.emit(f"# tile.softmax_init: empty accumulator, row max at the softmax's floor ({SOFTMAX_FLOOR!r}), row sum 0")
        self.emit(f"{acc} = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)")
        self.emit(f"{row_max} = tl.full([BLOCK_M], {self.softmax_floor!r}, dtype=tl.float32)")
        self.emit(f"{row_sum} = tl.zeros([BLOCK_M], dtype=tl.float32)")

    @property
    def softmax_floor(self) -> float:
        """`attn.SOFTMAX_FLOOR` in the units of the carried row max (base 2): where the online
        softmax's row max starts."""
        return SOFTMAX_FLOOR * LOG2E

    def emit_softmax_update(self, op: tile.SoftmaxUpdateOp) -> None:
        scores, row_max, row_sum = (self.namer[v] for v in op.operands)
        new_max = self.namer.fresh("row_max_new")
        factor = self.exponent_factor(op)
        # The row max is kept in base-2 units: the max of the scores times the exponent's
        # factor, the same product (rounded the same way) each weight's exponent takes, so
        # s * f - max is never positive wherever the product is rounded before the
        # subtraction (the CPU interpreter always; a GPU's fused multiply-add leaves at most
        # half an ulp of the product: below 2^31, no overflow). A max taken in natural units
        # and multiplied by log2(e) apart rounds differently: at |s * scale| ~ 1e10 the
        # exponents reached +-1000 and the output was NaN. It also saves a multiply per row.
        self.emit("# tile.softmax_update: online softmax step, the row max in base-2 units (as the exponent scales s)")
        block_max = f"tl.max({scores}, 1) * {factor}"
        # The row max starts at the softmax's floor (`emit_softmax_init`), not -inf: it is
        # never -inf (a row with no kept key yet needs no select), and a row whose scores all lie
        # far below the floor (a whole row masked by -1e9 or finfo.min) shifts by it, so every
        # weight exp2(s * factor - max) is 0, never exp2 of a rounding of max * log2(e) beyond
        # the exponent's range (inf, then NaN). At and above the floor the weights are exact.
        self.emit(f"{new_max} = tl.maximum({row_max}, {block_max})")
        probs = self.fresh_result(op.probs)
        alpha = self.fresh_result(op.alpha)
        self.emit(f"{probs} = tl.math.exp2({scores} * {factor} - {new_max}[:, None])")
        self.emit(f"{alpha} = tl.math.exp2({row_max} - {new_max})")
        self.emit(f"{self.fresh_result(op.new_row_sum)} = {row_sum} * {alpha} + tl.sum({probs}, 1)")
        self.emit(f"{self.fresh_result(op.new_row_max)} = {new_max}")

    def fresh_result(self, value: SSAValue) -> str:
        """A result's name: the loop-carried name when it is yielded back, else a new one."""
        carried = self.carried_name(value)
        if carried is not None:
            self.namer.alias(value, carried)
            return carried
        return self.namer.define(value)

    def carried_name(self, value: SSAValue) -> str | None:
        # A value that is only yielded can reuse the carried variable's name, provided the old
        # value has no reader after this op (the emitters read operands before writing).
        uses = list(value.uses)
        if len(uses) != 1 or not isinstance(uses[0].operation, tile.YieldOp):
            return None
        loop = uses[0].operation.parent_op()
        assert isinstance(loop, tile.LOOP_OPS)
        arg = loop.body.block.args[uses[0].index]
        producer = value.owner
        assert isinstance(producer, Operation)
        block = loop.body.block
        order = {op: i for i, op in enumerate(block.ops)}
        if any(order.get(u.operation, 1 << 30) > order[producer] for u in arg.uses):
            return None
        return self.namer[loop.inits[uses[0].index]]

    def emit_accumulate(self, op: tile.AccumulateOp) -> None:
        acc, probs = self.namer[op.acc], self.namer[op.probs]
        self.emit("# tile.accumulate: " + ("acc * alpha + p @ v" if op.alpha is not None else "acc + p @ v"))
        scaled = f"{acc} * {self.namer[op.alpha]}[:, None]" if op.alpha is not None else acc
        result = self.fresh_result(op.result)
        p_op, value_op = self.gradient_product_operands(probs, op.value)
        self.emit(f"{result} = tl.dot({p_op}, {value_op}, acc={scaled}{self.dot_options()})")

    def gradient_product_operands(self, weights: str, value: SSAValue) -> tuple[str, str]:
        """The operands of a product of an fp32 weight tile (probabilities, score gradients)
        with a loaded tile `value`, as `tile.accumulate` and `tile.dot_lhs_transposed` define
        it: the weights rounded to the value's element type, so the product runs at that
        precision and tensor-core rate. A value widened to f32 for exact scores is rounded
        back too: this product needs no more than the element type's precision, like every
        other gradient product."""
        name = self.namer[value]
        assert isinstance(value.type, tile.TileType)
        if value.type.elem == "f32" and self.elem != "f32" and not self.upcast_dots:
            elem = TRITON_TYPES[self.elem]
            return f"{weights}.to({elem})", f"{name}.to({elem})"
        return (weights if self.upcast_dots else f"{weights}.to({name}.dtype)"), self.dot_operand(name)

    def emit_softmax_finalize(self, op: tile.SoftmaxFinalizeOp) -> None:
        acc, row_max, row_sum = (self.namer[v] for v in op.operands)
        has_keys = self.namer.fresh("has_keys")
        self.emit("# tile.softmax_finalize: normalize; a row with no weight gives 0 and lse = -inf")
        # A row sum under fp32's smallest normal number is a row with no kept key (0) or whose
        # scores all lie SOFTMAX_UNDERFLOW below the floor it started at (subnormal weights):
        # no weight (docs/semantics.md, "Additive bias"). Written as a negated `<`, so that a
        # NaN row sum (NaN inputs) gives NaN, not an empty row.
        self.emit(f"{has_keys} = ~({row_sum} < {FP32_MIN_NORMAL!r})")
        safe_sum = self.namer.fresh("row_sum_safe")
        self.emit(f"{safe_sum} = tl.where({has_keys}, {row_sum}, 1.0)")
        self.emit(f"{self.namer.define(op.output)} = {acc} / {safe_sum}[:, None]")
        lse = self.namer.define(op.lse)
        # lse in natural units from the base-2 max: (max + log2(sum)) * ln(2).
        natural = f"({row_max} + tl.math.log2({safe_sum})) * {LN2}"
        self.emit(f"{lse} = tl.where({has_keys}, {natural}, float(\"-inf\"))")

    def emit_relu_probs(self, op: tile.ReluProbsOp) -> None:
        self.emit("# tile.relu_probs: relu(s) / Nk (dropped keys are -inf: weight 0)")
        # NaN scores stay NaN (as torch.relu keeps them): tl.maximum would drop them.
        self.emit(
            f"{self.namer.define(op.result)} = tl.maximum({self.namer[op.input]}, 0.0, "
            "propagate_nan=tl.PropagateNan.ALL) / n_k"
        )

    def emit_zeros(self, op: tile.ZerosOp) -> None:
        assert isinstance(op.result.type, tile.TileType)
        sizes = {"m": "BLOCK_M", "n": "BLOCK_N", "d": "BLOCK_D", "dv": "BLOCK_DV", "half": "BLOCK_HALF", "pass": "BLOCK_PASS"}
        shape = ", ".join(sizes[d] for d in op.result.type.shape)
        self.emit("# tile.zeros")
        self.emit(f"{self.namer.define(op.result)} = tl.zeros([{shape}], dtype=tl.float32)")
