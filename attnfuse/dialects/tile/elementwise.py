"""Generic elementwise computation: `tile.map` (a scalar body applied to every element of
its tiles, what a block defines a score modifier or normalizer with) and what its bodies may
read beside the scores: `tile.seq_len`, and each score entry's positions and query head
(`tile.pair_position`, `tile.query_head`)."""

from __future__ import annotations

from collections.abc import Sequence
from math import isnan

from xdsl.dialects import arith, math
from xdsl.dialects.builtin import (
    Float32Type,
    FloatAttr,
    f32,
    i1,
)
from xdsl.ir import (
    Operation,
    Region,
    SSAValue,
)
from xdsl.irdl import (
    AnyOf,
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import (
    HasParent,
    IsTerminator,
    Pure,
)
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn import FP32_MAX
from attnfuse.dialects.tile.checks import (
    expect_tile,
    verify_loop_scores,
)
from attnfuse.dialects.tile.types import (
    SeqAxis,
    SeqAxisAttr,
    TileType,
)


@irdl_op_definition
class SeqLenOp(IRDLOperation):
    """The call's query (`Nq`) or key (`Nk`) sequence length as an f32 scalar, for the bodies
    of `tile.map` (sigmoid attention's default bias `-ln(Nk)`, say)."""

    name = "tile.seq_len"

    axis = prop_def(SeqAxisAttr)
    result = result_def(BaseAttr(Float32Type))

    assembly_format = "attr-dict `:` type($result)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, axis: str):
        super().__init__(result_types=[f32], properties={"axis": SeqAxisAttr(SeqAxis(axis))})


@irdl_op_definition
class PairPositionOp(IRDLOperation):
    """Each entry's query or key position, as an f32 tile shaped as the key loop's scores, for
    the bodies of `tile.map` (a bias that depends on the distance `k_pos - q_pos`, say). The
    positions are the ones masks and ALiBi use: key `j` at `j`, query `i` at `i + Nk - Nq`
    (with per-sequence lengths, `kv_lens[b] - Nq + i`); exact up to 2^24. Belongs in a key
    (or query) loop, whose block it describes, in any kernel orientation."""

    name = "tile.pair_position"

    axis = prop_def(SeqAxisAttr)
    result = result_def(TileType)

    assembly_format = "attr-dict `:` type($result)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, axis: str):
        super().__init__(result_types=[TileType(("m", "n"), f32)], properties={"axis": SeqAxisAttr(SeqAxis(axis))})

    def verify_(self) -> None:
        verify_index_tile(self, "pair_position")


@irdl_op_definition
class QueryHeadOp(IRDLOperation):
    """Each entry's query head index `h` (0-based, of the call's `Hq` query heads), as an f32
    tile shaped as the key loop's scores, for the bodies of `tile.map` (a per-head factor,
    say). Belongs in a key (or query) loop, in any kernel orientation."""

    name = "tile.query_head"

    result = result_def(TileType)

    assembly_format = "attr-dict `:` type($result)"
    traits = traits_def(Pure())

    def __init__(self):
        super().__init__(result_types=[TileType(("m", "n"), f32)])

    def verify_(self) -> None:
        verify_index_tile(self, "query_head")


def verify_index_tile(op: Operation, what: str) -> None:
    """An index tile (`tile.pair_position`, `tile.query_head`): f32, shaped as the scores of
    the key loop it sits in."""
    verify_loop_scores(op, op.results[0], f"{what} result")
    if expect_tile(op.results[0], f"{what} result").elem != "f32":
        raise VerifyException(f"{op.name} gives an f32 tile")


MAP_BODY_OPS: tuple[type[Operation], ...] = (
    arith.ConstantOp, arith.AddfOp, arith.SubfOp, arith.MulfOp, arith.DivfOp, arith.NegfOp,
    arith.MaximumfOp, arith.MinimumfOp, arith.CmpfOp, arith.SelectOp,
    arith.AndIOp, arith.OrIOp, arith.XOrIOp,
    math.ExpOp, math.LogOp, math.SqrtOp, math.AbsFOp, math.TanhOp, math.FloorOp,
)
"""The scalar ops a `tile.map` body may hold (what the targets translate): f32 arithmetic,
`exp`, `log`, `sqrt`, `absf`, `tanh` and `floor`, ordered comparisons (`MAP_COMPARISONS`)
giving i1, `andi`/`ori`/`xori` on i1, and `select` on an i1."""

APPROXIMATE_DIVISION = frozenset({arith.FastMathFlag.APPROX_FUNC, arith.FastMathFlag.ALLOW_RECIP})
"""`arith.divf` fastmath flags that allow an approximate quotient (the targets' fast division);
without one a body's `divf` is correctly rounded."""

APPROXIMATE = arith.FastMathFlagsAttr([arith.FastMathFlag.APPROX_FUNC])
"""The flags a block gives a `divf` whose quotient may be approximate (`APPROXIMATE_DIVISION`)."""

LOGIC_OPS: tuple[type[Operation], ...] = (arith.AndIOp, arith.OrIOp, arith.XOrIOp)
"""The body ops on i1 (the results of comparisons): a predicate's parts combined."""

MAP_COMPARISONS = ("oeq", "olt", "ole", "ogt", "oge")
"""The `arith.cmpf` predicates a body may use: ordered ones, false when either side is NaN."""


def _poisons_scores(value: float) -> bool:
    """Whether an f32 constant is +inf or NaN (`_verify_map_body_op`)."""
    return isnan(value) or value == float("inf")


def _verify_map_body_op(op: Operation, defined: set[SSAValue]) -> None:
    """One body op: of `MAP_BODY_OPS`, on values defined inside the body, f32 (or i1 from a
    comparison), constants f32, comparisons ordered."""
    if not isinstance(op, MAP_BODY_OPS):
        names = ", ".join(sorted(t.name for t in MAP_BODY_OPS))
        raise VerifyException(f"tile.map bodies hold only {names}; got {op.name}")
    for value in op.operands:
        if value not in defined:
            raise VerifyException(f"{op.name} in a tile.map body reads a value defined outside it")
    if isinstance(op, arith.ConstantOp) and not (
        isinstance(op.value, FloatAttr) and op.value.type == f32
    ):
        raise VerifyException(f"tile.map constants are f32 floats, got {op.value}")
    if isinstance(op, arith.ConstantOp) and _poisons_scores(op.value.value.data):
        # -inf drops an entry (an element-wise filter's `select(keep, s, -inf)`); +inf or NaN
        # in a score can only give NaN rows. xDSL rounds a constant to f32 when it is made, so
        # a block's finite coefficient beyond f32's range arrives here as inf.
        raise VerifyException(
            f"tile.map constant {op.value.value.data!r}: a map body's constants are f32, finite "
            f"or -inf (a dropped entry); a finite coefficient beyond f32's largest, {FP32_MAX!r}, "
            "rounds to inf when the constant is made: bound the block's attributes in its verifier")
    if isinstance(op, arith.CmpfOp):
        predicate = arith.CMPF_COMPARISON_OPERATIONS[op.predicate.value.data]
        if predicate not in MAP_COMPARISONS:
            raise VerifyException(
                f"tile.map comparisons are {', '.join(MAP_COMPARISONS)}, got {predicate}"
            )
    for result in op.results:
        wanted = i1 if isinstance(op, (arith.CmpfOp, *LOGIC_OPS)) else f32
        if result.type != wanted:
            raise VerifyException(f"{op.name} in a tile.map body must give {wanted}, got {result.type}")


@irdl_op_definition
class MapOp(IRDLOperation):
    """Applies a scalar function to every entry of its tile operands: `r[x] = f(a[x], b[x], ...)`.

    The body is a region of scalar ops (as `linalg.generic`'s), one f32 block argument per
    operand, ending in `tile.map_yield` of an f32: `arith.constant` (f32, finite or -inf, which
    drops an entry; +inf and NaN are refused, and a finite double beyond f32's range is +inf
    once made), `addf`, `subf`, `mulf`, `divf`, `negf`, `maximumf`, `minimumf`, `math.exp`,
    `log`, `sqrt`, `absf`, `tanh`, `floor`; `arith.cmpf` with an ordered predicate (`oeq`,
    `olt`, `ole`, `ogt`, `oge`), `andi`, `ori` and `xori` on its i1 results, and `select` on one (`MAP_BODY_OPS`; a body has
    no i1 constant: negate a predicate by the opposite comparison or by swapping `select`'s
    arms). `divf` is correctly rounded, as MLIR defines it, unless its fastmath flags allow an
    approximation (`afn`, `arcp`, `fast`: the targets' fast division, up to 2 ulp off on a
    GPU; `APPROXIMATE_DIVISION`). f32 holds integers below 2^24 exactly (positions, say), and
    `floor(a / b)` of two of them is exact while `a + b <= 2^24`: enough for a remainder
    `a - floor(a / b) * b`. f32 scalar operands (a `tile.seq_len`, say) are the same for every
    entry. Every tile operand has the result's shape; the result is f32. A pointwise score
    modifier or normalizer needs no tile op of its own: it lowers to a `tile.map`
    (soft-capping is `cap * tanh(s / cap)`).
    """

    name = "tile.map"

    inputs = var_operand_def(AnyOf.get(TileType, Float32Type))
    result = result_def(TileType)
    body = region_def("single_block")

    assembly_format = "`(` $inputs `)` attr-dict `:` `(` type($inputs) `)` `->` type($result) $body"
    traits = traits_def(Pure())

    def __init__(self, inputs: Sequence[SSAValue], body: Region, result_type: TileType):
        super().__init__(operands=[inputs], result_types=[result_type], regions=[body])

    def verify_(self) -> None:
        result = expect_tile(self.result, "map result")
        if result.elem != "f32":
            raise VerifyException(f"tile.map computes in f32, got a {result.elem} result")
        if not any(isinstance(v.type, TileType) for v in self.inputs):
            raise VerifyException("tile.map needs at least one tile operand")
        for i, value in enumerate(self.inputs):
            if isinstance(value.type, TileType) and value.type.shape != result.shape:
                raise VerifyException(
                    f"map operand {i} is a {' x '.join(value.type.shape)} tile, the result "
                    f"{' x '.join(result.shape)}: operands must have the result's shape"
                )
            if isinstance(value.type, TileType) and value.type.elem != "f32":
                raise VerifyException(f"map operand {i} is a {value.type.elem} tile: maps compute in f32")
        block = self.body.block
        if len(block.args) != len(self.inputs) or any(a.type != f32 for a in block.args):
            raise VerifyException("tile.map's body takes one f32 argument per operand")
        defined: set[SSAValue] = set(block.args)
        for op in block.ops:
            if isinstance(op, MapYieldOp):
                if op.value not in defined:
                    raise VerifyException("tile.map_yield yields a value defined outside the body")
                continue
            _verify_map_body_op(op, defined)
            defined |= set(op.results)
        if not isinstance(block.last_op, MapYieldOp):
            raise VerifyException("tile.map's body must end in tile.map_yield")


@irdl_op_definition
class MapYieldOp(IRDLOperation):
    """Ends a `tile.map` body with the entry's value."""

    name = "tile.map_yield"

    value = operand_def(BaseAttr(Float32Type))
    assembly_format = "$value attr-dict `:` type($value)"
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(MapOp)))

    def __init__(self, value: SSAValue):
        super().__init__(operands=[value])
