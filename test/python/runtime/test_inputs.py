"""Call-time checks: each bad tensor or keyword raises an AttnFuseError naming the argument;
empty problems are well defined; the backward pass fails loudly."""

from __future__ import annotations

import pytest
import torch
from conftest import make_qkv

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime.reference import reference_gradients

CAUSAL = af.attention(af.causal())
ROPE = af.attention(af.rope(), af.causal())


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# Each case: (spec, q, k, v, regex the message must match).
BAD_INPUTS = {
    "q-rank-3": lambda: (CAUSAL, t(2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), r"\bq\b.*4-D"),
    "k-rank-5": lambda: (CAUSAL, t(1, 2, 8, 16), t(1, 2, 8, 16, 1), t(1, 2, 8, 16), r"\bk\b.*4-D"),
    "v-rank-2": lambda: (CAUSAL, t(1, 2, 8, 16), t(1, 2, 8, 16), t(8, 16), r"\bv\b.*4-D"),
    "q-not-tensor": lambda: (CAUSAL, t(1, 2, 8, 16).tolist(), t(1, 2, 8, 16), t(1, 2, 8, 16), r"\bq\b.*Tensor"),
    "v-numpy": lambda: (CAUSAL, t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16).numpy(), r"\bv\b.*Tensor"),
    "batch-k": lambda: (CAUSAL, t(2, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), r"batch"),
    "batch-v": lambda: (CAUSAL, t(2, 2, 8, 16), t(2, 2, 8, 16), t(1, 2, 8, 16), r"batch"),
    "head-dim-qk": lambda: (CAUSAL, t(1, 2, 8, 16), t(1, 2, 8, 32), t(1, 2, 8, 16), r"\bk\b.*head dim"),
    "v-heads": lambda: (CAUSAL, t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 1, 8, 16), r"\bv\b.*heads"),
    "v-seq": lambda: (CAUSAL, t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 9, 16), r"\bv\b.*sequence length"),
    "gqa-3-of-2": lambda: (CAUSAL, t(1, 3, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), r"heads"),
    "gqa-2-of-4": lambda: (CAUSAL, t(1, 2, 8, 16), t(1, 4, 8, 16), t(1, 4, 8, 16), r"heads"),
    "gqa-kv-0": lambda: (CAUSAL, t(1, 2, 8, 16), t(1, 0, 8, 16), t(1, 0, 8, 16), r"heads"),
    "mixed-dtype-k": lambda: (
        CAUSAL, t(1, 2, 8, 16), t(1, 2, 8, 16, dtype=torch.float16), t(1, 2, 8, 16), r"dtype"
    ),
    "mixed-dtype-v": lambda: (
        CAUSAL, t(1, 2, 8, 16, dtype=torch.bfloat16), t(1, 2, 8, 16, dtype=torch.bfloat16),
        t(1, 2, 8, 16, dtype=torch.float16), r"dtype",
    ),
    "int-dtype": lambda: (
        CAUSAL, torch.ones(1, 2, 8, 16, dtype=torch.int32), torch.ones(1, 2, 8, 16, dtype=torch.int32),
        torch.ones(1, 2, 8, 16, dtype=torch.int32), r"\bq\b.*dtype",
    ),
    "fp64": lambda: (
        CAUSAL, t(1, 2, 8, 16, dtype=torch.float64), t(1, 2, 8, 16, dtype=torch.float64),
        t(1, 2, 8, 16, dtype=torch.float64), r"\bq\b.*dtype",
    ),
    "fp64-k-only": lambda: (
        CAUSAL, t(1, 2, 8, 16), t(1, 2, 8, 16, dtype=torch.float64), t(1, 2, 8, 16), r"\bk\b.*dtype"
    ),
    "bool": lambda: (
        CAUSAL, torch.ones(1, 2, 8, 16, dtype=torch.bool), torch.ones(1, 2, 8, 16, dtype=torch.bool),
        torch.ones(1, 2, 8, 16, dtype=torch.bool), r"dtype",
    ),
    "head-dim-264": lambda: (CAUSAL, t(1, 1, 4, 264), t(1, 1, 4, 264), t(1, 1, 4, 16), r"head dim.*256"),
    "v-head-dim-512": lambda: (CAUSAL, t(1, 1, 4, 16), t(1, 1, 4, 16), t(1, 1, 4, 512), r"v head dim.*256"),
    "head-dim-0": lambda: (CAUSAL, t(1, 1, 4, 0), t(1, 1, 4, 0), t(1, 1, 4, 16), r"head dim"),
    "v-head-dim-0": lambda: (CAUSAL, t(1, 1, 4, 16), t(1, 1, 4, 16), t(1, 1, 4, 0), r"v head dim"),
    "rotary-dim-gt-d": lambda: (
        af.attention(af.rope(rotary_dim=64)), t(1, 1, 8, 32), t(1, 1, 8, 32), t(1, 1, 8, 32), r"rope.*rotary_dim"
    ),
    "rotary-dim-gt-d-by-2": lambda: (
        af.attention(af.rope(rotary_dim=34), af.causal()), t(1, 1, 8, 32), t(1, 1, 8, 32), t(1, 1, 8, 32),
        r"rope.*rotary_dim",
    ),
    "odd-d-with-rope": lambda: (ROPE, t(1, 1, 8, 33), t(1, 1, 8, 33), t(1, 1, 8, 33), r"rope.*odd"),
    "device-mismatch": lambda: (
        CAUSAL, t(1, 2, 8, 16), torch.empty(1, 2, 8, 16, device="meta"), t(1, 2, 8, 16), r"device"
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_inputs(name):
    spec, q, k, v, pattern = BAD_INPUTS[name]()
    with pytest.raises(af.AttnFuseError, match=pattern) as info:
        spec(q, k, v)
    assert isinstance(info.value, ArgumentError)
    # The same through an explicit compile, and with return_lse.
    with pytest.raises(af.AttnFuseError, match=pattern):
        af.compile(spec)(q, k, v, return_lse=True)


def test_bad_inputs_through_tile_ir():
    spec, q, k, v, pattern = BAD_INPUTS["head-dim-qk"]()
    with pytest.raises(af.AttnFuseError, match=pattern):
        af.compile(spec).tile_ir(q, k, v)


@pytest.mark.interpreter
def test_rotary_dim_equal_to_d_is_fine():
    spec = af.attention(af.rope(rotary_dim=32))
    q, k, v = make_qkv(1, 1, nq=8, d=32)
    assert spec(q, k, v).shape == (1, 1, 8, 32)


@pytest.mark.interpreter
def test_odd_d_without_rope_is_fine():
    q, k, v = make_qkv(1, 1, nq=8, d=33)
    out = CAUSAL(q, k, v)
    torch.testing.assert_close(out, af.reference_attention(CAUSAL, q, k, v).float(), rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"bias": torch.zeros(1)}, "bias"),
        ({"block_layout": torch.ones(1, 1, dtype=torch.bool)}, "block_layout"),
        ({"scale": 0.5}, "scale"),
        ({"return_lse": True, "causal": True}, "causal"),
        ({"is_causal": True}, "is_causal"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_unexpected_keyword(kwargs, name):
    q, k, v = make_qkv(1, 1, nq=8, d=16)
    with pytest.raises(af.AttnFuseError, match=name):
        CAUSAL(q, k, v, **kwargs)
    with pytest.raises(af.AttnFuseError, match=name):
        af.compile(CAUSAL)(q, k, v, **kwargs)


def test_positional_return_lse_is_rejected():
    q, k, v = make_qkv(1, 1, nq=8, d=16)
    with pytest.raises(TypeError):
        af.compile(CAUSAL)(q, k, v, True)


# --------------------------------------------------------------------------------------------
# Empty problems
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [CAUSAL, ROPE, af.attention(af.sliding_window(3))], ids=["causal", "rope", "window"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_empty_batch(spec, dtype):
    q, k, v = make_qkv(0, 2, nq=8, d=32, dv=16, dtype=dtype)
    out, lse = spec(q, k, v, return_lse=True)
    assert out.shape == (0, 2, 8, 16) and out.dtype == dtype
    assert lse.shape == (0, 2, 8) and lse.dtype == torch.float32


@pytest.mark.parametrize("spec", [CAUSAL, ROPE], ids=["causal", "rope"])
def test_empty_queries(spec):
    q, k, v = make_qkv(2, 2, nq=0, nk=9, d=32, dv=16)
    out, lse = spec(q, k, v, return_lse=True)
    assert out.shape == (2, 2, 0, 16)
    assert lse.shape == (2, 2, 0)


@pytest.mark.parametrize("spec", [CAUSAL, ROPE, af.attention()], ids=["causal", "rope", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_empty_keys_give_zeros_and_neg_inf_lse(spec, dtype):
    q, k, v = make_qkv(2, 4, 2, nq=7, nk=0, d=32, dv=16, dtype=dtype)
    out, lse = spec(q, k, v, return_lse=True)
    assert out.shape == (2, 4, 7, 16) and out.dtype == dtype
    assert (out == 0).all()
    assert lse.shape == (2, 4, 7) and lse.dtype == torch.float32
    assert torch.isneginf(lse).all()
    ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True)
    assert (ref == 0).all() and torch.isneginf(ref_lse).all()


def test_empty_inputs_are_still_checked():
    q, k, v = make_qkv(0, 2, nq=8, d=32)
    with pytest.raises(af.AttnFuseError, match="head dim"):
        CAUSAL(q, k[..., :16], v)
    q, k, v = make_qkv(1, 1, nq=8, nk=0, d=33)
    with pytest.raises(af.AttnFuseError, match="rope"):
        ROPE(q, k, v)


# --------------------------------------------------------------------------------------------
# Backward: gradients reach exactly the inputs that require them
# --------------------------------------------------------------------------------------------


@pytest.mark.interpreter
@pytest.mark.parametrize("which", ["q", "k", "v", "all"])
def test_backward_reaches_exactly_the_inputs_that_require_grad(which):
    """Gradients flow to the inputs that ask for them, and to nothing else."""
    q, k, v = make_qkv(1, 2, nq=16, d=16)
    tensors = {"q": q, "k": k, "v": v}
    wanted = ("q", "k", "v") if which == "all" else (which,)
    for name in wanted:
        tensors[name].requires_grad_(True)
    out = ROPE(tensors["q"], tensors["k"], tensors["v"])
    assert out.requires_grad
    out.sum().backward()
    ref = reference_gradients(ROPE, q, k, v, torch.ones_like(out))
    for name, tensor in tensors.items():
        if name in wanted:
            torch.testing.assert_close(tensor.grad.double(), ref[name], atol=1e-5, rtol=1e-4)
        else:
            assert tensor.grad is None


@pytest.mark.interpreter
def test_backward_through_the_lse_output():
    """The log-sum-exp is differentiable: d lse_i / d s_ij = p_ij."""
    q, k, v = make_qkv(1, 2, nq=16, d=16, requires_grad=True)
    out, lse = CAUSAL(q, k, v, return_lse=True)
    (out.float().sum() + lse.sum()).backward()
    ref = reference_gradients(CAUSAL, q, k, v, torch.ones_like(out), grad_lse=torch.ones_like(lse))
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        torch.testing.assert_close(tensor.grad.double(), ref[name], atol=1e-5, rtol=1e-4)


@pytest.mark.interpreter
def test_autograd_grad():
    q, k, v = make_qkv(1, 2, nq=16, d=16, requires_grad=True)
    out = CAUSAL(q, k, v)
    (dq,) = torch.autograd.grad(out.sum(), (q,))
    ref = reference_gradients(CAUSAL, q, k, v, torch.ones_like(out))
    torch.testing.assert_close(dq.double(), ref["q"], atol=1e-5, rtol=1e-4)


