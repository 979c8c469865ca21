"""The forward and backward kernels compiled for a CUDA device at real sizes, against the
fp64 reference.

Skipped without CUDA. For the forward, the reference runs on the CPU in float64, one (batch,
query head) at a time so that a 4096 x 4096 score matrix (128 MiB in fp64) is the largest thing
it holds; the backward's reference gradients (autograd through the reference) run on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to_reference, assert_lse_close, lse_tolerance, make_qkv, direct_then_graphed

import attnfuse as af

pytestmark = pytest.mark.gpu

HALF = [torch.float16, torch.bfloat16]


def dtype_id(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def reference_by_head(spec, q, k, v):
    """`af.reference_attention` (fp64, CPU), one batch entry and query head at a time."""
    b, hq = q.shape[:2]
    group = hq // k.shape[1]
    q, k, v = (t.detach().cpu() for t in (q, k, v))
    out = torch.empty(b, hq, q.shape[2], v.shape[3], dtype=torch.float64)
    lse = torch.empty(b, hq, q.shape[2], dtype=torch.float32)
    for bi in range(b):
        for h in range(hq):
            kv = h // group
            o, l = af.reference_attention(
                spec, q[bi : bi + 1, h : h + 1], k[bi : bi + 1, kv : kv + 1], v[bi : bi + 1, kv : kv + 1],
                return_lse=True,
            )
            out[bi, h], lse[bi, h] = o[0, 0], l[0, 0]
    return out, lse


def check(fn, spec, q, k, v):
    out, lse = fn(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    assert out.device.type == "cuda" and lse.device.type == "cuda"
    ref, ref_lse = reference_by_head(spec, q, k, v)
    assert_close_to_reference(out, ref, q.dtype)
    assert_lse_close(lse, ref_lse, lse_tolerance(spec, q, k))
    return out, lse


def qkv(b=1, hq=4, hkv=None, nq=4096, nk=None, d=64, dv=None, dtype=torch.float16, seed=0, strided=False):
    return make_qkv(b, hq, hkv, nq, nk, d, dv, dtype, seed=seed, strided=strided, device="cuda")


# --------------------------------------------------------------------------------------------
# RoPE + causal at N = 4096 (the headline variant)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("d", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("hq, hkv", [(4, 4), (8, 2)], ids=["mha-h4", "gqa-8-2"])
def test_rope_causal_4096(hq, hkv, d, dtype):
    spec = af.attention(af.rope(), af.causal())
    q, k, v = qkv(1, hq, hkv, d=d, dtype=dtype, seed=d)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("rope", [af.rope(interleaved=True), af.rope(theta=500000.0, rotary_dim=64)],
                         ids=["interleaved", "partial64-theta5e5"])
def test_rope_variants_4096(rope, dtype):
    spec = af.attention(rope, af.causal())
    q, k, v = qkv(1, 2, d=128, dtype=dtype, seed=1)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize("placement", ["auto", "fused", "pre_rotated", "q_fused"])
@pytest.mark.parametrize("d", [64, 128], ids=lambda d: f"d{d}")
def test_rope_placements_4096(placement, d):
    spec = af.attention(af.rope(), af.causal())
    q, k, v = qkv(1, 2, d=d, dtype=torch.float16, seed=2)
    fn = af.compile(spec, rope_placement=placement)
    out, _ = check(fn, spec, q, k, v)
    fused = af.compile(spec, rope_placement="fused")(q, k, v)
    # Same rotation wherever it runs: the answers agree to fp16 rounding.
    assert (out.float() - fused.float()).abs().max().item() <= 2e-3


# --------------------------------------------------------------------------------------------
# Masks without rope, windows, decoding
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("d", [64, 128], ids=lambda d: f"d{d}")
def test_causal_4096(d, dtype):
    spec = af.attention(af.causal())
    q, k, v = qkv(1, 2, d=d, dtype=dtype, seed=3)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
def test_no_mask_4096(dtype):
    spec = af.attention()
    q, k, v = qkv(1, 2, d=128, dtype=dtype, seed=4)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize("hq,hkv,nq,nk,per_head", [(4, 4, 512, 512, False), (8, 2, 300, 700, True),
                                                   (6, 3, 1000, 1000, True), (2, 2, 100, 900, False)])
def test_portable_block_sparse_forward_on_its_head_major_grid(hq, hkv, nq, nk, per_head, monkeypatch):
    """The portable block-sparse forward (`ATTNFUSE_FORWARD_TARGET=triton`) runs on a head-major
    grid (`tile.kernel`'s `head_major`: one axis, program p owning query block p % blocks of
    batch x head p // blocks): ragged lengths, Nq != Nk, GQA, per-head layouts and a query
    block with no keys (rows 0, lse -inf), against the reference."""
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "triton")
    spec = af.attention(af.block_sparse(128))
    fn = af.compile(spec)
    q, k, v = qkv(b=2, hq=hq, hkv=hkv, nq=nq, nk=nk, d=64, seed=nq)
    rows, cols = -(-nq // 128), -(-nk // 128)
    gen = torch.Generator().manual_seed(nk)
    layout = torch.rand((hq, rows, cols) if per_head else (rows, cols), generator=gen) < 0.4
    layout[..., 0, :] = False
    layout = layout.cuda()
    out, lse = fn(q, k, v, block_layout=layout, return_lse=True)
    assert fn.last is not None and "num_blocks = tl.cdiv(n_q, BLOCK_M)" in fn.last.source
    b = q.shape[0]
    ref = torch.empty(b, hq, nq, v.shape[-1], dtype=torch.float64)
    ref_lse = torch.empty(b, hq, nq, dtype=torch.float32)
    for h in range(hq):
        head_layout = layout[h] if per_head else layout
        ref[:, h : h + 1], ref_lse[:, h : h + 1] = af.reference_attention(
            spec, q[:, h : h + 1].cpu(), k[:, h // (hq // hkv) : h // (hq // hkv) + 1].cpu(),
            v[:, h // (hq // hkv) : h // (hq // hkv) + 1].cpu(), block_layout=head_layout.cpu(), return_lse=True)
    assert_close_to_reference(out.cpu(), ref, q.dtype)
    assert_lse_close(lse.cpu(), ref_lse, lse_tolerance(spec, q, k))
    assert bool((out[:, :, :128] == 0).all()) and bool(torch.isinf(lse[:, :, :128]).all())


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(lambda: [af.sliding_window(256), af.causal()], id="window256+causal"),
        pytest.param(lambda: [af.sliding_window(256), af.causal(), af.rope()], id="window256+causal+rope"),
        pytest.param(lambda: [af.sliding_window(256)], id="window256"),
        pytest.param(lambda: [af.sliding_window(1000), af.causal()], id="window1000+causal"),
    ],
)
def test_sliding_window_4096(blocks, dtype):
    spec = af.attention(*blocks())
    q, k, v = qkv(1, 2, d=64, dtype=dtype, seed=5)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("d", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("nq", [1, 16], ids=lambda n: f"nq{n}")
@pytest.mark.parametrize("hq, hkv", [(8, 8), (8, 1)], ids=["mha", "mqa"])
def test_decode_vs_4096_keys(hq, hkv, nq, d, dtype):
    spec = af.attention(af.rope(), af.causal())
    q, k, v = qkv(2, hq, hkv, nq=nq, nk=4096, d=d, dtype=dtype, seed=6)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize("nk", [4095, 4097, 1000], ids=lambda n: f"nk{n}")
def test_decode_ragged_keys(nk):
    spec = af.attention(af.rope(), af.causal(), af.sliding_window(512))
    q, k, v = qkv(1, 4, 2, nq=1, nk=nk, d=128, seed=7)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("n", [4095, 3333, 1000, 129], ids=lambda n: f"n{n}")
def test_ragged_lengths(n, dtype):
    spec = af.attention(af.rope(), af.causal())
    q, k, v = qkv(1, 2, nq=n, d=128, dtype=dtype, seed=n)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize(
    "blocks, nq, nk",
    [
        pytest.param(lambda: [af.causal()], 1024, 300, id="causal-1024x300"),
        pytest.param(lambda: [af.rope(), af.causal()], 2000, 77, id="rope+causal-2000x77"),
        pytest.param(lambda: [af.sliding_window(64)], 1500, 1000, id="window-1500x1000"),
        pytest.param(lambda: [af.causal(), af.sliding_window(100)], 3000, 2000, id="causal+window-3000x2000"),
    ],
)
def test_rows_without_keys_on_gpu(blocks, nq, nk):
    """More queries than keys: leading rows keep no key and give exactly 0 and lse -inf.
    (Integer division of negative positions truncates on the GPU but floors on the CPU.)"""
    spec = af.attention(*blocks())
    q, k, v = qkv(1, 2, nq=nq, nk=nk, d=64, seed=8)
    out, lse = check(spec, spec, q, k, v)
    from attnfuse.runtime.reference import keep_mask

    empty = ~keep_mask(spec, nq, nk).any(dim=1)
    assert empty.any()
    empty = empty.cuda()
    assert (out[:, :, empty] == 0).all()
    assert torch.isneginf(lse[:, :, empty]).all()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()


# --------------------------------------------------------------------------------------------
# fp32 (IEEE products): max abs error <= 1e-4
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(lambda: [af.rope(), af.causal()], id="rope+causal"),
        pytest.param(lambda: [], id="none"),
        pytest.param(lambda: [af.sliding_window(128), af.causal()], id="window+causal"),
        pytest.param(lambda: [af.rope(interleaved=True, rotary_dim=32)], id="rope-partial-interleaved"),
    ],
)
def test_fp32_1024(blocks, d):
    spec = af.attention(*blocks())
    q, k, v = qkv(1, 4, 2, nq=1024, d=d, dtype=torch.float32, seed=9)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize("placement", ["fused", "pre_rotated", "q_fused"])
def test_fp32_placements_1024(placement):
    spec = af.attention(af.rope(), af.causal())
    q, k, v = qkv(1, 2, nq=1024, d=128, dtype=torch.float32, seed=10)
    check(af.compile(spec, rope_placement=placement), spec, q, k, v)


# --------------------------------------------------------------------------------------------
# Layouts, head dims, batch and heads, tile configurations
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
def test_strided_inputs_2048(dtype):
    spec = af.attention(af.rope(), af.causal())
    q, k, v = qkv(2, 8, 2, nq=2048, d=128, dtype=dtype, seed=11, strided=True)
    assert not q.is_contiguous()
    out, _ = check(spec, spec, q, k, v)
    contiguous = spec(q.contiguous(), k.contiguous(), v.contiguous())
    assert torch.equal(out, contiguous)


@pytest.mark.parametrize("d, dv", [(128, 64), (64, 128), (80, 80), (96, 96), (256, 256), (24, 40)],
                         ids=lambda x: str(x))
def test_head_dims(d, dv):
    spec = af.attention(af.rope(rotary_dim=d - d % 16 if d % 16 else None), af.causal())
    q, k, v = qkv(1, 2, nq=1024, d=d, dv=dv, seed=d)
    check(spec, spec, q, k, v)


def test_many_heads_and_batch():
    spec = af.attention(af.rope(), af.causal())
    q, k, v = qkv(4, 16, 4, nq=1024, d=64, seed=12)
    check(spec, spec, q, k, v)


@pytest.mark.parametrize(
    "config",
    [af.TileConfig(64, 64, 4, 3), af.TileConfig(128, 64, 8, 3), af.TileConfig(128, 128, 8, 2),
     af.TileConfig(32, 32, 4, 2), af.TileConfig(16, 16, 4, 1)],
    ids=lambda c: f"m{c.block_m}n{c.block_n}w{c.num_warps}s{c.num_stages}",
)
def test_tile_configs(config):
    spec = af.attention(af.rope(), af.causal(), af.sliding_window(300))
    q, k, v = qkv(1, 2, nq=1500, nk=1700, d=64, seed=13)
    check(af.compile(spec, config=config), spec, q, k, v)


# --------------------------------------------------------------------------------------------
# API on a CUDA machine
# --------------------------------------------------------------------------------------------


def test_source_before_first_call_on_gpu():
    """`print(fn.source)` before any call (the documented use) must work with the
    interpreter off, as it is on a CUDA machine."""
    fn = af.compile(af.attention(af.rope(), af.causal(), af.sliding_window(333)))
    assert "@triton.jit" in fn.source


def test_source_after_call_on_gpu():
    fn = af.compile(af.attention(af.rope(), af.causal()))
    q, k, v = qkv(1, 1, nq=256, d=128, seed=14)
    fn(q, k, v)
    assert "@triton.jit" in fn.source
    assert "HEAD_DIM: tl.constexpr = 128" in fn.source


def test_empty_and_zero_key_inputs_on_gpu():
    spec = af.attention(af.rope(), af.causal())
    q, k, v = qkv(1, 2, nq=16, nk=0, d=64)
    out, lse = spec(q, k, v, return_lse=True)
    assert out.device.type == "cuda" and (out == 0).all() and torch.isneginf(lse).all()
    q, k, v = qkv(0, 2, nq=16, d=64)
    assert spec(q, k, v).shape == (0, 2, 16, 64)


def test_direct_launches_follow_strides_and_alignment():
    """After its first launch a kernel is launched through its compiled launcher, which is
    specialized on strides and pointer alignment: inputs of the same shape but another layout
    or a misaligned start must still give the right answer."""
    spec = af.attention(af.rope(), af.causal())
    fn = af.compile(spec)
    q, k, v = make_qkv(1, 4, 2, nq=300, nk=300, d=64, dtype=torch.float16, device="cuda")
    layouts = {
        "contiguous": (q, k, v),
        "transposed": tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)),
        "misaligned": tuple(torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")[1:]
                            .view(t.shape).copy_(t) for t in (q, k, v)),
    }
    expected, _lse = reference_by_head(spec, q, k, v)
    for _round in range(2):  # the second round launches every layout directly
        for name, (qq, kk, vv) in layouts.items():
            assert qq.data_ptr() % 16 == (2 if name == "misaligned" else 0)
            assert_close_to_reference(fn(qq, kk, vv), expected, q.dtype)
    # The direct path was taken (it is not silently off) by every kernel these forward calls
    # ran; the plan also holds the backward's kernels, which never ran here.
    schedules = fn.plan(q, k, v).schedules
    ran = [launch for (kernels, *_given), (schedule, _graphs) in schedules.items() if kernels == ("attention_fwd",)
           for launch, _rotated, _dtype in schedule]
    assert ran and all(launch.runners for launch in ran)


def _direct_paths(fn, q, k, v, training: bool) -> set[str]:
    """The `triton_launcher` paths of the direct launchers a call's plan holds."""
    plan = fn.plan(q, k, v, training=training)
    # (A launch on the Gluon target keeps no direct launchers.)
    return {runner.path for launch in plan.launches for runner in getattr(launch, "runners", {}).values()}


def test_direct_launches_equal_the_jit_launches_forward_and_training():
    """The first call of a shape launches through Triton's JIT, later ones through the direct
    launcher (on Triton 3.6, its C launcher): the same kernels with the same arguments, so
    the outputs are bitwise equal and the gradients equal to rounding (dQ's order of
    accumulation aside)."""
    from attnfuse.runtime import triton_launcher

    fn = af.compile(af.attention(af.rope(), af.causal()))
    q, k, v = qkv(b=1, hq=8, hkv=8, nq=128, d=64)
    grad_out = torch.randn_like(q)
    results = []
    for _call in range(3):
        with torch.no_grad():
            out = fn(q, k, v)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out_train = fn(*leaves)
        out_train.backward(grad_out)
        results.append((out, out_train.detach(), *(t.grad for t in leaves)))
    paths = _direct_paths(fn, q, k, v, training=False) | _direct_paths(fn, q, k, v, training=True)
    if triton_launcher.triton_version() in triton_launcher.C_LAUNCHERS:
        # The H200's Triton 3.6: every launch calls the C launcher ("launcher" would mean a
        # kernel with global or profile scratch, which CudaLauncher.__call__ must allocate).
        assert paths == {"c"}, paths
    else:
        assert paths
    jit, *direct = results
    for later in direct:
        assert torch.equal(later[0], jit[0]) and torch.equal(later[1], jit[1])
        for got, want in zip(later[2:], jit[2:]):
            assert (got.float() - want.float()).norm() <= 1e-3 * want.float().norm()


@pytest.mark.parametrize("spec_name, n", [("causal", 128), ("causal", 1024), ("bias", 256), ("rope", 256)])
def test_launch_graphs_replay_the_backward_bitwise(spec_name, n, monkeypatch):
    """Training steps whose backward launches replay as one CUDA graph (`launch_graphs`): the
    second step with the same tensors captures, later ones replay. New values written into
    the same tensors between steps are read by the replay, and every step's outputs and
    gradients equal those of direct launches bit for bit (the same kernels on the same
    memory). RoPE's forward replays its pre-rotation kernels with the attention kernel, the
    rotated copies (saved for the backward) keyed by their addresses."""
    spec = {"causal": af.attention(af.causal()),
            "bias": af.attention(af.additive_bias(), af.causal()),
            "rope": af.attention(af.rope(), af.causal())}[spec_name]
    fn = af.compile(spec, rope_placement="pre_rotated") if spec_name == "rope" else af.compile(spec)
    q, k, v = (t.requires_grad_() for t in qkv(b=1, hq=8, hkv=2, nq=n, d=64, seed=n))
    # A bias that requires a gradient: its step has the preprocess and the dQ-bias kernel.
    extra = ({"bias": torch.randn(1, 8, n, n, device="cuda", dtype=torch.float16).requires_grad_()}
             if spec_name == "bias" else {})
    leaves = (q, k, v, *extra.values())
    grad = torch.empty_like(q)
    # Made before the steps, as are the gradients' copies: a step allocates only what a
    # training step does, so its tensors come back at the same addresses (the caching
    # allocator's steady state), which is when graphs are captured and replayed.
    gen = torch.Generator(device="cuda").manual_seed(n)
    values = [[torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype) for t in (q, k, v, grad)]
              for _step in range(5)]
    copies = {mode: [[torch.empty_like(t) for t in (q, *leaves)] for _step in range(5)] for mode in ("direct", "graphed")}

    def steps(mode: str) -> list[list[torch.Tensor]]:
        for step, (new, kept) in enumerate(zip(values, copies[mode])):
            with torch.no_grad():
                for t, value in zip((q, k, v, grad), new):
                    t.copy_(value)
            for t in leaves:
                t.grad = None
            out = fn(q, k, v, **extra)
            out.backward(grad)
            for copy, t in zip(kept, (out, *(leaf.grad for leaf in leaves))):
                copy.copy_(t)
        return copies[mode]

    direct, graphed = direct_then_graphed(steps, monkeypatch)
    for seed, (want, got) in enumerate(zip(direct, graphed)):
        for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), want, got):
            assert torch.equal(a, b), f"step {seed}: {name} differs from the direct launches'"
    if spec_name == "rope":
        forward = [(schedule, graphs) for (kernels, *_given), (schedule, graphs) in fn.plan(q, k, v, training=True).schedules.items()
                   if kernels == ("attention_fwd",)]
        assert forward and all(any(rotated for _launch, rotated, _dtype in schedule) for schedule, _ in forward)
        assert all(graphs is not None and graphs.graphs for _schedule, graphs in forward), \
            "the forward replays with its pre-rotation kernels"


def test_launch_graphs_drop_a_capture_that_allocates_and_keep_one_that_does_not():
    """`LaunchGraphs` on CUDA's own allocator: launches that only write the given tensors are
    captured (what beginning a capture allocates for the graph itself is not counted) and
    replay what they did; a launch that makes a copy of its input while captured (freed at
    once, but kept in the graph's pool) has its schedule launch directly from then on."""
    from attnfuse.runtime.launch_graphs import LaunchGraphs

    x = torch.randn(1024, device="cuda")
    out = torch.zeros_like(x)
    pure = [lambda t: t["out"].copy_(t["x"]), lambda t: t["out"].mul_(2)]
    graphs = LaunchGraphs(pure, ["x", "out"], x.device)
    tensors = {"x": x, "out": out}
    assert [graphs(tensors) for _ in range(3)] == [False, True, True]
    assert graphs.failed is None
    x.add_(1)
    assert graphs(tensors)
    torch.cuda.synchronize()
    assert torch.equal(out, 2 * x)

    copying = [lambda t: t["out"].copy_(t["x"].clone()), lambda t: t["out"].mul_(2)]
    graphs = LaunchGraphs(copying, ["x", "out"], x.device)
    assert [graphs(tensors) for _ in range(3)] == [False, False, False]
    assert graphs.failed is not None and "allocated memory" in graphs.failed


def test_direct_launches_run_on_the_current_side_stream():
    """A call inside `torch.cuda.stream(s)` launches on s: its inputs, written on s behind a
    long sleep, are read after they are written (a launch on the default stream would read
    them first and give the old inputs' result)."""
    fn = af.compile(af.attention(af.causal()))
    q, k, v = qkv(b=1, hq=8, nq=512, d=64)
    fresh = qkv(b=1, hq=8, nq=512, d=64, seed=5)
    with torch.no_grad():
        for _ in range(2):
            fn(q, k, v)  # compiled, then launched directly
        expected = fn(*fresh)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time before the copies
            for t, f in zip((q, k, v), fresh):
                t.copy_(f)
            out = fn(q, k, v)
        torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert _direct_paths(fn, q, k, v, training=False) - {"runner"}


def test_inference_capture_with_the_lse_scratch_replays_new_inputs():
    """An inference call captured in a CUDA graph (direct launches, the plan's lse scratch
    made before the capture) replays with new inputs; an lse a captured call returns is the
    call's own."""
    fn = af.compile(af.attention(af.causal()))
    static = list(qkv(b=2, hq=8, nq=256, d=64))
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*static)
                fn(*static, return_lse=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static)
            out_lse, lse = fn(*static, return_lse=True)
        fresh = qkv(b=2, hq=8, nq=256, d=64, seed=7)
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        expected, expected_lse = fn(*fresh, return_lse=True)
    assert torch.equal(out, expected) and torch.equal(out_lse, expected)
    assert torch.equal(lse, expected_lse)
    assert fn.plan(*static).scratch["lse"].data_ptr() != lse.data_ptr()


def test_a_launch_hook_sees_every_launch_and_the_results_stay_right():
    """With a launch hook installed (as a profiler installs one) launches go through Triton's
    runner, which calls it; removed, the direct path again."""
    from triton import knobs

    fn = af.compile(af.attention(af.causal()))
    q, k, v = qkv(b=1, hq=8, nq=128, d=64)
    with torch.no_grad():
        expected = fn(q, k, v)
        fn(q, k, v)
        seen = []

        def hook(metadata):
            seen.append(metadata)

        knobs.runtime.launch_enter_hook.add(hook)
        try:
            out = fn(q, k, v)
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
        fn(q, k, v)
    assert len(seen) == 1 and torch.equal(out, expected)


def test_cpu_and_gpu_tensors_mixed_raise():
    q, k, v = qkv(1, 2, nq=16, d=64)
    with pytest.raises(af.AttnFuseError, match="device"):
        af.attention(af.causal())(q, k.cpu(), v)


# --------------------------------------------------------------------------------------------
# Backward at real sizes: gradients against autograd through the fp64 reference (on the GPU)
# --------------------------------------------------------------------------------------------

GRAD_LIMIT = {torch.float16: 2e-2, torch.bfloat16: 2e-2, torch.float32: 1e-4}
"""Issue 4's bounds on ||g - ref|| / ||ref||."""


def check_gradients(spec, q, k, v, rope_placement="auto", deterministic=True, **data):
    """Runs forward and backward and compares dq, dk, dv (and the bias's gradient)."""
    from attnfuse.runtime.reference import gradient_errors, reference_gradients

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = af.compile(spec, rope_placement=rope_placement, deterministic=deterministic)(q, k, v, **data)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref = reference_gradients(spec, q, k, v, grad_out, device="cuda", **data)
    got = {"q": q.grad, "k": k.grad, "v": v.grad}
    if "bias" in data:
        got["bias"] = data["bias"].grad
    for name, grad in got.items():
        assert grad.shape == ref[name].shape and torch.isfinite(grad).all(), name
    for name, err in gradient_errors(got, ref).items():
        assert err <= GRAD_LIMIT[q.dtype], f"d{name}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [*HALF, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("placement", ["auto", "fused"])
def test_backward_rope_causal_llama_geometry(placement, dtype):
    n = 2048 if dtype != torch.float32 else 512
    q, k, v = make_qkv(1, 32, 8, nq=n, nk=n, d=128, dtype=dtype, device="cuda")
    check_gradients(af.attention(af.rope(theta=500000.0), af.causal()), q, k, v, placement)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(lambda: [af.alibi(), af.causal()], id="alibi+causal"),
        pytest.param(lambda: [af.relu(), af.causal()], id="relu+causal"),
        pytest.param(lambda: [af.sliding_window(256), af.rope(interleaved=True, rotary_dim=32)], id="window+rope-partial"),
    ],
)
def test_backward_blocks_2048(blocks, dtype):
    q, k, v = make_qkv(1, 8, 2, nq=2043, nk=2048, d=64, dtype=dtype, device="cuda")
    check_gradients(af.attention(*blocks()), q, k, v)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("d", [64, 128], ids=lambda d: f"d{d}")
def test_backward_relu_rope_llama3(d, dtype):
    """relu's derivative jumps at s = 0: the backward forms these scores from unrounded operands
    (rounded rotated operands missed the bound in bf16, 3.7e-2)."""
    q, k, v = make_qkv(1, 8, 2, nq=2048, nk=2048, d=d, dtype=dtype, device="cuda")
    rope = af.rope(theta=500000.0, scaling=af.llama3_scaling())
    check_gradients(af.attention(af.relu(), af.causal(), rope), q, k, v)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
def test_backward_bias_and_block_sparse_1024(dtype):
    q, k, v = make_qkv(2, 8, 4, nq=1024, nk=1024, d=64, dtype=dtype, device="cuda")
    bias = torch.randn(8, 1024, 1024, device="cuda", requires_grad=True)
    check_gradients(af.attention(af.additive_bias(), af.causal()), q, k, v, bias=bias)
    layout = torch.rand(8, 8, 8, device="cuda") < 0.5
    check_gradients(af.attention(af.block_sparse(128), af.causal()), q, k, v, block_layout=layout)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(lambda: [af.rope(theta=500000.0), af.causal()], id="rope+causal"),
        pytest.param(lambda: [af.relu(), af.causal()], id="relu+causal"),
    ],
)
def test_backward_fused_triton(monkeypatch, blocks, dtype):
    """The portable fused backward (ATTNFUSE_BACKWARD=fused: dQ by fp32 atomics in the dK/dV
    kernel) at the Llama-3-8B heads, GQA 4, a ragged Nq."""
    monkeypatch.setenv("ATTNFUSE_BACKWARD", "fused")
    q, k, v = make_qkv(1, 32, 8, nq=2043, nk=2048, d=128, dtype=dtype, device="cuda")
    check_gradients(af.attention(*blocks()), q, k, v, deterministic=False)


def test_second_derivative_raises_on_gpu():
    """With create_graph=True on CUDA the first-order gradients equal the usual ones bit for
    bit, and differentiating through them raises (the autograd thread of a CUDA backward
    carries the error out as it does on the CPU)."""
    fn = af.compile(af.attention(af.rope(theta=500000.0), af.causal()))
    q, k, v = make_qkv(1, 32, 8, nq=1024, nk=1024, d=128, dtype=torch.bfloat16, device="cuda",
                       requires_grad=True)
    grad_out = torch.randn(1, 32, 1024, 128, device="cuda", dtype=torch.bfloat16)
    plain = torch.autograd.grad(fn(q, k, v), (q, k, v), grad_out)
    graphed = torch.autograd.grad(fn(q, k, v), (q, k, v), grad_out, create_graph=True)
    for a, b in zip(plain, graphed):
        assert torch.equal(a, b)
    with pytest.raises(af.AttnFuseError, match="second derivatives of attention"):
        (graphed[0].float().square().sum() + v.float().sum()).backward()


# --------------------------------------------------------------------------------------------
# The blocks added through the compositional middle, and hand-written IR, at real sizes
# --------------------------------------------------------------------------------------------


def check_forward_on_gpu(source, q, k, v, **data):
    """The output against the reference computed in fp64 on the GPU (whole heads at once)."""
    out = af.compile(source)(q, k, v, **data)
    ref = af.reference_attention(source, q, k, v, device="cuda", **data)
    assert_close_to_reference(out, ref, q.dtype)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(lambda: [af.softcap(50.0), af.causal()], id="softcap50+causal"),
        pytest.param(lambda: [af.rope(theta=500000.0), af.softcap(5.0), af.alibi(), af.causal()],
                     id="rope+softcap5+alibi+causal"),
        pytest.param(lambda: [af.sigmoid(), af.causal()], id="sigmoid+causal"),
        pytest.param(lambda: [af.rope(), af.sigmoid(-2.0), af.sliding_window(256)], id="rope+sigmoid+window"),
    ],
)
@pytest.mark.parametrize("d", [64, 128], ids=lambda d: f"d{d}")
def test_new_blocks_2048(blocks, d, dtype):
    q, k, v = make_qkv(1, 8, 2, nq=2043, nk=2048, d=d, dtype=dtype, device="cuda")
    spec = af.attention(*blocks())
    check_forward_on_gpu(spec, q * 4, k, v)
    check_gradients(spec, q * 4, k, v)


def test_hand_written_ir_on_gpu():
    ir = """
    attn.variant @late_cap(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias) -> !attn.output {
      %s = attn.scores %q, %k
      %a = attn.alibi %s
      %b = attn.alibi %a {slopes = [0.5 : f64, 0.25 : f64, 0.125 : f64, 0.0625 : f64]}
      %c = attn.softcap %b {cap = 8.0 : f64}
      %d = attn.add_bias %c, %bias
      %m = attn.mask %d [#attn.causal]
      %p = attn.softmax %m
      %o = attn.pv %p, %v
      attn.yield %o
    }
    """
    q, k, v = make_qkv(2, 4, 2, nq=1000, nk=1024, d=64, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(4, 1, 1024, device="cuda", requires_grad=True)
    check_forward_on_gpu(ir, q * 3, k, v, bias=bias)
    check_gradients(ir, q * 3, k, v, bias=bias)


# --------------------------------------------------------------------------------------------
# torch.compile and CUDA graphs on the GPU
# --------------------------------------------------------------------------------------------


def test_compiled_training_step_matches_eager_on_gpu():
    """fullgraph Inductor compile of a forward + backward through the operators."""
    torch._dynamo.reset()
    fn = af.compile(af.attention(af.rope(theta=500000.0), af.causal()))
    q, k, v = (t.requires_grad_() for t in qkv(b=1, hq=8, hkv=2, nq=1024, d=128, dtype=torch.bfloat16))
    w = torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16)

    def loss(q, k, v):
        return (fn(q, k, v).float() * w).sum()

    grads = []
    for run in (torch.compile(loss, fullgraph=True), loss):
        for t in (q, k, v):
            t.grad = None
        run(q, k, v).backward()
        grads.append([t.grad.float() for t in (q, k, v)])
    for compiled, eager in zip(*grads):
        assert (compiled - eager).norm() <= 2e-2 * eager.norm()


def test_cuda_graph_capture_of_forward_and_training_step():
    """A call captured in a CUDA graph replays with new inputs copied into its buffers."""
    fn = af.compile(af.attention(af.rope(), af.causal(), af.alibi()))
    q, k, v = qkv(b=2, hq=8, hkv=4, nq=512, d=64)
    static = [t.clone().requires_grad_() for t in (q, k, v)]
    grad_out = torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compile, plan and allocate outside capture
        for _ in range(2):
            for t in static:
                t.grad = None
            fn(*static).backward(grad_out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for t in static:
        t.grad = None
    with torch.cuda.graph(graph):
        out = fn(*static)
        out.backward(grad_out)
    fresh = qkv(b=2, hq=8, hkv=4, nq=512, d=64, seed=3)
    with torch.no_grad():
        for s, f in zip(static, fresh):
            s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    eager = [t.clone().requires_grad_() for t in fresh]
    expected = fn(*eager)
    expected.backward(grad_out)
    assert (out - expected).abs().max().item() <= 1e-3
    for s, e in zip(static, eager):
        assert (s.grad.float() - e.grad.float()).norm() <= 1e-3 * e.grad.float().norm()


# --------------------------------------------------------------------------------------------
# KV-cache decoding with keys stored rotated: rope_placement=(..., "given"), rotate_keys
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nq", [1, 128], ids=lambda n: f"nq{n}")
def test_given_key_decoding_llama3_8b(nq):
    """Llama-3-8B geometry (Hq=32, Hkv=8, D=128, bf16, Llama-3.1 RoPE) over a 4096-key cache
    whose keys were rotated once with `rotate_keys` at per-batch positions (left padding):
    the output against the fp64 reference of the same call (k as given) and of the plain
    call that rotates both operands, and, for nq=128, dq, dk, dv against the reference."""
    from attnfuse.runtime.reference import gradient_errors, reference_gradients

    given = ("auto", "given")
    spec = af.attention(af.rope(theta=500000.0, scaling=af.llama3_scaling()), af.causal())
    fn = af.compile(spec, rope_placement=given)
    b, nk = 2, 4096
    q, k, v = make_qkv(b, 32, 8, nq=nq, nk=nk, d=128, dtype=torch.bfloat16, device="cuda", seed=nq)
    pad = torch.tensor([[0], [37]], device="cuda")
    k_pos = torch.arange(nk, device="cuda")[None, :] - pad  # [B, Nk]
    q_pos = k_pos[:, nk - nq:]  # the queries are the last tokens
    k_cache = fn.rotate_keys(k, k_pos)
    out = fn(q, k_cache, v, q_positions=q_pos)
    torch.cuda.synchronize()
    ref = af.reference_attention(spec, q, k_cache, v, q_positions=q_pos, rope_placement=given,
                                 device="cuda")
    assert_close_to_reference(out, ref, q.dtype)
    plain = af.reference_attention(spec, q, k, v, q_positions=q_pos, k_positions=k_pos, device="cuda")
    assert_close_to_reference(out, plain, q.dtype)
    if nq == 1:
        return
    leaves = [t.detach().requires_grad_() for t in (q, k_cache, v)]
    out = fn(*leaves, q_positions=q_pos)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_grads = reference_gradients(spec, q, k_cache, v, grad_out, q_positions=q_pos,
                                    rope_placement=given, device="cuda")
    got = dict(zip("qkv", (t.grad for t in leaves)))
    for name, err in gradient_errors(got, ref_grads).items():
        assert err <= GRAD_LIMIT[q.dtype], f"d{name}: relative error {err:.2e}"


def test_rotate_keys_on_gpu():
    """rotate_keys at 4096 positions in bf16 against the fp64 rotation, and its gradient
    (the inverse rotation) against that of the fp64 rotation."""
    from attnfuse.dsl.blocks import Rope
    from attnfuse.runtime.reference import rotate

    spec = af.attention(af.rope(theta=500000.0, scaling=af.llama3_scaling()), af.causal())
    fn = af.compile(spec, rope_placement=("auto", "given"))
    _, k, _ = make_qkv(2, 8, nq=1, nk=4096, d=128, dtype=torch.bfloat16, device="cuda", seed=3)
    k_pos = torch.arange(4096, device="cuda")[None, :] - torch.tensor([[0], [100]], device="cuda")
    k = k.requires_grad_()
    rotated = fn.rotate_keys(k, k_pos)
    ref = rotate(k.detach().double(), k_pos, spec.block(Rope))
    err = ((rotated.double() - ref).norm() / ref.norm()).item()
    assert err <= 2**-8, f"relative error {err:.2e}"
    grad = torch.randn_like(rotated)
    rotated.backward(grad)
    ref_grad = rotate(grad.double(), -k_pos, spec.block(Rope))
    err = ((k.grad.double() - ref_grad).norm() / ref_grad.norm()).item()
    assert err <= 2**-8, f"gradient relative error {err:.2e}"


# --------------------------------------------------------------------------------------------
# Documents (packed sequences and padding) at real sizes
# --------------------------------------------------------------------------------------------


def packed_doc_ids(batch: int, n: int, seed: int = 0) -> torch.Tensor:
    """`[B, N]` ids of packed documents of 1 to 700 keys (some shorter than a tile), batch 0
    left-padded by 37 keys, the last batch right-padded by 100."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(batch):
        row: list[int] = [-1] * (37 if b == 0 else 0)
        doc = 0
        while len(row) < n:
            row += [doc] * int(torch.randint(1, 701, (), generator=gen))
            doc += 1
        row = row[:n]
        if b == batch - 1:
            row[-100:] = [-1] * 100
        rows.append(row)
    return torch.tensor(rows, device="cuda")


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("d", [64, 128], ids=lambda d: f"d{d}")
def test_documents_causal_2048(d, dtype):
    q, k, v = make_qkv(2, 8, 8, nq=2048, nk=2048, d=d, dtype=dtype, device="cuda")
    doc = packed_doc_ids(2, 2048)
    spec = af.attention(af.document(), af.causal())
    check_forward_on_gpu(spec, q, k, v, doc_ids=doc)
    check_gradients(spec, q, k, v, doc_ids=doc)
    fn = af.compile(spec)
    out, lse = fn(q, k, v, doc_ids=doc, return_lse=True)
    pad = doc < 0
    assert torch.equal(out.transpose(1, 2)[pad], torch.zeros_like(out.transpose(1, 2)[pad]))
    assert torch.isneginf(lse.transpose(1, 2)[pad]).all() and torch.isfinite(lse.transpose(1, 2)[~pad]).all()
    # Tiles whose documents cannot meet are skipped: the forward visits every tile that keeps
    # a pair (it may visit a few more: a tile's documents can meet outside the causal band)
    # and fewer than causal alone would.
    lists = fn.call_tensors(fn.plan(q, k, v), {"doc_ids": doc})
    visited = (lists["full_count"] + lists["partial_count"])[:, 0].sum().item()
    n = doc.shape[1]
    block_m, block_n = n // lists["full_count"].shape[-1], n // lists["full_blocks"].shape[-1]
    keep = (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)
    keep &= torch.ones(n, n, dtype=torch.bool, device=doc.device).tril()
    tiles = keep.view(2, n // block_m, block_m, n // block_n, block_n).any(4).any(2)
    last_query = torch.arange(n // block_m) * block_m + block_m - 1
    causal = 2 * int((last_query // block_n + 1).sum())  # key tiles causal alone visits
    assert tiles.sum().item() <= visited < causal


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
def test_documents_rope_window_gqa_2048(dtype):
    """Documents with RoPE at per-document positions, a window and GQA, forward and backward."""
    q, k, v = make_qkv(2, 8, 2, nq=2048, nk=2048, d=128, dtype=dtype, device="cuda")
    doc = packed_doc_ids(2, 2048, seed=1)
    starts = torch.cat([torch.ones(2, 1, dtype=torch.bool, device="cuda"), doc[:, 1:] != doc[:, :-1]], 1)
    index = torch.arange(2048, device="cuda").expand_as(doc)
    positions = index - torch.cummax(torch.where(starts, index, 0), 1).values
    spec = af.attention(af.rope(theta=500000.0), af.document(), af.sliding_window(512), af.causal())
    data = {"doc_ids": doc, "q_positions": positions, "k_positions": positions}
    check_forward_on_gpu(spec, q, k, v, **data)
    check_gradients(spec, q, k, v, **data)


def test_capture_with_positions_after_a_warm_call_and_a_clear_error_without():
    """Call-time positions are range-checked on the host once per positions tensor: after a
    warm call with that tensor a capture works; a fresh tensor inside a capture is a clear
    ArgumentError, not a CUDA error."""
    from attnfuse.errors import ArgumentError

    fn = af.compile(af.attention(af.rope(), af.causal()))
    q, k, v = qkv(b=1, hq=4, nq=256, d=64)
    positions = torch.arange(256, device="cuda") + 100
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(q, k, v, q_positions=positions, k_positions=positions)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(q, k, v, q_positions=positions, k_positions=positions)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fn(q, k, v, q_positions=positions, k_positions=positions))
    fresh = positions.clone()
    with pytest.raises(ArgumentError, match="CUDA graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            fn(q, k, v, q_positions=fresh, k_positions=fresh)
