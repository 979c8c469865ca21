"""The fp64 reference is what every kernel is judged against, so it is checked here against
independent formulations: torch's SDPA with an explicit mask, Hugging Face's `rotate_half`
RoPE (half-split pairs) and Meta's complex-number RoPE (interleaved pairs)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_qkv

import attnfuse as af
from attnfuse.errors import ArgumentError


def hf_rope(x: torch.Tensor, pos: torch.Tensor, theta: float, r: int) -> torch.Tensor:
    """Llama/NeoX as in Hugging Face transformers: cos/sin repeated over the two halves."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    freqs = pos.double()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    xr, rest = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2 :]
    rotated = xr * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([rotated, rest], dim=-1)


def meta_rope(x: torch.Tensor, pos: torch.Tensor, theta: float, r: int) -> torch.Tensor:
    """GPT-J / Meta's original Llama: adjacent pairs as complex numbers times e^(i pos f)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, r, 2, dtype=torch.float64)[: r // 2] / r))
    freqs = torch.polar(torch.ones(len(pos), r // 2, dtype=torch.float64), pos.double()[:, None] * inv_freq)
    xr, rest = x[..., :r], x[..., r:]
    xc = torch.view_as_complex(xr.reshape(*xr.shape[:-1], r // 2, 2).contiguous())
    rotated = torch.view_as_real(xc * freqs).flatten(-2)
    return torch.cat([rotated, rest], dim=-1)


def sdpa_reference(q, k, v, keep, scale):
    """Masked attention through torch SDPA in fp64 (rows with no kept key left out)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)


def semantic_keep(n_q: int, n_k: int, causal: bool, window: int | None) -> torch.Tensor:
    q_pos = torch.arange(n_q)[:, None] + (n_k - n_q)
    k_pos = torch.arange(n_k)[None, :]
    keep = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal:
        keep &= k_pos <= q_pos
    if window is not None:
        keep &= (q_pos - k_pos).abs() < window
    return keep


@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
@pytest.mark.parametrize("d, r", [(32, None), (64, 32), (24, 8)], ids=["d32", "d64-r32", "d24-r8"])
@pytest.mark.parametrize("theta", [10000.0, 500000.0], ids=["1e4", "5e5"])
@pytest.mark.parametrize("nq, nk", [(40, 40), (7, 50)], ids=["square", "decode-like"])
def test_reference_matches_independent_rope_and_sdpa(interleaved, d, r, theta, nq, nk):
    spec = af.attention(af.rope(theta=theta, rotary_dim=r, interleaved=interleaved), af.causal())
    q, k, v = (t.double() for t in make_qkv(2, 4, 2, nq=nq, nk=nk, d=d, seed=d + nq))
    rope = meta_rope if interleaved else hf_rope
    width = r or d
    qr = rope(q, torch.arange(nq) + nk - nq, theta, width)
    kr = rope(k, torch.arange(nk), theta, width)
    expected = sdpa_reference(qr, kr, v, semantic_keep(nq, nk, True, None), 1 / math.sqrt(d))
    # The reference's angle is an fp32 product (the rotation is computed in fp32): ~1e-6 here.
    torch.testing.assert_close(af.reference_attention(spec, q, k, v), expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "causal, window", [(False, None), (True, None), (False, 5), (True, 5)], ids=["none", "causal", "window", "both"]
)
@pytest.mark.parametrize("nq, nk", [(30, 30), (10, 45), (45, 10)], ids=["square", "nq<nk", "nq>nk"])
def test_reference_masks_match_sdpa(causal, window, nq, nk):
    blocks = ([af.causal()] if causal else []) + ([af.sliding_window(window)] if window else [])
    spec = af.attention(*blocks, af.scaled_dot_product(0.3))
    q, k, v = (t.double() for t in make_qkv(1, 2, nq=nq, nk=nk, d=16, seed=nq * nk))
    keep = semantic_keep(nq, nk, causal, window)
    out, lse = af.reference_attention(spec, q, k, v, return_lse=True)
    rows = keep.any(dim=1)
    expected = sdpa_reference(q, k, v, keep, 0.3)
    torch.testing.assert_close(out[:, :, rows], expected[:, :, rows], rtol=0, atol=1e-12)
    assert (out[:, :, ~rows] == 0).all()
    assert torch.isneginf(lse[:, :, ~rows]).all()
    scores = 0.3 * q @ k.transpose(-1, -2)
    expected_lse = torch.logsumexp(scores.masked_fill(~keep, float("-inf")), dim=-1)
    torch.testing.assert_close(lse[:, :, rows].double(), expected_lse[:, :, rows], rtol=0, atol=1e-5)


def test_reference_position_zero_is_identity():
    """At position 0 the rotation is the identity: one query against one key."""
    spec = af.attention(af.rope())
    q, k, v = (t.double() for t in make_qkv(1, 1, nq=1, nk=1, d=16))
    torch.testing.assert_close(af.reference_attention(spec, q, k, v), v, rtol=0, atol=1e-12)


def test_gradient_errors_are_norm_relative_with_a_floor_at_dv():
    from attnfuse.runtime.reference import gradient_errors

    ref = {"q": torch.full((4,), 2.0, dtype=torch.float64), "v": torch.full((4,), 1.0, dtype=torch.float64),
           "bias": torch.zeros(4, dtype=torch.float64)}
    got = {"q": ref["q"] * 1.01, "v": ref["v"].float(), "bias": torch.full((4,), 1e-3)}
    errors = gradient_errors(got, ref)
    assert errors["q"] == pytest.approx(0.01)
    assert errors["v"] == 0.0
    # ||bias - 0|| = 2e-3 is measured against 1e-3 * ||dv|| = 2e-3, not against ||0||.
    assert errors["bias"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["sigmoid", "document"])
def test_reference_without_keys_outputs_zero(name):
    """Nk = 0: every row keeps nothing and outputs 0 (sigmoid's default bias -ln(Nk) and a
    query's document are then undefined, and must not be needed)."""
    q, k, v = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 0, 8), torch.randn(2, 2, 0, 8)
    spec = af.attention(af.sigmoid()) if name == "sigmoid" else af.attention(af.document())
    data = {"doc_ids": torch.zeros(0, dtype=torch.int64)} if name == "document" else {}
    out = af.reference_attention(spec, q, k, v, **data)
    assert out.shape == (2, 2, 3, 8) and (out == 0).all()
    fn = af.compile(spec)
    assert (fn(q, k, v, **data) == 0).all()


POSITIONS_IR = """
attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value, %qp : !attn.positions<query>) -> !attn.output {
  %qr = attn.rope %q at %qp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<query>
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}"""


@pytest.mark.parametrize("case,call,fragment", [
    ("group", lambda t: (af.attention(), t(1, 3, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), {}),
     "query heads (3) must be a multiple of key/value heads (2)"),
    ("3-D q", lambda t: (af.attention(), t(3, 8, 16), t(1, 3, 8, 16), t(1, 3, 8, 16), {}), "q must be 4-D"),
    ("list q", lambda t: (af.attention(), [0.0], t(1, 1, 8, 16), t(1, 1, 8, 16), {}), "q must be a torch.Tensor"),
    ("v length", lambda t: (af.attention(), t(1, 1, 8, 16), t(1, 1, 8, 16), t(1, 1, 9, 16), {}),
     "v must have k's sequence length 8"),
    ("int q", lambda t: (af.attention(), t(1, 1, 8, 16).long(), t(1, 1, 8, 16).long(), t(1, 1, 8, 16).long(), {}),
     "q has dtype torch.int64"),
    ("bias", lambda t: (af.attention(af.additive_bias()), t(1, 1, 8, 16), t(1, 1, 8, 16), t(1, 1, 8, 16),
                        {"bias": t(3, 3)}), "bias"),
    ("positions", lambda t: (af.attention(af.rope()), t(1, 1, 8, 16), t(1, 1, 8, 16), t(1, 1, 8, 16),
                             {"q_positions": torch.arange(9)}), "q_positions"),
    ("odd rope", lambda t: (af.attention(af.rope()), t(1, 1, 8, 15), t(1, 1, 8, 15), t(1, 1, 8, 15), {}),
     "the head dim 15 is odd"),
    ("undeclared data", lambda t: (af.attention(), t(1, 1, 8, 16), t(1, 1, 8, 16), t(1, 1, 8, 16),
                                   {"doc_ids": torch.zeros(8, dtype=torch.int32)}), "doc_ids= given"),
    ("declared positions", lambda t: (POSITIONS_IR, t(1, 1, 8, 16), t(1, 1, 8, 16), t(1, 1, 8, 16), {}),
     "pass q_positions="),
])
def test_reference_checks_its_inputs_as_a_call_does(case, call, fragment):
    """`af.reference_attention` refuses what a compiled call refuses, with an `ArgumentError`
    naming it, before reading anything (float64 inputs are its own and allowed)."""
    source, q, k, v, data = call(lambda *shape: torch.randn(*shape, dtype=torch.float64))
    with pytest.raises(ArgumentError) as err:
        af.reference_attention(source, q, k, v, **data)
    assert fragment in str(err.value), str(err.value)
