"""What a call of one shape runs (`CallPlan`), and the names the call path shares: the roles of
the pre-rotation kernels' copies, the backward kernels' prefix, the call-data entries the
backward reads again."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from attnfuse.runtime.compiler import CompiledProgram
from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.kv_cache import CONTIGUOUS, CacheLayout
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.runtime.tensor_cache import TensorCache

LIST_SOURCES = "block_list_sources"
"""The entry of a call's data that holds its listed filters (`ListSource`s), from which the
backward builds its own lists; not a kernel role."""

REREAD_BY_BACKWARD = ("bias", "q_positions", "k_positions")
"""The call-time tensors (their names in a call's data, which are the call's keywords) that
the backward reads again besides the listed filters' (`LIST_SOURCES`): a training call
checks that none was changed in place since its forward."""


@dataclass(frozen=True)
class CallPlan:
    """What a call of one shape runs: decided once per shape, then reused."""

    problem: Problem
    compiled: CompiledProgram | None
    launches: tuple[KernelLaunch, ...]
    constants: dict[str, torch.Tensor]
    """Tensors that depend only on the shape: rotary frequencies, ALiBi slopes."""
    config: TileConfig | None
    schedules: dict[tuple, tuple[tuple[tuple[KernelLaunch, str | None, torch.dtype], ...], Any]] = field(
        default_factory=dict)
    """The launches `KernelExecution._run` makes for a set of kernels (and the rotated copies
    each writes), worked out once, with the `LaunchGraphs` they replay as (or None)."""
    layouts: TensorCache = field(default_factory=TensorCache, compare=False)
    """The block lists of the block-sparse layouts this plan's calls passed, per layout."""
    positions: TensorCache = field(default_factory=TensorCache, compare=False)
    """The largest |position| of the RoPE positions this plan's calls passed."""
    cache: CacheLayout = CONTIGUOUS
    """How the call's keys are held (per-sequence lengths, pages)."""
    splits: tuple[int, int] | None = None
    """A split-KV decode's (number of splits, keys per split); None for the forward kernel."""
    binds_nothing: bool = False
    """Whether the plan's program reads no call-time data (no bias, layout, ids, positions):
    a call that passes none binds nothing (`CompiledAttention.call_tensors` would return
    `{}`), so `__call__` skips it."""
    scratch: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)
    """Buffers that kernels write and no one reads, kept across calls instead of allocated
    per call: the log-sum-exp of inference calls that do not return it (`forward`)."""

    def reads(self, role: str) -> bool:
        """Whether any kernel of the plan takes a tensor of `role` (the compiled program, not
        the spec, says which buffers a call must provide)."""
        return role in self.roles

    def backward_reads(self, role: str) -> bool:
        """Whether a backward kernel of the plan takes a tensor of `role`."""
        return role in self.backward_roles

    # Asked on every call (the per-call paths test membership directly, without a method
    # call): worked out once per plan.
    @cached_property
    def roles(self) -> frozenset[str]:
        """The roles any kernel of the plan takes (`reads`)."""
        return frozenset(role for launch in self.launches for role in launch.info.roles)

    @cached_property
    def backward_roles(self) -> frozenset[str]:
        """The roles the plan's backward kernels take (`backward_reads`)."""
        return frozenset(role for launch in self.launches
                         if launch.info.name.startswith(BACKWARD_KERNEL_PREFIX)
                         for role in launch.info.roles)


def records_autograd(*inputs: object) -> bool:
    """Whether autograd records a call with these inputs: grad mode is on and one of them is a
    tensor that requires a gradient."""
    if not torch.is_grad_enabled():
        return False
    for t in inputs:  # a loop, not any(genexpr): asked on every call
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


ROTATION_KERNELS = {"rotate_query": "q_rot", "rotate_key": "k_rot"}
"""The pre-rotation kernels and the rotated copy each writes."""

ROTATED_ROLES = tuple(ROTATION_KERNELS.values())
"""The rotated copies, in the order `forward` hands them back."""

BACKWARD_KERNEL_PREFIX = "attention_bwd"
"""The backward kernels' names start with this (lower_backward.py)."""
