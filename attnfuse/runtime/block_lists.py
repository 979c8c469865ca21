"""Block iteration lists: the tiles each program visits, for variants with a listed filter
(`KeyFilter.lists`: block sparsity, documents), built per call from the filters' data.

Each listed filter says, per (query tile, key tile), whether the tile may keep an entry
(`visit`) and whether it keeps every entry (`full`) (`KeyFilter.tiles`); this module
intersects those with the mask band and the sequence ends and turns them into lists: each
program walks the tiles it may keep, full ones (no mask work) then partial ones (masked, and
each filter's per-entry test), so time scales with what the filters keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from xdsl.ir import Operation

from attnfuse.dialects.interfaces import KeyFilter
from attnfuse.runtime.inputs import Problem


@dataclass(frozen=True)
class ListSource:
    """A listed filter of a call: its op, the tensor its `bind` returned, and the tensor the
    caller passed (the lists' cache compares that one: `bind` may return a new view)."""

    op: Operation
    bound: Any
    given: torch.Tensor
    argument: str
    """The call keyword the caller passed `given` as (`block_layout`, `doc_ids`)."""

    def tiles(self, problem: Problem, q_block: int, k_block: int) -> tuple[torch.Tensor, torch.Tensor]:
        trait = self.op.get_trait(KeyFilter)
        assert trait is not None
        return trait.tiles(self.op, self.bound, problem, q_block, k_block)


def filter_tiles(
    sources: Sequence[ListSource], problem: Problem, q_block: int, k_block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(visit, full) of the tiles of `q_block` queries by `k_block` keys under every listed
    filter: a tile is visited (full) when every filter visits it (finds it full)."""
    visit = full = None
    for source in sources:
        v, f = source.tiles(problem, q_block, k_block)
        visit = v if visit is None else visit & v
        full = f if full is None else full & f
    assert visit is not None and full is not None, "a listed variant has a listed filter"
    return visit, full & visit


def block_lists(
    visit: torch.Tensor,
    full: torch.Tensor,
    band: tuple[int | None, int | None],
    problem: Problem,
    block_m: int,
    block_n: int,
    padded_rows_partial: bool = False,
    ranks: bool = False,
) -> dict[str, torch.Tensor]:
    """For every kernel query block (of `block_m` queries), the key blocks (of `block_n`
    keys) to visit, split into *full* ones (every row keeps every key: no mask work) and
    *partial* ones (a filter, the band or the sequence end cuts them); blocks the filters
    (`visit`, `full`: bool, broadcastable to `[B, Hq, query blocks, key blocks]`) or the band
    leave empty are not listed.

    With `padded_rows_partial`, a ragged last program block (rows past the sequence end) has
    only partial blocks.

    Returns `full_blocks`/`partial_blocks` `[B, Hq, query blocks, entries]` (int32 key-block
    indices, in units of `block_n`) and `full_count`/`partial_count` `[B, Hq, query blocks]`;
    lists the filters share across batches or heads are expanded with zero strides. With
    `ranks`, also `full_rank`/`partial_rank` beside the lists, entry for entry: how many
    *lower* program blocks list the entry's block (full or partial), the entry's turn when
    the programs of one loop block take turns in program-block order.
    """
    device = visit.device
    n_qb, n_kb = -(-problem.seq_q // block_m), -(-problem.seq_k // block_n)
    qb = torch.arange(n_qb, device=device)
    kb = torch.arange(n_kb, device=device)
    offset = problem.seq_k - problem.seq_q
    q_first = (qb * block_m + offset)[:, None]
    q_last = (torch.clamp(qb * block_m + block_m, max=problem.seq_q) - 1 + offset)[:, None]
    k_first = (kb * block_n)[None, :]
    k_last = torch.clamp(kb * block_n + block_n, max=problem.seq_k)[None, :] - 1
    lower, upper = band
    nonempty = torch.ones(n_qb, n_kb, dtype=torch.bool, device=device)
    in_band = (kb * block_n + block_n <= problem.seq_k)[None, :].expand(n_qb, n_kb).clone()
    if padded_rows_partial:
        # The program's padded rows must be masked too (see transposed_block_lists).
        in_band &= (qb * block_m + block_m <= problem.seq_q)[:, None]
    if lower is not None:
        nonempty &= k_last >= q_first + lower
        in_band &= k_first >= q_last + lower
    if upper is not None:
        nonempty &= k_first <= q_last + upper
        in_band &= k_last <= q_first + upper
    visit = visit & nonempty
    full_keep = visit & full & in_band
    partial_keep = visit & ~full_keep
    while full_keep.dim() < 4:
        full_keep, partial_keep = full_keep[None], partial_keep[None]
    lists = {}
    turns = None
    if ranks:
        # Per (program block, loop block): the lower program blocks listing the loop block.
        listed = (full_keep | partial_keep).to(torch.int32)
        turns = listed.cumsum(-2, dtype=torch.int32) - listed
    for name, chosen in (("full", full_keep), ("partial", partial_keep)):
        count = chosen.sum(-1, dtype=torch.int32)
        # Kept blocks first, in key order: a stable sort of "not kept". Lists keep all n_kb
        # entries (only `count` are read) so that building them never waits on the GPU.
        order = torch.sort((~chosen).to(torch.uint8), dim=-1, stable=True).indices
        blocks = order.to(torch.int32).contiguous()
        lists[f"{name}_blocks"] = blocks.expand(problem.batch, problem.heads_q, -1, -1)
        lists[f"{name}_count"] = count.expand(problem.batch, problem.heads_q, -1)
        if turns is not None:
            rank = torch.gather(turns.expand_as(order), -1, order).contiguous()
            lists[f"{name}_rank"] = rank.expand(problem.batch, problem.heads_q, -1, -1)
    return lists


def transposed_block_lists(
    visit: torch.Tensor,
    full: torch.Tensor,
    band: tuple[int | None, int | None],
    problem: Problem,
    block_m: int,
    block_n: int,
    ranks: bool = False,
) -> dict[str, torch.Tensor]:
    """For every kernel *key* block (of `block_m` keys), the query blocks (of `block_n`
    queries) that keep some of its pairs, split into full and partial ones as `block_lists`
    does: `full_q_blocks`/`partial_q_blocks` `[B, Hq, key blocks, entries]` and their counts
    (with `ranks`, `full_q_rank`/`partial_q_rank`: each entry's turn at its query block, for
    dQ adds in key-block order). These drive the dK/dV kernel, whose programs own key blocks.
    `visit` and `full` are the filters' tiles of `block_n` queries by `block_m` keys, in
    query x key orientation.

    They are `block_lists` of the transposed problem: keys become rows at positions
    `j - (Nk - Nq)` and queries become columns at positions `i`, so that a pair's
    `k_pos - q_pos` changes sign and the band `[lower, upper]` becomes `[-upper, -lower]`.
    """
    lower, upper = band
    transposed_band = (None if upper is None else -upper, None if lower is None else -lower)
    transposed = replace(problem, seq_q=problem.seq_k, seq_k=problem.seq_q)
    # The dK/dV kernel's ragged last key block has padded rows, which only a masked step
    # drops: every block it visits is listed as partial.
    lists = block_lists(visit.transpose(-1, -2), full.transpose(-1, -2), transposed_band,
                        transposed, block_m, block_n, padded_rows_partial=True, ranks=ranks)
    return {name.replace("_", "_q_", 1): value for name, value in lists.items()}


def call_block_lists(
    sources: Sequence[ListSource],
    band: tuple[int | None, int | None],
    problem: Problem,
    config: Any,
    backward: bool,
    ranks: bool = False,
    dq_lists: bool = True,
) -> dict[str, torch.Tensor]:
    """The lists the forward kernel (or, with `backward`, the dQ and dK/dV kernels) of a call
    with tile configuration `config` (a `TileConfig`) read. A fused backward has no dQ kernel
    (`dq_lists` false: none of its lists are built) and, with its adds in key-block order,
    reads the query lists' ranks (`ranks`)."""
    if not backward:
        visit, full = filter_tiles(sources, problem, config.block_m, config.block_n)
        return block_lists(visit, full, band, problem, config.block_m, config.block_n)
    lists = {}
    if dq_lists:
        bm, bn, _warps, _stages = config.backward()
        visit, full = filter_tiles(sources, problem, bm, bn)
        lists = block_lists(visit, full, band, problem, bm, bn)
    kv_bm, kv_bn, _warps, _stages = config.dkdv()
    # dK/dV programs own kv_bm keys and step over kv_bn queries.
    visit, full = filter_tiles(sources, problem, kv_bn, kv_bm)
    return lists | transposed_block_lists(visit, full, band, problem, kv_bm, kv_bn, ranks)
