"""The Hopper (Gluon) backward: which calls it takes (helper B's; only the hook for now)."""

from __future__ import annotations

from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.program import Canonical


def takes_gluon_backward(problem: Problem, variant: Canonical) -> bool:
    """Whether the backward of a call of this shape and variant runs the Gluon fused
    backward (which `backward_choice.choose_backward` then picks where the fused backward is
    allowed). No Gluon backward is printed yet: the kernel's shape is read by
    `dialects.backward_shape.backward_kernel`, the printer and launches are still to come
    (docs/architecture.md §6.7). False."""
    del problem, variant
    return False


__all__ = ["takes_gluon_backward"]
