"""The register()-patched tiny Llama inside torch.compile(fullgraph=True) and torch.export,
forward and backward, against the same model with HF's eager attention (the issue's "done
when": fullgraph compile and export of the patched model).

Without padding (`attention_mask=None`) and with a left-padded batch (the padding reaches the
kernel as `af.document()` ids); `aot_eager` runs Dynamo, fake tensors and AOTAutograd (what
sees the operators) without Inductor's slow C++ compile on a CPU machine.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_transformers import assert_logits_close, batch, llama_pair, mistral_pair  # noqa: E402

from attnfuse.integrations.transformers import attention as hf_attention  # noqa: E402

pytestmark = pytest.mark.interpreter


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Logits(torch.nn.Module):
    """The model's logits as a plain function of the ids and mask (what compile and export
    take)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left_padded"])
def test_patched_llama_compiles_fullgraph_forward_and_backward(padded):
    eager, fused = llama_pair()
    ids, mask = batch(length=10, pad=3 if padded else 0)
    compiled = torch.compile(Logits(fused), fullgraph=True, backend="aot_eager")
    fused.train(), eager.train()  # dropout is 0 in these configs: train mode only records grads
    logits = compiled(ids, mask)
    reference = eager(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert_logits_close(logits.detach(), reference.detach(), keep=mask)
    weight = torch.randn_like(reference) * mask[..., None]
    (logits * weight).sum().backward()
    (reference * weight).sum().backward()
    for (name, p_fused), p_eager in zip(fused.named_parameters(), eager.parameters()):
        scale = p_eager.grad.abs().max().item()
        torch.testing.assert_close(p_fused.grad, p_eager.grad, rtol=1e-4, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("rope,use_cache", [("unfused", False), ("fuse_rope", False), ("fuse_rope", True)])
def test_patched_llama_compiles_with_dynamic_true(rope, use_cache):
    """`torch.compile(dynamic=True)` hands a module's float attributes (HF's `self.scaling`,
    the RoPE theta of `fuse_rope`) in as symbolic floats, which the variant's key cannot hold:
    the integration takes them as exact integer ratios (it failed with "assume_constant_result
    argument conversion failed"). One compiled function, two lengths, logits equal eager; with
    a cache, `fuse_rope` rotates the keys it writes (`rotate_keys`) inside the graph too."""
    from attnfuse.integrations import transformers as af_hf

    eager, fused = llama_pair()
    if rope == "fuse_rope":
        af_hf.fuse_rope(fused)
    def logits_of(model, ids, mask):
        return model(input_ids=ids, attention_mask=mask, use_cache=use_cache).logits

    compiled = torch.compile(lambda ids, mask: logits_of(fused, ids, mask), fullgraph=True, dynamic=True,
                             backend="aot_eager")
    for length, pad in ((10, 3), (13, 0)):
        ids, mask = batch(length=length, pad=pad)
        logits = compiled(ids, mask)
        reference = logits_of(eager, ids, mask)
        assert_logits_close(logits.detach(), reference.detach(), keep=mask)


def test_signature_floats_round_trip_exactly():
    """The integer ratio of a float gives back that very float (the variant is the same one)."""
    for value in (0.08838834764831845, 1 / 3, 500000.0, 8, 1e-300, 2.5e300):
        assert hf_attention._float(hf_attention._exact(value)) == value
    assert hf_attention._exact(None) is None and hf_attention._float(None) is None
    # Not a number: passed on, for the block's own error (af.softcap refuses it clearly).
    assert hf_attention._float(hf_attention._exact(float("inf"))) == float("inf")


def test_masks_made_while_tracing_compile_without_a_dense_mask():
    """HF makes some mask functions inside the traced region: a sliding window's, and, for a
    model called without an attention mask, the packed-sequence mask (HF cannot tell while
    tracing that the batch is not packed). Dynamo cannot read such closures; the stand-ins
    register() installs can be read, so these compile with fullgraph=True, as blocks
    (sliding_window, document) rather than a dense mask, and equal eager."""
    hf_attention._compiled.clear()
    hf_attention._by_signature.clear()
    eager, fused = llama_pair()
    ids, _mask = batch(length=10, pad=0)
    logits = torch.compile(Logits(fused), fullgraph=True, backend="aot_eager")(ids, None)
    assert_logits_close(logits.detach(), eager(input_ids=ids, use_cache=False).logits.detach())
    torch._dynamo.reset()
    eager, fused = mistral_pair(sliding_window=4)
    ids, mask = batch(length=10, pad=3)
    logits = torch.compile(Logits(fused), fullgraph=True, backend="aot_eager")(ids, mask)
    reference = eager(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert_logits_close(logits.detach(), reference.detach(), keep=mask)
    specs = [repr(spec) for spec, _placement in hf_attention._compiled]
    assert any("sliding_window(window=4)" in s for s in specs), specs
    assert all("additive_bias" not in s for s in specs), specs


def test_fused_rope_with_a_cache_compiles():
    """fuse_rope with a KV cache compiles with fullgraph=True: the cache's keys arrive rotated
    (`rope_placement=("auto", "given")`), a variant the trace compiles for real at trace time
    (`attention._operator_key`, a constant function) with non-default options."""
    import transformers

    from attnfuse.integrations import transformers as af_hf

    eager, fused = llama_pair()
    af_hf.fuse_rope(fused)
    ids, _mask = batch(length=6, pad=0)

    def prefill(ids):
        cache = transformers.DynamicCache(config=fused.config)
        return fused(input_ids=ids, past_key_values=cache, use_cache=True).logits

    logits = torch.compile(prefill, fullgraph=True, backend="aot_eager")(ids)
    assert_logits_close(logits.detach(), eager(input_ids=ids, use_cache=False).logits.detach())


def test_patched_llama_exports():
    eager, fused = llama_pair()
    ids, mask = batch(length=10, pad=3)
    exported = torch.export.export(Logits(fused), (ids, mask))
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert "attnfuse.attention.default" in targets
    reference = eager(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert_logits_close(exported.module()(ids, mask).detach(), reference.detach(), keep=mask)
