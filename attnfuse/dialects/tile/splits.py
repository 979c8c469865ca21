"""Split-KV decoding: `tile.kv_split` (the keys one split program visits) and the merges of
the splits' partial results (`tile.merge_splits`, `tile.merge_last_split`)."""

from __future__ import annotations

from xdsl.dialects.builtin import (
    IndexType,
    UnitAttr,
    f32,
)
from xdsl.ir import (
    SSAValue,
)
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
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
    kernel_of,
    verify_f32_state,
)
from attnfuse.dialects.tile.types import (
    TensorType,
    TileType,
)


@irdl_op_definition
class KVSplitOp(IRDLOperation):
    """Clips a key-block range (`tile.kv_bounds`' four bounds) to the program's split of the
    key range, in a `kv_splits` kernel: split `s` holds keys `[s * split_len, (s + 1) *
    split_len)`, `split_len` a call-time multiple of `block_n`, so a block that was full
    stays full and one that was partial stays partial. A split past a sequence's keys gets
    empty ranges, and its program stores an empty partial result (0 and lse -inf)."""

    name = "tile.kv_split"

    start = operand_def(IndexType)
    full_start = operand_def(IndexType)
    full_end = operand_def(IndexType)
    end = operand_def(IndexType)
    split_start = result_def(IndexType)
    split_full_start = result_def(IndexType)
    split_full_end = result_def(IndexType)
    split_end = result_def(IndexType)

    assembly_format = "$start `,` $full_start `,` $full_end `,` $end attr-dict"
    traits = traits_def(Pure())

    def __init__(self, start: SSAValue, full_start: SSAValue, full_end: SSAValue, end: SSAValue):
        super().__init__(operands=[start, full_start, full_end, end], result_types=[IndexType()] * 4)

    def verify_(self) -> None:
        kernel = kernel_of(self)
        if kernel is not None and kernel.grid != "kv_splits":
            raise VerifyException("tile.kv_split needs a kv_splits kernel")


@irdl_op_definition
class MergeLastSplitOp(IRDLOperation):
    """In a `kv_splits` kernel, after the program stored its partial results: the last of the
    split programs of its rows to get here (counted in `split_counts`, which it resets to 0)
    merges every split's partials, as `tile.merge_splits` does, and stores the output `o`
    (and, with `weighted`, `lse`). One kernel instead of a split kernel and a merge kernel:
    no second launch, and the merge runs as soon as the last split is done."""

    name = "tile.merge_last_split"

    o_part = operand_def(TensorType)
    lse_part = operand_def(TensorType)
    split_counts = operand_def(TensorType)
    o = operand_def(TensorType)
    lse = opt_operand_def(TensorType)
    weighted = opt_prop_def(UnitAttr)

    irdl_options = (AttrSizedOperandSegments(), ParsePropInAttrDict())
    assembly_format = (
        "$o_part `,` $lse_part `,` $split_counts `into` $o (`,` $lse^)? (`weighted` $weighted^)? attr-dict"
        " `:` type($o_part) `,` type($lse_part) `,` type($split_counts) `,` type($o) (`,` type($lse)^)?"
    )

    def __init__(self, o_part: SSAValue, lse_part: SSAValue, split_counts: SSAValue, o: SSAValue,
                 lse: SSAValue | None, weighted: bool):
        super().__init__(
            operands=[o_part, lse_part, split_counts, o, [lse] if lse is not None else []],
            properties={"weighted": UnitAttr() if weighted else None},
        )

    def verify_(self) -> None:
        for value, role in ((self.o_part, "o_part"), (self.lse_part, "lse_part"),
                            (self.split_counts, "split_counts"), (self.o, "o")):
            expect_role(value, role, f"tile.merge_last_split's operands are o_part, lse_part, split_counts, o and lse; got another role for {role}")
        if self.lse is not None:
            expect_role(self.lse, "lse", "tile.merge_last_split stores its lse into an lse tensor")
        if (self.lse is not None) != (self.weighted is not None):
            raise VerifyException("tile.merge_last_split stores an lse exactly when it is weighted (softmax)")
        kernel = kernel_of(self)
        if kernel is not None and kernel.grid != "kv_splits":
            raise VerifyException("tile.merge_last_split needs a kv_splits kernel")


@irdl_op_definition
class MergeSplitsOp(IRDLOperation):
    """Combines the partial results of a split kernel (`o_part`, `lse_part`) for the
    program's query rows, exactly: with `weighted` (softmax), each split's output is
    weighted by `exp(lse_s - lse)`, `lse = log(sum_s exp(lse_s))`, and a row no split kept
    a key for gets `o = 0`, `lse = -inf`; without it (pointwise normalizers, whose outputs
    are sums over keys) the outputs add and there is no lse (`lse` is then 0 and must not
    be stored). Loops over the call's splits itself; in a `query_blocks` kernel."""

    name = "tile.merge_splits"

    o_part = operand_def(TensorType)
    lse_part = operand_def(TensorType)
    weighted = opt_prop_def(UnitAttr)
    output = result_def(TileType)
    lse = result_def(TileType)

    assembly_format = (
        "$o_part `,` $lse_part (`weighted` $weighted^)? attr-dict `:` type($o_part) `,` "
        "type($lse_part) `->` type($output) `,` type($lse)"
    )
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, o_part: SSAValue, lse_part: SSAValue, weighted: bool):
        super().__init__(
            operands=[o_part, lse_part],
            result_types=[TileType(("m", "dv"), f32), TileType(("m",), f32)],
            properties={"weighted": UnitAttr() if weighted else None},
        )

    def verify_(self) -> None:
        expect_role(self.o_part, "o_part", "tile.merge_splits merges an o_part tensor")
        expect_role(self.lse_part, "lse_part", "tile.merge_splits reads an lse_part tensor")
        verify_f32_state([(self.output, ("m", "dv"), "merged output"), (self.lse, ("m",), "merged lse")])
        kernel = kernel_of(self)
        if kernel is not None and kernel.grid != "query_blocks":
            raise VerifyException("tile.merge_splits needs a query_blocks kernel")
        if self.weighted is None and next(iter(self.lse.uses), None) is not None:
            raise VerifyException("an unweighted tile.merge_splits has no log-sum-exp: its lse "
                                  "result must not be used")
