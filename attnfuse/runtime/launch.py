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
from attnfuse.dialects.tile import TENSOR_AXES
from attnfuse.dsl.blocks import Llama3Scaling


def rope_frequency(theta: float, rotary_dim: int, pair: int, scaling: Llama3Scaling | None) -> float:
    """The rotation frequency of one pair, in double precision."""
    freq = theta ** (-2.0 * pair / rotary_dim)
    if scaling is None:
        return freq
    # Llama 3.1 scales by wavelength: short ones kept, long ones divided, a blend between.
    wavelength = 2 * math.pi / freq
    if wavelength < scaling.original_max_position / scaling.high_freq_factor:
        return freq
    if wavelength > scaling.original_max_position / scaling.low_freq_factor:
        return freq / scaling.factor
    t = (scaling.original_max_position / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    return (1 - t) * freq / scaling.factor + t * freq


@lru_cache(maxsize=64)
def inverse_frequencies(
    theta: float, rotary_dim: int, scaling: Llama3Scaling | None, device: torch.device
) -> torch.Tensor:
    """The fp32 frequency table a fused or pre-rotation kernel reads, cached per device."""
    table = [rope_frequency(theta, rotary_dim, t, scaling) for t in range(rotary_dim // 2)]
    return torch.tensor(table, dtype=torch.float64).to(device=device, dtype=torch.float32)


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
    strided: tuple[bool, ...]
    """Per role, whether its strides follow its pointer (all but contiguous vectors)."""

    def __call__(self, tensors: dict[str, torch.Tensor]) -> None:
        args: list[object] = []
        for role, strided in zip(self.info.roles, self.strided):
            t = tensors[role]
            args.append(t)
            if strided:
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
        strided = tuple(bool(TENSOR_AXES[role]) for role in info.roles)
        launches.append(KernelLaunch(info, compiled.function(info.name), grid, scalars, strided))
    return launches
