"""attnfuse.integrations.transformers on the GPU, at sizes the CPU interpreter cannot run.

A Llama-shaped random model (D=64, GQA 16/4, 2 layers) on CUDA against the same model with
`attn_implementation="eager"`: fp32 logits of a left-padded batch of 512 tokens, greedy
decoding with dynamic and static caches (where the static cache's fill level is a device
tensor: the dense-mask path), with and without `fuse_rope`; bf16 logits against fp32 eager.
Skipped without CUDA (conftest).
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnfuse.integrations import transformers as af_hf  # noqa: E402

pytestmark = pytest.mark.gpu

VOCAB = 1000
CONFIG = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, intermediate_size=2048,
              num_hidden_layers=2, vocab_size=VOCAB, initializer_range=0.1, pad_token_id=0,
              max_position_embeddings=4096,
              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 256})


def pair(dtype, rope_fused):
    af_hf.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG, attn_implementation="eager")
    eager = transformers.LlamaForCausalLM(config).to("cuda", dtype).eval()
    fused = transformers.LlamaForCausalLM(copy.deepcopy(config)).to("cuda", dtype)
    fused.load_state_dict(eager.state_dict())
    fused.set_attn_implementation("attnfuse")
    if rope_fused:
        af_hf.fuse_rope(fused)
    return eager, fused.eval()


def batch(length=512, pad=100):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, length), generator=generator)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :pad] = 0
    ids[1, :pad] = 0
    return ids.cuda(), mask.cuda()


@pytest.mark.parametrize("rope_fused", [False, True], ids=["rope_hf", "rope_fused"])
def test_logits_and_generate_fp32(rope_fused):
    eager, fused = pair(torch.float32, rope_fused)
    ids, mask = batch()
    keep = mask.bool()
    with torch.no_grad():
        ref = eager(ids, attention_mask=mask).logits[keep]
        out = fused(ids, attention_mask=mask).logits[keep]
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    for cache in (None, "static"):
        kwargs = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0,
                      cache_implementation=cache)
        assert torch.equal(fused.generate(ids, **kwargs), eager.generate(ids, **kwargs)), cache


@pytest.mark.parametrize("rope_fused", [False, True], ids=["rope_hf", "rope_fused"])
def test_logits_bf16(rope_fused):
    """bf16 attnfuse against fp32 eager: no worse than bf16 eager is, with some margin."""
    eager32, _ = pair(torch.float32, False)
    eager16, fused16 = pair(torch.bfloat16, rope_fused)
    ids, mask = batch()
    keep = mask.bool()
    with torch.no_grad():
        ref = eager32(ids, attention_mask=mask).logits[keep].double()
        errors = [((m(ids, attention_mask=mask).logits[keep].double() - ref).norm() / ref.norm()).item()
                  for m in (eager16, fused16)]
    assert errors[1] <= 2 * errors[0] + 1e-3, errors
