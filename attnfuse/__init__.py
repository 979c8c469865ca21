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


def _choose_triton_mode_early() -> None:
    # Triton fixes interpreter-or-GPU when `triton.language` is first imported. If torch is
    # already loaded, decide now (it is cheap), before something like torch.compile imports
    # Triton; otherwise the runtime decides when it loads, keeping attnfuse-opt torch-free.
    import sys

    if "torch" in sys.modules:
        from attnfuse.runtime import select_triton_mode

        select_triton_mode()


_choose_triton_mode_early()

from attnfuse.blocks.additive_bias import additive_bias  # noqa: E402
from attnfuse.blocks.alibi import alibi  # noqa: E402
from attnfuse.blocks.block_sparse import block_sparse  # noqa: E402
from attnfuse.blocks.document import document  # noqa: E402
from attnfuse.blocks.masks import causal, full, sliding_window  # noqa: E402
from attnfuse.blocks.relu import relu  # noqa: E402
from attnfuse.blocks.sigmoid import sigmoid  # noqa: E402
from attnfuse.blocks.softcap import softcap  # noqa: E402
from attnfuse.blocks.softmax import softmax  # noqa: E402
from attnfuse.dsl import AttentionSpec, attention, llama3_scaling, rope, scaled_dot_product  # noqa: E402
from attnfuse.errors import AttnFuseError  # noqa: E402

_RUNTIME_NAMES = {
    "compile": "attnfuse.runtime.api",
    "CompiledAttention": "attnfuse.runtime.api",
    "TileConfig": "attnfuse.runtime.config",
    "reference_attention": "attnfuse.runtime.reference",
}


def __getattr__(name: str) -> Any:
    if name in _RUNTIME_NAMES:
        return getattr(import_module(_RUNTIME_NAMES[name]), name)
    raise AttributeError(f"module 'attnfuse' has no attribute {name!r}")


__all__ = [
    "AttentionSpec",
    "AttnFuseError",
    "CompiledAttention",
    "TileConfig",
    "additive_bias",
    "alibi",
    "attention",
    "block_sparse",
    "causal",
    "document",
    "llama3_scaling",
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
