"""Split-KV decoding on a CUDA device at serving sizes, against the float64 reference:
ragged `kv_lens`, paged caches (pages shuffled and shared), GQA, Nq 1/4/16, the variants that
make sense in decode, and a decode step captured in a CUDA graph that replays as the lengths
grow and the block table changes. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to_reference, assert_lse_close, lse_tolerance, direct_then_graphed

import attnfuse as af

pytestmark = pytest.mark.gpu

LENGTHS = [4096, 1, 2731, 0, 1500, 64]
"""Ragged lengths over a 4096-key cache: full, one key, none, not multiples of a page."""


def cache(b, hq, hkv, nq, l_max, d, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, hkv, l_max, d, generator=gen).to(dtype)
    v = torch.randn(b, hkv, l_max, d, generator=gen).to(dtype)
    return q, k, v


def paginate(k, v, lens, page_size, seed=0):
    """Page pools `[pages, Hkv, page_size, D]` holding the caches, in shuffled order, with the
    first two pages of sequence 0 shared by sequence 2 (whose cache is made to match), and
    the table `[B, max_pages]` (-1 past each sequence's pages)."""
    b, hkv, l_max, d = k.shape
    k, v = k.clone(), v.clone()
    shared = 2
    k[2, :, : shared * page_size], v[2, :, : shared * page_size] = k[0, :, : shared * page_size], v[0, :, : shared * page_size]
    needed = [-(-n // page_size) for n in lens]
    slots = [(s, p) for s in range(b) for p in range(needed[s]) if not (s == 2 and p < shared)]
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(slots) + 2, generator=gen).tolist()
    pool_k = torch.randn(len(order), hkv, page_size, d, generator=gen).to(k.dtype)
    pool_v = torch.randn(len(order), hkv, page_size, d, generator=gen).to(v.dtype)
    table = torch.full((b, l_max // page_size), -1, dtype=torch.int32)
    for (s, p), page in zip(slots, order):
        table[s, p] = page
        pool_k[page], pool_v[page] = k[s, :, p * page_size:(p + 1) * page_size], v[s, :, p * page_size:(p + 1) * page_size]
    table[2, :shared] = table[0, :shared]
    return k, v, pool_k, pool_v, table


SPECS = {
    "causal": (af.attention(af.causal()), "auto"),
    "rope-given-key": (af.attention(af.rope(theta=500000.0), af.causal()), ("fused", "given")),
    "rope-fused": (af.attention(af.rope(theta=10000.0), af.causal()), "auto"),
    "alibi": (af.attention(af.alibi(), af.causal()), "auto"),
    "window": (af.attention(af.sliding_window(1024), af.causal()), "auto"),
    "softcap": (af.attention(af.softcap(30.0), af.causal()), "auto"),
    "relu": (af.attention(af.relu()), "auto"),
}


@pytest.mark.parametrize("layout", ["contiguous", 16, 64])
@pytest.mark.parametrize("name", list(SPECS))
def test_decode_llama3_8b_geometry(name, layout):
    spec, placement = SPECS[name]
    fn = af.compile(spec, rope_placement=placement)
    b, hq, hkv, nq, d = len(LENGTHS), 32, 8, 1, 128
    q, k, v = cache(b, hq, hkv, nq, 4096, d, torch.float16)
    lens = torch.tensor(LENGTHS, dtype=torch.int32)
    call = {"kv_lens": lens.cuda()}
    if layout == "contiguous":
        keys, values = k, v
    else:
        k, v, keys, values, table = paginate(k, v, LENGTHS, layout)
        call["block_table"] = table.cuda()
    has_lse = name != "relu"
    result = fn(q.cuda(), keys.cuda(), values.cuda(), return_lse=has_lse, **call)
    torch.cuda.synchronize()
    ref = af.reference_attention(spec, q, k, v, kv_lens=lens, rope_placement=placement, return_lse=has_lse)
    if has_lse:
        (out, lse), (ref, ref_lse) = result, ref
        assert_lse_close(lse.cpu(), ref_lse, lse_tolerance(spec, q, k))
    else:
        out = result
    assert_close_to_reference(out.cpu(), ref, torch.float16)
    assert (out[3] == 0).all(), "a sequence without keys outputs 0"


@pytest.mark.parametrize("nq", [4, 16])
@pytest.mark.parametrize("hq,hkv", [(32, 8), (64, 8), (8, 8)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_query_counts_and_groups(nq, hq, hkv, dtype):
    spec = af.attention(af.causal())
    fn = af.compile(spec)
    lens_list = [4096, 2731, 17, 1500]
    q, k, v = cache(len(lens_list), hq, hkv, nq, 4096, 128, dtype, seed=1)
    lens = torch.tensor(lens_list, dtype=torch.int32)
    out, lse = fn(q.cuda(), k.cuda(), v.cuda(), kv_lens=lens.cuda(), return_lse=True)
    ref, ref_lse = af.reference_attention(spec, q, k, v, kv_lens=lens, return_lse=True)
    assert_close_to_reference(out.cpu(), ref, dtype)
    assert_lse_close(lse.cpu(), ref_lse, lse_tolerance(spec, q, k))


def test_decode_long_cache_without_lengths():
    """A plain call with one query over a 32k cache (Llama-3-70B geometry) runs split."""
    spec = af.attention(af.causal())
    fn = af.compile(spec)
    q, k, v = cache(1, 64, 8, 1, 32768, 128, torch.float16, seed=2)
    out = fn(q.cuda(), k.cuda(), v.cuda())
    assert fn.last is not None and "attention_decode" in fn.last.source
    assert_close_to_reference(out.cpu(), af.reference_attention(spec, q, k, v), torch.float16)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_step_in_a_cuda_graph_replays_as_lengths_grow(paged):
    """A step captured once replays correctly after kv_lens (and the block table) change in
    place: no host read of the lengths, no launch that depends on them."""
    spec = af.attention(af.rope(theta=500000.0), af.causal())
    fn = af.compile(spec, rope_placement=("fused", "given"))
    b, hq, hkv, d, l_max, page = 4, 32, 8, 128, 4096, 64
    q, k, v = (t.cuda() for t in cache(b, hq, hkv, 1, l_max, d, torch.float16, seed=3))
    lens = torch.tensor([100, 2000, 1, 4000], dtype=torch.int32, device="cuda")
    call = {"kv_lens": lens}
    if paged:
        pages = l_max // page
        pool_k = k.reshape(b, hkv, pages, page, d).permute(0, 2, 1, 3, 4).reshape(b * pages, hkv, page, d)
        pool_v = v.reshape(b, hkv, pages, page, d).permute(0, 2, 1, 3, 4).reshape(b * pages, hkv, page, d)
        table = torch.arange(b * pages, dtype=torch.int32, device="cuda").reshape(b, pages)
        keys, values, call["block_table"] = pool_k.contiguous(), pool_v.contiguous(), table.clone()
    else:
        keys, values = k, v
    fn(q, keys, values, **call)  # warm: compiles, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(q, keys, values, **call)
    for new_lens in ([101, 2001, 2, 4001], [4096, 64, 3000, 0]):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        if paged:
            # Another order of the same pages: sequence s reads sequence (s - 1) % b's pages.
            call["block_table"].copy_(table.roll(1, dims=0))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        expected = fn(q, keys, values, **call)
        assert torch.equal(out, expected), "the replayed step differs from an eager call"
        ref_k = k if not paged else k.roll(1, dims=0)
        ref_v = v if not paged else v.roll(1, dims=0)
        ref = af.reference_attention(spec, q.cpu(), ref_k.cpu(), ref_v.cpu(), kv_lens=lens.cpu(),
                                     rope_placement=("fused", "given"))
        assert_close_to_reference(out.cpu(), ref, torch.float16)
    assert len(fn._plans) == 1, "lengths changed the plan: a step would recompile or re-plan"


def test_decode_launch_graphs_read_the_lengths_of_each_call(monkeypatch):
    """Decode steps over one cache whose lengths grow in place: from the second step on, the
    split decode's launches replay as one CUDA graph (`launch_graphs`), which reads each
    step's lengths and queries; every step equals the direct launches' bit for bit."""
    spec = af.attention(af.causal())
    fn = af.compile(spec)
    q, k, v = (t.cuda() for t in cache(8, 32, 8, 1, 8192, 128, torch.float16, seed=4))
    lens = torch.empty(8, dtype=torch.int32, device="cuda")
    # The outputs' copies made before the steps: a step allocates only what the call does, so
    # its tensors come back at the same addresses (the caching allocator's steady state).
    copies = {mode: [torch.empty_like(q) for _step in range(5)] for mode in ("direct", "graphed")}

    def steps(mode: str) -> list[torch.Tensor]:
        for step, copy in enumerate(copies[mode]):
            lens.copy_(torch.tensor([8192 - 1000 * step, 1 + step, 4000 + step, 0, 7000, 64 * step, 3, 8000],
                                    dtype=torch.int32))
            q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(step)).to(q.dtype))
            copy.copy_(fn(q, k, v, kv_lens=lens))
        return copies[mode]

    direct, graphed = direct_then_graphed(steps, monkeypatch)
    for step, (want, got) in enumerate(zip(direct, graphed)):
        assert torch.equal(want, got), f"step {step} differs from the direct launches'"
    ref = af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu(), kv_lens=lens.cpu())
    assert_close_to_reference(graphed[-1].cpu(), ref, torch.float16)


@pytest.mark.parametrize("paged", [False, True])
def test_append_and_attend_in_one_cuda_graph(paged):
    """A decode step as serving systems run it, captured once: append the step's key (rotated
    in the append kernel) and value, advance kv_lens on the GPU, attend. Replayed three times,
    the cache and the outputs equal the reference on the unrotated keys."""
    spec = af.attention(af.rope(theta=500000.0), af.causal())
    fn = af.compile(spec, rope_placement=("fused", "given"))
    b, hq, hkv, d, capacity, page = 4, 32, 8, 128, 4096, 64
    gen = torch.Generator().manual_seed(5)
    keys = torch.randn(b, hkv, capacity, d, generator=gen).half()
    values = torch.randn(b, hkv, capacity, d, generator=gen).half()
    prompt = [100, 2000, 1, 4000]
    lens = torch.zeros(b, dtype=torch.int32, device="cuda")
    if paged:
        pages = capacity // page
        order = torch.randperm(b * pages, generator=gen)
        table = order.reshape(b, pages).to(torch.int32).cuda()
        k_cache = torch.zeros(b * pages, hkv, page, d, dtype=torch.float16, device="cuda")
        v_cache = torch.zeros_like(k_cache)
        extra = {"block_table": table}
    else:
        k_cache = torch.zeros(b, hkv, capacity, d, dtype=torch.float16, device="cuda")
        v_cache = torch.zeros_like(k_cache)
        extra = {}
    with torch.no_grad():
        for s in range(b):  # the prompts, one sequence at a time (the others append nothing)
            n = prompt[s]
            k_new = torch.zeros(b, hkv, n, d, dtype=torch.float16)
            v_new = torch.zeros_like(k_new)
            k_new[s], v_new[s] = keys[s, :, :n], values[s, :, :n]
            starts = torch.tensor([capacity if t != s else 0 for t in range(b)], dtype=torch.int32, device="cuda")
            fn.append_kv(k_cache, v_cache, k_new.cuda(), v_new.cuda(), starts, **extra)
        lens.copy_(torch.tensor(prompt, dtype=torch.int32))
        step_k = torch.empty(b, hkv, 1, d, dtype=torch.float16, device="cuda")
        step_v = torch.empty_like(step_k)
        q = torch.empty(b, hq, 1, d, dtype=torch.float16, device="cuda")

        def step():
            fn.append_kv(k_cache, v_cache, step_k, step_v, lens, **extra)
            lens.add_(1)
            return fn(q, k_cache, v_cache, kv_lens=lens, **extra)

        step_k.zero_(), step_v.zero_(), q.zero_()
        saved = lens.clone()
        step()  # warm: compiles both kernels outside the capture
        lens.copy_(saved)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        lens.copy_(saved)
        for _ in range(3):
            at = lens.cpu()
            step_k.copy_(torch.stack([keys[s, :, at[s]:at[s] + 1] for s in range(b)]))
            step_v.copy_(torch.stack([values[s, :, at[s]:at[s] + 1] for s in range(b)]))
            q.copy_(torch.randn(b, hq, 1, d, generator=gen).half())
            graph.replay()
            torch.cuda.synchronize()
            ref = af.reference_attention(spec, q.cpu(), keys, values, kv_lens=lens.cpu())
            assert_close_to_reference(out.cpu(), ref, torch.float16)
        assert lens.cpu().tolist() == [n + 3 for n in prompt]


@pytest.mark.parametrize("paged", [False, True])
def test_decode_with_and_without_programmatic_dependent_launch(paged, monkeypatch):
    """On a GPU of capability 9.0 and up the merge launches as the split kernel's programmatic
    dependent (waiting for it before reading the partials); `ATTNFUSE_DECODE_PDL=0` launches
    it after. Both give the same outputs, eagerly and replayed from a CUDA graph (whose
    capture turns the dependent launch into a programmatic edge), against the reference."""
    spec = af.attention(af.causal())
    b, hq, hkv, d, l_max, page = 4, 32, 8, 128, 4096, 64
    q, k, v = (t.cuda() for t in cache(b, hq, hkv, 1, l_max, d, torch.float16, seed=5))
    lens = torch.tensor([4096, 1, 2731, 1500], dtype=torch.int32, device="cuda")
    call = {"kv_lens": lens}
    keys, values = k, v
    if paged:
        pages = l_max // page
        keys = k.reshape(b, hkv, pages, page, d).permute(0, 2, 1, 3, 4).reshape(b * pages, hkv, page, d).contiguous()
        values = v.reshape(b, hkv, pages, page, d).permute(0, 2, 1, 3, 4).reshape(b * pages, hkv, page, d).contiguous()
        call["block_table"] = torch.arange(b * pages, dtype=torch.int32, device="cuda").reshape(b, pages)
    outputs = {}
    hopper = torch.cuda.get_device_capability() >= (9, 0) and torch.version.hip is None
    for form in ("1", "0"):
        monkeypatch.setenv("ATTNFUSE_DECODE_PDL", form)
        fn = af.compile(spec)
        eager = fn(q, keys, values, **call)
        merge = fn.last.program.kernel("attention_merge")
        assert merge.launch_pdl == (form == "1" and hopper)
        assert ("gdc_wait()" in fn.last.source) == (form == "1" and hopper)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = fn(q, keys, values, **call)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, eager)
        outputs[form] = eager
    assert torch.equal(outputs["1"], outputs["0"])
    ref = af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu(), kv_lens=lens.cpu())
    assert_close_to_reference(outputs["1"].cpu(), ref, torch.float16)


@pytest.mark.parametrize("size", [7, 24])
def test_chunked_decode_at_positions_past_two_to_the_twenty(index_tile_blocks, size):
    """An element-wise filter that divides positions (`chunked(size)`, `floor(pos / size)`) at
    query positions past 2^21: the kernels' correctly rounded division (`tl.div_rn`) puts every
    key in its query's chunk exactly (an approximate one misplaces keys at chunk edges there),
    against the chunk written out by hand in float64."""
    spec = index_tile_blocks[f"chunked-{size}"]()
    length, nq = 2**21 + 5, 4
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, nq, 64, generator=gen).half().cuda()
    k, v = (torch.randn(1, 1, length, 64, generator=gen).half().cuda() for _ in range(2))
    out = spec(q, k, v, kv_lens=torch.tensor([length - 1], dtype=torch.int32, device="cuda"))
    rows = []
    for r in range(nq):
        i = length - 1 - nq + r  # the query's position: bottom-right over kv_lens = length - 1 keys
        first = i // size * size
        s = q[0, :, r].double() @ k[0, 0, first:i + 1].double().T / 8.0
        rows.append(torch.softmax(s, -1) @ v[0, 0, first:i + 1].double())
    assert_close_to_reference(out[0].transpose(0, 1).cpu(), torch.stack(rows).cpu(), torch.float16)
