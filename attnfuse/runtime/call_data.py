"""Call-time data of a variant: ALiBi slopes, the additive bias, block-sparse key-block lists.

Each helper checks its argument against the call's shapes (an `ArgumentError` naming it
otherwise) and returns the tensor the kernel reads.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime.inputs import Problem


def default_alibi_slopes(heads: int) -> list[float]:
    """The ALiBi paper's slopes: a geometric sequence starting at 2^(-8/n) for n a power of
    two; otherwise those of the nearest lower power of two, then every other slope of twice
    that many heads."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads == 0:
        return []
    if heads & (heads - 1) == 0:
        return power_of_two_slopes(heads)
    lower = 2 ** math.floor(math.log2(heads))
    return power_of_two_slopes(lower) + power_of_two_slopes(2 * lower)[0::2][: heads - lower]


def alibi_slopes(slopes: tuple[float, ...] | None, problem: Problem) -> torch.Tensor:
    """The fp32 slope per query head the kernel reads."""
    values = default_alibi_slopes(problem.heads_q) if slopes is None else list(slopes)
    if len(values) != problem.heads_q:
        raise ArgumentError(
            f"alibi: {len(values)} slopes given for {problem.heads_q} query heads"
        )
    return torch.tensor(values, dtype=torch.float32, device=problem.device)


def bias_view(bias: object, problem: Problem) -> torch.Tensor:
    """`bias` broadcast to `[B, Hq, Nq, Nk]` as a view (zero strides, no copy)."""
    if bias is None:
        raise ArgumentError("additive_bias() needs bias= at call time, broadcastable to [B, Hq, Nq, Nk]")
    if not isinstance(bias, torch.Tensor):
        raise ArgumentError(f"bias must be a torch.Tensor, got {type(bias).__name__}")
    if not bias.is_floating_point() or bias.dtype == torch.float64:
        raise ArgumentError(f"bias must be float16, bfloat16 or float32, got {bias.dtype}")
    if bias.device != problem.device:
        raise ArgumentError(f"bias is on {bias.device}, but q is on {problem.device}")
    target = (problem.batch, problem.heads_q, problem.seq_q, problem.seq_k)
    if bias.dim() > 4:
        raise ArgumentError(f"bias must have at most 4 dims, got shape {tuple(bias.shape)}")
    try:
        return bias.expand(target)
    except RuntimeError:
        raise ArgumentError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to [B, Hq, Nq, Nk] = {list(target)}"
        ) from None


def check_layout(layout: object, block_size: int, problem: Problem) -> torch.Tensor:
    """The layout as `[H, rows, cols]` (H = 1 when shared by all heads), checked."""
    if layout is None:
        raise ArgumentError(f"block_sparse({block_size}) needs block_layout= at call time")
    if not isinstance(layout, torch.Tensor):
        raise ArgumentError(f"block_layout must be a torch.Tensor, got {type(layout).__name__}")
    if layout.dtype != torch.bool:
        raise ArgumentError(f"block_layout must be a bool tensor, got {layout.dtype}")
    if layout.device != problem.device:
        raise ArgumentError(f"block_layout is on {layout.device}, but q is on {problem.device}")
    rows, cols = -(-problem.seq_q // block_size), -(-problem.seq_k // block_size)
    if layout.dim() == 2 and tuple(layout.shape) == (rows, cols):
        return layout[None]
    if layout.dim() == 3 and tuple(layout.shape) == (problem.heads_q, rows, cols):
        return layout
    raise ArgumentError(
        f"block_layout must have shape [{rows}, {cols}] or [{problem.heads_q}, {rows}, {cols}] "
        f"(ceil(N / {block_size}) blocks), got {list(layout.shape)}"
    )


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


def positions_view(positions: object, name: str, length: int, problem: Problem) -> torch.Tensor:
    """Call-time RoPE positions as a `[B, N]` integer view (a shared `[N]` gets batch stride
    0)."""
    if not isinstance(positions, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"{name} must be int32 or int64, got {positions.dtype}")
    if positions.device != problem.device:
        raise ArgumentError(f"{name} is on {positions.device}, but q is on {problem.device}")
    shapes = ([length], [problem.batch, length])
    if list(positions.shape) not in shapes:
        raise ArgumentError(
            f"{name} must have shape [{length}] or [{problem.batch}, {length}], got "
            f"{list(positions.shape)}"
        )
    return positions.expand(problem.batch, length)
