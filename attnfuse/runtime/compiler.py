"""Spec -> attn IR -> the four passes -> tile IR -> Triton source -> loaded kernels."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import triton
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline
from xdsl.utils.exceptions import PassFailedException, VerifyException

import attnfuse
from attnfuse.dialects import make_context
from attnfuse.dsl.spec import AttentionSpec
from attnfuse.errors import AttnFuseError, IRError
from attnfuse.lowering.triton import TritonProgram, emit_module
from attnfuse.runtime import cache as kernel_cache
from attnfuse.runtime.config import TileConfig
from attnfuse.transforms import PASSES


@dataclass(frozen=True)
class CompileKey:
    """Everything that changes the generated code of one variant."""

    head_dim: int
    head_dim_v: int
    element_type: str
    config: TileConfig
    placement: tuple[str, str] | None

    def pipeline(self) -> str:
        """The `attnfuse-opt -p` pipeline that produces this compile's tile IR."""
        query, key = self.placement or ("fused", "fused")
        c = self.config
        return (
            "canonicalize-attn,analyze-masks,"
            f"place-rope{{query={query} key={key}}},"
            f"lower-to-tile{{head-dim={self.head_dim} head-dim-v={self.head_dim_v} "
            f"element-type={self.element_type} block-m={c.block_m} block-n={c.block_n} "
            f"num-warps={c.num_warps} num-stages={c.num_stages}}}"
        )


@dataclass(frozen=True)
class CompiledProgram:
    """Generated kernels, loaded, with their source and the IR they came from."""

    program: TritonProgram
    module: ModuleType
    pipeline: str

    @property
    def source(self) -> str:
        return self.program.source

    def function(self, name: str) -> Any:
        return getattr(self.module, name)


def lower_spec(spec: AttentionSpec, key: CompileKey) -> ModuleOp:
    """The tile IR of a spec: its attn module run through the pass pipeline."""
    ctx = make_context()
    module = spec.module()
    try:
        PassPipeline.parse_spec(PASSES, key.pipeline()).apply(ctx, module)
        module.verify()
    except (PassFailedException, VerifyException, IRError) as err:
        raise AttnFuseError(f"cannot compile {spec!r}: {err}") from err
    return module


def _cache_key(spec: AttentionSpec, key: CompileKey, interpret: bool) -> str:
    # The spec's canonical form, so that equal specs (blocks in another order) share entries.
    canonical = AttentionSpec(spec.canonical_blocks).ir()
    target = "interpreter" if interpret else "gpu"
    text = "\n".join([canonical, key.pipeline(), target, attnfuse.__version__, triton.__version__])
    return hashlib.sha256(text.encode()).hexdigest()


@cache
def generate_program(
    spec: AttentionSpec, key: CompileKey, interpret: bool
) -> tuple[TritonProgram, Path, str]:
    """The generated source of `spec` for one `CompileKey` (from the caches, or compiled and
    stored), its path on disk and its cache key. Loads nothing."""
    digest = _cache_key(spec, key, interpret)
    program, path = kernel_cache.get_or_build(
        digest, lambda: emit_module(lower_spec(spec, key), interpreter=interpret)
    )
    return program, path, digest


@cache
def compile_program(spec: AttentionSpec, key: CompileKey, interpret: bool) -> CompiledProgram:
    """Compiles (or loads from the caches) the kernels of `spec` for one `CompileKey`."""
    program, path, digest = generate_program(spec, key, interpret)
    # The file may have changed since it was generated (another process, a crash mid-write,
    # a cleaned cache): import only a verified copy of the source in hand.
    stored = kernel_cache.lookup(digest)
    if stored is None or stored[0].source != program.source:
        path = kernel_cache.store(digest, program)
    module = kernel_cache.load_module(path, digest, interpret)
    return CompiledProgram(program, module, key.pipeline())
