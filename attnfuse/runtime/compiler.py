"""Variant -> attn IR -> the passes (`DEFAULT_PIPELINE`) -> tile IR -> Triton source -> loaded kernels.

A variant is any source `attnfuse.runtime.program.as_program` takes: a spec, attn IR text or
a `VariantProgram`."""

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
from attnfuse.errors import AttnFuseError, IRError
from attnfuse.lowering.triton import TritonProgram, emit_module
from attnfuse.runtime import cache as kernel_cache
from attnfuse.runtime.code_fingerprint import foreign_fingerprint
from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.kv_cache import CONTIGUOUS, CacheLayout
from attnfuse.runtime.program import VariantProgram, as_program
from attnfuse.transforms import PASSES, TILE_PIPELINE


@dataclass(frozen=True)
class CompileKey:
    """Everything that changes the generated code of one variant."""

    head_dim: int
    head_dim_v: int
    element_type: str
    config: TileConfig
    placement: tuple[str, str] | None
    explicit_positions: tuple[bool, bool] = (False, False)
    """Whether query / key RoPE positions are call-time tensors."""
    bwd_rope: str = "pre_rotated"
    """Where the backward rotates q and k (`lower-to-tile`'s `bwd-rope`)."""
    decode: bool = False
    """The split-KV decode kernels (`lower-to-tile`'s `decode`)."""
    cache: CacheLayout = CONTIGUOUS
    """How the keys are held (`kv-lens`, `page-size`)."""
    append: bool = False
    """The cache append kernel alone (`lower-to-tile`'s `append`)."""
    decode_merge: str = "kernel"
    """Where a split decode merges (`lower-to-tile`'s `decode-merge`)."""
    decode_pdl: bool = True
    """A split decode's merge kernel launches as the split kernel's programmatic dependent
    (`lower-to-tile`'s `decode-pdl`; `config.takes_decode_pdl`)."""
    bwd_dq: str = "separate"
    """How the backward computes dQ (`lower-to-tile`'s `bwd-dq`: separate or fused;
    `backward_choice.choose_backward`)."""
    backward: bool = True
    """Whether the program has backward kernels (`lower-to-tile`'s `backward`): False for a
    variant with a modifier that has no derivative (`Canonical.underivable`)."""

    def pipeline(self) -> str:
        """The `attnfuse-opt -p` pipeline that produces this compile's tile IR."""
        query, key = self.placement or ("fused", "fused")
        c = self.config
        bm, bn, warps, stages = c.backward()
        kv_bm, kv_bn, kv_warps, kv_stages = c.dkdv()
        return (
            "canonicalize-attn,analyze-masks,"
            f"place-rope{{query={query} key={key}}},"
            f"lower-to-tile{{head-dim={self.head_dim} head-dim-v={self.head_dim_v} "
            f"element-type={self.element_type} block-m={c.block_m} block-n={c.block_n} "
            f"num-warps={c.num_warps} num-stages={c.num_stages} "
            f"bwd-block-m={bm} bwd-block-n={bn} bwd-num-warps={warps} bwd-num-stages={stages} "
            f"dkdv-block-m={kv_bm} dkdv-block-n={kv_bn} dkdv-num-warps={kv_warps} "
            f"dkdv-num-stages={kv_stages} bwd-rope={self.bwd_rope}{self.bwd_dq_option()}"
            f"{self.cache_options()}}},"
            f"{TILE_PIPELINE}"
        )


    def bwd_dq_option(self) -> str:
        """` bwd-dq=fused` for the fused backward, ` backward=false` for a forward-only
        program (none for the defaults, so the pipelines of other calls read as before)."""
        if not self.backward:
            return " backward=false"
        return f" bwd-dq={self.bwd_dq}" if self.bwd_dq != "separate" else ""

    def cache_options(self) -> str:
        """The `lower-to-tile` options for decoding and the cache layout (none by default,
        so the pipelines of other calls read as before)."""
        options = " decode=true" if self.decode else ""
        if self.decode and self.decode_merge != "kernel":
            options += f" decode-merge={self.decode_merge}"
        if self.decode and not self.decode_pdl:
            options += " decode-pdl=0"
        if self.decode and self.config.merge_stages != 1:
            options += f" merge-stages={self.config.merge_stages}"
        if self.append:
            options += " append=true"
        if self.cache.kv_lens:
            options += " kv-lens=true"
        if self.cache.page_size:
            options += f" page-size={self.cache.page_size}"
            if self.config.page_lookahead != 1:
                options += f" page-lookahead={self.config.page_lookahead}"
            if self.config.hoist_page_rows != 1:
                options += f" hoist-page-rows={self.config.hoist_page_rows}"
        return options


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


def lower_spec(source: object, key: CompileKey) -> ModuleOp:
    """The tile IR of a variant (a spec, attn IR text or a `VariantProgram`): its attn
    module run through the pass pipeline."""
    program = as_program(source)
    program.canonical(key.explicit_positions)  # checks the program, with a clear error
    ctx = make_context()
    module = program.module(key.explicit_positions)
    try:
        PassPipeline.parse_spec(PASSES, key.pipeline()).apply(ctx, module)
        module.verify()
    except (PassFailedException, VerifyException, IRError) as err:
        raise AttnFuseError(f"cannot compile {program!r}: {err}") from err
    return module


COMPILER_PACKAGES = ("dsl", "dialects", "blocks", "transforms", "lowering")
"""The subpackages of `attnfuse` whose code turns a spec into source."""


def package_fingerprint(root: Path) -> str:
    """A hash of every Python file of `COMPILER_PACKAGES` under `root` (an `attnfuse`
    package directory), subpackages included (`dialects/tile/`, `lowering/triton/`), each
    with its path relative to `root`."""
    digest = hashlib.sha256()
    for package in COMPILER_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def _package_fingerprint() -> str:
    return package_fingerprint(Path(attnfuse.__file__).parent)


def compiler_fingerprint() -> str:
    """A hash of the code that turns specs into source (DSL, dialects, blocks, passes,
    printer), block modules registered from outside the package included, so that a changed
    compiler never reuses source generated by an older one."""
    from attnfuse.blocks import _REGISTERED

    if not _REGISTERED:
        return _package_fingerprint()
    digest = hashlib.sha256(_package_fingerprint().encode())
    for module in _REGISTERED:
        digest.update(module.__name__.encode())
        digest.update(Path(module.__file__).read_bytes() if getattr(module, "__file__", None) else b"")
    return digest.hexdigest()


def _cache_key(source: object, key: CompileKey, interpret: bool) -> str:
    # The canonical program, so that equal variants (blocks in another order, or the same
    # program written by hand) share entries.
    canonical = as_program(source).canonical(key.explicit_positions)
    target = "interpreter" if interpret else "gpu"
    text = "\n".join([canonical.text, key.pipeline(), target, compiler_fingerprint(),
                      foreign_fingerprint(canonical.module), triton.__version__])
    return hashlib.sha256(text.encode()).hexdigest()


def generate_program(
    source: object, key: CompileKey, interpret: bool
) -> tuple[TritonProgram, Path, str]:
    """The generated source of a variant for one `CompileKey` (from the caches, or compiled
    and stored), its path on disk and its cache key. Loads nothing."""
    return _generate(as_program(source), key, interpret)


@cache
def _generate(variant: VariantProgram, key: CompileKey, interpret: bool) -> tuple[TritonProgram, Path, str]:
    digest = _cache_key(variant, key, interpret)
    program, path = kernel_cache.get_or_build(
        digest, lambda: emit_module(lower_spec(variant, key), interpreter=interpret)
    )
    return program, path, digest


def compile_program(source: object, key: CompileKey, interpret: bool) -> CompiledProgram:
    """Compiles (or loads from the caches) the kernels of a variant for one `CompileKey`."""
    return _compile(as_program(source), key, interpret)


@cache
def _compile(variant: VariantProgram, key: CompileKey, interpret: bool) -> CompiledProgram:
    program, path, digest = _generate(variant, key, interpret)
    # The file may have changed since it was generated (another process, a crash mid-write,
    # a cleaned cache): import only a verified copy of the source in hand.
    stored = kernel_cache.lookup(digest)
    if stored is None or stored[0].source != program.source:
        path = kernel_cache.store(digest, program)
    module = kernel_cache.load_module(path, digest, interpret, program.source)
    return CompiledProgram(program, module, key.pipeline())


def forget_compiled() -> None:
    """Drops the in-memory compiled programs (the disk cache stays): the next compile reads
    the disk entry again."""
    _compile.cache_clear()
    _generate.cache_clear()
