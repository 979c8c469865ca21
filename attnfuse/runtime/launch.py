"""Launch generated kernels: bind tensors to roles, pass strides and scalars, size the grid.

Everything that depends only on the call's shapes is worked out once, in `prepare`; a call
then only collects pointers and strides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

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


def default_scale(head_dim: int) -> float:
    """`1/sqrt(D)`, the scale of `scaled_dot_product()` without an argument."""
    return 1.0 / math.sqrt(head_dim)


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of a compiled variant, ready to launch for one problem shape."""

    info: KernelInfo
    kernel: Any
    grid: tuple[int, int]
    scalars: tuple[object, ...]

    def __call__(self, tensors: dict[str, torch.Tensor]) -> None:
        args: list[object] = []
        for role in self.info.roles:
            t = tensors[role]
            args.append(t)
            if role != "inv_freq":
                args.extend(t.stride())
        self.kernel[self.grid](
            *args, *self.scalars, num_warps=self.info.num_warps, num_stages=self.info.num_stages
        )


def prepare(compiled: CompiledProgram, problem: Problem, sm_scale: float) -> list[KernelLaunch]:
    """The launches of every kernel of `compiled`, in order, for `problem`."""
    launches = []
    for info in compiled.program.kernels:
        if info.grid == "query_blocks":
            grid = (triton.cdiv(problem.seq_q, info.block_m), problem.batch * problem.heads_q)
            num_heads = problem.heads_q
        else:
            grid = (triton.cdiv(problem.seq_k, info.block_m), problem.batch * problem.heads_kv)
            num_heads = problem.heads_kv
        scalars = (sm_scale, problem.seq_q, problem.seq_k, num_heads, problem.group_size)
        launches.append(KernelLaunch(info, compiled.function(info.name), grid, scalars))
    return launches
