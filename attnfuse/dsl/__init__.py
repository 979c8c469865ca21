"""The DSL: building blocks and `attention(...)`, which composes them."""

from attnfuse.dsl.blocks import (
    additive_bias,
    alibi,
    block_sparse,
    causal,
    full,
    llama3_scaling,
    relu,
    rope,
    scaled_dot_product,
    sliding_window,
    softmax,
)
from attnfuse.dsl.spec import AttentionSpec, attention

__all__ = [
    "AttentionSpec",
    "additive_bias",
    "alibi",
    "attention",
    "block_sparse",
    "causal",
    "full",
    "llama3_scaling",
    "relu",
    "rope",
    "scaled_dot_product",
    "sliding_window",
    "softmax",
]
