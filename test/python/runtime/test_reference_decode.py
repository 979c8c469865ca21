"""The reference with a KV cache: `kv_lens=` (sequence b has keys j < kv_lens[b], query i at
position kv_lens[b] - Nq + i) and `block_table=` (k, v as page pools), checked against a
naive loop written here from the semantics (per sequence, per head: explicit scores, an
explicit keep mask, torch's softmax over the kept keys), which shares no code with the
reference. Paged caches must give exactly the contiguous cache's result, with pages out of
order, shared between sequences, and garbage in the table past a sequence's length."""

from __future__ import annotations

import math

import pytest
import torch

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime.reference import gather_pages, reference_gradients

# --------------------------------------------------------------------------------------------
# The naive loop
# --------------------------------------------------------------------------------------------


def rotate_half_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face's `rotate_half` RoPE of `x [N, D]` at `pos [N]` (the angle an fp32
    product, as the semantics say the rotation is computed in fp32)."""
    d = x.shape[-1]
    inv_freq = (theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)).float()
    angle = (pos.float()[:, None] * inv_freq[None, :]).double()
    emb = torch.cat([angle, angle], dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


def alibi_slopes(n: int) -> list[float]:
    assert n & (n - 1) == 0, "the tests use a power-of-two head count"
    return [2 ** (-8 * (h + 1) / n) for h in range(n)]


def naive(q, k, v, kv_lens, *, causal=False, window=None, alibi=False, bias=None, softcap=None,
          doc_ids=None, rope=None, normalizer="softmax", q_positions=None, k_positions=None):
    """Attention of q `[B, Hq, Nq, D]` over a contiguous cache k, v `[B, Hkv, L_max, D]` with
    sequence b's keys `j < kv_lens[b]`, float64, one sequence and head at a time."""
    q, k, v = q.double(), k.double(), v.double()
    b_size, h_q, n_q, d = q.shape
    group = h_q // k.shape[1]
    out = torch.zeros(b_size, h_q, n_q, v.shape[-1], dtype=torch.float64)
    lse = torch.full((b_size, h_q, n_q), float("-inf"), dtype=torch.float64)
    for b in range(b_size):
        n = int(kv_lens[b])
        if n == 0:
            continue
        qp = torch.arange(n_q) + n - n_q  # query positions
        kp = torch.arange(n)  # key positions
        for h in range(h_q):
            qh, kh, vh = q[b, h], k[b, h // group, :n], v[b, h // group, :n]
            if rope is not None:
                rq = qp if q_positions is None else (q_positions[b] if q_positions.dim() == 2 else q_positions)
                rk = kp if k_positions is None else (k_positions[b, :n] if k_positions.dim() == 2 else k_positions[:n])
                qh, kh = rotate_half_rope(qh, rq, rope), rotate_half_rope(kh, rk, rope)
            s = qh @ kh.T / math.sqrt(d)  # [Nq, n]
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            if alibi:
                s = s + alibi_slopes(h_q)[h] * (kp[None, :] - qp[:, None]).double()
            if bias is not None:
                s = s + bias.expand(b_size, h_q, n_q, -1)[b, h, :, :n].double()
            keep = torch.ones(n_q, n, dtype=torch.bool)
            if causal:
                keep &= kp[None, :] <= qp[:, None]
            if window is not None:
                keep &= (qp[:, None] - kp[None, :]).abs() < window
            if doc_ids is not None:
                ids = doc_ids.expand(b_size, -1)[b, :n]
                q_ids = torch.where((qp >= 0) & (qp < n), ids[qp.clamp(0, n - 1)], -1)
                keep &= (q_ids[:, None] == ids[None, :]) & (ids[None, :] >= 0)
            for i in range(n_q):
                kept = keep[i]
                if normalizer == "softmax":
                    if kept.any():
                        p = torch.softmax(s[i][kept], dim=0)
                        out[b, h, i] = p @ vh[kept]
                        lse[b, h, i] = torch.logsumexp(s[i][kept], dim=0)
                elif normalizer == "relu":
                    out[b, h, i] = (torch.relu(s[i]) * kept / n) @ vh
                else:  # sigmoid, default bias -ln(Nk)
                    out[b, h, i] = (torch.sigmoid(s[i] - math.log(n)) * kept) @ vh
    return out, lse


def inputs(b=3, hq=4, hkv=2, nq=4, l_max=40, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, hkv, l_max, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hkv, l_max, d, generator=gen, dtype=torch.float64)
    return q, k, v


LENS = [0, 1, 17, 40]  # empty, one key, ragged, full
NQS = [1, 4, 40]  # decode, a few queries, more queries than some sequences have keys

VARIANTS = {
    "plain": ([], {}),
    "causal": ([af.causal()], {"causal": True}),
    "window": ([af.sliding_window(5), af.causal()], {"causal": True, "window": 5}),
    "window-bidirectional": ([af.sliding_window(7)], {"window": 7}),
    "alibi": ([af.alibi(), af.causal()], {"causal": True, "alibi": True}),
    "rope": ([af.rope(theta=10000.0), af.causal()], {"causal": True, "rope": 10000.0}),
    "softcap": ([af.softcap(2.0), af.causal()], {"causal": True, "softcap": 2.0}),
    "relu": ([af.relu()], {"normalizer": "relu"}),
    "relu-causal": ([af.relu(), af.causal()], {"normalizer": "relu", "causal": True}),
    "sigmoid": ([af.sigmoid()], {"normalizer": "sigmoid"}),
}


def check(spec, q, k, v, lens, expected_kwargs, lse=True, **call):
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    want, want_lse = naive(q, k, v, kv_lens, **expected_kwargs,
                           **{name: call[name] for name in ("bias", "doc_ids", "q_positions", "k_positions") if name in call})
    if lse:
        got, got_lse = af.reference_attention(spec, q, k, v, kv_lens=kv_lens, return_lse=True, **call)
        assert got_lse.dtype == torch.float32
        assert torch.equal(torch.isneginf(got_lse), torch.isneginf(want_lse.float()))
        torch.testing.assert_close(got_lse.double(), want_lse, rtol=0, atol=1e-5)  # fp32 lse
    else:
        got = af.reference_attention(spec, q, k, v, kv_lens=kv_lens, **call)
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    return got


@pytest.mark.parametrize("nq", NQS, ids=lambda n: f"nq{n}")
@pytest.mark.parametrize("name", list(VARIANTS))
def test_reference_with_kv_lens_matches_the_naive_loop(name, nq):
    blocks, expected = VARIANTS[name]
    spec = af.attention(*blocks)
    q, k, v = inputs(b=4, nq=nq, seed=nq)
    check(spec, q, k, v, LENS, expected, lse=expected.get("normalizer", "softmax") == "softmax")


def test_reference_sequence_with_no_key_is_zero_with_lse_minus_inf():
    spec = af.attention(af.causal())
    q, k, v = inputs()
    out, lse = af.reference_attention(spec, q, k, v, kv_lens=torch.tensor([0, 0, 0], dtype=torch.int32),
                                      return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    for spec in (af.attention(af.sigmoid()), af.attention(af.relu()), af.attention(af.document())):
        call = {"doc_ids": torch.zeros(40, dtype=torch.int32)} if "document" in repr(spec) else {}
        out = af.reference_attention(spec, q, k, v, kv_lens=torch.tensor([0, 3, 0]), **call)
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[2], torch.zeros_like(out[2]))
        assert out[1].abs().max() > 0


def test_reference_additive_bias_is_sliced_per_sequence():
    spec = af.attention(af.additive_bias(), af.causal())
    q, k, v = inputs(nq=4, seed=3)
    gen = torch.Generator().manual_seed(4)
    bias = torch.randn(3, 4, 4, 40, generator=gen)
    bias[:, :, :, 30:] = float("-inf")  # keys 30.. only ever reached by the full sequence
    check(spec, q, k, v, [40, 9, 31], {"causal": True}, bias=bias)
    # Broadcast biases: per key only, and per head and key.
    check(spec, q, k, v, [40, 9, 31], {"causal": True}, bias=torch.randn(40, generator=gen))
    check(spec, q, k, v, [40, 9, 31], {"causal": True}, bias=torch.randn(4, 1, 40, generator=gen))
    with pytest.raises(ArgumentError, match=r"bias .* does not broadcast to \[B, Hq, Nq, L_max\]"):
        af.reference_attention(spec, q, k, v, kv_lens=torch.tensor([4, 4, 4]), bias=torch.zeros(4, 4, 39))


@pytest.mark.parametrize("nq", [1, 5], ids=lambda n: f"nq{n}")
def test_reference_document_with_kv_lens(nq):
    """The queries take the ids at their positions kv_lens[b] - Nq + i; ids past a sequence's
    length are never read (they would put the last query in another document)."""
    spec = af.attention(af.document(), af.causal())
    q, k, v = inputs(nq=nq, seed=5)
    ids = torch.tensor([0] * 10 + [1] * 10 + [-1] * 5 + [2] * 15)
    per_batch = torch.stack([ids, ids.roll(7), torch.arange(40) // 3])
    for doc_ids in (ids, per_batch, per_batch.int()):
        check(spec, q, k, v, [40, 13, 22], {"causal": True}, doc_ids=doc_ids)
    with pytest.raises(ArgumentError, match="doc_ids must have shape"):
        af.reference_attention(spec, q, k, v, kv_lens=torch.tensor([4, 4, 4]), doc_ids=torch.zeros(39, dtype=torch.int32))


def test_reference_rope_positions_with_kv_lens():
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    q, k, v = inputs(nq=3, seed=6)
    gen = torch.Generator().manual_seed(6)
    expected = {"causal": True, "rope": 10000.0}
    check(spec, q, k, v, [40, 11, 25], expected, q_positions=torch.randint(0, 500, (3,), generator=gen))
    check(spec, q, k, v, [40, 11, 25], expected, q_positions=torch.randint(0, 500, (3, 3), generator=gen))
    check(spec, q, k, v, [40, 11, 25], expected, k_positions=torch.randint(0, 500, (40,), generator=gen),
          q_positions=torch.randint(0, 500, (3, 3), generator=gen))
    check(spec, q, k, v, [40, 11, 25], expected, k_positions=torch.randint(0, 500, (3, 40), generator=gen),
          q_positions=torch.randint(0, 500, (3,), generator=gen))
    with pytest.raises(ArgumentError, match=r"k_positions must have shape \[L_max\]"):
        af.reference_attention(spec, q, k, v, kv_lens=torch.tensor([4, 4, 4]), k_positions=torch.arange(25))


def test_reference_given_key_with_kv_lens():
    """A given key rotation: k is used as passed, the queries rotated at kv_lens[b] - Nq + i."""
    from attnfuse.runtime.reference import Rotation, rotate

    spec = af.attention(af.rope(theta=10000.0), af.causal())
    q, k, v = inputs(nq=2, seed=7)
    kv_lens = torch.tensor([40, 3, 26], dtype=torch.int32)
    k_rot = rotate(k, torch.arange(40), Rotation(10000.0, None, False, None))
    given = af.reference_attention(spec, q, k_rot, v, kv_lens=kv_lens, rope_placement=("fused", "given"))
    plain = af.reference_attention(spec, q, k, v, kv_lens=kv_lens)
    torch.testing.assert_close(given, plain, rtol=0, atol=1e-12)


def test_reference_kv_lens_equals_each_sequence_alone():
    """The batched call is each sequence's own call on its sliced cache, concatenated."""
    spec = af.attention(af.alibi(), af.sliding_window(6), af.causal())
    q, k, v = inputs(hq=8, hkv=1, nq=4, seed=8)
    lens = [40, 7, 23]
    got, got_lse = af.reference_attention(spec, q, k, v, kv_lens=torch.tensor(lens), return_lse=True)
    for b, n in enumerate(lens):
        alone, alone_lse = af.reference_attention(spec, q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n],
                                                  return_lse=True)
        assert torch.equal(got[b : b + 1], alone) and torch.equal(got_lse[b : b + 1], alone_lse)
    # And the full cache without kv_lens is the call with kv_lens = L_max.
    full = torch.full((3,), 40, dtype=torch.int32)
    assert torch.equal(af.reference_attention(spec, q, k, v, kv_lens=full), af.reference_attention(spec, q, k, v))


# --------------------------------------------------------------------------------------------
# Paged caches
# --------------------------------------------------------------------------------------------


def paged(k, v, lens, page_size, seed=0, share=True):
    """Page pools and a block table holding the contiguous caches k, v `[B, Hkv, L_max, D]`
    (each sequence's pages up to its length), pages shuffled, spare pages of noise, entries
    past a sequence's length -1; with `share`, sequences 0 and 1 share their first page
    (their caches are made equal there first). Returns (k, v) possibly changed, pools, table."""
    b_size, h_kv, l_max, d = k.shape
    assert l_max % page_size == 0
    max_pages = l_max // page_size
    k, v = k.clone(), v.clone()
    if share:
        k[1, :, :page_size], v[1, :, :page_size] = k[0, :, :page_size], v[0, :, :page_size]
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // page_size) for n in lens]
    slots = [(b, p) for b in range(b_size) for p in range(needed[b]) if not (share and b == 1 and p == 0)]
    num_pages = len(slots) + 3  # 3 pages nobody uses
    order = torch.randperm(num_pages, generator=gen).tolist()
    pool_k = torch.randn(num_pages, h_kv, page_size, d, generator=gen, dtype=k.dtype)
    pool_v = torch.randn(num_pages, h_kv, page_size, v.shape[-1], generator=gen, dtype=v.dtype)
    table = torch.full((b_size, max_pages), -1, dtype=torch.int32)
    for (b, p), page in zip(slots, order):
        table[b, p] = page
        pool_k[page] = k[b, :, p * page_size : (p + 1) * page_size]
        pool_v[page] = v[b, :, p * page_size : (p + 1) * page_size]
    if share and needed[1] > 0:
        table[1, 0] = table[0, 0]
    return k, v, pool_k, pool_v, table


@pytest.mark.parametrize("page_size", [4, 16], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("name", ["causal", "alibi", "rope", "relu", "sigmoid", "window-bidirectional"])
def test_reference_paged_equals_contiguous(name, page_size):
    blocks, expected = VARIANTS[name]
    spec = af.attention(*blocks)
    lens = [19, 32, 0, 5]
    q, k, v = inputs(b=4, nq=3, l_max=32, seed=page_size)
    k, v, pool_k, pool_v, table = paged(k, v, lens, page_size, seed=page_size)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    contiguous = af.reference_attention(spec, q, k, v, kv_lens=kv_lens)
    paged_out = af.reference_attention(spec, q, pool_k, pool_v, kv_lens=kv_lens, block_table=table)
    assert torch.equal(paged_out, contiguous)
    torch.testing.assert_close(paged_out, naive(q, k, v, kv_lens, **expected)[0], rtol=0, atol=1e-10)


def test_gather_pages_reads_only_the_pages_in_use():
    _q, k, v = inputs(b=3, l_max=32)
    k, v, pool_k, _pool_v, table = paged(k, v, [32, 17, 0], 8, seed=1)
    assert (table[2] == -1).all() and (table[1, 3:] == -1).all()
    cache = gather_pages(pool_k, table, [32, 17, 0], 32)
    assert cache.shape == k.shape
    assert torch.equal(cache[0], k[0]) and torch.equal(cache[1, :, :17], k[1, :, :17])
    assert torch.equal(table[0, 0], table[1, 0])  # a shared page


def test_reference_paged_with_data_and_lse():
    """Bias, doc_ids and positions are indexed by logical key position, whatever the pages."""
    spec = af.attention(af.additive_bias(), af.document(), af.rope(), af.causal())
    lens = [29, 32, 6]
    q, k, v = inputs(b=3, nq=5, l_max=32, seed=11)
    k, v, pool_k, pool_v, table = paged(k, v, lens, 8, seed=11)
    gen = torch.Generator().manual_seed(11)
    call = {"bias": torch.randn(3, 4, 5, 32, generator=gen), "doc_ids": torch.arange(32) // 12,
            "k_positions": torch.randint(0, 99, (3, 32), generator=gen)}
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    want = af.reference_attention(spec, q, k, v, kv_lens=kv_lens, return_lse=True, **call)
    got = af.reference_attention(spec, q, pool_k, pool_v, kv_lens=kv_lens, block_table=table, return_lse=True, **call)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --------------------------------------------------------------------------------------------
# Autograd through the reference
# --------------------------------------------------------------------------------------------


def test_reference_gradients_with_kv_lens():
    """Differentiable: each sequence's gradients are its own call's; keys past a sequence's
    length get none; through a paged cache the gradients reach the pool's pages."""
    spec = af.attention(af.rope(), af.additive_bias(), af.causal())
    lens = [16, 5, 0]
    q, k, v = inputs(b=3, nq=3, l_max=16, seed=12)
    gen = torch.Generator().manual_seed(12)
    bias = torch.randn(1, 4, 3, 16, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(3, 4, 3, 16, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(3, 4, 3, generator=gen, dtype=torch.float64)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    grads = reference_gradients(spec, q, k, v, grad_out, bias=bias, grad_lse=grad_lse, kv_lens=kv_lens)
    dbias = torch.zeros_like(bias)
    for b, n in enumerate(lens):
        if n == 0:
            assert (grads["q"][b] == 0).all() and (grads["k"][b] == 0).all() and (grads["v"][b] == 0).all()
            continue
        alone = reference_gradients(spec, q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n],
                                    grad_out[b : b + 1], bias=bias[..., :n], grad_lse=grad_lse[b : b + 1])
        torch.testing.assert_close(grads["q"][b : b + 1], alone["q"], rtol=0, atol=1e-12)
        torch.testing.assert_close(grads["k"][b : b + 1, :, :n], alone["k"], rtol=0, atol=1e-12)
        torch.testing.assert_close(grads["v"][b : b + 1, :, :n], alone["v"], rtol=0, atol=1e-12)
        assert (grads["k"][b, :, n:] == 0).all() and (grads["v"][b, :, n:] == 0).all()
        dbias[..., :n] += alone["bias"]
    torch.testing.assert_close(grads["bias"], dbias, rtol=0, atol=1e-12)

    k2, v2, pool_k, pool_v, table = paged(k, v, lens, 4, seed=12, share=False)
    paged_grads = reference_gradients(spec, q, pool_k, pool_v, grad_out, bias=bias, grad_lse=grad_lse,
                                      kv_lens=kv_lens, block_table=table)
    for b, n in enumerate(lens):
        for p in range(-(-n // 4)):
            page = int(table[b, p])
            rows = slice(p * 4, min((p + 1) * 4, n))
            torch.testing.assert_close(paged_grads["k"][page, :, : rows.stop - rows.start], grads["k"][b, :, rows],
                                       rtol=0, atol=1e-12)
    used = {int(p) for p in table.flatten() if p >= 0}
    unused = [p for p in range(pool_k.shape[0]) if p not in used]
    assert unused and (paged_grads["k"][unused] == 0).all()


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def test_reference_decode_errors():
    spec = af.attention(af.causal())
    q, k, v = inputs(b=2, l_max=32)
    lens = torch.tensor([3, 32], dtype=torch.int32)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    pool = torch.randn(4, 2, 16, 16, dtype=torch.float64)
    with pytest.raises(ArgumentError, match="block_table= needs kv_lens="):
        af.reference_attention(spec, q, pool, pool, block_table=table)
    with pytest.raises(ArgumentError, match=r"kv_lens must have shape \[B\] = \[2\]"):
        af.reference_attention(spec, q, k, v, kv_lens=torch.tensor([3], dtype=torch.int32))
    with pytest.raises(ArgumentError, match=r"kv_lens must have shape"):
        af.reference_attention(spec, q, k, v, kv_lens=lens[None])
    with pytest.raises(ArgumentError, match="kv_lens must be int32"):
        af.reference_attention(spec, q, k, v, kv_lens=lens.float())
    with pytest.raises(ArgumentError, match="kv_lens must be a torch.Tensor"):
        af.reference_attention(spec, q, k, v, kv_lens=[3, 32])
    with pytest.raises(ArgumentError, match=r"kv_lens\[1\] = 33 is outside \[0, 32\]"):
        af.reference_attention(spec, q, k, v, kv_lens=torch.tensor([3, 33]))
    with pytest.raises(ArgumentError, match=r"kv_lens\[0\] = -1 is outside"):
        af.reference_attention(spec, q, k, v, kv_lens=torch.tensor([-1, 3]))
    with pytest.raises(ArgumentError, match="k and v caches must have batch 2"):
        af.reference_attention(spec, q, k[:1], v[:1], kv_lens=lens)
    with pytest.raises(ArgumentError, match="k and v must be 4-D caches"):
        af.reference_attention(spec, q, k[0], v[0], kv_lens=lens)
    with pytest.raises(ArgumentError, match="must agree in all but the last dim"):
        af.reference_attention(spec, q, k, v[:, :, :31], kv_lens=lens)
    # Paged.
    with pytest.raises(ArgumentError, match=r"block_table must have shape \[B, max_pages\]"):
        af.reference_attention(spec, q, pool, pool, kv_lens=lens, block_table=table[0])
    with pytest.raises(ArgumentError, match=r"block_table must have shape \[B, max_pages\]"):
        af.reference_attention(spec, q, pool, pool, kv_lens=lens, block_table=table[:1])
    with pytest.raises(ArgumentError, match="block_table must be int32"):
        af.reference_attention(spec, q, pool, pool, kv_lens=lens, block_table=table.float())
    with pytest.raises(ArgumentError, match="k and v must be 4-D page pools"):
        af.reference_attention(spec, q, pool[0], pool[0], kv_lens=lens, block_table=table)
    with pytest.raises(ArgumentError, match=r"kv_lens\[1\] = 33 is outside \[0, 32\]"):
        af.reference_attention(spec, q, pool, pool, kv_lens=torch.tensor([3, 33]), block_table=table)
    with pytest.raises(ArgumentError, match=r"block_table\[1, 1\] = 4 is not a page of the pool \(4 pages\)"):
        af.reference_attention(spec, q, pool, pool, kv_lens=lens, block_table=torch.tensor([[0, 1], [2, 4]]))
    with pytest.raises(ArgumentError, match=r"block_table\[0, 0\] = -1 is not a page"):
        af.reference_attention(spec, q, pool, pool, kv_lens=lens, block_table=torch.tensor([[-1, 1], [2, 3]]))
    with pytest.raises(ArgumentError, match="Hq = 4 query heads are not a multiple of Hkv = 3"):
        af.reference_attention(spec, q, pool[:, :1].expand(4, 3, 16, 16), pool[:, :1].expand(4, 3, 16, 16),
                               kv_lens=lens, block_table=table)
    # A table entry past a sequence's length is never read: -1 or out of range is fine there.
    af.reference_attention(spec, q, pool, pool, kv_lens=torch.tensor([16, 32]), block_table=torch.tensor([[0, -1], [2, 3]]))
    af.reference_attention(spec, q, pool, pool, kv_lens=torch.tensor([0, 17]), block_table=torch.tensor([[99, 99], [2, 3]]))
    # return_lse needs a softmax, even when no sequence has a key.
    for lens_ in ([3, 5], [0, 0]):
        with pytest.raises(ArgumentError, match="return_lse=True needs"):
            af.reference_attention(af.attention(af.relu()), q, k, v, kv_lens=torch.tensor(lens_), return_lse=True)
