"""Which backward a training call's program is built with: the separate dQ kernels
(FlashAttention-2's split, deterministic) or the fused one, where the dK/dV kernel adds each
block pair's dQ part into an fp32 accumulator: unordered (`lower-to-tile{bwd-dq=fused}`, so
dQ's last bits vary from run to run) or in key-block order (`bwd-dq=ordered`, deterministic)."""

from __future__ import annotations

import os

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime import gluon_backward
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.program import Canonical

BACKWARD_ENV = "ATTNFUSE_BACKWARD"
"""auto (default): `choose_backward`'s rule; fused / ordered / separate: that backward
wherever it is allowed, at any size. fused never overrides determinism (a deterministic call
takes the ordered fused backward instead)."""

BACKWARD_CHOICES = ("auto", "fused", "ordered", "separate")


def backward_request() -> str:
    """The `ATTNFUSE_BACKWARD` setting, checked."""
    value = os.environ.get(BACKWARD_ENV, "auto").strip().lower() or "auto"
    if value not in BACKWARD_CHOICES:
        raise ArgumentError(f"{BACKWARD_ENV} must be one of {', '.join(BACKWARD_CHOICES)}, got {value!r}")
    return value


def unordered_allowed(deterministic: bool) -> bool:
    """Whether the unordered (atomic) fused backward may run: the caller allowed
    non-determinism (`af.compile(..., deterministic=False)`) and torch does not ask for
    deterministic algorithms."""
    return not deterministic and not torch.are_deterministic_algorithms_enabled()


def choose_backward(problem: Problem, variant: Canonical, deterministic: bool,
                    bwd_rope: str = "pre_rotated") -> str:
    """"separate", "fused" or "ordered" (`lower-to-tile`'s `bwd-dq`) for a call's backward.
    `ATTNFUSE_BACKWARD` decides where a fused backward is allowed; on `auto`, a fused one only
    where the Gluon backward takes the call (`gluon_backward.takes_gluon_backward`): the
    portable (Triton) fused backward measured slower than the split on the H200
    (docs/performance.md §8); unordered where the caller allowed it, ordered otherwise.
    `CompiledAttention.compile_key` then keeps `auto`'s fused choice only where the lowered
    kernel is one the Gluon target schedules."""
    request = backward_request()
    ordered = request == "ordered" or not unordered_allowed(deterministic)
    if request == "separate":
        return "separate"
    fused = "ordered" if ordered else "fused"
    if request != "auto":
        return fused
    takes = gluon_backward.takes_gluon_backward(problem, variant, bwd_rope, ordered=ordered)
    return fused if takes else "separate"


__all__ = ["BACKWARD_ENV", "backward_request", "choose_backward", "unordered_allowed"]
