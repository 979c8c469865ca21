"""Band masks: `full()`, `causal()` and `sliding_window(w)`, all one op, `attn.mask`.

A mask keeps key j for query i when every one of its predicates keeps it; predicates are
attributes (`#attn.causal`, `#attn.window<w>`), so masks intersect by merging predicate lists
and an empty list (`full()`) keeps every key. Every predicate is a *band* of offsets from the
query's position: `analyze-masks` records the intersection on the op, and `lower-to-tile`
turns it into the loops' block ranges (empty blocks never visited, full blocks unmasked) and a
`tile.mask` in the partial ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects.builtin import ArrayAttr, IntAttr
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_attr_definition,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern
from xdsl.traits import HasCanonicalizationPatternsTrait, Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn import MAX_BAND_OFFSET, BandAttr, MaskPredicate, ScoresType, intersect_bands
from attnfuse.dialects.interfaces import KeyFilter
from attnfuse.dsl.blocks import Block
from attnfuse.errors import CompositionError


@irdl_attr_definition
class CausalAttr(MaskPredicate):
    """`#attn.causal`: keep keys at or before the query's position (`k_pos <= q_pos`)."""

    name = "attn.causal"

    def band(self) -> tuple[int | None, int | None]:
        return (None, 0)


MAX_WINDOW = MAX_BAND_OFFSET + 1
"""The widest window: its band's offsets, `±(w - 1)`, must stay within `MAX_BAND_OFFSET`."""


def _too_wide(size: int) -> str:
    return (f"window size must be at most {MAX_WINDOW} (its band offsets are added to positions "
            f"in int32), got {size}")


@irdl_attr_definition
class WindowAttr(MaskPredicate):
    """`#attn.window<w>`: keep keys with `|q_pos - k_pos| < w`."""

    name = "attn.window"

    size: IntAttr

    def __init__(self, size: int):
        super().__init__(IntAttr(size))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            size = parser.parse_integer(allow_boolean=False)
            if size <= 0:
                parser.raise_error(f"window size must be positive, got {size}")
            if size > MAX_WINDOW:
                parser.raise_error(_too_wide(size))
            return (IntAttr(size),)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.size.data}>")

    def verify(self) -> None:
        if self.size.data <= 0:
            raise VerifyException(f"window size must be positive, got {self.size.data}")
        if self.size.data > MAX_WINDOW:
            raise VerifyException(_too_wide(self.size.data))

    def band(self) -> tuple[int | None, int | None]:
        w = self.size.data
        return (-(w - 1), w - 1)


@dataclass(frozen=True)
class MaskSemantics(KeyFilter):
    """What `attn.mask` means: the intersection of its predicates' bands."""

    def band(self, op: Operation) -> tuple[int | None, int | None]:
        assert isinstance(op, MaskOp)
        return intersect_bands([p.band() for p in op.predicate_list])

    def evaluate(self, op: Operation, env: Any) -> Any:
        lower, upper = self.band(op)
        offset = env.k_pos[None, :] - env.q_pos[:, None]
        keep = offset == offset  # all True, of the right shape
        if lower is not None:
            keep = keep & (offset >= lower)
        if upper is not None:
            keep = keep & (offset <= upper)
        return keep


@irdl_op_definition
class MaskOp(IRDLOperation):
    """Drops the keys that not every predicate keeps: `s[i, j]` becomes "dropped".

    An empty predicate list keeps every key (the DSL's `full()`). `band`, added by
    `analyze-masks`, is the intersection of the band predicates.
    """

    name = "attn.mask"

    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    predicates = prop_def(ArrayAttr[Attribute])
    band = opt_prop_def(BandAttr)

    assembly_format = "$input $predicates attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = lazy_traits_def(lambda: (Pure(), MaskSemantics(), MaskCanonicalization()))

    def __init__(
        self,
        scores: SSAValue,
        predicates: Sequence[MaskPredicate],
        band: BandAttr | None = None,
    ):
        super().__init__(
            operands=[scores],
            result_types=[ScoresType()],
            properties={"predicates": ArrayAttr(predicates), "band": band},
        )

    @property
    def predicate_list(self) -> list[MaskPredicate]:
        """The predicates, typed."""
        return [p for p in self.predicates.data if isinstance(p, MaskPredicate)]

    def verify_(self) -> None:
        for pred in self.predicates.data:
            if not isinstance(pred, MaskPredicate):
                raise VerifyException(f"mask predicate expected, got {pred}")
        if self.band is not None:
            expected = intersect_bands([p.band() for p in self.predicate_list])
            if self.band.bounds != expected:
                raise VerifyException(
                    f"band {self.band.bounds} does not match the predicates' band {expected}"
                )


@dataclass(frozen=True, repr=False)
class Full(Block):
    """Every key is kept (the default mask)."""

    category: ClassVar[str] = "mask"
    hint: ClassVar[str] = "kept"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return MaskOp(value, [])

    def restates_default(self) -> bool:
        return True


@dataclass(frozen=True, repr=False)
class Causal(Block):
    """Keep keys at or before the query's position: `k_pos <= q_pos`."""

    category: ClassVar[str] = "mask"
    hint: ClassVar[str] = "kept"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return MaskOp(value, [CausalAttr()])


@dataclass(frozen=True, repr=False)
class SlidingWindow(Block):
    """Keep keys with `|q_pos - k_pos| < window` (with `causal`: the causal band)."""

    window: int = 0
    category: ClassVar[str] = "mask"
    hint: ClassVar[str] = "kept"

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0:
            raise CompositionError(f"sliding_window: window must be a positive int, got {self.window!r}")
        if self.window > MAX_WINDOW:
            raise CompositionError(f"sliding_window: {_too_wide(self.window)}")

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return MaskOp(value, [WindowAttr(self.window)])


def full() -> Full:
    """Keep every key. Combining it with another mask is an error."""
    return Full()


def causal() -> Causal:
    """Keep keys with `k_pos <= q_pos` (bottom-right aligned when Nq != Nk)."""
    return Causal()


def sliding_window(window: int) -> SlidingWindow:
    """Keep keys with `|q_pos - k_pos| < window`."""
    return SlidingWindow(window)


OPS = (MaskOp,)
ATTRIBUTES = (CausalAttr, WindowAttr)


# --------------------------------------------------------------------------------------------
# Canonicalization (run by canonicalize-attn, and by xDSL's `canonicalize`)
# --------------------------------------------------------------------------------------------


def canonical_predicates(predicates: list[MaskPredicate]) -> list[MaskPredicate]:
    """Sorted, deduplicated predicates, with all windows intersected into the narrowest."""
    windows = [p for p in predicates if isinstance(p, WindowAttr)]
    others = {str(p): p for p in predicates if not isinstance(p, WindowAttr)}
    merged = list(others.values())
    if windows:
        merged.append(min(windows, key=lambda w: w.size.data))
    return sorted(merged, key=str)


class MergeAdjacentMasks(RewritePattern):
    """`mask(mask(s, A), B)` -> `mask(s, A + B)` when the inner mask has no other use."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        inner = op.input.owner
        if not isinstance(inner, MaskOp) or not inner.result.has_one_use():
            return
        # Intersecting two masks is concatenating their predicates; the sort pattern then
        # orders and deduplicates them.
        merged = MaskOp(inner.input, inner.predicate_list + op.predicate_list)
        rewriter.replace(op, merged)
        rewriter.erase(inner)


class SortMaskPredicates(RewritePattern):
    """Puts a mask's predicates in canonical order, without duplicates or redundant windows
    (dropping a stale `band`: analyze-masks recomputes it)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        current = op.predicate_list
        canonical = canonical_predicates(current)
        if canonical == current:
            return
        op.properties["predicates"] = ArrayAttr(canonical)
        op.properties.pop("band", None)
        rewriter.handle_operation_modification(op)


class DropEmptyMask(RewritePattern):
    """A mask with no predicates keeps every key: its scores are its input's."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: MaskOp, rewriter: PatternRewriter) -> None:
        if op.predicate_list:
            return
        rewriter.replace(op, [], [op.input])


class MaskCanonicalization(HasCanonicalizationPatternsTrait):
    """`attn.mask`'s canonical form: merged, sorted, deduplicated, never empty."""

    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return (MergeAdjacentMasks(), SortMaskPredicates(), DropEmptyMask())
