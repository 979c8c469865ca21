"""`af.merge_states`: the attention over two disjoint key sets, from each set's (out, lse).

The independent check is the attention over the whole key set. A key set is split into
disjoint parts (contiguous halves of k and v, a shared prefix and per-sequence suffixes, or an
arbitrary interleaved partition of the (query, key) pairs given as `-inf` bias entries); each
part's (out, lse) comes from the float64 reference or from the generated kernels (on Triton's
CPU interpreter), and merging the parts must give the whole set's attention: outputs, lse and
the gradients with respect to q, k, v and the bias. Beyond that: rows empty on one side are
the other side's exactly, rows empty on both are 0 with lse -inf and zero gradients (never
NaN), gradients pass `gradcheck` in float64, half outputs are rounded once, merging is
associative, bad input is an `ArgumentError` naming the argument, and `torch.compile`
(fullgraph) traces it with the same values and gradients.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import assert_close_to_reference, assert_lse_close, lse_tolerance, make_qkv

import attnfuse as af
from attnfuse.errors import ArgumentError, AttnFuseError

NEG_INF = float("-inf")
F64 = torch.float64


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def partition(shape, parts: int, *, seed: int, contiguous: bool = False) -> torch.Tensor:
    """A part label in `0..parts-1` per (b, h, i, j) of `shape = [B, Hq, Nq, Nk]`.

    Contiguous: key `j` is in part `j * parts // Nk`. Otherwise each pair is labelled at
    random, and a few rows are put whole into part 0, so every other part is empty there."""
    b, h, n_q, n_k = shape
    if contiguous:
        return (torch.arange(n_k) * parts // n_k).expand(shape).clone()
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, parts, shape, generator=gen)
    labels[:, :, ::3] = 0  # every third row: all keys in part 0
    return labels


def part_biases(base: torch.Tensor, labels: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """Part `p`'s bias: `base` where the label is `p`, `-inf` elsewhere."""
    return [torch.where(labels == p, base, NEG_INF) for p in range(parts)]


def base_bias(shape, *, seed: int, empty_rows: bool = True) -> torch.Tensor:
    """A random finite float64 bias `[B, Hq, Nq, Nk]`; with `empty_rows`, row 1 of each head is
    all `-inf` (empty in the whole set, so in every part)."""
    gen = torch.Generator().manual_seed(seed + 1)
    base = torch.randn(shape, generator=gen, dtype=F64)
    if empty_rows:
        base[:, :, 1] = NEG_INF
    return base


def merge_all(states):
    """Merges a list of (out, lse) left to right."""
    out, lse = states[0]
    for o, l in states[1:]:
        out, lse = af.merge_states(out, lse, o, l)
    return out, lse


def finite_lse(lse: torch.Tensor) -> torch.Tensor:
    """The lse with its -inf rows at 0, so a loss can use it (their gradient is then 0)."""
    return torch.where(torch.isneginf(lse), 0.0, lse)


def states64(shape, *, seed: int, empty1=(), empty2=()):
    """Random float64 (o1, lse1, o2, lse2) `[B, H, N, Dv]` / `[B, H, N]`; the rows of `empty1`
    / `empty2` (indices into N) are empty on that side: o 0, lse -inf."""
    gen = torch.Generator().manual_seed(seed)
    o1, o2 = (torch.randn(shape, generator=gen, dtype=F64) for _ in range(2))
    lse1, lse2 = (3 * torch.randn(shape[:3], generator=gen, dtype=F64) for _ in range(2))
    for o, lse, rows in ((o1, lse1, empty1), (o2, lse2, empty2)):
        for n in rows:
            o[:, :, n] = 0.0
            lse[:, :, n] = NEG_INF
    return o1, lse1, o2, lse2


def merged_formula64(o1, lse1, o2, lse2):
    """The merge written from the semantics in float64 on rows with at least one kept key:
    `lse = logaddexp`, `o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2`."""
    o1, lse1, o2, lse2 = (t.detach().double() for t in (o1, lse1, o2, lse2))
    lse = torch.logaddexp(lse1, lse2)
    return torch.exp(lse1 - lse)[..., None] * o1 + torch.exp(lse2 - lse)[..., None] * o2, lse


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


# --------------------------------------------------------------------------------------------
# Merging parts gives the whole set (the float64 reference)
# --------------------------------------------------------------------------------------------

SPECS = {
    "full": af.attention(af.additive_bias()),
    "causal+alibi": af.attention(af.causal(), af.alibi(), af.additive_bias()),
    "rope+softcap": af.attention(af.rope(), af.softcap(5.0), af.additive_bias()),
}
SHAPES = {  # (B, Hq, Hkv, Nq, Nk, D, Dv)
    "square": (2, 2, 2, 12, 12, 8, 8),
    "gqa decode-chunk": (1, 4, 2, 5, 17, 8, 6),
    "nq > nk": (1, 2, 1, 9, 6, 4, 4),
}


@pytest.mark.parametrize("contiguous", [True, False], ids=["halves", "interleaved"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
@pytest.mark.parametrize("spec", SPECS.values(), ids=list(SPECS))
def test_merging_two_parts_gives_the_whole_set(spec, shape, contiguous):
    b, hq, hkv, nq, nk, d, dv = shape
    q, k, v = make_qkv(b, hq, hkv, nq, nk, d, dv, F64, seed=nq * nk)
    scores_shape = (b, hq, nq, nk)
    base = base_bias(scores_shape, seed=nk)
    biases = part_biases(base, partition(scores_shape, 2, seed=nq, contiguous=contiguous), 2)
    kw = dict(return_lse=True, differentiable=True)  # float64 lse as well as out
    parts = [af.reference_attention(spec, q, k, v, bias=bias, **kw) for bias in biases]
    out, lse = merge_all(parts)
    ref, ref_lse = af.reference_attention(spec, q, k, v, bias=base, **kw)
    assert out.dtype == F64 and lse.dtype == F64
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[:, :, 1] == 0).all() and torch.isneginf(lse[:, :, 1]).all()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-12)


def test_contiguous_halves_of_k_and_v():
    """The parts as separate calls on k[:s] and k[s:] (no bias): a full attention does not
    depend on key positions, so each half is the attention over those keys."""
    spec = af.attention()
    q, k, v = make_qkv(2, 4, 2, 7, 20, 16, 8, F64, seed=3)
    for split in (1, 9, 19):
        halves = [
            af.reference_attention(spec, q, k[:, :, sl], v[:, :, sl], return_lse=True,
                                   differentiable=True)
            for sl in (slice(0, split), slice(split, None))
        ]
        out, lse = merge_all(halves)
        ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True, differentiable=True)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-12)


def test_gradients_of_merged_parts_are_the_whole_sets():
    """Differentiating the merge of the parts (through the reference, lse included) w.r.t.
    q, k, v and the bias gives the whole set's gradients: the merge's gradients w.r.t. o and
    lse are right, and its empty rows send back nothing."""
    spec = SPECS["causal+alibi"]
    q, k, v = make_qkv(1, 4, 2, 10, 14, 8, 8, F64, seed=5, requires_grad=True)
    shape = (1, 4, 10, 14)
    base = base_bias(shape, seed=7).requires_grad_()
    gen = torch.Generator().manual_seed(11)
    grad_out = torch.randn(1, 4, 10, 8, generator=gen, dtype=F64)
    grad_lse = torch.randn(1, 4, 10, generator=gen, dtype=F64)

    def loss(out, lse):
        return (out * grad_out).sum() + (finite_lse(lse) * grad_lse).sum()

    inputs = (q, k, v, base)
    kw = dict(return_lse=True, differentiable=True)
    biases = part_biases(base, partition(shape, 2, seed=2), 2)
    merged = merge_all([af.reference_attention(spec, q, k, v, bias=b, **kw) for b in biases])
    grads = torch.autograd.grad(loss(*merged), inputs)
    whole = af.reference_attention(spec, q, k, v, bias=base, **kw)
    ref_grads = torch.autograd.grad(loss(*whole), inputs)
    for name, g, ref in zip("q k v bias".split(), grads, ref_grads):
        assert not g.isnan().any(), name
        torch.testing.assert_close(g, ref, rtol=0, atol=1e-12, msg=name)


def test_associative_over_three_parts():
    spec = SPECS["causal+alibi"]
    q, k, v = make_qkv(2, 2, 1, 8, 11, 8, 8, F64, seed=9)
    shape = (2, 2, 8, 11)
    base = base_bias(shape, seed=1)
    biases = part_biases(base, partition(shape, 3, seed=4), 3)
    a, b, c = (af.reference_attention(spec, q, k, v, bias=bias, return_lse=True,
                                      differentiable=True) for bias in biases)
    left = af.merge_states(*af.merge_states(*a, *b), *c)
    right = af.merge_states(*a, *af.merge_states(*b, *c))
    swapped = af.merge_states(*af.merge_states(*c, *a), *b)
    ref, ref_lse = af.reference_attention(spec, q, k, v, bias=base, return_lse=True,
                                          differentiable=True)
    for out, lse in (left, right, swapped):
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-12)
    # In float32 the orders agree to rounding.
    a32, b32, c32 = ((o.float(), l.float()) for o, l in (a, b, c))
    left32 = af.merge_states(*af.merge_states(*a32, *b32), *c32)
    right32 = af.merge_states(*a32, *af.merge_states(*b32, *c32))
    torch.testing.assert_close(left32[0], right32[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(left32[1], right32[1], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------
# The kernels' parts (Triton's CPU interpreter)
# --------------------------------------------------------------------------------------------


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_parts_merge_to_the_whole_set(dtype):
    """Two interleaved parts, computed by the generated kernels in `dtype`, merge to the
    reference of the whole set within the kernels' own tolerances, -inf rows where it has
    them; in fp32 the merge of the parts also matches the kernel's whole-set call."""
    spec = af.attention(af.causal(), af.additive_bias())
    fn = af.compile(spec)
    q, k, v = make_qkv(1, 2, 1, 20, 16, 16, 16, dtype, seed=21)
    shape = (1, 2, 20, 16)
    base = base_bias(shape, seed=3).float()
    biases = part_biases(base, partition(shape, 2, seed=8), 2)
    parts = [fn(q, k, v, bias=bias, return_lse=True) for bias in biases]
    out, lse = merge_all(parts)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref, ref_lse = af.reference_attention(spec, q, k, v, bias=base, return_lse=True)
    assert_close_to_reference(out, ref, dtype)
    assert_lse_close(lse, ref_lse, lse_tolerance(spec, q, k))
    empty = torch.isneginf(ref_lse)  # row 1, and the 4 rows before the first key (Nq > Nk)
    assert empty[..., :4].all() and (out[empty] == 0).all()
    if dtype == torch.float32:
        whole, whole_lse = fn(q, k, v, bias=base, return_lse=True)
        torch.testing.assert_close(out, whole, rtol=0, atol=2e-6)
        torch.testing.assert_close(lse, whole_lse, rtol=0, atol=2e-6)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cascade_decoding_with_a_shared_prefix(dtype):
    """Shared-prefix (cascade) decoding: the batch's queries attend to a prefix every sequence
    shares (one copy, broadcast over the batch) with no mask, and to each sequence's own
    suffix causally; the merge is causal attention over prefix + suffix (GQA, Nq = 1 and 3)."""
    prefix, suffix, batch = 24, 9, 3
    causal = af.compile(af.attention(af.causal()))
    full = af.compile(af.attention())
    gen = torch.Generator().manual_seed(0)
    kp, vp = (torch.randn(1, 2, prefix, 16, generator=gen).to(dtype) for _ in range(2))
    ks, vs = (torch.randn(batch, 2, suffix, 16, generator=gen).to(dtype) for _ in range(2))
    spec = af.attention(af.causal())
    for n_q in (1, 3):
        q = torch.randn(batch, 4, n_q, 16, generator=gen).to(dtype)
        shared = full(q, kp.expand(batch, -1, -1, -1), vp.expand(batch, -1, -1, -1),
                      return_lse=True)
        own = causal(q, ks, vs, return_lse=True)
        out, lse = af.merge_states(*shared, *own)
        k = torch.cat([kp.expand(batch, -1, -1, -1), ks], 2)
        v = torch.cat([vp.expand(batch, -1, -1, -1), vs], 2)
        ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True)
        assert_close_to_reference(out, ref, dtype)
        assert_lse_close(lse, ref_lse, lse_tolerance(spec, q, k))


@pytest.mark.interpreter
def test_kernel_gradients_through_the_merge():
    """fp32 kernels, forward and backward: the merge of two parts differentiated w.r.t. q, k,
    v and the bias (through each part's out and lse) against the kernel's whole-set call."""
    spec = af.attention(af.causal(), af.additive_bias())
    fn = af.compile(spec)
    q, k, v = make_qkv(1, 2, 1, 16, 16, 16, 16, torch.float32, seed=4, requires_grad=True)
    shape = (1, 2, 16, 16)
    base = base_bias(shape, seed=5).float().requires_grad_()
    gen = torch.Generator().manual_seed(6)
    grad_out = torch.randn(1, 2, 16, 16, generator=gen)
    grad_lse = torch.randn(1, 2, 16, generator=gen)

    def loss(out, lse):
        return (out * grad_out).sum() + (finite_lse(lse) * grad_lse).sum()

    inputs = (q, k, v, base)
    biases = part_biases(base, partition(shape, 2, seed=7), 2)
    merged = merge_all([fn(q, k, v, bias=bias, return_lse=True) for bias in biases])
    grads = torch.autograd.grad(loss(*merged), inputs)
    ref_grads = torch.autograd.grad(loss(*fn(q, k, v, bias=base, return_lse=True)), inputs)
    for name, g, ref in zip("q k v bias".split(), grads, ref_grads):
        assert torch.isfinite(g).all(), name
        assert rel_err(g, ref) < 1e-5, (name, rel_err(g, ref))


# --------------------------------------------------------------------------------------------
# Empty rows
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, F64])
def test_a_row_empty_on_one_side_is_the_other_sides_exactly(dtype):
    o1, lse1, o2, lse2 = states64((2, 3, 6, 5), seed=1, empty1=(0, 2), empty2=(3,))
    o1, o2 = o1.to(dtype), o2.to(dtype)
    lse_dtype = F64 if dtype == F64 else torch.float32
    lse1, lse2 = lse1.to(lse_dtype), lse2.to(lse_dtype)
    out, lse = af.merge_states(o1, lse1, o2, lse2)
    assert out.dtype == dtype and lse.dtype == lse_dtype
    for n in (0, 2):
        assert torch.equal(out[:, :, n], o2[:, :, n]) and torch.equal(lse[:, :, n], lse2[:, :, n])
    assert torch.equal(out[:, :, 3], o1[:, :, 3]) and torch.equal(lse[:, :, 3], lse1[:, :, 3])


def test_a_row_empty_on_both_sides_is_zero_with_zero_gradients():
    o1, lse1, o2, lse2 = (t.requires_grad_() for t in states64(
        (2, 2, 5, 4), seed=2, empty1=(1, 2, 4), empty2=(1, 3, 4)))
    out, lse = af.merge_states(o1, lse1, o2, lse2)
    assert (out[:, :, [1, 4]] == 0).all() and torch.isneginf(lse[:, :, [1, 4]]).all()
    assert not out.isnan().any() and not lse.isnan().any()
    gen = torch.Generator().manual_seed(3)
    grad_out = torch.randn(out.shape, generator=gen, dtype=F64)
    grad_lse = torch.randn(lse.shape, generator=gen, dtype=F64)
    # The lse's gradient is given on every row, the -inf ones included.
    g_o1, g_lse1, g_o2, g_lse2 = torch.autograd.grad(
        (out, lse), (o1, lse1, o2, lse2), (grad_out, grad_lse))
    for name, g in (("o1", g_o1), ("lse1", g_lse1), ("o2", g_o2), ("lse2", g_lse2)):
        assert not g.isnan().any(), name
        assert (g[:, :, [1, 4]] == 0).all(), name
    # Empty on one side: that side gets nothing, the other side the gradients as they came
    # (the lse's to rounding: its o-path terms cancel, o2 - o2).
    assert (g_o1[:, :, 2] == 0).all() and (g_lse1[:, :, 2] == 0).all()
    assert (g_o2[:, :, 3] == 0).all() and (g_lse2[:, :, 3] == 0).all()
    assert torch.equal(g_o2[:, :, 2], grad_out[:, :, 2])
    assert torch.equal(g_o1[:, :, 3], grad_out[:, :, 3])
    torch.testing.assert_close(g_lse2[:, :, 2], grad_lse[:, :, 2], rtol=0, atol=1e-14)
    torch.testing.assert_close(g_lse1[:, :, 3], grad_lse[:, :, 3], rtol=0, atol=1e-14)


def test_large_and_distant_lse():
    """Only differences of lse matter: lse around ±1e4 (fp32 exp would overflow or underflow
    without the shift), and sides far apart (the smaller one's weight underflows to 0)."""
    o1, lse1, o2, lse2 = (t.float() for t in states64((1, 2, 4, 8), seed=4))
    for offset in (1e4, -1e4):
        far1, far2 = lse1 + offset, lse2 + offset
        out, lse = af.merge_states(o1, far1, o2, far2)
        ref, ref_lse = merged_formula64(o1, far1, o2, far2)
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=0)
    out, lse = af.merge_states(o1, lse1, o2, lse1 - 200.0)
    assert torch.equal(out, o1) and torch.equal(lse, lse1)


# --------------------------------------------------------------------------------------------
# Gradients, dtypes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("empty", [False, True], ids=["all kept", "one side empty"])
def test_gradcheck_float64(empty):
    rows = dict(empty1=(0,), empty2=(2,)) if empty else {}
    inputs = tuple(t.requires_grad_() for t in states64((1, 2, 4, 3), seed=5, **rows))
    with torch.no_grad():  # a tie: the shift is either side's
        inputs[3][0, 1, 3] = inputs[1][0, 1, 3]
    assert torch.autograd.gradcheck(af.merge_states, inputs)


def test_against_the_formula_float64():
    o1, lse1, o2, lse2 = states64((2, 3, 7, 5), seed=6, empty1=(1,), empty2=(4,))
    out, lse = af.merge_states(o1, lse1, o2, lse2)
    ref, ref_lse = merged_formula64(o1, lse1, o2, lse2)
    torch.testing.assert_close(out, ref, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_half_outputs_are_merged_in_float32_and_rounded_once(dtype):
    """The result is the float64 merge of the given (rounded) values, rounded once to the
    dtype: within half an ulp, plus float32's error."""
    o1, lse1, o2, lse2 = states64((2, 4, 16, 32), seed=7, empty1=(3,), empty2=(5,))
    o1, o2, lse1, lse2 = o1.to(dtype), o2.to(dtype), lse1.float(), lse2.float()
    out, lse = af.merge_states(o1, lse1, o2, lse2)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref, ref_lse = merged_formula64(o1, lse1, o2, lse2)
    eps = torch.finfo(dtype).eps
    assert ((out.double() - ref).abs() <= (0.5 * eps + 1e-6) * ref.abs() + 1e-7).all()
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)
    if dtype != torch.float32:
        o1.requires_grad_(), o2.requires_grad_(), lse1.requires_grad_(), lse2.requires_grad_()
        out, lse = af.merge_states(o1, lse1, o2, lse2)
        g_o1, g_lse1 = torch.autograd.grad((out.float().sum() + finite_lse(lse).sum()), (o1, lse1))
        assert g_o1.dtype == dtype and g_lse1.dtype == torch.float32


def test_commutative_bit_for_bit():
    for dtype in (torch.float32, torch.bfloat16):
        o1, lse1, o2, lse2 = states64((2, 3, 6, 5), seed=10, empty1=(1,), empty2=(2,))
        o1, o2, lse1, lse2 = o1.to(dtype), o2.to(dtype), lse1.float(), lse2.float()
        ab, ba = af.merge_states(o1, lse1, o2, lse2), af.merge_states(o2, lse2, o1, lse1)
        assert torch.equal(ab[0], ba[0]) and torch.equal(ab[1], ba[1])


@pytest.mark.parametrize("shape", [(0, 2, 3, 4), (1, 2, 0, 4), (1, 0, 3, 4), (1, 2, 3, 0)])
def test_empty_tensors(shape):
    o1, o2 = torch.zeros(shape), torch.zeros(shape)
    lse1, lse2 = torch.zeros(shape[:3]), torch.zeros(shape[:3])
    out, lse = af.merge_states(o1, lse1, o2, lse2)
    assert out.shape == shape and lse.shape == shape[:3]
    if lse.numel():  # Dv = 0: lse = log(2)
        torch.testing.assert_close(lse, torch.full(shape[:3], 0.6931472))


def test_strided_outputs():
    """o as a [B, N, H, Dv] tensor's transpose (the layout a model's heads come in)."""
    o1, lse1, o2, lse2 = (t.float() for t in states64((2, 3, 5, 4), seed=8, empty2=(1,)))
    out, lse = af.merge_states(o1.transpose(1, 2).contiguous().transpose(1, 2), lse1,
                               o2.transpose(1, 2).contiguous().transpose(1, 2), lse2)
    ref, ref_lse = af.merge_states(o1, lse1, o2, lse2)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_exported_from_the_package():
    assert "merge_states" in af.__all__
    from attnfuse.runtime.merge_states import merge_states

    assert af.merge_states is merge_states


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def good():
    o1, lse1, o2, lse2 = states64((1, 2, 3, 4), seed=9)
    return {"o1": o1.float(), "lse1": lse1.float(), "o2": o2.float(), "lse2": lse2.float()}


BAD = {
    "o1 not a tensor": (dict(o1=[[0.0]]), "o1 must be a torch.Tensor"),
    "lse2 not a tensor": (dict(lse2=0.0), "lse2 must be a torch.Tensor"),
    "o2 rank": (dict(o2=torch.zeros(2, 3, 4)), "o2 must be 4-D"),
    "lse1 rank": (dict(lse1=torch.zeros(1, 2, 3, 1)), "lse1 must be 3-D"),
    "o2 shape": (dict(o2=torch.zeros(1, 2, 3, 5)), "o2 must have o1's shape"),
    "o2 heads": (dict(o2=torch.zeros(1, 3, 3, 4)), "o2 must have o1's shape"),
    "lse1 shape": (dict(lse1=torch.zeros(1, 2, 4)), "lse1 must have shape (1, 2, 3)"),
    "lse2 shape": (dict(lse2=torch.zeros(2, 2, 3)), "lse2 must have shape (1, 2, 3)"),
    "lse1 half": (dict(lse1=torch.zeros(1, 2, 3, dtype=torch.float16)), "lse1 must be float32"),
    "lse2 float64": (dict(lse2=torch.zeros(1, 2, 3, dtype=F64)), "lse2 must be float32"),
    "lse1 int": (dict(lse1=torch.zeros(1, 2, 3, dtype=torch.int32)), "lse1 must be float32"),
    "o2 dtype": (dict(o2=torch.zeros(1, 2, 3, 4, dtype=torch.float16)), "o2 must have o1's dtype"),
    "o1 int": (dict(o1=torch.zeros(1, 2, 3, 4, dtype=torch.int64),
                    o2=torch.zeros(1, 2, 3, 4, dtype=torch.int64)), "o1 has dtype torch.int64"),
    "lse dtypes differ": (dict(o1=torch.zeros(1, 2, 3, 4, dtype=F64),
                               o2=torch.zeros(1, 2, 3, 4, dtype=F64),
                               lse2=torch.zeros(1, 2, 3, dtype=F64)), "lse2 must have lse1's dtype"),
    "o2 device": (dict(o2=torch.zeros(1, 2, 3, 4, device="meta")), "o2 must be on o1's device"),
    "lse1 device": (dict(lse1=torch.zeros(1, 2, 3, device="meta")), "lse1 must be on o1's device"),
}


@pytest.mark.parametrize("change, message", BAD.values(), ids=list(BAD))
def test_bad_input_is_an_argument_error(change, message):
    args = good() | change
    with pytest.raises(ArgumentError, match=re.escape(message)) as info:
        af.merge_states(args["o1"], args["lse1"], args["o2"], args["lse2"])
    assert isinstance(info.value, AttnFuseError)


# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_fullgraph(fresh_dynamo, dynamic):
    """Inductor on the CPU, the same values and gradients as eager, empty rows included."""
    compiled = torch.compile(af.merge_states, fullgraph=True, dynamic=dynamic)
    for n in (6, 9):
        states = [t.float() for t in states64((2, 2, n, 4), seed=n, empty1=(0, 2), empty2=(2, 4))]
        gen = torch.Generator().manual_seed(n)
        grad_out = torch.randn(2, 2, n, 4, generator=gen)
        grad_lse = torch.randn(2, 2, n, generator=gen)
        results = []
        for merge in (af.merge_states, compiled):
            inputs = [t.clone().requires_grad_() for t in states]
            out, lse = merge(*inputs)
            grads = torch.autograd.grad((out, lse), inputs, (grad_out, grad_lse))
            results.append((out, lse, *grads))
        for eager, traced in zip(*results):
            assert not traced.isnan().any()
            torch.testing.assert_close(traced, eager, rtol=1e-6, atol=1e-6)
        assert torch.isneginf(results[1][1][:, :, 2]).all()


@pytest.mark.interpreter
def test_torch_compile_cascade_with_kernels(fresh_dynamo):
    """Two kernel calls and their merge in one fullgraph-compiled function, forward and
    backward, against eager."""
    full = af.compile(af.attention())
    causal = af.compile(af.attention(af.causal()))

    def cascade(q, kp, vp, ks, vs):
        out, lse = af.merge_states(*full(q, kp, vp, return_lse=True),
                                   *causal(q, ks, vs, return_lse=True))
        return out.sum() + lse.sum()

    compiled = torch.compile(cascade, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(shape, generator=gen) for shape in
               ((2, 2, 2, 16), (2, 2, 16, 16), (2, 2, 16, 16), (2, 2, 8, 16), (2, 2, 8, 16))]
    results = []
    for fn in (cascade, compiled):
        inputs = [t.clone().requires_grad_() for t in tensors]
        value = fn(*inputs)
        results.append((value, *torch.autograd.grad(value, inputs)))
    for eager, traced in zip(*results):
        torch.testing.assert_close(traced, eager, rtol=1e-5, atol=1e-5)


def test_a_row_empty_in_one_set_is_the_others_bit_for_bit_signed_zeros_and_all():
    """`0 · o1 + o2` would turn o2's -0.0 into +0.0, and an inf in the empty row into NaN."""
    o2 = torch.tensor([[[[-0.0, 1.0, -3.5]]]])
    lse2 = torch.tensor([[[0.5]]])
    o1 = torch.tensor([[[[math.inf, -math.inf, 7.0]]]])  # never read: its row is empty
    lse1 = torch.tensor([[[-math.inf]]])
    for a, b in (((o1, lse1), (o2, lse2)), ((o2, lse2), (o1, lse1))):
        o, lse = af.merge_states(*a, *b)
        assert torch.equal(o.view(torch.int32), o2.view(torch.int32))
        assert torch.equal(lse, lse2)
    both_empty = af.merge_states(-o2, lse1, o2, lse1)[0]
    assert torch.equal(both_empty.view(torch.int32), torch.zeros_like(o2).view(torch.int32))
