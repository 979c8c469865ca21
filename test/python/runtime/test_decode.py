"""KV-cache decoding through the kernels: `kv_lens=` (contiguous caches) and `block_table=`
(paged caches), on Triton's CPU interpreter, against the float64 reference.

The call (docs/semantics.md, DESIGN.md "Decoding"): sequence b of a cache k, v `[B, Hkv,
L_max, D]` has keys `j < kv_lens[b]` (int32 `[B]`), its query i sits at position
`kv_lens[b] - Nq + i`, key j at j, and relu's `/Nk` and sigmoid's `-ln(Nk)` use
`Nk = kv_lens[b]`. With `block_table=` (int32 `[B, max_pages]`) k and v are page pools
`[num_pages, Hkv, page_size, D]` and key j of sequence b is row `j % page_size` of page
`block_table[b, j // page_size]`; table entries past a sequence's pages are never read. A
sequence with no key outputs 0 with lse -inf. Decoding is inference-only: a call autograd
would record is an `ArgumentError`.

Every case runs ragged lengths (0, 1, L_max and lengths that are no multiple of 16) over
pages in shuffled order, shared between sequences (a common prefix), with -1 in the table
past each sequence's pages; `CASES` spreads GQA ratios 1/4/8 (Hq = 8), Nq 1/4/16, fp32/fp16
and contiguous/page size 16/32 over every variant (a meta-test keeps that coverage).
Tolerances are the acceptance ones (conftest: fp32 max abs 1e-4, fp16 relative L2 1e-2, lse
per `lse_tolerance`); NaN never passes.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import replace

import pytest
import torch
from conftest import assert_close_to_reference, assert_lse_close, lse_tolerance

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime.reference import Rotation, gather_pages, rotate

pytestmark = pytest.mark.interpreter

HQ = 8
GIVEN = ("fused", "given")

# --------------------------------------------------------------------------------------------
# Caches
# --------------------------------------------------------------------------------------------


def lengths(batch: int, l_max: int) -> list[int]:
    """Ragged kv_lens: the full cache, one not a multiple of 16, none, one key, then more."""
    return [l_max, l_max - 19, 0, 1, 37][:batch]


def make_cache(batch, hkv, nq, l_max, d, dtype, seed, q_scale=1.0):
    """Seeded q `[B, Hq, Nq, D]` and a contiguous cache k, v `[B, Hkv, L_max, D]`."""
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, HQ, nq, d, generator=gen) * q_scale).to(dtype)
    k = torch.randn(batch, hkv, l_max, d, generator=gen).to(dtype)
    v = torch.randn(batch, hkv, l_max, d, generator=gen).to(dtype)
    return q, k, v


def paginate(k, v, lens, page_size, seed, *, spare_fill=None, past_end=-1):
    """Page pools and a block table holding the caches k, v (changed where sequences share
    pages: returned too). Pages come in shuffled order; sequence 1 shares sequence 0's full
    pages of a common prefix (up to 2); 3 spare pages (random, or `spare_fill`) belong to no
    sequence; table entries past a sequence's pages are `past_end` (or, given "spare", a
    spare page)."""
    batch, hkv, l_max, d = k.shape
    assert l_max % page_size == 0
    k, v = k.clone(), v.clone()
    shared = min(2, lens[0] // page_size, lens[1] // page_size) if batch > 1 else 0
    k[1, :, : shared * page_size] = k[0, :, : shared * page_size]
    v[1, :, : shared * page_size] = v[0, :, : shared * page_size]
    needed = [-(-n // page_size) for n in lens]
    slots = [(b, p) for b in range(batch) for p in range(needed[b]) if not (b == 1 and p < shared)]
    gen = torch.Generator().manual_seed(seed)
    num_pages = len(slots) + 3
    order = torch.randperm(num_pages, generator=gen).tolist()
    pool_k = torch.randn(num_pages, hkv, page_size, d, generator=gen).to(k.dtype)
    pool_v = torch.randn(num_pages, hkv, page_size, v.shape[-1], generator=gen).to(v.dtype)
    spare = order[len(slots):]
    if spare_fill is not None:
        pool_k[spare], pool_v[spare] = spare_fill, spare_fill
    table = torch.full((batch, l_max // page_size), spare[0] if past_end == "spare" else past_end, dtype=torch.int32)
    for (b, p), page in zip(slots, order):
        table[b, p] = page
        pool_k[page] = k[b, :, p * page_size : (p + 1) * page_size]
        pool_v[page] = v[b, :, p * page_size : (p + 1) * page_size]
    table[1, :shared] = table[0, :shared]
    return k, v, pool_k, pool_v, table


def test_paginate_holds_the_caches():
    """The helper itself: the pools hold the caches, pages are shared and shuffled."""
    _q, k, v = make_cache(5, 2, 1, 96, 16, torch.float32, 0)
    lens = lengths(5, 96)
    k2, v2, pool_k, pool_v, table = paginate(k, v, lens, 16, 0)
    for cache, pool in ((k2, pool_k), (v2, pool_v)):
        gathered = gather_pages(pool, table, lens, 96)
        for b, n in enumerate(lens):
            assert torch.equal(gathered[b, :, :n], cache[b, :, :n])
    assert torch.equal(table[0, :2], table[1, :2])  # shared
    assert (table[2] == -1).all() and (table[3, 1:] == -1).all()
    assert not torch.equal(table[0], torch.sort(table[0]).values)  # out of order


# --------------------------------------------------------------------------------------------
# Running a case
# --------------------------------------------------------------------------------------------


def run_case(fn, spec, q, k, v, lens, *, page_size=None, lse=True, placement="auto", seed=0, **data):
    """`fn` on the cache (paginated with `page_size`, else contiguous) with kv_lens `lens`,
    against the reference on the contiguous cache: output, and lse with `lse`."""
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    call: dict = {"kv_lens": kv_lens, **data}
    if page_size is None:
        keys, values = k, v
    else:
        k, v, keys, values, call["block_table"] = paginate(k, v, lens, page_size, seed)
    ref_call = {"kv_lens": kv_lens, "rope_placement": placement, **data}
    if lse:
        ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True, **ref_call)
        out, out_lse = fn(q, keys, values, return_lse=True, **call)
        assert_close_to_reference(out, ref, q.dtype)
        assert_lse_close(out_lse, ref_lse, lse_tolerance(spec, q, k))
        for b, n in enumerate(lens):
            if n == 0:
                assert torch.isneginf(out_lse[b]).all()
    else:
        ref = af.reference_attention(spec, q, k, v, **ref_call)
        out = fn(q, keys, values, **call)
        assert_close_to_reference(out, ref, q.dtype)
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b] == 0).all(), f"sequence {b} has no key: its output must be 0"
    return out


def bias_data(batch, nq, l_max, lens, gen):
    """A bias `[B, Hq, Nq, L_max]` with some -inf entries (dropped keys)."""
    bias = 2 * torch.randn(batch, HQ, nq, l_max, generator=gen)
    bias[..., 3::7] = float("-inf")
    return {"bias": bias}


def doc_data(batch, nq, l_max, lens, gen):
    """doc_ids `[B, L_max]`: a few documents per sequence, left padding on odd ones, and on
    sequence 0 the last query's position is padding (its row keeps nothing)."""
    rows = []
    for b in range(batch):
        row = torch.zeros(l_max, dtype=torch.int32)
        for cut in torch.randperm(l_max - 1, generator=gen)[:3] + 1:
            row[int(cut):] += 1
        if b % 2:
            row[:5] = -1
        rows.append(row)
    ids = torch.stack(rows)
    ids[0, lens[0] - 1] = -1
    return {"doc_ids": ids}


# name: (blocks, call-time data, q scale, softmax?)
VARIANTS = {
    "plain": (lambda: [], None, 1.0, True),
    "causal": (lambda: [af.causal()], None, 1.0, True),
    "window": (lambda: [af.sliding_window(24), af.causal()], None, 1.0, True),
    "alibi": (lambda: [af.alibi(), af.causal()], None, 1.0, True),
    "bias": (lambda: [af.additive_bias()], bias_data, 1.0, True),
    # q scaled up so that scores reach the cap's curved range (checked below).
    "softcap": (lambda: [af.softcap(30.0), af.causal()], None, 12.0, True),
    "document": (lambda: [af.document()], doc_data, 1.0, True),
    "rope": (lambda: [af.rope(theta=10000.0), af.causal()], None, 1.0, True),
    "rope-given": (lambda: [af.rope(theta=10000.0), af.causal()], None, 1.0, True),
    "relu": (lambda: [af.relu()], None, 1.0, False),
    "sigmoid": (lambda: [af.sigmoid()], None, 1.0, False),
}

FP32, FP16 = torch.float32, torch.float16
# (variant, dtype, Hkv, Nq, layout: None contiguous or the page size, L_max, D)
CASES = [
    ("plain", FP32, 2, 1, 16, 96, 16),
    ("plain", FP16, 8, 4, None, 128, 32),
    ("causal", FP16, 1, 16, 32, 128, 16),
    ("causal", FP32, 8, 1, None, 96, 32),
    ("window", FP32, 2, 4, 32, 192, 16),
    ("window", FP16, 1, 1, None, 96, 16),
    ("alibi", FP16, 2, 1, 16, 96, 32),
    ("alibi", FP32, 1, 16, None, 128, 16),
    ("bias", FP32, 8, 4, 16, 96, 16),
    ("bias", FP16, 2, 16, None, 96, 16),
    ("softcap", FP32, 1, 1, 32, 128, 16),
    ("softcap", FP16, 8, 4, None, 96, 16),
    ("document", FP16, 2, 4, 16, 128, 16),
    ("document", FP32, 2, 1, None, 96, 32),
    ("rope", FP32, 2, 1, 16, 192, 32),
    ("rope", FP16, 8, 16, None, 96, 16),
    ("rope-given", FP16, 2, 1, 32, 128, 32),
    ("rope-given", FP32, 1, 4, None, 96, 16),
    ("relu", FP32, 2, 4, 32, 96, 16),
    ("relu", FP16, 1, 1, None, 128, 16),
    ("sigmoid", FP16, 8, 1, 16, 96, 16),
    ("sigmoid", FP32, 2, 16, None, 96, 16),
]


def case_id(case) -> str:
    name, dtype, hkv, nq, layout, l_max, d = case
    dt = {FP32: "fp32", FP16: "fp16"}[dtype]
    where = "contiguous" if layout is None else f"page{layout}"
    return f"{name}-{dt}-gqa{HQ // hkv}-nq{nq}-{where}-L{l_max}-d{d}"


def test_cases_cover_the_matrix():
    """Every variant contiguous and paged, every (GQA ratio, Nq) pair, both dtypes, both page
    sizes, with L_max up to 192."""
    assert {c[0] for c in CASES} == set(VARIANTS)
    assert all({c[4] is None for c in CASES if c[0] == name} == {True, False} for name in VARIANTS)
    assert {(HQ // c[2], c[3]) for c in CASES} == set(itertools.product([1, 4, 8], [1, 4, 16]))
    assert {c[1] for c in CASES} == {FP32, FP16} and {c[4] for c in CASES} == {None, 16, 32}
    assert max(c[5] for c in CASES) >= 192


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_decode_variant(case):
    name, dtype, hkv, nq, page_size, l_max, d = case
    blocks, data_of, q_scale, softmax = VARIANTS[name]
    spec = af.attention(*blocks())
    seed = sum(map(ord, case_id(case)))
    batch = 5 if nq == 1 else 4
    lens = lengths(batch, l_max)
    q, k, v = make_cache(batch, hkv, nq, l_max, d, dtype, seed, q_scale)
    data = {} if data_of is None else data_of(batch, nq, l_max, lens, torch.Generator().manual_seed(seed))
    placement, keys = "auto", k
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    if name == "rope-given":  # the cache holds R(j) k_j, as rotate_keys would have written it
        placement = GIVEN
        keys = rotate(k.double(), torch.arange(l_max), Rotation(10000.0, None, False, None)).to(dtype)
        given = af.reference_attention(spec, q, keys, v, kv_lens=kv_lens, rope_placement=GIVEN)
        plain = af.reference_attention(spec, q, k, v, kv_lens=kv_lens)
        assert (given - plain).abs().max() <= (2e-2 if dtype == FP16 else 1e-5)  # the same meaning
    if name == "softcap":  # the cap matters at these scores
        uncapped = af.reference_attention(af.attention(af.causal()), q, k, v, kv_lens=kv_lens)
        assert (af.reference_attention(spec, q, k, v, kv_lens=kv_lens) - uncapped).abs().max() > 0.1
    fn = af.compile(spec, rope_placement=placement)
    run_case(fn, spec, q, keys, v, lens, page_size=page_size, lse=softmax, placement=placement, seed=seed, **data)


# --------------------------------------------------------------------------------------------
# Shapes and layouts beyond the matrix
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "blocks, dtype, page_size",
    [([af.causal()], FP32, 16), ([], FP16, None)],
    ids=["causal-fp32-page16", "plain-fp16-contiguous"],
)
def test_decode_more_queries_than_keys(blocks, dtype, page_size):
    """Nq = 40 is no decode shape, and still right with kv_lens: sequences with fewer keys
    than queries put their first queries at negative positions (a causal row keeps nothing
    there). Called through the spec."""
    spec = af.attention(*blocks)
    lens = [96, 40, 7, 0, 1]
    q, k, v = make_cache(5, 2, 40, 96, 16, dtype, 40)
    run_case(spec, spec, q, k, v, lens, page_size=page_size, seed=40)


@pytest.mark.parametrize(
    "blocks, dtype, hkv",
    [([af.rope(theta=10000.0), af.causal()], FP16, 2), ([], FP32, 1)],
    ids=["rope-causal-fp16-gqa4", "plain-fp32-gqa8"],
)
def test_decode_without_kv_lens(blocks, dtype, hkv):
    """Nq = 1 over a full cache, no kv_lens: the plain call is a decode step too."""
    spec = af.attention(*blocks)
    q, k, v = make_cache(3, hkv, 1, 130, 32, dtype, 1)
    out, lse = af.compile(spec)(q, k, v, return_lse=True)
    ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True)
    assert_close_to_reference(out, ref, dtype)
    assert_lse_close(lse, ref_lse, lse_tolerance(spec, q, k))


def with_page_lookahead(monkeypatch, lookahead, hoist_page_rows=1):
    """Decode calls compiled from here on read their block tables `lookahead` steps ahead
    (`TileConfig.page_lookahead`; 1 is the default) and hoist their keys' page rows or not
    (`TileConfig.hoist_page_rows`; 1 is the default)."""
    from attnfuse.runtime import planning

    original = planning.decode_tile_config
    monkeypatch.setattr(planning, "decode_tile_config",
                        lambda problem, paged=False: replace(original(problem, paged), page_lookahead=lookahead,
                                                             hoist_page_rows=hoist_page_rows))


@pytest.mark.parametrize("lookahead, hoist", [(1, 1), (0, 1), (1, 0)],
                         ids=["ids-ahead", "ids-in-step", "rows-per-key"])
def test_decode_paged_equals_contiguous(monkeypatch, lookahead, hoist):
    """One cache, four layouts (contiguous, pages of 16, 32 and 64) and a sequence that
    reads a prefix of another's pages (2 shares 0's table, with fewer keys: its last page only
    in part): the same attention, whether a step reads its page ids a step ahead or in the
    step, and whether its keys' rows in their pages are computed once (`hoist_page_rows`) or
    per step. On the interpreter a step is 32 keys: pages of 16 take a table entry per key,
    of 32 one per step, of 64 one per step at row 0 or 32 of the page."""
    with_page_lookahead(monkeypatch, lookahead, hoist)
    spec = af.attention(af.alibi(), af.causal())
    fn = af.compile(spec)
    lens = [93, 64, 45, 0]
    q, k, v = make_cache(4, 2, 4, 128, 16, FP32, 7)
    k[2], v[2] = k[0], v[0]
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    contiguous = run_case(fn, spec, q, k, v, lens)
    for page_size in (16, 32, 64):
        k2, v2, pool_k, pool_v, table = paginate(k, v, lens, page_size, page_size)
        table[2] = table[0]  # the same pages as sequence 0
        table[2, -(-45 // page_size):] = -1
        ref = af.reference_attention(spec, q, k2, v2, kv_lens=kv_lens)
        out = fn(q, pool_k, pool_v, kv_lens=kv_lens, block_table=table)
        assert_close_to_reference(out, ref, FP32)
        # Sequence 1 took 0's first pages (paginate's shared prefix): the others' data is k's.
        torch.testing.assert_close(out[[0, 2, 3]], contiguous[[0, 2, 3]], rtol=0, atol=2e-5)
        # The kernels that ran read the ids and rows as asked (the parametrization took effect).
        source = fn.last.program.source
        assert ("next_page_ids" in source) == (lookahead == 1)
        assert ("page_rows = keys % PAGE_SIZE" in source) == (hoist == 0)


def cache_layout(k: torch.Tensor, layout: str) -> torch.Tensor:
    """`k`'s values in another memory layout: "packed" (as given, `[B, Hkv, L, D]`
    contiguous), "model" (a view of a `[B, L, Hkv, D]` tensor: rows Hkv * D apart) or
    "padded" (a view of rows twice as wide: rows 2D apart, NaN between them)."""
    if layout == "packed":
        return k
    if layout == "model":
        return k.transpose(1, 2).contiguous().transpose(1, 2)
    wide = torch.full((*k.shape[:-1], 2 * k.shape[-1]), float("nan"), dtype=k.dtype)
    wide[..., : k.shape[-1]] = k
    return wide[..., : k.shape[-1]]


@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "page16"])
@pytest.mark.parametrize("k_layout, v_layout", [("model", "packed"), ("packed", "padded"), ("model", "model"),
                                               ("padded", "padded")])
def test_decode_reads_caches_in_any_row_layout(page_size, k_layout, v_layout):
    """A cache (or page pool) whose rows are not packed, a model's `[B, L, H, D]` layout or
    padded rows holding NaN past D, gives the same attention as the packed one: the split
    kernel addresses its rows by their strides. Dv != D, so a stride taken from the other
    role's width would show, and Dv is no power of two, so a read past it into the NaN
    padding (a missing column mask) would too."""
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    fn = af.compile(spec)
    lens = [70, 51, 0]
    q, k, _ = make_cache(3, 2, 2, 96, 32, FP32, 11)
    v = torch.randn(3, 2, 96, 20, generator=torch.Generator().manual_seed(12))
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    call: dict = {"kv_lens": kv_lens}
    keys, values = k, v
    if page_size is not None:
        k, v, keys, values, call["block_table"] = paginate(k, v, lens, page_size, 3)
    ref = af.reference_attention(spec, q, k, v, kv_lens=kv_lens)
    out = fn(q, cache_layout(keys, k_layout), cache_layout(values, v_layout), **call)
    assert_close_to_reference(out, ref, FP32)
    torch.testing.assert_close(out, fn(q, keys, values, **call), rtol=0, atol=1e-6)


@pytest.mark.parametrize("page_size, lookahead", [(None, 1), (32, 1), (16, 1), (32, 0)],
                         ids=["contiguous", "page32", "page16", "page32-ids-in-step"])
def test_decode_never_reads_past_kv_lens(monkeypatch, page_size, lookahead):
    """Keys j >= kv_lens[b] do not exist: NaN there (the cache's tail, the tail of a
    sequence's last page, spare pages, and the pages the table names past a sequence's end)
    must reach no output, with page ids read a step ahead (the default) or in the step."""
    with_page_lookahead(monkeypatch, lookahead)
    spec = af.attention(af.causal())
    fn = af.compile(spec)
    lens = [96, 77, 0, 1, 37]
    q, k, v = make_cache(5, 2, 1, 96, 16, FP16, 9)
    clean_k = k.clone()
    for b, n in enumerate(lens):
        k[b, :, n:], v[b, :, n:] = float("nan"), float("nan")
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    call = {"kv_lens": kv_lens}
    keys, values = k, v
    if page_size is not None:
        k, v, keys, values, call["block_table"] = paginate(k, v, lens, page_size, 9, spare_fill=float("nan"),
                                                           past_end="spare")
        assert torch.isnan(keys).any() and torch.isnan(values).any()
    ref, ref_lse = af.reference_attention(spec, q, k, v, kv_lens=kv_lens, return_lse=True)
    out, lse = fn(q, keys, values, return_lse=True, **call)
    assert_close_to_reference(out, ref, FP16)
    assert_lse_close(lse, ref_lse, lse_tolerance(spec, q, clean_k))


def guarded_pools(pool_k, pool_v):
    """The pools as views into buffers one page longer at each end, the extra pages NaN: a
    read one page before or past the pools, from an entry -1 or `num_pages`, shows as NaN."""
    guarded = []
    for pool in (pool_k, pool_v):
        buffer = torch.full((pool.shape[0] + 2, *pool.shape[1:]), float("nan"), dtype=pool.dtype)
        buffer[1:-1] = pool
        guarded.append(buffer[1:-1])
    return guarded


@pytest.mark.parametrize("nq, page_size, lookahead, hoist", [
    (1, 32, 1, 1), (1, 16, 1, 1), (1, 16, 0, 1), (4, 16, 1, 0), (20, 16, 1, 1)],
    ids=["decode-page32", "decode-page16", "decode-ids-in-step", "decode-rows-per-key", "one-pass-page16"])
def test_page_ids_outside_the_pools_read_no_memory_outside_them(monkeypatch, nq, page_size, lookahead, hoist):
    """Block-table entries are the caller's data, read on the GPU: one outside `[0,
    num_pages)` where a sequence has keys is clamped into the pools (docs/semantics.md, "KV
    caches"), so the call reads the pools' first or last page there and never the memory
    around them (here NaN), in the split decode kernels (every way of reading the table) and
    in the one-pass kernel (more than 16 queries)."""
    with_page_lookahead(monkeypatch, lookahead, hoist)
    spec = af.attention(af.causal())
    fn = af.compile(spec)
    lens = [96, 77, 0, 1]
    q, k, v = make_cache(4, 2, nq, 96, 16, FP32, 13)
    _k, _v, pool_k, pool_v, table = paginate(k, v, lens, page_size, 13)
    num_pages = pool_k.shape[0]
    table[0, 1], table[1, 0], table[3, 0] = num_pages, -1, num_pages + 1
    keys, values = guarded_pools(pool_k, pool_v)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    out, lse = fn(q, keys, values, kv_lens=kv_lens, block_table=table, return_lse=True)
    clamped = table.clamp(0, num_pages - 1)
    ref, ref_lse = af.reference_attention(spec, q, pool_k, pool_v, kv_lens=kv_lens, block_table=clamped,
                                          return_lse=True)
    assert_close_to_reference(out, ref, FP32)
    assert_lse_close(lse, ref_lse, lse_tolerance(spec, q, k))


def test_an_empty_page_pool_is_refused():
    """With no page in the pools there is none to clamp a table entry to: refused."""
    q, _k, _v, pool_k, pool_v, table, lens = error_inputs()
    with argument_error("no pages"):
        af.compile(af.attention(af.causal()))(q, pool_k[:0], pool_v[:0], kv_lens=lens, block_table=table)


def test_decode_under_no_grad_with_requires_grad_inputs():
    """Only a call autograd would record is refused: under no_grad, inputs that require grad
    (a model's parameters' products in eval) decode as usual."""
    spec = af.attention(af.causal())
    lens = [50, 0, 64]
    q, k, v = make_cache(3, 2, 1, 64, 16, FP32, 11)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with torch.no_grad():
        out = af.compile(spec)(q, k, v, kv_lens=torch.tensor(lens, dtype=torch.int32))
    assert not out.requires_grad
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v, kv_lens=torch.tensor(lens)), FP32)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def argument_error(match: str):
    """An `ArgumentError` naming the argument, not today's "unexpected argument(s)"."""
    with pytest.raises(af.AttnFuseError, match=match) as info:
        yield
    assert isinstance(info.value, ArgumentError), type(info.value)
    assert "unexpected argument" not in str(info.value), f"kv_lens/block_table not accepted: {info.value}"


def error_inputs():
    q, k, v = make_cache(2, 2, 1, 32, 16, FP32, 12)
    lens = [3, 32]
    _k, _v, pool_k, pool_v, table = paginate(k, v, lens, 16, 12)
    return q, k, v, pool_k, pool_v, table, torch.tensor(lens, dtype=torch.int32)


def test_decode_errors_block_table_without_kv_lens():
    q, _k, _v, pool_k, pool_v, table, _lens = error_inputs()
    with argument_error("block_table"):
        af.compile(af.attention(af.causal()))(q, pool_k, pool_v, block_table=table)


@pytest.mark.parametrize(
    "bad",
    [lambda lens: lens[:1], lambda lens: torch.cat([lens, lens]), lambda lens: lens[:, None],
     lambda lens: lens.float()],
    ids=["short", "long", "2-D", "float32"],
)
def test_decode_errors_bad_kv_lens(bad):
    q, k, v, pool_k, pool_v, table, lens = error_inputs()
    fn = af.compile(af.attention(af.causal()))
    with argument_error("kv_lens"):
        fn(q, k, v, kv_lens=bad(lens))
    with argument_error("kv_lens"):
        fn(q, pool_k, pool_v, kv_lens=bad(lens), block_table=table)


@pytest.mark.parametrize("leaf", ["q", "k", "v"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decode_errors_requires_grad(leaf, paged):
    """Decoding is inference-only: a call autograd would record is refused, naming the
    decode arguments."""
    q, k, v, pool_k, pool_v, table, lens = error_inputs()
    tensors = {"q": q, "k": pool_k if paged else k, "v": pool_v if paged else v}
    tensors[leaf] = tensors[leaf].clone().requires_grad_()
    call = {"kv_lens": lens, **({"block_table": table} if paged else {})}
    with argument_error("kv_lens|block_table"):
        af.compile(af.attention(af.causal()))(tensors["q"], tensors["k"], tensors["v"], **call)


# --------------------------------------------------------------------------------------------
# Placements and index tensors the kernels cannot take as given
# --------------------------------------------------------------------------------------------


def test_query_rotation_with_lengths_runs_in_kernel(monkeypatch):
    """A query's positions depend on kv_lens, which only the attention kernels read: with
    placement auto it rotates in-kernel even where the Rotation Calculus would pre-rotate it
    (from 8192 queries; scaled down to 32 here), and an explicit pre-rotation is an error,
    never a rotation at the wrong positions."""
    import attnfuse.transforms.rotation_calculus as calculus

    monkeypatch.setattr(calculus, "QUERY_PRE_ROTATION_MIN_SEQ", 32)
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    q, k, v = make_cache(2, 2, 40, 64, 16, torch.float32, 5)
    lens = torch.tensor([50, 64], dtype=torch.int32)
    fn = af.compile(spec, rope_placement=("auto", "given"))
    out = fn(q, k, v)  # without lengths the calculus pre-rotates this query...
    assert "rotate_query" in [info.name for info in fn.last.program.kernels]
    out = fn(q, k, v, kv_lens=lens)  # ...with them it cannot
    assert "rotate_query" not in [info.name for info in fn.last.program.kernels]
    ref = af.reference_attention(spec, q, k, v, kv_lens=lens, rope_placement=("auto", "given"))
    assert_close_to_reference(out, ref, torch.float32)
    for placement in ("pre_rotated", ("pre_rotated", "fused")):
        with pytest.raises(ArgumentError, match="query 'pre_rotated' cannot take kv_lens="):
            af.compile(spec, rope_placement=placement)(q, k, v, kv_lens=lens)


@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "page16"])
def test_call_time_positions_index_the_cache(page_size):
    """`q_positions=` `[B, Nq]` and `k_positions=` `[L_max]` with kv_lens=: each sequence's
    result is the call on its own keys alone (`k_positions[:kv_lens[b]]`, no lengths), whose
    masks sit at the same bottom-right positions; the rotation follows the given positions."""
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    lens = [50, 64, 17]
    q, k, v = make_cache(3, 2, 4, 64, 16, torch.float32, 11)
    q_positions = torch.tensor([[3, 9, 27, 81], [-5, 0, 5, 2**20], [7, 7, 7, 7]])
    k_positions = torch.randperm(64, generator=torch.Generator().manual_seed(3)) * 5 - 40
    call = {"kv_lens": torch.tensor(lens, dtype=torch.int32)}
    k_cache, v_cache = k, v
    if page_size is not None:
        k, v, k_cache, v_cache, call["block_table"] = paginate(k, v, lens, page_size, seed=4)
    out = spec(q, k_cache, v_cache, q_positions=q_positions, k_positions=k_positions, **call)
    for b, n in enumerate(lens):
        alone = spec(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                     q_positions=q_positions[b], k_positions=k_positions[:n])
        assert_close_to_reference(out[b:b + 1], alone.double(), torch.float32)
    ref = af.reference_attention(spec, q, k_cache, v_cache, q_positions=q_positions, k_positions=k_positions, **call)
    assert_close_to_reference(out, ref, torch.float32)


def test_pre_rotated_key_refused_for_a_paged_cache():
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    q, k, v = make_cache(2, 2, 1, 64, 16, torch.float32, 6)
    lens = [64, 30]
    _k, _v, pool_k, pool_v, table = paginate(k, v, lens, 16, 6)
    with pytest.raises(ArgumentError, match="key 'pre_rotated' cannot take a paged cache"):
        af.compile(spec, rope_placement=("fused", "pre_rotated"))(
            q, pool_k, pool_v, kv_lens=torch.tensor(lens, dtype=torch.int32), block_table=table)


def test_kv_lens_views_are_refused():
    """kv_lens is read at offset b: a strided or expanded view would read other values."""
    spec = af.attention(af.causal())
    q, k, v = make_cache(2, 2, 1, 32, 16, torch.float32, 7)
    fn = af.compile(spec)
    for lens in (torch.tensor([10, 5, 32, 7], dtype=torch.int32)[::2],
                 torch.tensor([9], dtype=torch.int32).expand(2)):
        with pytest.raises(ArgumentError, match="kv_lens= must be contiguous"):
            fn(q, k, v, kv_lens=lens)


def test_block_sparse_with_lengths_is_refused_at_any_size():
    spec = af.attention(af.block_sparse(16))
    q, k, v = make_cache(2, 2, 1, 32, 16, torch.float32, 8)
    layout = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ArgumentError, match="kv_lens= cannot combine with block_sparse"):
        af.compile(spec)(q, k, v, kv_lens=torch.tensor([32, 3], dtype=torch.int32), block_layout=layout)


# --------------------------------------------------------------------------------------------
# Under torch.compile and torch.export (the attention_cache operator)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("paged", [False, True])
def test_cache_calls_compile_and_export(paged):
    """A decode step over a cache traces with no graph break (`attnfuse::attention_cache`)
    and equals the eager call; the exported program takes new lengths (and tables)."""
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    fn = af.compile(spec, rope_placement=GIVEN)
    q, k, v = make_cache(2, 2, 1, 64, 16, torch.float32, 9)
    lens = [64, 30]
    call = {"kv_lens": torch.tensor(lens, dtype=torch.int32)}
    if paged:
        _k, _v, k, v, call["block_table"] = paginate(k, v, lens, 16, 9)

    def step(q, k, v, kv_lens, block_table=None):
        return fn(q, k, v, kv_lens=kv_lens, block_table=block_table) * 2.0

    eager = step(q, k, v, **call)
    compiled = torch.compile(step, fullgraph=True)(q, k, v, **call)
    assert torch.equal(compiled, eager)

    class Step(torch.nn.Module):
        def forward(self, q, k, v, kv_lens, block_table=None):
            return step(q, k, v, kv_lens, block_table)

    exported = torch.export.export(Step(), (q, k, v), call).module()
    assert torch.equal(exported(q, k, v, **call), eager)
    # New lengths within each sequence's pages (a table entry read must name a page).
    call["kv_lens"] = torch.tensor([17, 25], dtype=torch.int32)
    assert torch.equal(exported(q, k, v, **call), step(q, k, v, **call))


def test_cache_operator_passes_opcheck_and_refuses_gradients():
    fn = af.compile(af.attention(af.causal()))
    q, k, v = make_cache(2, 2, 1, 32, 16, torch.float32, 10)
    lens = torch.tensor([32, 5], dtype=torch.int32)
    torch.library.opcheck(torch.ops.attnfuse.attention_cache,
                          (fn.operator_key(), q, k, v, lens, None, None, [None] * 2, None, None))
    # Queries of a model's [B, N, H, D] projection (Nq = 4): the output in their memory order,
    # the fake kernel's as the real one's.
    q4 = torch.randn(2, 4, 2, 16).transpose(1, 2)
    torch.library.opcheck(torch.ops.attnfuse.attention_cache,
                          (fn.operator_key(), q4, k, v, lens, None, None, [None] * 2, None, None))
    out = fn(q4, k, v, kv_lens=lens)
    assert out.stride() == q4.stride()
    ref = af.reference_attention(af.attention(af.causal()), q4, k, v, kv_lens=lens)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    q.requires_grad_()
    # Under fullgraph, dynamo reports the ArgumentError inside its own exception.
    with pytest.raises((ArgumentError, torch._dynamo.exc.Unsupported), match="inference-only"):
        torch.compile(lambda q: fn(q, k, v, kv_lens=lens), fullgraph=True)(q)
    with pytest.raises(ArgumentError, match="inference-only"):
        fn(q, k, v, kv_lens=lens)


# --------------------------------------------------------------------------------------------
# The last-split merge (lower-to-tile decode-merge=last-split)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["causal", "relu", "alibi"])
@pytest.mark.parametrize("paged", [False, True])
def test_last_split_merge_matches_the_reference(monkeypatch, name, paged):
    """The one-kernel decode: the last split program of each row block merges the partials;
    called twice, so the arrival counts it resets are seen again."""
    from attnfuse.runtime import kv_cache

    monkeypatch.setattr(kv_cache, "DECODE_MERGE", "last-split")
    spec = {"causal": af.attention(af.causal()), "relu": af.attention(af.relu()),
            "alibi": af.attention(af.alibi(), af.causal())}[name]
    fn = af.compile(spec)
    q, k, v = make_cache(3, 2, 4, 96, 16, torch.float32, 11)
    lens = [96, 77, 0]
    for _call in range(2):
        out = run_case(fn, spec, q, k, v, lens, page_size=16 if paged else None, lse=name != "relu")
    assert "attention_merge" not in [info.name for info in fn.last.program.kernels]
    assert out is not None


def test_page_pools_of_different_page_sizes_are_named_so():
    fn = af.compile(af.attention(af.causal()))
    q = torch.randn(2, HQ, 1, 16)
    k, v = torch.randn(6, 2, 16, 16), torch.randn(6, 2, 8, 16)
    table = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ArgumentError, match="v's pages must have k's page size 16, got 8"):
        fn(q, k, v, kv_lens=torch.tensor([3, 4], dtype=torch.int32), block_table=table)


# --------------------------------------------------------------------------------------------
# Merges over several steps
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, merge", [("causal", "kernel"), ("relu", "kernel"), ("causal", "last-split")])
def test_merge_over_several_steps_matches_the_reference(monkeypatch, name, merge):
    """A merge whose splits take several steps rescales across steps as within one: at head
    dim 256 a merge step holds 32 splits (the merge kernel's one row) or 2 (the last split's 16
    rows, `lowering/triton/splits.py`'s `splits_per_step`), and 40 splits take 2 or 20 steps, over
    ragged lengths with an empty sequence. (On a GPU: an MQA cache over many SMs.)"""
    from attnfuse.runtime import kv_cache

    monkeypatch.setattr(kv_cache, "INTERPRETER_SPLITS", 40)
    monkeypatch.setattr(kv_cache, "DECODE_MERGE", merge)
    spec = {"causal": af.attention(af.causal()), "relu": af.attention(af.relu())}[name]
    fn = af.compile(spec)
    q, k, v = make_cache(3, 1, 1, 1280, 256, torch.float32, 23)
    run_case(fn, spec, q, k, v, [1280, 1011, 0], lse=name != "relu")
    per_step = 32 if merge == "kernel" else 2
    assert f"tl.arange(0, {per_step})  # the step's splits" in fn.last.source


@pytest.mark.parametrize("batch, seq_k, splits", [
    (8, 8192, 2),     # 64 programs a split: 2 splits fill one wave of 132, 3 would leave 1.45 waves
    (1, 16384, 16),   # 8 programs a split: 16 (128 programs; 17 would round to 16 whole-block splits)
    (4, 8192, 4),     # 32 a split: 4 (128) rather than 5 (160, which rounding up gave)
    (2, 8192, 8),     # 16 a split: 8 (128) rather than 9 (144)
    (16, 32768, 2),   # 128 a split: 1 and 2 fill their waves alike; the larger count is kept
    (32, 8192, 1),    # more programs than SMs: one split
    (1, 512, 2),      # a short cache: splits of at least MIN_SPLIT_BLOCKS key blocks
])
def test_split_plan_fills_whole_waves(monkeypatch, batch, seq_k, splits):
    """On a GPU the split count is the one, of those nearest a program per SM from below and
    from above, whose programs fill their waves best (an H100's and H200's 132 SMs here)."""
    from types import SimpleNamespace

    from attnfuse.runtime import kv_cache

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    problem = SimpleNamespace(seq_k=seq_k, batch=batch, heads_kv=8, group_size=4, seq_q=1, device=torch.device("cuda"))
    count, split_len = kv_cache.split_plan(problem, 16, 64)
    assert count == splits
    assert split_len % 64 == 0 and (count - 1) * split_len < seq_k <= count * split_len
    assert split_len >= kv_cache.MIN_SPLIT_BLOCKS * 64 or count == 1
