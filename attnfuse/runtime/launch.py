"""Launch generated kernels: bind tensors to roles, pass strides and scalars, size the grid.

Everything that depends only on the call's shapes is worked out once, in `prepare`; a call
then only collects pointers and strides.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Callable
from types import SimpleNamespace
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import torch
import triton
from triton.runtime.errors import OutOfResources

from attnfuse.dialects.tile import role_axes
from attnfuse.errors import ArgumentError
from attnfuse.lowering.triton import KernelInfo
from attnfuse.runtime.compiler import CompiledProgram
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.interpreter import interpreting, is_interpreted
from attnfuse.runtime.kv_cache import row_blocks
from attnfuse.runtime.triton_launcher import direct_launcher


LLAMA3_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position")
"""The Llama-3.1 scaling parameters, in the order `attn.rope`'s `llama3_scaling` lists them."""


def rope_frequency(
    theta: float, rotary_dim: int, pair: int, llama3: tuple[float, ...] | None
) -> float:
    """The rotation frequency of one pair, in double precision (`llama3`: the op's Llama-3.1
    scaling parameters, `LLAMA3_SCALING`, or None)."""
    freq = theta ** (-2.0 * pair / rotary_dim)
    if llama3 is None:
        return freq
    scaling = SimpleNamespace(**dict(zip(LLAMA3_SCALING, llama3)))
    # Llama 3.1 scales by wavelength: short ones kept, long ones divided, a blend between.
    wavelength = 2 * math.pi / freq
    if wavelength < scaling.original_max_position / scaling.high_freq_factor:
        return freq
    if wavelength > scaling.original_max_position / scaling.low_freq_factor:
        return freq / scaling.factor
    t = (scaling.original_max_position / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    t = min(max(t, 0.0), 1.0)  # in [0, 1] here; clamped against the quotients' rounding
    return (1 - t) * freq / scaling.factor + t * freq


_rope_tables: dict[tuple, torch.Tensor] = {}


def rope_table(
    theta: float, rotary_dim: int, scaling: tuple[float, ...] | None, device: torch.device, length: int
) -> torch.Tensor:
    """`[2, L, rotary_dim / 2]` fp32: cos and sin of `pos * f_t` for positions `pos < L`
    (L >= length). The angle is the fp32 product of the fp32 position and frequency, as the
    semantics say; cos and sin of it are taken in float64 and rounded. Cached per device and
    grown by doubling, so the kernels read a table rather than evaluate cos and sin."""
    key = (theta, rotary_dim, scaling, device)
    table = _rope_tables.get(key)
    if table is not None and table.shape[1] >= length:
        return table
    size = 1 << max(length - 1, 1).bit_length()
    freqs = [rope_frequency(theta, rotary_dim, t, scaling) for t in range(rotary_dim // 2)]
    inv_freq = torch.tensor(freqs, dtype=torch.float64).to(torch.float32)
    angle = (torch.arange(size, dtype=torch.float32)[:, None] * inv_freq[None, :]).double()
    table = torch.stack([angle.cos(), angle.sin()]).to(device=device, dtype=torch.float32)
    _rope_tables[key] = table
    return table


def default_scale(head_dim: int) -> float:
    """`1/sqrt(D)`, the scale of `scaled_dot_product()` without an argument."""
    return 1.0 / math.sqrt(head_dim)


MAX_RUNNERS = 32
"""Direct launchers kept per launch (one per argument specialization seen)."""


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of a compiled variant, ready to launch for one problem shape."""

    info: KernelInfo
    kernel: Any
    grid: tuple[int, int]
    scalars: tuple[object, ...]
    strided: tuple[bool, ...]
    """Per role, whether its strides follow its pointer (all but contiguous vectors)."""

    stages: list[int]
    """The pipelining depth launched with: the kernel's `num_stages`, lowered by `__call__`
    if it does not fit (a one-element list, so that the frozen launch can update it)."""

    allocates: ClassVar[bool] = False
    """Whether every call of the launch allocates (none of the portable kernels does; see
    `GluonBackwardLaunch.allocates`): a schedule with such a launch gets no launch graph
    (`KernelExecution._graphs`)."""

    runners: dict[tuple, Callable[[list[object]], bool]] = field(
        default_factory=dict, repr=False, compare=False)
    """Compiled kernels' direct launchers (`triton_launcher.direct_launcher`, holding the
    scalars and the constexpr values, `SHARED_OFFSETS` included: see `shares_offsets`), by
    the arguments' specialization (see `arguments`). A launcher is bound to the device that
    was current at its first launch, as the JIT's cache is, and declines on another."""

    @cached_property
    def _roles(self) -> Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]]:
        """The tensors of the kernel's roles, in order, from a call's tensors (one C call)."""
        roles = self.info.roles
        getter = operator.itemgetter(*roles)
        return getter if len(roles) > 1 else lambda tensors: (getter(tensors),)

    def arguments(self, tensors: dict[str, torch.Tensor]) -> tuple[list[object], tuple]:
        """The kernel's runtime arguments before the scalars, as its compiled launcher takes
        them (each role's data pointer, as an int, then its strides), and their
        specialization: what Triton specializes a compiled kernel on, each tensor's dtype and
        16-byte alignment and each integer's value (the scalars are fixed per launch).

        The pointers go as ints, which the launcher passes on as they are (for a tensor it
        calls `data_ptr()` and asks the driver whether the address is device memory): every
        tensor a launch reads is on the call's device, which the checks of q, k, v and of
        each call-time tensor (bias, layouts, positions, cache lengths) ensure, and the rest
        the runtime allocates there."""
        # Once per launch and per call, for every role: kept to the few attribute reads the
        # specialization needs (a training step makes up to 8 launches of up to 9 roles).
        args: list[object] = []
        specialization: list[tuple] = []
        add, extend, key = args.append, args.extend, specialization.append
        if self._all_strided:
            for t in self._roles(tensors):
                stride = t.stride()
                pointer = t.data_ptr()
                add(pointer)
                extend(stride)
                key((t.dtype, pointer & 15, stride))
        else:
            for t, strided in zip(self._roles(tensors), self.strided):
                pointer = t.data_ptr()
                add(pointer)
                if strided:
                    stride = t.stride()
                    extend(stride)
                    key((t.dtype, pointer & 15, stride))
                else:
                    key((t.dtype, pointer & 15))
        return args, tuple(specialization)

    def jit_arguments(self, tensors: dict[str, torch.Tensor]) -> list[object]:
        """The arguments of `arguments` with the tensors themselves in place of their
        pointers: what the JIT (and the CPU interpreter) binds and specializes."""
        args: list[object] = []
        for t, strided in zip(self._roles(tensors), self.strided):
            args.append(t)
            if strided:
                args.extend(t.stride())
        return args

    @cached_property
    def _all_strided(self) -> bool:
        return all(self.strided)

    def shares_offsets(self, tensors: dict[str, torch.Tensor]) -> bool:
        """The kernel's `SHARED_OFFSETS` for these tensors: whether the follower role's row and
        column strides equal the leader's (`KernelInfo.shared_offsets`)."""
        pair = self.info.shared_offsets
        if pair is None:
            return False
        follower, leader = (tensors[role].stride()[-2:] for role in pair)
        return follower == leader

    def check_grid(self) -> None:
        """Raises `ArgumentError` if the grid has more row blocks than CUDA's axis 1 holds (a
        head-major grid has them on axis 0, which holds 2^31 - 1)."""
        check_row_blocks(self.info.name, self.info.grid, self.grid[1], self.info.block_m)

    def __call__(self, tensors: dict[str, torch.Tensor]) -> None:
        args, specialization = self.arguments(tensors)
        launch = self.runners.get(specialization)
        # The compiled kernel's own launcher (`triton_launcher.direct_launcher`): skips the
        # JIT's per-call argument binding and specialization and Triton's per-launch device,
        # metadata and hook work (most of a launch's host time, and a step launches up to 8).
        # It declines (False) when another device is current than the one it was loaded on.
        if launch is not None and launch(args):
            return
        # The specialization holds every strided role's strides, so it decides SHARED_OFFSETS
        # too: worked out here, once per specialization, not on the direct path above.
        shared = self.shares_offsets(tensors)
        compiled = self.launch_jit(self.jit_arguments(tensors), shared)
        if launch is None and _launchable(compiled) and self.constexpr_params is not None and (
            len(self.kernel.params) == len(args) + len(self.scalars) + len(self.constexpr_params)
        ):
            if len(self.runners) >= MAX_RUNNERS:
                # Views of ever-changing layouts (strides) would otherwise grow this forever;
                # the JIT keeps its own compiled kernels, so forgetting costs one slow launch.
                self.runners.clear()
            # A compiled kernel's launcher takes all three grid dimensions.
            # The scalars and constexpr values follow the tensors, the same every call.
            trailing = (*self.scalars, *self.constexpr_values(shared))
            self.runners[specialization] = direct_launcher(compiled, (*self.grid, 1), trailing)

    @cached_property
    def constexpr_params(self) -> tuple[Any, ...] | None:
        """The kernel's trailing constexpr parameters, whose values a compiled kernel's
        launcher takes after the runtime arguments; None if the parameters are not laid out
        that way (then every launch goes through the JIT)."""
        params = self.kernel.params
        first = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
        if not all(p.is_constexpr for p in params[first:]):
            return None
        return tuple(params[first:])

    def constexpr_values(self, shared: bool) -> tuple[object, ...]:
        """The values of `constexpr_params`: their defaults, with `SHARED_OFFSETS` set to
        `shared` where the kernel has it (found by name, wherever the emitter put it)."""
        params = self.constexpr_params
        assert params is not None
        return tuple(shared if p.name == "SHARED_OFFSETS" else p.default for p in params)

    def launch_jit(self, args: list[object], shared: bool = False) -> object:
        """Launches through the JIT (compiling on first use); returns what it launched.
        `shared`: the kernel's `SHARED_OFFSETS` (`shares_offsets`), where it has one."""
        flags: dict[str, bool] = {"SHARED_OFFSETS": shared} if self.info.shared_offsets is not None else {}
        if self.info.launch_pdl:
            # A compile option that the launcher reads from the compiled kernel's metadata, so
            # the direct launcher (`triton_launcher`) launches it as a dependent too.
            flags["launch_pdl"] = True
        while True:
            try:
                with interpreting() if is_interpreted(self.kernel) else contextlib.nullcontext():
                    return self.kernel[self.grid](
                        *args, *self.scalars, **flags, num_warps=self.info.num_warps,
                        num_stages=self.stages[0])
            except OutOfResources:
                # Software pipelining keeps `num_stages` copies of the loop's operands in shared
                # memory; a variant that loads more per step (a bias tile, say) may not fit the
                # configured depth. One stage less is the smallest change that fits.
                if self.stages[0] <= 1:
                    raise
                self.stages[0] -= 1


def _launchable(compiled: object) -> bool:
    """Whether the JIT returned a compiled GPU kernel that can be launched directly (the CPU
    interpreter returns none). `packed_metadata` is what the JIT itself hands the compiled
    kernel's launcher; its absence means an interface this code does not know."""
    return hasattr(compiled, "packed_metadata") and hasattr(compiled, "__getitem__")


MAX_GRID_BLOCKS = 65535
"""CUDA's limit on a grid's axis 1 (y), which holds the row blocks (axis 0 holds 2^31 - 1)."""


def check_row_blocks(kernel: str, grid: str, blocks: int, block_m: int) -> None:
    """Raises `ArgumentError` if a kernel's grid needs more row blocks of `block_m` rows on
    axis 1 than CUDA allows (`grid`: the kernel's `tile.GRIDS` kind)."""
    if blocks > MAX_GRID_BLOCKS:
        rows, plural = ("query", "queries") if grid == "query_blocks" else ("key", "keys")
        raise ArgumentError(
            f"{kernel}: the {rows} sequence needs {blocks} blocks of {block_m} rows, more than "
            f"the {MAX_GRID_BLOCKS} that CUDA's grid axis 1 holds; at most "
            f"{MAX_GRID_BLOCKS * block_m} {plural} per call")


def launch_grid(rows: int, block_rows: int, batch_heads: int) -> tuple[int, int]:
    """The grid of a kernel with one program per (batch x head, block of `block_rows` rows):
    (batch x head) on axis 0 and the blocks on axis 1, the order the emitted prologue reads
    (longest programs first, lowering/triton/core.py). The block count is checked against
    MAX_GRID_BLOCKS when a call first schedules the kernel (`KernelLaunch.check_grid`, from
    `CompiledAttention._run`), so that a kernel a call never launches (a backward kernel, in
    a forward-only call) cannot fail it, and the launch path itself checks nothing."""
    return (batch_heads, triton.cdiv(rows, block_rows))


def prepare(
    compiled: CompiledProgram, problem: Problem, sm_scale: float,
    splits: tuple[int, int] | None = None,
) -> list[KernelLaunch]:
    """The launches of every kernel of `compiled`, in order, for `problem`; `splits` is a
    decode's (number of splits, keys per split), `kv_cache.split_plan`."""
    launches = []
    for info in compiled.program.kernels:
        if info.grid == "kv_splits":
            assert splits is not None
            # Axis 0: (batch x key/value head x block of the group's rows); axis 1: splits.
            blocks = row_blocks(problem, info.block_m)
            grid = (problem.batch * problem.heads_kv * blocks, splits[0])
            num_heads = problem.heads_kv
        else:
            if info.grid == "query_blocks":
                rows, num_heads = problem.seq_q, problem.heads_q
            elif info.grid == "appended_keys":
                # A cache append's problem: the new keys as `seq_q`, the cache's capacity
                # as `seq_k` (`cache_append.append_kv`).
                rows, num_heads = problem.seq_q, problem.heads_kv
            else:
                rows, num_heads = problem.seq_k, problem.heads_kv
            grid = launch_grid(rows, info.block_m, problem.batch * num_heads)
            if info.head_major:
                grid = (grid[0] * grid[1], 1)  # one axis, heads outermost (`KernelInfo.head_major`)
        scalars: tuple[object, ...] = (sm_scale, problem.seq_q, problem.seq_k, num_heads, problem.group_size)
        if info.splits:
            assert splits is not None
            scalars += splits
        if info.paged:
            assert problem.pages > 0, "a paged call's pools hold pages (check_cache_arguments)"
            scalars += (problem.pages,)
        strided = tuple(bool(role_axes(role)) for role in info.roles)
        launches.append(KernelLaunch(info, compiled.function(info.name), grid, scalars, strided,
                                     [info.num_stages]))
    return launches
