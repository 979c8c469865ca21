"""Keys that arrive rotated: `rope_placement=(query, "given")` and `rotate_keys`.

A KV cache stores each key rotated once, when it is written. A call compiled with a `given`
key rotation must rotate only the queries, at their positions, and read k as passed:

    out = attention(R(q_pos) q, k)          dk = the gradient with respect to the k passed

The kernels (on Triton's CPU interpreter) are compared with that formula written here in
float64 (`rotate64`, `attention64`: from docs/semantics.md, sharing no code with the
reference or the kernels), forward and backward, and with the plain fused-RoPE call on
unrotated keys, which must agree once k is rotated by the reference rotation.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close_to_reference, error_of, make_qkv

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime.reference import Rotation, rotate

pytestmark = pytest.mark.interpreter

GIVEN = ("auto", "given")
GRAD_LIMIT = {torch.float32: 2e-4, torch.bfloat16: 2e-2}
"""The backward's acceptance bounds on ||g - ref|| / ||ref|| (test_backward.py's)."""


# --------------------------------------------------------------------------------------------
# The float64 formula
# --------------------------------------------------------------------------------------------


def frequencies64(theta: float, r: int, llama3: dict | None) -> torch.Tensor:
    """`f_t = theta^(-2t/r)` in float64, Llama-3.1-scaled by wavelength, rounded to fp32."""
    freqs = []
    for t in range(r // 2):
        f = theta ** (-2.0 * t / r)
        if llama3 is not None:
            wavelength, big_l = 2 * math.pi / f, llama3["original_max_position"]
            low, high = llama3["low_freq_factor"], llama3["high_freq_factor"]
            if wavelength > big_l / low:
                f = f / llama3["factor"]
            elif wavelength >= big_l / high:
                s = (big_l / wavelength - low) / (high - low)
                f = (1 - s) * f / llama3["factor"] + s * f
        freqs.append(f)
    return torch.tensor(freqs, dtype=torch.float64).float()


def rotate64(x, pos, theta=10000.0, rotary_dim=None, interleaved=False, llama3=None):
    """`R(pos) x` for a float64 x `[B, H, N, D]`, pos `[N]` or `[B, N]` (differentiable in
    x): each pair (a, b) becomes (a cos - b sin, a sin + b cos), the angle the fp32 product
    pos * f_t, cos and sin of it in float64; dims past the rotary width pass through."""
    d = x.shape[-1]
    r = rotary_dim or d
    angle = (pos.float()[..., None] * frequencies64(theta, r, llama3)).double()  # fp32 product
    if angle.dim() == 3:
        angle = angle[:, None]  # per batch entry: broadcast over heads
    cos, sin = angle.cos(), angle.sin()
    idx_a = torch.arange(0, r, 2) if interleaved else torch.arange(r // 2)
    idx_b = idx_a + 1 if interleaved else idx_a + r // 2
    a, b = x[..., idx_a], x[..., idx_b]
    out = x.index_copy(-1, idx_a, a * cos - b * sin)
    return out.index_copy(-1, idx_b, a * sin + b * cos)


def attention64(q_rot, k, v, causal: bool):
    """softmax(q k^T / sqrt(D)) v over kept keys, GQA by repeating k and v over the group,
    causal bottom-right aligned (query i sits at position i + Nk - Nq)."""
    n_q, n_k = q_rot.shape[2], k.shape[2]
    group = q_rot.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q_rot @ k.transpose(-1, -2) / math.sqrt(q_rot.shape[-1])
    if causal:
        keep = torch.arange(n_k)[None, :] <= (torch.arange(n_q) + n_k - n_q)[:, None]
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def expected(q, k, v, grad_out, q_pos, causal, rope):
    """out = attention(R(q_pos) q, k_given) in float64, and its gradients in q, k, v."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = attention64(rotate64(q64, q_pos, **rope), k64, v64, causal)
    grads = torch.autograd.grad((out * grad_out.double()).sum(), (q64, k64, v64))
    return out.detach(), dict(zip("qkv", grads))


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm()).item()


def default_q_pos(n_q: int, n_k: int) -> torch.Tensor:
    return torch.arange(n_q) + (n_k - n_q)


# --------------------------------------------------------------------------------------------
# The kernels against the formula
# --------------------------------------------------------------------------------------------

ROPES = {
    "half": {},
    "partial": {"rotary_dim": 16},
    "interleaved": {"interleaved": True},
    "partial-interleaved": {"rotary_dim": 8, "interleaved": True},
    "llama3": {"theta": 500000.0, "llama3": dict(factor=8.0, low_freq_factor=1.0,
                                                 high_freq_factor=4.0, original_max_position=32)},
}


def rope_block(rope: dict):
    scaling = rope.get("llama3")
    return af.rope(theta=rope.get("theta", 10000.0), rotary_dim=rope.get("rotary_dim"),
                   interleaved=rope.get("interleaved", False),
                   scaling=None if scaling is None else af.llama3_scaling(**scaling))


CASES = [
    # (rope, dtype, nq, nk, causal, query placement, per-batch q positions)
    ("half", torch.float32, 3, 40, True, "auto", False),
    ("half", torch.bfloat16, 1, 40, True, "auto", False),
    ("partial", torch.float32, 3, 40, True, "fused", False),
    ("interleaved", torch.bfloat16, 3, 40, False, "pre_rotated", False),
    ("partial-interleaved", torch.float32, 1, 40, True, "pre_rotated", True),
    ("llama3", torch.bfloat16, 3, 40, True, "auto", True),
    ("llama3", torch.float32, 40, 40, True, "fused", True),
]


def case_id(case) -> str:
    rope, dtype, nq, nk, causal, placement, per_batch = case
    dt = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    return (f"{rope}-{dt}-{nq}x{nk}-{'causal' if causal else 'nomask'}-q_{placement}"
            + ("-positions-BN" if per_batch else ""))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_given_key_forward_and_backward(case):
    """GQA (Hq=4, Hkv=2), decode (Nq=1, 3) and a prefill over a cache (Nq = Nk): the output
    and dq, dk, dv against the float64 formula, for a call and for a training call."""
    rope, dtype, nq, nk, causal, query, per_batch = case
    b = 2
    spec = af.attention(rope_block(ROPES[rope]), *([af.causal()] if causal else []))
    fn = af.compile(spec, rope_placement=(query, "given"))
    q, k, v = make_qkv(b, 4, 2, nq=nq, nk=nk, d=32, dtype=dtype, seed=nq + nk)
    call = {}
    q_pos = default_q_pos(nq, nk)
    if per_batch:  # HF with left padding: each sequence's own positions
        q_pos = torch.stack([q_pos + 5, q_pos - 2])
        call["q_positions"] = q_pos
    grad_out = torch.randn(b, 4, nq, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    ref, ref_grads = expected(q, k, v, grad_out, q_pos, causal, ROPES[rope])

    assert_close_to_reference(fn(q, k, v, **call), ref, dtype)  # inference
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, **call)  # training: the backward kernels too
    assert_close_to_reference(out, ref, dtype)
    out.backward(grad_out)
    for name, leaf in zip("qkv", leaves):
        assert leaf.grad.dtype == dtype and leaf.grad.shape == leaf.shape
        err = relative(leaf.grad, ref_grads[name])
        assert err <= GRAD_LIMIT[dtype], f"d{name}: relative error {err:.2e}"
    # The reference evaluates the same meaning.
    ref_call = af.reference_attention(spec, q, k, v, rope_placement=(query, "given"), **call)
    assert error_of(ref_call, ref, torch.float32) <= 1e-12


def test_formula_is_not_the_rotated_key_one():
    """The check above can fail: rotating k too (the plain fused call) misses the formula."""
    spec = af.attention(af.rope(), af.causal())
    q, k, v = make_qkv(1, 4, 2, nq=3, nk=40, d=32, seed=4)
    ref, _ = expected(q, k, v, torch.ones(1, 4, 3, 32), default_q_pos(3, 40), True, {})
    with pytest.raises(AssertionError, match="max abs error"):
        assert_close_to_reference(af.compile(spec, rope_placement="fused")(q, k, v), ref, q.dtype)


@pytest.mark.parametrize("query", ["fused", "pre_rotated"])
def test_given_key_equals_fused_rope_on_rotated_keys(query):
    """`(query, "given")` on k rotated by the reference rotation equals the plain fused-RoPE
    call on unrotated k: values, dq and dv; dk relates by the rotation's transpose."""
    rope = {"rotary_dim": 24, "interleaved": True}
    spec = af.attention(rope_block(rope), af.causal())
    q, k, v = make_qkv(2, 4, 2, nq=5, nk=37, d=32, seed=9)
    k_pos = torch.arange(37)
    k_rot = rotate64(k.double(), k_pos, **rope).float()
    grad_out = torch.randn(2, 4, 5, 32, generator=torch.Generator().manual_seed(2))

    def run(placement, keys):
        leaves = [t.clone().requires_grad_() for t in (q, keys, v)]
        out = af.compile(spec, rope_placement=placement)(*leaves)
        out.backward(grad_out)
        return out.detach(), [t.grad for t in leaves]

    out_given, (dq_given, dk_given, dv_given) = run((query, "given"), k_rot)
    out_plain, (dq_plain, dk_plain, dv_plain) = run("fused", k)
    torch.testing.assert_close(out_given, out_plain, rtol=0, atol=2e-6)
    torch.testing.assert_close(dq_given, dq_plain, rtol=0, atol=1e-5)
    torch.testing.assert_close(dv_given, dv_plain, rtol=0, atol=1e-5)
    # d/dk of f(R k) is R^T (d/d(Rk)), and R(p)^T = R(-p).
    torch.testing.assert_close(rotate64(dk_given.double(), -k_pos, **rope).float(), dk_plain,
                               rtol=0, atol=1e-5)
    assert (dk_given - dk_plain).abs().max() > 1e-3  # the transpose is needed: not the same


# --------------------------------------------------------------------------------------------
# What the compile holds
# --------------------------------------------------------------------------------------------


def test_given_key_kernels_never_rotate_k():
    spec = af.attention(af.rope(), af.causal())
    q, k, v = make_qkv(1, 2, nq=3, nk=40, d=32)
    fn = af.compile(spec, rope_placement=GIVEN)
    ir = fn.tile_ir(q, k, v, training=True)
    assert "rotate_key" not in ir and "k_rot" not in ir
    assert "positions = #tile<seq key>" not in ir  # no rotation of k, nor of dk
    assert "positions = #tile<seq query>" in ir
    fn(q, k, v)
    assert "place-rope{query=fused key=given}" in fn.last.pipeline
    assert "RoPE at key positions" not in fn.source


def test_compile_cache_tells_given_from_pre_rotated():
    """Given and pre-rotated keys compile to kernels of the same shape: the cache must keep
    them apart (a pre-rotated compile would rotate k a second time)."""
    from attnfuse.runtime.compiler import _cache_key

    spec = af.attention(af.rope(), af.causal())
    q, k, v = make_qkv(1, 2, nq=3, nk=40, d=32, seed=3)
    given = af.compile(spec, rope_placement=("fused", "given"))
    pre = af.compile(spec, rope_placement=("fused", "pre_rotated"))
    keys = [fn.compile_key(fn.plan(q, k, v).problem) for fn in (given, pre)]
    assert keys[0] != keys[1]
    assert _cache_key(spec, keys[0], True) != _cache_key(spec, keys[1], True)
    assert not torch.equal(given(q, k, v), pre(q, k, v))


def test_hand_written_given_key():
    """An attn program whose key rotation is `#attn<placement given>` means it: compiled
    under "auto" it reads keys as passed; the reference evaluates it so; place-rope keeps it."""
    ir = """
attn.variant @cached(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.0e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.0e+04 : f64, placement = #attn<placement given>} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}"""
    q, k, v = make_qkv(1, 2, nq=3, nk=20, d=16, seed=8)
    ref, _ = expected(q, k, v, torch.ones(1, 2, 3, 16), default_q_pos(3, 20), False, {})
    fn = af.compile(ir)
    assert fn.key_given
    assert_close_to_reference(fn(q, k, v), ref, q.dtype)
    assert_close_to_reference(af.reference_attention(ir, q, k, v).float(), ref, q.dtype)
    assert "key=given" in fn.last.pipeline
    with pytest.raises(ArgumentError, match="placement given"):
        af.compile(ir, rope_placement="fused")


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [("given", "given"), ("given", "auto"), ("given", "fused")], ids=repr)
def test_given_query_is_an_error(bad):
    with pytest.raises(ArgumentError, match="query cannot be 'given': only keys arrive rotated"):
        af.compile(af.attention(af.rope()), rope_placement=bad)


def test_given_query_in_ir_is_an_error():
    ir = """
attn.variant @bad(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.0e+04 : f64, placement = #attn<placement given>} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}"""
    with pytest.raises(af.AttnFuseError, match="placement given applies only to the key"):
        af.compile(ir)


@pytest.mark.parametrize("bad", [("auto", "givn"), ("q_fused", "given"), ("fused", None)], ids=repr)
def test_bad_pair_is_an_error(bad):
    with pytest.raises(ArgumentError, match="rope_placement (query|key) must be"):
        af.compile(af.attention(af.rope()), rope_placement=bad)


def test_key_positions_with_given_key_are_an_error():
    spec = af.attention(af.rope(), af.causal())
    q, k, v = make_qkv(1, 2, nq=3, nk=20, d=16)
    fn = af.compile(spec, rope_placement=GIVEN)
    with pytest.raises(ArgumentError, match="k_positions= has no effect with a given key rotation"):
        fn(q, k, v, k_positions=torch.arange(20))
    with pytest.raises(ArgumentError, match="k_positions= has no effect"):
        af.reference_attention(spec, q, k, v, k_positions=torch.arange(20), rope_placement=GIVEN)
    # q_positions are the queries' own: still checked.
    with pytest.raises(ArgumentError, match="q_positions must have shape"):
        fn(q, k, v, q_positions=torch.arange(4))


def test_given_key_without_rope_is_ignored():
    spec = af.attention(af.causal())
    q, k, v = make_qkv(1, 2, nq=3, nk=20, d=16)
    out = af.compile(spec, rope_placement=GIVEN)(q, k, v)
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v), q.dtype)


# --------------------------------------------------------------------------------------------
# rotate_keys: what a cache stores
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rotate_keys_against_float64(rope, dtype):
    fn = af.compile(af.attention(rope_block(ROPES[rope])), rope_placement=GIVEN)
    _, k, _ = make_qkv(2, 2, nq=1, nk=21, d=32, dtype=dtype, seed=11, strided=True)
    gen = torch.Generator().manual_seed(3)
    for pos in (None, torch.randint(-50, 3000, (21,), generator=gen),
                torch.randint(0, 3000, (2, 21), generator=gen, dtype=torch.int32)):
        rotated = fn.rotate_keys(k, pos)
        assert rotated.shape == k.shape and rotated.dtype == dtype
        assert rotated.stride() == k.stride()  # the cache's layout is kept
        ref = rotate64(k.double(), torch.arange(21) if pos is None else pos.long(), **ROPES[rope])
        if dtype == torch.float32:
            assert (rotated.double() - ref).abs().max() <= 2e-6 * ref.abs().max()
        else:  # rotated in fp32, rounded once
            assert relative(rotated, ref) <= 2 ** -8


def test_rotate_keys_gradient_is_the_inverse_rotation():
    rope = ROPES["llama3"]
    fn = af.compile(af.attention(rope_block(rope)), rope_placement=GIVEN)
    _, k, _ = make_qkv(2, 2, nq=1, nk=9, d=32, seed=12)
    k = k.requires_grad_()
    pos = torch.randint(0, 5000, (2, 9), generator=torch.Generator().manual_seed(4))
    grad = torch.randn(k.shape, generator=torch.Generator().manual_seed(5))
    fn.rotate_keys(k, pos).backward(grad)
    ref = rotate64(grad.double(), -pos, **rope)  # R(p)^T g = R(-p) g
    assert (k.grad.double() - ref).abs().max() <= 2e-6 * ref.abs().max()
    assert relative(k.grad, rotate64(grad.double(), pos, **rope)) > 0.1  # R, not R^T, is wrong


def test_rotate_keys_is_what_a_pre_rotated_key_attends_to():
    """The cache's keys, rotated by rotate_keys, give bit for bit the output of a call that
    pre-rotates the keys itself (the same rotation kernel; fp16: the interpreter rounds it
    as a GPU does)."""
    spec = af.attention(af.rope(rotary_dim=16), af.causal())
    q, k, v = make_qkv(1, 4, 2, nq=3, nk=40, d=32, dtype=torch.float16, seed=13)
    given = af.compile(spec, rope_placement=("fused", "given"))
    pre = af.compile(spec, rope_placement=("fused", "pre_rotated"))
    assert torch.equal(given(q, given.rotate_keys(k), v), pre(q, k, v))


def test_rotate_keys_errors():
    _, k, _ = make_qkv(1, 2, nq=1, nk=8, d=16)
    with pytest.raises(ArgumentError, match="has no rope"):
        af.compile(af.attention(af.causal())).rotate_keys(k)
    fn = af.compile(af.attention(af.rope()), rope_placement=GIVEN)
    with pytest.raises(ArgumentError, match="k_positions must have shape"):
        fn.rotate_keys(k, torch.arange(9))
    with pytest.raises(ArgumentError, match="k_positions must be int32 or int64"):
        fn.rotate_keys(k, torch.arange(8.0))
    with pytest.raises(ArgumentError, match=r"k must be 4-D"):
        fn.rotate_keys(k[0])
    with pytest.raises(ArgumentError, match="rotary_dim 32 exceeds the head dim 16"):
        af.compile(af.attention(af.rope(rotary_dim=32))).rotate_keys(k)
