"""`sigmoid(bias=None)` through the real kernels (Triton's interpreter on the CPU), forward and
backward, against the float64 reference and an independent formula; no log-sum-exp."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import check_forward_backward, make_qkv

import attnfuse as af
from attnfuse.errors import ArgumentError, CompositionError

pytestmark = pytest.mark.interpreter

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [None, -1.5])
def test_sigmoid_causal(dtype, bias):
    q, k, v = make_qkv(1, 4, 2, 37, 45, 32, dtype=dtype, seed=3)
    check_forward_backward(af.attention(af.sigmoid(bias), af.causal()), q, k, v)


def test_sigmoid_with_rope_softcap_alibi_bias_window():
    spec = af.attention(af.rope(), af.softcap(3.0), af.alibi(), af.additive_bias(),
                        af.sliding_window(12), af.sigmoid())
    q, k, v = make_qkv(2, 2, 1, 33, 40, 16, seed=5)
    bias = torch.randn(1, 2, 1, 40, generator=torch.Generator().manual_seed(6)).requires_grad_()
    check_forward_backward(spec, q, k, v, bias=bias)


def test_sigmoid_block_sparse():
    spec = af.attention(af.block_sparse(16), af.sigmoid())
    q, k, v = make_qkv(1, 2, 2, 48, 48, 16, seed=8)
    layout = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 1]], dtype=torch.bool)
    check_forward_backward(spec, q, k, v, block_layout=layout)


def test_sigmoid_matches_an_independent_formula():
    q, k, v = make_qkv(1, 2, 2, 20, 28, 16, seed=11)
    out = af.attention(af.sigmoid(), af.causal())(q, k, v).double()
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(16)
    keep = torch.ones(20, 28, dtype=torch.bool).tril(28 - 20)
    p = torch.where(keep, torch.sigmoid(s - math.log(28)), torch.zeros(()))
    torch.testing.assert_close(out, p @ v.double(), atol=1e-5, rtol=0)


def test_rows_with_no_kept_key_are_zero():
    spec = af.attention(af.sigmoid(), af.causal())
    q, k, v = make_qkv(1, 1, 1, 12, 4, 16, seed=2)  # Nq > Nk: the first 8 rows keep no key
    out = spec(q, k, v)
    assert (out[:, :, :8] == 0).all()


def test_no_log_sum_exp():
    q, k, v = make_qkv(1, 1, 1, 8, 8, 16)
    with pytest.raises(ArgumentError, match=r"return_lse=True needs softmax\(\): sigmoid\(\)"):
        af.attention(af.sigmoid())(q, k, v, return_lse=True)


@pytest.mark.parametrize("bias", [float("inf"), float("nan"), "1", True])
def test_bad_bias(bias):
    with pytest.raises(CompositionError, match="sigmoid: bias must be a finite number"):
        af.sigmoid(bias)


def test_one_normalizer():
    with pytest.raises(CompositionError, match="one normalizer"):
        af.attention(af.sigmoid(), af.softmax())
