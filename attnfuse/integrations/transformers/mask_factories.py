"""Stand-ins for HF's mask-function factories whose parts can be read back under tracing.

HF describes a mask as a function `f(batch_idx, head_idx, q_idx, kv_idx) -> keep`, made by
factories in `transformers.masking_utils` (`and_masks`, `sliding_window_overlay`,
`packed_sequence_mask_function`, `remap_positions_for_packed_sequence`) that return closures.
`masks.recognise_pattern` turns the common ones into AttnFuse blocks by reading the closures'
cells, which works eagerly; but under `torch.compile` HF makes the closures inside the traced
region, and Dynamo cannot read a traced closure's `__closure__`. So a sliding-window model, or
any model called without an attention mask (HF then always builds the packed-sequence mask
while tracing), failed to compile with `fullgraph=True`.

`install()` (called by `register()`) replaces those four factories in `masking_utils` with
classes whose instances are callable exactly as the closures are (each delegates to the
closure HF's own factory made, so what a mask keeps is HF's code), and whose parts are plain
attributes, which Dynamo reads. Only `masking_utils`' own mask makers (`create_causal_mask`,
`create_sliding_window_causal_mask`, ...) look the factories up there; a model module that
imported a factory itself keeps HF's closure, which `recognise_pattern` reads eagerly and,
while tracing, leaves to HF's dense mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import masking_utils as hf_masks

ORIGINALS: dict[str, Callable] = {
    name: getattr(hf_masks, name)
    for name in ("and_masks", "sliding_window_overlay", "packed_sequence_mask_function",
                 "remap_positions_for_packed_sequence")
}
"""HF's factories, as imported (the stand-ins delegate to them)."""


class _StandIn:
    """A mask function with readable parts: called as HF calls mask functions, it returns
    what HF's own closure (`_mask`, made by the original factory) returns."""

    _mask: Callable

    def __call__(self, batch_idx: torch.Tensor, head_idx: torch.Tensor, q_idx: torch.Tensor,
                 kv_idx: torch.Tensor) -> torch.Tensor:
        return self._mask(batch_idx, head_idx, q_idx, kv_idx)


class AndMasks(_StandIn):
    """`and_masks(*mask_functions)`: keeps what every function keeps."""

    def __init__(self, *mask_functions: Callable):
        self.mask_functions = mask_functions
        self._mask = ORIGINALS["and_masks"](*mask_functions)


class SlidingWindowOverlay(_StandIn):
    """`sliding_window_overlay(sliding_window)`: keeps `q_idx - kv_idx < sliding_window`."""

    def __init__(self, sliding_window: int):
        self.sliding_window = sliding_window
        self._mask = ORIGINALS["sliding_window_overlay"](sliding_window)


class PackedSequences(_StandIn):
    """`packed_sequence_mask_function(packed_sequence_mask)`: keeps a key of the query's
    sequence (`packed_sequence_mask [B, N]` numbers the sequences packed in each row)."""

    def __init__(self, packed_sequence_mask: torch.Tensor):
        self.packed_sequence_mask = packed_sequence_mask
        self._mask = ORIGINALS["packed_sequence_mask_function"](packed_sequence_mask)


class RemappedPositions(_StandIn):
    """`remap_positions_for_packed_sequence(mask_function, position_ids)`: `mask_function`
    applied to the tokens' positions (`position_ids [B, N]`) instead of their indices."""

    def __init__(self, mask_function: Callable, position_ids: torch.Tensor):
        self.mask_function = mask_function
        self.position_ids = position_ids
        self._mask = ORIGINALS["remap_positions_for_packed_sequence"](mask_function, position_ids)


STAND_INS: dict[str, type[_StandIn]] = {
    "and_masks": AndMasks,
    "sliding_window_overlay": SlidingWindowOverlay,
    "packed_sequence_mask_function": PackedSequences,
    "remap_positions_for_packed_sequence": RemappedPositions,
}


def install() -> None:
    """Puts the stand-ins in `masking_utils` in place of HF's factories. Idempotent."""
    for name, stand_in in STAND_INS.items():
        setattr(hf_masks, name, stand_in)


def installed() -> bool:
    """Whether `install()` has run."""
    return all(getattr(hf_masks, name) is stand_in for name, stand_in in STAND_INS.items())


__all__ = ["AndMasks", "ORIGINALS", "PackedSequences", "RemappedPositions", "SlidingWindowOverlay",
           "install", "installed"]
