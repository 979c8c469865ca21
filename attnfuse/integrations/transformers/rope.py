"""`fuse_rope(model)`: RoPE inside the AttnFuse kernel for Llama-family HF models.

HF's Llama, Mistral and Qwen2 attentions rotate q and k with `apply_rotary_pos_emb` (half-split
pairs, `rotate_half`) before the cache update and the attention call. `fuse_rope` gives each
attention module a replacement forward that hands the kernel the *unrotated* q (and, without a
cache, the unrotated k) with HF's per-row `position_ids` `[B, N]` as `q_positions=` /
`k_positions=`, so the rotation runs in registers. With a KV cache the new keys are rotated
once, as they are written (`rotate_keys`), and the kernel, compiled with
`rope_placement=("auto", "given")`, rotates only the new queries: no step rotates the cached
keys again.
"""

from __future__ import annotations

import types

import torch

import attnfuse as af
from attnfuse.errors import AttnFuseError
from attnfuse.integrations.transformers.attention import (
    RopeCall,
    rope_signature,
    run_attention,
    warn_no_attention_weights,
)
from attnfuse.runtime.key_rotation import rotate_keys as rotate_by_key
from attnfuse.runtime.launch import rope_frequency

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""`config.model_type`s whose attention `fuse_rope` replaces (their attention classes share
Llama's forward: projections, `apply_rotary_pos_emb`, cache update, attention interface)."""

_ATTENTION_CLASSES = {"llama": "LlamaAttention", "mistral": "MistralAttention", "qwen2": "Qwen2Attention"}


def rope_block(config: object) -> af.rope:
    """The `af.rope` block of an HF config's RoPE, or an `AttnFuseError` saying why there is
    none: only the "default" and "llama3" rope types, rotating the whole head."""
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or "rope_theta" not in params:
        raise AttnFuseError(f"fuse_rope: config.rope_parameters must hold rope_theta, got {params!r}")
    rope_type = params.get("rope_type", "default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise AttnFuseError("fuse_rope: partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return af.rope(theta=float(params["rope_theta"]))
    if rope_type == "llama3":
        scaling = af.llama3_scaling(
            factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=params["original_max_position_embeddings"],
        )
        return af.rope(theta=float(params["rope_theta"]), scaling=scaling)
    raise AttnFuseError(
        f"fuse_rope: rope_type {rope_type!r} is not supported (only 'default' and 'llama3'; "
        "'linear', 'dynamic', 'yarn', 'longrope' change positions or scale cos/sin)"
    )


def _frequencies(block: af.rope, rotary_dim: int) -> torch.Tensor:
    scaling = None
    if block.scaling is not None:
        s = block.scaling
        scaling = (s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position)
    freqs = [rope_frequency(block.theta, rotary_dim, t, scaling) for t in range(rotary_dim // 2)]
    return torch.tensor(freqs, dtype=torch.float64).to(torch.float32)


def rotate_keys(key: torch.Tensor, positions: torch.Tensor, block: af.rope) -> torch.Tensor:
    """`key [B, Hkv, N, D]` rotated by `block` at `positions [B, N]`, by AttnFuse's own
    rotation kernel (`CompiledAttention.rotate_keys`: the numbers a fused rotation would use);
    differentiable, and an operator under tracing. What `fuse_rope` writes into a KV cache."""
    return rotate_by_key(rope_signature(block), key, positions)


def _check_frequencies(model: torch.nn.Module, block: af.rope, head_dim: int) -> None:
    """The model's own rotary frequencies must be the block's (catches a rope type or a
    parameter that `rope_block` misread)."""
    for module in model.modules():
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, torch.Tensor) and hasattr(module, "attention_scaling"):
            ours = _frequencies(block, head_dim).to(inv_freq.device)
            # A model cast to half precision casts this buffer too: compare at its precision.
            rtol = max(1e-5, torch.finfo(inv_freq.dtype).eps)
            if inv_freq.shape != ours.shape or not torch.allclose(inv_freq.float(), ours, rtol=rtol, atol=0):
                raise AttnFuseError(f"fuse_rope: {type(module).__name__}'s frequencies differ from {block!r}")
            if module.attention_scaling != 1.0:
                raise AttnFuseError("fuse_rope: rotary attention_scaling != 1 is not supported")


def _fused_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: object = None,
    attention_mask: object = None,
    cache: object = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Llama's attention forward with RoPE in the kernel (`position_embeddings` unused)."""
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    if kwargs.get("output_attentions", False):
        warn_no_attention_weights()
    position_ids = kwargs.get("position_ids")
    if not isinstance(position_ids, torch.Tensor):
        raise AttnFuseError("fuse_rope: the attention was called without position_ids")
    batch, length = hidden_states.shape[:2]
    shape = (batch, length, -1, self.head_dim)
    query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    positions = position_ids.expand(batch, length)
    block = self._attnfuse_rope
    if cache is not None:
        # Rotated once, here, as it is written; the kernel rotates only the new queries.
        key = rotate_keys(key, positions, block)
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
        call = RopeCall(block, positions, None)
    else:
        call = RopeCall(block, positions, positions)
    window = getattr(self, "sliding_window", getattr(self.config, "sliding_window", None))
    out = run_attention(self, query, key, value, attention_mask,
                        dropout=self.attention_dropout if self.training else 0.0,
                        scaling=self.scaling, sliding_window=window, rope=call)
    return self.o_proj(out.reshape(batch, length, -1)), None


def fuse_rope(model: torch.nn.Module) -> torch.nn.Module:
    """Runs RoPE inside the AttnFuse kernel in a Llama, Mistral or Qwen2 model loaded with
    `attn_implementation="attnfuse"`; returns the model. Idempotent. Refuses (AttnFuseError)
    other model types, rope types other than "default" and "llama3", partial rotary, and a
    model whose rotary frequencies differ from the config's."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise AttnFuseError(
            f"fuse_rope: model type {model_type!r} is not supported (only {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if getattr(config, "_attn_implementation", None) != "attnfuse":
        raise AttnFuseError(
            "fuse_rope: load the model with attn_implementation='attnfuse' (after "
            "attnfuse.integrations.transformers.register()), so that masks reach the kernel "
            f"as AttnFuse blocks; it uses {getattr(config, '_attn_implementation', None)!r}"
        )
    block = rope_block(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim % 2:
        raise AttnFuseError(f"fuse_rope: head_dim must be even, got {head_dim}")
    _check_frequencies(model, block, head_dim)
    name = _ATTENTION_CLASSES[model_type]
    attentions = [m for m in model.modules() if type(m).__name__ == name]
    if not attentions:
        raise AttnFuseError(f"fuse_rope: no {name} module in the model")
    for module in attentions:
        if getattr(module, "_attnfuse_rope", None) is not None:
            continue  # already fused
        module._attnfuse_rope = block
        module.forward = types.MethodType(_fused_forward, module)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        # generate() compiles a static-cache decode with CUDA graphs; a call with call-time
        # RoPE positions reads their range on the host once per positions tensor (to size
        # the rotation table), which a graph capture cannot do: decode eagerly instead.
        generation.disable_compile = True
    return model
