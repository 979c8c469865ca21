"""Lazily negated views (PyTorch's negative bit: `z.conj().imag` holds `+z.imag` in memory and
reads as `-z.imag`): every input is read as its values, never as its memory, and a cache written
in place is refused rather than written with the opposite sign."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to_reference

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime.reference import reference_gradients

pytestmark = pytest.mark.interpreter


def negative_view(t: torch.Tensor) -> torch.Tensor:
    """A view whose values equal `t` and whose memory holds `-t` (negative bit set)."""
    view = torch.complex(torch.zeros_like(t), -t).conj().imag
    assert view.is_neg() and torch.equal(view, t)
    return view


def draw(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("which", ["q", "k", "v", "bias"])
def test_a_negative_view_is_read_as_its_values(which):
    spec = af.attention(af.rope(), af.additive_bias(), af.causal())
    tensors = {"q": draw(1, 2, 40, 16, seed=0), "k": draw(1, 1, 40, 16, seed=1),
               "v": draw(1, 1, 40, 16, seed=2), "bias": draw(1, 2, 40, 40, seed=3)}
    grad_out = draw(1, 2, 40, 16, seed=4)
    leaves = {name: (negative_view(t) if name == which else t.clone()).requires_grad_(True)
              for name, t in tensors.items()}
    fn = af.compile(spec)
    out = fn(leaves["q"], leaves["k"], leaves["v"], bias=leaves["bias"])
    out.backward(grad_out)
    doubles = {name: t.double() for name, t in tensors.items()}
    expected = af.reference_attention(spec, doubles["q"], doubles["k"], doubles["v"], bias=doubles["bias"])
    assert_close_to_reference(out.detach(), expected, torch.float32)
    grads = reference_gradients(spec, doubles["q"], doubles["k"], doubles["v"], grad_out.double(),
                                bias=doubles["bias"])
    for name in tensors:
        assert_close_to_reference(leaves[name].grad, grads[name], torch.float32)


def test_rotate_keys_reads_a_negative_view_as_its_values():
    fn = af.compile(af.attention(af.rope(), af.causal()))
    k = draw(1, 2, 24, 16, seed=5)
    assert torch.equal(fn.rotate_keys(negative_view(k)), fn.rotate_keys(k))


def test_append_kv_refuses_a_negative_cache_and_reads_negative_new_keys():
    fn = af.compile(af.attention(af.causal()))
    cache = torch.zeros(1, 1, 8, 16)
    k, v = draw(1, 1, 2, 16, seed=6), draw(1, 1, 2, 16, seed=7)
    lens = torch.tensor([3], dtype=torch.int32)
    with torch.no_grad():
        with pytest.raises(ArgumentError, match="k_cache is a lazily negated view"):
            fn.append_kv(negative_view(cache.clone()), cache.clone(), k, v, lens)
        k_cache, v_cache = cache.clone(), cache.clone()
        fn.append_kv(k_cache, v_cache, negative_view(k), negative_view(v), lens)
    assert torch.equal(k_cache[:, :, 3:5], k) and torch.equal(v_cache[:, :, 3:5], v)


def test_the_operators_receive_negated_views_materialized():
    """Traced graphs call `torch.ops.attnfuse.attention`, whose implementation does no check of
    its own: PyTorch's dispatcher materializes a negated view before a custom operator runs."""
    fn = af.compile(af.attention(af.causal()))
    q, k, v = draw(1, 2, 16, 16, seed=8), draw(1, 2, 16, 16, seed=9), draw(1, 2, 16, 16, seed=10)
    key = fn.operator_key()
    out, _lse = torch.ops.attnfuse.attention(key, negative_view(q), k, v, None, [], None, None, False)
    expected, _lse = torch.ops.attnfuse.attention(key, q, k, v, None, [], None, None, False)
    assert torch.equal(out, expected)
