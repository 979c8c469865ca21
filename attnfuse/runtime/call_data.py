"""Call-time RoPE positions: checked against the call's shapes (an `ArgumentError` naming the
argument otherwise) and returned as the view the kernels read. The other call-time data is
bound by the ops that read it (`DataUse`, `bind`, in `attnfuse/blocks/`)."""

from __future__ import annotations

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime.inputs import Problem


def positions_view(positions: object, name: str, length: int, problem: Problem) -> torch.Tensor:
    """Call-time RoPE positions as a `[B, N]` integer view (a shared `[N]` gets batch stride
    0)."""
    if not isinstance(positions, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"{name} must be int32 or int64, got {positions.dtype}")
    if positions.device != problem.device:
        raise ArgumentError(f"{name} is on {positions.device}, but q is on {problem.device}")
    shapes = ([length], [problem.batch, length])
    if list(positions.shape) not in shapes:
        raise ArgumentError(
            f"{name} must have shape [{length}] or [{problem.batch}, {length}], got "
            f"{list(positions.shape)}"
        )
    return positions.expand(problem.batch, length)


MAX_ROPE_POSITION = 2**24
"""Positions beyond this are not exact in fp32, the precision the rotation is defined in."""


def position_extent(view: torch.Tensor, name: str) -> int:
    """`max |position| + 1` of call-time positions (0 for none): how long the RoPE table must
    be. An `ArgumentError` if a position lies beyond `MAX_ROPE_POSITION`. One host sync."""
    if not view.numel():
        return 0
    if view.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ArgumentError(
            f"{name}: a call with call-time RoPE positions reads their range on the host (to "
            "size the rotation table), which a CUDA graph capture cannot do. An attention "
            "call keeps that range per positions tensor: call it once before the capture with "
            "the same, unchanged tensor; rotate_keys reads it on every call")
    largest = int(view.to(torch.int64).abs().max())
    if largest > MAX_ROPE_POSITION:
        raise ArgumentError(
            f"{name} must lie in [-{MAX_ROPE_POSITION}, {MAX_ROPE_POSITION}] (fp32 "
            f"represents them exactly), got |position| = {largest}"
        )
    return largest + 1
