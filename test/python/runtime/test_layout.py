"""`empty_in_layout_of`: the memory order of what the runtime allocates for a call (outputs,
gradients, rotated copies): their operand's (runtime/layout.py)."""

from __future__ import annotations

import pytest
import torch

from attnfuse.runtime.layout import empty_in_layout_of


def model_layout(b: int, n: int, h: int, d: int) -> torch.Tensor:
    """A `[B, N, H, D]` projection viewed as `[B, H, N, D]`, as a model hands q to attention."""
    return torch.randn(b, n, h, d).transpose(1, 2)


@pytest.mark.parametrize(
    "like",
    [
        pytest.param(lambda: torch.randn(2, 4, 8, 32), id="contiguous"),
        pytest.param(lambda: torch.randn(1, 4, 8, 32), id="contiguous-b1"),
        pytest.param(lambda: model_layout(2, 8, 4, 32), id="model"),
        pytest.param(lambda: model_layout(1, 8, 4, 32), id="model-b1"),
        # Contiguous by torch's rule (a size-1 dim's stride does not count), but its strides
        # are the model's: the copy must keep them, so that dO of the same layout shares
        # offsets with it (SHARED_OFFSETS) at Nq=1 too.
        pytest.param(lambda: model_layout(2, 1, 4, 32), id="model-n1"),
        pytest.param(lambda: model_layout(2, 8, 1, 32), id="model-h1"),
    ],
)
def test_copy_has_the_operand_strides(like):
    """A copy of a dense operand whose last dim is innermost has the operand's memory order:
    its strides wherever the size is above 1, and its row and column strides always (what
    `KernelLaunch.shares_offsets` compares, size-1 rows included)."""
    like = like()
    copy = empty_in_layout_of(like, torch.float16)
    assert copy.shape == like.shape and copy.dtype == torch.float16
    for dim, size in enumerate(like.shape):
        if size > 1:
            assert copy.stride(dim) == like.stride(dim), dim
    assert copy.stride()[-2:] == like.stride()[-2:]


def test_view_of_a_fused_qkv_projection_gets_the_models_dense_order():
    """q sliced out of a fused `[B, N, 3, H, D]` QKV projection is not dense: its copy is the
    dense tensor in the same order, which is the order dO comes back in (the head merge)."""
    like = torch.randn(2, 8, 3, 4, 32)[:, :, 0].transpose(1, 2)
    copy = empty_in_layout_of(like, like.dtype)
    assert copy.shape == like.shape
    assert copy.stride() == model_layout(2, 8, 4, 32).stride()


def test_last_dim_not_innermost_gives_contiguous():
    """An operand whose head dim is not innermost gets a contiguous copy (the kernels' loads
    want unit-stride rows)."""
    like = torch.randn(2, 4, 32, 8).transpose(2, 3)
    copy = empty_in_layout_of(like, like.dtype)
    assert copy.is_contiguous() and copy.shape == like.shape


def test_overlapping_rows_give_contiguous():
    """A view whose rows share elements (sequence stride 1) has no row order to keep: contiguous."""
    like = torch.randn(4000).as_strided((2, 3, 150, 4), (300, 150, 1, 1))
    copy = empty_in_layout_of(like, torch.float32)
    assert copy.is_contiguous() and copy.shape == like.shape
    assert empty_in_layout_of(like, torch.float32, (2, 3, 150, 8)).is_contiguous()


@pytest.mark.parametrize(
    "like",
    [
        pytest.param(lambda: model_layout(2, 8, 4, 32), id="model"),
        pytest.param(lambda: torch.randn(1, 4, 8, 32).expand(3, 4, 8, 32), id="expanded-batch"),
        pytest.param(lambda: model_layout(1, 8, 4, 32)[:, :, :, :], id="model-b1"),
        pytest.param(lambda: torch.randn(2, 4, 8, 32), id="contiguous"),
    ],
)
def test_a_narrower_last_dim_keeps_the_order(like):
    """An output of another width (Dv != D) has the dims of `like` in the same memory order as
    a copy of `like` itself, and applying the rule to the result gives its own order back."""
    like = like()
    same = empty_in_layout_of(like, torch.float16)
    narrow = empty_in_layout_of(like, torch.float16, (*like.shape[:-1], 16))
    assert narrow.shape == (*like.shape[:-1], 16) and narrow.stride(-1) == 1
    order = lambda t: sorted(range(t.dim() - 1), key=t.stride, reverse=True)  # noqa: E731
    assert order(narrow) == order(same)
    assert empty_in_layout_of(narrow, torch.float32).stride() == narrow.stride()
