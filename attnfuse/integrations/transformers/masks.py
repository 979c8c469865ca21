"""The mask function registered with Hugging Face transformers under "attnfuse".

HF's model code calls `create_causal_mask` / `create_sliding_window_causal_mask` once per
forward, which hand the call's sizes and the pattern to the mask function registered for the
model's attention implementation. Instead of a dense `[B, 1, Nq, Nk]` mask, ours returns an
`AttnFuseMask`: the pattern as AttnFuse blocks (causal, sliding window, full), the number of
keys the queries may see (`valid`, which is shorter than the key tensor for a static cache),
the padding of the 2D `attention_mask`, and packed sequences (`af.document()` ids). A pattern
it does not recognise (a model's own `or_mask_function`, chunked attention, a static cache
whose fill level is only on the device) becomes a dense mask made by HF's own `sdpa_mask`, so
nothing is silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import masking_utils as hf_masks

from attnfuse.errors import ArgumentError

from attnfuse.integrations.transformers.mask_factories import (
    ORIGINALS,
    AndMasks,
    PackedSequences,
    RemappedPositions,
    SlidingWindowOverlay,
)

_AND_MASK_CODE = ORIGINALS["and_masks"](hf_masks.causal_mask_function).__code__
_SLIDING_OVERLAY_CODE = ORIGINALS["sliding_window_overlay"](1).__code__


def additive_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `keep`, -inf elsewhere: a dropped key (a row of them outputs 0, never NaN)."""
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    return torch.where(keep, zero, torch.full((), float("-inf"), dtype=dtype, device=keep.device))


class MaskIsNotATensor(ArgumentError, AttributeError):
    """A model read a tensor's attribute (`.dtype`, `.shape`, ...) of an `AttnFuseMask`: an
    `ArgumentError` saying so, and an `AttributeError`, so that `hasattr` and
    `getattr(mask, name, default)` in model code still answer as for any missing attribute."""


@dataclass(frozen=True, eq=False)
class AttnFuseMask:
    """What one attention call must honour, as HF's masking code described it.

    - `pattern`: "causal" or "full"; `window`: the sliding window (with "causal") or None.
      Both are AttnFuse blocks, aligned bottom-right over the first `valid` keys.
    - `kv_length`: the number of keys HF's attention receives (the key tensor's length).
    - `valid`: how many of those keys are written; the last query sits at key `valid - 1`.
      Smaller than `kv_length` only for static caches; the attention slices k and v to it.
    - `padding`: a bool `[B, valid]` tensor, False at padding keys, or None without padding.
    - `sequences`: for packed sequences, an int `[B, kv_length]` tensor numbering the
      sequences of each row (HF's `packed_sequence_mask`), or None.
    - `dense`: for a pattern AttnFuse cannot say as blocks, HF's bool `[B, 1, Nq, kv_length]`
      mask (True = attend); `pattern` is then "full" and `padding` None.
    """

    pattern: str
    window: int | None
    kv_length: int
    valid: int
    padding: torch.Tensor | None = None
    dense: torch.Tensor | None = None
    sequences: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # The `af.document()` ids (a token's packed sequence, 0 without packing; -1 for
        # padding), made once per mask: every layer passes this same tensor, so the kernels'
        # block lists are built once per forward, not once per layer (cached per ids tensor).
        # A document's query reads its id at its own position in the key sequence, which
        # holds for self-attention over the keys' sequence (causal patterns, packing); a
        # full pattern may be cross-attention, whose queries are another sequence: there the
        # padding is the keys' only, an additive bias (`key_padding_bias`).
        ids = None if self.sequences is None else self.sequences.to(torch.int32)
        if self.padding is not None and self.pads_keys_only:
            ids = None
        elif self.padding is not None:
            ids = torch.where(self.padding, 0 if ids is None else ids, -1).to(torch.int32)
        object.__setattr__(self, "doc_ids", ids)
        object.__setattr__(self, "_key_biases", {})

    def __getattr__(self, name: str) -> object:
        # Only reached for attributes the mask does not have: a model that treats the mask as
        # HF's 4D tensor (Falcon with ALiBi reads its dtype to add the bias to it).
        if name.startswith("_"):
            raise AttributeError(name)  # protocols (copy, pickle) look such names up
        if torch.compiler.is_compiling():
            # Dynamo answers hasattr / getattr(..., default) only for AttributeError itself.
            raise AttributeError(f"AttnFuseMask has no attribute {name!r} (it is not a tensor)")
        raise MaskIsNotATensor(
            f"attention_mask is an AttnFuseMask (what register()'s mask functions make for the "
            f"attnfuse attention), not a tensor: this model reads its .{name} before its attention "
            "call, which AttnFuse does not support; use another attn_implementation for it")

    @property
    def pads_keys_only(self) -> bool:
        """Whether the padding drops keys only, as an additive bias: a full pattern without
        packing (an encoder's self-attention, or a decoder's cross-attention, whose queries
        are not the padded sequence)."""
        return self.pattern == "full" and self.sequences is None

    def key_padding_bias(self, dtype: torch.dtype) -> torch.Tensor | None:
        """`[B, 1, 1, valid]`: 0 at a written key, -inf at a padding one, as HF's SDPA mask
        drops it for every query (a row of padding keys only outputs 0); None without key
        padding. Made once per mask and dtype, for every layer."""
        if self.padding is None or not self.pads_keys_only:
            return None
        bias = self._key_biases.get(dtype)
        if bias is None:
            bias = self._key_biases[dtype] = additive_mask(self.padding[:, None, None, :], dtype)
        return bias

    ndim = 4
    """HF's mask preprocessing asks a given mask for `ndim` (2 = a padding mask to expand);
    this one is prepared. `generate` with a static cache makes the mask before the forward and
    passes it in as `attention_mask`; `attnfuse_mask` then returns it unchanged."""


def recognise_pattern(mask_function: object) -> tuple[str, int | None] | None:
    """`(pattern, window)` for HF's causal, sliding-window-causal and bidirectional mask
    functions; None for any other (composed with or/and masks, packed, chunked, custom)."""
    if mask_function is hf_masks.causal_mask_function:
        return "causal", None
    if mask_function is hf_masks.bidirectional_mask_function:
        return "full", None
    parts = _parts(mask_function, AndMasks, _AND_MASK_CODE, "mask_functions")
    if parts is not None and len(parts) == 2 and parts[1] is hf_masks.causal_mask_function:
        window = _parts(parts[0], SlidingWindowOverlay, _SLIDING_OVERLAY_CODE, "sliding_window")
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            return "causal", window
    return None


def recognise_packed(mask_function: object) -> tuple[str, int | None, torch.Tensor] | None:
    """`(pattern, window, sequences)` for HF's mask of packed sequences: a causal or
    sliding-window-causal function applied to the tokens' positions, and'ed with "same
    sequence" (`create_causal_mask`'s packed path, which HF always takes while tracing when
    a model is called without an attention mask). Inside one sequence the positions of
    consecutive tokens differ by 1 (that is how HF finds the sequences), so the pattern over
    positions is the pattern over indices, and the whole mask is that pattern and
    `af.document()` with the sequence numbers as ids. None for anything else. Reads only the
    `mask_factories` stand-ins (HF's closures are left to the dense mask)."""
    if not (isinstance(mask_function, AndMasks) and len(mask_function.mask_functions) == 2):
        return None
    remapped, packed = mask_function.mask_functions
    if not (isinstance(remapped, RemappedPositions) and isinstance(packed, PackedSequences)):
        return None
    pattern = recognise_pattern(remapped.mask_function)
    if pattern is None or pattern[0] != "causal":
        return None
    return pattern[0], pattern[1], packed.packed_sequence_mask


def _parts(function: object, stand_in: type, code: object, name: str) -> object | None:
    """The part `name` of a mask function made by one of HF's factories: an attribute of its
    `mask_factories` stand-in, or a cell of HF's own closure (made from `code`), read only
    outside `torch.compile` (Dynamo cannot read the cells of a closure made while tracing)."""
    if isinstance(function, stand_in):
        return getattr(function, name)
    if _is_tracing() or getattr(function, "__code__", None) is not code or function.__closure__ is None:
        return None
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in function.__closure__))).get(name)


def _is_tracing() -> bool:
    return torch.compiler.is_compiling()


def attnfuse_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: object = hf_masks.causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **kwargs: object,
) -> AttnFuseMask:
    """HF's mask-interface signature (see `masking_utils.sdpa_mask`). Query `i` sits at
    position `q_offset + i`, key `j` at `kv_offset + j`; `attention_mask` is the 2D padding
    mask over positions (shorter than `kv_offset + kv_length` for a static cache: the rest is
    unwritten)."""
    if isinstance(attention_mask, AttnFuseMask):
        return attention_mask  # made for this very step by generate's input preparation
    pattern, sequences = recognise_pattern(mask_function), None
    if pattern is None and (packed := recognise_packed(mask_function)) is not None:
        if packed[2].shape[-1] == kv_length and q_length == kv_length and kv_offset == 0:
            # HF numbers the sequences from position_ids, which may be [1, N] for a batch.
            pattern, sequences = packed[:2], packed[2].to(device).expand(batch_size, -1)
    if pattern is not None and not isinstance(q_offset, torch.Tensor):
        # Causal: the last query sits at position q_offset + q_length - 1; the keys after it
        # are unwritten cache slots (a static cache holds kv_length slots). Full (an encoder,
        # cross-attention): every key, unwritten ones being padding of the 2D mask.
        valid = q_offset + q_length - kv_offset if pattern[0] == "causal" else kv_length
        if 0 < valid <= kv_length:
            padding = None
            if attention_mask is not None:
                padding = hf_masks.prepare_padding_mask(attention_mask, kv_length, kv_offset)
                padding = padding[:, kv_offset:kv_offset + valid].to(device=device, dtype=torch.bool)
                # One host read per mask (HF's sdpa_mask makes the same one) saves every
                # layer a bias when there is no padding; under torch.compile keep the bias.
                if not _is_tracing() and bool(padding.all()):
                    padding = None
            return AttnFuseMask(pattern[0], pattern[1], kv_length, valid, padding, sequences=sequences)
    # A static cache's fill level (q_offset) is a device tensor: reading it would sync, so the
    # pattern, padding and unwritten slots are materialised by HF's own mask maker.
    dense = hf_masks.sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
        allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
        use_vmap=bool(kwargs.get("use_vmap", False)), device=device,
    )
    return AttnFuseMask("full", None, kv_length, kv_length, None, dense)
