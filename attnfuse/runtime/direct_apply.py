"""Making a `torch.autograd.Function`'s node without `Function.apply`'s Python preamble.

Outside functorch's transforms, `Function.apply` (torch/autograd/function.py, as read in torch
2.13) only unwraps the tensors of transforms that have exited ("dead wrappers") and
calls the C apply (`torch._C._FunctionBase.apply`); for a Function without `setup_context`
nothing else. A training call pays that preamble (about a dozen Python calls, a few us of a
step's host time) on every step, so a training call does the same two things without its
frames (`api.apply_attention`).

This leans on torch internals, so it is used only where a feature test at import finds the
interface it was written against (`direct_apply_supported`): the three C functions exist
and `Function.apply`'s source has exactly that preamble. Otherwise, and always under a
functorch transform, the node is made through `Function.apply` itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

EXPECTED_PREAMBLE = (
    "if not torch._C._are_functorch_transforms_active():",
    "args = _functorch.utils.unwrap_dead_wrappers(args)",
    "return super().apply(*args, **kwargs)",
)
"""The code lines of `Function.apply` that the direct path reproduces, in order, from the
transforms test to the C apply (comments dropped: they differ between torch versions)."""


def function_apply_code() -> list[str] | None:
    """`Function.apply`'s code lines, stripped and without comments; None without source."""
    try:
        source = inspect.getsource(torch.autograd.Function.apply)
    except (OSError, TypeError):
        return None
    code = [line.split("#")[0].strip() for line in source.splitlines()]
    return [line for line in code if line]


def direct_apply_supported() -> bool:
    """Whether this torch's `Function.apply` is the one `api.apply_attention` reproduces: the
    C functions it calls exist and the preamble is `EXPECTED_PREAMBLE`."""
    functorch = getattr(torch._C, "_functorch", None)
    function_base = getattr(torch._C, "_FunctionBase", None)
    if not (callable(getattr(torch._C, "_are_functorch_transforms_active", None))
            and callable(getattr(functorch, "unwrap_if_dead", None))
            and callable(getattr(function_base, "apply", None))):
        return False
    code = function_apply_code()
    if code is None:
        return False
    try:
        start = code.index(EXPECTED_PREAMBLE[0])
    except ValueError:
        return False
    return tuple(code[start:start + len(EXPECTED_PREAMBLE)]) == EXPECTED_PREAMBLE


def c_apply(function: type[torch.autograd.Function]) -> Callable[..., Any]:
    """`torch._C._FunctionBase.apply` bound to `function`: what `Function.apply` calls after
    its preamble. `function` must not define `setup_context` (its apply would do more)."""
    if function.setup_context is not torch.autograd.Function.setup_context:
        raise TypeError(f"{function.__name__} defines setup_context: its apply does more")
    return super(torch.autograd.Function, function).apply
