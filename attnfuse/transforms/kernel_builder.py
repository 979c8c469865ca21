"""What every `lower-to-tile` kernel builder shares: the facts read off an `attn.variant`,
the kernels' static configuration, and a builder that appends named tile ops to a kernel."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.dialects.builtin import f32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint

from attnfuse.dialects import attn, tile


@dataclass(frozen=True)
class Rotation:
    """One RoPE rotation and where it runs."""

    theta: float
    rotary_dim: int | None
    interleaved: bool
    fused: bool
    given_positions: bool = False
    """Positions come from a call-time tensor rather than the row index."""


@dataclass(frozen=True)
class VariantFacts:
    """Everything the kernels need from an `attn.variant`, read off its ops."""

    query_rotation: Rotation | None
    key_rotation: Rotation | None
    band: attn.BandAttr
    scale: float | None
    """The static score scale, or None for the kernel's `sm_scale` argument (1/sqrt(D))."""
    alibi: bool = False
    bias: bool = False
    sparse_block_size: int | None = None
    """The block-sparse layout's block size, when the variant has one."""
    normalizer: str = "softmax"
    """softmax or relu."""
    exact_scores: bool = False
    """q and k are read widened to fp32 (and rotated in registers), so that their scores are
    products of the unrounded operands (to about 2^-16 |q| |k| in bf16) rather than of
    operands rounded to the element type."""

    @property
    def rotation(self) -> Rotation | None:
        return self.query_rotation or self.key_rotation

    @property
    def any_fused(self) -> bool:
        return any(r is not None and r.fused for r in (self.query_rotation, self.key_rotation))


@dataclass(frozen=True)
class KernelConfig:
    """Static facts and tuning parameters shared by the kernels of one variant."""

    head_dim: int
    head_dim_v: int
    element_type: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    bwd_block_m: int = 64
    """Backward kernels: rows a program owns (queries for dQ, keys for dK/dV)."""
    bwd_block_n: int = 32
    """Backward kernels: rows per loop step (keys for dQ, queries for dK/dV)."""
    bwd_num_warps: int = 4
    bwd_num_stages: int = 2
    dkdv_block_m: int = 64
    """The dK/dV kernel's program rows (keys)."""
    dkdv_block_n: int = 32
    """The dK/dV kernel's loop rows (queries)."""
    dkdv_num_warps: int = 4
    dkdv_num_stages: int = 2
    backward: bool = True
    """Whether to build the backward kernels too."""
    bwd_rope: str = "pre_rotated"
    """Where the backward kernels rotate q and k: "pre_rotated" (read the rotation kernels'
    copies) or "as_forward" (the forward's placement)."""

    def for_backward(self) -> KernelConfig:
        """The configuration the dQ and preprocess kernels are built with."""
        return KernelConfig(self.head_dim, self.head_dim_v, self.element_type, self.bwd_block_m,
                            self.bwd_block_n, self.bwd_num_warps, self.bwd_num_stages)

    def for_dkdv(self) -> KernelConfig:
        """The configuration the dK/dV kernel is built with."""
        return KernelConfig(self.head_dim, self.head_dim_v, self.element_type, self.dkdv_block_m,
                            self.dkdv_block_n, self.dkdv_num_warps, self.dkdv_num_stages)

    def attributes(self, rotary_dim: int | None) -> dict[str, int]:
        attrs = {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "head_dim": self.head_dim,
            "head_dim_v": self.head_dim_v,
        }
        if rotary_dim is not None:
            attrs["rotary_dim"] = rotary_dim
        return attrs


def column_parts(rotation: Rotation | None, head_dim: int) -> list[str]:
    """How q and k are split into column tiles: one tile, or the rotary pairs' two elements
    plus the pass-through dims."""
    if rotation is None:
        return ["all"]
    parts = ["even", "odd"] if rotation.interleaved else ["half_lo", "half_hi"]
    rotary_dim = rotation.rotary_dim or head_dim
    if rotary_dim < head_dim:
        parts.append("pass")
    return parts


class KernelBuilder:
    """Builds one `tile.kernel`, naming values so that the emitted code reads well."""

    def __init__(self, name: str, roles: Sequence[str], grid: str, config: KernelConfig,
                 rotary_dim: int | None):
        self.config = config
        self.elem = tile.ELEMENT_TYPES[config.element_type]
        self.kernel = tile.KernelOp(
            name, roles, grid=grid, element_type=self.elem,
            config=config.attributes(rotary_dim),
        )
        self.builder = Builder(InsertPoint.at_end(self.kernel.body.block))

    def inside(self, block: Block) -> KernelBuilder:
        """A builder for the same kernel that appends to `block` (a loop body)."""
        nested = copy.copy(self)
        nested.builder = Builder(InsertPoint.at_end(block))
        return nested

    def arg(self, role: str) -> SSAValue:
        return self.kernel.argument(role)

    def add(self, op: Operation, *names: str) -> Operation:
        self.builder.insert(op)
        for result, name in zip(op.results, names):
            result.name_hint = name
        return op

    def load(
        self, role: str, rows: str, cols: str, name: str, source: str | None = None, widen: bool = False
    ) -> SSAValue:
        """Loads a block of `source` (default `role`) into a tile named `name`; `widen` reads
        it as f32."""
        shape = tile.expected_tile_shape(role, rows, cols)
        elem = f32 if role in tile.FP32_ROLES or widen else self.elem
        load = tile.LoadOp(self.arg(source or role), rows, cols, tile.TileType(shape, elem))
        return self.add(load, name).results[0]

    def finish(self) -> tile.KernelOp:
        self.builder.insert(tile.ReturnOp())
        return self.kernel


PART_SUFFIX = {"all": "", "half_lo": "_lo", "half_hi": "_hi", "even": "_even", "odd": "_odd", "pass": "_pass"}




Body = Callable[[Block, bool], None]
"""Fills one loop body; the flag says whether the loop's blocks are partial (masked)."""


def build_band_loops(
    k: KernelBuilder,
    facts: VariantFacts,
    state: Sequence[SSAValue],
    names: Sequence[str],
    body: Body,
    over: str,
) -> Sequence[SSAValue]:
    """The loops over the blocks a program visits, carrying `state`; returns the final state.

    `over` is "keys" (a `query_blocks` kernel: forward, dQ) or "queries" (a `key_blocks`
    kernel: dK/dV). Dense variants get up to three loops from the mask band's bounds: partial
    blocks before the full ones, full blocks (no mask work), partial blocks after them (which
    also cover a ragged last block). Block-sparse variants walk the layout's lists: full
    blocks, then partial ones. Blocks outside the band, or dropped by the layout, are never
    visited.
    """
    keys = over == "keys"

    def new_body(masked: bool) -> Region:
        block = Block(arg_types=[v.type for v in state])
        for arg, name in zip(block.args, names):
            arg.name_hint = name
        body(block, masked)
        return Region(block)

    if facts.sparse_block_size is not None:
        suffix = "" if keys else "_q"
        for prefix, masked in (("full", False), ("partial", True)):
            blocks, count = k.arg(f"{prefix}{suffix}_blocks"), k.arg(f"{prefix}{suffix}_count")
            loop_type = tile.SparseKVLoopOp if keys else tile.SparseQLoopOp
            state = k.add(loop_type(blocks, count, state, new_body(masked), masked), *names).results
        return state
    bounds_op = tile.KVBoundsOp(facts.band) if keys else tile.QBoundsOp(facts.band)
    prefix = "kv" if keys else "q"
    bounds = k.add(bounds_op, f"{prefix}_start", "full_start", "full_end", f"{prefix}_end")
    start, full_start, full_end, end = bounds.results
    lower, upper = facts.band.bounds
    # Keys: a lower band edge leaves partial key blocks before the full ones. Queries: an
    # upper edge leaves partial query blocks before the full ones (the rows just above the
    # diagonal for causal). The trailing partial loop always exists: it covers a ragged end.
    leading = (lower if keys else upper) is not None
    loops = ([(start, full_start, True)] if leading else []) + [
        (full_start if leading else start, full_end, False),
        (full_end, end, True),
    ]
    loop_type = tile.KVLoopOp if keys else tile.QLoopOp
    for lo, hi, masked in loops:
        state = k.add(loop_type(lo, hi, state, new_body(masked), masked), *names).results
    return state
