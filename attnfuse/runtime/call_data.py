"""The checks of a call's call-time data shared by compiled calls and the reference: RoPE
positions, checked against the call's shapes and returned as the view the kernels read
(`positions_view`, `given_positions`, and their range, `position_extent`); data given to a
program that reads none (`refuse_undeclared_data`); tensors in layouts no kernel reads by
strides (`refuse_non_strided`). Each names the argument at fault in an `ArgumentError`. The
data itself is bound by the ops that read it (`DataUse`, `bind`, in `attnfuse/blocks/`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime.inputs import Problem


def refuse_non_strided(arguments: Mapping[str, object]) -> None:
    """An `ArgumentError` naming a call-time tensor that is not a plain strided one (a sparse
    or otherwise laid-out tensor, whose data no kernel reads by strides)."""
    for name, value in arguments.items():
        if isinstance(value, torch.Tensor) and (value.layout is not torch.strided or value.is_nested):
            what = "a nested tensor" if value.is_nested else f"layout {value.layout}"
            raise ArgumentError(f"{name}= must be a dense (strided) tensor, got {what}: pass a plain tensor "
                                "(to_dense(), or to_padded_tensor() for a nested one)")


def positions_view(positions: object, name: str, length: int, problem: Problem) -> torch.Tensor:
    """Call-time RoPE positions as a `[B, N]` integer view (a shared `[N]` gets batch stride
    0)."""
    if not isinstance(positions, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    refuse_non_strided({name: positions})
    if positions.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"{name} must be int32 or int64, got {positions.dtype}")
    if positions.device != problem.device:
        raise ArgumentError(f"{name} is on {positions.device}, but q is on {problem.device}")
    shapes = ([length], [problem.batch, length])
    if list(positions.shape) not in shapes:
        raise ArgumentError(
            f"{name} must have shape [{length}] or [{problem.batch}, {length}], got "
            f"{list(positions.shape)}"
        )
    return positions.expand(problem.batch, length)


def given_positions(program: Any, problem: Problem, arguments: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """The call's `q_positions=` / `k_positions=` that are given, each checked against the
    program (it must have a `rope()`) and the call's shapes, as `positions_view`s by name."""
    views = {}
    for index, (name, length) in enumerate((("q_positions", problem.seq_q), ("k_positions", problem.seq_k))):
        given = arguments.get(name)
        if given is None:
            continue
        if not program.accepts_positions(index):
            raise ArgumentError(f"{name}= given, but {program!r} has no rope()")
        views[name] = positions_view(given, name, length, problem)
    return views


def refuse_undeclared_data(program: Any, declared: Collection[str], arguments: Mapping[str, object],
                           keywords: Mapping[str, str]) -> None:
    """An `ArgumentError` for call-time data (`keywords`: keyword to the block that reads it)
    given to a program whose variant reads no such argument (`declared`)."""
    for name, block in keywords.items():
        if arguments.get(name) is not None and name not in declared:
            raise ArgumentError(f"{name}= given, but {program!r} has no {block}")


MAX_ROPE_POSITION = 2**24
"""Positions beyond this are not exact in fp32, the precision the rotation is defined in."""


def position_extent(view: torch.Tensor, name: str) -> int:
    """`max |position| + 1` of call-time positions (0 for none): how long the RoPE table must
    be. An `ArgumentError` if a position lies beyond `MAX_ROPE_POSITION`. One host sync."""
    if not view.numel():
        return 0
    if view.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ArgumentError(
            f"{name}: a call with call-time RoPE positions reads their range on the host (to "
            "size the rotation table), which a CUDA graph capture cannot do. An attention "
            "call keeps that range per positions tensor: call it once before the capture with "
            "the same, unchanged tensor; rotate_keys reads it on every call")
    # In Python ints: abs(-2**63) overflows int64 (and would pass the bound as negative).
    largest = max(int(view.max()), -int(view.min()))
    if largest > MAX_ROPE_POSITION:
        raise ArgumentError(
            f"{name} must lie in [-{MAX_ROPE_POSITION}, {MAX_ROPE_POSITION}] (fp32 "
            f"represents them exactly), got |position| = {largest}"
        )
    return largest + 1
