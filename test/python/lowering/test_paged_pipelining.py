"""A paged decode kernel's K/V loads software-pipeline as deep as a contiguous cache's, and
the merge kernel's loop over the splits as deep as it asks.

Compiled ahead of time for the H200's target (sm_90, `GPUTarget`; no GPU needed), the split
decode kernel's key loop multi-buffers its K and V tiles in shared memory: `num_stages - 1`
buffers each. Read in its own step, a page id is a load the K/V addresses depend on, and
Triton's pipeliner spends a stage on it (one buffer fewer: at three stages, single-buffered
K/V, nothing in flight past the step computing). Read a step ahead (`page_lookahead` 1, the
default), it costs none. This test reads the buffers off the TTGIR Triton produces."""

from __future__ import annotations

import importlib.util
import re

import pytest

import attnfuse as af
from attnfuse.lowering.triton import emit_module
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime import cache as kernel_cache
from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.kv_cache import CacheLayout

from aot import sm90_compile, skip_unless_aot  # noqa: E402

skip_unless_aot(module_level=True)


def decode_kernel_ttgir(tmp_path, page_size: int, lookahead: int, stages: int = 3,
                        kernel: str = "attention_decode", merge_stages: int = 1) -> str:
    """The TTGIR of a split decode's kernel (D=128, 64-key steps) compiled for sm_90."""
    cache = CacheLayout(kv_lens=True, page_size=page_size)
    config = TileConfig(16, 64, 4, stages, page_lookahead=lookahead, merge_stages=merge_stages)
    key = CompileKey(128, 128, "f16", config, ("fused", "fused"), decode=True, cache=cache)
    source = emit_module(lower_spec(af.attention(af.causal()), key)).source
    path = tmp_path / f"decode_p{page_size}_l{lookahead}_m{merge_stages}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    with kernel_cache.triton_target(interpret=False):
        spec.loader.exec_module(module)
        return sm90_ttgir(getattr(module, kernel), 1 if kernel == "attention_merge" else stages)


def sm90_ttgir(fn, stages: int) -> str:
    """The TTGIR of a decode kernel compiled for sm_90 (`aot.sm90_compile`)."""
    return sm90_compile(fn, stages).asm["ttgir"]


def kv_buffers(ttgir: str) -> set[int]:
    """How many shared-memory buffers each 64x128 fp16 tile (K or V) of the loops has."""
    return {int(n) for n in re.findall(r"local_alloc\s*:\s*\(\)\s*->\s*!ttg\.memdesc<(\d+)x64x128xf16", ttgir)}


@pytest.fixture(scope="module")
def contiguous_buffers(tmp_path_factory):
    return kv_buffers(decode_kernel_ttgir(tmp_path_factory.mktemp("contiguous"), 0, 1))


def test_contiguous_decode_double_buffers_at_three_stages(contiguous_buffers):
    assert contiguous_buffers == {2}


@pytest.mark.parametrize("page_size", [16, 64], ids=["ids-per-key", "ids-per-step"])
def test_paged_decode_pipelines_as_deep_as_contiguous(tmp_path, contiguous_buffers, page_size):
    assert kv_buffers(decode_kernel_ttgir(tmp_path, page_size, 1)) == contiguous_buffers


def test_page_ids_read_in_their_step_cost_a_stage(tmp_path, contiguous_buffers):
    """What the lookahead removes (and what makes the test above able to fail)."""
    assert kv_buffers(decode_kernel_ttgir(tmp_path, 16, 0)) == {1}


@pytest.mark.parametrize("merge_stages, buffers", [(3, {2}), (1, set())], ids=["pipelined", "unpipelined"])
def test_merge_loop_pipelines_as_asked(tmp_path, merge_stages, buffers):
    """The merge kernel (launched with one stage) keeps `merge_stages - 1` steps' partials in
    flight (a step: one row's 64 splits, `[1, 64, 128]` fp32 at head dim 128): its loop asks
    for them (`tl.range`), as no product's operand makes Triton do so."""
    ttgir = decode_kernel_ttgir(tmp_path, 0, 1, kernel="attention_merge", merge_stages=merge_stages)
    found = re.findall(r"local_alloc\s*:\s*\(\)\s*->\s*!ttg\.memdesc<(\d+)x1x64x128xf32", ttgir)
    assert {int(n) for n in found} == buffers
    if not buffers:
        assert "local_alloc" not in ttgir, "an unpipelined merge loads straight into registers"
