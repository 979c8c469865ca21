"""alibi, additive_bias, block_sparse, relu and Llama-3.1 RoPE scaling through the real kernels.

Every case runs the generated Triton kernels (on the CPU under Triton's interpreter) and
compares them with the float64 reference, alone and in combination, at small shapes with
Nq != Nk: fp32 max abs error <= 1e-4, fp16/bf16 relative error <= 1e-2. Call-time data
(`bias=`, `block_layout=`) is checked: every misuse raises `AttnFuseError` naming it.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (
    assert_close_to_reference,
    assert_lse_close,
    lse_tolerance,
    make_qkv,
)

import attnfuse as af
from attnfuse.blocks.additive_bias import AdditiveBias
from attnfuse.blocks.block_sparse import BlockSparse
from attnfuse.blocks.relu import Relu
from attnfuse.errors import ArgumentError
from attnfuse.runtime.reference import (
    keep_mask,
    reference_gradients,
    rope_inverse_frequencies,
)

pytestmark = pytest.mark.interpreter

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES = {"fp32": torch.float32, **HALF}


def check(spec, q, k, v, *, fn=None, bias=None, block_layout=None, **compile_kwargs):
    """Runs the kernels and checks them against the reference (output; lse for softmax);
    rows with no kept key must be exactly 0 (and -inf lse). Returns (out, lse or None)."""
    fn = fn if fn is not None else af.compile(spec, **compile_kwargs)
    data = {}
    if bias is not None:
        data["bias"] = bias
    if block_layout is not None:
        data["block_layout"] = block_layout
    n_q, n_k = q.shape[2], k.shape[2]
    empty = ~keep_mask(spec, n_q, n_k, block_layout).any(-1)  # [Nq] or [Hq, Nq]
    empty = empty.expand(q.shape[0], q.shape[1], n_q) if empty.dim() == 2 else empty.expand(q.shape[:3])
    if spec.block(Relu) is not None:
        out = fn(q, k, v, **data)
        ref = af.reference_attention(spec, q, k, v, **data)
        assert_close_to_reference(out, ref, q.dtype)
        assert (out[empty] == 0).all(), "a row with no kept key is not exactly 0"
        return out, None
    out, lse = fn(q, k, v, return_lse=True, **data)
    ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True, **data)
    assert_close_to_reference(out, ref, q.dtype)
    assert_lse_close(lse, ref_lse, lse_tolerance(spec, q, k))
    assert torch.isneginf(ref_lse[empty]).all()
    # Rows with no kept key, or whose kept scores are all -inf (a -inf bias): exactly 0.
    assert (out[torch.isneginf(ref_lse)] == 0).all(), "a row with no kept key is not exactly 0"
    return out, lse


def random_layout(shape, density: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen) < density


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(dtype)


# --------------------------------------------------------------------------------------------
# alibi
# --------------------------------------------------------------------------------------------

# The ALiBi paper's slopes, written out (as exponents of 2) from its rule: for n a power of two
# the geometric sequence 2^(-8/n), 2^(-16/n), ...; otherwise the slopes of the nearest lower
# power of two, then every other slope of twice that many heads.
PAPER_SLOPE_EXPONENTS = {
    1: [-8],
    2: [-4, -8],
    3: [-4, -8, -2],
    4: [-2, -4, -6, -8],
    5: [-2, -4, -6, -8, -1],
    6: [-2, -4, -6, -8, -1, -3],
    8: [-1, -2, -3, -4, -5, -6, -7, -8],
    12: [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5],
}


@pytest.mark.parametrize("hq", sorted(PAPER_SLOPE_EXPONENTS))
def test_default_slopes_are_the_papers(hq):
    from attnfuse.blocks.alibi import default_alibi_slopes

    expected = [2.0**e for e in PAPER_SLOPE_EXPONENTS[hq]]
    assert default_alibi_slopes(hq) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("hq, hkv", [(1, 1), (3, 1), (4, 2), (6, 3), (8, 8), (12, 4)])
def test_alibi_default_slopes(hq, hkv):
    spec = af.attention(af.alibi())
    q, k, v = make_qkv(b=1, hq=hq, hkv=hkv, nq=19, nk=45, d=16, seed=hq)
    out, _ = check(spec, q, k, v)
    # The kernel's default slopes are the paper's: the same as passing them explicitly.
    explicit = af.attention(af.alibi([2.0**e for e in PAPER_SLOPE_EXPONENTS[hq]]))
    out_explicit = af.compile(explicit)(q, k, v)
    torch.testing.assert_close(out, out_explicit, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("nq, nk", [(40, 40), (17, 70), (70, 23)])
def test_alibi_explicit_slopes(dtype_name, nq, nk):
    dtype = DTYPES[dtype_name]
    slopes = [1.0, 0.5, -0.125, 0.0]  # negative and zero slopes are slopes too
    spec = af.attention(af.alibi(slopes))
    q, k, v = make_qkv(b=2, hq=4, hkv=2, nq=nq, nk=nk, d=32, dv=16, dtype=dtype, seed=nq + nk)
    check(spec, q, k, v)


def test_alibi_changes_the_result():
    q, k, v = make_qkv(b=1, hq=2, nq=30, nk=50, d=16)
    plain = af.attention()(q, k, v)
    biased = af.attention(af.alibi([0.5, 0.25]))(q, k, v)
    assert (plain - biased).abs().max() > 1e-2


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(lambda: [af.causal()], id="causal"),
        pytest.param(lambda: [af.sliding_window(9)], id="window"),
        pytest.param(lambda: [af.causal(), af.sliding_window(12)], id="causal-window"),
        pytest.param(lambda: [af.relu()], id="relu"),
        pytest.param(lambda: [af.rope(interleaved=True), af.scaled_dot_product(0.3)], id="rope-scale"),
    ],
)
@pytest.mark.parametrize("nq, nk", [(45, 30), (21, 66)])
def test_alibi_combined(extra, nq, nk):
    spec = af.attention(af.alibi(), *extra())
    q, k, v = make_qkv(b=1, hq=6, hkv=2, nq=nq, nk=nk, d=32, seed=7)
    check(spec, q, k, v)


def test_alibi_default_slopes_follow_the_head_count():
    """One compiled function called with 4, then 6, then 4 query heads: the default slopes are
    those of each call's head count."""
    spec = af.attention(af.alibi(), af.causal())
    fn = af.compile(spec)
    for hq in (4, 6, 4, 1):
        q, k, v = make_qkv(b=1, hq=hq, hkv=1, nq=20, nk=30, d=16, seed=hq)
        check(spec, q, k, v, fn=fn)


@pytest.mark.parametrize("slopes", [[0.5], [0.5, 0.25, 0.125], [0.5] * 8])
def test_alibi_wrong_slope_count(slopes):
    spec = af.attention(af.alibi(slopes))
    q, k, v = make_qkv(b=1, hq=4, hkv=2, nq=8, nk=8, d=16)
    with pytest.raises(af.AttnFuseError, match="alibi") as info:
        spec(q, k, v)
    assert "4" in str(info.value)


def test_alibi_slope_count_is_per_query_head():
    # With GQA the slopes are per *query* head: Hkv slopes are not enough.
    q, k, v = make_qkv(b=1, hq=4, hkv=2, nq=8, nk=8, d=16)
    with pytest.raises(af.AttnFuseError, match="alibi"):
        af.attention(af.alibi([0.5, 0.25]))(q, k, v)
    check(af.attention(af.alibi([0.5, 0.25, 0.125, 0.0625])), q, k, v)


# --------------------------------------------------------------------------------------------
# additive_bias
# --------------------------------------------------------------------------------------------

B, HQ, HKV, NQ, NK = 2, 4, 2, 33, 70

BIAS_SHAPES = {
    "[Nk]": (NK,),
    "[Nq,Nk]": (NQ, NK),
    "[1,Hq,1,Nk]": (1, HQ, 1, NK),
    "[B,1,Nq,Nk]": (B, 1, NQ, NK),
    "[B,Hq,Nq,Nk]": (B, HQ, NQ, NK),
    "[Hq,Nq,1]": (HQ, NQ, 1),
    "[B,1,1,1]": (B, 1, 1, 1),
}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape_name", list(BIAS_SHAPES))
def test_bias_broadcast_shapes(shape_name, dtype_name):
    dtype = DTYPES[dtype_name]
    spec = af.attention(af.additive_bias())
    q, k, v = make_qkv(b=B, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=32, dv=16, dtype=dtype, seed=3)
    bias = randn(*BIAS_SHAPES[shape_name], dtype=dtype, seed=11, scale=2.0)
    check(spec, q, k, v, bias=bias)


def test_bias_changes_the_result():
    q, k, v = make_qkv(b=1, hq=2, nq=20, nk=40, d=16)
    bias = randn(20, 40, scale=3.0)
    assert (af.attention()(q, k, v) - af.attention(af.additive_bias())(q, k, v, bias=bias)).abs().max() > 1e-2


@pytest.mark.parametrize("nq, nk", [(33, 70), (70, 33)])
def test_bias_non_contiguous(nq, nk):
    spec = af.attention(af.additive_bias())
    q, k, v = make_qkv(b=B, hq=HQ, hkv=HKV, nq=nq, nk=nk, d=32, seed=5, strided=True)
    transposed = randn(B, HQ, nk, nq, seed=1).transpose(-1, -2)  # [B, Hq, Nq, Nk] view
    assert not transposed.is_contiguous()
    check(spec, q, k, v, bias=transposed)
    sliced = randn(B, 2 * HQ, nq, 2 * nk, seed=2)[:, ::2, :, 1::2]
    assert not sliced.is_contiguous()
    check(spec, q, k, v, bias=sliced)
    heads_first = randn(HQ, B, nq, nk, seed=4).transpose(0, 1)
    check(spec, q, k, v, bias=heads_first)
    expanded = randn(nk, seed=6).expand(B, HQ, nq, nk)  # zero strides
    check(spec, q, k, v, bias=expanded)


@pytest.mark.parametrize(
    "q_dtype, bias_dtype",
    [
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.float16, torch.float32),
        (torch.float16, torch.bfloat16),
        (torch.bfloat16, torch.float16),
    ],
)
def test_bias_dtype_differs_from_inputs(q_dtype, bias_dtype):
    spec = af.attention(af.additive_bias(), af.causal())
    q, k, v = make_qkv(b=1, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=32, dtype=q_dtype, seed=8)
    bias = randn(1, HQ, NQ, NK, dtype=bias_dtype, seed=9, scale=2.0)
    check(spec, q, k, v, bias=bias)


def test_bias_with_minus_inf_keys():
    """A key-padding mask written as a bias: -inf on the first 40 keys of every row (more than
    one key block), finite elsewhere."""
    spec = af.attention(af.additive_bias())
    q, k, v = make_qkv(b=2, hq=2, nq=20, nk=70, d=16, seed=12)
    bias = torch.zeros(2, 1, 1, 70)
    bias[0, ..., :40] = float("-inf")
    bias[1, ..., 50:] = float("-inf")
    check(spec, q, k, v, bias=bias)


def test_bias_large_magnitudes():
    spec = af.attention(af.additive_bias(), af.alibi())
    q, k, v = make_qkv(b=1, hq=2, nq=25, nk=50, d=16, seed=13)
    bias = randn(25, 50, seed=14, scale=1000.0)
    check(spec, q, k, v, bias=bias)


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(lambda: [af.causal()], id="causal"),
        pytest.param(lambda: [af.sliding_window(10), af.causal()], id="causal-window"),
        pytest.param(lambda: [af.alibi()], id="alibi"),
        pytest.param(lambda: [af.relu()], id="relu"),
        pytest.param(lambda: [af.rope(rotary_dim=16)], id="rope"),
    ],
)
@pytest.mark.parametrize("dtype_name", ["fp32", "fp16"])
def test_bias_combined(extra, dtype_name):
    dtype = DTYPES[dtype_name]
    spec = af.attention(*extra(), af.additive_bias())
    q, k, v = make_qkv(b=B, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=32, dtype=dtype, seed=15)
    check(spec, q, k, v, bias=randn(B, 1, NQ, NK, dtype=dtype, seed=16))


def test_bias_requiring_grad_is_not_silently_detached():
    """A learned bias (requires_grad) gets its gradient, reduced onto its broadcast shape."""
    spec = af.attention(af.additive_bias())
    q, k, v = make_qkv(b=1, hq=2, nq=16, nk=24, d=16)
    bias = randn(16, 24).requires_grad_()
    out = spec(q, k, v, bias=bias)
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v, bias=bias), torch.float32)
    assert out.requires_grad, "bias requires grad, but the output is detached from it"
    out.sum().backward()
    ref = reference_gradients(spec, q, k, v, torch.ones_like(out), bias=bias)
    assert bias.grad.shape == bias.shape
    torch.testing.assert_close(bias.grad.double(), ref["bias"], atol=1e-6, rtol=1e-4)


def test_bias_row_of_minus_inf():
    """A row whose every kept key has bias -inf keeps no probability mass: 0 (lse -inf), never
    NaN, as a row with no kept key."""
    q, k, v = make_qkv(b=1, hq=2, nq=4, nk=40, d=16, seed=34)
    bias = torch.zeros(4, 40)
    bias[1] = float("-inf")
    out, lse = af.attention(af.additive_bias())(q, k, v, bias=bias, return_lse=True)
    ref = af.reference_attention(af.attention(af.additive_bias()), q, k, v, bias=bias)
    assert_close_to_reference(out, ref, torch.float32)
    assert (out[:, :, 1] == 0).all() and torch.isneginf(lse[:, :, 1]).all()
    assert torch.isfinite(lse[:, :, [0, 2, 3]]).all()


BAD_BIAS = {
    "wrong-Nk": (lambda: torch.zeros(NK + 1), "bias"),
    "wrong-Nq": (lambda: torch.zeros(NQ + 1, NK), "bias"),
    "wrong-heads": (lambda: torch.zeros(1, HKV + 1, 1, NK), "bias"),
    "wrong-batch": (lambda: torch.zeros(B + 1, 1, NQ, NK), "bias"),
    "five-dims": (lambda: torch.zeros(1, B, HQ, NQ, NK), "bias"),
    "int": (lambda: torch.zeros(NQ, NK, dtype=torch.int32), "bias"),
    "bool": (lambda: torch.zeros(NQ, NK, dtype=torch.bool), "bias"),
    "fp64": (lambda: torch.zeros(NQ, NK, dtype=torch.float64), "bias"),
    "not-a-tensor": (lambda: [[0.0] * NK] * NQ, "bias"),
    "other-device": (lambda: torch.zeros(NQ, NK, device="meta"), "bias"),
}


@pytest.mark.parametrize("name", list(BAD_BIAS))
def test_bad_bias(name):
    make, word = BAD_BIAS[name]
    spec = af.attention(af.additive_bias())
    q, k, v = make_qkv(b=B, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=16)
    with pytest.raises(af.AttnFuseError, match=word) as info:
        spec(q, k, v, bias=make())
    assert isinstance(info.value, ArgumentError)


def test_bias_missing():
    spec = af.attention(af.additive_bias(), af.causal())
    q, k, v = make_qkv(b=1, hq=2, nq=8, nk=8, d=16)
    with pytest.raises(af.AttnFuseError, match="bias"):
        spec(q, k, v)
    with pytest.raises(af.AttnFuseError, match="bias"):
        af.compile(spec)(q, k, v, return_lse=True)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(lambda: af.attention(), id="default"),
        pytest.param(lambda: af.attention(af.alibi(), af.causal()), id="alibi"),
        pytest.param(lambda: af.attention(af.block_sparse(16)), id="block_sparse"),
    ],
)
def test_bias_without_additive_bias(spec):
    spec = spec()
    q, k, v = make_qkv(b=1, hq=2, nq=16, nk=16, d=16)
    data = {"block_layout": torch.ones(1, 1, dtype=torch.bool)} if spec.block(BlockSparse) else {}
    spec(q, k, v, **data)  # fine without a bias
    with pytest.raises(af.AttnFuseError, match="additive_bias"):
        spec(q, k, v, bias=torch.zeros(16, 16), **data)


# --------------------------------------------------------------------------------------------
# block_sparse
# --------------------------------------------------------------------------------------------


def layout_for(bs: int, hq: int, nq: int, nk: int, *, per_head: bool, density: float, seed: int):
    rows, cols = -(-nq // bs), -(-nk // bs)
    shape = (hq, rows, cols) if per_head else (rows, cols)
    layout = random_layout(shape, density, seed)
    if rows > 1:
        layout[..., rows - 1, :] = False  # a query block with no key block: those rows are empty
    layout[..., 0, 0] = True
    return layout


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per-head"])
@pytest.mark.parametrize("bs", [16, 32, 64])
@pytest.mark.parametrize("nq, nk", [(64, 64), (50, 77), (77, 50), (1, 70), (100, 9)])
def test_block_sparse_layouts(bs, per_head, nq, nk):
    spec = af.attention(af.block_sparse(bs))
    hq = 4
    q, k, v = make_qkv(b=2, hq=hq, hkv=2, nq=nq, nk=nk, d=32, dv=16, seed=bs + nq)
    layout = layout_for(bs, hq, nq, nk, per_head=per_head, density=0.5, seed=nq * nk + bs)
    out, lse = check(spec, q, k, v, block_layout=layout)
    rows = -(-nq // bs)
    if rows > 1:
        last = slice((rows - 1) * bs, nq)
        assert (out[:, :, last] == 0).all()
        assert torch.isneginf(lse[:, :, last]).all()


@pytest.mark.parametrize("causal", [False, True], ids=["bandless", "causal"])
def test_block_sparse_forward_grid_order(causal):
    """A bandless block-sparse forward runs on its head-major grid (`tile.kernel`'s
    `head_major`), a causal one on the block-major grid (longest programs first); both against
    the reference through the kernels, ragged and GQA, with an empty query block."""
    spec = af.attention(af.block_sparse(16), *([af.causal()] if causal else []))
    fn = af.compile(spec)
    q, k, v = make_qkv(b=2, hq=4, hkv=2, nq=70, nk=90, d=32, seed=24)
    layout = layout_for(16, 4, 70, 90, per_head=True, density=0.5, seed=25)
    out = fn(q, k, v, block_layout=layout)
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v, block_layout=layout), q.dtype)
    forward = fn.last.source[fn.last.source.index("def attention_fwd("):]
    forward = forward[:forward.index("\n\n")]
    assert ("batch_head = tl.program_id(0) // num_blocks" in forward) == (not causal)
    assert ("batch_head = tl.program_id(0)\n" in forward) == causal


@pytest.mark.parametrize("dtype_name", list(HALF))
@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per-head"])
def test_block_sparse_half(dtype_name, per_head):
    dtype = HALF[dtype_name]
    spec = af.attention(af.block_sparse(16))
    q, k, v = make_qkv(b=1, hq=4, hkv=1, nq=45, nk=83, d=64, dtype=dtype, seed=21)
    layout = layout_for(16, 4, 45, 83, per_head=per_head, density=0.4, seed=22)
    check(spec, q, k, v, block_layout=layout)


@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("nq, nk", [(48, 48), (37, 90)])
def test_block_sparse_all_true_is_dense(bs, nq, nk):
    q, k, v = make_qkv(b=1, hq=2, nq=nq, nk=nk, d=32, seed=23)
    layout = torch.ones(-(-nq // bs), -(-nk // bs), dtype=torch.bool)
    out, lse = check(af.attention(af.block_sparse(bs)), q, k, v, block_layout=layout)
    dense, dense_lse = af.attention()(q, k, v, return_lse=True)
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse, dense_lse, atol=1e-5, rtol=0)
    # With causal, too: the same as causal alone.
    causal, causal_lse = af.attention(af.causal())(q, k, v, return_lse=True)
    out, lse = af.attention(af.causal(), af.block_sparse(bs))(q, k, v, return_lse=True, block_layout=layout)
    torch.testing.assert_close(out, causal, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse, causal_lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("relu", [False, True], ids=["softmax", "relu"])
def test_block_sparse_all_false(dtype_name, relu):
    dtype = DTYPES[dtype_name]
    blocks = [af.block_sparse(32)] + ([af.relu()] if relu else [])
    spec = af.attention(*blocks)
    q, k, v = make_qkv(b=2, hq=2, nq=40, nk=70, d=16, dtype=dtype)
    layout = torch.zeros(2, 2, 3, dtype=torch.bool)
    if relu:
        out = spec(q, k, v, block_layout=layout)
    else:
        out, lse = spec(q, k, v, block_layout=layout, return_lse=True)
        assert torch.isneginf(lse).all()
    assert out.dtype == dtype and out.shape == (2, 2, 40, 16)
    assert (out == 0).all()
    check(spec, q, k, v, block_layout=layout)


def test_block_sparse_empty_rows_in_one_head_only():
    spec = af.attention(af.block_sparse(16))
    q, k, v = make_qkv(b=1, hq=3, hkv=1, nq=40, nk=40, d=16, seed=24)
    layout = torch.ones(3, 3, 3, dtype=torch.bool)
    layout[1, 1, :] = False  # head 1, rows 16..31: no key
    out, lse = check(spec, q, k, v, block_layout=layout)
    assert (out[:, 1, 16:32] == 0).all() and torch.isneginf(lse[:, 1, 16:32]).all()
    assert torch.isfinite(lse[:, 0]).all() and torch.isfinite(lse[:, 2]).all()


SPARSE_COMBOS = {
    "causal": lambda: [af.causal()],
    "window": lambda: [af.sliding_window(20)],
    "causal-window": lambda: [af.causal(), af.sliding_window(25)],
    "alibi": lambda: [af.alibi()],
    "relu": lambda: [af.relu()],
    "relu-causal": lambda: [af.relu(), af.causal()],
    "rope": lambda: [af.rope(theta=500000.0, interleaved=True)],
    "rope-partial": lambda: [af.rope(rotary_dim=8)],
    "bias": lambda: [af.additive_bias()],
    "everything": lambda: [
        af.rope(scaling=af.llama3_scaling(original_max_position=64)),
        af.scaled_dot_product(0.2),
        af.alibi(),
        af.additive_bias(),
        af.causal(),
        af.sliding_window(40),
    ],
}


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per-head"])
@pytest.mark.parametrize("nq, nk", [(70, 70), (45, 93), (93, 45)])
@pytest.mark.parametrize("combo", list(SPARSE_COMBOS))
def test_block_sparse_combined(combo, nq, nk, per_head):
    bs = 16
    blocks = SPARSE_COMBOS[combo]()
    spec = af.attention(af.block_sparse(bs), *blocks)
    hq = 4
    q, k, v = make_qkv(b=1, hq=hq, hkv=2, nq=nq, nk=nk, d=32, seed=nq + 3 * nk)
    layout = layout_for(bs, hq, nq, nk, per_head=per_head, density=0.6, seed=nq - nk + 100)
    bias = randn(1, hq, nq, nk, seed=5) if spec.block(AdditiveBias) else None
    check(spec, q, k, v, block_layout=layout, bias=bias)


@pytest.mark.parametrize(
    "config",
    [(16, 16), (16, 32), (32, 16), (32, 32), (64, 64)],
    ids=lambda c: f"{c[0]}x{c[1]}",
)
@pytest.mark.parametrize("bs", [32, 64])
def test_block_sparse_tile_configs(config, bs):
    """Kernel blocks of any size up to the layout's: each layout block spans several kernel
    blocks (bigger tiles are clamped to the block size)."""
    spec = af.attention(af.block_sparse(bs), af.causal())
    q, k, v = make_qkv(b=1, hq=2, nq=90, nk=100, d=16, seed=bs)
    layout = layout_for(bs, 2, 90, 100, per_head=True, density=0.6, seed=bs + config[0])
    fn = af.compile(spec, config=af.TileConfig(config[0], config[1], 4, 1))
    check(spec, q, k, v, fn=fn, block_layout=layout)


def test_block_sparse_layouts_change_between_calls():
    """One compiled function, one shape, several layouts (and one changed in place): each call
    uses the layout it is given."""
    spec = af.attention(af.block_sparse(16))
    fn = af.compile(spec)
    q, k, v = make_qkv(b=1, hq=2, nq=48, nk=48, d=16, seed=30)
    layouts = [random_layout((3, 3), 0.5, seed) | torch.eye(3, dtype=torch.bool) for seed in range(4)]
    for layout in layouts + layouts[::-1]:
        check(spec, q, k, v, fn=fn, block_layout=layout)
    layout = torch.ones(3, 3, dtype=torch.bool)
    check(spec, q, k, v, fn=fn, block_layout=layout)
    layout[1, :] = False  # in place: the same storage, a new version
    out, _ = check(spec, q, k, v, fn=fn, block_layout=layout)
    assert (out[:, :, 16:32] == 0).all()
    layout[1, 2] = True
    check(spec, q, k, v, fn=fn, block_layout=layout)
    # In place through another view of the same storage.
    view = layout.view(-1)
    view[0] = False
    check(spec, q, k, v, fn=fn, block_layout=layout)


def test_block_sparse_layouts_sharing_storage():
    """A layout and its transpose share storage, in-place version and shape, yet differ: each
    call must use the layout it is given (not lists cached for the other). The same holds for
    a fresh layout that happens to reuse a freed one's memory, as CUDA's caching allocator
    does for `fn(q, k, v, block_layout=make_layout())` in a loop."""
    spec = af.attention(af.block_sparse(16))
    fn = af.compile(spec)
    q, k, v = make_qkv(b=1, hq=2, nq=48, nk=48, d=16, seed=33)
    layout = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
    check(spec, q, k, v, fn=fn, block_layout=layout)
    check(spec, q, k, v, fn=fn, block_layout=layout.T)
    check(spec, q, k, v, fn=fn, block_layout=layout)


def test_block_sparse_layout_reused_across_shapes():
    spec = af.attention(af.block_sparse(32))
    fn = af.compile(spec)
    layout = torch.tensor([[True, False], [False, True]])
    for nq, nk in [(64, 64), (40, 50), (33, 64)]:
        q, k, v = make_qkv(b=1, hq=2, nq=nq, nk=nk, d=16, seed=nq)
        check(spec, q, k, v, fn=fn, block_layout=layout)


BAD_LAYOUTS = {
    # For Nq = 40, Nk = 70, bs = 16: [3, 5] or [Hq=4, 3, 5].
    "too-few-rows": lambda: torch.ones(2, 5, dtype=torch.bool),
    "too-many-cols": lambda: torch.ones(3, 6, dtype=torch.bool),
    "transposed": lambda: torch.ones(5, 3, dtype=torch.bool),
    "kv-heads": lambda: torch.ones(2, 3, 5, dtype=torch.bool),
    "one-dim": lambda: torch.ones(15, dtype=torch.bool),
    "four-dims": lambda: torch.ones(1, 4, 3, 5, dtype=torch.bool),
    "uint8": lambda: torch.ones(3, 5, dtype=torch.uint8),
    "int64": lambda: torch.ones(3, 5, dtype=torch.int64),
    "float": lambda: torch.ones(3, 5),
    "list": lambda: [[True] * 5] * 3,
    "other-device": lambda: torch.ones(3, 5, dtype=torch.bool, device="meta"),
}


@pytest.mark.parametrize("name", list(BAD_LAYOUTS))
def test_bad_block_layout(name):
    spec = af.attention(af.block_sparse(16))
    q, k, v = make_qkv(b=1, hq=4, hkv=2, nq=40, nk=70, d=16)
    with pytest.raises(af.AttnFuseError, match="block_layout") as info:
        spec(q, k, v, block_layout=BAD_LAYOUTS[name]())
    assert isinstance(info.value, ArgumentError)


def test_block_layout_missing():
    q, k, v = make_qkv(b=1, hq=2, nq=40, nk=70, d=16)
    for spec in (af.attention(af.block_sparse(16)), af.attention(af.block_sparse(16), af.relu(), af.causal())):
        with pytest.raises(af.AttnFuseError, match="block_sparse"):
            spec(q, k, v)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(lambda: af.attention(), id="default"),
        pytest.param(lambda: af.attention(af.causal(), af.relu()), id="causal-relu"),
        pytest.param(lambda: af.attention(af.additive_bias()), id="bias"),
    ],
)
def test_block_layout_without_block_sparse(spec):
    spec = spec()
    q, k, v = make_qkv(b=1, hq=2, nq=16, nk=16, d=16)
    data = {"bias": torch.zeros(16)} if spec.block(AdditiveBias) else {}
    with pytest.raises(af.AttnFuseError, match="block_sparse"):
        spec(q, k, v, block_layout=torch.ones(1, 1, dtype=torch.bool), **data)


def test_unknown_keyword_is_an_error():
    q, k, v = make_qkv(b=1, hq=2, nq=16, nk=16, d=16)
    with pytest.raises(af.AttnFuseError, match="layout"):
        af.attention(af.block_sparse(16))(q, k, v, layout=torch.ones(1, 1, dtype=torch.bool))


@pytest.mark.parametrize("nq, nk", [(0, 20), (20, 0), (0, 0)])
def test_empty_sequences(nq, nk):
    """No query or no key: the output is [B, Hq, Nq, Dv] zeros, lse -inf; call-time data is
    still checked against the (empty) shapes."""
    q, k, v = make_qkv(b=1, hq=2, nq=nq, nk=nk, d=16)
    rows, cols = -(-nq // 16), -(-nk // 16)
    cases = [
        (af.attention(af.block_sparse(16), af.causal()), {"block_layout": torch.ones(rows, cols, dtype=torch.bool)}),
        (af.attention(af.additive_bias(), af.alibi()), {"bias": torch.zeros(nq, nk)}),
        (af.attention(af.relu(), af.block_sparse(16)), {"block_layout": torch.ones(2, rows, cols, dtype=torch.bool)}),
    ]
    for spec, data in cases:
        if spec.block(Relu) is None:
            out, lse = spec(q, k, v, return_lse=True, **data)
            assert lse.shape == (1, 2, nq) and torch.isneginf(lse).all()
        else:
            out = spec(q, k, v, **data)
        assert out.shape == (1, 2, nq, 16) and (out == 0).all()
        wrong = {name: torch.ones(rows + 1, cols + 1, dtype=torch.bool) if name == "block_layout"
                 else torch.zeros(nq + 2, nk + 2) for name in data}
        with pytest.raises(af.AttnFuseError):
            spec(q, k, v, **wrong)


# --------------------------------------------------------------------------------------------
# relu
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("nq, nk", [(32, 32), (1, 70), (70, 5), (45, 90)])
def test_relu_alone(dtype_name, nq, nk):
    dtype = DTYPES[dtype_name]
    spec = af.attention(af.relu())
    q, k, v = make_qkv(b=2, hq=2, nq=nq, nk=nk, d=32, dv=16, dtype=dtype, seed=nq * nk)
    check(spec, q, k, v)


def test_relu_is_not_softmax():
    q, k, v = make_qkv(b=1, hq=2, nq=20, nk=30, d=16)
    out = af.attention(af.relu())(q, k, v)
    # relu(s) / Nk: compare with a direct computation, independent of the reference.
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(16)
    expected = (torch.relu(s) / 30) @ v.double()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("nq, nk", [(70, 30), (30, 70), (50, 50)])
def test_relu_causal(dtype_name, nq, nk):
    dtype = DTYPES[dtype_name]
    spec = af.attention(af.causal(), af.relu())
    q, k, v = make_qkv(b=1, hq=3, hkv=1, nq=nq, nk=nk, d=16, dtype=dtype, seed=nq)
    out, _ = check(spec, q, k, v)
    if nq > nk:
        # The first Nq - Nk queries come before every key: exactly 0.
        assert (out[:, :, : nq - nk] == 0).all()
        assert (out[:, :, nq - nk :] != 0).any()


@pytest.mark.parametrize(
    "rope",
    [
        pytest.param(lambda: af.rope(), id="half-split"),
        pytest.param(lambda: af.rope(interleaved=True, rotary_dim=16), id="interleaved-partial"),
        pytest.param(
            lambda: af.rope(theta=500000.0, scaling=af.llama3_scaling(original_max_position=64)),
            id="llama3",
        ),
    ],
)
@pytest.mark.parametrize("placement", ["fused", "pre_rotated"])
def test_relu_rope(rope, placement):
    spec = af.attention(rope(), af.relu())
    q, k, v = make_qkv(b=1, hq=2, nq=40, nk=90, d=32, seed=31)
    check(spec, q, k, v, rope_placement=placement)


@pytest.mark.parametrize("hq, hkv", [(4, 1), (6, 2), (6, 3)])
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_relu_gqa(hq, hkv, dtype_name):
    spec = af.attention(af.relu(), af.sliding_window(17))
    q, k, v = make_qkv(b=2, hq=hq, hkv=hkv, nq=33, nk=57, d=48, dv=32, dtype=DTYPES[dtype_name], seed=hq)
    check(spec, q, k, v)


def test_relu_scale():
    spec = af.attention(af.relu(), af.scaled_dot_product(2.0))
    q, k, v = make_qkv(b=1, hq=2, nq=30, nk=45, d=16, seed=32)
    check(spec, q, k, v)


def test_relu_return_lse_is_an_error():
    spec = af.attention(af.relu(), af.causal())
    q, k, v = make_qkv(b=1, hq=2, nq=16, nk=16, d=16)
    with pytest.raises(af.AttnFuseError, match="relu") as info:
        spec(q, k, v, return_lse=True)
    assert isinstance(info.value, ArgumentError)
    with pytest.raises(af.AttnFuseError, match="relu"):
        af.compile(spec)(q, k, v, return_lse=True)
    spec(q, k, v, return_lse=False)  # fine


# --------------------------------------------------------------------------------------------
# rope with Llama-3.1 scaling
# --------------------------------------------------------------------------------------------


def hf_llama3_inverse_frequencies(theta, dim, factor, low, high, original):
    """transformers' `_compute_llama3_parameters`, transcribed, in float64."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    low_freq_wavelen = original / low
    high_freq_wavelen = original / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


@pytest.mark.parametrize(
    "params", [(500000.0, 128, 8.0, 1.0, 4.0, 8192), (10000.0, 64, 4.0, 1.0, 2.0, 64), (500000.0, 32, 8.0, 2.0, 8.0, 100)]
)
def test_llama3_frequencies_match_transformers(params):
    theta, dim, factor, low, high, original = params
    scaling = af.llama3_scaling(factor, low, high, original)
    ours = rope_inverse_frequencies(theta, dim, scaling)
    expected = hf_llama3_inverse_frequencies(theta, dim, factor, low, high, original).float()
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0)


LLAMA3 = af.llama3_scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=64)


@pytest.mark.parametrize("placement", ["fused", "pre_rotated", "q_fused", "auto"])
@pytest.mark.parametrize(
    "rope",
    [
        pytest.param(lambda: af.rope(theta=500000.0, scaling=LLAMA3), id="half-split"),
        pytest.param(lambda: af.rope(theta=500000.0, interleaved=True, scaling=LLAMA3), id="interleaved"),
        pytest.param(lambda: af.rope(theta=500000.0, rotary_dim=32, scaling=LLAMA3), id="partial"),
        pytest.param(
            lambda: af.rope(theta=10000.0, scaling=af.llama3_scaling(factor=4.0, high_freq_factor=2.0, original_max_position=32)),
            id="theta-1e4",
        ),
    ],
)
@pytest.mark.parametrize("nq, nk", [(100, 100), (37, 100), (100, 61)])
def test_rope_llama3_scaling(rope, placement, nq, nk):
    spec = af.attention(rope(), af.causal())
    q, k, v = make_qkv(b=1, hq=2, hkv=1, nq=nq, nk=nk, d=64, seed=nq + nk)
    check(spec, q, k, v, rope_placement=placement)


@pytest.mark.parametrize("dtype_name", list(HALF))
def test_rope_llama3_scaling_half(dtype_name):
    spec = af.attention(af.rope(theta=500000.0, scaling=LLAMA3))
    q, k, v = make_qkv(b=2, hq=4, hkv=2, nq=90, nk=100, d=64, dtype=HALF[dtype_name], seed=41)
    check(spec, q, k, v)


def test_rope_llama3_scaling_matters():
    """At N ~ 100 with original_max_position = 64 the scaled rotation differs from the plain one
    by far more than the tolerance, so the tests above would see a missing scaling."""
    q, k, v = make_qkv(b=1, hq=2, nq=100, nk=100, d=64, seed=42, dtype=torch.float32)
    q, k = 3 * q, 3 * k  # sharper attention: position-dependent scores matter more
    scaled = af.attention(af.rope(theta=500000.0, scaling=LLAMA3))
    plain = af.attention(af.rope(theta=500000.0))
    ref_scaled = af.reference_attention(scaled, q, k, v)
    ref_plain = af.reference_attention(plain, q, k, v)
    assert (ref_scaled - ref_plain).abs().max() > 1e-2
    out = check(scaled, q, k, v)[0]
    assert (out.double() - ref_plain).abs().max() > 1e-2


def test_the_reference_uses_alibi_slopes_in_float32():
    """docs/semantics.md: the slopes are used in float32. One query, and the key `Nk - 1`
    positions before it: under relu (`p = relu(s) / Nk`) with zero q and k, that key's weight is
    exactly the float32 slope times the distance over Nk (1/3 is not a float32: the float64
    slope would differ by 1e-9)."""
    slope, nk = -1 / 3, 4097
    q = torch.zeros(1, 1, 1, 8, dtype=torch.float64)
    k = torch.zeros(1, 1, nk, 8, dtype=torch.float64)
    v = torch.zeros(1, 1, nk, 1, dtype=torch.float64)
    v[0, 0, 0, 0] = 1.0  # the output is the first key's weight
    out = af.reference_attention(af.attention(af.alibi(slopes=[slope]), af.relu()), q, k, v)[0, 0, 0, 0].item()
    as_float32 = torch.tensor(slope, dtype=torch.float32).item()
    assert out == as_float32 * -(nk - 1) / nk
    assert out != slope * -(nk - 1) / nk
