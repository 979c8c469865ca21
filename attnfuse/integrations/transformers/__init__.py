"""AttnFuse as a drop-in attention for Hugging Face transformers (docs/integrations.md).

    from attnfuse.integrations import transformers as af_hf
    af_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attnfuse")
    af_hf.fuse_rope(model)          # optional, Llama/Mistral/Qwen2: RoPE inside the kernel

Needs `transformers>=5` (the `hf` extra).
"""

from __future__ import annotations

from attnfuse.integrations.transformers import mask_factories
from attnfuse.integrations.transformers.attention import attnfuse_attention_forward
from attnfuse.integrations.transformers.masks import AttnFuseMask, attnfuse_mask
from attnfuse.integrations.transformers.rope import fuse_rope, rotate_keys

IMPLEMENTATION = "attnfuse"
"""The `attn_implementation` name `register()` adds."""


def register() -> None:
    """Registers AttnFuse's attention function and mask function with transformers under
    "attnfuse", so that `attn_implementation="attnfuse"` works for every model that goes
    through HF's attention interface; and puts readable stand-ins for HF's mask-function
    factories in `masking_utils` (`mask_factories.install`: they keep exactly what HF's
    closures keep, and their parts can be read under `torch.compile`). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    mask_factories.install()
    AttentionInterface.register(IMPLEMENTATION, attnfuse_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, attnfuse_mask)


__all__ = ["IMPLEMENTATION", "AttnFuseMask", "attnfuse_attention_forward", "attnfuse_mask",
           "fuse_rope", "register", "rotate_keys"]
