"""Ops that compute or modify a block of scores: `tile.scores` (Q K^T), the filters
(`tile.mask`, `tile.document_mask`), and the score modifiers `tile.alibi` and `tile.add_bias`."""

from __future__ import annotations

from collections.abc import Sequence
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
    AttrSizedOperandSegments,
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import (
    Pure,
)
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn import BandAttr
from attnfuse.dialects.tile.checks import (
    enclosing_loop,
    expect_role,
    expect_shape,
    expect_tile,
    verify_loop_scores,
)
from attnfuse.dialects.tile.traits import (
    ExponentiatesScores,
)
from attnfuse.dialects.tile.types import (
    TensorType,
    TileType,
)


@irdl_op_definition
class ScoresOp(IRDLOperation):
    """`s = scale * sum_p q_p @ k_p^T`: the scores of the program's query rows against the
    loop's key rows, summed over matching column parts (fp32 accumulation). `scale` is static
    when given, else the kernel's `sm_scale` argument. With `unscaled` (set by
    `fold-scale-into-exp`) the product is left unscaled and every consumer, an exponential
    marked `unscaled_scores`, applies the scale where it multiplies anyway.

    Parts of the kernel's element type are multiplied at that precision. f32 parts in an
    f16/bf16 kernel are multiplied far more exactly than element-type parts (the Triton
    printer sums three half-precision products of split operands: about 2^-16 |q| |k| in
    bf16, `KernelEmitter.split_products`): the backward of
    ReLU attention with RoPE reads its rotated operands that way, because relu's derivative
    jumps at s = 0 and rounding the rotated q and k would move scores across it."""

    name = "tile.scores"

    queries = var_operand_def(TileType)
    keys = var_operand_def(TileType)
    result = result_def(TileType)
    scale = opt_prop_def(FloatAttr)
    unscaled = opt_prop_def(UnitAttr)

    irdl_options = (AttrSizedOperandSegments(), ParsePropInAttrDict())
    assembly_format = (
        "`(` $queries `)` `x` `(` $keys `)` attr-dict `:` `(` type($queries) `)` `x`"
        " `(` type($keys) `)` `->` type($result)"
    )
    traits = traits_def(Pure())

    def __init__(
        self, queries: Sequence[SSAValue], keys: Sequence[SSAValue], scale: float | None = None
    ):
        super().__init__(
            operands=[queries, keys],
            result_types=[TileType(("m", "n"), f32)],
            properties={"scale": None if scale is None else FloatAttr(scale, f64)},
        )

    def verify_(self) -> None:
        if not self.queries or len(self.queries) != len(self.keys):
            raise VerifyException(
                f"scores needs as many query parts as key parts (at least one), got "
                f"{len(self.queries)} and {len(self.keys)}"
            )
        for i, (q, k) in enumerate(zip(self.queries, self.keys)):
            qt, kt = expect_tile(q, f"query part {i}"), expect_tile(k, f"key part {i}")
            if len(qt.shape) != 2 or qt.shape[0] != "m":
                raise VerifyException(f"query part {i} must be <m x _>, got {' x '.join(qt.shape)}")
            if len(kt.shape) != 2 or kt.shape[0] != "n":
                raise VerifyException(f"key part {i} must be <n x _>, got {' x '.join(kt.shape)}")
            if qt.shape[1] != kt.shape[1]:
                raise VerifyException(
                    f"query part {i} and key part {i} contract different dims: "
                    f"{qt.shape[1]} vs {kt.shape[1]}"
                )
            if qt.element_type != kt.element_type:
                raise VerifyException(f"query part {i} and key part {i} differ in element type")
        expect_shape(self.result, ("m", "n"), "scores")
        if self.scale is not None and not self.scale.value.data > 0:
            raise VerifyException(f"scores scale must be positive, got {self.scale.value.data}")
        if self.unscaled is not None:
            for user, operand in scale_consumers(self.result):
                if not (user.has_trait(ExponentiatesScores, value_if_unregistered=False) and operand is user.scores
                        and user.unscaled_scores is not None and user.scale == self.scale):
                    raise VerifyException(
                        f"unscaled scores must reach only exponentials that apply their scale "
                        f"(unscaled_scores, the same scale), but {user.name} reads them"
                    )


@irdl_op_definition
class MaskOp(IRDLOperation):
    """Sets the scores of dropped keys to -inf: keys outside `band` around each query's
    position, and keys past the sequence end. Only partial key blocks need it, so it may only
    appear in a `masked` loop."""

    name = "tile.mask"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    result = result_def(T)
    band = prop_def(BandAttr)

    assembly_format = "$input attr-dict `:` type($input)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, band: BandAttr):
        super().__init__(operands=[scores], result_types=[scores.type], properties={"band": band})

    def verify_(self) -> None:
        expect_shape(self.input, ("m", "n"), "masked scores")
        if self.result.type != self.input.type:
            raise VerifyException("tile.mask keeps the type of its input")
        loop = enclosing_loop(self)
        if loop is None or loop.properties.get("masked") is None:
            raise VerifyException("tile.mask belongs in a masked tile.kv_loop or tile.q_loop")


@irdl_op_definition
class DocumentMaskOp(IRDLOperation):
    """Sets to -inf the scores of pairs whose query and key lie in different documents:
    kept iff `doc_ids[q_pos] == doc_ids[key] >= 0` (`doc_ids` `[B, Nk]`; a negative id is
    padding, and a query position outside `[0, Nk)` has no document). Only partial blocks
    need it (the runtime's lists mark the blocks one document fills as full), so it may only
    appear in a `masked` loop; it reads the positions in either grid's orientation."""

    name = "tile.document_mask"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    doc_ids = operand_def(TensorType)
    result = result_def(T)

    assembly_format = "$input `,` $doc_ids attr-dict `:` type($input) `,` type($doc_ids)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, doc_ids: SSAValue):
        super().__init__(operands=[scores, doc_ids], result_types=[scores.type])

    def verify_(self) -> None:
        expect_shape(self.input, ("m", "n"), "document-masked scores")
        expect_role(self.doc_ids, "doc_ids", "the document mask's operand must be the doc_ids tensor")
        loop = enclosing_loop(self)
        if loop is None or loop.properties.get("masked") is None:
            raise VerifyException("tile.document_mask belongs in a masked loop")


@irdl_op_definition
class AlibiOp(IRDLOperation):
    """`s += slope[head] * (key_pos - q_pos)` for the loop's key block; slopes are a tensor
    of one fp32 value per query head."""

    name = "tile.alibi"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    slopes = operand_def(TensorType)
    result = result_def(T)

    assembly_format = "$input `,` $slopes attr-dict `:` type($input) `,` type($slopes)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, slopes: SSAValue):
        super().__init__(operands=[scores, slopes], result_types=[scores.type])

    def verify_(self) -> None:
        verify_loop_scores(self, self.input, "ALiBi scores")
        expect_role(self.slopes, "slopes", "the ALiBi operand must be the slopes tensor")


@irdl_op_definition
class AddBiasOp(IRDLOperation):
    """`s += bias[batch, head, rows, keys]` for the program's rows and the loop's key block
    (out-of-bounds entries read as 0: they are masked or discarded)."""

    name = "tile.add_bias"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    bias = operand_def(TensorType)
    result = result_def(T)

    assembly_format = "$input `,` $bias attr-dict `:` type($input) `,` type($bias)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, bias: SSAValue):
        super().__init__(operands=[scores, bias], result_types=[scores.type])

    def verify_(self) -> None:
        verify_loop_scores(self, self.input, "biased scores")
        expect_role(self.bias, "bias", "the bias operand must be the bias tensor")


FILTER_OPS = (MaskOp, DocumentMaskOp)
"""Score ops that only drop entries (set them to -inf, whatever the scale), and only where a
loop is `masked`: a band's positions, a document filter's ids."""


def scale_consumers(scores: SSAValue) -> list[tuple[Operation, SSAValue]]:
    """The ops that read a block of scores, looking through the filters (`FILTER_OPS`, which
    keep a dropped score at -inf however it is scaled), with the value each reads."""
    users: list[tuple[Operation, SSAValue]] = []
    for use in scores.uses:
        if isinstance(use.operation, FILTER_OPS):
            users += scale_consumers(use.operation.result)
        else:
            users.append((use.operation, scores))
    return users


def verify_unscaled_source(op: Operation) -> None:
    """For an exponential marked `unscaled_scores` (`ExponentiatesScores`): its scores come,
    through filters only, from a `tile.scores` marked `unscaled` with the same scale. The
    converse of `tile.scores`' check: scaled scores that reached an exponential told to scale
    them would be scaled twice."""
    if op.properties.get("unscaled_scores") is None:
        return
    source = op.scores.owner  # type: ignore[attr-defined]
    while isinstance(source, FILTER_OPS):
        source = source.input.owner
    if not (isinstance(source, ScoresOp) and source.unscaled is not None
            and source.scale == op.properties.get("scale")):
        raise VerifyException(
            f"{op.name} is marked unscaled_scores, so its scores must come (through tile.mask or "
            "tile.document_mask only) from a tile.scores marked unscaled with the same scale: it "
            "applies the scale itself")
