"""Launch generated kernels: bind tensors to roles, pass strides and scalars, size the grid."""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import triton

from attnfuse.lowering.triton import KernelInfo
from attnfuse.runtime.compiler import CompiledProgram
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.reference import rope_inverse_frequencies


@lru_cache(maxsize=64)
def inverse_frequencies(theta: float, rotary_dim: int, device: torch.device) -> torch.Tensor:
    """The fp32 frequency table a fused or pre-rotation kernel reads, cached per device."""
    return rope_inverse_frequencies(theta, rotary_dim).to(device)


def _grid(info: KernelInfo, problem: Problem) -> tuple[int, int]:
    if info.grid == "query_blocks":
        return (triton.cdiv(problem.seq_q, info.block_m), problem.batch * problem.heads_q)
    return (triton.cdiv(problem.seq_k, info.block_m), problem.batch * problem.heads_kv)


def launch(
    compiled: CompiledProgram,
    name: str,
    problem: Problem,
    tensors: dict[str, torch.Tensor],
    sm_scale: float,
) -> None:
    """Runs kernel `name` with `tensors` bound to its roles."""
    info = compiled.program.kernel(name)
    args: list[object] = []
    for role in info.roles:
        t = tensors[role]
        args.append(t)
        if role != "inv_freq":
            args.extend(t.stride())
    num_heads = problem.heads_q if info.grid == "query_blocks" else problem.heads_kv
    args += [sm_scale, problem.seq_q, problem.seq_k, num_heads, problem.group_size]
    kernel = compiled.function(name)
    kernel[_grid(info, problem)](*args, num_warps=info.num_warps, num_stages=info.num_stages)


def default_scale(head_dim: int) -> float:
    """`1/sqrt(D)`, the scale of `scaled_dot_product()` without an argument."""
    return 1.0 / math.sqrt(head_dim)
