"""`document()` through the real kernels (Triton's interpreter on the CPU), forward and
backward: packed sequences and padding against an independent float64 formula (a dense keep
mask built from `doc_ids`, written here from the semantics) and against the reference; its
composition with every other block; padding rows (0, lse -inf, zero gradients); tile
skipping and the block lists' cache; bad `doc_ids`."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (
    GRAD_TOLERANCE,
    assert_close_to_reference,
    assert_lse_close,
    check_forward_backward,
    lse_tolerance,
    make_qkv,
)

import attnfuse as af
from attnfuse.errors import ArgumentError, AttnFuseError, CompositionError
from attnfuse.runtime.reference import gradient_errors

pytestmark = pytest.mark.interpreter


def ids(*runs: tuple[int, int]) -> torch.Tensor:
    """Document ids from (id, length) runs."""
    return torch.tensor([i for i, n in runs for _ in range(n)])


# Packed: a document shorter than a tile (3 keys), one spanning tiles (30), one of 9, padding.
# The CPU tiles are 32 (forward), 16/32 (backward).
PACKED = ids((0, 3), (1, 30), (2, 9), (-1, 4))  # 46 keys
PACKED_B = torch.stack([PACKED, ids((-1, 5), (7, 20), (8, 21))])  # left padding in batch 1


# --------------------------------------------------------------------------------------------
# The independent formula
# --------------------------------------------------------------------------------------------


def rotate_half(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE (theta 1e4, half-split pairs) of `x [B, H, N, D]` at `positions [N]` or `[B, N]`,
    the angle an fp32 product as the semantics say."""
    d = x.shape[-1]
    inv_freq = (10000.0 ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)).float()
    angle = (positions.float()[..., None] * inv_freq).double()
    if angle.dim() == 3:
        angle = angle[:, None]
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


def document_keep(doc_ids: torch.Tensor, b: int, nq: int, nk: int) -> torch.Tensor:
    """`[B, 1, Nq, Nk]`: the query at i + Nk - Nq and key j share a non-negative id."""
    keys = doc_ids.long().expand(b, nk)
    queries = keys[:, torch.arange(nq) + nk - nq]
    return ((queries[:, :, None] == keys[:, None, :]) & (keys[:, None, :] >= 0))[:, None]


def formula(q, k, v, doc_ids, *, causal=False, window=None, slopes=None, bias=None,
            positions=None, normalizer="softmax"):
    """Attention written out from the semantics in float64: (out, lse or None)."""
    b, hq, nq, d = q.shape
    nk = k.shape[2]
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if positions is not None:
        q, k = rotate_half(q, positions[0]), rotate_half(k, positions[1])
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    q_pos = (torch.arange(nq) + nk - nq)[:, None]
    k_pos = torch.arange(nk)[None, :]
    if slopes is not None:
        s = s + torch.tensor(slopes, dtype=s.dtype)[None, :, None, None] * (k_pos - q_pos)
    if bias is not None:
        s = s + bias
    keep = document_keep(doc_ids, b, nq, nk)
    if causal:
        keep = keep & (k_pos <= q_pos)
    if window is not None:
        keep = keep & ((q_pos - k_pos).abs() < window)
    keep = keep.expand(s.shape)
    if normalizer == "relu":
        return torch.where(keep, torch.relu(s), 0.0) / nk @ v, None
    if normalizer == "sigmoid":
        return torch.where(keep, torch.sigmoid(s - math.log(nk)), 0.0) @ v, None
    lse = torch.logsumexp(torch.where(keep, s, float("-inf")), -1)
    finite = torch.where(torch.isinf(lse), 0.0, lse)
    p = torch.where(keep, torch.exp(torch.where(keep, s, 0.0) - finite[..., None]), 0.0)
    return p @ v, lse


def formula_gradients(q, k, v, grad_out, doc_ids, bias=None, **options):
    leaves = {n: t.detach().double().requires_grad_() for n, t in (("q", q), ("k", k), ("v", v))}
    if bias is not None:
        leaves["bias"] = bias.detach().double().requires_grad_()
    out, _lse = formula(leaves["q"], leaves["k"], leaves["v"], doc_ids, bias=leaves.get("bias"), **options)
    grads = torch.autograd.grad((out * grad_out.double()).sum(), list(leaves.values()))
    return dict(zip(leaves, grads))


def check_document(spec, q, k, v, doc_ids, *, bias=None, formula_options=None, lse=True, **call):
    """The kernels against the formula (forward and gradients) and, through
    `check_forward_backward`, against the reference."""
    options = dict(formula_options or {})
    out = check_forward_backward(spec, q, k, v, lse=lse, doc_ids=doc_ids,
                                 **({"bias": bias} if bias is not None else {}), **call)
    expected, expected_lse = formula(q.double(), k.double(), v.double(), doc_ids,
                                     bias=None if bias is None else bias.detach().double(), **options)
    assert_close_to_reference(out, expected, q.dtype)
    if lse:
        _out, got_lse = spec(q, k, v, return_lse=True, doc_ids=doc_ids,
                             **({"bias": bias} if bias is not None else {}), **call)
        assert_lse_close(got_lse, expected_lse.float(), lse_tolerance(spec, q, k) * 3)
    # Gradients against the formula's.
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    bias_leaf = None if bias is None else bias.detach().requires_grad_()
    out = spec(*leaves, doc_ids=doc_ids, **({"bias": bias_leaf} if bias is not None else {}), **call)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype)
    out.backward(grad_out)
    got = {"q": leaves[0].grad, "k": leaves[1].grad, "v": leaves[2].grad}
    if bias_leaf is not None:
        got["bias"] = bias_leaf.grad
    errors = gradient_errors(got, formula_gradients(q, k, v, grad_out, doc_ids, bias=bias, **options))
    for name, err in errors.items():
        assert err <= GRAD_TOLERANCE[q.dtype], f"d{name} against the formula: {err:.2e} ({errors})"
    return out


# --------------------------------------------------------------------------------------------
# Packed sequences and padding
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_packed_documents_causal(dtype):
    q, k, v = make_qkv(2, 2, 1, 46, 46, 16, dtype=dtype, seed=1)
    check_document(af.attention(af.document(), af.causal()), q, k, v, PACKED_B,
                   formula_options={"causal": True})


def test_packed_documents_shared_ids_int32_without_a_band():
    q, k, v = make_qkv(2, 2, 2, 46, 46, 16, seed=2)
    check_document(af.attention(af.document()), q, k, v, PACKED.to(torch.int32))


def test_unsorted_ids_are_exact_per_entry():
    """Interleaved documents: every tile's id range overlaps every other's (the skipping is
    conservative), but each entry is exact."""
    doc = torch.tensor([0, 1, 2] * 13 + [-1] * 2)  # 41 keys
    q, k, v = make_qkv(1, 2, 2, 41, 41, 16, seed=3)
    check_document(af.attention(af.document(), af.causal()), q, k, v, doc,
                   formula_options={"causal": True})


def test_decode_like_fewer_queries_than_keys():
    """Nq < Nk: the queries sit at the last positions and take those positions' documents."""
    q, k, v = make_qkv(2, 2, 1, 9, 46, 16, seed=4)
    check_document(af.attention(af.document(), af.causal()), q, k, v, PACKED_B,
                   formula_options={"causal": True})


def test_padding_rows_are_zero_with_zero_gradients():
    """Left and right padding: padding queries output exactly 0 with lse -inf, and no
    gradient reaches them; padding keys get dk = dv = 0."""
    doc = ids((-1, 6), (0, 17), (1, 14), (-1, 5))  # 42 keys
    spec = af.attention(af.document())
    q, k, v = make_qkv(1, 2, 2, 42, 42, 16, seed=5, requires_grad=True)
    out, lse = spec(q, k, v, doc_ids=doc, return_lse=True)
    pad = doc < 0
    assert torch.equal(out[:, :, pad], torch.zeros_like(out[:, :, pad]))
    assert torch.isneginf(lse[:, :, pad]).all() and torch.isfinite(lse[:, :, ~pad]).all()
    (out * torch.randn(out.shape)).sum().backward()
    for grad in (q.grad, k.grad, v.grad):
        assert not torch.isnan(grad).any()
        assert torch.equal(grad[:, :, pad], torch.zeros_like(grad[:, :, pad]))
    check_document(spec, q.detach(), k.detach(), v.detach(), doc)


def test_all_padding():
    q, k, v = make_qkv(1, 1, 1, 20, 20, 16, seed=6)
    out, lse = af.attention(af.document())(q, k, v, doc_ids=torch.full((20,), -1), return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


# --------------------------------------------------------------------------------------------
# Composition
# --------------------------------------------------------------------------------------------


def test_with_sliding_window_alibi_and_gqa():
    q, k, v = make_qkv(2, 4, 2, 46, 46, 16, seed=7)
    spec = af.attention(af.alibi(), af.sliding_window(12), af.document(), af.causal())
    check_document(spec, q, k, v, PACKED_B, formula_options={
        "causal": True, "window": 12, "slopes": [2.0 ** (-2 * (i + 1)) for i in range(4)]})


def test_with_additive_bias_and_its_gradient():
    q, k, v = make_qkv(2, 2, 2, 40, 46, 16, seed=8)
    bias = torch.randn(2, 1, 40, 46, generator=torch.Generator().manual_seed(9))
    check_document(af.attention(af.additive_bias(), af.document()), q, k, v, PACKED_B,
                   bias=bias.requires_grad_())


def test_with_rope_at_per_document_positions():
    """Each document's positions restart at 0 (the caller's q/k positions): they change the
    rotation, not the filter."""
    doc = PACKED_B
    starts = torch.cat([torch.ones(2, 1, dtype=torch.bool), doc[:, 1:] != doc[:, :-1]], 1)
    index = torch.arange(doc.shape[1]).expand_as(doc)
    start_of = torch.cummax(torch.where(starts, index, 0), 1).values
    positions = index - start_of  # [B, Nk]
    q, k, v = make_qkv(2, 2, 2, 46, 46, 16, seed=10)
    spec = af.attention(af.rope(), af.document(), af.causal())
    check_document(spec, q, k, v, doc, q_positions=positions, k_positions=positions,
                   formula_options={"causal": True, "positions": (positions, positions)})
    # RoPE scores depend on k_pos - q_pos only, and a document is kept whole: restarting its
    # positions changes nothing, while shifting the queries' alone does (they are read).
    per_document = spec(q, k, v, doc_ids=doc, q_positions=positions, k_positions=positions)
    steps = torch.arange(46)
    global_positions, _lse = formula(q.double(), k.double(), v.double(), doc, causal=True,
                                     positions=(steps, steps))
    assert_close_to_reference(per_document, global_positions, q.dtype)
    shifted = spec(q, k, v, doc_ids=doc, q_positions=positions + 3, k_positions=positions)
    assert (shifted - per_document).abs().max() > 1e-2


@pytest.mark.parametrize("normalizer", ["relu", "sigmoid"])
def test_pointwise_normalizers(normalizer):
    q, k, v = make_qkv(2, 2, 1, 46, 46, 16, seed=11)
    block = af.relu() if normalizer == "relu" else af.sigmoid()
    check_document(af.attention(af.document(), af.causal(), block), q * 2, k, v, PACKED_B, lse=False,
                   formula_options={"causal": True, "normalizer": normalizer})


def test_with_softcap():
    q, k, v = make_qkv(1, 2, 2, 46, 46, 16, seed=12)
    spec = af.attention(af.softcap(1.0), af.document())
    out = check_forward_backward(spec, q * 3, k, v, lse=True, doc_ids=PACKED)
    assert not torch.isnan(out).any()


def test_with_block_sparse_both_filters_hold():
    q, k, v = make_qkv(1, 2, 2, 46, 46, 16, seed=13)
    layout = torch.tensor([[True, False, True], [True, True, False], [False, True, True]])
    spec = af.attention(af.block_sparse(16), af.document())
    out = check_forward_backward(spec, q, k, v, lse=True, doc_ids=PACKED, block_layout=layout)
    dense = layout.repeat_interleave(16, 0).repeat_interleave(16, 1)[:46, :46]
    keep = document_keep(PACKED, 1, 46, 46)[0, 0] & dense
    s = (q.double() @ k.double().transpose(-1, -2) / 4).masked_fill(~keep, float("-inf"))
    expected = torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ v.double()
    assert_close_to_reference(out, expected, q.dtype)
    # Both must hold: without the layout the documents keep more.
    assert (af.attention(af.document())(q, k, v, doc_ids=PACKED) - out).abs().max() > 1e-2


# --------------------------------------------------------------------------------------------
# Tile skipping and the lists' cache
# --------------------------------------------------------------------------------------------


def forward_lists(fn, q, k, v, doc):
    """The block lists a forward call with these tensors reads."""
    return fn.call_tensors(fn.plan(q, k, v), {"doc_ids": doc})


def backward_lists(fn, q, k, v, doc):
    """The block lists the backward of a training call with these tensors reads."""
    from attnfuse.runtime.call_plan import LIST_SOURCES

    plan = fn.plan(q, k, v, training=True)
    return fn._block_lists(fn.call_tensors(plan, {"doc_ids": doc})[LIST_SOURCES], plan, True)


def test_tiles_of_documents_that_never_meet_are_skipped():
    """Two documents of 32 keys, tiles of 32: each query tile visits its own key tile only,
    as a full tile (no per-entry test); the dK/dV lists are the transpose."""
    fn = af.compile(af.attention(af.document()))
    q, k, v = make_qkv(1, 1, 1, 64, 64, 16, seed=14)
    doc = ids((0, 32), (1, 32))
    fn(q, k, v, doc_ids=doc)
    lists = forward_lists(fn, q, k, v, doc)
    assert lists["full_count"][0, 0].tolist() == [1, 1]
    assert lists["partial_count"][0, 0].tolist() == [0, 0]
    assert lists["full_blocks"][0, 0, :, 0].tolist() == [0, 1]
    # A third document straddling the tiles makes them partial, and they meet.
    doc = ids((0, 30), (5, 4), (1, 30))
    fn(q, k, v, doc_ids=doc)
    lists = forward_lists(fn, q, k, v, doc)
    assert lists["full_count"][0, 0].tolist() == [0, 0]
    assert lists["partial_count"][0, 0].tolist() == [2, 2]
    # Backward lists: dQ tiles of 32 x 16 keys, dK/dV 16 keys x 32 queries.
    q.requires_grad_()
    doc = ids((0, 32), (1, 32))
    fn(q, k, v, doc_ids=doc).sum().backward()
    back = backward_lists(fn, q, k, v, doc)
    assert back["full_count"][0, 0].tolist() == [2, 2]
    assert back["full_blocks"][0, 0, :, :2].tolist() == [[0, 1], [2, 3]]
    assert back["full_q_count"][0, 0].tolist() == [1, 1, 1, 1]
    assert back["full_q_blocks"][0, 0, :, 0].tolist() == [0, 0, 1, 1]


def test_lists_are_cached_per_doc_ids_tensor(monkeypatch):
    from attnfuse.runtime import call_binding

    builds = []
    real = call_binding.call_block_lists
    monkeypatch.setattr(call_binding, "call_block_lists", lambda *a, **kw: builds.append(1) or real(*a, **kw))
    fn = af.compile(af.attention(af.document(), af.causal()))
    q, k, v = make_qkv(1, 1, 1, 46, 46, 16, seed=15)
    doc = PACKED.clone()
    first = fn(q, k, v, doc_ids=doc)
    assert len(builds) == 1
    assert torch.equal(fn(q, k, v, doc_ids=doc), first)
    assert len(builds) == 1, "the same, unmodified doc_ids rebuilt the lists"
    doc[3:20] = 1  # in place: the cached lists are stale
    changed = fn(q, k, v, doc_ids=doc)
    assert len(builds) == 2
    assert_close_to_reference(changed, af.reference_attention(
        af.attention(af.document(), af.causal()), q, k, v, doc_ids=doc), q.dtype)
    fn(q, k, v, doc_ids=doc.clone())  # another tensor with equal values
    assert len(builds) == 3


def test_block_layout_lists_are_cached_too(monkeypatch):
    """The cache compares the caller's tensor, not the view `bind` makes per call."""
    from attnfuse.runtime import call_binding

    builds = []
    real = call_binding.call_block_lists
    monkeypatch.setattr(call_binding, "call_block_lists", lambda *a, **kw: builds.append(1) or real(*a, **kw))
    fn = af.compile(af.attention(af.block_sparse(32)))
    q, k, v = make_qkv(1, 1, 1, 64, 64, 16, seed=16)
    layout = torch.tensor([[True, False], [True, True]])
    fn(q, k, v, block_layout=layout)
    fn(q, k, v, block_layout=layout)
    assert len(builds) == 1


# --------------------------------------------------------------------------------------------
# The DSL, hand-written IR, and bad arguments
# --------------------------------------------------------------------------------------------


def test_dsl_and_hand_written_ir():
    spec = af.attention(af.document(), af.causal())
    assert "attn.document %scores, %doc_ids" in spec.ir()
    ir = """
    attn.variant @docs(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
      %s = attn.scores %q, %k
      %d = attn.document %s, %doc_ids
      %p = attn.softmax %d
      %o = attn.pv %p, %v
      attn.yield %o
    }
    """
    q, k, v = make_qkv(1, 2, 2, 30, 30, 16, seed=17)
    doc = ids((0, 10), (1, 20))
    out = af.compile(ir)(q, k, v, doc_ids=doc)
    assert_close_to_reference(out, af.reference_attention(ir, q, k, v, doc_ids=doc), q.dtype)
    expected, _lse = formula(q.double(), k.double(), v.double(), doc)
    assert_close_to_reference(out, expected, q.dtype)


def test_full_with_document_is_an_error():
    with pytest.raises(CompositionError, match="full.*document"):
        af.attention(af.full(), af.document())


@pytest.mark.parametrize("bad, message", [
    (None, "document\\(\\) needs doc_ids="),
    (PACKED.float(), "doc_ids must be int32 or int64"),
    (PACKED[:-1], "doc_ids must have shape \\[46\\] or \\[2, 46\\]"),
    (PACKED.expand(3, 46), "doc_ids must have shape"),
    ([0] * 46, "doc_ids must be a torch.Tensor"),
    (PACKED.to("meta"), "doc_ids is on meta"),
])
def test_bad_doc_ids(bad, message):
    q, k, v = make_qkv(2, 1, 1, 46, 46, 16)
    with pytest.raises(ArgumentError, match=message):
        af.attention(af.document())(q, k, v, doc_ids=bad)


def test_doc_ids_without_document():
    q, k, v = make_qkv(1, 1, 1, 16, 16, 16)
    with pytest.raises(ArgumentError, match="doc_ids= given, but .* has no document\\(\\)"):
        af.attention(af.causal())(q, k, v, doc_ids=torch.zeros(16, dtype=torch.long))
    with pytest.raises(ArgumentError, match="unexpected argument"):
        af.attention(af.document())(q, k, v, doc_id=torch.zeros(16, dtype=torch.long))


def test_repeated_block_is_an_error():
    with pytest.raises(AttnFuseError, match="document"):
        af.attention(af.document(), af.document())
