"""The `attn` dialect: *what* an attention variant computes.

A variant is an `attn.variant` holding a straight-line program over per-head sequences:

    attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
      %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
      %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
      %s = attn.scores %qr, %kr
      %m = attn.mask %s [#attn.causal]
      %p = attn.softmax %m
      %o = attn.pv %p, %v
      attn.yield %o
    }

This module holds the dialect's core: the types, the pre-matmul transform (`attn.rope`), the
score matrix (`attn.scores`), the value product (`attn.pv`), `attn.yield` and `attn.variant`.
Every other op is a *block* defined in its own file under `attnfuse/blocks/` (its op, its
DSL constructor, its lowering, its derivative and its meaning together), through the
interfaces of `attnfuse/dialects/interfaces.py`: score modifiers (`attn.alibi`,
`attn.add_bias`, ...), key filters (`attn.mask`, whose predicates are attributes so
that masks intersect by merging predicate lists, and `attn.block_sparse`) and normalizers
(`attn.softmax`, `attn.relu`, ...). `attnfuse.blocks.attn_dialect()` assembles
the dialect from both. Nothing here knows about tiles, GPUs or Triton; `lower-to-tile`
decides how the program becomes a kernel.

Types name the role of a value rather than its shape: shapes are call-time facts (any batch,
heads and sequence lengths), so one variant serves them all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    FloatAttr,
    FunctionType,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    UnitAttr,
    f64,
    i64,
)
from xdsl.dialects.utils import EnumAttribute, parse_func_op_like, print_func_op_like
from xdsl.ir import (
    Attribute,
    SpacedOpaqueSyntaxAttribute,
    Block,
    Operation,
    ParametrizedAttribute,
    Region,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    AnyOf,
    opt_operand_def,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_attr_definition,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, Pure, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from attnfuse.dialects.dominance import check_defined_before_use
from attnfuse.dialects.interfaces import KeyFilter, Normalizer, ScoreModifier

# --------------------------------------------------------------------------------------------
# Types: the role a value plays in the computation.
# --------------------------------------------------------------------------------------------


class CountedParameters(ParametrizedAttribute):
    """A parametrized attribute whose parser checks the number of parameters in the text
    against its definition: `!attn.query<3>` or `#attn.causal<3>` is a located parse error
    (xDSL's generic parser would build the attribute and fail unlocated in its verifier)."""

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        start = parser.pos
        parameters = parser.parse_paramattr_parameters()
        expected = len(cls.get_irdl_definition().parameters)
        if len(parameters) != expected:
            parser.raise_error(f"{cls.name} takes {expected or 'no'} parameter{'' if expected == 1 else 's'}, "
                               f"got {len(parameters)}", start, parser.pos)
        return parameters


@irdl_attr_definition
class QueryType(CountedParameters, TypeAttribute):
    """Query rows of one head: `[Nq, D]`, at positions `i + (Nk - Nq)`."""

    name = "attn.query"


@irdl_attr_definition
class KeyType(CountedParameters, TypeAttribute):
    """Key rows of one key/value head: `[Nk, D]`, at positions `j`."""

    name = "attn.key"


@irdl_attr_definition
class ValueType(CountedParameters, TypeAttribute):
    """Value rows of one key/value head: `[Nk, Dv]`."""

    name = "attn.value"


@irdl_attr_definition
class BiasType(CountedParameters, TypeAttribute):
    """A call-time additive bias, broadcastable to `[B, Hq, Nq, Nk]`."""

    name = "attn.bias"


@irdl_attr_definition
class LayoutType(CountedParameters, TypeAttribute):
    """A call-time block-sparsity layout: bool `[ceil(Nq/bs), ceil(Nk/bs)]` or `[Hq, ...]`."""

    name = "attn.layout"


@irdl_attr_definition
class DocIdsType(CountedParameters, TypeAttribute):
    """Call-time document ids of the key positions: int `[Nk]` or `[B, Nk]`, negative for
    padding (the query at position `p` belongs to document `doc_ids[p]`)."""

    name = "attn.doc_ids"


@irdl_attr_definition
class PositionsType(CountedParameters, TypeAttribute):
    """Call-time RoPE positions of the query or key rows: int `[N]` or `[B, N]`.

    `!attn.positions<query>` / `!attn.positions<key>`. Masks keep using the default positions
    (`i + Nk - Nq`, `j`); only the rotation reads these.
    """

    name = "attn.positions"

    role: StringAttr

    def __init__(self, role: str):
        super().__init__(StringAttr(role))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            role = parser.parse_identifier()
            if role not in ("query", "key"):
                parser.raise_error(f"positions are of query or key rows, got '{role}'")
            return (StringAttr(role),)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.role.data}>")


@irdl_attr_definition
class ScoresType(CountedParameters, TypeAttribute):
    """The score matrix of one query head: `[Nq, Nk]`, with dropped entries marked."""

    name = "attn.scores"


@irdl_attr_definition
class ProbsType(CountedParameters, TypeAttribute):
    """Normalized attention weights `[Nq, Nk]`: 0 on every dropped key."""

    name = "attn.probs"


@irdl_attr_definition
class OutputType(CountedParameters, TypeAttribute):
    """The attention output of one query head: `[Nq, Dv]`."""

    name = "attn.output"


# --------------------------------------------------------------------------------------------
# Mask predicates. A mask keeps key j for query i when every predicate of it keeps j.
# --------------------------------------------------------------------------------------------


class MaskPredicate(CountedParameters):
    """Base class of mask predicates: a rule deciding which keys a query keeps.

    Subclasses give `band()`: the kept keys as offsets from the query position,
    `(lower, upper)` with `None` for an unbounded side, or `None` when the predicate is not
    a band (e.g. a block-sparse layout).
    """

    def band(self) -> tuple[int | None, int | None] | None:
        raise NotImplementedError  # abstract: every concrete predicate overrides it


MAX_BAND_OFFSET = 2**30
"""The largest |offset| of a band side: kernels add offsets to positions in int32 (`q_last +
upper + 1`), which stays below 2**31 for sequences of up to 2**30 positions. A window of
2**31 - 1 overflowed there and kept the wrong keys."""


@irdl_attr_definition
class BandAttr(ParametrizedAttribute):
    """`#attn.band<lower = a, upper = b>`: key j is kept by query i iff
    `q_pos(i) + a <= j <= q_pos(i) + b`; a missing side is unbounded.

    `analyze-masks` computes it as the intersection of a mask's band predicates; it is the
    whole block-level iteration space: which key blocks are empty, partial or full for a query
    block follows from it and the block sizes (see `tile.kv_bounds`).
    """

    name = "attn.band"

    lower: IntegerAttr | UnitAttr
    upper: IntegerAttr | UnitAttr

    def __init__(self, lower: int | None, upper: int | None):
        super().__init__(
            UnitAttr() if lower is None else IntegerAttr(lower, i64),
            UnitAttr() if upper is None else IntegerAttr(upper, i64),
        )

    @property
    def bounds(self) -> tuple[int | None, int | None]:
        """`(lower, upper)` offsets from the query position; `None` where unbounded."""
        lo = self.lower.value.data if isinstance(self.lower, IntegerAttr) else None
        hi = self.upper.value.data if isinstance(self.upper, IntegerAttr) else None
        return lo, hi

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        found: dict[str, int] = {}
        with parser.in_angle_brackets():
            while (key := parser.parse_optional_identifier()) is not None:
                if key not in ("lower", "upper") or key in found:
                    parser.raise_error(f"expected 'lower' or 'upper' once each, got '{key}'")
                parser.parse_punctuation("=")
                found[key] = parser.parse_integer(allow_boolean=False)
                if parser.parse_optional_punctuation(",") is None:
                    break
        lower, upper = found.get("lower"), found.get("upper")
        if lower is not None and upper is not None and lower > upper:
            parser.raise_error(f"band keeps no key: lower {lower} > upper {upper}")
        return (
            UnitAttr() if lower is None else IntegerAttr(lower, i64),
            UnitAttr() if upper is None else IntegerAttr(upper, i64),
        )

    def print_parameters(self, printer: Printer) -> None:
        lo, hi = self.bounds
        parts = ([f"lower = {lo}"] if lo is not None else []) + (
            [f"upper = {hi}"] if hi is not None else []
        )
        printer.print_string("<" + ", ".join(parts) + ">")

    def verify(self) -> None:
        lo, hi = self.bounds
        if lo is not None and hi is not None and lo > hi:
            raise VerifyException(f"band keeps no key: lower {lo} > upper {hi}")
        for side, value in (("lower", lo), ("upper", hi)):
            if value is not None and abs(value) > MAX_BAND_OFFSET:
                raise VerifyException(
                    f"band {side} offset must lie in [-{MAX_BAND_OFFSET}, {MAX_BAND_OFFSET}] "
                    f"(kernels add it to positions in int32), got {value}"
                )


def intersect_bands(
    bands: Sequence[tuple[int | None, int | None]],
) -> tuple[int | None, int | None]:
    """The band kept by all of `bands`: the tightest lower and upper offsets."""
    lowers = [lo for lo, _ in bands if lo is not None]
    uppers = [hi for _, hi in bands if hi is not None]
    return (max(lowers) if lowers else None, min(uppers) if uppers else None)


# --------------------------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------------------------

class Placement(StrEnum):
    """Where a rotation runs: in registers inside the fused kernel (`fused`), as a pass before
    it (`pre_rotated`), or, for the key only, nowhere: the caller passes the key already
    rotated (`given`), as a KV cache stores it."""

    FUSED = "fused"
    PRE_ROTATED = "pre_rotated"
    GIVEN = "given"


@irdl_attr_definition
class PlacementAttr(EnumAttribute[Placement], SpacedOpaqueSyntaxAttribute):
    """`#attn<placement fused>`: where an `attn.rope` runs (set by `place-rope`).

    `fused` and `pre_rotated` are performance choices that never change the result.
    `given` (key rotations only) changes what the key input means: the k the caller passes is
    already `R(k_pos) k`, so no kernel rotates it and its gradient is taken with respect to
    the k passed. It is part of the program's meaning, and `place-rope` never overwrites it."""

    name = "attn.placement"


ROPE_PLACEMENTS = tuple(p.value for p in Placement)


@irdl_op_definition
class RopeOp(IRDLOperation):
    """Rotary position embedding of a query or key operand (`q~ = R(q_pos) q`).

    Rotates pairs of dims by `pos * theta^(-2t/r)`, computed in fp32; `r` is `rotary_dim`
    (the head dim when absent) and dims `>= r` pass through. Pairs are `(x_t, x_{t+r/2})`, or
    `(x_{2t}, x_{2t+1})` with `interleaved`. `placement`, set by `place-rope`, says whether the
    rotation runs inside the fused kernel or as a pass over the operand before it. On a key,
    `#attn<placement given>` says the key arrives rotated (a KV cache's keys): the op is then
    the identity on the k passed, and reads no positions.
    """

    name = "attn.rope"

    T: ClassVar = VarConstraint("T", AnyOf.get(QueryType, KeyType))
    input = operand_def(T)
    positions = opt_operand_def(PositionsType)
    output = result_def(T)

    theta = prop_def(FloatAttr)
    rotary_dim = opt_prop_def(IntegerAttr)
    interleaved = opt_prop_def(UnitAttr)
    llama3_scaling = opt_prop_def(ArrayAttr[FloatAttr])
    """Llama-3.1 frequency scaling: [factor, low_freq_factor, high_freq_factor,
    original_max_position]."""
    placement = opt_prop_def(PlacementAttr)

    assembly_format = (
        "$input (`at` $positions^)? attr-dict `:` type($input) (`,` type($positions)^)?"
    )
    irdl_options = (ParsePropInAttrDict(),)

    traits = traits_def(Pure())

    def __init__(
        self,
        operand: SSAValue,
        theta: float,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        placement: str | None = None,
        scaling: Sequence[float] | None = None,
        positions: SSAValue | None = None,
    ):
        super().__init__(
            operands=[operand, [] if positions is None else [positions]],
            result_types=[operand.type],
            properties={
                "theta": FloatAttr(theta, f64),
                "rotary_dim": None if rotary_dim is None else IntegerAttr(rotary_dim, i64),
                "interleaved": UnitAttr() if interleaved else None,
                "llama3_scaling": None
                if scaling is None
                else ArrayAttr([FloatAttr(float(x), f64) for x in scaling]),
                "placement": None if placement is None else PlacementAttr(Placement(placement)),
            },
        )

    @property
    def scaling(self) -> tuple[float, ...] | None:
        """The Llama-3.1 scaling parameters, or None."""
        if self.llama3_scaling is None:
            return None
        return tuple(a.value.data for a in self.llama3_scaling.data)

    @property
    def given(self) -> bool:
        """Whether the operand arrives rotated (`#attn<placement given>`, keys only)."""
        return self.placement is not None and self.placement.data == Placement.GIVEN

    @property
    def rope_key(self) -> tuple[float, int | None, bool, tuple[float, ...] | None]:
        """What must agree between the query and key rotations of one variant."""
        dim = None if self.rotary_dim is None else self.rotary_dim.value.data
        return (self.theta.value.data, dim, self.interleaved is not None, self.scaling)

    def verify_(self) -> None:
        theta = self.theta.value.data
        # As rope() requires (docs/semantics.md, RoPE): theta <= 1 makes frequencies that do not
        # fall with the pair index, inf makes every frequency 0.
        if not math.isfinite(theta) or theta <= 1:
            raise VerifyException(f"rope theta must be a finite number > 1, got {theta}")
        if self.rotary_dim is not None:
            dim = self.rotary_dim.value.data
            if not valid_rotary_dim(dim):
                raise VerifyException(f"rope rotary_dim must be positive, even and below 2^31, got {dim}")
        if self.llama3_scaling is not None:
            problem = llama3_scaling_problem(tuple(self.scaling or ()))
            if problem is not None:
                raise VerifyException(f"rope llama3_scaling: {problem}")
        role = "query" if isinstance(self.input.type, QueryType) else "key"
        if self.given:
            if role == "query":
                raise VerifyException(
                    "rope placement given applies only to the key (a KV cache stores keys "
                    "rotated); the query is rotated by the kernels"
                )
            if self.positions is not None:
                raise VerifyException(
                    "rope placement given reads no positions: the key arrives rotated"
                )
        if self.positions is not None:
            assert isinstance(self.positions.type, PositionsType)
            if self.positions.type.role.data != role:
                raise VerifyException(
                    f"rotating {role} rows needs !attn.positions<{role}>, got {self.positions.type}"
                )


FP32_MIN_NORMAL = 2.0**-126
"""The smallest normal fp32 number."""

FP32_MAX = 3.4028234663852886e38
"""The largest finite fp32 number: a block parameter the kernels use in fp32 must not exceed it."""

MIN_SCORE_SCALE = 2.0**-126
"""The smallest score scale: the smallest normal fp32 number. Kernels multiply by the scale
in fp32, GPUs may flush subnormals to 0, and the printer folds the scale into the softmax's
exponent and row max, where a scale of 0 would turn masked scores (-inf) into NaN."""

MAX_SCORE_SCALE = 3.4028234663852886e38 / 1.4426950408889634
"""The largest score scale: scale * log2(e), the exponent's multiplier, must be a finite
fp32 number."""


def finite_real(value: object) -> float | None:
    """`value` as a finite float if it is a real number (an int or a float, not a bool), else
    None: also for an int too large for a float, which `float()` and `math.isfinite` would
    raise OverflowError on rather than call not finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def valid_rotary_dim(dim: int) -> bool:
    """Whether `dim` can be a rotation's width: positive, even, and below 2^31 (an int32 in
    the kernels; no head is that wide). The one rule `rope()` and `attn.rope`'s verifier apply."""
    return 0 < dim < 2**31 and dim % 2 == 0


MIN_LLAMA3_FACTOR = 2.0**32 / FP32_MAX
"""The smallest Llama-3.1 `factor`: a scaled frequency is at most `max(1, 1 / factor)` (the
blend lies between the kept and the divided one) and positions are below 2^31 (int32), so from
this bound on every fp32 angle is below half the largest fp32 number, finite with room for
rounding; below it the angle of a large position can be inf, and its sine NaN."""


def llama3_scaling_problem(values: tuple[object, ...]) -> str | None:
    """What is wrong with Llama-3.1 scaling parameters `[factor, low_freq_factor,
    high_freq_factor, original_max_position]`, or None: each must be a finite positive number,
    `high_freq_factor > low_freq_factor`, and the factor at least `MIN_LLAMA3_FACTOR`. The one
    rule `llama3_scaling()` and `attn.rope`'s verifier both apply."""
    names = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position")
    if len(values) != len(names):
        return f"must be [{', '.join(names)}], got {len(values)} values"
    numbers = [finite_real(x) for x in values]
    for name, value, number in zip(names, values, numbers):
        if number is None or number <= 0:
            return f"{name} must be a finite positive number, got {value!r}"
    factor, low, high, _ = numbers
    if not high > low:
        return f"high_freq_factor must exceed low_freq_factor, got {values[2]!r} <= {values[1]!r}"
    if factor < MIN_LLAMA3_FACTOR:
        return (f"factor must be at least {MIN_LLAMA3_FACTOR:.3g} (2^32 / the largest fp32 number: "
                f"a smaller one makes the fp32 angles of large positions inf), got {values[0]!r}")
    return None

SOFTMAX_FLOOR = -(2.0**23)
"""Where the online softmax's row max starts (docs/semantics.md, "Additive bias"; the kernels
carry it in base-2 units, so they start at this times log2(e)). The kernels take the
exponentials in base 2 as one fused multiply-add, exp2(s * f - max) with max the largest of the
products s * f (f = log2(e), times the scale where it is folded in); on a GPU the multiply-add
subtracts from the unrounded product, so the weight of the row's largest score is exp2 of up
to half an ulp of |max|, which must stay near 1 (the weights are carried in the inputs' 16-bit
type for the P @ V product: fp16 holds 2^15 at most; past 2^31 even fp32 overflows).
Starting at the floor, a row whose scores all lie far below it (a whole row masked by -1e9 or
finfo(float32).min) is shifted by the floor and every weight underflows to 0: no weight, as a
row with no kept key (`SOFTMAX_UNDERFLOW` below the floor and further); a row whose largest
score is at or above the floor shifts by it exactly (that factor is under 2^(1/2) there,
|max| < 2^24, common to the row, and cancels in the normalization)."""

SOFTMAX_UNDERFLOW = 126 * 0.6931471805599453
"""How far below `SOFTMAX_FLOOR` a row's largest score leaves it no weight: exp(-87.3) = 2^-126,
fp32's smallest normal number, under which the finalize takes the row sum for an empty row's
(weights relative to the floor that small are subnormal, or 0). Between the floor and this far
below it a row's weights are tiny: in a 16-bit P they round to 0, so its output is its softmax
(fp32, bf16) or 0 (fp16), with its lse."""


@irdl_op_definition
class ScoresOp(IRDLOperation):
    """The score matrix `s[i, j] = scale * <q_i, k_j>`; `scale` defaults to `1/sqrt(D)`."""

    name = "attn.scores"

    query = operand_def(QueryType)
    key = operand_def(KeyType)
    result = result_def(ScoresType)
    scale = opt_prop_def(FloatAttr)

    assembly_format = "$query `,` $key attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, query: SSAValue, key: SSAValue, scale: float | None = None):
        super().__init__(
            operands=[query, key],
            result_types=[ScoresType()],
            properties={"scale": None if scale is None else FloatAttr(scale, f64)},
        )

    def verify_(self) -> None:
        if self.scale is not None:
            scale = self.scale.value.data
            if not scale > 0:
                raise VerifyException(f"scores scale must be positive, got {scale}")
            if not MIN_SCORE_SCALE <= scale <= MAX_SCORE_SCALE:
                raise VerifyException(
                    f"scores scale must lie in [{MIN_SCORE_SCALE:.3g}, {MAX_SCORE_SCALE:.3g}] "
                    f"(kernels scale in fp32), got {scale}"
                )


@irdl_op_definition
class PVOp(IRDLOperation):
    """The output `o = p @ v`, reading value head `h // (Hq / Hkv)` for query head `h`."""

    name = "attn.pv"

    probs = operand_def(ProbsType)
    value = operand_def(ValueType)
    result = result_def(OutputType)
    assembly_format = "$probs `,` $value attr-dict"
    traits = traits_def(Pure())

    def __init__(self, probs: SSAValue, value: SSAValue):
        super().__init__(operands=[probs, value], result_types=[OutputType()])


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Returns the output of an `attn.variant`."""

    name = "attn.yield"

    output = operand_def(OutputType)
    assembly_format = "$output attr-dict"
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(VariantOp)))

    def __init__(self, output: SSAValue):
        super().__init__(operands=[output])


class ForeignOp(VerifyException):
    """An op of another dialect in a variant's body; `op` is it (`attnfuse-opt` locates the
    diagnostic there)."""

    def __init__(self, op: Operation):
        super().__init__(f"'{op.name}' inside attn.variant: a variant's body holds attn ops only")
        self.op = op


class OpWithoutRole(VerifyException):
    """An op in a variant's body that is none of the core ops and implements none of the three
    interfaces (`ScoreModifier`, `KeyFilter`, `Normalizer`); `op` is it (`attnfuse-opt`
    locates the diagnostic there)."""

    def __init__(self, op: Operation):
        super().__init__(f"'{op.name}' inside attn.variant implements none of ScoreModifier, KeyFilter "
                         "and Normalizer: every op between attn.scores and attn.pv plays one of those "
                         "roles (docs/architecture.md §3.2)")
        self.op = op


@irdl_op_definition
class VariantOp(IRDLOperation):
    """One attention variant: a function from `(q, k, v)` to the output, over one head.

    The body is a straight-line program of `attn` ops ending in `attn.yield`; the verifier
    checks that it is a well-formed attention: attn ops only, one score matrix, one
    normalizer, one value product, and query/key rotations that agree.
    """

    name = "attn.variant"

    body = region_def("single_block")
    sym_name = prop_def(SymbolNameConstraint())
    function_type = prop_def(FunctionType)

    traits = traits_def(IsolatedFromAbove(), SymbolOpInterface())

    ARGUMENT_TYPES: ClassVar[tuple[Attribute, ...]] = (QueryType(), KeyType(), ValueType())
    EXTRA_ARGUMENT_TYPES: ClassVar[tuple[Attribute, ...]] = (
        BiasType(),
        LayoutType(),
        DocIdsType(),
        PositionsType("query"),
        PositionsType("key"),
    )
    """Call-time data a variant may take after (q, k, v), at most once each, in this order."""

    def __init__(self, name: str, body: Region | None = None, extra: Sequence[Attribute] = ()):
        inputs = [*self.ARGUMENT_TYPES, *extra]
        function_type = FunctionType.from_lists(inputs, [OutputType()])
        if body is None:
            body = Region(Block(arg_types=inputs))
        super().__init__(
            properties={"sym_name": StringAttr(name), "function_type": function_type},
            regions=[body],
        )

    @property
    def query(self) -> SSAValue:
        return self.body.block.args[0]

    @property
    def key(self) -> SSAValue:
        return self.body.block.args[1]

    @property
    def value(self) -> SSAValue:
        return self.body.block.args[2]

    def argument(self, kind: Attribute) -> SSAValue | None:
        """The block argument of a call-time data type (bias, layout, positions), if any."""
        for arg in self.body.block.args[3:]:
            if arg.type == kind:
                return arg
        return None

    def ops_of(self, kind: type[IRDLOperation]) -> list[IRDLOperation]:
        """The ops of one kind in the body, in order."""
        return [op for op in self.body.block.ops if isinstance(op, kind)]

    def verify_(self) -> None:
        inputs = tuple(self.function_type.inputs.data)
        extra = inputs[3:]
        allowed = [t for t in self.EXTRA_ARGUMENT_TYPES if t in extra]
        if inputs[:3] != self.ARGUMENT_TYPES or list(extra) != allowed:
            raise VerifyException(
                "attn.variant takes (!attn.query, !attn.key, !attn.value) then optionally, in "
                f"this order, {', '.join(str(t) for t in self.EXTRA_ARGUMENT_TYPES)}; "
                f"got ({', '.join(str(t) for t in inputs)})"
            )
        if tuple(self.function_type.outputs.data) != (OutputType(),):
            raise VerifyException("attn.variant returns one !attn.output")
        block = self.body.block
        if tuple(block.arg_types) != inputs:
            raise VerifyException("entry block arguments must match the variant's inputs")
        for op in block.ops:
            # A variant says its attention in attn ops only: the passes read nothing else, and
            # canonicalization would erase an unused foreign op silently.
            if not op.name.startswith("attn."):
                raise ForeignOp(op)
        check_defined_before_use(self)
        for op in block.ops:
            # Every other op is a block's: the passes know it by its interface alone, so an op
            # without one (an out-of-tree block's omission) would reach them as nothing.
            if not isinstance(op, CORE_OPS) and not op.has_trait(Normalizer) and not is_score_op(op):
                raise OpWithoutRole(op)
        for kind, what in ((ScoresOp, "attn.scores"), (PVOp, "attn.pv")):
            if len(self.ops_of(kind)) != 1:
                raise VerifyException(f"a variant needs exactly one {what}")
        normalizers = [op for op in block.ops if op.has_trait(Normalizer)]
        if len(normalizers) != 1:
            raise VerifyException(
                f"a variant needs exactly one normalizer, found {len(normalizers)}"
            )
        rotations = {op.rope_key for op in self.ops_of(RopeOp) if isinstance(op, RopeOp)}
        if len(rotations) > 1:
            raise VerifyException(
                "the query and key rotations must use the same theta, rotary_dim and layout"
            )
        for kind in (QueryType, KeyType):
            ropes = [op for op in self.ops_of(RopeOp) if isinstance(op.input.type, kind)]
            if len(ropes) > 1:
                raise VerifyException(f"{kind.name} is rotated more than once")

    @classmethod
    def parse(cls, parser: Parser) -> VariantOp:
        name, inputs, outputs, region, extra, _arg_attrs, _res_attrs = parse_func_op_like(
            parser, reserved_attr_names=("sym_name", "function_type")
        )
        op = cls(name, region, inputs[3:])
        op.properties["function_type"] = FunctionType.from_lists(inputs, outputs)
        if extra is not None:
            op.attributes |= extra.data
        return op

    def print(self, printer: Printer) -> None:
        print_func_op_like(
            printer,
            self.sym_name,
            self.function_type,
            self.body,
            self.attributes,
            reserved_attr_names=("sym_name", "function_type"),
        )


CORE_OPS: tuple[type[IRDLOperation], ...] = (RopeOp, ScoresOp, PVOp, YieldOp, VariantOp)
"""The ops every variant is built around; blocks add the rest (`attnfuse.blocks`)."""

CORE_ATTRIBUTES: tuple[type[Attribute], ...] = (
    QueryType,
    KeyType,
    ValueType,
    BiasType,
    LayoutType,
    DocIdsType,
    PositionsType,
    ScoresType,
    ProbsType,
    OutputType,
    BandAttr,
    PlacementAttr,
)
"""The dialect's core types and attributes."""


def score_chain(variant: VariantOp) -> tuple[ScoresOp, list[Operation], Operation]:
    """The variant's data flow from the scores to the probabilities: the `attn.scores` op,
    the ops on the path from it to the normalizer's input (in program order, as many times
    as they appear), and the normalizer. Ops off the path (whose result nothing on it reads)
    are not part of the computation and are not returned."""
    (pv,) = variant.ops_of(PVOp)
    normalizer = pv.operands[0].owner
    assert isinstance(normalizer, Operation) and normalizer.has_trait(Normalizer)
    chain: list[Operation] = []
    value = normalizer.operands[0]
    while not isinstance(value.owner, ScoresOp):
        op = value.owner
        assert isinstance(op, Operation)
        chain.append(op)
        value = op.operands[0]
    return value.owner, chain[::-1], normalizer


def is_score_op(op: Operation) -> bool:
    """Whether `op` sits between the scores and the normalizer (a modifier or a filter)."""
    return op.has_trait(ScoreModifier) or op.has_trait(KeyFilter)


__all__ = [
    "CORE_ATTRIBUTES",
    "CORE_OPS",
    "BandAttr",
    "BiasType",
    "KeyType",
    "LayoutType",
    "DocIdsType",
    "MaskPredicate",
    "OutputType",
    "PVOp",
    "Placement",
    "PlacementAttr",
    "PositionsType",
    "ProbsType",
    "QueryType",
    "RopeOp",
    "ScoresOp",
    "ScoresType",
    "ValueType",
    "VariantOp",
    "YieldOp",
    "intersect_bands",
    "is_score_op",
    "score_chain",
    "MIN_LLAMA3_FACTOR",
    "finite_real",
    "llama3_scaling_problem",
    "valid_rotary_dim",
]
