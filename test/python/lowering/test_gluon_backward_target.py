"""The Gluon target's fused backward without a GPU: the printed kernel compiles for sm_90 ahead
of time with the installed Triton (HGMMA products, the register cap, a bounded stack), the
schedule goes only where the kernel has the fused-backward shape, and the runtime's choice
follows its rules. Its numbers are checked on the H200 (test/python/test_gpu_gluon_backward.py)."""

from __future__ import annotations

import dataclasses
import functools
import re
import textwrap

import pytest
import torch
from test_gluon_target import _cuobjdump, _registers_and_spills, check_launch_matches_signature

import attnfuse as af
from attnfuse.dialects import make_context
from attnfuse.errors import ArgumentError
from attnfuse.lowering.gluon import GluonUnsupported, emit_gluon_kernel
from attnfuse.runtime import gluon_backward, gluon_forward
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.inputs import Problem
from attnfuse.transforms.warp_specialize import WarpSpecializePass


TILES = TileConfig(64, 64, 4, 2)
"""The tiles the fused backward is lowered with here (the schedule retiles a range kernel)."""

LISTED_TILES = TileConfig(64, 64, 4, 2, dkdv_block_m=128, dkdv_block_n=64)
"""A listed variant's tiles where it takes the Gluon backward (`gluon_backward.GLUON_BACKWARD_TILES`)."""


def backward_kernel(spec, head_dim=128, bwd_dq="fused", explicit_positions=(False, False),
                    config=TILES, name="attention_bwd_dkdv_dq", **options):
    """The dK/dV kernel `name` of `spec`'s fused backward (unordered, or `bwd_dq="ordered"`)
    after `warp-specialize`."""
    rope = af.compile(spec).program.canonical((False, False)).rope is not None
    placement = ("pre_rotated", "pre_rotated") if rope else None
    key = CompileKey(head_dim, head_dim, "bf16", config, placement, explicit_positions,
                     bwd_rope="pre_rotated", bwd_dq=bwd_dq)
    module = lower_spec(spec, key)
    WarpSpecializePass(**options).apply(make_context(), module)
    return next(op for op in module.ops if op.sym_name.data == name)


@pytest.mark.parametrize("name,spec,dim,bwd_dq", [
    ("causal", af.attention(af.causal()), 128, "fused"),
    ("rope-causal", af.attention(af.rope(), af.causal()), 128, "fused"),
    ("window-alibi", af.attention(af.sliding_window(256), af.alibi(), af.causal()), 64, "fused"),
    ("causal-ordered", af.attention(af.causal()), 128, "ordered"),
    ("rope-window-ordered", af.attention(af.rope(), af.sliding_window(256), af.causal()), 128, "ordered"),
    # Pointwise normalizers: no lse or delta descriptors; ReLU carries its refined scores to
    # the gradient step, sigmoid its p^T alone.
    ("relu", af.attention(af.relu()), 128, "ordered"),
    ("sigmoid-causal", af.attention(af.sigmoid(), af.causal()), 64, "fused"),
    ("softcap-relu-causal", af.attention(af.softcap(30.0), af.relu(), af.causal()), 128, "ordered"),
    # RoPE at call-time positions (a Hugging Face model's position_ids): dK turned back at the
    # keys' given positions in the epilogue.
    ("rope-causal-positions", af.attention(af.rope(), af.causal()), 128, "ordered"),
    # Interleaved RoPE: dK's even and odd dims split in registers from a load of whole pairs.
    ("rope-interleaved-causal", af.attention(af.rope(interleaved=True), af.causal()), 128, "fused"),
    ("rope-interleaved-ordered", af.attention(af.rope(interleaved=True), af.causal()), 64, "ordered"),
    # Block lists (documents, block sparsity): each partition walks the lists head by head;
    # ordered, the writers take their turns from the lists' ranks.
    ("document-causal-listed", af.attention(af.document(), af.causal()), 128, "ordered"),
    ("document-listed", af.attention(af.document()), 64, "fused"),
    ("block-sparse-causal-listed", af.attention(af.block_sparse(128), af.causal()), 64, "ordered"),
    # A Hugging Face model trained under torch.compile: padding as documents, RoPE at its
    # position_ids (dK turned back through the staging buffers after the listed walk).
    ("rope-document-causal-listed-positions", af.attention(af.rope(), af.document(), af.causal()), 128, "ordered"),
    # An additive bias: its block loaded beside the step's products; the `-grad` kernels
    # (`attention_bwd_dkdv_dq_bias`) also store dS as the bias gradient in the gradient step.
    ("bias-causal", af.attention(af.additive_bias(), af.causal()), 128, "ordered"),
    ("bias-causal-grad", af.attention(af.additive_bias(), af.causal()), 128, "fused"),
    ("rope-bias-alibi-grad", af.attention(af.rope(), af.additive_bias(), af.alibi()), 64, "ordered"),
    ("softcap-bias-causal-grad", af.attention(af.softcap(30.0), af.additive_bias(), af.causal()), 128, "ordered"),
    ("document-bias-causal-listed-grad", af.attention(af.document(), af.additive_bias(), af.causal()), 128, "ordered"),
])
def test_printed_backward_compiles_for_sm90(sm90, name, spec, dim, bwd_dq, monkeypatch):
    check_compiles_for_sm90(name, spec, dim, bwd_dq, monkeypatch)


@pytest.mark.parametrize("name,bwd_dq", [("fire-causal", "ordered"), ("chunked-24", "fused"),
                                         ("sink-window", "ordered")])
def test_index_tiles_compile_for_sm90(sm90, index_tile_blocks, name, bwd_dq, monkeypatch):
    """Blocks outside the package that read index tiles (`tile.pair_position`,
    `tile.query_head`: FIRE's bias, chunked attention, sinks with a window) in the Gluon
    backward: the tiles are built in the step from its rows, positions and head."""
    # FIRE's map (a log of the distance over a log of the position, three index values) costs
    # stack: 464 bytes with Triton 3.9, 496 with 3.6.
    check_compiles_for_sm90(name, index_tile_blocks[name](), 128, bwd_dq, monkeypatch,
                            stack=640 if name.startswith("fire") else 256)


def check_compiles_for_sm90(name, spec, dim, bwd_dq, monkeypatch, stack=256):
    """`spec`'s fused backward (`-grad` in `name`: its bias-gradient kernel) compiled for sm_90:
    warpgroup MMAs, TMA reduces for dQ, the order's atomics only where asked, bounded stack."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    explicit = (True, True) if name.endswith("-positions") else (False, False)
    listed = "-listed" in name
    kernel_name = "attention_bwd_dkdv_dq_bias" if name.endswith("-grad") else "attention_bwd_dkdv_dq"
    kernel = backward_kernel(spec, dim, bwd_dq, explicit, LISTED_TILES if listed else TILES, kernel_name)
    assert kernel.schedule is not None, "warp-specialize schedules the fused backward"
    program = emit_gluon_kernel(kernel)
    info = program.kernels[0]
    assert ("k_positions_rows = tl.load(" in program.source) == any(explicit)
    module = gluon_forward._gluon_module(program.source)
    n, heads, heads_kv = 256, 4, 2
    q = torch.empty(1, n, heads, dim, dtype=torch.bfloat16).transpose(1, 2)  # a model's layout
    kv = torch.empty(1, heads_kv, n, dim, dtype=torch.bfloat16)
    acc = torch.empty(1, heads, n, dim)
    rows_flat = torch.empty(heads * n)

    def desc(t, rows, dtype=gl.bfloat16):
        block = [1, 1, rows, dim]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block, gl.NVMMASharedLayout.get_default_for(block, dtype))

    row_layout = gl.NVMMASharedLayout.get_default_for([info.block_n], gl.float32)
    row_stats = [role for role in ("lse", "delta") if role in info.roles]
    softmax = af.compile(spec).program.canonical((False, False)).normalizer_name == "softmax"
    assert bool(row_stats) == softmax, "lse and delta exactly where the softmax reads them"
    descs = [desc(q, info.block_n), desc(kv, info.block_m), desc(kv, info.block_m), desc(q, info.block_n),
             desc(kv, info.block_m), desc(kv, info.block_m), desc(acc, info.block_n, gl.float32),
             *(TensorDescriptor(rows_flat, [heads * n], [1], [info.block_n], row_layout) for _ in row_stats)]
    pointers: list[object] = []
    for role in info.roles:
        if role in (*info.operands, "dv", "dq_acc", "lse", "delta"):
            continue
        if role == "dk":
            pointers += [kv, *kv.stride()]
        elif role == "rope_table":
            table = torch.empty(2, n, dim // 2)
            pointers += [table, *table.stride()]
        elif role == "dq_order":
            counters = torch.empty(1, heads, n, dtype=torch.int32)
            pointers += [counters, *counters.stride()]
        elif role in ("q_positions", "k_positions"):
            positions = torch.empty(1, n, dtype=torch.int64)
            pointers += [positions, *positions.stride()]
        elif role == "doc_ids":
            ids = torch.empty(1, n, dtype=torch.int32)
            pointers += [ids, *ids.stride()]
        elif role.endswith(("_blocks", "_rank")):
            lists = torch.empty(1, heads, n // info.block_m, n // info.block_n, dtype=torch.int32)
            pointers += [lists, *lists.stride()]
        elif role.endswith("_count"):
            counts = torch.empty(1, heads, n // info.block_m, dtype=torch.int32)
            pointers += [counts, *counts.stride()]
        elif role == "bias":
            bias = torch.empty(1, heads, n, n, dtype=torch.bfloat16).expand(2, heads, n, n)  # batch stride 0
            pointers += [bias, *bias.stride()]
        elif role == "dbias":
            dbias = torch.empty(1, heads, n, n)
            pointers += [dbias, *dbias.stride()]
        else:
            pointers.append(torch.empty(heads))
    assert ("dbias" in info.roles) == name.endswith("-grad")
    compiled = getattr(module, kernel_name).warmup(*descs, *pointers, 0.1, n, n, heads_kv, heads // heads_kv,
                                                   grid=(1,), num_warps=8)
    registers, spills = _registers_and_spills(compiled.asm["cubin"])
    assert registers <= 255
    sass = _cuobjdump(compiled.asm["cubin"], "-sass")
    assert "HGMMA" in sass, "the products must be warpgroup MMAs"
    assert "UTMAREDG.4D.ADD" in sass, "dQ is added by TMA reduces"
    atomics = set(re.findall(r"\b(?:ATOMG?|REDG?)\.\S+", sass))
    if bwd_dq == "ordered":
        # The counters' handover (an exchange, a release at GPU scope) after the reduce's
        # writes are done (the full wait, not only store_wait's read wait), and no float atomics.
        assert atomics == {"ATOMG.E.EXCH.STRONG.GPU"}, atomics
        assert ("rank = tl.load(" in program.source) == listed, "list entries take their turns from the ranks"
        # One handover per writer partition: two writers, each owning a staging buffer.
        assert kernel.int_attr("dq_writers") == 2
        assert len(re.findall(r"\bATOMG\.E\.EXCH\.STRONG\.GPU\b", sass)) == 2
        assert "cp.async.bulk.wait_group 0;" in compiled.asm["ptx"]
        assert "ld.global.gpu.acquire" in compiled.asm["ptx"], "the wait acquires"
    else:
        assert not atomics, f"and not by atomics: {atomics}"
    # A few dozen bytes of stack come and go with Triton versions (24-96 seen with 3.6 and
    # 3.9 for the causal kernels); a consumer out of registers spills kilobytes.
    # The bias gradient's store (`-grad`: a 64-bit address per element of the gradient tile,
    # in the gradient step) costs more: 152-296 bytes with 3.6, 264-520 with 3.9.
    assert spills <= (640 if name.endswith("-grad") else stack), f"{spills} bytes of stack"


def test_warp_specialize_schedules_the_fused_backward_only():
    kernel = backward_kernel(af.attention(af.causal()))
    assert (kernel.get("block_m"), kernel.get("block_n"), kernel.get("num_warps")) == (128, 64, 8)
    assert kernel.int_attr("producer_warps") == 1 and kernel.int_attr("consumer_registers") is None
    assert backward_kernel(af.attention(af.causal()), backward=False).schedule is None


@pytest.mark.parametrize("bwd_dq", ["fused", "ordered"])
def test_warp_specialize_keeps_a_listed_backward_on_its_own_tiles(bwd_dq):
    """Block lists are built per call for the kernel's tiles: the schedule takes a listed
    backward only where they are its own (128 keys, 64 queries) and never changes them."""
    spec = af.attention(af.document(), af.causal())
    kernel = backward_kernel(spec, 128, bwd_dq, config=LISTED_TILES)
    assert kernel.schedule is not None
    assert (kernel.get("block_m"), kernel.get("block_n")) == (128, 64)
    other = backward_kernel(spec, 128, bwd_dq, config=TileConfig(64, 64, 4, 2, dkdv_block_m=64, dkdv_block_n=64))
    assert other.schedule is None and (other.get("block_m"), other.get("block_n")) == (64, 64)


def test_unscheduled_backward_is_refused_with_the_reason():
    kernel = backward_kernel(af.attention(af.causal()), backward=False)
    with pytest.raises(GluonUnsupported, match="warp-specialize"):
        emit_gluon_kernel(kernel)


def problem(n=4096, d=128, dtype=torch.bfloat16, device="cpu"):
    return Problem(batch=1, heads_q=32, heads_kv=8, seq_q=n, seq_k=n, head_dim=d, head_dim_v=d,
                   dtype=dtype, device=torch.device(device))


def test_cpu_problems_never_take_the_gluon_backward(monkeypatch):
    monkeypatch.setenv("ATTNFUSE_BACKWARD_TARGET", "gluon")
    variant = af.compile(af.attention(af.causal())).program.canonical((False, False))
    assert not gluon_backward.takes_gluon_backward(problem(), variant)


def test_backward_target_is_checked(monkeypatch):
    monkeypatch.setenv("ATTNFUSE_BACKWARD_TARGET", "tpu")
    with pytest.raises(ArgumentError, match="ATTNFUSE_BACKWARD_TARGET"):
        gluon_backward.backward_target()


@pytest.mark.parametrize("spec,fits", [
    (af.attention(af.causal()), True),
    (af.attention(af.rope(), af.causal()), True),
    (af.attention(af.rope(interleaved=True), af.causal()), True),
    (af.attention(af.rope(rotary_dim=64), af.causal()), False),  # its loops read q and k by parts
    (af.attention(af.additive_bias()), True),
    (af.attention(af.relu()), True),
    (af.attention(af.sigmoid(), af.causal()), True),
    (af.attention(af.softcap(30.0), af.relu(), af.causal()), True),
    (af.attention(af.rope(), af.relu(), af.causal()), False),  # ReLU rotates in its backward loops
    (af.attention(af.rope(), af.sigmoid(), af.causal()), True),
    # Block lists: documents, and block layouts whose blocks hold whole 128-key tiles.
    (af.attention(af.document(), af.causal()), True),
    (af.attention(af.block_sparse(256)), True),
    (af.attention(af.block_sparse(64), af.causal()), False),
    (af.attention(af.document(), af.additive_bias()), True),
])
def test_variants_the_schedule_takes(spec, fits):
    variant = af.compile(spec).program.canonical((False, False))
    assert gluon_backward.variant_fits(variant) == fits


def test_a_rotary_width_of_the_whole_head_is_rope_over_the_whole_head(monkeypatch):
    """`rope(rotary_dim=D)` at head dim D rotates the whole head, as `rope()` does: its fused
    backward is scheduled, and `auto` takes the Gluon backward for it as for `rope()`; at
    another head dim the width is partial and keeps the split."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD", raising=False)
    monkeypatch.delenv("ATTNFUSE_BACKWARD_TARGET", raising=False)
    whole = af.compile(af.attention(af.rope(rotary_dim=128), af.causal())).program.canonical((False, False))
    assert gluon_backward.variant_fits(whole, 128) and not gluon_backward.variant_fits(whole, 256)
    assert gluon_backward.takes_gluon_backward(problem(8192), whole)
    assert not gluon_backward.takes_gluon_backward(problem(8192, d=64), whole)
    key = CompileKey(128, 128, "bf16", TILES, ("pre_rotated", "pre_rotated"), bwd_rope="pre_rotated", bwd_dq="fused")
    assert gluon_backward.scheduled_backward(lower_spec(af.attention(af.rope(rotary_dim=128), af.causal()), key))


def test_partial_rotary_width_is_not_scheduled():
    """A kernel the printer cannot print is not scheduled: under a partial rotary width the
    loops read q and k by parts (three products), where the schedule reads them whole."""
    key = CompileKey(128, 128, "bf16", TileConfig(64, 64, 4, 2), ("pre_rotated", "pre_rotated"),
                     bwd_rope="pre_rotated", bwd_dq="fused")
    module = lower_spec(af.attention(af.rope(rotary_dim=64), af.causal()), key)
    WarpSpecializePass().apply(make_context(), module)
    kernel = next(op for op in module.ops if op.sym_name.data == "attention_bwd_dkdv_dq")
    assert kernel.schedule is None
    with pytest.raises(GluonUnsupported, match="loaded whole"):
        emit_gluon_kernel(kernel)


def test_rotation_needs_staging_rows_for_every_key():
    """dK's halves go through the two dQ staging buffers: with fewer rows than keys the
    printer refuses instead of writing past them."""
    from xdsl.dialects.builtin import IntegerAttr, i64

    kernel = backward_kernel(af.attention(af.rope(), af.causal()))
    kernel.attributes["block_n"] = IntegerAttr(32, i64)
    with pytest.raises(GluonUnsupported, match="fewer than block_m"):
        emit_gluon_kernel(kernel)


def test_bwd_block_n_is_checked():
    from attnfuse.errors import PassOptionError

    with pytest.raises(PassOptionError, match="bwd-block-n must be 64"):
        WarpSpecializePass(bwd_block_n=128)


def test_calls_the_schedule_cannot_take_keep_the_split(monkeypatch):
    """On a (pretended) Hopper GPU: RoPE rotated in the backward's loops (an explicit
    placement) keeps the split rather than the slower portable fused kernel, while RoPE at
    call-time positions takes the Gluon backward as at the default ones; a sliding window
    counts the pairs its band keeps."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    rope = af.compile(af.attention(af.rope(), af.causal())).program
    p = problem(8192)
    assert gluon_backward.takes_gluon_backward(p, rope.canonical((False, False)))
    for explicit in ((True, True), (False, True), (True, False)):
        assert gluon_backward.takes_gluon_backward(p, rope.canonical(explicit))
    assert not gluon_backward.takes_gluon_backward(p, rope.canonical((False, False)), bwd_rope="as_forward")
    window = af.compile(af.attention(af.sliding_window(256), af.causal())).program.canonical((False, False))
    assert gluon_backward.pairs_per_head(p, window) == 8192 * 256
    assert not gluon_backward.takes_gluon_backward(p, window)
    dense = af.compile(af.attention()).program.canonical((False, False))
    assert gluon_backward.takes_gluon_backward(problem(4096), dense)
    # Head dim 128 from 4M pairs (`GLUON_BACKWARD_MIN_WORK`): dense 2048 (4.2M), causal 3072
    # (4.7M) and causal 4093 (8.38M, under the 8M it took before) take it; causal 2048 (2.1M)
    # and dense 1024 keep the split.
    assert gluon_backward.takes_gluon_backward(problem(2048), dense)
    assert not gluon_backward.takes_gluon_backward(problem(1024), dense)
    causal = af.compile(af.attention(af.causal())).program.canonical((False, False))
    assert gluon_backward.takes_gluon_backward(problem(3072), causal)
    assert gluon_backward.takes_gluon_backward(problem(4093), causal, ordered=True)
    assert not gluon_backward.takes_gluon_backward(problem(2048), causal)


def test_the_lowered_kernel_decides_not_the_prediction(monkeypatch):
    """On a (pretended) Hopper GPU where `variant_fits` predicts wrongly (patched to say yes
    to everything): `auto` builds the fused backward only where the lowered kernel is one the
    Gluon target schedules, and keeps the split elsewhere (a partial rotary width: loops that
    read q and k by parts, which the schedule has no place for)."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.setattr(gluon_backward, "variant_fits", lambda variant, head_dim=None: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD", raising=False)
    p = problem(8192)
    causal = af.compile(af.attention(af.causal()), deterministic=False)
    assert causal.compile_key(p).bwd_dq == "fused"
    partial = af.compile(af.attention(af.rope(rotary_dim=64), af.causal()), deterministic=False)
    assert partial.compile_key(p).bwd_dq == "separate"
    monkeypatch.setenv("ATTNFUSE_BACKWARD", "fused")
    assert partial.compile_key(p).bwd_dq == "fused", "a forced fused backward is the user's choice"


def test_deterministic_calls_take_the_ordered_gluon_backward_from_the_measured_size(monkeypatch):
    """On a (pretended) Hopper GPU under `auto`: a deterministic call (the default) takes the
    fused backward with its adds in key-block order at head dims 128 and 64 from the measured
    size, a `deterministic=False` one the unordered kernel; below the size (and at a head dim
    not measured) a deterministic call keeps the split; deterministic algorithms order the adds
    of a `deterministic=False` call."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD", raising=False)
    spec = af.attention(af.causal())
    deterministic, free = af.compile(spec), af.compile(spec, deterministic=False)
    assert deterministic.compile_key(problem(4096)).bwd_dq == "ordered"
    assert free.compile_key(problem(4096)).bwd_dq == "fused"
    assert deterministic.compile_key(problem(2048)).bwd_dq == "separate"
    assert deterministic.compile_key(problem(8192, d=64, dtype=torch.float16)).bwd_dq == "ordered"
    assert free.compile_key(problem(8192, d=64, dtype=torch.float16)).bwd_dq == "fused"
    assert deterministic.compile_key(problem(4096, d=64, dtype=torch.float16)).bwd_dq == "separate"
    assert free.compile_key(problem(4096, d=64, dtype=torch.float16)).bwd_dq == "separate"
    assert deterministic.compile_key(problem(8192, d=256)).bwd_dq == "separate"
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert free.compile_key(problem(4096)).bwd_dq == "ordered"
    finally:
        torch.use_deterministic_algorithms(previous)


def unaligned(n_q=2043, n_k=16384, d=128):
    """A problem whose query rows (`Nq`) are not a multiple of 4: read in place, the flat lse /
    delta rows of head 1 on would start off the 16 bytes a TMA copy needs
    (`gluon_backward.ROW_ALIGNMENT`; the launch pads them, `padded_rows`)."""
    return Problem(batch=1, heads_q=32, heads_kv=8, seq_q=n_q, seq_k=n_k, head_dim=d, head_dim_v=d,
                   dtype=torch.bfloat16, device=torch.device("cpu"))


@pytest.mark.parametrize("n_q", [2043, 4094, 8191])
def test_rows_off_16_bytes_take_the_gluon_backward_as_aligned_rows_do(n_q, monkeypatch):
    """On a (pretended) Hopper GPU: an Nq off a multiple of 4 decides the Gluon backward as the
    multiple below it does (its rows are padded at the launch), softmax and pointwise,
    ordered and unordered, under `auto` and when the user asks for it."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD", raising=False)
    causal = af.compile(af.attention(af.causal())).program.canonical((False, False))
    relu = af.compile(af.attention(af.relu(), af.causal())).program.canonical((False, False))
    for variant in (causal, relu):
        for ordered in (False, True):
            assert gluon_backward.takes_gluon_backward(unaligned(n_q), variant, ordered=ordered)
            assert gluon_backward.takes_gluon_backward(unaligned(n_q - n_q % 4), variant, ordered=ordered)
    monkeypatch.setenv("ATTNFUSE_BACKWARD_TARGET", "gluon")
    assert gluon_backward.takes_gluon_backward(unaligned(n_q), causal)
    monkeypatch.delenv("ATTNFUSE_BACKWARD_TARGET")
    for deterministic, fused in ((True, "ordered"), (False, "fused")):
        call = af.compile(af.attention(af.causal()), deterministic=deterministic)
        assert call.compile_key(unaligned(n_q)).bwd_dq == fused


def test_flat_rows_past_int32_keep_the_portable_backward():
    """The kernel's flat lse / delta index is an int32: B * Hq * Nq' (Nq padded to a multiple
    of 4) must stay under 2^31."""
    fits = Problem(batch=16383, heads_q=32, heads_kv=8, seq_q=4096, seq_k=4096, head_dim=128,
                   head_dim_v=128, dtype=torch.bfloat16, device=torch.device("cpu"))
    assert gluon_backward.rows_addressable(fits)
    assert not gluon_backward.rows_addressable(dataclasses.replace(fits, batch=16384))
    # 16383 * 32 * 4096 rows fit; at Nq = 4093 the padded rows are the same count.
    assert gluon_backward.rows_addressable(dataclasses.replace(fits, seq_q=4093))
    # 16384 * 32 * 4093 rows (2,145,910,784) would fit an int32, padded to 4096 they do not.
    assert not gluon_backward.rows_addressable(dataclasses.replace(fits, batch=16384, seq_q=4093))


def test_a_forced_fused_backward_at_unaligned_rows_takes_the_gluon_kernel(monkeypatch):
    """`ATTNFUSE_BACKWARD=fused` builds the fused backward whatever the target; at Nq = 2043 as
    at 2040, `gluon_backward` replaces its portable kernel with the Gluon one."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.setattr(gluon_backward, "_gluon_module", lambda source: type("M", (), {"attention_bwd_dkdv_dq": None}))
    spec = af.attention(af.causal())
    portable = type("Launch", (), {"info": type("Info", (), {"name": gluon_backward.KERNEL})()})()
    module = functools.partial(backward_kernel_module, spec)
    variant = af.compile(spec).program.canonical((False, False))
    for n_q in (2043, 2040):
        taken = gluon_backward.gluon_backward([portable], unaligned(n_q), 0.1, module, variant)
        assert isinstance(taken[0], gluon_backward.GluonBackwardLaunch)


@pytest.mark.parametrize("n_q", [5, 6, 7, 8])
def test_padded_rows_copy_lse_and_delta_into_zeroed_multiples_of_four(n_q):
    """`GluonBackwardLaunch.padded_rows`: at an Nq off a multiple of 4, the call's lse and delta
    (any strides) land in new `[B * Hq, Nq']` buffers (Nq' = 8 here), each head's rows first
    and the padding 0, fresh for every call (calls on two streams never share them); at a
    multiple of 4 nothing is copied (the kernel reads the rows in place), nor under a
    pointwise normalizer (no row statistics)."""
    b, hq = 2, 3
    problem = Problem(batch=b, heads_q=hq, heads_kv=1, seq_q=n_q, seq_k=64, head_dim=128, head_dim_v=128,
                      dtype=torch.bfloat16, device=torch.device("cpu"))
    launch = type("Kernel", (), {"roles": ("q", "k", "v", "do", "lse", "delta", "dk", "dv", "dq_acc")})()
    gluon = gluon_backward.GluonBackwardLaunch(None, None, launch, problem, 0.1)
    earlier = []
    for call in range(2):
        gen = torch.Generator().manual_seed(call)
        tensors = {role: torch.randn(b, hq, n_q, generator=gen) for role in ("lse", "delta")}
        # The call's delta in another memory order (heads outermost): the copy follows strides.
        tensors["delta"] = tensors["delta"].transpose(0, 1).contiguous().transpose(0, 1)
        rows = gluon.padded_rows(tensors)
        assert gluon.allocates == (n_q % 4 != 0)
        if n_q % 4 == 0:
            assert rows == []
            continue
        assert [t.shape for t in rows] == [(b * hq, 8)] * 2
        assert not any(t is u for t in rows for u in earlier)
        earlier = rows
        for buffer, role in zip(rows, ("lse", "delta")):
            assert torch.equal(buffer[:, :n_q], tensors[role].reshape(b * hq, n_q))
            assert torch.equal(buffer[:, n_q:], torch.zeros(b * hq, 8 - n_q))
            # Head h's rows start at h * 8 in the flat copy the kernel's descriptor covers.
            assert torch.equal(buffer.flatten()[8 : 8 + n_q], tensors[role][0, 1])
    pointwise = type("Kernel", (), {"roles": ("q", "k", "v", "do", "dk", "dv", "dq_acc")})()
    rowless = gluon_backward.GluonBackwardLaunch(None, None, pointwise, problem, 0.1)
    assert rowless.padded_rows({}) == [] and not rowless.allocates


def backward_kernel_module(spec, head_dim=128):
    """The tile module of `spec`'s unordered fused backward (before `warp-specialize`)."""
    key = CompileKey(head_dim, head_dim, "bf16", TileConfig(64, 64, 4, 2), None, bwd_rope="pre_rotated",
                     bwd_dq="fused")
    return lower_spec(spec, key)


@pytest.mark.parametrize("normalizer", [af.relu, af.sigmoid])
def test_pointwise_normalizers_take_the_gluon_backward_from_their_measured_size(normalizer, monkeypatch):
    """On a (pretended) Hopper GPU under `auto`: a pointwise normalizer's training call takes
    the Gluon backward (ordered by default) from `GLUON_POINTWISE_MIN_WORK`, which at head dim 64
    is below the softmax's (causal 4096 takes it there, the softmax keeps the split), and keeps
    the split below it."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD", raising=False)
    pointwise = af.compile(af.attention(normalizer(), af.causal()))
    softmax = af.compile(af.attention(af.causal()))
    paper = problem(4096, d=64, dtype=torch.float16)
    assert pointwise.compile_key(paper).bwd_dq == "ordered"
    assert softmax.compile_key(paper).bwd_dq == "separate"
    assert pointwise.compile_key(problem(4096)).bwd_dq == "ordered"
    assert af.compile(af.attention(normalizer(), af.causal()), deterministic=False).compile_key(
        problem(4096)).bwd_dq == "fused"
    assert pointwise.compile_key(problem(2048)).bwd_dq == "separate"
    assert gluon_backward.pairs_per_head(problem(4096), pointwise.program.canonical((False, False))) \
        >= gluon_backward.GLUON_POINTWISE_MIN_WORK[128] > gluon_backward.pairs_per_head(
            problem(2048), pointwise.program.canonical((False, False)))


def test_ops_of_block_modules_keep_the_portable_backward_under_auto(monkeypatch):
    """An op of a block module outside the package (the additive `score_offset`) is measured by
    nobody: on a (pretended) Hopper GPU `auto` keeps the portable backward at a size where the
    built-in variant takes the Gluon one; forcing the Gluon target takes it."""
    from blocks import score_offset_block

    from attnfuse.blocks import register_block_module, unregister_block_module

    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD_TARGET", raising=False)
    register_block_module(score_offset_block)
    try:
        outside = af.compile(af.attention(score_offset_block.score_offset(0.5), af.causal())).program
        builtin = af.compile(af.attention(af.causal())).program
        p = problem(8192)
        assert outside.canonical((False, False)).outside_ops == ("attn.score_offset",)
        assert gluon_backward.takes_gluon_backward(p, builtin.canonical((False, False)))
        assert not gluon_backward.takes_gluon_backward(p, outside.canonical((False, False)))
        # A fused backward chosen by ATTNFUSE_BACKWARD (not by auto's rule) keeps the portable
        # kernel too: the launch replacement asks no lowering of it.
        from types import SimpleNamespace

        launches = [SimpleNamespace(info=SimpleNamespace(name=gluon_backward.KERNEL))]
        lowered = []
        lower = lambda: lowered.append(1)  # noqa: E731 (the replacement lowers only where it may swap)
        monkeypatch.setattr(gluon_backward, "fits", lambda problem: True)
        monkeypatch.setattr(gluon_backward, "scheduled_backward", lambda module: None)
        assert gluon_backward.gluon_backward(launches, p, 0.1, lower, outside.canonical((False, False))) == launches
        assert not lowered
        gluon_backward.gluon_backward(launches, p, 0.1, lower, builtin.canonical((False, False)))
        assert lowered, "a built-in variant's fused backward is lowered for the Gluon target"
        monkeypatch.setenv("ATTNFUSE_BACKWARD_TARGET", "gluon")
        assert gluon_backward.takes_gluon_backward(p, outside.canonical((False, False)))
    finally:
        unregister_block_module(score_offset_block)


@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "unordered"])
def test_listed_calls_take_the_gluon_backward_on_its_tiles(deterministic, monkeypatch):
    """On a (pretended) Hopper GPU: under `auto` a deterministic document call keeps the split
    backward (`GLUON_LISTED_ORDERED_MIN_WORK` is empty) on its own tiles, and an unordered one
    takes the Gluon kernel from `GLUON_LISTED_MIN_WORK`'s size; with the Gluon target
    asked for, it builds the fused backward for the Gluon kernel (ordered where deterministic),
    its dK/dV lists on the schedule's tiles (`GLUON_BACKWARD_TILES`), which `warp-specialize`
    then takes. A split backward forced by `ATTNFUSE_BACKWARD=separate` keeps its own tiles, and
    a block layout of 64 (smaller than the schedule's key tile) keeps the split."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD", raising=False)
    fn = af.compile(af.attention(af.document(), af.causal()), deterministic=deterministic)
    own_tiles = fn.tile_config(problem(8192)).dkdv()[:2]
    assert own_tiles != gluon_backward.GLUON_BACKWARD_TILES
    if deterministic:
        auto = fn.compile_key(problem(8192))
        assert auto.bwd_dq == "separate" and auto.config.dkdv()[:2] == own_tiles
    else:
        auto = fn.compile_key(problem(8192))
        assert auto.bwd_dq == "fused" and auto.config.dkdv()[:2] == gluon_backward.GLUON_BACKWARD_TILES
        shorter = fn.compile_key(problem(4096))
        assert shorter.bwd_dq == "separate" and shorter.config.dkdv()[:2] == own_tiles
        sparse = af.compile(af.attention(af.block_sparse(128), af.causal()), deterministic=False)
        assert sparse.compile_key(problem(8192)).bwd_dq == "separate", "block layouts are not measured"
    monkeypatch.setenv("ATTNFUSE_BACKWARD_TARGET", "gluon")
    fn = af.compile(af.attention(af.document(), af.causal()), deterministic=deterministic)
    key = fn.compile_key(problem(8192))
    assert key.bwd_dq == ("ordered" if deterministic else "fused")
    assert key.config.dkdv()[:2] == gluon_backward.GLUON_BACKWARD_TILES
    monkeypatch.setenv("ATTNFUSE_BACKWARD", "separate")
    fn = af.compile(af.attention(af.document(), af.causal()), deterministic=deterministic)
    split = fn.compile_key(problem(8192))
    assert split.bwd_dq == "separate" and split.config.dkdv()[:2] == own_tiles
    monkeypatch.delenv("ATTNFUSE_BACKWARD")
    small = af.compile(af.attention(af.block_sparse(64), af.causal()), deterministic=deterministic)
    assert small.compile_key(problem(8192)).bwd_dq == "separate"


@pytest.mark.parametrize("spec,bwd_dq", [
    (af.attention(af.causal()), "fused"),
    (af.attention(af.relu(), af.causal()), "fused"),
    (af.attention(af.sigmoid()), "ordered"),
    (af.attention(af.rope(), af.causal()), "ordered"),
    (af.attention(af.document(), af.causal()), "ordered"),
    (af.attention(af.block_sparse(128)), "fused"),
    (af.attention(af.additive_bias(), af.causal()), "ordered"),
    (af.attention(af.additive_bias(), af.alibi()), "fused-grad"),
])
def test_launch_passes_the_printed_kernels_parameters(spec, bwd_dq):
    """`GluonBackwardLaunch` hands the printed entry kernel its parameters in their order: the
    descriptors (lse and delta only where the kernel reads them: not under a pointwise
    normalizer), then each other role's pointer and strides, then the scalars (CPU tensors, the
    launch itself stood in for)."""
    listed = af.compile(spec).program.canonical((False, False)).listed
    bwd_dq, _, grad = bwd_dq.partition("-")  # `-grad`: the kernel that stores the bias gradient
    name = "attention_bwd_dkdv_dq_bias" if grad else "attention_bwd_dkdv_dq"
    program = emit_gluon_kernel(backward_kernel(spec, 128, bwd_dq, config=LISTED_TILES if listed else TILES, name=name))
    info = program.kernels[0]
    b, hq, hkv, n, d = 1, 4, 2, 256, 128
    made = {"q": (hq, torch.bfloat16), "q_rot": (hq, torch.bfloat16), "do": (hq, torch.bfloat16),
            "dq_acc": (hq, torch.float32), "k": (hkv, torch.bfloat16), "k_rot": (hkv, torch.bfloat16),
            "v": (hkv, torch.bfloat16), "dk": (hkv, torch.bfloat16), "dv": (hkv, torch.bfloat16)}
    tensors = {role: torch.zeros(b, heads, n, d, dtype=dtype) for role, (heads, dtype) in made.items()}
    tensors |= {"lse": torch.zeros(b * hq * n), "delta": torch.zeros(b * hq * n),
                "dq_order": torch.zeros(b, hq, n, dtype=torch.int32), "rope_table": torch.zeros(2, n, d // 2),
                "doc_ids": torch.zeros(b, n, dtype=torch.int32), "slopes": torch.zeros(hq),
                "bias": torch.zeros(1, 1, n, n, dtype=torch.bfloat16).expand(b, hq, n, n),
                "dbias": torch.zeros(b, hq, n, n)}
    for kind in ("full", "partial"):
        for what in ("blocks", "rank"):
            tensors[f"{kind}_q_{what}"] = torch.zeros(b, hq, n // 128, n // 64, dtype=torch.int32)
        tensors[f"{kind}_q_count"] = torch.zeros(b, hq, n // 128, dtype=torch.int32)
    p = Problem(batch=b, heads_q=hq, heads_kv=hkv, seq_q=n, seq_k=n, head_dim=d, head_dim_v=d,
                dtype=torch.bfloat16, device=torch.device("cpu"))
    launch = gluon_backward.GluonBackwardLaunch(None, None, info, p, 0.1)
    runtime = check_launch_matches_signature(launch, tensors, program.source, info.name)
    softmax = af.compile(spec).program.canonical((False, False)).normalizer_name == "softmax"
    assert ("lse_desc" in runtime) == ("lse" in info.roles) == softmax
    assert ("dbias_ptr" in runtime) == bool(grad)


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "at-the-step"])
def test_the_listed_walk_takes_every_entry_of_every_heads_lists_once_from_the_last_down(ahead):
    """The printed walk of a listed backward (`GluonBackwardEmitter.walk`: the loader and the
    writers read each step's entries a step ahead, the consumer at the step), executed as
    Python over lists in a flat memory where only the counted entries (and the counts) of the
    program's key block may be read: every head of the group in turn, its full list's entries
    from the last down, then its partial list's, each step's block and rank from the same
    entry, `it` counting every step; the entry kernel's count of steps is the same. The
    printed kernel's partitions run exactly these walks."""
    from types import SimpleNamespace

    from attnfuse.lowering.gluon_backward import GluonBackwardEmitter

    kernel = backward_kernel(af.attention(af.document(), af.causal()), 128, "ordered", config=LISTED_TILES)
    emitter = GluonBackwardEmitter(kernel)
    group, entries, key_blocks, block_id, block_n = 4, 6, 3, 1, 64
    counts = {"full": [3, 0, 0, 2], "partial": [2, 1, 0, 0]}  # key block 1's; the others' all full
    memory: list[int] = []
    readable: set[int] = set()
    scope: dict[str, object] = {"batch": 0, "kv_head": 0, "group_size": group, "block_id": block_id,
                                "BLOCK_N": block_n}
    for kind in ("full", "partial"):
        role = f"{kind}_q_count"
        scope[f"{role}_ptr"] = len(memory)
        scope.update({f"stride_{role}_b": group * key_blocks, f"stride_{role}_h": key_blocks, f"stride_{role}_n": 1})
        for h in range(group):
            for b in range(key_blocks):
                readable |= {len(memory)} if b == block_id else set()
                memory.append(counts[kind][h] if b == block_id else entries)
        for what in ("blocks", "rank"):
            role = f"{kind}_q_{what}"
            scope[f"{role}_ptr"] = len(memory)
            scope.update({f"stride_{role}_b": group * key_blocks * entries, f"stride_{role}_h": key_blocks * entries,
                          f"stride_{role}_n": entries, f"stride_{role}_d": 1})
            # Entry e of head h, key block b: 1000 b + 10 h + e (full) or + 50 (partial); ranks + 100.
            for h in range(group):
                for b in range(key_blocks):
                    for e in range(entries):
                        if b == block_id and e < counts[kind][h]:
                            readable.add(len(memory))
                        memory.append(1000 * b + (0 if kind == "full" else 50) + (100 if what == "rank" else 0)
                                      + 10 * h + e)

    def load(address):
        assert address in readable, f"read outside the program's counted entries: {address}"
        return memory[address]

    scope["tl"] = SimpleNamespace(load=load)
    scope["visits"] = visits = []
    body = ["visits.append((it, head, start_m, rank))"]
    walk = emitter.walk(body, ranked=True, ahead=ahead)
    exec("\n".join(walk), scope)  # noqa: S102 - the printer's own output
    want = []
    for h in range(group):
        for kind, offset in (("full", 0), ("partial", 50)):
            want += [(h, (1000 * block_id + offset + 10 * h + e) * block_n, 1100 + offset + 10 * h + e)
                     for e in reversed(range(counts[kind][h]))]
    assert visits == [(i, *v) for i, v in enumerate(want)]
    # The printed partitions walk this way: the loader and the writers ahead (the writers
    # ranked), the consumer at the step; the entry kernel counts the same steps.
    source = emit_gluon_kernel(kernel).source

    def function(name):
        return source.split(f"def {name}(", 1)[1].split("@gluon.jit", 1)[0]

    def printed(lines, indent):
        return "\n".join(" " * indent + line for line in lines[:lines.index("    for step in range(n_steps):") + 1])

    name = kernel.sym_name.data
    assert printed(emitter.walk([], ranked=False, ahead=True), 4) in function(f"{name}_load")
    assert printed(emitter.walk([], ranked=True, ahead=True), 4) in function(f"{name}_dq_write")
    assert printed(emitter.walk([], ranked=False, ahead=False), 4) in function(f"{name}_consume")
    entry = function(name).split("total = 0\n", 1)[1].split("# Buffers", 1)[0]
    counted = dict(scope, total=0)
    exec(textwrap.dedent(entry), counted)  # noqa: S102
    assert counted["total"] == len(want)


def test_interleaved_rope_takes_the_gluon_backward_as_rope_by_halves_does(monkeypatch):
    """Interleaved RoPE (its epilogue's split run on an H100 in stop 46) follows the same
    measured rule as RoPE by halves under `auto`."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD", raising=False)
    monkeypatch.delenv("ATTNFUSE_BACKWARD_TARGET", raising=False)
    interleaved = af.compile(af.attention(af.rope(interleaved=True), af.causal())).program.canonical((False, False))
    halves = af.compile(af.attention(af.rope(), af.causal())).program.canonical((False, False))
    for n in (1024, 8192):
        assert gluon_backward.takes_gluon_backward(problem(n), interleaved) == \
            gluon_backward.takes_gluon_backward(problem(n), halves) == (n == 8192)


def test_a_bias_takes_the_gluon_backward_from_its_measured_size(monkeypatch):
    """An additive bias is scheduled (both dK/dV kernels: the bias-gradient copy too, and
    `scheduled_backward` gives a program for each). Under `auto` a softmax variant with a bias
    takes the Gluon backward at head dim 128 from 8M pairs per head (`GLUON_BIAS_MIN_WORK`,
    measured on the H200 at causal 4096 and 8192), ordered or not; below it, at head dim 64,
    and with a bias under block lists or a pointwise normalizer (not measured) it keeps the
    split. `ATTNFUSE_BACKWARD_TARGET=gluon` takes it wherever it lowers."""
    monkeypatch.setattr(gluon_backward, "hopper", lambda problem: True)
    monkeypatch.delenv("ATTNFUSE_BACKWARD", raising=False)
    monkeypatch.delenv("ATTNFUSE_BACKWARD_TARGET", raising=False)

    def variant(*blocks):
        return af.compile(af.attention(af.additive_bias(), *blocks)).program.canonical((False, False))

    causal = variant(af.causal())
    assert gluon_backward.backward_class(causal) == "softmax with a bias"
    for ordered in (False, True):
        assert gluon_backward.takes_gluon_backward(problem(4096), causal, ordered=ordered)
        assert not gluon_backward.takes_gluon_backward(problem(2048), causal, ordered=ordered)
        assert not gluon_backward.takes_gluon_backward(problem(16384, d=64), causal, ordered=ordered)
    for other in (variant(af.document(), af.causal()), variant(af.sigmoid(), af.causal())):
        assert not gluon_backward.takes_gluon_backward(problem(16384), other)
    monkeypatch.setenv("ATTNFUSE_BACKWARD_TARGET", "gluon")
    assert gluon_backward.takes_gluon_backward(problem(1024), causal)
    spec = af.attention(af.additive_bias(), af.causal())
    key = CompileKey(128, 128, "bf16", TILES, None, bwd_rope="pre_rotated", bwd_dq="ordered")
    programs = gluon_backward.scheduled_backward(lower_spec(spec, key))
    assert programs is not None and set(programs) == {"attention_bwd_dkdv_dq", "attention_bwd_dkdv_dq_bias"}
    assert "dbias" in programs["attention_bwd_dkdv_dq_bias"].kernels[0].roles
    assert "dbias" not in programs["attention_bwd_dkdv_dq"].kernels[0].roles


def test_a_bias_gradient_read_from_an_earlier_gradient_tile_is_not_scheduled():
    """The gradient step refines one tile in place: a store of the bias gradient reads the
    tile as it is at that point. Moved after a VJP that changes the tile (soft-capping's), the
    store reads a tile that no longer exists there, and the kernel is refused, not printed
    wrong."""
    kernel = backward_kernel(af.attention(af.additive_bias(), af.softcap(30.0), af.causal()),
                             name="attention_bwd_dkdv_dq_bias")
    assert kernel.schedule is not None
    loop = next(op for op in kernel.body.block.ops if op.name == "tile.q_loop" and op.body.block.ops)
    ops = list(loop.body.block.ops)
    store = next(op for op in ops if op.name == "tile.store_scores")
    vjp = next(op for op in ops[ops.index(store):] if op.name == "tile.map")
    store.detach()
    loop.body.block.insert_op_after(store, vjp)
    with pytest.raises(GluonUnsupported, match="gradient store"):
        emit_gluon_kernel(kernel)
