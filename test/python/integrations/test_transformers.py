"""attnfuse.integrations.transformers against HF's own eager attention.

Tiny random models (fp32, 2 layers, <= 16 tokens: the kernels run on Triton's CPU
interpreter). The reference is the same model with `attn_implementation="eager"` (HF's
matmul-softmax attention with its dense additive mask), loaded with the same weights. Weights
are drawn with a large `initializer_range` so that attention is far from uniform: a key that
should be dropped (padding, an unwritten cache slot, one outside the window) moves the logits
by orders of magnitude more than the tolerance.

Padding *query* rows are not compared: they attend to nothing, where AttnFuse outputs 0 and
HF's eager attention (a finite minimum instead of -inf) averages every key; no real position
reads them.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnfuse as af  # noqa: E402
from attnfuse.integrations import transformers as af_hf  # noqa: E402
from attnfuse.integrations.transformers import attention as hf_attention  # noqa: E402
from attnfuse.integrations.transformers import rope as hf_rope  # noqa: E402
from attnfuse.integrations.transformers.masks import recognise_pattern  # noqa: E402

pytestmark = pytest.mark.interpreter

VOCAB = 96
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
            num_hidden_layers=2, vocab_size=VOCAB, initializer_range=0.25, pad_token_id=0)


def make_pair(config_class, model_class, **extra):
    """(eager model, attnfuse model) with the same random weights, in eval mode."""
    af_hf.register()
    torch.manual_seed(0)
    config = config_class(**TINY, **extra, attn_implementation="eager")
    eager = model_class(config).eval()
    fused = model_class(copy.deepcopy(config))
    fused.load_state_dict(eager.state_dict())
    fused.set_attn_implementation("attnfuse")
    return eager, fused.eval()


def llama_pair(**extra):
    return make_pair(transformers.LlamaConfig, transformers.LlamaForCausalLM, **extra)


def mistral_pair(**extra):
    return make_pair(transformers.MistralConfig, transformers.MistralForCausalLM, **extra)


def batch(length=10, pad=3):
    """Token ids [2, length] and a 2D attention mask; row 1 is left-padded by `pad`."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, length), generator=generator)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :pad] = 0
    ids[1, :pad] = 0
    return ids, mask


def assert_logits_close(out, ref, keep=None):
    """Relative 1e-5 of the logits' scale, at the positions `keep` [B, N] (all by default)."""
    if keep is not None:
        out, ref = out[keep.bool()], ref[keep.bool()]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def assert_grads_close(fused, eager):
    for (name, p_fused), p_eager in zip(fused.named_parameters(), eager.parameters()):
        scale = p_eager.grad.abs().max().item()
        torch.testing.assert_close(p_fused.grad, p_eager.grad, rtol=1e-5, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")


def train_step(model, ids, mask, **kwargs):
    """Loss of a train-mode forward over the real (non-padding) positions, backpropagated."""
    model.train()
    model.zero_grad()
    logits = model(ids, attention_mask=mask, **kwargs).logits
    loss = logits[mask.bool()].square().mean()
    loss.backward()
    return logits.detach()


def greedy(model, ids, mask, cache=None, new=4):
    return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                          cache_implementation=cache, pad_token_id=0)


# -- register() ------------------------------------------------------------------------------


def test_register_adds_attention_and_mask_functions():
    af_hf.register()
    af_hf.register()  # idempotent
    assert transformers.AttentionInterface._global_mapping["attnfuse"] is af_hf.attnfuse_attention_forward
    masks = transformers.masking_utils.AttentionMaskInterface._global_mapping
    assert masks["attnfuse"] is af_hf.attnfuse_mask


def test_mask_patterns_are_recognised_or_left_dense():
    m = transformers.masking_utils
    assert recognise_pattern(m.causal_mask_function) == ("causal", None)
    assert recognise_pattern(m.bidirectional_mask_function) == ("full", None)
    assert recognise_pattern(m.sliding_window_causal_mask_function(5)) == ("causal", 5)
    composed = m.and_masks(m.sliding_window_causal_mask_function(5), m.causal_mask_function)
    assert recognise_pattern(composed) is None
    assert recognise_pattern(m.or_masks(m.causal_mask_function, m.bidirectional_mask_function)) is None
    assert recognise_pattern(m.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long))) is None


def test_mask_factory_stand_ins_keep_what_hf_keeps_and_are_read():
    """register() puts readable stand-ins for HF's mask factories in masking_utils: each keeps
    exactly what HF's own closure keeps (compared on every (b, h, q, kv) of a grid), and the
    patterns are read from them and, eagerly, from HF's closures too."""
    from attnfuse.integrations.transformers import mask_factories
    from attnfuse.integrations.transformers.masks import recognise_packed

    af_hf.register()
    m = transformers.masking_utils
    assert mask_factories.installed()
    original = mask_factories.ORIGINALS
    sequences = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 0]])
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    pairs = [
        (m.sliding_window_causal_mask_function(2), original["and_masks"](
            original["sliding_window_overlay"](2), m.causal_mask_function)),
        (m.packed_sequence_mask_function(sequences), original["packed_sequence_mask_function"](sequences)),
        (m.remap_positions_for_packed_sequence(m.causal_mask_function, positions),
         original["remap_positions_for_packed_sequence"](m.causal_mask_function, positions)),
    ]
    b, h, q, kv = torch.meshgrid(torch.arange(2), torch.arange(1), torch.arange(6), torch.arange(6), indexing="ij")
    for stand_in, closure in pairs:
        assert torch.equal(stand_in(b, h, q, kv), closure(b, h, q, kv))
    assert recognise_pattern(pairs[0][0]) == recognise_pattern(pairs[0][1]) == ("causal", 2)
    packed = m.and_masks(m.remap_positions_for_packed_sequence(m.sliding_window_causal_mask_function(3), positions),
                         m.packed_sequence_mask_function(sequences))
    pattern, window, ids = recognise_packed(packed)
    assert (pattern, window) == ("causal", 3) and ids is sequences
    assert recognise_pattern(packed) is None
    # Packed under another pattern (bidirectional), or and'ed in another order: not guessed.
    assert recognise_packed(m.and_masks(m.remap_positions_for_packed_sequence(m.bidirectional_mask_function, positions),
                                        m.packed_sequence_mask_function(sequences))) is None
    assert recognise_packed(m.and_masks(m.packed_sequence_mask_function(sequences), m.causal_mask_function)) is None


def test_packed_sequences_are_documents():
    """A batch of packed sequences (position_ids restarting at 0, no attention mask, no cache): HF's
    packed-sequence mask reaches the kernel as af.document() ids, not as a dense mask, and
    the logits equal eager's (which applies HF's dense packed mask)."""
    eager, fused = llama_pair()
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3], list(range(12))])
    hf_attention._compiled.clear()
    hf_attention._by_signature.clear()
    # No cache: HF looks for packed sequences only then (a training setup).
    out = fused(ids, position_ids=positions, use_cache=False).logits
    assert_logits_close(out, eager(ids, position_ids=positions, use_cache=False).logits)
    specs = [repr(spec) for spec, _placement in hf_attention._compiled]
    assert specs and all("document()" in s and "additive_bias" not in s for s in specs), specs


def test_padding_and_a_dense_mask_reach_the_kernel():
    """The mask function's description, checked directly against HF's sdpa_mask."""
    m = transformers.masking_utils
    padding = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    described = af_hf.attnfuse_mask(2, 4, 4, attention_mask=padding)
    assert (described.pattern, described.window, described.valid) == ("causal", None, 4)
    assert torch.equal(described.padding, padding)
    assert af_hf.attnfuse_mask(2, 4, 4, attention_mask=torch.ones(2, 4, dtype=torch.bool)).padding is None
    # A static cache (tensor fill level): HF's dense mask, unwritten slots dropped.
    # Bidirectional (an encoder; cross-attention has kv_length != q_length): every key.
    full = af_hf.attnfuse_mask(2, 2, 4, mask_function=m.bidirectional_mask_function, attention_mask=padding)
    assert (full.pattern, full.valid) == ("full", 4) and torch.equal(full.padding, padding)
    dense = af_hf.attnfuse_mask(2, 1, 6, q_offset=torch.tensor(4), attention_mask=padding)
    expected = m.sdpa_mask(2, 1, 6, q_offset=torch.tensor(4), attention_mask=padding,
                           allow_is_causal_skip=False)
    assert dense.pattern == "full" and torch.equal(dense.dense, expected)
    assert dense.dense[:, 0, 0].tolist() == [[True] * 4 + [False] * 2, [False] * 2 + [True] * 2 + [False] * 2]


def test_a_full_pattern_drops_padding_keys_only():
    """Under a bidirectional mask (an encoder, or cross-attention, whose queries are another
    sequence than the padded keys) padding drops keys for every query, as HF's SDPA mask
    does: a query's row never depends on the padding at its own index, whatever the lengths
    (more queries than keys included)."""
    m = transformers.masking_utils
    padding = torch.tensor([[1, 1, 1, 0, 0, 1], [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    generator = torch.Generator().manual_seed(3)
    module = torch.nn.Module()
    module.is_causal = False
    for queries in (2, 6, 9):
        q = torch.randn(2, 2, queries, 8, generator=generator)
        k, v = torch.randn(2, 2, 6, 8, generator=generator), torch.randn(2, 2, 6, 8, generator=generator)
        described = af_hf.attnfuse_mask(2, queries, 6, mask_function=m.bidirectional_mask_function,
                                        attention_mask=padding)
        assert described.doc_ids is None
        out, _ = hf_attention.attnfuse_attention_forward(module, q, k, v, described, scaling=8 ** -0.5)
        dense = m.sdpa_mask(2, queries, 6, mask_function=m.bidirectional_mask_function, attention_mask=padding,
                            allow_is_bidirectional_skip=False)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense).transpose(1, 2)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_encoder_decoder_with_a_padded_encoder_matches_eager():
    """BART: the encoder's padding reaches its self-attention and the decoder's
    cross-attention (right padding, as tokenizers pad), logits and greedy tokens."""
    af_hf.register()
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, init_std=0.25, max_position_embeddings=64, pad_token_id=1,
                                     dropout=0.0, attention_dropout=0.0, attn_implementation="eager")
    eager = transformers.BartForConditionalGeneration(config).eval()
    fused = transformers.BartForConditionalGeneration(copy.deepcopy(config))
    fused.load_state_dict(eager.state_dict())
    fused.set_attn_implementation("attnfuse")
    fused.eval()
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(3, VOCAB, (2, 10), generator=generator)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    ids[1, 7:] = 1
    decoder_ids = torch.randint(3, VOCAB, (2, 4), generator=generator)
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        out = fused(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    assert_logits_close(out, ref)
    tokens = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, num_beams=1)
    assert torch.equal(fused.generate(ids, **tokens), eager.generate(ids, **tokens))


def test_t5_relative_position_bias_matches_eager():
    """T5 hands its relative position bias to the attention as `position_bias=` (per query
    head, learned): it is added to the scores with the padding, in the encoder, the decoder and
    the cross-attention, and its table gets eager's gradient; greedy tokens match."""
    af_hf.register()
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                   dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                   attn_implementation="eager")
    eager = transformers.T5ForConditionalGeneration(config)
    with torch.no_grad():  # a bias large enough that dropping it moves the logits far
        for module in eager.modules():
            if getattr(module, "has_relative_attention_bias", False):
                module.relative_attention_bias.weight.mul_(8.0)
    fused = transformers.T5ForConditionalGeneration(copy.deepcopy(config))
    fused.load_state_dict(eager.state_dict())
    fused.set_attn_implementation("attnfuse")
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(3, VOCAB, (2, 10), generator=generator)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    ids[1, 7:] = 0
    labels = torch.randint(3, VOCAB, (2, 5), generator=generator)
    losses = [model.train()(input_ids=ids, attention_mask=mask, labels=labels) for model in (eager, fused)]
    for output in losses:
        output.loss.backward()
    assert_logits_close(losses[1].logits, losses[0].logits)
    assert_grads_close(fused, eager)
    bias_grad = fused.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad
    assert bias_grad is not None and bias_grad.abs().max() > 0
    tokens = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, num_beams=1)
    assert torch.equal(fused.eval().generate(ids, **tokens), eager.eval().generate(ids, **tokens))


def test_a_model_reading_the_mask_as_a_tensor_is_told_so():
    """A model that reads a tensor attribute of the mask before its attention (Falcon with
    ALiBi reads its dtype) gets an ArgumentError naming the attribute; `hasattr` and
    `getattr(..., default)` answer as for any missing attribute."""
    from attnfuse.integrations.transformers.masks import AttnFuseMask

    mask = AttnFuseMask("causal", None, 8, 8)
    with pytest.raises(af.ArgumentError, match=r"reads its \.dtype before its attention call"):
        mask.dtype  # noqa: B018
    assert not hasattr(mask, "shape") and getattr(mask, "device", None) is None
    # Traced too: Dynamo answers hasattr for AttributeError itself only, which it then gets.
    probe = torch.compile(lambda x, m: x + (1 if hasattr(m, "shape") else 2), fullgraph=True, backend="aot_eager")
    assert probe(torch.zeros(1), mask).item() == 2
    af_hf.register()
    config = transformers.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                                       alibi=True, attn_implementation="attnfuse")
    with pytest.raises(af.ArgumentError, match="AttnFuseMask"):
        transformers.FalconForCausalLM(config)(torch.randint(1, VOCAB, (1, 6)))


# -- attention through HF's interface ---------------------------------------------------------


def test_logits_equal_eager_with_left_padding_and_gqa():
    eager, fused = llama_pair()
    ids, mask = batch()
    with torch.no_grad():
        ref = eager(ids, attention_mask=mask).logits
        out = fused(ids, attention_mask=mask).logits
        unpadded = fused(ids[:1]).logits
    assert_logits_close(out, ref, keep=mask)
    assert_logits_close(unpadded, ref[:1])
    assert any("document()" in repr(spec) for spec, _placement in hf_attention._compiled)
    # The padding is honoured: without it, the padded row's logits move far past the tolerance.
    with torch.no_grad():
        ignored = fused(ids).logits
    assert (ignored[1, 3:] - ref[1, 3:]).abs().max() > 1e-2 * ref.abs().max()


def test_train_mode_gradients_equal_eager():
    eager, fused = llama_pair()
    ids, mask = batch()
    ref = train_step(eager, ids, mask)
    out = train_step(fused, ids, mask)
    assert_logits_close(out, ref, keep=mask)
    assert_grads_close(fused, eager)


@pytest.mark.parametrize("cache", [None, "static"])
def test_generate_matches_eager(cache):
    """Greedy decoding of a left-padded batch with a DynamicCache and a StaticCache. A static
    cache hands the attention every slot: the unwritten ones must not be attended."""
    eager, fused = llama_pair()
    ids, mask = batch(length=8)
    assert torch.equal(greedy(fused, ids, mask, cache), greedy(eager, ids, mask, cache))


def test_sliding_window_mistral():
    """Mistral with a window (6) shorter than the sequence: logits, and decoding from a prompt
    shorter than the window past it (the dynamic sliding-window cache keeps window - 1 keys;
    the static one is a ring of `window` slots, handed over whole while partly unwritten)."""
    eager, fused = mistral_pair(sliding_window=6)
    ids, mask = batch()
    with torch.no_grad():
        assert_logits_close(fused(ids, attention_mask=mask).logits,
                            eager(ids, attention_mask=mask).logits, keep=mask)
    specs = [spec for spec, _placement in hf_attention._compiled]
    assert any("sliding_window(window=6)" in repr(spec) for spec in specs)
    ids, mask = batch(length=4, pad=1)
    for cache in (None, "static"):
        assert torch.equal(greedy(fused, ids, mask, cache, new=5), greedy(eager, ids, mask, cache, new=5))


def test_softcap_and_scaling_gemma2():
    """Gemma-2's logit soft-cap (`softcap=`) and query_pre_attn_scalar (`scaling=`)."""
    eager, fused = make_pair(transformers.Gemma2Config, transformers.Gemma2ForCausalLM, head_dim=16,
                             sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=5.0)
    ids, mask = batch()
    with torch.no_grad():
        assert_logits_close(fused(ids, attention_mask=mask).logits,
                            eager(ids, attention_mask=mask).logits, keep=mask)
    assert any("softcap" in repr(spec) for spec, _placement in hf_attention._compiled)


def test_variants_compile_once():
    eager, fused = llama_pair()
    ids, mask = batch()
    with torch.no_grad():
        fused(ids, attention_mask=mask)
        before = dict(hf_attention._compiled)
        fused(ids, attention_mask=mask)
    assert hf_attention._compiled == before  # same objects, nothing compiled again


def test_dropout_in_training_is_refused_and_ignored_in_eval():
    eager, fused = llama_pair(attention_dropout=0.1)
    ids, mask = batch(length=6)
    with torch.no_grad():
        fused(ids, attention_mask=mask)  # eval: HF passes dropout 0
    fused.train()
    with pytest.raises(af.AttnFuseError, match="dropout"):
        fused(ids, attention_mask=mask)


def test_output_attentions_warns_and_returns_none():
    eager, fused = llama_pair()
    ids, _mask = batch(length=6)
    with pytest.warns(UserWarning, match="output_attentions"), torch.no_grad():
        out = fused(ids, output_attentions=True)
    assert all(a is None for a in (out.attentions or (None,)))


# -- fuse_rope -----------------------------------------------------------------------------------


def fused_rope_pair(**extra):
    eager, fused = llama_pair(**extra)
    assert af_hf.fuse_rope(fused) is fused
    af_hf.fuse_rope(fused)  # idempotent
    return eager, fused


LLAMA3 = dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16})


def test_fuse_rope_logits_and_gradients(monkeypatch):
    """Llama-3.1 rope scaling (an original context of 16 positions, so that every band of the
    scaling is used): the unrotated q and k reach the kernel with the per-row positions."""
    eager, fused = fused_rope_pair(**LLAMA3)
    seen = []
    original = hf_attention.run_attention

    def spy(*args, rope=None, **kwargs):
        seen.append(rope)
        return original(*args, rope=rope, **kwargs)

    monkeypatch.setattr(hf_rope, "run_attention", spy)
    ids, mask = batch()
    # Positions as generate makes them for a left-padded row: shifted, padding at 1.
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    ref = train_step(eager, ids, mask, position_ids=positions, use_cache=False)
    out = train_step(fused, ids, mask, position_ids=positions, use_cache=False)
    assert_logits_close(out, ref, keep=mask)
    assert_grads_close(fused, eager)
    # Without a cache both rotations run in the kernel, at the rows' own positions.
    assert len(seen) == 2 and all(call.k_positions is not None for call in seen)
    assert "scaling=llama3_scaling" in repr(seen[0].block)
    assert seen[0].q_positions[1].tolist() == [1, 1, 1] + list(range(7))
    # With HF's default cache (a forward with use_cache) the keys are rotated before the kernel.
    seen.clear()
    ref = train_step(eager, ids, mask)
    out = train_step(fused, ids, mask)
    assert_logits_close(out, ref, keep=mask)
    assert_grads_close(fused, eager)
    assert len(seen) == 2 and all(call.k_positions is None for call in seen)


@pytest.mark.parametrize("cache", [None, "static"])
def test_fuse_rope_generate_rotates_each_key_once(cache, monkeypatch):
    """Greedy decoding equals eager's, every rotation made covers only the new tokens (the
    cache is never rotated again), and the cached keys are eager's rotated keys."""
    eager, fused = fused_rope_pair()
    rotated_lengths = []
    original = hf_rope.rotate_keys

    def counting(key, positions, block):
        rotated_lengths.append(key.shape[2])
        return original(key, positions, block)

    monkeypatch.setattr(hf_rope, "rotate_keys", counting)
    ids, mask = batch(length=8)
    new = 3
    kwargs = dict(max_new_tokens=new, do_sample=False, pad_token_id=0, cache_implementation=cache,
                  return_dict_in_generate=True)
    ref = eager.generate(ids, attention_mask=mask, **kwargs)
    out = fused.generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(out.sequences, ref.sequences)
    # One rotation per layer and step, of the prompt and then of each new key.
    layers = TINY["num_hidden_layers"]
    assert rotated_lengths == [ids.shape[1]] * layers + [1] * layers * (new - 1)
    ours, theirs = out.cache.layers[0], ref.cache.layers[0]
    written = ids.shape[1] + new - 1  # the last token is sampled, never written
    torch.testing.assert_close(ours.keys[:, :, :written], theirs.keys[:, :, :written], rtol=1e-5, atol=1e-5)


def test_fuse_rope_qwen2_with_full_and_sliding_layers():
    """Qwen2 with layer_types (a sliding layer, then a full one), fused RoPE: logits of a
    left-padded batch and greedy decoding."""
    eager, fused = make_pair(transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                             use_sliding_window=True, sliding_window=4,
                             layer_types=["sliding_attention", "full_attention"])
    af_hf.fuse_rope(fused)
    ids, mask = batch()
    with torch.no_grad():
        assert_logits_close(fused(ids, attention_mask=mask).logits,
                            eager(ids, attention_mask=mask).logits, keep=mask)
    specs = [repr(spec) for spec, _placement in hf_attention._compiled]
    assert any("sliding_window(window=4)" in spec and "rope(" in spec for spec in specs)
    assert torch.equal(greedy(fused, ids, mask, new=3), greedy(eager, ids, mask, new=3))


def test_rotate_matches_hf():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [1, 1, 0, 1, 2]])
    block = af.rope(theta=100.0)
    config = transformers.LlamaConfig(hidden_size=24, num_attention_heads=3, head_dim=8,
                                      rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    cos, sin = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)(x, positions)
    expected, _ = transformers.models.llama.modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(af_hf.rotate_keys(x, positions, block), expected, rtol=1e-6, atol=1e-6)


def test_fuse_rope_refusals():
    eager, fused = llama_pair()
    with pytest.raises(af.AttnFuseError, match="attn_implementation='attnfuse'"):
        af_hf.fuse_rope(eager)
    linear = dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(af.AttnFuseError, match="rope_type 'linear'"):
        af_hf.fuse_rope(llama_pair(**linear)[1])
    gemma = make_pair(transformers.Gemma2Config, transformers.Gemma2ForCausalLM, head_dim=16)[1]
    with pytest.raises(af.AttnFuseError, match="model type 'gemma2'"):
        af_hf.fuse_rope(gemma)


def test_attention_sinks_are_refused_not_ignored():
    """GPT-OSS-style models pass sinks (`s_aux=`) to the attention interface; AttnFuse has no
    sink block, so the call must fail rather than drop them."""
    q = torch.randn(1, 2, 4, 8)
    module = torch.nn.Module()
    with pytest.raises(af.AttnFuseError, match="s_aux"):
        hf_attention.attnfuse_attention_forward(module, q, q, q, None, s_aux=torch.zeros(2))


def test_padding_lists_are_built_once_per_forward_not_per_layer(monkeypatch):
    """Every layer gets the mask's one doc_ids tensor, so the block lists of the padding are
    built once per forward (two layers here), not once per layer."""
    from attnfuse.runtime import call_binding

    builds = []
    real = call_binding.call_block_lists
    monkeypatch.setattr(call_binding, "call_block_lists", lambda *a, **kw: builds.append(1) or real(*a, **kw))
    _eager, fused = llama_pair()
    # More than 16 queries: a decode-sized forward runs the split kernels, which test each
    # pair's documents and build no lists at all.
    ids, mask = batch(length=24, pad=5)
    with torch.no_grad():
        fused(input_ids=ids, attention_mask=mask)
    assert len(builds) == 1
