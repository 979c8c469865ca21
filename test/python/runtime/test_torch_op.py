"""AttnFuse inside torch.compile and torch.export (the `torch.ops.attnfuse` operators).

`fullgraph=True` fails on any graph break, so each compiled test also proves that the call
traced into the graph as one operator. Values and gradients are compared with the eager call
(itself checked against the float64 reference elsewhere) and with the reference here.
Most tests compile with the `aot_eager` backend (Dynamo, fake tensors and AOTAutograd, the
parts that see the operators), one with Inductor, whose C++ compile is slow on a CPU machine.
"""

from __future__ import annotations

import gc

import pytest
import torch

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime import torch_op

pytestmark = pytest.mark.interpreter


def qkv(b=1, hq=2, hkv=2, nq=24, nk=24, d=16, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g)
    k = torch.randn(b, hkv, nk, d, generator=g)
    v = torch.randn(b, hkv, nk, d, generator=g)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def grads_of(loss_fn, *tensors):
    for t in tensors:
        t.grad = None
    loss = loss_fn(*tensors)
    loss.backward()
    return loss.detach(), [t.grad.clone() for t in tensors]


def close(a, b, tol=2e-5):
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_rope_causal_forward_and_backward_match_eager_and_reference():
    fn = af.compile(af.attention(af.rope(), af.causal()))
    q, k, v = qkv(hq=4, hkv=2)
    w = torch.randn(1, 4, 24, 16)

    def loss(q, k, v):
        return (fn(q, k, v) * w).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    value, grads = grads_of(compiled, q, k, v)
    eager_value, eager_grads = grads_of(loss, q, k, v)
    assert close(value, eager_value)
    for g, e in zip(grads, eager_grads):
        assert close(g, e)
    ref = af.reference_attention(fn.spec, *(t.detach().double() for t in (q, k, v)))
    assert close(value.double(), (ref * w.double()).sum(), 1e-5)


def test_compiled_bias_gradient_lse_and_positions():
    spec = af.attention(af.rope(), af.additive_bias(), af.causal())
    fn = af.compile(spec)
    q, k, v = qkv()
    bias = torch.randn(1, 2, 24, 24, requires_grad=True)
    positions = torch.arange(24) * 3

    def loss(q, k, v, bias):
        out, lse = fn(q, k, v, bias=bias, q_positions=positions, k_positions=positions,
                      return_lse=True)
        return out.square().sum() + lse.sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    value, grads = grads_of(compiled, q, k, v, bias)
    eager_value, eager_grads = grads_of(loss, q, k, v, bias)
    assert close(value, eager_value)
    for g, e in zip(grads, eager_grads):
        assert close(g, e)


def test_compiled_block_sparse_and_relu():
    layout = torch.tensor([[True, False], [True, True]])
    fn = af.compile(af.attention(af.block_sparse(16), af.relu()))
    q, k, v = qkv(nq=32, nk=32)

    def loss(q, k, v):
        return fn(q, k, v, block_layout=layout).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    value, grads = grads_of(compiled, q, k, v)
    eager_value, eager_grads = grads_of(loss, q, k, v)
    assert close(value, eager_value)
    for g, e in zip(grads, eager_grads):
        assert close(g, e)


def test_compiled_documents_with_block_sparse():
    """Two data keywords through the operators' data list: both filters hold when traced."""
    layout = torch.tensor([[True, False], [True, True]])
    doc_ids = torch.tensor([0] * 10 + [1] * 17 + [-1] * 5)
    fn = af.compile(af.attention(af.block_sparse(16), af.document(), af.causal()))
    q, k, v = qkv(nq=32, nk=32)

    def loss(q, k, v):
        return fn(q, k, v, block_layout=layout, doc_ids=doc_ids).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    value, grads = grads_of(compiled, q, k, v)
    eager_value, eager_grads = grads_of(loss, q, k, v)
    assert close(value, eager_value)
    for g, e in zip(grads, eager_grads):
        assert close(g, e)


def test_compiled_model_with_inductor_trains_like_eager():
    """A small attention block (projections + AttnFuse) under Inductor, fullgraph."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.qkv = torch.nn.Linear(32, 3 * 32)
            self.attn = af.compile(af.attention(af.rope(), af.causal()))

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, 2, 16).permute(2, 0, 3, 1, 4)
            return self.attn(q, k, v).transpose(1, 2).reshape(b, n, 32)

    model = Block()
    x = torch.randn(2, 16, 32)
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    out.square().sum().backward()
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    eager = model(x)
    eager.square().sum().backward()
    assert close(out, eager)
    for g, p in zip(compiled_grads, model.parameters()):
        assert close(g, p.grad)


def test_dynamic_shapes_recompile_nothing_per_length():
    fn = af.compile(af.attention(af.causal()))
    compiled = torch.compile(lambda q, k, v: fn(q, k, v), fullgraph=True, backend="aot_eager",
                             dynamic=True)
    for n in (16, 24, 40):
        q, k, v = qkv(nq=n, nk=n, grad=False)
        assert close(compiled(q, k, v), fn(q, k, v))


def test_export_traces_one_operator_and_runs():
    fn = af.compile(af.attention(af.alibi(), af.sliding_window(8), af.causal()))

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return fn(q, k, v)

    q, k, v = qkv(grad=False)
    exported = torch.export.export(Attention(), (q, k, v))
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert "attnfuse.attention.default" in targets
    assert close(exported.module()(q, k, v), fn(q, k, v))


def test_exported_program_saved_and_loaded_runs_without_the_original_variant(tmp_path):
    """The operator key carries the program: a loaded graph compiles it again."""
    fn = af.compile(af.attention(af.softcap(5.0), af.causal()))

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return fn(q, k, v)

    q, k, v = qkv(grad=False)
    expected = fn(q, k, v)
    path = tmp_path / "attention.pt2"
    torch.export.save(torch.export.export(Attention(), (q, k, v)), path)
    keys = set(fn._operator_keys.values())
    del fn, Attention
    gc.collect()
    assert not keys & set(torch_op._variants.keys())  # nothing registered under the key now
    loaded = torch.export.load(path)
    assert close(loaded.module()(q, k, v), expected)


def test_traced_mistakes_raise_while_tracing():
    """The fake implementation checks shapes, so a bad call fails while tracing, naming it."""
    fn = af.compile(af.attention(af.causal()))
    q, _k, _v = qkv(grad=False)
    k, v = torch.randn(1, 3, 24, 16), torch.randn(1, 3, 24, 16)
    compiled = torch.compile(lambda q, k, v: fn(q, k, v), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="multiple of key/value heads"):
        compiled(q, k, v)
    with pytest.raises(ArgumentError, match="q_positions"):
        fn._call_operator(q, k, v, False, None, None, torch.arange(24), None)


def test_eager_calls_do_not_go_through_the_operator(monkeypatch):
    """The eager path stays the direct one (the operators cost dispatcher time per call)."""
    fn = af.compile(af.attention(af.causal()))
    q, k, v = qkv(grad=False)

    def fail(*args, **kwargs):
        raise AssertionError("eager call went through the operator")

    monkeypatch.setattr(fn, "_call_operator", fail)
    fn(q, k, v)


@pytest.mark.parametrize("normalizer", [af.relu, af.sigmoid])
def test_operators_of_a_normalizer_without_lse_pass_opcheck(normalizer):
    """Their second output is zeros, not the buffer the kernels leave unwritten: opcheck runs
    the operator several ways and compares the outputs (it failed, the lse differing from
    call to call), for the plain and the cache operator alike."""
    fn = af.compile(af.attention(normalizer(), af.causal()))
    q, k, v = qkv(hq=4, hkv=2, grad=False)
    key = fn._operator_keys[(False, False)]
    data = torch_op.data_list({})
    torch.library.opcheck(torch.ops.attnfuse.attention.default, (key, q, k, v, None, data, None, None, False))
    stale = torch.full((1 << 12,), float("nan"))  # freed memory a new buffer may reuse
    del stale
    out, lse = torch.ops.attnfuse.attention(key, q, k, v, None, data, None, None, False)
    assert torch.equal(lse, torch.zeros_like(lse))
    lens = torch.tensor([20], dtype=torch.int32)
    torch.library.opcheck(torch.ops.attnfuse.attention_cache.default,
                          (key, q[:, :, -3:], k, v, lens, None, None, data, None, None))


@pytest.mark.parametrize("layout", ["contiguous", "model"])
def test_operators_pass_torch_library_opcheck(layout):
    """PyTorch's own checks of a custom operator: schema, fake kernel against the real one
    (shapes, strides, dtypes), autograd registration, AOT dispatch. `model`: q, k, v as a
    model's `[B, N, H, D]` projections viewed as `[B, H, N, D]`, with a narrower v, so the
    output and the gradients take their operands' memory order (`empty_in_layout_of`) in the
    fake kernels as in the real ones."""
    fn = af.compile(af.attention(af.rope(), af.additive_bias(), af.causal()))
    q, k, v = qkv(hq=4, hkv=2)
    if layout == "model":
        q, k = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k))
        v = torch.randn(1, 24, 2, 8).transpose(1, 2).requires_grad_()
    bias = torch.randn(1, 1, 24, 24, requires_grad=True)
    key = fn._operator_keys[(False, False)]
    data = torch_op.data_list({})  # no layout, no document ids
    torch.library.opcheck(torch.ops.attnfuse.attention.default,
                          (key, q, k, v, bias, data, None, None, True))
    out, lse = torch.ops.attnfuse.attention(key, q, k, v, bias, data, None, None, True)
    grad_out = torch.randn_like(out)
    torch.library.opcheck(torch.ops.attnfuse.attention_backward.default,
                          (key, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                           grad_out, torch.randn_like(lse), bias.detach(), data, None, None, True))


@pytest.mark.parametrize("operand,bad", [
    ("lse", lambda lse: lse[..., :-1]),                  # a row short: the kernels read past it
    ("lse", lambda lse: lse.half()),
    ("out", lambda out: out[:, :, :-1]),
    ("grad_out", lambda g: g.unsqueeze(0)),
    ("grad_out", lambda g: g.double()),
    ("grad_lse", lambda g: g[:, :1]),
])
def test_backward_operator_checks_its_operands(operand, bad):
    """`attnfuse::attention_backward` called directly (an exported graph's or a user's call,
    not autograd's) refuses an output, lse or gradient whose shape or dtype is not the
    problem's, before any kernel reads it."""
    fn = af.compile(af.attention(af.causal()))
    q, k, v = (t.detach() for t in qkv(hq=4, hkv=2))
    key = fn._operator_keys[(False, False)]
    data = torch_op.data_list({})
    out, lse = torch.ops.attnfuse.attention(key, q, k, v, None, data, None, None, True)
    operands = {"out": out, "lse": lse, "grad_out": torch.randn_like(out), "grad_lse": torch.randn_like(lse)}
    operands[operand] = bad(operands[operand])
    with pytest.raises(af.AttnFuseError, match=rf"^{operand} must"):
        torch.ops.attnfuse.attention_backward(key, q, k, v, operands["out"], operands["lse"], operands["grad_out"],
                                              operands["grad_lse"], None, data, None, None, False)


def test_rotate_keys_compiles_and_matches_eager():
    """`CompiledAttention.rotate_keys` (keys rotated once, as a KV cache stores them) under
    fullgraph compile, forward and backward, and its operator under opcheck."""
    fn = af.compile(af.attention(af.rope(scaling=af.llama3_scaling(original_max_position=64)),
                                 af.causal()), rope_placement=("auto", "given"))
    k = torch.randn(2, 2, 24, 16, requires_grad=True)
    positions = torch.arange(24).expand(2, 24) + torch.tensor([[0], [5]])
    w = torch.randn(2, 2, 24, 16)

    def loss(k, positions):
        return (fn.rotate_keys(k, positions) * w).sum()

    value, (grad,) = grads_of(lambda k: torch.compile(loss, fullgraph=True, backend="aot_eager")(k, positions), k)
    eager_value, (eager_grad,) = grads_of(lambda k: loss(k, positions), k)
    assert close(value, eager_value) and close(grad, eager_grad)
    torch.library.opcheck(torch.ops.attnfuse.rotate_keys.default,
                          (10000.0, None, False, [8.0, 1.0, 4.0, 64.0], k, positions))
