"""The backward kernels' ops: recomputing probabilities, their gradients, the transposed
products, and `tile.store_add` (the fused backward's dQ accumulation)."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import (
    FloatAttr,
    UnitAttr,
    f32,
    f64,
)
from xdsl.ir import (
    Operation,
    SSAValue,
)
from xdsl.irdl import (
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import (
    Pure,
)
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tile.checks import (
    expect_role,
    expect_tile,
    kernel_of,
    verify_f32_state,
    verify_loop_scores,
)
from attnfuse.dialects.tile.scores import verify_unscaled_source
from attnfuse.dialects.tile.loops import (
    SparseQLoopOp,
)
from attnfuse.dialects.tile.memory import (
    BlockWrite,
)
from attnfuse.dialects.tile.traits import (
    ExponentiatesScores,
)
from attnfuse.dialects.tile.types import (
    BlockOrder,
    Columns,
    ColumnsAttr,
    Rows,
    RowsAttr,
    TensorType,
    TileType,
)


def _verify_row_vector(op: Operation, scores: SSAValue, vector: SSAValue, what: str) -> None:
    """A per-query vector (lse, delta) must run along the query axis of the score tile: the
    program's rows (`m`) in a `query_blocks` kernel, the loop's rows (`n`) in a `key_blocks`
    one."""
    verify_f32_state([(scores, ("m", "n"), "scores")])
    ty = expect_tile(vector, what)
    if ty.elem != "f32" or ty.shape not in (("m",), ("n",)):
        raise VerifyException(f"{what} must be an f32 <m> or <n> tile, got {ty}")
    kernel = kernel_of(op)
    if kernel is not None:
        wanted = ("m",) if kernel.grid == "query_blocks" else ("n",)
        if ty.shape != wanted:
            raise VerifyException(
                f"{what} must run along the query axis, <{wanted[0]}> in a {kernel.grid} kernel"
            )


@irdl_op_definition
class RowDotOp(IRDLOperation):
    """`delta = rowsum(a * b)` in fp32: the softmax backward's `rowsum(dO * O)`, in the
    preprocess kernel or in the dQ kernel that forms delta itself."""

    name = "tile.row_dot"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def(TileType)

    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)"
    traits = traits_def(Pure())

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[lhs, rhs], result_types=[TileType(("m",), f32)])

    def verify_(self) -> None:
        ty = expect_tile(self.lhs, "row_dot operand")
        if len(ty.shape) != 2 or ty.shape[0] != "m":
            raise VerifyException(f"row_dot operands must be <m x _>, got {' x '.join(ty.shape)}")
        verify_f32_state([(self.result, ("m",), "row dot")])


@irdl_op_definition
class DotTransposedOp(IRDLOperation):
    """`r = a @ b^T` in fp32, for `a` over the program's rows and `b` over the loop's rows:
    the backward's `dP = dO @ V^T` (or `dP^T = V @ dO^T` in a `key_blocks` kernel)."""

    name = "tile.dot_transposed"

    lhs = operand_def(TileType)
    rhs = operand_def(TileType)
    result = result_def(TileType)

    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"
    traits = traits_def(Pure())

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[lhs, rhs], result_types=[TileType(("m", "n"), f32)])

    def verify_(self) -> None:
        lhs, rhs = expect_tile(self.lhs, "left operand"), expect_tile(self.rhs, "right operand")
        if len(lhs.shape) != 2 or lhs.shape[0] != "m":
            raise VerifyException(f"left operand must be <m x _>, got {' x '.join(lhs.shape)}")
        if len(rhs.shape) != 2 or rhs.shape[0] != "n" or rhs.shape[1] != lhs.shape[1]:
            raise VerifyException(
                f"right operand must be <n x {lhs.shape[1]}>, got {' x '.join(rhs.shape)}"
            )
        if lhs.element_type != rhs.element_type:
            raise VerifyException("dot_transposed operands differ in element type")
        verify_f32_state([(self.result, ("m", "n"), "product")])


@irdl_op_definition
class DotLhsTransposedOp(IRDLOperation):
    """`r = a^T @ b` in fp32, for `a` (`m x n`, f32) over (program rows, loop rows) and `b`
    (`m x c`) over the program's rows: the fused backward's `dQ` part `dS K` of one block
    pair in a `key_blocks` kernel, whose score-shaped tiles are transposed (`dS^T` is
    `key x query`), so the result is `n x c`, over the loop's (query) rows. `a` is rounded
    to `b`'s element type for the product, as `tile.accumulate` rounds its probabilities
    (a `b` widened to f32 in an f16/bf16 kernel is rounded back to the kernel's type
    first), so the product runs at the element type's precision and tensor-core rate."""

    name = "tile.dot_lhs_transposed"

    lhs = operand_def(TileType)
    rhs = operand_def(TileType)
    result = result_def(TileType)

    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"
    traits = traits_def(Pure())

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        rhs_type = expect_tile(rhs, "right operand")
        cols = rhs_type.shape[-1]
        super().__init__(operands=[lhs, rhs], result_types=[TileType(("n", cols), f32)])

    def verify_(self) -> None:
        verify_f32_state([(self.lhs, ("m", "n"), "left operand")])
        rhs = expect_tile(self.rhs, "right operand")
        if len(rhs.shape) != 2 or rhs.shape[0] != "m":
            raise VerifyException(f"right operand must be <m x _>, got {' x '.join(rhs.shape)}")
        kernel = kernel_of(self)
        if kernel is not None and rhs.elem not in (kernel.elem, "f32"):
            raise VerifyException(
                f"right operand must have the kernel's element type {kernel.elem} (or be widened "
                f"to f32), got {rhs.elem}")
        verify_f32_state([(self.result, ("n", rhs.shape[1]), "product")])


@irdl_op_definition
class StoreAddOp(BlockWrite):
    """Adds an fp32 tile into `[rows, cols]` of an fp32 accumulator tensor (`dq_acc`), as
    `tile.store` addresses those rows (in a `key_blocks` kernel the loop's rows are the loop's
    query block of the loop's query head); rows and columns past the tensor's bounds are not
    touched. Programs add into the same rows concurrently (atomics, or TMA reduce-add): without
    `in_order` the sum's order, and so its last bits, is not deterministic.

    With `in_order %dq_order` the programs' adds into each query block are made in the order
    of their key blocks, so the sum, and dQ, is the same bit for bit from run to run: before
    its add, a program waits until every lower key block that visits the block has added;
    after the add it hands the block on. The handover is the block's counter in `dq_order`
    (its first row's), which must be 0 when the kernel starts. In a `tile.q_loop` the key
    blocks that visit a query block are consecutive (a band's): the counter holds the next key
    block to add, and the first visitor waits for none. In a `tile.sparse_q_loop` they need not
    be: the counter holds how many have added, and the loop's `ranks` give each entry its turn.
    A program waits only for programs of lower key blocks, which the GPU starts before it."""

    name = "tile.store_add"
    VALUE_NAME: ClassVar[str] = "added tile"
    ORDERABLE: ClassVar[bool] = True

    # Redeclared: IRDL orders a subclass's own operands before the inherited ones.
    value = operand_def(TileType)
    dest = operand_def(TensorType)
    order = opt_operand_def(TensorType)

    def __init__(self, value: SSAValue, dest: SSAValue, rows: str, cols: str | None,
                 order: SSAValue | None = None):
        IRDLOperation.__init__(
            self,
            operands=[value, dest, [] if order is None else [order]],
            properties={
                "rows": RowsAttr(Rows(rows)),
                "cols": None if cols is None else ColumnsAttr(Columns(cols)),
            },
        )

    @property
    def ordered(self) -> bool:
        """Whether the adds are made in key-block order (deterministic)."""
        return self.order is not None

    def verify_(self) -> None:
        expect_role(self.dest, "dq_acc", f"tile.store_add adds into the dq_acc tensor, not {self.dest.type}")
        super().verify_()
        elem = expect_tile(self.value, self.VALUE_NAME).elem
        if elem != "f32":
            raise VerifyException(f"an added tile must have element type f32, got {elem}")
        if self.order is not None:
            expect_role(self.order, "dq_order", f"tile.store_add orders its adds by the dq_order tensor, not {self.order.type}")
            kernel = kernel_of(self)
            if self.rows.data != "loop" or (kernel is not None and kernel.grid != "key_blocks"):
                raise VerifyException("tile.store_add in key-block order adds the loop's query rows of a "
                                      "key_blocks kernel")
            # Each key block hands a query block to the next visitor: a band's are consecutive,
            # a block list's are told by the loop's ranks; and key blocks in ascending program
            # order, so that a program waits only for programs the GPU started before it.
            loop = self.parent_op()
            if isinstance(loop, SparseQLoopOp) and loop.ranks is None:
                raise VerifyException("tile.store_add in key-block order in a tile.sparse_q_loop needs the loop's "
                                      "ranks (the key blocks a block list sends to a query block need not be "
                                      "consecutive)")
            if kernel is not None and kernel.block_order == BlockOrder.DESCENDING:
                raise VerifyException("tile.store_add in key-block order needs the kernel's blocks in ascending "
                                      "order (a program waits for the key block before its own)")


@irdl_op_definition
class RecomputeProbsOp(IRDLOperation):
    """Softmax probabilities from the forward's log-sum-exp: `p = exp(s - lse)`, 0 for
    dropped pairs and for rows with no kept key (`lse = -inf`, never NaN)."""

    name = "tile.recompute_probs"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    scores = operand_def(T)
    lse = operand_def(TileType)
    result = result_def(T)
    unscaled_scores = opt_prop_def(UnitAttr)
    """As `tile.softmax_update`'s: the exponential applies the scores' scale."""
    scale = opt_prop_def(FloatAttr)

    assembly_format = "$scores `,` $lse attr-dict `:` type($scores) `,` type($lse)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), ExponentiatesScores())

    def __init__(self, scores: SSAValue, lse: SSAValue):
        super().__init__(operands=[scores, lse], result_types=[scores.type])

    def verify_(self) -> None:
        _verify_row_vector(self, self.scores, self.lse, "log-sum-exp")
        verify_unscaled_source(self)


@irdl_op_definition
class SoftmaxGradOp(IRDLOperation):
    """The gradient of the scores through softmax: `dS = P * (dP - delta)`, with `delta` the
    per-query `rowsum(dO * O)` (minus any gradient of the log-sum-exp)."""

    name = "tile.softmax_grad"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    probs = operand_def(T)
    grad_probs = operand_def(T)
    delta = operand_def(TileType)
    result = result_def(T)

    assembly_format = "$probs `,` $grad_probs `,` $delta attr-dict `:` type($probs) `,` type($delta)"
    traits = traits_def(Pure())

    def __init__(self, probs: SSAValue, grad_probs: SSAValue, delta: SSAValue):
        super().__init__(operands=[probs, grad_probs, delta], result_types=[probs.type])

    def verify_(self) -> None:
        _verify_row_vector(self, self.probs, self.delta, "delta")


@irdl_op_definition
class ReluGradOp(IRDLOperation):
    """The gradient of the scores through ReLU attention: `dS = dP / Nk` where `s > 0`, else
    0 (dropped pairs, at -inf, get 0)."""

    name = "tile.relu_grad"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    scores = operand_def(T)
    grad_probs = operand_def(T)
    result = result_def(T)

    assembly_format = "$scores `,` $grad_probs attr-dict `:` type($scores)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, grad_probs: SSAValue):
        super().__init__(operands=[scores, grad_probs], result_types=[scores.type])

    def verify_(self) -> None:
        verify_f32_state([(self.scores, ("m", "n"), "scores")])


@irdl_op_definition
class ApplyScaleOp(IRDLOperation):
    """`x * scale`: the score scale (static when given, else the kernel's `sm_scale`) applied
    once to an accumulated gradient (`dQ`, `dK`) instead of to every score gradient."""

    name = "tile.apply_scale"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    result = result_def(T)
    scale = opt_prop_def(FloatAttr)

    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input)"
    traits = traits_def(Pure())

    def __init__(self, value: SSAValue, scale: float | None = None):
        super().__init__(
            operands=[value],
            result_types=[value.type],
            properties={"scale": None if scale is None else FloatAttr(scale, f64)},
        )

    def verify_(self) -> None:
        verify_f32_state([(self.input, expect_tile(self.input, "scaled tile").shape, "scaled tile")])
        if self.scale is not None and not self.scale.value.data > 0:
            raise VerifyException(f"scale must be positive, got {self.scale.value.data}")


@irdl_op_definition
class StoreScoresOp(IRDLOperation):
    """Stores a score-shaped tile into a `[B, H, Nq, Nk]` tensor (the bias gradient) at the
    (query, key) pairs of the current block, in the grid's orientation; pairs past either
    sequence end are not written."""

    name = "tile.store_scores"

    value = operand_def(TileType)
    dest = operand_def(TensorType)

    assembly_format = "$value `,` $dest attr-dict `:` type($value) `,` type($dest)"

    def __init__(self, value: SSAValue, dest: SSAValue):
        super().__init__(operands=[value, dest])

    def verify_(self) -> None:
        verify_loop_scores(self, self.value, "stored scores")
        expect_role(self.dest, "dbias", "tile.store_scores writes the dbias tensor")
