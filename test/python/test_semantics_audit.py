"""A semantic audit of the public API against DESIGN.md and docs/semantics.md, through the
real kernels (Triton's interpreter on the CPU), forward and gradients.

The reference is `audit_reference.py`, written from the two documents alone (it shares no code
with `attnfuse.runtime.reference`). The cases aim at what the other suites cover least: block
compositions (GQA, Nq != Nk, partial and interleaved RoPE, call-time positions, documents with
padding, per-head layouts, broadcast biases and their gradients), rows with no kept key under
every normalizer, and the errors a caller gets for bad arguments.
"""

from __future__ import annotations

import math

import pytest
import torch
from audit_reference import audit_attention

import attnfuse as af
from attnfuse.errors import ArgumentError

pytestmark = [pytest.mark.interpreter]

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
"""fp32: max abs error of the output and relative L2 error of each gradient; 16-bit: relative
L2 error of both."""


def _inputs(b, hq, hkv, nq, nk, d, dv, dtype, strided, seed):
    gen = torch.Generator().manual_seed(seed)

    def rand(h, n, dim):
        if strided:  # a model's [B, N, H, D] projections, seen as [B, H, N, D]
            return torch.randn(b, n, h, dim, generator=gen).to(dtype).transpose(1, 2)
        return torch.randn(b, h, n, dim, generator=gen).to(dtype)

    return rand(hq, nq, d), rand(hkv, nk, d), rand(hkv, nk, dv)


def _relative(got, ref):
    got = got.detach().double()
    norm = ref.norm().item()
    return (got - ref).norm().item() / (norm if norm > 0 else 1.0)


def check(blocks, ref, *, b=1, hq=2, hkv=None, nq=24, nk=None, d=16, dv=None,
          dtype=torch.float32, strided=False, bias=None, lse=True, seed=0, compile_kw=None, **call):
    """Forward (and lse) and dq, dk, dv (and dbias) of `attention(*blocks)` against
    `audit_attention(**ref, **call)`."""
    hkv, nk, dv = hkv or hq, nq if nk is None else nk, dv or d
    q, k, v = _inputs(b, hq, hkv, nq, nk, d, dv, dtype, strided, seed)
    fn = af.compile(af.attention(*blocks), **(compile_kw or {}))
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if bias is not None:
        bias = bias.detach().clone().requires_grad_()
        call["bias"] = bias
    if lse:
        out, out_lse = fn(qs, ks, vs, return_lse=True, **call)
    else:
        out, out_lse = fn(qs, ks, vs, **call), None
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    out.backward(grad_out)

    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_call = dict(call)
    if bias is not None:
        ref_call["bias"] = br = bias.detach().double().requires_grad_()
    ref_out, ref_lse = audit_attention(qr, kr, vr, **ref, **ref_call)
    wrt = [qr, kr, vr] + ([br] if bias is not None else [])
    ref_grads = torch.autograd.grad((ref_out * grad_out.double()).sum(), wrt, allow_unused=True)

    tol = TOLERANCE[dtype]
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert torch.isfinite(out).all()
    if dtype == torch.float32:
        err = (out.detach().double() - ref_out).abs().max().item() if out.numel() else 0.0
    else:
        err = _relative(out, ref_out.detach())
    assert err <= tol, f"output error {err:.2e}"
    if out_lse is not None:
        assert out_lse.dtype == torch.float32
        assert torch.equal(torch.isneginf(out_lse), torch.isneginf(ref_lse)), "-inf rows differ"
        kept = torch.isfinite(ref_lse)
        if kept.any():
            assert (out_lse.double() - ref_lse)[kept].abs().max().item() <= 1e-3
    got = [qs.grad, ks.grad, vs.grad] + ([bias.grad] if bias is not None else [])
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), got, ref_grads):
        r = torch.zeros(g.shape, dtype=torch.float64) if r is None else r
        assert g.shape == r.shape and torch.isfinite(g).all(), name
        if name == "dbias":
            # A bias broadcast over whole rows has a softmax gradient of ~0 (rows sum to 0):
            # compared absolutely, against the scale of the scores' gradients.
            scale = max(r.norm().item(), 1.0)
            err = (g.double() - r).norm().item() / scale
            assert err <= tol * (10 if g.dtype != torch.float32 else 1), f"{name} error {err:.2e}"
        else:
            assert _relative(g, r) <= tol, f"{name} error {_relative(g, r):.2e}"


# --------------------------------------------------------------------------------------------
# Compositions
# --------------------------------------------------------------------------------------------

DOCS = torch.tensor([-1] * 3 + [0] * 7 + [1] * 9 + [-1] * 5)
"""Documents of 24 keys, with padding at both ends."""

CASES = {
    "rope_partial+causal, GQA, Nq<Nk": (
        [af.rope(rotary_dim=8), af.causal()], dict(rope=dict(rotary_dim=8), causal=True),
        dict(hq=4, hkv=2, nq=8, nk=24)),
    "rope_interleaved_partial+window, Nq>Nk, D=24": (
        [af.rope(rotary_dim=12, interleaved=True), af.sliding_window(5)],
        dict(rope=dict(rotary_dim=12, interleaved=True), window=5), dict(nq=20, nk=12, d=24)),
    "causal+window+alibi, 3 heads": (
        [af.causal(), af.sliding_window(6), af.alibi()], dict(causal=True, window=6, alibi=True),
        dict(hq=3, nq=20)),
    "softcap+alibi+bias[1,H,1,Nk]": (
        [af.softcap(5.0), af.alibi(), af.additive_bias()], dict(softcap=5.0, alibi=True),
        dict(bias=torch.randn(1, 2, 1, 24, generator=torch.Generator().manual_seed(1)))),
    "bias[B,1,Nq,Nk]+relu": (
        [af.additive_bias(), af.relu()], dict(normalizer="relu"),
        dict(b=2, lse=False, bias=torch.randn(2, 1, 24, 24, generator=torch.Generator().manual_seed(2)))),
    "sigmoid(b)+window, MQA": (
        [af.sigmoid(bias=-1.5), af.sliding_window(4)], dict(normalizer="sigmoid", sigmoid_bias=-1.5, window=4),
        dict(hq=4, hkv=1, lse=False)),
    "document with padding+causal": (
        [af.document(), af.causal()], dict(causal=True), dict(doc_ids=DOCS)),
    "document [B,Nk] int32+rope, Nq<Nk": (
        [af.document(), af.rope()], dict(rope={}),
        dict(b=2, nq=9, nk=24, doc_ids=torch.tensor([[0] * 10 + [1] * 14, [5] * 3 + [-1] * 2 + [7] * 19], dtype=torch.int32))),
    "document int64 ids beyond int32": (
        [af.document()], {}, dict(doc_ids=torch.tensor([0] * 8 + [2**32] * 8 + [-(2**32)] * 8))),
    "sigmoid+document padding rows are 0": (
        [af.sigmoid(), af.document()], dict(normalizer="sigmoid"), dict(lse=False, doc_ids=DOCS)),
    "relu+document, GQA": (
        [af.relu(), af.document()], dict(normalizer="relu"), dict(hq=4, hkv=2, lse=False, doc_ids=DOCS)),
    "block_sparse per head+causal, GQA, Nq<Nk": (
        [af.block_sparse(16), af.causal()], dict(block_size=16, causal=True),
        dict(hq=4, hkv=2, nq=20, nk=32, block_layout=torch.tensor(
            [[[True, False], [True, True]]] * 2 + [[[False, True], [False, False]]] * 2))),
    "block_sparse+document+sigmoid": (
        [af.block_sparse(16), af.document(), af.sigmoid()], dict(block_size=16, normalizer="sigmoid"),
        dict(nq=32, lse=False, block_layout=torch.tensor([[True, True], [False, True]]),
             doc_ids=torch.tensor([0] * 10 + [1] * 12 + [2] * 10))),
    "rope at [B,N] positions+alibi+causal": (
        [af.rope(), af.alibi(), af.causal()], dict(rope={}, alibi=True, causal=True),
        dict(b=2, nq=12, nk=16, q_positions=torch.stack((torch.arange(12) + 3, torch.arange(12) + 100)),
             k_positions=torch.arange(16) * 2 - 7)),
    "llama3 interleaved rope+explicit alibi": (
        [af.rope(theta=500000.0, interleaved=True, scaling=af.llama3_scaling(original_max_position=16)),
         af.alibi(slopes=[0.5, 0.1])],
        dict(rope=dict(theta=500000.0, interleaved=True, scaling=(8.0, 1.0, 4.0, 16)), alibi=[0.5, 0.1]), {}),
    "relu+causal, Nq>Nk (empty rows), MQA": (
        [af.causal(), af.relu()], dict(causal=True, normalizer="relu"), dict(nq=33, nk=17, hq=4, hkv=1, lse=False)),
    "bias with -inf rows+softcap+causal": (
        [af.additive_bias(), af.softcap(2.0), af.causal()], dict(softcap=2.0, causal=True),
        dict(bias=torch.randn(2, 24, 24, generator=torch.Generator().manual_seed(3)).index_put_(
            (torch.tensor([0]), torch.tensor([3])), torch.tensor(-math.inf)))),
    "every block": (
        [af.rope(rotary_dim=8, interleaved=True), af.softcap(3.0), af.alibi(), af.additive_bias(),
         af.causal(), af.sliding_window(9), af.document(), af.block_sparse(16)],
        dict(rope=dict(rotary_dim=8, interleaved=True), softcap=3.0, alibi=True, causal=True, window=9, block_size=16),
        dict(hq=4, hkv=2, nq=20, nk=32, d=24, bias=torch.randn(1, 4, 20, 32, generator=torch.Generator().manual_seed(4)),
             doc_ids=torch.tensor([0] * 10 + [-1] * 3 + [1] * 19), block_layout=torch.ones(2, 2, dtype=torch.bool))),
    "bf16 interleaved rope+causal, GQA, model layout": (
        [af.rope(interleaved=True), af.causal()], dict(rope=dict(interleaved=True), causal=True),
        dict(hq=4, hkv=2, d=32, dtype=torch.bfloat16, strided=True)),
    "fp16 softcap+window, Dv != D, bf16 bias": (
        [af.softcap(10.0), af.sliding_window(7), af.additive_bias()], dict(softcap=10.0, window=7),
        dict(dv=24, dtype=torch.float16, bias=torch.randn(24, 24, generator=torch.Generator().manual_seed(5)).bfloat16())),
}


@pytest.mark.parametrize("name", list(CASES))
def test_composition(name):
    blocks, ref, call = CASES[name]
    check(blocks, ref, **call)


@pytest.mark.parametrize("placement", ["fused", "pre_rotated", ("fused", "pre_rotated")])
def test_rope_placements_agree_at_call_time_positions(placement):
    check([af.rope(rotary_dim=12)], dict(rope=dict(rotary_dim=12)), b=2, nq=10, nk=20,
          compile_kw=dict(rope_placement=placement),
          q_positions=torch.tensor([[-5, 3, 7, 0, 1, 2, 40, 41, 42, 43], [9] * 10]),
          k_positions=torch.arange(20) * 2 - 7)


def test_lse_gradient_with_empty_rows():
    """Rows emptied by causal (Nq > Nk), by a padding query and by a -inf bias row: output 0,
    lse -inf, and gradients (an lse gradient included) finite and equal to the reference's."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(1, 2, 20, 16, generator=gen), torch.randn(1, 2, 12, 16, generator=gen), torch.randn(1, 2, 12, 16, generator=gen)
    bias = torch.randn(20, 12, generator=gen)
    bias[15] = -math.inf
    ids = torch.tensor([0] * 4 + [-1] * 3 + [1] * 5)
    spec = af.attention(af.causal(), af.document(), af.additive_bias())
    qs, ks, vs, bs = (t.clone().requires_grad_() for t in (q, k, v, bias))
    out, lse = spec(qs, ks, vs, bias=bs, doc_ids=ids, return_lse=True)
    g_out, g_lse = torch.randn(out.shape, generator=gen), torch.randn(lse.shape, generator=gen)
    torch.autograd.backward([out, lse], [g_out, g_lse])
    qr, kr, vr, br = (t.double().requires_grad_() for t in (q, k, v, bias))
    ref, ref_lse = audit_attention(qr, kr, vr, causal=True, doc_ids=ids, bias=br)
    kept = torch.isfinite(ref_lse)
    ((ref * g_out.double()).sum() + (ref_lse[kept] * g_lse.double()[kept]).sum()).backward()
    assert torch.equal(torch.isneginf(lse), ~kept) and (out[~kept] == 0).all()
    for got, want in ((qs, qr), (ks, kr), (vs, vr), (bs, br)):
        assert torch.isfinite(got.grad).all()
        assert (got.grad.double() - want.grad).abs().max() <= 1e-4


# --------------------------------------------------------------------------------------------
# Call-time tensors changed in place between a training call's forward and its backward
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argument", ["q_positions", "k_positions", "bias", "doc_ids"])
def test_call_data_changed_before_the_backward_is_refused(argument):
    """The backward reads the call-time data again: changed in place, the gradients would follow
    other scores than the output (positions past the forward's table were read out of
    bounds); autograd refuses a saved tensor changed so, and AttnFuse does the same."""
    blocks = {"q_positions": af.rope(), "k_positions": af.rope(), "bias": af.additive_bias(),
              "doc_ids": af.document()}[argument]
    given = {"q_positions": torch.arange(16), "k_positions": torch.arange(16),
             "bias": torch.zeros(16, 16), "doc_ids": torch.zeros(16, dtype=torch.long)}[argument]
    q, k, v = (torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(i)).requires_grad_() for i in range(3))
    out = af.attention(blocks)(q, k, v, **{argument: given})
    given.add_(7)
    with pytest.raises(ArgumentError, match=f"{argument} was modified in place between the forward and the backward"):
        out.sum().backward()


def test_rotate_keys_positions_changed_before_the_backward_is_refused():
    fn = af.compile(af.attention(af.rope()), rope_placement=("fused", "given"))
    k = torch.randn(1, 2, 16, 16).requires_grad_()
    pos = torch.arange(16)
    rotated = fn.rotate_keys(k, pos)
    pos.mul_(5)
    with pytest.raises(ArgumentError, match="k_positions was modified in place between the forward"):
        rotated.sum().backward()


def test_call_data_changed_after_the_backward_is_fine():
    pos = torch.arange(16)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(i)).requires_grad_() for i in range(3))
    spec = af.attention(af.rope())
    spec(q, k, v, q_positions=pos).sum().backward()
    pos.add_(3)
    spec(q, k, v, q_positions=pos).sum().backward()


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def _t(b=1, h=2, n=16, d=16):
    return torch.randn(b, h, n, d)


BAD_CALLS = {
    "q 3-D": (af.attention(), lambda: (_t()[0], _t(), _t()), {}, "q must be 4-D"),
    "heads": (af.attention(), lambda: (_t(h=3), _t(), _t()), {}, "multiple of key/value heads"),
    "head dim": (af.attention(), lambda: (_t(d=24), _t(), _t()), {}, "head dim"),
    "dtype": (af.attention(), lambda: (_t().double(), _t().double(), _t().double()), {}, "float64"),
    "device": (af.attention(), lambda: (_t().to("meta"), _t(), _t()), {}, "one device"),
    "doc_ids float": (af.attention(af.document()), lambda: (_t(), _t(), _t()),
                      dict(doc_ids=torch.zeros(16)), "doc_ids must be int32 or int64"),
    "doc_ids [B+1, Nk]": (af.attention(af.document()), lambda: (_t(), _t(), _t()),
                          dict(doc_ids=torch.zeros(2, 16, dtype=torch.long)), "doc_ids must have shape"),
    "doc_ids [Nq]": (af.attention(af.document()), lambda: (_t(n=8), _t(), _t()),
                     dict(doc_ids=torch.zeros(8, dtype=torch.long)), "doc_ids must have shape"),
    "doc_ids device": (af.attention(af.document()), lambda: (_t(), _t(), _t()),
                       dict(doc_ids=torch.zeros(16, dtype=torch.long, device="meta")), "doc_ids is on meta"),
    "positions int16": (af.attention(af.rope()), lambda: (_t(), _t(), _t()),
                        dict(q_positions=torch.arange(16, dtype=torch.int16)), "q_positions must be int32 or int64"),
    "positions length": (af.attention(af.rope()), lambda: (_t(), _t(), _t()),
                         dict(k_positions=torch.arange(15)), "k_positions must have shape"),
    "positions without rope": (af.attention(af.causal()), lambda: (_t(), _t(), _t()),
                               dict(q_positions=torch.arange(16)), "q_positions= given, but"),
    "bias shape": (af.attention(af.additive_bias()), lambda: (_t(), _t(), _t()),
                   dict(bias=torch.zeros(3, 16)), "does not broadcast"),
    "layout shape": (af.attention(af.block_sparse(16)), lambda: (_t(), _t(), _t()),
                     dict(block_layout=torch.ones(2, 2, dtype=torch.bool)), "block_layout must have shape"),
    "slopes count": (af.attention(af.alibi(slopes=[1.0, 2.0, 3.0])), lambda: (_t(), _t(), _t()), {},
                     "3 slopes given for 2 query heads"),
    "rotary_dim > D": (af.attention(af.rope(rotary_dim=32)), lambda: (_t(), _t(), _t()), {}, "rotary_dim 32 exceeds"),
    "return_lse tensor": (af.attention(), lambda: (_t(), _t(), _t()),
                          dict(return_lse=torch.tensor([True, False])), "return_lse must be True or False"),
    "return_lse str": (af.attention(), lambda: (_t(), _t(), _t()), dict(return_lse="yes"),
                       "return_lse must be True or False"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_call_names_the_argument(name):
    spec, inputs, call, message = BAD_CALLS[name]
    with pytest.raises(ArgumentError, match=message):
        spec(*inputs(), **call)
