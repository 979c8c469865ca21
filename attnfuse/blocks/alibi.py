"""ALiBi, `alibi(slopes=None)`: `s += slope[h] * (k_pos - q_pos)`.

Slopes are one per query head; absent, they are the ALiBi paper's geometric sequence for the
call's head count (its rule for a non-power-of-two count included). The kernels read them as
a call-time fp32 tensor (`slopes`), which the runtime makes from the op's parameters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects.builtin import ArrayAttr, FloatAttr, f64
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def
from xdsl.irdl import opt_prop_def, result_def, traits_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects import tile
from attnfuse.dialects.attn import FP32_MAX, finite_real, ScoresType
from attnfuse.dialects.interfaces import DataUse, ScoreModifier
from attnfuse.dsl.blocks import Block
from attnfuse.errors import ArgumentError, CompositionError

ALIBI_RANK = 10
"""ALiBi's `ScoreModifier.rank`: before the additive bias, which commutes with it."""


def default_alibi_slopes(heads: int) -> list[float]:
    """The ALiBi paper's slopes: a geometric sequence starting at 2^(-8/n) for n a power of
    two; otherwise those of the nearest lower power of two, then every other slope of twice
    that many heads."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads == 0:
        return []
    if heads & (heads - 1) == 0:
        return power_of_two_slopes(heads)
    lower = 2 ** math.floor(math.log2(heads))
    return power_of_two_slopes(lower) + power_of_two_slopes(2 * lower)[0::2][: heads - lower]


@dataclass(frozen=True)
class AlibiSemantics(ScoreModifier):
    """What `attn.alibi` means to the compiler, the runtime and the reference."""

    rank: int = ALIBI_RANK
    additive: bool = True

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        slopes = kernel.data_arg(op, "slopes")
        return kernel.add(tile.AlibiOp(scores, slopes), "scores").results[0]

    def data(self, op: Operation) -> Sequence[DataUse]:
        assert isinstance(op, AlibiOp)
        return (DataUse("slopes", (op.slope_values,)),)

    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        import torch

        assert isinstance(op, AlibiOp)
        # The kernels read the slopes as float32 (docs/semantics.md, ALiBi): round them so.
        slope = torch.tensor(self.slopes_for(op, env.heads_q), dtype=torch.float32).to(scores)
        distance = (env.k_pos[None, :] - env.q_pos[:, None]).to(scores)
        return scores + slope[None, :, None, None] * distance

    @staticmethod
    def slopes_for(op: AlibiOp, heads: int) -> list[float]:
        """The slope of each of `heads` query heads, checked against the op's list."""
        values = default_alibi_slopes(heads) if op.slope_values is None else list(op.slope_values)
        if len(values) != heads:
            raise ArgumentError(f"alibi: {len(values)} slopes given for {heads} query heads")
        return values

    def bind(self, op: Operation, use: DataUse, problem: Any, arguments: dict[str, Any]) -> Any:
        """The fp32 slope per query head the kernels read (the `slopes` tensor)."""
        import torch

        assert isinstance(op, AlibiOp)
        return torch.tensor(self.slopes_for(op, problem.heads_q), dtype=torch.float32, device=problem.device)


@irdl_op_definition
class AlibiOp(IRDLOperation):
    """ALiBi: `s[i, j] += slope[h] * (k_pos(j) - q_pos(i))`.

    `slopes` lists one slope per query head; absent, they are the ALiBi paper's geometric
    sequence for the call's head count (its rule for a non-power-of-two count included).
    """

    name = "attn.alibi"

    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    slopes = opt_prop_def(ArrayAttr[FloatAttr])

    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), AlibiSemantics())

    def __init__(self, scores: SSAValue, slopes: Sequence[float] | None = None):
        super().__init__(
            operands=[scores],
            result_types=[ScoresType()],
            properties={
                "slopes": None if slopes is None else ArrayAttr([FloatAttr(x, f64) for x in slopes])
            },
        )

    @property
    def slope_values(self) -> tuple[float, ...] | None:
        """The explicit slopes, or None for the default sequence."""
        return None if self.slopes is None else tuple(a.value.data for a in self.slopes.data)

    def verify_(self) -> None:
        if self.slopes is not None and not self.slopes.data:
            raise VerifyException("alibi slopes, when given, must list one slope per head")
        for value in self.slope_values or ():
            if not abs(value) <= FP32_MAX:
                raise VerifyException(f"alibi slopes must be finite fp32 numbers, got {value}")


@dataclass(frozen=True, repr=False)
class Alibi(Block):
    """`s += slope[h] * (k_pos - q_pos)`; default slopes from the ALiBi paper."""

    slopes: tuple[float, ...] | None = None
    category: ClassVar[str] = "modifier"
    hint: ClassVar[str] = "biased"

    def __post_init__(self) -> None:
        if self.slopes is None:
            return
        if isinstance(self.slopes, (str, bytes)):  # a sequence, of characters
            raise CompositionError(f"alibi: slopes must be a sequence of numbers (int or float), got {self.slopes!r}")
        if isinstance(self.slopes, (AbstractSet, Mapping)):
            # Slope i is head i's: a set (or a dict's keys) has no order to say which is whose.
            raise CompositionError(f"alibi: slopes must be an ordered sequence, one per head, got a "
                                   f"{type(self.slopes).__name__}: {self.slopes!r}")
        try:
            values = tuple(self.slopes)
        except TypeError:
            raise CompositionError(f"alibi: slopes must be a sequence of numbers (int or float), got {self.slopes!r}") from None
        if any(_is_bool(x) for x in values):
            # As every block's numbers refuse bools: True is not a slope.
            raise CompositionError(f"alibi: slopes must be numbers, not bools, got {self.slopes!r}")
        # Python reals, or NumPy / torch scalars (0-d: a float32 one is not a float), by value.
        numbers = [x.item() if getattr(x, "ndim", None) == 0 and not isinstance(x, (int, float)) else x
                   for x in values]
        if not all(isinstance(x, (int, float)) for x in numbers):
            raise CompositionError(f"alibi: slopes must be a sequence of numbers (int or float), got {self.slopes!r}")
        slopes = tuple(finite_real(x) for x in numbers)
        if not slopes or any(x is None or not abs(x) <= FP32_MAX for x in slopes):
            raise CompositionError(f"alibi: slopes must be a non-empty list of finite numbers, got {self.slopes!r}")
        object.__setattr__(self, "slopes", slopes)

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return AlibiOp(value, self.slopes)


def _is_bool(x: object) -> bool:
    """A Python, NumPy or torch boolean (the last two by their dtype's name)."""
    return isinstance(x, bool) or str(getattr(x, "dtype", "")) in ("bool", "torch.bool")


def alibi(slopes=None) -> Alibi:
    """ALiBi: `s += slope[h] * (k_pos - q_pos)`. Default slopes: the ALiBi paper's geometric
    sequence for the call's number of query heads (non-powers of two included)."""
    return Alibi(slopes)


OPS = (AlibiOp,)
