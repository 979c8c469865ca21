"""Rotating keys where they are written into a KV cache: `R(k_pos) k`, once per key.

A serving loop or a Hugging Face cache stores keys rotated, and attends to them with
`rope_placement=(query, "given")`, whose kernels read k as passed. This module rotates the
keys for it with the variant's own rotation (its theta, rotary width, pair layout and
Llama-3.1 scaling), run by the pre-rotation kernel the compiler already generates
(`rotate_key`, lower-to-tile's `build_rotation_kernel`): the program of
`rotation_program` holds exactly that rotation, at call-time key positions, and compiling
it with a pre-rotated key gives the kernel. The result is what a call with a
`pre_rotated` key computes and attends to, bit for bit.

The gradient of `R(p) k` is `R(p)^T g = R(-p) g` (each pair turns by the negated angle,
which the table gives exactly: it reads `|p|` and negates sin), so the backward is the same
kernel at negated positions.
"""

from __future__ import annotations

from functools import cache, lru_cache

import torch
from xdsl.dialects.builtin import ModuleOp

from attnfuse.blocks.softmax import SoftmaxOp
from attnfuse.dialects import attn
from attnfuse.errors import ArgumentError
from attnfuse.runtime import torch_op
from attnfuse.runtime.attention_autograd import refuse_forward_ad, transforms_active
from attnfuse.runtime.call_data import position_extent, positions_view
from attnfuse.runtime.compiler import CompileKey, compile_program
from attnfuse.runtime.config import choose_tile_config
from attnfuse.runtime.inputs import (
    MAX_HEAD_DIM,
    Problem,
    check_tensor,
    resolved_negation,
)
from attnfuse.runtime.interpreter import runs_interpreted, truncates_to_bf16
from attnfuse.runtime.launch import KernelLaunch, prepare, rope_table
from attnfuse.runtime.layout import empty_in_layout_of
from attnfuse.runtime.program import VariantProgram
from attnfuse.runtime.tensor_cache import tensor_state

RopeKey = tuple[float, int | None, bool, tuple[float, ...] | None]
"""`attn.RopeOp.rope_key`: theta, rotary width, interleaved, Llama-3.1 scaling."""

@cache
def rotation_program(rope: RopeKey) -> VariantProgram:
    """The smallest attn program whose key rotation is `rope`, at call-time key positions:
    `%kr = attn.rope %k at %kp {...}` feeding a plain softmax attention. Compiled with a
    pre-rotated key, its `rotate_key` kernel is the rotation (nothing else is launched)."""
    theta, rotary_dim, interleaved, scaling = rope
    variant = attn.VariantOp("rotate_keys", extra=[attn.PositionsType("key")])
    q, k, v, k_positions = variant.body.block.args
    rotate = attn.RopeOp(k, theta, rotary_dim, interleaved, scaling=scaling, positions=k_positions)
    scores = attn.ScoresOp(q, rotate.output)
    probs = SoftmaxOp(scores.result)
    out = attn.PVOp(probs.results[0], v)
    variant.body.block.add_ops([rotate, scores, probs, out, attn.YieldOp(out.result)])
    return VariantProgram(ModuleOp([variant]))


@lru_cache(maxsize=64)
def rotation_launch(rope: RopeKey, problem: Problem) -> KernelLaunch:
    """The `rotate_key` kernel of `rotation_program(rope)`, prepared for keys of `problem`'s
    shape (its query side is the keys themselves: `heads_q = heads_kv`, `seq_q = seq_k`)."""
    config = choose_tile_config(problem)
    key = CompileKey(problem.head_dim, problem.head_dim, problem.element_type, config,
                     ("fused", "pre_rotated"), (False, True))
    compiled = compile_program(rotation_program(rope), key, runs_interpreted(problem.device))
    (launch,) = (launch for launch in prepare(compiled, problem, 1.0)
                 if launch.info.name == "rotate_key")
    launch.check_grid()
    return launch


def _rotate(launch: KernelLaunch, k: torch.Tensor, positions: torch.Tensor,
            table: torch.Tensor) -> torch.Tensor:
    """`R(positions) k` by the rotation kernel, in k's dtype and memory order."""
    # A bf16 result the interpreter would truncate (`truncates_to_bf16`) is written in fp32
    # and rounded by torch.
    interpreted_bf16 = truncates_to_bf16(k.dtype, k.device)
    out = empty_in_layout_of(k, torch.float32 if interpreted_bf16 else k.dtype)
    launch({"k": k, "k_rot": out, "rope_table": table, "k_positions": positions})
    return out.to(k.dtype) if interpreted_bf16 else out


class _RotateKeys(torch.autograd.Function):
    """`R(p) k` with its gradient `R(p)^T g`, the same kernel at positions `-p`."""

    @staticmethod
    def forward(ctx, launch, positions, table, k):  # type: ignore[override]
        ctx.launch, ctx.positions, ctx.table = launch, positions, table
        ctx.positions_state = tensor_state(positions)
        return _rotate(launch, k, positions, table)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if tensor_state(ctx.positions) != ctx.positions_state:
            # As for an attention call: the gradient would rotate back at other positions
            # (past the table, sized for the forward's, they would be read out of bounds).
            raise ArgumentError(
                "k_positions was modified in place between the forward and the backward; "
                "the backward needs the forward's k_positions (pass a copy, or change it "
                "after the backward)")
        return None, None, None, _rotate(ctx.launch, grad, -ctx.positions, ctx.table)


def rotate_keys(rope: RopeKey, k: torch.Tensor, k_positions: torch.Tensor | None = None) -> torch.Tensor:
    """`R(k_pos) k` for keys `k [B, Hkv, N, D]` (float16, bfloat16 or float32, on the GPU or,
    through Triton's interpreter, the CPU), with the rotation `rope` (an `attn.RopeOp`'s
    `rope_key`). `k_positions` (int32/int64 `[N]` or `[B, N]`, as a call takes them) are the
    keys' positions; the default is `j` for key `j`. The result has k's shape, dtype and
    memory order; autograd differentiates through it (the gradient is the inverse rotation).
    """
    if torch_op.traced(k, k_positions):
        theta, rotary_dim, interleaved, scaling = rope
        return torch_op.rotate_keys(theta, rotary_dim, interleaved,
                                    None if scaling is None else list(scaling), k, k_positions)
    check_tensor("k", k)
    if transforms_active():
        raise ArgumentError("rotate_keys under torch.func transforms (grad, vjp, vmap, jvp) is not "
                            "supported: rotate the keys outside the transform (they are a cache's, "
                            "written once), or loop over the mapped dimension")
    refuse_forward_ad(k)
    k = resolved_negation(k)  # the kernel reads memory (`inputs.resolved_negation`)
    batch, heads, length, dim = k.shape
    theta, rotary_dim, _interleaved, scaling = rope
    if k.device.type not in ("cuda", "cpu"):
        raise ArgumentError(f"k is on {k.device}; AttnFuse runs on cuda (or the cpu's interpreter)")
    if not 1 <= dim <= MAX_HEAD_DIM:
        raise ArgumentError(f"k head dim must be in [1, {MAX_HEAD_DIM}], got {dim}")
    width = rotary_dim or dim
    if width > dim:
        raise ArgumentError(f"rope: rotary_dim {width} exceeds the head dim {dim}")
    if width % 2:
        raise ArgumentError(f"rope: the head dim {dim} is odd; give an even rotary_dim")
    problem = Problem(batch, heads, heads, length, length, dim, dim, k.dtype, k.device)
    if k_positions is None:
        positions = torch.arange(length, dtype=torch.int32, device=k.device).expand(batch, length)
        furthest = length
    else:
        positions = positions_view(k_positions, "k_positions", length, problem)
        furthest = position_extent(positions, "k_positions")
    if k.numel() == 0:
        return k.clone()
    table = rope_table(theta, width, scaling, k.device, furthest)
    launch = rotation_launch(rope, problem)
    if torch.is_grad_enabled() and k.requires_grad:
        return _RotateKeys.apply(launch, positions, table, k)
    return _rotate(launch, k, positions, table)


__all__ = ["rotate_keys", "rotation_program"]
