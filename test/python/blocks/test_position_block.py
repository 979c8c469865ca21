"""A block that reads positions and the query head, from one file outside the package:
`fire_log(r1, c, threshold)`, FIRE's bias
`s <- s - r1 / (h + 1) * log(1 + c |q_pos - k_pos|) / log(1 + c max(threshold, q_pos))`
(`fire_block.py`, beside this file), written with the kernel builder's `pair_position` and
`query_head` (`tile.pair_position`, `tile.query_head`) and one `tile.map`. The bias is not
symmetric in the two positions (the query's normalizes), so a kernel that read one for the
other would fail.

The kernels meet every orientation of those ops: the forward (rows are queries), the split
backward's dK/dV kernel (rows are keys, a loop over the GQA group's heads), its dQ kernel, the
fused backward (dQ added from the dK/dV kernel), the split decode (rows span the group's query
heads) and the one-pass kernels with per-sequence lengths; each is checked against the float64
reference (the op's `evaluate`) and a formula written out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close_to_reference, check_forward_backward, make_qkv

import fire_block
from fire_block import fire_log

import attnfuse as af
from attnfuse.blocks import register_block_module, unregister_block_module
from attnfuse.runtime.backward_choice import BACKWARD_ENV

pytestmark = pytest.mark.interpreter

R1, C, THRESHOLD = 0.8, 0.5, 6.0


@pytest.fixture(autouse=True)
def registered():
    register_block_module(fire_block)
    yield
    unregister_block_module(fire_block)


def formula(q, k, v, *, causal: bool, lens: list[int] | None = None):
    """softmax(q k^T / sqrt(d) - FIRE's bias) v over GQA, in float64,
    each sequence over its first `lens[b]` keys (queries at the end), written out by hand."""
    q, k, v = q.double(), k.double(), v.double()
    batch, heads, nq, d = q.shape
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    outs = []
    for b in range(batch):
        nk = k.shape[2] if lens is None else lens[b]
        s = q[b] @ k[b, :, :nk].transpose(-1, -2) / math.sqrt(d)
        i_pos = torch.arange(nq, dtype=torch.float64)[:, None] + (nk - nq)
        j_pos = torch.arange(nk, dtype=torch.float64)[None, :]
        scale = (R1 / (torch.arange(heads, dtype=torch.float64) + 1))[:, None, None]
        relative = torch.log(1 + C * (i_pos - j_pos).abs()) / torch.log(1 + C * i_pos.clamp(min=THRESHOLD))
        s = s - scale * relative
        if causal:
            s = s.masked_fill(j_pos > i_pos, float("-inf"))
        # A query with no key left (causal, at a negative position) outputs 0.
        outs.append(torch.softmax(s, -1).nan_to_num(0.0) @ v[b, :, :nk])
    return torch.stack(outs)


@pytest.mark.parametrize("backward", ["separate", "ordered"])
@pytest.mark.parametrize("normalizer", [af.softmax(), af.relu(), af.sigmoid()], ids=["softmax", "relu", "sigmoid"])
def test_kernels_forward_backward(monkeypatch, launched, normalizer, backward):
    monkeypatch.setenv(BACKWARD_ENV, backward)
    q, k, v = make_qkv(1, 4, 2, 23, 37, 16, seed=11)
    spec = af.attention(af.causal(), fire_log(R1, C, THRESHOLD), normalizer)
    check_forward_backward(spec, q, k, v)
    assert ("attention_bwd_dkdv_dq" in launched) == (backward == "ordered"), launched


def test_matches_a_formula():
    q, k, v = make_qkv(2, 4, 2, 19, 33, 16, seed=12)
    for causal in (False, True):
        spec = af.attention(fire_log(R1, C, THRESHOLD), *([af.causal()] if causal else []))
        assert (spec(q, k, v).double() - formula(q, k, v, causal=causal)).abs().max() < 1e-5


@pytest.mark.parametrize("nq", [1, 4, 20], ids=["decode", "decode-4", "one-pass"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cache_positions_follow_the_lengths(nq, paged):
    """With `kv_lens=` each sequence's queries sit at its end: the positions the map reads
    follow the lengths, in the split decode kernels (whose rows span the group's query heads:
    each row's head is its own) and in the one-pass kernels."""
    lens = [40, 17, 29]
    q, k, v = make_qkv(3, 8, 2, nq, 48, 16, seed=13)
    spec = af.attention(fire_log(R1, C, THRESHOLD), af.causal())
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    call: dict = {"kv_lens": kv_lens}
    keys, values = k, v
    if paged:
        page = 16
        pages = k.shape[2] // page
        order = torch.randperm(3 * pages, generator=torch.Generator().manual_seed(1))
        table = order.reshape(3, pages).to(torch.int32)
        keys = torch.empty(3 * pages, 2, page, 16)
        values = torch.empty_like(keys)
        for b in range(3):
            for slot in range(pages):
                keys[table[b, slot]] = k[b, :, slot * page:(slot + 1) * page]
                values[table[b, slot]] = v[b, :, slot * page:(slot + 1) * page]
        call["block_table"] = table
    out = spec(q, keys, values, **call)
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v, kv_lens=kv_lens), torch.float32)
    assert (out.double() - formula(q, k, v, causal=True, lens=lens)).abs().max() < 1e-5


def test_the_hopper_schedule_takes_the_forward(sm90, monkeypatch):
    """On Hopper the warp-specialized forward prints the index tiles in the score tile's
    layout (the step's rows, key positions and the tile's query head) and compiles for sm_90;
    the fused backward is scheduled too (its step builds them from its keys, query positions
    and head: `test_gluon_backward_target.py::test_index_tiles_compile_for_sm90`)."""
    from conftest import gluon_forward_for_sm90

    from attnfuse.dialects import make_context
    from attnfuse.runtime.compiler import CompileKey, lower_spec
    from attnfuse.runtime.config import TileConfig
    from attnfuse.transforms.warp_specialize import WarpSpecializePass

    spec = af.attention(fire_log(R1, C, THRESHOLD), af.causal())
    module = lower_spec(spec, CompileKey(128, 128, "bf16", TileConfig(64, 64, 4, 2), None, bwd_dq="ordered"))
    WarpSpecializePass().apply(make_context(), module)
    scheduled = {op.sym_name.data for op in module.ops if op.schedule is not None}
    assert scheduled == {"attention_fwd", "attention_bwd_dkdv_dq"}
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    program, compiled = gluon_forward_for_sm90(spec, 128)
    step = program.source.split("def attention_fwd_step(", 1)[1].split("@gluon.jit", 1)[0]
    assert "n_k, head," in step.split("\n", 1)[0], "the step takes the tile's query head"
    assert "gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT) + q_pos[:, None]" in step
    assert "gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT) + keys[None, :]" in step
    assert "gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT) + head" in step
    assert compiled.asm["cubin"]


def test_printed_kernels_read_positions_and_heads():
    source = af.compile(af.attention(fire_log(R1, C, THRESHOLD), af.causal())).source
    assert "tile.pair_position: each entry's query position" in source
    assert "tile.query_head" in source


@pytest.mark.parametrize("args, message", [
    ((1e39, 1.0), "r1 must be in"),
    ((1.0, 1e-10), "c \\* threshold at least 2\\^-20"),  # log(1 + c x) would round to 0: 0 / 0 in f32
    ((1.0, 1e31), "c must be at most"),
    ((1.0, 1.0, 0.5), "threshold must be in"),
    ((1.0, float("nan")), "must be finite"),
])
def test_parameters_the_f32_kernels_cannot_hold_are_refused_by_the_block_and_the_op(args, message):
    """One rule (`fire_block.parameter_problem`) for the block and its op's verifier: values the
    kernels' f32 arithmetic would turn into inf or 0 / 0 (the float64 reference stays finite)."""
    from attnfuse.errors import CompositionError

    with pytest.raises(CompositionError, match=message):
        fire_log(*args)
    r1, c, threshold = (*args, 16.0)[:3]
    assert fire_block.parameter_problem(r1, c, threshold) is not None
