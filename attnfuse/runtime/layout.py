"""Memory order of the tensors the runtime allocates for a call (outputs, gradients, rotated
copies): their operand's."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def rows_innermost(like: torch.Tensor) -> bool:
    """Whether `like`'s last dim is its innermost: unit stride, and every other dim of more
    than one entry steps over whole rows (or is expanded, stride 0). An overlapping view whose
    rows share elements (a sequence stride of 1, say) is not."""
    strides, sizes = like.stride(), like.shape
    if strides[-1] != 1:
        return False
    row = sizes[-1]
    for dim in range(len(strides) - 1):  # a loop, not all(): on every model-layout call's path
        if 0 < strides[dim] < row and sizes[dim] != 1:
            return False
    return True


def empty_in_layout_of(like: torch.Tensor, dtype: torch.dtype, shape: Sequence[int] | None = None) -> torch.Tensor:
    """A new dense tensor shaped like `like` (or `shape`, which may differ from `like`'s in the
    last dim only) whose dims lie in memory in the order of `like`'s (torch's
    `preserve_format`, which infers that order for non-dense views too), or a contiguous one
    when `like`'s last dim is not its innermost (`rows_innermost`: the kernels load rows).
    Applied to its own result it gives that result's order again.

    Why: a model's q is usually a `[B, N, H, D]` projection (or a slice of a fused QKV one)
    viewed as `[B, H, N, D]`, and its head merge reads the output back in that order
    (`out.transpose(1, 2).reshape(B, N, H * D)`). The output in q's order makes that merge a
    view, not a copy, as SDPA's GPU backends do; the gradient comes back in that order too,
    so q's rotated copy in q's order has dO's row and column strides and the dK/dV kernel
    shares their offsets (`SHARED_OFFSETS`); and dq, dk, dv in their operand's order reach the
    projections' backward as views. Each kernel reads every role's strides, so any order is
    correct; this one saves the copies around the call."""
    # On every call's path (outputs, gradients): the common cases first, without conversions.
    if like.is_contiguous():
        if shape is None or like.shape == shape:
            # preserve_format keeps even a size-1 dim's stride (what `shares_offsets` compares).
            return torch.empty_like(like, dtype=dtype, memory_format=torch.preserve_format)
        return torch.empty(shape, dtype=dtype, device=like.device)
    if not rows_innermost(like):
        return torch.empty(like.shape if shape is None else shape, dtype=dtype, device=like.device)
    if shape is None or like.shape == shape:
        return torch.empty_like(like, dtype=dtype, memory_format=torch.preserve_format)
    shape = tuple(shape)
    if len(shape) != like.dim() or shape[:-1] != tuple(like.shape[:-1]):
        raise ValueError(f"internal: shape {shape} differs from {tuple(like.shape)} in more than the last dim")
    # The other dims from outermost to innermost in the order `preserve_format` gives `like`
    # (expanded and size-1 dims placed as it places them), the last dim innermost.
    last = like.dim() - 1
    dense = torch.empty_like(like[..., :1], memory_format=torch.preserve_format)
    order = sorted(range(last), key=dense.stride, reverse=True) + [last]
    out = torch.empty([shape[d] for d in order], dtype=dtype, device=like.device)
    return out.permute([order.index(d) for d in range(like.dim())])
