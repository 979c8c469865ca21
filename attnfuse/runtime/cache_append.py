"""Writing new keys and values into a KV cache, in one kernel: `CompiledAttention.append_kv`.

A decode step appends the step's keys and values at the end of each sequence of the cache
its attention reads: key `i` of sequence `b` goes to cache position `kv_lens[b] + i`, in a
contiguous `[B, Hkv, L_max, D]` cache or at its page of a paged one (`block_table`). A cache
for a variant whose key rotation is `given` (`rope_placement=(..., "given")`) stores keys
rotated: the append rotates each key at its position as it writes it, with the variant's own
rotation (its theta, width, pairs, scaling). Other variants' caches hold keys as they are.

The kernel is lower-to-tile's `append_kv` (`append=true`, the `appended_keys` grid), compiled
from the variant's own program, so the rotation is the one its attention kernels assume. The
caller advances `kv_lens` afterwards. Lengths and table entries are read by the kernel, never
by the host on a GPU: an append and the attention after it capture in one CUDA graph. (On the
CPU, where Triton's interpreter truncates fp32 -> bf16, triton-lang/triton#11584, bf16 keys are
rotated by `rotate_keys`, which rounds, and then appended as they are.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime import torch_op
from attnfuse.runtime.compiler import CompileKey, compile_program
from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.inputs import (
    Problem,
    check_tensor,
    refuse_negative_view,
    refuse_overlapping_view,
    resolved_negation,
)
from attnfuse.runtime.interpreter import runs_interpreted, truncates_to_bf16
from attnfuse.runtime.kv_cache import CacheLayout, check_cache_arguments
from attnfuse.runtime.launch import KernelLaunch, prepare

if TYPE_CHECKING:
    from attnfuse.runtime.api import CompiledAttention

APPEND_BLOCK_M = 64
"""New keys per program on a GPU (an append writes a few keys per sequence: one block)."""


def append_kv(
    fn: CompiledAttention,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
) -> None:
    """Writes `k`, `v` (`[B, Hkv, N, D]`, `[B, Hkv, N, Dv]`) into the cache `k_cache`,
    `v_cache` after each sequence's `kv_lens[b]` cached keys (see the module docstring)."""
    if torch_op.traced(k_cache, v_cache, k, v, kv_lens, block_table):
        raise ArgumentError("append_kv runs eagerly: torch.compile and torch.export do not trace it")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        check_tensor(name, t)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        refuse_negative_view(name, cache)
        refuse_overlapping_view(name, cache)
    if k_cache.numel() and k_cache.data_ptr() == v_cache.data_ptr() and k_cache.stride() == v_cache.stride():
        raise ArgumentError("k_cache and v_cache are one tensor (the same memory and strides): the values "
                            "would overwrite the keys; pass two caches (or two halves of one buffer)")
    k, v = resolved_negation(k), resolved_negation(v)  # read from memory by the kernel
    if torch.is_grad_enabled() and any(t.requires_grad for t in (k_cache, v_cache, k, v)):
        raise ArgumentError("append_kv writes a cache in place and has no backward: call it under torch.no_grad()")
    if len({t.dtype for t in (k_cache, v_cache, k, v)}) != 1:
        raise ArgumentError(
            f"k_cache, v_cache, k, v must share one dtype, got {k_cache.dtype}, {v_cache.dtype}, {k.dtype}, {v.dtype}")
    if len({t.device for t in (k_cache, v_cache, k, v)}) != 1:
        raise ArgumentError("k_cache, v_cache, k, v must be on one device")
    batch, heads, new, dim = k.shape
    if tuple(v.shape[:3]) != (batch, heads, new):
        raise ArgumentError(f"v must be [B, Hkv, N, Dv] = [{batch}, {heads}, {new}, ...] as k, got {list(v.shape)}")
    layout, paged_keys = check_cache_arguments(k, k_cache, v_cache, kv_lens, block_table, rows="k")
    if not layout.kv_lens:
        raise ArgumentError("append_kv needs kv_lens=: the new keys go after each sequence's cached ones")
    cache_batch = None if block_table is not None else batch
    for name, cache, width in (("k_cache", k_cache, dim), ("v_cache", v_cache, v.shape[3])):
        if cache.shape[1] != heads or cache.shape[3] != width or (cache_batch is not None and cache.shape[0] != cache_batch):
            raise ArgumentError(
                f"{name} must be [{cache_batch if cache_batch is not None else 'num_pages'}, {heads}, "
                f"{'L_max' if cache_batch is not None else 'page_size'}, {width}], got {list(cache.shape)}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ArgumentError(f"k_cache and v_cache must hold the same rows, got {list(k_cache.shape)} and {list(v_cache.shape)}")
    capacity = paged_keys if paged_keys is not None else k_cache.shape[2]
    if k.numel() == 0 or v.numel() == 0 or capacity == 0:
        return  # nothing to write, or no position to write it at
    problem = Problem(batch, heads, heads, new, capacity, dim, v.shape[3], k.dtype, k.device,
                      pages=k_cache.shape[0] if block_table is not None else 0)
    rope = fn.variant.rope
    rotates = rope is not None and fn.key_given
    if rotates and truncates_to_bf16(k.dtype, k.device):
        # The interpreter would truncate the rotated keys: rotate with `rotate_keys`, which
        # rounds as a GPU does, at the positions the kernel would use (lengths clamped to the
        # cache, as it clamps them), then append the rotated keys as they are. rotate_keys
        # reads the positions' range on the host: the interpreter's path only.
        start = kv_lens.to(torch.int64).clamp(0, capacity)
        k = fn.rotate_keys(k, start[:, None] + torch.arange(new, device=k.device))
        rotates = False
    tensors = {"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "kv_lens": kv_lens}
    if block_table is not None:
        tensors["block_table"] = block_table
    launch = _launch(fn, problem, layout, rotates)
    if "rope_table" in launch.info.roles:
        assert rope is not None
        tensors["rope_table"] = fn._rope_table(problem, capacity)
    launch(tensors)


def _launch(fn: CompiledAttention, problem: Problem, layout: CacheLayout, rotates: bool) -> KernelLaunch:
    """The prepared `append_kv` launch of `fn`'s program for this problem, cached per
    variant, shape and layout; with `rotates`, one that rotates the keys it writes (a variant
    whose key rotation is `given`), else one that writes them as they are."""
    key = (problem, layout, rotates)
    cached = fn._append_launches.get(key)
    if cached is not None:
        return cached
    block_m = APPEND_BLOCK_M if problem.device.type == "cuda" else 16
    placement = None
    if fn.variant.rope is not None:
        placement = ("fused", "given" if rotates else "fused")
    compile_key = CompileKey(problem.head_dim, problem.head_dim_v, problem.element_type,
                             TileConfig(block_m, 16, 4, 1), placement,
                             fn.program.default_positions, cache=layout, append=True)
    compiled = compile_program(fn.program, compile_key, runs_interpreted(problem.device))
    (launch,) = prepare(compiled, problem, 1.0)
    launch.check_grid()
    fn._append_launches[key] = launch
    return launch


__all__ = ["append_kv"]
