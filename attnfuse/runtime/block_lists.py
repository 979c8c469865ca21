"""Block-sparse iteration lists: a call-time layout turned into the key (or query) blocks each
program visits.

The kernels never test the layout per entry: kernel blocks lie inside layout blocks (the
runtime caps the tile sizes at the block size), so each program walks a list of the blocks it
keeps, full ones (no mask work) then partial ones, and time scales with the layout's density.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attnfuse.runtime.inputs import Problem


def sparse_block_lists(
    layout: torch.Tensor,
    block_size: int,
    band: tuple[int | None, int | None],
    problem: Problem,
    block_m: int,
    block_n: int,
    padded_rows_partial: bool = False,
) -> dict[str, torch.Tensor]:
    """For every kernel query block, the key blocks the layout keeps, split into *full* ones
    (every row keeps every key: no mask work) and *partial* ones (the band or the sequence end
    cuts them); blocks the layout drops or the band leaves empty are not listed.

    With `padded_rows_partial`, a ragged last program block (rows past the sequence end) has
    only partial blocks.

    Returns `full_blocks`/`partial_blocks` `[Hq, query blocks, entries]` (int32 key-block
    indices, in units of `block_n`) and `full_count`/`partial_count` `[Hq, query blocks]`; a
    layout shared by all heads is expanded with a zero head stride.
    """
    device = layout.device
    n_qb, n_kb = -(-problem.seq_q // block_m), -(-problem.seq_k // block_n)
    qb = torch.arange(n_qb, device=device)
    kb = torch.arange(n_kb, device=device)
    # block_m and block_n divide block_size, so each kernel block lies in one layout block.
    keep = layout[:, (qb * block_m) // block_size][:, :, (kb * block_n) // block_size]
    offset = problem.seq_k - problem.seq_q
    q_first = (qb * block_m + offset)[:, None]
    q_last = (torch.clamp(qb * block_m + block_m, max=problem.seq_q) - 1 + offset)[:, None]
    k_first = (kb * block_n)[None, :]
    k_last = torch.clamp(kb * block_n + block_n, max=problem.seq_k)[None, :] - 1
    lower, upper = band
    nonempty = torch.ones(n_qb, n_kb, dtype=torch.bool, device=device)
    full = (kb * block_n + block_n <= problem.seq_k)[None, :].expand(n_qb, n_kb).clone()
    if padded_rows_partial:
        # The program's padded rows must be masked too (see transposed_block_lists).
        full &= (qb * block_m + block_m <= problem.seq_q)[:, None]
    if lower is not None:
        nonempty &= k_last >= q_first + lower
        full &= k_first >= q_last + lower
    if upper is not None:
        nonempty &= k_first <= q_last + upper
        full &= k_last <= q_first + upper
    full_keep = keep & full
    partial_keep = keep & nonempty & ~full
    lists = {}
    for name, chosen in (("full", full_keep), ("partial", partial_keep)):
        count = chosen.sum(-1, dtype=torch.int32)
        # Kept blocks first, in key order: a stable sort of "not kept". Lists keep all n_kb
        # entries (only `count` are read) so that building them never waits on the GPU.
        order = torch.sort((~chosen).to(torch.uint8), dim=-1, stable=True).indices
        blocks = order.to(torch.int32).contiguous()
        lists[f"{name}_blocks"] = blocks.expand(problem.heads_q, -1, -1)
        lists[f"{name}_count"] = count.expand(problem.heads_q, -1)
    return lists


def transposed_block_lists(
    layout: torch.Tensor,
    block_size: int,
    band: tuple[int | None, int | None],
    problem: Problem,
    block_m: int,
    block_n: int,
) -> dict[str, torch.Tensor]:
    """For every kernel *key* block (of `block_m` keys), the query blocks (of `block_n`
    queries) that keep some of its pairs, split into full and partial ones as
    `sparse_block_lists` does: `full_q_blocks`/`partial_q_blocks` `[Hq, key blocks, entries]`
    and their counts. These drive the dK/dV kernel, whose programs own key blocks.

    They are `sparse_block_lists` of the transposed problem: keys become rows at positions
    `j - (Nk - Nq)` and queries become columns at positions `i`, so that a pair's
    `k_pos - q_pos` changes sign and the band `[lower, upper]` becomes `[-upper, -lower]`.
    """
    lower, upper = band
    transposed_band = (None if upper is None else -upper, None if lower is None else -lower)
    transposed = replace(problem, seq_q=problem.seq_k, seq_k=problem.seq_q)
    # The dK/dV kernel's ragged last key block has padded rows, which only a masked step
    # drops: every block it visits is listed as partial.
    lists = sparse_block_lists(layout.transpose(-1, -2), block_size, transposed_band, transposed,
                               block_m, block_n, padded_rows_partial=True)
    return {name.replace("_", "_q_", 1): value for name, value in lists.items()}
