"""AttnFuse: a composable attention DSL compiled to one fused Triton kernel per variant.

    import attnfuse as af
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    out = spec(q, k, v)

The compiler (DSL, dialects, passes, Triton printer) imports without torch or Triton, so
`attnfuse-opt` starts fast; the runtime names below load on first use.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"


from attnfuse.blocks.additive_bias import additive_bias
from attnfuse.blocks.alibi import alibi
from attnfuse.blocks.block_sparse import block_sparse
from attnfuse.blocks.document import document
from attnfuse.blocks.masks import causal, full, sliding_window
from attnfuse.blocks.relu import relu
from attnfuse.blocks.sigmoid import sigmoid
from attnfuse.blocks.softcap import softcap
from attnfuse.blocks.softmax import softmax
from attnfuse.dsl import AttentionSpec, attention, llama3_scaling, rope, scaled_dot_product
from attnfuse.errors import ArgumentError, AttnFuseError, CompositionError, IRError, PassOptionError

_RUNTIME_NAMES = {
    "compile": "attnfuse.runtime.api",
    "CompiledAttention": "attnfuse.runtime.api",
    "TileConfig": "attnfuse.runtime.config",
    "merge_states": "attnfuse.runtime.merge_states",
    "reference_attention": "attnfuse.runtime.reference",
}


def __getattr__(name: str) -> Any:
    if name in _RUNTIME_NAMES:
        return getattr(import_module(_RUNTIME_NAMES[name]), name)
    raise AttributeError(f"module 'attnfuse' has no attribute {name!r}")


__all__ = [
    "ArgumentError",
    "AttentionSpec",
    "AttnFuseError",
    "CompositionError",
    "IRError",
    "PassOptionError",
    "CompiledAttention",
    "TileConfig",
    "additive_bias",
    "alibi",
    "attention",
    "block_sparse",
    "causal",
    "document",
    "llama3_scaling",
    "merge_states",
    "relu",
    "compile",
    "full",
    "reference_attention",
    "rope",
    "scaled_dot_product",
    "sliding_window",
    "sigmoid",
    "softcap",
    "softmax",
]
