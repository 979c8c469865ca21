"""Gradients through the backward kernels, against autograd through the float64 reference.

Every case runs the generated forward and backward Triton kernels (on the CPU under Triton's
interpreter), then compares dq, dk, dv (and dbias, and the lse's contribution) with
`reference_gradients`. The max abs error must be within

    rel * max|ref|  +  4 * (error of an emulation of the roundings the dtype forces)
                    +  16 fp32 ulps of the gradient's magnitude (sum of |terms|)

rel = 2e-4 in fp32, 2e-2 in fp16/bf16 (see `gradient_errors`). The first term is the
acceptance bound; the others matter only where the true gradient cancels to far below its
terms (a peaked softmax, a bias constant along keys, a single key), where no implementation
can be relative-to-max accurate. `test_tolerance_catches_usual_mistakes` checks the bound is
sharp enough to see a missing softmax scale, R instead of R^T, a missing GQA sum or a dropped
lse gradient, in every dtype.

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

from conftest import INTERPRETER, make_qkv
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_properties_all_blocks import legal_cases

import attnfuse as af
from attnfuse.blocks.additive_bias import AdditiveBias
from attnfuse.blocks.block_sparse import BlockSparse
from attnfuse.blocks.relu import Relu
from attnfuse.dsl.blocks import Rope, ScaledDotProduct
from attnfuse.runtime.reference import keep_mask, reference_gradients, rotate

pytestmark = [
    pytest.mark.interpreter,
    # An overflow inside a kernel (even on padded rows that are never stored) is a bug: the
    # interpreter reports it as a RuntimeWarning, which fails the test here.
    pytest.mark.filterwarnings("error::RuntimeWarning"),
]

FP32_GRAD_REL = 2e-4
HALF_GRAD_REL = 2e-2
# The kernels may be this many times further from the reference than the emulation of the
# roundings every implementation makes, plus this many fp32 ulps of each gradient's magnitude
# for their fp32 arithmetic (see `emulated_gradients`). Measured over a few hundred random
# compositions: the kernels' error is at most ~1x the emulated one in fp16/bf16 and at most ~2
# ulps of the magnitude in fp32.
EMULATION_FACTOR = 4.0
FP32_ULPS = 16.0
REL_TOLERANCE = {torch.float32: FP32_GRAD_REL, torch.float16: HALF_GRAD_REL, torch.bfloat16: HALF_GRAD_REL}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(dtype)


def positions(spec, n_q: int, n_k: int, call: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE positions of queries and keys, as the reference takes them."""
    q_at, k_at = call.get("q_positions"), call.get("k_positions")
    q_at = torch.arange(n_q) + (n_k - n_q) if q_at is None else q_at.cpu()
    k_at = torch.arange(n_k) if k_at is None else k_at.cpu()
    return q_at, k_at


def round_like_kernels(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` rounded to `dtype` as the kernels' casts round. Triton's interpreter casts fp32 to
    bf16 by truncation (round toward zero: `_convert_float` without a rounding mode), not to
    nearest as the GPU does; a truncated O is biased, which breaks the cancellation in
    dS = P (dP - delta) further than a rounded one would."""
    if dtype == torch.bfloat16 and INTERPRETER:
        bits = t.to(torch.float32).contiguous().view(torch.int32) & ~0xFFFF
        return bits.view(torch.float32).to(torch.bfloat16)
    return t.to(dtype)


def emulated_gradients(spec, q, k, v, go, *, bias=None, glse=None, call=None):
    """The gradients computed in fp64 by the textbook fused backward *with the roundings any
    implementation must make*, and no others: q~ and k~ rounded to the input dtype as
    operands of the score product (so P is that of slightly moved scores), scores rounded to
    fp32, the output O rounded to the input dtype (delta = rowsum(dO * O) reads it), P and dS
    rounded to it as operands of the dV, dQ and dK products, and the gradients themselves
    (accumulation is exact here). Casts round as the kernels' do (`round_like_kernels`).
    The distance to the exact gradients is the precision the dtype allows: when the softmax
    is peaked, dS cancels to almost nothing (a bias of magnitude 20 makes dq 1e-5 of its
    terms) and a tolerance relative to max|dq| alone means nothing, even in fp32.

    What this leaves out is the kernels' fp32 arithmetic (exp, accumulation order: dP and
    delta summed in different orders do not cancel exactly even when P is one-hot). Its error
    is a few fp32 ulps of each gradient's *magnitude* M, the same sums over absolute values
    (with |dS| <= P (|dO| |v|^T + |dO| . |O| + |dlse|)): returned as {name: M}.

    Also returns, for relu, the allowance for its jump at 0: a score within rounding of 0
    may be kept by the kernels and dropped by the reference (or the reverse), which moves the
    gradients by that pair's whole term (None for softmax).

    Returns (emulated gradients, magnitudes, flips).
    """
    call = call or {}
    dtype = q.dtype
    qd, kd, vd, god = (t.detach().double() for t in (q, k, v, go))
    b, hq, n_q, d = qd.shape
    hkv, n_k = kd.shape[1], kd.shape[2]
    group = hq // hkv

    def rnd(t: torch.Tensor, dt: torch.dtype = dtype) -> torch.Tensor:
        return round_like_kernels(t, dt).double()

    def group_sum(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(b, hkv, group, *t.shape[2:]).sum(2)

    rope = spec.block(Rope)
    q_at, k_at = positions(spec, n_q, n_k, call)
    if isinstance(rope, Rope):
        qr, kr = rotate(qd, q_at, rope), rotate(kd, k_at, rope)
    else:
        qr, kr = qd, kd
    krx, vx = kr.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    sdp = spec.block(ScaledDotProduct)
    scale = sdp.scale if isinstance(sdp, ScaledDotProduct) and sdp.scale is not None else 1 / math.sqrt(d)
    # The scores the kernels see are products of q~ and k~ rounded to the input dtype: the
    # reference's scores plus `rounding`. P (and for relu the scores) come from the reference
    # with that added to the bias, for v = identity (for relu, with a large constant added
    # too, so that every score is positive, subtracted again).
    rounding = scale * (rnd(qr) @ rnd(krx).transpose(-1, -2) - qr @ krx.transpose(-1, -2))
    with_bias = af.attention(*[x for x in spec.blocks if not isinstance(x, AdditiveBias)], af.additive_bias())
    relu = spec.block(Relu) is not None
    shift = 1e6 if relu else 0.0
    total = rounding + shift + (0.0 if bias is None else bias.detach().double())
    eye = torch.eye(n_k, dtype=torch.float64).expand(b, hkv, n_k, n_k)
    dp = god @ vx.transpose(-1, -2)
    flips = None
    if relu:
        probs = af.reference_attention(with_bias, qd, kd, eye, bias=total, **call)
        scores = probs * n_k - shift
        probs = torch.relu(scores) / n_k
        keep = keep_mask(spec, n_q, n_k, call.get("block_layout")).to(torch.float64)
        ds = keep * (scores > 0).to(torch.float64) * dp / n_k
        eps = torch.finfo(dtype).eps + 64 * torch.finfo(torch.float32).eps
        slack = 8 * eps * (scale * qr.abs() @ krx.abs().transpose(-1, -2) + scores.abs())
        near_zero = keep * (scores.abs() <= slack).to(torch.float64) * dp.abs() / n_k
        pair = 2.0 if isinstance(rope, Rope) else 1.0
        flips = {
            "q": pair * (scale * near_zero @ krx.abs()).amax(-1, keepdim=True),
            "k": pair * group_sum(scale * near_zero.transpose(-1, -2) @ qr.abs()).amax(-1, keepdim=True),
        }
        if bias is not None:
            flips["bias"] = near_zero.sum_to_size(bias.shape)
        terms = keep * dp.abs() / n_k
    else:
        probs, lse = af.reference_attention(
            with_bias, qd, kd, eye, bias=total, return_lse=True, differentiable=True, **call
        )
        # The kernels compute scores (and exp) in fp32: a relative error of an fp32 ulp of
        # the score's magnitude on each p_ij, renormalized.
        kept = probs > 0
        scores = torch.where(kept, probs.log() + lse[..., None], torch.zeros((), dtype=torch.float64))
        moved = torch.where(kept, probs * torch.exp(rnd(scores, torch.float32) - scores), probs)
        total_mass = moved.sum(-1, keepdim=True)
        probs = torch.where(total_mass > 0, moved / total_mass.clamp_min(1e-300), moved)
        out = rnd(rnd(probs) @ vx)
        delta = (god * out).sum(-1)
        if glse is not None:
            delta = delta - glse.double()
        ds = probs * (dp - delta[..., None])
        dp_abs = god.abs() @ vx.abs().transpose(-1, -2)
        delta_abs = (god.abs() * out.abs()).sum(-1) + (0.0 if glse is None else glse.double().abs())
        terms = probs * (dp_abs + delta_abs[..., None])
    # The magnitudes: the same sums over absolute values (|dS| <= terms).
    pair = 2.0 if isinstance(rope, Rope) else 1.0  # R^T mixes coordinate pairs
    magnitudes = {
        "q": pair * scale * terms @ krx.abs(),
        "k": pair * group_sum(scale * terms.transpose(-1, -2) @ qr.abs()),
        "v": group_sum(probs.transpose(-1, -2) @ god.abs()),
    }
    if bias is not None:
        magnitudes["bias"] = terms.sum_to_size(bias.shape)
    magnitudes = {n: (t.max().item() if t.numel() else 0.0) for n, t in magnitudes.items()}
    grads = {
        "q": scale * rnd(ds) @ rnd(krx),
        "k": group_sum(scale * rnd(ds).transpose(-1, -2) @ rnd(qr)),
        "v": group_sum(rnd(probs).transpose(-1, -2) @ god),
    }
    if isinstance(rope, Rope):
        # dq = R^T dq~ = R(-pos) dq~.
        grads["q"] = rotate(grads["q"], -q_at, rope)
        grads["k"] = rotate(grads["k"], -k_at, rope)
    grads = {n: rnd(g) for n, g in grads.items()}  # stored in the input dtype
    if bias is not None:
        # The kernels write dS in fp32; torch casts it to the bias's dtype (rounding to
        # nearest) and autograd sums it onto the bias's broadcast shape in that dtype.
        grads["bias"] = ds.to(torch.float32).to(bias.dtype).sum_to_size(bias.shape).double()
    return grads, magnitudes, flips


def grad_tolerance(*dtypes: torch.dtype) -> float:
    """Relative-to-max tolerance: the loosest of the dtypes involved."""
    return max(REL_TOLERANCE[dt] for dt in dtypes)


def gradient_errors(
    spec, q, k, v, go, grads: dict[str, torch.Tensor], *, bias=None, glse=None, call=None, ref=None
) -> dict[str, tuple[float, float, str]]:
    """{name: (error, tolerance, detail)} for each gradient in `grads`. The error is the max
    abs error against the fp64 reference; the tolerance is

        rel * max|ref| + EMULATION_FACTOR * max|emulated - ref| + FP32_ULPS * eps32 * M

    rel 2e-4 in fp32 and 2e-2 in fp16/bf16 (the loosest of q's and the bias's dtypes for
    dbias); `emulated` and the magnitude M from `emulated_gradients` (the error the dtype
    forces on any implementation, and a few fp32 ulps of the terms). For relu, the error is
    first lowered by the allowance for scores within rounding of 0."""
    call = call or {}
    if ref is None:
        ref = reference_gradients(spec, q, k, v, go, bias=bias, grad_lse=glse, **call)
    emulated, magnitudes, flips = emulated_gradients(spec, q, k, v, go, bias=bias, glse=glse, call=call)
    report = {}
    for name, g in grads.items():
        r = ref[name]
        if g.numel() == 0:
            report[name] = (0.0, 0.0, "empty")
            continue
        dtypes = (q.dtype, bias.dtype) if name == "bias" else (q.dtype,)
        ref_max = r.abs().max().item()
        inherent = (emulated[name] - r).abs().max().item()
        fp32_arithmetic = FP32_ULPS * torch.finfo(torch.float32).eps * magnitudes[name]
        tol = grad_tolerance(*dtypes) * ref_max + EMULATION_FACTOR * inherent + fp32_arithmetic
        err = (g.detach().double() - r).abs()
        if flips is not None and flips.get(name) is not None:
            err = (err - flips[name]).clamp_min(0)
        report[name] = (
            err.max().item(),
            tol,
            f"max |ref| {ref_max:.3e}, emulated error {inherent:.3e}, magnitude {magnitudes[name]:.3e}",
        )
    return report


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
    """Checks the .grad of q, k, v and bias: present exactly when the tensor requires grad,
    of its dtype and shape, finite, and within `gradient_errors`' tolerance of the reference.
    Returns the reference gradients."""
    call = call or {}
    ref = reference_gradients(spec, q, k, v, go, bias=bias, grad_lse=glse, **call)
    tensors = {"q": q, "k": k, "v": v}
    if bias is not None:
        tensors["bias"] = bias
    grads = {}
    for name, t in tensors.items():
        if not t.requires_grad:
            assert t.grad is None, f"{label}: {name} does not require grad but got one"
            continue
        g = t.grad
        assert g is not None, f"{label}: no gradient for {name}"
        assert g.dtype == t.dtype, f"{label}: d{name} dtype {g.dtype} != {t.dtype}"
        assert tuple(g.shape) == tuple(t.shape), f"{label}: d{name} shape {tuple(g.shape)} != {tuple(t.shape)}"
        assert not torch.isnan(g).any(), f"{label}: d{name} has {int(torch.isnan(g).sum())} NaN values"
        assert torch.isfinite(g).all(), f"{label}: d{name} has non-finite values"
        grads[name] = g
    report = gradient_errors(spec, q, k, v, go, grads, bias=bias, glse=glse, call=call, ref=ref)
    for name, (err, tol, detail) in report.items():
        assert err <= tol, (
            f"{label}: d{name} max abs error {err:.3e} > tolerance {tol:.3e} ({detail}); "
            f"all: {', '.join(f'{n} {e:.1e}/{t:.1e}' for n, (e, t, _) in report.items())}"
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
    "none": list,
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
# Each block in fp32 and in one 16-bit dtype (alternating).
SINGLE_CASES = [(name, "fp32") for name in SINGLE_BLOCKS] + [
    (name, "fp16" if i % 2 == 0 else "bf16") for i, name in enumerate(SINGLE_BLOCKS)
]


@pytest.mark.parametrize("name, dtype_name", SINGLE_CASES)
def test_single_block(name, dtype_name):
    check_grads(af.attention(*SINGLE_BLOCKS[name]()), nq=29, nk=35, dtype=DTYPES[dtype_name], seed=len(name))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_single_block_additive_bias(dtype_name):
    dtype = DTYPES[dtype_name]
    bias = randn(1, 2, 29, 35, dtype=dtype, seed=3, scale=2.0).requires_grad_()
    check_grads(af.attention(af.additive_bias()), nq=29, nk=35, dtype=dtype, bias=bias)


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
PLACEMENTS = ["fused", "pre_rotated", "q_fused", "auto"]
# Every style under every placement would be 24 runs: each style under one placement (in
# turn), and the partial interleaved one under all four.
ROPE_CASES = sorted(
    {(rope, PLACEMENTS[i % 4]) for i, rope in enumerate(ROPES)}
    | {("partial-interleaved", placement) for placement in PLACEMENTS}
)


@pytest.mark.parametrize("rope, placement", ROPE_CASES)
def test_rope_causal(rope, placement):
    spec = af.attention(ROPES[rope](), af.causal())
    check_grads(spec, hq=4, hkv=2, nq=27, nk=40, d=32, placement=placement, seed=7)


@pytest.mark.parametrize(
    "placement, dtype_name", [("fused", "fp16"), ("pre_rotated", "bf16"), ("q_fused", "fp16")]
)
def test_rope_half(placement, dtype_name):
    spec = af.attention(af.rope(rotary_dim=24, interleaved=True), af.causal())
    check_grads(spec, hq=2, hkv=1, nq=40, nk=40, d=32, dv=16, dtype=HALF[dtype_name], placement=placement)


@pytest.mark.parametrize(
    "per_batch, placement",
    [(False, "fused"), (True, "pre_rotated"), (True, "q_fused")],
    ids=["positions-N-fused", "positions-BN-pre_rotated", "positions-BN-q_fused"],
)
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


@pytest.mark.parametrize(
    "blocks, dtype_name, forward_rotations, backward_rotations",
    [
        # Softmax: the backward reads pre-rotated copies; the training forward makes them once.
        (lambda: [af.rope(), af.causal()], "fp32", {"rotate_query", "rotate_key"}, set()),
        (lambda: [af.rope(rotary_dim=16, interleaved=True)], "bf16", {"rotate_query", "rotate_key"}, set()),
        # ReLU in fp16 rotates the unrounded q and k in its backward kernels (exact scores):
        # nothing is saved rotated, and the forward keeps the Rotation Calculus' choice.
        (lambda: [af.relu(), af.rope(), af.causal()], "fp16", set(), set()),
    ],
    ids=["softmax-fp32", "softmax-partial-bf16", "relu-exact-scores-fp16"],
)
def test_training_rotates_once(launched, blocks, dtype_name, forward_rotations, backward_rotations):
    """A call autograd records rotates q and k in the forward where its backward reads the
    rotated copies, saves the copies instead of q and k, and its backward launches no
    rotation kernel; the gradients are still those of the unrotated q and k."""
    spec = af.attention(*blocks())
    fn = af.compile(spec)
    dtype = DTYPES[dtype_name]
    q, k, v = make_qkv(1, 4, 2, 40, 40, 32, None, dtype, seed=11, requires_grad=True)
    out = fn(q, k, v)
    forward = set(launched)
    launched.clear()
    go = randn(*out.shape, dtype=dtype, seed=12)
    out.backward(go)
    rotations = {"rotate_query", "rotate_key"}
    assert forward & rotations == forward_rotations
    assert set(launched) & rotations == backward_rotations
    assert "attention_bwd_dkdv" in launched
    assert_gradients_match(spec, q, k, v, go, bias=None, glse=None, call={}, label=f"{spec!r} {dtype}")
    # Without autograd the forward keeps the Rotation Calculus' placement: a fused query
    # rotation at this length, so no query pre-rotation kernel.
    launched.clear()
    with torch.no_grad():
        fn(q, k, v)
    assert "rotate_query" not in launched


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning")
def test_second_derivative_raises_instead_of_dropping_terms():
    """With create_graph=True the first-order gradients are the usual ones, and a second
    derivative through them raises: the backward kernels are not differentiable, and a
    gradient silently treated as a constant would drop terms of a gradient penalty."""
    spec = af.attention(af.rope(), af.causal())
    fn = af.compile(spec)
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16, None, torch.float32, seed=5, requires_grad=True)
    go = randn(1, 2, 24, 16, seed=6)
    first = torch.autograd.grad(fn(q, k, v), (q, k, v), go)
    with_graph = torch.autograd.grad(fn(q, k, v), (q, k, v), go, create_graph=True)
    for plain, graphed in zip(first, with_graph):
        torch.testing.assert_close(graphed, plain, rtol=0, atol=0)
        assert not plain.requires_grad and graphed.requires_grad
    # Each gradient raises when differentiated, whatever it is differentiated against.
    for grad, against in ((with_graph[2], q), (with_graph[1], v), (with_graph[0], k)):
        with pytest.raises(af.AttnFuseError, match="second derivatives"):
            torch.autograd.grad(grad.sum(), (against,), retain_graph=True)
    # In-place changes of the gradients (scaling, clipping) stay allowed, in a hook too.
    scaled = torch.autograd.grad(fn(q, k, v), (q,), go, create_graph=True)[0].mul_(2)
    torch.testing.assert_close(scaled, 2 * first[0], rtol=0, atol=0)
    handle = q.register_hook(lambda g: g.mul_(0.5))
    fn(q, k, v).backward(go, create_graph=True)
    handle.remove()
    torch.testing.assert_close(q.grad, 0.5 * first[0], rtol=0, atol=0)
    q.grad = None  # (under create_graph the gradient holds a graph back to q: a cycle)
    # A penalty mixing the gradient with a term that is differentiable: the gradient's part
    # must not vanish from its derivative without a word.
    penalty = with_graph[0].square().sum() + v.square().sum()
    with pytest.raises(af.AttnFuseError, match="second derivatives of attention are not implemented"):
        penalty.backward()
    # Asked for the derivative with respect to k alone, through dQ: raises too.
    with_graph = torch.autograd.grad(fn(q, k, v), (q,), go, create_graph=True)
    with pytest.raises(af.AttnFuseError, match="second derivatives"):
        torch.autograd.grad(with_graph[0].sum() + k.sum(), (k,))


def test_program_for_names_what_a_training_call_runs():
    """`program_for` and `tile_ir` follow the call: with tensors that require grad, the
    program whose forward pre-rotates (what a recorded call runs); under no_grad, the
    Rotation Calculus' placement."""
    spec = af.attention(af.rope(), af.causal())
    fn = af.compile(spec)
    q, k, v = make_qkv(1, 4, 2, 40, 40, 32, None, torch.float32, seed=41, requires_grad=True)
    fn(q, k, v).sum().backward()
    assert fn.program_for(q, k, v).pipeline == fn.last.pipeline
    assert "place-rope{query=pre_rotated key=pre_rotated}" in fn.last.pipeline
    assert "tile.kernel @attention_fwd(%q_rot: " in fn.tile_ir(q, k, v)
    with torch.no_grad():
        assert "query=pre_rotated" not in fn.program_for(q, k, v).pipeline
        assert "tile.kernel @attention_fwd(%q: " in fn.tile_ir(q, k, v)


@pytest.mark.parametrize(
    "needs, expected",
    [
        ("out", ["attention_bwd_dq_delta", "attention_bwd_dkdv"]),
        ("lse", ["attention_bwd_preprocess", "attention_bwd_dkdv", "attention_bwd_dq"]),
        ("bias", ["attention_bwd_preprocess", "attention_bwd_dkdv", "attention_bwd_dq_bias"]),
    ],
)
def test_backward_launches(launched, needs, expected):
    """A plain backward forms delta inside its dQ kernel, launched before dK/dV, and runs no
    preprocess; an lse gradient (which shifts delta) or a bias gradient takes the
    preprocess, dK/dV and a dQ kernel. The gradients are right on every path."""
    spec = af.attention(af.causal(), af.additive_bias())
    q, k, v = make_qkv(1, 4, 2, 37, 45, 32, None, torch.float32, seed=31, requires_grad=True)
    bias = randn(1, 4, 37, 45, seed=32).requires_grad_(needs == "bias")
    out, lse = af.compile(spec)(q, k, v, bias=bias, return_lse=True)
    go = randn(*out.shape, seed=33)
    glse = randn(*lse.shape, seed=34) if needs == "lse" else None
    launched.clear()
    torch.autograd.backward([out, lse] if glse is not None else [out], [go, glse] if glse is not None else [go])
    assert launched == expected
    assert_gradients_match(spec, q, k, v, go, bias=bias, glse=glse, call={}, label=needs)


@pytest.fixture
def offset_decisions(monkeypatch) -> list[bool]:
    """Each `SHARED_OFFSETS` value the runtime works out for a kernel that has one, in order."""
    from attnfuse.runtime.launch import KernelLaunch

    decisions: list[bool] = []
    original = KernelLaunch.shares_offsets

    def recording(self, tensors):
        shared = original(self, tensors)
        if self.info.shared_offsets is not None:
            decisions.append(shared)
        return shared

    monkeypatch.setattr(KernelLaunch, "shares_offsets", recording)
    return decisions


def test_model_layout_shares_offsets(offset_decisions):
    """q, k, v as a model makes them (`[B, N, H, D]` projections viewed as `[B, H, N, D]`):
    the rotated copies keep that memory order, and the gradient the model's head merge
    (`out.transpose(1, 2).reshape(B, N, H * D)`) sends back has the rotated q's strides, so
    the dK/dV kernel shares their offsets. The output is in q's memory order, so the head
    merge is a view; dq, dk and dv come back in their operands' orders (views for the
    projections' backward)."""
    b, n, hq, hkv, d = 2, 37, 4, 2, 32
    gen = torch.Generator().manual_seed(51)
    q = torch.randn(b, n, hq, d, generator=gen).to(torch.float16).transpose(1, 2).requires_grad_()
    k = torch.randn(b, n, hkv, d, generator=gen).to(torch.float16).transpose(1, 2).requires_grad_()
    v = torch.randn(b, n, hkv, d, generator=gen).to(torch.float16).transpose(1, 2).requires_grad_()
    grad_strides = {}
    for name, t in (("q", q), ("k", k), ("v", v)):
        t.register_hook(lambda g, name=name: grad_strides.__setitem__(name, g.stride()))
    spec = af.attention(af.rope(), af.causal())
    out = af.compile(spec)(q, k, v)
    assert out.stride() == q.stride() and not out.is_contiguous()
    merged = out.transpose(1, 2).view(b, n, hq * d)  # a view: no copy
    go = randn(b, n, hq * d, dtype=torch.float16, seed=52)
    merged.backward(go)
    assert offset_decisions == [True]
    assert grad_strides == {"q": q.stride(), "k": k.stride(), "v": v.stride()}
    grad_out = go.view(b, n, hq, d).transpose(1, 2)
    assert_gradients_match(spec, q, k, v, grad_out, bias=None, glse=None, call={}, label="bnhd")


@pytest.mark.parametrize("grad_layout", ["contiguous", "bnhd"])
def test_grad_out_layouts(offset_decisions, grad_layout):
    """The dK/dV kernel reads dO through q's offsets exactly when their row and column
    strides match (`SHARED_OFFSETS`), and through its own otherwise; gradients are right
    either way."""
    spec = af.attention(af.rope(), af.causal())
    q, k, v = make_qkv(1, 4, 2, 37, 45, 32, None, torch.float16, seed=21, requires_grad=True)
    out = af.compile(spec)(q, k, v)
    go = randn(1, 4, 37, 32, dtype=torch.float16, seed=22)
    if grad_layout == "bnhd":
        # The layout a model's `out.transpose(1, 2).reshape(B, N, H * D)` sends back.
        go = go.transpose(1, 2).contiguous().transpose(1, 2)
    out.backward(go)
    assert offset_decisions == [grad_layout == "contiguous"]
    assert_gradients_match(spec, q, k, v, go, bias=None, glse=None, call={}, label=grad_layout)


# --------------------------------------------------------------------------------------------
# alibi
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "slopes, extra",
    [(None, []), (None, ["causal"]), ([1.0, 0.5, -0.125, 0.0], []), ([1.0, 0.5, -0.125, 0.0], ["window"])],
    ids=["paper", "paper-causal", "explicit", "explicit-window"],
)
def test_alibi(slopes, extra):
    blocks = [af.alibi(slopes)] + [af.causal() if e == "causal" else af.sliding_window(12) for e in extra]
    check_grads(af.attention(*blocks), hq=4, hkv=2, nq=29, nk=51, d=16, seed=11)


def test_alibi_half_with_rope():
    spec = af.attention(af.alibi(), af.rope(), af.causal())
    check_grads(spec, hq=4, hkv=1, nq=33, nk=33, d=32, dtype=torch.bfloat16)


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
    ],
    ids=["fp32-q-fp16-bias", "fp16-q-fp32-bias", "bf16"],
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
    assert bias.grad is not None
    assert_gradients_match(spec, q, k, v, go, bias=bias, label="bias only")


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


@pytest.mark.parametrize(
    "layout_kind, dtype_name, lse_grad",
    [("shared", "fp32", True), ("per-head", "fp16", True), ("all-false", "fp32", True),
     ("all-false", "bf16", True), ("empty-row-block", "fp32", True), ("all-true", "fp16", True),
     # Without an lse gradient delta comes from the dQ kernel (attention_bwd_dq_delta), which
     # must store it for rows and blocks that no layout entry keeps too.
     ("all-false", "fp32", False), ("empty-row-block", "bf16", False), ("per-head", "fp32", False)],
)
def test_block_sparse_layouts(layout_kind, dtype_name, lse_grad):
    hq, nq, nk, bs = 4, 40, 45, 16
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
                           block_layout=layout, lse_grad=lse_grad)
    if layout_kind == "all-false":
        assert all((g == 0).all() for g in grads.values())
    if layout_kind == "empty-row-block":
        assert (grads["q"][:, :, 16:32] == 0).all()


@pytest.mark.parametrize(
    "extra", [["causal"], ["window"], ["causal", "window"]], ids=lambda e: "+".join(e)
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


@pytest.mark.parametrize("window, causal", [(1, True), (1, False), (5, True), (17, False)])
def test_sliding_windows(window, causal):
    blocks = [af.sliding_window(window)] + ([af.causal()] if causal else [])
    check_grads(af.attention(*blocks), nq=33, nk=47, d=16, seed=window)


@pytest.mark.parametrize(
    "blocks, dtype_name",
    [
        (lambda: [af.relu(), af.causal()], "fp32"),
        (lambda: [af.relu(), af.rope(), af.sliding_window(8)], "fp32"),
        (lambda: [af.relu(), af.alibi(), af.scaled_dot_product(0.5)], "fp32"),
        (lambda: [af.relu(), af.causal()], "fp16"),
        (lambda: [af.relu(), af.rope(interleaved=True)], "bf16"),
        # fp16 runs the GPU's code for exact scores in the interpreter (bf16 keeps fp32 there).
        (lambda: [af.relu(), af.rope(rotary_dim=16), af.causal()], "fp16"),
    ],
    ids=["relu+causal", "relu+rope+window", "relu+alibi+scale", "relu+causal-fp16", "relu+rope-bf16",
         "relu+rope-partial-causal-fp16"],
)
def test_relu(blocks, dtype_name):
    check_grads(af.attention(*blocks()), hq=4, hkv=2, nq=50, nk=31, d=32, dv=16, dtype=DTYPES[dtype_name], seed=4)


SHAPES = {
    "nq>nk": {"nq": 70, "nk": 23},
    "nq<nk": {"nq": 13, "nk": 77},
    "decode": {"nq": 1, "nk": 50},
    "nk=1": {"nq": 20, "nk": 1},
    "mqa": {"hq": 4, "hkv": 1, "nq": 40, "nk": 40},
    "dv!=d": {"d": 64, "dv": 24},
    "d16-dv64": {"d": 16, "dv": 64},
    "ragged": {"b": 2, "nq": 17, "nk": 31, "d": 24, "dv": 40},
    "batch": {"b": 3, "hq": 2, "hkv": 1, "nq": 19, "nk": 19},
}
# (GQA with Hq = 2 Hkv runs in most other tests.)
SHAPE_CASES = [(shape, "fp32", i % 2 == 0) for i, shape in enumerate(SHAPES)] + [
    ("nq>nk", "fp16", True), ("mqa", "bf16", True), ("ragged", "fp16", False),
]


@pytest.mark.parametrize("shape, dtype_name, causal", SHAPE_CASES)
def test_shapes(shape, dtype_name, causal):
    blocks = [af.rope(), af.causal()] if causal else [af.rope()]
    check_grads(af.attention(*blocks), dtype=DTYPES[dtype_name], seed=len(shape), **SHAPES[shape])


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
        af.TileConfig(64, 32, 4, 1, 32, 64, 4, 2, dkdv_block_m=16, dkdv_block_n=64),
        af.TileConfig(32, 16, 4, 1, 16, 16, 4, 1, dkdv_block_m=64, dkdv_block_n=32),
    ],
    ids=lambda c: "m{}n{}-dq-m{}n{}-dkdv-m{}n{}".format(c.block_m, c.block_n, *c.backward()[:2], *c.dkdv()[:2]),
)
def test_tile_configs(config):
    spec = af.attention(af.rope(), af.causal(), af.sliding_window(30))
    check_grads(spec, hq=2, hkv=1, nq=50, nk=41, d=16, config=config, seed=19)


# --------------------------------------------------------------------------------------------
# Rows with no kept key: finite, exactly-zero gradients
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "blocks, nq, nk, dtype_name",
    [
        (lambda: [af.causal()], 50, 20, "fp32"),
        (lambda: [af.causal(), af.rope()], 64, 16, "fp16"),
        (lambda: [af.causal(), af.sliding_window(3)], 40, 10, "bf16"),
    ],
    ids=["causal-50x20-fp32", "rope-causal-64x16-fp16", "causal-window-40x10-bf16"],
)
@pytest.mark.parametrize("lse_grad", [True, False], ids=["lse-grad", "dq-forms-delta"])
def test_rows_without_keys(blocks, nq, nk, dtype_name, lse_grad):
    grads, _ = check_grads(af.attention(*blocks()), hq=4, hkv=2, nq=nq, nk=nk, d=16,
                           dtype=DTYPES[dtype_name], lse_grad=lse_grad)
    # The first Nq - Nk rows see no key (bottom-right aligned causal).
    assert (grads["q"][:, :, : nq - nk] == 0).all()


# --------------------------------------------------------------------------------------------
# The log-sum-exp's gradient
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "blocks, dtype_name",
    [
        (list, "fp32"),
        (lambda: [af.rope(), af.causal()], "fp32"),
        (lambda: [af.rope(), af.causal()], "bf16"),
        (lambda: [af.alibi(), af.sliding_window(7), af.causal()], "fp16"),
        (lambda: [af.additive_bias()], "fp32"),
        (lambda: [af.additive_bias()], "fp16"),
    ],
    ids=["plain-fp32", "rope+causal-fp32", "rope+causal-bf16", "alibi+window+causal-fp16", "bias-fp32", "bias-fp16"],
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


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_tolerance_catches_usual_mistakes(dtype_name):
    """The comparison is sharp enough to see the usual backward mistakes, even at the 16-bit
    tolerance: dq without the softmax scale, dq rotated by R instead of R^T, dk without the
    sum over a GQA group, dq/dk without the lse's share of delta, dv off by a normalization
    factor. Each wrong gradient is built from the fp64 reference itself."""
    dtype = DTYPES[dtype_name]
    spec = af.attention(af.rope(), af.causal())
    q, k, v = make_qkv(1, 4, 2, 30, 30, 32, dtype=dtype, seed=3, requires_grad=True)
    out, lse = spec(q, k, v, return_lse=True)
    go, glse = randn(*out.shape, dtype=dtype, seed=4), randn(*lse.shape, seed=5)
    torch.autograd.backward([out, lse], [go, glse])
    ref = reference_gradients(spec, q, k, v, go, grad_lse=glse)
    ref_no_lse = reference_gradients(spec, q, k, v, go)
    grads = {"q": q.grad, "k": k.grad, "v": v.grad}
    report = gradient_errors(spec, q, k, v, go, grads, glse=glse, ref=ref)
    assert all(err <= tol for err, tol, _ in report.values()), report

    rope = spec.block(Rope)
    pos = torch.arange(30)
    dq_rotated = rotate(ref["q"], pos, rope)  # dq~ = R dq, the gradient w.r.t. the rotated q
    # One head of each GQA pair only: [B, Hkv, ...] from the first query head of each group.
    ref_k_full = reference_gradients(spec, q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), go,
                                     grad_lse=glse)["k"]
    wrong = {
        "no scale": ("q", ref["q"] * math.sqrt(32)),
        "R instead of R^T": ("q", rotate(dq_rotated, pos, rope)),
        "no GQA sum": ("k", ref_k_full[:, 0::2]),
        "lse gradient dropped (dq)": ("q", ref_no_lse["q"]),
        "lse gradient dropped (dk)": ("k", ref_no_lse["k"]),
        "dv off by a normalization factor": ("v", ref["v"] * 1.5),
    }
    for what, (name, g) in wrong.items():
        err, tol, detail = gradient_errors(spec, q, k, v, go, {name: g}, glse=glse, ref=ref)[name]
        assert err > 3 * tol, f"{what}: error {err:.3e} within 3x the tolerance {tol:.3e} ({detail})"


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_emulation_is_tight(dtype_name):
    """The emulation behind the tolerance stays within a few ulps (of the dtype) of the
    gradients' magnitudes, and of max|ref| on a well-conditioned case, so it cannot quietly
    widen the tolerance. On a peaked softmax its 16-bit error is above rel * max|ref|: the
    case where relative-to-max alone would reject correct kernels."""
    dtype = DTYPES[dtype_name]
    # Truncation (the interpreter's bf16 casts) is twice the rounding error.
    ulp = torch.finfo(dtype).eps * (2 if dtype == torch.bfloat16 and INTERPRETER else 1)
    q, k, v = make_qkv(1, 4, 2, 30, 40, 32, dtype=dtype, seed=6)
    go = randn(1, 4, 30, 32, dtype=dtype, seed=7)
    glse = randn(1, 4, 30, seed=8)
    # Peaked: a bias of 25 on one key per row puts ~all of each row's mass on it.
    one_key = torch.zeros(30, 40)
    one_key[torch.arange(30), (7 * torch.arange(30)) % 40] = 25.0
    cases = [
        (af.attention(af.rope(), af.causal(), af.additive_bias()), randn(40, seed=9), False),
        (af.attention(af.rope(), af.additive_bias()), one_key + randn(30, 40, seed=9), True),
    ]
    for spec, bias, peaked in cases:
        bias.requires_grad_()
        lse_grad = None if peaked else glse  # dlse would add P * dlse, which does not cancel
        ref = reference_gradients(spec, q, k, v, go, bias=bias, grad_lse=lse_grad)
        emulated, magnitudes, flips = emulated_gradients(spec, q, k, v, go, bias=bias, glse=lse_grad)
        assert flips is None
        for name in ("q", "k", "v", "bias"):
            scale = ref[name].abs().max().item()
            err = (emulated[name] - ref[name]).abs().max().item()
            assert err <= 8 * ulp * magnitudes[name], (name, peaked, err, magnitudes[name])
            if not peaked and name != "bias":
                assert err <= 8 * ulp * scale, (name, err, scale)
        if peaked and dtype != torch.float32:
            # dq and dk cancel to far below their terms: the error the dtype forces exceeds
            # rel * max|ref|.
            for name in ("q", "k"):
                err = (emulated[name] - ref[name]).abs().max()
                assert err > REL_TOLERANCE[dtype] * ref[name].abs().max(), (name, err)


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
    bias = randn(1, 4, 29, 37, dtype=dtype, seed=2) if spec.block(AdditiveBias) is not None else None
    layout = randn(4, 2, 3, seed=5) > 0 if spec.block(BlockSparse) is not None else None
    runs = []
    for _ in range(2):
        q, k, v = make_qkv(1, 4, 2, 29, 37, 32, dtype=dtype, seed=1, requires_grad=True)
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

# (bwd_block_m, bwd_block_n, dkdv_block_m, dkdv_block_n); None: the defaults.
BACKWARD_TILES = [None, (16, 16, None, None), (16, 32, None, None), (32, 16, 64, 16), (64, 32, 16, 32)]


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
    """Random legal compositions of all ten blocks (`legal_cases` of the forward property
    test: shapes, dtypes, strided biases, layouts, placements, tiles), with random backward
    and dK/dV tiles and an lse gradient half the time, against the reference."""
    spec = af.attention(*case["blocks"])
    dtype, shape = case["dtype"], case["shape"]
    config = case["config"]
    if config is None and bwd is not None:
        config = (32, 32)
    tile = None
    if config is not None:
        bwd_m, bwd_n, dkdv_m, dkdv_n = bwd or (None, None, None, None)
        tile = af.TileConfig(config[0], config[1], 4, 1, bwd_block_m=bwd_m, bwd_block_n=bwd_n,
                             dkdv_block_m=dkdv_m, dkdv_block_n=dkdv_n)
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
