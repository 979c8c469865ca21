"""Element-wise filters from one file outside the package: `sink_window(sinks, window)`,
StreamingLLM's attention sinks plus a window of recent keys (`sink_window_block.py`, beside
this file), and `chunked(size)`, Llama 4's chunked local attention (`chunk_block.py`, a
`floor` of the positions). It is neither a band nor block lists: its `lower` tests each entry from the
entries' positions (`tile.pair_position`) in one `tile.map`, so the kernels mask every block
they visit (`VariantFacts.elementwise`).

Checked through the real kernels against the float64 reference (the op's `evaluate`) and a
mask written out by hand: forward and backward (split and fused) under every normalizer, with
documents (the block lists' full blocks tested too), rows left with no key, and decoding with
per-sequence lengths and pages."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from conftest import GRAD_TOLERANCE, assert_close_to_reference, check_forward_backward, make_qkv

import chunk_block
import sink_window_block
from chunk_block import chunked
from sink_window_block import sink_window

import attnfuse as af
from attnfuse.blocks import register_block_module, unregister_block_module
from attnfuse.dialects.interfaces import KeyFilter
from attnfuse.runtime.backward_choice import BACKWARD_ENV

pytestmark = pytest.mark.interpreter

SINKS, WINDOW = 3, 9


@pytest.fixture(autouse=True)
def registered():
    for module in (sink_window_block, chunk_block):
        register_block_module(module)
    yield
    for module in (sink_window_block, chunk_block):
        unregister_block_module(module)


def streaming_keep(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Causal, and a sink or within the window (query positions `i`, key positions `j`)."""
    return (j <= i) & ((j < SINKS) | (i - j < WINDOW))


def chunk_keep(size: int):
    """Causal, and in the query's chunk of `size` positions."""
    return lambda i, j: (j <= i) & (torch.div(i, size, rounding_mode="floor") == torch.div(j, size, rounding_mode="floor"))


def by_hand(q, k, v, keep=streaming_keep, lens=None):
    """softmax over the keys `keep(i_pos, j_pos)` keeps, GQA, in float64, each sequence over
    its first `lens[b]` keys with its queries at the end; a row keeping no key is 0."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    outs = []
    for b in range(q.shape[0]):
        nk = k.shape[2] if lens is None else lens[b]
        i = torch.arange(q.shape[2])[:, None] + (nk - q.shape[2])
        j = torch.arange(nk)[None, :]
        s = q[b] @ k[b, :, :nk].transpose(-1, -2) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~keep(i, j), float("-inf"))
        outs.append(torch.softmax(s, -1).nan_to_num(0.0) @ v[b, :, :nk])
    return torch.stack(outs)


@pytest.mark.parametrize("backward", ["separate", "ordered"])
@pytest.mark.parametrize("normalizer", [af.softmax(), af.relu(), af.sigmoid()], ids=["softmax", "relu", "sigmoid"])
def test_kernels_forward_backward(monkeypatch, launched, normalizer, backward):
    monkeypatch.setenv(BACKWARD_ENV, backward)
    q, k, v = make_qkv(1, 4, 2, 45, 61, 16, seed=21)
    check_forward_backward(af.attention(af.causal(), sink_window(SINKS, WINDOW), normalizer), q, k, v)
    assert ("attention_bwd_dkdv_dq" in launched) == (backward == "ordered"), launched


def test_matches_the_streaming_pattern():
    """Against the mask written out by hand; blocks of 16 on the interpreter, so the window's
    entries and the sinks fall in blocks a band alone would call full."""
    q, k, v = make_qkv(2, 4, 2, 50, 70, 16, seed=22)
    out = af.attention(sink_window(SINKS, WINDOW), af.causal())(q, k, v)
    assert (out.double() - by_hand(q, k, v)).abs().max() < 1e-5


def test_rows_left_without_keys_are_zero():
    """More queries than keys: the first queries sit at negative positions and keep no key
    under causal; their rows are 0, and their gradients finite."""
    q, k, v = make_qkv(1, 2, 2, 40, 24, 16, seed=23)
    spec = af.attention(sink_window(0, 4), af.causal())
    out = spec(q, k, v)
    assert (out[:, :, :16] == 0).all() and torch.isfinite(out).all()
    check_forward_backward(spec, q, k, v)


def test_with_documents():
    """With documents the kernels walk block lists: the lists' full blocks are full for the
    documents, not for the element-wise filter, which tests them too."""
    q, k, v = make_qkv(2, 2, 1, 64, 64, 16, seed=24)
    doc_ids = torch.tensor([[0] * 40 + [1] * 24, [0] * 64])
    check_forward_backward(af.attention(af.document(), sink_window(SINKS, WINDOW), af.causal()), q, k, v,
                           doc_ids=doc_ids)


@pytest.mark.parametrize("nq", [1, 20], ids=["decode", "one-pass"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cache_calls(nq, paged):
    lens = [60, 21, 33]
    q, k, v = make_qkv(3, 8, 2, nq, 64, 16, seed=25)
    spec = af.attention(sink_window(SINKS, WINDOW), af.causal())
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    call: dict = {"kv_lens": kv_lens}
    keys, values = k, v
    if paged:
        table = torch.randperm(12, generator=torch.Generator().manual_seed(2)).reshape(3, 4).to(torch.int32)
        keys, values = torch.empty(12, 2, 16, 16), torch.empty(12, 2, 16, 16)
        for b in range(3):
            for slot in range(4):
                keys[table[b, slot]] = k[b, :, slot * 16:(slot + 1) * 16]
                values[table[b, slot]] = v[b, :, slot * 16:(slot + 1) * 16]
        call["block_table"] = table
    out = spec(q, keys, values, **call)
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v, kv_lens=kv_lens), torch.float32)
    assert (out.double() - by_hand(q, k, v, lens=lens)).abs().max() < 1e-5


def test_every_visited_block_is_masked():
    """The kernels have no unmasked key loop: a band alone would leave blocks below the
    diagonal full, which the filter's test must still reach."""
    program = af.compile(af.attention(sink_window(SINKS, WINDOW), af.causal())).source
    forward = program.split("def attention_fwd(")[1].split("\ndef ")[0]
    assert "full: no mask work" not in forward and "tile.pair_position" in forward


@pytest.mark.parametrize("block", [sink_window(SINKS, 256), chunked(24)], ids=["sink_window", "chunked"])
def test_the_hopper_forward_masks_every_block(sm90, monkeypatch, block):
    """On Hopper the warp-specialized forward runs the filter's test on every block it
    visits: one masked key loop, whose step tests the entries' positions (index tiles in the
    score tile's layout); it compiles for sm_90."""
    from conftest import gluon_forward_for_sm90

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    program, compiled = gluon_forward_for_sm90(af.attention(block, af.causal()), 128)
    step = program.source.split("def attention_fwd_step(", 1)[1].split("@gluon.jit", 1)[0]
    assert "loop 0 over partial key blocks: masked" in step and "loop 1" not in step
    assert "gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT) + keys[None, :]" in step
    assert compiled.asm["cubin"]


@pytest.mark.parametrize("size", [7, 16, 24])
def test_chunked_attention(size):
    """Chunks that do not align with the kernels' blocks of 16 (7, 24) and that do (16), and
    more queries than keys (negative query positions keep nothing): forward against the
    formula, forward and backward against the reference."""
    q, k, v = make_qkv(2, 4, 2, 45, 40, 16, seed=27)
    spec = af.attention(chunked(size), af.causal())
    assert (spec(q, k, v).double() - by_hand(q, k, v, chunk_keep(size))).abs().max() < 1e-5
    check_forward_backward(spec, q, k, v)


def test_chunked_decode():
    lens = [50, 17, 33]
    q, k, v = make_qkv(3, 8, 2, 1, 64, 16, seed=28)
    spec = af.attention(chunked(16), af.causal())
    out = spec(q, k, v, kv_lens=torch.tensor(lens, dtype=torch.int32))
    assert (out.double() - by_hand(q, k, v, chunk_keep(16), lens)).abs().max() < 1e-5


def inline_filter(semantics, op_name: str):
    """A block whose op (`op_name`) carries `semantics` (a KeyFilter): a block author's variation
    made in the test itself."""
    from xdsl.dialects.builtin import IntegerAttr, i64
    from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, prop_def, result_def, traits_def
    from xdsl.traits import Pure

    from attnfuse.dialects.attn import ScoresType
    from attnfuse.dsl.blocks import Block

    @irdl_op_definition
    class InlineOp(IRDLOperation):
        name = op_name
        input = operand_def(ScoresType)
        result = result_def(ScoresType)
        sinks = prop_def(IntegerAttr)
        traits = traits_def(Pure(), semantics)

    @dataclass(frozen=True, repr=False)
    class InlineBlock(Block):
        category = "mask"

        def build(self, variant, value):
            return InlineOp.create(operands=[value], result_types=[ScoresType()], properties={"sinks": IntegerAttr(1, i64)})

    return InlineBlock()


def test_a_filter_that_cannot_drop_entries_is_refused():
    """A filter with neither a band, block lists nor a per-entry test has no way to drop an
    entry: refused where it is lowered, naming it, never lowered as keeping every key."""

    @dataclass(frozen=True)
    class Untested(sink_window_block.SinkWindowSemantics):
        lower = KeyFilter.lower

    q, k, v = make_qkv(1, 1, 1, 8, 8, 16, seed=26)
    with pytest.raises(af.AttnFuseError, match="cannot lower attn.untested_filter: a filter must be a band, have "
                                               "block lists or test each entry"):
        af.attention(inline_filter(Untested(), "attn.untested_filter"), af.causal())(q, k, v)


def test_a_filter_that_claims_a_band_is_told_what_a_band_is():
    """A band is an `attn.mask` predicate (which analyze-masks reads); an op of its own that
    answers `KeyFilter.band` is refused with that said, not with "run analyze-masks"."""

    @dataclass(frozen=True)
    class Banded(sink_window_block.SinkWindowSemantics):
        def band(self, op):
            return (0, None)

    q, k, v = make_qkv(1, 1, 1, 8, 8, 16, seed=29)
    with pytest.raises(af.AttnFuseError, match="attn.banded_filter says it is a band .* a band is an attn.mask predicate"):
        af.attention(inline_filter(Banded(), "attn.banded_filter"))(q, k, v)


def test_hand_written_chained_filters_and_an_unused_one():
    """Hand-written IR (`chained_sink_windows.mlir`, beside this file): both filters on the chain
    drop entries, the unused one drops none; against a mask written out by hand, and forward
    and backward against the reference reading the same text."""
    from pathlib import Path

    from attnfuse.runtime.reference import gradient_errors, reference_gradients

    text = (Path(__file__).parent / "chained_sink_windows.mlir").read_text()
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 30, 40, 16, seed=30))
    out = af.compile(text)(q, k, v)
    assert_close_to_reference(out, af.reference_attention(text, q, k, v), torch.float32)
    both = lambda i, j: ((j < 4) | (i - j < 256)) & ((j < 1) | (i - j < 8))  # noqa: E731
    assert (out.double() - by_hand(q.detach(), k.detach(), v.detach(), both)).abs().max() < 1e-5
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    out.backward(grad_out)
    errors = gradient_errors({"q": q.grad, "k": k.grad, "v": v.grad},
                             reference_gradients(text, q, k, v, grad_out))
    assert max(errors.values()) <= GRAD_TOLERANCE[torch.float32], errors


@dataclass(frozen=True)
class _ListedChunkedSemantics(chunk_block.ChunkedSemantics):
    """`attn.chunked` declared listed although it reads no call-time data."""

    def lists(self, op):
        return True


def test_a_listed_filter_without_call_time_data_is_refused_when_compiled():
    """The runtime builds block lists from the tensor a call passes for a listed filter: one
    that reads none is refused by `af.compile` (it lowered, then failed at its first call
    with a KeyError for the lists nothing made)."""
    from xdsl.dialects.builtin import IntegerAttr, i64
    from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, prop_def, result_def, traits_def
    from xdsl.traits import Pure

    from attnfuse.dialects.attn import ScoresType

    @irdl_op_definition
    class ListedChunkedOp(IRDLOperation):
        name = "attn.listed_chunked"
        input = operand_def(ScoresType)
        result = result_def(ScoresType)
        chunk = prop_def(IntegerAttr)
        traits = traits_def(Pure(), _ListedChunkedSemantics())

        def __init__(self, scores, chunk):
            super().__init__(operands=[scores], result_types=[ScoresType()],
                             properties={"chunk": IntegerAttr(chunk, i64)})

    @dataclass(frozen=True, repr=False)
    class ListedChunked(chunk_block.Chunked):
        def build(self, variant, value):
            return ListedChunkedOp(value, self.size)

    with pytest.raises(af.IRError, match=r"attn\.listed_chunked: a listed filter \(KeyFilter\.lists\) must read call-time data"):
        af.compile(af.attention(ListedChunked(8), af.causal()))
