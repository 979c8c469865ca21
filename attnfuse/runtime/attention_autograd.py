"""The autograd node of a training call: `_AttentionFunction` saves what the backward kernels
need, and `apply_attention` makes the node (through the C apply where this torch allows it,
`runtime/direct_apply.py`). Gradients computed under `create_graph=True` refuse a second
derivative (`_NoSecondDerivative`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from attnfuse.errors import ArgumentError, AttnFuseError
from attnfuse.runtime.call_plan import (
    LIST_SOURCES,
    REREAD_BY_BACKWARD,
    CallPlan,
    records_autograd,
)
from attnfuse.runtime.direct_apply import c_apply, direct_apply_supported
from attnfuse.runtime.tensor_cache import tensor_state

if TYPE_CHECKING:
    from attnfuse.runtime.api import CompiledAttention


def _save_context(ctx, fn: CompiledAttention, plan: CallPlan, data: dict, q: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                  lse: torch.Tensor, rotated: dict[str, torch.Tensor]) -> None:
    """What a training call's node keeps for its backward (`_AttentionFunction`,
    `_AttentionUnderTransform`)."""
    # The kernels read the broadcast view in `data`; the user's bias is an input so that
    # autograd sees it, and its shape is where its gradient is summed to.
    ctx.bias_layout = None if bias is None else (bias.shape, bias.dtype)
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


def _backward(ctx, grad_out: torch.Tensor | None, grad_lse: torch.Tensor | None,
              transformed: bool = False) -> tuple:
    """The backward kernels' gradients of q, k, v and the bias (`_AttentionFunction`); with
    `transformed`, of a node made under a functorch transform (`_AttentionUnderTransform`)."""
    saved = ctx.saved_tensors  # unpacked once: each access unpacks them all again
    # What the gradients depend on, as autograd (or the transform) tracks it.
    depends_on = (*saved, grad_out, grad_lse)
    for argument, given, state in ctx.read_states:
        if tensor_state(given) != state:
            # As autograd refuses a saved tensor changed in place: the backward would read
            # the new data, not what the forward used.
            raise ArgumentError(
                f"{argument} was modified in place between the forward and the backward; "
                f"the backward needs the forward's {argument} (pass a copy, or change it "
                "after the backward)")
    if transformed:
        # Under torch.func.grad / vjp the saved tensors and the incoming gradients are the
        # transform's wrappers: the kernels read the tensors below them (the gradients
        # returned are constants there; a second derivative is refused below, at the
        # transform's level).
        saved = tuple(_below_transforms(t) for t in saved)
        grad_out = None if grad_out is None else _below_transforms(grad_out)
        grad_lse = None if grad_lse is None else _below_transforms(grad_lse)
        # A vmap below them (per-sample gradients: vmap(grad(f)), jacrev) batches what the
        # backward reads, the operands or the incoming gradients; its kernels take one set.
        if any(t is not None and _is_batched(t) for t in (*saved, grad_out, grad_lse)):
            raise ArgumentError(VMAP_BACKWARD)
        # What the backward allocates must be plain tensors too, not the transform's.
        with torch._C._DisableFuncTorch():
            grads = _kernel_gradients(ctx, saved, grad_out, grad_lse)
    else:
        grads = _kernel_gradients(ctx, saved, grad_out, grad_lse)
    if torch.is_grad_enabled():  # create_graph=True (always, under torch.func.grad)
        grads = _without_second_derivative(grads, depends_on)
    return None, None, None, *grads


def _kernel_gradients(ctx, saved: tuple[torch.Tensor, ...], grad_out: torch.Tensor | None,
                      grad_lse: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """(dq, dk, dv, dbias) from the backward kernels, dbias summed onto the bias's shape."""
    if grad_out is None:
        grad_out = torch.zeros_like(saved[3])
    dq, dk, dv, dbias = ctx.fn.backward(ctx.plan, ctx.data, saved, grad_out, grad_lse,
                                        ctx.needs_input_grad[6], ctx.saved_roles)
    if dbias is not None:
        # Summed over the broadcast dims in fp32, then rounded once to the bias's type.
        shape, dtype = ctx.bias_layout
        dbias = dbias.sum_to_size(shape).to(dtype)
    return dq, dk, dv, dbias


class _AttentionFunction(torch.autograd.Function):
    """Autograd glue: saves q, k, v, the output and the log-sum-exp (never the score matrix);
    the backward kernels recompute the rest. For q and k it saves the forward's rotated copy
    instead where the backward reads that copy (`CompiledAttention.training_key`): no rotation
    in the backward, at the cost of the copies' memory until the backward (which replaces
    q's and k's where nothing else keeps those alive; the interpreter's copies of bf16 inputs
    are fp32, twice the size)."""

    @staticmethod
    def forward(ctx, fn: CompiledAttention, plan: CallPlan, data, q, k, v, bias):  # type: ignore[override]
        rotated: dict[str, torch.Tensor] = {}
        out, lse = fn.forward(plan, data, q, k, v, rotated)
        _save_context(ctx, fn, plan, data, q, k, v, bias, out, lse, rotated)
        return out, lse

    backward = staticmethod(_backward)  # no wrapper frame: a training step's host time counts

    @staticmethod
    def jvp(ctx, *tangents):  # type: ignore[override]
        raise ArgumentError(FORWARD_AD)


VMAP_BACKWARD = (
    "torch.func.vmap over the backward of an AttnFuse call (jacrev, vmap over grad or vjp: "
    "per-sample gradients) is not supported: the backward kernels take one set of gradients; "
    "loop over them (jacrev(..., chunk_size=1) does), or vmap the forward only")
"""The error of a backward that a vmap transform batches."""

FORWARD_AD = (
    "forward-mode derivatives of attention (torch.func.jvp, jacfwd, torch.autograd.forward_ad) "
    "are not implemented: use reverse mode (backward, torch.func.grad, vjp, jacrev without vmap)")
"""The error of a forward-mode derivative through a call."""

TRACED_TRANSFORM = (
    "torch.func transforms (grad, vjp, vmap, jvp) of an AttnFuse call inside a function that "
    "torch.compile or torch.export traces are not supported: apply the transform outside the "
    "compiled function, or use the compiled function's own autograd (loss.backward())")
"""The error of a functorch transform that a tracer sees around a call."""

VMAP_DATA = (
    "torch.func.vmap over an AttnFuse call with call-time data (bias=, block_layout=, doc_ids=, "
    "positions) is not supported: loop over the mapped dimension, or fold it into the batch")
"""The error of a vmapped call that passes call-time data."""

_functorch = getattr(torch._C, "_functorch", None)
"""torch's functorch bindings (wrapper inspection, the interpreter stack), or None."""

_is_batched = getattr(_functorch, "is_batchedtensor", lambda _t: False)
"""Whether a tensor is a vmap transform's batched wrapper (its data has no storage to launch on)."""


def _below_transforms(t: torch.Tensor) -> torch.Tensor:
    """`t` without the gradient transforms' wrappers around it (itself outside any)."""
    if _functorch is None:
        return t
    while _functorch.is_functorch_wrapped_tensor(t) and not _functorch.is_batchedtensor(t):
        t = _functorch.get_unwrapped(t)
    return t


class _AttentionUnderTransform(torch.autograd.Function):
    """The training node made under a functorch transform (`torch.func.grad`, `vjp`, `vmap`):
    the same kernels as `_AttentionFunction` in the form functorch takes (a `forward` without
    `ctx`, then `setup_context`), run on the tensors below the transform's wrappers. The
    backward rotates q and k itself where it reads rotated copies (the copies are the
    forward's own, not saved here). Under `vmap` the mapped dimension is folded into the
    batch (`vmap`)."""

    generate_vmap_rule = False

    @staticmethod
    def forward(fn: CompiledAttention, plan: CallPlan, data, q, k, v, bias):  # type: ignore[override]
        # The kernels read, and the forward allocates, plain tensors: below every transform.
        q, k, v = _below_transforms(q), _below_transforms(k), _below_transforms(v)
        data = {name: _below_transforms(t) if isinstance(t, torch.Tensor) else t for name, t in data.items()}
        with torch._C._DisableFuncTorch():
            return fn.forward(plan, data, q, k, v)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        fn, plan, data, q, k, v, bias = inputs
        out, lse = output
        # The call's data as the kernels read it (functorch hands it over wrapped).
        data = {name: _below_transforms(t) if isinstance(t, torch.Tensor) else t for name, t in data.items()}
        _save_context(ctx, fn, plan, data, q, k, v, bias, out, lse, {})

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        return _backward(ctx, grad_out, grad_lse, transformed=True)

    @staticmethod
    def vmap(info, in_dims, fn: CompiledAttention, plan: CallPlan, data, q, k, v, bias):  # type: ignore[override]
        """The call over a vmapped dimension as one call whose batch holds it: q, k and v
        moved to the front, an unmapped one expanded, then `[V * B, ...]`. Call-time data
        (a bias, layouts, ids, positions) is not folded: such calls are refused."""
        _fn, _plan, _data, q_dim, k_dim, v_dim, _bias = in_dims
        if data or bias is not None:
            raise ArgumentError(VMAP_DATA)
        size = info.batch_size

        def folded(t: torch.Tensor, dim: int | None) -> torch.Tensor:
            t = t.expand(size, *t.shape) if dim is None else t.movedim(dim, 0)
            return t.reshape(size * t.shape[1], *t.shape[2:])
        q2, k2, v2 = folded(q, q_dim), folded(k, k_dim), folded(v, v_dim)
        # Through the node again (below this vmap: another transform, or plain autograd), so
        # that the folded call is differentiated like any other.
        out, lse = call_under_transform(fn, q2, k2, v2, None, {}, None, None, records_autograd(q2, k2, v2))
        return (out.view(size, -1, *out.shape[1:]), lse.view(size, -1, *lse.shape[1:])), (0, 0)

    @staticmethod
    def jvp(ctx, *tangents):  # type: ignore[override]
        raise ArgumentError(FORWARD_AD)


def refuse_forward_ad(*tensors: object) -> None:
    """`ArgumentError(FORWARD_AD)` if, under an eager dual level (`torch.autograd.forward_ad`),
    one of `tensors` carries a tangent: the kernels would drop it and return no tangent."""
    import torch.autograd.forward_ad as forward_ad

    if forward_ad._current_level < 0:  # no dual level: no tangents
        return
    for t in tensors:
        if isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None:
            raise ArgumentError(FORWARD_AD)


transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
"""Whether a functorch transform (`torch.func.grad`, `vjp`, `vmap`, ...) is active."""


def differentiating_transforms() -> bool:
    """Whether an active functorch transform is one the operators have no rule for (grad,
    vjp, jvp, vmap), rather than only functionalization (`torch.func.functionalize`)."""
    stack = _functorch.get_interpreter_stack() if _functorch is not None else None
    functionalize = getattr(getattr(_functorch, "TransformType", None), "Functionalize", None)
    return bool(stack) and any(interpreter.key() != functionalize for interpreter in stack)


def call_under_transform(
    fn: CompiledAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    bias: torch.Tensor | None, data: dict[str, Any], q_positions: torch.Tensor | None,
    k_positions: torch.Tensor | None, training: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(out, lse)` of a call under a functorch transform, through `_AttentionUnderTransform`
    (training or not: a vmap's batched tensors must not reach a kernel). The plan and the
    call's data are made from the tensors below the transforms with functorch disabled, so
    that what the plan keeps across calls (rotation tables, block lists, scratch buffers) is
    plain tensors, never a transform's wrappers that die with it."""
    arguments = {**data, "bias": bias, "q_positions": q_positions, "k_positions": k_positions}
    if any(_is_batched(_below_transforms(t)) for t in arguments.values() if isinstance(t, torch.Tensor)):
        raise ArgumentError(VMAP_DATA)
    if any(_is_batched(_below_transforms(t)) for t in (q, k, v)):
        # A vmap's call: its rule folds the mapped dimension and plans the folded call.
        if data or bias is not None or q_positions is not None or k_positions is not None:
            raise ArgumentError(VMAP_DATA)
        return _AttentionUnderTransform.apply(fn, None, {}, q, k, v, None)
    explicit = (q_positions is not None, k_positions is not None)
    with torch._C._DisableFuncTorch():
        plain = {name: _below_transforms(t) if isinstance(t, torch.Tensor) else t
                 for name, t in arguments.items()}
        plan = fn.plan(_below_transforms(q), _below_transforms(k), _below_transforms(v), explicit, training)
        bound = fn.call_tensors(plan, plain, explicit)
    # The user's bias goes in as an input of its own so autograd tracks it.
    return _AttentionUnderTransform.apply(fn, plan, bound, q, k, v, bias if "bias" in bound else None)


DIRECT_APPLY = direct_apply_supported()
"""Whether training calls make their autograd node through the C apply directly
(`apply_attention`): this torch's `Function.apply` has the preamble that reproduces, checked
once at import (`runtime/direct_apply.py`)."""

_function_apply = c_apply(_AttentionFunction)
"""`torch._C._FunctionBase.apply` bound to `_AttentionFunction`: the autograd node's creation,
which `Function.apply` calls after its Python preamble."""

if DIRECT_APPLY:  # read once, here: the per-call path looks up no attributes of torch._C
    _unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _apply_direct(
    fn: CompiledAttention, plan: CallPlan, data: dict[str, torch.Tensor],
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_AttentionFunction.apply(fn, plan, data, q, k, v, bias)` without `Function.apply`'s
    Python frames: it only unwraps the tensors of transforms that have exited ("dead
    wrappers") and calls the C apply (`EXPECTED_PREAMBLE`). Never under an active functorch
    transform: the call path takes `call_under_transform` first."""
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
    def forward(count: int, *tensors: torch.Tensor):  # type: ignore[override]
        # Detached, not views: autograd forbids in-place changes of a multi-output Function's
        # views, and callers may scale or clip gradients in place.
        return tuple(g.detach() for g in tensors[:count])

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        """Nothing to keep (the form functorch's transforms take: under `torch.func.grad`
        a nested transform's derivative reaches `backward` too)."""

    @staticmethod
    def backward(ctx, *_grads):  # type: ignore[override]
        raise AttnFuseError(
            "second derivatives of attention are not implemented: a gradient that AttnFuse "
            "computed with create_graph=True was differentiated again (a gradient penalty or "
            "a Hessian-vector product through the attention)"
        )
