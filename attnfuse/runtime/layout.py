"""Memory order of the rotated copies the runtime allocates: their operand's."""

from __future__ import annotations

import torch


def empty_in_layout_of(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A new dense tensor shaped like `like` whose dims lie in memory in the order of `like`'s
    (torch's `preserve_format`, which infers that order for non-dense views too), or a
    contiguous one when `like`'s last dim is not its innermost (the kernels load rows).

    Why: a model's q is usually a `[B, N, H, D]` projection (or a slice of a fused QKV one)
    viewed as `[B, H, N, D]`, and the gradient of the output comes back through the model's
    head merge (`out.transpose(1, 2).reshape(B, N, H * D)`) in that memory order too. A
    rotated copy of q allocated in q's order then has dO's row and column strides, and the
    dK/dV kernel shares their offsets (`SHARED_OFFSETS`). The output itself stays contiguous
    (docs/robustness.md §2)."""
    if like.stride(-1) != 1:
        return torch.empty(like.shape, dtype=dtype, device=like.device)
    return torch.empty_like(like, dtype=dtype, memory_format=torch.preserve_format)
