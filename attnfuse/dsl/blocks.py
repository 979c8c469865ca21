"""The building blocks a variant is composed of.

Each block is an immutable value holding only static parameters; tensors that are data (a
bias, a block layout) are passed at call time. Parameters are checked when the block is made,
so a bad one fails where the user wrote it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from attnfuse.dialects.attn import MAX_SCORE_SCALE, MIN_SCORE_SCALE
from attnfuse.errors import CompositionError


@dataclass(frozen=True)
class Block:
    """Base class of the building blocks."""

    category: ClassVar[str]
    """What the block is: 'transform' (before QK^T), 'scores', 'modifier' (added to the
    scores), 'mask' or 'normalizer'."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if v is not None and v is not False)
        return f"{self.block_name}({params})"

    @property
    def block_name(self) -> str:
        return type(self).__name__.lower()


@dataclass(frozen=True, repr=False)
class ScaledDotProduct(Block):
    """`s = scale * <q~, k~>`; `scale` defaults to `1/sqrt(D)`."""

    scale: float | None = None
    category: ClassVar[str] = "scores"

    def __post_init__(self) -> None:
        if self.scale is not None:
            if (
                isinstance(self.scale, bool)
                or not isinstance(self.scale, (int, float))
                or not math.isfinite(self.scale)
                or self.scale <= 0
            ):
                raise CompositionError(
                    f"scaled_dot_product: scale must be a positive finite number, got {self.scale!r}"
                )
            if not MIN_SCORE_SCALE <= self.scale <= MAX_SCORE_SCALE:
                raise CompositionError(
                    f"scaled_dot_product: scale must lie in [{MIN_SCORE_SCALE:.3g}, "
                    f"{MAX_SCORE_SCALE:.3g}] (kernels scale in fp32), got {self.scale!r}"
                )
            object.__setattr__(self, "scale", float(self.scale))

    @property
    def block_name(self) -> str:
        return "scaled_dot_product"


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
        for name in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise CompositionError(f"llama3_scaling: {name} must be positive, got {value!r}")
        if not self.high_freq_factor > self.low_freq_factor:
            raise CompositionError(
                "llama3_scaling: high_freq_factor must exceed low_freq_factor, got "
                f"{self.high_freq_factor} <= {self.low_freq_factor}"
            )


@dataclass(frozen=True, repr=False)
class Rope(Block):
    """Rotary position embedding of q and k (see DESIGN.md for the exact rotation)."""

    theta: float = 10000.0
    rotary_dim: int | None = None
    interleaved: bool = False
    scaling: Llama3Scaling | None = None
    category: ClassVar[str] = "transform"

    def __post_init__(self) -> None:
        if not isinstance(self.theta, (int, float)) or not math.isfinite(self.theta) or self.theta <= 1:
            raise CompositionError(f"rope: theta must be a finite number > 1, got {self.theta!r}")
        object.__setattr__(self, "theta", float(self.theta))
        if self.rotary_dim is not None:
            if isinstance(self.rotary_dim, bool) or not isinstance(self.rotary_dim, int):
                raise CompositionError(f"rope: rotary_dim must be an int, got {self.rotary_dim!r}")
            if self.rotary_dim <= 0 or self.rotary_dim % 2:
                raise CompositionError(f"rope: rotary_dim must be positive and even, got {self.rotary_dim}")
        if not isinstance(self.interleaved, bool):
            raise CompositionError(f"rope: interleaved must be a bool, got {self.interleaved!r}")
        if self.scaling is not None and not isinstance(self.scaling, Llama3Scaling):
            raise CompositionError(
                f"rope: scaling must be af.llama3_scaling(...) or None, got {self.scaling!r}"
            )


@dataclass(frozen=True, repr=False)
class Full(Block):
    """Every key is kept (the default mask)."""

    category: ClassVar[str] = "mask"


@dataclass(frozen=True, repr=False)
class Causal(Block):
    """Keep keys at or before the query's position: `k_pos <= q_pos`."""

    category: ClassVar[str] = "mask"


@dataclass(frozen=True, repr=False)
class SlidingWindow(Block):
    """Keep keys with `|q_pos - k_pos| < window` (with `causal`: the causal band)."""

    window: int = 0
    category: ClassVar[str] = "mask"

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0:
            raise CompositionError(f"sliding_window: window must be a positive int, got {self.window!r}")

    @property
    def block_name(self) -> str:
        return "sliding_window"


@dataclass(frozen=True, repr=False)
class BlockSparse(Block):
    """Keep key j for query i iff `block_layout[i // block_size, j // block_size]`."""

    block_size: int = 0
    category: ClassVar[str] = "mask"

    def __post_init__(self) -> None:
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 16 or bs & (bs - 1):
            raise CompositionError(
                f"block_sparse: block_size must be a power of two >= 16, got {bs!r}"
            )

    @property
    def block_name(self) -> str:
        return "block_sparse"


@dataclass(frozen=True, repr=False)
class Alibi(Block):
    """`s += slope[h] * (k_pos - q_pos)`; default slopes from the ALiBi paper."""

    slopes: tuple[float, ...] | None = None
    category: ClassVar[str] = "modifier"

    def __post_init__(self) -> None:
        if self.slopes is None:
            return
        try:
            slopes = tuple(float(x) for x in self.slopes)
        except (TypeError, ValueError):
            raise CompositionError(f"alibi: slopes must be a sequence of numbers, got {self.slopes!r}") from None
        if not slopes or not all(math.isfinite(x) for x in slopes):
            raise CompositionError(f"alibi: slopes must be a non-empty list of finite numbers, got {self.slopes!r}")
        object.__setattr__(self, "slopes", slopes)


@dataclass(frozen=True, repr=False)
class AdditiveBias(Block):
    """`s += bias[b, h, i, j]`; the bias tensor is passed at call time as `bias=`."""

    category: ClassVar[str] = "modifier"

    @property
    def block_name(self) -> str:
        return "additive_bias"


@dataclass(frozen=True, repr=False)
class Relu(Block):
    """ReLU attention: `p = relu(s) / Nk` on kept keys, 0 elsewhere."""

    category: ClassVar[str] = "normalizer"


@dataclass(frozen=True, repr=False)
class Softmax(Block):
    """Softmax over the kept keys (the default normalizer)."""

    category: ClassVar[str] = "normalizer"


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


def alibi(slopes=None) -> Alibi:
    """ALiBi: `s += slope[h] * (k_pos - q_pos)`. Default slopes: the ALiBi paper's geometric
    sequence for the call's number of query heads (non-powers of two included)."""
    return Alibi(slopes)


def additive_bias() -> AdditiveBias:
    """`s += bias[b, h, i, j]`: pass `bias=` (broadcastable to `[B, Hq, Nq, Nk]`) at call time."""
    return AdditiveBias()


def block_sparse(block_size: int) -> BlockSparse:
    """Keep the blocks `block_layout[i // bs, j // bs]` marks; pass `block_layout=` (bool
    `[ceil(Nq/bs), ceil(Nk/bs)]` or per head `[Hq, ...]`) at call time."""
    return BlockSparse(block_size)


def relu() -> Relu:
    """Normalize with ReLU instead of softmax: `p = relu(s) / Nk` on kept keys."""
    return Relu()


def full() -> Full:
    """Keep every key. Combining it with another mask is an error."""
    return Full()


def causal() -> Causal:
    """Keep keys with `k_pos <= q_pos` (bottom-right aligned when Nq != Nk)."""
    return Causal()


def sliding_window(window: int) -> SlidingWindow:
    """Keep keys with `|q_pos - k_pos| < window`."""
    return SlidingWindow(window)


def softmax() -> Softmax:
    """Normalize scores with a softmax over the kept keys. Implied when absent."""
    return Softmax()
