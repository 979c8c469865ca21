"""The forward's normalizer ops: the online softmax (`tile.softmax_init`,
`tile.softmax_update`, `tile.accumulate`, `tile.softmax_finalize`) and the pointwise
normalizers' `tile.relu_probs`, with `tile.zeros` for their accumulators."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import (
    FloatAttr,
    UnitAttr,
    f32,
)
from xdsl.ir import (
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
    expect_shape,
    expect_tile,
    verify_f32_state,
)
from attnfuse.dialects.tile.scores import verify_unscaled_source
from attnfuse.dialects.tile.traits import (
    ExponentiatesScores,
)
from attnfuse.dialects.tile.types import (
    TileType,
)


@irdl_op_definition
class ReluProbsOp(IRDLOperation):
    """ReLU attention weights `p = relu(s) / Nk` (dropped keys, at -inf, give 0)."""

    name = "tile.relu_probs"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    result = result_def(T)

    assembly_format = "$input attr-dict `:` type($input)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue):
        super().__init__(operands=[scores], result_types=[scores.type])

    def verify_(self) -> None:
        verify_f32_state([(self.input, ("m", "n"), "scores")])


@irdl_op_definition
class ZerosOp(IRDLOperation):
    """A tile of zeros."""

    name = "tile.zeros"

    result = result_def(TileType)
    assembly_format = "attr-dict `:` type($result)"
    traits = traits_def(Pure())

    def __init__(self, result_type: TileType):
        super().__init__(result_types=[result_type])


@irdl_op_definition
class SoftmaxInitOp(IRDLOperation):
    """Initial online-softmax state: accumulator 0, row max at the softmax's floor
    (`attn.SOFTMAX_FLOOR`, in the row max's base-2 units `tile.softmax_update` gives: times
    log2(e); not -inf: a row whose scores all lie far below it gets no weight, and
    the step needs no test for a row with no kept key yet), row sum 0."""

    name = "tile.softmax_init"

    acc = result_def(TileType)
    row_max = result_def(TileType)
    row_sum = result_def(TileType)

    assembly_format = "attr-dict `:` type($acc) `,` type($row_max) `,` type($row_sum)"
    traits = traits_def(Pure())

    def __init__(self):
        super().__init__(
            result_types=[TileType(("m", "dv"), f32), TileType(("m",), f32), TileType(("m",), f32)]
        )

    def verify_(self) -> None:
        expect_shape(self.acc, ("m", "dv"), "accumulator")
        expect_shape(self.row_max, ("m",), "row max")
        expect_shape(self.row_sum, ("m",), "row sum")


@irdl_op_definition
class SoftmaxUpdateOp(IRDLOperation):
    """One online-softmax step over a block of scores.

    The row max is carried in base-2 units: `f` is log2(e), times the scale for `unscaled_scores`
    (`fold-scale-into-exp`), `row_max' = max(row_max, rowmax(s) * f)`, `p = exp2(s * f -
    row_max')` (0 for dropped keys: the row max is never -inf, `tile.softmax_init`),
    `alpha = exp2(row_max - row_max')`, `row_sum' = alpha * row_sum + rowsum(p)`. (The max is
    the max of the same products the exponents take, so that `s * f - row_max'` is never
    positive where the product is rounded first; a normalizer that starts the state itself,
    `Normalizer.init_state`, gives its row max in these units: a natural max `m` is `m * log2(e)`.)
    """

    name = "tile.softmax_update"

    S: ClassVar = VarConstraint("S", BaseAttr(TileType))
    R: ClassVar = VarConstraint("R", BaseAttr(TileType))
    scores = operand_def(S)
    row_max = operand_def(R)
    row_sum = operand_def(R)
    probs = result_def(S)
    new_row_max = result_def(R)
    new_row_sum = result_def(R)
    alpha = result_def(R)
    unscaled_scores = opt_prop_def(UnitAttr)
    """The scores arrive unscaled (`tile.scores ... unscaled`): the step multiplies them by
    `scale` (static when given, else `sm_scale`) inside its exponential and row max."""
    scale = opt_prop_def(FloatAttr)

    assembly_format = "$scores `,` $row_max `,` $row_sum attr-dict `:` type($scores) `,` type($row_max)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), ExponentiatesScores())

    def __init__(self, scores: SSAValue, row_max: SSAValue, row_sum: SSAValue):
        super().__init__(
            operands=[scores, row_max, row_sum],
            result_types=[scores.type, row_max.type, row_max.type, row_max.type],
        )

    def verify_(self) -> None:
        verify_f32_state(
            [
                (self.scores, ("m", "n"), "scores"),
                (self.row_max, ("m",), "row max"),
                (self.row_sum, ("m",), "row sum"),
                (self.probs, ("m", "n"), "probabilities"),
                (self.alpha, ("m",), "rescale factor"),
            ]
        )
        verify_unscaled_source(self)


@irdl_op_definition
class AccumulateOp(IRDLOperation):
    """`acc' = acc * alpha + p @ v`: adds a loop block's weighted rows to the accumulator
    (`p` is converted to `v`'s type for the matrix product; accumulation is fp32; a `v`
    widened to f32 in an f16/bf16 kernel is rounded back to the kernel's type for it, so
    every such product runs at the element type's precision and tensor-core rate). Without
    `alpha` the accumulator is not rescaled. `acc` is `m x c` and `v` is `n x c` for any column
    dim `c`: the forward's `p @ V`, and the backward's `dS @ K` (dQ), `P^T @ dO` (dV) and
    `dS^T @ Q` (dK), per column part."""

    name = "tile.accumulate"

    A: ClassVar = VarConstraint("A", BaseAttr(TileType))
    acc = operand_def(A)
    probs = operand_def(TileType)
    value = operand_def(TileType)
    alpha = opt_operand_def(TileType)
    result = result_def(A)

    assembly_format = (
        "$acc `,` $probs `,` $value (`rescaled` $alpha^)? attr-dict"
        " `:` type($acc) `,` type($probs) `,` type($value) (`,` type($alpha)^)?"
    )
    traits = traits_def(Pure())

    def __init__(
        self, acc: SSAValue, probs: SSAValue, value: SSAValue, alpha: SSAValue | None = None
    ):
        super().__init__(
            operands=[acc, probs, value, [] if alpha is None else [alpha]],
            result_types=[acc.type],
        )

    def verify_(self) -> None:
        acc = expect_tile(self.acc, "accumulator")
        if len(acc.shape) != 2 or acc.shape[0] != "m":
            raise VerifyException(f"accumulator must be <m x _>, got {' x '.join(acc.shape)}")
        verify_f32_state(
            [(self.acc, acc.shape, "accumulator"), (self.probs, ("m", "n"), "probabilities")]
        )
        expect_shape(self.value, ("n", acc.shape[1]), "value block")
        if self.alpha is not None:
            verify_f32_state([(self.alpha, ("m",), "rescale factor")])
        if self.result.type != self.acc.type:
            raise VerifyException("tile.accumulate keeps the accumulator's type")


@irdl_op_definition
class SoftmaxFinalizeOp(IRDLOperation):
    """`o = acc / row_sum` and `lse = (row_max + log2(row_sum)) * ln(2)` (the row max in base-2
    units, `tile.softmax_update`; lse in natural units); a row with no kept key gets `o = 0` and
    `lse = -inf` (never NaN)."""

    name = "tile.softmax_finalize"

    A: ClassVar = VarConstraint("A", BaseAttr(TileType))
    R: ClassVar = VarConstraint("R", BaseAttr(TileType))
    acc = operand_def(A)
    row_max = operand_def(R)
    row_sum = operand_def(R)
    output = result_def(A)
    lse = result_def(R)

    assembly_format = "$acc `,` $row_max `,` $row_sum attr-dict `:` type($acc) `,` type($row_max)"
    traits = traits_def(Pure())

    def __init__(self, acc: SSAValue, row_max: SSAValue, row_sum: SSAValue):
        super().__init__(
            operands=[acc, row_max, row_sum], result_types=[acc.type, row_max.type]
        )

    def verify_(self) -> None:
        verify_f32_state(
            [
                (self.acc, ("m", "dv"), "accumulator"),
                (self.row_max, ("m",), "row max"),
                (self.row_sum, ("m",), "row sum"),
                (self.output, ("m", "dv"), "output"),
                (self.lse, ("m",), "log-sum-exp"),
            ]
        )
