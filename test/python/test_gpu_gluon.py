"""The Gluon target's forward on a Hopper GPU, against the float64 reference and against the
portable (tl) kernel: every variant the target lowers, GQA, fp16/bf16, head dims 64 and 128,
lengths that are not whole blocks, a model's [B, N, H, D] layout, the training call (Gluon
forward, portable backward), two and three consumer warpgroups at both head dims, head dim 256,
the persistent grid, block-sparse layouts and document ids on their lists, and the fallbacks
(unaligned rows, a variant the target refuses). Skipped without CUDA, and without an sm_90 GPU."""

from __future__ import annotations

import pytest
import torch
from conftest import GRAD_TOLERANCE, assert_close_to_reference, assert_lse_close, gluon_only, lse_tolerance

import attnfuse as af
from attnfuse.runtime.gluon_forward import GluonLaunch
from attnfuse.runtime.reference import gradient_errors, reference_gradients

pytestmark = pytest.mark.gpu

if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the Gluon target is scheduled for sm_90", allow_module_level=True)

SPECS = {
    "dense": af.attention(),
    "causal": af.attention(af.causal()),
    "window": af.attention(af.sliding_window(300), af.causal()),
    "alibi-softcap": af.attention(af.alibi(), af.softcap(20.0), af.causal()),
    "static-scale": af.attention(af.scaled_dot_product(0.05)),
    "relu": af.attention(af.relu()),
    "sigmoid-causal": af.attention(af.sigmoid(), af.causal()),
    "bias-causal": af.attention(af.additive_bias(), af.causal()),
}
"""Every variant class the Gluon forward lowers. `bias-causal` is called with a bias broadcast
over the batch (`call_data`)."""


def call_data(name, q, k):
    """The call-time tensors of SPECS[name]: a `[1, Hq, Nq, Nk]` fp32 bias for `bias-*` (its
    batch axis broadcast, stride 0 in the kernel), none otherwise."""
    if not name.startswith("bias"):
        return {}
    gen = torch.Generator().manual_seed(1)
    bias = torch.randn(1, q.shape[1], q.shape[2], k.shape[2], generator=gen)
    return {"bias": bias.cuda()}


@pytest.fixture(autouse=True)
def gluon_target(monkeypatch):
    """Gluon wherever it lowers (not only where `auto` measured it faster)."""
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "gluon")


def inputs(b, hq, hkv, nq, nk, d, dtype, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, hkv, nk, d, generator=gen).to(dtype)
    v = torch.randn(b, hkv, nk, d, generator=gen).to(dtype)
    return [t.cuda().requires_grad_(grad) for t in (q, k, v)]


def forward_launch(fn, q, k, v, training=False):
    plan = fn.plan(q, k, v, training=training)
    return next(launch for launch in plan.launches if launch.info.name == "attention_fwd")


def listed_gluon_launch(fn, q, k, v):
    """The forward launch of a call walking block lists: the Gluon kernel, on 128 x 128 tiles."""
    launch = forward_launch(fn, q, k, v)
    assert isinstance(launch, GluonLaunch)
    assert (launch.launch.block_m, launch.launch.block_n) == (128, 128)
    return launch


def assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch, data=None):
    """`fn`'s output and lse (a softmax's), run through the Gluon `launch` alone
    (`gluon_only`), against the reference on the CPU; `data`: the call-time tensors."""
    data = data or {}
    gluon_only(launch, monkeypatch)
    softmax = "lse" in launch.launch.roles
    with torch.no_grad():
        got = fn(q, k, v, return_lse=softmax, **data)
    cpu_data = {key: t.cpu() for key, t in data.items()}
    expected = af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu(), return_lse=softmax, **cpu_data)
    out, ref = (got[0], expected[0]) if softmax else (got, expected)
    assert_close_to_reference(out.cpu(), ref, q.dtype)
    if softmax:
        assert_lse_close(got[1].cpu(), expected[1], lse_tolerance(spec, q, k))


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
# (4, 2, 301, 333): an Nq off every multiple of 4 (the Gluon backward's flat row copies
# faulted at such an Nq on the H200; the forward's lse goes through pointers).
@pytest.mark.parametrize("hq,hkv,nq,nk", [(4, 4, 256, 256), (8, 2, 128, 384), (4, 1, 384, 256), (4, 2, 300, 333),
                                          (4, 2, 301, 333), (2, 2, 20, 77)])
def test_gluon_forward_matches_reference(name, d, dtype, hq, hkv, nq, nk, monkeypatch):
    spec = SPECS[name]
    fn = af.compile(spec)
    q, k, v = inputs(2, hq, hkv, nq, nk, d, dtype)
    data = call_data(name, q, k)
    launch = forward_launch(fn, q, k, v)
    assert isinstance(launch, GluonLaunch), "the call must take the Gluon forward"
    assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch, data)


@pytest.mark.parametrize("name", ["fire", "fire-causal", "chunked-24", "chunked-7", "sink-window"])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
@pytest.mark.parametrize("hq,hkv,nq,nk", [(8, 2, 1000, 1000), (4, 2, 301, 333)])
def test_index_tiles_on_the_gluon_forward(index_tile_blocks, name, d, dtype, hq, hkv, nq, nk, monkeypatch):
    """Blocks that map with each entry's positions and query head (`tile.pair_position`,
    `tile.query_head`) and element-wise filters run on the warp-specialized forward, against
    the reference (their ops' float64 `evaluate`)."""
    spec = index_tile_blocks[name]()
    fn = af.compile(spec)
    q, k, v = inputs(2, hq, hkv, nq, nk, d, dtype, seed=5)
    launch = forward_launch(fn, q, k, v)
    assert isinstance(launch, GluonLaunch), "the call must take the Gluon forward"
    assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch)


@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("name", ["dense", "causal", "window", "alibi-softcap"])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
@pytest.mark.parametrize("hq,hkv,nq,nk", [(4, 2, 448, 333), (2, 2, 20, 77), (4, 4, 1024, 1024)])
def test_gluon_consumer_counts_match_reference(consumers, name, d, dtype, hq, hkv, nq, nk, monkeypatch):
    """Two and three consumer warpgroups forced (`ATTNFUSE_GLUON_CONSUMERS`; three own 192 rows a
    program, so lengths cut programs and consumers anywhere; at head dim 128 with 64-key
    blocks), against the reference."""
    monkeypatch.setenv("ATTNFUSE_GLUON_CONSUMERS", str(consumers))
    spec = SPECS[name]
    fn = af.compile(spec)
    q, k, v = inputs(2, hq, hkv, nq, nk, d, dtype, seed=11)
    launch = forward_launch(fn, q, k, v)
    assert isinstance(launch, GluonLaunch) and launch.launch.block_m == 64 * consumers
    assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch)


@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("name", ["dense", "causal", "window", "alibi-softcap"])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
@pytest.mark.parametrize("hq,hkv,nq,nk", [(4, 2, 448, 333), (2, 2, 20, 77), (4, 4, 384, 128), (24, 8, 640, 600),
                                           (24, 24, 1024, 256)])
def test_gluon_persistent_matches_reference(consumers, name, d, dtype, hq, hkv, nq, nk, monkeypatch):
    """The persistent grid (`ATTNFUSE_GLUON_PERSISTENT=1`): programs walking more than one tile
    (B=2, 24 heads, 640 rows: 240 tiles of 128 rows or 192 of 192 beside the H200's 132 SMs),
    tiles whose rows see no key (causal Nq > Nk: the producer copies nothing for them), both in
    one program (24 heads, 1024 queries over 256 keys: 384 or 288 tiles, the first 768 rows
    of each head keyless under causal), ragged lengths, GQA."""
    monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", "1")
    monkeypatch.setenv("ATTNFUSE_GLUON_CONSUMERS", str(consumers))
    spec = SPECS[name]
    fn = af.compile(spec)
    q, k, v = inputs(2, hq, hkv, nq, nk, d, dtype, seed=12)
    launch = forward_launch(fn, q, k, v)
    assert isinstance(launch, GluonLaunch) and launch.launch.persistent
    assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch)


def test_head_dim_64_takes_three_consumers_unless_alibi():
    """`SCHEDULES`: three consumers at head dim 64 (two with ALiBi), two at head dim 128."""
    q, k, v = inputs(1, 4, 4, 256, 256, 64, torch.float16)
    assert forward_launch(af.compile(SPECS["causal"]), q, k, v).launch.block_m == 192
    assert forward_launch(af.compile(SPECS["alibi-softcap"]), q, k, v).launch.block_m == 128
    q, k, v = inputs(1, 4, 4, 256, 256, 128, torch.bfloat16)
    assert forward_launch(af.compile(SPECS["causal"]), q, k, v).launch.block_m == 128


@pytest.mark.parametrize("name", ["dense", "static-scale"])
@pytest.mark.parametrize("hq,hkv,nq,nk", [(4, 2, 448, 333), (24, 8, 640, 600)])
def test_gluon_plain_grid_at_head_dim_128_matches_reference(name, hq, hkv, nq, nk, monkeypatch):
    """Dense kernels at head dim 128 with the persistent grid forced off (their default is
    persistent, so the reference tests above run that)."""
    monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", "0")
    spec = SPECS[name]
    fn = af.compile(spec)
    q, k, v = inputs(2, hq, hkv, nq, nk, 128, torch.bfloat16, seed=13)
    launch = forward_launch(fn, q, k, v)
    assert isinstance(launch, GluonLaunch) and not launch.launch.persistent
    assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch)


def test_head_dim_128_dense_takes_the_persistent_grid():
    """`SCHEDULES`: at head dim 128 a kernel whose tiles do equal work (dense, a static scale)
    runs the persistent grid by default; a causal or windowed one keeps a program per tile; at
    head dim 64 neither is persistent."""
    q, k, v = inputs(1, 4, 4, 256, 256, 128, torch.bfloat16)
    for name, persistent in (("dense", True), ("static-scale", True), ("causal", False), ("window", False)):
        assert forward_launch(af.compile(SPECS[name]), q, k, v).launch.persistent is persistent, name
    q, k, v = inputs(1, 4, 4, 256, 256, 64, torch.float16)
    assert not forward_launch(af.compile(SPECS["dense"]), q, k, v).launch.persistent


def test_gluon_rows_without_keys_are_zero():
    """Causal with Nq > Nk: the first Nq - Nk query rows see no key (bottom-right alignment)."""
    spec = SPECS["causal"]
    fn = af.compile(spec)
    q, k, v = inputs(1, 4, 4, 384, 128, 128, torch.float16, seed=1)
    assert isinstance(forward_launch(fn, q, k, v), GluonLaunch)
    with torch.no_grad():
        out, lse = fn(q, k, v, return_lse=True)
    assert (out[:, :, :256] == 0).all() and torch.isneginf(lse[:, :, :256]).all()
    ref, ref_lse = af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu(), return_lse=True)
    assert_close_to_reference(out.cpu(), ref, torch.float16)
    assert_lse_close(lse.cpu(), ref_lse, lse_tolerance(spec, q, k))


@pytest.mark.parametrize("d", [64, 128])
def test_gluon_forward_equals_portable_kernel(d, monkeypatch):
    spec = SPECS["causal"]
    q, k, v = inputs(2, 8, 8, 1024, 1024, d, torch.bfloat16, seed=2)
    with torch.no_grad():
        out_gluon = af.compile(spec)(q, k, v)
        monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "triton")
        fn = af.compile(spec)
        assert not isinstance(forward_launch(fn, q, k, v), GluonLaunch)
        out_tl = fn(q, k, v)
    assert (out_gluon.float() - out_tl.float()).abs().max() <= 2e-2


@pytest.mark.parametrize("name", ["dense", "causal", "window", "alibi-softcap"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,nq,nk", [(4, 2, 300, 333), (2, 2, 20, 77), (8, 8, 512, 512)])
def test_gluon_head_dim_256_matches_reference(name, dtype, hq, hkv, nq, nk, monkeypatch):
    """Head dim 256: two consumers of 64-key blocks (`SCHEDULES`), against the reference."""
    spec = SPECS[name]
    fn = af.compile(spec)
    q, k, v = inputs(2, hq, hkv, nq, nk, 256, dtype, seed=21)
    launch = forward_launch(fn, q, k, v)
    assert isinstance(launch, GluonLaunch) and launch.launch.block_n == 64 and not launch.launch.persistent
    assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch)


@pytest.mark.parametrize("name,d,hq,n", [("causal", 128, 8, 256), ("causal", 256, 4, 200), ("relu", 64, 8, 256),
                                         ("bias-causal", 128, 8, 256)])
def test_gluon_training_call_gradients(name, d, hq, n):
    """A training call: the Gluon forward saves o (and a softmax's lse) for the portable
    backward (at head dim 256 always portable: the fused backward's schedule covers 64 and 128
    only; at these sizes `auto` keeps the split, with a bias too); a bias that requires a
    gradient gets it."""
    spec = SPECS[name]
    fn = af.compile(spec)
    q, k, v = inputs(1, hq, 2, n, n, d, torch.bfloat16, seed=3, grad=True)
    data = {key: t.requires_grad_() for key, t in call_data(name, q, k).items()}
    assert isinstance(forward_launch(fn, q, k, v, training=True), GluonLaunch)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(q.dtype).cuda()
    fn(q, k, v, **data).backward(grad)
    cpu_data = {key: t.detach().cpu() for key, t in data.items()}
    want = reference_gradients(spec, q.cpu(), k.cpu(), v.cpu(), grad.cpu(), **cpu_data)
    got = {"q": q.grad, "k": k.grad, "v": v.grad, **{key: t.grad for key, t in data.items()}}
    errors = gradient_errors(got, want)
    assert set(errors) == set(got), errors
    assert all(err <= GRAD_TOLERANCE[torch.bfloat16] for err in errors.values()), errors


def test_model_layout_runs_on_gluon(monkeypatch):
    """A [B, N, H, D] projection viewed as [B, H, N, D]: the 4-D descriptors take its strides,
    the output's (in q's memory order) too."""
    spec = SPECS["causal"]
    fn = af.compile(spec)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 200, 4, 64, generator=gen).half().cuda().transpose(1, 2) for _ in range(3))
    launch = forward_launch(fn, q, k, v)
    assert isinstance(launch, GluonLaunch)
    gluon_only(launch, monkeypatch)
    with torch.no_grad():
        out = fn(q, k, v)
    assert out.stride() == q.stride()  # the output in q's memory order, stored by its descriptor
    assert_close_to_reference(out.cpu(), af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu()), torch.float16)


def test_unaligned_rows_run_the_portable_kernel():
    """Rows 65 elements apart are not 16-byte aligned: no descriptor, the portable kernel."""
    spec = SPECS["causal"]
    fn = af.compile(spec)
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 4, 256, 65, generator=gen).half().cuda()[..., :64] for _ in range(3))
    assert isinstance(forward_launch(fn, q, k, v), GluonLaunch)
    with torch.no_grad():
        out = fn(q, k, v)
    assert_close_to_reference(out.cpu(), af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu()), torch.float16)


def test_refused_variant_runs_the_portable_kernel():
    """A rotation inside the kernel (RoPE placed `fused` by the caller) has no Gluon schedule:
    the portable kernel runs it."""
    spec = af.attention(af.rope(), af.causal())
    fn = af.compile(spec, rope_placement=("fused", "fused"))
    q, k, v = inputs(1, 4, 4, 256, 256, 128, torch.float16, seed=6)
    assert not any(isinstance(x, GluonLaunch) for x in fn.plan(q, k, v).launches)
    with torch.no_grad():
        out = fn(q, k, v)
    expected = af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu())
    assert_close_to_reference(out.cpu(), expected, torch.float16)


DOCUMENTS = {
    "doc": af.attention(af.document()),
    "doc-causal": af.attention(af.document(), af.causal()),
    "doc-window-alibi": af.attention(af.document(), af.sliding_window(300), af.alibi(), af.causal()),
    "doc-sparse-relu": af.attention(af.document(), af.block_sparse(128), af.relu()),
}
"""Document variants on the Gluon forward: 128 x 128 tiles walking the document lists (full
blocks one document fills, then partial ones, filtered by the ids), with a band, score ops, a
block-sparse layout intersected and a pointwise normalizer."""


def random_documents(b, nk, seed, shared, sorted_ids=True):
    """Document ids for `nk` keys: runs of 1-400 keys of increasing ids, the last 37 keys padding
    (-1), `[Nk]` when `shared`, else `[B, Nk]` with each sequence's own runs; unsorted ids
    (`sorted_ids=False`) reuse ids across runs, so a tile's id range can overlap a tile it
    shares no document with (the lists keep such pairs as partial)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(1 if shared else b):
        ids, doc = [], 0
        while len(ids) < nk:
            ids += [doc] * int(torch.randint(1, 400, (1,), generator=gen))
            doc = doc + 1 if sorted_ids else int(torch.randint(0, 4, (1,), generator=gen))
        row = torch.tensor(ids[:nk], dtype=torch.int32)
        row[-37:] = -1
        rows.append(row)
    return (rows[0] if shared else torch.stack(rows)).cuda()


@pytest.mark.parametrize("name", list(DOCUMENTS))
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
@pytest.mark.parametrize("hq,hkv,nq,nk,shared,sorted_ids", [(4, 4, 512, 512, True, True), (8, 2, 300, 700, False, True),
                                                            (4, 1, 640, 640, False, False), (2, 2, 1000, 900, True, True)])
def test_gluon_documents_match_reference(name, d, dtype, hq, hkv, nq, nk, shared, sorted_ids, monkeypatch):
    """The forward takes the Gluon kernel on 128 x 128 tiles and the document lists, against the
    reference: ragged lengths, Nq != Nk (queries past the keys have no document), GQA, shared
    and per-sequence ids, padding (rows 0), unsorted ids."""
    spec = DOCUMENTS[name]
    fn = af.compile(spec)
    q, k, v = inputs(2, hq, hkv, nq, nk, d, dtype, seed=41)
    launch = listed_gluon_launch(fn, q, k, v)
    data = {"doc_ids": random_documents(2, nk, seed=42, shared=shared, sorted_ids=sorted_ids)}
    if "sparse" in name:
        data["block_layout"] = random_layout(spec, hq, nq, nk, seed=43, per_head=not shared)
    assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch, data=data)


def test_gluon_documents_training_call_with_positions_per_document(monkeypatch):
    """Packed sequences in training: RoPE at each document's own positions (pre-rotated for the
    Gluon forward), the documents' causal lists on the Gluon forward, the portable backward's
    own lists; two packings on one plan, against the reference's gradients."""
    spec = af.attention(af.rope(theta=500000.0), af.document(), af.causal())
    fn = af.compile(spec)
    n = 1000
    q, k, v = inputs(1, 8, 2, n, n, 128, torch.bfloat16, seed=44, grad=True)
    assert isinstance(forward_launch(fn, q, k, v, training=True), GluonLaunch)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(45)).to(q.dtype).cuda()
    for seed in (46, 47):
        doc_ids = random_documents(1, n, seed=seed, shared=True)
        starts = torch.cat([torch.ones(1, dtype=torch.bool, device="cuda"), doc_ids[1:] != doc_ids[:-1]])
        run = torch.cumsum(starts.int(), 0) - 1
        first = torch.nonzero(starts).flatten()
        positions = torch.arange(n, device="cuda") - first[run]
        data = {"doc_ids": doc_ids, "q_positions": positions, "k_positions": positions}
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v, **data).backward(grad)
        cpu = {key: t.cpu() for key, t in data.items()}
        want = reference_gradients(spec, q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), grad.cpu(), **cpu)
        errors = gradient_errors({"q": q.grad, "k": k.grad, "v": v.grad}, want)
        assert all(err <= GRAD_TOLERANCE[torch.bfloat16] for err in errors.values()), errors


SPARSE = {
    "sparse": af.attention(af.block_sparse(128)),
    "sparse-causal": af.attention(af.block_sparse(128), af.causal()),
    "sparse256-alibi-softcap": af.attention(af.block_sparse(256), af.alibi(), af.softcap(20.0)),
    "sparse-relu": af.attention(af.block_sparse(128), af.relu()),
}
"""Block-sparse variants on the Gluon forward: 128 x 128 tiles walking the layout's lists (full
blocks, then partial ones), a coarser layout, score ops and a pointwise normalizer."""


def random_layout(spec, hq, nq, nk, seed, per_head):
    """A random layout for `spec`'s block size with about half its blocks, the first query
    block's row empty (its rows must come out 0), per head or shared."""
    size = next(block.block_size for block in spec.blocks if hasattr(block, "block_size"))
    rows, cols = -(-nq // size), -(-nk // size)
    gen = torch.Generator().manual_seed(seed)
    layout = torch.rand((hq, rows, cols) if per_head else (rows, cols), generator=gen) < 0.5
    layout[..., 0, :] = False
    return layout.cuda()


@pytest.mark.parametrize("name", list(SPARSE))
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
@pytest.mark.parametrize("hq,hkv,nq,nk,per_head", [(4, 4, 512, 512, False), (8, 2, 300, 700, True),
                                                   (4, 1, 640, 384, False), (2, 2, 100, 900, True)])
def test_gluon_block_sparse_matches_reference(name, d, dtype, hq, hkv, nq, nk, per_head, monkeypatch):
    """The forward takes the Gluon kernel on 128 x 128 tiles and its lists, against the
    reference: ragged lengths, Nq != Nk, GQA, shared and per-head layouts, an empty row."""
    spec = SPARSE[name]
    fn = af.compile(spec)
    q, k, v = inputs(2, hq, hkv, nq, nk, d, dtype, seed=31)
    launch = listed_gluon_launch(fn, q, k, v)
    layout = random_layout(spec, hq, nq, nk, seed=32, per_head=per_head)
    assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch, data={"block_layout": layout})


def test_gluon_block_sparse_training_call_and_layout_changes(monkeypatch):
    """A training call on the Gluon block-sparse forward (the portable backward's own lists) and
    a second layout on the same plan: both against the reference."""
    spec = SPARSE["sparse-causal"]
    fn = af.compile(spec)
    q, k, v = inputs(1, 8, 2, 1000, 1000, 128, torch.bfloat16, seed=33, grad=True)
    assert isinstance(forward_launch(fn, q, k, v, training=True), GluonLaunch)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(34)).to(q.dtype).cuda()
    for seed in (35, 36):
        layout = random_layout(spec, 8, 1000, 1000, seed=seed, per_head=True)
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v, block_layout=layout).backward(grad)
        want = reference_gradients(spec, q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), grad.cpu(),
                                   block_layout=layout.cpu())
        errors = gradient_errors({"q": q.grad, "k": k.grad, "v": v.grad}, want)
        assert all(err <= GRAD_TOLERANCE[torch.bfloat16] for err in errors.values()), errors


WINDOWED = {
    "relu-window": af.attention(af.relu(), af.sliding_window(300), af.causal()),
    "bias-window": af.attention(af.additive_bias(), af.sliding_window(300), af.causal()),
    "bias-relu": af.attention(af.additive_bias(), af.relu(), af.causal()),
}
"""Three key loops (masked, full, masked: a 300-key window holds a whole 128-key block) with a
pointwise normalizer or a bias, and a bias under ReLU."""


@pytest.mark.parametrize("name", ["relu", "sigmoid-causal", "bias-causal", *WINDOWED])
@pytest.mark.parametrize("persistent", ["0", "1"])
def test_gluon_pointwise_and_bias_on_both_grids(name, persistent, monkeypatch):
    """The pointwise normalizers and a bias on the plain and the persistent grid, at head dim
    64 (their consumer counts) and 128, with lengths that are not whole blocks and GQA, under
    a causal band and a sliding window."""
    monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", persistent)
    spec = SPECS.get(name) or WINDOWED[name]
    for d, dtype in ((64, torch.float16), (128, torch.bfloat16)):
        fn = af.compile(spec)
        q, k, v = inputs(2, 8, 2, 448, 333, d, dtype, seed=3)
        data = call_data(name, q, k)
        launch = forward_launch(fn, q, k, v)
        assert isinstance(launch, GluonLaunch) and launch.launch.persistent == (persistent == "1")
        assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch, data)


@pytest.mark.parametrize("placement", ["auto", ("pre_rotated", "pre_rotated")])
def test_rope_forward(placement):
    """RoPE: a fused rotation is refused (portable kernel); pre-rotated copies feed Gluon."""
    spec = af.attention(af.rope(theta=500000.0), af.causal())
    fn = af.compile(spec, rope_placement=placement)
    q, k, v = inputs(1, 8, 2, 512, 512, 128, torch.bfloat16, seed=7)
    with torch.no_grad():
        out = fn(q, k, v)
    ref = af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu(), rope_placement=placement)
    assert_close_to_reference(out.cpu(), ref, torch.bfloat16)


def test_auto_rope_at_llama_heads_pre_rotates_for_gluon(monkeypatch):
    """`auto` at head dim 128 and 4096 keys: the Gluon forward, reading pre-rotated copies
    (the placement follows the target), equal to the reference."""
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "auto")
    spec = af.attention(af.rope(theta=500000.0), af.causal())
    fn = af.compile(spec)
    q, k, v = inputs(1, 8, 2, 4096, 4096, 128, torch.bfloat16, seed=9)
    plan = fn.plan(q, k, v)
    names = [launch.info.name for launch in plan.launches]
    assert "rotate_query" in names and "rotate_key" in names
    assert isinstance(forward_launch(fn, q, k, v), GluonLaunch)
    with torch.no_grad():
        out = fn(q, k, v)
    ref = af.reference_attention(spec, q, k, v, device="cuda")
    assert_close_to_reference(out.cpu(), ref.cpu(), torch.bfloat16)


@pytest.mark.parametrize("name,gluon", [("relu", True), ("bias-causal", False)])
def test_auto_takes_gluon_by_variant_class(name, gluon, monkeypatch):
    """`auto` at a size it takes Gluon for plain softmax (head dim 128, 4096 queries): ReLU runs
    the Gluon forward, a bias the portable kernel (`AUTO_VARIANT_CLASSES`, measured)."""
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "auto")
    fn = af.compile(SPECS[name])
    q, k, v = inputs(1, 8, 2, 4096, 4096, 128, torch.bfloat16, seed=5)
    assert isinstance(forward_launch(fn, q, k, v), GluonLaunch) == gluon


@pytest.mark.parametrize("shape", [(2, 1, 1, 333), (1, 8, 448, 1), (448, 333), (2, 8, 448, 333)])
def test_gluon_broadcast_bias(shape, monkeypatch):
    """A bias broadcast along keys, queries or batch and heads (zero strides in the kernel):
    a key-row bias `[B, 1, 1, Nk]`, a query-column one `[1, Hq, Nq, 1]`, a `[Nq, Nk]` one, and
    a full one (every batch its own), on the plain and the persistent grid."""
    spec = SPECS["bias-causal"]
    for persistent in ("0", "1"):
        monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", persistent)
        fn = af.compile(spec)
        q, k, v = inputs(2, 8, 2, 448, 333, 128, torch.bfloat16, seed=7)
        bias = torch.randn(shape, generator=torch.Generator().manual_seed(8)).cuda()
        launch = forward_launch(fn, q, k, v)
        assert isinstance(launch, GluonLaunch) and launch.launch.persistent == (persistent == "1")
        assert_gluon_matches_reference(fn, spec, q, k, v, launch, monkeypatch, {"bias": bias})


@pytest.mark.parametrize("target", ["gluon", "triton"])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
def test_rows_below_the_softmax_floor_have_no_weight(target, d, dtype, monkeypatch):
    """Whole rows masked by finite negatives (finfo.min, -1e9, -1e30: below the floor, -2^23)
    output 0 with lse -inf on both targets, a row of -1e4 everywhere (above, far from 0) is its
    softmax, a half-masked row is ordinary: never NaN (the weight is one FMA, whose rounding of
    max * log2(e) past 2^24 took the largest weight beyond fp16's range before the floor)."""
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", target)
    spec = af.attention(af.additive_bias(), af.causal())
    q, k, v = inputs(1, 4, 4, 256, 256, d, dtype, seed=51)
    bias = torch.zeros(1, 4, 256, 256)
    for row, value in ((200, torch.finfo(torch.float32).min), (201, -1e9), (202, -1e30), (203, -1e4)):
        bias[..., row, :] = value
    bias[..., 204, :100] = torch.finfo(torch.float32).min
    fn = af.compile(spec)
    assert isinstance(forward_launch(fn, q, k, v), GluonLaunch) == (target == "gluon")
    with torch.no_grad():
        out, lse = fn(q, k, v, bias=bias.cuda(), return_lse=True)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[..., 200:203, :] == 0).all() and torch.isneginf(lse[..., 200:203]).all()
    # Row 203 against the softmax of its float32 scores (the bias is added in float32, where
    # -1e4 keeps the product's differences to 1e-3).
    scores = (q[..., 203:204, :].float() @ k.float().transpose(-1, -2) / d**0.5 - 1e4)[..., :204]
    want = torch.softmax(scores.double(), -1) @ v[..., :204, :].double()
    torch.testing.assert_close(out[..., 203:204, :].double(), want, atol=2e-2, rtol=2e-2)
    rows = [r for r in range(256) if r not in (200, 201, 202, 203)]
    expected = af.reference_attention(spec, q.cpu(), k.cpu(), v.cpu(), bias=bias)
    assert_close_to_reference(out[..., rows, :].cpu(), expected[..., rows, :], dtype)
