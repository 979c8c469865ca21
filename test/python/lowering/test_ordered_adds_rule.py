"""The rule that orders the fused backward's dQ adds (`tile.store_add ... in_order`), checked by
running the printed code itself: `tile.q_bounds` and `prev_q_end` as the portable printer
emits them, evaluated as Python over many bands, lengths and block sizes. A key block waits
exactly when the key block before it visits the same query block, and the key blocks that
visit a query block are consecutive (what lets each hand the block to the next). Every kept
(query, key) pair is visited once. The kernels through the interpreter are in
test/python/runtime/test_backward_fused.py; this covers shapes those cannot afford."""

from __future__ import annotations

import itertools
import types

import pytest

import attnfuse as af
from attnfuse.dialects import attn, tile
from attnfuse.lowering.triton import KernelEmitter
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime.config import TileConfig

TL = types.SimpleNamespace(minimum=min, maximum=max, where=lambda c, a, b: a if c else b)
"""Scalar stand-ins for the tl calls the bound lines make."""


def bounds_program(band: tuple[int | None, int | None]) -> tuple[list[str], tuple[str, ...]]:
    """The printed lines of the ordered dK/dV kernel's `tile.q_bounds` (with `prev_q_end`) for
    `band`, and the names of its four results."""
    key = CompileKey(32, 32, "f32", TileConfig(32, 32, 4, 1), None, bwd_dq="ordered")
    module = lower_spec(af.attention(af.causal()), key)
    kernel = next(op for op in module.ops if isinstance(op, tile.KernelOp) and op.sym_name.data == "attention_bwd_dkdv_dq")
    op = next(o for o in kernel.walk() if isinstance(o, tile.QBoundsOp))
    op.properties["band"] = attn.BandAttr(*band)
    emitter = KernelEmitter(kernel)
    emitter.lines, emitter.indent = [], 0
    emitter.HANDLERS[type(op)](emitter, op)
    return emitter.lines, tuple(emitter.namer[r] for r in op.results)


def visits(lines, names, block_id, n_q, n_k, block_m, block_n):
    """The query blocks key block `block_id` visits (from `start`, stepping by BLOCK_N, before
    `end`) and `prev_q_end`, by running the printed lines."""
    scope = {"tl": TL, "block_id": block_id, "n_q": n_q, "n_k": n_k, "BLOCK_M": block_m, "BLOCK_N": block_n}
    exec("\n".join(lines), scope)  # noqa: S102 - the printer's own output
    start, _full_start, _full_end, end = (scope[n] for n in names)
    return list(range(start, end, block_n)), scope["prev_q_end"]


BANDS = [(None, None), (None, 0), (-255, 0), (-40, 0), (-7, 7), (-100, 30), (0, 50), (-3, None), (5, 90), (-60, -20)]
"""Dense, causal, causal windows, a symmetric window, and bands of hand-written IR: keys
ahead of the query, a lower bound only, a band not holding the diagonal."""


@pytest.mark.parametrize("band", BANDS, ids=str)
def test_each_key_block_waits_exactly_for_the_one_before_it(band):
    lines, names = bounds_program(band)
    lower, upper = band
    for n_q, n_k, (block_m, block_n) in itertools.product((1, 31, 64, 97, 200), (1, 33, 64, 130, 257),
                                                          ((16, 16), (32, 16), (16, 32), (64, 32), (128, 64))):
        n_blocks = -(-n_k // block_m)
        visited = [visits(lines, names, j, n_q, n_k, block_m, block_n) for j in range(n_blocks)]
        by_query: dict[int, list[int]] = {}
        for j, (starts, _) in enumerate(visited):
            assert len(starts) == len(set(starts)) and all(s % block_n == 0 for s in starts)
            for s in starts:
                by_query.setdefault(s, []).append(j)
        for s, blocks in by_query.items():
            assert blocks == list(range(blocks[0], blocks[-1] + 1)), (band, n_q, n_k, block_m, block_n, s, blocks)
        for j, (starts, prev_end) in enumerate(visited):
            for s in starts:
                waits = j > 0 and s < prev_end
                assert waits == (j - 1 in by_query[s]), (band, n_q, n_k, block_m, block_n, j, s)
        # Every kept pair lies in a visited (query block, key block).
        for q, k in itertools.product(range(n_q), range(n_k)):
            pos = q + n_k - n_q
            if (lower is None or k >= pos + lower) and (upper is None or k <= pos + upper):
                assert k // block_m in by_query.get(q // block_n * block_n, []), (band, n_q, n_k, q, k)
