"""`CompiledAttention.append_kv`: new keys and values written into a KV cache in one kernel
(`append_kv`, the `appended_keys` grid), on Triton's CPU interpreter, against torch.

Key `i` of sequence `b` goes to cache position `kv_lens[b] + i` (contiguous cache) or to that
position's page (paged cache); for a variant whose keys arrive rotated
(`rope_placement=(..., "given")`) it is stored as `R(kv_lens[b] + i) k_i`, by the float64
rotation of the semantics; other variants' caches store it as given. Nothing else of the cache
changes, and positions past its capacity are not written."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to_reference

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime.reference import Rotation, gather_pages, rotate

pytestmark = pytest.mark.interpreter

THETA = 10000.0
SPEC = af.attention(af.rope(theta=THETA), af.causal())


def expected_cache(cache, new, lens, rotated):
    """The cache after the append, computed with torch (float64 rotation)."""
    out = cache.clone()
    capacity = cache.shape[2]
    for b, n in enumerate(lens):
        positions = torch.arange(n, n + new.shape[2])
        keep = positions < capacity
        value = new[b]
        if rotated:
            value = rotate(new[b:b + 1].double(), positions, Rotation(THETA, None, False, None))[0].to(new.dtype)
        out[b][:, positions[keep]] = value[:, keep]
    return out


def paged_pools(batch, heads, capacity, page, dim, dtype, seed):
    """Empty-but-random page pools with shuffled tables covering each sequence's capacity."""
    gen = torch.Generator().manual_seed(seed)
    pages = capacity // page
    order = torch.randperm(batch * pages + 2, generator=gen)
    table = order[: batch * pages].reshape(batch, pages).to(torch.int32)
    pools = [torch.randn(batch * pages + 2, heads, page, dim, generator=gen).to(dtype) for _ in range(2)]
    return pools, table


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("given", [True, False])
@pytest.mark.parametrize("page", [None, 16])
def test_append_writes_each_key_at_its_position(dtype, given, page):
    fn = af.compile(SPEC, rope_placement=("fused", "given") if given else "auto")
    batch, heads, capacity, dim, new = 3, 2, 48, 16, 5
    gen = torch.Generator().manual_seed(1)
    k, v = (torch.randn(batch, heads, new, dim, generator=gen).to(dtype) for _ in range(2))
    lens = [0, 20, 45]  # the last sequence has room for 3 of the 5 new keys
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    if page is None:
        k_cache, v_cache = (torch.randn(batch, heads, capacity, dim, generator=gen).to(dtype) for _ in range(2))
        before = (k_cache.clone(), v_cache.clone())
        fn.append_kv(k_cache, v_cache, k, v, kv_lens)
        got = (k_cache, v_cache)
    else:
        (k_pool, v_pool), table = paged_pools(batch, heads, capacity, page, dim, dtype, 2)
        before = tuple(gather_pages(pool, table, [capacity] * batch, capacity) for pool in (k_pool, v_pool))
        spare = (k_pool[-2:].clone(), v_pool[-2:].clone())
        fn.append_kv(k_pool, v_pool, k, v, kv_lens, block_table=table)
        got = tuple(gather_pages(pool, table, [capacity] * batch, capacity) for pool in (k_pool, v_pool))
        assert torch.equal(k_pool[-2:], spare[0]) and torch.equal(v_pool[-2:], spare[1]), "a page no table lists changed"
    atol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(got[0], expected_cache(before[0], k, lens, given), rtol=0, atol=atol)
    assert torch.equal(got[1], expected_cache(before[1], v, lens, False))
    if given and dtype != torch.float32:
        # Rounded once, as `rotate_keys` rounds (its rotation in fp32, then to the dtype): the
        # same bits, bf16 on Triton's CPU interpreter included (which truncates its casts).
        positions = torch.tensor(lens)[:, None] + torch.arange(new)
        rotated = fn.rotate_keys(k, positions)
        for b, n in enumerate(lens):
            room = min(new, capacity - n)
            assert torch.equal(got[0][b, :, n:n + room], rotated[b, :, :room]), b


def test_a_decode_loop_of_appends_and_attention_matches_the_reference():
    """Three steps of (append the step's key and value, advance kv_lens, attend) over a paged
    cache whose keys are stored rotated equal attention over the unrotated keys."""
    fn = af.compile(SPEC, rope_placement=("fused", "given"))
    batch, heads_q, heads, dim, page = 2, 4, 2, 16, 16
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(batch, heads, 40, dim, generator=gen)
    values = torch.randn(batch, heads, 40, dim, generator=gen)
    (k_pool, v_pool), table = paged_pools(batch, heads, 48, page, dim, torch.float32, 4)
    # Two appends fill both prompts' first 30 keys; sequence 0's prompt is 7 keys long (its
    # keys past 7 are past its length: the steps' appends overwrite them).
    lengths = torch.zeros(batch, dtype=torch.int32)
    fn.append_kv(k_pool, v_pool, keys[:, :, :7], values[:, :, :7], lengths, block_table=table)
    lengths += 7
    fn.append_kv(k_pool, v_pool, keys[:, :, 7:30], values[:, :, 7:30], lengths, block_table=table)
    lengths = torch.tensor([7, 30], dtype=torch.int32)
    for _step in range(3):
        new_k = torch.stack([keys[b, :, lengths[b]:lengths[b] + 1] for b in range(batch)])
        new_v = torch.stack([values[b, :, lengths[b]:lengths[b] + 1] for b in range(batch)])
        fn.append_kv(k_pool, v_pool, new_k, new_v, lengths, block_table=table)
        lengths += 1
        q = torch.randn(batch, heads_q, 1, dim, generator=gen)
        out = fn(q, k_pool, v_pool, kv_lens=lengths, block_table=table)
        ref = af.reference_attention(SPEC, q, keys, values, kv_lens=lengths)
        assert_close_to_reference(out, ref, torch.float32)


def test_append_writes_nothing_at_page_ids_outside_the_pools():
    """A block-table entry outside `[0, num_pages)` at a position the append writes is the
    caller's error, which the kernel cannot raise (no host read): it writes nothing there,
    neither outside the pools (NaN guard pages around them stay NaN) nor on another page,
    and the other new keys land as usual."""
    fn = af.compile(SPEC, rope_placement=("fused", "given"))
    batch, heads, capacity, page, dim, new = 2, 2, 48, 16, 16, 20
    (k_pool, v_pool), table = paged_pools(batch, heads, capacity, page, dim, torch.float32, 5)
    pages = k_pool.shape[0]
    buffers = [torch.full((pages + 2, heads, page, dim), float("nan")) for _ in range(2)]
    for buffer, pool in zip(buffers, (k_pool, v_pool)):
        buffer[1:-1] = pool
    k_pool, v_pool = (buffer[1:-1] for buffer in buffers)
    gen = torch.Generator().manual_seed(6)
    k, v = (torch.randn(batch, heads, new, dim, generator=gen) for _ in range(2))
    lens = [3, 10]
    # Sequence 0 writes positions 3..22: page 0 and page 1 (its entry past the pools);
    # sequence 1 writes 10..29: page 0 (its entry -1) and page 1.
    good = table.clone()
    table[0, 1], table[1, 0] = pages, -1
    before = (k_pool.clone(), v_pool.clone())
    fn.append_kv(k_pool, v_pool, k, v, torch.tensor(lens, dtype=torch.int32), block_table=table)
    for buffer in buffers:
        assert torch.isnan(buffer[0]).all() and torch.isnan(buffer[-1]).all(), "written outside the pools"
    written = [(0, 0, 3, 16), (1, 1, 16, 30)]  # (sequence, slot, first position, end) of valid pages
    for pool, old, new_rows, rotated in ((k_pool, before[0], k, True), (v_pool, before[1], v, False)):
        expected = old.clone()
        for b, slot, lo, hi in written:
            rows = new_rows[b:b + 1, :, lo - lens[b]:hi - lens[b]]
            if rotated:
                rows = rotate(rows.double(), torch.arange(lo, hi), Rotation(THETA, None, False, None)).float()
            expected[good[b, slot], :, lo % page:lo % page + hi - lo] = rows[0]
        torch.testing.assert_close(pool, expected, rtol=0, atol=1e-6)


def test_append_errors():
    fn = af.compile(SPEC, rope_placement=("fused", "given"))
    k_cache, v_cache = torch.zeros(2, 2, 32, 16), torch.zeros(2, 2, 32, 16)
    k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    lens = torch.tensor([3, 4], dtype=torch.int32)
    with pytest.raises(ArgumentError, match="kv_lens= must be int32"):
        fn.append_kv(k_cache, v_cache, k, v, lens.long())
    with pytest.raises(ArgumentError, match="share one dtype"):
        fn.append_kv(k_cache.half(), v_cache, k, v, lens)
    with pytest.raises(ArgumentError, match="v must be"):
        fn.append_kv(k_cache, v_cache, k, v[:, :, :0], lens)
    with pytest.raises(ArgumentError, match="k_cache must be"):
        fn.append_kv(k_cache[:, :1], v_cache, k, v, lens)
    # New keys of another batch than the lengths': the message counts sequences by k (not q,
    # which append_kv has none of).
    with pytest.raises(ArgumentError, match=r"kv_lens= must have shape \[1\] \(one row per sequence, as k has 1\)"):
        fn.append_kv(k_cache[:1], v_cache[:1], k[:1], v[:1], lens)
    with pytest.raises(ArgumentError, match="no backward"):
        fn.append_kv(k_cache, v_cache, k.requires_grad_(), v, lens)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_caches_whose_elements_share_memory_are_refused(paged):
    """A cache whose positions share memory (an expanded view) would take every sequence's
    write at once: refused, naming it; views with distinct elements (a model's `[B, L, H, D]`
    layout, halves of one `[..., 2, ...]` buffer) are taken."""
    fn = af.compile(SPEC, rope_placement=("fused", "given"))
    k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    lens = torch.tensor([1, 1], dtype=torch.int32)
    call = {"block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)} if paged else {}
    shape = (4, 2, 16, 16) if paged else (2, 2, 32, 16)
    distinct = torch.zeros(shape)
    for shared in (torch.zeros(1, *shape[1:]).expand(shape), torch.zeros(*shape[:2], 1, 16).expand(shape)):
        with pytest.raises(ArgumentError, match="k_cache has elements that share memory"):
            fn.append_kv(shared, distinct.clone(), k, v, lens, **call)
        with pytest.raises(ArgumentError, match="v_cache has elements that share memory"):
            fn.append_kv(distinct.clone(), shared, k, v, lens, **call)
    same = distinct.clone()
    with pytest.raises(ArgumentError, match="k_cache and v_cache are one tensor"):
        fn.append_kv(same, same, k, v, lens, **call)
    both = torch.zeros(shape[0], 2, *shape[1:])  # k and v as halves of one buffer
    model = torch.zeros(shape[0], shape[2], shape[1], shape[3]).transpose(1, 2)
    fn.append_kv(both[:, 0], both[:, 1], k, v, lens, **call)
    fn.append_kv(model, model.clone(), k, v, lens, **call)
    assert both[:, 1].abs().sum() > 0 and model.abs().sum() > 0


def test_a_cache_without_positions_takes_nothing():
    """Pools with no page and a table with no entry (or a cache of length 0) hold no
    position: an append writes nothing, without an error (positions past the capacity are
    not written)."""
    fn = af.compile(SPEC, rope_placement=("fused", "given"))
    k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    lens = torch.tensor([0, 0], dtype=torch.int32)
    pools = torch.zeros(0, 2, 16, 16), torch.zeros(0, 2, 16, 16)
    fn.append_kv(*pools, k, v, lens, block_table=torch.zeros(2, 0, dtype=torch.int32))
    caches = torch.zeros(2, 2, 0, 16), torch.zeros(2, 2, 0, 16)
    fn.append_kv(*caches, k, v, lens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_negative_length_appends_at_the_start(dtype):
    """A length below 0 is taken as 0 (attention calls clamp lengths alike): the keys go to
    positions 0, 1, ..., rotated there for a variant whose keys arrive rotated."""
    fn = af.compile(SPEC, rope_placement=("fused", "given"))
    gen = torch.Generator().manual_seed(3)
    k, v = (torch.randn(2, 2, 3, 16, generator=gen).to(dtype) for _ in range(2))
    k_cache, v_cache = (torch.zeros(2, 2, 8, 16, dtype=dtype) for _ in range(2))
    fn.append_kv(k_cache, v_cache, k, v, torch.tensor([-5, 0], dtype=torch.int32))
    expected = expected_cache(torch.zeros_like(k_cache), k, [0, 0], True)
    torch.testing.assert_close(k_cache, expected, rtol=0, atol=1.6e-2 if dtype == torch.bfloat16 else 1e-6)
    assert torch.equal(v_cache[:, :, :3], v) and not v_cache[:, :, 3:].any()
