"""AttnFuse: a composable attention DSL compiled to one fused Triton kernel per variant.

    import attnfuse as af
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    out = spec(q, k, v)
"""

__version__ = "0.1.0"


def _use_interpreter_without_gpu() -> None:
    # Triton picks interpreter or GPU compilation when `triton.language` is imported, so the
    # choice must be made before anything imports it: without a CUDA device, interpret.
    import os

    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_use_interpreter_without_gpu()

from attnfuse.dsl import (  # noqa: E402
    AttentionSpec,
    attention,
    causal,
    full,
    rope,
    scaled_dot_product,
    sliding_window,
    softmax,
)
from attnfuse.errors import AttnFuseError  # noqa: E402
from attnfuse.runtime.api import CompiledAttention, compile  # noqa: E402
from attnfuse.runtime.config import TileConfig  # noqa: E402
from attnfuse.runtime.reference import reference_attention  # noqa: E402

__all__ = [
    "AttentionSpec",
    "AttnFuseError",
    "CompiledAttention",
    "TileConfig",
    "attention",
    "causal",
    "compile",
    "full",
    "reference_attention",
    "rope",
    "scaled_dot_product",
    "sliding_window",
    "softmax",
]
