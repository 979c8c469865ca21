"""KV caches as serving systems hold them, and the split-KV decode plan.

A call may describe its keys as a cache: `kv_lens=` (int32 `[B]`: sequence `b` has keys
`j < kv_lens[b]`, and its query `i` sits at position `kv_lens[b] - Nq + i`) over a contiguous
`[B, Hkv, L_max, D]` cache, or, with `block_table=` (int32 `[B, max_pages]`), over page pools
`[num_pages, Hkv, page_size, D]` whose pages the table lists in sequence order. This module
checks those arguments and gives the call's `Problem` (its key length is the cache's
capacity, `L_max` or `max_pages * page_size`) and its `CacheLayout`.

Calls with few queries (`decode_rows`) run the split-KV kernels (lower-to-tile's
`decode=true`; `CompiledAttention.decodes` has the other conditions, among them a normalizer
whose partial results merge, `interfaces.partials_merge`): `split_plan` chooses how many splits of the key range to launch from the
shapes alone, so a step's launches never depend on the lengths in `kv_lens` (a CUDA graph
of a step replays as the lengths grow).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from attnfuse.errors import ArgumentError
from attnfuse.runtime.call_data import refuse_non_strided
from attnfuse.runtime.inputs import Problem, check_tensor

MAX_DECODE_QUERIES = 16
"""Calls with at most this many queries run the split-KV decode kernels (one token, or a
speculative / chunked-prefill tail)."""

MIN_SPLIT_BLOCKS = 4
"""A split holds at least this many key blocks: with two, a 4k cache took 37% longer (17.9
against 13.1 µs, bench/results/20261201T1300Z-decode_tune.md): short splits pay their
prologue and the merge's reads for few keys."""

PROGRAMS_PER_SM = 1
"""Splits are chosen so the launch has about this many programs per multiprocessor: one
wave, each program one long stream of the cache. On the H200 one per SM took 14% less time
than two at a 16k cache (27.1 against 31.5 µs, Mistral-7B geometry) and 2-4% less at 32k
and at B=8 x 8k; four or eight per SM took up to 2x longer
(bench/results/20261201T1300Z-decode_tune.md)."""

DECODE_MERGE = "kernel"
"""Where split decodes merge their partials: "kernel" (a second kernel) or "last-split" (the
last split program of each row block, one kernel). On the H200, with merges that load many
splits a step, last-split took 10% longer at a 16k cache and 9% at 32k (B=1, where the last
program merges 16 rows of 16 splits four a step on the critical path) and 4% less at B=8 x 8k,
against the second kernel's one-row programs (kernel spans,
bench/results/20261201T194551Z-decode_profile.md). So the second kernel stays the default."""

INTERPRETER_SPLITS = 2
"""The splits of a decode on the CPU interpreter, which runs programs one at a time: two (of
one key block at least each), whatever the batch, so that every test of two or more key
blocks merges splits."""


@dataclass(frozen=True)
class CacheLayout:
    """How a call's keys are held: per-sequence lengths or not, paged or not."""

    kv_lens: bool = False
    page_size: int = 0
    """Rows per page of a paged cache; 0 for a contiguous one."""


CONTIGUOUS = CacheLayout()


def _check_index_tensor(name: str, t: object, shape: tuple[int, ...], device: torch.device,
                        contiguous: bool = False, batch_of: str = "q") -> torch.Tensor:
    """`t` if it is an int32 tensor of `shape` on `device` (contiguous if asked); its first
    axis is the batch of the tensor `batch_of` names (for the message)."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name}= must be a torch.Tensor, got {type(t).__name__}")
    refuse_non_strided({name: t})
    if t.dtype != torch.int32:
        raise ArgumentError(f"{name}= must be int32, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ArgumentError(f"{name}= must have shape {list(shape)} (one row per sequence, "
                            f"as {batch_of} has {shape[0]}), got {list(t.shape)}")
    if t.device != device:
        raise ArgumentError(f"{name}= must be on {batch_of}'s device ({device}), got {t.device}")
    if t.requires_grad:
        raise ArgumentError(f"{name}= is an index tensor and cannot require a gradient")
    if contiguous and not t.is_contiguous():
        # Read at offset b (no stride, `tile.TENSOR_AXES`): a view would read other values.
        raise ArgumentError(
            f"kv_lens= must be contiguous, got strides {t.stride()}: pass kv_lens.contiguous() "
            "(outside a CUDA graph capture, which must replay the same buffer)"
        )
    return t


def check_cache_arguments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: object,
    block_table: object,
    rows: str = "q",
) -> tuple[CacheLayout, tuple[int, ...] | None]:
    """Checks `kv_lens=` and `block_table=` against q (k and v are checked with the call's
    other operands, `check_inputs`); returns the layout and, for a paged cache, the keys a
    sequence can hold (`max_pages * page_size`), else None. `rows` names q in messages (the
    new keys, for `append_kv`)."""
    if kv_lens is None and block_table is None:
        return CONTIGUOUS, None
    check_tensor(rows, q)
    check_tensor("k", k)
    batch = q.shape[0]
    if block_table is None:
        _check_index_tensor("kv_lens", kv_lens, (batch,), q.device, contiguous=True, batch_of=rows)
        return CacheLayout(kv_lens=True), None
    if kv_lens is None:
        raise ArgumentError("block_table= needs kv_lens=: the pages do not say how many keys each sequence has")
    _check_index_tensor("kv_lens", kv_lens, (batch,), q.device, contiguous=True, batch_of=rows)
    refuse_non_strided({"block_table": block_table})
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        shape = list(block_table.shape) if isinstance(block_table, torch.Tensor) else type(block_table).__name__
        raise ArgumentError(f"block_table= must be an int32 [B, max_pages] tensor, got {shape}")
    _check_index_tensor("block_table", block_table, (batch, block_table.shape[1]), q.device, batch_of=rows)
    page_size = k.shape[2]
    if page_size < 1:
        raise ArgumentError("the page pools' page size (k.shape[2]) must be at least 1")
    if k.shape[0] < 1 and batch and block_table.shape[1]:
        # The kernels clamp table entries into the pools (no read outside them): an empty
        # pool has no page to clamp to.
        raise ArgumentError("the page pools hold no pages (k.shape[0] is 0): there is no page to read")
    return CacheLayout(kv_lens=True, page_size=page_size), block_table.shape[1] * page_size


def decode_rows(problem: Problem) -> bool:
    """Whether a call runs the split-KV decode kernels: few queries per sequence."""
    return problem.seq_q <= MAX_DECODE_QUERIES


def decode_block_m(problem: Problem) -> int:
    """Rows per decode program: the (query head, query) pairs of one key/value head, as a
    power of two of at least 16 (`tl.dot`'s smallest), at most 64 (more rows take more
    programs, each reading the group's keys)."""
    rows = problem.group_size * problem.seq_q
    return min(64, max(16, triton.next_power_of_2(rows)))


def row_blocks(problem: Problem, block_m: int) -> int:
    """Decode programs per (batch, key/value head) and split: blocks of the group's rows."""
    return triton.cdiv(problem.group_size * problem.seq_q, block_m)


def split_plan(problem: Problem, block_m: int, block_n: int) -> tuple[int, int]:
    """(number of splits, keys per split) of a decode launch, from the shapes only: the split
    count, of the two that bring the launch nearest `PROGRAMS_PER_SM` programs per
    multiprocessor from below and from above, whose programs fill their waves best
    (`wave_fill`; the larger count on a tie), each split at least `MIN_SPLIT_BLOCKS` key
    blocks long. Rounding up alone left B=8 x 8 key heads 3 splits, 192 programs on 132 SMs,
    1.45 waves: 101.5 us where 2 splits (128 programs) took 95.6 and SDPA flash 97.6 (H100,
    8k cache, `bench/decode_splits.py`, bench/results/20261205T151323Z-decode-splits.md)."""
    key_blocks = max(1, triton.cdiv(problem.seq_k, block_n))
    if problem.device.type == "cuda":
        sms = torch.cuda.get_device_properties(problem.device).multi_processor_count
        programs = problem.batch * problem.heads_kv * row_blocks(problem, block_m)
        slots = PROGRAMS_PER_SM * sms
        most = max(1, key_blocks // MIN_SPLIT_BLOCKS)
        # What each count launches: splits of whole blocks (a count may round to fewer).
        launched = {triton.cdiv(key_blocks, triton.cdiv(key_blocks, max(1, min(most, count))))
                    for count in (slots // programs, triton.cdiv(slots, programs))}
        splits = max(launched, key=lambda count: (wave_fill(count * programs, slots), count))
    else:
        splits = min(INTERPRETER_SPLITS, key_blocks)
    split_len = triton.cdiv(key_blocks, splits) * block_n
    return triton.cdiv(problem.seq_k, split_len) if problem.seq_k else 1, split_len


def wave_fill(programs: int, slots: int) -> float:
    """The share of `slots`-wide waves that `programs` programs fill (1.0: whole waves)."""
    return programs / (triton.cdiv(programs, slots) * slots)


__all__ = [
    "CONTIGUOUS",
    "CacheLayout",
    "check_cache_arguments",
    "decode_block_m",
    "decode_rows",
    "row_blocks",
    "split_plan",
    "wave_fill",
]
