"""The DSL's building-block protocol and its core blocks (`scaled_dot_product`, `rope`).

Each block is an immutable value holding only static parameters; tensors that are data (a
bias, a block layout) are passed at call time. Parameters are checked when the block is made,
so a bad one fails where the user wrote it. Every other block is defined, with its op and its
meaning, in its own module under `attnfuse/blocks/`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from xdsl.ir import Attribute, Operation, SSAValue

from attnfuse.dialects.attn import (MAX_SCORE_SCALE, MIN_SCORE_SCALE, finite_real, llama3_scaling_problem,
                                    valid_rotary_dim)
from attnfuse.errors import CompositionError

if TYPE_CHECKING:
    from attnfuse.dialects.attn import VariantOp


@dataclass(frozen=True)
class Block:
    """Base class of the building blocks."""

    category: ClassVar[str]
    """What the block is: 'transform' (before QK^T), 'scores', 'modifier' (added to the
    scores), 'mask' or 'normalizer'."""

    stage: ClassVar[int] = 1
    """Score blocks (modifiers, masks): the order the DSL applies them in, lower first; blocks
    of one stage keep the user's order (canonicalize-attn orders those that commute)."""
    arguments: ClassVar[tuple[Attribute, ...]] = ()
    """The call-time data types (`!attn.bias`, ...) a variant with this block takes."""
    hint: ClassVar[str] = "scores"
    """The name of the value `build` makes, in the printed IR."""

    def build(self, variant: VariantOp, value: SSAValue) -> Operation:
        """The attn op this block adds after `value` (scores; a normalizer's result is the
        probabilities). The core blocks (rope, scaled_dot_product) are built by
        `build_ir` itself."""
        raise NotImplementedError(f"{self.block_name} is built by build_ir")

    def restates_default(self) -> bool:
        """Whether the block only restates what a variant does without it."""
        return False

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if v is not None and v is not False)
        return f"{self.block_name}({params})"

    @property
    def block_name(self) -> str:
        """The block's name in reprs, errors and the canonical order: its class's name in
        snake case (`SlidingWindow` -> `sliding_window`), as its constructor is spelled."""
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(self).__name__).lower()


@dataclass(frozen=True, repr=False)
class ScaledDotProduct(Block):
    """`s = scale * <q~, k~>`; `scale` defaults to `1/sqrt(D)`."""

    scale: float | None = None
    category: ClassVar[str] = "scores"

    def __post_init__(self) -> None:
        if self.scale is not None:
            scale = finite_real(self.scale)
            if scale is None or scale <= 0:
                raise CompositionError(
                    f"scaled_dot_product: scale must be a positive finite number, got {self.scale!r}"
                )
            if not MIN_SCORE_SCALE <= scale <= MAX_SCORE_SCALE:
                raise CompositionError(
                    f"scaled_dot_product: scale must lie in [{MIN_SCORE_SCALE:.3g}, "
                    f"{MAX_SCORE_SCALE:.3g}] (kernels scale in fp32), got {self.scale!r}"
                )
            object.__setattr__(self, "scale", scale)

    def restates_default(self) -> bool:
        return self.scale is None


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama-3.1's RoPE frequency scaling: long wavelengths are divided by `factor`, short
    ones kept, and those between blended (see `docs/semantics.md`)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __repr__(self) -> str:
        return (
            f"llama3_scaling(factor={self.factor!r}, low_freq_factor={self.low_freq_factor!r}, "
            f"high_freq_factor={self.high_freq_factor!r}, "
            f"original_max_position={self.original_max_position!r})"
        )

    def __post_init__(self) -> None:
        problem = llama3_scaling_problem(
            (self.factor, self.low_freq_factor, self.high_freq_factor, self.original_max_position))
        if problem is not None:
            raise CompositionError(f"llama3_scaling: {problem}")


@dataclass(frozen=True, repr=False)
class Rope(Block):
    """Rotary position embedding of q and k (see DESIGN.md for the exact rotation)."""

    theta: float = 10000.0
    rotary_dim: int | None = None
    interleaved: bool = False
    scaling: Llama3Scaling | None = None
    category: ClassVar[str] = "transform"

    def __post_init__(self) -> None:
        theta = finite_real(self.theta)
        if theta is None or theta <= 1:
            raise CompositionError(f"rope: theta must be a finite number > 1, got {self.theta!r}")
        object.__setattr__(self, "theta", theta)
        if self.rotary_dim is not None:
            if isinstance(self.rotary_dim, bool) or not isinstance(self.rotary_dim, int):
                raise CompositionError(f"rope: rotary_dim must be an int, got {self.rotary_dim!r}")
            if not valid_rotary_dim(self.rotary_dim):
                raise CompositionError(f"rope: rotary_dim must be positive, even and below 2^31, got {self.rotary_dim}")
        if not isinstance(self.interleaved, bool):
            raise CompositionError(f"rope: interleaved must be a bool, got {self.interleaved!r}")
        if self.scaling is not None and not isinstance(self.scaling, Llama3Scaling):
            raise CompositionError(
                f"rope: scaling must be af.llama3_scaling(...) or None, got {self.scaling!r}"
            )


def scaled_dot_product(scale: float | None = None) -> ScaledDotProduct:
    """Scores `scale * <q~_i, k~_j>`, default scale `1/sqrt(D)`. Implied when absent."""
    return ScaledDotProduct(scale)


def rope(
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    scaling: Llama3Scaling | None = None,
) -> Rope:
    """Rotary position embedding of q and k, fused into the kernel where that pays.

    `rotary_dim` (even, <= D; default D) dims are rotated, the rest pass through; pairs are
    `(x_t, x_{t+r/2})` (Llama, NeoX) or, with `interleaved=True`, `(x_{2t}, x_{2t+1})` (GPT-J).
    `scaling=af.llama3_scaling(...)` applies Llama-3.1's frequency scaling (Llama 3 itself is
    `theta=500000.0`).
    """
    return Rope(theta, rotary_dim, interleaved, scaling)


def llama3_scaling(
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position: int = 8192,
) -> Llama3Scaling:
    """Llama-3.1's RoPE frequency scaling, for `rope(scaling=...)`."""
    return Llama3Scaling(factor, low_freq_factor, high_freq_factor, original_max_position)


