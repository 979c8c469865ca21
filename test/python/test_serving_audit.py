"""An outside audit of the serving and PyTorch-citizen features, written from the documents
(DESIGN.md, docs/semantics.md "KV caches" / "Merging attentions", README "torch.compile and
torch.export") with a float64 reference of its own (`naive`, below: one sequence and head at
a time, sharing no code with `attnfuse.runtime.reference`). It aims at what the feature tests
(runtime/test_decode.py, test_cache_append.py, test_merge_states.py, test_torch_op.py) leave
out: combinations of blocks in one decode call, page sizes that are no power of two, lengths
shorter than the query count, per-sequence RoPE positions over given keys, documented edge
behaviour of the lengths, appends across page boundaries with partial/interleaved rotations,
cascade decoding through a cache call, and a spec (not an `af.compile` object) first called
inside `torch.compile` / `torch.export`.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnfuse as af
from attnfuse.errors import ArgumentError

pytestmark = pytest.mark.interpreter

HQ = 8

# --------------------------------------------------------------------------------------------
# The reference, from docs/semantics.md
# --------------------------------------------------------------------------------------------


def default_slopes(n: int) -> list[float]:
    """ALiBi's geometric slopes for n query heads (its rule for a non-power-of-two n too)."""
    def power_of_two(m):
        return [2 ** (-8 * (h + 1) / m) for h in range(m)]

    if n & (n - 1) == 0:
        return power_of_two(n)
    m = 2 ** int(math.floor(math.log2(n)))
    return power_of_two(m) + [2 ** (-8 * (2 * i + 1) / (2 * m)) for i in range(n - m)]


def rotate(x, pos, theta, interleaved=False, rotary_dim=None):
    """R(pos) x for x [..., N, D]: frequencies theta^(-2t/r), fp32 angles, pairs half-split or
    interleaved, dims >= r passed through."""
    r = rotary_dim or x.shape[-1]
    freq = (theta ** (-2 * torch.arange(r // 2, dtype=torch.float64) / r)).float()
    angle = (pos.float()[:, None] * freq[None]).double()
    cos, sin = angle.cos(), angle.sin()
    x = x.double().clone()
    first, second = (slice(0, r, 2), slice(1, r, 2)) if interleaved else (slice(0, r // 2), slice(r // 2, r))
    a, b = x[..., first].clone(), x[..., second].clone()
    x[..., first], x[..., second] = a * cos - b * sin, a * sin + b * cos
    return x


def gather(pool, table, length):
    """A paged cache read as a contiguous one: key j of sequence b is row j % page_size of
    page table[b, j // page_size] (entries past what a sequence holds may be anything)."""
    page = pool.shape[2]
    rows = []
    for b in range(table.shape[0]):
        ids = [int(table[b, j // page]) for j in range(length)]
        rows.append(torch.stack([pool[p, :, j % page] if p >= 0 else pool[0, :, 0] * float("nan")
                                 for j, p in enumerate(ids)], 1))
    return torch.stack(rows)


def naive(q, k, v, kv_lens, *, causal=False, window=None, alibi=None, bias=None, softcap=None,
          doc_ids=None, rope=None, key_given=False, q_positions=None, normalizer="softmax"):
    """(out, lse) in float64 of q [B, Hq, Nq, D] over a contiguous cache k, v [B, Hkv, L, D]:
    sequence b has keys j < kv_lens[b], its query i sits at kv_lens[b] - Nq + i."""
    q, k, v = q.double(), k.double(), v.double()
    batch, heads, n_q, d = q.shape
    group = heads // k.shape[1]
    slopes = None if alibi is None else (default_slopes(heads) if alibi is True else alibi)
    out = torch.zeros(batch, heads, n_q, v.shape[-1], dtype=torch.float64)
    lse = torch.full((batch, heads, n_q), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        n = int(kv_lens[b])
        if n == 0:
            continue
        qp, kp = torch.arange(n_q) + n - n_q, torch.arange(n)
        for h in range(heads):
            qh, kh, vh = q[b, h], k[b, h // group, :n], v[b, h // group, :n]
            if rope is not None:
                rq = qp if q_positions is None else (q_positions[b] if q_positions.dim() == 2 else q_positions)
                qh = rotate(qh, rq, rope)
                kh = kh if key_given else rotate(kh, kp, rope)
            s = qh @ kh.T / math.sqrt(d)
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            if slopes is not None:
                s = s + slopes[h] * (kp[None] - qp[:, None]).double()
            if bias is not None:
                s = s + bias.double().expand(batch, heads, n_q, -1)[b, h, :, :n]
            keep = torch.ones(n_q, n, dtype=torch.bool)
            if causal:
                keep &= kp[None] <= qp[:, None]
            if window is not None:
                keep &= (qp[:, None] - kp[None]).abs() < window
            if doc_ids is not None:
                ids = doc_ids.expand(batch, -1)[b]
                q_ids = torch.where(qp >= 0, ids[qp.clamp(min=0)], -1)
                keep &= (q_ids[:, None] == ids[None, :n]) & (ids[None, :n] >= 0)
            keep &= s > float("-inf")
            for i in range(n_q):
                kept = keep[i]
                if not kept.any():
                    continue
                if normalizer == "softmax":
                    out[b, h, i] = torch.softmax(s[i][kept], 0) @ vh[kept]
                    lse[b, h, i] = torch.logsumexp(s[i][kept], 0)
                elif normalizer == "relu":
                    out[b, h, i] = (torch.relu(s[i][kept]) / n) @ vh[kept]
                else:
                    out[b, h, i] = torch.sigmoid(s[i][kept] - math.log(n)) @ vh[kept]
    return out, lse


def cache(batch, hkv, nq, length, d=16, dtype=torch.float32, seed=0, dv=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, HQ, nq, d, generator=gen).to(dtype)
    k = torch.randn(batch, hkv, length, d, generator=gen).to(dtype)
    v = torch.randn(batch, hkv, length, dv or d, generator=gen).to(dtype)
    return q, k, v


def paginate(k, v, page, seed=0, share_prefix=True):
    """Page pools (pages shuffled, 2 spare) and a table holding the caches k, v; sequence 1
    reads sequence 0's first page (its cache is changed to match and returned)."""
    batch, heads, length, _ = k.shape
    pages = length // page
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(batch * pages + 2, generator=gen)
    table = order[: batch * pages].reshape(batch, pages).to(torch.int32)
    if share_prefix and batch > 1:
        table[1, 0] = table[0, 0]
        k, v = k.clone(), v.clone()
        k[1, :, :page], v[1, :, :page] = k[0, :, :page], v[0, :, :page]
    pool_k = torch.randn(batch * pages + 2, heads, page, k.shape[-1], generator=gen).to(k.dtype)
    pool_v = torch.randn(batch * pages + 2, heads, page, v.shape[-1], generator=gen).to(v.dtype)
    for b in range(batch):
        for p in range(pages):
            pool_k[table[b, p]], pool_v[table[b, p]] = k[b, :, p * page:(p + 1) * page], v[b, :, p * page:(p + 1) * page]
    assert torch.equal(gather(pool_k, table, length), k)
    return k, v, pool_k, pool_v, table


def assert_matches(out, lse, want, want_lse, tol=1e-4):
    assert not torch.isnan(out).any()
    assert (out.double() - want).abs().max().item() <= tol
    if lse is not None:
        assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)), "-inf rows differ"
        finite = torch.isfinite(want_lse)
        assert (lse.double()[finite] - want_lse[finite]).abs().max().item() <= 1e-4


# --------------------------------------------------------------------------------------------
# Decoding: combinations the matrix of test_decode.py does not make
# --------------------------------------------------------------------------------------------


# name: (blocks, naive's keywords, Hkv, Nq, page size, lengths)
COMBINATIONS = {
    # Every position-dependent block in one call, pages of 48 (a multiple of 16, no power of
    # two), lengths 0, shorter than Nq (negative query positions) and full.
    "rope-alibi-window-causal-page48": (
        lambda: [af.rope(theta=10000.0), af.alibi(), af.sliding_window(9), af.causal()],
        dict(rope=10000.0, alibi=True, window=9, causal=True), 2, 4, 48, [96, 0, 3, 61]),
    # ALiBi without causal favours later keys, the bidirectional window reaches past q_pos;
    # soft-cap before both; MQA.
    "softcap-alibi-bidirectional-window-mqa": (
        lambda: [af.softcap(3.0), af.alibi(), af.sliding_window(5)],
        dict(softcap=3.0, alibi=True, window=5), 1, 4, 16, [2, 96, 40, 0]),
    "sigmoid-causal-page32": (
        lambda: [af.sigmoid(), af.causal()], dict(normalizer="sigmoid", causal=True), 8, 4, 32, [96, 1, 0, 50]),
}


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_decode_combinations_against_the_naive_reference(name):
    blocks, expect, hkv, nq, page, lens = COMBINATIONS[name]
    spec = af.attention(*blocks())
    q, k, v = cache(len(lens), hkv, nq, 96, seed=len(name))
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    k, v, pool_k, pool_v, table = paginate(k, v, page, seed=len(name))
    want, want_lse = naive(q, k, v, kv_lens, **expect)
    fn = af.compile(spec)
    softmax = expect.get("normalizer", "softmax") == "softmax"
    for keys, values, extra in ((k, v, {}), (pool_k, pool_v, {"block_table": table})):
        if softmax:
            out, lse = fn(q, keys, values, kv_lens=kv_lens, return_lse=True, **extra)
        else:
            out, lse = fn(q, keys, values, kv_lens=kv_lens, **extra), None
        assert_matches(out, lse, want, want_lse if softmax else None)
        assert (out[torch.tensor(lens) == 0] == 0).all()


def test_decode_per_sequence_query_positions_over_given_keys():
    """A cache of keys stored rotated (placement "given") and queries rotated at call-time
    positions per sequence (left padding): masks keep the cache positions."""
    spec = af.attention(af.rope(theta=500.0), af.causal())
    q, k, v = cache(3, 2, 4, 64, seed=3)
    lens = torch.tensor([64, 7, 30], dtype=torch.int32)
    positions = torch.tensor([[100, 101, 102, 103], [0, 1, 2, 3], [7, 9, 11, 13]])
    keys = rotate(k, torch.arange(64), 500.0).float()
    want, want_lse = naive(q, keys, v, lens, rope=500.0, key_given=True, q_positions=positions, causal=True)
    fn = af.compile(spec, rope_placement=("fused", "given"))
    _k, _v, pool_k, pool_v, table = paginate(keys, v, 16, share_prefix=False)
    out, lse = fn(q, pool_k, pool_v, kv_lens=lens, block_table=table, q_positions=positions, return_lse=True)
    assert_matches(out, lse, want, want_lse)


def test_decode_with_both_rotation_positions_per_sequence():
    """q_positions [B, Nq] and k_positions [B, L_max] (indexed by cache position, as all
    per-key data) over a contiguous and a paged cache: the naive reference rotates each key
    at its given position and then takes it as given."""
    fn = af.compile(af.attention(af.rope(theta=500.0), af.causal()), rope_placement="fused")
    q, k, v = cache(2, 2, 2, 32, seed=10)
    lens = torch.tensor([32, 9], dtype=torch.int32)
    k_positions = torch.stack([torch.arange(32) + 5, torch.arange(32) * 2])
    q_positions = torch.tensor([[40, 41], [3, 4]])
    keys = torch.stack([rotate(k[b], k_positions[b], 500.0) for b in range(2)]).float()
    want, want_lse = naive(q, keys, v, lens, rope=500.0, key_given=True, q_positions=q_positions, causal=True)
    _k, _v, pool_k, pool_v, table = paginate(k, v, 16, share_prefix=False)
    for keys_in, values_in, extra in ((k, v, {}), (pool_k, pool_v, {"block_table": table})):
        out, lse = fn(q, keys_in, values_in, kv_lens=lens, q_positions=q_positions, k_positions=k_positions,
                      return_lse=True, **extra)
        assert_matches(out, lse, want, want_lse)


def test_lengths_outside_the_cache_are_clamped_by_the_kernels():
    """docs/semantics.md: a length outside [0, L_max] is clamped to it in the kernels (no host
    read: a decode step replays in a CUDA graph), so 40 over a 32-key cache is 32 and -3 is
    0; the reference refuses both."""
    spec = af.attention(af.alibi(), af.causal())
    fn = af.compile(spec)
    q, k, v = cache(2, 2, 1, 32, seed=4)
    for given, clamped in (([40, 5], [32, 5]), ([-3, 5], [0, 5])):
        out, lse = fn(q, k, v, kv_lens=torch.tensor(given, dtype=torch.int32), return_lse=True)
        assert_matches(out, lse, *naive(q, k, v, torch.tensor(clamped), alibi=True, causal=True))
        with pytest.raises(ArgumentError, match="outside"):
            af.reference_attention(spec, q, k, v, kv_lens=torch.tensor(given, dtype=torch.int32))


def test_decode_index_and_dtype_errors_name_the_argument():
    fn = af.compile(af.attention(af.causal()))
    q, k, v = cache(2, 2, 1, 32, seed=5)
    lens = torch.tensor([20, 5], dtype=torch.int32)
    _k, _v, pool_k, pool_v, table = paginate(k, v, 16)
    for bad, match in ((dict(kv_lens=lens.long()), "kv_lens= must be int32"),
                       (dict(kv_lens=[20, 5]), "kv_lens= must be a torch.Tensor"),
                       (dict(kv_lens=lens, block_table=table.long()), "block_table= must be int32"),
                       (dict(kv_lens=lens, block_table=table[:1]), r"block_table= must have shape \[2, 2\]")):
        keys, values = (pool_k, pool_v) if "block_table" in bad else (k, v)
        with pytest.raises(ArgumentError, match=match):
            fn(q, keys, values, **bad)
    with pytest.raises(ArgumentError, match="share one dtype"):
        fn(q.half(), pool_k, pool_v.half(), kv_lens=lens, block_table=table)


def test_append_across_pages_with_partial_interleaved_rotation():
    """append_kv for a given-key variant with an interleaved rotation of 8 of 24 dims: keys
    land rotated at kv_lens[b] + i across a 48-row page boundary, past the capacity nothing
    is written, and attention over the pool equals the naive one over the unrotated keys."""
    rope = af.rope(theta=500.0, rotary_dim=8, interleaved=True)
    spec = af.attention(rope, af.causal())
    fn = af.compile(spec, rope_placement=("fused", "given"))
    gen = torch.Generator().manual_seed(6)
    k_new, v_new = torch.randn(3, 2, 5, 24, generator=gen), torch.randn(3, 2, 5, 32, generator=gen)
    lens = torch.tensor([0, 44, 93], dtype=torch.int32)
    _k, _v, pool_k, pool_v, table = paginate(*cache(3, 2, 1, 96, d=24, dv=32, seed=6)[1:], 48, share_prefix=False)
    before_k, before_v = gather(pool_k, table, 96), gather(pool_v, table, 96)
    fn.append_kv(pool_k, pool_v, k_new, v_new, lens, block_table=table)
    expect_k, expect_v = before_k.double(), before_v.double()
    for b, n in enumerate(lens.tolist()):
        pos = torch.arange(n, n + 5)
        fits = pos < 96
        expect_k[b][:, pos[fits]] = rotate(k_new[b], pos, 500.0, True, 8)[:, fits]
        expect_v[b][:, pos[fits]] = v_new[b].double()[:, fits]
    assert (gather(pool_k, table, 96).double() - expect_k).abs().max() <= 1e-5
    assert torch.equal(gather(pool_v, table, 96).double(), expect_v)
    # Attention over what was written: the rotated new keys, as given.
    new_lens = torch.tensor([5, 49, 96], dtype=torch.int32)
    q = torch.randn(3, 4, 2, 24, generator=gen)
    ref = af.reference_attention(spec, q, expect_k, expect_v, kv_lens=new_lens, rope_placement=("fused", "given"))
    out = fn(q, pool_k, pool_v, kv_lens=new_lens, block_table=table)
    assert (out.double() - ref).abs().max() <= 1e-4


def test_cascade_decoding_through_a_cache_call():
    """A prefix shared by the batch (plain call) merged with each sequence's own keys (a
    kv_lens call; sequence 1 has none: its part is empty, lse -inf) is causal attention over
    prefix + own keys, with ALiBi (whose distances both parts see the same)."""
    prefix, own, length = 24, [9, 0, 16], 16
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(3, 4, 1, 16, generator=gen)
    kp, vp = torch.randn(1, 2, prefix, 16, generator=gen), torch.randn(1, 2, prefix, 16, generator=gen)
    ks, vs = torch.randn(3, 2, length, 16, generator=gen), torch.randn(3, 2, length, 16, generator=gen)
    slopes = default_slopes(4)
    lens = torch.tensor(own, dtype=torch.int32)
    # The prefix part: every prefix key is before the query, at distance own[b] + prefix - 1 - j.
    bias = torch.stack([torch.tensor(slopes)[:, None, None] * (torch.arange(prefix) - (prefix + n - 1)).float()
                        for n in own])
    shared = af.compile(af.attention(af.additive_bias()))(q, kp.expand(3, -1, -1, -1), vp.expand(3, -1, -1, -1),
                                                          bias=bias, return_lse=True)
    mine = af.compile(af.attention(af.alibi(), af.causal()))(q, ks, vs, kv_lens=lens, return_lse=True)
    assert torch.isneginf(mine[1][1]).all()
    out, lse = af.merge_states(*shared, *mine)
    whole_k = torch.cat([kp.expand(3, -1, -1, -1), ks], 2)
    whole_v = torch.cat([vp.expand(3, -1, -1, -1), vs], 2)
    assert_matches(out, lse, *naive(q, whole_k, whole_v, lens + prefix, alibi=True, causal=True))
    assert torch.equal(out[1], shared[0][1]) and torch.equal(lse[1], shared[1][1])


# --------------------------------------------------------------------------------------------
# A spec called under torch.compile and torch.export
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_spec_first_called_inside_torch_compile(fresh_dynamo):
    """`spec(q, k, v)` (DESIGN.md's first call) inside a fullgraph-compiled function, before
    any eager call: no graph break, one graph over three steps, and values and gradients of
    q, k, v equal to eager's and the reference's."""
    spec = af.attention(af.rope(), af.causal())
    gen = torch.Generator().manual_seed(8)
    tensors = [torch.randn(2, 4, 24, 16, generator=gen), *(torch.randn(2, 2, 24, 16, generator=gen) for _ in range(2))]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    def loss(q, k, v):
        return spec(q, k, v).square().sum()

    compiled = torch.compile(loss, fullgraph=True, backend=backend)
    results = []
    for fn in (compiled, compiled, compiled, loss):
        inputs = [t.clone().requires_grad_() for t in tensors]
        value = fn(*inputs)
        results.append((value, *torch.autograd.grad(value, inputs)))
    assert len(graphs) == 1
    for traced, eager in zip(results[0], results[3]):
        torch.testing.assert_close(traced, eager, rtol=1e-5, atol=1e-5)
    ref = af.reference_attention(spec, *(t.double() for t in tensors))
    torch.testing.assert_close(results[0][0].double(), ref.square().sum(), rtol=1e-5, atol=0)


def test_a_spec_exports(fresh_dynamo):
    spec = af.attention(af.alibi(), af.sliding_window(6), af.causal())

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return spec(q, k, v)

    q, k, v = cache(1, 2, 20, 20, seed=9)
    exported = torch.export.export(Attention(), (q, k, v))
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert "attnfuse.attention.default" in targets
    want, _ = naive(q, k, v, torch.tensor([20]), alibi=True, window=6, causal=True)
    assert (exported.module()(q, k, v).double() - want).abs().max() <= 1e-4


def test_a_spec_made_inside_the_trace_is_refused_clearly(fresh_dynamo):
    q = torch.randn(1, 2, 16, 16)
    with pytest.raises(Exception, match="make it outside"):
        torch.compile(lambda q: af.attention(af.causal())(q, q, q), fullgraph=True, backend="aot_eager")(q)


def test_af_compile_inside_the_trace(fresh_dynamo):
    """`af.compile(spec)` of a spec made outside, default options: the spec's compiled form,
    traced with no graph break and equal to eager. With other options (or an attn program)
    it is refused with a message that says where to compile."""
    spec = af.attention(af.alibi(), af.causal())
    q, k, v = cache(1, 2, 20, 20, seed=4)
    traced = torch.compile(lambda q, k, v: af.compile(spec)(q, k, v), fullgraph=True, backend="aot_eager")
    want, _ = naive(q, k, v, torch.tensor([20]), alibi=True, causal=True)
    assert (traced(q, k, v).double() - want).abs().max() <= 1e-4
    torch._dynamo.reset()
    with pytest.raises(Exception, match="af.compile cannot run inside a function that torch.compile"):
        torch.compile(lambda q: af.compile(spec, rope_placement="fused")(q, q, q), fullgraph=True,
                      backend="aot_eager")(q)


def test_the_dynamo_marker_is_what_assume_constant_result_sets():
    """runtime/api.py sets `_dynamo_marked_constant` itself (importing torch._dynamo costs
    seconds); a PyTorch that marks constant functions otherwise must fail here."""
    from attnfuse.runtime import api

    marked = torch.compiler.assume_constant_result(lambda: None)
    assert marked._dynamo_marked_constant is True
    assert api._spec_form_name._dynamo_marked_constant is True


# --------------------------------------------------------------------------------------------
# Hugging Face: a model made with attn_implementation="attnfuse" against the same one on SDPA
# --------------------------------------------------------------------------------------------


def test_transformers_from_config_against_sdpa():
    """`register()`, then a tiny random Llama made with `attn_implementation="attnfuse"`
    (each model its own config: `from_config` writes the implementation into the config it is
    given): left-padded logits equal SDPA's on real positions, and greedy decoding with a
    static cache equals SDPA's."""
    import copy

    transformers = pytest.importorskip("transformers")
    from attnfuse.integrations import transformers as af_hf

    af_hf.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
                                      intermediate_size=96, num_hidden_layers=2, vocab_size=96,
                                      initializer_range=0.25, pad_token_id=0)
    fused = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="attnfuse").eval()
    sdpa = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    sdpa.load_state_dict(fused.state_dict())
    assert fused.config._attn_implementation == "attnfuse"
    ids = torch.randint(1, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4], ids[1, :4] = 0, 0
    with torch.no_grad():
        out, ref = fused(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(out[keep], ref[keep], rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    kwargs = dict(attention_mask=mask, max_new_tokens=3, do_sample=False, cache_implementation="static", pad_token_id=0)
    assert torch.equal(fused.generate(ids, **kwargs), sdpa.generate(ids, **kwargs))
