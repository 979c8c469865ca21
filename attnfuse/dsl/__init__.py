"""The DSL: building blocks and `attention(...)`, which composes them."""

from attnfuse.dsl.blocks import (
    causal,
    full,
    rope,
    scaled_dot_product,
    sliding_window,
    softmax,
)
from attnfuse.dsl.spec import AttentionSpec, attention

__all__ = [
    "AttentionSpec",
    "attention",
    "causal",
    "full",
    "rope",
    "scaled_dot_product",
    "sliding_window",
    "softmax",
]
