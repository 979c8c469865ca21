"""The attention function registered with Hugging Face transformers under "attnfuse".

HF calls `attention(module, query, key, value, attention_mask, dropout=, scaling=, ...)` with
`query [B, Hq, Nq, D]` and `key`/`value [B, Hkv, Nk, D]` (after its cache update) and expects
`[B, Nq, Hq, Dv]` back. The call is translated into one AttnFuse variant: the mask description
(`masks.AttnFuseMask`) becomes `causal()` / `sliding_window(w)` over the written keys plus, for
padding and packed sequences, `document()` (a row's packed sequences as documents, padding
ids negative); a mask only HF could
make (`AttnFuseMask.dense`) an additive `-inf` bias; `scaling=` is `scaled_dot_product(scale)`; `softcap=` is
`softcap(cap)`; GQA is passed as is (Hkv < Hq, no `repeat_kv`). Compiled variants are kept in
a module-level cache keyed by the spec, so each variant compiles once per process and each
shape once per variant (the `CompiledAttention`'s own plan cache).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime import torch_op
from attnfuse.integrations.transformers.masks import AttnFuseMask, additive_mask

_compiled: dict[tuple, "af.CompiledAttention"] = {}

UNSUPPORTED_KEYWORDS = ("s_aux", "sinks")
"""Attention-interface keywords that change the result and that AttnFuse cannot honour
(GPT-OSS-style attention sinks): refused, never ignored."""

KEY_GIVEN = ("auto", "given")
"""The `rope_placement` of a call whose keys come from a KV cache, rotated when written: the
kernel rotates the queries (where the Rotation Calculus says) and reads k as passed."""


def compiled_variant(spec: af.AttentionSpec, rope_placement: object = "auto") -> "af.CompiledAttention":
    """The `af.compile(spec, rope_placement=...)` object for a variant, made once per process."""
    key = (spec, rope_placement)
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = af.compile(spec, rope_placement=rope_placement)
    return fn


Signature = tuple
"""A variant as plain Python constants: `(pattern, window, scaling, softcap, document, bias,
rope, placement)`, `scaling` and `softcap` as integer ratios (`_exact`) or None, `rope` being
`(theta, rotary_dim, interleaved, llama3 parameters or None)` or None, its floats as ratios
too (`_exact_rope`). What a traced call can
hand out of the graph (`_operator_key`)."""


def _exact(value: float | None) -> tuple[int, int] | None:
    """A float as its exact integer ratio. Under `torch.compile(dynamic=True)` Dynamo hands a
    module's float attributes (HF's `self.scaling`) in as symbolic floats, which the constant
    function `_operator_key` cannot take and `float()` keeps symbolic; their integer ratio is
    a pair of constants (Dynamo specializes the value, with a guard). `_float` undoes it."""
    if value is None:
        return None
    value = float(value)
    try:
        return value.as_integer_ratio()
    except (OverflowError, ValueError):  # inf, nan: the block refuses them with its own error
        return value  # type: ignore[return-value]


def _float(ratio: tuple[int, int] | float | None) -> float | None:
    """The float of `_exact`'s ratio (correctly rounded division: the very float it came from)."""
    if ratio is None or isinstance(ratio, float):
        return ratio
    return ratio[0] / ratio[1]

_by_signature: dict[Signature, "af.CompiledAttention"] = {}


def variant_of(signature: Signature) -> "af.CompiledAttention":
    """The compiled variant of a signature, made once per process (a dict lookup per call)."""
    fn = _by_signature.get(signature)
    if fn is None:
        pattern, window, scaling, softcap, document, bias, rope, placement = signature
        rope_block = None
        if rope is not None:
            theta, rotary_dim, interleaved, llama3 = rope
            if llama3 is not None:
                factor, low, high, original = llama3
                llama3 = af.llama3_scaling(_float(factor), _float(low), _float(high), original)
            rope_block = af.rope(_float(theta), rotary_dim, interleaved, llama3)
        fn = _by_signature[signature] = compiled_variant(
            _spec(pattern, window, document, bias, _float(scaling), _float(softcap), rope_block), placement)
    return fn


@torch._dynamo.assume_constant_result
def _operator_key(signature: Signature, explicit: tuple[bool, bool]) -> str:
    """The `torch.ops.attnfuse` key of a signature's variant. Run by Dynamo at trace time and
    its result kept as a constant: building and compiling a variant is xDSL code, which the
    tracer must not step into."""
    return variant_of(signature).operator_key(explicit)


def rope_signature(block: object) -> tuple | None:
    """An `af.rope` block as plain constants, in `attn.RopeOp.rope_key`'s order: theta,
    rotary width, interleaved, Llama-3.1 scaling (or None)."""
    if block is None:
        return None
    llama3 = block.scaling
    if llama3 is not None:
        llama3 = (llama3.factor, llama3.low_freq_factor, llama3.high_freq_factor,
                  llama3.original_max_position)
    return (block.theta, block.rotary_dim, block.interleaved, llama3)


def _exact_rope(rope: tuple | None) -> tuple | None:
    """`rope_signature`'s tuple with its floats (theta, the Llama-3.1 factors) as `_exact`
    ratios, for a `Signature`; `variant_of` reads them back."""
    if rope is None:
        return None
    theta, rotary_dim, interleaved, llama3 = rope
    if llama3 is not None:
        factor, low, high, original = llama3
        llama3 = (_exact(factor), _exact(low), _exact(high), original)
    return (_exact(theta), rotary_dim, interleaved, llama3)


@dataclass(frozen=True)
class RopeCall:
    """RoPE inside the kernel (`fuse_rope`): the block, and the per-batch positions `[B, N]`
    of the unrotated q and k. `k_positions=None` means the key passed is already rotated."""

    block: af.rope
    q_positions: torch.Tensor
    k_positions: torch.Tensor | None


@dataclass(frozen=True)
class _Resolved:
    """What a call attends to, once HF's mask and flags are read."""

    pattern: str
    window: int | None
    valid: int
    bias: torch.Tensor | None
    doc_ids: torch.Tensor | None = None
    """`[B, valid]` int32 (`af.document()`): a token's packed sequence (0 without packing),
    -1 for padding."""


def _resolve(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: object,
    is_causal: bool | None,
    sliding_window: int | None,
) -> _Resolved:
    seq_q, seq_k = query.shape[2], key.shape[2]
    if isinstance(attention_mask, AttnFuseMask):
        if attention_mask.kv_length != seq_k:
            raise ArgumentError(
                f"attention_mask describes {attention_mask.kv_length} keys, but key has {seq_k}"
            )
        if attention_mask.dense is not None:
            return _Resolved("full", None, seq_k, additive_mask(attention_mask.dense, query.dtype))
        # Padding and packed sequences as documents: a row's packed sequences are its
        # documents (one without packing); padding keys are never kept and padding queries
        # keep nothing (their rows are 0), without a dense mask. Under a full pattern
        # (maybe cross-attention) padding drops keys only, through a [B, 1, 1, N] bias.
        return _Resolved(attention_mask.pattern, attention_mask.window, attention_mask.valid,
                         attention_mask.key_padding_bias(query.dtype), attention_mask.doc_ids)
    if attention_mask is None:
        # No mask: HF's sdpa path, is_causal (top-left, over the first Nq keys as sdpa's
        # flag is) for a prefill, none for one query.
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if causal and seq_q > 1:
            return _Resolved("causal", sliding_window, min(seq_q, seq_k), None)
        return _Resolved("full", None, seq_k, None)
    if isinstance(attention_mask, torch.Tensor):
        # A ready mask (a user's 4D mask, or one a model made itself): boolean = keep,
        # floating = additive, as HF's sdpa reads them.
        mask = attention_mask[..., :seq_k]
        bias = additive_mask(mask, query.dtype) if mask.dtype == torch.bool else mask
        return _Resolved("full", None, seq_k, bias)
    raise ArgumentError(
        f"attention_mask must be an AttnFuseMask, a tensor or None, got {type(attention_mask).__name__}"
    )


def _spec(pattern: str, window: int | None, document: bool, bias: bool, scaling: float | None,
          softcap: float | None, rope: object) -> af.AttentionSpec:
    """The variant of a call: its mask pattern and window, whether padding comes as documents
    or a dense mask as a bias, HF's scaling and soft-cap, and RoPE when fused."""
    blocks: list[object] = [af.scaled_dot_product(scaling)]
    if softcap is not None:
        blocks.append(af.softcap(softcap))
    if pattern == "causal":
        blocks.append(af.causal())
        if window is not None:
            blocks.append(af.sliding_window(window))
    if document:
        blocks.append(af.document())
    if bias:
        blocks.append(af.additive_bias())
    if rope is not None:
        blocks.append(rope)
    return af.attention(*blocks)


def run_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: object,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    rope: RopeCall | None = None,
    position_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """AttnFuse attention in HF's layout: returns `[B, Nq, Hq, Dv]`. `position_bias` (T5's
    relative position bias, `[B or 1, Hq, Nq, Nk]`) is added to the scores, as HF's eager and
    sdpa paths add it, and gets its gradient."""
    if dropout and module.training:
        raise ArgumentError(
            f"attention dropout {dropout} in training: AttnFuse has no attention dropout; set "
            "config.attention_dropout = 0.0 or use another attn_implementation"
        )
    resolved = _resolve(module, query, key, attention_mask, is_causal, sliding_window)
    if resolved.valid < key.shape[2]:
        # Unwritten static-cache slots (or sdpa's top-left causal): the kernel never sees them,
        # and the queries align bottom-right with the last written key.
        key, value = key[:, :, :resolved.valid], value[:, :, :resolved.valid]
        if rope is not None and rope.k_positions is not None:
            rope = RopeCall(rope.block, rope.q_positions, rope.k_positions[:, :resolved.valid])
    arguments: dict[str, torch.Tensor] = {}
    bias = None if resolved.bias is None else resolved.bias[..., :resolved.valid]
    if position_bias is not None:
        # Over the written keys only, as the mask (HF's sdpa crops it to the keys it keeps).
        position_bias = position_bias[..., :resolved.valid]
        bias = position_bias if bias is None else position_bias + bias
    if bias is not None:
        arguments["bias"] = bias
    if resolved.doc_ids is not None:
        arguments["doc_ids"] = resolved.doc_ids
    placement: object = "auto"
    rope_block = None
    if rope is not None:
        rope_block = rope.block
        arguments["q_positions"] = rope.q_positions
        if rope.k_positions is not None:
            arguments["k_positions"] = rope.k_positions
        else:
            placement = KEY_GIVEN  # the cache holds rotated keys: only q turns, in the kernel
    signature = (resolved.pattern, resolved.window, _exact(scaling), _exact(softcap),
                 resolved.doc_ids is not None, bias is not None,
                 _exact_rope(rope_signature(rope_block)), placement)
    if torch.compiler.is_compiling():
        explicit = ("q_positions" in arguments, "k_positions" in arguments)
        out = torch_op.call(_operator_key(signature, explicit), query, key, value, **arguments)
    else:
        out = variant_of(signature)(query, key, value, **arguments)
    return out.transpose(1, 2).contiguous()


def warn_no_attention_weights() -> None:
    """What `output_attentions=True` gets: a warning (the weights come back as None)."""
    warnings.warn(
        "attnfuse attention does not return attention weights (output_attentions=True); "
        "use attn_implementation='eager' for them", stacklevel=3,
    )


def attnfuse_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: object,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    position_bias: torch.Tensor | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """HF's attention-interface signature (see `integrations/sdpa_attention.py`), with T5's
    `position_bias` added to the scores as an additive bias. Attention weights are never
    materialised: `output_attentions=True` warns and returns None for them, as HF's sdpa does."""
    if kwargs.get("output_attentions", False):
        warn_no_attention_weights()
    for name in UNSUPPORTED_KEYWORDS:
        if kwargs.get(name) is not None:
            raise ArgumentError(
                f"the model passes {name}= (attention sinks) to its attention: AttnFuse has no "
                "sink block, so its result would be wrong; use another attn_implementation")
    out = run_attention(module, query, key, value, attention_mask, dropout=dropout,
                        scaling=scaling, is_causal=is_causal, sliding_window=sliding_window,
                        softcap=softcap, position_bias=position_bias)
    return out, None
