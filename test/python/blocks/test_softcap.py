"""`softcap(cap)` through the real kernels (Triton's interpreter on the CPU), forward and
backward, against the float64 reference and against an independent formula; its place in the
DSL and its algebra (canonicalize-attn never moves an additive modifier across it)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close_to_reference, check_forward_backward, make_qkv

import attnfuse as af
from attnfuse.errors import CompositionError

pytestmark = pytest.mark.interpreter

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cap", [0.5, 3.0, 50.0])
def test_softcap_causal(dtype, cap):
    # Scores of a few units: a cap of 0.5 squashes them hard, 50 barely touches them.
    q, k, v = make_qkv(1, 4, 2, 37, 45, 32, dtype=dtype, seed=int(cap * 10))
    check_forward_backward(af.attention(af.softcap(cap), af.causal()), q * 3, k, v, lse=True)


@pytest.mark.parametrize("user_order", ["softcap_first", "softcap_last"])
def test_softcap_with_rope_alibi_bias(user_order):
    blocks = [af.rope(), af.alibi(), af.additive_bias(), af.sliding_window(20)]
    blocks = [af.softcap(2.0), *blocks] if user_order == "softcap_first" else [*blocks, af.softcap(2.0)]
    q, k, v = make_qkv(2, 2, 1, 33, 40, 16, seed=3)
    bias = torch.randn(2, 1, 33, 40, generator=torch.Generator().manual_seed(4)).requires_grad_()
    check_forward_backward(af.attention(*blocks), q * 2, k, v, lse=True, bias=bias)


def test_softcap_matches_an_independent_formula():
    """The reference's softcap against attention written out by hand (no interpreter)."""
    cap = 1.5
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16, seed=11)
    out = af.attention(af.softcap(cap), af.causal())(q * 4, k, v).double()
    s = (q.double() * 4) @ k.double().transpose(-1, -2) / math.sqrt(16)
    s = cap * torch.tanh(s / cap)
    s = s.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.softmax(s, -1) @ v.double()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_dsl_caps_the_scaled_dot_product_first():
    spec = af.attention(af.alibi(), af.causal(), af.softcap(5.0))
    ops = [line.split("=")[1].split()[0] for line in spec.ir().splitlines() if " = attn." in line]
    assert ops.index("attn.softcap") == ops.index("attn.scores") + 1


def test_softcap_in_hand_written_ir_applies_where_the_ir_puts_it():
    """After ALiBi (which the DSL never produces): the kernels must follow the IR."""
    ir = """
    attn.variant @late_cap(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
      %s = attn.scores %q, %k
      %a = attn.alibi %s
      %c = attn.softcap %a {cap = 1.0 : f64}
      %m = attn.mask %c [#attn.causal]
      %p = attn.softmax %m
      %o = attn.pv %p, %v
      attn.yield %o
    }
    """
    q, k, v = make_qkv(1, 2, 2, 30, 30, 16, seed=5)
    fn = af.compile(ir)
    out = fn(q * 3, k, v)
    ref = af.reference_attention(ir, q * 3, k, v)
    assert_close_to_reference(out, ref, q.dtype)
    early = af.reference_attention(af.attention(af.softcap(1.0), af.alibi(), af.causal()), q * 3, k, v)
    assert (ref - early).abs().max() > 1e-2, "the two orders should differ: the test is too weak"


@pytest.mark.parametrize("cap", [0, -1.0, float("inf"), float("nan"), "2", True])
def test_bad_cap(cap):
    with pytest.raises(CompositionError, match="softcap: cap must be a positive finite number"):
        af.softcap(cap)


def test_softcap_appears_once():
    with pytest.raises(CompositionError, match="softcap appears 2 times"):
        af.attention(af.softcap(1.0), af.softcap(2.0))
