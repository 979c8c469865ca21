"""Gradients through the backward kernels, against autograd through the float64 reference.

Every case runs the generated forward and backward Triton kernels (on the CPU under Triton's
interpreter), then compares dq, dk, dv (and dbias, and the lse's contribution) with
`reference_gradients`. The error measure is the max abs error relative to the largest
reference gradient of the same tensor: <= 2e-4 in fp32 (the kernels are ~1e-7 there) and
<= 2e-2 in fp16/bf16. Forgetting the softmax scale, the RoPE inverse rotation (R^T on dq and
dk), a GQA reduction or the lse's share of delta all give O(1) errors, far above either bound.

Beyond the numbers: gradients keep their inputs' dtype and shape, are never NaN/inf, are
exactly 0 on rows with no kept key (dq) and on keys no row keeps (dk, dv), and two runs are
bit-identical.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

pytest.importorskip("hypothesis")

from conftest import make_qkv  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_properties_all_blocks import legal_cases  # noqa: E402

import attnfuse as af  # noqa: E402
from attnfuse.dsl.blocks import AdditiveBias, BlockSparse, Relu, Rope  # noqa: E402
from attnfuse.runtime.reference import keep_mask, reference_gradients  # noqa: E402

pytestmark = pytest.mark.interpreter

FP32_GRAD_REL = 2e-4
HALF_GRAD_REL = 2e-2
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def grad_tolerance(*dtypes: torch.dtype) -> float:
    """Relative-to-max tolerance: the loosest of the dtypes involved."""
    return max(FP32_GRAD_REL if dt == torch.float32 else HALF_GRAD_REL for dt in dtypes)


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(dtype)


def relative_error(got: torch.Tensor, ref: torch.Tensor, scale: float) -> float:
    """max |got - ref| / scale (0 for empty tensors)."""
    if ref.numel() == 0:
        return 0.0
    return (got.detach().double() - ref).abs().max().item() / scale


def full_bias_gradient(spec, q, k, v, go, bias, glse, call) -> torch.Tensor:
    """The reference gradient of the bias at full size [B, Hq, Nq, Nk] (= dS, the gradient of
    the scores): the natural magnitude against which a reduced bias gradient's error is
    measured (a bias constant along keys has an exactly-zero true gradient)."""
    full = bias.detach().double().expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]).contiguous()
    return reference_gradients(spec, q, k, v, go, bias=full, grad_lse=glse, **call)["bias"]


def assert_gradients_match(
    spec,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    go: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    glse: torch.Tensor | None = None,
    call: dict | None = None,
    label: str = "",
) -> dict[str, torch.Tensor]:
    """Compares the .grad of q, k, v (those that require grad) and of bias (if it requires
    grad) with the reference. Returns the reference gradients."""
    call = call or {}
    ref = reference_gradients(spec, q, k, v, go, bias=bias, grad_lse=glse, **call)
    tensors = {"q": q, "k": k, "v": v}
    if bias is not None and bias.requires_grad:
        tensors["bias"] = bias
    # A tensor whose true gradient is all zero (every key masked, say) is measured against
    # the largest other gradient; if all are zero, against 1.
    fallback = max([ref[n].abs().max().item() for n in ("q", "k", "v") if ref[n].numel()] + [0.0]) or 1.0
    errors = {}
    for name, t in tensors.items():
        if not t.requires_grad:
            assert t.grad is None, f"{name} does not require grad but got one"
            continue
        g = t.grad
        assert g is not None, f"{label}: no gradient for {name}"
        assert g.dtype == t.dtype, f"{label}: d{name} dtype {g.dtype} != {t.dtype}"
        assert tuple(g.shape) == tuple(t.shape), f"{label}: d{name} shape {tuple(g.shape)} != {tuple(t.shape)}"
        assert not torch.isnan(g).any(), f"{label}: d{name} has {int(torch.isnan(g).sum())} NaN values"
        assert torch.isfinite(g).all(), f"{label}: d{name} has non-finite values"
        r = ref[name]
        scale = r.abs().max().item() if r.numel() else 0.0
        tol = grad_tolerance(q.dtype)
        if name == "bias":
            tol = grad_tolerance(q.dtype, t.dtype)
            dS = full_bias_gradient(spec, q, k, v, go, bias, glse, call)
            scale = max(scale, dS.abs().max().item())
        scale = scale or fallback
        errors[name] = relative_error(g, r, scale)
        assert errors[name] <= tol, (
            f"{label}: d{name} error {errors[name]:.3e} (relative to max {scale:.3e}) > {tol:.0e}; "
            f"all: {', '.join(f'{n} {e:.1e}' for n, e in errors.items())}"
        )
    return ref


def empty_rows_and_keys(spec, q, k, layout):
    """(rows [B, Hq, Nq] with no kept key, keys [B, Hkv, Nk] kept by no row of their group)."""
    b, hq, nq = q.shape[:3]
    hkv, nk = k.shape[1], k.shape[2]
    keep = keep_mask(spec, nq, nk, layout)
    keep = keep.expand(b, hq, nq, nk) if keep.dim() == 2 else keep[None].expand(b, hq, nq, nk)
    rows = ~keep.any(-1)
    keys = ~keep.reshape(b, hkv, hq // hkv, nq, nk).any(2).any(2)
    return rows, keys


def check_grads(
    spec,
    *,
    b: int = 1,
    hq: int = 2,
    hkv: int | None = None,
    nq: int = 37,
    nk: int = 45,
    d: int = 32,
    dv: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    bias: torch.Tensor | None = None,
    lse_grad: bool = False,
    placement: str = "auto",
    config: af.TileConfig | None = None,
    strided: bool = False,
    fn=None,
    **call,
):
    """Forward + backward through the kernels, checked against the reference. `bias` is used
    as given (set requires_grad on it to check its gradient). With `lse_grad`, the lse is
    returned and gets a random gradient too. Returns (grads, reference grads)."""
    fn = fn if fn is not None else af.compile(spec, rope_placement=placement, config=config)
    q, k, v = make_qkv(b, hq, hkv, nq, nk, d, dv, dtype, seed=seed, strided=strided, requires_grad=True)
    kwargs = dict(call)
    if bias is not None:
        kwargs["bias"] = bias
    gen = torch.Generator().manual_seed(seed + 1000)
    if lse_grad:
        out, lse = fn(q, k, v, return_lse=True, **kwargs)
        go = torch.randn(out.shape, generator=gen).to(dtype)
        glse = torch.randn(lse.shape, generator=gen)
        torch.autograd.backward([out, lse], [go, glse])
    else:
        out = fn(q, k, v, **kwargs)
        go = torch.randn(out.shape, generator=gen).to(dtype)
        glse = None
        out.backward(go)
    label = f"{spec!r} {dtype} B{b} Hq{hq} Hkv{hkv or hq} Nq{nq} Nk{nk} D{d} Dv{dv or d} {placement}"
    ref = assert_gradients_match(spec, q, k, v, go, bias=bias, glse=glse, call=call, label=label)
    # Structural zeros: rows with no kept key have dq exactly 0, keys no row keeps have dk, dv
    # exactly 0 (P is exactly 0 there, whatever the kernels' rounding).
    rows, keys = empty_rows_and_keys(spec, q, k, call.get("block_layout"))
    assert (q.grad[rows] == 0).all(), f"{label}: dq of a row with no kept key is not 0"
    assert (k.grad[keys] == 0).all(), f"{label}: dk of a key no row keeps is not 0"
    assert (v.grad[keys] == 0).all(), f"{label}: dv of a key no row keeps is not 0"
    return {"q": q.grad, "k": k.grad, "v": v.grad}, ref


# --------------------------------------------------------------------------------------------
# Per block, alone, in fp32 and 16-bit
# --------------------------------------------------------------------------------------------

SINGLE_BLOCKS = {
    "none": lambda: [],
    "scaled_dot_product": lambda: [af.scaled_dot_product()],
    "scaled_dot_product-0.3": lambda: [af.scaled_dot_product(0.3)],
    "rope": lambda: [af.rope()],
    "full": lambda: [af.full()],
    "causal": lambda: [af.causal()],
    "sliding_window": lambda: [af.sliding_window(9)],
    "alibi": lambda: [af.alibi()],
    "softmax": lambda: [af.softmax()],
    "relu": lambda: [af.relu()],
}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", list(SINGLE_BLOCKS))
def test_single_block(name, dtype_name):
    check_grads(af.attention(*SINGLE_BLOCKS[name]()), dtype=DTYPES[dtype_name], seed=len(name))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_single_block_additive_bias(dtype_name):
    dtype = DTYPES[dtype_name]
    bias = randn(1, 2, 37, 45, dtype=dtype, seed=3, scale=2.0).requires_grad_()
    check_grads(af.attention(af.additive_bias()), dtype=dtype, bias=bias)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_single_block_block_sparse(dtype_name):
    layout = torch.tensor([[True, False], [True, True]])
    check_grads(af.attention(af.block_sparse(32)), dtype=DTYPES[dtype_name], block_layout=layout)


# --------------------------------------------------------------------------------------------
# RoPE: styles, widths, positions, scaling, placements
# --------------------------------------------------------------------------------------------

ROPES = {
    "half": lambda: af.rope(),
    "interleaved": lambda: af.rope(interleaved=True),
    "partial": lambda: af.rope(rotary_dim=16),
    "partial-interleaved": lambda: af.rope(rotary_dim=8, interleaved=True),
    "theta100": lambda: af.rope(theta=100.0),
    "llama3": lambda: af.rope(theta=500000.0, scaling=af.llama3_scaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=32)),
}


@pytest.mark.parametrize("placement", ["fused", "pre_rotated", "q_fused", "auto"])
@pytest.mark.parametrize("rope", list(ROPES))
def test_rope_causal(rope, placement):
    spec = af.attention(ROPES[rope](), af.causal())
    check_grads(spec, hq=4, hkv=2, nq=41, nk=53, d=32, placement=placement, seed=7)


@pytest.mark.parametrize("dtype_name", list(HALF))
@pytest.mark.parametrize("placement", ["fused", "pre_rotated", "q_fused"])
def test_rope_half(placement, dtype_name):
    spec = af.attention(af.rope(rotary_dim=24, interleaved=True), af.causal())
    check_grads(spec, hq=2, hkv=1, nq=50, nk=50, d=32, dv=16, dtype=HALF[dtype_name], placement=placement)


@pytest.mark.parametrize("placement", ["fused", "pre_rotated", "q_fused"])
@pytest.mark.parametrize("per_batch", [False, True], ids=["positions-N", "positions-BN"])
def test_rope_given_positions(per_batch, placement):
    spec = af.attention(af.rope(scaling=af.llama3_scaling(original_max_position=16)), af.causal())
    gen = torch.Generator().manual_seed(5)
    b, nq, nk = 2, 23, 38
    shape_q, shape_k = ((b, nq), (b, nk)) if per_batch else ((nq,), (nk,))
    qp = torch.randint(0, 300, shape_q, generator=gen)
    kp = torch.randint(0, 300, shape_k, generator=gen)
    check_grads(spec, b=b, hq=2, nq=nq, nk=nk, d=32, placement=placement, q_positions=qp, k_positions=kp)


def test_rope_odd_head_dim():
    spec = af.attention(af.rope(rotary_dim=10), af.scaled_dot_product(0.2))
    check_grads(spec, nq=19, nk=27, d=18, dv=24)


# --------------------------------------------------------------------------------------------
# alibi
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "slopes", [None, [1.0, 0.5, -0.125, 0.0]], ids=["paper-slopes", "explicit-slopes"]
)
@pytest.mark.parametrize("extra", [[], ["causal"], ["window"]])
def test_alibi(slopes, extra):
    blocks = [af.alibi(slopes)] + [af.causal() if e == "causal" else af.sliding_window(12) for e in extra]
    check_grads(af.attention(*blocks), hq=4, hkv=2, nq=29, nk=51, d=16, seed=11)


def test_alibi_half_with_rope():
    spec = af.attention(af.alibi(), af.rope(), af.causal())
    check_grads(spec, hq=4, hkv=1, nq=40, nk=40, d=32, dtype=torch.bfloat16)


# --------------------------------------------------------------------------------------------
# additive_bias
# --------------------------------------------------------------------------------------------

B, HQ, HKV, NQ, NK = 2, 4, 2, 21, 35
BIAS_SHAPES = {
    "full": (B, HQ, NQ, NK),
    "heads-rows-keys": (HQ, NQ, NK),
    "rows-keys": (NQ, NK),
    "keys": (NK,),
    "padding": (B, 1, 1, NK),
    "per-head-row": (B, HQ, NQ, 1),  # constant along keys: true gradient exactly 0
    "per-head": (HQ, 1, 1),  # constant along keys: true gradient exactly 0
    "batch-keys": (B, 1, NQ, NK),
}


@pytest.mark.parametrize("shape", list(BIAS_SHAPES))
def test_bias_broadcast_shapes(shape):
    bias = randn(*BIAS_SHAPES[shape], seed=17, scale=2.0).requires_grad_()
    spec = af.attention(af.additive_bias(), af.causal())
    check_grads(spec, b=B, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=16, bias=bias, seed=3)
    if shape.startswith("per-head"):
        assert bias.grad.abs().max() <= 1e-5


@pytest.mark.parametrize(
    "q_dtype, bias_dtype",
    [
        (torch.float32, torch.float16),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
    ],
    ids=["fp32-q-fp16-bias", "fp16-q-fp32-bias", "bf16", "fp16"],
)
def test_bias_dtypes(q_dtype, bias_dtype):
    bias = randn(1, HQ, NQ, NK, dtype=bias_dtype, seed=9, scale=2.0).requires_grad_()
    spec = af.attention(af.additive_bias(), af.rope())
    check_grads(spec, b=B, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=32, dtype=q_dtype, bias=bias)


def test_bias_non_contiguous():
    base = randn(NK, NQ, seed=4, scale=2.0)
    bias = base.t().requires_grad_()  # a transposed view, a leaf
    assert not bias.is_contiguous()
    check_grads(af.attention(af.additive_bias()), b=B, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=16, bias=bias)


def test_bias_without_grad():
    """A constant bias: q, k, v gradients still right, no error, no bias gradient."""
    bias = randn(B, 1, NQ, NK, seed=6, scale=3.0)
    spec = af.attention(af.additive_bias(), af.sliding_window(10))
    check_grads(spec, b=B, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=16, bias=bias)
    assert bias.grad is None


def test_bias_only_requires_grad():
    """q, k, v constants, the bias learned: the autograd path still runs, and dbias is right."""
    spec = af.attention(af.additive_bias(), af.causal())
    q, k, v = make_qkv(B, HQ, HKV, NQ, NK, 16, seed=8)
    bias = randn(HQ, NQ, NK, seed=8).requires_grad_()
    out = spec(q, k, v, bias=bias)
    assert out.requires_grad
    go = randn(*out.shape, seed=9)
    out.backward(go)
    ref = reference_gradients(spec, q, k, v, go, bias=bias)
    dS = full_bias_gradient(spec, q, k, v, go, bias, None, {})
    assert relative_error(bias.grad, ref["bias"], dS.abs().max().item()) <= FP32_GRAD_REL


def test_bias_gradient_is_zero_where_masked():
    """A full-size bias: dbias is the score gradient, exactly 0 on masked-out pairs."""
    bias = randn(1, HQ, NQ, NK, seed=12).requires_grad_()
    layout = torch.tensor([[True, False, True], [False, True, False]])
    spec = af.attention(af.additive_bias(), af.block_sparse(16), af.causal())
    check_grads(spec, b=1, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=16, bias=bias, block_layout=layout)
    keep = keep_mask(spec, NQ, NK, layout)
    assert (bias.grad[..., ~keep] == 0).all()


def test_bias_with_minus_inf():
    """-inf in the bias drops keys like a mask; a row of -inf keeps nothing. Gradients stay
    finite and match; the bias gradient is 0 on the dropped pairs."""
    bias = randn(NQ, NK, seed=13)
    bias[:, :10] = float("-inf")
    bias[4] = float("-inf")
    bias.requires_grad_()
    spec = af.attention(af.additive_bias())
    grads, _ = check_grads(spec, b=B, hq=HQ, hkv=HKV, nq=NQ, nk=NK, d=16, bias=bias, lse_grad=True)
    assert (bias.grad[:, :10] == 0).all() and (bias.grad[4] == 0).all()
    assert (grads["q"][:, :, 4] == 0).all()
    assert (grads["k"][:, :, :10] == 0).all() and (grads["v"][:, :, :10] == 0).all()


# --------------------------------------------------------------------------------------------
# block_sparse
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", ["fp32", "fp16"])
@pytest.mark.parametrize(
    "layout_kind", ["shared", "per-head", "all-false", "empty-row-block", "all-true"]
)
def test_block_sparse_layouts(layout_kind, dtype_name):
    hq, nq, nk, bs = 4, 70, 90, 32
    rows, cols = -(-nq // bs), -(-nk // bs)
    gen = torch.Generator().manual_seed(21)
    layout = {
        "shared": lambda: torch.rand(rows, cols, generator=gen) < 0.5,
        "per-head": lambda: torch.rand(hq, rows, cols, generator=gen) < 0.5,
        "all-false": lambda: torch.zeros(rows, cols, dtype=torch.bool),
        "empty-row-block": lambda: torch.tensor([[True, False, True], [False, False, False], [False, True, True]]),
        "all-true": lambda: torch.ones(hq, rows, cols, dtype=torch.bool),
    }[layout_kind]()
    spec = af.attention(af.block_sparse(bs))
    grads, _ = check_grads(spec, hq=hq, hkv=2, nq=nq, nk=nk, d=16, dtype=DTYPES[dtype_name],
                           block_layout=layout, lse_grad=True)
    if layout_kind == "all-false":
        assert all((g == 0).all() for g in grads.values())


@pytest.mark.parametrize(
    "extra", [[], ["causal"], ["window"], ["causal", "window"]], ids=lambda e: "+".join(e) or "alone"
)
def test_block_sparse_with_masks(extra):
    blocks = [af.block_sparse(16)] + [af.causal() if e == "causal" else af.sliding_window(20) for e in extra]
    layout = randn(3, 4, seed=2) > -0.3
    check_grads(af.attention(*blocks), hq=3, hkv=1, nq=45, nk=60, d=32, block_layout=layout)


def test_block_sparse_block_size_smaller_than_tiles():
    """Tiles larger than the sparse block are clamped to it (forward and backward)."""
    spec = af.attention(af.block_sparse(16), af.rope())
    layout = randn(2, 4, 4, seed=3) > 0
    config = af.TileConfig(64, 64, 4, 1, 64, 32, 4, 1)
    check_grads(spec, hq=2, nq=60, nk=64, d=32, block_layout=layout, config=config)


# --------------------------------------------------------------------------------------------
# Masks, relu, shapes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window, causal", [(1, True), (1, False), (5, True), (17, False), (200, True)])
def test_sliding_windows(window, causal):
    blocks = [af.sliding_window(window)] + ([af.causal()] if causal else [])
    check_grads(af.attention(*blocks), nq=33, nk=47, d=16, seed=window)


@pytest.mark.parametrize(
    "blocks",
    [
        lambda: [af.relu()],
        lambda: [af.relu(), af.causal()],
        lambda: [af.relu(), af.rope(), af.sliding_window(8)],
        lambda: [af.relu(), af.alibi(), af.scaled_dot_product(0.5)],
    ],
    ids=["relu", "relu+causal", "relu+rope+window", "relu+alibi+scale"],
)
def test_relu(blocks):
    check_grads(af.attention(*blocks()), hq=4, hkv=2, nq=50, nk=31, d=32, dv=16, seed=4)


def test_relu_half():
    check_grads(af.attention(af.relu(), af.causal()), hq=2, hkv=1, nq=40, nk=40, d=32, dtype=torch.float16)


SHAPES = {
    "nq>nk": dict(nq=70, nk=23),
    "nq<nk": dict(nq=13, nk=77),
    "decode": dict(nq=1, nk=50),
    "nk=1": dict(nq=20, nk=1),
    "gqa": dict(hq=4, hkv=2, nq=40, nk=40),
    "mqa": dict(hq=4, hkv=1, nq=40, nk=40),
    "dv!=d": dict(d=64, dv=24),
    "d16-dv64": dict(d=16, dv=64),
    "ragged": dict(b=2, nq=17, nk=31, d=24, dv=40),
    "batch": dict(b=3, hq=2, hkv=1, nq=19, nk=19),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_shapes(shape, causal):
    blocks = [af.rope(), af.causal()] if causal else [af.rope()]
    check_grads(af.attention(*blocks), seed=len(shape), **SHAPES[shape])


@pytest.mark.parametrize("dtype_name", list(HALF))
@pytest.mark.parametrize("shape", ["nq>nk", "mqa", "ragged"])
def test_shapes_half(shape, dtype_name):
    check_grads(af.attention(af.rope(), af.causal()), dtype=HALF[dtype_name], **SHAPES[shape])


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_strided_inputs(dtype_name):
    check_grads(af.attention(af.rope(), af.causal()), b=2, hq=4, hkv=2, nq=30, nk=30,
                dtype=DTYPES[dtype_name], strided=True, placement="pre_rotated")


@pytest.mark.parametrize(
    "config",
    [
        af.TileConfig(16, 16, 4, 1),
        af.TileConfig(32, 32, 4, 1, 16, 32, 4, 1),
        af.TileConfig(16, 64, 4, 1, 64, 16, 4, 1),
        af.TileConfig(64, 32, 4, 1, 32, 64, 4, 2),
    ],
    ids=lambda c: f"m{c.block_m}n{c.block_n}-bwd-m{c.backward()[0]}n{c.backward()[1]}",
)
def test_tile_configs(config):
    spec = af.attention(af.rope(), af.causal(), af.sliding_window(30))
    check_grads(spec, hq=2, nq=75, nk=61, d=32, config=config, seed=19)


# --------------------------------------------------------------------------------------------
# Rows with no kept key: finite, exactly-zero gradients
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize(
    "blocks, nq, nk",
    [
        (lambda: [af.causal()], 50, 20),
        (lambda: [af.causal(), af.rope()], 64, 16),
        (lambda: [af.causal(), af.sliding_window(3)], 40, 10),
    ],
    ids=["causal-50x20", "rope-causal-64x16", "causal-window-40x10"],
)
def test_rows_without_keys(blocks, nq, nk, dtype_name):
    grads, _ = check_grads(af.attention(*blocks()), hq=4, hkv=2, nq=nq, nk=nk, d=16,
                           dtype=DTYPES[dtype_name], lse_grad=DTYPES[dtype_name] == torch.float32)
    # The first Nq - Nk rows see no key (bottom-right aligned causal).
    assert (grads["q"][:, :, : nq - nk] == 0).all()


# --------------------------------------------------------------------------------------------
# The log-sum-exp's gradient
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize(
    "blocks",
    [
        lambda: [],
        lambda: [af.rope(), af.causal()],
        lambda: [af.alibi(), af.sliding_window(7), af.causal()],
        lambda: [af.additive_bias()],
    ],
    ids=["plain", "rope+causal", "alibi+window+causal", "bias"],
)
def test_lse_gradient(blocks, dtype_name):
    spec = af.attention(*blocks(), af.softmax())
    dtype = DTYPES[dtype_name]
    bias = None
    if spec.block(AdditiveBias) is not None:
        bias = randn(2, 31, 43, dtype=dtype, seed=1).requires_grad_()
    check_grads(spec, hq=2, nq=31, nk=43, d=32, dtype=dtype, bias=bias, lse_grad=True)


def test_lse_only_gradient():
    """Only the lse is used: the output's gradient is None (zeros), the lse's flows."""
    spec = af.attention(af.rope(), af.causal())
    q, k, v = make_qkv(1, 2, 1, 30, 40, 32, seed=2, requires_grad=True)
    _, lse = spec(q, k, v, return_lse=True)
    glse = randn(*lse.shape, seed=3)
    lse.backward(glse)
    go = torch.zeros(1, 2, 30, 32)
    assert_gradients_match(spec, q, k, v, go, glse=glse, label="lse only")
    # v does not move the lse.
    assert (v.grad == 0).all()


def test_lse_gradient_matters():
    """The lse's gradient changes dq and dk: the kernels must not drop it."""
    spec = af.attention(af.causal())
    grads_lse, ref_lse = check_grads(spec, nq=20, nk=20, d=16, lse_grad=True, seed=5)
    grads, ref = check_grads(spec, nq=20, nk=20, d=16, seed=5)
    assert (ref_lse["q"] - ref["q"]).abs().max() > 1e-2
    assert (grads_lse["q"] - grads["q"]).abs().max() > 1e-2
    torch.testing.assert_close(grads_lse["v"], grads["v"], atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------
# Sensitivity: the tolerance would catch the usual backward mistakes
# --------------------------------------------------------------------------------------------


def test_tolerance_catches_missing_scale_and_rope_transpose():
    """The comparison is sharp enough: gradients computed without the 1/sqrt(D) scale on dq,
    or with R instead of R^T on dq, are far outside FP32_GRAD_REL (and HALF_GRAD_REL)."""
    from attnfuse.runtime.reference import rotate

    spec = af.attention(af.rope(), af.causal())
    grads, ref = check_grads(spec, nq=30, nk=30, d=32, seed=3)
    scale = 1 / math.sqrt(32)
    unscaled = ref["q"] / scale
    assert relative_error(unscaled, ref["q"], ref["q"].abs().max().item()) > 100 * HALF_GRAD_REL
    # dq rotated forward instead of back: R(pos) R(pos) dq~ instead of dq = R(pos)^T dq~.
    rope = spec.block(Rope)
    pos = torch.arange(30)
    dq_tilde = rotate(ref["q"], pos, rope)  # R dq = dq~ (the gradient w.r.t. the rotated q)
    wrong = rotate(dq_tilde, pos, rope)
    assert relative_error(wrong, ref["q"], ref["q"].abs().max().item()) > 10 * HALF_GRAD_REL
    assert relative_error(grads["q"], ref["q"], ref["q"].abs().max().item()) < FP32_GRAD_REL / 10


# --------------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "blocks, dtype",
    [
        (lambda: [af.rope(), af.causal()], torch.float32),
        (lambda: [af.additive_bias(), af.alibi(), af.sliding_window(9)], torch.float16),
        (lambda: [af.block_sparse(16), af.rope(interleaved=True)], torch.bfloat16),
    ],
    ids=["rope+causal-fp32", "bias+alibi+window-fp16", "sparse+rope-bf16"],
)
def test_backward_is_deterministic(blocks, dtype):
    spec = af.attention(*blocks())
    fn = af.compile(spec, rope_placement="pre_rotated")
    bias = randn(1, 4, 37, 45, dtype=dtype, seed=2) if spec.block(AdditiveBias) is not None else None
    layout = randn(4, 3, 3, seed=5) > 0 if spec.block(BlockSparse) is not None else None
    runs = []
    for _ in range(2):
        q, k, v = make_qkv(2, 4, 2, 37, 45, 32, dtype=dtype, seed=1, requires_grad=True)
        kwargs = {}
        if bias is not None:
            kwargs["bias"] = bias.detach().clone().requires_grad_()
        if layout is not None:
            kwargs["block_layout"] = layout
        out, lse = fn(q, k, v, return_lse=True, **kwargs)
        torch.autograd.backward([out, lse], [randn(*out.shape, dtype=dtype, seed=3), randn(*lse.shape, seed=4)])
        runs.append([q.grad, k.grad, v.grad] + ([kwargs["bias"].grad] if bias is not None else []))
    for a, b in zip(*runs):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b), "two backward runs differ"


# --------------------------------------------------------------------------------------------
# Random legal compositions
# --------------------------------------------------------------------------------------------

BACKWARD_TILES = [None, (16, 16), (16, 32), (32, 16), (64, 32)]


@pytest.mark.interpreter
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    # No shrinking: an interpreter run is ~1 s, and shrinking takes minutes; the failing
    # example is printed as drawn.
    phases=[Phase.explicit, Phase.generate],
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=legal_cases(), bwd=st.sampled_from(BACKWARD_TILES), lse_grad=st.booleans())
def test_random_compositions_gradients(case, bwd, lse_grad):
    spec = af.attention(*case["blocks"])
    dtype, shape = case["dtype"], case["shape"]
    config = case["config"]
    if config is None and bwd is not None:
        config = (32, 32)
    tile = None
    if config is not None:
        tile = af.TileConfig(config[0], config[1], 4, 1, *(bwd or (None, None)))
    fn = af.compile(spec, rope_placement=case["placement"], config=tile)
    call = {}
    if spec.block(BlockSparse) is not None:
        call["block_layout"] = case["layout"]
    bias = None
    if spec.block(AdditiveBias) is not None:
        # The drawn bias keeps its dtype and strides; whether it is learned comes from the seed.
        bias = case["bias"].detach().clone()
        if random.Random(case["seed"]).random() < 0.75:
            bias.requires_grad_()
    check_grads(
        spec, fn=fn, dtype=dtype, seed=case["seed"], bias=bias,
        lse_grad=lse_grad and spec.block(Relu) is None, placement=case["placement"],
        **shape, **call,
    )
