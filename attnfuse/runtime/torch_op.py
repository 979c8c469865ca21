"""AttnFuse as PyTorch operators: `torch.ops.attnfuse.attention` and `attention_backward`,
and `attention_cache` for inference calls over a KV cache (`kv_lens=`, `block_table=`).

`torch.compile` and `torch.export` cannot trace the runtime's Python (the compiler is xDSL
code, the launches take raw pointers), so under them a call goes through these two custom
operators instead (`CompiledAttention.__call__` chooses). They are opaque to the tracer: a
fake implementation gives the outputs' shapes, autograd connects the forward to the backward
operator, and at run time each one calls the same eager path as a plain call (kernels
compiled and launched as usual, plans cached per shape).

`torch.library.triton_op` would let Inductor see the Triton kernels, but it traces the
launching code with fake tensors, and AttnFuse generates and specializes its kernels per shape
and configuration at the first call (and launches them through their compiled launchers):
`custom_op` keeps that path whole and costs Inductor only the fusion of neighbouring
pointwise work into the attention kernel, which it could not do for these kernels anyway.

A variant travels through the graph as a string: its attn program (as IR text), the RoPE
placement request and the tile configuration, JSON-encoded (`operator_key`). The process that
runs the graph finds the `CompiledAttention` registered under that string, or, for a graph
loaded elsewhere (`torch.export.load`), compiles the program again from the text.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.inputs import check_backward_operands
from attnfuse.runtime.layout import empty_in_layout_of
from attnfuse.runtime.program import DATA_KEYWORDS

if TYPE_CHECKING:
    from attnfuse.runtime.api import CompiledAttention

_variants: weakref.WeakValueDictionary[str, CompiledAttention] = weakref.WeakValueDictionary()
_rebuilt: dict[str, CompiledAttention] = {}
"""Variants compiled from an operator key that no live `CompiledAttention` had registered
(a loaded exported program): kept, since the graph holding the key may run again."""


def operator_key(
    program_text: str, rope_placement: object, config: TileConfig | None, deterministic: bool = True
) -> str:
    """The string that names a compiled variant in a traced graph."""
    return json.dumps({
        "program": program_text,
        "rope_placement": rope_placement,
        "config": None if config is None else asdict(config),
        "deterministic": deterministic,
    }, sort_keys=True)


def register(key: str, fn: CompiledAttention) -> None:
    """Makes `fn` the variant that graphs naming `key` run."""
    _variants[key] = fn


def variant_for(key: str) -> CompiledAttention:
    """The compiled variant named by an operator key (compiled from the key's text if no live
    variant registered it)."""
    fn = _variants.get(key) or _rebuilt.get(key)
    if fn is None:
        from attnfuse.runtime.api import CompiledAttention

        described = json.loads(key)
        placement = described["rope_placement"]
        config = described["config"]
        fn = CompiledAttention(
            described["program"],
            rope_placement=tuple(placement) if isinstance(placement, list) else placement,
            config=None if config is None else TileConfig(**config),
            deterministic=described.get("deterministic", True),
        )
        _rebuilt[key] = fn
    return fn


DATA_ORDER = tuple(name for name in DATA_KEYWORDS if name != "bias")
"""The call-time data other than the bias (the one with a gradient), in the order the
operators take them, as one list (`block_layout`, `doc_ids`, ...): a block with new data
needs no new operator parameter."""


def data_list(data: dict[str, Tensor | None]) -> list[Tensor | None]:
    """A call's data keywords (other than `bias=`) as the operators' list."""
    return [data.get(name) for name in DATA_ORDER]


def _arguments(bias, data, q_positions, k_positions) -> dict[str, Tensor | None]:
    return {"bias": bias, **dict(zip(DATA_ORDER, data)), "q_positions": q_positions,
            "k_positions": k_positions}


def _explicit(q_positions, k_positions) -> tuple[bool, bool]:
    return (q_positions is not None, k_positions is not None)


@torch.library.custom_op("attnfuse::attention", mutates_args=())
def attention(
    variant: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Optional[Tensor],
    data: list[Optional[Tensor]],
    q_positions: Optional[Tensor],
    k_positions: Optional[Tensor],
    return_lse: bool,
) -> tuple[Tensor, Tensor]:
    """The forward of a compiled variant: `(out, lse)` (lse fp32 `[B, Hq, Nq]`; for a
    normalizer without one, zeros). `return_lse` says whether the caller uses the lse, so
    that the backward ignores a gradient for it otherwise."""
    fn = variant_for(variant)
    explicit = _explicit(q_positions, k_positions)
    plan = fn.plan(q, k, v, explicit, training=False)
    tensors = fn.call_tensors(plan, _arguments(bias, data, q_positions, k_positions), explicit)
    return _defined_lse(fn, fn.forward(plan, tensors, q, k, v))


def _defined_lse(fn: Any, result: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """`result` with the lse of a variant whose normalizer has none (ReLU, sigmoid) set to
    zeros: an operator gives the same outputs for the same inputs (`torch.library.opcheck`
    compares them), never the unwritten buffer the kernels leave."""
    out, lse = result
    return (out, lse) if fn.variant.has_lse else (out, lse.zero_())


@attention.register_fake
def _attention_fake(variant, q, k, v, bias, data, q_positions, k_positions, return_lse):
    from attnfuse.runtime.inputs import check_inputs

    # Shape checks only (they read no data): the call's mistakes surface while tracing.
    problem = check_inputs(variant_for(variant).program, q, k, v)
    out = empty_in_layout_of(q, q.dtype, (problem.batch, problem.heads_q, problem.seq_q, problem.head_dim_v))
    lse = q.new_empty((problem.batch, problem.heads_q, problem.seq_q), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("attnfuse::attention_backward", mutates_args=())
def attention_backward(
    variant: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    grad_lse: Optional[Tensor],
    bias: Optional[Tensor],
    data: list[Optional[Tensor]],
    q_positions: Optional[Tensor],
    k_positions: Optional[Tensor],
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward of `attention`: `(dq, dk, dv, dbias)`; `dbias` has the bias's shape and
    dtype when `bias_grad`, and is empty otherwise."""
    fn = variant_for(variant)
    explicit = _explicit(q_positions, k_positions)
    plan = fn.plan(q, k, v, explicit, training=False, backward=True)
    check_backward_operands(plan.problem, out, lse, grad_out, grad_lse)
    tensors = fn.call_tensors(plan, _arguments(bias, data, q_positions, k_positions), explicit)
    dq, dk, dv, dbias = fn.backward(plan, tensors, (q, k, v, out, lse), grad_out, grad_lse, bias_grad)
    if dbias is None:
        return dq, dk, dv, q.new_empty((0,))
    assert bias is not None
    # Summed over the broadcast dims in fp32, then rounded once to the bias's type.
    return dq, dk, dv, dbias.sum_to_size(bias.shape).to(bias.dtype)


@attention_backward.register_fake
def _attention_backward_fake(variant, q, k, v, out, lse, grad_out, grad_lse, bias, data,
                             q_positions, k_positions, bias_grad):
    # As the kernels' gradients are allocated: in their operand's memory order.
    dbias = bias.new_empty(bias.shape) if bias_grad and bias is not None else q.new_empty((0,))
    return (*(empty_in_layout_of(t, t.dtype) for t in (q, k, v)), dbias)


def _setup_context(ctx, inputs, output) -> None:
    variant, q, k, v, bias, data, q_positions, k_positions, return_lse = inputs
    out, lse = output
    ctx.variant, ctx.return_lse = variant, return_lse
    ctx.save_for_backward(q, k, v, out, lse, bias, q_positions, k_positions, *data)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, bias, q_positions, k_positions, *data = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[4]
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dbias = attention_backward(
        ctx.variant, q, k, v, out, lse, grad_out, grad_lse if ctx.return_lse else None,
        bias, list(data), q_positions, k_positions, bias_grad)
    # Integer and bool data have no gradient. torch's check of the gradients' structure sees
    # a list of tensors as its entries, and a list holding a None as one opaque argument.
    data_grad = [None] * len(data) if all(isinstance(t, Tensor) for t in data) else None
    return None, dq, dk, dv, (dbias if bias_grad else None), data_grad, None, None, None


attention.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("attnfuse::rotate_keys", mutates_args=())
def rotate_keys(
    theta: float,
    rotary_dim: Optional[int],
    interleaved: bool,
    llama3_scaling: Optional[list[float]],
    k: Tensor,
    k_positions: Optional[Tensor],
) -> Tensor:
    """`R(k_pos) k` by a rotation (`attn.RopeOp.rope_key`'s parts), as
    `CompiledAttention.rotate_keys` computes it: the key rotation of a traced graph (a
    model that writes rotated keys into its cache, under torch.compile)."""
    from attnfuse.runtime.key_rotation import rotate_keys as rotate

    scaling = None if llama3_scaling is None else tuple(llama3_scaling)
    return rotate((theta, rotary_dim, interleaved, scaling), k, k_positions)


@rotate_keys.register_fake
def _rotate_keys_fake(theta, rotary_dim, interleaved, llama3_scaling, k, k_positions):
    return empty_in_layout_of(k, k.dtype)  # as the kernel's output: k's memory order


def _rotate_keys_setup(ctx, inputs, output) -> None:
    ctx.rope = inputs[:4]
    ctx.save_for_backward(inputs[5])


def _rotate_keys_backward(ctx, grad):
    (positions,) = ctx.saved_tensors
    if positions is None:
        positions = torch.arange(grad.shape[2], device=grad.device)
    # The gradient of R(p) k is R(p)^T g = R(-p) g.
    return None, None, None, None, rotate_keys(*ctx.rope, grad, -positions), None


rotate_keys.register_autograd(_rotate_keys_backward, setup_context=_rotate_keys_setup)


def call(
    key: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    return_lse: bool = False,
    bias: Tensor | None = None,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    **data: Tensor | None,
):
    """A call of the variant registered under `key` (`CompiledAttention.operator_key`) through
    the operators, with the keywords of `CompiledAttention.__call__`: what code that picks its
    variant per call (an integration) uses under tracing, where it cannot reach the variant
    object itself."""
    out, lse = torch.ops.attnfuse.attention(key, q, k, v, bias, data_list(data), q_positions,
                                             k_positions, return_lse)
    return (out, lse) if return_lse else out


@torch.library.custom_op("attnfuse::attention_cache", mutates_args=())
def attention_cache(
    variant: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_lens: Tensor,
    block_table: Optional[Tensor],
    bias: Optional[Tensor],
    data: list[Optional[Tensor]],
    q_positions: Optional[Tensor],
    k_positions: Optional[Tensor],
) -> tuple[Tensor, Tensor]:
    """An inference call over a KV cache (`kv_lens=`, and `block_table=` for a paged one):
    `(out, lse)` as `CompiledAttention.cache_forward` computes them. It has no backward (a
    cache call is inference-only: `CompiledAttention.__call__` refuses one that autograd
    would record, traced or not)."""
    fn = variant_for(variant)
    return _defined_lse(fn, fn.cache_forward(q, k, v, kv_lens, block_table,
                                             **_arguments(bias, data, q_positions, k_positions)))


@attention_cache.register_fake
def _attention_cache_fake(variant, q, k, v, kv_lens, block_table, bias, data, q_positions, k_positions):
    from attnfuse.runtime.inputs import check_inputs
    from attnfuse.runtime.kv_cache import check_cache_arguments

    # Shape, dtype and layout checks only: they read no lengths and no table entries.
    _cache, paged_keys = check_cache_arguments(q, k, v, kv_lens, block_table)
    problem = check_inputs(variant_for(variant).program, q, k, v, paged_keys)
    out = empty_in_layout_of(q, q.dtype, (problem.batch, problem.heads_q, problem.seq_q, problem.head_dim_v))
    lse = q.new_empty((problem.batch, problem.heads_q, problem.seq_q), dtype=torch.float32)
    return out, lse


def call_cache(
    key: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_lens: Tensor,
    block_table: Tensor | None,
    *,
    return_lse: bool = False,
    bias: Tensor | None = None,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    **data: Tensor | None,
):
    """A traced call over a KV cache through `attention_cache` (as `call` for other calls)."""
    out, lse = torch.ops.attnfuse.attention_cache(key, q, k, v, kv_lens, block_table, bias,
                                                   data_list(data), q_positions, k_positions)
    return (out, lse) if return_lse else out


def traced(*tensors: object) -> bool:
    """Whether this call is being traced (torch.compile, torch.export, or a tracer such as
    make_fx, which hands the call fake or functional tensors) rather than run eagerly: such a
    call must go through the operators, whose launches the tracer does not look into."""
    # Asked on every call: the dispatch-mode stack's length (what `_get_current_dispatch_mode`
    # reads) and a loop that settles plain tensors and parameters by their exact type.
    if torch.compiler.is_compiling() or _len_dispatch_stack() > 0:
        return True
    for t in tensors:
        kind = type(t)
        if t is None or kind is Tensor or kind is _Parameter:
            continue
        if isinstance(t, Tensor) and not isinstance(t, _Parameter):
            return True
    return False


_len_dispatch_stack = torch._C._len_torch_dispatch_stack
_Parameter = torch.nn.Parameter
