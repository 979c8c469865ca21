"""Calls under functorch transforms (`torch.func`): `grad` and `vjp` give the gradients eager
autograd gives, `vmap` folds the mapped dimension into the batch (and is differentiated like a
loop), and what is not supported (a vmapped backward, vmap with call-time data, forward-mode
derivatives) is an `ArgumentError`, never a launcher's error or a silent zero."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to_reference

import attnfuse as af
from attnfuse.errors import ArgumentError

pytestmark = pytest.mark.interpreter

SPECS = {
    "causal": af.attention(af.causal()),
    "rope": af.attention(af.rope(), af.causal()),
    "relu": af.attention(af.relu(), af.sliding_window(8)),
}


def draw(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def qkv(batch: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return draw(batch, 4, 24, 16, seed=0), draw(batch, 2, 24, 16, seed=1), draw(batch, 2, 24, 16, seed=2)


@pytest.mark.parametrize("name", list(SPECS))
def test_grad_equals_eager_autograd(name):
    fn = af.compile(SPECS[name])
    q, k, v = qkv()
    weight = draw(*q.shape, seed=3)

    def loss(q, k, v):
        return (fn(q, k, v) * weight).sum()
    dq, dk, dv = torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    loss(*leaves).backward()
    for got, leaf in zip((dq, dk, dv), leaves):
        assert torch.equal(got, leaf.grad)


def test_grad_of_a_bias_and_vjp_with_the_lse():
    spec = af.attention(af.additive_bias(), af.causal())
    fn = af.compile(spec)
    q, k, v = qkv()
    bias = draw(1, 4, 24, 24, seed=4)
    dbias = torch.func.grad(lambda b: fn(q, k, v, bias=b).square().sum())(bias)
    leaf = bias.clone().requires_grad_(True)
    fn(q, k, v, bias=leaf).square().sum().backward()
    assert torch.equal(dbias, leaf.grad)

    (out, lse), pullback = torch.func.vjp(lambda q: fn(q, k, v, bias=bias, return_lse=True), q)
    cot_out, cot_lse = draw(*out.shape, seed=5), draw(*lse.shape, seed=6)
    (dq,) = pullback((cot_out, cot_lse))
    leaf = q.clone().requires_grad_(True)
    out2, lse2 = fn(leaf, k, v, bias=bias, return_lse=True)
    torch.autograd.backward((out2, lse2), (cot_out, cot_lse))
    assert torch.equal(out, out2) and torch.equal(dq, leaf.grad)


@pytest.mark.parametrize("k_dim", [0, None])
def test_vmap_folds_the_mapped_dimension_into_the_batch(k_dim):
    spec = SPECS["rope"]
    fn = af.compile(spec)
    q, k, v = qkv(batch=2)
    qs = torch.stack([q, 2 * q, -q])
    ks = torch.stack([k, k.flip(-1), 0.5 * k]) if k_dim == 0 else k
    out, lse = torch.func.vmap(lambda q, k: fn(q, k, v, return_lse=True), in_dims=(0, k_dim))(qs, ks)
    assert out.shape == (3, *q.shape)
    for i in range(3):
        k_i = ks[i] if k_dim == 0 else k
        expected, expected_lse = fn(qs[i], k_i, v, return_lse=True)
        assert_close_to_reference(out[i], expected.double(), torch.float32)
        assert_close_to_reference(lse[i], expected_lse.double(), torch.float32)
    # The mapped dimension may sit anywhere.
    moved = torch.func.vmap(lambda q: fn(q, k, v), in_dims=2)(qs.movedim(0, 2))
    for i in range(3):
        assert_close_to_reference(moved[i], fn(qs[i], k, v).double(), torch.float32)


def test_vmap_is_differentiated_like_a_loop():
    """A vmapped call is part of the autograd graph (eager backward, and grad around vmap),
    and vmaps nest: each gives what a per-sample loop gives."""
    fn = af.compile(SPECS["rope"])
    q, k, v = qkv()
    qs = torch.stack([q, 0.5 * q, -q])
    weight = draw(3, *q.shape, seed=8)

    def looped(qs):
        return torch.stack([fn(qs[i], k, v) for i in range(3)])
    leaf = qs.clone().requires_grad_(True)
    ((torch.func.vmap(lambda q: fn(q, k, v))(leaf) * weight).sum() + leaf.sum()).backward()
    expected = qs.clone().requires_grad_(True)
    ((looped(expected) * weight).sum() + expected.sum()).backward()
    assert_close_to_reference(leaf.grad, expected.grad.double(), torch.float32)

    grads = torch.func.grad(lambda qs: (torch.func.vmap(lambda q: fn(q, k, v))(qs) * weight).sum())(qs)
    assert_close_to_reference(grads, (expected.grad - 1).double(), torch.float32)

    nested = torch.func.vmap(torch.func.vmap(lambda q: fn(q, k, v)))(torch.stack([qs, -qs]))
    assert_close_to_reference(nested[0], looped(qs).double(), torch.float32)
    assert_close_to_reference(nested[1], looped(-qs).double(), torch.float32)


def test_a_gradient_through_the_lse_alone():
    """The output takes no gradient (its incoming gradient is None): as eager autograd."""
    fn = af.compile(SPECS["causal"])
    q, k, v = qkv()
    dq = torch.func.grad(lambda q: fn(q, k, v, return_lse=True)[1].sum())(q)
    leaf = q.clone().requires_grad_(True)
    fn(leaf, k, v, return_lse=True)[1].sum().backward()
    assert torch.equal(dq, leaf.grad)


def test_unsupported_transforms_are_argument_errors():
    fn = af.compile(SPECS["causal"])
    q, k, v = qkv()
    with pytest.raises(ArgumentError, match="vmap over the backward"):
        torch.func.jacrev(lambda q: fn(q, k, v).sum(-1))(q)
    bias = draw(1, 4, 24, 24, seed=7)
    fn_bias = af.compile(af.attention(af.additive_bias()))
    with pytest.raises(ArgumentError, match="vmap over an AttnFuse call with call-time data"):
        torch.func.vmap(lambda q: fn_bias(q, k, v, bias=bias))(torch.stack([q, q]))
    with pytest.raises(af.AttnFuseError, match="second derivatives"):
        torch.func.grad(lambda q: torch.func.grad(lambda q: fn(q, k, v).sum())(q).sum())(q)
    with pytest.raises(ArgumentError, match="vmap over the backward"):  # per-sample gradients
        torch.func.vmap(torch.func.grad(lambda q: fn(q, k, v).sum()))(torch.stack([q, q]))
    weights = draw(2, *q.shape, seed=9)
    with pytest.raises(ArgumentError, match="vmap over the backward"):  # only the cotangent batched
        torch.func.vmap(torch.func.grad(lambda q, w: (fn(q, k, v) * w).sum()), in_dims=(None, 0))(q, weights)
    with pytest.raises(ArgumentError, match="rotate_keys under torch.func"):
        torch.func.vmap(af.compile(SPECS["rope"]).rotate_keys)(torch.stack([k, k]))
    for forward_mode in (lambda: torch.func.jvp(lambda q: fn(q, k, v), (q,), (torch.ones_like(q),)),
                         lambda: torch.func.jacfwd(lambda q: fn(q, k, v).sum())(q)):
        with pytest.raises(ArgumentError, match="forward-mode derivatives"):
            forward_mode()
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level(), pytest.raises(ArgumentError, match="forward-mode derivatives"):
        fn(fwAD.make_dual(q, torch.ones_like(q)), k, v)


def test_transforms_inside_a_traced_function_are_refused():
    """The operators a traced call goes through have no functorch rules: a clear error, not
    torch's, and never a zero tangent."""
    fn = af.compile(SPECS["causal"])
    q, k, v = qkv()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: torch.func.grad(lambda q: fn(q, k, v).sum())(q), backend="eager")
    with pytest.raises(Exception) as info:
        compiled(q)
    chain, error = [], info.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, ArgumentError) and "inside a function that torch.compile" in str(e)
               for e in chain), chain


def test_functionalization_takes_the_operators():
    """`torch.func.functionalize` is no derivative: a call under it (eagerly, and traced by
    `make_fx(functionalize(f))`, PyTorch's recipe for a functional graph) goes through the pure
    operators and computes what the eager call computes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    spec = SPECS["rope"]
    q, k, v = qkv()

    def f(q, k, v):
        return spec(q, k, v) * 2
    expected = f(q, k, v)
    assert torch.equal(torch.func.functionalize(f)(q, k, v), expected)
    graph = make_fx(torch.func.functionalize(f), tracing_mode="fake")(q, k, v)
    assert any("attnfuse.attention" in str(node.target) for node in graph.graph.nodes)
    assert_close_to_reference(graph(q, k, v), expected.double(), torch.float32)
