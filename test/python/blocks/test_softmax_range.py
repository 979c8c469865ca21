"""The softmax at the edges of fp32's range, through the real kernels (the portable target on
Triton's interpreter) against an independent float64 computation written here.

A row whose largest score is more than `attn.SOFTMAX_UNDERFLOW` (87.3) below
`attn.SOFTMAX_FLOOR` (-2^23) has no weight: it outputs 0 and has lse -inf, as a row with no
kept key (docs/semantics.md, "Additive bias"). Such rows
come from additive masks of a large finite negative (-1e9, or Hugging Face's
`torch.finfo(torch.float32).min`) over a whole row; a row with some keys so masked and others
not is an ordinary row, and so is a row of scores all near -1e4 (above the floor). Never NaN.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnfuse as af
from attnfuse.dialects.attn import SOFTMAX_FLOOR, SOFTMAX_UNDERFLOW

FMIN = torch.finfo(torch.float32).min


def softmax_rows(q, k, v, bias):
    """float64 softmax attention of float32 scores (scale 1/sqrt(D), the bias added in float32,
    as the semantics say), with rows whose largest score is more than `SOFTMAX_UNDERFLOW` below
    `SOFTMAX_FLOOR` given no weight, and the lse."""
    s = ((q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])).float() + bias.float()).double()
    top = s.amax(-1, keepdim=True)
    gone = top < SOFTMAX_FLOOR - SOFTMAX_UNDERFLOW
    p = torch.softmax(torch.where(gone, torch.zeros_like(s), s), -1).masked_fill(gone, 0.0)
    lse = torch.logsumexp(torch.where(gone, torch.zeros_like(s), s), -1).masked_fill(gone[..., 0], float("-inf"))
    return p @ v.double(), lse


def qkv(nq, nk, d=16, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, n, d, generator=gen).requires_grad_(grad) for n in (nq, nk, nk)]


def range_bias(nq, nk):
    """Row 0: every key finfo.min (below the floor); row 1: every key -1e9 (below); row 2: half
    the keys finfo.min (an ordinary row); row 3: every key -1e30 (below); row 4: every key -1e4
    (above the floor, far from 0); the rest 0."""
    bias = torch.zeros(1, 1, nq, nk)
    bias[..., 0, :] = FMIN
    bias[..., 1, :] = -1e9
    bias[..., 2, : nk // 2] = FMIN
    bias[..., 3, :] = -1e30
    bias[..., 4, :] = -1e4
    return bias


@pytest.mark.parametrize("nq,nk", [(8, 8), (70, 150)])
def test_out_of_range_rows_have_no_weight_and_no_nan(nq, nk):
    """Forward and lse through the kernel: out-of-range rows 0 and -inf, ordinary rows as the
    float64 softmax (uniform weights for a row of -1e30 everywhere)."""
    q, k, v = qkv(nq, nk)
    bias = range_bias(nq, nk)
    out, lse = af.compile(af.attention(af.additive_bias()))(q, k, v, bias=bias, return_lse=True)
    want, want_lse = softmax_rows(q, k, v, bias)
    assert not out.isnan().any() and not lse.isnan().any()
    # Row 4's weights carry the rounding of s * log2(e) near 1.4e4 on the interpreter (no FMA).
    torch.testing.assert_close(out.double(), want, atol=1e-3, rtol=1e-3)
    assert (out[..., (0, 1, 3), :] == 0).all() and torch.isneginf(lse[..., (0, 1, 3)]).all()
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=1e-6, atol=1e-3)


def test_out_of_range_rows_have_zero_gradients():
    """The backward through the kernels: no NaN, out-of-range rows contribute nothing, the rest
    as autograd through the float64 softmax (bias gradient included)."""
    q, k, v = qkv(40, 72, grad=True)
    # Rows 0-3 of `range_bias`: row 4 (scores near -1e4, above the floor) is left out, since the
    # backward recomputes p = exp(s - lse) from an fp32 lse, which there has lost ln(sum)
    # (docs/semantics.md, "Additive bias").
    bias = range_bias(40, 72)
    bias[..., 4, :] = 0.0
    bias.requires_grad_()
    grad = torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(5))
    af.compile(af.attention(af.additive_bias()))(q, k, v, bias=bias).backward(grad)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
    (softmax_rows(*leaves)[0] * grad.double()).sum().backward()
    for got, want in zip((q.grad, k.grad, v.grad, bias.grad), leaves):
        assert not got.isnan().any()
        torch.testing.assert_close(got.double(), want.grad, atol=1e-4, rtol=1e-4)
    assert (q.grad[..., (0, 1, 3), :] == 0).all()


def test_decode_rows_out_of_range_have_no_weight():
    """The split-KV decode kernels and their merge (kv_lens, one query): a query whose bias is
    finfo.min on every key outputs 0, the other the float64 softmax."""
    q, k, v = qkv(1, 300)
    q = torch.cat([q, q.flip(1)])
    k, v = torch.cat([k, k]), torch.cat([v, v])
    bias = torch.zeros(2, 1, 1, 300)
    bias[0] = FMIN
    lens = torch.tensor([300, 300], dtype=torch.int32)
    out = af.compile(af.attention(af.additive_bias()))(q, k, v, bias=bias, kv_lens=lens)
    assert not out.isnan().any()
    assert (out[0] == 0).all()
    torch.testing.assert_close(out[1].double(), softmax_rows(q[1:], k[1:], v[1:], bias[1:])[0][0], atol=1e-4, rtol=1e-4)


def test_a_row_across_the_floor_weighs_both_sides():
    """A row whose first key block lies just below the floor (v = +1) and whose second just above
    it (v = -1): its max is above the floor, an ordinary row, and both blocks weigh, e^-2 : 1
    (-tanh(1) = -0.762). The carried row max starts at the floor, so the first block is
    rescaled, not dropped (which would give -1). (Loose: without an FMA the interpreter rounds
    each s * log2(e) near 1.2e7 to an integer.)"""
    floor = SOFTMAX_FLOOR
    q, k, _ = qkv(1, 256)
    q = torch.zeros_like(q)  # the scores are the bias
    v = torch.ones(1, 2, 256, 16)
    v[..., 128:, :] = -1.0
    bias = torch.zeros(1, 1, 1, 256)
    bias[..., :128] = floor - 1.0
    bias[..., 128:] = floor + 1.0
    out = af.compile(af.attention(af.additive_bias()))(q, k, v, bias=bias)
    assert not out.isnan().any()
    assert (out - (-math.tanh(1.0))).abs().max() < 0.15, out[0, 0, 0, 0]


@pytest.mark.parametrize("below,weighs", [(50.0, True), (92.0, False), (200.0, False)])
def test_rows_just_below_the_floor(below, weighs):
    """fp32 through the kernel: a row whose scores all lie 50 below the floor is its softmax (its
    weights relative to the floor are normal fp32 numbers), one 92 or 200 below has no weight
    (subnormal or 0: the finalize's test), as the reference says (`SOFTMAX_UNDERFLOW`)."""
    q, k, v = qkv(1, 16)
    q = torch.zeros_like(q)  # the scores are the bias
    bias = torch.full((1, 1, 1, 16), SOFTMAX_FLOOR - below)
    spec = af.attention(af.additive_bias())
    out, lse = af.compile(spec)(q, k, v, bias=bias, return_lse=True)
    want, want_lse = af.reference_attention(spec, q, k, v, bias=bias, return_lse=True)
    if weighs:
        torch.testing.assert_close(out.double(), v.double().mean(-2, keepdim=True), atol=1e-5, rtol=1e-5)
        assert torch.isfinite(lse).all() and torch.isfinite(want_lse).all()
    else:
        assert (out == 0).all() and torch.isneginf(lse).all()
        assert (want == 0).all() and torch.isneginf(want_lse).all()


def test_reference_in_16_bits_drops_rows_of_minus_inf():
    """In a 16-bit dtype a score below the floor is already -inf: such rows are empty (0), not
    the NaN of a softmax over -inf."""
    q, k, v = qkv(3, 8)
    bias = torch.zeros(1, 1, 3, 8)
    bias[..., 0, :] = float("-inf")
    bias[..., 1, :] = FMIN
    out = af.reference_attention(af.attention(af.additive_bias()), q, k, v, bias=bias, dtype=torch.float16)
    assert not out.isnan().any() and (out[..., :2, :] == 0).all()


def test_reference_rows_below_the_floor_have_no_weight():
    """`af.reference_attention` (float64) on rows of -1e17 and -1e10 everywhere (below the floor:
    0, as the kernels give them) beside a row of -1e6 (above: its softmax)."""
    q, k, v = (t.double() for t in qkv(4, 8))
    bias = torch.zeros(1, 1, 4, 8, dtype=torch.float64)
    bias[..., 1, :] = -1e17
    bias[..., 2, :] = -1e10
    bias[..., 3, :] = -1e6
    out, lse = af.reference_attention(af.attention(af.additive_bias()), q, k, v, bias=bias, return_lse=True)
    assert (out[..., 1:3, :] == 0).all() and torch.isneginf(lse[..., 1:3]).all()
    s = q @ k.transpose(-1, -2) / 4 + bias
    torch.testing.assert_close(out[..., 3, :], (torch.softmax(s, -1) @ v)[..., 3, :])


def scaled_softmax_rows(q, k, v, scale):
    """float64 softmax attention of the float32 scores `scale * q.k` (the product rounded to
    float32 as the kernels form it), and the lse."""
    s = ((q.double() @ k.double().transpose(-1, -2)).float() * scale).double()
    return torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)


@pytest.mark.parametrize("scale", [1e6, 1e10, 1e30])
def test_huge_scores_take_their_row_max_exactly(scale):
    """Scores far beyond +2^23 (a scale of 1e10 on unit-size inputs): the row max is taken in the
    exponent's own units (the max of the same products s * scale * log2(e)), so the largest
    weight is exactly 1 and the output is the float64 softmax of the fp32 scores (close to hard
    attention on the argmax), never NaN; so is the split-KV decode's. A max in natural units
    times log2(e) rounded differently and gave NaN rows from about 1e9 on."""
    q, k, v = qkv(9, 40, seed=3)
    spec = af.attention(af.scaled_dot_product(scale))
    out, lse = af.compile(spec)(q, k, v, return_lse=True)
    want, want_lse = scaled_softmax_rows(q, k, v, scale)
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=0.0)
    lens = torch.tensor([40], dtype=torch.int32)
    decoded = af.compile(spec)(q[:, :, :1], k, v, kv_lens=lens)
    assert not decoded.isnan().any()
    torch.testing.assert_close(decoded.double(), want[:, :, :1], atol=1e-4, rtol=1e-4)
