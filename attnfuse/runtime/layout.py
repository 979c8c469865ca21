"""Memory order of the rotated copies the runtime allocates: their operand's."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def empty_in_layout_of(like: torch.Tensor, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A new dense tensor of `shape` whose dims lie in memory in the order of `like`'s (same
    number of dims), or a contiguous one when `like`'s last dim is not its innermost.

    Why: a model's q is usually a `[B, N, H, D]` projection viewed as `[B, H, N, D]`, and the
    gradient of the output comes back through the model's head merge
    (`out.transpose(1, 2).reshape(B, N, H * D)`) in that memory order too. A rotated copy of q
    allocated in q's order then has dO's row and column strides, and the dK/dV kernel shares
    their offsets (`SHARED_OFFSETS`). The output itself stays contiguous
    (docs/robustness.md §2)."""
    if like.dim() != len(shape) or like.stride(-1) != 1:
        return torch.empty(tuple(shape), dtype=dtype, device=like.device)
    # Outermost first; size-1 dims (any stride) keep their logical place among equal strides.
    order = sorted(range(like.dim()), key=lambda i: (-like.stride(i), i))
    if order[-1] != like.dim() - 1:
        order.remove(like.dim() - 1)
        order.append(like.dim() - 1)
    physical = torch.empty([shape[i] for i in order], dtype=dtype, device=like.device)
    return physical.permute([order.index(i) for i in range(like.dim())])
