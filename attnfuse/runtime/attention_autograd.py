"""The autograd node of a training call: `_AttentionFunction` saves what the backward kernels
need, and `apply_attention` makes the node (through the C apply where this torch allows it,
`runtime/direct_apply.py`). Gradients computed under `create_graph=True` refuse a second
derivative (`_NoSecondDerivative`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attnfuse.errors import ArgumentError, AttnFuseError
from attnfuse.runtime.call_plan import LIST_SOURCES, REREAD_BY_BACKWARD, CallPlan
from attnfuse.runtime.direct_apply import c_apply, direct_apply_supported
from attnfuse.runtime.tensor_cache import tensor_state

if TYPE_CHECKING:
    from attnfuse.runtime.api import CompiledAttention


class _AttentionFunction(torch.autograd.Function):
    """Autograd glue: saves q, k, v, the output and the log-sum-exp (never the score matrix);
    the backward kernels recompute the rest. For q and k it saves the forward's rotated copy
    instead where the backward reads that copy (`CompiledAttention.training_key`): no rotation
    in the backward, at the cost of the copies' memory until the backward (which replaces
    q's and k's where nothing else keeps those alive; the interpreter's copies of bf16 inputs
    are fp32, twice the size)."""

    @staticmethod
    def forward(ctx, fn: CompiledAttention, plan: CallPlan, data, q, k, v, bias):  # type: ignore[override]
        # The kernels read the broadcast view in `data`; the user's bias is an input so that
        # autograd sees it, and its shape is where its gradient is summed to.
        ctx.bias_layout = None if bias is None else (bias.shape, bias.dtype)
        rotated: dict[str, torch.Tensor] = {}
        out, lse = fn.forward(plan, data, q, k, v, rotated)
        ctx.fn, ctx.plan, ctx.data = fn, plan, data
        # The listed filters' tensors (a layout, document ids) as the forward read them: the
        # backward reads them again (its own block lists, the ids per entry).
        sources = data.get(LIST_SOURCES)
        read = [] if sources is None else [(source.argument, source.given) for source in sources]
        # The bias and RoPE positions are read again too (the scores are recomputed): as the
        # forward read them, or the gradients follow other scores than the output (positions
        # past the forward's rotation table would even be read out of bounds).
        read += [(name, data[name]) for name in REREAD_BY_BACKWARD if name in data]
        ctx.read_states = tuple((argument, t, tensor_state(t)) for argument, t in read)
        # A rotated copy replaces its operand where the backward reads the copy; otherwise
        # the backward gets the operand (and rotates it itself if it must).
        q_saved = rotated["q_rot"] if "q_rot" in rotated and "q_rot" in plan.backward_roles else None
        k_saved = rotated["k_rot"] if "k_rot" in rotated and "k_rot" in plan.backward_roles else None
        ctx.saved_roles = ("q" if q_saved is None else "q_rot", "k" if k_saved is None else "k_rot")
        ctx.save_for_backward(q if q_saved is None else q_saved, k if k_saved is None else k_saved,
                              v, out, lse)
        # An output nobody differentiated (usually lse) arrives as None, not as a tensor of
        # zeros that would cost a fill and a subtraction on the device.
        ctx.materialize_grads = False  # what ctx.set_materialize_grads(False) sets, without its call
        if not fn._has_lse:
            ctx.mark_non_differentiable(lse)  # a normalizer without one (relu)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        fn: CompiledAttention = ctx.fn
        bias_grad = ctx.needs_input_grad[6]
        saved = ctx.saved_tensors  # unpacked once: each access unpacks them all again
        for argument, given, state in ctx.read_states:
            if tensor_state(given) != state:
                # As autograd refuses a saved tensor changed in place: the backward would read
                # the new data, not what the forward used.
                raise ArgumentError(
                    f"{argument} was modified in place between the forward and the backward; "
                    f"the backward needs the forward's {argument} (pass a copy, or change it "
                    "after the backward)")
        if grad_out is None:
            grad_out = torch.zeros_like(saved[3])
        dq, dk, dv, dbias = fn.backward(ctx.plan, ctx.data, saved, grad_out, grad_lse, bias_grad,
                                        ctx.saved_roles)
        if dbias is not None:
            # Summed over the broadcast dims in fp32, then rounded once to the bias's type.
            shape, dtype = ctx.bias_layout
            dbias = dbias.sum_to_size(shape).to(dtype)
        if torch.is_grad_enabled():  # create_graph=True
            dq, dk, dv, dbias = _without_second_derivative((dq, dk, dv, dbias), (*saved, grad_out, grad_lse))
        return None, None, None, dq, dk, dv, dbias


DIRECT_APPLY = direct_apply_supported()
"""Whether training calls make their autograd node through the C apply directly
(`apply_attention`): this torch's `Function.apply` has the preamble that reproduces, checked
once at import (`runtime/direct_apply.py`)."""

_function_apply = c_apply(_AttentionFunction)
"""`torch._C._FunctionBase.apply` bound to `_AttentionFunction`: the autograd node's creation,
which `Function.apply` calls after its Python preamble."""

if DIRECT_APPLY:  # read once, here: the per-call path looks up no attributes of torch._C
    _transforms_active = torch._C._are_functorch_transforms_active
    _unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _apply_direct(
    fn: CompiledAttention, plan: CallPlan, data: dict[str, torch.Tensor],
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_AttentionFunction.apply(fn, plan, data, q, k, v, bias)` without `Function.apply`'s
    Python frames: outside functorch's transforms it only unwraps the tensors of transforms
    that have exited ("dead wrappers") and calls the C apply (`EXPECTED_PREAMBLE`); under a
    transform the call goes through `Function.apply` (which refuses this Function: it has no
    `setup_context`)."""
    if _transforms_active():
        return _AttentionFunction.apply(fn, plan, data, q, k, v, bias)
    return _function_apply(fn, plan, data, _unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v),
                           None if bias is None else _unwrap_if_dead(bias))


apply_attention = _apply_direct if DIRECT_APPLY else _AttentionFunction.apply
"""How a training call makes its autograd node: `_apply_direct` where the feature test at
import passed, else `Function.apply` (the same node, a few us more per step)."""


def _without_second_derivative(
    grads: tuple[torch.Tensor | None, ...], inputs: tuple[torch.Tensor | None, ...]
) -> tuple[torch.Tensor | None, ...]:
    """`grads` attached to a node that raises if differentiated. Under create_graph=True the
    gradients should depend on q, k, v and dO through a graph; the kernels make none, so a
    second derivative would otherwise treat them as constants and drop their terms."""
    depends_on = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not depends_on:
        return grads  # nothing they depend on is differentiable: constants are the truth
    present = [i for i, g in enumerate(grads) if g is not None]
    attached = _NoSecondDerivative.apply(len(present), *(grads[i] for i in present), *depends_on)
    result = list(grads)
    for i, g in zip(present, attached):
        result[i] = g
    return tuple(result)


class _NoSecondDerivative(torch.autograd.Function):
    """Passes first-order gradients through unchanged, as outputs that depend on what they
    were computed from (`depends_on`), and raises if anything is differentiated through
    them: the attention backward has no derivative of its own."""

    @staticmethod
    def forward(ctx, count: int, *tensors: torch.Tensor):  # type: ignore[override]
        # Detached, not views: autograd forbids in-place changes of a multi-output Function's
        # views, and callers may scale or clip gradients in place.
        return tuple(g.detach() for g in tensors[:count])

    @staticmethod
    def backward(ctx, *_grads):  # type: ignore[override]
        raise AttnFuseError(
            "second derivatives of attention are not implemented: a gradient that AttnFuse "
            "computed with create_graph=True was differentiated again (a gradient penalty or "
            "a Hessian-vector product through the attention)"
        )
