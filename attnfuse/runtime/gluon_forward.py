"""Which forward a Hopper GPU runs: the Gluon target's warp-specialized kernel
(`lowering/gluon.py`) where it lowers the variant and measured faster, else the portable one.

The choice is per plan (shape) and, for what depends on the tensors themselves (contiguity,
alignment), per call: a call whose tensors a TMA descriptor cannot cover runs the portable
kernel of the same plan. `ATTNFUSE_FORWARD_TARGET` forces it: `triton` (never Gluon), `gluon`
(Gluon wherever it lowers and the shapes fit, whatever the measurements say), `auto` (the
default: `prefers_gluon`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import cache
from collections.abc import Callable
from typing import Any

import torch
from xdsl.dialects.builtin import ModuleOp

from attnfuse.dialects import tile
from attnfuse.errors import ArgumentError
from attnfuse.runtime import cache as kernel_cache
from attnfuse.runtime.compiler import compiler_fingerprint
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.launch import KernelLaunch

TARGETS = ("auto", "gluon", "triton")

GLUON_MIN_WORK = 32 * 1024 * 1024
"""`auto` takes the Gluon forward at head dim 128 when a head's (query, key) pairs the kernel
visits (half of Nq x Nk under a causal band) reach this. On the H200 (Triton 3.6, Llama-3-8B
heads, bf16) it was faster than the portable kernel at causal 8192 and dense 8192 (1.113 vs
1.132 ms, 2.229 vs 2.431 ms) and not faster at causal and dense 4096 (0.297 vs 0.291, 0.550 vs
0.542), nor at head dim 64 anywhere (bench/results/20261201T160742Z-gluon-forward.md)."""


def forward_target() -> str:
    """The user's choice (`ATTNFUSE_FORWARD_TARGET`), checked."""
    target = os.environ.get("ATTNFUSE_FORWARD_TARGET", "auto")
    if target not in TARGETS:
        raise ArgumentError(f"ATTNFUSE_FORWARD_TARGET={target!r}: expected one of {', '.join(TARGETS)}")
    return target


@cache
def gluon_importable() -> bool:
    """Whether this Triton has Gluon's Hopper language (TMA, mbarrier, warpgroup MMA)."""
    try:
        from triton.experimental.gluon.language.nvidia import hopper  # noqa: F401
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def prefers_gluon(problem: Problem, causal: bool) -> bool:
    """`auto`'s measured rule (`GLUON_MIN_WORK`)."""
    work = problem.seq_q * problem.seq_k * (0.5 if causal else 1.0)
    return problem.head_dim == 128 and work >= GLUON_MIN_WORK


def fits(problem: Problem) -> bool:
    """Whether the Gluon schedule covers this shape: whole query and key blocks (the
    descriptors cover [B*H*N, D] views, so a partial block would reach the next head's rows)."""
    from attnfuse.lowering.gluon import BLOCK_M, BLOCK_N, HEAD_DIMS

    return (problem.seq_q % BLOCK_M == 0 and problem.seq_k % BLOCK_N == 0
            and problem.head_dim in HEAD_DIMS and problem.head_dim_v == problem.head_dim
            and problem.dtype in (torch.float16, torch.bfloat16))


@cache
def _gluon_module(source: str) -> Any:
    """The generated Gluon source, stored under the kernel cache and imported (Gluon's JIT
    reads a kernel's source from its file, as Triton's does)."""
    digest = hashlib.sha256((source + compiler_fingerprint()).encode()).hexdigest()
    path = kernel_cache.cache_dir() / f"gluon_{digest[:32]}.py"
    if not path.exists() or path.read_text() != source:
        kernel_cache._atomic_write(path, source)
    name = f"attnfuse_gluon_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class GluonLaunch:
    """The forward launch of a plan on the Gluon target; `portable` runs calls whose tensors a
    descriptor cannot cover. Shaped like `KernelLaunch` where the runtime reads it (`info`,
    `check_grid`, calling it with the call's tensors)."""

    portable: KernelLaunch
    kernel: Any
    problem: Problem
    sm_scale: float
    operands: tuple[str, str, str, str]
    """The roles read and written through descriptors: q (or q_rot), k (or k_rot), v, o."""

    @property
    def info(self):
        return self.portable.info

    def check_grid(self) -> None:
        self.portable.check_grid()

    def __call__(self, tensors: dict[str, torch.Tensor]) -> None:
        q, k, v = (tensors[role] for role in self.operands[:3])
        if not all(_descriptor_ready(t) for t in (q, k, v)):
            self.portable(tensors)
            return
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from attnfuse.lowering.gluon import BLOCK_M, BLOCK_N, MAX_REGISTERS, NUM_WARPS

        p = self.problem
        dtype = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
        dim = p.head_dim
        row_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, dim], dtype)
        key_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, dim], dtype)
        o = tensors[self.operands[3]]
        descs = [
            TensorDescriptor.from_tensor(q.view(-1, dim), [BLOCK_M, dim], row_layout),
            TensorDescriptor.from_tensor(k.view(-1, dim), [BLOCK_N, dim], key_layout),
            TensorDescriptor.from_tensor(v.view(-1, dim), [BLOCK_N, dim], key_layout),
            TensorDescriptor.from_tensor(o.view(-1, dim), [BLOCK_M, dim], row_layout),
        ]
        pointers: list[object] = []
        for role in self.portable.info.roles:
            if role in self.operands:
                continue
            t = tensors[role]
            pointers.append(t)
            if tile.role_axes(role):
                pointers.extend(t.stride())
        grid = (p.batch * p.heads_q, p.seq_q // BLOCK_M)
        self.kernel[grid](*descs, *pointers, self.sm_scale, p.seq_q, p.seq_k, p.heads_q, p.group_size,
                          num_warps=NUM_WARPS, maxnreg=MAX_REGISTERS)


def _descriptor_ready(t: torch.Tensor) -> bool:
    """Whether `t` is one [B*H*N, D] row-major block of memory, 16-byte aligned."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0


def gluon_forward(
    launches: list[KernelLaunch], problem: Problem, sm_scale: float,
    tile_module: Callable[[], ModuleOp], causal: bool,
) -> list[Any]:
    """`launches` with the forward replaced by its Gluon launch where this GPU, the user's
    choice, the shape and the variant allow it (unchanged otherwise). `tile_module` gives the
    plan's tile IR (built only when everything else allows Gluon)."""
    target = forward_target()
    if target == "triton" or problem.device.type != "cuda" or not gluon_importable():
        return launches
    if torch.cuda.get_device_capability(problem.device) != (9, 0) or not fits(problem):
        return launches
    if target == "auto" and not prefers_gluon(problem, causal):
        return launches
    from attnfuse.lowering.gluon import GluonUnsupported, emit_gluon_kernel

    forward = next((op for op in tile_module().ops
                    if isinstance(op, tile.KernelOp) and op.sym_name.data == "attention_fwd"), None)
    if forward is None:
        return launches
    try:
        program = emit_gluon_kernel(forward)
    except GluonUnsupported:
        return launches  # the portable kernel covers every variant
    kernel = getattr(_gluon_module(program.source), "attention_fwd")
    return [GluonLaunch(launch, kernel, problem, sm_scale, program.kernels[0].operands) if launch.info.name == "attention_fwd" else launch
            for launch in launches]


__all__ = ["GLUON_MIN_WORK", "GluonLaunch", "forward_target", "gluon_forward", "prefers_gluon"]
