"""Programmatic dependent launch (PDL) between a split decode's two kernels.

With `pdl = 1` (lower-to-tile `decode-pdl=1`, the default) the split kernel lets the merge
kernel launch at once (`gdc_launch_dependents`) and the merge, launched as its dependent
(`KernelInfo.launch_pdl`), waits for it (`gdc_wait`) before reading a partial result. The
calls are printed for GPUs only: the CPU interpreter cannot run them. Here: what is printed
for which target, the runtime's choice (`config.takes_decode_pdl`, `ATTNFUSE_DECODE_PDL`),
that the launch asks Triton for `launch_pdl`, and that the printed kernels compile for sm_90
ahead of time (the installed Triton, and Triton 3.6, the H200's, when
`ATTNFUSE_TRITON36_PATH` names a directory holding it). Timings are the H200's
(bench/decode.py --pdl-forms on,off); the GPU run's results are checked in
test/python/test_gpu_decode.py."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.lowering.triton import KernelInfo, emit_module
from attnfuse.runtime import cache as kernel_cache
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime.config import DECODE_PDL_ENV, TileConfig, takes_decode_pdl
from attnfuse.runtime.inputs import check_inputs
from attnfuse.runtime.kv_cache import CacheLayout
from attnfuse.runtime.launch import KernelLaunch
from aot import sm90_compile, skip_unless_aot

PAGED = CacheLayout(kv_lens=True, page_size=64)
GDC_CALLS = ("gdc_launch_dependents()", "gdc_wait()")


def decode_source(interpreter: bool, pdl: bool = True, head_dim: int = 64, cache: CacheLayout = PAGED,
                  decode_merge: str = "kernel"):
    """The printed split decode (RoPE + causal over a paged cache) and its `KernelInfo`s."""
    config = TileConfig(16, 64, 4, 3)
    key = CompileKey(head_dim, head_dim, "f16", config, ("fused", "fused"), decode=True, cache=cache,
                     decode_merge=decode_merge, decode_pdl=pdl)
    program = emit_module(lower_spec(af.attention(af.rope(), af.causal()), key), interpreter=interpreter)
    return program, key


def kernel_text(source: str, name: str) -> str:
    """The source of one printed kernel (from its `def` to the next decorator or the end)."""
    start = source.index(f"def {name}(")
    end = source.find("@triton.jit", start)
    return source[start:] if end < 0 else source[start:end]


def body_lines(text: str) -> list[str]:
    """A printed kernel's statements after its signature, stripped, comments dropped."""
    body = text[text.index("):\n") + 3:]
    return [line.split("#")[0].strip() for line in body.splitlines() if line.split("#")[0].strip()]


def test_gpu_source_waits_before_the_merge_reads_and_triggers_first():
    program, _key = decode_source(interpreter=False)
    source = program.source
    assert "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait" in source
    split = body_lines(kernel_text(source, "attention_decode"))
    assert split[0] == "gdc_launch_dependents()"
    assert "gdc_wait()" not in split
    merge = body_lines(kernel_text(source, "attention_merge"))
    wait = merge.index("gdc_wait()")
    # Nothing before the wait reads memory; the first load after it reads the partials.
    assert not any("tl.load" in line for line in merge[:wait])
    first_load = next(line for line in merge[wait:] if "tl.load(" in line)
    assert "o_part_base" in first_load
    assert "gdc_launch_dependents()" not in merge
    infos = {info.name: info for info in program.kernels}
    assert infos["attention_merge"].launch_pdl
    assert not infos["attention_decode"].launch_pdl


@pytest.mark.parametrize("interpreter, pdl", [(True, True), (True, False), (False, False)])
def test_no_gdc_calls_for_the_interpreter_or_without_pdl(interpreter, pdl):
    program, key = decode_source(interpreter=interpreter, pdl=pdl)
    assert not any(call in program.source for call in GDC_CALLS)
    assert "triton.language.extra.cuda" not in program.source
    assert not any(info.launch_pdl for info in program.kernels)
    assert ("decode-pdl=0" in key.pipeline()) == (not pdl)


def test_last_split_merge_has_no_dependent():
    program, _key = decode_source(interpreter=False, decode_merge="last-split")
    assert not any(call in program.source for call in GDC_CALLS)
    assert not any(info.launch_pdl for info in program.kernels)


def test_non_decode_pipelines_do_not_name_pdl():
    key = CompileKey(64, 64, "f16", TileConfig(64, 64, 4, 3), ("fused", "fused"), decode_pdl=False)
    assert "decode-pdl" not in key.pipeline()


@pytest.fixture
def problem():
    """A one-token decode problem on the CPU (what `takes_decode_pdl` reads: the device)."""
    q = torch.zeros(1, 4, 1, 64, dtype=torch.float16)
    k = torch.zeros(1, 2, 64, 64, dtype=torch.float16)
    return check_inputs(af.compile(af.attention(af.causal())).program, q, k, k)


def test_runtime_choice_follows_the_variable(monkeypatch, problem):
    monkeypatch.delenv(DECODE_PDL_ENV, raising=False)
    assert takes_decode_pdl(problem, interpreted=True)
    # Off the interpreter, only a CUDA GPU of capability 9.0 or more (none here: a CPU problem).
    assert not takes_decode_pdl(problem, interpreted=False)
    monkeypatch.setenv(DECODE_PDL_ENV, "0")
    assert not takes_decode_pdl(problem, interpreted=True)
    monkeypatch.setenv(DECODE_PDL_ENV, "1")
    assert takes_decode_pdl(problem, interpreted=True)
    monkeypatch.setenv(DECODE_PDL_ENV, "yes")
    with pytest.raises(ArgumentError, match="ATTNFUSE_DECODE_PDL must be 0 or 1, got 'yes'"):
        takes_decode_pdl(problem, interpreted=True)


def test_decode_call_checks_the_variable_and_runs_without_pdl(monkeypatch):
    torch.manual_seed(0)
    q = torch.randn(1, 4, 1, 32)
    k, v = torch.randn(1, 2, 80, 32), torch.randn(1, 2, 80, 32)
    monkeypatch.setenv(DECODE_PDL_ENV, "2")
    with pytest.raises(ArgumentError, match=DECODE_PDL_ENV):
        af.compile(af.attention(af.causal()))(q, k, v)
    monkeypatch.setenv(DECODE_PDL_ENV, "0")
    fn = af.compile(af.attention(af.causal()))
    out = fn(q, k, v)
    assert "decode-pdl=0" in fn.last.pipeline
    # The reference, in float64: the one query sits at the last key and sees them all.
    kk, vv = (t.double().repeat_interleave(2, dim=1) for t in (k, v))
    expected = torch.softmax(q.double() @ kk.transpose(-1, -2) / 32 ** 0.5, dim=-1) @ vv
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


class _RecordingKernel:
    """A stand-in for a JIT function: records the keywords of its launch."""

    def __init__(self):
        self.launches: list[dict] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
        return launch


@pytest.mark.parametrize("launch_pdl", [True, False])
def test_launch_asks_triton_for_a_dependent_launch(launch_pdl):
    info = KernelInfo("attention_merge", ("o",), "query_blocks", 1, 4, 1, splits=True,
                      launch_pdl=launch_pdl)
    kernel = _RecordingKernel()
    KernelLaunch(info, kernel, (1, 1), (), (True,), [1]).launch_jit([])
    assert kernel.launches[0].get("launch_pdl", False) is launch_pdl


# -- ahead-of-time compiles for sm_90 ---------------------------------------------------------

def sm90_report(directory: str) -> dict[str, dict[str, object]]:
    """Per kernel of the printed GPU decode (D=128, 64-key steps, paged), compiled for sm_90
    as the runtime launches it: whether its PTX has griddepcontrol.wait / .launch_dependents,
    its `launch_pdl` metadata, and that ptxas made a cubin. Run by the tests in this process
    and, for Triton 3.6, in a subprocess."""
    program, _key = decode_source(interpreter=False, head_dim=128)
    path = Path(directory) / "decode_pdl_sm90.py"
    path.write_text(program.source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    report = {}
    with kernel_cache.triton_target(interpret=False):
        spec.loader.exec_module(module)
        for info in program.kernels:
            compiled = sm90_compile(getattr(module, info.name), info.num_stages, launch_pdl=info.launch_pdl)
            ptx = compiled.asm["ptx"]
            report[info.name] = {
                "wait": bool(re.search(r"griddepcontrol\.wait", ptx)),
                "launch_dependents": bool(re.search(r"griddepcontrol\.launch_dependents", ptx)),
                "launch_pdl": bool(compiled.metadata.launch_pdl),
                "cubin": len(compiled.asm["cubin"]) > 0,
            }
    return report


EXPECTED = {
    "attention_decode": {"wait": False, "launch_dependents": True, "launch_pdl": False, "cubin": True},
    "attention_merge": {"wait": True, "launch_dependents": False, "launch_pdl": True, "cubin": True},
}


def _gpu_compiles_here() -> None:
    skip_unless_aot()
    try:
        import triton.language.extra.cuda as cuda
    except ImportError:  # pragma: no cover
        pytest.skip("this Triton has no triton.language.extra.cuda")
    if not hasattr(cuda, "gdc_wait"):
        pytest.skip("this Triton has no grid-dependency control")


def test_printed_kernels_compile_for_sm90(tmp_path):
    _gpu_compiles_here()
    assert sm90_report(str(tmp_path)) == EXPECTED


TRITON36 = os.environ.get("ATTNFUSE_TRITON36_PATH", "")
"""A directory holding Triton 3.6 (`pip install --target DIR triton==3.6.0`), the H200's."""


@pytest.mark.skipif(not (TRITON36 and (Path(TRITON36) / "triton").is_dir()),
                    reason="ATTNFUSE_TRITON36_PATH names no directory holding Triton 3.6")
def test_printed_kernels_compile_for_sm90_with_triton36(tmp_path):
    root = Path(__file__).resolve().parents[3]
    script = (
        "import json, sys, triton\n"
        "assert triton.__version__.startswith('3.6'), triton.__version__\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_decode_pdl import sm90_report\n"
        f"print(json.dumps(sm90_report({str(tmp_path)!r})))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TRITON36, str(root)])}
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    import json
    assert json.loads(result.stdout.strip().splitlines()[-1]) == EXPECTED
